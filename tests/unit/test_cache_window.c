/* SPDX-License-Identifier: MIT */
/*
 * test_cache_window.c - window layers (cache.h "Window layers"): a cache whose sliding-window
 * layers live in a group of their own that releases the pages every future row's window has
 * left. Checked: the parameters and their refusals; the layer map (pgd_cache_layer_pool,
 * pgd_seq_layer_pages); the pages a sequence holds while it slides, one token at a time and
 * in chunks, with pgd_cache_check after every step; attention over a window group equal, bit
 * for bit, to attention over one cache where the window is only a mask (pgd_attn_run and the
 * reference, decode rows and prefill chunks, for f16, q8_0, kivi2 and a staged q4_0); prefix
 * hits served whole while the window pages are cached and cut back (counted) once they were
 * evicted; fork, truncate (refused below the window), write_kv into a released page,
 * write_slot and compaction refused; hash-mode (metadata-only) sequences.
 */
#include "attn_fixture.h"

enum { NL = 4, NKV = 2, PT = 16, W = 40, NHEAD = 4 };
static const uint8_t WIN_LAYERS[NL] = {1, 0, 1, 0}; /* gemma2-like: local, global, ... */
static const uint32_t WINDOWS[NL] = {W, 0, W, 0};

static pgd_cache_params params(pgd_kv_type type, uint32_t hd, uint32_t global_pages,
                               uint32_t window_pages, int windowed)
{
    pgd_cache_params cp = pgd_cache_default_params();
    cp.pool.n_layers = NL;
    cp.pool.n_kv_heads = NKV;
    cp.pool.head_dim = hd;
    cp.pool.page_tokens = PT;
    cp.pool.kv_type = type;
    cp.pool.capacity_pages = global_pages;
    cp.kv_residual = 2 * PT;
    if (windowed) {
        cp.window_tokens = W;
        cp.window_layers = WIN_LAYERS;
        cp.window_pages = window_pages;
    }
    return cp;
}

/* Deterministic K/V of (layer, position): the same values whatever the cache. */
static void kv_rows(uint32_t layer, uint64_t pos0, uint32_t n, uint32_t hd, float *k, float *v)
{
    for (uint32_t t = 0; t < n; t++) {
        uint64_t s = (pos0 + t) * 1000003u + layer * 7919u + 17;
        for (uint32_t i = 0; i < NKV * hd; i++) {
            k[(size_t)t * NKV * hd + i] = fx_rand(&s) * 1.5f + 0.3f * (float)(i % 5) - 0.6f;
            v[(size_t)t * NKV * hd + i] = fx_rand(&s);
        }
    }
}

/* Grows s by n, writes every layer's K/V and commits tokens (token id = position % 97). */
static int extend(pgd_cache *c, pgd_seq *s, uint32_t n, uint32_t hd)
{
    uint64_t pos0 = pgd_seq_length(c, s);
    int rc = pgd_seq_grow(c, s, n);
    if (rc != PGD_OK) return rc;
    float *k = malloc((size_t)n * NKV * hd * sizeof *k),
          *v = malloc((size_t)n * NKV * hd * sizeof *v);
    int32_t *tok = malloc(n * sizeof *tok);
    if (!k || !v || !tok) rc = PGD_ENOMEM;
    for (uint32_t l = 0; rc == PGD_OK && l < NL; l++) {
        kv_rows(l, pos0, n, hd, k, v);
        rc = pgd_seq_write_kv(c, s, pos0, n, l, k, v);
    }
    for (uint32_t t = 0; tok && t < n; t++)
        tok[t] = (int32_t)((pos0 + t) % 97);
    if (rc == PGD_OK) rc = pgd_seq_commit(c, s, tok, n) < 0 ? PGD_EINVAL : PGD_OK;
    free(k);
    free(v);
    free(tok);
    return rc;
}

static int32_t *tokens_of(uint32_t n)
{
    int32_t *t = malloc((n ? n : 1) * sizeof *t);
    for (uint32_t i = 0; t && i < n; i++)
        t[i] = (int32_t)(i % 97);
    return t;
}

/* The first window page a row at position q needs (cache.c window_first_page). */
static uint32_t first_page(uint64_t q)
{
    return q + 1 > W ? (uint32_t)((q + 1 - W) / PT) : 0;
}

static int test_params(void)
{
    pgd_cache *c = NULL;
    pgd_cache_params cp = params(PGD_KV_F16, 8, 32, 8, 1);
    uint8_t none[NL] = {0, 0, 0, 0}, all[NL] = {1, 1, 1, 1};
    cp.window_layers = NULL;
    T_EQ(pgd_cache_create(&cp, &c), PGD_EINVAL);
    cp.window_layers = none;
    T_EQ(pgd_cache_create(&cp, &c), PGD_EINVAL);
    cp.window_layers = all;
    T_EQ(pgd_cache_create(&cp, &c), PGD_EINVAL);
    cp = params(PGD_KV_F16, 8, 32, 4, 1); /* W 40 needs ceil(39 / 16) + 2 = 5 pages */
    T_EQ(pgd_cache_create(&cp, &c), PGD_EINVAL);
    T_ASSERT(c == NULL);
    cp = params(PGD_KV_F16, 8, 32, 5, 1);
    T_OK(pgd_cache_create(&cp, &c));
    T_EQ(pgd_cache_n_layers(c), NL);
    T_EQ(pgd_cache_window(c), W);
    uint32_t local = 99;
    pgd_pool *gp = pgd_cache_pool(c);
    T_ASSERT(pgd_cache_layer_pool(c, 0, &local) != gp && local == 0);
    T_ASSERT(pgd_cache_layer_pool(c, 1, &local) == gp && local == 0);
    T_ASSERT(pgd_cache_layer_pool(c, 2, &local) != gp && local == 1);
    T_ASSERT(pgd_cache_layer_pool(c, 3, &local) == gp && local == 1);
    T_ASSERT(pgd_cache_layer_pool(c, NL, &local) == NULL);
    T_ASSERT(pgd_cache_layer_is_window(c, 0) && !pgd_cache_layer_is_window(c, 1));
    T_EQ(pgd_pool_n_pages(pgd_cache_layer_pool(c, 0, &local)), 5);
    T_EQ(pgd_pool_n_pages(gp), 32);
    pgd_cache_stats st;
    pgd_cache_get_stats(c, &st);
    T_EQ(st.n_window_pages_total, 5);
    T_EQ(st.n_window_pages_free, 5);
    T_EQ(st.n_pages_total, 32);
    pgd_cache_destroy(c);
    /* Without window layers: one group. */
    cp = params(PGD_KV_F16, 8, 32, 0, 0);
    T_OK(pgd_cache_create(&cp, &c));
    T_EQ(pgd_cache_window(c), 0);
    T_ASSERT(pgd_cache_layer_pool(c, 3, &local) == pgd_cache_pool(c) && local == 3);
    T_ASSERT(!pgd_cache_layer_is_window(c, 0));
    pgd_cache_destroy(c);
    return 0;
}

/* Live window pages of s, and that the released ones are exactly those below the window of
 * position q. */
static int window_table(pgd_cache *c, pgd_seq *s, uint64_t q, uint32_t *live)
{
    const uint32_t *w, *g;
    uint32_t nw = pgd_seq_layer_pages(c, s, 0, &w), ng = pgd_seq_layer_pages(c, s, 1, &g);
    T_EQ(nw, ng);
    T_EQ(ng, (pgd_seq_length(c, s) + PT - 1) / PT);
    *live = 0;
    for (uint32_t i = 0; i < nw; i++) {
        T_ASSERT(g[i] != PGD_NO_PAGE);
        if (i < first_page(q)) {
            T_ASSERT(w[i] == PGD_NO_PAGE);
        } else {
            T_ASSERT(w[i] != PGD_NO_PAGE);
            ++*live;
        }
    }
    return 0;
}

static int test_slide(void)
{
    pgd_cache *c;
    pgd_cache_params cp = params(PGD_KV_F16, 8, 64, 12, 1);
    T_OK(pgd_cache_create(&cp, &c));
    pgd_seq *s;
    T_OK(pgd_seq_create(c, NULL, 0, &s));
    uint32_t live, most = 0;
    for (uint32_t step = 0; step < 400; step++) {
        uint64_t q = pgd_seq_length(c, s);
        uint32_t n = step < 200 ? 1 : 1 + step % 23; /* decode, then chunks */
        if (q + n > 900) break;
        T_OK(extend(c, s, n, 8));
        T_OK(window_table(c, s, q, &live));
        T_OK(pgd_cache_check(c));
        most = live > most ? live : most;
    }
    /* A chunk of up to 23 rows after a window of 40 keys: at most 5 pages. */
    T_ASSERT(most <= 5);
    pgd_cache_stats st;
    pgd_cache_get_stats(c, &st);
    uint64_t len = pgd_seq_length(c, s);
    T_ASSERT(len > 800);
    T_EQ(st.n_window_pages_used, live);
    T_EQ(st.n_pages_used, (len + PT - 1) / PT);
    T_ASSERT(st.n_window_released >= first_page(len - 23));
    T_ASSERT(st.n_window_evictions > 0); /* 12 pages for 50 full blocks: released ones went */
    T_ASSERT(st.n_window_pages_cached <= 12);
    pgd_seq_destroy(c, s);
    T_OK(pgd_cache_check(c));
    pgd_cache_get_stats(c, &st);
    T_EQ(st.n_window_pages_used, 0);
    T_EQ(st.n_pages_used, 0);
    pgd_cache_destroy(c);
    return 0;
}

/* Runs layer `layer` of attention over s (n_rows last rows) into out, fast and reference. */
static int attend(pgd_cache *c, pgd_seq *s, uint32_t layer, uint32_t n_rows, const float *q,
                  float *fast, float *ref, uint32_t hd)
{
    pgd_attn_params p = pgd_attn_default_params();
    p.n_head = NHEAD;
    p.layer_window = WINDOWS;
    p.split_pages = 1; /* page ranges split: the merge across pages is compared too */
    fx_exec ex = {.n_threads = 2};
    p.n_threads = 2;
    p.parallel = fx_parallel;
    p.parallel_ud = &ex;
    p.parallel_min_work = 1; /* on the threads however small the run */
    pgd_attn *a;
    T_OK(pgd_attn_create(c, &p, &a));
    pgd_attn_item it = {s, n_rows, q, fast};
    int rc = pgd_attn_run(a, layer, &it, 1);
    pgd_attn_destroy(a);
    T_OK(rc);
    it.out = ref;
    T_OK(pgd_attn_run_ref_ex(c, &p, layer, &it, NULL, 1));
    (void)hd;
    return 0;
}

/* The same K/V in a window-group cache and in a one-group cache with the window as a mask:
 * every layer's attention is the same, bit for bit. */
static int same_attention(pgd_kv_type type, uint32_t hd)
{
    pgd_cache *cw, *cm;
    pgd_cache_params pw = params(type, hd, 64, 8, 1), pm = params(type, hd, 64, 0, 0);
    T_OK(pgd_cache_create(&pw, &cw));
    T_OK(pgd_cache_create(&pm, &cm));
    pgd_seq *sw, *sm;
    T_OK(pgd_seq_create(cw, NULL, 0, &sw));
    T_OK(pgd_seq_create(cm, NULL, 0, &sm));
    uint64_t rng = 7;
    const uint32_t rows_max = 24;
    const size_t qn = (size_t)rows_max * NHEAD * hd;
    float *q = malloc(qn * sizeof *q), *o[4];
    for (int i = 0; i < 4; i++)
        o[i] = malloc(qn * sizeof(float));
    for (uint32_t step = 0; step < 30; step++) {
        uint32_t n = step % 3 ? 1 : 1 + (uint32_t)(t_rand(&rng) % rows_max);
        T_OK(extend(cw, sw, n, hd));
        T_OK(extend(cm, sm, n, hd));
        if (pgd_seq_length(cw, sw) < 2 * W && step % 5) continue;
        for (size_t i = 0; i < (size_t)n * NHEAD * hd; i++)
            q[i] = fx_rand(&rng) * 2.0f;
        for (uint32_t l = 0; l < NL; l++) {
            T_OK(attend(cw, sw, l, n, q, o[0], o[1], hd));
            T_OK(attend(cm, sm, l, n, q, o[2], o[3], hd));
            size_t bytes = (size_t)n * NHEAD * hd * sizeof(float);
            if (memcmp(o[0], o[2], bytes) || memcmp(o[1], o[3], bytes))
                T_FAIL("%s hd %u layer %u at %llu (+%u rows): window group != mask",
                       pgd_kv_type_name(type), hd, l, (unsigned long long)pgd_seq_length(cw, sw),
                       n);
            T_ASSERT(fx_nmse(o[0], o[1], (size_t)n * NHEAD * hd) < 1e-3);
        }
    }
    T_ASSERT(pgd_seq_length(cw, sw) > 3 * W);
    pgd_cache_stats st;
    pgd_cache_get_stats(cw, &st);
    T_ASSERT(st.n_window_released > 0);
    T_OK(pgd_cache_check(cw));
    free(q);
    for (int i = 0; i < 4; i++)
        free(o[i]);
    pgd_seq_destroy(cw, sw);
    pgd_seq_destroy(cm, sm);
    pgd_cache_destroy(cw);
    pgd_cache_destroy(cm);
    return 0;
}

static int test_attention(void)
{
    T_OK(same_attention(PGD_KV_F16, 8));
    T_OK(same_attention(PGD_KV_Q8_0, 32));
    T_OK(same_attention(PGD_KV_KIVI2, 32)); /* staged: the residual ring */
    T_OK(same_attention(PGD_KV_Q4_0, 8));   /* staged too (head_dim < 32) */
    return 0;
}

static int test_prefix(void)
{
    pgd_cache *c;
    pgd_cache_params cp = params(PGD_KV_F16, 8, 128, 64, 1);
    T_OK(pgd_cache_create(&cp, &c));
    int32_t *tok = tokens_of(400);
    pgd_seq *a, *b;
    T_OK(pgd_seq_create(c, NULL, 0, &a));
    T_OK(extend(c, a, 200, 8));
    pgd_seq_destroy(c, a);
    /* Every window page is cached (64 pages): the whole hit is usable. */
    T_OK(pgd_seq_create(c, NULL, 0, &b));
    T_EQ(pgd_seq_match(c, b, tok, 200), 192);
    uint32_t live;
    T_OK(window_table(c, b, 192, &live));
    T_EQ(live, 12 - first_page(192));
    T_OK(pgd_cache_check(c));
    T_OK(extend(c, b, 8, 8)); /* continues from the hit: rows 192.. */
    T_OK(pgd_cache_check(c));
    pgd_seq_destroy(c, b);
    pgd_cache_destroy(c);

    /* A small window pool: sliding through 400 tokens evicted the early released pages. */
    cp = params(PGD_KV_F16, 8, 128, 7, 1);
    T_OK(pgd_cache_create(&cp, &c));
    T_OK(pgd_seq_create(c, NULL, 0, &a));
    for (int i = 0; i < 40; i++)
        T_OK(extend(c, a, 10, 8));
    pgd_seq_destroy(c, a);
    T_OK(pgd_seq_create(c, NULL, 0, &b));
    T_EQ(pgd_seq_match(c, b, tok, 200), 0); /* blocks 9..11 are gone: no usable hit */
    pgd_cache_stats st;
    pgd_cache_get_stats(c, &st);
    T_EQ(st.n_window_cut_tokens, 192);
    T_EQ(st.n_hit_tokens, 0);
    T_OK(pgd_cache_check(c));
    pgd_seq_destroy(c, b);
    /* The end of the 400 tokens: its window pages were the last released, still cached. */
    T_OK(pgd_seq_create(c, NULL, 0, &b));
    T_EQ(pgd_seq_match(c, b, tok, 400), 400);
    T_OK(window_table(c, b, 400, &live));
    T_OK(pgd_cache_check(c));
    pgd_seq_destroy(c, b);
    pgd_cache_destroy(c);
    free(tok);
    return 0;
}

static int test_refusals(void)
{
    pgd_cache *c;
    pgd_cache_params cp = params(PGD_KV_F16, 8, 64, 16, 1);
    T_OK(pgd_cache_create(&cp, &c));
    pgd_seq *s, *f;
    T_OK(pgd_seq_create(c, NULL, 0, &s));
    T_OK(extend(c, s, 100, 8)); /* first page of 99's window: (100 - 40) / 16 = 3 */
    T_OK(extend(c, s, 3, 8));
    T_OK(pgd_seq_grow(c, s, 5)); /* released below the window of 103: page 4 */
    /* Truncate: rows from n on need keys from n - 39: refused below 4 * 16 + 39. */
    T_EQ(pgd_seq_truncate(c, s, 104), PGD_OK);
    T_EQ(pgd_seq_truncate(c, s, 103), PGD_OK);
    T_OK(pgd_seq_grow(c, s, 5));
    float k[NKV * 8] = {0}, v[NKV * 8] = {0};
    T_EQ(pgd_seq_write_kv(c, s, 10, 1, 0, k, v), PGD_EINVAL);   /* released window page */
    T_EQ(pgd_seq_write_kv(c, s, 103, 1, 0, k, v), PGD_OK);      /* a live one */
    T_EQ(pgd_seq_write_kv(c, s, 103, 1, NL, k, v), PGD_EINVAL); /* no such layer */
    uint32_t page, slot;
    T_EQ(pgd_seq_write_slot(c, s, 103, &page, &slot), PGD_EINVAL);
    uint32_t keep[NL * NKV * 4] = {0}, n_live[NL * NKV];
    for (uint32_t i = 0; i < NL * NKV; i++)
        n_live[i] = 1;
    T_EQ(pgd_seq_compact(c, s, 1, keep, 4, n_live), PGD_EINVAL);
    T_OK(pgd_seq_truncate(c, s, 103));
    T_OK(pgd_cache_check(c));
    /* A fork shares the live pages; destroying the source leaves the fork whole. */
    T_OK(pgd_seq_fork(c, s, &f));
    pgd_seq_destroy(c, s);
    T_OK(pgd_cache_check(c));
    T_OK(extend(c, f, 50, 8));
    T_OK(pgd_cache_check(c));
    uint32_t live;
    T_OK(window_table(c, f, 103, &live));
    /* Two grows without a commit: the second released pages below the window of 193, so
     * rows from 153 (the committed end) would miss keys 114 .. 143. */
    T_OK(pgd_seq_grow(c, f, 40));
    T_OK(pgd_seq_grow(c, f, 40));
    T_EQ(pgd_seq_truncate(c, f, 153), PGD_ESTATE);
    T_OK(pgd_seq_truncate(c, f, 193)); /* rows from 193 need keys from 154: held */
    T_OK(pgd_cache_check(c));
    pgd_seq_destroy(c, f);
    T_OK(pgd_cache_check(c));
    pgd_cache_destroy(c);
    return 0;
}

/* Hash mode on a metadata-only pool (trace replay): the same rules. */
static int test_hashes(void)
{
    pgd_cache *c;
    pgd_cache_params cp = params(PGD_KV_F16, 8, 64, 16, 1);
    cp.pool.metadata_only = 1;
    T_OK(pgd_cache_create(&cp, &c));
    pgd_hash h[20];
    for (uint32_t i = 0; i < 20; i++)
        h[i] = (pgd_hash){0x1234 + i, 0x9876 * (i + 1)};
    pgd_seq *s;
    T_OK(pgd_seq_create(c, NULL, 0, &s));
    for (uint32_t i = 0; i < 20; i++) {
        T_OK(pgd_seq_grow(c, s, PT));
        T_ASSERT(pgd_seq_commit_hashes(c, s, &h[i], 1) >= 0);
        T_OK(pgd_cache_check(c));
    }
    uint32_t live;
    T_OK(window_table(c, s, 19 * PT, &live));
    pgd_seq_destroy(c, s);
    T_OK(pgd_seq_create(c, NULL, 0, &s));
    T_EQ(pgd_seq_match_hashes(c, s, h, 20), 20);
    T_OK(window_table(c, s, 20 * PT, &live));
    T_OK(pgd_cache_check(c));
    pgd_seq_destroy(c, s);
    pgd_cache_destroy(c);
    return 0;
}

int main(void)
{
    T_RUN(test_params);
    T_RUN(test_slide);
    T_RUN(test_attention);
    T_RUN(test_prefix);
    T_RUN(test_refusals);
    T_RUN(test_hashes);
    T_DONE();
}
