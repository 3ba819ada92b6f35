/* SPDX-License-Identifier: MIT */
/*
 * rclient.h - a small Redis client on hiredis for the Redis tier (redis.c): a pool of
 * connections per node, AUTH / SELECT, a timeout on connect and on every command, batches
 * pipelined per node under one deadline, reconnection with backoff, and Redis Cluster slot
 * routing (Debian packages no cluster client for hiredis):
 *
 *   slot(key)   CRC16-XMODEM (poly 0x1021, init 0) of the key's hash tag, mod 16384: the
 *               bytes between the first '{' and the next '}' when that is non-empty, else
 *               the whole key (the Cluster spec, "Keys hash tags")
 *   slot map    16384 entries -> master node, loaded with CLUSTER SLOTS at create and
 *               again ("refresh") after a MOVED or a failed node; masters only
 *   MOVED s h:p the slot lives elsewhere now: slot s -> node h:p in the map, the command
 *               is sent again there, and a refresh is scheduled
 *   ASK s h:p   one command, once: ASKING then the command on h:p; the map is unchanged
 *   TRYAGAIN    (a multi-key command during resharding) sent again after 1 ms, within
 *               the deadline
 * Standalone is a map whose every slot is the one node (no redirection expected; one that
 * comes is an error reply). A redirection chain longer than 5 hops is an error.
 *
 * Connections: params.conns per node, made at create (a cluster: one node's at a time, as
 * nodes are learnt). A caller takes free connections of the nodes its batch needs (waiting
 * at most until the deadline); a connection that errs or times out is closed and its node
 * is marked down (n_nodes_up drops) with a retry time (backoff 50 ms doubling to 5 s,
 * reset by a success). pgd__rc_tick, called often by the tier's writer thread, reconnects
 * down nodes whose time has come and refreshes the slot map when asked: a caller of
 * pgd__rc_exec never waits for a connection attempt to a known-down node (its commands
 * fail at once, PGD_EIO), and connects only to a node first learnt from a redirection
 * (bounded by the deadline).
 *
 * Thread-safety: every call but create / destroy is safe from any thread; one internal
 * lock guards the map, the nodes and the free lists (never held during I/O).
 * Internal to libpagoda (src/tier/redis/ and INTERNAL tests only).
 */
#ifndef PGD_TIER_RCLIENT_H
#define PGD_TIER_RCLIENT_H

#include <hiredis/hiredis.h>

#include "pgd_int.h"

#define PGD__RC_SLOTS 16384
#define PGD__RC_HOST_MAX 256

typedef struct pgd__rc pgd__rc;

/* Where a node is: host and port, or a unix socket path (port 0). */
typedef struct pgd__rc_addr {
    char host[PGD__RC_HOST_MAX]; /* a host name or address; or the socket's path */
    int port;                    /* 0: host is a unix socket path */
} pgd__rc_addr;

typedef struct pgd__rc_params {
    const pgd__rc_addr *seeds; /* [n_seeds]: tried in order until one answers */
    size_t n_seeds;
    const char *user;     /* ACL user, NULL: AUTH with the password alone */
    const char *password; /* NULL: no AUTH */
    int db;               /* SELECT db when > 0 (standalone only: a cluster refuses) */
    uint32_t connect_timeout_ms;
    uint32_t command_timeout_ms; /* default deadline of a batch (deadline_ns 0) */
    uint32_t conns;              /* connections per node, >= 1 */
    int cluster;                 /* -1: detect (INFO cluster: cluster_enabled), 0, 1 */
    const pgd__log *log;         /* borrowed while the client lives */
    const pgd__alloc *al;        /* copied */
} pgd__rc_params;

/* Connects to the first seed that answers, authenticates, detects cluster mode, loads
 * the slot map and connects every master. Returns PGD_OK, or with err (errlen bytes)
 * naming the node and the cause: PGD_EINVAL (AUTH refused: "WRONGPASS ..."/"NOAUTH ...",
 * SELECT on a cluster or refused, cluster forced on a standalone server or off on a
 * cluster node), PGD_EIO (no seed reachable; CLUSTER SLOTS unusable), PGD_ENOMEM. */
int pgd__rc_create(const pgd__rc_params *p, pgd__rc **out, char *err, size_t errlen);
/* Closes every connection. NULL: no-op. No call may be running. */
void pgd__rc_destroy(pgd__rc *rc);

/* One command of a batch. The caller fills argc / argv / argvlen (borrowed until exec
 * returns) and key (the argv index of the key that routes it, or -1: any node, e.g. PING
 * in standalone); exec fills the rest. */
typedef struct pgd__rc_cmd {
    int argc;
    const char **argv;
    const size_t *argvlen;
    int key;           /* argv index of the routing key, or -1 */
    redisReply *reply; /* out: the final reply (after redirections), the caller frees it
                          with freeReplyObject; NULL when status != PGD_OK */
    int status;        /* out: PGD_OK (a reply, maybe an error reply other than MOVED /
                          ASK / TRYAGAIN), PGD_EIO (node down, connection failed or timed
                          out, deadline passed, a redirection chain too long), PGD_ENOMEM */
    int timed_out;     /* out: nonzero when status is PGD_EIO because of the deadline or
                          a timeout */
    /* Optional (NULL: none): called by exec, on its thread, as soon as this command's final
     * reply is read (status PGD_OK, reply set), before the next reply is read; it may
     * consume the reply (freeReplyObject, then reply = NULL). A caller that opens large
     * values here keeps one reply alive at a time, not the batch (no heap growth and page
     * faults per batch), and works while the rest of the batch is still on the wire. */
    void (*on_reply)(struct pgd__rc_cmd *cmd);
    void *ud; /* the caller's, for on_reply */
} pgd__rc_cmd;

/* Runs cmds[0..n): grouped by node, one pipeline per node (appended, then the replies
 * read in order), the nodes' pipelines one after another on this thread; follows MOVED /
 * ASK / TRYAGAIN per command (see the file comment). deadline_ns: absolute
 * CLOCK_MONOTONIC nanoseconds (pgd__tier_now_ns), 0: now + command_timeout_ms; no socket
 * wait runs past it (hiredis's timeout is set to what is left). Returns how many commands
 * ended PGD_OK (each cmd says its own). */
size_t pgd__rc_exec(pgd__rc *rc, pgd__rc_cmd *cmds, size_t n, uint64_t deadline_ns);
/* One command (argv of argc NUL-terminated strings, key index as in pgd__rc_cmd), the
 * default deadline. Returns the reply (freeReplyObject) or NULL (down, timed out). */
redisReply *pgd__rc_command(pgd__rc *rc, int key, int argc, const char **argv);

/* Maintenance (the tier's writer thread calls it every few milliseconds): reconnects
 * down nodes whose retry time has come (one attempt each, connect_timeout_ms), reloads
 * the slot map when a redirection or a failure asked for it. Returns the nodes up. */
uint32_t pgd__rc_tick(pgd__rc *rc);

typedef struct pgd__rc_stats {
    int cluster;
    uint32_t n_nodes, n_nodes_up;
    uint64_t n_reconnects, n_connect_failures, n_timeouts;
    uint64_t n_moved, n_ask, n_tryagain, n_slot_refreshes;
} pgd__rc_stats;
void pgd__rc_get_stats(pgd__rc *rc, pgd__rc_stats *out);

/* ---- pure parts (unit tests and fuzz targets call them) ---- */

/* CRC16-XMODEM of buf[0..len) (the Cluster spec's: "123456789" -> 0x31C3). */
uint16_t pgd__rc_crc16(const void *buf, size_t len);
/* The cluster slot (0..16383) of key[0..len), hash tags honoured. */
uint32_t pgd__rc_key_slot(const void *key, size_t len);
/* Parses an error reply "MOVED 3999 127.0.0.1:6381" or "ASK 3999 127.0.0.1:6381" (the
 * host may be an IPv6 address; the port follows the last ':'). Returns 1 (MOVED) or 2
 * (ASK) with *slot and *to filled, 0 when it is neither, -1 when it is one of them but
 * malformed (a slot >= 16384, no port, a port out of range, a host too long). */
int pgd__rc_parse_redirect(const char *s, size_t len, uint32_t *slot, pgd__rc_addr *to);

/* One range of a CLUSTER SLOTS reply. */
typedef struct pgd__rc_range {
    uint32_t lo, hi; /* slots lo..hi inclusive */
    pgd__rc_addr master;
} pgd__rc_range;
/* Parses a CLUSTER SLOTS reply into out[0..cap) (masters only). An empty host ("" or
 * "?", Redis 7's "unknown endpoint") is replaced by fallback_host (the node that answered).
 * Returns the ranges, or -1 for a reply of another shape (not an array of
 * [lo, hi, [host, port, ...], ...] with lo <= hi < 16384, more ranges than cap). */
int pgd__rc_parse_slots(const redisReply *r, const char *fallback_host, pgd__rc_range *out,
                        size_t cap);

#endif /* PGD_TIER_RCLIENT_H */
