/* SPDX-License-Identifier: MIT */
/*
 * test_cache.c - the cache manager (cache.h) through its public API: match / grow /
 * write_slot / write_kv / commit / fork / destroy, every kv type, salts, dedup, copy-on-write,
 * eviction order, stats, KV bytes that never depend on how they were written (every kv type:
 * one write, row by row, chunks, truncate and rewrite, a prefix hit), and a randomized
 * model-based test that checks every invariant after every step.
 *
 * The model-based test runs 20 seeds x 5000 steps by default (about a second);
 * PGD_TEST_LONG=1 runs 200 seeds x 20000 steps, PGD_TEST_SEED=n runs one seed verbosely.
 * It reads refcounts through pgd_cache_pool(): fine here, the test is single-threaded (with
 * a tier, the mover threads touch page payloads of pending promotions only, never pool
 * metadata). test_model_tiers runs it again with a RAM tier below the pool.
 */
#include <pagoda/attn.h>
#include <pagoda/cache.h>

#include "t.h"

enum { NL = 2, NH = 1, HD = 2 }; /* geometry of the payload used for content tags */

static void log_stderr(void *ud, int level, const char *msg)
{
    (void)ud;
    if (level <= PGD_LOG_WARN) fprintf(stderr, "  [pagoda %d] %s\n", level, msg);
}

static const uint8_t test_key[32] = "0123456789abcdef0123456789abcdef";

static pgd_cache_params params(uint32_t page_tokens, uint32_t n_pages)
{
    pgd_cache_params p = pgd_cache_default_params();
    p.pool.n_layers = NL;
    p.pool.n_kv_heads = NH;
    p.pool.head_dim = HD;
    p.pool.page_tokens = page_tokens;
    p.pool.kv_type = PGD_KV_F32;
    p.pool.capacity_pages = n_pages;
    p.hash_key = test_key;
    p.hash_key_len = sizeof test_key;
    p.log = log_stderr;
    return p;
}

static pgd_cache *make_cache(uint32_t page_tokens, uint32_t n_pages)
{
    pgd_cache_params p = params(page_tokens, n_pages);
    pgd_cache *c = NULL;
    if (pgd_cache_create(&p, &c) != PGD_OK) return NULL;
    return c;
}

static pgd_cache_stats stats(pgd_cache *c)
{
    pgd_cache_stats st;
    memset(&st, 0, sizeof st);
    pgd_cache_get_stats(c, &st);
    return st;
}

static void toks_seq(int32_t *t, size_t n, int32_t base)
{
    for (size_t i = 0; i < n; i++)
        t[i] = base + (int32_t)i;
}

/* Grows s by n, writes nothing, commits tokens; returns the commit result. */
static int64_t feed(pgd_cache *c, pgd_seq *s, const int32_t *t, size_t n)
{
    int rc = pgd_seq_grow(c, s, n);
    if (rc != PGD_OK) return rc;
    return pgd_seq_commit(c, s, t, n);
}

/* Creates a sequence, matches t[0..n), destroys it; returns the match. */
static int64_t probe(pgd_cache *c, const char *salt, const int32_t *t, size_t n)
{
    pgd_seq *s;
    int rc = pgd_seq_create(c, salt, salt ? strlen(salt) : 0, &s);
    if (rc != PGD_OK) return rc;
    int64_t m = pgd_seq_match(c, s, t, n);
    pgd_seq_destroy(c, s);
    return m;
}

/* ---- basics ---- */

static int test_create_params(void)
{
    pgd_cache_params p = params(4, 8);
    pgd_cache *c = (pgd_cache *)(uintptr_t)1;
    p.hash_key_len = 0;
    T_EQ(pgd_cache_create(&p, &c), PGD_EINVAL);
    T_ASSERT(c == NULL);
    p.hash_key_len = 257;
    T_EQ(pgd_cache_create(&p, &c), PGD_EINVAL);
    p = params(4, 8);
    p.policy = PGD_POLICY_BELADY; /* without next_use */
    T_EQ(pgd_cache_create(&p, &c), PGD_EINVAL);
    p = params(3, 8);
    T_EQ(pgd_cache_create(&p, &c), PGD_EINVAL);
    p = params(4, 0);
    p.pool.capacity_bytes = 1;
    T_EQ(pgd_cache_create(&p, &c), PGD_EINVAL);
    T_ASSERT(c == NULL);
    p = params(4, 8);
    p.hash_key = NULL;
    p.hash_key_len = 0;
    T_EQ(pgd_cache_create(&p, &c), PGD_OK);
    T_EQ(pgd_cache_page_tokens(c), 4);
    T_ASSERT(pgd_cache_pool(c) != NULL);
    T_EQ(pgd_pool_n_pages(pgd_cache_pool(c)), 8);
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_cache_destroy(c);
    pgd_cache_destroy(NULL);

    pgd_policy_kind k;
    T_EQ(pgd_policy_from_name("lru", &k), PGD_OK);
    T_EQ(k, PGD_POLICY_LRU);
    T_EQ(pgd_policy_from_name("belady", &k), PGD_OK);
    T_EQ(k, PGD_POLICY_BELADY);
    T_EQ(pgd_policy_from_name("fifo", &k), PGD_EINVAL);
    T_ASSERT(strcmp(pgd_policy_name(PGD_POLICY_LRU), "lru") == 0);
    T_ASSERT(strcmp(pgd_policy_name((pgd_policy_kind)9), "?") == 0);
    return 0;
}

static int test_empty_match(void)
{
    pgd_cache *c = make_cache(4, 16);
    pgd_seq *s;
    int32_t t[10];
    T_ASSERT(c);
    toks_seq(t, 10, 100);
    T_OK(pgd_seq_create(c, NULL, 0, &s));
    T_EQ(pgd_seq_match(c, s, t, 10), 0);
    T_EQ(pgd_seq_length(c, s), 0);
    T_EQ(pgd_seq_n_committed(c, s), 0);
    const uint32_t *ids;
    T_EQ(pgd_seq_pages(c, s, &ids), 0);
    pgd_cache_stats st = stats(c);
    T_EQ(st.n_query_tokens, 10);
    T_EQ(st.n_hit_tokens, 0);
    T_EQ(st.n_hit_pages, 0);
    T_EQ(st.n_seqs, 1);
    T_EQ(st.n_pages_free, 16);
    T_EQ(st.n_pages_total, 16);
    T_EQ(pgd_cache_check(c), PGD_OK);
    T_EQ(pgd_seq_grow(c, s, 1), PGD_OK);
    T_EQ(pgd_seq_match(c, s, t, 10), PGD_ESTATE);
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_seq_destroy(c, s);
    pgd_seq_destroy(c, NULL);
    T_EQ(stats(c).n_seqs, 0);
    pgd_cache_destroy(c);
    return 0;
}

static int test_commit_destroy_match(void)
{
    pgd_cache *c = make_cache(4, 24);
    pgd_seq *a, *b, *d;
    int32_t t[16];
    const uint32_t *ids;
    uint32_t a_ids[3];
    T_ASSERT(c);
    toks_seq(t, 16, 7);
    T_OK(pgd_seq_create(c, NULL, 0, &a));
    T_EQ(pgd_seq_grow(c, a, 10), PGD_OK);
    T_EQ(pgd_seq_length(c, a), 10);
    T_EQ(pgd_seq_pages(c, a, &ids), 3);
    T_EQ(pgd_cache_check(c), PGD_OK);
    T_EQ(pgd_seq_commit(c, a, t, 10), 2);
    T_EQ(pgd_seq_n_committed(c, a), 10);
    T_EQ(pgd_seq_pages(c, a, &ids), 3);
    memcpy(a_ids, ids, sizeof a_ids);
    pgd_cache_stats st = stats(c);
    T_EQ(st.n_registered, 2);
    T_EQ(st.n_pages_cached, 2);
    T_EQ(st.n_pages_used, 3);
    T_EQ(st.n_pages_evictable, 0);
    T_EQ(st.n_pages_free, 21);
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_seq_destroy(c, a);
    st = stats(c);
    T_EQ(st.n_pages_cached, 2);
    T_EQ(st.n_pages_evictable, 2);
    T_EQ(st.n_pages_used, 0);
    T_EQ(st.n_pages_free, 22); /* the partial page was freed */
    T_EQ(pgd_cache_check(c), PGD_OK);

    /* same tokens: all full pages match; the partial page does not */
    T_OK(pgd_seq_create(c, NULL, 0, &b));
    T_EQ(pgd_seq_match(c, b, t, 10), 8);
    T_EQ(pgd_seq_length(c, b), 8);
    T_EQ(pgd_seq_n_committed(c, b), 8);
    T_EQ(pgd_seq_pages(c, b, &ids), 2);
    T_EQ(ids[0], a_ids[0]);
    T_EQ(ids[1], a_ids[1]);
    T_EQ(pgd_pool_refcount(pgd_cache_pool(c), ids[0]), 2);
    st = stats(c);
    T_EQ(st.n_hit_tokens, 8);
    T_EQ(st.n_hit_pages, 2);
    T_EQ(st.n_query_tokens, 10);
    T_EQ(st.n_pages_evictable, 0);
    T_EQ(st.n_pages_used, 2);
    T_EQ(pgd_cache_check(c), PGD_OK);
    /* matching a non-empty sequence is a state error */
    T_EQ(pgd_seq_match(c, b, t, 10), PGD_ESTATE);
    /* b continues where the cache left off */
    T_EQ(pgd_seq_grow(c, b, 4), PGD_OK);
    T_EQ(pgd_seq_commit(c, b, t + 8, 4), 1);
    T_EQ(pgd_seq_n_committed(c, b), 12);
    T_EQ(pgd_cache_check(c), PGD_OK);

    /* shorter query: fewer pages; a query of 3 tokens has no full page */
    T_EQ(probe(c, NULL, t, 7), 4);
    T_EQ(probe(c, NULL, t, 3), 0);
    T_EQ(probe(c, NULL, t, 16), 12);
    /* differing in the second page: one page */
    int32_t u[16];
    memcpy(u, t, sizeof u);
    u[5] = -1;
    T_EQ(probe(c, NULL, u, 16), 4);
    u[0] = -1;
    T_EQ(probe(c, NULL, u, 16), 0);
    T_EQ(pgd_cache_check(c), PGD_OK);

    /* commit past the length: EINVAL, nothing changed */
    T_OK(pgd_seq_create(c, NULL, 0, &d));
    T_EQ(pgd_seq_grow(c, d, 5), PGD_OK);
    st = stats(c);
    T_EQ(pgd_seq_commit(c, d, u, 6), PGD_EINVAL);
    T_EQ(pgd_seq_n_committed(c, d), 0);
    pgd_cache_stats st2 = stats(c);
    T_ASSERT(memcmp(&st, &st2, sizeof st) == 0);
    /* commit in pieces */
    T_EQ(pgd_seq_commit(c, d, u, 2), 0);
    T_EQ(pgd_seq_commit(c, d, u + 2, 1), 0);
    T_EQ(pgd_seq_commit(c, d, u + 3, 2), 1);
    T_EQ(pgd_seq_n_committed(c, d), 5);
    T_EQ(pgd_seq_commit(c, d, u + 5, 1), PGD_EINVAL);
    T_EQ(pgd_cache_check(c), PGD_OK);
    T_EQ(probe(c, NULL, u, 8), 4);
    pgd_seq_destroy(c, d);
    pgd_seq_destroy(c, b);
    st = stats(c);
    T_EQ(st.n_pages_used, 0);
    T_EQ(st.n_pages_free + st.n_pages_evictable, 24);
    T_EQ(pgd_cache_clear(c), (int)st.n_pages_evictable);
    st = stats(c);
    T_EQ(st.n_pages_free, 24);
    T_EQ(st.n_pages_cached, 0);
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_cache_destroy(c);
    return 0;
}

static int test_salt_isolation(void)
{
    pgd_cache *c = make_cache(4, 24);
    pgd_seq *a;
    int32_t t[8];
    T_ASSERT(c);
    toks_seq(t, 8, 1);
    T_OK(pgd_seq_create(c, "x", 1, &a));
    T_EQ(feed(c, a, t, 8), 2);
    T_EQ(probe(c, "y", t, 8), 0);
    T_EQ(probe(c, NULL, t, 8), 0);
    T_EQ(probe(c, "xx", t, 8), 0);
    T_EQ(probe(c, "x", t, 8), 8);
    pgd_hash hx[2], hy[2], h0[2];
    T_EQ(pgd_cache_hash_tokens(c, "x", 1, t, 8, hx, 2), 2);
    T_EQ(pgd_cache_hash_tokens(c, "y", 1, t, 8, hy, 2), 2);
    T_EQ(pgd_cache_hash_tokens(c, NULL, 0, t, 8, h0, 2), 2);
    for (int i = 0; i < 2; i++) {
        T_ASSERT(!pgd_hash_eq(hx[i], hy[i]));
        T_ASSERT(!pgd_hash_eq(hx[i], h0[i]));
    }
    /* a "y" sequence with the same tokens gets its own pages */
    pgd_seq *b;
    const uint32_t *ia, *ib;
    T_OK(pgd_seq_create(c, "y", 1, &b));
    T_EQ(feed(c, b, t, 8), 2);
    T_EQ(pgd_seq_pages(c, a, &ia), 2);
    T_EQ(pgd_seq_pages(c, b, &ib), 2);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            T_ASSERT(ia[i] != ib[j]);
    T_EQ(stats(c).n_pages_cached, 4);
    T_EQ(stats(c).n_dedup, 0);
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_seq_destroy(c, a);
    pgd_seq_destroy(c, b);
    pgd_cache_destroy(c);
    return 0;
}

static int test_hash_tokens_and_hash_api(void)
{
    pgd_cache *c = make_cache(4, 24);
    pgd_seq *a, *b, *e, *f;
    int32_t t[14], u[8];
    pgd_hash h[8], hu[2];
    T_ASSERT(c);
    toks_seq(t, 14, 50);
    toks_seq(u, 8, 900);
    T_EQ(pgd_cache_hash_tokens(c, "s", 1, t, 14, h, 8), 3);
    T_EQ(pgd_cache_hash_tokens(c, "s", 1, t, 14, h, 2), 2);
    T_EQ(pgd_cache_hash_tokens(c, "s", 1, t, 3, h, 8), 0);
    T_EQ(pgd_cache_hash_tokens(c, "s", 1, t, 14, h, 8), 3);
    /* the chain: a prefix hashes to a prefix of the hashes */
    pgd_hash h2[8];
    T_EQ(pgd_cache_hash_tokens(c, "s", 1, t, 8, h2, 8), 2);
    T_ASSERT(pgd_hash_eq(h[0], h2[0]) && pgd_hash_eq(h[1], h2[1]));

    T_OK(pgd_seq_create(c, "s", 1, &a));
    T_EQ(feed(c, a, t, 14), 3);
    pgd_seq_destroy(c, a);

    /* token commit -> hash match */
    pgd_cache_stats st0 = stats(c);
    T_OK(pgd_seq_create(c, "s", 1, &b));
    T_EQ(pgd_seq_match_hashes(c, b, h, 3), 3);
    T_EQ(pgd_seq_length(c, b), 12);
    pgd_cache_stats st1 = stats(c);
    T_EQ(st1.n_query_tokens - st0.n_query_tokens, 12);
    T_EQ(st1.n_hit_tokens - st0.n_hit_tokens, 12);
    T_EQ(st1.n_query_pages - st0.n_query_pages, 3);
    T_EQ(st1.n_hit_pages - st0.n_hit_pages, 3);
    T_EQ(pgd_seq_match_hashes(c, b, h, 3), PGD_ESTATE);
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_seq_destroy(c, b);
    /* a partly wrong chain matches up to the first miss */
    pgd_hash hx[3] = {h[0], h[1], h[1]};
    T_OK(pgd_seq_create(c, "s", 1, &b));
    T_EQ(pgd_seq_match_hashes(c, b, hx, 3), 2);
    pgd_seq_destroy(c, b);

    /* hash commit -> token match */
    T_EQ(pgd_cache_hash_tokens(c, "s", 1, u, 8, hu, 2), 2);
    T_OK(pgd_seq_create(c, "s", 1, &e));
    T_EQ(pgd_seq_grow(c, e, 6), PGD_OK);
    T_EQ(pgd_seq_commit_hashes(c, e, hu, 2), PGD_EINVAL); /* second page beyond length */
    T_EQ(pgd_seq_n_committed(c, e), 0);
    T_EQ(pgd_seq_grow(c, e, 2), PGD_OK);
    T_EQ(pgd_seq_commit_hashes(c, e, hu, 2), 2);
    T_EQ(pgd_seq_n_committed(c, e), 8);
    T_EQ(pgd_seq_grow(c, e, 4), PGD_OK);
    T_EQ(pgd_seq_commit(c, e, u, 1), PGD_ESTATE);
    T_EQ(pgd_seq_n_committed(c, e), 8);
    T_EQ(pgd_cache_check(c), PGD_OK);
    T_EQ(probe(c, "s", u, 8), 8);
    T_EQ(probe(c, "t", u, 8), 0);
    /* a token-committed sequence cannot switch to hashes */
    T_OK(pgd_seq_create(c, "s", 1, &f));
    T_EQ(pgd_seq_grow(c, f, 4), PGD_OK);
    T_EQ(pgd_seq_commit(c, f, t, 2), 0);
    T_EQ(pgd_seq_commit_hashes(c, f, h, 1), PGD_ESTATE);
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_seq_destroy(c, e);
    pgd_seq_destroy(c, f);
    pgd_cache_destroy(c);
    return 0;
}

static int test_pinned_key(void)
{
    pgd_cache_params p = params(4, 8);
    pgd_cache *c1, *c2, *c3, *c4, *c5;
    int32_t t[8];
    pgd_hash h1[2], h2[2], h3[2], h4[2], h5[2];
    toks_seq(t, 8, 3);
    T_OK(pgd_cache_create(&p, &c1));
    T_OK(pgd_cache_create(&p, &c2));
    uint8_t other[32];
    memcpy(other, test_key, 32);
    other[31] ^= 1;
    p.hash_key = other;
    T_OK(pgd_cache_create(&p, &c3));
    p.hash_key = NULL;
    p.hash_key_len = 0;
    T_OK(pgd_cache_create(&p, &c4));
    p = params(4, 8);
    p.model_fingerprint.lo = 1;
    T_OK(pgd_cache_create(&p, &c5));
    T_EQ(pgd_cache_hash_tokens(c1, "a", 1, t, 8, h1, 2), 2);
    T_EQ(pgd_cache_hash_tokens(c2, "a", 1, t, 8, h2, 2), 2);
    T_EQ(pgd_cache_hash_tokens(c3, "a", 1, t, 8, h3, 2), 2);
    T_EQ(pgd_cache_hash_tokens(c4, "a", 1, t, 8, h4, 2), 2);
    T_EQ(pgd_cache_hash_tokens(c5, "a", 1, t, 8, h5, 2), 2);
    for (int i = 0; i < 2; i++) {
        T_ASSERT(pgd_hash_eq(h1[i], h2[i]));
        T_ASSERT(!pgd_hash_eq(h1[i], h3[i]));
        T_ASSERT(!pgd_hash_eq(h1[i], h4[i]));
        T_ASSERT(!pgd_hash_eq(h1[i], h5[i]));
    }
    /* hashes committed in one cache match in another with the same key */
    pgd_seq *s;
    T_OK(pgd_seq_create(c1, "a", 1, &s));
    T_EQ(feed(c1, s, t, 8), 2);
    pgd_seq_destroy(c1, s);
    T_OK(pgd_seq_create(c2, "a", 1, &s));
    T_EQ(pgd_seq_grow(c2, s, 8), PGD_OK);
    T_EQ(pgd_seq_commit_hashes(c2, s, h1, 2), 2);
    pgd_seq_destroy(c2, s);
    T_EQ(probe(c2, "a", t, 8), 8);
    T_EQ(probe(c3, "a", t, 8), 0);
    pgd_cache_destroy(c1);
    pgd_cache_destroy(c2);
    pgd_cache_destroy(c3);
    pgd_cache_destroy(c4);
    pgd_cache_destroy(c5);
    return 0;
}

/* ---- write_kv ---- */

/* pgd_seq_write_kv on an f32 pool stores exactly the rows pgd_seq_write_slot points at,
 * copies a shared page first, and refuses what write_slot refuses. */
static int test_write_kv(void)
{
    pgd_cache *c = make_cache(4, 8);
    pgd_seq *a, *b;
    T_ASSERT(c);
    T_OK(pgd_seq_create(c, NULL, 0, &a));
    T_OK(pgd_seq_grow(c, a, 6));
    float k[3 * NH * HD], v[3 * NH * HD];
    for (int i = 0; i < 3 * NH * HD; i++) {
        k[i] = (float)i + 0.5f;
        v[i] = -(float)i;
    }
    for (uint32_t layer = 0; layer < NL; layer++)
        T_OK(pgd_seq_write_kv(c, a, 2, 3, layer, k, v)); /* positions 2..4: across pages */
    for (uint64_t pos = 2; pos < 5; pos++) {
        uint32_t page, slot;
        T_OK(pgd_seq_write_slot(c, a, pos, &page, &slot));
        const float *kr = (const float *)pgd_pool_k(pgd_cache_pool(c), page, 1, 0) + slot * HD;
        const float *vr = (const float *)pgd_pool_v(pgd_cache_pool(c), page, 1, 0) + slot * HD;
        for (int d = 0; d < HD; d++) {
            T_ASSERT(kr[d] == k[(pos - 2) * HD + d]);
            T_ASSERT(vr[d] == v[(pos - 2) * HD + d]);
        }
    }
    int32_t t[4] = {1, 2, 3, 4};
    T_OK(pgd_seq_commit(c, a, t, 4)); /* fork needs every page but the last committed */
    T_EQ(pgd_seq_write_kv(c, a, 3, 1, 0, k, v), PGD_EINVAL); /* a committed page */
    T_OK(pgd_seq_fork(c, a, &b));
    T_OK(pgd_seq_write_kv(c, b, 5, 1, 0, k, v)); /* shared partial page: copied */
    T_EQ(stats(c).n_cow_copies, 1);
    T_EQ(pgd_seq_write_kv(c, b, 6, 1, 0, k, v), PGD_EINVAL);    /* past the length */
    T_EQ(pgd_seq_write_kv(c, b, 5, 2, 0, k, v), PGD_EINVAL);    /* runs past it */
    T_EQ(pgd_seq_write_kv(c, b, 5, 1, NL, k, v), PGD_EINVAL);   /* no such layer */
    T_EQ(pgd_seq_write_kv(c, b, 5, 1, 0, NULL, v), PGD_EINVAL); /* no K */
    T_OK(pgd_seq_write_kv(c, b, 5, 0, 0, NULL, NULL));          /* nothing to write */
    T_OK(pgd_cache_check(c));
    pgd_seq_destroy(c, a);
    pgd_seq_destroy(c, b);
    pgd_cache_destroy(c);
    return 0;
}

/* Every kv type runs the whole lifecycle; a metadata-only pool refuses write_kv. */
static int test_kv_types(void)
{
    static const pgd_kv_type types[] = {PGD_KV_F32,  PGD_KV_F16,  PGD_KV_BF16,
                                        PGD_KV_Q8_0, PGD_KV_Q4_0, PGD_KV_KIVI2};
    for (int i = 0; i < 6; i++) {
        pgd_cache_params p = params(16, 8);
        pgd_cache *c = NULL;
        pgd_seq *s, *s2;
        p.pool.kv_type = types[i];
        p.pool.head_dim = 8; /* blocks of q8_0 / q4_0 / kivi2 span 4 rows */
        p.pool.kv_rotate = 1;
        p.pool.key_bounds = 1;
        T_OK(pgd_cache_create(&p, &c));
        T_EQ(pgd_pool_region_bytes(pgd_cache_pool(c)) % 16, 0);
        T_OK(pgd_seq_create(c, NULL, 0, &s));
        T_OK(pgd_seq_grow(c, s, 20));
        float k[20 * 8], v[20 * 8];
        for (int j = 0; j < 20 * 8; j++) {
            k[j] = (float)(j % 13) * 0.1f;
            v[j] = (float)(j % 7) * -0.2f;
        }
        for (uint32_t layer = 0; layer < NL; layer++)
            T_OK(pgd_seq_write_kv(c, s, 0, 20, layer, k, v));
        int32_t t[20];
        toks_seq(t, 20, 100);
        T_EQ(pgd_seq_commit(c, s, t, 20), 1);
        T_OK(pgd_seq_fork(c, s, &s2));
        T_OK(pgd_seq_write_kv(c, s2, 19, 1, 1, k, v));
        T_OK(pgd_cache_check(c));
        pgd_seq_destroy(c, s);
        pgd_seq_destroy(c, s2);
        T_EQ(probe(c, NULL, t, 20), 16);
        pgd_cache_destroy(c);
        p.pool.metadata_only = 1;
        T_OK(pgd_cache_create(&p, &c));
        T_OK(pgd_seq_create(c, NULL, 0, &s));
        T_OK(pgd_seq_grow(c, s, 2));
        T_EQ(pgd_seq_write_kv(c, s, 0, 1, 0, k, v), PGD_EINVAL);
        pgd_seq_destroy(c, s);
        pgd_cache_destroy(c);
    }
    return 0;
}

/* ---- fork, copy-on-write, write_slot ---- */

static float *kslot(pgd_cache *c, uint32_t page, uint32_t layer, uint32_t slot)
{
    float *k = pgd_pool_k(pgd_cache_pool(c), page, layer, 0);
    return k + (size_t)slot * HD;
}

static int write_pos(pgd_cache *c, pgd_seq *s, uint64_t pos, float val)
{
    uint32_t page, slot;
    int rc = pgd_seq_write_slot(c, s, pos, &page, &slot);
    if (rc != PGD_OK) return rc;
    for (uint32_t l = 0; l < NL; l++) {
        float *k = kslot(c, page, l, slot);
        float *v = (float *)pgd_pool_v(pgd_cache_pool(c), page, l, 0) + (size_t)slot * HD;
        for (int d = 0; d < HD; d++) {
            k[d] = val + (float)l;
            v[d] = -val - (float)d;
        }
    }
    return PGD_OK;
}

static int read_ok(pgd_cache *c, pgd_seq *s, uint64_t pos, float val)
{
    const uint32_t *ids;
    pgd_seq_pages(c, s, &ids);
    uint32_t page = ids[pos / 4], slot = (uint32_t)(pos % 4);
    for (uint32_t l = 0; l < NL; l++) {
        float *k = kslot(c, page, l, slot);
        float *v = (float *)pgd_pool_v(pgd_cache_pool(c), page, l, 0) + (size_t)slot * HD;
        for (int d = 0; d < HD; d++)
            if (k[d] != val + (float)l || v[d] != -val - (float)d) return 0;
    }
    return 1;
}

static int test_fork_cow(void)
{
    pgd_cache *c = make_cache(4, 24);
    pgd_seq *a, *b;
    int32_t t[12];
    const uint32_t *ia, *ib;
    uint32_t page, slot;
    T_ASSERT(c);
    pgd_pool *pool = pgd_cache_pool(c);
    toks_seq(t, 12, 11);
    T_OK(pgd_seq_create(c, NULL, 0, &a));
    T_EQ(pgd_seq_grow(c, a, 6), PGD_OK);
    for (int p = 0; p < 6; p++)
        T_EQ(write_pos(c, a, (uint64_t)p, (float)(10 * p)), PGD_OK);
    T_EQ(stats(c).n_cow_copies, 0);
    T_EQ(pgd_seq_commit(c, a, t, 6), 1);
    T_OK(pgd_seq_fork(c, a, &b));
    T_EQ(pgd_seq_length(c, b), 6);
    T_EQ(pgd_seq_n_committed(c, b), 6);
    T_EQ(pgd_seq_pages(c, a, &ia), 2);
    T_EQ(pgd_seq_pages(c, b, &ib), 2);
    T_EQ(ia[0], ib[0]);
    T_EQ(ia[1], ib[1]);
    T_EQ(pgd_pool_refcount(pool, ia[0]), 3); /* a, b, index */
    T_EQ(pgd_pool_refcount(pool, ia[1]), 2); /* a, b */
    T_EQ(stats(c).n_seqs, 2);
    T_EQ(pgd_cache_check(c), PGD_OK);
    uint32_t shared = ia[1], p0 = ia[0];

    /* b writes into the shared partial page: copy first */
    T_EQ(pgd_seq_write_slot(c, b, 6 - 0, &page, &slot), PGD_EINVAL); /* pos == length */
    T_EQ(pgd_seq_grow(c, b, 2), PGD_OK);
    T_EQ(pgd_seq_write_slot(c, b, 6, &page, &slot), PGD_OK);
    T_EQ(slot, 2);
    T_ASSERT(page != shared);
    T_EQ(stats(c).n_cow_copies, 1);
    T_EQ(pgd_seq_pages(c, b, &ib), 2);
    T_EQ(ib[1], page);
    T_EQ(pgd_pool_refcount(pool, shared), 1);
    T_EQ(pgd_pool_refcount(pool, page), 1);
    T_EQ(pgd_cache_check(c), PGD_OK);
    /* contents preserved in the copy and in the original */
    for (int p = 0; p < 6; p++) {
        T_ASSERT(read_ok(c, a, (uint64_t)p, (float)(10 * p)));
        T_ASSERT(read_ok(c, b, (uint64_t)p, (float)(10 * p)));
    }
    T_EQ(write_pos(c, b, 6, 1000.0f), PGD_OK);
    T_EQ(write_pos(c, b, 5, 555.0f), PGD_OK); /* committed, but not in a registered page */
    T_ASSERT(read_ok(c, a, 5, 50.0f));
    T_EQ(stats(c).n_cow_copies, 1); /* b's page is private now */
    /* a's page is private again: no copy */
    T_EQ(pgd_seq_grow(c, a, 1), PGD_OK);
    T_EQ(pgd_seq_write_slot(c, a, 6, &page, &slot), PGD_OK);
    T_EQ(page, shared);
    T_EQ(stats(c).n_cow_copies, 1);

    /* positions inside a registered page are immutable */
    T_EQ(pgd_seq_write_slot(c, a, 0, &page, &slot), PGD_EINVAL);
    T_EQ(pgd_seq_write_slot(c, b, 3, &page, &slot), PGD_EINVAL);
    T_EQ(pgd_seq_write_slot(c, b, 8, &page, &slot), PGD_EINVAL);
    T_EQ(pgd_cache_check(c), PGD_OK);

    /* a fork of a fork; destroying in any order frees everything */
    pgd_seq *d;
    T_OK(pgd_seq_fork(c, b, &d));
    T_EQ(pgd_pool_refcount(pool, p0), 4);
    pgd_seq_destroy(c, b);
    T_EQ(pgd_cache_check(c), PGD_OK);
    T_EQ(pgd_pool_refcount(pool, p0), 3);
    pgd_seq_destroy(c, a);
    pgd_seq_destroy(c, d);
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_cache_stats st = stats(c);
    T_EQ(st.n_pages_used, 0);
    T_EQ(st.n_pages_cached, 1);
    T_EQ(st.n_pages_free, 23);
    pgd_cache_destroy(c);
    return 0;
}

/* cache.h: every page of the source but the last must be committed before a fork;
 * otherwise PGD_ESTATE with nothing changed. One uncommitted (last) page is fine. */
static int test_fork_uncommitted_pages(void)
{
    pgd_cache *c = make_cache(4, 24);
    pgd_seq *a, *b = NULL;
    pgd_cache_stats before, after;
    T_ASSERT(c);
    T_OK(pgd_seq_create(c, NULL, 0, &a));
    T_EQ(pgd_seq_grow(c, a, 8), PGD_OK);
    pgd_cache_get_stats(c, &before);
    int rc = pgd_seq_fork(c, a, &b);
    pgd_cache_get_stats(c, &after);
    T_EQ(rc, PGD_ESTATE);
    T_ASSERT(b == NULL);
    T_EQ(after.n_seqs, before.n_seqs);
    T_EQ(after.n_pages_free, before.n_pages_free);
    T_EQ(pgd_cache_check(c), PGD_OK);
    static const int32_t t[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    T_EQ(pgd_seq_commit(c, a, t, 5), 1);  /* page 0 committed, page 1 partial */
    T_EQ(pgd_seq_fork(c, a, &b), PGD_OK); /* now only the last page is uncommitted */
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_seq_destroy(c, b);
    pgd_seq_destroy(c, a);
    pgd_cache_destroy(c);
    return 0;
}

/* Fork shares a fully written partial page; both commit the same tokens. */
static int test_fork_commit_shared_page(void)
{
    pgd_cache *c = make_cache(4, 24);
    pgd_seq *a, *b;
    int32_t t[8];
    const uint32_t *ia, *ib;
    T_ASSERT(c);
    toks_seq(t, 8, 1);
    T_OK(pgd_seq_create(c, NULL, 0, &a));
    T_EQ(pgd_seq_grow(c, a, 8), PGD_OK);
    for (int p = 0; p < 8; p++)
        T_EQ(write_pos(c, a, (uint64_t)p, (float)p), PGD_OK);
    T_EQ(pgd_seq_commit(c, a, t, 5), 1);
    T_OK(pgd_seq_fork(c, a, &b));
    T_EQ(pgd_seq_commit(c, a, t + 5, 3), 1);
    T_EQ(pgd_cache_check(c), PGD_OK);
    T_EQ(pgd_seq_commit(c, b, t + 5, 3), 0); /* already registered: same page */
    T_EQ(pgd_cache_check(c), PGD_OK);
    T_EQ(pgd_seq_pages(c, a, &ia), 2);
    T_EQ(pgd_seq_pages(c, b, &ib), 2);
    T_EQ(ia[1], ib[1]);
    T_EQ(pgd_pool_refcount(pgd_cache_pool(c), ia[1]), 3);
    pgd_cache_stats st = stats(c);
    T_EQ(st.n_pages_cached, 2);
    T_EQ(st.n_registered, 2);
    pgd_seq_destroy(c, a);
    pgd_seq_destroy(c, b);
    T_EQ(pgd_cache_check(c), PGD_OK);
    T_EQ(stats(c).n_pages_evictable, 2);
    T_EQ(stats(c).n_pages_free, 22);
    pgd_cache_destroy(c);
    return 0;
}

/* ---- dedup ---- */

static int test_dedup_interleaved(void)
{
    pgd_cache *c = make_cache(4, 24);
    pgd_seq *a, *b;
    int32_t t[8];
    const uint32_t *ia, *ib;
    T_ASSERT(c);
    toks_seq(t, 8, 40);
    T_OK(pgd_seq_create(c, "s", 1, &a));
    T_OK(pgd_seq_create(c, "s", 1, &b));
    T_EQ(pgd_seq_grow(c, a, 8), PGD_OK);
    T_EQ(pgd_seq_grow(c, b, 8), PGD_OK);
    for (int p = 0; p < 8; p++) {
        T_EQ(write_pos(c, a, (uint64_t)p, (float)p), PGD_OK);
        T_EQ(write_pos(c, b, (uint64_t)p, (float)p), PGD_OK);
    }
    T_EQ(stats(c).n_pages_free, 20);
    T_EQ(pgd_seq_commit(c, a, t, 4), 1);
    T_EQ(pgd_seq_commit(c, b, t, 4), 0);
    pgd_cache_stats st = stats(c);
    T_EQ(st.n_dedup, 1);
    T_EQ(st.n_registered, 1);
    T_EQ(st.n_pages_cached, 1);
    T_EQ(st.n_pages_free, 21); /* b's copy went back */
    pgd_seq_pages(c, a, &ia);
    pgd_seq_pages(c, b, &ib);
    T_EQ(ia[0], ib[0]);
    T_ASSERT(ia[1] != ib[1]);
    T_EQ(pgd_cache_check(c), PGD_OK);
    /* the other order for the second page */
    T_EQ(pgd_seq_commit(c, b, t + 4, 4), 1);
    T_EQ(pgd_seq_commit(c, a, t + 4, 4), 0);
    st = stats(c);
    T_EQ(st.n_dedup, 2);
    T_EQ(st.n_registered, 2);
    T_EQ(st.n_pages_cached, 2);
    T_EQ(st.n_pages_free, 22);
    T_EQ(pgd_seq_pages(c, a, &ia), 2);
    T_EQ(pgd_seq_pages(c, b, &ib), 2);
    T_EQ(ia[0], ib[0]);
    T_EQ(ia[1], ib[1]);
    T_EQ(pgd_pool_refcount(pgd_cache_pool(c), ia[0]), 3);
    T_EQ(pgd_pool_refcount(pgd_cache_pool(c), ia[1]), 3);
    for (int p = 0; p < 8; p++)
        T_ASSERT(read_ok(c, a, (uint64_t)p, (float)p));
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_seq_destroy(c, a);
    pgd_seq_destroy(c, b);
    st = stats(c);
    T_EQ(st.n_pages_evictable, 2);
    T_EQ(st.n_pages_free, 22);
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_cache_destroy(c);
    return 0;
}

/* Hash mode end to end (what replay does): match a prefix, grow, commit the rest. */
static int test_hash_mode_continuation(void)
{
    pgd_cache *c = make_cache(4, 24);
    pgd_seq *a;
    int32_t t[24];
    pgd_hash h[6];
    T_ASSERT(c);
    toks_seq(t, 24, 3);
    T_EQ(pgd_cache_hash_tokens(c, NULL, 0, t, 24, h, 6), 6);
    T_OK(pgd_seq_create(c, NULL, 0, &a));
    T_EQ(pgd_seq_match_hashes(c, a, h, 2), 0);
    T_EQ(pgd_seq_grow(c, a, 8), PGD_OK);
    T_EQ(pgd_seq_commit_hashes(c, a, h, 2), 2);
    pgd_seq_destroy(c, a);
    T_OK(pgd_seq_create(c, NULL, 0, &a));
    T_EQ(pgd_seq_match_hashes(c, a, h, 6), 2);
    T_EQ(pgd_seq_grow(c, a, 16), PGD_OK);
    T_EQ(pgd_seq_commit_hashes(c, a, h + 2, 4), 4);
    T_EQ(pgd_seq_n_committed(c, a), 24);
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_seq_destroy(c, a);
    T_EQ(probe(c, NULL, t, 24), 24); /* the hashes were pgd_cache_hash_tokens': same chain */
    /* a chain that reuses a hash at another position: the page stays private */
    pgd_hash bad[3] = {h[0], h[1], h[0]};
    T_EQ(pgd_cache_clear(c), 6);
    T_OK(pgd_seq_create(c, NULL, 0, &a));
    T_EQ(pgd_seq_grow(c, a, 12), PGD_OK);
    int rc = pgd_seq_commit_hashes(c, a, bad, 3);
    T_ASSERT(rc >= 0 && rc <= 2);
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_cache_stats st = stats(c);
    T_EQ(st.n_pages_cached, 2);
    pgd_seq_destroy(c, a);
    T_EQ(pgd_cache_check(c), PGD_OK);
    st = stats(c);
    T_EQ(st.n_pages_free + st.n_pages_evictable, 24);
    pgd_cache_destroy(c);
    return 0;
}

/* Misuse that must not corrupt the cache: a fork commits other tokens into the shared
 * page without writing it (the page already holds the parent's block). */
static int test_fork_commit_without_write(void)
{
    pgd_cache *c = make_cache(4, 24);
    pgd_seq *a, *b;
    int32_t x[8], y[8];
    T_ASSERT(c);
    toks_seq(x, 8, 10);
    toks_seq(y, 8, 20);
    T_OK(pgd_seq_create(c, NULL, 0, &a));
    T_EQ(pgd_seq_grow(c, a, 4), PGD_OK);
    T_OK(pgd_seq_fork(c, a, &b));
    T_EQ(pgd_seq_commit(c, a, x, 4), 1);
    int rc = pgd_seq_commit(c, b, y, 4);
    T_ASSERT(rc == 0 || rc == PGD_EINVAL);
    T_EQ(pgd_cache_check(c), PGD_OK);
    T_EQ(pgd_seq_grow(c, b, 4), PGD_OK);
    rc = pgd_seq_commit(c, b, y + (pgd_seq_n_committed(c, b) ? 4 : 0), 4);
    T_ASSERT(rc >= 0 || rc == PGD_EINVAL);
    T_EQ(pgd_cache_check(c), PGD_OK);
    T_EQ(probe(c, NULL, y, 8), 0); /* y's blocks were never computed */
    T_EQ(probe(c, NULL, x, 8), 4);
    pgd_seq_destroy(c, a);
    pgd_seq_destroy(c, b);
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_cache_stats st = stats(c);
    T_EQ(st.n_pages_free + st.n_pages_evictable, 24);
    T_EQ(pgd_cache_clear(c), (int)st.n_pages_evictable);
    T_EQ(stats(c).n_pages_free, 24);
    pgd_cache_destroy(c);
    return 0;
}

static int test_bad_sizes(void)
{
    pgd_cache *c = make_cache(4, 8);
    pgd_seq *a;
    uint32_t page, slot;
    T_ASSERT(c);
    T_OK(pgd_seq_create(c, NULL, 0, &a));
    pgd_cache_stats st = stats(c), st2;
    T_EQ(pgd_seq_grow(c, a, (size_t)UINT32_MAX * 4 + 8), PGD_ENOSPC);
    T_EQ(pgd_seq_grow(c, a, 33), PGD_ENOSPC);
    T_EQ(pgd_seq_write_slot(c, a, UINT64_MAX, &page, &slot), PGD_EINVAL);
    T_EQ(pgd_seq_commit(c, a, NULL, 0), 0);
    T_EQ(pgd_cache_hash_tokens(c, NULL, 0, NULL, 0, NULL, 0), 0);
    st2 = stats(c);
    T_ASSERT(memcmp(&st, &st2, sizeof st) == 0);
    T_EQ(pgd_seq_length(c, a), 0);
    T_EQ(pgd_seq_grow(c, a, 32), PGD_OK);
    T_EQ(pgd_seq_grow(c, a, SIZE_MAX), PGD_ENOSPC);
    T_EQ(pgd_seq_write_slot(c, a, 31, &page, &slot), PGD_OK);
    T_EQ(pgd_seq_write_slot(c, a, 32, &page, &slot), PGD_EINVAL);
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_seq_destroy(c, a);
    pgd_cache_destroy(c);
    return 0;
}

/* A length that overflows the page count must not be accepted (ENOSPC, nothing changed):
 * a sequence of length ~2^64 with no pages would index past its page table. */
static int test_grow_overflow(void)
{
    static const size_t n[] = {SIZE_MAX, SIZE_MAX - 1, SIZE_MAX - 2};
    for (int i = 0; i < 3; i++) {
        pgd_cache *c = make_cache(4, 8);
        pgd_seq *a;
        T_ASSERT(c);
        T_OK(pgd_seq_create(c, NULL, 0, &a));
        int rc = pgd_seq_grow(c, a, n[i]);
        uint64_t len = pgd_seq_length(c, a);
        pgd_seq_destroy(c, a);
        pgd_cache_destroy(c);
        if (rc != PGD_ENOSPC)
            T_FAIL("grow(SIZE_MAX - %d) on an empty sequence: %d, length %" PRIu64, i, rc, len);
    }
    return 0;
}

/* ---- max_seqs ---- */

static int test_max_seqs(void)
{
    pgd_cache_params p = params(4, 8);
    pgd_cache *c;
    pgd_seq *a, *b, *x = (pgd_seq *)(uintptr_t)1;
    p.max_seqs = 2;
    T_OK(pgd_cache_create(&p, &c));
    T_OK(pgd_seq_create(c, NULL, 0, &a));
    T_OK(pgd_seq_create(c, NULL, 0, &b));
    T_EQ(pgd_seq_create(c, NULL, 0, &x), PGD_EBUSY);
    T_ASSERT(x == NULL);
    x = (pgd_seq *)(uintptr_t)1;
    T_EQ(pgd_seq_fork(c, a, &x), PGD_EBUSY);
    T_ASSERT(x == NULL);
    T_EQ(stats(c).n_seqs, 2);
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_seq_destroy(c, b);
    T_OK(pgd_seq_fork(c, a, &b));
    T_EQ(stats(c).n_seqs, 2);
    pgd_seq_destroy(c, a);
    pgd_seq_destroy(c, b);
    T_EQ(stats(c).n_seqs, 0);
    pgd_cache_destroy(c); /* also with live sequences: */
    T_OK(pgd_cache_create(&p, &c));
    T_OK(pgd_seq_create(c, NULL, 0, &a));
    T_EQ(pgd_seq_grow(c, a, 9), PGD_OK);
    pgd_cache_destroy(c);
    return 0;
}

/* ---- grow, eviction ---- */

static int test_grow_enospc(void)
{
    pgd_cache *c = make_cache(4, 8);
    pgd_seq *a, *b;
    int32_t t[16];
    const uint32_t *ids;
    uint32_t before[8];
    T_ASSERT(c);
    toks_seq(t, 16, 5);
    T_OK(pgd_seq_create(c, NULL, 0, &a));
    T_EQ(feed(c, a, t, 16), 4);
    pgd_seq_destroy(c, a); /* 4 evictable, 4 free */
    T_OK(pgd_seq_create(c, NULL, 0, &b));
    T_EQ(pgd_seq_grow(c, b, 2), PGD_OK);
    T_EQ(pgd_seq_pages(c, b, &ids), 1);
    before[0] = ids[0];
    pgd_cache_stats st = stats(c);
    T_EQ(st.n_pages_free, 3);
    T_EQ(st.n_pages_evictable, 4);
    /* 2 + 31 tokens need 9 pages > 8: ENOSPC, nothing evicted */
    T_EQ(pgd_seq_grow(c, b, 31), PGD_ENOSPC);
    pgd_cache_stats st2 = stats(c);
    T_ASSERT(memcmp(&st, &st2, sizeof st) == 0);
    T_EQ(pgd_seq_length(c, b), 2);
    T_EQ(pgd_seq_pages(c, b, &ids), 1);
    T_EQ(ids[0], before[0]);
    T_EQ(pgd_cache_check(c), PGD_OK);
    T_EQ(probe(c, NULL, t, 16), 16);
    /* 2 + 30 tokens need 8 pages: evicts all 4 cached pages */
    T_EQ(pgd_seq_grow(c, b, 30), PGD_OK);
    st = stats(c);
    T_EQ(st.n_evictions, 4);
    T_EQ(st.n_pages_cached, 0);
    T_EQ(st.n_pages_free, 0);
    T_EQ(st.n_pages_used, 8);
    T_EQ(pgd_cache_check(c), PGD_OK);
    T_EQ(pgd_seq_grow(c, b, 0), PGD_OK);
    T_EQ(pgd_seq_grow(c, b, 1), PGD_ENOSPC);
    st2 = stats(c);
    T_ASSERT(memcmp(&st, &st2, sizeof st) == 0);
    T_EQ(pgd_seq_length(c, b), 32);
    T_EQ(probe(c, NULL, t, 16), 0);
    /* write_slot copy-on-write with a full pool: ENOSPC, nothing changed */
    pgd_seq *f;
    uint32_t page, slot;
    int32_t w[32];
    toks_seq(w, 32, 77);
    T_EQ(pgd_seq_commit(c, b, w, 29), 7); /* fork wants the uncommitted part in one page */
    T_OK(pgd_seq_fork(c, b, &f));
    st = stats(c);
    T_EQ(pgd_seq_pages(c, f, &ids), 8);
    memcpy(before, ids, sizeof before);
    T_EQ(pgd_seq_write_slot(c, f, 29, &page, &slot), PGD_ENOSPC);
    st2 = stats(c);
    T_ASSERT(memcmp(&st, &st2, sizeof st) == 0);
    T_EQ(pgd_seq_pages(c, f, &ids), 8);
    T_ASSERT(memcmp(before, ids, sizeof before) == 0);
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_seq_destroy(c, b);
    T_EQ(pgd_seq_write_slot(c, f, 5, &page, &slot), PGD_EINVAL); /* registered */
    T_EQ(pgd_seq_write_slot(c, f, 29, &page, &slot), PGD_OK);
    T_EQ(page, before[7]); /* private now */
    pgd_seq_destroy(c, f);
    st = stats(c);
    T_EQ(st.n_pages_cached, 7);
    T_EQ(st.n_pages_free, 1);
    T_EQ(pgd_cache_clear(c), 7);
    st = stats(c);
    T_EQ(st.n_pages_free, 8);
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_cache_destroy(c);
    return 0;
}

/* A 6-page chain is evicted from its end, one page at a time. */
static int test_eviction_leaves_first(void)
{
    pgd_cache *c = make_cache(4, 32);
    pgd_seq *a;
    int32_t x[24], y[24];
    T_ASSERT(c);
    toks_seq(x, 24, 1000);
    memcpy(y, x, sizeof y); /* y shares x's first 2 pages */
    for (int i = 8; i < 24; i++)
        y[i] = -i;
    T_OK(pgd_seq_create(c, NULL, 0, &a));
    T_EQ(feed(c, a, x, 24), 6);
    pgd_seq_destroy(c, a);
    T_OK(pgd_seq_create(c, NULL, 0, &a));
    T_EQ(pgd_seq_match(c, a, y, 24), 8);
    T_EQ(pgd_seq_grow(c, a, 16), PGD_OK);
    T_EQ(pgd_seq_commit(c, a, y + 8, 16), 4);
    pgd_seq_destroy(c, a);
    T_EQ(stats(c).n_pages_cached, 10);
    T_EQ(stats(c).n_pages_evictable, 10);
    /* whatever the order, the cached pages are always a prefix of each chain */
    for (int k = 9; k >= 0; k--) {
        T_EQ(pgd_cache_evict(c, 1), 1);
        T_EQ(pgd_cache_check(c), PGD_OK);
        pgd_cache_stats st = stats(c);
        T_EQ(st.n_pages_cached, (uint32_t)k);
        int64_t mx = probe(c, NULL, x, 24) / 4, my = probe(c, NULL, y, 24) / 4;
        int64_t shared = mx < 2 ? mx : 2;
        if (my < shared) shared = my;
        T_EQ(mx + my - shared, k); /* the matches account for every cached page */
        T_EQ(mx ? 1 : 0, my ? 1 : 0);
        if (mx > 2 || my > 2) T_ASSERT(mx >= 2 && my >= 2);
    }
    T_EQ(pgd_cache_evict(c, 1), 0);
    T_EQ(stats(c).n_evictions, 10);
    pgd_cache_destroy(c);
    return 0;
}

/* LRU: least recently released first; a released chain goes from its end. */
static int test_lru_order(void)
{
    pgd_cache *c = make_cache(4, 8);
    pgd_seq *s;
    int32_t x[8], y[8], z[8];
    T_ASSERT(c);
    toks_seq(x, 8, 100);
    toks_seq(y, 8, 200);
    toks_seq(z, 8, 300);
    T_OK(pgd_seq_create(c, NULL, 0, &s));
    T_EQ(feed(c, s, x, 8), 2);
    pgd_seq_destroy(c, s);
    T_OK(pgd_seq_create(c, NULL, 0, &s));
    T_EQ(feed(c, s, y, 8), 2);
    pgd_seq_destroy(c, s);
    T_OK(pgd_seq_create(c, NULL, 0, &s));
    T_EQ(feed(c, s, z, 8), 2);
    pgd_seq_destroy(c, s);
    T_EQ(probe(c, NULL, x, 8), 8); /* x is the most recent now */
    /* LRU order: y1 y0 z1 z0 x1 x0; 2 free, 3 needed: y1 goes */
    T_OK(pgd_seq_create(c, NULL, 0, &s));
    T_EQ(pgd_seq_grow(c, s, 12), PGD_OK);
    T_EQ(stats(c).n_evictions, 1);
    T_EQ(probe(c, NULL, y, 8), 4);
    /* LRU order: z1 z0 x1 x0 y0: z1 goes */
    T_EQ(pgd_seq_grow(c, s, 4), PGD_OK);
    T_EQ(probe(c, NULL, z, 8), 4);
    T_EQ(probe(c, NULL, x, 8), 8);
    T_EQ(probe(c, NULL, y, 8), 4);
    /* LRU order now: z0 x1 x0 y0; z0 is a leaf (z1 is gone) */
    T_EQ(pgd_seq_grow(c, s, 4), PGD_OK);
    T_EQ(probe(c, NULL, z, 8), 0);
    T_EQ(probe(c, NULL, x, 8), 8);
    T_EQ(probe(c, NULL, y, 8), 4);
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_seq_destroy(c, s);
    pgd_cache_destroy(c);
    return 0;
}

static int test_evict_clear_stats(void)
{
    pgd_cache *c = make_cache(4, 16);
    pgd_seq *a, *b;
    int32_t x[16];
    T_ASSERT(c);
    toks_seq(x, 16, 9);
    T_OK(pgd_seq_create(c, NULL, 0, &a));
    T_EQ(feed(c, a, x, 16), 4);
    T_EQ(pgd_cache_evict(c, 4), 0); /* all held */
    T_EQ(pgd_cache_clear(c), 0);
    T_OK(pgd_seq_create(c, NULL, 0, &b));
    T_EQ(pgd_seq_match(c, b, x, 9), 8); /* b holds 2 pages */
    pgd_seq_destroy(c, a);
    pgd_cache_stats st = stats(c);
    T_EQ(st.n_pages_cached, 4);
    T_EQ(st.n_pages_evictable, 2);
    T_EQ(st.n_pages_used, 2);
    T_EQ(st.n_query_tokens, 9);
    T_EQ(st.n_hit_tokens, 8);
    T_EQ(st.n_hit_pages, 2);
    T_ASSERT(st.n_query_pages == 2 || st.n_query_pages == 3);
    T_EQ(pgd_cache_evict(c, 0), 0);
    T_EQ(pgd_cache_evict(c, 100), 2);
    T_EQ(pgd_cache_check(c), PGD_OK);
    st = stats(c);
    T_EQ(st.n_evictions, 2);
    T_EQ(st.n_pages_cached, 2);
    T_EQ(st.n_pages_free, 14);
    pgd_seq_destroy(c, b);
    T_EQ(pgd_cache_clear(c), 2);
    st = stats(c);
    T_EQ(st.n_pages_free, 16);
    T_EQ(st.n_pages_cached, 0);
    T_EQ(pgd_cache_check(c), PGD_OK);
    /* pool stats agree */
    pgd_pool_stats ps;
    pgd_pool_get_stats(pgd_cache_pool(c), &ps);
    T_EQ(ps.n_pages_free, 16);
    pgd_cache_destroy(c);
    return 0;
}

/* ================= randomized model-based test ================= */

enum { MAXLIVE = 6, MAXPAGES_SEQ = 10, NSTREAM = 4, NSALT = 3, MAXT = 8 };
enum { MAXLEN = MAXPAGES_SEQ * MAXT };

static const char *const salts[NSALT] = {NULL, "alpha", "beta"};

typedef struct {
    pgd_seq *s;
    int salt;
    uint32_t len, nc, nw; /* length, committed, written */
    int matched;          /* match was called (the sequence has a mode now) */
    int32_t plan[MAXLEN];
} mseq;

typedef struct {
    int salt;
    uint32_t n; /* committed tokens (full pages only) */
    int32_t t[MAXLEN];
} chain_rec;

typedef struct {
    uint64_t *v;
    size_t cap, n;
} u64set;

typedef struct {
    /* config */
    uint32_t T, n_pages, maxlen;
    int payload, policy;
    /* state */
    pgd_cache *c;
    pgd_pool *pool;
    uint64_t rng;
    int32_t stream[NSTREAM][MAXLEN];
    mseq seq[MAXLIVE];
    int n_live;
    u64set ever;                /* (salt, prefix) keys ever registered */
    unsigned char *held_cached; /* [n_pages] page known registered while held */
    uint32_t *occ;              /* [n_pages] occurrences in live tables */
    int *owner;                 /* [n_pages] salt of the tables holding it, -1 */
    chain_rec chains[64];
    int n_chains;
    int step;
    char last_op[160];
} model;

static int set_has(const u64set *s, uint64_t k)
{
    if (!s->cap) return 0;
    for (size_t i = k & (s->cap - 1);; i = (i + 1) & (s->cap - 1)) {
        if (s->v[i] == k) return 1;
        if (s->v[i] == 0) return 0;
    }
}

static void set_add(u64set *s, uint64_t k)
{
    if (set_has(s, k)) return;
    if (2 * (s->n + 1) > s->cap) {
        u64set t = {calloc(s->cap ? s->cap * 2 : 1024, sizeof(uint64_t)),
                    s->cap ? s->cap * 2 : 1024, 0};
        if (!t.v) abort();
        for (size_t i = 0; i < s->cap; i++)
            if (s->v[i]) set_add(&t, s->v[i]);
        free(s->v);
        *s = t;
    }
    size_t i = k & (s->cap - 1);
    while (s->v[i])
        i = (i + 1) & (s->cap - 1);
    s->v[i] = k;
    s->n++;
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ull;
    x ^= x >> 27;
    x *= 0x81dadef4bc2dd44dull;
    x ^= x >> 33;
    return x;
}

/* Content tag of (salt, tokens[0..p]): what position p holds in any page. Never 0. */
static uint64_t prefix_key(int salt, const int32_t *t, uint32_t p)
{
    uint64_t h = mix(0x1234 + (uint64_t)salt);
    for (uint32_t i = 0; i <= p; i++)
        h = mix(h ^ (uint32_t)t[i]);
    return h | 1;
}

static float tag_val(uint64_t key, uint32_t j)
{
    return (float)((mix(key + j) >> 40) & 0xFFFFFF);
}

static void write_tag(model *m, uint32_t page, uint32_t slot, uint64_t key)
{
    for (uint32_t l = 0; l < NL; l++) {
        float *k = (float *)pgd_pool_k(m->pool, page, l, 0) + (size_t)slot * HD;
        float *v = (float *)pgd_pool_v(m->pool, page, l, 0) + (size_t)slot * HD;
        for (uint32_t d = 0; d < HD; d++) {
            k[d] = tag_val(key, l * 4 + d);
            v[d] = tag_val(key, l * 4 + 2 + d);
        }
    }
}

static int tag_ok(model *m, uint32_t page, uint32_t slot, uint64_t key)
{
    if (!m->payload) return 1;
    for (uint32_t l = 0; l < NL; l++) {
        float *k = (float *)pgd_pool_k(m->pool, page, l, 0) + (size_t)slot * HD;
        float *v = (float *)pgd_pool_v(m->pool, page, l, 0) + (size_t)slot * HD;
        for (uint32_t d = 0; d < HD; d++)
            if (k[d] != tag_val(key, l * 4 + d) || v[d] != tag_val(key, l * 4 + 2 + d)) return 0;
    }
    return 1;
}

static uint32_t rnd(model *m, uint32_t n)
{
    return n ? (uint32_t)(t_rand(&m->rng) % n) : 0;
}

static uint32_t pages_of(model *m, uint32_t len)
{
    return (len + m->T - 1) / m->T;
}

/* Tokens: a stream with a divergence point, then random tokens from a 3-letter alphabet. */
static void make_plan(model *m, int32_t *plan, uint32_t from)
{
    uint32_t k = rnd(m, NSTREAM), div = from + rnd(m, m->maxlen);
    for (uint32_t p = from; p < MAXLEN; p++)
        plan[p] = p < div ? m->stream[k][p] : (int32_t)(1 + rnd(m, 3));
}

static int check_all(model *m)
{
    pgd_cache_stats st = stats(m->c);
    T_EQ(pgd_cache_check(m->c), PGD_OK);
    T_EQ(st.n_pages_total, m->n_pages);
    T_EQ(st.n_seqs, (uint32_t)m->n_live);
    T_EQ(st.n_pages_free + st.n_pages_used + st.n_pages_evictable, m->n_pages);
    memset(m->occ, 0, m->n_pages * sizeof *m->occ);
    for (uint32_t p = 0; p < m->n_pages; p++)
        m->owner[p] = -1;
    for (int i = 0; i < m->n_live; i++) {
        mseq *q = &m->seq[i];
        const uint32_t *ids;
        T_EQ(pgd_seq_length(m->c, q->s), q->len);
        T_EQ(pgd_seq_n_committed(m->c, q->s), q->nc);
        T_EQ(pgd_seq_pages(m->c, q->s, &ids), pages_of(m, q->len));
        for (uint32_t j = 0; j < pages_of(m, q->len); j++) {
            T_ASSERT(ids[j] < m->n_pages);
            m->occ[ids[j]]++;
            /* salted sequences never share a page */
            if (m->owner[ids[j]] >= 0 && m->owner[ids[j]] != q->salt)
                T_FAIL("page %u shared by salts %d and %d", ids[j], m->owner[ids[j]], q->salt);
            m->owner[ids[j]] = q->salt;
            if (j < q->nc / m->T && !m->held_cached[ids[j]])
                T_FAIL("seq %d page %u: committed full page not known cached", i, j);
        }
        for (uint32_t p = 0; p < q->nw; p++)
            if (!tag_ok(m, ids[p / m->T], p % m->T, prefix_key(q->salt, q->plan, p)))
                T_FAIL("seq %d position %u: wrong K/V content (page %u)", i, p, ids[p / m->T]);
    }
    uint32_t n_used = 0, n_cached_held = 0, n_unheld1 = 0, n_free = 0;
    for (uint32_t p = 0; p < m->n_pages; p++) {
        uint32_t rc = pgd_pool_refcount(m->pool, p);
        if (m->occ[p]) {
            n_used++;
            n_cached_held += m->held_cached[p];
            if (rc != m->occ[p] + m->held_cached[p])
                T_FAIL("page %u: refcount %u, tables %u, cached %d", p, rc, m->occ[p],
                       m->held_cached[p]);
        } else {
            m->held_cached[p] = 0; /* no longer held: evictable or gone */
            if (rc > 1) T_FAIL("page %u: refcount %u but held by no sequence", p, rc);
            n_unheld1 += rc == 1;
            n_free += rc == 0;
        }
    }
    T_EQ(st.n_pages_used, n_used);
    T_EQ(st.n_pages_evictable, n_unheld1);
    T_EQ(st.n_pages_free, n_free);
    T_EQ(st.n_pages_cached, n_cached_held + n_unheld1);
    return 0;
}

/* Records a chain that was committed (for later probes). */
static void remember_chain(model *m, const mseq *q)
{
    uint32_t n = q->nc / m->T * m->T;
    if (n == 0) return;
    chain_rec *r = &m->chains[m->n_chains < 64 ? m->n_chains++ : (int)rnd(m, 64)];
    r->salt = q->salt;
    r->n = n;
    memcpy(r->t, q->plan, n * sizeof(int32_t));
}

/* Upper and lower bounds on a match of t[0..n) for a salt. */
static void match_bounds(model *m, int salt, const int32_t *t, uint32_t n, uint32_t *lo,
                         uint32_t *hi)
{
    uint32_t full = n / m->T;
    *hi = 0;
    while (*hi < full && set_has(&m->ever, prefix_key(salt, t, (*hi + 1) * m->T - 1)))
        (*hi)++;
    *lo = 0;
    for (int i = 0; i < m->n_live; i++) {
        const mseq *q = &m->seq[i];
        if (q->salt != salt) continue;
        uint32_t k = 0, lim = q->nc / m->T;
        if (lim > full) lim = full;
        while (k < lim && !memcmp(q->plan + k * m->T, t + k * m->T, m->T * sizeof(int32_t)))
            k++;
        if (k > *lo) *lo = k;
    }
}

/* Runs of the model with a RAM tier below the pool (test_model_tiers): a match may also
 * promote pages (and evict for them), so it waits, and counts the pool's part as hit. */
static pgd_tier *model_tier;

/* Matches t[0..n) into the empty sequence q (tokens or hashes) and checks the result. */
static int do_match(model *m, mseq *q, const int32_t *t, uint32_t n, int by_hash,
                    int64_t *pages_out)
{
    uint32_t lo, hi;
    pgd_cache_stats a = stats(m->c), b;
    pgd_cache_tier_stats ta;
    memset(&ta, 0, sizeof ta);
    if (model_tier) pgd_cache_get_tier_stats(m->c, 0, &ta);
    int64_t r;
    match_bounds(m, q->salt, t, n, &lo, &hi);
    if (by_hash) {
        pgd_hash h[MAXPAGES_SEQ];
        const char *salt = salts[q->salt];
        size_t nh =
            pgd_cache_hash_tokens(m->c, salt, salt ? strlen(salt) : 0, t, n, h, MAXPAGES_SEQ);
        T_EQ(nh, n / m->T);
        r = pgd_seq_match_hashes(m->c, q->s, h, nh);
        T_ASSERT(r >= 0 && r <= (int64_t)nh);
        b = stats(m->c);
        T_EQ(b.n_query_tokens - a.n_query_tokens, nh * m->T);
        r *= m->T;
    } else {
        r = pgd_seq_match(m->c, q->s, t, n);
        b = stats(m->c);
        T_ASSERT(r >= 0 && r <= (int64_t)n && r % m->T == 0);
        T_EQ(b.n_query_tokens - a.n_query_tokens, n);
    }
    uint64_t pool_hit = (uint64_t)r;
    if (model_tier) {
        pgd_match_info mi;
        pgd_seq_match_info(m->c, q->s, &mi);
        T_EQ(mi.pool_tokens + mi.tier_tokens[0], (uint64_t)r);
        pool_hit = mi.pool_tokens;
        pgd_cache_tier_stats tb;
        T_OK(pgd_seq_wait(m->c, q->s));
        T_OK(pgd_cache_get_tier_stats(m->c, 0, &tb));
        /* A fill fails only when the tier dropped the record since the match (it made
         * room for a page this match evicted): the sequence is cut back there. */
        uint64_t len = pgd_seq_length(m->c, q->s);
        if (len != (uint64_t)r) {
            T_ASSERT(len < (uint64_t)r && len >= pool_hit);
            T_EQ(tb.promote_failed, ta.promote_failed + 1);
            r = (int64_t)len;
        }
    } else {
        T_EQ(b.n_evictions, a.n_evictions);
    }
    T_EQ(b.n_hit_tokens - a.n_hit_tokens, pool_hit);
    T_EQ(b.n_hit_pages - a.n_hit_pages, pool_hit / m->T);
    uint64_t pages = (uint64_t)r / m->T;
    if (pages > hi) T_FAIL("matched %" PRIu64 " pages, at most %u were ever committed", pages, hi);
    if (pages < lo) T_FAIL("matched %" PRIu64 " pages, %u are held by live seqs", pages, lo);
    /* matched pages hold exactly the K/V of those tokens */
    const uint32_t *ids;
    T_EQ(pgd_seq_pages(m->c, q->s, &ids), pages);
    for (uint32_t p = 0; p < (uint32_t)r; p++)
        if (!tag_ok(m, ids[p / m->T], p % m->T, prefix_key(q->salt, t, p)))
            T_FAIL("matched page %u (id %u) slot %u: wrong content", p / m->T, ids[p / m->T],
                   p % m->T);
    for (uint32_t j = 0; j < pages; j++)
        m->held_cached[ids[j]] = 1;
    q->len = q->nc = q->nw = (uint32_t)r;
    q->matched = 1;
    *pages_out = (int64_t)pages;
    return 0;
}

static int op_create(model *m)
{
    if (m->n_live == MAXLIVE) return 0;
    mseq *q = &m->seq[m->n_live];
    q->salt = (int)rnd(m, NSALT);
    const char *salt = salts[q->salt];
    snprintf(m->last_op, sizeof m->last_op, "create salt %d", q->salt);
    T_EQ(pgd_seq_create(m->c, salt, salt ? strlen(salt) : 0, &q->s), PGD_OK);
    q->len = q->nc = q->nw = 0;
    q->matched = 0;
    make_plan(m, q->plan, 0);
    m->n_live++;
    if (rnd(m, 4)) {
        int64_t pages;
        uint32_t n = rnd(m, m->maxlen / 2 + 1);
        snprintf(m->last_op, sizeof m->last_op, "create salt %d + match %u", q->salt, n);
        if (check_all(m)) return 1;
        return do_match(m, q, q->plan, n, 0, &pages);
    }
    return 0;
}

static int op_match_nonempty(model *m, mseq *q)
{
    snprintf(m->last_op, sizeof m->last_op, "match on non-empty seq");
    if (q->len == 0) return 0; /* matched already (0 pages): the contract is unclear */
    pgd_cache_stats a = stats(m->c), b;
    T_EQ(pgd_seq_match(m->c, q->s, q->plan, q->len), PGD_ESTATE);
    b = stats(m->c);
    T_ASSERT(memcmp(&a, &b, sizeof a) == 0);
    return 0;
}

static int op_grow(model *m, mseq *q)
{
    if (q->len >= m->maxlen) return 0;
    uint32_t k = 1 + rnd(m, m->maxlen - q->len < 9 ? m->maxlen - q->len : 9);
    uint32_t need = pages_of(m, q->len + k) - pages_of(m, q->len);
    pgd_cache_stats a = stats(m->c), b;
    snprintf(m->last_op, sizeof m->last_op, "grow len %u by %u (need %u, free %u, evictable %u)",
             q->len, k, need, a.n_pages_free, a.n_pages_evictable);
    int rc = pgd_seq_grow(m->c, q->s, k);
    b = stats(m->c);
    if (need > a.n_pages_free + a.n_pages_evictable) {
        T_EQ(rc, PGD_ENOSPC);
        T_ASSERT(memcmp(&a, &b, sizeof a) == 0);
        return 0;
    }
    T_EQ(rc, PGD_OK);
    T_EQ(b.n_evictions - a.n_evictions, need > a.n_pages_free ? need - a.n_pages_free : 0);
    q->len += k;
    return 0;
}

/* Writes position p of q; *stopped is set when the write could not happen (ENOSPC, or a
 * page that another sequence registered, which the contract allows to refuse). */
static int write_one(model *m, mseq *q, uint32_t p, int *stopped)
{
    const uint32_t *ids;
    pgd_seq_pages(m->c, q->s, &ids);
    uint32_t old = ids[p / m->T], page = 0, slot = 0;
    uint32_t rc0 = pgd_pool_refcount(m->pool, old);
    int reg_other = m->held_cached[old];
    pgd_cache_stats a = stats(m->c), b;
    int rc = pgd_seq_write_slot(m->c, q->s, p, &page, &slot);
    b = stats(m->c);
    *stopped = 0;
    if (reg_other && rc == PGD_EINVAL) { /* registered by another sequence: immutable */
        T_ASSERT(memcmp(&a, &b, sizeof a) == 0);
        *stopped = 1;
        return 0;
    }
    if (rc0 > 1 && a.n_pages_free + a.n_pages_evictable == 0) {
        T_EQ(rc, PGD_ENOSPC);
        T_ASSERT(memcmp(&a, &b, sizeof a) == 0);
        *stopped = 1;
        return 0;
    }
    T_EQ(rc, PGD_OK);
    T_EQ(slot, p % m->T);
    pgd_seq_pages(m->c, q->s, &ids);
    T_EQ(ids[p / m->T], page);
    if (rc0 > 1) {
        T_ASSERT(page != old);
        T_EQ(b.n_cow_copies - a.n_cow_copies, 1);
        T_EQ(b.n_evictions - a.n_evictions, a.n_pages_free ? 0 : 1);
        T_EQ(pgd_pool_refcount(m->pool, page), 1);
        T_EQ(pgd_pool_refcount(m->pool, old), rc0 - 1);
    } else {
        T_EQ(page, old);
        T_ASSERT(memcmp(&a, &b, sizeof a) == 0);
    }
    if (m->payload) write_tag(m, page, slot, prefix_key(q->salt, q->plan, p));
    return 0;
}

static int op_write(model *m, mseq *q)
{
    uint32_t first = q->nc / m->T * m->T; /* first position outside registered pages */
    uint32_t r = rnd(m, 10);
    int stopped = 0;
    if (r == 0) { /* invalid positions */
        uint32_t page, slot;
        pgd_cache_stats a = stats(m->c), b;
        snprintf(m->last_op, sizeof m->last_op, "write_slot invalid (len %u nc %u)", q->len, q->nc);
        T_EQ(pgd_seq_write_slot(m->c, q->s, q->len + rnd(m, 3), &page, &slot), PGD_EINVAL);
        if (first) T_EQ(pgd_seq_write_slot(m->c, q->s, rnd(m, first), &page, &slot), PGD_EINVAL);
        b = stats(m->c);
        T_ASSERT(memcmp(&a, &b, sizeof a) == 0);
        return 0;
    }
    if (r == 1 && q->nw > first) { /* rewrite a written position (same content) */
        uint32_t p = first + rnd(m, q->nw - first);
        snprintf(m->last_op, sizeof m->last_op, "rewrite pos %u (nc %u nw %u)", p, q->nc, q->nw);
        return write_one(m, q, p, &stopped);
    }
    if (q->nw >= q->len) return 0;
    uint32_t k = 1 + rnd(m, q->len - q->nw);
    snprintf(m->last_op, sizeof m->last_op, "write %u..%u (nc %u)", q->nw, q->nw + k - 1, q->nc);
    for (uint32_t i = 0; i < k && !stopped; i++) {
        if (write_one(m, q, q->nw, &stopped)) return 1;
        if (!stopped) q->nw++;
    }
    return 0;
}

static int op_commit(model *m, mseq *q)
{
    if (rnd(m, 8) == 0) { /* past the length */
        pgd_cache_stats a = stats(m->c), b;
        snprintf(m->last_op, sizeof m->last_op, "commit past length (len %u nc %u)", q->len, q->nc);
        int32_t junk[MAXLEN + 4] = {0};
        T_EQ(pgd_seq_commit(m->c, q->s, junk, q->len - q->nc + 1), PGD_EINVAL);
        b = stats(m->c);
        T_ASSERT(memcmp(&a, &b, sizeof a) == 0);
        return 0;
    }
    if (q->nw <= q->nc) return 0;
    uint32_t k = 1 + rnd(m, q->nw - q->nc);
    uint32_t full0 = q->nc / m->T, full1 = (q->nc + k) / m->T;
    pgd_cache_stats a = stats(m->c), b;
    /* A page that becomes full here is registered, or found cached under another page
     * (dedup), or was registered already by a fork sharing it (neither). */
    const uint32_t *ids0;
    uint32_t n_pre = 0;
    pgd_seq_pages(m->c, q->s, &ids0);
    for (uint32_t j = full0; j < full1; j++)
        n_pre += m->held_cached[ids0[j]];
    snprintf(m->last_op, sizeof m->last_op, "commit %u..%u (new full pages %u, %u registered)",
             q->nc, q->nc + k - 1, full1 - full0, n_pre);
    int rc = pgd_seq_commit(m->c, q->s, q->plan + q->nc, k);
    b = stats(m->c);
    T_ASSERT(rc >= 0);
    T_EQ(b.n_registered - a.n_registered, rc);
    T_EQ((b.n_registered - a.n_registered) + (b.n_dedup - a.n_dedup), full1 - full0 - n_pre);
    T_EQ(b.n_evictions, a.n_evictions);
    q->nc += k;
    const uint32_t *ids;
    pgd_seq_pages(m->c, q->s, &ids);
    for (uint32_t j = full0; j < full1; j++) {
        m->held_cached[ids[j]] = 1;
        set_add(&m->ever, prefix_key(q->salt, q->plan, (j + 1) * m->T - 1));
    }
    if (full1 > full0) remember_chain(m, q);
    return 0;
}

static int op_fork(model *m, mseq *q)
{
    if (m->n_live == MAXLIVE) return 0;
    mseq *d = &m->seq[m->n_live];
    snprintf(m->last_op, sizeof m->last_op, "fork (len %u nc %u nw %u)", q->len, q->nc, q->nw);
    const uint32_t *ids;
    uint32_t n = pgd_seq_pages(m->c, q->s, &ids), before[MAXPAGES_SEQ];
    for (uint32_t j = 0; j < n; j++)
        before[j] = pgd_pool_refcount(m->pool, ids[j]);
    pgd_cache_stats a = stats(m->c), b;
    int rc = pgd_seq_fork(m->c, q->s, &d->s);
    if (rc == PGD_ESTATE && pages_of(m, q->len) > q->nc / m->T + 1) {
        /* not in cache.h (reported): fork refuses two or more uncommitted pages */
        b = stats(m->c);
        T_ASSERT(memcmp(&a, &b, sizeof a) == 0);
        T_ASSERT(d->s == NULL);
        return 0;
    }
    T_EQ(rc, PGD_OK);
    d->salt = q->salt;
    d->matched = q->matched;
    d->len = q->len;
    d->nc = q->nc;
    d->nw = q->nw;
    memcpy(d->plan, q->plan, sizeof d->plan);
    make_plan(m, d->plan, q->nw); /* the branch diverges after what was written */
    m->n_live++;
    const uint32_t *dids;
    T_EQ(pgd_seq_pages(m->c, d->s, &dids), n);
    pgd_seq_pages(m->c, q->s, &ids);
    for (uint32_t j = 0; j < n; j++) {
        T_EQ(dids[j], ids[j]);
        uint32_t seen = 0; /* a page listed twice in one table is not possible */
        for (uint32_t i = 0; i < j; i++)
            seen += ids[i] == ids[j];
        T_EQ(seen, 0);
        T_EQ(pgd_pool_refcount(m->pool, ids[j]), before[j] + 1);
    }
    return 0;
}

static int op_destroy(model *m, int i)
{
    snprintf(m->last_op, sizeof m->last_op, "destroy seq %d", i);
    remember_chain(m, &m->seq[i]);
    pgd_cache_stats a = stats(m->c), b;
    pgd_seq_destroy(m->c, m->seq[i].s);
    b = stats(m->c);
    T_EQ(b.n_evictions, a.n_evictions);
    m->seq[i] = m->seq[--m->n_live];
    return 0;
}

static int op_evict(model *m)
{
    uint32_t n = rnd(m, 5);
    pgd_cache_stats a = stats(m->c), b;
    snprintf(m->last_op, sizeof m->last_op, "evict %u (evictable %u)", n, a.n_pages_evictable);
    int r = pgd_cache_evict(m->c, n);
    b = stats(m->c);
    T_EQ(r, n < a.n_pages_evictable ? n : a.n_pages_evictable);
    T_EQ(b.n_evictions - a.n_evictions, r);
    T_EQ(b.n_pages_free - a.n_pages_free, r);
    return 0;
}

static int op_clear(model *m)
{
    pgd_cache_stats a = stats(m->c), b;
    snprintf(m->last_op, sizeof m->last_op, "clear (evictable %u)", a.n_pages_evictable);
    T_EQ(pgd_cache_clear(m->c), a.n_pages_evictable);
    b = stats(m->c);
    T_EQ(b.n_pages_evictable, 0);
    T_EQ(b.n_pages_free, a.n_pages_free + a.n_pages_evictable);
    return 0;
}

/* Probes a committed chain: a match with a fresh sequence, then a shorter one; the
 * second must be min(its length, the first), i.e. cached pages form a prefix. */
static int op_probe(model *m)
{
    if (m->n_chains == 0) return 0;
    chain_rec *r = &m->chains[rnd(m, (uint32_t)m->n_chains)];
    const char *salt = salts[r->salt];
    mseq q;
    int64_t p1, p2;
    uint32_t n2 = rnd(m, r->n + 1);
    int by_hash = (int)rnd(m, 2);
    snprintf(m->last_op, sizeof m->last_op, "probe salt %d n %u then %u (%s)", r->salt, r->n, n2,
             by_hash ? "hashes" : "tokens");
    q.salt = r->salt;
    T_EQ(pgd_seq_create(m->c, salt, salt ? strlen(salt) : 0, &q.s), PGD_OK);
    int rc = do_match(m, &q, r->t, r->n, by_hash, &p1);
    pgd_seq_destroy(m->c, q.s);
    if (rc) return rc;
    T_EQ(pgd_seq_create(m->c, salt, salt ? strlen(salt) : 0, &q.s), PGD_OK);
    rc = do_match(m, &q, r->t, n2, !by_hash, &p2);
    pgd_seq_destroy(m->c, q.s);
    if (rc) return rc;
    if (model_tier) /* the pool may have room for more of the run now */
        T_ASSERT(p2 >= ((int64_t)(n2 / m->T) < p1 ? (int64_t)(n2 / m->T) : p1));
    else
        T_EQ(p2, (int64_t)(n2 / m->T) < p1 ? (int64_t)(n2 / m->T) : p1);
    return 0;
}

/* One random operation: r in [0, 100) picks it, i is a live sequence or -1. */
static int model_step(model *m, uint32_t r, int i)
{
    mseq *q = i >= 0 ? &m->seq[i] : NULL;
    if (r < 10 || !q) return op_create(m);
    if (r < 13 && (q->len || q->matched)) return op_match_nonempty(m, q);
    if (r < 13) {
        int64_t pages;
        uint32_t n = rnd(m, m->maxlen + 1);
        snprintf(m->last_op, sizeof m->last_op, "match %u", n);
        return do_match(m, q, q->plan, n, 0, &pages);
    }
    if (r < 33) return op_grow(m, q);
    if (r < 55) return op_write(m, q);
    if (r < 75) return op_commit(m, q);
    if (r < 80) return op_fork(m, q);
    if (r < 89) return op_destroy(m, i);
    if (r < 92) return op_evict(m);
    if (r < 93) return op_clear(m);
    return op_probe(m);
}

static uint64_t belady_oracle(void *ud, pgd_hash h)
{
    (void)ud;
    return h.lo % 7 == 0 ? UINT64_MAX : h.hi % 1000; /* arbitrary but fixed */
}

static pgd_cache_stats model_total; /* summed over runs, to show what was exercised */

/* The copy hook of the caller-owned arena variant: counts and copies (host memory). */
typedef struct copy_count {
    uint64_t n_calls;
    uint64_t page_bytes;
} copy_count;

static int counting_copy(void *ud, void *dst, const void *src, uint64_t n_bytes)
{
    copy_count *cc = ud;
    if (n_bytes != cc->page_bytes) return PGD_EINVAL;
    cc->n_calls++;
    memcpy(dst, src, n_bytes);
    return PGD_OK;
}

/* One run of the model. With arena, the pool uses a caller-owned malloc'ed arena and a
 * counting copy hook, and the run checks that every copy-on-write went through the hook.
 * *end (may be NULL) gets the cache's stats before teardown. */
static int model_run_ex(uint32_t T, uint32_t n_pages, int payload, int policy, uint64_t seed,
                        int steps, int verbose, int arena, pgd_cache_stats *end)
{
    model m;
    copy_count cc = {0, 0};
    void *mem = NULL;
    memset(&m, 0, sizeof m);
    m.T = T;
    m.maxlen = MAXPAGES_SEQ * T;
    m.n_pages = n_pages;
    m.payload = payload;
    m.policy = policy;
    m.rng = seed * 0x9E3779B97F4A7C15ull + 1;
    pgd_cache_params p = params(T, n_pages);
    p.pool.metadata_only = !payload;
    p.policy = (pgd_policy_kind)policy;
    p.next_use = belady_oracle;
    pgd_tier_use use = {model_tier, 0, 0};
    if (model_tier) {
        p.tiers = &use;
        p.n_tiers = 1;
    }
    if (arena) {
        cc.page_bytes = 2ull * NL * NH * ((T * HD * sizeof(float) + 15) / 16 * 16);
        mem = aligned_alloc(64, (size_t)(cc.page_bytes * n_pages));
        T_ASSERT(mem);
        p.pool.arena = mem;
        p.pool.arena_bytes = cc.page_bytes * n_pages;
        p.pool.capacity_pages = 0; /* from the arena */
        p.pool.copy_page = counting_copy;
        p.pool.copy_ud = &cc;
    }
    T_EQ(pgd_cache_create(&p, &m.c), PGD_OK);
    T_EQ(pgd_pool_n_pages(pgd_cache_pool(m.c)), n_pages);
    if (arena) T_ASSERT(pgd_pool_page_data(pgd_cache_pool(m.c), 0) == mem);
    m.pool = pgd_cache_pool(m.c);
    m.held_cached = calloc(n_pages, 1);
    m.occ = calloc(n_pages, sizeof *m.occ);
    m.owner = calloc(n_pages, sizeof *m.owner);
    T_ASSERT(m.held_cached && m.occ && m.owner);
    for (int k = 0; k < NSTREAM; k++)
        for (int i = 0; i < MAXLEN; i++)
            m.stream[k][i] = (int32_t)(1 + rnd(&m, 3));
    int fail = 0;
    for (m.step = 0; m.step < steps && !fail; m.step++) {
        uint32_t r = rnd(&m, 100);
        int i = m.n_live ? (int)rnd(&m, (uint32_t)m.n_live) : -1;
        m.last_op[0] = 0;
        fail = model_step(&m, r, i);
        if (!fail) {
            fail = check_all(&m);
        }
        if (verbose) printf("  step %d: %s\n", m.step, m.last_op);
    }
    if (fail) {
        fprintf(stderr,
                "model: T %u pages %u payload %d policy %d seed %" PRIu64
                " failed at step %d after op: %s\n",
                T, n_pages, payload, policy, seed, m.step - 1, m.last_op);
    } else {
        pgd_cache_stats st = stats(m.c);
        if (end) *end = st;
        if (arena && cc.n_calls != st.n_cow_copies) {
            fprintf(stderr, "model: %" PRIu64 " copy hook calls for %" PRIu64 " copies\n",
                    cc.n_calls, st.n_cow_copies);
            fail = 1;
        }
        model_total.n_hit_pages += st.n_hit_pages;
        model_total.n_query_pages += st.n_query_pages;
        model_total.n_evictions += st.n_evictions;
        model_total.n_registered += st.n_registered;
        model_total.n_dedup += st.n_dedup;
        model_total.n_cow_copies += st.n_cow_copies;
        while (m.n_live && !fail)
            fail = op_destroy(&m, m.n_live - 1) || check_all(&m);
        if (!fail) {
            st = stats(m.c);
            T_EQ(pgd_cache_clear(m.c), st.n_pages_evictable);
            st = stats(m.c);
            T_EQ(st.n_pages_free, n_pages); /* nothing leaked */
            T_EQ(st.n_pages_cached, 0);
            T_EQ(st.n_pages_used, 0);
            T_EQ(pgd_cache_check(m.c), PGD_OK);
        }
    }
    pgd_cache_destroy(m.c);
    free(m.held_cached);
    free(m.occ);
    free(m.owner);
    free(m.ever.v);
    free(mem);
    return fail;
}

static int model_run(uint32_t T, uint32_t n_pages, int payload, int policy, uint64_t seed,
                     int steps, int verbose)
{
    return model_run_ex(T, n_pages, payload, policy, seed, steps, verbose, 0, NULL);
}

/* truncate undoes a grow: pages past the new end go back, committed tokens stay. */
static int test_truncate(void)
{
    pgd_cache *c = make_cache(4, 16);
    pgd_seq *s;
    pgd_cache_stats st;
    static const int32_t t[6] = {1, 2, 3, 4, 5, 6};
    T_ASSERT(c);
    T_OK(pgd_seq_create(c, NULL, 0, &s));
    T_EQ(pgd_seq_grow(c, s, 6), PGD_OK);
    T_EQ(pgd_seq_commit(c, s, t, 5), 1);
    T_EQ(pgd_seq_grow(c, s, 11), PGD_OK); /* 17 positions: 5 pages */
    pgd_cache_get_stats(c, &st);
    T_EQ(st.n_pages_free, 11);
    T_EQ(pgd_seq_truncate(c, s, 4), PGD_ESTATE); /* below the committed 5 */
    T_EQ(pgd_seq_truncate(c, s, 18), PGD_ESTATE);
    T_EQ(pgd_seq_truncate(c, s, 6), PGD_OK);
    T_EQ(pgd_seq_length(c, s), 6);
    pgd_cache_get_stats(c, &st);
    T_EQ(st.n_pages_free, 14);
    T_EQ(pgd_cache_check(c), PGD_OK);
    T_EQ(pgd_seq_truncate(c, s, 5), PGD_OK);
    T_EQ(pgd_seq_grow(c, s, 3), PGD_OK);
    T_EQ(pgd_seq_commit(c, s, t + 5, 1), 0);
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_seq_destroy(c, s);
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_cache_destroy(c);
    return 0;
}

/* A copy hook that fails: copy-on-write through the cache returns its status, and the
 * sequences and the index stay as they were (the shared page is still shared). */
static int failing_copy(void *ud, void *dst, const void *src, uint64_t n_bytes)
{
    (void)dst, (void)src, (void)n_bytes;
    ++*(int *)ud;
    return PGD_EIO;
}

static int test_copy_hook_failure(void)
{
    pgd_cache_params p = params(4, 8);
    pgd_cache_stats cs;
    memset(&cs, 0, sizeof cs);
    pgd_cache *c = NULL;
    T_OK(pgd_cache_create(&p, &c));
    uint64_t page_bytes = pgd_pool_page_bytes(pgd_cache_pool(c));
    pgd_cache_destroy(c);
    void *mem = aligned_alloc(64, page_bytes * 8);
    T_ASSERT(mem);
    int n_fail = 0;
    p.pool.arena = mem;
    p.pool.arena_bytes = page_bytes * 8;
    p.pool.copy_page = failing_copy;
    p.pool.copy_ud = &n_fail;
    T_OK(pgd_cache_create(&p, &c));
    pgd_seq *a, *b;
    int32_t t[6];
    uint32_t page, slot;
    toks_seq(t, 6, 10);
    T_OK(pgd_seq_create(c, "s", 1, &a));
    T_EQ(feed(c, a, t, 6), 1);
    T_OK(pgd_seq_fork(c, a, &b)); /* b shares a's partial second page */
    T_EQ(pgd_seq_write_slot(c, b, 5, &page, &slot), PGD_EIO);
    T_EQ(n_fail, 1);
    const uint32_t *ta, *tb;
    T_EQ(pgd_seq_pages(c, a, &ta), 2);
    T_EQ(pgd_seq_pages(c, b, &tb), 2);
    T_EQ(ta[1], tb[1]); /* still shared */
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_cache_get_stats(c, &cs);
    T_EQ(cs.n_cow_copies, 0);
    pgd_seq_destroy(c, b);
    pgd_seq_destroy(c, a);
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_cache_destroy(c);
    free(mem);
    return 0;
}

/* The model-based test again over a caller-owned arena with a counting copy hook: every
 * copy-on-write goes through the hook, and each run ends exactly as the pool-owned one. */
static int test_model_arena(void)
{
    static const struct {
        uint32_t T, n_pages;
        int policy;
    } cfg[] = {{4, 24, PGD_POLICY_LRU}, {4, 24, PGD_POLICY_BELADY}, {1, 16, PGD_POLICY_LRU}};
    uint64_t n_cow = 0;
    for (int s = 0; s < 6; s++) {
        size_t k = (size_t)s % 3;
        pgd_cache_stats own, caller;
        memset(&own, 0, sizeof own);
        memset(&caller, 0, sizeof caller);
        if (model_run_ex(cfg[k].T, cfg[k].n_pages, 1, cfg[k].policy, (uint64_t)s + 1, 3000, 0, 0,
                         &own))
            return 1;
        if (model_run_ex(cfg[k].T, cfg[k].n_pages, 1, cfg[k].policy, (uint64_t)s + 1, 3000, 0, 1,
                         &caller))
            return 1;
        T_ASSERT(memcmp(&own, &caller, sizeof own) == 0);
        n_cow += caller.n_cow_copies;
    }
    T_ASSERT(n_cow > 0); /* the hook was exercised */
    printf("     model over a caller arena: %" PRIu64 " copies, all through the hook\n", n_cow);
    return 0;
}

/* Token mode with precomputed hashes (match_hashed / commit_hashed): the same pages and
 * results as the plain calls, the sequence stays in token mode, a partial hash array is
 * completed by hashing, and hashes of another tenant are refused (hashes[0] is checked). */
static int test_match_commit_hashed(void)
{
    pgd_cache *c = make_cache(4, 24);
    pgd_seq *a, *b, *d;
    int32_t t[22];
    pgd_hash h[5], hb[5];
    T_ASSERT(c);
    toks_seq(t, 22, 300);
    T_EQ(pgd_cache_hash_tokens(c, "s", 1, t, 22, h, 5), 5);
    T_EQ(pgd_cache_hash_tokens(c, "b", 1, t, 22, hb, 5), 5);
    T_OK(pgd_seq_create(c, "s", 1, &a));
    T_EQ(pgd_seq_match_hashed(c, a, t, 22, h, 5), 0);
    T_EQ(pgd_seq_grow(c, a, 22), PGD_OK);
    /* two pages from the caller's hashes, then the rest hashed here (n_hashes = 2) */
    T_EQ(pgd_seq_commit_hashed(c, a, t, 10, h, 2), 2);
    T_EQ(pgd_seq_commit_hashed(c, a, t + 10, 12, h, 2), 3);
    T_EQ(pgd_seq_commit_hashes(c, a, h, 1), PGD_ESTATE); /* token mode */
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_seq_destroy(c, a);
    /* plain and hashed matches see the same chain; the hashed one may stop early */
    T_EQ(probe(c, "s", t, 22), 20);
    T_OK(pgd_seq_create(c, "s", 1, &b));
    T_EQ(pgd_seq_match_hashed(c, b, t, 21, h, 3), 20); /* pages 3, 4 hashed here */
    T_EQ(pgd_seq_grow(c, b, 1), PGD_OK);
    T_EQ(pgd_seq_commit(c, b, t + 20, 1), 0); /* still token mode */
    T_EQ(pgd_seq_match_hashed(c, b, t, 21, h, 3), PGD_ESTATE);
    pgd_seq_destroy(c, b);
    /* another tenant's hashes: refused before anything is pinned */
    T_OK(pgd_seq_create(c, "s", 1, &d));
    T_EQ(pgd_seq_match_hashed(c, d, t, 22, hb, 5), PGD_EINVAL);
    T_EQ(pgd_seq_match_hashed(c, d, t, 22, NULL, 5), PGD_EINVAL);
    T_EQ(pgd_seq_length(c, d), 0);
    T_EQ(pgd_seq_match_hashed(c, d, t, 22, NULL, 0), 20); /* no hashes: as pgd_seq_match */
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_seq_destroy(c, d);
    pgd_cache_destroy(c);
    return 0;
}

/* The model-based test with a RAM tier below the pool: evicted pages come back through
 * promotions, and every check of the plain runs holds (content, refcounts, bounds on what
 * a match returns), the hit counters counting the pool's part. */
static int test_model_tiers(void)
{
    static const struct {
        uint32_t T, n_pages;
        int policy;
    } cfg[] = {{4, 24, PGD_POLICY_LRU}, {4, 24, PGD_POLICY_BELADY}, {1, 16, PGD_POLICY_LRU}};
    int lng = getenv("PGD_TEST_LONG") != NULL;
    pgd_cache_stats tot;
    uint64_t n_gets = 0, n_puts = 0;
    memset(&tot, 0, sizeof tot);
    for (int s = 0; s < (lng ? 30 : 6); s++) {
        size_t k = (size_t)s % 3;
        pgd_tier_ram_params rp = pgd_tier_ram_default_params();
        /* room for about 40 records of this geometry: older ones age out */
        rp.capacity_bytes = 40 * (PGD_RECORD_HEADER_BYTES + 2ull * NL * NH * cfg[k].T * HD * 4);
        T_OK(pgd_tier_ram_create(&rp, &model_tier));
        pgd_cache_stats end;
        memset(&end, 0, sizeof end);
        int fail = model_run_ex(cfg[k].T, cfg[k].n_pages, 1, cfg[k].policy, (uint64_t)s + 1,
                                lng ? 20000 : 3000, 0, s % 2, &end);
        pgd_tier_stats ts;
        pgd_tier_get_stats(model_tier, &ts);
        pgd_tier_close(model_tier);
        model_tier = NULL;
        if (fail) return 1;
        tot.n_registered += end.n_registered;
        tot.n_evictions += end.n_evictions;
        n_gets += ts.n_gets;
        n_puts += ts.n_puts;
    }
    T_ASSERT(n_gets > 0);
    printf("     model with a tier: %" PRIu64 " registered, %" PRIu64 " evicted, %" PRIu64
           " demoted, %" PRIu64 " promoted\n",
           tot.n_registered, tot.n_evictions, n_puts, n_gets);
    return 0;
}

static int test_model(void)
{
    const char *one = getenv("PGD_TEST_SEED");
    int long_mode = getenv("PGD_TEST_LONG") != NULL;
    int n_seeds = long_mode ? 200 : 20, steps = long_mode ? 20000 : 5000;
    static const struct {
        uint32_t T, n_pages;
        int payload, policy;
    } cfg[] = {
        {4, 24, 1, PGD_POLICY_LRU}, {4, 24, 1, PGD_POLICY_BELADY}, {1, 16, 1, PGD_POLICY_LRU},
        {8, 12, 0, PGD_POLICY_LRU}, {4, 40, 0, PGD_POLICY_BELADY},
    };
    const size_t n_cfg = sizeof cfg / sizeof cfg[0];
    if (one) {
        uint64_t seed = strtoull(one, NULL, 10);
        for (size_t k = 0; k < n_cfg; k++)
            if (model_run(cfg[k].T, cfg[k].n_pages, cfg[k].payload, cfg[k].policy, seed, steps,
                          getenv("PGD_TEST_VERBOSE") != NULL))
                return 1;
        /* and every other built-in policy on every configuration */
        for (int kind = 0; kind < PGD_POLICY_COUNT; kind++)
            for (size_t k = 0; kind > PGD_POLICY_BELADY && k < n_cfg; k++)
                if (pgd_policy_builtin((pgd_policy_kind)kind) &&
                    model_run(cfg[k].T, cfg[k].n_pages, cfg[k].payload, kind, seed, steps,
                              getenv("PGD_TEST_VERBOSE") != NULL))
                    return 1;
        return 0;
    }
    for (int s = 0; s < n_seeds; s++) {
        /* most seeds on the main configuration, a few on each of the others */
        size_t k = s % 4 == 0 ? 1 + (size_t)(s / 4) % 4 : 0;
        if (model_run(cfg[k].T, cfg[k].n_pages, cfg[k].payload, cfg[k].policy, (uint64_t)s + 1,
                      steps, 0))
            return 1;
    }
    printf("     model: %d runs x %d steps: %" PRIu64 "/%" PRIu64 " pages hit, %" PRIu64
           " registered, %" PRIu64 " dedup, %" PRIu64 " cow, %" PRIu64 " evicted\n",
           n_seeds, steps, model_total.n_hit_pages, model_total.n_query_pages,
           model_total.n_registered, model_total.n_dedup, model_total.n_cow_copies,
           model_total.n_evictions);
    /* The leaf-only rule (pgd_cache_check, and the cache's refusal of a non-leaf victim,
     * which the model sees as a failed allocation) under every other built-in policy
     * (Belady gets the model's oracle): one short run per configuration, so the test's
     * time grows by about 6% per policy. */
    for (int kind = 0; kind < PGD_POLICY_COUNT; kind++) {
        if (kind == PGD_POLICY_LRU || kind == PGD_POLICY_BELADY) continue; /* above */
        if (!pgd_policy_builtin((pgd_policy_kind)kind)) continue;
        uint64_t ev0 = model_total.n_evictions, hit0 = model_total.n_hit_pages;
        int runs = long_mode ? 4 * (int)n_cfg : (int)n_cfg;
        for (int r = 0; r < runs; r++) {
            size_t k = (size_t)r % n_cfg;
            if (model_run(cfg[k].T, cfg[k].n_pages, cfg[k].payload, kind, (uint64_t)r + 101,
                          steps / 4, 0)) {
                fprintf(stderr, "policy %s\n", pgd_policy_name((pgd_policy_kind)kind));
                return 1;
            }
        }
        printf("     model under %s: %d runs x %d steps: %" PRIu64 " pages hit, %" PRIu64
               " evicted\n",
               pgd_policy_name((pgd_policy_kind)kind), runs, steps / 4,
               model_total.n_hit_pages - hit0, model_total.n_evictions - ev0);
        T_ASSERT(model_total.n_evictions > ev0);
    }
    return 0;
}

/* ---- KV bytes do not depend on the write path ---- */

enum { IV_NL = 2, IV_NH = 2, IV_PT = 16, IV_N = 75, IV_NHEAD = 4, IV_ROWS = 11 };

typedef struct iv_data {
    uint32_t hd;
    float *k, *v; /* [IV_NL][IV_N][IV_NH][hd] */
    float *q;     /* [IV_ROWS][IV_NHEAD][hd] */
} iv_data;

static float iv_rand(uint64_t *st)
{
    return (float)((t_rand(st) >> 40) * 0x1p-24 * 2.0 - 1.0);
}

/* Writes positions [p0, p1) of every layer of s in chunks of `chunk` rows (0: one call);
 * layer-inner order, as a forward pass writes. Grows first. */
static int iv_write(pgd_cache *c, pgd_seq *s, const iv_data *d, uint32_t p0, uint32_t p1,
                    uint32_t chunk)
{
    const size_t row = (size_t)IV_NH * d->hd;
    for (uint32_t p = p0; p < p1;) {
        uint32_t n = chunk && chunk < p1 - p ? chunk : p1 - p;
        if (pgd_seq_length(c, s) < p + n) T_OK(pgd_seq_grow(c, s, p + n - pgd_seq_length(c, s)));
        for (uint32_t l = 0; l < IV_NL; l++) {
            const size_t off = ((size_t)l * IV_N + p) * row;
            T_OK(pgd_seq_write_kv(c, s, p, n, l, d->k + off, d->v + off));
        }
        p += n;
    }
    return 0;
}

/* Attention of s's last IV_ROWS rows (a chunk: the rows of the last page, whose ring copy
 * every path still holds) and of its last row (decode), fast path
 * and reference, every layer: out[4][IV_NL][IV_ROWS][IV_NHEAD][hd]. */
static int iv_attend(pgd_cache *c, pgd_seq *s, const iv_data *d, float *out)
{
    const size_t one = (size_t)IV_ROWS * IV_NHEAD * d->hd;
    pgd_attn_params ap = pgd_attn_default_params();
    ap.n_head = IV_NHEAD;
    pgd_attn *a;
    T_OK(pgd_attn_create(c, &ap, &a));
    memset(out, 0, 4 * IV_NL * one * sizeof *out);
    for (uint32_t l = 0; l < IV_NL; l++) {
        float *o = out + (size_t)l * one;
        const float *qd = d->q + (size_t)(IV_ROWS - 1) * IV_NHEAD * d->hd;
        pgd_attn_item chunk = {s, IV_ROWS, d->q, o};
        pgd_attn_item dec = {s, 1, qd, o + IV_NL * one};
        T_OK(pgd_attn_run(a, l, &chunk, 1));
        T_OK(pgd_attn_run(a, l, &dec, 1));
        chunk.out = o + 2 * IV_NL * one;
        dec.out = o + 3 * IV_NL * one;
        T_OK(pgd_attn_run_ref(c, IV_NHEAD, l, &chunk, 1, 0));
        T_OK(pgd_attn_run_ref(c, IV_NHEAD, l, &dec, 1, 0));
    }
    pgd_attn_destroy(a);
    return 0;
}

static pgd_cache *iv_cache(pgd_kv_type type, uint32_t hd)
{
    pgd_cache_params p = params(IV_PT, 64);
    p.pool.n_layers = IV_NL;
    p.pool.n_kv_heads = IV_NH;
    p.pool.head_dim = hd;
    p.pool.kv_type = type;
    p.kv_residual = IV_PT; /* the smallest window: the ring grows for long writes */
    pgd_cache *c = NULL;
    if (pgd_cache_create(&p, &c) != PGD_OK) return NULL;
    return c;
}

/* For every kv type (head_dim 8: q8_0 / q4_0 blocks span 4 rows; 64), the same K/V rows
 * written by one call, one row at a time, chunks of 3 and 7, a write / truncate / rewrite
 * (a preemption's recompute) and after a prefix hit on pages written row by row give the
 * same bytes in every full page and the same attention, bit for bit. */
static int test_kv_bytes_path_invariant(void)
{
    static const uint32_t hds[] = {8, 64};
    enum { N_PATHS = 6 };
    for (int ti = 0; ti <= PGD_KV_KIVI2; ti++)
        for (int hi = 0; hi < 2; hi++) {
            const pgd_kv_type type = (pgd_kv_type)ti;
            iv_data d;
            d.hd = hds[hi];
            pgd_cache *probe = iv_cache(type, d.hd);
            if (!probe) continue; /* a geometry the codec refuses (kivi2 head_dim 8 is fine) */
            pgd_cache_destroy(probe);
            const size_t kvn = (size_t)IV_NL * IV_N * IV_NH * d.hd;
            const size_t on = 4 * (size_t)IV_NL * IV_ROWS * IV_NHEAD * d.hd;
            d.k = malloc(kvn * sizeof *d.k);
            d.v = malloc(kvn * sizeof *d.v);
            d.q = malloc((size_t)IV_ROWS * IV_NHEAD * d.hd * sizeof *d.q);
            float *out0 = malloc(on * sizeof *out0), *out = malloc(on * sizeof *out);
            T_ASSERT(d.k && d.v && d.q && out0 && out);
            uint64_t st = 1234 + (uint64_t)ti * 17 + hi;
            for (size_t i = 0; i < kvn; i++) {
                /* Rows of very different magnitudes: a later row of a block needs a
                 * larger scale than the earlier ones. */
                float m = (i / (IV_NH * d.hd)) % 3 == 2 ? 4.0f : 0.5f;
                d.k[i] = iv_rand(&st) * m;
                d.v[i] = iv_rand(&st) * m;
            }
            for (size_t i = 0; i < (size_t)IV_ROWS * IV_NHEAD * d.hd; i++)
                d.q[i] = iv_rand(&st) * 2.0f;
            pgd_cache *c0 = NULL;
            pgd_seq *s0 = NULL;
            const uint32_t *ids0 = NULL;
            for (int path = 0; path < N_PATHS; path++) {
                pgd_cache *c = iv_cache(type, d.hd);
                pgd_seq *s;
                T_ASSERT(c);
                T_OK(pgd_seq_create(c, NULL, 0, &s));
                if (path == 0) T_OK(iv_write(c, s, &d, 0, IV_N, 0));
                if (path == 1) {
                    /* Decode: each row of the last page attends right after its write, and
                     * must see what the same row of a chunk sees once the chunk is written
                     * (not the rows after it, e.g. through a block scale they raise). */
                    T_OK(iv_write(c, s, &d, 0, IV_N - IV_ROWS, 1));
                    const size_t one = (size_t)IV_ROWS * IV_NHEAD * d.hd, qr = one / IV_ROWS;
                    pgd_attn_params ap = pgd_attn_default_params();
                    ap.n_head = IV_NHEAD;
                    pgd_attn *a;
                    T_OK(pgd_attn_create(c, &ap, &a));
                    for (uint32_t r = 0; r < IV_ROWS; r++) {
                        T_OK(iv_write(c, s, &d, IV_N - IV_ROWS + r, IV_N - IV_ROWS + r + 1, 1));
                        for (uint32_t l = 0; l < IV_NL; l++) {
                            pgd_attn_item it = {s, 1, d.q + r * qr, out + l * one + r * qr};
                            T_OK(pgd_attn_run(a, l, &it, 1));
                            it.out = out + (2 * IV_NL + l) * one + r * qr;
                            T_OK(pgd_attn_run_ref(c, IV_NHEAD, l, &it, 1, 0));
                        }
                    }
                    pgd_attn_destroy(a);
                    for (uint32_t l = 0; l < IV_NL; l++) {
                        if (memcmp(out + l * one, out0 + l * one, one * sizeof *out) != 0)
                            T_FAIL("%s hd %u: decode rows differ from the chunk's rows (fast)",
                                   pgd_kv_type_name(type), d.hd);
                        if (memcmp(out + (2 * IV_NL + l) * one, out0 + (2 * IV_NL + l) * one,
                                   one * sizeof *out) != 0)
                            T_FAIL("%s hd %u: decode rows differ from the chunk's rows (ref)",
                                   pgd_kv_type_name(type), d.hd);
                    }
                }
                if (path == 2) T_OK(iv_write(c, s, &d, 0, IV_N, 3));
                if (path == 3) T_OK(iv_write(c, s, &d, 0, IV_N, 7));
                if (path == 4) {
                    /* Preemption-like: 40 rows, truncated to 21, recomputed in fives (the
                     * truncated rows are rewritten from the same values). */
                    T_OK(iv_write(c, s, &d, 0, 40, 0));
                    T_OK(pgd_seq_truncate(c, s, 21));
                    T_OK(iv_write(c, s, &d, 21, IV_N, 5));
                }
                if (path == 5) {
                    /* A prefix hit on pages that another sequence wrote row by row. */
                    pgd_seq *w;
                    int32_t toks[IV_N];
                    toks_seq(toks, IV_N, 100);
                    T_OK(pgd_seq_create(c, NULL, 0, &w));
                    T_OK(iv_write(c, w, &d, 0, IV_N, 1));
                    T_EQ(pgd_seq_commit(c, w, toks, IV_N), IV_N / IV_PT);
                    pgd_seq_destroy(c, w);
                    T_EQ(pgd_seq_match(c, s, toks, IV_N), IV_N / IV_PT * IV_PT);
                    T_OK(iv_write(c, s, &d, IV_N / IV_PT * IV_PT, IV_N, 0));
                }
                T_EQ(pgd_seq_length(c, s), IV_N);
                T_OK(pgd_cache_check(c));
                const uint32_t *ids;
                T_EQ(pgd_seq_pages(c, s, &ids), (IV_N + IV_PT - 1) / IV_PT);
                T_OK(iv_attend(c, s, &d, path ? out : out0));
                if (path == 0) {
                    c0 = c;
                    s0 = s;
                    ids0 = ids;
                    continue;
                }
                pgd_pool *p0 = pgd_cache_pool(c0), *p = pgd_cache_pool(c);
                const uint64_t pb = pgd_pool_page_bytes(p);
                for (uint32_t i = 0; i < IV_N / IV_PT; i++)
                    if (memcmp(pgd_pool_page_data(p0, ids0[i]), pgd_pool_page_data(p, ids[i]),
                               pb) != 0)
                        T_FAIL("%s hd %u path %d: full page %u differs from one write",
                               pgd_kv_type_name(type), d.hd, path, i);
                if (memcmp(out, out0, on * sizeof *out) != 0)
                    T_FAIL("%s hd %u path %d: attention differs from one write",
                           pgd_kv_type_name(type), d.hd, path);
                pgd_cache_destroy(c);
            }
            (void)s0;
            pgd_cache_destroy(c0);
            free(d.k);
            free(d.v);
            free(d.q);
            free(out0);
            free(out);
        }
    return 0;
}

int main(void)
{
    T_RUN(test_create_params);
    T_RUN(test_empty_match);
    T_RUN(test_commit_destroy_match);
    T_RUN(test_salt_isolation);
    T_RUN(test_hash_tokens_and_hash_api);
    T_RUN(test_pinned_key);
    T_RUN(test_fork_cow);
    T_RUN(test_fork_uncommitted_pages);
    T_RUN(test_fork_commit_shared_page);
    T_RUN(test_dedup_interleaved);
    T_RUN(test_hash_mode_continuation);
    T_RUN(test_fork_commit_without_write);
    T_RUN(test_bad_sizes);
    T_RUN(test_grow_overflow);
    T_RUN(test_max_seqs);
    T_RUN(test_grow_enospc);
    T_RUN(test_eviction_leaves_first);
    T_RUN(test_lru_order);
    T_RUN(test_evict_clear_stats);
    T_RUN(test_truncate);
    T_RUN(test_write_kv);
    T_RUN(test_kv_types);
    T_RUN(test_match_commit_hashed);
    T_RUN(test_model);
    T_RUN(test_model_arena);
    T_RUN(test_model_tiers);
    T_RUN(test_copy_hook_failure);
    T_RUN(test_kv_bytes_path_invariant);
    T_DONE();
}
