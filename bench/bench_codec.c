/* SPDX-License-Identifier: MIT */
/*
 * bench_codec.c - the page codecs: bytes per token, encode throughput, and the attention
 * kernels (k_scores over every page of a long context, then v_accum with the scores as
 * weights) in GB/s of encoded bytes and tokens/s, each as a ratio to f16 in the same run.
 * Shapes: head_dim 64 and 128, nq 1 and 4 (query heads per KV head), a context of --ctx
 * tokens (default 8192) in pages of --page-tokens, for --heads KV heads visited in turn
 * (default 1: the pages stay in L2/L3 and the kernels are compute-bound; 64 heads of 8k
 * tokens make a working set beyond the last-level cache, where bytes per token decide).
 *
 * Each figure is the median of --reps timed repetitions after one untimed warm-up, on the
 * fastest kernels of this CPU (pgd__codec_get). The checksum folds every output, so a
 * change that is fast but wrong shows up. Internal API (src/codec), like the unit tests.
 */
#include <math.h>

#include "bench.h"
#include "codec/codec_impl.h"

static const pgd_kv_type types[] = {PGD_KV_F16,  PGD_KV_F32,  PGD_KV_BF16,
                                    PGD_KV_Q8_0, PGD_KV_Q4_0, PGD_KV_KIVI2};
#define N_TYPES (sizeof types / sizeof types[0])

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_codec [options]\n"
               "Codec encode speed and attention-kernel speed over a long context, vs f16.\n"
               "  --ctx N          context length in tokens (default 8192)\n"
               "  --page-tokens N  tokens per page, power of two (default 16)\n"
               "  --heads N        KV heads (independent contexts) per pass (default 1)\n"
               "  --reps N         timed repetitions, median reported (default 9)\n"
               "  --seed N         data generator seed (default 1)\n"
               "  --isa N          kernel level: 0 scalar, 1 avx2, 2 avx512, 3 avx512-vnni\n"
               "                   (default: the best this CPU has)\n"
               "  --smoke          tiny and fast (512 tokens, 1 rep): for ctest\n"
               "  --help           show this help\n");
}

/* Uniform in [-1, 1), from 24 random bits of the shared generator. */
static uint64_t rng_state;
static float frand(void)
{
    return (float)((bench_rng(&rng_state) >> 40) * 0x1p-24 * 2.0 - 1.0);
}

typedef struct result {
    double bytes_per_token, encode_tok_s, attn_s, k_s, v_s;
} result;

/* One codec at one shape. Returns 0, or 1 on allocation failure. */
static int isa_level = -1; /* --isa: a lower kernel level than this CPU's best */

static int run(pgd_kv_type type, uint32_t hd, uint32_t nq, uint32_t ctx, uint32_t heads,
               uint32_t pt, int reps, result *res, double *checksum)
{
    const pgd__codec *cd = isa_level >= 0 ? pgd__codec_at(type, isa_level) : pgd__codec_get(type);
    size_t rb = pgd__codec_region_bytes(type, pt, hd);
    uint32_t n_pages = ctx / pt * heads; /* head h owns pages [h * ctx / pt, ...) */
    uint8_t *arena = aligned_alloc(64, (2 * (size_t)n_pages * rb + 63) / 64 * 64);
    float *rows = malloc((size_t)pt * hd * sizeof(float));
    float *q = malloc((size_t)nq * hd * sizeof(float)), *out = malloc((size_t)nq * hd * 4);
    float *sc = malloc((size_t)nq * ctx * heads * sizeof(float));
    double *t = malloc(3 * (size_t)reps * sizeof *t), *tk = t + reps, *tv = tk + reps;
    int rc = 1;
    if (!arena || !rows || !q || !out || !sc || !t) goto done;
    /* Encode: every page's K and V region from random rows (row by row when writable). */
    double t0 = bench_now_s();
    for (uint32_t p = 0; p < 2 * n_pages; p++) {
        for (size_t i = 0; i < (size_t)pt * hd; i++)
            rows[i] = frand();
        uint8_t *reg = arena + (size_t)p * rb;
        pgd__kv_kind kind = p % 2 ? PGD__V : PGD__K;
        if (cd->row_writable)
            for (uint32_t r = 0; r < pt; r++)
                cd->write_row(kind, reg, pt, hd, r, rows + (size_t)r * hd);
        else
            cd->encode_page(kind, reg, pt, hd, rows, pt);
    }
    double t_enc = bench_now_s() - t0; /* includes the random numbers: a lower bound of speed */
    for (size_t i = 0; i < (size_t)nq * hd; i++)
        q[i] = frand();
    const float scale = 1.0f / sqrtf((float)hd);
    for (int r = -1; r < reps; r++) {
        memset(out, 0, (size_t)nq * hd * 4);
        /* K and V timed apart (the sum is the attention time): each head's scores, then its
         * values, as attention does page block by page block. */
        double dk = 0, dv = 0;
        for (uint32_t h = 0; h < heads; h++) {
            uint32_t p0 = h * (ctx / pt), p1 = p0 + ctx / pt;
            float *sh = sc + (size_t)h * nq * ctx;
            t0 = bench_now_s();
            for (uint32_t p = p0; p < p1; p++)
                cd->k_scores(arena + 2 * (size_t)p * rb, pt, hd, 0, pt, q, nq, scale,
                             sh + (size_t)(p - p0) * pt, ctx);
            double t1 = bench_now_s();
            for (uint32_t p = p0; p < p1; p++)
                cd->v_accum(arena + (2 * (size_t)p + 1) * rb, pt, hd, 0, pt,
                            sh + (size_t)(p - p0) * pt, ctx, nq, out);
            dk += t1 - t0;
            dv += bench_now_s() - t1;
        }
        if (r >= 0) {
            t[r] = dk + dv;
            tk[r] = dk;
            tv[r] = dv;
        }
    }
    res->k_s = bench_median(tk, (size_t)reps);
    res->v_s = bench_median(tv, (size_t)reps);
    res->bytes_per_token = 2.0 * (double)rb / pt;
    res->encode_tok_s = (double)n_pages * pt / t_enc;
    res->attn_s = bench_median(t, (size_t)reps);
    for (size_t i = 0; i < (size_t)nq * hd; i++)
        *checksum += out[i];
    rc = 0;
done:
    free(arena);
    free(rows);
    free(q);
    free(out);
    free(sc);
    free(t);
    return rc;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"ctx", required_argument, NULL, 'c'},   {"page-tokens", required_argument, NULL, 'p'},
        {"heads", required_argument, NULL, 'n'}, {"reps", required_argument, NULL, 'r'},
        {"isa", required_argument, NULL, 'i'},   {NULL, 0, NULL, 0},
    };
    bench_cli cli = {.prog = "bench_codec",
                     .usage = usage,
                     .own = opts,
                     .common = BENCH_SEED | BENCH_SMOKE,
                     .a = {.seed = 1}};
    uint64_t ctx = 8192, pt = 16, reps = 9, heads = 1, v;
    for (;;) {
        int opt = bench_cli_next(&cli, argc, argv);
        if (opt == -1) break;
        if (bench_parse_u64(optarg, &v) != 0) {
            fprintf(stderr, "bench_codec: bad number '%s'\n", optarg);
            return 2;
        }
        if (opt == 'i') {
            if (v > PGD__ISA_VNNI || (int)v > pgd__cpu_isa()) {
                fprintf(stderr, "bench_codec: --isa '%s': not a level this CPU has (0..%d)\n",
                        optarg, pgd__cpu_isa());
                return 2;
            }
            isa_level = (int)v;
        } else if (opt == 'c') {
            ctx = v;
        } else if (opt == 'p') {
            pt = v;
        } else if (opt == 'n') {
            heads = v;
        } else {
            reps = v;
        }
    }
    if (cli.status >= 0) return cli.status;
    if (cli.a.smoke) {
        ctx = 512;
        reps = 1;
    }
    const uint64_t seed = cli.a.seed;
    if (optind < argc || pt < 2 || (pt & (pt - 1)) || pt > 4096 || reps == 0 || reps > 10000 ||
        ctx < pt || ctx > (1u << 24) || heads == 0 || heads * ctx > (1u << 24)) {
        usage(stderr);
        return 2;
    }
    static const char *const isa_names[] = {"scalar", "avx2", "avx512", "avx512-vnni"};
    printf("bench_codec: ctx %" PRIu64 " tokens, %" PRIu64 " tokens per page, %" PRIu64
           " KV heads, "
           "median of %" PRIu64 ", seed %" PRIu64 ", kernels %s\n",
           ctx, pt, heads, reps, seed, isa_names[isa_level >= 0 ? isa_level : pgd__cpu_isa()]);
    printf("%-6s %4s %3s %9s %11s %9s %8s %11s %9s %7s %7s %9s\n", "codec", "hd", "nq", "B/token",
           "enc tok/s", "attn ms", "GB/s", "attn tok/s", "x f16", "K x f16", "V x f16",
           "enc x f16");
    double checksum = 0;
    static const uint32_t hds[] = {64, 128}, nqs[] = {1, 4};
    for (size_t i = 0; i < 2; i++)
        for (size_t j = 0; j < 2; j++) {
            result base = {0, 0, 0, 0, 0};
            for (size_t k = 0; k < N_TYPES; k++) {
                result r;
                rng_state = seed * 0x9E3779B97F4A7C15ull + 1;
                if (run(types[k], hds[i], nqs[j], (uint32_t)(ctx / pt * pt), (uint32_t)heads,
                        (uint32_t)pt, (int)reps, &r, &checksum) != 0) {
                    fprintf(stderr, "bench_codec: out of memory\n");
                    return 1;
                }
                if (k == 0) base = r;
                double tok_s = (double)(ctx / pt * pt) * (double)heads / r.attn_s;
                printf("%-6s %4u %3u %9.1f %11.3g %9.3f %8.2f %11.3g %9.2f %7.2f %7.2f %9.2f\n",
                       pgd_kv_type_name(types[k]), hds[i], nqs[j], r.bytes_per_token,
                       r.encode_tok_s, r.attn_s * 1e3, r.bytes_per_token * tok_s * 1e-9, tok_s,
                       base.attn_s / r.attn_s, base.k_s / r.k_s, base.v_s / r.v_s,
                       r.encode_tok_s / base.encode_tok_s);
            }
        }
    printf("checksum %.6e\n", checksum);
    return 0;
}
