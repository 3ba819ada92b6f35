/* SPDX-License-Identifier: MIT */
/*
 * tier.h - storage tiers below the pool: page records keyed by block hash.
 *
 *     pool (pages, prefix index)  ->  tier 0 (e.g. RAM)  ->  tier 1 (e.g. disk)  -> ...
 *
 * A tier stores *page records*: one pool page's payload (its K/V bytes in the pool's
 * codec, then its key bounds when the pool keeps them) under the page's block hash, with
 * a header that says which model and geometry it belongs to and a checksum. The cache
 * manager (cache.h, pgd_cache_params.tiers) moves pages between the pool and its tiers on
 * background mover threads: demotion (write-back of evicted pages, or write-through of
 * committed ones) and promotion (the run of a prompt's blocks beyond the pool prefix that
 * the tiers hold). Each tier indexes its own records (a disk tier must, to survive a
 * restart; a shared remote tier must, since other instances write to it): the cache asks
 * the tiers, fastest first, which blocks they hold.
 *
 * THE PAGE RECORD (format version 1). All integers little-endian; a record is a 128-byte
 * header followed by payload_bytes of payload:
 *
 *   off size field
 *     0    8 magic "PGDKVREC"
 *     8    4 version (1)
 *    12    4 header_bytes (128)
 *    16   16 model fingerprint (lo, hi)           } the identity (pgd_record_ident):
 *    32    4 kv_type of the pool (pgd_kv_type)     } a record is data only for a cache
 *    36    4 n_layers                              } whose identity is equal in every
 *    40    4 n_kv_heads                            } field
 *    44    4 head_dim                              }
 *    48    4 page_tokens                           }
 *    52    4 flags (PGD_RECORD_ROTATED, PGD_RECORD_KEY_BOUNDS)
 *    56    8 rotate_seed (0 unless ROTATED)        }
 *    64   16 block hash (lo, hi)
 *    80   16 parent hash ({0, 0} for the first block of a chain)
 *    96    8 payload_bytes: bytes after the header, as stored
 *   104    4 store_type: pgd_kv_type of the stored payload (== kv_type unless a tier
 *            re-encoded it, a lossy choice the user made, e.g. ram:8G:q8_0)
 *   108    4 compression: PGD_RECORD_RAW, PGD_RECORD_LZ4, PGD_RECORD_ZSTD
 *   112    8 raw_bytes: payload bytes once decompressed (the store_type's page bytes plus
 *            the key bounds bytes)
 *   120    8 checksum: XXH3-64 (seed 0) of header bytes 0..119 followed by the payload
 *
 * A raw payload (store_type == kv_type, RAW) is exactly the page as the pool holds it
 * (pgd_pool_page_bytes bytes, layout.h) followed, with PGD_RECORD_KEY_BOUNDS, by the key
 * bounds: [n_layers][n_kv_heads] x (min[head_dim], max[head_dim]) f32.
 * A record whose magic, version, lengths or checksum is wrong is damaged (PGD_ECORRUPT);
 * one of another identity is foreign (PGD_EINVAL). Either is a miss: the tier counts it
 * and drops (damaged) or ignores (foreign) it; it is never data.
 *
 * Thread-safety: every pgd_tier_* call is safe from any thread (each tier has its own
 * lock). Lock order: the cache lock, then a tier's lock; a tier never calls into the cache.
 */
#ifndef PAGODA_TIER_H
#define PAGODA_TIER_H

#include "pagoda.h"
#include "pool.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- page records ---- */

#define PGD_RECORD_VERSION 1
#define PGD_RECORD_HEADER_BYTES 128

enum { PGD_RECORD_ROTATED = 1, PGD_RECORD_KEY_BOUNDS = 2 };           /* flags */
enum { PGD_RECORD_RAW = 0, PGD_RECORD_LZ4 = 1, PGD_RECORD_ZSTD = 2 }; /* compression */

/* What a record must match to be data for a cache: model and page geometry. */
typedef struct pgd_record_ident {
    pgd_hash model_fingerprint;
    uint32_t kv_type; /* pgd_kv_type of the pool */
    uint32_t n_layers, n_kv_heads, head_dim, page_tokens;
    uint32_t flags;        /* PGD_RECORD_ROTATED | PGD_RECORD_KEY_BOUNDS */
    uint64_t rotate_seed;  /* 0 unless ROTATED */
    uint64_t page_bytes;   /* pgd_pool_page_bytes of such a pool (derived, not stored) */
    uint64_t bounds_bytes; /* key bounds bytes per page: 0 without KEY_BOUNDS (derived) */
} pgd_record_ident;

/* Fills *out from pool params (geometry, kv type, rotation, key bounds) and a model
 * fingerprint; derives page_bytes and bounds_bytes. Returns PGD_OK or PGD_EINVAL (params
 * that pgd_pool_params_check refuses). Pure. */
PGD_API int pgd_record_ident_make(const pgd_pool_params *pool, pgd_hash model_fingerprint,
                                  pgd_record_ident *out);
/* Non-zero when a and b are the same identity (every stored field). */
PGD_API int pgd_record_ident_eq(const pgd_record_ident *a, const pgd_record_ident *b);

/* A record's header, decoded. */
typedef struct pgd_record_info {
    pgd_record_ident ident; /* page_bytes / bounds_bytes derived from the geometry */
    pgd_hash block, parent;
    uint64_t payload_bytes; /* as stored */
    uint32_t store_type;    /* pgd_kv_type of the payload */
    uint32_t compression;   /* PGD_RECORD_* */
    uint64_t raw_bytes;     /* decompressed payload bytes */
} pgd_record_info;

/* Writes the 128-byte header of a record for info (ident, block, parent, payload_bytes,
 * store_type, compression, raw_bytes) whose payload is payload[0..payload_bytes), checksum
 * included. Returns PGD_OK or PGD_EINVAL (an unknown type or compression). Pure. */
PGD_API int pgd_record_write_header(const pgd_record_info *info, const void *payload, void *header);
/* Decodes and verifies a header and its payload (payload may be NULL to check the header
 * alone: magic, version, lengths; then the checksum is not checked).
 * expect (may be NULL) is the identity the record must have. payload_len is the bytes
 * available at payload (a record longer than that is damaged).
 * Returns PGD_OK (*out filled), PGD_ECORRUPT (damaged: magic, version, header_bytes,
 * lengths that disagree with the geometry, checksum), PGD_EINVAL (foreign: the identity
 * differs from expect; *out filled). Pure. */
PGD_API int pgd_record_read_header(const void *header, const void *payload, uint64_t payload_len,
                                   const pgd_record_ident *expect, pgd_record_info *out);

/* ---- tiers ---- */

typedef struct pgd_tier pgd_tier; /* opaque handle: ops + state + name */

#define PGD_TIER_HIST_BUCKETS 12
/* Upper bounds in microseconds of the latency histogram buckets (the last is +inf):
 * 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 50000, +inf. */
PGD_API const double *pgd_tier_hist_bounds_us(void);

typedef struct pgd_tier_stats {
    uint64_t bytes_used;     /* payload + headers held */
    uint64_t bytes_capacity; /* the bound */
    uint64_t n_records;
    uint64_t n_puts, n_put_bytes;             /* records written (raw bytes given) */
    uint64_t n_gets, n_get_bytes;             /* records read into the pool (raw bytes) */
    uint64_t n_get_misses;                    /* gets of a block the tier did not have */
    uint64_t n_corrupt;                       /* damaged records found (get, scan): dropped */
    uint64_t n_foreign;                       /* records of another identity seen (scan): ignored */
    uint64_t n_io_errors;                     /* failed reads or writes (not ENOSPC) */
    uint64_t n_evictions;                     /* records dropped for capacity */
    uint64_t n_put_refused;                   /* puts refused: full (ENOSPC) or over capacity */
    int full;                                 /* nonzero: writes stopped (disk full) */
    uint64_t get_hist[PGD_TIER_HIST_BUCKETS]; /* get latency (pgd_tier_hist_bounds_us) */
    uint64_t put_hist[PGD_TIER_HIST_BUCKETS]; /* put latency */
    uint64_t get_ns_sum, put_ns_sum;          /* total latency of the gets / puts counted in
                                                 get_hist / put_hist, nanoseconds */
    /* Remote tiers (the Redis tier, tier_redis.h); all 0 for the local ones. */
    int remote;                  /* nonzero: a remote tier (the fields below are its own).
                                    The cache reads it once, at create: it looks a block up
                                    in a remote tier only to promote, never before a put
                                    (a round trip per eviction), so such a tier's put must
                                    itself skip what it knows it holds */
    int cluster;                 /* nonzero: Redis Cluster (slot routing), else standalone */
    uint32_t n_nodes;            /* nodes known (standalone: 1) */
    uint32_t n_nodes_up;         /* nodes connected now: < n_nodes is an outage */
    uint64_t n_reconnects;       /* connections re-established after a failure */
    uint64_t n_connect_failures; /* connection or AUTH attempts that failed */
    uint64_t n_timeouts;         /* commands past their timeout (the connection is dropped) */
    uint64_t n_deadline_misses;  /* gets abandoned at their deadline: the request computed */
    uint64_t n_mac_failures;     /* records whose MAC did not verify: counted, deleted */
    uint64_t n_moved, n_ask;     /* cluster redirections followed */
    uint64_t n_slot_refreshes;   /* slot map reloads (CLUSTER SLOTS) */
    uint64_t n_lookups_remote;   /* look-ups that asked the store (not answered locally) */
    uint64_t n_events, n_events_dropped; /* KV events published / dropped (queue full, down) */
    uint64_t put_queue_bytes;            /* puts accepted, not yet written */
} pgd_tier_stats;                        /* append fields only */

/* Called by put for each record it evicts to make room, with the tier's lock released,
 * the record's raw payload (page bytes, then bounds bytes; borrowed for the call), so the
 * caller can write it to the next tier (demotion). */
typedef void (*pgd_tier_spill_fn)(void *ud, pgd_hash block, pgd_hash parent, const void *page,
                                  const void *bounds);

/* A record's retention in a tier (pgd_tier_ops.retain). Times are wall-clock seconds
 * (a disk tier outlives the process; Redis counts TTLs itself). */
typedef struct pgd_tier_retention {
    uint32_t priority;     /* 0..100 (policy.h PGD_PRIORITY_DEFAULT): ordered by tiers whose
                              policy reads it (priority) */
    uint64_t ttl_s;        /* 0: none; else the record's retention ends ttl_s from now:
                              Redis sets it as the key's TTL (EXPIRE), local tiers evict it
                              first once past */
    int pin;               /* 1: pin (not evicted; Redis: PERSIST, kept under volatile-*
                              maxmemory policies), 0: leave pins, -1: unpin */
    uint64_t tenant;       /* pgd_tenant_stats.id of the page's tenant (quotas) */
    uint32_t tenant_index; /* its index in the cache, < 64 */
    double tenant_share;   /* the tenant's reserved share of this tier (pgd_tenant_params.
                              tier_share; 0: leaves the tier's record of it as it is).
                              The RAM and disk tiers keep such a tenant's records (those
                              retain named it on) from eviction while it holds no more
                              than share x capacity records */
} pgd_tier_retention;

/* The ops table of a tier (built-in: ram, disk; user: pgd_tier_wrap). Every member is
 * required; state is the pointer given to pgd_tier_wrap. Members may be called from
 * several threads at once. */
typedef struct pgd_tier_ops {
    const char *name; /* "ram", "disk", ...: metrics and usage report it */
    /* Sets the identity of the records this tier serves (once, by pgd_cache_create):
     * a disk tier scans its directory here. PGD_OK, PGD_EBUSY (bound to another
     * identity), PGD_EIO, PGD_EINVAL (a tier that cannot hold such records: the RAM
     * tier's store_type refused by the codec for this head_dim, a bound below one
     * record), PGD_ENOMEM. */
    int (*bind)(void *state, const pgd_record_ident *ident);
    /* Stores the record of block (parent: its chain parent) from the raw payload: page
     * (ident.page_bytes) and bounds (ident.bounds_bytes, NULL when 0). A block already
     * held is not written again (PGD_OK). May evict records (spill, when not NULL, gets
     * each). PGD_OK, PGD_ENOSPC (no room, writes stopped), PGD_EIO, PGD_ENOMEM. */
    int (*put)(void *state, pgd_hash block, pgd_hash parent, const void *page, const void *bounds,
               pgd_tier_spill_fn spill, void *spill_ud);
    /* Reads block's record into page / bounds (raw, as put took them), verifying it: a
     * damaged record is dropped and counted. PGD_OK, PGD_ENOTFOUND (not held, or damaged:
     * a miss either way), PGD_EIO, PGD_ENOMEM (decoding scratch; the record stays). */
    int (*get)(void *state, pgd_hash block, void *page, void *bounds);
    /* How many of hashes[0..n) in a row, from the first, this tier holds. */
    size_t (*lookup)(void *state, const pgd_hash *hashes, size_t n);
    /* Drops block's record. PGD_OK or PGD_ENOTFOUND. */
    int (*del)(void *state, pgd_hash block);
    void (*stats)(void *state, pgd_tier_stats *out);
    /* Makes every completed put durable (disk: fsync). PGD_OK or PGD_EIO. */
    int (*flush)(void *state);
    /* Frees the state (pgd_tier_close). */
    void (*close)(void *state);
    /* OPTIONAL (NULL: pgd_tier_get_many calls get once per block). Reads the records of
     * blocks[0..n) into pages[i] / bounds[i] (bounds[i] NULL when ident.bounds_bytes is 0)
     * as get does, in one batch (a remote tier pipelines them: one round trip, not n),
     * setting results[i] to what get would return for block i (PGD_EIO also for a block
     * not read by the tier's deadline). Returns how many blocks, from the first, read
     * PGD_OK in a row (a caller that needs a prefix stops there). */
    size_t (*get_many)(void *state, size_t n, const pgd_hash *blocks, void *const *pages,
                       void *const *bounds, int *results);
    /* OPTIONAL (NULL: the tier keeps no retention). Sets the retention of block's record
     * (pgd_tier_retention; the cache calls it after a put of a page whose retention is
     * not the default, and for pgd_cache_pin / unpin). PGD_OK, PGD_ENOTFOUND (not held),
     * PGD_ENOSPC (a pin past the tier's pin share: nothing changed). */
    int (*retain)(void *state, pgd_hash block, const pgd_tier_retention *r);
} pgd_tier_ops;

/* Wraps a user tier (ops borrowed while the tier lives; every member required except
 * get_many) in a handle. Returns PGD_OK, PGD_EINVAL (a NULL member) or PGD_ENOMEM. */
PGD_API int pgd_tier_wrap(const pgd_tier_ops *ops, void *state, pgd_tier **out);
/* Closes a tier (ops->close). NULL: no-op. No cache may still use it. */
PGD_API void pgd_tier_close(pgd_tier *t);
PGD_API const char *pgd_tier_name(const pgd_tier *t);
/* Dispatch to the ops (see pgd_tier_ops for what each returns). */
PGD_API int pgd_tier_bind(pgd_tier *t, const pgd_record_ident *ident);
PGD_API int pgd_tier_put(pgd_tier *t, pgd_hash block, pgd_hash parent, const void *page,
                         const void *bounds, pgd_tier_spill_fn spill, void *spill_ud);
PGD_API int pgd_tier_get(pgd_tier *t, pgd_hash block, void *page, void *bounds);
PGD_API size_t pgd_tier_get_many(pgd_tier *t, size_t n, const pgd_hash *blocks, void *const *pages,
                                 void *const *bounds, int *results);
PGD_API size_t pgd_tier_lookup(pgd_tier *t, const pgd_hash *hashes, size_t n);
PGD_API int pgd_tier_del(pgd_tier *t, pgd_hash block);
PGD_API void pgd_tier_get_stats(pgd_tier *t, pgd_tier_stats *out);
PGD_API int pgd_tier_flush(pgd_tier *t);
/* ops->retain, or PGD_ENOTSUP when the tier has none. */
PGD_API int pgd_tier_retain(pgd_tier *t, pgd_hash block, const pgd_tier_retention *r);
/* Nonzero when the tier has the retain op. */
PGD_API int pgd_tier_has_retain(const pgd_tier *t);

/* ---- the RAM tier (src/tier/ram.c) ---- */

typedef struct pgd_tier_ram_params {
    uint64_t capacity_bytes;    /* bound on bytes held (headers included); >= one record */
    int store_type;             /* -1: the pool's codec (lossless, default); else a
                                   pgd_kv_type to re-encode into (lossy: q8_0, q4_0) */
    uint32_t compression;       /* PGD_RECORD_RAW (default), _LZ4, _ZSTD (lossless) */
    const pgd_allocator *alloc; /* NULL: libc */
    pgd_log_fn log;             /* NULL: silent */
    void *log_ud;
    int policy;        /* pgd_policy_kind ordering its evictions (default
                          PGD_POLICY_LRU; belady is refused: no future) */
    double pin_share;  /* pinned records at most this share of the capacity
                          (0: 0.5) */
} pgd_tier_ram_params; /* append fields only */

PGD_API pgd_tier_ram_params pgd_tier_ram_default_params(void);
/* Creates an empty RAM tier (ordered within itself by params.policy, LRU by default;
 * leaf-only under every policy: it never drops a chain's middle while it holds the end;
 * retain: an expired record is evicted first, a pinned one is not evicted, pins bounded
 * by pin_share of the capacity). Records are allocated at put (one allocation each,
 * header included), freed at eviction; get verifies the checksum. With compression, a
 * record that does not shrink is stored RAW (the header says so); zstd runs at level 1.
 * The tier holds at most capacity_bytes / record bytes records (with compression: /
 * (header + raw / 16)), about 120 bytes of index each, reserved at bind. Defaults
 * (pgd_tier_ram_default_params): 1 GiB, the pool's codec, RAW, LRU, pin_share 0.5.
 * Returns PGD_OK, PGD_EINVAL (capacity 0, an unknown store_type or compression, a policy
 * that is unknown or belady, a pin_share outside (0, 1]: logged), PGD_ENOMEM. */
PGD_API int pgd_tier_ram_create(const pgd_tier_ram_params *p, pgd_tier **out);

/* ---- the disk tier (src/tier/disk.c) ---- */

typedef struct pgd_tier_disk_params {
    const char *dir;         /* directory (created 0700 if absent); borrowed for the call */
    uint64_t capacity_bytes; /* bound on bytes of records on disk */
    int fsync;               /* nonzero: fsync each record before it becomes visible */
    int o_direct;            /* nonzero: O_DIRECT record I/O (page-aligned, padded) */
    const pgd_allocator *alloc;
    pgd_log_fn log;
    void *log_ud;
    int policy;         /* as pgd_tier_ram_params.policy */
    double pin_share;   /* as pgd_tier_ram_params.pin_share */
} pgd_tier_disk_params; /* append fields only */

PGD_API pgd_tier_disk_params pgd_tier_disk_default_params(void);
/* Opens (or creates) a disk tier in p->dir: takes its lock file (a second process on the
 * same directory gets PGD_EBUSY, with a log line naming the holder), creates the stable
 * hash key (dir/key, 32 random bytes, mode 0600) if absent. The records are scanned by
 * bind. Returns PGD_OK, PGD_EINVAL, PGD_EBUSY, PGD_EIO (unreadable or unwritable
 * directory: the log names it), PGD_ENOMEM. */
PGD_API int pgd_tier_disk_create(const pgd_tier_disk_params *p, pgd_tier **out);
/* The directory's stable hash key (32 bytes) into key[0..32); for pgd_cache_params.hash_key
 * so that block hashes match after a restart. PGD_OK or PGD_EINVAL (not a disk tier). */
PGD_API int pgd_tier_disk_key(const pgd_tier *t, uint8_t key[32]);

/* Defaults (pgd_tier_disk_default_params): capacity 10 GiB, fsync off, o_direct off (a
 * filesystem that refuses O_DIRECT gets buffered I/O and a log line), LRU, pin_share 0.5
 * (policy and pins as the RAM tier's). Retention (retain) is kept in memory only: after a
 * restart the records have the default priority, no expiry and no pin. The tier keeps the
 * directory's absolute path (realpath at create).
 * The directory (disk.c's header has the whole layout):
 *   DIR/LOCK, DIR/key (0600), DIR/ident (the identity bound last, text),
 *   DIR/records/XX/<32 hex>.rec (one record per file, XX its first two hex digits),
 *   DIR/records/XX/<32 hex>.tmp.N (being written; removed by the next bind),
 *   DIR/quarantine/<32 hex>.rec (damaged records moved aside).
 * fsync: with p->fsync, a record is fsync'ed, renamed into place, then its directory is
 * fsync'ed: once put returns, the record survives a crash. Without, a crash may lose the
 * latest records (never serve a wrong one: a record that does not verify is a miss) and
 * pgd_tier_flush (syncfs) makes every completed put durable.
 * Disk full (ENOSPC / EDQUOT): stats.full = 1 and one log line; puts are refused
 * (n_put_refused) and gets go on; a put is tried again once an eviction or a del freed
 * space. create also returns PGD_ECORRUPT for a DIR/key that is not a 32-byte key file
 * (left as it is: moving it away starts afresh, and no record matches again). */

/* What pgd_tier_disk_inspect found in one file. */
enum {
    PGD_TIER_DISK_OK = 0,         /* a record that verifies, of the identity bound last (or
                                     of any identity when DIR/ident is absent) */
    PGD_TIER_DISK_DAMAGED = 1,    /* a record file that does not verify */
    PGD_TIER_DISK_FOREIGN = 2,    /* a record that verifies, of another identity */
    PGD_TIER_DISK_TEMP = 3,       /* a record being written, or cut short by a crash */
    PGD_TIER_DISK_QUARANTINED = 4 /* a file in quarantine/ (not verified) */
};

typedef struct pgd_tier_disk_file {
    const char *path;     /* relative to the directory; borrowed for the call */
    int kind;             /* PGD_TIER_DISK_* */
    int has_info;         /* info holds the decoded header (OK, FOREIGN) */
    pgd_record_info info; /* identity, block, parent, lengths */
    uint64_t file_bytes;  /* the file's size */
} pgd_tier_disk_file;

typedef void (*pgd_tier_disk_visit_fn)(void *ud, const pgd_tier_disk_file *f);

/* Walks a disk tier's directory without taking its lock (a running server's directory can
 * be inspected; a record written or evicted meanwhile may be missed or reported gone) and
 * changes nothing: each record is read whole and verified (header, name, size, checksum),
 * and visit is called once for each file of records/ and quarantine/ (other files are
 * skipped). *bound (may be NULL) gets the identity DIR/ident names. Returns 1 (bound
 * filled), 0 (no DIR/ident: every record that verifies is OK), PGD_EINVAL (a NULL
 * argument), PGD_ENOTFOUND (not a disk tier directory: no key and no records/) or PGD_EIO
 * (dir unreadable). Thread-safe; cost: reads every record. */
PGD_API int pgd_tier_disk_inspect(const char *dir, pgd_tier_disk_visit_fn visit, void *ud,
                                  pgd_record_ident *bound);
/* Removes every record, temp file and quarantined file of a disk tier's directory and its
 * DIR/ident, keeping DIR/key (so hashes stay stable) and DIR/LOCK; files it does not know
 * stay. Takes the lock for the duration: PGD_EBUSY (logged) while a tier holds it.
 * *n_removed (may be NULL) gets the files removed. Returns PGD_OK, PGD_EINVAL, PGD_EBUSY,
 * PGD_ENOTFOUND (not a disk tier directory) or PGD_EIO (logged). Thread-safe. */
PGD_API int pgd_tier_disk_clear(const char *dir, pgd_log_fn log, void *log_ud, uint64_t *n_removed);

#ifdef __cplusplus
}
#endif
#endif /* PAGODA_TIER_H */
