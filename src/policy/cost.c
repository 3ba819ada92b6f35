/* SPDX-License-Identifier: MIT */
/*
 * cost.c - cost-aware eviction, GDSF-style (Greedy-Dual-Size-Frequency; Marconi, MLSys'25,
 * scores recency + alpha x FLOPs saved / bytes). Ops table: policy.h.
 *
 * The cost model (policy.h pgd_cost_model_page): a hit on the page at depth d (positions
 * [d*T, (d+1)*T), T = page_tokens) saves
 *     cost(d) = T * linear_flops_per_token + attn_flops_per_pos * T * (d*T + (T+1)/2)
 * FLOPs: the per-token linear part (projections, MLP) plus attention over everything
 * before each token. The cache gives it in info->cost and the page's size in info->bytes;
 * when they are 0 the policy computes cost(d) from the init's model and uses page_bytes.
 *
 * The value of an evictable page, taken when it is released (unreferenced):
 *     H = L + f^COST_FREQ_EXP * (1 + COST_DEPTH_WEIGHT * d) * (cost / bytes)^COST_COST_EXP
 * (pgd__policy_cost_value, the one place to change it), where
 *   - L is the inflation value: the key of the last victim (never decreasing). It ages the
 *     set: a page released now starts above every page that has waited since;
 *   - f is the page's access count over all its lives in this cache: 1 for each
 *     registration, plus its uses (the hit() calls, or info->uses when larger). What a page
 *     had when it left is remembered in a ghost table (below) and added back when its hash
 *     is registered again: dropping it at eviction loses the gain (the lead's Mooncake
 *     model: token hit ratio against LRU at 1/3/10/30% of unique blocks 0.98/1.0 without,
 *     1.13/1.09/1.01/1.02 with f, 1.23/1.13/1.01/1.03 with f^2, 1.20/1.05/1.02/1.01 with
 *     f*(1+d/8)).
 * victim() returns the accepted page of smallest key; ties: the deeper page, then the one
 * released first, then the lower id.
 *
 * Leaf rule: a release goes deepest page first, and a page's children cost more than it
 * does, so a chain's root would sit at the top of the heap while its leaves wait. When a
 * page is released right after a page one deeper (its child in the same release), its key
 * is raised to at least the child's: the top is then a leaf in practice (ties go to the
 * deeper page), and once the leaf goes the parent (key = L) follows, which is where pure
 * GDSF on the leaves would take it too. Otherwise the heap's best-first search (heap.h)
 * finds the first accepted page. That is rare: a match of a page is a match of all its
 * ancestors, so a parent's f is at least its child's, and released later its L is too;
 * only the depth term of the cost (T / (6 x width) a level for a dense model) can put a
 * parent below a child released in an earlier release. A tier breaks that: it holds
 * whole chains, demoted leaf first, so a parent arrives after its children with a lower
 * key, and the search walked thousands of refused parents a victim (ram:3M under a 1M
 * pool on the Mooncake trace: 8.7K blocks/s). Callers that know the tree say which pages
 * are not leaves (leaf(), policy.h): those wait in a second heap, parked, with their key,
 * and go back when their last child leaves; victim() searches the leaves' heap, then (a
 * caller's accept() that allows a parked page: the map's cycle fallback) the parked one.
 * Same victims, since accept() refuses every parked page; the walk is gone (figures in
 * the commit "policy: cost and priority keep non-leaves out of their victim heap").
 *
 * Ghost table: set-associative, PGD__POLICY_COST_WAYS (4) entries a set (one or two cache
 * lines), at least PGD__POLICY_COST_GHOST (32) x n_pages entries (pgd_int.h); an entry is
 * 64 bits of the hash (pgd__policy_cost_ghost_key: its low bits pick the set), f and the
 * time it was written. A page that leaves (remove) writes its f over its own entry, else
 * an empty way, else the oldest of its set; a registration takes (and clears) its hash's
 * entry. Its length matters: it must remember blocks for longer than the pool does
 * (Mooncake trace: figures in pgd_int.h). No allocation after create; O(log n) per
 * operation (the ghost: O(1), one set).
 *
 * Measured (pagoda replay --policy cost on ../shared/traces/mooncake-synthetic.jsonl, 512-
 * token blocks, capacity 1/3/10/30% of its 43924 unique blocks), token hit ratio against
 * LRU: 1.14/1.15/1.04/1.05 with these defaults; COST_COST_EXP 0 (frequency and aging
 * only): 1.26/1.13/1.01/1.03, the lead's f^2 figures; f^2.5: 1.17/1.16/1.01/1.05. The cost
 * term there is replay's pool geometry (1 layer x 1 KV head x 64: cost(d) = cost(0) x
 * (1 + 0.8 d) at 512 tokens); a wide model's cost barely grows with depth (T / (6 x width)
 * a level), which brings the policy close to COST_COST_EXP 0.
 */
#include <math.h>
#include <string.h>

#include "heap.h"

/* Parameters of the value function (see the header); a build may set them (-D) to sweep
 * them in replay. */
#ifndef COST_FREQ_EXP
#define COST_FREQ_EXP 2.0 /* weight of the access count: f^2 (lead: best at 1-3%) */
#endif
#ifndef COST_DEPTH_WEIGHT
#define COST_DEPTH_WEIGHT 0.0 /* extra weight of depth: 1/8.0 gives f*(1+d/8) */
#endif
#ifndef COST_COST_EXP
#define COST_COST_EXP 1.0 /* weight of cost/bytes; 0: frequency and aging only */
#endif

double pgd__policy_cost_value(double inflation, uint32_t freq, double cost, double bytes,
                              uint32_t depth)
{
    double w = pow((double)freq, COST_FREQ_EXP) * (1.0 + COST_DEPTH_WEIGHT * depth);
    return inflation + w * pow(cost / bytes, COST_COST_EXP);
}

typedef struct gslot {
    uint64_t key; /* pgd__policy_cost_ghost_key of the block hash */
    uint32_t f;   /* 0: empty */
    uint32_t age; /* ghost.tick when written */
} gslot;

typedef struct ghost {
    uint32_t mask; /* sets - 1 (a power of two) */
    uint32_t tick; /* writes so far (wraps; ages compare as tick - age) */
    gslot *slot;   /* [(mask + 1) * PGD__POLICY_COST_WAYS] */
} ghost;

/* What the policy keeps of a page (one array of these: one cache line per operation). */
typedef struct cpage {
    pgd_hash hash;
    double key;       /* H, with the leaf rule, while evictable */
    uint32_t base;    /* accesses of earlier lives + 1 for this registration */
    uint32_t uses;    /* uses in this life: max(hit() calls, info->uses) */
    uint32_t hits;    /* hit() calls in this life */
    uint16_t known;   /* 1 between insert (or unreferenced) and remove */
    uint16_t nonleaf; /* leaf(id, 0) was the last word since insert: parked */
} cpage;

typedef struct cost {
    pgd__alloc al;
    uint32_t n;
    pgd__heap heap;       /* key (H's bits, UINT32_MAX - depth, release number) */
    pgd__heap parked;     /* the evictable non-leaves (leaf()), same keys */
    cpage *pg;            /* [n] by page id */
    double inflation;     /* L */
    uint64_t n_released;  /* release clock */
    uint32_t last_victim; /* what victim() returned, until the next op */
    uint32_t prev_depth;  /* the previous op, when it was unreferenced() (leaf rule) */
    double prev_key;
    int prev_valid;
    pgd_cost_model model;
    uint32_t page_tokens;
    uint64_t page_bytes;
    ghost g;
} cost;

/* ---- ghost table ---- */

uint64_t pgd__policy_cost_ghost_key(pgd_hash h)
{
    uint64_t x = h.lo ^ (h.hi * 0x9E3779B97F4A7C15ull);
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    return x ^ (x >> 29);
}

/* Returns the f remembered for h and forgets it (0 if none). */
static uint32_t ghost_take(ghost *g, pgd_hash h)
{
    uint64_t key = pgd__policy_cost_ghost_key(h);
    gslot *set = g->slot + (size_t)(key & g->mask) * PGD__POLICY_COST_WAYS;
    for (uint32_t w = 0; w < PGD__POLICY_COST_WAYS; w++) {
        if (set[w].f && set[w].key == key) {
            uint32_t f = set[w].f;
            set[w].f = 0;
            return f;
        }
    }
    return 0;
}

/* Remembers h -> f (f > 0): over h's own entry, else an empty way, else the oldest. */
static void ghost_put(ghost *g, pgd_hash h, uint32_t f)
{
    uint64_t key = pgd__policy_cost_ghost_key(h);
    gslot *set = g->slot + (size_t)(key & g->mask) * PGD__POLICY_COST_WAYS;
    uint32_t pick = PGD__NONE, empty = PGD__NONE, oldest = 0;
    for (uint32_t w = 0; w < PGD__POLICY_COST_WAYS && pick == PGD__NONE; w++) {
        if (set[w].f && set[w].key == key) pick = w;
        if (!set[w].f && empty == PGD__NONE) empty = w;
        if (g->tick - set[w].age > g->tick - set[oldest].age) oldest = w;
    }
    if (pick == PGD__NONE) pick = empty != PGD__NONE ? empty : oldest;
    set[pick].key = key;
    set[pick].f = f;
    set[pick].age = g->tick++;
}

/* ---- the order ---- */

/* The heap's first key word: a non-negative double's bits order as its value. */
static uint64_t key_bits(double h)
{
    uint64_t u;
    memcpy(&u, &h, sizeof u);
    return u;
}

static uint32_t freq_of(const cost *c, uint32_t id)
{
    uint64_t f = (uint64_t)c->pg[id].base + c->pg[id].uses;
    return f > UINT32_MAX / 2 ? UINT32_MAX / 2 : (uint32_t)f;
}

/* ---- ops ---- */

static void cost_destroy(void *state)
{
    cost *c = state;
    if (!c) return;
    pgd__alloc al = c->al;
    pgd__heap_deinit(&c->heap, &al);
    pgd__heap_deinit(&c->parked, &al);
    pgd__free(&al, c->pg);
    pgd__free(&al, c->g.slot);
    pgd__free(&al, c);
}

static int cost_create(const pgd_policy_init *init, void **state)
{
    pgd__alloc a;
    pgd__alloc_init(&a, init->alloc);
    const pgd__alloc *al = &a;
    uint32_t n = init->n_pages;
    size_t m = n ? n : 1;
    cost *c = pgd__calloc(al, 1, sizeof *c);
    *state = NULL;
    if (!c) return PGD_ENOMEM;
    c->al = a;
    c->n = n;
    c->last_victim = PGD__NONE;
    c->model = init->cost;
    pgd_cost_model_default(&c->model, 1, 1, 1); /* a zero field: a unit model */
    c->page_tokens = init->page_tokens ? init->page_tokens : 1;
    c->page_bytes = init->page_bytes ? init->page_bytes : 1;
    int rc = pgd__heap_init(&c->heap, al, n);
    if (rc == PGD_OK) rc = pgd__heap_init(&c->parked, al, n);
    c->pg = pgd__calloc(al, m, sizeof *c->pg);
    uint64_t n_sets = 1;
    while (n_sets * PGD__POLICY_COST_WAYS < (uint64_t)PGD__POLICY_COST_GHOST * n &&
           n_sets < (1u << 30) / PGD__POLICY_COST_WAYS)
        n_sets *= 2;
    c->g.mask = (uint32_t)(n_sets - 1);
    c->g.slot = pgd__calloc(al, n_sets * PGD__POLICY_COST_WAYS, sizeof *c->g.slot);
    if (rc != PGD_OK || !c->pg || !c->g.slot) {
        cost_destroy(c);
        return PGD_ENOMEM;
    }
    *state = c;
    return PGD_OK;
}

/* A new life of page id with info's hash: the ghost's count comes back. */
static void cost_register(cost *c, uint32_t id, const pgd_policy_page *info)
{
    uint32_t f = ghost_take(&c->g, info->hash);
    c->pg[id].known = 1;
    c->pg[id].hash = info->hash;
    c->pg[id].base = f < UINT32_MAX / 2 ? f + 1 : UINT32_MAX / 2;
    c->pg[id].uses = info->uses;
    c->pg[id].hits = 0;
    c->pg[id].nonleaf = 0;
}

static int cost_in_set(const cost *c, uint32_t id)
{
    return pgd__heap_contains(&c->heap, id) || pgd__heap_contains(&c->parked, id);
}

/* Takes id out of the set (either heap). */
static void cost_take(cost *c, uint32_t id)
{
    pgd__heap_remove(&c->heap, id);
    pgd__heap_remove(&c->parked, id);
}

static void cost_op(cost *c)
{
    c->prev_valid = 0;
    c->last_victim = PGD__NONE;
}

static void cost_insert(void *state, uint32_t id, const pgd_policy_page *info)
{
    cost *c = state;
    PGD_CHECK(id < c->n);
    cost_op(c);
    cost_take(c, id);
    cost_register(c, id, info);
}

static void cost_hit(void *state, uint32_t id, const pgd_policy_page *info)
{
    cost *c = state;
    cost_op(c);
    if (id >= c->n || !c->pg[id].known) return;
    cost_take(c, id);
    if (c->pg[id].hits < UINT32_MAX) c->pg[id].hits++;
    c->pg[id].uses = info->uses > c->pg[id].hits ? info->uses : c->pg[id].hits;
}

static void cost_unreferenced(void *state, uint32_t id, const pgd_policy_page *info)
{
    cost *c = state;
    PGD_CHECK(id < c->n && !cost_in_set(c, id));
    int prev_valid = c->prev_valid;
    cost_op(c);
    if (!c->pg[id].known) cost_register(c, id, info);
    if (info->uses > c->pg[id].uses) c->pg[id].uses = info->uses;
    double flops =
        info->cost > 0 ? info->cost : pgd_cost_model_page(&c->model, c->page_tokens, info->depth);
    double bytes = (double)(info->bytes ? info->bytes : c->page_bytes);
    double h = pgd__policy_cost_value(c->inflation, freq_of(c, id), flops, bytes, info->depth);
    if (!(h >= 0)) h = 0; /* NaN or negative from a user cost: first to go */
    if (prev_valid && c->prev_depth == info->depth + 1 && c->prev_key > h) h = c->prev_key;
    c->pg[id].key = h;
    pgd__heap_push(c->pg[id].nonleaf ? &c->parked : &c->heap, id, key_bits(h),
                   UINT32_MAX - (uint64_t)info->depth, ++c->n_released);
    c->prev_valid = 1;
    c->prev_depth = info->depth;
    c->prev_key = h;
}

static uint32_t cost_victim(void *state, pgd_policy_accept_fn accept, void *ctx)
{
    cost *c = state;
    uint32_t v = pgd__heap_search(&c->heap, UINT64_MAX, accept, ctx);
    if (v == PGD__NONE) v = pgd__heap_search(&c->parked, UINT64_MAX, accept, ctx);
    c->last_victim = v;
    return v;
}

static void cost_remove(void *state, uint32_t id)
{
    cost *c = state;
    if (id < c->n && id == c->last_victim && cost_in_set(c, id) && c->pg[id].key > c->inflation)
        c->inflation = c->pg[id].key;
    cost_op(c);
    if (id >= c->n || !c->pg[id].known) return;
    cost_take(c, id);
    ghost_put(&c->g, c->pg[id].hash, freq_of(c, id));
    c->pg[id].known = 0;
}

static int cost_contains(const void *state, uint32_t id)
{
    const cost *c = state;
    return cost_in_set(c, id);
}

static uint32_t cost_size(const void *state)
{
    const cost *c = state;
    return c->heap.size + c->parked.size;
}

/* Parks a non-leaf (or brings it back) with its key. Touches no other state: the leaf
 * rule's previous release and last_victim stay (a tier calls it between them). */
static void cost_leaf(void *state, uint32_t id, int is_leaf)
{
    cost *c = state;
    if (id >= c->n || !c->pg[id].known || c->pg[id].nonleaf == !is_leaf) return;
    c->pg[id].nonleaf = (uint16_t)!is_leaf;
    if (is_leaf)
        pgd__heap_move(&c->parked, &c->heap, id);
    else
        pgd__heap_move(&c->heap, &c->parked, id);
}

const pgd_policy_ops pgd__policy_cost = {
    "cost",      cost_create, cost_destroy,  cost_insert, cost_hit,  cost_unreferenced,
    cost_victim, cost_remove, cost_contains, cost_size,   cost_leaf,
};
