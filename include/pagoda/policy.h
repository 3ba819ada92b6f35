/* SPDX-License-Identifier: MIT */
/*
 * policy.h - the eviction policy interface: an ops table that orders the evictable pages
 * of a cache manager. LRU and Belady (pgd_policy_builtin) are two implementations; a user
 * plugs another one through pgd_cache_params.policy_ops / policy_ud.
 *
 * What the policy sees. Items are pool page ids (0 .. n_pages-1). A page is evictable when
 * it is registered in the prefix index (cached) and no sequence holds it. The cache
 * manager tells the policy every change of that set, and asks it which page to evict:
 *
 *   insert(page)        the page was registered in the index; a sequence still holds it,
 *                       so it is not evictable yet (informational: order by registration)
 *   hit(page)           a sequence took a reference on the cached page (a match, a dedup);
 *                       if it was evictable, it no longer is: drop it from the set
 *   unreferenced(page)  the last sequence dropped the page: it joins the evictable set.
 *                       Within one release (pgd_seq_destroy, truncate) the cache calls it
 *                       deepest page first
 *   victim(accept)      the page to evict next, among the evictable pages that accept()
 *                       allows (the leaves of the prefix tree), or PGD_POLICY_NO_PAGE.
 *                       Must not change the set: the cache calls remove() next if it
 *                       evicts the page
 *   remove(page)        the page left the set for good (evicted, or the cache is done with
 *                       it); a page not in the set is a no-op
 *   contains(page)      non-zero if the page is in the evictable set (pgd_cache_check)
 *   size()              how many pages the set holds (allocation planning, stats, check)
 *   leaf(page, is_leaf) optional: the page (inserted, not yet removed) stopped being a leaf
 *                       of its cache's prefix tree (is_leaf 0: a cached child appeared) or
 *                       became one again (1: its last cached child left). A page is a leaf
 *                       from insert() until told otherwise. Callers that know the tree call
 *                       it (the tiers' record map, the replay's tiers); the pool does not
 *                       (its release order keeps leaves first). A policy may use it to keep
 *                       non-leaves out of its victim() search, which must still honour
 *                       accept(): cost and priority then offer a page told not a leaf only
 *                       when accept() allows no leaf (a caller's fallback, e.g. the tiers'
 *                       parent cycles of crafted records). NULL: accept() alone
 *
 * Contract for every op:
 *   - Called with the cache lock held (create and destroy: from pgd_cache_create /
 *     pgd_cache_destroy, with no other call in flight). An op must not call into the cache
 *     or its sequences (the lock is not recursive: it would deadlock), must not block for
 *     long (every cache call waits on it) and must not fail: it cannot return an error,
 *     so reserve everything in create (n_pages is known there; the hot path should not
 *     allocate).
 *   - The ops are called from whichever thread calls the cache, one at a time.
 *   - The set is exactly the pages made evictable by unreferenced() and not yet taken out
 *     by hit() or remove(); pgd_cache_check verifies contains()/size() against the cache.
 *   - victim() must return a page for which accept() returned non-zero (accept may be
 *     called any number of times; it is cheap and does not modify anything). A victim that
 *     is not an evictable leaf is refused: the cache logs an error and evicts nothing.
 *   - The accept callback and the page info are borrowed for the call.
 */
#ifndef PAGODA_POLICY_H
#define PAGODA_POLICY_H

#include "pagoda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What victim() returns when it has nothing to evict. */
#define PGD_POLICY_NO_PAGE UINT32_MAX

/* Future-knowledge oracle for Belady (and, later, hint-aware policies): returns the
 * logical time of the next use of the cached page with block hash h, or UINT64_MAX if
 * it is never used again. Called with the cache lock held: must not call into the cache. */
typedef uint64_t (*pgd_next_use_fn)(void *ud, pgd_hash h);

/* A clock in nanoseconds (monotonic unless the user says otherwise). The cache's clock
 * (pgd_cache_params.clock; NULL: CLOCK_MONOTONIC) is the time base of every *_ns field
 * below; tests inject one to step TTLs. Called with the cache lock held. */
typedef uint64_t (*pgd_clock_fn)(void *ud);

/* The default priority of a page (TensorRT-LLM's default retention priority). */
#define PGD_PRIORITY_DEFAULT 35
#define PGD_PRIORITY_MAX 100

/* What the cache tells a policy about a cached page (borrowed for the call). The
 * retention fields are the page's as the cache holds them (cache.h pgd_retention, merged
 * over the requests that used it); a policy that does not order by them ignores them. */
typedef struct pgd_policy_page {
    pgd_hash hash;        /* block hash of the page's content (chained: embeds its prefix) */
    uint32_t depth;       /* 0 for the first block of a chain; a parent's depth is one less */
    uint32_t priority;    /* 0..100 (PGD_PRIORITY_DEFAULT unless a request said) */
    uint64_t expires_ns;  /* clock time its retention ends (0: none). The cache itself evicts
                             expired evictable pages before asking the policy */
    uint64_t next_use_ns; /* hinted next use, clock time (0: no hint) */
    uint64_t now_ns;      /* the cache's clock at this call */
    uint32_t tenant;      /* the tenant index of the page (pgd_cache_tenant_stats) */
    uint32_t uses;        /* matches of the block over its life in this cache (0 at
                             registration; a hit counts itself) */
    uint64_t bytes;       /* bytes the page occupies (pool page + key bounds) */
    double cost;          /* the recompute cost of the page (pgd_cost_model), FLOPs */
} pgd_policy_page;

/* The cost model of a page for cost-aware policies (pgd_cache_params.cost): what a hit on
 * the page at depth d (positions [d*T, (d+1)*T), T = page_tokens) saves:
 *   cost(d) = T * linear_flops_per_token + attn_flops_per_pos * T * (d*T + (T+1)/2)
 * the per-token linear part (projections, MLP: about 2 x the parameters touched per
 * token) plus attention over everything before each token (4 x n_layers x n_heads x
 * head_dim per (query, key) pair). Zero fields: derived from the pool's geometry
 * (pgd_cost_model_default). */
typedef struct pgd_cost_model {
    double linear_flops_per_token;
    double attn_flops_per_pos;
} pgd_cost_model;

/* Returns non-zero if page may be evicted (it is a leaf of the prefix tree). */
typedef int (*pgd_policy_accept_fn)(void *ctx, uint32_t page);

/* Everything create() gets (borrowed for the call; copy what the state needs). */
typedef struct pgd_policy_init {
    uint32_t n_pages;           /* page ids are 0 .. n_pages-1 */
    const pgd_allocator *alloc; /* the cache's allocator, never NULL: use it for the state */
    pgd_next_use_fn next_use;   /* pgd_cache_params.next_use (may be NULL) */
    void *next_use_ud;          /* pgd_cache_params.next_use_ud */
    void *ud;                   /* pgd_cache_params.policy_ud */
    pgd_clock_fn clock;         /* the cache's clock, never NULL (victim() may read it) */
    void *clock_ud;
    uint64_t page_bytes;  /* bytes of one page (pool page + key bounds), > 0 */
    pgd_cost_model cost;  /* resolved (no zero field) */
    uint32_t page_tokens; /* tokens per page (T of the cost model); 0: unknown, taken as 1 */
} pgd_policy_init;        /* append fields only */

/* An eviction policy. Every member but leaf is required. The table is borrowed: it must
 * outlive every cache created with it (a static const table is the usual form). */
typedef struct pgd_policy_ops {
    const char *name; /* for logs; static storage */
    /* Creates the state. Returns PGD_OK, PGD_ENOMEM or PGD_EINVAL (e.g. Belady without
     * next_use), which pgd_cache_create returns. *state is the policy's own. */
    int (*create)(const pgd_policy_init *init, void **state);
    /* Destroys a state create() made. Never called with NULL. */
    void (*destroy)(void *state);
    void (*insert)(void *state, uint32_t page, const pgd_policy_page *info);
    void (*hit)(void *state, uint32_t page, const pgd_policy_page *info);
    void (*unreferenced)(void *state, uint32_t page, const pgd_policy_page *info);
    uint32_t (*victim)(void *state, pgd_policy_accept_fn accept, void *ctx);
    void (*remove)(void *state, uint32_t page);
    int (*contains)(const void *state, uint32_t page);
    uint32_t (*size)(const void *state);
    /* Optional (NULL: never called): page stopped (is_leaf 0) or started again (1) being a
     * leaf of the prefix tree; see the op list above. Changes no order: a page told it is
     * a leaf again keeps the key it had. */
    void (*leaf)(void *state, uint32_t page, int is_leaf);
} pgd_policy_ops;

/* Eviction policies built in. Append only. */
typedef enum pgd_policy_kind {
    PGD_POLICY_LRU = 0,     /* least recently released first; O(1) */
    PGD_POLICY_BELADY = 1,  /* offline optimal: farthest next use first, ties deepest page
                               first; needs next_use */
    PGD_POLICY_S3FIFO = 2,  /* small FIFO + main FIFO + ghost queue (SOSP'23); O(1) */
    PGD_POLICY_ARC = 3,     /* adaptive replacement cache (recency / frequency lists with
                               ghosts, FAST'03); O(1) */
    PGD_POLICY_COST = 4,    /* cost-aware: value per byte of what a hit saves (cost model)
                               with frequency and aging (GDSF-style); src/policy/cost.c */
    PGD_POLICY_PRIORITY = 5 /* TensorRT-LLM-style: lowest priority first, LRU within a
                               priority; next-use hints (KVFlow) order hinted pages */
} pgd_policy_kind;

/* Number of built-in kinds (valid kinds are 0 .. PGD_POLICY_COUNT-1). */
#define PGD_POLICY_COUNT 6

/* Returns the ops table of a built-in policy (static storage), or NULL for an unknown kind.
 * A user policy may wrap one (e.g. to observe LRU's decisions). */
PGD_API const pgd_policy_ops *pgd_policy_builtin(pgd_policy_kind kind);
/* Returns the policy's name ("lru", "belady", "s3fifo", "arc", "cost", "priority") or
 * "?"; static storage. */
PGD_API const char *pgd_policy_name(pgd_policy_kind k);
/* Parses a policy name. Returns PGD_OK or PGD_EINVAL. */
PGD_API int pgd_policy_from_name(const char *name, pgd_policy_kind *out);
/* The cost model derived from a pool's geometry when the engine gives none: attention
 * 4 x n_layers x n_kv_heads x head_dim per pair (the query heads are not known: GQA
 * undercounts), linear 24 x n_layers x (n_kv_heads x head_dim)^2 per token (a dense
 * transformer of that width). Fills the zero fields of *m. Pure. */
PGD_API void pgd_cost_model_default(pgd_cost_model *m, uint32_t n_layers, uint32_t n_kv_heads,
                                    uint32_t head_dim);
/* cost(depth) of the formula above, for pages of page_tokens tokens. Pure. */
PGD_API double pgd_cost_model_page(const pgd_cost_model *m, uint32_t page_tokens, uint32_t depth);

#ifdef __cplusplus
}
#endif
#endif /* PAGODA_POLICY_H */
