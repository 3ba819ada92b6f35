/* SPDX-License-Identifier: MIT */
/*
 * threadpool.c - persistent worker threads for the engine's data-parallel kernels
 * (pe_matmul, attention). Callers: ops.c, forward.c.
 *
 * A run publishes {fn, ctx, n_tasks}, resets the task counter and bumps the generation
 * word; workers wake on the new generation, claim tasks with atomic_fetch_add on the
 * counter (so uneven tasks balance), then decrement `pending`. The caller claims tasks
 * too and returns once `pending` is 0. Decode issues ~130 runs per token, so both sides
 * wait by spinning first (a run costs ~1-2 us while the workers are still spinning) and
 * only then sleep on a futex on the same word, which costs a syscall per wake-up.
 *
 *   caller:  job = {fn, ctx, n}; next = 0; pending = n_workers; gen++ (release)
 *            [wake sleepers]; claim tasks; wait pending == 0 (acquire)
 *   worker:  wait gen != seen (acquire); claim tasks; pending-- (release) [wake caller]
 *
 * Invariants: one run at a time (pe_tp_run is not reentrant and the caller serializes);
 * every worker takes part in every generation, and a run's job fields are written only
 * while pending == 0, i.e. while no worker reads them. Thread 0 is the caller; workers
 * are threads 1..n-1.
 */
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "threadpool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* Pause iterations before a worker sleeps: at 15-50 ns per pause (Sapphire Rapids,
 * Skylake) 2-6 ms, longer than the gap between two runs of a forward pass and than the
 * ~0.5 ms it takes this VM to wake a sleeping thread, much shorter than the gap between
 * two requests. The caller, which waits for its own run to finish, spins 8x longer: if it
 * slept, it would wake up late, find the workers asleep in turn and pay a wake-up on every
 * run. Every YIELD_EVERY pauses a spinner yields the CPU: the scheduler likes to wake a
 * worker on the caller's CPU, where a pure spin would starve it for a whole time slice
 * (measured on the 2-vCPU VM: 1-10 ms per run without the yield, 0.4 us with it). */
enum { SPIN_WORKER = 1 << 17, SPIN_CALLER = 1 << 20, YIELD_EVERY = 256 };

static void spin_pause(uint32_t i)
{
    cpu_relax();
    if (i % YIELD_EVERY == YIELD_EVERY - 1) sched_yield();
}

typedef struct worker {
    pe_threadpool *tp;
    pthread_t th;
    uint32_t id;
} worker;

struct pe_threadpool {
    uint32_t n_threads;
    uint32_t n_started; /* workers whose thread was created */
    worker *workers;    /* [n_threads - 1] */

    /* the job of the current run: written by the caller only while pending == 0 */
    pe_task_fn fn;
    void *ctx;
    uint32_t n_tasks;
    int stop;

    _Alignas(64) atomic_uint gen;     /* bumped once per run; futex word of the workers */
    atomic_uint n_sleepers;           /* workers in (or about to enter) futex_wait on gen */
    _Alignas(64) atomic_uint next;    /* next task to claim */
    _Alignas(64) atomic_uint pending; /* workers still in the current run; caller's futex */
    atomic_uint caller_sleeping;
};

static void futex_wait(atomic_uint *addr, unsigned val)
{
    /* EAGAIN (value changed) and EINTR both just send the caller back to its check. */
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(atomic_uint *addr)
{
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
}

static void run_tasks(pe_threadpool *tp, uint32_t thread)
{
    const uint32_t n = tp->n_tasks;
    for (;;) {
        uint32_t t = atomic_fetch_add_explicit(&tp->next, 1, memory_order_relaxed);
        if (t >= n) break;
        tp->fn(tp->ctx, t, thread);
    }
}

/* Returns the generation after `seen`: spins, then sleeps on the futex. */
static unsigned wait_gen(pe_threadpool *tp, unsigned seen)
{
    unsigned g;
    for (uint32_t i = 0; i < SPIN_WORKER; i++) {
        g = atomic_load_explicit(&tp->gen, memory_order_acquire);
        if (g != seen) return g;
        spin_pause(i);
    }
    for (;;) {
        atomic_fetch_add(&tp->n_sleepers, 1);
        g = atomic_load(&tp->gen);
        if (g == seen) futex_wait(&tp->gen, seen);
        atomic_fetch_sub(&tp->n_sleepers, 1);
        g = atomic_load_explicit(&tp->gen, memory_order_acquire);
        if (g != seen) return g;
    }
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    pe_threadpool *tp = w->tp;
    unsigned seen = 0;
    for (;;) {
        seen = wait_gen(tp, seen);
        if (tp->stop) break;
        run_tasks(tp, w->id);
        /* seq_cst on both sides: either the caller sees pending == 0 or we see it asleep */
        if (atomic_fetch_sub(&tp->pending, 1) == 1 && atomic_load(&tp->caller_sleeping))
            futex_wake(&tp->pending);
    }
    return NULL;
}

/* Waits until every worker has left the current run. */
static void wait_pending(pe_threadpool *tp)
{
    for (uint32_t i = 0; i < SPIN_CALLER; i++) {
        if (atomic_load_explicit(&tp->pending, memory_order_acquire) == 0) return;
        spin_pause(i);
    }
    for (;;) {
        atomic_store(&tp->caller_sleeping, 1);
        unsigned p = atomic_load(&tp->pending);
        if (p != 0) futex_wait(&tp->pending, p);
        atomic_store(&tp->caller_sleeping, 0);
        if (atomic_load_explicit(&tp->pending, memory_order_acquire) == 0) return;
    }
}

/* Starts a generation: the job fields must be set. */
static void publish(pe_threadpool *tp)
{
    atomic_store_explicit(&tp->next, 0, memory_order_relaxed);
    atomic_store_explicit(&tp->pending, tp->n_started, memory_order_relaxed);
    atomic_fetch_add(&tp->gen, 1); /* seq_cst: pairs with the sleepers' check */
    if (atomic_load(&tp->n_sleepers)) futex_wake(&tp->gen);
}

pe_threadpool *pe_tp_create(uint32_t n_threads)
{
    if (n_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (uint32_t)n : 1;
    }
    pe_threadpool *tp = calloc(1, sizeof *tp);
    if (!tp) return NULL;
    tp->n_threads = n_threads;
    if (n_threads > 1) {
        tp->workers = calloc(n_threads - 1, sizeof *tp->workers);
        if (!tp->workers) goto fail;
    }
    for (uint32_t i = 0; i + 1 < n_threads; i++) {
        worker *w = &tp->workers[i];
        w->tp = tp;
        w->id = i + 1;
        if (pthread_create(&w->th, NULL, worker_main, w) != 0) goto fail;
        tp->n_started++;
    }
    return tp;
fail:
    pe_tp_destroy(tp);
    return NULL;
}

void pe_tp_destroy(pe_threadpool *tp)
{
    if (!tp) return;
    if (tp->n_started) {
        tp->stop = 1;
        publish(tp);
        for (uint32_t i = 0; i < tp->n_started; i++)
            pthread_join(tp->workers[i].th, NULL);
    }
    free(tp->workers);
    free(tp);
}

uint32_t pe_tp_n_threads(const pe_threadpool *tp)
{
    return tp ? tp->n_threads : 1;
}

void pe_tp_run(pe_threadpool *tp, pe_task_fn fn, void *ctx, uint32_t n_tasks)
{
    if (n_tasks == 0) return;
    if (!tp || tp->n_started == 0 || n_tasks == 1) {
        for (uint32_t t = 0; t < n_tasks; t++)
            fn(ctx, t, 0);
        return;
    }
    tp->fn = fn;
    tp->ctx = ctx;
    tp->n_tasks = n_tasks;
    publish(tp);
    run_tasks(tp, 0);
    wait_pending(tp);
}
