/* SPDX-License-Identifier: MIT */
/*
 * kivi2.c - 2-bit KIVI-style codec (Liu et al., "KIVI", 2024): keys quantized per channel
 * across the page's tokens, values per token across groups of channels. Not row-writable:
 * a region is encoded once from a full page (encode_page); until then the page's rows live
 * in the sequence's f16 residual window (cache.c).
 *
 * The byte layout of K and V regions (2-bit codes in 32-bit words, then f16 scales and
 * mins per channel (K) or per row and group of 32 channels (V)) is published in
 * include/pagoda/layout.h.
 *
 * Quantization of a set S of values (a channel over the rows, or a row's group):
 * mn = min(S) rounded DOWN to f16, s = (max(S) - mn) / 3 rounded UP to f16, code
 * c = clamp(round((x - mn) / s), 0, 3); value = mn + c s. Since mn <= x <= mn + 3 s,
 * the error bound per value is |x - value| <= s / 2 (s the stored scale), plus f32
 * rounding. Values beyond the f16 range (|x| > 65504) saturate.
 * Rows >= n of encode_page get code 0.
 * Kernels: float AVX2 / AVX-512 loops; with AVX-512 VNNI (head_dim 64, 128, 256) integer
 * ones: K folds the channel scales into the query (q s, int8) and the mins into q . min;
 * V uses int16 weights a s and adds a . min per group (kern_x86.h states the extra error).
 */
#include <math.h>

#include "codec_impl.h"

static uint32_t group_of(uint32_t hd)
{
    return hd < 32 ? hd : 32;
}

static size_t codes_bytes(uint32_t pt, uint32_t hd)
{
    return (size_t)pt * hd / 4;
}

static size_t kv2_region_bytes(pgd__kv_kind kind, uint32_t pt, uint32_t hd)
{
    if (kind == PGD__K) return pgd__round16(codes_bytes(pt, hd) + 4 * (size_t)hd);
    return pgd__round16(codes_bytes(pt, hd) + 4 * (size_t)pt * (hd / group_of(hd)));
}

/* f16 of f rounded toward -infinity (so that the result is <= f), finite. */
static uint16_t f16_down(float f)
{
    uint16_t h = pgd__f32_to_f16(f);
    if ((h & 0x7fffu) >= 0x7c00u) return (h & 0x8000u) ? 0xfbffu : 0x7bffu;
    if (pgd__f16_to_f32(h) > f) {
        if (h == 0x0000u)
            h = 0x8001u;
        else if (h & 0x8000u)
            h++;
        else
            h--;
    }
    if ((h & 0x7fffu) >= 0x7c00u) h = 0xfbffu;
    return h;
}

static uint32_t code2(float x, float mn, float is)
{
    float t = (x - mn) * is + 0.5f;
    if (!(t > 0)) return 0; /* also NaN */
    return t >= 3.0f ? 3u : (uint32_t)t;
}

static void put2(uint32_t *w, size_t f, uint32_t c)
{
    uint32_t sh = 2u * (uint32_t)(f % 16);
    w[f / 16] = (w[f / 16] & ~(3u << sh)) | (c << sh);
}

static uint32_t get2(const uint32_t *w, size_t f)
{
    return (w[f / 16] >> (2u * (uint32_t)(f % 16))) & 3u;
}

/* Scale and min of values x[i * stride], i < n. */
static void range(const float *x, uint32_t n, size_t stride, uint16_t *s16, uint16_t *m16)
{
    float lo = INFINITY, hi = -INFINITY;
    for (uint32_t i = 0; i < n; i++) {
        float v = x[i * stride];
        lo = fminf(lo, v);
        hi = fmaxf(hi, v);
    }
    if (n == 0 || !(lo <= hi)) lo = hi = 0;
    *m16 = f16_down(lo);
    *s16 = pgd__f32_to_f16_up((hi - pgd__f16_to_f32(*m16)) / 3.0f);
}

static void kv2_encode_page(pgd__kv_kind kind, void *region, uint32_t pt, uint32_t hd,
                            const float *rows, uint32_t n)
{
    uint32_t *w = region;
    uint16_t *meta = (uint16_t *)((uint8_t *)region + codes_bytes(pt, hd));
    memset(w, 0, codes_bytes(pt, hd));
    /* The region's padding (up to the larger of the K and V layouts, the pool's region
     * size) too: a page's bytes are a function of its rows. */
    size_t used =
        codes_bytes(pt, hd) + 4 * (size_t)(kind == PGD__K ? hd : pt * (hd / group_of(hd)));
    size_t kb = kv2_region_bytes(PGD__K, pt, hd), vb = kv2_region_bytes(PGD__V, pt, hd);
    memset((uint8_t *)region + used, 0, (kb > vb ? kb : vb) - used);
    if (kind == PGD__K) {
        uint16_t *scale = meta, *mins = meta + hd;
        for (uint32_t d = 0; d < hd; d++) {
            range(rows + d, n, hd, &scale[d], &mins[d]);
            float s = pgd__f16_to_f32(scale[d]), mn = pgd__f16_to_f32(mins[d]);
            float is = s > 0 ? 1.0f / s : 0.0f;
            for (uint32_t r = 0; r < n; r++)
                put2(w, (size_t)r * hd + d, code2(rows[(size_t)r * hd + d], mn, is));
        }
        return;
    }
    uint32_t g = group_of(hd), ng = hd / g;
    uint16_t *scale = meta, *mins = meta + (size_t)pt * ng;
    for (uint32_t r = 0; r < pt; r++)
        for (uint32_t k = 0; k < ng; k++) {
            size_t gi = (size_t)r * ng + k;
            if (r >= n) {
                scale[gi] = mins[gi] = 0;
                continue;
            }
            const float *x = rows + (size_t)r * hd + (size_t)k * g;
            range(x, g, 1, &scale[gi], &mins[gi]);
            float s = pgd__f16_to_f32(scale[gi]), mn = pgd__f16_to_f32(mins[gi]);
            float is = s > 0 ? 1.0f / s : 0.0f;
            for (uint32_t i = 0; i < g; i++)
                put2(w, (size_t)r * hd + (size_t)k * g + i, code2(x[i], mn, is));
        }
}

static float k_get(const void *region, uint32_t pt, uint32_t hd, uint32_t r, uint32_t d)
{
    const uint16_t *meta = (const uint16_t *)((const uint8_t *)region + codes_bytes(pt, hd));
    float c = (float)get2(region, (size_t)r * hd + d);
    return pgd__f16_to_f32(meta[hd + d]) + c * pgd__f16_to_f32(meta[d]);
}

static float v_get(const void *region, uint32_t pt, uint32_t hd, uint32_t r, uint32_t d)
{
    const uint16_t *meta = (const uint16_t *)((const uint8_t *)region + codes_bytes(pt, hd));
    uint32_t g = group_of(hd), ng = hd / g;
    size_t gi = (size_t)r * ng + d / g;
    float c = (float)get2(region, (size_t)r * hd + d);
    return pgd__f16_to_f32(meta[(size_t)pt * ng + gi]) + c * pgd__f16_to_f32(meta[gi]);
}

static void kv2_decode_rows(pgd__kv_kind kind, const void *region, uint32_t pt, uint32_t hd,
                            uint32_t r0, uint32_t n, float *out)
{
    pgd__ref_decode(region, pt, hd, r0, n, out, kind == PGD__K ? k_get : v_get);
}

static void kv2_k_scores_ref(const void *region, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n,
                             const float *q, uint32_t nq, float scale, float *scores, size_t ld)
{
    pgd__ref_k_scores(region, pt, hd, r0, n, q, nq, scale, scores, ld, k_get);
}

static void kv2_v_accum_ref(const void *region, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n,
                            const float *a, size_t lda, uint32_t nq, float *out)
{
    pgd__ref_v_accum(region, pt, hd, r0, n, a, lda, nq, out, v_get);
}

const pgd__codec pgd__codec_kivi2_ref = {
    PGD_KV_KIVI2,
    "kivi2",
    0,
    kv2_region_bytes,
    NULL,
    kv2_encode_page,
    kv2_decode_rows,
    kv2_k_scores_ref,
    kv2_v_accum_ref,
    NULL,
    NULL,
    NULL,
    NULL,
};

#ifdef PGD__CODEC_X86
#include "kern_x86.h"

/* Codes [f, f + 8) / [f, f + 16) as floats: the code word broadcast, shifted per lane. */
PGD__I2 __m256 codes8(const uint8_t *reg, size_t f)
{
    uint32_t w;
    memcpy(&w, reg + (f / 16) * 4, 4);
    __m256i sh = _mm256_add_epi32(_mm256_set1_epi32(2 * (int)(f % 16)),
                                  _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
    __m256i c =
        _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w), sh), _mm256_set1_epi32(3));
    return _mm256_cvtepi32_ps(c);
}
PGD__I5 __m512 codes16(const uint8_t *reg, size_t f)
{
    uint32_t w;
    memcpy(&w, reg + (f / 16) * 4, 4);
    const __m512i sh = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    __m512i c =
        _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32((int)w), sh), _mm512_set1_epi32(3));
    return _mm512_cvtepi32_ps(c);
}

PGD__I2 __m256 ld8_k(const uint8_t *reg, uint32_t pt, uint32_t hd, uint32_t r, uint32_t d)
{
    const uint16_t *meta = (const uint16_t *)(reg + codes_bytes(pt, hd));
    __m256 s = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(meta + d)));
    __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(meta + hd + d)));
    return _mm256_fmadd_ps(codes8(reg, (size_t)r * hd + d), s, m);
}
PGD__I5 __m512 ld16_k(const uint8_t *reg, uint32_t pt, uint32_t hd, uint32_t r, uint32_t d)
{
    const uint16_t *meta = (const uint16_t *)(reg + codes_bytes(pt, hd));
    __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(meta + d)));
    __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(meta + hd + d)));
    return _mm512_fmadd_ps(codes16(reg, (size_t)r * hd + d), s, m);
}
PGD__I2 __m256 ld8_v(const uint8_t *reg, uint32_t pt, uint32_t hd, uint32_t r, uint32_t d)
{
    const uint16_t *meta = (const uint16_t *)(reg + codes_bytes(pt, hd));
    uint32_t g = group_of(hd), ng = hd / g;
    size_t gi = (size_t)r * ng + d / g;
    return _mm256_fmadd_ps(codes8(reg, (size_t)r * hd + d), pgd__bcast_f16_8(meta + gi),
                           pgd__bcast_f16_8(meta + (size_t)pt * ng + gi));
}
PGD__I5 __m512 ld16_v(const uint8_t *reg, uint32_t pt, uint32_t hd, uint32_t r, uint32_t d)
{
    const uint16_t *meta = (const uint16_t *)(reg + codes_bytes(pt, hd));
    uint32_t g = group_of(hd), ng = hd / g;
    size_t gi = (size_t)r * ng + d / g;
    return _mm512_fmadd_ps(codes16(reg, (size_t)r * hd + d), pgd__bcast_f16_16(meta + gi),
                           pgd__bcast_f16_16(meta + (size_t)pt * ng + gi));
}

PGD__DEFINE_SIMD_K(kv2k, ld8_k, ld16_k, kv2_k_scores_ref)
PGD__DEFINE_SIMD_V(kv2v, ld8_v, ld16_v, kv2_v_accum_ref)

/* VNNI, K: chunk c's 16 code bytes in the four 128-bit lanes, lane j shifted by 2 j: byte i of
 * lane j is the code of value 4 i + j of the chunk (the query is permuted to match). The
 * per-channel scale is folded into the query (q' = q s) and the mins into a constant
 * (q . mins), so codes need no scale: score = scale * (q . mins + q' . codes). */
PGD__I5N __m512i kn_chunk_kv2(const uint8_t *reg, size_t c)
{
    __m512i y = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(reg + 16 * c)));
    const __m512i sh =
        _mm512_setr_epi32(0, 0, 0, 0, 0x20002, 0x20002, 0x20002, 0x20002, 0x40004, 0x40004, 0x40004,
                          0x40004, 0x60006, 0x60006, 0x60006, 0x60006);
    return _mm512_and_si512(_mm512_srlv_epi16(y, sh), _mm512_set1_epi8(3));
}
PGD__I5N __m512 kn_scale_kv2(const uint8_t *reg, uint32_t pt, uint32_t hd, size_t c, __mmask16 m)
{
    return _mm512_set1_ps(1.0f);
}
PGD__I5N void kn_prep_kv2(const uint8_t *reg, uint32_t pt, uint32_t hd, const float *q, pgd__kq *kq,
                          float dq[8])
{
    const uint16_t *meta = (const uint16_t *)(reg + codes_bytes(pt, hd));
    /* Lane 16 j + i <- value 4 i + j; lane groups 0-31 / 32-63 are values with d % 4 < 2 / >= 2. */
    const __m512i perm = _mm512_set_epi8(
        63, 59, 55, 51, 47, 43, 39, 35, 31, 27, 23, 19, 15, 11, 7, 3, 62, 58, 54, 50, 46, 42, 38,
        34, 30, 26, 22, 18, 14, 10, 6, 2, 61, 57, 53, 49, 45, 41, 37, 33, 29, 25, 21, 17, 13, 9, 5,
        1, 60, 56, 52, 48, 44, 40, 36, 32, 28, 24, 20, 16, 12, 8, 4, 0);
    __m512 cv = _mm512_setzero_ps();
    for (uint32_t p = 0; p < hd / 64; p++) {
        __m512 x[4];
        for (uint32_t i = 0; i < 4; i++) {
            uint32_t d = 64 * p + 16 * i;
            __m512 qv = _mm512_loadu_ps(q + d);
            __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(meta + d)));
            __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(meta + hd + d)));
            cv = _mm512_fmadd_ps(qv, m, cv);
            x[i] = _mm512_mul_ps(qv, s);
        }
        pgd__kn_quant64(x, 0x3333, 0x3333, kq->q[p], dq + 2 * p);
        __m512i b = _mm512_loadu_si512(kq->q[p]);
        _mm512_storeu_si512(kq->q[p], _mm512_permutexvar_epi8(perm, b));
    }
    kq->c = _mm512_reduce_add_ps(cv);
}

/* VNNI, V: block b's 8 code bytes; vpmultishiftqb picks bits 2 i .. of the block's 64-bit
 * word for word i (i < 32) and the mask keeps 2 bits. */
PGD__I5N __m512i vn_blk_kv2(const uint8_t *reg, size_t b)
{
    uint64_t w;
    memcpy(&w, reg + 8 * b, 8);
    const __m512i ctl =
        _mm512_set_epi8(0, 62, 0, 60, 0, 58, 0, 56, 0, 54, 0, 52, 0, 50, 0, 48, 0, 46, 0, 44, 0, 42,
                        0, 40, 0, 38, 0, 36, 0, 34, 0, 32, 0, 30, 0, 28, 0, 26, 0, 24, 0, 22, 0, 20,
                        0, 18, 0, 16, 0, 14, 0, 12, 0, 10, 0, 8, 0, 6, 0, 4, 0, 2, 0, 0);
    return _mm512_and_si512(_mm512_multishift_epi64_epi8(ctl, _mm512_set1_epi64((long long)w)),
                            _mm512_set1_epi16(3));
}

static PGD__T5N void kv2_k_scores_vnni(const void *region, uint32_t pt, uint32_t hd, uint32_t r0,
                                       uint32_t n, const float *q, uint32_t nq, float scale,
                                       float *scores, size_t ld)
{
    if (hd % 64 || hd > 256) {
        kv2k_k_scores_avx512(region, pt, hd, r0, n, q, nq, scale, scores, ld);
        return;
    }
    pgd__kn(region, pt, hd, r0, n, q, nq, scale, scores, ld, kn_chunk_kv2, kn_scale_kv2,
            kn_prep_kv2, 0, -1);
}

static PGD__T5N void kv2_v_accum_vnni(const void *region, uint32_t pt, uint32_t hd, uint32_t r0,
                                      uint32_t n, const float *a, size_t lda, uint32_t nq,
                                      float *out)
{
    if (hd % 64 || hd > 256) {
        kv2v_v_accum_avx512(region, pt, hd, r0, n, a, lda, nq, out);
        return;
    }
    const uint16_t *meta = (const uint16_t *)((const uint8_t *)region + codes_bytes(pt, hd));
    pgd__vn(region, pt, hd, r0, n, a, lda, nq, out, vn_blk_kv2, meta, 2,
            meta + (size_t)pt * (hd / 32));
}

const pgd__codec pgd__codec_kivi2_vnni = {
    PGD_KV_KIVI2,
    "kivi2",
    0,
    kv2_region_bytes,
    NULL,
    kv2_encode_page,
    kv2_decode_rows,
    kv2_k_scores_vnni,
    kv2_v_accum_vnni,
    NULL,
    NULL,
    NULL,
    NULL,
};
const pgd__codec pgd__codec_kivi2_avx2 = {
    PGD_KV_KIVI2,
    "kivi2",
    0,
    kv2_region_bytes,
    NULL,
    kv2_encode_page,
    kv2_decode_rows,
    kv2k_k_scores_avx2,
    kv2v_v_accum_avx2,
    NULL,
    NULL,
    NULL,
    NULL,
};
const pgd__codec pgd__codec_kivi2_avx512 = {
    PGD_KV_KIVI2,
    "kivi2",
    0,
    kv2_region_bytes,
    NULL,
    kv2_encode_page,
    kv2_decode_rows,
    kv2k_k_scores_avx512,
    kv2v_v_accum_avx512,
    NULL,
    NULL,
    NULL,
    NULL,
};
#endif
