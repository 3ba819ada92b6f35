/* SPDX-License-Identifier: MIT */
/*
 * test_policy.c - eviction policies through their ops table (pgd_int.h): LRU order,
 * hit/remove/accept semantics, a randomized LRU model, and Belady's farthest-next-use
 * choice with a fake oracle.
 */
#include "pgd_int.h"
#include "t.h"

static pgd__pinfo info_of(uint32_t id, uint32_t depth)
{
    pgd__pinfo i;
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
    const pgd__policy_ops *ops;
    pgd__alloc al;
    void *st;
} pol;

static int pol_open(pol *p, const pgd__policy_ops *ops, uint32_t n, pgd_next_use_fn fn, void *ud)
{
    p->ops = ops;
    pgd__alloc_init(&p->al, NULL);
    p->st = NULL;
    return ops->create(&p->al, n, fn, ud, &p->st);
}

static void pol_close(pol *p)
{
    p->ops->destroy(&p->al, p->st);
}

static void ins(pol *p, uint32_t id, uint32_t depth)
{
    pgd__pinfo i = info_of(id, depth);
    p->ops->insert(p->st, id, &i);
}

static void unref(pol *p, uint32_t id, uint32_t depth)
{
    pgd__pinfo i = info_of(id, depth);
    p->ops->unreferenced(p->st, id, &i);
}

static void hit(pol *p, uint32_t id, uint32_t depth)
{
    pgd__pinfo i = info_of(id, depth);
    p->ops->hit(p->st, id, &i);
}

/* victim + remove, as the cache manager evicts */
static uint32_t evict(pol *p, pgd__accept_fn acc, void *ctx)
{
    uint32_t v = p->ops->victim(p->st, acc, ctx);
    if (v != PGD__NONE) p->ops->remove(p->st, v);
    return v;
}

static int test_lookup(void)
{
    T_ASSERT(pgd__policy_lookup(PGD_POLICY_LRU) == &pgd__policy_lru);
    T_ASSERT(pgd__policy_lookup(PGD_POLICY_BELADY) == &pgd__policy_belady);
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

int main(void)
{
    T_RUN(test_lookup);
    T_RUN(test_lru_order);
    T_RUN(test_lru_random);
    T_RUN(test_belady_farthest);
    T_RUN(test_belady_ties_deeper_first);
    T_RUN(test_belady_random);
    T_DONE();
}
