/* SPDX-License-Identifier: MIT */
/*
 * test_rclient.c - the Redis client (src/tier/redis/rclient.c) and the launcher every
 * Redis test uses (tests/t_redis.h), against real redis-server processes on 127.0.0.1
 * (ephemeral ports, temp dirs, stopped by the test). Skips (77) without redis-server.
 *
 * The launcher: a server starts, answers, remembers its password, survives kill -9 +
 * restart on its port, hangs when paused; a 3-master cluster forms and a slot migrates
 * by its helpers; the delaying proxy forwards after its delay.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "t.h"
#include "t_redis.h"

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

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    if (!t_redis_available()) T_SKIP("redis-server / redis-cli not installed");
    T_RUN(test_launcher_standalone);
    T_RUN(test_launcher_unix_socket);
    T_RUN(test_launcher_cluster);
    T_RUN(test_launcher_proxy);
    T_DONE();
}
