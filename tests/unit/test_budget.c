/* SPDX-License-Identifier: MIT */
/*
 * test_budget.c - token budgets (budget.h): every method's selection against a scalar
 * reference written here (sort-based, per head) on random scores over many shapes; the
 * parameter checks and the method names; the per-sequence state (begin's rows, the score
 * buffers and their growth); and, with a real cache, begin / attention / end cycles.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <pagoda/attn.h>
#include <pagoda/budget.h>
#include <pagoda/cache.h>

#include "budget/budget_int.h"
#include "t.h"

/* ---- the scalar reference ---- */

typedef struct cand {
    float s, r;
    uint32_t i, h;
} cand;

/* Higher score, higher raw score, then older token, then lower head. */
static int cand_cmp(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->s != y->s) return x->s > y->s ? -1 : 1;
    if (x->r != y->r) return x->r > y->r ? -1 : 1;
    if (x->i != y->i) return x->i < y->i ? -1 : 1;
    return (x->h > y->h) - (x->h < y->h);
}

/* Naive max-pool of s[0, n) with a centered kernel, clipped at the ends. */
static void ref_pool(const float *s, uint32_t n, uint32_t kernel, float *out)
{
    int r = (int)kernel / 2;
    for (int j = 0; j < (int)n; j++) {
        float m = -INFINITY;
        for (int i = j - r; i <= j + r; i++)
            if (i >= 0 && i < (int)n && s[i] > m) m = s[i];
        out[j] = m;
    }
}

/* The per-head scores a method ranks: raw, or pooled over [0, n - window). */
static void ref_rank_scores(const pgd_budget_params *p, const float *s, uint32_t n, float *out)
{
    int pooled = p->method == PGD_BUDGET_SNAPKV || p->method == PGD_BUDGET_PYRAMIDKV ||
                 p->method == PGD_BUDGET_ADAKV;
    if (pooled)
        ref_pool(s, n - p->window, p->pool_kernel, out);
    else
        memcpy(out, s, n * sizeof *out);
}

/* One layer of per-head token counts nh[h] and dense scores sc[h][0..nh[h]): marks kept
 * tokens in kept[h][j]. */
static void ref_select_heads(const pgd_budget_params *p, uint32_t B, uint32_t H, const uint32_t *nh,
                             const float *const *sc, unsigned char **kept)
{
    const uint32_t S = p->sinks, W = p->window;
    uint32_t nmax = 1;
    for (uint32_t h = 0; h < H; h++) {
        memset(kept[h], 0, nh[h]);
        if (nh[h] > nmax) nmax = nh[h];
    }
    float *rs = malloc((nmax + 1) * sizeof *rs);
    cand *cs = malloc(((size_t)H * nmax + 1) * sizeof *cs);
    if (p->method == PGD_BUDGET_ADAKV) {
        uint32_t cap = (uint32_t)floor((double)p->adakv_cap * B);
        if (cap < B) cap = B;
        uint32_t fl = (uint32_t)floor((double)p->adakv_floor * B);
        if (fl > B - S - W) fl = B - S - W;
        uint64_t left = (uint64_t)B * H;
        uint32_t *cnt = calloc(H, sizeof *cnt);
        size_t nc = 0;
        for (uint32_t h = 0; h < H; h++) {
            const uint32_t n = nh[h];
            if (n <= S + W) {
                memset(kept[h], 1, n);
                left -= n;
                continue;
            }
            ref_rank_scores(p, sc[h], n, rs);
            size_t c0 = nc;
            for (uint32_t j = S; j < n - W; j++)
                cs[nc++] = (cand){rs[j], sc[h][j], j, h};
            qsort(cs + c0, nc - c0, sizeof *cs, cand_cmp);
            uint32_t base = fl < nc - c0 ? fl : (uint32_t)(nc - c0);
            for (uint32_t j = 0; j < base; j++)
                kept[h][cs[c0 + j].i] = 1;
            for (uint32_t j = 0; j < S; j++)
                kept[h][j] = 1;
            for (uint32_t j = n - W; j < n; j++)
                kept[h][j] = 1;
            cnt[h] = S + W + base;
            left -= cnt[h];
            memmove(cs + c0, cs + c0 + base, (nc - c0 - base) * sizeof *cs);
            nc -= base;
        }
        /* Greedy over the rest, best first, skipping full heads. */
        qsort(cs, nc, sizeof *cs, cand_cmp);
        for (size_t j = 0; j < nc && left > 0; j++) {
            if (cnt[cs[j].h] >= cap) continue;
            kept[cs[j].h][cs[j].i] = 1;
            cnt[cs[j].h]++;
            left--;
        }
        free(cnt);
    } else {
        for (uint32_t h = 0; h < H; h++) {
            const uint32_t n = nh[h];
            unsigned char *k = kept[h];
            if (n <= B) {
                memset(k, 1, n);
                continue;
            }
            if (p->method == PGD_BUDGET_STREAMING) {
                for (uint32_t j = 0; j < S; j++)
                    k[j] = 1;
                for (uint32_t j = n - (B - S); j < n; j++)
                    k[j] = 1;
                continue;
            }
            ref_rank_scores(p, sc[h], n, rs);
            size_t nc = 0;
            for (uint32_t j = S; j < n - W; j++)
                cs[nc++] = (cand){rs[j], sc[h][j], j, h};
            qsort(cs, nc, sizeof *cs, cand_cmp);
            for (uint32_t j = 0; j < B - S - W; j++)
                k[cs[j].i] = 1;
            for (uint32_t j = 0; j < S; j++)
                k[j] = 1;
            for (uint32_t j = n - W; j < n; j++)
                k[j] = 1;
        }
    }
    free(rs);
    free(cs);
}

/* One layer, every head of n tokens: marks kept tokens in kept[h * n + j]. */
static void ref_select(const pgd_budget_params *p, uint32_t layer, uint32_t n_layers, uint32_t H,
                       uint32_t n, const float *scores, size_t ld, unsigned char *kept)
{
    const float *sc[16];
    unsigned char *k[16];
    uint32_t nh[16];
    for (uint32_t h = 0; h < H; h++) {
        sc[h] = scores + h * ld;
        k[h] = kept + (size_t)h * n;
        nh[h] = n;
    }
    ref_select_heads(p, pgd_budget_layer_budget(p, layer, n_layers), H, nh, sc, k);
}

/* Random scores; coarse (ties) when coarse. */
static float rand_score(uint64_t *rng, int coarse)
{
    double u = (double)(t_rand(rng) >> 11) / 9007199254740992.0;
    return coarse ? (float)floor(u * 6.0) / 6.0f : (float)u;
}

/* Compares pgd_budget_select with the reference on one shape. */
static int check_shape(const pgd_budget_params *p, uint32_t n_layers, uint32_t H, uint32_t n,
                       int coarse, uint64_t *rng)
{
    const size_t ld = n + 3;
    float *sc = malloc(H * ld * sizeof *sc + 1);
    unsigned char *kept = malloc((size_t)H * n + 1);
    for (size_t i = 0; i < H * ld; i++)
        sc[i] = rand_score(rng, coarse);
    int rc = 0;
    for (uint32_t l = 0; l < n_layers && !rc; l++) {
        uint32_t B = pgd_budget_layer_budget(p, l, n_layers);
        uint32_t mk = p->method == PGD_BUDGET_ADAKV ? (uint32_t)(p->adakv_cap * B) + 1 : B;
        uint32_t *keep = malloc((size_t)H * mk * sizeof *keep), *nk = malloc(H * sizeof *nk);
        int most = pgd_budget_select(p, l, n_layers, H, n, sc, ld, keep, mk, nk);
        ref_select(p, l, n_layers, H, n, sc, ld, kept);
        int want_most = 0;
        uint64_t total = 0;
        for (uint32_t h = 0; h < H && !rc; h++) {
            uint32_t cnt = 0;
            for (uint32_t j = 0; j < n; j++)
                cnt += kept[(size_t)h * n + j];
            if (most < 0 || nk[h] != cnt) {
                fprintf(stderr, "%s layer %u head %u n %u: kept %u, reference %u (rc %d)\n",
                        pgd_budget_method_name(p->method), l, h, n, most < 0 ? 0 : nk[h], cnt,
                        most);
                rc = -1;
                break;
            }
            for (uint32_t j = 0; j < cnt; j++) {
                uint32_t t = keep[(size_t)h * mk + j];
                if (t >= n || !kept[(size_t)h * n + t] ||
                    (j && t <= keep[(size_t)h * mk + j - 1])) {
                    fprintf(stderr, "%s layer %u head %u n %u: token %u at %u differs\n",
                            pgd_budget_method_name(p->method), l, h, n, t, j);
                    rc = -1;
                    break;
                }
            }
            if ((int)cnt > want_most) want_most = (int)cnt;
            total += cnt;
            if (p->method != PGD_BUDGET_ADAKV && cnt != (n < B ? n : B)) rc = -1;
        }
        if (!rc && most != want_most) rc = -1;
        if (!rc && p->method == PGD_BUDGET_ADAKV && n > B && total != (uint64_t)B * H) {
            fprintf(stderr, "adakv layer %u n %u: total %llu != %u x %u\n", l, n,
                    (unsigned long long)total, B, H);
            rc = -1;
        }
        free(keep);
        free(nk);
    }
    free(sc);
    free(kept);
    return rc;
}

static int test_select_matches_reference(void)
{
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    static const uint32_t heads[] = {1, 2, 4, 8};
    static const uint32_t kernels[] = {1, 3, 5, 7};
    int shapes = 0;
    for (int m = PGD_BUDGET_STREAMING; m < PGD_BUDGET_COUNT; m++) {
        for (int iter = 0; iter < 60; iter++) {
            uint32_t budget = 2 + (uint32_t)(t_rand(&rng) % 60);
            pgd_budget_params p = pgd_budget_default_params((pgd_budget_method)m, budget);
            /* Vary sinks and window within the rule (sinks + window <= budget). */
            if (iter % 3 == 1) {
                p.sinks = (uint32_t)(t_rand(&rng) % (budget / 2 + 1));
                if (m != PGD_BUDGET_STREAMING)
                    p.window = (uint32_t)(t_rand(&rng) % (budget - p.sinks + 1));
                else
                    p.window = budget - p.sinks;
            }
            if (m >= PGD_BUDGET_SNAPKV) {
                p.pool_kernel = kernels[iter % 4];
                if (m != PGD_BUDGET_ADAKV && p.sinks + p.window >= budget) p.window = 0;
            }
            if (m == PGD_BUDGET_PYRAMIDKV) {
                p.pyramid_min = 0.2f + 0.8f * (float)(iter % 5) / 4.0f;
                p.sinks = p.sinks > 2 ? 2 : p.sinks;
                p.window = p.window > budget / 5 ? budget / 5 : p.window;
            }
            if (m == PGD_BUDGET_ADAKV) {
                static const float floors[] = {0.0f, 0.2f, 0.5f, 1.0f};
                static const float caps[] = {1.0f, 2.0f, 3.5f, 1.5f};
                p.adakv_floor = floors[iter % 4];
                p.adakv_cap = caps[(iter / 4) % 4];
            }
            char why[160];
            uint32_t n_layers = m == PGD_BUDGET_PYRAMIDKV ? 1 + iter % 6 : 1;
            if (pgd_budget_params_check(&p, n_layers, why, sizeof why) != PGD_OK)
                T_FAIL("%s budget %u sinks %u window %u: %s", pgd_budget_method_name(p.method),
                       budget, p.sinks, p.window, why);
            uint32_t ns[] = {1,          budget - 1, budget,
                             budget + 1, 3 * budget, 1 + (uint32_t)(t_rand(&rng) % 400)};
            for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
                if (!ns[i]) continue;
                T_OK(check_shape(&p, n_layers, heads[iter % 4], ns[i], iter % 2, &rng));
                shapes++;
            }
        }
    }
    T_ASSERT(shapes > 1000);
    return 0;
}

/* The selection on a large shape runs in O(n log k): a smoke check that it finishes and
 * that the h2o heavy hitters are the planted ones. */
static int test_select_planted(void)
{
    const uint32_t n = 20000, H = 2;
    pgd_budget_params p = pgd_budget_default_params(PGD_BUDGET_H2O, 256);
    float *sc = calloc((size_t)H * n, sizeof *sc);
    uint32_t *keep = malloc(H * 256 * sizeof *keep), nk[2];
    for (uint32_t h = 0; h < H; h++)
        for (uint32_t j = 0; j < 128; j++)
            sc[h * n + 7 + j * 97 + h] = 1.0f;
    T_EQ(pgd_budget_select(&p, 0, 1, H, n, sc, n, keep, 256, nk), 256);
    for (uint32_t h = 0; h < H; h++) {
        T_EQ(nk[h], 256);
        for (uint32_t j = 0; j < 128; j++)
            T_EQ(keep[h * 256 + j], 7 + j * 97 + h);
        T_EQ(keep[h * 256 + 128], n - 128);
    }
    free(sc);
    free(keep);
    return 0;
}

static int test_select_rejects(void)
{
    pgd_budget_params p = pgd_budget_default_params(PGD_BUDGET_SNAPKV, 64);
    float sc[200] = {0};
    uint32_t keep[2 * 64], nk[2];
    T_EQ(pgd_budget_select(&p, 0, 1, 2, 100, NULL, 100, keep, 64, nk), PGD_EINVAL);
    T_EQ(pgd_budget_select(&p, 0, 1, 2, 100, sc, 99, keep, 64, nk), PGD_EINVAL);
    T_EQ(pgd_budget_select(&p, 0, 1, 2, 100, sc, 100, keep, 63, nk), PGD_EINVAL);
    T_EQ(pgd_budget_select(&p, 1, 1, 2, 100, sc, 100, keep, 64, nk), PGD_EINVAL);
    T_EQ(pgd_budget_select(&p, 0, 1, 0, 100, sc, 100, keep, 64, nk), PGD_EINVAL);
    T_EQ(pgd_budget_select(&p, 0, 1, 2, 100, sc, 100, keep, 64, nk), 64);
    /* A shape shorter than the budget needs only n_keys of room. */
    T_EQ(pgd_budget_select(&p, 0, 1, 2, 10, sc, 100, keep, 10, nk), 10);
    p = pgd_budget_default_params(PGD_BUDGET_STREAMING, 64);
    T_EQ(pgd_budget_select(&p, 0, 1, 2, 100, NULL, 0, keep, 64, nk), 64);
    T_EQ(keep[3], 3);
    T_EQ(keep[4], 40);
    p.method = PGD_BUDGET_NONE;
    T_EQ(pgd_budget_select(&p, 0, 1, 2, 100, sc, 100, keep, 64, nk), PGD_EINVAL);
    return 0;
}

/* A compacted sequence's dead slots [n_live[h], mask_len) are never kept: the selection on
 * the live tokens alone (numbered in slot order) is the reference's on those tokens. */
static int test_select_dead_slots(void)
{
    uint64_t rng = 77;
    pgd__alloc al;
    pgd__alloc_init(&al, NULL);
    for (int m = PGD_BUDGET_STREAMING; m < PGD_BUDGET_COUNT; m++)
        for (int iter = 0; iter < 80; iter++) {
            uint32_t budget = 2 + (uint32_t)(t_rand(&rng) % 40);
            pgd_budget_params p = pgd_budget_default_params((pgd_budget_method)m, budget);
            if (m == PGD_BUDGET_ADAKV) p.adakv_floor = (float)(iter % 3) * 0.3f;
            const uint32_t H = 1 + iter % 6, n = 1 + (uint32_t)(t_rand(&rng) % 200);
            const uint32_t mask_len = (uint32_t)(t_rand(&rng) % (n + 1)), ld = n + 1;
            uint32_t n_live[8], nh[8];
            float *sc = malloc((size_t)H * ld * sizeof *sc),
                  *dense = malloc(H * ld * sizeof *dense);
            unsigned char *kept = malloc((size_t)H * ld), *kh[8];
            const float *dh[8];
            uint32_t *slots = malloc((size_t)H * ld * sizeof *slots);
            for (uint32_t h = 0; h < H; h++) {
                n_live[h] = mask_len ? 1 + (uint32_t)(t_rand(&rng) % mask_len) : 0;
                nh[h] = 0;
                for (uint32_t j = 0; j < n; j++) {
                    int dead = mask_len && j >= n_live[h] && j < mask_len;
                    sc[h * ld + j] = dead ? 100.0f : rand_score(&rng, iter % 2);
                    if (!dead) {
                        slots[h * ld + nh[h]] = j;
                        dense[h * ld + nh[h]++] = sc[h * ld + j];
                    }
                }
                dh[h] = dense + h * ld;
                kh[h] = kept + h * ld;
            }
            uint32_t B = budget, mk = pgd__budget_head_max(&p, B);
            uint32_t *keep = malloc((size_t)H * mk * sizeof *keep), nk[8];
            pgd__budget_scratch scr = {.al = &al};
            pgd__budget_sel sel = {.p = &p,
                                   .budget = B,
                                   .n_kv_heads = H,
                                   .n_keys = n,
                                   .scores = sc,
                                   .ld = ld,
                                   .mask_len = mask_len,
                                   .n_live = mask_len ? n_live : NULL,
                                   .keep = keep,
                                   .max_keep = mk,
                                   .n_keep = nk,
                                   .scr = &scr};
            T_OK(pgd__budget_ops_get((pgd_budget_method)m)->select(&sel));
            pgd__budget_scratch_deinit(&scr);
            ref_select_heads(&p, B, H, nh, dh, kh);
            for (uint32_t h = 0; h < H; h++) {
                uint32_t cnt = 0, at = 0;
                for (uint32_t j = 0; j < nh[h]; j++)
                    if (kh[h][j]) {
                        if (at >= nk[h] || keep[h * mk + at] != slots[h * ld + j])
                            T_FAIL("%s H %u n %u mask %u head %u: kept slot %u differs",
                                   pgd_budget_method_name(p.method), H, n, mask_len, h, j);
                        at++;
                        cnt++;
                    }
                T_EQ(nk[h], cnt);
            }
            free(sc);
            free(dense);
            free(kept);
            free(slots);
            free(keep);
        }
    return 0;
}

/* ---- names and checks ---- */

static int test_names_round_trip(void)
{
    for (int m = 0; m < PGD_BUDGET_COUNT; m++) {
        const char *name = pgd_budget_method_name((pgd_budget_method)m);
        pgd_budget_method back;
        T_ASSERT(name != NULL);
        T_OK(pgd_budget_method_parse(name, &back));
        T_EQ(back, m);
    }
    pgd_budget_method back;
    T_ASSERT(pgd_budget_method_name(PGD_BUDGET_COUNT) == NULL);
    T_EQ(pgd_budget_method_parse("SnapKV", &back), PGD_EINVAL);
    T_EQ(pgd_budget_method_parse("", &back), PGD_EINVAL);
    T_EQ(pgd_budget_method_parse(NULL, &back), PGD_EINVAL);
    return 0;
}

static int check_fails(const pgd_budget_params *p, uint32_t n_layers, const char *field)
{
    char why[200] = "";
    T_EQ(pgd_budget_params_check(p, n_layers, why, sizeof why), PGD_EINVAL);
    if (!strstr(why, field)) T_FAIL("\"%s\" does not name %s", why, field);
    return 0;
}

static int test_params_check(void)
{
    /* Every method's defaults pass, at small and usual budgets. */
    static const uint32_t budgets[] = {1, 2, 5, 32, 33, 64, 4096};
    for (int m = 0; m < PGD_BUDGET_COUNT; m++)
        for (size_t i = 0; i < sizeof budgets / sizeof budgets[0]; i++) {
            pgd_budget_params p = pgd_budget_default_params((pgd_budget_method)m, budgets[i]);
            char why[200] = "";
            if (pgd_budget_params_check(&p, 8, why, sizeof why) != PGD_OK)
                T_FAIL("%s %u: %s", pgd_budget_method_name(p.method), budgets[i], why);
        }
    pgd_budget_params p = pgd_budget_default_params(PGD_BUDGET_H2O, 0);
    T_OK(check_fails(&p, 4, "kv_budget"));
    p = pgd_budget_default_params(PGD_BUDGET_H2O, 64);
    p.window = 61;
    p.sinks = 4;
    T_OK(check_fails(&p, 4, "kv_budget"));
    p = pgd_budget_default_params(PGD_BUDGET_SNAPKV, 64);
    p.pool_kernel = 4;
    T_OK(check_fails(&p, 4, "pool_kernel"));
    p.pool_kernel = 0;
    T_OK(check_fails(&p, 4, "pool_kernel"));
    p = pgd_budget_default_params(PGD_BUDGET_SNAPKV, 64);
    p.obs_window = 0;
    T_OK(check_fails(&p, 4, "obs_window"));
    p = pgd_budget_default_params(PGD_BUDGET_PYRAMIDKV, 64);
    p.pyramid_min = 0.0f;
    T_OK(check_fails(&p, 4, "pyramid_min"));
    p.pyramid_min = 1.5f;
    T_OK(check_fails(&p, 4, "pyramid_min"));
    p = pgd_budget_default_params(PGD_BUDGET_ADAKV, 64);
    p.adakv_floor = -0.1f;
    T_OK(check_fails(&p, 4, "adakv_floor"));
    p = pgd_budget_default_params(PGD_BUDGET_ADAKV, 64);
    p.adakv_cap = 0.5f;
    T_OK(check_fails(&p, 4, "adakv_cap"));
    p = pgd_budget_default_params(PGD_BUDGET_TOVA, 64);
    p.online = 2;
    T_OK(check_fails(&p, 4, "online"));
    p = pgd_budget_default_params(PGD_BUDGET_TOVA, 64);
    p.method = (pgd_budget_method)99;
    T_OK(check_fails(&p, 4, "kv_budget_method"));
    return 0;
}

static int test_layer_budget(void)
{
    pgd_budget_params p = pgd_budget_default_params(PGD_BUDGET_PYRAMIDKV, 100);
    T_EQ(pgd_budget_layer_budget(&p, 0, 5), 150);
    T_EQ(pgd_budget_layer_budget(&p, 2, 5), 100);
    T_EQ(pgd_budget_layer_budget(&p, 4, 5), 50);
    p = pgd_budget_default_params(PGD_BUDGET_SNAPKV, 100);
    T_EQ(pgd_budget_layer_budget(&p, 4, 5), 100);
    return 0;
}

/* ---- the per-sequence state ---- */

static pgd_cache *make_cache(uint32_t n_layers, uint32_t n_kv, uint32_t hd, uint32_t n_pages)
{
    pgd_cache_params cp = pgd_cache_default_params();
    cp.pool.n_layers = n_layers;
    cp.pool.n_kv_heads = n_kv;
    cp.pool.head_dim = hd;
    cp.pool.page_tokens = 16;
    cp.pool.kv_type = PGD_KV_F16;
    cp.pool.capacity_pages = n_pages;
    pgd_cache *c = NULL;
    return pgd_cache_create(&cp, &c) == PGD_OK ? c : NULL;
}

static int test_state_rows(void)
{
    pgd_cache *c = make_cache(2, 2, 8, 64);
    T_ASSERT(c != NULL);
    pgd_seq *s;
    T_OK(pgd_seq_create(c, NULL, 0, &s));
    pgd_budget *b;
    pgd_budget_params p = pgd_budget_default_params(PGD_BUDGET_SNAPKV, 64);
    p.budget = 0;
    T_EQ(pgd_budget_create(c, &p, &b), PGD_EINVAL);
    T_ASSERT(b == NULL);
    /* snapkv: only the prompt's last obs_window rows score. */
    p = pgd_budget_default_params(PGD_BUDGET_SNAPKV, 64);
    T_OK(pgd_budget_create(c, &p, &b));
    T_EQ(pgd_budget_get_params(b)->method, PGD_BUDGET_SNAPKV);
    T_EQ(pgd_budget_begin(b, s, 40, 100), 0);
    T_ASSERT(pgd_budget_score_ld(b) >= 40);
    T_OK(pgd_seq_grow(c, s, 40));
    T_EQ(pgd_budget_end(b, s), 0);
    T_EQ(pgd_budget_begin(b, s, 40, 60), 12);
    T_ASSERT(pgd_budget_score_ld(b) >= 80);
    T_OK(pgd_seq_grow(c, s, 40));
    T_EQ(pgd_budget_end(b, s), 0);
    T_EQ(pgd_budget_begin(b, s, 1, 0), 0);
    T_ASSERT(pgd_budget_scores(b, 1) == pgd_budget_scores(b, 0) + 2 * pgd_budget_score_ld(b));
    T_ASSERT(pgd_budget_scores(b, 2) == NULL);
    pgd_budget_destroy(b);
    /* h2o: every row; tova: the last; streaming: none, and no buffers. */
    p = pgd_budget_default_params(PGD_BUDGET_H2O, 64);
    T_OK(pgd_budget_create(c, &p, &b));
    T_EQ(pgd_budget_begin(b, s, 7, 7), 7);
    T_EQ(pgd_budget_begin(b, s, 1, 0), 1);
    pgd_budget_destroy(b);
    p = pgd_budget_default_params(PGD_BUDGET_TOVA, 64);
    T_OK(pgd_budget_create(c, &p, &b));
    T_EQ(pgd_budget_begin(b, s, 7, 9), 1);
    T_EQ(pgd_budget_begin(b, s, 1, 0), 1);
    pgd_budget_destroy(b);
    p = pgd_budget_default_params(PGD_BUDGET_STREAMING, 80);
    T_OK(pgd_budget_create(c, &p, &b));
    T_EQ(pgd_budget_begin(b, s, 7, 9), 0);
    T_ASSERT(pgd_budget_scores(b, 0) == NULL);
    /* No longer than the budget (80 slots): nothing to do. */
    T_EQ(pgd_budget_apply(b, s), 0);
    pgd_budget_destroy(b);
    pgd_budget_destroy(NULL);
    pgd_seq_destroy(c, s);
    pgd_cache_destroy(c);
    return 0;
}

/* The buffers grow geometrically and keep their data; tova zeroes at begin, h2o does not. */
static int test_state_growth(void)
{
    pgd_cache *c = make_cache(3, 2, 8, 256);
    T_ASSERT(c != NULL);
    pgd_seq *s;
    T_OK(pgd_seq_create(c, NULL, 0, &s));
    pgd_budget *b;
    pgd_budget_params p = pgd_budget_default_params(PGD_BUDGET_H2O, 4000);
    T_OK(pgd_budget_create(c, &p, &b));
    uint32_t len = 0, grows = 0;
    size_t ld0 = 0;
    for (int step = 0; step < 40; step++) {
        uint32_t n = 1 + (uint32_t)(step * 7 % 50);
        T_EQ(pgd_budget_begin(b, s, n, n), n);
        size_t ld = pgd_budget_score_ld(b);
        T_ASSERT(ld >= (size_t)len + n);
        grows += ld != ld0;
        ld0 = ld;
        /* Everything written so far is still there; past the length is 0. */
        for (uint32_t l = 0; l < 3; l++)
            for (uint32_t h = 0; h < 2; h++) {
                float *sc = pgd_budget_scores(b, l) + h * ld;
                for (uint32_t j = 0; j < len + n; j++)
                    T_ASSERT(sc[j] == (j < len ? (float)(j * 6 + l * 2 + h) : 0.0f));
                for (uint32_t j = len; j < len + n; j++)
                    sc[j] = (float)(j * 6 + l * 2 + h);
            }
        T_OK(pgd_seq_grow(c, s, n));
        len += n;
        T_EQ(pgd_budget_end(b, s), 0);
    }
    T_ASSERT(grows <= 8);
    pgd_budget_reset(b);
    T_EQ(pgd_budget_begin(b, s, 1, 0), 1);
    T_ASSERT(pgd_budget_scores(b, 2)[len - 1] == 0.0f);
    pgd_budget_destroy(b);

    p = pgd_budget_default_params(PGD_BUDGET_TOVA, 4000);
    T_OK(pgd_budget_create(c, &p, &b));
    T_EQ(pgd_budget_begin(b, s, 1, 0), 1);
    pgd_budget_scores(b, 1)[5] = 1.0f;
    T_EQ(pgd_budget_begin(b, s, 1, 0), 1);
    T_ASSERT(pgd_budget_scores(b, 1)[5] == 0.0f);
    pgd_budget_stats st;
    pgd_budget_get_stats(b, &st);
    T_EQ(st.compactions, 0);
    pgd_budget_destroy(b);
    pgd_seq_destroy(c, s);
    pgd_cache_destroy(c);
    return 0;
}

/* ---- with a real cache: begin / attention / end, and the needle ---- */

enum { NL = 2, NKV = 2, NH = 4, HD = 32, PT = 16 };

/* A context of n tokens: K/V [NL][n][NKV][HD] in multiples of 1/256 (exact in f16), one
 * planted key u (entries +-1) at position `needle` in every layer and head with a value of
 * +-0.75, and queries [n][NH][HD]: small random ones, the last q_strong rows 2u. */
typedef struct ctx {
    uint32_t n, needle, q_strong;
    uint64_t seed; /* also the prefix cache's salt of its sequences */
    float *k, *v, *q, u[HD];
} ctx;

static float q256(uint64_t *rng)
{
    return (float)((int)(t_rand(rng) % 513) - 256) / 256.0f;
}

static void ctx_make(ctx *x, uint32_t n, uint32_t needle, uint32_t q_strong, uint64_t seed)
{
    uint64_t rng = seed | 1;
    const size_t row = (size_t)NKV * HD;
    x->n = n;
    x->seed = seed;
    x->needle = needle;
    x->q_strong = q_strong;
    x->k = malloc((size_t)NL * n * row * sizeof *x->k);
    x->v = malloc((size_t)NL * n * row * sizeof *x->v);
    x->q = malloc((size_t)n * NH * HD * sizeof *x->q);
    for (uint32_t d = 0; d < HD; d++)
        x->u[d] = t_rand(&rng) & 1 ? 1.0f : -1.0f;
    for (size_t i = 0; i < (size_t)NL * n * row; i++) {
        x->k[i] = q256(&rng);
        x->v[i] = q256(&rng);
    }
    for (uint32_t l = 0; l < NL; l++)
        for (uint32_t h = 0; h < NKV; h++)
            for (uint32_t d = 0; d < HD; d++) {
                size_t at = ((size_t)l * n + needle) * row + h * HD + d;
                x->k[at] = x->u[d];
                x->v[at] = t_rand(&rng) & 1 ? 0.75f : -0.75f;
            }
    for (uint32_t r = 0; r < n; r++)
        for (uint32_t i = 0; i < NH * HD; i++)
            x->q[(size_t)r * NH * HD + i] =
                r >= n - q_strong ? 2.0f * x->u[i % HD] : 0.5f * q256(&rng);
}

static void ctx_free(ctx *x)
{
    free(x->k);
    free(x->v);
    free(x->q);
}

static const float *ctx_k(const ctx *x, uint32_t l, uint32_t t, uint32_t h)
{
    return x->k + (((size_t)l * x->n + t) * NKV + h) * HD;
}

static const float *ctx_v(const ctx *x, uint32_t l, uint32_t t, uint32_t h)
{
    return x->v + (((size_t)l * x->n + t) * NKV + h) * HD;
}

/* Scalar attention of query q [NH][HD] over the tokens keep[g][0..nk[g]) of each KV head g
 * of layer l: out [NH][HD]. */
static void ref_attend(const ctx *x, uint32_t l, const float *q, const uint32_t *keep, uint32_t kld,
                       const uint32_t *nk, float *out)
{
    const double scale = 1.0 / sqrt((double)HD);
    for (uint32_t qh = 0; qh < NH; qh++) {
        const uint32_t g = qh / (NH / NKV);
        double mx = -INFINITY, sum = 0, acc[HD] = {0};
        double *lg = malloc(nk[g] * sizeof *lg);
        for (uint32_t j = 0; j < nk[g]; j++) {
            const float *kk = ctx_k(x, l, keep[g * kld + j], g);
            double d = 0;
            for (uint32_t e = 0; e < HD; e++)
                d += (double)q[qh * HD + e] * kk[e];
            lg[j] = d * scale;
            if (lg[j] > mx) mx = lg[j];
        }
        for (uint32_t j = 0; j < nk[g]; j++) {
            double w = exp(lg[j] - mx);
            const float *vv = ctx_v(x, l, keep[g * kld + j], g);
            sum += w;
            for (uint32_t e = 0; e < HD; e++)
                acc[e] += w * vv[e];
        }
        for (uint32_t e = 0; e < HD; e++)
            out[qh * HD + e] = (float)(acc[e] / sum);
        free(lg);
    }
}

static double nmse(const float *a, const float *b, size_t n)
{
    double e = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r += (double)b[i] * b[i];
    }
    return e / (r > 0 ? r : 1e-30);
}

/* Writes tokens [t0, t0 + n) of the context into slots [pos0, ..) of s, every layer. */
static int ctx_write(pgd_cache *c, pgd_seq *s, const ctx *x, uint32_t t0, uint32_t n, uint64_t pos0)
{
    for (uint32_t l = 0; l < NL; l++) {
        int rc = pgd_seq_write_kv(c, s, pos0, n, l, ctx_k(x, l, t0, 0), ctx_v(x, l, t0, 0));
        if (rc != PGD_OK) return rc;
    }
    return PGD_OK;
}

typedef struct needle_result {
    int kept;          /* the needle in every (layer, head)'s keep list */
    int compacted;     /* the compaction ran (not the placeholder) */
    uint32_t max_keep; /* the largest keep */
} needle_result;

/* Prefills the context through a budget (chunks: online methods one step, the snapkv family
 * several that split the observation window), checks the keep lists, and with compaction
 * the pages, the outputs over the kept set and some decode steps. */
static int run_needle(pgd_cache *c, pgd_attn *a, const ctx *x, const pgd_budget_params *p,
                      needle_result *res)
{
    const uint32_t n = x->n;
    pgd_seq *s;
    pgd_budget *b;
    memset(res, 0, sizeof *res);
    T_OK(pgd_seq_create(c, NULL, 0, &s));
    T_OK(pgd_budget_create(c, p, &b));
    uint32_t chunks[4] = {n, 0, 0, 0};
    int family = p->method >= PGD_BUDGET_SNAPKV;
    if (family) {
        chunks[0] = n / 4;
        chunks[1] = n / 2;
        chunks[2] = n - n / 4 - n / 2 - 12;
        chunks[3] = 12;
    }
    float *out = malloc((size_t)n * NH * HD * sizeof *out);
    float *snap = NULL;
    size_t snap_ld = 0;
    int64_t dropped = 0;
    uint32_t done = 0;
    for (int ci = 0; ci < 4 && chunks[ci]; ci++) {
        const uint32_t nr = chunks[ci];
        int rows = pgd_budget_begin(b, s, nr, n - done);
        T_OK(rows);
        T_EQ(pgd_seq_length(c, s), done);
        T_OK(pgd_seq_grow(c, s, nr));
        T_OK(ctx_write(c, s, x, done, nr, done));
        for (uint32_t l = 0; l < NL; l++) {
            pgd_attn_item it = {s, nr, x->q + (size_t)done * NH * HD, out};
            pgd_attn_scores sc = {pgd_budget_scores(b, l), (uint32_t)rows, pgd_budget_score_ld(b)};
            T_OK(pgd_attn_run_scored(a, l, &it, &sc, 1));
        }
        done += nr;
        if (done == n) { /* the scores the last end selects by */
            snap_ld = pgd_budget_score_ld(b);
            snap = calloc((size_t)NL * NKV * snap_ld + 1, sizeof *snap);
            for (uint32_t l = 0; l < NL && p->method != PGD_BUDGET_STREAMING; l++)
                memcpy(snap + (size_t)l * NKV * snap_ld, pgd_budget_scores(b, l),
                       (size_t)NKV * snap_ld * sizeof *snap);
        }
        dropped = pgd_budget_end(b, s);
        T_OK(dropped);
    }
    /* The keep lists the prompt's end selected. */
    const uint32_t kld = pgd__budget_head_max(p, pgd_budget_layer_budget(p, 0, NL)) + n;
    uint32_t *keep = malloc((size_t)NL * NKV * kld * sizeof *keep), nk[NL * NKV];
    res->kept = 1;
    for (uint32_t l = 0; l < NL; l++) {
        int most = pgd_budget_select(p, l, NL, NKV, n, snap + (size_t)l * NKV * snap_ld, snap_ld,
                                     keep + (size_t)l * NKV * kld, kld, nk + l * NKV);
        T_OK(most);
        if ((uint32_t)most > res->max_keep) res->max_keep = (uint32_t)most;
        for (uint32_t h = 0; h < NKV; h++) {
            int found = 0;
            for (uint32_t j = 0; j < nk[l * NKV + h]; j++)
                found |= keep[((size_t)l * NKV + h) * kld + j] == x->needle;
            res->kept &= found;
        }
    }
    T_EQ(done, n);
    {
        res->compacted = 1;
        pgd_budget_stats st;
        pgd_budget_get_stats(b, &st);
        T_EQ(pgd_seq_length(c, s), res->max_keep);
        T_EQ(dropped, n - res->max_keep);
        T_EQ(st.max_keep, res->max_keep);
        T_EQ(st.compactions, 1);
        const uint32_t *ids;
        T_EQ(pgd_seq_pages(c, s, &ids), (res->max_keep + PT - 1) / PT);
        T_EQ(pgd_seq_n_dropped(c, s), n - res->max_keep);
        /* Attention over the compacted sequence = attention over the kept rows. */
        float o[NH * HD], r[NH * HD];
        const float *qd = x->q + (size_t)(n - 1) * NH * HD;
        for (uint32_t l = 0; l < NL; l++) {
            pgd_attn_item it = {s, 1, qd, o};
            T_OK(pgd_attn_run(a, l, &it, 1));
            ref_attend(x, l, qd, keep + (size_t)l * NKV * kld, kld, nk + l * NKV, r);
            if (nmse(o, r, NH * HD) > 1e-6)
                T_FAIL("%s layer %u: nmse %g over the kept set", pgd_budget_method_name(p->method),
                       l, nmse(o, r, NH * HD));
        }
        /* A fresh sequence of the kept rows (uniform methods: every head keeps as many). */
        if (p->method <= PGD_BUDGET_SNAPKV) {
            pgd_seq *f;
            const uint32_t m = res->max_keep;
            float *kf = malloc((size_t)m * NKV * HD * sizeof *kf);
            float *vf = malloc((size_t)m * NKV * HD * sizeof *vf);
            T_OK(pgd_seq_create(c, NULL, 0, &f));
            T_OK(pgd_seq_grow(c, f, m));
            for (uint32_t l = 0; l < NL; l++) {
                for (uint32_t h = 0; h < NKV; h++) {
                    T_EQ(nk[l * NKV + h], m);
                    for (uint32_t j = 0; j < m; j++) {
                        uint32_t t = keep[((size_t)l * NKV + h) * kld + j];
                        memcpy(kf + ((size_t)j * NKV + h) * HD, ctx_k(x, l, t, h), HD * 4);
                        memcpy(vf + ((size_t)j * NKV + h) * HD, ctx_v(x, l, t, h), HD * 4);
                    }
                }
                T_OK(pgd_seq_write_kv(c, f, 0, m, l, kf, vf));
                pgd_attn_item it = {s, 1, qd, o}, jt = {f, 1, qd, r};
                T_OK(pgd_attn_run(a, l, &it, 1));
                T_OK(pgd_attn_run(a, l, &jt, 1));
                T_ASSERT(memcmp(o, r, sizeof o) == 0);
            }
            pgd_seq_destroy(c, f);
            free(kf);
            free(vf);
        }
        /* Decode steps: new tokens continue; online methods hold [budget, budget + PT). */
        uint32_t len = res->max_keep;
        for (uint32_t step = 0; step < 3 * PT; step++) {
            int rows = pgd_budget_begin(b, s, 1, 0);
            T_OK(rows);
            T_OK(pgd_seq_grow(c, s, 1));
            T_OK(ctx_write(c, s, x, step % n, 1, len));
            for (uint32_t l = 0; l < NL; l++) {
                pgd_attn_item it = {s, 1, x->q + (size_t)(step % n) * NH * HD, out};
                pgd_attn_scores sc = {pgd_budget_scores(b, l), (uint32_t)rows,
                                      pgd_budget_score_ld(b)};
                T_OK(pgd_attn_run_scored(a, l, &it, &sc, 1));
            }
            int64_t d = pgd_budget_end(b, s);
            T_OK(d);
            len = (uint32_t)pgd_seq_length(c, s);
            if (!family) {
                T_ASSERT(len >= p->budget && len < p->budget + PT);
            } else {
                T_EQ(d, 0);
                T_EQ(len, res->max_keep + step + 1);
            }
            T_OK(pgd_cache_check(c));
        }
    }
    pgd_budget_destroy(b);
    pgd_seq_destroy(c, s);
    free(out);
    free(snap);
    free(keep);
    return 0;
}

static int test_needle(void)
{
    const uint32_t n = 512;
    pgd_cache_params cp = pgd_cache_default_params();
    cp.pool.n_layers = NL;
    cp.pool.n_kv_heads = NKV;
    cp.pool.head_dim = HD;
    cp.pool.page_tokens = PT;
    cp.pool.kv_type = PGD_KV_F16;
    cp.pool.capacity_pages = 256;
    pgd_cache *c;
    T_OK(pgd_cache_create(&cp, &c));
    pgd_attn_params ap = pgd_attn_default_params();
    ap.n_head = NH;
    ap.max_rows = n;
    ap.score_keys = n + 64;
    pgd_attn *a;
    T_OK(pgd_attn_create(c, &ap, &a));
    static const double fracs[] = {0.10, 0.25, 0.50};
    int runs = 0, compacted = 0;
    for (int m = PGD_BUDGET_STREAMING; m < PGD_BUDGET_COUNT; m++)
        for (int fi = 0; fi < 3; fi++)
            for (int depth = 10; depth <= 90; depth += 20) {
                const uint32_t budget = (uint32_t)(fracs[fi] * n);
                const uint32_t pos = n * (uint32_t)depth / 100;
                ctx x;
                pgd_budget_params p = pgd_budget_default_params((pgd_budget_method)m, budget);
                ctx_make(&x, n, pos, p.obs_window, 1000 + (uint64_t)m * 100 + depth + fi);
                needle_result r;
                if (run_needle(c, a, &x, &p, &r) != 0)
                    T_FAIL("%s budget %u needle at %u: failed", pgd_budget_method_name(p.method),
                           budget, pos);
                /* streaming keeps the sinks and the newest budget - sinks tokens only: a
                 * needle between them is lost (documented: it needs no scores). */
                int expect =
                    m != PGD_BUDGET_STREAMING || pos < p.sinks || pos >= n - (budget - p.sinks);
                if (r.kept != expect)
                    T_FAIL("%s budget %u needle at %u: kept %d, expected %d",
                           pgd_budget_method_name(p.method), budget, pos, r.kept, expect);
                runs++;
                compacted += r.compacted;
                ctx_free(&x);
            }
    T_EQ(runs, 6 * 3 * 5);
    T_EQ(compacted, runs);
    pgd_attn_destroy(a);
    T_OK(pgd_cache_check(c));
    pgd_cache_destroy(c);
    return 0;
}

/* ---- cycles: every compaction checked ---- */

/* The keep lists the state's next selection must give: the method's select on a copy of
 * the scores under the sequence's dead-slot mask. */
static int expect_keep(pgd_cache *c, pgd_seq *s, const pgd_budget_params *p, pgd_budget *b,
                       const float *snap, size_t ld, uint32_t *keep, uint32_t kld, uint32_t *nk)
{
    uint32_t mask_len;
    const uint32_t *n_live;
    pgd__alloc al;
    pgd__alloc_init(&al, NULL);
    pgd__seq_mask(s, &mask_len, &n_live);
    const uint32_t len = (uint32_t)pgd_seq_length(c, s);
    int most = 0;
    (void)b;
    for (uint32_t l = 0; l < NL; l++) {
        pgd__budget_scratch scr = {.al = &al};
        pgd__budget_sel sel = {
            .p = p,
            .budget = pgd_budget_layer_budget(p, l, NL),
            .n_kv_heads = NKV,
            .n_keys = len,
            .scores = p->method == PGD_BUDGET_STREAMING ? NULL : snap + (size_t)l * NKV * ld,
            .ld = ld,
            .mask_len = mask_len,
            .n_live = n_live ? n_live + l * NKV : NULL,
            .keep = keep + (size_t)l * NKV * kld,
            .max_keep = kld,
            .n_keep = nk + l * NKV,
            .scr = &scr};
        T_OK(pgd__budget_ops_get(p->method)->select(&sel));
        pgd__budget_scratch_deinit(&scr);
        for (uint32_t h = 0; h < NKV; h++)
            if ((int)nk[l * NKV + h] > most) most = (int)nk[l * NKV + h];
    }
    return most;
}

/* Prompt chunks then decode steps through a budget over random K/V (tokens of the context
 * are written in order, slot = wherever the sequence is). Before each end the expected
 * selection is computed; when the end compacts, the test follows the tokens (map[l][h][slot]
 * = the context token a slot holds), checks the scores moved with them (new slots 0), the
 * pages, the prefix cache, and attention over the sequence against a scalar reference over
 * the mapped tokens. A last apply runs on the decoded tail (dead slots of pyramidkv and
 * adakv, never kept). */
static int run_cycles(pgd_cache *c, pgd_attn *a, const ctx *x, const pgd_budget_params *p,
                      uint32_t n_prompt, const uint32_t *chunks, int *n_compactions)
{
    const uint32_t n = x->n; /* the context's tokens: prompt then decode */
    pgd_seq *s;
    pgd_budget *b;
    T_OK(pgd_seq_create(c, &x->seed, sizeof x->seed, &s));
    T_OK(pgd_budget_create(c, p, &b));
    const uint32_t kld = n;
    uint32_t *map = malloc((size_t)NL * NKV * n * sizeof *map);
    uint32_t *keep = malloc((size_t)NL * NKV * kld * sizeof *keep), nk[NL * NKV];
    uint32_t *tok = malloc((size_t)NL * NKV * kld * sizeof *tok);
    int32_t *ids = malloc(n * sizeof *ids);
    float *out = malloc((size_t)n * NH * HD * sizeof *out), *snap = NULL;
    for (uint32_t i = 0; i < n; i++)
        ids[i] = (int32_t)(i * 7 + 1);
    uint32_t t = 0, ci = 0;
    int compacted_before = 0;
    while (t < n) {
        const uint32_t nr = t < n_prompt ? chunks[ci++] : 1;
        const uint64_t left = t < n_prompt ? n_prompt - t : 0;
        const uint32_t len = (uint32_t)pgd_seq_length(c, s);
        int rows = pgd_budget_begin(b, s, nr, left);
        T_OK(rows);
        T_OK(pgd_seq_grow(c, s, nr));
        T_OK(ctx_write(c, s, x, t, nr, len));
        for (uint32_t i = 0; i < NL * NKV; i++)
            for (uint32_t j = 0; j < nr; j++)
                map[(size_t)i * n + len + j] = t + j;
        for (uint32_t l = 0; l < NL; l++) {
            pgd_attn_item it = {s, nr, x->q + (size_t)t * NH * HD, out};
            pgd_attn_scores sc = {pgd_budget_scores(b, l), (uint32_t)rows, pgd_budget_score_ld(b)};
            T_OK(pgd_attn_run_scored(a, l, &it, &sc, 1));
        }
        t += nr;
        /* Commit the prompt while the sequence may still register (before compaction). */
        if (!compacted_before) T_OK(pgd_seq_commit(c, s, ids + t - nr, nr));
        const int last = t == n;
        size_t ld = pgd_budget_score_ld(b);
        free(snap);
        snap = calloc((size_t)NL * NKV * ld + 1, sizeof *snap);
        for (uint32_t l = 0; l < NL && pgd_budget_scores(b, l); l++)
            memcpy(snap + (size_t)l * NKV * ld, pgd_budget_scores(b, l),
                   (size_t)NKV * ld * sizeof *snap);
        const uint32_t before = (uint32_t)pgd_seq_length(c, s);
        uint32_t sm[NL * NKV];
        const uint32_t *n_live;
        uint32_t mask_len;
        pgd__seq_mask(s, &mask_len, &n_live);
        for (uint32_t i = 0; i < NL * NKV; i++)
            sm[i] = n_live ? n_live[i] : 0;
        const uint32_t ml0 = n_live ? mask_len : 0;
        int most = expect_keep(c, s, p, b, snap, ld, keep, kld, nk);
        T_OK(most);
        pgd_budget_stats st0, st1;
        pgd_budget_get_stats(b, &st0);
        int64_t d = last ? pgd_budget_apply(b, s) : pgd_budget_end(b, s);
        T_OK(d);
        pgd_budget_get_stats(b, &st1);
        if (st1.compactions == st0.compactions) {
            T_EQ(d, 0);
            T_EQ(pgd_seq_length(c, s), before);
            continue;
        }
        /* Compacted: to the expected lists. */
        compacted_before = 1;
        (*n_compactions)++;
        T_EQ(pgd_seq_length(c, s), (uint32_t)most);
        T_EQ(d, before - (uint32_t)most);
        T_EQ(st1.max_keep, (uint32_t)most);
        const uint32_t *ptab;
        T_EQ(pgd_seq_pages(c, s, &ptab), ((uint32_t)most + PT - 1) / PT);
        pgd__seq_mask(s, &mask_len, &n_live);
        float *now = pgd_budget_scores(b, 0);
        for (uint32_t i = 0; i < NL * NKV; i++) {
            const uint32_t *k = keep + (size_t)i * kld;
            T_ASSERT(!n_live || n_live[i] == nk[i]);
            for (uint32_t j = 0; j < nk[i]; j++) {
                /* never a dead slot of the sequence before */
                T_ASSERT(!ml0 || k[j] < sm[i] || k[j] >= ml0);
                tok[(size_t)i * kld + j] = map[(size_t)i * n + k[j]];
                if (now) T_ASSERT(now[i * ld + j] == snap[i * ld + k[j]]);
            }
            for (uint32_t j = nk[i]; now && j < ld; j++)
                T_ASSERT(now[i * ld + j] == 0.0f);
            memcpy(map + (size_t)i * n, tok + (size_t)i * kld, nk[i] * sizeof *map);
        }
        float o[NH * HD], r[NH * HD];
        const float *qd = x->q + (size_t)(t - 1) * NH * HD;
        for (uint32_t l = 0; l < NL; l++) {
            pgd_attn_item it = {s, 1, qd, o};
            T_OK(pgd_attn_run(a, l, &it, 1));
            ref_attend(x, l, qd, tok + (size_t)l * NKV * kld, kld, nk + l * NKV, r);
            if (nmse(o, r, NH * HD) > 1e-6)
                T_FAIL("%s layer %u after %u tokens: nmse %g", pgd_budget_method_name(p->method), l,
                       t, nmse(o, r, NH * HD));
        }
        T_OK(pgd_cache_check(c));
    }
    /* Prefix caching intact: the committed full pages of the prompt still match. */
    pgd_seq *m;
    T_OK(pgd_seq_create(c, &x->seed, sizeof x->seed, &m));
    int64_t hit = pgd_seq_match(c, m, ids, n_prompt);
    T_OK(hit);
    T_ASSERT(hit >= PT);
    pgd_seq_destroy(c, m);
    pgd_budget_destroy(b);
    pgd_seq_destroy(c, s);
    T_OK(pgd_cache_check(c));
    free(map);
    free(keep);
    free(tok);
    free(ids);
    free(out);
    free(snap);
    return 0;
}

static int test_cycles(void)
{
    pgd_cache_params cp = pgd_cache_default_params();
    cp.pool.n_layers = NL;
    cp.pool.n_kv_heads = NKV;
    cp.pool.head_dim = HD;
    cp.pool.page_tokens = PT;
    cp.pool.kv_type = PGD_KV_F16;
    cp.pool.capacity_pages = 512;
    pgd_cache *c;
    T_OK(pgd_cache_create(&cp, &c));
    pgd_attn_params ap = pgd_attn_default_params();
    ap.n_head = NH;
    ap.max_rows = 512;
    ap.score_keys = 1024;
    pgd_attn *a;
    T_OK(pgd_attn_create(c, &ap, &a));
    static const uint32_t chunks_a[] = {300}, chunks_b[] = {64, 64, 64, 64, 44};
    static const uint32_t chunks_c[] = {17, 100, 120, 63};
    static const uint32_t *const chunks[] = {chunks_a, chunks_b, chunks_c};
    static const uint32_t budgets[] = {40, 96};
    for (int m = PGD_BUDGET_STREAMING; m < PGD_BUDGET_COUNT; m++)
        for (int bi = 0; bi < 2; bi++)
            for (int ch = 0; ch < 3; ch++) {
                ctx x;
                ctx_make(&x, 300 + 80, 5, 0, 77 + (uint64_t)m * 10 + bi * 3 + ch);
                pgd_budget_params p = pgd_budget_default_params((pgd_budget_method)m, budgets[bi]);
                if (m >= PGD_BUDGET_SNAPKV) p.window = p.obs_window = 16;
                int n_comp = 0;
                if (run_cycles(c, a, &x, &p, 300, chunks[ch], &n_comp) != 0)
                    T_FAIL("%s budget %u chunks %d", pgd_budget_method_name(p.method), budgets[bi],
                           ch);
                /* online: every PT decode steps; the snapkv family: the prompt's end and the
                 * final apply. */
                if (m <= PGD_BUDGET_TOVA)
                    T_ASSERT(n_comp >= 80 / PT);
                else
                    T_EQ(n_comp, 2);
                ctx_free(&x);
            }
    pgd_attn_destroy(a);
    pgd_cache_destroy(c);
    return 0;
}

/* ---- allocation failures ---- */

typedef struct fail_alloc {
    long live;    /* allocations not freed */
    long fail_at; /* fail the allocation this many from now (1: the next); 0: never */
} fail_alloc;

static void *fa_malloc(void *ud, size_t n)
{
    fail_alloc *fa = ud;
    if (fa->fail_at && --fa->fail_at == 0) return NULL;
    void *p = malloc(n);
    fa->live += p != NULL;
    return p;
}

static void *fa_realloc(void *ud, void *p, size_t n)
{
    fail_alloc *fa = ud;
    if (fa->fail_at && --fa->fail_at == 0) return NULL;
    void *q = realloc(p, n);
    fa->live += p == NULL && q != NULL;
    return q;
}

static void fa_free(void *ud, void *p)
{
    fail_alloc *fa = ud;
    fa->live -= p != NULL;
    free(p);
}

/* Create, begin (growth) and apply under the Nth allocation failing, N = 1, 2, ...: each
 * failure is PGD_ENOMEM, leaks nothing and leaves the state and the sequence as they were. */
static int test_alloc_failures(void)
{
    fail_alloc fa = {0, 0};
    pgd_allocator al = {fa_malloc, fa_realloc, fa_free, &fa};
    pgd_cache_params cp = pgd_cache_default_params();
    cp.pool.n_layers = 2;
    cp.pool.n_kv_heads = 2;
    cp.pool.head_dim = 8;
    cp.pool.page_tokens = 16;
    cp.pool.capacity_pages = 64;
    cp.alloc = &al;
    pgd_cache *c;
    T_OK(pgd_cache_create(&cp, &c));
    pgd_seq *s;
    T_OK(pgd_seq_create(c, NULL, 0, &s));
    T_OK(pgd_seq_grow(c, s, 300));
    pgd_budget_params p = pgd_budget_default_params(PGD_BUDGET_ADAKV, 64);
    pgd_budget *b = NULL;
    int n;
    for (n = 1;; n++) {
        long live = fa.live;
        fa.fail_at = n;
        int rc = pgd_budget_create(c, &p, &b);
        fa.fail_at = 0;
        if (rc == PGD_OK) break;
        T_EQ(rc, PGD_ENOMEM);
        T_ASSERT(b == NULL);
        T_EQ(fa.live, live);
    }
    T_ASSERT(n > 1);
    T_EQ(pgd_budget_begin(b, s, 1, 1), 1);
    size_t ld = pgd_budget_score_ld(b);
    pgd_budget_scores(b, 1)[ld + 7] = 3.0f;
    for (n = 1;; n++) {
        long live = fa.live;
        fa.fail_at = n;
        int rc = pgd_budget_begin(b, s, 500, 1000);
        fa.fail_at = 0;
        if (rc >= 0) break;
        T_EQ(rc, PGD_ENOMEM);
        T_EQ(fa.live, live);
        T_EQ(pgd_budget_score_ld(b), ld);
        T_ASSERT(pgd_budget_scores(b, 1)[ld + 7] == 3.0f);
    }
    T_ASSERT(pgd_budget_scores(b, 1)[pgd_budget_score_ld(b) + 7] == 3.0f);
    /* apply keeps the scratch it grew for the next time (freed by destroy: the count at
     * the end is 0), so only the sequence is checked here. */
    for (n = 1;; n++) {
        fa.fail_at = n;
        int64_t rc = pgd_budget_apply(b, s);
        fa.fail_at = 0;
        if (rc != PGD_ENOMEM) {
            T_ASSERT(rc > 0);
            break;
        }
        T_EQ(pgd_seq_length(c, s), 300);
        T_OK(pgd_cache_check(c));
    }
    T_ASSERT(n > 1);
    pgd_budget_destroy(b);
    pgd_seq_destroy(c, s);
    pgd_cache_destroy(c);
    T_EQ(fa.live, 0);
    return 0;
}

int main(void)
{
    T_RUN(test_names_round_trip);
    T_RUN(test_params_check);
    T_RUN(test_layer_budget);
    T_RUN(test_select_rejects);
    T_RUN(test_select_planted);
    T_RUN(test_select_matches_reference);
    T_RUN(test_select_dead_slots);
    T_RUN(test_state_rows);
    T_RUN(test_state_growth);
    T_RUN(test_needle);
    T_RUN(test_cycles);
    T_RUN(test_alloc_failures);
    T_DONE();
}
