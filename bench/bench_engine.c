/* SPDX-License-Identifier: MIT */
/*
 * bench_engine.c - end-to-end engine speed, llama-bench style: prompt processing of
 * --pp tokens (pp) and token generation of --tg tokens (tg), each at context depths
 * given by --depth (the context is filled once per KV type, untimed, growing from one
 * depth to the next, and forked so pp and tg start from the same cached context), for
 * each KV codec given by --kv-type. Prints tokens/s per (kv type, depth, test), the ratio
 * of each depth to depth 0 and of each kv type to f16 (or to the first type when f16 is
 * not listed) in the same run, plus a checksum of the greedy tokens generated.
 *
 *   bench_engine --model M.gguf [--pp 512] [--tg 32] [--depth 0,2048,8192] [-t 2]
 *                [--kv-type f16,q8_0,q4_0] [--reps 3] [--isa avx2]
 *   bench_engine --smoke        stories260K from ../shared/models, tiny sizes (ctest)
 *
 * Make a 1B-shape model with `pagoda synth-model --shape 1b --type q8_0 -o 1b-q8_0.gguf`.
 */
#include "bench.h"
#include "model.h"

/* CPU seconds of the whole process (every thread): on a machine shared with other work,
 * tokens per CPU-second compare implementations more stably than wall time. */
static double cpu_s(void)
{
    return bench_clock_s(CLOCK_PROCESS_CPUTIME_ID);
}

static void usage(FILE *f)
{
    fputs("usage: bench_engine --model FILE [options]\n"
          "  --model FILE     GGUF model (llama architecture)\n"
          "  --pp N           prompt tokens per pp test (default 512; 0: no pp test)\n"
          "  --tg N           generated tokens per tg test (default 32; 0: no tg test)\n"
          "  --depth LIST     comma-separated context depths (default 0,2048)\n"
          "  -t N             threads (default 2)\n"
          "  --batch N        prompt chunk size (default 512)\n"
          "  --kv-type LIST   comma-separated KV codecs: f32, f16, bf16, q8_0, q4_0, kivi2\n"
          "                   (default f16)\n"
          "  --kv-rotate      Hadamard-rotate K and V (every kv type)\n"
          "  --deterministic  batch-invariant matrix products (pe_ctx_params.deterministic)\n"
          "  --isa NAME       kernels: scalar, avx2, avx2vnni or avx512 (pe_isa_force; default\n"
          "                   the best this CPU has; never above it)\n"
          "  --kv-select-pages N  Quest page budget for decode (default 0 = dense)\n"
          "  --seed S         prompt token seed (default 1)\n"
          "  --reps N         repetitions per test; the median is printed (default 3)\n"
          "  --json           one JSON object per result line\n"
          "  --smoke          tiny run on stories260K (skips when absent)\n"
          "  --help\n",
          f);
}

static void touch(void *ud, uint64_t done, uint64_t total)
{
    (void)ud, (void)done, (void)total; /* loading with a progress hook prefaults weights */
}

static uint64_t rng(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

typedef struct result {
    double pp, tg;         /* tokens/s; 0 when not measured */
    double pp_cpu, tg_cpu; /* tokens per CPU-second */
} result;

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"model", required_argument, NULL, 'M'},
        {"pp", required_argument, NULL, 'p'},
        {"tg", required_argument, NULL, 'g'},
        {"depth", required_argument, NULL, 'd'},
        {"batch", required_argument, NULL, 'b'},
        {"kv-type", required_argument, NULL, 'k'},
        {"kv-rotate", no_argument, NULL, 'R'},
        {"deterministic", no_argument, NULL, 'D'},
        {"kv-select-pages", required_argument, NULL, 'S'},
        {"reps", required_argument, NULL, 'r'},
        {"isa", required_argument, NULL, 'I'},
        {NULL, 0, NULL, 0},
    };
    const char *model_path = NULL;
    uint32_t pp = 512, tg = 32, threads = 2, batch = 512, depths[16], select_pages = 0;
    int n_depth = 0, n_kv = 1, kv_rotate = 0, deterministic = 0;
    uint32_t reps = 3;
    bench_cli cli = {.prog = "bench_engine",
                     .usage = usage,
                     .own = lo,
                     .optstring = "t:",
                     .common = BENCH_SEED | BENCH_JSON | BENCH_SMOKE,
                     .a = {.seed = 1}};
    pgd_kv_type kvs[8] = {PGD_KV_F16};
    char smoke_path[1024];
    for (;;) {
        int c = bench_cli_next(&cli, argc, argv);
        if (c == -1) break;
        const uint32_t n = (uint32_t)strtoul(optarg ? optarg : "0", NULL, 10);
        switch (c) {
        case 'M':
            model_path = optarg;
            break;
        case 'p':
            pp = n;
            break;
        case 'g':
            tg = n;
            break;
        case 't':
            threads = n;
            break;
        case 'b':
            batch = n;
            break;
        case 'r':
            reps = n >= 1 && n <= 99 ? n : 3;
            break;
        case 'S':
            select_pages = n;
            break;
        case 'R':
            kv_rotate = 1;
            break;
        case 'D':
            deterministic = 1;
            break;
        case 'I': { /* the kernels' names, from scalar up */
            int found = -1;
            for (int i = PE_ISA_SCALAR; i <= PE_ISA_AVX512; i++)
                if (strcmp(optarg, pe_isa_name((pe_isa)i)) == 0) found = i;
            if (found < 0) {
                fprintf(stderr, "bench_engine: --isa: unknown '%s'\n", optarg);
                return 2;
            }
            pe_isa_force((pe_isa)found); /* printed below: pe_isa_active */
            break;
        }
        case 'k':
            n_kv = bench_parse_kv_types(optarg, kvs, 8);
            if (n_kv < 1) {
                fprintf(stderr, "bench_engine: --kv-type: bad list '%s'\n", optarg);
                return 2;
            }
            break;
        case 'd':
            n_depth = bench_parse_u32_list(optarg, depths, 16, 0);
            if (n_depth < 1) {
                fprintf(stderr, "bench_engine: --depth: bad list '%s'\n", optarg);
                return 2;
            }
            break;
        }
    }
    if (cli.status >= 0) return cli.status;
    if (optind != argc) {
        fprintf(stderr, "bench_engine: unexpected argument %s (see --help)\n", argv[optind]);
        return 2;
    }
    const int json = cli.a.json, smoke = cli.a.smoke;
    if (!n_depth) {
        depths[0] = 0;
        depths[1] = 2048;
        n_depth = 2;
    }
    if (smoke) {
        const char *dir = getenv("PGD_MODELS_DIR");
        snprintf(smoke_path, sizeof smoke_path, "%s/stories260K.gguf",
                 dir ? dir : PGD_SOURCE_DIR "/../shared/models");
        FILE *f = fopen(smoke_path, "rb");
        if (!f) {
            fprintf(stderr, "bench_engine --smoke: %s not found, skipped\n", smoke_path);
            return 77; /* ctest: skipped (bench/CMakeLists.txt) */
        }
        fclose(f);
        model_path = smoke_path;
        pp = 32;
        tg = 8;
        depths[0] = 0;
        depths[1] = 64;
        n_depth = 2;
        reps = 1;
        kvs[0] = PGD_KV_F16;
        kvs[1] = PGD_KV_Q8_0;
        kvs[2] = PGD_KV_KIVI2;
        n_kv = 3;
    }
    if (!model_path || (!pp && !tg) || !threads || !batch) {
        usage(stderr);
        return 2;
    }
    /* Depths ascending: one fill per kv type grows from one depth to the next. */
    for (int i = 1; i < n_depth; i++)
        for (int k = i; k > 0 && depths[k] < depths[k - 1]; k--) {
            uint32_t t = depths[k];
            depths[k] = depths[k - 1];
            depths[k - 1] = t;
        }
    char err[512];
    pe_model *m;
    if (pe_model_load(model_path, touch, NULL, &m, err, sizeof err)) {
        fprintf(stderr, "bench_engine: %s\n", err);
        return 1;
    }
    const uint32_t max_depth = depths[n_depth - 1];
    uint32_t n_tok = max_depth + pp + 1;
    int32_t *toks = malloc(n_tok * sizeof *toks);
    float *logits = malloc((size_t)pe_model_hparams(m)->n_vocab * sizeof *logits);
    result *res = calloc((size_t)n_kv * n_depth, sizeof *res);
    if (!toks || !logits || !res) return 1;
    uint64_t seed = cli.a.seed;
    toks[0] = 1;
    for (uint32_t i = 1; i < n_tok; i++)
        toks[i] = 3 + (int32_t)(rng(&seed) % (pe_model_hparams(m)->n_vocab - 3));

    int base_kv = 0; /* ratios per kv type are to f16, or to the first type */
    for (int k = 0; k < n_kv; k++)
        if (kvs[k] == PGD_KV_F16) {
            base_kv = k;
            break;
        }
    if (!json)
        printf("model %s: %.2f GiB of weights, %u threads, isa %s%s%s\n", model_path,
               pe_model_weight_bytes(m) / 1073741824.0, threads, pe_isa_name(pe_isa_active()),
               kv_rotate ? ", kv rotated" : "", deterministic ? ", deterministic" : "");
    if (!json)
        printf("%-6s %-8s %-5s %8s %10s %12s %10s %8s %10s %12s\n", "kv", "depth", "test", "tokens",
               "seconds", "tokens/s", "vs depth0", "vs f16", "t/cpu-s", "KV B/token");
    uint64_t checksum = 0;
    for (int k = 0; k < n_kv; k++) {
        pe_ctx_params cp = pe_ctx_default_params();
        cp.n_ctx = max_depth + (pp > tg ? pp : tg) + 16;
        cp.n_batch = batch;
        cp.n_threads = threads;
        cp.kv_type = kvs[k];
        cp.kv_rotate = kv_rotate;
        cp.deterministic = deterministic;
        cp.kv_select_pages = select_pages;
        cp.kv_tokens = 2 * (uint64_t)cp.n_ctx + 64;
        pe_ctx *c;
        if (pe_ctx_create(m, &cp, &c, err, sizeof err)) {
            fprintf(stderr, "bench_engine: kv %s: %s\n", pgd_kv_type_name(kvs[k]), err);
            return 1;
        }
        pgd_cache *cache = pe_ctx_cache(c);
        double bpt =
            pgd_kv_bytes_per_token(kvs[k], cp.page_tokens, pe_model_hparams(m)->n_layer,
                                   pe_model_hparams(m)->n_head_kv, pe_model_hparams(m)->head_dim);
        pgd_seq *base, *s;
        uint32_t filled = 0;
        if (pgd_seq_create(cache, NULL, 0, &base) != PGD_OK) return 1;
        for (int d = 0; d < n_depth; d++) {
            while (filled < depths[d]) { /* untimed: extend the context to this depth */
                uint32_t n = depths[d] - filled < batch ? depths[d] - filled : batch;
                if (pe_forward(c, base, toks + filled, n, NULL, 0)) {
                    fprintf(stderr, "bench_engine: depth fill failed\n");
                    return 1;
                }
                filled += n;
            }
            double tpps[99], ttgs[99], cpps[99], ctgs[99];
            for (uint32_t rr = 0; rr < reps; rr++) {
                /* pp: a fork of the depth context prefills pp tokens */
                if (pp) {
                    if (pgd_seq_fork(cache, base, &s) != PGD_OK) return 1;
                    double t0 = bench_now_s(), c0 = cpu_s();
                    for (uint32_t i = 0; i < pp; i += batch) {
                        uint32_t n = pp - i < batch ? pp - i : batch;
                        if (pe_forward(c, s, toks + depths[d] + i, n, i + n == pp ? logits : NULL,
                                       0))
                            return 1;
                    }
                    tpps[rr] = bench_now_s() - t0;
                    cpps[rr] = cpu_s() - c0;
                    pgd_seq_destroy(cache, s);
                }
                /* tg: greedy, one token at a time */
                if (tg) {
                    if (pgd_seq_fork(cache, base, &s) != PGD_OK) return 1;
                    int32_t tok = toks[depths[d]];
                    double t0 = bench_now_s(), c0 = cpu_s();
                    for (uint32_t i = 0; i < tg; i++) {
                        if (pe_forward(c, s, &tok, 1, logits, 0)) return 1;
                        uint32_t best = 0;
                        for (uint32_t v = 1; v < pe_model_hparams(m)->n_vocab; v++)
                            if (logits[v] > logits[best]) best = v;
                        tok = (int32_t)best;
                        if (rr == 0) checksum = checksum * 31 + best;
                    }
                    ttgs[rr] = bench_now_s() - t0;
                    ctgs[rr] = cpu_s() - c0;
                    pgd_seq_destroy(cache, s);
                }
            }
            result *r = &res[(size_t)k * n_depth + d];
            const result *r0 = &res[(size_t)k * n_depth], *rb = &res[(size_t)base_kv * n_depth + d];
            const char *kn = pgd_kv_type_name(kvs[k]);
            for (int t = 0; t < 2; t++) {
                uint32_t ntok = t ? tg : pp;
                if (!ntok) continue;
                double *times = t ? ttgs : tpps, *cpus = t ? ctgs : cpps;
                double secs = bench_median(times, reps), tps = ntok / secs;
                double cps = ntok / bench_median(cpus, reps);
                if (t) {
                    r->tg = tps;
                    r->tg_cpu = cps;
                } else {
                    r->pp = tps;
                    r->pp_cpu = cps;
                }
                double v0 = t ? r0->tg : r0->pp, vb = t ? rb->tg : rb->pp;
                if (json)
                    printf("{\"kv_type\": \"%s\", \"depth\": %u, \"test\": \"%s\", \"tokens\": %u, "
                           "\"tokens_per_s\": %.2f, \"tokens_per_cpu_s\": %.2f, "
                           "\"kv_bytes_per_token\": %.1f}\n",
                           kn, depths[d], t ? "tg" : "pp", ntok, tps, cps, bpt);
                else if (k >= base_kv)
                    printf("%-6s %-8u %-5s %8u %10.3f %12.2f %10.3f %8.3f %10.2f %12.1f\n", kn,
                           depths[d], t ? "tg" : "pp", ntok, secs, tps, tps / v0, tps / vb, cps,
                           bpt);
                else /* before the baseline type ran: its ratio comes in the summary */
                    printf("%-6s %-8u %-5s %8u %10.3f %12.2f %10.3f %8s %10.2f %12.1f\n", kn,
                           depths[d], t ? "tg" : "pp", ntok, secs, tps, tps / v0, "-", cps, bpt);
            }
        }
        pgd_seq_destroy(cache, base);
        pe_ctx_destroy(c);
    }
    if (!json && n_kv > 1 && tg) {
        printf("decode by kv type: tokens/s (ratio to %s) | tokens per CPU-second (ratio)\n",
               pgd_kv_type_name(kvs[base_kv]));
        for (int d = 0; d < n_depth; d++) {
            for (int k = 0; k < n_kv; k++) {
                const result *r = &res[(size_t)k * n_depth + d];
                const result *b = &res[(size_t)base_kv * n_depth + d];
                printf("depth %-6u %-6s %9.2f (%5.3fx) | %9.2f (%5.3fx)\n", depths[d],
                       pgd_kv_type_name(kvs[k]), r->tg, r->tg / b->tg, r->tg_cpu,
                       r->tg_cpu / b->tg_cpu);
            }
        }
    }
    if (!json) bench_print_checksum(checksum, 0);
    free(res);
    free(toks);
    free(logits);
    pe_model_destroy(m);
    return 0;
}
