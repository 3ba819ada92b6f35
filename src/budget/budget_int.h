/* SPDX-License-Identifier: MIT */
/*
 * budget_int.h - the token-budget methods' ops table (one file per method in src/budget/,
 * registered in budget.c) and the selection helpers they share.
 *
 * A method's select works on one layer: for each KV head it sees a "view" of the head's
 * live tokens, numbered 0 .. m-1 in slot order (a compacted sequence's dead slots
 * [n_live, mask_len) are skipped: they are never kept), and writes the kept tokens' slots,
 * ascending, to keep[h * max_keep ..]. Helpers:
 *
 *   view     the live tokens of head h (slot = i, or i + gap past the gap)
 *   gather   the view's scores into a dense array (NaN read as -inf)
 *   pool     max-pool a dense array over keys (centered kernel, clipped at the ends)
 *   top      the k best of a dense array's range (a bounded heap: O(n log k))
 *   emit     sinks + picks + window of a view as ascending slots
 *
 * Ranking everywhere: the higher score first; for pooled scores (the snapkv family) the
 * higher raw score among equal pooled ones (a max-pool makes plateaus around each peak:
 * the peak itself goes first); then the older token (lower index), then (adakv, across
 * heads) the lower head.
 */
#ifndef PGD_BUDGET_INT_H
#define PGD_BUDGET_INT_H

#include <stddef.h>
#include <stdint.h>

#include "pgd_int.h"
#include "pagoda/budget.h"

/* What feeds a method's scores (pgd_budget_begin's rows). */
typedef enum pgd__budget_feed {
    PGD__FEED_NONE = 0, /* no scores (streaming) */
    PGD__FEED_ALL,      /* every row of every step, accumulated (h2o) */
    PGD__FEED_LAST,     /* the last row of each step, the buffer zeroed at begin (tova) */
    PGD__FEED_OBS       /* the prompt's last obs_window rows, accumulated (snapkv family) */
} pgd__budget_feed;

/* Growable scratch of a selection, through al. */
typedef struct pgd__budget_scratch {
    const pgd__alloc *al;
    float *dense;  /* [cap] a head's view scores */
    float *pooled; /* [cap] */
    uint32_t *dq;  /* [cap] the pooling deque */
    size_t cap;
    struct pgd__budget_ent *ents; /* [n_ents] heap entries */
    size_t n_ents;
    uint32_t *picks; /* [n_picks] */
    size_t n_picks;
} pgd__budget_scratch;

typedef struct pgd__budget_ent {
    float s;
    float r;    /* the raw score (pooled methods), ranks ties of s */
    uint32_t i; /* token (view index) */
    uint32_t h; /* head (adakv) */
} pgd__budget_ent;

/* One layer's selection problem. */
typedef struct pgd__budget_sel {
    const pgd_budget_params *p;
    uint32_t budget; /* this layer's per-head budget (pgd_budget_layer_budget) */
    uint32_t n_kv_heads;
    uint32_t n_keys;     /* slots of the layer */
    const float *scores; /* [n_kv_heads][ld] slot-indexed; NULL for streaming */
    size_t ld;
    uint32_t mask_len;      /* dead slots of head h: [n_live[h], mask_len); 0: none */
    const uint32_t *n_live; /* [n_kv_heads] this layer's, NULL: none */
    uint32_t *keep;         /* [n_kv_heads][max_keep] out */
    uint32_t max_keep;
    uint32_t *n_keep; /* [n_kv_heads] out */
    pgd__budget_scratch *scr;
} pgd__budget_sel;

typedef struct pgd__budget_ops {
    const char *name;
    pgd__budget_feed feed;
    int online; /* the default of params.online -1 */
    int pooled; /* scores max-pooled (pool_kernel) before ranking: the snapkv family */
    /* Selects one layer. Returns PGD_OK or PGD_ENOMEM (scratch). */
    int (*select)(const pgd__budget_sel *sel);
} pgd__budget_ops;

extern const pgd__budget_ops pgd__budget_streaming;
extern const pgd__budget_ops pgd__budget_h2o;
extern const pgd__budget_ops pgd__budget_tova;
extern const pgd__budget_ops pgd__budget_snapkv;
extern const pgd__budget_ops pgd__budget_pyramidkv;
extern const pgd__budget_ops pgd__budget_adakv;

/* The ops of method m; NULL for none and out of range. */
const pgd__budget_ops *pgd__budget_ops_get(pgd_budget_method m);

/* The most tokens one head of a layer of budget `budget` may keep under p (adakv: its cap,
 * else budget). */
uint32_t pgd__budget_head_max(const pgd_budget_params *p, uint32_t budget);

/* ---- helpers (budget.c) ---- */

/* The live tokens of one head: view index i is slot i below nl, slot i + gap from nl. */
typedef struct pgd__budget_view {
    const float *sc; /* slot-indexed scores, NULL: none */
    uint32_t nl, gap;
    uint32_t m; /* live tokens */
} pgd__budget_view;

void pgd__budget_view_get(const pgd__budget_sel *sel, uint32_t h, pgd__budget_view *v);

/* Makes scr hold n dense floats (and the pooling arrays). PGD_OK or PGD_ENOMEM. */
int pgd__budget_scratch_reserve(pgd__budget_scratch *scr, size_t n, size_t n_ents, size_t n_picks);
void pgd__budget_scratch_deinit(pgd__budget_scratch *scr);

/* scr->dense[0..m) = the view's scores (NaN -> -inf). Reserve m first. */
void pgd__budget_gather(pgd__budget_scratch *scr, const pgd__budget_view *v);
/* out[j] = max of in[i] over i in [j - kernel/2, j + kernel/2] clipped to [0, n): O(n). dq
 * holds n indices. */
void pgd__budget_pool(const float *in, uint32_t n, uint32_t kernel, uint32_t *dq, float *out);
/* The k best of s[lo, hi) (k <= hi - lo) into ents[0..k) (score desc, then raw desc when
 * raw != NULL, then older first): best first when ranked, else in heap order (callers that
 * sort the picks by index skip the k log k heapsort). O((hi - lo) log k). */
void pgd__budget_top(const float *s, const float *raw, uint32_t lo, uint32_t hi, uint32_t k,
                     uint32_t head, int ranked, pgd__budget_ent *ents);
/* The k best of s[lo, hi) as ascending indices in picks[0..k); returns k. When k is more
 * than half the range, finds the worst hi - lo - k instead (O((hi - lo) log (hi - lo - k))
 * and no sort), marking them in mark[lo, hi). ents holds min(k, hi - lo - k) entries. */
uint32_t pgd__budget_top_ascending(const float *s, const float *raw, uint32_t lo, uint32_t hi,
                                   uint32_t k, uint32_t *mark, pgd__budget_ent *ents,
                                   uint32_t *picks);
/* Sorts ents[0..n) best first (score desc, raw desc, older token, lower head). */
void pgd__budget_rank(pgd__budget_ent *ents, size_t n);
/* Sorts u[0..n) ascending. */
void pgd__budget_sort_u32(uint32_t *u, size_t n);
/* Writes the view's sinks [0, sinks), picks[0..n_picks) (view indices in [sinks, m - window),
 * ascending) and window [m - window, m) as slots to out; returns the count. */
uint32_t pgd__budget_emit(const pgd__budget_view *v, uint32_t sinks, const uint32_t *picks,
                          uint32_t n_picks, uint32_t window, uint32_t *out);
/* The view's whole live set as slots to out; returns m. */
uint32_t pgd__budget_emit_all(const pgd__budget_view *v, uint32_t *out);

/* The uniform selection most methods share: each head keeps min(m, budget): sinks, window
 * and the top (budget - sinks - window) of [sinks, m - window) by the view's scores,
 * max-pooled over [0, m - window) first when pooled. PGD_OK or PGD_ENOMEM. */
int pgd__budget_select_uniform(const pgd__budget_sel *sel, int pooled);

#endif /* PGD_BUDGET_INT_H */
