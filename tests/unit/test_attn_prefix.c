/* SPDX-License-Identifier: MIT */
/*
 * test_attn_prefix.c - shared tiles of the fast attention path (attn.c, "Shared prefix"):
 * decode rows of sequences forked from or prefix-matched to a common prefix read the shared
 * pages once per step for all of them. Checks, for f16, q8_0, q4_0 and kivi2 (staged),
 * plain and kv_rotate pools, GQA 4 (one shared tile) and GQA 16 (several), 1 and 2 threads,
 * split_pages forced or not, the CPU's best ISA level and forced AVX2:
 *   - every row of the batch gives the same bits as the row alone (batch invariance) and as
 *     the batch with shared tiles off (pgd__attn_set_shared);
 *   - the batch is within the fast-vs-reference bound of pgd_attn_run_ref;
 *   - the sharing happened: pgd__attn_stats counts saved page reads, and the reads of the
 *     batch with sharing plus the saved ones are exactly the reads without it.
 */
#include "attn_fixture.h"

#include "attn/attn_int.h"

enum { N_SEQ = 10, PREFIX = 200 };

typedef struct pset {
    fx f;
    uint32_t n_head;
    pgd_seq *s[N_SEQ];
    pgd_attn_item it[N_SEQ];
    size_t total; /* output floats of the whole batch */
} pset;

static void pset_free(pset *ps)
{
    for (uint32_t i = 0; i < N_SEQ; i++) {
        free((void *)ps->it[i].q);
        free(ps->it[i].out);
        if (ps->s[i]) pgd_seq_destroy(ps->f.c, ps->s[i]);
    }
    fx_deinit(&ps->f);
}

static void fill_tokens(int32_t *t, uint32_t n, int32_t base)
{
    for (uint32_t i = 0; i < n; i++)
        t[i] = base + (int32_t)i * 7 + 1;
}

/* The sequences: 0 the prefix itself (PREFIX tokens: its last page is partial), 1 a fork
 * of it that was not extended (the same pages, the same last row), 2, 3, 4, 8, 9 forks
 * extended by 3 (still in the prefix's last page, copied on write), 45, 300 (a long own
 * tail), 17 and 64 tokens; 5 a prefix match (the whole pages) extended by 21; 6 a fork of
 * 4 (sharing more pages with 4 than with the rest) extended by 10; 7 a sequence of its own
 * (no sharing). */
static int pset_make(pset *ps, pgd_kv_type type, int rotate, uint32_t n_head, uint64_t seed)
{
    memset(ps, 0, sizeof *ps);
    ps->n_head = n_head;
    T_OK(fx_init(&ps->f, type, 2, 2, 64, 16, 900, rotate, 0, seed));
    fx *f = &ps->f;
    int32_t toks[PREFIX + 300];
    fill_tokens(toks, PREFIX, 0);
    ps->s[0] = fx_seq(f, PREFIX);
    T_ASSERT(ps->s[0] != NULL);
    T_OK(pgd_seq_commit(f->c, ps->s[0], toks, PREFIX));
    static const uint32_t ext[N_SEQ] = {0, 0, 3, 45, 300, 21, 10, 0, 17, 64};
    for (uint32_t i = 1; i < N_SEQ; i++) {
        if (i == 5) {
            T_OK(pgd_seq_create(f->c, NULL, 0, &ps->s[i]));
            T_EQ(pgd_seq_match(f->c, ps->s[i], toks, PREFIX), PREFIX / 16 * 16);
        } else if (i == 6) {
            fill_tokens(toks + PREFIX, 300, 5000);
            T_OK(pgd_seq_commit(f->c, ps->s[4], toks + PREFIX, 300));
            T_OK(pgd_seq_fork(f->c, ps->s[4], &ps->s[i]));
        } else if (i == 7) {
            ps->s[i] = fx_seq(f, 230);
            T_ASSERT(ps->s[i] != NULL);
            continue;
        } else {
            T_OK(pgd_seq_fork(f->c, ps->s[0], &ps->s[i]));
        }
        if (ext[i]) T_OK(fx_extend(f, ps->s[i], ext[i]));
    }
    const uint32_t *p0, *p4, *p6;
    pgd_seq_pages(f->c, ps->s[0], &p0);
    pgd_seq_pages(f->c, ps->s[4], &p4);
    pgd_seq_pages(f->c, ps->s[6], &p6);
    T_EQ(p0[0], p4[0]);
    T_EQ(p4[20], p6[20]);
    for (uint32_t i = 0; i < N_SEQ; i++) {
        ps->it[i].seq = ps->s[i];
        ps->it[i].n_rows = 1;
        ps->it[i].q = fx_queries(f, 1, n_head);
        ps->it[i].out = calloc((size_t)n_head * f->hd, sizeof(float));
        T_ASSERT(ps->it[i].q && ps->it[i].out);
        ps->total += (size_t)n_head * f->hd;
    }
    return 0;
}

static void pset_out(const pset *ps, float *dst)
{
    const size_t m = (size_t)ps->n_head * ps->f.hd;
    for (uint32_t i = 0; i < N_SEQ; i++)
        memcpy(dst + i * m, ps->it[i].out, m * sizeof *dst);
}

static int make_attn(pset *ps, uint32_t threads, uint32_t split, float softcap, int isa,
                     fx_exec *ex, pgd_attn **a)
{
    pgd_attn_params p = pgd_attn_default_params();
    p.n_head = ps->n_head;
    p.n_threads = threads;
    p.split_pages = split;
    p.softcap = softcap;
    if (threads > 1) {
        p.parallel = fx_parallel;
        p.parallel_ud = ex;
        p.parallel_min_work = 1; /* on the threads however small the run */
    }
    T_OK(pgd_attn_create(ps->f.c, &p, a));
    if (isa >= 0) T_OK(pgd__attn_force_isa(*a, isa));
    return 0;
}

/* One configuration: batch with sharing, batch without, each row alone, the reference. */
static int check(pset *ps, uint32_t threads, uint32_t split, float softcap, int isa)
{
    const char *name = pgd_kv_type_name(ps->f.type);
    const size_t m = (size_t)ps->n_head * ps->f.hd;
    fx_exec ex = {.n_threads = threads};
    pgd_attn *many, *alone;
    T_OK(make_attn(ps, threads, split, softcap, isa, &ex, &many));
    T_OK(make_attn(ps, 1, split, softcap, isa, &ex, &alone));
    float *on = malloc(ps->total * sizeof *on), *off = malloc(ps->total * sizeof *off);
    float *ref = malloc(ps->total * sizeof *ref);
    T_ASSERT(on && off && ref);
    const uint32_t layer = 1;

    uint64_t r0, s0, r1, s1, r2, s2;
    pgd__attn_stats(many, &r0, &s0);
    T_OK(pgd_attn_run(many, layer, ps->it, N_SEQ));
    pgd__attn_stats(many, &r1, &s1);
    pset_out(ps, on);
    pgd__attn_set_shared(many, 0);
    T_OK(pgd_attn_run(many, layer, ps->it, N_SEQ));
    pgd__attn_stats(many, &r2, &s2);
    pset_out(ps, off);
    /* Sharing happened, and saved exactly the reads that the batch without it made more. */
    if (!(s1 - s0 > 0)) T_FAIL("%s: no page read was shared", name);
    T_EQ(s2, s1);
    T_EQ(r2 - r1, (r1 - r0) + (s1 - s0));
    if (memcmp(on, off, ps->total * sizeof *on) != 0)
        T_FAIL("%s threads %u split %u isa %d: shared tiles change the bits", name, threads, split,
               isa);
    for (uint32_t i = 0; i < N_SEQ; i++) {
        T_OK(pgd_attn_run(alone, layer, &ps->it[i], 1));
        if (memcmp(on + i * m, ps->it[i].out, m * sizeof *on) != 0)
            T_FAIL("%s threads %u split %u isa %d: seq %u alone differs from the batch", name,
                   threads, split, isa, i);
    }
    pgd_attn_params rp = pgd_attn_default_params();
    rp.n_head = ps->n_head;
    rp.softcap = softcap;
    T_OK(pgd_attn_run_ref_ex(ps->f.c, &rp, layer, ps->it, NULL, N_SEQ));
    pset_out(ps, ref);
    const double e = fx_nmse(on, ref, ps->total);
    const double bound = ps->f.type == PGD_KV_F16 ? 1e-10 : 3e-4;
    for (size_t i = 0; i < ps->total; i++)
        T_ASSERT(isfinite(on[i]));
    if (!(e <= bound)) T_FAIL("%s: nmse %g against the reference", name, e);
    free(on);
    free(off);
    free(ref);
    pgd_attn_destroy(many);
    pgd_attn_destroy(alone);
    return 0;
}

static int test_shared_prefix_batch_invariant(void)
{
    static const pgd_kv_type types[] = {PGD_KV_F16, PGD_KV_Q8_0, PGD_KV_Q4_0, PGD_KV_KIVI2};
    static const uint32_t heads[] = {8, 32}; /* 2 KV heads: GQA 4 (one tile), 16 (three) */
    for (uint32_t ti = 0; ti < sizeof types / sizeof *types; ti++)
        for (int rot = 0; rot < 2; rot++)
            for (uint32_t hi = 0; hi < 2; hi++) {
                pset ps;
                T_OK(pset_make(&ps, types[ti], rot, heads[hi],
                               31 + ti * 4 + (uint32_t)rot * 2 + hi));
                for (uint32_t threads = 1; threads <= 2; threads++)
                    for (uint32_t split = 0; split <= 2; split += 2)
                        for (int isa = -1; isa <= PGD__ATTN_AVX2; isa += PGD__ATTN_AVX2 + 1) {
                            if (isa >= 0 && !pgd__attn_softmax_step(isa)) continue;
                            if (check(&ps, threads, split, 0.0f, isa)) {
                                fprintf(stderr, "  (%s rotate %d n_head %u)\n",
                                        pgd_kv_type_name(types[ti]), rot, heads[hi]);
                                return 1;
                            }
                        }
                /* Gemma2's soft-cap on the shared tiles' scores. */
                T_OK(check(&ps, 2, 2, 30.0f, -1));
                T_OK(pgd_cache_check(ps.f.c));
                pset_free(&ps);
            }
    return 0;
}

/* Rows that may not share plan as before: a window layer, Quest selections, and a batch
 * with sharing off save nothing (and still give the rows' bits). */
static int test_not_shared(void)
{
    pset ps;
    T_OK(pset_make(&ps, PGD_KV_F16, 0, 8, 99));
    uint32_t win[2] = {64, 64};
    pgd_attn_params p = pgd_attn_default_params();
    p.n_head = 8;
    p.layer_window = win;
    pgd_attn *a;
    T_OK(pgd_attn_create(ps.f.c, &p, &a));
    T_OK(pgd_attn_run(a, 1, ps.it, N_SEQ));
    uint64_t r, s;
    pgd__attn_stats(a, &r, &s);
    T_ASSERT(r > 0);
    T_EQ(s, 0);
    pgd_attn_destroy(a);
    pset_free(&ps);
    return 0;
}

/* A mixed batch: the shared decode rows, a prefill chunk of 20 rows of a fork (its tiles
 * plan after the shared ones) and a scored decode row of another fork (never in a shared
 * tile): every output and the scores are the bits of each item alone, on 2 threads. */
static int test_mixed_batch(void)
{
    pset ps;
    T_OK(pset_make(&ps, PGD_KV_Q8_0, 0, 8, 7));
    fx *f = &ps.f;
    enum { N = N_SEQ + 2 };
    pgd_seq *extra[2];
    pgd_attn_item it[N];
    memcpy(it, ps.it, sizeof ps.it);
    for (int k = 0; k < 2; k++) {
        T_OK(pgd_seq_fork(f->c, ps.s[0], &extra[k]));
        T_OK(fx_extend(f, extra[k], 40));
        const uint32_t rows = k == 0 ? 20 : 1;
        it[N_SEQ + k] = (pgd_attn_item){extra[k], rows, fx_queries(f, rows, 8),
                                        calloc((size_t)rows * 8 * f->hd, sizeof(float))};
        T_ASSERT(it[N_SEQ + k].q && it[N_SEQ + k].out);
    }
    const size_t len = PREFIX + 40;
    pgd_attn_scores sc[N];
    memset(sc, 0, sizeof sc);
    float *scores = calloc(2 * len, sizeof *scores), *scores1 = calloc(2 * len, sizeof *scores);
    T_ASSERT(scores && scores1);
    sc[N - 1] = (pgd_attn_scores){scores, 1, len};
    fx_exec ex = {.n_threads = 2};
    pgd_attn_params p = pgd_attn_default_params();
    p.n_head = 8;
    p.score_keys = (uint32_t)len;
    pgd_attn *alone, *many;
    T_OK(pgd_attn_create(f->c, &p, &alone));
    p.n_threads = 2;
    p.parallel = fx_parallel;
    p.parallel_ud = &ex;
    p.parallel_min_work = 1; /* on the threads however small the run */
    T_OK(pgd_attn_create(f->c, &p, &many));
    T_OK(pgd_attn_run_scored(many, 1, it, sc, N));
    uint64_t r, saved;
    pgd__attn_stats(many, &r, &saved);
    T_ASSERT(saved > 0);
    for (uint32_t i = 0; i < N; i++) {
        const size_t m = (size_t)it[i].n_rows * 8 * f->hd;
        float *x = malloc(m * sizeof *x);
        T_ASSERT(x);
        memcpy(x, it[i].out, m * sizeof *x);
        pgd_attn_scores one = sc[i];
        if (one.scores) one.scores = scores1;
        T_OK(pgd_attn_run_scored(alone, 1, &it[i], &one, 1));
        if (memcmp(x, it[i].out, m * sizeof *x) != 0) T_FAIL("item %u: alone differs", i);
        free(x);
    }
    T_ASSERT(memcmp(scores, scores1, 2 * len * sizeof *scores) == 0);
    pgd_attn_destroy(alone);
    pgd_attn_destroy(many);
    for (int k = 0; k < 2; k++) {
        free((void *)it[N_SEQ + k].q);
        free(it[N_SEQ + k].out);
        pgd_seq_destroy(f->c, extra[k]);
    }
    free(scores);
    free(scores1);
    pset_free(&ps);
    return 0;
}

int main(void)
{
    T_RUN(test_shared_prefix_batch_invariant);
    T_RUN(test_not_shared);
    T_RUN(test_mixed_batch);
    T_DONE();
}
