/* SPDX-License-Identifier: MIT */
/*
 * tenants.c - the tenant table of a cache manager: salts -> entries, reservations, the
 * pages charged to each tenant and its counters (see tenants.h for the layout).
 *
 *   index:  0          1 .. n_entries-2           n_entries-1
 *           default    salts, first seen first    "other" (every further salt)
 *
 * Reservations are shares of the pool: reserved_pages = floor(share * n_pages), the
 * shares summing to at most 1 (so reserved pages never exceed the pool). The table only
 * counts and answers the quota predicates; the cache decides what to evict (cache.c
 * evict_for: own pages first, then pages of tenants over their reservation).
 * Look-ups scan the used entries (64 by default): a sequence create and a set_tenant pay
 * it, never the eviction path, which reads the per-page index the cache keeps.
 * Callers: cache.c (lock held), tests/unit/test_cache_tenants.c.
 */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <math.h>
#include <string.h>

#include "tenants.h"

int pgd__tenants_init(pgd__tenants *t, const pgd__alloc *al, uint32_t max_tenants, uint32_t n_pages,
                      pgd_hash default_key)
{
    memset(t, 0, sizeof *t);
    uint32_t n = max_tenants ? max_tenants : 64;
    if (n < 2) n = 2; /* the default tenant and "other" */
    if (n > PGD__TENANTS_MAX) return PGD_EINVAL;
    t->e = pgd__calloc(al, n, sizeof *t->e);
    if (!t->e) return PGD_ENOMEM;
    t->n_entries = n;
    t->n_used = 1;
    t->n_pages = n_pages;
    t->e[0].key = default_key;
    t->e[0].id = 0;
    t->e[n - 1].id = UINT64_MAX;
    return PGD_OK;
}

void pgd__tenants_deinit(pgd__tenants *t, const pgd__alloc *al)
{
    pgd__free(al, t->e);
    memset(t, 0, sizeof *t);
}

uint64_t pgd__tenant_id(const pgd__hasher *h, const void *salt, size_t salt_len)
{
    static const char tag[] = "pgd-tenant-v1";
    XXH3_state_t st;
    XXH3_64bits_reset_withSecret(&st, h->secret, sizeof h->secret);
    XXH3_64bits_update(&st, tag, sizeof tag);
    if (salt_len) XXH3_64bits_update(&st, salt, salt_len);
    uint64_t id = XXH3_64bits_digest(&st);
    if (id == 0) id = 1; /* 0 and UINT64_MAX name the default tenant and "other" */
    if (id == UINT64_MAX) id = UINT64_MAX - 1;
    return id;
}

/* The named entries (and the default) that are in use: "other" has no key. */
static uint32_t n_keyed(const pgd__tenants *t)
{
    return t->n_used < t->n_entries ? t->n_used : t->n_entries - 1;
}

uint32_t pgd__tenants_find(const pgd__tenants *t, pgd_hash key)
{
    for (uint32_t i = 0; i < n_keyed(t); i++)
        if (pgd_hash_eq(t->e[i].key, key)) return i;
    return t->n_entries - 1;
}

uint32_t pgd__tenants_get(pgd__tenants *t, pgd_hash key, uint64_t id)
{
    uint32_t i = pgd__tenants_find(t, key);
    if (i != t->n_entries - 1) return i;
    if (t->n_used < t->n_entries - 1) {
        i = t->n_used++;
        t->e[i].key = key;
        t->e[i].id = id;
        return i;
    }
    t->n_used = t->n_entries; /* "other" is in use from now on */
    return t->n_entries - 1;
}

static int share_ok(double s)
{
    return s >= 0.0 && s <= 1.0; /* false for NaN */
}

int pgd__tenants_set(pgd__tenants *t, pgd_hash key, uint64_t id, const pgd_tenant_params *tp)
{
    if (!tp || !share_ok(tp->pool_share)) return PGD_EINVAL;
    for (uint32_t k = 0; k < PGD_MAX_TIERS; k++)
        if (!share_ok(tp->tier_share[k])) return PGD_EINVAL;
    uint32_t i = pgd__tenants_find(t, key);
    int fresh = i == t->n_entries - 1;
    if (fresh && t->n_used >= t->n_entries - 1) return PGD_ENOSPC;
    /* The sums as they would be with this entry's new shares (a fresh entry has none),
     * summed afresh each time so that updates never drift; 1e-9 forgives the rounding of
     * shares meant to sum to exactly 1 (0.1 + 0.2 + 0.7). */
    double pool = tp->pool_share;
    for (uint32_t j = 0; j < n_keyed(t); j++)
        if (j != i) pool += t->e[j].pool_share;
    if (pool > 1.0 + 1e-9) return PGD_EINVAL;
    for (uint32_t k = 0; k < PGD_MAX_TIERS; k++) {
        double sum = tp->tier_share[k];
        for (uint32_t j = 0; j < n_keyed(t); j++)
            if (j != i) sum += t->e[j].tier_share[k];
        if (sum > 1.0 + 1e-9) return PGD_EINVAL;
    }
    if (fresh) i = pgd__tenants_get(t, key, id);
    pgd__tenant *e = &t->e[i];
    if (e->reserved_pages) t->n_reserved--;
    e->pool_share = tp->pool_share;
    memcpy(e->tier_share, tp->tier_share, sizeof e->tier_share);
    /* floor(share * n_pages), forgiving the rounding of a product meant to be whole
     * (0.29 * 100 is 28.999...); capped so that the reservations never pass the pool. */
    uint64_t others = 0;
    for (uint32_t j = 0; j < n_keyed(t); j++)
        if (j != i) others += t->e[j].reserved_pages;
    double want = floor(tp->pool_share * (double)t->n_pages + 1e-6);
    uint64_t room = others < t->n_pages ? t->n_pages - others : 0;
    e->reserved_pages = (uint32_t)(want < (double)room ? want : (double)room);
    if (e->reserved_pages) t->n_reserved++;
    return (int)i;
}

void pgd__tenants_evicted(pgd__tenants *t, uint32_t owner, uint32_t requester)
{
    t->e[owner].evictions++;
    if (requester != PGD__TENANT_NONE && requester != owner) t->e[owner].evictions_by_others++;
}

int pgd__tenants_stats(const pgd__tenants *t, uint32_t i, pgd_tenant_stats *out)
{
    if (i >= t->n_used) return PGD_EINVAL;
    const pgd__tenant *e = &t->e[i];
    memset(out, 0, sizeof *out);
    out->id = e->id;
    out->reserved_pages = e->reserved_pages;
    out->pages_held = e->pages_held;
    out->pages_pinned = e->pages_pinned;
    out->hit_pages = e->hit_pages;
    out->hit_tokens = e->hit_tokens;
    out->query_pages = e->query_pages;
    out->evictions = e->evictions;
    out->evictions_by_others = e->evictions_by_others;
    return PGD_OK;
}

uint64_t pgd__tenants_held(const pgd__tenants *t)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < t->n_used; i++)
        n += t->e[i].pages_held;
    return n;
}

int pgd__tenants_check(const pgd__tenants *t, const pgd__log *lg)
{
    uint64_t reserved = 0;
    uint32_t n_reserved = 0;
    for (uint32_t i = 0; i < t->n_entries; i++) {
        const pgd__tenant *e = &t->e[i];
        if (i >= t->n_used && (e->pages_held || e->reserved_pages || e->evictions)) {
            pgd__logf(lg, PGD_LOG_ERROR, "tenants check: unused entry %u has counts", i);
            return PGD_ECORRUPT;
        }
        reserved += e->reserved_pages;
        n_reserved += e->reserved_pages > 0;
        if (e->evictions_by_others > e->evictions || e->hit_pages > e->query_pages ||
            e->pages_pinned > e->pages_held) {
            pgd__logf(lg, PGD_LOG_ERROR, "tenants check: entry %u counters disagree", i);
            return PGD_ECORRUPT;
        }
    }
    if (reserved > t->n_pages || n_reserved != t->n_reserved || t->n_used == 0 ||
        t->n_used > t->n_entries || t->e[t->n_entries - 1].reserved_pages) {
        pgd__logf(lg, PGD_LOG_ERROR, "tenants check: %llu pages reserved of %u, %u used of %u",
                  (unsigned long long)reserved, t->n_pages, t->n_used, t->n_entries);
        return PGD_ECORRUPT;
    }
    return PGD_OK;
}
