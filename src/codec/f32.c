/* SPDX-License-Identifier: MIT */
/*
 * f32.c - the f32 codec: a region is page_tokens rows of head_dim floats, as written
 * (byte layout: include/pagoda/layout.h).
 * Exact (no error). Row-writable. Callers: registry.c (tables), attention, cache.c.
 */
#include "codec_impl.h"

static size_t f32_region_bytes(pgd__kv_kind kind, uint32_t pt, uint32_t hd)
{
    return pgd__round16((size_t)pt * hd * 4);
}

static void f32_write_row(pgd__kv_kind kind, void *region, uint32_t pt, uint32_t hd, uint32_t slot,
                          const float *row)
{
    memcpy((float *)region + (size_t)slot * hd, row, (size_t)hd * 4);
}

static void f32_encode_page(pgd__kv_kind kind, void *region, uint32_t pt, uint32_t hd,
                            const float *rows, uint32_t n)
{
    memcpy(region, rows, (size_t)n * hd * 4);
    memset((float *)region + (size_t)n * hd, 0, (size_t)(pt - n) * hd * 4);
}

static float f32_get(const void *region, uint32_t pt, uint32_t hd, uint32_t r, uint32_t d)
{
    return ((const float *)region)[(size_t)r * hd + d];
}

static void f32_decode_rows(pgd__kv_kind kind, const void *region, uint32_t pt, uint32_t hd,
                            uint32_t r0, uint32_t n, float *out)
{
    memcpy(out, (const float *)region + (size_t)r0 * hd, (size_t)n * hd * 4);
}

static void f32_k_scores_ref(const void *region, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n,
                             const float *q, uint32_t nq, float scale, float *scores, size_t ld)
{
    pgd__ref_k_scores(region, pt, hd, r0, n, q, nq, scale, scores, ld, f32_get);
}

static void f32_v_accum_ref(const void *region, uint32_t pt, uint32_t hd, uint32_t r0, uint32_t n,
                            const float *a, size_t lda, uint32_t nq, float *out)
{
    pgd__ref_v_accum(region, pt, hd, r0, n, a, lda, nq, out, f32_get);
}

const pgd__codec pgd__codec_f32_ref = {
    PGD_KV_F32,
    "f32",
    1,
    f32_region_bytes,
    f32_write_row,
    f32_encode_page,
    f32_decode_rows,
    f32_k_scores_ref,
    f32_v_accum_ref,
    NULL,
    NULL,
    NULL,
    NULL,
};

#ifdef PGD__CODEC_X86
#include "kern_x86.h"

PGD__I2 __m256 ld8_f32(const uint8_t *reg, uint32_t pt, uint32_t hd, uint32_t r, uint32_t d)
{
    return _mm256_loadu_ps((const float *)reg + (size_t)r * hd + d);
}
PGD__I5 __m512 ld16_f32(const uint8_t *reg, uint32_t pt, uint32_t hd, uint32_t r, uint32_t d)
{
    return _mm512_loadu_ps((const float *)reg + (size_t)r * hd + d);
}

PGD__DEFINE_SIMD_KERNELS(f32, ld8_f32, ld16_f32, f32_k_scores_ref, f32_v_accum_ref)
PGD__DEFINE_SIMD_PF(f32, ld8_f32, ld16_f32)

const pgd__codec pgd__codec_f32_avx2 = {
    PGD_KV_F32,
    "f32",
    1,
    f32_region_bytes,
    f32_write_row,
    f32_encode_page,
    f32_decode_rows,
    f32_k_scores_avx2,
    f32_v_accum_avx2,
    NULL,
    NULL,
    f32_k_scores_pf_avx2,
    f32_v_accum_pf_avx2,
};
const pgd__codec pgd__codec_f32_avx512 = {
    PGD_KV_F32,
    "f32",
    1,
    f32_region_bytes,
    f32_write_row,
    f32_encode_page,
    f32_decode_rows,
    f32_k_scores_avx512,
    f32_v_accum_avx512,
    NULL,
    NULL,
    f32_k_scores_pf_avx512,
    f32_v_accum_pf_avx512,
};
#endif
