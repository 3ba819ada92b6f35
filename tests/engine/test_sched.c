/* SPDX-License-Identifier: MIT */
/*
 * test_sched.c - the continuous-batching scheduler (engine/runtime/scheduler.c) on stories260K:
 *   - 8 concurrent greedy requests sharing a 100-token prefix give the tokens each gets
 *     alone, and the prefix is computed once (prefix-aware ordering): computed prompt
 *     tokens = prefix + suffixes (+ at most a page per request), later requests report the
 *     prefix's whole pages as cached;
 *   - cancelling a running request frees its pages at once and reports "cancelled";
 *   - a pool just above one request's need forces preemption; every request still gets
 *     its solo output, and pgd_cache_check passes after every step;
 *   - a full queue refuses with PGD_EBUSY; different salts never share cache;
 *   - no_prefix_cache: identical prompts are computed in full each time, same output,
 *     and share no page (each holds its own, none is deduplicated);
 *   - cancel_all ends every queued and running request and frees their pages at once;
 *   - a request too large for the pool alone finishes with PE_FINISH_ERROR, PGD_ENOSPC;
 *   - fairness under a flood: tenant A submits a request sharing a cached prefix every
 *     step; a cold request of tenant B is admitted at the next free slot (round-robin
 *     between tenants), and a cold request of tenant A itself within max_wait_steps plus
 *     a slot's turnaround (aging).
 * The KV cache is f32, so batched and solo logits differ only in summation order.
 * Model: argv[1], else $PGD_MODELS_DIR/stories260K.gguf, else ../shared/models beside the
 * source tree; skipped (77) when none is found.
 */
#include <stdlib.h>
#include <string.h>

#include "sched_fixture.h"

static pe_ctx *make_ctx(uint64_t kv_tokens)
{
    pe_ctx_params p = sched_ctx_params(kv_tokens);
    return sched_ctx_create(&p);
}

/* Runs one request alone on a fresh context; its tokens into *o. */
static int run_alone(const int32_t *prompt, uint32_t n, uint32_t max_tokens, out *o)
{
    if (sched_run_alone(make_ctx(4096), prompt, n, max_tokens, o)) return 1;
    T_EQ(o->finish, PE_FINISH_LENGTH);
    return 0;
}

#define N_SHARED 8
#define PREFIX 100

static int test_shared_prefix(void)
{
    uint64_t seed = 11;
    int32_t prompts[N_SHARED][PREFIX + 16];
    uint32_t lens[N_SHARED], sum_suffix = 0;
    static out alone[N_SHARED], batch[N_SHARED];
    random_tokens(&seed, prompts[0], PREFIX);
    prompts[0][0] = 1;
    for (int i = 0; i < N_SHARED; i++) {
        uint32_t suf = 4 + (uint32_t)(t_rand(&seed) % 12);
        memcpy(prompts[i], prompts[0], PREFIX * sizeof(int32_t));
        random_tokens(&seed, prompts[i] + PREFIX, suf);
        lens[i] = PREFIX + suf;
        sum_suffix += suf;
        T_OK(run_alone(prompts[i], lens[i], 24, &alone[i]));
    }

    pe_ctx *c = make_ctx(4096);
    T_ASSERT(c);
    pe_sched *s = sched_create(c, 16, 16, 32); /* chunked prefill: 32 tokens per step */
    T_ASSERT(s);
    pe_request_params rp = greedy(24);
    for (int i = 0; i < N_SHARED; i++) {
        uint64_t id;
        memset(&batch[i], 0, sizeof batch[i]);
        T_OK(pe_sched_submit(s, &rp, prompts[i], lens[i], on_token, &batch[i], &id));
    }
    while (pe_sched_step(s) > 0)
        T_EQ(pgd_cache_check(pe_ctx_cache(c)), PGD_OK);
    T_OK(pe_sched_run_until_idle(s));
    for (int i = 0; i < N_SHARED; i++) {
        T_EQ(batch[i].n_final, 1);
        T_EQ(batch[i].finish, PE_FINISH_LENGTH);
        T_EQ(batch[i].n, alone[i].n);
        if (memcmp(batch[i].toks, alone[i].toks, alone[i].n * sizeof(int32_t)))
            T_FAIL("request %d: batched tokens differ from solo", i);
        T_EQ(batch[i].u.prompt_tokens, lens[i]);
        T_EQ(batch[i].u.completion_tokens, 24);
    }
    /* One request computed the prefix; the others matched its whole pages. */
    uint32_t n_late = 0, full = PREFIX / 16 * 16;
    for (int i = 0; i < N_SHARED; i++)
        n_late += batch[i].u.cached_tokens >= full;
    T_EQ(n_late, N_SHARED - 1);
    pe_sched_stats st;
    pe_sched_get_stats(s, &st);
    T_ASSERT(st.n_prompt_tokens_computed >= PREFIX + sum_suffix);
    T_ASSERT(st.n_prompt_tokens_computed <= PREFIX + sum_suffix + N_SHARED * 16);
    T_ASSERT(st.n_prompt_tokens_cached >= (N_SHARED - 1) * full);
    T_EQ(st.n_generated_tokens, N_SHARED * 24);
    T_EQ(st.n_preemptions, 0);
    T_EQ(st.n_running + st.n_waiting, 0);
    printf("shared prefix: %u + suffixes %u; computed %" PRIu64 ", cached %" PRIu64 ", %" PRIu64
           " steps\n",
           PREFIX, sum_suffix, st.n_prompt_tokens_computed, st.n_prompt_tokens_cached, st.n_steps);
    T_EQ(pgd_cache_check(pe_ctx_cache(c)), PGD_OK);
    pe_sched_destroy(s);
    pe_ctx_destroy(c);
    return 0;
}

static int test_cancel_frees_pages(void)
{
    uint64_t seed = 23;
    int32_t prompt[60];
    out o, q;
    uint64_t id, id2;
    pgd_cache_stats cs;
    random_tokens(&seed, prompt, 60);
    pe_ctx *c = make_ctx(4096);
    T_ASSERT(c);
    pe_sched *s = sched_create(c, 4, 4, 0);
    T_ASSERT(s);
    pe_request_params rp = greedy(200);
    memset(&o, 0, sizeof o);
    memset(&q, 0, sizeof q);
    T_OK(pe_sched_submit(s, &rp, prompt, 60, on_token, &o, &id));
    for (int i = 0; i < 5; i++)
        T_ASSERT(pe_sched_step(s) > 0);
    T_EQ(o.n, 5);
    pgd_cache_get_stats(pe_ctx_cache(c), &cs);
    T_ASSERT(cs.n_pages_used >= 4);
    T_OK(pe_sched_cancel(s, id));
    pgd_cache_get_stats(pe_ctx_cache(c), &cs);
    T_EQ(cs.n_pages_used, 0); /* released at once, before the next step */
    T_EQ(cs.n_seqs, 0);
    T_EQ(pe_sched_cancel(s, id), PGD_ENOTFOUND);
    /* a queued request is dropped */
    T_OK(pe_sched_submit(s, &rp, prompt, 10, on_token, &q, &id2));
    T_OK(pe_sched_cancel(s, id2));
    T_EQ(pe_sched_step(s), 0); /* delivers the final callbacks */
    T_EQ(o.n_final, 1);
    T_EQ(o.finish, PE_FINISH_CANCELLED);
    T_EQ(o.u.completion_tokens, 5);
    T_EQ(q.n_final, 1);
    T_EQ(q.finish, PE_FINISH_CANCELLED);
    T_EQ(q.n, 0);
    T_EQ(pe_sched_cancel(s, 12345), PGD_ENOTFOUND);
    T_EQ(pgd_cache_check(pe_ctx_cache(c)), PGD_OK);
    pe_sched_destroy(s);
    pe_ctx_destroy(c);
    return 0;
}

#define N_LONG 4

/* Each request needs 40 + 60 = 100 positions (7 pages of 16); the pool holds 8 pages. */
static int test_preemption(void)
{
    uint64_t seed = 37;
    int32_t prompts[N_LONG][40];
    static out alone[N_LONG], batch[N_LONG];
    for (int i = 0; i < N_LONG; i++) {
        random_tokens(&seed, prompts[i], 40);
        T_OK(run_alone(prompts[i], 40, 60, &alone[i]));
    }
    pe_ctx *c = make_ctx(128);
    T_ASSERT(c);
    pe_sched *s = sched_create(c, 4, 8, 0);
    T_ASSERT(s);
    pe_request_params rp = greedy(60);
    for (int i = 0; i < N_LONG; i++) {
        uint64_t id;
        memset(&batch[i], 0, sizeof batch[i]);
        T_OK(pe_sched_submit(s, &rp, prompts[i], 40, on_token, &batch[i], &id));
    }
    pe_sched_stats st;
    for (int n = 0; n < 10000; n++) {
        int rc = pe_sched_step(s);
        T_OK(rc);
        T_EQ(pgd_cache_check(pe_ctx_cache(c)), PGD_OK);
        pe_sched_get_stats(s, &st);
        if (rc == 0 && st.n_running + st.n_waiting == 0) break;
    }
    T_EQ(st.n_running + st.n_waiting, 0);
    T_ASSERT(st.n_preemptions > 0);
    printf("small pool: %" PRIu64 " preemptions, %" PRIu64 " prompt tokens computed\n",
           st.n_preemptions, st.n_prompt_tokens_computed);
    for (int i = 0; i < N_LONG; i++) {
        T_EQ(batch[i].n_final, 1);
        T_EQ(batch[i].finish, PE_FINISH_LENGTH);
        T_EQ(batch[i].n, 60);
        if (memcmp(batch[i].toks, alone[i].toks, 60 * sizeof(int32_t)))
            T_FAIL("request %d: output after preemption differs from solo", i);
    }
    pe_sched_destroy(s);
    pe_ctx_destroy(c);
    return 0;
}

static int test_queue_full_and_salts(void)
{
    uint64_t seed = 41, id;
    int32_t prompt[50];
    out o[5];
    random_tokens(&seed, prompt, 50);
    memset(o, 0, sizeof o);
    pe_ctx *c = make_ctx(4096);
    T_ASSERT(c);
    pe_sched *s = sched_create(c, 2, 2, 0);
    T_ASSERT(s);
    pe_request_params rp = greedy(4);
    T_OK(pe_sched_submit(s, &rp, prompt, 50, on_token, &o[0], &id));
    T_OK(pe_sched_submit(s, &rp, prompt, 50, on_token, &o[1], &id));
    T_EQ(pe_sched_submit(s, &rp, prompt, 50, on_token, &o[2], &id), PGD_EBUSY);
    T_EQ(pe_sched_submit(s, &rp, prompt, 0, on_token, &o[2], &id), PGD_EINVAL);
    T_OK(pe_sched_run_until_idle(s));
    T_EQ(o[2].n_final, 0);
    T_EQ(o[0].u.cached_tokens, 0);
    T_EQ(o[1].u.cached_tokens, 48); /* held until the first committed the shared pages */

    /* Tenant "a" computes the prompt; tenant "b" must not see it; "a" again does. */
    rp.salt = "a";
    rp.salt_len = 1;
    T_OK(pe_sched_submit(s, &rp, prompt, 50, on_token, &o[2], &id));
    T_OK(pe_sched_run_until_idle(s));
    rp.salt = "b";
    T_OK(pe_sched_submit(s, &rp, prompt, 50, on_token, &o[3], &id));
    T_OK(pe_sched_run_until_idle(s));
    rp.salt = "a";
    T_OK(pe_sched_submit(s, &rp, prompt, 50, on_token, &o[4], &id));
    T_OK(pe_sched_run_until_idle(s));
    T_EQ(o[2].u.cached_tokens, 0);
    T_EQ(o[3].u.cached_tokens, 0);
    T_EQ(o[4].u.cached_tokens, 48);
    for (int i = 0; i < 5; i++) {
        T_EQ(o[i].n_final, 1);
        T_EQ(o[i].n, 4);
    }
    T_EQ(pgd_cache_check(pe_ctx_cache(c)), PGD_OK);
    pe_sched_destroy(s);
    pe_ctx_destroy(c);
    return 0;
}

/* no_prefix_cache: the same prompt twice is computed twice, with the same output. */
static int test_no_prefix_cache(void)
{
    uint64_t seed = 53, id;
    int32_t prompt[50];
    out o[3];
    random_tokens(&seed, prompt, 50);
    memset(o, 0, sizeof o);
    pe_ctx *c = make_ctx(4096);
    T_ASSERT(c);
    pe_sched_params p = pe_sched_default_params();
    pe_sched *s;
    p.model = g_model;
    p.no_prefix_cache = 1;
    T_OK(pe_sched_create(c, &p, &s));
    pe_request_params rp = greedy(4);
    T_OK(pe_sched_submit(s, &rp, prompt, 50, on_token, &o[0], &id));
    T_OK(pe_sched_run_until_idle(s));
    T_OK(pe_sched_submit(s, &rp, prompt, 50, on_token, &o[1], &id));
    T_OK(pe_sched_submit(s, &rp, prompt, 50, on_token, &o[2], &id)); /* concurrent */
    /* One step prefills both: no sharing at all, so each holds its own 3 full pages and
     * a partial one (with the prefix cache the full ones would be deduplicated: 5). */
    T_ASSERT(pe_sched_step(s) > 0);
    pgd_cache_stats cs;
    pgd_cache_get_stats(pe_ctx_cache(c), &cs);
    T_EQ(cs.n_pages_used, 8);
    T_OK(pe_sched_run_until_idle(s));
    pgd_cache_get_stats(pe_ctx_cache(c), &cs);
    T_EQ(cs.n_dedup, 0);
    for (int i = 0; i < 3; i++) {
        T_EQ(o[i].n_final, 1);
        T_EQ(o[i].u.cached_tokens, 0);
        T_EQ(o[i].n, 4);
        T_ASSERT(memcmp(o[i].toks, o[0].toks, 4 * sizeof(int32_t)) == 0);
    }
    pe_sched_stats st;
    pe_sched_get_stats(s, &st);
    T_EQ(st.n_prompt_tokens_computed, 150);
    T_EQ(st.n_prompt_tokens_cached, 0);
    T_EQ(pgd_cache_check(pe_ctx_cache(c)), PGD_OK);
    pe_sched_destroy(s);
    pe_ctx_destroy(c);
    return 0;
}

/* cancel_all: queued and running requests all end CANCELLED and release their pages. */
static int test_cancel_all(void)
{
    uint64_t seed = 61, id;
    int32_t prompt[40];
    out o[3];
    random_tokens(&seed, prompt, 40);
    memset(o, 0, sizeof o);
    pe_ctx *c = make_ctx(4096);
    T_ASSERT(c);
    pe_sched *s = sched_create(c, 2, 4, 0);
    T_ASSERT(s);
    pe_request_params rp = greedy(100);
    for (int i = 0; i < 3; i++) {
        prompt[0] = 3 + i; /* no sharing */
        T_OK(pe_sched_submit(s, &rp, prompt, 40, on_token, &o[i], &id));
    }
    T_ASSERT(pe_sched_step(s) > 0);
    pgd_cache_stats cs;
    pgd_cache_get_stats(pe_ctx_cache(c), &cs);
    T_ASSERT(cs.n_pages_used > 0);
    T_EQ(pe_sched_cancel_all(s), 3);
    pgd_cache_get_stats(pe_ctx_cache(c), &cs);
    T_EQ(cs.n_pages_used, 0); /* at once, before the next step */
    T_EQ(pe_sched_cancel_all(s), 0);
    T_OK(pe_sched_run_until_idle(s));
    for (int i = 0; i < 3; i++) {
        T_EQ(o[i].n_final, 1);
        T_EQ(o[i].finish, PE_FINISH_CANCELLED);
    }
    T_EQ(pgd_cache_check(pe_ctx_cache(c)), PGD_OK);
    pe_sched_destroy(s);
    pe_ctx_destroy(c);
    return 0;
}

/* A request that does not fit the pool alone finishes with PE_FINISH_ERROR and status
 * PGD_ENOSPC: a prompt longer than the whole pool (64 tokens) fails at once, one that
 * outgrows it while generating fails with the tokens it produced; the next request, which
 * fits, still runs and reports PGD_OK. */
static int test_too_large_for_pool(void)
{
    uint64_t seed = 71, id;
    int32_t prompt[80];
    out o[3];
    random_tokens(&seed, prompt, 80);
    memset(o, 0, sizeof o);
    pe_ctx *c = make_ctx(64);
    T_ASSERT(c);
    pe_sched *s = sched_create(c, 4, 4, 0);
    T_ASSERT(s);
    pe_request_params rp = greedy(60);
    T_OK(pe_sched_submit(s, &rp, prompt, 80, on_token, &o[0], &id));
    T_OK(pe_sched_run_until_idle(s));
    prompt[0] = 4; /* no sharing with the first */
    T_OK(pe_sched_submit(s, &rp, prompt, 40, on_token, &o[1], &id));
    T_OK(pe_sched_run_until_idle(s));
    rp = greedy(10);
    T_OK(pe_sched_submit(s, &rp, prompt, 20, on_token, &o[2], &id));
    T_OK(pe_sched_run_until_idle(s));
    T_EQ(o[0].n_final, 1);
    T_EQ(o[0].finish, PE_FINISH_ERROR);
    T_EQ(o[0].u.status, PGD_ENOSPC);
    T_EQ(o[0].u.completion_tokens, 0);
    T_EQ(o[1].n_final, 1);
    T_EQ(o[1].finish, PE_FINISH_ERROR);
    T_EQ(o[1].u.status, PGD_ENOSPC);
    T_EQ(o[1].u.completion_tokens, 64 - 40 + 1); /* the last sampled from position 63 */
    T_EQ(o[2].n_final, 1);
    T_EQ(o[2].finish, PE_FINISH_LENGTH);
    T_EQ(o[2].u.status, PGD_OK);
    T_EQ(o[2].n, 10);
    T_EQ(pgd_cache_check(pe_ctx_cache(c)), PGD_OK);
    pe_sched_destroy(s);
    pe_ctx_destroy(c);
    return 0;
}

/* ---- fairness ---- */

#define FLOOD_STEPS 80
#define FLOOD_PREFIX 64 /* 4 pages */
#define A_TOKENS 6      /* tokens each flood request generates */
#define COLD_AT 6       /* the step before which the cold request is submitted */

/* Runs the flood: 2 slots, tenant A submits FLOOD_PREFIX shared tokens + 4 of its own
 * every step (A_TOKENS generated), and before step COLD_AT a 20-token cold prompt comes
 * with salt cold_salt. *wait gets the steps from its submission to its first token (0:
 * the step it was submitted before), -1 when it got none during the flood. */
static int flood(uint32_t max_wait_steps, const char *cold_salt, int *wait)
{
    static out a[FLOOD_STEPS];
    uint64_t seed = 71, id;
    int32_t prompt[FLOOD_PREFIX + 4], cold[20];
    out b;
    pe_ctx *c = make_ctx(4096);
    T_ASSERT(c);
    pe_sched_params p = pe_sched_default_params();
    pe_sched *s;
    p.model = g_model;
    p.max_running = 2;
    p.max_queued = 64;
    p.max_wait_steps = max_wait_steps;
    T_OK(pe_sched_create(c, &p, &s));
    memset(a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    random_tokens(&seed, prompt, FLOOD_PREFIX);
    random_tokens(&seed, cold, 20);
    pe_request_params ra = greedy(A_TOKENS), rb = greedy(4);
    ra.salt = "A";
    ra.salt_len = 1;
    rb.salt = cold_salt;
    rb.salt_len = strlen(cold_salt);
    *wait = -1;
    for (int t = 0; t < FLOOD_STEPS; t++) {
        random_tokens(&seed, prompt + FLOOD_PREFIX, 4);
        int rc = pe_sched_submit(s, &ra, prompt, FLOOD_PREFIX + 4, on_token, &a[t], &id);
        T_ASSERT(rc == PGD_OK || rc == PGD_EBUSY);
        if (t == COLD_AT) T_OK(pe_sched_submit(s, &rb, cold, 20, on_token, &b, &id));
        T_OK(pe_sched_step(s));
        if (b.n && *wait < 0) *wait = t - COLD_AT;
    }
    T_OK(pe_sched_run_until_idle(s));
    T_EQ(b.n_final, 1);
    T_EQ(b.n, 4);
    T_EQ(pgd_cache_check(pe_ctx_cache(c)), PGD_OK);
    pe_sched_destroy(s);
    pe_ctx_destroy(c);
    return 0;
}

/* A cold request of another tenant waits for the next free slot only: a flood request
 * runs A_TOKENS + 1 steps, so one of the 2 slots frees within that. Aging is pushed out of
 * the way (1000 steps) to show the round-robin alone bounds it. Before round-robin and
 * aging, B waited behind the whole flood (no token within FLOOD_STEPS). */
static int test_flood_other_tenant(void)
{
    int wait;
    T_OK(flood(1000, "B", &wait));
    printf("     cold tenant B admitted after %d steps of tenant A's flood\n", wait);
    T_ASSERT(wait >= 0);
    T_ASSERT(wait <= A_TOKENS + 1);
    return 0;
}

/* A cold request of the flooding tenant itself loses every prefix-aware comparison; aging
 * admits it once it has waited max_wait_steps (8 here), at the next free slot. */
static int test_flood_same_tenant_ages(void)
{
    int wait;
    T_OK(flood(8, "A", &wait));
    printf("     cold request of tenant A admitted after %d steps (max_wait_steps 8)\n", wait);
    T_ASSERT(wait >= 0);
    T_ASSERT(wait <= 8 + A_TOKENS + 1);
    return 0;
}

int main(int argc, char **argv)
{
    int rc = sched_fixture_load(argc, argv);
    if (rc) return rc;
    T_RUN(test_shared_prefix);
    T_RUN(test_cancel_frees_pages);
    T_RUN(test_preemption);
    T_RUN(test_queue_full_and_salts);
    T_RUN(test_no_prefix_cache);
    T_RUN(test_cancel_all);
    T_RUN(test_too_large_for_pool);
    T_RUN(test_flood_other_tenant);
    T_RUN(test_flood_same_tenant_ages);
    pe_model_destroy(g_model);
    T_DONE();
}
