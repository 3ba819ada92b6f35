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
                uint32_t len[5] = {900, 161, 40, 300, 75}, rows[5] = {1, 1, 40, 33, 1},
                         srows[5] = {1, 1, 13, 33, 0};
                sbatch b;
                T_OK(sb_make(&f, &b, G * n_kv, 5, len, rows, srows));
                pgd_attn_params p = pgd_attn_default_params();
                p.n_head = G * n_kv;
                p.score_keys = 1000;
                p.split_pages = variant & 1 ? 3 : 0;
                p.select_pages = quest ? 8 : 0;
                for (int isa = -1; isa <= 0; isa++) {
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
            fx_exec ex = {nth};
            p.n_threads = nth;
            p.parallel = fx_parallel;
            p.parallel_ud = &ex;
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

int main(void)
{
    T_RUN(test_scores_match_reference);
    T_RUN(test_scores_staged_small_heads);
    T_RUN(test_scores_deterministic);
    T_RUN(test_scores_accumulate);
    T_RUN(test_scores_errors);
    T_DONE();
}
