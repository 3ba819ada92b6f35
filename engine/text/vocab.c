/* SPDX-License-Identifier: MIT */
/*
 * vocab.c - pe_vocab_create: a vocabulary from token arrays (tokenizer.h), as llama.cpp's
 * llama_vocab::load builds it: token texts and lookup tables, merges (gpt2), attributes
 * from token types plus llama.cpp's detection of special tokens by text (EOT, EOG, FIM),
 * the special-token list in partition order, byte-fallback tokens, and every token's
 * rendered piece (so decoding is a copy). Also the accessors.
 *
 * Callers: pe_vocab_load (vocab_load.c), tests and the fuzz target. Invariants: see
 * tokenizer_int.h; a failed create frees everything it built.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_int.h"
#include "unicode.h"

static uint64_t table_size(uint64_t n)
{
    uint64_t c = 16;
    while (c < 2 * n)
        c *= 2;
    return c;
}

/* ---- accessors ---- */

uint32_t pe_vocab_n_tokens(const pe_vocab *v)
{
    return v->n_tokens;
}

int32_t pe_vocab_bos(const pe_vocab *v)
{
    return v->bos;
}

int32_t pe_vocab_eos(const pe_vocab *v)
{
    return v->eos;
}

int32_t pe_vocab_eot(const pe_vocab *v)
{
    return v->eot;
}

int32_t pe_vocab_unk(const pe_vocab *v)
{
    return v->unk;
}

int pe_vocab_add_bos(const pe_vocab *v)
{
    return v->add_bos;
}

int pe_vocab_add_eos(const pe_vocab *v)
{
    return v->add_eos;
}

int pe_vocab_add_space_prefix(const pe_vocab *v)
{
    return v->add_space_prefix;
}

int pe_vocab_is_spm(const pe_vocab *v)
{
    return v->spm;
}

int pe_vocab_is_eog(const pe_vocab *v, int32_t tok)
{
    return tok >= 0 && (uint32_t)tok < v->n_tokens && (v->attr[tok] & A_EOG) != 0;
}

int pe_vocab_is_control(const pe_vocab *v, int32_t tok)
{
    return tok >= 0 && (uint32_t)tok < v->n_tokens && (v->attr[tok] & (A_CONTROL | A_UNKNOWN)) != 0;
}

const char *pe_vocab_text(const pe_vocab *v, int32_t tok, size_t *len)
{
    if (tok < 0 || (uint32_t)tok >= v->n_tokens) return NULL;
    return tok_text(v, tok, len);
}

size_t pe_vocab_max_piece(const pe_vocab *v)
{
    return v->max_piece;
}

size_t pe_vocab_max_token_bytes(const pe_vocab *v)
{
    return v->max_token_bytes;
}

/* ---- build ---- */

void pe_vocab_destroy(pe_vocab *v)
{
    if (!v) return;
    free(v->text);
    free(v->text_off);
    free(v->scores);
    free(v->attr);
    free(v->piece);
    free(v->piece_off);
    free(v->tok_tab);
    free(v->merge_text);
    free(v->merge_off);
    free(v->merge_tab);
    free(v->special);
    pe_pretok_destroy(v->pre);
    free(v);
}

pe_vocab_params pe_vocab_default_params(void)
{
    pe_vocab_params p;
    memset(&p, 0, sizeof p);
    p.bos_id = -2;
    p.eos_id = -2;
    p.unk_id = -2;
    p.eot_id = -2;
    p.eom_id = -2;
    p.pad_id = -2;
    p.add_bos = -1;
    p.add_eos = -1;
    p.add_space_prefix = -1;
    return p;
}

/* Copies at most 40 bytes of s, printable, for error messages. */
static const char *show(const char *s, size_t n, char out[48])
{
    size_t i, k = 0;
    for (i = 0; i < n && k < 40; i++)
        out[k++] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
    if (i < n) {
        memcpy(out + k, "...", 3);
        k += 3;
    }
    out[k] = 0;
    return out;
}

static int copy_texts(pe_vocab *v, const pe_vocab_params *p, char *err, size_t errlen)
{
    uint64_t total = 0, i;
    char name[32];
    for (i = 0; i < v->n_tokens; i++)
        total += p->tokens[i].len ? p->tokens[i].len : 24;
    v->text_off = malloc((v->n_tokens + 1ull) * sizeof *v->text_off);
    v->text = malloc(total ? total : 1);
    if (!v->text_off || !v->text) goto oom;
    total = 0;
    for (i = 0; i < v->n_tokens; i++) {
        const pe_gguf_str *s = &p->tokens[i];
        v->text_off[i] = total;
        if (s->len == 0) {
            /* llama.cpp renames empty tokens so that they stay unique */
            int k = snprintf(name, sizeof name, "[EMPTY_%u]", (unsigned)i);
            memcpy(v->text + total, name, (size_t)k);
            total += (uint64_t)k;
        } else {
            if (!s->ptr) {
                snprintf(err, errlen, "tokenizer.ggml.tokens[%u]: NULL text", (unsigned)i);
                return -1;
            }
            memcpy(v->text + total, s->ptr, s->len);
            total += s->len;
        }
    }
    v->text_off[v->n_tokens] = total;
    return 0;
oom:
    snprintf(err, errlen, "out of memory for %u tokens", (unsigned)v->n_tokens);
    return -1;
}

static int build_token_table(pe_vocab *v, char *err, size_t errlen)
{
    uint64_t cap = table_size(v->n_tokens), i;
    v->tok_tab = malloc(cap * sizeof *v->tok_tab);
    if (!v->tok_tab) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    memset(v->tok_tab, 0xff, cap * sizeof *v->tok_tab);
    v->tok_mask = cap - 1;
    for (i = 0; i < v->n_tokens; i++) {
        size_t len;
        const char *t = tok_text(v, (int32_t)i, &len);
        int32_t dup = tok_find(v, t, len);
        uint64_t h;
        char s[48];
        if (dup >= 0) {
            snprintf(err, errlen, "tokenizer.ggml.tokens: duplicate token '%s' (ids %d and %u)",
                     show(t, len, s), dup, (unsigned)i);
            return -1;
        }
        h = hash_bytes(t, len) & v->tok_mask;
        while (v->tok_tab[h] >= 0)
            h = (h + 1) & v->tok_mask;
        v->tok_tab[h] = (int32_t)i;
    }
    return 0;
}

static int build_merges(pe_vocab *v, const pe_vocab_params *p, char *err, size_t errlen)
{
    uint64_t total = 0, cap, i;
    if (p->n_merges > 0 && !p->merges) {
        snprintf(err, errlen, "tokenizer.ggml.merges: missing");
        return -1;
    }
    v->n_merges = p->n_merges;
    for (i = 0; i < p->n_merges; i++)
        total += p->merges[i].len;
    cap = table_size(p->n_merges);
    v->merge_text = malloc(total ? total : 1);
    v->merge_off = malloc((p->n_merges + 1ull) * sizeof *v->merge_off);
    v->merge_tab = malloc(cap * sizeof *v->merge_tab);
    if (!v->merge_text || !v->merge_off || !v->merge_tab) {
        snprintf(err, errlen, "out of memory for %u merges", (unsigned)p->n_merges);
        return -1;
    }
    memset(v->merge_tab, 0xff, cap * sizeof *v->merge_tab);
    v->merge_mask = cap - 1;
    total = 0;
    for (i = 0; i < p->n_merges; i++) {
        const pe_gguf_str *s = &p->merges[i];
        uint64_t h;
        v->merge_off[i] = total;
        if (s->len) memcpy(v->merge_text + total, s->ptr, s->len);
        total += s->len;
        v->merge_off[i + 1] = total;
        /* llama.cpp keeps the first rank of a repeated merge */
        if (merge_find(v, v->merge_text + v->merge_off[i], s->len) >= 0) continue;
        h = hash_bytes(v->merge_text + v->merge_off[i], s->len) & v->merge_mask;
        while (v->merge_tab[h] >= 0)
            h = (h + 1) & v->merge_mask;
        v->merge_tab[h] = (int32_t)i;
    }
    v->merge_off[p->n_merges] = total;
    return 0;
}

static int32_t find_cstr(const pe_vocab *v, const char *s)
{
    return tok_find(v, s, strlen(s));
}

/* Token texts llama.cpp recognises (load(), "auto-detect special tokens by text"). */
static const char *const eot_texts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<\357\275\234end\342\226\201of\342\226\201sentence\357\275\234>",
    "<end_of_utterance>",
    NULL};
static const char *const fim_pre_texts[] = {"<|fim_prefix|>",
                                            "<fim-prefix>",
                                            "<fim_prefix>",
                                            "<\357\275\234fim\342\226\201begin\357\275\234>",
                                            "<PRE>",
                                            "\342\226\201<PRE>",
                                            "<|code_prefix|>",
                                            "<|prefix|>",
                                            NULL};
static const char *const fim_suf_texts[] = {"<|fim_suffix|>",
                                            "<fim-suffix>",
                                            "<fim_suffix>",
                                            "<\357\275\234fim\342\226\201hole\357\275\234>",
                                            "<SUF>",
                                            "\342\226\201<SUF>",
                                            "<|code_suffix|>",
                                            "<|suffix|>",
                                            NULL};
static const char *const fim_mid_texts[] = {"<|fim_middle|>",
                                            "<fim-middle>",
                                            "<fim_middle>",
                                            "<\357\275\234fim\342\226\201end\357\275\234>",
                                            "<MID>",
                                            "\342\226\201<MID>",
                                            "<|code_middle|>",
                                            "<|middle|>",
                                            NULL};
static const char *const fim_pad_texts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>",
                                            "<PAD>",       "[PAD]",     NULL};
static const char *const fim_rep_texts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
                                            "<REPO>",       "<reponame>",    NULL};
static const char *const fim_sep_texts[] = {"<|file_sep|>", NULL};
static const char *const eog_texts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<\357\275\234end\342\226\201of\342\226\201sentence\357\275\234>",
    "[e~[",
    NULL};

/* Returns the first token of list present in v (marked CONTROL), or -1. */
static int32_t detect(pe_vocab *v, const char *const *list)
{
    for (; *list; list++) {
        int32_t id = find_cstr(v, *list);
        if (id >= 0) {
            v->attr[id] |= A_CONTROL;
            return id;
        }
    }
    return -1;
}

static void mark_eog(pe_vocab *v, int32_t id)
{
    if (id >= 0) v->attr[id] |= A_EOG;
}

/* llama.cpp's special-token detection and EOG set, in its order. */
static void detect_specials(pe_vocab *v)
{
    const char *const *t;
    int32_t fim_pad, fim_rep, fim_sep, end_id, s_id;
    if (v->eot < 0) v->eot = detect(v, eot_texts);
    if (v->eom < 0) v->eom = detect(v, (const char *const[]){"<|eom_id|>", NULL});
    (void)detect(v, fim_pre_texts);
    (void)detect(v, fim_suf_texts);
    (void)detect(v, fim_mid_texts);
    fim_pad = detect(v, fim_pad_texts);
    fim_rep = detect(v, fim_rep_texts);
    fim_sep = detect(v, fim_sep_texts);
    mark_eog(v, fim_pad);
    mark_eog(v, fim_rep);
    mark_eog(v, fim_sep);
    for (t = eog_texts; *t; t++) {
        int32_t id = find_cstr(v, *t);
        if (id < 0) continue;
        v->attr[id] |= A_EOG | A_CONTROL;
    }
    mark_eog(v, v->eos);
    mark_eog(v, v->eot);
    mark_eog(v, v->eom);
    /* o200k_harmony / solar-open: "<|end|>" is not the end of generation there */
    end_id = find_cstr(v, "<|end|>");
    if (end_id >= 0 && (v->attr[end_id] & A_EOG)) {
        int32_t ret = find_cstr(v, "<|return|>"), call = find_cstr(v, "<|call|>");
        int32_t calls = find_cstr(v, "<|calls|>"), flush = find_cstr(v, "<|flush|>");
        int has_ret = ret >= 0 && (v->attr[ret] & A_EOG);
        int has_call =
            (call >= 0 && (v->attr[call] & A_EOG)) || (calls >= 0 && (v->attr[calls] & A_EOG));
        int has_flush = flush >= 0 && (v->attr[flush] & A_EOG);
        if ((has_ret && has_call) || (has_call && has_flush)) v->attr[end_id] = A_USER_DEFINED;
    }
    /* gemma4 / paddleocr: "</s>" is not the end of generation when "<|tool_response>" is */
    s_id = find_cstr(v, "</s>");
    if (s_id >= 0 && (v->attr[s_id] & A_EOG)) {
        int32_t tr = find_cstr(v, "<|tool_response>");
        if (tr >= 0 && (v->attr[tr] & A_EOG)) v->attr[s_id] = A_NORMAL;
    }
}

/* Attribute from a GGUF token type (llama.cpp: unknown numbers are UNDEFINED = 0). */
static uint16_t type_attr(int32_t t)
{
    switch (t) {
    case PE_TOKEN_TYPE_NORMAL:
        return A_NORMAL;
    case PE_TOKEN_TYPE_UNKNOWN:
        return A_UNKNOWN;
    case PE_TOKEN_TYPE_CONTROL:
        return A_CONTROL;
    case PE_TOKEN_TYPE_USER_DEFINED:
        return A_USER_DEFINED;
    case PE_TOKEN_TYPE_UNUSED:
        return A_UNUSED;
    case PE_TOKEN_TYPE_BYTE:
        return A_BYTE;
    default:
        return 0;
    }
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* llama.cpp token_to_byte: strtol(text.substr(3, 2), 16). */
static uint8_t token_byte(const char *t, size_t n)
{
    int v = 0, k;
    size_t i;
    for (i = 3; i < 5 && i < n; i++) {
        k = hexval(t[i]);
        if (k < 0) break;
        v = v * 16 + k;
    }
    return (uint8_t)v;
}

/* Appends the rendered piece of token id (llama.cpp token_to_piece, special = true). */
static int render_piece(const pe_vocab *v, int32_t id, char **buf, size_t *len, size_t *cap)
{
    size_t n, i, need;
    const char *t = tok_text(v, id, &n);
    uint16_t a = v->attr[id];
    /* "[UNK_BYTE_0x" + 2 hex digits per byte + text + "]" per code point, at worst */
    need = *len + 24 * n + n * n + 16;
    if (need > *cap) {
        size_t c = *cap ? *cap : 4096;
        char *nb;
        while (c < need)
            c *= 2;
        nb = realloc(*buf, c);
        if (!nb) return -1;
        *buf = nb;
        *cap = c;
    }
    if (a & (A_UNKNOWN | A_CONTROL | A_USER_DEFINED)) {
        memcpy(*buf + *len, t, n);
        *len += n;
    } else if (a & A_NORMAL) {
        if (v->spm) {
            for (i = 0; i < n; i++) {
                if (i + 2 < n && memcmp(t + i, "\xe2\x96\x81", 3) == 0) {
                    (*buf)[(*len)++] = ' ';
                    i += 2;
                } else {
                    (*buf)[(*len)++] = t[i];
                }
            }
        } else {
            /* llama_decode_text: each code point back to its byte */
            for (i = 0; i < n;) {
                size_t adv, k, nu;
                uint8_t u[4];
                uint32_t cp = pe_utf8_decode((const uint8_t *)t + i, n - i, &adv);
                int b = pe_gpt2_cp_to_byte(cp);
                i += adv;
                if (b >= 0) {
                    (*buf)[(*len)++] = (char)b;
                    continue;
                }
                nu = pe_utf8_encode(cp, u);
                memcpy(*buf + *len, "[UNK_BYTE_0x", 12);
                *len += 12;
                for (k = 0; k < nu; k++) {
                    snprintf(*buf + *len, 3, "%02x", u[k]);
                    *len += 2;
                }
                memcpy(*buf + *len, t, n);
                *len += n;
                (*buf)[(*len)++] = ']';
            }
        }
    } else if (a & A_BYTE) {
        (*buf)[(*len)++] = (char)token_byte(t, n);
    }
    return 0;
}

static int build_pieces(pe_vocab *v, char *err, size_t errlen)
{
    size_t len = 0, cap = 0;
    uint32_t i;
    v->piece_off = malloc((v->n_tokens + 1ull) * sizeof *v->piece_off);
    if (!v->piece_off) goto oom;
    for (i = 0; i < v->n_tokens; i++) {
        size_t n0 = len;
        v->piece_off[i] = len;
        if (render_piece(v, (int32_t)i, &v->piece, &len, &cap)) goto oom;
        if (len - n0 > v->max_piece) v->max_piece = len - n0;
    }
    v->piece_off[v->n_tokens] = len;
    return 0;
oom:
    snprintf(err, errlen, "out of memory");
    return -1;
}

/* Sorts ids by text length, longest first, then by id: llama.cpp's order (its std::sort
 * leaves equal lengths unordered; by id is the deterministic choice). Insertion sort:
 * the ids arrive in id order and the list is short. */
static void sort_special(pe_vocab *v)
{
    uint32_t i;
    for (i = 1; i < v->n_special; i++) {
        int32_t id = v->special[i];
        uint32_t j = i;
        while (j > 0) {
            int32_t prev = v->special[j - 1];
            uint64_t lp = v->text_off[prev + 1] - v->text_off[prev];
            uint64_t li = v->text_off[id + 1] - v->text_off[id];
            if (lp > li || (lp == li && prev < id)) break;
            v->special[j] = prev;
            j--;
        }
        v->special[j] = id;
    }
}

/* Returns 1 when every piece merge_word (tokenize.c) can end with gives a token: a
 * final symbol is a token, or its bytes fall back to tokens one each. SentencePiece:
 * every byte has a byte token, or there is an UNK. Byte-level BPE: every one of the 256
 * byte-alphabet characters is a token (the initial symbols) and every merge "l r" that
 * can apply makes a token "lr" (a merge with no single inner space never matches a
 * pair, see bpe_try_pair). Returns -1 when memory runs out. */
static int keeps_every_byte(const pe_vocab *v)
{
    uint32_t i;
    if (v->spm) {
        if (v->unk >= 0) return 1;
        for (i = 0; i < 256; i++)
            if (v->byte_tok[i] < 0) return 0;
        return 1;
    }
    for (i = 0; i < 256; i++) {
        uint8_t e[4];
        size_t n = pe_utf8_encode(pe_gpt2_byte_to_cp((uint8_t)i), e);
        if (tok_find(v, (const char *)e, n) < 0) return 0;
    }
    size_t cap = 0;
    char *cat = NULL;
    int ok = 1;
    for (i = 0; i < v->n_merges && ok; i++) {
        const char *m = v->merge_text + v->merge_off[i];
        size_t n = (size_t)(v->merge_off[i + 1] - v->merge_off[i]);
        const char *sp = n ? memchr(m, ' ', n) : NULL;
        if (!sp || sp == m || sp == m + n - 1 || memchr(sp + 1, ' ', n - (size_t)(sp - m) - 1))
            continue; /* never matches a pair */
        if (n > cap) {
            char *c = realloc(cat, n);
            if (!c) {
                free(cat);
                return -1;
            }
            cat = c;
            cap = n;
        }
        memcpy(cat, m, (size_t)(sp - m));
        memcpy(cat + (sp - m), sp + 1, n - (size_t)(sp - m) - 1);
        ok = tok_find(v, cat, n - 1) >= 0;
    }
    free(cat);
    return ok;
}

/* Sets max_token_bytes and has_strip (see tokenizer_int.h). A token stands for at most
 * its text's length of input bytes: SentencePiece writes each input byte as itself or
 * ' ' as the 3 bytes of "▁", and adds a prefix; a special token is its text. Byte-level
 * BPE maps each input byte sequence decoded to one code point (at most 4 bytes, leniently)
 * to at least one alphabet character of at least one byte, hence 4 x. Returns 0 or -1
 * (ENOMEM). */
static int token_bound(pe_vocab *v)
{
    size_t max_text = 0;
    uint32_t i;
    for (i = 0; i < v->n_tokens; i++) {
        size_t n = (size_t)(v->text_off[i + 1] - v->text_off[i]);
        if (n > max_text) max_text = n;
    }
    for (i = 0; i < v->n_special; i++)
        if (v->attr[v->special[i]] & (A_LSTRIP | A_RSTRIP)) v->has_strip = 1;
    int keeps = keeps_every_byte(v);
    if (keeps < 0) return -1;
    v->max_token_bytes = keeps ? (v->spm ? max_text : 4 * max_text) : 0;
    return 0;
}

/* Resolves a special id: -2 the default (if in range), -1 none, else must be in range. */
static int resolve_id(const pe_vocab *v, const char *key, int32_t given, int32_t def, int32_t *out,
                      char *err, size_t errlen)
{
    if (given == -2) {
        *out = (def >= 0 && (uint32_t)def < v->n_tokens) ? def : -1;
        return 0;
    }
    if (given < 0) {
        *out = -1;
        return 0;
    }
    if ((uint32_t)given >= v->n_tokens) {
        snprintf(err, errlen, "%s = %d: out of range (%u tokens)", key, given,
                 (unsigned)v->n_tokens);
        return -1;
    }
    *out = given;
    return 0;
}

static int contains_ci(const char *s, const char *sub)
{
    size_t n = strlen(s), m = strlen(sub), i, k;
    for (i = 0; i + m <= n; i++) {
        for (k = 0; k < m; k++)
            if (tolower((unsigned char)s[i + k]) != sub[k]) break;
        if (k == m) return 1;
    }
    return 0;
}

int pe_vocab_create(const pe_vocab_params *p, pe_vocab **out, char *err, size_t errlen)
{
    pe_vocab *v;
    uint32_t i;
    int def_bos = -1, def_eos = -1, def_unk = -1;

    *out = NULL;
    if (!p->model || (strcmp(p->model, "llama") != 0 && strcmp(p->model, "gpt2") != 0)) {
        snprintf(err, errlen,
                 "tokenizer.ggml.model = '%.40s': unsupported tokenizer (supported: llama, "
                 "gpt2)",
                 p->model ? p->model : "");
        return -1;
    }
    if (p->n_tokens == 0 || !p->tokens) {
        snprintf(err, errlen, "tokenizer.ggml.tokens: missing or empty");
        return -1;
    }
    if (p->n_tokens > (uint32_t)INT32_MAX) {
        snprintf(err, errlen, "tokenizer.ggml.tokens: %u tokens is too many",
                 (unsigned)p->n_tokens);
        return -1;
    }
    v = calloc(1, sizeof *v);
    if (!v) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    v->spm = strcmp(p->model, "llama") == 0;
    v->n_tokens = p->n_tokens;
    if (copy_texts(v, p, err, errlen)) goto fail;
    v->scores = malloc(v->n_tokens * sizeof *v->scores);
    v->attr = malloc(v->n_tokens * sizeof *v->attr);
    v->special = malloc(v->n_tokens * sizeof *v->special);
    if (!v->scores || !v->attr || !v->special) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    for (i = 0; i < v->n_tokens; i++) {
        float s = p->scores ? p->scores[i] : 0.0f;
        if (isnan(s)) {
            snprintf(err, errlen, "tokenizer.ggml.scores[%u] is NaN", (unsigned)i);
            goto fail;
        }
        v->scores[i] = s;
        v->attr[i] = p->token_types ? type_attr(p->token_types[i]) : A_NORMAL;
    }
    if (build_token_table(v, err, errlen)) goto fail;

    if (v->spm) {
        def_bos = 1;
        def_eos = 2;
        def_unk = 0;
        v->add_bos = 1;
        v->add_space_prefix = 1;
    } else {
        pe_pretok_info info;
        const char *pre = p->pre ? p->pre : "";
        if (pe_pretok_create(pre, strlen(pre), &v->pre, &info, err, errlen)) goto fail;
        v->ignore_merges = info.ignore_merges;
        v->add_bos = info.add_bos > 0;
        if (build_merges(v, p, err, errlen)) goto fail;
        def_bos = 11; /* llama.cpp's defaults for BPE, used only when in range */
        def_eos = 11;
    }
    if (p->add_bos >= 0) v->add_bos = p->add_bos != 0;
    if (p->add_eos >= 0) v->add_eos = p->add_eos != 0;
    if (p->add_space_prefix >= 0) v->add_space_prefix = p->add_space_prefix != 0;

    if (resolve_id(v, "tokenizer.ggml.bos_token_id", p->bos_id, def_bos, &v->bos, err, errlen) ||
        resolve_id(v, "tokenizer.ggml.eos_token_id", p->eos_id, def_eos, &v->eos, err, errlen) ||
        resolve_id(v, "tokenizer.ggml.unknown_token_id", p->unk_id, def_unk, &v->unk, err,
                   errlen) ||
        resolve_id(v, "tokenizer.ggml.eot_token_id", p->eot_id, -1, &v->eot, err, errlen) ||
        resolve_id(v, "tokenizer.ggml.eom_token_id", p->eom_id, -1, &v->eom, err, errlen) ||
        resolve_id(v, "tokenizer.ggml.padding_token_id", p->pad_id, -1, &v->pad, err, errlen))
        goto fail;
    if (v->add_bos && v->bos < 0) {
        snprintf(err, errlen,
                 "tokenizer.ggml.add_bos_token is true, but tokenizer.ggml.bos_token_id is not "
                 "set");
        goto fail;
    }
    if (v->add_eos && v->eos < 0) {
        snprintf(err, errlen,
                 "tokenizer.ggml.add_eos_token is true, but tokenizer.ggml.eos_token_id is not "
                 "set");
        goto fail;
    }

    detect_specials(v);

    /* special tokens partitioned out of raw text, longest first */
    v->n_special = 0;
    for (i = 0; i < v->n_tokens; i++)
        if (v->attr[i] & (A_CONTROL | A_USER_DEFINED | A_UNKNOWN))
            v->special[v->n_special++] = (int32_t)i;
    sort_special(v);

    if (build_pieces(v, err, errlen)) goto fail;

    /* llama.cpp's per-model attributes: Phi-3 strips spaces after its special tokens */
    if (p->name && (contains_ci(p->name, "phi-3") || contains_ci(p->name, "phi3"))) {
        static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
        int32_t id;
        for (i = 0; i < v->n_special; i++)
            v->attr[v->special[i]] |= A_RSTRIP;
        id = find_cstr(v, "</s>");
        if (id >= 0) v->attr[id] |= A_RSTRIP;
        for (i = 0; i < 3; i++) {
            id = find_cstr(v, keep[i]);
            if (id >= 0) v->attr[id] &= (uint16_t)~A_RSTRIP;
        }
    }

    /* SentencePiece byte fallback: "<0xNN>", else the byte itself as a token */
    for (i = 0; i < 256; i++) {
        char hex[7];
        snprintf(hex, sizeof hex, "<0x%02X>", i);
        v->byte_tok[i] = find_cstr(v, hex);
        if (v->byte_tok[i] < 0) {
            char b = (char)i;
            v->byte_tok[i] = tok_find(v, &b, 1);
        }
    }
    if (token_bound(v)) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    *out = v;
    return 0;
fail:
    pe_vocab_destroy(v);
    return -1;
}
