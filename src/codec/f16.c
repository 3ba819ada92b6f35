/* SPDX-License-Identifier: MIT */
/*
 * f16.c - the f16 codec: a region is page_tokens rows of head_dim f16 values (uint16),
 * rounded to nearest even on write (byte layout: include/pagoda/layout.h). Error: |x - dec(x)| <=
 * 2^-11 |x| for f16 normal values (f16 subnormals: 2^-25 absolute), 2^-8 |x| for bf16.
 * Row-writable. Callers: registry.c (tables), attention, cache.c.
 */
#include "codec_impl.h"

static size_t f16_region_bytes(pgd__kv_kind kind, uint32_t pt, uint32_t hd)
{
    return pgd__round16((size_t)pt * hd * 2);
}

static void f16_write_row(pgd__kv_kind kind, void *region, uint32_t pt, uint32_t hd, uint32_t slot,
                          const float *row)
{
    uint16_t *dst = (uint16_t *)region + (size_t)slot * hd;
    for (uint32_t d = 0; d < hd; d++)
        dst[d] = pgd__f32_to_f16(row[d]);
}

static void f16_encode_page(pgd__kv_kind kind, void *region, uint32_t pt, uint32_t hd,
                            const float *rows, uint32_t n)
{
    for (uint32_t r = 0; r < n; r++)
        f16_write_row(kind, region, pt, hd, r, rows + (size_t)r * hd);
    memset((uint16_t *)region + (size_t)n * hd, 0, (size_t)(pt - n) * hd * 2);
}

static float f16_get(const void *region, uint32_t pt, uint32_t hd, uint32_t r, uint32_t d)
{
    return pgd__f16_to_f32(((const uint16_t *)region)[(size_t)r * hd + d]);
}

static void f16_decode_rows(pgd__kv_kind kind, const void *region, uint32_t pt, uint32_t hd,
                            uint32_t r0, uint32_t n, float *out)
{
    pgd__ref_decode(region, pt, hd, r0, n, out, f16_get);
}

static void f16_k_scores_ref(const void *region, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n,
                             const float *q, uint32_t nq, float scale, float *scores, size_t ld)
{
    pgd__ref_k_scores(region, pt, hd, r0, n, q, nq, scale, scores, ld, f16_get);
}

static void f16_v_accum_ref(const void *region, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n,
                            const float *a, size_t lda, uint32_t nq, float *out)
{
    pgd__ref_v_accum(region, pt, hd, r0, n, a, lda, nq, out, f16_get);
}

const pgd__codec pgd__codec_f16_ref = {
    PGD_KV_F16,
    "f16",
    1,
    f16_region_bytes,
    f16_write_row,
    f16_encode_page,
    f16_decode_rows,
    f16_k_scores_ref,
    f16_v_accum_ref,
    NULL,
    NULL,
    NULL,
    NULL,
};

#ifdef PGD__CODEC_X86
#include "kern_x86.h"

PGD__I2 __m256 ld8_f16(const uint8_t *reg, uint32_t pt, uint32_t hd, uint32_t r, uint32_t d)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(reg + ((size_t)r * hd + d) * 2)));
}
PGD__I5 __m512 ld16_f16(const uint8_t *reg, uint32_t pt, uint32_t hd, uint32_t r, uint32_t d)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(reg + ((size_t)r * hd + d) * 2)));
}

PGD__DEFINE_SIMD_KERNELS(f16, ld8_f16, ld16_f16, f16_k_scores_ref, f16_v_accum_ref)
PGD__DEFINE_SIMD_PF(f16, ld8_f16, ld16_f16)

/* F16C rounds to nearest even like pgd__f32_to_f16: the rows are bit-identical. */
static void f16_write_row_fast(pgd__kv_kind kind, void *region, uint32_t pt, uint32_t hd,
                               uint32_t slot, const float *row)
{
    pgd__f32_to_f16_n(row, (uint16_t *)region + (size_t)slot * hd, hd);
}

static void f16_encode_page_fast(pgd__kv_kind kind, void *region, uint32_t pt, uint32_t hd,
                                 const float *rows, uint32_t n)
{
    pgd__f32_to_f16_n(rows, region, (size_t)n * hd);
    memset((uint16_t *)region + (size_t)n * hd, 0, (size_t)(pt - n) * hd * 2);
}

const pgd__codec pgd__codec_f16_avx2 = {
    PGD_KV_F16,
    "f16",
    1,
    f16_region_bytes,
    f16_write_row_fast,
    f16_encode_page_fast,
    f16_decode_rows,
    f16_k_scores_avx2,
    f16_v_accum_avx2,
    NULL,
    NULL,
    f16_k_scores_pf_avx2,
    f16_v_accum_pf_avx2,
};
const pgd__codec pgd__codec_f16_avx512 = {
    PGD_KV_F16,
    "f16",
    1,
    f16_region_bytes,
    f16_write_row_fast,
    f16_encode_page_fast,
    f16_decode_rows,
    f16_k_scores_avx512,
    f16_v_accum_avx512,
    NULL,
    NULL,
    f16_k_scores_pf_avx512,
    f16_v_accum_pf_avx512,
};
#endif
