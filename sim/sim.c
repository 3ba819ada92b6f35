/* SPDX-License-Identifier: MIT */
/*
 * sim.c - the replay simulator: a trace through the real cache manager (model in sim.h).
 *
 * Belady needs the future. Before the replay, two passes over the trace build a
 * "future index": an open-addressing map from block key to a slot holding the sorted
 * list of request indices that contain the block (CSR layout, one shared array):
 *
 *     map[key] -> slot { start, count, cursor }      occ[start .. start+count) = requests
 *
 * The cache asks next_use(key) when a page is hit, inserted or released; the answer is
 * the first request after the current one that contains the block (UINT64_MAX if none).
 * The current request index only grows, so each slot keeps a cursor that moves forward:
 * every next_use call is O(1) amortized. Pass one also counts distinct blocks, which
 * sizes an "unlimited" pool, and gives each its chain parent. LRU with a fixed capacity
 * and no tiers skips the index altogether.
 *
 * Tiers (model in sim.h) name blocks by their slot in that index, so each tier is a few
 * arrays over the distinct blocks plus a policy (policy.h ops, page ids = slots): per
 * block whether the tier holds it, its hits there, and how many of its children the tier
 * holds (counted whether or not the block itself is there, so a parent demoted after its
 * children starts with the right count). The policy's accept() is "held, no child held":
 * the leaf-only rule of the pool. The pool's evictions reach the tiers through the
 * cache's on_evict event. The index is built whenever tiers are used or the capacity is
 * unlimited; its occurrence lists only when Belady orders the pool or a tier.
 *
 * Timing model (sim.h): a binary min-heap of the running requests by completion time
 * holds their live sequences; each arrival first destroys those done by then.
 */
#include "sim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#define NONE UINT32_MAX

/* Chain seed ("pgdrplay") and the fixed hash key: replay results never depend on
 * randomness. */
static const pgd_hash chain_seed = {UINT64_C(0x70676472706c6179), 0};
static const uint8_t replay_key[] = "pagoda replay: fixed key";

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Key of a block: XXH3-128 of (key of the previous block, id). */
static pgd_hash chain(pgd_hash prev, uint64_t id)
{
    uint64_t buf[3] = {prev.lo, prev.hi, id};
    XXH128_hash_t x = XXH3_128bits(buf, sizeof buf);
    pgd_hash h = {x.low64, x.high64};
    return h;
}

static void chain_all(const trace_set *t, size_t r, pgd_hash *out)
{
    const trace_rec *rec = &t->reqs[r];
    const uint64_t *ids = t->ids + rec->ids_off;
    pgd_hash h = chain_seed;
    for (uint64_t i = 0; i < rec->n_ids; i++) {
        h = chain(h, ids[i]);
        out[i] = h;
    }
}

/* ---- the future index ---- */

typedef struct slot {
    pgd_hash key;
    uint64_t start;    /* first occurrence in occ[] */
    uint32_t count;    /* requests containing the block */
    uint32_t cursor;   /* occ[start + cursor] is the next candidate (only moves forward) */
    uint32_t last_req; /* last request counted, so a request counts once */
    uint32_t parent;   /* slot of the previous block of the chain; NONE for a first block */
    uint32_t depth;    /* 0 for a first block; the parent's + 1 */
} slot;

typedef struct future {
    uint32_t *map; /* [mask + 1] slot index or NONE; load <= 1/2 */
    uint64_t mask;
    slot *slots; /* [n_slots] */
    uint32_t n_slots, cap_slots;
    uint32_t *occ; /* request indices, grouped by slot, ascending within a slot */
    uint32_t cur;  /* index of the request being replayed */
} future;

static void future_deinit(future *f)
{
    free(f->map);
    free(f->slots);
    free(f->occ);
    memset(f, 0, sizeof *f);
}

static int map_resize(future *f, uint64_t size)
{
    uint32_t *map = malloc(size * sizeof *map);
    if (!map) return -1;
    memset(map, 0xff, size * sizeof *map);
    for (uint32_t i = 0; i < f->n_slots; i++) {
        uint64_t pos = f->slots[i].key.lo & (size - 1);
        while (map[pos] != NONE)
            pos = (pos + 1) & (size - 1);
        map[pos] = i;
    }
    free(f->map);
    f->map = map;
    f->mask = size - 1;
    return 0;
}

/* Returns the slot of key, or NONE. */
static uint32_t future_find(const future *f, pgd_hash key)
{
    uint64_t pos = key.lo & f->mask;
    for (;;) {
        uint32_t s = f->map[pos];
        if (s == NONE || pgd_hash_eq(f->slots[s].key, key)) return s;
        pos = (pos + 1) & f->mask;
    }
}

/* Returns the slot of key, adding an empty one (child of parent) if needed; NONE when out
 * of memory. */
static uint32_t future_add(future *f, pgd_hash key, uint32_t parent)
{
    uint64_t pos;
    uint32_t s;
    if (((uint64_t)f->n_slots + 1) * 2 > f->mask + 1 && map_resize(f, (f->mask + 1) * 2) != 0) {
        return NONE;
    }
    pos = key.lo & f->mask;
    for (;;) {
        s = f->map[pos];
        if (s == NONE) break;
        if (pgd_hash_eq(f->slots[s].key, key)) return s;
        pos = (pos + 1) & f->mask;
    }
    if (f->n_slots == NONE - 1) return NONE;
    if (f->n_slots == f->cap_slots) {
        uint32_t ncap = f->cap_slots ? f->cap_slots : 1024;
        slot *ns;
        ncap = ncap > (NONE - 1) / 2 ? NONE - 1 : ncap * 2;
        ns = realloc(f->slots, (size_t)ncap * sizeof *ns);
        if (!ns) return NONE;
        f->slots = ns;
        f->cap_slots = ncap;
    }
    s = f->n_slots++;
    memset(&f->slots[s], 0, sizeof f->slots[s]);
    f->slots[s].key = key;
    f->slots[s].last_req = NONE;
    f->slots[s].parent = parent;
    f->slots[s].depth = parent == NONE ? 0 : f->slots[parent].depth + 1;
    f->map[pos] = s;
    return s;
}

/* Builds the index of t. hbuf holds the longest request's keys. Returns 0 or -1 (memory). */
static int future_build(future *f, const trace_set *t, pgd_hash *hbuf, int with_occ)
{
    uint64_t total = 0;
    if (map_resize(f, 1024) != 0) return -1;
    for (size_t r = 0; r < t->n_reqs; r++) {
        uint32_t parent = NONE;
        chain_all(t, r, hbuf);
        for (uint64_t i = 0; i < t->reqs[r].n_ids; i++) {
            uint32_t s = future_add(f, hbuf[i], parent);
            if (s == NONE) return -1;
            parent = s;
            if (f->slots[s].last_req != (uint32_t)r) {
                f->slots[s].last_req = (uint32_t)r;
                f->slots[s].count++;
            }
        }
    }
    if (!with_occ) return 0;
    for (uint32_t s = 0; s < f->n_slots; s++) {
        f->slots[s].start = total;
        f->slots[s].last_req = NONE;
        total += f->slots[s].count;
    }
    f->occ = malloc((total ? total : 1) * sizeof *f->occ);
    if (!f->occ) return -1;
    for (size_t r = 0; r < t->n_reqs; r++) {
        chain_all(t, r, hbuf);
        for (uint64_t i = 0; i < t->reqs[r].n_ids; i++) {
            slot *sl = &f->slots[future_find(f, hbuf[i])];
            if (sl->last_req != (uint32_t)r) {
                sl->last_req = (uint32_t)r;
                f->occ[sl->start + sl->cursor++] = (uint32_t)r;
            }
        }
    }
    for (uint32_t s = 0; s < f->n_slots; s++)
        f->slots[s].cursor = 0;
    return 0;
}

/* The Belady oracle: the first request after the current one that contains h. */
static uint64_t next_use(void *ud, pgd_hash h)
{
    future *f = ud;
    uint32_t s = future_find(f, h);
    slot *sl;
    if (s == NONE) return UINT64_MAX;
    sl = &f->slots[s];
    while (sl->cursor < sl->count && f->occ[sl->start + sl->cursor] <= f->cur)
        sl->cursor++;
    return sl->cursor < sl->count ? f->occ[sl->start + sl->cursor] : UINT64_MAX;
}

/* ---- the tiers ---- */

/* The simulated clock, ns: the arrival time of the request being served. The pool's and
 * the tiers' policies read it (TTLs, hints); the replay never depends on the wall clock. */
typedef struct sim_clock {
    uint64_t ns;
} sim_clock;

static uint64_t clock_read(void *ud)
{
    return ((const sim_clock *)ud)->ns;
}

static void *lc_malloc(void *ud, size_t n)
{
    (void)ud;
    return malloc(n);
}

static void *lc_realloc(void *ud, void *q, size_t n)
{
    (void)ud;
    return realloc(q, n);
}

static void lc_free(void *ud, void *q)
{
    (void)ud;
    free(q);
}

static const pgd_allocator libc_alloc = {lc_malloc, lc_realloc, lc_free, NULL};

/* One tier: the blocks it holds, ordered by its policy (ops, st) over page ids = slots. */
typedef struct tier_pol {
    uint64_t cap_blocks; /* 0: the tier is skipped */
    uint64_t n_blocks;   /* held */
    const pgd_policy_ops *ops;
    void *st;          /* the policy's state; NULL until created */
    uint32_t *n_child; /* [n_slots] children the tier holds (held or not itself) */
    uint32_t *uses;    /* [n_slots] hits of the block in this tier */
    uint8_t *in;       /* [n_slots] 1 if held */
} tier_pol;

typedef struct tier_set {
    future *fut; /* block slots and parents; the Belady oracle */
    tier_pol t[SIM_MAX_TIERS];
    uint32_t n;
    sim_tier_result *res; /* [n] the result's per-tier counters */
    const sim_clock *clk;
    uint32_t block_tokens;
    uint64_t page_bytes;
    pgd_cost_model cost;
    uint32_t failed; /* 1 + the tier whose policy gave no acceptable victim; 0: none */
} tier_set;

static void tiers_deinit(tier_set *ts)
{
    for (uint32_t i = 0; i < ts->n; i++) {
        if (ts->t[i].st) ts->t[i].ops->destroy(ts->t[i].st);
        free(ts->t[i].n_child);
        free(ts->t[i].uses);
        free(ts->t[i].in);
    }
    memset(ts, 0, sizeof *ts);
}

/* Allocates n tiers of the given capacities (in blocks) and policies over f's blocks.
 * Returns 0, or -1 with the reason in err. */
static int tiers_init(tier_set *ts, future *f, const uint64_t *cap_blocks,
                      const pgd_policy_ops *const *ops, uint32_t n, sim_tier_result *res, char *err,
                      size_t errlen)
{
    size_t nb = f->n_slots ? f->n_slots : 1;
    pgd_policy_init pi;
    ts->fut = f;
    ts->res = res;
    memset(&pi, 0, sizeof pi);
    pi.n_pages = (uint32_t)nb;
    pi.alloc = &libc_alloc;
    pi.next_use = f->occ ? next_use : NULL; /* no index: Belady's create refuses */
    pi.next_use_ud = f;
    pi.clock = clock_read;
    pi.clock_ud = (void *)ts->clk;
    pi.page_bytes = ts->page_bytes;
    pi.cost = ts->cost;
    pi.page_tokens = ts->block_tokens;
    for (uint32_t i = 0; i < n; i++) {
        tier_pol *t = &ts->t[i];
        int st;
        ts->n = i + 1;
        t->cap_blocks = cap_blocks[i];
        t->ops = ops[i];
        if (t->cap_blocks == 0) continue;
        t->n_child = calloc(nb, sizeof *t->n_child);
        t->uses = calloc(nb, sizeof *t->uses);
        t->in = calloc(nb, 1);
        if (!t->n_child || !t->uses || !t->in) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        st = t->ops->create(&pi, &t->st);
        if (st != PGD_OK) {
            t->st = NULL;
            snprintf(err, errlen, "tier %u: cannot create policy %s: %s", i, t->ops->name,
                     pgd_strerror(st));
            return -1;
        }
    }
    ts->n = n;
    return 0;
}

static int tier_holds(const tier_pol *t, uint32_t b)
{
    return t->cap_blocks != 0 && t->in[b];
}

/* The leaf-only rule of a tier: a held block of which the tier holds no child. */
static int tier_accept(void *ctx, uint32_t b)
{
    const tier_pol *t = ctx;
    return t->in[b] && t->n_child[b] == 0;
}

static void tier_info(const tier_set *ts, const tier_pol *t, uint32_t b, pgd_policy_page *pg)
{
    const slot *sl = &ts->fut->slots[b];
    memset(pg, 0, sizeof *pg);
    pg->hash = sl->key;
    pg->depth = sl->depth;
    pg->priority = PGD_PRIORITY_DEFAULT;
    pg->now_ns = ts->clk->ns;
    pg->uses = t->uses[b];
    pg->bytes = ts->page_bytes;
    pg->cost = pgd_cost_model_page(&ts->cost, ts->block_tokens, sl->depth);
}

/* Held block b was hit (promoted from this tier; the copy stays): used again, and
 * evictable again at once. */
static void tier_touch(const tier_set *ts, tier_pol *t, uint32_t b)
{
    pgd_policy_page pg;
    t->uses[b]++;
    tier_info(ts, t, b, &pg);
    t->ops->hit(t->st, b, &pg);
    t->ops->unreferenced(t->st, b, &pg);
}

/* The policy learns that held block b stopped (is_leaf 0) or started being a leaf of
 * what the tier holds (policy.h leaf(): a heap policy keeps non-leaves out of its victim
 * search; without it, cost at ram:3M under a 1M pool walked thousands of refused parents
 * a victim on the Mooncake trace). */
static void tier_leaf(tier_pol *t, uint32_t b, int is_leaf)
{
    if (t->ops->leaf) t->ops->leaf(t->st, b, is_leaf);
}

static void tier_remove(tier_set *ts, tier_pol *t, uint32_t b)
{
    uint32_t p = ts->fut->slots[b].parent;
    t->ops->remove(t->st, b);
    t->in[b] = 0;
    t->uses[b] = 0;
    t->n_blocks--;
    if (p != NONE && --t->n_child[p] == 0 && t->in[p]) tier_leaf(t, p, 1);
}

/* Writes block b into the first tier from i on that has a capacity, unless that tier
 * holds it already; what the tier evicts for room goes on down. The last tier drops. */
static void tiers_demote(tier_set *ts, uint32_t i, uint32_t b)
{
    for (; i < ts->n; i++) {
        tier_pol *t = &ts->t[i];
        uint32_t p = ts->fut->slots[b].parent, v;
        pgd_policy_page pg;
        if (t->cap_blocks == 0) continue;
        if (t->in[b]) return;
        t->in[b] = 1;
        t->n_blocks++;
        if (p != NONE && t->n_child[p]++ == 0 && t->in[p]) tier_leaf(t, p, 0);
        tier_info(ts, t, b, &pg);
        t->ops->insert(t->st, b, &pg);
        if (t->n_child[b]) tier_leaf(t, b, 0); /* its children came first */
        t->ops->unreferenced(t->st, b, &pg);
        ts->res[i].demoted_blocks++;
        if (t->n_blocks <= t->cap_blocks) return;
        /* Inserted first, so that b's parent is not a leaf now: b may be the victim. */
        v = t->ops->victim(t->st, tier_accept, t);
        if (v >= ts->fut->n_slots || !tier_accept(t, v)) {
            if (!ts->failed) ts->failed = i + 1;
            return;
        }
        tier_remove(ts, t, v);
        ts->res[i].evicted_blocks++;
        b = v;
    }
}

/* The fastest tier holding block b, or -1. */
static int tiers_find(const tier_set *ts, uint32_t b)
{
    for (uint32_t i = 0; i < ts->n; i++) {
        if (tier_holds(&ts->t[i], b)) return (int)i;
    }
    return -1;
}

/* The pool's on_evict event: demotes the block unless a tier holds it already. */
static void on_pool_evict(void *ud, pgd_hash hash, uint32_t page)
{
    tier_set *ts = ud;
    uint32_t b = future_find(ts->fut, hash);
    (void)page;
    if (b == NONE || tiers_find(ts, b) >= 0) return;
    tiers_demote(ts, 0, b);
}

/* Walks every tier: held counts, child counts, the capacity bound and the policy's set
 * (contains / size) agree. Returns 0, or -1 with the reason in err. O(tiers * blocks). */
static int tiers_check(const tier_set *ts, char *err, size_t errlen)
{
    uint32_t *kids = calloc(ts->fut->n_slots ? ts->fut->n_slots : 1, sizeof *kids);
    int rc = -1;
    if (!kids) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (uint32_t i = 0; i < ts->n; i++) {
        const tier_pol *t = &ts->t[i];
        uint64_t held = 0;
        if (t->cap_blocks == 0) continue;
        if (t->n_blocks > t->cap_blocks || t->ops->size(t->st) != t->n_blocks) goto bad;
        memset(kids, 0, ts->fut->n_slots * sizeof *kids);
        for (uint32_t b = 0; b < ts->fut->n_slots; b++) {
            uint32_t p = ts->fut->slots[b].parent;
            held += t->in[b];
            if (t->in[b] && p != NONE) kids[p]++;
            if (!t->ops->contains(t->st, b) != !t->in[b]) goto bad;
        }
        if (held != t->n_blocks) goto bad;
        for (uint32_t b = 0; b < ts->fut->n_slots; b++) {
            if (kids[b] != t->n_child[b]) goto bad;
        }
        continue;
    bad:
        snprintf(err, errlen, "tier %u (%s, %llu of %llu blocks held) is inconsistent", i,
                 t->ops->name, (unsigned long long)t->n_blocks, (unsigned long long)t->cap_blocks);
        goto done;
    }
    rc = 0;
done:
    free(kids);
    return rc;
}

/* ---- the replay ---- */

/* a + b, saturating: token totals of absurd traces stay meaningful as "at least". */
static uint64_t sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static uint64_t request_tokens(const trace_rec *rec, uint32_t bt, int *mismatch)
{
    uint64_t full = rec->n_ids * bt;
    *mismatch = 0;
    if (rec->n_ids == 0) return rec->input_length;
    if (rec->input_length > full - bt) return rec->input_length;
    *mismatch = 1;
    return full;
}

/* Tokens of block j of a request of the given tokens (the last block may be partial). */
static uint64_t block_tokens_of(uint64_t tokens, uint64_t j, uint64_t bt)
{
    uint64_t lo = j * bt < tokens ? j * bt : tokens;
    uint64_t hi = (j + 1) * bt < tokens ? (j + 1) * bt : tokens;
    return hi - lo;
}

static void progress(size_t done, size_t total, double *last, int *shown)
{
    double t = now_s();
    if (t - *last < 0.5) return;
    *last = t;
    *shown = 1;
    fprintf(stderr, "\rreplay: %zu/%zu requests (%.0f%%)", done, total,
            100.0 * (double)done / (double)(total ? total : 1));
}

/* ---- the timing model: requests alive, by completion time ---- */

typedef struct running {
    double done_s; /* arrival + prefill + decode */
    uint32_t r;    /* trace index: ties complete in trace order */
    pgd_seq *s;
} running;

typedef struct run_heap {
    running *a; /* [n] a binary min-heap by (done_s, r) */
    size_t n;
} run_heap;

static int run_before(const running *x, const running *y)
{
    return x->done_s != y->done_s ? x->done_s < y->done_s : x->r < y->r;
}

static void run_push(run_heap *h, running e)
{
    size_t i = h->n++;
    while (i > 0 && run_before(&e, &h->a[(i - 1) / 2])) {
        h->a[i] = h->a[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->a[i] = e;
}

static running run_pop(run_heap *h)
{
    running top = h->a[0], e = h->a[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && run_before(&h->a[c + 1], &h->a[c])) c++;
        if (!run_before(&h->a[c], &e)) break;
        h->a[i] = h->a[c];
        i = c;
    }
    if (h->n) h->a[i] = e;
    return top;
}

/* Destroys the requests done by time t (all with t < 0), in completion order. */
static void run_complete(pgd_cache *c, run_heap *h, double t)
{
    while (h->n && (t < 0 || h->a[0].done_s <= t)) {
        running e = run_pop(h);
        pgd_seq_destroy(c, e.s);
    }
}

/* The built-in ops of kind k, or NULL with the reason in err. */
static const pgd_policy_ops *builtin_or_err(pgd_policy_kind k, const char *what, char *err,
                                            size_t errlen)
{
    const pgd_policy_ops *ops = pgd_policy_builtin(k);
    if (!ops) snprintf(err, errlen, "%s: policy kind %d is not built in", what, (int)k);
    return ops;
}

int sim_run(const sim_params *p, const trace_set *t, sim_result *res, char *err, size_t errlen)
{
    const uint64_t bt = p->block_tokens;
    future fut = {0};
    tier_set ts = {0};
    run_heap rh = {0};
    sim_clock clk = {0};
    pgd_hash *hbuf = NULL;
    uint32_t *rbuf = NULL; /* [max_ids] blocks of the run the tiers hold */
    uint8_t *tbuf = NULL;  /* [max_ids] the tier of each */
    uint64_t tier_cap[SIM_MAX_TIERS];
    const pgd_policy_ops *tier_ops[SIM_MAX_TIERS];
    pgd_cache *c = NULL;
    pgd_cache_params cp = pgd_cache_default_params();
    pgd_cache_stats cs;
    uint64_t max_ids = 0, pages, arrival_ms = 0;
    double t0 = now_s(), last = t0;
    int rc = -1, shown = 0, need_future, with_occ;

    memset(res, 0, sizeof *res);
    if (bt == 0 || (bt & (bt - 1)) != 0 || bt > SIM_MAX_BLOCK_TOKENS) {
        snprintf(err, errlen, "block tokens %llu is not a power of two in [1, %u]",
                 (unsigned long long)bt, SIM_MAX_BLOCK_TOKENS);
        return -1;
    }
    if (p->n_tiers > SIM_MAX_TIERS || (p->n_tiers && !p->tiers)) {
        snprintf(err, errlen, "%u tiers (at most %u)", p->n_tiers, SIM_MAX_TIERS);
        return -1;
    }
    if (t->n_reqs >= NONE) {
        snprintf(err, errlen, "too many requests (%zu; at most %u)", t->n_reqs, NONE - 1);
        return -1;
    }
    if (p->model_timing && !(p->prefill_tps > 0 && p->decode_tps > 0)) {
        snprintf(err, errlen, "the timing model needs prefill and decode speeds above 0");
        return -1;
    }
    if (!builtin_or_err(p->policy, "pool", err, errlen)) return -1;
    with_occ = p->policy == PGD_POLICY_BELADY;
    for (uint32_t i = 0; i < p->n_tiers; i++) {
        pgd_policy_kind k = p->tiers[i].has_policy ? p->tiers[i].policy : p->policy;
        tier_ops[i] = builtin_or_err(k, "tier", err, errlen);
        if (!tier_ops[i]) return -1;
        if (k == PGD_POLICY_BELADY && p->tiers[i].capacity_tokens / bt) with_occ = 1;
    }
    for (size_t r = 0; r < t->n_reqs; r++) {
        if (t->reqs[r].n_ids > max_ids) max_ids = t->reqs[r].n_ids;
    }
    hbuf = malloc((max_ids ? max_ids : 1) * sizeof *hbuf);
    rbuf = malloc((max_ids ? max_ids : 1) * sizeof *rbuf);
    tbuf = malloc(max_ids ? max_ids : 1);
    rh.a = p->model_timing ? malloc((t->n_reqs ? t->n_reqs : 1) * sizeof *rh.a) : NULL;
    if (!hbuf || !rbuf || !tbuf || (p->model_timing && !rh.a)) goto nomem;

    /* Tiers name blocks by their slot in the future index. */
    need_future = with_occ || p->capacity_tokens == 0 || p->n_tiers > 0;
    if (need_future && future_build(&fut, t, hbuf, with_occ) != 0) goto nomem;
    pages = p->capacity_tokens ? p->capacity_tokens / bt : (fut.n_slots ? fut.n_slots : 1);
    if (pages == 0) {
        snprintf(err, errlen, "capacity %llu tokens is less than one block of %llu tokens",
                 (unsigned long long)p->capacity_tokens, (unsigned long long)bt);
        goto done;
    }
    if (pages > (UINT64_C(1) << 31)) {
        snprintf(err, errlen, "capacity of %llu pages is more than the pool allows (2^31)",
                 (unsigned long long)pages);
        goto done;
    }
    res->capacity_pages = pages;
    res->capacity_tokens = pages * bt;
    res->n_tiers = p->n_tiers;
    res->max_running = t->n_reqs ? 1 : 0;
    cp.pool.metadata_only = 1;
    cp.pool.page_tokens = (uint32_t)bt;
    cp.pool.capacity_pages = (uint32_t)pages;
    for (uint32_t i = 0; i < p->n_tiers; i++) {
        tier_cap[i] = p->tiers[i].capacity_tokens / bt;
        res->tiers[i].capacity_blocks = tier_cap[i];
        res->tiers[i].capacity_tokens = tier_cap[i] * bt;
    }
    /* The tiers' policies see pages as the pool's (its geometry and cost model). */
    ts.clk = &clk;
    ts.block_tokens = (uint32_t)bt;
    ts.page_bytes =
        (uint64_t)(pgd_kv_bytes_per_token(cp.pool.kv_type, (uint32_t)bt, cp.pool.n_layers,
                                          cp.pool.n_kv_heads, cp.pool.head_dim) *
                   (double)bt);
    if (ts.page_bytes == 0) ts.page_bytes = bt;
    pgd_cost_model_default(&ts.cost, cp.pool.n_layers, cp.pool.n_kv_heads, cp.pool.head_dim);
    if (p->n_tiers &&
        tiers_init(&ts, &fut, tier_cap, tier_ops, p->n_tiers, res->tiers, err, errlen) != 0) {
        goto done;
    }

    cp.policy = p->policy;
    cp.hash_key = replay_key;
    cp.hash_key_len = sizeof replay_key - 1;
    cp.clock = clock_read;
    cp.clock_ud = &clk;
    if (p->policy == PGD_POLICY_BELADY) {
        cp.next_use = next_use;
        cp.next_use_ud = &fut;
    }
    if (ts.n) {
        cp.on_evict = on_pool_evict;
        cp.event_ud = &ts;
    }
    rc = pgd_cache_create(&cp, &c);
    if (rc != PGD_OK) {
        snprintf(err, errlen, "cannot create a cache of %llu pages: %s", (unsigned long long)pages,
                 pgd_strerror(rc));
        rc = -1;
        goto done;
    }
    rc = -1;

    for (size_t r = 0; r < t->n_reqs; r++) {
        const trace_rec *rec = &t->reqs[r];
        const uint64_t n = rec->n_ids;
        int mismatch, st;
        uint64_t tokens = request_tokens(rec, (uint32_t)bt, &mismatch), hit_tokens;
        uint64_t tier_tokens = 0; /* of this request: found in a tier */
        pgd_seq *s = NULL;
        int64_t k;
        uint64_t m = 0; /* blocks k .. k+m-1 are held by the tiers */

        if (rec->timestamp_ms > arrival_ms) arrival_ms = rec->timestamp_ms;
        clk.ns = arrival_ms * UINT64_C(1000000);
        if (p->model_timing) run_complete(c, &rh, (double)arrival_ms / 1000.0);
        res->requests++;
        res->blocks += n;
        res->tokens = sat_add(res->tokens, tokens);
        res->length_mismatch += (uint64_t)mismatch;
        if (n == 0) continue;
        chain_all(t, r, hbuf);
        fut.cur = (uint32_t)r;

        st = pgd_seq_create(c, NULL, 0, &s);
        if (st != PGD_OK) {
            snprintf(err, errlen, "request %zu: pgd_seq_create: %s", r + 1, pgd_strerror(st));
            goto done;
        }
        k = pgd_seq_match_hashes(c, s, hbuf, (size_t)n);
        if (k < 0 || (uint64_t)k > n) {
            snprintf(err, errlen, "request %zu: pgd_seq_match_hashes returned %lld (%s)", r + 1,
                     (long long)k, pgd_strerror((int)k));
            pgd_seq_destroy(c, s);
            goto done;
        }
        res->hit_blocks += (uint64_t)k;
        hit_tokens = (uint64_t)k * bt < tokens ? (uint64_t)k * bt : tokens;
        res->hit_tokens = sat_add(res->hit_tokens, hit_tokens);
        /* The run beyond the pool prefix that the tiers hold, as a match finds it; touched
         * deepest first, so that a prefix stays newer than its extensions. */
        for (uint64_t i = (uint64_t)k; i < n && ts.n; i++) {
            uint32_t b = future_find(&fut, hbuf[i]);
            int ti = b == NONE ? -1 : tiers_find(&ts, b);
            if (ti < 0) break;
            rbuf[m] = b;
            tbuf[m] = (uint8_t)ti;
            m++;
        }
        for (uint64_t j = m; j-- > 0;)
            tier_touch(&ts, &ts.t[tbuf[j]], rbuf[j]);
        /* Promoted and computed blocks alike take a pool page; demotions happen here. */
        for (uint64_t i = (uint64_t)k; i < n; i++) {
            st = pgd_seq_grow(c, s, (size_t)bt);
            if (st == PGD_ENOSPC) {
                res->uncached_blocks += n - i;
                break;
            }
            if (st == PGD_OK) st = pgd_seq_commit_hashes(c, s, &hbuf[i], 1);
            if (st < 0) {
                snprintf(err, errlen, "request %zu block %llu: %s", r + 1, (unsigned long long)i,
                         pgd_strerror(st));
                pgd_seq_destroy(c, s);
                goto done;
            }
            if (i - (uint64_t)k < m) {
                sim_tier_result *tr = &res->tiers[tbuf[i - (uint64_t)k]];
                uint64_t bk = block_tokens_of(tokens, i, bt);
                tr->hit_blocks++;
                tr->hit_tokens = sat_add(tr->hit_tokens, bk);
                tier_tokens += bk;
            }
        }
        if (ts.failed) {
            snprintf(err, errlen, "request %zu: tier %u: policy %s gave no evictable leaf", r + 1,
                     ts.failed - 1, ts.t[ts.failed - 1].ops->name);
            pgd_seq_destroy(c, s);
            goto done;
        }
        if (p->model_timing) {
            running e;
            uint64_t computed =
                tokens - hit_tokens -
                (tier_tokens < tokens - hit_tokens ? tier_tokens : tokens - hit_tokens);
            e.done_s = (double)arrival_ms / 1000.0 + (double)computed / p->prefill_tps +
                       (double)rec->output_length / p->decode_tps;
            e.r = (uint32_t)r;
            e.s = s;
            run_push(&rh, e);
            if (rh.n > res->max_running) res->max_running = rh.n;
        } else {
            pgd_seq_destroy(c, s);
        }
        if (p->check) {
            st = pgd_cache_check(c);
            if (st != PGD_OK) {
                snprintf(err, errlen, "request %zu: pgd_cache_check: %s", r + 1, pgd_strerror(st));
                goto done;
            }
            if (ts.n && tiers_check(&ts, err, errlen) != 0) goto done;
        }
        if (p->progress && (r & 4095) == 4095) progress(r + 1, t->n_reqs, &last, &shown);
    }
    run_complete(c, &rh, -1.0);
    if (ts.failed) {
        snprintf(err, errlen, "tier %u: policy %s gave no evictable leaf", ts.failed - 1,
                 ts.t[ts.failed - 1].ops->name);
        goto done;
    }
    if (p->check && pgd_cache_check(c) != PGD_OK) {
        snprintf(err, errlen, "after the last request: pgd_cache_check failed");
        goto done;
    }
    pgd_cache_get_stats(c, &cs);
    res->evictions = cs.n_evictions;
    res->miss_blocks = res->blocks - res->hit_blocks;
    res->miss_tokens = res->tokens - res->hit_tokens;
    for (uint32_t i = 0; i < ts.n; i++) {
        res->tiers[i].resident_blocks = ts.t[i].n_blocks;
        res->miss_blocks -= res->tiers[i].hit_blocks;
        res->miss_tokens -= res->miss_tokens < res->tiers[i].hit_tokens ? res->miss_tokens
                                                                        : res->tiers[i].hit_tokens;
    }
    res->elapsed_s = now_s() - t0;
    rc = 0;
    goto done;
nomem:
    snprintf(err, errlen, "out of memory");
done:
    if (shown) fprintf(stderr, "\r\033[K");
    if (c) run_complete(c, &rh, -1.0);
    pgd_cache_destroy(c);
    tiers_deinit(&ts);
    future_deinit(&fut);
    free(rh.a);
    free(hbuf);
    free(rbuf);
    free(tbuf);
    return rc;
}
