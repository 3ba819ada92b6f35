/* SPDX-License-Identifier: MIT */
/*
 * test_threadpool.c - engine/ops/threadpool.h under stress: many runs of many tiny tasks on
 * pools of 1..4 threads, with exact per-task counts, thread ids in range, runs separated
 * by pauses longer than the workers' spin (so the futex sleep/wake paths run too), and
 * create/destroy cycles (also a run destroyed at once, while its worker is late). The
 * blocking pool: runs after 50 ms idle periods (every worker asleep on the futex), n_tasks
 * 0, 1 and many, slow worker tasks that put the caller to sleep on its own futex, destroy
 * while the workers sleep, and pe_tp_run_max's bound on the threads of a run. Label
 * "thread": the TSan pass of scripts/test.sh runs it.
 * The cost of a run is measured by bench/bench_threadpool.c.
 */
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

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

/* Short runs, each followed by a long one: a late worker of a short run that reads the
 * next, longer job must not claim the short run's past-the-end index (a race that ran
 * extra tasks before the claim word was closed before each job). */
static int test_short_then_long(void)
{
    static run_ctx c;
    for (uint32_t n_threads = 2; n_threads <= 4; n_threads++) {
        pe_threadpool *tp = pe_tp_create(n_threads);
        T_ASSERT(tp);
        memset(&c, 0, sizeof c);
        c.n_threads = n_threads;
        uint64_t expect = 0;
        for (uint32_t run = 0; run < 20000; run++) {
            const uint32_t n = run % 2 ? MAX_TASKS : 2 + run % 3;
            pe_tp_run(tp, count_task, &c, n);
            expect += n;
            T_EQ(atomic_load(&c.total), expect);
        }
        pe_tp_destroy(tp);
    }
    return 0;
}

static int test_runs_after_sleep(void)
{
    /* pauses of 3-6 ms put the workers (and maybe the caller) to sleep on the futex */
    return stress(3, 64, 1);
}

/* n_tasks of every size after idle periods far longer than the workers' 2 ms spin: each
 * run starts with every worker asleep, so it wakes them (or the caller does it all). */
static int test_runs_after_idle(void)
{
    static const uint32_t sizes[] = {0, 1, 2, 3, 5, 64, 257};
    static run_ctx c;
    for (uint32_t n_threads = 2; n_threads <= 4; n_threads += 2) {
        pe_threadpool *tp = pe_tp_create(n_threads);
        T_ASSERT(tp);
        memset(&c, 0, sizeof c);
        c.n_threads = n_threads;
        uint32_t expect = 0;
        for (uint32_t run = 0; run < 14; run++) {
            const uint32_t n = sizes[run % (sizeof sizes / sizeof sizes[0])];
            sleep_us(50000);
            for (uint32_t i = 0; i < n; i++)
                c.plain[i] = 0;
            pe_tp_run(tp, count_task, &c, n);
            expect += n;
            T_EQ(atomic_load(&c.total), expect);
            for (uint32_t i = 0; i < n; i++)
                T_EQ(c.plain[i], i + 1);
        }
        for (uint32_t i = 0; i < MAX_TASKS; i++) /* sizes[] twice: 2 runs of each size */
            T_EQ(atomic_load(&c.hits[i]), 2 * (i < 1) + 2 * (i < 2) + 2 * (i < 3) + 2 * (i < 5) +
                                              2 * (i < 64) + 2 * (i < 257));
        T_EQ(atomic_load(&c.bad_thread), 0);
        pe_tp_destroy(tp);
    }
    return 0;
}

typedef struct slow_ctx {
    atomic_uint total;
    uint32_t plain[64]; /* one writer per task */
} slow_ctx;

/* A task on a worker sleeps 5 ms, one on the caller does not: the caller runs out of tasks
 * long before the workers' end, outlasts its 1 ms spin and sleeps on `done`. */
static void slow_task(void *ctx, uint32_t task, uint32_t thread)
{
    slow_ctx *c = ctx;
    if (thread > 0) sleep_us(5000);
    c->plain[task] = task + 1;
    atomic_fetch_add_explicit(&c->total, 1, memory_order_relaxed);
}

static int test_caller_sleeps_on_slow_workers(void)
{
    pe_threadpool *tp = pe_tp_create(3);
    T_ASSERT(tp);
    static slow_ctx c;
    for (uint32_t run = 0; run < 20; run++) {
        memset(&c, 0, sizeof c);
        const uint32_t n = 2 + run % 20;
        pe_tp_run(tp, slow_task, &c, n);
        T_EQ(atomic_load(&c.total), n);
        for (uint32_t i = 0; i < n; i++)
            T_EQ(c.plain[i], i + 1);
        if (run % 5 == 4) sleep_us(20000);
    }
    pe_tp_destroy(tp);
    return 0;
}

static int test_destroy_while_blocked(void)
{
    for (uint32_t n_threads = 2; n_threads <= 4; n_threads++) {
        pe_threadpool *tp = pe_tp_create(n_threads);
        T_ASSERT(tp);
        sleep_us(20000); /* never ran: the workers sleep on the first generation */
        pe_tp_destroy(tp);
        tp = pe_tp_create(n_threads);
        T_ASSERT(tp);
        static run_ctx c;
        memset(&c, 0, sizeof c);
        c.n_threads = n_threads;
        pe_tp_run(tp, count_task, &c, 33);
        T_EQ(atomic_load(&c.total), 33);
        sleep_us(20000); /* asleep after a run */
        pe_tp_destroy(tp);
    }
    return 0;
}

typedef struct max_ctx {
    atomic_uint total;
    uint32_t thread[MAX_TASKS]; /* who ran task i (one writer per task) */
    uint64_t sink[MAX_TASKS];
    int sleep; /* each task sleeps 300 us: every thread that is awake joins */
} max_ctx;

/* A few microseconds of work, so that the workers have time to join. */
static void max_task(void *ctx, uint32_t task, uint32_t thread)
{
    max_ctx *c = ctx;
    if (c->sleep) sleep_us(300);
    uint64_t x = task + 1;
    for (int i = 0; i < 2000; i++)
        x = x * 6364136223846793005u + 1442695040888963407u;
    c->sink[task] = x;
    c->thread[task] = thread;
    atomic_fetch_add_explicit(&c->total, 1, memory_order_relaxed);
}

/* pe_tp_run_max: never more threads than max_threads (0 or more than the pool: all),
 * every task exactly once; 1 runs inline on the caller (thread 0). */
static int test_run_max(void)
{
    pe_threadpool *tp = pe_tp_create(4);
    T_ASSERT(tp);
    static max_ctx c;
    static const uint32_t maxes[] = {0, 1, 2, 3, 4, 9};
    uint64_t s = 99;
    for (uint32_t run = 0; run < 1260; run++) {
        const uint32_t max = maxes[run % 6], n = (uint32_t)(t_rand(&s) % 64);
        memset(&c, 0, sizeof c);
        c.sleep = run < 60; /* 60 runs in which the threads do not compete for the CPU */
        pe_tp_run_max(tp, max_task, &c, n, max);
        T_EQ(atomic_load(&c.total), n);
        uint32_t used = 0; /* bit per thread */
        for (uint32_t i = 0; i < n; i++) {
            T_ASSERT(c.thread[i] < 4);
            used |= 1u << c.thread[i];
        }
        const uint32_t limit = max == 0 || max > 4 ? 4 : max;
        T_ASSERT((uint32_t)__builtin_popcount(used) <= limit);
        if (max == 1) T_ASSERT(used <= 1u); /* thread 0 only */
        if (run % 300 == 299) sleep_us(10000);
    }
    pe_tp_run_max(NULL, max_task, &c, 3, 2); /* no pool: inline */
    pe_tp_destroy(tp);
    return 0;
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

static void noop_task(void *ctx, uint32_t task, uint32_t thread)
{
    (void)ctx, (void)task, (void)thread;
}

/* A run of no-op tasks, then destroy at once (weights.c packs a model's weights so): the
 * caller does every task before the new worker wakes, and publishes the stop generation
 * while the worker is still on its way to the first run's seat. A worker that took the
 * stop run's seat there once went back to sleep without seeing stop, and destroy's join
 * hung (seen under TSan at model load). A hang here is a failure: the watchdog (SIGALRM,
 * default action) kills the test after 60 s. */
static int test_run_then_destroy(void)
{
    alarm(60);
    for (int i = 0; i < 4000; i++) {
        pe_threadpool *tp = pe_tp_create((uint32_t)(i % 3) + 2);
        T_ASSERT(tp);
        pe_tp_run(tp, noop_task, NULL, 15);
        if (i % 2) pe_tp_run(tp, noop_task, NULL, 15);
        pe_tp_destroy(tp);
    }
    alarm(0);
    return 0;
}

int main(void)
{
    T_RUN(test_many_tiny_runs);
    T_RUN(test_short_then_long);
    T_RUN(test_runs_after_sleep);
    T_RUN(test_runs_after_idle);
    T_RUN(test_caller_sleeps_on_slow_workers);
    T_RUN(test_destroy_while_blocked);
    T_RUN(test_run_max);
    T_RUN(test_create_destroy);
    T_RUN(test_run_then_destroy);
    T_DONE();
}
