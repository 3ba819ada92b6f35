/* SPDX-License-Identifier: MIT */
/*
 * threadpool.c - persistent worker threads for the engine's data-parallel kernels
 * (pe_matmul, attention). Callers: ops.c, forward.c.
 *
 * A run is a generation g. The caller publishes the job {fn, ctx, n_tasks}, resets `done`
 * and the seat count, stores the claim word (g << 32 | 0) and bumps the generation word
 * `gen`. Whoever takes part claims tasks by advancing the claim word's low half, runs them
 * and counts each finished task in `done`. The caller claims tasks too and returns once
 * done == n_tasks: it waits for the tasks that were claimed, never for a worker that did
 * not come. A worker that is descheduled (a busy core) misses the run, and the caller does
 * its share; only a task that a worker claimed and has not finished is waited for.
 *
 *   caller:  claim = (g, closed); job = {fn, ctx, n} (release); done = 0; claim = (g, 0);
 *            seats = (g, k) (release); gen = g (seq_cst) [wake k sleepers];
 *            claim and run tasks; wait done == n
 *   worker:  wait gen > seen; CAS seats (g, s) -> (g, s - 1) while s > 0; read the job;
 *            CAS claim (g, t) -> (g, t + 1) while t < n; run task t; done++ (release)
 *            [wake the caller on the last one]
 *
 * The seat word carries the generation, so a run of max_threads k never has more than
 * k - 1 workers, even with a late one that finds a newer run than the one it woke for.
 * Such a worker counts the newer run as seen, so it checks `stop` again after it: the
 * newer run may be destroy's, which it would otherwise sleep through (a hang in
 * pthread_join, seen under TSan: test_threadpool's test_run_then_destroy).
 *
 * The job fields are atomics that a worker reads before its claim CAS, as in a seqlock.
 * A worker works only on the run of its seat, whose acquire shows it that run's job (or a
 * newer one). The caller closes the claim word before it writes a job, and writes the job
 * with release stores, which the workers load with acquire: a worker that reads a newer
 * job than its run's then sees the closed word, and its CAS on (g, t) fails; a CAS that
 * succeeds proves the job it read was g's and task t (< n) unclaimed.
 *
 * Waiting spins first (decode issues ~130 runs per token, a run costs ~1 us while the
 * workers spin), then sleeps on a futex: workers on `gen`, the caller on `done`. A sleeping
 * caller frees its core for a worker that was preempted while holding a task.
 *
 * Invariants: one run at a time (pe_tp_run is not reentrant and the caller serializes);
 * the caller writes a job only while done == n_tasks of the previous one (no task of it is
 * running); each task index of a generation is claimed exactly once; the claim word's
 * index never passes n_tasks + 1 (the caller's one claim past the end). Thread 0 is the
 * caller; workers are threads 1..n-1.
 */
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "threadpool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* How long a waiter spins before it sleeps, in ns of wall time (a pause is 1-50 ns
 * depending on the CPU, so a count would not say how long). A worker spins 2 ms: longer
 * than the gap between two runs of a forward pass and than the ~0.5 ms it takes this VM
 * to wake a sleeping thread, much shorter than the gap between two requests. The caller
 * waits only for tasks already running: 1 ms covers the uneven end of a product (a
 * 32-row chunk of a 1B model's FFN is ~30 us, a prefill tile of 128 rows x 256 tokens
 * ~1 ms), and past that a worker is more likely preempted than busy, so the caller
 * sleeps and leaves its core free (1B q8_0 decode beside a busy core, 2 threads: 1 ms
 * measured 1.14x the t/s of 100 us, within this VM's noise). Every YIELD_EVERY
 * pauses a spinner yields: the scheduler likes to wake a worker on the caller's CPU, where
 * a pure spin would starve it for a whole time slice (measured on the 2-vCPU VM: 1-10 ms
 * per run without the yield, 0.4 us with it). */
enum { YIELD_EVERY = 256 };
#define CLAIM_CLOSED 0xffffffffu /* the claim word's task index while a job is written */
#define SPIN_WORKER_NS 2000000
#define SPIN_CALLER_NS 1000000

typedef struct spin {
    uint32_t i;
    int64_t deadline_ns; /* 0 until the first yield */
    int64_t budget_ns;
} spin;

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Pauses once; returns 0 when the spin's time is up. The clock is read at the yields only,
 * so a wait that ends within YIELD_EVERY pauses (the common case) never reads it. */
static int spin_pause(spin *s)
{
    cpu_relax();
    if (++s->i % YIELD_EVERY) return 1;
    sched_yield();
    int64_t t = now_ns();
    if (!s->deadline_ns) s->deadline_ns = t + s->budget_ns;
    return t < s->deadline_ns;
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

    /* the job of the current run: written by the caller only while no task of the
     * previous run is running; atomics because late workers read them (see the header) */
    _Atomic(pe_task_fn) fn;
    _Atomic(void *) ctx;
    atomic_uint n_tasks;
    atomic_int stop;

    _Alignas(64) atomic_uint gen;         /* the current generation; futex word of the workers */
    atomic_uint n_sleepers;               /* workers in (or about to enter) futex_wait on gen */
    _Atomic(uint64_t) seats;              /* gen << 32 | workers that may still join */
    _Alignas(64) _Atomic(uint64_t) claim; /* gen << 32 | next task to claim */
    _Alignas(64) atomic_uint done;        /* tasks of this run finished; futex word of the caller */
    atomic_uint caller_sleeping;
};

static void futex_wait(atomic_uint *addr, unsigned val)
{
    /* EAGAIN (value changed) and EINTR both just send the caller back to its check. */
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(atomic_uint *addr, int n)
{
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

/* ---- workers ---- */

/* Whether generation a comes after b (the words wrap). */
static int gen_after(unsigned a, unsigned b)
{
    return (int)(a - b) > 0;
}

/* Returns the generation word once it is after `seen`: spins, then sleeps. `seen` may be
 * one ahead of the word for a moment (a worker that found the caller between its stores). */
static unsigned wait_gen(pe_threadpool *tp, unsigned seen)
{
    spin s = {0, 0, SPIN_WORKER_NS};
    unsigned g;
    do {
        g = atomic_load_explicit(&tp->gen, memory_order_acquire);
        if (gen_after(g, seen)) return g;
    } while (spin_pause(&s));
    for (;;) {
        atomic_fetch_add(&tp->n_sleepers, 1);
        g = atomic_load(&tp->gen);
        if (!gen_after(g, seen)) futex_wait(&tp->gen, g);
        atomic_fetch_sub(&tp->n_sleepers, 1);
        g = atomic_load_explicit(&tp->gen, memory_order_acquire);
        if (gen_after(g, seen)) return g;
    }
}

/* Claims and runs tasks of generation `g` until none is left or a newer run started. */
static void worker_tasks(pe_threadpool *tp, uint64_t c, uint32_t thread)
{
    const uint64_t g = c >> 32;
    for (;;) {
        pe_task_fn fn = atomic_load_explicit(&tp->fn, memory_order_acquire);
        void *ctx = atomic_load_explicit(&tp->ctx, memory_order_acquire);
        uint32_t n = atomic_load_explicit(&tp->n_tasks, memory_order_acquire);
        if ((c >> 32) != g || (uint32_t)c >= n) return;
        /* acquire on success: the caller's inputs of g; on failure: the job fields read
         * next are at least those of the run in c */
        if (!atomic_compare_exchange_weak_explicit(&tp->claim, &c, c + 1, memory_order_acquire,
                                                   memory_order_acquire))
            continue;
        fn(ctx, (uint32_t)c, thread);
        /* seq_cst: either the caller sees done == n or we see it asleep */
        if (atomic_fetch_add(&tp->done, 1) + 1 == n && atomic_load(&tp->caller_sleeping))
            futex_wake(&tp->done, 1);
        c = atomic_load_explicit(&tp->claim, memory_order_acquire);
    }
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    pe_threadpool *tp = w->tp;
    unsigned seen = 0;
    for (;;) {
        seen = wait_gen(tp, seen);
        if (atomic_load_explicit(&tp->stop, memory_order_relaxed)) break;
        /* A seat of the newest run, which may be newer than the one we woke for: acquire
         * makes its claim word (stored before the seats) visible. */
        uint64_t s = atomic_load_explicit(&tp->seats, memory_order_acquire);
        while ((uint32_t)s &&
               !atomic_compare_exchange_weak_explicit(&tp->seats, &s, s - 1, memory_order_acquire,
                                                      memory_order_acquire)) {
        }
        seen = (unsigned)(s >> 32);
        if ((uint32_t)s) {
            uint64_t c = atomic_load_explicit(&tp->claim, memory_order_acquire);
            if ((c >> 32) == (s >> 32)) worker_tasks(tp, c, w->id);
        }
        /* The seat's run may be newer than the one we woke for, and may be destroy's:
         * `seen` now counts it, so wait_gen would not return for it again. The seats'
         * acquire shows the stop stored before that run was published. */
        if (atomic_load_explicit(&tp->stop, memory_order_relaxed)) break;
    }
    return NULL;
}

/* ---- the caller ---- */

/* Waits until every task of the current run has finished. */
static void wait_done(pe_threadpool *tp, uint32_t n)
{
    spin s = {0, 0, SPIN_CALLER_NS};
    do {
        if (atomic_load_explicit(&tp->done, memory_order_acquire) == n) return;
    } while (spin_pause(&s));
    for (;;) {
        atomic_store(&tp->caller_sleeping, 1);
        unsigned d = atomic_load(&tp->done);
        if (d != n) futex_wait(&tp->done, d);
        atomic_store(&tp->caller_sleeping, 0);
        if (atomic_load_explicit(&tp->done, memory_order_acquire) == n) return;
    }
}

/* Starts a generation: writes the job, then opens it to n_workers workers. */
static void publish(pe_threadpool *tp, pe_task_fn fn, void *ctx, uint32_t n_tasks,
                    uint32_t n_workers)
{
    unsigned g = atomic_load_explicit(&tp->gen, memory_order_relaxed) + 1;
    /* Close the previous run first: its claim word may still read (g - 1, n) past the
     * end, which a late worker that read the new, larger n_tasks could otherwise claim.
     * The job stores are release and the workers' loads acquire: a worker that reads any
     * of them then sees the closed word, and its CAS on (g - 1, t) fails. */
    atomic_store_explicit(&tp->claim, (uint64_t)g << 32 | CLAIM_CLOSED, memory_order_relaxed);
    atomic_store_explicit(&tp->fn, fn, memory_order_release);
    atomic_store_explicit(&tp->ctx, ctx, memory_order_release);
    atomic_store_explicit(&tp->n_tasks, n_tasks, memory_order_release);
    atomic_store_explicit(&tp->done, 0, memory_order_relaxed);
    atomic_store_explicit(&tp->claim, (uint64_t)g << 32, memory_order_relaxed);
    atomic_store_explicit(&tp->seats, (uint64_t)g << 32 | n_workers, memory_order_release);
    atomic_store(&tp->gen, g); /* seq_cst: pairs with the sleepers' check */
    if (atomic_load(&tp->n_sleepers)) futex_wake(&tp->gen, (int)n_workers);
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
        /* an empty job: a worker that reads it finds no task and checks `stop` next */
        atomic_store_explicit(&tp->stop, 1, memory_order_relaxed);
        publish(tp, NULL, NULL, 0, tp->n_started);
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

void pe_tp_run_max(pe_threadpool *tp, pe_task_fn fn, void *ctx, uint32_t n_tasks,
                   uint32_t max_threads)
{
    if (n_tasks == 0) return;
    uint32_t n_workers = tp ? tp->n_started : 0;
    if (max_threads && max_threads - 1 < n_workers) n_workers = max_threads - 1;
    if (n_tasks - 1 < n_workers) n_workers = n_tasks - 1;
    if (n_workers == 0) {
        for (uint32_t t = 0; t < n_tasks; t++)
            fn(ctx, t, 0);
        return;
    }
    publish(tp, fn, ctx, n_tasks, n_workers);
    /* The caller's claims: no one else publishes, so the generation cannot change under
     * it and a plain increment does (an index past n_tasks only tells workers "none"). */
    uint32_t mine = 0;
    for (;;) {
        uint64_t c = atomic_fetch_add_explicit(&tp->claim, 1, memory_order_relaxed);
        if ((uint32_t)c >= n_tasks) break;
        fn(ctx, (uint32_t)c, 0);
        mine++;
    }
    if (mine) atomic_fetch_add_explicit(&tp->done, mine, memory_order_relaxed);
    wait_done(tp, n_tasks);
}

void pe_tp_run(pe_threadpool *tp, pe_task_fn fn, void *ctx, uint32_t n_tasks)
{
    pe_tp_run_max(tp, fn, ctx, n_tasks, 0);
}
