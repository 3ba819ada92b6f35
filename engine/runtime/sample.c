/* SPDX-License-Identifier: MIT */
/*
 * sample.c - the sampling chain of sample.h. Candidates are selected with a min-heap of
 * top_k entries (O(n log k)); without top-k every candidate is sorted (O(n log n)).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sample.h"

struct pe_sampler {
    pe_sampler_params p;
    uint32_t n_vocab;
    uint64_t rng;
    int32_t *recent; /* ring of the last repeat_last_n tokens */
    uint32_t n_recent, head;
    uint32_t *idx; /* [n_vocab] candidate ids */
};

pe_sampler_params pe_sampler_default_params(void)
{
    pe_sampler_params p = {0.8f, 40, 0.95f, 0.05f, 1.0f, 64, 0xC0FFEE};
    return p;
}

pe_sampler *pe_sampler_create(const pe_sampler_params *p, uint32_t n_vocab)
{
    if (!p || n_vocab == 0 || p->repeat_last_n < 0 || p->repeat_penalty <= 0 || isnan(p->temp) ||
        isnan(p->top_p) || isnan(p->min_p))
        return NULL;
    pe_sampler *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->p = *p;
    s->n_vocab = n_vocab;
    s->rng = p->seed ? p->seed : 0x9E3779B97F4A7C15ull;
    s->recent = malloc(((size_t)p->repeat_last_n + 1) * sizeof *s->recent);
    s->idx = malloc((size_t)n_vocab * sizeof *s->idx);
    if (!s->recent || !s->idx) {
        pe_sampler_destroy(s);
        return NULL;
    }
    return s;
}

void pe_sampler_destroy(pe_sampler *s)
{
    if (!s) return;
    free(s->recent);
    free(s->idx);
    free(s);
}

void pe_sampler_accept(pe_sampler *s, int32_t tok)
{
    uint32_t cap = (uint32_t)s->p.repeat_last_n;
    if (!cap) return;
    s->recent[s->head] = tok;
    s->head = (s->head + 1) % cap;
    if (s->n_recent < cap) s->n_recent++;
}

static uint64_t next_u64(uint64_t *x)
{
    /* splitmix64: tiny, well distributed, reproducible across platforms */
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Returns non-zero if candidate a ranks below b (smaller logit; ties: larger id). */
static int below(const float *l, uint32_t a, uint32_t b)
{
    return l[a] < l[b] || (l[a] == l[b] && a > b);
}

static void sift(const float *l, uint32_t *h, uint32_t n, uint32_t i)
{
    for (;;) {
        uint32_t m = i, c = 2 * i + 1;
        if (c < n && below(l, h[c], h[m])) m = c;
        if (c + 1 < n && below(l, h[c + 1], h[m])) m = c + 1;
        if (m == i) return;
        uint32_t t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* Puts the k best candidates in idx[0..k), best first: a min-heap of k, O(n log k). */
static void top_k_sorted(const float *l, uint32_t *idx, uint32_t n, uint32_t k)
{
    for (uint32_t i = 0; i < k; i++)
        idx[i] = i;
    for (uint32_t i = k / 2; i-- > 0;)
        sift(l, idx, k, i);
    for (uint32_t i = k; i < n; i++) {
        if (below(l, idx[0], i)) {
            idx[0] = i;
            sift(l, idx, k, 0);
        }
    }
    for (uint32_t m = k; m > 1; m--) { /* heap sort: the smallest goes to the end */
        uint32_t t = idx[0];
        idx[0] = idx[m - 1];
        idx[m - 1] = t;
        sift(l, idx, m - 1, 0);
    }
}

int32_t pe_sampler_sample(pe_sampler *s, float *logits)
{
    const uint32_t n = s->n_vocab;
    if (s->p.repeat_penalty != 1.0f) {
        for (uint32_t i = 0; i < s->n_recent; i++) {
            int32_t t = s->recent[i];
            if (t < 0 || (uint32_t)t >= n) continue;
            /* each distinct token penalised once, as llama.cpp does */
            int seen = 0;
            for (uint32_t j = 0; j < i; j++)
                seen |= s->recent[j] == t;
            if (seen) continue;
            logits[t] =
                logits[t] > 0 ? logits[t] / s->p.repeat_penalty : logits[t] * s->p.repeat_penalty;
        }
    }
    if (s->p.temp <= 0) {
        uint32_t best = 0;
        for (uint32_t i = 1; i < n; i++)
            if (logits[i] > logits[best]) best = i;
        return (int32_t)best;
    }
    uint32_t k = s->p.top_k > 0 && (uint32_t)s->p.top_k < n ? (uint32_t)s->p.top_k : n;
    top_k_sorted(logits, s->idx, n, k);
    /* softmax over the candidates at temperature 1 for top-p/min-p (llama.cpp order) */
    float maxl = logits[s->idx[0]];
    double sum = 0;
    float *p = malloc((size_t)k * sizeof *p);
    if (!p) return (int32_t)s->idx[0];
    for (uint32_t i = 0; i < k; i++) {
        p[i] = expf(logits[s->idx[i]] - maxl);
        sum += p[i];
    }
    uint32_t keep = k;
    if (s->p.top_p < 1.0f) {
        double cum = 0;
        for (uint32_t i = 0; i < k; i++) {
            cum += p[i] / sum;
            if (cum >= s->p.top_p) {
                keep = i + 1;
                break;
            }
        }
    }
    if (s->p.min_p > 0) {
        uint32_t j = 1;
        while (j < keep && p[j] >= s->p.min_p * p[0])
            j++;
        keep = j;
    }
    /* temperature, then draw */
    double tsum = 0;
    for (uint32_t i = 0; i < keep; i++) {
        p[i] = expf((logits[s->idx[i]] - maxl) / s->p.temp);
        tsum += p[i];
    }
    double r = (double)(next_u64(&s->rng) >> 11) * (1.0 / 9007199254740992.0) * tsum;
    uint32_t pick = keep - 1;
    for (uint32_t i = 0; i < keep; i++) {
        r -= p[i];
        if (r < 0) {
            pick = i;
            break;
        }
    }
    int32_t tok = (int32_t)s->idx[pick];
    free(p);
    return tok;
}
