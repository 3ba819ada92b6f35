/* SPDX-License-Identifier: MIT */
/*
 * test_sched_threads.c - the scheduler's locking (label "thread", run under
 * -DPGD_SANITIZE=thread): two threads submit requests and cancel some of them (queued or
 * running) while the main thread steps. Every accepted request gets exactly one final
 * callback, the counters add up and the cache stays consistent.
 * Model: argv[1], else $PGD_MODELS_DIR/stories260K.gguf, else ../shared/models beside the
 * source tree; skipped (77) when none is found.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "scheduler.h"
#include "proc.h"
#include "t.h"

#define N_THREADS 2
#define N_PER_THREAD 12

static pe_model *g_model;
static pe_sched *g_sched;
static atomic_int g_submitted, g_threads_done;
static int g_finals, g_tokens, g_cancelled; /* stepping thread only */

static void on_token(void *ud, uint64_t id, int32_t tok, pe_finish why, const pe_usage *u)
{
    (void)ud;
    (void)id;
    (void)tok;
    if (why == PE_FINISH_NONE) {
        g_tokens++;
        return;
    }
    g_finals++;
    g_cancelled += why == PE_FINISH_CANCELLED;
    if (u->completion_tokens > 6) g_finals += 1000; /* flags a broken max_tokens */
}

static void *client(void *arg)
{
    uint64_t seed = 1000 + (uint64_t)(uintptr_t)arg;
    pe_request_params rp = pe_request_default_params();
    rp.max_tokens = 6;
    rp.sampler.temp = 0;
    uint64_t prev = 0;
    for (int i = 0; i < N_PER_THREAD; i++) {
        int32_t prompt[12];
        uint64_t id;
        int rc;
        prompt[0] = 1;
        for (int k = 1; k < 12; k++)
            prompt[k] = 3 + (int32_t)(t_rand(&seed) % (pe_model_hparams(g_model)->n_vocab - 3));
        do {
            rc = pe_sched_submit(g_sched, &rp, prompt, 12, on_token, NULL, &id);
            if (rc == PGD_EBUSY) sched_yield();
        } while (rc == PGD_EBUSY);
        if (rc != PGD_OK) continue;
        atomic_fetch_add(&g_submitted, 1);
        if (i % 3 == 0) pe_sched_cancel(g_sched, id);   /* queued, most likely */
        if (i % 3 == 2) pe_sched_cancel(g_sched, prev); /* may be running or done */
        prev = id;
        if (i % 4 == 1) {
            struct timespec ts = {0, 300 * 1000}; /* let steps run between submits */
            nanosleep(&ts, NULL);
        }
        pe_sched_stats st;
        pe_sched_get_stats(g_sched, &st);
    }
    atomic_fetch_add(&g_threads_done, 1);
    return NULL;
}

static int test_submit_cancel_while_stepping(void)
{
    pe_ctx_params p = pe_ctx_default_params();
    pe_sched_params sp = pe_sched_default_params();
    char err[256];
    pe_ctx *c;
    pthread_t th[N_THREADS];
    p.n_ctx = 128;
    p.n_batch = 64;
    p.n_threads = 1;
    p.kv_tokens = 1024;
    T_EQ(pe_ctx_create(g_model, &p, &c, err, sizeof err), 0);
    sp.model = g_model;
    sp.max_running = 4;
    sp.max_queued = 4;
    T_OK(pe_sched_create(c, &sp, &g_sched));
    for (uintptr_t i = 0; i < N_THREADS; i++)
        T_EQ(pthread_create(&th[i], NULL, client, (void *)i), 0);
    while (atomic_load(&g_threads_done) < N_THREADS) {
        T_OK(pe_sched_step(g_sched));
        T_EQ(pgd_cache_check(pe_ctx_cache(c)), PGD_OK);
    }
    for (int i = 0; i < N_THREADS; i++)
        pthread_join(th[i], NULL);
    T_OK(pe_sched_run_until_idle(g_sched));
    T_EQ(g_finals, atomic_load(&g_submitted));
    T_EQ(g_submitted, N_THREADS * N_PER_THREAD);
    pe_sched_stats st;
    pe_sched_get_stats(g_sched, &st);
    T_EQ(st.n_running + st.n_waiting, 0);
    T_ASSERT((uint64_t)g_tokens <= st.n_generated_tokens);
    pgd_cache_stats cs;
    pgd_cache_get_stats(pe_ctx_cache(c), &cs);
    T_EQ(cs.n_pages_used, 0);
    T_EQ(pgd_cache_check(pe_ctx_cache(c)), PGD_OK);
    printf("submitted %d, cancelled %d, tokens %d\n", g_finals, g_cancelled, g_tokens);
    pe_sched_destroy(g_sched);
    pe_ctx_destroy(c);
    return 0;
}

/* argv[1], else stories260K.gguf in the models directory (tests/proc.h); NULL if absent. */
static const char *model_path(int argc, char **argv, char *buf, size_t n)
{
    if (argc > 1) return argv[1];
    return t_model_file(buf, n, "stories260K.gguf") ? buf : NULL;
}

int main(int argc, char **argv)
{
    char buf[1024], err[512];
    const char *path = model_path(argc, argv, buf, sizeof buf);
    if (!path) T_SKIP("stories260K.gguf not found (set PGD_MODELS_DIR or pass a model path)");
    if (pe_model_load(path, NULL, NULL, &g_model, err, sizeof err)) {
        fprintf(stderr, "cannot load %s: %s\n", path, err);
        return 1;
    }
    T_RUN(test_submit_cancel_while_stepping);
    pe_model_destroy(g_model);
    T_DONE();
}
