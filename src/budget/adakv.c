/* SPDX-License-Identifier: MIT */
/*
 * adakv.c - Ada-KV: SnapKV's scoring (observation window, max-pooled scores) with one
 * layer's total budget (budget x n_kv_heads) shared between its heads by their scores.
 * Scores are comparable across heads: each is a sum of probabilities over the same rows.
 *
 *   1. every head keeps its sinks and window, and its floor share: the top
 *      min(floor(adakv_floor x budget), budget - sinks - window) pooled scores of
 *      [sinks, m - window) (a head of m <= sinks + window live tokens keeps them all);
 *   2. the rest of the layer's total goes to the highest pooled scores left across all
 *      heads (ranked by pooled score, raw score, then the older token, then the lower head), no
 * head beyond max(budget, floor(adakv_cap x budget)) tokens.
 *
 * Each head's candidates past its floor share are at most its cap, so step 2 ranks at most
 * n_kv_heads x cap entries: O(m log cap) per head plus one sort of those. When every head
 * has m <= budget everything is kept. Caller: budget.c's ops table.
 */
#include <math.h>

#include "budget_int.h"

static int adakv_select(const pgd__budget_sel *sel)
{
    const pgd_budget_params *p = sel->p;
    const uint32_t B = sel->budget, S = p->sinks, W = p->window, H = sel->n_kv_heads;
    const uint32_t cap = pgd__budget_head_max(p, B);
    uint32_t floor_k = (uint32_t)floor((double)p->adakv_floor * B);
    if (floor_k > B - S - W) floor_k = B - S - W;
    const uint32_t cap_extra = cap - S - W;
    const size_t per_head = cap_extra < sel->n_keys ? cap_extra : sel->n_keys;
    pgd__budget_scratch *scr = sel->scr;
    int rc = pgd__budget_scratch_reserve(scr, sel->n_keys, 2 * (size_t)H * per_head + 1, cap + 1);
    if (rc != PGD_OK) return rc;
    pgd__budget_ent *lists = scr->ents, *pool = scr->ents + (size_t)H * per_head;
    size_t n_pool = 0;
    uint64_t left = (uint64_t)B * H;

    /* Step 1: each head's ranked candidates (up to its cap), its floor share taken. */
    for (uint32_t h = 0; h < H; h++) {
        pgd__budget_view v;
        pgd__budget_view_get(sel, h, &v);
        sel->n_keep[h] = 0; /* extras taken, for now */
        if (v.m <= S + W) {
            left -= v.m < left ? v.m : left;
            continue;
        }
        const uint32_t c = v.m - S - W, n = c < cap_extra ? c : cap_extra;
        const uint32_t base = floor_k < c ? floor_k : c;
        pgd__budget_ent *e = lists + (size_t)h * per_head;
        pgd__budget_gather(scr, &v);
        pgd__budget_pool(scr->dense, v.m - W, p->pool_kernel, scr->dq, scr->pooled);
        pgd__budget_top(scr->pooled, scr->dense, S, v.m - W, n, h, 1, e);
        for (uint32_t j = base; j < n; j++)
            pool[n_pool++] = e[j];
        sel->n_keep[h] = base;
        left -= (uint64_t)S + W + base;
    }

    /* Step 2: the rest of the layer's total to the best left over all heads. */
    pgd__budget_rank(pool, n_pool);
    for (size_t j = 0; j < n_pool && j < left; j++)
        sel->n_keep[pool[j].h]++;

    for (uint32_t h = 0; h < H; h++) {
        pgd__budget_view v;
        uint32_t *out = sel->keep + (size_t)h * sel->max_keep;
        pgd__budget_view_get(sel, h, &v);
        if (v.m <= S + W) {
            sel->n_keep[h] = pgd__budget_emit_all(&v, out);
            continue;
        }
        const pgd__budget_ent *e = lists + (size_t)h * per_head;
        const uint32_t k = sel->n_keep[h];
        for (uint32_t j = 0; j < k; j++)
            scr->picks[j] = e[j].i;
        pgd__budget_sort_u32(scr->picks, k);
        sel->n_keep[h] = pgd__budget_emit(&v, S, scr->picks, k, W, out);
    }
    return PGD_OK;
}

const pgd__budget_ops pgd__budget_adakv = {
    .name = "adakv",
    .feed = PGD__FEED_OBS,
    .online = 0,
    .pooled = 1,
    .select = adakv_select,
};
