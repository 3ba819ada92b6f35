/* SPDX-License-Identifier: MIT */
/*
 * fp16.h - f16 (IEEE binary16) and bf16 conversions (util/fp16.c). Callers: the codecs
 * (src/codec/), the attention kernels (src/attn/), cache.c (the kivi2 residual window),
 * tests. Internal to libpagoda. Pure functions: thread-safe.
 */
#ifndef PGD_UTIL_FP16_H
#define PGD_UTIL_FP16_H

#include <stddef.h>
#include <stdint.h>

/* f32 -> f16 rounds to nearest even, overflows to infinity, maps NaN to a quiet NaN.
 * f16 -> f32 is exact. */
uint16_t pgd__f32_to_f16(float f);
float pgd__f16_to_f32(uint16_t h);

/* f16 of f, rounded away from zero instead of to nearest: |result| >= |f| (so that a
 * scale computed as amax / qmax never makes a value overflow its code range), clamped to
 * the largest finite f16. */
uint16_t pgd__f32_to_f16_up(float f);

/* f32 -> bf16 rounds to nearest even (NaN stays a quiet NaN); bf16 -> f32 is exact. */
uint16_t pgd__f32_to_bf16(float f);
float pgd__bf16_to_f32(uint16_t h);

/* Whole rows of n values: F16C when the CPU has it (pgd__cpu_isa() >= PGD__ISA_AVX2),
 * bit-identical to the scalar conversions above. */
void pgd__f32_to_f16_n(const float *x, uint16_t *h, size_t n);
void pgd__f16_to_f32_n(const uint16_t *h, float *x, size_t n);

#endif /* PGD_UTIL_FP16_H */
