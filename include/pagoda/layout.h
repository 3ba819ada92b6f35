/* SPDX-License-Identifier: MIT */
/*
 * layout.h - the published byte layout of a pool's pages, for code outside the library
 * that reads or writes them (a GPU engine with a device arena, a tier mover, a debugger).
 * The codecs in src/codec/ implement exactly this; tests/unit/test_pool.c decodes pages
 * from this description and compares with the library.
 *
 * Arena, pages, regions (all offsets in bytes, strides from pgd_pool_get_layout):
 *
 *   arena (64-byte aligned; the pool's own, or params.arena: host or device memory)
 *   +------------------+------------------+-- ... --+------------------+
 *   |      page 0      |      page 1      |         |   page n_pages-1 |   page_stride
 *   +------------------+------------------+-- ... --+------------------+
 *
 *   one page (page_bytes = n_layers * layer_stride)
 *   +-----------------------------------+-----------------------------------+-- ...
 *   |              layer 0              |              layer 1              |   layer_stride
 *   +-----------------+-----------------+-----------------+-----------------+-- ...
 *   |        K        |        V        |        K        |        V        |   kv_stride
 *   +--------+--------+--------+--------+
 *   | head 0 | head 1 | head 0 | head 1 |  ...  n_kv_heads regions each           head_stride
 *   +--------+--------+--------+--------+
 *
 *   region(p, l, kv, h) = arena + p * page_stride + l * layer_stride + kv * kv_stride
 *                         + h * head_stride                (kv: 0 for K, 1 for V)
 *
 * A region is region_bytes (= head_stride, a multiple of 16) holding the page_tokens rows
 * (token slots 0 .. page_tokens-1 of the page) of head_dim values of one head, in the
 * stored basis (Hadamard-rotated when params.kv_rotate). Bytes past the layout below, up
 * to region_bytes, are padding with unspecified contents. All values are little-endian;
 * f16 is IEEE binary16, bf16 the top half of an IEEE binary32. Below, pt = page_tokens,
 * hd = head_dim, and f = r * hd + d is the flat index of value d of row r.
 *
 * f32, f16, bf16 (plain types): rows of hd elements, row_stride = hd * element size
 *
 *   +-----------+-----------+-- ... --+--------------+-----+
 *   |   row 0   |   row 1   |         |   row pt-1   | pad |     value(r, d) = elem[f]
 *   +-----------+-----------+-- ... --+--------------+-----+
 *   0      row_stride                           pt * row_stride
 *
 * The block types quantize blocks of 32 consecutive flat indices (block b = f / 32,
 * i = f % 32): along a row when hd is a multiple of 32, across 32 / hd rows when hd
 * divides 32 (other head_dims are refused). row_stride is 0 for them: a row is not a
 * contiguous run of bytes. K and V regions of q8_0 and q4_0 are laid out alike.
 *
 * q8_0: value(f) = code[f] * scale[b]
 *
 *   +----------------------------+------------------------------+-----+
 *   | int8 code[pt*hd]           | f16 scale[pt*hd/32]          | pad |
 *   +----------------------------+------------------------------+-----+
 *   0                      codes_bytes = scales_offset = pt*hd     + pt*hd/16
 *
 * q4_0: value(f) = (q - 8) * scale[b], q the 4-bit code of f: in byte 16 b + i % 16 of
 * the codes, the low nibble for i < 16 and the high nibble for i >= 16 (ggml's order)
 *
 *   +----------------------------+------------------------------+-----+
 *   | codes[pt*hd/2]             | f16 scale[pt*hd/32]          | pad |
 *   +----------------------------+------------------------------+-----+
 *   0                      codes_bytes = scales_offset = pt*hd/2   + pt*hd/16
 *
 * kivi2: a 2-bit code c per value, in 32-bit little-endian words: word f / 16, bits
 * 2 (f % 16) and 2 (f % 16) + 1; codes_bytes = pt*hd/4. K is quantized per channel d over
 * the page's rows, V per row r and group of G = min(32, hd) channels (ng = hd / G):
 *
 *   K: +-----------------+-------------------+-------------------+-----+
 *      | codes[pt*hd/4]  | f16 scale[hd]     | f16 min[hd]       | pad |
 *      +-----------------+-------------------+-------------------+-----+
 *      0           k_scales_offset     k_mins_offset = k_scales_offset + 2 hd
 *      value(r, d) = min[d] + c * scale[d]
 *
 *   V: +-----------------+-------------------+-------------------+-----+
 *      | codes[pt*hd/4]  | f16 scale[pt][ng] | f16 min[pt][ng]   | pad |
 *      +-----------------+-------------------+-------------------+-----+
 *      0           v_scales_offset     v_mins_offset = v_scales_offset + 2 pt ng
 *      value(r, d) = min[r][d / G] + c * scale[r][d / G]
 *
 *   region_bytes is the larger of the two, rounded up to 16. A kivi2 page is encoded only
 *   once it is full; the last, partial page of a sequence lives in f16 in the cache's
 *   residual window (cache.h: kv_residual, pgd_cache_kv_residual), not in its region.
 *   The same holds for q8_0 and q4_0 when head_dim < 32 (blocks across rows, pool.h).
 *   A page encoded whole (those) has zero padding, so its bytes are a function of its
 *   rows; the padding of row-written pages is unspecified.
 */
#ifndef PAGODA_LAYOUT_H
#define PAGODA_LAYOUT_H

#include "pagoda.h"
#include "pool.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pgd_pool_layout {
    void *arena;      /* start of page 0 (host, or device when arena_device); NULL when
                         metadata-only */
    int arena_device; /* non-zero: arena is the caller's device memory */
    pgd_kv_type kv_type;
    uint32_t n_pages;
    uint32_t n_layers;
    uint32_t n_kv_heads;
    uint32_t head_dim;        /* values per row */
    uint32_t page_tokens;     /* rows per region */
    uint64_t page_bytes;      /* payload bytes of one page */
    uint64_t page_stride;     /* page p -> p + 1 (== page_bytes) */
    uint64_t layer_stride;    /* layer l -> l + 1 within a page: 2 * kv_stride */
    uint64_t kv_stride;       /* K -> V of one layer: n_kv_heads * head_stride */
    uint64_t head_stride;     /* kv head h -> h + 1: region_bytes */
    uint64_t region_bytes;    /* one (page, layer, K|V, head) region; a multiple of 16 */
    uint64_t row_stride;      /* plain types: row r -> r + 1 in a region; 0 for block types */
    uint64_t codes_bytes;     /* block types: bytes of the codes at the region's start; 0 */
    uint64_t k_scales_offset; /* block types: offset of the f16 scales in a K region; 0 */
    uint64_t v_scales_offset; /* block types: the same in a V region; 0 */
    uint64_t k_mins_offset;   /* kivi2: offset of the f16 mins in a K region; 0 otherwise */
    uint64_t v_mins_offset;   /* kivi2: the same in a V region; 0 otherwise */
} pgd_pool_layout;            /* append fields only */

/* Fills *out with the pool's layout (see the diagram above). Constant for the pool's
 * lifetime. O(1); thread-safe (reads only what create set). */
PGD_API void pgd_pool_get_layout(const pgd_pool *pool, pgd_pool_layout *out);

#ifdef __cplusplus
}
#endif
#endif /* PAGODA_LAYOUT_H */
