/* SPDX-License-Identifier: MIT */
/*
 * attn.h - paged attention over a cache's pages: decode rows and prefill chunks of many
 * sequences in one call, every KV codec, the kv_rotate rotation, the kivi2 residual window
 * and Quest page selection.
 *
 *   out = softmax(q K^T / sqrt(head_dim)) V     for every query row, over keys [0, pos]
 *   (optionally another scale, gemma2's logit soft-cap and per-layer sliding windows:
 *    pgd_attn_params.scale / softcap / layer_window)
 *
 * Callers: the engine (one pgd_attn_run per layer of a forward step, after the step's K/V
 * for that layer were written with pgd_seq_write_kv), tests and benchmarks.
 *
 * Two implementations with one contract:
 *   pgd_attn_run      the fast path: a queue of work items (sequence tile, KV head, range of
 *                     pages) over the whole batch, run on the caller's threads; each K/V
 *                     row it loads serves every query head of its GQA group and every row of
 *                     a prefill tile; long sequences are split into page ranges whose
 *                     partial softmax states merge by log-sum-exp. Batch-invariant: a
 *                     row's output is the same bits whatever the rest of the batch, the
 *                     thread count, and whether the row is a decode row or one row of a
 *                     prefill chunk (the ranges are fixed by the row's own pages, merged in
 *                     page order; a key's score does not depend on the call's row count).
 *   pgd_attn_run_ref  the scalar reference (the spec): one thread, decoded rows, careful
 *                     softmax. Slow; for tests and the engine's --attn-ref.
 *
 * Thread-safety: a pgd_attn is used by one caller at a time (its scratch is per object);
 * several pgd_attn objects may run at once on one cache. Sequences attended must not be
 * grown, truncated or written during a run.
 */
#ifndef PAGODA_ATTN_H
#define PAGODA_ATTN_H

#include "cache.h"
#include "pagoda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One task: fn(ud, task, thread). */
typedef void (*pgd_task_fn)(void *ud, uint32_t task, uint32_t thread);
/* Runs fn(fn_ud, i, thread) for every i < n_tasks on the caller's threads (thread <
 * n_threads) and returns when all are done. NULL: run serially on the calling thread.
 * Tasks are independent; claiming them in increasing order (an atomic counter) balances
 * best, since the fast path queues its largest work items first. */
typedef void (*pgd_parallel_fn)(void *exec_ud, pgd_task_fn fn, void *fn_ud, uint32_t n_tasks);

typedef struct pgd_attn_params {
    uint32_t n_head;            /* query heads (a multiple of the pool's n_kv_heads) */
    uint32_t n_threads;         /* threads the parallel fn may use (scratch per thread); 0: 1 */
    pgd_parallel_fn parallel;   /* NULL: serial */
    void *parallel_ud;          /* exec_ud of parallel */
    uint32_t max_rows;          /* most query rows in one pgd_attn_run (sizes scratch); 0: 512 */
    uint32_t select_pages;      /* Quest: 0 = dense; else attend to at most this many pages per
                                   (sequence, kv head) decode row (an item of n_rows == 1): the
                                   first page, the newest max(1, select_pages / 4) pages, and
                                   the pages of highest bound max over the group's query heads
                                   of sum_d max(q_d * min_d, q_d * max_d) (ties: older page);
                                   needs the pool's key_bounds; >= 2 */
    uint32_t split_pages;       /* 0: page ranges of 2048 keys, split across threads when
                                   the batch leaves threads idle. Else ranges of this many
                                   pages, always split (tests of the log-sum-exp merge) */
    const pgd_allocator *alloc; /* NULL: libc */
    uint32_t score_keys;        /* most keys a scored row (pgd_attn_run_scored) may see:
                                   sizes the scoring scratch; 0: no scores
                                   (pgd_attn_run_scored returns PGD_EINVAL) */
    /* Gemma-style attention (all three 0: the plain softmax(q K^T / sqrt(head_dim)) V). */
    float scale;                  /* the logit scale: 0 = 1 / sqrt(head_dim); else > 0 (gemma:
                                     1 / sqrt(query_pre_attn_scalar)) */
    float softcap;                /* 0: none; else > 0: each scaled logit s becomes
                                     softcap * tanh(s / softcap) before the softmax (gemma2's
                                     attn_logit_softcapping) */
    const uint32_t *layer_window; /* NULL: every layer sees all its keys. Else [the pool's
                                     n_layers], copied at create: 0 = a global layer; W > 0 = a
                                     sliding-window layer, where the query row of slot p sees
                                     only the keys of slots p - W + 1 .. p (slots, not
                                     positions: a compacted sequence counts its kept slots).
                                     A window layer attends densely inside its window: no
                                     Quest selection there */
    uint64_t parallel_min_work;   /* the least work a run must have for the parallel fn
                                     to be called, in multiply-adds: keys x query vectors x
                                     (head_dim x 2, K and V, + 32, the softmax's share).
                                     Below it the caller's thread runs it alone: waking
                                     another thread costs more than a small run, and far
                                     more when that thread's core is busy.
                                     0: PGD_ATTN_PARALLEL_MIN_WORK; 1: whenever there are
                                     two tasks or more. Who runs the tasks never changes
                                     the results */
} pgd_attn_params;                /* append fields only */

/* The default parallel_min_work: two threads' worth of ~64K multiply-adds each, several
 * times the ~1-2 us a dispatch costs while the workers spin. stories260K's decode rows go
 * parallel from 342 keys (2 threads measured slower than 1 below ~300, faster above). */
#define PGD_ATTN_PARALLEL_MIN_WORK 131072u

/* Returns the defaults: n_head 0 (must be set), 1 thread, serial, 512 rows, dense. */
PGD_API pgd_attn_params pgd_attn_default_params(void);

typedef struct pgd_attn pgd_attn; /* opaque; one caller at a time */

/* Creates an attention context for cache c (borrowed: must outlive the context), with its
 * plan and per-thread scratch reserved up front, so pgd_attn_run never allocates.
 * Returns PGD_OK; PGD_EINVAL (n_head not a positive multiple of n_kv_heads, a pool without
 * host payload (metadata-only, or a device arena), select_pages == 1, select_pages without the
 * pool's key_bounds, an unknown codec, a scale or softcap negative or not finite); PGD_ENOMEM.
 * *out is NULL on error. */
PGD_API int pgd_attn_create(pgd_cache *c, const pgd_attn_params *p, pgd_attn **out);
/* Destroys the context. NULL: no-op. */
PGD_API void pgd_attn_destroy(pgd_attn *a);

typedef struct pgd_attn_item {
    pgd_seq *seq;    /* its K/V for this layer already written (pgd_seq_write_kv) */
    uint32_t n_rows; /* query rows = the sequence's last n_rows positions (causal); 0: skip */
    const float *q;  /* [n_rows][n_head][head_dim], unrotated, after RoPE */
    float *out;      /* [n_rows][n_head][head_dim] */
} pgd_attn_item;

/* out = softmax(q K^T / sqrt(head_dim)) V for every row, each row seeing keys [0, pos].
 * Handles rotation (kv_rotate pools: rotate q, inverse-rotate out), every codec, the
 * residual window of staged pools (kivi2; q8_0 / q4_0 with head_dim < 32): a row reads the
 * keys of its own page from the window in f16 and every earlier page from the pool, so
 * which copy of a key it reads depends on the two positions only (a prefix hit, a
 * recompute or another chunking gives the same bits). Items are borrowed for the call; q
 * and out must not overlap.
 * Returns 0 or a negative pgd_status: PGD_EINVAL (a bad item: NULL seq, q or out, more rows
 * than the sequence's length, more than max_rows rows in all; or layer out of range);
 * PGD_ENOMEM (staged pools only: the cache could not allocate the residual window of a sequence
 * that had none yet, the one allocation a run may cause). Nothing is written on error.
 * Cost: the K/V bytes of every row's pages, read once per tile of up to 64 / group rows
 * (at most 16) of one sequence and KV head; a page that the decode rows of several
 * sequences share (forks, prefix matches) is read once for up to 64 / group (at most 16)
 * of them; with Quest, the key bounds of every page of a decode row and the K/V of the
 * selected pages only. */
PGD_API int pgd_attn_run(pgd_attn *a, uint32_t layer, const pgd_attn_item *items, uint32_t n);

/* Scores for token budgets (budget.h), one per item of a run (parallel to the items). */
typedef struct pgd_attn_scores {
    /* NULL: none for this item. Else, for the item's last `rows` rows (0: none), ADDS to
     * scores[h * ld + j] the softmax probability that each query head of KV head h's group
     * gives key slot j, summed over the group's heads and those rows: the probabilities
     * the run computes anyway (normalized by the row's final softmax sum), never a second
     * pass over K. Keys a row does not see (causal, Quest pages not selected, dead slots
     * of a compacted sequence, keys before a window layer's window) add 0. ld >= the
     * sequence's length. */
    float *scores;
    uint32_t rows;
    size_t ld;
} pgd_attn_scores;

/* pgd_attn_run, with scores: sc[i] for items[i] (sc NULL: none). The outputs are the bits
 * pgd_attn_run writes; the scores are deterministic too (the same bits whatever the thread
 * count and the rest of the batch). Returns as pgd_attn_run, and PGD_EINVAL for rows >
 * n_rows, ld below the length, or a scored row seeing more than params.score_keys keys. */
PGD_API int pgd_attn_run_scored(pgd_attn *a, uint32_t layer, const pgd_attn_item *items,
                                const pgd_attn_scores *sc, uint32_t n);

/* The scalar reference: same contract, single thread, codec decode_rows + careful softmax
 * (the spec; tests and the engine's --attn-ref use it). Allocates its scratch per call
 * through the cache's allocator. Returns 0, PGD_EINVAL (as above, plus n_head or select_pages as in
 * pgd_attn_create) or PGD_ENOMEM. */
PGD_API int pgd_attn_run_ref(pgd_cache *c, uint32_t n_head, uint32_t layer,
                             const pgd_attn_item *items, uint32_t n, uint32_t select_pages);

/* The reference with a context's parameters: n_head, select_pages, scale, softcap and
 * layer_window of p (its threading, scratch and allocator fields are ignored), scores as
 * pgd_attn_run_scored (sc NULL: none). The spec of every field of pgd_attn_params. Returns
 * as pgd_attn_run_ref, PGD_EINVAL also for a bad scale, softcap or layer_window (as
 * pgd_attn_create). */
PGD_API int pgd_attn_run_ref_ex(pgd_cache *c, const pgd_attn_params *p, uint32_t layer,
                                const pgd_attn_item *items, const pgd_attn_scores *sc, uint32_t n);

/* The reference with scores (the spec of pgd_attn_run_scored's scores). */
PGD_API int pgd_attn_run_ref_scored(pgd_cache *c, uint32_t n_head, uint32_t layer,
                                    const pgd_attn_item *items, const pgd_attn_scores *sc,
                                    uint32_t n, uint32_t select_pages);

#ifdef __cplusplus
}
#endif
#endif /* PAGODA_ATTN_H */
