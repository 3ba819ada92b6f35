/* SPDX-License-Identifier: MIT */
/*
 * attn_fixture.h - shared by test_attn.c and test_threads_attn.c: a cache of a given codec
 * and geometry, sequences filled with random K/V through pgd_seq_write_kv, random queries,
 * and the NMSE of two outputs. Header-only (static functions), test code only.
 */
#ifndef PGD_ATTN_FIXTURE_H
#define PGD_ATTN_FIXTURE_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <pagoda/attn.h>
#include <pagoda/cache.h>

#include "t.h"

typedef struct fx {
    pgd_cache *c;
    pgd_kv_type type;
    uint32_t n_layers, n_kv, hd, pt;
    uint64_t rng;
} fx;

/* Uniform in [-1, 1). */
static inline float fx_rand(uint64_t *s)
{
    return (float)((double)(t_rand(s) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

/* kivi2 residual window of the next fx_init (0: 2 pages). */
static uint32_t fx_kv_residual;

/* Creates the cache; returns PGD_OK or the pool's refusal (a geometry the codec refuses). */
static inline int fx_init(fx *f, pgd_kv_type type, uint32_t n_layers, uint32_t n_kv, uint32_t hd,
                          uint32_t pt, uint32_t n_pages, int rotate, int bounds, uint64_t seed)
{
    memset(f, 0, sizeof *f);
    pgd_cache_params cp = pgd_cache_default_params();
    cp.pool.n_layers = n_layers;
    cp.pool.n_kv_heads = n_kv;
    cp.pool.head_dim = hd;
    cp.pool.page_tokens = pt;
    cp.pool.kv_type = type;
    cp.pool.capacity_pages = n_pages;
    cp.pool.kv_rotate = rotate;
    cp.pool.rotate_seed = 1234;
    cp.pool.key_bounds = bounds;
    cp.kv_residual = fx_kv_residual ? fx_kv_residual : 2 * pt;
    f->type = type;
    f->n_layers = n_layers;
    f->n_kv = n_kv;
    f->hd = hd;
    f->pt = pt;
    f->rng = seed | 1;
    return pgd_cache_create(&cp, &f->c);
}

static inline void fx_deinit(fx *f)
{
    pgd_cache_destroy(f->c);
    f->c = NULL;
}

/* Grows s by n positions and writes random K/V for them in every layer (values of key
 * channel d get a per-channel offset, so that attention is far from uniform). */
static inline int fx_extend(fx *f, pgd_seq *s, uint32_t n)
{
    const size_t row = (size_t)f->n_kv * f->hd;
    uint64_t pos0 = pgd_seq_length(f->c, s);
    int rc = pgd_seq_grow(f->c, s, n);
    if (rc != PGD_OK) return rc;
    float *k = malloc((size_t)n * row * sizeof *k), *v = malloc((size_t)n * row * sizeof *v);
    if (!k || !v) {
        free(k);
        free(v);
        return PGD_ENOMEM;
    }
    for (uint32_t l = 0; l < f->n_layers && rc == PGD_OK; l++) {
        for (size_t i = 0; i < (size_t)n * row; i++) {
            k[i] = fx_rand(&f->rng) * 1.5f + 0.3f * (float)((i % f->hd) % 5) - 0.6f;
            v[i] = fx_rand(&f->rng);
        }
        rc = pgd_seq_write_kv(f->c, s, pos0, n, l, k, v);
    }
    free(k);
    free(v);
    return rc;
}

/* A new sequence of len positions, written in chunks (as prefill then decode would). */
static inline pgd_seq *fx_seq(fx *f, uint32_t len)
{
    pgd_seq *s = NULL;
    if (pgd_seq_create(f->c, NULL, 0, &s) != PGD_OK) return NULL;
    for (uint32_t done = 0; done < len;) {
        uint32_t n = 1 + (uint32_t)(t_rand(&f->rng) % 48);
        if (n > len - done) n = len - done;
        if (fx_extend(f, s, n) != PGD_OK) {
            pgd_seq_destroy(f->c, s);
            return NULL;
        }
        done += n;
    }
    return s;
}

/* Random queries [n][n_head][hd], with a scale that makes attention peaked. */
static inline float *fx_queries(fx *f, uint32_t n_rows, uint32_t n_head)
{
    size_t n = (size_t)n_rows * n_head * f->hd;
    float *q = malloc(n * sizeof *q);
    for (size_t i = 0; q && i < n; i++)
        q[i] = fx_rand(&f->rng) * 2.0f;
    return q;
}

/* sum (a - b)^2 / sum b^2. */
static inline double fx_nmse(const float *a, const float *b, size_t n)
{
    double e = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        e += d * d;
        r += (double)b[i] * b[i];
    }
    return e / (r > 0 ? r : 1e-30);
}

/* ---- an executor on real threads (pthreads, spawned per call) ---- */

#include <pthread.h>
#include <stdatomic.h>

typedef struct fx_exec {
    uint32_t n_threads;
    atomic_uint n_calls; /* fx_parallel calls */
} fx_exec;

typedef struct fx_worker {
    pgd_task_fn fn;
    void *ud;
    uint32_t n_tasks, thread;
    atomic_uint *next;
} fx_worker;

static void *fx_worker_main(void *arg)
{
    fx_worker *w = arg;
    for (;;) {
        uint32_t i = atomic_fetch_add(w->next, 1);
        if (i >= w->n_tasks) break;
        w->fn(w->ud, i, w->thread);
    }
    return NULL;
}

/* pgd_parallel_fn: threads 1..n-1 are spawned, thread 0 is the caller; tasks are claimed
 * in order from an atomic counter. */
static void fx_parallel(void *exec_ud, pgd_task_fn fn, void *fn_ud, uint32_t n_tasks)
{
    fx_exec *e = exec_ud;
    atomic_fetch_add(&e->n_calls, 1);
    pthread_t th[16];
    fx_worker w[16];
    atomic_uint next = 0;
    uint32_t n = e->n_threads < 16 ? e->n_threads : 16, started = 0;
    for (uint32_t t = 0; t < n; t++)
        w[t] = (fx_worker){fn, fn_ud, n_tasks, t, &next};
    for (uint32_t t = 1; t < n; t++)
        if (pthread_create(&th[t], NULL, fx_worker_main, &w[t]) == 0) started |= 1u << t;
    fx_worker_main(&w[0]);
    for (uint32_t t = 1; t < n; t++)
        if (started & (1u << t)) pthread_join(th[t], NULL);
}

#endif /* PGD_ATTN_FIXTURE_H */
