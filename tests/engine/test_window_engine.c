/* SPDX-License-Identifier: MIT */
/*
 * test_window_engine.c - sliding-window layers in a page group of their own (cache.h
 * "Window layers", pe_ctx_params.kv_window_dense) on the reference set's gemma2 and gemma3
 * files (window 32 at their n_ctx), for f16 and q8_0 KV:
 *   - a 40-token prompt and 300 greedy steps give the very same logits, bit for bit, as
 *     the window kept as a mask over every page (kv_window_dense), while the window layers
 *     hold at most a window and two pages at every step and their old pages are released;
 *   - a prefix hit of 192 tokens (batch-invariant products) continues to the same logits as
 *     a cold prefill of all 200 tokens, and the hit is whole because the window pages of its
 *     last 32 tokens are cached;
 *   - token budgets are refused with a window group (pgd_seq_compact) and the context falls
 *     back to the mask when a budget is its default.
 * The reference folder is $PGD_REFERENCE_DIR, else ../shared/models/reference beside the
 * source tree; without it the program exits 77 (skipped) with a message.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "t.h"

static char ref[1024];
static const char *const stems[] = {"tiny-gemma2-f16", "tiny-gemma3-f16"};

static int load(const char *stem, pe_model **m)
{
    char path[1200], e[256];
    snprintf(path, sizeof path, "%s/models/%s/%s.gguf", ref, stem, stem);
    if (pe_model_load(path, NULL, NULL, m, e, sizeof e)) T_FAIL("%s: %s", stem, e);
    return 0;
}

static int ctx(pe_model *m, pgd_kv_type kt, int dense, int det, pe_ctx **c)
{
    char e[256];
    pe_ctx_params p = pe_ctx_default_params();
    p.n_ctx = 512;
    p.n_threads = 2;
    p.kv_type = kt;
    p.kv_window_dense = dense;
    p.deterministic = det;
    if (pe_ctx_create(m, &p, c, e, sizeof e)) T_FAIL("pe_ctx_create: %s", e);
    return 0;
}

static int32_t argmax(const float *l, uint32_t V)
{
    int32_t best = 0;
    for (uint32_t v = 1; v < V; v++)
        if (l[v] > l[best]) best = (int32_t)v;
    return best;
}

/* The window W of the model's window layers (both files: every local layer has one). */
static uint32_t model_window(pe_model *m)
{
    const pe_hparams *hp = pe_model_hparams(m);
    for (uint32_t l = 0; l < hp->n_layer; l++)
        if (pe_hparams_layer_window(hp, l)) return pe_hparams_layer_window(hp, l);
    return 0;
}

static int same_run(const char *stem, pgd_kv_type kt)
{
    pe_model *m;
    T_OK(load(stem, &m));
    const uint32_t V = pe_model_hparams(m)->n_vocab, W = model_window(m);
    T_ASSERT(W > 0 && W < 200);
    pe_ctx *a, *b;
    T_OK(ctx(m, kt, 0, 0, &a));
    T_OK(ctx(m, kt, 1, 0, &b));
    pgd_cache *ca = pe_ctx_cache(a), *cb = pe_ctx_cache(b);
    T_EQ(pgd_cache_window(ca), W);
    T_EQ(pgd_cache_window(cb), 0);
    T_ASSERT(pe_ctx_params_get(a)->kv_window_tokens > 0);
    T_EQ(pe_ctx_params_get(b)->kv_window_tokens, 0);
    pgd_seq *sa, *sb;
    T_OK(pgd_seq_create(ca, NULL, 0, &sa));
    T_OK(pgd_seq_create(cb, NULL, 0, &sb));
    float *la = malloc(V * sizeof *la), *lb = malloc(V * sizeof *lb);
    int32_t tok[40];
    for (uint32_t i = 0; i < 40; i++)
        tok[i] = (int32_t)(1 + (i * 37) % (V - 1));
    T_EQ(pe_forward(a, sa, tok, 40, la, 0), 0);
    T_EQ(pe_forward(b, sb, tok, 40, lb, 0), 0);
    const uint32_t pt = pgd_cache_page_tokens(ca), most = (W - 1 + pt - 1) / pt + 2;
    int rc = 0;
    for (uint32_t step = 0; step < 300 && rc == 0; step++) {
        if (memcmp(la, lb, V * sizeof *la)) {
            fprintf(stderr, "%s %s: step %u: logits differ\n", stem, pgd_kv_type_name(kt), step);
            rc = -1;
            break;
        }
        pgd_cache_stats st;
        pgd_cache_get_stats(ca, &st);
        if (st.n_window_pages_used > most) {
            fprintf(stderr, "%s: step %u: window layers hold %u pages (at most %u)\n", stem, step,
                    st.n_window_pages_used, most);
            rc = -1;
        }
        int32_t t = argmax(la, V);
        if (pe_forward(a, sa, &t, 1, la, 0) || pe_forward(b, sb, &t, 1, lb, 0)) rc = -1;
    }
    pgd_cache_stats st;
    pgd_cache_get_stats(ca, &st);
    printf("%-16s %-4s: 340 positions, logits equal to the mask's; window layers %u pages used, "
           "%llu released; global layers %u pages\n",
           stem, pgd_kv_type_name(kt), st.n_window_pages_used,
           (unsigned long long)st.n_window_released, st.n_pages_used);
    T_ASSERT(st.n_window_released >= (340 - W) / pt - 1);
    T_OK(pgd_cache_check(ca));
    pgd_seq_destroy(ca, sa);
    pgd_seq_destroy(cb, sb);
    free(la);
    free(lb);
    pe_ctx_destroy(a);
    pe_ctx_destroy(b);
    pe_model_destroy(m);
    return rc;
}

static int prefix_hit(const char *stem)
{
    pe_model *m;
    T_OK(load(stem, &m));
    const uint32_t V = pe_model_hparams(m)->n_vocab;
    pe_ctx *a, *b;
    T_OK(ctx(m, PGD_KV_F16, 0, 1, &a));
    T_OK(ctx(m, PGD_KV_F16, 1, 1, &b));
    pgd_cache *ca = pe_ctx_cache(a), *cb = pe_ctx_cache(b);
    int32_t tok[200];
    for (uint32_t i = 0; i < 200; i++)
        tok[i] = (int32_t)(1 + (i * 53) % (V - 1));
    float *la = malloc(V * sizeof *la), *lb = malloc(V * sizeof *lb);
    pgd_seq *s;
    /* A first request fills the cache (in chunks of 50, as a scheduler would). */
    T_OK(pgd_seq_create(ca, NULL, 0, &s));
    for (uint32_t i = 0; i < 200; i += 50)
        T_EQ(pe_forward(a, s, tok + i, 50, la, 0), 0);
    pgd_seq_destroy(ca, s);
    /* The second hits 192 tokens and computes 8. */
    T_OK(pgd_seq_create(ca, NULL, 0, &s));
    T_EQ(pgd_seq_match(ca, s, tok, 200), 192);
    T_EQ(pe_forward(a, s, tok + 192, 8, la, 0), 0);
    pgd_seq_destroy(ca, s);
    /* Cold, the window as a mask. */
    T_OK(pgd_seq_create(cb, NULL, 0, &s));
    T_EQ(pe_forward(b, s, tok, 200, lb, 0), 0);
    pgd_seq_destroy(cb, s);
    int same = memcmp(la, lb, V * sizeof *la) == 0;
    pgd_cache_stats st;
    pgd_cache_get_stats(ca, &st);
    printf("%-16s prefix hit 192 of 200 (window pages cached: %u), next logits %s the cold "
           "run's\n",
           stem, st.n_window_pages_cached, same ? "equal" : "DIFFER from");
    T_EQ(st.n_window_cut_tokens, 0);
    free(la);
    free(lb);
    pe_ctx_destroy(a);
    pe_ctx_destroy(b);
    pe_model_destroy(m);
    T_ASSERT(same);
    return 0;
}

static int budgets(const char *stem)
{
    pe_model *m;
    char e[256];
    T_OK(load(stem, &m));
    pe_ctx *c;
    pe_ctx_params p = pe_ctx_default_params();
    p.n_ctx = 256;
    p.budget = pgd_budget_default_params(PGD_BUDGET_STREAMING, 64);
    if (pe_ctx_create(m, &p, &c, e, sizeof e)) T_FAIL("pe_ctx_create: %s", e);
    T_EQ(pgd_cache_window(pe_ctx_cache(c)), 0); /* a default budget keeps the mask */
    pe_ctx_destroy(c);
    T_OK(ctx(m, PGD_KV_F16, 0, 0, &c));
    pgd_seq *s;
    T_OK(pgd_seq_create(pe_ctx_cache(c), NULL, 0, &s));
    int32_t t[20] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
    T_EQ(pe_forward(c, s, t, 20, NULL, 0), 0);
    uint32_t keep[64] = {0}, live[64];
    for (int i = 0; i < 64; i++)
        live[i] = 1;
    T_EQ(pgd_seq_compact(pe_ctx_cache(c), s, 1, keep, 1, live), PGD_EINVAL);
    pgd_seq_destroy(pe_ctx_cache(c), s);
    pe_ctx_destroy(c);
    pe_model_destroy(m);
    return 0;
}

static int test_all(void)
{
    for (size_t i = 0; i < sizeof stems / sizeof stems[0]; i++) {
        T_OK(same_run(stems[i], PGD_KV_F16));
        T_OK(same_run(stems[i], PGD_KV_Q8_0));
        T_OK(prefix_hit(stems[i]));
        T_OK(budgets(stems[i]));
    }
    return 0;
}

int main(void)
{
    const char *env = getenv("PGD_REFERENCE_DIR");
    snprintf(ref, sizeof ref, "%s",
             env && *env ? env : PGD_SOURCE_DIR "/../shared/models/reference");
    char probe[1200];
    snprintf(probe, sizeof probe, "%s/models/%s/%s.gguf", ref, stems[0], stems[0]);
    FILE *f = fopen(probe, "rb");
    if (!f) {
        fprintf(stderr,
                "test_window_engine: no reference set at %s (set PGD_REFERENCE_DIR): "
                "skipped\n",
                ref);
        return 77;
    }
    fclose(f);
    T_RUN(test_all);
    T_DONE();
}
