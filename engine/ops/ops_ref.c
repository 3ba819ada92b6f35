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
        PE_UNREACHABLE_TYPE(type);
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
    default:
        PE_UNREACHABLE_TYPE(type);
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
