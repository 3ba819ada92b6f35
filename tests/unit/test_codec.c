/* SPDX-License-Identifier: MIT */
/*
 * test_codec.c - the page codecs (src/codec/): f16 / bf16 conversions, the Hadamard
 * rotation, every codec's SIMD kernels against its scalar reference on random shapes, the
 * prefetching decode kernels against the plain ones (bit for bit),
 * round-trip error within each codec's stated bound (codec_int.h / the codec files),
 * q8_0 / q4_0 blocks across rows (head_dim 8) including the re-scale path, and the cache's
 * write path (pgd_seq_write_kv): rotation, key bounds, kivi2's residual ring, encoding of
 * full pages, fork, truncation, pgd_cache_check.
 */
#include <math.h>

#include "codec/codec_impl.h"
#include "pgd_int.h"
#include "t.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float frand(void) /* uniform in [-1, 1) */
{
    return (float)((t_rand(&rng) >> 40) * 0x1p-24 * 2.0 - 1.0);
}

static const pgd_kv_type all_types[] = {PGD_KV_F32,  PGD_KV_F16,  PGD_KV_BF16,
                                        PGD_KV_Q8_0, PGD_KV_Q4_0, PGD_KV_KIVI2};
#define N_TYPES (sizeof all_types / sizeof all_types[0])

/* ---- conversions ---- */

static int test_f16_roundtrip(void)
{
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) continue; /* NaN */
        float f = pgd__f16_to_f32((uint16_t)h);
        T_EQ(pgd__f32_to_f16(f), h);
        uint16_t v;
        pgd__f32_to_f16_n(&f, &v, 1);
        T_EQ(v, h);
    }
    /* Ties round to even; overflow to infinity; rows equal the scalar conversion. */
    T_EQ(pgd__f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
    T_EQ(pgd__f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
    T_EQ(pgd__f32_to_f16(70000.0f), 0x7c00);
    T_EQ(pgd__f32_to_f16_up(70000.0f), 0x7bff);
    T_ASSERT(pgd__f16_to_f32(pgd__f32_to_f16_up(0.1f)) >= 0.1f);
    T_ASSERT(pgd__f16_to_f32(pgd__f32_to_f16_up(-0.1f)) <= -0.1f);
    float x[37];
    uint16_t a[37], b[37];
    float y[37];
    for (int i = 0; i < 37; i++)
        x[i] = frand() * 1000.0f;
    pgd__f32_to_f16_n(x, a, 37);
    for (int i = 0; i < 37; i++) {
        b[i] = pgd__f32_to_f16(x[i]);
        T_EQ(a[i], b[i]);
    }
    pgd__f16_to_f32_n(a, y, 37);
    for (int i = 0; i < 37; i++)
        T_ASSERT(y[i] == pgd__f16_to_f32(a[i]));
    return 0;
}

static int test_bf16(void)
{
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7f80u) == 0x7f80u && (h & 0x7fu)) continue;
        T_EQ(pgd__f32_to_bf16(pgd__bf16_to_f32((uint16_t)h)), h);
    }
    T_EQ(pgd__f32_to_bf16(1.0f + 0x1p-8f), 0x3f80); /* tie to even */
    T_EQ(pgd__f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    return 0;
}

/* ---- Hadamard ---- */

static int test_hadamard(void)
{
    static const uint32_t dims[] = {1, 2, 8, 64, 128, 256};
    float x[256], y[256], e[256], cols[8][256];
    for (size_t t = 0; t < sizeof dims / sizeof dims[0]; t++) {
        uint32_t n = dims[t];
        /* Columns of H D are orthonormal: rotate basis vectors. */
        for (uint32_t i = 0; i < n && i < 8; i++) {
            memset(cols[i], 0, sizeof cols[i]);
            cols[i][i] = 1;
            T_OK(pgd__hadamard(cols[i], n, 42 + t, 0));
        }
        for (uint32_t i = 0; i < n && i < 8; i++)
            for (uint32_t j = 0; j < n && j < 8; j++) {
                double s = 0;
                for (uint32_t d = 0; d < n; d++)
                    s += (double)cols[i][d] * cols[j][d];
                T_ASSERT(fabs(s - (i == j)) < 1e-5);
            }
        /* Forward then inverse is the identity; dot products are kept. */
        for (uint32_t d = 0; d < n; d++) {
            x[d] = frand();
            y[d] = frand();
        }
        memcpy(e, x, sizeof x);
        double dot0 = 0, dot1 = 0;
        for (uint32_t d = 0; d < n; d++)
            dot0 += (double)x[d] * y[d];
        T_OK(pgd__hadamard(x, n, 7, 0));
        T_OK(pgd__hadamard(y, n, 7, 0));
        for (uint32_t d = 0; d < n; d++)
            dot1 += (double)x[d] * y[d];
        T_ASSERT(fabs(dot0 - dot1) < 1e-4);
        T_OK(pgd__hadamard(x, n, 7, 1));
        for (uint32_t d = 0; d < n; d++)
            T_ASSERT(fabsf(x[d] - e[d]) < 1e-5f);
    }
    T_EQ(pgd__hadamard(x, 48, 1, 0), PGD_EINVAL);
    T_EQ(pgd__hadamard(x, 0, 1, 0), PGD_EINVAL);
    /* Different seeds, different signs. */
    memset(x, 0, sizeof x);
    memset(y, 0, sizeof y);
    x[0] = y[0] = 1;
    pgd__hadamard(x, 64, 1, 0);
    pgd__hadamard(y, 64, 2, 0);
    int differ = 0;
    for (int d = 0; d < 64; d++)
        differ |= x[d] != y[d];
    T_ASSERT(differ);
    return 0;
}

/* ---- SIMD kernels against the reference ---- */

/* Fills a region of a codec with random rows (encode_page, or write_row row by row). */
static void fill_region(const pgd__codec *cd, pgd__kv_kind kind, void *region, uint32_t pt,
                        uint32_t hd, float *rows, int by_row)
{
    for (size_t i = 0; i < (size_t)pt * hd; i++)
        rows[i] = frand() * (1.0f + (float)(i % 7));
    if (by_row && cd->row_writable)
        for (uint32_t r = 0; r < pt; r++)
            cd->write_row(kind, region, pt, hd, r, rows + (size_t)r * hd);
    else
        cd->encode_page(kind, region, pt, hd, rows, pt);
}

static int check_kernels(pgd_kv_type type, int isa, uint32_t hd, uint32_t pt)
{
    const pgd__codec *ref = pgd__codec_ref(type), *fast = pgd__codec_at(type, isa);
    if (!fast) return 0; /* this CPU lacks the level */
    size_t rb = pgd__codec_region_bytes(type, pt, hd);
    T_ASSERT(rb > 0 && rb % 16 == 0);
    uint8_t *kreg = calloc(1, rb), *vreg = calloc(1, rb);
    float *rows = malloc((size_t)pt * hd * sizeof(float));
    float *q = malloc(8 * (size_t)hd * sizeof(float)), *a = malloc(8 * 64 * sizeof(float));
    float *s1 = malloc(8 * 64 * sizeof(float)), *s2 = malloc(8 * 64 * sizeof(float));
    float *o1 = malloc(8 * (size_t)hd * sizeof(float)),
          *o2 = malloc(8 * (size_t)hd * sizeof(float));
    float *kd = malloc((size_t)pt * hd * sizeof(float)), *s3 = malloc(8 * 64 * sizeof(float));
    float *o3 = malloc(8 * (size_t)hd * sizeof(float));
    void *prep = malloc(8 * (size_t)PGD__PREP_Q_HEAD_BYTES);
    T_ASSERT(kreg && vreg && rows && q && a && s1 && s2 && o1 && o2 && o3 && kd && s3 && prep);
    uint32_t n_prep = 0;
    fill_region(ref, PGD__K, kreg, pt, hd, rows, 1);
    fill_region(ref, PGD__V, vreg, pt, hd, rows, 0);
    ref->decode_rows(PGD__K, kreg, pt, hd, 0, pt, kd);
    /* The VNNI level quantizes the query to int8 per group of 32 lanes (|q - q~| <= dq / 2,
     * dq = group amax / 127 <= max |q| / 127) and the v_accum weights to int16: the fast
     * kernels there may differ from the reference by these bounds (kern_x86.h), no more. */
    const int iq = isa == PGD__ISA_VNNI && hd % 64 == 0 &&
                   (type == PGD_KV_Q8_0 || type == PGD_KV_Q4_0 || type == PGD_KV_KIVI2);
    const int kivi = type == PGD_KV_KIVI2;
    double kabs[64] = {0}, vmax = 0, kv2_smax = 0;
    for (uint32_t r = 0; r < pt; r++)
        for (uint32_t d = 0; d < hd; d++)
            kabs[r] += fabs(kd[(size_t)r * hd + d]);
    if (kivi) /* K region: codes, then f16 per-channel scales (kivi2.c) */
        for (uint32_t d = 0; d < hd; d++)
            kv2_smax = fmax(kv2_smax,
                            pgd__f16_to_f32(((const uint16_t *)(kreg + (size_t)pt * hd / 4))[d]));
    ref->decode_rows(PGD__V, vreg, pt, hd, 0, pt, rows);
    for (size_t i = 0; i < (size_t)pt * hd; i++)
        vmax = fmax(vmax, fabs(rows[i]));
    static const uint32_t nqs[] = {1, 2, 3, 4, 6, 7, 8};
    for (int trial = 0; trial < 28; trial++) {
        uint32_t nq = nqs[t_rand(&rng) % 7];
        uint32_t r0 = (uint32_t)(t_rand(&rng) % pt);
        uint32_t n = 1 + (uint32_t)(t_rand(&rng) % (pt - r0));
        size_t ld = 64, lda = 64;
        for (size_t i = 0; i < nq * (size_t)hd; i++) {
            q[i] = frand();
            o1[i] = o2[i] = frand();
        }
        for (size_t i = 0; i < 8 * 64; i++) {
            a[i] = frand();
            s1[i] = s2[i] = -1;
        }
        double qmax[8] = {0}, amax = 0;
        for (uint32_t h = 0; h < nq; h++)
            for (uint32_t d = 0; d < hd; d++)
                qmax[h] = fmax(qmax[h], fabs(q[h * hd + d]));
        for (size_t i = 0; i < 8 * 64; i++)
            amax = fmax(amax, fabs(a[i]));
        ref->k_scores(kreg, pt, hd, r0, n, q, nq, 0.125f, s1, ld);
        fast->k_scores(kreg, pt, hd, r0, n, q, nq, 0.125f, s2, ld);
        /* The prepared query: bit for bit k_scores (and so within its bounds of the ref). */
        T_ASSERT(!fast->prepare_q == !fast->k_scores_prep);
        if (fast->prepare_q && fast->prepare_q(hd, q, nq, prep)) {
            n_prep++;
            for (size_t i = 0; i < 8 * 64; i++)
                s3[i] = -1;
            fast->k_scores_prep(kreg, pt, hd, r0, n, prep, nq, 0.125f, s3, ld);
            if (memcmp(s2, s3, 8 * 64 * sizeof *s3) != 0)
                T_FAIL("%s isa %d hd %u nq %u r0 %u n %u: k_scores_prep differs",
                       pgd_kv_type_name(type), isa, hd, nq, r0, n);
            /* Vectors 1.. of the prepared query: the prep at a stride of
             * PGD__PREP_Q_HEAD_BYTES. */
            if (nq > 1) {
                for (size_t i = 0; i < 8 * 64; i++)
                    s3[i] = -1;
                fast->k_scores_prep(kreg, pt, hd, r0, n,
                                    (const char *)prep + PGD__PREP_Q_HEAD_BYTES, nq - 1, 0.125f, s3,
                                    ld);
                if (memcmp(s2 + ld, s3, (nq - 1) * ld * sizeof *s3) != 0)
                    T_FAIL("%s isa %d hd %u nq %u: k_scores_prep of vectors 1.. differs",
                           pgd_kv_type_name(type), isa, hd, nq);
            }
        }
        for (uint32_t h = 0; h < nq; h++)
            for (uint32_t j = 0; j < 64; j++) {
                float x = s1[h * ld + j], y = s2[h * ld + j];
                if (j >= n) { /* untouched */
                    T_ASSERT(x == -1 && y == -1);
                    continue;
                }
                double mag = 0, qerr = 0;
                for (uint32_t d = 0; d < hd; d++)
                    mag += fabs((double)q[h * hd + d] * kd[(size_t)(r0 + j) * hd + d]);
                if (iq)
                    qerr = kivi ? qmax[h] * kv2_smax / 254.0 * 3.0 * hd
                                : qmax[h] / 254.0 * kabs[r0 + j];
                if (!(fabs((double)x - y) <= 1e-5 * mag * 0.125 + 1e-6 + 0.125 * qerr * 1.001))
                    T_FAIL("%s isa %d hd %u nq %u r0 %u n %u: score %u,%u %g vs %g",
                           pgd_kv_type_name(type), isa, hd, nq, r0, n, h, j, x, y);
            }
        /* AVX2: a query's scores are the bits of a call with that query alone, whatever
         * tile of query vectors it went through (kern_x86.h: tiles of 2, or 3 from nq 6). */
        if (isa == PGD__ISA_AVX2)
            for (uint32_t h = 0; h < nq; h++) {
                for (size_t i = 0; i < 64; i++)
                    s3[i] = -1;
                fast->k_scores(kreg, pt, hd, r0, n, q + (size_t)h * hd, 1, 0.125f, s3, ld);
                if (memcmp(s3, s2 + (size_t)h * ld, 64 * sizeof *s3) != 0)
                    T_FAIL("%s isa %d hd %u nq %u r0 %u n %u: query %u alone differs",
                           pgd_kv_type_name(type), isa, hd, nq, r0, n, h);
            }
        memcpy(o3, o2, nq * (size_t)hd * sizeof *o3);
        ref->v_accum(vreg, pt, hd, r0, n, a, lda, nq, o1);
        fast->v_accum(vreg, pt, hd, r0, n, a, lda, nq, o2);
        /* ... and its outputs those of v_accum with that query alone (tiles of 1 or 2
         * query vectors). */
        if (isa == PGD__ISA_AVX2)
            for (uint32_t h = 0; h < nq; h++) {
                fast->v_accum(vreg, pt, hd, r0, n, a + (size_t)h * lda, lda, 1,
                              o3 + (size_t)h * hd);
                if (memcmp(o3 + (size_t)h * hd, o2 + (size_t)h * hd, hd * sizeof *o3) != 0)
                    T_FAIL("%s isa %d hd %u nq %u r0 %u n %u: v_accum of query %u alone differs",
                           pgd_kv_type_name(type), isa, hd, nq, r0, n, h);
            }
        /* int16 weights: |err| <= sw / 2 sum_j |u_j| <= n max|a| max(ks |u|) / 65534, with
         * ks |u| <= 2 max |v| (q8_0: |v|; q4_0: |v| + 8 ks; kivi2: v - min). */
        double werr = iq ? n * amax * 2.1 * vmax / 65534.0 : 0;
        for (size_t i = 0; i < nq * (size_t)hd; i++)
            if (!(fabsf(o1[i] - o2[i]) <= 1e-4f * (1.0f + fabsf(o1[i])) + werr))
                T_FAIL("%s isa %d hd %u nq %u r0 %u n %u: out %zu %g vs %g", pgd_kv_type_name(type),
                       isa, hd, nq, r0, n, i, o1[i], o2[i]);
    }
    /* The fast table decodes and encodes like the reference. */
    ref->decode_rows(PGD__V, vreg, pt, hd, 0, pt, rows);
    fast->decode_rows(PGD__V, vreg, pt, hd, 0, pt, kd);
    T_ASSERT(memcmp(rows, kd, (size_t)pt * hd * sizeof(float)) == 0);
    free(kreg);
    free(vreg);
    free(rows);
    free(q);
    free(a);
    free(s1);
    free(s2);
    free(o1);
    free(o2);
    free(o3);
    free(kd);
    free(s3);
    free(prep);
    /* q8_0 / q4_0 at the VNNI level with head_dim 64..256 have the prepared path. */
    if (isa == PGD__ISA_VNNI && hd % 64 == 0 && (type == PGD_KV_Q8_0 || type == PGD_KV_Q4_0))
        T_ASSERT(n_prep == 28);
    return 0;
}

static int test_kernels_vs_ref(void)
{
    static const uint32_t hds[] = {8, 16, 32, 64, 128, 256};
    static const uint32_t pts[] = {16, 32, 4};
    for (size_t t = 0; t < N_TYPES; t++)
        for (int isa = PGD__ISA_AVX2; isa <= PGD__ISA_VNNI; isa++)
            for (size_t i = 0; i < sizeof hds / sizeof hds[0]; i++)
                for (size_t j = 0; j < sizeof pts / sizeof pts[0]; j++) {
                    if (pgd__codec_geometry_error(all_types[t], pts[j], hds[i])) continue;
                    if (check_kernels(all_types[t], isa, hds[i], pts[j])) return 1;
                }
    printf("     isa level of this CPU: %d\n", pgd__cpu_isa());
    return 0;
}

/* The prefetching decode kernels (k_scores_pf / v_accum_pf) write exactly what k_scores /
 * v_accum write, for every shape, with and without a region to prefetch. */
static int check_pf_kernels(pgd_kv_type type, int isa, uint32_t hd, uint32_t pt)
{
    const pgd__codec *cd = pgd__codec_at(type, isa);
    if (!cd || !cd->k_scores_pf) return 0;
    T_ASSERT(cd->v_accum_pf != NULL);
    const size_t rb = pgd__codec_region_bytes(type, pt, hd);
    uint8_t *reg = calloc(1, rb), *next = calloc(1, rb);
    float *rows = malloc((size_t)pt * hd * sizeof(float)), *q = malloc(8 * (size_t)hd * 4);
    float *a = malloc(8 * 64 * sizeof(float)), *s1 = malloc(8 * 64 * 4), *s2 = malloc(8 * 64 * 4);
    float *o1 = malloc(8 * (size_t)hd * 4), *o2 = malloc(8 * (size_t)hd * 4);
    T_ASSERT(reg && next && rows && q && a && s1 && s2 && o1 && o2);
    fill_region(cd, PGD__K, reg, pt, hd, rows, 1);
    static const uint32_t nqs[] = {1, 2, 3, 4, 5, 8};
    for (int trial = 0; trial < 24; trial++) {
        const uint32_t nq = nqs[t_rand(&rng) % 6], r0 = (uint32_t)(t_rand(&rng) % pt);
        const uint32_t n = 1 + (uint32_t)(t_rand(&rng) % (pt - r0));
        const void *nx = trial % 3 ? next : NULL;
        for (size_t i = 0; i < nq * (size_t)hd; i++) {
            q[i] = frand();
            o1[i] = o2[i] = frand();
        }
        for (size_t i = 0; i < 8 * 64; i++) {
            a[i] = frand();
            s1[i] = s2[i] = -1;
        }
        cd->k_scores(reg, pt, hd, r0, n, q, nq, 0.125f, s1, 64);
        cd->k_scores_pf(reg, pt, hd, r0, n, q, nq, 0.125f, s2, 64, nx, rb);
        if (memcmp(s1, s2, 8 * 64 * sizeof *s1) != 0)
            T_FAIL("k_scores_pf type %d isa %d hd %u pt %u nq %u r0 %u n %u", type, isa, hd, pt, nq,
                   r0, n);
        cd->v_accum(reg, pt, hd, r0, n, a, 64, nq, o1);
        cd->v_accum_pf(reg, pt, hd, r0, n, a, 64, nq, o2, nx, rb);
        if (memcmp(o1, o2, nq * (size_t)hd * sizeof *o1) != 0)
            T_FAIL("v_accum_pf type %d isa %d hd %u pt %u nq %u r0 %u n %u", type, isa, hd, pt, nq,
                   r0, n);
    }
    free(reg);
    free(next);
    free(rows);
    free(q);
    free(a);
    free(s1);
    free(s2);
    free(o1);
    free(o2);
    return 0;
}

static int test_prefetch_kernels_bitwise(void)
{
    static const uint32_t hds[] = {8, 24, 40, 64, 128, 136, 256};
    static const uint32_t pts[] = {16, 32, 4, 5};
    for (size_t t = 0; t < N_TYPES; t++)
        for (int isa = PGD__ISA_AVX2; isa <= PGD__ISA_VNNI; isa++)
            for (size_t i = 0; i < sizeof hds / sizeof hds[0]; i++)
                for (size_t j = 0; j < sizeof pts / sizeof pts[0]; j++) {
                    if (pgd__codec_geometry_error(all_types[t], pts[j], hds[i])) continue;
                    if (check_pf_kernels(all_types[t], isa, hds[i], pts[j])) return 1;
                }
    return 0;
}

/* ---- round-trip error bounds ---- */

/* Bound of the error of value i of a block codec region (flat index f). */
static double block_bound(pgd_kv_type type, const uint8_t *reg, uint32_t pt, uint32_t hd, size_t f,
                          int rescaled)
{
    size_t n = (size_t)pt * hd;
    if (type == PGD_KV_Q8_0) {
        double d = pgd__f16_to_f32(((const uint16_t *)(reg + n))[f / 32]);
        return (rescaled ? 32 / hd * d / 2 : d / 2) * (1 + 1e-6) + 1e-7;
    }
    double d = fabs(pgd__f16_to_f32(((const uint16_t *)(reg + n / 2))[f / 32]));
    return (rescaled ? 32 / hd * d : d) * (1 + 1e-6) + 1e-7;
}

static int check_roundtrip(pgd_kv_type type, uint32_t hd, uint32_t pt, int by_row)
{
    const pgd__codec *cd = pgd__codec_get(type);
    size_t rb = pgd__codec_region_bytes(type, pt, hd), n = (size_t)pt * hd;
    uint8_t *reg = calloc(1, rb);
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    T_ASSERT(reg && x && y);
    for (int kind = 0; kind < 2; kind++) {
        memset(reg, 0xa5, rb); /* pages are not cleared when allocated */
        fill_region(cd, (pgd__kv_kind)kind, reg, pt, hd, x, by_row);
        /* Let some rows grow, so that blocks across rows must re-scale. */
        if (by_row && cd->row_writable) {
            for (size_t i = 0; i < n; i++)
                x[i] *= (float)(1 + (i / hd) % 4);
            for (uint32_t r = 0; r < pt; r++)
                cd->write_row((pgd__kv_kind)kind, reg, pt, hd, r, x + (size_t)r * hd);
        }
        cd->decode_rows((pgd__kv_kind)kind, reg, pt, hd, 0, pt, y);
        for (size_t f = 0; f < n; f++) {
            double err = fabs((double)x[f] - y[f]), b;
            switch (type) {
            case PGD_KV_F32:
                b = 0;
                break;
            case PGD_KV_F16:
                b = fabs(x[f]) * 0x1p-11 + 0x1p-25;
                break;
            case PGD_KV_BF16:
                b = fabs(x[f]) * 0x1p-8;
                break;
            case PGD_KV_Q8_0:
            case PGD_KV_Q4_0:
                b = block_bound(type, reg, pt, hd, f, by_row && hd < 32);
                break;
            default: { /* kivi2: half the stored scale of the value's channel / group */
                const uint16_t *meta = (const uint16_t *)(reg + n / 4);
                uint32_t r = (uint32_t)(f / hd), d = (uint32_t)(f % hd);
                uint32_t g = hd < 32 ? hd : 32;
                double s = kind == 0 ? pgd__f16_to_f32(meta[d])
                                     : pgd__f16_to_f32(meta[(size_t)r * (hd / g) + d / g]);
                b = s / 2 * (1 + 1e-5) + 1e-6;
                /* and the scale itself is close to (max - min) / 3 */
                T_ASSERT(s <= 2.0 * 12 / 3 * 1.01 + 1e-3);
                break;
            }
            }
            if (!(err <= b))
                T_FAIL("%s hd %u pt %u kind %d by_row %d: value %zu %g decoded %g (bound %g)",
                       pgd_kv_type_name(type), hd, pt, kind, by_row, f, x[f], y[f], b);
        }
    }
    free(reg);
    free(x);
    free(y);
    return 0;
}

static int test_roundtrip_bounds(void)
{
    static const uint32_t hds[] = {8, 16, 64, 128};
    for (size_t t = 0; t < N_TYPES; t++)
        for (size_t i = 0; i < sizeof hds / sizeof hds[0]; i++)
            for (int by_row = 0; by_row < 2; by_row++)
                if (check_roundtrip(all_types[t], hds[i], 16, by_row)) return 1;
    return 0;
}

/* q8_0 / q4_0 at head_dim 8: a block spans 4 rows; a larger row re-scales it. */
static int test_blocks_across_rows(void)
{
    const uint32_t hd = 8, pt = 16;
    for (int t = 0; t < 2; t++) {
        pgd_kv_type type = t ? PGD_KV_Q4_0 : PGD_KV_Q8_0;
        const pgd__codec *cd = pgd__codec_ref(type);
        size_t rb = pgd__codec_region_bytes(type, pt, hd);
        uint8_t *reg = malloc(rb);
        const uint16_t *sc = (const uint16_t *)(reg + (t ? pt * hd / 2 : pt * hd));
        T_ASSERT(reg);
        memset(reg, 0xff, rb);
        float row[8], out[32];
        /* Rows 0..3 form block 0: 1, then 0.5 (fits), then 4 (re-scale), then 0. */
        static const float mags[4] = {1.0f, 0.5f, 4.0f, 0.0f};
        float want[32];
        for (uint32_t r = 0; r < 4; r++) {
            for (uint32_t d = 0; d < hd; d++)
                row[d] = want[r * hd + d] = mags[r] * (d % 2 ? 1.0f : -1.0f) * (float)(d + 1) / 8;
            float before = pgd__f16_to_f32(sc[0]);
            cd->write_row(PGD__K, reg, pt, hd, r, row);
            float after = pgd__f16_to_f32(sc[0]);
            if (r == 1 || r == 3) T_ASSERT(after == before);    /* fitted: scale kept */
            if (r == 2) T_ASSERT(fabsf(after) > fabsf(before)); /* re-scaled */
        }
        cd->decode_rows(PGD__K, reg, pt, hd, 0, 4, out);
        double d = fabs(pgd__f16_to_f32(sc[0]));
        for (int i = 0; i < 32; i++)
            T_ASSERT(fabs(out[i] - want[i]) <= (t ? 4.0 : 2.0) * d + 1e-7);
        /* The new block (row 4) starts fresh, whatever the stale bytes. */
        for (uint32_t d2 = 0; d2 < hd; d2++)
            row[d2] = 0.01f * (float)d2;
        cd->write_row(PGD__K, reg, pt, hd, 4, row);
        cd->decode_rows(PGD__K, reg, pt, hd, 4, 1, out);
        for (uint32_t d2 = 0; d2 < hd; d2++)
            T_ASSERT(fabsf(out[d2] - row[d2]) <= 0.07f / (t ? 8 : 127) + 1e-6f);
        free(reg);
    }
    return 0;
}

/* ---- pool: types, sizes, geometry ---- */

static int test_types_and_sizes(void)
{
    pgd_kv_type t = PGD_KV_F32;
    for (size_t i = 0; i < N_TYPES; i++) {
        T_OK(pgd_kv_type_parse(pgd_kv_type_name(all_types[i]), &t));
        T_EQ(t, all_types[i]);
    }
    T_EQ(pgd_kv_type_parse("q3_k", &t), PGD_EINVAL);
    T_EQ(pgd_kv_type_parse(NULL, &t), PGD_EINVAL);
    T_EQ(pgd_kv_type_size(PGD_KV_BF16), 2);
    T_EQ(pgd_kv_type_size(PGD_KV_Q8_0), 0);
    /* Bytes per token, 1 layer, 1 head, head_dim 128, 16 tokens per page. */
    T_ASSERT(pgd_kv_bytes_per_token(PGD_KV_F16, 16, 1, 1, 128) == 512);
    T_ASSERT(pgd_kv_bytes_per_token(PGD_KV_Q8_0, 16, 1, 1, 128) == 2 * (128 + 8));
    T_ASSERT(pgd_kv_bytes_per_token(PGD_KV_Q4_0, 16, 1, 1, 128) == 2 * (64 + 8));
    /* kivi2: K = 512 codes + 512 scale/min bytes per page, V = 512 + 256: max is K. */
    T_ASSERT(pgd_kv_bytes_per_token(PGD_KV_KIVI2, 16, 1, 1, 128) == 2.0 * 1024 / 16);
    T_ASSERT(pgd_kv_bytes_per_token(PGD_KV_Q8_0, 16, 1, 1, 48) == 0);
    T_ASSERT(pgd_kv_bytes_per_token((pgd_kv_type)77, 16, 1, 1, 64) == 0);
    for (size_t i = 0; i < N_TYPES; i++) {
        pgd_pool_params p = pgd_pool_default_params();
        pgd_pool *pool;
        p.kv_type = all_types[i];
        p.n_layers = 2;
        p.n_kv_heads = 3;
        p.head_dim = 8;
        p.capacity_pages = 4;
        T_OK(pgd_pool_create(&p, &pool));
        T_EQ(pgd_pool_region_bytes(pool), pgd__codec_region_bytes(p.kv_type, 16, 8));
        T_EQ(pgd_pool_page_bytes(pool), 2 * 2 * 3 * pgd_pool_region_bytes(pool));
        T_ASSERT(pgd_kv_bytes_per_token(p.kv_type, 16, 2, 3, 8) ==
                 (double)pgd_pool_token_bytes(pool));
        T_ASSERT(pgd_pool_key_bounds(pool, 0, 0, 0) == NULL);
        pgd_pool_destroy(pool);
        /* Refused geometries. */
        p.head_dim = 48;
        T_EQ(pgd_pool_create(&p, &pool), i < 3 ? PGD_OK : PGD_EINVAL);
        pgd_pool_destroy(pool);
        p.head_dim = 8;
        p.page_tokens = 2; /* 16 values: not a whole block */
        T_EQ(pgd_pool_create(&p, &pool), i < 3 ? PGD_OK : PGD_EINVAL);
        pgd_pool_destroy(pool);
        p.page_tokens = 16;
        p.head_dim = 24;
        p.kv_rotate = 1;
        T_EQ(pgd_pool_create(&p, &pool), PGD_EINVAL);
    }
    return 0;
}

static int test_key_bounds_pool(void)
{
    pgd_pool_params p = pgd_pool_default_params();
    pgd_pool *pool;
    p.n_layers = 2;
    p.n_kv_heads = 2;
    p.head_dim = 8;
    p.capacity_pages = 3;
    p.key_bounds = 1;
    T_OK(pgd_pool_create(&p, &pool));
    uint32_t a, b;
    T_OK(pgd_pool_alloc(pool, &a));
    const float *kb = pgd_pool_key_bounds(pool, a, 1, 1);
    T_ASSERT(kb && kb[0] == INFINITY && kb[8] == -INFINITY);
    float *m = pgd__pool_key_bounds_mut(pool, a, 1, 1);
    m[0] = 1;
    m[8] = 2;
    pgd_pool_ref(pool, a);
    b = a;
    T_EQ(pgd_pool_cow(pool, &b), 1);
    T_ASSERT(b != a);
    kb = pgd_pool_key_bounds(pool, b, 1, 1);
    T_ASSERT(kb[0] == 1 && kb[8] == 2 && kb[1] == INFINITY);
    T_ASSERT(pgd_pool_key_bounds(pool, a, 2, 0) == NULL);
    T_ASSERT(pgd_pool_key_bounds(pool, 9, 0, 0) == NULL);
    pgd_pool_stats st;
    pgd_pool_get_stats(pool, &st);
    T_ASSERT(st.metadata_bytes >= 3 * 2 * 2 * 2 * 8 * sizeof(float));
    pgd_pool_destroy(pool);
    return 0;
}

/* ---- the cache's write path ---- */

typedef struct fix {
    pgd_cache *c;
    uint32_t nl, nh, hd, pt;
} fix;

static int make_cache(fix *f, pgd_kv_type type, uint32_t hd, int rotate, uint32_t residual)
{
    pgd_cache_params p = pgd_cache_default_params();
    p.pool.kv_type = type;
    p.pool.n_layers = f->nl = 2;
    p.pool.n_kv_heads = f->nh = 2;
    p.pool.head_dim = f->hd = hd;
    p.pool.page_tokens = f->pt = 16;
    p.pool.capacity_pages = 64;
    p.pool.kv_rotate = rotate;
    p.pool.rotate_seed = 1234;
    p.pool.key_bounds = 1;
    p.kv_residual = residual;
    return pgd_cache_create(&p, &f->c);
}

/* Random K, V for positions [pos0, pos0 + n) of both layers: the value is a function of
 * (position, layer, kind, head, d), so tests can recompute it. */
static float val(uint64_t pos, uint32_t layer, uint32_t kind, uint32_t h, uint32_t d)
{
    uint64_t s = (pos + 1) * 1000003u + layer * 7919u + kind * 104729u + h * 31u + d + 1;
    t_rand(&s);
    return (float)((t_rand(&s) >> 40) * 0x1p-24 * 2.0 - 1.0);
}

static int write_range(fix *f, pgd_seq *s, uint64_t pos0, uint32_t n)
{
    size_t row = (size_t)f->nh * f->hd;
    float *k = malloc(n * row * sizeof(float)), *v = malloc(n * row * sizeof(float));
    T_ASSERT(k && v);
    for (uint32_t layer = 0; layer < f->nl; layer++) {
        for (uint32_t t = 0; t < n; t++)
            for (uint32_t h = 0; h < f->nh; h++)
                for (uint32_t d = 0; d < f->hd; d++) {
                    k[t * row + h * f->hd + d] = val(pos0 + t, layer, 0, h, d);
                    v[t * row + h * f->hd + d] = val(pos0 + t, layer, 1, h, d);
                }
        int rc = pgd_seq_write_kv(f->c, s, pos0, n, layer, k, v);
        free(k);
        free(v);
        k = v = NULL;
        T_OK(rc);
        if (layer + 1 < f->nl) {
            k = malloc(n * row * sizeof(float));
            v = malloc(n * row * sizeof(float));
            T_ASSERT(k && v);
        }
    }
    return 0;
}

/* Decoded value of position p as a query at position qpos reads it: from the pool, or from
 * the ring (staged pools: p in qpos's page, at or above lo). */
static float read_back(fix *f, pgd_seq *s, uint64_t p, uint64_t qpos, uint32_t layer, uint32_t kind,
                       uint32_t h, uint32_t d)
{
    pgd_pool *pool = pgd_cache_pool(f->c);
    const pgd__codec *cd = pgd__pool_codec(pool);
    const uint32_t *ids;
    pgd_seq_pages(f->c, s, &ids);
    if (pgd__codec_staged(cd, f->hd)) {
        const uint16_t *ring;
        uint32_t w;
        uint64_t lo;
        if (pgd__seq_residual(f->c, s, &ring, &w, &lo) != PGD_OK) return NAN;
        if (p >= lo && p / f->pt == qpos / f->pt)
            return pgd__f16_to_f32(
                ring[((((size_t)layer * 2 + kind) * f->nh + h) * w + p % w) * f->hd + d]);
    }
    void *reg = kind ? pgd_pool_v(pool, ids[p / f->pt], layer, h)
                     : pgd_pool_k(pool, ids[p / f->pt], layer, h);
    float row[128];
    cd->decode_rows(kind ? PGD__V : PGD__K, reg, f->pt, f->hd, (uint32_t)(p % f->pt), 1, row);
    return row[d];
}

static int check_positions(fix *f, pgd_seq *s, uint64_t lo, uint64_t hi, double tol)
{
    float x[128];
    uint64_t seed = 0;
    int rot = pgd__pool_rotate(pgd_cache_pool(f->c), &seed);
    for (uint64_t p = lo; p < hi; p++)
        for (uint32_t layer = 0; layer < f->nl; layer++)
            for (uint32_t kind = 0; kind < 2; kind++)
                for (uint32_t h = 0; h < f->nh; h++) {
                    for (uint32_t d = 0; d < f->hd; d++)
                        x[d] = read_back(f, s, p, hi - 1, layer, kind, h, d);
                    if (rot) pgd__hadamard(x, f->hd, seed, 1);
                    for (uint32_t d = 0; d < f->hd; d++) {
                        float want = val(p, layer, kind, h, d);
                        if (!(fabs(x[d] - want) <= tol))
                            T_FAIL("pos %llu layer %u kind %u head %u d %u: %g, want %g",
                                   (unsigned long long)p, layer, kind, h, d, x[d], want);
                    }
                }
    return 0;
}

static int test_write_kv_codecs(void)
{
    static const double tol[] = {1e-6, 1e-3, 1e-2, 2e-2, 0.2, 0.5};
    for (size_t t = 0; t < N_TYPES; t++)
        for (int rotate = 0; rotate < 2; rotate++) {
            fix f;
            T_OK(make_cache(&f, all_types[t], 64, rotate, 32));
            pgd_seq *s;
            T_OK(pgd_seq_create(f.c, NULL, 0, &s));
            T_OK(pgd_seq_grow(f.c, s, 70));
            T_OK(write_range(&f, s, 0, 5));
            T_OK(write_range(&f, s, 5, 60));
            T_OK(write_range(&f, s, 65, 5));
            if (check_positions(&f, s, 0, 70, tol[t] * (rotate ? 2 : 1))) {
                fprintf(stderr, "type %s rotate %d\n", pgd_kv_type_name(all_types[t]), rotate);
                return 1;
            }
            /* Key bounds: min / max of the rotated keys of page 1, layer 1, head 0. */
            const uint32_t *ids;
            pgd_seq_pages(f.c, s, &ids);
            const float *kb = pgd_pool_key_bounds(pgd_cache_pool(f.c), ids[1], 1, 0);
            T_ASSERT(kb);
            for (uint32_t d = 0; d < f.hd; d++) {
                float mn = INFINITY, mx = -INFINITY, x[64];
                for (uint32_t p = 16; p < 32; p++) {
                    for (uint32_t e = 0; e < f.hd; e++)
                        x[e] = val(p, 1, 0, 0, e);
                    if (rotate) pgd__hadamard(x, f.hd, 1234, 0);
                    mn = fminf(mn, x[d]);
                    mx = fmaxf(mx, x[d]);
                }
                T_ASSERT(kb[d] == mn && kb[f.hd + d] == mx);
            }
            /* Bad calls. */
            float z[128] = {0};
            T_EQ(pgd_seq_write_kv(f.c, s, 70, 1, 0, z, z), PGD_EINVAL);
            T_EQ(pgd_seq_write_kv(f.c, s, 0, 1, 2, z, z), PGD_EINVAL);
            T_EQ(pgd_seq_write_kv(f.c, s, 0, 1, 0, NULL, z), PGD_EINVAL);
            T_OK(pgd_cache_check(f.c));
            pgd_seq_destroy(f.c, s);
            pgd_cache_destroy(f.c);
        }
    return 0;
}

static int test_kivi2_residual(void)
{
    fix f;
    T_OK(make_cache(&f, PGD_KV_KIVI2, 64, 0, 20)); /* window rounds up to 32 */
    pgd_seq *s, *s2;
    const uint16_t *ring;
    uint32_t w;
    uint64_t lo;
    T_OK(pgd_seq_create(f.c, NULL, 0, &s));
    T_OK(pgd_seq_grow(f.c, s, 40));
    /* Write 15 positions: the ring holds bit-exact f16 of them; page 0 not encoded yet. */
    T_OK(write_range(&f, s, 0, 15));
    T_OK(pgd__seq_residual(f.c, s, &ring, &w, &lo));
    T_EQ(w, 32);
    T_EQ(lo, 0); /* a fresh sequence: every position's ring copy is valid */
    for (uint64_t p = 0; p < 15; p++)
        for (uint32_t layer = 0; layer < 2; layer++)
            for (uint32_t kind = 0; kind < 2; kind++)
                for (uint32_t h = 0; h < 2; h++)
                    for (uint32_t d = 0; d < 64; d++)
                        T_EQ(ring[((((size_t)layer * 2 + kind) * 2 + h) * w + p) * 64 + d],
                             pgd__f32_to_f16(val(p, layer, kind, h, d)));
    /* Truncate to 20 (undo part of a grow), then fill page 0: encoded in the pool. */
    T_OK(pgd_seq_truncate(f.c, s, 20));
    T_OK(pgd__seq_residual(f.c, s, &ring, &w, &lo));
    T_EQ(lo, 0);
    T_OK(write_range(&f, s, 15, 5));
    const uint32_t *ids;
    pgd_seq_pages(f.c, s, &ids);
    float row[64];
    const pgd__codec *cd = pgd__pool_codec(pgd_cache_pool(f.c));
    cd->decode_rows(PGD__K, pgd_pool_k(pgd_cache_pool(f.c), ids[0], 1, 1), 16, 64, 3, 1, row);
    for (uint32_t d = 0; d < 64; d++)
        T_ASSERT(fabsf(row[d] - val(3, 1, 0, 1, d)) < 0.5f);
    T_OK(check_positions(&f, s, 16, 20, 1e-3)); /* the last page from the ring */
    T_OK(check_positions(&f, s, 0, 20, 0.5));   /* page 0 from the pool */
    /* Fork copies the ring: the child's writes leave the parent's ring alone. */
    int32_t toks[16] = {0};
    T_OK(pgd_seq_commit(f.c, s, toks, 16));
    T_OK(pgd_seq_fork(f.c, s, &s2));
    const uint16_t *ring2;
    T_OK(pgd__seq_residual(f.c, s2, &ring2, &w, &lo));
    T_ASSERT(ring2 != ring);
    T_ASSERT(memcmp(ring, ring2, (size_t)2 * 2 * 2 * 32 * 64 * 2) == 0);
    float k[128], v[128];
    for (int i = 0; i < 128; i++)
        k[i] = v[i] = 9.0f;
    T_OK(pgd_seq_write_kv(f.c, s2, 19, 1, 0, k, v));
    T_EQ(ring[(19 % 32) * 64], pgd__f32_to_f16(val(19, 0, 0, 0, 0)));
    T_EQ(ring2[(19 % 32) * 64], pgd__f32_to_f16(9.0f));
    T_OK(pgd_cache_check(f.c));
    /* Long run, in writes of 8: full pages come from the pool, and the window stays 32. */
    T_OK(pgd_seq_grow(f.c, s, 80));
    for (uint64_t p = 20; p < 100; p += 8)
        T_OK(write_range(&f, s, p, 8));
    T_OK(pgd__seq_residual(f.c, s, &ring, &w, &lo));
    T_EQ(lo, 80); /* slots below round_up(100 - 32) were overwritten since */
    T_EQ(w, 32);
    T_OK(check_positions(&f, s, 96, 100, 1e-3));
    T_OK(check_positions(&f, s, 0, 100, 0.5));
    /* Truncation that keeps a partial page whose f16 copy was overwritten: refused. */
    T_EQ(pgd_seq_truncate(f.c, s, 24), PGD_EINVAL);
    T_EQ(pgd_seq_length(f.c, s), 100);
    T_OK(pgd_seq_truncate(f.c, s, 96)); /* a page start: fine */
    T_OK(pgd_cache_check(f.c));
    /* A matched prefix is read from the pool: lo = matched length. */
    int32_t more[80] = {0};
    T_OK(pgd_seq_commit(f.c, s, more, 80));
    pgd_seq *s3;
    T_OK(pgd_seq_create(f.c, NULL, 0, &s3));
    int32_t all[96] = {0};
    T_EQ(pgd_seq_match(f.c, s3, all, 96), 96);
    T_OK(pgd_seq_grow(f.c, s3, 3));
    T_OK(pgd__seq_residual(f.c, s3, &ring, &w, &lo));
    T_EQ(lo, 96);
    T_EQ(pgd_seq_write_kv(f.c, s3, 80, 1, 0, k, v), PGD_EINVAL); /* committed page */
    T_OK(write_range(&f, s3, 96, 3));
    T_OK(check_positions(&f, s3, 0, 99, 0.5));
    T_OK(pgd_cache_check(f.c));
    /* A write longer than the window grows the ring (keeping the rows it holds), so that it
     * holds every page the write touched: 5 rows, then 40 in one call. */
    pgd_seq *s4;
    T_OK(pgd_seq_create(f.c, NULL, 0, &s4));
    T_OK(pgd_seq_grow(f.c, s4, 45));
    T_OK(write_range(&f, s4, 0, 5));
    T_OK(write_range(&f, s4, 5, 40));
    T_OK(pgd__seq_residual(f.c, s4, &ring, &w, &lo));
    T_EQ(w, 48);
    T_EQ(lo, 0);
    for (uint64_t p = 0; p < 45; p++)
        T_EQ(ring[(p % w) * 64], pgd__f32_to_f16(val(p, 0, 0, 0, 0)));
    T_OK(check_positions(&f, s4, 32, 45, 1e-3));
    T_OK(check_positions(&f, s4, 0, 45, 0.5));
    T_OK(pgd_cache_check(f.c));
    pgd_seq_destroy(f.c, s4);
    pgd_seq_destroy(f.c, s);
    pgd_seq_destroy(f.c, s2);
    pgd_seq_destroy(f.c, s3);
    pgd_cache_destroy(f.c);
    return 0;
}

/* Copy-on-write through write_kv: a forked partial page is copied with its key bounds. */
static int test_write_kv_cow(void)
{
    fix f;
    T_OK(make_cache(&f, PGD_KV_Q8_0, 8, 0, 0));
    pgd_seq *a, *b;
    T_OK(pgd_seq_create(f.c, NULL, 0, &a));
    T_OK(pgd_seq_grow(f.c, a, 10));
    T_OK(write_range(&f, a, 0, 6));
    T_OK(pgd_seq_fork(f.c, a, &b));
    const uint32_t *ia, *ib;
    pgd_seq_pages(f.c, a, &ia);
    pgd_seq_pages(f.c, b, &ib);
    T_EQ(ia[0], ib[0]);
    T_OK(write_range(&f, b, 6, 4));
    pgd_seq_pages(f.c, b, &ib);
    T_ASSERT(ia[0] != ib[0]);
    pgd_cache_stats st;
    pgd_cache_get_stats(f.c, &st);
    T_EQ(st.n_cow_copies, 1);
    T_OK(check_positions(&f, b, 0, 10, 2e-2));
    T_OK(check_positions(&f, a, 0, 6, 2e-2));
    const float *ka = pgd_pool_key_bounds(pgd_cache_pool(f.c), ia[0], 0, 0);
    const float *kb = pgd_pool_key_bounds(pgd_cache_pool(f.c), ib[0], 0, 0);
    for (uint32_t d = 0; d < 8; d++)
        T_ASSERT(kb[d] <= ka[d] && kb[8 + d] >= ka[8 + d]);
    T_OK(pgd_cache_check(f.c));
    pgd_seq_destroy(f.c, a);
    pgd_seq_destroy(f.c, b);
    pgd_cache_destroy(f.c);
    return 0;
}

int main(void)
{
    T_RUN(test_f16_roundtrip);
    T_RUN(test_bf16);
    T_RUN(test_hadamard);
    T_RUN(test_kernels_vs_ref);
    T_RUN(test_prefetch_kernels_bitwise);
    T_RUN(test_roundtrip_bounds);
    T_RUN(test_blocks_across_rows);
    T_RUN(test_types_and_sizes);
    T_RUN(test_key_bounds_pool);
    T_RUN(test_write_kv_codecs);
    T_RUN(test_kivi2_residual);
    T_RUN(test_write_kv_cow);
    T_DONE();
}
