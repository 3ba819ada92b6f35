/* SPDX-License-Identifier: MIT */
/*
 * test_cache_compact.c - pgd_seq_compact (cache.h "compaction"): for every kv type, the
 * compacted slots hold the kept rows and attention over the compacted sequence equals
 * attention over a fresh sequence written with only the kept rows (bit for bit: row codecs
 * move bytes; staged codecs re-encode from the f16 rows they still hold, which a fresh
 * write encodes too), before and after more writes; shared prefix pages are untouched
 * (bytes, refcounts, and a later match); freed pages and the stats; commit registers
 * nothing after; fork and truncate of a compacted sequence; Quest key bounds; errors leave
 * the sequence unchanged; the dead-slot mask (pgd__seq_mask) and pgd_seq_n_dropped.
 */
#include <math.h>
#include <pthread.h>

#include <pagoda/attn.h>
#include <pagoda/cache.h>
#include <pagoda/tier.h>

#include "pgd_int.h"
#include "t.h"
#include "t_alloc.h"
#include "t_tier.h"

enum { NL = 2, NH = 2, NCOL = NL * NH, PT = 16, NHEAD = 4, N = 75, NEW = 20, ROWS = 3 };

static const uint8_t test_key[32] = "0123456789abcdef0123456789abcdef";

static void log_quiet(void *ud, int level, const char *msg)
{
    (void)ud;
    if (level <= PGD_LOG_WARN && getenv("PGD_TEST_VERBOSE"))
        fprintf(stderr, "  [pagoda %d] %s\n", level, msg);
}

typedef struct geom {
    pgd_kv_type type;
    uint32_t hd;
    int rotate, bounds, metadata;
    uint32_t n_pages, kv_residual;
    const pgd_allocator *alloc; /* NULL: libc */
} geom;

static const pgd_tier_use *g_tiers; /* the tiers of the next make_cache */

static pgd_cache *make_cache(const geom *g)
{
    pgd_cache_params p = pgd_cache_default_params();
    p.pool.n_layers = NL;
    p.pool.n_kv_heads = NH;
    p.pool.head_dim = g->hd;
    p.pool.page_tokens = PT;
    p.pool.kv_type = g->type;
    p.pool.capacity_pages = g->n_pages ? g->n_pages : 64;
    p.pool.kv_rotate = g->rotate;
    p.pool.rotate_seed = 99;
    p.pool.key_bounds = g->bounds;
    p.pool.metadata_only = g->metadata;
    p.kv_residual = g->kv_residual;
    p.alloc = g->alloc;
    p.tiers = g_tiers;
    p.n_tiers = g_tiers ? 1 : 0;
    p.hash_key = test_key;
    p.hash_key_len = sizeof test_key;
    p.log = log_quiet;
    pgd_cache *c = NULL;
    if (pgd_cache_create(&p, &c) != PGD_OK) return NULL;
    return c;
}

static pgd_cache_stats stats(pgd_cache *c)
{
    pgd_cache_stats st;
    pgd_cache_get_stats(c, &st);
    return st;
}

static float frand(uint64_t *s)
{
    return (float)((t_rand(s) >> 40) * 0x1p-24 * 2.0 - 1.0);
}

/* K/V rows of every layer: [NL][n][NH][hd]. */
typedef struct kv {
    uint32_t hd, n;
    float *k, *v;
} kv;

static int kv_init(kv *d, uint32_t hd, uint32_t n)
{
    d->hd = hd;
    d->n = n;
    d->k = calloc((size_t)NL * n * NH * hd, sizeof(float));
    d->v = calloc((size_t)NL * n * NH * hd, sizeof(float));
    return d->k && d->v ? 0 : -1;
}

static void kv_free(kv *d)
{
    free(d->k);
    free(d->v);
}

static size_t kv_at(const kv *d, uint32_t l, uint32_t p, uint32_t h)
{
    return (((size_t)l * d->n + p) * NH + h) * d->hd;
}

static void kv_fill(kv *d, uint64_t seed)
{
    uint64_t st = seed | 1;
    for (size_t i = 0; i < (size_t)NL * d->n * NH * d->hd; i++) {
        float m = (i / d->hd) % 5 == 3 ? 3.0f : 0.7f; /* rows of unlike magnitudes */
        d->k[i] = frand(&st) * m;
        d->v[i] = frand(&st) * m;
    }
}

/* out's slot j of (l, h) is d's row keep[(l * NH + h) * ld + j]; dead slots are zeros. */
static void kv_gather(kv *out, const kv *d, uint32_t n_out, const uint32_t *keep, size_t ld,
                      const uint32_t *n_live)
{
    for (uint32_t l = 0; l < NL; l++)
        for (uint32_t h = 0; h < NH; h++) {
            uint32_t i = l * NH + h, n = n_live ? n_live[i] : n_out;
            for (uint32_t j = 0; j < n_out; j++) {
                size_t o = kv_at(out, l, j, h);
                if (j >= n) {
                    memset(out->k + o, 0, d->hd * sizeof(float));
                    memset(out->v + o, 0, d->hd * sizeof(float));
                    continue;
                }
                size_t s = kv_at(d, l, keep[i * ld + j], h);
                memcpy(out->k + o, d->k + s, d->hd * sizeof(float));
                memcpy(out->v + o, d->v + s, d->hd * sizeof(float));
            }
        }
}

/* Writes d's rows [r0, r1) at positions pos0.. of s, in chunks of `chunk` rows (0: one
 * call), every layer per chunk (as a forward pass does); grows s first. */
static int write_rows(pgd_cache *c, pgd_seq *s, const kv *d, uint32_t r0, uint32_t r1,
                      uint64_t pos0, uint32_t chunk)
{
    for (uint32_t r = r0; r < r1;) {
        uint32_t n = chunk && chunk < r1 - r ? chunk : r1 - r;
        uint64_t p = pos0 + (r - r0), len = pgd_seq_length(c, s);
        if (len < p + n) T_OK(pgd_seq_grow(c, s, p + n - len));
        for (uint32_t l = 0; l < NL; l++)
            T_OK(pgd_seq_write_kv(c, s, p, n, l, d->k + kv_at(d, l, r, 0),
                                  d->v + kv_at(d, l, r, 0)));
        r += n;
    }
    return 0;
}

/* Random ascending distinct lists of n_out slots below len for every (l, h), the first
 * `sink` slots kept in place (pages kept whole when sink >= PT). keep[NCOL][ld]. */
static void make_lists(uint64_t *st, uint32_t *keep, size_t ld, uint32_t len, uint32_t n_out,
                       uint32_t sink, const uint32_t *n_live)
{
    for (uint32_t i = 0; i < NCOL; i++) {
        uint32_t n = n_live ? n_live[i] : n_out, got = 0;
        for (uint32_t t = 0; t < len && got < n; t++) {
            uint32_t need = n - got, left = len - t;
            if (t < sink || t_rand(st) % left < need) keep[i * ld + got++] = t;
        }
    }
}

/* Attention of s's last `rows` rows, fast path and reference, every layer:
 * out[2][NL][rows][NHEAD][hd]. */
static int attend(pgd_cache *c, pgd_seq *s, uint32_t hd, const float *q, uint32_t rows,
                  uint32_t select_pages, float *out)
{
    const size_t one = (size_t)rows * NHEAD * hd;
    pgd_attn_params ap = pgd_attn_default_params();
    ap.n_head = NHEAD;
    ap.select_pages = select_pages;
    pgd_attn *a;
    T_OK(pgd_attn_create(c, &ap, &a));
    for (uint32_t l = 0; l < NL; l++) {
        pgd_attn_item it = {s, rows, q, out + l * one};
        T_OK(pgd_attn_run(a, l, &it, 1));
        it.out = out + (NL + l) * one;
        T_OK(pgd_attn_run_ref(c, NHEAD, l, &it, 1, select_pages));
    }
    pgd_attn_destroy(a);
    return 0;
}

static double nmse(const float *a, const float *b, size_t n)
{
    double e = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r += (double)b[i] * b[i];
    }
    return r > 0 ? e / r : e;
}

/* Compares the attention of s (cache c) and of ref (cache cr): bit for bit when tol is 0,
 * else within an NMSE of tol. */
static int same_attention(pgd_cache *c, pgd_seq *s, pgd_cache *cr, pgd_seq *ref, uint32_t hd,
                          uint32_t select_pages, double tol, const char *what)
{
    const size_t n = 2 * (size_t)NL * ROWS * NHEAD * hd;
    float *q = malloc((size_t)ROWS * NHEAD * hd * sizeof *q);
    float *o1 = malloc(n * sizeof *o1), *o2 = malloc(n * sizeof *o2);
    T_ASSERT(q && o1 && o2);
    uint64_t st = 777;
    for (size_t i = 0; i < (size_t)ROWS * NHEAD * hd; i++)
        q[i] = frand(&st) * 2.0f;
    T_OK(attend(c, s, hd, q, ROWS, select_pages, o1));
    T_OK(attend(cr, ref, hd, q, ROWS, select_pages, o2));
    int bad = tol == 0 ? memcmp(o1, o2, n * sizeof *o1) != 0 : !(nmse(o1, o2, n) < tol);
    double e = nmse(o1, o2, n);
    if (getenv("PGD_TEST_VERBOSE")) printf("     %s: attention nmse %g\n", what, e);
    free(q);
    free(o1);
    free(o2);
    if (bad) T_FAIL("%s: attention differs from the fresh sequence's (nmse %g)", what, e);
    return 0;
}

/* The decoded rows of the full pages (every slot of a row codec's pages) of s and ref agree:
 * bit for bit when tol is 0, else within an NMSE of tol (per region). */
static int same_rows(pgd_cache *c, pgd_seq *s, pgd_cache *cr, pgd_seq *ref, uint32_t hd, double tol,
                     const char *what)
{
    pgd_pool *p = pgd_cache_pool(c), *pr = pgd_cache_pool(cr);
    const pgd__codec *codec = pgd__pool_codec(p);
    const int staged = pgd__codec_staged(codec, hd);
    const uint32_t *ids, *idr;
    uint32_t np = pgd_seq_pages(c, s, &ids);
    T_EQ(np, pgd_seq_pages(cr, ref, &idr));
    uint64_t len = pgd_seq_length(c, s);
    T_EQ(len, pgd_seq_length(cr, ref));
    float *a = malloc((size_t)PT * hd * sizeof *a), *b = malloc((size_t)PT * hd * sizeof *b);
    T_ASSERT(a && b);
    int bad = 0;
    for (uint32_t k = 0; k < np && !bad; k++) {
        uint32_t n = len - (uint64_t)k * PT < PT ? (uint32_t)(len - (uint64_t)k * PT) : PT;
        if (staged && n < PT) break; /* a partial page of a staged pool lives in the ring */
        for (uint32_t l = 0; l < NL; l++)
            for (uint32_t kind = 0; kind < 2; kind++)
                for (uint32_t h = 0; h < NH; h++) {
                    const void *ra =
                        kind ? pgd_pool_v(p, ids[k], l, h) : pgd_pool_k(p, ids[k], l, h);
                    const void *rb =
                        kind ? pgd_pool_v(pr, idr[k], l, h) : pgd_pool_k(pr, idr[k], l, h);
                    codec->decode_rows((pgd__kv_kind)kind, ra, PT, hd, 0, n, a);
                    codec->decode_rows((pgd__kv_kind)kind, rb, PT, hd, 0, n, b);
                    if (tol == 0 ? memcmp(a, b, (size_t)n * hd * sizeof *a) != 0
                                 : !(nmse(a, b, (size_t)n * hd) < tol))
                        bad = 1;
                }
    }
    free(a);
    free(b);
    if (bad) T_FAIL("%s: compacted rows differ from the kept rows", what);
    return 0;
}

/* ---- every codec: rows, attention, pages, writes after ---- */

typedef struct codec_case {
    pgd_kv_type type;
    uint32_t hd;
    int rotate;
} codec_case;

static const codec_case cases[] = {
    {PGD_KV_F32, 64, 0},   {PGD_KV_F16, 64, 0},   {PGD_KV_F16, 64, 1},   {PGD_KV_BF16, 64, 0},
    {PGD_KV_Q8_0, 64, 0},  {PGD_KV_Q4_0, 64, 0},  {PGD_KV_Q8_0, 16, 0},  {PGD_KV_Q4_0, 16, 0},
    {PGD_KV_KIVI2, 64, 0}, {PGD_KV_KIVI2, 64, 1}, {PGD_KV_KIVI2, 16, 0}, {PGD_KV_F32, 16, 0},
};

/* One case: A gets N rows (one write, committed: 4 registered pages and a partial one) and
 * is compacted to n_out slots of random per-head lists (page 0 kept whole when sink >= PT);
 * R is a fresh sequence of the kept rows. Then both get NEW more rows. `exact`: the
 * compacted sequence must match R bit for bit (staged pools whose rows all sit in the
 * ring, and every row codec). chunk: A's write chunk (1 with a small ring: staged pools
 * decode old rows from the pool). */
static int run_case(const codec_case *cc, uint32_t n_out, uint32_t sink, uint32_t kv_residual,
                    uint32_t chunk, uint64_t seed)
{
    char what[96];
    geom g = {cc->type, cc->hd, cc->rotate, 0, 0, 64, kv_residual, NULL};
    pgd_cache *c = make_cache(&g), *cr = make_cache(&g);
    T_ASSERT(c && cr);
    const int staged = pgd__codec_staged(pgd__pool_codec(pgd_cache_pool(c)), cc->hd);
    /* Inexact: kept rows decoded from the pool and encoded again (2-bit kivi2: twice its
     * error, against the fresh sequence's once). */
    const double rtol = !staged || chunk == 0 ? 0 : cc->type == PGD_KV_KIVI2 ? 0.5 : 0.05;
    const double atol = rtol == 0 ? 0 : cc->type == PGD_KV_KIVI2 ? 0.2 : 0.01;
    snprintf(what, sizeof what, "%s hd %u%s n_out %u sink %u chunk %u", pgd_kv_type_name(cc->type),
             cc->hd, cc->rotate ? " rotated" : "", n_out, sink, chunk);
    kv d, kept, more;
    T_OK(kv_init(&d, cc->hd, N));
    T_OK(kv_init(&kept, cc->hd, n_out));
    T_OK(kv_init(&more, cc->hd, NEW));
    kv_fill(&d, seed);
    kv_fill(&more, seed + 1);
    int32_t toks[N + NEW];
    for (uint32_t i = 0; i < N + NEW; i++)
        toks[i] = 1000 + (int32_t)i;

    pgd_seq *a, *r;
    T_OK(pgd_seq_create(c, NULL, 0, &a));
    T_OK(write_rows(c, a, &d, 0, N, 0, chunk));
    T_EQ(pgd_seq_commit(c, a, toks, N), N / PT);
    const uint32_t *ids;
    uint32_t p0 = pgd_seq_pages(c, a, &ids), page0 = ids[0];
    pgd_cache_stats st0 = stats(c);
    T_EQ(st0.n_pages_used, p0);

    const size_t ld = n_out + 3;
    uint32_t *keep = calloc(NCOL * ld, sizeof *keep);
    T_ASSERT(keep);
    uint64_t rs = seed * 7 + 3;
    make_lists(&rs, keep, ld, N, n_out, sink, NULL);
    uint32_t p1 = (n_out + PT - 1) / PT;
    T_EQ(pgd_seq_compact(c, a, n_out, keep, ld, NULL), p0 - p1);
    T_OK(pgd_cache_check(c));
    T_EQ(pgd_seq_length(c, a), n_out);
    T_EQ(pgd_seq_n_committed(c, a), n_out);
    T_EQ(pgd_seq_n_dropped(c, a), N - n_out);
    T_EQ(pgd_seq_pages(c, a, &ids), p1);
    if (sink >= PT) T_EQ(ids[0], page0); /* kept whole: still the registered page */
    pgd_cache_stats st1 = stats(c);
    T_EQ(st1.n_pages_used, p1);
    T_EQ(st1.n_pages_cached, st0.n_pages_cached);
    T_EQ(st1.n_compactions, 1);
    T_EQ(st1.n_compact_dropped, N - n_out);
    T_EQ(st1.n_compact_freed, p0 - p1);
    uint32_t mask_len = 7;
    const uint32_t *live = (const uint32_t *)keep;
    pgd__seq_mask(a, &mask_len, &live);
    T_EQ(mask_len, 0);
    T_ASSERT(live == NULL);

    kv_gather(&kept, &d, n_out, keep, ld, NULL);
    T_OK(pgd_seq_create(cr, NULL, 0, &r));
    T_OK(write_rows(cr, r, &kept, 0, n_out, 0, 0));
    T_OK(same_rows(c, a, cr, r, cc->hd, rtol, what));
    T_OK(same_attention(c, a, cr, r, cc->hd, 0, atol, what));

    /* Writes continue at the next slot, across a page boundary; commit only counts. */
    T_OK(write_rows(c, a, &more, 0, NEW, n_out, 7));
    T_OK(write_rows(cr, r, &more, 0, NEW, n_out, 7));
    T_EQ(pgd_seq_commit(c, a, toks + n_out, NEW), 0);
    T_EQ(pgd_seq_n_committed(c, a), n_out + NEW);
    T_EQ(stats(c).n_pages_cached, st0.n_pages_cached);
    T_OK(pgd_cache_check(c));
    T_OK(same_rows(c, a, cr, r, cc->hd, rtol, what));
    T_OK(same_attention(c, a, cr, r, cc->hd, 0, atol, what));

    /* The prefix A registered before is still matched in full. */
    pgd_seq *m;
    T_OK(pgd_seq_create(c, NULL, 0, &m));
    T_EQ(pgd_seq_match(c, m, toks, N), N / PT * PT);
    pgd_seq_destroy(c, m);
    pgd_seq_destroy(c, a);
    pgd_seq_destroy(cr, r);
    T_OK(pgd_cache_check(c));
    T_EQ(stats(c).n_pages_used, 0);
    free(keep);
    kv_free(&d);
    kv_free(&kept);
    kv_free(&more);
    pgd_cache_destroy(c);
    pgd_cache_destroy(cr);
    return 0;
}

static int test_codecs(void)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        T_OK(run_case(&cases[i], 37, 0, 0, 0, 11 + i));
        T_OK(run_case(&cases[i], 37, PT + 2, 0, 0, 21 + i)); /* page 0 kept whole */
        T_OK(run_case(&cases[i], 48, 4, 0, 0, 31 + i));      /* full pages only */
        T_OK(run_case(&cases[i], 5, 0, 0, 0, 41 + i));       /* one partial page */
        T_OK(run_case(&cases[i], 70, 0, PT, 1, 51 + i));     /* staged: rows from the pool */
    }
    return 0;
}

/* ---- whole pages move by id ---- */

/* A window that moves by whole pages (StreamingLLM: sinks, then the newest slots): the
 * written pages whose rows are all of one old private page, in order, are that page, moved
 * in the table without a copy; the rest is written; rows and attention equal a fresh
 * sequence's bit for bit. Registered pages are never moved (they are copied). */
static int moves_case(const codec_case *cc, uint32_t sinks, int shared)
{
    char what[96];
    snprintf(what, sizeof what, "%s hd %u: sinks %u%s", pgd_kv_type_name(cc->type), cc->hd, sinks,
             shared ? ", registered" : "");
    geom g = {cc->type, cc->hd, cc->rotate, 0, 0, 64, 0, NULL};
    pgd_cache *c = make_cache(&g), *cr = make_cache(&g);
    T_ASSERT(c && cr);
    kv d, kept;
    const uint32_t drop = 2 * PT, n_out = N - drop; /* slots >= sinks move back 2 pages */
    T_OK(kv_init(&d, cc->hd, N));
    T_OK(kv_init(&kept, cc->hd, n_out));
    kv_fill(&d, 61 + sinks);
    pgd_seq *a, *r;
    T_OK(pgd_seq_create(c, NULL, 0, &a));
    T_OK(write_rows(c, a, &d, 0, N, 0, 0));
    if (shared) { /* registered: no page of A is private but its last */
        int32_t toks[N];
        for (uint32_t i = 0; i < N; i++)
            toks[i] = (int32_t)i;
        T_EQ(pgd_seq_commit(c, a, toks, N), 4);
    }
    const uint32_t *ids;
    uint32_t old[8];
    T_EQ(pgd_seq_pages(c, a, &ids), 5);
    memcpy(old, ids, 5 * sizeof *ids);
    enum { LD = N };
    uint32_t keep[NCOL * LD];
    for (uint32_t i = 0; i < NCOL; i++)
        for (uint32_t j = 0; j < n_out; j++)
            keep[i * LD + j] = j < sinks ? j : j + drop;
    T_EQ(pgd_seq_compact(c, a, n_out, keep, LD, NULL), 5 - (n_out + PT - 1) / PT);
    T_OK(pgd_cache_check(c));
    uint32_t np = pgd_seq_pages(c, a, &ids);
    /* Full page k >= 1 is old page k + 2 (page 0: the sinks, kept whole or written), the
     * last partial page is written. */
    for (uint32_t k = 1; k + 1 < np || (k < np && n_out % PT == 0); k++) {
        uint32_t q = k + drop / PT;
        if (shared)
            for (uint32_t u = 0; u < 5; u++)
                T_ASSERT(ids[k] != old[u]);
        else if (ids[k] != old[q])
            T_FAIL("%s: page %u is not old page %u moved", what, k, q);
    }
    kv_gather(&kept, &d, n_out, keep, LD, NULL);
    T_OK(pgd_seq_create(cr, NULL, 0, &r));
    T_OK(write_rows(cr, r, &kept, 0, n_out, 0, 0));
    T_OK(same_rows(c, a, cr, r, cc->hd, 0, what));
    T_OK(same_attention(c, a, cr, r, cc->hd, 0, 0, what));
    kv more;
    T_OK(kv_init(&more, cc->hd, NEW));
    kv_fill(&more, 62);
    T_OK(write_rows(c, a, &more, 0, NEW, n_out, 5));
    T_OK(write_rows(cr, r, &more, 0, NEW, n_out, 5));
    T_OK(same_rows(c, a, cr, r, cc->hd, 0, what));
    T_OK(same_attention(c, a, cr, r, cc->hd, 0, 0, what));
    pgd_seq_destroy(c, a);
    pgd_seq_destroy(cr, r);
    T_OK(pgd_cache_check(c));
    T_EQ(stats(c).n_pages_used, 0);
    kv_free(&d);
    kv_free(&kept);
    kv_free(&more);
    pgd_cache_destroy(c);
    pgd_cache_destroy(cr);
    return 0;
}

static int test_moves(void)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        T_OK(moves_case(&cases[i], 4, 0));
        T_OK(moves_case(&cases[i], PT, 0));
        T_OK(moves_case(&cases[i], 4, 1));
    }
    return 0;
}

/* ---- shared prefix pages ---- */

/* A writes and commits N rows; B matches its 4 full pages and writes its own partial page;
 * B is compacted. A's pages keep their bytes; each refcount drops by B's reference except
 * a page B kept whole; C still matches the whole prefix; commit after registers nothing. */
static int shared_case(uint32_t sink)
{
    geom g = {PGD_KV_F16, 64, 0, 0, 0, 32, 0, NULL};
    pgd_cache *c = make_cache(&g);
    T_ASSERT(c);
    pgd_pool *pool = pgd_cache_pool(c);
    kv d;
    T_OK(kv_init(&d, 64, N));
    kv_fill(&d, 5);
    int32_t toks[N];
    for (uint32_t i = 0; i < N; i++)
        toks[i] = 7 + (int32_t)i;
    pgd_seq *a, *b, *x;
    T_OK(pgd_seq_create(c, NULL, 0, &a));
    T_OK(write_rows(c, a, &d, 0, N, 0, 0));
    T_EQ(pgd_seq_commit(c, a, toks, N), N / PT);
    T_OK(pgd_seq_create(c, NULL, 0, &b));
    T_EQ(pgd_seq_match(c, b, toks, N), 64);
    T_OK(write_rows(c, b, &d, 64, N, 64, 0));
    T_OK(pgd_seq_commit(c, b, toks + 64, N - 64));
    const uint32_t *ia, *ib;
    uint32_t np = pgd_seq_pages(c, a, &ia);
    uint32_t pages[8], refs[8];
    const uint64_t pb = pgd_pool_page_bytes(pool);
    uint8_t *bytes = malloc(np * pb);
    T_ASSERT(bytes);
    for (uint32_t k = 0; k < np; k++) {
        pages[k] = ia[k];
        refs[k] = pgd_pool_refcount(pool, ia[k]);
        memcpy(bytes + k * pb, pgd_pool_page_data(pool, ia[k]), pb);
    }
    T_EQ(refs[0], 3); /* A, B, the index */
    pgd_cache_stats st0 = stats(c);

    uint32_t keep[NCOL * 40];
    uint64_t rs = 99 + sink;
    make_lists(&rs, keep, 40, N, 40, sink, NULL);
    T_EQ(pgd_seq_compact(c, b, 40, keep, 40, NULL), 2);
    T_OK(pgd_cache_check(c));
    T_EQ(pgd_seq_pages(c, b, &ib), 3);
    for (uint32_t k = 0; k < np; k++) {
        if (memcmp(bytes + k * pb, pgd_pool_page_data(pool, pages[k]), pb) != 0)
            T_FAIL("page %u of the shared prefix was written", k);
        int whole = k == 0 && sink >= PT;
        T_EQ(pgd_pool_refcount(pool, pages[k]), refs[k] - (k < 4 && !whole));
    }
    T_EQ(ib[0] == pages[0], sink >= PT);
    for (uint32_t k = sink >= PT; k < 3; k++)
        for (uint32_t j = 0; j < np; j++)
            T_ASSERT(ib[k] != pages[j]);
    pgd_cache_stats st1 = stats(c);
    T_EQ(st1.n_pages_cached, st0.n_pages_cached);
    /* B: its own page reused, fresh pages for the rest (A holds the prefix). */
    T_EQ(st1.n_pages_used, st0.n_pages_used + 2 - (sink >= PT));

    T_OK(pgd_seq_create(c, NULL, 0, &x));
    T_EQ(pgd_seq_match(c, x, toks, N), 64);
    pgd_seq_destroy(c, x);

    /* More tokens on B fill its pages; nothing is registered. */
    kv more;
    T_OK(kv_init(&more, 64, 30));
    kv_fill(&more, 6);
    T_OK(write_rows(c, b, &more, 0, 30, 40, 0));
    int32_t t2[30];
    for (uint32_t i = 0; i < 30; i++)
        t2[i] = 500 + (int32_t)i;
    T_EQ(pgd_seq_commit(c, b, t2, 30), 0);
    T_EQ(stats(c).n_pages_cached, st0.n_pages_cached);
    T_EQ(stats(c).n_registered, st0.n_registered);
    T_OK(pgd_cache_check(c));
    pgd_seq_destroy(c, a);
    T_OK(pgd_cache_check(c));
    pgd_seq_destroy(c, b);
    T_OK(pgd_cache_check(c));
    T_EQ(stats(c).n_pages_used, 0);
    T_EQ(stats(c).n_pages_cached, st0.n_pages_cached);
    free(bytes);
    kv_free(&d);
    kv_free(&more);
    pgd_cache_destroy(c);
    return 0;
}

static int test_shared_prefix(void)
{
    T_OK(shared_case(0));
    T_OK(shared_case(PT)); /* page 0 kept whole: B keeps holding the registered page */
    return 0;
}

/* ---- errors leave the sequence unchanged ---- */

static int same_seq(pgd_cache *c, pgd_seq *s, uint64_t len, uint32_t np, const uint32_t *ids0)
{
    const uint32_t *ids;
    T_EQ(pgd_seq_length(c, s), len);
    T_EQ(pgd_seq_pages(c, s, &ids), np);
    for (uint32_t k = 0; k < np; k++)
        T_EQ(ids[k], ids0[k]);
    T_EQ(pgd_seq_n_dropped(c, s), 0);
    T_EQ(stats(c).n_compactions, 0);
    T_OK(pgd_cache_check(c));
    return 0;
}

static int test_errors(void)
{
    geom g = {PGD_KV_F32, 16, 0, 0, 0, 6, 0, NULL};
    pgd_cache *c = make_cache(&g);
    T_ASSERT(c);
    kv d;
    T_OK(kv_init(&d, 16, N));
    kv_fill(&d, 8);
    int32_t toks[N];
    for (uint32_t i = 0; i < N; i++)
        toks[i] = (int32_t)i;
    pgd_seq *a, *b;
    T_OK(pgd_seq_create(c, NULL, 0, &a));
    T_OK(write_rows(c, a, &d, 0, N, 0, 0));
    T_EQ(pgd_seq_commit(c, a, toks, N), 4);
    T_OK(pgd_seq_create(c, NULL, 0, &b));
    T_EQ(pgd_seq_match(c, b, toks, N), 64);
    T_OK(write_rows(c, b, &d, 64, N, 64, 0)); /* the pool's 6th and last page */
    const uint32_t *ids;
    uint32_t np = pgd_seq_pages(c, b, &ids), ids0[8];
    memcpy(ids0, ids, np * sizeof *ids);

    enum { LD = 40 };
    uint32_t keep[NCOL * LD], live[NCOL] = {30, 30, 30, 30};
    uint64_t rs = 1;
    make_lists(&rs, keep, LD, N, 30, 0, NULL);
    T_EQ(pgd_seq_compact(c, b, 0, keep, LD, NULL), PGD_EINVAL);
    T_EQ(pgd_seq_compact(c, b, N + 1, keep, LD, NULL), PGD_EINVAL);
    T_EQ(pgd_seq_compact(c, b, 30, NULL, LD, NULL), PGD_EINVAL);
    T_EQ(pgd_seq_compact(c, NULL, 30, keep, LD, NULL), PGD_EINVAL);
    T_EQ(pgd_seq_compact(c, b, 30, keep, 29, NULL), PGD_EINVAL); /* ld below the lists */
    live[2] = 0;
    T_EQ(pgd_seq_compact(c, b, 30, keep, LD, live), PGD_EINVAL);
    live[2] = 31;
    T_EQ(pgd_seq_compact(c, b, 30, keep, LD, live), PGD_EINVAL);
    live[2] = 30;
    uint32_t save = keep[LD + 5];
    keep[LD + 5] = keep[LD + 4]; /* a duplicate */
    T_EQ(pgd_seq_compact(c, b, 30, keep, LD, NULL), PGD_EINVAL);
    keep[LD + 5] = keep[LD + 4] - 1 + (keep[LD + 4] == 0); /* descending */
    T_EQ(pgd_seq_compact(c, b, 30, keep, LD, NULL), PGD_EINVAL);
    keep[LD + 5] = save;
    save = keep[3 * LD + 29];
    keep[3 * LD + 29] = N; /* past the length */
    T_EQ(pgd_seq_compact(c, b, 30, keep, LD, NULL), PGD_EINVAL);
    keep[3 * LD + 29] = save;
    T_OK(same_seq(c, b, N, np, ids0));
    /* B needs a page besides its own partial one: A holds every other page. */
    T_EQ(pgd_seq_compact(c, b, 30, keep, LD, NULL), PGD_ENOSPC);
    T_OK(same_seq(c, b, N, np, ids0));
    /* A's partial page back in the pool: the compaction takes it. */
    pgd_seq_destroy(c, a);
    T_EQ(pgd_seq_compact(c, b, 30, keep, LD, NULL), 3);
    T_OK(pgd_cache_check(c));
    T_EQ(stats(c).n_compactions, 1);
    pgd_seq_destroy(c, b);
    T_OK(pgd_cache_check(c));
    kv_free(&d);
    pgd_cache_destroy(c);
    return 0;
}

/* ---- dead slots ---- */

/* Lists of n_live[i] slots of (l, h) i drawn from the slots below len that are not dead in
 * s's mask (pgd__seq_mask). */
static void make_lists_alive(uint64_t *st, const pgd_seq *s, uint32_t *keep, size_t ld,
                             uint32_t len, const uint32_t *n_live)
{
    uint32_t mask_len, cand[N + NEW];
    const uint32_t *dead;
    pgd__seq_mask(s, &mask_len, &dead);
    for (uint32_t i = 0; i < NCOL; i++) {
        uint32_t n_cand = 0, got = 0;
        for (uint32_t t = 0; t < len; t++)
            if (!dead || t < dead[i] || t >= mask_len) cand[n_cand++] = t;
        for (uint32_t t = 0; t < n_cand && got < n_live[i]; t++)
            if (t_rand(st) % (n_cand - t) < n_live[i] - got) keep[i * ld + got++] = cand[t];
    }
}

static int mask_is(const pgd_seq *s, uint32_t len, const uint32_t *want)
{
    uint32_t mask_len;
    const uint32_t *live;
    pgd__seq_mask(s, &mask_len, &live);
    if (!want) {
        T_EQ(mask_len, 0);
        T_ASSERT(live == NULL);
        return 0;
    }
    T_EQ(mask_len, len);
    T_ASSERT(live != NULL && live != want);
    for (uint32_t i = 0; i < NCOL; i++)
        T_EQ(live[i], want[i]);
    return 0;
}

/* n_live below n_out stores the mask; dead slots hold zeros; a later compaction may not keep
 * a dead slot, replaces the mask, or drops it. */
static int test_mask(void)
{
    geom g = {PGD_KV_F32, 16, 0, 0, 0, 64, 0, NULL};
    pgd_cache *c = make_cache(&g), *cr = make_cache(&g);
    T_ASSERT(c && cr);
    kv d, k1, k2, k3;
    T_OK(kv_init(&d, 16, N));
    T_OK(kv_init(&k1, 16, 37));
    T_OK(kv_init(&k2, 16, 18));
    T_OK(kv_init(&k3, 16, 10));
    kv_fill(&d, 17);
    pgd_seq *a, *r;
    T_OK(pgd_seq_create(c, NULL, 0, &a));
    T_OK(write_rows(c, a, &d, 0, N, 0, 0));
    enum { LD = 40 };
    uint32_t keep[NCOL * LD], live1[NCOL] = {37, 20, 30, 37};
    uint64_t st = 5;
    T_OK(mask_is(a, 0, NULL));
    make_lists_alive(&st, a, keep, LD, N, live1);
    T_EQ(pgd_seq_compact(c, a, 37, keep, LD, live1), 2);
    T_OK(pgd_cache_check(c));
    T_OK(mask_is(a, 37, live1));
    kv_gather(&k1, &d, 37, keep, LD, live1);
    T_OK(pgd_seq_create(cr, NULL, 0, &r));
    T_OK(write_rows(cr, r, &k1, 0, 37, 0, 0));
    T_OK(same_rows(c, a, cr, r, 16, 0, "f32 with dead slots")); /* dead slots are zeros */
    pgd_seq_destroy(cr, r);

    /* A list of (0, 1) keeping its dead slot 25: refused, nothing changes. */
    uint32_t live2[NCOL] = {18, 10, 18, 18};
    make_lists_alive(&st, a, keep, LD, 37, live2);
    uint32_t save = keep[1 * LD + 9];
    keep[1 * LD + 9] = 25;
    T_EQ(pgd_seq_compact(c, a, 18, keep, LD, live2), PGD_EINVAL);
    T_EQ(pgd_seq_length(c, a), 37);
    T_OK(mask_is(a, 37, live1));
    keep[1 * LD + 9] = save;
    T_EQ(pgd_seq_compact(c, a, 18, keep, LD, live2), 1);
    T_OK(pgd_cache_check(c));
    T_OK(mask_is(a, 18, live2));
    kv_gather(&k2, &k1, 18, keep, LD, live2);
    T_OK(pgd_seq_create(cr, NULL, 0, &r));
    T_OK(write_rows(cr, r, &k2, 0, 18, 0, 0));
    T_OK(same_rows(c, a, cr, r, 16, 0, "f32, compacted twice"));
    pgd_seq_destroy(cr, r);

    /* Every list as long as n_out: no mask. */
    uint32_t live3[NCOL] = {10, 10, 10, 10};
    make_lists_alive(&st, a, keep, LD, 18, live3);
    T_EQ(pgd_seq_compact(c, a, 10, keep, LD, NULL), 1);
    T_OK(mask_is(a, 0, NULL));
    kv_gather(&k3, &k2, 10, keep, LD, NULL);
    T_OK(pgd_seq_create(cr, NULL, 0, &r));
    T_OK(write_rows(cr, r, &k3, 0, 10, 0, 0));
    T_OK(same_rows(c, a, cr, r, 16, 0, "f32, compacted three times"));
    T_OK(same_attention(c, a, cr, r, 16, 0, 0, "f32, compacted three times"));
    pgd_seq_destroy(cr, r);
    T_EQ(pgd_seq_n_dropped(c, a), N - 10);
    T_EQ(stats(c).n_compactions, 3);
    T_EQ(stats(c).n_compact_dropped, N - 10);
    T_EQ(stats(c).n_compact_freed, 4);

    /* Nothing dropped, no dead slot: nothing changes, nothing counted. */
    for (uint32_t i = 0; i < NCOL; i++)
        for (uint32_t j = 0; j < 10; j++)
            keep[i * LD + j] = j;
    T_EQ(pgd_seq_compact(c, a, 10, keep, LD, NULL), 0);
    T_EQ(stats(c).n_compactions, 3);
    pgd_seq_destroy(c, a);
    T_OK(pgd_cache_check(c));
    kv_free(&d);
    kv_free(&k1);
    kv_free(&k2);
    kv_free(&k3);
    pgd_cache_destroy(c);
    pgd_cache_destroy(cr);
    return 0;
}

/* ---- fork, truncate, commit, match of a compacted sequence ---- */

static int test_fork_truncate(void)
{
    geom g = {PGD_KV_F16, 64, 0, 0, 0, 64, 0, NULL};
    pgd_cache *c = make_cache(&g);
    T_ASSERT(c);
    pgd_pool *pool = pgd_cache_pool(c);
    kv d;
    T_OK(kv_init(&d, 64, N));
    kv_fill(&d, 23);
    int32_t toks[N];
    for (uint32_t i = 0; i < N; i++)
        toks[i] = 3 * (int32_t)i;
    pgd_seq *a, *f, *b;
    T_OK(pgd_seq_create(c, NULL, 0, &a));
    T_OK(write_rows(c, a, &d, 0, N, 0, 0));
    T_EQ(pgd_seq_commit(c, a, toks, N), 4);
    enum { LD = 37 };
    uint32_t keep[NCOL * LD], live[NCOL] = {37, 20, 37, 37};
    uint64_t st = 9;
    make_lists(&st, keep, LD, N, 37, PT, live); /* page 0 kept whole */
    T_EQ(pgd_seq_compact(c, a, 37, keep, LD, live), 2);
    const uint32_t *ia, *iff;
    uint32_t np = pgd_seq_pages(c, a, &ia), pa[3];
    memcpy(pa, ia, sizeof pa);
    T_EQ(np, 3);
    T_EQ(pgd_pool_refcount(pool, pa[0]), 2); /* A and the index */
    T_EQ(pgd_pool_refcount(pool, pa[1]), 1);

    /* A fork shares every page, the mask (a copy) and the dropped count. */
    T_OK(pgd_seq_fork(c, a, &f));
    T_OK(pgd_cache_check(c));
    T_EQ(pgd_seq_pages(c, f, &iff), 3);
    for (uint32_t k = 0; k < 3; k++)
        T_EQ(iff[k], pa[k]);
    T_EQ(pgd_pool_refcount(pool, pa[0]), 3);
    T_EQ(pgd_pool_refcount(pool, pa[1]), 2);
    T_EQ(pgd_pool_refcount(pool, pa[2]), 2);
    T_OK(mask_is(f, 37, live));
    T_EQ(pgd_seq_n_dropped(c, f), N - 37);
    T_EQ(pgd_seq_n_committed(c, f), 37);

    /* The fork writes its next slot: copy-on-write of the shared last page. */
    const uint64_t pb = pgd_pool_page_bytes(pool);
    uint8_t *before = malloc(pb);
    T_ASSERT(before);
    memcpy(before, pgd_pool_page_data(pool, pa[2]), pb);
    kv one;
    T_OK(kv_init(&one, 64, 1));
    kv_fill(&one, 24);
    T_OK(write_rows(c, f, &one, 0, 1, 37, 0));
    T_EQ(pgd_seq_commit(c, f, toks, 1), 0);
    T_EQ(pgd_seq_pages(c, f, &iff), 3);
    T_ASSERT(iff[2] != pa[2]);
    T_ASSERT(memcmp(before, pgd_pool_page_data(pool, pa[2]), pb) == 0);
    T_EQ(pgd_pool_refcount(pool, pa[2]), 1);
    T_EQ(stats(c).n_pages_cached, 4);
    T_OK(pgd_cache_check(c));
    /* The fork compacts on its own: A's pages stay as they are. */
    uint32_t k2[NCOL * 20];
    make_lists_alive(&st, f, k2, 20, 38, (const uint32_t[]){20, 20, 20, 20});
    T_EQ(pgd_seq_compact(c, f, 20, k2, 20, NULL), 1);
    T_OK(mask_is(a, 37, live));
    T_OK(mask_is(f, 0, NULL));
    T_EQ(pgd_seq_n_dropped(c, f), N - 37 + 18);
    T_ASSERT(memcmp(before, pgd_pool_page_data(pool, pa[2]), pb) == 0);
    T_OK(pgd_cache_check(c));
    pgd_seq_destroy(c, a);
    T_OK(pgd_cache_check(c));
    pgd_seq_destroy(c, f);
    T_OK(pgd_cache_check(c));
    T_EQ(stats(c).n_pages_used, 0);

    /* Truncation clips the mask; below every dead slot it drops it. Truncate works down to
     * n_committed (0 here); a compacted sequence cannot match. */
    uint32_t live_b[NCOL] = {30, 20, 37, 37}, clip25[NCOL] = {25, 20, 25, 25};
    T_OK(pgd_seq_create(c, NULL, 0, &b));
    T_OK(write_rows(c, b, &d, 0, N, 0, 0));
    make_lists(&st, keep, LD, N, 37, 0, live_b);
    T_EQ(pgd_seq_compact(c, b, 37, keep, LD, live_b), 2);
    T_OK(pgd_seq_truncate(c, b, 25));
    T_OK(pgd_cache_check(c));
    T_OK(mask_is(b, 25, clip25));
    T_OK(pgd_seq_truncate(c, b, 18));
    T_OK(pgd_cache_check(c));
    T_OK(mask_is(b, 0, NULL));
    T_OK(pgd_seq_truncate(c, b, 0));
    T_EQ(pgd_seq_match(c, b, toks, N), PGD_ESTATE);
    T_OK(pgd_cache_check(c));
    pgd_seq_destroy(c, b);

    /* Hash mode: commit_hashes counts pages of tokens after a compaction. */
    pgd_hash hs[4];
    T_EQ(pgd_cache_hash_tokens(c, NULL, 0, toks, 64, hs, 4), 4);
    T_OK(pgd_seq_create(c, NULL, 0, &b));
    T_EQ(pgd_seq_match_hashes(c, b, hs, 2), 2); /* A's pages 0, 1 are still cached */
    T_OK(write_rows(c, b, &d, 32, 40, 32, 0));
    T_EQ(pgd_seq_commit_hashes(c, b, hs + 2, 0), 0);
    make_lists(&st, keep, LD, 40, 21, 0, NULL);
    T_EQ(pgd_seq_compact(c, b, 21, keep, LD, NULL), 1);
    T_EQ(pgd_seq_n_committed(c, b), 21);
    T_EQ(pgd_seq_commit_hashes(c, b, hs + 2, 1), PGD_EINVAL); /* past the length */
    T_OK(pgd_seq_grow(c, b, 20));
    uint32_t cached = stats(c).n_pages_cached;
    T_EQ(pgd_seq_commit_hashes(c, b, hs + 2, 1), 0);
    T_EQ(pgd_seq_n_committed(c, b), 37);
    T_EQ(stats(c).n_pages_cached, cached);
    T_EQ(pgd_seq_commit(c, b, toks, 1), PGD_ESTATE);
    T_OK(pgd_cache_check(c));
    pgd_seq_destroy(c, b);
    T_OK(pgd_cache_check(c));
    free(before);
    kv_free(&d);
    kv_free(&one);
    pgd_cache_destroy(c);
    return 0;
}

/* ---- Quest key bounds ---- */

/* Every page's key bounds are min / max over its live rows as stored (decoded). */
static int bounds_ok(pgd_cache *c, pgd_seq *s, uint32_t hd)
{
    pgd_pool *pool = pgd_cache_pool(c);
    const pgd__codec *codec = pgd__pool_codec(pool);
    uint32_t mask_len;
    const uint32_t *live;
    pgd__seq_mask(s, &mask_len, &live);
    const uint32_t *ids;
    uint32_t np = pgd_seq_pages(c, s, &ids);
    uint64_t len = pgd_seq_length(c, s);
    float *rows = malloc((size_t)PT * hd * sizeof *rows);
    T_ASSERT(rows);
    for (uint32_t k = 0; k < np; k++)
        for (uint32_t l = 0; l < NL; l++)
            for (uint32_t h = 0; h < NH; h++) {
                const float *b = pgd_pool_key_bounds(pool, ids[k], l, h);
                T_ASSERT(b);
                codec->decode_rows(PGD__K, pgd_pool_k(pool, ids[k], l, h), PT, hd, 0, PT, rows);
                for (uint32_t d = 0; d < hd; d++) {
                    float lo = INFINITY, hi = -INFINITY;
                    for (uint32_t r = 0; r < PT; r++) {
                        uint64_t j = (uint64_t)k * PT + r;
                        if (j >= len || (live && j >= live[l * NH + h] && j < mask_len)) continue;
                        float x = rows[(size_t)r * hd + d];
                        lo = x < lo ? x : lo;
                        hi = x > hi ? x : hi;
                    }
                    if (b[d] != lo || b[hd + d] != hi)
                        T_FAIL("page %u layer %u head %u: bounds [%g, %g], rows [%g, %g]", k, l, h,
                               b[d], b[hd + d], lo, hi);
                }
            }
    free(rows);
    return 0;
}

static int test_quest(void)
{
    geom g = {PGD_KV_F32, 64, 0, 1, 0, 64, 0, NULL};
    pgd_cache *c = make_cache(&g), *cr = make_cache(&g);
    T_ASSERT(c && cr);
    kv d, kept, more;
    T_OK(kv_init(&d, 64, N));
    T_OK(kv_init(&kept, 64, 40));
    T_OK(kv_init(&more, 64, NEW));
    kv_fill(&d, 31);
    kv_fill(&more, 32);
    int32_t toks[N];
    for (uint32_t i = 0; i < N; i++)
        toks[i] = (int32_t)i;
    pgd_seq *a, *r;
    T_OK(pgd_seq_create(c, NULL, 0, &a));
    T_OK(write_rows(c, a, &d, 0, N, 0, 0));
    T_EQ(pgd_seq_commit(c, a, toks, N), 4);
    enum { LD = 40 };
    uint32_t keep[NCOL * LD];
    uint64_t st = 3;
    make_lists(&st, keep, LD, N, 40, PT + 1, NULL);
    T_EQ(pgd_seq_compact(c, a, 40, keep, LD, NULL), 2);
    T_OK(pgd_cache_check(c));
    T_OK(bounds_ok(c, a, 64));
    kv_gather(&kept, &d, 40, keep, LD, NULL);
    T_OK(pgd_seq_create(cr, NULL, 0, &r));
    T_OK(write_rows(cr, r, &kept, 0, 40, 0, 0));
    T_OK(same_attention(c, a, cr, r, 64, 2, 0, "f32 Quest"));
    T_OK(write_rows(c, a, &more, 0, NEW, 40, 3));
    T_OK(write_rows(cr, r, &more, 0, NEW, 40, 3));
    T_OK(bounds_ok(c, a, 64));
    T_OK(same_attention(c, a, cr, r, 64, 2, 0, "f32 Quest, written after"));
    pgd_seq_destroy(cr, r);
    /* With dead slots: their rows are out of the bounds. */
    uint32_t live[NCOL] = {30, 12, 30, 25};
    make_lists_alive(&st, a, keep, LD, 60, live);
    T_EQ(pgd_seq_compact(c, a, 30, keep, LD, live), 2);
    T_OK(pgd_cache_check(c));
    T_OK(bounds_ok(c, a, 64));
    pgd_seq_destroy(c, a);
    T_OK(pgd_cache_check(c));
    kv_free(&d);
    kv_free(&kept);
    kv_free(&more);
    pgd_cache_destroy(c);
    pgd_cache_destroy(cr);
    return 0;
}

/* ---- a metadata-only pool: the page tables only ---- */

static int test_metadata_only(void)
{
    geom g = {PGD_KV_F16, 64, 0, 0, 1, 16, 0, NULL};
    pgd_cache *c = make_cache(&g);
    T_ASSERT(c);
    int32_t toks[N];
    for (uint32_t i = 0; i < N; i++)
        toks[i] = (int32_t)i;
    pgd_seq *a, *b;
    T_OK(pgd_seq_create(c, NULL, 0, &a));
    T_OK(pgd_seq_grow(c, a, N));
    T_EQ(pgd_seq_commit(c, a, toks, N), 4);
    T_OK(pgd_seq_create(c, NULL, 0, &b));
    T_EQ(pgd_seq_match(c, b, toks, N), 64);
    enum { LD = 30 };
    uint32_t keep[NCOL * LD];
    uint64_t st = 4;
    make_lists(&st, keep, LD, 64, 30, 0, NULL);
    T_EQ(pgd_seq_compact(c, b, 30, keep, LD, NULL), 2);
    T_OK(pgd_cache_check(c));
    T_EQ(stats(c).n_pages_used, 5 + 2);
    T_OK(pgd_seq_grow(c, b, 40));
    T_EQ(pgd_seq_commit(c, b, toks, 40), 0);
    T_OK(pgd_cache_check(c));
    pgd_seq_destroy(c, a);
    pgd_seq_destroy(c, b);
    T_OK(pgd_cache_check(c));
    T_EQ(stats(c).n_pages_used, 0);
    pgd_cache_destroy(c);
    return 0;
}

/* A list shorter than a page that the others move whole: no move (its slots there are
 * dead), and its entries past n_live are never read (garbage there). */
static int test_moves_short_list(void)
{
    geom g = {PGD_KV_F16, 64, 0, 0, 0, 64, 0, NULL};
    pgd_cache *c = make_cache(&g), *cr = make_cache(&g);
    T_ASSERT(c && cr);
    kv d, kept;
    const uint32_t n_out = N - 2 * PT;
    T_OK(kv_init(&d, 64, N));
    T_OK(kv_init(&kept, 64, n_out));
    kv_fill(&d, 71);
    pgd_seq *a, *r;
    T_OK(pgd_seq_create(c, NULL, 0, &a));
    T_OK(write_rows(c, a, &d, 0, N, 0, 0));
    enum { LD = N };
    uint32_t keep[NCOL * LD], live[NCOL] = {4, n_out, n_out, n_out};
    for (uint32_t i = 0; i < NCOL; i++)
        for (uint32_t j = 0; j < LD; j++)
            keep[i * LD + j] = j >= live[i] ? 0xfffffff0u : j < 4 ? j : j + 2 * PT;
    T_EQ(pgd_seq_compact(c, a, n_out, keep, LD, live), 2);
    T_OK(pgd_cache_check(c));
    T_OK(mask_is(a, n_out, live));
    kv_gather(&kept, &d, n_out, keep, LD, live);
    T_OK(pgd_seq_create(cr, NULL, 0, &r));
    T_OK(write_rows(cr, r, &kept, 0, n_out, 0, 0));
    T_OK(same_rows(c, a, cr, r, 64, 0, "f16, a short list"));
    pgd_seq_destroy(c, a);
    pgd_seq_destroy(cr, r);
    T_OK(pgd_cache_check(c));
    kv_free(&d);
    kv_free(&kept);
    pgd_cache_destroy(c);
    pgd_cache_destroy(cr);
    return 0;
}

/* ---- allocation failures ---- */

static t_counting A;
static const pgd_allocator counting = T_COUNTING_ALLOCATOR(&A);

/* The N-th allocation of a compaction fails, for N = 1, 2, ... until it succeeds: each
 * failure returns PGD_ENOMEM and leaves the sequence, the cache and the allocations as they
 * were. B matched A's committed prefix and has no ring yet (staged pools allocate it). */
static int enomem_case(pgd_kv_type type, uint32_t n_live_1)
{
    geom g = {type, 64, 0, 1, 0, 32, 0, &counting};
    pgd_cache *c = make_cache(&g);
    T_ASSERT(c);
    kv d;
    T_OK(kv_init(&d, 64, N));
    kv_fill(&d, 41);
    int32_t toks[N];
    for (uint32_t i = 0; i < N; i++)
        toks[i] = (int32_t)i;
    pgd_seq *a, *b;
    T_OK(pgd_seq_create(c, NULL, 0, &a));
    T_OK(write_rows(c, a, &d, 0, N, 0, 0));
    T_EQ(pgd_seq_commit(c, a, toks, N), 4);
    T_OK(pgd_seq_create(c, NULL, 0, &b));
    T_EQ(pgd_seq_match(c, b, toks, N), 64);
    enum { LD = 40 };
    uint32_t keep[NCOL * LD], live[NCOL] = {40, n_live_1, 40, 40};
    uint64_t st = 6;
    make_lists(&st, keep, LD, 64, 40, 0, live);
    long n_failed = 0;
    for (long n = 1;; n++) {
        long live0 = A.n_live;
        size_t bytes0 = A.n_bytes;
        t_counting_arm(&A, n);
        int rc = pgd_seq_compact(c, b, 40, keep, LD, live);
        A.fail_at = 0;
        if (!A.fired) {
            T_EQ(rc, 1);
            T_ASSERT(n_failed >= 3 + (type == PGD_KV_KIVI2) + (n_live_1 < 40));
            break;
        }
        if (rc != PGD_ENOMEM) T_FAIL("allocation %ld failed, compact returned %d", n, rc);
        T_EQ(A.n_live, live0);
        T_EQ(A.n_bytes, bytes0);
        T_EQ(pgd_seq_length(c, b), 64);
        T_EQ(stats(c).n_compactions, 0);
        n_failed++;
        T_OK(mask_is(b, 0, NULL));
        T_OK(pgd_cache_check(c));
    }
    T_OK(pgd_cache_check(c));
    T_OK(mask_is(b, 40, n_live_1 < 40 ? live : NULL));
    pgd_seq_destroy(c, a);
    pgd_seq_destroy(c, b);
    T_OK(pgd_cache_check(c));
    kv_free(&d);
    pgd_cache_destroy(c);
    T_EQ(A.n_live, 0);
    return 0;
}

static int test_enomem(void)
{
    T_OK(enomem_case(PGD_KV_F16, 40));
    T_OK(enomem_case(PGD_KV_F16, 12)); /* with a mask */
    T_OK(enomem_case(PGD_KV_KIVI2, 30));
    return 0;
}

/* ---- a pending promotion ---- */

/* A RAM tier whose gets wait while hold is set (the state begins with the tier it wraps). */
typedef struct gate {
    pgd_tier *inner;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int hold, n_held;
} gate;

static int gate_get(void *st, pgd_hash b, void *page, void *bounds)
{
    gate *g = st;
    pthread_mutex_lock(&g->mu);
    g->n_held++;
    pthread_cond_broadcast(&g->cv);
    while (g->hold)
        pthread_cond_wait(&g->cv, &g->mu);
    g->n_held--;
    pthread_mutex_unlock(&g->mu);
    return pgd_tier_get(g->inner, b, page, bounds);
}

static void gate_close(void *st)
{
    gate *g = st;
    pgd_tier_close(g->inner);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

static const pgd_tier_ops gate_ops = {"gate",
                                      t_tier_fwd_bind,
                                      t_tier_fwd_put,
                                      gate_get,
                                      t_tier_fwd_lookup,
                                      t_tier_fwd_del,
                                      t_tier_fwd_stats,
                                      t_tier_fwd_flush,
                                      gate_close,
                                      NULL,
                                      NULL};

static void gate_hold(gate *g, int on)
{
    pthread_mutex_lock(&g->mu);
    g->hold = on;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* While B's match promotes A's demoted pages, a compaction of B is PGD_ESTATE (nothing
 * changes); once the fills are done it settles them and compacts. */
static int test_pending_promotion(void)
{
    gate *gt = calloc(1, sizeof *gt);
    T_ASSERT(gt);
    pgd_tier_ram_params rp = pgd_tier_ram_default_params();
    rp.capacity_bytes = 64u << 20;
    T_OK(pgd_tier_ram_create(&rp, &gt->inner));
    pthread_mutex_init(&gt->mu, NULL);
    pthread_cond_init(&gt->cv, NULL);
    pgd_tier *t = NULL;
    T_OK(pgd_tier_wrap(&gate_ops, gt, &t));
    pgd_tier_use use = {t, 0, 0};
    g_tiers = &use;
    geom g = {PGD_KV_F16, 64, 0, 0, 0, 32, 0, NULL};
    pgd_cache *c = make_cache(&g);
    g_tiers = NULL;
    T_ASSERT(c);
    kv d;
    T_OK(kv_init(&d, 64, N));
    kv_fill(&d, 51);
    int32_t toks[N];
    for (uint32_t i = 0; i < N; i++)
        toks[i] = 40 + (int32_t)i;
    pgd_seq *a, *b;
    T_OK(pgd_seq_create(c, NULL, 0, &a));
    T_OK(write_rows(c, a, &d, 0, N, 0, 0));
    T_EQ(pgd_seq_commit(c, a, toks, N), 4);
    pgd_seq_destroy(c, a);
    T_EQ(pgd_cache_clear(c), 4); /* demoted to the tier */
    T_OK(pgd_cache_flush(c));
    T_OK(pgd_seq_create(c, NULL, 0, &b));
    gate_hold(gt, 1);
    T_EQ(pgd_seq_match(c, b, toks, N), 64);
    pthread_mutex_lock(&gt->mu);
    while (gt->n_held == 0)
        pthread_cond_wait(&gt->cv, &gt->mu);
    pthread_mutex_unlock(&gt->mu);
    enum { LD = 30 };
    uint32_t keep[NCOL * LD];
    uint64_t st = 8;
    make_lists(&st, keep, LD, 64, 30, 0, NULL);
    T_EQ(pgd_seq_compact(c, b, 30, keep, LD, NULL), PGD_ESTATE);
    T_EQ(pgd_seq_length(c, b), 64);
    T_EQ(stats(c).n_compactions, 0);
    T_OK(pgd_cache_check(c));
    gate_hold(gt, 0);
    T_OK(pgd_seq_wait(c, b));
    T_EQ(pgd_seq_compact(c, b, 30, keep, LD, NULL), 2);
    T_OK(pgd_cache_check(c));
    T_EQ(stats(c).n_pages_cached, 4); /* the promoted pages, registered, B's no more */
    pgd_seq_destroy(c, b);
    T_OK(pgd_cache_check(c));
    kv_free(&d);
    pgd_cache_destroy(c);
    pgd_tier_close(t);
    return 0;
}

int main(void)
{
    T_RUN(test_codecs);
    T_RUN(test_moves);
    T_RUN(test_moves_short_list);
    T_RUN(test_shared_prefix);
    T_RUN(test_errors);
    T_RUN(test_mask);
    T_RUN(test_fork_truncate);
    T_RUN(test_quest);
    T_RUN(test_metadata_only);
    T_RUN(test_enomem);
    T_RUN(test_pending_promotion);
    T_DONE();
}
