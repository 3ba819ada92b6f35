/* SPDX-License-Identifier: MIT */
/*
 * unicode.h - the UTF-8 and byte-level helpers the tokenizer needs: llama.cpp's lenient
 * UTF-8 decoding (so that invalid input splits exactly as it does there), encoding, the
 * GPT-2 byte-to-unicode alphabet of byte-level BPE, and the one strict UTF-8 validator
 * (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF), both incremental
 * for streaming output and over whole sequences and strings.
 *
 * Callers: the tokenizer (vocab.c, tokenize.c, detok.c, tokenizer_pre.c), the GGUF value
 * renderer (gguf_render.c), the server's error-message sanitizer (server/api.c) and the
 * tokenizer fuzz target (engine-internal; not part of any public API).
 *
 * Invariants: nothing here allocates or keeps state; every function is thread-safe.
 */
#ifndef PE_UNICODE_H
#define PE_UNICODE_H

#include <stddef.h>
#include <stdint.h>

#define PE_UTF8_REPLACEMENT 0xFFFDu

/* Returns the length of the UTF-8 sequence that a lead byte announces, by its high nibble
 * only (llama.cpp's unicode_len_utf8): 1 for 0x00-0xBF, 2 for 0xC0-0xDF, 3 for 0xE0-0xEF,
 * 4 for 0xF0-0xFF. Continuation bytes count as 1; nothing is validated. */
static inline size_t pe_utf8_len(uint8_t lead)
{
    static const uint8_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[lead >> 4];
}

/* Decodes one code point at s[0..n) (n >= 1) the way llama.cpp's unicode_cpt_from_utf8
 * does: overlong forms and surrogates are accepted, lead bytes 0xF5-0xF7 give values up to
 * 0x1FFFFF; a byte that does not start a complete sequence gives U+FFFD and *adv = 1.
 * Returns the code point; *adv is the number of bytes consumed (1..4). */
uint32_t pe_utf8_decode(const uint8_t *s, size_t n, size_t *adv);

/* Writes the UTF-8 form of cp (llama.cpp's unicode_cpt_to_utf8; surrogates are encoded
 * as three bytes) into out; a cp above 0x10FFFF is written as U+FFFD. Returns 1..4. */
size_t pe_utf8_encode(uint32_t cp, uint8_t out[4]);

/* ---- GPT-2 byte-level alphabet ----
 * Byte b maps to code point b when b is printable (0x21-0x7E, 0xA1-0xAC, 0xAE-0xFF) and
 * otherwise to 256 + n, n counting the unprintable bytes below b (0x00-0x20 -> 256..288,
 * 0x7F-0xA0 -> 289..322, 0xAD -> 323). So a space is U+0120 'Ġ' and '\n' is U+010A 'Ċ'. */

/* Returns the code point byte b maps to. */
uint32_t pe_gpt2_byte_to_cp(uint8_t b);
/* Returns the byte that code point cp stands for, or -1 if cp is not in the alphabet. */
int pe_gpt2_cp_to_byte(uint32_t cp);

/* ---- validation (strict: RFC 3629) ----
 * One rule set, stated by the two incremental functions; the whole-sequence and
 * whole-string forms below are built on them. */

/* Returns how many bytes a valid UTF-8 sequence starting with lead has (1..4), or 0 if
 * lead can never start one (0x80-0xC1, 0xF5-0xFF). */
size_t pe_utf8_seq_len(uint8_t lead);
/* Returns 1 if byte b may follow the prefix p[0..n) (1 <= n < its sequence length) in a
 * valid sequence (no overlong forms, surrogates or values above 0x10FFFF), else 0. */
int pe_utf8_continues(const uint8_t *p, size_t n, uint8_t b);
/* Returns the length (1..4) of the valid UTF-8 sequence at the start of s[0..n), or 0 when
 * s does not start with one (a stray continuation byte, an overlong form, a surrogate, a
 * value above U+10FFFF, a sequence cut short by n, or n == 0). Cost: O(1). */
size_t pe_utf8_valid_len(const uint8_t *s, size_t n);
/* Returns 1 if s[0..n) is valid UTF-8 as a whole (n == 0 is), else 0. Cost: O(n). */
int pe_utf8_valid(const char *s, size_t n);

#endif /* PE_UNICODE_H */
