/* SPDX-License-Identifier: MIT */
/*
 * test_sample.c - the sampling chain: greedy is argmax, a seed reproduces a run, top-k 1
 * and a tiny top-p are greedy, min-p drops the unlikely tail, the repetition penalty
 * demotes seen tokens, and at temperature 1 the draw follows softmax (loose chi-square).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sample.h"
#include "t.h"

#define V 100

static void fill(float *l, uint64_t seed)
{
    for (int i = 0; i < V; i++)
        l[i] = (float)(t_rand(&seed) % 1000) / 100.0f;
}

static int argmax(const float *l)
{
    int b = 0;
    for (int i = 1; i < V; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

static int test_greedy(void)
{
    float l[V], c[V];
    pe_sampler_params p = pe_sampler_default_params();
    p.temp = 0;
    pe_sampler *s = pe_sampler_create(&p, V);
    T_ASSERT(s);
    for (uint64_t k = 1; k < 50; k++) {
        fill(l, k);
        memcpy(c, l, sizeof l);
        T_EQ(pe_sampler_sample(s, c), argmax(l));
    }
    pe_sampler_destroy(s);
    return 0;
}

static int test_seed_reproduces(void)
{
    float l[V], c[V];
    int32_t a[64], b[64];
    pe_sampler_params p = pe_sampler_default_params();
    p.temp = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0;
    for (int run = 0; run < 2; run++) {
        pe_sampler *s = pe_sampler_create(&p, V);
        T_ASSERT(s);
        for (int i = 0; i < 64; i++) {
            fill(l, 5);
            memcpy(c, l, sizeof l);
            (run ? b : a)[i] = pe_sampler_sample(s, c);
        }
        pe_sampler_destroy(s);
    }
    T_ASSERT(memcmp(a, b, sizeof a) == 0);
    int distinct = 0;
    for (int i = 1; i < 64; i++)
        distinct |= a[i] != a[0];
    T_ASSERT(distinct); /* temperature 1 over near-flat logits does vary */
    return 0;
}

static int test_topk1_and_tiny_topp_are_greedy(void)
{
    float l[V], c[V];
    pe_sampler_params p = pe_sampler_default_params();
    p.temp = 1.5f;
    p.top_k = 1;
    pe_sampler *s = pe_sampler_create(&p, V);
    p.top_k = 0;
    p.top_p = 1e-6f;
    pe_sampler *s2 = pe_sampler_create(&p, V);
    T_ASSERT(s && s2);
    for (uint64_t k = 1; k < 30; k++) {
        fill(l, k);
        memcpy(c, l, sizeof l);
        T_EQ(pe_sampler_sample(s, c), argmax(l));
        memcpy(c, l, sizeof l);
        T_EQ(pe_sampler_sample(s2, c), argmax(l));
    }
    pe_sampler_destroy(s);
    pe_sampler_destroy(s2);
    return 0;
}

static int test_min_p_drops_tail(void)
{
    float l[V], c[V];
    for (int i = 0; i < V; i++)
        l[i] = -20.0f;
    l[3] = 5.0f;
    l[7] = 4.9f; /* p ratio exp(-0.1) ~ 0.9: kept */
    pe_sampler_params p = pe_sampler_default_params();
    p.temp = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.5f;
    pe_sampler *s = pe_sampler_create(&p, V);
    T_ASSERT(s);
    int seen3 = 0, seen7 = 0;
    for (int i = 0; i < 400; i++) {
        memcpy(c, l, sizeof l);
        int32_t t = pe_sampler_sample(s, c);
        T_ASSERT(t == 3 || t == 7);
        seen3 += t == 3;
        seen7 += t == 7;
    }
    T_ASSERT(seen3 > 100 && seen7 > 100);
    pe_sampler_destroy(s);
    return 0;
}

static int test_repeat_penalty(void)
{
    float l[V], c[V];
    for (int i = 0; i < V; i++)
        l[i] = 0;
    l[10] = 2.0f;
    l[11] = 1.5f;
    pe_sampler_params p = pe_sampler_default_params();
    p.temp = 0;
    p.repeat_penalty = 2.0f;
    pe_sampler *s = pe_sampler_create(&p, V);
    T_ASSERT(s);
    memcpy(c, l, sizeof l);
    T_EQ(pe_sampler_sample(s, c), 10);
    pe_sampler_accept(s, 10);
    memcpy(c, l, sizeof l);
    T_EQ(pe_sampler_sample(s, c), 11); /* 2.0 / 2 = 1.0 < 1.5 */
    pe_sampler_destroy(s);
    return 0;
}

static int test_follows_softmax(void)
{
    float l[4] = {0.0f, 1.0f, 2.0f, 0.5f}, c[4];
    pe_sampler_params p = pe_sampler_default_params();
    p.temp = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0;
    pe_sampler *s = pe_sampler_create(&p, 4);
    T_ASSERT(s);
    int cnt[4] = {0};
    const int N = 20000;
    for (int i = 0; i < N; i++) {
        memcpy(c, l, sizeof l);
        cnt[pe_sampler_sample(s, c)]++;
    }
    double z = 0, e[4], chi = 0;
    for (int i = 0; i < 4; i++)
        z += exp(l[i]);
    for (int i = 0; i < 4; i++) {
        e[i] = N * exp(l[i]) / z;
        chi += (cnt[i] - e[i]) * (cnt[i] - e[i]) / e[i];
    }
    if (chi > 30) T_FAIL("chi-square %.1f over 3 degrees of freedom", chi);
    pe_sampler_destroy(s);
    return 0;
}

static int test_bad_params(void)
{
    pe_sampler_params p = pe_sampler_default_params();
    p.repeat_penalty = 0;
    T_ASSERT(pe_sampler_create(&p, V) == NULL);
    p = pe_sampler_default_params();
    T_ASSERT(pe_sampler_create(&p, 0) == NULL);
    p.temp = NAN;
    T_ASSERT(pe_sampler_create(&p, V) == NULL);
    return 0;
}

int main(void)
{
    T_RUN(test_greedy);
    T_RUN(test_seed_reproduces);
    T_RUN(test_topk1_and_tiny_topp_are_greedy);
    T_RUN(test_min_p_drops_tail);
    T_RUN(test_repeat_penalty);
    T_RUN(test_follows_softmax);
    T_RUN(test_bad_params);
    T_DONE();
}
