/* SPDX-License-Identifier: MIT */
/*
 * codec_int.h - the contract between page codecs (src/codec/) and the attention kernels
 * (src/attn/). Internal to libpagoda.
 *
 * A "region" is the bytes of one (page, layer, K|V, kv_head) of a pool:
 * pgd_pool_k / pgd_pool_v return its start, and every region of a pool has the same size,
 * pgd__codec_region_bytes(type, page_tokens, head_dim) (the larger of the K and V layouts
 * for codecs whose K and V layouts differ, such as kivi2). Regions are 16-byte aligned
 * when the pool's arena is 64-byte aligned (region sizes are multiples of 16).
 *
 * Rows are token slots of the page, 0 .. page_tokens-1; a row is head_dim values.
 * Rotation (--kv-rotate) is NOT a codec concern: callers rotate K and V before encoding
 * and rotate queries/outputs themselves (see pgd__hadamard below, codec/rotate.c).
 *
 * Kernels never dequantise a whole region into a temporary: k_scores and v_accum read
 * the encoded bytes in their inner loop. Every kernel has a scalar reference
 * (the *_ref ops table) that the SIMD versions are tested against.
 */
#ifndef PGD_CODEC_INT_H
#define PGD_CODEC_INT_H

#include <stddef.h>
#include <stdint.h>

#include "pagoda/pool.h"
#include "util/fp16.h" /* f16 / bf16 conversions, shared by codecs and attention */

typedef enum pgd__kv_kind { PGD__K = 0, PGD__V = 1 } pgd__kv_kind;

typedef struct pgd__codec {
    pgd_kv_type type;
    const char *name;
    /* Nonzero when rows can be written one at a time (f32, f16, bf16, q8_0, q4_0).
     * Zero (kivi2): the region is encoded once from a full page (encode_page); until then
     * the page's rows live in the sequence's f16 residual window (cache.c). The cache
     * stages q8_0 / q4_0 rows too when head_dim < 32 (pgd__codec_staged). */
    int row_writable;

    /* Bytes of one region of kind `kind`. */
    size_t (*region_bytes)(pgd__kv_kind kind, uint32_t page_tokens, uint32_t head_dim);

    /* Writes row `slot` of a region (row_writable codecs). `row` is head_dim floats.
     * Rows of a page are written in increasing slot order, each once (slots of a page
     * already written are never rewritten except by a copy-on-write copy of the region);
     * for head_dim < 32 a q8_0/q4_0 block spans 32/head_dim rows and a new row may
     * re-scale the block's earlier rows (the rule and its error bound in q8_0.c, q4_0.c;
     * the cache does not use it there, see pgd__codec_staged, but tests and other
     * writers may). */
    void (*write_row)(pgd__kv_kind kind, void *region, uint32_t page_tokens, uint32_t head_dim,
                      uint32_t slot, const float *row);

    /* Encodes a whole region from rows[0..n)[head_dim] (n <= page_tokens; rows >= n of
     * the region are left as zeros). Every codec implements it. */
    void (*encode_page)(pgd__kv_kind kind, void *region, uint32_t page_tokens, uint32_t head_dim,
                        const float *rows, uint32_t n);

    /* Decodes rows [r0, r0+n) to out[n][head_dim] (reference and tests; not the hot path). */
    void (*decode_rows)(pgd__kv_kind kind, const void *region, uint32_t page_tokens,
                        uint32_t head_dim, uint32_t r0, uint32_t n, float *out);

    /* K kernel: scores[h * ld + j] = scale * dot(q[h * head_dim ..], K row (r0 + j))
     * for h < nq, j < n. One pass over the K rows serves all nq query vectors (the query
     * heads of a GQA group, or several query rows of a prefill tile). */
    void (*k_scores)(const void *region, uint32_t page_tokens, uint32_t head_dim, uint32_t r0,
                     uint32_t n, const float *q, uint32_t nq, float scale, float *scores,
                     size_t ld);

    /* V kernel: out[h * head_dim + d] += sum_j a[h * lda + j] * V row (r0 + j)[d]
     * for h < nq, j < n. One pass over the V rows serves all nq weight vectors. */
    void (*v_accum)(const void *region, uint32_t page_tokens, uint32_t head_dim, uint32_t r0,
                    uint32_t n, const float *a, size_t lda, uint32_t nq, float *out);

    /* Optional (NULL where a codec has none; only q8_0 / q4_0 at the VNNI level today):
     * the query of k_scores prepared once for many calls over any regions of the pool
     * (quantized to int8 once per work item instead of once per page).
     * prepare_q writes nq query vectors q[nq][head_dim] to prep (vector h at
     * prep + h * PGD__PREP_Q_HEAD_BYTES, so a sub-range of heads is a pointer into it) and
     * returns 1, or returns 0 (prep untouched) when this head_dim has no
     * prepared path: use k_scores then. After it returned 1, k_scores_prep(..., prep, nq,
     * ...) writes exactly (bit for bit) what k_scores(..., q, nq, ...) writes. */
    int (*prepare_q)(uint32_t head_dim, const float *q, uint32_t nq, void *prep);
    void (*k_scores_prep)(const void *region, uint32_t page_tokens, uint32_t head_dim, uint32_t r0,
                          uint32_t n, const void *prep, uint32_t nq, float scale, float *scores,
                          size_t ld);

    /* Optional (NULL where a codec has none; f32, f16 and bf16 at the SIMD levels): k_scores
     * and v_accum that also prefetch the region `next` (NULL: none), next_bytes *
     * PGD__PF_ROWS / page_tokens bytes before each group of PGD__PF_ROWS (4) rows, so that
     * attention streams the next page in at the pace it consumes this one (decode rows,
     * attn.c). They write exactly (bit for bit) what k_scores / v_accum write. */
    void (*k_scores_pf)(const void *region, uint32_t page_tokens, uint32_t head_dim, uint32_t r0,
                        uint32_t n, const float *q, uint32_t nq, float scale, float *scores,
                        size_t ld, const void *next, size_t next_bytes);
    void (*v_accum_pf)(const void *region, uint32_t page_tokens, uint32_t head_dim, uint32_t r0,
                       uint32_t n, const float *a, size_t lda, uint32_t nq, float *out,
                       const void *next, size_t next_bytes);
} pgd__codec;

/* Nonzero when a pool of this codec and head_dim stages its rows: kivi2 (not
 * row-writable), and q8_0 / q4_0 with head_dim < 32, whose 32-value blocks span 32 / head_dim
 * rows, so a row written alone could not get the bytes it gets when its block is written
 * at once. A staged pool's rows go to each sequence's f16 residual ring (cache.c) and a
 * page is encoded once, from the ring, when its last row is written (encode_page); so a
 * full page's bytes never depend on how its rows were written. Attention reads the rows of
 * a query's own page from the ring (pgd__seq_residual in pgd_int.h). */
int pgd__codec_staged(const pgd__codec *codec, uint32_t head_dim);

/* Bytes of one prepared query vector (prepare_q), for any head_dim. */
enum { PGD__PREP_Q_HEAD_BYTES = 640 };

/* The codec of a type with the fastest kernels this CPU supports (chosen once, at first
 * call, from cpuid); NULL for an unknown type. Thread-safe. */
const pgd__codec *pgd__codec_get(pgd_kv_type type);
/* The scalar reference of a type (the spec the fast kernels are tested against). */
const pgd__codec *pgd__codec_ref(pgd_kv_type type);
/* The table of a type at an ISA level (util/cpu.h), or NULL when the type is unknown or this
 * CPU or build lacks the level. For tests and benchmarks (attention's forced levels). */
const pgd__codec *pgd__codec_at(pgd_kv_type type, int isa);

/* Region bytes of a type (max of K and V layouts), 0 for an unknown type or overflow. */
size_t pgd__codec_region_bytes(pgd_kv_type type, uint32_t page_tokens, uint32_t head_dim);

/* Orthonormal randomized Hadamard rotation of one head vector, in place:
 * x <- H * D * x (forward) or x <- D * H * x (inverse), with H the normalised
 * Walsh-Hadamard matrix of size head_dim (a power of two) and D a diagonal of +-1
 * signs drawn from `seed`. Forward then inverse is the identity (up to rounding);
 * dot(fwd(q), fwd(k)) == dot(q, k). Returns PGD_EINVAL when head_dim is not a power of two. */
int pgd__hadamard(float *x, uint32_t head_dim, uint64_t seed, int inverse);

/* NULL when a pool of this type may have this geometry, else why not (static text, to
 * follow "kv type <name> " in pgd_pool_params_check's reason):
 * q8_0, q4_0 and kivi2 need head_dim a multiple of 32 or a divisor of 32, and
 * page_tokens * head_dim a multiple of 32. */
const char *pgd__codec_geometry_error(pgd_kv_type type, uint32_t page_tokens, uint32_t head_dim);

#endif /* PGD_CODEC_INT_H */
