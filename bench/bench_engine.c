/* SPDX-License-Identifier: MIT */
/*
 * bench_engine.c - end-to-end engine speed, llama-bench style: prompt processing of
 * --pp tokens (pp) and token generation of --tg tokens (tg), each at context depths
 * given by --depth (the depth is filled first, untimed, then forked so pp and tg start
 * from the same cached context). Prints tokens/s per (depth, test) and the ratio of each
 * depth to depth 0 in the same run, plus a checksum of the greedy tokens generated.
 *
 *   bench_engine --model M.gguf [--pp 512] [--tg 32] [--depth 0,2048] [-t 2] [--reps 1]
 *   bench_engine --smoke        stories260K from ../shared/models, tiny sizes (ctest)
 *
 * Make a 1B-shape model with `pagoda synth-model --shape 1b --type q8_0 -o 1b-q8_0.gguf`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void usage(void)
{
    puts("usage: bench_engine --model FILE [options]\n"
         "  --model FILE     GGUF model (llama architecture)\n"
         "  --pp N           prompt tokens per pp test (default 512)\n"
         "  --tg N           generated tokens per tg test (default 32)\n"
         "  --depth LIST     comma-separated context depths (default 0,2048)\n"
         "  -t N             threads (default 2)\n"
         "  --batch N        prompt chunk size (default 512)\n"
         "  --kv-type T      f16 | f32 (default f16)\n"
         "  --seed S         prompt token seed (default 1)\n"
         "  --reps N         repetitions per test; the median is printed (default 3)\n"
         "  --json           one JSON object per result line\n"
         "  --smoke          tiny run on stories260K (skips when absent)\n"
         "  --help");
}

static void touch(void *ud, uint64_t done, uint64_t total)
{
    (void)ud, (void)done, (void)total; /* loading with a progress hook prefaults weights */
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t rng(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

int main(int argc, char **argv)
{
    const char *model_path = NULL;
    uint32_t pp = 512, tg = 32, threads = 2, batch = 512, n_depth = 0, depths[16];
    uint64_t seed = 1;
    uint32_t reps = 3;
    int json = 0, smoke = 0;
    pgd_kv_type kv = PGD_KV_F16;
    char smoke_path[1024];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help")) {
            usage();
            return 0;
        } else if (!strcmp(a, "--smoke")) {
            smoke = 1;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (v && !strcmp(a, "--model")) {
            model_path = v;
            i++;
        } else if (v && !strcmp(a, "--pp")) {
            pp = (uint32_t)strtoul(v, NULL, 10);
            i++;
        } else if (v && !strcmp(a, "--tg")) {
            tg = (uint32_t)strtoul(v, NULL, 10);
            i++;
        } else if (v && !strcmp(a, "-t")) {
            threads = (uint32_t)strtoul(v, NULL, 10);
            i++;
        } else if (v && !strcmp(a, "--batch")) {
            batch = (uint32_t)strtoul(v, NULL, 10);
            i++;
        } else if (v && !strcmp(a, "--reps")) {
            reps = (uint32_t)strtoul(v, NULL, 10);
            if (reps < 1 || reps > 99) reps = 3;
            i++;
        } else if (v && !strcmp(a, "--seed")) {
            seed = strtoull(v, NULL, 10);
            i++;
        } else if (v && !strcmp(a, "--kv-type")) {
            kv = !strcmp(v, "f32") ? PGD_KV_F32 : PGD_KV_F16;
            i++;
        } else if (v && !strcmp(a, "--depth")) {
            char *end = (char *)v;
            n_depth = 0;
            while (*end && n_depth < 16) {
                depths[n_depth++] = (uint32_t)strtoul(end, &end, 10);
                if (*end == ',') end++;
            }
            i++;
        } else {
            fprintf(stderr, "bench_engine: unknown option %s (see --help)\n", a);
            return 2;
        }
    }
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
            printf("bench_engine --smoke: %s not found, nothing to run\n", smoke_path);
            return 0;
        }
        fclose(f);
        model_path = smoke_path;
        pp = 32;
        tg = 8;
        depths[0] = 0;
        depths[1] = 64;
        n_depth = 2;
    }
    if (!model_path || !pp || !tg || !threads || !batch) {
        usage();
        return 2;
    }
    char err[512];
    pe_model *m;
    if (pe_model_load(model_path, touch, NULL, &m, err, sizeof err)) {
        fprintf(stderr, "bench_engine: %s\n", err);
        return 1;
    }
    uint32_t max_depth = 0;
    for (uint32_t d = 0; d < n_depth; d++)
        if (depths[d] > max_depth) max_depth = depths[d];
    pe_ctx_params cp = pe_ctx_default_params();
    cp.n_ctx = max_depth + (pp > tg ? pp : tg) + 16;
    cp.n_batch = batch;
    cp.n_threads = threads;
    cp.kv_type = kv;
    cp.kv_tokens = 2 * (uint64_t)cp.n_ctx + 64;
    pe_ctx *c;
    if (pe_ctx_create(m, &cp, &c, err, sizeof err)) {
        fprintf(stderr, "bench_engine: %s\n", err);
        return 1;
    }
    pgd_cache *cache = pe_ctx_cache(c);
    uint32_t n_tok = max_depth + pp + 1;
    int32_t *toks = malloc(n_tok * sizeof *toks);
    float *logits = malloc((size_t)m->hp.n_vocab * sizeof *logits);
    if (!toks || !logits) return 1;
    toks[0] = 1;
    for (uint32_t i = 1; i < n_tok; i++)
        toks[i] = 3 + (int32_t)(rng(&seed) % (m->hp.n_vocab - 3));

    if (!json)
        printf("model %s: %.2f GiB of weights, %u threads, kv %s, isa %s\n", model_path,
               m->weight_bytes / 1073741824.0, threads, pgd_kv_type_name(kv),
               pe_isa_name(pe_isa_detect()));
    if (!json)
        printf("%-8s %-6s %8s %10s %12s %10s\n", "depth", "test", "tokens", "seconds", "tokens/s",
               "vs depth0");
    double base_pp = 0, base_tg = 0;
    uint64_t checksum = 0;
    for (uint32_t d = 0; d < n_depth; d++) {
        pgd_seq *base, *s;
        pgd_seq_create(cache, NULL, 0, &base);
        for (uint32_t i = 0; i < depths[d]; i += batch) {
            uint32_t n = depths[d] - i < batch ? depths[d] - i : batch;
            if (pe_forward(c, base, toks + i, n, NULL, 0)) {
                fprintf(stderr, "bench_engine: depth fill failed\n");
                return 1;
            }
        }
        double tpps[99], ttgs[99];
        for (uint32_t rr = 0; rr < reps; rr++) {
            /* pp: a fork of the depth context prefills pp tokens */
            if (pgd_seq_fork(cache, base, &s) != PGD_OK) return 1;
            double t0 = now_s();
            for (uint32_t i = 0; i < pp; i += batch) {
                uint32_t n = pp - i < batch ? pp - i : batch;
                if (pe_forward(c, s, toks + depths[d] + i, n, i + n == pp ? logits : NULL, 0))
                    return 1;
            }
            tpps[rr] = now_s() - t0;
            pgd_seq_destroy(cache, s);
            /* tg: greedy, one token at a time */
            if (pgd_seq_fork(cache, base, &s) != PGD_OK) return 1;
            int32_t tok = toks[depths[d]];
            t0 = now_s();
            for (uint32_t i = 0; i < tg; i++) {
                if (pe_forward(c, s, &tok, 1, logits, 0)) return 1;
                uint32_t best = 0;
                for (uint32_t v = 1; v < m->hp.n_vocab; v++)
                    if (logits[v] > logits[best]) best = v;
                tok = (int32_t)best;
                if (rr == 0) checksum = checksum * 31 + best;
            }
            ttgs[rr] = now_s() - t0;
            pgd_seq_destroy(cache, s);
        }
        qsort(tpps, reps, sizeof *tpps, cmp_double);
        qsort(ttgs, reps, sizeof *ttgs, cmp_double);
        double tpp = tpps[reps / 2], ttg = ttgs[reps / 2];
        pgd_seq_destroy(cache, base);
        double rpp = pp / tpp, rtg = tg / ttg;
        if (d == 0) {
            base_pp = rpp;
            base_tg = rtg;
        }
        if (json) {
            printf("{\"depth\": %u, \"test\": \"pp\", \"tokens\": %u, \"tokens_per_s\": %.2f}\n",
                   depths[d], pp, rpp);
            printf("{\"depth\": %u, \"test\": \"tg\", \"tokens\": %u, \"tokens_per_s\": %.2f}\n",
                   depths[d], tg, rtg);
        } else {
            printf("%-8u %-6s %8u %10.3f %12.2f %10.3f\n", depths[d], "pp", pp, tpp, rpp,
                   rpp / base_pp);
            printf("%-8u %-6s %8u %10.3f %12.2f %10.3f\n", depths[d], "tg", tg, ttg, rtg,
                   rtg / base_tg);
        }
        pgd_cache_clear(cache);
    }
    if (!json) printf("checksum %016llx\n", (unsigned long long)checksum);
    free(toks);
    free(logits);
    pe_ctx_free(c);
    pe_model_free(m);
    return 0;
}
