/* SPDX-License-Identifier: MIT */
/*
 * tokenizer_int.h - the vocabulary as the tokenizer's files share it: vocab.c builds a
 * pe_vocab, tokenize.c (text -> ids) and detok.c (ids -> text) read it. Other callers use
 * tokenizer.h, where pe_vocab is opaque; vocab_load.c needs only that public API.
 *
 *   text[text_off[id] .. text_off[id + 1])     the token's vocabulary text
 *   piece[piece_off[id] .. piece_off[id + 1])  what it renders as (PE_PIECE_SPECIAL)
 *   tok_tab / merge_tab                        open addressing: text -> id, merge -> rank
 *
 * Invariants: a pe_vocab is never written after pe_vocab_create returns; token texts are
 * unique (a duplicate is refused); every id stored in it (bos, eos, byte tokens, special
 * list) is -1 ("none") or in [0, n_tokens).
 */
#ifndef PE_TOKENIZER_INT_H
#define PE_TOKENIZER_INT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "tokenizer.h"
#include "tokenizer_pre.h"

/* Token attributes (llama.cpp's llama_token_attr, in our own bits). */
enum {
    A_UNKNOWN = 1u << 0,
    A_UNUSED = 1u << 1,
    A_NORMAL = 1u << 2,
    A_CONTROL = 1u << 3,
    A_USER_DEFINED = 1u << 4,
    A_BYTE = 1u << 5,
    A_LSTRIP = 1u << 6,
    A_RSTRIP = 1u << 7,
    A_EOG = 1u << 8, /* not an attribute in llama.cpp: its special_eog_ids set */
};

struct pe_vocab {
    int spm; /* 1: "llama" (SentencePiece), 0: "gpt2" (byte-level BPE) */
    uint32_t n_tokens;
    char *text;          /* all token texts, back to back */
    uint64_t *text_off;  /* [n_tokens + 1] */
    float *scores;       /* [n_tokens] */
    uint16_t *attr;      /* [n_tokens] A_* bits */
    char *piece;         /* rendered pieces (control tokens as their text) */
    uint64_t *piece_off; /* [n_tokens + 1] */
    size_t max_piece;

    int32_t *tok_tab; /* open addressing: token text -> id, -1 empty */
    uint64_t tok_mask;

    uint32_t n_merges;
    char *merge_text;    /* merge strings, back to back */
    uint64_t *merge_off; /* [n_merges + 1] */
    int32_t *merge_tab;  /* open addressing: merge string -> rank, -1 empty */
    uint64_t merge_mask;

    int32_t byte_tok[256]; /* SentencePiece byte fallback: <0xNN> (or the byte), -1 none */
    int32_t bos, eos, unk, eot, eom, pad;
    int add_bos, add_eos, add_space_prefix;

    int32_t *special; /* ids partitioned out of raw text, longest text first */
    uint32_t n_special;

    pe_pretok *pre; /* gpt2 only */
    int ignore_merges;

    /* The token-count bound (tokenize.c, pe_tokenize_ex's max_tokens): a text of N bytes
     * makes at least ceil(N / max_token_bytes) tokens, N leaving out whitespace when a
     * special token strips it (has_strip). 0: no such bound holds (some byte or merge
     * result has no token, so bytes can be dropped). Set by vocab.c. */
    size_t max_token_bytes;
    int has_strip; /* some special token has A_LSTRIP or A_RSTRIP */
};

/* ---- lookups ---- */

static inline uint64_t hash_bytes(const char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    size_t i;
    for (i = 0; i < n; i++) {
        h ^= (uint8_t)p[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

static inline const char *tok_text(const pe_vocab *v, int32_t id, size_t *len)
{
    *len = (size_t)(v->text_off[id + 1] - v->text_off[id]);
    return v->text + v->text_off[id];
}

/* Returns the id of the token whose text is s[0..n), or -1. */
static inline int32_t tok_find(const pe_vocab *v, const char *s, size_t n)
{
    uint64_t i = hash_bytes(s, n) & v->tok_mask;
    for (;;) {
        int32_t id = v->tok_tab[i];
        size_t len;
        const char *t;
        if (id < 0) return -1;
        t = tok_text(v, id, &len);
        if (len == n && memcmp(t, s, n) == 0) return id;
        i = (i + 1) & v->tok_mask;
    }
}

/* Returns the rank of merge string s[0..n) ("left right"), or -1. */
static inline int32_t merge_find(const pe_vocab *v, const char *s, size_t n)
{
    uint64_t i;
    if (!v->merge_tab) return -1;
    i = hash_bytes(s, n) & v->merge_mask;
    for (;;) {
        int32_t r = v->merge_tab[i];
        size_t len;
        if (r < 0) return -1;
        len = (size_t)(v->merge_off[r + 1] - v->merge_off[r]);
        if (len == n && memcmp(v->merge_text + v->merge_off[r], s, n) == 0) return r;
        i = (i + 1) & v->merge_mask;
    }
}

#endif /* PE_TOKENIZER_INT_H */
