/* SPDX-License-Identifier: MIT */
/*
 * tokenizer_pre.h - the pre-tokenizer of byte-level BPE vocabularies: splits text into
 * words with the regex list that llama.cpp uses for the vocabulary's tokenizer.ggml.pre,
 * then maps each word's bytes to the GPT-2 byte alphabet, ready for BPE merges.
 *
 * Callers: tokenize.c (engine-internal; vocab.c creates and destroys the pre-tokenizer).
 *
 * Invariants: a pe_pretok is immutable after pe_pretok_create and may be shared by any
 * number of threads; all per-call state lives in the caller's pe_words.
 */
#ifndef PE_TOKENIZER_PRE_H
#define PE_TOKENIZER_PRE_H

#include <stddef.h>
#include <stdint.h>

typedef struct pe_pretok pe_pretok;

/* Facts about a pre-tokenizer that change how the vocabulary behaves (llama.cpp). */
typedef struct pe_pretok_info {
    const char *name;  /* canonical name, e.g. "gpt2", "llama3" (static storage) */
    int ignore_merges; /* a word that is a whole token is emitted without merging */
    int add_bos;       /* default of tokenizer.ggml.add_bos_token: -1 keep, 0/1 set */
} pe_pretok_info;

/* Words of one text: word i is buf[ends[i-1] .. ends[i]) (ends[-1] = 0), GPT-2 encoded. */
typedef struct pe_words {
    char *buf;
    size_t len, cap;
    size_t *ends;
    size_t n, cap_ends;
    /* scratch, kept between calls to avoid reallocation */
    uint32_t *cps;        /* [n_cps] code points of the text */
    size_t *sub_off;      /* [n_cps + 1] byte offset of each code point in subj */
    uint8_t *subj;        /* the regex subject: valid UTF-8 */
    size_t *cuts, *cuts2; /* piece boundaries, in code points */
    size_t cap_cps, cap_subj, cap_cuts;
} pe_words;

/* Compiles the regex list for pre-tokenizer name (NULL or "" selects llama.cpp's
 * "default" list). Returns 0, or -1 with a message in err for an unknown name or when
 * PCRE2 fails. info (may be NULL) receives the pre-tokenizer's facts. */
int pe_pretok_create(const char *name, size_t name_len, pe_pretok **out, pe_pretok_info *info,
                     char *err, size_t errlen);
void pe_pretok_destroy(pe_pretok *p); /* NULL: no-op */

/* Splits text[0..len) into words (replacing w's previous content). Returns 0, -1 on
 * ENOMEM, -2 if a regex match fails (PCRE2 limit). Thread-safe for distinct w. */
int pe_pretok_split(const pe_pretok *p, const char *text, size_t len, pe_words *w);

void pe_words_deinit(pe_words *w); /* frees w's buffers; w may be zeroed or half-built */

#endif /* PE_TOKENIZER_PRE_H */
