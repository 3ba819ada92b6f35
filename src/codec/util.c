/* SPDX-License-Identifier: MIT */
/*
 * util.c - what every codec and the attention kernels share: f16 / bf16 conversions
 * (scalar, round to nearest even; F16C for whole rows when the CPU has it), the
 * randomized Hadamard rotation (pgd__hadamard) and the ISA detection behind
 * pgd__codec_get. Callers: the codecs, the attention kernels, cache.c.
 * No state but the detected ISA level (an atomic, set once).
 */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "codec_impl.h"
#include "pgd_int.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
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

#ifdef PGD__CODEC_X86
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
#ifdef PGD__CODEC_X86
    if (pgd__codec_isa() >= PGD__ISA_AVX2) {
        f32_to_f16_f16c(x, h, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        h[i] = pgd__f32_to_f16(x[i]);
}

void pgd__f16_to_f32_n(const uint16_t *h, float *x, size_t n)
{
#ifdef PGD__CODEC_X86
    if (pgd__codec_isa() >= PGD__ISA_AVX2) {
        f16_to_f32_f16c(h, x, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        x[i] = pgd__f16_to_f32(h[i]);
}

/* ---- Hadamard rotation ---- */

static uint64_t splitmix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Sign i of D is negative when bit (i % 64) of splitmix64(seed + i / 64) is set. */
static void apply_signs(float *x, uint32_t n, uint64_t seed)
{
    for (uint32_t i0 = 0; i0 < n; i0 += 64) {
        uint64_t bits = splitmix64(seed + i0 / 64);
        for (uint32_t i = i0; i < n && i < i0 + 64; i++)
            if ((bits >> (i - i0)) & 1u) x[i] = -x[i];
    }
}

int pgd__hadamard(float *x, uint32_t head_dim, uint64_t seed, int inverse)
{
    uint32_t n = head_dim;
    if (n == 0 || (n & (n - 1))) return PGD_EINVAL;
    if (!inverse) apply_signs(x, n, seed);
    for (uint32_t len = 1; len < n; len <<= 1)
        for (uint32_t i = 0; i < n; i += len << 1)
            for (uint32_t j = i; j < i + len; j++) {
                float a = x[j], b = x[j + len];
                x[j] = a + b;
                x[j + len] = a - b;
            }
    float norm = 1.0f / sqrtf((float)n);
    for (uint32_t i = 0; i < n; i++)
        x[i] *= norm;
    if (inverse) apply_signs(x, n, seed);
    return PGD_OK;
}

/* ---- ISA detection ---- */

static atomic_int isa_level = -1;

static int detect(void)
{
#ifdef PGD__CODEC_X86
    unsigned a, b, c, d;
    __builtin_cpu_init();
    /* F16C by CPUID (leaf 1, ECX bit 29): older compilers' __builtin_cpu_supports lacks it. */
    int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    int avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    int vnni =
        avx512 && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi");
    if (vnni) return PGD__ISA_VNNI;
    if (avx512) return PGD__ISA_AVX512;
    if (avx2) return PGD__ISA_AVX2;
#endif
    return PGD__ISA_SCALAR;
}

int pgd__codec_isa(void)
{
    int v = atomic_load_explicit(&isa_level, memory_order_relaxed);
    if (v < 0) {
        v = detect();
        atomic_store_explicit(&isa_level, v, memory_order_relaxed);
    }
    return v;
}
