/* SPDX-License-Identifier: MIT */
/*
 * priority.c - TensorRT-LLM-style retention priorities with TTLs and next-use hints
 * (KVFlow, arXiv 2507.07400). Ops table: policy.h; retention: cache.h.
 *
 * Eviction order, first to go first:
 *   1. expired pages: expires_ns set and <= the clock at victim() time (a page whose
 *      expiry passed while it waited goes first), earliest expiry first, then the one
 *      released first, then the lower page id;
 *   2. lowest priority first (0..100);
 *   3. within a priority, a page with no hint (next_use_ns 0, or not after now_ns when it
 *      was released) before a hinted page, and among hinted pages the farthest next use
 *      first (Belady on the hints);
 *   4. then least recently released first (LRU);
 *   5. then the lower page id (a total order: victim() is deterministic).
 * A page's key (priority, hint, expiry, release order) is taken at unreferenced(), from
 * its info then, and stays fixed while it waits; only "expired" is evaluated at victim().
 *
 * Structure: two indexed heaps of the evictable pages (heap.h): the main one in the order
 * 2..5, key (priority x 2 + hinted, hinted ? ~next_use_ns : 0, release number), and one of
 * the pages with an expiry, key (expires_ns, release number). victim() looks at the expiry
 * heap only while its top has expired. O(log n) per operation. A third heap, parked,
 * holds the evictable pages a caller said are not leaves (below), with main's keys.
 *
 * Leaf-only: the cache merges a sequence's retention into every page it holds, so an
 * ancestor's priority is not below its descendants', its hint not later, and a release
 * goes deepest page first (older): the top is a leaf in practice. When it is not, the
 * heap's best-first search finds the first accepted page in the same order. A tier
 * breaks "in practice" (it holds whole chains, a parent demoted after its children, the
 * search walked the refused parents: 1.65 s for ram:3M on the Mooncake trace): callers
 * that know the tree say which pages are not leaves (leaf(), policy.h), and those wait
 * in a third heap, parked, with their main key, and go back when their last child
 * leaves. victim() searches the expiry heap (every page with an expiry, accept() checked
 * there: "expired" is rare and bounds the walk), then the main heap (the leaves), then
 * the parked one (only an accept() that allows a non-leaf finds anything there: the
 * tier map's cycle fallback). Same victims as without leaf(): accept() refuses parked
 * pages.
 */
#include "heap.h"

typedef struct prio {
    pgd__alloc al;
    uint32_t n;
    pgd_clock_fn clock; /* NULL: the latest now_ns seen (tests that give no clock) */
    void *clock_ud;
    uint64_t last_now_ns;
    uint64_t n_released;
    pgd__heap main;   /* the evictable pages, order 2..5 */
    pgd__heap exp;    /* the evictable pages with an expiry, earliest first */
    pgd__heap parked; /* the evictable non-leaves (leaf()), main's keys */
    uint8_t *nonleaf; /* [n] 1: leaf(id, 0) was the last word since insert / remove */
} prio;

static void prio_destroy(void *state)
{
    prio *p = state;
    if (!p) return;
    pgd__alloc al = p->al;
    pgd__heap_deinit(&p->main, &al);
    pgd__heap_deinit(&p->exp, &al);
    pgd__heap_deinit(&p->parked, &al);
    pgd__free(&al, p->nonleaf);
    pgd__free(&al, p);
}

static int prio_create(const pgd_policy_init *init, void **state)
{
    pgd__alloc a;
    pgd__alloc_init(&a, init->alloc);
    const pgd__alloc *al = &a;
    prio *p = pgd__calloc(al, 1, sizeof *p);
    *state = NULL;
    if (!p) return PGD_ENOMEM;
    p->al = a;
    p->n = init->n_pages;
    p->clock = init->clock;
    p->clock_ud = init->clock_ud;
    int rc = pgd__heap_init(&p->main, al, p->n);
    if (rc == PGD_OK) rc = pgd__heap_init(&p->exp, al, p->n);
    if (rc == PGD_OK) rc = pgd__heap_init(&p->parked, al, p->n);
    p->nonleaf = pgd__calloc(al, p->n ? p->n : 1, 1);
    if (rc != PGD_OK || !p->nonleaf) {
        prio_destroy(p);
        return PGD_ENOMEM;
    }
    *state = p;
    return PGD_OK;
}

static void prio_take(prio *p, uint32_t id)
{
    pgd__heap_remove(&p->main, id);
    pgd__heap_remove(&p->exp, id);
    pgd__heap_remove(&p->parked, id);
}

static int prio_in_set(const prio *p, uint32_t id)
{
    return pgd__heap_contains(&p->main, id) || pgd__heap_contains(&p->parked, id);
}

static void prio_insert(void *state, uint32_t id, const pgd_policy_page *info)
{
    prio *p = state;
    if (info->now_ns > p->last_now_ns) p->last_now_ns = info->now_ns;
    if (id < p->n) p->nonleaf[id] = 0; /* referenced when registered: not evictable yet */
}

static void prio_hit(void *state, uint32_t id, const pgd_policy_page *info)
{
    prio *p = state;
    if (info->now_ns > p->last_now_ns) p->last_now_ns = info->now_ns;
    prio_take(p, id);
}

static void prio_unreferenced(void *state, uint32_t id, const pgd_policy_page *info)
{
    prio *p = state;
    PGD_CHECK(id < p->n && !prio_in_set(p, id));
    if (info->now_ns > p->last_now_ns) p->last_now_ns = info->now_ns;
    uint64_t priority = info->priority > PGD_PRIORITY_MAX ? PGD_PRIORITY_MAX : info->priority;
    int hinted = info->next_use_ns != 0 && info->next_use_ns > info->now_ns;
    uint64_t seq = ++p->n_released;
    pgd__heap_push(p->nonleaf[id] ? &p->parked : &p->main, id, priority * 2 + (uint64_t)hinted,
                   hinted ? UINT64_MAX - info->next_use_ns : 0, seq);
    if (info->expires_ns) pgd__heap_push(&p->exp, id, info->expires_ns, seq, 0);
}

static uint32_t prio_victim(void *state, pgd_policy_accept_fn accept, void *ctx)
{
    prio *p = state;
    if (p->main.size + p->parked.size == 0) return PGD_POLICY_NO_PAGE;
    uint64_t now = p->clock ? p->clock(p->clock_ud) : p->last_now_ns;
    uint32_t v = pgd__heap_search(&p->exp, now, accept, ctx);
    if (v != PGD__NONE) return v;
    v = pgd__heap_search(&p->main, UINT64_MAX, accept, ctx);
    if (v != PGD__NONE) return v;
    return pgd__heap_search(&p->parked, UINT64_MAX, accept, ctx);
}

static void prio_remove(void *state, uint32_t id)
{
    prio *p = state;
    prio_take(p, id);
    if (id < p->n) p->nonleaf[id] = 0; /* a leaf again from its next insert */
}

static int prio_contains(const void *state, uint32_t id)
{
    const prio *p = state;
    return prio_in_set(p, id);
}

static uint32_t prio_size(const void *state)
{
    const prio *p = state;
    return p->main.size + p->parked.size;
}

/* Parks a non-leaf (or brings it back) with its main key; its expiry entry stays. */
static void prio_leaf(void *state, uint32_t id, int is_leaf)
{
    prio *p = state;
    if (id >= p->n || p->nonleaf[id] == !is_leaf) return;
    p->nonleaf[id] = (uint8_t)!is_leaf;
    if (is_leaf)
        pgd__heap_move(&p->parked, &p->main, id);
    else
        pgd__heap_move(&p->main, &p->parked, id);
}

const pgd_policy_ops pgd__policy_priority = {
    "priority",  prio_create, prio_destroy,  prio_insert, prio_hit,  prio_unreferenced,
    prio_victim, prio_remove, prio_contains, prio_size,   prio_leaf,
};
