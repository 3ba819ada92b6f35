/* SPDX-License-Identifier: MIT */
/*
 * cache.h - the cache manager: the API an engine uses. It ties together the page pool,
 * the prefix index (chained block hashes -> cached pages) and the eviction policy.
 *
 * Lifecycle of a sequence (one request, or one branch of it):
 *
 *   pgd_seq_create(salt)                 empty sequence of one tenant
 *   pgd_seq_match(tokens) / _hashes      pins the longest cached prefix (full pages),
 *     / _hashed(tokens, hashes)          returns the cached length; the engine skips it
 *   pgd_seq_grow(n)                      reserves pages for n more positions (evicts
 *                                        unreferenced cached pages if the pool is full)
 *   pgd_seq_write_kv(pos0, n, layer)     stores K/V of n positions of one layer: copy-on-
 *                                        write, rotation, the pool's codec (any kv type)
 *   pgd_seq_write_slot(pos)              where to write K/V of position pos yourself
 *                                        (copy-on-write; plain f32/f16 layouts only)
 *   pgd_seq_commit(tokens) / _hashes     tells which tokens were written; every page that
 *     / _hashed(tokens, hashes)          became full is registered in the prefix index
 *   pgd_seq_compact(keep lists)          keeps a token budget's slots in fewer private
 *                                        pages (budget.h); registers nothing after
 *   pgd_seq_fork                         a new sequence sharing every page
 *   pgd_seq_destroy                      drops the sequence's references; its registered
 *                                        pages stay cached until the policy evicts them
 *
 * Pages: a page registered in the index is immutable. A page is evictable when only the
 * index references it (no sequence holds it) and it is a leaf of the prefix tree (no
 * cached page extends it), so a cached prefix never loses its middle.
 *
 * Block hashes: h_i = XXH3-128(key, h_{i-1} || tokens of page i), with h_{-1} derived
 * from the key, the model fingerprint and the tenant salt. The key is a random
 * per-instance secret unless params.hash_key pins one (engines sharing a remote tier).
 * Two sequences with different salts never share a page.
 * Hash once, outside the lock: pgd_seq_match and pgd_seq_commit hash the pages they need
 * under the cache lock. An engine that already has the hashes of a request's pages
 * (pgd_cache_hash_tokens, which takes no lock) passes them to pgd_seq_match_hashed and
 * pgd_seq_commit_hashed: the sequence stays in token mode, no page is hashed twice and
 * the lock is held for lookups only.
 *
 * Locking: one mutex per cache manager. Every pgd_cache_* and pgd_seq_* call takes it,
 * so calls from any threads are safe; calls on one sequence from two threads at once are
 * serialized but their order is the caller's business. Pointers returned by
 * pgd_seq_pages() are valid until the next mutating call on that sequence. The pool
 * returned by pgd_cache_pool() may be used for payload access (pgd_pool_k/v) only.
 */
#ifndef PAGODA_CACHE_H
#define PAGODA_CACHE_H

#include "pagoda.h"
#include "policy.h"
#include "pool.h"
#include "tier.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pgd_cache pgd_cache; /* opaque; thread-safe (one lock) */
typedef struct pgd_seq pgd_seq;     /* opaque; owned by its cache */

/* Prefix-index events (pgd_cache_params.on_register / on_evict). Both are called with the
 * cache lock held, from the thread whose call caused the event: they must not call into
 * the cache or its sequences (the lock is not recursive: it would deadlock) and should be
 * quick (every cache call waits). They may read the page's payload through the pool
 * (pgd_cache_pool, pgd_pool_k / pgd_pool_v): the page is not reused before they return.
 *
 * on_register: a full page joined the prefix index under hash, as a child of the block
 *   parent (depth >= 1) or as the first block of a chain (depth 0; parent is {0, 0}).
 *   Called from pgd_seq_commit / commit_hashed, once per page registered (a commit that
 *   finds the block already cached, a dedup, registers nothing).
 * on_evict: an indexed page leaves the index (pgd_seq_grow, write_kv / write_slot copies,
 *   pgd_cache_evict, pgd_cache_clear). Called before the page is unindexed and freed, so
 *   its K/V is still readable. Each eviction of a registered page is reported exactly
 *   once, and only after each of its children (leaves first: a parent is never evicted
 *   before its children). pgd_cache_destroy reports nothing (cached pages are dropped,
 *   not evicted). Pages never registered (partial pages, private copies) give no event. */
typedef void (*pgd_register_fn)(void *ud, pgd_hash hash, pgd_hash parent, uint32_t depth,
                                uint32_t page);
typedef void (*pgd_evict_fn)(void *ud, pgd_hash hash, uint32_t page);

/* Tiers: each entry of pgd_cache_params.tiers is one tier (tier.h) in the hierarchy
 * pool -> tiers[0] -> tiers[1] -> ... The tiers are borrowed (close them after
 * pgd_cache_destroy); pgd_cache_create binds each to the cache's record identity.
 *   Demotion, write-back (the default): a registered page that the pool evicts, and that
 *   tiers[0] does not hold, is copied (under the lock, one memcpy) to the write-back queue
 *   and written to tiers[0] by a mover thread; what a tier evicts to make room goes to the
 *   next tier (spill), which writes nothing for a record it holds already. Write-through
 *   (write_through on a tier): every page registered by a commit, or whose block has been
 *   matched admit_hits times (0: at commit; matches from the pool and promotions from a
 *   tier, over the block's life, not one stay in the pool), is also written to that tier,
 *   so a crash loses nothing that tier was given.
 *   Promotion: pgd_seq_match pins the pool prefix, then asks the tiers which of the next
 *   blocks they hold (in a row); it allocates pool pages for that run and queues their
 *   fills on the movers, and returns the pool prefix plus the run. The pages fill in the
 *   background: pgd_seq_ready / pgd_seq_wait before the sequence's K/V is read (attention)
 *   or extended. A fill that fails (record damaged or gone) cuts the sequence back to the
 *   pages before it: the engine computes the rest. A fill whose record a tier spilled one
 *   tier down since the match reads it there. The run is as long as the pool can give
 *   pages for (free or evictable); a promotion that cannot start (no memory, the mover
 *   queue full) leaves the match at the pool prefix.
 *   The write-back queue's slots (writeback_pages) carry every copy out of the pool:
 *   write-back, write-through, park, and prefetch's moves between tiers. */
#define PGD_MAX_TIERS 8
typedef struct pgd_tier_use {
    pgd_tier *tier;      /* borrowed */
    int write_through;   /* nonzero: registered pages are written to this tier too */
    uint32_t admit_hits; /* write-through admission: once the block has been matched this
                            many times over its life (0: at once, at commit) */
} pgd_tier_use;

typedef struct pgd_cache_params {
    pgd_pool_params pool;     /* geometry and capacity of the page pool */
    pgd_policy_kind policy;   /* default LRU; ignored when policy_ops is set */
    pgd_next_use_fn next_use; /* required for PGD_POLICY_BELADY */
    void *next_use_ud;
    const uint8_t *hash_key;    /* NULL: random per-instance secret */
    size_t hash_key_len;        /* 1..256 bytes when hash_key is set */
    pgd_hash model_fingerprint; /* identifies model weights + tokenizer; seeds every chain */
    uint32_t max_seqs;          /* 0: unlimited */
    const pgd_allocator *alloc; /* NULL: libc; overrides pool.alloc */
    pgd_log_fn log;             /* NULL: silent; overrides pool.log */
    void *log_ud;
    uint32_t kv_residual; /* staged pools (kivi2; q8_0 / q4_0 with head_dim < 32): least
                             rows of each sequence's f16 residual window, where rows wait
                             until their page is full; 0: 128. Rounded up to a multiple of
                             page_tokens; a write spanning more grows a sequence's window.
                             Attention reads only a row's own page from it, so results do
                             not depend on it. The result: pgd_cache_kv_residual */
    /* Prefix-index entries: the blocks it can describe, wherever they live. 0: the pool's
     * page count; else at least that. */
    uint32_t index_capacity;
    /* Prefix-index events, NULL: none (see "Prefix-index events" above). */
    pgd_register_fn on_register;
    pgd_evict_fn on_evict;
    void *event_ud; /* passed to on_register / on_evict */
    /* A user eviction policy (policy.h), borrowed while the cache lives; NULL: policy. */
    const pgd_policy_ops *policy_ops;
    void *policy_ud; /* pgd_policy_init.ud of policy_ops->create */
    /* Storage tiers below the pool, fastest first (see "Tiers" below); NULL / 0: none. */
    const pgd_tier_use *tiers;
    uint32_t n_tiers;         /* at most PGD_MAX_TIERS */
    uint32_t tier_threads;    /* mover threads per class (fills; puts at nice 19); 0: 2 */
    uint32_t writeback_pages; /* pages copied out of the pool waiting for a mover (the
                                 write-back queue); 0: 256. Full: an evicted page is
                                 dropped (counted), never waited for */
    /* Retention (see "Retention" below). */
    pgd_clock_fn clock; /* the time base of TTLs and hints, ns; NULL: CLOCK_MONOTONIC */
    void *clock_ud;
    double pin_share;     /* pinned pages may fill at most this share of the pool and of
                             each tier (0: 0.5; at most 1) */
    pgd_cost_model cost;  /* for cost-aware policies; zero fields: pgd_cost_model_default */
    uint32_t max_tenants; /* tenants tracked for quotas and stats (0: 64); sequences of
                             further salts share one "other" entry (index 0 is the
                             default tenant, salt_len 0) */
    /* Sliding-window layers (see "Window layers" below); window_tokens 0: none. */
    uint32_t window_tokens;       /* W: a window layer's row at position p reads the keys of
                                     positions p - W + 1 .. p only; 1 .. 2^24 */
    const uint8_t *window_layers; /* [pool.n_layers] nonzero: a window layer (copied at
                                     create); at least one layer of each kind */
    uint32_t window_pages;        /* pages of the window layers' own pool; at least
                                     ceil((W - 1) / page_tokens) + 2 (one sequence's window
                                     and the page being written) */
} pgd_cache_params;               /* append fields only */

/* Window layers (pgd_cache_params.window_tokens, window_layers, window_pages): models
 * such as Gemma 2/3 alternate global layers with sliding-window layers of W keys. The cache
 * keeps the two kinds in two layer groups, each with a pool of its own: pool.n_layers
 * counts every layer of the model, pool.capacity_pages (or capacity_bytes) sizes the
 * global layers' pool, window_pages the window layers' pool. A sequence has a page table
 * in each; both cover the same positions (one length, one commit). The window group's
 * table is indexed by position too (its page i holds positions [i * page_tokens, ..)), but
 * a page that every future row's window has left is released: before pgd_seq_grow(n) of a
 * sequence of length L (rows L .. L + n - 1 are computed next), the window pages wholly
 * below position L - W + 1 are dropped (their table entries become PGD_NO_PAGE). A released
 * page that was registered stays cached in the group's prefix index until its pool needs
 * the room; a window page is evictable whenever no sequence holds it (no leaf-first rule:
 * a window lookup never walks a chain from its first page).
 * Prefix hits: a hit of k pages is usable only with the window layers' K/V of the keys its
 * first new row sees (positions k * page_tokens - W + 1 .. k * page_tokens - 1). A match
 * looks the global chain up as always, then looks up, by their block hashes, only those
 * window pages in the window group's index, and cuts the hit back to the longest prefix
 * whose window pages are all cached (counted: pgd_cache_stats.n_window_cut_tokens). Nothing
 * is ever recomputed from a partial window: a cut hit computes the rest.
 * What does not apply to the window group: tiers (a cache with tiers takes no window
 * layers: PGD_EINVAL), pgd_seq_compact (PGD_EINVAL), pgd_seq_write_slot (PGD_EINVAL: write
 * through pgd_seq_write_kv), pins and next-use hints (they hold the global group's pages;
 * a pinned prefix whose window pages were evicted is cut back at its next match), and the
 * chain operations (pin, unpin, evict_chain, warm, lookup, hints, evict: the global group).
 * pgd_cache_clear drops both groups' evictable pages. The window group uses the builtin
 * policy of params.policy (LRU when it is Belady or policy_ops is set: those describe the
 * global pages). pgd_cache_pool returns the global group's pool (its layers are the model's
 * global layers, in order): pgd_cache_layer_pool maps a model layer to its pool. */

/* Returns the defaults: pool defaults, LRU, random key, zero fingerprint. */
PGD_API pgd_cache_params pgd_cache_default_params(void);

/* Creates a cache manager with its pool, index and policy, all reserved up front.
 * Returns PGD_OK, PGD_EINVAL (bad pool params, Belady without next_use, bad key length,
 * kv_residual above 2^24, a policy_ops table with a NULL member other than the optional
 * leaf, index_capacity below the pool's page count or above 2^31, or what
 * policy_ops->create returned),
 * PGD_EIO (no randomness for the key) or PGD_ENOMEM. *out is NULL on error. */
PGD_API int pgd_cache_create(const pgd_cache_params *p, pgd_cache **out);
/* Destroys the cache, its sequences and pages. NULL: no-op. No call may be in flight.
 * With tiers it first waits for the moves already queued (they complete; the cached pages
 * are not demoted) and stops the mover threads; the tiers stay open (the caller's). */
PGD_API void pgd_cache_destroy(pgd_cache *c);

/* The cache's pool, for payload access only (see locking). Valid while c lives. With window
 * layers: the global layers' pool (see "Window layers"). */
PGD_API pgd_pool *pgd_cache_pool(pgd_cache *c);
/* The pool holding model layer `layer` (0 .. pool.n_layers of the params) and, in
 * *pool_layer, its index there: c's one pool and layer itself without window layers.
 * NULL for a layer out of range. O(1). */
PGD_API pgd_pool *pgd_cache_layer_pool(pgd_cache *c, uint32_t layer, uint32_t *pool_layer);
/* The model's layers (pool.n_layers of the params: every group). O(1). */
PGD_API uint32_t pgd_cache_n_layers(const pgd_cache *c);
/* The window W of window layers (params.window_tokens), or 0 without them. O(1). */
PGD_API uint32_t pgd_cache_window(const pgd_cache *c);
/* Whether model layer `layer` is a window layer (0 without window layers). O(1). */
PGD_API int pgd_cache_layer_is_window(const pgd_cache *c, uint32_t layer);
PGD_API uint32_t pgd_cache_page_tokens(const pgd_cache *c);
/* The least residual window in tokens as the cache uses it (params.kv_residual, 0 -> 128,
 * rounded up to whole pages), or 0 when the pool keeps none (not a staged pool: kivi2,
 * q8_0 / q4_0 with head_dim < 32). O(1). */
PGD_API uint32_t pgd_cache_kv_residual(const pgd_cache *c);

/* ---- sequences ---- */

/* Creates an empty sequence for the tenant named by salt (salt_len bytes, may be 0 for
 * the default tenant; the bytes are borrowed for the call).
 * Returns PGD_OK, PGD_ENOMEM, or PGD_EBUSY when max_seqs sequences exist. */
PGD_API int pgd_seq_create(pgd_cache *c, const void *salt, size_t salt_len, pgd_seq **out);
/* Destroys a sequence: drops its page references (deepest page first, so that the policy
 * evicts a released prefix from its end). NULL: no-op. Never fails. */
PGD_API void pgd_seq_destroy(pgd_cache *c, pgd_seq *s);
/* Creates a new sequence sharing every page (and the hash chain) of src. Writes into a
 * shared partial page copy it first (copy-on-write). Every page of src but the last must
 * be committed (commit before forking), so that only the last page is shared unhashed; a
 * compacted src (pgd_seq_compact) registers nothing, so any of its pages may be shared.
 * Returns PGD_OK, PGD_ENOMEM, PGD_EBUSY (max_seqs), PGD_ESTATE (uncommitted pages). */
PGD_API int pgd_seq_fork(pgd_cache *c, pgd_seq *src, pgd_seq **out);

/* Matches the longest cached prefix of tokens[0..n_tokens) in whole pages and pins it:
 * the sequence's page table becomes those pages and its length the cached length.
 * The sequence must be empty. Counts n_tokens as queried and the pool prefix as hit.
 * With tiers, the length includes the run being promoted (see "Tiers").
 * Returns the cached length in tokens (a multiple of page_tokens, <= n_tokens),
 * PGD_ESTATE (the sequence was already matched, grown, committed or compacted) or
 * PGD_ENOMEM. */
PGD_API int64_t pgd_seq_match(pgd_cache *c, pgd_seq *s, const int32_t *tokens, size_t n_tokens);
/* Same as pgd_seq_match, with precomputed block hashes: hashes[k] is the hash of page k
 * (tokens[k*page_tokens ..]) as pgd_cache_hash_tokens computes it for this sequence's salt
 * (borrowed for the call; hashes past floor(n_tokens / page_tokens) are ignored). Pages
 * k >= n_hashes are hashed from tokens under the lock, as pgd_seq_match does. The sequence
 * is in token mode afterwards (commit with pgd_seq_commit / _hashed). Checks hashes[0]
 * against one hash of the first page (before taking the lock): a mismatch (another salt,
 * other tokens) is PGD_EINVAL, so hashes of another tenant cannot share its pages; the
 * others are trusted. Returns the cached length in tokens, PGD_EINVAL, PGD_ESTATE or
 * PGD_ENOMEM. Cost: one block hash plus O(pages matched) lookups under the lock. */
PGD_API int64_t pgd_seq_match_hashed(pgd_cache *c, pgd_seq *s, const int32_t *tokens,
                                     size_t n_tokens, const pgd_hash *hashes, size_t n_hashes);
/* Same, on precomputed block hashes (one per full page; engines that hash themselves,
 * trace replay). The caller's hashes must embed tenant and model; the cache does not
 * rehash them. Counts n_hashes * page_tokens as queried.
 * Returns the number of pages matched, PGD_ESTATE or PGD_ENOMEM. */
PGD_API int64_t pgd_seq_match_hashes(pgd_cache *c, pgd_seq *s, const pgd_hash *hashes,
                                     size_t n_hashes);

/* Where a sequence's matched prefix came from (after a match): tokens pinned in the pool,
 * and tokens being promoted from each tier (tier_tokens[i] for pgd_cache_params.tiers[i]).
 * While promotions run the sum is the matched length; after a failed fill (see
 * pgd_seq_ready) the tier figures count what was really filled. A block that
 * pgd_cache_prefetch moved up from a slower tier (its request was queued while it was
 * there) counts under the tier it was prefetched from: where the request found it. */
typedef struct pgd_match_info {
    uint64_t pool_tokens;
    uint64_t tier_tokens[PGD_MAX_TIERS];
    uint32_t n_tiers;
} pgd_match_info;
PGD_API void pgd_seq_match_info(pgd_cache *c, const pgd_seq *s, pgd_match_info *out);
/* Non-blocking: returns 1 when no promotion of s is pending (every promoted page filled
 * and registered in the prefix index), 0 while some run. When a fill failed, the sequence
 * was cut back to the pages before the first failed one (pgd_seq_length and
 * pgd_seq_n_committed say the new length) and 1 is returned: compute from there. */
PGD_API int pgd_seq_ready(pgd_cache *c, pgd_seq *s);
/* Blocks until pgd_seq_ready(s) would return 1. Returns PGD_OK. grow, truncate, commit,
 * write_kv, write_slot, fork and destroy wait this way themselves; attention (attn.h) does
 * not: an engine calls pgd_seq_ready / pgd_seq_wait before it reads a matched sequence. */
PGD_API int pgd_seq_wait(pgd_cache *c, pgd_seq *s);
/* Prefetch (on admission): starts moving the blocks hashes[0..n) (a chain, from its
 * first block; pgd_cache_hash_tokens) that a slower tier holds and tiers[0] does not, up
 * into tiers[0], in the background, so that the match that follows promotes from the
 * fastest tier. Blocks in the pool are skipped; the first block no tier holds ends the
 * chain, and so does a full write-back queue. Returns the number of blocks queued (0 with
 * fewer than two tiers), or PGD_EINVAL (NULL hashes with n > 0). */
PGD_API int pgd_cache_prefetch(pgd_cache *c, const pgd_hash *hashes, size_t n);
/* Swap-out (preemption): queues a copy of every registered page of s that no tier holds
 * to tiers[0] now, so the pages survive their eviction from the pool. Returns the pages
 * queued (0 without tiers). The sequence is unchanged (destroy it after). */
PGD_API int pgd_seq_park(pgd_cache *c, pgd_seq *s);
/* Waits until the write-back queue is empty and every queued move is done, then flushes
 * every tier (pgd_tier_flush). Returns PGD_OK or the first flush error. */
PGD_API int pgd_cache_flush(pgd_cache *c);

/* Movement counters of tier i (pgd_cache_params.tiers[i]), as this cache saw them. */
typedef struct pgd_cache_tier_stats {
    uint64_t hit_pages, hit_tokens;          /* promoted by a match and served (pages,
                                                tokens; counted once the fill settled) */
    uint64_t miss_pages;                     /* matches that looked past the pool and past tier i */
    uint64_t promoted_pages, promoted_bytes; /* fills done from tier i into the pool */
    uint64_t promote_failed;                 /* fills that failed (record damaged, gone, I/O) */
    uint64_t demoted_pages, demoted_bytes;   /* pages written to tier i (any path) */
    uint64_t demote_dropped;                 /* evicted pages not demoted: queue full, put failed */
    uint64_t writeback_depth;                /* pages waiting in the write-back queue (all tiers) */
    uint64_t prefetched_pages;               /* moved up into tier i by pgd_cache_prefetch */
    uint64_t parked_pages;                   /* queued by pgd_seq_park */
} pgd_cache_tier_stats;
/* Fills *out for tier i. Returns PGD_OK or PGD_EINVAL (i >= n_tiers). */
PGD_API int pgd_cache_get_tier_stats(pgd_cache *c, uint32_t i, pgd_cache_tier_stats *out);
PGD_API uint32_t pgd_cache_n_tiers(const pgd_cache *c);
PGD_API pgd_tier *pgd_cache_tier(pgd_cache *c, uint32_t i);

/* Extends the sequence by n_tokens positions, allocating the pages they need. When the
 * pool has no free page, evicts unreferenced cached pages through the policy.
 * Returns PGD_OK; PGD_ENOSPC when free + evictable pages are too few, or the length
 * would exceed the whole pool (nothing changed, nothing evicted); PGD_ENOMEM (nothing
 * changed). Cost: O(new pages) plus the evictions. */
PGD_API int pgd_seq_grow(pgd_cache *c, pgd_seq *s, size_t n_tokens);

/* Shrinks the sequence to n_tokens positions (n_committed <= n_tokens <= length), dropping
 * the pages past the new end: undoes a grow whose tokens were not computed (a failed
 * batch, rejected speculative tokens). Returns PGD_OK, PGD_ESTATE when n_tokens is
 * below the committed length or above the length, or PGD_EINVAL (staged pools only) when
 * the new last page would be partial and the f16 copy of its positions has already been
 * overwritten in the residual window (written more than a window of positions beyond it);
 * nothing changed on error. O(dropped pages). */
PGD_API int pgd_seq_truncate(pgd_cache *c, pgd_seq *s, uint64_t n_tokens);

/* Registers written tokens. tokens[0..n) are the tokens at positions
 * [n_committed, n_committed + n), which must be <= the length (grow first). Every page
 * that becomes full is hashed and registered in the prefix index; if another sequence
 * registered the same block first, this sequence switches to that page and frees its own
 * copy (so concurrent computations of one page end with one cached copy; re-read the page
 * table after commit). Returns the number of pages registered by this call, PGD_EINVAL
 * (past the length) or PGD_ESTATE (the sequence was committed with hashes). */
PGD_API int pgd_seq_commit(pgd_cache *c, pgd_seq *s, const int32_t *tokens, size_t n_tokens);
/* Same as pgd_seq_commit, with precomputed block hashes: a page k of the sequence (counted
 * from position 0, so a request's pgd_cache_hash_tokens output serves match and commit)
 * that this call fills is registered under hashes[k] when k < n_hashes, else hashed under
 * the lock. The hashes are trusted: they must be pgd_cache_hash_tokens' for the
 * sequence's salt and tokens (borrowed for the call). Returns as pgd_seq_commit. */
PGD_API int pgd_seq_commit_hashed(pgd_cache *c, pgd_seq *s, const int32_t *tokens, size_t n_tokens,
                                  const pgd_hash *hashes, size_t n_hashes);
/* Registers the next n_hashes full pages under precomputed hashes (see match_hashes).
 * The pages must lie within the length. Returns pages registered, PGD_EINVAL or
 * PGD_ESTATE (the sequence was committed with tokens). */
PGD_API int pgd_seq_commit_hashes(pgd_cache *c, pgd_seq *s, const pgd_hash *hashes,
                                  size_t n_hashes);

/* Stores K and V of positions pos0 .. pos0+n-1 (all < length: grow first) for one layer.
 * k and v are [n][n_kv_heads][head_dim] f32 (borrowed for the call), unrotated. The
 * general write path, for every kv type: copies shared pages first (copy-on-write; may
 * evict), rotates K and V (pool kv_rotate), encodes them with the pool's codec, updates
 * the key bounds (pool key_bounds: min / max of the rotated keys as written, before
 * quantization). Staged pools (kivi2; q8_0 / q4_0 with head_dim < 32): the rows go to the
 * sequence's f16 residual window (allocated at the first write, grown when a write spans
 * more pages than it holds) and a page's regions of this layer are encoded, once, when this
 * call writes the page's last slot; positions must then be at or above the residual
 * window's start. So a full page's bytes never depend on how its rows were written.
 * Returns PGD_OK, PGD_EINVAL (NULL k / v, layer out of range, a position past the length
 * or inside a committed full page, a metadata-only pool or a device arena: this call
 * encodes on the host), PGD_ENOSPC (no page for a
 * copy) or PGD_ENOMEM (the residual window); positions before a failing copy may have
 * been written. Cost: O(n * n_kv_heads * head_dim), plus O(page) per page filled (staged
 * pools), plus a copy of the window when it grows. */
PGD_API int pgd_seq_write_kv(pgd_cache *c, pgd_seq *s, uint64_t pos0, uint32_t n, uint32_t layer,
                             const float *k, const float *v);

/* Resolves where K/V of position pos (< length) is written: copies the page first if it
 * is shared (copy-on-write; may evict). Positions inside registered pages are immutable.
 * For engines that store plain f32 / f16 rows themselves; pgd_seq_write_kv is the general
 * path (codecs, rotation, key bounds) and the only one for kivi2.
 * Returns PGD_OK, PGD_EINVAL (pos >= length or inside a registered page), PGD_ENOSPC. */
PGD_API int pgd_seq_write_slot(pgd_cache *c, pgd_seq *s, uint64_t pos, uint32_t *page_id,
                               uint32_t *slot);

/* Length in tokens (positions reserved by match + grow). */
PGD_API uint64_t pgd_seq_length(pgd_cache *c, const pgd_seq *s);
/* Tokens registered through commit or match (a multiple of page_tokens, plus the
 * committed part of the current partial page). */
PGD_API uint64_t pgd_seq_n_committed(pgd_cache *c, const pgd_seq *s);
/* The page table: *ids (borrowed, valid until the next mutating call on s) gets
 * ceil(length / page_tokens) page ids. Returns the number of pages. */
PGD_API uint32_t pgd_seq_pages(pgd_cache *c, const pgd_seq *s, const uint32_t **ids);

/* ---- compaction (token budgets: budget.h) ----
 *
 * pgd_seq_compact replaces the sequence's slots [0, length) by n_out slots. For layer l and
 * KV head h (i = l * n_kv_heads + h), slot j < n_live[i] takes the K and V that slot
 * keep[i * ld + j] held; the keep lists are ascending, distinct and < length. Slots
 * n_live[i] .. n_out-1 of (l, h) are dead: attention gives them weight 0 (both paths, with
 * Quest too). n_live NULL: every (l, h) keeps n_out. n_out >= every n_live[i] >= 1.
 *
 * Shared and registered pages are never written (their bytes and refcounts stay as they
 * are): the sequence writes what it keeps into pages of its own (its private pages, held by
 * it alone and unregistered, are rewritten; fresh pages are taken for the rest) and drops its
 * references to the rest, which stay in the prefix index (evictable once no one holds them).
 * A leading full page whose every slot each list keeps in place (keep[j] == j: a prefix
 * kept whole, e.g. attention sinks) is not written at all and stays as it is, shared or
 * registered. Afterwards the sequence registers nothing: its pages no longer hold what
 * their block hashes name; commit only counts tokens (commit / commit_hashed take and
 * ignore tokens' hashes, commit_hashes counts n_hashes pages of tokens), match refuses it
 * (PGD_ESTATE), and a fork inherits the compaction and its dead slots. The length becomes
 * n_out and n_committed min(n_committed, n_out) (truncate works back to any slot >=
 * n_committed, and clips the dead slots to the new length); pgd_seq_n_dropped grows by
 * length - n_out. Dead slots hold zeros. n_out == length with no dead slot changes nothing
 * (returns 0, not counted: the sequence still registers).
 *
 * Codecs: rows of f32, f16, bf16, and q8_0 / q4_0 with head_dim >= 32 move as bytes
 * (exact: a row's codes and scales); staged pools (kivi2; q8_0 / q4_0 with head_dim < 32)
 * take the kept rows in f16 (from the residual window where it still holds them, else
 * decoded from the pool) and encode the new full pages again (encode_page), the last
 * partial page going to the residual window as the write path would put it (a fresh
 * sequence written with those f16 rows has the same bytes). Key bounds (Quest) of every
 * written page are recomputed: min / max over its live rows of the values stored. A
 * metadata-only pool changes the page tables only; a device arena is refused (PGD_EINVAL).
 * Returns the pages freed (the sequence's page count before minus after, >= 0), or
 * PGD_EINVAL (bad lists or counts, a list keeping a dead slot of an earlier compaction),
 * PGD_ESTATE (a promotion of s pending), PGD_ENOSPC / PGD_ENOMEM (no page for a private
 * copy, no memory for the work buffers): s unchanged on error. Counted in the stats
 * (n_compactions, n_compact_dropped, n_compact_freed). Takes the cache lock; not
 * concurrently with attention on s. Cost: O(kept slots x n_layers x n_kv_heads x head_dim)
 * plus a buffer of one (layer, K|V, head) column of kept rows. */
PGD_API int pgd_seq_compact(pgd_cache *c, pgd_seq *s, uint32_t n_out, const uint32_t *keep,
                            size_t ld, const uint32_t *n_live);
/* Slots dropped from s by compaction so far: a slot's token position is slot + this. */
PGD_API uint64_t pgd_seq_n_dropped(pgd_cache *c, const pgd_seq *s);

/* A released window page's table entry (pgd_seq_layer_pages). */
#define PGD_NO_PAGE UINT32_MAX
/* The page table of the group holding model layer `layer`: *ids[i] is the page of
 * positions [i * page_tokens, (i + 1) * page_tokens) in the pool pgd_cache_layer_pool
 * returns for it, PGD_NO_PAGE for a window page released (see "Window layers"). Returns the
 * table's length (pgd_seq_pages' for a global layer; both groups' are equal), 0 for a
 * layer out of range. The pointer is valid as pgd_seq_pages' is. */
PGD_API uint32_t pgd_seq_layer_pages(pgd_cache *c, const pgd_seq *s, uint32_t layer,
                                     const uint32_t **ids);

/* ---- hashing ---- */

/* Computes the block hashes of the full pages of tokens[0..n) for the tenant salt, as
 * match/commit would. Writes floor(n / page_tokens) hashes (at most max_hashes) and
 * returns how many it wrote. Pure; takes no lock. */
PGD_API size_t pgd_cache_hash_tokens(const pgd_cache *c, const void *salt, size_t salt_len,
                                     const int32_t *tokens, size_t n_tokens, pgd_hash *hashes,
                                     size_t max_hashes);

/* ---- retention ----
 *
 * A page carries a retention: a priority (0..100, PGD_PRIORITY_DEFAULT), an expiry (clock
 * time, 0: none), a next-use hint (clock time, 0: none) and a pin count. A sequence's
 * retention (pgd_seq_set_retention) is merged into every page it holds or registers when
 * it releases them (destroy, truncate): priority = max(the page's, if not expired, and the
 * sequence's); expiry = the later of the two, or none when either has none (a use without
 * a TTL keeps the page as long as the policy does); next use = the sequence's hint when it
 * has one, else the page's unless passed. Orders that hold under every policy:
 *   - a pinned page is not evictable (it is out of the policy's set, like a page a
 *     sequence holds) until its pins are released (pgd_cache_unpin, or the pin's expiry:
 *     a pin with a TTL holds until then);
 *   - an evictable page whose expiry has passed is evicted before the policy is asked
 *     (leaf-only still: an expired page with a cached child waits for it);
 *   - tenants' reserved shares (pgd_cache_set_tenant).
 * The priority and the hint order pages within the policy's set only under policies that
 * read them (PGD_POLICY_PRIORITY; the others ignore them).
 * Tiers: a page written to a tier with a retention that is not the default carries it
 * (pgd_tier_retain when the tier has the op): its TTL, priority and pin hold there too.
 * Pinned pages are bounded by pin_share of the pool's pages and of each tier's record
 * capacity: a pin past it is refused (PGD_ENOSPC), never silently dropped. */
typedef struct pgd_retention {
    uint32_t priority;    /* 0..100 */
    uint64_t ttl_ms;      /* 0: no expiry; else the retention ends ttl after the release */
    int pin;              /* nonzero: pin the pages (until unpinned, or ttl_ms when set) */
    uint64_t next_use_ms; /* 0: no hint; else the prefix is needed again this long after
                             the release: the pages' next_use_ns, and the sequence's
                             registered chain becomes a hint (pgd_cache_hint) due then */
} pgd_retention;

/* {PGD_PRIORITY_DEFAULT, 0, 0, 0}. */
PGD_API pgd_retention pgd_retention_default(void);
/* Sets the retention of s for the pages it holds and will register (see above).
 * expect_tokens: the length the sequence will reach (its prompt), for the pin budget: with
 * r->pin, ceil(expect_tokens / page_tokens) pages are reserved against pin_share now (a
 * sequence set twice reserves the larger). Returns PGD_OK, PGD_EINVAL (priority > 100,
 * NULL r) or PGD_ENOSPC (the pin would take the pinned pages past pin_share: nothing
 * changed; the caller says so, e.g. a 400). */
PGD_API int pgd_seq_set_retention(pgd_cache *c, pgd_seq *s, const pgd_retention *r,
                                  uint64_t expect_tokens);

/* Admin operations on a chain of block hashes (pgd_cache_hash_tokens of a prompt for a
 * salt), from its first block. Each stops at the first block the cache (pool) does not
 * hold. Return the number of pages affected, or a negative status. */
/* Pins the cached pages of the chain (ttl_ms 0: until unpinned), in the pool and, with
 * tiers that have the op, in tiers[0..). PGD_ENOSPC past pin_share, or when a tier refuses
 * the pin (its retain op's PGD_ENOSPC): nothing pinned. A page pinned both with and without
 * a TTL stays pinned until unpinned; two TTLs: the later end. */
PGD_API int pgd_cache_pin(pgd_cache *c, const pgd_hash *hashes, size_t n, uint64_t ttl_ms);
/* Drops every pin of the chain's pages (request pins too), deepest first, and in the tiers
 * with the op. Returns the pages that were pinned. */
PGD_API int pgd_cache_unpin(pgd_cache *c, const pgd_hash *hashes, size_t n);
/* Evicts the chain's pages from the pool, deepest first, as far as no sequence holds them
 * and no cached page outside the chain extends them (a page with another child stays, and
 * so do its ancestors). Pinned pages are unpinned first. Demotion runs as for any
 * eviction (tiers keep their copies). */
PGD_API int pgd_cache_evict_chain(pgd_cache *c, const pgd_hash *hashes, size_t n);
/* Warms the chain into the pool: the pages the pool lacks that the tiers hold (in a row
 * after the pool's prefix) are promoted and registered, as a match would, then released
 * (cached, evictable). Waits for the fills. Returns the pages the pool holds for the chain
 * afterwards (pool prefix + promoted). salt: the chain's tenant (for quotas and stats). */
PGD_API int pgd_cache_warm(pgd_cache *c, const void *salt, size_t salt_len, const pgd_hash *hashes,
                           size_t n);
/* How many pages of the chain the pool holds, in a row from the first (no side effect). */
PGD_API size_t pgd_cache_lookup(pgd_cache *c, const pgd_hash *hashes, size_t n);

/* Next-use hints (KVFlow-style prefetch): registers the chain hashes[0..n) (copied) of
 * tenant salt as needed again at clock time due_ns. pgd_cache_hints_run warms (as
 * pgd_cache_warm) every registered chain due before now + lead_ns and forgets it; an
 * engine calls it from its loop (the server: every tick). A chain hinted again replaces
 * its entry (same first and last hash). At most 256 chains wait (PGD_ENOSPC past it).
 * pgd_cache_hint returns PGD_OK, PGD_EINVAL (n 0) or PGD_ENOSPC / PGD_ENOMEM;
 * pgd_cache_hints_run returns the chains warmed; pgd_cache_n_hints those waiting. */
PGD_API int pgd_cache_hint(pgd_cache *c, const void *salt, size_t salt_len, const pgd_hash *hashes,
                           size_t n, uint64_t due_ns);
PGD_API int pgd_cache_hints_run(pgd_cache *c, uint64_t lead_ns);
PGD_API uint32_t pgd_cache_n_hints(pgd_cache *c);
/* The cache's clock now (params.clock), ns. */
PGD_API uint64_t pgd_cache_now_ns(const pgd_cache *c);

/* ---- tenants (quotas and per-tenant stats) ----
 *
 * A tenant is a salt (pgd_seq_create). The cache tracks up to max_tenants of them (index
 * 0: the default tenant, salt_len 0; the last index: "other", every further salt). Each
 * registered page is charged to the tenant of the sequence that registered it.
 * Quotas: a tenant may be given a reserved share of the pool (tier shares: see
 * tier_share). When a sequence of tenant T needs a page and the pool has none free:
 *   - a tenant with a reservation that holds at least it evicts its own pages first;
 *   - then (or otherwise) pages of any tenant U, but never of a U that holds no more than
 *     its reserved share (a flood from one tenant cannot evict another's reserved
 *     prefix);
 *   - nothing else evictable: the grow fails (PGD_ENOSPC).
 * Reserved shares sum to at most 1 (reserved pages: floor(share x pool pages)). "Holds"
 * counts the tenant's registered pages plus those the current grow took already, so a
 * tenant at its share recycles its own pages. Without any reservation eviction is the
 * policy's alone (the same victims as without tenants). Evictions no sequence asked for
 * (pgd_cache_evict, pgd_cache_clear) ignore quotas. With reservations a grow can evict
 * pages of tenants over their share and still fail (ENOSPC: it counts the evictable pages
 * before the quotas). Indices are stable for the cache's life (a salt is never forgotten);
 * "other" is the last index (max_tenants - 1, 63 by default; at least 1), counted by
 * pgd_cache_n_tenants once a salt fell into it. max_tenants above 65535 is PGD_EINVAL at
 * create. Cost: a sequence create scans the tenants in use (O(max_tenants)); eviction
 * reads a per-page tenant index (O(1) per page the policy's scan looks at). */
typedef struct pgd_tenant_params {
    double pool_share;                /* reserved share of the pool's pages, 0..1 */
    double tier_share[PGD_MAX_TIERS]; /* reserved share of tier i, 0..1: the tenant's
                                         pages carry it to the tier (pgd_tier_retain,
                                         tenant_share); the RAM and disk tiers keep its
                                         records while it holds no more than that share of
                                         their records (Redis: not enforced) */
} pgd_tenant_params;

/* Registers (or updates) the tenant of salt with its reservation. Returns the tenant's
 * index (>= 1), PGD_EINVAL (a share outside 0..1, shares summing past 1, the default
 * tenant given salt_len 0 is index 0 and may be reserved too: returns 0) or PGD_ENOSPC (no
 * tenant entry left). */
PGD_API int pgd_cache_set_tenant(pgd_cache *c, const void *salt, size_t salt_len,
                                 const pgd_tenant_params *tp);

typedef struct pgd_tenant_stats {
    uint64_t id;             /* a hash of the salt (XXH3-64 with the cache key): never
                                the salt; 0 for the default tenant, UINT64_MAX "other" */
    uint32_t reserved_pages; /* pool pages reserved */
    uint32_t pages_held;     /* registered pool pages charged to it now */
    uint32_t pages_pinned;
    uint64_t hit_pages, hit_tokens; /* served from the pool */
    uint64_t query_pages;           /* pages its matches asked for */
    uint64_t evictions;             /* its pages evicted by the policy */
    uint64_t evictions_by_others;   /* of those, to make room for another tenant */
} pgd_tenant_stats;

/* Number of tenant entries in use (>= 1: the default tenant). */
PGD_API uint32_t pgd_cache_n_tenants(pgd_cache *c);
/* Fills *out for tenant index i. Returns PGD_OK or PGD_EINVAL (i out of range). */
PGD_API int pgd_cache_get_tenant_stats(pgd_cache *c, uint32_t i, pgd_tenant_stats *out);
/* The tenant index a salt maps to (no registration), or the "other" index. */
PGD_API uint32_t pgd_cache_tenant_of(pgd_cache *c, const void *salt, size_t salt_len);

/* ---- stats and checks ---- */

typedef struct pgd_cache_stats {
    uint32_t n_pages_total;
    uint32_t n_pages_free;      /* on the pool's free list */
    uint32_t n_pages_used;      /* held by at least one sequence */
    uint32_t n_pages_cached;    /* registered in the prefix index (used or not) */
    uint32_t n_pages_evictable; /* cached and held by no sequence */
    uint32_t n_seqs;
    uint64_t n_query_tokens; /* tokens presented to match */
    uint64_t n_hit_tokens;   /* of those, served from the pool (tiers: tier stats) */
    uint64_t n_query_pages;
    uint64_t n_hit_pages;
    uint64_t n_evictions;  /* pages evicted by the policy */
    uint64_t n_registered; /* pages registered by commit (and by settled promotions) */
    uint64_t n_dedup;      /* committed pages swapped for a copy already cached */
    uint64_t n_cow_copies;
    uint64_t n_compactions;     /* pgd_seq_compact calls that changed a sequence */
    uint64_t n_compact_dropped; /* slots they dropped (token budgets) */
    uint64_t n_compact_freed;   /* pages the compacted sequences held less */
    /* The window layers' group (see "Window layers"); all 0 without window layers. The
     * fields above describe the global group (n_hit_tokens: after the cut). */
    uint32_t n_window_pages_total;
    uint32_t n_window_pages_free;
    uint32_t n_window_pages_used;   /* held by at least one sequence */
    uint32_t n_window_pages_cached; /* registered in the group's index */
    uint64_t n_window_released;     /* window pages sequences released as windows slid */
    uint64_t n_window_cut_tokens;   /* hit tokens matches gave up: window pages missing */
    uint64_t n_window_evictions;    /* window pages evicted by the group's policy */
} pgd_cache_stats;

/* Fills *out. O(1). */
PGD_API void pgd_cache_get_stats(pgd_cache *c, pgd_cache_stats *out);

/* Evicts up to n_pages evictable pages through the policy. Returns how many it evicted. */
PGD_API int pgd_cache_evict(pgd_cache *c, uint32_t n_pages);
/* Drops every evictable cached page (sequences keep theirs). Returns pages dropped. */
PGD_API int pgd_cache_clear(pgd_cache *c);

/* Integrity walk of pool, index, policy and every sequence: refcounts equal the holders
 * (sequences + index), the index tree is consistent (parents cached, child counts exact),
 * the policy holds exactly the evictable pages, stats add up; with tiers, each pending
 * promotion agrees with its sequence and the write-back slots add up. O(pages + table
 * entries + write-back slots).
 * Returns PGD_OK or PGD_ECORRUPT (detail via the log hook). */
PGD_API int pgd_cache_check(pgd_cache *c);

#ifdef __cplusplus
}
#endif
#endif /* PAGODA_CACHE_H */
