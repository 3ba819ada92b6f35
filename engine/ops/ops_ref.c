/* SPDX-License-Identifier: MIT */
/*
 * ops_ref.c - the scalar reference of ops.h: the spec every SIMD kernel is tested against
 * (tests/engine/test_ops.c), and the row conversions the loader and the forward pass use
 * (pe_dequant_row for embeddings and norms, pe_quant_row for synthetic models).
 *
 * Quantizers follow ggml's reference code bit for bit (ggml-quants.c):
 *   Q8_0: d = amax / 127, id = d ? 1/d : 0, q = roundf(x * id), d stored as f16.
 *   Q4_0: max = the value of largest |x| (signed, first one wins), d = max / -8,
 *         id = d ? 1/d : 0, q = MIN(15, (int8_t)(x * id + 8.5f)); value j in the low nibble
 *         of qs[j], value j + 16 in the high nibble.
 * pe_matmul_ref quantizes activations to Q8_0 for Q8_0/Q4_0 weights and sums integer block
 * dot products scaled by d_w * d_x in f32, in the order of ggml_vec_dot_q8_0_q8_0 and
 * ggml_vec_dot_q4_0_q8_0. For F32/F16/BF16 weights the activations stay f32 (llama.cpp
 * rounds them to f16/bf16 first; we do not, which is more accurate) and each output is
 * accumulated in double and rounded once, so the spec is the exact product to ~1e-16.
 *
 * The types of issue 15 (Q4_1 Q5_0 Q5_1 IQ4_NL Q2_K..Q6_K, "ext" below): pe_dequant_row
 * equals ggml's dequantize_row_* bit for bit (tests/engine/test_quant_ref.c against the
 * reference set); products quantize the activations to the type's ggml vec_dot_type
 * (Q8_K for the K-quants, Q8_0 for Q5_0/IQ4_NL, Q8_1 for Q4_1/Q5_1) with ggml's reference
 * quantizers and sum exact integer block dots times the scales (pe__vec_dot_ext_ref). These
 * scalar functions are also the kernels pe_matmul runs for those types on every ISA.
 */
#include <math.h>
#include <stdlib.h>

#include "ops.h"
#include "ops_int.h"

/* ---- quantizers (ggml reference) ---- */

void pe__quant_q8_0_ref(const float *x, block_q8_0 *y, size_t n)
{
    for (size_t i = 0; i < n / QK8_0; i++) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) {
            float v = fabsf(x[i * QK8_0 + j]);
            amax = amax > v ? amax : v;
        }
        const float d = amax / ((1 << 7) - 1);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = pe_f32_to_f16(d);
        for (int j = 0; j < QK8_0; j++)
            y[i].qs[j] = (int8_t)roundf(x[i * QK8_0 + j] * id);
    }
}

void pe__quant_q4_0_ref(const float *x, block_q4_0 *y, size_t n)
{
    for (size_t i = 0; i < n / QK4_0; i++) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK4_0; j++) {
            const float v = x[i * QK4_0 + j];
            if (amax < fabsf(v)) {
                amax = fabsf(v);
                max = v;
            }
        }
        const float d = max / -8;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = pe_f32_to_f16(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            const float x0 = x[i * QK4_0 + j] * id;
            const float x1 = x[i * QK4_0 + QK4_0 / 2 + j] * id;
            int q0 = (int8_t)(x0 + 8.5f);
            int q1 = (int8_t)(x1 + 8.5f);
            q0 = q0 < 15 ? q0 : 15;
            q1 = q1 < 15 ? q1 : 15;
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

/* ---- the types of issue 15: dequantization (ggml-quants.c, dequantize_row_*) ---- */

static const int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                         1,    13,   25,  38,  53,  69,  89,  113};

/* The 6-bit scale and min of sub-block j of a Q4_K/Q5_K super-block (get_scale_min_k4). */
static void scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m)
{
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

/* The 16 6-bit scales of a Q3_K super-block, offset 32 removed. */
static void q3_k_scales(const uint8_t *src, int8_t sc[16])
{
    const uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
    uint32_t aux[4];
    memcpy(aux, src, 12);
    const uint32_t tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
    aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
    aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
    aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
    memcpy(sc, aux, 16);
    for (int i = 0; i < 16; i++)
        sc[i] = (int8_t)(sc[i] - 32);
}

/* Integer values of one super-block in value order: Q2_K 0..3, Q3_K -4..3, Q4_K 0..15,
 * Q5_K 0..31, Q6_K -32..31. */
static void unpack_k(uint32_t type, const void *blk, int8_t q[QK_K])
{
    switch (type) {
    case PE_GGML_TYPE_Q2_K:
    case PE_GGML_TYPE_Q3_K: {
        const uint8_t *qs = type == PE_GGML_TYPE_Q2_K ? ((const block_q2_K *)blk)->qs
                                                      : ((const block_q3_K *)blk)->qs;
        const uint8_t *hm = type == PE_GGML_TYPE_Q3_K ? ((const block_q3_K *)blk)->hmask : NULL;
        int8_t *y = q;
        uint8_t m = 1;
        for (int n = 0; n < QK_K; n += 128) {
            for (int shift = 0; shift < 8; shift += 2, m = (uint8_t)(m << 1)) {
                for (int l = 0; l < 32; l++) {
                    int v = (qs[l] >> shift) & 3;
                    if (hm && !(hm[l] & m)) v -= 4;
                    *y++ = (int8_t)v;
                }
            }
            qs += 32;
        }
        break;
    }
    case PE_GGML_TYPE_Q4_K:
    case PE_GGML_TYPE_Q5_K: {
        const int five = type == PE_GGML_TYPE_Q5_K;
        const uint8_t *ql = five ? ((const block_q5_K *)blk)->qs : ((const block_q4_K *)blk)->qs;
        const uint8_t *qh = five ? ((const block_q5_K *)blk)->qh : NULL;
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0; j < QK_K; j += 64) {
            for (int l = 0; l < 32; l++) {
                q[j + l] = (int8_t)((ql[l] & 0xF) + (qh && (qh[l] & u1) ? 16 : 0));
                q[j + 32 + l] = (int8_t)((ql[l] >> 4) + (qh && (qh[l] & u2) ? 16 : 0));
            }
            ql += 32;
            u1 = (uint8_t)(u1 << 2);
            u2 = (uint8_t)(u2 << 2);
        }
        break;
    }
    case PE_GGML_TYPE_Q6_K: {
        const block_q6_K *b = blk;
        const uint8_t *ql = b->ql, *qh = b->qh;
        for (int n = 0; n < QK_K; n += 128) {
            for (int l = 0; l < 32; l++) {
                q[n + l] = (int8_t)(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
                q[n + l + 32] = (int8_t)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
                q[n + l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                q[n + l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
            }
            ql += 64;
            qh += 32;
        }
        break;
    }
    default:
        PE_UNREACHABLE_TYPE(type);
    }
}

/* Integer values of one 32-value block (Q4_1 0..15, Q5_0 -16..15, Q5_1 0..31, IQ4_NL the
 * table's values) in value order. */
static void unpack_32(uint32_t type, const void *blk, int8_t q[32])
{
    const uint8_t *qs;
    uint32_t qh = 0;
    int off = 0;
    switch (type) {
    case PE_GGML_TYPE_Q4_1:
        qs = ((const block_q4_1 *)blk)->qs;
        break;
    case PE_GGML_TYPE_Q5_0:
        qs = ((const block_q5_0 *)blk)->qs;
        memcpy(&qh, ((const block_q5_0 *)blk)->qh, 4);
        off = 16;
        break;
    case PE_GGML_TYPE_Q5_1:
        qs = ((const block_q5_1 *)blk)->qs;
        memcpy(&qh, ((const block_q5_1 *)blk)->qh, 4);
        break;
    case PE_GGML_TYPE_IQ4_NL:
        qs = ((const block_iq4_nl *)blk)->qs;
        for (int j = 0; j < 16; j++) {
            q[j] = kvalues_iq4nl[qs[j] & 0xF];
            q[j + 16] = kvalues_iq4nl[qs[j] >> 4];
        }
        return;
    default:
        PE_UNREACHABLE_TYPE(type);
    }
    for (int j = 0; j < 16; j++) {
        const int h0 = (int)((qh >> j) << 4) & 0x10;
        const int h1 = (int)(qh >> (j + 12)) & 0x10;
        q[j] = (int8_t)(((qs[j] & 0x0F) | h0) - off);
        q[j + 16] = (int8_t)(((qs[j] >> 4) | h1) - off);
    }
}

int pe__type_is_ext(uint32_t type)
{
    switch (type) {
    case PE_GGML_TYPE_Q4_1:
    case PE_GGML_TYPE_Q5_0:
    case PE_GGML_TYPE_Q5_1:
    case PE_GGML_TYPE_IQ4_NL:
    case PE_GGML_TYPE_Q2_K:
    case PE_GGML_TYPE_Q3_K:
    case PE_GGML_TYPE_Q4_K:
    case PE_GGML_TYPE_Q5_K:
    case PE_GGML_TYPE_Q6_K:
        return 1;
    default:
        return 0;
    }
}

/* One block of an extended type to f32, with ggml's expressions (the same products in the
 * same order, so the bits are ggml's). */
static void dequant_ext_block(uint32_t type, const void *blk, float *y)
{
    int8_t q[QK_K];
    switch (type) {
    case PE_GGML_TYPE_Q4_1:
    case PE_GGML_TYPE_Q5_1: {
        const uint16_t *dm = blk; /* d, m lead both blocks */
        const float d = pe_f16_to_f32(dm[0]), m = pe_f16_to_f32(dm[1]);
        unpack_32(type, blk, q);
        for (int j = 0; j < 32; j++) {
            const float p = (float)q[j] * d; /* kept apart from + m: no contraction */
            y[j] = p + m;
        }
        break;
    }
    case PE_GGML_TYPE_Q5_0:
    case PE_GGML_TYPE_IQ4_NL: {
        const float d = pe_f16_to_f32(*(const uint16_t *)blk);
        unpack_32(type, blk, q);
        for (int j = 0; j < 32; j++)
            y[j] = (float)q[j] * d;
        break;
    }
    case PE_GGML_TYPE_Q2_K: {
        const block_q2_K *b = blk;
        const float d = pe_f16_to_f32(b->d), min = pe_f16_to_f32(b->dmin);
        unpack_k(type, blk, q);
        for (int k = 0; k < 16; k++) {
            const float dl = d * (float)(b->scales[k] & 0xF), ml = min * (float)(b->scales[k] >> 4);
            for (int l = 0; l < 16; l++) {
                const float p = dl * (float)q[k * 16 + l];
                y[k * 16 + l] = p - ml;
            }
        }
        break;
    }
    case PE_GGML_TYPE_Q3_K: {
        const block_q3_K *b = blk;
        const float d = pe_f16_to_f32(b->d);
        int8_t sc[16];
        q3_k_scales(b->scales, sc);
        unpack_k(type, blk, q);
        for (int k = 0; k < 16; k++) {
            const float dl = d * (float)sc[k];
            for (int l = 0; l < 16; l++)
                y[k * 16 + l] = dl * (float)q[k * 16 + l];
        }
        break;
    }
    case PE_GGML_TYPE_Q4_K:
    case PE_GGML_TYPE_Q5_K: {
        const block_q4_K *b4 = blk;
        const block_q5_K *b5 = blk;
        const int five = type == PE_GGML_TYPE_Q5_K;
        const float d = pe_f16_to_f32(five ? b5->d : b4->d);
        const float min = pe_f16_to_f32(five ? b5->dmin : b4->dmin);
        const uint8_t *scales = five ? b5->scales : b4->scales;
        unpack_k(type, blk, q);
        for (int k = 0; k < 8; k++) {
            uint8_t sc, m;
            scale_min_k4(k, scales, &sc, &m);
            const float dl = d * (float)sc, ml = min * (float)m;
            for (int l = 0; l < 32; l++) {
                const float p = dl * (float)q[k * 32 + l];
                y[k * 32 + l] = p - ml;
            }
        }
        break;
    }
    case PE_GGML_TYPE_Q6_K: {
        const block_q6_K *b = blk;
        const float d = pe_f16_to_f32(b->d);
        unpack_k(type, blk, q);
        for (int k = 0; k < 16; k++)
            for (int l = 0; l < 16; l++)
                y[k * 16 + l] = d * (float)b->scales[k] * (float)q[k * 16 + l];
        break;
    }
    default:
        PE_UNREACHABLE_TYPE(type);
    }
}

/* ---- activation quantizers of the extended types (quantize_row_q8_1_ref, _q8_K_ref) ---- */

uint32_t pe__vec_dot_type(uint32_t type)
{
    switch (type) {
    case PE_GGML_TYPE_Q4_1:
    case PE_GGML_TYPE_Q5_1:
        return PE_GGML_TYPE_Q8_1;
    case PE_GGML_TYPE_Q5_0:
    case PE_GGML_TYPE_IQ4_NL:
        return PE_GGML_TYPE_Q8_0;
    default:
        return PE_GGML_TYPE_Q8_K;
    }
}

void pe__quant_q8_1_ref(const float *x, block_q8_1 *y, size_t n)
{
    for (size_t i = 0; i < n / 32; i++) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) {
            const float v = fabsf(x[i * 32 + j]);
            amax = amax > v ? amax : v;
        }
        const float d = amax / ((1 << 7) - 1);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = pe_f32_to_f16(d);
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            y[i].qs[j] = (int8_t)roundf(x[i * 32 + j] * id);
            sum += y[i].qs[j];
        }
        y[i].s = pe_f32_to_f16((float)sum * d);
    }
}

/* ggml's nearest_int: round to nearest even through the 1.5 * 2^23 trick (|v| < 2^22). */
static int nearest_int(float fval)
{
    const float val = fval + 12582912.f;
    int i;
    memcpy(&i, &val, sizeof(int));
    return (i & 0x007fffff) - 0x00400000;
}

void pe__quant_q8_k_ref(const float *x, block_q8_K *y, size_t n)
{
    for (size_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float max = 0.0f, amax = 0.0f;
        for (int j = 0; j < QK_K; j++) {
            const float ax = fabsf(x[j]);
            if (ax > amax) {
                amax = ax;
                max = x[j];
            }
        }
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < QK_K; j++) {
            const int v = nearest_int(iscale * x[j]);
            y[i].qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            int sum = 0;
            for (int k = 0; k < 16; k++)
                sum += y[i].qs[j * 16 + k];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}

size_t pe__act_row_bytes(uint32_t type, size_t n)
{
    switch (pe__vec_dot_type(type)) {
    case PE_GGML_TYPE_Q8_1:
        return n / 32 * sizeof(block_q8_1);
    case PE_GGML_TYPE_Q8_0:
        return n / 32 * sizeof(block_q8_0);
    default:
        return n / QK_K * sizeof(block_q8_K);
    }
}

void pe__quant_act_ref(uint32_t type, const float *x, void *y, size_t n)
{
    switch (pe__vec_dot_type(type)) {
    case PE_GGML_TYPE_Q8_1:
        pe__quant_q8_1_ref(x, y, n);
        break;
    case PE_GGML_TYPE_Q8_0:
        pe__quant_q8_0_ref(x, y, n);
        break;
    default:
        pe__quant_q8_k_ref(x, y, n);
        break;
    }
}

/* ---- dot products of the extended types with their activations ----
 * Each block's integer sums are exact; they are scaled as ggml_vec_dot_<type>_q8_<x> does:
 *   Q4_1/Q5_1: sumf += (d_w * d_x) * sumi + m_w * s_x
 *   Q5_0/IQ4_NL: sumf += (d_w * d_x) * sumi
 *   Q2_K/Q4_K/Q5_K: sumf += (d_x * d_w) * sum(scale_k * dot_k) - (d_x * dmin_w) * sum(min_k *
 * bsum_k) Q3_K/Q6_K: sumf += (d_x * d_w) * sum(scale_k * dot_k) in one f32 accumulator over the
 * blocks. */
float pe__vec_dot_ext_ref(uint32_t type, const void *w, const void *xq, size_t n)
{
    int8_t q[QK_K];
    float sumf = 0.0f;
    switch (type) {
    case PE_GGML_TYPE_Q4_1:
    case PE_GGML_TYPE_Q5_1: {
        const size_t bs = type == PE_GGML_TYPE_Q4_1 ? sizeof(block_q4_1) : sizeof(block_q5_1);
        const block_q8_1 *x = xq;
        for (size_t ib = 0; ib < n / 32; ib++) {
            const uint8_t *blk = (const uint8_t *)w + ib * bs;
            uint16_t dm[2];
            memcpy(dm, blk, sizeof dm);
            unpack_32(type, blk, q);
            int sumi = 0;
            for (int j = 0; j < 32; j++)
                sumi += q[j] * x[ib].qs[j];
            sumf += (pe_f16_to_f32(dm[0]) * pe_f16_to_f32(x[ib].d)) * (float)sumi +
                    pe_f16_to_f32(dm[1]) * pe_f16_to_f32(x[ib].s);
        }
        return sumf;
    }
    case PE_GGML_TYPE_Q5_0:
    case PE_GGML_TYPE_IQ4_NL: {
        const size_t bs = type == PE_GGML_TYPE_Q5_0 ? sizeof(block_q5_0) : sizeof(block_iq4_nl);
        const block_q8_0 *x = xq;
        for (size_t ib = 0; ib < n / 32; ib++) {
            const uint8_t *blk = (const uint8_t *)w + ib * bs;
            uint16_t d;
            memcpy(&d, blk, sizeof d);
            unpack_32(type, blk, q);
            int sumi = 0;
            for (int j = 0; j < 32; j++)
                sumi += q[j] * x[ib].qs[j];
            sumf += (pe_f16_to_f32(d) * pe_f16_to_f32(x[ib].d)) * (float)sumi;
        }
        return sumf;
    }
    default:
        break;
    }
    const block_q8_K *x = xq;
    const size_t bs = pe_ggml_get_traits(type)->type_size;
    for (size_t ib = 0; ib < n / QK_K; ib++) {
        const uint8_t *blk = (const uint8_t *)w + ib * bs;
        unpack_k(type, blk, q);
        const int8_t *q8 = x[ib].qs;
        int sumi = 0, summ = 0;
        float d = 0.0f, dmin = 0.0f;
        if (type == PE_GGML_TYPE_Q4_K || type == PE_GGML_TYPE_Q5_K) {
            const block_q4_K *b4 = (const block_q4_K *)blk;
            const block_q5_K *b5 = (const block_q5_K *)blk;
            const int five = type == PE_GGML_TYPE_Q5_K;
            const uint8_t *scales = five ? b5->scales : b4->scales;
            d = pe_f16_to_f32(five ? b5->d : b4->d);
            dmin = pe_f16_to_f32(five ? b5->dmin : b4->dmin);
            for (int k = 0; k < 8; k++) {
                uint8_t sc, m;
                scale_min_k4(k, scales, &sc, &m);
                int dot = 0;
                for (int l = 0; l < 32; l++)
                    dot += q[k * 32 + l] * q8[k * 32 + l];
                sumi += sc * dot;
                summ += m * (x[ib].bsums[2 * k] + x[ib].bsums[2 * k + 1]);
            }
        } else {
            int sc[16];
            if (type == PE_GGML_TYPE_Q2_K) {
                const block_q2_K *b = (const block_q2_K *)blk;
                d = pe_f16_to_f32(b->d);
                dmin = pe_f16_to_f32(b->dmin);
                for (int k = 0; k < 16; k++) {
                    sc[k] = b->scales[k] & 0xF;
                    summ += (b->scales[k] >> 4) * x[ib].bsums[k];
                }
            } else if (type == PE_GGML_TYPE_Q3_K) {
                const block_q3_K *b = (const block_q3_K *)blk;
                int8_t s8[16];
                d = pe_f16_to_f32(b->d);
                q3_k_scales(b->scales, s8);
                for (int k = 0; k < 16; k++)
                    sc[k] = s8[k];
            } else {
                const block_q6_K *b = (const block_q6_K *)blk;
                d = pe_f16_to_f32(b->d);
                for (int k = 0; k < 16; k++)
                    sc[k] = b->scales[k];
            }
            for (int k = 0; k < 16; k++) {
                int dot = 0;
                for (int l = 0; l < 16; l++)
                    dot += q[k * 16 + l] * q8[k * 16 + l];
                sumi += sc[k] * dot;
            }
        }
        sumf += (x[ib].d * d) * (float)sumi;
        sumf -= (x[ib].d * dmin) * (float)summ; /* 0 for Q3_K, Q6_K */
    }
    return sumf;
}

/* ---- row conversion ---- */

void pe_quant_row(uint32_t type, const float *src, void *dst, size_t n)
{
    switch (type) {
    case PE_GGML_TYPE_F32:
        memcpy(dst, src, n * sizeof(float));
        break;
    case PE_GGML_TYPE_F16:
        for (size_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = pe_f32_to_f16(src[i]);
        break;
    case PE_GGML_TYPE_BF16:
        for (size_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = pe_f32_to_bf16(src[i]);
        break;
    case PE_GGML_TYPE_Q8_0:
        pe__quant_q8_0_ref(src, dst, n);
        break;
    case PE_GGML_TYPE_Q4_0:
        pe__quant_q4_0_ref(src, dst, n);
        break;
    default:
        if (!pe__type_is_ext(type)) PE_UNREACHABLE_TYPE(type);
        pe__quant_ext_row(type, src, dst, n); /* quantize.c */
    }
}

void pe_dequant_row(uint32_t type, const void *src, float *dst, size_t n)
{
    switch (type) {
    case PE_GGML_TYPE_F32:
        memcpy(dst, src, n * sizeof(float));
        break;
    case PE_GGML_TYPE_F16:
        for (size_t i = 0; i < n; i++)
            dst[i] = pe_f16_to_f32(((const uint16_t *)src)[i]);
        break;
    case PE_GGML_TYPE_BF16:
        for (size_t i = 0; i < n; i++)
            dst[i] = pe_bf16_to_f32(((const uint16_t *)src)[i]);
        break;
    case PE_GGML_TYPE_Q8_0:
        for (size_t i = 0; i < n / QK8_0; i++) {
            const block_q8_0 *b = (const block_q8_0 *)src + i;
            const float d = pe_f16_to_f32(b->d);
            for (int j = 0; j < QK8_0; j++)
                dst[i * QK8_0 + j] = d * (float)b->qs[j];
        }
        break;
    case PE_GGML_TYPE_Q4_0:
        for (size_t i = 0; i < n / QK4_0; i++) {
            const block_q4_0 *b = (const block_q4_0 *)src + i;
            const float d = pe_f16_to_f32(b->d);
            for (int j = 0; j < QK4_0 / 2; j++) {
                dst[i * QK4_0 + j] = d * (float)((b->qs[j] & 0x0f) - 8);
                dst[i * QK4_0 + QK4_0 / 2 + j] = d * (float)((b->qs[j] >> 4) - 8);
            }
        }
        break;
    default: {
        if (!pe__type_is_ext(type)) PE_UNREACHABLE_TYPE(type);
        const pe_ggml_type_traits *tr = pe_ggml_get_traits(type);
        for (size_t i = 0; i < n / tr->blck_size; i++)
            dequant_ext_block(type, (const uint8_t *)src + i * tr->type_size,
                              dst + i * tr->blck_size);
    }
    }
}

/* ---- dot products (ggml reference order) ---- */

float pe__dot_q8_0_q8_0_ref(const block_q8_0 *w, const block_q8_0 *x, size_t nb)
{
    float sumf = 0.0f;
    for (size_t ib = 0; ib < nb; ib++) {
        int sumi = 0;
        for (int j = 0; j < QK8_0; j++)
            sumi += w[ib].qs[j] * x[ib].qs[j];
        sumf += (float)sumi * (pe_f16_to_f32(w[ib].d) * pe_f16_to_f32(x[ib].d));
    }
    return sumf;
}

float pe__dot_q4_0_q8_0_ref(const block_q4_0 *w, const block_q8_0 *x, size_t nb)
{
    float sumf = 0.0f;
    for (size_t ib = 0; ib < nb; ib++) {
        int sumi0 = 0, sumi1 = 0;
        for (int j = 0; j < QK4_0 / 2; j++) {
            const int v0 = (w[ib].qs[j] & 0x0f) - 8;
            const int v1 = (w[ib].qs[j] >> 4) - 8;
            sumi0 += v0 * x[ib].qs[j];
            sumi1 += v1 * x[ib].qs[j + QK4_0 / 2];
        }
        int sumi = sumi0 + sumi1;
        sumf += (float)sumi * pe_f16_to_f32(w[ib].d) * pe_f16_to_f32(x[ib].d);
    }
    return sumf;
}

static float dot_float_ref(uint32_t type, const void *w, const float *x, uint32_t n)
{
    double s = 0.0;
    for (uint32_t i = 0; i < n; i++) {
        float wi;
        if (type == PE_GGML_TYPE_F32)
            wi = ((const float *)w)[i];
        else if (type == PE_GGML_TYPE_F16)
            wi = pe_f16_to_f32(((const uint16_t *)w)[i]);
        else
            wi = pe_bf16_to_f32(((const uint16_t *)w)[i]);
        s += (double)wi * (double)x[i];
    }
    return (float)s;
}

void pe_matmul_ref(const pe_mat *w, const float *x, uint32_t n_tok, float *y)
{
    const uint32_t n_in = w->n_in;
    if (pe__type_is_ext(w->type)) {
        const size_t ab = pe__act_row_bytes(w->type, n_in);
        uint8_t *qa = malloc((size_t)n_tok * ab + 1);
        PE_CHECK_ALLOC(qa);
        for (uint32_t t = 0; t < n_tok; t++)
            pe__quant_act_ref(w->type, x + (size_t)t * n_in, qa + (size_t)t * ab, n_in);
        for (uint32_t t = 0; t < n_tok; t++)
            for (uint32_t o = 0; o < w->n_out; o++)
                y[(size_t)t * w->n_out + o] = pe__vec_dot_ext_ref(
                    w->type, (const uint8_t *)w->data + (size_t)o * w->row_bytes,
                    qa + (size_t)t * ab, n_in);
        free(qa);
        return;
    }
    block_q8_0 *qx = NULL;
    if (w->type == PE_GGML_TYPE_Q8_0 || w->type == PE_GGML_TYPE_Q4_0) {
        qx = malloc((size_t)n_tok * (n_in / QK8_0) * sizeof *qx + 1);
        PE_CHECK_ALLOC(qx);
        for (uint32_t t = 0; t < n_tok; t++)
            pe__quant_q8_0_ref(x + (size_t)t * n_in, qx + (size_t)t * (n_in / QK8_0), n_in);
    }
    for (uint32_t t = 0; t < n_tok; t++) {
        for (uint32_t o = 0; o < w->n_out; o++) {
            const void *row = (const uint8_t *)w->data + (size_t)o * w->row_bytes;
            const block_q8_0 *xq = qx ? qx + (size_t)t * (n_in / QK8_0) : NULL;
            float v;
            if (w->type == PE_GGML_TYPE_Q8_0)
                v = pe__dot_q8_0_q8_0_ref(row, xq, n_in / QK8_0);
            else if (w->type == PE_GGML_TYPE_Q4_0)
                v = pe__dot_q4_0_q8_0_ref(row, xq, n_in / QK4_0);
            else
                v = dot_float_ref(w->type, row, x + (size_t)t * n_in, n_in);
            y[(size_t)t * w->n_out + o] = v;
        }
    }
    free(qx);
}
