/* SPDX-License-Identifier: MIT */
/*
 * test_attn_scores.c - the scores of pgd_attn_run_scored (attn.h, token budgets): the fast
 * path's against the reference's on decode rows and prefill chunks, GQA 1 / 4 / 8, every
 * codec, rotation, Quest and page-range splits; outputs equal to pgd_attn_run's bit for
 * bit; the same score bits whatever the thread count and the rest of the batch; each
 * scored row's probabilities summing to 1 per query head; bad arguments; and the dead
 * slots of a compacted sequence (weight 0, score 0, in both paths).
 *
 * Bounds: fast vs reference per score |fast - ref| <= 1e-5 (|ref| + 1e-3 / keys), where
 * both read the same bytes with the same arithmetic up to rounding (f32, f16, bf16, and
 * every codec under the scalar level, pgd__attn_force_isa, whose kernels are the
 * reference codec's); the SIMD kernels of q8_0 / q4_0 / kivi2 quantise the query to 8
 * bits for integer dot products, so there the bound is the one of their outputs (3e-4 in
 * NMSE over all scores).
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

enum { MAX_ITEMS = 6 };

typedef struct sbatch {
    uint32_t n, n_head, n_kv;
    pgd_seq *seq[MAX_ITEMS];
    pgd_attn_item it[MAX_ITEMS];
    pgd_attn_scores sc[MAX_ITEMS];
    size_t out_floats, score_floats;
} sbatch;

static void sb_free(fx *f, sbatch *b)
{
    for (uint32_t i = 0; i < b->n; i++) {
        free((void *)b->it[i].q);
        free(b->it[i].out);
        free(b->sc[i].scores);
        if (b->seq[i]) pgd_seq_destroy(f->c, b->seq[i]);
    }
    memset(b, 0, sizeof *b);
}

/* Items of the given lengths, rows and scored rows (seq given: NULL makes a random one). */
static int sb_make(fx *f, sbatch *b, uint32_t n_head, uint32_t n, const uint32_t *len,
                   const uint32_t *rows, const uint32_t *srows)
{
    memset(b, 0, sizeof *b);
    b->n_head = n_head;
    b->n_kv = f->n_kv;
    for (uint32_t i = 0; i < n; i++) {
        b->seq[i] = fx_seq(f, len[i]);
        if (!b->seq[i]) return -1;
        b->it[i].seq = b->seq[i];
        b->it[i].n_rows = rows[i];
        b->it[i].q = fx_queries(f, rows[i], n_head);
        b->it[i].out = calloc((size_t)rows[i] * n_head * f->hd + 1, sizeof(float));
        b->sc[i].rows = srows[i];
        b->sc[i].ld = len[i] + 3;
        b->sc[i].scores = calloc((size_t)f->n_kv * b->sc[i].ld, sizeof(float));
        if (!b->it[i].q || !b->it[i].out || !b->sc[i].scores) return -1;
        b->out_floats += (size_t)rows[i] * n_head * f->hd;
        b->score_floats += (size_t)f->n_kv * b->sc[i].ld;
        b->n++;
    }
    return 0;
}

static void sb_zero(sbatch *b)
{
    for (uint32_t i = 0; i < b->n; i++)
        memset(b->sc[i].scores, 0, (size_t)b->n_kv * b->sc[i].ld * sizeof(float));
}

static void sb_out(const fx *f, const sbatch *b, float *dst)
{
    for (uint32_t i = 0; i < b->n; i++) {
        size_t m = (size_t)b->it[i].n_rows * b->n_head * f->hd;
        memcpy(dst, b->it[i].out, m * sizeof *dst);
        dst += m;
    }
}

static void sb_scores(const sbatch *b, float *dst)
{
    for (uint32_t i = 0; i < b->n; i++) {
        size_t m = (size_t)b->n_kv * b->sc[i].ld;
        memcpy(dst, b->sc[i].scores, m * sizeof *dst);
        dst += m;
    }
}

/* The worst |x - r| / (|r| + floor) over n scores. */
static double worst_rel(const float *x, const float *r, size_t n, double floor)
{
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)x[i] - r[i]) / (fabs((double)r[i]) + floor);
        if (!(e <= w)) w = e; /* NaN counts as the worst */
    }
    return w;
}

/* Each item's scores sum, per KV head, to rows x group (probabilities), and nothing is
 * scored past the sequence's length. */
static int check_sums(const sbatch *b, uint32_t G)
{
    for (uint32_t i = 0; i < b->n; i++) {
        const uint64_t len = b->sc[i].ld - 3;
        for (uint32_t h = 0; h < b->n_kv; h++) {
            const float *s = b->sc[i].scores + (size_t)h * b->sc[i].ld;
            double sum = 0;
            for (uint64_t j = 0; j < len; j++) {
                if (!(s[j] >= 0))
                    T_FAIL("item %u head %u slot %llu: score %g", i, h, (unsigned long long)j,
                           s[j]);
                sum += s[j];
            }
            for (uint64_t j = len; j < b->sc[i].ld; j++)
                T_ASSERT(s[j] == 0.0f);
            const double want = (double)b->sc[i].rows * G;
            if (!(fabs(sum - want) <= 1e-4 * (want > 1 ? want : 1)))
                T_FAIL("item %u head %u: scores sum %.7g, want %g", i, h, sum, want);
        }
    }
    return 0;
}

typedef struct cmp {
    double rel, nmse; /* fast vs reference scores */
} cmp;

/* Runs fast (params p, isa < 0: the CPU's) and reference with scores on b; checks that the
 * fast outputs equal pgd_attn_run's bit for bit and that both paths' scores sum right. */
static int run_both(fx *f, sbatch *b, const pgd_attn_params *p, int isa, cmp *c)
{
    const uint32_t G = p->n_head / f->n_kv, layer = f->n_layers - 1;
    float *o0 = malloc(b->out_floats * sizeof *o0), *o1 = malloc(b->out_floats * sizeof *o1);
    float *sf = malloc(b->score_floats * sizeof *sf), *sr = malloc(b->score_floats * sizeof *sr);
    T_ASSERT(o0 && o1 && sf && sr);
    pgd_attn *a;
    T_OK(pgd_attn_create(f->c, p, &a));
    if (isa >= 0) T_OK(pgd__attn_force_isa(a, isa));
    T_OK(pgd_attn_run(a, layer, b->it, b->n));
    sb_out(f, b, o0);
    sb_zero(b);
    T_OK(pgd_attn_run_scored(a, layer, b->it, b->sc, b->n));
    sb_out(f, b, o1);
    T_ASSERT(memcmp(o0, o1, b->out_floats * sizeof *o0) == 0);
    if (check_sums(b, G)) T_FAIL("fast path sums");
    sb_scores(b, sf);
    pgd_attn_destroy(a);
    sb_zero(b);
    T_OK(pgd_attn_run_ref_scored(f->c, p->n_head, layer, b->it, b->sc, b->n, p->select_pages));
    if (check_sums(b, G)) T_FAIL("reference sums");
    sb_scores(b, sr);
    c->rel = worst_rel(sf, sr, b->score_floats, 1e-3 / (double)(b->sc[0].ld));
    c->nmse = fx_nmse(sf, sr, b->score_floats);
    free(o0);
    free(o1);
    free(sf);
    free(sr);
    return 0;
}

static int exact_kernels(pgd_kv_type t, int isa)
{
    return isa == PGD__ATTN_SCALAR || t == PGD_KV_F32 || t == PGD_KV_F16 || t == PGD_KV_BF16;
}

/* ---- fast vs reference ---- */

static int test_scores_match_reference(void)
{
    static const uint32_t groups[] = {1, 4, 8};
    const int nt = n_types();
    uint64_t rng = 5;
    for (int ti = 0; ti < nt; ti++) {
        const pgd_kv_type type = (pgd_kv_type)ti;
        double worst_exact = 0, worst_nmse = 0;
        for (uint32_t gi = 0; gi < 3; gi++) {
            for (int variant = 0; variant < 4; variant++) {
                /* 0 plain, 1 rotated + split ranges, 2 Quest, 3 Quest + rotation + split */
                const uint32_t G = groups[gi], n_kv = 2, hd = 64, pt = 16;
                const int rot = variant & 1, quest = variant >= 2;
                fx f;
                T_OK(fx_init(&f, type, 2, n_kv, hd, pt, 600, rot, quest, t_rand(&rng)));
                /* Decode rows, a prefill chunk scored in part and one scored whole. */
                uint32_t len[5] = {600, 161, 40, 200, 75}, rows[5] = {1, 1, 24, 17, 1},
                         srows[5] = {1, 1, 13, 17, 0};
                sbatch b;
                T_OK(sb_make(&f, &b, G * n_kv, 5, len, rows, srows));
                pgd_attn_params p = pgd_attn_default_params();
                p.n_head = G * n_kv;
                p.score_keys = 600;
                p.split_pages = variant & 1 ? 3 : 0;
                p.select_pages = quest ? 8 : 0;
                /* The scalar level (the reference codec kernels, slow) where the SIMD kernels
                 * are not exact: block codecs, with everything on. */
                const int last_isa = exact_kernels(type, -1) || variant != 3 ? -1 : 0;
                for (int isa = -1; isa <= last_isa; isa++) {
                    cmp c;
                    if (run_both(&f, &b, &p, isa, &c))
                        T_FAIL("%s G %u variant %d isa %d", pgd_kv_type_name(type), G, variant,
                               isa);
                    if (exact_kernels(type, isa)) {
                        if (!(c.rel <= 1e-5))
                            T_FAIL("%s G %u variant %d isa %d: worst rel %g",
                                   pgd_kv_type_name(type), G, variant, isa, c.rel);
                        worst_exact = c.rel > worst_exact ? c.rel : worst_exact;
                    } else {
                        if (!(c.nmse <= 3e-4))
                            T_FAIL("%s G %u variant %d: nmse %g", pgd_kv_type_name(type), G,
                                   variant, c.nmse);
                        worst_nmse = c.nmse > worst_nmse ? c.nmse : worst_nmse;
                    }
                }
                sb_free(&f, &b);
                fx_deinit(&f);
            }
        }
        printf("     %-6s scores vs ref: worst rel %.3g (exact kernels), nmse %.3g (simd)\n",
               pgd_kv_type_name(type), worst_exact, worst_nmse);
    }
    return 0;
}

/* Staged pools read a row's own page from the residual ring (q8_0 at head_dim 8). */
static int test_scores_staged_small_heads(void)
{
    static const pgd_kv_type types[] = {PGD_KV_Q8_0, PGD_KV_Q4_0};
    for (int k = 0; k < 2; k++) {
        fx f;
        T_OK(fx_init(&f, types[k], 1, 2, 8, 16, 300, 0, 0, 41 + k));
        uint32_t len[3] = {500, 130, 37}, rows[3] = {1, 9, 20}, srows[3] = {1, 9, 4};
        sbatch b;
        T_OK(sb_make(&f, &b, 8, 3, len, rows, srows));
        pgd_attn_params p = pgd_attn_default_params();
        p.n_head = 8;
        p.score_keys = 512;
        cmp c;
        T_OK(run_both(&f, &b, &p, PGD__ATTN_SCALAR, &c));
        if (!(c.rel <= 1e-5)) T_FAIL("%s: rel %g", pgd_kv_type_name(types[k]), c.rel);
        sb_free(&f, &b);
        fx_deinit(&f);
    }
    return 0;
}

/* ---- determinism ---- */

/* Scores (and outputs) are the same bits on 1 thread, on 2 and 4 real threads, with
 * decode tasks of one or all heads, and for an item alone or in the batch. */
static int test_scores_deterministic(void)
{
    static const pgd_kv_type types[] = {PGD_KV_F16, PGD_KV_Q8_0, PGD_KV_KIVI2};
    for (int ti = 0; ti < 3; ti++) {
        fx f;
        T_OK(fx_init(&f, types[ti], 1, 4, 64, 16, 1500, 0, 0, 61 + ti));
        uint32_t len[5] = {9000, 700, 120, 3000, 50}, rows[5] = {1, 1, 40, 17, 1},
                 srows[5] = {1, 1, 32, 17, 1};
        sbatch b;
        T_OK(sb_make(&f, &b, 16, 5, len, rows, srows));
        float *s1 = malloc(b.score_floats * sizeof *s1), *x = malloc(b.score_floats * sizeof *x);
        float *o1 = malloc(b.out_floats * sizeof *o1), *ox = malloc(b.out_floats * sizeof *ox);
        T_ASSERT(s1 && x && o1 && ox);
        pgd_attn_params p = pgd_attn_default_params();
        p.n_head = 16;
        p.score_keys = 9000;
        pgd_attn *a;
        T_OK(pgd_attn_create(f.c, &p, &a));
        T_OK(pgd_attn_run_scored(a, 0, b.it, b.sc, b.n));
        sb_scores(&b, s1);
        sb_out(&f, &b, o1);
        if (check_sums(&b, 4)) T_FAIL("%s sums", pgd_kv_type_name(types[ti]));
        pgd__attn_set_wide(a, 1); /* one head per decode task */
        sb_zero(&b);
        T_OK(pgd_attn_run_scored(a, 0, b.it, b.sc, b.n));
        sb_scores(&b, x);
        T_ASSERT(memcmp(x, s1, b.score_floats * sizeof *x) == 0);
        pgd_attn_destroy(a);
        for (uint32_t nth = 2; nth <= 4; nth += 2) {
            fx_exec ex = {.n_threads = nth};
            p.n_threads = nth;
            p.parallel = fx_parallel;
            p.parallel_ud = &ex;
            p.parallel_min_work = 1; /* on the threads however small the run */
            T_OK(pgd_attn_create(f.c, &p, &a));
            for (int rep = 0; rep < 2; rep++) {
                sb_zero(&b);
                T_OK(pgd_attn_run_scored(a, 0, b.it, b.sc, b.n));
                sb_scores(&b, x);
                sb_out(&f, &b, ox);
                if (memcmp(x, s1, b.score_floats * sizeof *x) != 0)
                    T_FAIL("%s %u threads: scores differ", pgd_kv_type_name(types[ti]), nth);
                T_ASSERT(memcmp(ox, o1, b.out_floats * sizeof *ox) == 0);
            }
            /* Unscored, the long rows are split; the outputs stay the same bits. */
            T_OK(pgd_attn_run(a, 0, b.it, b.n));
            uint32_t np, ns;
            pgd__attn_last_plan(a, &np, &ns);
            T_ASSERT(ns > 0);
            sb_out(&f, &b, ox);
            T_ASSERT(memcmp(ox, o1, b.out_floats * sizeof *ox) == 0);
            /* Each item alone. */
            float *xs = x;
            for (uint32_t i = 0; i < b.n; i++) {
                const size_t m = (size_t)b.n_kv * b.sc[i].ld;
                memset(b.sc[i].scores, 0, m * sizeof(float));
                T_OK(pgd_attn_run_scored(a, 0, &b.it[i], &b.sc[i], 1));
                T_ASSERT(memcmp(b.sc[i].scores, xs, m * sizeof(float)) == 0);
                xs += m;
            }
            pgd_attn_destroy(a);
        }
        free(s1);
        free(x);
        free(o1);
        free(ox);
        sb_free(&f, &b);
        fx_deinit(&f);
    }
    return 0;
}

/* Scores add to what the buffer holds; an item without scores leaves its buffer alone. */
static int test_scores_accumulate(void)
{
    fx f;
    T_OK(fx_init(&f, PGD_KV_F32, 1, 2, 64, 16, 200, 0, 0, 3));
    uint32_t len[2] = {200, 60}, rows[2] = {1, 12}, srows[2] = {1, 5};
    sbatch b;
    T_OK(sb_make(&f, &b, 4, 2, len, rows, srows));
    pgd_attn_params p = pgd_attn_default_params();
    p.n_head = 4;
    p.score_keys = 256;
    pgd_attn *a;
    T_OK(pgd_attn_create(f.c, &p, &a));
    T_OK(pgd_attn_run_scored(a, 0, b.it, b.sc, b.n));
    float *once = malloc(b.score_floats * sizeof *once), *x = malloc(b.score_floats * sizeof *x);
    sb_scores(&b, once);
    T_OK(pgd_attn_run_scored(a, 0, b.it, b.sc, b.n));
    sb_scores(&b, x);
    for (size_t i = 0; i < b.score_floats; i++)
        T_ASSERT(x[i] == once[i] + once[i]);
    T_OK(pgd_attn_run_ref_scored(f.c, 4, 0, b.it, b.sc, b.n, 0));
    sb_scores(&b, x);
    for (size_t i = 0; i < b.score_floats; i++)
        T_ASSERT(fabsf(x[i] - 3 * once[i]) <= 1e-5f * once[i] + 1e-9f);
    /* NULL scores, rows 0, or sc NULL: nothing added. */
    sb_scores(&b, once);
    pgd_attn_scores none[2] = {{NULL, 1, 0}, {b.sc[1].scores, 0, 0}};
    T_OK(pgd_attn_run_scored(a, 0, b.it, none, 2));
    T_OK(pgd_attn_run_scored(a, 0, b.it, NULL, 2));
    T_OK(pgd_attn_run_ref_scored(f.c, 4, 0, b.it, none, 2, 0));
    sb_scores(&b, x);
    T_ASSERT(memcmp(x, once, b.score_floats * sizeof *x) == 0);
    free(once);
    free(x);
    pgd_attn_destroy(a);
    sb_free(&f, &b);
    fx_deinit(&f);
    return 0;
}

/* ---- bad arguments ---- */

static int test_scores_errors(void)
{
    fx f;
    T_OK(fx_init(&f, PGD_KV_F16, 1, 2, 64, 16, 300, 0, 1, 9));
    uint32_t len[1] = {300}, rows[1] = {4}, srows[1] = {2};
    sbatch b;
    T_OK(sb_make(&f, &b, 4, 1, len, rows, srows));
    pgd_attn_params p = pgd_attn_default_params();
    p.n_head = 4;
    pgd_attn *a;
    T_OK(pgd_attn_create(f.c, &p, &a)); /* score_keys 0: no scores */
    float *x = malloc(b.out_floats * sizeof *x);
    memset(b.it[0].out, 0x7f, b.out_floats * sizeof(float));
    memcpy(x, b.it[0].out, b.out_floats * sizeof *x);
    T_EQ(pgd_attn_run_scored(a, 0, b.it, b.sc, 1), PGD_EINVAL);
    T_OK(pgd_attn_run_scored(a, 0, b.it, NULL, 1)); /* unscored runs work */
    pgd_attn_destroy(a);
    memcpy(b.it[0].out, x, b.out_floats * sizeof *x);
    p.score_keys = 299; /* one key short */
    T_OK(pgd_attn_create(f.c, &p, &a));
    T_EQ(pgd_attn_run_scored(a, 0, b.it, b.sc, 1), PGD_EINVAL);
    pgd_attn_destroy(a);
    p.score_keys = 300;
    T_OK(pgd_attn_create(f.c, &p, &a));
    b.sc[0].rows = 5; /* more than n_rows */
    T_EQ(pgd_attn_run_scored(a, 0, b.it, b.sc, 1), PGD_EINVAL);
    T_EQ(pgd_attn_run_ref_scored(f.c, 4, 0, b.it, b.sc, 1, 0), PGD_EINVAL);
    b.sc[0].rows = 2;
    b.sc[0].ld = 299; /* below the length */
    T_EQ(pgd_attn_run_scored(a, 0, b.it, b.sc, 1), PGD_EINVAL);
    T_EQ(pgd_attn_run_ref_scored(f.c, 4, 0, b.it, b.sc, 1, 0), PGD_EINVAL);
    /* Nothing was written. */
    T_ASSERT(memcmp(x, b.it[0].out, b.out_floats * sizeof *x) == 0);
    for (size_t i = 0; i < b.score_floats; i++)
        T_ASSERT(b.sc[0].scores[i] == 0.0f);
    b.sc[0].ld = 300;
    T_OK(pgd_attn_run_scored(a, 0, b.it, b.sc, 1));
    pgd_attn_destroy(a);
    /* Quest: a decode row sees only its selected pages, which is what score_keys bounds. */
    pgd_attn_item it = b.it[0];
    it.n_rows = 1;
    pgd_attn_scores s1 = b.sc[0];
    s1.rows = 1;
    p.select_pages = 4;
    p.score_keys = 3 * 16 + 12; /* 300 = 18 full pages + 12 */
    T_OK(pgd_attn_create(f.c, &p, &a));
    memset(s1.scores, 0, (size_t)2 * s1.ld * sizeof(float));
    T_OK(pgd_attn_run_scored(a, 0, &it, &s1, 1));
    uint32_t nz = 0;
    for (uint32_t j = 0; j < 300; j++)
        nz += s1.scores[j] != 0.0f;
    T_EQ(nz, 60); /* head 0 scores its 60 selected keys only */
    pgd_attn_destroy(a);
    p.score_keys = 3 * 16 + 11;
    T_OK(pgd_attn_create(f.c, &p, &a));
    T_EQ(pgd_attn_run_scored(a, 0, &it, &s1, 1), PGD_EINVAL);
    pgd_attn_destroy(a);
    free(x);
    sb_free(&f, &b);
    fx_deinit(&f);
    return 0;
}

/* ---- dead slots of a compacted sequence ---- */

/* K/V of a sequence kept by the test: [n_layers][len][n_kv][hd] each. */
typedef struct rows {
    float *k, *v;
    uint32_t len;
} rows;

static float *row_at(const fx *f, float *base, uint32_t len, uint32_t l, uint32_t pos)
{
    return base + ((size_t)l * len + pos) * f->n_kv * f->hd;
}

/* Random rows (channel offsets as fx_extend's). */
static int rows_make(fx *f, rows *r, uint32_t len)
{
    const size_t n = (size_t)f->n_layers * len * f->n_kv * f->hd;
    r->len = len;
    r->k = malloc(n * sizeof *r->k);
    r->v = malloc(n * sizeof *r->v);
    if (!r->k || !r->v) return -1;
    for (size_t i = 0; i < n; i++) {
        r->k[i] = fx_rand(&f->rng) * 1.5f + 0.3f * (float)((i % f->hd) % 5) - 0.6f;
        r->v[i] = fx_rand(&f->rng);
    }
    return 0;
}

/* Appends rows [from, from + n) of r to s (every layer). */
static int rows_write(fx *f, pgd_seq *s, const rows *r, uint32_t from, uint32_t n)
{
    const uint64_t pos0 = pgd_seq_length(f->c, s);
    T_OK(pgd_seq_grow(f->c, s, n));
    for (uint32_t l = 0; l < f->n_layers; l++)
        T_OK(pgd_seq_write_kv(f->c, s, pos0, n, l, row_at(f, r->k, r->len, l, from),
                              row_at(f, r->v, r->len, l, from)));
    return 0;
}

enum { MK_KV = 4, MK_N = 700, MK_OUT = 300, MK_NEW = 40 };

/* A sequence of MK_N rows compacted to MK_OUT slots (head 0 of the last layer keeps all of
 * them, head 1 three, then 150 and 297: most of head 1's slots are dead, whole blocks and
 * ranges of them), then MK_NEW new rows appended. keep[(l * MK_KV + h) * MK_OUT + j]. */
static pgd_seq *compacted(fx *f, const rows *old, const rows *fresh, uint32_t *keep, uint32_t *live)
{
    static const uint32_t lv[2][MK_KV] = {{MK_OUT, 200, 100, 17}, {MK_OUT, 3, 150, 297}};
    pgd_seq *s = NULL;
    if (pgd_seq_create(f->c, NULL, 0, &s) != PGD_OK) return NULL;
    if (rows_write(f, s, old, 0, MK_N)) return NULL;
    for (uint32_t l = 0; l < 2; l++)
        for (uint32_t h = 0; h < MK_KV; h++) {
            const uint32_t i = l * MK_KV + h, n = lv[l][h];
            live[i] = n;
            for (uint32_t t = 0, got = 0; t < MK_N && got < n; t++)
                if (t_rand(&f->rng) % (MK_N - t) < n - got) keep[i * MK_OUT + got++] = t;
        }
    if (pgd_seq_compact(f->c, s, MK_OUT, keep, MK_OUT, live) < 0) return NULL;
    if (rows_write(f, s, fresh, 0, MK_NEW)) return NULL;
    return s;
}

/* The live rows of (layer 1, KV head h) then the new rows, as a sequence of its own: its
 * row j < live holds old row keep[j] (every head), then fresh rows. */
static pgd_seq *live_only(fx *f, const rows *old, const rows *fresh, const uint32_t *keep,
                          uint32_t live)
{
    rows r;
    pgd_seq *s = NULL;
    if (pgd_seq_create(f->c, NULL, 0, &s) != PGD_OK) return NULL;
    r.len = live;
    const size_t row = (size_t)f->n_kv * f->hd;
    r.k = malloc((size_t)f->n_layers * live * row * sizeof *r.k);
    r.v = malloc((size_t)f->n_layers * live * row * sizeof *r.v);
    for (uint32_t l = 0; r.k && r.v && l < f->n_layers; l++)
        for (uint32_t j = 0; j < live; j++) {
            memcpy(row_at(f, r.k, live, l, j), row_at(f, old->k, old->len, l, keep[j]),
                   row * sizeof(float));
            memcpy(row_at(f, r.v, live, l, j), row_at(f, old->v, old->len, l, keep[j]),
                   row * sizeof(float));
        }
    int bad = !r.k || !r.v || rows_write(f, s, &r, 0, live) || rows_write(f, s, fresh, 0, MK_NEW);
    free(r.k);
    free(r.v);
    if (bad) {
        pgd_seq_destroy(f->c, s);
        return NULL;
    }
    return s;
}

/* Runs rows n_rows of seq (all scored) on the fast path (params p) or the reference (a
 * NULL), layer 1: out [n_rows][n_head][hd], scores [MK_KV][ld]. */
static int run_one(fx *f, pgd_attn *a, const pgd_attn_params *p, pgd_seq *seq, uint32_t n_rows,
                   const float *q, float *out, float *scores, size_t ld)
{
    pgd_attn_item it = {seq, n_rows, q, out};
    pgd_attn_scores sc = {scores, n_rows, ld};
    memset(scores, 0, (size_t)MK_KV * ld * sizeof *scores);
    if (a) return pgd_attn_run_scored(a, 1, &it, &sc, 1);
    return pgd_attn_run_ref_scored(f->c, p->n_head, 1, &it, &sc, 1, p->select_pages);
}

/* A compacted sequence with dead slots attends exactly like, for each KV head, a sequence
 * holding only its live rows (1e-6), in both paths, for decode rows and a prefill chunk of
 * the new rows, whole or split into ranges of 2 pages (ranges of dead slots only), on one
 * thread or three; its dead slots score 0 and the live ones score like the live-only
 * sequence's. Codecs whose rows move as bytes: f32, f16, q8_0 (head_dim 64; the scalar
 * kernels). */
static int test_mask_attends_like_live_rows(void)
{
    static const pgd_kv_type types[] = {PGD_KV_F32, PGD_KV_F16, PGD_KV_Q8_0};
    for (uint32_t ti = 0; ti < 3; ti++) {
        const uint32_t G = 4, n_head = G * MK_KV, hd = 64;
        fx f;
        T_OK(fx_init(&f, types[ti], 2, MK_KV, hd, 16, 600, 0, 0, 91 + ti));
        rows old, fresh;
        T_OK(rows_make(&f, &old, MK_N));
        T_OK(rows_make(&f, &fresh, MK_NEW));
        uint32_t *keep = malloc((size_t)2 * MK_KV * MK_OUT * sizeof *keep), live[2 * MK_KV];
        T_ASSERT(keep);
        pgd_seq *s = compacted(&f, &old, &fresh, keep, live);
        T_ASSERT(s != NULL);
        uint32_t mlen;
        const uint32_t *nl;
        pgd__seq_mask(s, &mlen, &nl);
        T_EQ(mlen, MK_OUT);
        T_ASSERT(nl && nl[MK_KV + 1] == 3);
        const size_t ld = MK_OUT + MK_NEW, one = (size_t)MK_NEW * n_head * hd;
        float *q = fx_queries(&f, MK_NEW, n_head);
        float *oa = malloc(one * sizeof *oa), *orf = malloc(one * sizeof *orf);
        float *sa = malloc(MK_KV * ld * sizeof *sa), *sr = malloc(MK_KV * ld * sizeof *sr);
        T_ASSERT(q && oa && orf && sa && sr);
        fx_exec ex = {.n_threads = 3};
        for (int cfg = 0; cfg < 6; cfg++) {
            /* cfg / 2: 0 reference, 1 fast, 2 fast on 3 threads with ranges of 2 pages;
             * cfg % 2: the prefill chunk of the new rows, or the last row alone */
            const uint32_t n_rows = cfg % 2 ? 1 : MK_NEW;
            const float *qr = q + (size_t)(MK_NEW - n_rows) * n_head * hd;
            pgd_attn_params p = pgd_attn_default_params();
            p.n_head = n_head;
            p.score_keys = (uint32_t)ld;
            if (cfg / 2 == 2) {
                p.n_threads = 3;
                p.parallel = fx_parallel;
                p.parallel_ud = &ex;
                p.parallel_min_work = 1; /* on the threads however small the run */
                p.split_pages = 2;
            }
            pgd_attn *a = NULL;
            if (cfg / 2) T_OK(pgd_attn_create(f.c, &p, &a));
            /* q8_0's SIMD v_accum rounds the weights of each call to int16, so pages holding
             * other keys round differently: its exact kernels here (its SIMD ones against
             * the reference in test_mask_fast_vs_ref). */
            if (a && types[ti] == PGD_KV_Q8_0) T_OK(pgd__attn_force_isa(a, PGD__ATTN_SCALAR));
            T_OK(run_one(&f, a, &p, s, n_rows, qr, oa, sa, ld));
            if (a) {
                /* Unscored, the ranges of dead slots are pieces of their own (split). */
                float *o2 = malloc(one * sizeof *o2);
                pgd_attn_item it = {s, n_rows, qr, o2};
                T_OK(pgd_attn_run(a, 1, &it, 1));
                T_ASSERT(memcmp(o2, oa, (size_t)n_rows * n_head * hd * sizeof *o2) == 0);
                free(o2);
            }
            for (uint32_t h = 0; h < MK_KV; h++) {
                const uint32_t n = live[MK_KV + h];
                const uint32_t *kh = keep + (size_t)(MK_KV + h) * MK_OUT;
                pgd_seq *r = live_only(&f, &old, &fresh, kh, n);
                T_ASSERT(r != NULL);
                T_OK(run_one(&f, a, &p, r, n_rows, qr, orf, sr, ld));
                double worst = 0;
                for (uint32_t t = 0; t < n_rows; t++)
                    for (uint32_t x = 0; x < G * hd; x++) {
                        const size_t o = ((size_t)t * n_head + h * G) * hd + x;
                        const double e = fabs((double)oa[o] - orf[o]);
                        worst = e > worst ? e : worst;
                    }
                if (!(worst <= 1e-6))
                    T_FAIL("%s cfg %d head %u (live %u): output differs by %g",
                           pgd_kv_type_name(types[ti]), cfg, h, n, worst);
                const float *x = sa + (size_t)h * ld, *y = sr + (size_t)h * ld;
                for (uint32_t j = n; j < MK_OUT; j++)
                    if (x[j] != 0.0f)
                        T_FAIL("%s cfg %d head %u: dead slot %u scores %g",
                               pgd_kv_type_name(types[ti]), cfg, h, j, x[j]);
                double ws = 0;
                for (uint32_t j = 0; j < n + MK_NEW; j++) {
                    const float xs = j < n ? x[j] : x[MK_OUT + j - n];
                    const double e = fabs((double)xs - y[j]) / (fabs((double)y[j]) + 1e-6);
                    ws = e > ws ? e : ws;
                }
                if (!(ws <= 1e-5))
                    T_FAIL("%s cfg %d head %u: live scores differ, rel %g",
                           pgd_kv_type_name(types[ti]), cfg, h, ws);
                pgd_seq_destroy(f.c, r);
            }
            pgd_attn_destroy(a);
        }
        T_OK(pgd_cache_check(f.c));
        pgd_seq_destroy(f.c, s);
        free(keep);
        free(q);
        free(oa);
        free(orf);
        free(sa);
        free(sr);
        free(old.k);
        free(old.v);
        free(fresh.k);
        free(fresh.v);
        fx_deinit(&f);
    }
    return 0;
}

/* Every codec (staged kivi2 too), rotation, Quest (selection first, dead slots masked after
 * it): on a compacted sequence the fast path's outputs and scores match the reference's,
 * and dead slots score 0 in both. */
static int test_mask_fast_vs_ref(void)
{
    const int nt = n_types();
    for (int ti = 0; ti < nt; ti++) {
        for (int variant = 0; variant < 2; variant++) {
            const uint32_t G = 2, n_head = G * MK_KV;
            fx f;
            T_OK(fx_init(&f, (pgd_kv_type)ti, 2, MK_KV, 64, 16, 600, variant, variant, 7 + ti));
            rows old, fresh;
            T_OK(rows_make(&f, &old, MK_N));
            T_OK(rows_make(&f, &fresh, MK_NEW));
            uint32_t *keep = malloc((size_t)2 * MK_KV * MK_OUT * sizeof *keep), live[2 * MK_KV];
            pgd_seq *s = compacted(&f, &old, &fresh, keep, live);
            T_ASSERT(keep && s != NULL);
            const size_t ld = MK_OUT + MK_NEW, one = (size_t)MK_NEW * n_head * 64;
            float *q = fx_queries(&f, MK_NEW, n_head);
            float *o1 = malloc(one * sizeof *o1), *o2 = malloc(one * sizeof *o2);
            float *s1 = malloc(MK_KV * ld * sizeof *s1), *s2 = malloc(MK_KV * ld * sizeof *s2);
            for (uint32_t n_rows = 1; n_rows <= MK_NEW; n_rows += MK_NEW - 1) {
                const float *qr = q + (size_t)(MK_NEW - n_rows) * n_head * 64;
                pgd_attn_params p = pgd_attn_default_params();
                p.n_head = n_head;
                p.score_keys = (uint32_t)ld;
                p.select_pages = variant ? 6 : 0;
                pgd_attn *a;
                T_OK(pgd_attn_create(f.c, &p, &a));
                T_OK(pgd__attn_force_isa(a, PGD__ATTN_SCALAR));
                T_OK(run_one(&f, a, &p, s, n_rows, qr, o1, s1, ld));
                T_OK(run_one(&f, NULL, &p, s, n_rows, qr, o2, s2, ld));
                const size_t no = (size_t)n_rows * n_head * 64;
                const double e = fx_nmse(o1, o2, no);
                if (!(e <= 1e-10))
                    T_FAIL("%s variant %d rows %u: nmse %g", pgd_kv_type_name((pgd_kv_type)ti),
                           variant, n_rows, e);
                const double r = worst_rel(s1, s2, MK_KV * ld, 1e-6);
                if (!(r <= 1e-5))
                    T_FAIL("%s variant %d rows %u: scores rel %g",
                           pgd_kv_type_name((pgd_kv_type)ti), variant, n_rows, r);
                for (uint32_t h = 0; h < MK_KV; h++)
                    for (uint32_t j = live[MK_KV + h]; j < MK_OUT; j++)
                        T_ASSERT(s1[h * ld + j] == 0.0f && s2[h * ld + j] == 0.0f);
                /* The CPU's kernels too (block codecs: their output bound). */
                pgd_attn_destroy(a);
                T_OK(pgd_attn_create(f.c, &p, &a));
                T_OK(run_one(&f, a, &p, s, n_rows, qr, o1, s1, ld));
                T_ASSERT(fx_nmse(o1, o2, no) <= 3e-4 && fx_nmse(s1, s2, MK_KV * ld) <= 3e-4);
                for (uint32_t h = 0; h < MK_KV; h++)
                    for (uint32_t j = live[MK_KV + h]; j < MK_OUT; j++)
                        T_ASSERT(s1[h * ld + j] == 0.0f);
                pgd_attn_destroy(a);
            }
            pgd_seq_destroy(f.c, s);
            free(keep);
            free(q);
            free(o1);
            free(o2);
            free(s1);
            free(s2);
            free(old.k);
            free(old.v);
            free(fresh.k);
            free(fresh.v);
            fx_deinit(&f);
        }
    }
    return 0;
}

int main(void)
{
    T_RUN(test_scores_match_reference);
    T_RUN(test_scores_staged_small_heads);
    T_RUN(test_scores_deterministic);
    T_RUN(test_scores_accumulate);
    T_RUN(test_scores_errors);
    T_RUN(test_mask_attends_like_live_rows);
    T_RUN(test_mask_fast_vs_ref);
    T_DONE();
}
