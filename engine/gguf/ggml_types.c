/* SPDX-License-Identifier: MIT */
/*
 * ggml_types.c - the table of ggml tensor types: names, block sizes, bytes per block.
 * The numbers follow ggml's ggml.h; types the engine cannot compute are still listed so
 * that `pagoda inspect` can name them and the loader can refuse them by name.
 */
#include <strings.h>

#include "ggml_types.h"

_Static_assert(sizeof(block_q4_1) == 20 && sizeof(block_q5_0) == 22 && sizeof(block_q5_1) == 24,
               "32-value block sizes");
_Static_assert(sizeof(block_iq4_nl) == 18 && sizeof(block_q8_1) == 36, "32-value block sizes");
_Static_assert(sizeof(block_q2_K) == 84 && sizeof(block_q3_K) == 110 && sizeof(block_q4_K) == 144,
               "K-quant block sizes");
_Static_assert(sizeof(block_q5_K) == 176 && sizeof(block_q6_K) == 210 && sizeof(block_q8_K) == 292,
               "K-quant block sizes");

static const pe_ggml_type_traits traits[PE_GGML_TYPE_COUNT] = {
    [PE_GGML_TYPE_F32] = {"f32", 1, 4, 1},
    [PE_GGML_TYPE_F16] = {"f16", 1, 2, 1},
    [PE_GGML_TYPE_Q4_0] = {"q4_0", 32, 18, 1},
    [PE_GGML_TYPE_Q4_1] = {"q4_1", 32, 20, 1},
    [PE_GGML_TYPE_Q5_0] = {"q5_0", 32, 22, 1},
    [PE_GGML_TYPE_Q5_1] = {"q5_1", 32, 24, 1},
    [PE_GGML_TYPE_Q8_0] = {"q8_0", 32, 34, 1},
    [PE_GGML_TYPE_Q8_1] = {"q8_1", 32, 36, 0},
    [PE_GGML_TYPE_Q2_K] = {"q2_K", 256, 84, 1},
    [PE_GGML_TYPE_Q3_K] = {"q3_K", 256, 110, 1},
    [PE_GGML_TYPE_Q4_K] = {"q4_K", 256, 144, 1},
    [PE_GGML_TYPE_Q5_K] = {"q5_K", 256, 176, 1},
    [PE_GGML_TYPE_Q6_K] = {"q6_K", 256, 210, 1},
    [PE_GGML_TYPE_Q8_K] = {"q8_K", 256, 292, 0},
    [PE_GGML_TYPE_IQ2_XXS] = {"iq2_xxs", 256, 66, 0},
    [PE_GGML_TYPE_IQ2_XS] = {"iq2_xs", 256, 74, 0},
    [PE_GGML_TYPE_IQ3_XXS] = {"iq3_xxs", 256, 98, 0},
    [PE_GGML_TYPE_IQ1_S] = {"iq1_s", 256, 50, 0},
    [PE_GGML_TYPE_IQ4_NL] = {"iq4_nl", 32, 18, 1},
    [PE_GGML_TYPE_IQ3_S] = {"iq3_s", 256, 110, 0},
    [PE_GGML_TYPE_IQ2_S] = {"iq2_s", 256, 82, 0},
    [PE_GGML_TYPE_IQ4_XS] = {"iq4_xs", 256, 136, 0},
    [PE_GGML_TYPE_I8] = {"i8", 1, 1, 0},
    [PE_GGML_TYPE_I16] = {"i16", 1, 2, 0},
    [PE_GGML_TYPE_I32] = {"i32", 1, 4, 0},
    [PE_GGML_TYPE_I64] = {"i64", 1, 8, 0},
    [PE_GGML_TYPE_F64] = {"f64", 1, 8, 0},
    [PE_GGML_TYPE_IQ1_M] = {"iq1_m", 256, 56, 0},
    [PE_GGML_TYPE_BF16] = {"bf16", 1, 2, 1},
    [PE_GGML_TYPE_TQ1_0] = {"tq1_0", 256, 54, 0},
    [PE_GGML_TYPE_TQ2_0] = {"tq2_0", 256, 66, 0},
    [PE_GGML_TYPE_MXFP4] = {"mxfp4", 32, 17, 0},
};

const pe_ggml_type_traits *pe_ggml_get_traits(uint32_t t)
{
    if (t >= PE_GGML_TYPE_COUNT || !traits[t].name) return NULL;
    return &traits[t];
}

const char *pe_ggml_type_name(uint32_t t)
{
    const pe_ggml_type_traits *tr = pe_ggml_get_traits(t);
    return tr ? tr->name : "unknown";
}

int pe_ggml_type_from_name(const char *name, pe_ggml_type *out)
{
    for (uint32_t t = 0; t < PE_GGML_TYPE_COUNT; t++) {
        if (traits[t].name && strcasecmp(traits[t].name, name) == 0) {
            *out = (pe_ggml_type)t;
            return 0;
        }
    }
    return -1;
}

uint64_t pe_ggml_row_size(uint32_t t, uint64_t ne0)
{
    const pe_ggml_type_traits *tr = pe_ggml_get_traits(t);
    if (!tr || ne0 % tr->blck_size) return 0;
    return ne0 / tr->blck_size * tr->type_size;
}
