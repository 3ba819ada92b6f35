/* SPDX-License-Identifier: MIT */
/*
 * attn_int.h - what the files of src/attn/ share: the pool geometry as attention sees it,
 * one item's view of its sequence (page table, residual ring, dead slots), the source of a
 * page's K/V rows, Quest page selection, and the softmax step kernels. Internal to
 * libpagoda (tests include it to reach the ISA levels, bench_attn for its --wide hook).
 *
 *   ref.c      pgd_attn_run_ref: the scalar reference, the spec
 *   attn.c     pgd_attn_create/run: the planner, the work-item kernel, the merge
 *   softmax.c  the online-softmax step, the soft-cap and the scores' axpy, scalar / AVX2 /
 *              AVX-512
 *   common.c   geometry, item views, page sources, Quest selection (shared by both paths,
 *              so that both select the very same pages)
 */
#ifndef PGD_ATTN_INT_H
#define PGD_ATTN_INT_H

#include <stdint.h>

#include "codec/codec_int.h"
#include "pgd_int.h"
#include "pagoda/attn.h"

/* ---- geometry ---- */

typedef struct pgd__attn_geom {
    pgd_cache *top;   /* the cache the items' sequences belong to */
    pgd_cache *cache; /* the layer group being read: top, or its window group */
    pgd_pool *pool;   /* cache's pool */
    uint32_t n_layers, n_kv_heads, head_dim, page_tokens; /* n_layers: the model's (top's) */
    uint32_t n_head, group;                               /* query heads; query heads per KV head */
    pgd_kv_type type;
    const pgd__codec *codec; /* fast kernels (or the reference, for ref.c) */
    const pgd__codec *ring;  /* f16 codec for the residual ring of staged pools; else NULL */
    int rotate;              /* K/V stored rotated: rotate q, inverse-rotate out */
    uint64_t rotate_seed;
    int key_bounds; /* the pool keeps per-page channel min/max of keys */
} pgd__attn_geom;

/* Fills g for cache c and n_head query heads; ref != 0 takes the reference codecs.
 * Returns PGD_OK or PGD_EINVAL (n_head, no payload, unknown codec, select_pages without
 * key bounds or == 1). */
int pgd__attn_geom_init(pgd__attn_geom *g, pgd_cache *c, uint32_t n_head, uint32_t select_pages,
                        int ref);
/* Points g at the layer group holding model layer `layer` (cache.h "Window layers": both
 * groups have one geometry) and returns the layer's index in that group's pool. */
uint32_t pgd__attn_geom_layer(pgd__attn_geom *g, uint32_t layer);

/* Whether p's scale and softcap are valid (finite, >= 0); layer_window takes any values. */
int pgd__attn_gemma_ok(const pgd_attn_params *p);

/* ---- one item's view of its sequence ---- */

typedef struct pgd__attn_view {
    const uint32_t *pages; /* page table (borrowed, valid during the run) */
    uint64_t len;          /* sequence length; rows are positions len - n_rows .. len - 1 */
    uint32_t n_pages;      /* pages covering [0, len) */
    /* Residual ring of a staged pool (pgd__codec_staged), [n_layers][K|V][n_kv_heads][window]
     * [head_dim] f16; NULL if none */
    const uint16_t *ring;
    uint32_t window;  /* ring rows */
    uint64_t ring_lo; /* first page index whose ring copy is valid */
    /* Dead slots of a compacted sequence (pgd__seq_mask): for layer l and KV head h, slots
     * [n_live[l * n_kv_heads + h], mask_len) get weight 0; n_live NULL: none */
    const uint32_t *n_live;
    uint32_t mask_len;
} pgd__attn_view;

/* The dead slots [*d0, *d1) of (layer, kvh) in view v; returns 0 when there are none. */
static inline int pgd__attn_dead(const pgd__attn_geom *g, const pgd__attn_view *v, uint32_t layer,
                                 uint32_t kvh, uint32_t *d0, uint32_t *d1)
{
    if (!v->n_live) return 0;
    *d0 = v->n_live[(size_t)layer * g->n_kv_heads + kvh];
    *d1 = v->mask_len;
    return *d0 < *d1;
}

enum { PGD__NO_PAGE = 0xffffffffu };

/* The page that a query row at position pos reads from the ring: its own page, when the
 * view has a ring whose copy of it is valid; else PGD__NO_PAGE (every page from the pool).
 * The rule of pgd__seq_residual (pgd_int.h): it depends on positions only. */
static inline uint32_t pgd__attn_ring_page(const pgd__attn_geom *g, const pgd__attn_view *v,
                                           uint64_t pos)
{
    uint64_t pi = pos / g->page_tokens;
    return v->ring && pi >= v->ring_lo ? (uint32_t)pi : PGD__NO_PAGE;
}

/* Fills v for an item after checking it (seq, q, out non-NULL; n_rows <= length), with
 * the sequence's dead-slot mask. Returns PGD_OK or PGD_EINVAL. */
int pgd__attn_view_init(const pgd__attn_geom *g, const pgd_attn_item *it, pgd__attn_view *v);

/* Where the rows of page index pi of a view live for (layer, K|V, kv head), for query rows
 * that read page rpage from the ring (pgd__attn_ring_page): a region for codec *codec, of
 * *pt rows, whose page rows start at row *r0. */
static inline const void *pgd__attn_src(const pgd__attn_geom *g, const pgd__attn_view *v,
                                        uint32_t pi, uint32_t rpage, uint32_t layer,
                                        pgd__kv_kind kind, uint32_t kvh, const pgd__codec **codec,
                                        uint32_t *pt, uint32_t *r0)
{
    if (pi == rpage) {
        uint64_t p0 = (uint64_t)pi * g->page_tokens;
        *codec = g->ring;
        *pt = v->window;
        *r0 = (uint32_t)(p0 % v->window);
        return v->ring +
               ((((size_t)layer * 2 + kind) * g->n_kv_heads + kvh) * v->window) * g->head_dim;
    }
    *codec = g->codec;
    *pt = g->page_tokens;
    *r0 = 0;
    return kind == PGD__K ? pgd_pool_k(g->pool, v->pages[pi], layer, kvh)
                          : pgd_pool_v(g->pool, v->pages[pi], layer, kvh);
}

/* ---- Quest ---- */

/* The number of pages a decode row keeps under budget select_pages, out of n_pages. */
static inline uint32_t pgd__attn_n_selected(uint32_t n_pages, uint32_t select_pages)
{
    return select_pages && n_pages > select_pages ? select_pages : n_pages;
}

/* Selects the pages of a decode row (the view's last position) for KV head kvh: qr is the
 * group's query heads, rotated as the keys are ([group][head_dim]). Writes
 * pgd__attn_n_selected(v->n_pages, budget) page indices in increasing order to sel and
 * returns their number. heap is scratch of budget entries. Deterministic (scalar sums in a
 * fixed order), so the reference and the fast path select the same pages. */
uint32_t pgd__attn_select(const pgd__attn_geom *g, const pgd__attn_view *v, uint32_t layer,
                          uint32_t kvh, const float *qr, uint32_t budget, uint32_t *sel,
                          uint32_t *heap_page, float *heap_score);

/* ---- softmax step (softmax.c) ---- */

enum { PGD__ATTN_SCALAR = 0, PGD__ATTN_AVX2 = 1, PGD__ATTN_AVX512 = 2 };

/* One online-softmax step (see softmax.c): scores of one query over a block, s[0..nv) valid
 * of nb (nv >= 1), log2 domain. Updates *m, writes the weights in place (zeros past nv),
 * *sum = their sum; returns the factor 2^(m_old - m_new) for the running state. */
typedef float (*pgd__softmax_step_fn)(float *s, uint32_t nv, uint32_t nb, float *m, float *sum);

/* y[0..n) += c * x[0..n) (the sums of attention scores, attn.c). */
typedef void (*pgd__attn_axpy_fn)(float *restrict y, const float *restrict x, float c, uint32_t n);

/* s[0..n) <- cap * tanh(s[j] / cap) (gemma2's soft-cap, in the scores' log2 domain; cap > 0;
 * attn.c). */
typedef void (*pgd__attn_softcap_fn)(float *s, uint32_t n, float cap);

/* The CPU's best level. */
int pgd__attn_isa(void);
/* The step kernel at an ISA level, NULL when this CPU lacks it. */
pgd__softmax_step_fn pgd__attn_softmax_step(int isa);
/* The soft-cap at an ISA level, NULL when this CPU lacks it. */
pgd__attn_softcap_fn pgd__attn_softcap(int isa);
/* The axpy at an ISA level, NULL when this CPU lacks it. */
pgd__attn_axpy_fn pgd__attn_axpy(int isa);

/* Test / benchmark hook (bench_attn --isa): makes a pgd_attn use the scalar step and the
 * reference codec kernels (isa = PGD__ATTN_SCALAR), or a given step level with the codec
 * kernels of that level (PGD__ATTN_AVX2: the AVX2 tables, what an AVX2-only CPU runs;
 * PGD__ATTN_AVX512: the CPU's best, VNNI included). Returns PGD_OK or PGD_EINVAL (level not
 * available). */
int pgd__attn_force_isa(pgd_attn *a, int isa);

/* Benchmark hook: software prefetch. 0 none; 1 burst: the first 4 KiB (block codecs: all) of the
 * next page's K and of the current page's V before each page's K call; 2 (the default) spread: for
 * f32, f16 and bf16, the next page's K and V regions prefetched a share at a time between
 * row-chunked kernel calls for decode rows (attn.c, spread_k), otherwise as 1. */
void pgd__attn_set_prefetch(pgd_attn *a, int on);

/* Test / benchmark hook: KV heads per decode task (a decode row without a Quest selection).
 * 0, the default: the most the scratch allows (up to 16 heads, at most 64 query vectors)
 * for decode rows of at least 8192 keys, one head per task for shorter ones (attn.c). Such
 * a task reads each page's K regions of its heads, adjacent in the pool, one after the
 * other. n >= 1: n heads (at most that maximum) per task for every decode row; 1 gives one
 * task per (row, KV head). */
void pgd__attn_set_wide(pgd_attn *a, uint32_t n);

/* Test / benchmark hook: shared tiles (attn.c, "Shared prefix") on (the default, on != 0) or
 * off: with them off, every decode row reads its own pages, as before they existed. The
 * outputs are the same bits either way. */
void pgd__attn_set_shared(pgd_attn *a, int on);

/* Test / benchmark hook: counters since a's create. *page_reads: (page, KV head) K/V region
 * pairs the runs read (a page read once for the several rows of a tile counts once);
 * *shared_saved: the reads that shared tiles avoided (a shared page read once for n rows
 * saves n - 1). Without shared tiles the runs would have read page_reads + shared_saved. */
void pgd__attn_stats(const pgd_attn *a, uint64_t *page_reads, uint64_t *shared_saved);

/* Test hook: the plan of a's last run: work items queued, and how many of them are pieces
 * of split tasks. */
void pgd__attn_last_plan(const pgd_attn *a, uint32_t *n_pieces, uint32_t *n_split_pieces);

#endif /* PGD_ATTN_INT_H */
