/* SPDX-License-Identifier: MIT */
/*
 * tier_int.h - internals shared by the built-in tiers (ram.c, disk.c) and their tests:
 * the handle constructor, a monotonic clock and the latency histogram of pgd_tier_stats.
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

#endif /* PGD_TIER_INT_H */
