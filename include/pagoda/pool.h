/* SPDX-License-Identifier: MIT */
/*
 * pool.h - the page pool: one arena of fixed-size KV pages, refcounts, copy-on-write.
 *
 * A page holds K and V for page_tokens consecutive positions of one sequence, for every
 * layer and KV head. Payload layout of one page (elements of the pool's KV type):
 *
 *     [layer][K|V][kv_head][page_tokens][head_dim]
 *
 * so pgd_pool_k(pool, page, layer, head) points at page_tokens rows of head_dim
 * contiguous elements (row stride = head_dim), which is what attention wants.
 *
 * Page metadata (refcounts, free list) lives in host memory apart from the arena, so a
 * metadata-only pool (no payload at all) can simulate millions of tokens.
 *
 * Thread-safety: a pool is NOT internally locked. The cache manager (cache.h) owns its
 * pool and serializes every metadata call under its lock; a standalone pool must be
 * serialized by its user. The payload accessors (pgd_pool_k/v, pgd_pool_page_data) only
 * do arithmetic and may be called from any thread while the page is referenced.
 */
#ifndef PAGODA_POOL_H
#define PAGODA_POOL_H

#include "pagoda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element type of pages. Append only: the codec layer adds quantized types later. */
typedef enum pgd_kv_type { PGD_KV_F32 = 0, PGD_KV_F16 = 1 } pgd_kv_type;

/* Returns the name of a KV type ("f32", "f16") or "?"; static storage. */
PGD_API const char *pgd_kv_type_name(pgd_kv_type t);
/* Returns bytes per element of a KV type, 0 for an unknown type. */
PGD_API size_t pgd_kv_type_size(pgd_kv_type t);

typedef struct pgd_pool pgd_pool; /* opaque; see thread-safety above */

typedef struct pgd_pool_params {
    uint32_t n_layers;          /* layers of the model; >= 1 */
    uint32_t n_kv_heads;        /* KV heads per layer; >= 1 */
    uint32_t head_dim;          /* elements per head vector; >= 1 */
    uint32_t page_tokens;       /* tokens per page, power of two; default 16 */
    pgd_kv_type kv_type;        /* element type; default f16 */
    uint64_t capacity_bytes;    /* payload budget; pages = capacity_bytes / page bytes */
    uint32_t capacity_pages;    /* if non-zero, overrides capacity_bytes */
    int metadata_only;          /* non-zero: no payload arena (simulation, replay) */
    const pgd_allocator *alloc; /* NULL: libc */
    pgd_log_fn log;             /* NULL: silent */
    void *log_ud;
} pgd_pool_params; /* append fields only */

/* Returns the defaults: 1 layer, 1 head, head_dim 64, 16 tokens per page, f16,
 * capacity 64 MiB, payload allocated. */
PGD_API pgd_pool_params pgd_pool_default_params(void);

/* Creates a pool and reserves its whole arena and metadata up front.
 * Returns PGD_OK, PGD_EINVAL (zero dimension, page_tokens not a power of two, unknown
 * type, capacity below one page or above 2^31 pages, size overflow) or PGD_ENOMEM.
 * *out is the pool (caller owns, release with pgd_pool_destroy) or NULL on error. */
PGD_API int pgd_pool_create(const pgd_pool_params *p, pgd_pool **out);
/* Destroys a pool and its arena. NULL: no-op. Pages still referenced are released too. */
PGD_API void pgd_pool_destroy(pgd_pool *pool);

/* Geometry. O(1). */
PGD_API uint32_t pgd_pool_n_pages(const pgd_pool *pool);
PGD_API uint32_t pgd_pool_page_tokens(const pgd_pool *pool);
PGD_API uint64_t pgd_pool_page_bytes(const pgd_pool *pool);  /* payload bytes per page */
PGD_API uint64_t pgd_pool_token_bytes(const pgd_pool *pool); /* K+V bytes per token */
PGD_API pgd_kv_type pgd_pool_kv_type(const pgd_pool *pool);
PGD_API int pgd_pool_has_payload(const pgd_pool *pool);

/* Takes a page off the free list with refcount 1. O(1).
 * Returns PGD_OK, or PGD_ENOSPC when no page is free (the pool never evicts: that is
 * the cache manager's job). The payload is not cleared. */
PGD_API int pgd_pool_alloc(pgd_pool *pool, uint32_t *page_id);
/* Adds a reference to a live page. O(1). PGD_CHECK-aborts on a free page id. */
PGD_API void pgd_pool_ref(pgd_pool *pool, uint32_t page_id);
/* Drops a reference; at zero the page returns to the free list. Returns the remaining
 * count. O(1). */
PGD_API uint32_t pgd_pool_unref(pgd_pool *pool, uint32_t page_id);
/* Returns the refcount of a page (0 for a free page). O(1). */
PGD_API uint32_t pgd_pool_refcount(const pgd_pool *pool, uint32_t page_id);

/* Copy-on-write. If *page_id has more than one reference, allocates a new page, copies
 * the payload, drops one reference of the old page and stores the new id in *page_id.
 * Returns 1 when it copied, 0 when the page was already private, PGD_ENOSPC when no
 * page is free (nothing changed). */
PGD_API int pgd_pool_cow(pgd_pool *pool, uint32_t *page_id);

/* Payload accessors: pointer to page_tokens rows of head_dim elements of K (or V) of
 * (page, layer, kv_head). NULL for a metadata-only pool. Valid while the page is
 * referenced and the pool lives. */
PGD_API void *pgd_pool_k(pgd_pool *pool, uint32_t page_id, uint32_t layer, uint32_t kv_head);
PGD_API void *pgd_pool_v(pgd_pool *pool, uint32_t page_id, uint32_t layer, uint32_t kv_head);
/* Start of a whole page's payload (pgd_pool_page_bytes bytes); NULL if metadata-only. */
PGD_API void *pgd_pool_page_data(pgd_pool *pool, uint32_t page_id);

/* Maps token position p to (index into the page table, slot in that page). */
static inline void pgd_page_slot(uint32_t page_tokens, uint64_t pos, uint64_t *page_index,
                                 uint32_t *slot)
{
    *page_index = pos / page_tokens;
    *slot = (uint32_t)(pos % page_tokens);
}

typedef struct pgd_pool_stats {
    uint32_t n_pages_total;
    uint32_t n_pages_free;
    uint32_t n_pages_used; /* refcount > 0 */
    uint64_t page_bytes;
    uint64_t arena_bytes;    /* payload bytes reserved (0 if metadata-only) */
    uint64_t metadata_bytes; /* host bytes for refcounts and lists */
    uint64_t n_cow_copies;   /* pages copied by pgd_pool_cow */
} pgd_pool_stats;

PGD_API void pgd_pool_get_stats(const pgd_pool *pool, pgd_pool_stats *out);

/* Integrity walk: free list and refcounts agree, counts add up. O(n_pages).
 * Returns PGD_OK or PGD_ECORRUPT (detail via the log hook). */
PGD_API int pgd_pool_check(const pgd_pool *pool);

#ifdef __cplusplus
}
#endif
#endif /* PAGODA_POOL_H */
