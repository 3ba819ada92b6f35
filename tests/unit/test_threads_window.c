/* SPDX-License-Identifier: MIT */
/*
 * test_threads_window.c - concurrent callers on one cache with window layers (cache.h
 * "Window layers": two groups, two locks, taken in one order). Four workers create / match /
 * grow / write / commit / fork / truncate / destroy sequences whose prompts share prefixes
 * (so they hit, cut back and dedup in both groups), each write through pgd_seq_write_kv of
 * every layer, while the main thread runs pgd_cache_check (which walks both groups and their
 * agreement) and reads stats. Every K/V row written is a function of (layer, position,
 * token), and a hit's window pages are checked to hold their tokens' rows. Run under
 * -DPGD_SANITIZE=thread.
 */
#include <pthread.h>
#include <stdatomic.h>

#include <pagoda/cache.h>

#include "t.h"

enum { N_THREADS = 4, N_OPS = 3000, PT = 4, W = 10, NL = 2, HD = 4, MAXLEN = 64 };
static const uint8_t WIN_LAYERS[NL] = {1, 0};

static pgd_cache *cache;
static atomic_int failed, running;
static char fail_msg[256];
static int32_t streams[2][MAXLEN];

#define W_FAIL(...)                                                                                \
    do {                                                                                           \
        if (!atomic_exchange(&failed, 1)) snprintf(fail_msg, sizeof fail_msg, __VA_ARGS__);        \
        return 1;                                                                                  \
    } while (0)

static float value(uint32_t layer, uint64_t pos, int32_t tok)
{
    return (float)(layer * 1000 + (pos % 97) * 7 + (uint32_t)tok % 13);
}

/* Grows s to n tokens of stream t (from its length), writing and committing them. */
static int extend(pgd_seq *s, const int32_t *t, uint64_t n)
{
    uint64_t len = pgd_seq_length(cache, s);
    if (n <= len) return 0;
    if (pgd_seq_grow(cache, s, n - len) != PGD_OK) return 0; /* pool full: fine */
    float k[MAXLEN * HD], v[MAXLEN * HD];
    for (uint32_t l = 0; l < NL; l++) {
        for (uint64_t p = len; p < n; p++)
            for (uint32_t d = 0; d < HD; d++)
                k[(p - len) * HD + d] = v[(p - len) * HD + d] = value(l, p, t[p]);
        if (pgd_seq_write_kv(cache, s, len, (uint32_t)(n - len), l, k, v) != PGD_OK)
            W_FAIL("write_kv at %llu", (unsigned long long)len);
    }
    if (pgd_seq_commit(cache, s, t + len, n - len) < 0) W_FAIL("commit");
    return 0;
}

/* The window layer's live pages of a matched s hold their tokens' values. */
static int check_window(pgd_seq *s, const int32_t *t)
{
    const uint32_t *ids;
    uint32_t pl, n = pgd_seq_layer_pages(cache, s, 0, &ids);
    pgd_pool *pool = pgd_cache_layer_pool(cache, 0, &pl);
    uint64_t len = pgd_seq_length(cache, s);
    for (uint32_t i = 0; i < n; i++) {
        if (ids[i] == PGD_NO_PAGE) continue;
        const float *k = pgd_pool_k(pool, ids[i], pl, 0);
        for (uint32_t j = 0; j < PT && (uint64_t)i * PT + j < len; j++) {
            uint64_t p = (uint64_t)i * PT + j;
            if (k[j * HD] != value(0, p, t[p])) W_FAIL("window page %u holds another row", i);
        }
    }
    return 0;
}

static void *worker(void *arg)
{
    uint64_t rng = (uintptr_t)arg * 7919 + 1;
    for (int op = 0; op < N_OPS && !atomic_load(&failed); op++) {
        const int32_t *t = streams[t_rand(&rng) % 2];
        pgd_seq *s;
        if (pgd_seq_create(cache, NULL, 0, &s) != PGD_OK) continue;
        uint64_t want = 1 + t_rand(&rng) % MAXLEN;
        int64_t hit = pgd_seq_match(cache, s, t, want);
        if (hit < 0 || hit % PT || (uint64_t)hit > want) {
            atomic_store(&failed, 1);
            snprintf(fail_msg, sizeof fail_msg, "match returned %lld", (long long)hit);
        }
        if (!atomic_load(&failed)) check_window(s, t);
        while (!atomic_load(&failed) && pgd_seq_length(cache, s) < want) {
            uint64_t len = pgd_seq_length(cache, s);
            uint64_t step = 1 + t_rand(&rng) % 9;
            if (extend(s, t, len + step > want ? want : len + step)) break;
            if (pgd_seq_length(cache, s) == len) break; /* no room now */
        }
        if (t_rand(&rng) % 4 == 0) {
            pgd_seq *f;
            if (pgd_seq_fork(cache, s, &f) == PGD_OK) {
                extend(f, t,
                       pgd_seq_length(cache, f) + 3 > MAXLEN ? MAXLEN
                                                             : pgd_seq_length(cache, f) + 3);
                pgd_seq_destroy(cache, f);
            }
        }
        pgd_seq_destroy(cache, s);
    }
    atomic_fetch_sub(&running, 1);
    return NULL;
}

static int test_concurrent_window(void)
{
    pgd_cache_params p = pgd_cache_default_params();
    p.pool.n_layers = NL;
    p.pool.n_kv_heads = 1;
    p.pool.head_dim = HD;
    p.pool.page_tokens = PT;
    p.pool.kv_type = PGD_KV_F32;
    p.pool.capacity_pages = 80;
    p.window_tokens = W;
    p.window_layers = WIN_LAYERS;
    p.window_pages = 24;
    T_OK(pgd_cache_create(&p, &cache));
    for (int i = 0; i < MAXLEN; i++) {
        streams[0][i] = i % 5;
        streams[1][i] = i < 20 ? i % 5 : 100 + i; /* shares the first 20 tokens */
    }
    pthread_t th[N_THREADS];
    atomic_store(&running, N_THREADS);
    for (uintptr_t i = 0; i < N_THREADS; i++)
        T_ASSERT(pthread_create(&th[i], NULL, worker, (void *)i) == 0);
    int checks = 0;
    while (atomic_load(&running) > 0 && !atomic_load(&failed)) {
        if (pgd_cache_check(cache) != PGD_OK) {
            atomic_store(&failed, 1);
            snprintf(fail_msg, sizeof fail_msg, "pgd_cache_check failed");
        }
        pgd_cache_stats st;
        pgd_cache_get_stats(cache, &st);
        checks++;
    }
    for (int i = 0; i < N_THREADS; i++)
        pthread_join(th[i], NULL);
    if (atomic_load(&failed)) T_FAIL("%s", fail_msg);
    T_OK(pgd_cache_check(cache));
    pgd_cache_stats st;
    pgd_cache_get_stats(cache, &st);
    printf("%d checks; hit %llu tokens, cut %llu, %llu window pages released, %llu evicted\n",
           checks, (unsigned long long)st.n_hit_tokens, (unsigned long long)st.n_window_cut_tokens,
           (unsigned long long)st.n_window_released, (unsigned long long)st.n_window_evictions);
    T_ASSERT(st.n_hit_tokens > 0 && st.n_window_released > 0);
    T_EQ(st.n_window_pages_used, 0);
    pgd_cache_destroy(cache);
    return 0;
}

int main(void)
{
    T_RUN(test_concurrent_window);
    T_DONE();
}
