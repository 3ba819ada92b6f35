/* SPDX-License-Identifier: MIT */
/*
 * test_ops.c - the engine's kernels (engine/ops/ops.h) against their scalar reference
 * (pe_matmul_ref, ops_ref.c), for every weight type and every ISA this CPU has (each forced
 * with pe_isa_force), plus the quantizers and the f16/bf16 conversions.
 *
 * Bounds (S = sum_i |w_i x_i| over the row, with dequantized weights):
 *   matmul, every type:      |y - y_ref| <= 1e-5 * S   (f32 rounding of the sums only)
 *   Q8_0/Q4_0, unit scales:  y == exact integer dot    (the integer part is exact)
 *   Q8_0 round trip:         |x - x'| <= d/2 + 127 |d - d16|  (d16: d as stored in f16)
 *   Q4_0 round trip:         |x - x'| <= |d|/2 + 8 |d - d16|, or |d| + ... where q clamps to 15
 *   F16 / BF16 round trip:   relative 2^-11 / 2^-8 (normal range)
 *   softmax, swiglu:         relative 2e-6 / 1e-6 against double precision
 *   geglu:                   bit-identical to ggml's f16-table GELU (every f16 input, every
 *                            ISA), and within f16 rounding of the double-precision GELU
 *   PE_MM_INVARIANT:         the same bound, and each row bit-identical alone or batched
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "ops_int.h"
#include "t.h"
#include "threadpool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

static uint64_t seed = 0x9e3779b97f4a7c15ULL;

static float frand(void) /* uniform in [-1, 1) */
{
    return (float)((double)(t_rand(&seed) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

static const uint32_t types[] = {PE_GGML_TYPE_F32, PE_GGML_TYPE_F16, PE_GGML_TYPE_BF16,
                                 PE_GGML_TYPE_Q8_0, PE_GGML_TYPE_Q4_0};
enum { N_TYPES = sizeof types / sizeof types[0] };

/* ---- f16 / bf16 ---- */

static int test_f16_all_patterns_round_trip(void)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = pe_f16_to_f32((uint16_t)h);
        uint16_t back = pe_f32_to_f16(f);
        int nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        if (nan) {
            T_ASSERT(isnan(f));
            T_ASSERT((back & 0x7c00) == 0x7c00 && (back & 0x3ff));
            T_EQ(back & 0x8000, h & 0x8000);
        } else if (back != h) {
            T_FAIL("f16 0x%04x -> %g -> 0x%04x", (unsigned)h, (double)f, (unsigned)back);
        }
    }
    /* a few values by hand */
    T_EQ(pe_f32_to_f16(1.0f), 0x3c00);
    T_EQ(pe_f32_to_f16(-2.0f), 0xc000);
    T_EQ(pe_f32_to_f16(65504.0f), 0x7bff);
    T_EQ(pe_f32_to_f16(65520.0f), 0x7c00);      /* ties to even: rounds up to inf */
    T_EQ(pe_f32_to_f16(5.9604645e-8f), 0x0001); /* 2^-24, smallest subnormal */
    T_EQ(pe_f32_to_f16(2.9802322e-8f), 0x0000); /* 2^-25: tie to even, 0 */
    T_ASSERT(pe_f16_to_f32(0x0001) == 5.9604645e-8f);
    return 0;
}

static int test_bf16_all_patterns_round_trip(void)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = pe_bf16_to_f32((uint16_t)h);
        uint16_t back = pe_f32_to_bf16(f);
        if (isnan(f))
            T_ASSERT(isnan(pe_bf16_to_f32(back)));
        else if (back != h)
            T_FAIL("bf16 0x%04x -> %g -> 0x%04x", (unsigned)h, (double)f, (unsigned)back);
    }
    T_EQ(pe_f32_to_bf16(1.0f), 0x3f80);
    T_EQ(pe_f32_to_bf16(1.00390625f), 0x3f80); /* halfway, ties to even */
    T_EQ(pe_f32_to_bf16(1.01171875f), 0x3f82); /* halfway, ties to even (up) */
    return 0;
}

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("f16c"))) static uint16_t f16c_convert(float f)
{
    return (uint16_t)_cvtss_sh(f, 0);
}
#endif

static int test_f16_matches_f16c(void)
{
#if defined(__x86_64__) || defined(__i386__)
    if (pe_isa_detect() < PE_ISA_AVX2) return 0; /* the AVX2 level includes F16C */
    /* Random bit patterns cover NaN, inf and huge values; random values near the f16 range
     * cover subnormals, overflow and rounding ties. */
    for (uint32_t i = 0; i < 4000000; i++) {
        uint32_t bits = (uint32_t)t_rand(&seed);
        if (i & 1) { /* exponent in [2^-27, 2^17) */
            uint32_t e = 100 + (uint32_t)(t_rand(&seed) % 44);
            bits = (bits & 0x807fffffu) | (e << 23);
            if (i & 2) bits &= ~0x0fffu; /* many exact ties */
        }
        float f;
        memcpy(&f, &bits, 4);
        uint16_t a = pe_f32_to_f16(f), b = f16c_convert(f);
        if (isnan(f)) {
            T_ASSERT((a & 0x7c00) == 0x7c00 && (a & 0x3ff));
        } else if (a != b) {
            T_FAIL("f32 0x%08x: pe_f32_to_f16 0x%04x, F16C 0x%04x", bits, (unsigned)a, (unsigned)b);
        }
    }
#endif
    return 0;
}

/* ---- quantizers ---- */

static int test_q8_0_known_blocks(void)
{
    /* amax 127: d = 1 exactly, so q = roundf(x): halfway cases go away from zero. */
    float x[64];
    for (int j = 0; j < 32; j++)
        x[j] = (float)(j - 16) * 0.25f;
    x[0] = -127.0f;
    x[1] = 0.5f;
    x[2] = -0.5f;
    x[3] = 2.5f;
    x[4] = -2.5f;
    x[5] = 126.5f;
    x[6] = 0.49999997f;
    /* amax 63.5: d = 0.5, id = 2 */
    for (int j = 0; j < 32; j++)
        x[32 + j] = 0.0f;
    x[32] = 63.5f;
    x[33] = 0.25f;
    x[34] = -0.75f;
    x[35] = 1.2f;
    block_q8_0 b[2];
    pe_quant_row(PE_GGML_TYPE_Q8_0, x, b, 64);
    T_EQ(b[0].d, 0x3c00);
    T_EQ(b[1].d, 0x3800);
    const int8_t want0[7] = {-127, 1, -1, 3, -3, 127, 0};
    for (int j = 0; j < 7; j++)
        T_EQ(b[0].qs[j], want0[j]);
    for (int j = 7; j < 32; j++)
        T_EQ(b[0].qs[j], (int)roundf((float)(j - 16) * 0.25f));
    T_EQ(b[0].qs[7], -2);  /* -2.25 */
    T_EQ(b[0].qs[10], -2); /* -1.5 -> -2 (away from zero) */
    const int8_t want1[4] = {127, 1, -2, 2};
    for (int j = 0; j < 4; j++)
        T_EQ(b[1].qs[j], want1[j]);
    for (int j = 4; j < 32; j++)
        T_EQ(b[1].qs[j], 0);
    /* all zero: d = 0, q = 0 */
    memset(x, 0, sizeof x);
    pe_quant_row(PE_GGML_TYPE_Q8_0, x, b, 32);
    T_EQ(b[0].d, 0);
    for (int j = 0; j < 32; j++)
        T_EQ(b[0].qs[j], 0);
    return 0;
}

static int test_q4_0_known_blocks(void)
{
    float x[64];
    /* max = -8 (first largest |x|): d = 1, q = MIN(15, (int8)(x + 8.5)) */
    memset(x, 0, sizeof x);
    x[0] = -8.0f;
    x[1] = 7.0f;
    x[2] = 7.4f;
    x[3] = 8.0f; /* same |x| as the max, later: max stays -8; 16.5 -> 16 -> 15 */
    x[4] = 0.5f;
    x[5] = -0.5f;
    x[6] = 0.49f;
    x[7] = -7.6f;
    x[16] = 3.0f;
    x[31] = -3.0f;
    /* max = +4: d = -0.5, id = -2 */
    x[32] = 4.0f;
    x[33] = -4.0f;
    x[34] = 1.0f;
    block_q4_0 b[2];
    pe_quant_row(PE_GGML_TYPE_Q4_0, x, b, 64);
    T_EQ(b[0].d, 0x3c00);
    T_EQ(b[1].d, 0xb800);
    const int want0[32] = {0,  15, 15, 15, 9, 8, 8, 0, 8, 8, 8, 8, 8, 8, 8, 8,
                           11, 8,  8,  8,  8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 5};
    const int want1[3] = {0, 15, 6};
    for (int j = 0; j < 16; j++) {
        T_EQ(b[0].qs[j] & 0x0f, want0[j]);
        T_EQ(b[0].qs[j] >> 4, want0[j + 16]);
    }
    for (int j = 0; j < 3; j++)
        T_EQ(b[1].qs[j] & 0x0f, want1[j]);
    T_EQ(b[1].qs[3], 0x88);
    return 0;
}

static int test_quant_round_trip(void)
{
    enum { N = 4096 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    void *q = malloc(N * 4);
    T_ASSERT(x && y && q);
    for (int i = 0; i < N; i++)
        x[i] = frand() * (i % 97 == 0 ? 30.0f : 1.0f) * (float)(1 + i / 512);
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        uint32_t type = types[ti];
        pe_quant_row(type, x, q, N);
        pe_dequant_row(type, q, y, N);
        for (int i = 0; i < N; i++) {
            double err = fabs((double)x[i] - y[i]), bound;
            if (type == PE_GGML_TYPE_F32) {
                bound = 0.0;
            } else if (type == PE_GGML_TYPE_F16) {
                bound = fabs(x[i]) * 0x1p-11;
            } else if (type == PE_GGML_TYPE_BF16) {
                bound = fabs(x[i]) * 0x1p-8;
            } else {
                const float *xb = x + i / 32 * 32;
                double amax = 0.0, max = 0.0;
                for (int j = 0; j < 32; j++) {
                    if (fabs(xb[j]) > amax) {
                        amax = fabs(xb[j]);
                        max = xb[j];
                    }
                }
                if (type == PE_GGML_TYPE_Q8_0) {
                    double d = (float)(amax / 127), d16 = pe_f16_to_f32(pe_f32_to_f16((float)d));
                    bound = d / 2 + 127 * fabs(d - d16);
                } else {
                    double d = fabs((float)(max / -8)),
                           d16 = fabs(pe_f16_to_f32(pe_f32_to_f16((float)d)));
                    const block_q4_0 *blk = (const block_q4_0 *)q + i / 32;
                    int j = i % 32;
                    int qv = j < 16 ? blk->qs[j] & 0x0f : blk->qs[j - 16] >> 4;
                    bound = (qv == 15 ? d : d / 2) + 8 * fabs(d - d16);
                }
            }
            bound += 1e-6 * fabs(x[i]);
            if (err > bound)
                T_FAIL("%s: x[%d] = %g -> %g (bound %g)", pe_ggml_type_name(type), i, (double)x[i],
                       (double)y[i], bound);
        }
    }
    free(x);
    free(y);
    free(q);
    return 0;
}

/* Each ISA's activation quantizer is bit-identical to the reference (values, scales and the
 * correction -off * sum), including halfway cases, zero blocks and extreme scales. */
static int test_act_quant_bit_exact(void)
{
    enum { NB = 77, N = NB * 32 };
    float *x = malloc(N * sizeof *x);
    int8_t *q = malloc(N);
    float *d = malloc(NB * sizeof *d);
    int32_t *c = malloc(NB * sizeof *c);
    block_q8_0 *ref = malloc(NB * sizeof *ref);
    T_ASSERT(x && q && d && c && ref);
    for (int rep = 0; rep < 20; rep++) {
        for (int b = 0; b < NB; b++) {
            float scale = b % 7 == 0 ? 1e-30f : b % 7 == 1 ? 1e30f : (float)(1 + b % 5);
            for (int j = 0; j < 32; j++)
                x[b * 32 + j] = frand() * scale;
            if (b % 5 == 2) { /* amax 127 -> d = 1: halfway values must round away from 0 */
                for (int j = 0; j < 32; j++)
                    x[b * 32 + j] = (float)((int)(frand() * 120)) + 0.5f;
                x[b * 32 + 3] = -127.0f;
            }
            if (b % 11 == 4) memset(x + b * 32, 0, 32 * sizeof *x);
        }
        pe__quant_q8_0_ref(x, ref, N);
        const pe_kernels *ks[3] = {&pe__kernels_scalar, NULL, NULL};
#if defined(__x86_64__) || defined(__i386__)
        if (pe_isa_detect() >= PE_ISA_AVX2) ks[1] = &pe__kernels_avx2;
        if (pe_isa_detect() >= PE_ISA_AVX512) ks[2] = &pe__kernels_avx512;
#endif
        for (int k = 0; k < 3; k++) {
            if (!ks[k]) continue;
            int32_t off = rep & 1 ? 8 : 128;
            ks[k]->quant_act(x, N, off, q, d, c);
            for (int b = 0; b < NB; b++) {
                int32_t sum = 0;
                for (int j = 0; j < 32; j++) {
                    if (q[b * 32 + j] != ref[b].qs[j])
                        T_FAIL("isa %d block %d value %d: x %.9g -> %d, ref %d", k, b, j,
                               (double)x[b * 32 + j], q[b * 32 + j], ref[b].qs[j]);
                    sum += ref[b].qs[j];
                }
                T_ASSERT(d[b] == pe_f16_to_f32(ref[b].d));
                T_EQ(c[b], -off * sum);
            }
        }
    }
    free(x);
    free(q);
    free(d);
    free(c);
    free(ref);
    return 0;
}

/* ---- matmul against the reference ---- */

typedef struct mm_case {
    uint32_t type, n_in, n_out, n_tok;
} mm_case;

/* Random weights of type, produced by the reference quantizer (or raw random blocks). */
static void *make_weights(uint32_t type, uint32_t n_in, uint32_t n_out, int raw, uint64_t *rb)
{
    *rb = pe_ggml_row_size(type, n_in);
    uint8_t *w = malloc(*rb * n_out + 1);
    float *row = malloc(n_in * sizeof *row);
    if (!w || !row) abort();
    for (uint32_t o = 0; o < n_out; o++) {
        float scale = 0.05f + (float)(o % 5);
        for (uint32_t i = 0; i < n_in; i++)
            row[i] = frand() * scale;
        pe_quant_row(type, row, w + o * *rb, n_in);
        if (raw && (type == PE_GGML_TYPE_Q8_0 || type == PE_GGML_TYPE_Q4_0)) {
            /* every byte pattern, including q8 = -128 which no quantizer writes */
            size_t bs = type == PE_GGML_TYPE_Q8_0 ? sizeof(block_q8_0) : sizeof(block_q4_0);
            for (uint32_t b = 0; b < n_in / 32; b++)
                for (size_t j = 2; j < bs; j++)
                    w[o * *rb + b * bs + j] = (uint8_t)t_rand(&seed);
        }
    }
    free(row);
    return w;
}

/* S[t][o] = sum_i |w[o][i] * x[t][i]| with dequantized weights. */
static double *magnitudes(const pe_mat *w, const float *x, uint32_t n_tok)
{
    double *s = calloc((size_t)n_tok * w->n_out, sizeof *s);
    float *row = malloc(w->n_in * sizeof *row);
    if (!s || !row) abort();
    for (uint32_t o = 0; o < w->n_out; o++) {
        pe_dequant_row(w->type, (const uint8_t *)w->data + o * w->row_bytes, row, w->n_in);
        for (uint32_t t = 0; t < n_tok; t++) {
            double a = 0.0;
            for (uint32_t i = 0; i < w->n_in; i++)
                a += fabs((double)row[i] * x[(size_t)t * w->n_in + i]);
            s[(size_t)t * w->n_out + o] = a;
        }
    }
    free(row);
    return s;
}

static int check_case(const mm_case *c, pe_threadpool *tp, int raw)
{
    pe_mat w = {c->type, c->n_in, c->n_out, NULL, 0, NULL};
    w.data = make_weights(c->type, c->n_in, c->n_out, raw, &w.row_bytes);
    size_t ny = (size_t)c->n_tok * c->n_out;
    float *x = malloc((size_t)c->n_tok * c->n_in * sizeof *x);
    float *ref = malloc(ny * sizeof *ref), *y = malloc((ny + 16) * sizeof *y);
    void *scratch = malloc(pe_matmul_scratch_bytes(&w, c->n_tok));
    T_ASSERT(x && ref && y && scratch);
    for (size_t i = 0; i < (size_t)c->n_tok * c->n_in; i++)
        x[i] = frand() * (i % 37 == 0 ? 8.0f : 1.0f);
    pe_matmul_ref(&w, x, c->n_tok, ref);
    double *s = magnitudes(&w, x, c->n_tok);
    int rc = 0;
    pe_isa best = pe_isa_detect();
    for (int isa = PE_ISA_SCALAR; isa <= (int)best && rc == 0; isa++) {
        if (!pe_isa_has((pe_isa)isa)) continue; /* AVX-512 without AVX-VNNI */
        T_EQ(pe_isa_force((pe_isa)isa), isa);
        for (size_t i = 0; i < ny + 16; i++)
            y[i] = NAN;
        pe_matmul(tp, &w, x, c->n_tok, y, scratch);
        for (size_t i = 0; i < ny && rc == 0; i++) {
            double err = fabs((double)y[i] - ref[i]);
            if (!(err <= 1e-5 * s[i] + 1e-30)) {
                fprintf(stderr,
                        "%s %s n_in %u n_out %u n_tok %u%s: y[t=%zu][o=%zu] = %.9g, ref %.9g, "
                        "S %.6g\n",
                        pe_isa_name((pe_isa)isa), pe_ggml_type_name(c->type), c->n_in, c->n_out,
                        c->n_tok, raw ? " (raw blocks)" : "", i / c->n_out, i % c->n_out,
                        (double)y[i], (double)ref[i], s[i]);
                rc = 1;
            }
        }
        for (size_t i = ny; i < ny + 16; i++)
            T_ASSERT(isnan(y[i])); /* nothing past the end */
        if (rc == 0) {
            /* the batch-invariant path keeps the same bound */
            pe_matmul_ex(tp, &w, x, c->n_tok, y, scratch, PE_MM_INVARIANT);
            for (size_t i = 0; i < ny && rc == 0; i++) {
                double err = fabs((double)y[i] - ref[i]);
                if (!(err <= 1e-5 * s[i] + 1e-30)) {
                    fprintf(stderr, "%s %s invariant n_in %u n_out %u n_tok %u: %.9g vs %.9g\n",
                            pe_isa_name((pe_isa)isa), pe_ggml_type_name(c->type), c->n_in, c->n_out,
                            c->n_tok, (double)y[i], (double)ref[i]);
                    rc = 1;
                }
            }
            for (size_t i = ny; i < ny + 16; i++)
                T_ASSERT(isnan(y[i]));
        }
    }
    pe_isa_force(best);
    free((void *)w.data);
    free(x);
    free(ref);
    free(y);
    free(scratch);
    free(s);
    return rc;
}

static int test_matmul_matches_reference(void)
{
    static const uint32_t n_ins[] = {32, 64, 96, 256, 2048, 4096 + 32};
    static const uint32_t n_outs[] = {1, 7, 33, 100};
    static const uint32_t n_toks[] = {1, 2, 3, 5, 8, 17};
    pe_threadpool *tp = pe_tp_create(2);
    T_ASSERT(tp);
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        for (size_t a = 0; a < sizeof n_ins / sizeof n_ins[0]; a++) {
            for (size_t b = 0; b < sizeof n_outs / sizeof n_outs[0]; b++) {
                for (size_t k = 0; k < sizeof n_toks / sizeof n_toks[0]; k++) {
                    /* the largest rows with every token count only at the ragged n_out */
                    if (n_ins[a] >= 2048 && n_outs[b] != 33 && n_toks[k] != 1 && n_toks[k] != 17)
                        continue;
                    mm_case c = {types[ti], n_ins[a], n_outs[b], n_toks[k]};
                    if (check_case(&c, (k & 1) ? tp : NULL, 0)) return 1;
                }
            }
        }
    }
    pe_tp_destroy(tp);
    return 0;
}

static int test_matmul_odd_shapes(void)
{
    /* float rows of any length; token counts across the 256-token task boundary; more
     * threads than tasks; float GEMM; raw quantized blocks with every byte value */
    static const mm_case cases[] = {
        {PE_GGML_TYPE_F32, 33, 9, 3},
        {PE_GGML_TYPE_F16, 100, 40, 9},
        {PE_GGML_TYPE_BF16, 7, 5, 20},
        {PE_GGML_TYPE_F32, 1, 3, 1},
        {PE_GGML_TYPE_F16, 300, 65, 13},
        {PE_GGML_TYPE_Q8_0, 64, 70, 300},
        {PE_GGML_TYPE_Q4_0, 96, 129, 260},
        {PE_GGML_TYPE_F16, 48, 31, 270},
        {PE_GGML_TYPE_Q8_0, 1024, 3, 8},
        {PE_GGML_TYPE_BF16, 272, 300, 7},
        {PE_GGML_TYPE_Q4_0, 1056, 33, 16},
        /* GEMV tiles (decode) over rows whose block count is not a multiple of 8: the
         * last chunk of scales and activation scales is a partial one */
        {PE_GGML_TYPE_Q8_0, 1056, 37, 1},
        {PE_GGML_TYPE_Q4_0, 96, 9, 2},
        {PE_GGML_TYPE_Q8_0, 224, 6, 3},
        /* float GEMM (from 20 tokens) over several K chunks, ragged rows and tokens */
        {PE_GGML_TYPE_F32, 4128, 40, 25},
        {PE_GGML_TYPE_F16, 2064, 33, 21},
        {PE_GGML_TYPE_BF16, 600, 65, 37},
    };
    pe_threadpool *tp = pe_tp_create(3);
    T_ASSERT(tp);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (check_case(&cases[i], tp, 0)) return 1;
    for (size_t ti = 3; ti < N_TYPES; ti++) {
        mm_case c1 = {types[ti], 256, 37, 1}, c2 = {types[ti], 256, 37, 11};
        if (check_case(&c1, tp, 1) || check_case(&c2, tp, 1)) return 1;
    }
    pe_tp_destroy(tp);
    return 0;
}

/* Quantized products of 2..32 tokens (decode of several sequences), which the AVX-512
 * kernel runs on repacked panels from 3 (q8_0) or 2 (q4_0) tokens: micro-tiles of 1..6
 * tokens, two K chunks (33 blocks), and row tasks of 32 (two full groups of 16), 20
 * (16 + 4) and 7 rows; raw blocks put q8 = -128 through the transposes. */
static int test_matmul_small_batches(void)
{
    static const uint32_t types_q[] = {PE_GGML_TYPE_Q8_0, PE_GGML_TYPE_Q4_0};
    static const uint32_t n_outs[] = {7, 84};
    pe_threadpool *tp = pe_tp_create(2);
    T_ASSERT(tp);
    for (size_t ti = 0; ti < 2; ti++) {
        for (size_t b = 0; b < 2; b++) {
            for (uint32_t n_tok = 2; n_tok <= 32; n_tok++) {
                mm_case c = {types_q[ti], 1056, n_outs[b], n_tok};
                if (check_case(&c, (n_tok & 1) ? tp : NULL, (int)((n_tok / 2) & 1))) return 1;
            }
        }
    }
    pe_tp_destroy(tp);
    return 0;
}

/* Q8_0 matrices packed as the engine loads them (pe_mat_pack), at each x86 level: on the
 * AVX2 levels every product on the packed copy (decode GEMV tiles of 2 groups x 1 token and
 * 1 x 2, the panels from 8 tokens, the batch-invariant path) is bit-identical to
 * pe_matmul_ref; on AVX-512 to the same level's products on the stored rows. Row counts
 * with an odd number of groups and a partial last group, 33 blocks, raw blocks (q = -128),
 * 1 and 2 threads. */
static int test_matmul_packed(void)
{
    static const uint32_t n_outs[] = {7, 16, 84, 100, 200};
    static const uint32_t toks[] = {1, 2, 3, 5, 7, 8, 9, 17};
    enum { N_IN = 1056, MAX_TOK = 17 };
    pe_threadpool *tp = pe_tp_create(2);
    float *x = malloc((size_t)MAX_TOK * N_IN * sizeof *x);
    float *ref = malloc((size_t)MAX_TOK * 200 * sizeof *ref);
    float *y = malloc((size_t)MAX_TOK * 200 * sizeof *y);
    T_ASSERT(tp && x && ref && y);
    for (size_t i = 0; i < (size_t)MAX_TOK * N_IN; i++)
        x[i] = frand() * (i % 37 == 0 ? 8.0f : 1.0f);
    const pe_isa best = pe_isa_detect();
    int checked = 0;
    for (size_t bo = 0; bo < sizeof n_outs / sizeof n_outs[0]; bo++) {
        pe_mat w = {PE_GGML_TYPE_Q8_0, N_IN, n_outs[bo], NULL, 0, NULL};
        w.data = make_weights(w.type, N_IN, w.n_out, (int)(bo & 1), &w.row_bytes);
        void *scratch = malloc(pe_matmul_scratch_bytes(&w, MAX_TOK));
        T_ASSERT(w.data && scratch);
        for (int isa = PE_ISA_AVX2; isa <= (int)best; isa++) {
            if (!pe_isa_has((pe_isa)isa)) continue;
            T_EQ(pe_isa_force((pe_isa)isa), isa);
            pe_mat pk = w;
            T_EQ(pe_mat_pack(&pk), 1);
            for (size_t ti = 0; ti < sizeof toks / sizeof toks[0]; ti++) {
                const uint32_t nt = toks[ti];
                const size_t ny = (size_t)nt * w.n_out;
                for (int inv = 0; inv < 2; inv++) {
                    const unsigned fl = inv ? PE_MM_INVARIANT : 0;
                    if (isa == PE_ISA_AVX512)
                        pe_matmul_ex(tp, &w, x, nt, ref, scratch, fl);
                    else
                        pe_matmul_ref(&w, x, nt, ref);
                    pe_matmul_ex(ti & 1 ? tp : NULL, &pk, x, nt, y, scratch, fl);
                    for (size_t i = 0; i < ny; i++)
                        if (memcmp(&y[i], &ref[i], sizeof *y))
                            T_FAIL("%s packed n_out %u n_tok %u%s: y[t=%zu][o=%zu] = %.9g, want "
                                   "%.9g",
                                   pe_isa_name((pe_isa)isa), w.n_out, nt, inv ? " invariant" : "",
                                   i / w.n_out, i % w.n_out, (double)y[i], (double)ref[i]);
                    checked++;
                }
            }
            pe_mat_unpack(&pk);
        }
        pe_isa_force(best);
        free((void *)w.data);
        free(scratch);
    }
    printf("     %d packed products bit-identical\n", checked);
    pe_tp_destroy(tp);
    free(x);
    free(ref);
    free(y);
    return 0;
}

/* With unit scales on both sides the products are small integers, so every path must give
 * exactly the integer dot product. */
static int test_matmul_quantized_exact(void)
{
    enum { N_IN = 4096 + 64, N_OUT = 45, N_TOK = 13 };
    pe_isa best = pe_isa_detect();
    float *x = malloc((size_t)N_TOK * N_IN * sizeof *x), *y = malloc((size_t)N_TOK * N_OUT * 4);
    int8_t *xi = malloc((size_t)N_TOK * N_IN);
    T_ASSERT(x && y && xi);
    for (uint32_t t = 0; t < N_TOK; t++) {
        for (uint32_t i = 0; i < N_IN; i++) {
            int v = (int)(t_rand(&seed) % 255) - 127;
            if (i % 32 == t % 32) v = (t & 1) ? 127 : -127; /* amax 127: activation d = 1 */
            xi[(size_t)t * N_IN + i] = (int8_t)v;
            x[(size_t)t * N_IN + i] = (float)v;
        }
    }
    for (int q4 = 0; q4 < 2; q4++) {
        pe_mat w = {q4 ? PE_GGML_TYPE_Q4_0 : PE_GGML_TYPE_Q8_0, N_IN, N_OUT, NULL, 0, NULL};
        w.row_bytes = pe_ggml_row_size(w.type, N_IN);
        uint8_t *wd = malloc(w.row_bytes * N_OUT);
        int8_t *wi = malloc((size_t)N_OUT * N_IN);
        T_ASSERT(wd && wi);
        for (uint32_t o = 0; o < N_OUT; o++) {
            for (uint32_t b = 0; b < N_IN / 32; b++) {
                uint8_t *blk = wd + o * w.row_bytes + b * (q4 ? 18 : 34);
                blk[0] = 0x00; /* d = 1.0 (f16 0x3c00, little-endian) */
                blk[1] = 0x3c;
                for (int j = 0; j < (q4 ? 16 : 32); j++)
                    blk[2 + j] = (uint8_t)t_rand(&seed);
                for (int j = 0; j < 32; j++) {
                    int v = q4 ? (j < 16 ? blk[2 + j] & 15 : blk[2 + j - 16] >> 4) - 8
                               : (int8_t)blk[2 + j];
                    wi[(size_t)o * N_IN + b * 32 + j] = (int8_t)v;
                }
            }
        }
        w.data = wd;
        void *scratch = malloc(pe_matmul_scratch_bytes(&w, N_TOK));
        pe_threadpool *tp = pe_tp_create(2);
        T_ASSERT(scratch && tp);
        for (int isa = PE_ISA_SCALAR; isa <= (int)best; isa++) {
            pe_isa_force((pe_isa)isa);
            for (uint32_t nt = 1; nt <= N_TOK; nt += 11) { /* GEMV (1) and GEMM (12) */
                pe_matmul(tp, &w, x, nt, y, scratch);
                for (uint32_t t = 0; t < nt; t++) {
                    for (uint32_t o = 0; o < N_OUT; o++) {
                        int64_t want = 0;
                        for (uint32_t i = 0; i < N_IN; i++)
                            want += wi[(size_t)o * N_IN + i] * xi[(size_t)t * N_IN + i];
                        if (y[(size_t)t * N_OUT + o] != (float)want)
                            T_FAIL("%s %s t %u o %u: %.1f != %lld", pe_isa_name((pe_isa)isa),
                                   pe_ggml_type_name(w.type), t, o,
                                   (double)y[(size_t)t * N_OUT + o], (long long)want);
                    }
                }
            }
        }
        pe_isa_force(best);
        pe_tp_destroy(tp);
        free(scratch);
        free(wd);
        free(wi);
    }
    free(x);
    free(y);
    free(xi);
    return 0;
}

/* PE_MM_INVARIANT: every output row of a batch has the bits it gets when its activation row
 * runs alone (one token, one thread) and when it runs in another batch at another offset,
 * for every type, ISA and thread count, across the GEMV/GEMM switch (1..25 tokens) and the
 * 256-token task edge (260). Without the flag AVX-512 differs (8-lane GEMV vs panels). */
static int test_batch_invariant(void)
{
    static const uint32_t n_toks[] = {1, 2, 3, 4, 5, 7, 8, 13, 19, 20, 25, 260};
    static const uint32_t shapes[][2] = {{64, 40}, {172, 64}, {1024 + 96, 37}};
    enum { MAX_TOK = 260 };
    pe_isa best = pe_isa_detect();
    pe_threadpool *tp1 = pe_tp_create(1), *tp2 = pe_tp_create(2);
    T_ASSERT(tp1 && tp2);
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
        const uint32_t n_in = shapes[sh][0], n_out = shapes[sh][1];
        float *x = malloc((size_t)MAX_TOK * n_in * sizeof *x);
        float *alone = malloc((size_t)MAX_TOK * n_out * sizeof *alone);
        float *y = malloc((size_t)MAX_TOK * n_out * sizeof *y);
        T_ASSERT(x && alone && y);
        for (size_t i = 0; i < (size_t)MAX_TOK * n_in; i++)
            x[i] = frand() * (i % 37 == 0 ? 8.0f : 1.0f);
        for (int ti = 0; ti < N_TYPES; ti++) {
            const uint32_t type = types[ti];
            if (pe__type_is_quant(type) && n_in % 32) continue;
            pe_mat w = {type, n_in, n_out, NULL, 0, NULL};
            w.data = make_weights(type, n_in, n_out, 0, &w.row_bytes);
            void *scratch = malloc(pe_matmul_scratch_bytes(&w, MAX_TOK));
            T_ASSERT(scratch);
            for (int isa = PE_ISA_SCALAR; isa <= (int)best; isa++) {
                pe_isa_force((pe_isa)isa);
                for (uint32_t t = 0; t < MAX_TOK; t++)
                    pe_matmul_ex(tp1, &w, x + (size_t)t * n_in, 1, alone + (size_t)t * n_out,
                                 scratch, PE_MM_INVARIANT);
                for (size_t k = 0; k < sizeof n_toks / sizeof n_toks[0]; k++) {
                    for (int th = 1; th <= 2; th++) {
                        const uint32_t nt = n_toks[k], t0 = (uint32_t)(k * 7) % (MAX_TOK - nt + 1);
                        pe_matmul_ex(th == 1 ? tp1 : tp2, &w, x + (size_t)t0 * n_in, nt, y, scratch,
                                     PE_MM_INVARIANT);
                        if (memcmp(y, alone + (size_t)t0 * n_out, (size_t)nt * n_out * 4)) {
                            for (size_t i = 0; i < (size_t)nt * n_out; i++)
                                if (memcmp(&y[i], &alone[t0 * n_out + i], 4))
                                    T_FAIL("%s %s %ux%u: %u tokens from %u on %d threads: "
                                           "y[%zu][%zu] = %.9g, alone %.9g",
                                           pe_isa_name((pe_isa)isa), pe_ggml_type_name(type), n_in,
                                           n_out, nt, t0, th, i / n_out, i % n_out, (double)y[i],
                                           (double)alone[t0 * n_out + i]);
                        }
                    }
                }
            }
            pe_isa_force(best);
            free(scratch);
            free((void *)w.data);
        }
        free(x);
        free(alone);
        free(y);
    }
    pe_tp_destroy(tp1);
    pe_tp_destroy(tp2);
    return 0;
}

/* ---- vector helpers ---- */

static int test_vector_helpers(void)
{
    enum { N = 1000 };
    static const uint32_t ns[] = {1, 5, 16, 17, 64, 100, 1000};
    float *a = malloc(N * 4), *b = malloc(N * 4), *c = malloc(N * 4), *d = malloc(N * 4);
    T_ASSERT(a && b && c && d);
    pe_isa best = pe_isa_detect();
    for (int isa = PE_ISA_SCALAR; isa <= (int)best; isa++) {
        pe_isa_force((pe_isa)isa);
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            uint32_t n = ns[k];
            for (uint32_t i = 0; i < n; i++) {
                a[i] = frand() * 4.0f;
                b[i] = frand();
            }
            double dot = 0.0, mag = 0.0, ss = 0.0;
            for (uint32_t i = 0; i < n; i++) {
                dot += (double)a[i] * b[i];
                mag += fabs((double)a[i] * b[i]);
                ss += (double)a[i] * a[i];
            }
            T_ASSERT(fabs(pe_dot_f32(a, b, n) - dot) <= 1e-6 * mag + 1e-30);

            memcpy(c, b, n * 4);
            pe_axpy_f32(c, 0.75f, a, n);
            for (uint32_t i = 0; i < n; i++)
                T_ASSERT(fabs(c[i] - (b[i] + 0.75 * a[i])) <= 1e-6 * (fabs(b[i]) + fabs(a[i])));

            pe_rmsnorm(c, a, b, n, 1e-5f);
            double scale = 1.0 / sqrt(ss / n + 1e-5);
            for (uint32_t i = 0; i < n; i++)
                T_ASSERT(fabs(c[i] - a[i] * scale * b[i]) <=
                         1e-6 * fabs(a[i] * scale * b[i]) + 1e-30);

            /* softmax over scores with a wide range, one -inf (a masked position) */
            for (uint32_t i = 0; i < n; i++)
                c[i] = a[i] * 20.0f;
            if (n > 3) c[2] = -INFINITY;
            memcpy(d, c, n * 4);
            pe_softmax(c, n);
            double max = -INFINITY, sum = 0.0;
            for (uint32_t i = 0; i < n; i++)
                max = d[i] > max ? d[i] : max;
            /* the kernel's input is x - max rounded to f32; the bound covers exp and the sum */
            for (uint32_t i = 0; i < n; i++)
                sum += exp((double)(d[i] - (float)max));
            for (uint32_t i = 0; i < n; i++) {
                double p = exp((double)(d[i] - (float)max)) / sum;
                if (!(fabs(c[i] - p) <= 2e-6 * p + 1e-37))
                    T_FAIL("%s softmax n %u: p[%u] = %.9g, want %.9g", pe_isa_name((pe_isa)isa), n,
                           i, (double)c[i], p);
            }

            for (uint32_t i = 0; i < n; i++) {
                c[i] = a[i] * 30.0f;
                d[i] = b[i];
            }
            c[0] = -120.0f; /* e^120 overflows: silu is -0 */
            memcpy(a, c, n * 4);
            pe_swiglu_f32(c, d, n);
            for (uint32_t i = 0; i < n; i++) {
                double g = a[i], want = g / (1.0 + exp(-g)) * d[i];
                if (!(fabs(c[i] - want) <= 1e-6 * fabs(want) + 1e-30))
                    T_FAIL("%s swiglu: g %g u %g -> %.9g, want %.9g", pe_isa_name((pe_isa)isa), g,
                           (double)d[i], (double)c[i], want);
            }
        }
    }
    pe_isa_force(best);
    free(a);
    free(b);
    free(c);
    free(d);
    return 0;
}

/* ---- GeGLU ---- */

/* ggml's ggml_gelu_f32, in f32 as ggml computes it. */
static float gelu_ggml(float x)
{
    return 0.5f * x *
           (1.0f + tanhf(0.79788456080286535587989211986876f * x * (1.0f + 0.044715f * x * x)));
}

/* ggml_vec_geglu_f32 with GGML_GELU_FP16 (the spec of pe_geglu_f32). */
static float geglu_spec(float x, float u)
{
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x * u;
    float xh = pe_f16_to_f32(pe_f32_to_f16(x));
    return pe_f16_to_f32(pe_f32_to_f16(gelu_ggml(xh))) * u;
}

static int same_bits(float a, float b)
{
    uint32_t x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    return x == y || (a != a && b != b);
}

static int test_geglu(void)
{
    enum { N = 1 << 16 };
    float *g = malloc(N * 4), *u = malloc(N * 4), *x = malloc(N * 4);
    T_ASSERT(g && u && x);
    pe_isa best = pe_isa_detect();
    for (int isa = PE_ISA_SCALAR; isa <= (int)best; isa++) {
        pe_isa_force((pe_isa)isa);
        /* every f16 value as the gate (the whole table), up = a random value */
        for (uint32_t i = 0; i < N; i++) {
            x[i] = pe_f16_to_f32((uint16_t)i);
            u[i] = frand() * 3.0f;
        }
        memcpy(g, x, N * 4);
        pe_geglu_f32(g, u, N);
        for (uint32_t i = 0; i < N; i++) {
            if (!same_bits(g[i], geglu_spec(x[i], u[i])))
                T_FAIL("%s geglu: f16 %#x (%g) up %g -> %.9g, want %.9g", pe_isa_name((pe_isa)isa),
                       i, (double)x[i], (double)u[i], (double)g[i], (double)geglu_spec(x[i], u[i]));
            /* the table against the math: within f16 rounding of the f16 input's GELU, plus
             * the f32 formula's cancellation in 1 + tanh for negative x (|x| ulp(1)) */
            double xd = x[i];
            if (!(fabs(xd) < 10.0)) continue;
            double want =
                0.5 * xd * (1.0 + tanh(0.7978845608028654 * xd * (1 + 0.044715 * xd * xd)));
            if (!(fabs(g[i] - want * u[i]) <=
                  (fabs(want) * 1.5e-3 + 2e-7 * fabs(xd) + 3e-8) * fabs(u[i])))
                T_FAIL("%s geglu: gelu(%g) = %.9g, want %.9g", pe_isa_name((pe_isa)isa), xd,
                       (double)(g[i] / u[i]), want);
        }
        /* f32 gates near the edges and between f16 values, odd lengths (the vector tail) */
        static const uint32_t ns[] = {1, 7, 8, 9, 100, 1001};
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            uint32_t n = ns[k];
            for (uint32_t i = 0; i < n; i++) {
                x[i] = frand() * 12.0f;
                u[i] = frand();
            }
            x[0] = -10.0f;
            if (n > 1) x[1] = 10.0f;
            if (n > 2) x[2] = 9.999f; /* f16 rounds it to 10: the table, not x */
            if (n > 3) x[3] = -9.999f;
            memcpy(g, x, n * 4);
            pe_geglu_f32(g, u, n);
            for (uint32_t i = 0; i < n; i++)
                if (!same_bits(g[i], geglu_spec(x[i], u[i])))
                    T_FAIL("%s geglu n %u: %.9g up %g -> %.9g, want %.9g", pe_isa_name((pe_isa)isa),
                           n, (double)x[i], (double)u[i], (double)g[i],
                           (double)geglu_spec(x[i], u[i]));
        }
    }
    pe_isa_force(best);
    free(g);
    free(u);
    free(x);
    return 0;
}

int main(void)
{
    printf("isa: %s\n", pe_isa_name(pe_isa_detect()));
    T_RUN(test_f16_all_patterns_round_trip);
    T_RUN(test_bf16_all_patterns_round_trip);
    T_RUN(test_f16_matches_f16c);
    T_RUN(test_q8_0_known_blocks);
    T_RUN(test_q4_0_known_blocks);
    T_RUN(test_quant_round_trip);
    T_RUN(test_act_quant_bit_exact);
    T_RUN(test_matmul_matches_reference);
    T_RUN(test_matmul_odd_shapes);
    T_RUN(test_matmul_small_batches);
    T_RUN(test_matmul_packed);
    T_RUN(test_matmul_quantized_exact);
    T_RUN(test_batch_invariant);
    T_RUN(test_vector_helpers);
    T_RUN(test_geglu);
    T_DONE();
}
