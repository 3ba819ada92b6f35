/* SPDX-License-Identifier: MIT */
/*
 * rclient.c - the Redis client of the Redis tier (contract and routing rules: rclient.h):
 * connection pools per node, pipelined batches under one deadline, reconnection with
 * backoff, Redis Cluster slot routing (MOVED / ASK / TRYAGAIN), and the pure parts
 * (CRC16, key slots, redirection and CLUSTER SLOTS parsers).
 * Callers: src/tier/redis/redis.c (the tier), tests/redis/test_rclient.c,
 * tests/fuzz/fuzz_rclient.c.
 *
 *   pgd__rc ── mu, cv ── slot[16384] ──> node index ──> rc_node
 *                                                      state NEW | UP | DOWN, gen
 *                                                      free ──> rc_conn ──> rc_conn
 *
 * One exec, in rounds until no command is left to send:
 *   route     under mu: each pending command -> its node (slot map, an ASK target, or
 *             any node for key -1); the nodes sorted by index
 *   take      one free connection per node, in index order (so two callers never wait
 *             on each other in a cycle); a DOWN node fails its commands at once
 *             (PGD_EIO); a NEW node (learnt from CLUSTER SLOTS or a redirection) or an
 *             UP node with fewer than params.conns connections gets one opened here,
 *             bounded by the deadline; else wait on cv, bounded by the deadline
 *   append    every node's commands (ASKING before an ASK-redirected one), then flush
 *             every node's buffer, then read the replies node by node: the nodes work on
 *             their pipelines at the same time
 *   redirect  MOVED: slot -> new node in the map, refresh asked, sent again; ASK: sent
 *             again with ASKING on the target; TRYAGAIN: sent again after 1 ms; more
 *             than 5 hops (MOVED or ASK) is PGD_EIO
 *   give      each connection back; one that erred or timed out is closed and its node
 *             goes DOWN (its generation changes, so the connections other callers hold
 *             are closed when they come back) with a retry time: backoff 50 ms doubling
 *             to 5 s, reset by a reply read from the node
 *
 * Invariants: the lock is never held during I/O (connects, writes, reads, redisFree of a
 * live connection happen outside it); a connection is in at most one free list, that of
 * its node, and only while its generation is the node's; node indices never change
 * (nodes are appended, never removed; a node that leaves the slot map stays, unused).
 * Socket timeouts are set before every wait to what is left of the deadline (hiredis
 * 0.14 treats a zero timeval as "no timeout", so a wait with nothing left is not made).
 * Writes block SIGPIPE in the calling thread (hiredis 0.14 writes with write(2); a
 * library must not die of a closed socket nor touch the process's signal handlers).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "tier/redis/rclient.h"
#include "tier/tier_int.h"

#define RC_NONE 0xFFFFu    /* slot map: no node */
#define RC_MAX_NODES 4096u /* bound on nodes learnt (a map entry is 16 bits) */
#define RC_MAX_HOPS 5      /* MOVED / ASK redirections followed per command */
#define RC_BACKOFF0_MS 50u /* first retry delay of a down node */
#define RC_BACKOFF_MAX_MS 5000u
#define RC_STACK_CMDS 16 /* per-command scratch on the stack up to this batch size */

enum { NODE_NEW = 0, NODE_UP = 1, NODE_DOWN = 2 };

typedef struct rc_conn {
    redisContext *ctx;
    struct rc_conn *next;                 /* free list */
    uint32_t node;                        /* index */
    uint32_t gen;                         /* the node's generation when it was opened */
    uint64_t tmo_deadline_ns, tmo_set_ns; /* the socket timeout last set: for, at */
} rc_conn;

typedef struct rc_node {
    pgd__rc_addr addr;
    int state;           /* NODE_NEW, NODE_UP, NODE_DOWN */
    int in_map;          /* some slot maps to it (standalone: node 0) */
    uint32_t gen;        /* bumped when the node goes down */
    uint32_t n_conns;    /* open connections of this generation or older, taken or free */
    uint32_t n_opening;  /* connection attempts running */
    uint32_t backoff_ms; /* the next retry delay; 0 after a success */
    uint64_t retry_ns;   /* DOWN: tick tries again from then on */
    rc_conn *free;
} rc_node;

struct pgd__rc {
    pgd__alloc al;
    const pgd__log *log;
    char *user, *password; /* copies, or NULL */
    int db;
    uint32_t connect_timeout_ms, command_timeout_ms, conns;
    int cluster;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* CLOCK_MONOTONIC: a connection came back or a node changed */
    rc_node **nodes;   /* [n_nodes] */
    uint32_t n_nodes, cap_nodes;
    int refresh; /* a slot map reload is wanted (tick does it) */
    uint16_t slot[PGD__RC_SLOTS];
    uint64_t n_reconnects, n_connect_failures, n_timeouts; /* atomics */
    uint64_t n_moved, n_ask, n_tryagain, n_slot_refreshes;
};

/* Per-command state of one exec. */
typedef struct rc_job {
    uint32_t node; /* this round's target */
    uint16_t slot; /* of the routing key, RC_NONE for key -1 */
    uint8_t ask;   /* send ASKING first (an ASK redirection) */
    uint8_t hops;
    uint8_t pending;  /* not answered yet */
    uint8_t inflight; /* part of this round on node (cleared when its reply re-targets it) */
    uint8_t tryagain;
} rc_job;

/* One node's part of a round. */
typedef struct rc_group {
    uint32_t node;
    rc_conn *conn; /* NULL: its commands failed already */
    int broken;    /* the connection erred or timed out: close it, node down */
    int timed_out;
    int good; /* a reply was read */
} rc_group;

static void stat_add(uint64_t *c, uint64_t n)
{
    __atomic_fetch_add(c, n, __ATOMIC_RELAXED);
}

static uint64_t stat_get(const uint64_t *c)
{
    return __atomic_load_n(c, __ATOMIC_RELAXED);
}

static void addr_fmt(const pgd__rc_addr *a, char *buf, size_t len)
{
    if (a->port)
        snprintf(buf, len, "%s:%d", a->host, a->port);
    else
        snprintf(buf, len, "unix:%s", a->host);
}

/* ---- pure parts ---- */

/* CRC16-XMODEM table (poly 0x1021), built at first use of pgd__rc_crc16. */
static uint16_t crc16_tab[256];
static pthread_once_t crc16_once = PTHREAD_ONCE_INIT;

static void crc16_init(void)
{
    for (unsigned i = 0; i < 256; i++) {
        uint16_t c = (uint16_t)(i << 8);
        for (int b = 0; b < 8; b++)
            c = (uint16_t)(c & 0x8000 ? (c << 1) ^ 0x1021 : c << 1);
        crc16_tab[i] = c;
    }
}

uint16_t pgd__rc_crc16(const void *buf, size_t len)
{
    const uint8_t *p = buf;
    uint16_t crc = 0;
    pthread_once(&crc16_once, crc16_init);
    for (size_t i = 0; i < len; i++)
        crc = (uint16_t)((crc << 8) ^ crc16_tab[((crc >> 8) ^ p[i]) & 0xFF]);
    return crc;
}

uint32_t pgd__rc_key_slot(const void *key, size_t len)
{
    const char *k = key;
    const char *open = len ? memchr(k, '{', len) : NULL;
    if (open) {
        size_t from = (size_t)(open - k) + 1;
        const char *close = from < len ? memchr(k + from, '}', len - from) : NULL;
        if (close && close > k + from)
            return pgd__rc_crc16(k + from, (size_t)(close - (k + from))) & (PGD__RC_SLOTS - 1);
    }
    return pgd__rc_crc16(k, len) & (PGD__RC_SLOTS - 1);
}

/* Parses the decimal digits s[0..len) (no sign, at most 9 digits) into *v. 0 or -1. */
static int parse_uint(const char *s, size_t len, uint32_t *v)
{
    uint32_t x = 0;
    if (len == 0 || len > 9) return -1;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        x = x * 10 + (uint32_t)(s[i] - '0');
    }
    *v = x;
    return 0;
}

int pgd__rc_parse_redirect(const char *s, size_t len, uint32_t *slot, pgd__rc_addr *to)
{
    size_t i, sp, colon, hlen;
    uint32_t sl, port;
    int kind;

    if (len >= 6 && memcmp(s, "MOVED ", 6) == 0) {
        kind = 1;
        i = 6;
    } else if (len >= 4 && memcmp(s, "ASK ", 4) == 0) {
        kind = 2;
        i = 4;
    } else {
        return 0;
    }
    for (sp = i; sp < len && s[sp] != ' '; sp++) {
    }
    if (sp >= len || parse_uint(s + i, sp - i, &sl) != 0 || sl >= PGD__RC_SLOTS) return -1;
    i = sp + 1;
    for (colon = len; colon > i && s[colon - 1] != ':'; colon--) {
    }
    if (colon == i) return -1; /* no ':' */
    if (parse_uint(s + colon, len - colon, &port) != 0 || port == 0 || port > 65535) return -1;
    hlen = colon - 1 - i;
    if (hlen >= 2 && s[i] == '[' && s[colon - 2] == ']') { /* [v6]:port */
        i++;
        hlen -= 2;
    }
    if (hlen >= PGD__RC_HOST_MAX) return -1;
    for (size_t k = i; k < i + hlen; k++)
        if ((unsigned char)s[k] <= ' ' || s[k] == 0x7F) return -1;
    memcpy(to->host, s + i, hlen);
    to->host[hlen] = '\0';
    to->port = (int)port;
    *slot = sl;
    return kind;
}

int pgd__rc_parse_slots(const redisReply *r, const char *fallback_host, pgd__rc_range *out,
                        size_t cap)
{
    size_t n = 0;
    if (!r || r->type != REDIS_REPLY_ARRAY) return -1;
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *e = r->element[i], *m, *h, *p;
        const char *host;
        size_t hlen;
        if (!e || e->type != REDIS_REPLY_ARRAY || e->elements < 3) return -1;
        m = e->element[2];
        if (!e->element[0] || !e->element[1] || e->element[0]->type != REDIS_REPLY_INTEGER ||
            e->element[1]->type != REDIS_REPLY_INTEGER || !m || m->type != REDIS_REPLY_ARRAY ||
            m->elements < 2)
            return -1;
        h = m->element[0];
        p = m->element[1];
        if (e->element[0]->integer < 0 || e->element[0]->integer > e->element[1]->integer ||
            e->element[1]->integer >= PGD__RC_SLOTS || !h || !p || p->type != REDIS_REPLY_INTEGER ||
            p->integer <= 0 || p->integer > 65535)
            return -1;
        if (h->type == REDIS_REPLY_NIL) {
            host = "";
            hlen = 0;
        } else if (h->type == REDIS_REPLY_STRING) {
            host = h->str;
            hlen = h->len;
        } else {
            return -1;
        }
        if (hlen == 0 || (hlen == 1 && host[0] == '?')) {
            host = fallback_host ? fallback_host : "";
            hlen = strlen(host);
        }
        if (hlen == 0 || hlen >= PGD__RC_HOST_MAX || memchr(host, '\0', hlen)) return -1;
        if (n >= cap) return -1;
        out[n].lo = (uint32_t)e->element[0]->integer;
        out[n].hi = (uint32_t)e->element[1]->integer;
        memcpy(out[n].master.host, host, hlen);
        out[n].master.host[hlen] = '\0';
        out[n].master.port = (int)p->integer;
        n++;
    }
    return n > INT_MAX ? -1 : (int)n;
}

/* ---- one connection: open, timeouts, writes, synchronous commands ---- */

static void conn_free(pgd__rc *rc, rc_conn *c)
{
    if (!c) return;
    if (c->ctx) redisFree(c->ctx);
    pgd__free(&rc->al, c);
}

/* Sets c's socket timeouts so that no wait runs past deadline_ns (re-set only when the
 * last setting is older than 1 ms or for another deadline). Returns 0, or -1 when
 * nothing is left of the deadline (or setsockopt failed). */
static int conn_timeout(rc_conn *c, uint64_t deadline_ns)
{
    uint64_t now = pgd__tier_now_ns(), left;
    struct timeval tv;
    if (now >= deadline_ns) return -1;
    if (c->tmo_deadline_ns == deadline_ns && now - c->tmo_set_ns < 1000000u) return 0;
    left = deadline_ns - now;
    if (left < 1000u) left = 1000u; /* at least 1 us: 0 would mean no timeout */
    tv.tv_sec = (time_t)(left / 1000000000u);
    tv.tv_usec = (suseconds_t)((left % 1000000000u) / 1000u);
    if (tv.tv_sec == 0 && tv.tv_usec == 0) tv.tv_usec = 1;
    if (redisSetTimeout(c->ctx, tv) != REDIS_OK) return -1;
    c->tmo_deadline_ns = deadline_ns;
    c->tmo_set_ns = now;
    return 0;
}

/* Writes c's whole output buffer (waits bounded by deadline_ns), with SIGPIPE blocked in
 * this thread; a SIGPIPE raised here is consumed, one pending before is left alone.
 * Returns 0, or -1 (c->ctx->err set, or the deadline passed). */
static int conn_flush(rc_conn *c, uint64_t deadline_ns)
{
    sigset_t pipe_set, old, pending;
    int done = 0, rc = 0, was_pending;

    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    sigpending(&pending);
    was_pending = sigismember(&pending, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
    while (!done) {
        if (conn_timeout(c, deadline_ns) != 0 || redisBufferWrite(c->ctx, &done) != REDIS_OK) {
            rc = -1;
            break;
        }
    }
    if (rc != 0 && !was_pending) {
        struct timespec zero = {0, 0};
        int saved = errno;
        sigtimedwait(&pipe_set, NULL, &zero);
        errno = saved;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

/* The next reply of c into *out, waiting at most until deadline_ns. Returns 0, or -1
 * with *timed_out set when the deadline or a socket timeout is why. */
static int conn_read(rc_conn *c, uint64_t deadline_ns, redisReply **out, int *timed_out)
{
    void *r = NULL;
    *out = NULL;
    if (redisReaderGetReply(c->ctx->reader, &r) != REDIS_OK) return -1;
    if (!r) {
        if (conn_timeout(c, deadline_ns) != 0) {
            *timed_out = 1;
            return -1;
        }
        errno = 0;
        if (redisGetReply(c->ctx, &r) != REDIS_OK || !r) {
            int e = errno;
            if ((c->ctx->err == REDIS_ERR_IO && (e == EAGAIN || e == EWOULDBLOCK)) ||
                pgd__tier_now_ns() >= deadline_ns)
                *timed_out = 1;
            return -1;
        }
    }
    *out = r;
    return 0;
}

/* Sends one command on c and reads its reply (bounded by deadline_ns). Returns the reply
 * (freeReplyObject), or NULL (I/O error or timeout: c is then unusable). */
static redisReply *conn_sync(rc_conn *c, int argc, const char **argv, uint64_t deadline_ns,
                             int *timed_out)
{
    size_t lens[4];
    redisReply *r;
    for (int i = 0; i < argc; i++)
        lens[i] = strlen(argv[i]);
    if (redisAppendCommandArgv(c->ctx, argc, argv, lens) != REDIS_OK) return NULL;
    if (conn_flush(c, deadline_ns) != 0) {
        if (pgd__tier_now_ns() >= deadline_ns || errno == EAGAIN) *timed_out = 1;
        return NULL;
    }
    if (conn_read(c, deadline_ns, &r, timed_out) != 0) return NULL;
    return r;
}

/* Opens a connection to a (TCP or unix socket), then AUTH (when a password is set) and
 * SELECT (when select_db > 0), all bounded by timeout_ms and by deadline_ns (0: none).
 * Returns PGD_OK with *out; PGD_EINVAL (AUTH or SELECT refused), PGD_EIO (no connection,
 * an I/O error, a timeout: *timed_out set), PGD_ENOMEM; err says why. */
static int conn_open(pgd__rc *rc, const pgd__rc_addr *a, uint32_t node, uint32_t gen, int select_db,
                     uint64_t deadline_ns, rc_conn **out, int *timed_out, char *err, size_t errlen)
{
    uint64_t now = pgd__tier_now_ns(), dl = now + (uint64_t)rc->connect_timeout_ms * 1000000u;
    char where[PGD__RC_HOST_MAX + 16];
    struct timeval tv;
    rc_conn *c;
    redisReply *r;
    int st = PGD_EIO;

    *out = NULL;
    addr_fmt(a, where, sizeof where);
    if (deadline_ns && deadline_ns < dl) dl = deadline_ns;
    if (now >= dl) {
        *timed_out = 1;
        snprintf(err, errlen, "%s: no time left to connect", where);
        return PGD_EIO;
    }
    c = pgd__calloc(&rc->al, 1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "%s: out of memory", where);
        return PGD_ENOMEM;
    }
    c->node = node;
    c->gen = gen;
    tv.tv_sec = (time_t)((dl - now) / 1000000000u);
    tv.tv_usec = (suseconds_t)(((dl - now) % 1000000000u) / 1000u);
    if (tv.tv_sec == 0 && tv.tv_usec == 0) tv.tv_usec = 1;
    c->ctx = a->port ? redisConnectWithTimeout(a->host, a->port, tv)
                     : redisConnectUnixWithTimeout(a->host, tv);
    if (!c->ctx || c->ctx->err) {
        if (c->ctx && c->ctx->err == REDIS_ERR_IO && (errno == EINPROGRESS || errno == ETIMEDOUT))
            *timed_out = 1;
        snprintf(err, errlen, "%s: %s", where, c->ctx ? c->ctx->errstr : "out of memory");
        st = c->ctx ? PGD_EIO : PGD_ENOMEM;
        goto fail;
    }
    if (rc->password) {
        const char *av[3] = {"AUTH", rc->user ? rc->user : rc->password, rc->password};
        r = conn_sync(c, rc->user ? 3 : 2, av, dl, timed_out);
        if (!r) {
            snprintf(err, errlen, "%s: AUTH: %s", where, *timed_out ? "timed out" : c->ctx->errstr);
            goto fail;
        }
        if (r->type == REDIS_REPLY_ERROR) {
            snprintf(err, errlen, "%s: AUTH refused: %s", where, r->str);
            freeReplyObject(r);
            st = PGD_EINVAL;
            goto fail;
        }
        freeReplyObject(r);
    }
    if (select_db > 0) {
        char db[16];
        const char *av[2] = {"SELECT", db};
        snprintf(db, sizeof db, "%d", select_db);
        r = conn_sync(c, 2, av, dl, timed_out);
        if (!r) {
            snprintf(err, errlen, "%s: SELECT: %s", where,
                     *timed_out ? "timed out" : c->ctx->errstr);
            goto fail;
        }
        if (r->type == REDIS_REPLY_ERROR) {
            snprintf(err, errlen, "%s: SELECT %d refused: %s", where, select_db, r->str);
            freeReplyObject(r);
            st = PGD_EINVAL;
            goto fail;
        }
        freeReplyObject(r);
    }
    *out = c;
    return PGD_OK;
fail:
    conn_free(rc, c);
    return st;
}

/* ---- nodes (the caller holds mu unless said otherwise) ---- */

/* The index of the node at a, added (NEW) when unknown. Returns RC_NONE when the table
 * is full or out of memory. */
static uint32_t node_find_add(pgd__rc *rc, const pgd__rc_addr *a)
{
    rc_node *n;
    for (uint32_t i = 0; i < rc->n_nodes; i++)
        if (rc->nodes[i]->addr.port == a->port && strcmp(rc->nodes[i]->addr.host, a->host) == 0)
            return i;
    if (rc->n_nodes >= RC_MAX_NODES) return RC_NONE;
    if (rc->n_nodes == rc->cap_nodes) {
        uint32_t cap = rc->cap_nodes ? rc->cap_nodes * 2 : 8;
        rc_node **nn = pgd__realloc(&rc->al, rc->nodes, cap * sizeof *nn);
        if (!nn) return RC_NONE;
        rc->nodes = nn;
        rc->cap_nodes = cap;
    }
    n = pgd__calloc(&rc->al, 1, sizeof *n);
    if (!n) return RC_NONE;
    n->addr = *a;
    n->state = NODE_NEW;
    rc->nodes[rc->n_nodes] = n;
    return rc->n_nodes++;
}

/* Marks node i down (when it is not already; a connection of an older generation failing
 * changes nothing) with its next retry time, and detaches its free connections into
 * *close_list (the caller frees them after unlocking). */
static void node_down(pgd__rc *rc, uint32_t i, uint32_t gen, rc_conn **close_list)
{
    rc_node *n = rc->nodes[i];
    if (n->state == NODE_DOWN || gen != n->gen) return;
    n->state = NODE_DOWN;
    n->gen++;
    n->backoff_ms = n->backoff_ms ? n->backoff_ms * 2 : RC_BACKOFF0_MS;
    if (n->backoff_ms > RC_BACKOFF_MAX_MS) n->backoff_ms = RC_BACKOFF_MAX_MS;
    n->retry_ns = pgd__tier_now_ns() + (uint64_t)n->backoff_ms * 1000000u;
    while (n->free) {
        rc_conn *c = n->free;
        n->free = c->next;
        n->n_conns--;
        c->next = *close_list;
        *close_list = c;
    }
    if (rc->cluster) rc->refresh = 1;
    pthread_cond_broadcast(&rc->cv);
    {
        char where[PGD__RC_HOST_MAX + 16];
        addr_fmt(&n->addr, where, sizeof where);
        pgd__logf(rc->log, PGD_LOG_WARN, "redis %s: down, retry in %u ms", where,
                  (unsigned)n->backoff_ms);
    }
}

static void close_all(pgd__rc *rc, rc_conn *list)
{
    while (list) {
        rc_conn *next = list->next;
        conn_free(rc, list);
        list = next;
    }
}

/* Gives c back to its node (the caller holds mu): into the free list when its node is
 * up and of c's generation, else into *close_list. */
static void conn_give(pgd__rc *rc, rc_conn *c, rc_conn **close_list)
{
    rc_node *n = rc->nodes[c->node];
    if (n->state == NODE_UP && c->gen == n->gen && !c->ctx->err) {
        c->next = n->free;
        n->free = c;
    } else {
        n->n_conns--;
        c->next = *close_list;
        *close_list = c;
    }
    pthread_cond_signal(&rc->cv);
}

/* Waits on cv until deadline_ns. Returns 0 when woken, -1 at the deadline. */
static int wait_until(pgd__rc *rc, uint64_t deadline_ns)
{
    struct timespec ts = {(time_t)(deadline_ns / 1000000000u), (long)(deadline_ns % 1000000000u)};
    return pthread_cond_timedwait(&rc->cv, &rc->mu, &ts) == ETIMEDOUT ? -1 : 0;
}

/* Takes a connection of node i for a caller (mu not held): a free one; or one opened
 * now when the node is NEW or UP with fewer than conns (bounded by deadline_ns); or the
 * next one given back, waiting until deadline_ns. A DOWN node fails at once. Returns
 * PGD_OK with *out, or PGD_EIO (*timed_out when the deadline is why) / PGD_ENOMEM. */
static int conn_take(pgd__rc *rc, uint32_t i, uint64_t deadline_ns, rc_conn **out, int *timed_out)
{
    char err[256];
    rc_conn *c = NULL, *close_list = NULL;
    int st = PGD_EIO;

    *out = NULL;
    pthread_mutex_lock(&rc->mu);
    for (;;) {
        rc_node *n = rc->nodes[i];
        if (n->free) {
            c = n->free;
            n->free = c->next;
            c->next = NULL;
            st = PGD_OK;
            break;
        }
        if (n->state == NODE_DOWN) break;
        if (n->n_conns + n->n_opening < rc->conns) {
            pgd__rc_addr a = n->addr;
            uint32_t gen = n->gen;
            int to = 0, was_new = n->state == NODE_NEW;
            n->n_opening++;
            pthread_mutex_unlock(&rc->mu);
            st = conn_open(rc, &a, i, gen, rc->cluster ? 0 : rc->db, deadline_ns, &c, &to, err,
                           sizeof err);
            pthread_mutex_lock(&rc->mu);
            n->n_opening--;
            if (st == PGD_OK && n->gen == gen && n->state != NODE_DOWN) {
                n->n_conns++;
                n->state = NODE_UP;
                break;
            }
            if (st == PGD_OK) { /* the node went down meanwhile */
                close_list = c;
                c = NULL;
                st = PGD_EIO;
                break;
            }
            stat_add(&rc->n_connect_failures, 1);
            if (to) {
                stat_add(&rc->n_timeouts, 1);
                *timed_out = 1;
            }
            if (was_new || n->state == NODE_UP) {
                pgd__logf(rc->log, PGD_LOG_WARN, "redis: %s", err);
                node_down(rc, i, gen, &close_list);
            }
            break;
        }
        if (wait_until(rc, deadline_ns) != 0 && !rc->nodes[i]->free) {
            *timed_out = 1;
            stat_add(&rc->n_timeouts, 1);
            break;
        }
    }
    pthread_mutex_unlock(&rc->mu);
    close_all(rc, close_list);
    *out = c;
    return st;
}

/* ---- exec ---- */

/* A node for a command without a key: the first UP node of the map, else the first of the
 * map (NEW: connected on demand; DOWN: fails). Caller holds mu. */
static uint32_t any_node(const pgd__rc *rc)
{
    uint32_t first = RC_NONE;
    for (uint32_t i = 0; i < rc->n_nodes; i++) {
        if (!rc->nodes[i]->in_map) continue;
        if (rc->nodes[i]->state == NODE_UP) return i;
        if (first == RC_NONE) first = i;
    }
    return first;
}

/* Handles a reply of job j, read from group g's node: a redirection re-targets the job,
 * anything else ends it. */
static void job_reply(pgd__rc *rc, pgd__rc_cmd *cmd, rc_job *j, const rc_group *g, redisReply *r)
{
    if (rc->cluster && r->type == REDIS_REPLY_ERROR) {
        pgd__rc_addr to;
        uint32_t slot;
        int kind = pgd__rc_parse_redirect(r->str, r->len, &slot, &to);
        if (kind > 0) {
            uint32_t ni;
            pthread_mutex_lock(&rc->mu);
            if (!to.host[0]) /* "MOVED 3999 :6380": the host of the node that answered */
                memcpy(to.host, rc->nodes[g->node]->addr.host, sizeof to.host);
            ni = node_find_add(rc, &to);
            if (ni != RC_NONE && kind == 1) {
                rc->slot[slot] = (uint16_t)ni;
                rc->nodes[ni]->in_map = 1;
                rc->refresh = 1;
            }
            pthread_mutex_unlock(&rc->mu);
            stat_add(kind == 1 ? &rc->n_moved : &rc->n_ask, 1);
            freeReplyObject(r);
            if (ni == RC_NONE || ++j->hops > RC_MAX_HOPS) {
                cmd->status = PGD_EIO;
                j->pending = 0;
                return;
            }
            j->node = ni;
            j->ask = kind == 2;
            return;
        }
        if (r->len >= 8 && memcmp(r->str, "TRYAGAIN", 8) == 0) {
            stat_add(&rc->n_tryagain, 1);
            freeReplyObject(r);
            j->tryagain = 1;
            j->ask = 0;
            return;
        }
    }
    cmd->reply = r;
    cmd->status = PGD_OK;
    j->pending = 0;
}

/* Fails the jobs of this round on group g's node not answered yet with st. */
static void group_fail(pgd__rc_cmd *cmds, rc_job *jobs, size_t n, const rc_group *g, int st,
                       int timed_out)
{
    for (size_t k = 0; k < n; k++) {
        if (!jobs[k].inflight || jobs[k].node != g->node) continue;
        jobs[k].pending = jobs[k].inflight = 0;
        cmds[k].status = st;
        cmds[k].timed_out = timed_out;
    }
}

/* One round: routes the pending jobs, takes a connection per node, appends, flushes,
 * reads. groups has room for n entries. */
static void exec_round(pgd__rc *rc, pgd__rc_cmd *cmds, rc_job *jobs, size_t n, rc_group *groups,
                       uint64_t deadline_ns)
{
    static const char *asking[1] = {"ASKING"};
    static const size_t asking_len[1] = {6};
    rc_conn *close_list = NULL;
    size_t n_groups = 0;

    /* route */
    pthread_mutex_lock(&rc->mu);
    for (size_t k = 0; k < n; k++) {
        rc_job *j = &jobs[k];
        if (!j->pending || j->ask) continue;
        j->node = j->slot == RC_NONE ? any_node(rc) : rc->slot[j->slot];
        if (j->node == RC_NONE) {
            j->pending = 0;
            cmds[k].status = PGD_EIO;
            if (rc->cluster) rc->refresh = 1;
        }
    }
    for (size_t k = 0; k < n; k++)
        jobs[k].inflight = jobs[k].pending;
    pthread_mutex_unlock(&rc->mu);
    for (size_t k = 0; k < n; k++) { /* the distinct nodes, sorted (insertion: few) */
        size_t at;
        if (!jobs[k].pending) continue;
        for (at = 0; at < n_groups && groups[at].node < jobs[k].node; at++) {
        }
        if (at < n_groups && groups[at].node == jobs[k].node) continue;
        memmove(groups + at + 1, groups + at, (n_groups - at) * sizeof *groups);
        memset(&groups[at], 0, sizeof groups[at]);
        groups[at].node = jobs[k].node;
        n_groups++;
    }

    /* take, in node order; append */
    for (size_t g = 0; g < n_groups; g++) {
        rc_group *gr = &groups[g];
        int to = 0, st = conn_take(rc, gr->node, deadline_ns, &gr->conn, &to);
        if (st != PGD_OK) {
            group_fail(cmds, jobs, n, gr, st, to);
            continue;
        }
        for (size_t k = 0; k < n && !gr->broken; k++) {
            const rc_job *j = &jobs[k];
            if (!j->inflight || j->node != gr->node) continue;
            if ((j->ask &&
                 redisAppendCommandArgv(gr->conn->ctx, 1, asking, asking_len) != REDIS_OK) ||
                redisAppendCommandArgv(gr->conn->ctx, cmds[k].argc, cmds[k].argv,
                                       cmds[k].argvlen) != REDIS_OK) {
                gr->broken = 1; /* out of memory in hiredis: the buffer is half-built */
                group_fail(cmds, jobs, n, gr, PGD_ENOMEM, 0);
            }
        }
    }
    /* flush every node's pipeline, then read node by node */
    for (size_t g = 0; g < n_groups; g++) {
        rc_group *gr = &groups[g];
        if (!gr->conn || gr->broken) continue;
        if (conn_flush(gr->conn, deadline_ns) != 0) {
            gr->broken = 1;
            gr->timed_out = pgd__tier_now_ns() >= deadline_ns || errno == EAGAIN;
            group_fail(cmds, jobs, n, gr, PGD_EIO, gr->timed_out);
        }
    }
    for (size_t g = 0; g < n_groups; g++) {
        rc_group *gr = &groups[g];
        if (!gr->conn || gr->broken) continue;
        for (size_t k = 0; k < n; k++) {
            rc_job *j = &jobs[k];
            redisReply *r;
            int to = 0;
            if (!j->inflight || j->node != gr->node) continue;
            if (j->ask) {
                if (conn_read(gr->conn, deadline_ns, &r, &to) != 0) goto broken;
                freeReplyObject(r); /* +OK of ASKING */
                j->ask = 0;
            }
            if (conn_read(gr->conn, deadline_ns, &r, &to) != 0) goto broken;
            gr->good = 1;
            j->inflight = 0;
            job_reply(rc, &cmds[k], j, gr, r);
            continue;
        broken:
            gr->broken = 1;
            gr->timed_out = to;
            group_fail(cmds, jobs, n, gr, PGD_EIO, to);
            break;
        }
    }

    /* give back */
    pthread_mutex_lock(&rc->mu);
    for (size_t g = 0; g < n_groups; g++) {
        rc_group *gr = &groups[g];
        if (!gr->conn) continue;
        if (gr->good) rc->nodes[gr->node]->backoff_ms = 0;
        if (gr->broken) {
            char where[PGD__RC_HOST_MAX + 16];
            addr_fmt(&rc->nodes[gr->node]->addr, where, sizeof where);
            if (gr->timed_out) stat_add(&rc->n_timeouts, 1);
            pgd__logf(rc->log, PGD_LOG_WARN, "redis %s: %s", where,
                      gr->timed_out ? "timed out" : gr->conn->ctx->errstr);
            node_down(rc, gr->node, gr->conn->gen, &close_list);
            rc->nodes[gr->node]->n_conns--;
            gr->conn->next = close_list;
            close_list = gr->conn;
        } else {
            conn_give(rc, gr->conn, &close_list);
        }
        gr->conn = NULL;
    }
    pthread_mutex_unlock(&rc->mu);
    close_all(rc, close_list);
}

size_t pgd__rc_exec(pgd__rc *rc, pgd__rc_cmd *cmds, size_t n, uint64_t deadline_ns)
{
    rc_job jobs_stack[RC_STACK_CMDS];
    rc_group groups_stack[RC_STACK_CMDS];
    rc_job *jobs = jobs_stack;
    rc_group *groups = groups_stack;
    size_t n_ok = 0;

    if (n == 0) return 0;
    if (!deadline_ns)
        deadline_ns = pgd__tier_now_ns() + (uint64_t)rc->command_timeout_ms * 1000000u;
    for (size_t k = 0; k < n; k++) {
        cmds[k].reply = NULL;
        cmds[k].status = PGD_EIO;
        cmds[k].timed_out = 0;
    }
    if (n > RC_STACK_CMDS) {
        jobs = pgd__malloc(&rc->al, n * sizeof *jobs);
        groups = pgd__malloc(&rc->al, n * sizeof *groups);
        if (!jobs || !groups) {
            if (jobs) pgd__free(&rc->al, jobs);
            if (groups) pgd__free(&rc->al, groups);
            for (size_t k = 0; k < n; k++)
                cmds[k].status = PGD_ENOMEM;
            return 0;
        }
    }
    for (size_t k = 0; k < n; k++) {
        const pgd__rc_cmd *c = &cmds[k];
        memset(&jobs[k], 0, sizeof jobs[k]);
        jobs[k].pending = 1;
        jobs[k].slot = (uint16_t)RC_NONE;
        if (c->argc < 1 || !c->argv || !c->argvlen || c->key >= c->argc) {
            jobs[k].pending = 0;
            cmds[k].status = PGD_EINVAL;
        } else if (c->key >= 0) {
            jobs[k].slot = (uint16_t)pgd__rc_key_slot(c->argv[c->key], c->argvlen[c->key]);
        }
    }
    for (;;) {
        int any = 0, again = 0;
        exec_round(rc, cmds, jobs, n, groups, deadline_ns);
        for (size_t k = 0; k < n; k++) {
            if (!jobs[k].pending) continue;
            any = 1;
            again |= jobs[k].tryagain;
            jobs[k].tryagain = 0;
        }
        if (!any) break;
        if (again) { /* TRYAGAIN: a multi-key command during resharding; wait 1 ms */
            struct timespec ms = {0, 1000000};
            if (pgd__tier_now_ns() + 1000000u < deadline_ns) nanosleep(&ms, NULL);
        }
        if (pgd__tier_now_ns() >= deadline_ns) {
            stat_add(&rc->n_timeouts, 1);
            for (size_t k = 0; k < n; k++)
                if (jobs[k].pending) {
                    jobs[k].pending = 0;
                    cmds[k].status = PGD_EIO;
                    cmds[k].timed_out = 1;
                }
            break;
        }
    }
    for (size_t k = 0; k < n; k++)
        n_ok += cmds[k].status == PGD_OK;
    if (jobs != jobs_stack) pgd__free(&rc->al, jobs);
    if (groups != groups_stack) pgd__free(&rc->al, groups);
    return n_ok;
}

redisReply *pgd__rc_command(pgd__rc *rc, int key, int argc, const char **argv)
{
    size_t lens_stack[16], *lens = lens_stack;
    pgd__rc_cmd c;
    if (argc < 1) return NULL;
    if (argc > 16) {
        lens = pgd__malloc(&rc->al, (size_t)argc * sizeof *lens);
        if (!lens) return NULL;
    }
    for (int i = 0; i < argc; i++)
        lens[i] = strlen(argv[i]);
    memset(&c, 0, sizeof c);
    c.argc = argc;
    c.argv = argv;
    c.argvlen = lens;
    c.key = key;
    pgd__rc_exec(rc, &c, 1, 0);
    if (lens != lens_stack) pgd__free(&rc->al, lens);
    return c.status == PGD_OK ? c.reply : NULL;
}

/* ---- the slot map ---- */

/* Loads CLUSTER SLOTS through c (whose node's host stands in for an empty endpoint) into
 * the map: nodes added as NEW, in_map recomputed. Returns PGD_OK, PGD_EIO (no reply, a
 * reply of another shape: err says so), PGD_ENOMEM. mu not held. */
static int load_slots(pgd__rc *rc, rc_conn *c, const char *host, uint64_t deadline_ns, char *err,
                      size_t errlen)
{
    static const char *av[2] = {"CLUSTER", "SLOTS"};
    pgd__rc_range *ranges;
    redisReply *r;
    int to = 0, nr, st = PGD_OK;
    uint16_t *map;

    r = conn_sync(c, 2, av, deadline_ns, &to);
    if (!r) {
        snprintf(err, errlen, "CLUSTER SLOTS: %s", to ? "timed out" : c->ctx->errstr);
        return PGD_EIO;
    }
    ranges = pgd__malloc(&rc->al, PGD__RC_SLOTS * sizeof *ranges);
    map = pgd__malloc(&rc->al, PGD__RC_SLOTS * sizeof *map);
    if (!ranges || !map) {
        st = PGD_ENOMEM;
        snprintf(err, errlen, "CLUSTER SLOTS: out of memory");
        goto done;
    }
    nr = pgd__rc_parse_slots(r, host, ranges, PGD__RC_SLOTS);
    if (nr <= 0) {
        st = PGD_EIO;
        snprintf(err, errlen, "CLUSTER SLOTS: %s",
                 r->type == REDIS_REPLY_ERROR ? r->str
                 : nr == 0                    ? "no slot is served"
                                              : "a reply of another shape");
        goto done;
    }
    pthread_mutex_lock(&rc->mu);
    for (uint32_t s = 0; s < PGD__RC_SLOTS; s++)
        map[s] = (uint16_t)RC_NONE;
    for (int i = 0; i < nr && st == PGD_OK; i++) {
        uint32_t ni = node_find_add(rc, &ranges[i].master);
        if (ni == RC_NONE) {
            st = PGD_ENOMEM;
            snprintf(err, errlen, "CLUSTER SLOTS: too many nodes or out of memory");
        }
        for (uint32_t s = ranges[i].lo; st == PGD_OK && s <= ranges[i].hi; s++)
            map[s] = (uint16_t)ni;
    }
    if (st == PGD_OK) {
        memcpy(rc->slot, map, sizeof rc->slot);
        for (uint32_t i = 0; i < rc->n_nodes; i++)
            rc->nodes[i]->in_map = 0;
        for (uint32_t s = 0; s < PGD__RC_SLOTS; s++)
            if (map[s] != RC_NONE) rc->nodes[map[s]]->in_map = 1;
        pthread_cond_broadcast(&rc->cv);
    }
    pthread_mutex_unlock(&rc->mu);
done:
    freeReplyObject(r);
    pgd__free(&rc->al, ranges);
    pgd__free(&rc->al, map);
    return st;
}

/* Reloads the slot map through any UP node (a free connection, or a new one). Returns
 * PGD_OK, or an error (the map stays as it was). */
static int refresh_slots(pgd__rc *rc)
{
    uint64_t dl = pgd__tier_now_ns() + (uint64_t)rc->command_timeout_ms * 1000000u;
    char err[256], host[PGD__RC_HOST_MAX];
    uint32_t ni;
    rc_conn *c = NULL, *close_list = NULL;
    int to = 0, st;

    pthread_mutex_lock(&rc->mu);
    ni = any_node(rc);
    if (ni != RC_NONE) memcpy(host, rc->nodes[ni]->addr.host, sizeof host);
    pthread_mutex_unlock(&rc->mu);
    if (ni == RC_NONE) return PGD_EIO;
    st = conn_take(rc, ni, dl, &c, &to);
    if (st != PGD_OK) return st;
    st = load_slots(rc, c, host, dl, err, sizeof err);
    pthread_mutex_lock(&rc->mu);
    if (c->ctx->err) {
        node_down(rc, ni, c->gen, &close_list);
        rc->nodes[ni]->n_conns--;
        c->next = close_list;
        close_list = c;
    } else {
        conn_give(rc, c, &close_list);
    }
    pthread_mutex_unlock(&rc->mu);
    close_all(rc, close_list);
    if (st == PGD_OK)
        stat_add(&rc->n_slot_refreshes, 1);
    else
        pgd__logf(rc->log, PGD_LOG_WARN, "redis: slot map refresh failed: %s", err);
    return st;
}

/* ---- tick ---- */

uint32_t pgd__rc_tick(pgd__rc *rc)
{
    uint64_t now = pgd__tier_now_ns();
    uint32_t up = 0, n_try = 0, *todo = NULL, cap;
    int refresh;

    pthread_mutex_lock(&rc->mu);
    cap = rc->n_nodes;
    pthread_mutex_unlock(&rc->mu);
    todo = cap ? pgd__malloc(&rc->al, cap * sizeof *todo) : NULL;
    pthread_mutex_lock(&rc->mu);
    for (uint32_t i = 0; todo && i < rc->n_nodes && n_try < cap; i++) {
        rc_node *n = rc->nodes[i];
        if (!n->in_map || n->n_opening) continue;
        if ((n->state == NODE_DOWN && n->retry_ns <= now) ||
            (n->state == NODE_NEW && n->n_conns == 0)) {
            n->n_opening++;
            todo[n_try++] = i;
        }
    }
    refresh = rc->cluster && rc->refresh;
    rc->refresh = 0;
    pthread_mutex_unlock(&rc->mu);

    for (uint32_t t = 0; t < n_try; t++) {
        uint32_t i = todo[t], gen;
        pgd__rc_addr a;
        rc_conn *c = NULL, *close_list = NULL;
        char err[256];
        int to = 0, st, was_down;
        pthread_mutex_lock(&rc->mu);
        a = rc->nodes[i]->addr;
        gen = rc->nodes[i]->gen;
        pthread_mutex_unlock(&rc->mu);
        st = conn_open(rc, &a, i, gen, rc->cluster ? 0 : rc->db, 0, &c, &to, err, sizeof err);
        pthread_mutex_lock(&rc->mu);
        {
            rc_node *n = rc->nodes[i];
            n->n_opening--;
            was_down = n->state == NODE_DOWN;
            if (st == PGD_OK && n->gen == gen) {
                n->state = NODE_UP;
                n->n_conns++;
                c->next = n->free;
                n->free = c;
                if (was_down) stat_add(&rc->n_reconnects, 1);
                pthread_cond_broadcast(&rc->cv);
                pgd__logf(rc->log, PGD_LOG_INFO, "redis %s%s:%d: connected",
                          a.port ? "" : "unix:", a.host, a.port);
            } else if (st == PGD_OK) {
                close_list = c;
            } else {
                stat_add(&rc->n_connect_failures, 1);
                if (to) stat_add(&rc->n_timeouts, 1);
                if (n->state == NODE_DOWN) { /* next try later, backoff doubled */
                    n->backoff_ms = n->backoff_ms ? n->backoff_ms * 2 : RC_BACKOFF0_MS;
                    if (n->backoff_ms > RC_BACKOFF_MAX_MS) n->backoff_ms = RC_BACKOFF_MAX_MS;
                    n->retry_ns = pgd__tier_now_ns() + (uint64_t)n->backoff_ms * 1000000u;
                } else {
                    node_down(rc, i, gen, &close_list);
                }
            }
        }
        pthread_mutex_unlock(&rc->mu);
        close_all(rc, close_list);
    }
    if (todo) pgd__free(&rc->al, todo);
    if (refresh && refresh_slots(rc) != PGD_OK) {
        pthread_mutex_lock(&rc->mu);
        rc->refresh = 1;
        pthread_mutex_unlock(&rc->mu);
    }
    pthread_mutex_lock(&rc->mu);
    for (uint32_t i = 0; i < rc->n_nodes; i++)
        up += rc->nodes[i]->in_map && rc->nodes[i]->state == NODE_UP;
    pthread_mutex_unlock(&rc->mu);
    return up;
}

void pgd__rc_get_stats(pgd__rc *rc, pgd__rc_stats *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&rc->mu);
    out->cluster = rc->cluster;
    for (uint32_t i = 0; i < rc->n_nodes; i++) {
        if (!rc->nodes[i]->in_map) continue;
        out->n_nodes++;
        out->n_nodes_up += rc->nodes[i]->state == NODE_UP;
    }
    pthread_mutex_unlock(&rc->mu);
    out->n_reconnects = stat_get(&rc->n_reconnects);
    out->n_connect_failures = stat_get(&rc->n_connect_failures);
    out->n_timeouts = stat_get(&rc->n_timeouts);
    out->n_moved = stat_get(&rc->n_moved);
    out->n_ask = stat_get(&rc->n_ask);
    out->n_tryagain = stat_get(&rc->n_tryagain);
    out->n_slot_refreshes = stat_get(&rc->n_slot_refreshes);
}

/* ---- create / destroy ---- */

static char *dup_str(const pgd__alloc *al, const char *s)
{
    size_t n;
    char *d;
    if (!s) return NULL;
    n = strlen(s) + 1;
    d = pgd__malloc(al, n);
    if (d) memcpy(d, s, n);
    return d;
}

void pgd__rc_destroy(pgd__rc *rc)
{
    if (!rc) return;
    for (uint32_t i = 0; i < rc->n_nodes; i++) {
        close_all(rc, rc->nodes[i]->free);
        pgd__free(&rc->al, rc->nodes[i]);
    }
    pgd__free(&rc->al, rc->nodes);
    if (rc->password) {
        memset(rc->password, 0, strlen(rc->password));
        pgd__free(&rc->al, rc->password);
    }
    pgd__free(&rc->al, rc->user);
    pthread_cond_destroy(&rc->cv);
    pthread_mutex_destroy(&rc->mu);
    pgd__alloc al = rc->al;
    pgd__free(&al, rc);
}

/* Detects cluster mode on c (INFO cluster). Returns 1, 0, -1 (no answer: err), or -2
 * (refused: NOAUTH, NOPERM, WRONGPASS: err). */
static int detect_cluster(rc_conn *c, uint64_t deadline_ns, char *err, size_t errlen)
{
    static const char *av[2] = {"INFO", "cluster"};
    int to = 0, on;
    redisReply *r = conn_sync(c, 2, av, deadline_ns, &to);
    if (!r) {
        snprintf(err, errlen, "INFO cluster: %s", to ? "timed out" : c->ctx->errstr);
        return -1;
    }
    if (r->type != REDIS_REPLY_STRING) {
        int refused = r->type == REDIS_REPLY_ERROR &&
                      (strncmp(r->str, "NOAUTH", 6) == 0 || strncmp(r->str, "NOPERM", 6) == 0 ||
                       strncmp(r->str, "WRONGPASS", 9) == 0);
        snprintf(err, errlen, "INFO cluster: %s",
                 r->type == REDIS_REPLY_ERROR ? r->str : "a reply of another type");
        freeReplyObject(r);
        return refused ? -2 : -1;
    }
    on = strstr(r->str, "cluster_enabled:1") != NULL;
    freeReplyObject(r);
    return on;
}

/* Sets up the client on the seed connection c (of seed a): cluster mode, the map, the
 * nodes. Takes c (given to its node or freed). */
static int setup(pgd__rc *rc, const pgd__rc_params *p, const pgd__rc_addr *a, rc_conn *c, char *err,
                 size_t errlen)
{
    uint64_t dl = pgd__tier_now_ns() + (uint64_t)rc->command_timeout_ms * 1000000u;
    char where[PGD__RC_HOST_MAX + 16], why[256];
    int on = detect_cluster(c, dl, why, sizeof why), st;

    addr_fmt(a, where, sizeof where);
    if (on < 0) {
        snprintf(err, errlen, "%s: %s", where, why);
        conn_free(rc, c);
        return on == -2 ? PGD_EINVAL : PGD_EIO;
    }
    if ((p->cluster == 1 && !on) || (p->cluster == 0 && on)) {
        snprintf(err, errlen, "%s: %s", where,
                 on ? "a cluster node, but cluster mode is off"
                    : "not a cluster node (cluster_enabled:0), but cluster mode is forced");
        conn_free(rc, c);
        return PGD_EINVAL;
    }
    rc->cluster = on;
    if (on && p->db > 0) {
        snprintf(err, errlen, "%s: SELECT %d: a cluster has only db 0", where, p->db);
        conn_free(rc, c);
        return PGD_EINVAL;
    }
    if (!on) {
        uint32_t ni;
        if (p->db > 0) { /* the seed connection was opened without SELECT */
            char db[16];
            const char *av[2] = {"SELECT", db};
            int to = 0;
            redisReply *r;
            snprintf(db, sizeof db, "%d", p->db);
            r = conn_sync(c, 2, av, dl, &to);
            if (!r || r->type == REDIS_REPLY_ERROR) {
                snprintf(err, errlen, "%s: SELECT %d refused: %s", where, p->db,
                         r ? r->str : (to ? "timed out" : c->ctx->errstr));
                st = r ? PGD_EINVAL : PGD_EIO;
                if (r) freeReplyObject(r);
                conn_free(rc, c);
                return st;
            }
            freeReplyObject(r);
        }
        ni = node_find_add(rc, a);
        if (ni == RC_NONE) {
            conn_free(rc, c);
            snprintf(err, errlen, "out of memory");
            return PGD_ENOMEM;
        }
        for (uint32_t s = 0; s < PGD__RC_SLOTS; s++)
            rc->slot[s] = (uint16_t)ni;
        rc->nodes[ni]->in_map = 1;
    } else {
        st = load_slots(rc, c, a->port ? a->host : "", dl, why, sizeof why);
        if (st != PGD_OK) {
            snprintf(err, errlen, "%s: %s", where, why);
            conn_free(rc, c);
            return st;
        }
    }
    /* the seed connection goes to its node when the map has it */
    for (uint32_t i = 0; i < rc->n_nodes; i++) {
        rc_node *n = rc->nodes[i];
        if (n->in_map && n->addr.port == a->port && strcmp(n->addr.host, a->host) == 0) {
            c->node = i;
            c->gen = n->gen;
            c->next = NULL;
            n->free = c;
            n->n_conns = 1;
            n->state = NODE_UP;
            c = NULL;
            break;
        }
    }
    conn_free(rc, c);
    /* every master: params.conns connections each (a node that does not answer is down,
     * retried by tick) */
    for (uint32_t i = 0; i < rc->n_nodes; i++) {
        rc_node *n = rc->nodes[i];
        if (!n->in_map) continue;
        while (n->n_conns < rc->conns) {
            rc_conn *nc = NULL;
            int to = 0;
            st = conn_open(rc, &n->addr, i, n->gen, rc->cluster ? 0 : rc->db, 0, &nc, &to, why,
                           sizeof why);
            if (st == PGD_EINVAL || st == PGD_ENOMEM) {
                snprintf(err, errlen, "%s", why);
                return st;
            }
            if (st != PGD_OK) {
                rc_conn *cl = NULL;
                stat_add(&rc->n_connect_failures, 1);
                if (to) stat_add(&rc->n_timeouts, 1);
                pgd__logf(rc->log, PGD_LOG_WARN, "redis: %s", why);
                node_down(rc, i, n->gen, &cl);
                close_all(rc, cl);
                break;
            }
            nc->next = n->free;
            n->free = nc;
            n->n_conns++;
            n->state = NODE_UP;
        }
    }
    return PGD_OK;
}

int pgd__rc_create(const pgd__rc_params *p, pgd__rc **out, char *err, size_t errlen)
{
    pthread_condattr_t ca;
    pgd__rc *rc;
    char why[512];
    int st = PGD_EIO;

    *out = NULL;
    if (errlen) err[0] = '\0';
    if (!p || !p->seeds || p->n_seeds == 0 || !p->al) {
        snprintf(err, errlen, "no seed node");
        return PGD_EINVAL;
    }
    rc = pgd__calloc(p->al, 1, sizeof *rc);
    if (!rc) {
        snprintf(err, errlen, "out of memory");
        return PGD_ENOMEM;
    }
    rc->al = *p->al;
    rc->log = p->log;
    rc->db = p->db;
    rc->connect_timeout_ms = p->connect_timeout_ms ? p->connect_timeout_ms : 500;
    rc->command_timeout_ms = p->command_timeout_ms ? p->command_timeout_ms : 200;
    rc->conns = p->conns ? p->conns : 1;
    pthread_mutex_init(&rc->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&rc->cv, &ca);
    pthread_condattr_destroy(&ca);
    for (uint32_t s = 0; s < PGD__RC_SLOTS; s++)
        rc->slot[s] = (uint16_t)RC_NONE;
    rc->user = dup_str(&rc->al, p->user);
    rc->password = dup_str(&rc->al, p->password);
    if ((p->user && !rc->user) || (p->password && !rc->password)) {
        st = PGD_ENOMEM;
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if (p->user && !p->password) {
        st = PGD_EINVAL;
        snprintf(err, errlen, "an ACL user needs a password");
        goto fail;
    }
    snprintf(err, errlen, "no seed node");
    for (size_t i = 0; i < p->n_seeds; i++) {
        rc_conn *c = NULL;
        int to = 0;
        st = conn_open(rc, &p->seeds[i], 0, 0, 0, 0, &c, &to, why, sizeof why);
        if (st == PGD_OK) {
            st = setup(rc, p, &p->seeds[i], c, err, errlen);
            if (st == PGD_OK) {
                *out = rc;
                return PGD_OK;
            }
            if (st == PGD_EINVAL || st == PGD_ENOMEM) goto fail;
            continue;
        }
        stat_add(&rc->n_connect_failures, 1);
        snprintf(err, errlen, "%s", why);
        pgd__logf(rc->log, PGD_LOG_WARN, "redis: %s", why);
        if (st == PGD_EINVAL || st == PGD_ENOMEM) goto fail;
    }
fail:
    pgd__logf(rc->log, PGD_LOG_ERROR, "redis: %s", err);
    pgd__rc_destroy(rc);
    return st == PGD_OK ? PGD_EIO : st;
}
