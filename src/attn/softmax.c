/* SPDX-License-Identifier: MIT */
/*
 * softmax.c - the online-softmax step of the fast attention path (attn.c), in scalar,
 * AVX2+FMA and AVX-512F versions chosen at run time from the CPU's features.
 *
 * Scores arrive in the log2 domain (k_scores was given scale = log2(e) / sqrt(head_dim)),
 * so one exp2 per score replaces exp: 2^(s - m) = e^((s' - m') ) for s = s' * log2(e).
 * One step, for one query vector and one block of keys s[0..nb) of which s[0..nv) are
 * valid (nv >= 1; the rest lie past the row's causal limit):
 *
 *     m' = max(m, max_j<nv s[j])      s[j] <- 2^(s[j] - m') (j < nv), 0 (nv <= j < nb)
 *     returns alpha = 2^(m - m')      (0 when m = -inf: nothing accumulated yet)
 *     *sum = sum_j<nv s[j]            the caller keeps l <- l * alpha + sum, O <- O * alpha
 *
 * The vectorised exp2: x clamped to [-125, 0] (s <= m', and 2^-125 is negligible next to
 * the 1 that the maximum contributes), x = n + f with n = round(x), |f| <= 1/2, 2^f by its
 * degree-7 Taylor polynomial (relative error < 1e-8, below float rounding), then 2^n added
 * to the exponent bits (AVX2) or applied by vscalefps (AVX-512).
 *
 * Also the axpy of the scores (attn.c, add_scores): y[0..n) += c * x[0..n), at the same
 * levels (the AVX2 and AVX-512 ones fused, so levels differ in the last bit).
 *
 * And gemma2's logit soft-cap (attn.c, before the step): s[j] <- c * tanh(s[j] / c), where c
 * is the cap in the scores' log2 domain. The vectorised tanh, odd, for t = |x|:
 *
 *     t <  0.4   t * P(t^2), the Taylor polynomial of degree 15 (truncation < 3e-10 relative)
 *     t >= 0.4   (1 - e) / (1 + e), e = 2^(-2 t log2(e)) by the step's exp2 (which clamps
 *                at 2^-125, where the quotient is 1)
 *
 * Worst relative error about 2e-7 (at t = 0.4, where 1 - e cancels least badly; the test
 * measures it against tanh in double), a few float roundings of the scaled logit. A vector
 * whose lanes all lie on one side of 0.4 computes that side only (each lane's formula is
 * the same either way, so the bits are too): with gemma2's cap 50, logits below 20 take the
 * polynomial alone. Measured (bench_attn --gemma, 4k keys, one thread): soft-cap / plain
 * 1.007-1.059 computing both sides, 0.994-1.026 with the test.
 */
#include <math.h>
#include <string.h>

#include "attn_int.h"
#include "util/cpu.h"

/* ---- scalar ---- */

static float step_scalar(float *s, uint32_t nv, uint32_t nb, float *m, float *sum)
{
    float mx = s[0];
    for (uint32_t j = 1; j < nv; j++)
        mx = s[j] > mx ? s[j] : mx;
    float m_old = *m, m_new = mx > m_old ? mx : m_old;
    float acc = 0;
    for (uint32_t j = 0; j < nv; j++) {
        s[j] = exp2f(s[j] - m_new);
        acc += s[j];
    }
    for (uint32_t j = nv; j < nb; j++)
        s[j] = 0;
    *m = m_new;
    *sum = acc;
    return m_old == -INFINITY ? 0.0f : exp2f(m_old - m_new);
}

static void axpy_scalar(float *restrict y, const float *restrict x, float c, uint32_t n)
{
    for (uint32_t j = 0; j < n; j++)
        y[j] += c * x[j];
}

static void softcap_scalar(float *s, uint32_t n, float cap)
{
    const float inv = 1.0f / cap;
    for (uint32_t j = 0; j < n; j++)
        s[j] = cap * tanhf(s[j] * inv);
}

/* The odd Taylor coefficients of tanh, x^1 .. x^15. */
#define TANH_T1 1.0f
#define TANH_T3 (-1.0f / 3.0f)
#define TANH_T5 (2.0f / 15.0f)
#define TANH_T7 (-17.0f / 315.0f)
#define TANH_T9 (62.0f / 2835.0f)
#define TANH_T11 (-1382.0f / 155925.0f)
#define TANH_T13 (21844.0f / 6081075.0f)
#define TANH_T15 (-929569.0f / 638512875.0f)
#define TANH_SMALL 0.4f
#define M2_LOG2E (-2.8853900817779268f) /* -2 log2(e) */

/* ---- x86 ---- */

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define EXP2_C1 0.6931471805599453f
#define EXP2_C2 0.2402265069591007f
#define EXP2_C3 0.05550410866482158f
#define EXP2_C4 0.009618129107628477f
#define EXP2_C5 0.0013333558146428443f
#define EXP2_C6 0.00015403530393381606f
#define EXP2_C7 1.5252733804059838e-05f

__attribute__((target("avx2,fma"))) static inline __m256 exp2_avx2(__m256 x)
{
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-125.0f)), _mm256_setzero_ps());
    __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(x, n);
    __m256 p = _mm256_set1_ps(EXP2_C7);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C6));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C5));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C4));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C3));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C2));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C1));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
}

__attribute__((target("avx2,fma"))) static inline __m256i tail_mask_avx2(uint32_t r)
{
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)r), idx);
}

__attribute__((target("avx2,fma"))) static inline float hmax_avx2(__m256 v)
{
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

__attribute__((target("avx2,fma"))) static inline float hsum_avx2(__m256 v)
{
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

__attribute__((target("avx2,fma"))) static float step_avx2(float *s, uint32_t nv, uint32_t nb,
                                                           float *m, float *sum)
{
    const uint32_t nf = nv & ~7u;
    __m256 vm = _mm256_set1_ps(-INFINITY);
    for (uint32_t j = 0; j < nf; j += 8)
        vm = _mm256_max_ps(vm, _mm256_loadu_ps(s + j));
    float mx = hmax_avx2(vm);
    for (uint32_t j = nf; j < nv; j++)
        mx = s[j] > mx ? s[j] : mx;
    float m_old = *m, m_new = mx > m_old ? mx : m_old;
    const __m256 vmn = _mm256_set1_ps(m_new);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
    uint32_t j = 0;
    for (; j + 16 <= nv; j += 16) {
        __m256 p0 = exp2_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j), vmn));
        __m256 p1 = exp2_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j + 8), vmn));
        _mm256_storeu_ps(s + j, p0);
        _mm256_storeu_ps(s + j + 8, p1);
        acc0 = _mm256_add_ps(acc0, p0);
        acc1 = _mm256_add_ps(acc1, p1);
    }
    for (; j < nv; j += 8) {
        __m256i msk = tail_mask_avx2(nv - j);
        __m256 p = exp2_avx2(_mm256_sub_ps(_mm256_maskload_ps(s + j, msk), vmn));
        p = _mm256_and_ps(p, _mm256_castsi256_ps(msk));
        _mm256_maskstore_ps(s + j, msk, p);
        acc0 = _mm256_add_ps(acc0, p);
    }
    for (j = nv; j < nb; j++)
        s[j] = 0;
    *m = m_new;
    *sum = hsum_avx2(_mm256_add_ps(acc0, acc1));
    return m_old == -INFINITY ? 0.0f : exp2f(m_old - m_new);
}

/* tanh of 8 lanes (see the file header). */
__attribute__((target("avx2,fma"))) static inline __m256 tanh_avx2(__m256 x)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 t = _mm256_andnot_ps(sign, x);
    const __m256 big = _mm256_cmp_ps(t, _mm256_set1_ps(TANH_SMALL), _CMP_GE_OQ);
    const int nbig = _mm256_movemask_ps(big);
    __m256 p = _mm256_setzero_ps(), r = p;
    if (nbig != 0xff) {
        const __m256 t2 = _mm256_mul_ps(t, t);
        p = _mm256_set1_ps(TANH_T15);
        p = _mm256_fmadd_ps(p, t2, _mm256_set1_ps(TANH_T13));
        p = _mm256_fmadd_ps(p, t2, _mm256_set1_ps(TANH_T11));
        p = _mm256_fmadd_ps(p, t2, _mm256_set1_ps(TANH_T9));
        p = _mm256_fmadd_ps(p, t2, _mm256_set1_ps(TANH_T7));
        p = _mm256_fmadd_ps(p, t2, _mm256_set1_ps(TANH_T5));
        p = _mm256_fmadd_ps(p, t2, _mm256_set1_ps(TANH_T3));
        p = _mm256_mul_ps(_mm256_mul_ps(p, t2), t);
        p = _mm256_add_ps(p, t);
    }
    if (nbig) {
        const __m256 e = exp2_avx2(_mm256_mul_ps(t, _mm256_set1_ps(M2_LOG2E)));
        const __m256 one = _mm256_set1_ps(1.0f);
        r = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
    }
    return _mm256_or_ps(_mm256_blendv_ps(p, r, big), _mm256_and_ps(sign, x));
}

__attribute__((target("avx2,fma"))) static void softcap_avx2(float *s, uint32_t n, float cap)
{
    const __m256 vc = _mm256_set1_ps(cap), vi = _mm256_set1_ps(1.0f / cap);
    uint32_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(s + j,
                         _mm256_mul_ps(vc, tanh_avx2(_mm256_mul_ps(_mm256_loadu_ps(s + j), vi))));
    if (j < n) {
        __m256i msk = tail_mask_avx2(n - j);
        __m256 x = _mm256_mul_ps(_mm256_maskload_ps(s + j, msk), vi);
        _mm256_maskstore_ps(s + j, msk, _mm256_mul_ps(vc, tanh_avx2(x)));
    }
}

__attribute__((target("avx512f"))) static inline __m512 exp2_avx512(__m512 x)
{
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-125.0f)), _mm512_setzero_ps());
    __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(EXP2_C7);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_C6));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_C5));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_C4));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_C3));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_C2));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_C1));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

__attribute__((target("avx512f"))) static float step_avx512(float *s, uint32_t nv, uint32_t nb,
                                                            float *m, float *sum)
{
    __m512 vm = _mm512_set1_ps(-INFINITY);
    uint32_t j = 0;
    for (; j + 16 <= nv; j += 16)
        vm = _mm512_max_ps(vm, _mm512_loadu_ps(s + j));
    if (j < nv) {
        __mmask16 k = (__mmask16)((1u << (nv - j)) - 1);
        vm = _mm512_mask_max_ps(vm, k, vm, _mm512_maskz_loadu_ps(k, s + j));
    }
    float mx = _mm512_reduce_max_ps(vm);
    float m_old = *m, m_new = mx > m_old ? mx : m_old;
    const __m512 vmn = _mm512_set1_ps(m_new);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
    for (j = 0; j + 32 <= nv; j += 32) {
        __m512 p0 = exp2_avx512(_mm512_sub_ps(_mm512_loadu_ps(s + j), vmn));
        __m512 p1 = exp2_avx512(_mm512_sub_ps(_mm512_loadu_ps(s + j + 16), vmn));
        _mm512_storeu_ps(s + j, p0);
        _mm512_storeu_ps(s + j + 16, p1);
        acc0 = _mm512_add_ps(acc0, p0);
        acc1 = _mm512_add_ps(acc1, p1);
    }
    for (; j < nv; j += 16) {
        uint32_t r = nv - j < 16 ? nv - j : 16;
        __mmask16 k = (__mmask16)(r == 16 ? 0xffffu : (1u << r) - 1);
        __m512 p = exp2_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), vmn));
        p = _mm512_maskz_mov_ps(k, p);
        _mm512_mask_storeu_ps(s + j, k, p);
        acc0 = _mm512_add_ps(acc0, p);
    }
    for (j = nv; j < nb; j++)
        s[j] = 0;
    *m = m_new;
    *sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    return m_old == -INFINITY ? 0.0f : exp2f(m_old - m_new);
}

/* tanh of 16 lanes (see the file header). */
__attribute__((target("avx512f"))) static inline __m512 tanh_avx512(__m512 x)
{
    const __m512 t = _mm512_abs_ps(x);
    const __mmask16 big = _mm512_cmp_ps_mask(t, _mm512_set1_ps(TANH_SMALL), _CMP_GE_OQ);
    __m512 p = _mm512_setzero_ps(), r = p;
    if (big != 0xffff) {
        const __m512 t2 = _mm512_mul_ps(t, t);
        p = _mm512_set1_ps(TANH_T15);
        p = _mm512_fmadd_ps(p, t2, _mm512_set1_ps(TANH_T13));
        p = _mm512_fmadd_ps(p, t2, _mm512_set1_ps(TANH_T11));
        p = _mm512_fmadd_ps(p, t2, _mm512_set1_ps(TANH_T9));
        p = _mm512_fmadd_ps(p, t2, _mm512_set1_ps(TANH_T7));
        p = _mm512_fmadd_ps(p, t2, _mm512_set1_ps(TANH_T5));
        p = _mm512_fmadd_ps(p, t2, _mm512_set1_ps(TANH_T3));
        p = _mm512_mul_ps(_mm512_mul_ps(p, t2), t);
        p = _mm512_add_ps(p, t);
    }
    if (big) {
        const __m512 e = exp2_avx512(_mm512_mul_ps(t, _mm512_set1_ps(M2_LOG2E)));
        const __m512 one = _mm512_set1_ps(1.0f);
        r = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
    }
    const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN));
    const __m512 y = _mm512_mask_mov_ps(p, big, r);
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(y), sign));
}

__attribute__((target("avx512f"))) static void softcap_avx512(float *s, uint32_t n, float cap)
{
    const __m512 vc = _mm512_set1_ps(cap), vi = _mm512_set1_ps(1.0f / cap);
    uint32_t j = 0;
    for (; j + 16 <= n; j += 16)
        _mm512_storeu_ps(s + j,
                         _mm512_mul_ps(vc, tanh_avx512(_mm512_mul_ps(_mm512_loadu_ps(s + j), vi))));
    if (j < n) {
        __mmask16 k = (__mmask16)((1u << (n - j)) - 1);
        __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, s + j), vi);
        _mm512_mask_storeu_ps(s + j, k, _mm512_mul_ps(vc, tanh_avx512(x)));
    }
}

__attribute__((target("avx2,fma"))) static void
axpy_avx2(float *restrict y, const float *restrict x, float c, uint32_t n)
{
    const __m256 vc = _mm256_set1_ps(c);
    uint32_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(y + j,
                         _mm256_fmadd_ps(vc, _mm256_loadu_ps(x + j), _mm256_loadu_ps(y + j)));
    for (; j < n; j++)
        y[j] = fmaf(c, x[j], y[j]);
}

__attribute__((target("avx512f"))) static void
axpy_avx512(float *restrict y, const float *restrict x, float c, uint32_t n)
{
    const __m512 vc = _mm512_set1_ps(c);
    uint32_t j = 0;
    for (; j + 16 <= n; j += 16)
        _mm512_storeu_ps(y + j,
                         _mm512_fmadd_ps(vc, _mm512_loadu_ps(x + j), _mm512_loadu_ps(y + j)));
    if (j < n) {
        __mmask16 k = (__mmask16)((1u << (n - j)) - 1);
        _mm512_mask_storeu_ps(
            y + j, k,
            _mm512_fmadd_ps(vc, _mm512_maskz_loadu_ps(k, x + j), _mm512_maskz_loadu_ps(k, y + j)));
    }
}

static int cpu_level(void)
{
    /* util/cpu.c's level (PGD_ISA may lower it): AVX2 + FMA + F16C, AVX-512 F/BW/VL/DQ */
    const int isa = pgd__cpu_isa();
    return isa >= PGD__ISA_AVX512 ? PGD__ATTN_AVX512
           : isa >= PGD__ISA_AVX2 ? PGD__ATTN_AVX2
                                  : PGD__ATTN_SCALAR;
}
#else
static int cpu_level(void)
{
    return PGD__ATTN_SCALAR;
}
#endif

/* ---- dispatch ---- */

int pgd__attn_isa(void)
{
    return cpu_level();
}

pgd__softmax_step_fn pgd__attn_softmax_step(int isa)
{
    if (isa > cpu_level()) return NULL;
    switch (isa) {
    case PGD__ATTN_SCALAR:
        return step_scalar;
#if defined(__x86_64__) || defined(__i386__)
    case PGD__ATTN_AVX2:
        return step_avx2;
    case PGD__ATTN_AVX512:
        return step_avx512;
#endif
    }
    return NULL;
}

pgd__attn_softcap_fn pgd__attn_softcap(int isa)
{
    if (isa > cpu_level()) return NULL;
    switch (isa) {
    case PGD__ATTN_SCALAR:
        return softcap_scalar;
#if defined(__x86_64__) || defined(__i386__)
    case PGD__ATTN_AVX2:
        return softcap_avx2;
    case PGD__ATTN_AVX512:
        return softcap_avx512;
#endif
    }
    return NULL;
}

pgd__attn_axpy_fn pgd__attn_axpy(int isa)
{
    if (isa > cpu_level()) return NULL;
    switch (isa) {
    case PGD__ATTN_SCALAR:
        return axpy_scalar;
#if defined(__x86_64__) || defined(__i386__)
    case PGD__ATTN_AVX2:
        return axpy_avx2;
    case PGD__ATTN_AVX512:
        return axpy_avx512;
#endif
    }
    return NULL;
}
