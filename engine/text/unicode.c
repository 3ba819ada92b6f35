/* SPDX-License-Identifier: MIT */
/*
 * unicode.c - UTF-8 decoding/encoding with llama.cpp's exact leniency, the GPT-2 byte
 * alphabet and the strict UTF-8 validator (see unicode.h).
 *
 * Callers: see unicode.h.
 * Invariants: pure functions, no state.
 */
#include "unicode.h"

/* ---- decode / encode ---- */

uint32_t pe_utf8_decode(const uint8_t *s, size_t n, size_t *adv)
{
    uint8_t c = s[0];
    if (!(c & 0x80)) {
        *adv = 1;
        return c;
    }
    /* A continuation byte cannot start a sequence. */
    if (!(c & 0x40)) goto invalid;
    if (!(c & 0x20)) {
        if (n < 2 || (s[1] & 0xc0) != 0x80) goto invalid;
        *adv = 2;
        return ((uint32_t)(c & 0x1f) << 6) | (s[1] & 0x3f);
    }
    if (!(c & 0x10)) {
        if (n < 3 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80) goto invalid;
        *adv = 3;
        return ((uint32_t)(c & 0x0f) << 12) | ((uint32_t)(s[1] & 0x3f) << 6) | (s[2] & 0x3f);
    }
    if (!(c & 0x08)) {
        if (n < 4 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80 || (s[3] & 0xc0) != 0x80)
            goto invalid;
        *adv = 4;
        return ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3f) << 12) |
               ((uint32_t)(s[2] & 0x3f) << 6) | (s[3] & 0x3f);
    }
invalid:
    *adv = 1;
    return PE_UTF8_REPLACEMENT;
}

size_t pe_utf8_encode(uint32_t cp, uint8_t out[4])
{
    if (cp <= 0x7f) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp <= 0x7ff) {
        out[0] = (uint8_t)(0xc0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp > 0x10ffff) cp = PE_UTF8_REPLACEMENT;
    if (cp <= 0xffff) {
        out[0] = (uint8_t)(0xe0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (uint8_t)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (uint8_t)(0xf0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (uint8_t)(0x80 | (cp & 0x3f));
    return 4;
}

/* ---- GPT-2 byte alphabet ---- */

static int gpt2_printable(uint32_t b)
{
    return (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
}

uint32_t pe_gpt2_byte_to_cp(uint8_t b)
{
    if (gpt2_printable(b)) return b;
    if (b <= 0x20) return 256u + b;               /* 33 bytes: 256..288 */
    if (b <= 0xa0) return 256u + 33 + (b - 0x7f); /* 34 bytes: 289..322 */
    return 256u + 33 + 34;                        /* 0xad: 323 */
}

int pe_gpt2_cp_to_byte(uint32_t cp)
{
    if (cp < 256) return gpt2_printable(cp) ? (int)cp : -1;
    if (cp <= 288) return (int)(cp - 256);
    if (cp <= 322) return (int)(0x7f + (cp - 289));
    if (cp == 323) return 0xad;
    return -1;
}

/* ---- validation ---- */

size_t pe_utf8_seq_len(uint8_t lead)
{
    if (lead < 0x80) return 1;
    if (lead < 0xc2) return 0;
    if (lead < 0xe0) return 2;
    if (lead < 0xf0) return 3;
    if (lead < 0xf5) return 4;
    return 0;
}

int pe_utf8_continues(const uint8_t *p, size_t n, uint8_t b)
{
    uint8_t lo = 0x80, hi = 0xbf;
    if (n == 1) {
        /* The second byte carries the overlong/surrogate/range limits (RFC 3629). */
        if (p[0] == 0xe0) lo = 0xa0;
        if (p[0] == 0xed) hi = 0x9f;
        if (p[0] == 0xf0) lo = 0x90;
        if (p[0] == 0xf4) hi = 0x8f;
    }
    return b >= lo && b <= hi;
}

size_t pe_utf8_valid_len(const uint8_t *s, size_t n)
{
    size_t len;
    if (n == 0) return 0;
    len = pe_utf8_seq_len(s[0]);
    if (len == 0 || len > n) return 0;
    for (size_t i = 1; i < len; i++) {
        if (!pe_utf8_continues(s, i, s[i])) return 0;
    }
    return len;
}

int pe_utf8_valid(const char *s, size_t n)
{
    const uint8_t *p = (const uint8_t *)s;
    size_t i = 0;
    while (i < n) {
        size_t len = pe_utf8_valid_len(p + i, n - i);
        if (len == 0) return 0;
        i += len;
    }
    return 1;
}
