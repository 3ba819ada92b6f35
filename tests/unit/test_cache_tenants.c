/* SPDX-License-Identifier: MIT */
/*
 * test_cache_tenants.c - tenant quotas and per-tenant stats (cache.h "tenants", tenants.c):
 * the table alone (entries, "other", reservations, predicates), ids (hashed, never the
 * salt), set_tenant validation, a flood from tenant A that cannot evict tenant B's
 * reserved prefix (and does without the reservation), a scripted case whose per-tenant
 * counters are exact (own pages first, over-share pages next, unreserved tenants in the
 * unreserved part), max_tenants overflow into "other", the tenant index the policy sees,
 * and eviction without reservations identical to a cache that never heard of tenants.
 * pgd_cache_check runs after every step (it recounts each tenant's pages).
 */
#include <math.h>

#include <pagoda/cache.h>

#include "t.h"
#include "tenants.h"

static void log_stderr(void *ud, int level, const char *msg)
{
    (void)ud;
    if (level <= PGD_LOG_WARN) fprintf(stderr, "  [pagoda %d] %s\n", level, msg);
}

static const uint8_t test_key[32] = "0123456789abcdef0123456789abcdef";

enum { PT = 4 }; /* tokens per page */

static pgd_cache_params params(uint32_t n_pages)
{
    pgd_cache_params p = pgd_cache_default_params();
    p.pool.n_layers = 1;
    p.pool.n_kv_heads = 1;
    p.pool.head_dim = 2;
    p.pool.page_tokens = PT;
    p.pool.kv_type = PGD_KV_F32;
    p.pool.capacity_pages = n_pages;
    p.hash_key = test_key;
    p.hash_key_len = sizeof test_key;
    p.log = log_stderr;
    return p;
}

static pgd_cache *make_cache(uint32_t n_pages, uint32_t max_tenants)
{
    pgd_cache_params p = params(n_pages);
    p.max_tenants = max_tenants;
    pgd_cache *c = NULL;
    if (pgd_cache_create(&p, &c) != PGD_OK) return NULL;
    return c;
}

/* A prompt of n_pages full pages, distinct per (prompt, salt's namespace): base + i. */
static void toks(int32_t *t, size_t n, int32_t base)
{
    for (size_t i = 0; i < n; i++)
        t[i] = base + (int32_t)i;
}

/* One request of tenant salt: match, grow the rest, commit, release. Returns the matched
 * tokens, or a negative status. */
static int64_t request(pgd_cache *c, const char *salt, const int32_t *t, size_t n)
{
    pgd_seq *s;
    int rc = pgd_seq_create(c, salt, salt ? strlen(salt) : 0, &s);
    if (rc != PGD_OK) return rc;
    int64_t m = pgd_seq_match(c, s, t, n);
    if (m >= 0) {
        rc = pgd_seq_grow(c, s, n - (size_t)m);
        if (rc == PGD_OK) rc = pgd_seq_commit(c, s, t + m, n - (size_t)m);
        if (rc < 0) m = rc;
    }
    pgd_seq_destroy(c, s);
    return m;
}

/* Matches t[0..n) for salt and releases it: the cached length. */
static int64_t probe(pgd_cache *c, const char *salt, const int32_t *t, size_t n)
{
    pgd_seq *s;
    int rc = pgd_seq_create(c, salt, strlen(salt), &s);
    if (rc != PGD_OK) return rc;
    int64_t m = pgd_seq_match(c, s, t, n);
    pgd_seq_destroy(c, s);
    return m;
}

static pgd_tenant_stats tstats(pgd_cache *c, const char *salt)
{
    pgd_tenant_stats st;
    memset(&st, 0xee, sizeof st);
    pgd_cache_get_tenant_stats(c, pgd_cache_tenant_of(c, salt, strlen(salt)), &st);
    return st;
}

static int set_share(pgd_cache *c, const char *salt, double share)
{
    pgd_tenant_params tp;
    memset(&tp, 0, sizeof tp);
    tp.pool_share = share;
    return pgd_cache_set_tenant(c, salt, strlen(salt), &tp);
}

/* ---- the table alone ---- */

static pgd_hash key_of(uint64_t k)
{
    pgd_hash h = {k * 0x9e3779b97f4a7c15ull + 1, k};
    return h;
}

static int test_table(void)
{
    pgd__alloc al;
    pgd__alloc_init(&al, NULL);
    pgd__log lg = {log_stderr, NULL};
    pgd__tenants t;
    T_EQ(pgd__tenants_init(&t, &al, PGD__TENANTS_MAX + 1, 100, key_of(0)), PGD_EINVAL);
    T_OK(pgd__tenants_init(&t, &al, 4, 100, key_of(0))); /* default, 2 named, other */
    T_EQ(t.n_used, 1);
    T_EQ(pgd__tenants_find(&t, key_of(0)), 0);
    T_EQ(pgd__tenants_find(&t, key_of(1)), 3); /* unknown: "other" */
    T_EQ(t.n_used, 1);                         /* find registers nothing */
    T_EQ(pgd__tenants_get(&t, key_of(1), 11), 1);
    T_EQ(pgd__tenants_get(&t, key_of(2), 12), 2);
    T_EQ(pgd__tenants_get(&t, key_of(1), 11), 1);
    T_EQ(t.n_used, 3);
    T_EQ(pgd__tenants_get(&t, key_of(3), 13), 3); /* the named entries are taken */
    T_EQ(pgd__tenants_get(&t, key_of(4), 14), 3);
    T_EQ(t.n_used, 4);
    pgd_tenant_stats st;
    T_OK(pgd__tenants_stats(&t, 3, &st));
    T_ASSERT(st.id == UINT64_MAX);
    T_OK(pgd__tenants_stats(&t, 2, &st));
    T_ASSERT(st.id == 12);
    T_EQ(pgd__tenants_stats(&t, 4, &st), PGD_EINVAL);

    /* Reservations: floor(share * pages), the sum at most 1, "other" never. */
    pgd_tenant_params tp;
    memset(&tp, 0, sizeof tp);
    tp.pool_share = 0.29;
    T_EQ(pgd__tenants_set(&t, key_of(1), 11, &tp), 1);
    T_EQ(t.e[1].reserved_pages, 29); /* 0.29 * 100 is 28.999...: still 29 */
    tp.pool_share = 0.71;
    T_EQ(pgd__tenants_set(&t, key_of(2), 12, &tp), 2);
    tp.pool_share = 0.01;
    T_EQ(pgd__tenants_set(&t, key_of(0), 0, &tp), PGD_EINVAL); /* 1.01 */
    T_EQ(pgd__tenants_set(&t, key_of(5), 15, &tp), PGD_ENOSPC);
    T_EQ(t.n_reserved, 2);
    T_OK(pgd__tenants_check(&t, &lg));

    /* Predicates: own pages first at or above the reservation, "over" strictly above. */
    for (int i = 0; i < 29; i++)
        pgd__tenants_charge(&t, 1);
    T_ASSERT(pgd__tenants_own_first(&t, 1, 0));
    T_ASSERT(!pgd__tenants_over(&t, 1));
    pgd__tenants_uncharge(&t, 1);
    T_ASSERT(!pgd__tenants_own_first(&t, 1, 0));
    T_ASSERT(pgd__tenants_own_first(&t, 1, 1)); /* a page it is taking counts */
    pgd__tenants_charge(&t, 1);
    pgd__tenants_charge(&t, 1);
    T_ASSERT(pgd__tenants_over(&t, 1));
    T_ASSERT(!pgd__tenants_own_first(&t, 3, 5)); /* "other" has no reservation */
    pgd__tenants_charge(&t, 3);
    T_ASSERT(pgd__tenants_over(&t, 3));
    T_EQ(pgd__tenants_held(&t), 31);
    pgd__tenants_evicted(&t, 1, 1);
    pgd__tenants_evicted(&t, 1, 2);
    pgd__tenants_evicted(&t, 1, PGD__TENANT_NONE);
    T_EQ(t.e[1].evictions, 3);
    T_EQ(t.e[1].evictions_by_others, 1);
    T_OK(pgd__tenants_check(&t, &lg));
    pgd__tenants_deinit(&t, &al);
    pgd__tenants_deinit(&t, &al); /* zeroed: again is fine */
    return 0;
}

/* ---- ids, validation, overflow ---- */

static int test_ids(void)
{
    pgd_cache *c = make_cache(16, 0);
    T_ASSERT(c);
    T_EQ(pgd_cache_n_tenants(c), 1);
    int32_t t[8];
    toks(t, 8, 100);
    T_OK(request(c, "alice", t, 8));
    T_OK(request(c, "bob", t, 8));
    T_EQ(pgd_cache_n_tenants(c), 3); /* stats work without configuration */
    T_EQ(pgd_cache_tenant_of(c, NULL, 0), 0);
    T_EQ(pgd_cache_tenant_of(c, "alice", 5), 1);
    T_EQ(pgd_cache_tenant_of(c, "bob", 3), 2);
    T_EQ(pgd_cache_tenant_of(c, "carol", 5), 63); /* unseen: the "other" index */
    pgd_tenant_stats d, a, b;
    T_OK(pgd_cache_get_tenant_stats(c, 0, &d));
    T_OK(pgd_cache_get_tenant_stats(c, 1, &a));
    T_OK(pgd_cache_get_tenant_stats(c, 2, &b));
    T_EQ(pgd_cache_get_tenant_stats(c, 3, &d), PGD_EINVAL);
    T_ASSERT(d.id == 0);
    T_ASSERT(a.id != 0 && a.id != UINT64_MAX && b.id != 0 && b.id != UINT64_MAX);
    T_ASSERT(a.id != b.id);
    /* Not the salt's bytes, in either byte order, nor a plain (unkeyed) prefix of them. */
    uint64_t raw = 0;
    memcpy(&raw, "alice", 5);
    T_ASSERT(a.id != raw && a.id != __builtin_bswap64(raw));
    T_EQ(a.pages_held, 2);
    T_EQ(b.pages_held, 2);

    /* The id is keyed: another cache key gives another id for the same salt. */
    pgd_cache_params p = params(16);
    static const uint8_t other_key[32] = "fedcba9876543210fedcba9876543210";
    p.hash_key = other_key;
    pgd_cache *c2 = NULL;
    T_OK(pgd_cache_create(&p, &c2));
    T_OK(request(c2, "alice", t, 8));
    pgd_tenant_stats a2;
    T_OK(pgd_cache_get_tenant_stats(c2, 1, &a2));
    T_ASSERT(a2.id != a.id);
    T_OK(pgd_cache_check(c2));
    pgd_cache_destroy(c2);
    T_OK(pgd_cache_check(c));
    pgd_cache_destroy(c);
    return 0;
}

static int test_set_tenant_validation(void)
{
    pgd_cache *c = make_cache(100, 0);
    T_ASSERT(c);
    T_EQ(set_share(c, "a", 1.5), PGD_EINVAL);
    T_EQ(set_share(c, "a", -0.1), PGD_EINVAL);
    T_EQ(set_share(c, "a", nan("")), PGD_EINVAL);
    T_EQ(pgd_cache_n_tenants(c), 1); /* refused: no entry taken */
    pgd_tenant_params tp;
    memset(&tp, 0, sizeof tp);
    tp.tier_share[1] = 1.01;
    T_EQ(pgd_cache_set_tenant(c, "a", 1, &tp), PGD_EINVAL);
    T_EQ(pgd_cache_set_tenant(c, "a", 1, NULL), PGD_EINVAL);
    T_EQ(pgd_cache_set_tenant(c, NULL, 1, &tp), PGD_EINVAL);
    T_EQ(set_share(c, "a", 0.6), 1);
    T_EQ(set_share(c, "b", 0.5), PGD_EINVAL); /* 1.1 */
    T_EQ(set_share(c, "a", 0.4), 1);          /* an update replaces a's share */
    T_EQ(set_share(c, "b", 0.5), 2);
    T_EQ(set_share(c, "", 0.1), 0); /* the default tenant, salt_len 0 */
    T_EQ(set_share(c, "", 0.2), PGD_EINVAL);
    tp.tier_share[1] = 0.7;
    T_EQ(pgd_cache_set_tenant(c, "a", 1, &tp), 1); /* pool share 0 now: the sum is 0.6 */
    tp.tier_share[1] = 0.4;
    T_EQ(pgd_cache_set_tenant(c, "b", 1, &tp), PGD_EINVAL); /* tier 1: 1.1 */
    pgd_tenant_stats st = tstats(c, "b");
    T_EQ(st.reserved_pages, 50);
    T_EQ(tstats(c, "a").reserved_pages, 0);
    T_OK(pgd_cache_get_tenant_stats(c, 0, &st));
    T_EQ(st.reserved_pages, 10);
    T_OK(pgd_cache_check(c));
    pgd_cache_destroy(c);

    pgd_cache_params p = params(16);
    p.max_tenants = PGD__TENANTS_MAX + 1;
    T_EQ(pgd_cache_create(&p, &c), PGD_EINVAL);
    return 0;
}

static int test_other_overflow(void)
{
    pgd_cache *c = make_cache(32, 4); /* default, 2 named, "other" */
    T_ASSERT(c);
    int32_t t[8];
    const char *salts[] = {"s1", "s2", "s3", "s4"};
    for (int i = 0; i < 4; i++) {
        toks(t, 8, 100 * i);
        T_OK(request(c, salts[i], t, 8));
        T_OK(pgd_cache_check(c));
    }
    T_EQ(pgd_cache_n_tenants(c), 4);
    T_EQ(pgd_cache_tenant_of(c, "s1", 2), 1);
    T_EQ(pgd_cache_tenant_of(c, "s2", 2), 2);
    T_EQ(pgd_cache_tenant_of(c, "s3", 2), 3);
    T_EQ(pgd_cache_tenant_of(c, "s4", 2), 3);
    T_EQ(pgd_cache_tenant_of(c, "s9", 2), 3);
    pgd_tenant_stats st;
    T_OK(pgd_cache_get_tenant_stats(c, 3, &st));
    T_ASSERT(st.id == UINT64_MAX);
    T_EQ(st.pages_held, 4); /* s3's and s4's */
    T_EQ(set_share(c, "s5", 0.1), PGD_ENOSPC);
    T_EQ(set_share(c, "s3", 0.1), PGD_ENOSPC); /* "other" cannot be reserved */
    T_EQ(set_share(c, "s2", 0.1), 2);
    T_EQ(pgd_cache_n_tenants(c), 4);
    /* Salts sharing "other" still never share pages. */
    toks(t, 8, 200);
    T_EQ(probe(c, "s3", t, 8), 8);
    T_EQ(probe(c, "s4", t, 8), 0);
    T_OK(pgd_cache_check(c));
    pgd_cache_destroy(c);
    return 0;
}

/* ---- quotas ---- */

/* B caches a 6-page prefix, then A sends 40 distinct 4-page prompts into a 32-page pool.
 * reserve: B's pool share. Returns B's cached tokens afterwards (negative: a failure). */
static int64_t flood(double reserve, pgd_tenant_stats *a_out, pgd_tenant_stats *b_out)
{
    pgd_cache *c = make_cache(32, 0);
    if (!c) return -100;
    int32_t pb[6 * PT], pa[4 * PT];
    int64_t r = -101;
    if (reserve > 0 && set_share(c, "B", reserve) != 1) goto out;
    toks(pb, 6 * PT, 5000);
    if (request(c, "B", pb, 6 * PT) != 0 || pgd_cache_check(c) != PGD_OK) goto out;
    for (int i = 0; i < 40; i++) {
        toks(pa, 4 * PT, 100000 + 1000 * i);
        if (request(c, "A", pa, 4 * PT) != 0 || pgd_cache_check(c) != PGD_OK) goto out;
    }
    *a_out = tstats(c, "A");
    *b_out = tstats(c, "B");
    r = probe(c, "B", pb, 6 * PT);
    if (pgd_cache_check(c) != PGD_OK) r = -102;
out:
    pgd_cache_destroy(c);
    return r;
}

static int test_flood_cannot_evict_reserved(void)
{
    pgd_tenant_stats a, b;
    /* Without a reservation, LRU lets A's flood evict B's prefix: the test bites. */
    T_EQ(flood(0.0, &a, &b), 0);
    T_EQ(b.evictions, 6);
    T_EQ(b.evictions_by_others, 6);
    /* With 8 pages reserved (0.25 of 32), B keeps all 6 of its pages. */
    T_EQ(flood(0.25, &a, &b), 6 * PT);
    T_EQ(b.evictions, 0);
    T_EQ(b.pages_held, 6);
    T_EQ(b.reserved_pages, 8);
    T_EQ(a.pages_held, 26); /* A recycles the rest of the pool */
    T_EQ(a.evictions, 40 * 4 - 26);
    T_EQ(a.evictions_by_others, 0);
    T_EQ(b.hit_pages, 0); /* the probe ran after the stats */
    return 0;
}

/* A tier's share: B reserves half of a 16-record RAM tier (and nothing of the 8-page pool).
 * B's 4-page prefix is evicted from the pool by A's flood and demoted; A's pages flood
 * the tier after it. With the share B's prefix is still promoted from the tier, whole;
 * without, the flood took it. */
static int tier_flood(double tier_share, int64_t *b_matched, pgd_tier_stats *ts)
{
    pgd_cache_params p = params(8);
    pgd_tier_ram_params rp = pgd_tier_ram_default_params();
    rp.capacity_bytes = 16 * (PGD_RECORD_HEADER_BYTES + 2ull * PT * 2 * sizeof(float));
    pgd_tier *tier = NULL;
    T_OK(pgd_tier_ram_create(&rp, &tier));
    pgd_tier_use use = {tier, 0, 0};
    p.tiers = &use;
    p.n_tiers = 1;
    pgd_cache *c = NULL;
    T_OK(pgd_cache_create(&p, &c));
    pgd_tenant_params tp;
    memset(&tp, 0, sizeof tp);
    tp.tier_share[0] = tier_share;
    T_EQ(pgd_cache_set_tenant(c, "B", 1, &tp), 1);
    int32_t pb[4 * PT], t[2 * PT];
    toks(pb, 4 * PT, 9000);
    T_EQ(request(c, "B", pb, 4 * PT), 0);
    for (int i = 1; i <= 40; i++) {
        toks(t, 2 * PT, 1000 * i);
        T_OK(request(c, "A", t, 2 * PT));
        T_OK(pgd_cache_flush(c)); /* each flood step's demotions land before the next */
        T_OK(pgd_cache_check(c));
    }
    pgd_seq *s;
    T_OK(pgd_seq_create(c, "B", 1, &s));
    *b_matched = pgd_seq_match(c, s, pb, 4 * PT);
    T_OK(pgd_seq_wait(c, s));
    *b_matched = (int64_t)pgd_seq_length(c, s); /* what the fills really gave */
    pgd_seq_destroy(c, s);
    T_OK(pgd_cache_check(c));
    pgd_cache_destroy(c);
    pgd_tier_get_stats(tier, ts);
    pgd_tier_close(tier);
    return 0;
}

static int test_tier_share(void)
{
    int64_t m;
    pgd_tier_stats ts;
    T_OK(tier_flood(0.0, &m, &ts));
    T_EQ(m, 0); /* the test bites: without the share the flood takes B's records */
    T_OK(tier_flood(0.5, &m, &ts));
    T_EQ(m, 4 * PT);              /* B's 4 records stayed in the tier and were promoted */
    T_ASSERT(ts.n_evictions > 0); /* A's records were evicted around them */
    return 0;
}

/* A scripted case with exact counters. Pool 16 pages; B reserves 4 (0.25), A and C none
 * at first. Every prompt is 2 pages unless said; LRU. */
static int test_scripted_counters(void)
{
    pgd_cache *c = make_cache(16, 0);
    T_ASSERT(c);
    int32_t pb[4 * PT], t[2 * PT];
    T_EQ(set_share(c, "B", 0.25), 1);
    toks(pb, 4 * PT, 9000);
    T_EQ(request(c, "B", pb, 4 * PT), 0); /* B: 4 pages, its whole reservation */
    T_OK(pgd_cache_check(c));
    for (int i = 1; i <= 6; i++) { /* A: prompts 1..6, 12 pages: the pool is full */
        toks(t, 2 * PT, 1000 * i);
        T_EQ(request(c, "A", t, 2 * PT), 0);
        T_OK(pgd_cache_check(c));
    }
    pgd_cache_stats cs;
    pgd_cache_get_stats(c, &cs);
    T_EQ(cs.n_pages_free, 0);
    T_EQ(cs.n_evictions, 0);
    for (int i = 7; i <= 8; i++) { /* A needs room: its own prompts 1 and 2 go */
        toks(t, 2 * PT, 1000 * i);
        T_EQ(request(c, "A", t, 2 * PT), 0);
        T_OK(pgd_cache_check(c));
    }
    pgd_tenant_stats a = tstats(c, "A"), b = tstats(c, "B");
    T_EQ(a.pages_held, 12);
    T_EQ(a.evictions, 4);
    T_EQ(a.evictions_by_others, 0);
    T_EQ(b.evictions, 0);
    /* C, unreserved, uses the unreserved part: A's prompt 3 goes, not B's pages. */
    toks(t, 2 * PT, 50000);
    T_EQ(request(c, "C", t, 2 * PT), 0);
    T_OK(pgd_cache_check(c));
    a = tstats(c, "A");
    T_EQ(a.pages_held, 10);
    T_EQ(a.evictions, 6);
    T_EQ(a.evictions_by_others, 2);
    T_EQ(tstats(c, "C").pages_held, 2);
    /* B's prefix is whole: hits counted for B only. */
    T_EQ(probe(c, "B", pb, 4 * PT), 4 * PT);
    b = tstats(c, "B");
    T_EQ(b.hit_pages, 4);
    T_EQ(b.hit_tokens, 4 * PT);
    T_EQ(b.query_pages, 8); /* its first request asked for 4 pages too, and missed */
    T_EQ(b.evictions, 0);
    toks(t, 2 * PT, 1000 * 8); /* A's prompt 8 is cached */
    T_EQ(probe(c, "A", t, 2 * PT), 2 * PT);
    a = tstats(c, "A");
    T_EQ(a.hit_pages, 2);
    T_EQ(a.query_pages, 8 * 2 + 2);
    T_EQ(probe(c, "C", t, 2 * PT), 0); /* another tenant's prompt: no hit */

    /* A now reserves 8 (0.5) and holds 10, over it: C's next prompt evicts A's oldest
     * (prompt 4), down to A's reservation. */
    T_EQ(set_share(c, "A", 0.5), 2);
    toks(t, 2 * PT, 51000);
    T_EQ(request(c, "C", t, 2 * PT), 0);
    T_OK(pgd_cache_check(c));
    a = tstats(c, "A");
    T_EQ(a.pages_held, 8);
    T_EQ(a.reserved_pages, 8);
    T_EQ(a.evictions, 8);
    T_EQ(a.evictions_by_others, 4);
    /* A and B at their reservations: C's next prompt evicts C's own oldest. */
    toks(t, 2 * PT, 52000);
    T_EQ(request(c, "C", t, 2 * PT), 0);
    T_OK(pgd_cache_check(c));
    pgd_tenant_stats cst = tstats(c, "C");
    T_EQ(cst.pages_held, 4);
    T_EQ(cst.evictions, 2);
    T_EQ(cst.evictions_by_others, 0);
    toks(t, 2 * PT, 50000);
    T_EQ(probe(c, "C", t, 2 * PT), 0); /* C's first prompt went */
    /* A at its reservation evicts its own first (prompt 5), not C's over-share pages. */
    toks(t, 2 * PT, 1000 * 9);
    T_EQ(request(c, "A", t, 2 * PT), 0);
    T_OK(pgd_cache_check(c));
    a = tstats(c, "A");
    T_EQ(a.pages_held, 8);
    T_EQ(a.evictions, 10);
    T_EQ(a.evictions_by_others, 4);
    T_EQ(tstats(c, "C").pages_held, 4);
    toks(t, 2 * PT, 1000 * 5);
    T_EQ(probe(c, "A", t, 2 * PT), 0);
    toks(t, 2 * PT, 1000 * 6);
    T_EQ(probe(c, "A", t, 2 * PT), 2 * PT);

    /* Everything reserved or at its share, nothing over: a grow that needs an eviction
     * fails rather than take a reserved page. B reserves the rest (0.25 + 0.5 + 0.25). */
    T_EQ(set_share(c, "C", 0.25), 3);
    pgd_seq *s;
    T_OK(pgd_seq_create(c, "D", 1, &s));
    T_EQ(pgd_seq_grow(c, s, PT), PGD_ENOSPC);
    T_OK(pgd_cache_check(c));
    pgd_seq_destroy(c, s);
    /* The sum of every tenant's pages is the cached pages (check also recounts it). */
    pgd_cache_get_stats(c, &cs);
    uint64_t held = 0;
    for (uint32_t i = 0; i < pgd_cache_n_tenants(c); i++) {
        pgd_tenant_stats st;
        T_OK(pgd_cache_get_tenant_stats(c, i, &st));
        held += st.pages_held;
    }
    T_EQ(held, cs.n_pages_cached);
    T_EQ(cs.n_evictions, 12);
    /* An admin eviction ignores quotas (clear drops everything evictable). */
    T_EQ(pgd_cache_clear(c), 16);
    T_EQ(tstats(c, "B").pages_held, 0);
    T_EQ(tstats(c, "B").evictions_by_others, 0);
    T_OK(pgd_cache_check(c));
    pgd_cache_destroy(c);
    return 0;
}

/* ---- the policy sees the tenant; no reservation: eviction as before ---- */

typedef struct rec {
    uint32_t tenant_of_page[64];
    pgd_hash evicted[512];
    int n_evicted;
} rec;
static rec g_rec;

static void rec_insert(void *state, uint32_t page, const pgd_policy_page *info)
{
    if (page < 64) g_rec.tenant_of_page[page] = info->tenant;
    pgd_policy_builtin(PGD_POLICY_LRU)->insert(state, page, info);
}

static void rec_evict(void *ud, pgd_hash hash, uint32_t page)
{
    (void)page;
    rec *r = ud;
    if (r->n_evicted < 512) r->evicted[r->n_evicted++] = hash;
}

/* Runs a mixed three-tenant workload; records the evicted blocks in order. */
static int run_mixed(int with_tenants, rec *r)
{
    const pgd_policy_ops *lru = pgd_policy_builtin(PGD_POLICY_LRU);
    pgd_policy_ops ops = *lru;
    ops.insert = rec_insert;
    pgd_cache_params p = params(24);
    p.policy_ops = &ops;
    p.on_evict = rec_evict;
    p.event_ud = r;
    pgd_cache *c = NULL;
    T_OK(pgd_cache_create(&p, &c));
    if (with_tenants) { /* registered, shares 0: no reservation, so no filter */
        T_EQ(set_share(c, "x", 0.0), 1);
        T_EQ(set_share(c, "y", 0.0), 2);
    }
    const char *salts[] = {"x", "y", "z"};
    int32_t t[5 * PT];
    uint64_t rng = 12345;
    for (int i = 0; i < 60; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int who = (int)(rng >> 33) % 3, pages = 1 + (int)(rng >> 40) % 5;
        toks(t, (size_t)pages * PT, 100 * ((int32_t)(rng >> 50) % 12));
        T_OK(request(c, salts[who], t, (size_t)pages * PT));
        T_OK(pgd_cache_check(c));
        if (i == 10) {
            const uint32_t want = pgd_cache_tenant_of(c, salts[who], 1);
            pgd_seq *s;
            T_OK(pgd_seq_create(c, salts[who], 1, &s));
            T_ASSERT(pgd_seq_match(c, s, t, (size_t)pages * PT) > 0);
            const uint32_t *ids;
            T_ASSERT(pgd_seq_pages(c, s, &ids) > 0);
            T_EQ(g_rec.tenant_of_page[ids[0]], want); /* pgd_policy_page.tenant */
            pgd_seq_destroy(c, s);
        }
    }
    pgd_cache_destroy(c);
    return 0;
}

static int test_no_reservation_same_victims(void)
{
    static rec a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    T_OK(run_mixed(0, &a));
    T_OK(run_mixed(1, &b));
    T_ASSERT(a.n_evicted > 20);
    T_EQ(a.n_evicted, b.n_evicted);
    for (int i = 0; i < a.n_evicted; i++)
        T_ASSERT(pgd_hash_eq(a.evicted[i], b.evicted[i]));
    return 0;
}

/* ---- pins, expiry and warm, per tenant ---- */

static uint64_t g_now_ns;
static uint64_t fake_clock(void *ud)
{
    (void)ud;
    return g_now_ns;
}

/* B's reserved prefix expired: still never evicted for A (an expired page of a tenant at
 * its share waits); pins are counted per tenant; a warm counts as its salt's tenant. */
static int test_pins_expiry_warm(void)
{
    pgd_cache_params p = params(16);
    p.clock = fake_clock;
    g_now_ns = 1000000000ull;
    pgd_cache *c = NULL;
    T_OK(pgd_cache_create(&p, &c));
    T_EQ(set_share(c, "B", 0.25), 1);
    int32_t pb[4 * PT], t[2 * PT];
    toks(pb, 4 * PT, 7000);
    pgd_seq *s;
    T_OK(pgd_seq_create(c, "B", 1, &s));
    pgd_retention r = pgd_retention_default();
    r.ttl_ms = 1000;
    T_OK(pgd_seq_set_retention(c, s, &r, 4 * PT));
    T_OK(pgd_seq_grow(c, s, 4 * PT));
    T_EQ(pgd_seq_commit(c, s, pb, 4 * PT), 4);
    pgd_seq_destroy(c, s);
    g_now_ns += 2000000000ull; /* B's pages expired */
    for (int i = 0; i < 10; i++) {
        toks(t, 2 * PT, 20000 + 1000 * i);
        T_EQ(request(c, "A", t, 2 * PT), 0);
        T_OK(pgd_cache_check(c));
    }
    T_EQ(tstats(c, "B").evictions, 0);
    T_EQ(probe(c, "B", pb, 4 * PT), 4 * PT);

    /* Pins: B's chain pinned, counted for B only; unpinned, gone from the count. */
    pgd_hash h[4];
    T_EQ(pgd_cache_hash_tokens(c, "B", 1, pb, 4 * PT, h, 4), 4);
    T_EQ(pgd_cache_pin(c, h, 4, 0), 4);
    T_OK(pgd_cache_check(c));
    T_EQ(tstats(c, "B").pages_pinned, 4);
    T_EQ(tstats(c, "A").pages_pinned, 0);
    T_EQ(pgd_cache_unpin(c, h, 4), 4);
    T_EQ(tstats(c, "B").pages_pinned, 0);
    T_OK(pgd_cache_check(c));

    /* A warm of a new salt registers its tenant (nothing to promote without tiers). */
    T_EQ(pgd_cache_n_tenants(c), 3);
    T_EQ(pgd_cache_hash_tokens(c, "W", 1, pb, 4 * PT, h, 4), 4);
    T_EQ(pgd_cache_warm(c, "W", 1, h, 4), 0);
    T_EQ(pgd_cache_n_tenants(c), 4);
    T_EQ(pgd_cache_tenant_of(c, "W", 1), 3);
    T_OK(pgd_cache_check(c));
    /* An admin chain eviction ignores quotas and counts as nobody's. */
    T_EQ(pgd_cache_hash_tokens(c, "B", 1, pb, 4 * PT, h, 4), 4);
    T_EQ(pgd_cache_evict_chain(c, h, 4), 4);
    pgd_tenant_stats b = tstats(c, "B");
    T_EQ(b.pages_held, 0);
    T_EQ(b.evictions, 4);
    T_EQ(b.evictions_by_others, 0);
    T_OK(pgd_cache_check(c));
    pgd_cache_destroy(c);
    return 0;
}

/* ---- a randomized property test ---- */

/* Random requests of three tenants (shared prompt families, so hits happen; some sequences
 * live across steps and hold pages), random reservations changed now and then. After each
 * request of tenant X, for every other tenant U: if U held at least its reservation
 * before, it still does; if it held less, none of its pages went for X
 * (evictions_by_others unchanged). Check after every step. */
static int test_random_quota_property(void)
{
    const char *salts[] = {"t1", "t2", "t3"};
    for (uint64_t seed = 1; seed <= 20; seed++) {
        pgd_cache *c = make_cache(32, 0);
        T_ASSERT(c);
        uint64_t rng = seed * 0x9e3779b97f4a7c15ull;
#define RND() (rng = rng * 6364136223846793005ull + 1442695040888963407ull, (uint32_t)(rng >> 33))
        pgd_seq *live[2] = {NULL, NULL};
        int32_t t[8 * PT];
        for (int step = 0; step < 300; step++) {
            if (RND() % 25 == 0) { /* new reservations: shares of 0, 0.1 .. 0.3 */
                for (int k = 0; k < 3; k++)
                    T_OK(set_share(c, salts[k], 0.0));
                for (int k = 0; k < 3; k++)
                    T_OK(set_share(c, salts[k], (RND() % 4) * 0.1)); /* sum <= 0.9 */
            }
            int x = (int)(RND() % 3), n = 1 + (int)(RND() % 8);
            toks(t, (size_t)n * PT, 1000 * (int32_t)(RND() % 6));
            pgd_tenant_stats before[3], after[3];
            for (int k = 0; k < 3; k++)
                before[k] = tstats(c, salts[k]);
            int slot = (int)(RND() % 4); /* 0, 1: keep the sequence alive there */
            if (slot < 2 && live[slot]) {
                pgd_seq_destroy(c, live[slot]);
                live[slot] = NULL;
                for (int k = 0; k < 3; k++)
                    before[k] = tstats(c, salts[k]);
            }
            pgd_seq *s;
            T_OK(pgd_seq_create(c, salts[x], 2, &s));
            int64_t m = pgd_seq_match(c, s, t, (size_t)n * PT);
            T_OK(m);
            if (pgd_seq_grow(c, s, (size_t)n * PT - (size_t)m) == PGD_OK)
                T_OK(pgd_seq_commit(c, s, t + m, (size_t)n * PT - (size_t)m));
            if (slot < 2)
                live[slot] = s;
            else
                pgd_seq_destroy(c, s);
            T_OK(pgd_cache_check(c));
            for (int k = 0; k < 3; k++) {
                if (k == x || before[k].id == 0xeeeeeeeeeeeeeeeeull) continue; /* unseen */
                after[k] = tstats(c, salts[k]);
                if (before[k].pages_held >= before[k].reserved_pages)
                    T_ASSERT(after[k].pages_held >= before[k].reserved_pages);
                else
                    T_EQ(after[k].evictions_by_others, before[k].evictions_by_others);
            }
        }
#undef RND
        for (int k = 0; k < 2; k++)
            pgd_seq_destroy(c, live[k]);
        T_OK(pgd_cache_check(c));
        pgd_cache_destroy(c);
    }
    return 0;
}

int main(void)
{
    T_RUN(test_table);
    T_RUN(test_ids);
    T_RUN(test_set_tenant_validation);
    T_RUN(test_other_overflow);
    T_RUN(test_flood_cannot_evict_reserved);
    T_RUN(test_tier_share);
    T_RUN(test_scripted_counters);
    T_RUN(test_no_reservation_same_victims);
    T_RUN(test_pins_expiry_warm);
    T_RUN(test_random_quota_property);
    T_DONE();
}
