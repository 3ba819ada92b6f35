/* SPDX-License-Identifier: MIT */
/*
 * kern_x86.h - the AVX2 and AVX-512 k_scores / v_accum loops that every codec shares,
 * written once over a codec's vector loader (included by the codec files on x86 only).
 *
 * A loader ld(region, page_tokens, head_dim, row, d) returns the VW decoded values
 * [d, d + VW) of one row in a register (VW = 8 for AVX2, 16 for AVX-512); the loops call
 * it with d a multiple of VW, so a codec needs head_dim % VW == 0 (the codec files fall
 * back to narrower kernels otherwise). The loops are always_inline and the loader is a
 * constant function pointer, so each codec gets its own fully inlined kernel (no call in
 * the inner loop; check with objdump after changes).
 *
 *   k_scores: tiles of R = 4 rows x NH query heads (NH <= 4 on AVX-512, <= 2 on AVX2),
 *             R*NH independent FMA chains, each row's values decoded once per tile and used
 *             for NH heads; the 4 rows' sums of a head are reduced together (hadd tree)
 *             and stored as one vector. Leftover rows go one at a time.
 *   v_accum:  tiles of NH heads x CW vectors of output held in registers across all n
 *             rows; each row chunk decoded once per tile and used for NH heads.
 */
#ifndef PGD_KERN_X86_H
#define PGD_KERN_X86_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#define PGD__T2 __attribute__((target("avx2,fma,f16c")))
#define PGD__T5 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define PGD__I2 static inline __attribute__((always_inline)) PGD__T2
#define PGD__I5 static inline __attribute__((always_inline)) PGD__T5

typedef __m256 (*pgd__ld8_fn)(const uint8_t *reg, uint32_t pt, uint32_t hd, uint32_t r, uint32_t d);
typedef __m512 (*pgd__ld16_fn)(const uint8_t *reg, uint32_t pt, uint32_t hd, uint32_t r,
                               uint32_t d);

/* Broadcast of one f16 scale to 8 / 16 lanes. */
PGD__I2 __m256 pgd__bcast_f16_8(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_set1_epi16((short)*p));
}
PGD__I5 __m512 pgd__bcast_f16_16(const uint16_t *p)
{
    return _mm512_cvtph_ps(_mm256_set1_epi16((short)*p));
}

/* Sums of 4 vectors: {sum(a), sum(b), sum(c), sum(d)}. */
PGD__I2 __m128 pgd__reduce4_8(__m256 a, __m256 b, __m256 c, __m256 d)
{
    __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
    __m256 abcd = _mm256_hadd_ps(ab, cd); /* per 128-bit lane: a b c d partial sums */
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}
PGD__I5 __m128 pgd__reduce4_16(__m512 a, __m512 b, __m512 c, __m512 d)
{
    __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    __m256 b8 = _mm256_add_ps(_mm512_castps512_ps256(b), _mm512_extractf32x8_ps(b, 1));
    __m256 c8 = _mm256_add_ps(_mm512_castps512_ps256(c), _mm512_extractf32x8_ps(c, 1));
    __m256 d8 = _mm256_add_ps(_mm512_castps512_ps256(d), _mm512_extractf32x8_ps(d, 1));
    return pgd__reduce4_8(a8, b8, c8, d8);
}

/* ---- AVX2 ---- */

PGD__I2 void pgd__ks2_tile(const uint8_t *reg, uint32_t pt, uint32_t hd, uint32_t r, const float *q,
                           const int R, const int NH, float scale, float *sc, size_t ld,
                           pgd__ld8_fn load)
{
    __m256 acc[4][4], x[4];
    for (int i = 0; i < R; i++)
        for (int h = 0; h < NH; h++)
            acc[i][h] = _mm256_setzero_ps();
    for (uint32_t d = 0; d < hd; d += 8) {
        for (int i = 0; i < R; i++)
            x[i] = load(reg, pt, hd, r + (uint32_t)i, d);
        for (int h = 0; h < NH; h++) {
            __m256 qv = _mm256_loadu_ps(q + (size_t)h * hd + d);
            for (int i = 0; i < R; i++)
                acc[i][h] = _mm256_fmadd_ps(qv, x[i], acc[i][h]);
        }
    }
    if (R == 4) {
        for (int h = 0; h < NH; h++)
            _mm_storeu_ps(sc + (size_t)h * ld,
                          _mm_mul_ps(pgd__reduce4_8(acc[0][h], acc[1][h], acc[2][h], acc[3][h]),
                                     _mm_set1_ps(scale)));
        return;
    }
    /* One row: the very reduction of a row in a group of 4 (lane 0 of reduce4 depends on
     * its own vector only), so a key's score does not depend on how many keys the call
     * has (a decode row and the same row of a prefill tile get the same bits). */
    const __m256 z = _mm256_setzero_ps();
    for (int i = 0; i < R; i++)
        for (int h = 0; h < NH; h++)
            sc[(size_t)h * ld + (size_t)i] =
                _mm_cvtss_f32(pgd__reduce4_8(acc[i][h], z, z, z)) * scale;
}

/* Four K rows x 3 query vectors (prefill tiles, nq >= 6): each converted row serves 3
 * queries instead of 2 (12 accumulators, the 3 query vectors and one row in the 16
 * registers). The same fma chains and reduction per (row, query) as pgd__ks2_tile, so the
 * same bits. */
PGD__I2 void pgd__ks2_tile3(const uint8_t *reg, uint32_t pt, uint32_t hd, uint32_t r,
                            const float *q, float scale, float *sc, size_t ld, pgd__ld8_fn load)
{
    __m256 acc[4][3];
    for (int i = 0; i < 4; i++)
        for (int h = 0; h < 3; h++)
            acc[i][h] = _mm256_setzero_ps();
    for (uint32_t d = 0; d < hd; d += 8) {
        __m256 qv[3];
        for (int h = 0; h < 3; h++)
            qv[h] = _mm256_loadu_ps(q + (size_t)h * hd + d);
        for (int i = 0; i < 4; i++) {
            const __m256 x = load(reg, pt, hd, r + (uint32_t)i, d);
            for (int h = 0; h < 3; h++)
                acc[i][h] = _mm256_fmadd_ps(qv[h], x, acc[i][h]);
        }
    }
    for (int h = 0; h < 3; h++)
        _mm_storeu_ps(sc + (size_t)h * ld,
                      _mm_mul_ps(pgd__reduce4_8(acc[0][h], acc[1][h], acc[2][h], acc[3][h]),
                                 _mm_set1_ps(scale)));
}

PGD__I2 void pgd__ks2(const void *region, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n,
                      const float *q, uint32_t nq, float scale, float *scores, size_t ld,
                      pgd__ld8_fn load)
{
    const uint8_t *reg = region;
    uint32_t h0 = 0;
    /* Many query vectors (a prefill tile): groups of 3 while at least 5 are left (the last
     * 4 go as 2 + 2), then the groups of 2 below. */
    if (nq >= 6)
        for (; nq - h0 >= 5; h0 += 3) {
            const float *qh = q + (size_t)h0 * hd;
            float *sh = scores + (size_t)h0 * ld;
            uint32_t j = 0;
            for (; j + 4 <= n; j += 4)
                pgd__ks2_tile3(reg, pt, hd, r0 + j, qh, scale, sh + j, ld, load);
            for (; j < n; j++)
                pgd__ks2_tile(reg, pt, hd, r0 + j, qh, 1, 3, scale, sh + j, ld, load);
        }
    for (; h0 < nq; h0 += 2) {
        uint32_t nh = nq - h0 < 2 ? nq - h0 : 2, j = 0;
        const float *qh = q + (size_t)h0 * hd;
        float *sh = scores + (size_t)h0 * ld;
        if (nh == 1)
            for (; j + 4 <= n; j += 4)
                pgd__ks2_tile(reg, pt, hd, r0 + j, qh, 4, 1, scale, sh + j, ld, load);
        else
            for (; j + 4 <= n; j += 4)
                pgd__ks2_tile(reg, pt, hd, r0 + j, qh, 4, 2, scale, sh + j, ld, load);
        for (; j < n; j++) {
            if (nh == 1)
                pgd__ks2_tile(reg, pt, hd, r0 + j, qh, 1, 1, scale, sh + j, ld, load);
            else
                pgd__ks2_tile(reg, pt, hd, r0 + j, qh, 1, 2, scale, sh + j, ld, load);
        }
    }
}

PGD__I2 void pgd__va2_tile(const uint8_t *reg, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n,
                           const float *a, size_t lda, float *out, uint32_t d0, const int NH,
                           const int CW, pgd__ld8_fn load)
{
    __m256 acc[2][4], x[4];
    for (int h = 0; h < NH; h++)
        for (int c = 0; c < CW; c++)
            acc[h][c] = _mm256_loadu_ps(out + (size_t)h * hd + d0 + 8 * c);
    for (uint32_t j = 0; j < n; j++) {
        for (int c = 0; c < CW; c++)
            x[c] = load(reg, pt, hd, r0 + j, d0 + 8 * (uint32_t)c);
        for (int h = 0; h < NH; h++) {
            __m256 w = _mm256_broadcast_ss(a + (size_t)h * lda + j);
            for (int c = 0; c < CW; c++)
                acc[h][c] = _mm256_fmadd_ps(w, x[c], acc[h][c]);
        }
    }
    for (int h = 0; h < NH; h++)
        for (int c = 0; c < CW; c++)
            _mm256_storeu_ps(out + (size_t)h * hd + d0 + 8 * c, acc[h][c]);
}

PGD__I2 void pgd__va2(const void *region, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n,
                      const float *a, size_t lda, uint32_t nq, float *out, pgd__ld8_fn load)
{
    const uint8_t *reg = region;
    for (uint32_t d0 = 0; d0 < hd;) {
        uint32_t left = (hd - d0) / 8, cw = left >= 4 ? 4 : left >= 2 ? 2 : 1;
        for (uint32_t h0 = 0; h0 < nq;) {
            uint32_t nh = nq - h0 >= 2 ? 2 : 1;
            const float *ah = a + (size_t)h0 * lda;
            float *oh = out + (size_t)h0 * hd;
            if (nh == 2) {
                if (cw == 4)
                    pgd__va2_tile(reg, pt, hd, r0, n, ah, lda, oh, d0, 2, 4, load);
                else if (cw == 2)
                    pgd__va2_tile(reg, pt, hd, r0, n, ah, lda, oh, d0, 2, 2, load);
                else
                    pgd__va2_tile(reg, pt, hd, r0, n, ah, lda, oh, d0, 2, 1, load);
            } else {
                if (cw == 4)
                    pgd__va2_tile(reg, pt, hd, r0, n, ah, lda, oh, d0, 1, 4, load);
                else if (cw == 2)
                    pgd__va2_tile(reg, pt, hd, r0, n, ah, lda, oh, d0, 1, 2, load);
                else
                    pgd__va2_tile(reg, pt, hd, r0, n, ah, lda, oh, d0, 1, 1, load);
            }
            h0 += nh;
        }
        d0 += 8 * cw;
    }
}

/* ---- AVX-512 ---- */

PGD__I5 void pgd__ks5_tile(const uint8_t *reg, uint32_t pt, uint32_t hd, uint32_t r, const float *q,
                           const int R, const int NH, float scale, float *sc, size_t ld,
                           pgd__ld16_fn load)
{
    __m512 acc[4][4], x[4];
    for (int i = 0; i < R; i++)
        for (int h = 0; h < NH; h++)
            acc[i][h] = _mm512_setzero_ps();
    for (uint32_t d = 0; d < hd; d += 16) {
        for (int i = 0; i < R; i++)
            x[i] = load(reg, pt, hd, r + (uint32_t)i, d);
        for (int h = 0; h < NH; h++) {
            __m512 qv = _mm512_loadu_ps(q + (size_t)h * hd + d);
            for (int i = 0; i < R; i++)
                acc[i][h] = _mm512_fmadd_ps(qv, x[i], acc[i][h]);
        }
    }
    if (R == 4) {
        for (int h = 0; h < NH; h++)
            _mm_storeu_ps(sc + (size_t)h * ld,
                          _mm_mul_ps(pgd__reduce4_16(acc[0][h], acc[1][h], acc[2][h], acc[3][h]),
                                     _mm_set1_ps(scale)));
        return;
    }
    /* One row: the reduction of a row in a group of 4 (see pgd__ks2_tile). */
    const __m512 z = _mm512_setzero_ps();
    for (int i = 0; i < R; i++)
        for (int h = 0; h < NH; h++)
            sc[(size_t)h * ld + (size_t)i] =
                _mm_cvtss_f32(pgd__reduce4_16(acc[i][h], z, z, z)) * scale;
}

PGD__I5 void pgd__ks5(const void *region, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n,
                      const float *q, uint32_t nq, float scale, float *scores, size_t ld,
                      pgd__ld16_fn load)
{
    const uint8_t *reg = region;
    for (uint32_t h0 = 0; h0 < nq; h0 += 4) {
        uint32_t nh = nq - h0 < 4 ? nq - h0 : 4, j = 0;
        const float *qh = q + (size_t)h0 * hd;
        float *sh = scores + (size_t)h0 * ld;
        for (; j + 4 <= n; j += 4) {
            if (nh == 1)
                pgd__ks5_tile(reg, pt, hd, r0 + j, qh, 4, 1, scale, sh + j, ld, load);
            else if (nh == 2)
                pgd__ks5_tile(reg, pt, hd, r0 + j, qh, 4, 2, scale, sh + j, ld, load);
            else if (nh == 3)
                pgd__ks5_tile(reg, pt, hd, r0 + j, qh, 4, 3, scale, sh + j, ld, load);
            else
                pgd__ks5_tile(reg, pt, hd, r0 + j, qh, 4, 4, scale, sh + j, ld, load);
        }
        for (; j < n; j++) {
            if (nh == 1)
                pgd__ks5_tile(reg, pt, hd, r0 + j, qh, 1, 1, scale, sh + j, ld, load);
            else if (nh == 2)
                pgd__ks5_tile(reg, pt, hd, r0 + j, qh, 1, 2, scale, sh + j, ld, load);
            else if (nh == 3)
                pgd__ks5_tile(reg, pt, hd, r0 + j, qh, 1, 3, scale, sh + j, ld, load);
            else
                pgd__ks5_tile(reg, pt, hd, r0 + j, qh, 1, 4, scale, sh + j, ld, load);
        }
    }
}

PGD__I5 void pgd__va5_tile(const uint8_t *reg, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n,
                           const float *a, size_t lda, float *out, uint32_t d0, const int NH,
                           const int CW, pgd__ld16_fn load)
{
    __m512 acc[4][4], x[4];
    for (int h = 0; h < NH; h++)
        for (int c = 0; c < CW; c++)
            acc[h][c] = _mm512_loadu_ps(out + (size_t)h * hd + d0 + 16 * c);
    for (uint32_t j = 0; j < n; j++) {
        for (int c = 0; c < CW; c++)
            x[c] = load(reg, pt, hd, r0 + j, d0 + 16 * (uint32_t)c);
        for (int h = 0; h < NH; h++) {
            __m512 w = _mm512_set1_ps(a[(size_t)h * lda + j]);
            for (int c = 0; c < CW; c++)
                acc[h][c] = _mm512_fmadd_ps(w, x[c], acc[h][c]);
        }
    }
    for (int h = 0; h < NH; h++)
        for (int c = 0; c < CW; c++)
            _mm512_storeu_ps(out + (size_t)h * hd + d0 + 16 * c, acc[h][c]);
}

#define PGD__VA5_CW(NH)                                                                            \
    do {                                                                                           \
        if (cw == 4)                                                                               \
            pgd__va5_tile(reg, pt, hd, r0, n, ah, lda, oh, d0, NH, 4, load);                       \
        else if (cw == 2)                                                                          \
            pgd__va5_tile(reg, pt, hd, r0, n, ah, lda, oh, d0, NH, 2, load);                       \
        else                                                                                       \
            pgd__va5_tile(reg, pt, hd, r0, n, ah, lda, oh, d0, NH, 1, load);                       \
    } while (0)

PGD__I5 void pgd__va5(const void *region, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n,
                      const float *a, size_t lda, uint32_t nq, float *out, pgd__ld16_fn load)
{
    const uint8_t *reg = region;
    for (uint32_t d0 = 0; d0 < hd;) {
        uint32_t left = (hd - d0) / 16, cw = left >= 4 ? 4 : left >= 2 ? 2 : 1;
        for (uint32_t h0 = 0; h0 < nq;) {
            uint32_t nh = nq - h0 >= 4 ? 4 : nq - h0 >= 2 ? 2 : 1;
            const float *ah = a + (size_t)h0 * lda;
            float *oh = out + (size_t)h0 * hd;
            if (nh == 4)
                PGD__VA5_CW(4);
            else if (nh == 2)
                PGD__VA5_CW(2);
            else
                PGD__VA5_CW(1);
            h0 += nh;
        }
        d0 += 16 * cw;
    }
}

/* ---- decode kernels with a spread software prefetch (k_scores_pf / v_accum_pf) ----
 *
 * The plain kernels above over rows [r0, r0 + n) that also prefetch region `next` (NULL:
 * none), one share of next_bytes * PGD__PF_ROWS / pt bytes per group of PGD__PF_ROWS rows, so
 * that the next page streams in at the pace this one is consumed, with no call per group.
 * Bits: a K row's score is its own reduction (pgd__ks2_tile), a V output lane is the fma
 * chain of the rows in row order, so neither depends on how rows are grouped, nor on a
 * tile's width: the results equal k_scores / v_accum over the same rows.
 * V keeps a tile of NH x CW output vectors in registers over all n rows (one head and a
 * whole 128-value row: CW 8 on AVX-512, 2 x 8 on AVX2) and prefetches during the first tile. */
enum { PGD__PF_ROWS = 4 };

static inline __attribute__((always_inline)) void pgd__pf_share(const void *next, size_t off,
                                                                size_t n)
{
    const char *c = (const char *)next + off;
    for (size_t o = 0; o < n; o += 64)
        __builtin_prefetch(c + o, 0, 3);
}

PGD__I2 void pgd__ks2_pf(const void *region, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n,
                         const float *q, uint32_t nq, float scale, float *scores, size_t ld,
                         const void *next, size_t next_bytes, pgd__ld8_fn load)
{
    const size_t chunk = next ? next_bytes * PGD__PF_ROWS / pt : 0;
    for (uint32_t j = 0; j < n; j += PGD__PF_ROWS) {
        const uint32_t m = n - j < PGD__PF_ROWS ? n - j : PGD__PF_ROWS;
        if (chunk) pgd__pf_share(next, (size_t)j / PGD__PF_ROWS * chunk, chunk);
        pgd__ks2(region, pt, hd, r0 + j, m, q, nq, scale, scores + j, ld, load);
    }
}

PGD__I5 void pgd__ks5_pf(const void *region, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n,
                         const float *q, uint32_t nq, float scale, float *scores, size_t ld,
                         const void *next, size_t next_bytes, pgd__ld16_fn load)
{
    const size_t chunk = next ? next_bytes * PGD__PF_ROWS / pt : 0;
    for (uint32_t j = 0; j < n; j += PGD__PF_ROWS) {
        const uint32_t m = n - j < PGD__PF_ROWS ? n - j : PGD__PF_ROWS;
        if (chunk) pgd__pf_share(next, (size_t)j / PGD__PF_ROWS * chunk, chunk);
        pgd__ks5(region, pt, hd, r0 + j, m, q, nq, scale, scores + j, ld, load);
    }
}

PGD__I2 void pgd__va2_pf_tile(const uint8_t *reg, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n,
                              const float *a, size_t lda, float *out, uint32_t d0, const int NH,
                              const int CW, const void *next, size_t chunk, pgd__ld8_fn load)
{
    __m256 acc[2][8];
    for (int h = 0; h < NH; h++)
        for (int c = 0; c < CW; c++)
            acc[h][c] = _mm256_loadu_ps(out + (size_t)h * hd + d0 + 8 * c);
    for (uint32_t j = 0; j < n; j++) {
        if (chunk && j % PGD__PF_ROWS == 0)
            pgd__pf_share(next, (size_t)j / PGD__PF_ROWS * chunk, chunk);
        for (int h = 0; h < NH; h++) {
            __m256 w = _mm256_broadcast_ss(a + (size_t)h * lda + j);
            for (int c = 0; c < CW; c++)
                acc[h][c] =
                    _mm256_fmadd_ps(w, load(reg, pt, hd, r0 + j, d0 + 8 * (uint32_t)c), acc[h][c]);
        }
    }
    for (int h = 0; h < NH; h++)
        for (int c = 0; c < CW; c++)
            _mm256_storeu_ps(out + (size_t)h * hd + d0 + 8 * c, acc[h][c]);
}

PGD__I2 void pgd__va2_pf(const void *region, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n,
                         const float *a, size_t lda, uint32_t nq, float *out, const void *next,
                         size_t next_bytes, pgd__ld8_fn load)
{
    const uint8_t *reg = region;
    size_t chunk = next ? next_bytes * PGD__PF_ROWS / pt : 0;
    for (uint32_t d0 = 0; d0 < hd;) {
        /* One head: up to 8 vectors; more: two heads of up to 4 (8 accumulators). */
        const uint32_t left = (hd - d0) / 8;
        const uint32_t cw = left >= 8 && nq == 1 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
        for (uint32_t h0 = 0; h0 < nq;) {
            const uint32_t nh = nq - h0 >= 2 ? 2 : 1;
            const float *ah = a + (size_t)h0 * lda;
            float *oh = out + (size_t)h0 * hd;
#define PGD__VA2_PF(NH, CW)                                                                        \
    pgd__va2_pf_tile(reg, pt, hd, r0, n, ah, lda, oh, d0, NH, CW, next, chunk, load)
            if (cw == 8)
                PGD__VA2_PF(1, 8);
            else if (nh == 2 && cw == 4)
                PGD__VA2_PF(2, 4);
            else if (nh == 2 && cw == 2)
                PGD__VA2_PF(2, 2);
            else if (nh == 2)
                PGD__VA2_PF(2, 1);
            else if (cw == 4)
                PGD__VA2_PF(1, 4);
            else if (cw == 2)
                PGD__VA2_PF(1, 2);
            else
                PGD__VA2_PF(1, 1);
#undef PGD__VA2_PF
            chunk = 0; /* the first tile prefetches */
            h0 += nh;
        }
        d0 += 8 * cw;
    }
}

PGD__I5 void pgd__va5_pf_tile(const uint8_t *reg, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n,
                              const float *a, size_t lda, float *out, uint32_t d0, const int NH,
                              const int CW, const void *next, size_t chunk, pgd__ld16_fn load)
{
    __m512 acc[4][8];
    for (int h = 0; h < NH; h++)
        for (int c = 0; c < CW; c++)
            acc[h][c] = _mm512_loadu_ps(out + (size_t)h * hd + d0 + 16 * c);
    for (uint32_t j = 0; j < n; j++) {
        if (chunk && j % PGD__PF_ROWS == 0)
            pgd__pf_share(next, (size_t)j / PGD__PF_ROWS * chunk, chunk);
        __m512 x[8];
        for (int c = 0; c < CW; c++)
            x[c] = load(reg, pt, hd, r0 + j, d0 + 16 * (uint32_t)c);
        for (int h = 0; h < NH; h++) {
            __m512 w = _mm512_set1_ps(a[(size_t)h * lda + j]);
            for (int c = 0; c < CW; c++)
                acc[h][c] = _mm512_fmadd_ps(w, x[c], acc[h][c]);
        }
    }
    for (int h = 0; h < NH; h++)
        for (int c = 0; c < CW; c++)
            _mm512_storeu_ps(out + (size_t)h * hd + d0 + 16 * c, acc[h][c]);
}

PGD__I5 void pgd__va5_pf(const void *region, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n,
                         const float *a, size_t lda, uint32_t nq, float *out, const void *next,
                         size_t next_bytes, pgd__ld16_fn load)
{
    const uint8_t *reg = region;
    size_t chunk = next ? next_bytes * PGD__PF_ROWS / pt : 0;
    for (uint32_t d0 = 0; d0 < hd;) {
        const uint32_t left = (hd - d0) / 16;
        /* Up to 16 accumulators: 1 head x 8 vectors, 2 x 8, 4 x 4. */
        const uint32_t cw = left >= 8 && nq <= 2 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
        for (uint32_t h0 = 0; h0 < nq;) {
            const uint32_t nh = nq - h0 >= 4 && cw <= 4 ? 4
                                : nq - h0 >= 2          ? 2
                                                        : 1; /* cw 8: nq <= 2 */
            const float *ah = a + (size_t)h0 * lda;
            float *oh = out + (size_t)h0 * hd;
#define PGD__VA5_PF(NH, CW)                                                                        \
    pgd__va5_pf_tile(reg, pt, hd, r0, n, ah, lda, oh, d0, NH, CW, next, chunk, load)
            if (nh == 4 && cw == 4)
                PGD__VA5_PF(4, 4);
            else if (nh == 4 && cw == 2)
                PGD__VA5_PF(4, 2);
            else if (nh == 4)
                PGD__VA5_PF(4, 1);
            else if (nh == 2 && cw == 8)
                PGD__VA5_PF(2, 8);
            else if (nh == 2 && cw == 4)
                PGD__VA5_PF(2, 4);
            else if (nh == 2 && cw == 2)
                PGD__VA5_PF(2, 2);
            else if (nh == 2)
                PGD__VA5_PF(2, 1);
            else if (cw == 8)
                PGD__VA5_PF(1, 8);
            else if (cw == 4)
                PGD__VA5_PF(1, 4);
            else if (cw == 2)
                PGD__VA5_PF(1, 2);
            else
                PGD__VA5_PF(1, 1);
#undef PGD__VA5_PF
            chunk = 0; /* the first tile prefetches */
            h0 += nh;
        }
        d0 += 16 * cw;
    }
}

/* PGD__DEFINE_SIMD_K defines static PREFIX_k_scores_avx2 / _avx512 over loaders LD8 and
 * LD16, PGD__DEFINE_SIMD_V the v_accum pair, PGD__DEFINE_SIMD_KERNELS both. Each kernel
 * falls back to the narrower ISA (then to the reference REF) when head_dim is not a
 * multiple of its vector width. */
#define PGD__DEFINE_SIMD_K(PREFIX, LD8, LD16, REF_KS)                                              \
    static PGD__T2 void PREFIX##_k_scores_avx2(const void *region, uint32_t pt, uint32_t hd,       \
                                               uint32_t r0, uint32_t n, const float *q,            \
                                               uint32_t nq, float scale, float *scores, size_t ld) \
    {                                                                                              \
        if (hd % 8 == 0)                                                                           \
            pgd__ks2(region, pt, hd, r0, n, q, nq, scale, scores, ld, LD8);                        \
        else                                                                                       \
            REF_KS(region, pt, hd, r0, n, q, nq, scale, scores, ld);                               \
    }                                                                                              \
    static PGD__T5 void PREFIX##_k_scores_avx512(                                                  \
        const void *region, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n, const float *q,     \
        uint32_t nq, float scale, float *scores, size_t ld)                                        \
    {                                                                                              \
        if (hd % 16 == 0)                                                                          \
            pgd__ks5(region, pt, hd, r0, n, q, nq, scale, scores, ld, LD16);                       \
        else                                                                                       \
            PREFIX##_k_scores_avx2(region, pt, hd, r0, n, q, nq, scale, scores, ld);               \
    }

#define PGD__DEFINE_SIMD_V(PREFIX, LD8, LD16, REF_VA)                                              \
    static PGD__T2 void PREFIX##_v_accum_avx2(const void *region, uint32_t pt, uint32_t hd,        \
                                              uint32_t r0, uint32_t n, const float *a, size_t lda, \
                                              uint32_t nq, float *out)                             \
    {                                                                                              \
        if (hd % 8 == 0)                                                                           \
            pgd__va2(region, pt, hd, r0, n, a, lda, nq, out, LD8);                                 \
        else                                                                                       \
            REF_VA(region, pt, hd, r0, n, a, lda, nq, out);                                        \
    }                                                                                              \
    static PGD__T5 void PREFIX##_v_accum_avx512(const void *region, uint32_t pt, uint32_t hd,      \
                                                uint32_t r0, uint32_t n, const float *a,           \
                                                size_t lda, uint32_t nq, float *out)               \
    {                                                                                              \
        if (hd % 16 == 0)                                                                          \
            pgd__va5(region, pt, hd, r0, n, a, lda, nq, out, LD16);                                \
        else                                                                                       \
            PREFIX##_v_accum_avx2(region, pt, hd, r0, n, a, lda, nq, out);                         \
    }

/* ---- AVX2 block kernels (q8_0, q4_0; head_dim a multiple of 32) ----
 *
 * pgd__ks2 / pgd__va2 over a block codec whose loader would fetch and convert the block's
 * f16 scale for every 8 values: here a row's scale is loaded once per block of 32 values
 * (SC(reg, pt, hd, block) broadcasts it) and CODES(reg, f, s) returns the 8 values from flat
 * index f times s. The values and the fma chains are those of pgd__ks2_tile / pgd__va2_tile
 * with the codec's loader (same products, same order), so the bits are too. */
typedef __m256 (*pgd__sc8_fn)(const uint8_t *reg, uint32_t pt, uint32_t hd, size_t blk);
typedef __m256 (*pgd__codes8_fn)(const uint8_t *reg, size_t f, __m256 s);

PGD__I2 void pgd__ks2b_tile(const uint8_t *reg, uint32_t pt, uint32_t hd, uint32_t r,
                            const float *q, const int R, const int NH, float scale, float *sc,
                            size_t ld, pgd__sc8_fn scl, pgd__codes8_fn codes)
{
    __m256 acc[4][2], s[4];
    for (int i = 0; i < R; i++)
        for (int h = 0; h < NH; h++)
            acc[i][h] = _mm256_setzero_ps();
    for (uint32_t d = 0; d < hd; d += 32) {
        for (int i = 0; i < R; i++)
            s[i] = scl(reg, pt, hd, ((size_t)(r + (uint32_t)i) * hd + d) / 32);
        for (uint32_t k = 0; k < 32; k += 8) {
            __m256 x[4];
            for (int i = 0; i < R; i++)
                x[i] = codes(reg, (size_t)(r + (uint32_t)i) * hd + d + k, s[i]);
            for (int h = 0; h < NH; h++) {
                __m256 qv = _mm256_loadu_ps(q + (size_t)h * hd + d + k);
                for (int i = 0; i < R; i++)
                    acc[i][h] = _mm256_fmadd_ps(qv, x[i], acc[i][h]);
            }
        }
    }
    if (R == 4) {
        for (int h = 0; h < NH; h++)
            _mm_storeu_ps(sc + (size_t)h * ld,
                          _mm_mul_ps(pgd__reduce4_8(acc[0][h], acc[1][h], acc[2][h], acc[3][h]),
                                     _mm_set1_ps(scale)));
        return;
    }
    const __m256 z = _mm256_setzero_ps();
    for (int i = 0; i < R; i++)
        for (int h = 0; h < NH; h++)
            sc[(size_t)h * ld + (size_t)i] =
                _mm_cvtss_f32(pgd__reduce4_8(acc[i][h], z, z, z)) * scale;
}

PGD__I2 void pgd__ks2b(const void *region, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n,
                       const float *q, uint32_t nq, float scale, float *scores, size_t ld,
                       pgd__sc8_fn scl, pgd__codes8_fn codes)
{
    const uint8_t *reg = region;
    for (uint32_t h0 = 0; h0 < nq; h0 += 2) {
        const uint32_t nh = nq - h0 < 2 ? nq - h0 : 2;
        const float *qh = q + (size_t)h0 * hd;
        float *sh = scores + (size_t)h0 * ld;
        uint32_t j = 0;
        for (; j + 4 <= n; j += 4) {
            if (nh == 1)
                pgd__ks2b_tile(reg, pt, hd, r0 + j, qh, 4, 1, scale, sh + j, ld, scl, codes);
            else
                pgd__ks2b_tile(reg, pt, hd, r0 + j, qh, 4, 2, scale, sh + j, ld, scl, codes);
        }
        for (; j < n; j++) {
            if (nh == 1)
                pgd__ks2b_tile(reg, pt, hd, r0 + j, qh, 1, 1, scale, sh + j, ld, scl, codes);
            else
                pgd__ks2b_tile(reg, pt, hd, r0 + j, qh, 1, 2, scale, sh + j, ld, scl, codes);
        }
    }
}

/* One block of 32 output values (d0 % 32 == 0) of NH heads over rows [r0, r0 + n). */
PGD__I2 void pgd__va2b_tile(const uint8_t *reg, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n,
                            const float *a, size_t lda, float *out, uint32_t d0, const int NH,
                            pgd__sc8_fn scl, pgd__codes8_fn codes)
{
    __m256 acc[2][4], x[4];
    for (int h = 0; h < NH; h++)
        for (int c = 0; c < 4; c++)
            acc[h][c] = _mm256_loadu_ps(out + (size_t)h * hd + d0 + 8 * c);
    for (uint32_t j = 0; j < n; j++) {
        const size_t f = (size_t)(r0 + j) * hd + d0;
        const __m256 s = scl(reg, pt, hd, f / 32);
        for (int c = 0; c < 4; c++)
            x[c] = codes(reg, f + 8 * (size_t)c, s);
        for (int h = 0; h < NH; h++) {
            __m256 w = _mm256_broadcast_ss(a + (size_t)h * lda + j);
            for (int c = 0; c < 4; c++)
                acc[h][c] = _mm256_fmadd_ps(w, x[c], acc[h][c]);
        }
    }
    for (int h = 0; h < NH; h++)
        for (int c = 0; c < 4; c++)
            _mm256_storeu_ps(out + (size_t)h * hd + d0 + 8 * c, acc[h][c]);
}

PGD__I2 void pgd__va2b(const void *region, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n,
                       const float *a, size_t lda, uint32_t nq, float *out, pgd__sc8_fn scl,
                       pgd__codes8_fn codes)
{
    const uint8_t *reg = region;
    for (uint32_t d0 = 0; d0 < hd; d0 += 32)
        for (uint32_t h0 = 0; h0 < nq;) {
            const uint32_t nh = nq - h0 >= 2 ? 2 : 1;
            const float *ah = a + (size_t)h0 * lda;
            float *oh = out + (size_t)h0 * hd;
            if (nh == 2)
                pgd__va2b_tile(reg, pt, hd, r0, n, ah, lda, oh, d0, 2, scl, codes);
            else
                pgd__va2b_tile(reg, pt, hd, r0, n, ah, lda, oh, d0, 1, scl, codes);
            h0 += nh;
        }
}

/* PGD__DEFINE_BLOCK_KERNELS defines static PREFIX_k_scores_blk_avx2 / PREFIX_v_accum_blk_avx2
 * (after PGD__DEFINE_SIMD_KERNELS): the block kernels for head_dim % 32 == 0, else
 * PREFIX_k_scores_avx2 / PREFIX_v_accum_avx2. */
#define PGD__DEFINE_BLOCK_KERNELS(PREFIX, SC, CODES)                                               \
    static PGD__T2 void PREFIX##_k_scores_blk_avx2(                                                \
        const void *region, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n, const float *q,     \
        uint32_t nq, float scale, float *scores, size_t ld)                                        \
    {                                                                                              \
        if (hd % 32 == 0)                                                                          \
            pgd__ks2b(region, pt, hd, r0, n, q, nq, scale, scores, ld, SC, CODES);                 \
        else                                                                                       \
            PREFIX##_k_scores_avx2(region, pt, hd, r0, n, q, nq, scale, scores, ld);               \
    }                                                                                              \
    static PGD__T2 void PREFIX##_v_accum_blk_avx2(const void *region, uint32_t pt, uint32_t hd,    \
                                                  uint32_t r0, uint32_t n, const float *a,         \
                                                  size_t lda, uint32_t nq, float *out)             \
    {                                                                                              \
        if (hd % 32 == 0)                                                                          \
            pgd__va2b(region, pt, hd, r0, n, a, lda, nq, out, SC, CODES);                          \
        else                                                                                       \
            PREFIX##_v_accum_avx2(region, pt, hd, r0, n, a, lda, nq, out);                         \
    }

/* PGD__DEFINE_SIMD_PF defines static PREFIX_k_scores_pf_avx2 / _avx512 and
 * PREFIX_v_accum_pf_avx2 / _avx512 (after PGD__DEFINE_SIMD_KERNELS): where head_dim is not a
 * multiple of the vector width, the plain kernel after a burst prefetch of next. */
#define PGD__DEFINE_SIMD_PF(PREFIX, LD8, LD16)                                                     \
    static PGD__T2 void PREFIX##_k_scores_pf_avx2(                                                 \
        const void *region, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n, const float *q,     \
        uint32_t nq, float scale, float *scores, size_t ld, const void *next, size_t nb)           \
    {                                                                                              \
        if (hd % 8 == 0) {                                                                         \
            pgd__ks2_pf(region, pt, hd, r0, n, q, nq, scale, scores, ld, next, nb, LD8);           \
            return;                                                                                \
        }                                                                                          \
        if (next) pgd__pf_share(next, 0, nb);                                                      \
        PREFIX##_k_scores_avx2(region, pt, hd, r0, n, q, nq, scale, scores, ld);                   \
    }                                                                                              \
    static PGD__T5 void PREFIX##_k_scores_pf_avx512(                                               \
        const void *region, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n, const float *q,     \
        uint32_t nq, float scale, float *scores, size_t ld, const void *next, size_t nb)           \
    {                                                                                              \
        if (hd % 16 == 0)                                                                          \
            pgd__ks5_pf(region, pt, hd, r0, n, q, nq, scale, scores, ld, next, nb, LD16);          \
        else                                                                                       \
            PREFIX##_k_scores_pf_avx2(region, pt, hd, r0, n, q, nq, scale, scores, ld, next, nb);  \
    }                                                                                              \
    static PGD__T2 void PREFIX##_v_accum_pf_avx2(                                                  \
        const void *region, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n, const float *a,     \
        size_t lda, uint32_t nq, float *out, const void *next, size_t nb)                          \
    {                                                                                              \
        if (hd % 8 == 0) {                                                                         \
            pgd__va2_pf(region, pt, hd, r0, n, a, lda, nq, out, next, nb, LD8);                    \
            return;                                                                                \
        }                                                                                          \
        if (next) pgd__pf_share(next, 0, nb);                                                      \
        PREFIX##_v_accum_avx2(region, pt, hd, r0, n, a, lda, nq, out);                             \
    }                                                                                              \
    static PGD__T5 void PREFIX##_v_accum_pf_avx512(                                                \
        const void *region, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n, const float *a,     \
        size_t lda, uint32_t nq, float *out, const void *next, size_t nb)                          \
    {                                                                                              \
        if (hd % 16 == 0)                                                                          \
            pgd__va5_pf(region, pt, hd, r0, n, a, lda, nq, out, next, nb, LD16);                   \
        else                                                                                       \
            PREFIX##_v_accum_pf_avx2(region, pt, hd, r0, n, a, lda, nq, out, next, nb);            \
    }

#define PGD__DEFINE_SIMD_KERNELS(PREFIX, LD8, LD16, REF_KS, REF_VA)                                \
    PGD__DEFINE_SIMD_K(PREFIX, LD8, LD16, REF_KS)                                                  \
    PGD__DEFINE_SIMD_V(PREFIX, LD8, LD16, REF_VA)

/* ---- AVX-512 VNNI: integer k_scores and v_accum for the block codecs ----
 *
 * Level PGD__ISA_VNNI (AVX-512 F/BW/VL/DQ + VNNI + VBMI), for head_dim 64, 128 or 256
 * (the codec files fall back to the float kernels above otherwise).
 *
 * k_scores: a row is cut in "chunks" of 64 values (cpr = head_dim / 64 per row; chunk c of a
 * region is flat values [64 c, 64 c + 64)). A codec's chunk loader returns the chunk's 64
 * codes as unsigned bytes u in some lane order; the query is quantized once per call to int8
 * in the same lane order, per lane group (lanes 0-31 and 32-63 of each chunk position), with
 * scale dq = amax / 127 and codes round(x / dq) (|x - code dq| <= dq / 2). One vpdpbusd per
 * chunk and head gives 16 partial sums; a transpose-reduce over 16 chunks turns them into the
 * 32 group sums S (three levels of unpack / shuffle + add); then
 *     score(row) = scale * (c + sum over the row's groups g of dq_g * ks_g * (S_g - corr_g))
 * with ks_g the codec's block scale (q8_0 / q4_0: the f16 scale of the K block that the group
 * covers; kivi2: 1), corr_g = bias * sum(q codes of g) (the codec's code bias: q8_0 128 since
 * its loader flips the sign bit, q4_0 8, kivi2 0) and c a per-head constant (kivi2: q . mins).
 * Error added by the int8 query: |sum_g dq_g / 2 * ks_g * sum_{i in g} |u_i - bias||, i.e.
 * at most sum_d |q_d - q~_d| |k_d| <= sum_g dq_g / 2 * sum_{d in g} |k_d|
 * (tests/unit/test_codec.c).
 *
 * v_accum: out[h][d] += sum_j a[h][j] * (ks[j][b] * u[j][d] + off[j][b]) for the block b of d:
 * the weights w[j][b] = a[h][j] ks[j][b] are quantized once per call (per head, per run of at
 * most 128 rows) to int16 with one scale sw = max |w| / 32767 (|w - w~ sw| <= sw / 2); two rows'
 * codes (sign- or zero-extended to int16) are interleaved per channel and vpdpwssd adds
 * w~[j] u[j][d] + w~[j+1] u[j+1][d] into int32 lanes (|w~| <= 32767, |u| <= 128, 64 pairs:
 * no overflow). The offsets (q4_0: -8 ks; kivi2: the group min) go through a float sum per
 * block. Error added: sw / 2 * sum_j |u[j][d]| per output value.
 */
#define PGD__T5N                                                                                   \
    __attribute__((                                                                                \
        target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,avx2,fma,f16c")))
#define PGD__I5N static inline __attribute__((always_inline)) PGD__T5N

enum { PGD__KQ_BATCH = 8, PGD__VW_ROWS = 128, PGD__VW_HEADS = 4 };

/* One head's query, prepared for a call: per chunk position p (< 4) the int8 codes in the
 * codec's lane order, and per lane of the reduced layout (see pgd__kn_reduce) the group's dq
 * and integer correction. */
typedef struct pgd__kq {
    int8_t q[4][64];
    int32_t init[4][16]; /* -bias * (sum of the codes of each 4-byte lane): vpdpbusd's start */
    float dqpat[16];
    float c;
    float pad[15]; /* to PGD__PREP_Q_HEAD_BYTES: prepare_q's vectors lie at that stride */
} pgd__kq;

typedef __m512i (*pgd__kchunk_fn)(const uint8_t *reg, size_t c);
/* 16 block scales of the 8 chunks from chunk c (natural order, blocks 2c ..), lanes of m. */
typedef __m512 (*pgd__kscale_fn)(const uint8_t *reg, uint32_t pt, uint32_t hd, size_t c,
                                 __mmask16 m);
/* Fills kq->q, the group scales dq[2 p + g] and kq->c. */
typedef void (*pgd__kprep_fn)(const uint8_t *reg, uint32_t pt, uint32_t hd, const float *q,
                              pgd__kq *kq, float dq[8]);

/* Quantizes 64 floats (4 vectors) to int8 codes: lanes of group 0 (mask m0 over each vector)
 * and group 1 (the others) with their own scales. Writes 64 bytes, returns dq and sums. */
PGD__I5N void pgd__kn_quant64(const __m512 x[4], __mmask16 m0a, __mmask16 m0b, int8_t *out,
                              float dq[2])
{
    /* Group 0: lanes set in m0a of x[0], x[1] and m0b of x[2], x[3]. */
    __mmask16 g0[4] = {m0a, m0a, m0b, m0b};
    __m512 mx0 = _mm512_setzero_ps(), mx1 = _mm512_setzero_ps();
    for (int i = 0; i < 4; i++) {
        __m512 ax = _mm512_abs_ps(x[i]);
        mx0 = _mm512_mask_max_ps(mx0, g0[i], mx0, ax);
        mx1 = _mm512_mask_max_ps(mx1, (__mmask16)~g0[i], mx1, ax);
    }
    float a0 = _mm512_reduce_max_ps(mx0), a1 = _mm512_reduce_max_ps(mx1);
    dq[0] = a0 / 127.0f;
    dq[1] = a1 / 127.0f;
    __m512 i0 = _mm512_set1_ps(a0 > 0 ? 127.0f / a0 : 0.0f);
    __m512 i1 = _mm512_set1_ps(a1 > 0 ? 127.0f / a1 : 0.0f);
    for (int i = 0; i < 4; i++) {
        __m512i c = _mm512_cvtps_epi32(_mm512_mul_ps(x[i], _mm512_mask_blend_ps(g0[i], i1, i0)));
        _mm_storeu_si128((__m128i *)(out + 16 * i), _mm512_cvtepi32_epi8(c));
    }
}

/* The per-lane dq of the reduced layout (lane l: chunk (l / 8) * 4 + l % 4 of 8, group
 * (l / 4) % 2, so chunk position p = chunk % cpr) and the vpdpbusd start values. */
PGD__I5N void pgd__kn_patterns(pgd__kq *kq, uint32_t cpr, const float dq[8], int bias_shift)
{
    static const int32_t idx[3][16] = {
        {0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1},
        {0, 2, 0, 2, 1, 3, 1, 3, 0, 2, 0, 2, 1, 3, 1, 3},
        {0, 2, 4, 6, 1, 3, 5, 7, 0, 2, 4, 6, 1, 3, 5, 7},
    };
    __m512 d = _mm512_castps256_ps512(_mm256_loadu_ps(dq));
    _mm512_storeu_ps(kq->dqpat, _mm512_permutexvar_ps(_mm512_loadu_si512(idx[cpr == 1   ? 0
                                                                             : cpr == 2 ? 1
                                                                                        : 2]),
                                                      d));
    for (uint32_t p = 0; p < cpr; p++) {
        __m512i s = _mm512_setzero_si512();
        if (bias_shift >= 0)
            s = _mm512_sub_epi32(s,
                                 _mm512_sll_epi32(_mm512_dpbusd_epi32(s, _mm512_set1_epi8(1),
                                                                      _mm512_loadu_si512(kq->q[p])),
                                                  _mm_cvtsi32_si128(bias_shift)));
        _mm512_storeu_si512(kq->init[p], s);
    }
}

/* 16 chunks' vpdpbusd results -> 2 vectors of group sums in the reduced layout
 * (X[0]: chunks 0-7, X[1]: chunks 8-15). */
PGD__I5N void pgd__kn_reduce(__m512i x[16], __m512i X[2])
{
    __m512i t[8], m[4];
    for (int i = 0; i < 8; i++)
        t[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(x[2 * i], x[2 * i + 1]),
                                _mm512_unpackhi_epi32(x[2 * i], x[2 * i + 1]));
    for (int i = 0; i < 4; i++)
        m[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(t[2 * i], t[2 * i + 1]),
                                _mm512_unpackhi_epi64(t[2 * i], t[2 * i + 1]));
    for (int i = 0; i < 2; i++)
        X[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(m[2 * i], m[2 * i + 1], 0x88),
                                _mm512_shuffle_i32x4(m[2 * i], m[2 * i + 1], 0xDD));
}

/* Row sums of 32 chunk sums (A: chunks 0-15, B: 16-31) when two chunks make a row. */
PGD__I5N __m512 pgd__kn_pairsum(__m512 a, __m512 b)
{
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    return _mm512_add_ps(_mm512_permutex2var_ps(a, ev, b), _mm512_permutex2var_ps(a, od, b));
}

/* Scores (before scale and c) of up to 16 rows starting at chunk c0 (nc valid chunks). */
PGD__I5N __m512 pgd__kn_rows(const uint8_t *reg, uint32_t pt, uint32_t hd, uint32_t cpr, size_t c0,
                             uint32_t nc, const pgd__kq *kq, pgd__kchunk_fn chunk,
                             pgd__kscale_fn kscale, int scaled, int full)
{
    const __m512i perm = _mm512_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
    const __m512 dqp = _mm512_loadu_ps(kq->dqpat);
    __m512 H[4];
    for (uint32_t s = 0; s < cpr; s++) {
        __m512i x[16], X[2];
        for (uint32_t i = 0; i < 16; i++) {
            uint32_t k = 16 * s + i;
            if (full || k < nc)
                x[i] = _mm512_dpbusd_epi32(_mm512_loadu_si512(kq->init[k & (cpr - 1)]),
                                           chunk(reg, c0 + k),
                                           _mm512_loadu_si512(kq->q[k & (cpr - 1)]));
            else
                x[i] = _mm512_setzero_si512();
        }
        pgd__kn_reduce(x, X);
        __m512 F[2];
        for (uint32_t i = 0; i < 2; i++) {
            __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(X[i]), dqp);
            if (scaled) {
                uint32_t k0 = 16 * s + 8 * i;
                uint32_t nv = full ? 8 : k0 >= nc ? 0 : nc - k0 >= 8 ? 8 : nc - k0;
                __mmask16 m = (__mmask16)((1u << (2 * nv)) - 1u);
                f = _mm512_mul_ps(f, _mm512_permutexvar_ps(perm, kscale(reg, pt, hd, c0 + k0, m)));
            }
            F[i] = f;
        }
        H[s] = _mm512_add_ps(_mm512_shuffle_f32x4(F[0], F[1], 0x88),
                             _mm512_shuffle_f32x4(F[0], F[1], 0xDD));
    }
    if (cpr == 1) return H[0];
    if (cpr == 2) return pgd__kn_pairsum(H[0], H[1]);
    return pgd__kn_pairsum(pgd__kn_pairsum(H[0], H[1]), pgd__kn_pairsum(H[2], H[3]));
}

/* Prepares nq query vectors (prep and its bias shift, see pgd__kn) into kq[0 .. nq). */
PGD__I5N void pgd__kn_prepare(const uint8_t *reg, uint32_t pt, uint32_t hd, const float *q,
                              uint32_t nq, pgd__kq *kq, pgd__kprep_fn prep, int bias_shift)
{
    for (uint32_t h = 0; h < nq; h++) {
        float dq[8] = {0};
        prep(reg, pt, hd, q + (size_t)h * hd, &kq[h], dq);
        pgd__kn_patterns(&kq[h], hd / 64, dq, bias_shift);
    }
}

/* The scores of rows r0 .. r0 + n - 1 for nq prepared queries kq (pgd__kn_prepare). */
PGD__I5N void pgd__kn_run(const uint8_t *reg, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n,
                          const pgd__kq *kq, uint32_t nq, float scale, float *scores, size_t ld,
                          pgd__kchunk_fn chunk, pgd__kscale_fn kscale, int scaled)
{
    const uint32_t cpr = hd / 64;
    for (uint32_t h0 = 0; h0 < nq; h0 += PGD__KQ_BATCH) {
        uint32_t nh = nq - h0 < PGD__KQ_BATCH ? nq - h0 : PGD__KQ_BATCH;
        for (uint32_t j = 0; j < n; j += 16) {
            uint32_t nr = n - j < 16 ? n - j : 16;
            size_t c0 = (size_t)(r0 + j) * cpr;
            for (uint32_t h = h0; h < h0 + nh; h++) {
                __m512 s;
                if (nr == 16)
                    s = pgd__kn_rows(reg, pt, hd, cpr, c0, 16 * cpr, &kq[h], chunk, kscale, scaled,
                                     1);
                else
                    s = pgd__kn_rows(reg, pt, hd, cpr, c0, nr * cpr, &kq[h], chunk, kscale, scaled,
                                     0);
                s = _mm512_mul_ps(_mm512_add_ps(s, _mm512_set1_ps(kq[h].c)), _mm512_set1_ps(scale));
                _mm512_mask_storeu_ps(scores + (size_t)h * ld + j, (__mmask16)((1u << nr) - 1u), s);
            }
        }
    }
}

PGD__I5N void pgd__kn(const void *region, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n,
                      const float *q, uint32_t nq, float scale, float *scores, size_t ld,
                      pgd__kchunk_fn chunk, pgd__kscale_fn kscale, pgd__kprep_fn prep, int scaled,
                      int bias_shift)
{
    const uint8_t *reg = region;
    pgd__kq kq[PGD__KQ_BATCH];
    for (uint32_t h0 = 0; h0 < nq; h0 += PGD__KQ_BATCH) {
        uint32_t nh = nq - h0 < PGD__KQ_BATCH ? nq - h0 : PGD__KQ_BATCH;
        pgd__kn_prepare(reg, pt, hd, q + (size_t)h0 * hd, nh, kq, prep, bias_shift);
        pgd__kn_run(reg, pt, hd, r0, n, kq, nh, scale, scores + (size_t)h0 * ld, ld, chunk, kscale,
                    scaled);
    }
}

_Static_assert(sizeof(pgd__kq) == PGD__PREP_Q_HEAD_BYTES, "prepared query bytes");

/* Block b (flat values [32 b, 32 b + 32)) as 32 int16 codes in natural order. */
typedef __m512i (*pgd__vblk_fn)(const uint8_t *reg, size_t b);

/* The integer pass of v_accum for NH heads (constant) over rows row0 .. row0 + nr - 1:
 * P[h] their weight pairs (stride PGD__VW_ROWS / 2 * 8 + 16 words), out[h] += the result. */
PGD__I5N void pgd__vn_heads(const uint8_t *reg, uint32_t nb, uint32_t row0, uint32_t nr,
                            const uint32_t *P, const float *sw, const float (*cb)[8], float *out,
                            uint32_t hd, pgd__vblk_fn blk, const int NH)
{
    const __m512i lo_idx =
        _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i hi_idx =
        _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    const size_t ps = PGD__VW_ROWS / 2 * 8 + 16;
    const uint32_t np = nr / 2;
    for (uint32_t b = 0; b < nb; b++) {
        __m512i lo[4], hi[4];
        for (int h = 0; h < NH; h++)
            lo[h] = hi[h] = _mm512_setzero_si512();
        for (uint32_t p = 0; p < np; p++) {
            size_t row = (size_t)row0 + 2 * p;
            __m512i x = blk(reg, row * nb + b), y = blk(reg, (row + 1) * nb + b);
            __m512i l = _mm512_unpacklo_epi16(x, y), u = _mm512_unpackhi_epi16(x, y);
            for (int h = 0; h < NH; h++) {
                __m512i wv = _mm512_set1_epi32((int)P[h * ps + p * nb + b]);
                lo[h] = _mm512_dpwssd_epi32(lo[h], l, wv);
                hi[h] = _mm512_dpwssd_epi32(hi[h], u, wv);
            }
        }
        if (nr % 2) { /* the last row alone (its pair's second weight is zero) */
            __m512i x = blk(reg, ((size_t)row0 + nr - 1) * nb + b), y = _mm512_setzero_si512();
            __m512i l = _mm512_unpacklo_epi16(x, y), u = _mm512_unpackhi_epi16(x, y);
            for (int h = 0; h < NH; h++) {
                __m512i wv = _mm512_set1_epi32((int)P[h * ps + np * nb + b]);
                lo[h] = _mm512_dpwssd_epi32(lo[h], l, wv);
                hi[h] = _mm512_dpwssd_epi32(hi[h], u, wv);
            }
        }
        for (int h = 0; h < NH; h++) {
            __m512 s = _mm512_set1_ps(sw[h]), c = _mm512_set1_ps(cb[h][b]);
            __m512 fl = _mm512_cvtepi32_ps(lo[h]), fh = _mm512_cvtepi32_ps(hi[h]);
            float *o = out + (size_t)h * hd + 32 * b;
            __m512 d0 = _mm512_fmadd_ps(_mm512_permutex2var_ps(fl, lo_idx, fh), s, c);
            __m512 d1 = _mm512_fmadd_ps(_mm512_permutex2var_ps(fl, hi_idx, fh), s, c);
            _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), d0));
            _mm512_storeu_ps(o + 16, _mm512_add_ps(_mm512_loadu_ps(o + 16), d1));
        }
    }
}

/* v_accum over int16 weights. ks: f16 block scales [row][nb] of the region (row-major, so
 * rows r0.. are contiguous); off_mode 0: no offset, 1: offset -8 ks, 2: offset from the f16
 * array off16 [row][nb]. */
PGD__I5N void pgd__vn(const void *region, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n,
                      const float *a, size_t lda, uint32_t nq, float *out, pgd__vblk_fn blk,
                      const uint16_t *ks, int off_mode, const uint16_t *off16)
{
    const uint8_t *reg = region;
    const uint32_t nb = hd / 32, sh = nb == 2 ? 1 : nb == 4 ? 2 : 3;
    uint32_t P[PGD__VW_HEADS][PGD__VW_ROWS / 2 * 8 + 16];
    /* Word o <- word g 2 nb + (r % 2) nb + r / 2 (g = o / (2 nb), r = o % (2 nb)). */
    static const uint16_t pi[3][32] = {
        {0,  2,  1,  3,  4,  6,  5,  7,  8,  10, 9,  11, 12, 14, 13, 15,
         16, 18, 17, 19, 20, 22, 21, 23, 24, 26, 25, 27, 28, 30, 29, 31},
        {0,  4,  1,  5,  2,  6,  3,  7,  8,  12, 9,  13, 10, 14, 11, 15,
         16, 20, 17, 21, 18, 22, 19, 23, 24, 28, 25, 29, 26, 30, 27, 31},
        {0,  8,  1,  9,  2,  10, 3,  11, 4,  12, 5,  13, 6,  14, 7,  15,
         16, 24, 17, 25, 18, 26, 19, 27, 20, 28, 21, 29, 22, 30, 23, 31},
    };
    const __m512i pidx = _mm512_loadu_si512(pi[sh - 1]);
    float sw[PGD__VW_HEADS], cb[PGD__VW_HEADS][8];
    for (uint32_t j0 = 0; j0 < n; j0 += PGD__VW_ROWS) {
        const uint32_t nr = n - j0 < PGD__VW_ROWS ? n - j0 : PGD__VW_ROWS, np = (nr + 1) / 2;
        const size_t rb = (size_t)(r0 + j0) * nb; /* first block of the run */
        for (uint32_t h0 = 0; h0 < nq; h0 += PGD__VW_HEADS) {
            const uint32_t nh = nq - h0 < PGD__VW_HEADS ? nq - h0 : PGD__VW_HEADS;
            /* Weights: w[j][b] = a[j] ks[j][b], quantized to int16 pairs of rows. */
            for (uint32_t h = 0; h < nh; h++) {
                const float *ah = a + (size_t)(h0 + h) * lda + j0;
                float w[PGD__VW_ROWS * 8 + 32];
                __m512 mx = _mm512_setzero_ps(), cv = _mm512_setzero_ps();
                for (uint32_t k = 0; k < nr * nb; k += 16) {
                    uint32_t left = nr * nb - k;
                    __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
                    __m512 s = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, ks + rb + k));
                    /* a[j] for lanes of rows k / nb .. : a permute of up to 8 a values. */
                    uint32_t ja = k >> sh, na = (left + nb - 1) >> sh;
                    if (na > (16u >> sh)) na = 16u >> sh;
                    __m512 av = _mm512_maskz_loadu_ps((__mmask16)((1u << na) - 1u), ah + ja);
                    const __m512i lane =
                        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
                    av = _mm512_permutexvar_ps(_mm512_srli_epi32(lane, sh), av);
                    __m512 wv = _mm512_maskz_mul_ps(m, av, s);
                    _mm512_storeu_ps(w + k, wv);
                    mx = _mm512_max_ps(mx, _mm512_abs_ps(wv));
                    if (off_mode == 1)
                        cv = _mm512_fnmadd_ps(_mm512_set1_ps(8.0f), wv, cv);
                    else if (off_mode == 2)
                        cv = _mm512_fmadd_ps(
                            av, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, off16 + rb + k)), cv);
                }
                float amax = _mm512_reduce_max_ps(mx), iw = amax > 0 ? 32767.0f / amax : 0.0f;
                sw[h] = amax / 32767.0f;
                /* cb[b]: the sum of the lanes l % nb == b of cv (fold halves down to nb). */
                __m256 c8 =
                    _mm256_add_ps(_mm512_castps512_ps256(cv), _mm512_extractf32x8_ps(cv, 1));
                __m128 c4 = _mm_add_ps(_mm256_castps256_ps128(c8), _mm256_extractf128_ps(c8, 1));
                if (nb == 8)
                    _mm256_storeu_ps(cb[h], c8);
                else if (nb == 4)
                    _mm_storeu_ps(cb[h], c4);
                else
                    _mm_storel_pi((__m64 *)cb[h], _mm_add_ps(c4, _mm_movehl_ps(c4, c4)));
                /* int16 codes of the weights, rows 2p and 2p + 1 of block b side by side:
                 * word 2 (p nb + b) + t <- w[(2 p + t) nb + b]. A 32-word vector holds whole
                 * row pairs (2 nb divides 32); weights past row nr are zero. */
                const uint32_t nw = np * 2 * nb;
                for (uint32_t k = nr * nb; k < nw; k++)
                    w[k] = 0;
                for (uint32_t k = 0; k < nw; k += 32) {
                    __m256i c0 = _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(
                        _mm512_mul_ps(_mm512_loadu_ps(w + k), _mm512_set1_ps(iw))));
                    __m256i c1 = _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(
                        _mm512_mul_ps(_mm512_loadu_ps(w + k + 16), _mm512_set1_ps(iw))));
                    __m512i c = _mm512_inserti64x4(_mm512_castsi256_si512(c0), c1, 1);
                    _mm512_storeu_si512((uint16_t *)P[h] + k, _mm512_permutexvar_epi16(pidx, c));
                }
            }
            for (uint32_t h = 0; h < nh;) {
                const uint32_t k = nh - h >= 4 ? 4 : nh - h >= 2 ? 2 : 1;
                float *o = out + (size_t)(h0 + h) * hd;
                if (k == 4)
                    pgd__vn_heads(reg, nb, r0 + j0, nr, P[h], sw + h, cb + h, o, hd, blk, 4);
                else if (k == 2)
                    pgd__vn_heads(reg, nb, r0 + j0, nr, P[h], sw + h, cb + h, o, hd, blk, 2);
                else
                    pgd__vn_heads(reg, nb, r0 + j0, nr, P[h], sw + h, cb + h, o, hd, blk, 1);
                h += k;
            }
        }
    }
}

#endif /* PGD_KERN_X86_H */
