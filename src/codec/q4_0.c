/* SPDX-License-Identifier: MIT */
/*
 * q4_0.c - the q4_0 codec (like ggml's q4_0): blocks of 32 values, one f16 scale d and 32
 * 4-bit codes q in [0, 15]; value = (q - 8) * d. The region's byte layout (nibbles in
 * ggml's order, then f16 scales) is published in include/pagoda/layout.h.
 * Quantization (ggml): m = the value of largest magnitude (signed), d = m / -8 rounded to
 * f16 AWAY from zero (so |x / d| <= 8), q = min(15, (int)(x / d + 8.5)).
 * Error bound per value: |x - (q - 8) d| <= |d| (|d| / 2 except where +8 d clamps to
 * +7 d). Blocks across rows written row by row: a row whose codes fit the current scale
 * without clamping (-8.5 <= x / d < 7.5) is written with it; otherwise the block's earlier
 * rows are decoded and re-quantized with the new row at a scale d' (|d'| >= |d|), adding
 * up to |d'| to their error. Each of the block's R = 32 / head_dim rows can re-scale it
 * once, so the bound per value is R |d| with d the final scale (head_dim 8: 4 |d|).
 * Kernels: float AVX2 / AVX-512 loops over a nibble loader; with AVX-512 VNNI (head_dim 64,
 * 128, 256) integer ones (int8 query, int16 weights: kern_x86.h states the extra error);
 * there prepare_q / k_scores_prep let attention quantize a query once per work item.
 */
#include <math.h>

#include "codec_impl.h"

static size_t q4_region_bytes(pgd__kv_kind kind, uint32_t pt, uint32_t hd)
{
    size_t n = (size_t)pt * hd;
    return pgd__round16(n / 2 + n / 16);
}

static uint16_t *q4_scales(void *region, uint32_t pt, uint32_t hd)
{
    return (uint16_t *)((uint8_t *)region + (size_t)pt * hd / 2);
}

static void put4(uint8_t *nib, size_t f, uint32_t q)
{
    uint8_t *p = nib + (f / 32) * 16 + (f % 16);
    if (f % 32 < 16)
        *p = (uint8_t)((*p & 0xf0u) | q);
    else
        *p = (uint8_t)((*p & 0x0fu) | (q << 4));
}

static uint32_t get4(const uint8_t *nib, size_t f)
{
    uint8_t b = nib[(f / 32) * 16 + (f % 16)];
    return f % 32 < 16 ? b & 0x0fu : b >> 4;
}

static uint32_t code(float x, float id)
{
    float t = x * id + 8.5f;
    if (!(t > 0)) return 0; /* also NaN */
    return t >= 15.0f ? 15u : (uint32_t)t;
}

/* Quantizes x[0..n) (n <= 32) into the block starting at flat index f0 (a multiple of
 * 32); returns the f16 scale. */
static uint16_t quant_block(const float *x, uint32_t n, uint8_t *nib, size_t f0)
{
    float amax = 0, m = 0;
    for (uint32_t i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            m = x[i];
        }
    uint16_t d16 = pgd__f32_to_f16_up(m / -8.0f);
    float d = pgd__f16_to_f32(d16), id = d != 0 ? 1.0f / d : 0.0f;
    for (uint32_t i = 0; i < n; i++)
        put4(nib, f0 + i, code(x[i], id));
    return d16;
}

static void q4_write_row(pgd__kv_kind kind, void *region, uint32_t pt, uint32_t hd, uint32_t slot,
                         const float *row)
{
    uint8_t *nib = region;
    uint16_t *sc = q4_scales(region, pt, hd);
    size_t f0 = (size_t)slot * hd;
    if (hd >= 32) {
        for (uint32_t b = 0; b < hd / 32; b++)
            sc[f0 / 32 + b] = quant_block(row + 32 * b, 32, nib, f0 + 32 * b);
        return;
    }
    size_t blk = f0 / 32, start = blk * 32;
    uint32_t k = (uint32_t)(f0 - start);
    if (k > 0) {
        float d = pgd__f16_to_f32(sc[blk]);
        int fits = 1;
        for (uint32_t i = 0; i < hd && fits; i++) {
            float t = d != 0 ? row[i] / d : (row[i] == 0 ? 0 : INFINITY);
            fits = t >= -8.5f && t < 7.5f;
        }
        if (fits) {
            float id = d != 0 ? 1.0f / d : 0.0f;
            for (uint32_t i = 0; i < hd; i++)
                put4(nib, f0 + i, code(row[i], id));
            return;
        }
        float x[32];
        for (uint32_t i = 0; i < k; i++)
            x[i] = ((float)get4(nib, start + i) - 8.0f) * d;
        memcpy(x + k, row, (size_t)hd * 4);
        sc[blk] = quant_block(x, k + hd, nib, start);
        return;
    }
    sc[blk] = quant_block(row, hd, nib, start);
}

static void q4_encode_page(pgd__kv_kind kind, void *region, uint32_t pt, uint32_t hd,
                           const float *rows, uint32_t n)
{
    uint8_t *nib = region;
    uint16_t *sc = q4_scales(region, pt, hd);
    size_t nv = (size_t)n * hd, total = (size_t)pt * hd;
    memset(nib, 0x88, total / 2); /* unwritten values decode to (8 - 8) * d = 0 */
    for (size_t f = 0; f < total; f += 32) {
        uint32_t m = f >= nv ? 0 : nv - f < 32 ? (uint32_t)(nv - f) : 32;
        sc[f / 32] = m ? quant_block(rows + f, m, nib, f) : 0;
    }
    /* The region's padding too: a page's bytes are a function of its rows. */
    size_t used = total / 2 + total / 16;
    memset((uint8_t *)region + used, 0, q4_region_bytes(kind, pt, hd) - used);
}

static float q4_get(const void *region, uint32_t pt, uint32_t hd, uint32_t r, uint32_t d)
{
    size_t f = (size_t)r * hd + d;
    const uint16_t *sc = q4_scales((void *)region, pt, hd);
    return ((float)get4(region, f) - 8.0f) * pgd__f16_to_f32(sc[f / 32]);
}

static void q4_decode_rows(pgd__kv_kind kind, const void *region, uint32_t pt, uint32_t hd,
                           uint32_t r0, uint32_t n, float *out)
{
    pgd__ref_decode(region, pt, hd, r0, n, out, q4_get);
}

static void q4_k_scores_ref(const void *region, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n,
                            const float *q, uint32_t nq, float scale, float *scores, size_t ld)
{
    pgd__ref_k_scores(region, pt, hd, r0, n, q, nq, scale, scores, ld, q4_get);
}

static void q4_v_accum_ref(const void *region, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n,
                           const float *a, size_t lda, uint32_t nq, float *out)
{
    pgd__ref_v_accum(region, pt, hd, r0, n, a, lda, nq, out, q4_get);
}

const pgd__codec pgd__codec_q4_0_ref = {
    PGD_KV_Q4_0,
    "q4_0",
    1,
    q4_region_bytes,
    q4_write_row,
    q4_encode_page,
    q4_decode_rows,
    q4_k_scores_ref,
    q4_v_accum_ref,
    NULL,
    NULL,
    NULL,
    NULL,
};

#ifdef PGD__CODEC_X86
#include "kern_x86.h"

/* Codes [f, f + 8) (f % 8 == 0): 8 bytes at 16 b + f % 16, low or high nibbles. */
PGD__I2 __m256 ld8_q4(const uint8_t *reg, uint32_t pt, uint32_t hd, uint32_t r, uint32_t d)
{
    size_t f = (size_t)r * hd + d;
    const uint16_t *sc = (const uint16_t *)(reg + (size_t)pt * hd / 2);
    __m128i b = _mm_loadl_epi64((const __m128i *)(reg + (f / 32) * 16 + (f % 16)));
    if (f % 32 >= 16) b = _mm_srli_epi16(b, 4);
    b = _mm_sub_epi8(_mm_and_si128(b, _mm_set1_epi8(0x0f)), _mm_set1_epi8(8));
    __m256 x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    return _mm256_mul_ps(x, pgd__bcast_f16_8(sc + f / 32));
}
PGD__I5 __m512 ld16_q4(const uint8_t *reg, uint32_t pt, uint32_t hd, uint32_t r, uint32_t d)
{
    size_t f = (size_t)r * hd + d;
    const uint16_t *sc = (const uint16_t *)(reg + (size_t)pt * hd / 2);
    __m128i b = _mm_loadu_si128((const __m128i *)(reg + (f / 32) * 16));
    if (f % 32 >= 16) b = _mm_srli_epi16(b, 4);
    b = _mm_sub_epi8(_mm_and_si128(b, _mm_set1_epi8(0x0f)), _mm_set1_epi8(8));
    __m512 x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
    return _mm512_mul_ps(x, pgd__bcast_f16_16(sc + f / 32));
}

PGD__DEFINE_SIMD_KERNELS(q4, ld8_q4, ld16_q4, q4_k_scores_ref, q4_v_accum_ref)

/* AVX2 with head_dim a multiple of 32: the block kernels of kern_x86.h (pgd__ks2b, pgd__va2b),
 * which load a row's block scale once per 32 values instead of once per 8 (as ld8_q8 does,
 * ld8_q4 broadcasts and converts it per call); the values of ld8_q4, so the bits of the
 * kernels above. */
PGD__I2 __m256 q4_scale8(const uint8_t *reg, uint32_t pt, uint32_t hd, size_t blk)
{
    return pgd__bcast_f16_8((const uint16_t *)(reg + (size_t)pt * hd / 2) + blk);
}
PGD__I2 __m256 q4_codes8(const uint8_t *reg, size_t f, __m256 s)
{
    __m128i b = _mm_loadl_epi64((const __m128i *)(reg + (f / 32) * 16 + (f % 16)));
    if (f % 32 >= 16) b = _mm_srli_epi16(b, 4);
    b = _mm_sub_epi8(_mm_and_si128(b, _mm_set1_epi8(0x0f)), _mm_set1_epi8(8));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), s);
}
PGD__DEFINE_BLOCK_KERNELS(q4, q4_scale8, q4_codes8)

/* VNNI: chunk c is the 32 nibble bytes of blocks 2c, 2c + 1; each block's 16 bytes go to two
 * 128-bit lanes, shifted by 0 and 4: codes q in [0, 15] in natural order (bias 8). */
PGD__I5N __m512i kn_chunk_q4(const uint8_t *reg, size_t c)
{
    __m512i y = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(reg + 32 * c)));
    const __m512i sh = _mm512_setr_epi32(0, 0, 0, 0, 0x40004, 0x40004, 0x40004, 0x40004, 0, 0, 0, 0,
                                         0x40004, 0x40004, 0x40004, 0x40004);
    return _mm512_and_si512(_mm512_srlv_epi16(_mm512_shuffle_i64x2(y, y, 0x50), sh),
                            _mm512_set1_epi8(0x0f));
}
PGD__I5N __m512 kn_scale_q4(const uint8_t *reg, uint32_t pt, uint32_t hd, size_t c, __mmask16 m)
{
    const uint16_t *sc = (const uint16_t *)(reg + (size_t)pt * hd / 2);
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, sc + 2 * c));
}
PGD__I5N void kn_prep_q4(const uint8_t *reg, uint32_t pt, uint32_t hd, const float *q, pgd__kq *kq,
                         float dq[8])
{
    for (uint32_t p = 0; p < hd / 64; p++) {
        __m512 x[4];
        for (int i = 0; i < 4; i++)
            x[i] = _mm512_loadu_ps(q + 64 * p + 16 * (uint32_t)i);
        pgd__kn_quant64(x, 0xffff, 0, kq->q[p], dq + 2 * p);
    }
    kq->c = 0;
}
/* Block b's 16 bytes: low nibbles are values 0-15, high nibbles 16-31. */
PGD__I5N __m512i vn_blk_q4(const uint8_t *reg, size_t b)
{
    __m128i x = _mm_loadu_si128((const __m128i *)(reg + 16 * b));
    __m256i y = _mm256_inserti128_si256(_mm256_castsi128_si256(x), _mm_srli_epi16(x, 4), 1);
    return _mm512_cvtepu8_epi16(_mm256_and_si256(y, _mm256_set1_epi8(0x0f)));
}

static PGD__T5N void q4_k_scores_vnni(const void *region, uint32_t pt, uint32_t hd, uint32_t r0,
                                      uint32_t n, const float *q, uint32_t nq, float scale,
                                      float *scores, size_t ld)
{
    if (hd % 64 || hd > 256) {
        q4_k_scores_avx512(region, pt, hd, r0, n, q, nq, scale, scores, ld);
        return;
    }
    pgd__kn(region, pt, hd, r0, n, q, nq, scale, scores, ld, kn_chunk_q4, kn_scale_q4, kn_prep_q4,
            1, 3);
}

static PGD__T5N void q4_v_accum_vnni(const void *region, uint32_t pt, uint32_t hd, uint32_t r0,
                                     uint32_t n, const float *a, size_t lda, uint32_t nq,
                                     float *out)
{
    if (hd % 64 || hd > 256) {
        q4_v_accum_avx512(region, pt, hd, r0, n, a, lda, nq, out);
        return;
    }
    const uint16_t *sc = (const uint16_t *)((const uint8_t *)region + (size_t)pt * hd / 2);
    pgd__vn(region, pt, hd, r0, n, a, lda, nq, out, vn_blk_q4, sc, 1, NULL);
}

static PGD__T5N int q4_prepare_q(uint32_t hd, const float *q, uint32_t nq, void *prep)
{
    if (hd % 64 || hd > 256) return 0;
    pgd__kn_prepare(NULL, 0, hd, q, nq, prep, kn_prep_q4, 3);
    return 1;
}

static PGD__T5N void q4_k_scores_prep(const void *region, uint32_t pt, uint32_t hd, uint32_t r0,
                                      uint32_t n, const void *prep, uint32_t nq, float scale,
                                      float *scores, size_t ld)
{
    pgd__kn_run(region, pt, hd, r0, n, prep, nq, scale, scores, ld, kn_chunk_q4, kn_scale_q4, 1);
}

const pgd__codec pgd__codec_q4_0_vnni = {
    PGD_KV_Q4_0,
    "q4_0",
    1,
    q4_region_bytes,
    q4_write_row,
    q4_encode_page,
    q4_decode_rows,
    q4_k_scores_vnni,
    q4_v_accum_vnni,
    q4_prepare_q,
    q4_k_scores_prep,
    NULL,
    NULL,
};
const pgd__codec pgd__codec_q4_0_avx2 = {
    PGD_KV_Q4_0,
    "q4_0",
    1,
    q4_region_bytes,
    q4_write_row,
    q4_encode_page,
    q4_decode_rows,
    q4_k_scores_blk_avx2,
    q4_v_accum_blk_avx2,
    NULL,
    NULL,
    NULL,
    NULL,
};
const pgd__codec pgd__codec_q4_0_avx512 = {
    PGD_KV_Q4_0,
    "q4_0",
    1,
    q4_region_bytes,
    q4_write_row,
    q4_encode_page,
    q4_decode_rows,
    q4_k_scores_avx512,
    q4_v_accum_avx512,
    NULL,
    NULL,
    NULL,
    NULL,
};
#endif
