/* SPDX-License-Identifier: MIT */
/*
 * test_budget_engine.c - token budgets (budget.h) in the engine: the forward pass
 * (pe_forward_budget, pe_forward_batch items with a budget) and the scheduler, on
 * stories260K with an f32 cache of 16-token pages:
 *   - a budget larger than the sequence changes nothing: every method's logits are the
 *     dense ones, bit for bit (scoring never changes attention's output), on the fast
 *     path and on the scalar reference (attn_ref);
 *   - streaming, budget 64, a 300-token prompt in chunks of 64 and 100 greedy tokens:
 *     after every step the sequence holds at most ceil((64 + 16) / 16) = 5 pages, the
 *     pool holds fewer pages than the dense run, positions continue (slots + dropped
 *     = tokens), and every step's logits equal a manual reference: the same chunks
 *     through plain pe_forward, compacted by hand (pgd_seq_compact: the 4 sinks and the
 *     newest 60 slots, whenever 64 + 16 slots are held, as budget.h states);
 *   - snapkv compresses once, when the chunk that ends the prompt has run: no slot
 *     dropped before it, 64 slots after, then one slot per decode token;
 *   - every method with f16, bf16, q8_0, q4_0 and kivi2 pages, dense and with Quest (3
 *     pages per decode row): finite logits, slots + dropped = tokens, no failed compaction,
 *     pgd_cache_check;
 *   - the scheduler: a dense request, then a streaming one on the same prefix (it
 *     matches the dense one's pages and compacts into private copies), then the dense
 *     prompt again in one batch with an h2o request on the same prefix: it hits the shared
 *     pages and its output equals its run alone; the usage names the budget and its
 *     dropped tokens;
 *   - preemption: a pool too small for four streaming requests at once preempts; they
 *     recompute and finish with max_tokens valid tokens, and the cache stays consistent;
 *   - a snapkv request whose compaction at the prompt's end finds no page (the pool full
 *     of a dense request's pages) keeps its tokens, and is compacted by the retry once
 *     the dense request finished, without a preemption;
 *   - bad values: pe_ctx_create names the field (budget 0, sinks + window too large, a
 *     budget with the contiguous reference); submit refuses a bad request budget, and a
 *     budget on a context without scoring scratch, with PGD_EINVAL; the forward pass
 *     refuses prompt_left below the chunk and a budget on the contiguous reference.
 * Model: argv[1], else $PGD_MODELS_DIR/stories260K.gguf, else ../shared/models beside the
 * source tree; skipped (77) when none is found.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <pagoda/budget.h>

#include "sched_fixture.h"

#define PT 16      /* page tokens */
#define CHUNK 64   /* prefill chunk (n_batch) */
#define BUDGET 64  /* streaming's budget in the tests */
#define PROMPT 300 /* prompt tokens */
#define GEN 100    /* generated tokens */
#define SINKS 4    /* streaming's default sinks */

static pe_ctx_params fwd_params(void)
{
    pe_ctx_params p = sched_ctx_params(4096);
    p.n_batch = CHUNK;
    p.page_tokens = PT;
    p.budget_scores = 1;
    return p;
}

static uint32_t n_vocab(void)
{
    return pe_model_hparams(g_model)->n_vocab;
}

static int argmax(const float *x, uint32_t n)
{
    int best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = (int)i;
    return best;
}

static int all_finite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

/* Runs prompt[0..np) in chunks of CHUNK on seq under budget b (NULL: dense), then `gen`
 * greedy tokens (written to toks[np..]), each step's last logits to lg[step]; calls
 * check(ud, step) after each step when not NULL. Returns 0 or -1. */
typedef int (*step_check)(void *ud, pe_ctx *c, pgd_seq *s, uint32_t tokens);
static int generate(pe_ctx *c, pgd_seq *s, pgd_budget *b, int32_t *toks, uint32_t np, uint32_t gen,
                    float *lg, step_check check, void *ud)
{
    const uint32_t V = n_vocab();
    uint32_t step = 0;
    for (uint32_t i = 0; i < np; i += CHUNK, step++) {
        uint32_t n = np - i < CHUNK ? np - i : CHUNK;
        T_EQ(pe_forward_budget(c, s, b, toks + i, n, np - i, lg + (size_t)step * V, 0), 0);
        if (check && check(ud, c, s, i + n)) return -1;
    }
    for (uint32_t k = 0; k < gen; k++, step++) {
        toks[np + k] = argmax(lg + (size_t)(step - 1) * V, V);
        T_EQ(pe_forward_budget(c, s, b, toks + np + k, 1, 0, lg + (size_t)step * V, 0), 0);
        if (check && check(ud, c, s, np + k + 1)) return -1;
    }
    return 0;
}

static uint32_t n_steps(uint32_t np, uint32_t gen)
{
    return (np + CHUNK - 1) / CHUNK + gen;
}

/* ---- a budget above the sequence is dense ---- */

static int test_large_budget_is_dense(void)
{
    enum { np = 150, gen = 20 };
    const uint32_t V = n_vocab(), steps = n_steps(np, gen);
    uint64_t seed = 5;
    int32_t toks[np + gen], toks2[np + gen];
    float *dense = malloc((size_t)steps * V * sizeof(float));
    float *lg = malloc((size_t)steps * V * sizeof(float));
    T_ASSERT(dense && lg);
    random_tokens(&seed, toks, np);
    for (int ref = 0; ref < 2; ref++) { /* the fast path, then the scalar reference */
        pe_ctx_params p = fwd_params();
        p.attn_ref = ref;
        pe_ctx *c = sched_ctx_create(&p);
        T_ASSERT(c);
        pgd_seq *s;
        T_OK(pgd_seq_create(pe_ctx_cache(c), "dense", 5, &s));
        T_OK(generate(c, s, NULL, toks, np, gen, dense, NULL, NULL));
        pgd_seq_destroy(pe_ctx_cache(c), s);
        for (int m = PGD_BUDGET_STREAMING; m < PGD_BUDGET_COUNT; m++) {
            pgd_budget_params bp = pgd_budget_default_params((pgd_budget_method)m, 400);
            pgd_budget *b;
            T_OK(pgd_budget_create(pe_ctx_cache(c), &bp, &b));
            /* a tenant of its own: nothing matched, every row computed and scored */
            T_OK(pgd_seq_create(pe_ctx_cache(c), &m, sizeof m, &s));
            memcpy(toks2, toks, np * sizeof *toks);
            T_OK(generate(c, s, b, toks2, np, gen, lg, NULL, NULL));
            T_EQ(pgd_seq_n_dropped(pe_ctx_cache(c), s), 0);
            T_EQ(pgd_seq_length(pe_ctx_cache(c), s), np + gen);
            if (memcmp(lg, dense, (size_t)steps * V * sizeof(float)))
                T_FAIL("%s at budget 400%s: logits differ from dense",
                       pgd_budget_method_name((pgd_budget_method)m), ref ? " (attn_ref)" : "");
            pgd_seq_destroy(pe_ctx_cache(c), s);
            pgd_budget_destroy(b);
        }
        T_EQ(pgd_cache_check(pe_ctx_cache(c)), PGD_OK);
        pe_ctx_destroy(c);
    }
    free(dense);
    free(lg);
    return 0;
}

/* ---- streaming: pages bounded, positions continue, a manual reference ---- */

typedef struct stream_check {
    uint32_t max_pages;
} stream_check;

static int check_stream(void *ud, pe_ctx *c, pgd_seq *s, uint32_t tokens)
{
    stream_check *sc = ud;
    const uint32_t *ids;
    uint64_t len = pgd_seq_length(pe_ctx_cache(c), s);
    uint32_t pages = pgd_seq_pages(pe_ctx_cache(c), s, &ids);
    if (pages > sc->max_pages)
        T_FAIL("%u tokens: %u pages held, at most %u", tokens, pages, sc->max_pages);
    /* positions continue: slots + dropped = the tokens run */
    T_EQ(len + pgd_seq_n_dropped(pe_ctx_cache(c), s), tokens);
    if (tokens > BUDGET + PT - 1 && len > BUDGET + PT - 1)
        T_FAIL("%u tokens: %llu slots, above budget + page - 1", tokens, (unsigned long long)len);
    return 0;
}

/* The manual reference: plain pe_forward, compacted by hand as budget.h says streaming
 * does (online, at page granularity: at budget + page_tokens slots, keep the sinks and
 * the newest budget - sinks). */
static int manual_streaming(pe_ctx *c, const int32_t *toks, uint32_t np, uint32_t gen, float *lg)
{
    const uint32_t V = n_vocab();
    pgd_cache *cache = pe_ctx_cache(c);
    const pe_hparams *hp = pe_model_hparams(g_model);
    const uint32_t n_lists = hp->n_layer * hp->n_head_kv;
    pgd_seq *s;
    uint32_t *keep = malloc((size_t)n_lists * BUDGET * sizeof *keep), step = 0;
    T_ASSERT(keep);
    T_OK(pgd_seq_create(cache, "manual", 6, &s));
    for (uint32_t t = 0; t < np + gen; step++) {
        uint32_t n = t < np ? (np - t < CHUNK ? np - t : CHUNK) : 1;
        T_EQ(pe_forward(c, s, toks + t, n, lg + (size_t)step * V, 0), 0);
        t += n;
        uint64_t len = pgd_seq_length(cache, s);
        if (len >= BUDGET + PT) {
            for (uint32_t i = 0; i < n_lists; i++) /* every (layer, KV head) alike */
                for (uint32_t j = 0; j < BUDGET; j++)
                    keep[(size_t)i * BUDGET + j] = j < SINKS ? j : (uint32_t)(len - BUDGET + j);
            T_OK(pgd_seq_compact(cache, s, BUDGET, keep, BUDGET, NULL));
        }
    }
    pgd_seq_destroy(cache, s);
    free(keep);
    return 0;
}

static int test_streaming_pages(void)
{
    const uint32_t V = n_vocab(), steps = n_steps(PROMPT, GEN);
    uint64_t seed = 7;
    int32_t toks[PROMPT + GEN], dense_toks[PROMPT + GEN];
    float *lg = malloc((size_t)steps * V * sizeof(float));
    float *ref = malloc((size_t)steps * V * sizeof(float));
    T_ASSERT(lg && ref);
    random_tokens(&seed, toks, PROMPT);
    memcpy(dense_toks, toks, sizeof toks);
    pe_ctx_params p = fwd_params();

    /* dense: the pages the pool holds at the end */
    pe_ctx *c = sched_ctx_create(&p);
    T_ASSERT(c);
    pgd_seq *s;
    pgd_cache_stats dense_st, st;
    T_OK(pgd_seq_create(pe_ctx_cache(c), NULL, 0, &s));
    T_OK(generate(c, s, NULL, dense_toks, PROMPT, GEN, lg, NULL, NULL));
    pgd_cache_get_stats(pe_ctx_cache(c), &dense_st);
    pgd_seq_destroy(pe_ctx_cache(c), s);
    pe_ctx_destroy(c);

    /* streaming 64 */
    c = sched_ctx_create(&p);
    T_ASSERT(c);
    pgd_budget_params bp = pgd_budget_default_params(PGD_BUDGET_STREAMING, BUDGET);
    T_EQ(bp.sinks, SINKS);
    pgd_budget *b;
    T_OK(pgd_budget_create(pe_ctx_cache(c), &bp, &b));
    T_OK(pgd_seq_create(pe_ctx_cache(c), NULL, 0, &s));
    stream_check sc = {(BUDGET + PT + PT - 1) / PT};
    T_OK(generate(c, s, b, toks, PROMPT, GEN, lg, check_stream, &sc));
    pgd_cache_get_stats(pe_ctx_cache(c), &st);
    T_ASSERT(all_finite(lg, (size_t)steps * V));
    uint64_t dropped = pgd_seq_n_dropped(pe_ctx_cache(c), s);
    T_EQ(dropped + pgd_seq_length(pe_ctx_cache(c), s), PROMPT + GEN);
    T_ASSERT(dropped >= PROMPT + GEN - (BUDGET + PT - 1));
    pgd_budget_stats bs;
    pgd_budget_get_stats(b, &bs);
    T_EQ(bs.dropped_tokens, dropped);
    T_ASSERT(bs.compactions > 0 && bs.freed_pages > 0);
    printf("streaming %d: %u pages used (dense %u), %llu dropped, %llu compactions, %llu "
           "pages freed\n",
           BUDGET, st.n_pages_used, dense_st.n_pages_used, (unsigned long long)dropped,
           (unsigned long long)bs.compactions, (unsigned long long)bs.freed_pages);
    T_ASSERT(st.n_pages_used < dense_st.n_pages_used);
    T_ASSERT(st.n_pages_used <= sc.max_pages);
    T_EQ(pgd_cache_check(pe_ctx_cache(c)), PGD_OK);
    pgd_seq_destroy(pe_ctx_cache(c), s);
    pgd_budget_destroy(b);

    /* the manual reference on the same tokens (the budget run's greedy output) */
    T_OK(manual_streaming(c, toks, PROMPT, GEN, ref));
    for (uint32_t k = 0; k < steps; k++)
        if (memcmp(lg + (size_t)k * V, ref + (size_t)k * V, V * sizeof(float)))
            T_FAIL("step %u: the budget's logits differ from the manual compaction's", k);
    pe_ctx_destroy(c);
    free(lg);
    free(ref);
    return 0;
}

/* ---- snapkv: once, at the prompt's end ---- */

typedef struct snap_check {
    uint32_t np;
} snap_check;

static int check_snap(void *ud, pe_ctx *c, pgd_seq *s, uint32_t tokens)
{
    const snap_check *sc = ud;
    uint64_t len = pgd_seq_length(pe_ctx_cache(c), s);
    uint64_t dropped = pgd_seq_n_dropped(pe_ctx_cache(c), s);
    T_EQ(len + dropped, tokens);
    if (tokens < sc->np) {
        T_EQ(dropped, 0); /* no compression before the prompt's end */
    } else {
        T_EQ(dropped, sc->np - BUDGET); /* once, to the budget, then one slot per token */
        T_EQ(len, BUDGET + (tokens - sc->np));
    }
    return 0;
}

static int test_snapkv_once(void)
{
    enum { gen = 20 };
    const uint32_t V = n_vocab(), steps = n_steps(PROMPT, gen);
    uint64_t seed = 9;
    int32_t toks[PROMPT + gen];
    float *lg = malloc((size_t)steps * V * sizeof(float));
    T_ASSERT(lg);
    random_tokens(&seed, toks, PROMPT);
    pe_ctx_params p = fwd_params();
    p.budget = pgd_budget_default_params(PGD_BUDGET_SNAPKV, BUDGET); /* the context's */
    pe_ctx *c = sched_ctx_create(&p);
    T_ASSERT(c);
    pgd_budget *b;
    pgd_seq *s;
    T_OK(pgd_budget_create(pe_ctx_cache(c), &pe_ctx_params_get(c)->budget, &b));
    T_OK(pgd_seq_create(pe_ctx_cache(c), NULL, 0, &s));
    snap_check sc = {PROMPT};
    T_OK(generate(c, s, b, toks, PROMPT, gen, lg, check_snap, &sc));
    T_ASSERT(all_finite(lg, (size_t)steps * V));
    pgd_budget_stats bs;
    pgd_budget_get_stats(b, &bs);
    T_EQ(bs.compactions, 1);
    T_EQ(bs.dropped_tokens, PROMPT - BUDGET);
    T_EQ(pe_ctx_budget_failures(c, NULL), 0);
    T_EQ(pgd_cache_check(pe_ctx_cache(c)), PGD_OK);
    pgd_seq_destroy(pe_ctx_cache(c), s);
    pgd_budget_destroy(b);
    pe_ctx_destroy(c);
    free(lg);
    return 0;
}

/* ---- every codec, and Quest ---- */

static int test_codecs_quest(void)
{
    static const pgd_kv_type kinds[] = {PGD_KV_F16, PGD_KV_BF16, PGD_KV_Q8_0, PGD_KV_Q4_0,
                                        PGD_KV_KIVI2};
    enum { np = 200, gen = 30 };
    const uint32_t V = n_vocab(), steps = n_steps(np, gen);
    float *lg = malloc((size_t)steps * V * sizeof(float));
    T_ASSERT(lg);
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0] * 2; k++) {
        pe_ctx_params p = fwd_params();
        p.kv_type = kinds[k / 2];
        p.kv_select_pages = k % 2 ? 3 : 0; /* Quest: 3 pages per decode row */
        pe_ctx *c = sched_ctx_create(&p);
        T_ASSERT(c);
        for (int m = PGD_BUDGET_STREAMING; m < PGD_BUDGET_COUNT; m++) {
            uint64_t seed = 21;
            int32_t toks[np + gen];
            random_tokens(&seed, toks, np);
            pgd_budget_params bp = pgd_budget_default_params((pgd_budget_method)m, BUDGET);
            pgd_budget *b;
            pgd_seq *s;
            T_OK(pgd_budget_create(pe_ctx_cache(c), &bp, &b));
            T_OK(pgd_seq_create(pe_ctx_cache(c), NULL, 0, &s));
            T_OK(generate(c, s, b, toks, np, gen, lg, NULL, NULL));
            uint64_t len = pgd_seq_length(pe_ctx_cache(c), s);
            uint64_t dropped = pgd_seq_n_dropped(pe_ctx_cache(c), s);
            if (!all_finite(lg, (size_t)steps * V) || len + dropped != np + gen || !dropped)
                T_FAIL("%s, %s, select %u: %llu slots, %llu dropped",
                       pgd_budget_method_name((pgd_budget_method)m), pgd_kv_type_name(p.kv_type),
                       p.kv_select_pages, (unsigned long long)len, (unsigned long long)dropped);
            T_EQ(pgd_cache_check(pe_ctx_cache(c)), PGD_OK);
            pgd_seq_destroy(pe_ctx_cache(c), s);
            pgd_budget_destroy(b);
        }
        T_EQ(pe_ctx_budget_failures(c, NULL), 0);
        pe_ctx_destroy(c);
    }
    free(lg);
    return 0;
}

/* ---- the scheduler: budget + prefix cache ---- */

#define SHARED 160 /* 10 pages of shared prefix */

static int submit(pe_sched *s, const pgd_budget_params *bp, const int32_t *prompt, uint32_t n,
                  uint32_t gen, out *o)
{
    pe_request_params rp = greedy(gen);
    uint64_t id;
    rp.budget = bp;
    memset(o, 0, sizeof *o);
    T_OK(pe_sched_submit(s, &rp, prompt, n, on_token, o, &id));
    return 0;
}

static int test_sched_prefix(void)
{
    uint64_t seed = 13;
    int32_t dense_prompt[SHARED + 20], budget_prompt[SHARED + 30];
    static out solo, d1, a, d2;
    random_tokens(&seed, dense_prompt, SHARED + 20);
    memcpy(budget_prompt, dense_prompt, SHARED * sizeof(int32_t));
    random_tokens(&seed, budget_prompt + SHARED, 30);
    pgd_budget_params none = pgd_budget_default_params(PGD_BUDGET_NONE, 0);
    pgd_budget_params bp = pgd_budget_default_params(PGD_BUDGET_STREAMING, BUDGET);

    /* the dense request alone on a fresh context: the output to match */
    pe_ctx_params p = sched_ctx_params(4096);
    p.budget_scores = 1;
    T_OK(sched_run_alone(sched_ctx_create(&p), dense_prompt, SHARED + 20, 40, &solo));

    pe_ctx *c = sched_ctx_create(&p);
    T_ASSERT(c);
    pe_sched *s = sched_create(c, 4, 8, 0);
    T_ASSERT(s);
    /* d1 dense, then a (streaming) on the same prefix, then the dense prompt again */
    T_OK(submit(s, &none, dense_prompt, SHARED + 20, 40, &d1));
    T_OK(pe_sched_run_until_idle(s));
    pgd_cache_stats st0, st1;
    pgd_cache_get_stats(pe_ctx_cache(c), &st0);
    T_OK(submit(s, &bp, budget_prompt, SHARED + 30, 60, &a));
    T_OK(pe_sched_run_until_idle(s));
    pgd_cache_get_stats(pe_ctx_cache(c), &st1);
    T_EQ(a.n_final, 1);
    T_EQ(a.finish, PE_FINISH_LENGTH);
    T_EQ(a.n, 60);
    T_ASSERT(a.u.cached_tokens >= SHARED); /* the budget request matched the prefix */
    T_EQ(a.u.kv_budget_method, PGD_BUDGET_STREAMING);
    T_EQ(a.u.kv_budget, BUDGET);
    T_EQ(a.u.kv_budget_dropped + a.u.kv_slots, SHARED + 30 + 60 - 1);
    T_ASSERT(a.u.kv_budget_dropped > 0 && a.u.kv_slots < BUDGET + PT);
    T_ASSERT(st1.n_compactions > st0.n_compactions);
    T_EQ(d1.u.kv_budget_method, PGD_BUDGET_NONE);
    T_EQ(d1.u.kv_budget_dropped, 0);

    /* the dense prompt again, in one batch with an h2o request on the same prefix */
    static out a2;
    pgd_budget_params h2o = pgd_budget_default_params(PGD_BUDGET_H2O, BUDGET);
    T_OK(submit(s, &none, dense_prompt, SHARED + 20, 40, &d2));
    T_OK(submit(s, &h2o, budget_prompt, SHARED + 30, 40, &a2));
    T_OK(pe_sched_run_until_idle(s));
    T_EQ(d2.n, 40);
    T_EQ(a2.n, 40);
    T_EQ(a2.u.kv_budget_method, PGD_BUDGET_H2O);
    T_ASSERT(a2.u.kv_budget_dropped > 0);
    T_ASSERT(d2.u.cached_tokens >= SHARED); /* the shared pages survived the compaction */
    if (memcmp(d2.toks, solo.toks, 40 * sizeof(int32_t)) ||
        memcmp(d1.toks, solo.toks, 40 * sizeof(int32_t)))
        T_FAIL("the dense request's output changed next to a budget request");
    T_EQ(pgd_cache_check(pe_ctx_cache(c)), PGD_OK);
    pe_sched_destroy(s);
    pe_ctx_destroy(c);
    return 0;
}

/* ---- the scheduler: budget + preemption ---- */

#define N_PRE 4

static int test_sched_preemption(void)
{
    uint64_t seed = 17;
    int32_t prompts[N_PRE][40];
    static out o[N_PRE];
    pgd_budget_params bp = pgd_budget_default_params(PGD_BUDGET_STREAMING, BUDGET);
    /* each request peaks at 64 + 15 + 1 slots (5 or 6 pages); 12 pages hold two */
    pe_ctx_params p = sched_ctx_params(12 * PT);
    p.budget = bp;
    pe_ctx *c = sched_ctx_create(&p);
    T_ASSERT(c);
    pe_sched *s = sched_create(c, N_PRE, 8, 32); /* chunks of 32: the recomputes compact */
    T_ASSERT(s);
    for (int i = 0; i < N_PRE; i++) {
        random_tokens(&seed, prompts[i], 40);
        T_OK(submit(s, NULL, prompts[i], 40, 120, &o[i])); /* NULL: the context's budget */
    }
    pe_sched_stats st;
    for (int n = 0; n < 20000; n++) {
        int rc = pe_sched_step(s);
        T_OK(rc);
        T_EQ(pgd_cache_check(pe_ctx_cache(c)), PGD_OK);
        pe_sched_get_stats(s, &st);
        if (rc == 0 && st.n_running + st.n_waiting == 0) break;
    }
    T_EQ(st.n_running + st.n_waiting, 0);
    printf("budget, small pool: %llu preemptions\n", (unsigned long long)st.n_preemptions);
    T_ASSERT(st.n_preemptions > 0);
    for (int i = 0; i < N_PRE; i++) {
        T_EQ(o[i].n_final, 1);
        T_EQ(o[i].finish, PE_FINISH_LENGTH);
        T_EQ(o[i].n, 120);
        for (uint32_t k = 0; k < o[i].n; k++)
            T_ASSERT(o[i].toks[k] >= 0 && (uint32_t)o[i].toks[k] < n_vocab());
        T_EQ(o[i].u.kv_budget_method, PGD_BUDGET_STREAMING);
        T_ASSERT(o[i].u.kv_budget_dropped > 0);
        T_ASSERT(o[i].u.kv_slots < BUDGET + PT);
    }
    pe_sched_destroy(s);
    pe_ctx_destroy(c);
    return 0;
}

/* ---- the scheduler: snapkv's compaction retried when it found no page ---- */

static int test_sched_snapkv_retry(void)
{
    uint64_t seed = 19;
    int32_t pa[100], pb[90];
    static out oa, ob;
    random_tokens(&seed, pa, 100);
    random_tokens(&seed, pb, 90);
    pgd_budget_params none = pgd_budget_default_params(PGD_BUDGET_NONE, 0);
    pgd_budget_params snap = pgd_budget_default_params(PGD_BUDGET_SNAPKV, 32);
    /* 13 pages: a (dense, 100 + 2 slots: 7 pages) and b (snapkv 32, 90 + 5 slots: 6 pages)
     * fill the pool, so b's compaction at its prompt's end finds no page for its copies;
     * once a finishes, its pages are evictable and the retry compacts b */
    pe_ctx_params p = sched_ctx_params(13 * PT);
    p.budget_scores = 1;
    p.log = NULL; /* the expected failed compaction */
    pe_ctx *c = sched_ctx_create(&p);
    T_ASSERT(c);
    pe_sched *s = sched_create(c, 2, 4, 0);
    T_ASSERT(s);
    T_OK(submit(s, &none, pa, 100, 3, &oa));
    T_OK(submit(s, &snap, pb, 90, 6, &ob));
    T_OK(pe_sched_run_until_idle(s));
    pe_sched_stats st;
    pe_sched_get_stats(s, &st);
    T_EQ(st.n_preemptions, 0);
    T_ASSERT(pe_ctx_budget_failures(c, NULL) >= 1);
    T_EQ(oa.n, 3);
    T_EQ(ob.n, 6);
    T_EQ(ob.finish, PE_FINISH_LENGTH);
    T_EQ(ob.u.kv_budget_method, PGD_BUDGET_SNAPKV);
    T_EQ(ob.u.kv_budget_dropped + ob.u.kv_slots, 90 + 6 - 1);
    /* compacted once, late: to 32 slots plus the tokens run since */
    T_ASSERT(ob.u.kv_budget_dropped > 0 && ob.u.kv_slots < 32 + 6);
    T_EQ(pgd_cache_check(pe_ctx_cache(c)), PGD_OK);
    pe_sched_destroy(s);
    pe_ctx_destroy(c);
    return 0;
}

/* ---- bad values ---- */

static int ctx_refused(const pe_ctx_params *p, const char *want)
{
    char err[256] = "";
    pe_ctx *c = NULL;
    if (pe_ctx_create(g_model, p, &c, err, sizeof err) == 0) {
        pe_ctx_destroy(c);
        T_FAIL("pe_ctx_create accepted a budget it should refuse (%s)", want);
    }
    if (!strstr(err, want)) T_FAIL("error '%s' does not name '%s'", err, want);
    if (strchr(err, '\n')) T_FAIL("error '%s' is more than one line", err);
    return 0;
}

static int test_bad_values(void)
{
    pe_ctx_params p = fwd_params();
    p.budget = pgd_budget_default_params(PGD_BUDGET_H2O, 64);
    p.budget.budget = 0;
    T_OK(ctx_refused(&p, "kv_budget 0"));
    p.budget = pgd_budget_default_params(PGD_BUDGET_H2O, 64);
    p.budget.window = 65;
    T_OK(ctx_refused(&p, "kv_budget 64"));
    p.budget = pgd_budget_default_params(PGD_BUDGET_SNAPKV, 64);
    p.budget.pool_kernel = 4;
    T_OK(ctx_refused(&p, "pool_kernel"));
    p.budget = pgd_budget_default_params(PGD_BUDGET_H2O, 64);
    p.contiguous_ref = 1;
    T_OK(ctx_refused(&p, "contiguous"));

    /* submit: a bad request budget; a budget where the context cannot score */
    int32_t prompt[8] = {1, 5, 6, 7, 8, 9, 10, 11};
    out o;
    uint64_t id;
    pe_request_params rp = greedy(4);
    pgd_budget_params bad = pgd_budget_default_params(PGD_BUDGET_TOVA, 64);
    bad.budget = 0;
    rp.budget = &bad;
    p = fwd_params();
    pe_ctx *c = sched_ctx_create(&p);
    T_ASSERT(c);
    pe_sched *s = sched_create(c, 2, 2, 0);
    T_ASSERT(s);
    T_EQ(pe_sched_submit(s, &rp, prompt, 8, on_token, &o, &id), PGD_EINVAL);
    bad = pgd_budget_default_params(PGD_BUDGET_ADAKV, 64);
    bad.adakv_cap = 0.5f;
    T_EQ(pe_sched_submit(s, &rp, prompt, 8, on_token, &o, &id), PGD_EINVAL);
    bad = pgd_budget_default_params(PGD_BUDGET_COUNT, 64);
    T_EQ(pe_sched_submit(s, &rp, prompt, 8, on_token, &o, &id), PGD_EINVAL);

    /* the forward pass: prompt_left below the chunk */
    pgd_budget_params good = pgd_budget_default_params(PGD_BUDGET_H2O, 64);
    pgd_budget *b;
    pgd_seq *seq;
    T_OK(pgd_budget_create(pe_ctx_cache(c), &good, &b));
    T_OK(pgd_seq_create(pe_ctx_cache(c), NULL, 0, &seq));
    T_EQ(pe_forward_budget(c, seq, b, prompt, 8, 3, NULL, 0), PGD_EINVAL);
    T_EQ(pgd_seq_length(pe_ctx_cache(c), seq), 0);
    T_EQ(pe_forward_budget(c, seq, b, prompt, 8, 8, NULL, 0), 0);
    pgd_seq_destroy(pe_ctx_cache(c), seq);
    pgd_budget_destroy(b);
    pe_sched_destroy(s);
    pe_ctx_destroy(c);

    /* no scoring scratch (budget none, budget_scores 0): submit refuses a budget, the
     * forward pass a scored one; the contiguous reference refuses any */
    p = fwd_params();
    p.budget_scores = 0;
    c = sched_ctx_create(&p);
    T_ASSERT(c);
    s = sched_create(c, 2, 2, 0);
    T_ASSERT(s);
    rp.budget = &good;
    T_EQ(pe_sched_submit(s, &rp, prompt, 8, on_token, &o, &id), PGD_EINVAL);
    rp.budget = NULL; /* the context's: none, dense */
    T_OK(pe_sched_submit(s, &rp, prompt, 8, on_token, &o, &id));
    pe_sched_destroy(s);
    T_OK(pgd_budget_create(pe_ctx_cache(c), &good, &b));
    T_OK(pgd_seq_create(pe_ctx_cache(c), NULL, 0, &seq));
    T_EQ(pe_forward_budget(c, seq, b, prompt, 8, 8, NULL, 0), PGD_EINVAL);
    T_EQ(pgd_seq_length(pe_ctx_cache(c), seq), 0);
    pgd_seq_destroy(pe_ctx_cache(c), seq);
    pgd_budget_destroy(b);
    pe_ctx_destroy(c);

    p = fwd_params();
    p.contiguous_ref = 1;
    c = sched_ctx_create(&p);
    T_ASSERT(c);
    T_OK(pgd_budget_create(pe_ctx_cache(c), &good, &b));
    T_OK(pgd_seq_create(pe_ctx_cache(c), NULL, 0, &seq));
    T_EQ(pe_forward_budget(c, seq, b, prompt, 8, 8, NULL, 0), PGD_EINVAL);
    T_EQ(pe_forward_budget(c, seq, NULL, prompt, 8, 0, NULL, 0), 0);
    pgd_seq_destroy(pe_ctx_cache(c), seq);
    pgd_budget_destroy(b);
    pe_ctx_destroy(c);
    return 0;
}

int main(int argc, char **argv)
{
    int rc = sched_fixture_load(argc, argv);
    if (rc) return rc;
    T_RUN(test_bad_values);
    T_RUN(test_large_budget_is_dense);
    T_RUN(test_streaming_pages);
    T_RUN(test_snapkv_once);
    T_RUN(test_codecs_quest);
    T_RUN(test_sched_prefix);
    T_RUN(test_sched_preemption);
    T_RUN(test_sched_snapkv_retry);
    pe_model_destroy(g_model);
    T_DONE();
}
