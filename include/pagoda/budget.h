/* SPDX-License-Identifier: MIT */
/*
 * budget.h - token budgets on the paged cache: a sequence keeps at most a budget of tokens
 * per (layer, KV head), chosen by a method from the attention scores the kernels already
 * compute, and the kept tokens are compacted into fewer pages (pgd_seq_compact, cache.h),
 * so the budget is real memory.
 *
 *   streaming  attention sinks (the first `sinks` tokens) + a window of the newest tokens
 *              (StreamingLLM); needs no scores
 *   h2o        heavy hitters: the tokens of highest accumulated attention mass (every query
 *              row of every step so far) + a window of the newest (H2O)
 *   tova       the tokens of highest attention from the current query (the last row of the
 *              latest step) (TOVA)
 *   snapkv     at the end of the prompt: the prompt's last obs_window rows score every
 *              earlier token; the scores are max-pooled over keys (pool_kernel wide) and
 *              each head keeps the window + its top tokens (SnapKV)
 *   pyramidkv  snapkv's scoring with layer budgets that shrink linearly from the lowest
 *              layer to the highest (PyramidKV)
 *   adakv      snapkv's scoring with one layer's budget shared between its heads by their
 *              scores (Ada-KV): the layer's top tokens over all heads, after each head got
 *              a floor share
 *
 * Every method works per (layer, KV head); scores are the softmax probabilities of the
 * attention run (pgd_attn_run_scored, attn.h), summed over the query heads of the KV
 * head's GQA group and over the scored rows. They never cost a second pass over K.
 *
 * The budget. params.budget is the MEAN number of tokens a (layer, KV head) keeps, as in
 * the papers (the kept KV entries are budget x n_layers x n_kv_heads). streaming, h2o, tova
 * and snapkv keep exactly the budget in every (layer, head), so the sequence holds budget
 * slots: ceil(budget / page_tokens) pages, plus the tokens added since. pyramidkv and adakv
 * move budget between layers or heads; a sequence's slots are the MAX over its (layer, head)
 * of what they keep (pages hold every layer and head: a (layer, head) that keeps fewer leaves
 * dead rows, which attention skips), so they hold up to (2 - pyramid_min) x budget and
 * adakv_cap x budget slots. For a hard memory bound, use the uniform methods.
 *
 * When a budget is enforced. "Online" methods (streaming, h2o, tova by default) enforce it
 * after every step, prefill chunks and decode tokens alike, at page granularity: a
 * sequence is compacted when it holds a page_tokens more slots than the budget allows, so it
 * holds between the budget and budget + page_tokens - 1 slots (one compaction every
 * page_tokens decode steps). The snapkv family compresses once, when the step that ends
 * the prompt has run; decoding then adds tokens to the kept set. online overrides either.
 *
 * Prefix caching: the pages a sequence committed before its first compaction stay in the
 * prefix index untouched (compaction writes private copies, cache.h); a compacted sequence
 * registers nothing more.
 *
 * Use: one pgd_budget per sequence (the engine's scheduler creates it at admission).
 * Per forward step of an item:
 *
 *   rows = pgd_budget_begin(b, s, n_rows, prompt_left)       before the step
 *   per layer l: pgd_attn_scores {pgd_budget_scores(b, l), rows, pgd_budget_score_ld(b)}
 *                for the item in pgd_attn_run_scored
 *   dropped = pgd_budget_end(b, s)                           after the step's commit
 *
 * and the engine adds pgd_seq_n_dropped(s) to a slot to get the token's position (RoPE).
 * Thread-safety: a pgd_budget is used by one thread at a time (its sequence's stepper).
 */
#ifndef PAGODA_BUDGET_H
#define PAGODA_BUDGET_H

#include "cache.h"
#include "pagoda.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pgd_budget_method {
    PGD_BUDGET_NONE = 0, /* dense: no budget */
    PGD_BUDGET_STREAMING,
    PGD_BUDGET_H2O,
    PGD_BUDGET_TOVA,
    PGD_BUDGET_SNAPKV,
    PGD_BUDGET_PYRAMIDKV,
    PGD_BUDGET_ADAKV,
    PGD_BUDGET_COUNT
} pgd_budget_method;

/* "none", "streaming", "h2o", "tova", "snapkv", "pyramidkv", "adakv"; NULL if out of range. */
PGD_API const char *pgd_budget_method_name(pgd_budget_method m);
/* Parses a name above (exact, lower case). Returns PGD_OK or PGD_EINVAL. */
PGD_API int pgd_budget_method_parse(const char *name, pgd_budget_method *out);

typedef struct pgd_budget_params {
    pgd_budget_method method;
    uint32_t budget;      /* mean tokens kept per (layer, KV head), >= 1 (see above) */
    uint32_t sinks;       /* the first tokens every head keeps (streaming: 4; others 0) */
    uint32_t window;      /* the newest tokens every head keeps: streaming budget - sinks,
                             h2o budget / 2, tova 1, the snapkv family obs_window (budget - 1
                             when budget <= obs_window); at most budget - sinks (streaming
                             keeps the newest budget - sinks whatever window says) */
    uint32_t obs_window;  /* snapkv family: the prompt's last rows that score (32) */
    uint32_t pool_kernel; /* snapkv family: max-pool width over keys, odd (5; 1: none) */
    float pyramid_min;    /* pyramidkv: the top layer's budget / budget, in (0, 1] (0.5:
                             layers from 1.5 x budget down to 0.5 x budget) */
    float adakv_floor;    /* adakv: share of a head's even share it keeps whatever its
                             scores, in [0, 1] (0.2) */
    float adakv_cap;      /* adakv: most tokens of one head, as a multiple of its layer's
                             budget, >= 1 (2) */
    int online;           /* enforce after every step (1) or once at the prompt's end (0);
                             -1: the method's default (streaming, h2o, tova: 1) */
} pgd_budget_params;      /* append fields only */

/* The defaults of method m at budget tokens (the values in brackets above, window filled
 * in for the method, online -1). */
PGD_API pgd_budget_params pgd_budget_default_params(pgd_budget_method m, uint32_t budget);

/* Checks p for a model of n_layers layers: budget in [1, 2^22], sinks + window <= budget,
 * obs_window >= 1 and pool_kernel odd in [1, 255] (snapkv family), pyramid_min in (0, 1],
 * adakv_floor in [0, 1], adakv_cap in [1, 64], online in {-1, 0, 1}; method none is always
 * valid. PGD_OK, or PGD_EINVAL with one line in why (when why != NULL) naming the bad field
 * and its rule, e.g. "kv_budget 0: must be at least 1". */
PGD_API int pgd_budget_params_check(const pgd_budget_params *p, uint32_t n_layers, char *why,
                                    size_t why_len);

/* The budget of one layer: budget, except pyramidkv (linear from (2 - pyramid_min) x budget
 * at layer 0 to pyramid_min x budget at layer n_layers - 1, at least sinks + window + 1),
 * rounded to a whole token. */
PGD_API uint32_t pgd_budget_layer_budget(const pgd_budget_params *p, uint32_t layer,
                                         uint32_t n_layers);

/* The selection, a pure function (what pgd_budget_end runs per layer; tests call it):
 * n_keys tokens of one layer, scores[h * ld + j] the score of token j for KV head h
 * (NULL for streaming), window protection counted from n_keys. Writes for each head h the
 * kept token indices, ascending, to keep[h * max_keep ..] and their number to n_keep[h]
 * (every head keeps min(n_keys, its budget)). max_keep must be at least the largest count
 * a head may get (layer budget, or adakv_cap x layer budget). Ties: the older token.
 * Returns the largest n_keep over heads, or PGD_EINVAL. */
/* In detail (B = the layer's budget, S = sinks, W = window; a head of n <= B tokens keeps
 * them all; "top k of a range" ranks by the higher score, then the older token):
 *   streaming  [0, S) and [n - (B - S), n)
 *   h2o, tova  [0, S), [n - W, n), and the top B - S - W of [S, n - W) by the raw scores
 *   snapkv     the same, ranked by the scores max-pooled over keys [0, n - W) with a
 *              centered kernel of pool_kernel, clipped at the ends of that range; equal
 *              pooled scores rank by the raw score first (the peak of a pooled plateau
 *              before its neighbours), then the older token
 *   pyramidkv  snapkv with B = pgd_budget_layer_budget(p, layer, n_layers)
 *   adakv      the layer keeps B x n_kv_heads in all (when every head has n > B): each head
 *              its S and W and the top min(floor(adakv_floor x B), B - S - W) pooled
 *              scores of [S, n - W); the rest of the total to the best pooled scores left
 *              over all heads (ties: raw score, older token, then lower head), a head
 *              holding at most max(B, floor(adakv_cap x B)) tokens (max_keep must cover
 *              that).
 * Cost: O(n log k) per head (a bounded heap; pooling O(n)); scratch through libc. Pure and
 * thread-safe. */
PGD_API int pgd_budget_select(const pgd_budget_params *p, uint32_t layer, uint32_t n_layers,
                              uint32_t n_kv_heads, uint64_t n_keys, const float *scores, size_t ld,
                              uint32_t *keep, uint32_t max_keep, uint32_t *n_keep);

typedef struct pgd_budget pgd_budget; /* one sequence's budget state */

/* Creates the state for sequences of cache c under params p (copied; checked as by
 * pgd_budget_params_check). Returns PGD_OK, PGD_EINVAL, PGD_ENOMEM. */
PGD_API int pgd_budget_create(pgd_cache *c, const pgd_budget_params *p, pgd_budget **out);
/* Destroys b. NULL: no-op. */
PGD_API void pgd_budget_destroy(pgd_budget *b);
/* Forgets the scores (a sequence reused from empty, or recomputed after preemption). */
PGD_API void pgd_budget_reset(pgd_budget *b);
PGD_API const pgd_budget_params *pgd_budget_get_params(const pgd_budget *b);

/* Before a step of n_rows rows of s. prompt_left: the prompt tokens not yet run, counting
 * this step's rows (a prefill chunk: >= n_rows; the chunk that ends the prompt: == n_rows;
 * a decode step: 0). Makes the score buffers cover the sequence's length + n_rows and
 * returns how many of the step's last rows feed the scores (pgd_attn_scores.rows; 0:
 * this step needs none), or a negative status (PGD_ENOMEM, PGD_EINVAL for NULLs). tova's
 * buffers are zeroed here. The rows: streaming 0; h2o n_rows (accumulated); tova 1 (the
 * last row of every step); the snapkv family the step's rows among the prompt's last
 * obs_window, min(n_rows, obs_window - (prompt_left - n_rows)) when prompt_left - n_rows <
 * obs_window, else 0 (decode steps: 0). The buffers grow geometrically (data moved to the
 * new ld); the scores of slots at or past the sequence's length are 0. */
PGD_API int pgd_budget_begin(pgd_budget *b, pgd_seq *s, uint32_t n_rows, uint64_t prompt_left);
/* The score accumulator of layer for the step begun: [n_kv_heads][pgd_budget_score_ld(b)];
 * valid until the next begin or end. */
PGD_API float *pgd_budget_scores(pgd_budget *b, uint32_t layer);
PGD_API size_t pgd_budget_score_ld(const pgd_budget *b);
/* After the step (its K/V written and committed): enforces the budget when due (online, or
 * the prompt's end), compacting s and the scores. Returns the tokens dropped (0: nothing
 * due) or a negative status from pgd_seq_compact (s unchanged). Due: online, when the
 * sequence holds >= page_tokens more slots than the most a head may keep (the largest layer
 * budget; adakv: its cap); not online, when the step begun ended the prompt
 * (prompt_left == n_rows). */
PGD_API int64_t pgd_budget_end(pgd_budget *b, pgd_seq *s);
/* Enforces the budget on s now (whatever the phase) with the scores gathered so far.
 * Every layer is selected (pgd_budget_select, dead slots of a compacted sequence never
 * kept), s is compacted to n_out = the largest count (pgd_seq_compact with the per-(layer,
 * head) counts as n_live) and each kept token's score moves with it (h2o's accumulation
 * goes on over the kept set). Nothing happens when no head would drop a live token (a
 * sequence no longer than every layer's budget). Returns the slots dropped (length -
 * n_out: 0 also when only smaller heads dropped, pyramidkv / adakv) or a negative status
 * (PGD_ENOMEM, or pgd_seq_compact's; s and the scores unchanged). */
PGD_API int64_t pgd_budget_apply(pgd_budget *b, pgd_seq *s);

typedef struct pgd_budget_stats {
    uint64_t compactions;    /* times s was compacted */
    uint64_t dropped_tokens; /* slots dropped by them */
    uint64_t freed_pages;    /* pages the sequence held less after them */
    uint32_t max_keep;       /* the slots the last compaction kept */
} pgd_budget_stats;
PGD_API void pgd_budget_get_stats(const pgd_budget *b, pgd_budget_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* PAGODA_BUDGET_H */
