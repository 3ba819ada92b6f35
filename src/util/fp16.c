/* SPDX-License-Identifier: MIT */
/*
 * fp16.c - f16 / bf16 conversions (see fp16.h): scalar, round to nearest even, and whole
 * rows through F16C when the CPU has it (util/cpu.c). Callers: the codecs, the attention
 * kernels, cache.c. No state.
 */
#include <math.h>
#include <string.h>

#include "util/cpu.h"
#include "util/fp16.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define FP16_X86 1
#endif

/* ---- f16 / bf16 ---- */

/* float_to_half_fast3_rtne (F. Giesen, public domain): exact round to nearest even,
 * overflow to infinity, NaN to a quiet NaN. */
uint16_t pgd__f32_to_f16(float f)
{
    uint32_t x, sign;
    memcpy(&x, &f, 4);
    sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    if (x >= 0x47800000u) /* >= 65536 (rounds to inf), inf or NaN */
        return (uint16_t)(sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (x < 0x38800000u) { /* below 2^-14: f16 subnormal or zero */
        float t;
        memcpy(&t, &x, 4);
        t += 0.5f; /* aligns the f16 subnormal ulp (2^-24) with the f32 ulp of 0.5 */
        memcpy(&x, &t, 4);
        return (uint16_t)(sign | (x - 0x3f000000u));
    }
    uint32_t odd = (x >> 13) & 1u;
    x += 0xc8000fffu + odd; /* rebias the exponent (127 -> 15) and round */
    return (uint16_t)(sign | (x >> 13));
}

float pgd__f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
    float f;
    if (e == 0) {
        f = (float)m * 0x1p-24f;
        return sign ? -f : f;
    }
    if (e == 31)
        x = sign | 0x7f800000u | (m << 13);
    else
        x = sign | ((e + 112u) << 23) | (m << 13);
    memcpy(&f, &x, 4);
    return f;
}

uint16_t pgd__f32_to_f16_up(float f)
{
    uint16_t h = pgd__f32_to_f16(f);
    if ((h & 0x7fffu) >= 0x7c00u) return (uint16_t)((h & 0x8000u) | 0x7bffu);
    if (fabsf(pgd__f16_to_f32(h)) < fabsf(f)) h++; /* next magnitude up, same sign */
    if ((h & 0x7fffu) >= 0x7c00u) return (uint16_t)((h & 0x8000u) | 0x7bffu);
    return h;
}

uint16_t pgd__f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

float pgd__bf16_to_f32(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

#ifdef FP16_X86
__attribute__((target("avx2,f16c"))) static void f32_to_f16_f16c(const float *x, uint16_t *h,
                                                                 size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(h + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        h[i] = pgd__f32_to_f16(x[i]);
}

__attribute__((target("avx2,f16c"))) static void f16_to_f32_f16c(const uint16_t *h, float *x,
                                                                 size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    for (; i < n; i++)
        x[i] = pgd__f16_to_f32(h[i]);
}
#endif

void pgd__f32_to_f16_n(const float *x, uint16_t *h, size_t n)
{
#ifdef FP16_X86
    if (pgd__cpu_isa() >= PGD__ISA_AVX2) {
        f32_to_f16_f16c(x, h, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        h[i] = pgd__f32_to_f16(x[i]);
}

void pgd__f16_to_f32_n(const uint16_t *h, float *x, size_t n)
{
#ifdef FP16_X86
    if (pgd__cpu_isa() >= PGD__ISA_AVX2) {
        f16_to_f32_f16c(h, x, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        x[i] = pgd__f16_to_f32(h[i]);
}
