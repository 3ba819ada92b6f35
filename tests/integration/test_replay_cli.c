/* SPDX-License-Identifier: MIT */
/*
 * test_replay_cli.c - end-to-end tests of `pagoda gen-trace` and `pagoda replay`, run as
 * the real binary (argv[1]) with scratch files in a directory (argv[2]).
 *
 * Checks: on a generated trace Belady hits at least as many blocks as LRU at every
 * capacity from one page to more than the working set, and no capacity beats the known
 * unlimited answer; an unlimited capacity finds exactly the hits the generator counted
 * (blocks - distinct ids), for both policies; bad lines are named with their line number
 * and skipped, or stop the replay under --strict; bad command lines exit 2, unreadable
 * input exits 1. Tiers (--tier): the JSON and the table report each tier, pool hits +
 * tier hits + misses = blocks and tokens, each tier's local ratio is of the blocks that
 * reached it, bytes follow --bytes-per-token, the pool's figures are those of a replay
 * without tiers, a tier of 0 tokens changes nothing, token counts take decimal and binary
 * suffixes, bad specs are named, --model sizes a block from the model's geometry
 * (stories260K, when the models directory has it). JSON output is parsed with jansson.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "pagoda/pagoda.h"
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

/* Runs `pagoda ARGS` through sh; fills out and err; returns the exit status (-1 on error). */
static int run(const char *args)
{
    return t_run_bin(bin, dir, args, out, sizeof out, err, sizeof err);
}

static int write_file(const char *name, const char *text)
{
    char path[1024];
    path_of(path, sizeof path, name);
    return t_write_all(path, text, strlen(text));
}

static long long get_int(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? (long long)json_integer_value(v) : -1;
}

/* Parses the last run's stdout as one JSON object; NULL (after a message) if it is not. */
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

/* ---- the known answer ---- */

static long long exp_requests, exp_blocks, exp_distinct, exp_tokens, exp_hits, exp_hit_tokens;

static int test_gen_trace(void)
{
    char args[4096], p1[1024], p2[1024], ex[1024], a[1 << 15], b[1 << 15];
    json_error_t je;
    json_t *o;

    path_of(p1, sizeof p1, "trace.jsonl");
    path_of(ex, sizeof ex, "expect.json");
    snprintf(args, sizeof args, "gen-trace --seed 7 --requests 3000 -o '%s' --expect '%s' --stats",
             p1, ex);
    T_EQ(run(args), 0);
    T_ASSERT(strstr(err, "distinct ids") != NULL);
    o = json_load_file(ex, 0, &je);
    T_ASSERT(o != NULL);
    exp_requests = get_int(o, "requests");
    exp_blocks = get_int(o, "blocks");
    exp_distinct = get_int(o, "distinct_ids");
    exp_tokens = get_int(o, "tokens");
    exp_hits = get_int(o, "unlimited_hit_blocks");
    exp_hit_tokens = get_int(o, "unlimited_hit_tokens");
    json_decref(o);
    T_EQ(exp_requests, 3000);
    T_ASSERT(exp_blocks > 10000);
    T_EQ(exp_hits, exp_blocks - exp_distinct);
    T_ASSERT(exp_hits > 0 && exp_hits < exp_blocks);

    /* Deterministic from the seed: the same seed writes the same bytes, to stdout too. */
    path_of(p2, sizeof p2, "trace2.jsonl");
    snprintf(args, sizeof args, "gen-trace --seed 7 --requests 3000 > '%s'", p2);
    T_EQ(run(args), 0);
    t_slurp(p1, a, sizeof a);
    t_slurp(p2, b, sizeof b);
    T_ASSERT(strlen(a) > 1000 && strcmp(a, b) == 0);
    return 0;
}

/* Replays trace.jsonl; returns the JSON result or NULL. */
static json_t *replay(const char *policy, const char *capacity, const char *extra)
{
    char args[4096], p[1024];
    int rc;
    path_of(p, sizeof p, "trace.jsonl");
    snprintf(args, sizeof args, "replay --json --quiet --policy %s --capacity-tokens %s %s '%s'",
             policy, capacity, extra, p);
    rc = run(args);
    if (rc != 0) {
        fprintf(stderr, "replay %s %s exited %d: %s\n", policy, capacity, rc, err);
        return NULL;
    }
    return parse_out();
}

static int test_belady_at_least_lru(void)
{
    static const long long pages[] = {1, 4, 16, 48, 128, 256, 512, 1 << 16};
    for (size_t i = 0; i < sizeof pages / sizeof pages[0]; i++) {
        char cap[32];
        json_t *lru, *bel;
        long long hl, hb;
        snprintf(cap, sizeof cap, "%lld", pages[i] * 512);
        lru = replay("lru", cap, "");
        T_ASSERT(lru != NULL);
        bel = replay("belady", cap, "");
        T_ASSERT(bel != NULL);
        hl = get_int(lru, "hit_blocks");
        hb = get_int(bel, "hit_blocks");
        printf("  capacity %7lld pages: lru %6lld  belady %6lld  (unlimited %lld)\n", pages[i], hl,
               hb, exp_hits);
        T_EQ(get_int(lru, "requests"), exp_requests);
        T_EQ(get_int(bel, "blocks"), exp_blocks);
        T_EQ(get_int(lru, "capacity_tokens"), pages[i] * 512);
        T_ASSERT(strcmp(json_string_value(json_object_get(bel, "policy")), "belady") == 0);
        T_ASSERT(hl >= 0 && hb >= hl);
        T_ASSERT(hb <= exp_hits);
        T_ASSERT(json_number_value(json_object_get(bel, "block_hit_ratio")) >= 0.0);
        if (pages[i] >= exp_distinct) {
            T_EQ(hl, exp_hits);
            T_EQ(get_int(lru, "evictions"), 0);
        }
        if (pages[i] == 1) T_ASSERT(get_int(lru, "uncached_blocks") > 0);
        json_decref(lru);
        json_decref(bel);
    }
    return 0;
}

static int test_unlimited_is_exact(void)
{
    static const char *policies[] = {"lru", "belady"};
    for (int i = 0; i < 2; i++) {
        json_t *o = replay(policies[i], "unlimited", "--check");
        T_ASSERT(o != NULL);
        T_EQ(get_int(o, "hit_blocks"), exp_hits);
        T_EQ(get_int(o, "hit_tokens"), exp_hit_tokens);
        T_EQ(get_int(o, "tokens"), exp_tokens);
        T_EQ(get_int(o, "capacity_pages"), exp_distinct);
        T_EQ(get_int(o, "evictions"), 0);
        T_EQ(get_int(o, "uncached_blocks"), 0);
        T_EQ(get_int(o, "length_mismatch"), 0);
        T_ASSERT(json_is_true(json_object_get(o, "capacity_unlimited")));
        json_decref(o);
    }
    return 0;
}

/* Another workload through stdin: small blocks, huge ids, many one-offs. */
static int test_stdin_small_blocks_huge_ids(void)
{
    char args[4096], ex[1024];
    json_error_t je;
    json_t *e, *o;
    path_of(ex, sizeof ex, "expect2.json");
    snprintf(args, sizeof args,
             "gen-trace --seed 3 --requests 1500 --block-tokens 16 --groups 3 "
             "--system-blocks 20 --sessions 5 --turns 9 --one-off 50 "
             "--id-base 9000000000000000000 --expect '%s' | '%s' replay --json "
             "--block-tokens 16 --capacity-tokens unlimited -",
             ex, bin);
    T_EQ(run(args), 0);
    e = json_load_file(ex, 0, &je);
    T_ASSERT(e != NULL);
    o = parse_out();
    T_ASSERT(o != NULL);
    T_EQ(get_int(o, "requests"), 1500);
    T_EQ(get_int(o, "blocks"), get_int(e, "blocks"));
    T_EQ(get_int(o, "hit_blocks"), get_int(e, "unlimited_hit_blocks"));
    T_EQ(get_int(o, "hit_tokens"), get_int(e, "unlimited_hit_tokens"));
    T_ASSERT(strcmp(json_string_value(json_object_get(o, "trace")), "<stdin>") == 0);
    json_decref(o);
    json_decref(e);
    return 0;
}

static int test_text_table(void)
{
    char args[4096], p[1024];
    path_of(p, sizeof p, "trace.jsonl");
    snprintf(args, sizeof args, "replay --policy belady '%s'", p);
    T_EQ(run(args), 0);
    T_ASSERT(strstr(out, "policy") && strstr(out, "belady"));
    T_ASSERT(strstr(out, "block hit ratio") && strstr(out, "token hit ratio"));
    T_ASSERT(strstr(out, "evictions") && strstr(out, "blocks/s"));
    T_EQ(err[0], '\0'); /* no progress line when stderr is not a terminal */
    return 0;
}

/* ---- tiers ---- */

static json_t *tier_at(json_t *o, size_t i)
{
    return json_array_get(json_object_get(o, "tiers"), i);
}

/* Pool hits + tier hits + misses = blocks, and the same for tokens; bytes per block. */
static int tier_totals(json_t *o, long long bytes_per_block)
{
    long long b = get_int(o, "hit_blocks") + get_int(o, "miss_blocks");
    long long tk = get_int(o, "hit_tokens") + get_int(o, "miss_tokens");
    json_t *arr = json_object_get(o, "tiers");
    T_ASSERT(json_is_array(arr));
    for (size_t i = 0; i < json_array_size(arr); i++) {
        json_t *t = json_array_get(arr, i);
        b += get_int(t, "hit_blocks");
        tk += get_int(t, "hit_tokens");
        T_EQ(get_int(t, "promoted_blocks"), get_int(t, "hit_blocks"));
        T_ASSERT(get_int(t, "resident_blocks") <= get_int(t, "capacity_blocks"));
        if (bytes_per_block) {
            T_EQ(get_int(t, "promoted_bytes"), get_int(t, "promoted_blocks") * bytes_per_block);
            T_EQ(get_int(t, "demoted_bytes"), get_int(t, "demoted_blocks") * bytes_per_block);
        } else {
            T_ASSERT(json_is_null(json_object_get(t, "promoted_bytes")));
        }
    }
    T_EQ(b, get_int(o, "blocks"));
    T_EQ(tk, get_int(o, "tokens"));
    return 0;
}

static int test_tiers_json(void)
{
    json_t *base, *o, *t0, *t1;
    base = replay("lru", "64Ki", "");
    T_ASSERT(base != NULL);
    T_EQ(get_int(base, "capacity_tokens"), 65536);
    T_ASSERT(json_object_get(base, "tiers") == NULL); /* no tiers: the output is as it was */
    o = replay("lru", "64Ki", "--check --tier ram:100K --tier disk:1Mi --bytes-per-token 2K");
    T_ASSERT(o != NULL);
    T_EQ(get_int(o, "hit_blocks"), get_int(base, "hit_blocks"));
    T_EQ(get_int(o, "evictions"), get_int(base, "evictions"));
    T_EQ(get_int(o, "bytes_per_page"), 512 * 2048);
    T_ASSERT(json_number_value(json_object_get(o, "bytes_per_token")) == 2048.0);
    T_EQ(json_array_size(json_object_get(o, "tiers")), 2);
    t0 = tier_at(o, 0);
    t1 = tier_at(o, 1);
    T_ASSERT(strcmp(json_string_value(json_object_get(t0, "name")), "ram") == 0);
    T_ASSERT(strcmp(json_string_value(json_object_get(t1, "name")), "disk") == 0);
    T_EQ(get_int(t0, "capacity_blocks"), 100000 / 512); /* K = 1000, rounded to blocks */
    T_EQ(get_int(t0, "capacity_tokens"), 100000 / 512 * 512);
    T_EQ(get_int(t1, "capacity_blocks"), 2048); /* Mi = 2^20 */
    T_ASSERT(get_int(t0, "hit_blocks") > 0 && get_int(t1, "hit_blocks") > 0);
    T_ASSERT(get_int(t0, "demoted_blocks") > 0 && get_int(t1, "demoted_blocks") > 0);
    T_EQ(tier_totals(o, 512 * 2048), 0);
    /* A tier is reached by the blocks the pool and the faster tiers missed. */
    T_EQ(get_int(t0, "reached_blocks"), get_int(o, "blocks") - get_int(o, "hit_blocks"));
    T_EQ(get_int(t1, "reached_blocks"), get_int(t0, "reached_blocks") - get_int(t0, "hit_blocks"));
    T_ASSERT(fabs(json_number_value(json_object_get(t1, "local_block_hit_ratio")) -
                  (double)get_int(t1, "hit_blocks") / (double)get_int(t1, "reached_blocks")) <
             1e-9);
    T_ASSERT(get_int(o, "miss_blocks") < get_int(base, "blocks") - get_int(base, "hit_blocks"));
    T_ASSERT(json_number_value(json_object_get(o, "cached_block_ratio")) >
             json_number_value(json_object_get(base, "block_hit_ratio")));
    json_decref(o);

    /* Without --bytes-per-token the bytes are null; a first tier of 0 changes nothing. */
    o = replay("lru", "64Ki", "--tier ram:0 --tier disk:1Mi");
    T_ASSERT(o != NULL);
    T_EQ(tier_totals(o, 0), 0);
    T_ASSERT(json_is_null(json_object_get(o, "bytes_per_token")));
    T_ASSERT(json_is_null(json_object_get(o, "bytes_per_page")));
    T_EQ(get_int(tier_at(o, 0), "capacity_blocks"), 0);
    T_EQ(get_int(tier_at(o, 0), "hit_blocks"), 0);
    T_EQ(get_int(tier_at(o, 0), "demoted_blocks"), 0);
    {
        json_t *alone = replay("lru", "64Ki", "--tier disk:1Mi");
        T_ASSERT(alone != NULL);
        T_EQ(get_int(tier_at(o, 1), "hit_blocks"), get_int(tier_at(alone, 0), "hit_blocks"));
        T_EQ(get_int(tier_at(o, 1), "demoted_blocks"),
             get_int(tier_at(alone, 0), "demoted_blocks"));
        T_EQ(get_int(o, "miss_blocks"), get_int(alone, "miss_blocks"));
        json_decref(alone);
    }
    json_decref(o);
    o = replay("belady", "64Ki", "--tier ram:0");
    T_ASSERT(o != NULL);
    T_EQ(get_int(o, "miss_blocks"), get_int(o, "blocks") - get_int(o, "hit_blocks"));
    T_EQ(tier_totals(o, 0), 0);
    json_decref(o);
    json_decref(base);
    return 0;
}

/* Bytes from a model's geometry: stories260K has 5 layers, 4 KV heads, head_dim 8, so a
 * 512-token block is 2 * 5 * 4 * 8 * 512 elements: 327680 bytes in f16, twice in f32. */
static int test_tiers_model_bytes(void)
{
    char model[1024], extra[2048];
    json_t *o;
    if (!t_model_file(model, sizeof model, "stories260K.gguf")) {
        printf("  (no %s: model bytes not tested)\n", model);
        return 0;
    }
    snprintf(extra, sizeof extra, "--tier ram:1M --model '%s'", model);
    o = replay("lru", "64Ki", extra);
    T_ASSERT(o != NULL);
    T_EQ(get_int(o, "bytes_per_page"), 327680);
    T_EQ(tier_totals(o, 327680), 0);
    json_decref(o);
    snprintf(extra, sizeof extra, "--tier ram:1M --model '%s' --kv-type f32", model);
    o = replay("lru", "64Ki", extra);
    T_ASSERT(o != NULL);
    T_EQ(get_int(o, "bytes_per_page"), 655360);
    T_ASSERT(json_number_value(json_object_get(o, "bytes_per_token")) == 1280.0);
    json_decref(o);
    return 0;
}

static int test_tiers_table(void)
{
    char args[4096], p[1024];
    path_of(p, sizeof p, "trace.jsonl");
    snprintf(args, sizeof args,
             "replay --capacity-tokens 32K --tier ram:64K --tier disk:640K --bytes-per-token 1K "
             "'%s'",
             p);
    T_EQ(run(args), 0);
    T_ASSERT(strstr(out, "hit blocks") && strstr(out, "bytes up") && strstr(out, "bytes down"));
    T_ASSERT(strstr(out, "\npool ") && strstr(out, "\nram ") && strstr(out, "\ndisk "));
    T_ASSERT(strstr(out, "\nmiss ") && strstr(out, "\ncached ") && strstr(out, "GiB"));
    T_ASSERT(strstr(out, "capacity tokens    31744 (62 pages)") != NULL); /* 32K = 32000 */
    /* Without tiers, no tier table. */
    snprintf(args, sizeof args, "replay --capacity-tokens 32K '%s'", p);
    T_EQ(run(args), 0);
    T_ASSERT(strstr(out, "bytes up") == NULL && strstr(out, "\nmiss ") == NULL);
    return 0;
}

/* ---- bad input ---- */

/* One good line (1), bad lines of every kind, blank lines (11, 16), another good line (13)
 * and a truncated last line (20). */
static const char bad_trace[] =
    "{\"timestamp\": 1, \"input_length\": 1000, \"output_length\": 5, \"hash_ids\": [1, 2]}\n"
    "this is not json\n"
    "[1, 2, 3]\n"
    "{\"timestamp\": 2, \"input_length\": 10, \"output_length\": 5}\n"
    "{\"timestamp\": 2, \"output_length\": 5, \"hash_ids\": [1]}\n"
    "{\"timestamp\": 2, \"input_length\": -5, \"output_length\": 5, \"hash_ids\": [1]}\n"
    "{\"timestamp\": 2, \"input_length\": 5, \"output_length\": 5, \"hash_ids\": \"1\"}\n"
    "{\"timestamp\": 2, \"input_length\": 5, \"output_length\": 5, \"hash_ids\": [1, 2.5]}\n"
    "{\"timestamp\": 2, \"input_length\": 5, \"output_length\": 5, \"hash_ids\": [1, -3]}\n"
    "{\"timestamp\": 1.5, \"input_length\": 5, \"output_length\": 5, \"hash_ids\": [1]}\n"
    "\n"
    "{\"timestamp\": 2, \"input_length\": 5, \"output_length\": 5, \"hash_ids\": [1]} x\n"
    "{\"timestamp\": 3, \"input_length\": 1500, \"output_length\": 5, \"hash_ids\": [1, 2, 3]}\n"
    "{\"timestamp\": 2, \"timestamp\": 3, \"input_length\": 5, \"output_length\": 5, "
    "\"hash_ids\": [1]}\n"
    "{\"timestamp\": 2, \"input_length\": 5, \"output_length\": 5, \"hash_ids\": [[1]]}\n"
    "   \t\n"
    "{\"timestamp\": 2, \"input_length\": 5, \"output_length\": 5, \"hash_ids\": [1, {}]}\n"
    "{\"timestamp\": 2, \"input_length\": 5, \"output_length\": 5, \"hash_ids\": "
    "[1, 99999999999999999999]}\n"
    "{\"timestamp\": 2, \"input_length\": 5, \"output_length\": null, \"hash_ids\": [1]}\n"
    "{\"timestamp\": 9, \"input_length\": 10";

static int test_bad_lines_counted(void)
{
    static const char *expect[] = {
        "bad.jsonl:2: invalid JSON",
        "bad.jsonl:3: not a JSON object",
        "bad.jsonl:4: missing field \"hash_ids\"",
        "bad.jsonl:5: missing field \"input_length\"",
        "bad.jsonl:6: input_length is negative",
        "bad.jsonl:7: hash_ids is not an array",
        "bad.jsonl:8: hash_ids[1] is not an integer",
        "bad.jsonl:9: hash_ids[1] is negative",
        "bad.jsonl:10: timestamp is not an integer",
        "bad.jsonl:12: invalid JSON",
        "bad.jsonl:14: invalid JSON",
        "bad.jsonl:15: hash_ids[0] is not an integer",
        "bad.jsonl:17: hash_ids[1] is not an integer",
        "bad.jsonl:18: invalid JSON",
        "bad.jsonl:19: output_length is not an integer",
        "bad.jsonl:20: invalid JSON",
    };
    json_t *o;
    T_EQ(write_file("bad.jsonl", bad_trace), 0);
    {
        char args[4096], p[1024];
        path_of(p, sizeof p, "bad.jsonl");
        snprintf(args, sizeof args, "replay --json --capacity-tokens 8192 '%s'", p);
        T_EQ(run(args), 0);
    }
    o = parse_out();
    T_ASSERT(o != NULL);
    T_EQ(get_int(o, "bad_lines"), 16);
    T_EQ(get_int(o, "requests"), 2);
    T_EQ(get_int(o, "blocks"), 5);
    T_EQ(get_int(o, "hit_blocks"), 2);
    T_EQ(get_int(o, "tokens"), 2500);
    T_EQ(get_int(o, "hit_tokens"), 1024);
    json_decref(o);
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++) {
        if (!strstr(err, expect[i])) T_FAIL("stderr lacks '%s':\n%s", expect[i], err);
    }
    T_ASSERT(strstr(err, "truncated") != NULL);
    T_ASSERT(strstr(err, "bad.jsonl:1:") == NULL && strstr(err, "bad.jsonl:11:") == NULL);
    T_ASSERT(strstr(err, "bad.jsonl:13:") == NULL && strstr(err, "bad.jsonl:16:") == NULL);
    return 0;
}

static int test_strict_stops(void)
{
    char args[4096], p[1024];
    path_of(p, sizeof p, "bad.jsonl");
    snprintf(args, sizeof args, "replay --json --strict '%s'", p);
    T_EQ(run(args), 1);
    T_ASSERT(strstr(err, "bad.jsonl:2: invalid JSON") != NULL);
    T_ASSERT(strstr(err, "bad.jsonl:3:") == NULL);
    T_EQ(out[0], '\0');
    return 0;
}

static int test_last_line(void)
{
    char args[4096], p[1024];
    json_t *o;
    /* A complete last line without a newline is fine. */
    T_EQ(write_file("nonl.jsonl", "{\"timestamp\": 1, \"input_length\": 600, "
                                  "\"output_length\": 1, \"hash_ids\": [4, 5]}"),
         0);
    path_of(p, sizeof p, "nonl.jsonl");
    snprintf(args, sizeof args, "replay --json --strict '%s'", p);
    T_EQ(run(args), 0);
    o = parse_out();
    T_ASSERT(o != NULL);
    T_EQ(get_int(o, "bad_lines"), 0);
    T_EQ(get_int(o, "requests"), 1);
    json_decref(o);
    /* A truncated one is a bad line; under --strict it fails. */
    T_EQ(write_file("trunc.jsonl", "{\"timestamp\": 1, \"input_length\": 600, "
                                   "\"output_length\": 1, \"hash_ids\": [4, 5]}\n"
                                   "{\"timestamp\": 2, \"input_length\": 600, \"hash_i"),
         0);
    path_of(p, sizeof p, "trunc.jsonl");
    snprintf(args, sizeof args, "replay --json '%s'", p);
    T_EQ(run(args), 0);
    o = parse_out();
    T_ASSERT(o != NULL);
    T_EQ(get_int(o, "bad_lines"), 1);
    T_EQ(get_int(o, "requests"), 1);
    json_decref(o);
    T_ASSERT(strstr(err, "trunc.jsonl:2:") && strstr(err, "truncated"));
    snprintf(args, sizeof args, "replay --strict '%s'", p);
    T_EQ(run(args), 1);
    /* An empty trace replays to zeros. */
    T_EQ(write_file("empty.jsonl", ""), 0);
    path_of(p, sizeof p, "empty.jsonl");
    snprintf(args, sizeof args, "replay --json --policy belady '%s'", p);
    T_EQ(run(args), 0);
    o = parse_out();
    T_ASSERT(o != NULL);
    T_EQ(get_int(o, "requests"), 0);
    T_ASSERT(json_number_value(json_object_get(o, "block_hit_ratio")) == 0.0);
    json_decref(o);
    return 0;
}

/* ---- bad command lines ---- */

static int expect_exit(const char *args, int code, const char *needle)
{
    int rc = run(args);
    if (rc != code) T_FAIL("pagoda %s: exit %d, expected %d; stderr: %s", args, rc, code, err);
    if (needle && !strstr(err, needle) && !strstr(out, needle)) {
        T_FAIL("pagoda %s: output lacks '%s'; stderr: %s", args, needle, err);
    }
    return 0;
}

static int test_usage_errors(void)
{
    char args[4096], p[1024];
    path_of(p, sizeof p, "trace.jsonl");
    T_EQ(expect_exit("replay /nonexistent/trace.jsonl", 1, "cannot open"), 0);
    snprintf(args, sizeof args, "replay --block-tokens 500 '%s'", p);
    T_EQ(expect_exit(args, 2, "power of two"), 0);
    snprintf(args, sizeof args, "replay --block-tokens 0 '%s'", p);
    T_EQ(expect_exit(args, 2, "out of range"), 0);
    snprintf(args, sizeof args, "replay --policy fifo '%s'", p);
    T_EQ(expect_exit(args, 2, "unknown policy 'fifo'"), 0);
    snprintf(args, sizeof args, "replay --capacity-tokens 12abc '%s'", p);
    T_EQ(expect_exit(args, 2, "not a non-negative integer"), 0);
    snprintf(args, sizeof args, "replay --capacity-tokens -4 '%s'", p);
    T_EQ(expect_exit(args, 2, "not a non-negative integer"), 0);
    snprintf(args, sizeof args, "replay --capacity-tokens 100 '%s'", p);
    T_EQ(expect_exit(args, 2, "less than one block"), 0);
    snprintf(args, sizeof args, "replay --frobnicate '%s'", p);
    T_EQ(expect_exit(args, 2, "--help"), 0);
    snprintf(args, sizeof args, "replay '%s' '%s'", p, p);
    T_EQ(expect_exit(args, 2, "one TRACE"), 0);
    T_EQ(expect_exit("replay", 2, "missing TRACE"), 0);
    snprintf(args, sizeof args, "replay --capacity-tokens 3X '%s'", p);
    T_EQ(expect_exit(args, 2, "not a non-negative integer"), 0);
    snprintf(args, sizeof args, "replay --capacity-tokens 99999999999999999999 '%s'", p);
    T_EQ(expect_exit(args, 2, "out of range"), 0);
    snprintf(args, sizeof args, "replay --capacity-tokens 20000000000000T '%s'", p);
    T_EQ(expect_exit(args, 2, "out of range"), 0);
    snprintf(args, sizeof args, "replay --tier ram '%s'", p);
    T_EQ(expect_exit(args, 2, "--tier: 'ram' is not KIND:TOKENS"), 0);
    snprintf(args, sizeof args, "replay --tier disk:/var/cache/pagoda:30M '%s'", p);
    T_EQ(expect_exit(args, 2, "is not KIND:TOKENS"), 0);
    snprintf(args, sizeof args, "replay --tier ram:8G:q8_0 '%s'", p);
    T_EQ(expect_exit(args, 2, "is not KIND:TOKENS"), 0);
    snprintf(args, sizeof args, "replay --tier ssd:3M '%s'", p);
    T_EQ(expect_exit(args, 2, "unknown tier kind 'ssd' (ram or disk)"), 0);
    snprintf(args, sizeof args, "replay --tier :3M '%s'", p);
    T_EQ(expect_exit(args, 2, "unknown tier kind ''"), 0);
    snprintf(args, sizeof args, "replay --tier ram:3X '%s'", p);
    T_EQ(expect_exit(args, 2, "--tier: '3X' is not a non-negative integer"), 0);
    snprintf(args, sizeof args, "replay --tier ram: '%s'", p);
    T_EQ(expect_exit(args, 2, "--tier: '' is not a non-negative integer"), 0);
    snprintf(args, sizeof args, "replay --tier ram:-1 '%s'", p);
    T_EQ(expect_exit(args, 2, "not a non-negative integer"), 0);
    snprintf(args, sizeof args, "replay --tier ram:3Mib '%s'", p);
    T_EQ(expect_exit(args, 2, "not a non-negative integer"), 0);
    snprintf(args, sizeof args,
             "replay --tier ram:1 --tier ram:1 --tier ram:1 --tier ram:1 --tier ram:1 "
             "--tier ram:1 --tier ram:1 --tier ram:1 --tier disk:1 '%s'",
             p);
    T_EQ(expect_exit(args, 2, "at most 8 tiers"), 0);
    snprintf(args, sizeof args, "replay --tier ram:1M --bytes-per-token 0 '%s'", p);
    T_EQ(expect_exit(args, 2, "out of range"), 0);
    snprintf(args, sizeof args, "replay --tier ram:1M --bytes-per-token 1.5K '%s'", p);
    T_EQ(expect_exit(args, 2, "not a size in bytes"), 0);
    snprintf(args, sizeof args, "replay --kv-type f16 '%s'", p);
    T_EQ(expect_exit(args, 2, "--kv-type needs --model"), 0);
    snprintf(args, sizeof args, "replay --model x.gguf --bytes-per-token 2 '%s'", p);
    T_EQ(expect_exit(args, 2, "give one"), 0);
    snprintf(args, sizeof args, "replay --model x.gguf --kv-type f8 '%s'", p);
    T_EQ(expect_exit(args, 2, "--kv-type: 'f8' is not one of"), 0);
    snprintf(args, sizeof args, "replay --tier ram:1M --model /nonexistent/m.gguf '%s'", p);
    T_EQ(expect_exit(args, 1, "--model: cannot load '/nonexistent/m.gguf'"), 0);
    T_EQ(expect_exit("replay --help", 0, "--tier KIND:TOKENS"), 0);
    T_EQ(expect_exit("replay --help", 0, "3M = 3000000"), 0);
    T_EQ(expect_exit("replay --help", 0, "--capacity-tokens"), 0);
    T_EQ(expect_exit("help replay", 0, "--block-tokens"), 0);
    T_EQ(expect_exit("help gen-trace", 0, "--expect"), 0);
    T_EQ(expect_exit("help nosuch", 2, "unknown command"), 0);
    T_EQ(expect_exit("frobnicate", 2, "unknown command 'frobnicate'"), 0);
    T_EQ(expect_exit("", 2, "usage: pagoda"), 0);
    T_EQ(expect_exit("--help", 0, "gen-trace"), 0);
    T_EQ(expect_exit("help", 0, "replay"), 0);
    T_EQ(expect_exit("version", 0, PGD_VERSION_STRING), 0);
    T_EQ(expect_exit("gen-trace --one-off 101", 2, "out of range"), 0);
    T_EQ(expect_exit("gen-trace --block-tokens 48", 2, "power of two"), 0);
    T_EQ(expect_exit("gen-trace --sessions 0", 2, "sessions"), 0);
    T_EQ(expect_exit("gen-trace stray", 2, "unexpected argument"), 0);
    T_EQ(expect_exit("gen-trace --requests 1 -o /nonexistent/x.jsonl", 1, "cannot create"), 0);
    return 0;
}

int main(int argc, char **argv)
{
    int rc = t_cli_args(argc, argv, NULL, &bin, &dir);
    if (rc != 0) return rc;
    T_RUN(test_gen_trace);
    T_RUN(test_belady_at_least_lru);
    T_RUN(test_unlimited_is_exact);
    T_RUN(test_stdin_small_blocks_huge_ids);
    T_RUN(test_text_table);
    T_RUN(test_tiers_json);
    T_RUN(test_tiers_model_bytes);
    T_RUN(test_tiers_table);
    T_RUN(test_bad_lines_counted);
    T_RUN(test_strict_stops);
    T_RUN(test_last_line);
    T_RUN(test_usage_errors);
    T_DONE();
}
