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
 * queue again; later releases do not move it. A chain then enters in release order, its
 * leaf nearest the tail. Left in registration order, a victim first passes over a chain's
 * inner pages: bench_policy without the move ran at 114-138 ns/op (7.5-8.5x LRU) and hit
 * 0.4604 of blocks, against 43-48 ns/op and 0.4952 with it.
 *
 * Only the evictable set (unreferenced, not since hit or removed: flag ev and a
 * release-ordered list) may be chosen. victim(accept) walks the tail of the small queue
 * while it holds at least s pages (or main is empty), else the tail of main:
 *
 *   small tail, freq > 0          -> head of main, freq 0
 *   main tail, freq > 0           -> head of main, freq - 1
 *   freq 0, evictable, accepted   -> the victim
 *   freq 0, otherwise             -> the head of its own queue (CLOCK-like: a page in use
 *                                    or an inner node of the prefix tree gets another
 *                                    round), counted as a skip
 *
 * After S3_MAX_SKIPS skips the walk stops and the oldest-released accepted evictable page
 * is taken (LRU's choice), so victim never fails while an accepted page exists. Moves and
 * freq decrements are paid for by inserts and hits, skips are bounded: amortised O(1).
 * victim() reorders the queues (internal state) but never changes the evictable set.
 * remove() takes a page out of everything; a page that leaves from the small queue puts
 * its hash in the ghost (the paper's "evicted from S"). contains()/size(): the evictable
 * set.
 */
#include "dlist.h"
#include "pgd_int.h"

/* Skips (pages passed over without a state change) before falling back to release order. */
#define S3_MAX_SKIPS 64
#define S3_FREQ_MAX 3

enum { Q_NONE, Q_SMALL, Q_MAIN };

/* Everything about a page in one 40-byte record: an operation touches one cache line of
 * the page and one of each neighbour (bench_policy, 3 runs: 2.7x LRU's ns/op against
 * 3.1x with one array per field; the rest is mostly insert's first touch of the page,
 * which LRU does not need). */
typedef struct s3page {
    uint32_t link[2][2]; /* first member (dlist.h): list 0 the queue, 1 the evictable list */
    pgd_hash hash;
    uint8_t q;     /* Q_* */
    uint8_t freq;  /* 0..3 */
    uint8_t ev;    /* in the evictable set */
    uint8_t fresh; /* inserted, not yet released once */
} s3page;

typedef struct s3fifo {
    pgd__alloc al;
    uint32_t n, small_target;
    s3page *pg; /* [n] */
    dlist small, main, evl;
    pgd__ghost ghost;
} s3fifo;

static void s3_destroy(void *state)
{
    s3fifo *s = state;
    if (!s) return;
    pgd__alloc al = s->al;
    pgd__free(&al, s->pg);
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
    s->pg = pgd__calloc(al, n ? n : 1, sizeof *s->pg);
    int rc = pgd__ghost_init(&s->ghost, al, n > s->small_target ? n - s->small_target : 1);
    if (rc != PGD_OK || !s->pg) {
        s3_destroy(s);
        return PGD_ENOMEM;
    }
    *state = s;
    return PGD_OK;
}

static dlist *queue_of(s3fifo *s, uint32_t id)
{
    return s->pg[id].q == Q_SMALL ? &s->small : &s->main;
}

static void set_evictable(s3fifo *s, uint32_t id, int on)
{
    if (s->pg[id].ev == on) return;
    if (on)
        dl_push_head(s->pg, 1, &s->evl, id);
    else
        dl_unlink(s->pg, 1, &s->evl, id);
    s->pg[id].ev = (uint8_t)on;
}

/* Takes id out of its queue and the evictable set (no ghost). */
static void take_out(s3fifo *s, uint32_t id)
{
    if (s->pg[id].q != Q_NONE) dl_unlink(s->pg, 0, queue_of(s, id), id);
    s->pg[id].q = Q_NONE;
    set_evictable(s, id, 0);
}

static void s3_insert(void *state, uint32_t id, const pgd_policy_page *info)
{
    s3fifo *s = state;
    PGD_CHECK(id < s->n);
    take_out(s, id); /* a page is registered once per stay; be safe if not */
    s3page *p = &s->pg[id];
    p->hash = info->hash;
    p->freq = 0;
    p->fresh = 1;
    if (s->ghost.len[0] && pgd__ghost_find(&s->ghost, info->hash) >= 0) {
        pgd__ghost_del(&s->ghost, info->hash);
        p->q = Q_MAIN;
        dl_push_head(s->pg, 0, &s->main, id);
    } else {
        p->q = Q_SMALL;
        dl_push_head(s->pg, 0, &s->small, id);
    }
}

static void s3_hit(void *state, uint32_t id, const pgd_policy_page *info)
{
    s3fifo *s = state;
    (void)info;
    if (id >= s->n) return;
    if (s->pg[id].freq < S3_FREQ_MAX) s->pg[id].freq++;
    set_evictable(s, id, 0);
}

static void s3_unreferenced(void *state, uint32_t id, const pgd_policy_page *info)
{
    s3fifo *s = state;
    PGD_CHECK(id < s->n && !s->pg[id].ev);
    s3page *p = &s->pg[id];
    if (p->q == Q_NONE) { /* never inserted: treat as a new page */
        p->hash = info->hash;
        p->freq = 0;
        p->q = Q_SMALL;
        dl_push_head(s->pg, 0, &s->small, id);
    } else if (p->fresh) {
        dlist *l = queue_of(s, id);
        dl_unlink(s->pg, 0, l, id);
        dl_push_head(s->pg, 0, l, id);
    }
    p->fresh = 0;
    set_evictable(s, id, 1);
}

static uint32_t s3_victim(void *state, pgd_policy_accept_fn accept, void *ctx)
{
    s3fifo *s = state;
    if (s->evl.n == 0) return PGD_POLICY_NO_PAGE;
    uint32_t skips = 0;
    while (s->small.n + s->main.n) {
        int from_small = s->small.n && (s->small.n >= s->small_target || !s->main.n);
        dlist *l = from_small ? &s->small : &s->main;
        uint32_t t = l->tail;
        s3page *p = &s->pg[t];
        if (p->freq > 0) {
            dl_unlink(s->pg, 0, l, t);
            if (from_small)
                p->freq = 0;
            else
                p->freq--;
            p->q = Q_MAIN;
            dl_push_head(s->pg, 0, &s->main, t);
            continue;
        }
        if (p->ev && (!accept || accept(ctx, t))) return t;
        dl_unlink(s->pg, 0, l, t);
        dl_push_head(s->pg, 0, l, t);
        if (++skips >= S3_MAX_SKIPS) break;
    }
    for (uint32_t id = s->evl.tail; id != PGD__NONE; id = s->pg[id].link[1][0])
        if (!accept || accept(ctx, id)) return id;
    return PGD_POLICY_NO_PAGE;
}

static void s3_remove(void *state, uint32_t id)
{
    s3fifo *s = state;
    if (id >= s->n) return;
    if (s->pg[id].q == Q_SMALL) pgd__ghost_push(&s->ghost, 0, s->pg[id].hash);
    take_out(s, id);
    s->pg[id].freq = 0;
    s->pg[id].fresh = 0;
}

static int s3_contains(const void *state, uint32_t id)
{
    const s3fifo *s = state;
    return id < s->n && s->pg[id].ev;
}

static uint32_t s3_size(const void *state)
{
    return ((const s3fifo *)state)->evl.n;
}

const pgd_policy_ops pgd__policy_s3fifo = {
    "s3fifo",  s3_create, s3_destroy,  s3_insert, s3_hit, s3_unreferenced,
    s3_victim, s3_remove, s3_contains, s3_size,   NULL,
};
