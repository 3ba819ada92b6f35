/* SPDX-License-Identifier: MIT */
/*
 * replay.c - `pagoda replay`: loads a Mooncake-format trace (trace.c), replays it through
 * the cache manager (sim.c) and prints the hit figures as a table or one JSON object.
 * Option handling and output only; the model is described in sim.h and in the usage text.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "cli.h"
#include "sim.h"
#include "trace.h"

#define DEFAULT_CAPACITY_TOKENS 1048576
#define DEFAULT_BLOCK_TOKENS 512
#define MAX_BAD_LINE_REPORTS 100

static void usage(FILE *f, const char *cmd)
{
    fprintf(f,
            "usage: %s [options] TRACE.jsonl\n"
            "\n"
            "Replays a request trace through the libpagoda cache manager (real prefix index\n"
            "and eviction policy, metadata-only pool) and reports prefix-cache hits.\n"
            "TRACE is a Mooncake FAST'25 JSONL file, or - for stdin; one request per line:\n"
            "  {\"timestamp\": ms, \"input_length\": n, \"output_length\": n, "
            "\"hash_ids\": [id, ...]}\n"
            "Hash id i names block i of the prompt (block-tokens tokens); equal ids at\n"
            "position i mean equal prefixes through block i. Blank lines are skipped.\n"
            "\n"
            "Model: requests are served one at a time, in file order; no concurrency is\n"
            "modelled. Each request matches its blocks (its hits are the leading run of\n"
            "cached blocks), inserts the rest block by block, and ends, leaving its blocks\n"
            "cached until the policy evicts them. A request larger than the whole pool has\n"
            "the blocks that do not fit counted as uncached. A request's tokens are its\n"
            "input_length, or blocks * block-tokens when input_length does not reach its\n"
            "last block (a warning says how many); hit tokens: min(tokens, hits * block).\n"
            "\n"
            "options:\n"
            "  --policy NAME          eviction policy: lru (default) or belady (offline\n"
            "                         optimal, knows the trace's future)\n"
            "  --capacity-tokens N    pool size in tokens, rounded down to whole blocks\n"
            "                         (default %d); 'unlimited': a page per distinct block\n"
            "  --block-tokens N       tokens per block, a power of two (default %d)\n"
            "  --json                 print one JSON object instead of a table\n"
            "  --strict               stop at the first bad line (exit 1); by default bad\n"
            "                         lines are reported with their line number and skipped\n"
            "  --quiet                no progress line (shown only when stderr is a terminal)\n"
            "  --check                check the cache's integrity after every request (slow)\n"
            "  -h, --help             show this help\n"
            "\n"
            "Exit status: 0 done; 1 unreadable trace, bad line under --strict, or replay\n"
            "failure; 2 bad command line.\n",
            cmd, DEFAULT_CAPACITY_TOKENS, DEFAULT_BLOCK_TOKENS);
}

static double ratio(uint64_t a, uint64_t b)
{
    return b ? (double)a / (double)b : 0.0;
}

/* A JSON integer; counts never reach 2^63 except saturated token sums, clamped here. */
static json_t *jint(uint64_t v)
{
    return json_integer(v > INT64_MAX ? INT64_MAX : (json_int_t)v);
}

static int print_json(const char *trace, const sim_params *sp, const sim_result *r,
                      const trace_load_stats *ls, double load_s)
{
    json_t *o = json_object();
    int rc;
    if (!o) return -1;
    json_object_set_new(o, "trace", json_string(trace));
    json_object_set_new(o, "policy", json_string(pgd_policy_name(sp->policy)));
    json_object_set_new(o, "capacity_tokens", jint(r->capacity_tokens));
    json_object_set_new(o, "capacity_pages", jint(r->capacity_pages));
    json_object_set_new(o, "capacity_unlimited", json_boolean(sp->capacity_tokens == 0));
    json_object_set_new(o, "block_tokens", jint(sp->block_tokens));
    json_object_set_new(o, "requests", jint(r->requests));
    json_object_set_new(o, "blocks", jint(r->blocks));
    json_object_set_new(o, "hit_blocks", jint(r->hit_blocks));
    json_object_set_new(o, "block_hit_ratio", json_real(ratio(r->hit_blocks, r->blocks)));
    json_object_set_new(o, "tokens", jint(r->tokens));
    json_object_set_new(o, "hit_tokens", jint(r->hit_tokens));
    json_object_set_new(o, "token_hit_ratio", json_real(ratio(r->hit_tokens, r->tokens)));
    json_object_set_new(o, "evictions", jint(r->evictions));
    json_object_set_new(o, "bad_lines", jint(ls->n_bad));
    json_object_set_new(o, "uncached_blocks", jint(r->uncached_blocks));
    json_object_set_new(o, "length_mismatch", jint(r->length_mismatch));
    json_object_set_new(o, "load_s", json_real(load_s));
    json_object_set_new(o, "elapsed_s", json_real(r->elapsed_s));
    json_object_set_new(o, "blocks_per_s",
                        json_real(r->elapsed_s > 0 ? (double)r->blocks / r->elapsed_s : 0.0));
    rc = json_dumpf(o, stdout, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
    json_decref(o);
    if (rc != 0) return -1;
    return fputc('\n', stdout) == EOF ? -1 : 0;
}

static void print_table(const sim_params *sp, const sim_result *r, const trace_load_stats *ls)
{
    const char *unl = sp->capacity_tokens == 0 ? "unlimited: " : "";
    printf("%-18s %s\n", "policy", pgd_policy_name(sp->policy));
    printf("%-18s %llu (%s%llu pages)\n", "capacity tokens", (unsigned long long)r->capacity_tokens,
           unl, (unsigned long long)r->capacity_pages);
    printf("%-18s %u\n", "block tokens", sp->block_tokens);
    printf("%-18s %llu\n", "requests", (unsigned long long)r->requests);
    printf("%-18s %llu\n", "blocks", (unsigned long long)r->blocks);
    printf("%-18s %llu\n", "hit blocks", (unsigned long long)r->hit_blocks);
    printf("%-18s %.4f\n", "block hit ratio", ratio(r->hit_blocks, r->blocks));
    printf("%-18s %llu\n", "tokens", (unsigned long long)r->tokens);
    printf("%-18s %llu\n", "hit tokens", (unsigned long long)r->hit_tokens);
    printf("%-18s %.4f\n", "token hit ratio", ratio(r->hit_tokens, r->tokens));
    printf("%-18s %llu\n", "evictions", (unsigned long long)r->evictions);
    printf("%-18s %llu\n", "bad lines", (unsigned long long)ls->n_bad);
    printf("%-18s %llu\n", "uncached blocks", (unsigned long long)r->uncached_blocks);
    printf("%-18s %.3f\n", "elapsed s", r->elapsed_s);
    printf("%-18s %.0f\n", "blocks/s", r->elapsed_s > 0 ? (double)r->blocks / r->elapsed_s : 0.0);
}

enum { OPT_POLICY = 256, OPT_CAPACITY, OPT_BLOCK, OPT_JSON, OPT_STRICT, OPT_QUIET, OPT_CHECK };

int cmd_replay(int argc, char **argv)
{
    static const struct option opts[] = {
        {"policy", required_argument, NULL, OPT_POLICY},
        {"capacity-tokens", required_argument, NULL, OPT_CAPACITY},
        {"block-tokens", required_argument, NULL, OPT_BLOCK},
        {"json", no_argument, NULL, OPT_JSON},
        {"strict", no_argument, NULL, OPT_STRICT},
        {"quiet", no_argument, NULL, OPT_QUIET},
        {"check", no_argument, NULL, OPT_CHECK},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *cmd = argv[0], *path, *name;
    sim_params sp;
    sim_result res;
    trace_set ts = {0};
    trace_load_stats ls;
    trace_load_opts lo;
    uint64_t capacity = DEFAULT_CAPACITY_TOKENS, block = DEFAULT_BLOCK_TOKENS;
    int json = 0, strict = 0, quiet = 0, check = 0, opt, rc = CLI_EXIT_FAIL;
    char err[256];
    FILE *f;
    double t0, load_s;

    memset(&sp, 0, sizeof sp);
    sp.policy = PGD_POLICY_LRU;
    optind = 0; /* glibc: full re-initialisation, in case another command parsed first */
    for (;;) {
        opt = getopt_long(argc, argv, "h", opts, NULL);
        if (opt == -1) break;
        switch (opt) {
        case OPT_POLICY:
            if (pgd_policy_from_name(optarg, &sp.policy) != PGD_OK) {
                fprintf(stderr, "%s: --policy: unknown policy '%s' (lru or belady)\n", cmd, optarg);
                return cli_usage_error(cmd);
            }
            break;
        case OPT_CAPACITY:
            if (strcmp(optarg, "unlimited") == 0) {
                capacity = 0;
            } else if (cli_parse_u64(cmd, "--capacity-tokens", optarg, 1, UINT64_MAX, &capacity) !=
                       0) {
                return cli_usage_error(cmd);
            }
            break;
        case OPT_BLOCK:
            if (cli_parse_u64(cmd, "--block-tokens", optarg, 1, SIM_MAX_BLOCK_TOKENS, &block) !=
                0) {
                return cli_usage_error(cmd);
            }
            if ((block & (block - 1)) != 0) {
                fprintf(stderr, "%s: --block-tokens: %s is not a power of two\n", cmd, optarg);
                return cli_usage_error(cmd);
            }
            break;
        case OPT_JSON:
            json = 1;
            break;
        case OPT_STRICT:
            strict = 1;
            break;
        case OPT_QUIET:
            quiet = 1;
            break;
        case OPT_CHECK:
            check = 1;
            break;
        case 'h':
            usage(stdout, cmd);
            return CLI_EXIT_OK;
        default: /* getopt printed what is wrong */
            return cli_usage_error(cmd);
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "%s: %s\n", cmd,
                optind >= argc ? "missing TRACE argument" : "expected one TRACE argument");
        return cli_usage_error(cmd);
    }
    if (capacity != 0 && capacity < block) {
        fprintf(stderr, "%s: --capacity-tokens %llu is less than one block (%llu tokens)\n", cmd,
                (unsigned long long)capacity, (unsigned long long)block);
        return cli_usage_error(cmd);
    }
    sp.capacity_tokens = capacity;
    sp.block_tokens = (uint32_t)block;
    sp.progress = !quiet && isatty(STDERR_FILENO);
    sp.check = check;

    path = argv[optind];
    if (strcmp(path, "-") == 0) {
        f = stdin;
        name = "<stdin>";
    } else {
        f = fopen(path, "r");
        name = path;
        if (!f) {
            fprintf(stderr, "%s: cannot open '%s': %s\n", cmd, path, strerror(errno));
            return CLI_EXIT_FAIL;
        }
    }
    lo.name = name;
    lo.strict = strict;
    lo.progress = sp.progress;
    lo.max_reports = MAX_BAD_LINE_REPORTS;
    t0 = cli_now_s();
    if (trace_load(f, &lo, &ts, &ls) != 0) goto done;
    load_s = cli_now_s() - t0;

    if (sim_run(&sp, &ts, &res, err, sizeof err) != 0) {
        fprintf(stderr, "%s: %s: %s\n", cmd, name, err);
        goto done;
    }
    if (res.length_mismatch) {
        fprintf(stderr,
                "%s: warning: %llu requests have an input_length that does not reach their "
                "last block; counted as blocks * %u tokens (is --block-tokens right?)\n",
                cmd, (unsigned long long)res.length_mismatch, sp.block_tokens);
    }
    if (json) {
        if (print_json(name, &sp, &res, &ls, load_s) != 0) {
            fprintf(stderr, "%s: cannot write the JSON output\n", cmd);
            goto done;
        }
    } else {
        print_table(&sp, &res, &ls);
    }
    if (fflush(stdout) != 0) {
        fprintf(stderr, "%s: cannot write the output: %s\n", cmd, strerror(errno));
        goto done;
    }
    rc = CLI_EXIT_OK;
done:
    if (f != stdin) fclose(f);
    trace_set_deinit(&ts);
    return rc;
}
