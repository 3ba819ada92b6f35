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
 * and scales in a layout that the library's attention kernels read directly. Every byte
 * offset and every region layout is published in layout.h (pgd_pool_get_layout), so that
 * code outside the library (a GPU kernel) can read and write pages.
 * pgd_pool_k(pool, page, layer, head) points at a region.
 *
 * The arena: the pool allocates its own host arena, or uses one the caller owns
 * (params.arena), in host or device memory. A device arena is never dereferenced on the
 * host: copy-on-write goes through params.copy_page, and the host-only paths refuse with
 * PGD_EINVAL (pgd_seq_write_kv, the library's attention, key bounds; see each call).
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
 * for block types. A block across rows could not be written row by row without its bytes
 * depending on the order of the writes, so the cache stages those rows as it does kivi2's:
 * in f16 in the sequence's residual window, a page encoded once, when full, from the f16
 * rows (error bounds as above, of the f16-rounded values). So with every type a full
 * page's bytes depend only on its K/V values, however they were written (one prefill,
 * chunks, decode, recompute). The byte layout of every type: layout.h. */
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

/* Tokens per page of pgd_pool_default_params (and of engines that take no --page-tokens). */
#define PGD_DEFAULT_PAGE_TOKENS 16

/* Copies n_bytes (one whole page) from src to dst, both in the pool's arena (device memory
 * for a device arena). Returns PGD_OK, or a negative status (PGD_EIO, ...) that
 * pgd_pool_cow returns (a positive value counts as PGD_EIO). Called with the cache lock
 * held when the pool is a cache's: must not call into the cache. ud is params.copy_ud. */
typedef int (*pgd_copy_page_fn)(void *ud, void *dst, const void *src, uint64_t n_bytes);

typedef struct pgd_pool_params {
    uint32_t n_layers;          /* layers of the model; >= 1 */
    uint32_t n_kv_heads;        /* KV heads per layer; >= 1 */
    uint32_t head_dim;          /* elements per head vector; >= 1 */
    uint32_t page_tokens;       /* tokens per page, power of two; PGD_DEFAULT_PAGE_TOKENS */
    pgd_kv_type kv_type;        /* element type; default f16 */
    uint64_t capacity_bytes;    /* payload budget; pages = capacity_bytes / page bytes
                                   (ignored when arena is set) */
    uint32_t capacity_pages;    /* if non-zero, overrides capacity_bytes (and arena_bytes) */
    int metadata_only;          /* non-zero: no payload arena (simulation, replay) */
    const pgd_allocator *alloc; /* NULL: libc */
    pgd_log_fn log;             /* NULL: silent */
    void *log_ud;
    int kv_rotate;        /* non-zero: K and V are stored Hadamard-rotated (pgd_seq_write_kv
                             rotates; attention rotates queries and un-rotates outputs);
                             needs head_dim a power of two */
    uint64_t rotate_seed; /* seed of the rotation's random signs */
    int key_bounds;       /* non-zero: keep per (page, layer, kv_head) channel-wise min and
                             max of the stored (rotated) keys, for Quest page selection;
                             host arenas only (pgd_seq_write_kv computes them) */
    /* A caller-owned arena. When set, the pool allocates no page memory: page p lives at
     * arena + p * page bytes (layout.h). Pages = capacity_pages if non-zero (which must
     * fit: capacity_pages * page bytes <= arena_bytes), else arena_bytes / page bytes;
     * capacity_bytes is ignored. The caller keeps the memory valid until
     * pgd_pool_destroy returns and frees it after. */
    void *arena;                /* NULL: the pool allocates its own host arena; else 64-byte
                                   aligned page memory, host or device */
    uint64_t arena_bytes;       /* bytes at arena (>= one page); 0 without arena */
    int arena_device;           /* non-zero: arena is not host-addressable (device memory);
                                   needs copy_page, excludes key_bounds */
    pgd_copy_page_fn copy_page; /* NULL: memcpy (host arenas); copy-on-write (and tier
                                   moves) copy pages through it; required for a device arena */
    void *copy_ud;              /* passed to copy_page */
} pgd_pool_params;              /* append fields only */

/* Returns the defaults: 1 layer, 1 head, head_dim 64, PGD_DEFAULT_PAGE_TOKENS tokens per
 * page, f16, capacity 64 MiB, payload allocated by the pool, no rotation, no key bounds. */
PGD_API pgd_pool_params pgd_pool_default_params(void);

/* Validates params as pgd_pool_create does, allocating nothing: when it returns PGD_OK,
 * pgd_pool_create(p) can fail only with PGD_ENOMEM. Returns PGD_OK (why gets "") or
 * PGD_EINVAL with a one-line reason in why (NUL-terminated, truncated to why_len bytes;
 * why may be NULL when why_len is 0): a zero dimension, an unknown kv type, page_tokens
 * not a power of two, kv_rotate with head_dim not a power of two, a block type (q8_0,
 * q4_0, kivi2) with head_dim neither a multiple nor a divisor of 32 or page_tokens x
 * head_dim not a multiple of 32, capacity below one page or above 2^31 pages, size
 * overflow, and for a caller arena: metadata_only, misalignment, arena_bytes below one page
 * or below capacity_pages, a device arena without copy_page or with key_bounds (and
 * arena_bytes / arena_device without an arena). The head_dim reasons come first, rotation
 * before the block types, as an engine reports them for a model. Pure; O(1); thread-safe. */
PGD_API int pgd_pool_params_check(const pgd_pool_params *p, char *why, size_t why_len);

/* Creates a pool and reserves its whole arena (unless the caller gives one) and metadata
 * up front. Returns PGD_OK, PGD_EINVAL (see pgd_pool_params_check; the reason goes to the
 * log hook) or PGD_ENOMEM. *out is the pool (caller owns, release with pgd_pool_destroy)
 * or NULL on error. */
PGD_API int pgd_pool_create(const pgd_pool_params *p, pgd_pool **out);
/* Destroys a pool and its own arena (a caller's arena stays the caller's). NULL: no-op.
 * Pages still referenced are released too. */
PGD_API void pgd_pool_destroy(pgd_pool *pool);

/* Geometry. O(1). */
PGD_API uint32_t pgd_pool_n_pages(const pgd_pool *pool);
PGD_API uint32_t pgd_pool_page_tokens(const pgd_pool *pool);
PGD_API uint64_t pgd_pool_page_bytes(const pgd_pool *pool);  /* payload bytes per page */
PGD_API uint64_t pgd_pool_token_bytes(const pgd_pool *pool); /* K+V bytes per token */
PGD_API pgd_kv_type pgd_pool_kv_type(const pgd_pool *pool);
/* Non-zero when the pool has page memory (its own arena or the caller's, host or device);
 * 0 when metadata-only. The full layout, device flag included: pgd_pool_get_layout. */
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
 * the payload (params.copy_page when set, else memcpy; no copy when metadata-only), drops
 * one reference of the old page and stores the new id in *page_id.
 * Returns 1 when it copied, 0 when the page was already private, PGD_ENOSPC when no
 * page is free, or copy_page's negative status (PGD_EIO for a positive one); nothing
 * changed on error. */
PGD_API int pgd_pool_cow(pgd_pool *pool, uint32_t *page_id);

/* Payload accessors: pointer to page_tokens rows of head_dim elements of K (or V) of
 * (page, layer, kv_head). NULL for a metadata-only pool. Valid while the page is
 * referenced and the pool lives. With a device arena these are device addresses (only
 * arithmetic is done on the host). */
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
 * Valid while the pool lives; host memory (key bounds need a host arena). */
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
    uint64_t arena_bytes;    /* payload bytes in use: n_pages_total * page_bytes (0 if
                                metadata-only), the pool's own or the caller's */
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
