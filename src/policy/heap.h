/* SPDX-License-Identifier: MIT */
/*
 * heap.h - an indexed binary heap of page ids for the ordered policies (cost.c,
 * priority.c), and the best-first search their victim() needs under the leaf-only rule.
 *
 *     ent[0] is the first page to evict; pos[id] is id's index in ent[] (PGD__NONE: absent)
 *
 * The order: an entry carries its key, three 64-bit words compared in turn (smaller
 * first), then the page id, so the order is total and a comparison touches only the
 * entry (the keys live in the heap array: against separate key arrays and a comparison
 * callback, 2-3x fewer ns/op on a 64K-page set; the throwaway loop of the cost commit).
 * A page's key does not change while it is in the heap (remove, push again).
 *
 * Search: the top may be a page accept() refuses (it has a cached child). The search
 * walks the heap best first (a second heap, aux[], of indices of ent[] ordered the same
 * way), so the first accepted page it meets is the first accepted page in the order:
 * O(k log k) for k refused pages before it, O(1) when the top is a leaf. A bound on k0
 * prunes the walk (priority.c: "expired at now", k0 = the expiry). A policy told which
 * pages are not leaves (policy.h leaf()) parks them in a second heap (pgd__heap_move) and
 * searches it only when the first has no accepted page: the top is then a leaf, O(1).
 * Every array is reserved at init (n pages); no operation allocates or fails.
 */
#ifndef PGD_POLICY_HEAP_H
#define PGD_POLICY_HEAP_H

#include "pgd_int.h"

#define PGD__HEAP_D 2 /* children per node (4: no faster on the cost loop) */

typedef struct pgd__heap_ent {
    uint64_t k0, k1, k2; /* the key, compared in this order */
    uint32_t id;         /* page id: the last tie-break */
} pgd__heap_ent;

typedef struct pgd__heap {
    uint32_t n, size;
    pgd__heap_ent *ent; /* [n] heap-ordered */
    uint32_t *pos;      /* [n] index in ent by page id, PGD__NONE if absent */
    uint32_t *aux;      /* [n] the search's own heap of indices into ent */
} pgd__heap;

/* Returns PGD_OK or PGD_ENOMEM (then pgd__heap_deinit is still safe). */
static inline int pgd__heap_init(pgd__heap *h, const pgd__alloc *al, uint32_t n)
{
    size_t m = n ? n : 1;
    h->n = n;
    h->size = 0;
    h->ent = pgd__malloc(al, m * sizeof *h->ent);
    h->pos = pgd__malloc(al, m * sizeof *h->pos);
    h->aux = pgd__malloc(al, m * sizeof *h->aux);
    if (!h->ent || !h->pos || !h->aux) return PGD_ENOMEM;
    for (uint32_t i = 0; i < n; i++)
        h->pos[i] = PGD__NONE;
    return PGD_OK;
}

static inline void pgd__heap_deinit(pgd__heap *h, const pgd__alloc *al)
{
    pgd__free(al, h->ent);
    pgd__free(al, h->pos);
    pgd__free(al, h->aux);
    h->ent = NULL;
    h->pos = h->aux = NULL;
}

static inline int pgd__heap_contains(const pgd__heap *h, uint32_t id)
{
    return id < h->n && h->pos[id] != PGD__NONE;
}

/* Returns non-zero if entry a goes before entry b. */
static inline int pgd__heap_before(const pgd__heap_ent *a, const pgd__heap_ent *b)
{
    if (a->k0 != b->k0) return a->k0 < b->k0;
    if (a->k1 != b->k1) return a->k1 < b->k1;
    if (a->k2 != b->k2) return a->k2 < b->k2;
    return a->id < b->id;
}

static inline void pgd__heap_place(pgd__heap *h, uint32_t i, const pgd__heap_ent *e)
{
    h->ent[i] = *e;
    h->pos[e->id] = i;
}

static inline void pgd__heap_sift_up(pgd__heap *h, uint32_t i)
{
    pgd__heap_ent e = h->ent[i];
    while (i > 0) {
        uint32_t p = (i - 1) / PGD__HEAP_D;
        if (!pgd__heap_before(&e, &h->ent[p])) break;
        pgd__heap_place(h, i, &h->ent[p]);
        i = p;
    }
    pgd__heap_place(h, i, &e);
}

static inline void pgd__heap_sift_down(pgd__heap *h, uint32_t i)
{
    pgd__heap_ent e = h->ent[i];
    for (;;) {
        uint32_t first = PGD__HEAP_D * i + 1, c = first;
        if (first >= h->size) break;
        uint32_t end = first + PGD__HEAP_D < h->size ? first + PGD__HEAP_D : h->size;
        for (uint32_t k = first + 1; k < end; k++)
            if (pgd__heap_before(&h->ent[k], &h->ent[c])) c = k;
        if (!pgd__heap_before(&h->ent[c], &e)) break;
        pgd__heap_place(h, i, &h->ent[c]);
        i = c;
    }
    pgd__heap_place(h, i, &e);
}

/* Adds id (absent, < n) with key (k0, k1, k2). O(log n). */
static inline void pgd__heap_push(pgd__heap *h, uint32_t id, uint64_t k0, uint64_t k1, uint64_t k2)
{
    PGD_CHECK(id < h->n && h->pos[id] == PGD__NONE);
    pgd__heap_ent e = {k0, k1, k2, id};
    pgd__heap_place(h, h->size++, &e);
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
    pgd__heap_place(h, i, &h->ent[h->size]);
    if (i > 0 && pgd__heap_before(&h->ent[i], &h->ent[(i - 1) / PGD__HEAP_D]))
        pgd__heap_sift_up(h, i);
    else
        pgd__heap_sift_down(h, i);
}

/* Moves id from heap `from` to heap `to` (same n) with the key it had; absent from
 * `from`: no-op. O(log n). The policies' leaf() parks a non-leaf this way. */
static inline void pgd__heap_move(pgd__heap *from, pgd__heap *to, uint32_t id)
{
    if (!pgd__heap_contains(from, id)) return;
    pgd__heap_ent e = from->ent[from->pos[id]];
    pgd__heap_remove(from, id);
    pgd__heap_push(to, id, e.k0, e.k1, e.k2);
}

/* aux[] holds indices into ent[], ordered as their entries. */
static inline void pgd__heap_aux_push(pgd__heap *h, uint32_t *n_aux, uint32_t idx)
{
    uint32_t i = (*n_aux)++;
    while (i > 0) {
        uint32_t p = (i - 1) / 2;
        if (!pgd__heap_before(&h->ent[idx], &h->ent[h->aux[p]])) break;
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
        if (c + 1 < *n_aux && pgd__heap_before(&h->ent[h->aux[c + 1]], &h->ent[h->aux[c]])) c++;
        if (!pgd__heap_before(&h->ent[h->aux[c]], &h->ent[last])) break;
        h->aux[i] = h->aux[c];
        i = c;
    }
    if (*n_aux) h->aux[i] = last;
    return top;
}

/* Returns the first page in the order whose k0 <= k0_max and that accept (NULL: always)
 * allows, or PGD__NONE. Changes nothing but the scratch. */
static inline uint32_t pgd__heap_search(pgd__heap *h, uint64_t k0_max, pgd_policy_accept_fn accept,
                                        void *actx)
{
    uint32_t n_aux = 0;
    if (h->size == 0 || h->ent[0].k0 > k0_max) return PGD__NONE;
    uint32_t top = h->ent[0].id;
    if (!accept || accept(actx, top)) return top; /* the usual case */
    pgd__heap_aux_push(h, &n_aux, 0);
    while (n_aux > 0) {
        uint32_t i = pgd__heap_aux_pop(h, &n_aux);
        if (h->ent[i].k0 > k0_max) continue; /* and its subtree: later in the order */
        if (i != 0 && accept(actx, h->ent[i].id)) return h->ent[i].id;
        for (uint32_t k = PGD__HEAP_D * i + 1; k <= PGD__HEAP_D * i + PGD__HEAP_D; k++)
            if (k < h->size) pgd__heap_aux_push(h, &n_aux, k);
    }
    return PGD__NONE;
}

#endif /* PGD_POLICY_HEAP_H */
