/* SPDX-License-Identifier: MIT */
/*
 * snapkv.c - SnapKV: the prompt's last obs_window rows score every key (accumulated over
 * the prefill chunks that hold them); at the prompt's end the scores of keys
 * [0, n - window) are max-pooled over keys (pool_kernel wide, centered, clipped at the
 * ends) and every head keeps the sinks, the window (the observation window itself) and
 * the top budget - sinks - window pooled scores of [sinks, n - window). Once, at the
 * prompt's end, by default. Caller: budget.c's ops table.
 */
#include "budget_int.h"

static int snapkv_select(const pgd__budget_sel *sel)
{
    return pgd__budget_select_uniform(sel, 1);
}

const pgd__budget_ops pgd__budget_snapkv = {
    .name = "snapkv",
    .feed = PGD__FEED_OBS,
    .online = 0,
    .pooled = 1,
    .select = snapkv_select,
};
