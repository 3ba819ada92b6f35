/* SPDX-License-Identifier: MIT */
/*
 * ops_avx512.c - AVX-512 (F/BW/VL/DQ/VNNI) kernels: pe_kernels for PE_ISA_AVX512. Reached
 * through ops.c's dispatch only; every function carries a target attribute, so the
 * library builds without -march flags.
 *
 * Two product paths:
 *
 * GEMV (fewer than PE_GEMM_MIN_TOK tokens: decode) works on the weights as stored, a tile
 * of R rows x T tokens at a time, each weight block loaded once for T tokens. Quantized
 * blocks use 256-bit vpdpbusd (unsigned x signed bytes): Q8_0 weights enter as q ^ 0x80 =
 * q + 128 and Q4_0 nibbles as q + 8, and the accumulator starts at the activation's
 * correction xc / 8 per lane, so the integer dot is exact. Memory bound.
 *
 * GEMM (prefill) repacks, per task, 32 rows x one K chunk into an L1-resident panel with
 * the rows in the vector lanes, so that no horizontal sums are needed:
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
 * Invariants: the integer part of every quantized dot is exact and the activation quantizer
 * is bit-identical to pe__quant_q8_0_ref; panel rows past n_out are zero and never stored.
 */
#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "ops_int.h"

#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#define INL static inline __attribute__((always_inline)) TGT

enum {
    QR = 4,  /* GEMV tile, quantized: rows x tokens */
    QT = 4,
    FR = 4,  /* GEMV tile, float */
    FT = 4,
    KB = 32, /* GEMM: blocks of 32 values per quantized panel (36 KB) */
    KC = 256, /* GEMM: values per float panel (32 KB) */
    GQT = 6, /* GEMM: tokens per quantized micro-tile */
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

INL float f16_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
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

TGT static void quant_act(const float *x, uint32_t n, int32_t off, int8_t *q, float *d,
                          int32_t *c)
{
    for (uint32_t b = 0; b < n / QK8_0; b++) {
        const float *xb = x + (size_t)b * QK8_0;
        __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        const float dd = amax / 127;
        const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
        d[b] = pe_f16_to_f32(pe_f32_to_f16(dd));
        const __m512 idv = _mm512_set1_ps(id);
        __m512i i0 = _mm512_cvttps_epi32(round_away(_mm512_mul_ps(v0, idv)));
        __m512i i1 = _mm512_cvttps_epi32(round_away(_mm512_mul_ps(v1, idv)));
        c[b] = -off * _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
        _mm_storeu_si128((__m128i *)(q + (size_t)b * QK8_0), _mm512_cvtepi32_epi8(i0));
        _mm_storeu_si128((__m128i *)(q + (size_t)b * QK8_0 + 16), _mm512_cvtepi32_epi8(i1));
    }
}

/* ---- GEMV: quantized tiles on the stored layout ---- */

/* The 32 values of a weight block as unsigned bytes (q + 128 for Q8_0, q + 8 for Q4_0). */
INL __m256i q_unsigned(const uint8_t *blk, const int q4)
{
    if (q4) {
        __m128i v = _mm_loadu_si128((const __m128i *)(blk + 2));
        __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1);
        return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
    }
    return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 2)),
                            _mm256_set1_epi8((char)0x80));
}

INL void q_tile(const pe_mm *m, const uint8_t *w0, size_t rb, uint32_t r, uint32_t t,
                const int q4, const int R, const int T)
{
    const size_t bsz = q4 ? sizeof(block_q4_0) : sizeof(block_q8_0);
    __m256 acc[4][4]; /* [R][T]: fixed size so that it lives in registers */
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int j = 0; j < T; j++) acc[i][j] = _mm256_setzero_ps();
    for (uint32_t b = 0; b < m->nb; b++) {
        __m256i wv[4];
        __m256 dw[4];
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) {
            const uint8_t *blk = w0 + (size_t)i * rb + b * bsz;
            wv[i] = q_unsigned(blk, q4);
            dw[i] = _mm256_set1_ps(f16_at(blk));
        }
#pragma GCC unroll 4
        for (int j = 0; j < T; j++) {
            const size_t tj = t + j;
            __m256i xv = _mm256_loadu_si256((const __m256i *)(m->xq + tj * m->xq_stride + b * 32));
            __m256 dx = _mm256_set1_ps(m->xd[tj * m->nb + b]);
            __m256i cv = _mm256_set1_epi32(m->xc[tj * m->nb + b] >> 3);
#pragma GCC unroll 4
            for (int i = 0; i < R; i++) {
                __m256i dot = _mm256_dpbusd_epi32(cv, wv[i], xv);
                __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(dot), dw[i]);
                acc[i][j] = _mm256_fmadd_ps(s, dx, acc[i][j]);
            }
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int j = 0; j < T; j++) m->y[(size_t)(t + j) * m->w->n_out + r + i] = hsum8(acc[i][j]);
}

/* ---- GEMV: float tiles ---- */

/* 16 weights of row p from k (n of them valid, the rest 0), as f32. */
INL __m512 f_load(const uint8_t *p, uint32_t k, __mmask16 mk, const int type)
{
    if (type == GGML_TYPE_F32) return _mm512_maskz_loadu_ps(mk, (const float *)p + k);
    __m256i h = _mm256_maskz_loadu_epi16(mk, (const uint16_t *)p + k);
    if (type == GGML_TYPE_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

INL void f_tile(const pe_mm *m, const uint8_t *w0, size_t rb, uint32_t r, uint32_t t,
                const int type, const int R, const int T)
{
    const uint32_t n = m->w->n_in;
    __m512 acc[4][4]; /* [R][T] */
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int j = 0; j < T; j++) acc[i][j] = _mm512_setzero_ps();
    for (uint32_t k = 0; k < n; k += 16) {
        const __mmask16 mk = mask16(n - k);
        __m512 wv[4];
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) wv[i] = f_load(w0 + (size_t)i * rb, k, mk, type);
#pragma GCC unroll 4
        for (int j = 0; j < T; j++) {
            __m512 xv = _mm512_maskz_loadu_ps(mk, m->x + (size_t)(t + j) * n + k);
#pragma GCC unroll 4
            for (int i = 0; i < R; i++) acc[i][j] = _mm512_fmadd_ps(wv[i], xv, acc[i][j]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int j = 0; j < T; j++) m->y[(size_t)(t + j) * m->w->n_out + r + i] = hsum16(acc[i][j]);
}

#define TILE_T(call, R, T)                                                                         \
    do {                                                                                           \
        switch (T) {                                                                               \
        case 1:                                                                                    \
            call(R, 1);                                                                            \
            break;                                                                                 \
        case 2:                                                                                    \
            call(R, 2);                                                                            \
            break;                                                                                 \
        case 3:                                                                                    \
            call(R, 3);                                                                            \
            break;                                                                                 \
        default:                                                                                   \
            call(R, 4);                                                                            \
            break;                                                                                 \
        }                                                                                          \
    } while (0)

#define Q8_TILE(R, T) q_tile(m, row, rb, r, t, 0, R, T)
#define Q4_TILE(R, T) q_tile(m, row, rb, r, t, 1, R, T)
#define F32_TILE(R, T) f_tile(m, row, rb, r, t, GGML_TYPE_F32, R, T)
#define F16_TILE(R, T) f_tile(m, row, rb, r, t, GGML_TYPE_F16, R, T)
#define BF16_TILE(R, T) f_tile(m, row, rb, r, t, GGML_TYPE_BF16, R, T)

#define WALK(TILE, RB, TB)                                                                         \
    do {                                                                                           \
        uint32_t r = r0;                                                                           \
        for (; r < r1; r += (r + RB <= r1 ? RB : 1)) {                                             \
            const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;                        \
            uint32_t t = t0;                                                                       \
            if (r + RB <= r1) {                                                                    \
                for (; t + TB <= t1; t += TB) TILE(RB, TB);                                        \
                if (t < t1) TILE_T(TILE, RB, t1 - t);                                              \
            } else {                                                                               \
                for (; t + TB <= t1; t += TB) TILE(1, TB);                                         \
                if (t < t1) TILE_T(TILE, 1, t1 - t);                                               \
            }                                                                                      \
        }                                                                                          \
    } while (0)

TGT static void gemv(const pe_mm *m, uint32_t r0, uint32_t r1, uint32_t t0, uint32_t t1)
{
    const pe_mat *w = m->w;
    const size_t rb = w->row_bytes;
    switch (w->type) {
    case GGML_TYPE_Q8_0:
        WALK(Q8_TILE, QR, QT);
        break;
    case GGML_TYPE_Q4_0:
        WALK(Q4_TILE, QR, QT);
        break;
    case GGML_TYPE_F32:
        WALK(F32_TILE, FR, FT);
        break;
    case GGML_TYPE_F16:
        WALK(F16_TILE, FR, FT);
        break;
    case GGML_TYPE_BF16:
        WALK(BF16_TILE, FR, FT);
        break;
    default:
        PE_UNREACHABLE_TYPE(w->type);
    }
}

/* ---- GEMM: quantized panels ---- */

typedef struct qpanel {
    float dw[16];
    uint8_t q[8][64];
} qpanel; /* one block of one group of 16 rows */

/* Repacks rows [r, r + nr) (nr <= 32) x blocks [b0, b0 + kb) into P[kb][2]. */
TGT static void q_repack(const pe_mat *w, uint32_t r, uint32_t nr, uint32_t b0, uint32_t kb,
                         qpanel *P)
{
    const int q4 = w->type == GGML_TYPE_Q4_0;
    const size_t bsz = q4 ? sizeof(block_q4_0) : sizeof(block_q8_0);
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
                                                             12, 13, 14, 15),
                                           _mm512_set1_epi32((int)w->row_bytes));
    const __m512i lo4 = _mm512_set1_epi8(0x0f), flip = _mm512_set1_epi8((char)0x80);
    for (uint32_t g = 0; g < 2; g++) {
        const uint32_t ng = nr > 16 * g ? nr - 16 * g : 0;
        const __mmask16 mr = mask16(ng);
        const uint8_t *base = (const uint8_t *)w->data + (size_t)(r + 16 * g) * w->row_bytes;
        for (uint32_t b = 0; b < kb; b++) {
            qpanel *p = &P[2 * b + g];
            if (ng == 0) {
                memset(p, 0, sizeof *p);
                continue;
            }
            const uint8_t *bb = base + (size_t)(b0 + b) * bsz;
            __m512i d = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mr, idx, bb, 1);
            _mm512_store_ps(p->dw, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d)));
            if (q4) {
                for (int k = 0; k < 4; k++) {
                    __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mr, idx,
                                                            bb + 2 + 4 * k, 1);
                    _mm512_store_si512(p->q[k], _mm512_and_si512(v, lo4));
                    _mm512_store_si512(p->q[k + 4], _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4));
                }
            } else {
                for (int k = 0; k < 8; k++) {
                    __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mr, idx,
                                                            bb + 2 + 4 * k, 1);
                    _mm512_store_si512(p->q[k], _mm512_xor_si512(v, flip));
                }
            }
        }
    }
}

/* Accumulates T tokens from t over blocks [b0, b0 + kb) of panel P into y (rows r, nr). */
INL void q_micro(const pe_mm *m, const qpanel *P, uint32_t b0, uint32_t kb, uint32_t r,
                 uint32_t nr, uint32_t t, int first, const int T)
{
    const uint32_t n_out = m->w->n_out;
    const __mmask16 m0 = mask16(nr), m1 = mask16(nr > 16 ? nr - 16 : 0);
    const int8_t *xq = m->xq + (size_t)t * m->xq_stride + (size_t)b0 * 32;
    const float *xd = m->xd + (size_t)t * m->nb + b0;
    const int32_t *xc = m->xc + (size_t)t * m->nb + b0;
    __m512 fa[2][GQT];
#pragma GCC unroll 12
    for (int j = 0; j < T; j++) {
        float *yj = m->y + (size_t)(t + j) * n_out + r;
        fa[0][j] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m0, yj);
        fa[1][j] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m1, yj + 16);
    }
    for (uint32_t b = 0; b < kb; b++) {
        const qpanel *p0 = &P[2 * b], *p1 = &P[2 * b + 1];
        __m512i ia[2][GQT];
#pragma GCC unroll 12
        for (int j = 0; j < T; j++) {
            ia[0][j] = _mm512_set1_epi32(xc[(size_t)j * m->nb + b]);
            ia[1][j] = ia[0][j];
        }
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const __m512i w0 = _mm512_load_si512(p0->q[k]);
            const __m512i w1 = _mm512_load_si512(p1->q[k]);
#pragma GCC unroll 12
            for (int j = 0; j < T; j++) {
                const __m512i xb = _mm512_set1_epi32(i32_at(xq + (size_t)j * m->xq_stride + b * 32 + 4 * k));
                ia[0][j] = _mm512_dpbusd_epi32(ia[0][j], w0, xb);
                ia[1][j] = _mm512_dpbusd_epi32(ia[1][j], w1, xb);
            }
        }
        const __m512 d0 = _mm512_load_ps(p0->dw), d1 = _mm512_load_ps(p1->dw);
#pragma GCC unroll 12
        for (int j = 0; j < T; j++) {
            const __m512 dx = _mm512_set1_ps(xd[(size_t)j * m->nb + b]);
            fa[0][j] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(ia[0][j]), d0), dx, fa[0][j]);
            fa[1][j] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(ia[1][j]), d1), dx, fa[1][j]);
        }
    }
#pragma GCC unroll 12
    for (int j = 0; j < T; j++) {
        float *yj = m->y + (size_t)(t + j) * n_out + r;
        _mm512_mask_storeu_ps(yj, m0, fa[0][j]);
        _mm512_mask_storeu_ps(yj + 16, m1, fa[1][j]);
    }
}

#define Q_MICRO(T) q_micro(m, P, b0, kb, r, nr, t, b0 == 0, T)

TGT static void q_gemm(const pe_mm *m, uint32_t r0, uint32_t r1, uint32_t t0, uint32_t t1)
{
    _Alignas(64) qpanel P[2 * KB];
    for (uint32_t b0 = 0; b0 < m->nb; b0 += KB) {
        const uint32_t kb = m->nb - b0 < KB ? m->nb - b0 : KB;
        for (uint32_t r = r0; r < r1; r += 32) {
            const uint32_t nr = r1 - r < 32 ? r1 - r : 32;
            q_repack(m->w, r, nr, b0, kb, P);
            uint32_t t = t0;
            for (; t + GQT <= t1; t += GQT) Q_MICRO(GQT);
            switch (t1 - t) {
            case 0:
                break;
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
            default:
                Q_MICRO(5);
                break;
            }
        }
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
    for (int i = 0; i < 16; i++) r[i] = o[i];
}

/* Repacks rows [r, r + nr) (nr <= 32) x values [k0, k0 + kc) into P[kc][32] f32. */
INL void f_repack_t(const pe_mat *w, uint32_t r, uint32_t nr, uint32_t k0, uint32_t kc, float *P,
                    const int type)
{
    for (uint32_t g = 0; g < 2; g++) {
        for (uint32_t k = 0; k < kc; k += 16) {
            const __mmask16 mk = mask16(kc - k);
            __m512 v[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) {
                uint32_t row = 16 * g + (uint32_t)i;
                v[i] = row < nr ? f_load((const uint8_t *)w->data + (size_t)(r + row) * w->row_bytes,
                                         k0 + k, mk, type)
                                : _mm512_setzero_ps();
            }
            transpose16(v);
            const uint32_t nk = kc - k < 16 ? kc - k : 16;
            for (uint32_t i = 0; i < nk; i++) _mm512_store_ps(P + (size_t)(k + i) * 32 + 16 * g, v[i]);
        }
    }
}

TGT static void f_repack(const pe_mat *w, uint32_t r, uint32_t nr, uint32_t k0, uint32_t kc,
                         float *P)
{
    if (w->type == GGML_TYPE_F32)
        f_repack_t(w, r, nr, k0, kc, P, GGML_TYPE_F32);
    else if (w->type == GGML_TYPE_F16)
        f_repack_t(w, r, nr, k0, kc, P, GGML_TYPE_F16);
    else
        f_repack_t(w, r, nr, k0, kc, P, GGML_TYPE_BF16);
}

INL void f_micro(const pe_mm *m, const float *P, uint32_t k0, uint32_t kc, uint32_t r,
                 uint32_t nr, uint32_t t, int first, const int T)
{
    const uint32_t n_out = m->w->n_out, n_in = m->w->n_in;
    const __mmask16 m0 = mask16(nr), m1 = mask16(nr > 16 ? nr - 16 : 0);
    const float *x = m->x + (size_t)t * n_in + k0;
    __m512 fa[2][GFT];
#pragma GCC unroll 12
    for (int j = 0; j < T; j++) {
        float *yj = m->y + (size_t)(t + j) * n_out + r;
        fa[0][j] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m0, yj);
        fa[1][j] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m1, yj + 16);
    }
    for (uint32_t k = 0; k < kc; k++) {
        const __m512 w0 = _mm512_load_ps(P + (size_t)k * 32);
        const __m512 w1 = _mm512_load_ps(P + (size_t)k * 32 + 16);
#pragma GCC unroll 12
        for (int j = 0; j < T; j++) {
            const __m512 xb = _mm512_set1_ps(x[(size_t)j * n_in + k]);
            fa[0][j] = _mm512_fmadd_ps(w0, xb, fa[0][j]);
            fa[1][j] = _mm512_fmadd_ps(w1, xb, fa[1][j]);
        }
    }
#pragma GCC unroll 12
    for (int j = 0; j < T; j++) {
        float *yj = m->y + (size_t)(t + j) * n_out + r;
        _mm512_mask_storeu_ps(yj, m0, fa[0][j]);
        _mm512_mask_storeu_ps(yj + 16, m1, fa[1][j]);
    }
}

#define F_MICRO(T) f_micro(m, P, k0, kc, r, nr, t, k0 == 0, T)

TGT static void f_gemm(const pe_mm *m, uint32_t r0, uint32_t r1, uint32_t t0, uint32_t t1)
{
    _Alignas(64) float P[KC * 32];
    const uint32_t n_in = m->w->n_in;
    for (uint32_t k0 = 0; k0 < n_in; k0 += KC) {
        const uint32_t kc = n_in - k0 < KC ? n_in - k0 : KC;
        for (uint32_t r = r0; r < r1; r += 32) {
            const uint32_t nr = r1 - r < 32 ? r1 - r : 32;
            f_repack(m->w, r, nr, k0, kc, P);
            uint32_t t = t0;
            for (; t + GFT <= t1; t += GFT) F_MICRO(GFT);
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
    if (t1 - t0 < PE_GEMM_MIN_TOK)
        gemv(m, r0, r1, t0, t1);
    else if (pe__type_is_quant(m->w->type))
        q_gemm(m, r0, r1, t0, t1);
    else
        f_gemm(m, r0, r1, t0, t1);
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
        s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, a + i), _mm512_maskz_loadu_ps(mk, b + i), s0);
    }
    return hsum16(_mm512_add_ps(s0, s1));
}

TGT static void axpy_f32(float *y, float a, const float *x, uint32_t n)
{
    const __m512 av = _mm512_set1_ps(a);
    for (uint32_t i = 0; i < n; i += 16) {
        const __mmask16 mk = mask16(n - i);
        __m512 v = _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(mk, x + i), _mm512_maskz_loadu_ps(mk, y + i));
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
    for (; i < n; i++) ss += (double)x[i] * x[i];
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
        __m512 s = _mm512_div_ps(gv, _mm512_add_ps(one, vexp(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
        _mm512_mask_storeu_ps(g + i, mk, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(mk, u + i)));
    }
}

const pe_kernels pe__kernels_avx512 = {
    quant_act, rows_avx512, dot_f32, axpy_f32, rmsnorm, softmax, swiglu,
};

#endif /* x86 */
