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
 * heap only while its top has expired. O(log n) per operation.
 *
 * Leaf-only: the cache merges a sequence's retention into every page it holds, so an
 * ancestor's priority is not below its descendants', its hint not later, and a release
 * goes deepest page first (older): the top is a leaf in practice. When it is not, the
 * heap's best-first search finds the first accepted page in the same order.
 */
#include "heap.h"

typedef struct prio {
    pgd__alloc al;
    uint32_t n;
    pgd_clock_fn clock; /* NULL: the latest now_ns seen (tests that give no clock) */
    void *clock_ud;
    uint64_t last_now_ns;
    uint64_t n_released;
    pgd__heap main; /* the evictable pages, order 2..5 */
    pgd__heap exp;  /* the evictable pages with an expiry, earliest first */
} prio;

static void prio_destroy(void *state)
{
    prio *p = state;
    if (!p) return;
    pgd__alloc al = p->al;
    pgd__heap_deinit(&p->main, &al);
    pgd__heap_deinit(&p->exp, &al);
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
    if (rc != PGD_OK) {
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
}

static void prio_insert(void *state, uint32_t id, const pgd_policy_page *info)
{
    prio *p = state;
    if (info->now_ns > p->last_now_ns) p->last_now_ns = info->now_ns;
    (void)id; /* referenced when registered: not evictable yet */
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
    PGD_CHECK(id < p->n && !pgd__heap_contains(&p->main, id));
    if (info->now_ns > p->last_now_ns) p->last_now_ns = info->now_ns;
    uint64_t priority = info->priority > PGD_PRIORITY_MAX ? PGD_PRIORITY_MAX : info->priority;
    int hinted = info->next_use_ns != 0 && info->next_use_ns > info->now_ns;
    uint64_t seq = ++p->n_released;
    pgd__heap_push(&p->main, id, priority * 2 + (uint64_t)hinted,
                   hinted ? UINT64_MAX - info->next_use_ns : 0, seq);
    if (info->expires_ns) pgd__heap_push(&p->exp, id, info->expires_ns, seq, 0);
}

static uint32_t prio_victim(void *state, pgd_policy_accept_fn accept, void *ctx)
{
    prio *p = state;
    if (p->main.size == 0) return PGD_POLICY_NO_PAGE;
    uint64_t now = p->clock ? p->clock(p->clock_ud) : p->last_now_ns;
    uint32_t v = pgd__heap_search(&p->exp, now, accept, ctx);
    if (v != PGD__NONE) return v;
    return pgd__heap_search(&p->main, UINT64_MAX, accept, ctx);
}

static void prio_remove(void *state, uint32_t id)
{
    prio_take(state, id);
}

static int prio_contains(const void *state, uint32_t id)
{
    const prio *p = state;
    return pgd__heap_contains(&p->main, id);
}

static uint32_t prio_size(const void *state)
{
    return ((const prio *)state)->main.size;
}

const pgd_policy_ops pgd__policy_priority = {
    "priority",  prio_create, prio_destroy,  prio_insert, prio_hit, prio_unreferenced,
    prio_victim, prio_remove, prio_contains, prio_size,   NULL,
};
