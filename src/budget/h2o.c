/* SPDX-License-Identifier: MIT */
/*
 * h2o.c - H2O (heavy hitters): the scores accumulate every query row of every step
 * (attention mass so far; kept tokens carry theirs through compaction, new slots start at
 * 0). Every head keeps the sinks, the newest `window` tokens and the highest accumulated
 * scores of the rest. Online by default. Caller: budget.c's ops table.
 */
#include "budget_int.h"

static int h2o_select(const pgd__budget_sel *sel)
{
    return pgd__budget_select_uniform(sel, 0);
}

const pgd__budget_ops pgd__budget_h2o = {
    .name = "h2o",
    .feed = PGD__FEED_ALL,
    .online = 1,
    .pooled = 0,
    .select = h2o_select,
};
