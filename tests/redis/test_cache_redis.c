/* SPDX-License-Identifier: MIT */
/*
 * test_cache_redis.c - two cache managers sharing one Redis ("two engines"): the same
 * model fingerprint and hash key, each with its own Redis tier handle on the same server
 * (write-through). A commits a prompt's pages; after A's flush, B matches the same
 * tokens and promotes them from Redis: pgd_seq_match_info says they came from the redis
 * tier, and the pool pages are byte-identical to A's (payload and key bounds). The same
 * prompt under another salt (tenant) is no hit. Then the same over a 3-master Redis
 * Cluster, with records on every master. Real redis-server processes (tests/t_redis.h);
 * skips (77) without them.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <pagoda/cache.h>
#include <pagoda/tier_redis.h>

#include "pgd_int.h"
#include "t.h"
#include "t_redis.h"
#include "t_tier.h"

enum { NL = 2, NH = 2, HD = 4, PT = 4, N_PAGES = 64 };

static const uint8_t hash_key[32] = "0123456789abcdef0123456789abcdef";
static const uint8_t mac_key[] = "the instances' shared key";

static void log_stderr(void *ud, int level, const char *msg)
{
    (void)ud;
    if (level <= PGD_LOG_WARN && !getenv("PGD_TEST_QUIET"))
        fprintf(stderr, "  [pagoda %d] %s\n", level, msg);
}

static pgd_tier *redis_tier(const char *url)
{
    pgd_tier_redis_params p = pgd_tier_redis_default_params();
    char err[512];
    pgd_tier *t = NULL;
    p.url = url;
    p.key = mac_key;
    p.key_len = sizeof mac_key - 1;
    p.log = log_stderr;
    if (pgd_tier_redis_create(&p, &t, err, sizeof err) != PGD_OK) {
        fprintf(stderr, "create %s: %s\n", url, err);
        return NULL;
    }
    return t;
}

/* An engine's cache over its own Redis tier handle (write-through). */
static pgd_cache *make_cache(pgd_tier *t)
{
    pgd_tier_use use = {t, 1, 0};
    pgd_cache_params p = pgd_cache_default_params();
    p.pool.n_layers = NL;
    p.pool.n_kv_heads = NH;
    p.pool.head_dim = HD;
    p.pool.page_tokens = PT;
    p.pool.kv_type = PGD_KV_F32;
    p.pool.capacity_pages = N_PAGES;
    p.pool.key_bounds = 1;
    p.hash_key = hash_key;
    p.hash_key_len = sizeof hash_key;
    p.model_fingerprint = (pgd_hash){0x5eed, 0xf00d};
    p.log = log_stderr;
    p.tiers = &use;
    p.n_tiers = 1;
    p.writeback_pages = 64;
    pgd_cache *c = NULL;
    if (pgd_cache_create(&p, &c) != PGD_OK) return NULL;
    return c;
}

static uint8_t tag_byte(pgd_hash h, uint64_t i)
{
    return (uint8_t)(t_mix(h.lo ^ t_mix(h.hi + (i >> 3))) >> ((i & 7) * 8));
}

/* The page's payload and key bounds, as a function of its block hash (what A computed). */
static void tag_page(pgd_cache *c, uint32_t page, pgd_hash h)
{
    pgd_pool *pool = pgd_cache_pool(c);
    uint8_t *d = pgd_pool_page_data(pool, page);
    for (uint64_t i = 0; i < pgd_pool_page_bytes(pool); i++)
        d[i] = tag_byte(h, i);
    float *b = pgd__pool_key_bounds_mut(pool, page, 0, 0);
    for (uint32_t i = 0; i < NL * NH * 2 * HD; i++)
        b[i] = (float)(tag_byte(h, 100000 + i) - 128);
}

static int page_tagged(pgd_cache *c, uint32_t page, pgd_hash h)
{
    pgd_pool *pool = pgd_cache_pool(c);
    const uint8_t *d = pgd_pool_page_data(pool, page);
    for (uint64_t i = 0; i < pgd_pool_page_bytes(pool); i++)
        if (d[i] != tag_byte(h, i)) return 0;
    const float *b = pgd_pool_key_bounds(pool, page, 0, 0);
    for (uint32_t i = 0; i < NL * NH * 2 * HD; i++)
        if (b[i] != (float)(tag_byte(h, 100000 + i) - 128)) return 0;
    return 1;
}

/* Engine A: computes tokens t[0..n) for tenant salt (every page tagged) and commits. */
static int compute(pgd_cache *c, const char *salt, const int32_t *t, size_t n)
{
    pgd_seq *s = NULL;
    pgd_hash hs[N_PAGES];
    size_t nh = pgd_cache_hash_tokens(c, salt, strlen(salt), t, n, hs, N_PAGES);
    if (pgd_seq_create(c, salt, strlen(salt), &s) != PGD_OK) return -1;
    int rc = -1;
    if (pgd_seq_grow(c, s, n) != PGD_OK) goto out;
    for (size_t i = 0; i < nh; i++) {
        uint32_t page, slot;
        if (pgd_seq_write_slot(c, s, i * PT, &page, &slot) != PGD_OK) goto out;
        tag_page(c, page, hs[i]);
    }
    if (pgd_seq_commit(c, s, t, n) < 0) goto out;
    rc = 0;
out:
    pgd_seq_destroy(c, s);
    return rc;
}

/* Engine B: matches t[0..n) for salt, waits for the promotion, checks every page against
 * A's bytes. Returns the matched length (negative: a page differs), *info filled. */
static int64_t serve(pgd_cache *c, const char *salt, const int32_t *t, size_t n,
                     pgd_match_info *info)
{
    pgd_seq *s = NULL;
    pgd_hash hs[N_PAGES];
    pgd_cache_hash_tokens(c, salt, strlen(salt), t, n, hs, N_PAGES);
    if (pgd_seq_create(c, salt, strlen(salt), &s) != PGD_OK) return -1;
    int64_t m = pgd_seq_match(c, s, t, n);
    if (m >= 0) {
        pgd_seq_wait(c, s);
        pgd_seq_match_info(c, s, info);
        m = (int64_t)pgd_seq_length(c, s);
        const uint32_t *ids;
        pgd_seq_pages(c, s, &ids);
        for (int64_t i = 0; i < m / PT; i++)
            if (!page_tagged(c, ids[i], hs[i])) m = -1000 - i;
    }
    pgd_seq_destroy(c, s);
    return m;
}

/* A computes, B serves, over two tier handles made from url. n_tokens: the prompt. */
static int two_engines(const char *url, size_t n_tokens)
{
    pgd_tier *ta = redis_tier(url), *tb = redis_tier(url);
    pgd_cache *a = ta ? make_cache(ta) : NULL, *b = tb ? make_cache(tb) : NULL;
    int32_t tokens[N_PAGES * PT];
    int rc = 1;
    if (!a || !b) goto out;
    for (size_t i = 0; i < n_tokens; i++)
        tokens[i] = (int32_t)(7 + 13 * i % 101);
    if (compute(a, "tenant-1", tokens, n_tokens) != 0) goto out;
    if (pgd_cache_flush(a) != PGD_OK) goto out; /* A's puts are in Redis */
    pgd_tier_stats st;
    pgd_tier_get_stats(ta, &st);
    if (st.n_puts != n_tokens / PT) {
        fprintf(stderr, "A wrote %llu records, not %zu\n", (unsigned long long)st.n_puts,
                n_tokens / PT);
        goto out;
    }
    pgd_match_info info;
    memset(&info, 0, sizeof info);
    int64_t m = serve(b, "tenant-1", tokens, n_tokens, &info);
    if (m != (int64_t)n_tokens || info.pool_tokens != 0 || info.n_tiers != 1 ||
        info.tier_tokens[0] != n_tokens) {
        fprintf(stderr, "B matched %lld (pool %llu, redis %llu) of %zu\n", (long long)m,
                (unsigned long long)info.pool_tokens, (unsigned long long)info.tier_tokens[0],
                n_tokens);
        goto out;
    }
    pgd_cache_tier_stats cs;
    pgd_cache_get_tier_stats(b, 0, &cs);
    if (cs.promoted_pages != n_tokens / PT) goto out;
    pgd_tier_get_stats(tb, &st);
    if (st.n_gets != n_tokens / PT || st.n_mac_failures || st.n_corrupt) goto out;
    /* Another tenant: the same tokens hash to other blocks: nothing from Redis. */
    memset(&info, 0, sizeof info);
    m = serve(b, "tenant-2", tokens, n_tokens, &info);
    if (m != 0 || info.tier_tokens[0] != 0) {
        fprintf(stderr, "tenant-2 matched %lld\n", (long long)m);
        goto out;
    }
    /* And B, served once, now holds them in its pool. */
    memset(&info, 0, sizeof info);
    m = serve(b, "tenant-1", tokens, n_tokens, &info);
    if (m != (int64_t)n_tokens || info.pool_tokens != n_tokens) goto out;
    if (pgd_cache_check(a) != PGD_OK || pgd_cache_check(b) != PGD_OK) goto out;
    rc = 0;
out:
    pgd_cache_destroy(a);
    pgd_cache_destroy(b);
    pgd_tier_close(ta);
    pgd_tier_close(tb);
    return rc;
}

static int test_standalone(void)
{
    t_redis r;
    char url[128];
    T_EQ(t_redis_start(&r, NULL), 0);
    snprintf(url, sizeof url, "redis://127.0.0.1:%d?instance=e", r.port);
    int rc = two_engines(url, 32 * PT);
    redisReply *rep = t_redis_cmd(&r, "DBSIZE");
    long long keys = rep && rep->type == REDIS_REPLY_INTEGER ? rep->integer : -1;
    if (rep) freeReplyObject(rep);
    t_redis_stop(&r);
    T_EQ(rc, 0);
    T_EQ(keys, 32);
    return 0;
}

static int test_cluster(void)
{
    t_cluster c;
    char url[256];
    if (t_cluster_start(&c, 3) != 0) T_FAIL("no cluster");
    /* One seed is enough: the slot map names the others. */
    snprintf(url, sizeof url, "redis://127.0.0.1:%d?cluster=1&instance=e", c.node[1].port);
    int rc = two_engines(url, 48 * PT);
    long long keys[3] = {-1, -1, -1};
    for (int i = 0; i < 3; i++) {
        redisReply *rep = t_redis_cmd(&c.node[i], "DBSIZE");
        if (rep && rep->type == REDIS_REPLY_INTEGER) keys[i] = rep->integer;
        if (rep) freeReplyObject(rep);
    }
    t_cluster_stop(&c);
    T_EQ(rc, 0);
    fprintf(stderr, "  cluster: records per master %lld %lld %lld\n", keys[0], keys[1], keys[2]);
    T_ASSERT(keys[0] > 0 && keys[1] > 0 && keys[2] > 0);
    T_EQ(keys[0] + keys[1] + keys[2], 48);
    return 0;
}

int main(void)
{
    if (!t_redis_available()) T_SKIP("redis-server is not installed");
    T_RUN(test_standalone);
    T_RUN(test_cluster);
    T_DONE();
}
