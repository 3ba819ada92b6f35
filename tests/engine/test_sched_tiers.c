/* SPDX-License-Identifier: MIT */
/*
 * test_sched_tiers.c - the scheduler (engine/runtime/scheduler.c) over a cache with storage
 * tiers, on stories260K (f32 KV, batch-invariant products, so a cached prefix gives the
 * very tokens a cold run gives):
 *   - a request whose prefix is only in the RAM tier (computed, then evicted from the pool
 *     into the tier) is admitted with its whole pages cached from "ram" (pe_usage:
 *     cached_tier_tokens[0], nothing from the pool) and produces a cold run's tokens;
 *   - a request whose promotion is not done yet (a tier whose get is held back) is left
 *     out of the batch while another request keeps decoding; once the fills are let go it
 *     finishes with a cold run's tokens;
 *   - a damaged record (a wrapped tier whose get fails for one block, as a checksum
 *     failure does) cuts the match back to the pages before it: the rest is computed and
 *     the output is still a cold run's; usage counts only what was really promoted;
 *   - preemption with a RAM tier parks pages (swap) and counts it; without tiers every
 *     preemption is a recompute; either way every request gets its solo output;
 *   - prefetch on submit: a prefix only in a disk tier (written by another context with
 *     the disk tier's key, the tier reopened) is moved up into the RAM tier in front of it
 *     when the request is queued, and the request gets it as cached tokens and a cold
 *     run's output.
 * Model: argv[1], else $PGD_MODELS_DIR/stories260K.gguf, else ../shared/models beside the
 * source tree; skipped (77) when none is found.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "sched_fixture.h"
#include "t_tier.h"

/* ---- a wrapped RAM tier: get can be held back (a gate) or fail for one block ---- */

typedef struct wrap {
    pgd_tier *inner; /* a real RAM tier */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int gate_closed; /* get waits while set */
    int fail_set;    /* get of fail_block fails as a damaged record does */
    pgd_hash fail_block;
    uint64_t n_gets, n_failed;
} wrap;

static int w_get(void *st, pgd_hash b, void *page, void *bounds)
{
    wrap *w = st;
    pthread_mutex_lock(&w->mu);
    while (w->gate_closed)
        pthread_cond_wait(&w->cv, &w->mu);
    w->n_gets++;
    int fail = w->fail_set && pgd_hash_eq(b, w->fail_block);
    if (fail) w->n_failed++;
    pthread_mutex_unlock(&w->mu);
    if (fail) return PGD_ENOTFOUND; /* damaged: dropped, a miss */
    return pgd_tier_get(w->inner, b, page, bounds);
}
static void w_close(void *st)
{
    (void)st; /* the test closes the inner tier itself */
}

static const pgd_tier_ops wrap_ops = {"ram",
                                      t_tier_fwd_bind,
                                      t_tier_fwd_put,
                                      w_get,
                                      t_tier_fwd_lookup,
                                      t_tier_fwd_del,
                                      t_tier_fwd_stats,
                                      t_tier_fwd_flush,
                                      w_close,
                                      NULL,
                                      NULL};

static void gate(wrap *w, int closed)
{
    pthread_mutex_lock(&w->mu);
    w->gate_closed = closed;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* ---- contexts ---- */

typedef struct rig {
    pgd_tier *ram;  /* the real RAM tier */
    pgd_tier *tier; /* what the cache sees: ram itself, or the wrapper around it */
    wrap w;
    pgd_tier_use use;
    pe_ctx *ctx;
    pe_sched *s;
} rig;

static const uint8_t *g_key; /* hash key of the contexts make_ctx creates; NULL: random */

static pe_ctx *make_ctx(uint64_t kv_tokens, const pgd_tier_use *use, uint32_t n_use)
{
    pe_ctx_params p = sched_ctx_params(kv_tokens);
    p.deterministic = 1;
    p.tiers = use;
    p.n_tiers = n_use;
    p.hash_key = g_key;
    p.hash_key_len = g_key ? 32 : 0;
    return sched_ctx_create(&p);
}

static pe_sched *make_sched(pe_ctx *c, uint32_t max_running)
{
    return sched_create(c, max_running, 16, 0);
}

/* A context with one RAM tier of 4 MiB (wrapped when wrapped is set), and a scheduler. */
static int rig_open(rig *r, int wrapped, uint64_t kv_tokens, uint32_t max_running)
{
    memset(r, 0, sizeof *r);
    pgd_tier_ram_params rp = pgd_tier_ram_default_params();
    rp.capacity_bytes = 4u << 20;
    T_OK(pgd_tier_ram_create(&rp, &r->ram));
    r->tier = r->ram;
    if (wrapped) {
        r->w.inner = r->ram;
        pthread_mutex_init(&r->w.mu, NULL);
        pthread_cond_init(&r->w.cv, NULL);
        T_OK(pgd_tier_wrap(&wrap_ops, &r->w, &r->tier));
    }
    r->use.tier = r->tier;
    r->ctx = make_ctx(kv_tokens, &r->use, 1);
    T_ASSERT(r->ctx);
    r->s = make_sched(r->ctx, max_running);
    T_ASSERT(r->s);
    return 0;
}

static void rig_close(rig *r)
{
    pe_sched_destroy(r->s);
    pe_ctx_destroy(r->ctx);
    if (r->tier != r->ram) {
        pgd_tier_close(r->tier);
        pthread_mutex_destroy(&r->w.mu);
        pthread_cond_destroy(&r->w.cv);
    }
    pgd_tier_close(r->ram);
}

/* Runs one request alone on a fresh context without tiers; its tokens into *o. */
static int run_cold(const int32_t *prompt, uint32_t n, uint32_t max_tokens, out *o)
{
    if (sched_run_alone(make_ctx(4096, NULL, 0), prompt, n, max_tokens, o)) return 1;
    T_EQ(o->u.cached_tokens, 0);
    T_EQ(o->u.n_tiers, 0);
    return 0;
}

/* Runs prompt to completion on r, then evicts every page from the pool into the tier. */
static int fill_tier(rig *r, const int32_t *prompt, uint32_t n, uint32_t max_tokens)
{
    out o;
    if (sched_run_one(r->s, prompt, n, max_tokens, &o)) return 1;
    pgd_cache *c = pe_ctx_cache(r->ctx);
    T_ASSERT(pgd_cache_clear(c) > 0);
    T_OK(pgd_cache_flush(c));
    pgd_cache_stats cs;
    pgd_cache_get_stats(c, &cs);
    T_EQ(cs.n_pages_cached, 0);
    pgd_tier_stats ts;
    pgd_tier_get_stats(r->ram, &ts);
    T_ASSERT(ts.n_records >= n / 16);
    return 0;
}

#define PROMPT 100
#define GEN 24

static int test_prefix_from_ram(void)
{
    uint64_t seed = 5;
    int32_t prompt[PROMPT];
    out cold, warm;
    random_tokens(&seed, prompt, PROMPT);
    prompt[0] = 1;
    T_OK(run_cold(prompt, PROMPT, GEN, &cold));
    rig r;
    T_OK(rig_open(&r, 0, 4096, 4));
    T_OK(fill_tier(&r, prompt, PROMPT, GEN));
    if (sched_run_one(r.s, prompt, PROMPT, GEN, &warm)) return 1;
    /* All but the last token are matched: 99 tokens, 6 whole pages. */
    T_EQ(warm.u.cached_tokens, 96);
    T_EQ(warm.u.n_tiers, 1);
    T_EQ(warm.u.cached_tier_tokens[0], 96);
    T_EQ(warm.u.cached_pool_tokens, 0);
    T_EQ(warm.u.prompt_tokens, PROMPT);
    if (memcmp(warm.toks, cold.toks, GEN * sizeof(int32_t)))
        T_FAIL("the output from the RAM tier's pages differs from a cold run's");
    pgd_cache_tier_stats cts;
    T_OK(pgd_cache_get_tier_stats(pe_ctx_cache(r.ctx), 0, &cts));
    T_EQ(cts.hit_tokens, 96);
    T_EQ(cts.promoted_pages, 6);
    pe_sched_stats st;
    pe_sched_get_stats(r.s, &st);
    T_EQ(st.n_prompt_tokens_cached, 96);
    T_OK(pgd_cache_check(pe_ctx_cache(r.ctx)));
    rig_close(&r);
    return 0;
}

static int test_not_ready_left_out(void)
{
    uint64_t seed = 7;
    int32_t prompt[PROMPT], other[40];
    out cold, a, b;
    random_tokens(&seed, prompt, PROMPT);
    random_tokens(&seed, other, 40);
    T_OK(run_cold(prompt, PROMPT, GEN, &cold));
    rig r;
    T_OK(rig_open(&r, 1, 4096, 4));
    T_OK(fill_tier(&r, prompt, PROMPT, GEN));
    pe_request_params rp = greedy(100);
    uint64_t id;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    T_OK(pe_sched_submit(r.s, &rp, other, 40, on_token, &a, &id));
    T_OK(pe_sched_step(r.s)); /* a's prefill */
    T_OK(pe_sched_step(r.s));
    gate(&r.w, 1);
    rp = greedy(GEN);
    T_OK(pe_sched_submit(r.s, &rp, prompt, PROMPT, on_token, &b, &id));
    uint32_t a_before = a.n;
    for (int i = 0; i < 6; i++) {
        T_OK(pe_sched_step(r.s));
        pe_sched_stats st;
        pe_sched_get_stats(r.s, &st);
        T_EQ(st.n_running, 2); /* b is admitted, its pages allocated */
    }
    T_EQ(a.n, a_before + 6); /* a decoded every step */
    T_EQ(b.n, 0);            /* b waited for its fills */
    gate(&r.w, 0);
    T_OK(pe_sched_run_until_idle(r.s));
    T_EQ(b.n_final, 1);
    T_EQ(b.u.cached_tokens, 96);
    T_EQ(b.u.cached_tier_tokens[0], 96);
    if (memcmp(b.toks, cold.toks, GEN * sizeof(int32_t)))
        T_FAIL("the output after a held-back promotion differs from a cold run's");
    T_OK(pgd_cache_check(pe_ctx_cache(r.ctx)));
    rig_close(&r);
    return 0;
}

static int test_damaged_record_falls_back(void)
{
    uint64_t seed = 9;
    int32_t prompt[PROMPT];
    pgd_hash h[PROMPT / 16];
    out cold, warm;
    random_tokens(&seed, prompt, PROMPT);
    T_OK(run_cold(prompt, PROMPT, GEN, &cold));
    rig r;
    T_OK(rig_open(&r, 1, 4096, 4));
    T_OK(fill_tier(&r, prompt, PROMPT, GEN));
    T_EQ(pgd_cache_hash_tokens(pe_ctx_cache(r.ctx), NULL, 0, prompt, PROMPT, h, PROMPT / 16),
         PROMPT / 16);
    r.w.fail_set = 1;
    r.w.fail_block = h[2]; /* the third page's record is damaged */
    if (sched_run_one(r.s, prompt, PROMPT, GEN, &warm)) return 1;
    T_EQ(r.w.n_failed, 1);
    /* Cut back to the two pages before the damaged one; the rest was computed. */
    T_EQ(warm.u.cached_tokens, 32);
    T_EQ(warm.u.cached_tier_tokens[0] + warm.u.cached_pool_tokens, 32);
    if (memcmp(warm.toks, cold.toks, GEN * sizeof(int32_t)))
        T_FAIL("the output after a damaged record differs from a cold run's");
    pe_sched_stats st;
    pe_sched_get_stats(r.s, &st);
    T_EQ(st.n_prompt_tokens_cached, 32);
    T_OK(pgd_cache_check(pe_ctx_cache(r.ctx)));
    rig_close(&r);
    return 0;
}

#define N_LONG 6

/* A pool of 128 tokens for 6 requests of 40 + 60: preemption; with_tier: a RAM tier. */
static int preempt_run(int with_tier, pe_sched_stats *st)
{
    uint64_t seed = 37;
    int32_t prompts[N_LONG][40];
    static out alone[N_LONG], batch[N_LONG];
    for (int i = 0; i < N_LONG; i++) {
        random_tokens(&seed, prompts[i], 40);
        T_OK(run_cold(prompts[i], 40, 60, &alone[i]));
    }
    rig r;
    pe_ctx *c;
    pe_sched *s;
    if (with_tier) {
        T_OK(rig_open(&r, 0, 128, 4));
        c = r.ctx;
        s = r.s;
    } else {
        c = make_ctx(128, NULL, 0);
        T_ASSERT(c);
        s = make_sched(c, 4);
        T_ASSERT(s);
    }
    pe_request_params rp = greedy(60);
    for (int i = 0; i < N_LONG; i++) {
        uint64_t id;
        memset(&batch[i], 0, sizeof batch[i]);
        T_OK(pe_sched_submit(s, &rp, prompts[i], 40, on_token, &batch[i], &id));
    }
    for (int n = 0; n < 10000; n++) {
        int rc = pe_sched_step(s);
        T_OK(rc);
        T_EQ(pgd_cache_check(pe_ctx_cache(c)), PGD_OK);
        pe_sched_get_stats(s, st);
        if (rc == 0 && st->n_running + st->n_waiting == 0) break;
    }
    T_EQ(st->n_running + st->n_waiting, 0);
    T_ASSERT(st->n_preemptions > 0);
    T_EQ(st->n_preempt_swap + st->n_preempt_recompute, st->n_preemptions);
    for (int i = 0; i < N_LONG; i++) {
        T_EQ(batch[i].n_final, 1);
        T_EQ(batch[i].n, 60);
        if (memcmp(batch[i].toks, alone[i].toks, 60 * sizeof(int32_t)))
            T_FAIL("request %d: output after preemption (%s) differs from solo", i,
                   with_tier ? "tier" : "no tier");
    }
    if (with_tier) {
        pgd_cache_tier_stats cts;
        T_OK(pgd_cache_get_tier_stats(pe_ctx_cache(c), 0, &cts));
        printf("     with a RAM tier: %" PRIu64 " preemptions, %" PRIu64 " swaps, %" PRIu64
               " pages parked, %" PRIu64 " prompt tokens computed\n",
               st->n_preemptions, st->n_preempt_swap, cts.parked_pages,
               st->n_prompt_tokens_computed);
        rig_close(&r);
    } else {
        printf("     without tiers: %" PRIu64 " preemptions, all recomputed, %" PRIu64
               " prompt tokens computed\n",
               st->n_preemptions, st->n_prompt_tokens_computed);
        pe_sched_destroy(s);
        pe_ctx_destroy(c);
    }
    return 0;
}

static int test_preempt_swap_or_recompute(void)
{
    pe_sched_stats st;
    T_OK(preempt_run(0, &st));
    T_EQ(st.n_preempt_swap, 0);
    T_EQ(st.n_preempt_recompute, st.n_preemptions);
    /* stories260K: a page is 16 tokens x 5 layers x 2 x 32 floats = 20 KiB, a few us to
     * move, against ~0.5 MFLOP per token to recompute: swap wins. */
    T_OK(preempt_run(1, &st));
    T_ASSERT(st.n_preempt_swap > 0);
    return 0;
}

static int open_disk(const char *dir, pgd_tier **tier)
{
    pgd_tier_disk_params dp = pgd_tier_disk_default_params();
    dp.dir = dir;
    dp.capacity_bytes = 16u << 20;
    return pgd_tier_disk_create(&dp, tier);
}

static int test_prefetch_on_submit(void)
{
    static const char dir[] = "sched_tiers.d";
    uint64_t seed = 13;
    int32_t prompt[PROMPT];
    uint8_t key[32];
    out cold, warm;
    pgd_tier *disk, *ram;
    random_tokens(&seed, prompt, PROMPT);
    T_OK(run_cold(prompt, PROMPT, GEN, &cold));
    T_EQ(t_sh("rm -rf sched_tiers.d", (char[64]){0}, 64), 0);

    /* Context 1: the disk tier alone, under its stable key; the pages go to disk. */
    T_OK(open_disk(dir, &disk));
    T_OK(pgd_tier_disk_key(disk, key));
    g_key = key;
    pgd_tier_use u1 = {disk, 0, 0};
    pe_ctx *c1 = make_ctx(4096, &u1, 1);
    T_ASSERT(c1);
    pe_sched *s1 = make_sched(c1, 4);
    T_ASSERT(s1);
    pe_request_params rp = greedy(GEN);
    uint64_t id;
    memset(&warm, 0, sizeof warm);
    T_OK(pe_sched_submit(s1, &rp, prompt, PROMPT, on_token, &warm, &id));
    T_OK(pe_sched_run_until_idle(s1));
    T_ASSERT(pgd_cache_clear(pe_ctx_cache(c1)) > 0);
    T_OK(pgd_cache_flush(pe_ctx_cache(c1)));
    pe_sched_destroy(s1);
    pe_ctx_destroy(c1);
    pgd_tier_close(disk);

    /* Context 2: RAM in front of the reopened disk tier. */
    pgd_tier_ram_params rmp = pgd_tier_ram_default_params();
    rmp.capacity_bytes = 4u << 20;
    T_OK(pgd_tier_ram_create(&rmp, &ram));
    T_OK(open_disk(dir, &disk));
    pgd_tier_use u2[2] = {{ram, 0, 0}, {disk, 0, 0}};
    pe_ctx *c2 = make_ctx(4096, u2, 2);
    T_ASSERT(c2);
    pe_sched *s2 = make_sched(c2, 4);
    T_ASSERT(s2);
    memset(&warm, 0, sizeof warm);
    T_OK(pe_sched_submit(s2, &rp, prompt, PROMPT, on_token, &warm, &id));
    T_OK(pe_sched_run_until_idle(s2));
    T_OK(pgd_cache_flush(pe_ctx_cache(c2)));
    pgd_cache_tier_stats t0, t1;
    T_OK(pgd_cache_get_tier_stats(pe_ctx_cache(c2), 0, &t0));
    T_OK(pgd_cache_get_tier_stats(pe_ctx_cache(c2), 1, &t1));
    printf("     prefetched into ram: %" PRIu64 " pages; promoted from ram %" PRIu64
           ", from disk %" PRIu64 "\n",
           t0.prefetched_pages, t0.promoted_pages, t1.promoted_pages);
    T_EQ(t0.prefetched_pages, 6); /* queued at submit, before the match */
    T_EQ(warm.u.cached_tokens, 96);
    T_EQ(warm.u.n_tiers, 2);
    T_EQ(warm.u.cached_tier_tokens[0] + warm.u.cached_tier_tokens[1], 96);
    if (memcmp(warm.toks, cold.toks, GEN * sizeof(int32_t)))
        T_FAIL("the output from prefetched pages differs from a cold run's");
    pe_sched_destroy(s2);
    pe_ctx_destroy(c2);
    pgd_tier_close(disk);
    pgd_tier_close(ram);
    g_key = NULL;
    return 0;
}

int main(int argc, char **argv)
{
    int rc = sched_fixture_load(argc, argv);
    if (rc) return rc;
    T_RUN(test_prefix_from_ram);
    T_RUN(test_not_ready_left_out);
    T_RUN(test_damaged_record_falls_back);
    T_RUN(test_preempt_swap_or_recompute);
    T_RUN(test_prefetch_on_submit);
    pe_model_destroy(g_model);
    T_DONE();
}
