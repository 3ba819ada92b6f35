/* SPDX-License-Identifier: MIT */
/*
 * test_bench_cli.c - end-to-end tests of `pagoda bench`, run as the real binary (argv[1])
 * with scratch files in a directory (argv[2]); the model is stories260K ($PGD_MODELS_DIR
 * or ../shared/models beside the source tree, tests/proc.h) or else the build's synthetic
 * tiny model (argv[3]); skipped (77) when neither exists.
 *
 * Checks: `bench -m MODEL --json` spawns `pagoda serve` twice (with and without the prefix
 * cache), every request succeeds, the JSON has every documented key, the prefix hit
 * ratio is > 0 with the cache and exactly 0 without, and the server computed fewer prompt
 * tokens with the cache (from its /metrics); the table names its rows; `--trace` on a
 * gen-trace trace with 2 tenants sends every line and finds its prefix sharing; a server that
 * cannot start is reported with its output; an unreachable --url and bad flags exit
 * with a message. No timing is asserted.
 */
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "proc.h"
#include "t.h"

static const char *bin;   /* the pagoda executable */
static const char *dir;   /* scratch directory */
static char model[1024];  /* the model the spawned servers load */
static char out[1 << 16]; /* stdout of the last run */
static char err[1 << 16]; /* stderr of the last run */

/* Runs `pagoda ARGS` through sh; fills out and err; returns the exit status (-1 on error). */
static int run(const char *args)
{
    return t_run_bin(bin, dir, args, out, sizeof out, err, sizeof err);
}

static double num(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : -1.0;
}

#define WORKLOAD "--groups 2 --prompts 3 --system-tokens 64 --question-tokens 8 --output-tokens 8"

/* The keys of one run object; returns 0 when all are there with the right types. */
static int check_run(json_t *r, int prefix_cache)
{
    static const char *const numbers[] = {"requests",
                                          "ok",
                                          "failed",
                                          "duration_s",
                                          "prompt_tokens",
                                          "cached_tokens",
                                          "completion_tokens",
                                          "output_throughput_tps",
                                          "total_throughput_tps"};
    static const char *const lat[] = {"ttft_ms", "itl_ms"};
    json_t *pc = json_object_get(r, "prefix_cache");

    T_ASSERT(json_is_object(r));
    T_ASSERT(json_is_string(json_object_get(r, "name")));
    T_ASSERT(json_is_boolean(pc) && json_is_true(pc) == prefix_cache);
    for (size_t i = 0; i < sizeof numbers / sizeof numbers[0]; i++) {
        if (!json_is_number(json_object_get(r, numbers[i]))) T_FAIL("no number '%s'", numbers[i]);
    }
    /* Percentiles are numbers when the summary has samples, null when it has none: the
     * server sends the text that is ready in one event, so a tiny model's 8 tokens can come
     * in one event per request and leave ITL without samples (seen beside a busy core). Every
     * request has a first token, so TTFT always has 6. */
    for (size_t i = 0; i < 2; i++) {
        static const char *const pct[] = {"p50", "p90", "p99"};
        json_t *s = json_object_get(r, lat[i]);
        T_ASSERT(json_is_object(s));
        const double n = num(s, "n");
        T_ASSERT(n >= 0);
        if (i == 0) T_EQ(n, 6);
        for (size_t k = 0; k < 3; k++) {
            json_t *v = json_object_get(s, pct[k]);
            if (n > 0 ? !json_is_number(v) : !json_is_null(v))
                T_FAIL("%s.%s is not %s (n %.0f)", lat[i], pct[k], n > 0 ? "a number" : "null", n);
        }
    }
    T_ASSERT(json_is_object(json_object_get(r, "errors")));
    T_ASSERT(json_object_size(json_object_get(r, "errors")) == 0);
    T_EQ(num(r, "requests"), 6);
    T_EQ(num(r, "ok"), 6);
    T_EQ(num(r, "failed"), 0);
    T_EQ(num(r, "prompt_tokens"), 6 * 72);
    T_ASSERT(num(r, "completion_tokens") >= 6 && num(r, "completion_tokens") <= 6 * 8);
    /* From the server's /metrics: present for pagoda serve. */
    T_ASSERT(json_is_number(json_object_get(r, "kv_usage_peak")));
    T_ASSERT(json_is_number(json_object_get(r, "prompt_tokens_computed")));
    T_ASSERT(json_is_number(json_object_get(r, "prefix_hit_ratio")));
    return 0;
}

static int test_compare_json(void)
{
    char args[2048];
    json_error_t je;
    json_t *o, *runs, *with, *without, *wl, *ratios;
    int rc;

    snprintf(args, sizeof args, "bench -m '%s' " WORKLOAD " --json", model);
    rc = run(args);
    if (rc != 0) T_FAIL("bench exited %d: %s", rc, err);
    o = json_loads(out, 0, &je);
    if (!json_is_object(o)) T_FAIL("stdout is not one JSON object (%s): %s", je.text, out);
    T_ASSERT(json_is_string(json_object_get(o, "model")));
    T_ASSERT(json_is_string(json_object_get(o, "model_path")));
    T_ASSERT(json_is_null(json_object_get(o, "url")));
    wl = json_object_get(o, "workload");
    T_EQ(num(wl, "requests"), 6);
    T_EQ(num(wl, "groups"), 2);
    T_EQ(num(wl, "prompts"), 3);
    T_EQ(num(wl, "system_tokens"), 64);
    T_EQ(num(wl, "question_tokens"), 8);
    T_EQ(num(wl, "output_tokens"), 8);
    T_EQ(num(wl, "concurrency"), 8);
    runs = json_object_get(o, "runs");
    T_ASSERT(json_is_array(runs) && json_array_size(runs) == 2);
    with = json_array_get(runs, 0);
    without = json_array_get(runs, 1);
    if (check_run(with, 1) != 0 || check_run(without, 0) != 0) return 1;

    /* The cache at work: hits with it, none without, and less prompt computed. */
    T_ASSERT(num(with, "prefix_hit_ratio") > 0.0);
    T_ASSERT(num(with, "cached_tokens") > 0);
    T_ASSERT(num(without, "prefix_hit_ratio") == 0.0);
    T_EQ(num(without, "cached_tokens"), 0);
    T_ASSERT(num(with, "prompt_tokens_computed") < num(without, "prompt_tokens_computed"));
    T_ASSERT(num(without, "prompt_tokens_computed") >= 6 * 72);
    T_ASSERT(num(with, "kv_usage_peak") >= 0.0 && num(with, "kv_usage_peak") <= 1.0);

    ratios = json_object_get(o, "ratios");
    T_ASSERT(json_is_object(ratios));
    T_ASSERT(json_is_number(json_object_get(ratios, "output_throughput")));
    T_ASSERT(json_is_number(json_object_get(ratios, "total_throughput")));
    T_ASSERT(json_is_number(json_object_get(ratios, "ttft_p50")));
    T_ASSERT(num(ratios, "prompt_tokens_computed") > 0 &&
             num(ratios, "prompt_tokens_computed") < 1.0);
    json_decref(o);
    return 0;
}

/* --trace: a gen-trace trace with 2 tenants, one request at a time; every request ok,
 * the prompt tokens those the trace's blocks make, and its prefix sharing found. */
static int test_trace_json(void)
{
    char args[2048];
    json_error_t je;
    json_t *o, *wl, *r;
    int rc;

    snprintf(args, sizeof args,
             "gen-trace --requests 12 --groups 2 --system-blocks 2 --sessions 2 --turns 3 "
             "--turn-blocks 1 --one-off 0 --block-tokens 16 -o '%s/trace.jsonl'",
             dir);
    T_EQ(run(args), 0);
    snprintf(args, sizeof args,
             "bench -m '%s' --trace '%s/trace.jsonl' --block-tokens 16 --tenants 2 "
             "--output-tokens 4 --no-compare --json",
             model, dir);
    rc = run(args);
    if (rc != 0) T_FAIL("bench exited %d: %s", rc, err);
    o = json_loads(out, 0, &je);
    if (!json_is_object(o)) T_FAIL("stdout is not one JSON object (%s): %s", je.text, out);
    wl = json_object_get(o, "workload");
    T_EQ(num(wl, "requests"), 12);
    T_EQ(num(wl, "tenants"), 2);
    T_EQ(num(wl, "block_tokens"), 16);
    T_EQ(num(wl, "concurrency"), 1);
    T_ASSERT(json_is_string(json_object_get(wl, "trace")));
    T_ASSERT(json_is_null(json_object_get(wl, "speedup")));
    r = json_array_get(json_object_get(o, "runs"), 0);
    T_EQ(num(r, "requests"), 12);
    T_EQ(num(r, "ok"), 12);
    T_EQ(num(r, "prompt_tokens"), num(wl, "prompt_tokens"));
    T_ASSERT(num(r, "completion_tokens") >= 12 && num(r, "completion_tokens") <= 12 * 4);
    /* Later turns extend earlier ones of the same conversation, so of the same tenant. */
    T_ASSERT(num(r, "cached_tokens") > 0);
    json_decref(o);
    return 0;
}

/* The table, one run, Poisson arrivals: every row is named. */
static int test_table(void)
{
    static const char *const rows[] = {"requests ok / failed",
                                       "output throughput (tok/s)",
                                       "total throughput (tok/s)",
                                       "TTFT p50 (ms)",
                                       "TTFT p99 (ms)",
                                       "ITL p90 (ms)",
                                       "prefix hit ratio",
                                       "KV usage peak",
                                       "prompt tokens computed"};
    char args[2048];
    int rc;

    snprintf(args, sizeof args, "bench -m '%s' " WORKLOAD " --rate 200 --no-compare", model);
    rc = run(args);
    if (rc != 0) T_FAIL("bench exited %d: %s", rc, err);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        if (!strstr(out, rows[i])) T_FAIL("no row '%s' in:\n%s", rows[i], out);
    }
    T_ASSERT(strstr(out, "6 / 0") != NULL);
    T_ASSERT(strstr(out, "Poisson") != NULL);
    T_ASSERT(strstr(out, "no prefix cache") == NULL);
    return 0;
}

/* A server that cannot start: its exit and its last output lines are reported. */
static int test_server_fails(void)
{
    char args[2048];
    snprintf(args, sizeof args, "bench -m '%s/no-such-model.gguf' " WORKLOAD, dir);
    T_EQ(run(args), 1);
    if (!strstr(err, "before it was ready") || !strstr(err, "no-such-model.gguf")) {
        T_FAIL("stderr lacks the server's failure: %s", err);
    }
    T_ASSERT(out[0] == '\0');
    return 0;
}

static int test_bad_url(void)
{
    T_EQ(run("bench --url http://127.0.0.1:1 " WORKLOAD " --json"), 1);
    T_ASSERT(strstr(err, "cannot reach http://127.0.0.1:1") != NULL);
    T_ASSERT(out[0] == '\0');
    T_EQ(run("bench --url 'nope://x' " WORKLOAD), 1);
    T_ASSERT(strstr(err, "cannot reach") != NULL);
    return 0;
}

static int test_bad_flags(void)
{
    T_EQ(run("bench"), 2);
    T_ASSERT(strstr(err, "-m MODEL") != NULL);
    T_EQ(run("bench --url http://127.0.0.1:1 -m x.gguf"), 2);
    T_EQ(run("bench --url http://127.0.0.1:1 --concurrency 2 --rate 3"), 2);
    T_ASSERT(strstr(err, "not both") != NULL);
    T_EQ(run("bench --url http://127.0.0.1:1 --rate -1"), 2);
    T_ASSERT(strstr(err, "--rate") != NULL);
    T_EQ(run("bench --url http://127.0.0.1:1 --groups 0"), 2);
    T_ASSERT(strstr(err, "--groups") != NULL);
    T_EQ(run("bench --url http://127.0.0.1:1 --prompts"), 2);
    T_ASSERT(strstr(err, "needs a value") != NULL);
    T_EQ(run("bench --url http://127.0.0.1:1 -t 2"), 2);
    T_ASSERT(strstr(err, "server flags need -m") != NULL);
    T_EQ(run("bench --url http://127.0.0.1:1 --system-tokens 0 --question-tokens 0"), 2);
    T_EQ(run("bench --url http://127.0.0.1:1 stray"), 2);
    T_EQ(run("bench --url http://127.0.0.1:1 --tenants 2"), 2);
    T_ASSERT(strstr(err, "needs --trace") != NULL);
    T_EQ(run("bench --url http://127.0.0.1:1 --trace x.jsonl --groups 2"), 2);
    T_ASSERT(strstr(err, "synthetic workload") != NULL);
    T_EQ(run("bench --url http://127.0.0.1:1 --trace x.jsonl --speedup 2 --rate 1"), 2);
    T_EQ(run("bench --url http://127.0.0.1:1 --trace no-such-file.jsonl"), 1);
    T_ASSERT(strstr(err, "cannot open") != NULL);
    T_EQ(run("bench --help"), 0);
    T_ASSERT(strstr(out, "--system-tokens") != NULL);
    return 0;
}

/* stories260K from $PGD_MODELS_DIR or ../shared/models, else the synthetic model. */
static int find_model(const char *synthetic)
{
    if (t_model_file(model, sizeof model, "stories260K.gguf")) return 1;
    if (synthetic && t_is_file(synthetic)) {
        snprintf(model, sizeof model, "%s", synthetic);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    int rc = t_cli_args(argc, argv, "SYNTHETIC_MODEL", &bin, &dir);
    if (rc != 0) return rc;
    T_RUN(test_bad_flags);
    T_RUN(test_bad_url);
    if (!find_model(argc > 3 ? argv[3] : NULL)) {
        if (t_failed) T_DONE();
        T_SKIP("no stories260K.gguf and no synthetic model");
    }
    printf("model: %s\n", model);
    T_RUN(test_server_fails);
    T_RUN(test_compare_json);
    T_RUN(test_table);
    T_RUN(test_trace_json);
    T_DONE();
}
