/* SPDX-License-Identifier: MIT */
/*
 * test_attn_gemma.c - Gemma's attention options on the fast path (attn.h: pgd_attn_params
 * scale, softcap, layer_window): the reference itself against a direct double-loop
 * computation; the soft-cap kernel at every ISA level against tanh in double; the fast path
 * against pgd_attn_run_ref_ex for every codec (head_dim 8 / 64 / 128, GQA 1 / 2 / 4 / 8,
 * rotation, windows 1 / 7 / 16 / 17 / 40 / 64 / longer than the sequence, soft-cap 0 / 20 /
 * 50, scale 0 / 0.1, decode rows and prefill chunks in one batch, page ranges of 1 and 2
 * pages); Quest pools with a window layer and a global layer; the batch-invariance of
 * window layers (a decode row gives the bits of the same row in a prefill chunk, alone or
 * in a batch, at 1 / 2 / 4 threads, whole or split); scored runs; compacted sequences (dead
 * slots inside windows); bad parameters.
 *
 * Bounds (NMSE over a run's outputs): fast vs reference 1e-9 for f32 / f16 / bf16 (float
 * rounding, the soft-cap's tanh within 4e-7 relative), 3e-4 for the block codecs, whose
 * SIMD kernels quantise the query to 8 bits (as test_attn.c).
 */
#include "attn_fixture.h"

#include "attn/attn_int.h"

static int n_types(void)
{
    int n = 0;
    while (strcmp(pgd_kv_type_name((pgd_kv_type)n), "?") != 0)
        n++;
    return n;
}

static double bound_fast_ref(pgd_kv_type t)
{
    return t == PGD_KV_F32 || t == PGD_KV_F16 || t == PGD_KV_BF16 ? 1e-9 : 3e-4;
}

static int all_finite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

/* ---- K/V held by the test, written into sequences of any prefix length ---- */

typedef struct kvdata {
    uint32_t len;
    float *k, *v; /* [n_layers][len][n_kv][hd] */
} kvdata;

static int kv_make(fx *f, kvdata *d, uint32_t len)
{
    const size_t n = (size_t)f->n_layers * len * f->n_kv * f->hd;
    d->len = len;
    d->k = malloc(n * sizeof *d->k);
    d->v = malloc(n * sizeof *d->v);
    if (!d->k || !d->v) return -1;
    for (size_t i = 0; i < n; i++) {
        d->k[i] = fx_rand(&f->rng) * 1.5f + 0.3f * (float)((i % f->hd) % 5) - 0.6f;
        d->v[i] = fx_rand(&f->rng);
    }
    return 0;
}

static void kv_free(kvdata *d)
{
    free(d->k);
    free(d->v);
    memset(d, 0, sizeof *d);
}

/* A sequence holding d's first len positions, written in random chunks. */
static pgd_seq *seq_from(fx *f, const kvdata *d, uint32_t len)
{
    const size_t row = (size_t)f->n_kv * f->hd;
    pgd_seq *s = NULL;
    if (pgd_seq_create(f->c, NULL, 0, &s) != PGD_OK) return NULL;
    for (uint32_t done = 0; done < len;) {
        uint32_t n = 1 + (uint32_t)(t_rand(&f->rng) % 40);
        if (n > len - done) n = len - done;
        int rc = pgd_seq_grow(f->c, s, n);
        for (uint32_t l = 0; rc == PGD_OK && l < f->n_layers; l++) {
            const size_t off = ((size_t)l * d->len + done) * row;
            rc = pgd_seq_write_kv(f->c, s, done, n, l, d->k + off, d->v + off);
        }
        if (rc != PGD_OK) {
            pgd_seq_destroy(f->c, s);
            return NULL;
        }
        done += n;
    }
    return s;
}

/* ---- batches ---- */

enum { MAX_ITEMS = 48 };

typedef struct batch {
    uint32_t n, n_head;
    pgd_seq *seq[MAX_ITEMS];
    pgd_attn_item it[MAX_ITEMS];
    size_t out_floats;
} batch;

static void batch_free(fx *f, batch *b)
{
    for (uint32_t i = 0; i < b->n; i++) {
        free((void *)b->it[i].q);
        free(b->it[i].out);
        if (b->seq[i]) pgd_seq_destroy(f->c, b->seq[i]);
    }
    memset(b, 0, sizeof *b);
}

/* Appends an item of rows rows over seq (owned by the batch) with queries q (copied; NULL:
 * random). */
static int batch_add(fx *f, batch *b, pgd_seq *seq, uint32_t rows, const float *q)
{
    if (!seq || b->n == MAX_ITEMS) return -1;
    const size_t m = (size_t)rows * b->n_head * f->hd;
    float *qq = q ? malloc(m * sizeof *qq) : fx_queries(f, rows, b->n_head);
    if (!qq) return -1;
    if (q) memcpy(qq, q, m * sizeof *qq);
    b->seq[b->n] = seq;
    b->it[b->n] = (pgd_attn_item){seq, rows, qq, calloc(m + 1, sizeof(float))};
    b->out_floats += m;
    return b->it[b->n++].out ? 0 : -1;
}

static void batch_out(const fx *f, const batch *b, float *dst)
{
    for (uint32_t i = 0; i < b->n; i++) {
        size_t m = (size_t)b->it[i].n_rows * b->n_head * f->hd;
        memcpy(dst, b->it[i].out, m * sizeof *dst);
        dst += m;
    }
}

/* Runs the fast path (params p, isa < 0: the CPU's) on layer of b into x. */
static int run_fast(fx *f, batch *b, const pgd_attn_params *p, int isa, uint32_t layer, float *x)
{
    pgd_attn *a = NULL;
    int rc = pgd_attn_create(f->c, p, &a);
    if (rc == PGD_OK && isa >= 0) rc = pgd__attn_force_isa(a, isa);
    if (rc == PGD_OK) rc = pgd_attn_run(a, layer, b->it, b->n);
    if (rc == PGD_OK) batch_out(f, b, x);
    pgd_attn_destroy(a);
    return rc;
}

/* Fast vs pgd_attn_run_ref_ex on one layer: their NMSE (INFINITY for a non-finite fast
 * output). */
static int fast_vs_ref(fx *f, batch *b, const pgd_attn_params *p, int isa, uint32_t layer,
                       double *nmse)
{
    float *r = malloc(b->out_floats * sizeof *r), *x = malloc(b->out_floats * sizeof *x);
    int rc = r && x ? run_fast(f, b, p, isa, layer, x) : PGD_ENOMEM;
    if (rc == PGD_OK) rc = pgd_attn_run_ref_ex(f->c, p, layer, b->it, NULL, b->n);
    if (rc == PGD_OK) {
        batch_out(f, b, r);
        *nmse = all_finite(x, b->out_floats) ? fx_nmse(x, r, b->out_floats) : INFINITY;
    }
    free(r);
    free(x);
    return rc;
}

/* ---- the reference against a direct computation ---- */

/* Small f32 case, computed here in double: logits scale * q.k, soft-capped, over the
 * window's keys only, softmax, weighted V; and the scores (probabilities summed over the
 * group's heads and rows) of the same rows. */
static int test_reference_independent(void)
{
    enum { NL = 2, NKV = 2, HD = 8, PT = 4, G = 2, NH = NKV * G, LEN = 23, ROWS = 5 };
    static const uint32_t windows[NL] = {7, 0};
    fx f;
    T_OK(fx_init(&f, PGD_KV_F32, NL, NKV, HD, PT, 64, 0, 0, 11));
    kvdata d;
    T_OK(kv_make(&f, &d, LEN));
    pgd_seq *s = seq_from(&f, &d, LEN);
    T_ASSERT(s != NULL);
    float *q = fx_queries(&f, ROWS, NH), out[ROWS * NH * HD], sc[NKV * LEN];
    T_ASSERT(q != NULL);
    static const float scales[2] = {0.0f, 0.3f}, caps[2] = {0.0f, 2.0f};
    for (int v = 0; v < 4; v++) {
        pgd_attn_params p = pgd_attn_default_params();
        p.n_head = NH;
        p.scale = scales[v & 1];
        p.softcap = caps[v >> 1];
        p.layer_window = windows;
        for (uint32_t layer = 0; layer < NL; layer++) {
            pgd_attn_item it = {s, ROWS, q, out};
            pgd_attn_scores ps = {sc, ROWS, LEN};
            memset(sc, 0, sizeof sc);
            T_OK(pgd_attn_run_ref_ex(f.c, &p, layer, &it, &ps, 1));
            const double scale = p.scale > 0 ? p.scale : 1.0 / sqrt((double)HD);
            const uint32_t W = windows[layer];
            double want_sc[NKV * LEN] = {0};
            double worst = 0;
            for (uint32_t t = 0; t < ROWS; t++) {
                const uint32_t pos = LEN - ROWS + t, lo = W && pos + 1 > W ? pos + 1 - W : 0;
                for (uint32_t h = 0; h < NH; h++) {
                    const uint32_t kvh = h / G;
                    const float *qh = q + ((size_t)t * NH + h) * HD;
                    double lg[LEN], mx = -INFINITY, sum = 0, o[HD] = {0};
                    for (uint32_t j = lo; j <= pos; j++) {
                        const float *k = d.k + (((size_t)layer * LEN + j) * NKV + kvh) * HD;
                        double x = 0;
                        for (uint32_t e = 0; e < HD; e++)
                            x += (double)qh[e] * k[e];
                        x *= scale;
                        if (p.softcap > 0) x = p.softcap * tanh(x / p.softcap);
                        lg[j] = x;
                        mx = x > mx ? x : mx;
                    }
                    for (uint32_t j = lo; j <= pos; j++)
                        sum += exp(lg[j] - mx);
                    for (uint32_t j = lo; j <= pos; j++) {
                        const double w = exp(lg[j] - mx) / sum;
                        const float *vv = d.v + (((size_t)layer * LEN + j) * NKV + kvh) * HD;
                        for (uint32_t e = 0; e < HD; e++)
                            o[e] += w * vv[e];
                        want_sc[kvh * LEN + j] += w;
                    }
                    for (uint32_t e = 0; e < HD; e++) {
                        const double err = fabs(o[e] - out[((size_t)t * NH + h) * HD + e]);
                        worst = err > worst ? err : worst;
                    }
                }
            }
            if (!(worst <= 1e-6)) T_FAIL("variant %d layer %u: |ref - direct| %g", v, layer, worst);
            for (uint32_t i = 0; i < NKV * LEN; i++) {
                if (!(fabs(want_sc[i] - sc[i]) <= 1e-6))
                    T_FAIL("variant %d layer %u score %u: %g, want %g", v, layer, i, sc[i],
                           want_sc[i]);
                if (want_sc[i] == 0) T_ASSERT(sc[i] == 0.0f); /* outside every window */
            }
        }
    }
    free(q);
    pgd_seq_destroy(f.c, s);
    kv_free(&d);
    fx_deinit(&f);
    return 0;
}

/* ---- the soft-cap kernel ---- */

static int test_softcap_kernel(void)
{
    uint64_t rng = 5;
    static const float caps[3] = {20.0f * 1.4426950f, 50.0f * 1.4426950f, 1.0f};
    enum { N = 4099 };
    static float x[N + 16], y[N + 16];
    for (int isa = 0; isa <= pgd__attn_isa(); isa++) {
        pgd__attn_softcap_fn fn = pgd__attn_softcap(isa);
        T_ASSERT(fn != NULL);
        double worst = 0;
        for (int ci = 0; ci < 3; ci++) {
            const float cap = caps[ci];
            for (uint32_t i = 0; i < N; i++) {
                /* Every magnitude: tiny, the polynomial's range, the switch at 0.4, huge. */
                const float u = fx_rand(&rng);
                switch (i % 4) {
                case 0:
                    x[i] = u * cap * 0.4f;
                    break;
                case 1:
                    x[i] = u * cap * 3.0f;
                    break;
                case 2:
                    x[i] = u * 1e-3f;
                    break;
                default:
                    x[i] = cap * (0.4f + (i % 64 - 32) * 1e-7f) * (u < 0 ? -1.0f : 1.0f);
                }
            }
            x[0] = 0.0f;
            x[1] = -0.0f;
            x[2] = 1e30f;
            x[3] = -1e30f;
            x[5] = 1e-30f;
            for (uint32_t n = N; n >= N - 15; n -= 5) { /* tails of every length */
                memcpy(y, x, sizeof x);
                fn(y, n, cap);
                for (uint32_t i = n; i < N + 16; i++)
                    T_ASSERT(memcmp(&y[i], &x[i], sizeof y[i]) == 0); /* untouched */
                for (uint32_t i = 0; i < n; i++) {
                    const double want = cap * tanh((double)x[i] / cap);
                    const double err = fabs(y[i] - want) / (fabs(want) + 1e-37);
                    if (!(err <= 4e-7))
                        T_FAIL("isa %d cap %g x %.9g: %.9g, want %.9g", isa, cap, x[i], y[i], want);
                    worst = err > worst ? err : worst;
                }
            }
            /* Odd, exactly. */
            for (uint32_t i = 0; i < N; i++)
                y[i] = -x[i];
            fn(y, N, cap);
            float z[64];
            for (uint32_t i = 0; i < 64; i++)
                z[i] = x[i];
            fn(z, 64, cap);
            for (uint32_t i = 0; i < 64; i++)
                T_ASSERT(y[i] == -z[i]);
        }
        printf("     isa %d soft-cap: worst relative error %.3g\n", isa, worst);
    }
    return 0;
}

/* ---- fast vs reference, every codec ---- */

static const uint32_t WINDOWS[] = {1, 7, 16, 17, 40, 64, 100000};
enum { N_WINDOWS = sizeof WINDOWS / sizeof WINDOWS[0] };

static int test_fast_vs_ref_every_codec(void)
{
    static const uint32_t hds[] = {8, 64, 128}, groups[] = {1, 2, 4, 8};
    static const float caps[] = {0, 20, 50}, scales[] = {0, 0.1f};
    const int nt = n_types();
    uint64_t rng = 1234;
    uint32_t combo = 0;
    for (int ti = 0; ti < nt; ti++) {
        const pgd_kv_type type = (pgd_kv_type)ti;
        double worst = 0;
        int runs = 0;
        for (uint32_t hi = 0; hi < 3; hi++)
            for (uint32_t gi = 0; gi < 4; gi++) {
                const uint32_t hd = hds[hi], G = groups[gi], n_kv = 1 + (uint32_t)(combo % 2);
                const uint32_t pt = t_rand(&rng) % 3 ? 16 : 8, rot = (uint32_t)(combo / 5 % 2);
                fx f;
                int rc = fx_init(&f, type, 2, n_kv, hd, pt, 600, (int)rot, 0, t_rand(&rng));
                if (rc == PGD_EINVAL) continue; /* geometry the codec refuses */
                T_OK(rc);
                /* A window layer (0) and a global layer (1). */
                const uint32_t windows[2] = {WINDOWS[combo % N_WINDOWS], 0};
                pgd_attn_params p = pgd_attn_default_params();
                p.n_head = G * n_kv;
                p.max_rows = 200;
                p.softcap = caps[combo % 3];
                p.scale = scales[combo / 3 % 2];
                p.split_pages = combo / 2 % 3; /* 0 (whole), 1, 2 */
                p.layer_window = windows;
                batch b = {.n_head = p.n_head};
                const uint32_t n = 3 + (uint32_t)(t_rand(&rng) % 2);
                for (uint32_t i = 0; i < n; i++) {
                    const uint32_t len = 1 + (uint32_t)(t_rand(&rng) % (hd == 128 ? 300 : 500));
                    const uint32_t rows =
                        i % 2 ? 1 : 1 + (uint32_t)(t_rand(&rng) % (len < 40 ? len : 40));
                    T_OK(batch_add(&f, &b, fx_seq(&f, len), rows, NULL));
                }
                for (uint32_t layer = 0; layer < 2; layer++) {
                    double e;
                    T_OK(fast_vs_ref(&f, &b, &p, -1, layer, &e));
                    worst = e > worst ? e : worst;
                    if (!(e <= bound_fast_ref(type)))
                        T_FAIL("%s hd %u G %u kv %u pt %u rot %u W %u cap %g scale %g split %u "
                               "layer %u: nmse %g",
                               pgd_kv_type_name(type), hd, G, n_kv, pt, rot, windows[layer],
                               p.softcap, p.scale, p.split_pages, layer, e);
                }
                runs++;
                combo++;
                batch_free(&f, &b);
                fx_deinit(&f);
            }
        printf("     %-6s fast vs ref_ex: %d shapes, worst nmse %.3g\n", pgd_kv_type_name(type),
               runs, worst);
        T_ASSERT(runs > 0);
    }
    return 0;
}

/* Every window on one shape, with and without soft-cap, at every ISA level of the step
 * (the scalar level also takes the reference codec kernels). */
static int test_every_window_every_isa(void)
{
    for (int isa = 0; isa <= pgd__attn_isa(); isa++)
        for (int ti = 0; ti < 2; ti++) {
            fx f;
            T_OK(fx_init(&f, (pgd_kv_type)ti, 1, 2, 64, 16, 300, 0, 0, 5 + isa));
            batch b = {.n_head = 8};
            static const uint32_t len[4] = {300, 77, 16, 150}, rows[4] = {1, 20, 3, 33};
            for (int i = 0; i < 4; i++)
                T_OK(batch_add(&f, &b, fx_seq(&f, len[i]), rows[i], NULL));
            for (uint32_t wi = 0; wi < N_WINDOWS; wi++)
                for (int cap = 0; cap < 2; cap++) {
                    pgd_attn_params p = pgd_attn_default_params();
                    p.n_head = 8;
                    p.layer_window = &WINDOWS[wi];
                    p.softcap = cap ? 20.0f : 0.0f;
                    double e;
                    T_OK(fast_vs_ref(&f, &b, &p, isa, 0, &e));
                    if (!(e <= 1e-9))
                        T_FAIL("isa %d type %d W %u cap %d: nmse %g", isa, ti, WINDOWS[wi], cap, e);
                }
            batch_free(&f, &b);
            fx_deinit(&f);
        }
    return 0;
}

/* ---- Quest with a window layer and a global layer ---- */

/* Key-bounds pools, select_pages 6: the global layers select pages (fast and reference the
 * same ones), the window layer attends densely inside its window (its outputs are the bits
 * of a dense run), in one context; whole and split over 3 threads' scratch. */
static int test_quest_window_and_global(void)
{
    static const pgd_kv_type types[] = {PGD_KV_F32, PGD_KV_F16, PGD_KV_Q8_0, PGD_KV_KIVI2};
    for (uint32_t ti = 0; ti < 4; ti++) {
        fx f;
        T_OK(fx_init(&f, types[ti], 3, 2, 64, 16, 600, (int)(ti % 2), 1, 40 + ti));
        const uint32_t windows[3] = {0, 64, 0};
        batch b = {.n_head = 8};
        static const uint32_t len[4] = {700, 200, 60, 333}, rows[4] = {1, 1, 12, 1};
        for (int i = 0; i < 4; i++)
            T_OK(batch_add(&f, &b, fx_seq(&f, len[i]), rows[i], NULL));
        float *x = malloc(b.out_floats * sizeof *x), *y = malloc(b.out_floats * sizeof *y);
        T_ASSERT(x && y);
        for (int v = 0; v < 2; v++) {
            pgd_attn_params p = pgd_attn_default_params();
            p.n_head = 8;
            p.select_pages = 6;
            p.layer_window = windows;
            p.softcap = v ? 50.0f : 0.0f;
            p.n_threads = v ? 3 : 1;
            p.split_pages = v ? 2 : 0;
            for (uint32_t layer = 0; layer < 3; layer++) {
                double e;
                T_OK(fast_vs_ref(&f, &b, &p, -1, layer, &e));
                if (!(e <= bound_fast_ref(types[ti])))
                    T_FAIL("%s v %d layer %u: nmse %g", pgd_kv_type_name(types[ti]), v, layer, e);
            }
            /* The window layer: the same bits without Quest. */
            T_OK(run_fast(&f, &b, &p, -1, 1, x));
            p.select_pages = 0;
            T_OK(run_fast(&f, &b, &p, -1, 1, y));
            T_ASSERT(memcmp(x, y, b.out_floats * sizeof *x) == 0);
            /* A global layer does select: its outputs differ from dense ones. */
            T_OK(run_fast(&f, &b, &p, -1, 0, y));
            p.select_pages = 6;
            T_OK(run_fast(&f, &b, &p, -1, 0, x));
            T_ASSERT(memcmp(x, y, b.out_floats * sizeof *x) != 0);
        }
        free(x);
        free(y);
        batch_free(&f, &b);
        fx_deinit(&f);
    }
    return 0;
}

/* ---- batch invariance of window layers ---- */

/* For a window layer: every row of a prefill chunk (several tiles) gives the same bits as
 * a decode row at its position (a sequence of that length, the same K/V), with the chunk
 * alone, the decode rows alone, or everything in one batch; at 1, 2 and 4 threads (split
 * automatically, the long rows into pieces); for each split_pages 0, 1, 2. Window longer
 * than the sequence: the bits of a global layer. */
static int window_bits(pgd_kv_type type, uint32_t hd, uint32_t G, uint32_t W, float cap)
{
    enum { LEN = 600, CH = 37 };
    const uint32_t nkv = 2, n_head = G * nkv;
    fx f;
    T_OK(fx_init(&f, type, 1, nkv, hd, 16, 2400, 0, 0, 90 + W + G));
    kvdata d;
    T_OK(kv_make(&f, &d, LEN));
    batch chunk = {.n_head = n_head}, dec = {.n_head = n_head}, all = {.n_head = n_head};
    T_OK(batch_add(&f, &chunk, seq_from(&f, &d, LEN), CH, NULL));
    const float *q = chunk.it[0].q;
    const size_t row = (size_t)n_head * hd;
    for (uint32_t t = 0; t < CH; t++)
        T_OK(batch_add(&f, &dec, seq_from(&f, &d, LEN - CH + t + 1), 1, q + t * row));
    for (uint32_t t = 0; t < CH; t += 3)
        T_OK(batch_add(&f, &all, seq_from(&f, &d, LEN - CH + t + 1), 1, q + t * row));
    T_OK(batch_add(&f, &all, seq_from(&f, &d, LEN), CH, q));
    T_ASSERT(chunk.out_floats == dec.out_floats);
    float *x0 = malloc(chunk.out_floats * sizeof *x0), *x1 = malloc(chunk.out_floats * sizeof *x1);
    float *xa = malloc(all.out_floats * sizeof *xa);
    T_ASSERT(x0 && x1 && xa);
    for (uint32_t split = 0; split <= 2; split++) {
        float *first = NULL;
        for (uint32_t nt = 1; nt <= 4; nt *= 2) {
            fx_exec ex = {.n_threads = nt};
            pgd_attn_params p = pgd_attn_default_params();
            p.n_head = n_head;
            p.layer_window = &W;
            p.softcap = cap;
            p.split_pages = split;
            p.n_threads = nt;
            p.parallel = nt > 1 ? fx_parallel : NULL;
            p.parallel_ud = &ex;
            p.parallel_min_work = 1; /* on the threads however small the run */
            pgd_attn *a;
            T_OK(pgd_attn_create(f.c, &p, &a));
            T_OK(pgd_attn_run(a, 0, chunk.it, chunk.n));
            batch_out(&f, &chunk, x0);
            T_ASSERT(all_finite(x0, chunk.out_floats));
            T_OK(pgd_attn_run(a, 0, dec.it, dec.n));
            batch_out(&f, &dec, x1);
            for (uint32_t t = 0; t < CH; t++)
                if (memcmp(x0 + t * row, x1 + t * row, row * sizeof *x0) != 0)
                    T_FAIL("%s hd %u G %u W %u cap %g split %u threads %u: row %u of the chunk "
                           "differs from its decode row",
                           pgd_kv_type_name(type), hd, G, W, cap, split, nt, t);
            T_OK(pgd_attn_run(a, 0, all.it, all.n));
            batch_out(&f, &all, xa);
            const float *xc = xa + (all.out_floats - chunk.out_floats);
            T_ASSERT(memcmp(xc, x0, chunk.out_floats * sizeof *x0) == 0);
            for (uint32_t i = 0; i + 1 < all.n; i++)
                T_ASSERT(memcmp(xa + i * row, x0 + 3 * i * row, row * sizeof *x0) == 0);
            uint32_t np, ns;
            pgd__attn_last_plan(a, &np, &ns);
            if (split == 1 && W >= 17) T_ASSERT(ns > 0); /* rows of 2 pages or more: pieces */
            pgd_attn_destroy(a);
            if (!first) {
                first = malloc(chunk.out_floats * sizeof *first);
                T_ASSERT(first);
                memcpy(first, x0, chunk.out_floats * sizeof *first);
            } else {
                T_ASSERT(memcmp(first, x0, chunk.out_floats * sizeof *first) == 0);
            }
        }
        /* A window longer than the sequence is a global layer, bit for bit. */
        if (W > LEN) {
            pgd_attn_params p = pgd_attn_default_params();
            p.n_head = n_head;
            p.softcap = cap;
            p.split_pages = split;
            T_OK(run_fast(&f, &chunk, &p, -1, 0, x1));
            T_ASSERT(memcmp(first, x1, chunk.out_floats * sizeof *x1) == 0);
        }
        free(first);
    }
    double e;
    pgd_attn_params p = pgd_attn_default_params();
    p.n_head = n_head;
    p.layer_window = &W;
    p.softcap = cap;
    T_OK(fast_vs_ref(&f, &all, &p, -1, 0, &e));
    if (!(e <= bound_fast_ref(type))) T_FAIL("%s W %u: nmse %g", pgd_kv_type_name(type), W, e);
    free(x0);
    free(x1);
    free(xa);
    batch_free(&f, &chunk);
    batch_free(&f, &dec);
    batch_free(&f, &all);
    kv_free(&d);
    fx_deinit(&f);
    return 0;
}

static int test_window_batch_invariant(void)
{
    T_OK(window_bits(PGD_KV_F16, 64, 4, 17, 0.0f));
    T_OK(window_bits(PGD_KV_F32, 64, 1, 40, 20.0f));
    T_OK(window_bits(PGD_KV_Q8_0, 128, 8, 7, 50.0f));
    T_OK(window_bits(PGD_KV_Q4_0, 64, 2, 1, 0.0f));
    T_OK(window_bits(PGD_KV_KIVI2, 64, 4, 64, 20.0f));
    T_OK(window_bits(PGD_KV_BF16, 128, 2, 300, 0.0f));
    T_OK(window_bits(PGD_KV_F16, 64, 2, 100000, 50.0f));
    return 0;
}

/* ---- scores ---- */

/* Scored runs on a window layer with soft-cap: the outputs are the unscored run's bits; the
 * scores match the reference's (the probabilities of the soft-capped logits); keys outside
 * every scored row's window score exactly 0 in both; each scored row's probabilities sum
 * to 1 per head; and the score bits do not depend on the thread count. */
static int test_scores_window_softcap(void)
{
    static const pgd_kv_type types[] = {PGD_KV_F32, PGD_KV_F16, PGD_KV_Q8_0, PGD_KV_KIVI2};
    static const uint32_t Ws[] = {17, 40, 64, 7};
    for (uint32_t ti = 0; ti < 4; ti++) {
        const uint32_t G = ti % 2 ? 4 : 2, nkv = 2, n_head = G * nkv, hd = 64, W = Ws[ti];
        fx f;
        /* Pages of 8 tokens with 16-row tiles (GQA 4): the longest scored lists per key. */
        const uint32_t pt = ti % 2 ? 8 : 16;
        T_OK(fx_init(&f, types[ti], 1, nkv, hd, pt, 1200, (int)(ti / 2), 0, 60 + ti));
        static const uint32_t len[4] = {500, 90, 260, 30}, rows[4] = {1, 40, 1, 5};
        static const uint32_t srows[4] = {1, 23, 1, 5};
        batch b = {.n_head = n_head};
        float *scores[4], *sref[4];
        pgd_attn_scores sc[4];
        size_t nsc = 0;
        for (int i = 0; i < 4; i++) {
            T_OK(batch_add(&f, &b, fx_seq(&f, len[i]), rows[i], NULL));
            scores[i] = calloc((size_t)nkv * (len[i] + 2), sizeof(float));
            sref[i] = calloc((size_t)nkv * (len[i] + 2), sizeof(float));
            T_ASSERT(scores[i] && sref[i]);
            sc[i] = (pgd_attn_scores){scores[i], srows[i], len[i] + 2};
            nsc += (size_t)nkv * (len[i] + 2);
        }
        float *o0 = malloc(b.out_floats * sizeof *o0), *o1 = malloc(b.out_floats * sizeof *o1);
        float *first = malloc(nsc * sizeof *first), *cur = malloc(nsc * sizeof *cur);
        float *ref = malloc(nsc * sizeof *ref);
        T_ASSERT(o0 && o1 && first && cur && ref);
        pgd_attn_params p = pgd_attn_default_params();
        p.n_head = n_head;
        p.layer_window = &W;
        p.softcap = 20.0f;
        p.score_keys = W;
        /* The reference. */
        pgd_attn_scores scr[4];
        for (int i = 0; i < 4; i++)
            scr[i] = (pgd_attn_scores){sref[i], srows[i], len[i] + 2};
        T_OK(pgd_attn_run_ref_ex(f.c, &p, 0, b.it, scr, b.n));
        for (int i = 0, o = 0; i < 4; o += nkv * (len[i] + 2), i++)
            memcpy(ref + o, sref[i], (size_t)nkv * (len[i] + 2) * sizeof *ref);
        for (uint32_t nt = 1; nt <= 4; nt *= 2)
            for (int isa = -1; isa <= 0; isa++) {
                fx_exec ex = {.n_threads = nt};
                p.n_threads = nt;
                p.parallel = nt > 1 ? fx_parallel : NULL;
                p.parallel_ud = &ex;
                p.parallel_min_work = 1; /* on the threads however small the run */
                pgd_attn *a;
                T_OK(pgd_attn_create(f.c, &p, &a));
                if (isa >= 0) T_OK(pgd__attn_force_isa(a, isa));
                T_OK(pgd_attn_run(a, 0, b.it, b.n));
                batch_out(&f, &b, o0);
                for (int i = 0; i < 4; i++)
                    memset(scores[i], 0, (size_t)nkv * (len[i] + 2) * sizeof(float));
                T_OK(pgd_attn_run_scored(a, 0, b.it, sc, b.n));
                batch_out(&f, &b, o1);
                T_ASSERT(memcmp(o0, o1, b.out_floats * sizeof *o0) == 0);
                pgd_attn_destroy(a);
                for (int i = 0, o = 0; i < 4; o += nkv * (len[i] + 2), i++)
                    memcpy(cur + o, scores[i], (size_t)nkv * (len[i] + 2) * sizeof *cur);
                /* Sums, zeros outside the windows, and the reference. */
                for (int i = 0, o = 0; i < 4; o += nkv * (len[i] + 2), i++) {
                    const uint32_t lo = len[i] - rows[i] + rows[i] - srows[i]; /* first scored */
                    const uint32_t k0 = lo + 1 > W ? lo + 1 - W : 0;
                    for (uint32_t h = 0; h < nkv; h++) {
                        const float *s = cur + o + (size_t)h * (len[i] + 2);
                        const float *r = ref + o + (size_t)h * (len[i] + 2);
                        double sum = 0;
                        for (uint32_t j = 0; j < len[i] + 2; j++) {
                            sum += s[j];
                            if (j < k0 || j >= len[i]) T_ASSERT(s[j] == 0.0f && r[j] == 0.0f);
                            if (isa == 0 || types[ti] <= PGD_KV_BF16) {
                                if (!(fabs(s[j] - r[j]) <= 1e-5 * (fabs(r[j]) + 1e-4)))
                                    T_FAIL("%s isa %d item %d head %u slot %u: %g, ref %g",
                                           pgd_kv_type_name(types[ti]), isa, i, h, j, s[j], r[j]);
                            }
                        }
                        const double want = (double)srows[i] * G;
                        if (!(fabs(sum - want) <= 1e-4 * want))
                            T_FAIL("%s item %d head %u: sum %g, want %g",
                                   pgd_kv_type_name(types[ti]), i, h, sum, want);
                    }
                }
                if (isa < 0) T_ASSERT(fx_nmse(cur, ref, nsc) <= 3e-4);
                if (isa < 0 && nt == 1) memcpy(first, cur, nsc * sizeof *first);
                if (isa < 0) T_ASSERT(memcmp(first, cur, nsc * sizeof *first) == 0);
            }
        /* A window row sees W keys: score_keys below it is refused. */
        p.score_keys = W - 1;
        p.n_threads = 1;
        p.parallel = NULL;
        pgd_attn *a;
        T_OK(pgd_attn_create(f.c, &p, &a));
        T_EQ(pgd_attn_run_scored(a, 0, b.it, sc, b.n), PGD_EINVAL);
        pgd_attn_destroy(a);
        for (int i = 0; i < 4; i++) {
            free(scores[i]);
            free(sref[i]);
        }
        free(o0);
        free(o1);
        free(first);
        free(cur);
        free(ref);
        batch_free(&f, &b);
        fx_deinit(&f);
    }
    return 0;
}

/* ---- compacted sequences ---- */

/* Dead slots of a compacted sequence inside and before a row's window weigh 0 on a window
 * layer (windows count slots), in both paths; decode rows and a prefill chunk, whole and
 * split, scalar kernels (exact) and the CPU's. */
static int test_window_compacted(void)
{
    enum { NKV = 2, N = 300, OUT = 200, NEW = 30 };
    static const pgd_kv_type types[] = {PGD_KV_F32, PGD_KV_F16, PGD_KV_Q8_0, PGD_KV_KIVI2};
    for (uint32_t ti = 0; ti < 4; ti++) {
        fx f;
        T_OK(fx_init(&f, types[ti], 2, NKV, 64, 16, 600, 0, 0, 70 + ti));
        pgd_seq *s = fx_seq(&f, N);
        T_ASSERT(s != NULL);
        static const uint32_t live[2 * NKV] = {OUT, 120, 190, 60};
        uint32_t *keep = malloc((size_t)2 * NKV * OUT * sizeof *keep);
        T_ASSERT(keep);
        for (uint32_t i = 0; i < 2 * NKV; i++)
            for (uint32_t t = 0, got = 0; t < N && got < live[i]; t++)
                if (t_rand(&f.rng) % (N - t) < live[i] - got) keep[i * OUT + got++] = t;
        T_OK(pgd_seq_compact(f.c, s, OUT, keep, OUT, live));
        T_OK(fx_extend(&f, s, NEW));
        free(keep);
        static const uint32_t Ws[] = {17, 64, 100};
        for (uint32_t wi = 0; wi < 3; wi++)
            for (uint32_t rows = 1; rows <= NEW; rows += NEW - 1) {
                const uint32_t windows[2] = {0, Ws[wi]};
                batch b = {.n_head = 2 * NKV};
                pgd_seq *fork;
                T_OK(pgd_seq_fork(f.c, s, &fork));
                T_OK(batch_add(&f, &b, fork, rows, NULL));
                pgd_attn_params p = pgd_attn_default_params();
                p.n_head = 2 * NKV;
                p.layer_window = windows;
                p.softcap = wi == 1 ? 20.0f : 0.0f;
                for (p.split_pages = 0; p.split_pages <= 2; p.split_pages += 2)
                    for (int isa = -1; isa <= 0; isa++) {
                        double e;
                        T_OK(fast_vs_ref(&f, &b, &p, isa, 1, &e));
                        const double bound = isa == 0 ? 1e-9 : bound_fast_ref(types[ti]);
                        if (!(e <= bound))
                            T_FAIL("%s W %u rows %u split %u isa %d: nmse %g",
                                   pgd_kv_type_name(types[ti]), Ws[wi], rows, p.split_pages, isa,
                                   e);
                    }
                batch_free(&f, &b);
            }
        pgd_seq_destroy(f.c, s);
        fx_deinit(&f);
    }
    return 0;
}

/* ---- parameters ---- */

static int test_params(void)
{
    fx f;
    T_OK(fx_init(&f, PGD_KV_F16, 2, 2, 64, 16, 100, 0, 0, 1));
    pgd_attn_params p = pgd_attn_default_params();
    pgd_attn *a = (pgd_attn *)&p;
    p.n_head = 4;
    p.scale = -1.0f;
    T_EQ(pgd_attn_create(f.c, &p, &a), PGD_EINVAL);
    T_ASSERT(a == NULL);
    p.scale = NAN;
    T_EQ(pgd_attn_create(f.c, &p, &a), PGD_EINVAL);
    p.scale = 0.0f;
    p.softcap = INFINITY;
    T_EQ(pgd_attn_create(f.c, &p, &a), PGD_EINVAL);
    p.softcap = -3.0f;
    T_EQ(pgd_attn_create(f.c, &p, &a), PGD_EINVAL);
    /* layer_window is copied at create: changing the caller's array afterwards changes
     * nothing. */
    uint32_t windows[2] = {0, 9};
    p.softcap = 30.0f;
    p.scale = 0.2f;
    p.layer_window = windows;
    T_OK(pgd_attn_create(f.c, &p, &a));
    batch b = {.n_head = 4};
    T_OK(batch_add(&f, &b, fx_seq(&f, 70), 5, NULL));
    float *x = malloc(b.out_floats * sizeof *x), *y = malloc(b.out_floats * sizeof *y);
    T_ASSERT(x && y);
    T_OK(pgd_attn_run(a, 1, b.it, b.n));
    batch_out(&f, &b, x);
    windows[1] = 0;
    T_OK(pgd_attn_run(a, 1, b.it, b.n));
    batch_out(&f, &b, y);
    T_ASSERT(memcmp(x, y, b.out_floats * sizeof *x) == 0);
    pgd_attn_destroy(a);
    /* ... and a global layer (window 0) differs from the window-9 one. */
    T_OK(run_fast(&f, &b, &p, -1, 1, y));
    T_ASSERT(memcmp(x, y, b.out_floats * sizeof *x) != 0);
    /* scale 0 is 1 / sqrt(head_dim), bit for bit; soft-cap 0 is none. */
    pgd_attn_params q = pgd_attn_default_params();
    q.n_head = 4;
    T_OK(run_fast(&f, &b, &q, -1, 0, x));
    q.scale = 0.125f;
    T_OK(run_fast(&f, &b, &q, -1, 0, y));
    T_ASSERT(memcmp(x, y, b.out_floats * sizeof *x) == 0);
    free(x);
    free(y);
    batch_free(&f, &b);
    fx_deinit(&f);
    return 0;
}

int main(void)
{
    T_RUN(test_reference_independent);
    T_RUN(test_softcap_kernel);
    T_RUN(test_fast_vs_ref_every_codec);
    T_RUN(test_every_window_every_isa);
    T_RUN(test_quest_window_and_global);
    T_RUN(test_window_batch_invariant);
    T_RUN(test_scores_window_softcap);
    T_RUN(test_window_compacted);
    T_RUN(test_params);
    T_DONE();
}
