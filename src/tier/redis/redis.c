/* SPDX-License-Identifier: MIT */
/*
 * redis.c - the Redis tier (tier_redis.h): page records in Redis or Redis Cluster, on the
 * client of rclient.h, with the pure parts of redis_int.h (URL, values and MAC, keys, the
 * local index).
 *
 *   caller threads                               writer thread (one per tier)
 *   put:  seal value (MAC)  -> put queue ------> SET key value EX ttl, pipelined (<= 8 MiB
 *         (skips what the index or the queue      a batch) -> local index (mine), events
 *          holds; bounded: put_queue_bytes)      DEL queue (damaged / forged values), events
 *   get / get_many: queue, else pipelined GET    events ring -> one XADD per batch
 *         under deadline_ms + deadline_page_ms*n pgd__rc_tick every TICK_MS: reconnects
 *         then MAC + checksum + copy (a batch     with backoff, logs down / up
 *         of >= 2 MiB: on up to 4 threads)
 *   lookup: local index, then one pipelined
 *         EXISTS batch for the rest of the run
 *   del:  DEL now (+ BlockRemoved "redis")
 *   retain: a queued put's TTL       ----------> or EXPIRE key N / PERSIST key, pipelined
 *         changed, else queued                    after the batch's SETs and DELs
 *
 * Retention (pgd_tier_ops.retain): ttl_s -> EXPIRE key ttl_s, pin -> PERSIST key (a key
 * without a TTL is never evicted under the volatile-* maxmemory policies), unpin -> EXPIRE
 * key <the tier's ttl> (nothing with ttl=0). The caller holds the cache lock: no round
 * trip there. A put still queued gets it in its own SET (EX ttl_s, or no EX when pinned);
 * otherwise the command is queued for the writer (RET_CAP of them; full: PGD_EIO, dropped).
 * The order of Redis's evictions is its maxmemory-policy: the tier has no policy of its own.
 *
 * The local index (redis_index.c) holds the blocks this instance knows are in Redis. The
 * cache never looks a remote tier up before a put (tier.h: stats.remote), so put skips a
 * block the queue holds or the index holds verified (written or read by this instance; one
 * that only an EXISTS saw may be forged or damaged: the put overwrites it); the index forgets
 * (bounded) and distrusts entries older than the TTL; Redis forgetting (eviction, expiry, a
 * restart, another instance's DEL) shows as a get miss, which drops the entry. bytes_used /
 * n_records count what this instance wrote and still believes present (index entries marked mine).
 *
 * Locking: mu guards the queues, the index and the counters; emu the events ring (the
 * cache's hooks take only emu, under the cache lock: lock order cache -> mu -> emu). No lock
 * is held during I/O or while a value is sealed. The writer takes a batch (its items stay
 * in the queue, in_flight, so gets and puts still see them), writes it unlocked, then
 * removes it. A del of an item in flight marks it cancelled: the writer DELs it after.
 * Down: the client marks a node down on a failed or timed-out command and the writer's
 * tick reconnects it with backoff; while every node is down (down = 1) puts are refused and
 * gets / look-ups fail at once without a round trip. With some cluster nodes down, a put
 * for one of them is queued and its SET fails at once in the client (dropped, n_io_errors):
 * rclient.h does not say which node a key's slot is on.
 * Statuses beyond tier.h's: put returns PGD_EIO while every node is down; del returns
 * PGD_EIO when its DEL could not be sent (a queued put of the block is dropped anyway).
 * Logs: one line when Redis becomes unreachable, one when it is back, one per burst of
 * MAC failures (at most one per MAC_LOG_NS); never one per request.
 *
 * Callers: the cache's movers and match (through the tier handle), tools, tests, benches.
 */
#define _GNU_SOURCE /* gethostname */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "tier/redis/redis_int.h"

enum {
    TICK_MS = 5,           /* the writer's maintenance period (pgd__rc_tick) */
    BATCH_PUTS = 1024,     /* SETs per writer pipeline, at most */
    BATCH_DELS = 256,      /* DELs per writer pipeline, at most */
    BATCH_RETS = 256,      /* EXPIRE / PERSIST per writer pipeline, at most */
    RET_CAP = 4096,        /* retention commands queued, at most (more: refused) */
    EV_BLOCKS = 32,        /* blocks per queued event (a longer chain: several) */
    EV_CAP = 1024,         /* events queued, at most (more: dropped) */
    EV_BATCH = 256,        /* events per XADD */
    DEL_CAP = 1024,        /* DELs queued, at most (more: forgotten) */
    QHASH = 4096,          /* buckets of the put queue's hash (power of two) */
    FLUSH_MS = 5000,       /* flush waits this long for the queues to drain */
    CLOSE_DRAIN_MS = 1000, /* close writes what it can within this */
    RIX_ENTRIES = 1 << 18, /* local index entries (24 bytes each: 6 MiB) */
    MEDIUM_MAX = 16,       /* bytes of an event's medium name, NUL included */
    WHERE_MAX = PGD__RC_HOST_MAX + 32,
    XADD_ARGS = 14,
};
#define BATCH_BYTES (8ull << 20) /* bytes of values per writer pipeline, at most */
#define MAC_LOG_NS (10ull * 1000000000ull)

/* A put accepted, not yet written: its key and its sealed value. */
typedef struct put_item {
    struct put_item *prev, *next; /* the FIFO */
    struct put_item *hnext;       /* the hash chain */
    pgd_hash block, parent;
    int in_flight; /* taken by the writer */
    int cancelled; /* deleted while in flight: the writer DELs it once written */
    int stored;    /* written (the writer's, for its event) */
    int64_t ttl_s; /* the SET's EX: -1 the tier's ttl, 0 none (pinned), > 0 this (retain) */
    size_t key_len;
    char key[PGD__REDIS_KEY_MAX];
    uint8_t value[]; /* [value_bytes] */
} put_item;

/* One queued KV event. */
typedef struct kv_event {
    int type; /* PGD_KV_EVENT_* */
    int has_parent;
    uint32_t n;
    pgd_hash parent;
    char medium[MEDIUM_MAX];
    pgd_hash blocks[EV_BLOCKS];
} kv_event;

/* A queued retention command: EXPIRE key ttl_s (ttl_s > 0) or PERSIST key (ttl_s 0). */
typedef struct ret_cmd {
    pgd_hash block;
    uint32_t ttl_s;
} ret_cmd;

/* The argv of one writer command (SET, DEL, EXPIRE, PERSIST or XADD). */
typedef struct wcmd {
    const char *argv[XADD_ARGS];
    size_t len[XADD_ARGS];
    char num[3][32];
    char key[PGD__REDIS_KEY_MAX];
} wcmd;

typedef struct rtier {
    pgd__alloc al;
    pgd__log lg;
    pgd_tier_redis_params p; /* strings point into strs */
    char *strs;              /* the URL's strings, then ns / events / instance copies */
    pgd__redis_url url;
    pgd__redis_mac mac;
    pgd__rc *rc;
    pgd__log rc_lg;        /* the client's log: rc_log (rate-limited into lg) */
    char where[WHERE_MAX]; /* "host:port" of the first seed (+ "and N more"): log lines */

    pthread_mutex_t mu;
    pthread_cond_t wake; /* the writer: work queued, or stop */
    pthread_cond_t done; /* flush: a batch finished */
    /* Guarded by mu: */
    int bound;
    pgd_record_ident ident;
    uint64_t ident_hash;
    uint64_t value_bytes; /* pgd__redis_value_bytes(&mac, ident) */
    pgd__rix ix;
    put_item *qhead, *qtail;
    put_item *qhash[QHASH];
    uint64_t q_bytes; /* values queued (in flight included) */
    uint32_t q_n;
    pgd_hash *dels; /* [DEL_CAP] blocks to DEL */
    uint32_t n_dels;
    ret_cmd *rets; /* [RET_CAP] retention commands, oldest first */
    uint32_t n_rets;
    int busy; /* the writer is writing a batch */
    int stop;
    pgd_tier_stats st;                 /* own counters (the client's are added by stats) */
    int logged_down;                   /* an outage is on (logged, or counted in n_flaps) */
    int down_quiet;                    /* this outage was not logged (n_flaps) */
    uint64_t down_since_ns;            /* when it began */
    uint64_t down_log_ns;              /* the next outage line allowed */
    uint64_t n_flaps;                  /* outages not logged since the last line */
    uint64_t mac_log_ns, mac_unlogged; /* next MAC failure line, failures since the last */
    int down;                          /* every node down (atomic reads outside mu) */
    uint32_t block_size; /* ident.page_tokens once bound (atomic: the writer's events) */
    uint64_t set_log_ns; /* next "SET refused" line */

    pthread_mutex_t lmu; /* a leaf lock: the client's log state below */
    char cause[256];     /* the client's latest warning: the cause of an outage */
    uint64_t rc_log_ns;  /* the next client warning passed on */
    uint64_t rc_log_suppressed;
    int creating; /* inside pgd__rc_create */

    pthread_t writer;
    int writer_started;
    put_item **w_items; /* [BATCH_PUTS], the writer's batch */
    pgd_hash *w_dels;   /* [BATCH_DELS] */
    ret_cmd *w_rets;    /* [BATCH_RETS] */
    wcmd *wcmds;        /* [BATCH_PUTS + BATCH_DELS + BATCH_RETS + 1], the writer's */
    pgd__rc_cmd *rcs;   /* [same] */
    char *ev_json;      /* the writer's XADD payload */
    size_t ev_json_cap;

    pthread_mutex_t emu;
    /* Guarded by emu: */
    kv_event *evs; /* ring [EV_CAP]; NULL without events_stream */
    uint32_t ev_head, ev_n;
    uint64_t ev_seq;
    uint64_t n_events, n_events_dropped;
} rtier;

static const pgd_tier_ops redis_ops;

static uint64_t now_ns(void)
{
    return pgd__tier_now_ns();
}

static uint32_t now_s(void)
{
    return (uint32_t)(now_ns() / 1000000000ull);
}

static int is_down(const rtier *t)
{
    return __atomic_load_n(&t->down, __ATOMIC_RELAXED);
}

/* ---- the put queue (mu held) ---- */

static uint32_t qbucket(pgd_hash b)
{
    return (uint32_t)(b.lo ^ b.hi >> 7) & (QHASH - 1);
}

/* The queued put of b, or NULL (a block is queued at most once). */
static put_item *q_find(rtier *t, pgd_hash b)
{
    for (put_item *it = t->qhash[qbucket(b)]; it; it = it->hnext)
        if (pgd_hash_eq(it->block, b)) return it;
    return NULL;
}

/* The queued put of b that is not cancelled (deleted while being written), or NULL: what
 * get and lookup may serve. */
static put_item *q_live(rtier *t, pgd_hash b)
{
    put_item *it = q_find(t, b);
    return it && !it->cancelled ? it : NULL;
}

static void q_push(rtier *t, put_item *it)
{
    it->next = NULL;
    it->prev = t->qtail;
    if (t->qtail)
        t->qtail->next = it;
    else
        t->qhead = it;
    t->qtail = it;
    uint32_t b = qbucket(it->block);
    it->hnext = t->qhash[b];
    t->qhash[b] = it;
    t->q_n++;
}

/* Unlinks it (its bytes stay counted in q_bytes: the caller subtracts them). */
static void q_unlink(rtier *t, put_item *it)
{
    if (it->prev)
        it->prev->next = it->next;
    else
        t->qhead = it->next;
    if (it->next)
        it->next->prev = it->prev;
    else
        t->qtail = it->prev;
    put_item **pp = &t->qhash[qbucket(it->block)];
    while (*pp != it)
        pp = &(*pp)->hnext;
    *pp = it->hnext;
    t->q_n--;
}

/* Queues a DEL of block for the writer (a damaged or forged value). Full: forgotten
 * (the value stays a miss for everyone; the next reader queues it again). */
static void queue_del(rtier *t, pgd_hash b)
{
    if (t->n_dels < DEL_CAP) t->dels[t->n_dels++] = b;
    pthread_cond_signal(&t->wake);
}

/* Forgets a queued DEL of block: a put of it is queued after the value it deletes was
 * read, and the writer sends a batch's SETs before its DELs, so the DEL would remove the
 * new value. Lock held. */
static void unqueue_del(rtier *t, pgd_hash b)
{
    for (uint32_t i = 0; i < t->n_dels;)
        if (pgd_hash_eq(t->dels[i], b))
            t->dels[i] = t->dels[--t->n_dels];
        else
            i++;
}

/* ---- events ---- */

/* Queues an event (emu not held). Returns PGD_OK or PGD_ENOSPC (dropped). */
static int ev_push(rtier *t, int type, const pgd_hash *blocks, size_t n, pgd_hash parent,
                   int has_parent, const char *medium)
{
    int rc = PGD_OK;
    pthread_mutex_lock(&t->emu);
    if (is_down(t)) {
        t->n_events_dropped += type == PGD_KV_EVENT_CLEARED ? 1 : n;
        pthread_mutex_unlock(&t->emu);
        return PGD_ENOSPC;
    }
    size_t i = 0;
    do {
        kv_event *last = t->ev_n ? &t->evs[(t->ev_head + t->ev_n - 1) % EV_CAP] : NULL;
        /* A chain continued, or more removals of the same medium: one event. */
        if (last && last->type == type && type != PGD_KV_EVENT_CLEARED && last->n < EV_BLOCKS &&
            strncmp(last->medium, medium, MEDIUM_MAX - 1) == 0 &&
            (type == PGD_KV_EVENT_REMOVED ||
             (has_parent && pgd_hash_eq(last->blocks[last->n - 1], parent)))) {
            while (i < n && last->n < EV_BLOCKS) {
                parent = blocks[i];
                last->blocks[last->n++] = blocks[i++];
            }
            has_parent = 1;
            continue;
        }
        if (t->ev_n == EV_CAP) {
            t->n_events_dropped += type == PGD_KV_EVENT_CLEARED ? 1 : n - i;
            rc = PGD_ENOSPC;
            break;
        }
        kv_event *e = &t->evs[(t->ev_head + t->ev_n) % EV_CAP];
        t->ev_n++;
        memset(e, 0, offsetof(kv_event, blocks));
        e->type = type;
        e->has_parent = has_parent;
        e->parent = parent;
        snprintf(e->medium, sizeof e->medium, "%s", medium);
        while (i < n && e->n < EV_BLOCKS) {
            parent = blocks[i];
            e->blocks[e->n++] = blocks[i++];
        }
        has_parent = 1;
    } while (i < n);
    pthread_mutex_unlock(&t->emu);
    /* Without mu (the hooks run under the cache lock and take only emu): a wake-up lost
     * between the writer's check and its wait costs at most one TICK_MS. */
    pthread_cond_signal(&t->wake);
    return rc;
}

/* The writer: takes up to EV_BATCH events and XADDs them as one entry. */
static void ev_publish(rtier *t)
{
    if (!t->evs) return;
    pthread_mutex_lock(&t->emu);
    uint32_t n = t->ev_n < EV_BATCH ? t->ev_n : EV_BATCH;
    size_t len = 0;
    uint32_t block_size = __atomic_load_n(&t->block_size, __ATOMIC_RELAXED);
    if (n) t->ev_json[len++] = '[';
    uint32_t taken = 0;
    for (; taken < n; taken++) {
        const kv_event *e = &t->evs[(t->ev_head + taken) % EV_CAP];
        size_t before = len;
        if (taken) t->ev_json[len++] = ',';
        /* Leave 2 bytes for "]" and the NUL. */
        if (pgd__redis_event_json(t->ev_json, t->ev_json_cap - 2, &len, e->type, e->blocks, e->n,
                                  e->parent, e->has_parent, block_size, e->medium) != PGD_OK) {
            len = before;
            break;
        }
    }
    if (n && !taken) {
        taken = 1; /* cannot happen (ev_json_cap fits EV_BATCH events): drop it */
        t->n_events_dropped++;
        len = 0;
    }
    uint64_t n_blocks = 0;
    for (uint32_t i = 0; i < taken && len; i++) {
        const kv_event *e = &t->evs[(t->ev_head + i) % EV_CAP];
        n_blocks += e->type == PGD_KV_EVENT_CLEARED ? 1 : e->n;
    }
    t->ev_head = (t->ev_head + taken) % EV_CAP;
    t->ev_n -= taken;
    uint64_t seq = ++t->ev_seq;
    pthread_mutex_unlock(&t->emu);
    if (!len) return;
    t->ev_json[len++] = ']';
    t->ev_json[len] = '\0';

    wcmd *w = &t->wcmds[0];
    struct timeval tv;
    gettimeofday(&tv, NULL);
    snprintf(w->num[0], sizeof w->num[0], "%u", t->p.events_maxlen);
    snprintf(w->num[1], sizeof w->num[1], "%llu", (unsigned long long)seq);
    snprintf(w->num[2], sizeof w->num[2], "%lld.%06ld", (long long)tv.tv_sec, (long)tv.tv_usec);
    const char *argv[XADD_ARGS] = {
        "XADD", t->p.events_stream, "MAXLEN",         "~",       w->num[0],
        "*",    "instance",         t->p.instance_id, "seq",     w->num[1],
        "ts",   w->num[2],          "events",         t->ev_json};
    for (int i = 0; i < XADD_ARGS; i++) {
        w->argv[i] = argv[i];
        w->len[i] = i == XADD_ARGS - 1 ? len : strlen(argv[i]);
    }
    pgd__rc_cmd *c = &t->rcs[0];
    memset(c, 0, sizeof *c);
    c->argc = XADD_ARGS;
    c->argv = w->argv;
    c->argvlen = w->len;
    c->key = 1;
    pgd__rc_exec(t->rc, c, 1, 0);
    int ok = c->status == PGD_OK && c->reply && c->reply->type == REDIS_REPLY_STRING;
    if (c->reply) freeReplyObject(c->reply);
    pthread_mutex_lock(&t->emu);
    if (ok)
        t->n_events += n_blocks;
    else
        t->n_events_dropped += n_blocks;
    pthread_mutex_unlock(&t->emu);
}

/* ---- connection state (the writer, and readers after a failure) ---- */

/* The client's log lines: errors pass (create's), warnings at most one per MAC_LOG_NS (a
 * slow or dead Redis would log one per request: the tier's own down / up lines say it
 * once), informational ones go down to debug. The first warning since the last recovery
 * is kept as the cause of the outage the tier reports. Called from any thread, maybe under the
 * client's lock: takes only lmu. */
static void rc_log(void *ud, int level, const char *msg)
{
    rtier *t = ud;
    uint64_t now = now_ns(), suppressed = 0;
    pthread_mutex_lock(&t->lmu);
    int pass = level <= PGD_LOG_ERROR && !t->creating; /* create's error: its own line */
    if (level == PGD_LOG_WARN) {
        if (!t->cause[0]) snprintf(t->cause, sizeof t->cause, "%s", msg); /* the first */
        if (now >= t->rc_log_ns) {
            pass = 1;
            t->rc_log_ns = now + MAC_LOG_NS;
            suppressed = t->rc_log_suppressed;
            t->rc_log_suppressed = 0;
        } else {
            t->rc_log_suppressed++;
        }
    }
    pthread_mutex_unlock(&t->lmu);
    if (pass && suppressed)
        pgd__logf(&t->lg, level, "%s (and %llu more such lines)", msg,
                  (unsigned long long)suppressed);
    else if (pass)
        pgd__logf(&t->lg, level, "%s", msg);
    else if (level > PGD_LOG_WARN)
        pgd__logf(&t->lg, PGD_LOG_DEBUG, "%s", msg);
}

/* Updates down from the client's counts and logs a change (one line each way). */
static void note_state(rtier *t, const char *cause)
{
    char why[256];
    pthread_mutex_lock(&t->lmu);
    if (t->cause[0]) {
        snprintf(why, sizeof why, "%s", t->cause);
        cause = why;
    }
    pthread_mutex_unlock(&t->lmu);
    pgd__rc_stats rs;
    pgd__rc_get_stats(t->rc, &rs);
    int down = rs.n_nodes_up == 0;
    __atomic_store_n(&t->down, down, __ATOMIC_RELAXED);
    pthread_mutex_lock(&t->mu);
    int degraded = rs.n_nodes_up < rs.n_nodes;
    uint64_t now = now_ns();
    if (degraded && !t->logged_down) {
        t->logged_down = 1;
        t->down_since_ns = now;
        /* A Redis that flaps (slow: each deadline miss drops a connection) would log a
         * pair of lines per outage: at most one outage line per MAC_LOG_NS, the others
         * counted into the next. */
        t->down_quiet = now < t->down_log_ns;
        char flaps[64] = "";
        if (t->n_flaps)
            snprintf(flaps, sizeof flaps, " (and %llu short outages before)",
                     (unsigned long long)t->n_flaps);
        if (t->down_quiet)
            t->n_flaps++;
        else if (rs.n_nodes > 1)
            pgd__logf(&t->lg, PGD_LOG_WARN,
                      "redis tier: %u of %u nodes unreachable (%s, %s): requests compute "
                      "what they would have read%s",
                      rs.n_nodes - rs.n_nodes_up, rs.n_nodes, t->where,
                      cause ? cause : "connection lost", flaps);
        else
            pgd__logf(&t->lg, PGD_LOG_WARN,
                      "redis tier: %s unreachable (%s): requests compute what they would "
                      "have read%s",
                      t->where, cause ? cause : "connection lost", flaps);
        if (!t->down_quiet) {
            t->n_flaps = 0;
            t->down_log_ns = now + MAC_LOG_NS;
        }
    } else if (!degraded && t->logged_down) {
        t->logged_down = 0;
        pthread_mutex_lock(&t->lmu);
        t->cause[0] = '\0'; /* the next outage has its own */
        pthread_mutex_unlock(&t->lmu);
        if (!t->down_quiet)
            pgd__logf(&t->lg, PGD_LOG_INFO,
                      "redis tier: %s reachable again after %.1f s (%llu reconnects)", t->where,
                      (double)(now - t->down_since_ns) / 1e9, (unsigned long long)rs.n_reconnects);
    }
    pthread_mutex_unlock(&t->mu);
}

/* Counts a MAC failure of key and logs the burst (mu held). */
static void note_mac_failure(rtier *t, const char *key)
{
    t->st.n_mac_failures++;
    t->mac_unlogged++;
    uint64_t now = now_ns();
    if (now >= t->mac_log_ns) {
        pgd__logf(&t->lg, PGD_LOG_WARN,
                  "redis tier: %llu value(s) failed the MAC (forged, or written with another "
                  "key) and were deleted, e.g. %s on %s",
                  (unsigned long long)t->mac_unlogged, key, t->where);
        t->mac_unlogged = 0;
        t->mac_log_ns = now + MAC_LOG_NS;
    }
}

/* ---- the writer thread ---- */

/* Writes one batch: items[0..n_items) (SET), dels[0..n_dels) (DEL), then rets[0..n_rets)
 * (EXPIRE / PERSIST), in that order in one pipeline. */
static void write_batch(rtier *t, put_item **items, uint32_t n_items, const pgd_hash *dels,
                        uint32_t n_dels, const ret_cmd *rets, uint32_t n_rets)
{
    uint32_t m = 0;
    for (uint32_t i = 0; i < n_items; i++, m++) {
        wcmd *w = &t->wcmds[m];
        put_item *it = items[i];
        w->argv[0] = "SET";
        w->len[0] = 3;
        w->argv[1] = it->key;
        w->len[1] = it->key_len;
        w->argv[2] = (const char *)it->value;
        w->len[2] = (size_t)t->value_bytes;
        int argc = 3;
        int64_t ttl = it->ttl_s < 0 ? (int64_t)t->p.ttl_s : it->ttl_s;
        if (ttl > 0) {
            snprintf(w->num[0], sizeof w->num[0], "%lld", (long long)ttl);
            w->argv[3] = "EX";
            w->len[3] = 2;
            w->argv[4] = w->num[0];
            w->len[4] = strlen(w->num[0]);
            argc = 5;
        }
        pgd__rc_cmd *c = &t->rcs[m];
        memset(c, 0, sizeof *c);
        c->argc = argc;
        c->argv = w->argv;
        c->argvlen = w->len;
        c->key = 1;
    }
    for (uint32_t i = 0; i < n_dels; i++, m++) {
        wcmd *w = &t->wcmds[m];
        size_t kl = pgd__redis_key(t->p.ns, t->ident_hash, dels[i], w->key, sizeof w->key);
        w->argv[0] = "DEL";
        w->len[0] = 3;
        w->argv[1] = w->key;
        w->len[1] = kl;
        pgd__rc_cmd *c = &t->rcs[m];
        memset(c, 0, sizeof *c);
        c->argc = 2;
        c->argv = w->argv;
        c->argvlen = w->len;
        c->key = 1;
    }
    for (uint32_t i = 0; i < n_rets; i++, m++) {
        wcmd *w = &t->wcmds[m];
        size_t kl = pgd__redis_key(t->p.ns, t->ident_hash, rets[i].block, w->key, sizeof w->key);
        int argc = 2;
        w->argv[0] = rets[i].ttl_s ? "EXPIRE" : "PERSIST";
        w->len[0] = strlen(w->argv[0]);
        w->argv[1] = w->key;
        w->len[1] = kl;
        if (rets[i].ttl_s) {
            snprintf(w->num[0], sizeof w->num[0], "%u", rets[i].ttl_s);
            w->argv[2] = w->num[0];
            w->len[2] = strlen(w->num[0]);
            argc = 3;
        }
        pgd__rc_cmd *c = &t->rcs[m];
        memset(c, 0, sizeof *c);
        c->argc = argc;
        c->argv = w->argv;
        c->argvlen = w->len;
        c->key = 1;
    }
    if (!m) return;
    pgd__rc_exec(t->rc, t->rcs, m, 0);

    const char *cause = NULL;
    uint32_t now = now_s();
    uint32_t n_stored = 0;
    uint8_t removed[BATCH_DELS];
    pthread_mutex_lock(&t->mu);
    for (uint32_t i = 0; i < m; i++) {
        pgd__rc_cmd *c = &t->rcs[i];
        int ok = c->status == PGD_OK && c->reply && c->reply->type != REDIS_REPLY_ERROR;
        if (c->status != PGD_OK) cause = c->timed_out ? "timed out" : "connection failed";
        if (i < n_items) {
            put_item *it = items[i];
            if (ok) {
                t->st.n_puts++;
                t->st.n_put_bytes += t->ident.page_bytes + t->ident.bounds_bytes;
                if (it->cancelled) {
                    queue_del(t, it->block); /* deleted while it was being written */
                } else {
                    pgd__rix_add(&t->ix, it->block, now, PGD__RIX_MINE);
                    it->stored = 1; /* an event below */
                    n_stored++;
                }
            } else {
                t->st.n_io_errors++;
                uint64_t ns = now_ns();
                if (c->reply && c->reply->type == REDIS_REPLY_ERROR && ns >= t->set_log_ns) {
                    t->set_log_ns = ns + MAC_LOG_NS;
                    pgd__logf(&t->lg, PGD_LOG_WARN, "redis tier: SET refused by %s: %.*s", t->where,
                              (int)c->reply->len, c->reply->str);
                }
            }
        }
        if (i >= n_items && i < n_items + n_dels)
            removed[i - n_items] =
                ok && c->reply->type == REDIS_REPLY_INTEGER && c->reply->integer > 0;
        if (i >= n_items + n_dels && !ok) t->st.n_io_errors++; /* EXPIRE / PERSIST failed */
        if (c->reply) freeReplyObject(c->reply);
        c->reply = NULL;
    }
    pthread_mutex_unlock(&t->mu);
    if (cause) note_state(t, cause);
    /* What this tier deleted (damaged or forged values, puts deleted in flight). */
    for (uint32_t i = 0; i < n_dels && t->evs; i++)
        if (removed[i]) ev_push(t, PGD_KV_EVENT_REMOVED, &dels[i], 1, dels[i], 0, "redis");
    /* The items stay queued (the writer unlinks them after): reading them is safe. */
    for (uint32_t i = 0; i < n_items && n_stored && t->evs; i++) {
        const put_item *it = items[i];
        if (it->stored)
            ev_push(t, PGD_KV_EVENT_STORED, &it->block, 1, it->parent,
                    it->parent.lo || it->parent.hi, "redis");
    }
}

static void *writer_main(void *arg)
{
    rtier *t = arg;
    put_item **items = t->w_items;
    pgd_hash *dels = t->w_dels;
    ret_cmd *rets = t->w_rets;
    uint64_t last_tick = 0, stop_by = 0;

    pthread_mutex_lock(&t->mu);
    for (;;) {
        uint64_t now = now_ns();
        if (t->stop && !stop_by) stop_by = now + CLOSE_DRAIN_MS * 1000000ull;
        pthread_mutex_lock(&t->emu);
        uint32_t ev_n = t->ev_n;
        pthread_mutex_unlock(&t->emu);
        int work = (t->qhead && !t->qhead->in_flight) || t->n_dels || t->n_rets || ev_n;
        if (t->stop && (!work || now >= stop_by)) break;
        if (!work) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            ts.tv_nsec += TICK_MS * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&t->wake, &t->mu, &ts);
        }
        /* Take a batch: its items stay queued (in_flight) until written. */
        uint32_t n_items = 0, n_dels = 0, n_rets = 0;
        uint64_t bytes = 0;
        for (put_item *it = t->qhead; it && n_items < BATCH_PUTS; it = it->next) {
            if (it->in_flight) continue;
            if (n_items && bytes + t->value_bytes > BATCH_BYTES) break;
            it->in_flight = 1;
            items[n_items++] = it;
            bytes += t->value_bytes;
        }
        while (t->n_dels && n_dels < BATCH_DELS)
            dels[n_dels++] = t->dels[--t->n_dels];
        /* Retention after the SETs (a block's own SET, if in flight, is in an earlier
         * batch or this one), oldest first: a later pin or unpin wins. */
        n_rets = t->n_rets < BATCH_RETS ? t->n_rets : BATCH_RETS;
        memcpy(rets, t->rets, n_rets * sizeof *rets);
        memmove(t->rets, t->rets + n_rets, (t->n_rets - n_rets) * sizeof *t->rets);
        t->n_rets -= n_rets;
        t->busy = 1;
        pthread_mutex_unlock(&t->mu);

        now = now_ns();
        if (now - last_tick >= TICK_MS * 1000000ull) {
            last_tick = now;
            pgd__rc_tick(t->rc);
            note_state(t, NULL);
        }
        if (n_items || n_dels || n_rets) write_batch(t, items, n_items, dels, n_dels, rets, n_rets);
        ev_publish(t);

        pthread_mutex_lock(&t->mu);
        put_item *freed = NULL;
        for (uint32_t i = 0; i < n_items; i++) {
            put_item *it = items[i];
            q_unlink(t, it);
            t->q_bytes -= t->value_bytes;
            it->next = freed;
            freed = it;
        }
        t->busy = 0;
        pthread_cond_broadcast(&t->done);
        pthread_mutex_unlock(&t->mu);
        while (freed) {
            put_item *it = freed;
            freed = it->next;
            pgd__free(&t->al, it);
        }
        pthread_mutex_lock(&t->mu);
    }
    /* Stopping: what is left is dropped. */
    while (t->qhead) {
        put_item *it = t->qhead;
        q_unlink(t, it);
        t->q_bytes -= t->value_bytes;
        t->st.n_io_errors++;
        pgd__free(&t->al, it);
    }
    t->n_dels = 0;
    t->n_rets = 0;
    pthread_cond_broadcast(&t->done);
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

/* ---- ops ---- */

static int redis_bind(void *state, const pgd_record_ident *ident)
{
    rtier *t = state;
    int rc = PGD_OK;
    pthread_mutex_lock(&t->mu);
    if (t->bound) {
        rc = pgd_record_ident_eq(&t->ident, ident) ? PGD_OK : PGD_EBUSY;
        pthread_mutex_unlock(&t->mu);
        return rc;
    }
    if (!ident->page_bytes || ident->page_bytes > (512ull << 20)) {
        pthread_mutex_unlock(&t->mu);
        return PGD_EINVAL; /* Redis values are at most 512 MiB */
    }
    t->ident = *ident;
    t->ident_hash = pgd__redis_ident_hash(ident);
    t->value_bytes = pgd__redis_value_bytes(&t->mac, ident);
    t->bound = 1;
    __atomic_store_n(&t->block_size, ident->page_tokens, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&t->mu);
    /* A new instance holds nothing in its pool: routers forget what they knew of it. */
    if (t->evs) ev_push(t, PGD_KV_EVENT_CLEARED, NULL, 0, (pgd_hash){0, 0}, 0, "");
    return PGD_OK;
}

static int redis_put(void *state, pgd_hash block, pgd_hash parent, const void *page,
                     const void *bounds, pgd_tier_spill_fn spill, void *spill_ud)
{
    rtier *t = state;
    uint64_t t0 = now_ns();
    (void)spill; /* Redis evicts by itself: nothing spills */
    (void)spill_ud;
    pthread_mutex_lock(&t->mu);
    if (!t->bound || !page || (t->ident.bounds_bytes && !bounds) || pgd_hash_eq(block, parent)) {
        pthread_mutex_unlock(&t->mu);
        return PGD_EINVAL;
    }
    put_item *queued = q_find(t, block);
    if (queued) queued->cancelled = 0; /* deleted while in flight, put again: write it */
    pgd__rix_entry *known = pgd__rix_find(&t->ix, block, now_s(), t->p.ttl_s);
    if (queued || (known && known->verified)) {
        pthread_mutex_unlock(&t->mu);
        return PGD_OK; /* held (and checked), or being written; seen only: overwrite it */
    }
    if (is_down(t) || t->q_bytes + t->value_bytes > t->p.put_queue_bytes) {
        int down = is_down(t);
        t->st.n_put_refused++;
        pthread_mutex_unlock(&t->mu);
        return down ? PGD_EIO : PGD_ENOSPC;
    }
    t->q_bytes += t->value_bytes; /* reserved while the value is sealed */
    uint64_t vb = t->value_bytes;
    pthread_mutex_unlock(&t->mu);

    put_item *it = pgd__malloc(&t->al, sizeof *it + (size_t)vb);
    int rc = it ? PGD_OK : PGD_ENOMEM;
    if (it) {
        memset(it, 0, sizeof *it);
        it->block = block;
        it->parent = parent;
        it->ttl_s = -1;
        it->key_len = pgd__redis_key(t->p.ns, t->ident_hash, block, it->key, sizeof it->key);
        rc = pgd__redis_value_seal(&t->mac, it->key, it->key_len, &t->ident, block, parent, page,
                                   bounds, it->value);
    }
    pthread_mutex_lock(&t->mu);
    if (rc == PGD_OK && !q_find(t, block)) {
        unqueue_del(t, block);
        q_push(t, it);
        it = NULL;
        pgd__tier_lat_add(t->st.put_hist, &t->st.put_ns_sum, now_ns() - t0);
        pthread_cond_signal(&t->wake);
    } else {
        t->q_bytes -= vb; /* failed, or another thread queued it meanwhile */
    }
    pthread_mutex_unlock(&t->mu);
    pgd__free(&t->al, it);
    return rc;
}

/* A GET of one block being read by get_many. */
typedef struct rget {
    const char *argv[2];
    size_t len[2];
    char key[PGD__REDIS_KEY_MAX];
} rget;

/* A get_many batch whose values are opened as they arrive (pgd__rc_cmd.on_reply):
 * verdict[k] = PGD__RV_* for command k's value, or -1 for a command that brought none
 * (failed, nil, an error reply: accounted after exec). */
typedef struct open_ctx {
    rtier *t;
    const pgd_hash *blocks;
    void *const *pages, *const *bounds;
    const rget *gs;
    const pgd__rc_cmd *cs;
    const size_t *idx;
    int *verdict;
} open_ctx;

/* on_reply of a GET: opens the value (the MAC, then the header, then the copy into the
 * page) and frees the reply at once, so that one reply is alive at a time. No lock held. */
static void open_on_reply(pgd__rc_cmd *c)
{
    const open_ctx *o = c->ud;
    size_t k = (size_t)(c - o->cs), i = o->idx[k];
    if (c->reply->type != REDIS_REPLY_STRING) return; /* nil or an error: accounted later */
    o->verdict[k] = pgd__redis_value_open(&o->t->mac, o->gs[k].key, o->gs[k].len[1], c->reply->str,
                                          c->reply->len, &o->t->ident, o->blocks[i], o->pages[i],
                                          o->bounds ? o->bounds[i] : NULL, NULL);
    freeReplyObject(c->reply);
    c->reply = NULL;
}

static size_t redis_get_many(void *state, size_t n, const pgd_hash *blocks, void *const *pages,
                             void *const *bounds, int *results)
{
    rtier *t = state;
    uint64_t t0 = now_ns();
    size_t n_ok = 0, m = 0;
    if (!n) return 0;
    pthread_mutex_lock(&t->mu);
    int bad = !t->bound;
    for (size_t i = 0; i < n && !bad; i++)
        bad = !pages[i] || (t->ident.bounds_bytes && (!bounds || !bounds[i]));
    if (bad) {
        pthread_mutex_unlock(&t->mu);
        for (size_t i = 0; i < n; i++)
            results[i] = PGD_EINVAL;
        return 0;
    }
    uint64_t deadline =
        t0 + ((uint64_t)t->p.deadline_ms + (uint64_t)t->p.deadline_page_ms * n) * 1000000ull;
    const pgd_record_ident *id = &t->ident;
    /* Queued puts are served from the queue (their value is sealed: the payload is right
     * after the header). */
    for (size_t i = 0; i < n; i++) {
        put_item *it = q_live(t, blocks[i]);
        results[i] = PGD_EIO;
        if (it) {
            const uint8_t *payload = it->value + PGD_RECORD_HEADER_BYTES;
            memcpy(pages[i], payload, (size_t)id->page_bytes);
            if (id->bounds_bytes)
                memcpy(bounds[i], payload + id->page_bytes, (size_t)id->bounds_bytes);
            results[i] = PGD_OK;
            t->st.n_gets++;
            t->st.n_get_bytes += id->page_bytes + id->bounds_bytes;
        } else {
            m++;
        }
    }
    int down = is_down(t);
    if (down) t->st.n_io_errors += m;
    pthread_mutex_unlock(&t->mu);

    rget *gs = NULL;
    pgd__rc_cmd *cs = NULL;
    size_t *idx = NULL;
    int *verdict = NULL;
    if (m && !down) {
        gs = pgd__calloc(&t->al, m, sizeof *gs);
        cs = pgd__calloc(&t->al, m, sizeof *cs);
        idx = pgd__calloc(&t->al, m, sizeof *idx);
        verdict = pgd__calloc(&t->al, m, sizeof *verdict);
        if (!gs || !cs || !idx || !verdict) {
            for (size_t i = 0; i < n; i++)
                if (results[i] != PGD_OK) results[i] = PGD_ENOMEM;
            m = 0;
        }
        size_t k = 0;
        open_ctx oc = {t, blocks, pages, bounds, gs, cs, idx, verdict};
        for (size_t i = 0; i < n && m; i++) {
            if (results[i] == PGD_OK) continue;
            rget *g = &gs[k];
            size_t kl = pgd__redis_key(t->p.ns, t->ident_hash, blocks[i], g->key, sizeof g->key);
            g->argv[0] = "GET";
            g->len[0] = 3;
            g->argv[1] = g->key;
            g->len[1] = kl;
            cs[k].argc = 2;
            cs[k].argv = g->argv;
            cs[k].argvlen = g->len;
            cs[k].key = 1;
            cs[k].on_reply = open_on_reply;
            cs[k].ud = &oc;
            verdict[k] = -1;
            idx[k++] = i;
        }
        if (m) pgd__rc_exec(t->rc, cs, m, deadline);
    }

    const char *cause = NULL;
    if (m && !down) {
        uint32_t now = now_s();
        pthread_mutex_lock(&t->mu);
        for (size_t k = 0; k < m; k++) {
            pgd__rc_cmd *c = &cs[k];
            size_t i = idx[k];
            redisReply *r = c->reply;
            if (c->status != PGD_OK) {
                if (c->timed_out)
                    t->st.n_deadline_misses++;
                else
                    t->st.n_io_errors++;
                cause = c->timed_out ? "timed out" : "connection failed";
                results[i] = c->status == PGD_ENOMEM ? PGD_ENOMEM : PGD_EIO;
            } else if (!r) {
                /* a value, opened as it arrived: verdict[k] says what it was */
            } else if (r->type == REDIS_REPLY_NIL) {
                t->st.n_get_misses++; /* evicted, expired, restarted empty, deleted */
                pgd__rix_remove(&t->ix, blocks[i]);
                results[i] = PGD_ENOTFOUND;
            } else if (r->type != REDIS_REPLY_STRING) {
                t->st.n_io_errors++; /* an error reply (e.g. WRONGTYPE) */
                results[i] = PGD_EIO;
            }
        }
        pthread_mutex_unlock(&t->mu);
        uint64_t elapsed = now_ns() - t0;
        pthread_mutex_lock(&t->mu);
        for (size_t k = 0; k < m; k++) {
            size_t i = idx[k];
            int v = verdict[k];
            if (v < 0) continue; /* not a value: accounted above */
            switch (v) {
            case PGD__RV_OK:
                results[i] = PGD_OK;
                t->st.n_gets++;
                t->st.n_get_bytes += id->page_bytes + id->bounds_bytes;
                pgd__rix_add(&t->ix, blocks[i], now, PGD__RIX_READ);
                pgd__tier_lat_add(t->st.get_hist, &t->st.get_ns_sum, elapsed);
                break;
            case PGD__RV_FOREIGN:
                t->st.n_foreign++; /* ignored, left for its owner */
                t->st.n_get_misses++;
                pgd__rix_remove(&t->ix, blocks[i]);
                results[i] = PGD_ENOTFOUND;
                break;
            default:
                if (v == PGD__RV_MAC)
                    note_mac_failure(t, gs[k].key);
                else
                    t->st.n_corrupt++;
                t->st.n_get_misses++;
                pgd__rix_remove(&t->ix, blocks[i]);
                queue_del(t, blocks[i]);
                results[i] = PGD_ENOTFOUND;
            }
        }
        pthread_mutex_unlock(&t->mu);
        for (size_t k = 0; k < m; k++)
            if (cs[k].reply) freeReplyObject(cs[k].reply);
    }
    pgd__free(&t->al, gs);
    pgd__free(&t->al, cs);
    pgd__free(&t->al, idx);
    pgd__free(&t->al, verdict);
    if (cause) note_state(t, cause);
    for (size_t i = 0; i < n && results[i] == PGD_OK; i++)
        n_ok++;
    return n_ok;
}

static int redis_get(void *state, pgd_hash block, void *page, void *bounds)
{
    int result;
    void *pages[1] = {page};
    void *bs[1] = {bounds};
    redis_get_many(state, 1, &block, pages, bs, &result);
    return result;
}

static size_t redis_lookup(void *state, const pgd_hash *hashes, size_t n)
{
    rtier *t = state;
    size_t i = 0;
    pthread_mutex_lock(&t->mu);
    if (!t->bound) {
        pthread_mutex_unlock(&t->mu);
        return 0;
    }
    uint32_t now = now_s();
    while (i < n && (q_live(t, hashes[i]) || pgd__rix_find(&t->ix, hashes[i], now, t->p.ttl_s)))
        i++;
    size_t first = i;
    if (i == n || is_down(t)) {
        pthread_mutex_unlock(&t->mu);
        return i;
    }
    /* The rest of the run: what the index does not know, one EXISTS each, pipelined. */
    size_t m = 0;
    uint8_t *known = pgd__calloc(&t->al, n - first, 1);
    rget *gs = pgd__calloc(&t->al, n - first, sizeof *gs);
    pgd__rc_cmd *cs = pgd__calloc(&t->al, n - first, sizeof *cs);
    if (!known || !gs || !cs) {
        pthread_mutex_unlock(&t->mu);
        goto out;
    }
    for (size_t j = first; j < n; j++) {
        known[j - first] = j > first && (q_live(t, hashes[j]) ||
                                         pgd__rix_find(&t->ix, hashes[j], now, t->p.ttl_s));
        if (known[j - first]) continue;
        rget *g = &gs[m];
        size_t kl = pgd__redis_key(t->p.ns, t->ident_hash, hashes[j], g->key, sizeof g->key);
        g->argv[0] = "EXISTS";
        g->len[0] = 6;
        g->argv[1] = g->key;
        g->len[1] = kl;
        cs[m].argc = 2;
        cs[m].argv = g->argv;
        cs[m].argvlen = g->len;
        cs[m].key = 1;
        m++;
    }
    t->st.n_lookups_remote++;
    pthread_mutex_unlock(&t->mu);
    pgd__rc_exec(t->rc, cs, m, 0);
    const char *cause = NULL;
    pthread_mutex_lock(&t->mu);
    size_t k = 0;
    int run = 1;
    for (size_t j = first; j < n; j++) {
        if (known[j - first]) {
            i += (size_t)run;
            continue;
        }
        pgd__rc_cmd *c = &cs[k++];
        int present =
            c->status == PGD_OK && c->reply->type == REDIS_REPLY_INTEGER && c->reply->integer > 0;
        if (c->status != PGD_OK) cause = c->timed_out ? "timed out" : "connection failed";
        if (present) pgd__rix_add(&t->ix, hashes[j], now, PGD__RIX_SEEN);
        run = run && present;
        i += (size_t)run;
        if (c->reply) freeReplyObject(c->reply);
    }
    pthread_mutex_unlock(&t->mu);
    if (cause) note_state(t, cause);
out:
    pgd__free(&t->al, known);
    pgd__free(&t->al, gs);
    pgd__free(&t->al, cs);
    return i;
}

static int redis_del(void *state, pgd_hash block)
{
    rtier *t = state;
    int queued = 0;
    pthread_mutex_lock(&t->mu);
    if (!t->bound) {
        pthread_mutex_unlock(&t->mu);
        return PGD_ENOTFOUND;
    }
    put_item *it = q_find(t, block), *unqueued = NULL;
    if (it) {
        queued = 1;
        if (it->in_flight) {
            it->cancelled = 1; /* the writer DELs it once written */
        } else {
            q_unlink(t, it);
            t->q_bytes -= t->value_bytes;
            unqueued = it;
        }
    }
    pgd__rix_remove(&t->ix, block);
    pthread_mutex_unlock(&t->mu);
    pgd__free(&t->al, unqueued);

    rget g;
    pgd__rc_cmd c;
    memset(&c, 0, sizeof c);
    size_t kl = pgd__redis_key(t->p.ns, t->ident_hash, block, g.key, sizeof g.key);
    g.argv[0] = "DEL";
    g.len[0] = 3;
    g.argv[1] = g.key;
    g.len[1] = kl;
    c.argc = 2;
    c.argv = g.argv;
    c.argvlen = g.len;
    c.key = 1;
    int rc = PGD_EIO;
    if (!is_down(t)) {
        pgd__rc_exec(t->rc, &c, 1, 0);
        if (c.status == PGD_OK && c.reply->type == REDIS_REPLY_INTEGER)
            rc = c.reply->integer > 0 || queued ? PGD_OK : PGD_ENOTFOUND;
        if (c.reply) freeReplyObject(c.reply);
        if (c.status != PGD_OK) note_state(t, c.timed_out ? "timed out" : "connection failed");
    } else if (queued) {
        rc = PGD_OK; /* never written */
    }
    if (rc == PGD_OK && t->evs) ev_push(t, PGD_KV_EVENT_REMOVED, &block, 1, block, 0, "redis");
    return rc;
}

static void redis_stats(void *state, pgd_tier_stats *out)
{
    rtier *t = state;
    pgd__rc_stats rs;
    pgd__rc_get_stats(t->rc, &rs);
    pthread_mutex_lock(&t->mu);
    *out = t->st;
    out->n_records = t->bound ? t->ix.n_mine : 0;
    out->bytes_used = out->n_records * t->value_bytes;
    out->put_queue_bytes = t->q_bytes;
    pthread_mutex_unlock(&t->mu);
    out->bytes_capacity = 0; /* Redis's maxmemory decides */
    out->remote = 1;
    out->cluster = rs.cluster;
    out->n_nodes = rs.n_nodes;
    out->n_nodes_up = rs.n_nodes_up;
    out->n_reconnects = rs.n_reconnects;
    out->n_connect_failures = rs.n_connect_failures;
    out->n_timeouts = rs.n_timeouts;
    out->n_moved = rs.n_moved;
    out->n_ask = rs.n_ask;
    out->n_slot_refreshes = rs.n_slot_refreshes;
    pthread_mutex_lock(&t->emu);
    out->n_events = t->n_events;
    out->n_events_dropped = t->n_events_dropped;
    pthread_mutex_unlock(&t->emu);
}

/* Waits (at most FLUSH_MS) until the queues are written: puts, DELs and events. */
static int redis_flush(void *state)
{
    rtier *t = state;
    uint64_t until = now_ns() + FLUSH_MS * 1000000ull;
    int rc = PGD_OK;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        pthread_mutex_lock(&t->emu);
        uint32_t ev_n = t->ev_n;
        pthread_mutex_unlock(&t->emu);
        if (!t->q_n && !t->n_dels && !t->n_rets && !ev_n && !t->busy) break;
        if (now_ns() >= until) {
            rc = PGD_EIO;
            break;
        }
        pthread_cond_signal(&t->wake);
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += 10 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&t->done, &t->mu, &ts);
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

static void redis_close(void *state)
{
    rtier *t = state;
    if (!t) return;
    if (t->writer_started) {
        pthread_mutex_lock(&t->mu);
        t->stop = 1;
        pthread_cond_signal(&t->wake);
        pthread_mutex_unlock(&t->mu);
        pthread_join(t->writer, NULL);
    }
    while (t->qhead) {
        put_item *it = t->qhead;
        q_unlink(t, it);
        pgd__free(&t->al, it);
    }
    pgd__rc_destroy(t->rc);
    pgd__redis_mac_deinit(&t->mac);
    pgd__rix_deinit(&t->ix, &t->al);
    pgd__free(&t->al, t->dels);
    pgd__free(&t->al, t->wcmds);
    pgd__free(&t->al, t->w_items);
    pgd__free(&t->al, t->w_dels);
    pgd__free(&t->al, t->rets);
    pgd__free(&t->al, t->w_rets);
    pgd__free(&t->al, t->rcs);
    pgd__free(&t->al, t->ev_json);
    pgd__free(&t->al, t->evs);
    pgd__free(&t->al, t->strs);
    pthread_cond_destroy(&t->wake);
    pthread_cond_destroy(&t->done);
    pthread_mutex_destroy(&t->mu);
    pthread_mutex_destroy(&t->emu);
    pthread_mutex_destroy(&t->lmu);
    pgd__alloc al = t->al;
    pgd__free(&al, t);
}

/* Retention (the file header): never a round trip here (the caller holds the cache
 * lock). PGD_OK (applied to the queued put, or queued), PGD_ENOTFOUND (this instance does
 * not know the block: the command is queued anyway, for another instance may have written
 * it), PGD_EIO (Redis down, or RET_CAP commands queued: dropped), PGD_EINVAL. */
static int redis_retain(void *state, pgd_hash block, const pgd_tier_retention *r)
{
    rtier *t = state;
    if (!r) return PGD_EINVAL;
    /* What the key's TTL becomes: 0 none (PERSIST), > 0 this, -1 nothing to do. */
    int64_t ttl = -1;
    if (r->pin > 0)
        ttl = 0;
    else if (r->ttl_s)
        ttl = (int64_t)(r->ttl_s > UINT32_MAX ? UINT32_MAX : r->ttl_s);
    else if (r->pin < 0 && t->p.ttl_s)
        ttl = t->p.ttl_s;
    pthread_mutex_lock(&t->mu);
    if (!t->bound) {
        pthread_mutex_unlock(&t->mu);
        return PGD_EINVAL;
    }
    put_item *it = q_live(t, block);
    int known = it || pgd__rix_find(&t->ix, block, now_s(), t->p.ttl_s);
    int rc = known ? PGD_OK : PGD_ENOTFOUND;
    if (ttl < 0) {
        /* nothing to change in Redis (a priority: Redis orders by its own policy) */
    } else if (it && !it->in_flight) {
        it->ttl_s = ttl; /* its SET carries it */
    } else if (is_down(t) || t->n_rets >= RET_CAP) {
        t->st.n_io_errors++;
        rc = PGD_EIO;
    } else {
        t->rets[t->n_rets].block = block;
        t->rets[t->n_rets].ttl_s = (uint32_t)ttl;
        t->n_rets++;
        pthread_cond_signal(&t->wake);
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

static const pgd_tier_ops redis_ops = {
    "redis",     redis_bind,  redis_put,   redis_get,      redis_lookup, redis_del,
    redis_stats, redis_flush, redis_close, redis_get_many, redis_retain,
};

/* ---- create ---- */

/* Copies s into the string store at *used (cap bytes). Returns the copy or NULL. */
static const char *keep_str(char *strs, size_t cap, size_t *used, const char *s)
{
    size_t n = strlen(s) + 1;
    if (cap - *used < n) return NULL;
    char *out = strs + *used;
    memcpy(out, s, n);
    *used += n;
    return out;
}

static int create_fail(rtier *t, int rc, char *err, size_t errlen, const char *msg)
{
    if (msg && err && errlen && err[0] == '\0') snprintf(err, errlen, "%s", msg);
    if (t) {
        if (err && errlen && err[0]) pgd__logf(&t->lg, PGD_LOG_ERROR, "%s", err);
        redis_close(t);
    }
    return rc;
}

int pgd_tier_redis_create(const pgd_tier_redis_params *p, pgd_tier **out, char *err, size_t errlen)
{
    pgd__alloc al;
    char e2[512];
    if (err && errlen) err[0] = '\0';
    if (!out) return PGD_EINVAL;
    *out = NULL;
    if (!p || !p->url) return create_fail(NULL, PGD_EINVAL, err, errlen, "redis tier: no url");
    if (!p->key || p->key_len < 1 || p->key_len > 256)
        return create_fail(NULL, PGD_EINVAL, err, errlen,
                           "redis tier: the shared key (1..256 bytes) is required");
    pgd__alloc_init(&al, p->alloc);
    rtier *t = pgd__calloc(&al, 1, sizeof *t);
    if (!t) return PGD_ENOMEM;
    t->al = al;
    t->lg.fn = p->log;
    t->lg.ud = p->log_ud;
    pthread_mutex_init(&t->mu, NULL);
    pthread_mutex_init(&t->emu, NULL);
    pthread_mutex_init(&t->lmu, NULL);
    t->rc_lg.fn = rc_log;
    t->rc_lg.ud = t;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&t->wake, &ca);
    pthread_cond_init(&t->done, &ca);
    pthread_condattr_destroy(&ca);

    /* The URL's strings, then copies of the caller's (borrowed for the call). */
    size_t ul = strlen(p->url);
    size_t cap = 2 * ul + 64 + 3 * 256;
    size_t used = 0;
    t->strs = pgd__malloc(&al, cap);
    if (!t->strs) return create_fail(t, PGD_ENOMEM, err, errlen, NULL);
    size_t url_cap = 2 * ul + 64;
    t->p = *p;
    int rc = pgd__redis_url_parse(p->url, &t->p, &t->url, t->strs, url_cap, e2, sizeof e2);
    if (rc != PGD_OK) {
        if (err && errlen) snprintf(err, errlen, "redis tier: %s", e2);
        return create_fail(t, rc, err, errlen, NULL);
    }
    used = url_cap;
    /* Copies of the three strings, wherever they point (the URL's part of strs, or the
     * caller's memory): each at most 255 bytes. */
    char id[320];
    if (!t->p.instance_id) {
        char host[256] = "";
        if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "localhost");
        host[sizeof host - 1] = '\0';
        snprintf(id, sizeof id, "%.200s:%ld", host, (long)getpid());
        t->p.instance_id = id;
    }
    if (!t->p.ns) t->p.ns = "pgd";
    const char **strs[3] = {&t->p.ns, &t->p.events_stream, &t->p.instance_id};
    for (int i = 0; i < 3; i++)
        if (*strs[i])
            *strs[i] = strlen(*strs[i]) < 256 ? keep_str(t->strs, cap, &used, *strs[i]) : "";
    t->p.url = NULL;
    t->p.key = NULL;
    if (!t->p.ns || !*t->p.ns || !*t->p.instance_id ||
        (t->p.events_stream && !*t->p.events_stream) || !t->p.conns || !t->p.command_timeout_ms ||
        !t->p.connect_timeout_ms || !t->p.events_maxlen || !t->p.put_queue_bytes)
        return create_fail(t, PGD_EINVAL, err, errlen,
                           "redis tier: a bad parameter (ns, instance_id, events_stream, conns, "
                           "timeouts, events_maxlen or put_queue_bytes)");
    if (strchr(t->p.ns, '{') || strchr(t->p.ns, '}'))
        return create_fail(t, PGD_EINVAL, err, errlen,
                           "redis tier: the namespace may not hold braces");
    const pgd__rc_addr *s0 = &t->url.seeds[0];
    if (s0->port)
        snprintf(t->where, sizeof t->where, "%s:%d", s0->host, s0->port);
    else
        snprintf(t->where, sizeof t->where, "unix:%s", s0->host);
    if (t->url.n_seeds > 1) {
        size_t wl = strlen(t->where);
        snprintf(t->where + wl, sizeof t->where - wl, " and %zu more", t->url.n_seeds - 1);
    }

    rc = pgd__redis_mac_init(&t->mac, t->p.mac, p->key, p->key_len);
    if (rc == PGD_EINVAL && !pgd__redis_mac_name(t->p.mac))
        return create_fail(t, rc, err, errlen, "redis tier: an unknown mac (gmac or hmac)");
    if (rc != PGD_OK)
        return create_fail(t, rc, err, errlen,
                           t->p.mac == PGD_TIER_REDIS_MAC_GMAC
                               ? "redis tier: AES-256-GCM unavailable (OpenSSL)"
                               : "redis tier: HMAC-SHA256 unavailable (OpenSSL)");
    rc = pgd__rix_init(&t->ix, &al, RIX_ENTRIES);
    t->dels = pgd__calloc(&al, DEL_CAP, sizeof *t->dels);
    t->wcmds = pgd__calloc(&al, BATCH_PUTS + BATCH_DELS + BATCH_RETS + 1, sizeof *t->wcmds);
    t->rcs = pgd__calloc(&al, BATCH_PUTS + BATCH_DELS + BATCH_RETS + 1, sizeof *t->rcs);
    t->rets = pgd__calloc(&al, RET_CAP, sizeof *t->rets);
    t->w_rets = pgd__calloc(&al, BATCH_RETS, sizeof *t->w_rets);
    t->w_items = pgd__calloc(&al, BATCH_PUTS, sizeof *t->w_items);
    t->w_dels = pgd__calloc(&al, BATCH_DELS, sizeof *t->w_dels);
    if (t->p.events_stream) {
        t->evs = pgd__calloc(&al, EV_CAP, sizeof *t->evs);
        t->ev_json_cap = (size_t)EV_BATCH * (200 + 36 * EV_BLOCKS + 6 * MEDIUM_MAX) + 16;
        t->ev_json = pgd__malloc(&al, t->ev_json_cap);
        if (!t->evs || !t->ev_json) rc = PGD_ENOMEM;
    }
    if (rc != PGD_OK || !t->dels || !t->wcmds || !t->rcs || !t->w_items || !t->w_dels || !t->rets ||
        !t->w_rets)
        return create_fail(t, PGD_ENOMEM, err, errlen, NULL);

    pgd__rc_params rp;
    memset(&rp, 0, sizeof rp);
    rp.seeds = t->url.seeds;
    rp.n_seeds = t->url.n_seeds;
    rp.user = t->url.user;
    rp.password = t->url.password;
    rp.db = t->url.db;
    rp.connect_timeout_ms = t->p.connect_timeout_ms;
    rp.command_timeout_ms = t->p.command_timeout_ms;
    rp.conns = t->p.conns;
    rp.cluster = t->p.cluster;
    rp.log = &t->rc_lg;
    rp.al = &t->al;
    pthread_mutex_lock(&t->lmu);
    t->creating = 1;
    pthread_mutex_unlock(&t->lmu);
    rc = pgd__rc_create(&rp, &t->rc, e2, sizeof e2);
    pthread_mutex_lock(&t->lmu);
    t->creating = 0;
    t->cause[0] = '\0';
    pthread_mutex_unlock(&t->lmu);
    if (rc != PGD_OK) {
        if (err && errlen) snprintf(err, errlen, "redis tier: %s", e2);
        return create_fail(t, rc, err, errlen, NULL);
    }
    if (pthread_create(&t->writer, NULL, writer_main, t) != 0)
        return create_fail(t, PGD_ENOMEM, err, errlen,
                           "redis tier: cannot start its writer thread");
    t->writer_started = 1;
    rc = pgd__tier_new(&al, &redis_ops, t, out);
    if (rc != PGD_OK) return create_fail(t, rc, err, errlen, NULL);
    pgd__rc_stats rs;
    pgd__rc_get_stats(t->rc, &rs);
    pgd__logf(&t->lg, PGD_LOG_INFO, "redis tier: connected to %s (%s, %u node%s, ns %s)", t->where,
              rs.cluster ? "cluster" : "standalone", rs.n_nodes, rs.n_nodes == 1 ? "" : "s",
              t->p.ns);
    return PGD_OK;
}

/* ---- events and keys (tier_redis.h) ---- */

int pgd_tier_redis_publish(pgd_tier *tier, int type, const pgd_hash *blocks, size_t n,
                           pgd_hash parent, const char *medium)
{
    rtier *t = pgd__tier_state(tier, &redis_ops);
    if (!t || !medium) return PGD_EINVAL;
    if (type == PGD_KV_EVENT_CLEARED) {
        blocks = NULL;
        n = 0;
    } else if ((type != PGD_KV_EVENT_STORED && type != PGD_KV_EVENT_REMOVED) || !blocks || !n) {
        return PGD_EINVAL;
    }
    if (!t->evs) return PGD_ESTATE;
    return ev_push(t, type, blocks, n, parent, parent.lo || parent.hi, medium);
}

void pgd_tier_redis_on_register(void *tier, pgd_hash hash, pgd_hash parent, uint32_t depth,
                                uint32_t page)
{
    rtier *t = pgd__tier_state(tier, &redis_ops);
    (void)page;
    if (t && t->evs) ev_push(t, PGD_KV_EVENT_STORED, &hash, 1, parent, depth > 0, "pool");
}

void pgd_tier_redis_on_evict(void *tier, pgd_hash hash, uint32_t page)
{
    rtier *t = pgd__tier_state(tier, &redis_ops);
    (void)page;
    if (t && t->evs) ev_push(t, PGD_KV_EVENT_REMOVED, &hash, 1, hash, 0, "pool");
}

size_t pgd_tier_redis_key(const pgd_tier *tier, pgd_hash block, char *buf, size_t cap)
{
    rtier *t = pgd__tier_state(tier, &redis_ops);
    if (!t || !buf) return 0;
    pthread_mutex_lock(&t->mu);
    size_t n = t->bound ? pgd__redis_key(t->p.ns, t->ident_hash, block, buf, cap) : 0;
    pthread_mutex_unlock(&t->mu);
    return n;
}
