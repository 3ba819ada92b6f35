/* SPDX-License-Identifier: MIT */
/*
 * test_pool.c - the page pool (pool.h): params validation and its reasons, geometry, the
 * published layout (layout.h) decoded independently and compared with the codecs,
 * alloc/ref/unref, copy-on-write, caller-owned host and device arenas with a copy hook,
 * the metadata-only mode and stats. pgd_pool_check() is called after every mutation.
 */
#include <math.h>
#include <sys/mman.h>

#include <pagoda/attn.h>
#include <pagoda/cache.h>
#include <pagoda/layout.h>
#include <pagoda/pool.h>

#include "pgd_int.h"
#include "t.h"

static pgd_pool_params small_params(pgd_kv_type type, uint32_t n_pages)
{
    pgd_pool_params p = pgd_pool_default_params();
    p.n_layers = 3;
    p.n_kv_heads = 2;
    p.head_dim = 5;
    p.page_tokens = 4;
    p.kv_type = type;
    p.capacity_pages = n_pages;
    return p;
}

/* ---- params ---- */

static int test_defaults(void)
{
    pgd_pool_params p = pgd_pool_default_params();
    pgd_pool *pool = NULL;
    T_EQ(p.n_layers, 1);
    T_EQ(p.n_kv_heads, 1);
    T_EQ(p.head_dim, 64);
    T_EQ(p.page_tokens, 16);
    T_EQ(p.kv_type, PGD_KV_F16);
    T_EQ(p.capacity_bytes, 64ull << 20);
    T_EQ(p.metadata_only, 0);
    T_ASSERT(p.alloc == NULL);
    T_OK(pgd_pool_create(&p, &pool));
    T_EQ(pgd_pool_page_bytes(pool), 2ull * 64 * 16 * 2);
    T_EQ(pgd_pool_n_pages(pool), (64ull << 20) / (2ull * 64 * 16 * 2));
    T_EQ(pgd_pool_has_payload(pool), 1);
    T_EQ(pgd_pool_check(pool), PGD_OK);
    pgd_pool_destroy(pool);
    pgd_pool_destroy(NULL);
    T_EQ(p.kv_rotate, 0);
    T_EQ(p.key_bounds, 0);
    T_EQ(pgd_kv_type_size(PGD_KV_F32), 4);
    T_EQ(pgd_kv_type_size(PGD_KV_F16), 2);
    T_EQ(pgd_kv_type_size(PGD_KV_BF16), 2);
    T_EQ(pgd_kv_type_size(PGD_KV_Q8_0), 0); /* block types: see pgd_kv_bytes_per_token */
    T_EQ(pgd_kv_type_size(PGD_KV_Q4_0), 0);
    T_EQ(pgd_kv_type_size(PGD_KV_KIVI2), 0);
    T_EQ(pgd_kv_type_size((pgd_kv_type)99), 0);
    T_ASSERT(strcmp(pgd_kv_type_name(PGD_KV_F32), "f32") == 0);
    T_ASSERT(strcmp(pgd_kv_type_name(PGD_KV_F16), "f16") == 0);
    T_ASSERT(strcmp(pgd_kv_type_name(PGD_KV_BF16), "bf16") == 0);
    T_ASSERT(strcmp(pgd_kv_type_name(PGD_KV_Q8_0), "q8_0") == 0);
    T_ASSERT(strcmp(pgd_kv_type_name(PGD_KV_Q4_0), "q4_0") == 0);
    T_ASSERT(strcmp(pgd_kv_type_name(PGD_KV_KIVI2), "kivi2") == 0);
    T_ASSERT(strcmp(pgd_kv_type_name((pgd_kv_type)99), "?") == 0);
    pgd_kv_type t = PGD_KV_F32;
    T_OK(pgd_kv_type_parse("kivi2", &t));
    T_EQ(t, PGD_KV_KIVI2);
    T_EQ(pgd_kv_type_parse("F16", &t), PGD_EINVAL);
    T_EQ(t, PGD_KV_KIVI2);
    T_ASSERT(pgd_kv_bytes_per_token(PGD_KV_F16, 16, 1, 1, 64) == 256.0);
    T_ASSERT(pgd_kv_bytes_per_token(PGD_KV_Q8_0, 16, 2, 4, 64) == 2.0 * 2 * 4 * (64 + 4));
    return 0;
}

static int expect_einval(const pgd_pool_params *p, const char *what)
{
    pgd_pool *pool = (pgd_pool *)(uintptr_t)1; /* must be overwritten with NULL */
    int rc = pgd_pool_create(p, &pool);
    if (rc != PGD_EINVAL) {
        if (rc == PGD_OK) pgd_pool_destroy(pool);
        T_FAIL("%s: expected PGD_EINVAL, got %d", what, rc);
    }
    if (pool != NULL) T_FAIL("%s: *out not NULL on error", what);
    return 0;
}

static int test_params_einval(void)
{
    pgd_pool_params p;
    p = small_params(PGD_KV_F32, 8);
    p.n_layers = 0;
    if (expect_einval(&p, "n_layers 0")) return 1;
    p = small_params(PGD_KV_F32, 8);
    p.n_kv_heads = 0;
    if (expect_einval(&p, "n_kv_heads 0")) return 1;
    p = small_params(PGD_KV_F32, 8);
    p.head_dim = 0;
    if (expect_einval(&p, "head_dim 0")) return 1;
    p = small_params(PGD_KV_F32, 8);
    p.page_tokens = 0;
    if (expect_einval(&p, "page_tokens 0")) return 1;
    p = small_params(PGD_KV_F32, 8);
    p.page_tokens = 3;
    if (expect_einval(&p, "page_tokens 3")) return 1;
    p = small_params(PGD_KV_F32, 8);
    p.page_tokens = 24;
    if (expect_einval(&p, "page_tokens 24")) return 1;
    p = small_params(PGD_KV_F32, 8);
    p.kv_type = (pgd_kv_type)42;
    if (expect_einval(&p, "unknown kv type")) return 1;
    p = small_params(PGD_KV_Q8_0, 8); /* head_dim 5: neither a multiple nor a divisor of 32 */
    if (expect_einval(&p, "q8_0 head_dim 5")) return 1;
    p.head_dim = 8; /* 4 tokens * 8 = 32 values: one block, fine */
    p.kv_type = PGD_KV_Q4_0;
    p.page_tokens = 2; /* 16 values: not a whole block */
    if (expect_einval(&p, "q4_0 page of 16 values")) return 1;
    p = small_params(PGD_KV_KIVI2, 8);
    p.head_dim = 48;
    if (expect_einval(&p, "kivi2 head_dim 48")) return 1;
    p = small_params(PGD_KV_F16, 8);
    p.kv_rotate = 1; /* head_dim 5 is not a power of two */
    if (expect_einval(&p, "kv_rotate head_dim 5")) return 1;
    /* capacity below one page, in bytes (capacity_pages 0 means use bytes) */
    p = small_params(PGD_KV_F32, 0);
    p.capacity_bytes = 2ull * 3 * 2 * 5 * 4 * 4 - 1; /* regions of 80 bytes: no padding */
    if (expect_einval(&p, "capacity_bytes below one page")) return 1;
    p.capacity_bytes = 0;
    if (expect_einval(&p, "capacity_bytes 0")) return 1;
    p.metadata_only = 1;
    if (expect_einval(&p, "capacity_bytes 0, metadata-only")) return 1;
    /* above 2^31 pages */
    p = small_params(PGD_KV_F32, 0x80000001u);
    p.metadata_only = 1;
    if (expect_einval(&p, "capacity_pages 2^31+1")) return 1;
    p = small_params(PGD_KV_F32, UINT32_MAX);
    p.metadata_only = 1;
    if (expect_einval(&p, "capacity_pages 2^32-1")) return 1;
    /* page size overflows 64 bits */
    p = small_params(PGD_KV_F32, 1);
    p.n_layers = p.n_kv_heads = p.head_dim = 0x80000000u;
    p.page_tokens = 0x80000000u;
    if (expect_einval(&p, "page size overflow")) return 1;
    p.metadata_only = 1;
    if (expect_einval(&p, "page size overflow, metadata-only")) return 1;
    return 0;
}

/* ---- validation reasons ---- */

/* params_check gives EINVAL with a reason containing want, and create agrees. */
static int expect_reason(const pgd_pool_params *p, const char *want)
{
    char why[160];
    int rc = pgd_pool_params_check(p, why, sizeof why);
    if (rc != PGD_EINVAL) T_FAIL("%s: params_check returned %d", want, rc);
    if (!strstr(why, want)) T_FAIL("reason \"%s\" lacks \"%s\"", why, want);
    if (strchr(why, '\n')) T_FAIL("reason \"%s\" is not one line", why);
    return expect_einval(p, want);
}

static int test_params_check_reasons(void)
{
    pgd_pool_params p = pgd_pool_default_params();
    char why[160] = "junk";
    T_EQ(p.page_tokens, PGD_DEFAULT_PAGE_TOKENS);
    T_EQ(pgd_pool_params_check(&p, why, sizeof why), PGD_OK);
    T_EQ(why[0], 0);
    T_EQ(pgd_pool_params_check(&p, NULL, 0), PGD_OK);
    T_EQ(pgd_pool_params_check(NULL, why, sizeof why), PGD_EINVAL);
    p = small_params(PGD_KV_F32, 8);
    p.head_dim = 0;
    if (expect_reason(&p, "zero dimension")) return 1;
    p = small_params(PGD_KV_F32, 8);
    p.kv_type = (pgd_kv_type)42;
    if (expect_reason(&p, "unknown kv type 42")) return 1;
    p = small_params(PGD_KV_F32, 8);
    p.page_tokens = 24;
    if (expect_reason(&p, "page_tokens 24 is not a power of two")) return 1;
    /* rotation is reported before the block codecs' constraints (head_dim 48 fails both) */
    p = small_params(PGD_KV_Q8_0, 8);
    p.head_dim = 48;
    p.kv_rotate = 1;
    if (expect_reason(&p, "kv_rotate needs head_dim a power of two (head_dim is 48)")) return 1;
    p.kv_rotate = 0;
    if (expect_reason(&p, "kv type q8_0 needs head_dim a multiple of 32 or a divisor of 32"))
        return 1;
    p.kv_type = PGD_KV_KIVI2;
    if (expect_reason(&p, "kv type kivi2 needs head_dim a multiple of 32")) return 1;
    p = small_params(PGD_KV_Q4_0, 8);
    p.head_dim = 8;
    p.page_tokens = 2;
    if (expect_reason(&p, "kv type q4_0 needs page_tokens x head_dim a multiple of 32 "
                          "(page_tokens 2, head_dim 8)"))
        return 1;
    p = small_params(PGD_KV_F32, 0);
    p.capacity_bytes = 1;
    if (expect_reason(&p, "capacity of 0 pages is out of range")) return 1;
    p = small_params(PGD_KV_F32, 1);
    p.n_layers = p.n_kv_heads = p.head_dim = 0x80000000u;
    p.page_tokens = 0x80000000u;
    if (expect_reason(&p, "page_tokens x head_dim at most 2^31")) return 1;
    p = small_params(PGD_KV_F32, 8);
    p.arena_bytes = 4096;
    if (expect_reason(&p, "without an arena")) return 1;
    p.arena_bytes = 0;
    p.arena_device = 1;
    if (expect_reason(&p, "without an arena")) return 1;
    /* a short buffer truncates, NUL-terminated */
    p = small_params(PGD_KV_F32, 8);
    p.page_tokens = 3;
    memset(why, 'x', sizeof why);
    T_EQ(pgd_pool_params_check(&p, why, 8), PGD_EINVAL);
    T_EQ(strlen(why), 7);
    return 0;
}

/* ---- published layout ---- */

static float f16v(const uint8_t *b)
{
    return pgd__f16_to_f32((uint16_t)(b[0] | b[1] << 8));
}

/* Value (r, d) of the region at reg, decoded from layout.h's description alone. */
static float layout_value(const pgd_pool_layout *L, int kv, const uint8_t *reg, uint32_t r,
                          uint32_t d)
{
    const uint32_t hd = L->head_dim, pt = L->page_tokens;
    const size_t f = (size_t)r * hd + d, b = f / 32, i = f % 32;
    const uint8_t *e = reg + r * L->row_stride;
    uint32_t u;
    float x;
    switch (L->kv_type) {
    case PGD_KV_F32:
        u = (uint32_t)e[4 * d] | (uint32_t)e[4 * d + 1] << 8 | (uint32_t)e[4 * d + 2] << 16 |
            (uint32_t)e[4 * d + 3] << 24;
        memcpy(&x, &u, 4);
        return x;
    case PGD_KV_F16:
        return f16v(e + 2 * d);
    case PGD_KV_BF16:
        u = ((uint32_t)e[2 * d] | (uint32_t)e[2 * d + 1] << 8) << 16;
        memcpy(&x, &u, 4);
        return x;
    case PGD_KV_Q8_0:
        return (float)(int8_t)reg[f] * f16v(reg + L->k_scales_offset + 2 * b);
    case PGD_KV_Q4_0: {
        uint8_t byte = reg[16 * b + i % 16];
        int q = i < 16 ? byte & 15 : byte >> 4;
        return (float)(q - 8) * f16v(reg + L->k_scales_offset + 2 * b);
    }
    case PGD_KV_KIVI2: {
        const uint8_t *w = reg + 4 * (f / 16);
        uint32_t word =
            (uint32_t)w[0] | (uint32_t)w[1] << 8 | (uint32_t)w[2] << 16 | (uint32_t)w[3] << 24;
        float c = (float)((word >> (2 * (f % 16))) & 3);
        if (kv == 0)
            return f16v(reg + L->k_mins_offset + 2 * d) +
                   c * f16v(reg + L->k_scales_offset + 2 * d);
        uint32_t G = hd < 32 ? hd : 32, ng = hd / G;
        size_t gi = (size_t)r * ng + d / G;
        (void)pt;
        return f16v(reg + L->v_mins_offset + 2 * gi) + c * f16v(reg + L->v_scales_offset + 2 * gi);
    }
    }
    return NAN;
}

/* Fills every region of a pool through the codec, then checks that the layout's strides
 * give pgd_pool_k / pgd_pool_v's addresses and that decoding from the layout alone equals
 * the codec's decode_rows, value for value. */
static int check_layout(pgd_kv_type type, uint32_t page_tokens, uint32_t head_dim)
{
    enum { NP = 3 };
    pgd_pool_params p = small_params(type, NP);
    pgd_pool *pool;
    pgd_pool_layout L;
    uint64_t seed = 0x1234 + type * 977 + head_dim;
    p.page_tokens = page_tokens;
    p.head_dim = head_dim;
    T_OK(pgd_pool_create(&p, &pool));
    pgd_pool_get_layout(pool, &L);
    const pgd__codec *codec = pgd__pool_codec(pool);
    T_EQ(L.kv_type, type);
    T_EQ(L.n_pages, NP);
    T_EQ(L.n_layers, 3);
    T_EQ(L.n_kv_heads, 2);
    T_EQ(L.head_dim, head_dim);
    T_EQ(L.page_tokens, page_tokens);
    T_EQ(L.arena_device, 0);
    T_EQ(L.page_bytes, pgd_pool_page_bytes(pool));
    T_EQ(L.page_stride, L.page_bytes);
    T_EQ(L.region_bytes, pgd_pool_region_bytes(pool));
    T_EQ(L.head_stride, L.region_bytes);
    T_EQ(L.kv_stride, 2 * L.head_stride);
    T_EQ(L.layer_stride, 2 * L.kv_stride);
    T_EQ(L.page_bytes, 3 * L.layer_stride);
    T_EQ(L.region_bytes % 16, 0);
    T_EQ((uintptr_t)L.arena % 64, 0);
    T_EQ(L.row_stride, (uint64_t)head_dim * pgd_kv_type_size(type));
    const size_t n = (size_t)page_tokens * head_dim;
    float *rows = malloc(n * sizeof *rows), *dec = malloc(n * sizeof *dec);
    T_ASSERT(rows && dec);
    uint32_t ids[NP];
    for (uint32_t i = 0; i < NP; i++)
        T_OK(pgd_pool_alloc(pool, &ids[i]));
    for (uint32_t i = 0; i < NP; i++)
        for (uint32_t l = 0; l < 3; l++)
            for (int kv = 0; kv < 2; kv++)
                for (uint32_t h = 0; h < 2; h++) {
                    uint8_t *reg =
                        kv ? pgd_pool_v(pool, ids[i], l, h) : pgd_pool_k(pool, ids[i], l, h);
                    const uint8_t *at = (const uint8_t *)L.arena + ids[i] * L.page_stride +
                                        l * L.layer_stride + kv * L.kv_stride + h * L.head_stride;
                    if (reg != at) T_FAIL("page %u layer %u kv %d head %u: address", i, l, kv, h);
                    for (size_t j = 0; j < n; j++)
                        rows[j] = (float)((int64_t)(t_rand(&seed) % 2001) - 1000) / 64.0f;
                    codec->encode_page(kv ? PGD__V : PGD__K, reg, page_tokens, head_dim, rows,
                                       page_tokens);
                }
    for (uint32_t i = 0; i < NP; i++)
        for (uint32_t l = 0; l < 3; l++)
            for (int kv = 0; kv < 2; kv++)
                for (uint32_t h = 0; h < 2; h++) {
                    const uint8_t *at = (const uint8_t *)L.arena + ids[i] * L.page_stride +
                                        l * L.layer_stride + kv * L.kv_stride + h * L.head_stride;
                    codec->decode_rows(kv ? PGD__V : PGD__K, at, page_tokens, head_dim, 0,
                                       page_tokens, dec);
                    for (uint32_t r = 0; r < page_tokens; r++)
                        for (uint32_t d = 0; d < head_dim; d++) {
                            float want = dec[(size_t)r * head_dim + d];
                            float got = layout_value(&L, kv, at, r, d);
                            if (!(fabsf(got - want) <= 1e-6f * (1 + fabsf(want))))
                                T_FAIL("%s pt %u hd %u: page %u layer %u kv %d head %u row %u "
                                       "d %u: layout %g, codec %g",
                                       pgd_kv_type_name(type), page_tokens, head_dim, i, l, kv, h,
                                       r, d, got, want);
                        }
                }
    T_EQ(pgd_pool_check(pool), PGD_OK);
    free(rows);
    free(dec);
    pgd_pool_destroy(pool);
    return 0;
}

static int test_layout(void)
{
    static const pgd_kv_type plain[] = {PGD_KV_F32, PGD_KV_F16, PGD_KV_BF16};
    static const pgd_kv_type block[] = {PGD_KV_Q8_0, PGD_KV_Q4_0, PGD_KV_KIVI2};
    for (int t = 0; t < 3; t++) {
        if (check_layout(plain[t], 4, 5)) return 1;
        if (check_layout(plain[t], 16, 64)) return 1;
    }
    for (int t = 0; t < 3; t++) {
        if (check_layout(block[t], 16, 64)) return 1; /* blocks along a row */
        if (check_layout(block[t], 4, 96)) return 1;
        if (check_layout(block[t], 16, 8)) return 1; /* blocks across 4 rows */
        if (check_layout(block[t], 32, 2)) return 1;
    }
    /* metadata-only: no arena */
    pgd_pool_params p = small_params(PGD_KV_F16, 4);
    pgd_pool *pool;
    pgd_pool_layout L;
    p.metadata_only = 1;
    T_OK(pgd_pool_create(&p, &pool));
    pgd_pool_get_layout(pool, &L);
    T_ASSERT(L.arena == NULL);
    T_EQ(L.page_bytes, pgd_pool_page_bytes(pool));
    pgd_pool_destroy(pool);
    return 0;
}

/* ---- caller-owned arenas ---- */

typedef struct copy_counter {
    uint64_t n_calls, n_bytes;
    int fail;   /* return this instead of copying when non-zero */
    int device; /* do not touch the (PROT_NONE) memory */
} copy_counter;

static int count_copy(void *ud, void *dst, const void *src, uint64_t n_bytes)
{
    copy_counter *cc = ud;
    if (cc->fail) return cc->fail;
    cc->n_calls++;
    cc->n_bytes += n_bytes;
    if (!cc->device) memcpy(dst, src, n_bytes);
    return PGD_OK;
}

static int test_arena_host(void)
{
    pgd_pool_params p = small_params(PGD_KV_F32, 0);
    pgd_pool *pool;
    pgd_pool_stats st, st2;
    copy_counter cc = {0, 0, 0, 0};
    const uint64_t pb = 2ull * 3 * 2 * 80;  /* regions of 4 x 5 floats: 80 bytes */
    const uint64_t bytes = 5 * pb + pb / 2; /* 5.5 pages */
    uint8_t *arena = aligned_alloc(64, (size_t)(6 * pb));
    T_ASSERT(arena);
    p.arena = arena;
    p.arena_bytes = bytes;
    p.capacity_bytes = 1; /* ignored with an arena */
    p.copy_page = count_copy;
    p.copy_ud = &cc;
    T_OK(pgd_pool_create(&p, &pool));
    T_EQ(pgd_pool_page_bytes(pool), pb);
    T_EQ(pgd_pool_n_pages(pool), 5);
    T_EQ(pgd_pool_has_payload(pool), 1);
    pgd_pool_get_stats(pool, &st);
    T_EQ(st.arena_bytes, 5 * pb);
    uint32_t a, b;
    T_OK(pgd_pool_alloc(pool, &a));
    T_ASSERT(pgd_pool_page_data(pool, a) == arena + a * pb);
    T_ASSERT((uint8_t *)pgd_pool_v(pool, a, 2, 1) == arena + a * pb + ((2 * 2 + 1) * 2 + 1) * 80);
    for (uint64_t i = 0; i < pb; i++)
        arena[a * pb + i] = (uint8_t)(i * 7 + 3);
    /* copy-on-write goes through the hook */
    pgd_pool_ref(pool, a);
    b = a;
    T_EQ(pgd_pool_cow(pool, &b), 1);
    T_EQ(cc.n_calls, 1);
    T_EQ(cc.n_bytes, pb);
    T_ASSERT(memcmp(arena + a * pb, arena + b * pb, pb) == 0);
    T_EQ(pgd_pool_check(pool), PGD_OK);
    /* a failing hook: its status comes back, nothing changed */
    pgd_pool_ref(pool, a);
    pgd_pool_get_stats(pool, &st);
    cc.fail = PGD_EIO;
    uint32_t x = a;
    T_EQ(pgd_pool_cow(pool, &x), PGD_EIO);
    T_EQ(x, a);
    T_EQ(pgd_pool_refcount(pool, a), 2);
    pgd_pool_get_stats(pool, &st2);
    T_ASSERT(memcmp(&st, &st2, sizeof st) == 0);
    T_EQ(pgd_pool_check(pool), PGD_OK);
    cc.fail = 1; /* positive: PGD_EIO */
    T_EQ(pgd_pool_cow(pool, &x), PGD_EIO);
    cc.fail = 0;
    T_EQ(pgd_pool_cow(pool, &x), 1);
    T_EQ(cc.n_calls, 2);
    T_EQ(pgd_pool_check(pool), PGD_OK);
    pgd_pool_destroy(pool); /* leaves the arena alone */
    T_EQ(arena[a * pb + 1], 10);

    /* capacity_pages that fit the arena */
    p.capacity_pages = 3;
    T_OK(pgd_pool_create(&p, &pool));
    T_EQ(pgd_pool_n_pages(pool), 3);
    pgd_pool_destroy(pool);
    /* no hook: memcpy */
    p.copy_page = NULL;
    T_OK(pgd_pool_create(&p, &pool));
    T_OK(pgd_pool_alloc(pool, &a));
    memset(arena + a * pb, 0x5a, pb);
    pgd_pool_ref(pool, a);
    b = a;
    T_EQ(pgd_pool_cow(pool, &b), 1);
    T_ASSERT(memcmp(arena + a * pb, arena + b * pb, pb) == 0);
    pgd_pool_destroy(pool);
    free(arena);
    return 0;
}

static int test_arena_too_small(void)
{
    pgd_pool_params p = small_params(PGD_KV_F32, 0);
    const uint64_t pb = 2ull * 3 * 2 * 80;
    uint8_t *arena = aligned_alloc(64, (size_t)(4 * pb));
    T_ASSERT(arena);
    p.arena = arena;
    p.arena_bytes = pb - 1;
    if (expect_reason(&p, "below one page")) return 1;
    p.arena_bytes = 0;
    if (expect_reason(&p, "below one page")) return 1;
    p.arena_bytes = 4 * pb;
    p.capacity_pages = 5;
    if (expect_reason(&p, "below capacity_pages 5")) return 1;
    p.capacity_pages = 4; /* exactly fits */
    T_EQ(pgd_pool_params_check(&p, NULL, 0), PGD_OK);
    p.arena = arena + 16;
    p.arena_bytes = 3 * pb;
    p.capacity_pages = 0;
    if (expect_reason(&p, "not 64-byte aligned")) return 1;
    p.arena = arena;
    p.metadata_only = 1;
    if (expect_reason(&p, "metadata_only with an arena")) return 1;
    p.metadata_only = 0;
    p.arena_device = 1; /* without copy_page */
    if (expect_reason(&p, "device arena needs copy_page")) return 1;
    p.copy_page = count_copy;
    p.key_bounds = 1;
    if (expect_reason(&p, "key_bounds needs a host arena")) return 1;
    free(arena);
    return 0;
}

/* A device arena stands in as PROT_NONE memory: any host access would crash the test. */
static int test_arena_device(void)
{
    enum { PT = 4, NPAGES = 8 };
    copy_counter cc = {0, 0, 0, 1};
    pgd_cache_params cp = pgd_cache_default_params();
    cp.pool.n_layers = 2;
    cp.pool.n_kv_heads = 1;
    cp.pool.head_dim = 8;
    cp.pool.page_tokens = PT;
    cp.pool.kv_type = PGD_KV_F16;
    const uint64_t pb = 2ull * 2 * 1 * PT * 8 * 2;
    const size_t map = (size_t)(NPAGES * pb + 4096);
    void *dev = mmap(NULL, map, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    T_ASSERT(dev != MAP_FAILED);
    cp.pool.arena = dev;
    cp.pool.arena_bytes = NPAGES * pb;
    cp.pool.arena_device = 1;
    cp.pool.copy_page = count_copy;
    cp.pool.copy_ud = &cc;
    pgd_cache *c;
    pgd_seq *s, *f;
    T_OK(pgd_cache_create(&cp, &c));
    pgd_pool *pool = pgd_cache_pool(c);
    pgd_pool_layout L;
    pgd_pool_get_layout(pool, &L);
    T_EQ(L.arena_device, 1);
    T_ASSERT(L.arena == dev);
    T_EQ(L.n_pages, NPAGES);
    T_EQ(L.page_bytes, pb);
    T_EQ(pgd_pool_has_payload(pool), 1);
    T_EQ(pgd_cache_kv_residual(c), 0);
    T_OK(pgd_seq_create(c, NULL, 0, &s));
    T_EQ(pgd_seq_grow(c, s, 6), PGD_OK);
    /* host encoding refuses */
    float k[2 * 8] = {0}, v[2 * 8] = {0};
    T_EQ(pgd_seq_write_kv(c, s, 0, 2, 0, k, v), PGD_EINVAL);
    /* the engine writes rows itself at write_slot's addresses; forking shares the partial
     * page, and the next write_slot copies it through the hook */
    uint32_t page, slot, page2;
    T_OK(pgd_seq_write_slot(c, s, 5, &page, &slot));
    T_EQ(slot, 1);
    T_ASSERT((uint8_t *)pgd_pool_k(pool, page, 1, 0) ==
             (uint8_t *)dev + page * L.page_stride + L.layer_stride);
    static const int32_t toks[4] = {1, 2, 3, 4};
    T_EQ(pgd_seq_commit(c, s, toks, 4), 1);
    T_OK(pgd_seq_fork(c, s, &f));
    T_EQ(cc.n_calls, 0);
    T_OK(pgd_seq_write_slot(c, f, 5, &page2, &slot));
    T_ASSERT(page2 != page);
    T_EQ(cc.n_calls, 1);
    T_EQ(cc.n_bytes, pb);
    pgd_cache_stats st;
    pgd_cache_get_stats(c, &st);
    T_EQ(st.n_cow_copies, cc.n_calls);
    /* the library's (host) attention refuses too */
    pgd_attn *at = (pgd_attn *)(uintptr_t)1;
    pgd_attn_params ap = pgd_attn_default_params();
    T_EQ(pgd_attn_create(c, &ap, &at), PGD_EINVAL);
    T_ASSERT(at == NULL);
    T_EQ(pgd_cache_check(c), PGD_OK);
    T_EQ(pgd_pool_check(pool), PGD_OK);
    pgd_seq_destroy(c, f);
    pgd_seq_destroy(c, s);
    pgd_cache_destroy(c);
    munmap(dev, map);
    return 0;
}

/* pgd_cache_kv_residual: the window kivi2 keeps in f16, whole pages; 0 for other codecs. */
static int test_kv_residual(void)
{
    static const struct {
        pgd_kv_type type;
        uint32_t pt, asked, want;
    } cases[] = {
        {PGD_KV_KIVI2, 16, 0, 128},  {PGD_KV_KIVI2, 16, 20, 32}, {PGD_KV_KIVI2, 16, 1, 16},
        {PGD_KV_KIVI2, 256, 0, 256}, {PGD_KV_KIVI2, 32, 64, 64}, {PGD_KV_F16, 16, 0, 0},
        {PGD_KV_Q8_0, 16, 64, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pgd_cache_params cp = pgd_cache_default_params();
        pgd_cache *c;
        cp.pool.kv_type = cases[i].type;
        cp.pool.page_tokens = cases[i].pt;
        cp.pool.capacity_pages = 4;
        cp.kv_residual = cases[i].asked;
        T_OK(pgd_cache_create(&cp, &c));
        T_EQ(pgd_cache_kv_residual(c), cases[i].want);
        pgd_cache_destroy(c);
    }
    return 0;
}

/* ---- geometry and layout ---- */

static int check_geometry(pgd_kv_type type, size_t elt)
{
    pgd_pool_params p = small_params(type, 0);
    /* A region (page, layer, K|V, head) is padded to a multiple of 16 bytes. */
    size_t rows = ((size_t)4 * 5 * elt + 15) / 16 * 16;
    uint64_t page_bytes = 2ull * 3 * 2 * rows;
    pgd_pool *pool = NULL;
    pgd_pool_stats st;
    p.capacity_bytes = page_bytes * 7 + page_bytes / 2; /* 7.5 pages -> 7 */
    T_OK(pgd_pool_create(&p, &pool));
    T_EQ(pgd_pool_page_bytes(pool), page_bytes);
    T_EQ(pgd_pool_token_bytes(pool), page_bytes / 4);
    T_EQ(pgd_pool_n_pages(pool), 7);
    T_EQ(pgd_pool_page_tokens(pool), 4);
    T_EQ(pgd_pool_kv_type(pool), type);
    T_EQ(pgd_pool_has_payload(pool), 1);
    pgd_pool_get_stats(pool, &st);
    T_EQ(st.n_pages_total, 7);
    T_EQ(st.n_pages_free, 7);
    T_EQ(st.n_pages_used, 0);
    T_EQ(st.page_bytes, page_bytes);
    T_ASSERT(st.arena_bytes >= 7 * page_bytes);
    T_EQ(st.n_cow_copies, 0);

    /* Layout [layer][K|V][kv_head][page_tokens][head_dim]. */
    uint32_t id;
    T_OK(pgd_pool_alloc(pool, &id));
    uint8_t *base = pgd_pool_page_data(pool, id);
    T_ASSERT(base != NULL);
    for (uint32_t l = 0; l < 3; l++) {
        for (uint32_t h = 0; h < 2; h++) {
            uint8_t *k = pgd_pool_k(pool, id, l, h);
            uint8_t *v = pgd_pool_v(pool, id, l, h);
            T_ASSERT(k && v && k != v);
            T_EQ(k - base, (ptrdiff_t)(((l * 2 + 0) * 2 + h) * rows));
            T_EQ(v - base, (ptrdiff_t)(((l * 2 + 1) * 2 + h) * rows));
            T_ASSERT(k + rows <= base + page_bytes && v + rows <= base + page_bytes);
        }
    }
    /* Pages do not overlap: fill every page with its own byte and read it back. */
    uint32_t ids[7];
    ids[0] = id;
    for (int i = 1; i < 7; i++)
        T_OK(pgd_pool_alloc(pool, &ids[i]));
    for (int i = 0; i < 7; i++)
        memset(pgd_pool_page_data(pool, ids[i]), 0x10 + i, page_bytes);
    for (int i = 0; i < 7; i++) {
        uint8_t *d = pgd_pool_page_data(pool, ids[i]);
        for (uint64_t b = 0; b < page_bytes; b++)
            if (d[b] != 0x10 + i) T_FAIL("page %d byte %" PRIu64 " clobbered", i, b);
    }
    T_EQ(pgd_pool_check(pool), PGD_OK);
    pgd_pool_destroy(pool); /* pages still referenced are released too */
    return 0;
}

static int test_geometry_f32(void)
{
    return check_geometry(PGD_KV_F32, 4);
}

static int test_geometry_bf16(void)
{
    return check_geometry(PGD_KV_BF16, 2);
}

/* Block types: region sizes of the codecs, page = 2 * layers * heads * region. */
static int test_geometry_block_types(void)
{
    static const pgd_kv_type types[] = {PGD_KV_Q8_0, PGD_KV_Q4_0, PGD_KV_KIVI2};
    /* head_dim 64, 16 tokens: q8_0 1024 codes + 64 scale bytes; q4_0 512 + 64;
     * kivi2 max(K 256 + 256, V 256 + 16 * 2 * 4). */
    static const uint64_t region[] = {1088, 576, 512};
    for (int i = 0; i < 3; i++) {
        pgd_pool_params p = small_params(types[i], 3);
        pgd_pool *pool = NULL;
        p.head_dim = 64;
        p.page_tokens = 16;
        T_OK(pgd_pool_create(&p, &pool));
        T_EQ(pgd_pool_region_bytes(pool), region[i]);
        T_EQ(pgd_pool_page_bytes(pool), 2ull * 3 * 2 * region[i]);
        T_EQ(pgd_pool_token_bytes(pool), 2ull * 3 * 2 * region[i] / 16);
        uint32_t id;
        T_OK(pgd_pool_alloc(pool, &id));
        uint8_t *base = pgd_pool_page_data(pool, id);
        T_EQ((uint8_t *)pgd_pool_v(pool, id, 2, 1) - base,
             (ptrdiff_t)(((2 * 2 + 1) * 2 + 1) * region[i]));
        T_EQ(((uintptr_t)pgd_pool_k(pool, id, 1, 1)) % 16, 0);
        T_EQ(pgd_pool_check(pool), PGD_OK);
        pgd_pool_destroy(pool);
    }
    return 0;
}

static int test_geometry_f16(void)
{
    return check_geometry(PGD_KV_F16, 2);
}

static int test_capacity_pages_overrides_bytes(void)
{
    pgd_pool_params p = small_params(PGD_KV_F16, 3);
    p.capacity_bytes = 1; /* ignored */
    pgd_pool *pool;
    T_OK(pgd_pool_create(&p, &pool));
    T_EQ(pgd_pool_n_pages(pool), 3);
    pgd_pool_destroy(pool);
    return 0;
}

/* ---- alloc / ref / unref ---- */

static int test_alloc_until_enospc(void)
{
    enum { N = 16 };
    pgd_pool_params p = small_params(PGD_KV_F32, N);
    pgd_pool *pool;
    pgd_pool_stats st;
    uint32_t ids[N], extra = 12345;
    unsigned char seen[N] = {0};
    T_OK(pgd_pool_create(&p, &pool));
    for (int i = 0; i < N; i++) {
        T_EQ(pgd_pool_alloc(pool, &ids[i]), PGD_OK);
        T_ASSERT(ids[i] < N);
        T_ASSERT(!seen[ids[i]]);
        seen[ids[i]] = 1;
        T_EQ(pgd_pool_refcount(pool, ids[i]), 1);
        T_EQ(pgd_pool_check(pool), PGD_OK);
        pgd_pool_get_stats(pool, &st);
        T_EQ(st.n_pages_used, i + 1);
        T_EQ(st.n_pages_free, N - i - 1);
    }
    T_EQ(pgd_pool_alloc(pool, &extra), PGD_ENOSPC);
    T_EQ(pgd_pool_check(pool), PGD_OK);
    pgd_pool_get_stats(pool, &st);
    T_EQ(st.n_pages_free, 0);
    T_EQ(st.n_pages_used, N);

    /* ref / unref: the page returns to the free list at zero, and is reused. */
    pgd_pool_ref(pool, ids[3]);
    T_EQ(pgd_pool_refcount(pool, ids[3]), 2);
    T_EQ(pgd_pool_check(pool), PGD_OK);
    T_EQ(pgd_pool_unref(pool, ids[3]), 1);
    T_EQ(pgd_pool_check(pool), PGD_OK);
    T_EQ(pgd_pool_alloc(pool, &extra), PGD_ENOSPC);
    T_EQ(pgd_pool_unref(pool, ids[3]), 0);
    T_EQ(pgd_pool_refcount(pool, ids[3]), 0);
    T_EQ(pgd_pool_check(pool), PGD_OK);
    pgd_pool_get_stats(pool, &st);
    T_EQ(st.n_pages_free, 1);
    T_EQ(st.n_pages_used, N - 1);
    T_EQ(pgd_pool_alloc(pool, &extra), PGD_OK);
    T_EQ(extra, ids[3]);
    T_EQ(pgd_pool_refcount(pool, extra), 1);
    T_EQ(pgd_pool_check(pool), PGD_OK);

    /* Free everything; all pages can be allocated again. */
    for (int i = 0; i < N; i++) {
        T_EQ(pgd_pool_unref(pool, ids[i]), 0);
        T_EQ(pgd_pool_check(pool), PGD_OK);
    }
    pgd_pool_get_stats(pool, &st);
    T_EQ(st.n_pages_free, N);
    T_EQ(st.n_pages_used, 0);
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < N; i++) {
        T_EQ(pgd_pool_alloc(pool, &ids[i]), PGD_OK);
        T_ASSERT(ids[i] < N && !seen[ids[i]]);
        seen[ids[i]] = 1;
    }
    T_EQ(pgd_pool_alloc(pool, &extra), PGD_ENOSPC);
    T_EQ(pgd_pool_check(pool), PGD_OK);
    pgd_pool_destroy(pool);
    return 0;
}

/* Random ref/unref/alloc against a refcount model. */
static int test_random_refcounts(void)
{
    enum { N = 32 };
    pgd_pool_params p = small_params(PGD_KV_F16, N);
    pgd_pool *pool;
    uint32_t model[N] = {0};
    uint64_t seed = 0x5eed;
    T_OK(pgd_pool_create(&p, &pool));
    for (int step = 0; step < 20000; step++) {
        uint32_t r = (uint32_t)(t_rand(&seed) % 3), id = (uint32_t)(t_rand(&seed) % N);
        uint32_t n_free = 0;
        for (int i = 0; i < N; i++)
            n_free += model[i] == 0;
        if (r == 0) {
            uint32_t got;
            int rc = pgd_pool_alloc(pool, &got);
            if (n_free == 0) {
                T_EQ(rc, PGD_ENOSPC);
            } else {
                T_EQ(rc, PGD_OK);
                T_ASSERT(got < N);
                T_EQ(model[got], 0);
                model[got] = 1;
            }
        } else if (model[id] == 0) {
            continue;
        } else if (r == 1) {
            pgd_pool_ref(pool, id);
            model[id]++;
        } else {
            T_EQ(pgd_pool_unref(pool, id), --model[id]);
        }
        T_EQ(pgd_pool_check(pool), PGD_OK);
        for (int i = 0; i < N; i++)
            T_EQ(pgd_pool_refcount(pool, (uint32_t)i), model[i]);
    }
    pgd_pool_stats st;
    pgd_pool_get_stats(pool, &st);
    uint32_t used = 0;
    for (int i = 0; i < N; i++)
        used += model[i] > 0;
    T_EQ(st.n_pages_used, used);
    T_EQ(st.n_pages_free, N - used);
    pgd_pool_destroy(pool);
    return 0;
}

/* ---- copy-on-write ---- */

static int test_cow(void)
{
    enum { N = 4 };
    pgd_pool_params p = small_params(PGD_KV_F32, N);
    pgd_pool *pool;
    pgd_pool_stats st, st2;
    uint32_t a, b, c, d, orig;
    T_OK(pgd_pool_create(&p, &pool));
    uint64_t pb = pgd_pool_page_bytes(pool);
    uint8_t *expect = malloc(pb);
    T_ASSERT(expect);
    T_OK(pgd_pool_alloc(pool, &a));
    for (uint64_t i = 0; i < pb; i++)
        expect[i] = (uint8_t)(i * 131 + 7);
    memcpy(pgd_pool_page_data(pool, a), expect, pb);

    /* Private page: no copy. */
    orig = a;
    T_EQ(pgd_pool_cow(pool, &a), 0);
    T_EQ(a, orig);
    T_EQ(pgd_pool_refcount(pool, a), 1);
    T_EQ(pgd_pool_check(pool), PGD_OK);
    pgd_pool_get_stats(pool, &st);
    T_EQ(st.n_cow_copies, 0);

    /* Shared page: copy, exact bytes, one reference moves to the copy. */
    pgd_pool_ref(pool, a);
    b = a;
    T_EQ(pgd_pool_cow(pool, &b), 1);
    T_ASSERT(b != a);
    T_ASSERT(b < N);
    T_EQ(pgd_pool_refcount(pool, a), 1);
    T_EQ(pgd_pool_refcount(pool, b), 1);
    T_EQ(pgd_pool_check(pool), PGD_OK);
    T_ASSERT(memcmp(pgd_pool_page_data(pool, b), expect, pb) == 0);
    T_ASSERT(memcmp(pgd_pool_page_data(pool, a), expect, pb) == 0);
    pgd_pool_get_stats(pool, &st);
    T_EQ(st.n_cow_copies, 1);
    T_EQ(st.n_pages_used, 2);
    /* The copy is independent. */
    memset(pgd_pool_page_data(pool, b), 0xEE, pb);
    T_ASSERT(memcmp(pgd_pool_page_data(pool, a), expect, pb) == 0);

    /* ENOSPC: nothing changes. */
    T_OK(pgd_pool_alloc(pool, &c));
    T_OK(pgd_pool_alloc(pool, &d));
    pgd_pool_ref(pool, a);
    pgd_pool_ref(pool, a); /* refcount 3 */
    pgd_pool_get_stats(pool, &st);
    orig = a;
    T_EQ(pgd_pool_cow(pool, &a), PGD_ENOSPC);
    T_EQ(a, orig);
    T_EQ(pgd_pool_refcount(pool, a), 3);
    pgd_pool_get_stats(pool, &st2);
    T_ASSERT(memcmp(&st, &st2, sizeof st) == 0);
    T_ASSERT(memcmp(pgd_pool_page_data(pool, a), expect, pb) == 0);
    T_EQ(pgd_pool_check(pool), PGD_OK);

    /* Free one, cow from refcount 3 -> 2 + 1. */
    T_EQ(pgd_pool_unref(pool, d), 0);
    T_EQ(pgd_pool_cow(pool, &a), 1);
    T_EQ(a, d);
    T_EQ(pgd_pool_refcount(pool, orig), 2);
    T_EQ(pgd_pool_refcount(pool, a), 1);
    T_ASSERT(memcmp(pgd_pool_page_data(pool, a), expect, pb) == 0);
    T_EQ(pgd_pool_check(pool), PGD_OK);
    (void)c;
    free(expect);
    pgd_pool_destroy(pool);
    return 0;
}

/* ---- metadata-only ---- */

static int test_metadata_only_million_pages(void)
{
    enum { N = 1u << 20 };
    pgd_pool_params p = pgd_pool_default_params();
    pgd_pool *pool;
    pgd_pool_stats st;
    p.metadata_only = 1;
    p.n_layers = 80;
    p.n_kv_heads = 8;
    p.head_dim = 128;
    p.page_tokens = 16; /* 1M pages of 16 tokens: 16M tokens, 5 MiB of K/V per page */
    p.capacity_pages = N;
    T_OK(pgd_pool_create(&p, &pool));
    T_EQ(pgd_pool_has_payload(pool), 0);
    T_EQ(pgd_pool_n_pages(pool), N);
    pgd_pool_get_stats(pool, &st);
    T_EQ(st.arena_bytes, 0);
    T_EQ(st.n_pages_total, N);
    T_EQ(st.n_pages_free, N);
    T_ASSERT(st.metadata_bytes > 0);
    T_ASSERT(st.metadata_bytes <= 64ull * N); /* host memory stays sane */
    uint32_t *ids = malloc(sizeof *ids * N);
    unsigned char *seen = calloc(N, 1);
    T_ASSERT(ids && seen);
    for (uint32_t i = 0; i < N; i++) {
        if (pgd_pool_alloc(pool, &ids[i]) != PGD_OK) T_FAIL("alloc %u failed", i);
        if (ids[i] >= N || seen[ids[i]]) T_FAIL("bad id %u at %u", ids[i], i);
        seen[ids[i]] = 1;
    }
    uint32_t x;
    T_EQ(pgd_pool_alloc(pool, &x), PGD_ENOSPC);
    T_ASSERT(pgd_pool_k(pool, ids[0], 0, 0) == NULL);
    T_ASSERT(pgd_pool_v(pool, ids[0], 79, 7) == NULL);
    T_ASSERT(pgd_pool_page_data(pool, ids[0]) == NULL);
    T_EQ(pgd_pool_check(pool), PGD_OK);
    /* cow works without payload */
    T_EQ(pgd_pool_unref(pool, ids[N - 1]), 0);
    pgd_pool_ref(pool, ids[0]);
    x = ids[0];
    T_EQ(pgd_pool_cow(pool, &x), 1);
    T_EQ(x, ids[N - 1]);
    T_EQ(pgd_pool_refcount(pool, ids[0]), 1);
    pgd_pool_get_stats(pool, &st);
    T_EQ(st.n_cow_copies, 1);
    T_EQ(st.n_pages_free, 0);
    for (uint32_t i = 0; i < N; i++)
        pgd_pool_unref(pool, ids[i]);
    pgd_pool_get_stats(pool, &st);
    T_EQ(st.n_pages_free, N);
    T_EQ(st.n_pages_used, 0);
    T_EQ(pgd_pool_check(pool), PGD_OK);
    free(ids);
    free(seen);
    pgd_pool_destroy(pool);
    return 0;
}

int main(void)
{
    T_RUN(test_defaults);
    T_RUN(test_params_einval);
    T_RUN(test_params_check_reasons);
    T_RUN(test_layout);
    T_RUN(test_arena_host);
    T_RUN(test_arena_too_small);
    T_RUN(test_arena_device);
    T_RUN(test_kv_residual);
    T_RUN(test_geometry_f32);
    T_RUN(test_geometry_f16);
    T_RUN(test_geometry_bf16);
    T_RUN(test_geometry_block_types);
    T_RUN(test_capacity_pages_overrides_bytes);
    T_RUN(test_alloc_until_enospc);
    T_RUN(test_random_refcounts);
    T_RUN(test_cow);
    T_RUN(test_metadata_only_million_pages);
    T_DONE();
}
