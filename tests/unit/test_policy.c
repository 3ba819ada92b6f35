/* SPDX-License-Identifier: MIT */
/*
 * test_policy.c - eviction policies through their public ops table (policy.h): LRU order,
 * hit/remove/accept semantics, a randomized LRU model, Belady's farthest-next-use choice
 * with a fake oracle, and a user policy (MRU, written here) plugged into a cache through
 * pgd_cache_params.policy_ops, which changes the eviction order as expected.
 */
#include <pagoda/cache.h>
#include <pagoda/policy.h>

#include "pgd_int.h"
#include "t.h"

static pgd_policy_page info_of(uint32_t id, uint32_t depth)
{
    pgd_policy_page i;
    memset(&i, 0, sizeof i);
    i.priority = PGD_PRIORITY_DEFAULT;
    i.hash.lo = (uint64_t)id * 1000 + 17; /* not the id: the policy must pass the hash */
    i.hash.hi = 0x99;
    i.depth = depth;
    return i;
}

static int accept_all(void *ctx, uint32_t id)
{
    (void)ctx;
    (void)id;
    return 1;
}

static int accept_even(void *ctx, uint32_t id)
{
    int *calls = ctx;
    if (calls) (*calls)++;
    return id % 2 == 0;
}

static int accept_none(void *ctx, uint32_t id)
{
    (void)ctx;
    (void)id;
    return 0;
}

typedef struct {
    const pgd_policy_ops *ops;
    pgd__alloc al;
    void *st;
} pol;

static int pol_open(pol *p, const pgd_policy_ops *ops, uint32_t n, pgd_next_use_fn fn, void *ud)
{
    p->ops = ops;
    pgd__alloc_init(&p->al, NULL);
    p->st = NULL;
    pgd_policy_init init = {
        .n_pages = n, .alloc = &p->al.a, .next_use = fn, .next_use_ud = ud, .page_bytes = 1};
    return ops->create(&init, &p->st);
}

static void pol_close(pol *p)
{
    p->ops->destroy(p->st);
}

static void ins(pol *p, uint32_t id, uint32_t depth)
{
    pgd_policy_page i = info_of(id, depth);
    p->ops->insert(p->st, id, &i);
}

static void unref(pol *p, uint32_t id, uint32_t depth)
{
    pgd_policy_page i = info_of(id, depth);
    p->ops->unreferenced(p->st, id, &i);
}

static void hit(pol *p, uint32_t id, uint32_t depth)
{
    pgd_policy_page i = info_of(id, depth);
    p->ops->hit(p->st, id, &i);
}

/* victim + remove, as the cache manager evicts */
static uint32_t evict(pol *p, pgd_policy_accept_fn acc, void *ctx)
{
    uint32_t v = p->ops->victim(p->st, acc, ctx);
    if (v != PGD__NONE) p->ops->remove(p->st, v);
    return v;
}

static int test_lookup(void)
{
    T_ASSERT(pgd_policy_builtin(PGD_POLICY_LRU) == &pgd__policy_lru);
    T_ASSERT(pgd_policy_builtin(PGD_POLICY_BELADY) == &pgd__policy_belady);
    T_ASSERT(pgd_policy_builtin((pgd_policy_kind)99) == NULL);
    /* Belady refuses to exist without its oracle. */
    pgd__alloc al;
    pgd__alloc_init(&al, NULL);
    pgd_policy_init init = {.n_pages = 8, .alloc = &al.a, .page_bytes = 1};
    void *st = &al;
    T_EQ(pgd__policy_belady.create(&init, &st), PGD_EINVAL);
    T_ASSERT(st == NULL);
    T_ASSERT(strcmp(pgd__policy_lru.name, "lru") == 0);
    T_ASSERT(strcmp(pgd__policy_belady.name, "belady") == 0);
    return 0;
}

/* ---- LRU ---- */

static int test_lru_order(void)
{
    pol p;
    T_OK(pol_open(&p, &pgd__policy_lru, 16, NULL, NULL));
    T_EQ(p.ops->size(p.st), 0);
    T_EQ(p.ops->victim(p.st, accept_all, NULL), PGD__NONE);
    for (uint32_t i = 0; i < 10; i++)
        ins(&p, i, i);
    /* inserted pages are still referenced: not evictable */
    T_EQ(p.ops->size(p.st), 0);
    T_EQ(p.ops->victim(p.st, accept_all, NULL), PGD__NONE);
    for (uint32_t i = 0; i < 10; i++)
        T_ASSERT(!p.ops->contains(p.st, i));

    uint32_t order[] = {5, 2, 7, 0, 9, 3};
    for (int i = 0; i < 6; i++) {
        unref(&p, order[i], order[i]);
        T_ASSERT(p.ops->contains(p.st, order[i]));
        T_EQ(p.ops->size(p.st), i + 1);
    }
    /* victim alone does not change the set's order: asking twice gives the same page */
    T_EQ(p.ops->victim(p.st, accept_all, NULL), 5);
    T_EQ(evict(&p, accept_all, NULL), 5);
    T_ASSERT(!p.ops->contains(p.st, 5));
    T_EQ(p.ops->size(p.st), 5);

    /* hit takes a page out of the evictable set */
    hit(&p, 2, 2);
    T_ASSERT(!p.ops->contains(p.st, 2));
    T_EQ(p.ops->size(p.st), 4);
    T_EQ(p.ops->victim(p.st, accept_all, NULL), 7);
    /* ... and releasing it again makes it the most recent */
    unref(&p, 2, 2);
    T_EQ(p.ops->size(p.st), 5);

    /* remove of an evictable page in the middle */
    p.ops->remove(p.st, 0);
    T_ASSERT(!p.ops->contains(p.st, 0));
    T_EQ(p.ops->size(p.st), 4);
    /* remove of a registered, still referenced page (dropped from the index) */
    p.ops->remove(p.st, 1);
    T_EQ(p.ops->size(p.st), 4);

    /* accept skipping: 7 and 9 and 3 are odd, 2 is even */
    int calls = 0;
    T_EQ(p.ops->victim(p.st, accept_even, &calls), 2);
    T_ASSERT(calls >= 1);
    T_EQ(p.ops->size(p.st), 4); /* skipped pages stay */
    T_EQ(p.ops->victim(p.st, accept_none, NULL), PGD__NONE);
    T_EQ(p.ops->size(p.st), 4);

    T_EQ(evict(&p, accept_all, NULL), 7);
    T_EQ(evict(&p, accept_all, NULL), 9);
    T_EQ(evict(&p, accept_all, NULL), 3);
    T_EQ(evict(&p, accept_all, NULL), 2);
    T_EQ(evict(&p, accept_all, NULL), PGD__NONE);
    T_EQ(p.ops->size(p.st), 0);

    /* ids are reused for new pages after removal */
    ins(&p, 5, 0);
    unref(&p, 5, 0);
    ins(&p, 0, 0);
    unref(&p, 0, 0);
    T_EQ(evict(&p, accept_all, NULL), 5);
    T_EQ(evict(&p, accept_all, NULL), 0);
    pol_close(&p);
    return 0;
}

/* Randomized LRU against a list model. */
static int test_lru_random(void)
{
    enum { N = 64 };
    pol p;
    int state[N]; /* 0 absent, 1 inserted+referenced, 2 evictable */
    uint32_t list[N], n_list = 0;
    uint64_t seed = 4242;
    T_OK(pol_open(&p, &pgd__policy_lru, N, NULL, NULL));
    memset(state, 0, sizeof state);
    for (int step = 0; step < 50000; step++) {
        uint32_t id = (uint32_t)(t_rand(&seed) % N), r = (uint32_t)(t_rand(&seed) % 6);
        if (r == 0 && state[id] == 0) {
            ins(&p, id, 0);
            state[id] = 1;
        } else if (r == 1 && state[id] == 1) {
            unref(&p, id, 0);
            state[id] = 2;
            list[n_list++] = id;
        } else if (r == 2 && state[id] == 2) {
            hit(&p, id, 0);
            state[id] = 1;
            for (uint32_t i = 0; i < n_list; i++)
                if (list[i] == id) {
                    memmove(list + i, list + i + 1, (n_list - i - 1) * sizeof *list);
                    n_list--;
                    break;
                }
        } else if (r == 3 && state[id] != 0) {
            p.ops->remove(p.st, id);
            if (state[id] == 2) {
                for (uint32_t i = 0; i < n_list; i++)
                    if (list[i] == id) {
                        memmove(list + i, list + i + 1, (n_list - i - 1) * sizeof *list);
                        n_list--;
                        break;
                    }
            }
            state[id] = 0;
        } else if (r == 4) {
            uint32_t expect = PGD__NONE;
            for (uint32_t i = 0; i < n_list && expect == PGD__NONE; i++)
                if (list[i] % 2 == 0) expect = list[i];
            T_EQ(p.ops->victim(p.st, accept_even, NULL), expect);
        } else if (r == 5) {
            uint32_t v = evict(&p, accept_all, NULL);
            if (n_list == 0) {
                T_EQ(v, PGD__NONE);
            } else {
                T_EQ(v, list[0]);
                memmove(list, list + 1, (n_list - 1) * sizeof *list);
                n_list--;
                state[v] = 0;
            }
        }
        T_EQ(p.ops->size(p.st), n_list);
        for (uint32_t i = 0; i < N; i++)
            T_EQ(!!p.ops->contains(p.st, i), state[i] == 2);
    }
    pol_close(&p);
    return 0;
}

/* ---- Belady ---- */

typedef struct {
    uint64_t next[64]; /* by page id */
    int calls;
} oracle;

static uint64_t next_use(void *ud, pgd_hash h)
{
    oracle *o = ud;
    o->calls++;
    if (h.hi != 0x99 || (h.lo - 17) % 1000 != 0) return 0; /* not a hash we made */
    return o->next[(h.lo - 17) / 1000];
}

static int test_belady_farthest(void)
{
    pol p;
    oracle o;
    memset(&o, 0, sizeof o);
    T_OK(pol_open(&p, &pgd__policy_belady, 64, next_use, &o));
    T_EQ(p.ops->victim(p.st, accept_all, NULL), PGD__NONE);
    uint64_t nu[8] = {10, 50, UINT64_MAX, 30, 40, 20, 60, 5};
    for (uint32_t i = 0; i < 8; i++) {
        o.next[i] = nu[i];
        ins(&p, i, 0);
    }
    for (uint32_t i = 0; i < 8; i++)
        unref(&p, i, 0);
    T_EQ(p.ops->size(p.st), 8);
    T_EQ(p.ops->victim(p.st, accept_all, NULL), 2); /* never used again */
    T_EQ(evict(&p, accept_all, NULL), 2);
    T_EQ(evict(&p, accept_all, NULL), 6);            /* 60 */
    T_EQ(p.ops->victim(p.st, accept_even, NULL), 4); /* 50 is id 1: odd, skipped; 40 */
    T_EQ(evict(&p, accept_all, NULL), 1);            /* 50 */
    /* a hit takes 4 out; it comes back with a new next use */
    hit(&p, 4, 0);
    T_ASSERT(!p.ops->contains(p.st, 4));
    T_EQ(evict(&p, accept_all, NULL), 3); /* 30 */
    o.next[4] = 1000;
    unref(&p, 4, 0);
    T_EQ(evict(&p, accept_all, NULL), 4);
    p.ops->remove(p.st, 5);               /* 20 dropped */
    T_EQ(evict(&p, accept_all, NULL), 0); /* 10 */
    T_EQ(evict(&p, accept_all, NULL), 7); /* 5 */
    T_EQ(evict(&p, accept_all, NULL), PGD__NONE);
    T_EQ(p.ops->size(p.st), 0);
    T_ASSERT(o.calls > 0);
    pol_close(&p);
    return 0;
}

static int test_belady_ties_deeper_first(void)
{
    pol p;
    oracle o;
    memset(&o, 0, sizeof o);
    T_OK(pol_open(&p, &pgd__policy_belady, 64, next_use, &o));
    /* ids 10..13: never used again, depths 1, 3, 0, 2 */
    uint32_t depth[4] = {1, 3, 0, 2};
    for (uint32_t i = 0; i < 4; i++) {
        o.next[10 + i] = UINT64_MAX;
        ins(&p, 10 + i, depth[i]);
        unref(&p, 10 + i, depth[i]);
    }
    /* and two with an equal finite next use */
    o.next[20] = 77;
    o.next[21] = 77;
    ins(&p, 20, 4);
    unref(&p, 20, 4);
    ins(&p, 21, 9);
    unref(&p, 21, 9);
    T_EQ(evict(&p, accept_all, NULL), 11);
    T_EQ(evict(&p, accept_all, NULL), 13);
    T_EQ(evict(&p, accept_all, NULL), 10);
    T_EQ(evict(&p, accept_all, NULL), 12);
    T_EQ(evict(&p, accept_all, NULL), 21);
    T_EQ(evict(&p, accept_all, NULL), 20);
    pol_close(&p);
    return 0;
}

/* Randomized Belady: victim is always a max of (next use, depth) among accepted pages. */
static int test_belady_random(void)
{
    enum { N = 64 };
    pol p;
    oracle o;
    int state[N] = {0};
    uint32_t depth[N] = {0};
    uint64_t seed = 777;
    memset(&o, 0, sizeof o);
    T_OK(pol_open(&p, &pgd__policy_belady, N, next_use, &o));
    for (int step = 0; step < 20000; step++) {
        uint32_t id = (uint32_t)(t_rand(&seed) % N), r = (uint32_t)(t_rand(&seed) % 5);
        if (r == 0 && state[id] == 0) {
            depth[id] = (uint32_t)(t_rand(&seed) % 6);
            ins(&p, id, depth[id]);
            state[id] = 1;
        } else if (r == 1 && state[id] == 1) {
            uint64_t x = t_rand(&seed) % 40;
            o.next[id] = x == 0 ? UINT64_MAX : x; /* many ties */
            unref(&p, id, depth[id]);
            state[id] = 2;
        } else if (r == 2 && state[id] == 2) {
            hit(&p, id, depth[id]);
            state[id] = 1;
        } else if (r == 3 && state[id] != 0) {
            p.ops->remove(p.st, id);
            state[id] = 0;
        } else if (r == 4) {
            int even = (int)(t_rand(&seed) % 2);
            uint32_t v = evict(&p, even ? accept_even : accept_all, NULL);
            uint64_t best = 0;
            int any = 0;
            for (uint32_t i = 0; i < N; i++) {
                if (state[i] != 2 || (even && i % 2)) continue;
                if (!any || o.next[i] > best) best = o.next[i];
                any = 1;
            }
            if (!any) {
                T_EQ(v, PGD__NONE);
            } else {
                T_ASSERT(v < N && state[v] == 2);
                T_EQ(o.next[v], best);
                if (even) T_EQ(v % 2, 0);
                for (uint32_t i = 0; i < N; i++)
                    if (state[i] == 2 && o.next[i] == best && !(even && i % 2))
                        T_ASSERT(depth[i] <= depth[v]);
                state[v] = 0;
            }
        }
        uint32_t n_ev = 0;
        for (uint32_t i = 0; i < N; i++) {
            n_ev += state[i] == 2;
            T_EQ(!!p.ops->contains(p.st, i), state[i] == 2);
        }
        T_EQ(p.ops->size(p.st), n_ev);
    }
    pol_close(&p);
    return 0;
}

/* ---- a user policy through pgd_cache_params.policy_ops ---- */

/* MRU: the most recently released page first (the opposite of LRU), written against
 * policy.h only, with its memory from init->alloc. */
typedef struct mru {
    pgd_allocator al;
    uint32_t n, size, head, tail;
    uint32_t *prev, *next;
    uint8_t *in;
    int *n_calls; /* policy_ud: counts insert / hit / unreferenced calls */
    int ignore_accept;
} mru;

static void mru_destroy(void *state)
{
    mru *m = state;
    m->al.free(m->al.ud, m->prev);
    m->al.free(m->al.ud, m->next);
    m->al.free(m->al.ud, m->in);
    m->al.free(m->al.ud, m);
}

static int mru_create_common(const pgd_policy_init *init, void **state, int ignore_accept)
{
    const pgd_allocator *a = init->alloc;
    mru *m = a->malloc(a->ud, sizeof *m);
    *state = NULL;
    if (!m) return PGD_ENOMEM;
    memset(m, 0, sizeof *m);
    m->al = *a;
    m->n = init->n_pages;
    m->head = m->tail = PGD_POLICY_NO_PAGE;
    m->n_calls = init->ud;
    m->ignore_accept = ignore_accept;
    m->prev = a->malloc(a->ud, m->n * sizeof *m->prev);
    m->next = a->malloc(a->ud, m->n * sizeof *m->next);
    m->in = a->malloc(a->ud, m->n);
    if (!m->prev || !m->next || !m->in) {
        mru_destroy(m);
        return PGD_ENOMEM;
    }
    memset(m->in, 0, m->n);
    *state = m;
    return PGD_OK;
}

static int mru_create(const pgd_policy_init *init, void **state)
{
    return mru_create_common(init, state, 0);
}

/* A broken MRU whose victim ignores accept (it may pick a page with cached children). */
static int mru_bad_create(const pgd_policy_init *init, void **state)
{
    return mru_create_common(init, state, 1);
}

static void mru_unlink(mru *m, uint32_t id)
{
    if (!m->in[id]) return;
    uint32_t p = m->prev[id], n = m->next[id];
    if (p != PGD_POLICY_NO_PAGE)
        m->next[p] = n;
    else
        m->head = n;
    if (n != PGD_POLICY_NO_PAGE)
        m->prev[n] = p;
    else
        m->tail = p;
    m->in[id] = 0;
    m->size--;
}

static void mru_insert(void *state, uint32_t id, const pgd_policy_page *info)
{
    mru *m = state;
    (void)id, (void)info;
    if (m->n_calls) m->n_calls[0]++;
}

static void mru_hit(void *state, uint32_t id, const pgd_policy_page *info)
{
    mru *m = state;
    (void)info;
    if (m->n_calls) m->n_calls[1]++;
    mru_unlink(m, id);
}

static void mru_unreferenced(void *state, uint32_t id, const pgd_policy_page *info)
{
    mru *m = state;
    (void)info;
    if (m->n_calls) m->n_calls[2]++;
    m->prev[id] = m->tail;
    m->next[id] = PGD_POLICY_NO_PAGE;
    if (m->tail != PGD_POLICY_NO_PAGE)
        m->next[m->tail] = id;
    else
        m->head = id;
    m->tail = id;
    m->in[id] = 1;
    m->size++;
}

static uint32_t mru_victim(void *state, pgd_policy_accept_fn accept, void *ctx)
{
    mru *m = state;
    for (uint32_t id = m->tail; id != PGD_POLICY_NO_PAGE; id = m->prev[id])
        if (m->ignore_accept || accept(ctx, id)) return id;
    return PGD_POLICY_NO_PAGE;
}

static void mru_remove(void *state, uint32_t id)
{
    mru_unlink(state, id);
}

static int mru_contains(const void *state, uint32_t id)
{
    const mru *m = state;
    return id < m->n && m->in[id];
}

static uint32_t mru_size(const void *state)
{
    return ((const mru *)state)->size;
}

static const pgd_policy_ops mru_ops = {
    "mru",      mru_create, mru_destroy,  mru_insert, mru_hit, mru_unreferenced,
    mru_victim, mru_remove, mru_contains, mru_size,   NULL,
};
static const pgd_policy_ops mru_bad_ops = {
    "mru-bad",  mru_bad_create, mru_destroy,  mru_insert, mru_hit, mru_unreferenced,
    mru_victim, mru_remove,     mru_contains, mru_size,   NULL,
};

enum { UPT = 4 };

typedef struct {
    uint32_t n;
    uint32_t page[16];
    pgd_hash hash[16];
} evlog;

static void on_evict(void *ud, pgd_hash hash, uint32_t page)
{
    evlog *l = ud;
    if (l->n < 16) {
        l->page[l->n] = page;
        l->hash[l->n] = hash;
    }
    l->n++;
}

static void quiet_log(void *ud, int level, const char *msg)
{
    (void)level, (void)msg;
    ++*(int *)ud;
}

static pgd_cache *user_cache(const pgd_policy_ops *ops, void *policy_ud, evlog *ev, int *n_logs)
{
    pgd_cache_params p = pgd_cache_default_params();
    pgd_cache *c = NULL;
    p.pool.page_tokens = UPT;
    p.pool.capacity_pages = 16;
    p.pool.metadata_only = 1;
    p.policy_ops = ops;
    p.policy_ud = policy_ud;
    p.on_evict = on_evict;
    p.event_ud = ev;
    p.log = quiet_log;
    p.log_ud = n_logs;
    return pgd_cache_create(&p, &c) == PGD_OK ? c : NULL;
}

/* Commits n_pages pages of tokens base.. in a fresh sequence and releases it. */
static int cache_pages(pgd_cache *c, int32_t base, uint32_t n_pages)
{
    int32_t t[4 * UPT];
    pgd_seq *s;
    for (uint32_t i = 0; i < n_pages * UPT; i++)
        t[i] = base + (int32_t)i;
    T_OK(pgd_seq_create(c, NULL, 0, &s));
    T_OK(pgd_seq_grow(c, s, n_pages * UPT));
    T_EQ(pgd_seq_commit(c, s, t, n_pages * UPT), n_pages);
    pgd_seq_destroy(c, s);
    return pgd_cache_check(c) == PGD_OK ? 0 : 1;
}

/* Returns the cached length of the prompt base.., or -1. */
static int64_t cached_len(pgd_cache *c, int32_t base, uint32_t n_pages)
{
    int32_t t[4 * UPT];
    pgd_seq *s;
    for (uint32_t i = 0; i < n_pages * UPT; i++)
        t[i] = base + (int32_t)i;
    if (pgd_seq_create(c, NULL, 0, &s) != PGD_OK) return -1;
    int64_t m = pgd_seq_match(c, s, t, n_pages * UPT);
    pgd_seq_destroy(c, s);
    return m;
}

/* One-page prompts A, B, C released in that order: LRU evicts A first, MRU evicts C.
 * A two-page chain D = d0 <- d1 is released d1 first, so MRU's newest is d0, which has a
 * cached child: accept() refuses it and d1 goes first (leaves first, whatever the policy). */
static int test_user_policy_changes_order(void)
{
    for (int use_mru = 0; use_mru < 2; use_mru++) {
        int calls[3] = {0, 0, 0}, n_logs = 0;
        evlog ev = {0, {0}, {{0, 0}}};
        pgd_cache *c = user_cache(use_mru ? &mru_ops : NULL, calls, &ev, &n_logs);
        T_ASSERT(c != NULL);
        T_EQ(cache_pages(c, 100, 1), 0); /* A */
        T_EQ(cache_pages(c, 200, 1), 0); /* B */
        T_EQ(cache_pages(c, 300, 1), 0); /* C */
        if (use_mru) {
            T_EQ(calls[0], 3); /* insert: once per registered page */
            T_EQ(calls[2], 3); /* unreferenced: once per release */
        }
        T_EQ(pgd_cache_evict(c, 1), 1);
        T_OK(pgd_cache_check(c));
        T_EQ(cached_len(c, 100, 1), use_mru ? UPT : 0);
        T_EQ(cached_len(c, 300, 1), use_mru ? 0 : UPT);
        T_EQ(cached_len(c, 200, 1), UPT);
        if (use_mru) T_ASSERT(calls[1] >= 2); /* the matches hit pages */
        pgd_cache_clear(c);

        ev.n = 0;
        T_EQ(cache_pages(c, 400, 2), 0); /* D */
        T_EQ(pgd_cache_evict(c, 1), 1);
        T_EQ(ev.n, 1);
        T_EQ(cached_len(c, 400, 2), UPT); /* d1 went, d0 stays */
        T_EQ(pgd_cache_evict(c, 1), 1);
        T_EQ(cached_len(c, 400, 2), 0);
        T_OK(pgd_cache_check(c));
        T_EQ(n_logs, 0);
        pgd_cache_destroy(c);
    }
    return 0;
}

/* A policy whose victim is not an evictable leaf is refused: nothing is evicted, the
 * cache stays consistent, an error is logged, and a full pool reports PGD_ENOSPC. */
static int test_user_policy_bad_victim_refused(void)
{
    int n_logs = 0;
    evlog ev = {0, {0}, {{0, 0}}};
    pgd_cache *c = user_cache(&mru_bad_ops, NULL, &ev, &n_logs);
    T_ASSERT(c != NULL);
    T_EQ(cache_pages(c, 400, 2), 0); /* newest released: d0, the parent */
    T_EQ(pgd_cache_evict(c, 1), 0);
    T_EQ(ev.n, 0);
    T_ASSERT(n_logs > 0);
    T_OK(pgd_cache_check(c));
    T_EQ(cached_len(c, 400, 2), 2 * UPT);
    pgd_seq *s;
    T_OK(pgd_seq_create(c, NULL, 0, &s));
    T_EQ(pgd_seq_grow(c, s, 16 * UPT), PGD_ENOSPC); /* 14 free + 2 refused */
    T_EQ(pgd_seq_length(c, s), 0);
    T_OK(pgd_cache_check(c));
    pgd_seq_destroy(c, s);
    pgd_cache_destroy(c);

    /* A table with a NULL member is rejected at create. */
    pgd_policy_ops broken = mru_ops;
    broken.contains = NULL;
    T_ASSERT(user_cache(&broken, NULL, &ev, &n_logs) == NULL);
    return 0;
}

int main(void)
{
    T_RUN(test_lookup);
    T_RUN(test_lru_order);
    T_RUN(test_lru_random);
    T_RUN(test_belady_farthest);
    T_RUN(test_belady_ties_deeper_first);
    T_RUN(test_belady_random);
    T_RUN(test_user_policy_changes_order);
    T_RUN(test_user_policy_bad_victim_refused);
    T_DONE();
}
