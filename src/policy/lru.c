/* SPDX-License-Identifier: MIT */
/*
 * lru.c - least-recently-released first, O(1) per operation (ops table: policy.h).
 *
 *     head (oldest) <-> ... <-> tail (newest)      intrusive links in prev[]/next[]
 *
 * A page enters the list when it becomes evictable (unreferenced) and leaves it when a
 * match pins it again (hit) or it leaves the cache (remove). Because the cache releases
 * a sequence deepest page first, and any sequence holding a page also holds all of its
 * ancestors, an ancestor is always newer than its evictable descendants: the head is a
 * leaf of the prefix tree, and victim() is O(1) in practice (accept() is still honoured).
 */
#include "pgd_int.h"

typedef struct lru {
    pgd__alloc al;
    uint32_t n, size;
    uint32_t head, tail;
    uint32_t *prev, *next; /* [n] links, PGD__NONE at the ends */
    uint8_t *in;           /* [n] 1 if on the list */
} lru;

static void lru_destroy(void *state)
{
    lru *l = state;
    if (!l) return;
    pgd__alloc al = l->al;
    pgd__free(&al, l->prev);
    pgd__free(&al, l->next);
    pgd__free(&al, l->in);
    pgd__free(&al, l);
}

static int lru_create(const pgd_policy_init *init, void **state)
{
    pgd__alloc a;
    pgd__alloc_init(&a, init->alloc);
    const pgd__alloc *al = &a;
    uint32_t n = init->n_pages;
    lru *l = pgd__calloc(al, 1, sizeof *l);
    *state = NULL;
    if (!l) return PGD_ENOMEM;
    l->al = a;
    l->n = n;
    l->head = l->tail = PGD__NONE;
    l->prev = pgd__malloc(al, (size_t)n * sizeof *l->prev);
    l->next = pgd__malloc(al, (size_t)n * sizeof *l->next);
    l->in = pgd__calloc(al, n, 1);
    if (!l->prev || !l->next || !l->in) {
        lru_destroy(l);
        return PGD_ENOMEM;
    }
    *state = l;
    return PGD_OK;
}

static void unlink_id(lru *l, uint32_t id)
{
    if (!l->in[id]) return;
    uint32_t p = l->prev[id], n = l->next[id];
    if (p != PGD__NONE)
        l->next[p] = n;
    else
        l->head = n;
    if (n != PGD__NONE)
        l->prev[n] = p;
    else
        l->tail = p;
    l->in[id] = 0;
    l->size--;
}

static void lru_insert(void *state, uint32_t id, const pgd_policy_page *info)
{
    (void)state, (void)id, (void)info; /* referenced when registered: not evictable yet */
}

static void lru_hit(void *state, uint32_t id, const pgd_policy_page *info)
{
    (void)info;
    unlink_id(state, id);
}

static void lru_unreferenced(void *state, uint32_t id, const pgd_policy_page *info)
{
    lru *l = state;
    (void)info;
    PGD_CHECK(id < l->n && !l->in[id]);
    l->prev[id] = l->tail;
    l->next[id] = PGD__NONE;
    if (l->tail != PGD__NONE)
        l->next[l->tail] = id;
    else
        l->head = id;
    l->tail = id;
    l->in[id] = 1;
    l->size++;
}

static uint32_t lru_victim(void *state, pgd_policy_accept_fn accept, void *ctx)
{
    lru *l = state;
    for (uint32_t id = l->head; id != PGD__NONE; id = l->next[id])
        if (!accept || accept(ctx, id)) return id;
    return PGD_POLICY_NO_PAGE;
}

static void lru_remove(void *state, uint32_t id)
{
    unlink_id(state, id);
}

static int lru_contains(const void *state, uint32_t id)
{
    const lru *l = state;
    return id < l->n && l->in[id];
}

static uint32_t lru_size(const void *state)
{
    return ((const lru *)state)->size;
}

const pgd_policy_ops pgd__policy_lru = {
    "lru",      lru_create, lru_destroy,  lru_insert, lru_hit, lru_unreferenced,
    lru_victim, lru_remove, lru_contains, lru_size,   NULL,
};
