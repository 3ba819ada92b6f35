/* SPDX-License-Identifier: MIT */
/*
 * common.c - what the reference (ref.c) and the fast path (attn.c) share, so that both
 * read the same rows and select the same pages: the pool geometry, one item's view of its
 * sequence (page table and kivi2 residual ring), and Quest page selection.
 *
 * Quest (select_pages = B, for a decode row whose sequence has n > B pages):
 *
 *   keep   page 0 (attention sink), the newest R = max(1, B / 4) pages (the current page
 *          among them), and the B - 1 - R pages among 1 .. n-R-1 of highest bound
 *   bound  max over the group's query heads h of sum_d max(q_hd * min_d, q_hd * max_d),
 *          an upper bound of q . k for every key k stored in the page (min/max are the
 *          page's channel-wise key bounds, in the stored, rotated basis, as q is)
 *   ties   the older page wins; sums run in a fixed order, so the choice is reproducible
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_int.h"

/* ---- geometry and views ---- */

int pgd__attn_geom_init(pgd__attn_geom *g, pgd_cache *c, uint32_t n_head, uint32_t select_pages,
                        int ref)
{
    memset(g, 0, sizeof *g);
    if (!c) return PGD_EINVAL;
    pgd_pool *pool = pgd_cache_pool(c);
    pgd__pool_geom pg;
    pgd__pool_geom_get(pool, &pg);
    g->top = g->cache = c;
    g->pool = pool;
    g->n_layers = pgd_cache_n_layers(c);
    g->n_kv_heads = pg.n_kv_heads;
    g->head_dim = pg.head_dim;
    g->page_tokens = pg.page_tokens;
    g->type = pgd_pool_kv_type(pool);
    g->rotate = pg.kv_rotate;
    g->rotate_seed = pg.rotate_seed;
    g->key_bounds = pg.key_bounds;
    g->n_head = n_head;
    if (!n_head || n_head % g->n_kv_heads) return PGD_EINVAL;
    g->group = n_head / g->n_kv_heads;
    if (!pgd_pool_has_payload(pool) || pg.arena_device) return PGD_EINVAL; /* host reads */
    if (select_pages == 1 || (select_pages && !g->key_bounds)) return PGD_EINVAL;
    g->codec = ref ? pgd__codec_ref(g->type) : pgd__codec_get(g->type);
    if (!g->codec) return PGD_EINVAL;
    if (pgd__codec_staged(g->codec, g->head_dim)) {
        g->ring = ref ? pgd__codec_ref(PGD_KV_F16) : pgd__codec_get(PGD_KV_F16);
        if (!g->ring) return PGD_EINVAL;
    }
    return PGD_OK;
}

uint32_t pgd__attn_geom_layer(pgd__attn_geom *g, uint32_t layer)
{
    uint32_t local;
    g->cache = pgd__cache_group(g->top, layer, &local);
    g->pool = pgd_cache_pool(g->cache);
    return local;
}

int pgd__attn_view_init(const pgd__attn_geom *g, const pgd_attn_item *it, pgd__attn_view *v)
{
    memset(v, 0, sizeof *v);
    if (!it->seq || !it->q || !it->out) return PGD_EINVAL;
    pgd_seq *s = pgd__seq_group(g->top, it->seq, g->cache);
    v->len = pgd_seq_length(g->cache, s);
    if (it->n_rows > v->len) return PGD_EINVAL;
    v->n_pages = pgd_seq_pages(g->cache, s, &v->pages);
    if ((uint64_t)v->n_pages * g->page_tokens < v->len) return PGD_EINVAL;
    if (g->ring) {
        uint64_t lo;
        int rc = pgd__seq_residual(g->cache, s, &v->ring, &v->window, &lo);
        if (rc != PGD_OK) return rc;
        if (!v->ring || !v->window || v->window % g->page_tokens) return PGD_EINVAL;
        v->ring_lo = lo / g->page_tokens;
    }
    pgd__seq_mask(s, &v->mask_len, &v->n_live);
    if (!v->n_live) v->mask_len = 0;
    return PGD_OK;
}

/* ---- Quest ---- */

/* Upper bound of q . k over the keys of a page, the maximum over the group's heads. */
static float page_bound(const pgd__attn_geom *g, const float *qr, const float *bounds)
{
    const uint32_t hd = g->head_dim;
    const float *mn = bounds, *mx = bounds + hd;
    float best = -INFINITY;
    for (uint32_t h = 0; h < g->group; h++) {
        const float *q = qr + (size_t)h * hd;
        float s = 0;
        for (uint32_t d = 0; d < hd; d++) {
            float a = q[d] * mn[d], b = q[d] * mx[d];
            s += a > b ? a : b;
        }
        best = s > best ? s : best;
    }
    return best;
}

/* Heap order: a is worse than b (lower bound, or equal bound and newer page). */
static int worse(float sa, uint32_t pa, float sb, uint32_t pb)
{
    return sa < sb || (sa == sb && pa > pb);
}

static void sift_down(uint32_t *hp, float *hs, uint32_t n, uint32_t i)
{
    for (;;) {
        uint32_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && worse(hs[l], hp[l], hs[w], hp[w])) w = l;
        if (r < n && worse(hs[r], hp[r], hs[w], hp[w])) w = r;
        if (w == i) return;
        float ts = hs[i];
        uint32_t tp = hp[i];
        hs[i] = hs[w];
        hp[i] = hp[w];
        hs[w] = ts;
        hp[w] = tp;
        i = w;
    }
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

uint32_t pgd__attn_select(const pgd__attn_geom *g, const pgd__attn_view *v, uint32_t layer,
                          uint32_t kvh, const float *qr, uint32_t budget, uint32_t *sel,
                          uint32_t *heap_page, float *heap_score)
{
    const uint32_t n = v->n_pages;
    if (!budget || n <= budget) {
        for (uint32_t i = 0; i < n; i++)
            sel[i] = i;
        return n;
    }
    const uint32_t recent = budget / 4 ? budget / 4 : 1;
    const uint32_t k = budget - 1 - recent, first_recent = n - recent;
    uint32_t nh = 0;
    for (uint32_t pi = 1; k && pi < first_recent; pi++) {
        const float *b = pgd_pool_key_bounds(g->pool, v->pages[pi], layer, kvh);
        float s = b ? page_bound(g, qr, b) : INFINITY;
        if (nh < k) {
            /* Sift up. */
            uint32_t i = nh++;
            heap_page[i] = pi;
            heap_score[i] = s;
            while (i && worse(heap_score[i], heap_page[i], heap_score[(i - 1) / 2],
                              heap_page[(i - 1) / 2])) {
                uint32_t p = (i - 1) / 2;
                float ts = heap_score[i];
                uint32_t tp = heap_page[i];
                heap_score[i] = heap_score[p];
                heap_page[i] = heap_page[p];
                heap_score[p] = ts;
                heap_page[p] = tp;
                i = p;
            }
        } else if (worse(heap_score[0], heap_page[0], s, pi)) {
            heap_score[0] = s;
            heap_page[0] = pi;
            sift_down(heap_page, heap_score, nh, 0);
        }
    }
    uint32_t m = 0;
    sel[m++] = 0;
    for (uint32_t i = 0; i < nh; i++)
        sel[m++] = heap_page[i];
    qsort(sel + 1, nh, sizeof *sel, cmp_u32);
    for (uint32_t pi = first_recent; pi < n; pi++)
        sel[m++] = pi;
    return m;
}

int pgd__attn_gemma_ok(const pgd_attn_params *p)
{
    return isfinite(p->scale) && p->scale >= 0 && isfinite(p->softcap) && p->softcap >= 0;
}
