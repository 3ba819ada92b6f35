/* SPDX-License-Identifier: MIT */
/*
 * test_threads_tiers.c - concurrent callers on one cache with two tiers below the pool
 * (a small RAM tier spilling to a larger one), racing the mover threads: workers match
 * (promotions), wait or poll, grow, write, commit, park and destroy sequences whose prompts
 * share prefixes, while another thread evicts, clears, prefetches and flushes; 1 in 16
 * gets fails in either tier, so fills fall back to the next tier or fail, and sequences
 * are cut back. Every page
 * a sequence holds once its promotion settled is checked to carry the tag of its block
 * hash, so a fill that raced an eviction or a reuse of its page shows up. Bounded in time
 * (about a second); pgd_cache_check at the end. Run under -DPGD_SANITIZE=thread.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include <pagoda/cache.h>
#include <pagoda/tier.h>

#include "t.h"
#include "t_tier.h"

enum { N_WORKERS = 3, PT = 4, NL = 1, NH = 2, HD = 8, N_PAGES = 40, MAXP = 10 };

static pgd_cache *cache;
static atomic_int failed, stop;
static char fail_msg[256];
static int32_t streams[3][MAXP * PT];

#define W_FAIL(...)                                                                                \
    do {                                                                                           \
        if (!atomic_exchange(&failed, 1)) snprintf(fail_msg, sizeof fail_msg, __VA_ARGS__);        \
        return 1;                                                                                  \
    } while (0)

static uint32_t tag_word(pgd_hash h, uint32_t i)
{
    return (uint32_t)t_mix(h.lo ^ t_mix(h.hi + i));
}

static void tag_page(uint32_t page, pgd_hash h)
{
    pgd_pool *pool = pgd_cache_pool(cache);
    uint32_t *d = pgd_pool_page_data(pool, page);
    for (uint32_t i = 0; i < pgd_pool_page_bytes(pool) / 4; i++)
        d[i] = tag_word(h, i);
}

static int page_tagged(uint32_t page, pgd_hash h)
{
    pgd_pool *pool = pgd_cache_pool(cache);
    const uint32_t *d = pgd_pool_page_data(pool, page);
    for (uint32_t i = 0; i < pgd_pool_page_bytes(pool) / 4; i++)
        if (d[i] != tag_word(h, i)) return 0;
    return 1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One request: match, settle, check, compute the rest, commit, maybe park, destroy. */
static int request(uint64_t *rng)
{
    int salt = (int)(t_rand(rng) % 2);
    const char *sname = salt ? "b" : "a";
    const int32_t *t = streams[t_rand(rng) % 3];
    uint32_t n_tok = PT * (1 + (uint32_t)(t_rand(rng) % MAXP));
    pgd_hash hs[MAXP];
    uint32_t n_hs = (uint32_t)pgd_cache_hash_tokens(cache, sname, 1, t, n_tok, hs, MAXP);
    pgd_seq *s;
    if (pgd_seq_create(cache, sname, 1, &s) != PGD_OK) W_FAIL("create");
    int by_hash = (int)(t_rand(rng) % 2);
    int64_t m = by_hash ? pgd_seq_match_hashes(cache, s, hs, n_hs)
                        : pgd_seq_match_hashed(cache, s, t, n_tok, hs, n_hs);
    if (m < 0) W_FAIL("match: %lld", (long long)m);
    if (t_rand(rng) % 4 == 0) { /* destroyed with its promotion in flight */
        pgd_seq_destroy(cache, s);
        return 0;
    }
    if (t_rand(rng) % 2)
        pgd_seq_wait(cache, s);
    else
        while (!pgd_seq_ready(cache, s))
            ;
    uint64_t have = pgd_seq_length(cache, s);
    if (have != pgd_seq_n_committed(cache, s) || have % PT || have > n_tok)
        W_FAIL("lengths after settle: %llu", (unsigned long long)have);
    const uint32_t *ids;
    pgd_seq_pages(cache, s, &ids);
    for (uint32_t i = 0; i < have / PT; i++)
        if (!page_tagged(ids[i], hs[i])) W_FAIL("page %u of a match holds other bytes", i);
    if (pgd_seq_grow(cache, s, n_tok - have) == PGD_OK) {
        int ok = 1;
        for (uint32_t i = (uint32_t)(have / PT); ok && i < n_hs; i++) {
            uint32_t page, slot;
            ok = pgd_seq_write_slot(cache, s, (uint64_t)i * PT, &page, &slot) == PGD_OK;
            if (ok) tag_page(page, hs[i]); /* outside the lock, as an engine writes */
        }
        if (ok) {
            int r = by_hash ? pgd_seq_commit_hashes(cache, s, hs + have / PT, n_hs - have / PT)
                            : pgd_seq_commit_hashed(cache, s, t + have, n_tok - have, hs, n_hs);
            if (r < 0) W_FAIL("commit: %d", r);
            pgd_seq_pages(cache, s, &ids);
            for (uint32_t i = 0; i < n_hs; i++)
                if (!page_tagged(ids[i], hs[i])) W_FAIL("page %u after commit", i);
            if (t_rand(rng) % 4 == 0 && pgd_seq_park(cache, s) < 0) W_FAIL("park");
        }
    }
    pgd_seq_destroy(cache, s);
    return 0;
}

static void *worker(void *arg)
{
    uint64_t rng = 1000 + (uintptr_t)arg;
    while (!atomic_load(&stop) && !atomic_load(&failed))
        if (request(&rng)) break;
    return NULL;
}

static void *evictor(void *arg)
{
    uint64_t rng = 7 + (uintptr_t)arg;
    while (!atomic_load(&stop) && !atomic_load(&failed)) {
        uint32_t r = (uint32_t)(t_rand(&rng) % 100);
        if (r < 60) {
            pgd_cache_evict(cache, 1 + (uint32_t)(t_rand(&rng) % 8));
        } else if (r < 65) {
            pgd_cache_clear(cache);
        } else if (r < 85) {
            pgd_hash hs[MAXP];
            size_t n = pgd_cache_hash_tokens(cache, "a", 1, streams[t_rand(&rng) % 3], MAXP * PT,
                                             hs, MAXP);
            if (pgd_cache_prefetch(cache, hs, n) < 0) {
                atomic_store(&failed, 1);
                snprintf(fail_msg, sizeof fail_msg, "prefetch");
            }
        } else if (r < 90) {
            pgd_cache_flush(cache);
        } else {
            pgd_cache_tier_stats ts;
            pgd_cache_get_tier_stats(cache, t_rand(&rng) % 2, &ts);
        }
    }
    return NULL;
}

/* A wrapper over a real tier whose gets fail 1 in 16 (the record dropped, as a damaged one
 * is), so fills fail and sequences are cut back while everything else runs. */
static atomic_uint_fast64_t n_gets;
static atomic_int n_failed_gets;

static int w_bind(void *st, const pgd_record_ident *id)
{
    return pgd_tier_bind(st, id);
}
static int w_put(void *st, pgd_hash b, pgd_hash p, const void *page, const void *bounds,
                 pgd_tier_spill_fn spill, void *ud)
{
    return pgd_tier_put(st, b, p, page, bounds, spill, ud);
}
static int w_get(void *st, pgd_hash b, void *page, void *bounds)
{
    if (t_mix(atomic_fetch_add(&n_gets, 1) + 12345) % 16 == 0) {
        pgd_tier_del(st, b);
        atomic_fetch_add(&n_failed_gets, 1);
        return PGD_ENOTFOUND;
    }
    return pgd_tier_get(st, b, page, bounds);
}
static size_t w_lookup(void *st, const pgd_hash *h, size_t n)
{
    return pgd_tier_lookup(st, h, n);
}
static int w_del(void *st, pgd_hash b)
{
    return pgd_tier_del(st, b);
}
static void w_stats(void *st, pgd_tier_stats *out)
{
    pgd_tier_get_stats(st, out);
}
static int w_flush(void *st)
{
    return pgd_tier_flush(st);
}
static void w_close(void *st)
{
    pgd_tier_close(st);
}
static const pgd_tier_ops failing_ops = {"failing", w_bind,  w_put,   w_get, w_lookup, w_del,
                                         w_stats,   w_flush, w_close, NULL,  NULL};

static pgd_tier *ram_tier(uint64_t n_records)
{
    pgd_tier_ram_params p = pgd_tier_ram_default_params();
    p.capacity_bytes = n_records * (PGD_RECORD_HEADER_BYTES + 2ull * NL * NH * PT * HD * 4);
    pgd_tier *t = NULL;
    return pgd_tier_ram_create(&p, &t) == PGD_OK ? t : NULL;
}

static int test_concurrent_tiers(void)
{
    uint64_t rng = 99;
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < MAXP * PT; i++)
            streams[k][i] = i < 2 * PT ? 5 + i : (int32_t)(t_rand(&rng) % 1000);
    pgd_tier *t0 = NULL, *t1 = NULL, *in0 = ram_tier(12), *in1 = ram_tier(4096);
    T_ASSERT(in0 && in1);
    T_OK(pgd_tier_wrap(&failing_ops, in0, &t0));
    T_OK(pgd_tier_wrap(&failing_ops, in1, &t1));
    pgd_tier_use use[2] = {{t0, 0, 0}, {t1, 1, 1}};
    pgd_cache_params p = pgd_cache_default_params();
    p.pool.n_layers = NL;
    p.pool.n_kv_heads = NH;
    p.pool.head_dim = HD;
    p.pool.page_tokens = PT;
    p.pool.kv_type = PGD_KV_F32;
    p.pool.capacity_pages = N_PAGES;
    p.tiers = use;
    p.n_tiers = 2;
    p.tier_threads = 2;
    p.writeback_pages = 16;
    T_OK(pgd_cache_create(&p, &cache));
    pthread_t th[N_WORKERS + 1];
    for (uintptr_t i = 0; i < N_WORKERS; i++)
        T_ASSERT(pthread_create(&th[i], NULL, worker, (void *)i) == 0);
    T_ASSERT(pthread_create(&th[N_WORKERS], NULL, evictor, NULL) == 0);
    double t_end = now_s() + (getenv("PGD_TEST_LONG") ? 20.0 : 1.0);
    while (now_s() < t_end && !atomic_load(&failed)) {
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
        if (pgd_cache_check(cache) != PGD_OK) {
            atomic_store(&failed, 1);
            snprintf(fail_msg, sizeof fail_msg, "pgd_cache_check while running");
        }
    }
    atomic_store(&stop, 1);
    for (int i = 0; i <= N_WORKERS; i++)
        pthread_join(th[i], NULL);
    if (atomic_load(&failed)) T_FAIL("%s", fail_msg);
    T_OK(pgd_cache_flush(cache));
    T_OK(pgd_cache_check(cache));
    pgd_cache_tier_stats a, b;
    T_OK(pgd_cache_get_tier_stats(cache, 0, &a));
    T_OK(pgd_cache_get_tier_stats(cache, 1, &b));
    T_EQ(a.writeback_depth, 0);
    printf("  promoted %llu + %llu pages, demoted %llu + %llu, dropped %llu + %llu, "
           "failed fills %llu (%d gets failed)\n",
           (unsigned long long)a.promoted_pages, (unsigned long long)b.promoted_pages,
           (unsigned long long)a.demoted_pages, (unsigned long long)b.demoted_pages,
           (unsigned long long)a.demote_dropped, (unsigned long long)b.demote_dropped,
           (unsigned long long)(a.promote_failed + b.promote_failed), atomic_load(&n_failed_gets));
    T_ASSERT(a.promoted_pages + b.promoted_pages > 0);
    pgd_cache_destroy(cache);
    pgd_tier_close(t0);
    pgd_tier_close(t1);
    return 0;
}

int main(void)
{
    T_RUN(test_concurrent_tiers);
    T_DONE();
}
