/* SPDX-License-Identifier: MIT */
/*
 * test_quant_ref.c - the weight types of issue 15 (Q4_1 Q5_0 Q5_1 IQ4_NL Q2_K Q3_K Q4_K
 * Q5_K Q6_K) in engine/ops: dequantization, activation quantization and products.
 *
 *   dequant == ggml, bit for bit: ../shared/models/reference/dequant/dequant-ref.gguf holds
 *     one 256x512 tensor per type and dequant-ref-<type>.f32 ggml's f32 values of it (the
 *     reference set's README, "Dequantization reference"); $PGD_REFERENCE_DIR overrides the
 *     folder. Without it that part is skipped and the program exits 77 after the others.
 *   vec_dot: pe__vec_dot_ext_ref of random blocks equals sum_i w_i * a_i over the dequantized
 *     weights w and dequantized quantized activations a within 1e-4 * sum |w_i a_i| (Q4_1 and
 *     Q5_1: plus 2^-10 * |m * s| per block, s being d * sum(q) stored as f16).
 *   Q8_K: the activation quantizer gives |x - d q| <= |d| / 2 and bsums equal the sums.
 *   pe_matmul == pe_matmul_ref bit for bit for every type, ISA, thread count and n_tok.
 *   each AVX2 kernel == pe__vec_dot_ext_ref bit for bit, on random rows and on rows of
 *     extreme values (every weight byte 0x00 or 0xff, activations at +-127), several lengths.
 *   pe_matmul on AVX2 (its row x token tiles) == pe_matmul_ref bit for bit, n_tok 1..70.
 *   the AVX2 Q8_0/Q4_0 panels (plain AVX2 and AVX-VNNI, each forced) == pe_matmul_ref bit
 *     for bit, from 8 tokens on: K chunks, partial row groups, every micro-tile, raw blocks.
 *   the AVX2 K-quant panels (Q2_K..Q6_K, the same way) == pe_matmul_ref bit for bit.
 *   the AVX2 Q8_K and the AVX-512 Q8_K, Q8_0 and Q8_1 quantizers == the references byte
 *     for byte (zeros, ties, NaN, inf).
 *   the AVX-512 products (GEMV and repacked GEMM) == pe_matmul_ref bit for bit, on the same
 *     kinds of rows, n_tok 1..70, n_out 33 and 100, n_in 768 and 2304, 1 and 3 threads.
 *   the AVX-512 small-N products of Q8_0 and Q4_0 (a serving decode step) == pe_matmul_ref
 *     bit for bit, every n_tok from pe__gemm_min_tok to 40 (and the largest, PE_SMALL_N_TOK),
 *     on the same kinds of rows and shapes.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "ops.h"
#include "ops_int.h"
#include "t.h"
#include "threadpool.h"

static uint64_t seed = 0x243f6a8885a308d3ULL;

static float frand(void) /* uniform in [-1, 1) */
{
    return (float)((double)(t_rand(&seed) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

static const uint32_t ext_types[] = {
    PE_GGML_TYPE_Q2_K, PE_GGML_TYPE_Q3_K, PE_GGML_TYPE_Q4_K, PE_GGML_TYPE_Q5_K,   PE_GGML_TYPE_Q6_K,
    PE_GGML_TYPE_Q4_1, PE_GGML_TYPE_Q5_0, PE_GGML_TYPE_Q5_1, PE_GGML_TYPE_IQ4_NL,
};
enum { N_EXT = sizeof ext_types / sizeof ext_types[0] };

static const char *ref_dir(char *buf, size_t len)
{
    const char *env = getenv("PGD_REFERENCE_DIR");
    if (env && env[0]) return env;
    snprintf(buf, len, "%s/../shared/models/reference", PGD_SOURCE_DIR);
    return buf;
}

static int read_file(const char *path, void *dst, size_t n)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) return -1;
    size_t got = fread(dst, 1, n, fp);
    int extra = fgetc(fp) != EOF;
    fclose(fp);
    return got == n && !extra ? 0 : -1;
}

static int have_reference;

static int test_dequant_matches_ggml(void)
{
    char buf[4096], path[4200], err[256];
    const char *dir = ref_dir(buf, sizeof buf);
    snprintf(path, sizeof path, "%s/dequant/dequant-ref.gguf", dir);
    pe_gguf_file *f = NULL;
    if (pe_gguf_open(path, &f, err, sizeof err) != 0) {
        fprintf(stderr, "skipped: %s: %s (set PGD_REFERENCE_DIR)\n", path, err);
        return 0;
    }
    have_reference = 1;
    const size_t n = 256 * 512;
    float *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
    T_ASSERT(want && got);
    for (int i = 0; i < N_EXT; i++) {
        const char *name = pe_ggml_type_name(ext_types[i]);
        char lower[16], tname[32];
        size_t k = 0;
        for (; name[k] && k + 1 < sizeof lower; k++)
            lower[k] = (char)(name[k] >= 'A' && name[k] <= 'Z' ? name[k] + 32 : name[k]);
        lower[k] = 0;
        snprintf(tname, sizeof tname, "ref.%s", lower);
        const pe_gguf_tensor *t = pe_gguf_find_tensor(f, tname);
        T_ASSERT(t != NULL);
        T_EQ(t->type, ext_types[i]);
        T_EQ(t->ne[0], 256);
        T_EQ(t->ne[1], 512);
        snprintf(path, sizeof path, "%s/dequant/dequant-ref-%s.f32", dir, lower);
        T_OK(read_file(path, want, n * sizeof *want));
        const uint64_t rb = pe_ggml_row_size(t->type, 256);
        for (size_t r = 0; r < 512; r++)
            pe_dequant_row(t->type, (const uint8_t *)t->data + r * rb, got + r * 256, 256);
        size_t bad = 0, first = 0;
        for (size_t j = 0; j < n; j++) {
            if (memcmp(&want[j], &got[j], sizeof(float)) != 0 && bad++ == 0) first = j;
        }
        if (bad)
            T_FAIL("%s: %zu of %zu values differ, first at %zu: %.9g vs ggml %.9g", lower, bad, n,
                   first, got[first], want[first]);
        printf("     %-6s %zu values bit-identical to ggml\n", lower, n);
    }
    free(want);
    free(got);
    pe_gguf_close(f);
    return 0;
}

/* Every f16 scale (and min) field of the blocks of row set to a finite value of either
 * sign. */
static void random_scales(uint32_t type, uint8_t *row, size_t n)
{
    const pe_ggml_type_traits *tr = pe_ggml_get_traits(type);
    const size_t nb = n / tr->blck_size, bs = tr->type_size;
    for (size_t b = 0; b < nb; b++) {
        uint8_t *blk = row + b * bs;
        size_t off[2] = {0, 0}, n_f16 = 1;
        switch (type) {
        case PE_GGML_TYPE_Q2_K:
            off[0] = offsetof(block_q2_K, d), off[1] = offsetof(block_q2_K, dmin), n_f16 = 2;
            break;
        case PE_GGML_TYPE_Q3_K:
            off[0] = offsetof(block_q3_K, d);
            break;
        case PE_GGML_TYPE_Q6_K:
            off[0] = offsetof(block_q6_K, d);
            break;
        case PE_GGML_TYPE_Q4_K: /* d, dmin lead Q4_K, Q5_K, and d, m Q4_1, Q5_1 */
        case PE_GGML_TYPE_Q5_K:
        case PE_GGML_TYPE_Q4_1:
        case PE_GGML_TYPE_Q5_1:
            off[1] = 2, n_f16 = 2;
            break;
        default: /* Q5_0, IQ4_NL: d leads */
            break;
        }
        for (size_t k = 0; k < n_f16; k++) {
            uint16_t h = pe_f32_to_f16(frand() * 0.05f);
            memcpy(blk + off[k], &h, 2);
        }
    }
}

/* n values of random blocks of type: random bytes, and random_scales. */
static void random_row(uint32_t type, uint8_t *row, size_t n)
{
    const pe_ggml_type_traits *tr = pe_ggml_get_traits(type);
    for (size_t i = 0; i < n / tr->blck_size * tr->type_size; i++)
        row[i] = (uint8_t)t_rand(&seed);
    random_scales(type, row, n);
}

/* The activations as the products see them, dequantized. */
static void dequant_act(uint32_t type, const void *xq, float *a, size_t n, float *mterm_bound,
                        const uint8_t *w)
{
    *mterm_bound = 0.0f;
    switch (pe__vec_dot_type(type)) {
    case PE_GGML_TYPE_Q8_K: {
        const block_q8_K *x = xq;
        for (size_t i = 0; i < n; i++)
            a[i] = x[i / QK_K].d * (float)x[i / QK_K].qs[i % QK_K];
        break;
    }
    case PE_GGML_TYPE_Q8_0:
        pe_dequant_row(PE_GGML_TYPE_Q8_0, xq, a, n);
        break;
    default: {
        const block_q8_1 *x = xq;
        const size_t bs = pe_ggml_get_traits(type)->type_size;
        for (size_t i = 0; i < n; i++)
            a[i] = pe_f16_to_f32(x[i / 32].d) * (float)x[i / 32].qs[i % 32];
        for (size_t b = 0; b < n / 32; b++) {
            uint16_t m;
            memcpy(&m, w + b * bs + 2, 2);
            *mterm_bound += fabsf(pe_f16_to_f32(m) * pe_f16_to_f32(x[b].s)) / 1024.0f;
        }
    }
    }
}

static int test_vec_dot_matches_dequantized(void)
{
    enum { N = 1024 };
    uint8_t row[N * 2];
    uint8_t xq[N * 2];
    float x[N], w[N], a[N];
    for (int i = 0; i < N_EXT; i++) {
        const uint32_t type = ext_types[i];
        for (int rep = 0; rep < 50; rep++) {
            random_row(type, row, N);
            const float scale = powf(10.0f, 3.0f * frand());
            for (int j = 0; j < N; j++)
                x[j] = frand() * scale * (rep % 5 == 0 && j % 97 == 0 ? 30.0f : 1.0f);
            if (rep == 1) memset(x, 0, sizeof x);
            pe__quant_act_ref(type, x, xq, N);
            pe_dequant_row(type, row, w, N);
            float mb;
            dequant_act(type, xq, a, N, &mb, row);
            double want = 0.0, mag = 0.0;
            for (int j = 0; j < N; j++) {
                want += (double)w[j] * a[j];
                mag += fabs((double)w[j] * a[j]);
            }
            const float got = pe__vec_dot_ext_ref(type, row, xq, N);
            if (fabs(got - want) > 1e-4 * mag + mb + 1e-30)
                T_FAIL("%s rep %d: vec_dot %.9g, dequantized %.9g (sum |w a| %.3g)",
                       pe_ggml_type_name(type), rep, got, want, mag);
        }
    }
    return 0;
}

static int test_q8_k_quantizer(void)
{
    float x[2 * QK_K];
    block_q8_K y[2];
    for (int rep = 0; rep < 100; rep++) {
        const float scale = powf(10.0f, 4.0f * frand());
        for (int j = 0; j < 2 * QK_K; j++)
            x[j] = frand() * scale;
        if (rep == 0) memset(x, 0, QK_K * sizeof(float));
        pe__quant_q8_k_ref(x, y, 2 * QK_K);
        for (int b = 0; b < 2; b++) {
            for (int j = 0; j < QK_K; j++) {
                const float v = x[b * QK_K + j], r = y[b].d * (float)y[b].qs[j];
                T_ASSERT(fabsf(v - r) <= fabsf(y[b].d) * 0.5001f + 1e-30f);
            }
            for (int k = 0; k < 16; k++) {
                int s = 0;
                for (int j = 0; j < 16; j++)
                    s += y[b].qs[k * 16 + j];
                T_EQ(y[b].bsums[k], s);
            }
        }
    }
    /* Ties round to even, as ggml's nearest_int: max 127 gives iscale -1, 2.5 -> -2. */
    for (int j = 0; j < QK_K; j++)
        x[j] = 0.0f;
    x[0] = 127.0f, x[1] = 2.5f, x[2] = 3.5f, x[3] = -127.0f;
    pe__quant_q8_k_ref(x, y, QK_K);
    T_EQ(y[0].qs[0], -127);
    T_EQ(y[0].qs[1], -2);
    T_EQ(y[0].qs[2], -4);
    T_EQ(y[0].qs[3], 127);
    T_ASSERT(y[0].d == -1.0f);
    return 0;
}

static int test_matmul_matches_reference(void)
{
    const uint32_t n_in = 512, n_out = 70;
    const uint32_t toks[] = {1, 3, 17};
    const uint32_t threads[] = {1, 3};
    uint8_t *wdata = malloc((size_t)n_out * 512 * 2);
    float *x = malloc((size_t)17 * n_in * sizeof *x);
    float *y = malloc((size_t)17 * n_out * sizeof *y),
          *yr = malloc((size_t)17 * n_out * sizeof *yr);
    T_ASSERT(wdata && x && y && yr);
    for (size_t j = 0; j < (size_t)17 * n_in; j++)
        x[j] = frand() * (j % 61 == 0 ? 8.0f : 1.0f);
    for (int i = 0; i < N_EXT; i++) {
        pe_mat w = {ext_types[i], n_in, n_out, wdata, pe_ggml_row_size(ext_types[i], n_in), NULL};
        for (uint32_t r = 0; r < n_out; r++)
            random_row(w.type, wdata + r * w.row_bytes, n_in);
        for (int isa = PE_ISA_SCALAR; isa <= (int)pe_isa_detect(); isa++) {
            pe_isa_force((pe_isa)isa);
            for (size_t ti = 0; ti < sizeof threads / sizeof threads[0]; ti++) {
                pe_threadpool *tp = pe_tp_create(threads[ti]);
                T_ASSERT(tp != NULL);
                for (size_t k = 0; k < sizeof toks / sizeof toks[0]; k++) {
                    void *scratch = malloc(pe_matmul_scratch_bytes(&w, toks[k]));
                    T_ASSERT(scratch != NULL);
                    pe_matmul_ref(&w, x, toks[k], yr);
                    pe_matmul_ex(tp, &w, x, toks[k], y, scratch, k == 2 ? PE_MM_INVARIANT : 0);
                    if (memcmp(y, yr, (size_t)toks[k] * n_out * sizeof *y) != 0)
                        T_FAIL("%s isa %s threads %u n_tok %u: pe_matmul != pe_matmul_ref",
                               pe_ggml_type_name(w.type), pe_isa_name((pe_isa)isa), threads[ti],
                               toks[k]);
                    free(scratch);
                }
                pe_tp_destroy(tp);
            }
        }
        pe_isa_force(pe_isa_detect());
    }
    free(wdata);
    free(x);
    free(y);
    free(yr);
    return 0;
}

#if defined(__x86_64__) || defined(__i386__)
typedef float (*dot_fn)(const void *w, const void *xq, size_t n);

static int test_avx2_dots_match_reference(void)
{
    static const struct {
        uint32_t type;
        dot_fn dot;
    } k[] = {
        {PE_GGML_TYPE_Q4_K, pe__vec_dot_q4_k_avx2},     {PE_GGML_TYPE_Q5_K, pe__vec_dot_q5_k_avx2},
        {PE_GGML_TYPE_Q6_K, pe__vec_dot_q6_k_avx2},     {PE_GGML_TYPE_Q4_1, pe__vec_dot_q4_1_avx2},
        {PE_GGML_TYPE_Q5_0, pe__vec_dot_q5_0_avx2},     {PE_GGML_TYPE_Q5_1, pe__vec_dot_q5_1_avx2},
        {PE_GGML_TYPE_IQ4_NL, pe__vec_dot_iq4_nl_avx2}, {PE_GGML_TYPE_Q3_K, pe__vec_dot_q3_k_avx2},
        {PE_GGML_TYPE_Q2_K, pe__vec_dot_q2_k_avx2},
    };
    if (pe_isa_detect() < PE_ISA_AVX2) {
        printf("     no AVX2 on this CPU: its kernels not run\n");
        return 0;
    }
    /* 32-value types: 1, 7, 65 blocks (tails of the 8-block groups); K-quants: 1 to 16 */
    const size_t lens[] = {32, 224, 256, 512, 2080, 2304, 4096};
    const size_t nmax = 4096;
    uint8_t *w = malloc(pe_ggml_row_size(PE_GGML_TYPE_Q8_0, nmax) * 2);
    float *x = malloc(nmax * sizeof *x);
    void *xq = malloc(nmax * 2);
    T_ASSERT(w && x && xq);
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        const pe_ggml_type_traits *tr = pe_ggml_get_traits(k[i].type);
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            const size_t n = lens[li];
            if (n % tr->blck_size != 0) continue;
            for (int pat = 0; pat < 6; pat++) {
                random_row(k[i].type, w, n);
                if (pat >= 2) { /* every byte 0x00 or 0xff but the f16 scales */
                    memset(w, (pat & 1) ? 0xff : 0x00, n / tr->blck_size * tr->type_size);
                    random_scales(k[i].type, w, n);
                }
                for (size_t j = 0; j < n; j++)
                    x[j] = pat < 4 ? frand() * (j % 61 == 0 ? 8.0f : 1.0f)
                                   : ((j * 7 + (size_t)pat) % 3 == 0 ? -1.0f : 1.0f);
                pe__quant_act_ref(k[i].type, x, xq, n);
                const float want = pe__vec_dot_ext_ref(k[i].type, w, xq, n);
                const float got = k[i].dot(w, xq, n);
                if (memcmp(&want, &got, sizeof want) != 0)
                    T_FAIL("%s n %zu pattern %d: avx2 %.9g != reference %.9g",
                           pe_ggml_type_name(k[i].type), n, pat, got, want);
            }
        }
        printf("     %-6s avx2 bit-identical to the reference\n", pe_ggml_type_name(k[i].type));
    }
    free(w);
    free(x);
    free(xq);
    return 0;
}

/* The AVX2 tiles (pe__ext_rows_avx2: rows x tokens, wide tiles for few tokens, the last
 * rows and tokens of a chunk alone) == pe_matmul_ref bit for bit: every tile shape (1x1 to
 * 1x8, 8x1, 4x2, 2x3, 2x4: n_out 33 and 100 leave 1 and 4 rows in the last chunk), on
 * random rows, rows of 0x00 or 0xff bytes (f16 scales random) and activations at +-127. */
static int test_avx2_tiles_match_reference(void)
{
    if (pe_isa_detect() < PE_ISA_AVX2) {
        printf("     no AVX2 on this CPU: its tiles not run\n");
        return 0;
    }
    const uint32_t n_in = 512, outs[] = {33, 100}, toks[] = {1, 2, 3, 4, 5, 7, 64, 70};
    const uint32_t max_tok = 70, max_out = 100;
    uint8_t *wd = malloc((size_t)max_out * 512 * 2);
    float *x = malloc((size_t)max_tok * n_in * sizeof *x);
    float *y = malloc((size_t)max_tok * max_out * sizeof *y),
          *yr = malloc((size_t)max_tok * max_out * sizeof *yr);
    pe_threadpool *tp[2] = {pe_tp_create(1), pe_tp_create(3)};
    T_ASSERT(wd && x && y && yr && tp[0] && tp[1]);
    pe_isa_force(PE_ISA_AVX2);
    for (int i = 0; i < N_EXT; i++) {
        const uint32_t type = ext_types[i];
        const pe_ggml_type_traits *tr = pe_ggml_get_traits(type);
        for (size_t oi = 0; oi < sizeof outs / sizeof outs[0]; oi++) {
            pe_mat w = {type, n_in, outs[oi], wd, pe_ggml_row_size(type, n_in), NULL};
            for (int pat = 0; pat < 4; pat++) { /* random, 0x00, 0xff, 0xff at +-127 */
                for (uint32_t r = 0; r < w.n_out; r++) {
                    uint8_t *row = wd + r * w.row_bytes;
                    random_row(type, row, n_in);
                    if (pat > 0) {
                        memset(row, pat == 1 ? 0x00 : 0xff, n_in / tr->blck_size * tr->type_size);
                        random_scales(type, row, n_in);
                    }
                }
                for (size_t j = 0; j < (size_t)max_tok * n_in; j++)
                    x[j] = pat < 3 ? frand() * (j % 61 == 0 ? 8.0f : 1.0f)
                                   : (j * 7 % 3 ? 1.0f : -1.0f);
                for (size_t k = 0; k < sizeof toks / sizeof toks[0]; k++) {
                    void *scratch = malloc(pe_matmul_scratch_bytes(&w, toks[k]));
                    T_ASSERT(scratch != NULL);
                    pe_matmul_ref(&w, x, toks[k], yr);
                    for (int ti = 0; ti < 2; ti++) {
                        memset(y, 0xff, (size_t)toks[k] * w.n_out * sizeof *y);
                        pe_matmul(tp[ti], &w, x, toks[k], y, scratch);
                        if (memcmp(y, yr, (size_t)toks[k] * w.n_out * sizeof *y) != 0)
                            T_FAIL("%s n_out %u pattern %d threads %d n_tok %u: avx2 tiles != "
                                   "pe_matmul_ref",
                                   pe_ggml_type_name(type), w.n_out, pat, ti ? 3 : 1, toks[k]);
                    }
                    free(scratch);
                }
            }
        }
        printf("     %-6s avx2 tiles bit-identical to the reference\n", pe_ggml_type_name(type));
    }
    pe_isa_force(pe_isa_detect());
    pe_tp_destroy(tp[0]);
    pe_tp_destroy(tp[1]);
    free(wd);
    free(x);
    free(y);
    free(yr);
    return 0;
}

/* pe_matmul with the AVX2 panels of types, plain AVX2 (maddubs) and AVX-VNNI (vpdpbusd)
 * each forced, == pe_matmul_ref bit for bit: n_in ins[0] and ins[1], n_out 7, 16, 33 and
 * 100 (partial groups and panels, 1 and 4 rows in the last 32-row claim), n_tok toks
 * (ascending; those above 16 on random rows only, those above 300 at ins[1] only), 1 and
 * threads2 threads; random rows, rows of raw bytes 0x00, 0xff (the largest values and
 * scales), 0x80 (q8 -128, Q6_K scale -128) or random (f16 scales random); activations
 * random, all +127 (with 0xff rows: the largest sums) or at +-127. */
static int check_avx2_panels(const uint32_t *types, size_t n_types, const uint32_t ins[2],
                             const uint32_t *toks, size_t n_toks, uint32_t threads2)
{
    static const pe_isa isas[] = {PE_ISA_AVX2, PE_ISA_AVX2_VNNI};
    static const uint8_t fill[6] = {0, 0x00, 0xff, 0xff, 0x80, 0};
    const uint32_t outs[] = {7, 16, 33, 100};
    const uint32_t max_tok = toks[n_toks - 1], max_out = 100, max_in = ins[1];
    if (pe_isa_detect() < PE_ISA_AVX2) {
        printf("     no AVX2 on this CPU: its panels not run\n");
        return 0;
    }
    size_t row_max = 0;
    for (size_t ti = 0; ti < n_types; ti++)
        if (pe_ggml_row_size(types[ti], max_in) > row_max)
            row_max = pe_ggml_row_size(types[ti], max_in);
    uint8_t *wd = malloc((size_t)max_out * row_max);
    float *x = malloc((size_t)max_tok * max_in * sizeof *x);
    float *y = malloc((size_t)max_tok * max_out * sizeof *y),
          *yr = malloc((size_t)max_tok * max_out * sizeof *yr);
    pe_threadpool *tp[2] = {pe_tp_create(1), pe_tp_create(threads2)};
    T_ASSERT(wd && x && y && yr && tp[0] && tp[1]);
    for (size_t ii = 0; ii < sizeof isas / sizeof isas[0]; ii++) {
        if (!pe_isa_has(isas[ii])) {
            printf("     no %s on this CPU: its panels not run\n", pe_isa_name(isas[ii]));
            continue;
        }
        T_EQ(pe_isa_force(isas[ii]), isas[ii]);
        for (size_t ti = 0; ti < n_types; ti++) {
            const uint32_t type = types[ti];
            const pe_ggml_type_traits *tr = pe_ggml_get_traits(type);
            for (size_t ni = 0; ni < 2; ni++) {
                for (size_t oi = 0; oi < sizeof outs / sizeof outs[0]; oi++) {
                    const uint32_t n_in = ins[ni];
                    pe_mat w = {type, n_in, outs[oi], wd, pe_ggml_row_size(type, n_in), NULL};
                    /* random; 0x00; 0xff; 0xff at +127; 0x80; random bytes at +-127 */
                    for (int pat = 0; pat < 6; pat++) {
                        if (ni == 1 && pat != 0 && pat != 3 && pat != 5) continue;
                        for (uint32_t r = 0; r < w.n_out; r++) {
                            uint8_t *row = wd + r * w.row_bytes;
                            random_row(type, row, n_in);
                            if (pat > 0 && pat < 5) {
                                memset(row, fill[pat], n_in / tr->blck_size * tr->type_size);
                                random_scales(type, row, n_in);
                            }
                        }
                        for (size_t j = 0; j < (size_t)max_tok * n_in; j++)
                            x[j] = pat == 3   ? 1.0f
                                   : pat == 5 ? (j * 7 % 3 ? 1.0f : -1.0f)
                                              : frand() * (j % 61 == 0 ? 8.0f : 1.0f);
                        for (size_t k = 0; k < n_toks; k++) {
                            if (toks[k] > 16 && (pat != 0 || oi == 1)) continue;
                            if (toks[k] > 300 && ni == 0) continue;
                            void *scratch = malloc(pe_matmul_scratch_bytes(&w, toks[k]));
                            T_ASSERT(scratch != NULL);
                            pe_matmul_ref(&w, x, toks[k], yr);
                            for (int th = 0; th < 2; th++) {
                                memset(y, 0xff, (size_t)toks[k] * w.n_out * sizeof *y);
                                pe_matmul(tp[th], &w, x, toks[k], y, scratch);
                                if (memcmp(y, yr, (size_t)toks[k] * w.n_out * sizeof *y) != 0)
                                    T_FAIL("%s %s n_in %u n_out %u pattern %d threads %u n_tok "
                                           "%u: panels != pe_matmul_ref",
                                           pe_isa_name(isas[ii]), pe_ggml_type_name(type), n_in,
                                           w.n_out, pat, th ? threads2 : 1, toks[k]);
                            }
                            free(scratch);
                        }
                    }
                }
            }
            printf("     %-6s %s panels bit-identical to the reference\n", pe_ggml_type_name(type),
                   pe_isa_name(isas[ii]));
        }
    }
    pe_isa_force(pe_isa_detect());
    pe_tp_destroy(tp[0]);
    pe_tp_destroy(tp[1]);
    free(wd);
    free(x);
    free(y);
    free(yr);
    return 0;
}

/* The Q8_0/Q4_0 panels (from pe__gemm_min_tok() tokens: 16-row panels, K chunks of 32
 * blocks, micro-tiles of 1..4 tokens): n_in 1056 (a K chunk and 1 block) and 2048, n_tok
 * 8..13, 16, 37 and 264 (two token tasks, the second of 8), 1 and 3 threads. */
static int test_avx2_panels_match_reference(void)
{
    static const uint32_t types[] = {PE_GGML_TYPE_Q8_0, PE_GGML_TYPE_Q4_0};
    static const uint32_t ins[2] = {1056, 2048}, toks[] = {8, 9, 10, 11, 12, 13, 16, 37, 264};
    return check_avx2_panels(types, 2, ins, toks, sizeof toks / sizeof toks[0], 3);
}

/* The K-quant panels (from KP_MIN_TOK = 12 tokens, the tiles below: 16-row panels, K
 * chunks of 2 super-blocks, chunks of 256 tokens, micro-tiles of 1..4 tokens): n_in 768 (a
 * K chunk and 1 super-block) and 2048, n_tok 8..16, 37, 257, 258, 261 (a token chunk and a
 * tail of 1, 2 or 3 + 2) and 600, 1 and 2 threads. Q6_K or Q5_K int16 runs one chunk too
 * long fail the 0xff rows at +127. */
static int test_avx2_kpanels_match_reference(void)
{
    static const uint32_t types[] = {PE_GGML_TYPE_Q4_K, PE_GGML_TYPE_Q6_K, PE_GGML_TYPE_Q5_K,
                                     PE_GGML_TYPE_Q3_K, PE_GGML_TYPE_Q2_K};
    static const uint32_t ins[2] = {768, 2048};
    static const uint32_t toks[] = {8, 9, 10, 11, 12, 13, 14, 15, 16, 37, 257, 258, 261, 600};
    return check_avx2_panels(types, sizeof types / sizeof types[0], ins, toks,
                             sizeof toks / sizeof toks[0], 2);
}

/* pe__quant_q8_k_avx2 and pe__quant_q8_k_avx512 == pe__quant_q8_k_ref and
 * pe__quant_q8_0_avx512 == pe__quant_q8_0_ref / pe__quant_q8_1_ref byte for byte (and its
 * block sums exact): random blocks over 8 decades, all-zero blocks, ties of the rounding,
 * repeated maxima of either sign, subnormals, NaN and inf. */
static int test_x86_quantizers(void)
{
    if (pe_isa_detect() < PE_ISA_AVX2) {
        printf("     no AVX2 on this CPU: its quantizers not run\n");
        return 0;
    }
    const int avx512 = pe_isa_detect() >= PE_ISA_AVX512;
    if (!avx512) printf("     no AVX-512 on this CPU: its quantizers not run\n");
    enum { NB = 4 };
    float x[NB * QK_K];
    block_q8_K want[NB], got[NB];
    for (int rep = 0; rep < 400; rep++) {
        const float scale = powf(10.0f, 8.0f * frand() - 4.0f);
        for (int j = 0; j < NB * QK_K; j++)
            x[j] = frand() * scale;
        const int b = rep % NB, j0 = (int)(t_rand(&seed) % QK_K);
        switch (rep % 8) {
        case 1: /* zeros */
            memset(x + b * QK_K, 0, QK_K * sizeof(float));
            break;
        case 2: /* ties: integers and halves against a max of 127 */
            for (int j = 0; j < QK_K; j++)
                x[b * QK_K + j] = (float)((int)(t_rand(&seed) % 255) - 127) * 0.5f;
            x[b * QK_K + j0] = rep & 8 ? 127.0f : -127.0f;
            break;
        case 3: /* the largest |x| twice, opposite signs: the first one wins */
            x[b * QK_K + j0] = 2.0f * scale;
            x[b * QK_K + (j0 + 77) % QK_K] = -2.0f * scale;
            break;
        case 4:
            x[b * QK_K + j0] = NAN;
            break;
        case 5:
            x[b * QK_K + j0] = rep & 8 ? INFINITY : -INFINITY;
            break;
        case 6: /* subnormals */
            for (int j = 0; j < QK_K; j++)
                x[b * QK_K + j] = frand() * 1e-39f;
            break;
        default:
            break;
        }
        memset(want, 0xa5, sizeof want);
        memset(got, 0xa5, sizeof got);
        pe__quant_q8_k_ref(x, want, NB * QK_K);
        pe__quant_q8_k_avx2(x, got, NB * QK_K);
        if (memcmp(want, got, sizeof want) != 0)
            T_FAIL("rep %d (case %d): avx2 Q8_K blocks differ from the reference", rep, rep % 8);
        if (!avx512) continue;
        memset(got, 0xa5, sizeof got);
        pe__quant_q8_k_avx512(x, got, NB * QK_K);
        if (memcmp(want, got, sizeof want) != 0)
            T_FAIL("rep %d (case %d): avx512 Q8_K blocks differ from the reference", rep, rep % 8);
        /* Q8_0 and Q8_1 (30 blocks: a tail of the 16-block groups), with the block sums */
        enum { N32 = NB * QK_K - 64 };
        block_q8_1 w1[N32 / 32], g1[N32 / 32];
        block_q8_0 w0[N32 / 32], g0[N32 / 32];
        int32_t sums[N32 / 32];
        memset(g0, 0xa5, sizeof g0);
        memset(g1, 0xa5, sizeof g1);
        pe__quant_q8_0_ref(x, w0, N32);
        pe__quant_q8_1_ref(x, w1, N32);
        pe__quant_q8_0_avx512(x, g0, N32, 0, sums);
        if (memcmp(w0, g0, sizeof w0) != 0)
            T_FAIL("rep %d (case %d): avx512 Q8_0 blocks differ from the reference", rep, rep % 8);
        for (int i = 0; i < N32 / 32; i++) {
            int s = 0;
            for (int j = 0; j < 32; j++)
                s += w0[i].qs[j];
            T_EQ(sums[i], s);
        }
        pe__quant_q8_0_avx512(x, g1, N32, 1, NULL);
        if (memcmp(w1, g1, sizeof w1) != 0)
            T_FAIL("rep %d (case %d): avx512 Q8_1 blocks differ from the reference", rep, rep % 8);
    }
    return 0;
}

/* The AVX-512 products (ops_avx512.c: GEMV below pe__ext_gemm_min_tok tokens, repacked
 * panels from it on) == pe_matmul_ref bit for bit: every type, n_tok across both paths and
 * the micro-tile tails, n_out not a multiple of the 32-row panels, n_in not a multiple of
 * the panel depth, 1 and 3 threads, random weights and every byte 0x00 or 0xff (valid f16
 * scales), random and +-1 activations. */
static int test_avx512_products_match_reference(void)
{
    if (pe_isa_detect() < PE_ISA_AVX512) {
        printf("     no AVX-512 on this CPU: its kernels not run\n");
        return 0;
    }
    const uint32_t toks[] = {1, 2, 3, 7, 64, 70}, outs[] = {33, 100}, ins[] = {768, 2304};
    const uint32_t threads[] = {1, 3};
    enum { MAX_TOK = 70, MAX_OUT = 100, MAX_IN = 2304 };
    uint8_t *wdata = malloc((size_t)MAX_OUT * MAX_IN * 2);
    float *x = malloc((size_t)MAX_TOK * MAX_IN * sizeof *x);
    float *y = malloc((size_t)MAX_TOK * MAX_OUT * sizeof *y);
    float *yr = malloc((size_t)MAX_TOK * MAX_OUT * sizeof *yr);
    size_t scratch_bytes = 0;
    for (int i = 0; i < N_EXT; i++) {
        const pe_mat wm = {ext_types[i], MAX_IN, MAX_OUT, NULL, 0, NULL};
        const size_t b = pe_matmul_scratch_bytes(&wm, MAX_TOK);
        scratch_bytes = b > scratch_bytes ? b : scratch_bytes;
    }
    void *scratch = malloc(scratch_bytes);
    pe_threadpool *tp[2] = {pe_tp_create(threads[0]), pe_tp_create(threads[1])};
    T_ASSERT(wdata && x && y && yr && scratch && tp[0] && tp[1]);
    for (int i = 0; i < N_EXT; i++) {
        const uint32_t type = ext_types[i];
        for (size_t ii = 0; ii < sizeof ins / sizeof ins[0]; ii++) {
            const uint32_t n_in = ins[ii];
            for (size_t oi = 0; oi < sizeof outs / sizeof outs[0]; oi++) {
                const uint32_t n_out = outs[oi];
                for (int pat = 0; pat < 4; pat++) {
                    pe_mat w = {type, n_in, n_out, wdata, pe_ggml_row_size(type, n_in), NULL};
                    for (uint32_t r = 0; r < n_out; r++) {
                        uint8_t *row = wdata + r * w.row_bytes;
                        random_row(type, row, n_in);
                        if (pat == 1 || pat == 2) { /* every byte 0x00 or 0xff, valid scales */
                            memset(row, pat == 2 ? 0xff : 0x00, w.row_bytes);
                            random_scales(type, row, n_in);
                        }
                    }
                    for (size_t j = 0; j < (size_t)MAX_TOK * n_in; j++)
                        x[j] = pat < 3 ? frand() * (j % 61 == 0 ? 8.0f : 1.0f)
                                       : ((j * 7) % 3 == 0 ? -1.0f : 1.0f);
                    pe_isa_force(PE_ISA_SCALAR);
                    pe_matmul_ref(&w, x, MAX_TOK, yr);
                    pe_isa_force(PE_ISA_AVX512);
                    for (size_t ti = 0; ti < 2; ti++) {
                        for (size_t k = 0; k < sizeof toks / sizeof toks[0]; k++) {
                            pe_matmul_ex(tp[ti], &w, x, toks[k], y, scratch,
                                         k % 2 ? PE_MM_INVARIANT : 0);
                            const size_t n = (size_t)toks[k] * n_out;
                            for (size_t e = 0; e < n; e++) {
                                if (memcmp(&y[e], &yr[e], sizeof *y) == 0) continue;
                                T_FAIL("%s n_in %u n_out %u pattern %d threads %u n_tok %u: "
                                       "y[%zu][%zu] avx512 %.9g != reference %.9g",
                                       pe_ggml_type_name(type), n_in, n_out, pat, threads[ti],
                                       toks[k], e / n_out, e % n_out, y[e], yr[e]);
                            }
                        }
                    }
                }
            }
        }
        printf("     %-6s avx512 GEMV and GEMM bit-identical to the reference\n",
               pe_ggml_type_name(type));
    }
    pe_isa_force(pe_isa_detect());
    pe_tp_destroy(tp[0]);
    pe_tp_destroy(tp[1]);
    free(wdata);
    free(x);
    free(y);
    free(yr);
    free(scratch);
    return 0;
}

/* The AVX-512 small-N path of Q8_0 and Q4_0 (ops_avx512.c q_small_n: from pe__gemm_min_tok
 * to PE_SMALL_N_TOK tokens) == pe_matmul_ref bit for bit: every n_tok up to 40 and the
 * last, the micro-tile splits (1-6 tokens) and their tails, strips of 32 rows cut by n_out
 * 33 and 100 and by the tasks of 1 and 3 threads, n_in of 24 blocks (one short panel) and
 * 72 (two full panels and a short one), random rows, every quant byte 0x00 or 0xff, and
 * +-1 activations (the largest integer dots). */
static int test_q_small_n_matches_ref(void)
{
    if (pe_isa_detect() < PE_ISA_AVX512) {
        printf("     no AVX-512 on this CPU: its kernels not run\n");
        return 0;
    }
    static const uint32_t types[] = {PE_GGML_TYPE_Q8_0, PE_GGML_TYPE_Q4_0};
    const uint32_t outs[] = {33, 100}, ins[] = {768, 2304}, threads[] = {1, 3};
    enum { MAX_TOK = PE_SMALL_N_TOK, MAX_OUT = 100, MAX_IN = 2304 };
    uint8_t *wdata = malloc((size_t)MAX_OUT * MAX_IN * 2);
    float *x = malloc((size_t)MAX_TOK * MAX_IN * sizeof *x);
    float *y = malloc((size_t)MAX_TOK * MAX_OUT * sizeof *y);
    float *yr = malloc((size_t)MAX_TOK * MAX_OUT * sizeof *yr);
    const pe_mat wmax = {PE_GGML_TYPE_Q8_0, MAX_IN, MAX_OUT, NULL, 0, NULL};
    void *scratch = malloc(pe_matmul_scratch_bytes(&wmax, MAX_TOK));
    pe_threadpool *tp[2] = {pe_tp_create(threads[0]), pe_tp_create(threads[1])};
    T_ASSERT(wdata && x && y && yr && scratch && tp[0] && tp[1]);
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        const uint32_t type = types[i];
        const uint32_t n_min = pe__gemm_min_tok(&pe__kernels_avx512, type);
        for (size_t ii = 0; ii < sizeof ins / sizeof ins[0]; ii++) {
            const uint32_t n_in = ins[ii];
            for (size_t oi = 0; oi < sizeof outs / sizeof outs[0]; oi++) {
                const uint32_t n_out = outs[oi];
                for (int pat = 0; pat < 4; pat++) {
                    pe_mat w = {type, n_in, n_out, wdata, pe_ggml_row_size(type, n_in), NULL};
                    for (uint32_t r = 0; r < n_out; r++) {
                        uint8_t *row = wdata + r * w.row_bytes;
                        random_row(type, row, n_in);
                        if (pat == 1 || pat == 2) { /* every byte 0x00 or 0xff, valid scales */
                            memset(row, pat == 2 ? 0xff : 0x00, w.row_bytes);
                            random_scales(type, row, n_in);
                        }
                    }
                    for (size_t j = 0; j < (size_t)MAX_TOK * n_in; j++)
                        x[j] = pat < 3 ? frand() * (j % 61 == 0 ? 8.0f : 1.0f)
                                       : ((j * 7) % 3 == 0 ? -1.0f : 1.0f);
                    pe_isa_force(PE_ISA_SCALAR);
                    pe_matmul_ref(&w, x, MAX_TOK, yr);
                    pe_isa_force(PE_ISA_AVX512);
                    for (size_t ti = 0; ti < 2; ti++) {
                        for (uint32_t n_tok = n_min; n_tok <= MAX_TOK; n_tok++) {
                            if (n_tok > 40 && n_tok < MAX_TOK) continue;
                            pe_matmul(tp[ti], &w, x, n_tok, y, scratch);
                            const size_t n = (size_t)n_tok * n_out;
                            for (size_t e = 0; e < n; e++) {
                                if (memcmp(&y[e], &yr[e], sizeof *y) == 0) continue;
                                T_FAIL("%s n_in %u n_out %u pattern %d threads %u n_tok %u: "
                                       "y[%zu][%zu] avx512 %.9g != reference %.9g",
                                       pe_ggml_type_name(type), n_in, n_out, pat, threads[ti],
                                       n_tok, e / n_out, e % n_out, y[e], yr[e]);
                            }
                        }
                    }
                }
            }
        }
        printf("     %-6s avx512 small N (%u..40, %u tokens) bit-identical to the reference\n",
               pe_ggml_type_name(type), n_min, (unsigned)PE_SMALL_N_TOK);
    }
    pe_isa_force(pe_isa_detect());
    pe_tp_destroy(tp[0]);
    pe_tp_destroy(tp[1]);
    free(wdata);
    free(x);
    free(y);
    free(yr);
    free(scratch);
    return 0;
}

/* Q8_0 weights packed once (pe_mat_pack), packed and read by each x86 level: on AVX-512 the
 * same bits as the stored rows at every token count (the GEMV of 1-2 tokens on the packed
 * groups, small N 3..64, the GEMM 65+); on AVX2 and AVX-VNNI (pk_gemv below 8 tokens,
 * q_gemm_pk from 8) the bits of pe_matmul_ref at every count, as their stored rows' panels
 * from 8 tokens (their stored GEMV tiles sum in another order); plain and batch-invariant,
 * for row counts cut inside a group of 16 and a strip of 32 (7, 33, 100), a view whose first
 * row is not a multiple of 16 (phi3's fused tensors), 1 and 2 threads; a copy packed by one
 * level is read by another (both packers write the same bytes). pe_mat_pack refuses Q4_0
 * and the scalar level. */
static int test_q8_packed_matches_stored(void)
{
    if (pe_isa_detect() < PE_ISA_AVX2) {
        printf("     no AVX2 on this CPU: the packed kernels not run\n");
        return 0;
    }
    const uint32_t outs[] = {7, 33, 100}, ins[] = {768, 2304}, threads[] = {1, 2};
    const uint32_t toks[] = {1, 2, 3, 8, 17, 32, 33, 64, 512};
    enum { MAX_TOK = 512, MAX_OUT = 100 + 21, MAX_IN = 2304 };
    uint8_t *wdata = malloc((size_t)MAX_OUT * MAX_IN * 2);
    float *x = malloc((size_t)MAX_TOK * MAX_IN * sizeof *x);
    float *y = malloc((size_t)MAX_TOK * MAX_OUT * sizeof *y);
    float *yp = malloc((size_t)MAX_TOK * MAX_OUT * sizeof *yp);
    const pe_mat wmax = {PE_GGML_TYPE_Q8_0, MAX_IN, MAX_OUT, NULL, 0, NULL};
    void *scratch = malloc(pe_matmul_scratch_bytes(&wmax, MAX_TOK));
    pe_threadpool *tp[2] = {pe_tp_create(threads[0]), pe_tp_create(threads[1])};
    T_ASSERT(wdata && x && y && yp && scratch && tp[0] && tp[1]);
    for (size_t j = 0; j < (size_t)MAX_TOK * MAX_IN; j++)
        x[j] = frand() * (j % 61 == 0 ? 8.0f : 1.0f);
    uint32_t n_checked = 0;
    const pe_isa levels[] = {PE_ISA_AVX512, PE_ISA_AVX2_VNNI, PE_ISA_AVX2};
    for (size_t li = 0; li < sizeof levels / sizeof levels[0]; li++) {
        const pe_isa lv = levels[li];
        if (!pe_isa_has(lv)) continue;
        pe_isa_force(lv);
        for (size_t ii = 0; ii < sizeof ins / sizeof ins[0]; ii++) {
            const uint32_t n_in = ins[ii];
            const size_t rb = pe_ggml_row_size(PE_GGML_TYPE_Q8_0, n_in);
            for (uint32_t r = 0; r < MAX_OUT; r++) {
                random_row(PE_GGML_TYPE_Q8_0, wdata + r * rb, n_in);
                if (r % 5 == 0) { /* every value -1 (0xff) or 0 */
                    memset(wdata + r * rb, r % 10 ? 0xff : 0x00, rb);
                    random_scales(PE_GGML_TYPE_Q8_0, wdata + r * rb, n_in);
                }
            }
            for (size_t oi = 0; oi < sizeof outs / sizeof outs[0]; oi++) {
                for (uint32_t first = 0; first <= 21; first += 21) { /* 21: a view */
                    pe_mat w = {PE_GGML_TYPE_Q8_0, n_in, outs[oi], wdata + first * rb, rb, NULL};
                    pe_mat wp = w;
                    T_ASSERT(pe_mat_pack(&wp) == 1 && wp.packed);
                    T_ASSERT(((uintptr_t)wp.packed & 63) == 0);
                    T_ASSERT(pe_mat_packed_bytes(&w) ==
                             (size_t)(outs[oi] + 15) / 16 * pe__pk_group_bytes(n_in / 32));
                    for (size_t ti = 0; ti < 2; ti++) {
                        for (size_t k = 0; k < sizeof toks / sizeof toks[0]; k++) {
                            for (uint32_t fl = 0; fl <= PE_MM_INVARIANT; fl += PE_MM_INVARIANT) {
                                const uint32_t n_tok = toks[k];
                                if (lv == PE_ISA_AVX512)
                                    pe_matmul_ex(tp[ti], &w, x, n_tok, y, scratch, fl);
                                else
                                    pe_matmul_ref(&w, x, n_tok, y);
                                pe_matmul_ex(tp[ti], &wp, x, n_tok, yp, scratch, fl);
                                const size_t n = (size_t)n_tok * w.n_out;
                                for (size_t e = 0; e < n; e++) {
                                    if (memcmp(&y[e], &yp[e], sizeof *y) == 0) continue;
                                    T_FAIL("n_in %u n_out %u first row %u threads %u n_tok %u "
                                           "flags %u: y[%zu][%zu] packed %.9g != stored %.9g",
                                           n_in, w.n_out, first, threads[ti], n_tok, fl,
                                           e / w.n_out, e % w.n_out, yp[e], y[e]);
                                }
                                n_checked++;
                            }
                        }
                    }
                    /* another level reads this level's copy */
                    const pe_isa other = lv == PE_ISA_AVX2 ? pe_isa_detect() : PE_ISA_AVX2;
                    pe_isa_force(other);
                    for (uint32_t n_tok = 1; n_tok <= 8; n_tok += 7) {
                        if (other == PE_ISA_AVX512)
                            pe_matmul(tp[1], &w, x, n_tok, y, scratch);
                        else
                            pe_matmul_ref(&w, x, n_tok, y);
                        pe_matmul(tp[1], &wp, x, n_tok, yp, scratch);
                        T_ASSERT(memcmp(y, yp, (size_t)n_tok * w.n_out * sizeof *y) == 0);
                    }
                    pe_isa_force(PE_ISA_SCALAR);
                    pe_mat w2 = w;
                    T_ASSERT(pe_mat_pack(&w2) == 0 && !w2.packed);
                    pe_isa_force(lv);
                    pe_mat_unpack(&wp);
                    T_ASSERT(wp.packed == NULL);
                }
            }
        }
    }
    pe_mat w4 = {PE_GGML_TYPE_Q4_0, 64, 16, wdata, pe_ggml_row_size(PE_GGML_TYPE_Q4_0, 64), NULL};
    T_ASSERT(pe_mat_pack(&w4) == 0 && !w4.packed && pe_mat_packed_bytes(&w4) == 0);
    printf("     q8_0 packed == stored (avx512) / reference (avx2 levels) bit for bit (%u "
           "products: 1..512 tokens, plain and invariant, each x86 level)\n",
           n_checked);
    pe_isa_force(pe_isa_detect());
    pe_tp_destroy(tp[0]);
    pe_tp_destroy(tp[1]);
    free(wdata);
    free(x);
    free(y);
    free(yp);
    free(scratch);
    return 0;
}
#endif

int main(void)
{
    T_RUN(test_dequant_matches_ggml);
    T_RUN(test_vec_dot_matches_dequantized);
    T_RUN(test_q8_k_quantizer);
    T_RUN(test_matmul_matches_reference);
#if defined(__x86_64__) || defined(__i386__)
    T_RUN(test_avx2_dots_match_reference);
    T_RUN(test_avx2_tiles_match_reference);
    T_RUN(test_avx2_panels_match_reference);
    T_RUN(test_avx2_kpanels_match_reference);
    T_RUN(test_x86_quantizers);
    T_RUN(test_avx512_products_match_reference);
    T_RUN(test_q_small_n_matches_ref);
    T_RUN(test_q8_packed_matches_stored);
#endif
    if (!t_failed && !have_reference) {
        printf("%d passed; the ggml dequantization reference was not found\n", t_run);
        return 77;
    }
    T_DONE();
}
