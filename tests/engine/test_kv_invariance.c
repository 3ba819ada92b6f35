/* SPDX-License-Identifier: MIT */
/*
 * test_kv_invariance.c - the bytes of a position's K/V and the logits do not depend on how
 * the sequence was computed (issue 10, section 1), on stories260K (head_dim 8: a q8_0 /
 * q4_0 block spans 4 tokens, a kivi2 page is quantized as a whole), for every kv type:
 *   - one prefill chunk, chunks of 5, and one token at a time (decode) write the same bytes
 *     into every full page, position by position, and give bit-identical final logits;
 *   - a warm request, whose prefix pages an earlier request wrote while decoding, gives the
 *     same greedy tokens (and logits, bit for bit) as the same request computed cold.
 * Both run with the engine's scalar kernels (PE_ISA_SCALAR: row by row, the same bits
 * whatever the batch), which isolates what libpagoda owns (codec staging, attention's
 * sources and split / merge order), then with the CPU's best kernels in the engine's
 * deterministic mode (pe_ctx_params.deterministic: batch-invariant matrix products), and
 * the default mode's matmul is probed and reported (f32 K/V of layer 0 are a pure function
 * of the matmul): on AVX-512 its GEMV and panel paths round differently, which is why
 * deterministic mode exists.
 * Model: argv[1], else stories260K.gguf in the models directory (tests/proc.h); skipped
 * (77) when none is found.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pagoda/layout.h>

#include "model.h"
#include "ops.h"
#include "proc.h"
#include "t.h"

enum { PT = 16, N_TOK = 77, N_GEN = 12 };

static pe_model *g_model;
static int g_deterministic; /* pe_ctx_params.deterministic of every context */

static pe_ctx *make_ctx(pgd_kv_type kv, uint32_t n_batch)
{
    pe_ctx_params p = pe_ctx_default_params();
    p.n_ctx = 256;
    p.n_batch = n_batch;
    p.page_tokens = PT;
    p.kv_type = kv;
    p.n_threads = 2;
    p.kv_tokens = 4096;
    p.deterministic = g_deterministic;
    char err[256];
    pe_ctx *c = NULL;
    if (pe_ctx_create(g_model, &p, &c, err, sizeof err))
        fprintf(stderr, "pe_ctx_create: %s\n", err);
    return c;
}

/* A fixed pseudo-random prompt (BOS first). */
static void prompt(int32_t *t, uint32_t n)
{
    uint64_t seed = 2026;
    const uint32_t V = pe_model_hparams(g_model)->n_vocab;
    t[0] = 1;
    for (uint32_t i = 1; i < n; i++)
        t[i] = 3 + (int32_t)(t_rand(&seed) % (V - 3));
}

/* Runs toks through a fresh sequence in chunks of `chunk` (1: decode); copies the bytes of
 * every full page to pages[N_TOK / PT][page_bytes] and the last logits to logits. */
static int run(pgd_kv_type kv, const int32_t *toks, uint32_t chunk, uint8_t *pages, float *logits)
{
    pe_ctx *c = make_ctx(kv, chunk > 8 ? chunk : 8);
    T_ASSERT(c);
    pgd_cache *cache = pe_ctx_cache(c);
    pgd_seq *s;
    T_OK(pgd_seq_create(cache, NULL, 0, &s));
    for (uint32_t i = 0; i < N_TOK; i += chunk) {
        uint32_t k = N_TOK - i < chunk ? N_TOK - i : chunk;
        T_EQ(pe_forward(c, s, toks + i, k, logits, 0), 0);
    }
    pgd_pool *pool = pgd_cache_pool(cache);
    const uint64_t pb = pgd_pool_page_bytes(pool);
    const uint32_t *ids;
    T_ASSERT(pgd_seq_pages(cache, s, &ids) >= N_TOK / PT);
    for (uint32_t i = 0; i < N_TOK / PT; i++)
        memcpy(pages + i * pb, pgd_pool_page_data(pool, ids[i]), pb);
    T_OK(pgd_cache_check(cache));
    pgd_seq_destroy(cache, s);
    pe_ctx_destroy(c);
    return 0;
}

/* The first byte at which two copies of a page differ, or -1. */
static long first_diff(const uint8_t *a, const uint8_t *b, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        if (a[i] != b[i]) return (long)i;
    return -1;
}

static int test_prefill_decode_chunks(void)
{
    int32_t toks[N_TOK];
    prompt(toks, N_TOK);
    const uint32_t V = pe_model_hparams(g_model)->n_vocab;
    static const uint32_t chunks[] = {N_TOK, 5, 1};
    for (int ti = 0; ti <= PGD_KV_KIVI2; ti++) {
        const pgd_kv_type kv = (pgd_kv_type)ti;
        pe_ctx *probe = make_ctx(kv, N_TOK);
        T_ASSERT(probe);
        const uint64_t pb = pgd_pool_page_bytes(pgd_cache_pool(pe_ctx_cache(probe)));
        pe_ctx_destroy(probe);
        uint8_t *p0 = malloc(N_TOK / PT * pb), *p = malloc(N_TOK / PT * pb);
        float *l0 = malloc(V * sizeof *l0), *l = malloc(V * sizeof *l);
        T_ASSERT(p0 && p && l0 && l);
        T_OK(run(kv, toks, chunks[0], p0, l0));
        for (int ci = 1; ci < 3; ci++) {
            T_OK(run(kv, toks, chunks[ci], p, l));
            for (uint32_t i = 0; i < N_TOK / PT; i++) {
                long d = first_diff(p0 + i * pb, p + i * pb, pb);
                if (d >= 0)
                    T_FAIL("%s: chunks of %u: page %u differs from one prefill at byte %ld of %llu",
                           pgd_kv_type_name(kv), chunks[ci], i, d, (unsigned long long)pb);
            }
            if (memcmp(l0, l, V * sizeof *l) != 0)
                T_FAIL("%s: chunks of %u: final logits differ from one prefill",
                       pgd_kv_type_name(kv), chunks[ci]);
        }
        printf("     %-5s prefill, chunks of 5, decode: %u full pages and the logits identical\n",
               pgd_kv_type_name(kv), N_TOK / PT);
        free(p0);
        free(p);
        free(l0);
        free(l);
    }
    return 0;
}

static uint32_t argmax(const float *x, uint32_t n)
{
    uint32_t k = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[k]) k = i;
    return k;
}

/* Greedy generation of N_GEN tokens after a prompt of n tokens (prefilled in one chunk, or
 * matched from the cache when it holds its pages): the tokens and every step's logits. */
static int generate(pe_ctx *c, const int32_t *toks, uint32_t n, int32_t *out, float *logits)
{
    pgd_cache *cache = pe_ctx_cache(c);
    const uint32_t V = pe_model_hparams(g_model)->n_vocab;
    pgd_seq *s;
    T_OK(pgd_seq_create(cache, NULL, 0, &s));
    int64_t m = pgd_seq_match(cache, s, toks, n - 1); /* the last token is always computed */
    T_OK(m);
    T_EQ(pe_forward(c, s, toks + m, n - (uint32_t)m, logits, 0), 0);
    for (uint32_t g = 0; g < N_GEN; g++) {
        out[g] = (int32_t)argmax(logits + (size_t)g * V, V);
        if (g + 1 < N_GEN) T_EQ(pe_forward(c, s, out + g, 1, logits + (size_t)(g + 1) * V, 0), 0);
    }
    pgd_seq_destroy(cache, s);
    return (int)m;
}

/* Request A decodes a prompt token by token (its pages are written during decode and
 * registered); request B, a longer prompt starting with A's, hits those pages. B's greedy
 * tokens and logits equal B computed cold in a fresh context. */
static int test_cold_vs_warm(void)
{
    const uint32_t V = pe_model_hparams(g_model)->n_vocab;
    int32_t toks[N_TOK];
    prompt(toks, N_TOK);
    int32_t cold[N_GEN], warm[N_GEN];
    float *lc = malloc((size_t)N_GEN * V * sizeof *lc),
          *lw = malloc((size_t)N_GEN * V * sizeof *lw);
    T_ASSERT(lc && lw);
    for (int ti = 0; ti <= PGD_KV_KIVI2; ti++) {
        const pgd_kv_type kv = (pgd_kv_type)ti;
        pe_ctx *c = make_ctx(kv, 128);
        T_ASSERT(c);
        T_EQ(generate(c, toks, N_TOK, cold, lc), 0);
        pe_ctx_destroy(c);

        c = make_ctx(kv, 128);
        T_ASSERT(c);
        pgd_cache *cache = pe_ctx_cache(c);
        pgd_seq *a;
        T_OK(pgd_seq_create(cache, NULL, 0, &a));
        for (uint32_t i = 0; i < 50; i++) /* A: 50 tokens one at a time: 3 full pages */
            T_EQ(pe_forward(c, a, toks + i, 1, lw, 0), 0);
        pgd_seq_destroy(cache, a);
        int m = generate(c, toks, N_TOK, warm, lw);
        T_EQ(m, 48);
        pe_ctx_destroy(c);
        if (memcmp(cold, warm, sizeof cold) != 0)
            T_FAIL("%s: warm greedy tokens differ from cold", pgd_kv_type_name(kv));
        if (memcmp(lc, lw, (size_t)N_GEN * V * sizeof *lc) != 0)
            T_FAIL("%s: warm logits differ from cold", pgd_kv_type_name(kv));
        printf("     %-5s cold vs warm (48 tokens hit, written by decode): identical\n",
               pgd_kv_type_name(kv));
    }
    free(lc);
    free(lw);
    return 0;
}

/* Nonzero when the kernels in force give layer 0's K/V (f32, so the matmul's exact output)
 * the same bits for one prefill and for chunks of 5. */
static int matmul_batch_invariant(void)
{
    int32_t toks[N_TOK];
    prompt(toks, N_TOK);
    const uint32_t V = pe_model_hparams(g_model)->n_vocab;
    pe_ctx *probe = make_ctx(PGD_KV_F32, N_TOK);
    if (!probe) return 0;
    pgd_pool_layout lay;
    pgd_pool_get_layout(pgd_cache_pool(pe_ctx_cache(probe)), &lay);
    pe_ctx_destroy(probe);
    uint8_t *a = malloc(N_TOK / PT * lay.page_bytes), *b = malloc(N_TOK / PT * lay.page_bytes);
    float *l = malloc(V * sizeof *l);
    int same = a && b && l && run(PGD_KV_F32, toks, N_TOK, a, l) == 0 &&
               run(PGD_KV_F32, toks, 5, b, l) == 0 && memcmp(a, b, lay.layer_stride) == 0;
    free(a);
    free(b);
    free(l);
    return same;
}

int main(int argc, char **argv)
{
    char path[4096], err[256];
    const char *mp = argc > 1                                              ? argv[1]
                     : t_model_file(path, sizeof path, "stories260K.gguf") ? path
                                                                           : NULL;
    if (!mp) T_SKIP("stories260K.gguf not found");
    if (pe_model_load(mp, NULL, NULL, &g_model, err, sizeof err)) {
        fprintf(stderr, "load %s: %s\n", mp, err);
        return 1;
    }
    const pe_isa best = pe_isa_detect();
    printf("     kernels: %s\n", pe_isa_name(pe_isa_force(PE_ISA_SCALAR)));
    T_RUN(test_prefill_decode_chunks);
    T_RUN(test_cold_vs_warm);
    if (best != PE_ISA_SCALAR) {
        printf("     kernels: %s\n", pe_isa_name(pe_isa_force(best)));
        printf("     default mode: the %s matmul is %sbatch-invariant\n", pe_isa_name(best),
               matmul_batch_invariant() ? "" : "not ");
        g_deterministic = 1;
        printf("     deterministic mode (pe_ctx_params.deterministic)\n");
        T_RUN(test_prefill_decode_chunks);
        T_RUN(test_cold_vs_warm);
    }
    pe_model_destroy(g_model);
    T_DONE();
}
