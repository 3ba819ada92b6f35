/* SPDX-License-Identifier: MIT */
/*
 * q8_0.c - the q8_0 codec (like ggml's q8_0): blocks of 32 values, one f16 scale d and 32
 * int8 codes q; value = q * d. The region's byte layout (codes, then f16 scales; blocks
 * along a row or across 32 / head_dim rows) is published in include/pagoda/layout.h.
 *
 * Quantization: d = amax / 127 rounded UP to f16 (so |x / d| <= 127, no clamping), then
 * q = round(x / d). Error bound per value: |x - q d| <= d / 2 for a block written at once
 * (encode_page, or write_row with head_dim >= 32).
 * Blocks across rows (head_dim < 32), written row by row: a row that fits the block's
 * current scale (amax <= 127 d) is written with it; otherwise the block's earlier rows are
 * decoded and re-quantized with the larger scale d' together with the new row, so earlier
 * rows carry |err| <= d / 2 + d' / 2. Each of the block's R = 32 / head_dim rows can
 * re-scale it once, and every scale is <= the final one d, so the bound per value is
 * R * d / 2 (head_dim 16: d; head_dim 8: 2 d); rounding-to-nearest keeps the typical
 * error near d / 2.
 * Kernels: the AVX2 / AVX-512 loaders convert 8 / 16 codes to f32 in registers and multiply
 * by the broadcast block scale, fused into the FMA loops of kern_x86.h. With AVX-512 VNNI
 * (head_dim 64, 128, 256) the kernels are integer: k_scores quantizes the query to int8 per
 * 32 lanes (vpdpbusd), v_accum the weights to int16 (vpdpwssd); see kern_x86.h for the
 * extra error bounds, which tests/unit/test_codec.c checks. prepare_q / k_scores_prep split
 * k_scores in two, so that attention quantizes a query once per work item, not per page.
 */
#include <math.h>

#include "codec_impl.h"

static size_t q8_region_bytes(pgd__kv_kind kind, uint32_t pt, uint32_t hd)
{
    size_t n = (size_t)pt * hd;
    return pgd__round16(n + n / 16);
}

static uint16_t *q8_scales(void *region, uint32_t pt, uint32_t hd)
{
    return (uint16_t *)((uint8_t *)region + (size_t)pt * hd);
}

/* Quantizes x[0..n) (n <= 32) as one block: codes to q, returns the f16 scale. */
static uint16_t quant_block(const float *x, uint32_t n, int8_t *q)
{
    float amax = 0;
    for (uint32_t i = 0; i < n; i++)
        amax = fmaxf(amax, fabsf(x[i]));
    uint16_t d16 = pgd__f32_to_f16_up(amax / 127.0f);
    float d = pgd__f16_to_f32(d16), id = d > 0 ? 1.0f / d : 0.0f;
    for (uint32_t i = 0; i < n; i++) {
        float v = roundf(x[i] * id);
        q[i] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v == v ? v : 0); /* NaN -> 0 */
    }
    return d16;
}

static void q8_write_row(pgd__kv_kind kind, void *region, uint32_t pt, uint32_t hd, uint32_t slot,
                         const float *row)
{
    int8_t *codes = region;
    uint16_t *sc = q8_scales(region, pt, hd);
    size_t f0 = (size_t)slot * hd;
    if (hd >= 32) {
        for (uint32_t b = 0; b < hd / 32; b++)
            sc[f0 / 32 + b] = quant_block(row + 32 * b, 32, codes + f0 + 32 * b);
        return;
    }
    size_t blk = f0 / 32, start = blk * 32;
    uint32_t k = (uint32_t)(f0 - start); /* values of the block written before this row */
    if (k > 0) {
        float d = pgd__f16_to_f32(sc[blk]), amax = 0;
        for (uint32_t i = 0; i < hd; i++)
            amax = fmaxf(amax, fabsf(row[i]));
        if (amax <= 127.0f * d) { /* fits the current scale */
            float id = d > 0 ? 1.0f / d : 0.0f;
            for (uint32_t i = 0; i < hd; i++)
                codes[f0 + i] = (int8_t)roundf(row[i] * id);
            return;
        }
        /* Re-scale: earlier rows from their decoded values, then this row. */
        float x[32];
        for (uint32_t i = 0; i < k; i++)
            x[i] = (float)codes[start + i] * d;
        memcpy(x + k, row, (size_t)hd * 4);
        sc[blk] = quant_block(x, k + hd, codes + start);
        return;
    }
    sc[blk] = quant_block(row, hd, codes + start);
}

static void q8_encode_page(pgd__kv_kind kind, void *region, uint32_t pt, uint32_t hd,
                           const float *rows, uint32_t n)
{
    int8_t *codes = region;
    uint16_t *sc = q8_scales(region, pt, hd);
    size_t nv = (size_t)n * hd, total = (size_t)pt * hd;
    for (size_t f = 0; f < total; f += 32) {
        if (f >= nv) {
            memset(codes + f, 0, 32);
            sc[f / 32] = 0;
            continue;
        }
        uint32_t m = nv - f < 32 ? (uint32_t)(nv - f) : 32;
        sc[f / 32] = quant_block(rows + f, m, codes + f);
        memset(codes + f + m, 0, 32 - m);
    }
    /* The region's padding too: a page's bytes are a function of its rows. */
    size_t used = total + total / 16;
    memset((uint8_t *)region + used, 0, q8_region_bytes(kind, pt, hd) - used);
}

static float q8_get(const void *region, uint32_t pt, uint32_t hd, uint32_t r, uint32_t d)
{
    size_t f = (size_t)r * hd + d;
    const uint16_t *sc = q8_scales((void *)region, pt, hd);
    return (float)((const int8_t *)region)[f] * pgd__f16_to_f32(sc[f / 32]);
}

static void q8_decode_rows(pgd__kv_kind kind, const void *region, uint32_t pt, uint32_t hd,
                           uint32_t r0, uint32_t n, float *out)
{
    pgd__ref_decode(region, pt, hd, r0, n, out, q8_get);
}

static void q8_k_scores_ref(const void *region, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n,
                            const float *q, uint32_t nq, float scale, float *scores, size_t ld)
{
    pgd__ref_k_scores(region, pt, hd, r0, n, q, nq, scale, scores, ld, q8_get);
}

static void q8_v_accum_ref(const void *region, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n,
                           const float *a, size_t lda, uint32_t nq, float *out)
{
    pgd__ref_v_accum(region, pt, hd, r0, n, a, lda, nq, out, q8_get);
}

const pgd__codec pgd__codec_q8_0_ref = {
    PGD_KV_Q8_0,
    "q8_0",
    1,
    q8_region_bytes,
    q8_write_row,
    q8_encode_page,
    q8_decode_rows,
    q8_k_scores_ref,
    q8_v_accum_ref,
    NULL,
    NULL,
    NULL,
    NULL,
};

#ifdef PGD__CODEC_X86
#include "kern_x86.h"

PGD__I2 __m256 ld8_q8(const uint8_t *reg, uint32_t pt, uint32_t hd, uint32_t r, uint32_t d)
{
    size_t f = (size_t)r * hd + d;
    const uint16_t *sc = (const uint16_t *)(reg + (size_t)pt * hd);
    __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(reg + f)));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(q), pgd__bcast_f16_8(sc + f / 32));
}
PGD__I5 __m512 ld16_q8(const uint8_t *reg, uint32_t pt, uint32_t hd, uint32_t r, uint32_t d)
{
    size_t f = (size_t)r * hd + d;
    const uint16_t *sc = (const uint16_t *)(reg + (size_t)pt * hd);
    __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(reg + f)));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(q), pgd__bcast_f16_16(sc + f / 32));
}

PGD__DEFINE_SIMD_KERNELS(q8, ld8_q8, ld16_q8, q8_k_scores_ref, q8_v_accum_ref)

/* AVX2 with head_dim a multiple of 32: the block kernels of kern_x86.h (pgd__ks2b, pgd__va2b),
 * which load a row's block scale once per 32 values instead of once per 8 (ld8_q8 broadcasts
 * and converts it per call, 3 of its 9 uops); the bits of the kernels above. */
PGD__I2 __m256 q8_scale8(const uint8_t *reg, uint32_t pt, uint32_t hd, size_t blk)
{
    return pgd__bcast_f16_8((const uint16_t *)(reg + (size_t)pt * hd) + blk);
}
PGD__I2 __m256 q8_codes8(const uint8_t *reg, size_t f, __m256 s)
{
    return _mm256_mul_ps(
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(reg + f)))), s);
}
PGD__DEFINE_BLOCK_KERNELS(q8, q8_scale8, q8_codes8)

/* VNNI: the codes with the sign bit flipped (k + 128) as the unsigned operand of vpdpbusd. */
PGD__I5N __m512i kn_chunk_q8(const uint8_t *reg, size_t c)
{
    return _mm512_xor_si512(_mm512_loadu_si512(reg + 64 * c), _mm512_set1_epi8((char)0x80));
}
PGD__I5N __m512 kn_scale_q8(const uint8_t *reg, uint32_t pt, uint32_t hd, size_t c, __mmask16 m)
{
    const uint16_t *sc = (const uint16_t *)(reg + (size_t)pt * hd);
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, sc + 2 * c));
}
PGD__I5N void kn_prep_q8(const uint8_t *reg, uint32_t pt, uint32_t hd, const float *q, pgd__kq *kq,
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
PGD__I5N __m512i vn_blk_q8(const uint8_t *reg, size_t b)
{
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(reg + 32 * b)));
}

static PGD__T5N void q8_k_scores_vnni(const void *region, uint32_t pt, uint32_t hd, uint32_t r0,
                                      uint32_t n, const float *q, uint32_t nq, float scale,
                                      float *scores, size_t ld)
{
    if (hd % 64 || hd > 256) {
        q8_k_scores_avx512(region, pt, hd, r0, n, q, nq, scale, scores, ld);
        return;
    }
    pgd__kn(region, pt, hd, r0, n, q, nq, scale, scores, ld, kn_chunk_q8, kn_scale_q8, kn_prep_q8,
            1, 7);
}

static PGD__T5N void q8_v_accum_vnni(const void *region, uint32_t pt, uint32_t hd, uint32_t r0,
                                     uint32_t n, const float *a, size_t lda, uint32_t nq,
                                     float *out)
{
    if (hd % 64 || hd > 256) {
        q8_v_accum_avx512(region, pt, hd, r0, n, a, lda, nq, out);
        return;
    }
    const uint16_t *sc = (const uint16_t *)((const uint8_t *)region + (size_t)pt * hd);
    pgd__vn(region, pt, hd, r0, n, a, lda, nq, out, vn_blk_q8, sc, 0, NULL);
}

static PGD__T5N int q8_prepare_q(uint32_t hd, const float *q, uint32_t nq, void *prep)
{
    if (hd % 64 || hd > 256) return 0;
    pgd__kn_prepare(NULL, 0, hd, q, nq, prep, kn_prep_q8, 7);
    return 1;
}

static PGD__T5N void q8_k_scores_prep(const void *region, uint32_t pt, uint32_t hd, uint32_t r0,
                                      uint32_t n, const void *prep, uint32_t nq, float scale,
                                      float *scores, size_t ld)
{
    pgd__kn_run(region, pt, hd, r0, n, prep, nq, scale, scores, ld, kn_chunk_q8, kn_scale_q8, 1);
}

const pgd__codec pgd__codec_q8_0_vnni = {
    PGD_KV_Q8_0,
    "q8_0",
    1,
    q8_region_bytes,
    q8_write_row,
    q8_encode_page,
    q8_decode_rows,
    q8_k_scores_vnni,
    q8_v_accum_vnni,
    q8_prepare_q,
    q8_k_scores_prep,
    NULL,
    NULL,
};
const pgd__codec pgd__codec_q8_0_avx2 = {
    PGD_KV_Q8_0,
    "q8_0",
    1,
    q8_region_bytes,
    q8_write_row,
    q8_encode_page,
    q8_decode_rows,
    q8_k_scores_blk_avx2,
    q8_v_accum_blk_avx2,
    NULL,
    NULL,
    NULL,
    NULL,
};
const pgd__codec pgd__codec_q8_0_avx512 = {
    PGD_KV_Q8_0,
    "q8_0",
    1,
    q8_region_bytes,
    q8_write_row,
    q8_encode_page,
    q8_decode_rows,
    q8_k_scores_avx512,
    q8_v_accum_avx512,
    NULL,
    NULL,
    NULL,
    NULL,
};
#endif
