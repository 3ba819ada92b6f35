/* SPDX-License-Identifier: MIT */
/*
 * tier.c - the tier handle: an ops table (tier.h) and its state, and the dispatch calls.
 *
 *     pgd_tier { ops (borrowed), state, allocator of the handle }
 *
 * Built-in tiers (ram.c, disk.c) make their handle with pgd__tier_new and their own
 * allocator; user tiers with pgd_tier_wrap (libc). The handle adds nothing to the calls:
 * each op does its own locking, timing and counting, so a dispatch is one indirect call.
 * Callers: the cache's movers (cache.c), the engine and tools (through the public calls).
 */
#include "tier/tier_int.h"

struct pgd_tier {
    const pgd_tier_ops *ops; /* borrowed while the tier lives */
    void *state;             /* the tier's own; ops->close frees it */
    pgd__alloc al;           /* the handle's allocator */
};

static int ops_complete(const pgd_tier_ops *o)
{
    return o && o->name && o->bind && o->put && o->get && o->lookup && o->del && o->stats &&
           o->flush && o->close;
}

int pgd__tier_new(const pgd__alloc *al, const pgd_tier_ops *ops, void *state, pgd_tier **out)
{
    *out = NULL;
    if (!ops_complete(ops)) return PGD_EINVAL;
    pgd_tier *t = pgd__calloc(al, 1, sizeof *t);
    if (!t) return PGD_ENOMEM;
    t->ops = ops;
    t->state = state;
    t->al = *al;
    *out = t;
    return PGD_OK;
}

void *pgd__tier_state(const pgd_tier *t, const pgd_tier_ops *ops)
{
    return t && t->ops == ops ? t->state : NULL;
}

int pgd_tier_wrap(const pgd_tier_ops *ops, void *state, pgd_tier **out)
{
    pgd__alloc al;
    if (!out) return PGD_EINVAL;
    pgd__alloc_init(&al, NULL);
    return pgd__tier_new(&al, ops, state, out);
}

void pgd_tier_close(pgd_tier *t)
{
    if (!t) return;
    pgd__alloc al = t->al;
    t->ops->close(t->state);
    pgd__free(&al, t);
}

const char *pgd_tier_name(const pgd_tier *t)
{
    return t->ops->name;
}

/* ---- dispatch ---- */

int pgd_tier_bind(pgd_tier *t, const pgd_record_ident *ident)
{
    return t->ops->bind(t->state, ident);
}

int pgd_tier_put(pgd_tier *t, pgd_hash block, pgd_hash parent, const void *page, const void *bounds,
                 pgd_tier_spill_fn spill, void *spill_ud)
{
    return t->ops->put(t->state, block, parent, page, bounds, spill, spill_ud);
}

int pgd_tier_get(pgd_tier *t, pgd_hash block, void *page, void *bounds)
{
    return t->ops->get(t->state, block, page, bounds);
}

size_t pgd_tier_get_many(pgd_tier *t, size_t n, const pgd_hash *blocks, void *const *pages,
                         void *const *bounds, int *results)
{
    if (t->ops->get_many) return t->ops->get_many(t->state, n, blocks, pages, bounds, results);
    size_t ok = 0;
    int run = 1;
    for (size_t i = 0; i < n; i++) {
        results[i] = t->ops->get(t->state, blocks[i], pages[i], bounds ? bounds[i] : NULL);
        run = run && results[i] == PGD_OK;
        ok += (size_t)run;
    }
    return ok;
}

size_t pgd_tier_lookup(pgd_tier *t, const pgd_hash *hashes, size_t n)
{
    return n ? t->ops->lookup(t->state, hashes, n) : 0;
}

int pgd_tier_del(pgd_tier *t, pgd_hash block)
{
    return t->ops->del(t->state, block);
}

void pgd_tier_get_stats(pgd_tier *t, pgd_tier_stats *out)
{
    memset(out, 0, sizeof *out);
    t->ops->stats(t->state, out);
}

int pgd_tier_flush(pgd_tier *t)
{
    return t->ops->flush(t->state);
}

/* ---- latency histogram and clock ---- */

static const double hist_bounds_us[PGD_TIER_HIST_BUCKETS] = {
    10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 50000, HUGE_VAL,
};

const double *pgd_tier_hist_bounds_us(void)
{
    return hist_bounds_us;
}

uint64_t pgd__tier_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t pgd__tier_now_us(void)
{
    return pgd__tier_now_ns() / 1000;
}

uint32_t pgd__tier_hist_bucket(uint64_t ns)
{
    uint32_t b = 0;
    /* A value on a bound belongs to that bucket (Prometheus "le"). */
    while (b + 1 < PGD_TIER_HIST_BUCKETS && (double)ns > hist_bounds_us[b] * 1000.0)
        b++;
    return b;
}

void pgd__tier_hist_add(uint64_t hist[PGD_TIER_HIST_BUCKETS], uint64_t ns)
{
    hist[pgd__tier_hist_bucket(ns)]++;
}

void pgd__tier_lat_add(uint64_t hist[PGD_TIER_HIST_BUCKETS], uint64_t *sum, uint64_t ns)
{
    hist[pgd__tier_hist_bucket(ns)]++;
    *sum += ns;
}

int pgd_tier_retain(pgd_tier *t, pgd_hash block, const pgd_tier_retention *r)
{
    return t->ops->retain ? t->ops->retain(t->state, block, r) : PGD_ENOTSUP;
}

int pgd_tier_has_retain(const pgd_tier *t)
{
    return t->ops->retain != NULL;
}
