/* SPDX-License-Identifier: MIT */
/*
 * tokenizer.h - text <-> token ids for GGUF vocabularies, matching llama.cpp exactly:
 * SentencePiece-style BPE (tokenizer.ggml.model = "llama") and GPT-2-style byte-level BPE
 * ("gpt2", with the pre-tokenizer regexes named by tokenizer.ggml.pre), special-token
 * partitioning, and a streaming decoder that only emits whole UTF-8 characters.
 *
 * Callers: the model loader (pe_vocab_load), `pagoda run` and the server (pe_tokenize,
 * pe_detok_*), tests and the fuzz target (pe_vocab_create).
 *
 * Implemented in vocab.c (building, accessors), vocab_load.c (from GGUF), tokenize.c
 * (text -> ids) and detok.c (ids -> text); tokenizer_int.h is their shared pe_vocab.
 *
 * Thread-safety: a pe_vocab is immutable once built; any number of threads may tokenize
 * and decode with it at once. A pe_detok belongs to one thread.
 *
 * The leading-space rule (SentencePiece). With add_space_prefix (the default for "llama"
 * vocabularies), pe_tokenize puts a space before the text and before each piece of text
 * that follows a special token, so "Once upon a time" becomes "▁Once ▁upon ▁a ▁time".
 * Decoding gives that space back. pe_detok removes it again: the first non-empty text piece
 * of a sequence loses one leading space, after BOS or any other control token that renders
 * empty, so prompt + generation prints "Once upon a time, ..." as typed. llama.cpp's
 * llama_detokenize strips it the same way for a sequence without BOS; with BOS first and
 * remove_special it keeps it. pe_token_to_piece never strips (it is llama_token_to_piece).
 * Byte-level BPE adds no space, so nothing is removed there.
 */
#ifndef PE_TOKENIZER_H
#define PE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

typedef struct pe_vocab pe_vocab;

/* Token types as GGUF stores them in tokenizer.ggml.token_type. */
enum {
    PE_TOKEN_TYPE_UNDEFINED = 0,
    PE_TOKEN_TYPE_NORMAL = 1,
    PE_TOKEN_TYPE_UNKNOWN = 2,
    PE_TOKEN_TYPE_CONTROL = 3,
    PE_TOKEN_TYPE_USER_DEFINED = 4,
    PE_TOKEN_TYPE_UNUSED = 5,
    PE_TOKEN_TYPE_BYTE = 6,
};

/* A vocabulary built from arrays, as pe_vocab_load reads them from GGUF; for tests, the
 * fuzz target and tools. Everything is copied: nothing needs to outlive the call. */
typedef struct pe_vocab_params {
    const char *model; /* "llama" (SentencePiece) or "gpt2" (byte-level BPE) */
    const char *pre;   /* gpt2: pre-tokenizer name; NULL: llama.cpp's default */
    const char *name;  /* general.name (NULL: none); "phi-3"/"phi3" gets
                          llama.cpp's rstrip rule for special tokens */
    uint32_t n_tokens;
    const pe_gguf_str *tokens;  /* [n_tokens] token texts (need not be NUL-terminated) */
    const float *scores;        /* [n_tokens] or NULL (all 0) */
    const int32_t *token_types; /* [n_tokens] PE_TOKEN_TYPE_* or NULL (all NORMAL) */
    uint32_t n_merges;
    const pe_gguf_str *merges; /* gpt2: [n_merges] "left right", rank = index */
    /* Special ids: -1 none, -2 the model's default (llama: bos 1, eos 2, unk 0). */
    int32_t bos_id, eos_id, unk_id, eot_id, eom_id, pad_id;
    /* -1: the model's default (llama: add_bos 1, add_space_prefix 1; gpt2: 0, 0). */
    int add_bos, add_eos, add_space_prefix;
} pe_vocab_params;

/* Returns params with every id and flag at its default (-2 / -1) and nothing else set. */
pe_vocab_params pe_vocab_default_params(void);

/* Builds a vocabulary from p. Returns 0, or -1 with one line naming the problem in err
 * (ENOMEM, an unknown model or pre-tokenizer, an id out of range, a duplicate token). */
int pe_vocab_create(const pe_vocab_params *p, pe_vocab **out, char *err, size_t errlen);

/* Reads the tokenizer.ggml.* keys of f: model, pre, tokens, scores, token_type, merges,
 * bos/eos/unknown/eot/eom/padding_token_id, add_bos_token, add_eos_token,
 * add_space_prefix; general.name. Validates types, array lengths and ids (-1 or
 * 0xFFFFFFFF mean "none"). Returns 0, or -1 with one line naming the key in err. The
 * vocabulary copies what it needs: f may be closed afterwards. */
int pe_vocab_load(const pe_gguf_file *f, pe_vocab **out, char *err, size_t errlen);
void pe_vocab_destroy(pe_vocab *v); /* NULL: no-op */

uint32_t pe_vocab_n_tokens(const pe_vocab *v);
int32_t pe_vocab_bos(const pe_vocab *v); /* -1 if none */
int32_t pe_vocab_eos(const pe_vocab *v); /* -1 if none */
int32_t pe_vocab_eot(const pe_vocab *v); /* -1 if none ("<|eot_id|>", "<|im_end|>", ...) */
int32_t pe_vocab_unk(const pe_vocab *v); /* -1 if none */
int pe_vocab_add_bos(const pe_vocab *v); /* tokenize with add_special prepends BOS */
int pe_vocab_add_eos(const pe_vocab *v);
int pe_vocab_add_space_prefix(const pe_vocab *v);
int pe_vocab_is_spm(const pe_vocab *v); /* 1: "llama" model, 0: "gpt2" */
/* Returns 1 if tok ends generation: EOS, EOT, EOM or a token llama.cpp treats so by its
 * text ("<|endoftext|>", "<|im_end|>", "<end_of_turn>", ...). */
int pe_vocab_is_eog(const pe_vocab *v, int32_t tok);
/* Returns 1 for control and unknown tokens (rendered empty by default). */
int pe_vocab_is_control(const pe_vocab *v, int32_t tok);
/* Returns the token's raw vocabulary text (borrowed, valid until pe_vocab_destroy) and its
 * length in *len; NULL for an id out of range. */
const char *pe_vocab_text(const pe_vocab *v, int32_t tok, size_t *len);
/* Returns the longest piece any token renders as, in bytes. */
size_t pe_vocab_max_piece(const pe_vocab *v);

/* Tokenizes text[0..len) (any bytes; invalid UTF-8 is handled as llama.cpp does).
 * add_special: prepend BOS / append EOS as the vocabulary asks. parse_special: control
 * tokens written in the text ("<s>", "<|im_start|>") become those tokens; user-defined
 * tokens are always recognised. Returns the number of tokens n: out[0..min(n, max_out))
 * is written, nothing past max_out, so n > max_out means "retry with n". Negative on
 * error (PGD_ENOMEM, or PGD_EINVAL for text over 256 MiB). Cost: O(len log len). */
int64_t pe_tokenize(const pe_vocab *v, const char *text, size_t len, int add_special,
                    int parse_special, int32_t *out, size_t max_out);

/* A byte range text[off .. off + len) of a text. */
typedef struct pe_text_span {
    size_t off, len;
} pe_text_span;

/* How pe_tokenize_ex tokenizes. */
typedef struct pe_tokenize_params {
    int add_special;   /* as pe_tokenize */
    int parse_special; /* as pe_tokenize */
    /* [n_plain] ascending, disjoint ranges of the text where no control token is parsed,
     * even with parse_special: an occurrence of a control token's text that overlaps one
     * stays plain text (user-defined tokens are recognised everywhere, as ever). For
     * chat prompts: the template's own markers are parsed, message content is not
     * (pe_chat_render_spans gives the ranges). Borrowed for the call; NULL: none. */
    const pe_text_span *plain;
    size_t n_plain;
    /* Gives up as soon as the text is known to make more tokens than this (SIZE_MAX: no
     * bound); see pe_tokenize_ex for the rule and its cost. */
    size_t max_tokens;
} pe_tokenize_params;

/* Returns params with no flags, no plain ranges and max_tokens SIZE_MAX. */
pe_tokenize_params pe_tokenize_default_params(void);

/* Tokenizes text[0..len) as p says, once. Returns n, the number of tokens, with *out the
 * tokens in a malloc'ed array the caller frees with free() (NULL when n is 0); or a value
 * n > p->max_tokens: the text makes at least n tokens, *out is NULL and the work stopped
 * early; or a negative status as pe_tokenize. out may be NULL (just count).
 *
 * The bound (why refusing an oversized text is cheap): every token stands for at most
 * B = pe_vocab_max_token_bytes(v) bytes of the text, so a text of N bytes makes at least
 * ceil(N / B) tokens. SentencePiece: a token's text holds each input byte it covers
 * (' ' even as 3 bytes), so B is the longest token text; a special token is its text.
 * Byte-level BPE: one code point comes from at most 4 input bytes (lenient decoding) and
 * gives at least one alphabet character, so B is 4 x the longest token text. N leaves
 * out whitespace when a special token of the vocabulary strips it (Phi-3). It holds only
 * when no byte can be dropped (pe_vocab_max_token_bytes is 0 otherwise). With a bound,
 * a text with ceil(N / B) > max_tokens is refused in O(1) (O(N) with stripping) without
 * being partitioned, a raw fragment that cannot fit is not tokenized, and the text that
 * is tokenized is at most B x max_tokens bytes, which bounds time and memory. Without
 * one the text is tokenized piece by piece until the count passes max_tokens. Under
 * the bound, n <= max_tokens is exact and the tokens are pe_tokenize's. */
int64_t pe_tokenize_ex(const pe_vocab *v, const char *text, size_t len, const pe_tokenize_params *p,
                       int32_t **out);

/* Returns B of the bound above: the most bytes of text one token can stand for, or 0 when
 * the vocabulary can drop bytes (a byte or merge result that is no token) and there is no
 * bound. */
size_t pe_vocab_max_token_bytes(const pe_vocab *v);

/* Flags of pe_token_to_piece_ex. */
#define PE_PIECE_SPECIAL 1u /* render control/unknown tokens as their text ("<s>") */

/* Returns the number of bytes of token tok's text: SentencePiece "▁" -> " ", "<0x0A>" ->
 * that byte; byte-level BPE decoded to bytes; control and unknown tokens are empty
 * unless PE_PIECE_SPECIAL; an id out of range is empty. Writes min(n, buflen) bytes to
 * buf (snprintf-like, no NUL). */
size_t pe_token_to_piece_ex(const pe_vocab *v, int32_t tok, unsigned flags, char *buf,
                            size_t buflen);
size_t pe_token_to_piece(const pe_vocab *v, int32_t tok, char *buf, size_t buflen);

/* ---- streaming decode ---- */

/* Caller-owned decoder state (init/deinit-free: plain data). */
typedef struct pe_detok {
    const pe_vocab *v;
    unsigned flags;  /* PE_PIECE_SPECIAL to render control tokens */
    int strip_space; /* the next non-empty piece loses one leading space */
    uint8_t pend[4]; /* an incomplete UTF-8 sequence carried to the next call */
    uint32_t n_pend;
} pe_detok;

/* Starts a sequence (arms the leading-space rule when the vocabulary adds a space). */
void pe_detok_init(pe_detok *d, const pe_vocab *v);
/* Appends token tok's bytes and writes the complete UTF-8 characters they finish into
 * out; an incomplete sequence at the end is kept for the next call; bytes that can never
 * form a character become U+FFFD. Returns the bytes written, at most
 * 3 * (pe_vocab_max_piece(v) + 4). If that is more than outlen, nothing is written, the
 * state is unchanged and the return value is the size needed. */
size_t pe_detok_push(pe_detok *d, int32_t tok, char *out, size_t outlen);
/* Ends the sequence: writes the carried incomplete sequence as U+FFFD (3 bytes, or 0 if
 * none; needs outlen >= 3, same contract as push) and resets the carry. */
size_t pe_detok_flush(pe_detok *d, char *out, size_t outlen);

/* Decodes tokens[0..n) in one call with pe_detok (the leading-space rule included) into
 * out. Returns the length, or the size needed (nothing usable written) if > outlen. */
size_t pe_detokenize(const pe_vocab *v, const int32_t *tokens, size_t n, char *out, size_t outlen);

#endif /* PE_TOKENIZER_H */
