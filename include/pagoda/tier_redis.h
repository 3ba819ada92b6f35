/* SPDX-License-Identifier: MIT */
/*
 * tier_redis.h - the remote tier: page records in Redis or Redis Cluster, shared by every
 * engine instance that has the same model and the same key, and KV events for routers.
 *
 *     pool -> (ram) -> (disk) -> redis://host:port      (or alone: pool -> redis)
 *
 * Built when libpagoda is configured with PGD_WITH_REDIS=ON (the default; needs hiredis
 * and OpenSSL's libcrypto). The tier speaks RESP through hiredis; Redis Cluster slot
 * routing (CRC16 of the key's hash tag mod 16384, CLUSTER SLOTS, MOVED and ASK) is Pagoda's
 * own (src/tier/redis/rclient.c), since hiredis has none.
 *
 * KEYS AND VALUES. One record per value (bench_tier_redis measures value size against
 * throughput on loopback; a page record of a real model is already in the range where
 * Redis moves bytes at full speed, and one record per key keeps prefix look-ups exact):
 *
 *   key    NS ":" IDENT ":{" BLOCK "}"      e.g. pgd:1f0c...9a:{5e2b...07}
 *          NS      the namespace (params.ns, default "pgd")
 *          IDENT   16 hex digits: XXH3-64 of the record identity (model fingerprint, kv
 *                  type, geometry, rotation): another model or geometry never shares keys
 *          BLOCK   32 hex digits: the block hash (hi, lo), salted by tenant like every
 *                  block hash: tenants never share keys. Between braces: the cluster hash
 *                  tag, so a record's key has the slot of its own block and a chain's
 *                  records spread over every shard (a hot system prompt does not load one)
 *   value  the page record (tier.h: 128-byte header + payload, XXH3 checksum included),
 *          then a MAC trailer of params.mac's algorithm (option mac=gmac|hmac):
 *     gmac (default)  nonce (12 bytes, fresh random per value) || tag (16) || "PGM1"
 *                     tag = AES-256-GCM(mac_key, nonce, AAD = "pagoda-gmac-v1" || key ||
 *                     record), no plaintext: GMAC (NIST SP 800-38D)
 *     hmac            HMAC-SHA256(mac_key, key || record) (32 bytes) || "PGH1"
 *          mac_key = HMAC-SHA256(params.key, "pagoda redis record v1 gmac" | "... hmac"):
 *          one key per algorithm, from the instances' shared key (--hash-key-file, which
 *          also pins the block-hash key). The last 4 bytes only say which algorithm
 *          sealed the value; a value of the other algorithm is a MAC failure, so the
 *          instances sharing a namespace must agree on mac= (and on the key).
 *          GMAC is the default because it is cheap next to the GET itself: with AES-NI and
 *          PCLMULQDQ it costs about 0.1 ms per MiB sealed or opened where HMAC-SHA256
 *          (SHA-NI) costs about 0.75 ms, which made promotion CPU-bound on the MAC. Random
 *          96-bit nonces are good for 2^32 values per key (NIST SP 800-38D): change the
 *          shared key before the instances have written about four billion values.
 *   TTL    every SET has EX params.ttl_s (default 86400), so maxmemory-policy volatile-lru
 *          (or allkeys-lru) may evict records; an evicted record is a miss
 *   RETAIN pgd_tier_retain (tier.h): ttl_s -> EXPIRE key ttl_s, pin -> PERSIST key (no
 *          TTL: a volatile-* maxmemory-policy never evicts it; allkeys-* still may),
 *          unpin -> EXPIRE key params.ttl_s; a priority alone changes nothing (Redis
 *          orders evictions by its own maxmemory-policy: the tier has no policy=). Never
 *          a round trip on the caller's thread: a put still queued carries it in its SET,
 *          else the writer sends it after its SETs. Returns PGD_OK, PGD_ENOTFOUND (a
 *          block this instance does not know: sent anyway), PGD_EIO (down, or 4096
 *          commands queued: dropped, n_io_errors)
 *
 * A value whose MAC fails is forged or damaged: a miss, counted (n_mac_failures) and
 * DELeted. A value that verifies but is of another identity is foreign: ignored, counted
 * (n_foreign). A record is data only after the MAC, the checksum and the identity pass.
 *
 * NEVER ON THE REQUEST PATH PAST A DEADLINE. Puts are queued (bounded by
 * params.put_queue_bytes; over it a put is refused, n_put_refused) and written by the
 * tier's writer thread, pipelined (SET ... EX). Gets of a promotion are pipelined
 * (get_many); the batch has a deadline of deadline_ms + deadline_page_ms per page: what is
 * not read by then fails (n_deadline_misses) and the request computes those pages.
 * Look-ups answer from what the tier knows (blocks it wrote or read, kept in a local
 * index) and ask Redis (pipelined EXISTS) for the rest, bounded by command_timeout_ms.
 * Every command has a timeout; a connection that times out or fails is dropped, and the
 * writer thread reconnects with exponential backoff (50 ms doubling to 5 s). While a node
 * is down, calls that would use it fail at once (misses, refused puts): requests compute.
 *
 * KV EVENTS (optional: params.events_stream). Each batch of events is one entry XADDed to
 * the stream (MAXLEN ~ params.events_maxlen), following vLLM's KV events:
 *   fields  "instance" params.instance_id, "seq" batch number, "ts" unix seconds (float),
 *           "events" JSON array, each one of
 *     {"type":"BlockStored","block_hashes":["<32 hex>",...],"parent_block_hash":"<32 hex>"
 *      | null,"block_size":<page tokens>,"medium":"pool" | "redis" | <tier name>}
 *     {"type":"BlockRemoved","block_hashes":["<32 hex>",...],"medium":"pool" | ...}
 *     {"type":"AllBlocksCleared"}
 *   The tier publishes "redis" events for what it writes and deletes, AllBlocksCleared
 *   for its instance at bind (a new instance holds nothing in its pool), and "pool"
 *   events when its hooks are installed as the cache's prefix-index events (below).
 *
 * Thread-safety: every call is safe from any thread.
 */
#ifndef PAGODA_TIER_REDIS_H
#define PAGODA_TIER_REDIS_H

#include "tier.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The MAC that seals values (KEYS AND VALUES above). */
enum { PGD_TIER_REDIS_MAC_GMAC = 0, PGD_TIER_REDIS_MAC_HMAC = 1 };

typedef struct pgd_tier_redis_params {
    /* Where: "redis://[user:password@]host:port[/db]" (several seed nodes of a cluster:
     * "redis://host:port,host:port,..."), or "unix:///path/to/redis.sock[?db=N]".
     * Options may follow as a query string, "?name=value&...": ns, ttl, timeout_ms,
     * connect_timeout_ms, deadline_ms, deadline_page_ms, conns, cluster (0, 1, auto),
     * events (a stream name), instance, events_maxlen, queue (bytes, K/M/G suffixes),
     * mac (gmac, hmac); each sets the field of the same meaning below; also db, user and
     * password (for a unix socket, which has no user:password@ part). user:password, :password (no
     * ACL user) and option values are percent-decoded; the port defaults to 6379; IPv6 hosts go in
     * brackets. Borrowed for the call. */
    const char *url;
    /* The instances' shared key (required, 1..256 bytes): the MAC key is derived from it.
     * Borrowed for the call. */
    const uint8_t *key;
    size_t key_len;
    /* The fields below are defaults that the url's query string overrides. */
    const char *ns;              /* key namespace: "pgd" */
    uint32_t ttl_s;              /* EX of every record: 86400; 0: no expiry */
    uint32_t connect_timeout_ms; /* per connection attempt: 500 */
    uint32_t command_timeout_ms; /* per command or pipeline: 200 */
    uint32_t deadline_ms;        /* a get_many's deadline: deadline_ms + ... */
    uint32_t deadline_page_ms;   /* ... + deadline_page_ms per page: 20 + 5 per page (512
                                    KiB records of a 1b model reach fresh pool pages at
                                    ~335 MB/s here, 1.5 ms each; recomputing one is ~0.5 s) */
    uint32_t conns;              /* connections per node: 4 */
    int cluster;                 /* -1: detect (default), 0: standalone, 1: cluster */
    uint64_t put_queue_bytes;    /* bound on queued puts: 64 MiB */
    const char *events_stream;   /* NULL (default): no KV events */
    const char *instance_id;     /* events: NULL: "<hostname>:<pid>" */
    uint32_t events_maxlen;      /* events: XADD MAXLEN ~ N: 100000 */
    const pgd_allocator *alloc;  /* NULL: libc */
    pgd_log_fn log;              /* NULL: silent */
    void *log_ud;
    int mac;             /* the values' MAC, PGD_TIER_REDIS_MAC_*: GMAC (default) */
} pgd_tier_redis_params; /* append fields only */

PGD_API pgd_tier_redis_params pgd_tier_redis_default_params(void);

/* Applies url (the forms above; the query string's options override *p's fields) to *p.
 * String fields then point into storage (buf, cap bytes: 2x strlen(url) + 64 is always
 * enough) that must outlive *p's use. Returns PGD_OK, or PGD_EINVAL with err (errlen
 * bytes, may be 0) naming what is wrong: the scheme, the port, an option, its value.
 * Pure: connects to nothing. create calls it on p->url itself; a caller uses it to check
 * a URL early or to read its fields. */
PGD_API int pgd_tier_redis_parse_url(const char *url, pgd_tier_redis_params *p, char *buf,
                                     size_t cap, char *err, size_t errlen);

/* Connects to Redis (every seed until one answers; with a cluster, loads the slot map and
 * connects to every master), authenticates (AUTH password, or AUTH user password for an
 * ACL user; SELECT db), and starts the writer thread. Returns PGD_OK, or, with err naming
 * the cause (host:port and Redis's own message): PGD_EINVAL (a bad url, key or mac, a wrong
 * password or user: "WRONGPASS ...", a db on a cluster), PGD_EIO (no seed reachable, a
 * node that is not Redis), PGD_ENOMEM. err may be NULL (errlen 0); the log gets the same
 * line. The tier's name is "redis". */
PGD_API int pgd_tier_redis_create(const pgd_tier_redis_params *p, pgd_tier **out, char *err,
                                  size_t errlen);

/* ---- KV events ---- */

enum { PGD_KV_EVENT_STORED = 1, PGD_KV_EVENT_REMOVED = 2, PGD_KV_EVENT_CLEARED = 3 };

/* Queues one event for t's events stream (see the file comment): blocks[0..n) (in chain
 * order for STORED, whose parent is blocks[0]'s; NULL/0 for CLEARED), medium a short name
 * ("pool", "ram", ...; copied). Never blocks: the writer thread publishes batches; a full
 * queue or a down Redis drops the event (n_events_dropped). Returns PGD_OK, PGD_EINVAL
 * (not a Redis tier, or a bad argument), PGD_ESTATE (no events_stream configured), or
 * PGD_ENOSPC (dropped). */
PGD_API int pgd_tier_redis_publish(pgd_tier *t, int type, const pgd_hash *blocks, size_t n,
                                   pgd_hash parent, const char *medium);
/* Prefix-index hooks that publish "pool" events: set pgd_cache_params.on_register /
 * on_evict to these and event_ud to the Redis tier (a pgd_tier *). Cheap (a queue push
 * under the tier's event lock), safe under the cache lock. */
PGD_API void pgd_tier_redis_on_register(void *tier, pgd_hash hash, pgd_hash parent, uint32_t depth,
                                        uint32_t page);
PGD_API void pgd_tier_redis_on_evict(void *tier, pgd_hash hash, uint32_t page);

/* The key of block's record in t ("NS:IDENT:{BLOCK}", NUL-terminated, into buf[0..cap)):
 * what redis-cli shows and tests overwrite. Valid once the tier is bound. Returns the
 * key's length, or 0 (not a Redis tier, not bound, cap too small). */
PGD_API size_t pgd_tier_redis_key(const pgd_tier *t, pgd_hash block, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif /* PAGODA_TIER_REDIS_H */
