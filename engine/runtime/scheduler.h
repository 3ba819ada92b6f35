/* SPDX-License-Identifier: MIT */
/*
 * scheduler.h - iteration-level continuous batching over one pe_ctx. Callers: the server (its
 * HTTP threads submit and cancel, one thread steps), the tests.
 *
 *   pe_sched_submit(prompt)   queue a request (PGD_EBUSY when the queue is full)
 *   pe_sched_step()           one iteration: admit waiting requests while free pages allow
 *                             (prefix-aware order), run every running decode token plus
 *                             prefill chunks within the token budget as ONE pe_forward_batch,
 *                             sample, call back, retire finished requests
 *   pe_sched_cancel(id)       drop a queued request, or release a running one's pages
 *
 * Admission order, each time a slot is free (one admission round per pe_sched_step):
 *  1. Aging: a request that has waited through more than max_wait_steps rounds since it
 *     was queued (or requeued by preemption) is overdue; the longest-waiting overdue
 *     request goes first, whatever its tenant, its cached pages or a hold (below). So a
 *     request waits at most max_wait_steps steps, then until a slot and its pages are free
 *     (nothing else is admitted before it meanwhile).
 *  2. A preempted request, before any other that is not overdue.
 *  3. Fairness between tenants (salts): round-robin by admissions. Among the tenants with
 *     a waiting request that is not held, the one whose latest admission is the oldest (or
 *     that was never admitted) goes first, so a tenant flooding the queue with warm
 *     requests gets one admission in turn with every other waiting tenant: a cold request
 *     of another tenant is admitted at the next free slot.
 *  4. Prefix-aware order within the tenant: a waiting request whose leading pages another
 *     request is still computing (running, or ahead of it in the queue) is held until those
 *     pages are committed (or it is overdue), so a shared prefix is computed once and the
 *     others match it from the cache; among the rest, the one sharing the most committed
 *     pages with running requests goes first, then the queue order.
 * When the request picked does not fit the free pages, admission stops for this step. With
 * no_prefix_cache nothing is matched or shared and admission is first come, first served.
 *
 * Storage tiers (the context's pe_ctx_params.tiers): the match at admission may include
 * pages promoted from a tier, filled in the background. Such a request is admitted (its
 * pages are allocated) but left out of each batch until pgd_seq_ready says its pages are
 * filled, while the other requests run; when nothing else can run, the step waits for it
 * (pgd_seq_wait). Once filled it resumes from the sequence's length: a fill that failed
 * (a damaged or vanished record) cut the sequence back, and the rest is computed.
 * pe_usage splits cached_tokens by where they came from (pgd_seq_match_info, after the
 * fills). pe_sched_submit starts a prefetch of the request's pages (pgd_cache_prefetch),
 * so that by admission they sit in the fastest tier.
 *
 * Preemption: when the pool cannot hold a step's tokens (PGD_ENOSPC, nothing changed),
 * the newest running request is released and requeued at the front with prompt +
 * generated tokens as its new prompt; the step is retried. Released how, by cost: with
 * tiers, its P registered pages (n = P * page_tokens tokens) are either parked in the
 * first tier (swap: pgd_seq_park, then destroy; the requeued request matches them back)
 * or just dropped to the pool's cache (recompute: destroy), whichever is cheaper:
 *     swap      = 2 * P * page_bytes / B                  (out to the tier and back in)
 *     recompute = (n * F + 2 * n_layer * n_head * head_dim * n^2) / R
 * with B = 4e9 bytes/s (a memcpy-class copy, PE_SCHED_COPY_BYTES_PER_S in scheduler.c),
 * F = the model's matrix-product FLOPs per token (2 * weights of every layer and the
 * output), the n^2 term attention's, and R the forward rate the scheduler measures on its
 * own steps of 64 tokens or more (smoothed; 2e10 FLOP/s before the first). Without tiers
 * it is always recompute. pe_sched_stats counts each. A request that does not fit even
 * alone finishes with PE_FINISH_ERROR and status PGD_ENOSPC.
 *
 * Token budgets (budget.h): a request runs under its pe_request_params.budget, else the
 * context's pe_ctx_params.budget. Its pgd_budget is created at its first admission; each
 * step scores its rows and enforces the budget after the commit (pe_forward_batch), with
 * prompt_left from its progress (the tokens before the next decode: the prompt, or after a
 * preemption every token to recompute). Prefix matching works as for any request: the
 * pages it matched stay shared, and a compaction copies what it keeps into private pages,
 * so a dense request with the same prefix still hits them; a compacted request registers
 * nothing more (only the full pages it committed before its first compaction). The room
 * checks count slots, not tokens: a compacted request needs pages for what its sequence
 * holds, and an online budget's prefill at most its largest keep plus a page and a chunk.
 * Preemption recomputes a compacted request (its pages are not what their hashes name, so
 * no swap) and resets its budget's scores. A compaction that fails for want of pages keeps
 * every token (the request goes on uncompacted); online budgets try again after the next
 * step, and the snapkv family's once-only compaction is retried after each later step
 * (pgd_budget_apply) until it holds. pe_usage reports the method, the budget, the
 * slots dropped over the request's life and those its sequence held at the end.
 *
 * Threads: submit, cancel and stats may be called from any thread while one thread calls
 * step (and only that one: step, run_until_idle and destroy must not overlap). One mutex
 * guards the queues; the forward pass and the callbacks run without it. Every callback is
 * invoked on the stepping thread, so a callback must not call pe_sched_step, but may call
 * submit, cancel and stats.
 */
#ifndef PE_SCHEDULER_H
#define PE_SCHEDULER_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "sample.h"

typedef struct pe_sched pe_sched;

typedef struct pe_sched_params {
    const pe_model *model;   /* required: the model of ctx (vocabulary size, end-of-generation) */
    uint32_t max_running;    /* requests in the batch at once; default 16, at most 256 */
    uint32_t max_queued;     /* waiting requests; default 64; submit beyond: PGD_EBUSY */
    uint32_t step_tokens;    /* token budget per step; 0: the context's n_batch (also the cap) */
    uint32_t chunk;          /* max prefill tokens of one request per step; 0: step_tokens */
    int no_prefix_cache;     /* nonzero: no sharing at all. Never match cached pages, so every
                                prompt (and every recompute after preemption) goes through the
                                forward pass in full, and give each request a private tenant
                                (salt), so its pages are never deduplicated with another's:
                                identical prompts running at once hold that many times the
                                pages. Admission is plain FIFO. For A/B benches. */
    uint32_t max_wait_steps; /* aging bound: a request waiting more steps than this is
                                admitted next (see the admission order); 0: the default,
                                PE_SCHED_MAX_WAIT_STEPS */
} pe_sched_params;           /* append fields only */

/* The default aging bound, in steps (one admission round each). */
#define PE_SCHED_MAX_WAIT_STEPS 32

pe_sched_params pe_sched_default_params(void);

typedef struct pe_request_params {
    uint32_t max_tokens;       /* tokens to generate; 0: until the context is full */
    pe_sampler_params sampler; /* temp <= 0: greedy */
    const void *salt;          /* tenant (bytes, borrowed for the call); NULL: default */
    size_t salt_len;           /* tenants with different salts never share cache */
    int stop_on_eog;           /* nonzero: stop at an end-of-generation token (not sent) */
    /* The request's retention (cache.h, copied): set on its sequence at each admission
     * (pgd_seq_set_retention, the prompt's length for the pin budget). A pin the cache
     * refuses there (pin share full) is dropped and pe_usage.pin_refused says so; the
     * rest of the retention holds. NULL: the default. */
    const pgd_retention *retention;
    /* The request's token budget (budget.h, copied at submit; checked there: PGD_EINVAL for
     * params pgd_budget_params_check refuses). NULL: the context's (pe_ctx_params.budget);
     * method PGD_BUDGET_NONE: dense even when the context has a budget. */
    const pgd_budget_params *budget;
} pe_request_params;

pe_request_params pe_request_default_params(void);

typedef enum pe_finish {
    PE_FINISH_NONE = 0,      /* a token callback, not the end */
    PE_FINISH_LENGTH = 1,    /* max_tokens reached or the context full */
    PE_FINISH_EOG = 2,       /* end-of-generation token */
    PE_FINISH_CANCELLED = 3, /* pe_sched_cancel */
    PE_FINISH_ERROR = 4      /* does not fit the pool alone, or the forward pass failed:
                                pe_usage.status says which */
} pe_finish;

const char *pe_finish_name(pe_finish f);

typedef struct pe_usage {
    uint32_t prompt_tokens;     /* the submitted prompt */
    uint32_t cached_tokens;     /* of those, matched from the cache at first admission */
    uint32_t completion_tokens; /* tokens passed to the callback */
    int status;                 /* pgd_status: PGD_OK unless the finish is PE_FINISH_ERROR */
    /* cached_tokens by where they came from: the pool, and each tier of the context
     * (pe_ctx_params.tiers[i]; pgd_tier_name for its name); they add up to cached_tokens. */
    uint32_t cached_pool_tokens;
    uint32_t cached_tier_tokens[PGD_MAX_TIERS];
    uint32_t n_tiers;
    int pin_refused; /* the request asked for a pin and the cache refused it (pin share) */
    /* Its token budget: the method (PGD_BUDGET_NONE: dense), budget, the slots dropped by
     * compaction over the request's life and the slots its sequence held at the end. */
    pgd_budget_method kv_budget_method;
    uint32_t kv_budget;
    uint64_t kv_budget_dropped;
    uint32_t kv_slots;
} pe_usage;
/* pe_usage.status of a PE_FINISH_ERROR request: PGD_ENOSPC when its tokens (prompt plus
 * those generated so far) do not fit the pool even with no other request running;
 * otherwise the negative status pe_forward_batch returned for its batch (PGD_ENOMEM,
 * PGD_EINVAL, ...), which that pe_sched_step call also returns. Every other finish
 * reports PGD_OK. */

/* Called on the stepping thread, without the scheduler lock: once per generated token
 * (reason PE_FINISH_NONE, usage NULL), then exactly once with the finish reason, token -1
 * and the usage (borrowed for the call). After the final call the request is gone. */
typedef void (*pe_token_cb)(void *ud, uint64_t id, int32_t token, pe_finish reason,
                            const pe_usage *usage);

/* Creates a scheduler over ctx (borrowed; it must outlive the scheduler, and nothing else
 * may run forward passes on it meanwhile). Returns 0, PGD_EINVAL or PGD_ENOMEM. */
int pe_sched_create(pe_ctx *ctx, const pe_sched_params *p, pe_sched **out);
/* Destroys the scheduler: requests still queued or running are released without a final
 * callback. NULL: no-op. Must not overlap any other call. */
void pe_sched_destroy(pe_sched *s);

/* Queues prompt[0..n) (copied). *id gets the request id (ids start at 1). Any thread.
 * Returns 0; PGD_EBUSY (queue full); PGD_EINVAL (empty prompt, a token outside the
 * vocabulary, prompt longer than the context, bad sampler params, a budget that
 * pgd_budget_params_check refuses for the model's layers, a budget on a context without
 * scoring scratch (pe_ctx_params.budget_scores and budget none) or with contiguous_ref);
 * PGD_ENOMEM. */
int pe_sched_submit(pe_sched *s, const pe_request_params *rp, const int32_t *prompt, size_t n,
                    pe_token_cb cb, void *ud, uint64_t *id);

/* Cancels request id: a queued one is dropped, a running one's sequence is destroyed at
 * once (or, while a step is in flight, as soon as its forward pass returns). The final
 * callback (PE_FINISH_CANCELLED) comes from the next step. Any thread.
 * Returns 0 or PGD_ENOTFOUND (unknown or already finished). */
int pe_sched_cancel(pe_sched *s, uint64_t id);

/* Cancels every queued and running request, as pe_sched_cancel does each (server
 * shutdown). Any thread. Returns how many were cancelled. */
int pe_sched_cancel_all(pe_sched *s);

/* Runs one iteration (see the file comment). Returns the number of tokens that went
 * through the forward pass (0 when idle), or a negative pgd_status when the forward pass
 * failed other than by a full pool (the requests in that batch finish with ERROR).
 * One thread only. Cost: one pe_forward_batch plus O(waiting * ((running + waiting) *
 * prefix pages + max_queued + max_running)) per admission for the admission order. */
int pe_sched_step(pe_sched *s);

/* Steps until no request is queued or running (and every final callback was made).
 * Returns the total tokens processed, or the first negative status; PGD_ENOMEM when
 * requests wait but none can be admitted although nothing runs (no sequence could be
 * created), instead of looping forever. */
int64_t pe_sched_run_until_idle(pe_sched *s);

typedef struct pe_sched_stats {
    uint32_t n_running;
    uint32_t n_waiting;
    uint64_t n_preemptions;
    uint64_t n_prompt_tokens_computed; /* prefill tokens through the forward pass */
    uint64_t n_prompt_tokens_cached;   /* prefill tokens matched from the cache */
    uint64_t n_generated_tokens;       /* tokens sampled */
    uint64_t n_steps;                  /* steps that ran a forward pass */
    uint64_t n_preempt_swap;           /* preemptions that parked the pages in a tier */
    uint64_t n_preempt_recompute;      /* preemptions that dropped them (recomputed later) */
} pe_sched_stats;

/* Fills *out. Any thread. O(1). */
void pe_sched_get_stats(pe_sched *s, pe_sched_stats *out);

#endif /* PE_SCHEDULER_H */
