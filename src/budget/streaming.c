/* SPDX-License-Identifier: MIT */
/*
 * streaming.c - StreamingLLM: every head keeps the attention sinks (the first `sinks` live
 * tokens) and the newest budget - sinks live tokens. Needs no scores. Online by default.
 * Caller: budget.c's ops table.
 */
#include "budget_int.h"

static int streaming_select(const pgd__budget_sel *sel)
{
    const uint32_t B = sel->budget, S = sel->p->sinks;
    for (uint32_t h = 0; h < sel->n_kv_heads; h++) {
        pgd__budget_view v;
        uint32_t *out = sel->keep + (size_t)h * sel->max_keep;
        pgd__budget_view_get(sel, h, &v);
        sel->n_keep[h] =
            v.m <= B ? pgd__budget_emit_all(&v, out) : pgd__budget_emit(&v, S, NULL, 0, B - S, out);
    }
    return PGD_OK;
}

const pgd__budget_ops pgd__budget_streaming = {
    .name = "streaming",
    .feed = PGD__FEED_NONE,
    .online = 1,
    .pooled = 0,
    .select = streaming_select,
};
