/* SPDX-License-Identifier: MIT */
/*
 * sched_fixture.h - what the scheduler tests (test_sched.c, test_sched_tiers.c) share: the
 * model they load (g_model), the output a request's callback collects, greedy request
 * params, random prompts, the small f32 context and a scheduler on it, and one request run
 * to the end. Header-only (static functions), like t.h, which it needs included first; each test
 * is one translation unit.
 */
#ifndef PGD_TESTS_SCHED_FIXTURE_H
#define PGD_TESTS_SCHED_FIXTURE_H

#include <stdio.h>
#include <string.h>

#include "proc.h"
#include "scheduler.h"
#include "t.h"

#define MAX_OUT 256 /* tokens a request's out keeps; the tests generate fewer */

static pe_model *g_model; /* loaded by sched_fixture_load */

/* What on_token collects of one request. */
typedef struct out {
    int32_t toks[MAX_OUT];
    uint32_t n;
    int n_final; /* final callbacks: exactly one per request */
    pe_finish finish;
    pe_usage u;
} out;

/* The request callback: ud is the request's out. */
static void on_token(void *ud, uint64_t id, int32_t tok, pe_finish why, const pe_usage *u)
{
    out *o = ud;
    (void)id;
    if (why == PE_FINISH_NONE) {
        if (o->n < MAX_OUT) o->toks[o->n++] = tok;
        return;
    }
    o->finish = why;
    o->u = *u;
    o->n_final++;
}

/* Loads argv[1], else stories260K.gguf in the models directory (tests/proc.h), into
 * g_model. Returns 0, 77 (skipped: no model) or 1 (load failed), with a message. */
static int sched_fixture_load(int argc, char **argv)
{
    char buf[1024], err[512];
    const char *path = argc > 1 ? argv[1] : NULL;
    if (!path && t_model_file(buf, sizeof buf, "stories260K.gguf")) path = buf;
    if (!path) T_SKIP("stories260K.gguf not found (set PGD_MODELS_DIR or pass a model path)");
    if (pe_model_load(path, NULL, NULL, &g_model, err, sizeof err)) {
        fprintf(stderr, "cannot load %s: %s\n", path, err);
        return 1;
    }
    return 0;
}

/* The tests' context: 512 positions, batches of 256, 16-token f32 pages, 2 threads, a pool
 * of kv_tokens; the caller may change more before sched_ctx_create. */
static pe_ctx_params sched_ctx_params(uint64_t kv_tokens)
{
    pe_ctx_params p = pe_ctx_default_params();
    p.n_ctx = 512;
    p.n_batch = 256;
    p.page_tokens = 16;
    p.kv_type = PGD_KV_F32;
    p.n_threads = 2;
    p.kv_tokens = kv_tokens;
    return p;
}

/* A context on g_model with p; NULL with a message on failure. */
static pe_ctx *sched_ctx_create(const pe_ctx_params *p)
{
    char err[256];
    pe_ctx *c;
    if (pe_ctx_create(g_model, p, &c, err, sizeof err)) {
        fprintf(stderr, "pe_ctx_create: %s\n", err);
        return NULL;
    }
    return c;
}

/* A scheduler on c (chunk 0: step_tokens); NULL on failure. */
static pe_sched *sched_create(pe_ctx *c, uint32_t max_running, uint32_t max_queued, uint32_t chunk)
{
    pe_sched_params p = pe_sched_default_params();
    pe_sched *s;
    p.model = g_model;
    p.max_running = max_running;
    p.max_queued = max_queued;
    p.chunk = chunk;
    if (pe_sched_create(c, &p, &s)) return NULL;
    return s;
}

/* Greedy sampling for max_tokens tokens, not stopping at end-of-generation. */
static pe_request_params greedy(uint32_t max_tokens)
{
    pe_request_params rp = pe_request_default_params();
    rp.max_tokens = max_tokens;
    rp.sampler.temp = 0;
    rp.stop_on_eog = 0;
    return rp;
}

/* n random tokens of g_model's vocabulary, above the special ids 0..2. */
static void random_tokens(uint64_t *seed, int32_t *t, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        t[i] = 3 + (int32_t)(t_rand(seed) % (pe_model_hparams(g_model)->n_vocab - 3));
}

/* Runs one greedy request of max_tokens tokens on s until s is idle, its tokens into *o;
 * checks it finished once with max_tokens tokens. Returns 0, or 1 on a failed check. */
static int sched_run_one(pe_sched *s, const int32_t *prompt, uint32_t n, uint32_t max_tokens,
                         out *o)
{
    pe_request_params rp = greedy(max_tokens);
    uint64_t id;
    memset(o, 0, sizeof *o);
    T_OK(pe_sched_submit(s, &rp, prompt, n, on_token, o, &id));
    T_OK(pe_sched_run_until_idle(s));
    T_EQ(o->n_final, 1);
    T_EQ(o->n, max_tokens);
    return 0;
}

/* sched_run_one alone on the fresh context c (destroyed after). */
static int sched_run_alone(pe_ctx *c, const int32_t *prompt, uint32_t n, uint32_t max_tokens,
                           out *o)
{
    T_ASSERT(c);
    pe_sched *s = sched_create(c, 4, 4, 0);
    T_ASSERT(s);
    if (sched_run_one(s, prompt, n, max_tokens, o)) return 1;
    pe_sched_destroy(s);
    pe_ctx_destroy(c);
    return 0;
}

#endif /* PGD_TESTS_SCHED_FIXTURE_H */
