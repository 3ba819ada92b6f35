/* SPDX-License-Identifier: MIT */
/*
 * bench_attn.c - decode attention (pgd_attn_run) against a STREAM-like read-bandwidth
 * probe in the same run, per codec, GQA, context and batch, on paged and contiguous page
 * tables; plus prefill attention throughput.
 *
 *   probe       threads sum a plain array of the same bytes as the config's K/V (same
 *               threads, same pool): the bandwidth this machine gives to a pure read of
 *               that size (L3 for small configs, DRAM for large ones); also once on a
 *               buffer far larger than any cache (the DRAM line at the top). The buffer is
 *               madvised MADV_HUGEPAGE, as the pool's arena is (pool.c), so both sides
 *               read through the same kind of pages (--small-probe: 4 KiB pages, which
 *               flatters the kernel's %bw)
 *   decode      batch sequences of ctx tokens, one query row each, n_kv_heads KV heads,
 *               GQA query heads per KV head; GB/s = encoded K+V bytes of every page read
 *               / median time; %bw = GB/s / probe GB/s at equal bytes
 *   paged       sequences whose page ids are shuffled over the pool (pages freed in a
 *               random order before the sequences grew)
 *   contiguous  the same K/V in sequences of consecutive page ids (a fresh pool)
 *   p/c         time contiguous / time paged (1.00 = paging costs nothing)
 *               (paged, contiguous and probe are timed in turn, repetition by repetition)
 *   prefill     a chunk of --prefill rows after a prefix of --prefill-depth tokens
 *   --scores    instead of the table above: decode with and without scores (token budgets,
 *               pgd_attn_run_scored: every decode row scored, score_keys = ctx) on the same
 *               paged sequences, timed in turn repetition by repetition; scored/plain is
 *               the cost of scoring (issue 14's target: below 1.05)
 *   --gemma     instead of the table above: decode on the same paged sequences plain, with
 *               gemma2's soft-cap (pgd_attn_params.softcap 50) and as a sliding-window layer
 *               (layer_window --window, default 1024), timed in turn repetition by repetition:
 *               cap/plain is the soft-cap's cost, win/plain the window layer's against a
 *               global one (ideally about (window + page) / ctx)
 *   --shared-prefix instead of the table above: batch decode rows of sequences forked
 *               from one prefix of that many tokens, each with --tail own tokens (the
 *               serving workload: one system prompt, many requests), timed in turn with
 *               the fast path's shared tiles on and off (pgd__attn_set_shared) on the same
 *               sequences: us per step, the K/V MB each read (pgd__attn_stats) and off/on;
 *               the outputs of both must be the same bits
 *
 * Targets (issue 5): f16 at GQA 1 >= 85% of the probe; paged >= 0.97x contiguous; q8_0 and
 * q4_0 faster than f16 at long context (the summary lines). Each figure is the median of
 * timed repetitions (at least --min-reps, at least --min-ms) after one untimed warm-up
 * (--fastest: the fastest one).
 * The checksum folds every output, so a change that is fast but wrong shows up.
 * --cpu-time (one thread): times on the thread's CPU clock, for a shared machine where the
 * wall clock also counts the time the bench waits for a core.
 * --isa avx2: the AVX2 level (its codec tables and softmax step, pgd__attn_force_isa) on a
 * machine that has more, to measure what an AVX2-only CPU runs.
 * Threads: a persistent pthread pool (libpagoda has none), tasks claimed in order from an
 * atomic counter, workers spinning briefly between runs then sleeping.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <unistd.h>

#include <pagoda/attn.h>
#include <pagoda/cache.h>

#include "attn/attn_int.h" /* pgd__attn_set_wide, the --wide hook */
#include "bench.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* ---- options ---- */

typedef struct opts {
    uint32_t ctx[16], n_ctx, batch[16], n_batch, gqa[8], n_gqa;
    pgd_kv_type types[8];
    uint32_t n_types;
    uint32_t n_kv, hd, pt, threads, min_reps, prefill, prefill_depth, wide;
    uint64_t max_tokens;
    double min_ms;
    bench_args b;    /* --seed, --json, --smoke */
    int layouts;     /* 1 paged only, 3 both */
    int hugepages;   /* madvise the pool arenas MADV_HUGEPAGE before filling */
    int small_probe; /* leave the probe buffer on 4 KiB pages */
    int cpu_time;    /* time on the thread's CPU clock (--threads 1 only) */
    int scores;      /* time decode with against without scores */
    int gemma;       /* time decode plain, soft-capped and windowed */
    uint32_t window; /* --gemma: the window layer's window */
    int isa;         /* --isa: the attention level (pgd__attn_force_isa), -1: the CPU's best */
    int prefetch;    /* --prefetch: pgd__attn_set_prefetch mode, -1: the library's default */
    int fastest;     /* --fastest: each figure is the fastest repetition, not the median */
    uint32_t shared_prefix, tail; /* --shared-prefix, --tail */
} opts;

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_attn [options]\n"
               "Decode attention GB/s per codec against a read-bandwidth probe; paged vs "
               "contiguous.\n"
               "  --types LIST       kv types (default: every type the library knows)\n"
               "  --ctx LIST         context lengths (default 1024,4096,16384,32768)\n"
               "  --batch LIST       sequences per run (default 1,4,16)\n"
               "  --gqa LIST         query heads per KV head (default 1,4)\n"
               "  --kv-heads N       KV heads (default 8)\n"
               "  --head-dim N       head dimension (default 128)\n"
               "  --page-tokens N    tokens per page (default 16)\n"
               "  --max-tokens N     skip configs with batch*ctx above N (default 131072)\n"
               "  --threads N        threads (default: online CPUs)\n"
               "  --min-reps N       timed repetitions at least (default 5)\n"
               "  --min-ms X         timed milliseconds at least per figure (default 150)\n"
               "  --prefill N        prefill chunk rows (default 512; 0: skip)\n"
               "  --prefill-depth N  prefix before the chunk (default 2048)\n"
               "  --paged-only       skip the contiguous layout\n"
               "  --hugepages        madvise(MADV_HUGEPAGE) the pool arenas again (the pool now\n"
               "                     does it itself; kept for older comparisons)\n"
               "  --small-probe      leave the probe buffer on 4 KiB pages (default: it is\n"
               "                     madvised MADV_HUGEPAGE like the pool's arena, so that both\n"
               "                     read through the same kind of pages)\n"
               "  --cpu-time         time on the thread's CPU clock instead of the wall clock\n"
               "                     (--threads 1 only): on a shared, loaded machine this drops\n"
               "                     the time the thread waits for a core, not its cache misses\n"
               "  --wide N           KV heads per decode task (default 0: the library's\n"
               "                     default, the most its scratch allows; 1: one per head)\n"
               "  --scores           decode with scores (pgd_attn_run_scored) against without,\n"
               "                     paged only, no prefill: the cost of scoring\n"
               "  --gemma            decode plain, with soft-cap 50 and as a window layer, in\n"
               "                     turn on the same sequences (paged only, no prefill)\n"
               "  --window N         --gemma's window (default 1024)\n"
               "  --shared-prefix N  decode of --batch sequences forked from one N-token\n"
               "                     prefix, each with --tail own tokens, with the shared\n"
               "                     tiles on and off in turn (paged only, no prefill)\n"
               "  --tail N           --shared-prefix's own tokens per sequence (default 64)\n"
               "  --isa NAME         attention level: scalar, avx2 (the AVX2 codec tables and\n"
               "                     step, what an AVX2-only CPU runs) or avx512 (default: the\n"
               "                     CPU's best)\n"
               "  --prefetch N       software prefetch mode (0 none, 1 burst, 2 spread; default\n"
               "                     the library's)\n"
               "  --fastest          each figure (attention and probe alike) is the fastest\n"
               "                     repetition instead of the median: on a loaded machine the\n"
               "                     closest to what the code does alone\n"
               "  --seed N           K/V and query seed (default 1)\n"
               "  --json             one JSON object per result line\n"
               "  --smoke            tiny and fast (ctest)\n"
               "  --help             show this help\n");
}

/* A list option: at most max numbers, each >= 1. */
static int parse_list(const char *s, uint32_t *out, int max)
{
    return bench_parse_u32_list(s, out, max, 1);
}

/* ---- time ---- */

static clockid_t bench_clock = CLOCK_MONOTONIC; /* --cpu-time: the thread's CPU clock */

static double now_s(void)
{
    return bench_clock_s(bench_clock);
}

/* Whether a timing loop that started at t_start and has k repetitions runs another one:
 * at least --min-reps and --min-ms, at most 4096. */
static int more_reps(int k, double t_start, const opts *o)
{
    return k < 4096 && (k < (int)o->min_reps || now_s() - t_start < o->min_ms * 1e-3);
}

static int pick_fastest; /* --fastest */

/* The figure of n timed repetitions: their median, or with --fastest their minimum. */
static double pick(double *t, size_t n)
{
    if (!pick_fastest) return bench_median(t, n);
    double m = t[0];
    for (size_t i = 1; i < n; i++)
        m = t[i] < m ? t[i] : m;
    return m;
}

/* ---- the thread pool (the bench's pgd_parallel_fn) ---- */

typedef struct bpool {
    uint32_t n;
    pthread_t th[256];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint gen, next, done;
    atomic_int stop;
    pgd_task_fn fn;
    void *ud;
    uint32_t n_tasks;
} bpool;

typedef struct bworker {
    bpool *p;
    uint32_t id;
} bworker;

static bworker workers[256];

static void claim(bpool *p, uint32_t thread)
{
    for (;;) {
        uint32_t i = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (i >= p->n_tasks) break;
        p->fn(p->ud, i, thread);
    }
}

static void *worker_main(void *arg)
{
    bworker *w = arg;
    bpool *p = w->p;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        for (;;) {
            g = atomic_load_explicit(&p->gen, memory_order_acquire);
            if (g != seen) break;
            if (++spins < 200000) {
#if defined(__x86_64__)
                _mm_pause();
#endif
                continue;
            }
            pthread_mutex_lock(&p->mu);
            while (atomic_load_explicit(&p->gen, memory_order_acquire) == seen)
                pthread_cond_wait(&p->cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        seen = g;
        if (atomic_load(&p->stop)) return NULL;
        claim(p, w->id);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_acq_rel);
    }
}

static void bpool_run(void *exec_ud, pgd_task_fn fn, void *ud, uint32_t n_tasks)
{
    bpool *p = exec_ud;
    if (p->n == 1) {
        for (uint32_t i = 0; i < n_tasks; i++)
            fn(ud, i, 0);
        return;
    }
    p->fn = fn;
    p->ud = ud;
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    claim(p, 0);
    while (atomic_load_explicit(&p->done, memory_order_acquire) != p->n - 1) {
#if defined(__x86_64__)
        _mm_pause();
#endif
    }
}

static int bpool_start(bpool *p, uint32_t n)
{
    memset(p, 0, sizeof *p);
    p->n = n;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    for (uint32_t i = 1; i < n; i++) {
        workers[i] = (bworker){p, i};
        if (pthread_create(&p->th[i], NULL, worker_main, &workers[i]) != 0) {
            p->n = i;
            return -1;
        }
    }
    return 0;
}

static void bpool_stop(bpool *p)
{
    atomic_store(&p->stop, 1);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (uint32_t i = 1; i < p->n; i++)
        pthread_join(p->th[i], NULL);
}

/* ---- the read-bandwidth probe ---- */

typedef struct probe {
    const unsigned char *buf;
    size_t bytes, chunk;
    float sums[4096];
} probe;

#if defined(__x86_64__)
__attribute__((target("avx512f"))) static float sum_avx512(const float *x, size_t n)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        a0 = _mm512_add_ps(a0, _mm512_loadu_ps(x + i));
        a1 = _mm512_add_ps(a1, _mm512_loadu_ps(x + i + 16));
        a2 = _mm512_add_ps(a2, _mm512_loadu_ps(x + i + 32));
        a3 = _mm512_add_ps(a3, _mm512_loadu_ps(x + i + 48));
    }
    float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    for (; i < n; i++)
        s += x[i];
    return s;
}

__attribute__((target("avx2"))) static float sum_avx2(const float *x, size_t n)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_loadu_ps(x + i));
        a1 = _mm256_add_ps(a1, _mm256_loadu_ps(x + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_loadu_ps(x + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_loadu_ps(x + i + 24));
    }
    float t[8];
    _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    float s = t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
    for (; i < n; i++)
        s += x[i];
    return s;
}
#endif

static float sum_floats(const float *x, size_t n)
{
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx512f")) return sum_avx512(x, n);
    if (__builtin_cpu_supports("avx2")) return sum_avx2(x, n);
#endif
    float s = 0;
    for (size_t i = 0; i < n; i++)
        s += x[i];
    return s;
}

static void probe_task(void *ud, uint32_t task, uint32_t thread)
{
    probe *p = ud;
    size_t a = (size_t)task * p->chunk, b = a + p->chunk < p->bytes ? a + p->chunk : p->bytes;
    p->sums[task] = sum_floats((const float *)(p->buf + a), (b - a) / sizeof(float));
}

/* Times one read of bytes of buf on the pool; returns seconds (median). */
static double probe_time(bpool *bp, probe *pr, size_t bytes, const opts *o)
{
    uint32_t n_tasks = bp->n * 4;
    pr->bytes = bytes;
    pr->chunk = ((bytes + n_tasks - 1) / n_tasks + 63) & ~(size_t)63;
    n_tasks = (uint32_t)((bytes + pr->chunk - 1) / pr->chunk);
    double t[4096];
    int n = 0;
    bpool_run(bp, probe_task, pr, n_tasks); /* warm-up */
    double t_start = now_s();
    while (more_reps(n, t_start, o)) {
        double t0 = now_s();
        bpool_run(bp, probe_task, pr, n_tasks);
        t[n++] = now_s() - t0;
    }
    return pick(t, (size_t)n);
}

/* ---- K/V fill ---- */

typedef struct fill {
    pgd_cache *c;
    pgd_seq *seq[64];
    uint32_t n_seq;
} fill;

static pgd_cache *make_cache(pgd_kv_type type, const opts *o, uint64_t tokens)
{
    pgd_cache_params cp = pgd_cache_default_params();
    cp.pool.n_layers = 1;
    cp.pool.n_kv_heads = o->n_kv;
    cp.pool.head_dim = o->hd;
    cp.pool.page_tokens = o->pt;
    cp.pool.kv_type = type;
    cp.pool.capacity_pages = (uint32_t)((tokens + o->pt - 1) / o->pt + 4);
    cp.kv_residual = o->pt;
    pgd_cache *c = NULL;
    int rc = pgd_cache_create(&cp, &c);
    if (rc != PGD_OK) {
        fprintf(stderr, "bench_attn: %s cache of %llu tokens: %s\n", pgd_kv_type_name(type),
                (unsigned long long)tokens, pgd_strerror(rc));
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    if (o->hugepages) {
        pgd_pool *pool = pgd_cache_pool(c);
        uintptr_t b = (uintptr_t)pgd_pool_page_data(pool, 0), huge = (uintptr_t)2 << 20;
        uintptr_t e = b + (uintptr_t)pgd_pool_n_pages(pool) * pgd_pool_page_bytes(pool);
        uintptr_t a0 = (b + huge - 1) & ~(huge - 1), a1 = e & ~(huge - 1);
        if (a1 > a0 && madvise((void *)a0, a1 - a0, MADV_HUGEPAGE) != 0)
            fprintf(stderr, "bench_attn: madvise(MADV_HUGEPAGE) failed\n");
    }
#endif
    return c;
}

/* Shuffles the pool's free list: many one-page sequences destroyed in random order. */
static int scatter_pages(pgd_cache *c, uint32_t n_pages, uint64_t *rng, uint32_t pt)
{
    pgd_seq **s = calloc(n_pages, sizeof *s);
    if (!s) return -1;
    int rc = 0;
    uint32_t n = 0;
    for (; n < n_pages; n++) {
        if (pgd_seq_create(c, NULL, 0, &s[n]) != PGD_OK) break;
        if (pgd_seq_grow(c, s[n], pt) != PGD_OK) {
            pgd_seq_destroy(c, s[n]);
            break;
        }
    }
    for (uint32_t i = n; i > 1; i--) {
        uint32_t j = (uint32_t)(bench_rng(rng) % i);
        pgd_seq *t = s[i - 1];
        s[i - 1] = s[j];
        s[j] = t;
    }
    for (uint32_t i = 0; i < n; i++)
        pgd_seq_destroy(c, s[i]);
    free(s);
    return rc;
}

/* Grows n_seq sequences of len tokens and writes K/V (seeded per sequence, so the paged
 * and contiguous caches hold the same values). */
static int fill_seqs(fill *f, uint32_t n_seq, uint32_t len, const opts *o)
{
    const uint32_t chunk = 512;
    const size_t row = (size_t)o->n_kv * o->hd;
    float *k = malloc(chunk * row * sizeof *k), *v = malloc(chunk * row * sizeof *v);
    int rc = k && v ? 0 : -1;
    for (uint32_t i = 0; i < n_seq && !rc; i++) {
        uint64_t rng = o->b.seed * 1000003u + i + 1;
        if (pgd_seq_create(f->c, NULL, 0, &f->seq[i]) != PGD_OK ||
            pgd_seq_grow(f->c, f->seq[i], len) != PGD_OK) {
            rc = -1;
            break;
        }
        f->n_seq = i + 1;
        for (uint32_t p0 = 0; p0 < len && !rc; p0 += chunk) {
            uint32_t n = len - p0 < chunk ? len - p0 : chunk;
            for (size_t j = 0; j < (size_t)n * row; j++) {
                k[j] = bench_randf(&rng) + 0.2f * (float)((j % o->hd) % 7) - 0.6f;
                v[j] = bench_randf(&rng);
            }
            if (pgd_seq_write_kv(f->c, f->seq[i], p0, n, 0, k, v) != PGD_OK) rc = -1;
        }
    }
    free(k);
    free(v);
    return rc;
}

static void fill_free(fill *f)
{
    for (uint32_t i = 0; i < f->n_seq; i++)
        pgd_seq_destroy(f->c, f->seq[i]);
    pgd_cache_destroy(f->c);
    memset(f, 0, sizeof *f);
}

/* ---- measuring attention ---- */

typedef struct result {
    double t, gbs, probe_gbs;
} result;

static uint64_t checksum;

static void fold(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t b;
        float r = roundf(x[i] * 4096.0f) / 4096.0f; /* robust to last-bit differences */
        memcpy(&b, &r, sizeof b);
        checksum = (checksum ^ b) * 1099511628211ull;
    }
}

/* Times the paged run, the contiguous run (a[1] may be NULL) and the probe read of the
 * same bytes in turn, repetition by repetition, so that a machine whose load drifts slows
 * all three alike and the ratios stay fair. t[0..2]: median seconds; returns < 0 on error. */
static int time_decode(pgd_attn *a[2], pgd_attn_item *it[2], uint32_t n, bpool *bp, probe *pr,
                       size_t bytes, const opts *o, double t[3])
{
    static double s[3][4096];
    uint32_t n_tasks = bp->n * 4;
    pr->bytes = bytes;
    pr->chunk = ((bytes + n_tasks - 1) / n_tasks + 63) & ~(size_t)63;
    n_tasks = (uint32_t)((bytes + pr->chunk - 1) / pr->chunk);
    for (int l = 0; l < 2; l++) /* warm-up */
        if (a[l] && pgd_attn_run(a[l], 0, it[l], n) != PGD_OK) return -1;
    bpool_run(bp, probe_task, pr, n_tasks);
    int k = 0;
    double t_start = now_s();
    while (more_reps(k, t_start, o)) {
        for (int l = 0; l < 3; l++) {
            if (l < 2 && !a[l]) continue;
            double t0 = now_s();
            if (l < 2)
                pgd_attn_run(a[l], 0, it[l], n);
            else
                bpool_run(bp, probe_task, pr, n_tasks);
            s[l][k] = now_s() - t0;
        }
        k++;
    }
    for (int l = 0; l < 3; l++) {
        t[l] = 0;
        if (l < 2 && !a[l]) continue;
        t[l] = pick(s[l], (size_t)k);
    }
    return 0;
}

/* Times pgd_attn_run and pgd_attn_run_scored (scores sc) on the same items in turn,
 * repetition by repetition. t[0] plain, t[1] scored: median seconds; returns < 0 on error. */
static int time_scores(pgd_attn *a, pgd_attn_item *it, const pgd_attn_scores *sc, uint32_t n,
                       const opts *o, double t[2])
{
    static double s[2][4096];
    if (pgd_attn_run(a, 0, it, n) != PGD_OK || pgd_attn_run_scored(a, 0, it, sc, n) != PGD_OK)
        return -1; /* warm-up */
    int k = 0;
    double t_start = now_s();
    while (more_reps(k, t_start, o)) {
        for (int l = 0; l < 2; l++) {
            double t0 = now_s();
            if (l == 0)
                pgd_attn_run(a, 0, it, n);
            else
                pgd_attn_run_scored(a, 0, it, sc, n);
            s[l][k] = now_s() - t0;
        }
        k++;
    }
    t[0] = pick(s[0], (size_t)k);
    t[1] = pick(s[1], (size_t)k);
    return 0;
}

/* Times pgd_attn_run of a[0..n_a) on the same items in turn, repetition by repetition:
 * t[l] median seconds of a[l]; returns < 0 on error. */
static int time_variants(pgd_attn *const *a, int n_a, pgd_attn_item *it, uint32_t n, const opts *o,
                         double *t)
{
    static double s[4][4096];
    for (int l = 0; l < n_a; l++) /* warm-up */
        if (pgd_attn_run(a[l], 0, it, n) != PGD_OK) return -1;
    int k = 0;
    double t_start = now_s();
    while (more_reps(k, t_start, o)) {
        for (int l = 0; l < n_a; l++) {
            double t0 = now_s();
            pgd_attn_run(a[l], 0, it, n);
            s[l][k] = now_s() - t0;
        }
        k++;
    }
    for (int l = 0; l < n_a; l++)
        t[l] = pick(s[l], (size_t)k);
    return 0;
}

/* Times pgd_attn_run on items; returns the median seconds, or < 0 on error. */
static double time_attn(pgd_attn *a, pgd_attn_item *it, uint32_t n, const opts *o)
{
    double t[4096];
    int k = 0;
    if (pgd_attn_run(a, 0, it, n) != PGD_OK) return -1; /* warm-up */
    double t_start = now_s();
    while (more_reps(k, t_start, o)) {
        double t0 = now_s();
        pgd_attn_run(a, 0, it, n);
        t[k++] = now_s() - t0;
    }
    return pick(t, (size_t)k);
}

/* Applies the options that tune an attention context (--isa, --prefetch, --wide); returns
 * PGD_OK or the status of the forced level. */
static int tune_attn(pgd_attn *a, const opts *o)
{
    pgd__attn_set_wide(a, o->wide);
    if (o->prefetch >= 0) pgd__attn_set_prefetch(a, o->prefetch);
    return o->isa >= 0 ? pgd__attn_force_isa(a, o->isa) : PGD_OK;
}

static void print_scores_header(void)
{
    printf("%-6s %4s %6s %5s %12s %12s %8s\n", "type", "gqa", "ctx", "batch", "plain us",
           "scored us", "scored/plain");
}

static void print_gemma_header(uint32_t window)
{
    char w[32];
    snprintf(w, sizeof w, "win%u us", window);
    printf("%-6s %4s %6s %5s %10s %10s %9s %10s %9s\n", "type", "gqa", "ctx", "batch", "plain us",
           "cap50 us", "cap/plain", w, "win/plain");
}

static void print_header(void)
{
    printf("%-6s %4s %6s %5s %9s %10s %8s %8s %6s %6s\n", "type", "gqa", "ctx", "batch", "KV MB",
           "time us", "GB/s", "probe", "%bw", "p/c");
}

static void print_shared_header(uint32_t prefix, uint32_t tail)
{
    printf("shared prefix %u tokens, %u own tokens per sequence\n", prefix, tail);
    printf("%-6s %4s %5s %10s %10s %7s %9s %9s %7s\n", "type", "gqa", "batch", "shared us",
           "own us", "own/sh", "shared MB", "own MB", "MB o/s");
}

/* Grows s by n positions and writes seeded random K/V for them. */
static int extend_seq(pgd_cache *c, pgd_seq *s, uint32_t n, const opts *o, uint64_t *rng)
{
    const size_t row = (size_t)o->n_kv * o->hd;
    const uint64_t pos0 = pgd_seq_length(c, s);
    float *k = malloc((size_t)n * row * sizeof *k), *v = malloc((size_t)n * row * sizeof *v);
    int rc = k && v && pgd_seq_grow(c, s, n) == PGD_OK ? 0 : -1;
    for (size_t j = 0; !rc && j < (size_t)n * row; j++) {
        k[j] = bench_randf(rng) + 0.2f * (float)((j % o->hd) % 7) - 0.6f;
        v[j] = bench_randf(rng);
    }
    if (!rc && pgd_seq_write_kv(c, s, pos0, n, 0, k, v) != PGD_OK) rc = -1;
    free(k);
    free(v);
    return rc;
}

/* --shared-prefix: per type, GQA and batch, `batch` forks of one prefix, each extended by
 * --tail tokens, on a shuffled pool; decode timed with shared tiles on and off in turn. */
static int bench_shared(const opts *o, bpool *bp)
{
    const uint32_t P = o->shared_prefix;
    for (uint32_t ti = 0; ti < o->n_types; ti++) {
        const pgd_kv_type type = o->types[ti];
        for (uint32_t bi = 0; bi < o->n_batch; bi++) {
            const uint32_t batch = o->batch[bi];
            const uint64_t tokens = P + (uint64_t)batch * (o->tail + o->pt);
            uint64_t rng = o->b.seed;
            pgd_cache *c = make_cache(type, o, tokens);
            if (!c) return 1;
            scatter_pages(c, (uint32_t)((tokens + o->pt - 1) / o->pt), &rng, o->pt);
            pgd_seq *base = NULL, *seq[64] = {NULL};
            int32_t *toks = malloc((size_t)P * sizeof *toks);
            int rc = toks && pgd_seq_create(c, NULL, 0, &base) == PGD_OK ? 0 : -1;
            for (uint32_t d = 0; !rc && d < P; d += 512)
                rc = extend_seq(c, base, P - d < 512 ? P - d : 512, o, &rng);
            for (uint32_t i = 0; toks && i < P; i++)
                toks[i] = (int32_t)(i * 7 + 1);
            if (!rc && pgd_seq_commit(c, base, toks, P) < 0) rc = -1;
            for (uint32_t i = 0; !rc && i < batch; i++) {
                if (pgd_seq_fork(c, base, &seq[i]) != PGD_OK) rc = -1;
                if (!rc && o->tail) rc = extend_seq(c, seq[i], o->tail, o, &rng);
            }
            free(toks);
            for (uint32_t gi = 0; gi < o->n_gqa && !rc; gi++) {
                const uint32_t n_head = o->n_kv * o->gqa[gi];
                const size_t per = (size_t)n_head * o->hd;
                pgd_attn_params ap = pgd_attn_default_params();
                ap.n_head = n_head;
                ap.n_threads = o->threads;
                ap.parallel = bpool_run;
                ap.parallel_ud = bp;
                ap.max_rows = batch;
                float *q = malloc((size_t)batch * per * sizeof *q);
                float *out = malloc((size_t)batch * per * 2 * sizeof *out);
                pgd_attn *a[2] = {NULL, NULL};
                pgd_attn_item it[2][64];
                uint64_t qr = o->b.seed + 17;
                for (size_t i = 0; q && i < (size_t)batch * per; i++)
                    q[i] = bench_randf(&qr);
                if (!q || !out) rc = -1;
                for (int l = 0; l < 2 && !rc; l++) {
                    if (pgd_attn_create(c, &ap, &a[l]) != PGD_OK || tune_attn(a[l], o) != PGD_OK)
                        rc = -1;
                    else
                        pgd__attn_set_shared(a[l], l == 0);
                    for (uint32_t i = 0; i < batch; i++)
                        it[l][i] = (pgd_attn_item){seq[i], 1, q + i * per,
                                                   out + ((size_t)l * batch + i) * per};
                }
                /* One run each: the bytes read (K and V regions), and equal bits. */
                double mb[2] = {0, 0};
                for (int l = 0; l < 2 && !rc; l++) {
                    uint64_t r0, s0, r1, s1;
                    pgd__attn_stats(a[l], &r0, &s0);
                    if (pgd_attn_run(a[l], 0, it[l], batch) != PGD_OK) rc = -1;
                    pgd__attn_stats(a[l], &r1, &s1);
                    mb[l] = (double)(r1 - r0) * 2 *
                            (double)pgd_pool_region_bytes(pgd_cache_pool(c)) / 1048576.0;
                }
                if (!rc &&
                    memcmp(out, out + (size_t)batch * per, (size_t)batch * per * sizeof *out)) {
                    fprintf(stderr, "bench_attn: shared tiles changed the outputs\n");
                    rc = -1;
                }
                double t[2];
                /* Timed in turn, repetition by repetition (each context on its own output buffers).
                 */
                if (!rc) {
                    static double s[2][4096];
                    for (int l = 0; l < 2; l++)
                        pgd_attn_run(a[l], 0, it[l], batch);
                    int k = 0;
                    const double t_start = now_s();
                    while (more_reps(k, t_start, o)) {
                        for (int l = 0; l < 2; l++) {
                            const double t0 = now_s();
                            pgd_attn_run(a[l], 0, it[l], batch);
                            s[l][k] = now_s() - t0;
                        }
                        k++;
                    }
                    t[0] = pick(s[0], (size_t)k);
                    t[1] = pick(s[1], (size_t)k);
                    fold(out, (size_t)batch * per);
                    if (o->b.json)
                        printf(
                            "{\"type\": \"%s\", \"gqa\": %u, \"prefix\": %u, \"tail\": %u, "
                            "\"batch\": %u, \"shared_us\": %.2f, \"own_us\": %.2f, "
                            "\"own_over_shared\": %.4f, \"shared_mb\": %.3f, \"own_mb\": %.3f}\n",
                            pgd_kv_type_name(type), o->gqa[gi], P, o->tail, batch, t[0] * 1e6,
                            t[1] * 1e6, t[1] / t[0], mb[0], mb[1]);
                    else
                        printf("%-6s %4u %5u %10.1f %10.1f %7.3f %9.2f %9.2f %7.2f\n",
                               pgd_kv_type_name(type), o->gqa[gi], batch, t[0] * 1e6, t[1] * 1e6,
                               t[1] / t[0], mb[0], mb[1], mb[1] / mb[0]);
                }
                pgd_attn_destroy(a[0]);
                pgd_attn_destroy(a[1]);
                free(q);
                free(out);
            }
            for (uint32_t i = 0; i < batch; i++)
                if (seq[i]) pgd_seq_destroy(c, seq[i]);
            if (base) pgd_seq_destroy(c, base);
            pgd_cache_destroy(c);
            if (rc) {
                fprintf(stderr, "bench_attn: --shared-prefix %s failed\n", pgd_kv_type_name(type));
                return 1;
            }
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    opts o;
    memset(&o, 0, sizeof o);
    o.n_ctx = (uint32_t)parse_list("1024,4096,16384,32768", o.ctx, 16);
    o.n_batch = (uint32_t)parse_list("1,4,16", o.batch, 16);
    o.n_gqa = (uint32_t)parse_list("1,4", o.gqa, 8);
    o.n_kv = 8;
    o.hd = 128;
    o.pt = 16;
    o.max_tokens = 131072;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    o.threads = ncpu > 0 ? (uint32_t)ncpu : 1;
    o.min_reps = 5;
    o.min_ms = 150;
    o.prefill = 512;
    o.prefill_depth = 2048;
    o.layouts = 3;
    o.window = 1024;
    o.isa = -1;
    o.prefetch = -1;
    o.tail = 64;
    for (int t = 0; strcmp(pgd_kv_type_name((pgd_kv_type)t), "?") != 0 && t < 8; t++)
        o.types[o.n_types++] = (pgd_kv_type)t;

    static const struct option lo[] = {
        {"types", 1, 0, 't'},         {"ctx", 1, 0, 'c'},        {"batch", 1, 0, 'b'},
        {"gqa", 1, 0, 'g'},           {"kv-heads", 1, 0, 'k'},   {"head-dim", 1, 0, 'd'},
        {"page-tokens", 1, 0, 'p'},   {"max-tokens", 1, 0, 'm'}, {"threads", 1, 0, 'T'},
        {"min-reps", 1, 0, 'r'},      {"min-ms", 1, 0, 'M'},     {"prefill", 1, 0, 'P'},
        {"prefill-depth", 1, 0, 'D'}, {"paged-only", 0, 0, 'O'}, {"hugepages", 0, 0, 'H'},
        {"small-probe", 0, 0, 'B'},   {"cpu-time", 0, 0, 'C'},   {"wide", 1, 0, 'W'},
        {"scores", 0, 0, 'S'},        {"gemma", 0, 0, 'G'},      {"window", 1, 0, 'w'},
        {"isa", 1, 0, 'I'},           {"prefetch", 1, 0, 'F'},   {"fastest", 0, 0, 'X'},
        {"shared-prefix", 1, 0, 'R'}, {"tail", 1, 0, 'L'},       {0, 0, 0, 0}};
    bench_cli cli = {.prog = "bench_attn",
                     .usage = usage,
                     .own = lo,
                     .common = BENCH_SEED | BENCH_JSON | BENCH_SMOKE,
                     .a = {.seed = 1}};
    for (;;) {
        int c = bench_cli_next(&cli, argc, argv);
        if (c == -1) break;
        int bad = 0, n;
        uint32_t one[1] = {0};
        switch (c) {
        case 't':
            n = bench_parse_kv_types(optarg, o.types, 8);
            bad = n <= 0;
            o.n_types = bad ? o.n_types : (uint32_t)n;
            break;
        case 'c':
            n = parse_list(optarg, o.ctx, 16);
            bad = n <= 0;
            o.n_ctx = bad ? o.n_ctx : (uint32_t)n;
            break;
        case 'b':
            n = parse_list(optarg, o.batch, 16);
            bad = n <= 0;
            o.n_batch = bad ? o.n_batch : (uint32_t)n;
            for (uint32_t i = 0; !bad && i < o.n_batch; i++)
                bad = o.batch[i] > 64;
            break;
        case 'g':
            n = parse_list(optarg, o.gqa, 8);
            bad = n <= 0;
            o.n_gqa = bad ? o.n_gqa : (uint32_t)n;
            break;
        case 'k':
        case 'd':
        case 'p':
        case 'm':
        case 'T':
        case 'r':
        case 'D':
        case 'W':
        case 'w':
        case 'R':
        case 'L':
            bad = parse_list(optarg, one, 1) != 1;
            if (c == 'R') o.shared_prefix = one[0];
            if (c == 'L') o.tail = one[0];
            if (c == 'k') o.n_kv = one[0];
            if (c == 'd') o.hd = one[0];
            if (c == 'p') o.pt = one[0];
            if (c == 'm') o.max_tokens = one[0];
            if (c == 'T') o.threads = one[0] > 256 ? 256 : one[0];
            if (c == 'r') o.min_reps = one[0];
            if (c == 'D') o.prefill_depth = one[0];
            if (c == 'W') o.wide = one[0];
            if (c == 'w') o.window = one[0];
            break;
        case 'P':
            o.prefill = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        case 'M':
            o.min_ms = strtod(optarg, NULL);
            bad = !(o.min_ms >= 0);
            break;
        case 'O':
            o.layouts = 1;
            break;
        case 'H':
            o.hugepages = 1;
            break;
        case 'B':
            o.small_probe = 1;
            break;
        case 'C':
            o.cpu_time = 1;
            break;
        case 'S':
            o.scores = 1;
            break;
        case 'X':
            o.fastest = 1;
            break;
        case 'G':
            o.gemma = 1;
            break;
        case 'I':
            o.isa = !strcmp(optarg, "scalar")   ? PGD__ATTN_SCALAR
                    : !strcmp(optarg, "avx2")   ? PGD__ATTN_AVX2
                    : !strcmp(optarg, "avx512") ? PGD__ATTN_AVX512
                                                : -2;
            bad = o.isa == -2 || o.isa > pgd__attn_isa();
            break;
        case 'F': {
            char *end;
            long v = strtol(optarg, &end, 10);
            bad = *end || end == optarg || v < 0 || v > 2;
            o.prefetch = (int)v;
            break;
        }
        }
        if (bad) {
            fprintf(stderr, "bench_attn: bad option value '%s' (see --help)\n",
                    optarg ? optarg : "");
            return 2;
        }
    }
    if (cli.status >= 0) return cli.status;
    o.b = cli.a;
    if (o.b.smoke) {
        o.n_ctx = (uint32_t)parse_list("256,1024", o.ctx, 16);
        o.n_batch = (uint32_t)parse_list("1,3", o.batch, 16);
        o.n_kv = 2;
        o.hd = 64;
        o.min_reps = 2;
        o.min_ms = 0;
        o.prefill = 64;
        o.prefill_depth = 256;
        if (o.threads > 2) o.threads = 2;
    }

    if (o.scores || o.gemma) {
        o.layouts = 1;
        o.prefill = 0;
    }
    if (o.shared_prefix) {
        o.layouts = 1;
        o.prefill = 0;
    }
    if (o.scores + o.gemma + (o.shared_prefix > 0) > 1) {
        fprintf(stderr, "bench_attn: --scores, --gemma and --shared-prefix are separate modes\n");
        return 2;
    }
    if (o.cpu_time && o.threads != 1) {
        fprintf(stderr, "bench_attn: --cpu-time needs --threads 1 (it reads one thread's clock)\n");
        return 2;
    }
    if (o.cpu_time) bench_clock = CLOCK_THREAD_CPUTIME_ID;
    pick_fastest = o.fastest;
    bpool bp;
    if (bpool_start(&bp, o.threads) != 0) {
        fprintf(stderr, "bench_attn: cannot start %u threads\n", o.threads);
        return 1;
    }
    /* The DRAM line: a buffer far beyond the caches (smaller for --smoke). */
    size_t big = o.b.smoke ? (size_t)16 << 20 : (size_t)1 << 30;
    uint64_t max_bytes = 0;
    for (uint32_t ci = 0; ci < o.n_ctx; ci++)
        for (uint32_t bi = 0; bi < o.n_batch; bi++)
            if ((uint64_t)o.ctx[ci] * o.batch[bi] <= o.max_tokens) {
                uint64_t b = (uint64_t)o.ctx[ci] * o.batch[bi] * o.n_kv * o.hd * 2 * 4;
                if (b > max_bytes) max_bytes = b;
            }
    size_t buf_bytes = max_bytes > big ? (size_t)max_bytes : big;
    probe *pr = calloc(1, sizeof *pr);
    /* The probe reads through huge pages like the pool's arena (pool.c madvises it), unless
     * --small-probe: a fair ratio needs the same TLB reach on both sides. */
    unsigned char *buf = NULL;
    const size_t huge = (size_t)2 << 20;
    buf_bytes = (buf_bytes + huge - 1) & ~(huge - 1);
    if (posix_memalign((void **)&buf, huge, buf_bytes) != 0) buf = NULL;
#ifdef MADV_HUGEPAGE
    if (buf && !o.small_probe && madvise(buf, buf_bytes, MADV_HUGEPAGE) != 0)
        fprintf(stderr, "bench_attn: madvise(MADV_HUGEPAGE) of the probe buffer failed\n");
#endif
    if (!pr || !buf) {
        fprintf(stderr, "bench_attn: out of memory for a %zu-byte probe buffer\n", buf_bytes);
        return 1;
    }
    for (size_t i = 0; i < buf_bytes; i += sizeof(float)) {
        float one = 1.0f;
        memcpy(buf + i, &one, sizeof one);
    }
    pr->buf = buf;
    const double dram_gbs = (double)big / probe_time(&bp, pr, big, &o) * 1e-9;
    if (!o.b.json) {
        static const char *const isa_names[] = {"scalar", "avx2", "avx512"};
        printf("bench_attn: %u threads, %u KV heads, head_dim %u, %u tokens/page, probe on %s "
               "pages, %s clock, isa %s%s, %s\n",
               o.threads, o.n_kv, o.hd, o.pt, o.small_probe ? "4 KiB" : "huge",
               o.cpu_time ? "thread CPU" : "wall", isa_names[o.isa >= 0 ? o.isa : pgd__attn_isa()],
               o.isa >= 0 ? " (forced)" : "", o.fastest ? "fastest repetition" : "median");
        printf("read probe (%zu MiB, beyond the caches): %.1f GB/s\n", big >> 20, dram_gbs);
        if (o.shared_prefix)
            print_shared_header(o.shared_prefix, o.tail);
        else if (o.scores)
            print_scores_header();
        else if (o.gemma)
            print_gemma_header(o.window);
        else
            print_header();
    } else {
        printf("{\"probe_dram_gbs\": %.2f, \"threads\": %u, \"isa\": %d}\n", dram_gbs, o.threads,
               o.isa >= 0 ? o.isa : pgd__attn_isa());
    }

    uint32_t max_batch = 0;
    for (uint32_t bi = 0; bi < o.n_batch; bi++)
        max_batch = o.batch[bi] > max_batch ? o.batch[bi] : max_batch;
    /* Long-context summary: time per type at the largest ctx, batch 1, first GQA. */
    double t_long[8] = {0};
    double f16_bw_gqa1 = -1, worst_pc = 10;
    int rc = 0;

    if (o.shared_prefix) rc = bench_shared(&o, &bp);
    for (uint32_t ti = 0; ti < o.n_types && !rc && !o.shared_prefix; ti++) {
        const pgd_kv_type type = o.types[ti];
        for (uint32_t ci = 0; ci < o.n_ctx && !rc; ci++) {
            const uint32_t ctx = o.ctx[ci];
            uint32_t nb = 0;
            for (uint32_t bi = 0; bi < o.n_batch; bi++)
                if ((uint64_t)ctx * o.batch[bi] <= o.max_tokens && o.batch[bi] > nb)
                    nb = o.batch[bi];
            if (!nb) continue;
            const uint64_t tokens = (uint64_t)ctx * nb;
            fill f[2];
            memset(f, 0, sizeof f);
            uint64_t rng = o.b.seed;
            for (int l = 0; l < 2 && !rc; l++) {
                if (l == 1 && o.layouts == 1) break;
                /* l = 0 paged (shuffled page ids), 1 contiguous (fresh pool). */
                f[l].c = make_cache(type, &o, tokens);
                if (!f[l].c) {
                    rc = 1;
                    break;
                }
                if (l == 0)
                    scatter_pages(f[l].c, (uint32_t)((tokens + o.pt - 1) / o.pt), &rng, o.pt);
                if (fill_seqs(&f[l], nb, ctx, &o) != 0) {
                    fprintf(stderr, "bench_attn: filling %s caches failed\n",
                            pgd_kv_type_name(type));
                    rc = 1;
                }
            }
            pgd_pool *pool = f[0].c ? pgd_cache_pool(f[0].c) : NULL;
            const uint64_t region = pool ? pgd_pool_region_bytes(pool) : 0;
            for (uint32_t gi = 0; gi < o.n_gqa && !rc; gi++) {
                const uint32_t n_head = o.n_kv * o.gqa[gi];
                pgd_attn_params ap = pgd_attn_default_params();
                ap.n_head = n_head;
                ap.n_threads = o.threads;
                ap.parallel = bpool_run;
                ap.parallel_ud = &bp;
                ap.max_rows = max_batch > o.prefill ? max_batch : o.prefill;
                ap.score_keys = o.scores ? ctx : 0;
                pgd_attn_item it[2][64];
                float *q = malloc((size_t)max_batch * n_head * o.hd * sizeof *q);
                float *out = malloc((size_t)max_batch * n_head * o.hd * sizeof *out);
                uint64_t qr = o.b.seed + 17;
                for (size_t i = 0; q && i < (size_t)max_batch * n_head * o.hd; i++)
                    q[i] = bench_randf(&qr);
                for (uint32_t bi = 0; bi < o.n_batch && q && out && !rc; bi++) {
                    const uint32_t batch = o.batch[bi];
                    if ((uint64_t)ctx * batch > o.max_tokens) continue;
                    double t[3] = {0, 0, 0};
                    pgd_attn *a[2] = {NULL, NULL};
                    pgd_attn_item *itl[2] = {it[0], it[1]};
                    for (int l = 0; l < 2 && !rc; l++) {
                        if (!f[l].c) continue;
                        if (pgd_attn_create(f[l].c, &ap, &a[l]) != PGD_OK ||
                            tune_attn(a[l], &o) != PGD_OK) {
                            fprintf(stderr, "bench_attn: pgd_attn_create failed\n");
                            rc = 1;
                            break;
                        }
                        for (uint32_t i = 0; i < batch; i++)
                            it[l][i] =
                                (pgd_attn_item){f[l].seq[i], 1, q + (size_t)i * n_head * o.hd,
                                                out + (size_t)i * n_head * o.hd};
                    }
                    const uint64_t pages = (uint64_t)batch * ((ctx + o.pt - 1) / o.pt);
                    const double bytes = (double)pages * o.n_kv * 2 * (double)region;
                    if (!rc && o.scores) {
                        /* Scored against plain decode on the same sequences. */
                        pgd_attn_scores sc[64];
                        float *sbuf = calloc((size_t)batch * o.n_kv * ctx, sizeof *sbuf);
                        for (uint32_t i = 0; sbuf && i < batch; i++)
                            sc[i] = (pgd_attn_scores){sbuf + (size_t)i * o.n_kv * ctx, 1, ctx};
                        double ts[2];
                        if (!sbuf || time_scores(a[0], it[0], sc, batch, &o, ts) != 0) {
                            fprintf(stderr, "bench_attn: scored run failed\n");
                            rc = 1;
                        } else {
                            fold(out, (size_t)batch * n_head * o.hd);
                            fold(sbuf, (size_t)batch * o.n_kv * ctx);
                            if (o.b.json)
                                printf("{\"type\": \"%s\", \"gqa\": %u, \"ctx\": %u, "
                                       "\"batch\": %u, \"plain_us\": %.2f, \"scored_us\": %.2f, "
                                       "\"scored_over_plain\": %.4f}\n",
                                       pgd_kv_type_name(type), o.gqa[gi], ctx, batch, ts[0] * 1e6,
                                       ts[1] * 1e6, ts[1] / ts[0]);
                            else
                                printf("%-6s %4u %6u %5u %12.1f %12.1f %8.3f\n",
                                       pgd_kv_type_name(type), o.gqa[gi], ctx, batch, ts[0] * 1e6,
                                       ts[1] * 1e6, ts[1] / ts[0]);
                        }
                        free(sbuf);
                        pgd_attn_destroy(a[0]);
                        if (rc) break;
                        continue;
                    }
                    if (!rc && o.gemma) {
                        /* Plain, soft-capped and windowed decode on the same sequences. */
                        pgd_attn *av[3] = {a[0], NULL, NULL};
                        pgd_attn_params cp = ap, wp = ap;
                        cp.softcap = 50.0f;
                        wp.layer_window = &o.window; /* the pool has one layer */
                        double tv[3];
                        if (pgd_attn_create(f[0].c, &cp, &av[1]) != PGD_OK ||
                            pgd_attn_create(f[0].c, &wp, &av[2]) != PGD_OK ||
                            tune_attn(av[1], &o) != PGD_OK || tune_attn(av[2], &o) != PGD_OK ||
                            time_variants(av, 3, it[0], batch, &o, tv) != 0) {
                            fprintf(stderr, "bench_attn: gemma runs failed\n");
                            rc = 1;
                        } else {
                            for (int l = 0; l < 3; l++) {
                                pgd_attn_run(av[l], 0, it[0], batch);
                                fold(out, (size_t)batch * n_head * o.hd);
                            }
                            if (o.b.json)
                                printf("{\"type\": \"%s\", \"gqa\": %u, \"ctx\": %u, "
                                       "\"batch\": %u, \"window\": %u, \"plain_us\": %.2f, "
                                       "\"softcap_us\": %.2f, \"softcap_over_plain\": %.4f, "
                                       "\"window_us\": %.2f, \"window_over_plain\": %.4f}\n",
                                       pgd_kv_type_name(type), o.gqa[gi], ctx, batch, o.window,
                                       tv[0] * 1e6, tv[1] * 1e6, tv[1] / tv[0], tv[2] * 1e6,
                                       tv[2] / tv[0]);
                            else
                                printf("%-6s %4u %6u %5u %10.1f %10.1f %9.3f %10.1f %9.3f\n",
                                       pgd_kv_type_name(type), o.gqa[gi], ctx, batch, tv[0] * 1e6,
                                       tv[1] * 1e6, tv[1] / tv[0], tv[2] * 1e6, tv[2] / tv[0]);
                        }
                        for (int l = 0; l < 3; l++)
                            pgd_attn_destroy(av[l]);
                        if (rc) break;
                        continue;
                    }
                    if (!rc && time_decode(a, itl, batch, &bp, pr, (size_t)bytes, &o, t) != 0)
                        rc = 1;
                    if (!rc && pgd_attn_run(a[0], 0, it[0], batch) == PGD_OK) /* paged output */
                        fold(out, (size_t)batch * n_head * o.hd);
                    pgd_attn_destroy(a[0]);
                    pgd_attn_destroy(a[1]);
                    if (rc) break;
                    const double pt_s = t[2];
                    const double gbs = bytes / t[0] * 1e-9, pgbs = bytes / pt_s * 1e-9;
                    const double pc = t[1] > 0 ? t[1] / t[0] : 0;
                    if (pc > 0 && ctx * batch >= 4096 && pc < worst_pc) worst_pc = pc;
                    if (type == PGD_KV_F16 && o.gqa[gi] == 1 && ctx == o.ctx[o.n_ctx - 1] &&
                        batch == o.batch[0])
                        f16_bw_gqa1 = gbs / pgbs;
                    if (ci == o.n_ctx - 1 && bi == 0 && gi == 0) t_long[ti] = t[0];
                    if (o.b.json)
                        printf("{\"type\": \"%s\", \"gqa\": %u, \"ctx\": %u, \"batch\": %u, "
                               "\"kv_bytes\": %.0f, \"time_us\": %.2f, \"gbs\": %.2f, "
                               "\"probe_gbs\": %.2f, \"bw_ratio\": %.3f, "
                               "\"paged_over_contiguous\": %.3f}\n",
                               pgd_kv_type_name(type), o.gqa[gi], ctx, batch, bytes, t[0] * 1e6,
                               gbs, pgbs, gbs / pgbs, pc);
                    else
                        printf("%-6s %4u %6u %5u %9.1f %10.1f %8.2f %8.2f %5.0f%% %6.3f\n",
                               pgd_kv_type_name(type), o.gqa[gi], ctx, batch, bytes / 1048576.0,
                               t[0] * 1e6, gbs, pgbs, 100.0 * gbs / pgbs, pc);
                }
                free(q);
                free(out);
            }
            fill_free(&f[0]);
            fill_free(&f[1]);
        }
    }

    /* Prefill: one chunk of o.prefill rows after prefill_depth tokens, f16, GQA first. */
    if (!rc && o.prefill) {
        for (uint32_t ti = 0; ti < o.n_types && !rc; ti++) {
            const pgd_kv_type type = o.types[ti];
            fill f;
            memset(&f, 0, sizeof f);
            uint32_t len = o.prefill_depth + o.prefill;
            f.c = make_cache(type, &o, len);
            if (!f.c || fill_seqs(&f, 1, len, &o) != 0) {
                rc = 1;
                break;
            }
            const uint32_t n_head = o.n_kv * o.gqa[o.n_gqa - 1];
            pgd_attn_params ap = pgd_attn_default_params();
            ap.n_head = n_head;
            ap.n_threads = o.threads;
            ap.parallel = bpool_run;
            ap.parallel_ud = &bp;
            ap.max_rows = o.prefill;
            float *q = malloc((size_t)o.prefill * n_head * o.hd * sizeof *q);
            float *out = malloc((size_t)o.prefill * n_head * o.hd * sizeof *out);
            uint64_t qr = o.b.seed + 5;
            for (size_t i = 0; q && i < (size_t)o.prefill * n_head * o.hd; i++)
                q[i] = bench_randf(&qr);
            pgd_attn *a = NULL;
            if (!q || !out || pgd_attn_create(f.c, &ap, &a) != PGD_OK ||
                tune_attn(a, &o) != PGD_OK) {
                rc = 1;
            } else {
                pgd_attn_item it = {f.seq[0], o.prefill, q, out};
                double t = time_attn(a, &it, 1, &o);
                fold(out, (size_t)o.prefill * n_head * o.hd);
                /* Causal pairs (row, key) times 4 * head_dim flops (QK and PV). */
                double pairs =
                    (double)o.prefill * o.prefill_depth + (double)o.prefill * (o.prefill + 1) / 2;
                double gflops = pairs * n_head * 4.0 * o.hd / t * 1e-9;
                if (o.b.json)
                    printf("{\"prefill_type\": \"%s\", \"rows\": %u, \"depth\": %u, \"gqa\": %u, "
                           "\"time_us\": %.1f, \"gflops\": %.2f, \"rows_per_s\": %.0f}\n",
                           pgd_kv_type_name(type), o.prefill, o.prefill_depth, o.gqa[o.n_gqa - 1],
                           t * 1e6, gflops, o.prefill / t);
                else
                    printf("prefill %-6s %u rows after %u, gqa %u: %10.1f us  %7.1f GFLOP/s  "
                           "%8.0f rows/s\n",
                           pgd_kv_type_name(type), o.prefill, o.prefill_depth, o.gqa[o.n_gqa - 1],
                           t * 1e6, gflops, o.prefill / t);
            }
            pgd_attn_destroy(a);
            free(q);
            free(out);
            fill_free(&f);
        }
    }

    if (!rc && !o.b.json && !o.scores && !o.gemma && !o.shared_prefix) {
        printf("summary: f16 gqa 1 at ctx %u: %.0f%% of the read probe (target >= 85%%)\n",
               o.ctx[o.n_ctx - 1], 100.0 * f16_bw_gqa1);
        if (worst_pc < 10)
            printf("summary: paged / contiguous worst %.3f (target >= 0.97)\n", worst_pc);
        double tf16 = 0;
        for (uint32_t ti = 0; ti < o.n_types; ti++)
            if (o.types[ti] == PGD_KV_F16) tf16 = t_long[ti];
        for (uint32_t ti = 0; ti < o.n_types && tf16 > 0; ti++)
            printf("summary: %-6s speed vs f16 at ctx %u batch %u gqa %u: %.2fx\n",
                   pgd_kv_type_name(o.types[ti]), o.ctx[o.n_ctx - 1], o.batch[0], o.gqa[0],
                   t_long[ti] > 0 ? tf16 / t_long[ti] : 0);
    }
    bench_print_checksum(checksum, o.b.json);
    bpool_stop(&bp);
    free(buf);
    free(pr);
    return rc;
}
