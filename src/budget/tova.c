/* SPDX-License-Identifier: MIT */
/*
 * tova.c - TOVA (token omission via attention): the scores are the last query row of the
 * latest step only (the buffer is zeroed at each begin). Every head keeps the sinks, the
 * newest `window` tokens (1 by default: the current token) and the tokens of highest
 * attention from the current query; enforced every page_tokens steps, TOVA's one-token
 * eviction at page granularity. Online by default. Caller: budget.c's ops table.
 */
#include "budget_int.h"

static int tova_select(const pgd__budget_sel *sel)
{
    return pgd__budget_select_uniform(sel, 0);
}

const pgd__budget_ops pgd__budget_tova = {
    .name = "tova",
    .feed = PGD__FEED_LAST,
    .online = 1,
    .pooled = 0,
    .select = tova_select,
};
