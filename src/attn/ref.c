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
 *
 * The rotation is orthonormal, so dot(R q, R k) = dot(q, k) and R^-1 sum w (R v) = sum w v:
 * rotated pools give the same attention as unrotated ones up to rounding.
 */
#include <math.h>
#include <string.h>

#include "attn_int.h"

int pgd_attn_run_ref(pgd_cache *c, uint32_t n_head, uint32_t layer, const pgd_attn_item *items,
                     uint32_t n, uint32_t select_pages)
{
    pgd__attn_geom g;
    pgd__attn_view *views = NULL;
    float *kv = NULL, *qr = NULL, *o = NULL;
    double *sc = NULL, *acc = NULL;
    uint32_t *list = NULL, *heap_page = NULL;
    float *heap_score = NULL;
    uint64_t max_len = 0;
    int rc = pgd__attn_geom_init(&g, c, n_head, select_pages, 1);
    if (rc != PGD_OK) return rc;
    if (layer >= g.n_layers || (n && !items)) return PGD_EINVAL;
    const pgd__alloc *al = pgd__cache_alloc(c);

    rc = PGD_ENOMEM;
    views = pgd__calloc(al, n ? n : 1, sizeof *views);
    if (!views) goto done;
    for (uint32_t i = 0; i < n; i++) {
        if (items[i].n_rows == 0) continue;
        rc = pgd__attn_view_init(&g, &items[i], &views[i]);
        if (rc != PGD_OK) goto done;
        if (views[i].len > max_len) max_len = views[i].len;
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
    if (!kv || !qr || !o || !sc || !acc || !list || !heap_page || !heap_score) goto done;

    const double scale = 1.0 / sqrt((double)hd);
    for (uint32_t i = 0; i < n; i++) {
        const pgd_attn_item *it = &items[i];
        const pgd__attn_view *v = &views[i];
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
                else
                    for (uint32_t p = 0; p < np; p++)
                        list[p] = p;

                /* Scores of every listed key, page by page: s[h][key]. */
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
                            sc[(size_t)h * max_len + nk] = d * scale;
                        }
                }
                /* Careful softmax: subtract the maximum, sum in double. */
                for (uint32_t h = 0; h < G; h++) {
                    double *s = sc + (size_t)h * max_len, mx = s[0], sum = 0;
                    for (uint64_t j = 1; j < nk; j++)
                        mx = s[j] > mx ? s[j] : mx;
                    for (uint64_t j = 0; j < nk; j++) {
                        s[j] = exp(s[j] - mx);
                        sum += s[j];
                    }
                    for (uint64_t j = 0; j < nk; j++)
                        s[j] /= sum;
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
    return rc;
}

/* Placeholder until scoring lands: runs without scores. */
int pgd_attn_run_ref_scored(pgd_cache *c, uint32_t n_head, uint32_t layer,
                            const pgd_attn_item *items, const pgd_attn_scores *sc, uint32_t n,
                            uint32_t select_pages)
{
    (void)sc;
    return pgd_attn_run_ref(c, n_head, layer, items, n, select_pages);
}
