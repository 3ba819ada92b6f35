/* SPDX-License-Identifier: MIT */
/*
 * bench_tier.c - what the storage tiers below the pool (tier.h, cache.h "Tiers") buy, in
 * ratios against baselines measured in the same run (issue 11, "Benchmarks"):
 *
 *  1. TTFT of an N-token prompt (prefill + first token, through pe_forward_batch with the
 *     prompt's block hashes, as the scheduler runs it) when its KV is
 *       cold        not cached: the whole prompt is computed (the baseline)
 *       pool        in the pool (matched, pinned)
 *       ram         in the RAM tier only: evicted from the pool (pgd_cache_evict, then
 *                   pgd_cache_flush: write-back to tiers[0]), promoted by the match
 *       disk warm   in the disk tier only, after a restart (context and tiers destroyed, the
 *                   disk tier reopened on its directory; the page cache holds the files)
 *       disk cold   the same with the record files dropped from the page cache (fsync, then
 *                   posix_fadvise(POSIX_FADV_DONTNEED) on each; /proc/sys/vm/drop_caches
 *                   only if that left pages resident and it is writable; mincore says
 *                   what stayed)
 *     Matches cover the first N - 1 tokens (as the scheduler's do), so the last page is
 *     computed in every case; the logits of ram and disk runs must equal the pool run's
 *     bit for bit (lossless records, same computation), which the "logits" column checks.
 *  2. Promotion throughput: payload bytes promoted per second (match to pgd_seq_wait)
 *     from RAM against memcpy of as many bytes, and from disk (warm and cold) against
 *     read() of the tier's files into one buffer, as dd would (same page cache state).
 *  3. Demotion storm: decode ITL (ms per token, median) of a running request forked from
 *     the prompt, with and without a storm thread that fills and releases pages of
 *     another tenant so the pool evicts continuously (each eviction is demoted by the
 *     movers: pool -> RAM -> disk), paced by the write-back queue (or --storm-mibps).
 *
 * How the disk tier gets the prompt: the bench copies the RAM tier's records into it with
 * pgd_tier_get / pgd_tier_put (the calls the movers make), so that it holds exactly the
 * prompt's records and the RAM phase promotes from RAM alone. The disk tier lives in a
 * fresh directory under --dir, removed at the end. The extra cold repetitions (--cold-reps > 1)
 * run first on a context without tiers; the last one fills the tiered context.
 *
 *   bench_tier --model M.gguf [--tokens 8192] [-t 2] [--dir /tmp] [--reps 3]
 *   bench_tier --smoke        stories260K from ../shared/models, tiny sizes (ctest)
 *
 * Make the model with `pagoda synth-model --shape 1b --type q8_0 --ctx 16384 -o M.gguf`
 * (--ctx: the 1b shape's 4096 positions are fewer than an 8k prompt's; the engine would
 * run past them, but the model would not be one that was trained for the prompt).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>

#include "bench_tier_common.h"

static void usage(FILE *f)
{
    fputs("usage: bench_tier --model FILE [options]\n"
          "  --model FILE       GGUF model (llama architecture)\n"
          "  --tokens N         prompt tokens (default 8192)\n"
          "  -t N               threads (default 2)\n"
          "  --batch N          prompt chunk size (default 512)\n"
          "  --dir DIR          where the tiers' directory is made (default $TMPDIR or /tmp)\n"
          "  --reps N           repetitions of each cached case; medians printed (default 3)\n"
          "  --cold-reps N      repetitions of the cold recompute (default 1)\n"
          "  --itl-tokens N     decode tokens per ITL block (default 16; 0: no storm test)\n"
          "  --itl-blocks N     ITL blocks each way, quiet and storm interleaved (default 8)\n"
          "  --storm-mibps LIST storm rates in MiB/s of pages released for eviction, one ITL\n"
          "                     test each (default 0,16; 0: as fast as the movers drain the\n"
          "                     write-back queue; 16: twice the KV a 250 tokens/s prefill\n"
          "                     of the 1b shape makes, 32 KiB per token)\n"
          "  --o-direct         disk tier with O_DIRECT record I/O\n"
          "  --seed S           prompt token seed (default 1)\n"
          "  --json             one JSON object per result line\n"
          "  --smoke            tiny run on stories260K (skips when absent)\n"
          "  --help\n",
          f);
}

/* ---- the run's state ---- */

typedef struct bench {
    const char *model_path;
    char dir[1024]; /* the tiers' directory: DIR/bench_tier.XXXXXX */
    uint32_t n_tokens, threads, batch, reps, cold_reps, itl_tokens, itl_blocks;
    double storm_mibps[4]; /* storm rates, MiB/s (0: paced by the write-back queue) */
    int n_rates;
    int o_direct, json;
    pe_model *m;
    uint32_t n_vocab, page_tokens;
    int32_t *toks;      /* [n_tokens] */
    pgd_hash *hashes;   /* [n_hash]: the prompt's block hashes */
    size_t n_hash;      /* full pages of the prompt */
    float *logits;      /* [n_vocab] of the latest run */
    float *pool_logits; /* [n_vocab] of the first pool run: what tier runs must equal */
    uint64_t page_bytes, prompt_bytes;
    uint64_t ram_capacity, disk_capacity, kv_tokens;
    /* live while a tiered context is open */
    pgd_tier *ram, *disk;
    pgd_tier_use use[2];
    uint8_t key[32];
    pe_ctx *ctx;
    pgd_cache *cache;
    uint64_t checksum;
} bench;

static uint32_t argmax(const float *x, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* "0,16.5": at most max non-negative rates. Returns the count (>= 1) or -1. */
static int parse_rates(const char *s, double *out, int max)
{
    int n = 0;
    while (*s) {
        char *end;
        double v = strtod(s, &end);
        if (end == s || v < 0 || v > 1e6 || n == max) return -1;
        out[n++] = v;
        s = end;
        if (*s == ',')
            s++;
        else if (*s)
            return -1;
    }
    return n ? n : -1;
}

static int fail(const char *what, int rc)
{
    fprintf(stderr, "bench_tier: %s: %s\n", what, pgd_strerror(rc));
    return -1;
}

/* ---- contexts and tiers ---- */

/* A context on b->m; with tiers (b->use) and the disk tier's key when tiered. */
static int ctx_open(bench *b, int tiered, pe_ctx **out)
{
    pe_ctx_params cp = pe_ctx_default_params();
    cp.n_ctx = b->n_tokens + b->itl_tokens + 2 * b->page_tokens;
    cp.n_batch = b->batch;
    cp.n_threads = b->threads;
    cp.kv_tokens = b->kv_tokens;
    if (tiered) bench_tier_ctx_tiers(&cp, b->use, b->key);
    return bench_tier_ctx_create("bench_tier", b->m, &cp, out);
}

/* Opens an empty RAM tier, the disk tier on b->dir (its records kept), and a context on
 * both; "a restart" when the disk tier has records. */
static int tiers_open(bench *b)
{
    const char *what;
    int rc = bench_tier_open(b->ram_capacity, b->dir, b->disk_capacity, b->o_direct, &b->ram,
                             &b->disk, b->key, &what);
    if (rc != PGD_OK) return fail(what, rc);
    b->use[0] = (pgd_tier_use){.tier = b->ram};
    b->use[1] = (pgd_tier_use){.tier = b->disk};
    if (ctx_open(b, 1, &b->ctx)) return -1;
    b->cache = pe_ctx_cache(b->ctx);
    b->page_bytes = pgd_pool_page_bytes(pgd_cache_pool(b->cache));
    b->prompt_bytes = b->page_bytes * b->n_hash;
    return 0;
}

/* Waits for the movers, then destroys the context and closes the tiers. */
static void tiers_close(bench *b)
{
    if (b->cache) pgd_cache_flush(b->cache);
    pe_ctx_destroy(b->ctx);
    pgd_tier_close(b->ram);
    pgd_tier_close(b->disk);
    b->ctx = NULL;
    b->cache = NULL;
    b->ram = b->disk = NULL;
}

/* A restart: what a server does when it stops and starts on the same disk tier. */
static int restart(bench *b)
{
    tiers_close(b);
    return tiers_open(b);
}

/* Evicts every evictable page of the pool, 64 at a time, waiting for the movers after
 * each batch so that the write-back queue never overflows (an overflow drops pages). */
static void demote_all(bench *b)
{
    while (pgd_cache_evict(b->cache, 64) > 0)
        pgd_cache_flush(b->cache);
    pgd_cache_flush(b->cache);
}

/* Copies the prompt's records from the RAM tier to the disk tier (the movers' calls) and
 * makes them durable. Returns the records copied, or -1. */
static int copy_to_disk(bench *b)
{
    void *page = malloc(b->page_bytes);
    int n = 0;
    if (!page) return -1;
    for (size_t k = 0; k < b->n_hash; k++) {
        pgd_hash parent = k ? b->hashes[k - 1] : (pgd_hash){0, 0};
        int rc = pgd_tier_get(b->ram, b->hashes[k], page, NULL);
        if (rc == PGD_OK) rc = pgd_tier_put(b->disk, b->hashes[k], parent, page, NULL, NULL, NULL);
        if (rc != PGD_OK) {
            free(page);
            return fail("copying a record to the disk tier", rc);
        }
        n++;
    }
    free(page);
    int rc = pgd_tier_flush(b->disk);
    return rc == PGD_OK ? n : fail("disk flush", rc);
}

/* ---- one prompt ---- */

typedef struct run_result {
    double ttft_s;     /* create to first-token logits */
    double promote_s;  /* match to pgd_seq_wait (0 without a match) */
    pgd_match_info mi; /* where the matched prefix came from */
    uint32_t first;    /* argmax of the logits */
} run_result;

/* Runs the prompt on ctx as a new sequence of the tenant salt: hashes it, matches its
 * first N - 1 tokens (when match), waits for the promotions, computes the rest in chunks
 * (logits of the last token into b->logits). With compute == 0 it stops after the wait
 * (promotion alone). The sequence goes to *keep when keep is not NULL, else is destroyed.
 * Returns 0 or -1. */
static int run_prompt(bench *b, pe_ctx *ctx, const char *salt, int match, int compute,
                      run_result *r, pgd_seq **keep)
{
    pgd_cache *c = pe_ctx_cache(ctx);
    size_t salt_len = salt ? strlen(salt) : 0;
    pgd_seq *s;
    memset(r, 0, sizeof *r);
    double t0 = bench_now_s();
    int rc = pgd_seq_create(c, salt, salt_len, &s);
    if (rc != PGD_OK) return fail("pgd_seq_create", rc);
    size_t nh =
        pgd_cache_hash_tokens(c, salt, salt_len, b->toks, b->n_tokens, b->hashes, b->n_hash);
    if (match) {
        int64_t got = pgd_seq_match_hashed(c, s, b->toks, b->n_tokens - 1, b->hashes, nh);
        if (got < 0) return fail("pgd_seq_match_hashed", (int)got);
        pgd_seq_wait(c, s);
        r->promote_s = bench_now_s() - t0;
        pgd_seq_match_info(c, s, &r->mi);
    }
    for (uint64_t pos = pgd_seq_length(c, s); compute && pos < b->n_tokens;) {
        uint32_t n = b->n_tokens - pos < b->batch ? (uint32_t)(b->n_tokens - pos) : b->batch;
        pe_batch_item it = {.seq = s,
                            .tokens = b->toks + pos,
                            .n = n,
                            .logits = pos + n == b->n_tokens ? b->logits : NULL,
                            .hashes = b->hashes,
                            .n_hashes = (uint32_t)nh};
        rc = pe_forward_batch(ctx, &it, 1);
        if (rc) return fail("pe_forward_batch", rc);
        pos += n;
    }
    r->ttft_s = bench_now_s() - t0;
    if (compute) r->first = argmax(b->logits, b->n_vocab);
    if (keep)
        *keep = s;
    else
        pgd_seq_destroy(c, s);
    return 0;
}

/* ---- the record files ---- */

/* The disk tier's record files: DIR/records/XX/<hex>.rec (src/tier/disk.c), the files a
 * promotion reads; quarantined records, temp files, the key and the lock are not. */
enum { MAX_FILES = 1 << 20 };
static char **g_files;
static size_t g_n_files;
static uint64_t g_file_bytes;

static int collect_file(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)ftw;
    size_t len = strlen(path);
    if (flag != FTW_F || !S_ISREG(st->st_mode) || len < 4 || strcmp(path + len - 4, ".rec") ||
        strstr(path, "/quarantine/"))
        return 0;
    if (g_n_files == MAX_FILES) return 1;
    g_files[g_n_files] = strdup(path);
    if (!g_files[g_n_files]) return 1;
    g_n_files++;
    g_file_bytes += (uint64_t)st->st_size;
    return 0;
}

static int files_scan(const char *dir)
{
    for (size_t i = 0; i < g_n_files; i++)
        free(g_files[i]);
    g_n_files = 0;
    g_file_bytes = 0;
    if (!g_files) g_files = malloc(MAX_FILES * sizeof *g_files);
    if (!g_files) return -1;
    return nftw(dir, collect_file, 16, FTW_PHYS) ? -1 : 0;
}

/* Fraction of the record files' pages in the page cache (mincore). */
static double files_resident(void)
{
    uint64_t pages = 0, resident = 0;
    const long ps = sysconf(_SC_PAGESIZE);
    for (size_t i = 0; i < g_n_files; i++) {
        int fd = open(g_files[i], O_RDONLY);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) || st.st_size == 0) {
            if (fd >= 0) close(fd);
            continue;
        }
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
        if (p == MAP_FAILED) continue;
        size_t n = ((size_t)st.st_size + (size_t)ps - 1) / (size_t)ps;
        unsigned char *vec = malloc(n);
        if (vec && mincore(p, (size_t)st.st_size, vec) == 0)
            for (size_t k = 0; k < n; k++) {
                pages++;
                resident += vec[k] & 1;
            }
        free(vec);
        munmap(p, (size_t)st.st_size);
    }
    return pages ? (double)resident / (double)pages : 0.0;
}

/* Drops the record files from the page cache: fsync and POSIX_FADV_DONTNEED on each; if
 * pages stay resident, /proc/sys/vm/drop_caches when writable. Returns the method that
 * worked ("fadvise", "drop_caches") or "none", and the fraction left in *left. */
static const char *files_drop(double *left)
{
    for (size_t i = 0; i < g_n_files; i++) {
        int fd = open(g_files[i], O_RDONLY);
        if (fd < 0) continue;
        fsync(fd);
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
    *left = files_resident();
    if (*left < 0.01) return "fadvise";
    int fd = open("/proc/sys/vm/drop_caches", O_WRONLY);
    if (fd >= 0) {
        sync();
        ssize_t w = write(fd, "1", 1);
        close(fd);
        *left = files_resident();
        if (w == 1 && *left < 0.01) return "drop_caches";
    }
    return "none";
}

/* Seconds to read() every record file into one buffer, as dd would. */
static double files_read_s(void)
{
    enum { BUF = 1 << 20 };
    static char buf[BUF];
    double t0 = bench_now_s();
    for (size_t i = 0; i < g_n_files; i++) {
        int fd = open(g_files[i], O_RDONLY);
        if (fd < 0) continue;
        while (read(fd, buf, BUF) > 0) {
        }
        close(fd);
    }
    return bench_now_s() - t0;
}

/* ---- the demotion storm ---- */

typedef struct storm {
    bench *b;
    double mibps; /* 0: as fast as the write-back queue drains */
    atomic_int stop;
    pthread_t th;
    uint64_t seed;
    uint64_t n_pages; /* pages filled and released */
} storm;

enum { STORM_PAGES = 8, STORM_MAX_DEPTH = 64 };

/* Fills STORM_PAGES pages of a tenant of its own under random hashes and releases them,
 * in a loop: once the pool is full each fill evicts as many cached pages, which the cache
 * demotes. Waits while the write-back queue holds STORM_MAX_DEPTH pages (a full queue
 * drops evictions instead of demoting them), and to keep under --storm-mibps. */
static void *storm_main(void *arg)
{
    storm *st = arg;
    bench *b = st->b;
    const double t0 = bench_now_s();
    while (!atomic_load(&st->stop)) {
        pgd_cache_tier_stats ts;
        pgd_cache_get_tier_stats(b->cache, 0, &ts);
        double ahead = 0;
        if (st->mibps > 0)
            ahead = (double)st->n_pages * (double)b->page_bytes / (st->mibps * 1048576.0) -
                    (bench_now_s() - t0);
        if (ts.writeback_depth >= STORM_MAX_DEPTH || ahead > 0) {
            struct timespec ts1 = {0, 1000000};
            nanosleep(&ts1, NULL);
            continue;
        }
        pgd_seq *s;
        pgd_hash h[STORM_PAGES];
        for (int i = 0; i < STORM_PAGES; i++)
            h[i] = (pgd_hash){bench_rng(&st->seed), bench_rng(&st->seed)};
        if (pgd_seq_create(b->cache, "storm", 5, &s) != PGD_OK) break;
        int filled = pgd_seq_grow(b->cache, s, (size_t)STORM_PAGES * b->page_tokens) == PGD_OK &&
                     pgd_seq_commit_hashes(b->cache, s, h, STORM_PAGES) == STORM_PAGES;
        pgd_seq_destroy(b->cache, s);
        if (filled) {
            st->n_pages += STORM_PAGES;
        } else { /* nothing evictable for now */
            struct timespec ts1 = {0, 1000000};
            nanosleep(&ts1, NULL);
        }
    }
    return NULL;
}

/* Decodes b->itl_tokens greedy tokens on a fork of base; appends each token's seconds to
 * times[*n]. Returns 0 or -1. */
static int decode_block(bench *b, pgd_seq *base, uint32_t tok, double *times, size_t *n)
{
    pgd_seq *s;
    int rc = pgd_seq_fork(b->cache, base, &s);
    if (rc != PGD_OK) return fail("pgd_seq_fork", rc);
    for (uint32_t i = 0; i < b->itl_tokens; i++) {
        int32_t t = (int32_t)tok;
        double t0 = bench_now_s();
        rc = pe_forward(b->ctx, s, &t, 1, b->logits, 0);
        if (rc) return fail("pe_forward (decode)", rc);
        times[(*n)++] = bench_now_s() - t0;
        tok = argmax(b->logits, b->n_vocab);
        b->checksum = b->checksum * 31 + tok;
    }
    pgd_seq_destroy(b->cache, s);
    return 0;
}

/* Decode ITL of forks of base (first token tok) in 2 x reps blocks, alternately quiet
 * and under a storm of rate MiB/s (0: paced by the write-back queue alone); prints the
 * medians, their ratio and what the storm demoted. times: scratch for 2 x itl_blocks x
 * itl_tokens + itl_tokens seconds. Returns 0 or -1. */
static int itl_storm(bench *b, pgd_seq *base, uint32_t tok, double rate, uint64_t seed,
                     double *times)
{
    size_t n_quiet = 0, n_storm = 0;
    double *quiet = times, *stormy = times + (size_t)(b->itl_blocks + 1) * b->itl_tokens;
    storm st = {.b = b, .mibps = rate, .seed = seed * 2654435761u + 1};
    double storm_s = 0, demoted_bytes[2] = {0, 0};
    uint64_t dropped = 0, storm_pages = 0;
    if (decode_block(b, base, tok, quiet, &n_quiet)) return -1; /* warm-up */
    n_quiet = 0;
    for (uint32_t k = 0; k < 2 * b->itl_blocks; k++) {
        if (!((k & 1) ^ ((k >> 1) & 1))) { /* quiet, storm, storm, quiet, quiet, ... */
            if (decode_block(b, base, tok, quiet, &n_quiet)) return -1;
            continue;
        }
        pgd_cache_tier_stats s0[2], s1[2];
        for (uint32_t i = 0; i < 2; i++)
            pgd_cache_get_tier_stats(b->cache, i, &s0[i]);
        atomic_store(&st.stop, 0);
        st.n_pages = 0;
        if (pthread_create(&st.th, NULL, storm_main, &st)) return -1;
        double t0 = bench_now_s();
        int rc = decode_block(b, base, tok, stormy, &n_storm);
        atomic_store(&st.stop, 1);
        pthread_join(st.th, NULL);
        storm_s += bench_now_s() - t0;
        storm_pages += st.n_pages;
        if (rc) return -1;
        for (uint32_t i = 0; i < 2; i++) {
            pgd_cache_get_tier_stats(b->cache, i, &s1[i]);
            demoted_bytes[i] += (double)(s1[i].demoted_bytes - s0[i].demoted_bytes);
            dropped += s1[i].demote_dropped - s0[i].demote_dropped;
        }
    }
    /* The noise floor: the quiet blocks split in two (even and odd), as an A/A ratio. */
    double *qa = malloc(2 * n_quiet * sizeof *qa), aa = 0;
    if (!qa) return -1;
    size_t na = 0, nb = 0;
    for (size_t i = 0; i < n_quiet; i++) {
        if ((i / b->itl_tokens) & 1)
            qa[n_quiet + nb++] = quiet[i];
        else
            qa[na++] = quiet[i];
    }
    if (na && nb) aa = bench_median(qa, na) / bench_median(qa + n_quiet, nb);
    free(qa);
    const double q = bench_median(quiet, n_quiet) * 1e3, w = bench_median(stormy, n_storm) * 1e3;
    const double ram_mibs = demoted_bytes[0] / storm_s / 1048576.0;
    const double disk_mibs = demoted_bytes[1] / storm_s / 1048576.0;
    char label[32] = "max";
    if (rate > 0) snprintf(label, sizeof label, "%.1f", rate);
    if (b->json) {
        printf("{\"test\": \"itl\", \"depth\": %u, \"tokens\": %u, \"storm_mibps\": %.1f, "
               "\"quiet_ms\": %.3f, \"storm_ms\": %.3f, \"ratio\": %.3f, \"quiet_a_a\": %.3f, "
               "\"storm_pages\": %" PRIu64
               ", \"ram_demoted_mib_per_s\": %.1f, \"disk_demoted_mib_per_s\": %.1f, "
               "\"dropped\": %" PRIu64 "}\n",
               b->n_tokens, b->itl_tokens, rate, q, w, w / q, aa, storm_pages, ram_mibs, disk_mibs,
               dropped);
    } else {
        char a_a[16] = "-"; /* one quiet block: no A/A */
        if (aa > 0) snprintf(a_a, sizeof a_a, "%.3f", aa);
        printf("%-11s %10.2f %10.2f %7.3f %7s %10.1f %10.1f %8" PRIu64 " target <= 1.05\n", label,
               q, w, w / q, a_a, ram_mibs, disk_mibs, dropped);
    }
    return 0;
}

/* ---- output ---- */

static const char *logits_vs_pool(const bench *b, int have_pool)
{
    if (!have_pool) return "-";
    return memcmp(b->logits, b->pool_logits, b->n_vocab * sizeof *b->logits) ? "DIFF" : "same";
}

static void print_ttft(const bench *b, const char *name, double s, double cold, const run_result *r,
                       const char *logits, const char *target)
{
    uint64_t pool = r->mi.pool_tokens, ram = r->mi.tier_tokens[0], disk = r->mi.tier_tokens[1];
    if (b->json)
        printf("{\"test\": \"ttft\", \"case\": \"%s\", \"tokens\": %u, \"seconds\": %.6f, "
               "\"vs_cold\": %.2f, \"pool_tokens\": %" PRIu64 ", \"ram_tokens\": %" PRIu64
               ", \"disk_tokens\": %" PRIu64 ", \"first_token\": %u, \"logits\": \"%s\"}\n",
               name, b->n_tokens, s, cold / s, pool, ram, disk, r->first, logits);
    else
        printf("%-10s %10.4f %10.1fx %8" PRIu64 " %8" PRIu64 " %8" PRIu64 " %6u %-6s %s\n", name, s,
               cold / s, pool, ram, disk, r->first, logits, target);
}

static void print_rate(const bench *b, const char *name, double bytes, double s, double base_bytes,
                       double base_s, const char *base, const char *target)
{
    double mibs = bytes / s / 1048576.0, bmibs = base_bytes / base_s / 1048576.0;
    if (b->json)
        printf("{\"test\": \"promotion\", \"case\": \"%s\", \"bytes\": %.0f, \"seconds\": %.6f, "
               "\"mib_per_s\": %.1f, \"baseline\": \"%s\", \"baseline_mib_per_s\": %.1f, "
               "\"ratio\": %.3f}\n",
               name, bytes, s, mibs, base, bmibs, mibs / bmibs);
    else
        printf("%-10s %10.1f %10.4f %10.1f %-8s %10.1f %7.3f %s\n", name, bytes / 1048576.0, s,
               mibs, base, bmibs, mibs / bmibs, target);
}

/* ---- main ---- */

static double median_of(double *x, uint32_t n)
{
    return bench_median(x, n);
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"model", required_argument, NULL, 'M'},
        {"tokens", required_argument, NULL, 'n'},
        {"batch", required_argument, NULL, 'b'},
        {"dir", required_argument, NULL, 'd'},
        {"reps", required_argument, NULL, 'r'},
        {"cold-reps", required_argument, NULL, 'c'},
        {"itl-tokens", required_argument, NULL, 'i'},
        {"itl-blocks", required_argument, NULL, 'B'},
        {"storm-mibps", required_argument, NULL, 'S'},
        {"o-direct", no_argument, NULL, 'O'},
        {NULL, 0, NULL, 0},
    };
    bench b = {.n_tokens = 8192,
               .threads = 2,
               .batch = 512,
               .reps = 3,
               .cold_reps = 1,
               .itl_tokens = 16,
               .itl_blocks = 8,
               .storm_mibps = {0, 16},
               .n_rates = 2};
    const char *parent = bench_tier_tmpdir();
    char smoke_path[1024];
    bench_cli cli = {.prog = "bench_tier",
                     .usage = usage,
                     .own = lo,
                     .optstring = "t:",
                     .common = BENCH_SEED | BENCH_JSON | BENCH_SMOKE,
                     .a = {.seed = 1}};
    setvbuf(stdout, NULL, _IOLBF, 0); /* a long run shows each figure as it comes */
    for (;;) {
        int c = bench_cli_next(&cli, argc, argv);
        if (c == -1) break;
        uint64_t v = 0;
        if (c != 'M' && c != 'd' && c != 'O' && c != 'S' &&
            (bench_parse_u64(optarg, &v) || v > (1u << 24))) {
            fprintf(stderr, "bench_tier: bad number '%s'\n", optarg);
            return 2;
        }
        switch (c) {
        case 'M':
            b.model_path = optarg;
            break;
        case 'n':
            b.n_tokens = (uint32_t)v;
            break;
        case 't':
            b.threads = (uint32_t)v;
            break;
        case 'b':
            b.batch = (uint32_t)v;
            break;
        case 'd':
            parent = optarg;
            break;
        case 'r':
            b.reps = v >= 1 && v <= 99 ? (uint32_t)v : 3;
            break;
        case 'c':
            b.cold_reps = v >= 1 && v <= 99 ? (uint32_t)v : 1;
            break;
        case 'i':
            b.itl_tokens = (uint32_t)v;
            break;
        case 'B':
            b.itl_blocks = v >= 1 && v <= 99 ? (uint32_t)v : 8;
            break;
        case 'S':
            b.n_rates = parse_rates(optarg, b.storm_mibps, 4);
            if (b.n_rates < 1) {
                fprintf(stderr, "bench_tier: --storm-mibps: bad list '%s'\n", optarg);
                return 2;
            }
            break;
        case 'O':
            b.o_direct = 1;
            break;
        }
    }
    if (cli.status >= 0) return cli.status;
    if (optind != argc) {
        fprintf(stderr, "bench_tier: unexpected argument %s (see --help)\n", argv[optind]);
        return 2;
    }
    b.json = cli.a.json;
    if (cli.a.smoke) {
        if (bench_tier_smoke_model("bench_tier", smoke_path, sizeof smoke_path)) return 77;
        b.model_path = smoke_path;
        b.n_tokens = 128;
        b.batch = 64;
        b.reps = 1;
        b.cold_reps = 1;
        b.itl_tokens = 4;
        b.itl_blocks = 1;
    }
    if (!b.model_path || !b.threads || !b.batch || b.n_tokens < 2) {
        usage(stderr);
        return 2;
    }

    const pe_hparams *hp =
        bench_tier_model_load("bench_tier", b.model_path, &b.m, &b.page_tokens, &b.page_bytes);
    if (!hp) return 1;
    b.n_vocab = hp->n_vocab;
    if (b.n_tokens < 2 * b.page_tokens) {
        fprintf(stderr, "bench_tier: --tokens must be at least %u\n", 2 * b.page_tokens);
        return 2;
    }
    b.n_hash = b.n_tokens / b.page_tokens;
    b.toks = malloc(b.n_tokens * sizeof *b.toks);
    b.hashes = malloc(b.n_hash * sizeof *b.hashes);
    b.logits = malloc(b.n_vocab * sizeof *b.logits);
    b.pool_logits = malloc(b.n_vocab * sizeof *b.pool_logits);
    double *times = malloc((size_t)(2 * b.itl_blocks + 2) * (b.itl_tokens + 1) * sizeof *times);
    if (!b.toks || !b.hashes || !b.logits || !b.pool_logits || !times) return 1;
    uint64_t seed = cli.a.seed ? cli.a.seed : 1;
    b.toks[0] = 1;
    for (uint32_t i = 1; i < b.n_tokens; i++)
        b.toks[i] = 3 + (int32_t)(bench_rng(&seed) % (b.n_vocab - 3));
    /* The pool holds the prompt, a decode fork and room for the storm to cycle through;
     * the RAM tier holds the prompt with room to spare, the disk tier four times that
     * (page_bytes is estimated here, then read from the pool). */
    b.kv_tokens = (uint64_t)b.n_tokens + b.itl_tokens + 64ull * b.page_tokens;
    b.prompt_bytes = b.page_bytes * b.n_hash;
    b.ram_capacity = b.prompt_bytes + b.prompt_bytes / 4 + 64 * b.page_bytes;
    b.disk_capacity = 4 * b.prompt_bytes + (64ull << 20);
    if (bench_tier_mkdtemp("bench_tier", parent, "bench_tier", b.dir, sizeof b.dir)) return 1;
    if (!b.json)
        printf("model %s: %.2f GiB of weights, %u threads, isa %s, prompt %u tokens = %u pages "
               "of %.1f KiB (%.1f MiB of f16 KV), tiers in %s%s\n",
               b.model_path, pe_model_weight_bytes(b.m) / 1073741824.0, b.threads,
               pe_isa_name(pe_isa_detect()), b.n_tokens, (unsigned)b.n_hash, b.page_bytes / 1024.0,
               b.prompt_bytes / 1048576.0, b.dir, b.o_direct ? " (O_DIRECT)" : "");

    int ok = -1;
    run_result r;
    double *cold = malloc((b.cold_reps + b.reps * 8) * sizeof *cold), *x = cold + b.cold_reps;
    double *y = x + 4 * b.reps;
    if (!cold) return 1;

    /* 1a. cold: the extra repetitions on a context without tiers, the last one filling
     * the tiered context. */
    for (uint32_t k = 0; k + 1 < b.cold_reps; k++) {
        pe_ctx *plain;
        char salt[32];
        snprintf(salt, sizeof salt, "cold-%u", k);
        if (ctx_open(&b, 0, &plain)) goto out;
        if (run_prompt(&b, plain, salt, 0, 1, &r, NULL)) goto out;
        cold[k] = r.ttft_s;
        pe_ctx_destroy(plain);
    }
    if (tiers_open(&b)) goto out;
    if (run_prompt(&b, b.ctx, NULL, 0, 1, &r, NULL)) goto out;
    cold[b.cold_reps - 1] = r.ttft_s;
    const uint32_t cold_first = r.first;
    run_result cold_r = r;
    double cold_s = median_of(cold, b.cold_reps);
    b.checksum = cold_first;
    if (!b.json)
        printf("%-10s %10s %11s %8s %8s %8s %6s %-6s %s\n", "ttft", "seconds", "vs cold", "pool",
               "ram", "disk", "first", "logits", "target");
    print_ttft(&b, "cold", cold_s, cold_s, &cold_r, "-", "(baseline)");

    /* 1b. pool */
    run_result pr = {0};
    for (uint32_t k = 0; k < b.reps; k++) {
        if (run_prompt(&b, b.ctx, NULL, 1, 1, &r, NULL)) goto out;
        x[k] = r.ttft_s;
        if (k == 0) {
            memcpy(b.pool_logits, b.logits, b.n_vocab * sizeof *b.logits);
            pr = r;
        }
    }
    print_ttft(&b, "pool", median_of(x, b.reps), cold_s, &pr, "(ref)", "");
    b.checksum = b.checksum * 31 + pr.first;

    /* 1c. RAM tier: the prompt's pages evicted from the pool and demoted */
    const char *same = "same";
    run_result rr = {0};
    for (uint32_t k = 0; k < b.reps; k++) {
        demote_all(&b);
        if (run_prompt(&b, b.ctx, NULL, 1, 1, &r, NULL)) goto out;
        x[k] = r.ttft_s;
        if (strcmp(logits_vs_pool(&b, 1), "same")) same = "DIFF";
        if (k == 0) rr = r;
    }
    print_ttft(&b, "ram", median_of(x, b.reps), cold_s, &rr, same, "target >= 100x");
    b.checksum = b.checksum * 31 + rr.first;

    /* 2a. promotion from RAM against memcpy of as many bytes */
    {
        pgd_cache_tier_stats t0, t1;
        double bytes = 0;
        for (uint32_t k = 0; k < b.reps; k++) {
            demote_all(&b);
            pgd_cache_get_tier_stats(b.cache, 0, &t0);
            if (run_prompt(&b, b.ctx, NULL, 1, 0, &r, NULL)) goto out;
            pgd_cache_get_tier_stats(b.cache, 0, &t1);
            x[k] = r.promote_s;
            bytes = (double)(t1.promoted_bytes - t0.promoted_bytes);
        }
        size_t nb = bytes > 0 ? (size_t)bytes : b.page_bytes;
        char *src = malloc(nb), *dst = malloc(nb);
        if (!src || !dst) goto out;
        memset(src, 1, nb);
        memset(dst, 2, nb);
        for (uint32_t k = 0; k < b.reps; k++) {
            double t = bench_now_s();
            memcpy(dst, src, nb);
            y[k] = bench_now_s() - t;
            src[k % nb] = (char)(dst[(k * 4099) % nb] + 1); /* keep the copy live */
        }
        free(src);
        free(dst);
        if (!b.json)
            printf("%-10s %10s %10s %10s %-8s %10s %7s %s\n", "promotion", "MiB", "seconds",
                   "MiB/s", "baseline", "MiB/s", "ratio", "target");
        print_rate(&b, "ram", bytes, median_of(x, b.reps), bytes, median_of(y, b.reps), "memcpy",
                   "target >= 0.70");
    }

    /* 1d. disk tier after a restart, page cache warm */
    demote_all(&b);
    int copied = copy_to_disk(&b);
    if (copied < 0) goto out;
    same = "same";
    run_result dr = {0};
    for (uint32_t k = 0; k < b.reps; k++) {
        if (restart(&b)) goto out;
        if (run_prompt(&b, b.ctx, NULL, 1, 1, &r, NULL)) goto out;
        x[k] = r.ttft_s;
        if (strcmp(logits_vs_pool(&b, 1), "same")) same = "DIFF";
        if (k == 0) dr = r;
    }
    print_ttft(&b, "disk warm", median_of(x, b.reps), cold_s, &dr, same, "target >= 50x");
    b.checksum = b.checksum * 31 + dr.first;

    /* 1e. disk cold: the record files dropped from the page cache after the restart */
    if (files_scan(b.dir)) goto out;
    const char *method = "none";
    double left = 1;
    same = "same";
    run_result dc = {0};
    for (uint32_t k = 0; k < b.reps; k++) {
        if (restart(&b)) goto out;
        method = files_drop(&left);
        if (run_prompt(&b, b.ctx, NULL, 1, 1, &r, NULL)) goto out;
        x[k] = r.ttft_s;
        if (strcmp(logits_vs_pool(&b, 1), "same")) same = "DIFF";
        if (k == 0) dc = r;
    }
    print_ttft(&b, "disk cold", median_of(x, b.reps), cold_s, &dc, same, "target >= 20x");
    b.checksum = b.checksum * 31 + dc.first;
    if (b.json)
        printf("{\"test\": \"page_cache_drop\", \"method\": \"%s\", \"resident\": %.4f, "
               "\"records\": %d, \"files\": %zu, \"bytes\": %" PRIu64 "}\n",
               method, left, copied, g_n_files, g_file_bytes);
    else
        printf("disk cold: page cache dropped by %s, %.1f%% of the record files' pages left "
               "resident; %d records, %zu files, %.1f MiB\n",
               method, 100 * left, copied, g_n_files, g_file_bytes / 1048576.0);

    /* 2b. promotion from disk, warm and cold, against read() of the same files */
    for (int cold_case = 0; cold_case < 2; cold_case++) {
        double bytes = 0;
        for (uint32_t k = 0; k < b.reps; k++) {
            pgd_cache_tier_stats t0, t1;
            if (restart(&b)) goto out;
            if (cold_case) files_drop(&left);
            pgd_cache_get_tier_stats(b.cache, 1, &t0);
            if (run_prompt(&b, b.ctx, NULL, 1, 0, &r, NULL)) goto out;
            pgd_cache_get_tier_stats(b.cache, 1, &t1);
            x[k] = r.promote_s;
            bytes = (double)(t1.promoted_bytes - t0.promoted_bytes);
            if (cold_case) files_drop(&left);
            y[k] = files_read_s();
        }
        print_rate(&b, cold_case ? "disk cold" : "disk warm", bytes, median_of(x, b.reps),
                   (double)g_file_bytes, median_of(y, b.reps), "read()", "target >= 0.70");
    }

    /* 3. decode ITL with and without a demotion storm, at each storm rate */
    if (b.itl_tokens) {
        pgd_seq *base;
        if (restart(&b)) goto out;
        if (run_prompt(&b, b.ctx, NULL, 1, 1, &r, &base)) goto out;
        if (!b.json)
            printf("decode ITL at depth %u, %u tokens x %u blocks each way, median ms/token "
                   "(a/a: quiet blocks against each other, the noise floor)\n"
                   "%-11s %10s %10s %7s %7s %10s %10s %8s %s\n",
                   b.n_tokens, b.itl_tokens, b.itl_blocks, "storm MiB/s", "quiet", "storm", "ratio",
                   "a/a", "ram MiB/s", "disk MiB/s", "dropped", "target");
        for (int i = 0; i < b.n_rates; i++)
            if (itl_storm(&b, base, r.first, b.storm_mibps[i], cli.a.seed + (uint64_t)i, times))
                goto out;
        pgd_seq_destroy(b.cache, base);
    }
    if (!b.json) bench_print_checksum(b.checksum, 0);
    ok = 0;
out:
    tiers_close(&b);
    bench_tier_rm_tree(b.dir);
    for (size_t i = 0; i < g_n_files; i++)
        free(g_files[i]);
    free(g_files);
    free(cold);
    free(times);
    free(b.toks);
    free(b.hashes);
    free(b.logits);
    free(b.pool_logits);
    pe_model_destroy(b.m);
    return ok ? 1 : 0;
}
