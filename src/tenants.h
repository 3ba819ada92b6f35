/* SPDX-License-Identifier: MIT */
/*
 * tenants.h - the tenant table of a cache manager (tenants.c): per-salt entries with a
 * reserved share of the pool, the pages charged to each, per-tenant counters, and the
 * quota predicates that the cache's eviction composes with its leaf check.
 *
 * Entries: index 0 is the default tenant (salt_len 0); indices 1 .. n_entries-2 are salts,
 * in the order they were first seen (a sequence, a set_tenant); index n_entries-1 is
 * "other", shared by every salt seen once the named entries are taken. Entries are never
 * reclaimed (a salt keeps its index for the cache's life), so indices stay stable for
 * stats and for the per-page tenant index the cache keeps (uint16_t: n_entries <= 65535).
 * Used indices are 0 .. n_used-1: "other" is taken last.
 * Keys: an entry is found by the chain seed of its salt (pgd__hash_seed, 128 bits keyed
 * with the cache's secret), so the table never stores the salt; the id it publishes is
 * XXH3-64 of the salt under the same secret (pgd__tenant_id).
 * Invariants (pgd__tenants_check): the reserved pages sum to at most the pool's pages;
 * sum of pages_held == the registered pool pages (checked by the cache).
 * Callers: cache.c, with the cache lock held (the table has no lock of its own); tests.
 */
#ifndef PGD_TENANTS_H
#define PGD_TENANTS_H

#include "pgd_int.h"

#define PGD__TENANT_NONE UINT32_MAX /* "no requester" (admin eviction) */
#define PGD__TENANTS_MAX 65535u     /* per-page index is a uint16_t */

typedef struct pgd__tenant {
    pgd_hash key;      /* pgd__hash_seed of the salt (never the salt itself) */
    uint64_t id;       /* published id: 0 default, UINT64_MAX other, else pgd__tenant_id */
    double pool_share; /* as set (0: none) */
    double tier_share[PGD_MAX_TIERS];
    uint32_t reserved_pages; /* floor(pool_share * n_pages) */
    uint32_t pages_held;     /* registered pool pages charged to it */
    uint32_t pages_pinned;   /* of those, pinned (cache.c counts them at pin / unpin) */
    uint64_t hit_pages, hit_tokens, query_pages;
    uint64_t evictions, evictions_by_others;
} pgd__tenant;

typedef struct pgd__tenants {
    pgd__tenant *e;      /* [n_entries] */
    uint32_t n_entries;  /* default + named + other, >= 2 */
    uint32_t n_used;     /* entries 0 .. n_used-1 are in use, >= 1 */
    uint32_t n_pages;    /* the pool's pages (reservations are shares of it) */
    uint32_t n_reserved; /* entries with reserved_pages > 0: 0 -> eviction ignores quotas */
} pgd__tenants;

/* Reserves max_tenants entries (0: 64; at least 2, at most PGD__TENANTS_MAX) for a pool of
 * n_pages. default_key: the seed of salt_len 0. Returns PGD_OK, PGD_EINVAL or PGD_ENOMEM. */
int pgd__tenants_init(pgd__tenants *t, const pgd__alloc *al, uint32_t max_tenants, uint32_t n_pages,
                      pgd_hash default_key);
void pgd__tenants_deinit(pgd__tenants *t, const pgd__alloc *al); /* zeroed: partial-safe */

/* XXH3-64 of "pgd-tenant-v1" || salt under the hasher's secret; never 0 nor UINT64_MAX
 * (those name the default tenant and "other"). Pure. */
uint64_t pgd__tenant_id(const pgd__hasher *h, const void *salt, size_t salt_len);

/* The index of key, or the "other" index when it has none. O(n_used). */
uint32_t pgd__tenants_find(const pgd__tenants *t, pgd_hash key);
/* The index of key, taking a free entry for a new key (id: its pgd__tenant_id), or the
 * "other" index when none is left. O(n_used). */
uint32_t pgd__tenants_get(pgd__tenants *t, pgd_hash key, uint64_t id);
/* Sets the reservation of key's tenant (taking an entry as get does). Returns the index,
 * PGD_EINVAL (a share outside 0..1 or NaN, pool shares summing past 1: nothing changed) or
 * PGD_ENOSPC (no entry left: "other" cannot be reserved). */
int pgd__tenants_set(pgd__tenants *t, pgd_hash key, uint64_t id, const pgd_tenant_params *tp);

/* Charges / uncharges one registered pool page to tenant i. */
static inline void pgd__tenants_charge(pgd__tenants *t, uint32_t i)
{
    t->e[i].pages_held++;
}
static inline void pgd__tenants_uncharge(pgd__tenants *t, uint32_t i)
{
    PGD_CHECK(t->e[i].pages_held > 0);
    t->e[i].pages_held--;
}
/* Counts one eviction of a page of tenant owner made for requester (PGD__TENANT_NONE: an
 * admin eviction, counted as the owner's, not "by others"). */
void pgd__tenants_evicted(pgd__tenants *t, uint32_t owner, uint32_t requester);

/* Quota predicates (cache.h "tenants"):
 *   own_first(T, extra): T has a reservation and holds at least it, counting `extra`
 *                 pages it is taking now: evict T's own pages first;
 *   over(U):      U holds more than its reservation: its pages may go for anyone.
 * A page of a tenant that is not over() is never evicted for another while quotas are on. */
static inline int pgd__tenants_own_first(const pgd__tenants *t, uint32_t i, uint32_t extra)
{
    return i < t->n_used && t->e[i].reserved_pages > 0 &&
           (uint64_t)t->e[i].pages_held + extra >= t->e[i].reserved_pages;
}
static inline int pgd__tenants_over(const pgd__tenants *t, uint32_t i)
{
    return t->e[i].pages_held > t->e[i].reserved_pages;
}
/* Non-zero when some tenant has a reservation (eviction then filters by tenant). */
static inline int pgd__tenants_quotas(const pgd__tenants *t)
{
    return t->n_reserved > 0;
}

/* Fills *out for index i (pages_pinned: the caller's). Returns PGD_OK or PGD_EINVAL. */
int pgd__tenants_stats(const pgd__tenants *t, uint32_t i, pgd_tenant_stats *out);
/* The pages charged to every tenant together. */
uint64_t pgd__tenants_held(const pgd__tenants *t);
/* Integrity: used entries in range, reservations add up. Returns PGD_OK or PGD_ECORRUPT. */
int pgd__tenants_check(const pgd__tenants *t, const pgd__log *lg);

#endif /* PGD_TENANTS_H */
