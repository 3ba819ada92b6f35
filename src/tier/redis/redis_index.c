/* SPDX-License-Identifier: MIT */
/*
 * redis_index.c - the Redis tier's local index (redis_int.h): which blocks this instance
 * knows to be in Redis, so that a look-up or a put needs no round trip for them.
 *
 *   bucket b = mix(block) & (n_buckets - 1)      e[b * WAYS .. b * WAYS + WAYS)
 *   entry    { block, t_s (learnt at, seconds, 0 = empty), mine, verified }
 *
 * Bounded: a full bucket replaces its oldest entry (n_forgot), so memory is fixed at init
 * (24 bytes an entry). A forgotten block is asked again (EXISTS) or written again (a SET
 * of the same bytes): never wrong, only slower. An entry older than the records' TTL is
 * not trusted (Redis may have expired the record). Knowledge can also be stale the other
 * way (another instance deleted it, Redis restarted empty, evicted it): a get then misses
 * and removes the entry.
 * Not locked: the tier calls it under its own lock. Callers: redis.c, test_tier_redis.c.
 */
#include <string.h>

#include "tier/redis/redis_int.h"

static uint32_t bucket_of(const pgd__rix *x, pgd_hash block)
{
    uint64_t h = block.lo ^ (block.hi * 0x9E3779B97F4A7C15ull);
    h ^= h >> 29;
    return (uint32_t)h & (x->n_buckets - 1);
}

int pgd__rix_init(pgd__rix *x, const pgd__alloc *al, uint32_t n_entries)
{
    memset(x, 0, sizeof *x);
    uint32_t nb = 1;
    while (nb < (1u << 26) && (uint64_t)nb * PGD__RIX_WAYS < n_entries)
        nb <<= 1;
    x->e = pgd__calloc(al, (size_t)nb * PGD__RIX_WAYS, sizeof *x->e);
    if (!x->e) return PGD_ENOMEM;
    x->n_buckets = nb;
    return PGD_OK;
}

void pgd__rix_deinit(pgd__rix *x, const pgd__alloc *al)
{
    pgd__free(al, x->e);
    memset(x, 0, sizeof *x);
}

static void drop(pgd__rix *x, pgd__rix_entry *e)
{
    if (e->mine) x->n_mine--;
    memset(e, 0, sizeof *e);
}

pgd__rix_entry *pgd__rix_find(pgd__rix *x, pgd_hash block, uint32_t now_s, uint32_t ttl_s)
{
    pgd__rix_entry *b = x->e + (size_t)bucket_of(x, block) * PGD__RIX_WAYS;
    for (int i = 0; i < PGD__RIX_WAYS; i++) {
        pgd__rix_entry *e = &b[i];
        if (!e->t_s || !pgd_hash_eq(e->block, block)) continue;
        if (ttl_s && now_s - e->t_s >= ttl_s) {
            drop(x, e); /* Redis may have expired it: ask again */
            return NULL;
        }
        return e;
    }
    return NULL;
}

void pgd__rix_add(pgd__rix *x, pgd_hash block, uint32_t now_s, int how)
{
    int mine = how == PGD__RIX_MINE, verified = how != PGD__RIX_SEEN;
    pgd__rix_entry *b = x->e + (size_t)bucket_of(x, block) * PGD__RIX_WAYS, *slot = NULL;
    if (now_s == 0) now_s = 1; /* 0 marks an empty entry */
    for (int i = 0; i < PGD__RIX_WAYS; i++) {
        pgd__rix_entry *e = &b[i];
        if (e->t_s && pgd_hash_eq(e->block, block)) {
            e->t_s = now_s;
            if (verified) e->verified = 1;
            if (mine && !e->mine) {
                e->mine = 1;
                x->n_mine++;
            }
            return;
        }
        if (!e->t_s) {
            if (!slot || slot->t_s) slot = e;
        } else if (!slot || (slot->t_s && e->t_s < slot->t_s)) {
            slot = e; /* the oldest so far, unless an empty one was seen */
        }
    }
    if (slot->t_s) {
        x->n_forgot++;
        drop(x, slot);
    }
    slot->block = block;
    slot->t_s = now_s;
    slot->mine = mine ? 1 : 0;
    slot->verified = verified ? 1 : 0;
    if (mine) x->n_mine++;
}

int pgd__rix_remove(pgd__rix *x, pgd_hash block)
{
    pgd__rix_entry *b = x->e + (size_t)bucket_of(x, block) * PGD__RIX_WAYS;
    for (int i = 0; i < PGD__RIX_WAYS; i++)
        if (b[i].t_s && pgd_hash_eq(b[i].block, block)) {
            drop(x, &b[i]);
            return 1;
        }
    return 0;
}

void pgd__rix_clear(pgd__rix *x)
{
    memset(x->e, 0, (size_t)x->n_buckets * PGD__RIX_WAYS * sizeof *x->e);
    x->n_mine = 0;
}
