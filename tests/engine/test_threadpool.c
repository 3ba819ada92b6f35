/* SPDX-License-Identifier: MIT */
/*
 * test_threadpool.c - engine/ops/threadpool.h under stress: many runs of many tiny tasks on
 * pools of 1..4 threads, with exact per-task counts, thread ids in range, runs separated
 * by pauses longer than the workers' spin (so the futex sleep/wake paths run too), and
 * create/destroy cycles. Label "thread": the TSan pass of scripts/test.sh runs it.
 * The cost of a run is measured by bench/bench_threadpool.c.
 */
#include <stdatomic.h>
#include <time.h>

#include "t.h"
#include "threadpool.h"

enum { MAX_TASKS = 257 };

typedef struct run_ctx {
    atomic_uint hits[MAX_TASKS];
    atomic_uint total;
    atomic_uint bad_thread;
    uint32_t n_threads;
    uint32_t plain[MAX_TASKS]; /* written without atomics: one task, one writer */
} run_ctx;

static void count_task(void *ctx, uint32_t task, uint32_t thread)
{
    run_ctx *c = ctx;
    atomic_fetch_add_explicit(&c->hits[task], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->total, 1, memory_order_relaxed);
    if (thread >= c->n_threads) atomic_fetch_add(&c->bad_thread, 1);
    c->plain[task] += task + 1;
}

static void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static int stress(uint32_t n_threads, uint32_t n_runs, int with_pauses)
{
    pe_threadpool *tp = pe_tp_create(n_threads);
    T_ASSERT(tp);
    T_EQ(pe_tp_n_threads(tp), n_threads);
    static run_ctx c;
    uint64_t s = 12345 + n_threads;
    memset(&c, 0, sizeof c);
    c.n_threads = n_threads;
    for (uint32_t run = 0; run < n_runs; run++) {
        uint32_t n = (uint32_t)(t_rand(&s) % MAX_TASKS);
        for (uint32_t i = 0; i < MAX_TASKS; i++)
            atomic_store(&c.hits[i], 0);
        atomic_store(&c.total, 0);
        for (uint32_t i = 0; i < n; i++)
            c.plain[i] = 0;
        pe_tp_run(tp, count_task, &c, n);
        T_EQ(atomic_load(&c.total), n);
        for (uint32_t i = 0; i < n; i++) {
            T_EQ(atomic_load(&c.hits[i]), 1);
            T_EQ(c.plain[i], i + 1); /* the caller sees the tasks' plain writes */
        }
        T_EQ(atomic_load(&c.bad_thread), 0);
        if (with_pauses && run % 8 == 7) sleep_us(3000 + (long)(t_rand(&s) % 3000));
    }
    pe_tp_destroy(tp);
    return 0;
}

static int test_many_tiny_runs(void)
{
    for (uint32_t n = 1; n <= 4; n++)
        if (stress(n, 3000, 0)) return 1;
    return 0;
}

static int test_runs_after_sleep(void)
{
    /* pauses of 3-6 ms put the workers (and maybe the caller) to sleep on the futex */
    return stress(3, 64, 1);
}

static int test_create_destroy(void)
{
    for (int i = 0; i < 50; i++) {
        pe_threadpool *tp = pe_tp_create((uint32_t)(i % 4) + 1);
        T_ASSERT(tp);
        if (i % 2) {
            static run_ctx c;
            memset(&c, 0, sizeof c);
            c.n_threads = pe_tp_n_threads(tp);
            pe_tp_run(tp, count_task, &c, 10);
            T_EQ(atomic_load(&c.total), 10);
        }
        pe_tp_destroy(tp);
    }
    pe_tp_destroy(NULL);
    pe_tp_run(NULL, count_task, NULL, 0);
    pe_threadpool *tp = pe_tp_create(0); /* all online CPUs */
    T_ASSERT(tp && pe_tp_n_threads(tp) >= 1);
    pe_tp_destroy(tp);
    return 0;
}

int main(void)
{
    T_RUN(test_many_tiny_runs);
    T_RUN(test_runs_after_sleep);
    T_RUN(test_create_destroy);
    T_DONE();
}
