/* SPDX-License-Identifier: MIT */
/*
 * test_tier_spec.c - the --tier / --hash-key-file parser of the engine commands
 * (tools/tier_spec.c, compiled in):
 *   - good specs give the fields they spell (sizes with K/M/G/T, binary; ram re-encoding
 *     and compression in any order; disk fsync, direct, write-through[=N]; policy=NAME in
 *     either, an unknown name or belady refused naming it; a Redis spec refuses policy=);
 *   - each bad spec fails with exactly one line on stderr that names the wrong part;
 *   - more than PGD_MAX_TIERS tiers, --hash-key-file twice are refused;
 *   - cli_tiers_open creates the tiers in order: the hash key is the first disk tier's
 *     stable key (the same after reopening), or the key file's bytes; a key file that is
 *     empty or over 256 bytes is refused; a directory held by another open tier is EBUSY;
 *   - Redis specs (no server needed: nothing connects): the CLI's write-back /
 *     write-through[=N] are taken out of the query string (write-through is the default),
 *     the rest goes to the library as it is; events= is seen; the password never shows;
 *     a bad scheme, port or option, write-back twice or with write-through fail in one
 *     line naming it; without --hash-key-file cli_tiers_open refuses before connecting;
 *     built without PGD_HAVE_REDIS, a Redis spec names PGD_WITH_REDIS=OFF;
 *   - against a real redis-server (t_redis.h; this part is skipped without one): the URL
 *     the library gets connects and AUTHs, write-back reaches pgd_tier_use, events= makes
 *     cli_tiers_apply install the tier's KV-event hooks (and only then); a wrong password
 *     fails in one line with Redis's reason and without the password;
 *   - the --help block spells out the syntax, the sizes, the fsync policy and both modes,
 *     and the Redis tier's URL, options, key requirement and events.
 * argv[1]: a scratch directory.
 */
#define _GNU_SOURCE /* t_redis.h: prctl, mkdtemp */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proc.h"
#include "t.h"
#include "tier_spec.h"
#ifdef PGD_HAVE_REDIS
#include <pagoda/tier_redis.h>

#include "t_redis.h"
#endif

static const char *g_dir = "tier_spec.d";
static char g_err[4096];

/* stderr into a file from capture_begin to capture_end, which reads it into g_err. */
static int g_saved = -1;
static void capture_begin(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/stderr.txt", g_dir);
    fflush(stderr);
    g_saved = dup(2);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    close(fd);
}

static void capture_end(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/stderr.txt", g_dir);
    fflush(stderr);
    dup2(g_saved, 2);
    close(g_saved);
    t_slurp(path, g_err, sizeof g_err);
}

/* Runs cli_tier_spec_parse with stderr captured into g_err. */
static int parse(const char *spec, cli_tier_spec *o)
{
    capture_begin();
    int rc = cli_tier_spec_parse("pagoda run", spec, o);
    capture_end();
    return rc;
}

static int lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

static int test_good_specs(void)
{
    cli_tier_spec o;
    T_OK(parse("ram:8G", &o));
    T_EQ(o.kind, CLI_TIER_RAM);
    T_EQ(o.capacity_bytes, 8ull << 30);
    T_EQ(o.store_type, -1);
    T_EQ(o.compression, PGD_RECORD_RAW);
    T_EQ(g_err[0], '\0');
    T_OK(parse("ram:512k:zstd:q4_0", &o));
    T_EQ(o.capacity_bytes, 512ull << 10);
    T_EQ(o.store_type, PGD_KV_Q4_0);
    T_EQ(o.compression, PGD_RECORD_ZSTD);
    T_OK(parse("ram:3M:q8_0:lz4", &o));
    T_EQ(o.store_type, PGD_KV_Q8_0);
    T_EQ(o.compression, PGD_RECORD_LZ4);
    T_OK(parse("ram:4096", &o));
    T_EQ(o.capacity_bytes, 4096);

    T_OK(parse("disk:/var/cache/pagoda:100G", &o));
    T_EQ(o.kind, CLI_TIER_DISK);
    T_ASSERT(!strcmp(o.path, "/var/cache/pagoda"));
    T_EQ(o.capacity_bytes, 100ull << 30);
    T_EQ(o.fsync, 0);
    T_EQ(o.o_direct, 0);
    T_EQ(o.write_through, 0);
    T_OK(parse("disk:rel/dir:2T:write-through:fsync:direct", &o));
    T_ASSERT(!strcmp(o.path, "rel/dir"));
    T_EQ(o.capacity_bytes, 2ull << 40);
    T_EQ(o.fsync, 1);
    T_EQ(o.o_direct, 1);
    T_EQ(o.write_through, 1);
    T_EQ(o.admit_hits, 0);
    T_OK(parse("disk:d:64M:write-through=3", &o));
    T_EQ(o.write_through, 1);
    T_EQ(o.admit_hits, 3);
    T_EQ(o.policy, PGD_POLICY_LRU);

    /* policy=NAME in any position among the options. */
    T_OK(parse("ram:8G:policy=s3fifo", &o));
    T_EQ(o.policy, PGD_POLICY_S3FIFO);
    T_OK(parse("ram:8G:policy=arc:zstd", &o));
    T_EQ(o.policy, PGD_POLICY_ARC);
    T_EQ(o.compression, PGD_RECORD_ZSTD);
    T_OK(parse("disk:/path:100G:policy=cost", &o));
    T_EQ(o.policy, PGD_POLICY_COST);
    T_OK(parse("disk:/path:1G:fsync:policy=priority:write-through", &o));
    T_EQ(o.policy, PGD_POLICY_PRIORITY);
    T_EQ(o.fsync, 1);
    T_OK(parse("ram:1M:policy=lru", &o));
    T_EQ(o.policy, PGD_POLICY_LRU);
    T_EQ(g_err[0], '\0');
    return 0;
}

/* Each bad spec: -1, one line, which contains the wrong part (and the command). */
static int test_bad_specs(void)
{
    static const struct {
        const char *spec, *part;
    } cases[] = {
        {"ram", "ram"},
        {"ram:", "ram:"},
        {"ram:8X", "8X"},
        {"ram:0", "0"},
        {"ram:-1G", "-1G"},
        {"ram:8G:q5_1", "q5_1"},
        {"ram:8G:q8_0:q4_0", "q4_0"},
        {"ram:8G:lz4:zstd", "zstd"},
        {"ram:8G:fsync", "fsync"},
        {"tape:/dev/st0:8G", "tape"},
        {"", "unknown tier kind"},
        {"disk", "disk:PATH:SIZE"},
        {"disk:/tmp/x", "disk:PATH:SIZE"},
        {"disk::8G", "empty"},
        {"disk:/tmp/x:", "size"},
        {"disk:/tmp/x:1.5G", "1.5G"},
        {"disk:/tmp/x:8G:fsinc", "fsinc"},
        {"disk:/tmp/x:8G:fsync:fsync", "fsync"},
        {"disk:/tmp/x:8G:write-through=", "write-through=N"},
        {"disk:/tmp/x:8G:write-through=two", "two"},
        {"disk:/tmp/x:8G:write-throughput", "write-throughput"},
        {"disk:C:/x:8G", "x"},
        {"disk:a:1G:fsync:direct:write-through:fsync:x:y", "too many"},
        {"ram:8G:policy=mru", "unknown policy 'mru' (lru, s3fifo, arc, cost, priority)"},
        {"ram:8G:policy=", "unknown policy ''"},
        {"ram:8G:policy=belady", "belady needs"},
        {"ram:8G:policy=lru:policy=arc", "policy=arc"},
        {"disk:/tmp/x:8G:policy=S3FIFO", "'S3FIFO'"},
        {"disk:/tmp/x:8G:policy", "unknown disk tier option"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cli_tier_spec o;
        if (parse(cases[i].spec, &o) != -1) T_FAIL("'%s' was accepted", cases[i].spec);
        if (lines(g_err) != 1) T_FAIL("'%s': %d lines: %s", cases[i].spec, lines(g_err), g_err);
        if (!strstr(g_err, cases[i].part) || !strstr(g_err, "pagoda run: --tier '"))
            T_FAIL("'%s': the message does not name '%s': %s", cases[i].spec, cases[i].part, g_err);
    }
    return 0;
}

static int test_options(void)
{
    cli_tiers t;
    memset(&t, 0, sizeof t);
    char spec[64];
    for (int i = 0; i < PGD_MAX_TIERS; i++) {
        snprintf(spec, sizeof spec, "ram:%dM", i + 1);
        T_EQ(cli_tier_option("x", CLI_OPT_TIER, spec, &t), 1);
    }
    T_EQ(t.n, PGD_MAX_TIERS);
    T_EQ(t.specs[7].capacity_bytes, 8ull << 20);
    T_EQ(cli_tier_option("x", CLI_OPT_TIER, "ram:1M", &t), -1);
    T_EQ(cli_tier_option("x", 'm', "model", &t), 0);
    T_EQ(cli_tier_option("x", CLI_OPT_HASH_KEY_FILE, "k", &t), 1);
    T_EQ(cli_tier_option("x", CLI_OPT_HASH_KEY_FILE, "k", &t), -1);
    T_ASSERT(!strcmp(t.key_file, "k"));
    return 0;
}

static int test_open_and_keys(void)
{
    char d1[1024], d2[1024], spec[1200], kf[1100];
    uint8_t key1[32];
    cli_tiers t, u;
    snprintf(d1, sizeof d1, "%s/disk1", g_dir);
    snprintf(d2, sizeof d2, "%s/disk2", g_dir);

    memset(&t, 0, sizeof t);
    T_EQ(cli_tier_option("x", CLI_OPT_TIER, "ram:1M", &t), 1);
    snprintf(spec, sizeof spec, "disk:%s:4M:write-through=2", d1);
    T_EQ(cli_tier_option("x", CLI_OPT_TIER, spec, &t), 1);
    snprintf(spec, sizeof spec, "disk:%s:4M", d2);
    T_EQ(cli_tier_option("x", CLI_OPT_TIER, spec, &t), 1);
    T_OK(cli_tiers_open("x", &t, NULL, NULL));
    T_ASSERT(t.tiers[0] && t.tiers[1] && t.tiers[2]);
    T_ASSERT(!strcmp(pgd_tier_name(t.tiers[0]), "ram"));
    T_ASSERT(!strcmp(pgd_tier_name(t.tiers[1]), "disk"));
    T_EQ(t.use[1].write_through, 1);
    T_EQ(t.use[1].admit_hits, 2);
    T_EQ(t.use[2].write_through, 0);
    T_EQ(t.key_len, 32);
    T_OK(pgd_tier_disk_key(t.tiers[1], key1));
    T_ASSERT(!memcmp(t.key, key1, 32));
    pe_ctx_params cp = pe_ctx_default_params();
    cli_tiers_apply(&t, &cp);
    T_ASSERT(cp.tiers == t.use);
    T_EQ(cp.n_tiers, 3);
    T_ASSERT(cp.hash_key == t.key);
    T_EQ(cp.hash_key_len, 32);

    /* d1 is held: a second open of it is refused, and nothing stays open. */
    memset(&u, 0, sizeof u);
    snprintf(spec, sizeof spec, "disk:%s:4M", d1);
    T_EQ(cli_tier_option("x", CLI_OPT_TIER, "ram:1M", &u), 1);
    T_EQ(cli_tier_option("x", CLI_OPT_TIER, spec, &u), 1);
    T_EQ(cli_tiers_open("x", &u, NULL, NULL), -1);
    T_ASSERT(!u.tiers[0] && !u.tiers[1]);
    cli_tiers_close(&t);

    /* Reopened: the same stable key. */
    memset(&u, 0, sizeof u);
    T_EQ(cli_tier_option("x", CLI_OPT_TIER, spec, &u), 1);
    T_OK(cli_tiers_open("x", &u, NULL, NULL));
    T_EQ(u.key_len, 32);
    T_ASSERT(!memcmp(u.key, key1, 32));
    cli_tiers_close(&u);

    /* A key file wins over the disk key; empty or too long is refused. */
    snprintf(kf, sizeof kf, "%s/key.bin", g_dir);
    T_OK(t_write_all(kf, "tenant-key", 10));
    memset(&u, 0, sizeof u);
    T_EQ(cli_tier_option("x", CLI_OPT_TIER, spec, &u), 1);
    T_EQ(cli_tier_option("x", CLI_OPT_HASH_KEY_FILE, kf, &u), 1);
    T_OK(cli_tiers_open("x", &u, NULL, NULL));
    T_EQ(u.key_len, 10);
    T_ASSERT(!memcmp(u.key, "tenant-key", 10));
    cli_tiers_close(&u);
    T_OK(t_write_all(kf, "", 0));
    memset(&u, 0, sizeof u);
    T_EQ(cli_tier_option("x", CLI_OPT_HASH_KEY_FILE, kf, &u), 1);
    T_EQ(cli_tiers_open("x", &u, NULL, NULL), -1);
    char big[257];
    memset(big, 'k', sizeof big);
    T_OK(t_write_all(kf, big, 256));
    memset(&u, 0, sizeof u);
    T_EQ(cli_tier_option("x", CLI_OPT_HASH_KEY_FILE, kf, &u), 1);
    T_OK(cli_tiers_open("x", &u, NULL, NULL));
    T_EQ(u.key_len, 256);
    cli_tiers_close(&u);
    T_OK(t_write_all(kf, big, 257));
    memset(&u, 0, sizeof u);
    T_EQ(cli_tier_option("x", CLI_OPT_HASH_KEY_FILE, kf, &u), 1);
    T_EQ(cli_tiers_open("x", &u, NULL, NULL), -1);
    return 0;
}

#ifdef PGD_HAVE_REDIS
static int test_redis_specs(void)
{
    cli_tier_spec o;
    T_OK(parse("redis://127.0.0.1:6379", &o));
    T_EQ(o.kind, CLI_TIER_REDIS);
    T_EQ(o.write_through, 1); /* shared at once by default */
    T_EQ(o.admit_hits, 0);
    T_EQ(o.events, 0);
    T_ASSERT(!strcmp(o.url, "redis://127.0.0.1:6379"));
    T_EQ(g_err[0], '\0');

    T_OK(parse("redis://bob:s3cret@h1:7000/2?ttl=60&write-back&events=kv", &o));
    T_EQ(o.write_through, 0);
    T_EQ(o.events, 1);
    T_ASSERT(!strcmp(o.url, "redis://bob:s3cret@h1:7000/2?ttl=60&events=kv"));
    T_ASSERT(!strstr(o.text, "s3cret"));
    T_ASSERT(!strcmp(o.text, "redis://bob:***@h1:7000/2?ttl=60&write-back&events=kv"));

    T_OK(parse("redis://:pw@h:1?write-through=3", &o));
    T_EQ(o.write_through, 1);
    T_EQ(o.admit_hits, 3);
    T_ASSERT(!strcmp(o.url, "redis://:pw@h:1"));
    T_ASSERT(!strcmp(o.text, "redis://:***@h:1?write-through=3"));
    T_OK(parse("redis://h:1?write-through", &o));
    T_EQ(o.write_through, 1);
    T_EQ(o.admit_hits, 0);
    T_ASSERT(!strcmp(o.url, "redis://h:1"));
    T_OK(parse("redis://a:7000,b:7001,c:7002?cluster=1&write-back&timeout_ms=50", &o));
    T_EQ(o.write_through, 0);
    T_ASSERT(!strcmp(o.url, "redis://a:7000,b:7001,c:7002?cluster=1&timeout_ms=50"));
    T_OK(parse("unix:///run/redis/redis.sock?db=3&write-back", &o));
    T_EQ(o.kind, CLI_TIER_REDIS);
    T_EQ(o.write_through, 0);
    T_ASSERT(!strcmp(o.url, "unix:///run/redis/redis.sock?db=3"));
    T_OK(parse("redis://h:1?events=s&instance=a@b", &o)); /* '@' in the query: no userinfo */
    T_EQ(o.events, 1);
    T_ASSERT(!strcmp(o.text, "redis://h:1?events=s&instance=a@b"));

    static const struct {
        const char *spec, *part;
    } cases[] = {
        {"rediss://h:6379", "rediss"},
        {"http://h:6379", "http"},
        {"redis://h:99999", "99999"},
        {"redis://h:port", "port"},
        {"redis://h:1?bogus=1", "bogus"},
        {"redis://h:1?ttl=soon", "soon"},
        {"redis://h:1?write-back&write-back", "write-back"},
        {"redis://h:1?write-back&write-through", "exclude"},
        {"redis://h:1?write-through=two", "two"},
        {"redis://h:1?write-through=1&write-through=2", "twice"},
        {"redis://h:1?write-back=1", "write-back=1"},
        {"redis://h:1?policy=lru", "Redis's own maxmemory-policy"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (parse(cases[i].spec, &o) != -1) T_FAIL("'%s' was accepted", cases[i].spec);
        if (lines(g_err) != 1) T_FAIL("'%s': %d lines: %s", cases[i].spec, lines(g_err), g_err);
        if (!strstr(g_err, cases[i].part) || !strstr(g_err, "pagoda run: --tier '"))
            T_FAIL("'%s': the message does not name '%s': %s", cases[i].spec, cases[i].part, g_err);
    }
    /* A bad URL's secrets are not shown either, not even in the library's message. */
    T_EQ(parse("redis://u:hunter2@h:99999", &o), -1);
    T_ASSERT(strstr(g_err, "99999") && !strstr(g_err, "hunter2"));
    T_EQ(parse("redis://hunter2@h:1", &o), -1); /* no ':': the whole userinfo is secret */
    T_ASSERT(!strstr(g_err, "hunter2"));
    T_EQ(parse("redis://h:1?password=hunter2&bogus=1", &o), -1);
    T_ASSERT(strstr(g_err, "password=***") && strstr(g_err, "bogus") && !strstr(g_err, "hunter2"));
    T_OK(parse("redis://h:1?user=ann&password=*", &o));
    T_ASSERT(!strcmp(o.text, "redis://h:1?user=ann&password=***"));

    /* No --hash-key-file: refused before anything connects (no server on port 1). */
    cli_tiers t;
    memset(&t, 0, sizeof t);
    T_EQ(cli_tier_option("pagoda serve", CLI_OPT_TIER, "ram:1M", &t), 1);
    T_EQ(cli_tier_option("pagoda serve", CLI_OPT_TIER, "redis://127.0.0.1:1?events=e", &t), 1);
    capture_begin();
    int rc = cli_tiers_open("pagoda serve", &t, NULL, NULL);
    capture_end();
    T_EQ(rc, -1);
    T_EQ(lines(g_err), 1);
    if (!strstr(g_err, "needs --hash-key-file") || !strstr(g_err, "pagoda serve: --tier '"))
        T_FAIL("no --hash-key-file: %s", g_err);
    T_ASSERT(!t.tiers[0] && !t.tiers[1]);

    /* With the key but no server: the library's reason, one line, nothing left open. */
    char kf[1100];
    snprintf(kf, sizeof kf, "%s/shared.key", g_dir);
    T_OK(t_write_all(kf, "instances-share-this", 20));
    T_EQ(cli_tier_option("pagoda serve", CLI_OPT_HASH_KEY_FILE, kf, &t), 1);
    capture_begin();
    rc = cli_tiers_open("pagoda serve", &t, NULL, NULL);
    capture_end();
    T_EQ(rc, -1);
    if (!strstr(g_err, "pagoda serve: --tier 'redis://127.0.0.1:1?events=e': "))
        T_FAIL("no server: %s", g_err);
    T_ASSERT(!t.tiers[0] && !t.tiers[1]);

    /* The hooks are installed only for an open Redis tier with events. */
    pe_ctx_params cp = pe_ctx_default_params();
    cli_tiers_apply(&t, &cp);
    T_ASSERT(!cp.on_register && !cp.on_evict && !cp.event_ud);
    return 0;
}
/* The part of test_redis_server that runs while r is up (its caller stops r). */
static int with_server(const t_redis *r, const char *kf)
{
    char spec[256];
    cli_tiers t;
    pe_ctx_params cp = pe_ctx_default_params();

    memset(&t, 0, sizeof t);
    snprintf(spec, sizeof spec, "redis://:hunter2@127.0.0.1:%d?events=kv&write-back&ns=ts",
             r->port);
    T_EQ(cli_tier_option("x", CLI_OPT_TIER, "ram:1M", &t), 1);
    T_EQ(cli_tier_option("x", CLI_OPT_TIER, spec, &t), 1);
    T_EQ(cli_tier_option("x", CLI_OPT_HASH_KEY_FILE, kf, &t), 1);
    T_OK(cli_tiers_open("x", &t, NULL, NULL));
    T_ASSERT(t.tiers[1] && !strcmp(pgd_tier_name(t.tiers[1]), "redis"));
    T_EQ(t.use[1].write_through, 0);
    T_EQ(t.key_len, 20);
    cli_tiers_apply(&t, &cp);
    T_EQ(cp.n_tiers, 2);
    T_ASSERT(cp.hash_key == t.key);
    T_ASSERT(cp.on_register == pgd_tier_redis_on_register);
    T_ASSERT(cp.on_evict == pgd_tier_redis_on_evict);
    T_ASSERT(cp.event_ud == t.tiers[1]);
    cli_tiers_close(&t);

    /* No events: no hooks; write-through by default. */
    memset(&t, 0, sizeof t);
    cp = pe_ctx_default_params();
    snprintf(spec, sizeof spec, "redis://:hunter2@127.0.0.1:%d", r->port);
    T_EQ(cli_tier_option("x", CLI_OPT_TIER, spec, &t), 1);
    T_EQ(cli_tier_option("x", CLI_OPT_HASH_KEY_FILE, kf, &t), 1);
    T_OK(cli_tiers_open("x", &t, NULL, NULL));
    T_EQ(t.use[0].write_through, 1);
    cli_tiers_apply(&t, &cp);
    T_ASSERT(cp.tiers == t.use && !cp.on_register && !cp.on_evict && !cp.event_ud);
    cli_tiers_close(&t);

    /* A wrong password: Redis's reason, one line, the password never shown. */
    memset(&t, 0, sizeof t);
    snprintf(spec, sizeof spec, "redis://:not-hunter2@127.0.0.1:%d", r->port);
    T_EQ(cli_tier_option("x", CLI_OPT_TIER, spec, &t), 1);
    T_EQ(cli_tier_option("x", CLI_OPT_HASH_KEY_FILE, kf, &t), 1);
    capture_begin();
    int rc = cli_tiers_open("x", &t, NULL, NULL);
    capture_end();
    T_EQ(rc, -1);
    T_EQ(lines(g_err), 1);
    if (!strstr(g_err, "WRONGPASS") || strstr(g_err, "not-hunter2"))
        T_FAIL("a wrong password: %s", g_err);
    T_ASSERT(!t.tiers[0]);
    return 0;
}

static int test_redis_server(void)
{
    static const char *const args[] = {"--requirepass", "hunter2", NULL};
    char kf[1100];
    t_redis r;
    if (!t_redis_available()) return 0; /* it said why; the rest of the file still runs */
    snprintf(kf, sizeof kf, "%s/server.key", g_dir);
    T_OK(t_write_all(kf, "instances-share-this", 20));
    if (t_redis_start(&r, args) != 0) T_FAIL("redis-server did not start");
    int rc = with_server(&r, kf);
    t_redis_stop(&r);
    return rc;
}
#else
static int test_redis_server(void)
{
    return 0; /* built without the Redis tier */
}

static int test_redis_specs(void)
{
    cli_tier_spec o;
    T_EQ(parse("redis://127.0.0.1:6379", &o), -1);
    T_EQ(lines(g_err), 1);
    if (!strstr(g_err, "built without the Redis tier (PGD_WITH_REDIS=OFF)"))
        T_FAIL("without Redis: %s", g_err);
    T_EQ(parse("unix:///tmp/r.sock", &o), -1);
    T_ASSERT(strstr(g_err, "PGD_WITH_REDIS=OFF"));
    T_EQ(parse("http://h:1", &o), -1);
    T_ASSERT(strstr(g_err, "unknown tier kind") && strstr(g_err, "'http'"));
    return 0;
}
#endif

static int test_help(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/help.txt", g_dir);
    FILE *f = fopen(path, "w");
    T_ASSERT(f);
    cli_tier_help(f);
    fclose(f);
    static char buf[8192];
    t_slurp(path, buf, sizeof buf);
    const char *want[] = {"ram:SIZE[:q8_0|q4_0][:lz4|zstd]",
                          "disk:PATH:SIZE[:fsync][:direct][:write-through[=N]]",
                          "K, M, G or T",
                          "fsync policy",
                          "Write-back (the default)",
                          "write-through",
                          "--hash-key-file",
                          "redis://[user:password@]host:port",
                          "unix:///",
                          "write-back",
                          "events=STREAM",
                          "Required with a Redis tier",
                          "policy=NAME: the tier's eviction order",
                          "maxmemory-policy"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(buf, want[i])) T_FAIL("--help lacks '%s'", want[i]);
    for (const char *l = buf; *l;) {
        const char *e = strchr(l, '\n');
        T_ASSERT(e);
        if (e - l > 90) T_FAIL("a --help line is %d columns", (int)(e - l));
        l = e + 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1) g_dir = argv[1];
    if (t_scratch_dir(g_dir)) return 1;
    T_RUN(test_good_specs);
    T_RUN(test_bad_specs);
    T_RUN(test_options);
    T_RUN(test_open_and_keys);
    T_RUN(test_redis_specs);
    T_RUN(test_redis_server);
    T_RUN(test_help);
    T_DONE();
}
