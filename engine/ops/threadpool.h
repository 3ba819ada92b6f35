/* SPDX-License-Identifier: MIT */
/*
 * threadpool.h - a fixed pool of worker threads for data-parallel kernels.
 * pe_tp_run(tp, fn, ctx, n_tasks) calls fn(ctx, task, thread) for task = 0..n_tasks-1
 * spread over the workers and the calling thread, and returns when all are done.
 * Tasks are claimed with an atomic counter, so uneven tasks balance, and the caller waits
 * only for tasks that a worker claimed: a worker that is descheduled misses the run rather
 * than stall it. Waiters spin briefly, then sleep. One run at a time per pool (the caller
 * serializes); a pool of 1 thread runs everything inline.
 */
#ifndef PE_THREADPOOL_H
#define PE_THREADPOOL_H

#include <stdint.h>

typedef struct pe_threadpool pe_threadpool;
typedef void (*pe_task_fn)(void *ctx, uint32_t task, uint32_t thread);

/* n_threads 0: all cores. Returns NULL on failure. */
pe_threadpool *pe_tp_create(uint32_t n_threads);
void pe_tp_destroy(pe_threadpool *tp);
uint32_t pe_tp_n_threads(const pe_threadpool *tp);
/* n_tasks < 2^32 - 1. */
void pe_tp_run(pe_threadpool *tp, pe_task_fn fn, void *ctx, uint32_t n_tasks);
/* pe_tp_run on at most max_threads threads, the caller included (0: all; 1: inline, no
 * worker is woken). Which tasks run is the same; only who runs them changes, so a caller
 * may size max_threads by the work without changing its results. */
void pe_tp_run_max(pe_threadpool *tp, pe_task_fn fn, void *ctx, uint32_t n_tasks,
                   uint32_t max_threads);

#endif /* PE_THREADPOOL_H */
