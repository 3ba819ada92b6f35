/* SPDX-License-Identifier: MIT */
/*
 * pgd_int.h - declarations shared by libpagoda's modules (the role of sqliteInt.h).
 * Never included by engine/, server/ or tools/: they use include/pagoda/ only.
 * Internal non-static names use the pgd__ prefix.
 */
#ifndef PGD_INT_H
#define PGD_INT_H

#include <stdint.h>
#include <stddef.h>
#include <stdlib.h>

#include "pagoda/pagoda.h"
#include "pagoda/pool.h"
#include "pagoda/layout.h"
#include "pagoda/cache.h"
#include "codec/codec_int.h"

/* ---- asserts ---- */

/* Always on: anything that would corrupt memory if it failed. */
#define PGD_CHECK(x)                                                                               \
    do {                                                                                           \
        if (!(x)) pgd__check_fail(__FILE__, __LINE__, #x);                                         \
    } while (0)
void pgd__check_fail(const char *file, int line, const char *expr);

#ifdef NDEBUG
#define pgd_assert(x) ((void)0)
#else
#define pgd_assert(x) PGD_CHECK(x)
#endif

/* ---- allocation (through the user's allocator) ---- */

typedef struct pgd__alloc {
    pgd_allocator a; /* resolved: never NULL members */
} pgd__alloc;

void pgd__alloc_init(pgd__alloc *al, const pgd_allocator *user);
void *pgd__malloc(const pgd__alloc *al, size_t n);
void *pgd__calloc(const pgd__alloc *al, size_t count, size_t size); /* overflow-checked */
void *pgd__realloc(const pgd__alloc *al, void *p, size_t n);
void pgd__free(const pgd__alloc *al, void *p);

/* ---- logging ---- */

typedef struct pgd__log {
    pgd_log_fn fn;
    void *ud;
} pgd__log;

void pgd__logf(const pgd__log *lg, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- hashing (util/hash.c) ---- */

#define PGD__SECRET_BYTES 192

typedef struct pgd__hasher {
    uint8_t secret[PGD__SECRET_BYTES]; /* XXH3 secret derived from the key */
    pgd_hash fingerprint;
} pgd__hasher;

/* Derives the XXH3 secret from key (key_len 1..256) or from fresh randomness when key
 * is NULL. Returns PGD_OK or PGD_EIO (no randomness). */
int pgd__hasher_init(pgd__hasher *h, const uint8_t *key, size_t key_len, pgd_hash fingerprint);
/* h_{-1}: seed of a chain for one tenant. */
pgd_hash pgd__hash_seed(const pgd__hasher *h, const void *salt, size_t salt_len);
/* h_i = H(key, prev || tokens[0..n)). */
pgd_hash pgd__hash_block(const pgd__hasher *h, pgd_hash prev, const int32_t *tokens, size_t n);

/* ---- prefix index (index.c) ---- */

#define PGD__NONE UINT32_MAX

typedef struct pgd__index pgd__index;

/* Where a block's K/V lives: tier 0 is the pool (id = pool page id); tier T > 0 is the
 * T-th storage tier (id = the tier's block id). The cache indexes pool pages only: each
 * storage tier indexes its own records (a disk tier must, to survive a restart; a shared
 * remote tier must, since others write to it) and the cache asks them (tier.h). The index
 * stores and returns any location. */
#define PGD__TIER_POOL 0
#define PGD__TIER_MAX 254
typedef struct pgd__loc {
    uint32_t id;  /* pool page id (tier 0) or the tier's block id */
    uint8_t tier; /* PGD__TIER_POOL .. PGD__TIER_MAX */
} pgd__loc;

static inline pgd__loc pgd__loc_pool(uint32_t page_id)
{
    pgd__loc l = {page_id, PGD__TIER_POOL};
    return l;
}

/* 32 bytes: the tier of an entry's location is kept apart (pgd__index_loc), since a
 * 40-byte entry made bench_cache's warm match 3% slower (0.387 -> 0.398 ms, 8192 pages). */
typedef struct pgd__entry {
    pgd_hash hash;
    uint32_t parent;     /* entry id of h_{i-1}, or PGD__NONE for a first block */
    uint32_t n_children; /* cached entries whose parent is this one */
    uint32_t depth;      /* 0 for the first block of a chain */
    uint32_t loc_id;     /* pgd__loc.id: the pool page when the tier is PGD__TIER_POOL */
} pgd__entry;

/* An index of at most capacity entries; ids are 0..capacity-1. Memory reserved up front.
 * The capacity is the number of blocks it can describe, wherever they live: independent
 * of the pool's page count. Returns PGD_OK, PGD_EINVAL (0 or above 2^31) or PGD_ENOMEM. */
int pgd__index_create(const pgd__alloc *al, uint32_t capacity, pgd__index **out);
void pgd__index_destroy(pgd__index *ix);
/* Returns the entry id for hash, or PGD__NONE. O(1) expected. */
uint32_t pgd__index_find(const pgd__index *ix, pgd_hash hash);
/* Inserts hash -> loc under parent (PGD__NONE for a root). The hash must be absent.
 * Returns the new entry id, or PGD__NONE when the index is full. */
uint32_t pgd__index_insert(pgd__index *ix, pgd_hash hash, uint32_t parent, pgd__loc loc);
/* The location of a live entry. */
pgd__loc pgd__index_loc(const pgd__index *ix, uint32_t entry_id);
/* Moves a live entry to another location (a block changing tier). */
void pgd__index_set_loc(pgd__index *ix, uint32_t entry_id, pgd__loc loc);
/* Removes a leaf entry (n_children == 0); decrements its parent's child count. */
void pgd__index_remove(pgd__index *ix, uint32_t entry_id);
const pgd__entry *pgd__index_entry(const pgd__index *ix, uint32_t entry_id);
uint32_t pgd__index_size(const pgd__index *ix);
uint32_t pgd__index_capacity(const pgd__index *ix);
/* Integrity: table and entries agree, child counts exact, parents live. */
int pgd__index_check(const pgd__index *ix, const pgd__log *lg);

/* ---- mover threads (tier/mover.c) ----
 *
 * Two classes of jobs for the cache's tier movement, each served by its own threads: fills
 * (promotion: a request waits) at normal priority, background jobs (puts, prefetches) at the
 * lowest. A job is a node embedded in its owner's memory: submit allocates nothing and never
 * blocks. fn runs on a mover thread with no lock held; the mover never touches the job
 * after fn returns. */
typedef struct pgd__job pgd__job;
typedef void (*pgd__job_fn)(pgd__job *job);
struct pgd__job {
    pgd__job *next; /* queue link (the mover's; the caller's chain link at submit) */
    pgd__job_fn fn;
};
enum { PGD__JOB_FILL = 0, PGD__JOB_BACKGROUND = 1 }; /* job classes */
typedef struct pgd__mover pgd__mover;

/* Starts n_threads (1..64) threads per class over queues of at most max_jobs jobs in all;
 * the fill threads also run background jobs while help_depth (0: never) or more of them
 * are queued. Returns PGD_OK, PGD_EINVAL or PGD_ENOMEM (also when a thread cannot start:
 * logged). lg is borrowed until destroy. */
int pgd__mover_create(const pgd__alloc *al, const pgd__log *lg, uint32_t n_threads,
                      uint32_t max_jobs, uint32_t help_depth, pgd__mover **out);
/* Queues chain (a job and those linked from it by next, NULL-terminated; fn set by the
 * caller) in class cls (PGD__JOB_*), all or none. Returns PGD_OK, PGD_EINVAL, or PGD_EBUSY
 * when they do not all fit in max_jobs or the mover is stopping (nothing queued). Never
 * blocks on a job; may be called with the cache lock held. */
int pgd__mover_submit(pgd__mover *m, pgd__job *chain, int cls);
/* Waits until no job is queued or running. Must not be called with a lock that jobs take
 * (the cache lock). NULL: no-op. */
void pgd__mover_drain(pgd__mover *m);
/* Jobs queued plus running. */
uint32_t pgd__mover_depth(pgd__mover *m);
/* Runs every queued job, then joins the threads and frees the mover. NULL: no-op. */
void pgd__mover_destroy(pgd__mover *m);

/* ---- eviction policy (policy/, ops table in include/pagoda/policy.h) ---- */

extern const pgd_policy_ops pgd__policy_lru;
extern const pgd_policy_ops pgd__policy_belady;
extern const pgd_policy_ops pgd__policy_s3fifo;
extern const pgd_policy_ops pgd__policy_arc;

/* Ghost lists of evicted block hashes (policy/ghost.c): a fixed pool of cap entries shared
 * by PGD__GHOST_LISTS FIFO lists, with a hash set over them. Nothing allocates after
 * init. A hash is in at most one list. */
#define PGD__GHOST_LISTS 2
#define PGD__GHOST_FREE 0xff
typedef struct pgd__ghost_node {
    pgd_hash hash;
    uint32_t prev, next; /* list links (next: the free list too) */
    uint32_t list;       /* 0..PGD__GHOST_LISTS-1, PGD__GHOST_FREE if free */
    uint32_t slot;       /* its table slot */
} pgd__ghost_node;
typedef struct pgd__ghost_slot {
    uint32_t node; /* PGD__NONE: empty */
    uint32_t tag;  /* the hash's mixed upper bits; tag & mask is the home slot */
} pgd__ghost_slot;
typedef struct pgd__ghost {
    uint32_t cap, mask;                                      /* entries; hash table size - 1 */
    pgd__ghost_slot *table;                                  /* [mask+1] */
    pgd__ghost_node *node;                                   /* [cap] */
    uint32_t free;                                           /* first free node */
    uint32_t head[PGD__GHOST_LISTS], tail[PGD__GHOST_LISTS]; /* newest, oldest */
    uint32_t len[PGD__GHOST_LISTS];
} pgd__ghost;
/* Returns PGD_OK or PGD_ENOMEM (g zeroed). cap 0 is taken as 1. */
int pgd__ghost_init(pgd__ghost *g, const pgd__alloc *al, uint32_t cap);
void pgd__ghost_deinit(pgd__ghost *g, const pgd__alloc *al);
/* The list holding h, or -1. */
int pgd__ghost_find(const pgd__ghost *g, pgd_hash h);
/* Adds h at the newest end of list l (moving it if it is in a list). When all cap entries
 * are used, first drops the oldest entry of l (of the other list if l is empty). */
void pgd__ghost_push(pgd__ghost *g, int l, pgd_hash h);
/* Drops h if present. */
void pgd__ghost_del(pgd__ghost *g, pgd_hash h);
/* Drops the oldest entry of list l, if any. */
void pgd__ghost_pop(pgd__ghost *g, int l);
extern const pgd_policy_ops pgd__policy_priority; /* policy/priority.c */
extern const pgd_policy_ops pgd__policy_cost;     /* policy/cost.c */
/* Ghost entries of the cost policy per pool page (16 bytes each; rounded up to a power of
 * two). On the Mooncake trace, token hit ratio / LRU's at 1/3/10/30% of its unique blocks:
 * 4: 1.12/1.06/1.04/1.05; 8: 1.06/1.11/1.05/1.05; 32: 1.14/1.15/1.04/1.05; 100 (more than
 * all its blocks at 1-3%): 1.14/1.15/1.04/1.05. */
#ifndef PGD__POLICY_COST_GHOST
#define PGD__POLICY_COST_GHOST 32
#endif
/* Ways of a ghost set: the table has the fewest power-of-two sets of this many entries that
 * hold PGD__POLICY_COST_GHOST x n_pages (below 2^30 entries). */
#define PGD__POLICY_COST_WAYS 4
/* The ghost's key of a block hash (a false match: ~n^2 / 2^65); its low bits pick the set. */
uint64_t pgd__policy_cost_ghost_key(pgd_hash h);
/* The value of a page in the cost policy (policy/cost.c's header): H = inflation +
 * f^a x (1 + b x depth) x (cost / bytes)^c. Pure; exposed for the reference in tests. */
double pgd__policy_cost_value(double inflation, uint32_t freq, double cost, double bytes,
                              uint32_t depth);

/* ---- the residual ring of staged codecs (cache.c), for src/attn/ ----
 *
 * For a staged pool (pgd__codec_staged: kivi2, q8_0 / q4_0 with head_dim < 32), returns the
 * sequence's f16 ring, laid out [n_layers][K|V][n_kv_heads][window][head_dim], position p
 * in slot p % window, and lo, a multiple of page_tokens: the lowest page start whose ring
 * copy is valid (ring_lo: 0 for a fresh sequence, the matched length after pgd_seq_match,
 * raised by truncation; and at least page_ceil(hi - window), hi the highest position
 * written plus one). THE RULE: a query row at position r reads the keys
 * of its own page (page r / page_tokens) from the ring when that page starts at or above
 * lo, and every other page from the pool (decoded by the codec). So which copy of a key a
 * query reads depends only on the two positions, not on the chunking of the prefill, on
 * decode, on preemption or on a prefix hit; the cache keeps the whole page of every
 * position written in the ring (the window grows for long writes).
 * Allocates the ring if the sequence has none yet (zeros). The ring stays valid until the
 * next pgd_seq_write_kv or pgd_seq_destroy of the sequence (a write may move it to a larger
 * ring; not concurrently with attention on the same sequence, the engine's order of calls).
 * Returns PGD_OK, PGD_EINVAL (not a staged pool) or PGD_ENOMEM. Takes the cache lock. */
int pgd__seq_residual(pgd_cache *c, pgd_seq *s, const uint16_t **ring, uint32_t *window,
                      uint64_t *lo);

/* The dead slots of a compacted sequence (pgd_seq_compact): for layer l and KV head h,
 * slots [n_live[l * n_kv_heads + h], *mask_len) are dead (attention gives them weight 0);
 * every slot >= *mask_len is live. *n_live NULL (and *mask_len 0): no dead slots. When set,
 * 1 <= n_live[i] <= *mask_len <= length and some n_live[i] < *mask_len. The array is the
 * sequence's (a fork has its own copy), valid until s is compacted again, truncated below
 * *mask_len (which clips it, or drops it when no dead slot is left) or destroyed. Unlocked:
 * the caller owns s (attention runs between the steps that change it). */
void pgd__seq_mask(const pgd_seq *s, uint32_t *mask_len, const uint32_t **n_live);

/* The cache's allocator (params alloc, else pool.alloc, else libc), for allocations made
 * on the cache's behalf (pgd_attn_run_ref's scratch). Valid while the cache lives. */
const pgd__alloc *pgd__cache_alloc(const pgd_cache *c);
/* Window layers (cache.c): the cache holding model layer `layer` (c, or c's window
 * group) and its index there (*local; UINT32_MAX for a layer out of range, c returned);
 * the sequence of s in that group. */
pgd_cache *pgd__cache_group(pgd_cache *c, uint32_t layer, uint32_t *local);
pgd_seq *pgd__seq_group(const pgd_cache *c, pgd_seq *s, const pgd_cache *group);

/* ---- pool internals used by cache.c ---- */

/* Logs through the pool's hook. */
const pgd__log *pgd__pool_log(const pgd_pool *pool);
/* The pool's codec (pgd__codec_get of its kv type). Valid while the pool lives. */
const pgd__codec *pgd__pool_codec(const pgd_pool *pool);
/* Returns non-zero when K and V are stored rotated (params.kv_rotate); *seed (may be NULL)
 * gets the rotation seed to pass to pgd__hadamard. */
int pgd__pool_rotate(const pgd_pool *pool, uint64_t *seed);

/* The pool's geometry and storage options, as created. */
typedef struct pgd__pool_geom {
    uint32_t n_layers, n_kv_heads, head_dim, page_tokens;
    int kv_rotate; /* K and V stored rotated by pgd__hadamard(.., rotate_seed, ..) */
    uint64_t rotate_seed;
    int key_bounds;   /* pgd_pool_key_bounds available */
    int arena_device; /* payload is device memory: host paths (write_kv, attention) refuse */
} pgd__pool_geom;
void pgd__pool_geom_get(const pgd_pool *pool, pgd__pool_geom *out);
/* The same, three fields (what src/attn uses). */
void pgd__pool_geometry(const pgd_pool *pool, uint32_t *n_layers, uint32_t *n_kv_heads,
                        uint32_t *head_dim);
/* Writable key bounds of (page, layer, kv_head): min[head_dim] then max[head_dim], or NULL
 * (bounds off, out of range). Updated by cache.c's pgd_seq_write_kv. */
float *pgd__pool_key_bounds_mut(pgd_pool *pool, uint32_t page_id, uint32_t layer, uint32_t kv_head);

#endif /* PGD_INT_H */
