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
 * the tier's lock, or retention pinned it); it can still be removed (pgd__tmap_remove)
 * by its owner's choice.
 *
 * Retention (pgd__tmap_retain, the tiers' retain op): each slot has a priority, a tenant,
 * an expiry in wall-clock seconds and a retention pin. The policy gets them through
 * pgd_policy_page (expires_ns on the map's clock, CLOCK_REALTIME ns); an expired leaf is
 * evicted before the policy is asked; retention pins are bounded in bytes.
 * Quotas: a retain with tenant_share > 0 reserves share x capacity records for its tenant;
 * while a tenant holds no more than its reservation (records retain tagged with it), none
 * of them is a victim, expired or not (a put that finds nothing else is refused). With no
 * reservation the order is the policy's alone.
 *
 * Not locked: the tier calls it under its own lock. Memory, all reserved by create:
 * 80 bytes of slot data, 16 bytes of the two hash tables (each >= 2x capacity uint32),
 * 8 of expiry list, 4 of free list and 9 of LRU state (other policies: their own):
 * about 120 bytes per slot (the RAM and disk tiers size capacity from their byte bound
 * and the smallest record they can store).
 */

typedef struct pgd__tmap pgd__tmap;

/* What the map keeps for one slot (read-only for the tier: pgd__tmap_slot). */
typedef struct pgd__tmap_slot {
    pgd_hash hash;       /* the block */
    pgd_hash parent;     /* its chain parent ({0, 0}: the first block of a chain) */
    uint32_t n_children; /* live slots whose parent is this block */
    uint32_t pins;       /* > 0: not evictable (readers, and 1 for a retention pin) */
    uint32_t depth;      /* 1 + the parent's depth when the parent was present at insert */
    uint32_t live;       /* non-zero while the slot holds a record */
    /* Retention (pgd__tmap_retain; the defaults at insert). */
    uint32_t priority;  /* 0..100, PGD_PRIORITY_DEFAULT */
    uint32_t tenant;    /* pgd_tier_retention.tenant_index, 0 */
    uint32_t uses;      /* touches since insert (pgd_policy_page.uses) */
    uint32_t retained;  /* 1: pinned by retention (counted in pins and the pin bytes) */
    uint64_t expires_s; /* wall-clock second its retention ends (0: none) */
    uint64_t pin_bytes; /* the bytes charged to the pin share while retained */
    uint32_t tagged;    /* 1: retain named its tenant (counted in the tenant's records) */
} pgd__tmap_slot;

/* Tenants a map tells apart for quotas (pgd_tier_retention.tenant_index < this). */
#define PGD__TMAP_TENANTS 64

/* What a map's policy is told about the records (pgd_policy_init): ident (may be NULL:
 * one-byte pages of a 1 x 1 x 1 geometry, for tests) gives page_bytes (page + bounds),
 * page_tokens and the cost model (pgd_cost_model_default of its geometry). */
/* Creates an empty map of capacity slots (1 .. 2^30) ordered by policy (NULL: LRU,
 * pgd_policy_builtin(PGD_POLICY_LRU); the table must outlive the map; a policy that needs
 * next_use, such as Belady, is refused with its create's status). The policy's clock is
 * the map's (pgd__tmap_set_clock; CLOCK_REALTIME ns by default, the time base of the
 * expiries it is given). Returns PGD_OK, PGD_EINVAL or PGD_ENOMEM. */
int pgd__tmap_create(const pgd__alloc *al, uint32_t capacity, const pgd_policy_ops *policy,
                     const pgd_record_ident *ident, pgd__tmap **out);
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
/* The slot to evict next: an unpinned leaf whose expiry has passed (the earliest found),
 * else the policy's choice among unpinned slots with no child in the map, or PGD__NONE.
 * When no slot is pinned and none is a leaf (parents that form a cycle: crafted records),
 * the policy's choice among all slots, so that such records cannot fill a tier for good.
 * Changes nothing (pgd__tmap_remove it). Cost: the policy's, plus a walk of the slots
 * that have an expiry once one of them has passed. */
uint32_t pgd__tmap_victim(pgd__tmap *m);
/* A live slot's data (valid until it is removed). */
const pgd__tmap_slot *pgd__tmap_slot_get(const pgd__tmap *m, uint32_t slot);

/* ---- retention (pgd_tier_ops.retain) ---- */

/* Sets the retention of a live slot from r (tier.h pgd_tier_retention): priority (clamped
 * to 100), tenant, expiry (ttl_s > 0: now + ttl_s; 0: none), pin (1: out of the
 * evictable set, charging bytes to the pin share; -1: back in it; 0: as it was). The
 * policy sees the new priority and expiry (the slot re-enters its set). Returns PGD_OK or
 * PGD_ENOSPC (a pin past the limit, pgd__tmap_set_pin_limit: nothing changed). */
int pgd__tmap_retain(pgd__tmap *m, uint32_t slot, const pgd_tier_retention *r, uint64_t bytes);
/* Copies the retention of from (priority, tenant, uses, expiry, retention pin: not
 * bounded by the pin limit) to a live slot of m: a map that grows keeps it. */
void pgd__tmap_restore(pgd__tmap *m, uint32_t slot, const pgd__tmap_slot *from);
/* A tenant's reserved share of the map's capacity (0: none), as retain sets it from
 * tenant_share; a map that grows copies them (pgd__tmap_share). */
void pgd__tmap_set_share(pgd__tmap *m, uint32_t tenant, double share);
double pgd__tmap_share(const pgd__tmap *m, uint32_t tenant);
/* Bytes that retention pins may hold at most (default: no bound). */
void pgd__tmap_set_pin_limit(pgd__tmap *m, uint64_t bytes);
/* Bytes held by retention pins now. */
uint64_t pgd__tmap_pinned_bytes(const pgd__tmap *m);
/* The map's clock (ns; NULL: CLOCK_REALTIME), read by expiries and given to the policy.
 * Tests inject one to step TTLs. */
void pgd__tmap_set_clock(pgd__tmap *m, pgd_clock_fn clock, void *ud);
/* The policy kind of a local tier's params (pgd_tier_ram_params.policy): the ops table,
 * or NULL with a log line naming the value and the valid kinds (unknown, not built in,
 * or belady: a tier has no future to look at). */
const pgd_policy_ops *pgd__tier_policy_ops(int kind, const char *tier, const pgd__log *lg);
/* The pin bound of a local tier: share (0: 0.5; else (0, 1]) x capacity bytes; -1.0 from
 * a share outside (0, 1], which create refuses. */
double pgd__tier_pin_share(double share);

/* Walks the whole map: tables, child counts, free list, the policy's set (every unpinned
 * live slot and nothing else), the expiry list and the pin bytes. Returns PGD_OK or
 * PGD_ECORRUPT (logged to lg, may be NULL). O(capacity^2): tests only. */
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
/* Sets the clock (ns; NULL: CLOCK_REALTIME) of a bound RAM tier's record map: the time
 * base of its retention expiries. Returns PGD_OK or PGD_EINVAL (not a bound RAM tier).
 * Tests only. */
int pgd__tier_ram_set_clock(pgd_tier *t, pgd_clock_fn clock, void *ud);

#endif /* PGD_TIER_INT_H */
