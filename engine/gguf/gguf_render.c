/* SPDX-License-Identifier: MIT */
/*
 * gguf_render.c - pe_gguf_kv_to_string: a GGUF value as one line of text, strings quoted
 * with control characters and invalid UTF-8 escaped, arrays summarised ("[n x type] [e0,
 * e1, ...]", the first 8 elements).
 *
 * Callers: `pagoda inspect` (tools/inspect.c) prints it; test_gguf and fuzz_gguf. (The
 * model fingerprint hashes the raw header bytes, not this text: engine/runtime/weights.c.)
 * It lives beside the reader, not in tools/, because it walks the reader's internal value
 * encoding (gguf_int.h).
 *
 * Invariants: the output is NUL-terminated, at most buflen bytes, and ends with "..." when
 * cut; a multi-byte UTF-8 character is never cut. The kv was validated by the reader, so
 * nothing here re-checks its bytes against the end of the file.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "gguf.h"
#include "gguf_int.h"
#include "unicode.h"

/* A bounded output buffer: once text no longer fits, "..." ends it and the rest is
 * dropped; multi-byte UTF-8 sequences are never cut. */
typedef struct sbuf {
    char *buf;
    size_t cap; /* bytes of buf, NUL included */
    size_t len;
    int full;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->full || b->cap == 0) return;
    if (b->len + n + 3 >= b->cap) { /* keep room for "..." and the NUL */
        if (b->len + 3 < b->cap) {
            memcpy(b->buf + b->len, "...", 3);
            b->len += 3;
        }
        b->buf[b->len] = '\0';
        b->full = 1;
        return;
    }
    memcpy(b->buf + b->len, s, n);
    b->len += n;
    b->buf[b->len] = '\0';
}

static void sb_str(sbuf *b, const char *s)
{
    sb_put(b, s, strlen(s));
}

static void sb_fmt(sbuf *b, const char *fmt, ...)
{
    char tmp[64];
    va_list ap;
    int n;
    va_start(ap, fmt);
    n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) sb_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* Appends s quoted, with control characters and invalid UTF-8 escaped; at most max_bytes
 * of the string are shown. */
static void sb_quoted(sbuf *b, pe_gguf_str s, uint64_t max_bytes)
{
    const unsigned char *p = (const unsigned char *)s.ptr;
    uint64_t i = 0;
    sb_put(b, "\"", 1);
    while (i < s.len && !b->full) {
        size_t n = pe_utf8_valid_len(p + i, s.len - i);
        if (i >= max_bytes) {
            sb_str(b, "...");
            break;
        }
        if (n == 1 && p[i] >= 0x20 && p[i] != 0x7f && p[i] != '"' && p[i] != '\\') {
            sb_put(b, (const char *)p + i, 1);
        } else if (n > 1) {
            sb_put(b, (const char *)p + i, n);
        } else if (p[i] == '"' || p[i] == '\\') {
            char e[2] = {'\\', (char)p[i]};
            sb_put(b, e, 2);
        } else if (p[i] == '\n') {
            sb_str(b, "\\n");
        } else if (p[i] == '\t') {
            sb_str(b, "\\t");
        } else {
            sb_fmt(b, "\\x%02x", p[i]);
        }
        i += n ? n : 1;
    }
    sb_put(b, "\"", 1);
}

static void render_scalar(sbuf *b, uint32_t type, const uint8_t *p)
{
    uint64_t mag;
    int neg;
    if (type == PE_GGUF_TYPE_FLOAT32) {
        float v;
        memcpy(&v, p, 4);
        sb_fmt(b, "%.7g", (double)v);
    } else if (type == PE_GGUF_TYPE_FLOAT64) {
        double v;
        memcpy(&v, p, 8);
        sb_fmt(b, "%.15g", v);
    } else if (type == PE_GGUF_TYPE_BOOL) {
        sb_str(b, p[0] ? "true" : "false");
    } else if (type == PE_GGUF_TYPE_STRING) {
        pe_gguf_str s;
        memcpy(&s.len, p, 8);
        s.ptr = (const char *)p + 8;
        sb_quoted(b, s, 200);
    } else if (pe__gguf_int_value(type, p, &mag, &neg) == 0) {
        sb_fmt(b, "%s%" PRIu64, neg ? "-" : "", mag);
    }
}

/* Appends "[n x type] [e0, e1, ...]" for an array body at p, showing at most max_elems. */
static void render_array(sbuf *b, uint32_t elem_type, uint64_t n, const uint8_t *p,
                         uint64_t max_elems, int depth)
{
    uint64_t off = 0;
    sb_fmt(b, "[%" PRIu64 " x %s]", n, pe_gguf_type_name(elem_type));
    if (depth > 1) return; /* inner arrays of nested arrays: type and length only */
    sb_str(b, " [");
    for (uint64_t i = 0; i < n && !b->full; i++) {
        if (i) sb_str(b, ", ");
        if (i == max_elems) {
            sb_str(b, "...");
            break;
        }
        if (elem_type == PE_GGUF_TYPE_ARRAY) {
            uint32_t et;
            uint64_t m;
            memcpy(&et, p + off, 4);
            memcpy(&m, p + off + 4, 8);
            render_array(b, et, m, p + off + 12, max_elems, depth + 1);
        } else if (elem_type == PE_GGUF_TYPE_STRING) {
            pe_gguf_str s;
            memcpy(&s.len, p + off, 8);
            s.ptr = (const char *)p + off + 8;
            sb_quoted(b, s, 40);
        } else {
            render_scalar(b, elem_type, p + off);
        }
        off += pe__gguf_value_span(elem_type, p + off);
    }
    sb_str(b, "]");
}

void pe_gguf_kv_to_string(const pe_gguf_kv *kv, char *buf, size_t buflen)
{
    sbuf b = {buf, buflen, 0, 0};
    if (buflen == 0) return;
    buf[0] = '\0';
    if (kv->type == PE_GGUF_TYPE_ARRAY) {
        render_array(&b, kv->arr_type, kv->n, kv->data, 8, 1);
    } else {
        render_scalar(&b, kv->type, kv->data);
    }
}
