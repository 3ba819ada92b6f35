/* SPDX-License-Identifier: MIT */
/*
 * heap.h - an indexed binary heap of page ids for the ordered policies (cost.c,
 * priority.c), and the best-first search their victim() needs under the leaf-only rule.
 *
 *     ids[0] is the first page to evict; pos[id] is id's index in ids[] (PGD__NONE: absent)
 *
 * The order is the policy's: before(ctx, a, b) returns non-zero if a goes before b; it
 * must be a strict total order (end every comparison with the page ids) and the keys
 * must not change while a page is in the heap (remove, change, push again).
 *
 * Search: the top may be a page accept() refuses (it has a cached child). The search
 * walks the heap best first (a second heap, aux[], of indices of ids[] ordered the same
 * way), so the first accepted page it meets is the first accepted page in the order:
 * O(k log k) for k refused pages before it, O(1) when the top is a leaf. A keep()
 * predicate that is monotone along the order (false for a page means false for every
 * later page) prunes the walk (priority.c: "expired at now").
 * Every array is reserved at init (n pages); no operation allocates or fails.
 */
#ifndef PGD_POLICY_HEAP_H
#define PGD_POLICY_HEAP_H

#include "pgd_int.h"

typedef int (*pgd__heap_before_fn)(const void *ctx, uint32_t a, uint32_t b);
typedef int (*pgd__heap_keep_fn)(const void *ctx, uint32_t id);

typedef struct pgd__heap {
    uint32_t n, size;
    uint32_t *ids; /* [n] page ids, heap-ordered */
    uint32_t *pos; /* [n] index in ids, PGD__NONE if absent */
    uint32_t *aux; /* [n] the search's own heap of indices into ids */
    pgd__heap_before_fn before;
    const void *ctx;
} pgd__heap;

/* Returns PGD_OK or PGD_ENOMEM (then pgd__heap_deinit is still safe). */
static inline int pgd__heap_init(pgd__heap *h, const pgd__alloc *al, uint32_t n,
                                 pgd__heap_before_fn before, const void *ctx)
{
    h->n = n;
    h->size = 0;
    h->before = before;
    h->ctx = ctx;
    h->ids = pgd__malloc(al, (size_t)(n ? n : 1) * sizeof *h->ids);
    h->pos = pgd__malloc(al, (size_t)(n ? n : 1) * sizeof *h->pos);
    h->aux = pgd__malloc(al, (size_t)(n ? n : 1) * sizeof *h->aux);
    if (!h->ids || !h->pos || !h->aux) return PGD_ENOMEM;
    for (uint32_t i = 0; i < n; i++)
        h->pos[i] = PGD__NONE;
    return PGD_OK;
}

static inline void pgd__heap_deinit(pgd__heap *h, const pgd__alloc *al)
{
    pgd__free(al, h->ids);
    pgd__free(al, h->pos);
    pgd__free(al, h->aux);
    h->ids = h->pos = h->aux = NULL;
}

static inline int pgd__heap_contains(const pgd__heap *h, uint32_t id)
{
    return id < h->n && h->pos[id] != PGD__NONE;
}

static inline void pgd__heap_place(pgd__heap *h, uint32_t i, uint32_t id)
{
    h->ids[i] = id;
    h->pos[id] = i;
}

static inline void pgd__heap_sift_up(pgd__heap *h, uint32_t i)
{
    uint32_t id = h->ids[i];
    while (i > 0) {
        uint32_t p = (i - 1) / 2;
        if (!h->before(h->ctx, id, h->ids[p])) break;
        pgd__heap_place(h, i, h->ids[p]);
        i = p;
    }
    pgd__heap_place(h, i, id);
}

static inline void pgd__heap_sift_down(pgd__heap *h, uint32_t i)
{
    uint32_t id = h->ids[i];
    for (;;) {
        uint32_t c = 2 * i + 1;
        if (c >= h->size) break;
        if (c + 1 < h->size && h->before(h->ctx, h->ids[c + 1], h->ids[c])) c++;
        if (!h->before(h->ctx, h->ids[c], id)) break;
        pgd__heap_place(h, i, h->ids[c]);
        i = c;
    }
    pgd__heap_place(h, i, id);
}

/* Adds id (absent, < n) with its current key. O(log n). */
static inline void pgd__heap_push(pgd__heap *h, uint32_t id)
{
    PGD_CHECK(id < h->n && h->pos[id] == PGD__NONE);
    pgd__heap_place(h, h->size++, id);
    pgd__heap_sift_up(h, h->size - 1);
}

/* Removes id; absent: no-op. O(log n). */
static inline void pgd__heap_remove(pgd__heap *h, uint32_t id)
{
    if (!pgd__heap_contains(h, id)) return;
    uint32_t i = h->pos[id];
    h->pos[id] = PGD__NONE;
    h->size--;
    if (i == h->size) return;
    uint32_t moved = h->ids[h->size];
    pgd__heap_place(h, i, moved);
    pgd__heap_sift_down(h, i);
    pgd__heap_sift_up(h, h->pos[moved]);
}

/* aux[] holds indices into ids[]; a is before b if ids[a] is before ids[b]. */
static inline int pgd__heap_aux_before(const pgd__heap *h, uint32_t a, uint32_t b)
{
    return h->before(h->ctx, h->ids[a], h->ids[b]);
}

static inline void pgd__heap_aux_push(pgd__heap *h, uint32_t *n_aux, uint32_t idx)
{
    uint32_t i = (*n_aux)++;
    while (i > 0) {
        uint32_t p = (i - 1) / 2;
        if (!pgd__heap_aux_before(h, idx, h->aux[p])) break;
        h->aux[i] = h->aux[p];
        i = p;
    }
    h->aux[i] = idx;
}

static inline uint32_t pgd__heap_aux_pop(pgd__heap *h, uint32_t *n_aux)
{
    uint32_t top = h->aux[0], last = h->aux[--*n_aux], i = 0;
    for (;;) {
        uint32_t c = 2 * i + 1;
        if (c >= *n_aux) break;
        if (c + 1 < *n_aux && pgd__heap_aux_before(h, h->aux[c + 1], h->aux[c])) c++;
        if (!pgd__heap_aux_before(h, h->aux[c], last)) break;
        h->aux[i] = h->aux[c];
        i = c;
    }
    if (*n_aux) h->aux[i] = last;
    return top;
}

/* Returns the first page in the order for which keep (NULL: always) and accept (NULL:
 * always) hold, or PGD__NONE. Changes nothing but the scratch. */
static inline uint32_t pgd__heap_search(pgd__heap *h, pgd__heap_keep_fn keep, const void *kctx,
                                        pgd_policy_accept_fn accept, void *actx)
{
    uint32_t n_aux = 0;
    if (h->size == 0) return PGD__NONE;
    uint32_t top = h->ids[0];
    if (keep && !keep(kctx, top)) return PGD__NONE;
    if (!accept || accept(actx, top)) return top; /* the usual case */
    pgd__heap_aux_push(h, &n_aux, 0);
    while (n_aux > 0) {
        uint32_t i = pgd__heap_aux_pop(h, &n_aux);
        uint32_t id = h->ids[i];
        if (keep && !keep(kctx, id)) continue; /* and its subtree: later in the order */
        if (i != 0 && accept(actx, id)) return id;
        if (2 * i + 1 < h->size) pgd__heap_aux_push(h, &n_aux, 2 * i + 1);
        if (2 * i + 2 < h->size) pgd__heap_aux_push(h, &n_aux, 2 * i + 2);
    }
    return PGD__NONE;
}

#endif /* PGD_POLICY_HEAP_H */
