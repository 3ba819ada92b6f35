/* SPDX-License-Identifier: MIT */
/*
 * test_packed.c - Q8_0 weights packed at load (weights.c pack_weights, pe_mat_pack) change
 * no logit on AVX-512: the tiny Q8_0 llama of ../shared/models/reference (llama.cpp-quantized)
 * loaded with PGD_PACK=0 and with packing gives bit-identical logits for a prefill (every
 * token's logits, chunks of 37 and 5), 1- and 2-token decode chunks, and batched decode
 * steps of 8 sequences (the serving step: the small-N kernel) and of 3 (GEMV-sized products
 * mixed with prefill chunks), on 1 and 2 threads. On the AVX2 levels (the CPU's, or forced
 * after an AVX-512 load: they read the AVX-512 copy, the layout is one) the packed decode
 * products are pe_matmul_ref's bits (test_ops: test_matmul_packed) and the stored rows' GEMV
 * tiles round otherwise, so the logits agree within LOGIT_TOL and in their argmax. On a
 * CPU without x86 kernels nothing is packed (checked) and the comparison is exact.
 * Models: argv[1] alone, else reference/models/tiny-llama-q8_0/tiny-llama-q8_0.gguf in the
 * models directory (tests/proc.h), and with argv[1] the pagoda binary and argv[2] a scratch
 * directory also tiny q8_0 phi3 (fused tensors: views) and qwen2 (tied output) models that
 * pagoda synth-model writes; skipped (77) when there is none.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "ops.h"
#include "proc.h"
#include "t.h"

enum { N_SEQ = 8, PROMPT = 42, STEPS = 3 };

/* Logits of one scripted run on model m with n_threads: sequence 0's prompt in chunks of
 * 37 and 5 (all logits), then 2- and 1-token chunks, then STEPS batched steps of N_SEQ
 * sequences, one token each after their prompts (a batch of short prefills first), then
 * STEPS steps of 3 sequences with 1, 2 and 5 tokens. out: n_out() floats. */
static size_t n_out(uint32_t V)
{
    return (size_t)V * (PROMPT + 3 + N_SEQ * (1 + STEPS) + 3 * STEPS);
}

static int script(pe_model *m, uint32_t n_threads, float *out)
{
    const uint32_t V = pe_model_hparams(m)->n_vocab;
    pe_ctx_params p = pe_ctx_default_params();
    p.n_ctx = 256;
    p.n_batch = 64;
    p.n_threads = n_threads;
    p.kv_type = PGD_KV_F32;
    p.kv_tokens = 4096;
    char err[256];
    pe_ctx *c;
    if (pe_ctx_create(m, &p, &c, err, sizeof err)) T_FAIL("pe_ctx_create: %s", err);
    pgd_cache *cache = pe_ctx_cache(c);
    uint64_t seed = 7;
    int32_t toks[N_SEQ][PROMPT + 8];
    for (int s = 0; s < N_SEQ; s++) {
        toks[s][0] = 1;
        for (int i = 1; i < PROMPT + 8; i++)
            toks[s][i] = 3 + (int32_t)(t_rand(&seed) % (V - 3));
    }
    float *o = out;
    pgd_seq *seqs[N_SEQ];
    T_OK(pgd_seq_create(cache, NULL, 0, &seqs[0]));
    T_EQ(pe_forward(c, seqs[0], toks[0], 37, o, 1), 0);
    o += (size_t)37 * V;
    T_EQ(pe_forward(c, seqs[0], toks[0] + 37, 5, o, 1), 0);
    o += (size_t)5 * V;
    T_EQ(pe_forward(c, seqs[0], toks[0] + PROMPT, 2, o, 1), 0);
    o += (size_t)2 * V;
    T_EQ(pe_forward(c, seqs[0], toks[0] + PROMPT + 2, 1, o, 1), 0);
    o += V;
    pe_batch_item items[N_SEQ];
    for (int s = 1; s < N_SEQ; s++)
        T_OK(pgd_seq_create(cache, NULL, 0, &seqs[s]));
    /* prompts of 3 + s tokens for the others (sequence 0 gets one more token), then the
     * decode steps: N_SEQ tokens per product */
    for (int s = 0; s < N_SEQ; s++)
        items[s] = (pe_batch_item){seqs[s],
                                   s ? toks[s] : toks[0] + PROMPT + 3,
                                   s ? 3u + s : 1u,
                                   o + (size_t)s * V,
                                   0,
                                   NULL,
                                   0,
                                   NULL,
                                   0};
    T_EQ(pe_forward_batch(c, items, N_SEQ), 0);
    o += (size_t)N_SEQ * V;
    for (int k = 0; k < STEPS; k++) {
        for (int s = 0; s < N_SEQ; s++)
            items[s] = (pe_batch_item){seqs[s], s ? &toks[s][3 + s + k] : &toks[0][PROMPT + 4 + k],
                                       1,       o + (size_t)s * V,
                                       0,       NULL,
                                       0,       NULL,
                                       0};
        T_EQ(pe_forward_batch(c, items, N_SEQ), 0);
        o += (size_t)N_SEQ * V;
    }
    /* 3 sequences with 1, 2 and 5 tokens: 8-token products again, each sequence's last
     * logits */
    for (int k = 0; k < STEPS; k++) {
        static const uint32_t n[3] = {1, 2, 5};
        for (int s = 0; s < 3; s++)
            items[s] = (pe_batch_item){seqs[s + 1],
                                       &toks[s + 1][12 + 8 * k],
                                       n[s],
                                       o + (size_t)s * V,
                                       0,
                                       NULL,
                                       0,
                                       NULL,
                                       0};
        T_EQ(pe_forward_batch(c, items, 3), 0);
        o += (size_t)3 * V;
    }
    T_ASSERT((size_t)(o - out) == n_out(V));
    for (int s = 0; s < N_SEQ; s++)
        pgd_seq_destroy(cache, seqs[s]);
    pe_ctx_destroy(c);
    return 0;
}

static pe_model *load(const char *path, int pack)
{
    char err[256];
    pe_model *m = NULL;
    if (pack)
        unsetenv("PGD_PACK");
    else
        setenv("PGD_PACK", "0", 1);
    if (pe_model_load(path, NULL, NULL, &m, err, sizeof err)) {
        fprintf(stderr, "pe_model_load %s: %s\n", path, err);
        return NULL;
    }
    unsetenv("PGD_PACK");
    return m;
}

static int compare(const float *a, const float *b, size_t n, uint32_t V, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof *a))
            T_FAIL("%s: logit %zu (row %zu) packed %.9g != unpacked %.9g", what, i, i / V, b[i],
                   a[i]);
    return 0;
}

/* The AVX2 levels: packed decode products are pe_matmul_ref's bits, the stored rows' GEMV
 * tiles sum each row in 8 lanes, so the logits differ by rounding only: each within
 * LOGIT_TOL of the unpacked one, the argmax of each row the same where it is clear. */
#define LOGIT_TOL 1e-4
static int compare_close(const float *a, const float *b, size_t n, uint32_t V, const char *what)
{
    double worst = 0;
    for (size_t r = 0; r < n / V; r++) {
        size_t ia = 0, ib = 0;
        for (size_t i = r * V; i < (r + 1) * V; i++) {
            const double e = fabs((double)a[i] - b[i]);
            if (!(e <= LOGIT_TOL * (1 + fabs((double)a[i]))))
                T_FAIL("%s: logit %zu (row %zu) packed %.9g vs unpacked %.9g", what, i, r, b[i],
                       a[i]);
            if (e > worst) worst = e;
            if (a[i] > a[r * V + ia]) ia = i - r * V;
            if (b[i] > b[r * V + ib]) ib = i - r * V;
        }
        if (ia != ib && fabs((double)a[r * V + ia] - a[r * V + ib]) > 1e-2)
            T_FAIL("%s: row %zu argmax packed %zu, unpacked %zu", what, r, ib, ia);
    }
    printf("     %s: packed within %.3g of unpacked\n", what, worst);
    return 0;
}

static const char *g_path;

static int test_packed_equals_unpacked(void)
{
    pe_model *plain = load(g_path, 0), *packed = load(g_path, 1);
    T_ASSERT(plain && packed);
    T_EQ(pe_model_packed_bytes(plain), 0);
    const int x86 = pe_isa_active() != PE_ISA_SCALAR;
    if (x86)
        T_ASSERT(pe_model_packed_bytes(packed) > 0);
    else
        T_EQ(pe_model_packed_bytes(packed), 0);
    printf("     packed %llu bytes of %llu (%s)\n",
           (unsigned long long)pe_model_packed_bytes(packed),
           (unsigned long long)pe_model_weight_bytes(packed), pe_isa_name(pe_isa_active()));
    const uint32_t V = pe_model_hparams(plain)->n_vocab;
    const size_t n = n_out(V);
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    T_ASSERT(a && b);
    const int exact = pe_isa_active() == PE_ISA_AVX512 || !x86;
    for (uint32_t th = 1; th <= 2; th++) {
        T_EQ(script(plain, th, a), 0);
        T_EQ(script(packed, th, b), 0);
        if (exact)
            T_EQ(compare(a, b, n, V, th == 1 ? "1 thread" : "2 threads"), 0);
        else
            T_EQ(compare_close(a, b, n, V, th == 1 ? "1 thread" : "2 threads"), 0);
    }
    if (exact) printf("     packed == unpacked logits (%zu per run, 1 and 2 threads)\n", n);
    if (pe_isa_active() == PE_ISA_AVX512) {
        static const pe_isa lower[2] = {PE_ISA_AVX2_VNNI, PE_ISA_AVX2};
        for (int l = 0; l < 2; l++) {
            if (!pe_isa_has(lower[l])) continue;
            pe_isa_force(lower[l]);
            T_EQ(script(plain, 2, a), 0);
            T_EQ(script(packed, 2, b), 0);
            T_EQ(compare_close(a, b, n, V, pe_isa_name(lower[l])), 0);
        }
        pe_isa_force(pe_isa_detect());
        printf("     forced lower after packing: they read the avx512 copy\n");
    }
    free(a);
    free(b);
    pe_model_destroy(plain);
    pe_model_destroy(packed);
    return 0;
}

int main(int argc, char **argv)
{
    char buf[4096];
    int ran = 0;
    if (argc == 2) { /* a model given */
        g_path = argv[1];
        T_RUN(test_packed_equals_unpacked);
        T_DONE();
    }
    if (t_model_file(buf, sizeof buf, "reference/models/tiny-llama-q8_0/tiny-llama-q8_0.gguf")) {
        g_path = buf;
        T_RUN(test_packed_equals_unpacked);
        ran++;
    } else {
        fprintf(stderr, "tiny-llama-q8_0.gguf not found: its part is left out\n");
    }
    if (argc == 3) {
        /* synthetic q8_0 models (argv[1] the pagoda binary, argv[2] a scratch directory):
         * phi3, whose fused gate+up view w_up starts at row 172 (not a multiple of 16), and
         * qwen2, whose output is the tied token_embd */
        static const char *const archs[] = {"phi3", "qwen2"};
        if (t_scratch_dir(argv[2])) return 1;
        for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++) {
            char path[2048], args[4096], sout[4096], errbuf[4096];
            snprintf(path, sizeof path, "%s/%s-q8_0.gguf", argv[2], archs[i]);
            snprintf(args, sizeof args, "synth-model --arch %s --shape tiny --type q8_0 -o '%s'",
                     archs[i], path);
            if (t_run_bin(argv[1], argv[2], args, sout, sizeof sout, errbuf, sizeof errbuf)) {
                fprintf(stderr, "synth-model failed: %s\n", errbuf);
                return 1;
            }
            printf("     %s (pagoda synth-model --shape tiny --type q8_0)\n", archs[i]);
            g_path = path;
            T_RUN(test_packed_equals_unpacked);
            ran++;
        }
    }
    if (!ran) T_SKIP("no model: tiny-llama-q8_0.gguf not found and no pagoda binary given");
    T_DONE();
}
