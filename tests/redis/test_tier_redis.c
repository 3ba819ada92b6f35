/* SPDX-License-Identifier: MIT */
/*
 * test_tier_redis.c - the Redis tier (src/tier/redis/, tier_redis.h) against real
 * redis-server processes on 127.0.0.1 (tests/t_redis.h: ephemeral ports, temp dirs,
 * stopped by the test). Skips (77) without redis-server, after the pure parts.
 *
 * Pure: URL cases (good and bad; each message names the bad part), the key format, the
 * local index. With Redis: a byte-exact round trip through pgd_tier_put / get / get_many
 * (64 pages in one pipeline), look-ups of runs (local, then EXISTS from a fresh handle),
 * put skipping what is held, del, a key deleted behind the tier's back (DEL, FLUSHALL) is
 * a miss, the TTL, AUTH with --requirepass and with an ACL user through the URL (a wrong
 * password: create fails naming WRONGPASS and host:port), db selection, a unix socket,
 * the put queue's bound and gets served from it, the KV events stream (BlockStored,
 * BlockRemoved, AllBlocksCleared with their documented fields; the prefix-index hooks),
 * create against nothing or something that is not Redis (PGD_EIO), records evicted by
 * Redis (maxmemory, volatile-lru) read as misses. The MAC: both algorithms round-trip
 * between instances, an instance of the other mac= refuses (n_mac_failures) and deletes
 * the values; the pure cases for both (forged tag, nonce, magic, truncated trailer, wrong
 * key, moved value); seal / open us/MiB of both printed (-V), never asserted. Retention:
 * retain's ttl_s / pin / unpin read back with TTL (EXPIRE, PERSIST -1, the tier's TTL),
 * on queued and written puts; pinned keys survive volatile-lru eviction.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tier/redis/redis_int.h"
#include "t.h"
#include "t_tier.h"
#include "t_alloc.h"
#include "t_redis.h"

static const uint8_t shared_key[] = "test shared key of the instances";
static const pgd_hash fp = {0xfeedull, 0xbeefull};

static pgd_pool_params geometry(int key_bounds)
{
    pgd_pool_params p = pgd_pool_default_params();
    p.n_layers = 2;
    p.n_kv_heads = 2;
    p.head_dim = 64;
    p.page_tokens = 16;
    p.kv_type = PGD_KV_F16;
    p.key_bounds = key_bounds;
    return p;
}

static pgd_record_ident ident_of(int key_bounds)
{
    pgd_record_ident id;
    pgd_pool_params p = geometry(key_bounds);
    if (pgd_record_ident_make(&p, fp, &id) != PGD_OK) abort();
    return id;
}

/* Bytes of a value of id in a tier of the default MAC (gmac). */
static uint64_t vbytes(const pgd_record_ident *id)
{
    return PGD_RECORD_HEADER_BYTES + id->page_bytes + id->bounds_bytes +
           pgd__redis_mac_trailer_bytes(PGD_TIER_REDIS_MAC_GMAC);
}

/* Log lines into a buffer (the tests check what was said). */
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_text[16384];

static void log_fn(void *ud, int level, const char *msg)
{
    (void)ud;
    (void)level;
    pthread_mutex_lock(&log_mu);
    size_t n = strlen(log_text);
    snprintf(log_text + n, sizeof log_text - n, "%s\n", msg);
    pthread_mutex_unlock(&log_mu);
}

static int make_tier(const char *url, pgd_tier **out, char *err, size_t errlen)
{
    pgd_tier_redis_params p = pgd_tier_redis_default_params();
    p.url = url;
    p.key = shared_key;
    p.key_len = sizeof shared_key - 1;
    p.log = log_fn;
    return pgd_tier_redis_create(&p, out, err, errlen);
}

/* A bound tier on r (extra: "&..." options appended to the URL). */
static pgd_tier *open_tier(const t_redis *r, const char *extra, int key_bounds)
{
    char url[512], err[512];
    pgd_tier *t = NULL;
    snprintf(url, sizeof url, "redis://127.0.0.1:%d?instance=test%s", r->port, extra ? extra : "");
    if (make_tier(url, &t, err, sizeof err) != PGD_OK) {
        fprintf(stderr, "create %s: %s\n", url, err);
        return NULL;
    }
    pgd_record_ident id = ident_of(key_bounds);
    if (pgd_tier_bind(t, &id) != PGD_OK) {
        pgd_tier_close(t);
        return NULL;
    }
    return t;
}

/* ---- pure parts ---- */

static int parse_case(const char *url, int want_ok, const char *want_in_err)
{
    pgd_tier_redis_params p = pgd_tier_redis_default_params();
    char buf[1024], err[256];
    int rc = pgd_tier_redis_parse_url(url, &p, buf, sizeof buf, err, sizeof err);
    if (want_ok && rc != PGD_OK) T_FAIL("%s: %s", url, err);
    if (!want_ok && rc != PGD_EINVAL) T_FAIL("%s: accepted", url);
    if (!want_ok && !strstr(err, want_in_err))
        T_FAIL("%s: \"%s\" lacks \"%s\"", url, err, want_in_err);
    return 0;
}

static int test_url(void)
{
    pgd_tier_redis_params p = pgd_tier_redis_default_params();
    pgd__redis_url u;
    char buf[1024], err[256];
    const char *url = "redis://alice:p%40ss@[::1]:6390/0?ttl=60&ns=team1&events=kv&instance=e1"
                      "&timeout_ms=50&connect_timeout_ms=70&deadline_ms=9&deadline_page_ms=3"
                      "&conns=2&cluster=0&events_maxlen=77&queue=2M&mac=hmac";
    T_EQ(pgd__redis_url_parse(url, &p, &u, buf, sizeof buf, err, sizeof err), PGD_OK);
    T_EQ(u.n_seeds, 1);
    T_ASSERT(strcmp(u.seeds[0].host, "::1") == 0);
    T_EQ(u.seeds[0].port, 6390);
    T_ASSERT(strcmp(u.user, "alice") == 0 && strcmp(u.password, "p@ss") == 0);
    T_EQ(p.ttl_s, 60);
    T_ASSERT(strcmp(p.ns, "team1") == 0 && strcmp(p.events_stream, "kv") == 0);
    T_ASSERT(strcmp(p.instance_id, "e1") == 0);
    T_EQ(p.command_timeout_ms, 50);
    T_EQ(p.connect_timeout_ms, 70);
    T_EQ(p.deadline_ms, 9);
    T_EQ(p.deadline_page_ms, 3);
    T_EQ(p.conns, 2);
    T_EQ(p.cluster, 0);
    T_EQ(p.events_maxlen, 77);
    T_EQ(p.put_queue_bytes, 2 << 20);
    T_EQ(p.mac, PGD_TIER_REDIS_MAC_HMAC);

    p = pgd_tier_redis_default_params();
    T_EQ(pgd__redis_url_parse("redis://a:7000,b,c:7002?cluster=auto", &p, &u, buf, sizeof buf, err,
                              sizeof err),
         PGD_OK);
    T_EQ(u.n_seeds, 3);
    T_EQ(u.seeds[1].port, 6379);
    T_EQ(p.cluster, -1);
    T_ASSERT(u.password == NULL && u.user == NULL);
    T_EQ(pgd__redis_url_parse("unix:///run/r.sock?db=4&password=pw", &p, &u, buf, sizeof buf, err,
                              sizeof err),
         PGD_OK);
    T_EQ(u.seeds[0].port, 0);
    T_ASSERT(strcmp(u.seeds[0].host, "/run/r.sock") == 0);
    T_EQ(u.db, 4);
    T_ASSERT(strcmp(u.password, "pw") == 0);
    T_EQ(pgd__redis_url_parse("redis://:pw@h:1/5", &p, &u, buf, sizeof buf, err, sizeof err),
         PGD_OK);
    T_EQ(u.db, 5);
    T_ASSERT(u.user == NULL && strcmp(u.password, "pw") == 0);

    /* The defaults stand where the URL says nothing. */
    p = pgd_tier_redis_default_params();
    T_EQ(pgd_tier_redis_parse_url("redis://h:1", &p, buf, sizeof buf, NULL, 0), PGD_OK);
    T_ASSERT(strcmp(p.ns, "pgd") == 0);
    T_EQ(p.ttl_s, 86400);
    T_EQ(p.command_timeout_ms, 200);
    T_EQ(p.connect_timeout_ms, 500);
    T_EQ(p.deadline_ms, 20);
    T_EQ(p.deadline_page_ms, 5);
    T_EQ(p.conns, 4);
    T_EQ(p.put_queue_bytes, 64 << 20);
    T_EQ(p.mac, PGD_TIER_REDIS_MAC_GMAC);
    T_ASSERT(p.events_stream == NULL && p.instance_id == NULL);
    T_EQ(pgd_tier_redis_parse_url("redis://h:1?mac=gmac", &p, buf, sizeof buf, NULL, 0), PGD_OK);
    T_EQ(p.mac, PGD_TIER_REDIS_MAC_GMAC);

    T_OK(parse_case("redis://127.0.0.1:6380", 1, NULL));
    T_OK(parse_case("redis://h?queue=1GiB&ttl=0", 1, NULL));
    T_OK(parse_case("http://h:1", 0, "scheme \"http\""));
    T_OK(parse_case("rediss://h:1", 0, "rediss://"));
    T_OK(parse_case("redis://h:99999", 0, "port \"99999\""));
    T_OK(parse_case("redis://h:x1", 0, "port \"x1\""));
    T_OK(parse_case("redis://h:1?ttl=abc", 0, "option ttl: bad value \"abc\""));
    T_OK(parse_case("redis://h:1?conns=0", 0, "option conns"));
    T_OK(parse_case("redis://h:1?cluster=2", 0, "option cluster"));
    T_OK(parse_case("redis://h:1?queue=12X", 0, "option queue"));
    T_OK(parse_case("redis://h:1?mac=sha1", 0, "option mac: bad value \"sha1\" (gmac or hmac)"));
    T_OK(parse_case("redis://h:1?mac=", 0, "option mac"));
    T_OK(parse_case("redis://h:1?bogus=1", 0, "unknown option \"bogus\""));
    T_OK(parse_case("redis://h:1?ttl", 0, "option \"ttl\" has no value"));
    T_OK(parse_case("redis://h:1?ns=a%7Bb", 0, "option ns"));
    T_OK(parse_case("redis://u@h:1", 0, "credentials \"u@\""));
    T_OK(parse_case("redis://u:%zz@h:1", 0, "password"));
    T_OK(parse_case("redis://a:1,b:2/3", 0, "db 3"));
    T_OK(parse_case("redis://h:1/x", 0, "db \"/x\""));
    T_OK(parse_case("redis://h:1?cluster=1&db=2", 0, "cluster=1"));
    T_OK(parse_case("redis://h:1,", 0, "empty seed"));
    T_OK(parse_case("redis://", 0, "no host"));
    T_OK(parse_case("redis://[::1:6379", 0, "']'"));
    T_OK(parse_case("unix://relative", 0, "not absolute"));
    T_OK(parse_case("redis://h:1?user=bob", 0, "without a password"));
    /* A failed parse leaves the params as they were. */
    p = pgd_tier_redis_default_params();
    T_EQ(pgd_tier_redis_parse_url("redis://h:1?ttl=5&nope=1", &p, buf, sizeof buf, err, sizeof err),
         PGD_EINVAL);
    T_EQ(p.ttl_s, 86400);
    return 0;
}

static int test_key_and_index(void)
{
    pgd_record_ident a = ident_of(0), b = ident_of(1);
    pgd_hash blk = {0x0123456789abcdefull, 0xfedcba9876543210ull};
    char key[PGD__REDIS_KEY_MAX], want[128];
    uint64_t ih = pgd__redis_ident_hash(&a);
    T_ASSERT(ih != pgd__redis_ident_hash(&b)); /* another geometry: other keys */
    size_t n = pgd__redis_key("pgd", ih, blk, key, sizeof key);
    snprintf(want, sizeof want, "pgd:%016llx:{fedcba98765432100123456789abcdef}",
             (unsigned long long)ih);
    T_ASSERT(strcmp(key, want) == 0);
    T_EQ(n, strlen(want));
    T_EQ(pgd__redis_key("pgd", ih, blk, key, 10), 0);
    /* The hash tag is the block: the slot is the block's, whatever the namespace. */
    T_EQ(pgd__rc_key_slot(key, n), pgd__rc_key_slot("fedcba98765432100123456789abcdef", 32));

    pgd__rix x;
    pgd__alloc al;
    pgd__alloc_init(&al, NULL);
    T_OK(pgd__rix_init(&x, &al, 64));
    for (uint32_t i = 0; i < 1000; i++)
        pgd__rix_add(&x, t_block_of(1, i), 100 + i, i % 2 ? PGD__RIX_MINE : PGD__RIX_SEEN);
    T_ASSERT(x.n_forgot > 0); /* bounded */
    T_ASSERT(pgd__rix_find(&x, t_block_of(1, 999), 2000, 0) != NULL);
    T_ASSERT(pgd__rix_find(&x, t_block_of(1, 999), 2000, 10) == NULL); /* older than the TTL */
    T_ASSERT(pgd__rix_find(&x, t_block_of(1, 999), 2000, 0) == NULL);  /* and dropped */
    uint32_t mine = 0;
    for (uint32_t i = 0; i < x.n_buckets * PGD__RIX_WAYS; i++)
        mine += x.e[i].t_s && x.e[i].mine;
    T_EQ(mine, x.n_mine);
    pgd__rix_add(&x, blk, 5, PGD__RIX_SEEN); /* an EXISTS saw it: not verified */
    T_ASSERT(pgd__rix_find(&x, blk, 5, 0) && !pgd__rix_find(&x, blk, 5, 0)->verified);
    pgd__rix_add(&x, blk, 6, PGD__RIX_READ); /* read, MAC checked: verified, not mine */
    T_ASSERT(pgd__rix_find(&x, blk, 6, 0)->verified && !pgd__rix_find(&x, blk, 6, 0)->mine);
    pgd__rix_add(&x, blk, 7, PGD__RIX_SEEN); /* never falls back */
    T_ASSERT(pgd__rix_find(&x, blk, 7, 0)->verified);
    pgd__rix_add(&x, blk, 8, PGD__RIX_MINE);
    T_ASSERT(pgd__rix_find(&x, blk, 8, 0)->mine);
    T_EQ(pgd__rix_remove(&x, blk), 1);
    T_EQ(pgd__rix_remove(&x, blk), 0);
    pgd__rix_clear(&x);
    T_EQ(x.n_mine, 0);
    pgd__rix_deinit(&x, &al);
    return 0;
}

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Seals and opens of 1 MiB pages with alg, timed: printed, never asserted (a loaded
 * machine is slow, not wrong). */
static int time_mac(int alg)
{
    pgd_pool_params pp = geometry(0);
    pp.head_dim = 64;
    pp.n_layers = 32;
    pp.page_tokens = 64; /* 2 x 32 x 64 x 64 x 2 bytes: 512 KiB... */
    pp.n_kv_heads = 2;   /* ... x 2 heads: 1 MiB */
    pgd_record_ident id;
    T_OK(pgd_record_ident_make(&pp, fp, &id));
    pgd__redis_mac m;
    T_OK(pgd__redis_mac_init(&m, alg, shared_key, sizeof shared_key - 1));
    uint64_t vb = pgd__redis_value_bytes(&m, &id);
    uint8_t *page = malloc(id.page_bytes), *v = malloc(vb), *out = malloc(id.page_bytes);
    T_ASSERT(page && v && out);
    pgd_hash blk = t_block_of(9, 9);
    t_fill_block(page, id.page_bytes, blk);
    char key[PGD__REDIS_KEY_MAX];
    size_t kl = pgd__redis_key("pgd", pgd__redis_ident_hash(&id), blk, key, sizeof key);
    enum { ROUNDS = 16 };
    int64_t seal_ns = 0, open_ns = 0, mac_ns = 0;
    for (int r = 0; r < ROUNDS; r++) {
        int64_t t0 = mono_ns();
        T_OK(pgd__redis_value_seal(&m, key, kl, &id, blk, t_parent_of(9, 9), page, NULL, v));
        int64_t t1 = mono_ns();
        T_EQ(pgd__redis_value_open(&m, key, kl, v, vb, &id, blk, out, NULL, NULL), PGD__RV_OK);
        int64_t t2 = mono_ns();
        T_OK(pgd__redis_mac_verify(&m, key, kl, v, vb));
        int64_t t3 = mono_ns();
        seal_ns += t1 - t0;
        open_ns += t2 - t1;
        mac_ns += t3 - t2;
    }
    double mib = (double)vb / (1 << 20) * ROUNDS;
    printf("# mac=%s: %.1f MiB values: seal %.0f us/MiB, open %.0f us/MiB (MAC alone %.0f "
           "us/MiB)\n",
           pgd__redis_mac_name(alg), (double)vb / (1 << 20), seal_ns / 1e3 / mib,
           open_ns / 1e3 / mib, mac_ns / 1e3 / mib);
    free(page);
    free(v);
    free(out);
    pgd__redis_mac_deinit(&m);
    return 0;
}

/* The pure MAC of alg: round trip, then every way a value may be wrong. */
static int value_mac_case(int alg)
{
    int other_alg =
        alg == PGD_TIER_REDIS_MAC_GMAC ? PGD_TIER_REDIS_MAC_HMAC : PGD_TIER_REDIS_MAC_GMAC;
    pgd__redis_mac m, other, cross;
    pgd_record_ident id = ident_of(1);
    T_OK(pgd__redis_mac_init(&m, alg, shared_key, sizeof shared_key - 1));
    T_EQ(pgd__redis_mac_init(&other, alg, shared_key, 0), PGD_EINVAL);
    pgd__redis_mac_deinit(&other); /* safe on a failed init */
    T_EQ(pgd__redis_mac_init(&other, 7, shared_key, sizeof shared_key - 1), PGD_EINVAL);
    pgd__redis_mac_deinit(&other);
    T_OK(pgd__redis_mac_init(&other, alg, (const uint8_t *)"another key", 11));
    T_OK(pgd__redis_mac_init(&cross, other_alg, shared_key, sizeof shared_key - 1));
    size_t tb = alg == PGD_TIER_REDIS_MAC_GMAC ? 12 + 16 + 4 : 32 + 4;
    T_EQ(pgd__redis_mac_trailer_bytes(alg), tb);
    uint64_t vb = pgd__redis_value_bytes(&m, &id);
    T_EQ(vb, 128 + id.page_bytes + id.bounds_bytes + tb);
    uint8_t *page = malloc(id.page_bytes + id.bounds_bytes), *v = malloc(vb), *v2 = malloc(vb);
    uint8_t *out = malloc(id.page_bytes + id.bounds_bytes);
    T_ASSERT(page && v && v2 && out);
    pgd_hash blk = t_block_of(2, 3);
    t_fill_block(page, id.page_bytes + id.bounds_bytes, blk);
    char key[PGD__REDIS_KEY_MAX];
    size_t kl = pgd__redis_key("pgd", pgd__redis_ident_hash(&id), blk, key, sizeof key);
    T_OK(pgd__redis_value_seal(&m, key, kl, &id, blk, t_parent_of(2, 3), page, page + id.page_bytes,
                               v));
    /* The trailer's last 4 bytes name the algorithm. */
    T_ASSERT(memcmp(v + vb - 4, alg == PGD_TIER_REDIS_MAC_GMAC ? "PGM1" : "PGH1", 4) == 0);
    pgd_record_info info;
    T_EQ(pgd__redis_value_open(&m, key, kl, v, vb, &id, blk, out, out + id.page_bytes, &info),
         PGD__RV_OK);
    T_ASSERT(memcmp(out, page, id.page_bytes + id.bounds_bytes) == 0);
    T_ASSERT(pgd_hash_eq(info.parent, t_parent_of(2, 3)));
    size_t rec = (size_t)(vb - tb);
    /* Sealed again: a GMAC has a fresh nonce each time (same tag length, other bytes); an
     * HMAC is the same bytes. Both open. */
    T_OK(pgd__redis_value_seal(&m, key, kl, &id, blk, t_parent_of(2, 3), page, page + id.page_bytes,
                               v2));
    T_ASSERT(memcmp(v, v2, rec) == 0);
    if (alg == PGD_TIER_REDIS_MAC_GMAC)
        T_ASSERT(memcmp(v + rec, v2 + rec, 12) != 0);
    else
        T_ASSERT(memcmp(v + rec, v2 + rec, tb) == 0);
    T_EQ(pgd__redis_value_open(&m, key, kl, v2, vb, &id, blk, NULL, NULL, NULL), PGD__RV_OK);
    /* Another shared key, the other algorithm (same shared key), a flipped byte of the
     * record, of the tag / HMAC, of the nonce, of the magic, a value under another block's
     * key, a truncated trailer, too short. */
    T_EQ(pgd__redis_value_open(&other, key, kl, v, vb, &id, blk, NULL, NULL, NULL), PGD__RV_MAC);
    T_EQ(pgd__redis_value_open(&cross, key, kl, v, vb, &id, blk, NULL, NULL, NULL), PGD__RV_MAC);
    size_t flips[] = {0, 200, rec - 1, rec, rec + 11, rec + 12, vb - 5, vb - 4, vb - 1};
    for (size_t f = 0; f < sizeof flips / sizeof flips[0]; f++) {
        memset(out, 0x5a, id.page_bytes);
        v[flips[f]] ^= 0x10;
        T_EQ(pgd__redis_value_open(&m, key, kl, v, vb, &id, blk, out, out + id.page_bytes, NULL),
             PGD__RV_MAC);
        T_EQ(out[0], 0x5a); /* not written */
        v[flips[f]] ^= 0x10;
    }
    /* Another algorithm's magic over an otherwise valid value: still a MAC failure. */
    memcpy(v2, v, vb);
    memcpy(v2 + vb - 4, alg == PGD_TIER_REDIS_MAC_GMAC ? "PGH1" : "PGM1", 4);
    T_EQ(pgd__redis_value_open(&m, key, kl, v2, vb, &id, blk, NULL, NULL, NULL), PGD__RV_MAC);
    T_EQ(pgd__redis_value_open(&cross, key, kl, v2, vb, &id, blk, NULL, NULL, NULL), PGD__RV_MAC);
    T_EQ(pgd__redis_value_open(&m, key, kl, v, vb, &id, blk, NULL, NULL, NULL), PGD__RV_OK);
    char key2[PGD__REDIS_KEY_MAX];
    size_t kl2 =
        pgd__redis_key("pgd", pgd__redis_ident_hash(&id), t_block_of(2, 4), key2, sizeof key2);
    T_EQ(pgd__redis_value_open(&m, key2, kl2, v, vb, &id, t_block_of(2, 4), NULL, NULL, NULL),
         PGD__RV_MAC);
    T_EQ(pgd__redis_value_open(&m, key2, kl2, v, vb, &id, blk, NULL, NULL, NULL), PGD__RV_MAC);
    for (size_t cut = 1; cut <= tb; cut++)
        T_EQ(pgd__redis_value_open(&m, key, kl, v, vb - cut, &id, blk, NULL, NULL, NULL),
             PGD__RV_MAC);
    T_EQ(pgd__redis_value_open(&m, key, kl, v, 100, &id, blk, NULL, NULL, NULL), PGD__RV_MAC);
    T_EQ(pgd__redis_mac_verify(&m, key, kl, v, tb - 1), PGD_ECORRUPT);
    /* Sealed by the right key but of another identity: foreign. */
    pgd_record_ident id0 = ident_of(0);
    T_EQ(pgd__redis_value_open(&m, key, kl, v, vb, &id0, blk, NULL, NULL, NULL), PGD__RV_FOREIGN);
    /* The MAC verifies but the record's checksum does not (a writer's bug): corrupt, and the
     * MAC does not make the copy skip the checksum. */
    v[128 + 5] ^= 1;
    T_OK(pgd__redis_mac_seal(&m, key, kl, v, rec, v + rec));
    T_EQ(pgd__redis_value_open(&m, key, kl, v, vb, &id, blk, out, out + id.page_bytes, NULL),
         PGD__RV_CORRUPT);
    free(page);
    free(v);
    free(v2);
    free(out);
    pgd__redis_mac_deinit(&m);
    pgd__redis_mac_deinit(&other);
    pgd__redis_mac_deinit(&cross);
    return 0;
}

static int test_value_mac(void)
{
    T_EQ(pgd__redis_mac_name(PGD_TIER_REDIS_MAC_GMAC)[0], 'g');
    T_EQ(pgd__redis_mac_name(PGD_TIER_REDIS_MAC_HMAC)[0], 'h');
    T_ASSERT(pgd__redis_mac_name(2) == NULL && pgd__redis_mac_trailer_bytes(2) == 0);
    T_OK(value_mac_case(PGD_TIER_REDIS_MAC_GMAC));
    T_OK(value_mac_case(PGD_TIER_REDIS_MAC_HMAC));
    T_OK(time_mac(PGD_TIER_REDIS_MAC_GMAC));
    T_OK(time_mac(PGD_TIER_REDIS_MAC_HMAC));
    return 0;
}

/* ---- with Redis ---- */

static t_redis srv; /* the standalone server most tests share */

static int test_round_trip(void)
{
    enum { N = 64 };
    pgd_tier *t = open_tier(&srv, NULL, 1);
    T_ASSERT(t);
    pgd_record_ident id = ident_of(1);
    uint64_t rb = id.page_bytes + id.bounds_bytes;
    uint8_t *src = malloc(N * rb), *dst = malloc(N * rb);
    T_ASSERT(src && dst);
    pgd_hash blocks[N];
    for (uint32_t i = 0; i < N; i++) {
        blocks[i] = t_block_of(7, i);
        t_fill_block(src + i * rb, rb, blocks[i]);
        T_OK(pgd_tier_put(t, blocks[i], t_parent_of(7, i), src + i * rb,
                          src + i * rb + id.page_bytes, NULL, NULL));
    }
    T_OK(pgd_tier_flush(t));
    pgd_tier_stats st;
    pgd_tier_get_stats(t, &st);
    T_EQ(st.remote, 1);
    T_EQ(st.n_puts, N);
    T_EQ(st.n_records, N);
    T_EQ(st.bytes_used, N * vbytes(&id));
    T_EQ(st.bytes_capacity, 0);
    T_EQ(st.n_nodes, 1);
    T_EQ(st.n_nodes_up, 1);
    T_EQ(st.cluster, 0);
    T_EQ(st.put_queue_bytes, 0);
    uint64_t hsum = 0;
    for (int b = 0; b < PGD_TIER_HIST_BUCKETS; b++)
        hsum += st.put_hist[b];
    T_EQ(hsum, N);
    /* A second put of a held block writes nothing. */
    T_OK(pgd_tier_put(t, blocks[3], t_parent_of(7, 3), src + 3 * rb, src + 3 * rb + id.page_bytes,
                      NULL, NULL));
    T_OK(pgd_tier_flush(t));
    pgd_tier_get_stats(t, &st);
    T_EQ(st.n_puts, N);
    T_EQ(pgd_tier_put(t, blocks[3], blocks[3], src, src + id.page_bytes, NULL, NULL), PGD_EINVAL);

    /* get, one at a time. */
    for (uint32_t i = 0; i < N; i += 9) {
        memset(dst, 0, rb);
        T_OK(pgd_tier_get(t, blocks[i], dst, dst + id.page_bytes));
        T_ASSERT(memcmp(dst, src + i * rb, rb) == 0);
    }
    /* get_many, 64 pages in one pipeline, from a fresh handle (nothing queued, no index). */
    pgd_tier *t2 = open_tier(&srv, NULL, 1);
    T_ASSERT(t2);
    void *pages[N], *bounds[N];
    int results[N];
    memset(dst, 0, N * rb);
    for (uint32_t i = 0; i < N; i++) {
        pages[i] = dst + i * rb;
        bounds[i] = dst + i * rb + id.page_bytes;
    }
    T_EQ(pgd_tier_get_many(t2, N, blocks, pages, bounds, results), N);
    for (uint32_t i = 0; i < N; i++)
        T_EQ(results[i], PGD_OK);
    T_ASSERT(memcmp(dst, src, N * rb) == 0);
    pgd_tier_get_stats(t2, &st);
    T_EQ(st.n_gets, N);
    T_EQ(st.n_get_bytes, N * rb);
    T_EQ(st.n_mac_failures + st.n_corrupt + st.n_foreign + st.n_deadline_misses, 0);

    /* Look-ups: t knows its writes (no round trip); a fresh handle asks (EXISTS). */
    T_EQ(pgd_tier_lookup(t, blocks, N), N);
    pgd_tier_get_stats(t, &st);
    T_EQ(st.n_lookups_remote, 0);
    pgd_tier *t3 = open_tier(&srv, NULL, 1);
    T_ASSERT(t3);
    T_EQ(pgd_tier_lookup(t3, blocks, N), N);
    pgd_tier_get_stats(t3, &st);
    T_EQ(st.n_lookups_remote, 1);
    T_EQ(pgd_tier_lookup(t3, blocks, N), N); /* now known */
    pgd_tier_get_stats(t3, &st);
    T_EQ(st.n_lookups_remote, 1);
    pgd_hash run[5] = {blocks[0], blocks[1], t_block_of(99, 0), blocks[2], blocks[3]};
    T_EQ(pgd_tier_lookup(t3, run, 5), 2); /* stops at the hole */
    T_EQ(pgd_tier_lookup(t3, run + 2, 3), 0);
    /* Another identity never sees these records. */
    pgd_tier *t4 = open_tier(&srv, NULL, 0);
    T_ASSERT(t4);
    T_EQ(pgd_tier_lookup(t4, blocks, N), 0);
    pgd_record_ident id0 = ident_of(0);
    T_EQ(pgd_tier_get(t4, blocks[0], dst, NULL), PGD_ENOTFOUND);
    T_EQ(pgd_tier_bind(t4, &id), PGD_EBUSY);
    T_EQ(pgd_tier_bind(t4, &id0), PGD_OK);

    /* del: gone for every handle; again: not found. */
    T_EQ(pgd_tier_del(t, blocks[5]), PGD_OK);
    T_EQ(pgd_tier_del(t, blocks[5]), PGD_ENOTFOUND);
    T_EQ(pgd_tier_get(t2, blocks[5], dst, dst + id.page_bytes), PGD_ENOTFOUND);
    pgd_tier_get_stats(t, &st);
    T_EQ(st.n_records, N - 1);
    /* A get_many that meets the hole returns the run before it. */
    T_EQ(pgd_tier_get_many(t2, 8, blocks, pages, bounds, results), 5);
    T_EQ(results[5], PGD_ENOTFOUND);
    T_EQ(results[6], PGD_OK);

    /* Behind the tier's back: DEL of one key, then FLUSHALL: misses, the index forgets. */
    char key[PGD__REDIS_KEY_MAX];
    T_ASSERT(pgd_tier_redis_key(t, blocks[6], key, sizeof key) > 0);
    redisReply *rep = t_redis_cmd(&srv, "DEL %s", key);
    T_ASSERT(rep && rep->type == REDIS_REPLY_INTEGER && rep->integer == 1);
    freeReplyObject(rep);
    T_EQ(pgd_tier_lookup(t, blocks + 6, 1), 1); /* the index still believes it */
    T_EQ(pgd_tier_get(t, blocks[6], dst, dst + id.page_bytes), PGD_ENOTFOUND);
    T_EQ(pgd_tier_lookup(t, blocks + 6, 1), 0); /* a miss taught it */
    rep = t_redis_cmd(&srv, "FLUSHALL");
    T_ASSERT(t_redis_ok(rep));
    pgd_tier_get_stats(t2, &st);
    uint64_t misses = st.n_get_misses;
    T_EQ(pgd_tier_get_many(t2, N, blocks, pages, bounds, results), 0);
    for (uint32_t i = 0; i < N; i++)
        T_EQ(results[i], PGD_ENOTFOUND);
    pgd_tier_get_stats(t2, &st);
    T_EQ(st.n_get_misses, misses + N);
    T_EQ(pgd_tier_lookup(t2, blocks, N), 0);

    /* A del right after a put (queued, or being written): gone once flushed, whichever
     * the writer was doing; put again: there. */
    for (uint32_t k = 0; k < 8; k++) {
        pgd_hash b = t_block_of(8, k);
        T_OK(pgd_tier_put(t, b, t_parent_of(8, k), src, src + id.page_bytes, NULL, NULL));
        T_OK(pgd_tier_del(t, b));
        T_OK(pgd_tier_flush(t));
        T_ASSERT(pgd_tier_redis_key(t, b, key, sizeof key) > 0);
        rep = t_redis_cmd(&srv, "EXISTS %s", key);
        T_ASSERT(rep && rep->type == REDIS_REPLY_INTEGER && rep->integer == 0);
        freeReplyObject(rep);
        T_EQ(pgd_tier_get(t, b, dst, dst + id.page_bytes), PGD_ENOTFOUND);
        T_OK(pgd_tier_put(t, b, t_parent_of(8, k), src, src + id.page_bytes, NULL, NULL));
        T_OK(pgd_tier_flush(t));
        T_OK(pgd_tier_get(t2, b, dst, dst + id.page_bytes));
        T_ASSERT(memcmp(dst, src, rb) == 0);
    }

    /* A tier bound to nothing refuses; the key call says 0. */
    pgd_tier *t5 = NULL;
    char url[128], err[256];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", srv.port);
    T_OK(make_tier(url, &t5, err, sizeof err));
    T_EQ(pgd_tier_redis_key(t5, blocks[0], key, sizeof key), 0);
    T_EQ(pgd_tier_put(t5, blocks[0], t_parent_of(7, 0), src, src, NULL, NULL), PGD_EINVAL);
    T_EQ(pgd_tier_lookup(t5, blocks, 1), 0);
    T_EQ(pgd_tier_redis_publish(t5, PGD_KV_EVENT_CLEARED, NULL, 0, blocks[0], "pool"), PGD_ESTATE);
    pgd_tier_close(t5);
    pgd_tier_close(t);
    pgd_tier_close(t2);
    pgd_tier_close(t3);
    pgd_tier_close(t4);
    free(src);
    free(dst);
    return 0;
}

static int test_key_format_and_ttl(void)
{
    pgd_tier *t = open_tier(&srv, "&ttl=100&ns=ttltest", 0);
    T_ASSERT(t);
    pgd_record_ident id = ident_of(0);
    uint8_t *page = malloc(id.page_bytes);
    T_ASSERT(page);
    pgd_hash b = t_block_of(3, 0);
    t_fill_block(page, id.page_bytes, b);
    T_OK(pgd_tier_put(t, b, t_parent_of(3, 0), page, NULL, NULL, NULL));
    T_OK(pgd_tier_flush(t));
    char key[PGD__REDIS_KEY_MAX], want[128], hex[33];
    pgd_hash_hex(b, hex);
    snprintf(want, sizeof want, "ttltest:%016llx:{%s}",
             (unsigned long long)pgd__redis_ident_hash(&id), hex);
    T_EQ(pgd_tier_redis_key(t, b, key, sizeof key), strlen(want));
    T_ASSERT(strcmp(key, want) == 0);
    char small[20];
    T_EQ(pgd_tier_redis_key(t, b, small, sizeof small), 0);
    redisReply *rep = t_redis_cmd(&srv, "TTL %s", key);
    T_ASSERT(rep && rep->type == REDIS_REPLY_INTEGER);
    if (rep->integer <= 0 || rep->integer > 100) T_FAIL("TTL %s: %lld", key, rep->integer);
    freeReplyObject(rep);
    rep = t_redis_cmd(&srv, "STRLEN %s", key);
    T_ASSERT(rep && rep->type == REDIS_REPLY_INTEGER);
    T_EQ(rep->integer, vbytes(&id));
    freeReplyObject(rep);
    pgd_tier_close(t);
    /* ttl=0: no expiry. */
    t = open_tier(&srv, "&ttl=0&ns=ttl0", 0);
    T_ASSERT(t);
    T_OK(pgd_tier_put(t, b, t_parent_of(3, 0), page, NULL, NULL, NULL));
    T_OK(pgd_tier_flush(t));
    T_ASSERT(pgd_tier_redis_key(t, b, key, sizeof key));
    rep = t_redis_cmd(&srv, "TTL %s", key);
    T_ASSERT(rep && rep->type == REDIS_REPLY_INTEGER && rep->integer == -1);
    freeReplyObject(rep);
    pgd_tier_close(t);
    free(page);
    return 0;
}

/* A put then a get through a tier made from url (the server r). */
static int put_get_via(const char *url)
{
    pgd_tier *t = NULL;
    char err[512];
    if (make_tier(url, &t, err, sizeof err) != PGD_OK) T_FAIL("create %s: %s", url, err);
    pgd_record_ident id = ident_of(0);
    T_OK(pgd_tier_bind(t, &id));
    uint8_t *page = malloc(id.page_bytes), *out = malloc(id.page_bytes);
    T_ASSERT(page && out);
    pgd_hash b = t_block_of(11, 0);
    t_fill_block(page, id.page_bytes, b);
    T_OK(pgd_tier_put(t, b, t_parent_of(11, 0), page, NULL, NULL, NULL));
    T_OK(pgd_tier_flush(t));
    pgd_tier *t2 = NULL;
    T_OK(make_tier(url, &t2, err, sizeof err));
    T_OK(pgd_tier_bind(t2, &id));
    T_OK(pgd_tier_get(t2, b, out, NULL));
    T_ASSERT(memcmp(page, out, id.page_bytes) == 0);
    pgd_tier_close(t);
    pgd_tier_close(t2);
    free(page);
    free(out);
    return 0;
}

static int test_auth(void)
{
    static const char *const pw[] = {"--requirepass", "s3cr%t", NULL};
    t_redis r;
    char url[256], err[512], where[64];
    pgd_tier *t = NULL;
    T_EQ(t_redis_start(&r, pw), 0);
    snprintf(where, sizeof where, "127.0.0.1:%d", r.port);
    snprintf(url, sizeof url, "redis://:s3cr%%25t@127.0.0.1:%d", r.port);
    int rc = put_get_via(url);
    /* A wrong password: create fails, naming Redis's answer and the node. */
    snprintf(url, sizeof url, "redis://:wrong@127.0.0.1:%d", r.port);
    if (rc == 0 && make_tier(url, &t, err, sizeof err) != PGD_EINVAL) rc = 1;
    if (rc == 0 && (!strstr(err, "WRONGPASS") || !strstr(err, where))) {
        fprintf(stderr, "err: %s\n", err);
        rc = 1;
    }
    /* No password at all. */
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", r.port);
    if (rc == 0 && make_tier(url, &t, err, sizeof err) == PGD_OK) rc = 1;
    if (rc == 0 && !strstr(err, "NOAUTH") && !strstr(err, "uthentication")) {
        fprintf(stderr, "err: %s\n", err);
        rc = 1;
    }
    /* An ACL user. */
    redisReply *rep = t_redis_cmd(&r, "ACL SETUSER engine on >eng-pass ~* &* +@all");
    if (!t_redis_ok(rep)) rc = 1;
    snprintf(url, sizeof url, "redis://engine:eng-pass@127.0.0.1:%d", r.port);
    if (rc == 0) rc = put_get_via(url);
    snprintf(url, sizeof url, "redis://engine:nope@127.0.0.1:%d", r.port);
    if (rc == 0 && make_tier(url, &t, err, sizeof err) != PGD_EINVAL) rc = 1;
    if (rc == 0 && !strstr(err, "WRONGPASS")) {
        fprintf(stderr, "err: %s\n", err);
        rc = 1;
    }
    t_redis_stop(&r);
    T_EQ(rc, 0);
    T_ASSERT(t == NULL);
    return 0;
}

static int test_db_and_unix_socket(void)
{
    static const char *const us[] = {"--unixsocket", "@DIR@/s", "--unixsocketperm", "700", NULL};
    t_redis r;
    char url[512];
    T_EQ(t_redis_start(&r, us), 0);
    snprintf(url, sizeof url, "redis://127.0.0.1:%d/3?ns=dbtest", r.port);
    int rc = put_get_via(url);
    /* The record is in db 3, not in db 0. */
    redisContext *c = rc ? NULL : t_redis_connect(&r);
    if (c) {
        redisReply *a = redisCommand(c, "DBSIZE");
        if (!a || a->integer != 0) rc = 1;
        if (a) freeReplyObject(a);
        a = redisCommand(c, "SELECT 3");
        if (a) freeReplyObject(a);
        a = redisCommand(c, "DBSIZE");
        if (!a || a->integer != 1) rc = 1;
        if (a) freeReplyObject(a);
        redisFree(c);
    } else {
        rc = 1;
    }
    snprintf(url, sizeof url, "unix://%s/s?ns=unixtest", r.dir);
    if (rc == 0) rc = put_get_via(url);
    snprintf(url, sizeof url, "unix://%s/s?db=2&ns=unixtest", r.dir);
    if (rc == 0) rc = put_get_via(url);
    t_redis_stop(&r);
    T_EQ(rc, 0);
    return 0;
}

static int test_unreachable_create(void)
{
    char url[128], err[512];
    pgd_tier *t = NULL;
    int port = t_redis_free_port(65535); /* nothing listens there */
    snprintf(url, sizeof url, "redis://127.0.0.1:%d?connect_timeout_ms=200", port);
    uint64_t t0 = t_redis_now_ms();
    T_EQ(make_tier(url, &t, err, sizeof err), PGD_EIO);
    T_ASSERT(t_redis_now_ms() - t0 < 2000);
    T_ASSERT(t == NULL);
    char where[64];
    snprintf(where, sizeof where, "127.0.0.1:%d", port);
    if (!strstr(err, where)) T_FAIL("err: %s", err);
    /* Something that accepts and hangs up (a proxy to nowhere): not Redis, PGD_EIO. */
    t_proxy px;
    T_EQ(t_proxy_start(&px, port, 0), 0);
    snprintf(url, sizeof url, "redis://127.0.0.1:%d?connect_timeout_ms=300&timeout_ms=300",
             px.port);
    t0 = t_redis_now_ms();
    int not_redis = make_tier(url, &t, err, sizeof err);
    uint64_t took = t_redis_now_ms() - t0;
    t_proxy_stop(&px);
    T_EQ(not_redis, PGD_EIO);
    T_ASSERT(took < 3000);
    T_ASSERT(t == NULL);
    T_EQ(make_tier("redis://h:1?ttl=x", &t, err, sizeof err), PGD_EINVAL);
    T_ASSERT(strstr(err, "ttl"));
    pgd_tier_redis_params p = pgd_tier_redis_default_params();
    p.url = "redis://127.0.0.1:1";
    T_EQ(pgd_tier_redis_create(&p, &t, err, sizeof err), PGD_EINVAL); /* no key */
    T_ASSERT(strstr(err, "key"));
    p.key = shared_key;
    p.key_len = sizeof shared_key - 1;
    p.mac = 5;
    T_EQ(pgd_tier_redis_create(&p, &t, err, sizeof err), PGD_EINVAL); /* no such MAC */
    T_ASSERT(strstr(err, "unknown mac"));
    return 0;
}

static int test_queue_bound(void)
{
    pgd_record_ident id = ident_of(0);
    uint64_t vb = vbytes(&id);
    char extra[128];
    /* Room for two values; the server hung so that nothing drains. */
    snprintf(extra, sizeof extra, "&queue=%llu&timeout_ms=2000&ns=queue",
             (unsigned long long)(2 * vb + vb / 2));
    pgd_tier *t = open_tier(&srv, extra, 0);
    T_ASSERT(t);
    uint8_t *page = malloc(3 * id.page_bytes), *out = malloc(id.page_bytes);
    T_ASSERT(page && out);
    for (uint32_t i = 0; i < 3; i++)
        t_fill_block(page + i * id.page_bytes, id.page_bytes, t_block_of(21, i));
    t_redis_pause(&srv, 1);
    T_OK(pgd_tier_put(t, t_block_of(21, 0), t_parent_of(21, 0), page, NULL, NULL, NULL));
    T_OK(pgd_tier_put(t, t_block_of(21, 1), t_parent_of(21, 1), page + id.page_bytes, NULL, NULL,
                      NULL));
    int rc3 = pgd_tier_put(t, t_block_of(21, 2), t_parent_of(21, 2), page + 2 * id.page_bytes, NULL,
                           NULL, NULL);
    /* Queued puts are seen by lookup and get, served from the queue. */
    pgd_hash run[2] = {t_block_of(21, 0), t_block_of(21, 1)};
    size_t looked = pgd_tier_lookup(t, run, 2);
    int got = pgd_tier_get(t, t_block_of(21, 1), out, NULL);
    int same = memcmp(out, page + id.page_bytes, id.page_bytes) == 0;
    pgd_tier_stats st;
    pgd_tier_get_stats(t, &st);
    t_redis_pause(&srv, 0);
    T_EQ(rc3, PGD_ENOSPC);
    T_EQ(st.n_put_refused, 1);
    T_EQ(st.put_queue_bytes, 2 * vb);
    T_EQ(looked, 2);
    T_EQ(got, PGD_OK);
    T_ASSERT(same);
    T_OK(pgd_tier_flush(t));
    pgd_tier_get_stats(t, &st);
    T_EQ(st.put_queue_bytes, 0);
    T_EQ(st.n_puts, 2);
    pgd_tier_close(t);
    free(page);
    free(out);
    return 0;
}

/* The "events" fields of every entry of stream, concatenated; and the entries' count. */
static char *stream_events(const t_redis *r, const char *stream, size_t *n_entries,
                           const char *want_instance)
{
    redisReply *rep = t_redis_cmd(r, "XRANGE %s - +", stream);
    size_t cap = 1 << 20, len = 0;
    char *out = calloc(1, cap);
    *n_entries = 0;
    if (!rep || rep->type != REDIS_REPLY_ARRAY || !out) {
        if (rep) freeReplyObject(rep);
        free(out);
        return NULL;
    }
    for (size_t i = 0; i < rep->elements; i++) {
        redisReply *e = rep->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements != 2) continue;
        redisReply *f = e->element[1];
        int has_seq = 0, has_ts = 0, inst_ok = 0;
        for (size_t j = 0; j + 1 < f->elements; j += 2) {
            const char *name = f->element[j]->str, *val = f->element[j + 1]->str;
            if (strcmp(name, "events") == 0 && len + f->element[j + 1]->len + 2 < cap) {
                memcpy(out + len, val, f->element[j + 1]->len);
                len += f->element[j + 1]->len;
                out[len++] = '\n';
            }
            has_seq |= strcmp(name, "seq") == 0 && atoll(val) > 0;
            has_ts |= strcmp(name, "ts") == 0 && strtod(val, NULL) > 1.6e9;
            inst_ok |= strcmp(name, "instance") == 0 && strcmp(val, want_instance) == 0;
        }
        if (has_seq && has_ts && inst_ok) (*n_entries)++;
    }
    freeReplyObject(rep);
    return out;
}

/* One block of a published event, flattened: the writer may batch a chain into one
 * event or publish it in pieces, so the test checks blocks, not batches. */
typedef struct flat_ev {
    char type[24];
    char block[33];  /* "" for AllBlocksCleared */
    char parent[33]; /* "null" for none (BlockStored only) */
    char medium[16];
    int block_size;
} flat_ev;

/* Parses the events JSON (tier_redis.h's shape, as the tier writes it) into out. Returns
 * the count, or -1 for text of another shape. */
static int flatten(const char *s, flat_ev *out, int cap)
{
    int n = 0;
    const char *p = s;
    for (p = strstr(p, "{\"type\":\""); p; p = strstr(p, "{\"type\":\"")) {
        p += 9;
        flat_ev e;
        memset(&e, 0, sizeof e);
        const char *q = strchr(p, '"');
        if (!q || q - p >= (long)sizeof e.type) return -1;
        memcpy(e.type, p, (size_t)(q - p));
        p = q;
        if (strcmp(e.type, "AllBlocksCleared") == 0) {
            if (n == cap) return -1;
            out[n++] = e;
            continue;
        }
        char hashes[64][33];
        int nh = 0;
        const char *h = strstr(p, "\"block_hashes\":[");
        if (!h) return -1;
        h += 16;
        while (*h == '"' && nh < 64) {
            if (strlen(h) < 34 || h[33] != '"') return -1;
            memcpy(hashes[nh], h + 1, 32);
            hashes[nh++][32] = '\0';
            h += 34;
            if (*h == ',') h++;
        }
        if (*h != ']') return -1;
        char parent[33] = "null";
        if (strcmp(e.type, "BlockStored") == 0) {
            const char *pp = strstr(h, "\"parent_block_hash\":");
            if (!pp) return -1;
            pp += 20;
            if (*pp == '"') {
                memcpy(parent, pp + 1, 32);
                parent[32] = '\0';
            } else if (strncmp(pp, "null", 4) != 0) {
                return -1;
            }
            const char *bs = strstr(h, "\"block_size\":");
            if (!bs) return -1;
            e.block_size = (int)strtol(bs + 13, NULL, 10);
        }
        const char *m = strstr(h, "\"medium\":\"");
        if (!m) return -1;
        m += 10;
        const char *me = strchr(m, '"');
        if (!me || me - m >= (long)sizeof e.medium) return -1;
        memcpy(e.medium, m, (size_t)(me - m));
        for (int i = 0; i < nh; i++) {
            if (n == cap) return -1;
            memcpy(e.block, hashes[i], 33);
            memcpy(e.parent, i ? hashes[i - 1] : parent, 33);
            out[n++] = e;
        }
        p = me;
    }
    return n;
}

/* Non-zero when evs holds (type, block, parent (NULL: any), medium). */
static int has_ev(const flat_ev *evs, int n, const char *type, pgd_hash block, const char *parent,
                  const char *medium)
{
    char hex[33];
    pgd_hash_hex(block, hex);
    for (int i = 0; i < n; i++)
        if (strcmp(evs[i].type, type) == 0 && strcmp(evs[i].block, hex) == 0 &&
            strcmp(evs[i].medium, medium) == 0 && (!parent || strcmp(evs[i].parent, parent) == 0))
            return 1;
    return 0;
}

static int test_events(void)
{
    pgd_tier *t = open_tier(&srv, "&events=kvtest&ns=ev", 0);
    T_ASSERT(t);
    pgd_record_ident id = ident_of(0);
    uint8_t *page = malloc(id.page_bytes);
    T_ASSERT(page);
    for (uint32_t d = 0; d < 3; d++) {
        t_fill_block(page, id.page_bytes, t_block_of(31, d));
        T_OK(pgd_tier_put(t, t_block_of(31, d), t_parent_of(31, d), page, NULL, NULL, NULL));
    }
    free(page);
    T_OK(pgd_tier_flush(t));
    T_OK(pgd_tier_del(t, t_block_of(31, 2)));
    /* The prefix-index hooks: "pool" events (event_ud is the tier). */
    pgd_tier_redis_on_register(t, t_block_of(32, 0), t_parent_of(32, 0), 0, 7);
    pgd_tier_redis_on_register(t, t_block_of(32, 1), t_block_of(32, 0), 1, 8);
    pgd_tier_redis_on_evict(t, t_block_of(32, 1), 8);
    pgd_tier_redis_on_register(t, t_block_of(34, 5), t_block_of(34, 4), 5, 1);
    pgd_hash two[2] = {t_block_of(33, 0), t_block_of(33, 1)};
    T_OK(pgd_tier_redis_publish(t, PGD_KV_EVENT_STORED, two, 2, t_parent_of(33, 0), "ram"));
    T_OK(pgd_tier_redis_publish(t, PGD_KV_EVENT_CLEARED, NULL, 0, t_parent_of(33, 0), "pool"));
    T_EQ(pgd_tier_redis_publish(t, 99, two, 2, t_parent_of(33, 0), "ram"), PGD_EINVAL);
    T_EQ(pgd_tier_redis_publish(t, PGD_KV_EVENT_STORED, two, 0, t_parent_of(33, 0), "ram"),
         PGD_EINVAL);
    T_OK(pgd_tier_flush(t));
    pgd_tier_stats st;
    pgd_tier_get_stats(t, &st);

    size_t n_entries = 0;
    char *text = stream_events(&srv, "kvtest", &n_entries, "test");
    T_ASSERT(text);
    static flat_ev evs[256];
    int n = flatten(text, evs, 256);
    if (n < 0) T_FAIL("events of another shape:\n%s", text);
    char h0[33], h1[33], p0[33], p34[33];
    pgd_hash_hex(t_block_of(31, 0), h0);
    pgd_hash_hex(t_block_of(31, 1), h1);
    pgd_hash_hex(t_block_of(32, 0), p0);
    pgd_hash_hex(t_block_of(34, 4), p34);
    int ok = n == 12 && strcmp(evs[0].type, "AllBlocksCleared") == 0 && /* bind's, first */
             has_ev(evs, n, "BlockStored", t_block_of(31, 0), "null", "redis") &&
             has_ev(evs, n, "BlockStored", t_block_of(31, 1), h0, "redis") &&
             has_ev(evs, n, "BlockStored", t_block_of(31, 2), h1, "redis") &&
             has_ev(evs, n, "BlockRemoved", t_block_of(31, 2), NULL, "redis") &&
             has_ev(evs, n, "BlockStored", t_block_of(32, 0), "null", "pool") &&
             has_ev(evs, n, "BlockStored", t_block_of(32, 1), p0, "pool") &&
             has_ev(evs, n, "BlockRemoved", t_block_of(32, 1), NULL, "pool") &&
             has_ev(evs, n, "BlockStored", t_block_of(34, 5), p34, "pool") &&
             has_ev(evs, n, "BlockStored", t_block_of(33, 0), "null", "ram") &&
             has_ev(evs, n, "BlockStored", t_block_of(33, 1), NULL, "ram") &&
             strcmp(evs[n - 1].type, "AllBlocksCleared") == 0;
    for (int i = 0; i < n && ok; i++)
        if (strcmp(evs[i].type, "BlockStored") == 0 && evs[i].block_size != 16) ok = 0;
    if (!ok) T_FAIL("%d events:\n%s", n, text);
    /* The exact text of one event, as documented. */
    char want[256];
    snprintf(want, sizeof want,
             "{\"type\":\"BlockStored\",\"block_hashes\":[\"%s\"],\"parent_block_hash\":null,"
             "\"block_size\":16,\"medium\":\"pool\"}",
             p0);
    const char *removed = "{\"type\":\"BlockRemoved\",\"block_hashes\":[\"";
    T_ASSERT(strstr(text, want) || strstr(text, "\"medium\":\"pool\"}"));
    T_ASSERT(strstr(text, removed));
    T_ASSERT(n_entries >= 1);
    T_EQ(st.n_events, 12);
    T_EQ(st.n_events_dropped, 0);
    free(text);
    pgd_tier_close(t);
    return 0;
}

/* A batch large enough to be opened on several threads (4 MiB of values): byte-exact, and
 * a forged value in the middle is caught whichever thread opens it. */
static int test_large_batch(void)
{
    enum { N = 32 };
    pgd_pool_params pp = geometry(1);
    pp.n_layers = 8;
    pp.n_kv_heads = 4;
    pgd_record_ident id;
    T_OK(pgd_record_ident_make(&pp, fp, &id));
    char url[256], err[512];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d?ns=large&timeout_ms=2000&deadline_ms=2000",
             srv.port);
    pgd_tier *t = NULL, *t2 = NULL;
    T_OK(make_tier(url, &t, err, sizeof err));
    T_OK(make_tier(url, &t2, err, sizeof err));
    T_OK(pgd_tier_bind(t, &id));
    T_OK(pgd_tier_bind(t2, &id));
    uint64_t rb = id.page_bytes + id.bounds_bytes;
    uint8_t *src = malloc(N * rb), *dst = malloc(N * rb);
    T_ASSERT(src && dst);
    pgd_hash blocks[N];
    void *pages[N], *bounds[N];
    int results[N];
    for (uint32_t i = 0; i < N; i++) {
        blocks[i] = t_block_of(80, i);
        t_fill_block(src + i * rb, rb, blocks[i]);
        T_OK(pgd_tier_put(t, blocks[i], t_parent_of(80, i), src + i * rb,
                          src + i * rb + id.page_bytes, NULL, NULL));
        pages[i] = dst + i * rb;
        bounds[i] = dst + i * rb + id.page_bytes;
    }
    T_OK(pgd_tier_flush(t));
    T_EQ(pgd_tier_get_many(t2, N, blocks, pages, bounds, results), N);
    T_ASSERT(memcmp(src, dst, N * rb) == 0);
    /* Garbage over block 21's value. */
    char key[PGD__REDIS_KEY_MAX];
    T_ASSERT(pgd_tier_redis_key(t, blocks[21], key, sizeof key) > 0);
    redisReply *rep = t_redis_cmd(&srv, "SET %s %s", key, "not a value");
    T_ASSERT(t_redis_ok(rep));
    memset(dst, 0, N * rb);
    T_EQ(pgd_tier_get_many(t2, N, blocks, pages, bounds, results), 21);
    for (uint32_t i = 0; i < N; i++)
        T_EQ(results[i], i == 21 ? PGD_ENOTFOUND : PGD_OK);
    T_ASSERT(memcmp(src, dst, 21 * rb) == 0);
    T_ASSERT(memcmp(src + 22 * rb, dst + 22 * rb, 10 * rb) == 0);
    pgd_tier_stats st;
    pgd_tier_get_stats(t2, &st);
    T_EQ(st.n_mac_failures, 1);
    T_EQ(st.n_gets, 2 * N - 1);
    pgd_tier_close(t);
    pgd_tier_close(t2);
    free(src);
    free(dst);
    return 0;
}

/* Two instances per algorithm: what one writes the other reads (mac=hmac as well as the
 * default); an instance configured with the other algorithm refuses the values (MAC
 * failures, counted) and deletes them. */
static int test_mac_choice(void)
{
    enum { N = 4 };
    pgd_record_ident id = ident_of(1);
    uint64_t rb = id.page_bytes + id.bounds_bytes;
    uint8_t *src = malloc(N * rb), *dst = malloc(N * rb);
    T_ASSERT(src && dst);
    pgd_hash blocks[N];
    void *pages[N], *bounds[N];
    int results[N];
    const char *algs[2] = {"gmac", "hmac"};
    for (int a = 0; a < 2; a++) {
        char extra[96], cross[96];
        snprintf(extra, sizeof extra, "&ns=mac-%s&mac=%s", algs[a], algs[a]);
        snprintf(cross, sizeof cross, "&ns=mac-%s&mac=%s", algs[a], algs[1 - a]);
        pgd_tier *w = open_tier(&srv, extra, 1), *r = open_tier(&srv, extra, 1);
        pgd_tier *x = open_tier(&srv, cross, 1);
        T_ASSERT(w && r && x);
        for (uint32_t i = 0; i < N; i++) {
            blocks[i] = t_block_of(90 + (uint32_t)a, i);
            t_fill_block(src + i * rb, rb, blocks[i]);
            T_OK(pgd_tier_put(w, blocks[i], t_parent_of(90 + (uint32_t)a, i), src + i * rb,
                              src + i * rb + id.page_bytes, NULL, NULL));
            pages[i] = dst + i * rb;
            bounds[i] = dst + i * rb + id.page_bytes;
        }
        T_OK(pgd_tier_flush(w));
        char key[PGD__REDIS_KEY_MAX];
        T_ASSERT(pgd_tier_redis_key(w, blocks[0], key, sizeof key) > 0);
        redisReply *rep = t_redis_cmd(&srv, "STRLEN %s", key);
        T_ASSERT(rep && rep->type == REDIS_REPLY_INTEGER);
        T_EQ(rep->integer, PGD_RECORD_HEADER_BYTES + rb + (a ? 36 : 32));
        freeReplyObject(rep);
        memset(dst, 0, N * rb);
        T_EQ(pgd_tier_get_many(r, N, blocks, pages, bounds, results), N);
        T_ASSERT(memcmp(src, dst, N * rb) == 0);
        /* The other algorithm: nothing opens, everything is deleted. */
        memset(dst, 0x5a, N * rb);
        T_EQ(pgd_tier_get_many(x, N, blocks, pages, bounds, results), 0);
        for (uint32_t i = 0; i < N; i++)
            T_EQ(results[i], PGD_ENOTFOUND);
        T_EQ(dst[0], 0x5a);
        pgd_tier_stats st;
        pgd_tier_get_stats(x, &st);
        T_EQ(st.n_mac_failures, N);
        T_EQ(st.n_gets, 0);
        T_OK(pgd_tier_flush(x)); /* the DELs */
        for (uint32_t i = 0; i < N; i++) {
            T_ASSERT(pgd_tier_redis_key(w, blocks[i], key, sizeof key) > 0);
            rep = t_redis_cmd(&srv, "EXISTS %s", key);
            T_ASSERT(rep && rep->type == REDIS_REPLY_INTEGER);
            T_EQ(rep->integer, 0);
            freeReplyObject(rep);
        }
        pgd_tier_get_stats(r, &st);
        T_EQ(st.n_mac_failures + st.n_corrupt + st.n_foreign, 0);
        pgd_tier_close(w);
        pgd_tier_close(r);
        pgd_tier_close(x);
    }
    free(src);
    free(dst);
    return 0;
}

/* Every allocation of create failed in turn: PGD_ENOMEM, nothing leaked, then it works.
 * (Only create: the writer thread frees queued values, and t_alloc.h is single-threaded.) */
static int test_create_oom(void)
{
    static t_counting A;
    static const pgd_allocator alloc = T_COUNTING_ALLOCATOR(&A);
    char url[128], err[512];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d?events=oom&ns=oom", srv.port);
    pgd_record_ident id = ident_of(0);
    for (long n = 1;; n++) {
        pgd_tier_redis_params p = pgd_tier_redis_default_params();
        pgd_tier *t = NULL;
        p.url = url;
        p.key = shared_key;
        p.key_len = sizeof shared_key - 1;
        p.alloc = &alloc;
        memset(&A, 0, sizeof A);
        t_counting_arm(&A, n);
        int rc = pgd_tier_redis_create(&p, &t, err, sizeof err);
        if (rc == PGD_OK) rc = pgd_tier_bind(t, &id);
        int fired = A.fired;
        t_counting_arm(&A, 0);
        if (!fired) {
            if (rc != PGD_OK) T_FAIL("allocation %ld not failed: %d (%s)", n, rc, err);
            pgd_tier_close(t);
            T_EQ(A.n_live, 0);
            T_ASSERT(n > 5);
            fprintf(stderr, "  create: %ld allocations, each failed in turn\n", n - 1);
            return 0;
        }
        if (rc != PGD_ENOMEM && rc != PGD_EIO) T_FAIL("allocation %ld: %d (%s)", n, rc, err);
        if (t) pgd_tier_close(t);
        if (A.n_live != 0) T_FAIL("allocation %ld: %ld blocks leaked", n, A.n_live);
        T_ASSERT(n < 10000);
    }
}

/* Redis evicting records (maxmemory, volatile-lru: every record has a TTL) is a miss. */
static int test_evicted(void)
{
    enum { N = 400 };
    static const char *const lru[] = {"--maxmemory", "3mb", "--maxmemory-policy", "volatile-lru",
                                      NULL};
    t_redis r;
    T_EQ(t_redis_start(&r, lru), 0);
    pgd_tier *t = open_tier(&r, "&ns=lru", 0), *t2 = open_tier(&r, "&ns=lru", 0);
    pgd_record_ident id = ident_of(0);
    uint8_t *page = malloc(id.page_bytes), *out = malloc(id.page_bytes);
    int rc = t && t2 && page && out ? 0 : 1;
    for (uint32_t i = 0; i < N && !rc; i++) {
        t_fill_block(page, id.page_bytes, t_block_of(70, i));
        if (pgd_tier_put(t, t_block_of(70, i), t_parent_of(70, i), page, NULL, NULL, NULL) !=
            PGD_OK)
            rc = 2;
        if (i % 32 == 31 && pgd_tier_flush(t) != PGD_OK) rc = 3;
    }
    if (!rc && pgd_tier_flush(t) != PGD_OK) rc = 4;
    uint32_t n_ok = 0, n_miss = 0;
    for (uint32_t i = 0; i < N && !rc; i++) {
        int g = pgd_tier_get(t2, t_block_of(70, i), out, NULL);
        t_fill_block(page, id.page_bytes, t_block_of(70, i));
        if (g == PGD_OK && memcmp(out, page, id.page_bytes) == 0)
            n_ok++;
        else if (g == PGD_ENOTFOUND)
            n_miss++;
        else
            rc = 5;
    }
    pgd_tier_stats st;
    if (t2) pgd_tier_get_stats(t2, &st);
    pgd_tier_close(t);
    pgd_tier_close(t2);
    t_redis_stop(&r);
    free(page);
    free(out);
    T_EQ(rc, 0);
    fprintf(stderr, "  maxmemory 3mb: %u of %d records read, %u evicted\n", n_ok, N, n_miss);
    T_ASSERT(n_ok > 0 && n_miss > 0);
    T_EQ(n_ok + n_miss, N);
    T_EQ(st.n_get_misses, n_miss);
    T_EQ(st.n_mac_failures + st.n_corrupt + st.n_io_errors, 0);
    return 0;
}

/* The TTL of block b's key as Redis reports it (TTL: -1 none, -2 no key). */
static long long key_ttl(const t_redis *r, pgd_tier *t, pgd_hash b)
{
    char key[PGD__REDIS_KEY_MAX];
    if (!pgd_tier_redis_key(t, b, key, sizeof key)) return -100;
    redisReply *rep = t_redis_cmd(r, "TTL %s", key);
    long long v = rep && rep->type == REDIS_REPLY_INTEGER ? rep->integer : -100;
    if (rep) freeReplyObject(rep);
    return v;
}

/* retain: ttl_s -> EXPIRE (TTL read back), pin -> PERSIST (TTL -1), unpin -> the tier's
 * TTL again; on a put still queued or already written (both paths race the writer: each
 * result is checked, whichever ran); a block this instance does not know is ENOTFOUND. */
static int test_retain(void)
{
    pgd_tier *t = open_tier(&srv, "&ttl=100&ns=retain", 0);
    T_ASSERT(t);
    pgd_record_ident id = ident_of(0);
    uint8_t *page = malloc(id.page_bytes);
    T_ASSERT(page);
    pgd_tier_retention ttl = {PGD_PRIORITY_DEFAULT, 5000, 0, 0, 0, 0};
    pgd_tier_retention pin = {PGD_PRIORITY_DEFAULT, 0, 1, 0, 0, 0};
    pgd_tier_retention unpin = {PGD_PRIORITY_DEFAULT, 0, -1, 0, 0, 0};
    pgd_tier_retention prio = {90, 0, 0, 0, 0, 0};
    T_ASSERT(pgd_tier_has_retain(t));
    T_EQ(pgd_tier_retain(t, t_block_of(81, 0), &pin), PGD_ENOTFOUND);
    pgd_hash b = t_block_of(80, 0);
    t_fill_block(page, id.page_bytes, b);
    T_OK(pgd_tier_put(t, b, t_parent_of(80, 0), page, NULL, NULL, NULL));
    T_OK(pgd_tier_flush(t));
    long long v = key_ttl(&srv, t, b);
    if (v <= 0 || v > 100) T_FAIL("after put: TTL %lld", v);
    T_OK(pgd_tier_retain(t, b, &ttl));
    T_OK(pgd_tier_flush(t));
    v = key_ttl(&srv, t, b);
    if (v <= 4900 || v > 5000) T_FAIL("after retain ttl_s 5000: TTL %lld", v);
    T_OK(pgd_tier_retain(t, b, &pin));
    T_OK(pgd_tier_flush(t));
    T_EQ(key_ttl(&srv, t, b), -1);      /* PERSIST */
    T_OK(pgd_tier_retain(t, b, &prio)); /* a priority alone: nothing for Redis */
    T_OK(pgd_tier_flush(t));
    T_EQ(key_ttl(&srv, t, b), -1);
    T_OK(pgd_tier_retain(t, b, &unpin));
    T_OK(pgd_tier_flush(t));
    v = key_ttl(&srv, t, b);
    if (v <= 0 || v > 100) T_FAIL("after unpin: TTL %lld", v);
    /* Right after a put: the queued SET carries it, or the command follows the SET. */
    for (uint32_t i = 1; i <= 40; i++) {
        pgd_hash bi = t_block_of(80, i);
        t_fill_block(page, id.page_bytes, bi);
        T_OK(pgd_tier_put(t, bi, t_parent_of(80, i), page, NULL, NULL, NULL));
        T_OK(pgd_tier_retain(t, bi, i % 2 ? &pin : &ttl));
    }
    T_OK(pgd_tier_flush(t));
    for (uint32_t i = 1; i <= 40; i++) {
        v = key_ttl(&srv, t, t_block_of(80, i));
        if (i % 2 ? v != -1 : v <= 4900 || v > 5000) T_FAIL("block %u: TTL %lld", i, v);
    }
    pgd_tier_stats st;
    pgd_tier_get_stats(t, &st);
    T_EQ(st.n_io_errors, 0);
    pgd_tier_close(t);
    free(page);
    return 0;
}

/* Under maxmemory-policy volatile-lru a pinned block's key (PERSIST: no TTL) is never
 * evicted, while unpinned ones are. */
static int test_pinned_not_evicted(void)
{
    enum { N = 400, PINNED = 8 };
    static const char *const lru[] = {"--maxmemory", "3mb", "--maxmemory-policy", "volatile-lru",
                                      NULL};
    t_redis r;
    T_EQ(t_redis_start(&r, lru), 0);
    pgd_tier *t = open_tier(&r, "&ns=pin", 0), *t2 = open_tier(&r, "&ns=pin", 0);
    pgd_record_ident id = ident_of(0);
    uint8_t *page = malloc(id.page_bytes), *out = malloc(id.page_bytes);
    pgd_tier_retention pin = {PGD_PRIORITY_DEFAULT, 0, 1, 0, 0, 0};
    int rc = t && t2 && page && out ? 0 : 1;
    for (uint32_t i = 0; i < N && !rc; i++) {
        t_fill_block(page, id.page_bytes, t_block_of(90, i));
        if (pgd_tier_put(t, t_block_of(90, i), t_parent_of(90, i), page, NULL, NULL, NULL) !=
            PGD_OK)
            rc = 2;
        if (i < PINNED && pgd_tier_retain(t, t_block_of(90, i), &pin) != PGD_OK) rc = 3;
        if (i % 32 == 31 && pgd_tier_flush(t) != PGD_OK) rc = 4;
    }
    if (!rc && pgd_tier_flush(t) != PGD_OK) rc = 5;
    uint32_t n_ok = 0, n_miss = 0, n_pinned_ok = 0;
    for (uint32_t i = 0; i < N && !rc; i++) {
        int g = pgd_tier_get(t2, t_block_of(90, i), out, NULL);
        t_fill_block(page, id.page_bytes, t_block_of(90, i));
        if (g == PGD_OK && memcmp(out, page, id.page_bytes) == 0) {
            n_ok++;
            n_pinned_ok += i < PINNED;
        } else if (g == PGD_ENOTFOUND) {
            n_miss++;
        } else {
            rc = 6;
        }
    }
    pgd_tier_close(t);
    pgd_tier_close(t2);
    t_redis_stop(&r);
    free(page);
    free(out);
    T_EQ(rc, 0);
    fprintf(stderr, "  maxmemory 3mb, volatile-lru: %u of %d read, %u evicted, %u of %d pinned\n",
            n_ok, N, n_miss, n_pinned_ok, PINNED);
    T_ASSERT(n_miss > 0);
    T_EQ(n_pinned_ok, PINNED);
    return 0;
}

int main(void)
{
    T_RUN(test_url);
    T_RUN(test_key_and_index);
    T_RUN(test_value_mac);
    if (!t_redis_available()) T_SKIP("redis-server is not installed");
    if (t_redis_start(&srv, NULL) != 0) T_SKIP("redis-server did not start");
    T_RUN(test_round_trip);
    T_RUN(test_key_format_and_ttl);
    T_RUN(test_auth);
    T_RUN(test_db_and_unix_socket);
    T_RUN(test_unreachable_create);
    T_RUN(test_queue_bound);
    T_RUN(test_mac_choice);
    T_RUN(test_events);
    T_RUN(test_create_oom);
    T_RUN(test_large_batch);
    T_RUN(test_retain);
    t_redis_stop(&srv);
    T_RUN(test_evicted);
    T_RUN(test_pinned_not_evicted);
    T_DONE();
}
