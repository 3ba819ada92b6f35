/* SPDX-License-Identifier: MIT */
/*
 * codec_impl.h - what the codec files of src/codec/ share with each other and with
 * tests/unit/test_codec.c (never with src/attn/: attention uses codec_int.h only).
 *
 *   ISA levels   util/cpu.h: 0 scalar reference, 1 AVX2+FMA+F16C, 2 AVX-512 (F, BW, VL,
 *                DQ), 3 AVX-512 + VNNI + VBMI (integer k_scores / v_accum of q8_0, q4_0,
 *                kivi2; the other codecs use their AVX-512 table there).
 *   Tables       every codec file defines pgd__codec_<name>_ref and, on x86,
 *                pgd__codec_<name>_avx2 and pgd__codec_<name>_avx512 (the SIMD tables
 *                share the reference's encoders where encoding is not hot).
 *   Flat layout  a region of page_tokens rows of head_dim values is, for every codec,
 *                addressed by the flat element index f = row * head_dim + d; block codecs
 *                cut this flat array in blocks of 32, so one rule covers blocks along a
 *                row (head_dim a multiple of 32) and blocks across rows (head_dim | 32).
 */
#ifndef PGD_CODEC_IMPL_H
#define PGD_CODEC_IMPL_H

#include <stdint.h>
#include <string.h>

#include "codec_int.h"
#include "util/cpu.h" /* ISA levels, pgd__cpu_isa */

/* Rounds a byte count up to a multiple of 16 (region sizes). */
static inline size_t pgd__round16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

extern const pgd__codec pgd__codec_f32_ref, pgd__codec_f16_ref, pgd__codec_bf16_ref,
    pgd__codec_q8_0_ref, pgd__codec_q4_0_ref, pgd__codec_kivi2_ref;
#if defined(__x86_64__) || defined(__i386__)
#define PGD__CODEC_X86 1
extern const pgd__codec pgd__codec_f32_avx2, pgd__codec_f16_avx2, pgd__codec_bf16_avx2,
    pgd__codec_q8_0_avx2, pgd__codec_q4_0_avx2, pgd__codec_kivi2_avx2;
extern const pgd__codec pgd__codec_f32_avx512, pgd__codec_f16_avx512, pgd__codec_bf16_avx512,
    pgd__codec_q8_0_avx512, pgd__codec_q4_0_avx512, pgd__codec_kivi2_avx512;
extern const pgd__codec pgd__codec_q8_0_vnni, pgd__codec_q4_0_vnni, pgd__codec_kivi2_vnni;
#endif

/* ---- scalar reference kernels over a row decoder ----
 * The reference k_scores / v_accum of every codec are these loops over one value
 * decoder get(region, page_tokens, head_dim, row, d). Plain and slow: the spec. */
typedef float (*pgd__get_fn)(const void *region, uint32_t page_tokens, uint32_t head_dim,
                             uint32_t row, uint32_t d);

static inline void pgd__ref_k_scores(const void *region, uint32_t pt, uint32_t hd, uint32_t r0,
                                     uint32_t n, const float *q, uint32_t nq, float scale,
                                     float *scores, size_t ld, pgd__get_fn get)
{
    for (uint32_t h = 0; h < nq; h++)
        for (uint32_t j = 0; j < n; j++) {
            float s = 0;
            for (uint32_t d = 0; d < hd; d++)
                s += q[(size_t)h * hd + d] * get(region, pt, hd, r0 + j, d);
            scores[h * ld + j] = s * scale;
        }
}

static inline void pgd__ref_v_accum(const void *region, uint32_t pt, uint32_t hd, uint32_t r0,
                                    uint32_t n, const float *a, size_t lda, uint32_t nq, float *out,
                                    pgd__get_fn get)
{
    for (uint32_t h = 0; h < nq; h++)
        for (uint32_t j = 0; j < n; j++) {
            float w = a[h * lda + j];
            for (uint32_t d = 0; d < hd; d++)
                out[(size_t)h * hd + d] += w * get(region, pt, hd, r0 + j, d);
        }
}

static inline void pgd__ref_decode(const void *region, uint32_t pt, uint32_t hd, uint32_t r0,
                                   uint32_t n, float *out, pgd__get_fn get)
{
    for (uint32_t j = 0; j < n; j++)
        for (uint32_t d = 0; d < hd; d++)
            out[(size_t)j * hd + d] = get(region, pt, hd, r0 + j, d);
}

#endif /* PGD_CODEC_IMPL_H */
