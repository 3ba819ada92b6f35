/* SPDX-License-Identifier: MIT */
/*
 * t_tier.h - what the tests of the tiers below the pool share (test_cache_tiers.c,
 * test_threads_tiers.c, test_sched_tiers.c, fuzz_cache_ops.c):
 *   t_mix          a 64-bit finalizer, for tags (page bytes as a function of a block hash)
 *                  and pseudo-random choices
 *   t_tier_fwd_*   pgd_tier_ops entries that forward to another tier: a wrapper tier
 *                  (pgd_tier_wrap) overrides the calls it injects faults into and takes
 *                  these for the rest. Its state must begin with the pgd_tier * it wraps.
 * Header-only (static functions), like t.h.
 */
#ifndef PGD_TESTS_T_TIER_H
#define PGD_TESTS_T_TIER_H

#include <stdint.h>

#include <pagoda/tier.h>

static inline uint64_t t_mix(uint64_t x)
{
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ull;
    x ^= x >> 27;
    x *= 0x81dadef4bc2dd44dull;
    return x ^ (x >> 33);
}

/* The wrapped tier: the first member of the wrapper's state. */
static inline pgd_tier *t_tier_inner(void *st)
{
    return *(pgd_tier **)st;
}

static inline int t_tier_fwd_bind(void *st, const pgd_record_ident *id)
{
    return pgd_tier_bind(t_tier_inner(st), id);
}

static inline int t_tier_fwd_put(void *st, pgd_hash b, pgd_hash p, const void *page,
                                 const void *bounds, pgd_tier_spill_fn spill, void *ud)
{
    return pgd_tier_put(t_tier_inner(st), b, p, page, bounds, spill, ud);
}

static inline int t_tier_fwd_get(void *st, pgd_hash b, void *page, void *bounds)
{
    return pgd_tier_get(t_tier_inner(st), b, page, bounds);
}

static inline size_t t_tier_fwd_lookup(void *st, const pgd_hash *h, size_t n)
{
    return pgd_tier_lookup(t_tier_inner(st), h, n);
}

static inline int t_tier_fwd_del(void *st, pgd_hash b)
{
    return pgd_tier_del(t_tier_inner(st), b);
}

static inline void t_tier_fwd_stats(void *st, pgd_tier_stats *stats)
{
    pgd_tier_get_stats(t_tier_inner(st), stats);
}

static inline int t_tier_fwd_flush(void *st)
{
    return pgd_tier_flush(t_tier_inner(st));
}

#endif /* PGD_TESTS_T_TIER_H */
