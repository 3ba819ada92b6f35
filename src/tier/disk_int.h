/* SPDX-License-Identifier: MIT */
/*
 * disk_int.h - the disk tier's test hooks (src/tier/disk.c): fault injection on record
 * writes, so that tests/unit/test_tier_disk.c can make the filesystem "full" (ENOSPC,
 * EDQUOT) or failing (EIO) without a small filesystem, and an injected clock for
 * retention expiries. Internal to libpagoda (src/ and
 * INTERNAL tests only).
 */
#ifndef PGD_TIER_DISK_INT_H
#define PGD_TIER_DISK_INT_H

#include <stdint.h>

#include "pagoda/policy.h"
#include "pagoda/tier.h"

/* After `after` more record writes of disk tier t succeed, the next `count` fail as if the
 * filesystem had returned errno err (ENOSPC, EDQUOT, EIO, ...); count UINT64_MAX: every
 * one from then on; count 0: off. A failing write leaves no file behind, as a real one
 * would not. Returns PGD_OK or PGD_EINVAL (t is not a disk tier). Takes the tier's lock. */
int pgd__tier_disk_fault(pgd_tier *t, int err, uint64_t after, uint64_t count);
/* Sets the clock (ns, the time base of retention expiries; NULL: CLOCK_REALTIME) of disk
 * tier t's record map, now and for the maps it grows into. Returns PGD_OK or PGD_EINVAL
 * (not a disk tier). Tests only. */
int pgd__tier_disk_set_clock(pgd_tier *t, pgd_clock_fn clock, void *ud);

#endif /* PGD_TIER_DISK_INT_H */
