/* SPDX-License-Identifier: MIT */
/*
 * chat.c - the chat-template families of chat.h: detection by special-token text, and
 * one C renderer per family. Called by the server and the CLI.
 *
 * Rendering runs twice over the same messages: a counting pass (buf.p NULL) that sizes
 * the result and counts the content spans, then one malloc for each, then a writing pass.
 * So the only allocations are the results, and the writing pass never grows a buffer.
 * Invariant: both passes emit the same bytes and spans (the renderers depend only on the
 * messages), and a write never goes past buf.cap. Message content goes out through
 * put_content (put_msg, put_trim) and nothing else does: that is what makes the spans
 * exactly the messages' bytes, and the template's markers never part of one.
 *
 * Trimming follows Jinja's |trim, which is Python's str.strip(): it removes the Unicode
 * whitespace str.isspace() accepts (ASCII \t\n\v\f\r and space, \x1c-\x1f, U+0085,
 * U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000) at both ends.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pagoda/pagoda.h>

#include "chat.h"

/* ---- names, detection, stop strings ---- */

static const char *const family_names[PE_CHAT_N_FAMILIES] = {
    "plain", "chatml", "llama3", "llama2", "gemma", "phi3",
};

const char *pe_chat_family_name(pe_chat_family f)
{
    if ((int)f < 0 || (int)f >= PE_CHAT_N_FAMILIES) return family_names[PE_CHAT_PLAIN];
    return family_names[f];
}

/* Returns 1 when a and b are equal ignoring ASCII case. */
static int name_eq(const char *a, const char *b)
{
    for (;; a++, b++) {
        unsigned char ca = (unsigned char)*a, cb = (unsigned char)*b;
        if (ca >= 'A' && ca <= 'Z') ca = (unsigned char)(ca - 'A' + 'a');
        if (ca != cb) return 0;
        if (!ca) return 1;
    }
}

int pe_chat_family_parse(const char *name, pe_chat_family *out)
{
    if (!name || !out) return -1;
    for (int i = 0; i < PE_CHAT_N_FAMILIES; i++) {
        if (name_eq(name, family_names[i])) {
            *out = (pe_chat_family)i;
            return 0;
        }
    }
    if (name_eq(name, "qwen")) {
        *out = PE_CHAT_CHATML;
        return 0;
    }
    if (name_eq(name, "mistral")) {
        *out = PE_CHAT_LLAMA2;
        return 0;
    }
    return -1;
}

pe_chat_family pe_chat_detect(const char *t)
{
    if (!t) return PE_CHAT_PLAIN;
    /* Most specific first: a ChatML or Llama 3 template never writes the later markers,
     * but Zephyr-like templates write "<|user|>" without Phi's "<|end|>". */
    if (strstr(t, "<|im_start|>")) return PE_CHAT_CHATML;
    if (strstr(t, "<|start_header_id|>")) return PE_CHAT_LLAMA3;
    if (strstr(t, "<start_of_turn>")) return PE_CHAT_GEMMA;
    if (strstr(t, "<|user|>") && strstr(t, "<|end|>")) return PE_CHAT_PHI3;
    if (strstr(t, "[INST]")) return PE_CHAT_LLAMA2;
    return PE_CHAT_PLAIN;
}

const char *const *pe_chat_stop_strings(pe_chat_family f)
{
    static const char *const plain[] = {"\nUser:", NULL};
    static const char *const chatml[] = {"<|im_end|>", NULL};
    static const char *const llama3[] = {"<|eot_id|>", "<|eom_id|>", NULL};
    static const char *const llama2[] = {"</s>", NULL};
    static const char *const gemma[] = {"<end_of_turn>", NULL};
    static const char *const phi3[] = {"<|end|>", "<|endoftext|>", NULL};
    switch (f) {
    case PE_CHAT_CHATML:
        return chatml;
    case PE_CHAT_LLAMA3:
        return llama3;
    case PE_CHAT_LLAMA2:
        return llama2;
    case PE_CHAT_GEMMA:
        return gemma;
    case PE_CHAT_PHI3:
        return phi3;
    case PE_CHAT_PLAIN:
    default:
        return plain;
    }
}

/* ---- output buffer (two passes) ---- */

typedef struct sbuf {
    char *p;             /* NULL in the counting pass */
    size_t len;          /* bytes emitted so far */
    size_t cap;          /* bytes p can hold, without the NUL; SIZE_MAX - 1 when counting */
    int overflow;        /* the length passed SIZE_MAX - 1 */
    pe_text_span *spans; /* [n_spans] where content went; NULL when counting or not asked */
    size_t n_spans;      /* content spans emitted so far */
} sbuf;

static void put_n(sbuf *b, const char *s, size_t n)
{
    if (b->overflow || n > b->cap - b->len) {
        b->overflow = 1;
        return;
    }
    if (b->p && n) memcpy(b->p + b->len, s, n);
    b->len += n;
}

static void put(sbuf *b, const char *s)
{
    put_n(b, s, strlen(s));
}

/* Emits message content s[0..n): like put_n, and records where it went. */
static void put_content(sbuf *b, const char *s, size_t n)
{
    if (!n) return;
    if (b->spans && !b->overflow && n <= b->cap - b->len) {
        b->spans[b->n_spans].off = b->len;
        b->spans[b->n_spans].len = n;
    }
    b->n_spans++;
    put_n(b, s, n);
}

static void put_msg(sbuf *b, const char *s)
{
    put_content(b, s, strlen(s));
}

/* ---- Python str.strip() on UTF-8 ---- */

/* Returns the byte length of the whitespace character at s[0..n), or 0 if there is none. */
static size_t ws_len(const unsigned char *s, size_t n)
{
    if ((s[0] >= 0x09 && s[0] <= 0x0d) || (s[0] >= 0x1c && s[0] <= 0x20)) return 1;
    if (n >= 2 && s[0] == 0xc2 && (s[1] == 0x85 || s[1] == 0xa0)) return 2;
    if (n < 3) return 0;
    if (s[0] == 0xe1 && s[1] == 0x9a && s[2] == 0x80) return 3; /* U+1680 */
    if (s[0] == 0xe2 && s[1] == 0x80 &&
        ((s[2] >= 0x80 && s[2] <= 0x8a) || s[2] == 0xa8 || s[2] == 0xa9 || s[2] == 0xaf))
        return 3; /* U+2000-200A, U+2028, U+2029, U+202F */
    if (s[0] == 0xe2 && s[1] == 0x81 && s[2] == 0x9f) return 3; /* U+205F */
    if (s[0] == 0xe3 && s[1] == 0x80 && s[2] == 0x80) return 3; /* U+3000 */
    return 0;
}

/* Emits s with leading and trailing whitespace removed. A byte that starts no whitespace
 * character is kept and stepped over alone: continuation bytes never start one, so valid
 * UTF-8 is split only at character boundaries, and invalid UTF-8 is kept as it is. */
static void put_trim(sbuf *b, const char *str)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t n = strlen(str), pos = 0, start, end;
    for (;;) {
        size_t w = pos < n ? ws_len(s + pos, n - pos) : 0;
        if (!w) break;
        pos += w;
    }
    start = pos;
    end = pos;
    while (pos < n) {
        size_t w = ws_len(s + pos, n - pos);
        if (w) {
            pos += w;
        } else {
            pos++;
            end = pos;
        }
    }
    put_content(b, str + start, end - start);
}

/* ---- renderers ---- */

typedef enum chat_role { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT } chat_role;

/* A message with its role parsed: the renderers see only these. */
typedef struct msg {
    chat_role r;
    const char *c;
} msg;

static void render_plain(sbuf *b, const msg *m, size_t n)
{
    static const char *const label[] = {"System: ", "User: ", "Assistant: "};
    for (size_t i = 0; i < n; i++) {
        put(b, label[m[i].r]);
        put_msg(b, m[i].c);
        put(b, "\n");
    }
    put(b, "Assistant:");
}

static const char *const role_name[] = {"system", "user", "assistant"};

static void render_chatml(sbuf *b, const msg *m, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        put(b, "<|im_start|>");
        put(b, role_name[m[i].r]);
        put(b, "\n");
        put_msg(b, m[i].c);
        put(b, "<|im_end|>\n");
    }
    put(b, "<|im_start|>assistant\n");
}

/* Llama 3.1/3.2: the first system message, trimmed, goes after the date preamble; every
 * later message (a later system message too) is a header block of its own. */
static void render_llama3(sbuf *b, const msg *m, size_t n)
{
    size_t i = 0;
    put(b, "<|start_header_id|>system<|end_header_id|>\n\n"
           "Cutting Knowledge Date: December 2023\n"
           "Today Date: 26 Jul 2024\n\n");
    if (n > 0 && m[0].r == ROLE_SYSTEM) {
        put_trim(b, m[0].c);
        i = 1;
    }
    put(b, "<|eot_id|>");
    for (; i < n; i++) {
        put(b, "<|start_header_id|>");
        put(b, role_name[m[i].r]);
        put(b, "<|end_header_id|>\n\n");
        put_trim(b, m[i].c);
        put(b, "<|eot_id|>");
    }
    put(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* Emits every system message of m[0..n), joined by "\n\n"; returns how many. */
static size_t put_systems(sbuf *b, const msg *m, size_t n, int trim)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (m[i].r != ROLE_SYSTEM) continue;
        if (k++) put(b, "\n\n");
        if (trim) {
            put_trim(b, m[i].c);
        } else {
            put_msg(b, m[i].c);
        }
    }
    return k;
}

/* Mistral Nemo: system text before the last user message, EOS after each answer. */
static void render_llama2(sbuf *b, const msg *m, size_t n)
{
    size_t last_user = SIZE_MAX, n_sys = 0;
    for (size_t i = 0; i < n; i++) {
        if (m[i].r == ROLE_USER) last_user = i;
        if (m[i].r == ROLE_SYSTEM) n_sys++;
    }
    for (size_t i = 0; i < n; i++) {
        if (m[i].r == ROLE_USER) {
            put(b, "[INST]");
            if (i == last_user && put_systems(b, m, n, 0)) put(b, "\n\n");
            put_msg(b, m[i].c);
            put(b, "[/INST]");
        } else if (m[i].r == ROLE_ASSISTANT) {
            put_msg(b, m[i].c);
            put(b, "</s>");
        }
    }
    if (last_user == SIZE_MAX && n_sys) {
        put(b, "[INST]");
        put_systems(b, m, n, 0);
        put(b, "[/INST]");
    }
}

/* Gemma: "assistant" is "model"; system text waits for the next user turn. */
static void render_gemma(sbuf *b, const msg *m, size_t n)
{
    size_t sys_from = 0; /* system messages in [sys_from, i) are not written yet */
    for (size_t i = 0; i < n; i++) {
        if (m[i].r == ROLE_SYSTEM) continue;
        if (m[i].r == ROLE_USER) {
            put(b, "<start_of_turn>user\n");
            if (put_systems(b, m + sys_from, i - sys_from, 1)) put(b, "\n\n");
            sys_from = i + 1;
        } else {
            put(b, "<start_of_turn>model\n");
        }
        put_trim(b, m[i].c);
        put(b, "<end_of_turn>\n");
    }
    for (size_t i = sys_from; i < n; i++) {
        if (m[i].r == ROLE_SYSTEM) {
            put(b, "<start_of_turn>user\n");
            put_systems(b, m + sys_from, n - sys_from, 1);
            put(b, "<end_of_turn>\n");
            break;
        }
    }
    put(b, "<start_of_turn>model\n");
}

static void render_phi3(sbuf *b, const msg *m, size_t n)
{
    static const char *const tag[] = {"<|system|>\n", "<|user|>\n", "<|assistant|>\n"};
    for (size_t i = 0; i < n; i++) {
        if (m[i].r == ROLE_SYSTEM && !m[i].c[0]) continue;
        put(b, tag[m[i].r]);
        put_msg(b, m[i].c);
        put(b, "<|end|>\n");
    }
    put(b, "<|assistant|>\n");
}

static void render(pe_chat_family f, sbuf *b, const msg *m, size_t n)
{
    switch (f) {
    case PE_CHAT_CHATML:
        render_chatml(b, m, n);
        break;
    case PE_CHAT_LLAMA3:
        render_llama3(b, m, n);
        break;
    case PE_CHAT_LLAMA2:
        render_llama2(b, m, n);
        break;
    case PE_CHAT_GEMMA:
        render_gemma(b, m, n);
        break;
    case PE_CHAT_PHI3:
        render_phi3(b, m, n);
        break;
    case PE_CHAT_PLAIN:
    default:
        render_plain(b, m, n);
        break;
    }
}

/* ---- pe_chat_render ---- */

/* Writes a role into dst[0..cap) for an error message: at most 32 bytes, bytes outside
 * printable ASCII (and quotes and backslashes) as '?', "..." when cut. */
static void quote_role(char *dst, size_t cap, const char *role)
{
    size_t k = 0, i = 0;
    for (; role[i] && i < 32 && k + 1 < cap; i++) {
        unsigned char c = (unsigned char)role[i];
        dst[k++] = (c < 0x20 || c > 0x7e || c == '"' || c == '\\') ? '?' : (char)c;
    }
    if (role[i] && k + 4 < cap) {
        memcpy(dst + k, "...", 3);
        k += 3;
    }
    dst[k] = '\0';
}

static int fail(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Writes a message into err (when there is room) and returns rc. */
static int fail(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    va_list ap;
    if (err && errlen) {
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

int pe_chat_render_spans(pe_chat_family f, const pe_chat_msg *msgs, size_t n, char **out,
                         size_t *len, pe_text_span **spans, size_t *n_spans, char *err,
                         size_t errlen)
{
    msg small[16], *m = small;
    sbuf b = {NULL, 0, SIZE_MAX - 1, 0, NULL, 0};
    char q[40];
    int rc = PGD_EINVAL;
    pe_text_span *sp = NULL;

    if (err && errlen) err[0] = '\0';
    if (len) *len = 0;
    if (spans) *spans = NULL;
    if (n_spans) *n_spans = 0;
    if (!out) return fail(err, errlen, PGD_EINVAL, "chat: out is NULL");
    *out = NULL;
    if ((int)f < 0 || (int)f >= PE_CHAT_N_FAMILIES)
        return fail(err, errlen, PGD_EINVAL, "chat: unknown template family %d", (int)f);
    if (!msgs && n) return fail(err, errlen, PGD_EINVAL, "chat: %zu messages but msgs is NULL", n);
    if (n > sizeof small / sizeof small[0]) {
        if (n > SIZE_MAX / sizeof *m) return PGD_ENOMEM;
        m = malloc(n * sizeof *m);
        if (!m) return PGD_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        const char *r = msgs[i].role;
        if (!r) {
            rc = fail(err, errlen, PGD_EINVAL, "message %zu: role is missing", i);
            goto done;
        }
        if (!strcmp(r, "system")) {
            m[i].r = ROLE_SYSTEM;
        } else if (!strcmp(r, "user")) {
            m[i].r = ROLE_USER;
        } else if (!strcmp(r, "assistant")) {
            m[i].r = ROLE_ASSISTANT;
        } else {
            quote_role(q, sizeof q, r);
            rc = fail(err, errlen, PGD_EINVAL,
                      "message %zu: unsupported role \"%s\" (expected system, user or assistant)",
                      i, q);
            goto done;
        }
        m[i].c = msgs[i].content;
        if (!m[i].c) {
            rc = fail(err, errlen, PGD_EINVAL, "message %zu (%s): content is missing", i, r);
            goto done;
        }
    }

    render(f, &b, m, n); /* counting pass */
    if (b.overflow) {
        rc = PGD_ENOMEM;
        goto done;
    }
    size_t n_sp = b.n_spans;
    if (spans && n_sp) {
        sp = malloc(n_sp * sizeof *sp);
        if (!sp) {
            rc = PGD_ENOMEM;
            goto done;
        }
    }
    b.cap = b.len;
    b.len = 0;
    b.n_spans = 0;
    b.spans = sp;
    b.p = malloc(b.cap + 1);
    if (!b.p) {
        rc = PGD_ENOMEM;
        goto done;
    }
    render(f, &b, m, n); /* writing pass */
    if (b.overflow || b.len != b.cap || b.n_spans != n_sp) {
        /* content changed under us: caller's data race */
        free(b.p);
        rc = PGD_EINVAL;
        goto done;
    }
    b.p[b.len] = '\0';
    *out = b.p;
    if (len) *len = b.len;
    if (spans) {
        *spans = sp;
        sp = NULL;
    }
    if (n_spans) *n_spans = spans ? n_sp : 0;
    rc = 0;
done:
    free(sp);
    if (m != small) free(m);
    return rc;
}

int pe_chat_render(pe_chat_family f, const pe_chat_msg *msgs, size_t n, char **out, char *err,
                   size_t errlen)
{
    return pe_chat_render_spans(f, msgs, n, out, NULL, NULL, NULL, err, errlen);
}
