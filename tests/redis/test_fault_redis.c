/* SPDX-License-Identifier: MIT */
/*
 * test_fault_redis.c - the Redis tier (tier_redis.h) when Redis fails or lies, against
 * real redis-server processes (tests/t_redis.h). Skips (77) without redis-server.
 *
 *   kill -9 during a load of puts and gets (two threads, a bounded count): no crash,
 *     every call returns fast (< 100 ms), n_nodes_up drops to 0, one log line; a restart
 *     (empty): the tier reconnects with backoff (n_reconnects > 0), writes and reads work
 *     again, and what was written before is a miss, never anything else
 *   a value overwritten with garbage (SET by another client): a MAC failure, counted,
 *     deleted, never served (the page buffer keeps its canary); a value sealed with
 *     another key (forged): the same; a record damaged under a valid MAC: n_corrupt,
 *     deleted; a record of another identity sealed with the right key: foreign, ignored,
 *     left in place; a value sealed with the other MAC algorithm (right shared key), a
 *     real value with a byte of its trailer changed (nonce, tag / HMAC, magic) or its
 *     trailer cut: MAC failures, deleted. All of it for both mac=gmac and mac=hmac
 *   Redis slow (a delaying proxy, 300 ms): get_many returns by its deadline with PGD_EIO,
 *     n_deadline_misses > 0; then the tier recovers
 *   Redis hung (SIGSTOP): every call is bounded; after SIGCONT the tier recovers
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tier/redis/redis_int.h"
#include "t.h"
#include "t_tier.h"
#include "t_redis.h"

static const uint8_t shared_key[] = "test shared key of the instances";
static const pgd_hash fp = {0xfeedull, 0xbeefull};

static pgd_record_ident ident_of(int key_bounds)
{
    pgd_record_ident id;
    pgd_pool_params p = pgd_pool_default_params();
    p.n_layers = 2;
    p.n_kv_heads = 2;
    p.head_dim = 64;
    p.page_tokens = 16;
    p.kv_type = PGD_KV_F16;
    p.key_bounds = key_bounds;
    if (pgd_record_ident_make(&p, fp, &id) != PGD_OK) abort();
    return id;
}

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_text[65536];

static void log_fn(void *ud, int level, const char *msg)
{
    (void)ud;
    (void)level;
    pthread_mutex_lock(&log_mu);
    size_t n = strlen(log_text);
    if (n + strlen(msg) + 2 < sizeof log_text)
        snprintf(log_text + n, sizeof log_text - n, "%s\n", msg);
    pthread_mutex_unlock(&log_mu);
}

static int log_has(const char *s)
{
    pthread_mutex_lock(&log_mu);
    int yes = strstr(log_text, s) != NULL;
    pthread_mutex_unlock(&log_mu);
    return yes;
}

/* Lines of the log holding s. */
static int log_count(const char *s)
{
    int n = 0;
    pthread_mutex_lock(&log_mu);
    for (const char *p = strstr(log_text, s); p; p = strstr(p + 1, s))
        n++;
    pthread_mutex_unlock(&log_mu);
    return n;
}

static pgd_tier *open_url(const char *url)
{
    pgd_tier_redis_params p = pgd_tier_redis_default_params();
    char err[512];
    pgd_tier *t = NULL;
    p.url = url;
    p.key = shared_key;
    p.key_len = sizeof shared_key - 1;
    p.log = log_fn;
    if (pgd_tier_redis_create(&p, &t, err, sizeof err) != PGD_OK) {
        fprintf(stderr, "create %s: %s\n", url, err);
        return NULL;
    }
    pgd_record_ident id = ident_of(0);
    if (pgd_tier_bind(t, &id) != PGD_OK) {
        pgd_tier_close(t);
        return NULL;
    }
    return t;
}

static pgd_tier *open_tier(int port, const char *extra)
{
    char url[512];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d?instance=fault%s", port, extra ? extra : "");
    return open_url(url);
}

static pgd_tier_stats stats_of(pgd_tier *t)
{
    pgd_tier_stats st;
    pgd_tier_get_stats(t, &st);
    return st;
}

/* ---- kill -9 under load ---- */

typedef struct load {
    pgd_tier *t;
    int id;                /* 0: puts, 1: gets */
    atomic_int *phase;     /* 0: before the kill, 1: after (timed), 2: stop */
    uint64_t max_after_us; /* the slowest call after the kill */
    uint64_t n_calls, n_failed_after;
} load;

static void *load_main(void *arg)
{
    load *l = arg;
    pgd_record_ident id = ident_of(0);
    uint8_t *page = malloc(id.page_bytes);
    if (!page) return NULL;
    for (uint32_t i = 0; i < 100000 && atomic_load(&l->phase[0]) != 2; i++) {
        pgd_hash b = t_block_of(100 + (uint32_t)l->id, i % 512);
        int after = atomic_load(&l->phase[0]) == 1;
        uint64_t t0 = t_redis_now_ms() * 1000;
        struct timespec a, z;
        clock_gettime(CLOCK_MONOTONIC, &a);
        int rc;
        if (l->id == 0) {
            t_fill_block(page, 64, b);
            rc = pgd_tier_put(l->t, b, t_parent_of(100, i % 512), page, NULL, NULL, NULL);
        } else {
            pgd_hash run[4] = {t_block_of(100, i % 512), t_block_of(100, (i + 1) % 512),
                               t_block_of(100, (i + 2) % 512), t_block_of(100, (i + 3) % 512)};
            void *pages[4] = {page, page, page, page};
            void *bounds[4] = {NULL, NULL, NULL, NULL};
            int results[4];
            pgd_tier_get_many(l->t, 4, run, pages, bounds, results);
            rc = results[0];
            pgd_tier_lookup(l->t, run, 4);
        }
        clock_gettime(CLOCK_MONOTONIC, &z);
        (void)t0;
        uint64_t us =
            (uint64_t)(z.tv_sec - a.tv_sec) * 1000000u + (uint64_t)((z.tv_nsec - a.tv_nsec) / 1000);
        l->n_calls++;
        if (after) {
            if (us > l->max_after_us) l->max_after_us = us;
            if (rc != PGD_OK) l->n_failed_after++;
        }
        if (i % 64 == 0) t_redis_sleep_ms(1);
    }
    free(page);
    return NULL;
}

static int test_kill_and_restart(void)
{
    t_redis r;
    T_EQ(t_redis_start(&r, NULL), 0);
    /* Look-ups ask Redis within 50 ms; gets within their deadline (20 + 2 per page). */
    pgd_tier *t = open_tier(r.port, "&timeout_ms=50&connect_timeout_ms=50");
    if (!t) {
        t_redis_stop(&r);
        T_FAIL("no tier");
    }
    pgd_record_ident id = ident_of(0);
    uint8_t *page = malloc(id.page_bytes), *out = malloc(id.page_bytes);
    T_ASSERT(page && out);
    /* Records written before the crash. */
    for (uint32_t i = 0; i < 16; i++) {
        t_fill_block(page, id.page_bytes, t_block_of(100, i));
        T_OK(pgd_tier_put(t, t_block_of(100, i), t_parent_of(100, i), page, NULL, NULL, NULL));
    }
    T_OK(pgd_tier_flush(t));

    atomic_int phase = 0;
    load l[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        memset(&l[i], 0, sizeof l[i]);
        l[i].t = t;
        l[i].id = i;
        l[i].phase = &phase;
        pthread_create(&th[i], NULL, load_main, &l[i]);
    }
    t_redis_sleep_ms(300);
    atomic_store(&phase, 1); /* calls from here on are timed, the ones the kill cuts too */
    t_redis_kill9(&r);
    /* The outage shows within a second. */
    uint64_t end = t_redis_now_ms() + 2000;
    while (stats_of(t).n_nodes_up != 0 && t_redis_now_ms() < end)
        t_redis_sleep_ms(5);
    pgd_tier_stats down = stats_of(t);
    t_redis_sleep_ms(500); /* load keeps running against a dead server */
    uint64_t t0 = t_redis_now_ms();
    int put_rc = pgd_tier_put(t, t_block_of(200, 0), t_parent_of(200, 0), page, NULL, NULL, NULL);
    int get_rc = pgd_tier_get(t, t_block_of(100, 1), out, NULL);
    uint64_t fast_ms = t_redis_now_ms() - t0;
    atomic_store(&phase, 2);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    int restarted = t_redis_restart(&r) == 0;
    /* Reconnected with backoff (at most 5 s apart): within 8 s. */
    end = t_redis_now_ms() + 8000;
    while (restarted && stats_of(t).n_nodes_up != 1 && t_redis_now_ms() < end)
        t_redis_sleep_ms(20);
    pgd_tier_stats up = stats_of(t);
    /* Restarted empty: what was written before is a miss, nothing else. */
    int old_rc = pgd_tier_get(t, t_block_of(100, 2), out, NULL);
    t_fill_block(page, id.page_bytes, t_block_of(201, 0));
    int new_put = pgd_tier_put(t, t_block_of(201, 0), t_parent_of(201, 0), page, NULL, NULL, NULL);
    int flushed = pgd_tier_flush(t);
    memset(out, 0, id.page_bytes);
    int new_get = pgd_tier_get(t, t_block_of(201, 0), out, NULL);
    int same = memcmp(out, page, id.page_bytes) == 0;
    pgd_tier_stats end_st = stats_of(t);
    pgd_tier_close(t);
    t_redis_stop(&r);

    T_ASSERT(restarted);
    T_ASSERT(l[0].n_calls > 0 && l[1].n_calls > 0);
    fprintf(stderr, "  load: %llu puts, %llu gets; slowest after the kill %llu / %llu us\n",
            (unsigned long long)l[0].n_calls, (unsigned long long)l[1].n_calls,
            (unsigned long long)l[0].max_after_us, (unsigned long long)l[1].max_after_us);
    T_ASSERT(l[0].max_after_us < 100000 && l[1].max_after_us < 100000);
    T_ASSERT(l[1].n_failed_after > 0);
    T_EQ(down.n_nodes_up, 0);
    T_EQ(down.n_nodes, 1);
    T_ASSERT(put_rc != PGD_OK); /* refused while down */
    T_EQ(get_rc, PGD_EIO);
    T_ASSERT(fast_ms < 100);
    T_EQ(up.n_nodes_up, 1);
    T_ASSERT(up.n_reconnects > 0);
    T_ASSERT(up.n_put_refused > 0);
    T_EQ(old_rc, PGD_ENOTFOUND);
    T_EQ(new_put, PGD_OK);
    T_EQ(flushed, PGD_OK);
    T_EQ(new_get, PGD_OK);
    T_ASSERT(same);
    T_EQ(end_st.n_mac_failures + end_st.n_corrupt + end_st.n_foreign, 0);
    T_ASSERT(log_has("unreachable"));
    T_ASSERT(log_has("reachable again"));
    if (getenv("PGD_TEST_VERBOSE")) fprintf(stderr, "%s", log_text);
    free(page);
    free(out);
    return 0;
}

/* ---- values that lie ---- */

static t_redis srv;

/* SET key value (binary) behind the tier's back. */
static int set_raw(const char *key, const void *v, size_t n)
{
    const char *argv[3] = {"SET", key, v};
    size_t lens[3] = {3, strlen(key), n};
    redisReply *rep = t_redis_cmdargv(&srv, 3, argv, lens);
    return t_redis_ok(rep) ? 0 : -1;
}

static long long exists(const char *key)
{
    redisReply *rep = t_redis_cmd(&srv, "EXISTS %s", key);
    long long n = rep && rep->type == REDIS_REPLY_INTEGER ? rep->integer : -1;
    if (rep) freeReplyObject(rep);
    return n;
}

static int canary_intact(const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (b[i] != 0x5A) return 0;
    return 1;
}

/* The type of the event of the stream whose block_hashes hold block ("" when none). */
static const char *event_of(const char *stream, pgd_hash block)
{
    static char type[32];
    char hex[33];
    type[0] = '\0';
    pgd_hash_hex(block, hex);
    redisReply *rep = t_redis_cmd(&srv, "XRANGE %s - +", stream);
    for (size_t i = 0; rep && rep->type == REDIS_REPLY_ARRAY && i < rep->elements; i++) {
        redisReply *f = rep->element[i]->element[1];
        for (size_t j = 0; j + 1 < f->elements; j += 2) {
            const char *v = f->element[j + 1]->str, *at = strstr(v, hex);
            if (strcmp(f->element[j]->str, "events") != 0 || !at) continue;
            const char *ty = NULL;
            for (const char *q = strstr(v, "{\"type\":\""); q && q < at;
                 q = strstr(q + 1, "{\"type\":\""))
                ty = q + 9;
            if (ty) snprintf(type, sizeof type, "%.*s", (int)(strchr(ty, '"') - ty), ty);
        }
    }
    if (rep) freeReplyObject(rep);
    return type;
}

/* GET key behind the tier's back into v[0..cap): its length, or 0. */
static size_t get_raw(const char *key, uint8_t *v, size_t cap)
{
    redisReply *rep = t_redis_cmd(&srv, "GET %s", key);
    size_t n = 0;
    if (rep && rep->type == REDIS_REPLY_STRING && rep->len <= cap) {
        memcpy(v, rep->str, rep->len);
        n = rep->len;
    }
    if (rep) freeReplyObject(rep);
    return n;
}

/* The lies of Redis to a tier of MAC alg (PGD_TIER_REDIS_MAC_*). */
static int garbage_forged_foreign(int alg)
{
    const char *name = alg == PGD_TIER_REDIS_MAC_GMAC ? "gmac" : "hmac";
    int cross_alg =
        alg == PGD_TIER_REDIS_MAC_GMAC ? PGD_TIER_REDIS_MAC_HMAC : PGD_TIER_REDIS_MAC_GMAC;
    char extra[128], stream[32];
    snprintf(stream, sizeof stream, "lies-%s", name);
    snprintf(extra, sizeof extra, "&ns=lies-%s&events=%s&mac=%s", name, stream, name);
    pgd_tier *t = open_tier(srv.port, extra);
    T_ASSERT(t);
    pgd_record_ident id = ident_of(0), other_id = ident_of(1);
    pgd__redis_mac right, attacker, cross;
    T_OK(pgd__redis_mac_init(&right, alg, shared_key, sizeof shared_key - 1));
    T_OK(pgd__redis_mac_init(&attacker, alg, (const uint8_t *)"attacker's key", 14));
    T_OK(pgd__redis_mac_init(&cross, cross_alg, shared_key, sizeof shared_key - 1));
    uint64_t vb = pgd__redis_value_bytes(&right, &id);
    size_t vcap = (size_t)pgd__redis_value_bytes(&cross, &other_id) + PGD__REDIS_TRAILER_MAX;
    uint8_t *page = malloc(id.page_bytes), *out = malloc(id.page_bytes);
    uint8_t *v = malloc(vcap);
    T_ASSERT(page && out && v);
    char key[PGD__REDIS_KEY_MAX];

    /* 1. Garbage of the right length over a real record. */
    pgd_hash b = t_block_of(40, 0);
    t_fill_block(page, id.page_bytes, b);
    T_OK(pgd_tier_put(t, b, t_parent_of(40, 0), page, NULL, NULL, NULL));
    T_OK(pgd_tier_flush(t));
    size_t kl = pgd_tier_redis_key(t, b, key, sizeof key);
    T_ASSERT(kl > 0);
    memset(v, 'g', vb);
    T_EQ(set_raw(key, v, vb), 0);
    memset(out, 0x5A, id.page_bytes);
    T_EQ(pgd_tier_get(t, b, out, NULL), PGD_ENOTFOUND);
    T_ASSERT(canary_intact(out, id.page_bytes));
    T_OK(pgd_tier_flush(t)); /* the DEL */
    T_EQ(exists(key), 0);
    T_EQ(stats_of(t).n_mac_failures, 1);
    T_ASSERT(log_has("failed the MAC"));
    T_EQ(pgd_tier_lookup(t, &b, 1), 0);

    /* 2. Forged: a well-formed record sealed with another key. */
    b = t_block_of(40, 1);
    kl = pgd_tier_redis_key(t, b, key, sizeof key);
    t_fill_block(page, id.page_bytes, b);
    T_OK(pgd__redis_value_seal(&attacker, key, kl, &id, b, t_parent_of(40, 1), page, NULL, v));
    T_EQ(set_raw(key, v, vb), 0);
    void *pages[1] = {out};
    void *bounds[1] = {NULL};
    int results[1];
    memset(out, 0x5A, id.page_bytes);
    T_EQ(pgd_tier_get_many(t, 1, &b, pages, bounds, results), 0);
    T_EQ(results[0], PGD_ENOTFOUND);
    T_ASSERT(canary_intact(out, id.page_bytes));
    T_OK(pgd_tier_flush(t));
    T_EQ(exists(key), 0);
    T_EQ(stats_of(t).n_mac_failures, 2);

    /* 3. A valid MAC over a record of another block (a buggy writer): damaged. */
    b = t_block_of(40, 2);
    kl = pgd_tier_redis_key(t, b, key, sizeof key);
    T_OK(pgd__redis_value_seal(&right, key, kl, &id, t_block_of(40, 3), t_parent_of(40, 2), page,
                               NULL, v));
    T_EQ(set_raw(key, v, vb), 0);
    T_EQ(pgd_tier_get(t, b, out, NULL), PGD_ENOTFOUND);
    T_OK(pgd_tier_flush(t));
    T_EQ(exists(key), 0);
    T_EQ(stats_of(t).n_corrupt, 1);

    /* 4. Foreign: another identity's record sealed with the right key, under our key. */
    b = t_block_of(40, 4);
    kl = pgd_tier_redis_key(t, b, key, sizeof key);
    uint8_t *big = malloc(other_id.page_bytes + other_id.bounds_bytes);
    T_ASSERT(big);
    t_fill_block(big, other_id.page_bytes + other_id.bounds_bytes, b);
    T_OK(pgd__redis_value_seal(&right, key, kl, &other_id, b, t_parent_of(40, 4), big,
                               big + other_id.page_bytes, v));
    T_EQ(set_raw(key, v, pgd__redis_value_bytes(&right, &other_id)), 0);
    memset(out, 0x5A, id.page_bytes);
    T_EQ(pgd_tier_get(t, b, out, NULL), PGD_ENOTFOUND);
    T_ASSERT(canary_intact(out, id.page_bytes));
    T_OK(pgd_tier_flush(t));
    T_EQ(exists(key), 1); /* ignored, not deleted */
    pgd_tier_stats st = stats_of(t);
    T_EQ(st.n_foreign, 1);
    T_EQ(st.n_mac_failures, 2);
    T_EQ(st.n_corrupt, 1);
    T_EQ(st.n_gets, 0);
    /* What the tier deleted is published (BlockRemoved, "redis"); the foreign one is not. */
    T_ASSERT(strcmp(event_of(stream, t_block_of(40, 1)), "BlockRemoved") == 0);
    T_ASSERT(strcmp(event_of(stream, t_block_of(40, 2)), "BlockRemoved") == 0);
    T_ASSERT(strcmp(event_of(stream, t_block_of(40, 4)), "") == 0);

    /* 5. A value too short to hold a MAC. */
    b = t_block_of(40, 5);
    kl = pgd_tier_redis_key(t, b, key, sizeof key);
    T_EQ(set_raw(key, "x", 1), 0);
    T_EQ(pgd_tier_get(t, b, out, NULL), PGD_ENOTFOUND);
    T_EQ(stats_of(t).n_mac_failures, 3);

    /* 6. Sealed with the right shared key but the other algorithm (an instance configured
     * with the other mac=): a MAC failure, deleted. */
    b = t_block_of(40, 7);
    kl = pgd_tier_redis_key(t, b, key, sizeof key);
    t_fill_block(page, id.page_bytes, b);
    T_OK(pgd__redis_value_seal(&cross, key, kl, &id, b, t_parent_of(40, 7), page, NULL, v));
    T_EQ(set_raw(key, v, (size_t)pgd__redis_value_bytes(&cross, &id)), 0);
    memset(out, 0x5A, id.page_bytes);
    T_EQ(pgd_tier_get(t, b, out, NULL), PGD_ENOTFOUND);
    T_ASSERT(canary_intact(out, id.page_bytes));
    T_OK(pgd_tier_flush(t));
    T_EQ(exists(key), 0);
    T_EQ(stats_of(t).n_mac_failures, 4);

    /* 7. A real value of the tier with one byte of its trailer changed (the nonce, the tag
     * or HMAC, the magic), or its trailer cut short: MAC failures, deleted. */
    size_t tb = right.trailer_bytes;
    size_t at[] = {(size_t)vb - tb, (size_t)vb - 5, (size_t)vb - 1, 0};
    for (int c = 0; c < 4; c++) {
        b = t_block_of(41, (uint32_t)c);
        kl = pgd_tier_redis_key(t, b, key, sizeof key);
        t_fill_block(page, id.page_bytes, b);
        T_OK(pgd_tier_put(t, b, t_parent_of(41, (uint32_t)c), page, NULL, NULL, NULL));
        T_OK(pgd_tier_flush(t));
        T_EQ(get_raw(key, v, vcap), vb);
        if (c < 3) v[at[c]] ^= 0x40;
        T_EQ(set_raw(key, v, c < 3 ? vb : vb - 3), 0);
        memset(out, 0x5A, id.page_bytes);
        T_EQ(pgd_tier_get(t, b, out, NULL), PGD_ENOTFOUND);
        T_ASSERT(canary_intact(out, id.page_bytes));
        T_OK(pgd_tier_flush(t));
        T_EQ(exists(key), 0);
        T_EQ(stats_of(t).n_mac_failures, 5 + (uint64_t)c);
    }

    /* 8. Forged, and only looked up (EXISTS) before this instance computes the block and
     * puts it: the put overwrites the forged value (a key that an EXISTS saw is not a
     * record this instance checked; skipping the put left forged values in Redis). */
    b = t_block_of(42, 0);
    kl = pgd_tier_redis_key(t, b, key, sizeof key);
    t_fill_block(page, id.page_bytes, b);
    T_OK(pgd__redis_value_seal(&attacker, key, kl, &id, b, t_parent_of(42, 0), page, NULL, v));
    T_EQ(set_raw(key, v, vb), 0);
    T_EQ(pgd_tier_lookup(t, &b, 1), 1); /* present, as far as EXISTS knows */
    T_OK(pgd_tier_put(t, b, t_parent_of(42, 0), page, NULL, NULL, NULL));
    T_OK(pgd_tier_flush(t));
    memset(out, 0x5A, id.page_bytes);
    T_OK(pgd_tier_get(t, b, out, NULL));
    T_ASSERT(memcmp(out, page, id.page_bytes) == 0);
    T_EQ(stats_of(t).n_mac_failures, 8); /* nothing more failed: the value is ours now */
    /* A verified entry (written, or read with its MAC checked) does skip the put. */
    uint64_t sets = stats_of(t).n_puts;
    T_OK(pgd_tier_put(t, b, t_parent_of(42, 0), page, NULL, NULL, NULL));
    T_OK(pgd_tier_flush(t));
    T_EQ(stats_of(t).n_puts, sets);

    /* The real record of a block still reads after all that. */
    b = t_block_of(40, 6);
    t_fill_block(page, id.page_bytes, b);
    T_OK(pgd_tier_put(t, b, t_parent_of(40, 6), page, NULL, NULL, NULL));
    T_OK(pgd_tier_flush(t));
    T_OK(pgd_tier_get(t, b, out, NULL));
    T_ASSERT(memcmp(out, page, id.page_bytes) == 0);
    pgd_tier_close(t);
    pgd__redis_mac_deinit(&right);
    pgd__redis_mac_deinit(&attacker);
    pgd__redis_mac_deinit(&cross);
    free(big);
    free(page);
    free(out);
    free(v);
    return 0;
}

static int test_garbage_forged_foreign(void)
{
    T_OK(garbage_forged_foreign(PGD_TIER_REDIS_MAC_GMAC));
    T_OK(garbage_forged_foreign(PGD_TIER_REDIS_MAC_HMAC));
    return 0;
}

/* ---- slow and hung ---- */

static int test_slow_proxy(void)
{
    enum { N = 8 };
    t_proxy px;
    T_EQ(t_proxy_start(&px, srv.port, 0), 0);
    /* The writer has 2 s per pipeline; get_many's deadline is 20 + 2 * 8 = 36 ms. */
    pgd_tier *t = open_tier(px.port, "&ns=slow&timeout_ms=2000");
    pgd_tier *reader = open_tier(px.port, "&ns=slow&timeout_ms=2000");
    if (!t || !reader) {
        pgd_tier_close(t);
        pgd_tier_close(reader);
        t_proxy_stop(&px);
        T_FAIL("no tier");
    }
    pgd_record_ident id = ident_of(0);
    uint8_t *src = malloc(N * id.page_bytes), *dst = malloc(N * id.page_bytes);
    T_ASSERT(src && dst);
    pgd_hash blocks[N];
    void *pages[N], *bounds[N];
    int results[N];
    for (uint32_t i = 0; i < N; i++) {
        blocks[i] = t_block_of(50, i);
        t_fill_block(src + i * id.page_bytes, id.page_bytes, blocks[i]);
        T_OK(pgd_tier_put(t, blocks[i], t_parent_of(50, i), src + i * id.page_bytes, NULL, NULL,
                          NULL));
        pages[i] = dst + i * id.page_bytes;
        bounds[i] = NULL;
    }
    T_OK(pgd_tier_flush(t));
    T_EQ(pgd_tier_get_many(reader, N, blocks, pages, bounds, results), N);

    t_proxy_set_delay(&px, 300);
    uint64_t t0 = t_redis_now_ms();
    size_t got = pgd_tier_get_many(reader, N, blocks, pages, bounds, results);
    uint64_t took = t_redis_now_ms() - t0;
    pgd_tier_stats st = stats_of(reader);
    /* Slow for a while: each miss may drop a connection (an outage, a reconnect), but the
     * log says so once, not per request. */
    int lines0 = log_count("unreachable");
    uint64_t slow_end = t_redis_now_ms() + 1500;
    int n_slow = 0;
    while (t_redis_now_ms() < slow_end) {
        pgd_tier_get_many(reader, N, blocks, pages, bounds, results);
        n_slow++;
        t_redis_sleep_ms(10);
    }
    int slow_lines = log_count("unreachable") - lines0;
    t_proxy_set_delay(&px, 0);
    T_EQ(got, 0);
    T_EQ(results[0], PGD_EIO);
    fprintf(stderr, "  slow: get_many of %d pages returned in %llu ms (deadline 36)\n", N,
            (unsigned long long)took);
    T_ASSERT(took < 150);
    T_ASSERT(st.n_deadline_misses > 0);
    fprintf(stderr, "  slow: %d more get_many in 1.5 s, %d outage lines\n", n_slow, slow_lines);
    T_ASSERT(slow_lines <= 1);
    /* Recovers once Redis is fast again (the dropped connection is made again). */
    uint64_t end = t_redis_now_ms() + 8000;
    while (t_redis_now_ms() < end) {
        t_redis_sleep_ms(20);
        got = pgd_tier_get_many(reader, N, blocks, pages, bounds, results);
        if (got == N) break;
    }
    T_EQ(got, N);
    T_ASSERT(memcmp(src, dst, N * id.page_bytes) == 0);
    pgd_tier_close(t);
    pgd_tier_close(reader);
    t_proxy_stop(&px);
    free(src);
    free(dst);
    return 0;
}

static int test_hung_server(void)
{
    pgd_tier *t = open_tier(srv.port, "&ns=hung&timeout_ms=100");
    T_ASSERT(t);
    pgd_record_ident id = ident_of(0);
    uint8_t *page = malloc(id.page_bytes), *out = malloc(id.page_bytes);
    T_ASSERT(page && out);
    pgd_hash b = t_block_of(60, 0), unknown = t_block_of(61, 0);
    t_fill_block(page, id.page_bytes, b);
    T_OK(pgd_tier_put(t, b, t_parent_of(60, 0), page, NULL, NULL, NULL));
    T_OK(pgd_tier_flush(t));

    t_redis_pause(&srv, 1);
    uint64_t t0 = t_redis_now_ms();
    int g = pgd_tier_get(t, b, out, NULL); /* deadline 22 ms */
    uint64_t t_get = t_redis_now_ms() - t0;
    t0 = t_redis_now_ms();
    size_t lk = pgd_tier_lookup(t, &unknown, 1); /* timeout_ms 100 */
    uint64_t t_lookup = t_redis_now_ms() - t0;
    t0 = t_redis_now_ms();
    int p = pgd_tier_put(t, t_block_of(60, 1), t_parent_of(60, 1), page, NULL, NULL, NULL);
    uint64_t t_put = t_redis_now_ms() - t0;
    t0 = t_redis_now_ms();
    int f = pgd_tier_flush(t); /* bounded (5 s at most) */
    uint64_t t_flush = t_redis_now_ms() - t0;
    t_redis_pause(&srv, 0);
    fprintf(stderr, "  hung: get %llu ms, lookup %llu ms, put %llu ms, flush %llu ms\n",
            (unsigned long long)t_get, (unsigned long long)t_lookup, (unsigned long long)t_put,
            (unsigned long long)t_flush);
    T_EQ(g, PGD_EIO);
    T_ASSERT(t_get < 150);
    T_EQ(lk, 0);
    T_ASSERT(t_lookup < 300);
    T_ASSERT(t_put < 50);
    T_ASSERT(t_flush <= 5500);
    (void)p;
    (void)f;
    /* Recovers. */
    uint64_t end = t_redis_now_ms() + 8000;
    int ok = 0;
    while (!ok && t_redis_now_ms() < end) {
        t_redis_sleep_ms(20);
        ok = pgd_tier_get(t, b, out, NULL) == PGD_OK;
    }
    T_ASSERT(ok);
    T_ASSERT(memcmp(out, page, id.page_bytes) == 0);
    T_ASSERT(stats_of(t).n_timeouts + stats_of(t).n_deadline_misses > 0);
    pgd_tier_close(t);
    free(page);
    free(out);
    return 0;
}

int main(void)
{
    if (!t_redis_available()) T_SKIP("redis-server is not installed");
    T_RUN(test_kill_and_restart);
    if (t_redis_start(&srv, NULL) != 0) T_SKIP("redis-server did not start");
    T_RUN(test_garbage_forged_foreign);
    T_RUN(test_slow_proxy);
    T_RUN(test_hung_server);
    t_redis_stop(&srv);
    T_DONE();
}
