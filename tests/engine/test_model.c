/* SPDX-License-Identifier: MIT */
/*
 * test_model.c - the forward pass against itself and a reference:
 *   - paged attention == plain contiguous reference attention (all logits, random prompts,
 *     f32 and f16 KV, odd chunk sizes, page sizes 1/4/16). The two differ only in the
 *     summation order of the dot products: bound 1e-5 of the largest logit with an f32
 *     cache; 1e-3 with f16, where such a difference can flip the f16 rounding of a K/V
 *     element in a later layer (one f16 ulp is 1e-3 relative);
 *   - a prompt whose prefix is cached gives the same logits as a cold run;
 *   - chunked prefill (1, 7, all tokens per chunk) gives the same logits;
 *   - a batch of several sequences gives each the logits it gets alone;
 *   - bad tokens and an over-long chunk are refused without writing anything.
 * Model: argv[1], else $PGD_MODELS_DIR/stories260K.gguf, else ../shared/models beside the
 * source tree; skipped (77) with a message when none is found.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "t.h"

static pe_model *g_model;

static const char *model_path(int argc, char **argv, char *buf, size_t n)
{
    if (argc > 1) return argv[1];
    const char *dir = getenv("PGD_MODELS_DIR");
    snprintf(buf, n, "%s/stories260K.gguf", dir ? dir : PGD_SOURCE_DIR "/../shared/models");
    FILE *f = fopen(buf, "rb");
    if (!f) return NULL;
    fclose(f);
    return buf;
}

static pe_ctx *make_ctx(uint32_t n_batch, uint32_t page_tokens, pgd_kv_type kv, int ref)
{
    pe_ctx_params p = pe_ctx_default_params();
    char err[256];
    pe_ctx *c;
    p.n_ctx = 256;
    p.n_batch = n_batch;
    p.page_tokens = page_tokens;
    p.kv_type = kv;
    p.contiguous_ref = ref;
    p.n_threads = 2;
    p.kv_tokens = 4096;
    if (pe_ctx_create(g_model, &p, &c, err, sizeof err)) {
        fprintf(stderr, "pe_ctx_create: %s\n", err);
        return NULL;
    }
    return c;
}

/* Runs tokens through a fresh sequence in chunks of `chunk`; all logits into out. */
static int run_all(pe_ctx *c, const int32_t *toks, uint32_t n, uint32_t chunk, float *out)
{
    pgd_seq *s;
    uint32_t V = g_model->hp.n_vocab;
    T_OK(pgd_seq_create(pe_ctx_cache(c), NULL, 0, &s));
    for (uint32_t i = 0; i < n; i += chunk) {
        uint32_t k = n - i < chunk ? n - i : chunk;
        T_EQ(pe_forward(c, s, toks + i, k, out + (size_t)i * V, 1), 0);
    }
    pgd_seq_destroy(pe_ctx_cache(c), s);
    return 0;
}

static double max_rel_diff(const float *a, const float *b, size_t n)
{
    double md = 0, mag = 1e-6;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > md) md = d;
        if (fabs(a[i]) > mag) mag = fabs(a[i]);
    }
    return md / mag;
}

static void random_tokens(uint64_t *seed, int32_t *t, uint32_t n)
{
    t[0] = 1;
    for (uint32_t i = 1; i < n; i++)
        t[i] = 3 + (int32_t)(t_rand(seed) % (g_model->hp.n_vocab - 3));
}

static int test_paged_equals_contiguous(void)
{
    uint64_t seed = 42;
    const uint32_t V = g_model->hp.n_vocab;
    static const uint32_t pts[] = {1, 4, 16};
    static const pgd_kv_type kvs[] = {PGD_KV_F32, PGD_KV_F16};
    for (int trial = 0; trial < 6; trial++) {
        uint32_t n = 1 + (uint32_t)(t_rand(&seed) % 120);
        uint32_t chunk = 1 + (uint32_t)(t_rand(&seed) % 40);
        int32_t *toks = malloc(n * sizeof *toks);
        float *a = malloc((size_t)n * V * sizeof *a), *b = malloc((size_t)n * V * sizeof *b);
        T_ASSERT(toks && a && b);
        random_tokens(&seed, toks, n);
        pgd_kv_type kv = kvs[trial % 2];
        pe_ctx *paged = make_ctx(chunk, pts[trial % 3], kv, 0);
        pe_ctx *ref = make_ctx(chunk, pts[trial % 3], kv, 1);
        T_ASSERT(paged && ref);
        T_OK(run_all(paged, toks, n, chunk, a));
        T_OK(run_all(ref, toks, n, chunk, b));
        double d = max_rel_diff(a, b, (size_t)n * V);
        double bound = kv == PGD_KV_F32 ? 1e-5 : 1e-3;
        if (d > bound)
            T_FAIL("trial %d (n %u, chunk %u, kv %s): paged vs contiguous %.3g", trial, n, chunk,
                   pgd_kv_type_name(kv), d);
        pe_ctx_free(paged);
        pe_ctx_free(ref);
        free(toks);
        free(a);
        free(b);
    }
    return 0;
}

static int test_chunking_invariant(void)
{
    uint64_t seed = 7;
    const uint32_t V = g_model->hp.n_vocab, n = 70;
    int32_t toks[70];
    float *a = malloc((size_t)n * V * sizeof *a), *b = malloc((size_t)n * V * sizeof *b);
    T_ASSERT(a && b);
    random_tokens(&seed, toks, n);
    pe_ctx *c = make_ctx(128, 16, PGD_KV_F32, 0);
    T_ASSERT(c);
    T_OK(run_all(c, toks, n, n, a));
    static const uint32_t chunks[] = {1, 7, 16, 33};
    for (size_t i = 0; i < sizeof chunks / sizeof chunks[0]; i++) {
        T_OK(run_all(c, toks, n, chunks[i], b));
        double d = max_rel_diff(a, b, (size_t)n * V);
        if (d > 1e-5) T_FAIL("chunk %u vs one chunk: %.3g", chunks[i], d);
    }
    pe_ctx_free(c);
    free(a);
    free(b);
    return 0;
}

/* A second prompt sharing a cached prefix gives the logits of a cold run. */
static int test_prefix_hit_is_exact(void)
{
    uint64_t seed = 99;
    const uint32_t V = g_model->hp.n_vocab;
    int32_t p1[80], p2[90];
    random_tokens(&seed, p1, 80);
    memcpy(p2, p1, 50 * sizeof *p2); /* 3 full pages of 16 shared, then divergence */
    random_tokens(&seed, p2 + 50, 40);
    p2[50] = 5;
    float *warm = malloc(V * sizeof *warm), *cold = malloc(V * sizeof *cold);
    T_ASSERT(warm && cold);

    pe_ctx *c = make_ctx(64, 16, PGD_KV_F16, 0);
    T_ASSERT(c);
    pgd_cache *cache = pe_ctx_cache(c);
    pgd_seq *s;
    T_OK(pgd_seq_create(cache, NULL, 0, &s));
    T_EQ(pgd_seq_match(cache, s, p1, 80), 0);
    T_EQ(pe_forward(c, s, p1, 64, NULL, 0), 0);
    T_EQ(pe_forward(c, s, p1 + 64, 16, NULL, 0), 0);
    pgd_seq_destroy(cache, s);

    T_OK(pgd_seq_create(cache, NULL, 0, &s));
    int64_t hit = pgd_seq_match(cache, s, p2, 90);
    T_EQ(hit, 48);
    T_EQ(pe_forward(c, s, p2 + 48, 42, warm, 0), 0);
    pgd_seq_destroy(cache, s);
    pe_ctx_free(c);

    c = make_ctx(64, 16, PGD_KV_F16, 0);
    T_ASSERT(c);
    cache = pe_ctx_cache(c);
    T_OK(pgd_seq_create(cache, NULL, 0, &s));
    T_EQ(pe_forward(c, s, p2, 48, NULL, 0), 0); /* same chunk boundary as the cached run */
    T_EQ(pe_forward(c, s, p2 + 48, 42, cold, 0), 0);
    pgd_seq_destroy(cache, s);
    pe_ctx_free(c);
    double d = max_rel_diff(cold, warm, V);
    if (d > 1e-6) T_FAIL("prefix-hit logits differ from cold: %.3g", d);
    free(warm);
    free(cold);
    return 0;
}

/* A batch of several sequences (prefill chunks and decode tokens together) gives each
 * sequence the logits it gets alone; a batch that does not fit changes nothing. */
static int test_batch_equals_sequential(void)
{
    uint64_t seed = 1234;
    const uint32_t V = g_model->hp.n_vocab;
    enum { S = 3 };
    static const uint32_t lens[S] = {5, 40, 17};
    int32_t toks[S][48];
    float *alone = malloc((size_t)S * 4 * V * sizeof *alone);
    float *batch = malloc((size_t)S * 4 * V * sizeof *batch);
    T_ASSERT(alone && batch);
    for (int i = 0; i < S; i++)
        random_tokens(&seed, toks[i], lens[i] + 3);

    pe_ctx *c = make_ctx(64, 16, PGD_KV_F32, 0);
    T_ASSERT(c);
    pgd_cache *cache = pe_ctx_cache(c);
    for (int i = 0; i < S; i++) { /* alone: prefill, then 3 decode steps */
        pgd_seq *s;
        T_OK(pgd_seq_create(cache, "alone", 5, &s));
        T_EQ(pe_forward(c, s, toks[i], lens[i], alone + ((size_t)i * 4) * V, 0), 0);
        for (uint32_t k = 0; k < 3; k++)
            T_EQ(pe_forward(c, s, &toks[i][lens[i] + k], 1, alone + ((size_t)i * 4 + 1 + k) * V, 0),
                 0);
        pgd_seq_destroy(cache, s);
    }
    pgd_seq *seqs[S];
    pe_batch_item items[S];
    for (int i = 0; i < S; i++) {
        T_OK(pgd_seq_create(cache, "batch", 5, &seqs[i]));
        items[i] = (pe_batch_item){seqs[i], toks[i], lens[i], batch + ((size_t)i * 4) * V, 0};
    }
    T_EQ(pe_forward_batch(c, items, S), 0);
    for (uint32_t k = 0; k < 3; k++) {
        for (int i = 0; i < S; i++)
            items[i] = (pe_batch_item){seqs[i], &toks[i][lens[i] + k], 1,
                                       batch + ((size_t)i * 4 + 1 + k) * V, 0};
        T_EQ(pe_forward_batch(c, items, S), 0);
    }
    double d = max_rel_diff(alone, batch, (size_t)S * 4 * V);
    if (d > 1e-5) T_FAIL("batched vs alone: %.3g", d);

    /* the same sequence twice, or more tokens than n_batch: refused, nothing changed */
    items[0] = (pe_batch_item){seqs[0], toks[0], 1, NULL, 0};
    items[1] = items[0];
    T_EQ(pe_forward_batch(c, items, 2), PGD_EINVAL);
    int32_t many[70] = {0};
    items[1] = (pe_batch_item){seqs[1], many, 64, NULL, 0};
    T_EQ(pe_forward_batch(c, items, 2), PGD_EINVAL);
    T_EQ(pgd_seq_length(cache, seqs[0]), lens[0] + 3);
    T_EQ(pgd_seq_length(cache, seqs[1]), lens[1] + 3);
    T_EQ(pgd_cache_check(cache), PGD_OK);
    for (int i = 0; i < S; i++)
        pgd_seq_destroy(cache, seqs[i]);
    pe_ctx_free(c);
    free(alone);
    free(batch);
    return 0;
}

/* A batch whose pages do not fit fails with PGD_ENOSPC and leaves every sequence as it
 * was (the grows of the items before the one that failed are undone). */
static int test_batch_enospc_changes_nothing(void)
{
    pe_ctx_params p = pe_ctx_default_params();
    char err[256];
    pe_ctx *c;
    p.n_ctx = 256;
    p.n_batch = 256;
    p.kv_tokens = 64; /* 4 pages of 16 */
    p.n_threads = 1;
    T_EQ(pe_ctx_create(g_model, &p, &c, err, sizeof err), 0);
    pgd_cache *cache = pe_ctx_cache(c);
    pgd_seq *a, *b;
    int32_t t[80];
    uint64_t seed = 5;
    random_tokens(&seed, t, 80);
    T_OK(pgd_seq_create(cache, NULL, 0, &a));
    T_OK(pgd_seq_create(cache, NULL, 0, &b));
    pe_batch_item items[2] = {{a, t, 30, NULL, 0}, {b, t + 30, 40, NULL, 0}}; /* 2 + 3 pages */
    T_EQ(pe_forward_batch(c, items, 2), PGD_ENOSPC);
    T_EQ(pgd_seq_length(cache, a), 0);
    T_EQ(pgd_seq_length(cache, b), 0);
    pgd_cache_stats st;
    pgd_cache_get_stats(cache, &st);
    T_EQ(st.n_pages_free, st.n_pages_total);
    T_EQ(pgd_cache_check(cache), PGD_OK);
    pgd_seq_destroy(cache, a);
    pgd_seq_destroy(cache, b);
    pe_ctx_free(c);
    return 0;
}

static int test_bad_input_refused(void)
{
    pe_ctx *c = make_ctx(8, 16, PGD_KV_F16, 0);
    pgd_seq *s;
    T_ASSERT(c);
    T_OK(pgd_seq_create(pe_ctx_cache(c), NULL, 0, &s));
    int32_t bad[2] = {1, (int32_t)g_model->hp.n_vocab};
    T_EQ(pe_forward(c, s, bad, 2, NULL, 0), PGD_EINVAL);
    int32_t neg[1] = {-3};
    T_EQ(pe_forward(c, s, neg, 1, NULL, 0), PGD_EINVAL);
    int32_t many[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    T_EQ(pe_forward(c, s, many, 9, NULL, 0), PGD_EINVAL); /* over n_batch */
    T_EQ(pgd_seq_length(pe_ctx_cache(c), s), 0);          /* nothing was written */
    T_EQ(pgd_cache_check(pe_ctx_cache(c)), PGD_OK);
    pgd_seq_destroy(pe_ctx_cache(c), s);
    pe_ctx_free(c);
    return 0;
}

static int test_load_errors(void)
{
    pe_model *m;
    char err[512];
    T_EQ(pe_model_load("/nonexistent/model.gguf", NULL, NULL, &m, err, sizeof err), -1);
    T_ASSERT(m == NULL && strlen(err) > 0);
    return 0;
}

int main(int argc, char **argv)
{
    char buf[1024], err[512];
    const char *path = model_path(argc, argv, buf, sizeof buf);
    if (!path) T_SKIP("stories260K.gguf not found (set PGD_MODELS_DIR or pass a model path)");
    if (pe_model_load(path, NULL, NULL, &g_model, err, sizeof err)) {
        fprintf(stderr, "cannot load %s: %s\n", path, err);
        return 1;
    }
    T_RUN(test_paged_equals_contiguous);
    T_RUN(test_chunking_invariant);
    T_RUN(test_prefix_hit_is_exact);
    T_RUN(test_batch_equals_sequential);
    T_RUN(test_batch_enospc_changes_nothing);
    T_RUN(test_bad_input_refused);
    T_RUN(test_load_errors);
    pe_model_free(g_model);
    T_DONE();
}
