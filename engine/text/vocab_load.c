/* SPDX-License-Identifier: MIT */
/*
 * vocab_load.c - pe_vocab_load: the tokenizer.ggml.* keys of a GGUF file checked (types,
 * array lengths, ids) and handed to pe_vocab_create, which copies what it keeps.
 *
 * Callers: the model loader (engine/runtime/weights.c), tests. Uses only the public API of
 * tokenizer.h and gguf.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "tokenizer.h"

/* Reads an optional id key into *out: -2 absent, -1 "none" (-1 or 0xFFFFFFFF). */
static int load_id(const pe_gguf_file *f, const char *key, int32_t *out, char *err, size_t errlen)
{
    int32_t i;
    uint32_t u;
    int rc = pe_gguf_get_i32(f, key, &i);
    *out = -2;
    if (rc == -1) return 0;
    if (rc == 0) {
        if (i < -1) {
            snprintf(err, errlen, "%s = %d: not a token id", key, i);
            return -1;
        }
        *out = i;
        return 0;
    }
    rc = pe_gguf_get_u32(f, key, &u);
    if (rc == 0 && u == UINT32_MAX) {
        *out = -1;
        return 0;
    }
    if (rc == 0) {
        snprintf(err, errlen, "%s = %u: out of range", key, (unsigned)u);
        return -1;
    }
    snprintf(err, errlen, "%s: not an integer", key);
    return -1;
}

static int load_bool(const pe_gguf_file *f, const char *key, int *out, char *err, size_t errlen)
{
    int b, rc = pe_gguf_get_bool(f, key, &b);
    *out = -1;
    if (rc == -1) return 0;
    if (rc != 0) {
        snprintf(err, errlen, "%s: not a bool", key);
        return -1;
    }
    *out = b;
    return 0;
}

/* Reads an optional string key as a NUL-terminated copy into buf (truncated names are
 * still refused by the caller's comparisons). Returns 0 (absent: buf = ""), or -1. */
static int load_str(const pe_gguf_file *f, const char *key, char *buf, size_t buflen, int *present,
                    char *err, size_t errlen)
{
    pe_gguf_str s;
    int rc = pe_gguf_get_str(f, key, &s);
    size_t n;
    buf[0] = 0;
    *present = rc == 0;
    if (rc == -1) return 0;
    if (rc != 0) {
        snprintf(err, errlen, "%s: not a string", key);
        return -1;
    }
    n = s.len < buflen - 1 ? (size_t)s.len : buflen - 1;
    memcpy(buf, s.ptr, n);
    buf[n] = 0;
    return 0;
}

/* Checks an optional numeric array key: its element type must be one of t1/t2 and its
 * length n_tokens. Returns the kv, NULL when absent (*bad = 0) or invalid (*bad = 1). */
static const pe_gguf_kv *load_arr(const pe_gguf_file *f, const char *key, uint32_t t1, uint32_t t2,
                                  uint32_t n_tokens, int *bad, char *err, size_t errlen)
{
    const pe_gguf_kv *kv = pe_gguf_find_kv(f, key);
    *bad = 0;
    if (!kv) return NULL;
    if (kv->type != PE_GGUF_TYPE_ARRAY || (kv->arr_type != t1 && kv->arr_type != t2)) {
        snprintf(err, errlen, "%s: must be an array of %s (is %s)", key, pe_gguf_type_name(t1),
                 kv->type == PE_GGUF_TYPE_ARRAY ? pe_gguf_type_name(kv->arr_type)
                                                : pe_gguf_type_name(kv->type));
        *bad = 1;
        return NULL;
    }
    if (kv->n != n_tokens) {
        snprintf(err, errlen, "%s: %llu entries for %u tokens", key, (unsigned long long)kv->n,
                 (unsigned)n_tokens);
        *bad = 1;
        return NULL;
    }
    return kv;
}

int pe_vocab_load(const pe_gguf_file *f, pe_vocab **out, char *err, size_t errlen)
{
    pe_vocab_params p = pe_vocab_default_params();
    const pe_gguf_kv *toks, *kv;
    char model[64], pre[64], name[256];
    float *scores = NULL;
    int32_t *types = NULL;
    int present, bad, rc = -1;
    uint64_t i;

    *out = NULL;
    if (load_str(f, "tokenizer.ggml.model", model, sizeof model, &present, err, errlen)) return -1;
    if (!present) {
        snprintf(err, errlen, "tokenizer.ggml.model: missing");
        return -1;
    }
    if (load_str(f, "tokenizer.ggml.pre", pre, sizeof pre, &present, err, errlen)) return -1;
    p.pre = present ? pre : NULL;
    if (load_str(f, "general.name", name, sizeof name, &present, err, errlen)) return -1;
    p.name = present ? name : NULL;
    p.model = model;

    rc = pe_gguf_get_arr(f, "tokenizer.ggml.tokens", PE_GGUF_TYPE_STRING, &toks);
    if (rc != 0) {
        snprintf(err, errlen, "tokenizer.ggml.tokens: %s",
                 rc == -1 ? "missing" : "must be an array of strings");
        return -1;
    }
    if (toks->n == 0 || toks->n > (uint64_t)INT32_MAX || !toks->strs) {
        snprintf(err, errlen, "tokenizer.ggml.tokens: %llu tokens", (unsigned long long)toks->n);
        return -1;
    }
    p.n_tokens = (uint32_t)toks->n;
    p.tokens = toks->strs;
    rc = -1;

    kv = load_arr(f, "tokenizer.ggml.scores", PE_GGUF_TYPE_FLOAT32, PE_GGUF_TYPE_INT32, p.n_tokens,
                  &bad, err, errlen);
    if (bad) goto out;
    if (kv) {
        scores = malloc(p.n_tokens * sizeof *scores);
        if (!scores) goto oom;
        for (i = 0; i < p.n_tokens; i++)
            scores[i] = (float)pe_gguf_arr_f64(kv, i);
        p.scores = scores;
    }
    kv = load_arr(f, "tokenizer.ggml.token_type", PE_GGUF_TYPE_INT32, PE_GGUF_TYPE_INT32,
                  p.n_tokens, &bad, err, errlen);
    if (bad) goto out;
    if (kv) {
        types = malloc(p.n_tokens * sizeof *types);
        if (!types) goto oom;
        for (i = 0; i < p.n_tokens; i++)
            types[i] = (int32_t)pe_gguf_arr_i64(kv, i);
        p.token_types = types;
    }
    if (strcmp(model, "gpt2") == 0) {
        int mrc = pe_gguf_get_arr(f, "tokenizer.ggml.merges", PE_GGUF_TYPE_STRING, &kv);
        if (mrc != 0) {
            snprintf(err, errlen, "tokenizer.ggml.merges: %s",
                     mrc == -1 ? "missing (a gpt2 vocabulary needs it)"
                               : "must be an array of strings");
            goto out;
        }
        if (kv->n > (uint64_t)INT32_MAX || (kv->n > 0 && !kv->strs)) {
            snprintf(err, errlen, "tokenizer.ggml.merges: %llu merges", (unsigned long long)kv->n);
            goto out;
        }
        p.n_merges = (uint32_t)kv->n;
        p.merges = kv->strs;
    }
    if (load_id(f, "tokenizer.ggml.bos_token_id", &p.bos_id, err, errlen) ||
        load_id(f, "tokenizer.ggml.eos_token_id", &p.eos_id, err, errlen) ||
        load_id(f, "tokenizer.ggml.unknown_token_id", &p.unk_id, err, errlen) ||
        load_id(f, "tokenizer.ggml.eot_token_id", &p.eot_id, err, errlen) ||
        load_id(f, "tokenizer.ggml.eom_token_id", &p.eom_id, err, errlen) ||
        load_id(f, "tokenizer.ggml.padding_token_id", &p.pad_id, err, errlen) ||
        load_bool(f, "tokenizer.ggml.add_bos_token", &p.add_bos, err, errlen) ||
        load_bool(f, "tokenizer.ggml.add_eos_token", &p.add_eos, err, errlen) ||
        load_bool(f, "tokenizer.ggml.add_space_prefix", &p.add_space_prefix, err, errlen))
        goto out;
    rc = pe_vocab_create(&p, out, err, errlen);
    goto out;
oom:
    snprintf(err, errlen, "out of memory");
out:
    free(scores);
    free(types);
    return rc;
}
