/* SPDX-License-Identifier: MIT */
/*
 * bench_tier_ram.c - the RAM tier (src/tier/ram.c): bytes per record and capacity gain of
 * each storage option (raw, lz4, zstd, re-encoded to q8_0 or q4_0) against raw, put and
 * get throughput in MB/s of pool bytes, and get throughput as a ratio to memcpy of the
 * same bytes between the same buffers in the same run; for lossy options the error of
 * what get returns (NMSE against the page put, and the largest error relative to the
 * page's largest value).
 *
 * Geometry: a 1B-like model (22 layers, 4 KV heads, head_dim 64), 16 tokens a page, f16
 * and q8_0 pools. Pages hold realistic K/V: per channel a random walk over the tokens
 * around a channel offset (K with a few large channels, as real keys have), not zeros,
 * encoded in the pool's codec. --pages pages (default 256: 92 MB of f16, beyond the last
 * cache level, so get and memcpy both stream from memory).
 *
 * Each get figure is the median of --reps passes over every page after one untimed
 * warm-up pass; put is one pass into an empty tier whose bound holds every page (no
 * eviction). One thread. The checksum folds every byte get returned.
 */
#include <math.h>

#include "bench.h"
#include "codec/codec_int.h"
#include "pagoda/tier.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_tier_ram [options]\n"
               "RAM tier: bytes per record, capacity gain, put/get MB/s, get vs memcpy.\n"
               "  --pages N   pages put and read back per option (default 256)\n"
               "  --reps N    timed get passes, median reported (default 5)\n"
               "  --seed N    data generator seed (default 1)\n"
               "  --json      one JSON object per result line\n"
               "  --smoke     tiny and fast (8 pages, 1 rep): for ctest\n"
               "  --help      show this help\n");
}

enum { N_LAYERS = 22, N_KV_HEADS = 4, HEAD_DIM = 64, PAGE_TOKENS = 16 };

typedef struct option_row {
    const char *name;
    int store_type; /* -1: the pool's */
    uint32_t compression;
} option_row;

static const option_row options[] = {
    {"raw", -1, PGD_RECORD_RAW},           {"lz4", -1, PGD_RECORD_LZ4},
    {"zstd", -1, PGD_RECORD_ZSTD},         {"q8_0", PGD_KV_Q8_0, PGD_RECORD_RAW},
    {"q4_0", PGD_KV_Q4_0, PGD_RECORD_RAW}, {"q4_0+zstd", PGD_KV_Q4_0, PGD_RECORD_ZSTD},
};
#define N_OPTIONS (sizeof options / sizeof options[0])

/* Fills n pages of the pool's codec with realistic K/V. */
static void make_pages(const pgd_record_ident *id, uint8_t *pages, uint32_t n, uint64_t seed)
{
    const pgd__codec *codec = pgd__codec_get((pgd_kv_type)id->kv_type);
    size_t region = pgd__codec_region_bytes((pgd_kv_type)id->kv_type, PAGE_TOKENS, HEAD_DIM);
    float rows[PAGE_TOKENS * HEAD_DIM], walk[HEAD_DIM], offset[2][N_LAYERS][N_KV_HEADS][HEAD_DIM];
    for (int kv = 0; kv < 2; kv++)
        for (int l = 0; l < N_LAYERS; l++)
            for (int h = 0; h < N_KV_HEADS; h++)
                for (int d = 0; d < HEAD_DIM; d++) {
                    float big = kv == 0 && d % 16 == 3 ? 8.0f : 1.0f; /* key outlier channels */
                    offset[kv][l][h][d] = bench_randf(&seed) * big * (kv ? 0.2f : 1.5f);
                }
    for (uint32_t p = 0; p < n; p++) {
        uint8_t *page = pages + (size_t)p * id->page_bytes;
        memset(page, 0, (size_t)id->page_bytes);
        for (int l = 0; l < N_LAYERS; l++)
            for (int kv = 0; kv < 2; kv++)
                for (int h = 0; h < N_KV_HEADS; h++) {
                    for (int d = 0; d < HEAD_DIM; d++)
                        walk[d] = offset[kv][l][h][d];
                    for (int t = 0; t < PAGE_TOKENS; t++)
                        for (int d = 0; d < HEAD_DIM; d++) {
                            walk[d] += bench_randf(&seed) * (kv ? 0.03f : 0.15f);
                            rows[t * HEAD_DIM + d] = walk[d];
                        }
                    size_t r = ((size_t)l * 2 + kv) * N_KV_HEADS + h;
                    codec->encode_page(kv ? PGD__V : PGD__K, page + r * region, PAGE_TOKENS,
                                       HEAD_DIM, rows, PAGE_TOKENS);
                }
    }
}

/* NMSE and max |error| / max |value| of page b against page a (both in the pool's codec). */
static void page_error(const pgd_record_ident *id, const uint8_t *a, const uint8_t *b, double *err2,
                       double *sig2, double *max_err, double *max_val)
{
    const pgd__codec *codec = pgd__codec_get((pgd_kv_type)id->kv_type);
    size_t region = pgd__codec_region_bytes((pgd_kv_type)id->kv_type, PAGE_TOKENS, HEAD_DIM);
    float fa[PAGE_TOKENS * HEAD_DIM], fb[PAGE_TOKENS * HEAD_DIM];
    for (size_t r = 0; r < 2ull * N_LAYERS * N_KV_HEADS; r++) {
        pgd__kv_kind kind = r % 2 ? PGD__V : PGD__K;
        codec->decode_rows(kind, a + r * region, PAGE_TOKENS, HEAD_DIM, 0, PAGE_TOKENS, fa);
        codec->decode_rows(kind, b + r * region, PAGE_TOKENS, HEAD_DIM, 0, PAGE_TOKENS, fb);
        for (int i = 0; i < PAGE_TOKENS * HEAD_DIM; i++) {
            double e = (double)fa[i] - fb[i];
            *err2 += e * e;
            *sig2 += (double)fa[i] * fa[i];
            if (fabs(e) > *max_err) *max_err = fabs(e);
            if (fabs(fa[i]) > *max_val) *max_val = fabs(fa[i]);
        }
    }
}

static pgd_hash block_hash(uint32_t i)
{
    pgd_hash h = {0x9E3779B97F4A7C15ull * (i + 1), 0xC2B2AE3D27D4EB4Full ^ i};
    return h;
}

typedef struct result {
    double record_bytes, gain, put_mbs, get_mbs, memcpy_mbs, nmse, max_rel;
} result;

/* One option over n pages. Returns 0, or 1 (an error, printed). */
static int run(const pgd_record_ident *id, const option_row *opt, const uint8_t *src, uint8_t *dst,
               uint32_t n, int reps, result *res, uint64_t *checksum)
{
    pgd_tier_ram_params rp = pgd_tier_ram_default_params();
    uint64_t raw_record = PGD_RECORD_HEADER_BYTES + id->page_bytes;
    rp.capacity_bytes = raw_record * n + raw_record;
    rp.store_type = opt->store_type;
    rp.compression = opt->compression;
    pgd_tier *t;
    if (pgd_tier_ram_create(&rp, &t) != PGD_OK || pgd_tier_bind(t, id) != PGD_OK) {
        fprintf(stderr, "bench_tier_ram: cannot create the %s tier\n", opt->name);
        return 1;
    }
    pgd_hash none = {0, 0};
    double t0 = bench_now_s();
    for (uint32_t i = 0; i < n; i++) {
        /* A chain, as a prompt's pages are. */
        int rc = pgd_tier_put(t, block_hash(i), i ? block_hash(i - 1) : none,
                              src + (size_t)i * id->page_bytes, NULL, NULL, NULL);
        if (rc != PGD_OK) {
            fprintf(stderr, "bench_tier_ram: put: %s\n", pgd_strerror(rc));
            pgd_tier_close(t);
            return 1;
        }
    }
    double t_put = bench_now_s() - t0;
    double *tg = malloc(2 * (size_t)reps * sizeof *tg), *tm = tg + reps;
    for (int r = -1; r < reps; r++) {
        t0 = bench_now_s();
        for (uint32_t i = 0; i < n; i++)
            if (pgd_tier_get(t, block_hash(i), dst + (size_t)i * id->page_bytes, NULL) != PGD_OK) {
                fprintf(stderr, "bench_tier_ram: get missed\n");
                free(tg);
                pgd_tier_close(t);
                return 1;
            }
        double tget = bench_now_s() - t0;
        t0 = bench_now_s();
        for (uint32_t i = 0; i < n; i++)
            memcpy(dst + (size_t)i * id->page_bytes, src + (size_t)i * id->page_bytes,
                   (size_t)id->page_bytes);
        double tcpy = bench_now_s() - t0;
        if (r >= 0) { /* r == -1: warm-up */
            tg[r] = tget;
            tm[r] = tcpy;
        }
    }
    /* What get returns, once more, for the checksum and the error. */
    double err2 = 0, sig2 = 0, max_err = 0, max_val = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint8_t *d = dst + (size_t)i * id->page_bytes;
        pgd_tier_get(t, block_hash(i), d, NULL);
        for (uint64_t k = 0; k < id->page_bytes; k += 61)
            *checksum = (*checksum ^ d[k]) * 0x100000001b3ull;
        page_error(id, src + (size_t)i * id->page_bytes, d, &err2, &sig2, &max_err, &max_val);
    }
    pgd_tier_stats st;
    pgd_tier_get_stats(t, &st);
    double mb = (double)n * (double)id->page_bytes / 1e6;
    res->record_bytes = (double)st.bytes_used / (double)st.n_records;
    res->gain = (double)raw_record / res->record_bytes;
    res->put_mbs = mb / t_put;
    res->get_mbs = mb / bench_median(tg, (size_t)reps);
    res->memcpy_mbs = mb / bench_median(tm, (size_t)reps);
    res->nmse = sig2 > 0 ? err2 / sig2 : 0;
    res->max_rel = max_val > 0 ? max_err / max_val : 0;
    free(tg);
    pgd_tier_close(t);
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option own[] = {{"pages", required_argument, NULL, 'p'},
                                        {"reps", required_argument, NULL, 'r'},
                                        {0, 0, 0, 0}};
    bench_cli cli = {.prog = "bench_tier_ram",
                     .usage = usage,
                     .own = own,
                     .common = BENCH_SEED | BENCH_JSON | BENCH_SMOKE,
                     .a = {.seed = 1}};
    uint64_t n_pages = 256, reps = 5;
    for (;;) {
        int c = bench_cli_next(&cli, argc, argv);
        if (c == -1) break;
        uint64_t *dst = c == 'p' ? &n_pages : &reps;
        if (bench_parse_u64(optarg, dst) != 0 || *dst == 0 || *dst > 100000) {
            fprintf(stderr, "bench_tier_ram: bad value '%s'\n", optarg);
            return 2;
        }
    }
    if (cli.status >= 0) return cli.status;
    if (cli.a.smoke) {
        n_pages = 8;
        reps = 1;
    }
    pgd_kv_type pools[] = {PGD_KV_F16, PGD_KV_Q8_0};
    uint64_t checksum = 0xcbf29ce484222325ull;
    int failed = 0;
    if (!cli.a.json)
        printf("%-5s %-10s %12s %7s %9s %9s %9s %6s %9s %8s\n", "pool", "store", "bytes/rec",
               "gain", "put_MB/s", "get_MB/s", "cpy_MB/s", "get/cp", "nmse", "max_rel");
    for (size_t pi = 0; pi < 2; pi++) {
        pgd_pool_params pp = pgd_pool_default_params();
        pp.n_layers = N_LAYERS;
        pp.n_kv_heads = N_KV_HEADS;
        pp.head_dim = HEAD_DIM;
        pp.page_tokens = PAGE_TOKENS;
        pp.kv_type = pools[pi];
        pgd_hash fp = {1, 2};
        pgd_record_ident id;
        if (pgd_record_ident_make(&pp, fp, &id) != PGD_OK) return 1;
        uint8_t *src = malloc((size_t)(n_pages * id.page_bytes));
        uint8_t *dst = malloc((size_t)(n_pages * id.page_bytes));
        if (!src || !dst) {
            fprintf(stderr, "bench_tier_ram: out of memory\n");
            return 1;
        }
        make_pages(&id, src, (uint32_t)n_pages, cli.a.seed + pi);
        memset(dst, 0, (size_t)(n_pages * id.page_bytes));
        for (size_t o = 0; o < N_OPTIONS; o++) {
            if (options[o].store_type == (int)pools[pi]) continue; /* that is raw */
            result r;
            if (run(&id, &options[o], src, dst, (uint32_t)n_pages, (int)reps, &r, &checksum)) {
                failed = 1;
                continue;
            }
            const char *pool = pgd_kv_type_name(pools[pi]);
            if (cli.a.json)
                printf("{\"pool\": \"%s\", \"store\": \"%s\", \"record_bytes\": %.0f, "
                       "\"gain\": %.3f, \"put_mbs\": %.1f, \"get_mbs\": %.1f, "
                       "\"memcpy_mbs\": %.1f, \"get_vs_memcpy\": %.3f, \"nmse\": %.3g, "
                       "\"max_rel_err\": %.3g, \"pages\": %llu}\n",
                       pool, options[o].name, r.record_bytes, r.gain, r.put_mbs, r.get_mbs,
                       r.memcpy_mbs, r.get_mbs / r.memcpy_mbs, r.nmse, r.max_rel,
                       (unsigned long long)n_pages);
            else
                printf("%-5s %-10s %12.0f %6.2fx %9.0f %9.0f %9.0f %6.2f %9.2e %8.2e\n", pool,
                       options[o].name, r.record_bytes, r.gain, r.put_mbs, r.get_mbs, r.memcpy_mbs,
                       r.get_mbs / r.memcpy_mbs, r.nmse, r.max_rel);
        }
        free(src);
        free(dst);
    }
    bench_print_checksum(checksum, cli.a.json);
    return failed;
}
