/* SPDX-License-Identifier: MIT */
/*
 * test_attn.c - paged attention (attn.h): the fast path against the scalar reference
 * (src/attn/ref.c) on random shapes for every codec, the log-sum-exp merge of split
 * sequences, Quest page selection, rotation, the kivi2 residual window, the softmax step
 * at every ISA level, bad input, and a parallel fn on real threads.
 *
 * Error bounds are NMSE (sum (fast - ref)^2 / sum ref^2) over a whole run's outputs:
 *   fast vs reference on the same pool   per codec (kernel rounding only; both read the
 *                                         same stored bytes)
 *   codec vs an f32 pool of the same K/V  per codec (the codec's quantisation error)
 */
#include "attn_fixture.h"

#include "attn/attn_int.h"

/* Fast-vs-reference NMSE bound of a codec. Both read the same encoded pages; plain types
 * differ by float rounding only, block types also by the SIMD kernels quantising the query
 * to 8 bits for integer dot products (measured worst 5e-5). */
static double bound_fast_ref(pgd_kv_type t)
{
    switch (t) {
    case PGD_KV_F32:
    case PGD_KV_F16:
    case PGD_KV_BF16:
        return 1e-10;
    default:
        return 3e-4;
    }
}

/* Codec-vs-f32 NMSE bound of attention outputs (quantisation of K and V). */
static double bound_vs_f32(pgd_kv_type t)
{
    switch (t) {
    case PGD_KV_F32:
        return 1e-12;
    case PGD_KV_F16:
        return 1e-5;
    case PGD_KV_BF16:
        return 1e-3;
    case PGD_KV_Q8_0:
        return 1e-3;
    case PGD_KV_Q4_0:
        return 5e-2;
    default:
        return 2e-1;
    }
}

static int n_types(void)
{
    int n = 0;
    while (strcmp(pgd_kv_type_name((pgd_kv_type)n), "?") != 0)
        n++;
    return n;
}

typedef struct batch {
    uint32_t n;
    pgd_seq *seq[8];
    pgd_attn_item it[8];
    size_t out_floats;
} batch;

static void batch_free(fx *f, batch *b)
{
    for (uint32_t i = 0; i < b->n; i++) {
        free((void *)b->it[i].q);
        free(b->it[i].out);
        pgd_seq_destroy(f->c, b->seq[i]);
    }
    memset(b, 0, sizeof *b);
}

/* Items of the given lengths and row counts; queries random. */
static int batch_make(fx *f, batch *b, uint32_t n_head, uint32_t n, const uint32_t *len,
                      const uint32_t *rows)
{
    memset(b, 0, sizeof *b);
    for (uint32_t i = 0; i < n; i++) {
        b->seq[i] = fx_seq(f, len[i]);
        if (!b->seq[i]) return -1;
        b->it[i].seq = b->seq[i];
        b->it[i].n_rows = rows[i];
        b->it[i].q = fx_queries(f, rows[i], n_head);
        b->it[i].out = calloc((size_t)rows[i] * n_head * f->hd + 1, sizeof(float));
        b->out_floats += (size_t)rows[i] * n_head * f->hd;
        b->n++;
    }
    return 0;
}

/* Concatenates the outputs of a batch into dst. */
static void batch_out(const fx *f, const batch *b, uint32_t n_head, float *dst)
{
    for (uint32_t i = 0; i < b->n; i++) {
        size_t m = (size_t)b->it[i].n_rows * n_head * f->hd;
        memcpy(dst, b->it[i].out, m * sizeof *dst);
        dst += m;
    }
}

/* Runs the fast path with params p and the reference on batch b; returns their NMSE. */
static double fast_vs_ref(fx *f, batch *b, const pgd_attn_params *p, int isa, double *nmse)
{
    pgd_attn *a = NULL;
    float *r = malloc(b->out_floats * sizeof *r), *x = malloc(b->out_floats * sizeof *x);
    int rc = pgd_attn_create(f->c, p, &a);
    if (rc == PGD_OK && isa >= 0) rc = pgd__attn_force_isa(a, isa);
    if (rc == PGD_OK) rc = pgd_attn_run(a, f->n_layers - 1, b->it, b->n);
    if (rc == PGD_OK) batch_out(f, b, p->n_head, x);
    if (rc == PGD_OK)
        rc = pgd_attn_run_ref(f->c, p->n_head, f->n_layers - 1, b->it, b->n, p->select_pages);
    if (rc == PGD_OK) {
        batch_out(f, b, p->n_head, r);
        *nmse = fx_nmse(x, r, b->out_floats);
        for (size_t i = 0; i < b->out_floats; i++)
            if (!isfinite(x[i])) *nmse = INFINITY;
    }
    pgd_attn_destroy(a);
    free(r);
    free(x);
    return rc;
}

/* ---- the softmax step at every ISA level ---- */

static int test_softmax_step_isa(void)
{
    uint64_t rng = 7;
    pgd__softmax_step_fn ref = pgd__attn_softmax_step(PGD__ATTN_SCALAR);
    T_ASSERT(ref != NULL);
    for (int isa = PGD__ATTN_AVX2; isa <= pgd__attn_isa(); isa++) {
        pgd__softmax_step_fn fn = pgd__attn_softmax_step(isa);
        T_ASSERT(fn != NULL);
        for (int it = 0; it < 400; it++) {
            float s0[300], s1[300];
            uint32_t nb = 1 + (uint32_t)(t_rand(&rng) % 280),
                     nv = 1 + (uint32_t)(t_rand(&rng) % nb);
            for (uint32_t j = 0; j < nb; j++)
                s0[j] = s1[j] = fx_rand(&rng) * 40.0f;
            float m0 = it % 3 ? -INFINITY : fx_rand(&rng) * 30.0f, m1 = m0, sum0, sum1;
            float a0 = ref(s0, nv, nb, &m0, &sum0), a1 = fn(s1, nv, nb, &m1, &sum1);
            T_ASSERT(m0 == m1);
            T_ASSERT(fabsf(a0 - a1) <= 1e-6f * (a0 > 1e-30f ? a0 : 1e-30f) + 1e-37f);
            T_ASSERT(fabsf(sum0 - sum1) <= 2e-6f * sum0);
            for (uint32_t j = 0; j < nb; j++)
                T_ASSERT(fabsf(s0[j] - s1[j]) <= 2e-7f * 1.0f + 1e-6f * s0[j]);
            for (uint32_t j = nv; j < nb; j++)
                T_ASSERT(s1[j] == 0.0f);
        }
    }
    /* exp2 near the clamp and at 0. */
    for (int isa = 0; isa <= pgd__attn_isa(); isa++) {
        float s[3] = {0.0f, -124.0f, -500.0f}, m = -INFINITY, sum;
        pgd__attn_softmax_step(isa)(s, 3, 3, &m, &sum);
        T_ASSERT(s[0] == 1.0f && s[1] > 0 && s[1] < 1e-36f && s[2] >= 0 && s[2] < 1e-36f);
    }
    return 0;
}

/* ---- fast vs reference on random shapes, every codec ---- */

static int test_random_shapes_every_codec(void)
{
    static const uint32_t hds[] = {8, 64, 128}, groups[] = {1, 2, 4, 8};
    const int nt = n_types();
    uint64_t rng = 99;
    for (int ti = 0; ti < nt; ti++) {
        pgd_kv_type type = (pgd_kv_type)ti;
        double worst = 0;
        int runs = 0;
        for (uint32_t hi = 0; hi < 3; hi++) {
            for (uint32_t gi = 0; gi < 4; gi++) {
                const uint32_t hd = hds[hi], G = groups[gi];
                const uint32_t n_kv = 1 + (uint32_t)(t_rand(&rng) % 2);
                const uint32_t pt = t_rand(&rng) % 3 ? 16 : 8;
                fx f;
                int rc = fx_init(&f, type, 2, n_kv, hd, pt, 400, 0, 0, t_rand(&rng));
                if (rc == PGD_EINVAL) continue; /* geometry the codec refuses */
                T_OK(rc);
                /* Ragged batch: decode rows and prefill chunks, partly filled pages. */
                uint32_t n = 2 + (uint32_t)(t_rand(&rng) % 3), len[4], rows[4];
                for (uint32_t i = 0; i < n; i++) {
                    len[i] = 1 + (uint32_t)(t_rand(&rng) % (hd == 128 ? 300 : 520));
                    rows[i] =
                        i % 2 ? 1 : 1 + (uint32_t)(t_rand(&rng) % (len[i] < 40 ? len[i] : 40));
                }
                batch b;
                T_OK(batch_make(&f, &b, G * n_kv, n, len, rows));
                pgd_attn_params p = pgd_attn_default_params();
                p.n_head = G * n_kv;
                p.max_rows = 200;
                double e;
                T_OK(fast_vs_ref(&f, &b, &p, -1, &e));
                if (e > worst) worst = e;
                if (!(e <= bound_fast_ref(type)))
                    T_FAIL("%s hd %u G %u kv %u pt %u: nmse %g > %g", pgd_kv_type_name(type), hd, G,
                           n_kv, pt, e, bound_fast_ref(type));
                runs++;
                batch_free(&f, &b);
                fx_deinit(&f);
            }
        }
        printf("     %-6s fast vs ref: %d shapes, worst nmse %.3g\n", pgd_kv_type_name(type), runs,
               worst);
        T_ASSERT(runs > 0);
    }
    return 0;
}

/* The scalar fallback (reference codec kernels, scalar step) and each SIMD level. */
static int test_every_isa_level(void)
{
    for (int isa = 0; isa <= pgd__attn_isa(); isa++) {
        for (int ti = 0; ti < 2; ti++) {
            fx f;
            T_OK(fx_init(&f, (pgd_kv_type)ti, 1, 2, 64, 16, 200, 0, 0, 5 + isa));
            uint32_t len[3] = {300, 77, 16}, rows[3] = {1, 20, 3};
            batch b;
            T_OK(batch_make(&f, &b, 8, 3, len, rows));
            pgd_attn_params p = pgd_attn_default_params();
            p.n_head = 8;
            double e;
            T_OK(fast_vs_ref(&f, &b, &p, isa, &e));
            if (!(e <= 1e-10)) T_FAIL("isa %d type %d: nmse %g", isa, ti, e);
            batch_free(&f, &b);
            fx_deinit(&f);
        }
    }
    return 0;
}

/* Each codec's attention against an f32 pool holding the same K/V (same rng stream). */
static int test_codec_error_vs_f32(void)
{
    const int nt = n_types();
    float *ref = NULL;
    size_t nref = 0;
    for (int ti = 0; ti < nt; ti++) {
        fx f;
        T_OK(fx_init(&f, (pgd_kv_type)ti, 1, 2, 64, 16, 200, 0, 0, 4242));
        uint32_t len[3] = {400, 130, 37}, rows[3] = {1, 9, 1};
        batch b;
        T_OK(batch_make(&f, &b, 4, 3, len, rows));
        pgd_attn_params p = pgd_attn_default_params();
        p.n_head = 4;
        pgd_attn *a;
        T_OK(pgd_attn_create(f.c, &p, &a));
        T_OK(pgd_attn_run(a, 0, b.it, b.n));
        float *x = malloc(b.out_floats * sizeof *x);
        batch_out(&f, &b, 4, x);
        if (ti == 0) {
            ref = x;
            nref = b.out_floats;
        } else {
            T_EQ(b.out_floats, nref);
            double e = fx_nmse(x, ref, nref);
            printf("     %-6s vs f32: nmse %.3g (bound %g)\n", pgd_kv_type_name((pgd_kv_type)ti), e,
                   bound_vs_f32((pgd_kv_type)ti));
            T_ASSERT(e <= bound_vs_f32((pgd_kv_type)ti));
            free(x);
        }
        pgd_attn_destroy(a);
        batch_free(&f, &b);
        fx_deinit(&f);
    }
    free(ref);
    return 0;
}

/* Staged pools (kivi2; q8_0 / q4_0 with head_dim 8) read a query row's own page from the
 * residual ring and every other page from the pool, whatever the window: a residual window
 * longer than every sequence gives the very same bits as the smallest one. */
static int test_staged_window_is_irrelevant(void)
{
    static const pgd_kv_type types[] = {PGD_KV_KIVI2, PGD_KV_Q8_0, PGD_KV_Q4_0};
    for (int ti = 0; ti < 3; ti++) {
        float *out[2];
        size_t n = 0;
        const uint32_t hd = types[ti] == PGD_KV_KIVI2 ? 64 : 8;
        for (int k = 0; k < 2; k++) {
            fx_kv_residual = k ? 512 : 0;
            fx f;
            T_OK(fx_init(&f, types[ti], 1, 2, hd, 16, 200, 0, 0, 99));
            uint32_t len[3] = {500, 130, 37}, rows[3] = {1, 9, 1};
            batch b;
            T_OK(batch_make(&f, &b, 4, 3, len, rows));
            pgd_attn_params p = pgd_attn_default_params();
            p.n_head = 4;
            pgd_attn *a;
            T_OK(pgd_attn_create(f.c, &p, &a));
            T_OK(pgd_attn_run(a, 0, b.it, b.n));
            out[k] = malloc(b.out_floats * sizeof(float));
            batch_out(&f, &b, 4, out[k]);
            n = b.out_floats;
            pgd_attn_destroy(a);
            double e;
            T_OK(fast_vs_ref(&f, &b, &p, -1, &e));
            if (!(e <= bound_fast_ref(types[ti])))
                T_FAIL("%s window %d: nmse %g", pgd_kv_type_name(types[ti]), k, e);
            batch_free(&f, &b);
            fx_deinit(&f);
        }
        fx_kv_residual = 0;
        T_ASSERT(memcmp(out[0], out[1], n * sizeof(float)) == 0);
        free(out[0]);
        free(out[1]);
    }
    return 0;
}

/* ---- decode tasks of several KV heads ---- */

/* Decode tasks covering 1, 2, 3 or all KV heads, or the automatic choice (pgd__attn_set_wide)
 * compute every query vector with the very same kernel calls: outputs equal bit for bit, whole or
 * split, and match the reference. Five KV heads: the last task of a width is a partial one. */
static int test_wide_decode_tasks(void)
{
    static const pgd_kv_type types[] = {PGD_KV_F32, PGD_KV_F16, PGD_KV_Q8_0, PGD_KV_Q4_0,
                                        PGD_KV_KIVI2};
    static const uint32_t groups[] = {1, 4, 8}, widths[] = {2, 3, 16, 0};
    for (uint32_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        for (uint32_t gi = 0; gi < 3; gi++) {
            const uint32_t G = groups[gi], nkv = 5, n_head = G * nkv;
            fx f;
            T_OK(fx_init(&f, types[ti], 1, nkv, 128, 16, 300, 0, 0, 71 + ti * 3 + gi));
            /* Decode rows (one in a partly filled page) and a prefill chunk. */
            uint32_t len[4] = {700, 161, 40, 90}, rows[4] = {1, 1, 1, 9};
            batch b;
            T_OK(batch_make(&f, &b, n_head, 4, len, rows));
            float *one = malloc(b.out_floats * sizeof *one), *x = malloc(b.out_floats * sizeof *x);
            T_ASSERT(one && x);
            for (uint32_t split = 0; split <= 3; split += 3) {
                pgd_attn_params p = pgd_attn_default_params();
                p.n_head = n_head;
                p.split_pages = split;
                pgd_attn *a;
                T_OK(pgd_attn_create(f.c, &p, &a));
                pgd__attn_set_wide(a, 1);
                T_OK(pgd_attn_run(a, 0, b.it, b.n));
                batch_out(&f, &b, n_head, one);
                uint32_t np1, ns1, np, ns;
                pgd__attn_last_plan(a, &np1, &ns1);
                for (uint32_t wi = 0; wi < 4; wi++) {
                    pgd__attn_set_wide(a, widths[wi]);
                    T_OK(pgd_attn_run(a, 0, b.it, b.n));
                    batch_out(&f, &b, n_head, x);
                    if (memcmp(x, one, b.out_floats * sizeof *x) != 0)
                        T_FAIL("%s G %u split %u wide %u: differs from one head per task",
                               pgd_kv_type_name(types[ti]), G, split, widths[wi]);
                    pgd__attn_last_plan(a, &np, &ns);
                    /* 3 decode tasks, then the chunk's tiles x 5 heads; G 8: tiles of 8
                     * rows, and the chunk's 1-row tail tile is a task of every head. */
                    if (!split && widths[wi] == 16) T_EQ(np, G <= 4 ? 3 + 5 : 3 + 5 + 1);
                    /* 0, automatic: rows this short (< 8192 keys) get one head per task. */
                    T_ASSERT(widths[wi] ? np < np1 : np == np1);
                }
                pgd_attn_destroy(a);
                double e;
                T_OK(fast_vs_ref(&f, &b, &p, -1, &e));
                if (!(e <= bound_fast_ref(types[ti])))
                    T_FAIL("%s G %u split %u: nmse %g", pgd_kv_type_name(types[ti]), G, split, e);
            }
            free(one);
            free(x);
            batch_free(&f, &b);
            fx_deinit(&f);
        }
    }
    /* Automatic: a decode row of >= 8192 keys gets one task of both heads, a short one a
     * task per head; the same outputs as one head per task. */
    fx f;
    T_OK(fx_init(&f, PGD_KV_F16, 1, 2, 64, 16, 600, 0, 0, 97));
    uint32_t len[2] = {8300, 100}, rows[2] = {1, 1};
    batch b;
    T_OK(batch_make(&f, &b, 8, 2, len, rows));
    float *one = malloc(b.out_floats * sizeof *one), *x = malloc(b.out_floats * sizeof *x);
    T_ASSERT(one && x);
    pgd_attn_params p = pgd_attn_default_params();
    p.n_head = 8;
    pgd_attn *a;
    T_OK(pgd_attn_create(f.c, &p, &a));
    uint32_t np, ns;
    T_OK(pgd_attn_run(a, 0, b.it, b.n));
    pgd__attn_last_plan(a, &np, &ns);
    T_EQ(np, 1 + 2);
    batch_out(&f, &b, 8, x);
    pgd__attn_set_wide(a, 1);
    T_OK(pgd_attn_run(a, 0, b.it, b.n));
    pgd__attn_last_plan(a, &np, &ns);
    T_EQ(np, 2 + 2);
    batch_out(&f, &b, 8, one);
    T_ASSERT(memcmp(x, one, b.out_floats * sizeof *x) == 0);
    pgd_attn_destroy(a);
    double e;
    T_OK(fast_vs_ref(&f, &b, &p, -1, &e));
    if (!(e <= bound_fast_ref(PGD_KV_F16))) T_FAIL("f16 8300 keys: nmse %g", e);
    free(one);
    free(x);
    batch_free(&f, &b);
    fx_deinit(&f);
    return 0;
}

/* ---- log-sum-exp merge ---- */

static int test_split_merge_exact(void)
{
    static const uint32_t splits[] = {1, 2, 3, 7};
    for (uint32_t si = 0; si < 4; si++) {
        fx f;
        T_OK(fx_init(&f, PGD_KV_F32, 1, 2, 64, 16, 300, 0, 0, 31 + si));
        uint32_t len[3] = {600, 161, 40}, rows[3] = {1, 1, 33};
        batch b;
        T_OK(batch_make(&f, &b, 8, 3, len, rows));
        pgd_attn_params p = pgd_attn_default_params();
        p.n_head = 8;
        pgd_attn *a;
        T_OK(pgd_attn_create(f.c, &p, &a));
        T_OK(pgd_attn_run(a, 0, b.it, b.n));
        float *whole = malloc(b.out_floats * sizeof *whole);
        batch_out(&f, &b, 8, whole);
        pgd_attn_destroy(a);

        p.split_pages = splits[si];
        double e;
        T_OK(fast_vs_ref(&f, &b, &p, -1, &e));
        if (!(e <= 1e-11)) T_FAIL("split %u vs ref: nmse %g", splits[si], e);
        T_OK(pgd_attn_create(f.c, &p, &a));
        T_OK(pgd_attn_run(a, 0, b.it, b.n));
        uint32_t np, nsplit;
        pgd__attn_last_plan(a, &np, &nsplit);
        T_ASSERT(nsplit >= 600 / 16 / splits[si]); /* the long sequence was split */
        float *split = malloc(b.out_floats * sizeof *split);
        batch_out(&f, &b, 8, split);
        double es = fx_nmse(split, whole, b.out_floats);
        if (!(es <= 1e-11)) T_FAIL("split %u vs unsplit: nmse %g", splits[si], es);
        pgd_attn_destroy(a);
        free(whole);
        free(split);
        batch_free(&f, &b);
        fx_deinit(&f);
    }
    return 0;
}

/* Automatic splitting with several threads' worth of scratch (run serially). */
static int test_auto_split_many_threads(void)
{
    fx f;
    T_OK(fx_init(&f, PGD_KV_F16, 1, 1, 64, 16, 600, 0, 0, 3));
    uint32_t len[4] = {4000, 100, 50, 9}, rows[4] = {1, 1, 20, 1};
    batch b;
    T_OK(batch_make(&f, &b, 4, 4, len, rows));
    pgd_attn_params p = pgd_attn_default_params();
    p.n_head = 4;
    p.n_threads = 8; /* the plan splits the long sequence; NULL parallel runs it serially */
    double e;
    T_OK(fast_vs_ref(&f, &b, &p, -1, &e));
    if (!(e <= 1e-10)) T_FAIL("nmse %g", e);
    batch_free(&f, &b);
    fx_deinit(&f);
    return 0;
}

/* ---- shared prefix pages ---- */

static int shared_prefix_pages(pgd_kv_type type)
{
    fx f;
    T_OK(fx_init(&f, type, 2, 2, 64, 16, 300, 0, 0, 8));
    pgd_seq *base = fx_seq(&f, 80);
    T_ASSERT(base != NULL);
    int32_t toks[80];
    for (int i = 0; i < 80; i++)
        toks[i] = i * 7 + 1;
    T_OK(pgd_seq_commit(f.c, base, toks, 80));
    pgd_seq *s[4];
    T_OK(pgd_seq_fork(f.c, base, &s[0]));
    T_OK(pgd_seq_fork(f.c, base, &s[1]));
    T_OK(pgd_seq_create(f.c, NULL, 0, &s[2])); /* a prefix match of the same tokens */
    T_EQ(pgd_seq_match(f.c, s[2], toks, 80), 80);
    T_OK(fx_extend(&f, s[0], 45));
    T_OK(fx_extend(&f, s[1], 3));
    T_OK(fx_extend(&f, s[2], 21));
    const uint32_t *p1, *p2, *p3;
    pgd_seq_pages(f.c, s[0], &p1);
    pgd_seq_pages(f.c, s[1], &p2);
    pgd_seq_pages(f.c, s[2], &p3);
    T_EQ(p1[0], p2[0]); /* shared */
    T_EQ(p1[4], p2[4]);
    T_EQ(p1[3], p3[3]);
    s[3] = base;
    pgd_attn_item it[4];
    const uint32_t nh = 8, rows[4] = {1, 12, 2, 1};
    size_t total = 0;
    for (int i = 0; i < 4; i++) {
        it[i].seq = s[i];
        it[i].n_rows = rows[i];
        it[i].q = fx_queries(&f, rows[i], nh);
        it[i].out = calloc((size_t)rows[i] * nh * 64, sizeof(float));
        total += (size_t)rows[i] * nh * 64;
    }
    pgd_attn_params p = pgd_attn_default_params();
    p.n_head = nh;
    p.split_pages = 2;
    pgd_attn *a;
    T_OK(pgd_attn_create(f.c, &p, &a));
    T_OK(pgd_attn_run(a, 1, it, 4));
    float *x = malloc(total * sizeof *x), *r = malloc(total * sizeof *r), *o = x;
    for (int i = 0; i < 4; i++) {
        memcpy(o, it[i].out, (size_t)rows[i] * nh * 64 * sizeof *o);
        o += (size_t)rows[i] * nh * 64;
    }
    T_OK(pgd_attn_run_ref(f.c, nh, 1, it, 4, 0));
    o = r;
    for (int i = 0; i < 4; i++) {
        memcpy(o, it[i].out, (size_t)rows[i] * nh * 64 * sizeof *o);
        o += (size_t)rows[i] * nh * 64;
    }
    double e = fx_nmse(x, r, total);
    if (!(e <= bound_fast_ref(type))) T_FAIL("%s: nmse %g", pgd_kv_type_name(type), e);
    for (int i = 0; i < 4; i++) {
        free((void *)it[i].q);
        free(it[i].out);
        pgd_seq_destroy(f.c, s[i]);
    }
    free(x);
    free(r);
    pgd_attn_destroy(a);
    T_OK(pgd_cache_check(f.c));
    fx_deinit(&f);
    return 0;
}

/* Forked and prefix-matched sequences read shared pages (kivi2: matched pages from the
 * pool, the rest from each sequence's own residual window). */
static int test_shared_prefix_pages(void)
{
    T_OK(shared_prefix_pages(PGD_KV_F16));
    T_OK(shared_prefix_pages(PGD_KV_KIVI2));
    T_OK(shared_prefix_pages(PGD_KV_Q4_0));
    return 0;
}

/* ---- rotation ---- */

/* A rotated pool gives the same attention as an unrotated one with the same K/V. */
static int test_rotation_matches_unrotated(void)
{
    float *out[2] = {NULL, NULL};
    size_t n = 0;
    for (int rot = 0; rot < 2; rot++) {
        fx f;
        T_OK(fx_init(&f, PGD_KV_F32, 1, 2, 64, 16, 200, rot, 0, 77));
        uint32_t len[2] = {210, 50}, rows[2] = {1, 17};
        batch b;
        T_OK(batch_make(&f, &b, 4, 2, len, rows));
        pgd_attn_params p = pgd_attn_default_params();
        p.n_head = 4;
        double e;
        T_OK(fast_vs_ref(&f, &b, &p, -1, &e));
        T_ASSERT(e <= 1e-10);
        pgd_attn *a;
        T_OK(pgd_attn_create(f.c, &p, &a));
        T_OK(pgd_attn_run(a, 0, b.it, b.n));
        out[rot] = malloc(b.out_floats * sizeof(float));
        batch_out(&f, &b, 4, out[rot]);
        n = b.out_floats;
        pgd_attn_destroy(a);
        batch_free(&f, &b);
        fx_deinit(&f);
    }
    double e = fx_nmse(out[1], out[0], n);
    if (!(e <= 1e-10)) T_FAIL("rotated vs unrotated nmse %g", e);
    free(out[0]);
    free(out[1]);
    return 0;
}

/* ---- Quest ---- */

static int test_quest_full_budget_is_dense(void)
{
    fx f;
    T_OK(fx_init(&f, PGD_KV_F16, 1, 2, 64, 16, 300, 0, 1, 12));
    uint32_t len[3] = {250, 90, 33}, rows[3] = {1, 1, 5};
    batch b;
    T_OK(batch_make(&f, &b, 8, 3, len, rows));
    pgd_attn_params p = pgd_attn_default_params();
    p.n_head = 8;
    pgd_attn *a;
    T_OK(pgd_attn_create(f.c, &p, &a));
    T_OK(pgd_attn_run(a, 0, b.it, b.n));
    float *dense = malloc(b.out_floats * sizeof *dense), *x = malloc(b.out_floats * sizeof *x);
    batch_out(&f, &b, 8, dense);
    pgd_attn_destroy(a);
    p.select_pages = 16; /* 250 tokens = 16 pages: the budget covers every page */
    T_OK(pgd_attn_create(f.c, &p, &a));
    T_OK(pgd_attn_run(a, 0, b.it, b.n));
    batch_out(&f, &b, 8, x);
    T_ASSERT(memcmp(x, dense, b.out_floats * sizeof *x) == 0);
    pgd_attn_destroy(a);
    /* The reference with a full budget equals the dense reference. */
    T_OK(pgd_attn_run_ref(f.c, 8, 0, b.it, b.n, 0));
    batch_out(&f, &b, 8, dense);
    T_OK(pgd_attn_run_ref(f.c, 8, 0, b.it, b.n, 100));
    batch_out(&f, &b, 8, x);
    T_ASSERT(memcmp(x, dense, b.out_floats * sizeof *x) == 0);
    free(dense);
    free(x);
    batch_free(&f, &b);
    fx_deinit(&f);
    return 0;
}

static int test_quest_selection(void)
{
    fx f;
    const uint32_t hd = 64, pt = 16, len = 40 * 16 + 5;
    T_OK(fx_init(&f, PGD_KV_F32, 1, 1, hd, pt, 200, 0, 1, 21));
    /* Plant, in page 17, a key aligned with the query: its bound is the largest. */
    float q[64], out[64], k[64];
    for (uint32_t d = 0; d < hd; d++) {
        q[d] = d % 2 ? 1.0f : -1.0f;
        k[d] = 6.0f * q[d];
    }
    pgd_seq *t;
    T_OK(pgd_seq_create(f.c, NULL, 0, &t));
    T_OK(pgd_seq_grow(f.c, t, len));
    {
        float *kk = malloc((size_t)len * hd * sizeof *kk),
              *vv = malloc((size_t)len * hd * sizeof *vv);
        for (uint32_t i = 0; i < len * hd; i++) {
            kk[i] = fx_rand(&f.rng) * 0.5f;
            vv[i] = fx_rand(&f.rng);
        }
        memcpy(kk + (size_t)(17 * pt + 3) * hd, k, sizeof k);
        T_OK(pgd_seq_write_kv(f.c, t, 0, len, 0, kk, vv));
        free(kk);
        free(vv);
    }
    pgd__attn_geom g;
    T_OK(pgd__attn_geom_init(&g, f.c, 1, 8, 0));
    pgd_attn_item it = {t, 1, q, out};
    pgd__attn_view view;
    T_OK(pgd__attn_view_init(&g, &it, &view));
    T_EQ(view.n_pages, 41);
    uint32_t sel[8], hp[8];
    float hs[8];
    uint32_t m = pgd__attn_select(&g, &view, 0, 0, q, 8, sel, hp, hs);
    T_EQ(m, 8);
    T_EQ(sel[0], 0);
    T_EQ(sel[6], 39); /* newest 8 / 4 = 2 pages */
    T_EQ(sel[7], 40);
    int has17 = 0;
    for (uint32_t i = 1; i < 8; i++) {
        T_ASSERT(sel[i] > sel[i - 1]);
        has17 |= sel[i] == 17;
    }
    T_ASSERT(has17);

    /* Fast and reference select the same pages: equal outputs; every codec with bounds. */
    const int nt = n_types();
    for (int ti = 0; ti < nt; ti++) {
        fx f2;
        int rc = fx_init(&f2, (pgd_kv_type)ti, 1, 2, 64, 16, 400, ti % 2, 1, 5);
        T_OK(rc);
        uint32_t lens[3] = {700, 200, 60}, rows[3] = {1, 1, 12};
        batch b;
        T_OK(batch_make(&f2, &b, 8, 3, lens, rows));
        pgd_attn_params p = pgd_attn_default_params();
        p.n_head = 8;
        p.select_pages = 6;
        double e;
        T_OK(fast_vs_ref(&f2, &b, &p, -1, &e));
        if (!(e <= bound_fast_ref((pgd_kv_type)ti)))
            T_FAIL("%s quest fast vs ref nmse %g", pgd_kv_type_name((pgd_kv_type)ti), e);
        p.n_threads = 3;
        p.split_pages = 2;
        T_OK(fast_vs_ref(&f2, &b, &p, -1, &e));
        T_ASSERT(e <= bound_fast_ref((pgd_kv_type)ti));
        batch_free(&f2, &b);
        fx_deinit(&f2);
    }
    pgd_seq_destroy(f.c, t);
    fx_deinit(&f);
    return 0;
}

/* ---- threads ---- */

/* The batch on 4 threads gives the serial bits, every run on the threads
 * (parallel_min_work 1) and with the default parallel_min_work; with the default, a run
 * too small for two threads stays on the caller's (the parallel fn is not called): the
 * 64-key decode row alone (4 heads x 64 keys x (2 x 64 + 32) = 40K multiply-adds), while
 * the batch (a 3000-key row among others, millions) goes to the threads. */
static int test_parallel_threads_equal_serial(void)
{
    fx f;
    T_OK(fx_init(&f, PGD_KV_F16, 1, 2, 64, 16, 600, 0, 0, 17));
    uint32_t len[5] = {3000, 700, 120, 64, 9}, rows[5] = {1, 1, 30, 1, 9};
    batch b;
    T_OK(batch_make(&f, &b, 4, 5, len, rows));
    pgd_attn_params p = pgd_attn_default_params();
    p.n_head = 4;
    p.n_threads = 4;
    pgd_attn *a;
    T_OK(pgd_attn_create(f.c, &p, &a));
    T_OK(pgd_attn_run(a, 0, b.it, b.n));
    float *serial = malloc(b.out_floats * sizeof *serial), *x = malloc(b.out_floats * sizeof *x);
    T_ASSERT(serial && x);
    batch_out(&f, &b, 4, serial);
    pgd_attn_destroy(a);
    for (int forced = 1; forced >= 0; forced--) {
        fx_exec ex = {.n_threads = 4};
        p.parallel = fx_parallel;
        p.parallel_ud = &ex;
        p.parallel_min_work = (uint64_t)forced; /* 0: PGD_ATTN_PARALLEL_MIN_WORK */
        T_OK(pgd_attn_create(f.c, &p, &a));
        T_OK(pgd_attn_run(a, 0, b.it, b.n));
        T_EQ(atomic_load(&ex.n_calls), 1);
        uint32_t np, nsplit;
        pgd__attn_last_plan(a, &np, &nsplit);
        T_ASSERT(nsplit >= 4 && np > nsplit); /* long sequences split, short ones whole */
        for (int rep = 0; rep < 3; rep++) {
            T_OK(pgd_attn_run(a, 0, b.it, b.n));
            batch_out(&f, &b, 4, x);
            T_ASSERT(memcmp(x, serial, b.out_floats * sizeof *x) == 0);
        }
        T_OK(pgd_attn_run(a, 0, b.it + 3, 1)); /* the 64-key row alone */
        T_EQ(atomic_load(&ex.n_calls), forced ? 5 : 4);
        pgd_attn_destroy(a);
    }
    free(serial);
    free(x);
    batch_free(&f, &b);
    fx_deinit(&f);
    return 0;
}

/* ---- batch invariance ---- */

/* An item's output is the same bits alone on one thread and in a batch of 8 on 4 threads
 * (where its long row is split into page ranges, the short ones not), for every codec. */
static int test_batch_invariant(void)
{
    for (int ti = 0; ti <= PGD_KV_KIVI2; ti++) {
        fx f;
        T_OK(fx_init(&f, (pgd_kv_type)ti, 1, 2, 64, 16, 900, 0, 0, 23 + ti));
        uint32_t len[8] = {5000, 700, 120, 64, 9, 3000, 33, 400};
        uint32_t rows[8] = {1, 1, 30, 1, 9, 17, 1, 1};
        batch b;
        T_OK(batch_make(&f, &b, 4, 8, len, rows));
        fx_exec ex = {.n_threads = 4};
        pgd_attn_params p = pgd_attn_default_params();
        p.n_head = 4;
        pgd_attn *alone, *many;
        T_OK(pgd_attn_create(f.c, &p, &alone));
        p.n_threads = 4;
        p.parallel = fx_parallel;
        p.parallel_ud = &ex;
        p.parallel_min_work = 1; /* on the threads however small the run */
        T_OK(pgd_attn_create(f.c, &p, &many));
        T_OK(pgd_attn_run(many, 0, b.it, b.n));
        uint32_t np, nsplit;
        pgd__attn_last_plan(many, &np, &nsplit);
        T_ASSERT(nsplit >= 2 && np > nsplit);
        for (uint32_t i = 0; i < b.n; i++) {
            const size_t m = (size_t)rows[i] * 4 * 64;
            float *x = malloc(m * sizeof *x);
            T_ASSERT(x);
            memcpy(x, b.it[i].out, m * sizeof *x);
            T_OK(pgd_attn_run(alone, 0, &b.it[i], 1));
            if (memcmp(x, b.it[i].out, m * sizeof *x) != 0)
                T_FAIL("%s item %u: alone differs from in the batch",
                       pgd_kv_type_name((pgd_kv_type)ti), i);
            free(x);
        }
        pgd_attn_destroy(alone);
        pgd_attn_destroy(many);
        batch_free(&f, &b);
        fx_deinit(&f);
    }
    return 0;
}

/* ---- bad input ---- */

static int test_bad_input(void)
{
    fx f;
    T_OK(fx_init(&f, PGD_KV_F16, 2, 2, 64, 16, 100, 0, 0, 1));
    pgd_attn_params p = pgd_attn_default_params();
    pgd_attn *a = (pgd_attn *)&p;
    p.n_head = 3; /* not a multiple of 2 KV heads */
    T_EQ(pgd_attn_create(f.c, &p, &a), PGD_EINVAL);
    T_ASSERT(a == NULL);
    p.n_head = 0;
    T_EQ(pgd_attn_create(f.c, &p, &a), PGD_EINVAL);
    p.n_head = 4;
    p.select_pages = 4; /* no key bounds */
    T_EQ(pgd_attn_create(f.c, &p, &a), PGD_EINVAL);
    p.select_pages = 0;
    p.max_rows = 8;
    T_OK(pgd_attn_create(f.c, &p, &a));

    pgd_seq *s = fx_seq(&f, 20);
    float q[10 * 4 * 64] = {0}, out[10 * 4 * 64];
    pgd_attn_item it = {s, 1, q, out};
    T_OK(pgd_attn_run(a, 1, &it, 1));
    T_EQ(pgd_attn_run(a, 2, &it, 1), PGD_EINVAL); /* layer */
    it.n_rows = 21;
    T_EQ(pgd_attn_run(a, 0, &it, 1), PGD_EINVAL); /* more rows than positions */
    T_EQ(pgd_attn_run_ref(f.c, 4, 0, &it, 1, 0), PGD_EINVAL);
    it.n_rows = 9;
    T_EQ(pgd_attn_run(a, 0, &it, 1), PGD_EINVAL); /* more than max_rows */
    it.n_rows = 1;
    it.seq = NULL;
    T_EQ(pgd_attn_run(a, 0, &it, 1), PGD_EINVAL);
    T_EQ(pgd_attn_run_ref(f.c, 4, 0, &it, 1, 0), PGD_EINVAL);
    it.seq = s;
    it.q = NULL;
    T_EQ(pgd_attn_run(a, 0, &it, 1), PGD_EINVAL);
    it.q = q;
    it.n_rows = 0; /* empty items are skipped */
    T_OK(pgd_attn_run(a, 0, &it, 1));
    T_OK(pgd_attn_run(a, 0, NULL, 0));
    T_EQ(pgd_attn_run_ref(f.c, 4, 0, &it, 1, 1), PGD_EINVAL); /* select_pages 1 */
    T_EQ(pgd_attn_run_ref(f.c, 5, 0, &it, 1, 0), PGD_EINVAL);
    /* Uniform queries over equal keys: attention is the mean of V, and it is finite. */
    it.n_rows = 1;
    T_OK(pgd_attn_run(a, 0, &it, 1));
    for (int i = 0; i < 4 * 64; i++)
        T_ASSERT(isfinite(out[i]));
    pgd_attn_destroy(a);
    pgd_attn_destroy(NULL);
    pgd_seq_destroy(f.c, s);
    fx_deinit(&f);

    /* A metadata-only pool has no payload to attend to. */
    pgd_cache_params cp = pgd_cache_default_params();
    cp.pool.metadata_only = 1;
    pgd_cache *c;
    T_OK(pgd_cache_create(&cp, &c));
    p.n_head = 1;
    T_EQ(pgd_attn_create(c, &p, &a), PGD_EINVAL);
    pgd_cache_destroy(c);
    return 0;
}

int main(void)
{
    T_RUN(test_softmax_step_isa);
    T_RUN(test_random_shapes_every_codec);
    T_RUN(test_every_isa_level);
    T_RUN(test_codec_error_vs_f32);
    T_RUN(test_staged_window_is_irrelevant);
    T_RUN(test_wide_decode_tasks);
    T_RUN(test_split_merge_exact);
    T_RUN(test_auto_split_many_threads);
    T_RUN(test_shared_prefix_pages);
    T_RUN(test_rotation_matches_unrotated);
    T_RUN(test_quest_full_budget_is_dense);
    T_RUN(test_quest_selection);
    T_RUN(test_parallel_threads_equal_serial);
    T_RUN(test_batch_invariant);
    T_RUN(test_bad_input);
    T_DONE();
}
