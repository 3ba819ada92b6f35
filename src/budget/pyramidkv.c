/* SPDX-License-Identifier: MIT */
/*
 * pyramidkv.c - PyramidKV: SnapKV's scoring and selection with per-layer budgets that
 * shrink linearly from the lowest layer to the highest (pgd_budget_layer_budget; budget.c
 * hands the layer's budget in sel->budget). Caller: budget.c's ops table.
 */
#include "budget_int.h"

static int pyramidkv_select(const pgd__budget_sel *sel)
{
    return pgd__budget_select_uniform(sel, 1);
}

const pgd__budget_ops pgd__budget_pyramidkv = {
    .name = "pyramidkv",
    .feed = PGD__FEED_OBS,
    .online = 0,
    .pooled = 1,
    .select = pyramidkv_select,
};
