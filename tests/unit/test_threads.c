/* SPDX-License-Identifier: MIT */
/*
 * test_threads.c - concurrent callers on one cache (cache.h: one lock per cache manager).
 * Four workers create / match / grow / write / commit / fork / destroy sequences whose
 * prompts share prefixes (so they share pages and dedup), while the main thread runs
 * pgd_cache_check and reads stats. K/V is written through write_slot + pgd_pool_k outside
 * the lock, as an engine does, and every matched page is checked to hold the values of its
 * tokens. Run under -DPGD_SANITIZE=thread.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include <pagoda/cache.h>

#include "t.h"

enum { N_THREADS = 4, N_OPS = 20000, PT = 4, N_PAGES = 96, MAXLEN = 48, MAXSEQ = 3 };

static pgd_cache *cache;
static pgd_pool *pool;
static atomic_int failed, running;
static char fail_msg[256];
static int32_t streams[2][MAXLEN];

#define W_FAIL(...)                                                                                \
    do {                                                                                           \
        if (!atomic_exchange(&failed, 1)) snprintf(fail_msg, sizeof fail_msg, __VA_ARGS__);        \
        return 1;                                                                                  \
    } while (0)

typedef struct {
    pgd_seq *s;
    int salt;
    uint32_t len, nc;
    int32_t t[MAXLEN];
} wseq;

static uint64_t mix(uint64_t x)
{
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ull;
    x ^= x >> 27;
    x *= 0x81dadef4bc2dd44dull;
    return x ^ (x >> 33);
}

/* K/V value of position p: a function of (salt, tokens[0..p]). */
static float tag(int salt, const int32_t *t, uint32_t p)
{
    uint64_t h = mix(77 + (uint64_t)salt);
    for (uint32_t i = 0; i <= p; i++)
        h = mix(h ^ (uint32_t)t[i]);
    return (float)(h >> 40);
}

static const char *salt_str(int salt)
{
    return salt ? "tenant-b" : "tenant-a";
}

static int check_content(wseq *q, uint32_t upto)
{
    const uint32_t *ids;
    pgd_seq_pages(cache, q->s, &ids);
    for (uint32_t p = 0; p < upto; p++) {
        float *k = pgd_pool_k(pool, ids[p / PT], 0, 0);
        float *v = pgd_pool_v(pool, ids[p / PT], 0, 0);
        float want = tag(q->salt, q->t, p);
        if (k[(p % PT) * 2] != want || v[(p % PT) * 2 + 1] != -want)
            W_FAIL("position %u of a matched/committed page holds the wrong K/V", p);
    }
    return 0;
}

/* Writes and commits positions [nc, len). */
static int fill(wseq *q)
{
    for (uint32_t p = q->nc; p < q->len; p++) {
        uint32_t page, slot;
        int rc = pgd_seq_write_slot(cache, q->s, p, &page, &slot);
        if (rc == PGD_ENOSPC) return 0; /* pool full: try later */
        if (rc != PGD_OK) W_FAIL("write_slot(%u) = %d", p, rc);
        float *k = pgd_pool_k(pool, page, 0, 0);
        float *v = pgd_pool_v(pool, page, 0, 0);
        float val = tag(q->salt, q->t, p);
        k[slot * 2] = val;
        k[slot * 2 + 1] = 1.0f;
        v[slot * 2] = 2.0f;
        v[slot * 2 + 1] = -val;
    }
    int rc = pgd_seq_commit(cache, q->s, q->t + q->nc, q->len - q->nc);
    if (rc < 0) W_FAIL("commit = %d", rc);
    q->nc = q->len;
    return check_content(q, q->nc);
}

static void make_tokens(uint64_t *rng, int32_t *t, uint32_t from)
{
    uint32_t k = (uint32_t)(t_rand(rng) % 2), div = from + (uint32_t)(t_rand(rng) % MAXLEN);
    for (uint32_t p = from; p < MAXLEN; p++)
        t[p] = p < div ? streams[k][p] : (int32_t)(t_rand(rng) % 5);
}

static int worker_run(uint64_t seed)
{
    uint64_t rng = seed;
    wseq seqs[MAXSEQ];
    int n = 0;
    for (int op = 0; op < N_OPS && !atomic_load(&failed); op++) {
        uint32_t r = (uint32_t)(t_rand(&rng) % 100);
        int i = n ? (int)(t_rand(&rng) % (uint32_t)n) : -1;
        if (r < 25 || n == 0) {
            if (n == MAXSEQ) {
                pgd_seq_destroy(cache, seqs[0].s);
                seqs[0] = seqs[--n];
            }
            wseq *q = &seqs[n];
            q->salt = (int)(t_rand(&rng) % 2);
            make_tokens(&rng, q->t, 0);
            int rc = pgd_seq_create(cache, salt_str(q->salt), 8, &q->s);
            if (rc != PGD_OK) W_FAIL("seq_create = %d", rc);
            n++;
            int64_t m = pgd_seq_match(cache, q->s, q->t, 8 + t_rand(&rng) % (MAXLEN - 8));
            if (m < 0 || m % PT) W_FAIL("match = %" PRId64, m);
            q->len = q->nc = (uint32_t)m;
            if (check_content(q, q->nc)) return 1;
        } else if (r < 55) {
            wseq *q = &seqs[i];
            if (q->len >= MAXLEN) continue;
            uint32_t k = 1 + (uint32_t)(t_rand(&rng) % (MAXLEN - q->len));
            int rc = pgd_seq_grow(cache, q->s, k);
            if (rc == PGD_ENOSPC) continue;
            if (rc != PGD_OK) W_FAIL("grow = %d", rc);
            q->len += k;
            if (fill(q)) return 1;
        } else if (r < 70) {
            if (n == MAXSEQ) continue;
            wseq *q = &seqs[i], *d = &seqs[n];
            int rc = pgd_seq_fork(cache, q->s, &d->s);
            if (rc == PGD_ESTATE && (q->len + PT - 1) / PT > q->nc / PT + 1)
                continue; /* reported */
            if (rc != PGD_OK) W_FAIL("fork = %d", rc);
            d->salt = q->salt;
            d->len = q->len;
            d->nc = q->nc;
            memcpy(d->t, q->t, sizeof d->t);
            make_tokens(&rng, d->t, q->len);
            n++;
        } else if (r < 90) {
            pgd_seq_destroy(cache, seqs[i].s);
            seqs[i] = seqs[--n];
        } else if (r < 95) {
            pgd_hash h[MAXLEN / PT];
            int32_t t[MAXLEN];
            make_tokens(&rng, t, 0);
            if (pgd_cache_hash_tokens(cache, "tenant-a", 8, t, MAXLEN, h, MAXLEN / PT) !=
                MAXLEN / PT)
                W_FAIL("hash_tokens");
        } else if (r < 98) {
            pgd_cache_evict(cache, 2);
        } else {
            pgd_cache_stats st;
            pgd_cache_get_stats(cache, &st);
            if (st.n_pages_free + st.n_pages_used + st.n_pages_evictable != N_PAGES)
                W_FAIL("stats do not add up");
        }
    }
    while (n)
        pgd_seq_destroy(cache, seqs[--n].s);
    return 0;
}

static void *worker(void *arg)
{
    worker_run((uint64_t)(uintptr_t)arg * 0x9E3779B97F4A7C15ull + 1);
    atomic_fetch_sub(&running, 1);
    return NULL;
}

static int test_concurrent_callers(void)
{
    static const uint8_t key[8] = "threads";
    pgd_cache_params p = pgd_cache_default_params();
    pthread_t th[N_THREADS];
    uint64_t rng = 5;
    p.pool.n_layers = 1;
    p.pool.n_kv_heads = 1;
    p.pool.head_dim = 2;
    p.pool.page_tokens = PT;
    p.pool.kv_type = PGD_KV_F32;
    p.pool.capacity_pages = N_PAGES;
    p.hash_key = key;
    p.hash_key_len = sizeof key;
    T_OK(pgd_cache_create(&p, &cache));
    pool = pgd_cache_pool(cache);
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < MAXLEN; i++)
            streams[k][i] = (int32_t)(t_rand(&rng) % 5);
    atomic_store(&running, N_THREADS);
    for (int i = 0; i < N_THREADS; i++)
        T_EQ(pthread_create(&th[i], NULL, worker, (void *)(uintptr_t)(i + 1)), 0);
    int n_checks = 0;
    while (atomic_load(&running) > 0) {
        if (pgd_cache_check(cache) != PGD_OK) {
            atomic_store(&failed, 1);
            snprintf(fail_msg, sizeof fail_msg, "pgd_cache_check failed during the run");
            break;
        }
        n_checks++;
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    for (int i = 0; i < N_THREADS; i++)
        pthread_join(th[i], NULL);
    if (atomic_load(&failed)) T_FAIL("%s", fail_msg);
    pgd_cache_stats st;
    pgd_cache_get_stats(cache, &st);
    printf("     %d checks during the run; %" PRIu64 " hit pages, %" PRIu64 " dedup, %" PRIu64
           " cow, %" PRIu64 " evictions\n",
           n_checks, st.n_hit_pages, st.n_dedup, st.n_cow_copies, st.n_evictions);
    T_EQ(pgd_cache_check(cache), PGD_OK);
    T_EQ(st.n_seqs, 0);
    T_EQ(st.n_pages_used, 0);
    T_ASSERT(st.n_hit_pages > 0);
    T_EQ(pgd_cache_clear(cache), st.n_pages_evictable);
    pgd_cache_get_stats(cache, &st);
    T_EQ(st.n_pages_free, N_PAGES);
    T_EQ(st.n_pages_cached, 0);
    T_EQ(pgd_cache_check(cache), PGD_OK);
    pgd_cache_destroy(cache);
    return 0;
}

int main(void)
{
    T_RUN(test_concurrent_callers);
    T_DONE();
}
