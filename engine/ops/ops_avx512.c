/* SPDX-License-Identifier: MIT */
/*
 * ops_avx512.c - AVX-512 (F/BW/VL/DQ/VNNI) kernels: pe_kernels for PE_ISA_AVX512. Reached
 * through ops.c's dispatch only; every function carries a target attribute, so the
 * library builds without -march flags.
 *
 * Two product paths:
 *
 * GEMV (fewer than pe__gemm_min_tok() tokens: decode) works on the weights as stored, a tile
 * of R rows x T tokens at a time, each weight block loaded once for T tokens. Quantized
 * blocks use 256-bit vpdpbusd (unsigned x signed bytes): Q8_0 weights enter as q ^ 0x80 =
 * q + 128 and Q4_0 nibbles as q + 8, and the accumulator starts at the activation's
 * correction xc / 8 per lane, so the integer dot is exact. Memory bound.
 *
 * GEMM (prefill, and quantized products from 2-3 tokens: batched decode) repacks, per task,
 * 32 rows x one K chunk into an L1-resident panel with the rows in the vector lanes, so that
 * no horizontal sums are needed. Each weight is repacked once per call, so at a few tokens
 * the repack must cost less than the products: it transposes with shuffles (q8_group,
 * q4_group), which took q8_0 2048x8192 at 8 tokens from 255 to 293-320 GFLOP/s (2 threads)
 * where 8 gathers per block and group did it; micro-tiles split the tokens evenly (8 = 4 + 4).
 * Up to PE_SMALL_N_TOK tokens (serving steps) the panels sum in the reference's order
 * (q_small_n): bit-identical to pe_matmul_ref.
 *
 * Packed Q8_0 weights (pe_mat_pack, w->packed; the engine packs at load): the panels made
 * once for the whole matrix, per group of 16 rows its f16 row scales, then qpanel.q of
 * every block (ops_int.h pe__pk_group_bytes), as many bytes as the stored rows. All three
 * paths then read that copy (q_gemm_t pk, pk_gemv), so the stored rows need not stay in
 * memory; every output is bit-identical to the one on the stored rows. Measured
 * (bench_matmul q8_0 2048x8192, --packed or not, alternated runs, best of 5-9 reps, this
 * shared 2-vCPU Xeon where the second core comes and goes, so 2-thread figures are lower
 * bounds): 8 tokens 1.43-2.33 -> 0.68-1.57 ms (best 2 threads 0.96 -> 0.68), 16 tokens
 * 2.06-3.67 -> 0.88-2.30 (best 1.39 -> 0.88), 32 tokens 3.2-3.4 -> 2.8-2.9 (1 thread);
 * 1 token from memory (--ws-mib 512, 1 thread, 4 alternated runs) 1.22-1.38 -> 1.23-1.53
 * (best 1.215 vs 1.233-1.244: within the noise); 512 tokens 2048x8192 44.0 -> 41.5,
 * 8192x2048 44.0-49.2 -> 45.7-46.2 (within the noise). Serving (pagoda serve -t 2 on the
 * 1B q8_0, pagoda bench --url, 8 prompts sharing 1157 tokens, 32-token questions, 64-token
 * answers, 8 concurrent; 2 sets of 3 alternated runs): output tokens/s packed / unpacked
 * per run 1.40, 1.46, 1.28 and 1.15, 1.34, 1.50 (medians 19.4 vs 15.2 and 30.3 vs 22.6).
 *
 *   quantized panel, per block b and group g of 16 rows (576 bytes):
 *       float dw[16]                 row scales
 *       u8    q[8][16][4]            chunk k of 4 values for each of the 16 rows
 *   micro-kernel (2 groups x 6 tokens): per chunk, 2 panel loads, 6 dword broadcasts of
 *   activations, 12 vpdpbusd; per block cvt + mul(dw) + fma(dx) per accumulator.
 *
 *   float panel (F32/F16/BF16 weights converted to f32): f32 [k][32 rows], transposed
 *   16x16 at a time; micro-kernel 2 groups x 12 tokens = 24 FMA accumulators per k.
 *
 * Measured (512 tokens, one thread, bench_matmul): q8_0/q4_0 390-440 GFLOP/s against
 * 50 for the GEMV-style 4x2 register tiles of ops_avx2.c (8.6x; 820-900 on 2 threads);
 * f16/bf16/f32 125-139 against 42-53 (of 189 peak FMA). Panel depth 512 instead of 256
 * gained 2%, 3x8 or 4x6 float micro-tiles within 3% of 2x12.
 *
 * The types of issue 15 (pe__ext_rows_avx512, reached from ops.c's matmul_ext) take the same
 * two paths on the activations of their ggml vec_dot_type (quantized here by vector, byte-
 * identical to ops_ref.c's quantizers), and each output is bit-identical to
 * pe__vec_dot_ext_ref: exact integer block sums, then the reference's f32 statements in its
 * order per (row, token), the running sum kept in y between K chunks.
 *   K-quants (Q2_K..Q6_K, Q8_K activations): GEMV on the stored super-blocks, unpacked in
 *   registers (kv_row); GEMM on panels of 32 rows x 4 super-blocks (kpanel, k_micro: 2
 *   groups x 4 tokens, sub-block scales by vpmulld or vpdpwssd, bsums terms by vpdpwssd).
 *   Q4_1, Q5_0, Q5_1, IQ4_NL (Q8_1/Q8_0): panels like Q4_0's (bpanel, b_micro: 2 groups x
 *   6 tokens) at every token count, which beat a row-by-row dot even at 1 token.
 * Measured (bench_matmul, 512 tokens, one thread, 2048x2048 and 2048x8192, 3 runs, as a
 * ratio to q4_0 in the same run; shared machine, so absolute figures vary 30%): q2_K 0.70-
 * 1.16, q3_K 0.81-1.35, q4_K 0.82-0.96, q5_K 0.81-0.89, q6_K 0.57-0.72, q5_0 0.72-0.97,
 * iq4_nl 0.66-1.08, q4_1/q5_1 0.37-0.87 (q4_0 280-440 GFLOP/s); the AVX2 row dots they
 * replace ran 9-25. Decode (2048x8192 from memory): q4_K 1.42 ms against q8_0 1.57
 * (0.96 against 1.32 in a quieter run), q6_K 1.80, q4_0 0.93.
 *
 * Invariants: the integer part of every quantized dot is exact and the activation quantizer
 * is bit-identical to pe__quant_q8_0_ref; panel rows past n_out are zero and never stored.
 */
#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "ops_int.h"

/* Bytes ahead of the current position that GEMV prefetches in each row stream. */
#ifndef PF_AHEAD
#define PF_AHEAD 1024
#endif

#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#define INL static inline __attribute__((always_inline)) TGT

enum {
    KB = 32,  /* GEMM: blocks of 32 values per quantized panel (36 KB) */
    KC = 256, /* GEMM: values per float panel */
    FG = 2,   /* GEMM: groups of 16 rows per float panel */
    GQT = 6,  /* GEMM: tokens per quantized micro-tile */
    GFT = 12, /* GEMM: tokens per float micro-tile */
};

/* ---- small helpers ---- */

INL float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INL float hsum16(__m512 v)
{
    return hsum8(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

INL int32_t i32_at(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

INL __mmask16 mask16(uint32_t n)
{
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
}

/* GEMV reads each weight row once, as 4 sequential streams (see walk()), and prefetches
 * each stream PF_AHEAD bytes ahead into L2. Measured on q8_0 2048x8192, decode shapes:
 * no software prefetch and consecutive rows 7.3 GB/s on 1 thread; prefetching the next
 * tile 11-13; 4 streams + 1 KB ahead 15.5 (1 thread) and ~30 GB/s (2 threads), against
 * ~33 GB/s for a pure read of the machine. T0/T1/T2 hints were equal, NTA lost 30%, and
 * 512/2048/4096 bytes ahead were no better. */
INL void pf_range(const uint8_t *p, size_t n)
{
    for (size_t l = 0; l < n; l += 64)
        _mm_prefetch((const char *)p + l, _MM_HINT_T1);
}

/* roundf(): to nearest, halfway cases away from zero (exact for |v| < 2^23). */
INL __m512 round_away(__m512 v)
{
    __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m512 frac = _mm512_abs_ps(_mm512_sub_ps(v, t));
    __mmask16 ge = _mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    __m512 one = _mm512_castsi512_ps(
        _mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(INT32_MIN)),
                        _mm512_castps_si512(_mm512_set1_ps(1.0f))));
    return _mm512_mask_add_ps(t, ge, t, one);
}

/* ---- activation quantization ---- */

/* Three passes, so that no long dependency chain runs through each block (max-reduce ->
 * divide -> divide -> f16 -> quantize): the block maxima, then d and 1/d for 16 blocks per
 * vector divide, then the values. 17.7 ns per block done block by block, 8.7 ns this way
 * (L2-resident input). d[] holds the maxima and c[] the inverse scales (as floats) in
 * between. */
TGT static void quant_act(const float *x, uint32_t n, int32_t off, int8_t *q, float *d, int32_t *c)
{
    const uint32_t nb = n / QK8_0;
    for (uint32_t b = 0; b < nb; b++) {
        const float *xb = x + (size_t)b * QK8_0;
        __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
        d[b] = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    }
    for (uint32_t b = 0; b < nb; b += 16) {
        const __mmask16 mb = mask16(nb - b);
        const __m512 dd = _mm512_div_ps(_mm512_maskz_loadu_ps(mb, d + b), _mm512_set1_ps(127.0f));
        const __mmask16 nz = _mm512_cmp_ps_mask(dd, _mm512_setzero_ps(), _CMP_NEQ_UQ);
        const __m512 id = _mm512_maskz_div_ps(nz, _mm512_set1_ps(1.0f), dd);
        /* F16C rounds like pe_f32_to_f16 (test_f16_matches_f16c) */
        const __m512 d16 = _mm512_cvtph_ps(_mm512_cvtps_ph(dd, _MM_FROUND_TO_NEAREST_INT));
        _mm512_mask_storeu_ps(d + b, mb, d16);
        _mm512_mask_storeu_ps((float *)(void *)(c + b), mb, id);
    }
    for (uint32_t b = 0; b < nb; b++) {
        const float *xb = x + (size_t)b * QK8_0;
        const __m512 idv = _mm512_broadcastss_ps(_mm_load_ss((const float *)(const void *)(c + b)));
        __m512i i0 = _mm512_cvttps_epi32(round_away(_mm512_mul_ps(_mm512_loadu_ps(xb), idv)));
        __m512i i1 = _mm512_cvttps_epi32(round_away(_mm512_mul_ps(_mm512_loadu_ps(xb + 16), idv)));
        c[b] = -off * _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
        _mm_storeu_si128((__m128i *)(q + (size_t)b * QK8_0), _mm512_cvtepi32_epi8(i0));
        _mm_storeu_si128((__m128i *)(q + (size_t)b * QK8_0 + 16), _mm512_cvtepi32_epi8(i1));
    }
}

/* ---- GEMV: quantized tiles on the stored layout ---- */

/* The 32 values of a weight block as unsigned bytes (q + 128 for Q8_0, q + 8 for Q4_0). */
INL __m256i q_unsigned(const uint8_t *blk, const int q4)
{
    if (q4) { /* both lanes hold qs[0..15]; the high lane keeps the high nibbles */
        __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(blk + 2)));
        v = _mm256_srlv_epi32(v, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
        return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
    }
    return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 2)),
                            _mm256_set1_epi8((char)0x80));
}

/* The f16 scales of blocks [0, n) (n <= 8) from blk (block stride bsz), as f32. */
INL __m256 q_scales8(const uint8_t *blk, size_t bsz, uint32_t n)
{
    const __m256i idx =
        _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)bsz));
    __m256i d = _mm256_mmask_i32gather_epi32(_mm256_setzero_si256(), (__mmask8)((1u << n) - 1), idx,
                                             blk, 1);
    return _mm256_cvtph_ps(_mm256_cvtepi32_epi16(d));
}

/* Per block and row: one vpdpbusd, one cvt and one FMA whose scale d_w * d_x comes from a
 * table built 8 blocks at a time (gather + cvtph + mul), instead of converting and
 * broadcasting each f16 scale. Measured with L2-resident weights: q4_0 2.44 -> 1.21 ns
 * and q8_0 1.45 -> 1.29 ns per row and block (with the noinline tiles below). */
INL void q_tile(const pe_mm *m, const uint8_t *w0, size_t rs, uint32_t r, uint32_t rstep,
                uint32_t t, const int q4, const int R, const int T)
{
    const size_t bsz = q4 ? sizeof(block_q4_0) : sizeof(block_q8_0);
    __m256 acc[4][4];               /* [R][T]: fixed size so that it lives in registers */
    _Alignas(32) float sc[4][4][8]; /* [R][T][block]: d_w * d_x */
    _Alignas(32) int32_t cs[4][8];  /* [T][block]: correction per lane, xc / 8 */
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int j = 0; j < T; j++)
            acc[i][j] = _mm256_setzero_ps();
    for (uint32_t b8 = 0; b8 < m->nb; b8 += 8) {
        const uint32_t nj = m->nb - b8 < 8 ? m->nb - b8 : 8;
        const __mmask8 mj = (__mmask8)((1u << nj) - 1);
        __m256 dw[4];
#pragma GCC unroll 4
        for (int i = 0; i < R; i++)
            dw[i] = q_scales8(w0 + (size_t)i * rs + b8 * bsz, bsz, nj);
#pragma GCC unroll 4
        for (int j = 0; j < T; j++) {
            const size_t o = (size_t)(t + j) * m->nb + b8;
            __m256 dx = _mm256_maskz_loadu_ps(mj, m->xd + o);
            __m256i c = _mm256_maskz_loadu_epi32(mj, m->xc + o);
            _mm256_store_si256((__m256i *)cs[j], _mm256_srai_epi32(c, 3));
#pragma GCC unroll 4
            for (int i = 0; i < R; i++)
                _mm256_store_ps(sc[i][j], _mm256_mul_ps(dw[i], dx));
        }
#pragma GCC unroll 4
        for (int i = 0; i < R; i++)
            pf_range(w0 + (size_t)i * rs + b8 * bsz + PF_AHEAD, 8 * bsz);
        for (uint32_t k = 0; k < nj; k++) {
            const uint32_t b = b8 + k;
            __m256i wv[4];
#pragma GCC unroll 4
            for (int i = 0; i < R; i++)
                wv[i] = q_unsigned(w0 + (size_t)i * rs + b * bsz, q4);
#pragma GCC unroll 4
            for (int j = 0; j < T; j++) {
                __m256i xv = _mm256_loadu_si256(
                    (const __m256i *)(m->xq + (size_t)(t + j) * m->xq_stride + b * 32));
                __m256i cv = _mm256_set1_epi32(cs[j][k]);
#pragma GCC unroll 4
                for (int i = 0; i < R; i++) {
                    __m256i dot = _mm256_dpbusd_epi32(cv, wv[i], xv);
                    acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot),
                                                _mm256_set1_ps(sc[i][j][k]), acc[i][j]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int j = 0; j < T; j++)
            m->y[(size_t)(t + j) * m->w->n_out + r + i * rstep] = hsum8(acc[i][j]);
}

/* ---- GEMV: float tiles ---- */

/* 16 weights of row p from k (n of them valid, the rest 0), as f32. */
INL __m512 f_load(const uint8_t *p, uint32_t k, __mmask16 mk, const int type)
{
    if (type == PE_GGML_TYPE_F32) {
        if (mk == 0xffff) return _mm512_loadu_ps((const float *)p + k);
        return _mm512_maskz_loadu_ps(mk, (const float *)p + k);
    }
    __m256i h = mk == 0xffff ? _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + k))
                             : _mm256_maskz_loadu_epi16(mk, (const uint16_t *)p + k);
    if (type == PE_GGML_TYPE_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

INL void f_tile(const pe_mm *m, const uint8_t *w0, size_t rs, uint32_t r, uint32_t rstep,
                uint32_t t, const int type, const int R, const int T)
{
    const uint32_t n = m->w->n_in;
    __m512 acc[4][4]; /* [R][T] */
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int j = 0; j < T; j++)
            acc[i][j] = _mm512_setzero_ps();
    const size_t es = type == PE_GGML_TYPE_F32 ? 4 : 2;
    for (uint32_t k = 0; k < n; k += 16) {
        /* masked loads cost an extra uop each: only the last step uses them */
        const __mmask16 mk = mask16(n - k);
        const int full = n - k >= 16;
        __m512 wv[4];
        if (k % 64 == 0)
#pragma GCC unroll 4
            for (int i = 0; i < R; i++)
                pf_range(w0 + (size_t)i * rs + k * es + PF_AHEAD, 64 * es);
#pragma GCC unroll 4
        for (int i = 0; i < R; i++)
            wv[i] = full ? f_load(w0 + (size_t)i * rs, k, 0xffff, type)
                         : f_load(w0 + (size_t)i * rs, k, mk, type);
#pragma GCC unroll 4
        for (int j = 0; j < T; j++) {
            const float *xp = m->x + (size_t)(t + j) * n + k;
            __m512 xv = full ? _mm512_loadu_ps(xp) : _mm512_maskz_loadu_ps(mk, xp);
#pragma GCC unroll 4
            for (int i = 0; i < R; i++)
                acc[i][j] = _mm512_fmadd_ps(wv[i], xv, acc[i][j]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int j = 0; j < T; j++)
            m->y[(size_t)(t + j) * m->w->n_out + r + i * rstep] = hsum16(acc[i][j]);
}

/* The GEMV tile tables, walk() and gemv(): shared with the other ISA (ops_gemv.h). */
#define GEMV_TILE_T 4
#include "ops_gemv.h"

/* ---- GEMM: quantized panels ---- */

typedef struct qpanel {
    float dw[16];
    uint8_t q[8][64];
} qpanel; /* one block of one group of 16 rows */

/* The 16 rows of one panel group are transposed from their stored blocks with loads and
 * in-register shuffles: q8_0 as two 8x8 dword transposes side by side (rows i | i + 8 in
 * the two 256-bit halves), q4_0 as four 4x4 transposes (rows j, j + 4, j + 8, j + 12 in the
 * four 128-bit lanes). One 16-lane gather per dword (the first version: 8 per block and
 * group) made the repack cost more than the products at 8 tokens. */

/* Row i of the group (16 bytes at byte offset o of block b), or zeros past the group's rows. */
INL __m128i q_row16(const uint8_t *bb, size_t rb, uint32_t i, uint32_t ng, size_t o)
{
    return i < ng ? _mm_loadu_si128((const __m128i *)(bb + (size_t)i * rb + o))
                  : _mm_setzero_si128();
}

INL void q8_group(const uint8_t *bb, size_t rb, uint32_t ng, qpanel *p)
{
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m512i v[8], t[8], s[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        __m256i lo = _mm256_set_m128i(q_row16(bb, rb, (uint32_t)i, ng, 18),
                                      q_row16(bb, rb, (uint32_t)i, ng, 2));
        __m256i hi = _mm256_set_m128i(q_row16(bb, rb, (uint32_t)i + 8, ng, 18),
                                      q_row16(bb, rb, (uint32_t)i + 8, ng, 2));
        v[i] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
    }
    /* s[4h + c] holds chunks c | c + 4 of rows 4h..4h+3 (and of 8 + 4h.. in the high half) */
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        s[4 * h + 0] = _mm512_unpacklo_epi64(t[4 * h + 0], t[4 * h + 2]);
        s[4 * h + 1] = _mm512_unpackhi_epi64(t[4 * h + 0], t[4 * h + 2]);
        s[4 * h + 2] = _mm512_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
        s[4 * h + 3] = _mm512_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
    }
    const __m512i ilo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i ihi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        __m512i a = _mm512_permutex2var_epi64(s[c], ilo, s[4 + c]);
        __m512i b = _mm512_permutex2var_epi64(s[c], ihi, s[4 + c]);
        _mm512_store_si512(p->q[c], _mm512_xor_si512(a, flip));
        _mm512_store_si512(p->q[c + 4], _mm512_xor_si512(b, flip));
    }
}

INL void q4_group(const uint8_t *bb, size_t rb, uint32_t ng, qpanel *p)
{
    const __m512i lo4 = _mm512_set1_epi8(0x0f);
    __m512i v[4], a[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        __m512i x = _mm512_castsi128_si512(q_row16(bb, rb, (uint32_t)j, ng, 2));
        x = _mm512_inserti32x4(x, q_row16(bb, rb, (uint32_t)j + 4, ng, 2), 1);
        x = _mm512_inserti32x4(x, q_row16(bb, rb, (uint32_t)j + 8, ng, 2), 2);
        v[j] = _mm512_inserti32x4(x, q_row16(bb, rb, (uint32_t)j + 12, ng, 2), 3);
    }
    a[0] = _mm512_unpacklo_epi32(v[0], v[1]);
    a[1] = _mm512_unpackhi_epi32(v[0], v[1]);
    a[2] = _mm512_unpacklo_epi32(v[2], v[3]);
    a[3] = _mm512_unpackhi_epi32(v[2], v[3]);
    __m512i d[4] = {_mm512_unpacklo_epi64(a[0], a[2]), _mm512_unpackhi_epi64(a[0], a[2]),
                    _mm512_unpacklo_epi64(a[1], a[3]), _mm512_unpackhi_epi64(a[1], a[3])};
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        _mm512_store_si512(p->q[k], _mm512_and_si512(d[k], lo4));
        _mm512_store_si512(p->q[k + 4], _mm512_and_si512(_mm512_srli_epi16(d[k], 4), lo4));
    }
}

/* Repacks rows [r, r + nr) (nr <= 32) x blocks [b0, b0 + kb) into P[kb][2]. */
TGT static void q_repack(const pe_mat *w, uint32_t r, uint32_t nr, uint32_t b0, uint32_t kb,
                         qpanel *P)
{
    const int q4 = w->type == PE_GGML_TYPE_Q4_0;
    const size_t bsz = q4 ? sizeof(block_q4_0) : sizeof(block_q8_0);
    const size_t rb = w->row_bytes;
    const __m512i idx =
        _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm512_set1_epi32((int)rb));
    for (uint32_t g = 0; g < 2; g++) {
        const uint32_t ng = nr > 16 * g ? (nr - 16 * g < 16 ? nr - 16 * g : 16) : 0;
        const __mmask16 mr = mask16(ng);
        const uint8_t *base = (const uint8_t *)w->data + (size_t)(r + 16 * g) * rb;
        for (uint32_t b = 0; b < kb; b++) {
            qpanel *p = &P[2 * b + g];
            if (ng == 0) {
                memset(p, 0, sizeof *p);
                continue;
            }
            const uint8_t *bb = base + (size_t)(b0 + b) * bsz;
            __m512i d = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mr, idx, bb, 1);
            _mm512_store_ps(p->dw, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d)));
            /* full groups get the row bounds folded away */
            if (q4 && ng == 16)
                q4_group(bb, rb, 16, p);
            else if (q4)
                q4_group(bb, rb, ng, p);
            else if (ng == 16)
                q8_group(bb, rb, 16, p);
            else
                q8_group(bb, rb, ng, p);
        }
    }
}

/* The f32 order of q_micro: blockwise (each K chunk summed from zero, then added to y), or
 * the reference's (one running sum per element through y, each block's term rounded as
 * pe__dot_q8_0_q8_0_ref or pe__dot_q4_0_q8_0_ref rounds it: bit-identical to it). */
enum { ORD_BLOCK, ORD_REF_Q8, ORD_REF_Q4 };

/* Where q_micro reads its two groups of 16 rows: block b's chunk k of group g at
 * q[g] + b * QS + 64 k and its row scales at d[g] + b * DS, f32 in a qpanel (pk 0: P[2 b + g]
 * of q_repack) or f16 in the packed copy (pk 1: pe__pk_group_bytes per group). */
typedef struct qsrc {
    const uint8_t *q[2], *d[2];
} qsrc;

INL qsrc qsrc_panel(const qpanel *P)
{
    qsrc s = {{(const uint8_t *)P[0].q, (const uint8_t *)P[1].q},
              {(const uint8_t *)P[0].dw, (const uint8_t *)P[1].dw}};
    return s;
}

/* Group g of the packed copy of w, from block b0 on. */
INL void pk_group(const pe_mat *w, uint32_t g, uint32_t b0, const uint8_t **q, const uint8_t **d)
{
    const uint32_t nb = w->n_in / QK8_0;
    const uint8_t *base = (const uint8_t *)w->packed + (size_t)g * pe__pk_group_bytes(nb);
    *d = base + (size_t)b0 * 32;
    *q = base + ((size_t)nb * 32 + 63) / 64 * 64 + (size_t)b0 * 512;
}

/* Rows [r, r + nr) (nr <= 32, r a multiple of 16) of the packed copy from block b0: the
 * second group is the first again when nr <= 16 (read, never stored), so that no group past
 * the last is touched. */
INL qsrc qsrc_packed(const pe_mat *w, uint32_t r, uint32_t nr, uint32_t b0)
{
    qsrc s;
    pk_group(w, r / 16, b0, &s.q[0], &s.d[0]);
    pk_group(w, r / 16 + (nr > 16), b0, &s.q[1], &s.d[1]);
    return s;
}

/* Accumulates T tokens from t over blocks [b0, b0 + kb) of panels S into y (rows r, nr).
 * pk: pf (the first token tile of a panel) prefetches the panel q_gemm_t reads next, N
 * (N.q[0] NULL: none), block by block into L2, and pf_cur (the task's first panel) this one
 * PF_AHEAD bytes ahead. Without it a 32-token product on packed weights ran 30% slower than
 * on repacked ones: the first tile of each panel waited on L3 (PF_AHEAD is 2 blocks). */
INL void q_micro(const pe_mm *m, qsrc S, qsrc N, uint32_t b0, uint32_t kb, uint32_t r, uint32_t nr,
                 uint32_t t, int first, int pf, int pf_cur, const int ord, const int pk,
                 const int T)
{
    const size_t QS = pk ? 512 : 2 * sizeof(qpanel), DS = pk ? 32 : 2 * sizeof(qpanel);
    const uint32_t n_out = m->w->n_out;
    const __mmask16 m0 = mask16(nr), m1 = mask16(nr > 16 ? nr - 16 : 0);
    const int8_t *xq = m->xq + (size_t)t * m->xq_stride + (size_t)b0 * 32;
    const float *xd = m->xd + (size_t)t * m->nb + b0;
    const int32_t *xc = m->xc + (size_t)t * m->nb + b0;
    __m512 fa[2][GQT];
#pragma GCC unroll 12
    for (int j = 0; j < T; j++) {
        const float *yj = m->y + (size_t)(t + j) * n_out + r;
        const int run = ord != ORD_BLOCK && !first; /* the reference's sum so far */
        fa[0][j] = run ? _mm512_maskz_loadu_ps(m0, yj) : _mm512_setzero_ps();
        fa[1][j] = run ? _mm512_maskz_loadu_ps(m1, yj + 16) : _mm512_setzero_ps();
    }
    for (uint32_t b = 0; b < kb; b++) {
        const uint8_t *q0 = S.q[0] + b * QS, *q1 = S.q[1] + b * QS;
        if (pk && pf && pf_cur) {
            pf_range(q0 + PF_AHEAD, 512);
            pf_range(q1 + PF_AHEAD, 512);
            if (b % 2 == 0) {
                pf_range(S.d[0] + b * DS + PF_AHEAD / 16, 64);
                pf_range(S.d[1] + b * DS + PF_AHEAD / 16, 64);
            }
        }
        if (pk && pf && N.q[0]) {
            pf_range(N.q[0] + b * QS, 512);
            pf_range(N.q[1] + b * QS, 512);
            if (b % 2 == 0) {
                pf_range(N.d[0] + b * DS, 64);
                pf_range(N.d[1] + b * DS, 64);
            }
        }
        __m512i ia[2][GQT];
#pragma GCC unroll 12
        for (int j = 0; j < T; j++) {
            ia[0][j] = _mm512_set1_epi32(xc[(size_t)j * m->nb + b]);
            ia[1][j] = ia[0][j];
        }
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const __m512i w0 = _mm512_load_si512(q0 + 64 * k);
            const __m512i w1 = _mm512_load_si512(q1 + 64 * k);
#pragma GCC unroll 12
            for (int j = 0; j < T; j++) {
                const __m512i xb =
                    _mm512_set1_epi32(i32_at(xq + (size_t)j * m->xq_stride + b * 32 + 4 * k));
                ia[0][j] = _mm512_dpbusd_epi32(ia[0][j], w0, xb);
                ia[1][j] = _mm512_dpbusd_epi32(ia[1][j], w1, xb);
            }
        }
        const __m512 d0 =
            pk ? _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(S.d[0] + b * DS)))
               : _mm512_load_ps((const float *)(const void *)(S.d[0] + b * DS));
        const __m512 d1 =
            pk ? _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(S.d[1] + b * DS)))
               : _mm512_load_ps((const float *)(const void *)(S.d[1] + b * DS));
#pragma GCC unroll 12
        for (int j = 0; j < T; j++) {
            const __m512 dx = _mm512_set1_ps(xd[(size_t)j * m->nb + b]);
            const __m512 s0 = _mm512_cvtepi32_ps(ia[0][j]), s1 = _mm512_cvtepi32_ps(ia[1][j]);
            if (ord == ORD_REF_Q8) { /* sumf + sumi * (d_w * d_x) */
                fa[0][j] = _mm512_add_ps(fa[0][j], _mm512_mul_ps(s0, _mm512_mul_ps(d0, dx)));
                fa[1][j] = _mm512_add_ps(fa[1][j], _mm512_mul_ps(s1, _mm512_mul_ps(d1, dx)));
            } else if (ord == ORD_REF_Q4) { /* sumf + sumi * d_w * d_x */
                fa[0][j] = _mm512_add_ps(fa[0][j], _mm512_mul_ps(_mm512_mul_ps(s0, d0), dx));
                fa[1][j] = _mm512_add_ps(fa[1][j], _mm512_mul_ps(_mm512_mul_ps(s1, d1), dx));
            } else {
                fa[0][j] = _mm512_fmadd_ps(_mm512_mul_ps(s0, d0), dx, fa[0][j]);
                fa[1][j] = _mm512_fmadd_ps(_mm512_mul_ps(s1, d1), dx, fa[1][j]);
            }
        }
    }
    /* Each K chunk is summed from zero and then added to y: blockwise summation, which
     * keeps the f32 rounding error ~3x below one running sum over the whole row. */
#pragma GCC unroll 12
    for (int j = 0; j < T; j++) {
        float *yj = m->y + (size_t)(t + j) * n_out + r;
        if (ord == ORD_BLOCK && !first) {
            fa[0][j] = _mm512_add_ps(fa[0][j], _mm512_maskz_loadu_ps(m0, yj));
            fa[1][j] = _mm512_add_ps(fa[1][j], _mm512_maskz_loadu_ps(m1, yj + 16));
        }
        _mm512_mask_storeu_ps(yj, m0, fa[0][j]);
        _mm512_mask_storeu_ps(yj + 16, m1, fa[1][j]);
    }
}

#define Q_MICRO(T) q_micro(m, S, N, b0, kb, r, nr, t, b0 == 0, t == t0, pf_cur, ord, pk, T)

/* pk: the panels come from w->packed (Q8_0) instead of a repack per task. */
INL void q_gemm_t(const pe_mm *m, uint32_t r0, uint32_t r1, uint32_t t0, uint32_t t1, const int ord,
                  const int pk)
{
    _Alignas(64) qpanel P[2 * KB]; /* unused when pk */
    for (uint32_t b0 = 0; b0 < m->nb; b0 += KB) {
        const uint32_t kb = m->nb - b0 < KB ? m->nb - b0 : KB;
        for (uint32_t r = r0; r < r1; r += 32) {
            const uint32_t nr = r1 - r < 32 ? r1 - r : 32;
            qsrc S, N = {{NULL, NULL}, {NULL, NULL}};
            const int pf_cur = r == r0 && b0 == 0;
            if (pk) {
                S = qsrc_packed(m->w, r, nr, b0);
                /* the next panel: the next strip, or the next K chunk's first */
                if (r + 32 < r1)
                    N = qsrc_packed(m->w, r + 32, r1 - r - 32 < 32 ? r1 - r - 32 : 32, b0);
                else if (b0 + KB < m->nb)
                    N = qsrc_packed(m->w, r0, r1 - r0 < 32 ? r1 - r0 : 32, b0 + KB);
            } else {
                q_repack(m->w, r, nr, b0, kb, P);
                S = qsrc_panel(P);
            }
            /* tiles of at most GQT tokens, as even as possible: 8 = 4 + 4, not 6 + 2 */
            for (uint32_t t = t0; t < t1;) {
                const uint32_t left = t1 - t, n_tiles = (left + GQT - 1) / GQT;
                const uint32_t nt = (left + n_tiles - 1) / n_tiles;
                switch (nt) {
                case 1:
                    Q_MICRO(1);
                    break;
                case 2:
                    Q_MICRO(2);
                    break;
                case 3:
                    Q_MICRO(3);
                    break;
                case 4:
                    Q_MICRO(4);
                    break;
                case 5:
                    Q_MICRO(5);
                    break;
                default:
                    Q_MICRO(GQT);
                    break;
                }
                t += nt;
            }
        }
    }
}

TGT static void q_gemm(const pe_mm *m, uint32_t r0, uint32_t r1, uint32_t t0, uint32_t t1)
{
    if (m->w->packed)
        q_gemm_t(m, r0, r1, t0, t1, ORD_BLOCK, 1);
    else
        q_gemm_t(m, r0, r1, t0, t1, ORD_BLOCK, 0);
}

/* ---- small N: the products of a batched decode step ----
 * From pe__gemm_min_tok to PE_SMALL_N_TOK tokens (a serving step of 8-32 sequences) the
 * panels of q_gemm run with each element summed in the reference's order and rounding
 * (ORD_REF_*): y equals pe_matmul_ref bit for bit (test_quant_ref:
 * test_q_small_n_matches_ref), so within those steps a sequence's logits do not depend on
 * how many others share its step. It costs nothing measurable (cached 2048x2048, 1 thread,
 * 4-64 tokens: within the run-to-run noise of the blockwise order). What the step costs is
 * the repack: fitted over 8-32 tokens (q8_0, cached, 1 thread) 0.21 ms per call plus 0.018
 * ms per token, against 0.18 ms for the 1-token GEMV, so at 8 tokens 60% of the time goes
 * into repacking weights that each serve 8 tokens only. Prefetching the next panel into L2
 * and walking the panels strip by strip (32 sequential row streams) did not beat it from
 * memory (2048x8192, CPU time, 2 alternated runs of 5). Weights packed once at load
 * (pe_mat_pack) remove that cost: q_gemm_t then reads its panels from w->packed. */
TGT static void q_small_n(const pe_mm *m, uint32_t r0, uint32_t r1, uint32_t t0, uint32_t t1)
{
    if (m->w->type == PE_GGML_TYPE_Q4_0)
        q_gemm_t(m, r0, r1, t0, t1, ORD_REF_Q4, 0);
    else if (m->w->packed)
        q_gemm_t(m, r0, r1, t0, t1, ORD_REF_Q8, 1);
    else
        q_gemm_t(m, r0, r1, t0, t1, ORD_REF_Q8, 0);
}

/* ---- packed Q8_0 weights (pe_mat_pack) ----
 * The panels of q_repack made once, at load, for the whole matrix: group g (rows 16 g..)
 * holds the f16 scales of its rows for every block, then the values of every block as
 * qpanel.q (see pe__pk_group_bytes): as many bytes as the stored matrix, each group two
 * sequential streams. The GEMM and small-N kernels read their panels from it (q_gemm_t
 * pk), with the same arithmetic as on a repacked panel; the GEMV reads it too (pk_gemv),
 * so that the stored copy need not stay in memory. */

/* Writes the packed copy of Q8_0 matrix w into dst (pe_mat_packed_bytes). */
TGT void pe__q8_pack_avx512(const pe_mat *w, uint8_t *dst)
{
    const uint32_t nb = w->n_in / QK8_0, ng_all = (w->n_out + 15) / 16;
    const size_t rb = w->row_bytes, gb = pe__pk_group_bytes(nb);
    const size_t qo = ((size_t)nb * 32 + 63) / 64 * 64;
    const __m512i idx =
        _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm512_set1_epi32((int)rb));
    _Alignas(64) qpanel p;
    for (uint32_t g = 0; g < ng_all; g++) {
        const uint32_t ng = w->n_out - 16 * g < 16 ? w->n_out - 16 * g : 16;
        const uint8_t *base = (const uint8_t *)w->data + (size_t)g * 16 * rb;
        uint8_t *o = dst + (size_t)g * gb;
        memset(o + (size_t)nb * 32, 0, qo - (size_t)nb * 32);
        for (uint32_t b = 0; b < nb; b++) {
            const uint8_t *bb = base + (size_t)b * sizeof(block_q8_0);
            __m512i d = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mask16(ng), idx, bb, 1);
            _mm256_store_si256((__m256i *)(void *)(o + (size_t)b * 32), _mm512_cvtepi32_epi16(d));
            if (ng == 16)
                q8_group(bb, rb, 16, &p);
            else
                q8_group(bb, rb, ng, &p);
            memcpy(o + qo + (size_t)b * 512, p.q, 512);
        }
    }
}

/* G groups (16 G rows from r) x T tokens from t of a 1-2 token product on the packed copy,
 * in the order of q_tile, so that each output is bit-identical to gemv()'s on the stored
 * rows: q_tile's 8 lanes of a row (the 8 chunks of 4 values of each block) are 8 vectors
 * here, one per chunk, with the rows in the lanes; each is summed as q_tile sums its lane
 * (vpdpbusd from xc / 8, cvt, fma by d_w * d_x) and the 8 are added as hsum8 adds its
 * lanes. No horizontal sums, one dword broadcast per chunk and token, half the vpdpbusd of
 * q_tile (512-bit), and the values of each group stream front to back. */
INL void pk_tile(const pe_mm *m, uint32_t r, uint32_t r1, uint32_t t, const int G, const int T)
{
    const uint8_t *q[2], *d[2];
    __m512 acc[2][2][8]; /* [G][T][chunk] */
#pragma GCC unroll 2
    for (int g = 0; g < G; g++) {
        pk_group(m->w, r / 16 + (uint32_t)g, 0, &q[g], &d[g]);
#pragma GCC unroll 2
        for (int j = 0; j < T; j++)
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++)
                acc[g][j][k] = _mm512_setzero_ps();
    }
    for (uint32_t b = 0; b < m->nb; b++) {
        __m512i cv[2];
        __m512 sc[2][2];
        __m512 dw[2];
#pragma GCC unroll 2
        for (int g = 0; g < G; g++) {
            const uint8_t *qb = q[g] + (size_t)b * 512;
            pf_range(qb + PF_AHEAD, 512);
            if (b % 2 == 0) pf_range(d[g] + (size_t)b * 32 + PF_AHEAD / 16, 64);
            dw[g] = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(d[g] + (size_t)b * 32)));
        }
#pragma GCC unroll 2
        for (int j = 0; j < T; j++) {
            const size_t o = (size_t)(t + j) * m->nb + b;
            cv[j] = _mm512_set1_epi32(m->xc[o] >> 3);
            const __m512 dx = _mm512_set1_ps(m->xd[o]);
#pragma GCC unroll 2
            for (int g = 0; g < G; g++)
                sc[g][j] = _mm512_mul_ps(dw[g], dx);
        }
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            __m512i wv[2];
#pragma GCC unroll 2
            for (int g = 0; g < G; g++)
                wv[g] = _mm512_load_si512(q[g] + (size_t)b * 512 + 64 * k);
#pragma GCC unroll 2
            for (int j = 0; j < T; j++) {
                const __m512i xb = _mm512_set1_epi32(
                    i32_at(m->xq + (size_t)(t + j) * m->xq_stride + (size_t)b * 32 + 4 * k));
#pragma GCC unroll 2
                for (int g = 0; g < G; g++) {
                    const __m512i dot = _mm512_dpbusd_epi32(cv[j], wv[g], xb);
                    acc[g][j][k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), sc[g][j], acc[g][j][k]);
                }
            }
        }
    }
#pragma GCC unroll 2
    for (int g = 0; g < G; g++) {
        const uint32_t r_g = r + 16 * (uint32_t)g;
        const __mmask16 mk = mask16(r1 > r_g ? r1 - r_g : 0);
#pragma GCC unroll 2
        for (int j = 0; j < T; j++) {
            __m512 *a = acc[g][j]; /* hsum8: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) */
            const __m512 s0 = _mm512_add_ps(a[0], a[4]), s1 = _mm512_add_ps(a[1], a[5]);
            const __m512 s2 = _mm512_add_ps(a[2], a[6]), s3 = _mm512_add_ps(a[3], a[7]);
            const __m512 v = _mm512_add_ps(_mm512_add_ps(s0, s2), _mm512_add_ps(s1, s3));
            _mm512_mask_storeu_ps(m->y + (size_t)(t + j) * m->w->n_out + r_g, mk, v);
        }
    }
}

TGT __attribute__((noinline)) static void pk_tile_2_1(const pe_mm *m, uint32_t r, uint32_t r1,
                                                      uint32_t t)
{
    pk_tile(m, r, r1, t, 2, 1);
}

TGT __attribute__((noinline)) static void pk_tile_1_1(const pe_mm *m, uint32_t r, uint32_t r1,
                                                      uint32_t t)
{
    pk_tile(m, r, r1, t, 1, 1);
}

TGT __attribute__((noinline)) static void pk_tile_1_2(const pe_mm *m, uint32_t r, uint32_t r1,
                                                      uint32_t t)
{
    pk_tile(m, r, r1, t, 1, 2);
}

/* gemv() on the packed copy: rows [r0, r1) (r0 a multiple of 16, as ops.c's row claims are)
 * x tokens [t0, t1), 32 rows x 1 token or 16 rows x 2 tokens at a time. */
TGT static void pk_gemv(const pe_mm *m, uint32_t r0, uint32_t r1, uint32_t t0, uint32_t t1)
{
    for (uint32_t t = t0; t < t1;) {
        if (t1 - t >= 2) {
            for (uint32_t r = r0; r < r1; r += 16)
                pk_tile_1_2(m, r, r1, t);
            t += 2;
            continue;
        }
        uint32_t r = r0;
        for (; r + 16 < r1; r += 32)
            pk_tile_2_1(m, r, r1, t);
        if (r < r1) pk_tile_1_1(m, r, r1, t);
        t++;
    }
}

/* ---- GEMM: float panels ---- */

/* In place: r[i] (16 values of row i) becomes column i (value i of every row). */
INL void transpose16(__m512 r[16])
{
    __m512 t[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
        r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
    }
    __m512 o[16];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        __m512 a = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);
        __m512 b = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xdd);
        __m512 c = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
        __m512 d = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xdd);
        o[j] = _mm512_shuffle_f32x4(a, c, 0x88);
        o[8 + j] = _mm512_shuffle_f32x4(a, c, 0xdd);
        o[4 + j] = _mm512_shuffle_f32x4(b, d, 0x88);
        o[12 + j] = _mm512_shuffle_f32x4(b, d, 0xdd);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++)
        r[i] = o[i];
}

/* Repacks rows [r, r + nr) (nr <= 16 FG) x values [k0, k0 + kc) into P[kc][16 FG] f32. */
INL void f_repack_t(const pe_mat *w, uint32_t r, uint32_t nr, uint32_t k0, uint32_t kc, float *P,
                    const int type)
{
    for (uint32_t g = 0; g < FG; g++) {
        for (uint32_t k = 0; k < kc; k += 16) {
            const __mmask16 mk = mask16(kc - k);
            __m512 v[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) {
                uint32_t row = 16 * g + (uint32_t)i;
                v[i] = row < nr
                           ? f_load((const uint8_t *)w->data + (size_t)(r + row) * w->row_bytes,
                                    k0 + k, mk, type)
                           : _mm512_setzero_ps();
            }
            transpose16(v);
            const uint32_t nk = kc - k < 16 ? kc - k : 16;
            for (uint32_t i = 0; i < nk; i++)
                _mm512_store_ps(P + (size_t)(k + i) * 16 * FG + 16 * g, v[i]);
        }
    }
}

TGT static void f_repack(const pe_mat *w, uint32_t r, uint32_t nr, uint32_t k0, uint32_t kc,
                         float *P)
{
    if (w->type == PE_GGML_TYPE_F32)
        f_repack_t(w, r, nr, k0, kc, P, PE_GGML_TYPE_F32);
    else if (w->type == PE_GGML_TYPE_F16)
        f_repack_t(w, r, nr, k0, kc, P, PE_GGML_TYPE_F16);
    else
        f_repack_t(w, r, nr, k0, kc, P, PE_GGML_TYPE_BF16);
}

INL void f_micro(const pe_mm *m, const float *P, uint32_t k0, uint32_t kc, uint32_t r, uint32_t nr,
                 uint32_t t, int first, const int T)
{
    const uint32_t n_out = m->w->n_out, n_in = m->w->n_in;
    const float *x = m->x + (size_t)t * n_in + k0;
    __mmask16 mg[FG];
    __m512 fa[FG][GFT];
#pragma GCC unroll 4
    for (int g = 0; g < FG; g++)
        mg[g] = mask16(nr > 16u * g ? nr - 16u * g : 0);
#pragma GCC unroll 12
    for (int j = 0; j < T; j++)
#pragma GCC unroll 4
        for (int g = 0; g < FG; g++)
            fa[g][j] = _mm512_setzero_ps();
    for (uint32_t k = 0; k < kc; k++) {
        __m512 wv[FG];
#pragma GCC unroll 4
        for (int g = 0; g < FG; g++)
            wv[g] = _mm512_load_ps(P + (size_t)k * 16 * FG + 16 * g);
#pragma GCC unroll 12
        for (int j = 0; j < T; j++) {
            const __m512 xb = _mm512_set1_ps(x[(size_t)j * n_in + k]);
#pragma GCC unroll 4
            for (int g = 0; g < FG; g++)
                fa[g][j] = _mm512_fmadd_ps(wv[g], xb, fa[g][j]);
        }
    }
    /* blockwise summation over K chunks, as in q_micro */
#pragma GCC unroll 12
    for (int j = 0; j < T; j++) {
        float *yj = m->y + (size_t)(t + j) * n_out + r;
#pragma GCC unroll 4
        for (int g = 0; g < FG; g++) {
            __m512 v = fa[g][j];
            if (!first) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mg[g], yj + 16 * g));
            _mm512_mask_storeu_ps(yj + 16 * g, mg[g], v);
        }
    }
}

#define F_MICRO(T) f_micro(m, P, k0, kc, r, nr, t, k0 == 0, T)

TGT static void f_gemm(const pe_mm *m, uint32_t r0, uint32_t r1, uint32_t t0, uint32_t t1)
{
    _Alignas(64) float P[KC * 16 * FG];
    const uint32_t n_in = m->w->n_in;
    for (uint32_t k0 = 0; k0 < n_in; k0 += KC) {
        const uint32_t kc = n_in - k0 < KC ? n_in - k0 : KC;
        for (uint32_t r = r0; r < r1; r += 16 * FG) {
            const uint32_t nr = r1 - r < 16 * FG ? r1 - r : 16 * FG;
            f_repack(m->w, r, nr, k0, kc, P);
            uint32_t t = t0;
            for (; t + GFT <= t1; t += GFT)
                F_MICRO(GFT);
            switch (t1 - t) {
            case 0:
                break;
            case 1:
                F_MICRO(1);
                break;
            case 2:
                F_MICRO(2);
                break;
            case 3:
                F_MICRO(3);
                break;
            case 4:
                F_MICRO(4);
                break;
            case 5:
                F_MICRO(5);
                break;
            case 6:
                F_MICRO(6);
                break;
            case 7:
                F_MICRO(7);
                break;
            case 8:
                F_MICRO(8);
                break;
            case 9:
                F_MICRO(9);
                break;
            case 10:
                F_MICRO(10);
                break;
            default:
                F_MICRO(11);
                break;
            }
        }
    }
}

TGT static void rows_avx512(const pe_mm *m, uint32_t r0, uint32_t r1, uint32_t t0, uint32_t t1)
{
    if (t1 - t0 < pe__gemm_min_tok(&pe__kernels_avx512, m->w->type) && m->w->packed)
        pk_gemv(m, r0, r1, t0, t1);
    else if (t1 - t0 < pe__gemm_min_tok(&pe__kernels_avx512, m->w->type))
        gemv(m, r0, r1, t0, t1);
    else if (pe__type_is_quant(m->w->type) && t1 - t0 <= PE_SMALL_N_TOK)
        q_small_n(m, r0, r1, t0, t1);
    else if (pe__type_is_quant(m->w->type))
        q_gemm(m, r0, r1, t0, t1);
    else
        f_gemm(m, r0, r1, t0, t1);
}

/* Batch-invariant products (PE_MM_INVARIANT): the panel path at every token count, since
 * the GEMV tiles sum each block in 8 lanes and the panels in one, so the two round
 * differently. Within the panel path each element's order is fixed: blocks (values) in
 * order within K chunks of KB blocks (KC values) from 0, chunks added in order; tiles of
 * rows and tokens only choose which lane and register an element lives in. */
TGT static void rows_invariant_avx512(const pe_mm *m, uint32_t r0, uint32_t r1, uint32_t t0,
                                      uint32_t t1)
{
    if (pe__type_is_quant(m->w->type))
        q_gemm(m, r0, r1, t0, t1);
    else
        f_gemm(m, r0, r1, t0, t1);
}

/* ---- the types of issue 15: K-quants on Q8_K activations (GEMM) ----
 * The same panel scheme as Q8_0/Q4_0, per super-block of 256 values and group of 16 rows:
 * the values as unsigned bytes (Q4_K 0..15, Q5_K 0..31, Q6_K q + 32, Q2_K 0..3, Q3_K q + 4)
 * in chunks of 4 for vpdpbusd with the signed Q8_K activations, the integer sub-block
 * scales per row, and the weights of the activations' bsums (mins for Q4_K/Q5_K/Q2_K,
 * -offset * scale for Q6_K/Q3_K, whose offset the bsums take back out) for vpdpwssd. Per
 * (row, token) and super-block the kernel forms the reference's integers exactly, sumi =
 * sum_k scale_k * dot_k (+ the offset term) and summ = sum_k min_k * bsum_k, then runs the
 * reference's f32 statements on them in its order, the running sum living in y between
 * K chunks: each y[t][r] is bit-identical to pe__vec_dot_ext_ref. Bounds as ops_avx2.c:
 * every int32 sum stays below 2^31, a bsum pair product below 2^15 * 2^8.
 *
 *   panel, per super-block and group (5760 bytes):
 *       float d[16], dmin[16]; int16 bw[8][16][2]; int32 sc[16][16]; u8 q[64][16][4]
 *   micro-kernel (2 groups x up to 4 tokens): per 4 values 2 panel loads, T dword
 *   broadcasts, 2T vpdpbusd; per sub-block 2T vpmulld + add; per super-block 8 vpdpwssd
 *   and the f32 statements per accumulator. */

enum {
    KBK = 4, /* GEMM: super-blocks per K-quant panel (46 KB; 2: 23 KB was 5-15% slower) */
    KQT = 4, /* GEMM: tokens per K-quant micro-tile */
};

typedef struct kpanel {
    float d[16], dmin[16];
    int16_t bw[8][16][2]; /* [bsum pair][row]: weights of bsums 2p, 2p + 1 */
    int32_t sc[16][16];   /* [sub-block][row] */
    uint8_t q[64][64];    /* [chunk][row][4] */
} kpanel;

/* d[k] lane i = dword k of the 16 bytes at offset o of row i (zeros past the ng rows): the
 * 4x4 dword transposes of q4_group. */
INL void t16x4(const uint8_t *bb, size_t rb, uint32_t ng, size_t o, __m512i d[4])
{
    __m512i v[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        __m512i x = _mm512_castsi128_si512(q_row16(bb, rb, (uint32_t)j, ng, o));
        x = _mm512_inserti32x4(x, q_row16(bb, rb, (uint32_t)j + 4, ng, o), 1);
        x = _mm512_inserti32x4(x, q_row16(bb, rb, (uint32_t)j + 8, ng, o), 2);
        v[j] = _mm512_inserti32x4(x, q_row16(bb, rb, (uint32_t)j + 12, ng, o), 3);
    }
    const __m512i a0 = _mm512_unpacklo_epi32(v[0], v[1]), a1 = _mm512_unpackhi_epi32(v[0], v[1]);
    const __m512i a2 = _mm512_unpacklo_epi32(v[2], v[3]), a3 = _mm512_unpackhi_epi32(v[2], v[3]);
    d[0] = _mm512_unpacklo_epi64(a0, a2);
    d[1] = _mm512_unpackhi_epi64(a0, a2);
    d[2] = _mm512_unpacklo_epi64(a1, a3);
    d[3] = _mm512_unpackhi_epi64(a1, a3);
}

/* The w-bit field at bit b of each byte of v, moved to bit p (the rest 0). */
INL __m512i field8(__m512i v, const int b, const int p, const int w)
{
    const __m512i mk = _mm512_set1_epi8((char)(((1 << w) - 1) << p));
    if (b < p) v = _mm512_sllv_epi16(v, _mm512_set1_epi16((short)(p - b)));
    if (b > p) v = _mm512_srlv_epi16(v, _mm512_set1_epi16((short)(b - p)));
    return _mm512_and_si512(v, mk);
}

/* The scales of one super-block: s16[k] the scale of 16-value sub-block k (bytes, signed
 * for Q6_K/Q3_K), bw[k] the weight of bsums[k] (int16), d and dmin. */
INL void kv_scales(const int type, const uint8_t *b, __m128i *s16, __m256i *bw, float *d,
                   float *dmin)
{
    uint16_t hd = 0, hm = 0;
    switch (type) {
    case PE_GGML_TYPE_Q4_K:
    case PE_GGML_TYPE_Q5_K: { /* get_scale_min_k4 for all 8 at once, as ggml's AVX2 code,
                               * in the dword lanes (0..3: scales 0-3, 4-7, mins 0-3, 4-7) */
        const block_q4_K *b4 = (const block_q4_K *)(const void *)b;
        const __m128i q = _mm_maskz_loadu_epi8(0x0fff, b4->scales);
        __m128i lo = _mm_shuffle_epi32(q, _MM_SHUFFLE(2, 1, 2, 0));
        lo = _mm_and_si128(_mm_srlv_epi32(lo, _mm_setr_epi32(0, 0, 0, 4)),
                           _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
        __m128i hi = _mm_shuffle_epi32(q, _MM_SHUFFLE(1, 0, 0, 0));
        hi = _mm_and_si128(_mm_slli_epi32(_mm_srli_epi32(hi, 6), 4),
                           _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
        const __m128i v = _mm_or_si128(lo, hi);
        const __m128i dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
        *s16 = _mm_shuffle_epi8(v, dup);
        *bw = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(_mm_srli_si128(v, 8), dup));
        hd = b4->d, hm = b4->dmin;
        break;
    }
    case PE_GGML_TYPE_Q6_K: {
        const block_q6_K *b6 = (const block_q6_K *)(const void *)b;
        *s16 = _mm_loadu_si128((const __m128i *)(const void *)b6->scales);
        *bw = _mm256_slli_epi16(
            _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_cvtepi8_epi16(*s16)), 5);
        memcpy(&hd, &b6->d, 2);
        break;
    }
    case PE_GGML_TYPE_Q3_K: {
        const block_q3_K *b3 = (const block_q3_K *)(const void *)b;
        /* q3_k_scales in the dword lanes: low nibbles of aux0, aux1, then their high
         * nibbles, each with 2 bits of aux2 on top; then - 32 */
        const __m128i q = _mm_maskz_loadu_epi8(0x0fff, b3->scales);
        __m128i lo = _mm_shuffle_epi32(q, _MM_SHUFFLE(1, 0, 1, 0));
        lo = _mm_and_si128(_mm_srlv_epi32(lo, _mm_setr_epi32(0, 0, 4, 4)), _mm_set1_epi8(0x0f));
        __m128i hi = _mm_shuffle_epi32(q, _MM_SHUFFLE(2, 2, 2, 2));
        hi = _mm_and_si128(
            _mm_sllv_epi32(_mm_srlv_epi32(hi, _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi32(4)),
            _mm_set1_epi8(0x30));
        *s16 = _mm_sub_epi8(_mm_or_si128(lo, hi), _mm_set1_epi8(32));
        *bw = _mm256_slli_epi16(
            _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_cvtepi8_epi16(*s16)), 2);
        memcpy(&hd, &b3->d, 2);
        break;
    }
    default: {
        const block_q2_K *b2 = (const block_q2_K *)(const void *)b;
        const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)b2->scales);
        *s16 = _mm_and_si128(v, _mm_set1_epi8(0x0f));
        *bw = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0f)));
        memcpy(&hd, &b2->d, 2);
        memcpy(&hm, &b2->dmin, 2);
        break;
    }
    }
    *d = _cvtsh_ss(hd);
    *dmin = _cvtsh_ss(hm);
}

/* Values of 16 rows of one super-block of type (row i at sb + i * rb) into p. */
INL void k_group(const int type, const uint8_t *sb, size_t rb, uint32_t ng, kpanel *p)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512i d[4], h[2][4];
    switch (type) {
    case PE_GGML_TYPE_Q4_K:
    case PE_GGML_TYPE_Q5_K: {
        const int five = type == PE_GGML_TYPE_Q5_K;
        const size_t oq = five ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs);
        if (five) {
            t16x4(sb, rb, ng, offsetof(block_q5_K, qh), h[0]);
            t16x4(sb, rb, ng, offsetof(block_q5_K, qh) + 16, h[1]);
        }
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) { /* qs[16 i..]: values 64 j + 16 hh (+ 32: high nibbles) */
            const int j = i / 2, hh = i % 2;
            t16x4(sb, rb, ng, oq + 16 * (size_t)i, d);
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                __m512i lo = _mm512_and_si512(d[k], m4);
                __m512i hi = _mm512_and_si512(_mm512_srli_epi16(d[k], 4), m4);
                if (five) {
                    lo = _mm512_or_si512(lo, field8(h[hh][k], 2 * j, 4, 1));
                    hi = _mm512_or_si512(hi, field8(h[hh][k], 2 * j + 1, 4, 1));
                }
                _mm512_store_si512(p->q[16 * j + 4 * hh + k], lo);
                _mm512_store_si512(p->q[16 * j + 8 + 4 * hh + k], hi);
            }
        }
        break;
    }
    case PE_GGML_TYPE_Q6_K:
#pragma GCC unroll 2
        for (int c = 0; c < 2; c++) { /* ql[64 c + l]: values 128 c + l, 128 c + 64 + l */
            t16x4(sb, rb, ng, offsetof(block_q6_K, qh) + 32 * (size_t)c, h[0]);
            t16x4(sb, rb, ng, offsetof(block_q6_K, qh) + 32 * (size_t)c + 16, h[1]);
#pragma GCC unroll 4
            for (int pp = 0; pp < 4; pp++) {
                const int sl = 2 * (pp / 2);
                t16x4(sb, rb, ng, offsetof(block_q6_K, ql) + 64 * (size_t)c + 16 * (size_t)pp, d);
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++) {
                    const __m512i hq = h[pp % 2][k];
                    __m512i lo = _mm512_or_si512(_mm512_and_si512(d[k], m4), field8(hq, sl, 4, 2));
                    __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(d[k], 4), m4),
                                                 field8(hq, 4 + sl, 4, 2));
                    _mm512_store_si512(p->q[32 * c + 4 * pp + k], lo);
                    _mm512_store_si512(p->q[32 * c + 16 + 4 * pp + k], hi);
                }
            }
        }
        break;
    default: { /* Q2_K, Q3_K: qs[32 c + l] >> 2 j is value 128 c + 32 j + l */
        const int three = type == PE_GGML_TYPE_Q3_K;
        const size_t oq = three ? offsetof(block_q3_K, qs) : offsetof(block_q2_K, qs);
        if (three) {
            t16x4(sb, rb, ng, offsetof(block_q3_K, hmask), h[0]);
            t16x4(sb, rb, ng, offsetof(block_q3_K, hmask) + 16, h[1]);
        }
#pragma GCC unroll 2
        for (int c = 0; c < 2; c++) {
#pragma GCC unroll 2
            for (int hp = 0; hp < 2; hp++) {
                t16x4(sb, rb, ng, oq + 32 * (size_t)c + 16 * (size_t)hp, d);
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) {
#pragma GCC unroll 4
                    for (int k = 0; k < 4; k++) {
                        __m512i u = field8(d[k], 2 * j, 0, 2);
                        if (three) u = _mm512_or_si512(u, field8(h[hp][k], 4 * c + j, 2, 1));
                        _mm512_store_si512(p->q[32 * c + 8 * j + 4 * hp + k], u);
                    }
                }
            }
        }
        break;
    }
    }
    /* the scales: kv_scales of each row, then transposed to the row lanes (s16 in bytes
     * 0..15 of each row of sv, bw in 16..47); by row and scalar they took ~10% of q4_K's
     * GEMM */
    _Alignas(64) uint8_t sv[16][48];
    for (uint32_t i = 0; i < 16; i++) {
        __m128i s16 = _mm_setzero_si128();
        __m256i bw = _mm256_setzero_si256();
        float dd = 0.0f, dm = 0.0f;
        if (i < ng) kv_scales(type, sb + (size_t)i * rb, &s16, &bw, &dd, &dm);
        _mm_store_si128((__m128i *)(void *)sv[i], s16);
        _mm256_storeu_si256((__m256i *)(void *)(sv[i] + 16), bw);
        p->d[i] = dd;
        p->dmin[i] = dm;
    }
    const int nsub = type == PE_GGML_TYPE_Q4_K || type == PE_GGML_TYPE_Q5_K ? 8 : 16;
    const int w16 = type == PE_GGML_TYPE_Q2_K || type == PE_GGML_TYPE_Q3_K;
    __m512i t[4];
    t16x4(&sv[0][0], sizeof sv[0], 16, 0, t);
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
#pragma GCC unroll 4
        for (int b = 0; b < 4; b++) { /* byte b of dword k: 16-value sub-block 4 k + b */
            const int m16 = 4 * k + b;
            if (nsub == 8 && m16 % 2) continue; /* Q4_K, Q5_K: the scale of 32 values twice */
            __m512i v = _mm512_srai_epi32(_mm512_slli_epi32(t[k], 24 - 8 * b), 24);
            /* Q2_K, Q3_K: as the int16 pair (scale, 0) for vpdpwssd (see k_micro) */
            if (w16) v = _mm512_and_si512(v, _mm512_set1_epi32(0xffff));
            _mm512_store_si512(p->sc[nsub == 8 ? m16 / 2 : m16], v);
        }
    }
    t16x4(&sv[0][0], sizeof sv[0], 16, 16, t);
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++)
        _mm512_store_si512(p->bw[k], t[k]);
    t16x4(&sv[0][0], sizeof sv[0], 16, 32, t);
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++)
        _mm512_store_si512(p->bw[4 + k], t[k]);
}

/* Accumulates T tokens from t over super-blocks [s0, s0 + ks) of panel P into y (rows r,
 * nr): y continues the reference's running sum. */
INL void k_micro(const pe_ext_mm *m, const kpanel *P, uint32_t s0, uint32_t ks, uint32_t r,
                 uint32_t nr, uint32_t t, const int type, const int T)
{
    const int nsub = type == PE_GGML_TYPE_Q4_K || type == PE_GGML_TYPE_Q5_K ? 8 : 16;
    const int cps = 64 / nsub; /* chunks per sub-block */
    const int has_min = type != PE_GGML_TYPE_Q6_K && type != PE_GGML_TYPE_Q3_K;
    const int w16 = type == PE_GGML_TYPE_Q2_K || type == PE_GGML_TYPE_Q3_K;
    const uint32_t n_out = m->w->n_out;
    const __mmask16 m0 = mask16(nr), m1 = mask16(nr > 16 ? nr - 16 : 0);
    const size_t xs = m->xq_stride;
    const uint8_t *x0 = m->xq + (size_t)t * xs + (size_t)s0 * sizeof(block_q8_K);
    __m512 fa[2][KQT];
#pragma GCC unroll 4
    for (int j = 0; j < T; j++) {
        float *yj = m->y + (size_t)(t + j) * n_out + r;
        fa[0][j] = s0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m0, yj);
        fa[1][j] = s0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m1, yj + 16);
    }
    for (uint32_t s = 0; s < ks; s++) {
        const kpanel *p0 = &P[2 * s], *p1 = &P[2 * s + 1];
        const block_q8_K *xb0 = (const block_q8_K *)(const void *)x0 + s;
#define XJ(j) ((const block_q8_K *)(const void *)((const uint8_t *)xb0 + (size_t)(j)*xs))
        __m512i S[2][KQT], D[2][KQT];
#pragma GCC unroll 4
        for (int j = 0; j < T; j++)
            S[0][j] = S[1][j] = _mm512_setzero_si512();
#pragma GCC unroll 1
        for (int sb = 0; sb < nsub; sb++) {
#pragma GCC unroll 4
            for (int j = 0; j < T; j++)
                D[0][j] = D[1][j] = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int c = 0; c < cps; c++) {
                const int ch = sb * cps + c;
                const __m512i w0 = _mm512_load_si512(p0->q[ch]);
                const __m512i w1 = _mm512_load_si512(p1->q[ch]);
#pragma GCC unroll 4
                for (int j = 0; j < T; j++) {
                    const __m512i xb = _mm512_set1_epi32(i32_at(XJ(j)->qs + 4 * ch));
                    D[0][j] = _mm512_dpbusd_epi32(D[0][j], w0, xb);
                    D[1][j] = _mm512_dpbusd_epi32(D[1][j], w1, xb);
                }
            }
            const __m512i c0 = _mm512_load_si512(p0->sc[sb]), c1 = _mm512_load_si512(p1->sc[sb]);
#pragma GCC unroll 4
            for (int j = 0; j < T; j++) {
                if (w16) { /* |dot| <= 16 * 7 * 127: the int16 pair (dot, sign) times (sc, 0) */
                    S[0][j] = _mm512_dpwssd_epi32(S[0][j], D[0][j], c0);
                    S[1][j] = _mm512_dpwssd_epi32(S[1][j], D[1][j], c1);
                } else {
                    S[0][j] = _mm512_add_epi32(S[0][j], _mm512_mullo_epi32(D[0][j], c0));
                    S[1][j] = _mm512_add_epi32(S[1][j], _mm512_mullo_epi32(D[1][j], c1));
                }
            }
        }
        /* the bsums term: summ (Q4_K, Q5_K, Q2_K) or the offset's part of sumi */
#pragma GCC unroll 4
        for (int j = 0; j < T; j++)
            D[0][j] = D[1][j] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const __m512i b0 = _mm512_load_si512(p0->bw[k]), b1 = _mm512_load_si512(p1->bw[k]);
#pragma GCC unroll 4
            for (int j = 0; j < T; j++) {
                int32_t pair;
                memcpy(&pair, XJ(j)->bsums + 2 * k, 4);
                const __m512i xb = _mm512_set1_epi32(pair);
                D[0][j] = _mm512_dpwssd_epi32(D[0][j], b0, xb);
                D[1][j] = _mm512_dpwssd_epi32(D[1][j], b1, xb);
            }
        }
        const __m512 d0 = _mm512_load_ps(p0->d), d1 = _mm512_load_ps(p1->d);
        const __m512 n0 = _mm512_load_ps(p0->dmin), n1 = _mm512_load_ps(p1->dmin);
#pragma GCC unroll 4
        for (int j = 0; j < T; j++) {
            const __m512 dx = _mm512_set1_ps(XJ(j)->d);
            if (!has_min) {
                S[0][j] = _mm512_add_epi32(S[0][j], D[0][j]);
                S[1][j] = _mm512_add_epi32(S[1][j], D[1][j]);
            }
            /* sumf += (d_x * d) * sumi; sumf -= (d_x * dmin) * summ (dmin, summ 0 for
             * Q6_K, Q3_K: still subtracted, as the reference does) */
            fa[0][j] = _mm512_add_ps(
                fa[0][j], _mm512_mul_ps(_mm512_mul_ps(dx, d0), _mm512_cvtepi32_ps(S[0][j])));
            fa[1][j] = _mm512_add_ps(
                fa[1][j], _mm512_mul_ps(_mm512_mul_ps(dx, d1), _mm512_cvtepi32_ps(S[1][j])));
            const __m512 q0 = has_min ? _mm512_cvtepi32_ps(D[0][j]) : _mm512_setzero_ps();
            const __m512 q1 = has_min ? _mm512_cvtepi32_ps(D[1][j]) : _mm512_setzero_ps();
            fa[0][j] = _mm512_sub_ps(fa[0][j], _mm512_mul_ps(_mm512_mul_ps(dx, n0), q0));
            fa[1][j] = _mm512_sub_ps(fa[1][j], _mm512_mul_ps(_mm512_mul_ps(dx, n1), q1));
        }
#undef XJ
    }
#pragma GCC unroll 4
    for (int j = 0; j < T; j++) {
        float *yj = m->y + (size_t)(t + j) * n_out + r;
        _mm512_mask_storeu_ps(yj, m0, fa[0][j]);
        _mm512_mask_storeu_ps(yj + 16, m1, fa[1][j]);
    }
}

/* Rows [r0, r1) x tokens [t0, t1) of a K-quant product through panels of 32 rows x KBK
 * super-blocks. */
INL void k_gemm(const pe_ext_mm *m, uint32_t r0, uint32_t r1, uint32_t t0, uint32_t t1,
                const int type)
{
    _Alignas(64) kpanel P[2 * KBK];
    const pe_mat *w = m->w;
    const size_t rb = w->row_bytes, bsz = pe_ggml_get_traits((uint32_t)type)->type_size;
    const uint32_t nsb = w->n_in / QK_K;
    for (uint32_t s0 = 0; s0 < nsb; s0 += KBK) {
        const uint32_t ks = nsb - s0 < KBK ? nsb - s0 : KBK;
        for (uint32_t r = r0; r < r1; r += 32) {
            const uint32_t nr = r1 - r < 32 ? r1 - r : 32;
            for (uint32_t g = 0; g < 2; g++) {
                const uint32_t ng = nr > 16 * g ? (nr - 16 * g < 16 ? nr - 16 * g : 16) : 0;
                const uint8_t *base = (const uint8_t *)w->data + (size_t)(r + 16 * g) * rb;
                for (uint32_t s = 0; s < ks; s++) {
                    if (ng == 0)
                        memset(&P[2 * s + g], 0, sizeof P[0]);
                    else if (ng == 16) /* full groups get the row bounds folded away */
                        k_group(type, base + (size_t)(s0 + s) * bsz, rb, 16, &P[2 * s + g]);
                    else
                        k_group(type, base + (size_t)(s0 + s) * bsz, rb, ng, &P[2 * s + g]);
                }
            }
            /* tiles of at most KQT tokens, as even as possible */
            for (uint32_t t = t0; t < t1;) {
                const uint32_t left = t1 - t, n_tiles = (left + KQT - 1) / KQT;
                const uint32_t nt = (left + n_tiles - 1) / n_tiles;
                switch (nt) {
                case 1:
                    k_micro(m, P, s0, ks, r, nr, t, type, 1);
                    break;
                case 2:
                    k_micro(m, P, s0, ks, r, nr, t, type, 2);
                    break;
                case 3:
                    k_micro(m, P, s0, ks, r, nr, t, type, 3);
                    break;
                default:
                    k_micro(m, P, s0, ks, r, nr, t, type, KQT);
                    break;
                }
                t += nt;
            }
        }
    }
}

TGT __attribute__((noinline)) static void k_gemm_q4_k(const pe_ext_mm *m, uint32_t r0, uint32_t r1,
                                                      uint32_t t0, uint32_t t1)
{
    k_gemm(m, r0, r1, t0, t1, PE_GGML_TYPE_Q4_K);
}

TGT __attribute__((noinline)) static void k_gemm_q5_k(const pe_ext_mm *m, uint32_t r0, uint32_t r1,
                                                      uint32_t t0, uint32_t t1)
{
    k_gemm(m, r0, r1, t0, t1, PE_GGML_TYPE_Q5_K);
}

TGT __attribute__((noinline)) static void k_gemm_q2_k(const pe_ext_mm *m, uint32_t r0, uint32_t r1,
                                                      uint32_t t0, uint32_t t1)
{
    k_gemm(m, r0, r1, t0, t1, PE_GGML_TYPE_Q2_K);
}

TGT __attribute__((noinline)) static void k_gemm_q3_k(const pe_ext_mm *m, uint32_t r0, uint32_t r1,
                                                      uint32_t t0, uint32_t t1)
{
    k_gemm(m, r0, r1, t0, t1, PE_GGML_TYPE_Q3_K);
}

TGT __attribute__((noinline)) static void k_gemm_q6_k(const pe_ext_mm *m, uint32_t r0, uint32_t r1,
                                                      uint32_t t0, uint32_t t1)
{
    k_gemm(m, r0, r1, t0, t1, PE_GGML_TYPE_Q6_K);
}

/* ---- the types of issue 15: K-quants on Q8_K activations (GEMV) ----
 * Decode reads each weight once, so the values are unpacked in registers where they lie:
 * per super-block 4 vectors of 64 values in order (the nibbles, high bits and 2-bit fields
 * moved by per-half shifts), one vpdpbusd each with the token's 64 activations, whose
 * lanes (4 products, at most 4 * 63 * 127 < 2^15) vpdpwssd multiplies by the int16 pair
 * (scale, 0) of the lane's sub-block; the bsums term is one 256-bit vpdpwssd. The integer
 * sums are the reference's, and the f32 statements run per super-block in its order. */

/* 64 values [64 v, 64 v + 64) of a super-block as unsigned bytes (as k_group). */
INL __m512i kv_values(const int type, const uint8_t *b, const int v)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    switch (type) {
    case PE_GGML_TYPE_Q4_K:
    case PE_GGML_TYPE_Q5_K: { /* qs[32 v..]: low nibbles 64 v + l, high 64 v + 32 + l */
        const int five = type == PE_GGML_TYPE_Q5_K;
        const size_t oq = five ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs);
        const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + oq) + v));
        __m512i u =
            _mm512_and_si512(_mm512_srlv_epi16(q, _mm512_inserti64x4(_mm512_setzero_si512(),
                                                                     _mm256_set1_epi16(4), 1)),
                             m4);
        if (five) { /* bit 2 v (2 v + 1 in the high half) of qh[l] to bit 4 */
            const __m512i h = _mm512_broadcast_i64x4(
                _mm256_loadu_si256((const __m256i *)(b + offsetof(block_q5_K, qh))));
            const __m512i sh = _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * v)),
                                                  _mm256_set1_epi16((short)(2 * v + 1)), 1);
            u = _mm512_or_si512(
                u, _mm512_slli_epi16(
                       _mm512_and_si512(_mm512_srlv_epi16(h, sh), _mm512_set1_epi8(1)), 4));
        }
        return u;
    }
    case PE_GGML_TYPE_Q6_K: { /* ql[64 c..]: low nibbles 128 c + l, high 128 c + 64 + l */
        const int c = v / 2, hi = v % 2;
        __m512i u = _mm512_loadu_si512(b + offsetof(block_q6_K, ql) + 64 * c);
        u = _mm512_and_si512(hi ? _mm512_srli_epi16(u, 4) : u, m4);
        /* qh[32 c + l] bits 2 i, 2 i + 1 of value 128 c + 32 i + l, to bits 4, 5 */
        const __m512i h = _mm512_broadcast_i64x4(
            _mm256_loadu_si256((const __m256i *)(b + offsetof(block_q6_K, qh) + 32 * c)));
        const __m512i sh = _mm512_inserti64x4(_mm512_set1_epi16((short)(4 * hi)),
                                              _mm256_set1_epi16((short)(4 * hi + 2)), 1);
        const __m512i f = _mm512_and_si512(_mm512_srlv_epi16(h, sh), _mm512_set1_epi8(3));
        return _mm512_or_si512(u, _mm512_slli_epi16(f, 4));
    }
    default: { /* Q2_K, Q3_K: qs[32 c + l] >> 2 j is value 128 c + 32 j + l */
        const int three = type == PE_GGML_TYPE_Q3_K;
        const int c = v / 2, j0 = 2 * (v % 2);
        const size_t oq = three ? offsetof(block_q3_K, qs) : offsetof(block_q2_K, qs);
        const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + oq) + c));
        const __m512i sh = _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * j0)),
                                              _mm256_set1_epi16((short)(2 * j0 + 2)), 1);
        __m512i u = _mm512_and_si512(_mm512_srlv_epi16(q, sh), _mm512_set1_epi8(3));
        if (three) { /* bit 4 c + j of hmask[l] to bit 2 */
            const __m512i h = _mm512_broadcast_i64x4(
                _mm256_loadu_si256((const __m256i *)(b + offsetof(block_q3_K, hmask))));
            const __m512i hs = _mm512_inserti64x4(_mm512_set1_epi16((short)(4 * c + j0)),
                                                  _mm256_set1_epi16((short)(4 * c + j0 + 1)), 1);
            u = _mm512_or_si512(
                u, _mm512_slli_epi16(
                       _mm512_and_si512(_mm512_srlv_epi16(h, hs), _mm512_set1_epi8(1)), 2));
        }
        return u;
    }
    }
}

/* Lane i = the sum of the 8 lanes of v[i] (i < 4). */
INL __m128i hsum8x4i(const __m256i v[4])
{
    const __m256i ab = _mm256_hadd_epi32(v[0], v[1]), cd = _mm256_hadd_epi32(v[2], v[3]);
    const __m256i s = _mm256_hadd_epi32(ab, cd);
    return _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}

/* y[t + j][r] for T tokens of one row, 4 super-blocks at a time: their integer sums are
 * reduced together and their f32 products formed by vector, then added to the running sum
 * one by one in order (reducing each super-block alone took ~30% of the Q4_K GEMV). */
INL void kv_row(const pe_ext_mm *m, const uint8_t *row, uint32_t r, uint32_t t, const int type,
                const int T)
{
    const int has_min = type != PE_GGML_TYPE_Q6_K && type != PE_GGML_TYPE_Q3_K;
    const size_t bsz = pe_ggml_get_traits((uint32_t)type)->type_size;
    const uint32_t nsb = m->w->n_in / QK_K;
    float sumf[2] = {0.0f, 0.0f};
    for (uint32_t i0 = 0; i0 < nsb; i0 += 4) {
        const uint32_t nq = nsb - i0 < 4 ? nsb - i0 : 4;
        __m256i S[2][4], M[2][4];
        _Alignas(16) float d[4] = {0}, dmin[4] = {0}, xd[2][4] = {{0}};
        for (uint32_t q = 0; q < 4; q++) {
            if (q >= nq) {
#pragma GCC unroll 2
                for (int j = 0; j < T; j++)
                    S[j][q] = M[j][q] = _mm256_setzero_si256();
                continue;
            }
            const uint8_t *b = row + (size_t)(i0 + q) * bsz;
            pf_range(b + PF_AHEAD, bsz);
            __m128i s16;
            __m256i bw;
            kv_scales(type, b, &s16, &bw, &d[q], &dmin[q]);
            __m512i u[4], c[4];
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++) {
                u[v] = kv_values(type, b, v);
                /* lane i of values 64 v: sub-block 4 v + i / 4; the pair (scale, 0) */
                const __m128i sel =
                    _mm_add_epi8(_mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                                 _mm_set1_epi8((char)(4 * v)));
                c[v] = _mm512_and_si512(_mm512_cvtepi8_epi32(_mm_shuffle_epi8(s16, sel)),
                                        _mm512_set1_epi32(0xffff));
            }
#pragma GCC unroll 2
            for (int j = 0; j < T; j++) {
                const block_q8_K *x =
                    (const block_q8_K *)(const void *)(m->xq + (size_t)(t + j) * m->xq_stride) +
                    i0 + q;
                __m512i acc = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int v = 0; v < 4; v++) {
                    const __m512i D = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[v],
                                                          _mm512_loadu_si512(x->qs + 64 * v));
                    acc = _mm512_dpwssd_epi32(acc, D, c[v]);
                }
                const __m256i mm = _mm256_dpwssd_epi32(
                    _mm256_setzero_si256(), bw,
                    _mm256_loadu_si256((const __m256i *)(const void *)x->bsums));
                __m256i s8 = _mm256_add_epi32(_mm512_castsi512_si256(acc),
                                              _mm512_extracti64x4_epi64(acc, 1));
                if (!has_min) s8 = _mm256_add_epi32(s8, mm); /* the offset's part of sumi */
                S[j][q] = s8;
                M[j][q] = has_min ? mm : _mm256_setzero_si256();
                xd[j][q] = x->d;
            }
        }
        const __m128 dv = _mm_load_ps(d), nv = _mm_load_ps(dmin);
#pragma GCC unroll 2
        for (int j = 0; j < T; j++) {
            const __m128 xv = _mm_load_ps(xd[j]);
            /* (d_x * d) * sumi and (d_x * dmin) * summ (0 for Q6_K, Q3_K: still subtracted,
             * as the reference does) */
            _Alignas(16) float pa[4], pb[4];
            _mm_store_ps(pa, _mm_mul_ps(_mm_mul_ps(xv, dv), _mm_cvtepi32_ps(hsum8x4i(S[j]))));
            _mm_store_ps(pb, _mm_mul_ps(_mm_mul_ps(xv, nv), _mm_cvtepi32_ps(hsum8x4i(M[j]))));
            for (uint32_t q = 0; q < nq; q++) {
                sumf[j] += pa[q];
                sumf[j] -= pb[q];
            }
        }
    }
#pragma GCC unroll 2
    for (int j = 0; j < T; j++)
        m->y[(size_t)(t + j) * m->w->n_out + r] = sumf[j];
}

INL void kv_rows(const pe_ext_mm *m, uint32_t r, uint32_t t0, uint32_t t1, const int type)
{
    const uint8_t *row = (const uint8_t *)m->w->data + (size_t)r * m->w->row_bytes;
    uint32_t t = t0;
    for (; t + 2 <= t1; t += 2)
        kv_row(m, row, r, t, type, 2);
    if (t < t1) kv_row(m, row, r, t, type, 1);
}

/* Rows in 4 interleaved streams, each a contiguous quarter of [r0, r1), as walk(). */
INL void kv_gemv(const pe_ext_mm *m, uint32_t r0, uint32_t r1, uint32_t t0, uint32_t t1,
                 const int type)
{
    const uint32_t q = (r1 - r0) / 4;
    for (uint32_t i = 0; i < q; i++)
        for (uint32_t s = 0; s < 4; s++)
            kv_rows(m, r0 + s * q + i, t0, t1, type);
    for (uint32_t r = r0 + 4 * q; r < r1; r++)
        kv_rows(m, r, t0, t1, type);
}

TGT __attribute__((noinline)) static void ext_gemv(const pe_ext_mm *m, uint32_t r0, uint32_t r1,
                                                   uint32_t t0, uint32_t t1)
{
    switch (m->w->type) {
    case PE_GGML_TYPE_Q2_K:
        kv_gemv(m, r0, r1, t0, t1, PE_GGML_TYPE_Q2_K);
        break;
    case PE_GGML_TYPE_Q3_K:
        kv_gemv(m, r0, r1, t0, t1, PE_GGML_TYPE_Q3_K);
        break;
    case PE_GGML_TYPE_Q4_K:
        kv_gemv(m, r0, r1, t0, t1, PE_GGML_TYPE_Q4_K);
        break;
    case PE_GGML_TYPE_Q5_K:
        kv_gemv(m, r0, r1, t0, t1, PE_GGML_TYPE_Q5_K);
        break;
    case PE_GGML_TYPE_Q6_K:
        kv_gemv(m, r0, r1, t0, t1, PE_GGML_TYPE_Q6_K);
        break;
    default:
        PE_UNREACHABLE_TYPE(m->w->type);
    }
}

/* ---- the types of issue 15: Q4_1, Q5_0, Q5_1, IQ4_NL on Q8_1/Q8_0 activations (GEMM) ----
 * The panels of Q4_0, per 32-value block and group of 16 rows: the values as unsigned
 * bytes (Q4_1 0..15, Q5_1 0..31 as they are; Q5_0 q + 16, IQ4_NL q + 128, the accumulator
 * starting at -offset * the activations' block sum), the f32 scales d (and m). Per block
 * and (row, token) the reference's statements: sumf += (d_w * d_x) * sumi (+ m_w * s_x). */

enum {
    KB2 = 24, /* GEMM: blocks per Q4_1/Q5_0/Q5_1/IQ4_NL panel (30 KB) */
    BQT = 6,  /* GEMM: tokens per micro-tile */
};

typedef struct bpanel {
    float dw[16], mw[16];
    uint8_t q[8][64];
} bpanel;

INL size_t b_size(const int type)
{
    return type == PE_GGML_TYPE_Q4_1   ? sizeof(block_q4_1)
           : type == PE_GGML_TYPE_Q5_1 ? sizeof(block_q5_1)
           : type == PE_GGML_TYPE_Q5_0 ? sizeof(block_q5_0)
                                       : sizeof(block_iq4_nl);
}

INL int b_offset(const int type)
{
    return type == PE_GGML_TYPE_Q5_0 ? 16 : type == PE_GGML_TYPE_IQ4_NL ? 128 : 0;
}

/* The f16 at byte o of 16 rows (zeros past ng), as f32. */
INL __m512 f16_rows(const uint8_t *bb, size_t rb, uint32_t ng, size_t o)
{
    const __m512i idx =
        _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm512_set1_epi32((int)rb));
    const __m512i v =
        _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mask16(ng), idx, bb + o, 1);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
}

/* One block of 16 rows (row i at bb + i * rb) into p. */
INL void b_group(const int type, const uint8_t *bb, size_t rb, uint32_t ng, bpanel *p)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const int five = type == PE_GGML_TYPE_Q5_0 || type == PE_GGML_TYPE_Q5_1;
    const size_t oqs = type == PE_GGML_TYPE_Q4_1   ? offsetof(block_q4_1, qs)
                       : type == PE_GGML_TYPE_Q5_1 ? offsetof(block_q5_1, qs)
                       : type == PE_GGML_TYPE_Q5_0 ? offsetof(block_q5_0, qs)
                                                   : offsetof(block_iq4_nl, qs);
    _mm512_store_ps(p->dw, f16_rows(bb, rb, ng, 0));
    if (type == PE_GGML_TYPE_Q4_1 || type == PE_GGML_TYPE_Q5_1)
        _mm512_store_ps(p->mw, f16_rows(bb, rb, ng, 2));
    __m512i d[4], h = _mm512_setzero_si512();
    t16x4(bb, rb, ng, oqs, d);
    if (five) { /* the 32 high bits of each row, one dword lane per row */
        const size_t oh =
            type == PE_GGML_TYPE_Q5_0 ? offsetof(block_q5_0, qh) : offsetof(block_q5_1, qh);
        const __m512i idx = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32((int)rb));
        h = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mask16(ng), idx, bb + oh, 1);
    }
    /* nibble n -> the bytes 0x10 where bit b of n is set */
    const __m512i spread =
        _mm512_setr_epi32(0x00000000, 0x00000010, 0x00001000, 0x00001010, 0x00100000, 0x00100010,
                          0x00101000, 0x00101010, 0x10000000, 0x10000010, 0x10001000, 0x10001010,
                          0x10100000, 0x10100010, 0x10101000, 0x10101010);
    const __m512i tbl = _mm512_broadcast_i32x4(
        _mm_setr_epi8(1, 24, 45, 63, 79, 93, 106, 118, (char)129, (char)141, (char)153, (char)166,
                      (char)181, (char)197, (char)217, (char)241)); /* kvalues_iq4nl + 128 */
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        __m512i lo = _mm512_and_si512(d[k], m4);
        __m512i hi = _mm512_and_si512(_mm512_srli_epi16(d[k], 4), m4);
        if (five) { /* bits 4 k.. (values 4 k..) and 16 + 4 k.. (values 16 + 4 k..) */
            const __m512i nl = _mm512_and_si512(_mm512_srli_epi32(h, 4 * k), _mm512_set1_epi32(15));
            const __m512i nh =
                _mm512_and_si512(_mm512_srli_epi32(h, 16 + 4 * k), _mm512_set1_epi32(15));
            lo = _mm512_or_si512(lo, _mm512_permutexvar_epi32(nl, spread));
            hi = _mm512_or_si512(hi, _mm512_permutexvar_epi32(nh, spread));
        }
        if (type == PE_GGML_TYPE_IQ4_NL) {
            lo = _mm512_shuffle_epi8(tbl, lo);
            hi = _mm512_shuffle_epi8(tbl, hi);
        }
        _mm512_store_si512(p->q[k], lo);
        _mm512_store_si512(p->q[k + 4], hi);
    }
}

/* Accumulates T tokens from t over blocks [b0, b0 + kb) of panel P into y (rows r, nr):
 * y continues the reference's running sum. */
INL void b_micro(const pe_ext_mm *m, const bpanel *P, uint32_t b0, uint32_t kb, uint32_t r,
                 uint32_t nr, uint32_t t, const int type, const int T)
{
    const int q8_1 = type == PE_GGML_TYPE_Q4_1 || type == PE_GGML_TYPE_Q5_1;
    const int off = b_offset(type);
    const size_t xbs = q8_1 ? sizeof(block_q8_1) : sizeof(block_q8_0);
    const size_t xqo = q8_1 ? offsetof(block_q8_1, qs) : offsetof(block_q8_0, qs);
    const uint32_t n_out = m->w->n_out, nb = m->w->n_in / 32;
    const size_t xs = m->xq_stride;
    const uint8_t *x0 = m->xq + (size_t)t * xs + (size_t)b0 * xbs;
    const __mmask16 m0 = mask16(nr), m1 = mask16(nr > 16 ? nr - 16 : 0);
    __m512 fa[2][BQT];
#pragma GCC unroll 6
    for (int j = 0; j < T; j++) {
        float *yj = m->y + (size_t)(t + j) * n_out + r;
        fa[0][j] = b0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m0, yj);
        fa[1][j] = b0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m1, yj + 16);
    }
    for (uint32_t b = 0; b < kb; b++) {
        const bpanel *p0 = &P[2 * b], *p1 = &P[2 * b + 1];
        const uint8_t *xb = x0 + (size_t)b * xbs;
        __m512i ia[2][BQT];
#pragma GCC unroll 6
        for (int j = 0; j < T; j++) {
            ia[0][j] = off ? _mm512_set1_epi32(-off * m->xsum[(size_t)(t + j) * nb + b0 + b])
                           : _mm512_setzero_si512();
            ia[1][j] = ia[0][j];
        }
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const __m512i w0 = _mm512_load_si512(p0->q[k]);
            const __m512i w1 = _mm512_load_si512(p1->q[k]);
#pragma GCC unroll 6
            for (int j = 0; j < T; j++) {
                const __m512i xv =
                    _mm512_set1_epi32(i32_at((const int8_t *)(xb + (size_t)j * xs + xqo) + 4 * k));
                ia[0][j] = _mm512_dpbusd_epi32(ia[0][j], w0, xv);
                ia[1][j] = _mm512_dpbusd_epi32(ia[1][j], w1, xv);
            }
        }
        const __m512 d0 = _mm512_load_ps(p0->dw), d1 = _mm512_load_ps(p1->dw);
#pragma GCC unroll 6
        for (int j = 0; j < T; j++) {
            uint16_t hd[2];
            memcpy(hd, xb + (size_t)j * xs, sizeof hd); /* d (and s) lead both blocks */
            const __m512 dx = _mm512_set1_ps(_cvtsh_ss(hd[0]));
            __m512 t0 = _mm512_mul_ps(_mm512_mul_ps(d0, dx), _mm512_cvtepi32_ps(ia[0][j]));
            __m512 t1 = _mm512_mul_ps(_mm512_mul_ps(d1, dx), _mm512_cvtepi32_ps(ia[1][j]));
            if (q8_1) {
                const __m512 sx = _mm512_set1_ps(_cvtsh_ss(hd[1]));
                t0 = _mm512_add_ps(t0, _mm512_mul_ps(_mm512_load_ps(p0->mw), sx));
                t1 = _mm512_add_ps(t1, _mm512_mul_ps(_mm512_load_ps(p1->mw), sx));
            }
            fa[0][j] = _mm512_add_ps(fa[0][j], t0);
            fa[1][j] = _mm512_add_ps(fa[1][j], t1);
        }
    }
#pragma GCC unroll 6
    for (int j = 0; j < T; j++) {
        float *yj = m->y + (size_t)(t + j) * n_out + r;
        _mm512_mask_storeu_ps(yj, m0, fa[0][j]);
        _mm512_mask_storeu_ps(yj + 16, m1, fa[1][j]);
    }
}

INL void b_gemm(const pe_ext_mm *m, uint32_t r0, uint32_t r1, uint32_t t0, uint32_t t1,
                const int type)
{
    _Alignas(64) bpanel P[2 * KB2];
    const pe_mat *w = m->w;
    const size_t rb = w->row_bytes, bsz = b_size(type);
    const uint32_t nb = w->n_in / 32;
    for (uint32_t b0 = 0; b0 < nb; b0 += KB2) {
        const uint32_t kb = nb - b0 < KB2 ? nb - b0 : KB2;
        for (uint32_t r = r0; r < r1; r += 32) {
            const uint32_t nr = r1 - r < 32 ? r1 - r : 32;
            for (uint32_t g = 0; g < 2; g++) {
                const uint32_t ng = nr > 16 * g ? (nr - 16 * g < 16 ? nr - 16 * g : 16) : 0;
                const uint8_t *base = (const uint8_t *)w->data + (size_t)(r + 16 * g) * rb;
                for (uint32_t b = 0; b < kb; b++) {
                    if (ng == 0)
                        memset(&P[2 * b + g], 0, sizeof P[0]);
                    else if (ng == 16)
                        b_group(type, base + (size_t)(b0 + b) * bsz, rb, 16, &P[2 * b + g]);
                    else
                        b_group(type, base + (size_t)(b0 + b) * bsz, rb, ng, &P[2 * b + g]);
                }
            }
            for (uint32_t t = t0; t < t1;) {
                const uint32_t left = t1 - t, n_tiles = (left + BQT - 1) / BQT;
                const uint32_t nt = (left + n_tiles - 1) / n_tiles;
                switch (nt) {
                case 1:
                    b_micro(m, P, b0, kb, r, nr, t, type, 1);
                    break;
                case 2:
                    b_micro(m, P, b0, kb, r, nr, t, type, 2);
                    break;
                case 3:
                    b_micro(m, P, b0, kb, r, nr, t, type, 3);
                    break;
                case 4:
                    b_micro(m, P, b0, kb, r, nr, t, type, 4);
                    break;
                case 5:
                    b_micro(m, P, b0, kb, r, nr, t, type, 5);
                    break;
                default:
                    b_micro(m, P, b0, kb, r, nr, t, type, BQT);
                    break;
                }
                t += nt;
            }
        }
    }
}

TGT __attribute__((noinline)) static void b_gemm_q4_1(const pe_ext_mm *m, uint32_t r0, uint32_t r1,
                                                      uint32_t t0, uint32_t t1)
{
    b_gemm(m, r0, r1, t0, t1, PE_GGML_TYPE_Q4_1);
}

TGT __attribute__((noinline)) static void b_gemm_q5_0(const pe_ext_mm *m, uint32_t r0, uint32_t r1,
                                                      uint32_t t0, uint32_t t1)
{
    b_gemm(m, r0, r1, t0, t1, PE_GGML_TYPE_Q5_0);
}

TGT __attribute__((noinline)) static void b_gemm_q5_1(const pe_ext_mm *m, uint32_t r0, uint32_t r1,
                                                      uint32_t t0, uint32_t t1)
{
    b_gemm(m, r0, r1, t0, t1, PE_GGML_TYPE_Q5_1);
}

TGT __attribute__((noinline)) static void b_gemm_iq4_nl(const pe_ext_mm *m, uint32_t r0,
                                                        uint32_t r1, uint32_t t0, uint32_t t1)
{
    b_gemm(m, r0, r1, t0, t1, PE_GGML_TYPE_IQ4_NL);
}

/* ---- the types of issue 15: Q8_K activations ---- */

/* pe__quant_q8_k_ref by vector, bit for bit: the first value of largest |x| (a block with
 * a NaN goes to the reference, whose comparisons skip NaNs), iscale = -127 / max, each
 * value through nearest_int's 1.5 * 2^23 trick as the same f32 operations, capped at 127,
 * and the bsums as exact integer sums. */
TGT void pe__quant_q8_k_avx512(const float *x, block_q8_K *y, size_t n)
{
    const __m512i mant = _mm512_set1_epi32(0x007fffff), half = _mm512_set1_epi32(0x00400000);
    const __m512i cap = _mm512_set1_epi32(127);
    for (size_t i = 0; i < n / QK_K; i++, x += QK_K) {
        __m512 am = _mm512_setzero_ps();
        __mmask16 nan = 0;
        for (int k = 0; k < 16; k++) {
            const __m512 v = _mm512_loadu_ps(x + 16 * k);
            nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            am = _mm512_max_ps(am, _mm512_abs_ps(v));
        }
        if (nan) {
            pe__quant_q8_k_ref(x, &y[i], QK_K);
            continue;
        }
        const float amax = _mm512_reduce_max_ps(am);
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const __m512 av = _mm512_set1_ps(amax);
        int first = 0;
        for (int k = 0; k < 16; k++) {
            const __mmask16 eq =
                _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(x + 16 * k)), av, _CMP_EQ_OQ);
            if (eq) {
                first = 16 * k + __builtin_ctz(eq);
                break;
            }
        }
        const float iscale = -127.f / x[first];
        const __m512 is = _mm512_set1_ps(iscale), magic = _mm512_set1_ps(12582912.f);
        for (int k = 0; k < 16; k++) {
            const __m512 val = _mm512_add_ps(_mm512_mul_ps(is, _mm512_loadu_ps(x + 16 * k)), magic);
            __m512i v = _mm512_sub_epi32(_mm512_and_si512(_mm512_castps_si512(val), mant), half);
            v = _mm512_min_epi32(v, cap);
            y[i].bsums[k] = (int16_t)_mm512_reduce_add_epi32(v);
            _mm_storeu_si128((__m128i *)(void *)(y[i].qs + 16 * k), _mm512_cvtepi32_epi8(v));
        }
        y[i].d = 1 / iscale;
    }
}

/* pe__quant_q8_0_ref (q8_1 0) or pe__quant_q8_1_ref (1) by vector, bit for bit, as
 * quant_act: 16 blocks' d and 1/d per vector divide, roundf as round_away; a block with a
 * NaN goes to the reference (whose running max is not max_ps's). xsum (or NULL) gets the
 * sum of each block's values. */
TGT void pe__quant_q8_0_avx512(const float *x, void *y, size_t n, int q8_1, int32_t *xsum)
{
    const size_t nb = n / 32, bs = q8_1 ? sizeof(block_q8_1) : sizeof(block_q8_0);
    const size_t qo = q8_1 ? offsetof(block_q8_1, qs) : offsetof(block_q8_0, qs);
    for (size_t b0 = 0; b0 < nb; b0 += 16) {
        const uint32_t nj = nb - b0 < 16 ? (uint32_t)(nb - b0) : 16;
        _Alignas(64) float am[16] = {0}, dd[16], id[16];
        uint32_t nan = 0;
        for (uint32_t j = 0; j < nj; j++) {
            const float *xb = x + (b0 + j) * 32;
            const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
            if (_mm512_cmp_ps_mask(v0, v1, _CMP_UNORD_Q) |
                _mm512_cmp_ps_mask(v0, v0, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(v1, v1, _CMP_UNORD_Q))
                nan |= 1u << j;
            am[j] = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        }
        const __m512 d = _mm512_div_ps(_mm512_load_ps(am), _mm512_set1_ps(127.0f));
        const __mmask16 nz = _mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_NEQ_UQ);
        _mm512_store_ps(dd, d);
        _mm512_store_ps(id, _mm512_maskz_div_ps(nz, _mm512_set1_ps(1.0f), d));
        for (uint32_t j = 0; j < nj; j++) {
            const float *xb = x + (b0 + j) * 32;
            uint8_t *blk = (uint8_t *)y + (b0 + j) * bs;
            int32_t sum;
            if (nan & (1u << j)) {
                if (q8_1)
                    pe__quant_q8_1_ref(xb, (block_q8_1 *)(void *)blk, 32);
                else
                    pe__quant_q8_0_ref(xb, (block_q8_0 *)(void *)blk, 32);
                sum = 0;
                for (int k = 0; k < 32; k++)
                    sum += ((const int8_t *)blk)[qo + (size_t)k];
            } else {
                const __m512 idv = _mm512_set1_ps(id[j]);
                const __m128i q0 = _mm512_cvtepi32_epi8(
                    _mm512_cvttps_epi32(round_away(_mm512_mul_ps(_mm512_loadu_ps(xb), idv))));
                const __m128i q1 = _mm512_cvtepi32_epi8(
                    _mm512_cvttps_epi32(round_away(_mm512_mul_ps(_mm512_loadu_ps(xb + 16), idv))));
                /* the sum of the stored bytes, as the reference (an inf block has NaN
                 * products, whose int32 conversion the byte truncation wraps) */
                sum = _mm512_reduce_add_epi32(
                    _mm512_add_epi32(_mm512_cvtepi8_epi32(q0), _mm512_cvtepi8_epi32(q1)));
                /* F16C rounds like pe_f32_to_f16 (test_f16_matches_f16c) */
                const uint16_t h = _cvtss_sh(dd[j], _MM_FROUND_TO_NEAREST_INT);
                memcpy(blk, &h, 2);
                if (q8_1) {
                    const uint16_t s = _cvtss_sh((float)sum * dd[j], _MM_FROUND_TO_NEAREST_INT);
                    memcpy(blk + 2, &s, 2);
                }
                _mm_storeu_si128((__m128i *)(void *)(blk + qo), q0);
                _mm_storeu_si128((__m128i *)(void *)(blk + qo + 16), q1);
            }
            if (xsum) xsum[b0 + j] = sum;
        }
    }
}

/* ---- the types of issue 15: dispatch ---- */

int pe__ext_avx512_has(uint32_t type)
{
    switch (type) {
    case PE_GGML_TYPE_Q2_K:
    case PE_GGML_TYPE_Q3_K:
    case PE_GGML_TYPE_Q4_K:
    case PE_GGML_TYPE_Q5_K:
    case PE_GGML_TYPE_Q6_K:
    case PE_GGML_TYPE_Q4_1:
    case PE_GGML_TYPE_Q5_0:
    case PE_GGML_TYPE_Q5_1:
    case PE_GGML_TYPE_IQ4_NL:
        return 1;
    default:
        return 0;
    }
}

/* Measured (2048x1024, L2-resident, one thread; 2048x8192 from memory for the 32-value
 * types): the K-quant GEMV beats the panels at 2 tokens (q4_K 0.19 vs 0.34 ms), ties them
 * at 3 (q4_K 0.31 vs 0.32; q6_K, q3_K still 10-20% ahead, q2_K, q5_K behind); for Q4_1,
 * Q5_0, Q5_1 and IQ4_NL the panels beat the AVX2 row dots from 1 token (2048x1024: q4_1
 * 0.26 -> 0.12 ms, iq4_nl 0.19 -> 0.10; from memory 3.0-4.2 -> 2.1-2.6 ms), so their
 * decode runs the panel kernel with T = 1, 2. */
uint32_t pe__ext_gemm_min_tok(uint32_t type)
{
    switch (type) {
    case PE_GGML_TYPE_Q6_K:
    case PE_GGML_TYPE_Q3_K:
        return 4;
    case PE_GGML_TYPE_Q2_K:
    case PE_GGML_TYPE_Q4_K:
    case PE_GGML_TYPE_Q5_K:
        return 3;
    default:
        return 1;
    }
}

TGT void pe__ext_rows_avx512(const pe_ext_mm *m, uint32_t r0, uint32_t r1, uint32_t t0, uint32_t t1)
{
    const uint32_t type = m->w->type;
    if (t1 - t0 < pe__ext_gemm_min_tok(type)) {
        ext_gemv(m, r0, r1, t0, t1);
        return;
    }
    switch (type) {
    case PE_GGML_TYPE_Q4_K:
        k_gemm_q4_k(m, r0, r1, t0, t1);
        break;
    case PE_GGML_TYPE_Q6_K:
        k_gemm_q6_k(m, r0, r1, t0, t1);
        break;
    case PE_GGML_TYPE_Q5_K:
        k_gemm_q5_k(m, r0, r1, t0, t1);
        break;
    case PE_GGML_TYPE_Q2_K:
        k_gemm_q2_k(m, r0, r1, t0, t1);
        break;
    case PE_GGML_TYPE_Q3_K:
        k_gemm_q3_k(m, r0, r1, t0, t1);
        break;
    case PE_GGML_TYPE_Q4_1:
        b_gemm_q4_1(m, r0, r1, t0, t1);
        break;
    case PE_GGML_TYPE_Q5_0:
        b_gemm_q5_0(m, r0, r1, t0, t1);
        break;
    case PE_GGML_TYPE_Q5_1:
        b_gemm_q5_1(m, r0, r1, t0, t1);
        break;
    case PE_GGML_TYPE_IQ4_NL:
        b_gemm_iq4_nl(m, r0, r1, t0, t1);
        break;
    default:
        PE_UNREACHABLE_TYPE(type);
    }
}

/* ---- vector helpers ---- */

TGT static float dot_f32(const float *a, const float *b, uint32_t n)
{
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    uint32_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
    }
    for (; i < n; i += 16) {
        const __mmask16 mk = mask16(n - i);
        s0 =
            _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, a + i), _mm512_maskz_loadu_ps(mk, b + i), s0);
    }
    return hsum16(_mm512_add_ps(s0, s1));
}

TGT static void axpy_f32(float *y, float a, const float *x, uint32_t n)
{
    const __m512 av = _mm512_set1_ps(a);
    for (uint32_t i = 0; i < n; i += 16) {
        const __mmask16 mk = mask16(n - i);
        __m512 v =
            _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(mk, x + i), _mm512_maskz_loadu_ps(mk, y + i));
        _mm512_mask_storeu_ps(y + i, mk, v);
    }
}

TGT static void rmsnorm(float *out, const float *x, const float *w, uint32_t n, float eps)
{
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512d lo = _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
        __m512d hi = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8));
        s0 = _mm512_fmadd_pd(lo, lo, s0);
        s1 = _mm512_fmadd_pd(hi, hi, s1);
    }
    double ss = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
    for (; i < n; i++)
        ss += (double)x[i] * x[i];
    const float scale = 1.0f / sqrtf((float)(ss / n) + eps);
    const __m512 sv = _mm512_set1_ps(scale);
    for (i = 0; i < n; i += 16) {
        const __mmask16 mk = mask16(n - i);
        __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(mk, x + i), sv),
                                 _mm512_maskz_loadu_ps(mk, w + i));
        _mm512_mask_storeu_ps(out + i, mk, v);
    }
}

/* e^x for x <= 88.3 (Cephes expf: relative error < 2e-7); 0 below -87.3 where the result
 * would be subnormal. */
INL __m512 vexp(__m512 x)
{
    const __m512 lo = _mm512_set1_ps(-87.3f);
    const __mmask16 ok = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, lo), _mm512_set1_ps(88.3f));
    __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_scalef_ps(ok, y, fx);
}

TGT static void softmax(float *x, uint32_t n)
{
    if (n == 0) return;
    __m512 mv = _mm512_set1_ps(-INFINITY);
    for (uint32_t i = 0; i < n; i += 16)
        mv = _mm512_max_ps(mv, _mm512_mask_loadu_ps(mv, mask16(n - i), x + i));
    const float max = _mm512_reduce_max_ps(mv);
    const __m512 maxv = _mm512_set1_ps(max);
    __m512 sv = _mm512_setzero_ps();
    for (uint32_t i = 0; i < n; i += 16) {
        const __mmask16 mk = mask16(n - i);
        __m512 e = vexp(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, x + i), maxv));
        e = _mm512_maskz_mov_ps(mk, e);
        _mm512_mask_storeu_ps(x + i, mk, e);
        sv = _mm512_add_ps(sv, e);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sv));
    for (uint32_t i = 0; i < n; i += 16) {
        const __mmask16 mk = mask16(n - i);
        _mm512_mask_storeu_ps(x + i, mk, _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, x + i), inv));
    }
}

TGT static void swiglu(float *g, const float *u, size_t n)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 mk = mask16(n - i > 16 ? 16 : (uint32_t)(n - i));
        __m512 gv = _mm512_maskz_loadu_ps(mk, g + i);
        __m512 s =
            _mm512_div_ps(gv, _mm512_add_ps(one, vexp(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
        _mm512_mask_storeu_ps(g + i, mk, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(mk, u + i)));
    }
}

const pe_kernels pe__kernels_avx512 = {
    quant_act, rows_avx512, rows_invariant_avx512, dot_f32, axpy_f32, rmsnorm, softmax, swiglu,
};

#endif /* x86 */
