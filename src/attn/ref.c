/* SPDX-License-Identifier: MIT */
/*
 * ref.c - the scalar reference of paged attention (pgd_attn_run_ref): the spec that the
 * fast path (attn.c) is tested against. Plain loops, one thread, allocation per call
 * (through the cache's allocator, pgd__cache_alloc).
 *
 * For every item, every query row t (position pos = len - n_rows + t) and KV head g:
 *
 *   pages   every page index 0 .. pos / page_tokens, or, for a decode row (n_rows == 1)
 *           under Quest, the pages pgd__attn_select keeps (common.c, shared with attn.c)
 *   K, V    each page's rows [0, min(page_tokens, pos + 1 - page start)) decoded to f32 by
 *           the reference codec's decode_rows (staged pools: the row's own page from the
 *           residual ring's f16 rows, see pgd__attn_ring_page)
 *   q       the query head, forward-rotated when the pool stores K/V rotated
 *   s_j     dot(q, k_j) / sqrt(head_dim), accumulated in double
 *   w_j     exp(s_j - max_j s_j) in double;  out = (sum_j w_j v_j) / (sum_j w_j)
 *   out     inverse-rotated when rotated, stored as float
 *   dead    a compacted sequence's dead slots of (layer, g) (pgd__attn_dead) get w_j = 0
 *   scores  pgd_attn_run_ref_scored: for the item's last sc.rows rows, w_j / sum_j w_j of
 *           every query head of the group is summed in double per (KV head, slot) over the
 *           heads and rows, then added to scores[g * ld + slot] as float
 *
 * The rotation is orthonormal, so dot(R q, R k) = dot(q, k) and R^-1 sum w (R v) = sum w v:
 * rotated pools give the same attention as unrotated ones up to rounding.
 */
#include <math.h>
#include <string.h>

#include "attn_int.h"

/* Checks sc[i] against item it of view length len: PGD_OK or PGD_EINVAL. */
static int check_scores(const pgd_attn_item *it, const pgd_attn_scores *sc, uint64_t len)
{
    if (!sc || !sc->scores || !sc->rows) return PGD_OK;
    if (sc->rows > it->n_rows || sc->ld < len) return PGD_EINVAL;
    return PGD_OK;
}

int pgd_attn_run_ref_ex(pgd_cache *c, const pgd_attn_params *prm, uint32_t layer,
                        const pgd_attn_item *items, const pgd_attn_scores *scs, uint32_t n)
{
    pgd__attn_geom g;
    pgd__attn_view *views = NULL;
    float *kv = NULL, *qr = NULL, *o = NULL;
    double *sc = NULL, *acc = NULL, *dsc = NULL;
    uint32_t *list = NULL, *heap_page = NULL;
    float *heap_score = NULL;
    uint64_t max_len = 0;
    if (!prm || !pgd__attn_gemma_ok(prm)) return PGD_EINVAL;
    const uint32_t n_head = prm->n_head;
    int rc = pgd__attn_geom_init(&g, c, n_head, prm->select_pages, 1);
    if (rc != PGD_OK) return rc;
    if (layer >= g.n_layers || (n && !items)) return PGD_EINVAL;
    /* A sliding-window layer attends densely inside its window: no Quest selection. */
    const uint32_t window = prm->layer_window ? prm->layer_window[layer] : 0;
    layer = pgd__attn_geom_layer(&g, layer); /* its group (window layers) and index there */
    const uint32_t select_pages = window ? 0 : prm->select_pages;
    const double softcap = prm->softcap;
    const pgd__alloc *al = pgd__cache_alloc(c);

    rc = PGD_ENOMEM;
    views = pgd__calloc(al, n ? n : 1, sizeof *views);
    if (!views) goto done;
    int any_scores = 0;
    for (uint32_t i = 0; i < n; i++) {
        rc = PGD_EINVAL;
        if (scs && scs[i].scores && scs[i].rows > items[i].n_rows) goto done;
        if (items[i].n_rows == 0) continue;
        rc = pgd__attn_view_init(&g, &items[i], &views[i]);
        if (rc == PGD_OK) rc = check_scores(&items[i], scs ? &scs[i] : NULL, views[i].len);
        if (rc != PGD_OK) goto done;
        if (views[i].len > max_len) max_len = views[i].len;
        any_scores |= scs && scs[i].scores && scs[i].rows;
    }
    rc = PGD_ENOMEM;
    const uint32_t hd = g.head_dim, pt = g.page_tokens, G = g.group;
    const uint64_t max_pages = (max_len + pt - 1) / pt;
    kv = pgd__malloc(al, (size_t)pt * hd * sizeof *kv);
    qr = pgd__malloc(al, (size_t)G * hd * sizeof *qr);
    o = pgd__malloc(al, (size_t)hd * sizeof *o);
    sc = pgd__malloc(al, (size_t)G * (max_len ? max_len : 1) * sizeof *sc);
    acc = pgd__malloc(al, (size_t)G * hd * sizeof *acc);
    list = pgd__malloc(al, (size_t)(max_pages ? max_pages : 1) * sizeof *list);
    heap_page = pgd__malloc(al, (size_t)(select_pages ? select_pages : 1) * sizeof *heap_page);
    heap_score = pgd__malloc(al, (size_t)(select_pages ? select_pages : 1) * sizeof *heap_score);
    if (any_scores) dsc = pgd__calloc(al, (size_t)g.n_kv_heads * max_len, sizeof *dsc);
    if (!kv || !qr || !o || !sc || !acc || !list || !heap_page || !heap_score ||
        (any_scores && !dsc))
        goto done;

    const double scale = prm->scale > 0 ? (double)prm->scale : 1.0 / sqrt((double)hd);
    for (uint32_t i = 0; i < n; i++) {
        const pgd_attn_item *it = &items[i];
        const pgd__attn_view *v = &views[i];
        const pgd_attn_scores *si = scs && scs[i].scores && scs[i].rows ? &scs[i] : NULL;
        if (si) memset(dsc, 0, (size_t)g.n_kv_heads * max_len * sizeof *dsc);
        for (uint32_t t = 0; t < it->n_rows; t++) {
            const uint64_t pos = v->len - it->n_rows + t;
            const uint32_t np = (uint32_t)(pos / pt + 1);
            const uint32_t rpage = pgd__attn_ring_page(&g, v, pos);
            for (uint32_t kvh = 0; kvh < g.n_kv_heads; kvh++) {
                const size_t qoff = ((size_t)t * g.n_head + (size_t)kvh * G) * hd;
                memcpy(qr, it->q + qoff, (size_t)G * hd * sizeof *qr);
                for (uint32_t h = 0; g.rotate && h < G; h++)
                    pgd__hadamard(qr + (size_t)h * hd, hd, g.rotate_seed, 0);
                uint32_t nl = np;
                if (select_pages && it->n_rows == 1)
                    nl = pgd__attn_select(&g, v, layer, kvh, qr, select_pages, list, heap_page,
                                          heap_score);
                else {
                    /* A window row's keys start in the page of pos - window + 1: the pages
                     * before weigh exactly 0 (and a window group released them). */
                    const uint32_t p0 =
                        window && pos + 1 > window ? (uint32_t)((pos + 1 - window) / pt) : 0;
                    nl = np - p0;
                    for (uint32_t p = 0; p < nl; p++)
                        list[p] = p0 + p;
                }

                /* Scores of every listed key, page by page: s[h][key] (-inf: a dead slot). */
                uint32_t d0 = 0, d1 = 0;
                const int dead = pgd__attn_dead(&g, v, layer, kvh, &d0, &d1);
                uint64_t nk = 0;
                for (uint32_t li = 0; li < nl; li++) {
                    const pgd__codec *cd;
                    uint32_t rpt, r0, pi = list[li];
                    const uint64_t start = (uint64_t)pi * pt;
                    const uint32_t rows = pos + 1 - start < pt ? (uint32_t)(pos + 1 - start) : pt;
                    const void *reg =
                        pgd__attn_src(&g, v, pi, rpage, layer, PGD__K, kvh, &cd, &rpt, &r0);
                    cd->decode_rows(PGD__K, reg, rpt, hd, r0, rows, kv);
                    for (uint32_t j = 0; j < rows; j++, nk++)
                        for (uint32_t h = 0; h < G; h++) {
                            double d = 0;
                            for (uint32_t x = 0; x < hd; x++)
                                d += (double)qr[(size_t)h * hd + x] * kv[(size_t)j * hd + x];
                            d *= scale;
                            if (softcap > 0) d = softcap * tanh(d / softcap);
                            sc[(size_t)h * max_len + nk] = d;
                        }
                    for (uint32_t j = 0; window && j < rows; j++)
                        if (start + j + window <= pos) /* before the row's window */
                            for (uint32_t h = 0; h < G; h++)
                                sc[(size_t)h * max_len + nk - rows + j] = -INFINITY;
                    for (uint32_t j = 0; dead && j < rows; j++)
                        if (start + j >= d0 && start + j < d1)
                            for (uint32_t h = 0; h < G; h++)
                                sc[(size_t)h * max_len + nk - rows + j] = -INFINITY;
                }
                /* Careful softmax: subtract the maximum, sum in double. */
                for (uint32_t h = 0; h < G; h++) {
                    double *s = sc + (size_t)h * max_len, mx = -INFINITY, sum = 0;
                    for (uint64_t j = 0; j < nk; j++)
                        mx = s[j] > mx ? s[j] : mx;
                    if (mx == -INFINITY) { /* no live key (not for n_live >= 1): weight 0 */
                        for (uint64_t j = 0; j < nk; j++)
                            s[j] = 0;
                        continue;
                    }
                    for (uint64_t j = 0; j < nk; j++) {
                        s[j] = exp(s[j] - mx);
                        sum += s[j];
                    }
                    for (uint64_t j = 0; j < nk; j++)
                        s[j] /= sum;
                }
                /* Scores: the probabilities of the item's last si->rows rows, per slot. */
                if (si && t >= it->n_rows - si->rows) {
                    double *ds = dsc + (size_t)kvh * max_len;
                    nk = 0;
                    for (uint32_t li = 0; li < nl; li++) {
                        const uint64_t start = (uint64_t)list[li] * pt;
                        const uint32_t rows =
                            pos + 1 - start < pt ? (uint32_t)(pos + 1 - start) : pt;
                        for (uint32_t j = 0; j < rows; j++, nk++)
                            for (uint32_t h = 0; h < G; h++)
                                ds[start + j] += sc[(size_t)h * max_len + nk];
                    }
                }
                memset(acc, 0, (size_t)G * hd * sizeof *acc);
                nk = 0;
                for (uint32_t li = 0; li < nl; li++) {
                    const pgd__codec *cd;
                    uint32_t rpt, r0, pi = list[li];
                    const uint64_t start = (uint64_t)pi * pt;
                    const uint32_t rows = pos + 1 - start < pt ? (uint32_t)(pos + 1 - start) : pt;
                    const void *reg =
                        pgd__attn_src(&g, v, pi, rpage, layer, PGD__V, kvh, &cd, &rpt, &r0);
                    cd->decode_rows(PGD__V, reg, rpt, hd, r0, rows, kv);
                    for (uint32_t j = 0; j < rows; j++, nk++)
                        for (uint32_t h = 0; h < G; h++) {
                            double w = sc[(size_t)h * max_len + nk];
                            for (uint32_t x = 0; x < hd; x++)
                                acc[(size_t)h * hd + x] += w * kv[(size_t)j * hd + x];
                        }
                }
                for (uint32_t h = 0; h < G; h++) {
                    for (uint32_t x = 0; x < hd; x++)
                        o[x] = (float)acc[(size_t)h * hd + x];
                    if (g.rotate) pgd__hadamard(o, hd, g.rotate_seed, 1);
                    memcpy(it->out + qoff + (size_t)h * hd, o, hd * sizeof *o);
                }
            }
        }
        for (uint32_t kvh = 0; si && kvh < g.n_kv_heads; kvh++)
            for (uint64_t j = 0; j < v->len; j++)
                si->scores[(size_t)kvh * si->ld + j] += (float)dsc[(size_t)kvh * max_len + j];
    }
    rc = PGD_OK;
done:
    pgd__free(al, views);
    pgd__free(al, kv);
    pgd__free(al, qr);
    pgd__free(al, o);
    pgd__free(al, sc);
    pgd__free(al, acc);
    pgd__free(al, list);
    pgd__free(al, heap_page);
    pgd__free(al, heap_score);
    pgd__free(al, dsc);
    return rc;
}

int pgd_attn_run_ref_scored(pgd_cache *c, uint32_t n_head, uint32_t layer,
                            const pgd_attn_item *items, const pgd_attn_scores *scs, uint32_t n,
                            uint32_t select_pages)
{
    pgd_attn_params p = pgd_attn_default_params();
    p.n_head = n_head;
    p.select_pages = select_pages;
    return pgd_attn_run_ref_ex(c, &p, layer, items, scs, n);
}

int pgd_attn_run_ref(pgd_cache *c, uint32_t n_head, uint32_t layer, const pgd_attn_item *items,
                     uint32_t n, uint32_t select_pages)
{
    return pgd_attn_run_ref_scored(c, n_head, layer, items, NULL, n, select_pages);
}
