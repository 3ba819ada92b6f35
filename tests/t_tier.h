/* SPDX-License-Identifier: MIT */
/*
 * t_tier.h - what the tests of the tiers below the pool share (test_cache_tiers.c,
 * test_threads_tiers.c, test_sched_tiers.c, fuzz_cache_ops.c):
 *   t_mix          a 64-bit finalizer, for tags (page bytes as a function of a block hash)
 *                  and pseudo-random choices
 *   t_block_of     block d of chain c, t_parent_of its parent; t_fill_block: payload bytes
 *                  derived from a block hash (test_tier_ram.c, tests/redis/)
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

/* Block d of chain c: distinct hashes for distinct (c, d); its parent is block (c, d - 1),
 * or {0, 0} at depth 0. */
static inline pgd_hash t_block_of(uint32_t c, uint32_t d)
{
    pgd_hash h = {0x9E3779B97F4A7C15ull * (c + 1) + d, 0xC2B2AE3D27D4EB4Full * (d + 1) + c};
    return h;
}

static inline pgd_hash t_parent_of(uint32_t c, uint32_t d)
{
    pgd_hash none = {0, 0};
    return d ? t_block_of(c, d - 1) : none;
}

/* n payload bytes derived from the block hash h (the same bytes for the same h). */
static inline void t_fill_block(uint8_t *buf, uint64_t n, pgd_hash h)
{
    uint64_t s = h.lo ^ (h.hi << 1) ^ 1;
    for (uint64_t i = 0; i < n; i++)
        buf[i] = (uint8_t)(t_mix(s += 0x9E3779B97F4A7C15ull) >> 56);
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
