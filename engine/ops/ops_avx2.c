/* SPDX-License-Identifier: MIT */
/*
 * ops_avx2.c - AVX2/FMA/F16C kernels (pe_kernels for PE_ISA_AVX2, and PE_ISA_AVX2_VNNI:
 * the same with the quantized panels on AVX-VNNI), for x86 CPUs without AVX-512. Reached
 * through ops.c's dispatch only; every function is compiled with a target attribute, so the
 * library builds without -march flags and runs anywhere.
 *
 * Quantized products from pe__gemm_min_tok() tokens on (prefill) run on repacked panels
 * (see "GEMM: quantized panels" below), bit-identical to pe_matmul_ref. A Q8_0 matrix packed
 * at load (pe_mat_pack) is read from its packed copy at every token count (panels, and
 * "GEMV on the packed copy": decode, bit-identical to pe_matmul_ref too), so its stored
 * rows need not stay in memory. The others (decode,
 * float weights, the batch-invariant mode) work on the weights as stored (GGUF layout), a
 * tile of R rows x T tokens at a time: each weight block is loaded and unpacked once and
 * used for T tokens, each activation block once for R rows. Accumulators hold 8 partial
 * sums per (row, token), reduced once at the end of the row.
 *   Q8_0 x Q8_0: maddubs(|w|, sign(x, w)) then madd(1) = 8 int32 partial dots per block
 *                (|w| <= 128, |x| <= 127: a pair is at most 32512, no saturation).
 *   Q4_0 x Q8_0: maddubs(nibble, x) + the correction -8 * sum(x) / 8 per lane.
 *   then y += float(dot) * d_w * d_x per block (f32, like ggml).
 *   F32/F16/BF16: weights converted to f32 in registers, FMA with f32 activations.
 *   The types of issue 15 (pe__ext_rows_avx2, below): tiles of R rows x T tokens too,
 *   R * T <= 8, one f32 lane per (row, token) running the reference's statements; the
 *   K-quants (Q2_K..Q6_K) from 12 tokens on run on repacked panels instead (see "GEMM:
 *   K-quant panels": 16 rows x 2 super-blocks unpacked to bytes with the rows in the lanes,
 *   scales decoded once; maddubs in int16 runs + madd, or vpdpbusd + mullo on AVX-VNNI via
 *   pe__ext_rows_avx2_vnni), bit-identical to pe__vec_dot_ext_ref. Measured on a shared
 *   2-core AVX-512 machine, levels forced, against main in alternated runs: bench_matmul
 *   2048x8192, 512 tokens, 1 thread: q4_K 1.3-2.5x (avx2), 1.7-2.0x (avx2vnni), q6_K
 *   1.6x, 1.9x; bench_engine pp512 (1B Q4_K_M) 1.4-1.8x per CPU second (figures there).
 * Invariant: the integer part of every quantized dot is exact; the activation quantizer is
 * bit-identical to pe__quant_q8_0_ref.
 */
#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "ops_int.h"

/* clang contracts a * b + c into an FMA by default (-ffp-contract=on) where the target has
 * FMA, as every function here does: the f32 statements of the one-dot kernels below must
 * round as the reference's (clang-built test_quant_ref: q4_K off by 1 ulp without this).
 * GCC does not contract in C11 mode. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* Bytes ahead of the current position that GEMV prefetches in each row stream. */
#ifndef PF_AHEAD
#define PF_AHEAD 1024
#endif

#define TGT __attribute__((target("avx2,fma,f16c")))
#define TGTV __attribute__((target("avx2,fma,f16c,avxvnni")))
#define INL static inline __attribute__((always_inline)) TGT

INL float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INL int32_t hsum8i(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* GEMV prefetch, PF_AHEAD bytes ahead in each of the 4 row streams: see ops_avx512.c
 * (7.3 -> 15.5 GB/s on one thread there, with the stream layout of walk()). */
INL void pf_range(const uint8_t *p, size_t n)
{
    for (size_t l = 0; l < n; l += 64)
        _mm_prefetch((const char *)p + l, _MM_HINT_T1);
}

/* roundf(): to nearest, halfway cases away from zero (exact for |v| < 2^23). */
INL __m256 round_away(__m256 v)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));
    __m256 ge = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    __m256 one = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0f));
    return _mm256_add_ps(t, _mm256_and_ps(ge, one));
}

/* ---- activation quantization ---- */

/* Three passes (block maxima; d and 1/d for 8 blocks per vector divide; the values), so
 * that no long dependency chain runs through each block: see ops_avx512.c (2x there). d[]
 * holds the maxima and c[] the inverse scales (as floats) in between. */
TGT static void quant_act(const float *x, uint32_t n, int32_t off, int8_t *q, float *d, int32_t *c)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const uint32_t nb = n / QK8_0;
    for (uint32_t b = 0; b < nb; b++) {
        const float *xb = x + (size_t)b * QK8_0;
        __m256 m = _mm256_andnot_ps(sign, _mm256_loadu_ps(xb));
        for (int i = 1; i < 4; i++)
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + 8 * i)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        d[b] = _mm_cvtss_f32(m4);
    }
    uint32_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        const __m256 dd = _mm256_div_ps(_mm256_loadu_ps(d + b), _mm256_set1_ps(127.0f));
        const __m256 nz = _mm256_cmp_ps(dd, _mm256_setzero_ps(), _CMP_NEQ_UQ);
        const __m256 id = _mm256_and_ps(nz, _mm256_div_ps(_mm256_set1_ps(1.0f), dd));
        /* F16C rounds like pe_f32_to_f16 (test_f16_matches_f16c) */
        _mm256_storeu_ps(d + b, _mm256_cvtph_ps(_mm256_cvtps_ph(dd, _MM_FROUND_TO_NEAREST_INT)));
        _mm256_storeu_ps((float *)(void *)(c + b), id);
    }
    for (; b < nb; b++) {
        const float dd = d[b] / 127;
        const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
        d[b] = _cvtsh_ss(_cvtss_sh(dd, _MM_FROUND_TO_NEAREST_INT));
        memcpy(c + b, &id, sizeof id);
    }
    for (b = 0; b < nb; b++) {
        const float *xb = x + (size_t)b * QK8_0;
        const __m256 idv = _mm256_broadcast_ss((const float *)(const void *)(c + b));
        __m256i i32[4];
        for (int i = 0; i < 4; i++)
            i32[i] =
                _mm256_cvttps_epi32(round_away(_mm256_mul_ps(_mm256_loadu_ps(xb + 8 * i), idv)));
        __m256i sum =
            _mm256_add_epi32(_mm256_add_epi32(i32[0], i32[1]), _mm256_add_epi32(i32[2], i32[3]));
        c[b] = -off * hsum8i(sum);
        __m256i p16a = _mm256_packs_epi32(i32[0], i32[1]);
        __m256i p16b = _mm256_packs_epi32(i32[2], i32[3]);
        __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b), perm);
        _mm256_storeu_si256((__m256i *)(q + (size_t)b * QK8_0), p8);
    }
}

/* ---- quantized tiles ---- */

/* The 32 nibbles of a Q4_0 block as bytes 0..15, in value order: both lanes hold qs[0..15],
 * the high lane keeps the high nibbles. */
INL __m256i q4_nibbles(const uint8_t *qs)
{
    __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    v = _mm256_srlv_epi32(v, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
}

/* The f16 scales of blocks [0, n) (n <= 8) from blk (block stride bsz), as f32. A full
 * chunk by 8 scalar loads and word inserts, a partial one by a masked gather: a ymm gather
 * is a long microcoded sequence on AMD cores, and the GEMV tiles make 4 per 8 blocks (the
 * inserts with load8_ps below took the 1-token q8_0 tile from 19-22 to 27-39 GB/s on a
 * cached 2048x2048 matrix, 1 thread, Zen 5 at the AVX2 level). */
INL __m256 q_scales8(const uint8_t *blk, size_t bsz, uint32_t n)
{
    if (n == 8) {
        uint16_t h[8];
        for (int i = 0; i < 8; i++)
            memcpy(&h[i], blk + (size_t)i * bsz, 2);
        __m128i v = _mm_cvtsi32_si128(h[0]);
        v = _mm_insert_epi16(v, h[1], 1);
        v = _mm_insert_epi16(v, h[2], 2);
        v = _mm_insert_epi16(v, h[3], 3);
        v = _mm_insert_epi16(v, h[4], 4);
        v = _mm_insert_epi16(v, h[5], 5);
        v = _mm_insert_epi16(v, h[6], 6);
        v = _mm_insert_epi16(v, h[7], 7);
        return _mm256_cvtph_ps(v);
    }
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i idx = _mm256_mullo_epi32(lane, _mm256_set1_epi32((int)bsz));
    const __m256i on = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), lane);
    __m256i d = _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), (const int *)blk, idx, on, 1);
    d = _mm256_and_si256(d, _mm256_set1_epi32(0xffff));
    d = _mm256_permute4x64_epi64(_mm256_packus_epi32(d, d), 0x08);
    return _mm256_cvtph_ps(_mm256_castsi256_si128(d));
}

/* The first n (<= 8) floats / int32 at p, the other lanes 0: one load where n is 8 (every
 * chunk but a row's last), a masked load otherwise, never reading past p + n. (A memcpy
 * into a zeroed stack array cost a library call and a store-forwarding stall per chunk.) */
INL __m256i mask8(uint32_t n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

INL __m256 load8_ps(const float *p, uint32_t n)
{
    return n == 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, mask8(n));
}

INL __m256i load8_epi32(const int32_t *p, uint32_t n)
{
    return n == 8 ? _mm256_loadu_si256((const __m256i *)p)
                  : _mm256_maskload_epi32((const int *)p, mask8(n));
}

/* The start of a tile's chunk of 8 blocks from b8 (nj of them): prefetch of each row stream,
 * sc[i][j][k] = d_w * d_x of row i, token j, block k, and (when corr, as Q4_0 and the VNNI
 * tiles need) cs[j][k] = xc / 8, the activation's correction per lane. */
INL void q_chunk(const pe_mm *m, const uint8_t *w0, size_t rs, uint32_t b8, uint32_t nj, uint32_t t,
                 const int q4, const int corr, const int R, const int T, float sc[4][4][8],
                 int32_t cs[4][8])
{
    const size_t bsz = q4 ? sizeof(block_q4_0) : sizeof(block_q8_0);
    __m256 dw[4];
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
        pf_range(w0 + (size_t)i * rs + b8 * bsz + PF_AHEAD, 8 * bsz);
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
        dw[i] = q_scales8(w0 + (size_t)i * rs + b8 * bsz, bsz, nj);
#pragma GCC unroll 4
    for (int j = 0; j < T; j++) {
        const size_t o = (size_t)(t + j) * m->nb + b8;
        const __m256 dx = load8_ps(m->xd + o, nj);
        if (corr)
            _mm256_store_si256((__m256i *)cs[j], _mm256_srai_epi32(load8_epi32(m->xc + o, nj), 3));
#pragma GCC unroll 4
        for (int i = 0; i < R; i++)
            _mm256_store_ps(sc[i][j], _mm256_mul_ps(dw[i], dx));
    }
}

/* Each (row, token) sum of a tile's accumulators into y. */
INL void q_store(const pe_mm *m, __m256 acc[4][4], uint32_t r, uint32_t rstep, uint32_t t,
                 const int R, const int T)
{
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int j = 0; j < T; j++)
            m->y[(size_t)(t + j) * m->w->n_out + r + i * rstep] = hsum8(acc[i][j]);
}

/* y[t][r] for R rows from w0 (row stride rb) and T tokens from t. The scales d_w * d_x are
 * made 8 blocks at a time (q_chunk) and read back by broadcast FMAs, instead
 * of converting and broadcasting each f16 scale (as in ops_avx512.c, where this took a
 * q4_0 GEMV from 1.45 to 1.25 ns per row and block with L2-resident weights). */
INL void q_tile(const pe_mm *m, const uint8_t *w0, size_t rs, uint32_t r, uint32_t rstep,
                uint32_t t, const int q4, const int R, const int T)
{
    const size_t bsz = q4 ? sizeof(block_q4_0) : sizeof(block_q8_0);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[4][4];               /* [R][T]: fixed size so that it lives in registers */
    _Alignas(32) float sc[4][4][8]; /* [R][T][block]: d_w * d_x */
    _Alignas(32) int32_t cs[4][8];  /* [T][block]: Q4_0 correction per lane, xc / 8 */
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int j = 0; j < T; j++)
            acc[i][j] = _mm256_setzero_ps();
    for (uint32_t b8 = 0; b8 < m->nb; b8 += 8) {
        const uint32_t nj = m->nb - b8 < 8 ? m->nb - b8 : 8;
        q_chunk(m, w0, rs, b8, nj, t, q4, q4, R, T, sc, cs);
        for (uint32_t k = 0; k < nj; k++) {
            const uint32_t b = b8 + k;
            __m256i wv[4], aw[4];
#pragma GCC unroll 4
            for (int i = 0; i < R; i++) {
                const uint8_t *blk = w0 + (size_t)i * rs + b * bsz;
                if (q4) {
                    wv[i] = q4_nibbles(blk + 2);
                    aw[i] = wv[i];
                } else {
                    wv[i] = _mm256_loadu_si256((const __m256i *)(blk + 2));
                    aw[i] = _mm256_sign_epi8(wv[i], wv[i]);
                }
            }
#pragma GCC unroll 4
            for (int j = 0; j < T; j++) {
                __m256i xv = _mm256_loadu_si256(
                    (const __m256i *)(m->xq + (size_t)(t + j) * m->xq_stride + b * 32));
#pragma GCC unroll 4
                for (int i = 0; i < R; i++) {
                    __m256i dot;
                    if (q4) {
                        dot = _mm256_madd_epi16(_mm256_maddubs_epi16(wv[i], xv), ones);
                        dot = _mm256_add_epi32(dot, _mm256_set1_epi32(cs[j][k]));
                    } else {
                        __m256i sx = _mm256_sign_epi8(xv, wv[i]);
                        dot = _mm256_madd_epi16(_mm256_maddubs_epi16(aw[i], sx), ones);
                    }
                    acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot),
                                                _mm256_set1_ps(sc[i][j][k]), acc[i][j]);
                }
            }
        }
    }
    q_store(m, acc, r, rstep, t, R, T);
}

/* q_tile on AVX-VNNI (PE_ISA_AVX2_VNNI), as ops_avx512.c's: one vpdpbusd per block, row
 * and token instead of sign, sign, maddubs and madd. Q8_0 weights enter as q ^ 0x80 = q +
 * 128 and Q4_0 nibbles as q + 8 (unsigned), and each lane starts at the activation's
 * correction xc / 8 (-128 or -8 times the block's sum of x, over 8 lanes), so the block's
 * integer dot (the sum of the 8 lanes) is exact; the lanes themselves differ from q_tile's,
 * so the bits of this level's decode differ from the plain AVX2 level's (as every level's
 * do). */
static inline __attribute__((always_inline)) TGTV void
q_tile_vnni(const pe_mm *m, const uint8_t *w0, size_t rs, uint32_t r, uint32_t rstep, uint32_t t,
            const int q4, const int R, const int T)
{
    const size_t bsz = q4 ? sizeof(block_q4_0) : sizeof(block_q8_0);
    __m256 acc[4][4];               /* [R][T] */
    _Alignas(32) float sc[4][4][8]; /* [R][T][block]: d_w * d_x */
    _Alignas(32) int32_t cs[4][8];  /* [T][block]: correction per lane, xc / 8 */
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int j = 0; j < T; j++)
            acc[i][j] = _mm256_setzero_ps();
    for (uint32_t b8 = 0; b8 < m->nb; b8 += 8) {
        const uint32_t nj = m->nb - b8 < 8 ? m->nb - b8 : 8;
        q_chunk(m, w0, rs, b8, nj, t, q4, 1, R, T, sc, cs);
        for (uint32_t k = 0; k < nj; k++) {
            const uint32_t b = b8 + k;
            __m256i wv[4];
#pragma GCC unroll 4
            for (int i = 0; i < R; i++) {
                const uint8_t *blk = w0 + (size_t)i * rs + b * bsz;
                wv[i] = q4 ? q4_nibbles(blk + 2)
                           : _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 2)),
                                              _mm256_set1_epi8((char)0x80));
            }
#pragma GCC unroll 4
            for (int j = 0; j < T; j++) {
                const __m256i xv = _mm256_loadu_si256(
                    (const __m256i *)(m->xq + (size_t)(t + j) * m->xq_stride + b * 32));
                const __m256i cv = _mm256_set1_epi32(cs[j][k]);
#pragma GCC unroll 4
                for (int i = 0; i < R; i++) {
                    const __m256i dot = _mm256_dpbusd_avx_epi32(cv, wv[i], xv);
                    acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot),
                                                _mm256_set1_ps(sc[i][j][k]), acc[i][j]);
                }
            }
        }
    }
    q_store(m, acc, r, rstep, t, R, T);
}

/* ---- float tiles ---- */

/* 8 weights of row p at k, as f32. */
INL __m256 f_load(const uint8_t *p, uint32_t k, const int type)
{
    if (type == PE_GGML_TYPE_F32) return _mm256_loadu_ps((const float *)p + k);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + k));
    if (type == PE_GGML_TYPE_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

INL float f_at(const uint8_t *p, uint32_t k, const int type)
{
    if (type == PE_GGML_TYPE_F32) return ((const float *)p)[k];
    uint16_t h;
    memcpy(&h, p + 2 * (size_t)k, 2);
    return type == PE_GGML_TYPE_F16 ? pe_f16_to_f32(h) : pe_bf16_to_f32(h);
}

INL void f_tile(const pe_mm *m, const uint8_t *w0, size_t rs, uint32_t r, uint32_t rstep,
                uint32_t t, const int type, const int R, const int T)
{
    const uint32_t n = m->w->n_in;
    __m256 acc[4][4]; /* [R][T]: fixed size so that it lives in registers */
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int j = 0; j < T; j++)
            acc[i][j] = _mm256_setzero_ps();
    const size_t es = type == PE_GGML_TYPE_F32 ? 4 : 2;
    uint32_t k = 0;
    for (; k + 8 <= n; k += 8) {
        __m256 wv[4];
        if (k % 64 == 0)
#pragma GCC unroll 4
            for (int i = 0; i < R; i++)
                pf_range(w0 + (size_t)i * rs + k * es + PF_AHEAD, 64 * es);
#pragma GCC unroll 4
        for (int i = 0; i < R; i++)
            wv[i] = f_load(w0 + (size_t)i * rs, k, type);
#pragma GCC unroll 4
        for (int j = 0; j < T; j++) {
            __m256 xv = _mm256_loadu_ps(m->x + (size_t)(t + j) * n + k);
#pragma GCC unroll 4
            for (int i = 0; i < R; i++)
                acc[i][j] = _mm256_fmadd_ps(wv[i], xv, acc[i][j]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < R; i++) {
#pragma GCC unroll 4
        for (int j = 0; j < T; j++) {
            float s = hsum8(acc[i][j]);
            for (uint32_t kk = k; kk < n; kk++)
                s += f_at(w0 + (size_t)i * rs, kk, type) * m->x[(size_t)(t + j) * n + kk];
            m->y[(size_t)(t + j) * m->w->n_out + r + i * rstep] = s;
        }
    }
}

/* ---- tile drivers ---- */

/* The GEMV tile tables, walk() and gemv(): shared with the other ISA (ops_gemv.h); then
 * again as gemv_vnni, the AVX-VNNI level's, with q_tile_vnni for the quantized tiles. */
#define GEMV_TILE_T 2
#include "ops_gemv.h"
#undef TGT
#define TGT TGTV
#define GEMV_SFX _vnni
#define GEMV_QTILE q_tile_vnni
#include "ops_gemv.h"
#undef TGT
#define TGT __attribute__((target("avx2,fma,f16c")))

/* ---- GEMM: quantized panels ----
 * From pe__gemm_min_tok() tokens on, a Q8_0/Q4_0 task repacks 16 rows x one K chunk of KB
 * blocks at a time into an L1-resident panel with the rows in the vector lanes (two groups
 * of 8), so that each 4-byte chunk of activations is broadcast once for 8 rows and no
 * horizontal sums are needed:
 *
 *   panel, per block b and group g of 8 rows (288 bytes):
 *       float dw[8]            row scales
 *       u8    q[8][8][4]       chunk k (values 4k..4k+3) of each of the 8 rows
 *   Q8_0: the signed values (plain AVX2) or q ^ 0x80 = q + 128 (AVX-VNNI); Q4_0: the
 *   nibbles q + 8, both variants.
 *
 * The micro-kernel takes 2 groups x T tokens (T <= GT) of int32 block sums per chunk:
 *   AVX-VNNI:       vpdpbusd(acc, panel, x), acc starting at xc (-off * sum(x)): 1 op;
 *   AVX2, Q8_0:     madd(maddubs(|w|, sign(x, w)), 1) + acc (|w| <= 128, |x| <= 127, a
 *                   pair <= 32512: no saturation): 4 ops;
 *   AVX2, Q4_0:     maddubs(u, x) summed in int16 over the block's 8 chunks (8 x 2 x 15 x
 *                   127 = 30480 < 2^15), then one madd(1) and + xc: ~2 ops.
 * Then per (row, token) and block the reference's f32 statement, in its order and without
 * contraction: Q8_0 s += (float)sumi * (d_w * d_x), Q4_0 s += (float)sumi * d_w * d_x, the
 * running sum living in y between K chunks, so that every element is bit-identical to
 * pe_matmul_ref (and so batch-invariant).
 *
 * Measured on a shared 2-core AVX-512 machine (load 10-14) with the levels forced, against
 * main's GEMV tiles in the same runs: bench_matmul 2048x8192, 512 tokens, 1 thread, best of
 * 5: plain avx2 q8_0 37-41 GFLOP/s, q4_0 45-53 (tiles 14-22); avx2vnni q8_0 60-101, q4_0
 * 59-109 (avx512 panels 95-200). bench_engine pp512 of the 1B shape, 2 threads, f16 KV, 2
 * alternated runs, tokens/s (tokens per CPU second): q8_0 avx2 5.8-6.9 (17.8-19.2) ->
 * 10.5-12.4 (34.8-37.8), avx2vnni 24.3-25.4 (70.1-71.7); q4_0 avx2 6.8-7.7 (18.9-20.2) ->
 * 16.2-25.3 (51.5-54.1), avx2vnni 24.3-24.7 (75.6-86.8); avx512 43-51 (119-144).
 * Micro-tiles of 2 groups x 4 tokens; the K chunk of 32 blocks as in ops_avx512.c. */

enum {
    KB = 32, /* blocks of 32 values per panel: 2 x 32 x 288 = 18 KB */
    GT = 4,  /* tokens per micro-tile */
};

typedef struct apanel {
    float dw[8];
    uint8_t q[8][32];
} apanel; /* one block of one group of 8 rows */

/* The 32 bytes at o of row i of the group, or zeros past its ng rows. */
INL __m256i row32(const uint8_t *bb, size_t rb, uint32_t i, uint32_t ng, size_t o)
{
    return i < ng ? _mm256_loadu_si256((const __m256i *)(bb + (size_t)i * rb + o))
                  : _mm256_setzero_si256();
}

INL __m128i row16(const uint8_t *bb, size_t rb, uint32_t i, uint32_t ng, size_t o)
{
    return i < ng ? _mm_loadu_si128((const __m128i *)(bb + (size_t)i * rb + o))
                  : _mm_setzero_si128();
}

/* An 8x8 transpose of dwords: out[k] lane i = dword k of v[i] (row i, chunk k -> chunk k,
 * lane i). Shared by the Q8_0 and the K-quant panels. */
INL void tr8x8(const __m256i v[8], __m256i out[8])
{
    __m256i t[8], s[8];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
    }
    /* s[4h + c]: chunks c | c + 4 of rows 4h..4h+3 */
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        s[4 * h + 0] = _mm256_unpacklo_epi64(t[4 * h + 0], t[4 * h + 2]);
        s[4 * h + 1] = _mm256_unpackhi_epi64(t[4 * h + 0], t[4 * h + 2]);
        s[4 * h + 2] = _mm256_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
        s[4 * h + 3] = _mm256_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
    }
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        out[c] = _mm256_permute2x128_si256(s[c], s[4 + c], 0x20);
        out[c + 4] = _mm256_permute2x128_si256(s[c], s[4 + c], 0x31);
    }
}

/* Q8_0: the dword transpose (row i, chunk k -> q[k] lane i), xor flip. */
INL void q8_group8(const uint8_t *bb, size_t rb, uint32_t ng, __m256i flip, apanel *p)
{
    __m256i v[8], o[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        v[i] = row32(bb, rb, (uint32_t)i, ng, 2);
    tr8x8(v, o);
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++)
        _mm256_store_si256((__m256i *)p->q[k], _mm256_xor_si256(o[k], flip));
}

/* Q4_0: rows i | i + 4 in the two 128-bit lanes, a 4x4 dword transpose in each; dword k
 * holds the low nibbles of chunk k and the high nibbles of chunk k + 4. */
INL void q4_group8(const uint8_t *bb, size_t rb, uint32_t ng, apanel *p)
{
    const __m256i lo4 = _mm256_set1_epi8(0x0f);
    __m256i a[4], t[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        a[i] = _mm256_set_m128i(row16(bb, rb, (uint32_t)i + 4, ng, 2),
                                row16(bb, rb, (uint32_t)i, ng, 2));
    t[0] = _mm256_unpacklo_epi32(a[0], a[1]);
    t[1] = _mm256_unpackhi_epi32(a[0], a[1]);
    t[2] = _mm256_unpacklo_epi32(a[2], a[3]);
    t[3] = _mm256_unpackhi_epi32(a[2], a[3]);
    const __m256i d[4] = {_mm256_unpacklo_epi64(t[0], t[2]), _mm256_unpackhi_epi64(t[0], t[2]),
                          _mm256_unpacklo_epi64(t[1], t[3]), _mm256_unpackhi_epi64(t[1], t[3])};
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        _mm256_store_si256((__m256i *)p->q[k], _mm256_and_si256(d[k], lo4));
        _mm256_store_si256((__m256i *)p->q[k + 4],
                           _mm256_and_si256(_mm256_srli_epi16(d[k], 4), lo4));
    }
}

/* Repacks rows [r, r + nr) (nr <= 16) x blocks [b0, b0 + kb) into P[kb][2]; Q8_0 values
 * xor flip8 (0x80 for vpdpbusd, 0 for the signed maddubs path). */
TGT static void a_repack(const pe_mat *w, uint32_t r, uint32_t nr, uint32_t b0, uint32_t kb,
                         int flip8, apanel *P)
{
    const int q4 = w->type == PE_GGML_TYPE_Q4_0;
    const size_t bsz = q4 ? sizeof(block_q4_0) : sizeof(block_q8_0);
    const size_t rb = w->row_bytes;
    const __m256i flip = _mm256_set1_epi8((char)flip8);
    for (uint32_t g = 0; g < 2; g++) {
        const uint32_t ng = nr > 8 * g ? (nr - 8 * g < 8 ? nr - 8 * g : 8) : 0;
        const uint8_t *base = (const uint8_t *)w->data + (size_t)(r + 8 * g) * rb;
        for (uint32_t b = 0; b < kb; b++) {
            apanel *p = &P[2 * b + g];
            if (ng == 0) {
                memset(p, 0, sizeof *p);
                continue;
            }
            const uint8_t *bb = base + (size_t)(b0 + b) * bsz;
            _Alignas(16) uint16_t h[8] = {0};
            for (uint32_t i = 0; i < ng; i++)
                memcpy(&h[i], bb + (size_t)i * rb, 2);
            _mm256_store_ps(p->dw, _mm256_cvtph_ps(_mm_load_si128((const __m128i *)h)));
            /* full groups get the row bounds folded away */
            if (q4 && ng == 8)
                q4_group8(bb, rb, 8, p);
            else if (q4)
                q4_group8(bb, rb, ng, p);
            else if (ng == 8)
                q8_group8(bb, rb, 8, flip, p);
            else
                q8_group8(bb, rb, ng, flip, p);
        }
    }
}

/* Lane mask of the first n (<= 8) lanes. */
INL __m256i lanes(uint32_t n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* The panel source of the micro-kernels: pk 0, repacked panels P[2 b + g] (apanel); pk 1,
 * the packed copy of a Q8_0 matrix (pe_mat_pack, the layout of pe__pk_group_bytes): P the
 * values of block b0 of a group of 16 rows (512 bytes per block: chunk k, then rows), D its
 * f16 scales (16 per block), both indexed from b0 by bi. */
INL __m256i p_q(const void *P, const int pk, uint32_t bi, int g, int k)
{
    if (pk)
        return _mm256_load_si256((const __m256i *)(const void *)((const uint8_t *)P +
                                                                 (size_t)bi * 512 + 64 * k +
                                                                 32 * g));
    return _mm256_load_si256((const __m256i *)((const apanel *)P)[2 * bi + (uint32_t)g].q[k]);
}

INL __m256 p_d(const void *P, const void *D, const int pk, uint32_t bi, int g)
{
    if (pk)
        return _mm256_cvtph_ps(_mm_load_si128(
            (const __m128i *)(const void *)((const uint8_t *)D + (size_t)bi * 32 + 16 * g)));
    return _mm256_load_ps(((const apanel *)P)[2 * bi + (uint32_t)g].dw);
}

/* The running sums of T tokens from t, rows r.. (groups of 8, masks mk): 0 on the first K
 * chunk, else what the previous chunk left in y. A full group of 16 rows (full) uses plain
 * loads and stores: vmaskmovps is microcoded on AMD Zen (a store ~10x a plain one), and
 * bench_matmul q8_0 2048x8192 512 tokens spent ~7% of pa8_4's samples in it. */
INL void fa_load(const pe_mm *m, uint32_t r, uint32_t t, int first, int full, const __m256i mk[2],
                 __m256 fa[2][GT], const int T)
{
#pragma GCC unroll 4
    for (int j = 0; j < T; j++) {
        const float *yj = m->y + (size_t)(t + j) * m->w->n_out + r;
        if (first) {
            fa[0][j] = _mm256_setzero_ps();
            fa[1][j] = _mm256_setzero_ps();
        } else if (full) {
            fa[0][j] = _mm256_loadu_ps(yj);
            fa[1][j] = _mm256_loadu_ps(yj + 8);
        } else {
            fa[0][j] = _mm256_maskload_ps(yj, mk[0]);
            fa[1][j] = _mm256_maskload_ps(yj + 8, mk[1]);
        }
    }
}

INL void fa_store(const pe_mm *m, uint32_t r, uint32_t t, int full, const __m256i mk[2],
                  __m256 fa[2][GT], const int T)
{
#pragma GCC unroll 4
    for (int j = 0; j < T; j++) {
        float *yj = m->y + (size_t)(t + j) * m->w->n_out + r;
        if (full) {
            _mm256_storeu_ps(yj, fa[0][j]);
            _mm256_storeu_ps(yj + 8, fa[1][j]);
        } else {
            _mm256_maskstore_ps(yj, mk[0], fa[0][j]);
            _mm256_maskstore_ps(yj + 8, mk[1], fa[1][j]);
        }
    }
}

/* The reference's f32 statement of one block (bi from b0) for both groups and T tokens. */
INL void fa_block(const pe_mm *m, const void *P, const void *D, const int pk, uint32_t bi,
                  uint32_t t, uint32_t b, const int q4, __m256i ia[2][GT], __m256 fa[2][GT],
                  const int T)
{
    const __m256 d0 = p_d(P, D, pk, bi, 0), d1 = p_d(P, D, pk, bi, 1);
#pragma GCC unroll 4
    for (int j = 0; j < T; j++) {
        const __m256 dx = _mm256_broadcast_ss(m->xd + (size_t)(t + j) * m->nb + b);
        const __m256 s0 = _mm256_cvtepi32_ps(ia[0][j]), s1 = _mm256_cvtepi32_ps(ia[1][j]);
        if (q4) {
            fa[0][j] = _mm256_add_ps(fa[0][j], _mm256_mul_ps(_mm256_mul_ps(s0, d0), dx));
            fa[1][j] = _mm256_add_ps(fa[1][j], _mm256_mul_ps(_mm256_mul_ps(s1, d1), dx));
        } else {
            fa[0][j] = _mm256_add_ps(fa[0][j], _mm256_mul_ps(s0, _mm256_mul_ps(d0, dx)));
            fa[1][j] = _mm256_add_ps(fa[1][j], _mm256_mul_ps(s1, _mm256_mul_ps(d1, dx)));
        }
    }
}

/* The f32 pass of a micro-tile: the running sums of T tokens from t over blocks [b0, b0 +
 * kb) from the integer block sums is[b - b0], after the integer pass. Two passes, so that
 * neither holds both the int32 and the f32 accumulators (16 ymm registers): one pass with
 * both spilled the int32 sums of every chunk to the stack (GCC 12). */
INL void fa_blocks(const pe_mm *m, const void *P, const void *D, const int pk, uint32_t b0,
                   uint32_t kb, uint32_t r, uint32_t nr, uint32_t t, const int q4,
                   __m256i is[KB][2][GT], const int T)
{
    const __m256i mk[2] = {lanes(nr < 8 ? nr : 8), lanes(nr > 8 ? nr - 8 : 0)};
    __m256 fa[2][GT];
    fa_load(m, r, t, b0 == 0, nr == 16, mk, fa, T);
    for (uint32_t b = b0; b < b0 + kb; b++)
        fa_block(m, P, D, pk, b - b0, t, b, q4, is[b - b0], fa, T);
    fa_store(m, r, t, nr == 16, mk, fa, T);
}

/* The 4 activation bytes of chunk k of block b of token t + j, broadcast. */
INL __m256i x_chunk(const pe_mm *m, uint32_t t, int j, uint32_t b, int k)
{
    int32_t v;
    memcpy(&v, m->xq + (size_t)(t + j) * m->xq_stride + (size_t)b * 32 + 4 * k, 4);
    return _mm256_set1_epi32(v);
}

/* Keeps two accumulators in registers as they are: without it GCC 12 reassociates the
 * plain AVX2 sums of a block into a tree over all of its products, spilling them. */
INL void in_reg(__m256i *a, __m256i *b)
{
    __asm__("" : "+x"(*a), "+x"(*b));
}

/* Plain AVX2: accumulates T tokens from t over blocks [b0, b0 + kb) of P (pk: the packed
 * copy, whose values are q ^ 0x80: flipped back here) into y. */
INL void a_micro(const pe_mm *m, const void *P, const void *D, uint32_t b0, uint32_t kb, uint32_t r,
                 uint32_t nr, uint32_t t, const int q4, const int T, const int pk)
{
    const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
    _Alignas(32) __m256i is[KB][2][GT];
    for (uint32_t b = b0; b < b0 + kb; b++) {
        const uint32_t bi = b - b0;
        __m256i(*ia)[GT] = is[bi];
#pragma GCC unroll 4
        for (int j = 0; j < T; j++) {
            ia[0][j] = _mm256_setzero_si256();
            ia[1][j] = _mm256_setzero_si256();
        }
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            __m256i w0 = p_q(P, pk, bi, 0, k), w1 = p_q(P, pk, bi, 1, k);
            if (pk) {
                w0 = _mm256_xor_si256(w0, flip);
                w1 = _mm256_xor_si256(w1, flip);
            }
            if (q4) {
#pragma GCC unroll 4
                for (int j = 0; j < T; j++) {
                    const __m256i xb = x_chunk(m, t, j, b, k);
                    ia[0][j] = _mm256_add_epi16(ia[0][j], _mm256_maddubs_epi16(w0, xb));
                    ia[1][j] = _mm256_add_epi16(ia[1][j], _mm256_maddubs_epi16(w1, xb));
                    in_reg(&ia[0][j], &ia[1][j]);
                }
            } else {
                const __m256i a0 = _mm256_sign_epi8(w0, w0), a1 = _mm256_sign_epi8(w1, w1);
#pragma GCC unroll 4
                for (int j = 0; j < T; j++) {
                    const __m256i xb = x_chunk(m, t, j, b, k);
                    const __m256i p0s = _mm256_maddubs_epi16(a0, _mm256_sign_epi8(xb, w0));
                    const __m256i p1s = _mm256_maddubs_epi16(a1, _mm256_sign_epi8(xb, w1));
                    ia[0][j] = _mm256_add_epi32(ia[0][j], _mm256_madd_epi16(p0s, ones));
                    ia[1][j] = _mm256_add_epi32(ia[1][j], _mm256_madd_epi16(p1s, ones));
                    in_reg(&ia[0][j], &ia[1][j]);
                }
            }
        }
        if (q4) {
#pragma GCC unroll 4
            for (int j = 0; j < T; j++) {
                const __m256i xc = _mm256_set1_epi32(m->xc[(size_t)(t + j) * m->nb + b]);
                ia[0][j] = _mm256_add_epi32(_mm256_madd_epi16(ia[0][j], ones), xc);
                ia[1][j] = _mm256_add_epi32(_mm256_madd_epi16(ia[1][j], ones), xc);
            }
        }
    }
    fa_blocks(m, P, D, pk, b0, kb, r, nr, t, q4, is, T);
}

/* The same on AVX-VNNI: one vpdpbusd per chunk, row and token group; both types. */

static inline __attribute__((always_inline)) TGTV void
v_micro(const pe_mm *m, const void *P, const void *D, uint32_t b0, uint32_t kb, uint32_t r,
        uint32_t nr, uint32_t t, const int q4, const int T, const int pk)
{
    _Alignas(32) __m256i is[KB][2][GT];
    for (uint32_t b = b0; b < b0 + kb; b++) {
        const uint32_t bi = b - b0;
        __m256i(*ia)[GT] = is[bi];
#pragma GCC unroll 4
        for (int j = 0; j < T; j++) {
            ia[0][j] = _mm256_set1_epi32(m->xc[(size_t)(t + j) * m->nb + b]);
            ia[1][j] = ia[0][j];
        }
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const __m256i w0 = p_q(P, pk, bi, 0, k), w1 = p_q(P, pk, bi, 1, k);
#pragma GCC unroll 4
            for (int j = 0; j < T; j++) {
                const __m256i xb = x_chunk(m, t, j, b, k);
                ia[0][j] = _mm256_dpbusd_avx_epi32(ia[0][j], w0, xb);
                ia[1][j] = _mm256_dpbusd_avx_epi32(ia[1][j], w1, xb);
            }
        }
    }
    fa_blocks(m, P, D, pk, b0, kb, r, nr, t, q4, is, T);
}

/* One noinline function per (variant, type, T), as the GEMV tiles (ops_gemv.h). */
typedef void (*micro_fn)(const pe_mm *m, const void *P, const void *D, uint32_t b0, uint32_t kb,
                         uint32_t r, uint32_t nr, uint32_t t);

#define MICRO_FN(name, attr, call)                                                                 \
    attr __attribute__((noinline)) static void name(const pe_mm *m, const void *P, const void *D,  \
                                                    uint32_t b0, uint32_t kb, uint32_t r,          \
                                                    uint32_t nr, uint32_t t)                       \
    {                                                                                              \
        call;                                                                                      \
    }
#define MICRO_SET(pfx, attr, fn, q4, pk)                                                           \
    MICRO_FN(pfx##_1, attr, fn(m, P, D, b0, kb, r, nr, t, q4, 1, pk))                              \
    MICRO_FN(pfx##_2, attr, fn(m, P, D, b0, kb, r, nr, t, q4, 2, pk))                              \
    MICRO_FN(pfx##_3, attr, fn(m, P, D, b0, kb, r, nr, t, q4, 3, pk))                              \
    MICRO_FN(pfx##_4, attr, fn(m, P, D, b0, kb, r, nr, t, q4, 4, pk))                              \
    static const micro_fn pfx##_micro[GT] = {pfx##_1, pfx##_2, pfx##_3, pfx##_4};

MICRO_SET(a8, TGT, a_micro, 0, 0)
MICRO_SET(a4, TGT, a_micro, 1, 0)
MICRO_SET(v8, TGTV, v_micro, 0, 0)
MICRO_SET(v4, TGTV, v_micro, 1, 0)
MICRO_SET(pa8, TGT, a_micro, 0, 1) /* the packed copy (Q8_0) */
MICRO_SET(pv8, TGTV, v_micro, 0, 1)

#undef MICRO_SET
#undef MICRO_FN

/* The tiles of at most GT tokens of [t0, t1), as even as possible: 6 = 3 + 3, not 4 + 2. */
INL void tok_tiles(const micro_fn *micro, const pe_mm *m, const void *P, const void *D, uint32_t b0,
                   uint32_t kb, uint32_t r, uint32_t nr, uint32_t t0, uint32_t t1)
{
    for (uint32_t t = t0; t < t1;) {
        const uint32_t left = t1 - t, n_tiles = (left + GT - 1) / GT;
        const uint32_t nt = (left + n_tiles - 1) / n_tiles;
        micro[nt - 1](m, P, D, b0, kb, r, nr, t);
        t += nt;
    }
}

/* y[t][r] for rows [r0, r1) and tokens [t0, t1) of a Q8_0/Q4_0 product on panels. */
TGT static void q_gemm(const pe_mm *m, uint32_t r0, uint32_t r1, uint32_t t0, uint32_t t1, int vnni)
{
    const int q4 = m->w->type == PE_GGML_TYPE_Q4_0;
    const micro_fn *micro = vnni ? (q4 ? v4_micro : v8_micro) : (q4 ? a4_micro : a8_micro);
    _Alignas(32) apanel P[2 * KB];
    for (uint32_t b0 = 0; b0 < m->nb; b0 += KB) {
        const uint32_t kb = m->nb - b0 < KB ? m->nb - b0 : KB;
        for (uint32_t r = r0; r < r1; r += 16) {
            const uint32_t nr = r1 - r < 16 ? r1 - r : 16;
            a_repack(m->w, r, nr, b0, kb, vnni && !q4 ? 0x80 : 0, P);
            tok_tiles(micro, m, P, NULL, b0, kb, r, nr, t0, t1);
        }
    }
}

/* q_gemm on the packed copy of a Q8_0 matrix (w->packed), from pe__gemm_min_tok tokens on
 * (below, pk_gemv; bench_matmul 2048x8192 1 thread, 8 tokens: stored 4.10 ms vs packed 2.44,
 * AVX-VNNI 2.99 vs 1.54; bit-identical to pe_matmul_ref, as the stored GEMV tiles are not):
 * each group
 * of 16 rows (r0 a multiple of 16, as ops.c's row claims and tasks are) is read once, block
 * chunk after block chunk, as two sequential streams (scales, values), with no repack; its
 * running sums wait in y between the chunks. */
TGT static void q_gemm_pk(const pe_mm *m, uint32_t r0, uint32_t r1, uint32_t t0, uint32_t t1,
                          int vnni)
{
    const micro_fn *micro = vnni ? pv8_micro : pa8_micro;
    const size_t gb = pe__pk_group_bytes(m->nb), qo = ((size_t)m->nb * 32 + 63) / 64 * 64;
    for (uint32_t r = r0; r < r1; r += 16) {
        const uint32_t nr = r1 - r < 16 ? r1 - r : 16;
        const uint8_t *g = (const uint8_t *)m->w->packed + (size_t)(r / 16) * gb;
        for (uint32_t b0 = 0; b0 < m->nb; b0 += KB) {
            const uint32_t kb = m->nb - b0 < KB ? m->nb - b0 : KB;
            tok_tiles(micro, m, g + qo + (size_t)b0 * 512, g + (size_t)b0 * 32, b0, kb, r, nr, t0,
                      t1);
        }
    }
}

/* ---- GEMV on the packed copy (fewer than pe__gemm_min_tok tokens) ----
 * The decode products of a packed Q8_0 matrix read the packed copy too, so that the stored
 * rows need not stay in memory (weights.c releases them at every x86 level). A tile is G
 * groups of 16 rows x T tokens (2 x 1 or 1 x 2, as ops_avx512.c's pk_tile): per block, the
 * integer dot of each row comes whole (the 8 chunks of a half group summed in int32 lanes,
 * one row per lane: plain AVX2 madd(maddubs(|w|, sign(x, w)), 1) with w the packed byte ^
 * 0x80; AVX-VNNI vpdpbusd on the packed bytes from xc), then the reference's f32 statement
 * s += (float)sumi * (d_w * d_x), block after block: every output is bit-identical to
 * pe_matmul_ref, as q_gemm_pk's (the GEMV tiles on the stored rows sum each row in 8 lanes
 * and are not). The G groups are G streams read side by side, each prefetched PK_AHEAD
 * bytes ahead. Only 4 vector registers per group and token, so the tiles never spill
 * (one that kept q_tile's 8 lane sums per row needed 16 per group and token: it ran from
 * L1 at q_tile's speed but read memory at 17-20 GB/s on one thread against q_tile's 27-29,
 * bench_matmul --tok 1 2048x8192, Zen 5 at the AVX2 level). */

#ifndef PK_AHEAD
#define PK_AHEAD 2048
#endif

/* Rows 8 h.. of a group (values q of its block, 512 bytes: chunk k at 64 k, half h at 32 h)
 * against token x (32 int8 values): the whole block's int32 dot of each row, in its lane. */
INL __m256i pk_sum_plain(const uint8_t *q, int h, const int8_t *x, int32_t xc)
{
    (void)xc;
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    __m256i s = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        int32_t v;
        memcpy(&v, x + 4 * k, 4);
        const __m256i w = _mm256_xor_si256(
            _mm256_load_si256((const __m256i *)(const void *)(q + 64 * k + 32 * h)), flip);
        s = _mm256_add_epi32(
            s, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w),
                                                      _mm256_sign_epi8(_mm256_set1_epi32(v), w)),
                                 ones));
    }
    return s;
}

static inline __attribute__((always_inline)) TGTV __m256i pk_sum_vnni(const uint8_t *q, int h,
                                                                      const int8_t *x, int32_t xc)
{
    __m256i s = _mm256_set1_epi32(xc);
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        int32_t v;
        memcpy(&v, x + 4 * k, 4);
        s = _mm256_dpbusd_avx_epi32(
            s, _mm256_load_si256((const __m256i *)(const void *)(q + 64 * k + 32 * h)),
            _mm256_set1_epi32(v));
    }
    return s;
}

/* G groups from row r (r1 the range's end) x T tokens from t. One function per level
 * (ATTR, SUM) and shape. */
#define PK_TILE(NAME, ATTR, SUM, G, T)                                                             \
    ATTR __attribute__((noinline)) static void NAME(const pe_mm *m, uint32_t r, uint32_t rstep,    \
                                                    uint32_t r1, uint32_t t)                       \
    {                                                                                              \
        const size_t gb = pe__pk_group_bytes(m->nb), qo = ((size_t)m->nb * 32 + 63) / 64 * 64;     \
        const uint8_t *D[G];                                                                       \
        __m256 fa[G][T][2];                                                                        \
        _Pragma("GCC unroll 2") for (int g = 0; g < G; g++)                                        \
        {                                                                                          \
            D[g] = (const uint8_t *)m->w->packed + (size_t)((r + (uint32_t)g * rstep) / 16) * gb;  \
            _Pragma("GCC unroll 2") for (int j = 0; j < T; j++) fa[g][j][0] = fa[g][j][1] =        \
                _mm256_setzero_ps();                                                               \
        }                                                                                          \
        for (uint32_t b = 0; b < m->nb; b++) {                                                     \
            _Pragma("GCC unroll 2") for (int g = 0; g < G; g++)                                    \
            {                                                                                      \
                const uint8_t *q = D[g] + qo + (size_t)b * 512;                                    \
                pf_range(q + PK_AHEAD, 512);                                                       \
                if (b % 2 == 0) pf_range(D[g] + (size_t)b * 32 + PK_AHEAD / 16, 64);               \
                const __m256 d0 = _mm256_cvtph_ps(                                                 \
                    _mm_load_si128((const __m128i *)(const void *)(D[g] + (size_t)b * 32)));       \
                const __m256 d1 = _mm256_cvtph_ps(                                                 \
                    _mm_load_si128((const __m128i *)(const void *)(D[g] + (size_t)b * 32 + 16)));  \
                _Pragma("GCC unroll 2") for (int j = 0; j < T; j++)                                \
                {                                                                                  \
                    const size_t o = (size_t)(t + (uint32_t)j) * m->nb + b;                        \
                    const int8_t *x = m->xq + (size_t)(t + (uint32_t)j) * m->xq_stride + b * 32;   \
                    const __m256 dx = _mm256_set1_ps(m->xd[o]);                                    \
                    const __m256 s0 = _mm256_cvtepi32_ps(SUM(q, 0, x, m->xc[o]));                  \
                    const __m256 s1 = _mm256_cvtepi32_ps(SUM(q, 1, x, m->xc[o]));                  \
                    fa[g][j][0] =                                                                  \
                        _mm256_add_ps(fa[g][j][0], _mm256_mul_ps(s0, _mm256_mul_ps(d0, dx)));      \
                    fa[g][j][1] =                                                                  \
                        _mm256_add_ps(fa[g][j][1], _mm256_mul_ps(s1, _mm256_mul_ps(d1, dx)));      \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 2") for (int g = 0; g < G; g++)                                        \
            _Pragma("GCC unroll 2") for (int j = 0; j < T; j++)                                    \
                _Pragma("GCC unroll 2") for (uint32_t h = 0; h < 2; h++)                           \
        {                                                                                          \
            const uint32_t rh = r + (uint32_t)g * rstep + 8 * h;                                   \
            if (rh >= r1) continue;                                                                \
            float *y = m->y + (size_t)(t + (uint32_t)j) * m->w->n_out + rh;                        \
            if (r1 - rh >= 8)                                                                      \
                _mm256_storeu_ps(y, fa[g][j][h]);                                                  \
            else                                                                                   \
                _mm256_maskstore_ps(y, mask8(r1 - rh), fa[g][j][h]);                               \
        }                                                                                          \
    }

PK_TILE(pk_tile_2_1, TGT, pk_sum_plain, 2, 1)
PK_TILE(pk_tile_1_1, TGT, pk_sum_plain, 1, 1)
PK_TILE(pk_tile_1_2, TGT, pk_sum_plain, 1, 2)
PK_TILE(pk_tile_vnni_2_1, TGTV, pk_sum_vnni, 2, 1)
PK_TILE(pk_tile_vnni_1_1, TGTV, pk_sum_vnni, 1, 1)
PK_TILE(pk_tile_vnni_1_2, TGTV, pk_sum_vnni, 1, 2)
#undef PK_TILE

/* y[t][r] for rows [r0, r1) (r0 a multiple of 16, as ops.c's row claims are) and tokens
 * [t0, t1) on the packed copy: tokens 2 at a time (16 rows x 2 tokens), a last single one
 * 2 groups at a time, one from each half of the range, so that each thread reads two
 * streams (as walk() reads 4): with adjacent groups, one stream, 1B decode at the AVX2
 * level read 20% slower than the stored rows. */
#define PK_GEMV(NAME, ATTR, T21, T11, T12)                                                         \
    ATTR static void NAME(const pe_mm *m, uint32_t r0, uint32_t r1, uint32_t t0, uint32_t t1)      \
    {                                                                                              \
        const uint32_t ng = (r1 - r0 + 15) / 16, nh = ng / 2;                                      \
        for (uint32_t t = t0; t < t1;) {                                                           \
            if (t1 - t >= 2) {                                                                     \
                for (uint32_t r = r0; r < r1; r += 16)                                             \
                    T12(m, r, 0, r1, t);                                                           \
                t += 2;                                                                            \
                continue;                                                                          \
            }                                                                                      \
            for (uint32_t i = 0; i < nh; i++)                                                      \
                T21(m, r0 + 16 * i, 16 * nh, r1, t);                                               \
            if (ng % 2) T11(m, r0 + 16 * (ng - 1), 0, r1, t);                                      \
            t++;                                                                                   \
        }                                                                                          \
    }

PK_GEMV(pk_gemv, TGT, pk_tile_2_1, pk_tile_1_1, pk_tile_1_2)
PK_GEMV(pk_gemv_vnni, TGTV, pk_tile_vnni_2_1, pk_tile_vnni_1_1, pk_tile_vnni_1_2)
#undef PK_GEMV

/* Writes the packed copy of Q8_0 matrix w into dst (pe_mat_packed_bytes): the layout of
 * pe__pk_group_bytes, which pe__q8_pack_avx512 writes too, so that either ISA's kernels
 * read either's copy. Group halves of 8 rows get q8_group8's transpose. */
TGT void pe__q8_pack_avx2(const pe_mat *w, uint8_t *dst)
{
    const uint32_t nb = w->n_in / QK8_0, ng_all = (w->n_out + 15) / 16;
    const size_t rb = w->row_bytes, gb = pe__pk_group_bytes(nb);
    const size_t qo = ((size_t)nb * 32 + 63) / 64 * 64;
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    _Alignas(32) apanel p;
    for (uint32_t g = 0; g < ng_all; g++) {
        const uint32_t ng = w->n_out - 16 * g < 16 ? w->n_out - 16 * g : 16;
        const uint8_t *base = (const uint8_t *)w->data + (size_t)g * 16 * rb;
        uint8_t *o = dst + (size_t)g * gb;
        memset(o, 0, qo);
        for (uint32_t b = 0; b < nb; b++) {
            const uint8_t *bb = base + (size_t)b * sizeof(block_q8_0);
            for (uint32_t i = 0; i < ng; i++)
                memcpy(o + (size_t)b * 32 + 2 * i, bb + (size_t)i * rb, 2);
            for (uint32_t h = 0; h < 2; h++) {
                const uint32_t nh = ng > 8 * h ? (ng - 8 * h < 8 ? ng - 8 * h : 8) : 0;
                if (nh == 8)
                    q8_group8(bb + (size_t)8 * h * rb, rb, 8, flip, &p);
                else
                    q8_group8(bb + (size_t)8 * h * rb, rb, nh, flip, &p);
                if (nh < 8) /* rows past n_out: zero values, as pe__q8_pack_avx512 */
                    for (uint32_t k = 0; k < 8; k++)
                        for (uint32_t i = nh; i < 8; i++)
                            memset(p.q[k] + 4 * i, 0, 4);
                for (uint32_t k = 0; k < 8; k++)
                    memcpy(o + qo + (size_t)b * 512 + 64 * k + 32 * h, p.q[k], 32);
            }
        }
    }
}

/* The products: panels for quantized weights from pe__gemm_min_tok() tokens (read from the
 * packed copy where there is one), the GEMV tiles on the stored rows otherwise (and for
 * float weights). */
TGT static void rows_avx2(const pe_mm *m, uint32_t r0, uint32_t r1, uint32_t t0, uint32_t t1)
{
    const int panels =
        pe__type_is_quant(m->w->type) && t1 - t0 >= pe__gemm_min_tok(&pe__kernels_avx2, m->w->type);
    if (panels && m->w->packed)
        q_gemm_pk(m, r0, r1, t0, t1, 0);
    else if (panels)
        q_gemm(m, r0, r1, t0, t1, 0);
    else if (m->w->packed)
        pk_gemv(m, r0, r1, t0, t1);
    else
        gemv(m, r0, r1, t0, t1);
}

TGT static void rows_avx2_vnni(const pe_mm *m, uint32_t r0, uint32_t r1, uint32_t t0, uint32_t t1)
{
    const int panels = pe__type_is_quant(m->w->type) &&
                       t1 - t0 >= pe__gemm_min_tok(&pe__kernels_avx2_vnni, m->w->type);
    if (panels && m->w->packed)
        q_gemm_pk(m, r0, r1, t0, t1, 1);
    else if (panels)
        q_gemm(m, r0, r1, t0, t1, 1);
    else if (m->w->packed)
        pk_gemv_vnni(m, r0, r1, t0, t1);
    else
        gemv_vnni(m, r0, r1, t0, t1);
}

/* ---- vector helpers ---- */

TGT static float dot_f32(const float *a, const float *b, uint32_t n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum8(_mm256_add_ps(s0, s1));
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

TGT static void axpy_f32(float *y, float a, const float *x, uint32_t n)
{
    const __m256 av = _mm256_set1_ps(a);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] += a * x[i];
}

TGT static void rmsnorm(float *out, const float *x, const float *w, uint32_t n, float eps)
{
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256d lo = _mm256_cvtps_pd(_mm_loadu_ps(x + i));
        __m256d hi = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
        s0 = _mm256_fmadd_pd(lo, lo, s0);
        s1 = _mm256_fmadd_pd(hi, hi, s1);
    }
    double sd[4];
    _mm256_storeu_pd(sd, _mm256_add_pd(s0, s1));
    double ss = (sd[0] + sd[1]) + (sd[2] + sd[3]);
    for (; i < n; i++)
        ss += (double)x[i] * x[i];
    const float scale = 1.0f / sqrtf((float)(ss / n) + eps);
    const __m256 sv = _mm256_set1_ps(scale);
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), sv),
                                                _mm256_loadu_ps(w + i)));
    for (; i < n; i++)
        out[i] = (x[i] * scale) * w[i];
}

/* e^x for x <= 88.3 (Cephes expf: relative error < 2e-7); 0 below -87.3 where the result
 * would be subnormal. */
INL __m256 vexp(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(-87.3f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(88.3f));
    __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(under, y);
}

TGT static void softmax(float *x, uint32_t n)
{
    if (n == 0) return;
    uint32_t i = 0;
    float max = x[0];
    if (n >= 8) {
        __m256 mv = _mm256_loadu_ps(x);
        for (i = 8; i + 8 <= n; i += 8)
            mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + i));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        max = _mm_cvtss_f32(m4);
    }
    for (; i < n; i++)
        max = x[i] > max ? x[i] : max;
    const __m256 maxv = _mm256_set1_ps(max);
    __m256 sv = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 e = vexp(_mm256_sub_ps(_mm256_loadu_ps(x + i), maxv));
        _mm256_storeu_ps(x + i, e);
        sv = _mm256_add_ps(sv, e);
    }
    float sum = hsum8(sv);
    for (; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    const __m256 inv = _mm256_set1_ps(1.0f / sum);
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
    for (; i < n; i++)
        x[i] *= 1.0f / sum;
}

TGT static void swiglu(float *g, const float *u, size_t n)
{
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 e = vexp(_mm256_xor_ps(gv, sign));
        __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, e));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++)
        g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* ---- Q8_K activations (the K-quants' vec_dot_type) ----
 * pe__quant_q8_k_ref by vector, bit for bit, as pe__quant_q8_k_avx512 (ops_avx512.c): the
 * first value of the largest magnitude (a block with a NaN goes to the reference, whose
 * comparisons skip NaNs), iscale = -127 / max, each value through nearest_int's 1.5 * 2^23
 * trick as the same f32 operations, capped at 127, stored truncated to 8 bits as the
 * reference's cast, and the bsums as exact integer sums. 4.5% of a forced-AVX2 pp512 of
 * the 1B Q4_K_M shape ran in the scalar reference. */
TGT void pe__quant_q8_k_avx2(const float *x, block_q8_K *y, size_t n)
{
    const __m256i mant = _mm256_set1_epi32(0x007fffff), half = _mm256_set1_epi32(0x00400000);
    const __m256i cap = _mm256_set1_epi32(127), lo8 = _mm256_set1_epi32(0xff);
    const __m256 sign = _mm256_set1_ps(-0.0f), magic = _mm256_set1_ps(12582912.f);
    for (size_t i = 0; i < n / QK_K; i++, x += QK_K) {
        __m256 am = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
        for (int k = 0; k < QK_K / 8; k++) {
            const __m256 v = _mm256_loadu_ps(x + 8 * k);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            am = _mm256_max_ps(am, _mm256_andnot_ps(sign, v));
        }
        if (_mm256_movemask_ps(nan)) {
            pe__quant_q8_k_ref(x, &y[i], QK_K);
            continue;
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(am), _mm256_extractf128_ps(am, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const __m256 av = _mm256_set1_ps(amax);
        int first = 0;
        for (int k = 0; k < QK_K / 8; k++) {
            const int eq = _mm256_movemask_ps(
                _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8 * k)), av, _CMP_EQ_OQ));
            if (eq) {
                first = 8 * k + __builtin_ctz((unsigned)eq);
                break;
            }
        }
        const float iscale = -127.f / x[first];
        const __m256 is = _mm256_set1_ps(iscale);
        for (int k = 0; k < QK_K / 16; k++) {
            __m256i v[2];
            for (int h = 0; h < 2; h++) {
                const __m256 val =
                    _mm256_add_ps(_mm256_mul_ps(is, _mm256_loadu_ps(x + 16 * k + 8 * h)), magic);
                v[h] = _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(val), mant), half);
                v[h] = _mm256_min_epi32(v[h], cap);
            }
            y[i].bsums[k] = (int16_t)hsum8i(_mm256_add_epi32(v[0], v[1]));
            /* the low bytes, in order: no saturation in the packs of values <= 255 */
            const __m256i p = _mm256_permute4x64_epi64(
                _mm256_packus_epi32(_mm256_and_si256(v[0], lo8), _mm256_and_si256(v[1], lo8)),
                0xd8);
            _mm_storeu_si128(
                (__m128i *)(void *)(y[i].qs + 16 * k),
                _mm_packus_epi16(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1)));
        }
        y[i].d = 1 / iscale;
    }
}

/* ---- Q4_K, Q5_K and Q6_K x Q8_K (issue 15) ----
 * The integer part of each super-block on AVX2 (maddubs of the unsigned values with the
 * Q8_K activations, madd with the sub-block scales), then the same f32 statements as
 * pe__vec_dot_ext_ref: the result is bit-identical to it (test_quant_ref). Q6_K values are
 * used as q + 32 (unsigned), corrected by -32 * scale * bsum per 16-value sub-block. Bounds:
 * a maddubs pair is at most 2 * 63 * 127 = 16002 (no saturation); the int32 sums stay below
 * 2^31 (Q4_K: 8 * 63 * 32 * 15 * 127, Q6_K: 16 * 128 * 16 * 63 * 127). */

static void scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m)
{
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

TGT float pe__vec_dot_q4_k_avx2(const void *w, const void *xq, size_t n)
{
    const block_q4_K *b = w;
    const block_q8_K *x = xq;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    float sumf = 0.0f;
    for (size_t ib = 0; ib < n / QK_K; ib++) {
        uint8_t sc[8], mn[8];
        for (int k = 0; k < 8; k++)
            scale_min_k4(k, b[ib].scales, &sc[k], &mn[k]);
        __m256i acc = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(b[ib].qs + 32 * j));
            const __m256i lo = _mm256_and_si256(v, m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            const __m256i q0 = _mm256_loadu_si256((const __m256i *)(x[ib].qs + 64 * j));
            const __m256i q1 = _mm256_loadu_si256((const __m256i *)(x[ib].qs + 64 * j + 32));
            const __m256i p0 = _mm256_maddubs_epi16(lo, q0);
            const __m256i p1 = _mm256_maddubs_epi16(hi, q1);
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p0, _mm256_set1_epi16(sc[2 * j])));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p1, _mm256_set1_epi16(sc[2 * j + 1])));
        }
        int summ = 0;
        for (int k = 0; k < 8; k++)
            summ += mn[k] * (x[ib].bsums[2 * k] + x[ib].bsums[2 * k + 1]);
        const int sumi = hsum8i(acc);
        const float d = pe_f16_to_f32(b[ib].d), dmin = pe_f16_to_f32(b[ib].dmin);
        sumf += (x[ib].d * d) * (float)sumi;
        sumf -= (x[ib].d * dmin) * (float)summ;
    }
    return sumf;
}

TGT float pe__vec_dot_q5_k_avx2(const void *w, const void *xq, size_t n)
{
    const block_q5_K *b = w;
    const block_q8_K *x = xq;
    const __m256i m4 = _mm256_set1_epi8(0x0F), b16 = _mm256_set1_epi8(16);
    float sumf = 0.0f;
    for (size_t ib = 0; ib < n / QK_K; ib++) {
        uint8_t sc[8], mn[8];
        for (int k = 0; k < 8; k++)
            scale_min_k4(k, b[ib].scales, &sc[k], &mn[k]);
        const __m256i h = _mm256_loadu_si256((const __m256i *)b[ib].qh);
        __m256i acc = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(b[ib].qs + 32 * j));
            const __m256i bl = _mm256_set1_epi8((char)(1 << (2 * j)));
            const __m256i bh = _mm256_set1_epi8((char)(1 << (2 * j + 1)));
            const __m256i hl =
                _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, bl), bl), b16);
            const __m256i hh =
                _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, bh), bh), b16);
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(v, m4), hl);
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), hh);
            const __m256i q0 = _mm256_loadu_si256((const __m256i *)(x[ib].qs + 64 * j));
            const __m256i q1 = _mm256_loadu_si256((const __m256i *)(x[ib].qs + 64 * j + 32));
            const __m256i p0 = _mm256_maddubs_epi16(lo, q0);
            const __m256i p1 = _mm256_maddubs_epi16(hi, q1);
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p0, _mm256_set1_epi16(sc[2 * j])));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p1, _mm256_set1_epi16(sc[2 * j + 1])));
        }
        int summ = 0;
        for (int k = 0; k < 8; k++)
            summ += mn[k] * (x[ib].bsums[2 * k] + x[ib].bsums[2 * k + 1]);
        const int sumi = hsum8i(acc);
        const float d = pe_f16_to_f32(b[ib].d), dmin = pe_f16_to_f32(b[ib].dmin);
        sumf += (x[ib].d * d) * (float)sumi;
        sumf -= (x[ib].d * dmin) * (float)summ;
    }
    return sumf;
}

TGT float pe__vec_dot_q6_k_avx2(const void *w, const void *xq, size_t n)
{
    const block_q6_K *b = w;
    const block_q8_K *x = xq;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
    float sumf = 0.0f;
    for (size_t ib = 0; ib < n / QK_K; ib++) {
        const int8_t *sc = b[ib].scales;
        __m256i acc = _mm256_setzero_si256();
        for (int c = 0; c < 2; c++) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(b[ib].ql + 64 * c));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(b[ib].ql + 64 * c + 32));
            const __m256i h = _mm256_loadu_si256((const __m256i *)(b[ib].qh + 32 * c));
            __m256i u[4];
            u[0] = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(h, m2), 4));
            u[1] = _mm256_or_si256(
                _mm256_and_si256(l1, m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m2), 4));
            u[2] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m2), 4));
            u[3] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m2), 4));
            for (int i = 0; i < 4; i++) {
                const int k = 8 * c + 2 * i; /* first 16-value sub-block of u[i] */
                const __m256i q8 =
                    _mm256_loadu_si256((const __m256i *)(x[ib].qs + 128 * c + 32 * i));
                const __m256i s =
                    _mm256_set_m128i(_mm_set1_epi16(sc[k + 1]), _mm_set1_epi16(sc[k]));
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u[i], q8), s));
            }
        }
        int corr = 0;
        for (int k = 0; k < 16; k++)
            corr += sc[k] * x[ib].bsums[k];
        const int sumi = hsum8i(acc) - 32 * corr;
        const float d = pe_f16_to_f32(b[ib].d), dmin = 0.0f;
        const int summ = 0;
        sumf += (x[ib].d * d) * (float)sumi;
        sumf -= (x[ib].d * dmin) * (float)summ;
    }
    return sumf;
}

/* ---- Q3_K and Q2_K x Q8_K (issue 15) ----
 * As Q6_K above: 32 values of 2 bits (Q3_K: minus 4 where the hmask bit is clear) per step,
 * maddubs with the Q8_K activations (Q3_K signed, as maddubs(|w|, sign(x, w))), madd with
 * the two 16-value sub-block scales of the step, then the reference's f32 statements.
 * Bounds: a maddubs pair is at most 2 * 4 * 127 = 1016; the int32 sums at most
 * 256 * 4 * 127 * 32. */

/* The 16 6-bit scales of a Q3_K super-block, offset 32 removed (as ops_ref.c). */
static void q3_k_scales(const uint8_t *src, int8_t sc[16])
{
    const uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
    uint32_t aux[4];
    memcpy(aux, src, 12);
    const uint32_t tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
    aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
    aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
    aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
    memcpy(sc, aux, 16);
    for (int i = 0; i < 16; i++)
        sc[i] = (int8_t)(sc[i] - 32);
}

TGT float pe__vec_dot_q3_k_avx2(const void *w, const void *xq, size_t n)
{
    const block_q3_K *b = w;
    const block_q8_K *x = xq;
    const __m256i m3 = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    float sumf = 0.0f;
    for (size_t ib = 0; ib < n / QK_K; ib++) {
        int8_t sc[16];
        q3_k_scales(b[ib].scales, sc);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)b[ib].hmask);
        __m256i acc = _mm256_setzero_si256();
        for (int c = 0; c < 2; c++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(b[ib].qs + 32 * c));
            for (int j = 0; j < 4; j++) {
                const int k = 8 * c + 2 * j; /* first 16-value sub-block of the step */
                const __m256i bit = _mm256_set1_epi8((char)(1 << (4 * c + j)));
                const __m256i hb = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit);
                const __m256i u = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3);
                const __m256i v = _mm256_sub_epi8(u, _mm256_andnot_si256(hb, four));
                const __m256i q8 =
                    _mm256_loadu_si256((const __m256i *)(x[ib].qs + 128 * c + 32 * j));
                const __m256i p =
                    _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(q8, v));
                const __m256i s =
                    _mm256_set_m128i(_mm_set1_epi16(sc[k + 1]), _mm_set1_epi16(sc[k]));
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, s));
            }
        }
        const int sumi = hsum8i(acc);
        const float d = pe_f16_to_f32(b[ib].d), dmin = 0.0f;
        const int summ = 0;
        sumf += (x[ib].d * d) * (float)sumi;
        sumf -= (x[ib].d * dmin) * (float)summ;
    }
    return sumf;
}

TGT float pe__vec_dot_q2_k_avx2(const void *w, const void *xq, size_t n)
{
    const block_q2_K *b = w;
    const block_q8_K *x = xq;
    const __m256i m3 = _mm256_set1_epi8(3);
    float sumf = 0.0f;
    for (size_t ib = 0; ib < n / QK_K; ib++) {
        const uint8_t *scales = b[ib].scales;
        int summ = 0;
        for (int k = 0; k < 16; k++)
            summ += (scales[k] >> 4) * x[ib].bsums[k];
        __m256i acc = _mm256_setzero_si256();
        for (int c = 0; c < 2; c++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(b[ib].qs + 32 * c));
            for (int j = 0; j < 4; j++) {
                const int k = 8 * c + 2 * j; /* first 16-value sub-block of the step */
                const __m256i u = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3);
                const __m256i q8 =
                    _mm256_loadu_si256((const __m256i *)(x[ib].qs + 128 * c + 32 * j));
                const __m256i s = _mm256_set_m128i(_mm_set1_epi16(scales[k + 1] & 0xF),
                                                   _mm_set1_epi16(scales[k] & 0xF));
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, q8), s));
            }
        }
        const int sumi = hsum8i(acc);
        const float d = pe_f16_to_f32(b[ib].d), dmin = pe_f16_to_f32(b[ib].dmin);
        sumf += (x[ib].d * d) * (float)sumi;
        sumf -= (x[ib].d * dmin) * (float)summ;
    }
    return sumf;
}

/* ---- Q4_1, Q5_0, Q5_1 and IQ4_NL x Q8_0/Q8_1 (issue 15) ----
 * The integer dot of each 32-value block on AVX2, 8 blocks at a time (reduced together by
 * hadd), and the f32 terms of the 8 blocks by vector (the reference's products, each
 * rounded once), added to the sum per block in order as pe__vec_dot_ext_ref does, so that
 * the result is bit-identical to it (test_quant_ref; a NaN scale gives NaN in both). Q4_1 (0..15)
 * and Q5_1 (0..31) values are unsigned and go to maddubs as they are; Q5_0 (-16..15) and IQ4_NL
 * (the table, -127..113) are signed and go as maddubs(|w|, sign(x, w)). Bounds: a maddubs pair is
 * at most 2 * 127 * 127 = 32258 (no saturation). */

static const int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                         1,    13,   25,  38,  53,  69,  89,  113};

/* Byte k = 0xff where bit k of the 32 bits at p is set, else 0. */
INL __m256i bits_to_bytes(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    const __m256i shuf = _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101,
                                            0x0202020202020202, 0x0303030303030303);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)v), shuf);
    b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(b, _mm256_set1_epi8(-1));
}

/* 8 int32 partial sums of the integer dot of one block of type with the 32 values q8. */
INL __m256i dot32(const int type, const uint8_t *blk, const int8_t *q8)
{
    const __m256i x = _mm256_loadu_si256((const __m256i *)q8);
    const __m256i ones = _mm256_set1_epi16(1), b16 = _mm256_set1_epi8(16);
    __m256i u, s;
    switch (type) {
    case PE_GGML_TYPE_Q4_1:
        u = q4_nibbles(blk + offsetof(block_q4_1, qs));
        s = x;
        break;
    case PE_GGML_TYPE_Q5_1:
        u = _mm256_or_si256(q4_nibbles(blk + offsetof(block_q5_1, qs)),
                            _mm256_and_si256(bits_to_bytes(blk + offsetof(block_q5_1, qh)), b16));
        s = x;
        break;
    case PE_GGML_TYPE_Q5_0: {
        const __m256i h = _mm256_and_si256(bits_to_bytes(blk + offsetof(block_q5_0, qh)), b16);
        const __m256i w =
            _mm256_sub_epi8(_mm256_or_si256(q4_nibbles(blk + offsetof(block_q5_0, qs)), h), b16);
        u = _mm256_sign_epi8(w, w);
        s = _mm256_sign_epi8(x, w);
        break;
    }
    default: { /* IQ4_NL */
        const __m256i tbl =
            _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kvalues_iq4nl));
        const __m256i w = _mm256_shuffle_epi8(tbl, q4_nibbles(blk + offsetof(block_iq4_nl, qs)));
        u = _mm256_sign_epi8(w, w);
        s = _mm256_sign_epi8(x, w);
        break;
    }
    }
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones);
}

/* Lane i = the sum of the 8 lanes of v[i]. */
INL __m256i hsum8x8i(const __m256i v[8])
{
    const __m256i a =
        _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i b =
        _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20),
                            _mm256_permute2x128_si256(a, b, 0x31));
}

INL float vec_dot_32(const int type, const void *w, const void *xq, size_t n)
{
    const size_t bs = type == PE_GGML_TYPE_Q4_1   ? sizeof(block_q4_1)
                      : type == PE_GGML_TYPE_Q5_1 ? sizeof(block_q5_1)
                      : type == PE_GGML_TYPE_Q5_0 ? sizeof(block_q5_0)
                                                  : sizeof(block_iq4_nl);
    const int q8_1 = type == PE_GGML_TYPE_Q4_1 || type == PE_GGML_TYPE_Q5_1;
    const size_t xs = q8_1 ? sizeof(block_q8_1) : sizeof(block_q8_0);
    const size_t xo = q8_1 ? offsetof(block_q8_1, qs) : offsetof(block_q8_0, qs);
    const size_t nb = n / 32;
    float sumf = 0.0f;
    for (size_t b8 = 0; b8 < nb; b8 += 8) {
        const size_t nj = nb - b8 < 8 ? nb - b8 : 8;
        __m256i v[8];
        for (size_t j = 0; j < 8; j++)
            v[j] = j < nj ? dot32(type, (const uint8_t *)w + (b8 + j) * bs,
                                  (const int8_t *)xq + (b8 + j) * xs + xo)
                          : _mm256_setzero_si256();
        const uint8_t *wb = (const uint8_t *)w + b8 * bs, *xb = (const uint8_t *)xq + b8 * xs;
        /* (d_w * d_x) * (float)sumi [+ m_w * s_x] of each block, as the reference's
         * statements (no contraction in C11 mode); F16C converts f16 exactly. */
        __m256 t = _mm256_mul_ps(
            _mm256_mul_ps(q_scales8(wb, bs, (uint32_t)nj), q_scales8(xb, xs, (uint32_t)nj)),
            _mm256_cvtepi32_ps(hsum8x8i(v)));
        if (q8_1)
            t = _mm256_add_ps(t, _mm256_mul_ps(q_scales8(wb + 2, bs, (uint32_t)nj),
                                               q_scales8(xb + 2, xs, (uint32_t)nj)));
        _Alignas(32) float tb[8];
        _mm256_store_ps(tb, t);
        for (size_t j = 0; j < nj; j++)
            sumf += tb[j];
    }
    return sumf;
}

TGT float pe__vec_dot_q4_1_avx2(const void *w, const void *xq, size_t n)
{
    return vec_dot_32(PE_GGML_TYPE_Q4_1, w, xq, n);
}

TGT float pe__vec_dot_q5_0_avx2(const void *w, const void *xq, size_t n)
{
    return vec_dot_32(PE_GGML_TYPE_Q5_0, w, xq, n);
}

TGT float pe__vec_dot_q5_1_avx2(const void *w, const void *xq, size_t n)
{
    return vec_dot_32(PE_GGML_TYPE_Q5_1, w, xq, n);
}

TGT float pe__vec_dot_iq4_nl_avx2(const void *w, const void *xq, size_t n)
{
    return vec_dot_32(PE_GGML_TYPE_IQ4_NL, w, xq, n);
}

/* ---- multi-token tiles of the types of issue 15 (pe__ext_rows_avx2) ----
 * A tile is R rows x T tokens, R * T <= 8: each weight block is unpacked once for T tokens
 * and each activation block read for R rows, and the 8 (row, token) pairs of the tile live
 * in the 8 lanes of the f32 vectors (lane p: row p / T, token p % T). Per block, the
 * integer dot of every pair is exact (maddubs of unsigned weights with the activations,
 * madd with the sub-block scales, summed over the block in int32 lanes), the 8 pairs are
 * reduced together (hsum8x8i), and the reference's f32 statements run once per block on the
 * 8 lanes, each rounded as in pe__vec_dot_ext_ref (no contraction): every element is
 * bit-identical to it, whatever the tile. K-quants with signed values use u = q + off
 * (Q3_K: off 4, Q6_K: 32) and subtract off * sum(scale_k * bsum_k) from the integer sums;
 * Q2_K/Q4_K/Q5_K keep their mins term sum(min_k * bsum_k), reduced like the dots. Bounds as
 * in the one-dot kernels above: a maddubs pair is at most 2 * 63 * 127 (K-quants) or
 * 2 * 127 * 127 (IQ4_NL), no saturation; the int32 sums stay below 2^31. */

typedef struct ext_tile {
    const uint8_t *w;  /* the tile's first row */
    size_t rb;         /* bytes per weight row */
    const uint8_t *xq; /* the tile's first token, quantized by pe__quant_act_ref */
    size_t xs;         /* bytes per token of xq */
    float *y;          /* &y[t][r] of the first (row, token) */
    size_t ys;         /* floats per token of y (n_out) */
    uint32_t nb;       /* blocks per row */
} ext_tile;

/* Lane p of a tile: the byte offset of its row (by_row) or token; 0 past R * T. */
INL __m256i lane_off(size_t stride, const int by_row, const int R, const int T)
{
    _Alignas(32) int32_t o[8];
    for (int p = 0; p < 8; p++)
        o[p] = p < R * T ? (int32_t)((size_t)(by_row ? p / T : p % T) * stride) : 0;
    return _mm256_load_si256((const __m256i *)(const void *)o);
}

/* The two f16 halves of each 32-bit lane of v, as f32. */
INL void f16_pairs(__m256i v, __m256 *lo, __m256 *hi)
{
    const __m256i l = _mm256_and_si256(v, _mm256_set1_epi32(0xffff));
    const __m256i p =
        _mm256_permute4x64_epi64(_mm256_packus_epi32(l, _mm256_srli_epi32(v, 16)), 0xd8);
    *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(p));
    *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(p, 1));
}

/* The 32 bits at p + off of the tile's rows (R > 1: gathered at the lanes' offsets o). */
INL __m256i tile_u32(const uint8_t *p, __m256i o, const int R)
{
    if (R == 1) {
        int32_t v;
        memcpy(&v, p, sizeof v);
        return _mm256_set1_epi32(v);
    }
    return _mm256_i32gather_epi32((const int *)(const void *)p, o, 1);
}

INL void tile_store(const ext_tile *a, __m256 v, const int R, const int T)
{
    _Alignas(32) float s[8];
    _mm256_store_ps(s, v);
    for (int p = 0; p < R * T; p++)
        a->y[(size_t)(p % T) * a->ys + (size_t)(p / T)] = s[p];
}

/* The scales of a K-quant super-block for k_step_scale (lo, hi) and the vector whose madd
 * with the activations' 16 bsums gives the mins term or the offset correction (mv). */
INL void k_scales(const int type, const uint8_t *blk, __m256i *lo, __m256i *hi, __m256i *mv)
{
    __m256i s16;
    switch (type) {
    case PE_GGML_TYPE_Q4_K:
    case PE_GGML_TYPE_Q5_K: { /* get_scale_min_k4 for all 8 (ggml's kmask form) */
        uint32_t u[4];
        memcpy(u, blk + 4, 12);
        u[3] = ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4);
        const uint32_t m03 = u[1] & 0x3f3f3f3f;
        u[1] = (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4);
        u[2] = m03;
        u[0] &= 0x3f3f3f3f;
        s16 = _mm256_cvtepu8_epi16(_mm_set_epi32((int)u[3], (int)u[2], (int)u[1], (int)u[0]));
        *lo = *hi = _mm256_permute2x128_si256(s16, s16, 0x00); /* scales 0..7, both lanes */
        const __m128i m = _mm256_extracti128_si256(s16, 1);    /* mins 0..7 */
        *mv = _mm256_set_m128i(_mm_unpackhi_epi16(m, m), _mm_unpacklo_epi16(m, m));
        return;
    }
    case PE_GGML_TYPE_Q2_K: {
        const __m128i v = _mm_loadu_si128((const __m128i *)blk);
        const __m128i m4 = _mm_set1_epi8(0x0f);
        s16 = _mm256_cvtepu8_epi16(_mm_and_si128(v, m4));
        *mv = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(v, 4), m4));
        break;
    }
    case PE_GGML_TYPE_Q3_K: { /* q3_k_scales in registers (a call to it: 13x the time) */
        uint32_t u[3];
        memcpy(u, blk + offsetof(block_q3_K, scales), 12);
        const uint32_t m4 = 0x0f0f0f0f, m2 = 0x03030303;
        const __m128i v = _mm_set_epi32((int)(((u[1] >> 4) & m4) | (((u[2] >> 6) & m2) << 4)),
                                        (int)(((u[0] >> 4) & m4) | (((u[2] >> 4) & m2) << 4)),
                                        (int)((u[1] & m4) | (((u[2] >> 2) & m2) << 4)),
                                        (int)((u[0] & m4) | ((u[2] & m2) << 4)));
        s16 = _mm256_cvtepi8_epi16(_mm_sub_epi8(v, _mm_set1_epi8(32)));
        *mv = s16;
        break;
    }
    default: /* Q6_K */
        s16 = _mm256_cvtepi8_epi16(
            _mm_loadu_si128((const __m128i *)(blk + offsetof(block_q6_K, scales))));
        *mv = s16;
        break;
    }
    *lo = _mm256_permute2x128_si256(s16, s16, 0x00); /* scales 0..7, both lanes */
    *hi = _mm256_permute2x128_si256(s16, s16, 0x11); /* scales 8..15 */
}

/* The 16-bit scales of the 32 values of step s (values 32 s .. 32 s + 31). */
INL __m256i k_step_scale(const int type, __m256i lo, __m256i hi, const int s)
{
    if (type == PE_GGML_TYPE_Q4_K || type == PE_GGML_TYPE_Q5_K) /* one scale per 32 */
        return _mm256_shuffle_epi8(lo, _mm256_set1_epi16((short)((2 * s + 1) << 8 | 2 * s)));
    const int e = s % 4; /* 16-value sub-blocks 2 s (low lane) and 2 s + 1 (high lane) */
    const __m256i c = _mm256_set_m128i(_mm_set1_epi16((short)((4 * e + 3) << 8 | (4 * e + 2))),
                                       _mm_set1_epi16((short)((4 * e + 1) << 8 | (4 * e))));
    return _mm256_shuffle_epi8(s < 4 ? lo : hi, c);
}

/* Bit b of each byte of v moved to bit to (the other bits are garbage). 16-bit shifts are
 * safe: bits that cross a byte boundary land outside the bit kept. */
INL __m256i bit_to(__m256i v, const int b, const int to)
{
    return b > to ? _mm256_srli_epi16(v, b - to) : _mm256_slli_epi16(v, to - b);
}

/* The 32 unsigned values (q + off) of step s of a K-quant super-block, in value order. */
INL __m256i k_unpack(const int type, const uint8_t *blk, const int s)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(3);
    switch (type) {
    case PE_GGML_TYPE_Q4_K:
    case PE_GGML_TYPE_Q5_K: {
        const size_t qs =
            type == PE_GGML_TYPE_Q4_K ? offsetof(block_q4_K, qs) : offsetof(block_q5_K, qs);
        const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + qs + 32 * (s / 2)));
        __m256i u = _mm256_and_si256(s % 2 ? _mm256_srli_epi16(v, 4) : v, m4);
        if (type == PE_GGML_TYPE_Q5_K) {
            const __m256i h = _mm256_loadu_si256((const __m256i *)(blk + offsetof(block_q5_K, qh)));
            u = _mm256_or_si256(u, _mm256_and_si256(bit_to(h, s, 4), _mm256_set1_epi8(0x10)));
        }
        return u;
    }
    case PE_GGML_TYPE_Q6_K: {
        const int c = s / 4, i = s % 4;
        const __m256i l = _mm256_loadu_si256((const __m256i *)(blk + 64 * c + 32 * (i & 1)));
        const __m256i h =
            _mm256_loadu_si256((const __m256i *)(blk + offsetof(block_q6_K, qh) + 32 * c));
        const __m256i lo = _mm256_and_si256(i >= 2 ? _mm256_srli_epi16(l, 4) : l, m4);
        return _mm256_or_si256(lo, _mm256_and_si256(bit_to(h, 2 * i, 4), _mm256_set1_epi8(0x30)));
    }
    case PE_GGML_TYPE_Q2_K:
    case PE_GGML_TYPE_Q3_K: {
        const int c = s / 4, j = s % 4;
        const size_t qs =
            type == PE_GGML_TYPE_Q2_K ? offsetof(block_q2_K, qs) : offsetof(block_q3_K, qs);
        const __m256i q = _mm256_loadu_si256((const __m256i *)(blk + qs + 32 * c));
        __m256i u = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3);
        if (type == PE_GGML_TYPE_Q3_K) { /* hmask bit s set: +4 (v = u - 4) */
            const __m256i h = _mm256_loadu_si256((const __m256i *)blk);
            u = _mm256_or_si256(u, _mm256_and_si256(bit_to(h, s, 2), _mm256_set1_epi8(4)));
        }
        return u;
    }
    default:
        PE_UNREACHABLE_TYPE(type);
    }
}

/* The constants of a K-quant type: bytes per super-block; whether it has mins (else its
 * values are unsigned with an offset, subtracted as offset * sum(scale_k * bsum_k)); log2
 * of that offset; the 32 bits holding d (and dmin): d first for Q2_K/Q4_K/Q5_K, d last in
 * Q3_K/Q6_K blocks. */
INL size_t k_bsize(const int type)
{
    return type == PE_GGML_TYPE_Q2_K   ? sizeof(block_q2_K)
           : type == PE_GGML_TYPE_Q3_K ? sizeof(block_q3_K)
           : type == PE_GGML_TYPE_Q4_K ? sizeof(block_q4_K)
           : type == PE_GGML_TYPE_Q5_K ? sizeof(block_q5_K)
                                       : sizeof(block_q6_K);
}

INL int k_has_min(const int type)
{
    return type == PE_GGML_TYPE_Q2_K || type == PE_GGML_TYPE_Q4_K || type == PE_GGML_TYPE_Q5_K;
}

INL int k_shift(const int type)
{
    return type == PE_GGML_TYPE_Q3_K ? 2 : 5;
}

INL size_t k_doff(const int type)
{
    return type == PE_GGML_TYPE_Q2_K   ? offsetof(block_q2_K, d)
           : type == PE_GGML_TYPE_Q3_K ? offsetof(block_q3_K, d) - 2
           : type == PE_GGML_TYPE_Q6_K ? offsetof(block_q6_K, d) - 2
                                       : 0;
}

INL void k_tile(const int type, const ext_tile *a, const int R, const int T)
{
    const size_t bs = k_bsize(type), doff = k_doff(type);
    const int has_min = k_has_min(type), shift = k_shift(type);
    const __m256i wo = lane_off(a->rb, 1, R, T), xo = lane_off(a->xs, 0, R, T);
    __m256 sumf = _mm256_setzero_ps();
    for (uint32_t ib = 0; ib < a->nb; ib++) {
        const uint8_t *wb = a->w + ib * bs;
        const block_q8_K *x[8];
#pragma GCC unroll 8
        for (int j = 0; j < T; j++)
            x[j] = (const block_q8_K *)(const void *)(a->xq + (size_t)j * a->xs) + ib;
        __m256i slo[8], shi[8], mv[8], acc[8], mac[8];
#pragma GCC unroll 8
        for (int p = 0; p < 8; p++)
            acc[p] = mac[p] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int i = 0; i < R; i++)
            k_scales(type, wb + i * a->rb, &slo[i], &shi[i], &mv[i]);
#pragma GCC unroll 8
        for (int s = 0; s < 8; s++) {
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) {
                const __m256i u = k_unpack(type, wb + i * a->rb, s);
                const __m256i sv = k_step_scale(type, slo[i], shi[i], s);
#pragma GCC unroll 8
                for (int j = 0; j < T; j++) {
                    const __m256i q8 = _mm256_loadu_si256((const __m256i *)(x[j]->qs + 32 * s));
                    acc[i * T + j] = _mm256_add_epi32(
                        acc[i * T + j], _mm256_madd_epi16(_mm256_maddubs_epi16(u, q8), sv));
                }
            }
        }
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
#pragma GCC unroll 8
            for (int j = 0; j < T; j++) {
                const __m256i m = _mm256_madd_epi16(
                    mv[i], _mm256_loadu_si256((const __m256i *)(const void *)x[j]->bsums));
                if (has_min)
                    mac[i * T + j] = m;
                else
                    acc[i * T + j] = _mm256_sub_epi32(acc[i * T + j], _mm256_slli_epi32(m, shift));
            }
        }
        const __m256 sumi = _mm256_cvtepi32_ps(hsum8x8i(acc));
        const __m256 xd = T == 1 ? _mm256_set1_ps(x[0]->d) : _mm256_i32gather_ps(&x[0]->d, xo, 1);
        __m256 d, dmin;
        f16_pairs(tile_u32(wb + doff, wo, R), &d, &dmin);
        if (!has_min) d = dmin, dmin = _mm256_setzero_ps();
        const __m256 summ = has_min ? _mm256_cvtepi32_ps(hsum8x8i(mac)) : _mm256_setzero_ps();
        sumf = _mm256_add_ps(sumf, _mm256_mul_ps(_mm256_mul_ps(xd, d), sumi));
        sumf = _mm256_sub_ps(sumf, _mm256_mul_ps(_mm256_mul_ps(xd, dmin), summ));
    }
    tile_store(a, sumf, R, T);
}

/* The 32-value types: per block, the exact integer dot of each pair (maddubs: Q4_1/Q5_1
 * values unsigned as they are, Q5_0/IQ4_NL as maddubs(|w|, sign(x, w)), as dot32 above),
 * the 8 pairs reduced together, then (d_w * d_x) * (float)sumi [+ m_w * s_x] per lane and
 * the sum in block order, as the reference's statement. */
INL void b32_tile(const int type, const ext_tile *a, const int R, const int T)
{
    const size_t bs = type == PE_GGML_TYPE_Q4_1   ? sizeof(block_q4_1)
                      : type == PE_GGML_TYPE_Q5_1 ? sizeof(block_q5_1)
                      : type == PE_GGML_TYPE_Q5_0 ? sizeof(block_q5_0)
                                                  : sizeof(block_iq4_nl);
    const int q8_1 = type == PE_GGML_TYPE_Q4_1 || type == PE_GGML_TYPE_Q5_1;
    const size_t xbs = q8_1 ? sizeof(block_q8_1) : sizeof(block_q8_0);
    const size_t xqo = q8_1 ? offsetof(block_q8_1, qs) : offsetof(block_q8_0, qs);
    const __m256i ones = _mm256_set1_epi16(1), b16 = _mm256_set1_epi8(16);
    const __m256i wo = lane_off(a->rb, 1, R, T), xo = lane_off(a->xs, 0, R, T);
    __m256 sumf = _mm256_setzero_ps();
    for (uint32_t b = 0; b < a->nb; b++) {
        const uint8_t *wb = a->w + b * bs, *xb = a->xq + b * xbs;
        __m256i acc[8];
#pragma GCC unroll 8
        for (int p = 0; p < 8; p++)
            acc[p] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            const uint8_t *blk = wb + i * a->rb;
            __m256i u, w = _mm256_setzero_si256(); /* unsigned values; signed ones (w) */
            switch (type) {
            case PE_GGML_TYPE_Q4_1:
                u = q4_nibbles(blk + offsetof(block_q4_1, qs));
                break;
            case PE_GGML_TYPE_Q5_1:
                u = _mm256_or_si256(
                    q4_nibbles(blk + offsetof(block_q5_1, qs)),
                    _mm256_and_si256(bits_to_bytes(blk + offsetof(block_q5_1, qh)), b16));
                break;
            case PE_GGML_TYPE_Q5_0:
                w = _mm256_sub_epi8(
                    _mm256_or_si256(
                        q4_nibbles(blk + offsetof(block_q5_0, qs)),
                        _mm256_and_si256(bits_to_bytes(blk + offsetof(block_q5_0, qh)), b16)),
                    b16);
                u = _mm256_sign_epi8(w, w);
                break;
            default: /* IQ4_NL */
                w = _mm256_shuffle_epi8(
                    _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kvalues_iq4nl)),
                    q4_nibbles(blk + offsetof(block_iq4_nl, qs)));
                u = _mm256_sign_epi8(w, w);
                break;
            }
#pragma GCC unroll 8
            for (int j = 0; j < T; j++) {
                __m256i x = _mm256_loadu_si256((const __m256i *)(xb + (size_t)j * a->xs + xqo));
                if (!q8_1) x = _mm256_sign_epi8(x, w);
                acc[i * T + j] = _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), ones);
            }
        }
        const __m256 sumi = _mm256_cvtepi32_ps(hsum8x8i(acc));
        __m256 dw, mw, dx, sx;
        f16_pairs(tile_u32(wb, wo, R), &dw, &mw); /* d, m lead the weight blocks */
        __m256i xv;                               /* d, s lead the activation blocks */
        if (T == 1) {
            int32_t v;
            memcpy(&v, xb, sizeof v);
            xv = _mm256_set1_epi32(v);
        } else {
            xv = _mm256_i32gather_epi32((const int *)(const void *)xb, xo, 1);
        }
        f16_pairs(xv, &dx, &sx);
        __m256 t = _mm256_mul_ps(_mm256_mul_ps(dw, dx), sumi);
        if (q8_1) t = _mm256_add_ps(t, _mm256_mul_ps(mw, sx));
        sumf = _mm256_add_ps(sumf, t);
    }
    tile_store(a, sumf, R, T);
}

/* Each (type, R, T) tile is a function of its own (as ops_gemv.h's); a type's table holds
 * R = 1 for T = 1..8 (row [0]) and the wide tiles R = 8 / T for T = 1..4 (row [1]). */
typedef void (*ext_tile_fn)(const ext_tile *a);

#define EXT_FN(name, call)                                                                         \
    TGT __attribute__((noinline)) static void name(const ext_tile *a)                              \
    {                                                                                              \
        call;                                                                                      \
    }

#define EXT_SET(pfx, TILE)                                                                         \
    EXT_FN(pfx##_1_1, TILE(1, 1))                                                                  \
    EXT_FN(pfx##_1_2, TILE(1, 2))                                                                  \
    EXT_FN(pfx##_1_3, TILE(1, 3))                                                                  \
    EXT_FN(pfx##_1_4, TILE(1, 4))                                                                  \
    EXT_FN(pfx##_1_5, TILE(1, 5))                                                                  \
    EXT_FN(pfx##_1_6, TILE(1, 6))                                                                  \
    EXT_FN(pfx##_1_7, TILE(1, 7))                                                                  \
    EXT_FN(pfx##_1_8, TILE(1, 8))                                                                  \
    EXT_FN(pfx##_8_1, TILE(8, 1))                                                                  \
    EXT_FN(pfx##_4_2, TILE(4, 2))                                                                  \
    EXT_FN(pfx##_2_3, TILE(2, 3))                                                                  \
    EXT_FN(pfx##_2_4, TILE(2, 4))                                                                  \
    static const ext_tile_fn pfx##_tiles[2][9] = {                                                 \
        {NULL, pfx##_1_1, pfx##_1_2, pfx##_1_3, pfx##_1_4, pfx##_1_5, pfx##_1_6, pfx##_1_7,        \
         pfx##_1_8},                                                                               \
        {NULL, pfx##_8_1, pfx##_4_2, pfx##_2_3, pfx##_2_4, NULL, NULL, NULL, NULL}};

#define Q2_K_TILE(R, T) k_tile(PE_GGML_TYPE_Q2_K, a, R, T)
#define Q3_K_TILE(R, T) k_tile(PE_GGML_TYPE_Q3_K, a, R, T)
#define Q4_K_TILE(R, T) k_tile(PE_GGML_TYPE_Q4_K, a, R, T)
#define Q5_K_TILE(R, T) k_tile(PE_GGML_TYPE_Q5_K, a, R, T)
#define Q6_K_TILE(R, T) k_tile(PE_GGML_TYPE_Q6_K, a, R, T)
EXT_SET(q2_k, Q2_K_TILE)
EXT_SET(q3_k, Q3_K_TILE)
EXT_SET(q4_k, Q4_K_TILE)
EXT_SET(q5_k, Q5_K_TILE)
EXT_SET(q6_k, Q6_K_TILE)
#define Q4_1_TILE(R, T) b32_tile(PE_GGML_TYPE_Q4_1, a, R, T)
#define Q5_0_TILE(R, T) b32_tile(PE_GGML_TYPE_Q5_0, a, R, T)
#define Q5_1_TILE(R, T) b32_tile(PE_GGML_TYPE_Q5_1, a, R, T)
#define IQ4_NL_TILE(R, T) b32_tile(PE_GGML_TYPE_IQ4_NL, a, R, T)
EXT_SET(q4_1, Q4_1_TILE)
EXT_SET(q5_0, Q5_0_TILE)
EXT_SET(q5_1, Q5_1_TILE)
EXT_SET(iq4_nl, IQ4_NL_TILE)

/* ---- GEMM: K-quant panels (Q2_K..Q6_K x Q8_K) ----
 * From KP_MIN_TOK tokens on, pe__ext_rows_avx2(_vnni) repacks 16 rows x KS super-blocks at
 * a time into panels with the rows in the lanes (two groups of 8, as the Q8_0/Q4_0 panels
 * above), the values unpacked to bytes and the scales, mins and d, dmin of each row decoded
 * once per panel, so that the inner loop is integer dot products of the panel with the Q8_K
 * activations broadcast 4 bytes at a time, and no horizontal sums are needed:
 *
 *   panel, per super-block and group of 8 rows (2880 bytes):
 *       f32 d[8], dmin[8]      (dmin 0 for Q3_K/Q6_K)
 *       i32 sc[16][8]          sub-block k's scale of each row: plain AVX2 the int16 pair
 *                              (s, s) for madd, AVX-VNNI s for mullo
 *       i32 c[8][8]            the int16 pair (mv[2p], mv[2p + 1]) of each row: k_scales'
 *                              mins (Q2_K/Q4_K/Q5_K) or scales (Q3_K/Q6_K) per bsum
 *       u8  q[64][8][4]        chunk k (values 4k..4k+3) of each row, as k_unpack: q + 32
 *                              (Q6_K), q + 4 (Q3_K), q (the others)
 *
 * Per 2 groups x T tokens (T <= GT) and super-block, in int32 lanes (row) per token:
 *   plain AVX2: maddubs(u, x) summed in int16 over H chunks, then madd with the sub-block
 *               scale pair. A maddubs pair is at most 2 * umax * 127, so H chunks stay
 *               below 2^15: Q4_K H 8 (8 x 2 x 15 x 127 = 30480), Q5_K H 4 (4 x 2 x 31 x 127
 *               = 31496), Q6_K H 2 (2 x 2 x 63 x 127 = 32004), Q3_K/Q2_K H 4 (7112, 3048);
 *   AVX-VNNI:   vpdpbusd over the sub-block (at most 32 x 63 x 127), then mullo by s;
 *   then the mins or corrections madd(c[p], bsums[2p..2p+1]) (vpdpwssd on AVX-VNNI): the
 *   mins term summ (Q2_K/Q4_K/Q5_K), or sumi -= offset * sum (Q3_K/Q6_K). Each int32 sum is
 *   exact (the bounds of the one-dot kernels above: < 2^31), so sumi and summ equal the
 *   reference's. Then per (row, token) and super-block the reference's f32 statements in
 *   its order and without contraction: s += (d_x * d) * (float)sumi; s -= (d_x * dmin) *
 *   (float)summ, the running sums living in a buffer between K chunks (k_gemm): every
 *   element is bit-identical to pe__vec_dot_ext_ref (and so batch-invariant).
 *
 * Measured on a shared 2-core AVX-512 machine (load 2.5-6) with the levels forced, 3 runs
 * alternated with main's tiles: bench_matmul 2048x8192, 512 tokens, 1 thread, GFLOP/s,
 * tiles -> panels: avx2 q4_K 53-71 -> 89-132, q6_K 55-80 -> 88-129, q5_K 47-70 -> 84-155;
 * avx2vnni q4_K 56-72 -> 102-134, q6_K 56-79 -> 104-150, q5_K 47-68 -> 103-179 (q2_K and
 * q3_K alike). Kernel cycles (perf, same runs): q4_K 1.7x fewer on avx2, 1.6x on
 * avx2vnni; q6_K 1.5x, 2.5x. bench_engine pp512 of the 1B Q4_K_M shape, 2 threads,
 * tokens per CPU second: avx2 31-34 -> 45-58 (1.45-1.71x within a pair of runs),
 * avx2vnni 28-35 -> 47-64 (1.41-1.84x); decode (1 token) and AVX-512 unchanged. 65% of
 * the time there is then in the Q4_K micro-kernel, near maddubs' throughput (2 per cycle:
 * 9 per 8 chunks and token), 4% in the repacks, 4.5% in the scalar Q8_K quantizer (1.7%
 * since in pe__quant_q8_k_avx2: then 53.7-67.6 against main's 31.9-35.5). On Intel the
 * int16 adds of the plain AVX2 runs go to a third port, so vpdpbusd + mullo (both on the
 * maddubs ports) gains little for Q4_K; more for Q6_K (2-chunk runs). */

enum {
    KS = 2,          /* super-blocks per K chunk: 2 groups x 2 x 2880 bytes = 11.5 KB */
    KP_MIN_TOK = 12, /* tokens from which the products run on panels: at 8 the tiles' 1 x 8
                      * tile was as fast or faster (q6_K avx2 75 vs 87 GFLOP/s), at 12 the
                      * panels ahead (q4_K avx2 105 vs 86, avx2vnni 119 vs 86) */
    KP_TC = 256,     /* tokens per chunk of k_gemm (its running sums: 16 KB) */
};

typedef struct kpanel {
    float d[8], dmin[8];
    int32_t sc[16][8];
    int32_t c[8][8];
    uint8_t q[64][32];
} kpanel; /* one super-block of one group of 8 rows */

/* The arguments of a K-quant product on panels: y and w for fa_load / fa_store. */
typedef struct kp_mm {
    pe_mm m;
    const uint8_t *xq; /* the activations (block_q8_K rows), token stride xs */
    size_t xs;
} kp_mm;

/* Repacks rows [r, r + nr) (nr <= 16) x super-blocks [s0, s0 + ks) into P[ks][2]. */
INL void k_repack(const int type, const pe_mat *w, uint32_t r, uint32_t nr, uint32_t s0,
                  uint32_t ks, const int vnni, kpanel *P)
{
    const size_t bs = k_bsize(type), rb = w->row_bytes, doff = k_doff(type);
    const int has_min = k_has_min(type);
    for (uint32_t g = 0; g < 2; g++) {
        const uint32_t ng = nr > 8 * g ? (nr - 8 * g < 8 ? nr - 8 * g : 8) : 0;
        const uint8_t *base = (const uint8_t *)w->data + (size_t)(r + 8 * g) * rb;
        for (uint32_t sb = 0; sb < ks; sb++) {
            kpanel *p = &P[2 * sb + g];
            if (ng == 0) {
                memset(p, 0, sizeof *p);
                continue;
            }
            const uint8_t *blk[8];
            __m256i mv[8], o[8];
            _Alignas(32) int16_t sc[8][16];
            for (uint32_t i = 0; i < 8; i++) {
                blk[i] = i < ng ? base + (size_t)i * rb + (size_t)(s0 + sb) * bs : NULL;
                if (!blk[i]) {
                    mv[i] = _mm256_setzero_si256();
                    memset(sc[i], 0, sizeof sc[i]);
                    p->d[i] = p->dmin[i] = 0.0f;
                    continue;
                }
                __m256i lo, hi;
                k_scales(type, blk[i], &lo, &hi, &mv[i]);
                _mm_store_si128((__m128i *)sc[i], _mm256_castsi256_si128(lo));
                _mm_store_si128((__m128i *)(sc[i] + 8), _mm256_castsi256_si128(hi));
                uint32_t dd;
                memcpy(&dd, blk[i] + doff, sizeof dd);
                p->d[i] = pe_f16_to_f32((uint16_t)(has_min ? dd & 0xffff : dd >> 16));
                p->dmin[i] = has_min ? pe_f16_to_f32((uint16_t)(dd >> 16)) : 0.0f;
            }
            for (int k = 0; k < 16; k++)
                for (int i = 0; i < 8; i++)
                    p->sc[k][i] = vnni ? sc[i][k] : (int32_t)((uint16_t)sc[i][k] * 0x10001u);
            tr8x8(mv, o);
#pragma GCC unroll 8
            for (int q = 0; q < 8; q++)
                _mm256_store_si256((__m256i *)(void *)p->c[q], o[q]);
#pragma GCC unroll 8
            for (int s = 0; s < 8; s++) {
                __m256i u[8];
#pragma GCC unroll 8
                for (int i = 0; i < 8; i++)
                    u[i] = blk[i] ? k_unpack(type, blk[i], s) : _mm256_setzero_si256();
                tr8x8(u, o);
#pragma GCC unroll 8
                for (int k = 0; k < 8; k++)
                    _mm256_store_si256((__m256i *)p->q[8 * s + k], o[k]);
            }
        }
    }
}

/* The 32 bits at byte o of super-block sb of token t + j, broadcast. */
INL __m256i kx_u32(const kp_mm *a, uint32_t t, int j, uint32_t sb, size_t o)
{
    int32_t v;
    memcpy(&v, a->xq + (size_t)(t + j) * a->xs + (size_t)sb * sizeof(block_q8_K) + o, sizeof v);
    return _mm256_set1_epi32(v);
}

/* The chunk runs of a K-quant type: sub-blocks per super-block, chunks per sub-block, and
 * chunks per int16 run of the plain AVX2 pass (see the bounds above). */
INL int k_nsub(const int type)
{
    return type == PE_GGML_TYPE_Q4_K || type == PE_GGML_TYPE_Q5_K ? 8 : 16;
}

INL int k_run(const int type)
{
    return type == PE_GGML_TYPE_Q6_K ? 2 : type == PE_GGML_TYPE_Q5_K ? 4 : 64 / k_nsub(type);
}

/* The mins (summ into im) or the offset correction (out of ia) of super-block xb for T
 * tokens from t and both groups, after the dots of the super-block are in ia. */
INL void k_corr(const int type, const kp_mm *a, const kpanel *p0, const kpanel *p1, uint32_t t,
                uint32_t xb, __m256i ia[2][GT], __m256i im[2][GT], const int T)
{
#pragma GCC unroll 4
    for (int j = 0; j < T; j++) {
        __m256i m0 = _mm256_setzero_si256(), m1 = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int q = 0; q < 8; q++) {
            const __m256i bv = kx_u32(a, t, j, xb, offsetof(block_q8_K, bsums) + 4 * (size_t)q);
            const __m256i c0 = _mm256_load_si256((const __m256i *)(const void *)p0->c[q]);
            const __m256i c1 = _mm256_load_si256((const __m256i *)(const void *)p1->c[q]);
            m0 = _mm256_add_epi32(m0, _mm256_madd_epi16(c0, bv));
            m1 = _mm256_add_epi32(m1, _mm256_madd_epi16(c1, bv));
        }
        if (k_has_min(type)) {
            im[0][j] = m0;
            im[1][j] = m1;
        } else {
            ia[0][j] = _mm256_sub_epi32(ia[0][j], _mm256_slli_epi32(m0, k_shift(type)));
            ia[1][j] = _mm256_sub_epi32(ia[1][j], _mm256_slli_epi32(m1, k_shift(type)));
        }
    }
}

/* The f32 pass of a micro-tile (the reference's statements, see above) over super-blocks
 * [s0, s0 + ks) from their integer sums is (sumi) and im (summ); fa_load / fa_store keep
 * the running sums in y between K chunks. */
INL void k_fpass(const int type, const kp_mm *a, const kpanel *P, uint32_t s0, uint32_t ks,
                 uint32_t r, uint32_t nr, uint32_t t, __m256i is[KS][2][GT], __m256i im[KS][2][GT],
                 const int T)
{
    const __m256i mk[2] = {lanes(nr < 8 ? nr : 8), lanes(nr > 8 ? nr - 8 : 0)};
    __m256 fa[2][GT];
    fa_load(&a->m, r, t, s0 == 0, nr == 16, mk, fa, T);
    for (uint32_t sb = 0; sb < ks; sb++) {
#pragma GCC unroll 4
        for (int j = 0; j < T; j++) {
            float xd;
            memcpy(&xd, a->xq + (size_t)(t + j) * a->xs + (size_t)(s0 + sb) * sizeof(block_q8_K),
                   sizeof xd);
            const __m256 dx = _mm256_set1_ps(xd);
#pragma GCC unroll 2
            for (int g = 0; g < 2; g++) {
                const kpanel *p = &P[2 * sb + g];
                const __m256 d = _mm256_load_ps(p->d), dmin = _mm256_load_ps(p->dmin);
                const __m256 sumi = _mm256_cvtepi32_ps(is[sb][g][j]);
                const __m256 summ =
                    k_has_min(type) ? _mm256_cvtepi32_ps(im[sb][g][j]) : _mm256_setzero_ps();
                fa[g][j] = _mm256_add_ps(fa[g][j], _mm256_mul_ps(_mm256_mul_ps(dx, d), sumi));
                fa[g][j] = _mm256_sub_ps(fa[g][j], _mm256_mul_ps(_mm256_mul_ps(dx, dmin), summ));
            }
        }
    }
    fa_store(&a->m, r, t, nr == 16, mk, fa, T);
}

/* Plain AVX2: accumulates T tokens from t over super-blocks [s0, s0 + ks) of P into y. */
INL void ka_micro(const int type, const kp_mm *a, const kpanel *P, uint32_t s0, uint32_t ks,
                  uint32_t r, uint32_t nr, uint32_t t, const int T)
{
    const int nsub = k_nsub(type), cps = 64 / nsub, H = k_run(type);
    _Alignas(32) __m256i is[KS][2][GT], im[KS][2][GT];
    for (uint32_t sb = 0; sb < ks; sb++) {
        const kpanel *p0 = &P[2 * sb], *p1 = p0 + 1;
        __m256i(*ia)[GT] = is[sb];
#pragma GCC unroll 4
        for (int j = 0; j < T; j++)
            ia[0][j] = ia[1][j] = _mm256_setzero_si256();
#pragma GCC unroll 16
        for (int k = 0; k < nsub; k++) {
            const __m256i c0 = _mm256_load_si256((const __m256i *)(const void *)p0->sc[k]);
            const __m256i c1 = _mm256_load_si256((const __m256i *)(const void *)p1->sc[k]);
#pragma GCC unroll 8
            for (int h = k * cps; h < (k + 1) * cps; h += H) {
                __m256i s[2][GT];
#pragma GCC unroll 4
                for (int j = 0; j < T; j++)
                    s[0][j] = s[1][j] = _mm256_setzero_si256();
#pragma GCC unroll 8
                for (int c = h; c < h + H; c++) {
                    const __m256i w0 = _mm256_load_si256((const __m256i *)p0->q[c]);
                    const __m256i w1 = _mm256_load_si256((const __m256i *)p1->q[c]);
#pragma GCC unroll 4
                    for (int j = 0; j < T; j++) {
                        const __m256i xv =
                            kx_u32(a, t, j, s0 + sb, offsetof(block_q8_K, qs) + 4 * (size_t)c);
                        s[0][j] = _mm256_add_epi16(s[0][j], _mm256_maddubs_epi16(w0, xv));
                        s[1][j] = _mm256_add_epi16(s[1][j], _mm256_maddubs_epi16(w1, xv));
                        in_reg(&s[0][j], &s[1][j]);
                    }
                }
#pragma GCC unroll 4
                for (int j = 0; j < T; j++) {
                    ia[0][j] = _mm256_add_epi32(ia[0][j], _mm256_madd_epi16(s[0][j], c0));
                    ia[1][j] = _mm256_add_epi32(ia[1][j], _mm256_madd_epi16(s[1][j], c1));
                }
            }
        }
        k_corr(type, a, p0, p1, t, s0 + sb, ia, im[sb], T);
    }
    k_fpass(type, a, P, s0, ks, r, nr, t, is, im, T);
}

/* The same on AVX-VNNI: vpdpbusd over each sub-block, mullo by its scale. */
static inline __attribute__((always_inline)) TGTV void
kv_micro(const int type, const kp_mm *a, const kpanel *P, uint32_t s0, uint32_t ks, uint32_t r,
         uint32_t nr, uint32_t t, const int T)
{
    const int nsub = k_nsub(type), cps = 64 / nsub;
    _Alignas(32) __m256i is[KS][2][GT], im[KS][2][GT];
    for (uint32_t sb = 0; sb < ks; sb++) {
        const kpanel *p0 = &P[2 * sb], *p1 = p0 + 1;
        __m256i(*ia)[GT] = is[sb];
#pragma GCC unroll 4
        for (int j = 0; j < T; j++)
            ia[0][j] = ia[1][j] = _mm256_setzero_si256();
#pragma GCC unroll 16
        for (int k = 0; k < nsub; k++) {
            __m256i s[2][GT];
#pragma GCC unroll 4
            for (int j = 0; j < T; j++)
                s[0][j] = s[1][j] = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int c = k * cps; c < (k + 1) * cps; c++) {
                const __m256i w0 = _mm256_load_si256((const __m256i *)p0->q[c]);
                const __m256i w1 = _mm256_load_si256((const __m256i *)p1->q[c]);
#pragma GCC unroll 4
                for (int j = 0; j < T; j++) {
                    const __m256i xv =
                        kx_u32(a, t, j, s0 + sb, offsetof(block_q8_K, qs) + 4 * (size_t)c);
                    s[0][j] = _mm256_dpbusd_avx_epi32(s[0][j], w0, xv);
                    s[1][j] = _mm256_dpbusd_avx_epi32(s[1][j], w1, xv);
                }
            }
            const __m256i c0 = _mm256_load_si256((const __m256i *)(const void *)p0->sc[k]);
            const __m256i c1 = _mm256_load_si256((const __m256i *)(const void *)p1->sc[k]);
#pragma GCC unroll 4
            for (int j = 0; j < T; j++) {
                ia[0][j] = _mm256_add_epi32(ia[0][j], _mm256_mullo_epi32(s[0][j], c0));
                ia[1][j] = _mm256_add_epi32(ia[1][j], _mm256_mullo_epi32(s[1][j], c1));
            }
        }
        k_corr(type, a, p0, p1, t, s0 + sb, ia, im[sb], T);
    }
    k_fpass(type, a, P, s0, ks, r, nr, t, is, im, T);
}

/* One noinline function per (variant, type, T), as the Q8_0/Q4_0 micro-kernels; a table
 * per (variant, type) for T = 1..GT. */
typedef void (*kmicro_fn)(const kp_mm *a, const kpanel *P, uint32_t s0, uint32_t ks, uint32_t r,
                          uint32_t nr, uint32_t t);

#define KMICRO_FN(name, attr, fn, type, T)                                                         \
    attr __attribute__((noinline)) static void name(const kp_mm *a, const kpanel *P, uint32_t s0,  \
                                                    uint32_t ks, uint32_t r, uint32_t nr,          \
                                                    uint32_t t)                                    \
    {                                                                                              \
        fn(type, a, P, s0, ks, r, nr, t, T);                                                       \
    }
#define KMICRO_SET(pfx, attr, fn, type)                                                            \
    KMICRO_FN(pfx##_1, attr, fn, type, 1)                                                          \
    KMICRO_FN(pfx##_2, attr, fn, type, 2)                                                          \
    KMICRO_FN(pfx##_3, attr, fn, type, 3)                                                          \
    KMICRO_FN(pfx##_4, attr, fn, type, 4)                                                          \
    static const kmicro_fn pfx##_kmicro[GT] = {pfx##_1, pfx##_2, pfx##_3, pfx##_4};

KMICRO_SET(aq2k, TGT, ka_micro, PE_GGML_TYPE_Q2_K)
KMICRO_SET(aq3k, TGT, ka_micro, PE_GGML_TYPE_Q3_K)
KMICRO_SET(aq4k, TGT, ka_micro, PE_GGML_TYPE_Q4_K)
KMICRO_SET(aq5k, TGT, ka_micro, PE_GGML_TYPE_Q5_K)
KMICRO_SET(aq6k, TGT, ka_micro, PE_GGML_TYPE_Q6_K)
KMICRO_SET(vq2k, TGTV, kv_micro, PE_GGML_TYPE_Q2_K)
KMICRO_SET(vq3k, TGTV, kv_micro, PE_GGML_TYPE_Q3_K)
KMICRO_SET(vq4k, TGTV, kv_micro, PE_GGML_TYPE_Q4_K)
KMICRO_SET(vq5k, TGTV, kv_micro, PE_GGML_TYPE_Q5_K)
KMICRO_SET(vq6k, TGTV, kv_micro, PE_GGML_TYPE_Q6_K)

#undef KMICRO_SET
#undef KMICRO_FN

/* k_repack for each type and variant, as one function each. */
#define KREPACK_FN(name, type, vnni)                                                               \
    TGT __attribute__((noinline)) static void name(const pe_mat *w, uint32_t r, uint32_t nr,       \
                                                   uint32_t s0, uint32_t ks, kpanel *P)            \
    {                                                                                              \
        k_repack(type, w, r, nr, s0, ks, vnni, P);                                                 \
    }
KREPACK_FN(aq2k_repack, PE_GGML_TYPE_Q2_K, 0)
KREPACK_FN(aq3k_repack, PE_GGML_TYPE_Q3_K, 0)
KREPACK_FN(aq4k_repack, PE_GGML_TYPE_Q4_K, 0)
KREPACK_FN(aq5k_repack, PE_GGML_TYPE_Q5_K, 0)
KREPACK_FN(aq6k_repack, PE_GGML_TYPE_Q6_K, 0)
KREPACK_FN(vq2k_repack, PE_GGML_TYPE_Q2_K, 1)
KREPACK_FN(vq3k_repack, PE_GGML_TYPE_Q3_K, 1)
KREPACK_FN(vq4k_repack, PE_GGML_TYPE_Q4_K, 1)
KREPACK_FN(vq5k_repack, PE_GGML_TYPE_Q5_K, 1)
KREPACK_FN(vq6k_repack, PE_GGML_TYPE_Q6_K, 1)
#undef KREPACK_FN

typedef void (*krepack_fn)(const pe_mat *w, uint32_t r, uint32_t nr, uint32_t s0, uint32_t ks,
                           kpanel *P);

/* The panel kernels of type for a variant, or 0 (no panels: the tiles below). */
static int k_panels(uint32_t type, int vnni, const kmicro_fn **micro, krepack_fn *repack)
{
#define K_PANELS(ty, a, v)                                                                         \
    case ty:                                                                                       \
        *micro = vnni ? v##_kmicro : a##_kmicro;                                                   \
        *repack = vnni ? v##_repack : a##_repack;                                                  \
        return 1;
    switch (type) {
        K_PANELS(PE_GGML_TYPE_Q2_K, aq2k, vq2k)
        K_PANELS(PE_GGML_TYPE_Q3_K, aq3k, vq3k)
        K_PANELS(PE_GGML_TYPE_Q4_K, aq4k, vq4k)
        K_PANELS(PE_GGML_TYPE_Q5_K, aq5k, vq5k)
        K_PANELS(PE_GGML_TYPE_Q6_K, aq6k, vq6k)
    default:
        return 0;
    }
#undef K_PANELS
}

/* y[t][r] for rows [r0, r1) and tokens [t0, t1) of a K-quant product on panels: chunks of
 * KP_TC tokens, 16 rows at a time, K chunks of KS super-blocks, micro-tiles of up to GT
 * tokens. The running sums live in sums[KP_TC][16] until the row group is done, not in y:
 * y's token stride is n_out floats, often a multiple of 4 KiB (8192 rows: 32 KiB), whose
 * lines all fall in a few cache sets (masked loads of y were the hottest instructions). */
TGT static void k_gemm(const pe_mat *w, const uint8_t *xq, size_t xq_stride, float *y, uint32_t r0,
                       uint32_t r1, uint32_t t0, uint32_t t1, const kmicro_fn *micro,
                       krepack_fn repack)
{
    pe_mat sw = *w; /* fa_load / fa_store address sums through m.y and m.w->n_out */
    sw.n_out = 16;
    _Alignas(32) float sums[KP_TC * 16];
    kp_mm a;
    memset(&a, 0, sizeof a);
    a.m.w = &sw;
    a.m.y = sums;
    a.xs = xq_stride;
    const uint32_t nsb = w->n_in / QK_K;
    _Alignas(32) kpanel P[2 * KS];
    for (uint32_t tc = t0; tc < t1; tc += KP_TC) {
        const uint32_t nc = t1 - tc < KP_TC ? t1 - tc : KP_TC;
        a.xq = xq + (size_t)tc * xq_stride;
        for (uint32_t r = r0; r < r1; r += 16) {
            const uint32_t nr = r1 - r < 16 ? r1 - r : 16;
            for (uint32_t s0 = 0; s0 < nsb; s0 += KS) {
                const uint32_t ks = nsb - s0 < KS ? nsb - s0 : KS;
                repack(w, r, nr, s0, ks, P);
                for (uint32_t t = 0; t < nc;) { /* as q_gemm: 6 = 3 + 3, not 4 + 2 */
                    const uint32_t left = nc - t, n_tiles = (left + GT - 1) / GT;
                    const uint32_t nt = (left + n_tiles - 1) / n_tiles;
                    micro[nt - 1](&a, P, s0, ks, 0, nr, t);
                    t += nt;
                }
            }
            for (uint32_t t = 0; t < nc; t++)
                memcpy(y + (size_t)(tc + t) * w->n_out + r, sums + (size_t)t * 16,
                       nr * sizeof(float));
        }
    }
}

/* Tokens 8 at a time (T = 8, R = 1: each weight block is unpacked once for 8 tokens),
 * fewer tokens in wide tiles (R = 8 / T, so that all 8 lanes work), the last rows of a
 * chunk one at a time. Loop order: the T tokens' activations stay in L1/L2 over the rows. */
TGT void pe__ext_rows_avx2(const pe_mat *w, const uint8_t *xq, size_t xq_stride, float *y,
                           uint32_t r0, uint32_t r1, uint32_t t0, uint32_t t1)
{
    const kmicro_fn *micro;
    krepack_fn repack;
    if (t1 - t0 >= KP_MIN_TOK && k_panels(w->type, 0, &micro, &repack)) {
        k_gemm(w, xq, xq_stride, y, r0, r1, t0, t1, micro, repack);
        return;
    }
    const ext_tile_fn(*tiles)[9];
    switch (w->type) {
    case PE_GGML_TYPE_Q4_K:
        tiles = q4_k_tiles;
        break;
    case PE_GGML_TYPE_Q6_K:
        tiles = q6_k_tiles;
        break;
    case PE_GGML_TYPE_Q5_K:
        tiles = q5_k_tiles;
        break;
    case PE_GGML_TYPE_Q3_K:
        tiles = q3_k_tiles;
        break;
    case PE_GGML_TYPE_Q2_K:
        tiles = q2_k_tiles;
        break;
    case PE_GGML_TYPE_Q4_1:
        tiles = q4_1_tiles;
        break;
    case PE_GGML_TYPE_Q5_0:
        tiles = q5_0_tiles;
        break;
    case PE_GGML_TYPE_Q5_1:
        tiles = q5_1_tiles;
        break;
    case PE_GGML_TYPE_IQ4_NL:
        tiles = iq4_nl_tiles;
        break;
    default:
        PE_UNREACHABLE_TYPE(w->type);
    }
    const size_t rb = w->row_bytes;
    static const uint32_t wide_r[5] = {0, 8, 4, 2, 2};
    const uint32_t nb = w->n_in / pe_ggml_get_traits(w->type)->blck_size;
    for (uint32_t t = t0; t < t1;) {
        const uint32_t nt = t1 - t < 8 ? t1 - t : 8;
        const uint32_t R = nt <= 4 ? wide_r[nt] : 1;
        uint32_t r = r0;
        ext_tile a = {NULL, rb, xq + t * xq_stride, xq_stride, NULL, w->n_out, nb};
        for (; R > 1 && r + R <= r1; r += R) {
            a.w = (const uint8_t *)w->data + r * rb;
            a.y = y + (size_t)t * w->n_out + r;
            tiles[1][nt](&a);
        }
        for (; r < r1; r++) {
            a.w = (const uint8_t *)w->data + r * rb;
            a.y = y + (size_t)t * w->n_out + r;
            tiles[0][nt](&a);
        }
        t += nt;
    }
}

/* The same with the K-quant panels on AVX-VNNI (the tiles below KP_MIN_TOK tokens, and for
 * the types without panels). */
TGTV void pe__ext_rows_avx2_vnni(const pe_mat *w, const uint8_t *xq, size_t xq_stride, float *y,
                                 uint32_t r0, uint32_t r1, uint32_t t0, uint32_t t1)
{
    const kmicro_fn *micro;
    krepack_fn repack;
    if (t1 - t0 >= KP_MIN_TOK && k_panels(w->type, 1, &micro, &repack))
        k_gemm(w, xq, xq_stride, y, r0, r1, t0, t1, micro, repack);
    else
        pe__ext_rows_avx2(w, xq, xq_stride, y, r0, r1, t0, t1);
}

#undef IQ4_NL_TILE
#undef Q5_1_TILE
#undef Q5_0_TILE
#undef Q4_1_TILE
#undef Q6_K_TILE
#undef Q5_K_TILE
#undef Q4_K_TILE
#undef Q3_K_TILE
#undef Q2_K_TILE
#undef EXT_SET
#undef EXT_FN

/* gemv is batch-invariant as it is (the only product path of this ISA): every (row, token)
 * of a tile has its own accumulator and the same instruction sequence whatever the tile's
 * shape (R, T) and bounds. */
/* rows_invariant stays the GEMV tiles at every token count: their bits depend on the row
 * and the token only (the panels' too, but they round differently from the tiles). The
 * AVX-VNNI level's are gemv_vnni's tiles (q_tile_vnni), as its decode products. A packed
 * matrix takes pk_gemv (pk_gemv_vnni): pe_matmul_ref's bits, as every product on the packed
 * copy, so that the stored rows are never read again. */
TGT static void rows_invariant_avx2(const pe_mm *m, uint32_t r0, uint32_t r1, uint32_t t0,
                                    uint32_t t1)
{
    if (m->w->packed)
        pk_gemv(m, r0, r1, t0, t1);
    else
        gemv(m, r0, r1, t0, t1);
}

TGTV static void rows_invariant_avx2_vnni(const pe_mm *m, uint32_t r0, uint32_t r1, uint32_t t0,
                                          uint32_t t1)
{
    if (m->w->packed)
        pk_gemv_vnni(m, r0, r1, t0, t1);
    else
        gemv_vnni(m, r0, r1, t0, t1);
}

const pe_kernels pe__kernels_avx2 = {
    quant_act, rows_avx2, rows_invariant_avx2, dot_f32, axpy_f32, rmsnorm, softmax, swiglu,
};

const pe_kernels pe__kernels_avx2_vnni = {
    quant_act, rows_avx2_vnni, rows_invariant_avx2_vnni, dot_f32, axpy_f32, rmsnorm,
    softmax,   swiglu,
};

#endif /* x86 */
