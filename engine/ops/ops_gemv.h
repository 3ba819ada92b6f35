/* SPDX-License-Identifier: MIT */
/*
 * ops_gemv.h - the GEMV tile driver that ops_avx2.c and ops_avx512.c share: the table of
 * tile functions per weight type and the walk over rows and tokens that calls them.
 *
 * A template, not an ordinary header: each ISA file includes it (ops_avx2.c twice, the second
 * time with GEMV_SFX and GEMV_QTILE set, see below), after it has defined
 *   TGT          its target attribute (every function here is compiled for that ISA)
 *   GEMV_TILE_T  tokens per tile, 2 (AVX2) or 4 (AVX-512)
 *   q_tile(m, row, rs, r, rstep, t, q4, R, T) and f_tile(..., type, R, T), its tile bodies
 * and it defines, static in that file: tile_fn, the q8/q4/f32/f16/bf16 tile tables, walk()
 * and gemv(m, r0, r1, t0, t1), which computes y[t][r] for rows [r0, r1) and tokens [t0, t1).
 * So each file keeps its own code generation (the same functions, attributes and inlining
 * as when each file carried its own copy), while the driver exists once.
 *
 * Invariant: gemv() handles every type pe__type_is_quant() or the float paths accept;
 * any other type is a caller bug (PE_UNREACHABLE_TYPE).
 */
#if !defined(TGT) || !defined(GEMV_TILE_T)
#error "ops_gemv.h: define TGT and GEMV_TILE_T (and q_tile, f_tile) before including it"
#endif

/* GEMV_SFX (default none) suffixes every name defined here, so that a file can include this
 * twice (ops_avx2.c: gemv, and gemv_vnni with TGT and GEMV_QTILE for AVX-VNNI); GEMV_QTILE
 * (default q_tile) is the quantized tile body. */
#ifndef GEMV_SFX
#define GEMV_SFX
#endif
#ifndef GEMV_QTILE
#define GEMV_QTILE q_tile
#endif
#define GEMV_CAT2(a, b) a##b
#define GEMV_CAT(a, b) GEMV_CAT2(a, b)
#define GN(x) GEMV_CAT(x, GEMV_SFX)

/* Each (type, R, T) tile is a function of its own: inlined into one big driver they
 * shared a register allocation that parked pointers in vector registers, adding uops to
 * the hot loops. R is 4 (then 1 for the last rows), T 1..GEMV_TILE_T. On AVX2, of 2x3, 3x3,
 * 4x2 and 4x3 tiles, 4x2 was fastest (q8_0 prefill 45 GFLOP/s vs 33-43; decode also best
 * with 4 rows). */
#ifndef PE_OPS_GEMV_TILE_FN
#define PE_OPS_GEMV_TILE_FN
typedef void (*tile_fn)(const pe_mm *m, const uint8_t *row, size_t rs, uint32_t r, uint32_t rstep,
                        uint32_t t);
#endif

#define TILE_FN(name, call)                                                                        \
    TGT __attribute__((noinline)) static void name(const pe_mm *m, const uint8_t *row, size_t rs,  \
                                                   uint32_t r, uint32_t rstep, uint32_t t)         \
    {                                                                                              \
        call;                                                                                      \
    }

#define Q8_TILE(R, T) GEMV_QTILE(m, row, rs, r, rstep, t, 0, R, T)
#define Q4_TILE(R, T) GEMV_QTILE(m, row, rs, r, rstep, t, 1, R, T)
#define F32_TILE(R, T) f_tile(m, row, rs, r, rstep, t, PE_GGML_TYPE_F32, R, T)
#define F16_TILE(R, T) f_tile(m, row, rs, r, rstep, t, PE_GGML_TYPE_F16, R, T)
#define BF16_TILE(R, T) f_tile(m, row, rs, r, rstep, t, PE_GGML_TYPE_BF16, R, T)

/* The tiles of one type (pfx_R_T) and their table pfx_tiles[R == 4 ? 0 : 1][T - 1]. */
#if GEMV_TILE_T == 2
#define TILE_SET(pfx, TILE)                                                                        \
    TILE_FN(GN(pfx##_4_1), TILE(4, 1))                                                             \
    TILE_FN(GN(pfx##_4_2), TILE(4, 2))                                                             \
    TILE_FN(GN(pfx##_1_1), TILE(1, 1))                                                             \
    TILE_FN(GN(pfx##_1_2), TILE(1, 2))                                                             \
    static const tile_fn GN(pfx##_tiles)[2][2] = {{GN(pfx##_4_1), GN(pfx##_4_2)},                  \
                                                  {GN(pfx##_1_1), GN(pfx##_1_2)}};
#elif GEMV_TILE_T == 4
#define TILE_SET(pfx, TILE)                                                                        \
    TILE_FN(GN(pfx##_4_1), TILE(4, 1))                                                             \
    TILE_FN(GN(pfx##_4_2), TILE(4, 2))                                                             \
    TILE_FN(GN(pfx##_4_3), TILE(4, 3))                                                             \
    TILE_FN(GN(pfx##_4_4), TILE(4, 4))                                                             \
    TILE_FN(GN(pfx##_1_1), TILE(1, 1))                                                             \
    TILE_FN(GN(pfx##_1_2), TILE(1, 2))                                                             \
    TILE_FN(GN(pfx##_1_3), TILE(1, 3))                                                             \
    TILE_FN(GN(pfx##_1_4), TILE(1, 4))                                                             \
    static const tile_fn GN(pfx##_tiles)[2][4] = {                                                 \
        {GN(pfx##_4_1), GN(pfx##_4_2), GN(pfx##_4_3), GN(pfx##_4_4)},                              \
        {GN(pfx##_1_1), GN(pfx##_1_2), GN(pfx##_1_3), GN(pfx##_1_4)}};
#else
#error "ops_gemv.h: GEMV_TILE_T must be 2 or 4"
#endif

TILE_SET(q8, Q8_TILE)
TILE_SET(q4, Q4_TILE)
TILE_SET(f32, F32_TILE)
TILE_SET(f16, F16_TILE)
TILE_SET(bf16, BF16_TILE)

/* Rows 4 at a time, tokens GEMV_TILE_T at a time (then the rest). The 4 rows of a tile are
 * a quarter of the task apart, so that each of the 4 streams reads a contiguous quarter of
 * the task front to back and the prefetcher (and pf_range, PF_AHEAD bytes ahead in each
 * stream) sees 4 long sequential streams instead of short rows that jump every 4 rows:
 * AVX-512, 2 threads, q8_0 2048x8192: 25 -> 29-30 GB/s; 1B q8_0 decode 19 -> 24 tokens/s
 * with the guided row chunks of ops.c. */
TGT static void GN(walk)(const pe_mm *m, const tile_fn tiles[2][GEMV_TILE_T], uint32_t r0,
                         uint32_t r1, uint32_t t0, uint32_t t1)
{
    const size_t rb = m->w->row_bytes;
    const uint32_t q = (r1 - r0) / 4;
    for (uint32_t r = r0; r < r1; r++) {
        const int big = r < r0 + q;
        if (!big && r < r0 + 4 * q) continue; /* done as rows 2..4 of a tile */
        const uint8_t *row = (const uint8_t *)m->w->data + (size_t)r * rb;
        for (uint32_t t = t0; t < t1; t += GEMV_TILE_T) {
            const uint32_t nt = t1 - t < GEMV_TILE_T ? t1 - t : GEMV_TILE_T;
            tiles[big ? 0 : 1][nt - 1](m, row, (size_t)q * rb, r, q, t);
        }
    }
}

TGT static void GN(gemv)(const pe_mm *m, uint32_t r0, uint32_t r1, uint32_t t0, uint32_t t1)
{
    switch (m->w->type) {
    case PE_GGML_TYPE_Q8_0:
        GN(walk)(m, GN(q8_tiles), r0, r1, t0, t1);
        break;
    case PE_GGML_TYPE_Q4_0:
        GN(walk)(m, GN(q4_tiles), r0, r1, t0, t1);
        break;
    case PE_GGML_TYPE_F32:
        GN(walk)(m, GN(f32_tiles), r0, r1, t0, t1);
        break;
    case PE_GGML_TYPE_F16:
        GN(walk)(m, GN(f16_tiles), r0, r1, t0, t1);
        break;
    case PE_GGML_TYPE_BF16:
        GN(walk)(m, GN(bf16_tiles), r0, r1, t0, t1);
        break;
    default:
        PE_UNREACHABLE_TYPE(m->w->type);
    }
}

#undef TILE_SET
#undef BF16_TILE
#undef F16_TILE
#undef F32_TILE
#undef Q4_TILE
#undef Q8_TILE
#undef TILE_FN
#undef GN
#undef GEMV_CAT
#undef GEMV_CAT2
#undef GEMV_QTILE
#undef GEMV_SFX
