/* SPDX-License-Identifier: MIT */
/*
 * test_replay_sweep.c - `pagoda replay` as the measuring instrument, run as the real
 * binary (argv[1]) with scratch files in a directory (argv[2]); generated traces only.
 *
 * Checks: every built-in policy name (pgd_policy_builtin, looped by kind) runs in the
 * pool and in a tier (policy=) under --check, and a kind this build lacks is refused by
 * name; --sweep gives one row per (policy, capacity) with LRU and Belady always, and the
 * unlimited bound last, Belady >= LRU and nothing above unlimited, 'vs lru' of LRU 1;
 * the CSV has the documented columns and the same figures as the JSON; the table names
 * every policy; --plot renders a non-empty file when gnuplot is installed (skipped
 * otherwise), and without gnuplot ($PGD_GNUPLOT pointing nowhere) keeps the CSV and
 * the .gp script and exits 0; bad --sweep / --policy / --plot / --jobs / speed / tier
 * policy values exit 2 naming them. Timing model: a hand-computed case where a request
 * cannot evict a running one's blocks, so a later request hits them (sequentially it
 * misses), and with very fast requests the timing model equals the sequential one.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "pagoda/policy.h"
#include "proc.h"
#include "t.h"

static const char *bin;   /* the pagoda executable */
static const char *dir;   /* scratch directory */
static char out[1 << 16]; /* stdout of the last run */
static char err[1 << 16]; /* stderr of the last run */

static void path_of(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/%s", dir, name);
}

static int run(const char *args)
{
    return t_run_bin(bin, dir, args, out, sizeof out, err, sizeof err);
}

static json_t *parse_out(void)
{
    json_error_t je;
    json_t *o = json_loads(out, 0, &je);
    if (!o || !json_is_object(o)) {
        fprintf(stderr, "stdout is not a JSON object (%s): %s\n", je.text, out);
        json_decref(o);
        return NULL;
    }
    return o;
}

static long long get_int(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? (long long)json_integer_value(v) : -1;
}

static double get_real(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : -1.0;
}

static const char *get_str(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : "";
}

static int expect_exit(const char *args, int code, const char *needle)
{
    int rc = run(args);
    if (rc != code) T_FAIL("pagoda %s: exit %d, expected %d; stderr: %s", args, rc, code, err);
    if (needle && !strstr(err, needle) && !strstr(out, needle)) {
        T_FAIL("pagoda %s: output lacks '%s'; stderr: %s", args, needle, err);
    }
    return 0;
}

/* The built-in policies of this build, as a comma list (without belady when no_belady). */
static void policy_list(char *buf, size_t len, int no_belady)
{
    buf[0] = '\0';
    for (int k = 0; k < PGD_POLICY_COUNT; k++) {
        if (!pgd_policy_builtin((pgd_policy_kind)k)) continue;
        if (no_belady && k == PGD_POLICY_BELADY) continue;
        if (buf[0]) strncat(buf, ",", len - strlen(buf) - 1);
        strncat(buf, pgd_policy_name((pgd_policy_kind)k), len - strlen(buf) - 1);
    }
}

static int n_builtin(void)
{
    int n = 0;
    for (int k = 0; k < PGD_POLICY_COUNT; k++)
        n += pgd_policy_builtin((pgd_policy_kind)k) != NULL;
    return n;
}

static int test_gen_trace(void)
{
    char args[2048], p[1024];
    path_of(p, sizeof p, "trace.jsonl");
    snprintf(args, sizeof args, "gen-trace --seed 11 --requests 1500 -o '%s'", p);
    T_EQ(run(args), 0);
    return 0;
}

/* Every built-in name runs in the pool and in a tier, with integrity checks. */
static int test_every_policy_runs(void)
{
    char args[4096], p[1024];
    path_of(p, sizeof p, "trace.jsonl");
    for (int k = 0; k < PGD_POLICY_COUNT; k++) {
        const char *name = pgd_policy_name((pgd_policy_kind)k);
        json_t *o, *tiers;
        if (!pgd_policy_builtin((pgd_policy_kind)k)) {
            /* Not in this build (its branch not merged): refused by name, exit 2. */
            printf("  kind %d is not built in\n", k);
            continue;
        }
        snprintf(args, sizeof args,
                 "replay --json --quiet --check --policy %s --capacity-tokens 64Ki "
                 "--tier ram:64Ki:policy=%s --tier disk:256Ki '%s'",
                 name, name, p);
        T_EQ(run(args), 0);
        o = parse_out();
        T_ASSERT(o != NULL);
        T_ASSERT(strcmp(get_str(o, "policy"), name) == 0);
        tiers = json_object_get(o, "tiers");
        T_ASSERT(json_array_size(tiers) == 2);
        T_ASSERT(strcmp(get_str(json_array_get(tiers, 0), "policy"), name) == 0);
        /* The disk tier takes the pool's policy. */
        T_ASSERT(strcmp(get_str(json_array_get(tiers, 1), "policy"), name) == 0);
        T_ASSERT(get_int(o, "hit_blocks") > 0);
        T_ASSERT(get_int(json_array_get(tiers, 0), "demoted_blocks") > 0);
        printf("  %-9s pool %.4f  ram %.4f  disk %.4f\n", name, get_real(o, "token_hit_ratio"),
               get_real(json_array_get(tiers, 0), "token_hit_ratio"),
               get_real(json_array_get(tiers, 1), "token_hit_ratio"));
        json_decref(o);
        /* With the timing model too. */
        snprintf(args, sizeof args,
                 "replay --quiet --check --model-timing --policy %s --capacity-tokens 64Ki '%s'",
                 name, p);
        T_EQ(run(args), 0);
        T_ASSERT(strstr(out, "max running") != NULL);
    }
    for (int k = 0; k < PGD_POLICY_COUNT; k++) {
        if (pgd_policy_builtin((pgd_policy_kind)k)) continue;
        snprintf(args, sizeof args, "replay --policy %s '%s'", pgd_policy_name((pgd_policy_kind)k),
                 p);
        T_EQ(run(args), 2);
    }
    return 0;
}

/* --sweep in JSON: rows, bounds, the ratio to LRU; the CSV agrees. */
static int test_sweep_rows_and_csv(void)
{
    char args[4096], p[1024], csv[1024], pols[256], *line, *save = NULL;
    static char text[1 << 16];
    json_t *o, *runs;
    size_t n_pol = (size_t)n_builtin(), n_caps = 3, i;
    double unl;
    path_of(p, sizeof p, "trace.jsonl");
    path_of(csv, sizeof csv, "sweep.csv");
    policy_list(pols, sizeof pols, 1); /* belady is added anyway */
    snprintf(args, sizeof args,
             "replay --json --quiet --jobs 2 --sweep 1%%,10%%,32Ki --policy %s --csv '%s' '%s'",
             pols, csv, p);
    T_EQ(run(args), 0);
    o = parse_out();
    T_ASSERT(o != NULL);
    runs = json_object_get(o, "runs");
    T_EQ(json_array_size(runs), n_pol * n_caps + 1);
    T_ASSERT(get_int(o, "distinct_blocks") > 0);
    unl = get_real(json_array_get(runs, n_pol * n_caps), "token_hit_ratio");
    T_ASSERT(strcmp(get_str(json_array_get(runs, n_pol * n_caps), "policy"), "unlimited") == 0);
    T_ASSERT(unl > 0 && unl < 1);
    for (size_t c = 0; c < n_caps; c++) {
        double lru = -1, bel = -1;
        long long cap = -1;
        for (size_t j = 0; j < n_pol; j++) {
            json_t *r = json_array_get(runs, c * n_pol + j);
            const char *name = get_str(r, "policy");
            double th = get_real(r, "token_hit_ratio");
            if (cap < 0) cap = get_int(r, "capacity_tokens");
            T_EQ(get_int(r, "capacity_tokens"), cap); /* grouped by capacity */
            T_ASSERT(th >= 0 && th <= unl + 1e-12);
            T_ASSERT(get_real(r, "block_hit_ratio") >= 0);
            if (strcmp(name, "lru") == 0) {
                lru = th;
                T_ASSERT(get_real(r, "vs_lru") > 0.999999 && get_real(r, "vs_lru") < 1.000001);
            }
            if (strcmp(name, "belady") == 0) bel = th;
        }
        T_ASSERT(lru > 0 && bel >= lru);
        if (c == 2) T_EQ(cap, 32 * 1024);
    }
    /* 1% of the distinct blocks, rounded to whole blocks of 512 tokens. */
    T_ASSERT(get_real(json_array_get(runs, 0), "capacity_pct") > 0.9 &&
             get_real(json_array_get(runs, 0), "capacity_pct") < 1.1);

    /* The CSV: the documented header, a row per run, the JSON's figures. */
    t_slurp(csv, text, sizeof text);
    line = strtok_r(text, "\n", &save);
    T_ASSERT(line != NULL);
    T_ASSERT(strcmp(line, "policy,capacity_tokens,capacity_pct,token_hit_ratio,block_hit_ratio,"
                          "evictions,blocks_per_s") == 0);
    for (i = 0; (line = strtok_r(NULL, "\n", &save)) != NULL; i++) {
        char name[32];
        unsigned long long cap, ev;
        double pct, th, bh, bps;
        json_t *r = json_array_get(runs, i);
        T_ASSERT(r != NULL);
        T_EQ(sscanf(line, "%31[^,],%llu,%lf,%lf,%lf,%llu,%lf", name, &cap, &pct, &th, &bh, &ev,
                    &bps),
             7);
        T_ASSERT(strcmp(name, get_str(r, "policy")) == 0);
        T_EQ((long long)cap, get_int(r, "capacity_tokens"));
        T_EQ((long long)ev, get_int(r, "evictions"));
        T_ASSERT(th - get_real(r, "token_hit_ratio") < 1e-6 &&
                 get_real(r, "token_hit_ratio") - th < 1e-6);
        T_ASSERT(bh - get_real(r, "block_hit_ratio") < 1e-6 &&
                 get_real(r, "block_hit_ratio") - bh < 1e-6);
    }
    T_EQ(i, json_array_size(runs));
    json_decref(o);

    /* The table names every policy, with the column heads. */
    snprintf(args, sizeof args, "replay --quiet --sweep 3%% --policy %s --csv '%s' '%s'", pols, csv,
             p);
    T_EQ(run(args), 0);
    T_ASSERT(strstr(out, "vs lru") != NULL && strstr(out, "token hit") != NULL);
    T_ASSERT(strstr(out, "belady") != NULL && strstr(out, "unlimited") != NULL);
    for (int k = 0; k < PGD_POLICY_COUNT; k++) {
        if (pgd_policy_builtin((pgd_policy_kind)k)) {
            T_ASSERT(strstr(out, pgd_policy_name((pgd_policy_kind)k)) != NULL);
        }
    }
    /* A --policy list alone sweeps the one --capacity-tokens. */
    path_of(csv, sizeof csv, "one.csv");
    snprintf(args, sizeof args,
             "replay --quiet --policy lru,belady --capacity-tokens 64Ki --csv '%s' '%s'", csv, p);
    T_EQ(run(args), 0);
    T_ASSERT(strstr(out, "65536") != NULL);
    T_ASSERT(t_is_file(csv));
    return 0;
}

static int have_gnuplot(void)
{
    return system("command -v gnuplot >/dev/null 2>&1") == 0;
}

static int test_plot(void)
{
    char args[4096], p[1024], png[1024], svg[1024], gp[1024], csv[1024];
    size_t n = 0;
    uint8_t *data;
    int rc;
    path_of(p, sizeof p, "trace.jsonl");
    path_of(png, sizeof png, "nognu.png");
    path_of(gp, sizeof gp, "nognu.gp");
    path_of(csv, sizeof csv, "nognu.csv");
    /* Without gnuplot: CSV (named after the plot) and script kept, exit 0, said so. */
    snprintf(args, sizeof args, "replay --quiet --sweep 1%%,10%% --plot '%s' '%s'", png, p);
    setenv("PGD_GNUPLOT", "/nonexistent/gnuplot", 1);
    rc = run(args);
    unsetenv("PGD_GNUPLOT");
    T_EQ(rc, 0);
    T_ASSERT(strstr(err, "not installed") != NULL);
    T_ASSERT(t_is_file(csv) && t_is_file(gp));
    T_ASSERT(!t_is_file(png));
    data = t_read_all(gp, &n);
    T_ASSERT(data != NULL && n > 0);
    T_ASSERT(strstr((char *)data, "set output") != NULL && strstr((char *)data, "lru") != NULL);
    free(data);

    if (!have_gnuplot()) {
        printf("  gnuplot not installed: rendering not checked\n");
        return 0;
    }
    path_of(png, sizeof png, "sweep.png");
    path_of(svg, sizeof svg, "sweep.svg");
    snprintf(args, sizeof args, "replay --quiet --sweep 1%%,3%%,10%% --plot '%s' '%s'", png, p);
    T_EQ(run(args), 0);
    data = t_read_all(png, &n);
    T_ASSERT(data != NULL && n > 100);
    T_ASSERT(memcmp(data, "\x89PNG", 4) == 0);
    free(data);
    snprintf(args, sizeof args, "replay --quiet --sweep 1%%,10%% --plot '%s' '%s'", svg, p);
    T_EQ(run(args), 0);
    data = t_read_all(svg, &n);
    T_ASSERT(data != NULL && n > 100);
    T_ASSERT(strstr((char *)data, "<svg") != NULL);
    free(data);
    return 0;
}

/* Hand-computed: pool of 2 pages of 16 tokens.
 *   A t=0ms  [1,2] output 1000   B t=1ms [3,4]   C t=2ms [1,2]
 * Sequential: B evicts A's blocks, C misses and evicts B's: 0 hits of 6 blocks, 4
 * evictions.
 * Timing model (decode 50 tokens/s): A runs 20 s, so at B's arrival both pages are A's
 * and pinned: B inserts nothing (2 uncached blocks) and at C's arrival A's blocks are
 * still there: C hits 2 blocks, 32 of 96 tokens. Three requests alive at once. */
static const char timing_trace[] =
    "{\"timestamp\": 0, \"input_length\": 32, \"output_length\": 1000, \"hash_ids\": [1, 2]}\n"
    "{\"timestamp\": 1, \"input_length\": 32, \"output_length\": 1, \"hash_ids\": [3, 4]}\n"
    "{\"timestamp\": 2, \"input_length\": 32, \"output_length\": 1, \"hash_ids\": [1, 2]}\n";

static int test_model_timing(void)
{
    char args[4096], p[1024];
    json_t *o;
    path_of(p, sizeof p, "timing.jsonl");
    T_EQ(t_write_all(p, timing_trace, strlen(timing_trace)), 0);

    snprintf(args, sizeof args,
             "replay --json --quiet --check --block-tokens 16 "
             "--capacity-tokens 32 '%s'",
             p);
    T_EQ(run(args), 0);
    o = parse_out();
    T_ASSERT(o != NULL);
    T_EQ(get_int(o, "hit_blocks"), 0);
    T_EQ(get_int(o, "uncached_blocks"), 0);
    T_EQ(get_int(o, "evictions"), 4);
    T_ASSERT(json_object_get(o, "max_running") == NULL); /* sequential output unchanged */
    json_decref(o);

    snprintf(args, sizeof args,
             "replay --json --quiet --check --block-tokens 16 "
             "--capacity-tokens 32 --model-timing --decode-tps 50 '%s'",
             p);
    T_EQ(run(args), 0);
    o = parse_out();
    T_ASSERT(o != NULL);
    T_EQ(get_int(o, "hit_blocks"), 2);
    T_EQ(get_int(o, "hit_tokens"), 32);
    T_EQ(get_int(o, "tokens"), 96);
    T_EQ(get_int(o, "uncached_blocks"), 2);
    T_EQ(get_int(o, "evictions"), 0);
    T_EQ(get_int(o, "max_running"), 3);
    T_ASSERT(get_real(o, "token_hit_ratio") > 0.3333 && get_real(o, "token_hit_ratio") < 0.3334);
    json_decref(o);

    /* Requests far faster than their arrivals: each is done before the next arrives,
     * which is the sequential model again. */
    snprintf(args, sizeof args,
             "replay --json --quiet --check --block-tokens 16 --capacity-tokens 32 "
             "--model-timing --prefill-tps 1e9 --decode-tps 1e9 '%s'",
             p);
    T_EQ(run(args), 0);
    o = parse_out();
    T_ASSERT(o != NULL);
    T_EQ(get_int(o, "hit_blocks"), 0);
    T_EQ(get_int(o, "evictions"), 4);
    T_EQ(get_int(o, "max_running"), 1);
    json_decref(o);
    return 0;
}

static int test_bad_values(void)
{
    char args[4096], p[1024];
    path_of(p, sizeof p, "trace.jsonl");
    snprintf(args, sizeof args, "replay --sweep 1%%,0%% '%s'", p);
    T_EQ(expect_exit(args, 2, "--sweep: '0%' is not a capacity"), 0);
    snprintf(args, sizeof args, "replay --sweep 101%% '%s'", p);
    T_EQ(expect_exit(args, 2, "--sweep: '101%' is not a capacity"), 0);
    snprintf(args, sizeof args, "replay --sweep 1%%,abc '%s'", p);
    T_EQ(expect_exit(args, 2, "--sweep: 'abc' is not a capacity"), 0);
    snprintf(args, sizeof args, "replay --sweep 1%%,,3%% '%s'", p);
    T_EQ(expect_exit(args, 2, "--sweep: '' is not a capacity"), 0);
    snprintf(args, sizeof args, "replay --sweep 0 '%s'", p);
    T_EQ(expect_exit(args, 2, "--sweep: '0' is not a capacity"), 0);
    snprintf(args, sizeof args, "replay --sweep 100 '%s'", p);
    T_EQ(expect_exit(args, 2, "less than one block"), 0);
    snprintf(args, sizeof args, "replay --policy lru,nosuch '%s'", p);
    T_EQ(expect_exit(args, 2, "--policy: unknown policy 'nosuch'"), 0);
    snprintf(args, sizeof args, "replay --policy lru, '%s'", p);
    T_EQ(expect_exit(args, 2, "--policy: unknown policy ''"), 0);
    snprintf(args, sizeof args, "replay --tier ram:1M:policy=nosuch '%s'", p);
    T_EQ(expect_exit(args, 2, "unknown policy 'nosuch'"), 0);
    snprintf(args, sizeof args, "replay --tier ram:1M:colour=lru '%s'", p);
    T_EQ(expect_exit(args, 2, "is not KIND:TOKENS[:policy=NAME]"), 0);
    snprintf(args, sizeof args, "replay --sweep 1%% --plot out.pdf '%s'", p);
    T_EQ(expect_exit(args, 2, "--plot: 'out.pdf' does not end in .png or .svg"), 0);
    snprintf(args, sizeof args, "replay --sweep 1%% --jobs 0 '%s'", p);
    T_EQ(expect_exit(args, 2, "--jobs"), 0);
    snprintf(args, sizeof args, "replay --model-timing --prefill-tps 0 '%s'", p);
    T_EQ(expect_exit(args, 2, "--prefill-tps: '0' is not a speed"), 0);
    snprintf(args, sizeof args, "replay --model-timing --decode-tps fast '%s'", p);
    T_EQ(expect_exit(args, 2, "--decode-tps: 'fast' is not a speed"), 0);
    T_EQ(expect_exit("replay --help", 0, "--sweep CAP"), 0);
    T_EQ(expect_exit("replay --help", 0, "--model-timing"), 0);
    return 0;
}

int main(int argc, char **argv)
{
    int rc = t_cli_args(argc, argv, NULL, &bin, &dir);
    if (rc != 0) return rc;
    T_RUN(test_gen_trace);
    T_RUN(test_every_policy_runs);
    T_RUN(test_sweep_rows_and_csv);
    T_RUN(test_plot);
    T_RUN(test_model_timing);
    T_RUN(test_bad_values);
    T_DONE();
}
