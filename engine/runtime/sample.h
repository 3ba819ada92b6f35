/* SPDX-License-Identifier: MIT */
/*
 * sample.h - token sampling: greedy, temperature, top-k, top-p, min-p and repetition
 * penalty, with a seeded RNG so a run is reproducible.
 *
 * Order (llama.cpp's default chain): repetition penalty -> top-k -> top-p -> min-p ->
 * temperature -> draw. temperature <= 0 is greedy (argmax after the penalty).
 */
#ifndef PE_SAMPLE_H
#define PE_SAMPLE_H

#include <stdint.h>

typedef struct pe_sampler_params {
    float temp;            /* <= 0: greedy; default 0.8 */
    int32_t top_k;         /* <= 0: off; default 40 */
    float top_p;           /* >= 1: off; default 0.95 */
    float min_p;           /* <= 0: off; default 0.05 */
    float repeat_penalty;  /* 1: off; default 1.0 */
    int32_t repeat_last_n; /* tokens the penalty looks back over; default 64 */
    uint64_t seed;         /* default 0xC0FFEE */
} pe_sampler_params;

typedef struct pe_sampler pe_sampler;

pe_sampler_params pe_sampler_default_params(void);
/* Returns NULL on bad parameters or no memory. */
pe_sampler *pe_sampler_create(const pe_sampler_params *p, uint32_t n_vocab);
void pe_sampler_destroy(pe_sampler *s);
/* Picks a token from logits[n_vocab] (the array is modified). */
int32_t pe_sampler_sample(pe_sampler *s, float *logits);
/* Records a token (prompt or generated) for the repetition penalty. */
void pe_sampler_accept(pe_sampler *s, int32_t tok);

#endif /* PE_SAMPLE_H */
