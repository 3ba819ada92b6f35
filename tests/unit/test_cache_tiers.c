/* SPDX-License-Identifier: MIT */
/*
 * test_cache_tiers.c - the cache with storage tiers below the pool (cache.h "Tiers"):
 * write-back demotion on eviction, promotion at match (ready / wait, the cut-back on a
 * failed fill), write-through with admission, park, prefetch, the write-back slab's
 * bound, the parameters refused, a restart from a disk tier. Real tiers (RAM, disk in a
 * mkdtemp directory); pgd_tier_wrap wraps one only to inject faults (a get that fails, a
 * put that stalls).
 *
 * Every page's payload and key bounds are a tag computed from its block hash, so every
 * promoted page is checked byte for byte: a page served from a tier that holds anything
 * but what was written under its hash fails the test.
 *
 * The model-based test runs 7 configurations x 6 seeds (1 with a disk tier) x 600 steps
 * (a few seconds):
 * PGD_TEST_LONG=1 runs ten times more, PGD_TEST_SEED=n one seed.
 */
#define _XOPEN_SOURCE 700 /* nftw, mkdtemp */
#include <ftw.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

#include <pagoda/cache.h>
#include <pagoda/tier.h>

#include "pgd_int.h"
#include "t.h"
#include "t_alloc.h"
#include "t_dir.h"
#include "t_tier.h"

enum { NL = 2, NH = 2, HD = 4, PT = 4 };

static void log_stderr(void *ud, int level, const char *msg)
{
    (void)ud;
    if (level <= PGD_LOG_WARN && !getenv("PGD_TEST_QUIET"))
        fprintf(stderr, "  [pagoda %d] %s\n", level, msg);
}

static const uint8_t test_key[32] = "0123456789abcdef0123456789abcdef";

/* ---- tiers ---- */

/* Bytes a RAM tier needs per record of this geometry: header, page, bounds. */
static uint64_t record_bytes(void)
{
    uint64_t page = (uint64_t)NL * 2 * NH * PT * HD * sizeof(float);
    uint64_t bounds = (uint64_t)NL * NH * 2 * HD * sizeof(float);
    return PGD_RECORD_HEADER_BYTES + page + bounds;
}

static pgd_tier *ram_tier(uint64_t n_records)
{
    pgd_tier_ram_params p = pgd_tier_ram_default_params();
    p.capacity_bytes = n_records * record_bytes();
    p.log = log_stderr;
    pgd_tier *t = NULL;
    if (pgd_tier_ram_create(&p, &t) != PGD_OK) return NULL;
    return t;
}

/* A disk tier in dir (made by mkdtemp), room for n_records of this geometry. */
static pgd_tier *disk_tier(const char *dir, uint64_t n_records)
{
    pgd_tier_disk_params p = pgd_tier_disk_default_params();
    p.dir = dir;
    p.capacity_bytes = n_records * (record_bytes() + 4096); /* generous: any layout */
    p.log = log_stderr;
    pgd_tier *t = NULL;
    if (pgd_tier_disk_create(&p, &t) != PGD_OK) return NULL;
    return t;
}

/* A fault-injecting wrapper over a real tier: gets fail (the record dropped, as a damaged
 * one is) with probability 1 / fail_every, or for one chosen block; puts can be held. */
typedef struct faulty {
    pgd_tier *inner;
    uint32_t fail_every; /* 0: no random failures */
    atomic_uint_fast64_t n_calls;
    pgd_hash fail_block; /* {0, 0}: none */
    atomic_int n_failed;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int hold_puts;   /* puts wait while set */
    int n_puts_held; /* puts waiting now */
    int hold_gets;   /* gets wait while set */
    int n_gets_held; /* gets waiting now */
} faulty;

static int f_put(void *st, pgd_hash b, pgd_hash p, const void *page, const void *bounds,
                 pgd_tier_spill_fn spill, void *ud)
{
    faulty *f = st;
    pthread_mutex_lock(&f->mu);
    f->n_puts_held++;
    pthread_cond_broadcast(&f->cv);
    while (f->hold_puts)
        pthread_cond_wait(&f->cv, &f->mu);
    f->n_puts_held--;
    pthread_mutex_unlock(&f->mu);
    return pgd_tier_put(f->inner, b, p, page, bounds, spill, ud);
}
static int f_get(void *st, pgd_hash b, void *page, void *bounds)
{
    faulty *f = st;
    pthread_mutex_lock(&f->mu);
    f->n_gets_held++;
    pthread_cond_broadcast(&f->cv);
    while (f->hold_gets)
        pthread_cond_wait(&f->cv, &f->mu);
    f->n_gets_held--;
    pthread_mutex_unlock(&f->mu);
    uint64_t n = atomic_fetch_add(&f->n_calls, 1);
    int fail = (f->fail_every && t_mix(n + 0x9e37) % f->fail_every == 0) ||
               ((f->fail_block.lo || f->fail_block.hi) && pgd_hash_eq(b, f->fail_block));
    if (fail) {
        pgd_tier_del(f->inner, b); /* damaged: the tier drops it */
        atomic_fetch_add(&f->n_failed, 1);
        return PGD_ENOTFOUND;
    }
    return pgd_tier_get(f->inner, b, page, bounds);
}
static void f_close(void *st)
{
    faulty *f = st;
    pgd_tier_close(f->inner);
    pthread_cond_destroy(&f->cv);
    pthread_mutex_destroy(&f->mu);
    free(f);
}
static const pgd_tier_ops faulty_ops = {"faulty",
                                        t_tier_fwd_bind,
                                        f_put,
                                        f_get,
                                        t_tier_fwd_lookup,
                                        t_tier_fwd_del,
                                        t_tier_fwd_stats,
                                        t_tier_fwd_flush,
                                        f_close,
                                        NULL,
                                        NULL};

static pgd_tier *faulty_tier(pgd_tier *inner, uint32_t fail_every, faulty **state)
{
    faulty *f = calloc(1, sizeof *f);
    pgd_tier *t = NULL;
    if (!f || !inner) {
        free(f);
        pgd_tier_close(inner);
        return NULL;
    }
    f->inner = inner;
    f->fail_every = fail_every;
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    if (pgd_tier_wrap(&faulty_ops, f, &t) != PGD_OK) {
        f_close(f);
        return NULL;
    }
    if (state) *state = f;
    return t;
}

static void hold_puts(faulty *f, int on)
{
    pthread_mutex_lock(&f->mu);
    f->hold_puts = on;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

static void hold_gets(faulty *f, int on)
{
    pthread_mutex_lock(&f->mu);
    f->hold_gets = on;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

/* Waits until a get is held at the gate. */
static void wait_get_held(faulty *f)
{
    pthread_mutex_lock(&f->mu);
    while (f->n_gets_held == 0)
        pthread_cond_wait(&f->cv, &f->mu);
    pthread_mutex_unlock(&f->mu);
}

/* ---- caches and tagged pages ---- */

static pgd_cache_params params(uint32_t n_pages, const pgd_tier_use *tiers, uint32_t n_tiers)
{
    pgd_cache_params p = pgd_cache_default_params();
    p.pool.n_layers = NL;
    p.pool.n_kv_heads = NH;
    p.pool.head_dim = HD;
    p.pool.page_tokens = PT;
    p.pool.kv_type = PGD_KV_F32;
    p.pool.capacity_pages = n_pages;
    p.pool.key_bounds = 1;
    p.hash_key = test_key;
    p.hash_key_len = sizeof test_key;
    p.log = log_stderr;
    p.tiers = tiers;
    p.n_tiers = n_tiers;
    p.writeback_pages = 64;
    return p;
}

static pgd_cache *make_cache(uint32_t n_pages, const pgd_tier_use *tiers, uint32_t n_tiers)
{
    pgd_cache_params p = params(n_pages, tiers, n_tiers);
    pgd_cache *c = NULL;
    if (pgd_cache_create(&p, &c) != PGD_OK) return NULL;
    return c;
}

static uint8_t tag_byte(pgd_hash h, uint64_t i)
{
    return (uint8_t)(t_mix(h.lo ^ t_mix(h.hi + (i >> 3))) >> ((i & 7) * 8));
}

/* The page's payload and key bounds, as a function of its block hash. */
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

static void toks(int32_t *t, size_t n, int32_t base)
{
    for (size_t i = 0; i < n; i++)
        t[i] = base + (int32_t)i;
}

/* A sequence of salt "a" holding tokens t[0..n) (n a multiple of PT), every page tagged
 * and committed. Returns it (kept) or NULL. */
static pgd_seq *feed(pgd_cache *c, const int32_t *t, size_t n)
{
    pgd_seq *s = NULL;
    pgd_hash hs[64];
    size_t nh = pgd_cache_hash_tokens(c, "a", 1, t, n, hs, 64);
    if (pgd_seq_create(c, "a", 1, &s) != PGD_OK) return NULL;
    int64_t m = pgd_seq_match(c, s, t, n);
    if (m < 0 || pgd_seq_wait(c, s) != PGD_OK) goto fail;
    m = (int64_t)pgd_seq_length(c, s);
    if (pgd_seq_grow(c, s, n - (size_t)m) != PGD_OK) goto fail;
    for (size_t i = (size_t)m / PT; i < nh; i++) {
        uint32_t page, slot;
        if (pgd_seq_write_slot(c, s, i * PT, &page, &slot) != PGD_OK) goto fail;
        tag_page(c, page, hs[i]);
    }
    if (pgd_seq_commit(c, s, t + m, n - (size_t)m) < 0) goto fail;
    return s;
fail:
    pgd_seq_destroy(c, s);
    return NULL;
}

/* Matches t[0..n) for salt "a", waits, checks every page's tag; returns the length. */
static int64_t probe(pgd_cache *c, const int32_t *t, size_t n, pgd_match_info *info)
{
    pgd_seq *s = NULL;
    pgd_hash hs[64];
    pgd_cache_hash_tokens(c, "a", 1, t, n, hs, 64);
    int rc = pgd_seq_create(c, "a", 1, &s);
    if (rc != PGD_OK) return rc;
    int64_t m = pgd_seq_match(c, s, t, n);
    if (m >= 0) {
        pgd_seq_wait(c, s);
        if (info) pgd_seq_match_info(c, s, info);
        m = (int64_t)pgd_seq_length(c, s);
        const uint32_t *ids;
        pgd_seq_pages(c, s, &ids);
        for (int64_t i = 0; i < m / PT; i++)
            if (!page_tagged(c, ids[i], hs[i])) m = -1000 - i;
    }
    pgd_seq_destroy(c, s);
    return m;
}

static pgd_cache_tier_stats tstats(pgd_cache *c, uint32_t i)
{
    pgd_cache_tier_stats st;
    memset(&st, 0, sizeof st);
    pgd_cache_get_tier_stats(c, i, &st);
    return st;
}

static pgd_tier_stats tier_stats(pgd_tier *t)
{
    pgd_tier_stats st;
    memset(&st, 0, sizeof st);
    pgd_tier_get_stats(t, &st);
    return st;
}

/* ---- the movers (tier/mover.c) ---- */

typedef struct tjob {
    pgd__job job; /* first */
    pthread_mutex_t *mu;
    pthread_cond_t *cv;
    int *gate; /* the job waits while *gate is 0 */
    atomic_int *n_started, *n_done;
} tjob;

static void tjob_run(pgd__job *j)
{
    tjob *t = (tjob *)j;
    atomic_fetch_add(t->n_started, 1);
    pthread_mutex_lock(t->mu);
    while (!*t->gate)
        pthread_cond_wait(t->cv, t->mu);
    pthread_mutex_unlock(t->mu);
    atomic_fetch_add(t->n_done, 1);
}

/* A bounded FIFO (one class): a full queue refuses (EBUSY), depth counts queued + running,
 * drain waits for all, destroy runs what is queued. */
static int test_mover_queue(void)
{
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    int gate = 0;
    atomic_int n_started = 0, n_done = 0;
    pgd__alloc al;
    pgd__alloc_init(&al, NULL);
    pgd__log lg = {NULL, NULL};
    pgd__mover *m = NULL;
    T_EQ(pgd__mover_create(&al, &lg, 0, 4, 0, &m), PGD_EINVAL);
    T_EQ(pgd__mover_create(&al, &lg, 65, 4, 0, &m), PGD_EINVAL);
    T_EQ(pgd__mover_create(&al, &lg, 1, 0, 0, &m), PGD_EINVAL);
    T_OK(pgd__mover_create(&al, &lg, 1, 2, 0, &m));
    tjob jobs[4];
    for (int i = 0; i < 4; i++) {
        tjob t = {{NULL, tjob_run}, &mu, &cv, &gate, &n_started, &n_done};
        jobs[i] = t;
    }
    const int bg = PGD__JOB_BACKGROUND;
    T_EQ(pgd__mover_submit(m, NULL, bg), PGD_EINVAL);
    T_EQ(pgd__mover_submit(m, &jobs[0].job, 2), PGD_EINVAL);
    T_OK(pgd__mover_submit(m, &jobs[0].job, bg));
    while (atomic_load(&n_started) == 0) /* the one thread runs it, held at the gate */
        ;
    T_OK(pgd__mover_submit(m, &jobs[1].job, bg));
    T_OK(pgd__mover_submit(m, &jobs[2].job, bg));
    T_EQ(pgd__mover_submit(m, &jobs[3].job, bg), PGD_EBUSY); /* 2 queued: full */
    T_EQ(pgd__mover_depth(m), 3);
    pthread_mutex_lock(&mu);
    gate = 1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    pgd__mover_drain(m);
    T_EQ(pgd__mover_depth(m), 0);
    T_EQ(atomic_load(&n_done), 3);
    T_OK(pgd__mover_submit(m, &jobs[3].job, bg));
    pgd__mover_destroy(m); /* runs it, then joins */
    T_EQ(atomic_load(&n_done), 4);
    pgd__mover_destroy(NULL);
    pgd__mover_drain(NULL);
    return 0;
}

/* Two classes: fills run on their own threads while every background thread is busy (a
 * demotion storm never delays a fill); a chain is queued all or none; past help_depth
 * queued background jobs the fill threads run them too. */
static int test_mover_classes(void)
{
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    int gate = 0, open = 1;
    atomic_int n_started = 0, n_done = 0, n_free_started = 0, n_free_done = 0;
    pgd__alloc al;
    pgd__alloc_init(&al, NULL);
    pgd__log lg = {NULL, NULL};
    for (int help = 0; help < 2; help++) {
        pgd__mover *m = NULL;
        T_OK(pgd__mover_create(&al, &lg, 1, 8, help ? 2 : 0, &m));
        tjob held[2], freed[8];
        for (int i = 0; i < 2; i++) {
            tjob t = {{NULL, tjob_run}, &mu, &cv, &gate, &n_started, &n_done};
            held[i] = t;
        }
        for (int i = 0; i < 8; i++) {
            tjob t = {{NULL, tjob_run}, &mu, &cv, &open, &n_free_started, &n_free_done};
            freed[i] = t;
        }
        atomic_store(&n_started, 0);
        atomic_store(&n_free_done, 0);
        gate = 0;
        T_OK(pgd__mover_submit(m, &held[0].job, PGD__JOB_BACKGROUND));
        while (atomic_load(&n_started) == 0) /* the background thread is held */
            ;
        if (!help) {
            T_OK(pgd__mover_submit(m, &held[1].job, PGD__JOB_BACKGROUND)); /* waits */
            freed[0].job.next = &freed[1].job; /* a chain of two fills */
            T_OK(pgd__mover_submit(m, &freed[0].job, PGD__JOB_FILL));
            while (atomic_load(&n_free_done) < 2) /* run by the fill thread */
                ;
            for (int i = 0; i < 7; i++)
                freed[i].job.next = &freed[i + 1].job;
            freed[7].job.next = NULL;
            /* 1 queued + 8 > 8: refused whole, nothing queued. */
            T_EQ(pgd__mover_submit(m, &freed[0].job, PGD__JOB_FILL), PGD_EBUSY);
            while (pgd__mover_depth(m) != 2) /* the fill thread ends its last job */
                ;
        } else {
            freed[0].job.next = NULL;
            freed[1].job.next = NULL;
            T_OK(pgd__mover_submit(m, &freed[0].job, PGD__JOB_BACKGROUND));
            T_OK(pgd__mover_submit(m, &freed[1].job, PGD__JOB_BACKGROUND)); /* 2: help */
            while (atomic_load(&n_free_done) < 1) /* the fill thread runs one, then stops */
                ;
        }
        T_EQ(atomic_load(&n_done), 0);
        pthread_mutex_lock(&mu);
        gate = 1;
        pthread_cond_broadcast(&cv);
        pthread_mutex_unlock(&mu);
        pgd__mover_drain(m);
        T_EQ(pgd__mover_depth(m), 0);
        T_EQ(atomic_load(&n_done), help ? 1 : 2);
        T_EQ(atomic_load(&n_free_done), 2);
        atomic_store(&n_done, 0);
        pgd__mover_destroy(m);
    }
    return 0;
}

/* ---- focused tests ---- */

static int test_refused_params(void)
{
    pgd_tier *t = ram_tier(16);
    T_ASSERT(t);
    pgd_tier_use use[PGD_MAX_TIERS + 1];
    memset(use, 0, sizeof use);
    for (int i = 0; i <= PGD_MAX_TIERS; i++)
        use[i].tier = t;
    pgd_cache *c = (pgd_cache *)1;
    pgd_cache_params p = params(8, use, PGD_MAX_TIERS + 1);
    T_EQ(pgd_cache_create(&p, &c), PGD_EINVAL);
    T_ASSERT(c == NULL);
    p = params(8, NULL, 1);
    T_EQ(pgd_cache_create(&p, &c), PGD_EINVAL);
    pgd_tier_use none = {NULL, 0, 0};
    p = params(8, &none, 1);
    T_EQ(pgd_cache_create(&p, &c), PGD_EINVAL);
    p = params(8, use, 1);
    p.pool.metadata_only = 1;
    p.pool.key_bounds = 0;
    T_EQ(pgd_cache_create(&p, &c), PGD_EINVAL);
    p = params(8, use, 1);
    p.pool.arena_device = 1;
    T_EQ(pgd_cache_create(&p, &c), PGD_EINVAL);
    p = params(8, use, 1);
    p.tier_threads = 65;
    T_EQ(pgd_cache_create(&p, &c), PGD_EINVAL);
    /* The same tier bound to another identity by a second cache refuses it (EBUSY). */
    p = params(8, use, 1);
    T_OK(pgd_cache_create(&p, &c));
    T_EQ(pgd_cache_n_tiers(c), 1);
    T_ASSERT(pgd_cache_tier(c, 0) == t);
    T_ASSERT(pgd_cache_tier(c, 1) == NULL);
    pgd_cache_tier_stats ts;
    T_EQ(pgd_cache_get_tier_stats(c, 1, &ts), PGD_EINVAL);
    pgd_cache *c2 = NULL;
    pgd_cache_params p2 = params(8, use, 1);
    p2.model_fingerprint.lo = 42;
    T_EQ(pgd_cache_create(&p2, &c2), PGD_EBUSY);
    T_ASSERT(c2 == NULL);
    pgd_cache_destroy(c);
    /* Without tiers, the tier calls are inert. */
    p = params(8, NULL, 0);
    T_OK(pgd_cache_create(&p, &c));
    T_EQ(pgd_cache_n_tiers(c), 0);
    T_EQ(pgd_cache_prefetch(c, NULL, 0), 0);
    T_OK(pgd_cache_flush(c));
    pgd_cache_destroy(c);
    pgd_tier_close(t);
    return 0;
}

/* Evicted pages go to the tier once; a match promotes them back, byte for byte; evicting
 * them again writes nothing (the tier holds them). */
static int test_writeback_once_and_promote(void)
{
    pgd_tier *t = ram_tier(64);
    T_ASSERT(t);
    pgd_tier_use use = {t, 0, 0};
    pgd_cache *c = make_cache(8, &use, 1);
    T_ASSERT(c);
    int32_t tk[24];
    toks(tk, 24, 100);
    pgd_seq *s = feed(c, tk, 24);
    T_ASSERT(s);
    pgd_seq_destroy(c, s);
    T_EQ(pgd_cache_clear(c), 6);
    T_OK(pgd_cache_flush(c));
    pgd_cache_tier_stats ts = tstats(c, 0);
    T_EQ(ts.demoted_pages, 6);
    T_EQ(ts.demote_dropped, 0);
    T_EQ(ts.writeback_depth, 0);
    T_EQ(tier_stats(t).n_records, 6);
    pgd_match_info mi;
    T_EQ(probe(c, tk, 24, &mi), 24);
    T_EQ(mi.pool_tokens, 0);
    T_EQ(mi.tier_tokens[0], 24);
    T_EQ(mi.n_tiers, 1);
    ts = tstats(c, 0);
    T_EQ(ts.hit_pages, 6);
    T_EQ(ts.hit_tokens, 24);
    T_EQ(ts.promoted_pages, 6);
    T_EQ(ts.promoted_bytes, 6 * (record_bytes() - PGD_RECORD_HEADER_BYTES));
    /* Registered again: now the pool serves them. */
    T_EQ(probe(c, tk, 24, &mi), 24);
    T_EQ(mi.pool_tokens, 24);
    T_EQ(mi.tier_tokens[0], 0);
    T_EQ(pgd_cache_clear(c), 6);
    T_OK(pgd_cache_flush(c));
    T_EQ(tstats(c, 0).demoted_pages, 6); /* held below: not written again */
    T_EQ(tier_stats(t).n_puts, 6);
    /* A longer prompt: pool/tier prefix, then the tail is a miss. */
    int32_t tk2[32];
    toks(tk2, 32, 100);
    T_EQ(probe(c, tk2, 32, NULL), 24);
    T_EQ(tstats(c, 0).miss_pages, 2); /* page 6 of both probes */
    T_OK(pgd_cache_check(c));
    pgd_cache_destroy(c);
    pgd_tier_close(t);
    return 0;
}

/* The three match calls promote alike; the pool prefix and the tier run add up. */
static int test_match_kinds_and_mixed_prefix(void)
{
    pgd_tier *t = ram_tier(64);
    pgd_tier_use use = {t, 0, 0};
    pgd_cache *c = make_cache(8, &use, 1);
    T_ASSERT(c);
    int32_t tk[24];
    toks(tk, 24, 7);
    pgd_hash hs[6];
    T_EQ(pgd_cache_hash_tokens(c, "a", 1, tk, 24, hs, 6), 6);
    pgd_seq_destroy(c, feed(c, tk, 24));
    T_EQ(pgd_cache_evict(c, 4), 4); /* the leaves: pages 2..5 go below */
    T_OK(pgd_cache_flush(c));
    for (int kind = 0; kind < 3; kind++) {
        pgd_seq *s;
        T_OK(pgd_seq_create(c, "a", 1, &s));
        int64_t m = kind == 0   ? pgd_seq_match(c, s, tk, 24)
                    : kind == 1 ? pgd_seq_match_hashed(c, s, tk, 24, hs, 3)
                                : pgd_seq_match_hashes(c, s, hs, 6);
        T_EQ(m, kind == 2 ? 6 : 24);
        pgd_match_info mi;
        pgd_seq_match_info(c, s, &mi);
        T_EQ(mi.pool_tokens + mi.tier_tokens[0], 24);
        T_EQ(pgd_seq_length(c, s), 24);
        T_EQ(pgd_seq_n_committed(c, s), 24);
        T_OK(pgd_cache_check(c)); /* a pending promotion is consistent too */
        T_OK(pgd_seq_wait(c, s));
        T_EQ(pgd_seq_ready(c, s), 1);
        const uint32_t *ids;
        T_EQ(pgd_seq_pages(c, s, &ids), 6);
        for (int i = 0; i < 6; i++)
            T_ASSERT(page_tagged(c, ids[i], hs[i]));
        /* The sequence continues like a matched one. */
        T_OK(pgd_seq_grow(c, s, 3));
        if (kind == 2)
            T_EQ(pgd_seq_commit_hashes(c, s, NULL, 0), 0);
        else
            T_EQ(pgd_seq_commit(c, s, tk, 3), 0);
        T_OK(pgd_cache_check(c));
        pgd_seq_destroy(c, s);
        T_EQ(pgd_cache_evict(c, 4), 4);
        T_OK(pgd_cache_flush(c));
    }
    pgd_cache_destroy(c);
    pgd_tier_close(t);
    return 0;
}

/* A fill that fails cuts the sequence back to the pages before it; the engine computes
 * the rest, and commits them as usual. */
static int test_failed_fill_cuts_back(void)
{
    faulty *f = NULL;
    pgd_tier *t = faulty_tier(ram_tier(64), 0, &f);
    T_ASSERT(t);
    pgd_tier_use use = {t, 0, 0};
    pgd_cache *c = make_cache(8, &use, 1);
    T_ASSERT(c);
    int32_t tk[24];
    toks(tk, 24, 300);
    pgd_hash hs[6];
    pgd_cache_hash_tokens(c, "a", 1, tk, 24, hs, 6);
    pgd_seq_destroy(c, feed(c, tk, 24));
    T_EQ(pgd_cache_clear(c), 6);
    T_OK(pgd_cache_flush(c));
    f->fail_block = hs[3];
    pgd_seq *s;
    T_OK(pgd_seq_create(c, "a", 1, &s));
    T_EQ(pgd_seq_match(c, s, tk, 24), 24);
    while (!pgd_seq_ready(c, s))
        ;
    T_EQ(pgd_seq_length(c, s), 12);
    T_EQ(pgd_seq_n_committed(c, s), 12);
    pgd_match_info mi;
    pgd_seq_match_info(c, s, &mi);
    T_EQ(mi.tier_tokens[0], 12);
    T_EQ(tstats(c, 0).promote_failed, 1);
    T_EQ(tstats(c, 0).promoted_pages, 3);
    T_OK(pgd_cache_check(c));
    /* Compute pages 3..5 and commit them: the chain is whole again. */
    T_OK(pgd_seq_grow(c, s, 12));
    const uint32_t *ids;
    for (uint32_t i = 3; i < 6; i++) {
        uint32_t page, slot;
        T_OK(pgd_seq_write_slot(c, s, i * PT, &page, &slot));
        tag_page(c, page, hs[i]);
    }
    T_EQ(pgd_seq_commit(c, s, tk + 12, 12), 3);
    pgd_seq_pages(c, s, &ids);
    for (int i = 0; i < 6; i++)
        T_ASSERT(page_tagged(c, ids[i], hs[i]));
    T_OK(pgd_cache_check(c));
    pgd_seq_destroy(c, s);
    /* A failure at the first page: nothing promoted, the match is the pool's. */
    T_EQ(pgd_cache_clear(c), 6);
    T_OK(pgd_cache_flush(c));
    f->fail_block = hs[0];
    T_EQ(probe(c, tk, 24, &mi), 0);
    T_EQ(mi.tier_tokens[0], 0);
    T_OK(pgd_cache_check(c));
    pgd_cache_destroy(c);
    pgd_tier_close(t);
    return 0;
}

/* Write-through: at register with admit_hits 0, else at the admit_hits-th match. */
static int test_write_through(void)
{
    pgd_tier *t0 = ram_tier(64), *t1 = ram_tier(64);
    pgd_tier_use use[2] = {{t0, 1, 0}, {t1, 1, 2}};
    pgd_cache *c = make_cache(16, use, 2);
    T_ASSERT(c);
    int32_t tk[16];
    toks(tk, 16, 50);
    pgd_hash hs[4];
    pgd_cache_hash_tokens(c, "a", 1, tk, 16, hs, 4);
    pgd_seq_destroy(c, feed(c, tk, 16));
    T_OK(pgd_cache_flush(c));
    T_EQ(pgd_tier_lookup(t0, hs, 4), 4); /* at commit */
    T_EQ(pgd_tier_lookup(t1, hs, 4), 0);
    T_EQ(probe(c, tk, 8, NULL), 8); /* pages 0, 1: one hit each */
    T_OK(pgd_cache_flush(c));
    T_EQ(pgd_tier_lookup(t1, hs, 4), 0);
    T_EQ(probe(c, tk, 16, NULL), 16); /* pages 0, 1: second hit; 2, 3: first */
    T_OK(pgd_cache_flush(c));
    T_EQ(pgd_tier_lookup(t1, hs, 4), 2);
    T_EQ(probe(c, tk, 16, NULL), 16);
    T_EQ(probe(c, tk, 16, NULL), 16); /* a third hit writes nothing more */
    T_OK(pgd_cache_flush(c));
    T_EQ(pgd_tier_lookup(t1, hs, 4), 4);
    T_EQ(tstats(c, 0).demoted_pages, 4);
    T_EQ(tstats(c, 1).demoted_pages, 4);
    /* Evicted: every tier holds them, so write-back writes nothing. */
    T_EQ(pgd_cache_clear(c), 4);
    T_OK(pgd_cache_flush(c));
    T_EQ(tstats(c, 0).demoted_pages, 4);
    T_EQ(tier_stats(t0).n_puts, 4);
    T_EQ(probe(c, tk, 16, NULL), 16);
    T_OK(pgd_cache_check(c));
    pgd_cache_destroy(c);
    pgd_tier_close(t0);
    pgd_tier_close(t1);
    return 0;
}

/* Write-through admission counts a block's matches over its life: a match from the pool,
 * an eviction, then a promotion from tiers[0] make two, and the promotion admits it to the
 * write-through tier (a per-residency count would restart at the promotion). */
static int test_write_through_lifetime(void)
{
    pgd_tier *t0 = ram_tier(64), *t1 = ram_tier(64);
    pgd_tier_use use[2] = {{t0, 0, 0}, {t1, 1, 2}};
    pgd_cache *c = make_cache(16, use, 2);
    T_ASSERT(c);
    int32_t tk[16];
    toks(tk, 16, 77);
    pgd_hash hs[4];
    pgd_cache_hash_tokens(c, "a", 1, tk, 16, hs, 4);
    pgd_seq_destroy(c, feed(c, tk, 16));
    T_EQ(probe(c, tk, 16, NULL), 16); /* first hit of each block */
    T_EQ(pgd_cache_clear(c), 4);      /* write-back: into t0 */
    T_OK(pgd_cache_flush(c));
    T_EQ(pgd_tier_lookup(t0, hs, 4), 4);
    T_EQ(pgd_tier_lookup(t1, hs, 4), 0);
    pgd_match_info mi;
    T_EQ(probe(c, tk, 16, &mi), 16); /* promoted from t0: the second hit */
    T_EQ(mi.tier_tokens[0], 16);
    T_OK(pgd_cache_flush(c));
    T_EQ(pgd_tier_lookup(t1, hs, 4), 4); /* admitted at the promotion */
    T_EQ(tstats(c, 1).demoted_pages, 4);
    T_OK(pgd_cache_check(c));
    pgd_cache_destroy(c);
    pgd_tier_close(t0);
    pgd_tier_close(t1);
    return 0;
}

/* Park: every registered page no tier holds goes to tiers[0] now; the sequence stays. */
static int test_park(void)
{
    pgd_tier *t = ram_tier(64);
    pgd_tier_use use = {t, 0, 0};
    pgd_cache *c = make_cache(16, &use, 1);
    T_ASSERT(c);
    int32_t tk[18];
    toks(tk, 18, 900);
    pgd_hash hs[4];
    pgd_cache_hash_tokens(c, "a", 1, tk, 18, hs, 4);
    pgd_seq *s = feed(c, tk, 16);
    T_ASSERT(s);
    T_OK(pgd_seq_grow(c, s, 2)); /* a partial page: not registered, not parked */
    T_OK(pgd_seq_commit(c, s, tk + 16, 2));
    T_EQ(pgd_seq_park(c, s), 4);
    T_EQ(pgd_seq_length(c, s), 18);
    T_OK(pgd_cache_flush(c));
    T_EQ(pgd_tier_lookup(t, hs, 4), 4);
    T_EQ(tstats(c, 0).parked_pages, 4);
    T_EQ(pgd_seq_park(c, s), 0); /* held below now */
    pgd_seq_destroy(c, s);
    T_EQ(pgd_cache_clear(c), 4);
    T_OK(pgd_cache_flush(c));
    T_EQ(tier_stats(t).n_puts, 4);
    T_EQ(probe(c, tk, 16, NULL), 16);
    T_OK(pgd_cache_check(c));
    pgd_cache_destroy(c);
    pgd_tier_close(t);
    return 0;
}

/* Prefetch moves what a slower tier holds up into tiers[0]; pool blocks are skipped and
 * the chain stops at the first block nobody holds. */
static int test_prefetch(void)
{
    pgd_tier *t0 = ram_tier(64), *t1 = ram_tier(64);
    pgd_tier_use use[2] = {{t0, 0, 0}, {t1, 1, 0}};
    pgd_cache *c = make_cache(16, use, 2);
    T_ASSERT(c);
    int32_t tk[24];
    toks(tk, 24, 4000);
    pgd_hash hs[6];
    pgd_cache_hash_tokens(c, "a", 1, tk, 24, hs, 6);
    pgd_seq_destroy(c, feed(c, tk, 16)); /* pages 0..3, written through to t1 */
    T_OK(pgd_cache_flush(c));
    T_EQ(pgd_tier_lookup(t1, hs, 6), 4);
    T_EQ(pgd_tier_lookup(t0, hs, 6), 0);
    T_EQ(pgd_cache_evict(c, 2), 2); /* pages 2, 3 leave the pool: t1 holds them, and */
    T_OK(pgd_cache_flush(c));
    T_EQ(pgd_tier_lookup(t0, hs + 2, 2), 2); /* write-back still puts them in t0 (hot) */
    T_EQ(tstats(c, 1).demoted_pages, 4);     /* t1 was not written again */
    T_OK(pgd_tier_del(t0, hs[2]));           /* now only t1 holds them */
    T_OK(pgd_tier_del(t0, hs[3]));
    /* 0, 1 in the pool: skipped; 2, 3 from t1; 4 nobody: stop. */
    T_EQ(pgd_cache_prefetch(c, hs, 6), 2);
    T_OK(pgd_cache_flush(c));
    T_EQ(pgd_tier_lookup(t0, hs + 2, 2), 2);
    T_EQ(tstats(c, 0).prefetched_pages, 2);
    T_EQ(pgd_cache_prefetch(c, hs, 6), 0); /* t0 holds them now */
    pgd_match_info mi;
    T_EQ(probe(c, tk, 24, &mi), 16);
    T_EQ(mi.pool_tokens, 8);
    /* tiers[0] serves them, but the request's usage names where its prefetch found them
     * (pgd_match_info); the movement counters say where they were read. */
    T_EQ(mi.tier_tokens[0], 0);
    T_EQ(mi.tier_tokens[1], 8);
    T_EQ(tstats(c, 0).promoted_pages, 2);
    T_EQ(tstats(c, 1).promoted_pages, 0);
    T_OK(pgd_cache_check(c));
    pgd_cache_destroy(c);
    pgd_tier_close(t0);
    pgd_tier_close(t1);
    return 0;
}

/* A run long enough for several fill jobs (two threads, 24 pages each): every page is
 * filled by its job; a failure in either job cuts the sequence back to the first failed
 * page, and the stats count as one job stopping there would (pages read past it by the
 * other job are not counted). */
static int test_split_fill_cuts_back(void)
{
    enum { NP = 48 };
    for (int fail = -1; fail < NP; fail += 17) { /* none, 16 (job 0), 33 (job 1) */
        faulty *f = NULL;
        pgd_tier *t = faulty_tier(ram_tier(64), 0, &f);
        T_ASSERT(t);
        pgd_tier_use use = {t, 0, 0};
        pgd_cache_params p = params(NP + 8, &use, 1);
        p.tier_threads = 2;
        pgd_cache *c = NULL;
        T_OK(pgd_cache_create(&p, &c));
        int32_t tk[NP * PT];
        toks(tk, NP * PT, 4242);
        pgd_hash hs[NP];
        pgd_cache_hash_tokens(c, "a", 1, tk, NP * PT, hs, NP);
        pgd_seq_destroy(c, feed(c, tk, NP * PT));
        T_EQ(pgd_cache_clear(c), NP);
        T_OK(pgd_cache_flush(c));
        if (fail >= 0) f->fail_block = hs[fail];
        uint32_t want = fail >= 0 ? (uint32_t)fail : NP;
        pgd_seq *s;
        T_OK(pgd_seq_create(c, "a", 1, &s));
        T_EQ(pgd_seq_match(c, s, tk, NP * PT), NP * PT);
        T_OK(pgd_cache_check(c)); /* with the jobs in flight */
        T_OK(pgd_seq_wait(c, s));
        T_EQ(pgd_seq_length(c, s), want * PT);
        T_EQ(tstats(c, 0).promoted_pages, want);
        T_EQ(tstats(c, 0).promote_failed, fail >= 0 ? 1 : 0);
        const uint32_t *ids;
        T_EQ(pgd_seq_pages(c, s, &ids), want);
        for (uint32_t i = 0; i < want; i++)
            T_ASSERT(page_tagged(c, ids[i], hs[i]));
        T_OK(pgd_cache_check(c));
        pgd_seq_destroy(c, s);
        T_OK(pgd_cache_check(c));
        pgd_cache_destroy(c);
        pgd_tier_close(t);
    }
    return 0;
}

/* The write-back slab bounds the copies: a full slab drops an evicted page (counted) and
 * never waits. */
static int test_slab_full_drops(void)
{
    faulty *f = NULL;
    pgd_tier *t = faulty_tier(ram_tier(64), 0, &f);
    T_ASSERT(t);
    pgd_tier_use use = {t, 0, 0};
    pgd_cache_params p = params(16, &use, 1);
    p.writeback_pages = 2;
    p.tier_threads = 1;
    pgd_cache *c = NULL;
    T_OK(pgd_cache_create(&p, &c));
    int32_t tk[24];
    toks(tk, 24, 1234);
    pgd_seq_destroy(c, feed(c, tk, 24));
    hold_puts(f, 1);
    T_EQ(pgd_cache_evict(c, 1), 1);
    pthread_mutex_lock(&f->mu); /* the one mover is in the first put, holding a slot */
    while (f->n_puts_held == 0)
        pthread_cond_wait(&f->cv, &f->mu);
    pthread_mutex_unlock(&f->mu);
    T_EQ(pgd_cache_evict(c, 5), 5); /* one more fits in the slab, four are dropped */
    pgd_cache_tier_stats ts = tstats(c, 0);
    T_EQ(ts.writeback_depth, 2);
    T_EQ(ts.demote_dropped, 4);
    T_OK(pgd_cache_check(c));
    hold_puts(f, 0);
    T_OK(pgd_cache_flush(c));
    ts = tstats(c, 0);
    T_EQ(ts.demoted_pages, 2);
    T_EQ(ts.writeback_depth, 0);
    T_EQ(tier_stats(t).n_records, 2);
    pgd_cache_destroy(c);
    pgd_tier_close(t);
    return 0;
}

/* A tier that evicts to make room spills to the next one; a match finds the blocks there. */
static int test_spill_to_next_tier(void)
{
    pgd_tier *t0 = ram_tier(2), *t1 = ram_tier(64);
    pgd_tier_use use[2] = {{t0, 0, 0}, {t1, 0, 0}};
    pgd_cache *c = make_cache(8, use, 2);
    T_ASSERT(c);
    int32_t tk[24];
    toks(tk, 24, 77);
    pgd_seq_destroy(c, feed(c, tk, 24));
    T_EQ(pgd_cache_clear(c), 6);
    T_OK(pgd_cache_flush(c));
    T_ASSERT(tier_stats(t0).n_records <= 2);
    T_EQ(tier_stats(t0).n_records + tier_stats(t1).n_records, 6);
    T_EQ(tstats(c, 1).demoted_pages, 6 - tier_stats(t0).n_records);
    pgd_match_info mi;
    T_EQ(probe(c, tk, 24, &mi), 24);
    T_EQ(mi.tier_tokens[0] + mi.tier_tokens[1], 24);
    T_ASSERT(mi.tier_tokens[1] >= 16);
    T_OK(pgd_cache_check(c));
    pgd_cache_destroy(c);
    pgd_tier_close(t0);
    pgd_tier_close(t1);
    return 0;
}

/* RAM over disk: what was written back reaches the disk (spilled from RAM, or parked
 * to it), and a new cache on the same directory (same hash key, same model) promotes it
 * from disk after a restart, byte for byte; another model's cache matches nothing. */
static int test_disk_restart(void)
{
    char dir[] = "/tmp/pgd_cache_tiers_XXXXXX";
    T_ASSERT(mkdtemp(dir));
    int32_t tk[32];
    toks(tk, 32, 777);
    uint8_t key[32];
    for (int run = 0; run < 3; run++) {
        pgd_tier *ram = ram_tier(2), *disk = disk_tier(dir, 256);
        T_ASSERT(ram && disk);
        T_OK(pgd_tier_disk_key(disk, key));
        pgd_tier_use use[2] = {{ram, 0, 0}, {disk, 1, 0}};
        pgd_cache_params p = params(16, use, 2);
        p.hash_key = key; /* the directory's stable key: hashes match after a restart */
        p.hash_key_len = sizeof key;
        if (run == 2) p.model_fingerprint.lo = 99; /* another model */
        pgd_cache *c = NULL;
        T_OK(pgd_cache_create(&p, &c));
        pgd_match_info mi;
        if (run == 0) {
            /* Written through to disk at commit; evicted to RAM, which spills. */
            pgd_seq_destroy(c, feed(c, tk, 32));
            T_EQ(pgd_cache_clear(c), 8);
            T_OK(pgd_cache_flush(c));
            T_EQ(tier_stats(disk).n_records, 8);
        } else if (run == 1) {
            T_EQ(probe(c, tk, 32, &mi), 32); /* from disk: the RAM tier is new */
            T_EQ(mi.pool_tokens, 0);
            T_EQ(mi.tier_tokens[1], 32);
            T_EQ(tstats(c, 1).promoted_pages, 8);
        } else {
            T_EQ(probe(c, tk, 32, &mi), 0); /* the records are another model's */
            T_EQ(tier_stats(disk).n_records, 0);
        }
        T_OK(pgd_cache_check(c));
        pgd_cache_destroy(c);
        pgd_tier_close(ram);
        pgd_tier_close(disk);
    }
    t_rm_rf(dir);
    return 0;
}

/* Every call that mutates a sequence waits for its promotion first: with the fill held
 * at the tier, the call does not return; released, it returns on a settled sequence. */
enum {
    OP_GROW,
    OP_TRUNCATE,
    OP_COMMIT,
    OP_COMMIT_HASHES,
    OP_WRITE_KV,
    OP_WRITE_SLOT,
    OP_FORK,
    OP_PARK,
    OP_WAIT,
    OP_DESTROY,
    N_OPS
};

typedef struct op_call {
    pgd_cache *c;
    pgd_seq *s, *fork;
    int op;
    atomic_int done;
    int rc;
} op_call;

static void *op_thread(void *arg)
{
    op_call *o = arg;
    static const float kv[NH * HD];
    uint32_t page, slot;
    switch (o->op) {
    case OP_GROW:
        o->rc = pgd_seq_grow(o->c, o->s, 1);
        break;
    case OP_TRUNCATE:
        o->rc = pgd_seq_truncate(o->c, o->s, 24);
        break;
    case OP_COMMIT:
        o->rc = pgd_seq_commit(o->c, o->s, NULL, 0);
        break;
    case OP_COMMIT_HASHES:
        o->rc = pgd_seq_commit_hashes(o->c, o->s, NULL, 0);
        break;
    case OP_WRITE_KV:
        o->rc = pgd_seq_write_kv(o->c, o->s, 24, 0, 0, kv, kv);
        break;
    case OP_WRITE_SLOT:
        o->rc = pgd_seq_write_slot(o->c, o->s, 24, &page, &slot);
        break;
    case OP_FORK:
        o->rc = pgd_seq_fork(o->c, o->s, &o->fork);
        break;
    case OP_PARK:
        o->rc = pgd_seq_park(o->c, o->s);
        break;
    case OP_WAIT:
        o->rc = pgd_seq_wait(o->c, o->s);
        break;
    default:
        pgd_seq_destroy(o->c, o->s);
        o->rc = 0;
        break;
    }
    atomic_store(&o->done, 1);
    return NULL;
}

static int test_calls_wait_for_promotion(void)
{
    faulty *f = NULL;
    pgd_tier *t = faulty_tier(ram_tier(64), 0, &f);
    T_ASSERT(t);
    pgd_tier_use use = {t, 0, 0};
    pgd_cache *c = make_cache(16, &use, 1);
    T_ASSERT(c);
    int32_t tk[24];
    toks(tk, 24, 6000);
    pgd_hash hs[6];
    pgd_cache_hash_tokens(c, "a", 1, tk, 24, hs, 6);
    pgd_seq_destroy(c, feed(c, tk, 24));
    for (int op = 0; op < N_OPS; op++) {
        T_EQ(pgd_cache_clear(c), 6);
        T_OK(pgd_cache_flush(c));
        op_call o;
        memset(&o, 0, sizeof o);
        o.c = c;
        o.op = op;
        T_OK(pgd_seq_create(c, "a", 1, &o.s));
        hold_gets(f, 1);
        if (op == OP_COMMIT_HASHES)
            T_EQ(pgd_seq_match_hashes(c, o.s, hs, 6), 6);
        else
            T_EQ(pgd_seq_match(c, o.s, tk, 24), 24);
        wait_get_held(f);
        T_EQ(pgd_seq_ready(c, o.s), 0);
        pthread_t th;
        T_ASSERT(pthread_create(&th, NULL, op_thread, &o) == 0);
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
        if (atomic_load(&o.done)) T_FAIL("op %d returned before the fill was done", op);
        T_OK(pgd_cache_check(c)); /* the lock is free while it waits */
        hold_gets(f, 0);
        pthread_join(th, NULL);
        if (op == OP_WRITE_SLOT)
            T_EQ(o.rc, PGD_EINVAL); /* position 24 is the length: refused, after the wait */
        else if (o.rc < 0)
            T_FAIL("op %d: %d", op, o.rc);
        if (op != OP_DESTROY) {
            T_EQ(pgd_seq_ready(c, o.s), 1);
            T_EQ(pgd_seq_n_committed(c, o.s), 24);
            const uint32_t *ids;
            pgd_seq_pages(c, o.s, &ids);
            for (int i = 0; i < 6; i++)
                T_ASSERT(page_tagged(c, ids[i], hs[i]));
            if (o.fork) {
                T_EQ(pgd_seq_length(c, o.fork), 24);
                pgd_seq_destroy(c, o.fork);
            }
            pgd_seq_destroy(c, o.s);
        }
        T_OK(pgd_cache_check(c));
    }
    pgd_cache_destroy(c);
    pgd_tier_close(t);
    return 0;
}

/* Destroying a cache, or a sequence, while fills and puts run waits for them. */
static int test_destroy_while_moving(void)
{
    for (int round = 0; round < 20; round++) {
        pgd_tier *t = ram_tier(64);
        pgd_tier_use use = {t, 0, 0};
        pgd_cache *c = make_cache(12, &use, 1);
        T_ASSERT(c);
        int32_t tk[40];
        toks(tk, 40, 5000 + round);
        pgd_seq_destroy(c, feed(c, tk, 40));
        T_EQ(pgd_cache_clear(c), 10);
        pgd_cache_flush(c);
        pgd_seq *s;
        T_OK(pgd_seq_create(c, "a", 1, &s));
        T_EQ(pgd_seq_match(c, s, tk, 40), 40);
        if (round & 1) pgd_seq_destroy(c, s); /* else the cache destroys it */
        /* Destroyed: it waited, registered and released the pages; else they are held. */
        T_EQ(pgd_cache_clear(c), (round & 1) ? 10 : 0);
        pgd_cache_destroy(c);
        pgd_tier_close(t);
    }
    return 0;
}

/* ---- allocation failures ---- */

/* Create with tiers fails cleanly at every allocation of the counting allocator
 * (tests/t_alloc.h; only the test thread and the cache under its lock allocate through it:
 * the movers allocate nothing); a match whose promotion cannot allocate returns the pool
 * prefix, consistent, and leaks nothing. */
static int test_alloc_failures(void)
{
    t_counting a = {0};
    const pgd_allocator al = T_COUNTING_ALLOCATOR(&a);
    pgd_tier *t = ram_tier(64);
    pgd_tier_use use = {t, 1, 1};
    pgd_cache *c = NULL;
    for (long n = 1;; n++) {
        pgd_cache_params p = params(8, &use, 1);
        p.alloc = &al;
        t_counting_arm(&a, n);
        int rc = pgd_cache_create(&p, &c);
        if (rc == PGD_OK && !a.fired) break;
        T_EQ(rc, PGD_ENOMEM);
        T_ASSERT(c == NULL);
        T_EQ(a.n_live, 0);
    }
    t_counting_arm(&a, 0);
    int32_t tk[24];
    toks(tk, 24, 8000);
    pgd_seq_destroy(c, feed(c, tk, 24));
    T_EQ(pgd_cache_clear(c), 6);
    T_OK(pgd_cache_flush(c));
    long live = a.n_live;
    for (long n = 1;; n++) {
        pgd_seq *s;
        T_OK(pgd_seq_create(c, "a", 1, &s));
        t_counting_arm(&a, n);
        int64_t m = pgd_seq_match(c, s, tk, 24);
        int fired = a.fired;
        t_counting_arm(&a, 0);
        /* ENOMEM: the table (nothing changed); else the promotion is skipped. */
        if (!(m == 24 || (fired && (m >= 0 || m == PGD_ENOMEM))))
            T_FAIL("failing allocation %ld: match %lld", n, (long long)m);
        T_OK(pgd_seq_wait(c, s));
        T_OK(pgd_cache_check(c));
        pgd_seq_destroy(c, s);
        T_EQ(pgd_cache_clear(c), m > 0 ? m / PT : 0);
        T_OK(pgd_cache_flush(c));
        if (!fired) break;
    }
    T_ASSERT(a.n_live <= live + 2); /* the match scan arrays, kept for the next match */
    pgd_cache_destroy(c);
    T_EQ(a.n_live, 0);
    pgd_tier_close(t);
    return 0;
}

/* ---- the model-based test ---- */

enum { MAXP = 8, MAXLIVE = 3, MAXW = 4096, NBASE = 4 };

typedef struct cfg {
    const char *name;
    uint32_t n_pages;     /* pool */
    uint64_t t0_records;  /* tiers[0] capacity */
    uint64_t t1_records;  /* tiers[1] capacity, 0: one tier */
    uint32_t fail_every;  /* tiers[0] gets fail 1 in fail_every (0: never) */
    int roomy;            /* the tiers hold every block: nothing may be lost */
    int t0_write_through; /* write-through on tiers[0] */
    uint32_t t0_admit;    /* its admit_hits */
    int t1_disk;          /* tiers[1] is a disk tier (in a mkdtemp directory) */
} cfg;

typedef struct live {
    pgd_seq *s;
    int salt;
    uint32_t n_tok;
    int32_t t[MAXP * PT];
} live;

typedef struct model {
    const cfg *cf;
    pgd_cache *c;
    pgd_tier *tier[2];
    faulty *fault;
    uint64_t rng;
    live lv[MAXLIVE];
    uint32_t n_live;
    int32_t base[NBASE][MAXP * PT];
    pgd_hash written[MAXW]; /* every block committed (its tag is a function of the hash) */
    uint32_t n_written;
    pgd_hash evicted[MAXW]; /* blocks the pool evicted (on_evict) */
    uint32_t n_evicted;
    int32_t prompts[64][MAXP * PT]; /* committed prompts of salt 0 (probe-all replays them) */
    uint32_t prompt_len[64], n_prompts;
    int verbose;
} model;

static const char *salt_name(int salt)
{
    return salt ? "b" : "a";
}

static uint32_t rnd(model *m, uint32_t n)
{
    return (uint32_t)(t_rand(&m->rng) % n);
}

static int was_written(const model *m, pgd_hash h)
{
    for (uint32_t i = 0; i < m->n_written; i++)
        if (pgd_hash_eq(m->written[i], h)) return 1;
    return 0;
}

static void on_evict(void *ud, pgd_hash h, uint32_t page)
{
    model *m = ud;
    (void)page;
    if (m->n_evicted < MAXW) m->evicted[m->n_evicted++] = h;
}

/* A prompt: a prefix of a base prompt, then fresh tokens. */
static uint32_t make_prompt(model *m, int32_t *t)
{
    uint32_t n = 1 + rnd(m, MAXP * PT);
    uint32_t shared = rnd(m, n + 1);
    const int32_t *b = m->base[rnd(m, NBASE)];
    for (uint32_t i = 0; i < n; i++)
        t[i] = i < shared ? b[i] : (int32_t)(t_rand(&m->rng) & 0xffffff);
    return n;
}

/* Checks s after its promotion settled: lengths, and each full page tagged with its hash,
 * a hash that was written. */
static int check_seq(model *m, live *q, const pgd_hash *hs, uint32_t n_hs)
{
    uint64_t len = pgd_seq_length(m->c, q->s);
    T_EQ(len, pgd_seq_n_committed(m->c, q->s));
    T_EQ(len % PT, 0);
    T_ASSERT(len / PT <= n_hs);
    const uint32_t *ids;
    T_EQ(pgd_seq_pages(m->c, q->s, &ids), len / PT);
    for (uint32_t i = 0; i < len / PT; i++) {
        if (!was_written(m, hs[i])) T_FAIL("page %u served a block never written", i);
        if (!page_tagged(m->c, ids[i], hs[i])) T_FAIL("page %u holds another block's bytes", i);
    }
    return 0;
}

static void remember_prompt(model *m, const live *q)
{
    if (q->salt != 0 || q->n_tok < PT) return;
    uint32_t i = m->n_prompts < 64 ? m->n_prompts++ : rnd(m, 64);
    memcpy(m->prompts[i], q->t, q->n_tok * sizeof *q->t);
    m->prompt_len[i] = q->n_tok;
}

static int op_request(model *m)
{
    if (m->n_live == MAXLIVE) return 0;
    live *q = &m->lv[m->n_live];
    q->salt = (int)rnd(m, 2);
    q->n_tok = make_prompt(m, q->t);
    const char *salt = salt_name(q->salt);
    pgd_hash hs[MAXP];
    uint32_t n_hs = (uint32_t)pgd_cache_hash_tokens(m->c, salt, 1, q->t, q->n_tok, hs, MAXP);
    T_OK(pgd_seq_create(m->c, salt, 1, &q->s));
    int kind = (int)rnd(m, 3);
    int64_t r;
    if (kind == 0)
        r = pgd_seq_match(m->c, q->s, q->t, q->n_tok);
    else if (kind == 1)
        r = pgd_seq_match_hashed(m->c, q->s, q->t, q->n_tok, hs, rnd(m, n_hs + 1));
    else
        r = pgd_seq_match_hashes(m->c, q->s, hs, n_hs);
    T_OK(r);
    T_OK(pgd_cache_check(m->c));
    if (rnd(m, 2)) {
        while (!pgd_seq_ready(m->c, q->s))
            ;
    } else {
        T_OK(pgd_seq_wait(m->c, q->s));
    }
    T_OK(pgd_cache_check(m->c));
    if (check_seq(m, q, hs, n_hs)) return 1;
    /* Compute the rest: grow, tag the full pages, commit. */
    uint64_t have = pgd_seq_length(m->c, q->s);
    uint32_t n_new = kind == 2 ? n_hs * PT - (uint32_t)have : q->n_tok - (uint32_t)have;
    int rc = pgd_seq_grow(m->c, q->s, n_new);
    if (rc == PGD_ENOSPC) {
        pgd_seq_destroy(m->c, q->s);
        return 0;
    }
    T_OK(rc);
    for (uint32_t i = (uint32_t)have / PT; i < n_hs; i++) {
        uint32_t page, slot;
        rc = pgd_seq_write_slot(m->c, q->s, (uint64_t)i * PT, &page, &slot);
        if (rc == PGD_ENOSPC) { /* no page for a copy-on-write */
            pgd_seq_destroy(m->c, q->s);
            return 0;
        }
        T_OK(rc);
        tag_page(m->c, page, hs[i]);
    }
    if (kind == 2)
        T_OK(pgd_seq_commit_hashes(m->c, q->s, hs + have / PT, n_hs - have / PT));
    else if (kind == 1)
        T_OK(pgd_seq_commit_hashed(m->c, q->s, q->t + have, n_new, hs, rnd(m, n_hs + 1)));
    else
        T_OK(pgd_seq_commit(m->c, q->s, q->t + have, n_new));
    for (uint32_t i = 0; i < n_hs; i++)
        if (!was_written(m, hs[i]) && m->n_written < MAXW) m->written[m->n_written++] = hs[i];
    remember_prompt(m, q);
    if (rnd(m, 3) == 0)
        pgd_seq_destroy(m->c, q->s);
    else
        m->n_live++;
    return 0;
}

static void drop_live(model *m, uint32_t i)
{
    pgd_seq_destroy(m->c, m->lv[i].s);
    m->lv[i] = m->lv[--m->n_live];
}

/* Roomy tiers: every block the pool evicted is held by a tier (nothing was dropped). */
static int check_nothing_lost(model *m)
{
    if (!m->cf->roomy) return 0;
    T_OK(pgd_cache_flush(m->c));
    for (uint32_t t = 0; t < pgd_cache_n_tiers(m->c); t++)
        T_EQ(tstats(m->c, t).demote_dropped, 0);
    for (uint32_t i = 0; i < m->n_evicted; i++) {
        int held = 0;
        for (uint32_t t = 0; t < pgd_cache_n_tiers(m->c) && !held; t++)
            held = pgd_tier_lookup(m->tier[t], &m->evicted[i], 1) == 1;
        if (!held) T_FAIL("evicted block %u of %u is in no tier", i, m->n_evicted);
    }
    return 0;
}

/* Roomy tiers, nothing live: a committed prompt matches all its full pages again. */
static int op_probe_all(model *m)
{
    while (m->n_live)
        drop_live(m, m->n_live - 1);
    if (check_nothing_lost(m)) return 1;
    if (!m->n_prompts) return 0;
    uint32_t i = rnd(m, m->n_prompts);
    pgd_hash hs[MAXP];
    uint32_t n_hs =
        (uint32_t)pgd_cache_hash_tokens(m->c, "a", 1, m->prompts[i], m->prompt_len[i], hs, MAXP);
    uint64_t failed_before = 0, failed_after = 0;
    for (uint32_t t = 0; t < pgd_cache_n_tiers(m->c); t++)
        failed_before += tstats(m->c, t).promote_failed;
    int64_t r = probe(m->c, m->prompts[i], m->prompt_len[i], NULL);
    T_OK(r);
    for (uint32_t t = 0; t < pgd_cache_n_tiers(m->c); t++)
        failed_after += tstats(m->c, t).promote_failed;
    /* Every block is held somewhere, and the pool has room: the whole prompt matches,
     * unless a fill raced a record on its way down between two tiers (a spill: counted
     * as a failed fill, and the sequence cut back). */
    if (m->cf->roomy && n_hs <= m->cf->n_pages && failed_after == failed_before) T_EQ(r, n_hs * PT);
    return 0;
}

static int op_prefetch(model *m)
{
    if (!m->n_prompts) return 0;
    uint32_t i = rnd(m, m->n_prompts);
    pgd_hash hs[MAXP];
    uint32_t n_hs =
        (uint32_t)pgd_cache_hash_tokens(m->c, "a", 1, m->prompts[i], m->prompt_len[i], hs, MAXP);
    int r = pgd_cache_prefetch(m->c, hs, n_hs);
    T_OK(r);
    T_ASSERT((uint32_t)r <= n_hs);
    if (m->cf->t1_records == 0) T_EQ(r, 0);
    return 0;
}

static int model_step(model *m)
{
    uint32_t r = rnd(m, 100);
    if (r < 45) return op_request(m);
    if (r < 60) {
        if (m->n_live) drop_live(m, rnd(m, m->n_live));
        return 0;
    }
    if (r < 72) {
        pgd_cache_evict(m->c, 1 + rnd(m, 4));
        return 0;
    }
    if (r < 75) {
        pgd_cache_clear(m->c);
        return 0;
    }
    if (r < 82) {
        if (m->n_live) T_OK(pgd_seq_park(m->c, m->lv[rnd(m, m->n_live)].s));
        return 0;
    }
    if (r < 88) return op_prefetch(m);
    if (r < 93) return check_nothing_lost(m);
    return op_probe_all(m);
}

static int run_model(const cfg *cf, uint64_t seed, uint32_t steps, int verbose)
{
    model *m = calloc(1, sizeof *m);
    T_ASSERT(m);
    m->cf = cf;
    m->rng = seed * 0x9e3779b97f4a7c15ull + 1;
    m->verbose = verbose;
    for (int b = 0; b < NBASE; b++)
        for (int i = 0; i < MAXP * PT; i++)
            m->base[b][i] = (int32_t)(t_rand(&m->rng) & 0xffff);
    m->tier[0] = ram_tier(cf->t0_records);
    if (cf->fail_every) m->tier[0] = faulty_tier(m->tier[0], cf->fail_every, &m->fault);
    char dir[] = "/tmp/pgd_cache_tiers_XXXXXX";
    if (cf->t1_disk) {
        T_ASSERT(mkdtemp(dir));
        m->tier[1] = disk_tier(dir, cf->t1_records);
        T_ASSERT(m->tier[1]);
    } else if (cf->t1_records) {
        m->tier[1] = ram_tier(cf->t1_records);
    }
    pgd_tier_use use[2] = {{m->tier[0], cf->t0_write_through, cf->t0_admit}, {m->tier[1], 0, 0}};
    pgd_cache_params p = params(cf->n_pages, use, cf->t1_records ? 2 : 1);
    p.on_evict = on_evict;
    p.event_ud = m;
    p.tier_threads = 1 + (uint32_t)(seed % 3);
    /* More slots than a run evicts pages: no demotion is dropped, however late the movers
     * run on a loaded machine. */
    if (cf->roomy) p.writeback_pages = 8192;
    int rc = pgd_cache_create(&p, &m->c);
    if (rc != PGD_OK) T_FAIL("%s: create: %d", cf->name, rc);
    int failed = 0;
    for (uint32_t step = 0; step < steps && !failed; step++) {
        failed = model_step(m);
        if (!failed && pgd_cache_check(m->c) != PGD_OK) failed = 1;
        if (failed)
            fprintf(stderr, "%s: seed %llu failed at step %u\n", cf->name, (unsigned long long)seed,
                    step);
    }
    if (!failed) failed = check_nothing_lost(m);
    if (verbose && !failed) {
        for (uint32_t t = 0; t < pgd_cache_n_tiers(m->c); t++) {
            pgd_cache_tier_stats ts = tstats(m->c, t);
            printf("  %s seed %llu tier %u: hit %llu promoted %llu failed %llu demoted %llu "
                   "dropped %llu prefetched %llu parked %llu\n",
                   cf->name, (unsigned long long)seed, t, (unsigned long long)ts.hit_pages,
                   (unsigned long long)ts.promoted_pages, (unsigned long long)ts.promote_failed,
                   (unsigned long long)ts.demoted_pages, (unsigned long long)ts.demote_dropped,
                   (unsigned long long)ts.prefetched_pages, (unsigned long long)ts.parked_pages);
        }
    }
    while (m->n_live)
        drop_live(m, m->n_live - 1);
    pgd_cache_destroy(m->c);
    pgd_tier_close(m->tier[0]);
    pgd_tier_close(m->tier[1]);
    if (cf->t1_disk) t_rm_rf(dir);
    free(m);
    return failed;
}

static const cfg cfgs[] = {
    {"roomy ram", 12, 4096, 0, 0, 1, 0, 0, 0},
    {"small ram over roomy ram", 12, 6, 4096, 0, 1, 0, 0, 0},
    {"small ram over roomy disk", 12, 6, 4096, 0, 1, 0, 0, 1},
    {"small ram over small disk", 10, 4, 12, 0, 0, 0, 0, 1},
    {"write-through ram, admit 2", 16, 4096, 0, 0, 1, 1, 2, 0},
    {"small tiers", 10, 5, 9, 0, 0, 0, 0, 0},
    {"failing gets", 12, 4096, 0, 4, 0, 0, 0, 0},
};

static int test_model(void)
{
    const char *one = getenv("PGD_TEST_SEED");
    int lng = getenv("PGD_TEST_LONG") != NULL;
    uint32_t seeds = lng ? 40 : 6, steps = lng ? 4000 : 600;
    for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; k++) {
        if (one) {
            if (run_model(&cfgs[k], strtoull(one, NULL, 10), steps, 1)) return 1;
            continue;
        }
        /* The disk configurations flush (fsync) often: fewer seeds. */
        for (uint64_t seed = 1; seed <= (cfgs[k].t1_disk ? (seeds + 5) / 6 : seeds); seed++)
            if (run_model(&cfgs[k], seed, steps, 0)) return 1;
    }
    return 0;
}

int main(void)
{
    T_RUN(test_mover_queue);
    T_RUN(test_mover_classes);
    T_RUN(test_refused_params);
    T_RUN(test_writeback_once_and_promote);
    T_RUN(test_match_kinds_and_mixed_prefix);
    T_RUN(test_failed_fill_cuts_back);
    T_RUN(test_split_fill_cuts_back);
    T_RUN(test_write_through);
    T_RUN(test_write_through_lifetime);
    T_RUN(test_park);
    T_RUN(test_prefetch);
    T_RUN(test_slab_full_drops);
    T_RUN(test_spill_to_next_tier);
    T_RUN(test_destroy_while_moving);
    T_RUN(test_calls_wait_for_promotion);
    T_RUN(test_disk_restart);
    T_RUN(test_alloc_failures);
    T_RUN(test_model);
    T_DONE();
}
