/* SPDX-License-Identifier: MIT */
/*
 * test_policy_cost.c - the cost-aware GDSF policy (src/policy/cost.c) through its ops
 * table: cost grows with depth, frequency (remembered across eviction by the ghost
 * table), aging by the inflation value, the leaf rule of a chain released deepest first,
 * a brute-force reference (plain arrays, linear scans, the same value function
 * pgd__policy_cost_value) on random operation sequences with random accept sets, victim()
 * equal at every step, the same with the caller's leaf() calls on random chains (accept =
 * the leaves), and the policy in a cache (pgd_cache_params.policy = cost).
 */
#include <pagoda/cache.h>
#include <pagoda/policy.h>

#include "pgd_int.h"
#include "t.h"
#include "t_alloc.h"

enum { PT = 16 }; /* page_tokens of the init */

static const pgd_cost_model model = {1000.0, 3.0};

static int accept_all(void *ctx, uint32_t id)
{
    (void)ctx, (void)id;
    return 1;
}

/* ctx: a uint64_t mask of accepted ids (ids < 64). */
static int accept_mask(void *ctx, uint32_t id)
{
    return id < 64 && ((*(const uint64_t *)ctx >> id) & 1);
}

typedef struct {
    const pgd_policy_ops *ops;
    pgd__alloc al;
    void *st;
} pol;

static int pol_open(pol *p, uint32_t n)
{
    p->ops = pgd_policy_builtin(PGD_POLICY_COST);
    if (!p->ops) return -1;
    pgd__alloc_init(&p->al, NULL);
    p->st = NULL;
    pgd_policy_init init = {
        .n_pages = n, .alloc = &p->al.a, .page_bytes = 100, .cost = model, .page_tokens = PT};
    return p->ops->create(&init, &p->st);
}

static pgd_hash hash_of(uint64_t k)
{
    pgd_hash h = {k * 0x9E3779B97F4A7C15ull + 1, k ^ 0x5555};
    return h;
}

static pgd_policy_page info(uint64_t hk, uint32_t depth, double cost)
{
    pgd_policy_page i;
    memset(&i, 0, sizeof i);
    i.hash = hash_of(hk);
    i.depth = depth;
    i.priority = PGD_PRIORITY_DEFAULT;
    i.cost = cost;
    i.bytes = 1;
    return i;
}

static void release(pol *p, uint32_t id, uint64_t hk, uint32_t depth, double cost)
{
    pgd_policy_page i = info(hk, depth, cost);
    p->ops->insert(p->st, id, &i);
    p->ops->unreferenced(p->st, id, &i);
}

static uint32_t evict(pol *p, pgd_policy_accept_fn acc, void *ctx)
{
    uint32_t v = p->ops->victim(p->st, acc, ctx);
    if (v != PGD_POLICY_NO_PAGE) p->ops->remove(p->st, v);
    return v;
}

static int test_name(void)
{
    pgd_policy_kind k;
    T_OK(pgd_policy_from_name("cost", &k));
    T_EQ(k, PGD_POLICY_COST);
    T_ASSERT(strcmp(pgd_policy_name(PGD_POLICY_COST), "cost") == 0);
    T_ASSERT(pgd_policy_builtin(PGD_POLICY_COST) == &pgd__policy_cost);
    return 0;
}

/* Unrelated pages (not parent and child): the shallower page costs less, goes first; with
 * the cost from the init's model (info->cost 0) as well as given. */
static int test_depth_cost(void)
{
    pol p;
    T_OK(pol_open(&p, 16));
    T_EQ(p.ops->victim(p.st, accept_all, NULL), PGD_POLICY_NO_PAGE);
    release(&p, 0, 10, 5, 0);
    release(&p, 1, 11, 0, 0);
    release(&p, 2, 12, 9, 0);
    release(&p, 3, 13, 3, 0);
    T_EQ(evict(&p, accept_all, NULL), 1);
    T_EQ(evict(&p, accept_all, NULL), 3);
    T_EQ(evict(&p, accept_all, NULL), 0);
    T_EQ(evict(&p, accept_all, NULL), 2);
    /* a given cost wins over the model */
    release(&p, 4, 20, 9, 1.0);
    release(&p, 5, 21, 0, 1e9);
    T_EQ(evict(&p, accept_all, NULL), 4);
    T_EQ(evict(&p, accept_all, NULL), 5);
    p.ops->destroy(p.st);
    return 0;
}

/* A page hit often outlives a page of the same cost hit never; the count survives an
 * eviction through the ghost table. */
static int test_frequency_and_ghost(void)
{
    pol p;
    T_OK(pol_open(&p, 16));
    pgd_policy_page hot = info(1, 0, 1.0);
    p.ops->insert(p.st, 0, &hot);
    for (int k = 0; k < 3; k++)
        p.ops->hit(p.st, 0, &hot); /* f = 4 */
    p.ops->unreferenced(p.st, 0, &hot);
    release(&p, 1, 2, 0, 1.0); /* f = 1 */
    T_EQ(evict(&p, accept_all, NULL), 1);
    T_EQ(evict(&p, accept_all, NULL), 0); /* the hot page leaves with f = 4: ghost */
    /* inflation is now 16 (the hot page's key); both come back: the hot one with its
     * past count (f = 5) against a fresh page of 10x its cost (f = 1) */
    release(&p, 2, 1, 0, 1.0);
    release(&p, 3, 3, 0, 10.0);
    T_EQ(evict(&p, accept_all, NULL), 3);
    T_EQ(evict(&p, accept_all, NULL), 2);
    p.ops->destroy(p.st);
    return 0;
}

/* Aging: pages evicted past a refused page raise L, so a cheap page released later
 * outranks a costlier page that has waited. */
static int test_aging(void)
{
    pol p;
    T_OK(pol_open(&p, 16));
    release(&p, 0, 1, 0, 4.0);  /* H = 4 */
    release(&p, 1, 2, 0, 60.0); /* H = 60 */
    uint64_t not0 = ~1ull;
    T_EQ(evict(&p, accept_mask, &not0), 1); /* L = 60 */
    release(&p, 2, 3, 0, 1.0);              /* H = 61 */
    T_EQ(evict(&p, accept_all, NULL), 0);
    T_EQ(evict(&p, accept_all, NULL), 2);
    p.ops->destroy(p.st);
    return 0;
}

/* A chain released deepest first: the leaf is the top although the root costs less, and
 * the chain goes leaf to root. A parent released apart from its child keeps its own key:
 * accept() refuses it and the search finds the leaf. */
static int test_leaf_rule(void)
{
    pol p;
    T_OK(pol_open(&p, 16));
    pgd_policy_page d[3];
    for (uint32_t k = 0; k < 3; k++) {
        d[k] = info(100 + k, k, 0);
        p.ops->insert(p.st, k, &d[k]);
    }
    for (int k = 2; k >= 0; k--)
        p.ops->unreferenced(p.st, (uint32_t)k, &d[k]);
    release(&p, 5, 200, 1, 0); /* an unrelated page at depth 1 */
    T_EQ(p.ops->victim(p.st, accept_all, NULL), 5);
    T_EQ(evict(&p, accept_all, NULL), 5);
    T_EQ(evict(&p, accept_all, NULL), 2);
    T_EQ(evict(&p, accept_all, NULL), 1);
    T_EQ(evict(&p, accept_all, NULL), 0);
    /* parent 6 released, then (another release) its child 7: 6 is cheaper */
    release(&p, 6, 300, 0, 0);
    release(&p, 7, 302, 1, 0);
    uint64_t leaves = ~(1ull << 6);
    T_EQ(p.ops->victim(p.st, accept_all, NULL), 6);
    T_EQ(p.ops->victim(p.st, accept_mask, &leaves), 7);
    p.ops->destroy(p.st);
    return 0;
}

/* ---- the brute-force reference ---- */

enum { N = 40, NH = 2000, G = PGD__POLICY_COST_GHOST * N };

/* The ghost's sets as cost.c sizes them: the fewest (a power of two) holding G entries. */
static uint32_t ghost_sets(void)
{
    uint32_t n = 1;
    while (n * PGD__POLICY_COST_WAYS < G)
        n *= 2;
    return n;
}

typedef struct {
    int state[N]; /* 0 absent, 1 registered and referenced, 2 evictable */
    uint64_t hk[N];
    uint32_t depth[N], base[N], uses[N], hits[N];
    double key[N];
    uint64_t seq[N], n_released;
    uint64_t g_key[2 * G]; /* [set][way] */
    uint32_t g_f[2 * G], g_age[2 * G], g_tick;
    double L;
    uint32_t last_victim;
    int prev_valid;
    uint32_t prev_depth;
    double prev_key;
} ref;

static uint32_t ref_f(const ref *r, uint32_t id)
{
    return r->base[id] + r->uses[id];
}

static void ref_op(ref *r)
{
    r->prev_valid = 0;
    r->last_victim = PGD_POLICY_NO_PAGE;
}

static uint32_t ref_ghost_take(ref *r, uint64_t hk)
{
    uint64_t key = pgd__policy_cost_ghost_key(hash_of(hk));
    uint32_t set = (uint32_t)(key % ghost_sets());
    for (uint32_t w = 0; w < PGD__POLICY_COST_WAYS; w++) {
        uint32_t s = set * PGD__POLICY_COST_WAYS + w;
        if (r->g_f[s] && r->g_key[s] == key) {
            uint32_t f = r->g_f[s];
            r->g_f[s] = 0;
            return f;
        }
    }
    return 0;
}

/* Over its own entry, else the first empty way, else the oldest way of its set. */
static void ref_ghost_put(ref *r, uint64_t hk, uint32_t f)
{
    uint64_t key = pgd__policy_cost_ghost_key(hash_of(hk));
    uint32_t base = (uint32_t)(key % ghost_sets()) * PGD__POLICY_COST_WAYS, pick = UINT32_MAX;
    for (uint32_t w = 0; w < PGD__POLICY_COST_WAYS && pick == UINT32_MAX; w++)
        if (r->g_f[base + w] && r->g_key[base + w] == key) pick = base + w;
    for (uint32_t w = 0; w < PGD__POLICY_COST_WAYS && pick == UINT32_MAX; w++)
        if (!r->g_f[base + w]) pick = base + w;
    if (pick == UINT32_MAX) {
        pick = base;
        for (uint32_t w = 1; w < PGD__POLICY_COST_WAYS; w++)
            if (r->g_age[base + w] < r->g_age[pick]) pick = base + w;
    }
    r->g_key[pick] = key;
    r->g_f[pick] = f;
    r->g_age[pick] = r->g_tick++;
}

static void ref_register(ref *r, uint32_t id, const pgd_policy_page *i, uint64_t hk)
{
    r->hk[id] = hk;
    r->depth[id] = i->depth;
    r->base[id] = ref_ghost_take(r, hk) + 1;
    r->uses[id] = i->uses;
    r->hits[id] = 0;
}

static int ref_before(const ref *r, uint32_t a, uint32_t b)
{
    if (r->key[a] != r->key[b]) return r->key[a] < r->key[b];
    if (r->depth[a] != r->depth[b]) return r->depth[a] > r->depth[b];
    if (r->seq[a] != r->seq[b]) return r->seq[a] < r->seq[b];
    return a < b;
}

static uint32_t ref_victim(ref *r, uint64_t mask)
{
    uint32_t best = PGD_POLICY_NO_PAGE;
    for (uint32_t i = 0; i < N; i++)
        if (r->state[i] == 2 && ((mask >> i) & 1) &&
            (best == PGD_POLICY_NO_PAGE || ref_before(r, i, best)))
            best = i;
    r->last_victim = best;
    return best;
}

static void ref_unref(ref *r, uint32_t id, const pgd_policy_page *i)
{
    int prev_valid = r->prev_valid;
    ref_op(r);
    if (i->uses > r->uses[id]) r->uses[id] = i->uses;
    r->depth[id] = i->depth;
    double c = i->cost > 0 ? i->cost : pgd_cost_model_page(&model, PT, i->depth);
    double h = pgd__policy_cost_value(r->L, ref_f(r, id), c, i->bytes ? (double)i->bytes : 100.0,
                                      i->depth);
    if (prev_valid && r->prev_depth == i->depth + 1 && r->prev_key > h) h = r->prev_key;
    r->key[id] = h;
    r->seq[id] = ++r->n_released;
    r->state[id] = 2;
    r->prev_valid = 1;
    r->prev_depth = i->depth;
    r->prev_key = h;
}

static void ref_remove(ref *r, uint32_t id)
{
    if (id == r->last_victim && r->state[id] == 2 && r->key[id] > r->L) r->L = r->key[id];
    ref_op(r);
    ref_ghost_put(r, r->hk[id], ref_f(r, id));
    r->state[id] = 0;
}

/* A random hash key not held by a registered page (the index holds each hash once). */
static uint64_t free_hash(const ref *r, uint64_t *seed)
{
    for (;;) {
        uint64_t hk = t_rand(seed) % NH;
        int used = 0;
        for (uint32_t i = 0; i < N; i++)
            used |= r->state[i] != 0 && r->hk[i] == hk;
        if (!used) return hk;
    }
}

static pgd_policy_page rand_info(const ref *r, uint32_t id, uint32_t depth, uint64_t *seed,
                                 int cache_uses)
{
    pgd_policy_page i = info(r->hk[id], depth, 0);
    if (t_rand(seed) % 2) i.cost = (double)(1 + t_rand(seed) % 5) * 1e4;
    i.bytes = t_rand(seed) % 2 ? 0 : 100 + t_rand(seed) % 3 * 50;
    if (cache_uses) i.uses = r->hits[id];
    return i;
}

static int run_random(uint64_t seed, int steps, int cache_uses)
{
    pol p;
    static ref r;
    memset(&r, 0, sizeof r);
    r.last_victim = PGD_POLICY_NO_PAGE;
    T_OK(pol_open(&p, N));
    for (int step = 0; step < steps; step++) {
        uint32_t id = (uint32_t)(t_rand(&seed) % N), op = (uint32_t)(t_rand(&seed) % 9);
        if (op <= 1 && r.state[id] == 0) { /* register */
            r.hk[id] = free_hash(&r, &seed);
            pgd_policy_page i = rand_info(&r, id, (uint32_t)(t_rand(&seed) % 8), &seed, 0);
            p.ops->insert(p.st, id, &i);
            ref_op(&r);
            ref_register(&r, id, &i, r.hk[id]);
            r.state[id] = 1;
        } else if (op == 2 && r.state[id] == 1) { /* release one */
            pgd_policy_page i = rand_info(&r, id, r.depth[id], &seed, cache_uses);
            p.ops->unreferenced(p.st, id, &i);
            ref_unref(&r, id, &i);
        } else if (op == 3) { /* release a chain deepest first */
            uint32_t d = 1 + (uint32_t)(t_rand(&seed) % 4);
            for (uint32_t k = 0; k < N && d > 0; k++) {
                uint32_t j = (id + k) % N;
                if (r.state[j] != 1) continue;
                d--;
                pgd_policy_page i = rand_info(&r, j, d, &seed, cache_uses);
                p.ops->unreferenced(p.st, j, &i);
                ref_unref(&r, j, &i);
            }
        } else if (op <= 5 && r.state[id] != 0) { /* a match takes a reference */
            if (r.hits[id] < 1000) r.hits[id]++;
            pgd_policy_page i = rand_info(&r, id, r.depth[id], &seed, cache_uses);
            p.ops->hit(p.st, id, &i);
            ref_op(&r);
            r.uses[id] = i.uses > r.hits[id] ? i.uses : r.hits[id];
            r.state[id] = 1;
        } else if (op == 6 && r.state[id] != 0 && t_rand(&seed) % 3 == 0) {
            p.ops->remove(p.st, id);
            ref_remove(&r, id);
        } else if (op >= 7) { /* evict with a random accept set */
            uint64_t mask = t_rand(&seed) | t_rand(&seed);
            uint32_t v = p.ops->victim(p.st, accept_mask, &mask);
            T_EQ(v, ref_victim(&r, mask));
            if (v != PGD_POLICY_NO_PAGE) {
                p.ops->remove(p.st, v);
                ref_remove(&r, v);
            }
        }
        uint64_t mask = t_rand(&seed);
        T_EQ(p.ops->victim(p.st, accept_all, NULL), ref_victim(&r, ~0ull));
        T_EQ(p.ops->victim(p.st, accept_mask, &mask), ref_victim(&r, mask));
        uint32_t n_ev = 0;
        for (uint32_t k = 0; k < N; k++) {
            n_ev += r.state[k] == 2;
            T_EQ(!!p.ops->contains(p.st, k), r.state[k] == 2);
        }
        T_EQ(p.ops->size(p.st), n_ev);
    }
    p.ops->destroy(p.st);
    return 0;
}

static int test_random_against_reference(void)
{
    for (uint64_t seed = 1; seed <= 6; seed++)
        if (run_random(seed * 104729, 15000, (int)(seed % 2))) return -1;
    return 0;
}

/* ctx: a counted_mask; counts the calls. */
typedef struct {
    uint64_t mask;
    uint32_t calls;
} counted_mask;

static int accept_counted(void *ctx, uint32_t id)
{
    counted_mask *cm = ctx;
    cm->calls++;
    return accept_mask(&cm->mask, id);
}

/*
 * Random chains as a tier sees them: a fixed forest (parent[] of each page), pages
 * registered in any order (a child before its parent), and the caller's leaf() calls
 * whenever a registered page gains its first registered child or loses its last. The
 * reference knows nothing of leaf(): victim(accept = the leaves, or a random part of them)
 * equals the reference's victim over the same set at every step; an accept set holding
 * only non-leaves (no leaf accepted) finds the reference's victim too (the parked heap).
 * With every leaf accepted (one at least), victim() asks accept() once: no refused parent
 * is walked.
 */
static int run_leaf(uint64_t seed, int steps)
{
    pol p;
    static ref r;
    uint32_t parent[N], depth[N], kids[N]; /* kids: registered children, registered or not */
    memset(&r, 0, sizeof r);
    memset(kids, 0, sizeof kids);
    r.last_victim = PGD_POLICY_NO_PAGE;
    for (uint32_t id = 0; id < N; id++) {
        parent[id] =
            id == 0 || t_rand(&seed) % 4 == 0 ? UINT32_MAX : (uint32_t)(t_rand(&seed) % id);
        depth[id] = parent[id] == UINT32_MAX ? 0 : depth[parent[id]] + 1;
    }
    T_OK(pol_open(&p, N));
    uint32_t n_parked_victims = 0;
    for (int step = 0; step < steps; step++) {
        uint32_t id = (uint32_t)(t_rand(&seed) % N), op = (uint32_t)(t_rand(&seed) % 8);
        uint32_t up = parent[id];
        if (op <= 1 && r.state[id] == 0) { /* register; its children may be there already */
            r.hk[id] = free_hash(&r, &seed);
            pgd_policy_page i = rand_info(&r, id, depth[id], &seed, 0);
            if (up != UINT32_MAX && kids[up]++ == 0 && r.state[up] != 0) p.ops->leaf(p.st, up, 0);
            p.ops->insert(p.st, id, &i);
            if (kids[id]) p.ops->leaf(p.st, id, 0);
            ref_op(&r);
            ref_register(&r, id, &i, r.hk[id]);
            r.state[id] = 1;
            if (t_rand(&seed) % 2) { /* a tier releases it at once */
                i = rand_info(&r, id, depth[id], &seed, 1);
                p.ops->unreferenced(p.st, id, &i);
                ref_unref(&r, id, &i);
            }
        } else if (op == 2 && r.state[id] == 1) {
            pgd_policy_page i = rand_info(&r, id, depth[id], &seed, 1);
            p.ops->unreferenced(p.st, id, &i);
            ref_unref(&r, id, &i);
        } else if (op == 3 && r.state[id] != 0) { /* a match (a promotion, a pin) */
            if (r.hits[id] < 1000) r.hits[id]++;
            pgd_policy_page i = rand_info(&r, id, depth[id], &seed, 1);
            p.ops->hit(p.st, id, &i);
            ref_op(&r);
            r.uses[id] = i.uses > r.hits[id] ? i.uses : r.hits[id];
            r.state[id] = 1;
        } else if (op >= 4) { /* evict among the leaves, or remove any registered page */
            uint64_t leaves = 0;
            for (uint32_t k = 0; k < N; k++)
                if (r.state[k] == 2 && !kids[k]) leaves |= 1ull << k;
            uint64_t mask = op == 4 ? leaves & (t_rand(&seed) | t_rand(&seed)) : leaves;
            uint32_t v = p.ops->victim(p.st, accept_mask, &mask);
            T_EQ(v, ref_victim(&r, mask));
            if (op == 7 && r.state[id] != 0) v = id;
            if (v == PGD_POLICY_NO_PAGE) continue;
            p.ops->remove(p.st, v);
            ref_remove(&r, v);
            if (parent[v] != UINT32_MAX && --kids[parent[v]] == 0 && r.state[parent[v]] != 0)
                p.ops->leaf(p.st, parent[v], 1);
        }
        uint64_t leaves = 0, inner = 0, mask = t_rand(&seed);
        for (uint32_t k = 0; k < N; k++)
            if (r.state[k] == 2) *(kids[k] ? &inner : &leaves) |= 1ull << k;
        counted_mask cm = {leaves, 0};
        T_EQ(p.ops->victim(p.st, accept_counted, &cm), ref_victim(&r, leaves));
        T_ASSERT(cm.calls <= 1 || !leaves);
        mask = leaves & mask;
        T_EQ(p.ops->victim(p.st, accept_mask, &mask), ref_victim(&r, mask));
        if (!leaves && inner) {
            n_parked_victims++;
            T_EQ(p.ops->victim(p.st, accept_mask, &inner), ref_victim(&r, inner));
        }
        mask = inner & t_rand(&seed);
        if (!leaves) T_EQ(p.ops->victim(p.st, accept_mask, &mask), ref_victim(&r, mask));
        uint32_t n_ev = 0;
        for (uint32_t k = 0; k < N; k++) {
            n_ev += r.state[k] == 2;
            T_EQ(!!p.ops->contains(p.st, k), r.state[k] == 2);
        }
        T_EQ(p.ops->size(p.st), n_ev);
    }
    p.ops->destroy(p.st);
    T_ASSERT(n_parked_victims > 0);
    return 0;
}

static int test_leaf_op_against_reference(void)
{
    T_ASSERT(pgd_policy_builtin(PGD_POLICY_COST)->leaf != NULL);
    for (uint64_t seed = 1; seed <= 6; seed++)
        if (run_leaf(seed * 7717, 15000)) return -1;
    return 0;
}

/* ---- in a cache ---- */

enum { UPT = 4 };

/* Commits n_pages pages of tokens base.. in a fresh sequence and releases it. */
static int cache_pages(pgd_cache *c, int32_t base, uint32_t n_pages)
{
    int32_t t[8 * UPT];
    pgd_seq *s;
    for (uint32_t i = 0; i < n_pages * UPT; i++)
        t[i] = base + (int32_t)i;
    T_OK(pgd_seq_create(c, NULL, 0, &s));
    T_OK(pgd_seq_grow(c, s, n_pages * UPT));
    T_EQ(pgd_seq_commit(c, s, t, n_pages * UPT), n_pages);
    pgd_seq_destroy(c, s);
    return pgd_cache_check(c) == PGD_OK ? 0 : 1;
}

/* Returns the cached length of the prompt base.. (a match: a hit on each page), or -1. */
static int64_t cached_len(pgd_cache *c, int32_t base, uint32_t n_pages)
{
    int32_t t[8 * UPT];
    pgd_seq *s;
    for (uint32_t i = 0; i < n_pages * UPT; i++)
        t[i] = base + (int32_t)i;
    if (pgd_seq_create(c, NULL, 0, &s) != PGD_OK) return -1;
    int64_t m = pgd_seq_match(c, s, t, n_pages * UPT);
    pgd_seq_destroy(c, s);
    return m;
}

/* The policy runs a cache: chains evicted leaves first, a matched prompt kept over one
 * never matched, pgd_cache_check consistent throughout. */
static int test_in_cache(void)
{
    pgd_cache_params p = pgd_cache_default_params();
    pgd_cache *c = NULL;
    p.pool.page_tokens = UPT;
    p.pool.capacity_pages = 16;
    p.pool.metadata_only = 1;
    p.policy = PGD_POLICY_COST;
    T_OK(pgd_cache_create(&p, &c));
    T_EQ(cache_pages(c, 100, 4), 0); /* A: 4 pages */
    T_EQ(cache_pages(c, 500, 4), 0); /* B: 4 pages */
    for (int k = 0; k < 3; k++)
        T_EQ(cached_len(c, 100, 4), 4 * UPT);
    T_OK(pgd_cache_check(c));
    T_EQ(pgd_cache_evict(c, 1), 1); /* B's leaf */
    T_OK(pgd_cache_check(c));
    T_EQ(cached_len(c, 500, 4), 3 * UPT);
    T_EQ(pgd_cache_evict(c, 3), 3);
    T_EQ(cached_len(c, 100, 4), 4 * UPT);
    T_EQ(pgd_cache_evict(c, 1), 1);
    T_EQ(cached_len(c, 100, 4), 3 * UPT);
    /* fill past capacity: evictions on demand stay consistent */
    for (int32_t k = 0; k < 12; k++)
        T_EQ(cache_pages(c, 1000 + 100 * k, 1 + (uint32_t)k % 4), 0);
    T_OK(pgd_cache_check(c));
    pgd_cache_destroy(c);
    return 0;
}

/* Every allocation of create failing in turn: PGD_ENOMEM, *state NULL, nothing leaked. */
static int test_create_oom(void)
{
    static t_counting A;
    const pgd_allocator alloc = T_COUNTING_ALLOCATOR(&A);
    for (long n = 1;; n++) {
        void *st = &A;
        pgd_policy_init init = {
            .n_pages = 100, .alloc = &alloc, .page_bytes = 1, .page_tokens = PT, .cost = model};
        t_counting_arm(&A, n);
        int rc = pgd_policy_builtin(PGD_POLICY_COST)->create(&init, &st);
        A.fail_at = 0;
        if (A.fired) {
            T_EQ(rc, PGD_ENOMEM);
            T_ASSERT(st == NULL);
            T_EQ(A.n_live, 0);
            continue;
        }
        T_OK(rc);
        pgd_policy_builtin(PGD_POLICY_COST)->destroy(st);
        T_EQ(A.n_live, 0);
        T_ASSERT(n > 2);
        return 0;
    }
}

int main(void)
{
    T_RUN(test_name);
    T_RUN(test_create_oom);
    T_RUN(test_depth_cost);
    T_RUN(test_frequency_and_ghost);
    T_RUN(test_aging);
    T_RUN(test_leaf_rule);
    T_RUN(test_random_against_reference);
    T_RUN(test_leaf_op_against_reference);
    T_RUN(test_in_cache);
    T_DONE();
}
