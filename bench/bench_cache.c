/* SPDX-License-Identifier: MIT */
/*
 * bench_cache.c - cache-manager bookkeeping for one long prompt (default 128k tokens,
 * 16 tokens per page): match + grow + commit when nothing is cached (cold) and match when
 * everything is (warm), against a baseline in the same run: hashing the prompt alone with
 * pgd_cache_hash_tokens, the part no cache can avoid. Target: well under 1 ms.
 *
 * Two pools: metadata-only (what replay uses) and a tiny f16 payload (1 layer, 1 head,
 * head_dim 8), so the arena is touched but K/V copies do not dominate. Each figure is the
 * median of --reps timed repetitions after one untimed warm-up. The checksum folds the
 * block hashes and every call's result, so a change that is fast but wrong shows up.
 * The "prehashed" phases pass the baseline's hashes to pgd_seq_match_hashed /
 * pgd_seq_commit_hashed (an engine that hashed the prompt at submit, outside the lock):
 * they must return what the plain calls return.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <pagoda/cache.h>

#include "bench.h"

enum {
    PH_HASH,
    PH_MATCH_COLD,
    PH_GROW,
    PH_COMMIT,
    PH_COLD,
    PH_DESTROY,
    PH_MATCH_WARM,
    PH_COMMIT_PRE,
    PH_MATCH_WARM_PRE,
    N_PH
};

static const char *const ph_name[N_PH] = {
    "hash (baseline)",      "cold match (miss)",      "cold grow",
    "cold commit",          "cold match+grow+commit", "release (destroy)",
    "warm match (all hit)", "cold commit prehashed",  "warm match prehashed",
};
static const char *const ph_key[N_PH] = {
    "hash",    "cold_match", "cold_grow",          "cold_commit",       "cold_total",
    "destroy", "warm_match", "cold_commit_hashed", "warm_match_hashed",
};

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_cache [options]\n"
               "Bookkeeping cost of match + grow + commit for one long prompt.\n"
               "  --tokens N       prompt length in tokens (default 131072)\n"
               "  --page-tokens N  tokens per page, power of two (default 16)\n"
               "  --reps N         timed repetitions, median reported (default 21)\n"
               "  --seed N         token generator seed (default 1)\n"
               "  --json           print one JSON object instead of fixed-width lines\n"
               "  --smoke          tiny and fast (8192 tokens, 3 reps): for ctest\n"
               "  --help           show this help\n");
}

/* Milliseconds on the monotonic clock. */
static double now_ms(void)
{
    return bench_now_s() * 1e3;
}

static uint64_t fold(uint64_t sum, uint64_t v)
{
    sum ^= v + 0x9E3779B97F4A7C15ull + (sum << 6) + (sum >> 2);
    return sum;
}

typedef struct {
    const char *name;
    int metadata_only;
    double median[N_PH];
} pool_run;

static int run(pool_run *pr, const int32_t *tokens, size_t n, uint32_t pt, int reps,
               uint64_t *checksum)
{
    static const uint8_t key[16] = "bench-cache-key";
    pgd_cache_params p = pgd_cache_default_params();
    pgd_cache *c = NULL;
    size_t n_pages = n / pt;
    pgd_hash *h = malloc(sizeof *h * (n_pages ? n_pages : 1));
    double *t[N_PH];
    int rc = 1;
    for (int k = 0; k < N_PH; k++)
        t[k] = calloc((size_t)reps, sizeof(double));
    p.pool.n_layers = 1;
    p.pool.n_kv_heads = 1;
    p.pool.head_dim = 8;
    p.pool.kv_type = PGD_KV_F16;
    p.pool.page_tokens = pt;
    p.pool.capacity_pages = (uint32_t)((n + pt - 1) / pt + 16);
    p.pool.metadata_only = pr->metadata_only;
    p.hash_key = key;
    p.hash_key_len = sizeof key;
    if (!h || pgd_cache_create(&p, &c) != PGD_OK) goto out;
    for (int k = 0; k < N_PH; k++)
        if (!t[k]) goto out;
    for (int r = -1; r < reps; r++) { /* r == -1: warm-up, not timed */
        pgd_seq *s;
        double t0, t1, t2, t3, t4;
        pgd_cache_clear(c); /* cold: nothing cached */

        t0 = now_ms();
        size_t nh = pgd_cache_hash_tokens(c, NULL, 0, tokens, n, h, n_pages);
        t1 = now_ms();
        if (nh != n_pages) goto out;
        if (r >= 0) t[PH_HASH][r] = t1 - t0;
        if (r == 0)
            for (size_t i = 0; i < nh; i++)
                *checksum = fold(fold(*checksum, h[i].lo), h[i].hi);

        t0 = now_ms();
        if (pgd_seq_create(c, NULL, 0, &s) != PGD_OK) goto out;
        int64_t m = pgd_seq_match(c, s, tokens, n);
        t1 = now_ms();
        int g = pgd_seq_grow(c, s, n - (size_t)(m > 0 ? m : 0));
        t2 = now_ms();
        int64_t cm = pgd_seq_commit(c, s, tokens, n);
        t3 = now_ms();
        pgd_seq_destroy(c, s);
        t4 = now_ms();
        if (m != 0 || g != PGD_OK || cm != (int64_t)n_pages) goto out;
        if (r >= 0) {
            t[PH_MATCH_COLD][r] = t1 - t0;
            t[PH_GROW][r] = t2 - t1;
            t[PH_COMMIT][r] = t3 - t2;
            t[PH_COLD][r] = t3 - t0;
            t[PH_DESTROY][r] = t4 - t3;
        }

        t0 = now_ms();
        if (pgd_seq_create(c, NULL, 0, &s) != PGD_OK) goto out;
        int64_t w = pgd_seq_match(c, s, tokens, n);
        t1 = now_ms();
        pgd_seq_destroy(c, s);
        if (w != (int64_t)(n_pages * pt)) goto out;
        if (r >= 0) t[PH_MATCH_WARM][r] = t1 - t0;
        if (r == 0) {
            *checksum = fold(fold(fold(*checksum, (uint64_t)m), (uint64_t)cm), (uint64_t)w);
        }

        /* The same with the hashes computed above (not timed here: the engine's submit). */
        t0 = now_ms();
        if (pgd_seq_create(c, NULL, 0, &s) != PGD_OK) goto out;
        w = pgd_seq_match_hashed(c, s, tokens, n, h, nh);
        t1 = now_ms();
        pgd_seq_destroy(c, s);
        if (w != (int64_t)(n_pages * pt)) goto out;
        if (r >= 0) t[PH_MATCH_WARM_PRE][r] = t1 - t0;
        pgd_cache_clear(c);
        if (pgd_seq_create(c, NULL, 0, &s) != PGD_OK) goto out;
        m = pgd_seq_match_hashed(c, s, tokens, n, h, nh);
        g = pgd_seq_grow(c, s, n - (size_t)(m > 0 ? m : 0));
        t0 = now_ms();
        cm = pgd_seq_commit_hashed(c, s, tokens, n, h, nh);
        t1 = now_ms();
        pgd_seq_destroy(c, s);
        if (m != 0 || g != PGD_OK || cm != (int64_t)n_pages) goto out;
        if (r >= 0) t[PH_COMMIT_PRE][r] = t1 - t0;
    }
    if (pgd_cache_check(c) != PGD_OK) goto out;
    for (int k = 0; k < N_PH; k++) {
        qsort(t[k], (size_t)reps, sizeof(double), bench_cmp_double);
        pr->median[k] = t[k][reps / 2];
    }
    rc = 0;
out:
    pgd_cache_destroy(c);
    for (int k = 0; k < N_PH; k++)
        free(t[k]);
    free(h);
    return rc;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"tokens", required_argument, NULL, 't'}, {"page-tokens", required_argument, NULL, 'p'},
        {"reps", required_argument, NULL, 'r'},   {"seed", required_argument, NULL, 's'},
        {"json", no_argument, NULL, 'j'},         {"smoke", no_argument, NULL, 'k'},
        {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0},
    };
    uint64_t n_tokens = 131072, pt = 16, reps = 21, seed = 1, v;
    int json = 0;
    for (;;) {
        int opt = getopt_long(argc, argv, "", opts, NULL);
        if (opt == -1) break;
        switch (opt) {
        case 't':
        case 'p':
        case 'r':
        case 's':
            if (bench_parse_u64(optarg, &v) != 0) {
                fprintf(stderr, "bench_cache: bad number '%s'\n", optarg);
                return 2;
            }
            if (opt == 't')
                n_tokens = v;
            else if (opt == 'p')
                pt = v;
            else if (opt == 'r')
                reps = v;
            else
                seed = v;
            break;
        case 'j':
            json = 1;
            break;
        case 'k':
            n_tokens = 8192;
            reps = 3;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc || pt == 0 || (pt & (pt - 1)) || pt > 4096 || reps == 0 || reps > 100000 ||
        n_tokens < pt || n_tokens > (1ull << 30)) {
        usage(stderr);
        return 2;
    }

    int32_t *tokens = malloc(sizeof *tokens * n_tokens);
    if (!tokens) return 1;
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (uint64_t i = 0; i < n_tokens; i++) {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        tokens[i] = (int32_t)((s * 2685821657736338717ULL) >> 33) % 128000;
    }
    pool_run runs[2] = {{"meta", 1, {0}}, {"f16", 0, {0}}};
    uint64_t checksum = 0;
    for (int i = 0; i < 2; i++) {
        if (run(&runs[i], tokens, n_tokens, (uint32_t)pt, (int)reps, &checksum) != 0) {
            fprintf(stderr, "bench_cache: a call failed or returned a wrong result\n");
            free(tokens);
            return 1;
        }
    }
    free(tokens);

    if (json) {
        printf("{\"bench\":\"cache\",\"tokens\":%" PRIu64 ",\"page_tokens\":%" PRIu64
               ",\"reps\":%" PRIu64 ",\"seed\":%" PRIu64 ",\"results\":[",
               n_tokens, pt, reps, seed);
        for (int i = 0; i < 2; i++)
            for (int k = 0; k < N_PH; k++) {
                double ms = runs[i].median[k];
                printf("%s{\"pool\":\"%s\",\"phase\":\"%s\",\"ms\":%.4f,\"tokens_per_s\":%.0f,"
                       "\"x_hash\":%.2f}",
                       i || k ? "," : "", runs[i].name, ph_key[k], ms,
                       ms > 0 ? (double)n_tokens / (ms * 1e-3) : 0.0,
                       runs[i].median[PH_HASH] > 0 ? ms / runs[i].median[PH_HASH] : 0.0);
            }
        printf("],\"checksum\":\"%016" PRIx64 "\"}\n", checksum);
        return 0;
    }
    printf("bench_cache: %" PRIu64 " tokens, %" PRIu64 " tokens/page (%" PRIu64
           " pages), median of %" PRIu64 ", seed %" PRIu64 "\n",
           n_tokens, pt, n_tokens / pt, reps, seed);
    printf("%-5s %-24s %10s %12s %8s\n", "pool", "phase", "ms", "Mtokens/s", "x hash");
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < N_PH; k++) {
            double ms = runs[i].median[k];
            printf("%-5s %-24s %10.4f %12.1f %8.2f\n", runs[i].name, ph_name[k], ms,
                   ms > 0 ? (double)n_tokens / (ms * 1e-3) / 1e6 : 0.0,
                   runs[i].median[PH_HASH] > 0 ? ms / runs[i].median[PH_HASH] : 0.0);
        }
    printf("checksum %016" PRIx64 "\n", checksum);
    return 0;
}
