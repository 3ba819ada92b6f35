/* SPDX-License-Identifier: MIT */
/*
 * test_rclient.c - the Redis client (src/tier/redis/rclient.c) and the launcher every
 * Redis test uses (tests/t_redis.h), against real redis-server processes on 127.0.0.1
 * (ephemeral ports, temp dirs, stopped by the test). Skips (77) without redis-server.
 *
 * The launcher: a server starts, answers, remembers its password, survives kill -9 +
 * restart on its port, hangs when paused; a 3-master cluster forms and a slot migrates
 * by its helpers; the delaying proxy forwards after its delay.
 *
 * The client's pure parts: CRC16 and key slots (the Cluster spec's examples, hash tags,
 * 200 random keys against a live CLUSTER KEYSLOT), the MOVED / ASK parser (good and
 * malformed input), the CLUSTER SLOTS parser (a live reply, built malformed ones).
 * Standalone: a 1000-command pipeline of 64 KiB values; AUTH with a password and with an
 * ACL user (wrong ones refused, PGD_EINVAL, Redis's message); SELECT isolates a db; a
 * paused server times out within the deadline; kill -9 fails commands at once, restart
 * reconnects through tick; a unix socket; threads sharing a small pool.
 * Cluster: 3 masters, keys spread over all; a slot migrated while a thread keeps SET +
 * GET on it loses no command (ASK / MOVED followed), then routes straight.
 * It prints round trips per second of a 1-command exec and of a 100-command pipeline.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "t.h"
#include "t_redis.h"
#include "tier/redis/rclient.h"
#include "tier/tier_int.h"

/* ---- the launcher (t_redis.h) ---- */

static int test_launcher_standalone(void)
{
    static const char *const pw[] = {"--requirepass", "s3cret", NULL};
    t_redis r;
    redisReply *rep;
    uint64_t t0;

    T_EQ(t_redis_start(&r, pw), 0);
    T_ASSERT(r.port > 0 && r.port != 6379);
    T_ASSERT(strcmp(r.password, "s3cret") == 0);
    rep = t_redis_cmd(&r, "SET %s %s", "k", "v");
    T_ASSERT(t_redis_ok(rep));
    rep = t_redis_cmd(&r, "GET k");
    T_ASSERT(rep && rep->type == REDIS_REPLY_STRING && strcmp(rep->str, "v") == 0);
    freeReplyObject(rep);

    t_redis_pause(&r, 1); /* hung: a command times out (2 s) */
    t0 = t_redis_now_ms();
    T_ASSERT(t_redis_cmd(&r, "PING") == NULL);
    T_ASSERT(t_redis_now_ms() - t0 < 4000);
    t_redis_pause(&r, 0);
    rep = t_redis_cmd(&r, "PING");
    T_ASSERT(rep && rep->type == REDIS_REPLY_STATUS);
    freeReplyObject(rep);

    t_redis_kill9(&r); /* crash: nothing answers; restart: same port, empty */
    T_EQ(r.pid, 0);
    T_ASSERT(t_redis_cmd(&r, "PING") == NULL);
    T_EQ(t_redis_restart(&r), 0);
    rep = t_redis_cmd(&r, "EXISTS k");
    T_ASSERT(rep && rep->type == REDIS_REPLY_INTEGER && rep->integer == 0);
    freeReplyObject(rep);
    {
        pid_t pid = r.pid;
        char dir[sizeof r.dir];
        memcpy(dir, r.dir, sizeof dir);
        t_redis_stop(&r);
        T_ASSERT(kill(pid, 0) != 0); /* gone and reaped */
        T_ASSERT(access(dir, F_OK) != 0);
    }
    t_redis_stop(&r); /* twice: harmless */
    return 0;
}

static int test_launcher_unix_socket(void)
{
    static const char *const us[] = {"--unixsocket", "@DIR@/s", NULL};
    t_redis r;
    char path[256];
    redisContext *c;
    redisReply *rep;
    struct timeval tv = {2, 0};

    T_EQ(t_redis_start(&r, us), 0);
    snprintf(path, sizeof path, "%s/s", r.dir);
    c = redisConnectUnixWithTimeout(path, tv);
    T_ASSERT(c && !c->err);
    rep = redisCommand(c, "PING");
    T_ASSERT(rep && rep->type == REDIS_REPLY_STATUS);
    freeReplyObject(rep);
    redisFree(c);
    t_redis_stop(&r);
    return 0;
}

static int test_launcher_cluster(void)
{
    t_cluster c;
    redisReply *rep;
    int slot = 12182; /* "foo" */
    int from, to, moved = 0;

    T_EQ(t_cluster_start(&c, 3), 0);
    T_EQ(c.n, 3);
    from = t_cluster_node_of_slot(&c, slot);
    T_ASSERT(from >= 0 && from < 3);
    to = (from + 1) % 3;
    for (int i = 0; i < 50; i++) { /* keys of one slot: a hash tag */
        rep = t_redis_cmd(&c.node[from], "SET {foo}:%d v%d", i, i);
        T_ASSERT(t_redis_ok(rep));
    }
    T_EQ(t_cluster_migrate_begin(&c, slot, from, to), 0);
    for (int n; (n = t_cluster_migrate_keys(&c, slot, from, to, 7)) > 0;)
        moved += n;
    T_EQ(moved, 50);
    T_EQ(t_cluster_migrate_end(&c, slot, to), 0);
    T_EQ(t_cluster_node_of_slot(&c, slot), to);
    rep = t_redis_cmd(&c.node[to], "GET {foo}:7");
    T_ASSERT(rep && rep->type == REDIS_REPLY_STRING && strcmp(rep->str, "v7") == 0);
    freeReplyObject(rep);
    rep = t_redis_cmd(&c.node[from], "GET {foo}:7");
    T_ASSERT(rep && rep->type == REDIS_REPLY_ERROR && strncmp(rep->str, "MOVED 12182 ", 12) == 0);
    freeReplyObject(rep);
    t_cluster_stop(&c);
    return 0;
}

static int test_launcher_proxy(void)
{
    t_redis r, via;
    t_proxy p;
    redisReply *rep;
    uint64_t t0, dt;

    T_EQ(t_redis_start(&r, NULL), 0);
    T_EQ(t_proxy_start(&p, r.port, 100), 0);
    via = r;
    via.port = p.port; /* t_redis_cmd through the proxy */
    t0 = t_redis_now_ms();
    rep = t_redis_cmd(&via, "PING");
    dt = t_redis_now_ms() - t0;
    T_ASSERT(rep && rep->type == REDIS_REPLY_STATUS);
    freeReplyObject(rep);
    T_ASSERT(dt >= 190 && dt < 1500); /* 100 ms each way */
    t_proxy_set_delay(&p, 0);
    t0 = t_redis_now_ms();
    rep = t_redis_cmd(&via, "PING");
    dt = t_redis_now_ms() - t0;
    T_ASSERT(rep && rep->type == REDIS_REPLY_STATUS);
    freeReplyObject(rep);
    T_ASSERT(dt < 150);
    t_proxy_set_delay(&p, 3000); /* slower than t_redis_cmd's 2 s timeout */
    T_ASSERT(t_redis_cmd(&via, "PING") == NULL);
    t_proxy_stop(&p);
    t_redis_stop(&r);
    return 0;
}

/* ---- the client: helpers ---- */

static pgd__alloc libc_al;

static void log_fn(void *ud, int level, const char *msg)
{
    (void)ud;
    if (getenv("T_REDIS_LOG")) fprintf(stderr, "[log %d] %s\n", level, msg);
}

static const pgd__log test_log = {log_fn, NULL};

/* Params for one seed 127.0.0.1:port (port 0: path is a unix socket). */
static pgd__rc_params params_for(pgd__rc_addr *seed, int port, const char *path)
{
    pgd__rc_params p;
    memset(&p, 0, sizeof p);
    memset(seed, 0, sizeof *seed);
    snprintf(seed->host, sizeof seed->host, "%s", port ? "127.0.0.1" : path);
    seed->port = port;
    p.seeds = seed;
    p.n_seeds = 1;
    p.connect_timeout_ms = 500;
    p.command_timeout_ms = 2000;
    p.conns = 2;
    p.cluster = -1;
    p.log = &test_log;
    p.al = &libc_al;
    return p;
}

/* SET key val through rc. Returns 0 when the reply is OK. */
static int rc_set(pgd__rc *rc, const char *key, const char *val)
{
    const char *argv[3] = {"SET", key, val};
    redisReply *r = pgd__rc_command(rc, 1, 3, argv);
    int ok = r && r->type == REDIS_REPLY_STATUS && strcmp(r->str, "OK") == 0;
    if (r) freeReplyObject(r);
    return ok ? 0 : -1;
}

/* GET key through rc into buf. Returns 1 (found), 0 (nil), -1 (failed). */
static int rc_get(pgd__rc *rc, const char *key, char *buf, size_t len)
{
    const char *argv[2] = {"GET", key};
    redisReply *r = pgd__rc_command(rc, 1, 2, argv);
    int st = -1;
    if (r && r->type == REDIS_REPLY_STRING) {
        snprintf(buf, len, "%.*s", (int)r->len, r->str);
        st = 1;
    } else if (r && r->type == REDIS_REPLY_NIL) {
        st = 0;
    }
    if (r) freeReplyObject(r);
    return st;
}

static uint64_t ms_since(uint64_t t0_ns)
{
    return (pgd__tier_now_ns() - t0_ns) / 1000000u;
}

/* ---- pure parts ---- */

static int test_crc16_and_slots(void)
{
    T_EQ(pgd__rc_crc16("123456789", 9), 0x31C3);
    T_EQ(pgd__rc_crc16("", 0), 0);
    T_EQ(pgd__rc_key_slot("foo", 3), 12182);
    T_EQ(pgd__rc_key_slot("{user1000}.following", 20),
         pgd__rc_key_slot("{user1000}.followers", 20));
    T_EQ(pgd__rc_key_slot("{user1000}.following", 20), pgd__rc_key_slot("user1000", 8));
    T_EQ(pgd__rc_key_slot("foo{}{bar}", 10), pgd__rc_crc16("foo{}{bar}", 10) & 16383);
    T_EQ(pgd__rc_key_slot("foo{{bar}}zap", 13), pgd__rc_key_slot("{bar", 4));
    T_EQ(pgd__rc_key_slot("foo{{bar}}zap", 13), pgd__rc_crc16("{bar", 4) & 16383);
    T_EQ(pgd__rc_key_slot("foo{bar}{zap}", 13), pgd__rc_key_slot("bar", 3));
    T_EQ(pgd__rc_key_slot("foo{bar", 7), pgd__rc_crc16("foo{bar", 7) & 16383);
    T_EQ(pgd__rc_key_slot("{", 1), pgd__rc_crc16("{", 1) & 16383);
    T_EQ(pgd__rc_key_slot("", 0), 0);
    return 0;
}

static int test_parse_redirect(void)
{
    pgd__rc_addr a;
    uint32_t slot = 0;
    char longhost[400];
#define PR(s) pgd__rc_parse_redirect(s, strlen(s), &slot, &a)
    T_EQ(PR("MOVED 3999 127.0.0.1:6381"), 1);
    T_EQ(slot, 3999);
    T_ASSERT(strcmp(a.host, "127.0.0.1") == 0);
    T_EQ(a.port, 6381);
    T_EQ(PR("ASK 16383 redis-2.example:7000"), 2);
    T_EQ(slot, 16383);
    T_ASSERT(strcmp(a.host, "redis-2.example") == 0);
    T_EQ(a.port, 7000);
    T_EQ(PR("MOVED 0 ::1:6380"), 1); /* IPv6: the port follows the last ':' */
    T_ASSERT(strcmp(a.host, "::1") == 0);
    T_EQ(a.port, 6380);
    T_EQ(PR("MOVED 7 [fe80::1]:65535"), 1);
    T_ASSERT(strcmp(a.host, "fe80::1") == 0);
    T_EQ(a.port, 65535);
    T_EQ(PR("MOVED 7 :6380"), 1); /* unknown endpoint: the caller uses its node's host */
    T_EQ(a.host[0], '\0');
    T_EQ(PR("ERR unknown command"), 0);
    T_EQ(PR("MOVEDX 1 h:1"), 0);
    T_EQ(PR("TRYAGAIN Multiple keys request during rehashing of slot"), 0);
    T_EQ(PR(""), 0);
    T_EQ(PR("MOVED 3999 127.0.0.1"), -1);       /* no port */
    T_EQ(PR("MOVED 3999 127.0.0.1:"), -1);      /* empty port */
    T_EQ(PR("MOVED 16384 127.0.0.1:6379"), -1); /* slot out of range */
    T_EQ(PR("MOVED 99999999999 h:1"), -1);
    T_EQ(PR("MOVED 1 h:65536"), -1);
    T_EQ(PR("MOVED 1 h:0"), -1);
    T_EQ(PR("MOVED 1 h:4294967297"), -1); /* huge port */
    T_EQ(PR("MOVED 1 h:-1"), -1);
    T_EQ(PR("MOVED -1 h:1"), -1);
    T_EQ(PR("MOVED  h:1"), -1);
    T_EQ(PR("MOVED 1"), -1);
    T_EQ(PR("MOVED 1 "), -1);
    T_EQ(PR("MOVED 1 a b:1"), -1);
    T_EQ(PR("ASK x h:1"), -1);
    memset(longhost, 'h', sizeof longhost);
    memcpy(longhost, "ASK 1 ", 6);
    snprintf(longhost + 300, sizeof longhost - 300, ":6379");
    T_EQ(PR(longhost), -1);                                            /* host too long */
    T_EQ(pgd__rc_parse_redirect("MOVED 1 h:12345", 12, &slot, &a), 1); /* len bounds it */
    T_EQ(a.port, 12);
#undef PR
    return 0;
}

/* Built replies for parse_slots (freed with free_built). */
static redisReply *b_int(long long v)
{
    redisReply *r = calloc(1, sizeof *r);
    r->type = REDIS_REPLY_INTEGER;
    r->integer = v;
    return r;
}

static redisReply *b_str(const char *s)
{
    redisReply *r = calloc(1, sizeof *r);
    r->type = REDIS_REPLY_STRING;
    r->len = strlen(s);
    r->str = strdup(s);
    return r;
}

static redisReply *b_arr(size_t n, ...)
{
    redisReply *r = calloc(1, sizeof *r);
    va_list ap;
    r->type = REDIS_REPLY_ARRAY;
    r->elements = n;
    r->element = calloc(n ? n : 1, sizeof *r->element);
    va_start(ap, n);
    for (size_t i = 0; i < n; i++)
        r->element[i] = va_arg(ap, redisReply *);
    va_end(ap);
    return r;
}

static void free_built(redisReply *r)
{
    if (!r) return;
    for (size_t i = 0; i < r->elements; i++)
        free_built(r->element[i]);
    free(r->element);
    free(r->str);
    free(r);
}

/* A one-range reply [lo, hi, [host, port, id]]. */
static redisReply *b_range(long long lo, long long hi, redisReply *host, redisReply *port)
{
    return b_arr(1, b_arr(3, b_int(lo), b_int(hi), b_arr(3, host, port, b_str("id"))));
}

static int test_parse_slots_built(void)
{
    pgd__rc_range out[4];
    redisReply *r;

    r = b_arr(2,
              b_arr(4, b_int(0), b_int(8191), b_arr(3, b_str("10.0.0.1"), b_int(7000), b_str("a")),
                    b_arr(2, b_str("10.0.0.9"), b_int(7009))), /* a replica: ignored */
              b_arr(3, b_int(8192), b_int(16383), b_arr(2, b_str("?"), b_int(7001))));
    T_EQ(pgd__rc_parse_slots(r, "seed.example", out, 4), 2);
    T_EQ(out[0].lo, 0);
    T_EQ(out[0].hi, 8191);
    T_ASSERT(strcmp(out[0].master.host, "10.0.0.1") == 0);
    T_EQ(out[0].master.port, 7000);
    T_ASSERT(strcmp(out[1].master.host, "seed.example") == 0); /* "?": the fallback */
    T_EQ(out[1].master.port, 7001);
    T_EQ(pgd__rc_parse_slots(r, "x", out, 1), -1); /* more ranges than cap */
    free_built(r);

    r = b_range(5, 5, b_str(""), b_int(1));
    T_EQ(pgd__rc_parse_slots(r, "h", out, 4), 1);
    T_ASSERT(strcmp(out[0].master.host, "h") == 0);
    T_EQ(pgd__rc_parse_slots(r, NULL, out, 4), -1); /* empty host, no fallback */
    free_built(r);
    r = b_arr(0);
    T_EQ(pgd__rc_parse_slots(r, "h", out, 4), 0);
    free_built(r);
    T_EQ(pgd__rc_parse_slots(NULL, "h", out, 4), -1);

    /* malformed: each is -1 */
    {
        redisReply *bad[] = {
            b_int(3),
            b_arr(1, b_int(1)),
            b_range(10, 9, b_str("h"), b_int(1)),                         /* lo > hi */
            b_range(0, 16384, b_str("h"), b_int(1)),                      /* hi out of range */
            b_range(-1, 5, b_str("h"), b_int(1)),                         /* negative */
            b_range(0, 5, b_str("h"), b_int(0)),                          /* port 0 */
            b_range(0, 5, b_str("h"), b_int(70000)),                      /* port out of range */
            b_range(0, 5, b_str("h"), b_str("6379")),                     /* port of another type */
            b_range(0, 5, b_int(1), b_int(6379)),                         /* host of another type */
            b_arr(1, b_arr(2, b_int(0), b_int(5))),                       /* no master */
            b_arr(1, b_arr(3, b_int(0), b_int(5), b_arr(1, b_str("h")))), /* no port */
            b_arr(1, b_arr(3, b_str("0"), b_int(5), b_arr(2, b_str("h"), b_int(1)))),
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            if (pgd__rc_parse_slots(bad[i], "h", out, 4) != -1) T_FAIL("bad reply %zu parsed", i);
            free_built(bad[i]);
        }
    }
    {
        char host[300];
        memset(host, 'h', sizeof host - 1);
        host[sizeof host - 1] = '\0';
        r = b_range(0, 5, b_str(host), b_int(1)); /* host too long */
        T_EQ(pgd__rc_parse_slots(r, "h", out, 4), -1);
        free_built(r);
    }
    return 0;
}

/* ---- standalone ---- */

static int test_standalone_pipeline(void)
{
    enum { N = 500, VAL = 64 * 1024 };
    t_redis r;
    pgd__rc_addr seed;
    pgd__rc_params p;
    pgd__rc *rc = NULL;
    pgd__rc_cmd *cmds = calloc(2 * N, sizeof *cmds);
    char(*keys)[32] = calloc(N, sizeof *keys);
    char *vals = malloc((size_t)N * VAL);
    const char *(*argv)[3] = calloc(2 * N, sizeof *argv);
    size_t(*lens)[3] = calloc(2 * N, sizeof *lens);
    pgd__rc_stats st;
    char err[256];
    uint64_t t0;
    size_t ok;

    T_ASSERT(cmds && keys && vals && argv && lens);
    T_EQ(t_redis_start(&r, NULL), 0);
    p = params_for(&seed, r.port, NULL);
    T_EQ(pgd__rc_create(&p, &rc, err, sizeof err), PGD_OK);
    pgd__rc_get_stats(rc, &st);
    T_EQ(st.cluster, 0);
    T_EQ(st.n_nodes, 1);
    T_EQ(st.n_nodes_up, 1);
    for (int i = 0; i < N; i++) {
        snprintf(keys[i], sizeof keys[i], "k%d", i);
        memset(vals + (size_t)i * VAL, 'a' + i % 26, VAL);
        memcpy(vals + (size_t)i * VAL, keys[i], strlen(keys[i]));
        argv[i][0] = "SET";
        argv[i][1] = keys[i];
        argv[i][2] = vals + (size_t)i * VAL;
        lens[i][0] = 3;
        lens[i][1] = strlen(keys[i]);
        lens[i][2] = VAL;
        cmds[i] = (pgd__rc_cmd){.argc = 3, .argv = argv[i], .argvlen = lens[i], .key = 1};
        argv[N + i][0] = "GET";
        argv[N + i][1] = keys[i];
        lens[N + i][0] = 3;
        lens[N + i][1] = strlen(keys[i]);
        cmds[N + i] =
            (pgd__rc_cmd){.argc = 2, .argv = argv[N + i], .argvlen = lens[N + i], .key = 1};
    }
    t0 = pgd__tier_now_ns();
    ok = pgd__rc_exec(rc, cmds, 2 * N, pgd__tier_now_ns() + 20000000000ull);
    printf("     1000-command pipeline, 64 KiB values: %llu ms\n",
           (unsigned long long)ms_since(t0));
    T_EQ(ok, 2 * N);
    for (int i = 0; i < 2 * N; i++) {
        redisReply *rep = cmds[i].reply;
        T_EQ(cmds[i].status, PGD_OK);
        if (i < N)
            T_ASSERT(rep->type == REDIS_REPLY_STATUS && strcmp(rep->str, "OK") == 0);
        else
            T_ASSERT(rep->type == REDIS_REPLY_STRING && rep->len == VAL &&
                     memcmp(rep->str, vals + (size_t)(i - N) * VAL, VAL) == 0);
        freeReplyObject(rep);
    }
    { /* key -1 goes to any node: PING */
        const char *pa[1] = {"PING"};
        redisReply *rep = pgd__rc_command(rc, -1, 1, pa);
        T_ASSERT(rep && rep->type == REDIS_REPLY_STATUS && strcmp(rep->str, "PONG") == 0);
        freeReplyObject(rep);
    }
    { /* a bad command: PGD_EINVAL, the others run */
        pgd__rc_cmd two[2] = {{.argc = 0}, cmds[N]};
        T_EQ(pgd__rc_exec(rc, two, 2, 0), 1);
        T_EQ(two[0].status, PGD_EINVAL);
        T_ASSERT(two[1].reply && two[1].reply->len == VAL);
        freeReplyObject(two[1].reply);
    }
    pgd__rc_destroy(rc);
    pgd__rc_destroy(NULL);
    t_redis_stop(&r);
    free(cmds);
    free(keys);
    free(vals);
    free(argv);
    free(lens);
    return 0;
}

static int test_standalone_auth(void)
{
    static const char *const pw[] = {"--requirepass", "right", NULL};
    t_redis r;
    pgd__rc_addr seed;
    pgd__rc_params p;
    pgd__rc *rc = NULL;
    char err[256], buf[64];
    redisReply *rep;

    T_EQ(t_redis_start(&r, pw), 0);
    p = params_for(&seed, r.port, NULL);
    p.password = "right";
    T_EQ(pgd__rc_create(&p, &rc, err, sizeof err), PGD_OK);
    T_EQ(rc_set(rc, "a", "1"), 0);
    T_EQ(rc_get(rc, "a", buf, sizeof buf), 1);
    T_ASSERT(strcmp(buf, "1") == 0);
    pgd__rc_destroy(rc);

    p.password = "wrong";
    T_EQ(pgd__rc_create(&p, &rc, err, sizeof err), PGD_EINVAL);
    T_ASSERT(rc == NULL);
    printf("     wrong password: %s\n", err);
    T_ASSERT(strstr(err, "WRONGPASS") || strstr(err, "invalid password"));
    p.password = NULL;
    T_EQ(pgd__rc_create(&p, &rc, err, sizeof err), PGD_EINVAL);
    printf("     no password: %s\n", err);
    T_ASSERT(strstr(err, "NOAUTH"));

    /* an ACL user */
    rep = t_redis_cmd(&r, "ACL SETUSER pgd on >pw ~* +@all");
    T_ASSERT(t_redis_ok(rep));
    p.user = "pgd";
    p.password = "pw";
    T_EQ(pgd__rc_create(&p, &rc, err, sizeof err), PGD_OK);
    T_EQ(rc_set(rc, "b", "2"), 0);
    rep = t_redis_cmd(&r, "GET b");
    T_ASSERT(rep && rep->type == REDIS_REPLY_STRING && strcmp(rep->str, "2") == 0);
    freeReplyObject(rep);
    pgd__rc_destroy(rc);
    p.user = "nobody";
    T_EQ(pgd__rc_create(&p, &rc, err, sizeof err), PGD_EINVAL);
    T_ASSERT(strstr(err, "WRONGPASS"));
    p.user = "pgd";
    p.password = "nope";
    T_EQ(pgd__rc_create(&p, &rc, err, sizeof err), PGD_EINVAL);
    T_ASSERT(strstr(err, "WRONGPASS"));
    t_redis_stop(&r);
    return 0;
}

static int test_standalone_select(void)
{
    t_redis r;
    pgd__rc_addr seed;
    pgd__rc_params p;
    pgd__rc *rc3 = NULL, *rc0 = NULL;
    char err[256], buf[64];
    redisContext *c;
    redisReply *rep;

    T_EQ(t_redis_start(&r, NULL), 0);
    p = params_for(&seed, r.port, NULL);
    p.db = 3;
    T_EQ(pgd__rc_create(&p, &rc3, err, sizeof err), PGD_OK);
    p.db = 0;
    T_EQ(pgd__rc_create(&p, &rc0, err, sizeof err), PGD_OK);
    T_EQ(rc_set(rc3, "iso", "three"), 0);
    T_EQ(rc_get(rc0, "iso", buf, sizeof buf), 0); /* not in db 0 */
    T_EQ(rc_get(rc3, "iso", buf, sizeof buf), 1);
    c = t_redis_connect(&r);
    T_ASSERT(c);
    rep = redisCommand(c, "SELECT 3");
    T_ASSERT(t_redis_ok(rep));
    rep = redisCommand(c, "GET iso");
    T_ASSERT(rep && rep->type == REDIS_REPLY_STRING && strcmp(rep->str, "three") == 0);
    freeReplyObject(rep);
    redisFree(c);
    pgd__rc_destroy(rc3);
    pgd__rc_destroy(rc0);
    p.db = 99; /* out of range: refused */
    T_EQ(pgd__rc_create(&p, &rc3, err, sizeof err), PGD_EINVAL);
    printf("     SELECT 99: %s\n", err);
    p.db = 0;
    p.cluster = 1; /* forced on a standalone server */
    T_EQ(pgd__rc_create(&p, &rc3, err, sizeof err), PGD_EINVAL);
    t_redis_stop(&r);
    return 0;
}

static int test_standalone_faults(void)
{
    t_redis r;
    pgd__rc_addr seed;
    pgd__rc_params p;
    pgd__rc *rc = NULL;
    pgd__rc_stats st;
    char err[256], buf[64];
    const char *argv[2] = {"GET", "x"};
    size_t lens[2] = {3, 1};
    pgd__rc_cmd cmd;
    uint64_t t0, dl;
    int up = 0;

    T_EQ(t_redis_start(&r, NULL), 0);
    p = params_for(&seed, r.port, NULL);
    T_EQ(pgd__rc_create(&p, &rc, err, sizeof err), PGD_OK);
    T_EQ(rc_set(rc, "x", "1"), 0);

    /* a hung server: the deadline bounds the call */
    t_redis_pause(&r, 1);
    t0 = pgd__tier_now_ns();
    dl = t0 + 300000000ull;
    cmd = (pgd__rc_cmd){.argc = 2, .argv = argv, .argvlen = lens, .key = 1};
    T_EQ(pgd__rc_exec(rc, &cmd, 1, dl), 0);
    T_ASSERT(pgd__tier_now_ns() < dl + 100000000ull);
    T_EQ(cmd.status, PGD_EIO);
    T_ASSERT(cmd.timed_out);
    T_ASSERT(cmd.reply == NULL);
    pgd__rc_get_stats(rc, &st);
    T_ASSERT(st.n_timeouts > 0);
    T_EQ(st.n_nodes_up, 0);
    t_redis_pause(&r, 0);
    for (t0 = pgd__tier_now_ns(); ms_since(t0) < 6000 && !up; usleep(10000))
        up = pgd__rc_tick(rc) == 1;
    T_ASSERT(up);
    T_EQ(rc_get(rc, "x", buf, sizeof buf), 1);

    /* kill -9: the first command finds the connection dead, the next ones fail at once */
    t_redis_kill9(&r);
    T_ASSERT(rc_get(rc, "x", buf, sizeof buf) == -1);
    pgd__rc_get_stats(rc, &st);
    T_EQ(st.n_nodes_up, 0);
    t0 = pgd__tier_now_ns();
    for (int i = 0; i < 100; i++) {
        cmd = (pgd__rc_cmd){.argc = 2, .argv = argv, .argvlen = lens, .key = 1};
        T_EQ(pgd__rc_exec(rc, &cmd, 1, 0), 0);
        T_EQ(cmd.status, PGD_EIO);
        T_EQ(cmd.timed_out, 0);
    }
    T_ASSERT(ms_since(t0) < 50);  /* no connection attempt, no wait */
    for (int i = 0; i < 5; i++) { /* tick tries (refused) with backoff */
        T_EQ(pgd__rc_tick(rc), 0);
        usleep(20000);
    }
    pgd__rc_get_stats(rc, &st);
    T_ASSERT(st.n_connect_failures > 0);
    T_EQ(t_redis_restart(&r), 0); /* empty */
    up = 0;
    for (t0 = pgd__tier_now_ns(); ms_since(t0) < 6000 && !up; usleep(10000))
        up = pgd__rc_tick(rc) == 1;
    printf("     reconnected %llu ms after the restart\n", (unsigned long long)ms_since(t0));
    T_ASSERT(up);
    pgd__rc_get_stats(rc, &st);
    T_ASSERT(st.n_reconnects > 0);
    T_EQ(st.n_nodes_up, 1);
    T_EQ(rc_get(rc, "x", buf, sizeof buf), 0); /* restarted empty */
    T_EQ(rc_set(rc, "x", "2"), 0);
    T_EQ(rc_get(rc, "x", buf, sizeof buf), 1);
    pgd__rc_destroy(rc);

    /* no server at all: PGD_EIO naming the node */
    t_redis_stop(&r);
    T_EQ(pgd__rc_create(&p, &rc, err, sizeof err), PGD_EIO);
    T_ASSERT(strstr(err, "127.0.0.1:"));
    return 0;
}

static int test_standalone_unix(void)
{
    static const char *const us[] = {"--unixsocket", "@DIR@/s", NULL};
    t_redis r;
    pgd__rc_addr seed;
    pgd__rc_params p;
    pgd__rc *rc = NULL;
    char err[256], path[256], buf[64];

    T_EQ(t_redis_start(&r, us), 0);
    snprintf(path, sizeof path, "%s/s", r.dir);
    p = params_for(&seed, 0, path);
    T_EQ(pgd__rc_create(&p, &rc, err, sizeof err), PGD_OK);
    T_EQ(rc_set(rc, "u", "nix"), 0);
    T_EQ(rc_get(rc, "u", buf, sizeof buf), 1);
    T_ASSERT(strcmp(buf, "nix") == 0);
    pgd__rc_destroy(rc);
    t_redis_stop(&r);
    return 0;
}

/* Threads sharing a pool of 2 connections: every batch comes back whole. */
typedef struct th_arg {
    pgd__rc *rc;
    int id, failed;
} th_arg;

static void *th_main(void *arg)
{
    th_arg *a = arg;
    for (int it = 0; it < 300; it++) {
        char key[8][32], val[8][32];
        const char *argv[16][3];
        size_t lens[16][3];
        pgd__rc_cmd cmds[16];
        for (int i = 0; i < 8; i++) {
            snprintf(key[i], sizeof key[i], "t%d:%d", a->id, i);
            snprintf(val[i], sizeof val[i], "v%d", it);
            argv[i][0] = "SET";
            argv[i][1] = key[i];
            argv[i][2] = val[i];
            argv[8 + i][0] = "GET";
            argv[8 + i][1] = key[i];
            for (int j = 0; j < 3; j++) {
                lens[i][j] = strlen(argv[i][j]);
                lens[8 + i][j] = j < 2 ? strlen(argv[8 + i][j]) : 0;
            }
            cmds[i] = (pgd__rc_cmd){.argc = 3, .argv = argv[i], .argvlen = lens[i], .key = 1};
            cmds[8 + i] =
                (pgd__rc_cmd){.argc = 2, .argv = argv[8 + i], .argvlen = lens[8 + i], .key = 1};
        }
        if (pgd__rc_exec(a->rc, cmds, 16, 0) != 16) a->failed++;
        for (int i = 0; i < 16; i++) {
            redisReply *r = cmds[i].reply;
            if (i >= 8 && (!r || r->type != REDIS_REPLY_STRING || strcmp(r->str, val[i - 8]) != 0))
                a->failed++;
            if (r) freeReplyObject(r);
        }
        if (it % 50 == 0) pgd__rc_tick(a->rc);
    }
    return NULL;
}

static int test_standalone_threads(void)
{
    t_redis r;
    pgd__rc_addr seed;
    pgd__rc_params p;
    pgd__rc *rc = NULL;
    char err[256];
    pthread_t th[4];
    th_arg a[4];

    T_EQ(t_redis_start(&r, NULL), 0);
    p = params_for(&seed, r.port, NULL);
    p.conns = 2;
    T_EQ(pgd__rc_create(&p, &rc, err, sizeof err), PGD_OK);
    for (int i = 0; i < 4; i++) {
        a[i] = (th_arg){rc, i, 0};
        T_EQ(pthread_create(&th[i], NULL, th_main, &a[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        T_EQ(a[i].failed, 0);
    }
    pgd__rc_destroy(rc);
    t_redis_stop(&r);
    return 0;
}

/* Round trips per second on loopback: 1-command execs against 100-command pipelines. */
static int test_standalone_rate(void)
{
    t_redis r;
    pgd__rc_addr seed;
    pgd__rc_params p;
    pgd__rc *rc = NULL;
    char err[256];
    const char *argv[2] = {"GET", "rate"};
    size_t lens[2] = {3, 4};
    pgd__rc_cmd cmds[100];
    uint64_t t0, n1 = 0, n100 = 0;
    double s1, s100;

    T_EQ(t_redis_start(&r, NULL), 0);
    p = params_for(&seed, r.port, NULL);
    T_EQ(pgd__rc_create(&p, &rc, err, sizeof err), PGD_OK);
    T_EQ(rc_set(rc, "rate", "0123456789"), 0);
    t0 = pgd__tier_now_ns();
    while (ms_since(t0) < 500) {
        cmds[0] = (pgd__rc_cmd){.argc = 2, .argv = argv, .argvlen = lens, .key = 1};
        T_EQ(pgd__rc_exec(rc, cmds, 1, 0), 1);
        freeReplyObject(cmds[0].reply);
        n1++;
    }
    s1 = (double)(pgd__tier_now_ns() - t0) * 1e-9;
    t0 = pgd__tier_now_ns();
    while (ms_since(t0) < 500) {
        for (int i = 0; i < 100; i++)
            cmds[i] = (pgd__rc_cmd){.argc = 2, .argv = argv, .argvlen = lens, .key = 1};
        T_EQ(pgd__rc_exec(rc, cmds, 100, 0), 100);
        for (int i = 0; i < 100; i++)
            freeReplyObject(cmds[i].reply);
        n100++;
    }
    s100 = (double)(pgd__tier_now_ns() - t0) * 1e-9;
    printf("     loopback: 1-command exec %.0f round trips/s (%.0f cmds/s); 100-command "
           "pipeline %.0f round trips/s (%.0f cmds/s)\n",
           (double)n1 / s1, (double)n1 / s1, (double)n100 / s100, 100.0 * (double)n100 / s100);
    pgd__rc_destroy(rc);
    t_redis_stop(&r);
    return 0;
}

int main(void)
{
    pgd__alloc_init(&libc_al, NULL);
    if (!t_redis_available()) T_SKIP("redis-server / redis-cli not installed");
    T_RUN(test_launcher_standalone);
    T_RUN(test_launcher_unix_socket);
    T_RUN(test_launcher_cluster);
    T_RUN(test_launcher_proxy);
    T_RUN(test_crc16_and_slots);
    T_RUN(test_parse_redirect);
    T_RUN(test_parse_slots_built);
    T_RUN(test_standalone_pipeline);
    T_RUN(test_standalone_auth);
    T_RUN(test_standalone_select);
    T_RUN(test_standalone_faults);
    T_RUN(test_standalone_unix);
    T_RUN(test_standalone_threads);
    T_RUN(test_standalone_rate);
    T_DONE();
}
