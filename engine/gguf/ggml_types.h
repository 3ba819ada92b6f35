/* SPDX-License-Identifier: MIT */
/*
 * ggml_types.h - tensor element types as GGUF files number them (ggml's enum), their
 * block sizes and byte sizes, and scalar f16/bf16 conversion. Shared by the GGUF reader,
 * the kernels and the model loader.
 *
 * Block layouts (little-endian, as in ggml):
 *   Q8_0: { f16 d; int8 qs[32]; }            34 bytes per 32 values,  x = d * q
 *   Q4_0: { f16 d; uint8 qs[16]; }           18 bytes per 32 values,  x = d * (q - 8);
 *         value j < 16 is the low nibble of qs[j], value j + 16 the high nibble of qs[j]
 *   Q4_1: { f16 d, m; uint8 qs[16]; }        20 bytes per 32 values,  x = d * q + m
 *   Q5_0: { f16 d; uint8 qh[4]; uint8 qs[16]; }  22 bytes,  x = d * (q - 16), bit 4 of value
 *         j in bit j of the little-endian u32 qh (value j + 16: bit j + 16)
 *   Q5_1: { f16 d, m; uint8 qh[4]; uint8 qs[16]; }  24 bytes,  x = d * q + m
 *   IQ4_NL: { f16 d; uint8 qs[16]; }         18 bytes,  x = d * kvalues_iq4nl[q] (nibbles as Q4_0)
 *   K-quants: 256 values per super-block, sub-blocks of 16 or 32 with their own scales; the
 *   exact unpacking is in ops_ref.c (pe_dequant_row), following ggml-quants.c.
 *   Q2_K 84 bytes, Q3_K 110, Q4_K 144, Q5_K 176, Q6_K 210.
 */
#ifndef PE_GGML_TYPES_H
#define PE_GGML_TYPES_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum pe_ggml_type {
    PE_GGML_TYPE_F32 = 0,
    PE_GGML_TYPE_F16 = 1,
    PE_GGML_TYPE_Q4_0 = 2,
    PE_GGML_TYPE_Q4_1 = 3,
    PE_GGML_TYPE_Q5_0 = 6,
    PE_GGML_TYPE_Q5_1 = 7,
    PE_GGML_TYPE_Q8_0 = 8,
    PE_GGML_TYPE_Q8_1 = 9,
    PE_GGML_TYPE_Q2_K = 10,
    PE_GGML_TYPE_Q3_K = 11,
    PE_GGML_TYPE_Q4_K = 12,
    PE_GGML_TYPE_Q5_K = 13,
    PE_GGML_TYPE_Q6_K = 14,
    PE_GGML_TYPE_Q8_K = 15,
    PE_GGML_TYPE_IQ2_XXS = 16,
    PE_GGML_TYPE_IQ2_XS = 17,
    PE_GGML_TYPE_IQ3_XXS = 18,
    PE_GGML_TYPE_IQ1_S = 19,
    PE_GGML_TYPE_IQ4_NL = 20,
    PE_GGML_TYPE_IQ3_S = 21,
    PE_GGML_TYPE_IQ2_S = 22,
    PE_GGML_TYPE_IQ4_XS = 23,
    PE_GGML_TYPE_I8 = 24,
    PE_GGML_TYPE_I16 = 25,
    PE_GGML_TYPE_I32 = 26,
    PE_GGML_TYPE_I64 = 27,
    PE_GGML_TYPE_F64 = 28,
    PE_GGML_TYPE_IQ1_M = 29,
    PE_GGML_TYPE_BF16 = 30,
    PE_GGML_TYPE_TQ1_0 = 34,
    PE_GGML_TYPE_TQ2_0 = 35,
    PE_GGML_TYPE_MXFP4 = 39,
    PE_GGML_TYPE_COUNT = 40
} pe_ggml_type;

#define QK8_0 32
#define QK4_0 32

typedef struct block_q8_0 {
    uint16_t d; /* f16 scale */
    int8_t qs[QK8_0];
} block_q8_0;

typedef struct block_q4_0 {
    uint16_t d; /* f16 scale */
    uint8_t qs[QK4_0 / 2];
} block_q4_0;

#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK4_NL 32
#define QK_K 256
#define K_SCALE_SIZE 12

typedef struct block_q4_1 {
    uint16_t d, m;
    uint8_t qs[QK4_1 / 2];
} block_q4_1;

typedef struct block_q5_0 {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[QK5_0 / 2];
} block_q5_0;

typedef struct block_q5_1 {
    uint16_t d, m;
    uint8_t qh[4];
    uint8_t qs[QK5_1 / 2];
} block_q5_1;

typedef struct block_iq4_nl {
    uint16_t d;
    uint8_t qs[QK4_NL / 2];
} block_iq4_nl;

typedef struct block_q2_K {
    uint8_t scales[QK_K / 16]; /* low nibble scale, high nibble min, per 16 values */
    uint8_t qs[QK_K / 4];      /* 2-bit values */
    uint16_t d, dmin;
} block_q2_K;

typedef struct block_q3_K {
    uint8_t hmask[QK_K / 8]; /* high bit (set: +0, clear: -4) */
    uint8_t qs[QK_K / 4];    /* low 2 bits */
    uint8_t scales[12];      /* 16 6-bit scales, offset 32 */
    uint16_t d;
} block_q3_K;

typedef struct block_q4_K {
    uint16_t d, dmin;
    uint8_t scales[K_SCALE_SIZE]; /* 8 6-bit scales and 8 6-bit mins */
    uint8_t qs[QK_K / 2];
} block_q4_K;

typedef struct block_q5_K {
    uint16_t d, dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
} block_q5_K;

typedef struct block_q6_K {
    uint8_t ql[QK_K / 2];     /* low 4 bits */
    uint8_t qh[QK_K / 4];     /* high 2 bits */
    int8_t scales[QK_K / 16]; /* per 16 values */
    uint16_t d;
} block_q6_K;

/* Activation blocks of llama.cpp's quantized products (never stored in files). */
typedef struct block_q8_1 {
    uint16_t d, s; /* f16 scale and f16 of d * sum(qs) */
    int8_t qs[32];
} block_q8_1;

typedef struct block_q8_K {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16]; /* sums of each 16 values */
} block_q8_K;

/* Type traits. name is NULL for numbers no ggml type uses. */
typedef struct pe_ggml_type_traits {
    const char *name;
    uint32_t blck_size; /* values per block */
    uint32_t type_size; /* bytes per block */
    int supported;      /* the engine computes with it (F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1
                          IQ4_NL Q2_K..Q6_K) */
} pe_ggml_type_traits;

/* Returns the traits of t, or NULL for an unknown type number. */
const pe_ggml_type_traits *pe_ggml_get_traits(uint32_t t);
/* Returns the type's name ("q8_0") or "unknown". */
const char *pe_ggml_type_name(uint32_t t);
/* Parses a type name (case-insensitive). Returns 0 and sets *out, or -1. */
int pe_ggml_type_from_name(const char *name, pe_ggml_type *out);
/* Bytes of a row of ne0 values; 0 if t is unknown or ne0 is not a multiple of the block. */
uint64_t pe_ggml_row_size(uint32_t t, uint64_t ne0);

/* ---- scalar f16 / bf16 ---- */

static inline float pe_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) {
                man <<= 1;
                exp--;
            }
            man &= 0x3ff;
            bits = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Round to nearest even, with overflow to inf and NaN kept NaN. */
static inline uint16_t pe_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds past 65504 */
    if (ax < 0x38800000u) {                                  /* subnormal or zero in f16 */
        if (ax < 0x33000000u) return (uint16_t)sign;
        uint32_t e = ax >> 23;
        uint32_t m = (ax & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((ax - 0x38000000u) >> 13);
    uint32_t rem = ax & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
    return (uint16_t)(sign | r);
}

static inline float pe_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t pe_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

#endif /* PE_GGML_TYPES_H */
