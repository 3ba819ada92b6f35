/* SPDX-License-Identifier: MIT */
/*
 * priority.c - TensorRT-LLM-style retention priorities with TTLs and next-use hints
 * (KVFlow, arXiv 2507.07400). Ops table: policy.h; retention: cache.h.
 *
 * Eviction order, first to go first:
 *   1. expired pages: expires_ns set and <= the clock at victim() time (a page whose
 *      expiry passed while it waited goes first), earliest expiry first, then by 2..5;
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
 * 2..5, and one of the pages with an expiry, earliest first. victim() looks at the expiry
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
    pgd__heap main;        /* the evictable pages, order 2..5 */
    pgd__heap exp;         /* the evictable pages with an expiry, earliest first */
    uint32_t *priority;    /* [n] */
    uint8_t *hinted;       /* [n] 1 if next_use_ns was after now_ns at release */
    uint64_t *next_use_ns; /* [n] */
    uint64_t *expires_ns;  /* [n] 0: none */
    uint64_t *seq;         /* [n] release order */
    uint64_t now_ns;       /* the clock during one victim() call */
} prio;

/* Order 2..5 of the header. */
static int main_before(const void *ctx, uint32_t a, uint32_t b)
{
    const prio *p = ctx;
    if (p->priority[a] != p->priority[b]) return p->priority[a] < p->priority[b];
    if (p->hinted[a] != p->hinted[b]) return p->hinted[a] < p->hinted[b];
    if (p->hinted[a] && p->next_use_ns[a] != p->next_use_ns[b])
        return p->next_use_ns[a] > p->next_use_ns[b];
    if (p->seq[a] != p->seq[b]) return p->seq[a] < p->seq[b];
    return a < b;
}

static int exp_before(const void *ctx, uint32_t a, uint32_t b)
{
    const prio *p = ctx;
    if (p->expires_ns[a] != p->expires_ns[b]) return p->expires_ns[a] < p->expires_ns[b];
    return main_before(ctx, a, b);
}

static int expired(const void *ctx, uint32_t id)
{
    const prio *p = ctx;
    return p->expires_ns[id] <= p->now_ns;
}

static void prio_destroy(void *state)
{
    prio *p = state;
    if (!p) return;
    pgd__alloc al = p->al;
    pgd__heap_deinit(&p->main, &al);
    pgd__heap_deinit(&p->exp, &al);
    pgd__free(&al, p->priority);
    pgd__free(&al, p->hinted);
    pgd__free(&al, p->next_use_ns);
    pgd__free(&al, p->expires_ns);
    pgd__free(&al, p->seq);
    pgd__free(&al, p);
}

static int prio_create(const pgd_policy_init *init, void **state)
{
    pgd__alloc a;
    pgd__alloc_init(&a, init->alloc);
    const pgd__alloc *al = &a;
    uint32_t n = init->n_pages;
    size_t m = n ? n : 1;
    prio *p = pgd__calloc(al, 1, sizeof *p);
    *state = NULL;
    if (!p) return PGD_ENOMEM;
    p->al = a;
    p->n = n;
    p->clock = init->clock;
    p->clock_ud = init->clock_ud;
    int rc = pgd__heap_init(&p->main, al, n, main_before, p);
    if (rc == PGD_OK) rc = pgd__heap_init(&p->exp, al, n, exp_before, p);
    p->priority = pgd__calloc(al, m, sizeof *p->priority);
    p->hinted = pgd__calloc(al, m, sizeof *p->hinted);
    p->next_use_ns = pgd__calloc(al, m, sizeof *p->next_use_ns);
    p->expires_ns = pgd__calloc(al, m, sizeof *p->expires_ns);
    p->seq = pgd__calloc(al, m, sizeof *p->seq);
    if (rc != PGD_OK || !p->priority || !p->hinted || !p->next_use_ns || !p->expires_ns ||
        !p->seq) {
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
    p->priority[id] = info->priority > PGD_PRIORITY_MAX ? PGD_PRIORITY_MAX : info->priority;
    p->hinted[id] = info->next_use_ns != 0 && info->next_use_ns > info->now_ns;
    p->next_use_ns[id] = p->hinted[id] ? info->next_use_ns : 0;
    p->expires_ns[id] = info->expires_ns;
    p->seq[id] = ++p->n_released;
    pgd__heap_push(&p->main, id);
    if (info->expires_ns) pgd__heap_push(&p->exp, id);
}

static uint32_t prio_victim(void *state, pgd_policy_accept_fn accept, void *ctx)
{
    prio *p = state;
    if (p->main.size == 0) return PGD_POLICY_NO_PAGE;
    p->now_ns = p->clock ? p->clock(p->clock_ud) : p->last_now_ns;
    uint32_t v = pgd__heap_search(&p->exp, expired, p, accept, ctx);
    if (v != PGD__NONE) return v;
    return pgd__heap_search(&p->main, NULL, NULL, accept, ctx);
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
    "priority",        prio_create, prio_destroy, prio_insert,   prio_hit,
    prio_unreferenced, prio_victim, prio_remove,  prio_contains, prio_size,
};
