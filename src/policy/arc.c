/* SPDX-License-Identifier: MIT */
/*
 * arc.c - ARC, the adaptive replacement cache (Megiddo & Modha, FAST'03). Ops table:
 * policy.h; called by cache.c.
 *
 *   T1  cached pages used once (registered, not matched since)     LRU lists of page ids
 *   T2  cached pages matched at least once more
 *   B1  hashes of pages evicted from T1, B2 from T2                 ghost lists (ghost.c)
 *   p   the target size of T1, 0..n, adapted by ghost hits
 *
 * Every cached page has a class, T1 or T2, and |T1|, |T2| count all of them; the LRU
 * lists of each class link only its evictable pages (a page in use counts as the most
 * recently used: it joins its list's MRU end when released). A walk over in-use pages
 * kept in the lists cost 6 skips per victim in bench_policy, 8% of victims ending in the
 * fallback; see the commit.
 *
 * insert(): a block whose hash is in B1 grows p by max(1, |B2|/|B1|), one in B2 shrinks it
 * by max(1, |B1|/|B2|); both leave their ghost and enter T2; any other block enters T1
 * (first dropping B1's oldest while |T1| + |B1| >= n). hit(): the page becomes T2 and
 * leaves its list (it is in use). unreferenced(): to the MRU end of its class's list; the
 * cache releases a chain deepest page first, so a chain's leaf is nearest the LRU end.
 * victim(accept) walks the LRU end of T1's list when |T1| > p (or |T2| is 0), else of
 * T2's, then the other one: an accepted page is the victim; one accept() refuses (an inner
 * node of the prefix tree) is rotated to its list's MRU end and counted as a skip. After
 * ARC_MAX_SKIPS skips in all, or both lists walked, the oldest-released accepted evictable
 * page is taken (LRU's choice, from a release-ordered list of the evictable set): victim
 * never fails while an accepted page exists, and is O(1) amortised. remove() puts the
 * page's hash in B1 or B2 by its class.
 * Simplification: the ghosts share one pool of n entries (|B1| + |B2| <= n, the ARC bound
 * when the cache is full); a full pool drops the oldest entry of the list being pushed.
 */
#include "dlist.h"
#include "pgd_int.h"

#define ARC_MAX_SKIPS 64

enum { L_NONE, L_T1, L_T2 };

/* A page's state in one record (one cache line per touch, as in s3fifo.c). */
typedef struct arcpage {
    uint32_t link[2][2]; /* first member (dlist.h): list 0 T1 or T2, 1 the evictable list */
    pgd_hash hash;
    uint8_t l;  /* L_*: its class */
    uint8_t ev; /* in the evictable set */
} arcpage;

typedef struct arc {
    pgd__alloc al;
    uint32_t n, p;
    arcpage *pg;     /* [n] */
    uint32_t cnt[3]; /* cached pages of class L_T1, L_T2 */
    dlist t[3];      /* t[L_T1], t[L_T2]: their evictable pages, LRU order */
    dlist evl;
    pgd__ghost ghost; /* list 0: B1, list 1: B2 */
} arc;

static void arc_destroy(void *state)
{
    arc *a = state;
    if (!a) return;
    pgd__alloc al = a->al;
    pgd__free(&al, a->pg);
    pgd__ghost_deinit(&a->ghost, &al);
    pgd__free(&al, a);
}

static int arc_create(const pgd_policy_init *init, void **state)
{
    pgd__alloc aa;
    pgd__alloc_init(&aa, init->alloc);
    const pgd__alloc *al = &aa;
    uint32_t n = init->n_pages;
    *state = NULL;
    arc *a = pgd__calloc(al, 1, sizeof *a);
    if (!a) return PGD_ENOMEM;
    a->al = aa;
    a->n = n;
    for (int i = 0; i < 3; i++)
        a->t[i].head = a->t[i].tail = PGD__NONE;
    a->evl.head = a->evl.tail = PGD__NONE;
    a->pg = pgd__calloc(al, n ? n : 1, sizeof *a->pg);
    int rc = pgd__ghost_init(&a->ghost, al, n);
    if (rc != PGD_OK || !a->pg) {
        arc_destroy(a);
        return PGD_ENOMEM;
    }
    *state = a;
    return PGD_OK;
}

/* Links id at the MRU end of its class's list and of the release-ordered list. */
static void make_evictable(arc *a, uint32_t id)
{
    dl_push_head(a->pg, 0, &a->t[a->pg[id].l], id);
    dl_push_head(a->pg, 1, &a->evl, id);
    a->pg[id].ev = 1;
}

/* Unlinks id from both lists, if evictable. */
static void unmake_evictable(arc *a, uint32_t id)
{
    if (!a->pg[id].ev) return;
    dl_unlink(a->pg, 0, &a->t[a->pg[id].l], id);
    dl_unlink(a->pg, 1, &a->evl, id);
    a->pg[id].ev = 0;
}

static void take_out(arc *a, uint32_t id)
{
    unmake_evictable(a, id);
    if (a->pg[id].l != L_NONE) a->cnt[a->pg[id].l]--;
    a->pg[id].l = L_NONE;
}

static void set_class(arc *a, uint32_t id, int l)
{
    a->pg[id].l = (uint8_t)l;
    a->cnt[l]++;
}

static void arc_insert(void *state, uint32_t id, const pgd_policy_page *info)
{
    arc *a = state;
    PGD_CHECK(id < a->n);
    take_out(a, id); /* a page is registered once per stay; be safe if not */
    a->pg[id].hash = info->hash;
    uint32_t b1 = a->ghost.len[0], b2 = a->ghost.len[1];
    int g = b1 + b2 ? pgd__ghost_find(&a->ghost, info->hash) : -1;
    if (g == 0) {
        uint32_t d = b2 / b1 > 1 ? b2 / b1 : 1;
        a->p = a->n - a->p > d ? a->p + d : a->n;
    } else if (g == 1) {
        uint32_t d = b1 / b2 > 1 ? b1 / b2 : 1;
        a->p = a->p > d ? a->p - d : 0;
    }
    if (g >= 0) {
        pgd__ghost_del(&a->ghost, info->hash);
        set_class(a, id, L_T2);
        return;
    }
    while (a->ghost.len[0] && a->cnt[L_T1] + a->ghost.len[0] >= a->n)
        pgd__ghost_pop(&a->ghost, 0);
    set_class(a, id, L_T1);
}

static void arc_hit(void *state, uint32_t id, const pgd_policy_page *info)
{
    arc *a = state;
    (void)info;
    if (id >= a->n || a->pg[id].l == L_NONE) return;
    unmake_evictable(a, id);
    a->cnt[a->pg[id].l]--;
    set_class(a, id, L_T2);
}

static void arc_unreferenced(void *state, uint32_t id, const pgd_policy_page *info)
{
    arc *a = state;
    PGD_CHECK(id < a->n && !a->pg[id].ev);
    if (a->pg[id].l == L_NONE) { /* never inserted: a new page */
        a->pg[id].hash = info->hash;
        set_class(a, id, L_T1);
    }
    make_evictable(a, id);
}

static uint32_t arc_victim(void *state, pgd_policy_accept_fn accept, void *ctx)
{
    arc *a = state;
    if (a->evl.n == 0) return PGD_POLICY_NO_PAGE;
    int first = a->cnt[L_T1] && (a->cnt[L_T1] > a->p || !a->cnt[L_T2]) ? L_T1 : L_T2;
    uint32_t skips = 0;
    for (int k = 0; k < 2 && skips < ARC_MAX_SKIPS; k++) {
        dlist *l = &a->t[k == 0 ? first : L_T1 + L_T2 - first];
        for (uint32_t walked = 0, len = l->n; walked < len; walked++) {
            uint32_t t = l->tail;
            if (!accept || accept(ctx, t)) return t;
            dl_unlink(a->pg, 0, l, t);
            dl_push_head(a->pg, 0, l, t);
            if (++skips >= ARC_MAX_SKIPS) break;
        }
    }
    for (uint32_t id = a->evl.tail; id != PGD__NONE; id = a->pg[id].link[1][0])
        if (!accept || accept(ctx, id)) return id;
    return PGD_POLICY_NO_PAGE;
}

static void arc_remove(void *state, uint32_t id)
{
    arc *a = state;
    if (id >= a->n) return;
    if (a->pg[id].l != L_NONE)
        pgd__ghost_push(&a->ghost, a->pg[id].l == L_T1 ? 0 : 1, a->pg[id].hash);
    take_out(a, id);
}

static int arc_contains(const void *state, uint32_t id)
{
    const arc *a = state;
    return id < a->n && a->pg[id].ev;
}

static uint32_t arc_size(const void *state)
{
    return ((const arc *)state)->evl.n;
}

const pgd_policy_ops pgd__policy_arc = {
    "arc",      arc_create, arc_destroy,  arc_insert, arc_hit, arc_unreferenced,
    arc_victim, arc_remove, arc_contains, arc_size,   NULL,
};
