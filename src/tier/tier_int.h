/* SPDX-License-Identifier: MIT */
/*
 * tier_int.h - internals shared by the built-in tiers (ram.c, disk.c) and their tests:
 * the handle constructor, the record map (which records a tier holds, and which one to
 * evict), a monotonic clock and the latency histogram of pgd_tier_stats.
 * Internal to libpagoda (src/ and INTERNAL tests only).
 */
#ifndef PGD_TIER_INT_H
#define PGD_TIER_INT_H

#include <math.h>
#include <string.h>
#include <time.h>

#include "pgd_int.h"
#include "pagoda/policy.h"
#include "pagoda/tier.h"

/* ---- the handle (tier.c) ---- */

/* Makes a handle for a built-in tier: ops (static storage) and state, allocated with al
 * (copied). pgd_tier_close calls ops->close(state), then frees the handle with al.
 * Returns PGD_OK, PGD_EINVAL (a NULL member of ops) or PGD_ENOMEM (state untouched: the
 * caller frees it). */
int pgd__tier_new(const pgd__alloc *al, const pgd_tier_ops *ops, void *state, pgd_tier **out);
/* The state of t when t was made with ops, else NULL (how pgd_tier_disk_key knows that a
 * handle is a disk tier). */
void *pgd__tier_state(const pgd_tier *t, const pgd_tier_ops *ops);

/* ---- clock and latency histogram (tier.c) ---- */

/* CLOCK_MONOTONIC in nanoseconds / microseconds. Thread-safe. */
uint64_t pgd__tier_now_ns(void);
uint64_t pgd__tier_now_us(void);
/* The bucket of pgd_tier_hist_bounds_us that a latency of ns nanoseconds falls in: the
 * first whose bound is >= the latency in microseconds (the last is +inf). */
uint32_t pgd__tier_hist_bucket(uint64_t ns);
/* hist[bucket of ns]++ (the caller holds whatever lock guards hist). */
void pgd__tier_hist_add(uint64_t hist[PGD_TIER_HIST_BUCKETS], uint64_t ns);
/* hist[bucket of ns]++ and *sum += ns (pgd_tier_stats get_hist + get_ns_sum, ...). */
void pgd__tier_lat_add(uint64_t hist[PGD_TIER_HIST_BUCKETS], uint64_t *sum, uint64_t ns);

/* ---- record internals (record.c) ---- */

/* The checksum a record's header should carry (tier.h: XXH3-64 of header bytes 0..119,
 * then the payload) for a payload given in n_parts pieces (in order; parts[i] may be NULL
 * when part_bytes[i] is 0): a tier that reads a record's payload straight into the pool
 * page and the bounds (readv) verifies it without a copy. */
uint64_t pgd__record_checksum(const void *header, const void *const *parts,
                              const uint64_t *part_bytes, int n_parts);
/* The checksum stored in a header (bytes 120..127). */
uint64_t pgd__record_stored_checksum(const void *header);
/* Copies a raw payload of page_bytes + bounds_bytes bytes at payload to page and bounds
 * (bounds may be NULL when bounds_bytes is 0), computing its checksum on the way, a chunk
 * at a time while the chunk is in cache (one pass over the source instead of two).
 * Returns PGD_OK, or PGD_ECORRUPT when the checksum differs from the header's (the
 * destination then holds damaged bytes: the caller treats it as a miss). */
int pgd__record_copy_verified(const void *header, const void *payload, void *page,
                              uint64_t page_bytes, void *bounds, uint64_t bounds_bytes);

/* ---- the record map (map.c) ----
 *
 * block hash -> slot id (0 .. capacity-1) of the records a tier holds, with each record's
 * parent hash and the number of its children present in the same map, and an eviction
 * order kept by a policy ops table (policy.h; slot ids are its "pages"). The tier keeps
 * its own per-slot data (a record pointer, a file offset) in arrays indexed by slot id.
 *
 * Leaf-only eviction within the tier: pgd__tmap_victim returns only a slot whose children
 * are all absent from the map (n_children == 0), so a tier never drops the middle of a
 * chain while it holds the chain's end (a lookup of the run would stop at the hole and
 * the end would be dead weight). Children may arrive before their parent (demotion from
 * the pool evicts leaves first): insert counts the children already present.
 *
 * Pins: a pinned slot is out of the policy's evictable set (a reader copies it without
 * the tier's lock); it can still be removed (pgd__tmap_remove) by its owner's choice.
 *
 * Not locked: the tier calls it under its own lock. Memory, all reserved by create:
 * 48 bytes of slot data, 16 bytes of the two hash tables (each >= 2x capacity uint32),
 * 4 of free list and 9 of LRU state: about 80 bytes per slot (the RAM and disk tiers size
 * capacity from their byte bound and the smallest record they can store).
 */

typedef struct pgd__tmap pgd__tmap;

/* What the map keeps for one slot (read-only for the tier: pgd__tmap_slot). */
typedef struct pgd__tmap_slot {
    pgd_hash hash;       /* the block */
    pgd_hash parent;     /* its chain parent ({0, 0}: the first block of a chain) */
    uint32_t n_children; /* live slots whose parent is this block */
    uint32_t pins;       /* > 0: not evictable */
    uint32_t depth;      /* 1 + the parent's depth when the parent was present at insert */
    uint32_t live;       /* non-zero while the slot holds a record */
} pgd__tmap_slot;

/* Creates an empty map of capacity slots (1 .. 2^30) ordered by policy (NULL: LRU,
 * pgd_policy_builtin(PGD_POLICY_LRU); the table must outlive the map; a policy that needs
 * next_use, such as Belady, is refused with its create's status). Returns PGD_OK,
 * PGD_EINVAL or PGD_ENOMEM. */
int pgd__tmap_create(const pgd__alloc *al, uint32_t capacity, const pgd_policy_ops *policy,
                     pgd__tmap **out);
/* NULL: no-op. */
void pgd__tmap_destroy(pgd__tmap *m);
uint32_t pgd__tmap_capacity(const pgd__tmap *m);
/* Live slots. */
uint32_t pgd__tmap_count(const pgd__tmap *m);
/* The slot of block, or PGD__NONE. O(1) expected. */
uint32_t pgd__tmap_find(const pgd__tmap *m, pgd_hash block);
/* Adds block (absent: PGD_CHECK) under parent; the new slot is unpinned and the newest
 * in the eviction order. A block named as its own parent (only crafted records do) is
 * kept as the first block of a chain. Returns the slot, or PGD__NONE when every slot is
 * live (evict first). */
uint32_t pgd__tmap_insert(pgd__tmap *m, pgd_hash block, pgd_hash parent);
/* Removes a live slot (a leaf or not: its children stay, now without a parent here). */
void pgd__tmap_remove(pgd__tmap *m, uint32_t slot);
/* A use of a live slot (a get): it becomes the newest in the eviction order. */
void pgd__tmap_touch(pgd__tmap *m, uint32_t slot);
/* Pins / unpins a live slot (counted). An unpinned slot at zero becomes the newest. */
void pgd__tmap_pin(pgd__tmap *m, uint32_t slot);
void pgd__tmap_unpin(pgd__tmap *m, uint32_t slot);
/* The slot to evict next: the policy's choice among unpinned slots with no child in the
 * map, or PGD__NONE. When no slot is pinned and none is a leaf (parents that form a
 * cycle: crafted records), the policy's choice among all slots, so that such records
 * cannot fill a tier for good. Changes nothing (pgd__tmap_remove it). */
uint32_t pgd__tmap_victim(pgd__tmap *m);
/* A live slot's data (valid until it is removed). */
const pgd__tmap_slot *pgd__tmap_slot_get(const pgd__tmap *m, uint32_t slot);
/* Walks the whole map: tables, child counts, free list, the policy's set (every unpinned
 * live slot and nothing else). Returns PGD_OK or PGD_ECORRUPT (logged to lg, may be
 * NULL). O(capacity^2): tests only. */
int pgd__tmap_check(const pgd__tmap *m, const pgd__log *lg);

/* ---- RAM tier test hooks (ram.c) ---- */

/* Flips a bit of the byte at offset (modulo the record's size, header included) of the
 * record of block held by a RAM tier, as memory corruption would. Returns PGD_OK,
 * PGD_ENOTFOUND (not held) or PGD_EINVAL (not a RAM tier). Tests only. */
int pgd__tier_ram_corrupt(pgd_tier *t, pgd_hash block, uint64_t offset);
/* Checks a RAM tier's map (pgd__tmap_check), that each record's header names its slot's
 * block and parent, and that the bytes held add up and stay within the bound. Returns
 * PGD_OK, PGD_ECORRUPT or PGD_EINVAL (not a RAM tier). O(capacity^2): tests only. */
int pgd__tier_ram_check(pgd_tier *t);

#endif /* PGD_TIER_INT_H */
