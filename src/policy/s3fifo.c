/* SPDX-License-Identifier: MIT */
/*
 * s3fifo.c - S3-FIFO (Yang et al., SOSP'23): a small FIFO, a main FIFO and a ghost FIFO,
 * with a 2-bit access count per page. Ops table: policy.h; called by cache.c.
 *
 *   small  (target s = max(1, n/10) pages)  new pages; one-hit wonders leave from here
 *   main   (the rest)                       pages reused while in small, or ghost hits
 *   ghost  (max(1, n - s) block hashes)     what left the small queue (ghost.c)
 *
 * Both queues hold every cached page (insert() to the small queue's head, or main's when
 * the block's hash is in the ghost, which forgets it); hit() bumps the page's freq (capped
 * at 3). Prefix chains: the cache registers a chain root first but releases it deepest
 * first, so the first unreferenced() after insert() moves the page to the head of its
 * queue again. A chain then enters in release order and its leaf is nearest the tail;
 * ordered by registration, every victim would first pass over the chain's inner pages
 * (measured with bench_policy: see the commit). Later releases do not move a page. Only the
 * evictable set (unreferenced, not since hit or removed: flag ev[] and a release-ordered list) may
 * be chosen. victim(accept) walks the tail of the small queue while it holds at least s pages (or
 * main is empty), else the tail of main: small tail, freq > 0        -> head of main, freq 0 main
 * tail, freq > 0         -> head of main, freq - 1 freq 0, evictable, accepted -> the victim freq
 * 0, otherwise           -> rotated to the head of its own queue (CLOCK-like: a page in use or an
 * inner node of the prefix tree gets another round), counted as a skip After S3_MAX_SKIPS skips the
 * walk stops and the oldest-released accepted evictable page is taken (LRU's choice), so victim
 * never fails while an accepted page exists. Moves and freq decrements are paid for by inserts and
 * hits, skips are bounded: amortised O(1). victim() reorders the queues (internal state) but never
 * changes the evictable set. remove() takes a page out of everything; a page that leaves from the
 * small queue puts its hash in the ghost (the paper's "evicted from S"). contains()/size():
 * evictable set.
 */
#include "pgd_int.h"

/* Skips (pages passed over without a state change) before falling back to release order. */
#define S3_MAX_SKIPS 64
#define S3_FREQ_MAX 3

enum { Q_NONE, Q_SMALL, Q_MAIN };

typedef struct dlist {
    uint32_t head, tail, n; /* head: newest */
} dlist;

typedef struct s3fifo {
    pgd__alloc al;
    uint32_t n, small_target;
    uint32_t n_evictable;
    uint32_t *prev, *next;   /* [n] queue links (small or main) */
    uint32_t *eprev, *enext; /* [n] links of the evictable list (release order) */
    uint8_t *q;              /* [n] Q_* */
    uint8_t *freq;           /* [n] 0..3 */
    uint8_t *ev;             /* [n] in the evictable set */
    uint8_t *fresh;          /* [n] inserted, not yet released once */
    pgd_hash *hash;          /* [n] */
    dlist small, main, evl;
    pgd__ghost ghost;
} s3fifo;

static void dl_push_head(dlist *l, uint32_t *prev, uint32_t *next, uint32_t id)
{
    prev[id] = PGD__NONE;
    next[id] = l->head;
    if (l->head != PGD__NONE)
        prev[l->head] = id;
    else
        l->tail = id;
    l->head = id;
    l->n++;
}

static void dl_unlink(dlist *l, uint32_t *prev, uint32_t *next, uint32_t id)
{
    uint32_t p = prev[id], n = next[id];
    if (p != PGD__NONE)
        next[p] = n;
    else
        l->head = n;
    if (n != PGD__NONE)
        prev[n] = p;
    else
        l->tail = p;
    l->n--;
}

static void s3_destroy(void *state)
{
    s3fifo *s = state;
    if (!s) return;
    pgd__alloc al = s->al;
    pgd__free(&al, s->prev);
    pgd__free(&al, s->next);
    pgd__free(&al, s->eprev);
    pgd__free(&al, s->enext);
    pgd__free(&al, s->q);
    pgd__free(&al, s->freq);
    pgd__free(&al, s->ev);
    pgd__free(&al, s->fresh);
    pgd__free(&al, s->hash);
    pgd__ghost_deinit(&s->ghost, &al);
    pgd__free(&al, s);
}

static int s3_create(const pgd_policy_init *init, void **state)
{
    pgd__alloc a;
    pgd__alloc_init(&a, init->alloc);
    const pgd__alloc *al = &a;
    uint32_t n = init->n_pages;
    *state = NULL;
    s3fifo *s = pgd__calloc(al, 1, sizeof *s);
    if (!s) return PGD_ENOMEM;
    s->al = a;
    s->n = n;
    s->small_target = n / 10 ? n / 10 : 1;
    s->small.head = s->small.tail = PGD__NONE;
    s->main.head = s->main.tail = PGD__NONE;
    s->evl.head = s->evl.tail = PGD__NONE;
    s->prev = pgd__malloc(al, (size_t)n * sizeof *s->prev);
    s->next = pgd__malloc(al, (size_t)n * sizeof *s->next);
    s->eprev = pgd__malloc(al, (size_t)n * sizeof *s->eprev);
    s->enext = pgd__malloc(al, (size_t)n * sizeof *s->enext);
    s->q = pgd__calloc(al, n ? n : 1, 1);
    s->freq = pgd__calloc(al, n ? n : 1, 1);
    s->ev = pgd__calloc(al, n ? n : 1, 1);
    s->fresh = pgd__calloc(al, n ? n : 1, 1);
    s->hash = pgd__malloc(al, (size_t)n * sizeof *s->hash);
    int rc = pgd__ghost_init(&s->ghost, al, n > s->small_target ? n - s->small_target : 1);
    if (rc != PGD_OK || !s->prev || !s->next || !s->eprev || !s->enext || !s->q || !s->freq ||
        !s->ev || !s->fresh || (n && !s->hash)) {
        s3_destroy(s);
        return PGD_ENOMEM;
    }
    *state = s;
    return PGD_OK;
}

static dlist *queue_of(s3fifo *s, uint32_t id)
{
    return s->q[id] == Q_SMALL ? &s->small : &s->main;
}

static void set_evictable(s3fifo *s, uint32_t id, int on)
{
    if (s->ev[id] == on) return;
    if (on)
        dl_push_head(&s->evl, s->eprev, s->enext, id);
    else
        dl_unlink(&s->evl, s->eprev, s->enext, id);
    s->ev[id] = (uint8_t)on;
    s->n_evictable = s->evl.n;
}

/* Takes id out of its queue and the evictable set (no ghost). */
static void take_out(s3fifo *s, uint32_t id)
{
    if (s->q[id] != Q_NONE) dl_unlink(queue_of(s, id), s->prev, s->next, id);
    s->q[id] = Q_NONE;
    set_evictable(s, id, 0);
}

static void s3_insert(void *state, uint32_t id, const pgd_policy_page *info)
{
    s3fifo *s = state;
    PGD_CHECK(id < s->n);
    take_out(s, id); /* a page is registered once per stay; be safe if not */
    s->hash[id] = info->hash;
    s->freq[id] = 0;
    s->fresh[id] = 1;
    if (pgd__ghost_find(&s->ghost, info->hash) >= 0) {
        pgd__ghost_del(&s->ghost, info->hash);
        s->q[id] = Q_MAIN;
        dl_push_head(&s->main, s->prev, s->next, id);
    } else {
        s->q[id] = Q_SMALL;
        dl_push_head(&s->small, s->prev, s->next, id);
    }
}

static void s3_hit(void *state, uint32_t id, const pgd_policy_page *info)
{
    s3fifo *s = state;
    (void)info;
    if (id >= s->n) return;
    if (s->freq[id] < S3_FREQ_MAX) s->freq[id]++;
    set_evictable(s, id, 0);
}

static void s3_unreferenced(void *state, uint32_t id, const pgd_policy_page *info)
{
    s3fifo *s = state;
    PGD_CHECK(id < s->n && !s->ev[id]);
    if (s->q[id] == Q_NONE) { /* never inserted: treat as a new page */
        s->hash[id] = info->hash;
        s->freq[id] = 0;
        s->q[id] = Q_SMALL;
        dl_push_head(&s->small, s->prev, s->next, id);
    } else if (s->fresh[id]) {
        dlist *l = queue_of(s, id);
        dl_unlink(l, s->prev, s->next, id);
        dl_push_head(l, s->prev, s->next, id);
    }
    s->fresh[id] = 0;
    set_evictable(s, id, 1);
}

static int ok(s3fifo *s, uint32_t id, pgd_policy_accept_fn accept, void *ctx)
{
    return s->ev[id] && (!accept || accept(ctx, id));
}

static uint32_t s3_victim(void *state, pgd_policy_accept_fn accept, void *ctx)
{
    s3fifo *s = state;
    if (s->n_evictable == 0) return PGD_POLICY_NO_PAGE;
    uint32_t skips = 0;
    while (s->small.n + s->main.n) {
        int from_small = s->small.n && (s->small.n >= s->small_target || !s->main.n);
        dlist *l = from_small ? &s->small : &s->main;
        uint32_t t = l->tail;
        if (s->freq[t] > 0) {
            dl_unlink(l, s->prev, s->next, t);
            if (from_small)
                s->freq[t] = 0;
            else
                s->freq[t]--;
            s->q[t] = Q_MAIN;
            dl_push_head(&s->main, s->prev, s->next, t);
            continue;
        }
        if (ok(s, t, accept, ctx)) return t;
        dl_unlink(l, s->prev, s->next, t);
        dl_push_head(l, s->prev, s->next, t);
        if (++skips >= S3_MAX_SKIPS) break;
    }
    for (uint32_t id = s->evl.tail; id != PGD__NONE; id = s->eprev[id])
        if (!accept || accept(ctx, id)) return id;
    return PGD_POLICY_NO_PAGE;
}

static void s3_remove(void *state, uint32_t id)
{
    s3fifo *s = state;
    if (id >= s->n) return;
    if (s->q[id] == Q_SMALL) pgd__ghost_push(&s->ghost, 0, s->hash[id]);
    take_out(s, id);
    s->freq[id] = 0;
    s->fresh[id] = 0;
}

static int s3_contains(const void *state, uint32_t id)
{
    const s3fifo *s = state;
    return id < s->n && s->ev[id];
}

static uint32_t s3_size(const void *state)
{
    return ((const s3fifo *)state)->n_evictable;
}

const pgd_policy_ops pgd__policy_s3fifo = {
    "s3fifo",        s3_create, s3_destroy, s3_insert,   s3_hit,
    s3_unreferenced, s3_victim, s3_remove,  s3_contains, s3_size,
};
