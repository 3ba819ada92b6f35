/* SPDX-License-Identifier: MIT */
/*
 * threadpool.h - a fixed pool of worker threads for data-parallel kernels.
 * pe_tp_run(tp, fn, ctx, n_tasks) calls fn(ctx, task, thread) for task = 0..n_tasks-1
 * spread over the workers and the calling thread, and returns when all are done.
 * Tasks are claimed with an atomic counter, so uneven tasks balance. One run at a time
 * per pool (the caller serializes); a pool of 1 thread runs everything inline.
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
void pe_tp_run(pe_threadpool *tp, pe_task_fn fn, void *ctx, uint32_t n_tasks);

#endif /* PE_THREADPOOL_H */
