/* SPDX-License-Identifier: MIT */
/*
 * ops_int.h - declarations shared by the kernel files: ops.c (dispatch, threading, scalar
 * kernels), ops_ref.c (the spec), ops_avx2.c and ops_avx512.c. Not for other callers.
 *
 * One pe_matmul call: the activations of a Q8_0/Q4_0 product are quantized once into the
 * caller's scratch (pe_mm.xq/xd/xc), then the output is cut into tasks of rows x tokens
 * that the thread pool runs; each task calls the ISA's rows() on its tile.
 *
 *   scratch: xq [n_tok][xq_stride] int8   (Q8_0 values of each token, ggml reference)
 *            xd [n_tok][nb]       f32    (block scales, rounded through f16 as stored)
 *            xc [n_tok][nb]       int32  (-off * sum of the block's values)
 *
 * xc serves kernels that feed dpbusd/maddubs with unsigned weights: Q8_0 weights are used
 * as q + 128 (off = 128), Q4_0 nibbles as q + 8 (off = 8), so sum(w * x) = sum(u * x) + xc.
 */
#ifndef PE_OPS_INT_H
#define PE_OPS_INT_H

#include <stdio.h>
#include <stdlib.h>

#include "ops.h"

/* The arguments of one pe_matmul call, shared by all of its tasks. */
typedef struct pe_mm {
    const pe_mat *w;
    const float *x; /* [n_tok][n_in] activations */
    float *y;       /* [n_tok][n_out] */
    uint32_t n_tok;
    uint32_t nb;       /* blocks per row (quantized weights) */
    const int8_t *xq;  /* [n_tok][xq_stride] */
    const float *xd;   /* [n_tok][nb] */
    const int32_t *xc; /* [n_tok][nb] */
    size_t xq_stride;  /* bytes, a multiple of 64 */
} pe_mm;

/* The kernels of one ISA. */
typedef struct pe_kernels {
    /* Quantizes n values (a multiple of 32) to Q8_0 as pe__quant_q8_0_ref does, writing
     * values, f16-rounded scales and the corrections -off * sum(q) per block. */
    void (*quant_act)(const float *x, uint32_t n, int32_t off, int8_t *q, float *d, int32_t *c);
    /* y[t][r] for rows [r0, r1) and tokens [t0, t1). */
    void (*rows)(const pe_mm *m, uint32_t r0, uint32_t r1, uint32_t t0, uint32_t t1);
    /* The same, batch-invariant (PE_MM_INVARIANT): each y[t][r] gets bits that depend on
     * row r of W and row t of x only, never on r0, r1, t0, t1. */
    void (*rows_invariant)(const pe_mm *m, uint32_t r0, uint32_t r1, uint32_t t0, uint32_t t1);
    float (*dot_f32)(const float *a, const float *b, uint32_t n);
    void (*axpy_f32)(float *y, float a, const float *x, uint32_t n);
    void (*rmsnorm)(float *out, const float *x, const float *w, uint32_t n, float eps);
    void (*softmax)(float *x, uint32_t n);
    void (*swiglu)(float *g, const float *u, size_t n);
} pe_kernels;

extern const pe_kernels pe__kernels_scalar;
extern const pe_kernels pe__kernels_avx2;
extern const pe_kernels pe__kernels_avx2_vnni; /* the same, its panels on vpdpbusd */
extern const pe_kernels pe__kernels_avx512;

/* ---- reference pieces (ops_ref.c) ---- */
void pe__quant_q8_0_ref(const float *x, block_q8_0 *y, size_t n);
void pe__quant_q4_0_ref(const float *x, block_q4_0 *y, size_t n);
float pe__dot_q8_0_q8_0_ref(const block_q8_0 *w, const block_q8_0 *x, size_t nb);
float pe__dot_q4_0_q8_0_ref(const block_q4_0 *w, const block_q8_0 *x, size_t nb);

/* The types of issue 15 (ops_ref.c): Q4_1 Q5_0 Q5_1 IQ4_NL Q2_K Q3_K Q4_K Q5_K Q6_K. Their
 * products run the scalar pe__vec_dot_ext_ref on activations quantized by
 * pe__quant_act_ref to the type's ggml vec_dot_type. */
int pe__type_is_ext(uint32_t type);
/* PE_GGML_TYPE_Q8_K, Q8_0 or Q8_1: the activation type of an ext weight type. */
uint32_t pe__vec_dot_type(uint32_t type);
void pe__quant_q8_1_ref(const float *x, block_q8_1 *y, size_t n);
void pe__quant_q8_k_ref(const float *x, block_q8_K *y, size_t n);
/* Bytes of n activations quantized for weights of an ext type. */
size_t pe__act_row_bytes(uint32_t type, size_t n);
void pe__quant_act_ref(uint32_t type, const float *x, void *y, size_t n);
/* One weight row of n values of an ext type times a row quantized by pe__quant_act_ref. */
float pe__vec_dot_ext_ref(uint32_t type, const void *w, const void *xq, size_t n);
/* n f32 values (a multiple of the type's block) to a row of an ext type, as ggml's
 * reference quantizers without an importance matrix (quantize.c). */
void pe__quant_ext_row(uint32_t type, const float *x, void *y, size_t n);

/* AVX2 versions of pe__vec_dot_ext_ref, bit-identical to it (ops_avx2.c; x86 CPUs with AVX2
 * only). One (row, token) each: pe_matmul runs pe__ext_rows_avx2 below. */
float pe__vec_dot_q4_k_avx2(const void *w, const void *xq, size_t n);
float pe__vec_dot_q5_k_avx2(const void *w, const void *xq, size_t n);
float pe__vec_dot_q6_k_avx2(const void *w, const void *xq, size_t n);
float pe__vec_dot_q4_1_avx2(const void *w, const void *xq, size_t n);
float pe__vec_dot_q5_0_avx2(const void *w, const void *xq, size_t n);
float pe__vec_dot_q5_1_avx2(const void *w, const void *xq, size_t n);
float pe__vec_dot_iq4_nl_avx2(const void *w, const void *xq, size_t n);
float pe__vec_dot_q3_k_avx2(const void *w, const void *xq, size_t n);
float pe__vec_dot_q2_k_avx2(const void *w, const void *xq, size_t n);
/* y[t][r] (row stride w->n_out) for rows [r0, r1) and tokens [t0, t1) of an ext type, on
 * activations quantized by pe__quant_act_ref (token stride xq_stride), in tiles of rows x
 * tokens (the K-quants from 12 tokens on: repacked panels); each element bit-identical to
 * pe__vec_dot_ext_ref (ops_avx2.c). */
void pe__ext_rows_avx2(const pe_mat *w, const uint8_t *xq, size_t xq_stride, float *y, uint32_t r0,
                       uint32_t r1, uint32_t t0, uint32_t t1);
/* The same for CPUs with AVX-VNNI (256-bit): the K-quant panels on vpdpbusd. */
void pe__ext_rows_avx2_vnni(const pe_mat *w, const uint8_t *xq, size_t xq_stride, float *y,
                            uint32_t r0, uint32_t r1, uint32_t t0, uint32_t t1);

/* One product of an ext type: the activations of token t quantized by pe__quant_act_ref at
 * xq + t * xq_stride (xq_stride a multiple of 64), y[n_tok][n_out]. For Q8_0 activations
 * (Q5_0, IQ4_NL weights) xsum[t][b] is the sum of the values of block b of token t. */
typedef struct pe_ext_mm {
    const pe_mat *w;
    const uint8_t *xq;
    size_t xq_stride;
    float *y;
    uint32_t n_tok;
    const int32_t *xsum; /* [n_tok][n_in / 32] */
} pe_ext_mm;

/* AVX-512 VNNI products of the ext types (ops_avx512.c; x86 CPUs with AVX-512 only).
 * pe__ext_avx512_has: whether type has them. pe__ext_rows_avx512: y[t][r] for rows [r0, r1)
 * and tokens [t0, t1), each element bit-identical to pe__vec_dot_ext_ref whatever the bounds
 * (GEMV tiles below pe__ext_gemm_min_tok tokens, repacked panels from it on). */
int pe__ext_avx512_has(uint32_t type);
void pe__ext_rows_avx512(const pe_ext_mm *m, uint32_t r0, uint32_t r1, uint32_t t0, uint32_t t1);
uint32_t pe__ext_gemm_min_tok(uint32_t type);
/* pe__quant_q8_k_ref by vector, bit-identical to it (ops_avx512.c). */
void pe__quant_q8_k_avx512(const float *x, block_q8_K *y, size_t n);
/* The same on AVX2 (ops_avx2.c; x86 CPUs with AVX2 only). */
void pe__quant_q8_k_avx2(const float *x, block_q8_K *y, size_t n);
/* pe__quant_q8_0_ref (q8_1 0) or pe__quant_q8_1_ref (q8_1 1) by vector, bit-identical to
 * them; xsum (or NULL): the sum of each block's values (ops_avx512.c). */
void pe__quant_q8_0_avx512(const float *x, void *y, size_t n, int q8_1, int32_t *xsum);

/* The packed copy of a Q8_0 matrix (pe_mat_pack, pe_mat.packed): ceil(n_out / 16) groups
 * of 16 rows, each pe__pk_group_bytes(nb) bytes, 64-byte aligned: first the f16 scales
 * u16[nb][16] of the group's rows (padded to 64 bytes), then the values u8[nb][8][16][4]
 * (block, chunk of 4 values, row), each q ^ 0x80; rows past n_out are zero.
 * pe__q8_pack_avx512 writes it (ops_avx512.c; x86 CPUs with AVX-512 only), pe__q8_pack_avx2
 * the same bytes (ops_avx2.c); the AVX-512 and AVX2 kernels read it at every token count. */
static inline size_t pe__pk_group_bytes(uint32_t nb)
{
    return ((size_t)nb * 32 + 63) / 64 * 64 + (size_t)nb * 512;
}
void pe__q8_pack_avx512(const pe_mat *w, uint8_t *dst);
void pe__q8_pack_avx2(const pe_mat *w, uint8_t *dst);

/* Activation offset of a weight type (see above). */
static inline int32_t pe__act_offset(uint32_t type)
{
    return type == PE_GGML_TYPE_Q4_0 ? 8 : 128;
}

static inline int pe__type_is_quant(uint32_t type)
{
    return type == PE_GGML_TYPE_Q8_0 || type == PE_GGML_TYPE_Q4_0;
}

/* From this many tokens on, a task is a matrix-matrix product (repacked panels on AVX-512);
 * below it, each weight row is streamed once for all tokens (decode). Measured crossovers
 * (2 threads, bench_matmul): f16 GEMV still ahead at 16 tokens (162 vs 128 GFLOP/s), GEMM
 * ahead at 24 (171 vs 135). AVX-512 quantized panels, repacked with shuffles instead of
 * gathers, beat the GEMV tiles from 3 tokens (q8_0 2048x8192, medians of 3: 156 vs 148
 * GFLOP/s at 3, 266 vs 133 at 5, 275 vs 143 at 7) and, for q4_0, from 2 (166 vs 119). The
 * other ISAs keep 8: only the task split of ops.c depends on it there. */
static inline uint32_t pe__gemm_min_tok(const pe_kernels *k, uint32_t type)
{
    if (!pe__type_is_quant(type)) return 20;
#if defined(__x86_64__) || defined(__i386__)
    if (k == &pe__kernels_avx512) return type == PE_GGML_TYPE_Q4_0 ? 2 : 3;
#else
    (void)k;
#endif
    return 8;
}

/* AVX-512: Q8_0/Q4_0 products of pe__gemm_min_tok to this many tokens (the steps of batched
 * decode) take the small-N kernel of ops_avx512.c, bit-identical to pe_matmul_ref. */
#define PE_SMALL_N_TOK 64

/* A type the kernels do not know is a caller bug (the loader refuses such tensors). */
#define PE_UNREACHABLE_TYPE(t)                                                                     \
    do {                                                                                           \
        fprintf(stderr, "%s: unsupported tensor type %u\n", __func__, (unsigned)(t));              \
        abort();                                                                                   \
    } while (0)

#define PE_CHECK_ALLOC(p)                                                                          \
    do {                                                                                           \
        if (!(p)) {                                                                                \
            fprintf(stderr, "%s: out of memory\n", __func__);                                      \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#endif /* PE_OPS_INT_H */
