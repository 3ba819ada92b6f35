/* SPDX-License-Identifier: MIT */
/*
 * t_redis.h - the real redis-server processes of the Redis tests (tests/redis/, the Redis
 * tier's server and bench tests): every server runs on 127.0.0.1 on an ephemeral port
 * (never 6379), with --save "" --appendonly no, in a temp dir of its own, and is stopped by
 * the test (also on failure paths; PR_SET_PDEATHSIG kills it if the test dies first).
 *
 *   t_redis_available   redis-server and redis-cli on PATH (else a test prints why, exits 77)
 *   t_redis_start/stop  one server: free port, temp dir, waits (10 s at most) for PING
 *   t_redis_kill9, t_redis_restart, t_redis_pause    faults: crash, restart empty, hang
 *   t_redis_cmd, t_redis_cmdargv    one command on a fresh connection (2 s timeout, AUTH)
 *   t_cluster_*         n masters (--cluster-enabled, redis-cli --cluster create), waits
 *                       for cluster_state:ok everywhere and one slot map; slot migration
 *                       in steps (begin, keys, end) so a test keeps load running meanwhile
 *   t_proxy_*           a delaying TCP proxy (one poll loop thread): "Redis is slow"
 *
 * In extra args, "@DIR@" stands for the server's temp dir (e.g. "--unixsocket", "@DIR@/s").
 * A server started with --requirepass remembers the password: t_redis_cmd AUTHs with it.
 * PR_SET_PDEATHSIG fires when the thread that forked exits: start servers from the main
 * thread. Every wait is bounded. Header-only (static functions), like t.h; needs
 * _GNU_SOURCE defined before the first system header (prctl, nftw, mkdtemp), and hiredis
 * (every test that links pagoda built with PGD_WITH_REDIS has it).
 */
#ifndef PGD_TESTS_T_REDIS_H
#define PGD_TESTS_T_REDIS_H

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "t_dir.h"

#define T_REDIS_MAX_ARGS 48
#define T_REDIS_START_S 10   /* bound on a server's start (PING answered) */
#define T_REDIS_STOP_S 5     /* bound on a SIGTERM stop, then SIGKILL */
#define T_REDIS_CMD_MS 2000  /* t_redis_cmd's connect and command timeout */
#define T_CLUSTER_READY_S 30 /* bound on redis-cli --cluster create + cluster_state:ok */

typedef struct t_redis {
    pid_t pid;                              /* 0: not running */
    int port;                               /* 127.0.0.1:port */
    int paused;                             /* SIGSTOPped */
    char dir[128];                          /* the temp dir (--dir), removed by t_redis_stop */
    char password[128];                     /* --requirepass's value, "" when none */
    char exe[256];                          /* redis-server's path */
    const char *args[T_REDIS_MAX_ARGS + 1]; /* the whole argv (into argbuf), for restarts */
    char argbuf[4096];
} t_redis;

static inline uint64_t t_redis_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static inline void t_redis_sleep_ms(unsigned ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Writes the path of an executable name found on $PATH into buf. Returns 1, or 0. */
static inline int t_redis_which(const char *name, char *buf, size_t len)
{
    const char *path = getenv("PATH");
    const char *p = path && *path ? path : "/usr/local/bin:/usr/bin:/bin";
    while (*p) {
        const char *e = strchr(p, ':');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n > 0 && n + strlen(name) + 2 <= len) {
            memcpy(buf, p, n);
            buf[n] = '/';
            memcpy(buf + n + 1, name, strlen(name) + 1);
            if (access(buf, X_OK) == 0) return 1;
        }
        p += n;
        if (*p == ':') p++;
    }
    return 0;
}

/* 1 when redis-server and redis-cli are on PATH, else 0 (with the reason on stderr). */
static inline int t_redis_available(void)
{
    char b[256];
    if (!t_redis_which("redis-server", b, sizeof b)) {
        fprintf(stderr, "skip: redis-server not found on PATH (apt-get install redis-server)\n");
        return 0;
    }
    if (!t_redis_which("redis-cli", b, sizeof b)) {
        fprintf(stderr, "skip: redis-cli not found on PATH (apt-get install redis-tools)\n");
        return 0;
    }
    return 1;
}

/* A port that was free a moment ago on 127.0.0.1 (bind :0, getsockname, close), at most
 * max_port (a cluster node needs port + 10000 for its bus). Returns it, or -1. */
static inline int t_redis_free_port(int max_port)
{
    for (int tries = 0; tries < 200; tries++) {
        struct sockaddr_in a;
        socklen_t al = sizeof a;
        int port = -1, fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0) return -1;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = 0;
        if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
            getsockname(fd, (struct sockaddr *)&a, &al) == 0)
            port = ntohs(a.sin_port);
        close(fd);
        if (port > 0 && port != 6379 && port <= max_port) return port;
    }
    return -1;
}

/* A fresh connection to r (timeout T_REDIS_CMD_MS, AUTH with r's password). NULL: none. */
static inline redisContext *t_redis_connect(const t_redis *r)
{
    struct timeval tv = {T_REDIS_CMD_MS / 1000, (T_REDIS_CMD_MS % 1000) * 1000};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port, tv);
    if (!c || c->err) {
        if (c) redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv);
    if (r->password[0]) {
        redisReply *a = redisCommand(c, "AUTH %s", r->password);
        int ok = a && a->type == REDIS_REPLY_STATUS;
        if (a) freeReplyObject(a);
        if (!ok) {
            redisFree(c);
            return NULL;
        }
    }
    return c;
}

/* One command (hiredis format) on a fresh connection to r. Returns the reply (the caller
 * frees it with freeReplyObject; it may be an error reply), or NULL (no connection, I/O
 * error, timeout). */
static inline redisReply *t_redis_cmd(const t_redis *r, const char *fmt, ...)
{
    redisContext *c = t_redis_connect(r);
    redisReply *rep;
    va_list ap;
    if (!c) return NULL;
    va_start(ap, fmt);
    rep = redisvCommand(c, fmt, ap);
    va_end(ap);
    redisFree(c);
    return rep;
}

/* t_redis_cmd with an argument vector (argvlen NULL: strlen of each). */
static inline redisReply *t_redis_cmdargv(const t_redis *r, int argc, const char **argv,
                                          const size_t *argvlen)
{
    redisContext *c = t_redis_connect(r);
    redisReply *rep;
    if (!c) return NULL;
    rep = redisCommandArgv(c, argc, argv, argvlen);
    redisFree(c);
    return rep;
}

/* 1 when r answers PING with PONG or NOAUTH (a password is set), else 0. One attempt. */
static inline int t_redis_pings(const t_redis *r)
{
    struct timeval tv = {0, 300000};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port, tv);
    redisReply *rep;
    int ok = 0;
    if (!c || c->err) {
        if (c) redisFree(c);
        return 0;
    }
    redisSetTimeout(c, tv);
    rep = redisCommand(c, "PING");
    if (rep) {
        ok = (rep->type == REDIS_REPLY_STATUS && strcmp(rep->str, "PONG") == 0) ||
             (rep->type == REDIS_REPLY_ERROR && strncmp(rep->str, "NOAUTH", 6) == 0);
        freeReplyObject(rep);
    }
    redisFree(c);
    return ok;
}

/* Waits (bounded by ms) for pid to exit. Returns 1 when it did (reaped), else 0. */
static inline int t_redis_reap(pid_t pid, unsigned ms)
{
    uint64_t end = t_redis_now_ms() + ms;
    for (;;) {
        int st;
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid || (w < 0 && errno == ECHILD)) return 1;
        if (t_redis_now_ms() >= end) return 0;
        t_redis_sleep_ms(5);
    }
}

/* Forks and execs r->args (stdout and stderr into DIR/redis.log), then waits until PING
 * answers. Returns 0; -1 when the server exited or did not answer within T_REDIS_START_S
 * (then it is killed and reaped). */
static inline int t_redis_spawn(t_redis *r)
{
    char log[200];
    pid_t parent = getpid(), pid;
    uint64_t end;
    int fd;

    snprintf(log, sizeof log, "%s/redis.log", r->dir);
    fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    fflush(NULL);
    pid = fork();
    if (pid < 0) {
        close(fd);
        return -1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127); /* the test died before prctl */
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        execv(r->exe, (char *const *)r->args);
        _exit(127);
    }
    close(fd);
    r->pid = pid;
    r->paused = 0;
    end = t_redis_now_ms() + T_REDIS_START_S * 1000u;
    for (;;) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            r->pid = 0;
            return -1;
        }
        if (t_redis_pings(r)) return 0;
        if (t_redis_now_ms() >= end) break;
        t_redis_sleep_ms(10);
    }
    kill(pid, SIGKILL);
    t_redis_reap(pid, 5000);
    r->pid = 0;
    return -1;
}

/* Prints the server's log (the reason of a failed start) to stderr. */
static inline void t_redis_print_log(const t_redis *r)
{
    char path[200], line[512];
    FILE *f;
    snprintf(path, sizeof path, "%s/redis.log", r->dir);
    f = fopen(path, "r");
    if (!f) return;
    while (fgets(line, sizeof line, f))
        fprintf(stderr, "  redis.log: %s", line);
    fclose(f);
}

/* Builds r->args: redis-server --port P ... then extra_args ("@DIR@" expanded). Returns
 * 0, or -1 when they do not fit. */
static inline int t_redis_build_args(t_redis *r, const char *const *extra_args)
{
    char portstr[16];
    const char *base[] = {r->exe, "--port",       portstr,  "--bind", "127.0.0.1", "--save",
                          "",     "--appendonly", "no",     "--dir",  r->dir,      "--daemonize",
                          "no",   "--loglevel",   "warning"};
    size_t nb = sizeof base / sizeof base[0], used = 0, n = 0;

    snprintf(portstr, sizeof portstr, "%d", r->port);
    r->password[0] = '\0';
    for (size_t i = 0; i < nb + T_REDIS_MAX_ARGS; i++) {
        const char *a = i < nb ? base[i] : (extra_args ? extra_args[i - nb] : NULL);
        const char *at;
        size_t len;
        if (!a) break;
        if (n >= T_REDIS_MAX_ARGS) return -1;
        at = strstr(a, "@DIR@");
        if (at)
            len = (size_t)snprintf(r->argbuf + used, sizeof r->argbuf - used, "%.*s%s%s",
                                   (int)(at - a), a, r->dir, at + 5);
        else
            len = (size_t)snprintf(r->argbuf + used, sizeof r->argbuf - used, "%s", a);
        if (used + len + 1 > sizeof r->argbuf) return -1;
        r->args[n++] = r->argbuf + used;
        used += len + 1;
        if (n >= 2 && strcmp(r->args[n - 2], "--requirepass") == 0 && i >= nb)
            snprintf(r->password, sizeof r->password, "%s", r->args[n - 1]);
    }
    r->args[n] = NULL;
    return 0;
}

/* Starts a redis-server (see the file comment) with extra_args (NULL-terminated, may be
 * NULL). Picks a free port, retrying the start up to 5 times (another process may take
 * the port between the probe and the bind). Returns 0, or -1 with a message on stderr (r
 * then holds nothing to stop, but t_redis_stop on it is harmless). */
static inline int t_redis_start(t_redis *r, const char *const *extra_args)
{
    const char *tmp = getenv("TMPDIR");
    int max_port = 65535;

    memset(r, 0, sizeof *r);
    if (!t_redis_which("redis-server", r->exe, sizeof r->exe)) {
        fprintf(stderr, "t_redis_start: redis-server not found\n");
        return -1;
    }
    for (size_t i = 0; extra_args && extra_args[i]; i++)
        if (strcmp(extra_args[i], "--cluster-enabled") == 0) max_port = 65535 - 10000;
    snprintf(r->dir, sizeof r->dir, "%s/pgd-redis.XXXXXX",
             tmp && *tmp && strlen(tmp) < 60 ? tmp : "/tmp");
    if (!mkdtemp(r->dir)) {
        fprintf(stderr, "t_redis_start: mkdtemp %s: %s\n", r->dir, strerror(errno));
        r->dir[0] = '\0';
        return -1;
    }
    for (int attempt = 0; attempt < 5; attempt++) {
        r->port = t_redis_free_port(max_port);
        if (r->port < 0) break;
        if (t_redis_build_args(r, extra_args) != 0) {
            fprintf(stderr, "t_redis_start: too many or too long arguments\n");
            break;
        }
        if (t_redis_spawn(r) == 0) return 0;
    }
    fprintf(stderr, "t_redis_start: redis-server did not start\n");
    t_redis_print_log(r);
    t_rm_rf(r->dir);
    r->dir[0] = '\0';
    return -1;
}

/* Kills r with SIGKILL (a crash) and reaps it; the temp dir stays (t_redis_restart). */
static inline void t_redis_kill9(t_redis *r)
{
    if (r->pid <= 0) return;
    kill(r->pid, SIGKILL);
    t_redis_reap(r->pid, 5000);
    r->pid = 0;
    r->paused = 0;
}

/* Stops r: SIGTERM, up to T_REDIS_STOP_S for the exit, then SIGKILL; removes the temp
 * dir. Safe on a stopped, failed or zeroed r. */
static inline void t_redis_stop(t_redis *r)
{
    if (r->pid > 0) {
        if (r->paused) kill(r->pid, SIGCONT);
        kill(r->pid, SIGTERM);
        if (!t_redis_reap(r->pid, T_REDIS_STOP_S * 1000u)) t_redis_kill9(r);
        r->pid = 0;
        r->paused = 0;
    }
    if (r->dir[0]) {
        t_rm_rf(r->dir);
        r->dir[0] = '\0';
    }
}

/* Restarts r on the same port with the same arguments, empty (kills it first when it
 * runs; a cluster node keeps its nodes.conf, so its identity). Retries for ~3 s while the
 * port is still taken. Returns 0, or -1. */
static inline int t_redis_restart(t_redis *r)
{
    t_redis_kill9(r);
    for (int attempt = 0; attempt < 10; attempt++) {
        if (t_redis_spawn(r) == 0) return 0;
        t_redis_sleep_ms(300);
    }
    fprintf(stderr, "t_redis_restart: redis-server did not restart on port %d\n", r->port);
    t_redis_print_log(r);
    return -1;
}

/* Freezes (on: SIGSTOP) or thaws (SIGCONT) r: a hung server that still holds its
 * connections open. */
static inline void t_redis_pause(t_redis *r, int on)
{
    if (r->pid <= 0) return;
    kill(r->pid, on ? SIGSTOP : SIGCONT);
    r->paused = on;
}

/* ---- cluster ---- */

typedef struct t_cluster {
    t_redis node[6];
    int n;
} t_cluster;

/* Stops every node. Safe on a half-started or zeroed c. */
static inline void t_cluster_stop(t_cluster *c)
{
    for (int i = 0; i < 6; i++)
        t_redis_stop(&c->node[i]);
    c->n = 0;
}

/* Runs argv (a NULL-terminated vector; argv[0] a path) with its output into log, waiting
 * at most ms. Returns the exit status, or -1 (no start, a signal, killed at the bound). */
static inline int t_redis_run(const char *const *argv, const char *log, unsigned ms)
{
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644), st = 0;
    pid_t parent = getpid(), pid;
    uint64_t end = t_redis_now_ms() + ms;
    if (fd < 0) return -1;
    fflush(NULL);
    pid = fork();
    if (pid < 0) {
        close(fd);
        return -1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(fd);
    for (;;) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid) break;
        if (w < 0 && errno != EINTR) return -1;
        if (t_redis_now_ms() >= end) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        t_redis_sleep_ms(10);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Fills map[0..16384) with the port of each slot's master as node r sees it (CLUSTER
 * SLOTS; 0: no master). Returns 0, or -1 (no answer, a reply of another shape). */
static inline int t_cluster_slot_map(const t_redis *r, uint16_t *map)
{
    redisReply *rep = t_redis_cmd(r, "CLUSTER SLOTS");
    int rc = 0;
    memset(map, 0, 16384 * sizeof *map);
    if (!rep || rep->type != REDIS_REPLY_ARRAY) {
        if (rep) freeReplyObject(rep);
        return -1;
    }
    for (size_t i = 0; i < rep->elements; i++) {
        redisReply *e = rep->element[i];
        long long lo, hi, port;
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
            e->element[0]->type != REDIS_REPLY_INTEGER ||
            e->element[1]->type != REDIS_REPLY_INTEGER ||
            e->element[2]->type != REDIS_REPLY_ARRAY || e->element[2]->elements < 2 ||
            e->element[2]->element[1]->type != REDIS_REPLY_INTEGER) {
            rc = -1;
            break;
        }
        lo = e->element[0]->integer;
        hi = e->element[1]->integer;
        port = e->element[2]->element[1]->integer;
        if (lo < 0 || hi > 16383 || lo > hi || port <= 0 || port > 65535) {
            rc = -1;
            break;
        }
        for (long long s = lo; s <= hi; s++)
            map[s] = (uint16_t)port;
    }
    freeReplyObject(rep);
    return rc;
}

/* 1 when every node of c says cluster_state:ok and all have the same complete slot map. */
static inline int t_cluster_ready(const t_cluster *c)
{
    uint16_t *map0 = calloc(2 * 16384, sizeof *map0), *map = map0 + 16384;
    int ok = map0 != NULL;
    for (int i = 0; ok && i < c->n; i++) {
        redisReply *rep = t_redis_cmd(&c->node[i], "CLUSTER INFO");
        ok = rep && rep->type == REDIS_REPLY_STRING && strstr(rep->str, "cluster_state:ok");
        if (rep) freeReplyObject(rep);
        if (ok) ok = t_cluster_slot_map(&c->node[i], i ? map : map0) == 0;
        if (ok && i > 0) ok = memcmp(map, map0, 16384 * sizeof *map) == 0;
    }
    for (int s = 0; ok && s < 16384; s++)
        ok = map0[s] != 0;
    free(map0);
    return ok;
}

/* The node id of node i (CLUSTER MYID) into buf (41 bytes). Returns 0, or -1. */
static inline int t_cluster_node_id(const t_cluster *c, int i, char *buf, size_t len)
{
    redisReply *rep = t_redis_cmd(&c->node[i], "CLUSTER MYID");
    int ok = rep && rep->type == REDIS_REPLY_STRING && rep->len < len;
    if (ok) memcpy(buf, rep->str, rep->len + 1);
    if (rep) freeReplyObject(rep);
    return ok ? 0 : -1;
}

/* 1 when rep is the status reply OK, else 0; frees rep. */
static inline int t_redis_ok(redisReply *rep)
{
    int ok = rep && rep->type == REDIS_REPLY_STATUS && strcmp(rep->str, "OK") == 0;
    if (rep && !ok) fprintf(stderr, "redis: %s\n", rep->str ? rep->str : "(non-OK reply)");
    if (rep) freeReplyObject(rep);
    return ok;
}

/* Starts a cluster of n_masters (1..6) masters, no replicas: each a server with
 * --cluster-enabled yes --cluster-config-file DIR/nodes.conf --cluster-node-timeout 2000;
 * then `redis-cli --cluster create ... --cluster-replicas 0 --cluster-yes` (for fewer than
 * 3 masters, which redis-cli refuses, CLUSTER ADDSLOTSRANGE and MEET by hand); then waits
 * until every node says cluster_state:ok and all agree on the slot map. Returns 0, or -1
 * with a message (every node started is stopped). */
static inline int t_cluster_start(t_cluster *c, int n_masters)
{
    static const char *const args[] = {"--cluster-enabled",
                                       "yes",
                                       "--cluster-config-file",
                                       "@DIR@/nodes.conf",
                                       "--cluster-node-timeout",
                                       "2000",
                                       NULL};
    char cli[256], addr[6][32], log[200];
    const char *argv[16];
    int n = 0;
    uint64_t end;

    memset(c, 0, sizeof *c);
    if (n_masters < 1 || n_masters > 6) return -1;
    if (!t_redis_which("redis-cli", cli, sizeof cli)) {
        fprintf(stderr, "t_cluster_start: redis-cli not found\n");
        return -1;
    }
    for (int i = 0; i < n_masters; i++) {
        if (t_redis_start(&c->node[i], args) != 0) goto fail;
        c->n = i + 1;
        snprintf(addr[i], sizeof addr[i], "127.0.0.1:%d", c->node[i].port);
    }
    if (n_masters >= 3) {
        argv[n++] = cli;
        argv[n++] = "--cluster";
        argv[n++] = "create";
        for (int i = 0; i < n_masters; i++)
            argv[n++] = addr[i];
        argv[n++] = "--cluster-replicas";
        argv[n++] = "0";
        argv[n++] = "--cluster-yes";
        argv[n] = NULL;
        snprintf(log, sizeof log, "%s/cluster-create.log", c->node[0].dir);
        if (t_redis_run(argv, log, T_CLUSTER_READY_S * 1000u) != 0) {
            char line[512];
            FILE *f = fopen(log, "r");
            fprintf(stderr, "t_cluster_start: redis-cli --cluster create failed\n");
            while (f && fgets(line, sizeof line, f))
                fprintf(stderr, "  redis-cli: %s", line);
            if (f) fclose(f);
            goto fail;
        }
    } else {
        for (int i = 0; i < n_masters; i++) {
            int lo = 16384 * i / n_masters, hi = 16384 * (i + 1) / n_masters - 1;
            if (!t_redis_ok(t_redis_cmd(&c->node[i], "CLUSTER ADDSLOTSRANGE %d %d", lo, hi)))
                goto fail;
            if (i > 0 &&
                !t_redis_ok(t_redis_cmd(&c->node[i], "CLUSTER MEET 127.0.0.1 %d", c->node[0].port)))
                goto fail;
        }
    }
    end = t_redis_now_ms() + T_CLUSTER_READY_S * 1000u;
    while (!t_cluster_ready(c)) {
        if (t_redis_now_ms() >= end) {
            fprintf(stderr, "t_cluster_start: no cluster_state:ok within %d s\n",
                    T_CLUSTER_READY_S);
            goto fail;
        }
        t_redis_sleep_ms(50);
    }
    return 0;
fail:
    t_cluster_stop(c);
    return -1;
}

/* The index of the node that owns slot, as node 0 (or the first that answers) sees it;
 * -1 when none does. */
static inline int t_cluster_node_of_slot(const t_cluster *c, int slot)
{
    uint16_t *map = calloc(16384, sizeof *map);
    int owner = -1;
    if (!map || slot < 0 || slot >= 16384) {
        free(map);
        return -1;
    }
    for (int i = 0; i < c->n; i++) {
        if (c->node[i].pid <= 0 || t_cluster_slot_map(&c->node[i], map) != 0) continue;
        for (int j = 0; j < c->n; j++)
            if (c->node[j].port == map[slot]) owner = j;
        break;
    }
    free(map);
    return owner;
}

/* Starts moving slot from node `from` to node `to`: CLUSTER SETSLOT IMPORTING on `to`,
 * then MIGRATING on `from` (the order of the spec). Returns 0, or -1. */
static inline int t_cluster_migrate_begin(t_cluster *c, int slot, int from, int to)
{
    char id_from[64], id_to[64];
    if (t_cluster_node_id(c, from, id_from, sizeof id_from) != 0 ||
        t_cluster_node_id(c, to, id_to, sizeof id_to) != 0)
        return -1;
    if (!t_redis_ok(t_redis_cmd(&c->node[to], "CLUSTER SETSLOT %d IMPORTING %s", slot, id_from)))
        return -1;
    if (!t_redis_ok(t_redis_cmd(&c->node[from], "CLUSTER SETSLOT %d MIGRATING %s", slot, id_to)))
        return -1;
    return 0;
}

/* Moves up to max keys of slot from `from` to `to` (CLUSTER GETKEYSINSLOT, then one
 * MIGRATE ... REPLACE KEYS k1 k2 ...). Returns the keys moved (0: none was left), or -1. */
static inline int t_cluster_migrate_keys(t_cluster *c, int slot, int from, int to, int max)
{
    redisReply *keys = t_redis_cmd(&c->node[from], "CLUSTER GETKEYSINSLOT %d %d", slot, max);
    const char **argv = NULL;
    size_t *lens = NULL;
    char port[16];
    int n = 0, rc = -1;

    if (!keys || keys->type != REDIS_REPLY_ARRAY) goto done;
    if (keys->elements == 0) {
        rc = 0;
        goto done;
    }
    argv = calloc(keys->elements + 12, sizeof *argv);
    lens = calloc(keys->elements + 12, sizeof *lens);
    if (!argv || !lens) goto done;
    snprintf(port, sizeof port, "%d", c->node[to].port);
    argv[n++] = "MIGRATE";
    argv[n++] = "127.0.0.1";
    argv[n++] = port;
    argv[n++] = "";
    argv[n++] = "0";
    argv[n++] = "5000";
    argv[n++] = "REPLACE";
    if (c->node[to].password[0]) {
        argv[n++] = "AUTH";
        argv[n++] = c->node[to].password;
    }
    argv[n++] = "KEYS";
    for (int i = 0; i < n; i++)
        lens[i] = strlen(argv[i]);
    for (size_t i = 0; i < keys->elements; i++) {
        argv[n] = keys->element[i]->str;
        lens[n++] = keys->element[i]->len;
    }
    {
        redisReply *m = t_redis_cmdargv(&c->node[from], n, argv, lens);
        int ok = m && m->type == REDIS_REPLY_STATUS &&
                 (strcmp(m->str, "OK") == 0 || strcmp(m->str, "NOKEY") == 0);
        if (m && !ok) fprintf(stderr, "MIGRATE: %s\n", m->str ? m->str : "(reply)");
        if (m) freeReplyObject(m);
        if (ok) rc = (int)keys->elements;
    }
done:
    free(argv);
    free(lens);
    if (keys) freeReplyObject(keys);
    return rc;
}

/* Ends a migration: CLUSTER SETSLOT slot NODE <to's id> on `to` first, then on every
 * other master. Returns 0, or -1. */
static inline int t_cluster_migrate_end(t_cluster *c, int slot, int to)
{
    char id_to[64];
    if (t_cluster_node_id(c, to, id_to, sizeof id_to) != 0) return -1;
    if (!t_redis_ok(t_redis_cmd(&c->node[to], "CLUSTER SETSLOT %d NODE %s", slot, id_to)))
        return -1;
    for (int i = 0; i < c->n; i++) {
        if (i == to || c->node[i].pid <= 0) continue;
        if (!t_redis_ok(t_redis_cmd(&c->node[i], "CLUSTER SETSLOT %d NODE %s", slot, id_to)))
            return -1;
    }
    return 0;
}

/* ---- a delaying TCP proxy ---- */

#define T_PROXY_CONNS 64
#define T_PROXY_QUEUE_BYTES (8u << 20) /* per direction: reading stops above it */

typedef struct t_proxy_chunk {
    struct t_proxy_chunk *next;
    uint64_t due_ms; /* forwarded from then on */
    size_t len, off;
    char data[];
} t_proxy_chunk;

/* A client connection and its connection to the target: fd[0] client, fd[1] target; q[d]
 * holds what was read from fd[d], to be written to fd[!d]. */
typedef struct t_proxy_conn {
    int fd[2]; /* -1: slot free */
    t_proxy_chunk *head[2], *tail[2];
    size_t queued[2];
    int eof[2];  /* fd[d] said EOF */
    int shut[2]; /* fd[!d] was shut down for writing after q[d] drained */
} t_proxy_conn;

typedef struct t_proxy {
    int port;        /* listening on 127.0.0.1:port */
    int target_port; /* forwards to 127.0.0.1:target_port */
    _Atomic unsigned delay_ms;
    _Atomic int stop;
    int lfd, wake[2];
    pthread_t thread;
    int running;
    t_proxy_conn conn[T_PROXY_CONNS];
} t_proxy;

static inline void t_proxy_close_conn(t_proxy_conn *k)
{
    for (int d = 0; d < 2; d++) {
        while (k->head[d]) {
            t_proxy_chunk *n = k->head[d]->next;
            free(k->head[d]);
            k->head[d] = n;
        }
        k->tail[d] = NULL;
        k->queued[d] = 0;
        k->eof[d] = k->shut[d] = 0;
        if (k->fd[d] >= 0) close(k->fd[d]);
    }
    k->fd[0] = k->fd[1] = -1;
}

static inline void t_proxy_accept(t_proxy *p)
{
    struct sockaddr_in a;
    int cfd = accept(p->lfd, NULL, NULL), tfd, slot = -1;
    if (cfd < 0) return;
    for (int i = 0; i < T_PROXY_CONNS && slot < 0; i++)
        if (p->conn[i].fd[0] < 0) slot = i;
    tfd = slot < 0 ? -1 : socket(AF_INET, SOCK_STREAM, 0);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)p->target_port);
    if (tfd < 0 || connect(tfd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (tfd >= 0) close(tfd);
        close(cfd);
        return;
    }
    fcntl(cfd, F_SETFL, fcntl(cfd, F_GETFL) | O_NONBLOCK);
    fcntl(tfd, F_SETFL, fcntl(tfd, F_GETFL) | O_NONBLOCK);
    p->conn[slot].fd[0] = cfd;
    p->conn[slot].fd[1] = tfd;
}

/* Reads what fd[d] has into a chunk of q[d], due delay_ms from now. */
static inline void t_proxy_read(t_proxy *p, t_proxy_conn *k, int d)
{
    char buf[65536];
    ssize_t n = recv(k->fd[d], buf, sizeof buf, 0);
    t_proxy_chunk *ch;
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) {
        k->eof[d] = 1;
        return;
    }
    ch = malloc(sizeof *ch + (size_t)n);
    if (!ch) {
        k->eof[d] = 1;
        return;
    }
    ch->next = NULL;
    ch->due_ms = t_redis_now_ms() + atomic_load(&p->delay_ms);
    ch->len = (size_t)n;
    ch->off = 0;
    memcpy(ch->data, buf, (size_t)n);
    if (k->tail[d])
        k->tail[d]->next = ch;
    else
        k->head[d] = ch;
    k->tail[d] = ch;
    k->queued[d] += (size_t)n;
}

/* Writes the due chunks of q[d] to fd[!d]. Returns 0, or -1 (the connection is broken). */
static inline int t_proxy_write(t_proxy_conn *k, int d, uint64_t now)
{
    while (k->head[d] && k->head[d]->due_ms <= now) {
        t_proxy_chunk *ch = k->head[d];
        ssize_t n = send(k->fd[!d], ch->data + ch->off, ch->len - ch->off, MSG_NOSIGNAL);
        if (n < 0) return errno == EAGAIN || errno == EINTR ? 0 : -1;
        ch->off += (size_t)n;
        k->queued[d] -= (size_t)n;
        if (ch->off < ch->len) return 0;
        k->head[d] = ch->next;
        if (!k->head[d]) k->tail[d] = NULL;
        free(ch);
    }
    return 0;
}

static inline void *t_proxy_main(void *arg)
{
    t_proxy *p = arg;
    struct pollfd pf[2 + 2 * T_PROXY_CONNS];
    int who[2 + 2 * T_PROXY_CONNS]; /* conn * 2 + side, for pf[2..] */

    while (!atomic_load(&p->stop)) {
        uint64_t now = t_redis_now_ms();
        int np = 0, timeout = 100;
        pf[np++] = (struct pollfd){p->wake[0], POLLIN, 0};
        pf[np++] = (struct pollfd){p->lfd, POLLIN, 0};
        for (int i = 0; i < T_PROXY_CONNS; i++) {
            t_proxy_conn *k = &p->conn[i];
            if (k->fd[0] < 0) continue;
            for (int s = 0; s < 2; s++) {
                short ev = 0;
                t_proxy_chunk *h = k->head[!s]; /* what goes out through fd[s] */
                if (!k->eof[s] && k->queued[s] < T_PROXY_QUEUE_BYTES) ev |= POLLIN;
                if (h && h->due_ms <= now) ev |= POLLOUT;
                if (h && h->due_ms > now && (int)(h->due_ms - now) < timeout)
                    timeout = (int)(h->due_ms - now);
                who[np] = i * 2 + s;
                pf[np++] = (struct pollfd){k->fd[s], ev, 0};
            }
        }
        if (poll(pf, (nfds_t)np, timeout) < 0 && errno != EINTR) break;
        if (pf[1].revents & POLLIN) t_proxy_accept(p);
        now = t_redis_now_ms();
        for (int j = 2; j < np; j++) {
            t_proxy_conn *k = &p->conn[who[j] / 2];
            int s = who[j] % 2;
            if (k->fd[0] < 0) continue; /* closed by its other side this round */
            if (pf[j].revents & (POLLIN | POLLHUP | POLLERR)) t_proxy_read(p, k, s);
            if (t_proxy_write(k, !s, now) != 0) {
                t_proxy_close_conn(k);
                continue;
            }
            for (int d = 0; d < 2; d++)
                if (k->eof[d] && !k->head[d] && !k->shut[d]) {
                    shutdown(k->fd[!d], SHUT_WR);
                    k->shut[d] = 1;
                }
            if (k->shut[0] && k->shut[1]) t_proxy_close_conn(k);
        }
    }
    return NULL;
}

/* Starts a proxy on a fresh ephemeral port of 127.0.0.1 (p->port) that forwards each
 * connection to 127.0.0.1:target_port, every chunk read in either direction written
 * delay_ms after it was read. Returns 0, or -1. */
static inline int t_proxy_start(t_proxy *p, int target_port, unsigned delay_ms)
{
    struct sockaddr_in a;
    socklen_t al = sizeof a;

    memset(p, 0, sizeof *p);
    p->lfd = p->wake[0] = p->wake[1] = -1;
    for (int i = 0; i < T_PROXY_CONNS; i++)
        p->conn[i].fd[0] = p->conn[i].fd[1] = -1;
    p->target_port = target_port;
    atomic_store(&p->delay_ms, delay_ms);
    atomic_store(&p->stop, 0);
    if (pipe2(p->wake, O_CLOEXEC | O_NONBLOCK) != 0) return -1;
    p->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (p->lfd < 0 || bind(p->lfd, (struct sockaddr *)&a, sizeof a) != 0 ||
        listen(p->lfd, 64) != 0 || getsockname(p->lfd, (struct sockaddr *)&a, &al) != 0)
        goto fail;
    p->port = ntohs(a.sin_port);
    if (pthread_create(&p->thread, NULL, t_proxy_main, p) != 0) goto fail;
    p->running = 1;
    return 0;
fail:
    if (p->lfd >= 0) close(p->lfd);
    if (p->wake[0] >= 0) close(p->wake[0]);
    if (p->wake[1] >= 0) close(p->wake[1]);
    p->lfd = p->wake[0] = p->wake[1] = -1;
    return -1;
}

/* Sets the delay of the chunks read from now on. Thread-safe. */
static inline void t_proxy_set_delay(t_proxy *p, unsigned ms)
{
    atomic_store(&p->delay_ms, ms);
}

/* Stops the proxy: joins its thread, closes the listener and every connection (both
 * sides), frees what was queued. Safe on a failed start. */
static inline void t_proxy_stop(t_proxy *p)
{
    if (p->running) {
        atomic_store(&p->stop, 1);
        if (write(p->wake[1], "x", 1) < 0) {
            /* the loop also wakes within 100 ms by itself */
        }
        pthread_join(p->thread, NULL);
        p->running = 0;
    }
    for (int i = 0; i < T_PROXY_CONNS; i++)
        if (p->conn[i].fd[0] >= 0) t_proxy_close_conn(&p->conn[i]);
    if (p->lfd >= 0) close(p->lfd);
    if (p->wake[0] >= 0) close(p->wake[0]);
    if (p->wake[1] >= 0) close(p->wake[1]);
    p->lfd = p->wake[0] = p->wake[1] = -1;
}

#endif /* PGD_TESTS_T_REDIS_H */
