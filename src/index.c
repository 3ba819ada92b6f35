/* SPDX-License-Identifier: MIT */
/*
 * index.c - prefix index: block hash -> entry, whose location is a pool page (tier 0) or
 * a block of storage tier T (tiers are not wired into the cache yet).
 *
 *     slots[] (power of two, >= 2x capacity)      entries[capacity]
 *     +------+------+------+------+               +------+--------+----------+-------+----+
 *     | e3   | NONE | e0   | e7   | ...  ------>  | hash | parent | children | depth | id |
 *     +------+------+------+------+               +------+--------+----------+-------+----+
 *                                                 state[capacity]: 0 free, else 1 + tier
 *
 * The capacity counts blocks, not pool pages: the cache sizes it with params.index_capacity
 * (at least the pool's page count), so the index can describe more blocks than the pool
 * holds once tiers keep the rest.
 *
 * Open addressing with linear probing on hash.lo (already uniformly distributed: it is
 * a keyed XXH3 output); deletion shifts later entries back, so there are no tombstones
 * and a lookup never walks more than the cluster it hashes into.
 *
 * Parent links make the entries a forest: entry(h_i).parent = entry(h_{i-1}). Only leaves
 * (n_children == 0) may be removed, so a cached prefix never loses its middle.
 * Callers: cache.c, under the cache lock. All memory is reserved at create time.
 * Invariant: every live entry is in exactly one slot; free entries are on the free list.
 */
#include <string.h>

#include "pgd_int.h"

struct pgd__index {
    pgd__alloc al;
    uint32_t capacity; /* entries */
    uint32_t n_live;
    uint32_t mask;       /* n_slots - 1 */
    uint32_t *slots;     /* [n_slots] entry id or PGD__NONE */
    pgd__entry *entries; /* [capacity] */
    uint32_t *next_free; /* [capacity] free-list links */
    uint8_t *live;       /* [capacity] 0: free; else 1 + the tier of the entry's location */
    uint32_t free_head;
};

int pgd__index_create(const pgd__alloc *al, uint32_t capacity, pgd__index **out)
{
    pgd__index *ix;
    uint64_t n_slots = 16;

    *out = NULL;
    if (capacity == 0 || capacity > (1u << 31)) return PGD_EINVAL;
    while (n_slots < 2ull * capacity)
        n_slots <<= 1;
    ix = pgd__calloc(al, 1, sizeof *ix);
    if (!ix) return PGD_ENOMEM;
    ix->al = *al;
    ix->capacity = capacity;
    ix->mask = (uint32_t)(n_slots - 1);
    ix->slots = pgd__malloc(al, (size_t)n_slots * sizeof *ix->slots);
    ix->entries = pgd__calloc(al, capacity, sizeof *ix->entries);
    ix->next_free = pgd__malloc(al, (size_t)capacity * sizeof *ix->next_free);
    ix->live = pgd__calloc(al, capacity, 1);
    if (!ix->slots || !ix->entries || !ix->next_free || !ix->live) {
        pgd__index_destroy(ix);
        return PGD_ENOMEM;
    }
    memset(ix->slots, 0xff, (size_t)n_slots * sizeof *ix->slots);
    for (uint32_t i = 0; i < capacity; i++)
        ix->next_free[i] = i + 1 < capacity ? i + 1 : PGD__NONE;
    ix->free_head = 0;
    *out = ix;
    return PGD_OK;
}

void pgd__index_destroy(pgd__index *ix)
{
    if (!ix) return;
    pgd__alloc al = ix->al;
    pgd__free(&al, ix->slots);
    pgd__free(&al, ix->entries);
    pgd__free(&al, ix->next_free);
    pgd__free(&al, ix->live);
    pgd__free(&al, ix);
}

/* Home slot of a hash. Hashes from outside (match_hashes) need not be uniform in any
 * one word, so both words are mixed (murmur3 finalizer). */
static uint32_t home_slot(const pgd__index *ix, pgd_hash h)
{
    uint64_t x = h.lo ^ (h.hi * 0x9E3779B97F4A7C15ull);
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (uint32_t)x & ix->mask;
}

/* Returns the slot holding hash, or the empty slot where it would go. */
static uint32_t probe(const pgd__index *ix, pgd_hash hash, int *found)
{
    uint32_t i = home_slot(ix, hash);
    for (;;) {
        uint32_t e = ix->slots[i];
        if (e == PGD__NONE) {
            *found = 0;
            return i;
        }
        if (pgd_hash_eq(ix->entries[e].hash, hash)) {
            *found = 1;
            return i;
        }
        i = (i + 1) & ix->mask;
    }
}

uint32_t pgd__index_find(const pgd__index *ix, pgd_hash hash)
{
    int found;
    uint32_t s = probe(ix, hash, &found);
    return found ? ix->slots[s] : PGD__NONE;
}

uint32_t pgd__index_insert(pgd__index *ix, pgd_hash hash, uint32_t parent, pgd__loc loc)
{
    int found;
    uint32_t s = probe(ix, hash, &found);
    PGD_CHECK(!found);
    uint32_t e = ix->free_head;
    if (e == PGD__NONE) return PGD__NONE;
    PGD_CHECK(parent == PGD__NONE || (parent < ix->capacity && ix->live[parent]));
    PGD_CHECK(loc.tier <= PGD__TIER_MAX);
    ix->free_head = ix->next_free[e];
    ix->live[e] = (uint8_t)(1 + loc.tier);
    ix->entries[e].hash = hash;
    ix->entries[e].parent = parent;
    ix->entries[e].n_children = 0;
    ix->entries[e].loc_id = loc.id;
    ix->entries[e].depth = parent == PGD__NONE ? 0 : ix->entries[parent].depth + 1;
    if (parent != PGD__NONE) ix->entries[parent].n_children++;
    ix->slots[s] = e;
    ix->n_live++;
    return e;
}

pgd__loc pgd__index_loc(const pgd__index *ix, uint32_t e)
{
    PGD_CHECK(e < ix->capacity && ix->live[e]);
    pgd__loc l = {ix->entries[e].loc_id, (uint8_t)(ix->live[e] - 1)};
    return l;
}

void pgd__index_set_loc(pgd__index *ix, uint32_t e, pgd__loc loc)
{
    PGD_CHECK(e < ix->capacity && ix->live[e] && loc.tier <= PGD__TIER_MAX);
    ix->entries[e].loc_id = loc.id;
    ix->live[e] = (uint8_t)(1 + loc.tier);
}

void pgd__index_remove(pgd__index *ix, uint32_t e)
{
    int found;
    PGD_CHECK(e < ix->capacity && ix->live[e] && ix->entries[e].n_children == 0);
    uint32_t i = probe(ix, ix->entries[e].hash, &found);
    PGD_CHECK(found && ix->slots[i] == e);
    /* Backward-shift deletion: move later members of the cluster into the hole when
     * their home slot does not lie cyclically in (hole, their slot]. */
    uint32_t hole = i, j = i;
    for (;;) {
        j = (j + 1) & ix->mask;
        uint32_t f = ix->slots[j];
        if (f == PGD__NONE) break;
        uint32_t home = home_slot(ix, ix->entries[f].hash);
        int stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
        if (!stays) {
            ix->slots[hole] = f;
            hole = j;
        }
    }
    ix->slots[hole] = PGD__NONE;
    uint32_t parent = ix->entries[e].parent;
    if (parent != PGD__NONE) {
        PGD_CHECK(ix->live[parent] && ix->entries[parent].n_children > 0);
        ix->entries[parent].n_children--;
    }
    ix->live[e] = 0;
    ix->next_free[e] = ix->free_head;
    ix->free_head = e;
    ix->n_live--;
}

const pgd__entry *pgd__index_entry(const pgd__index *ix, uint32_t e)
{
    return e < ix->capacity && ix->live[e] ? &ix->entries[e] : NULL;
}

uint32_t pgd__index_size(const pgd__index *ix)
{
    return ix->n_live;
}
uint32_t pgd__index_capacity(const pgd__index *ix)
{
    return ix->capacity;
}

int pgd__index_check(const pgd__index *ix, const pgd__log *lg)
{
    uint32_t n_slots = ix->mask + 1, in_slots = 0, n_free = 0, n_live = 0;
    uint32_t *kids = pgd__calloc(&ix->al, ix->capacity, sizeof *kids);
    int rc = PGD_ECORRUPT;
    if (!kids) return PGD_ENOMEM;
    for (uint32_t s = 0; s < n_slots; s++) {
        uint32_t e = ix->slots[s];
        if (e == PGD__NONE) continue;
        int found;
        if (e >= ix->capacity || !ix->live[e] || probe(ix, ix->entries[e].hash, &found) != s ||
            !found) {
            pgd__logf(lg, PGD_LOG_ERROR, "index check: slot %u holds bad entry %u", s, e);
            goto out;
        }
        in_slots++;
    }
    for (uint32_t e = 0; e < ix->capacity; e++) {
        if (!ix->live[e]) continue;
        n_live++;
        uint32_t p = ix->entries[e].parent;
        if (p != PGD__NONE) {
            if (p >= ix->capacity || !ix->live[p] ||
                ix->entries[p].depth + 1 != ix->entries[e].depth) {
                pgd__logf(lg, PGD_LOG_ERROR, "index check: entry %u has a dead parent %u", e, p);
                goto out;
            }
            kids[p]++;
        } else if (ix->entries[e].depth != 0) {
            pgd__logf(lg, PGD_LOG_ERROR, "index check: root entry %u has depth %u", e,
                      ix->entries[e].depth);
            goto out;
        }
    }
    for (uint32_t e = 0; e < ix->capacity; e++) {
        if (ix->live[e] && kids[e] != ix->entries[e].n_children) {
            pgd__logf(lg, PGD_LOG_ERROR, "index check: entry %u counts %u children, has %u", e,
                      ix->entries[e].n_children, kids[e]);
            goto out;
        }
    }
    for (uint32_t e = ix->free_head; e != PGD__NONE; e = ix->next_free[e]) {
        if (e >= ix->capacity || ix->live[e] || ++n_free > ix->capacity) {
            pgd__logf(lg, PGD_LOG_ERROR, "index check: bad free list at %u", e);
            goto out;
        }
    }
    if (in_slots != n_live || n_live != ix->n_live || n_live + n_free != ix->capacity) {
        pgd__logf(lg, PGD_LOG_ERROR, "index check: %u in slots, %u live (%u counted), %u free",
                  in_slots, n_live, ix->n_live, n_free);
        goto out;
    }
    rc = PGD_OK;
out:
    pgd__free(&ix->al, kids);
    return rc;
}
