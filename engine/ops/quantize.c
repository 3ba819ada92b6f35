/* SPDX-License-Identifier: MIT */
/*
 * quantize.c - f32 rows to the weight types of issue 15 (Q4_1 Q5_0 Q5_1 IQ4_NL Q2_K Q3_K
 * Q4_K Q5_K Q6_K), as ggml's reference quantizers without an importance matrix do, which is
 * what llama-quantize runs on a file without --imatrix. Caller: pe_quant_row (ops_ref.c),
 * used by `pagoda synth-model` and the tests; never on the inference path.
 *
 * The algorithms, per type (block layouts in ggml_types.h):
 *   Q4_1, Q5_1  min/max per 32 values: d = (max - min) / (2^bits - 1), m = min,
 *               q = trunc((x - min) / d + 0.5).
 *   Q5_0        the value of largest |x| (signed) gives d = max / -16, q = trunc(x / d + 16.5).
 *   IQ4_NL      per 32 values: a first scale from the largest |x| onto the table's end, then 15
 *               trial scales around it, each scored by the x^2-weighted least-squares fit of
 *               x ~ d * table[q] with q the nearest table entry; the best d is stored.
 *   Q4_K, Q5_K  per 32-value sub-block an affine fit x ~ scale * q - min (weights
 *               |x| + rms(sub-block)) by a search over 21 (Q4_K) or 16 (Q5_K) grid
 *               steps, each solved in closed form; then the 8 scales and 8 mins are
 *               quantized to 6 bits against the super-block's largest (d, dmin in f16), and
 *               every value is re-quantized against the scale and min as stored.
 *   Q2_K        the same per 16 values with 2-bit q, 4-bit scales and mins, |x| weights
 *               and the absolute (not squared) error.
 *   Q6_K        per 16 values a symmetric fit x ~ scale * q (q in -32..31, x^2 weights)
 *               with 18 trial scales around amax; scales to int8 against the largest.
 *   Q3_K        per 16 values a symmetric 3-bit fit refined coordinate-wise (x^2 weights,
 *               up to 5 sweeps); scales to 6 bits (offset 32) against the largest.
 * Rounding is ggml's nearest_int (round half to even through 1.5 * 2^23); sums are f32 in
 * ggml's order, so for inputs llama-quantize gets the bytes are its bytes (checked against
 * the reference set in tests/engine/test_quantize.c).
 * Invariant: every output is a valid block whatever the input (zeros, constants, huge
 * outliers): scales are finite f16 for finite input, and decoding never yields NaN or inf.
 */
#include <math.h>
#include <string.h>

#include "ops_int.h"

/* Below this, a group is treated as all zeros (ggml's GROUP_MAX_EPS). */
#define GROUP_EPS 1e-15f

static const int8_t iq4nl_table[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                       1,    13,   25,  38,  53,  69,  89,  113};

/* Round to nearest, ties to even, for |v| < 2^22 (ggml's nearest_int). */
static int round_int(float v)
{
    const float t = v + 12582912.f;
    int i;
    memcpy(&i, &t, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

static int clamp_int(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* ---- the 32-value types ---- */

/* Minimum and maximum of 32 values (min first wins ties, as ggml scans). */
static void min_max32(const float *x, float *mn, float *mx)
{
    float lo = INFINITY, hi = -INFINITY;
    for (int j = 0; j < 32; j++) {
        if (x[j] < lo) lo = x[j];
        if (x[j] > hi) hi = x[j];
    }
    *mn = lo;
    *mx = hi;
}

static void quant_q4_1(const float *x, block_q4_1 *y, size_t nb)
{
    for (size_t i = 0; i < nb; i++, x += 32) {
        float mn, mx;
        min_max32(x, &mn, &mx);
        const float d = (mx - mn) / 15;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = pe_f32_to_f16(d);
        y[i].m = pe_f32_to_f16(mn);
        for (int j = 0; j < 16; j++) {
            const int q0 = (int8_t)((x[j] - mn) * id + 0.5f);
            const int q1 = (int8_t)((x[j + 16] - mn) * id + 0.5f);
            y[i].qs[j] = (uint8_t)((q0 < 15 ? q0 : 15) | (q1 < 15 ? q1 : 15) << 4);
        }
    }
}

/* Stores 32 five-bit values: low nibbles as Q4_0, bit 4 of value j in bit j of qh. */
static void pack5(const int q[32], uint8_t qs[16], uint8_t qh_bytes[4])
{
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 0xF) | (q[j + 16] & 0xF) << 4);
        qh |= (uint32_t)((q[j] >> 4) & 1) << j;
        qh |= (uint32_t)((q[j + 16] >> 4) & 1) << (j + 16);
    }
    memcpy(qh_bytes, &qh, 4);
}

static void quant_q5_0(const float *x, block_q5_0 *y, size_t nb)
{
    for (size_t i = 0; i < nb; i++, x += 32) {
        float amax = 0.0f, max = 0.0f;
        int q[32];
        for (int j = 0; j < 32; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        const float d = max / -16;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = pe_f32_to_f16(d);
        for (int j = 0; j < 32; j++) {
            const int v = (int8_t)(x[j] * id + 16.5f);
            q[j] = v < 31 ? v : 31;
        }
        pack5(q, y[i].qs, y[i].qh);
    }
}

static void quant_q5_1(const float *x, block_q5_1 *y, size_t nb)
{
    for (size_t i = 0; i < nb; i++, x += 32) {
        float mn, mx;
        int q[32];
        min_max32(x, &mn, &mx);
        const float d = (mx - mn) / 31;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = pe_f32_to_f16(d);
        y[i].m = pe_f32_to_f16(mn);
        for (int j = 0; j < 32; j++)
            q[j] = (uint8_t)((x[j] - mn) * id + 0.5f);
        pack5(q, y[i].qs, y[i].qh);
    }
}

/* Index of the table entry nearest to v (ties to the upper entry only when strictly
 * nearer, as ggml's best_index_int8). */
static int iq4nl_nearest(float v)
{
    if (v <= iq4nl_table[0]) return 0;
    if (v >= iq4nl_table[15]) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (v < iq4nl_table[mid])
            hi = mid;
        else
            lo = mid;
    }
    return v - iq4nl_table[hi - 1] < iq4nl_table[hi] - v ? hi - 1 : hi;
}

/* The x^2-weighted fit of x ~ d * table[q(x * id)]: sets *sqx = sum w q x, *sq2 = sum w q^2. */
static void iq4nl_fit(const float *x, float id, uint8_t *idx, float *sqx, float *sq2)
{
    float a = 0.0f, b = 0.0f;
    for (int j = 0; j < 32; j++) {
        const int l = iq4nl_nearest(id * x[j]);
        const float q = iq4nl_table[l], w = x[j] * x[j];
        if (idx) idx[j] = (uint8_t)l;
        a += w * q * x[j];
        b += w * q * q;
    }
    *sqx = a;
    *sq2 = b;
}

static void quant_iq4_nl(const float *x, block_iq4_nl *y, size_t nb)
{
    const int ntry = 7;
    for (size_t i = 0; i < nb; i++, x += 32) {
        float amax = 0.0f, max = 0.0f, d = 0.0f;
        uint8_t idx[32];
        for (int j = 0; j < 32; j++) {
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        if (amax >= GROUP_EPS) {
            float sqx, sq2;
            iq4nl_fit(x, 1.0f / (-max / iq4nl_table[0]), idx, &sqx, &sq2);
            d = sqx / sq2;
            float best = d * sqx;
            for (int t = -ntry; t <= ntry; t++) {
                iq4nl_fit(x, (float)(t + iq4nl_table[0]) / max, NULL, &sqx, &sq2);
                if (sq2 > 0 && sqx * sqx > best * sq2) {
                    d = sqx / sq2;
                    best = d * sqx;
                }
            }
        }
        y[i].d = pe_f32_to_f16(d);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < 32; j++)
            idx[j] = (uint8_t)iq4nl_nearest(id * x[j]);
        for (int j = 0; j < 16; j++)
            y[i].qs[j] = (uint8_t)(idx[j] | idx[j + 16] << 4);
    }
}

/* ---- the K-quant fits ---- */

/* Affine fit x[i] ~ scale * L[i] - min over n values, L in 0..nmax, with weights w, min >= 0
 * (the fit's offset is clamped to <= 0). Starts from the min/max grid, then tries nstep + 1
 * grid widths (nmax + rmin + rdelta * k) / (max - min) and keeps the one whose closed-form
 * least-squares scale and offset give the smallest weighted error (squared, or absolute when
 * mad). Returns the scale and sets *min_out (ggml's make_qkx2_quants). */
static float fit_affine(int n, int nmax, const float *x, const float *w, uint8_t *L, float *min_out,
                        float rmin, float rdelta, int nstep, int mad)
{
    uint8_t aux[32];
    float mn = x[0], mx = x[0], sw = w[0], sx = w[0] * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < mn) mn = x[i];
        if (x[i] > mx) mx = x[i];
        sw += w[i];
        sx += w[i] * x[i];
    }
    if (mn > 0) mn = 0;
    if (mx == mn) {
        memset(L, 0, (size_t)n);
        *min_out = -mn;
        return 0.0f;
    }
    float iscale = nmax / (mx - mn), scale = 1 / iscale, best = 0.0f;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clamp_int(round_int(iscale * (x[i] - mn)), 0, nmax);
        const float diff = scale * L[i] + mn - x[i];
        best += w[i] * (mad ? fabsf(diff) : diff * diff);
    }
    for (int k = 0; k <= nstep; k++) {
        iscale = (rmin + rdelta * k + nmax) / (mx - mn);
        float sl = 0, sl2 = 0, sxl = 0;
        for (int i = 0; i < n; i++) {
            const int l = clamp_int(round_int(iscale * (x[i] - mn)), 0, nmax);
            aux[i] = (uint8_t)l;
            sl += w[i] * l;
            sl2 += w[i] * l * l;
            sxl += w[i] * l * x[i];
        }
        const float det = sw * sl2 - sl * sl;
        if (det <= 0) continue;
        float sc = (sw * sxl - sx * sl) / det, off = (sl2 * sx - sl * sxl) / det;
        if (off > 0) {
            off = 0;
            sc = sxl / sl2;
        }
        float err = 0;
        for (int i = 0; i < n; i++) {
            const float diff = sc * aux[i] + off - x[i];
            err += w[i] * (mad ? fabsf(diff) : diff * diff);
        }
        if (err < best) {
            memcpy(L, aux, (size_t)n);
            best = err;
            scale = sc;
            mn = off;
        }
    }
    *min_out = -mn;
    return scale;
}

/* Symmetric fit x[i] ~ scale * (L[i] - nmax) over n values, L - nmax in -nmax..nmax-1, x^2
 * weights: the grid from the value of largest |x| and 18 trial grids nmax + 0.1 k (k = -9..9,
 * k != 0) around it, keeping the best weighted least-squares fit (ggml's make_qx_quants with
 * rmse_type 1). Returns the signed scale (0 for an all-zero group). */
static float fit_sym(int n, int nmax, const float *x, int8_t *L)
{
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < n; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    }
    if (amax < GROUP_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = -nmax / max, slx = 0, sl2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = clamp_int(round_int(iscale * x[i]), -nmax, nmax - 1);
        const float w = x[i] * x[i];
        L[i] = (int8_t)(l + nmax);
        slx += w * x[i] * l;
        sl2 += w * l * l;
    }
    float scale = sl2 ? slx / sl2 : 0.0f, best = scale * slx;
    for (int k = -9; k <= 9; k++) {
        if (k == 0) continue;
        iscale = -(nmax + 0.1f * k) / max;
        slx = sl2 = 0;
        for (int i = 0; i < n; i++) {
            const int l = clamp_int(round_int(iscale * x[i]), -nmax, nmax - 1);
            const float w = x[i] * x[i];
            slx += w * x[i] * l;
            sl2 += w * l * l;
        }
        if (sl2 > 0 && slx * slx > best * sl2) {
            for (int i = 0; i < n; i++)
                L[i] = (int8_t)(nmax + clamp_int(round_int(iscale * x[i]), -nmax, nmax - 1));
            scale = slx / sl2;
            best = scale * slx;
        }
    }
    return scale;
}

/* Symmetric 3-bit fit of 16 values (nmax 4): the amax grid, then up to 5 coordinate sweeps
 * that move one L[i] to its best value given the others whenever that raises the x^2-weighted
 * fit quality slx^2 / sl2 (ggml's make_q3_quants with do_rmse). L gets l + 4. */
static float fit_q3(const float *x, int8_t *L)
{
    const int nmax = 4, n = 16;
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < n; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    }
    if (amax < GROUP_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    const float iscale = -nmax / max;
    float slx = 0, sl2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = clamp_int(round_int(iscale * x[i]), -nmax, nmax - 1);
        const float w = x[i] * x[i];
        L[i] = (int8_t)l;
        slx += w * x[i] * l;
        sl2 += w * l * l;
    }
    for (int sweep = 0; sweep < 5; sweep++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float s1 = slx - w * x[i] * L[i];
            if (s1 <= 0) continue;
            float s2 = sl2 - w * L[i] * L[i];
            const int l = clamp_int(round_int(x[i] * s2 / s1), -nmax, nmax - 1);
            if (l == L[i]) continue;
            s1 += w * x[i] * l;
            s2 += w * l * l;
            if (s2 > 0 && s1 * s1 * sl2 > slx * slx * s2) {
                L[i] = (int8_t)l;
                slx = s1;
                sl2 = s2;
                changed++;
            }
        }
        if (!changed) break;
    }
    for (int i = 0; i < n; i++)
        L[i] = (int8_t)(L[i] + nmax);
    return slx / sl2;
}

/* ---- the K-quants ---- */

/* Q4_K and Q5_K (bits 4 or 5): the 8 sub-block fits, 6-bit scales and mins, re-quantized
 * values in L (0..2^bits - 1). */
static void quant_k_scale_min(const float *x, int bits, uint16_t *d_out, uint16_t *dmin_out,
                              uint8_t scales[K_SCALE_SIZE], uint8_t L[QK_K])
{
    const int nmax = (1 << bits) - 1;
    float w[32], sc[8], mins[8], max_sc = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 8; j++) {
        const float *xb = x + 32 * j;
        float s2 = 0;
        for (int l = 0; l < 32; l++)
            s2 += xb[l] * xb[l];
        const float av = sqrtf(s2 / 32);
        for (int l = 0; l < 32; l++)
            w[l] = av + fabsf(xb[l]);
        sc[j] = bits == 4 ? fit_affine(32, nmax, xb, w, L + 32 * j, &mins[j], -1.0f, 0.1f, 20, 0)
                          : fit_affine(32, nmax, xb, w, L + 32 * j, &mins[j], -0.5f, 0.1f, 15, 0);
        if (sc[j] > max_sc) max_sc = sc[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float isc = max_sc > 0 ? 63.f / max_sc : 0.0f;
    const float imin = max_min > 0 ? 63.f / max_min : 0.0f;
    memset(scales, 0, K_SCALE_SIZE);
    for (int j = 0; j < 8; j++) {
        uint8_t ls = (uint8_t)round_int(isc * sc[j]), lm = (uint8_t)round_int(imin * mins[j]);
        ls = ls < 63 ? ls : 63;
        lm = lm < 63 ? lm : 63;
        if (j < 4) {
            scales[j] = ls;
            scales[j + 4] = lm;
        } else { /* low 4 bits in bytes 8..11, high 2 bits on top of bytes 0..7 */
            scales[j + 4] = (uint8_t)((ls & 0xF) | (lm & 0xF) << 4);
            scales[j - 4] |= (uint8_t)((ls >> 4) << 6);
            scales[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *d_out = pe_f32_to_f16(max_sc / 63.f);
    *dmin_out = pe_f32_to_f16(max_min / 63.f);
    for (int j = 0; j < 8; j++) {
        uint8_t s, m;
        if (j < 4) {
            s = scales[j] & 63;
            m = scales[j + 4] & 63;
        } else {
            s = (uint8_t)((scales[j + 4] & 0xF) | (scales[j - 4] >> 6) << 4);
            m = (uint8_t)((scales[j + 4] >> 4) | (scales[j] >> 6) << 4);
        }
        const float d = pe_f16_to_f32(*d_out) * s;
        if (!d) continue; /* the fit's values stay: they decode to -min either way */
        const float dm = pe_f16_to_f32(*dmin_out) * m;
        for (int l = 0; l < 32; l++)
            L[32 * j + l] = (uint8_t)clamp_int(round_int((x[32 * j + l] + dm) / d), 0, nmax);
    }
}

static void quant_q4_k(const float *x, block_q4_K *y, size_t nb)
{
    uint8_t L[QK_K];
    for (size_t i = 0; i < nb; i++, x += QK_K) {
        quant_k_scale_min(x, 4, &y[i].d, &y[i].dmin, y[i].scales, L);
        uint8_t *q = y[i].qs;
        for (int j = 0; j < QK_K; j += 64, q += 32)
            for (int l = 0; l < 32; l++)
                q[l] = (uint8_t)(L[j + l] | L[j + l + 32] << 4);
    }
}

static void quant_q5_k(const float *x, block_q5_K *y, size_t nb)
{
    uint8_t L[QK_K];
    for (size_t i = 0; i < nb; i++, x += QK_K) {
        quant_k_scale_min(x, 5, &y[i].d, &y[i].dmin, y[i].scales, L);
        uint8_t *ql = y[i].qs, m1 = 1, m2 = 2;
        memset(y[i].qh, 0, sizeof y[i].qh);
        for (int n = 0; n < QK_K; n += 64, ql += 32) {
            for (int j = 0; j < 32; j++) {
                const int a = L[n + j], b = L[n + j + 32];
                if (a > 15) y[i].qh[j] |= m1;
                if (b > 15) y[i].qh[j] |= m2;
                ql[j] = (uint8_t)((a & 0xF) | (b & 0xF) << 4);
            }
            m1 = (uint8_t)(m1 << 2);
            m2 = (uint8_t)(m2 << 2);
        }
    }
}

/* 256 2-bit values (any int type, already 0..3) as Q2_K/Q3_K store them: value j + 32 s of
 * each 128-value half in bits 2 s of byte j. */
static void pack2(const uint8_t *L, uint8_t qs[QK_K / 4])
{
    for (int j = 0; j < QK_K; j += 128)
        for (int l = 0; l < 32; l++)
            qs[j / 4 + l] =
                (uint8_t)(L[j + l] | L[j + l + 32] << 2 | L[j + l + 64] << 4 | L[j + l + 96] << 6);
}

static void quant_q2_k(const float *x, block_q2_K *y, size_t nb)
{
    uint8_t L[QK_K];
    float w[16], sc[16], mins[16];
    for (size_t i = 0; i < nb; i++, x += QK_K) {
        float max_sc = 0.0f, max_min = 0.0f;
        for (int j = 0; j < 16; j++) {
            for (int l = 0; l < 16; l++)
                w[l] = fabsf(x[16 * j + l]);
            sc[j] = fit_affine(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], -0.5f, 0.1f, 15, 1);
            if (sc[j] > max_sc) max_sc = sc[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        memset(y[i].scales, 0, sizeof y[i].scales);
        y[i].d = y[i].dmin = pe_f32_to_f16(0.0f);
        if (max_sc > 0) {
            const float is = 15.f / max_sc;
            for (int j = 0; j < 16; j++)
                y[i].scales[j] = (uint8_t)round_int(is * sc[j]);
            y[i].d = pe_f32_to_f16(max_sc / 15.f);
        }
        if (max_min > 0) {
            const float is = 15.f / max_min;
            for (int j = 0; j < 16; j++)
                y[i].scales[j] |= (uint8_t)(round_int(is * mins[j]) << 4);
            y[i].dmin = pe_f32_to_f16(max_min / 15.f);
        }
        for (int j = 0; j < 16; j++) {
            const float d = pe_f16_to_f32(y[i].d) * (y[i].scales[j] & 0xF);
            if (!d) continue;
            const float dm = pe_f16_to_f32(y[i].dmin) * (y[i].scales[j] >> 4);
            for (int l = 0; l < 16; l++)
                L[16 * j + l] = (uint8_t)clamp_int(round_int((x[16 * j + l] + dm) / d), 0, 3);
        }
        pack2(L, y[i].qs);
    }
}

static void quant_q3_k(const float *x, block_q3_K *y, size_t nb)
{
    int8_t L[QK_K];
    uint8_t u[QK_K];
    float sc[16];
    for (size_t i = 0; i < nb; i++, x += QK_K) {
        float amax = 0.0f, max_sc = 0.0f;
        for (int j = 0; j < 16; j++) {
            sc[j] = fit_q3(x + 16 * j, L + 16 * j);
            if (fabsf(sc[j]) > amax) {
                amax = fabsf(sc[j]);
                max_sc = sc[j];
            }
        }
        memset(y[i].scales, 0, sizeof y[i].scales);
        y[i].d = pe_f32_to_f16(0.0f);
        if (max_sc != 0.0f) {
            const float is = -32.f / max_sc;
            for (int j = 0; j < 16; j++) {
                /* 6-bit l: low 4 bits in byte j % 8 (high nibble from j = 8), high 2 bits in
                 * byte 8 + j % 4 at bit 2 (j / 4) */
                const int l = clamp_int((int8_t)round_int(is * sc[j]), -32, 31) + 32;
                if (j < 8)
                    y[i].scales[j] = (uint8_t)(l & 0xF);
                else
                    y[i].scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
                y[i].scales[j % 4 + 8] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
            }
            y[i].d = pe_f32_to_f16(1 / is);
        }
        for (int j = 0; j < 16; j++) {
            int s = j < 8 ? y[i].scales[j] & 0xF : y[i].scales[j - 8] >> 4;
            s = (s | ((y[i].scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4) - 32;
            const float d = pe_f16_to_f32(y[i].d) * s;
            if (!d) continue;
            for (int l = 0; l < 16; l++)
                L[16 * j + l] = (int8_t)(clamp_int(round_int(x[16 * j + l] / d), -4, 3) + 4);
        }
        /* high bit of value j in bit j / 32 of hmask[j % 32]; the low 2 bits as Q2_K */
        memset(y[i].hmask, 0, sizeof y[i].hmask);
        for (int j = 0; j < QK_K; j++) {
            int v = L[j];
            if (v > 3) {
                y[i].hmask[j % 32] |= (uint8_t)(1u << (j / 32));
                v -= 4;
            }
            u[j] = (uint8_t)v;
        }
        pack2(u, y[i].qs);
    }
}

static void quant_q6_k(const float *x, block_q6_K *y, size_t nb)
{
    int8_t L[QK_K];
    float sc[16];
    for (size_t i = 0; i < nb; i++, x += QK_K) {
        float amax = 0.0f, max_sc = 0.0f;
        for (int j = 0; j < 16; j++) {
            sc[j] = fit_sym(16, 32, x + 16 * j, L + 16 * j);
            if (fabsf(sc[j]) > amax) {
                amax = fabsf(sc[j]);
                max_sc = sc[j];
            }
        }
        if (amax < GROUP_EPS) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float is = -128.f / max_sc;
        y[i].d = pe_f32_to_f16(1 / is);
        for (int j = 0; j < 16; j++) {
            const int v = round_int(is * sc[j]);
            y[i].scales[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < 16; j++) {
            const float d = pe_f16_to_f32(y[i].d) * y[i].scales[j];
            if (!d) continue;
            for (int l = 0; l < 16; l++)
                L[16 * j + l] = (int8_t)(clamp_int(round_int(x[16 * j + l] / d), -32, 31) + 32);
        }
        /* each 128-value half: low nibbles of values l and l + 64 in ql[l], of l + 32 and
         * l + 96 in ql[l + 32]; the four high 2-bit pairs in qh[l] */
        uint8_t *ql = y[i].ql, *qh = y[i].qh;
        for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; l++) {
                const int a = L[j + l], b = L[j + l + 32], c = L[j + l + 64], e = L[j + l + 96];
                ql[l] = (uint8_t)((a & 0xF) | (c & 0xF) << 4);
                ql[l + 32] = (uint8_t)((b & 0xF) | (e & 0xF) << 4);
                qh[l] = (uint8_t)(a >> 4 | (b >> 4) << 2 | (c >> 4) << 4 | (e >> 4) << 6);
            }
        }
    }
}

/* ---- entry point ---- */

void pe__quant_ext_row(uint32_t type, const float *x, void *y, size_t n)
{
    switch (type) {
    case PE_GGML_TYPE_Q4_1:
        quant_q4_1(x, y, n / 32);
        break;
    case PE_GGML_TYPE_Q5_0:
        quant_q5_0(x, y, n / 32);
        break;
    case PE_GGML_TYPE_Q5_1:
        quant_q5_1(x, y, n / 32);
        break;
    case PE_GGML_TYPE_IQ4_NL:
        quant_iq4_nl(x, y, n / 32);
        break;
    case PE_GGML_TYPE_Q2_K:
        quant_q2_k(x, y, n / QK_K);
        break;
    case PE_GGML_TYPE_Q3_K:
        quant_q3_k(x, y, n / QK_K);
        break;
    case PE_GGML_TYPE_Q4_K:
        quant_q4_k(x, y, n / QK_K);
        break;
    case PE_GGML_TYPE_Q5_K:
        quant_q5_k(x, y, n / QK_K);
        break;
    case PE_GGML_TYPE_Q6_K:
        quant_q6_k(x, y, n / QK_K);
        break;
    default:
        PE_UNREACHABLE_TYPE(type);
    }
}
