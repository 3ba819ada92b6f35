/* SPDX-License-Identifier: MIT */
/*
 * pool.h - the page pool: one arena of fixed-size KV pages, refcounts, copy-on-write.
 *
 * A page holds K and V for page_tokens consecutive positions of one sequence, for every
 * layer and KV head. Payload layout of one page:
 *
 *     [layer][K|V][kv_head] region      (every region has the same size)
 *
 * A region holds page_tokens rows of head_dim values in the pool's KV type (codec):
 * for f32 / f16 / bf16 it is page_tokens rows of head_dim contiguous elements (row stride
 * = head_dim), which is what attention wants; block types (q8_0, q4_0, kivi2) store codes
 * and scales in a codec-defined layout that the library's attention kernels read directly.
 * pgd_pool_k(pool, page, layer, head) points at a region.
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

/* How K and V are stored (the codec). Append only.
 *   f32, f16, bf16  plain elements, rows of head_dim.
 *   q8_0            blocks of 32 values: one f16 scale d, int8 codes; value = q * d,
 *                   |error| <= d / 2 with d = amax / 127 (rounded up to f16).
 *   q4_0            blocks of 32 values: one f16 scale d, 4-bit codes q in [0, 15];
 *                   value = (q - 8) * d, d = -(signed max) / 8; |error| <= |d|.
 *   kivi2           2-bit KIVI-style: K per channel over the page's tokens, V per token in
 *                   groups of 32 channels (f16 scale and min each); |error| <= scale / 2.
 *                   Pages are encoded when full; the last partial page of a sequence lives
 *                   in f16 in the cache's residual window (cache.h, kv_residual).
 * Blocks of 32 values run along a row when head_dim is a multiple of 32, and across
 * R = 32 / head_dim consecutive rows when head_dim divides 32; other head_dims are refused
 * for block types. Rows written one by one into a block across rows may re-scale the
 * block's earlier rows (re-quantized from their decoded values), which bounds the error
 * by R d / 2 (q8_0) and R |d| (q4_0) instead. */
typedef enum pgd_kv_type {
    PGD_KV_F32 = 0,
    PGD_KV_F16 = 1,
    PGD_KV_BF16 = 2,
    PGD_KV_Q8_0 = 3,
    PGD_KV_Q4_0 = 4,
    PGD_KV_KIVI2 = 5
} pgd_kv_type;

/* Returns the name of a KV type ("f32", "f16", "bf16", "q8_0", "q4_0", "kivi2") or "?";
 * static storage. */
PGD_API const char *pgd_kv_type_name(pgd_kv_type t);
/* Parses a KV type name (as pgd_kv_type_name writes it). Returns PGD_OK or PGD_EINVAL
 * (unknown name; *out unchanged). */
PGD_API int pgd_kv_type_parse(const char *name, pgd_kv_type *out);
/* Returns bytes per element of a plain KV type (4 for f32, 2 for f16 and bf16), and 0 for
 * block types (q8_0, q4_0, kivi2: use pgd_kv_bytes_per_token) and unknown types. */
PGD_API size_t pgd_kv_type_size(pgd_kv_type t);
/* Returns the K+V bytes one token takes in a pool of this geometry, scales and padding
 * included (page bytes / page_tokens), or 0 for an unknown type or a refused geometry.
 * Pure; O(1). */
PGD_API double pgd_kv_bytes_per_token(pgd_kv_type t, uint32_t page_tokens, uint32_t n_layers,
                                      uint32_t n_kv_heads, uint32_t head_dim);

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
    int kv_rotate;        /* non-zero: K and V are stored Hadamard-rotated (pgd_seq_write_kv
                             rotates; attention rotates queries and un-rotates outputs);
                             needs head_dim a power of two */
    uint64_t rotate_seed; /* seed of the rotation's random signs */
    int key_bounds;       /* non-zero: keep per (page, layer, kv_head) channel-wise min and
                             max of the stored (rotated) keys, for Quest page selection */
} pgd_pool_params;        /* append fields only */

/* Returns the defaults: 1 layer, 1 head, head_dim 64, 16 tokens per page, f16,
 * capacity 64 MiB, payload allocated, no rotation, no key bounds. */
PGD_API pgd_pool_params pgd_pool_default_params(void);

/* Creates a pool and reserves its whole arena and metadata up front.
 * Returns PGD_OK, PGD_EINVAL (zero dimension, page_tokens not a power of two, unknown
 * type, a head_dim the type refuses (see pgd_kv_type), kv_rotate with head_dim not a power
 * of two, capacity below one page or above 2^31 pages, size overflow) or PGD_ENOMEM.
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
/* Bytes of one region (one page, layer, K|V, kv_head). O(1). */
PGD_API uint64_t pgd_pool_region_bytes(const pgd_pool *pool);

/* Key bounds (params.key_bounds): min[head_dim] followed by max[head_dim] of the keys
 * stored so far in (page, layer, kv_head), channel-wise, in the stored (rotated) basis.
 * Reset to +inf / -inf when the page is allocated, copied by copy-on-write, updated by
 * pgd_seq_write_kv. NULL when key bounds are off or an argument is out of range.
 * Valid while the pool lives; host memory even when the arena is device memory. */
PGD_API const float *pgd_pool_key_bounds(const pgd_pool *pool, uint32_t page_id, uint32_t layer,
                                         uint32_t kv_head);

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
