/* SPDX-License-Identifier: MIT */
/*
 * test_sim_tiers.c - the tier model of the replay simulator (sim/sim.c, model in sim.h),
 * called directly on traces built in memory.
 *
 * Checks: a tiny trace whose per-tier hits, demotions, evictions and residents are worked
 * out by hand below (exact counts, partial last block included); a tier of capacity 0
 * changes nothing (alone, or in front of another); the pool's own hits never depend on
 * the tiers; pool hits + tier hits + misses = blocks (and tokens) on a generated trace at
 * several capacities, with the cache and tier integrity checks after every request; a
 * first tier larger than the trace's distinct blocks caches every block seen before (the
 * unlimited answer the generator knows); bad tier counts are refused.
 */
#include <stdio.h>
#include <string.h>

#include "gen.h"
#include "sim.h"
#include "t.h"

static int add(trace_set *t, uint64_t input_length, const uint64_t *ids, size_t n)
{
    return trace_set_add(t, input_length, ids, n);
}

/* Runs t with a pool of pool_tokens and the given tiers (block_tokens bt). */
static int run(const trace_set *t, uint32_t bt, uint64_t pool_tokens, const uint64_t *tier_tokens,
               uint32_t n_tiers, sim_result *r)
{
    sim_tier tiers[SIM_MAX_TIERS];
    sim_params p;
    char err[256] = "";
    memset(&p, 0, sizeof p);
    memset(tiers, 0, sizeof tiers);
    for (uint32_t i = 0; i < n_tiers; i++) {
        snprintf(tiers[i].name, sizeof tiers[i].name, "t%u", i);
        tiers[i].capacity_tokens = tier_tokens[i];
    }
    p.policy = PGD_POLICY_LRU;
    p.capacity_tokens = pool_tokens;
    p.block_tokens = bt;
    p.check = 1;
    p.tiers = tiers;
    p.n_tiers = n_tiers;
    if (sim_run(&p, t, r, err, sizeof err) != 0) {
        fprintf(stderr, "sim_run: %s\n", err);
        return -1;
    }
    return 0;
}

/* Every block is a pool hit, a tier hit or a miss, in blocks and in tokens. */
static int totals_add_up(const sim_result *r)
{
    uint64_t b = r->hit_blocks + r->miss_blocks, tk = r->hit_tokens + r->miss_tokens;
    for (uint32_t i = 0; i < r->n_tiers; i++) {
        b += r->tiers[i].hit_blocks;
        tk += r->tiers[i].hit_tokens;
        T_ASSERT(r->tiers[i].resident_blocks <= r->tiers[i].capacity_blocks);
        T_EQ(r->tiers[i].resident_blocks, r->tiers[i].demoted_blocks - r->tiers[i].evicted_blocks);
    }
    T_EQ(b, r->blocks);
    T_EQ(tk, r->tokens);
    return 0;
}

/*
 * Blocks of 4 tokens; pool of 2 blocks, tier 0 of 2, tier 1 of 8. A1 A2 is the chain of
 * ids [1, 2], B of [3, 4], C of [5, 6]. The pool evicts its least recently released leaf
 * (a sequence releases its deepest block first); tier lists are oldest first.
 *   R1 [1,2]    miss 2                     pool A1 A2
 *   R2 [3,4]    miss 2; pool evicts A2, A1 -> t0 [A2 A1]
 *   R3 [5,6]    miss 2; pool evicts B2 -> t0 [A2 A1 B2], over: A2 (a leaf) -> t1 [A2];
 *               B1 -> t0 [A1 B2 B1], over: A1 (its child left) -> t1 [A2 A1]; t0 [B2 B1]
 *   R4 [1,2]    A1, A2 in t1: 2 t1 hits, touched A2 then A1; their pool pages evict C2
 *               -> t0 [B2 B1 C2], over: B2 -> t1; C1 -> t0, over: B1 -> t1 [A2 A1 B2 B1]
 *   R5 [3,4]    B1, B2 in t1: 2 t1 hits; the pool evicts A2, A1: t1 holds them, no write
 *   R6 [5,6]    (input_length 6: C2 holds 2 tokens) C1, C2 in t0: 2 t0 hits (6 tokens);
 *               the pool evicts B2, B1: t1 holds them
 *   R7 [1,2,7]  A1, A2 in t1: 2 t1 hits (pool evicts C2, C1: t0 holds them); block 3 is
 *               in no tier and finds no pool page (A1, A2 pinned): a miss, uncached
 *   R8 [1,2]    pool hits 2
 * Totals: 17 blocks, 66 tokens; pool 2 hits (8 tokens); t0 2 (6); t1 6 (24); misses 7 (28).
 * t0: 6 demoted, 4 evicted, 2 held; t1: 4 demoted, 0 evicted, 4 held; pool: 12 evictions.
 */
static int test_hand_computed(void)
{
    static const uint64_t r1[] = {1, 2}, r2[] = {3, 4}, r3[] = {5, 6}, r7[] = {1, 2, 7};
    static const uint64_t tiers[] = {8, 32};
    trace_set t = {0};
    sim_result r;
    T_EQ(add(&t, 8, r1, 2), 0);
    T_EQ(add(&t, 8, r2, 2), 0);
    T_EQ(add(&t, 8, r3, 2), 0);
    T_EQ(add(&t, 8, r1, 2), 0);
    T_EQ(add(&t, 8, r2, 2), 0);
    T_EQ(add(&t, 6, r3, 2), 0);
    T_EQ(add(&t, 12, r7, 3), 0);
    T_EQ(add(&t, 8, r1, 2), 0);
    T_EQ(run(&t, 4, 8, tiers, 2, &r), 0);
    T_EQ(r.blocks, 17);
    T_EQ(r.tokens, 66);
    T_EQ(r.hit_blocks, 2);
    T_EQ(r.hit_tokens, 8);
    T_EQ(r.evictions, 12);
    T_EQ(r.uncached_blocks, 1);
    T_EQ(r.n_tiers, 2);
    T_EQ(r.tiers[0].capacity_blocks, 2);
    T_EQ(r.tiers[0].capacity_tokens, 8);
    T_EQ(r.tiers[0].hit_blocks, 2);
    T_EQ(r.tiers[0].hit_tokens, 6);
    T_EQ(r.tiers[0].demoted_blocks, 6);
    T_EQ(r.tiers[0].evicted_blocks, 4);
    T_EQ(r.tiers[0].resident_blocks, 2);
    T_EQ(r.tiers[1].capacity_blocks, 8);
    T_EQ(r.tiers[1].hit_blocks, 6);
    T_EQ(r.tiers[1].hit_tokens, 24);
    T_EQ(r.tiers[1].demoted_blocks, 4);
    T_EQ(r.tiers[1].evicted_blocks, 0);
    T_EQ(r.tiers[1].resident_blocks, 4);
    T_EQ(r.miss_blocks, 7);
    T_EQ(r.miss_tokens, 28);
    T_EQ(totals_add_up(&r), 0);
    trace_set_deinit(&t);
    return 0;
}

/*
 * The leaf-only rule: a tier never evicts a block whose child it holds. Blocks of one
 * token, pool of 2, tier of 3; A1 A4 is the chain [1, 4], X of [2, 3], Y of [5, 6].
 *   R1 [1]      miss                       pool A1
 *   R2 [2,3]    miss 2; pool evicts A1 -> t [A1]
 *   R3 [1,4]    A1 a tier hit (A4 is new: a miss); pool evicts X2, X1 -> t [A1 X2 X1]
 *   R4 [5,6]    miss 2; pool evicts A4 -> t [A1 X2 X1 A4], over: A1 is the oldest but
 *               holds A4, so X2 goes -> t [A1 X1 A4]; pool evicts A1: the tier has it
 *   R5 [1,4]    A1, A4: 2 tier hits (touched A4, A1 -> [X1 A4 A1]); pool evicts Y2 ->
 *               [X1 A4 A1 Y2], over: X1; Y1 -> [A4 A1 Y2 Y1], over: A4 -> [A1 Y2 Y1]
 * An LRU without the rule drops A1 in R4 and R5 finds nothing: 1 tier hit, not 3.
 */
static int test_leaf_only(void)
{
    static const uint64_t r1[] = {1}, r2[] = {2, 3}, r3[] = {1, 4}, r4[] = {5, 6};
    static const uint64_t tiers[] = {3};
    trace_set t = {0};
    sim_result r;
    T_EQ(add(&t, 1, r1, 1), 0);
    T_EQ(add(&t, 2, r2, 2), 0);
    T_EQ(add(&t, 2, r3, 2), 0);
    T_EQ(add(&t, 2, r4, 2), 0);
    T_EQ(add(&t, 2, r3, 2), 0);
    T_EQ(run(&t, 1, 2, tiers, 1, &r), 0);
    T_EQ(r.blocks, 9);
    T_EQ(r.hit_blocks, 0);
    T_EQ(r.tiers[0].hit_blocks, 3);
    T_EQ(r.tiers[0].hit_tokens, 3);
    T_EQ(r.tiers[0].demoted_blocks, 6);
    T_EQ(r.tiers[0].evicted_blocks, 3);
    T_EQ(r.tiers[0].resident_blocks, 3);
    T_EQ(r.miss_blocks, 6);
    T_EQ(totals_add_up(&r), 0);
    trace_set_deinit(&t);
    return 0;
}

/* ---- on a generated trace (blocks of 16 tokens) ---- */

static int emit(void *ud, const gen_request *q)
{
    return trace_set_add(ud, q->input_length, q->ids, q->n_ids);
}

static int make_trace(trace_set *t, gen_stats *st)
{
    gen_params gp = gen_default_params();
    const char *why = NULL;
    gp.seed = 11;
    gp.n_requests = 1500;
    gp.block_tokens = 16;
    if (gen_run(&gp, emit, t, st, &why) != 0) {
        fprintf(stderr, "gen_run: %s\n", why ? why : "emit failed");
        return -1;
    }
    return 0;
}

static int test_zero_capacity_changes_nothing(void)
{
    trace_set t = {0};
    gen_stats st;
    sim_result none, zero, zero_then, alone;
    static const uint64_t z[] = {0}, zt[] = {0, 16 * 300}, al[] = {16 * 300};
    T_EQ(make_trace(&t, &st), 0);
    T_EQ(run(&t, 16, 16 * 100, NULL, 0, &none), 0);
    T_EQ(run(&t, 16, 16 * 100, z, 1, &zero), 0);
    T_EQ(run(&t, 16, 16 * 100, zt, 2, &zero_then), 0);
    T_EQ(run(&t, 16, 16 * 100, al, 1, &alone), 0);
    T_EQ(zero.hit_blocks, none.hit_blocks);
    T_EQ(zero.evictions, none.evictions);
    T_EQ(zero.tiers[0].hit_blocks, 0);
    T_EQ(zero.tiers[0].demoted_blocks, 0);
    T_EQ(zero.tiers[0].capacity_blocks, 0);
    T_EQ(zero.miss_blocks, none.blocks - none.hit_blocks);
    T_EQ(zero.miss_tokens, none.tokens - none.hit_tokens);
    /* Nothing without tiers: every non-hit is a miss. */
    T_EQ(none.miss_blocks, none.blocks - none.hit_blocks);
    /* A zero tier in front of another: the other sees exactly what it sees alone. */
    T_ASSERT(alone.tiers[0].hit_blocks > 0);
    T_EQ(zero_then.tiers[0].hit_blocks, 0);
    T_EQ(zero_then.tiers[1].hit_blocks, alone.tiers[0].hit_blocks);
    T_EQ(zero_then.tiers[1].hit_tokens, alone.tiers[0].hit_tokens);
    T_EQ(zero_then.tiers[1].demoted_blocks, alone.tiers[0].demoted_blocks);
    T_EQ(zero_then.tiers[1].evicted_blocks, alone.tiers[0].evicted_blocks);
    T_EQ(zero_then.miss_blocks, alone.miss_blocks);
    T_EQ(totals_add_up(&zero_then), 0);
    trace_set_deinit(&t);
    return 0;
}

static int test_totals_and_pool_unchanged(void)
{
    static const uint64_t pools[] = {16, 16 * 50, 16 * 400};
    static const uint64_t tiers[][2] = {{16, 16 * 4}, {16 * 100, 16 * 1000}, {16 * 7, 0}};
    trace_set t = {0};
    gen_stats st;
    T_EQ(make_trace(&t, &st), 0);
    for (size_t i = 0; i < sizeof pools / sizeof pools[0]; i++) {
        sim_result base, r;
        T_EQ(run(&t, 16, pools[i], NULL, 0, &base), 0);
        for (size_t j = 0; j < sizeof tiers / sizeof tiers[0]; j++) {
            T_EQ(run(&t, 16, pools[i], tiers[j], 2, &r), 0);
            printf("  pool %5llu tiers %5llu %6llu: pool %6llu  t0 %6llu  t1 %6llu  miss %6llu\n",
                   (unsigned long long)pools[i] / 16, (unsigned long long)tiers[j][0] / 16,
                   (unsigned long long)tiers[j][1] / 16, (unsigned long long)r.hit_blocks,
                   (unsigned long long)r.tiers[0].hit_blocks,
                   (unsigned long long)r.tiers[1].hit_blocks, (unsigned long long)r.miss_blocks);
            T_EQ(r.hit_blocks, base.hit_blocks);
            T_EQ(r.hit_tokens, base.hit_tokens);
            T_EQ(r.evictions, base.evictions);
            T_EQ(r.blocks, st.blocks);
            T_EQ(totals_add_up(&r), 0);
            /* Nothing is cached that was not seen before. */
            T_ASSERT(r.miss_blocks >= st.distinct_ids);
        }
    }
    trace_set_deinit(&t);
    return 0;
}

static int test_big_tier_is_unlimited(void)
{
    trace_set t = {0};
    gen_stats st;
    sim_result r;
    uint64_t tiers[1];
    T_EQ(make_trace(&t, &st), 0);
    tiers[0] = st.distinct_ids * 16;
    T_EQ(run(&t, 16, 16 * 100, tiers, 1, &r), 0);
    /* The pool holds every request (a block that finds no page is never cached) and is
     * too small for the trace: the tier makes the difference. */
    T_EQ(r.uncached_blocks, 0);
    T_ASSERT(r.evictions > 0 && r.tiers[0].hit_blocks > 0);
    T_EQ(r.tiers[0].evicted_blocks, 0);
    T_EQ(r.hit_blocks + r.tiers[0].hit_blocks, st.unlimited_hit_blocks);
    T_EQ(r.hit_tokens + r.tiers[0].hit_tokens, st.unlimited_hit_tokens);
    T_EQ(r.miss_blocks, st.distinct_ids);
    trace_set_deinit(&t);
    return 0;
}

/*
 * The ordered policies in the tiers (cost, priority: the tiers tell them which blocks
 * stopped being leaves, policy.h leaf()) give the figures they gave when victim() walked
 * the refused parents instead (computed before leaf() existed, on this trace): pool and
 * tier policy alike, two tiers, every integrity check after every request.
 */
static int test_ordered_policies_unchanged(void)
{
    static const struct {
        pgd_policy_kind kind;
        uint64_t pool, t0, t1, t0_tokens, t0_evicted, t1_evicted, miss;
    } want[] = {
        {PGD_POLICY_COST, 7387, 3622, 5118, 57952, 10280, 9880, 10431},
        {PGD_POLICY_PRIORITY, 4385, 2734, 9883, 43744, 9389, 8989, 9556},
    };
    trace_set t = {0};
    gen_stats st;
    T_EQ(make_trace(&t, &st), 0);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        sim_tier tiers[2];
        sim_params p;
        sim_result r;
        char err[256] = "";
        memset(&p, 0, sizeof p);
        memset(tiers, 0, sizeof tiers);
        for (uint32_t k = 0; k < 2; k++) {
            snprintf(tiers[k].name, sizeof tiers[k].name, "t%u", k);
            tiers[k].has_policy = 1;
            tiers[k].policy = want[i].kind;
        }
        tiers[0].capacity_tokens = 16 * 150;
        tiers[1].capacity_tokens = 16 * 400;
        p.policy = want[i].kind;
        p.capacity_tokens = 16 * 60;
        p.block_tokens = 16;
        p.check = 1;
        p.tiers = tiers;
        p.n_tiers = 2;
        if (sim_run(&p, &t, &r, err, sizeof err) != 0) {
            fprintf(stderr, "sim_run: %s\n", err);
            return 1;
        }
        printf("  %s: pool %llu  t0 %llu (%llu tokens, %llu evicted)  t1 %llu (%llu evicted)  "
               "miss %llu\n",
               pgd_policy_name(want[i].kind), (unsigned long long)r.hit_blocks,
               (unsigned long long)r.tiers[0].hit_blocks, (unsigned long long)r.tiers[0].hit_tokens,
               (unsigned long long)r.tiers[0].evicted_blocks,
               (unsigned long long)r.tiers[1].hit_blocks,
               (unsigned long long)r.tiers[1].evicted_blocks, (unsigned long long)r.miss_blocks);
        T_EQ(r.hit_blocks, want[i].pool);
        T_EQ(r.tiers[0].hit_blocks, want[i].t0);
        T_EQ(r.tiers[1].hit_blocks, want[i].t1);
        T_EQ(r.tiers[0].hit_tokens, want[i].t0_tokens);
        T_EQ(r.tiers[0].evicted_blocks, want[i].t0_evicted);
        T_EQ(r.tiers[1].evicted_blocks, want[i].t1_evicted);
        T_EQ(r.miss_blocks, want[i].miss);
        T_EQ(totals_add_up(&r), 0);
    }
    trace_set_deinit(&t);
    return 0;
}

static int test_bad_params(void)
{
    static const uint64_t ids[] = {1};
    trace_set t = {0};
    sim_tier tiers[SIM_MAX_TIERS + 1];
    sim_params p;
    sim_result r;
    char err[256];
    T_EQ(add(&t, 1, ids, 1), 0);
    memset(&p, 0, sizeof p);
    memset(tiers, 0, sizeof tiers);
    p.policy = PGD_POLICY_LRU;
    p.capacity_tokens = 4;
    p.block_tokens = 1;
    p.tiers = tiers;
    p.n_tiers = SIM_MAX_TIERS + 1;
    T_EQ(sim_run(&p, &t, &r, err, sizeof err), -1);
    T_ASSERT(strstr(err, "tiers") != NULL);
    p.tiers = NULL;
    p.n_tiers = 1;
    T_EQ(sim_run(&p, &t, &r, err, sizeof err), -1);
    p.tiers = tiers;
    p.n_tiers = SIM_MAX_TIERS;
    T_EQ(sim_run(&p, &t, &r, err, sizeof err), 0);
    T_EQ(r.miss_blocks, 1);
    trace_set_deinit(&t);
    return 0;
}

int main(void)
{
    T_RUN(test_hand_computed);
    T_RUN(test_leaf_only);
    T_RUN(test_zero_capacity_changes_nothing);
    T_RUN(test_totals_and_pool_unchanged);
    T_RUN(test_big_tier_is_unlimited);
    T_RUN(test_ordered_policies_unchanged);
    T_RUN(test_bad_params);
    T_DONE();
}
