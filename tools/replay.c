/* SPDX-License-Identifier: MIT */
/*
 * replay.c - `pagoda replay`: loads a Mooncake-format trace (trace.c), replays it through
 * the cache manager (sim.c), with tiers below the pool when --tier asks, and prints the
 * hit figures as a table or one JSON object. Option handling and output only; the model
 * is described in sim.h and in the usage text. Token counts take decimal suffixes (K =
 * 10^3) or binary ones (Ki = 2^10); byte sizes (--bytes-per-token) binary ones, as the
 * other commands' sizes. The bytes a block weighs when it moves come from
 * --bytes-per-token or from a model's geometry (--model, --kv-type: the engine's GGUF
 * loader and pgd_kv_bytes_per_token).
 *
 * Sweep mode (--sweep, a --policy list, --csv or --plot): every (policy, capacity) pair
 * is one sim_run, on --jobs threads (runs share the trace read-only), plus an unlimited
 * run (the upper bound, which also counts the distinct blocks that percentages refer
 * to); LRU (the baseline of the ratios) and Belady (the offline bound) always run. The
 * rows go to a table (or JSON), a CSV, and, with --plot, a gnuplot script rendered by
 * running gnuplot as a child process ($PGD_GNUPLOT, else gnuplot on the PATH).
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "cli.h"
#include "sim.h"
#include "trace.h"

#define DEFAULT_CAPACITY_TOKENS 1048576
#define DEFAULT_BLOCK_TOKENS 512
#define MAX_BAD_LINE_REPORTS 100
#define MAX_SWEEP 64 /* capacities of one --sweep */
#define MAX_JOBS 64

extern char **environ;

static void usage(FILE *f, const char *cmd)
{
    fprintf(
        f,
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
        "modelled (unless --model-timing). Each request matches its blocks (its hits\n"
        "are the leading run of cached blocks), inserts the rest block by block, and\n"
        "ends, leaving its blocks\n"
        "cached until the policy evicts them. A request larger than the whole pool has\n"
        "the blocks that do not fit counted as uncached. A request's tokens are its\n"
        "input_length, or blocks * block-tokens when input_length does not reach its\n"
        "last block (a warning says how many); hit tokens: min(tokens, hits * block).\n"
        "\n"
        "Tiers (--tier, repeatable, fastest first below the pool) model the storage tiers\n"
        "as the cache moves pages, write-back: each holds the same block hashes, ordered\n"
        "by a policy (policy=NAME; default: the pool's --policy, e.g. lru).\n"
        "A block the pool evicts that no tier holds is demoted into the first tier; what a\n"
        "tier evicts for room goes into the next (the last one drops it). Like the pool, a\n"
        "tier evicts only blocks of which it holds no child. After the pool's hits, the\n"
        "next blocks that some tier holds, in a row, are hits of the fastest tier holding\n"
        "each; they are promoted into the pool and their tier copy stays. Every block is a\n"
        "pool hit, a tier hit or a miss. Hit shares are of all blocks (tokens); a tier's\n"
        "local ratio is of the blocks that reached it (missed the pool and the faster\n"
        "tiers). Bytes moved: blocks * the bytes of a block\n"
        "(block-tokens * --bytes-per-token, or from --model and --kv-type; K/V payload\n"
        "only, record headers not counted).\n"
        "\n"
        "options:\n"
        "  --policy NAME[,NAME]   eviction policy: lru (default), s3fifo, arc, cost,\n"
        "                         priority, or belady (offline optimal, knows the\n"
        "                         trace's future); a comma list runs a sweep\n"
        "  --capacity-tokens N    pool size in tokens, rounded down to whole blocks\n"
        "                         (default %d); 'unlimited': a page per distinct block\n"
        "  --block-tokens N       tokens per block, a power of two (default %d)\n"
        "  --tier KIND:TOKENS[:policy=NAME]\n"
        "                         a tier below the pool (repeatable, at most %d, in order):\n"
        "                         KIND is ram or disk (a label), TOKENS its capacity,\n"
        "                         rounded down to whole blocks; 0: the tier changes\n"
        "                         nothing; policy: the tier's eviction policy (default:\n"
        "                         the pool's). e.g. --tier ram:3M:policy=s3fifo\n"
        "  --bytes-per-token N    KV bytes per token of the model, for the bytes moved per\n"
        "                         tier (2 * layers * kv_heads * head_dim * element bytes;\n"
        "                         K, M, G suffixes: powers of 1024); default: not shown\n"
        "  --model FILE.gguf      or take the bytes from this model's geometry (layers,\n"
        "                         KV heads, head_dim) and --kv-type\n"
        "  --kv-type TYPE         the pool's KV type with --model: f32, f16 (default),\n"
        "                         bf16, q8_0, q4_0, kivi2 (scales and padding counted)\n"
        "  --json                 print one JSON object instead of a table\n"
        "  --strict               stop at the first bad line (exit 1); by default bad\n"
        "                         lines are reported with their line number and skipped\n"
        "  --quiet                no progress line (shown only when stderr is a terminal)\n"
        "  --check                check the cache's (and tiers') integrity after every\n"
        "                         request (slow)\n"
        "\n"
        "Sweep (several runs in one invocation; on with --sweep, a --policy list, --csv\n"
        "or --plot):\n"
        "  --sweep CAP[,CAP]      pool capacities: token counts, or N%% of the trace's\n"
        "                         distinct blocks (e.g. 1%%,3%%,10%%,30%%; default: the\n"
        "                         --capacity-tokens). Every (policy, capacity) runs, and\n"
        "                         lru (the baseline of 'vs lru'), belady (the offline\n"
        "                         bound) and an unlimited cache (the upper bound) always\n"
        "  --csv FILE             the rows as CSV (default: the --plot name with .csv, or\n"
        "                         replay-sweep.csv): policy, capacity_tokens,\n"
        "                         capacity_pct, token_hit_ratio, block_hit_ratio,\n"
        "                         evictions, blocks_per_s\n"
        "  --plot FILE.png|.svg   hit ratio against capacity, one line per policy, belady\n"
        "                         and unlimited as bounds: writes FILE.gp and runs gnuplot\n"
        "                         on it ($PGD_GNUPLOT, else gnuplot from the PATH); without\n"
        "                         gnuplot the CSV and the script are kept (exit 0)\n"
        "  --jobs N               runs at a time, on N threads (default 1, at most %d)\n"
        "\n"
        "Timing model:\n"
        "  --model-timing         requests overlap: each arrives at its timestamp and runs\n"
        "                         for (tokens not cached) / prefill-tps + output_length /\n"
        "                         decode-tps seconds; while it runs its blocks are held\n"
        "                         (not evictable). Default: sequential, one at a time\n"
        "  --prefill-tps N        prefill tokens/s of one request (default %.0f)\n"
        "  --decode-tps N         decode tokens/s of one request (default %.0f)\n"
        "  -h, --help             show this help\n"
        "\n"
        "Token counts (--capacity-tokens, --tier, --sweep) are digits with an optional\n"
        "decimal suffix K, M, G, T (10^3, 10^6, 10^9, 10^12: 3M = 3000000) or binary suffix Ki,\n"
        "Mi, Gi, Ti (2^10 .. 2^40: 2Mi = 2097152).\n"
        "\n"
        "Exit status: 0 done; 1 unreadable trace, bad line under --strict, or replay\n"
        "failure; 2 bad command line.\n",
        cmd, DEFAULT_CAPACITY_TOKENS, DEFAULT_BLOCK_TOKENS, SIM_MAX_TIERS, MAX_JOBS,
        SIM_DEFAULT_PREFILL_TPS, SIM_DEFAULT_DECODE_TPS);
}

/* ---- token counts and tier specs ---- */

/*
 * Parses a token count: digits, then nothing, K / M / G / T (powers of 1000) or Ki / Mi /
 * Gi / Ti (powers of 1024), the letters in either case. Returns 0, -1 (not such a count)
 * or -2 (does not fit 64 bits).
 */
static int parse_tokens(const char *s, uint64_t *out)
{
    static const char units[] = "KMGT";
    uint64_t v = 0, mul = 1;
    const char *p = s, *u;
    if (!isdigit((unsigned char)*p)) return -1;
    for (; isdigit((unsigned char)*p); p++) {
        uint64_t d = (uint64_t)(*p - '0');
        if (v > (UINT64_MAX - d) / 10) return -2;
        v = v * 10 + d;
    }
    if (*p != '\0') {
        u = strchr(units, toupper((unsigned char)*p));
        if (!u) return -1;
        p++;
        if (*p == 'i' || *p == 'I') {
            mul = UINT64_C(1) << (10 * (u - units + 1));
            p++;
        } else {
            for (const char *q = units; q <= u; q++)
                mul *= 1000;
        }
        if (*p != '\0') return -1;
    }
    if (v > UINT64_MAX / mul) return -2;
    *out = v * mul;
    return 0;
}

/* The reason parse_tokens refused s, for "cmd: opt: ..." messages. */
static void tokens_error(const char *cmd, const char *opt, const char *s, int rc)
{
    if (rc == -2) {
        fprintf(stderr, "%s: %s: %s is out of range (more than 2^64 tokens)\n", cmd, opt, s);
    } else {
        fprintf(stderr,
                "%s: %s: '%s' is not a non-negative integer (a token count: digits with an "
                "optional K, M, G, T suffix for 10^3..10^12, or Ki, Mi, Gi, Ti for 2^10..2^40)\n",
                cmd, opt, s);
    }
}

/* ---- policy names ---- */

/* Parses a built-in policy name that this build has (pgd_policy_builtin non-NULL).
 * Returns 0, or -1 after printing why (opt names the option). */
static int parse_policy(const char *cmd, const char *opt, const char *name, size_t len,
                        pgd_policy_kind *out)
{
    char buf[32];
    pgd_policy_kind k;
    if (len < sizeof buf) {
        memcpy(buf, name, len);
        buf[len] = '\0';
        if (pgd_policy_from_name(buf, &k) == PGD_OK && pgd_policy_builtin(k)) {
            *out = k;
            return 0;
        }
    }
    fprintf(stderr, "%s: %s: unknown policy '%.*s' (one of", cmd, opt, (int)len, name);
    for (int i = 0; i < PGD_POLICY_COUNT; i++) {
        if (pgd_policy_builtin((pgd_policy_kind)i)) {
            fprintf(stderr, " %s", pgd_policy_name((pgd_policy_kind)i));
        }
    }
    fprintf(stderr, ")\n");
    return -1;
}

/* Parses --policy NAME[,NAME...] into kinds[] (duplicates dropped). Returns the count,
 * or -1 after printing why. */
static int parse_policy_list(const char *cmd, const char *arg, pgd_policy_kind *kinds)
{
    int n = 0;
    const char *p = arg;
    for (;;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        pgd_policy_kind k;
        int dup = 0;
        if (parse_policy(cmd, "--policy", p, len, &k) != 0) return -1;
        for (int i = 0; i < n; i++)
            dup |= kinds[i] == k;
        if (!dup) kinds[n++] = k;
        if (!e) break;
        p = e + 1;
    }
    return n;
}

/* Parses a --tier spec KIND:TOKENS[:policy=NAME] into *t. Returns 0, or -1 after
 * printing why. */
static int parse_tier(const char *cmd, const char *spec, sim_tier *t)
{
    const char *colon = strchr(spec, ':');
    const char *pol = colon ? strchr(colon + 1, ':') : NULL;
    size_t kind_len = colon ? (size_t)(colon - spec) : 0;
    char tokens[64];
    size_t tok_len;
    int rc;
    if (!colon || (pol && (strncmp(pol + 1, "policy=", 7) != 0 || strchr(pol + 1, ':')))) {
        fprintf(stderr,
                "%s: --tier: '%s' is not KIND:TOKENS[:policy=NAME] (e.g. ram:3M, disk:30M or "
                "ram:3M:policy=s3fifo; replay models capacity only: no path, codec or "
                "compression)\n",
                cmd, spec);
        return -1;
    }
    if (!((kind_len == 3 && strncmp(spec, "ram", 3) == 0) ||
          (kind_len == 4 && strncmp(spec, "disk", 4) == 0))) {
        fprintf(stderr, "%s: --tier: '%s': unknown tier kind '%.*s' (ram or disk)\n", cmd, spec,
                (int)kind_len, spec);
        return -1;
    }
    memset(t, 0, sizeof *t);
    memcpy(t->name, spec, kind_len);
    tok_len = pol ? (size_t)(pol - colon - 1) : strlen(colon + 1);
    if (tok_len >= sizeof tokens) tok_len = sizeof tokens - 1;
    memcpy(tokens, colon + 1, tok_len);
    tokens[tok_len] = '\0';
    rc = parse_tokens(tokens, &t->capacity_tokens);
    if (rc != 0) {
        tokens_error(cmd, "--tier", tokens, rc);
        return -1;
    }
    if (pol) {
        if (parse_policy(cmd, "--tier policy", pol + 8, strlen(pol + 8), &t->policy) != 0) {
            return -1;
        }
        t->has_policy = 1;
    }
    return 0;
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

/* What a block weighs when it moves between tiers (--bytes-per-token or --model). */
typedef struct kv_size {
    uint64_t page_bytes; /* bytes of one block's K/V; 0: unknown, bytes are not shown */
    double token_bytes;  /* page_bytes / block_tokens */
    char source[192];    /* where the figure comes from, for the table */
} kv_size;

/* Bytes of n blocks, saturating. */
static uint64_t blocks_bytes(uint64_t n, const kv_size *kv)
{
    if (kv->page_bytes && n > UINT64_MAX / kv->page_bytes) return UINT64_MAX;
    return n * kv->page_bytes;
}

/* A byte count in JSON: null when the size of a block is unknown. */
static json_t *jbytes(uint64_t n, const kv_size *kv)
{
    return kv->page_bytes ? jint(blocks_bytes(n, kv)) : json_null();
}

/* The tier part of the JSON object (only with --tier). */
static void json_tiers(json_t *o, const sim_params *sp, const sim_result *r, const kv_size *kv)
{
    json_t *arr = json_array();
    uint64_t cached_blocks = r->hit_blocks, cached_tokens = r->hit_tokens;
    for (uint32_t i = 0; i < r->n_tiers; i++) {
        const sim_tier_result *t = &r->tiers[i];
        json_t *e = json_object();
        json_object_set_new(e, "name", json_string(sp->tiers[i].name));
        json_object_set_new(e, "policy",
                            json_string(pgd_policy_name(
                                sp->tiers[i].has_policy ? sp->tiers[i].policy : sp->policy)));
        json_object_set_new(e, "capacity_tokens", jint(t->capacity_tokens));
        json_object_set_new(e, "capacity_blocks", jint(t->capacity_blocks));
        json_object_set_new(e, "hit_blocks", jint(t->hit_blocks));
        json_object_set_new(e, "block_hit_ratio", json_real(ratio(t->hit_blocks, r->blocks)));
        json_object_set_new(e, "hit_tokens", jint(t->hit_tokens));
        json_object_set_new(e, "token_hit_ratio", json_real(ratio(t->hit_tokens, r->tokens)));
        json_object_set_new(e, "reached_blocks", jint(r->blocks - cached_blocks));
        json_object_set_new(e, "local_block_hit_ratio",
                            json_real(ratio(t->hit_blocks, r->blocks - cached_blocks)));
        json_object_set_new(e, "promoted_blocks", jint(t->hit_blocks));
        json_object_set_new(e, "promoted_bytes", jbytes(t->hit_blocks, kv));
        json_object_set_new(e, "demoted_blocks", jint(t->demoted_blocks));
        json_object_set_new(e, "demoted_bytes", jbytes(t->demoted_blocks, kv));
        json_object_set_new(e, "evicted_blocks", jint(t->evicted_blocks));
        json_object_set_new(e, "resident_blocks", jint(t->resident_blocks));
        json_array_append_new(arr, e);
        cached_blocks += t->hit_blocks;
        cached_tokens += t->hit_tokens;
    }
    json_object_set_new(o, "bytes_per_page", kv->page_bytes ? jint(kv->page_bytes) : json_null());
    json_object_set_new(o, "bytes_per_token",
                        kv->page_bytes ? json_real(kv->token_bytes) : json_null());
    json_object_set_new(o, "tiers", arr);
    json_object_set_new(o, "miss_blocks", jint(r->miss_blocks));
    json_object_set_new(o, "miss_tokens", jint(r->miss_tokens));
    json_object_set_new(o, "cached_block_ratio", json_real(ratio(cached_blocks, r->blocks)));
    json_object_set_new(o, "cached_token_ratio", json_real(ratio(cached_tokens, r->tokens)));
}

static int print_json(const char *trace, const sim_params *sp, const sim_result *r,
                      const trace_load_stats *ls, double load_s, const kv_size *kv)
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
    if (sp->n_tiers) json_tiers(o, sp, r, kv);
    if (sp->model_timing) {
        json_object_set_new(o, "prefill_tps", json_real(sp->prefill_tps));
        json_object_set_new(o, "decode_tps", json_real(sp->decode_tps));
        json_object_set_new(o, "max_running", jint(r->max_running));
    }
    rc = json_dumpf(o, stdout, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
    json_decref(o);
    if (rc != 0) return -1;
    return fputc('\n', stdout) == EOF ? -1 : 0;
}

/* A byte count for the table: "-" without --bytes-per-token, else B / KiB / ... / PiB. */
static const char *fmt_bytes(char *buf, size_t len, uint64_t n, const kv_size *kv)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v;
    int u = 0;
    if (!kv->page_bytes) return "-";
    v = (double)blocks_bytes(n, kv);
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%.0f B", v);
    else
        snprintf(buf, len, "%.2f %s", v, units[u]);
    return buf;
}

/* The per-tier table (only with --tier): where each block was found, what moved. */
static void print_tiers(const sim_params *sp, const sim_result *r, const kv_size *kv)
{
    char up[32], down[32];
    uint64_t cb = r->hit_blocks, ct = r->hit_tokens;
    printf("\n%-6s %12s %10s %7s %7s %12s %7s %10s %12s %10s %12s %10s %10s\n", "tier", "capacity",
           "hit blocks", "share", "local", "hit tokens", "share", "promoted", "bytes up", "demoted",
           "bytes down", "evicted", "held");
    printf("%-6s %12llu %10llu %7.4f %7.4f %12llu %7.4f %10s %12s %10s %12s %10llu %10s\n", "pool",
           (unsigned long long)r->capacity_tokens, (unsigned long long)r->hit_blocks,
           ratio(r->hit_blocks, r->blocks), ratio(r->hit_blocks, r->blocks),
           (unsigned long long)r->hit_tokens, ratio(r->hit_tokens, r->tokens), "-", "-", "-", "-",
           (unsigned long long)r->evictions, "-");
    for (uint32_t i = 0; i < r->n_tiers; i++) {
        const sim_tier_result *t = &r->tiers[i];
        printf("%-6s %12llu %10llu %7.4f %7.4f %12llu %7.4f %10llu %12s %10llu %12s %10llu "
               "%10llu\n",
               sp->tiers[i].name, (unsigned long long)t->capacity_tokens,
               (unsigned long long)t->hit_blocks, ratio(t->hit_blocks, r->blocks),
               ratio(t->hit_blocks, r->blocks - cb), (unsigned long long)t->hit_tokens,
               ratio(t->hit_tokens, r->tokens), (unsigned long long)t->hit_blocks,
               fmt_bytes(up, sizeof up, t->hit_blocks, kv), (unsigned long long)t->demoted_blocks,
               fmt_bytes(down, sizeof down, t->demoted_blocks, kv),
               (unsigned long long)t->evicted_blocks, (unsigned long long)t->resident_blocks);
        cb += t->hit_blocks;
        ct += t->hit_tokens;
    }
    printf("%-6s %12s %10llu %7.4f %7s %12llu %7.4f\n", "miss", "-",
           (unsigned long long)r->miss_blocks, ratio(r->miss_blocks, r->blocks), "-",
           (unsigned long long)r->miss_tokens, ratio(r->miss_tokens, r->tokens));
    printf("%-6s %12s %10llu %7.4f %7s %12llu %7.4f\n", "cached", "-", (unsigned long long)cb,
           ratio(cb, r->blocks), "-", (unsigned long long)ct, ratio(ct, r->tokens));
    if (kv->page_bytes) {
        printf("(bytes: %llu per block of %u tokens, %.6g per token: %s)\n",
               (unsigned long long)kv->page_bytes, sp->block_tokens, kv->token_bytes, kv->source);
    }
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
    if (sp->model_timing) {
        printf("%-18s prefill %.6g, decode %.6g tokens/s per request\n", "model timing",
               sp->prefill_tps, sp->decode_tps);
        printf("%-18s %llu\n", "max running", (unsigned long long)r->max_running);
    }
    printf("%-18s %.3f\n", "elapsed s", r->elapsed_s);
    printf("%-18s %.0f\n", "blocks/s", r->elapsed_s > 0 ? (double)r->blocks / r->elapsed_s : 0.0);
}

/*
 * Sets *kv from a model's geometry (layers, KV heads, head_dim) and a KV type: the bytes
 * a block of block_tokens takes in a pool of that type (scales and padding included).
 * Returns 0, or CLI_EXIT_FAIL (unloadable model) / CLI_EXIT_USAGE (a type that does not
 * fit the geometry) after printing why.
 */
static int kv_from_model(const char *cmd, const char *path, pgd_kv_type type, uint32_t block,
                         kv_size *kv)
{
    pe_model *m = NULL;
    const pe_hparams *hp;
    char err[256];
    double tb;
    if (pe_model_load(path, NULL, NULL, &m, err, sizeof err) != 0) {
        fprintf(stderr, "%s: --model: cannot load '%s': %s\n", cmd, path, err);
        return CLI_EXIT_FAIL;
    }
    hp = pe_model_hparams(m);
    tb = pgd_kv_bytes_per_token(type, block, hp->n_layer, hp->n_head_kv, hp->head_dim);
    if (tb <= 0) {
        fprintf(stderr,
                "%s: --kv-type: %s does not fit this model's geometry (blocks of %u tokens, "
                "head_dim %u)\n",
                cmd, pgd_kv_type_name(type), block, hp->head_dim);
        pe_model_destroy(m);
        return CLI_EXIT_USAGE;
    }
    kv->page_bytes = (uint64_t)(tb * block + 0.5);
    kv->token_bytes = (double)kv->page_bytes / block;
    snprintf(kv->source, sizeof kv->source,
             "model %s: %u layers * %u KV heads * head_dim %u, KV %s", pe_model_name(m),
             hp->n_layer, hp->n_head_kv, hp->head_dim, pgd_kv_type_name(type));
    pe_model_destroy(m);
    return 0;
}

/* ---- sweep ---- */

/* One capacity of --sweep: a token count, or a share of the distinct blocks. */
typedef struct sweep_cap {
    uint64_t tokens; /* when pct == 0 */
    double pct;      /* (0, 100]: of the trace's distinct blocks; 0: tokens */
} sweep_cap;

/* Parses --sweep CAP[,CAP...]. Returns the count, or -1 after printing why. */
static int parse_sweep(const char *cmd, const char *arg, sweep_cap *caps)
{
    int n = 0;
    const char *p = arg;
    for (;;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char buf[64], *end;
        int rc;
        if (n == MAX_SWEEP) {
            fprintf(stderr, "%s: --sweep: at most %d capacities\n", cmd, MAX_SWEEP);
            return -1;
        }
        if (len == 0 || len >= sizeof buf) goto bad;
        memcpy(buf, p, len);
        buf[len] = '\0';
        memset(&caps[n], 0, sizeof caps[n]);
        if (buf[len - 1] == '%') {
            buf[len - 1] = '\0';
            if (!isdigit((unsigned char)buf[0])) goto bad;
            errno = 0;
            caps[n].pct = strtod(buf, &end);
            if (errno || *end != '\0' || !(caps[n].pct > 0) || caps[n].pct > 100) goto bad;
        } else {
            rc = parse_tokens(buf, &caps[n].tokens);
            if (rc != 0 || caps[n].tokens == 0) goto bad;
        }
        n++;
        if (!e) break;
        p = e + 1;
        continue;
    bad:
        fprintf(stderr,
                "%s: --sweep: '%.*s' is not a capacity (a token count above 0 such as 3M or "
                "2Mi, or a share of the distinct blocks in (0%%, 100%%] such as 3%%)\n",
                cmd, (int)len, p);
        return -1;
    }
    return n;
}

/* One (policy, capacity) run. */
typedef struct sweep_run {
    sim_params sp;
    double pct; /* capacity as a share of the distinct blocks (100: unlimited) */
    sim_result res;
    int failed;
    char err[256];
} sweep_run;

typedef struct sweep_pool {
    const trace_set *t;
    sweep_run *runs;
    size_t n, next;
    pthread_mutex_t mu;
} sweep_pool;

static void *sweep_worker(void *ud)
{
    sweep_pool *sp = ud;
    for (;;) {
        size_t i;
        pthread_mutex_lock(&sp->mu);
        i = sp->next++;
        pthread_mutex_unlock(&sp->mu);
        if (i >= sp->n) break;
        sweep_run *r = &sp->runs[i];
        r->failed = sim_run(&r->sp, sp->t, &r->res, r->err, sizeof r->err) != 0;
    }
    return NULL;
}

/* Runs every run, on up to jobs threads (the caller's thread is one of them). */
static void sweep_exec(const trace_set *t, sweep_run *runs, size_t n, unsigned jobs)
{
    sweep_pool pool = {t, runs, n, 0, PTHREAD_MUTEX_INITIALIZER};
    pthread_t th[MAX_JOBS];
    unsigned started = 0;
    for (unsigned i = 1; i < jobs && i < n; i++) {
        if (pthread_create(&th[started], NULL, sweep_worker, &pool) != 0) break;
        started++;
    }
    sweep_worker(&pool);
    for (unsigned i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&pool.mu);
}

static double run_bps(const sim_result *r)
{
    return r->elapsed_s > 0 ? (double)r->blocks / r->elapsed_s : 0.0;
}

static const char *run_name(const sweep_run *r)
{
    return r->sp.capacity_tokens == 0 ? "unlimited" : pgd_policy_name(r->sp.policy);
}

/* LRU's token hit ratio at the capacity of run i (runs: n_caps groups of n_pol). */
static double lru_ratio(const sweep_run *runs, size_t i, size_t n_pol)
{
    size_t g = i / n_pol * n_pol;
    for (size_t j = g; j < g + n_pol; j++) {
        if (runs[j].sp.policy == PGD_POLICY_LRU)
            return ratio(runs[j].res.hit_tokens, runs[j].res.tokens);
    }
    return 0.0;
}

static void sweep_table(const char *trace, const sweep_run *runs, size_t n, size_t n_pol,
                        uint64_t distinct, uint32_t bt)
{
    printf("trace %s: %llu requests, %llu blocks, %llu distinct blocks of %u tokens\n", trace,
           (unsigned long long)runs[n - 1].res.requests, (unsigned long long)runs[n - 1].res.blocks,
           (unsigned long long)distinct, bt);
    printf("%-10s %14s %8s %10s %10s %8s %12s %12s\n", "policy", "capacity", "pct", "token hit",
           "block hit", "vs lru", "evictions", "blocks/s");
    for (size_t i = 0; i < n; i++) {
        const sweep_run *r = &runs[i];
        double th = ratio(r->res.hit_tokens, r->res.tokens);
        double l = i + 1 < n ? lru_ratio(runs, i, n_pol) : 0.0;
        char vs[16];
        if (l > 0)
            snprintf(vs, sizeof vs, "%.3f", th / l);
        else
            snprintf(vs, sizeof vs, "-");
        printf("%-10s %14llu %7.2f%% %10.4f %10.4f %8s %12llu %12.0f\n", run_name(r),
               (unsigned long long)r->res.capacity_tokens, r->pct, th,
               ratio(r->res.hit_blocks, r->res.blocks), vs, (unsigned long long)r->res.evictions,
               run_bps(&r->res));
    }
}

static int sweep_json(const char *trace, const sweep_run *runs, size_t n, size_t n_pol,
                      uint64_t distinct, uint32_t bt)
{
    json_t *o = json_object(), *arr = json_array();
    int rc;
    if (!o || !arr) {
        json_decref(o);
        json_decref(arr);
        return -1;
    }
    json_object_set_new(o, "trace", json_string(trace));
    json_object_set_new(o, "block_tokens", jint(bt));
    json_object_set_new(o, "distinct_blocks", jint(distinct));
    for (size_t i = 0; i < n; i++) {
        const sweep_run *r = &runs[i];
        json_t *e = json_object();
        double th = ratio(r->res.hit_tokens, r->res.tokens);
        double l = i + 1 < n ? lru_ratio(runs, i, n_pol) : 0.0;
        json_object_set_new(e, "policy", json_string(run_name(r)));
        json_object_set_new(e, "capacity_tokens", jint(r->res.capacity_tokens));
        json_object_set_new(e, "capacity_pct", json_real(r->pct));
        json_object_set_new(e, "token_hit_ratio", json_real(th));
        json_object_set_new(e, "block_hit_ratio",
                            json_real(ratio(r->res.hit_blocks, r->res.blocks)));
        json_object_set_new(e, "vs_lru", l > 0 ? json_real(th / l) : json_null());
        json_object_set_new(e, "evictions", jint(r->res.evictions));
        json_object_set_new(e, "uncached_blocks", jint(r->res.uncached_blocks));
        json_object_set_new(e, "blocks_per_s", json_real(run_bps(&r->res)));
        json_array_append_new(arr, e);
    }
    json_object_set_new(o, "runs", arr);
    rc = json_dumpf(o, stdout, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
    json_decref(o);
    if (rc != 0) return -1;
    return fputc('\n', stdout) == EOF ? -1 : 0;
}

/* Writes the CSV. Returns 0, or -1 after printing why. */
static int sweep_csv(const char *cmd, const char *path, const sweep_run *runs, size_t n)
{
    FILE *f = fopen(path, "w");
    int bad;
    if (!f) {
        fprintf(stderr, "%s: --csv: cannot create '%s': %s\n", cmd, path, strerror(errno));
        return -1;
    }
    fprintf(f, "policy,capacity_tokens,capacity_pct,token_hit_ratio,block_hit_ratio,evictions,"
               "blocks_per_s\n");
    for (size_t i = 0; i < n; i++) {
        const sweep_run *r = &runs[i];
        fprintf(f, "%s,%llu,%.6g,%.6f,%.6f,%llu,%.0f\n", run_name(r),
                (unsigned long long)r->res.capacity_tokens, r->pct,
                ratio(r->res.hit_tokens, r->res.tokens), ratio(r->res.hit_blocks, r->res.blocks),
                (unsigned long long)r->res.evictions, run_bps(&r->res));
    }
    bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        fprintf(stderr, "%s: --csv: cannot write '%s'\n", cmd, path);
        return -1;
    }
    return 0;
}

/* path with its extension (after the last '.' of the last component) replaced by ext. */
static void with_ext(char *out, size_t len, const char *path, const char *ext)
{
    const char *slash = strrchr(path, '/'), *dot = strrchr(path, '.');
    size_t base = dot && (!slash || dot > slash) ? (size_t)(dot - path) : strlen(path);
    snprintf(out, len, "%.*s%s", (int)base, path, ext);
}

/* A string as a gnuplot single-quoted literal ('' for a quote). */
static void gp_quote(FILE *f, const char *s)
{
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'') fputc('\'', f);
        fputc(*s, f);
    }
    fputc('\'', f);
}

/* Writes the gnuplot script: token hit ratio against capacity (% of distinct blocks, log
 * scale), a line per policy from the CSV, Belady dashed, the unlimited ratio as a
 * horizontal bound. Returns 0, or -1 after printing why. */
static int sweep_script(const char *cmd, const char *gp, const char *plot, int svg, const char *csv,
                        const pgd_policy_kind *pols, size_t n_pol, double unl)
{
    FILE *f = fopen(gp, "w");
    int bad;
    if (!f) {
        fprintf(stderr, "%s: --plot: cannot create '%s': %s\n", cmd, gp, strerror(errno));
        return -1;
    }
    fprintf(f, "# written by pagoda replay --sweep; render with: gnuplot %s\n", gp);
    if (svg) {
        fprintf(f, "set terminal svg size 900,600 dynamic background rgb 'white'\n");
    } else {
        fprintf(f, "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
                   "    set terminal pngcairo size 900,600\n"
                   "} else {\n"
                   "    set terminal png size 900,600\n"
                   "}\n");
    }
    fprintf(f, "set output ");
    gp_quote(f, plot);
    fprintf(f, "\nset datafile separator ','\n"
               "set datafile missing NaN\n"
               "set title 'pagoda replay: prefix-cache token hit ratio against capacity'\n"
               "set xlabel 'pool capacity (%% of the distinct blocks, log scale)'\n"
               "set ylabel 'token hit ratio'\n"
               "set logscale x\nset grid\nset key right bottom\nset yrange [0:*]\n"
               "set offsets graph 0.05, graph 0.05, 0, 0\n"
               "csv = ");
    gp_quote(f, csv);
    fprintf(f, "\nplot ");
    for (size_t i = 0; i < n_pol; i++) {
        const char *name = pgd_policy_name(pols[i]);
        fprintf(f,
                "csv every ::1 using (strcol(1) eq '%s' ? $3 : NaN):4 with linespoints lw 2 %s"
                "title '%s%s', \\\n     ",
                name, pols[i] == PGD_POLICY_BELADY ? "dt 2 " : "", name,
                pols[i] == PGD_POLICY_BELADY ? " (offline bound)" : "");
    }
    fprintf(f, "%.6f with lines dt 3 lw 2 lc rgb 'black' title 'unlimited (upper bound)'\n", unl);
    bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        fprintf(stderr, "%s: --plot: cannot write '%s'\n", cmd, gp);
        return -1;
    }
    return 0;
}

/* Runs gnuplot on the script. Returns 0 (rendered), 1 (no gnuplot: said so on stderr) or
 * -1 (gnuplot failed: said so). */
static int sweep_render(const char *cmd, const char *gp, const char *plot, const char *csv)
{
    const char *prog = getenv("PGD_GNUPLOT");
    char *argv[3];
    pid_t pid;
    int st, rc;
    if (!prog || !*prog) prog = "gnuplot";
    argv[0] = (char *)prog;
    argv[1] = (char *)gp;
    argv[2] = NULL;
    fflush(stdout);
    rc = posix_spawnp(&pid, prog, NULL, NULL, argv, environ);
    if (rc == 0) {
        while (waitpid(pid, &st, 0) < 0) {
            if (errno != EINTR) {
                st = -1;
                break;
            }
        }
        if (st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0) return 0;
        if (!(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 127)) {
            fprintf(stderr, "%s: --plot: %s %s failed: '%s' not written (the CSV is %s)\n", cmd,
                    prog, gp, plot, csv);
            return -1;
        }
    }
    fprintf(stderr,
            "%s: --plot: %s is not installed (Debian: apt-get install gnuplot-nox): wrote %s "
            "and the script %s; render it with: gnuplot %s\n",
            cmd, prog, csv, gp, gp);
    return 1;
}

/* The options of a sweep. */
typedef struct sweep_opts {
    const pgd_policy_kind *pols; /* the user's --policy list */
    size_t n_pols;
    const sweep_cap *caps; /* n_caps == 0: the single --capacity-tokens */
    size_t n_caps;
    uint64_t capacity; /* --capacity-tokens (0: unlimited) */
    const char *csv, *plot;
    unsigned jobs;
    int json;
} sweep_opts;

/* Sweep mode. Returns an exit status. */
static int run_sweep(const char *cmd, const char *trace, const trace_set *t, const sim_params *base,
                     const sweep_opts *o)
{
    pgd_policy_kind pols[PGD_POLICY_COUNT + 2];
    size_t n_pol = 0, n_caps = o->n_caps ? o->n_caps : 1, n_runs, i;
    sweep_run *runs = NULL, unl;
    uint64_t distinct;
    char csv[4096], gp[4096];
    int rc = CLI_EXIT_FAIL, have_lru = 0, have_bel = 0;

    for (i = 0; i < o->n_pols; i++) {
        have_lru |= o->pols[i] == PGD_POLICY_LRU;
        have_bel |= o->pols[i] == PGD_POLICY_BELADY;
    }
    if (!have_lru) pols[n_pol++] = PGD_POLICY_LRU;
    for (i = 0; i < o->n_pols; i++) {
        if (o->pols[i] != PGD_POLICY_BELADY) pols[n_pol++] = o->pols[i];
    }
    (void)have_bel;
    pols[n_pol++] = PGD_POLICY_BELADY; /* last: the bound */

    /* The unlimited run first: the upper bound, and the distinct blocks. */
    memset(&unl, 0, sizeof unl);
    unl.sp = *base;
    unl.sp.policy = PGD_POLICY_LRU;
    unl.sp.capacity_tokens = 0;
    unl.sp.n_tiers = 0;
    unl.sp.tiers = NULL;
    unl.pct = 100.0;
    if (sim_run(&unl.sp, t, &unl.res, unl.err, sizeof unl.err) != 0) {
        fprintf(stderr, "%s: %s: unlimited run: %s\n", cmd, trace, unl.err);
        return CLI_EXIT_FAIL;
    }
    distinct = unl.res.capacity_pages;

    n_runs = n_pol * n_caps + 1;
    runs = calloc(n_runs, sizeof *runs);
    if (!runs) {
        fprintf(stderr, "%s: out of memory\n", cmd);
        return CLI_EXIT_FAIL;
    }
    for (size_t c = 0; c < n_caps; c++) {
        uint64_t tokens = o->n_caps ? o->caps[c].tokens : o->capacity;
        if (o->n_caps && o->caps[c].pct > 0) {
            uint64_t blocks = (uint64_t)llround(o->caps[c].pct * (double)distinct / 100.0);
            tokens = (blocks ? blocks : 1) * base->block_tokens;
        }
        if (tokens != 0 && tokens < base->block_tokens) {
            fprintf(stderr, "%s: --sweep: capacity %llu is less than one block (%u tokens)\n", cmd,
                    (unsigned long long)tokens, base->block_tokens);
            free(runs);
            return CLI_EXIT_USAGE;
        }
        for (size_t p = 0; p < n_pol; p++) {
            sweep_run *r = &runs[c * n_pol + p];
            r->sp = *base;
            r->sp.progress = 0;
            r->sp.policy = pols[p];
            r->sp.capacity_tokens = tokens;
            r->pct = tokens == 0 ? 100.0
                                 : 100.0 * (double)(tokens / base->block_tokens) /
                                       (double)(distinct ? distinct : 1);
        }
    }
    sweep_exec(t, runs, n_runs - 1, o->jobs);
    runs[n_runs - 1] = unl;
    for (i = 0; i + 1 < n_runs; i++) {
        if (runs[i].failed) {
            fprintf(stderr, "%s: %s: %s at %llu tokens: %s\n", cmd, trace,
                    pgd_policy_name(runs[i].sp.policy),
                    (unsigned long long)runs[i].sp.capacity_tokens, runs[i].err);
            goto done;
        }
    }
    if (o->json) {
        if (sweep_json(trace, runs, n_runs, n_pol, distinct, base->block_tokens) != 0) {
            fprintf(stderr, "%s: cannot write the JSON output\n", cmd);
            goto done;
        }
    } else {
        sweep_table(trace, runs, n_runs, n_pol, distinct, base->block_tokens);
    }
    if (fflush(stdout) != 0) {
        fprintf(stderr, "%s: cannot write the output: %s\n", cmd, strerror(errno));
        goto done;
    }
    if (o->csv)
        snprintf(csv, sizeof csv, "%s", o->csv);
    else if (o->plot)
        with_ext(csv, sizeof csv, o->plot, ".csv");
    else
        snprintf(csv, sizeof csv, "replay-sweep.csv");
    if (sweep_csv(cmd, csv, runs, n_runs) != 0) goto done;
    if (o->plot) {
        size_t pl = strlen(o->plot);
        int svg = pl >= 4 && strcmp(o->plot + pl - 4, ".svg") == 0;
        with_ext(gp, sizeof gp, o->plot, ".gp");
        if (sweep_script(cmd, gp, o->plot, svg, csv, pols, n_pol,
                         ratio(unl.res.hit_tokens, unl.res.tokens)) != 0) {
            goto done;
        }
        if (sweep_render(cmd, gp, o->plot, csv) < 0) goto done;
    }
    rc = CLI_EXIT_OK;
done:
    free(runs);
    return rc;
}

enum {
    OPT_POLICY = 256,
    OPT_CAPACITY,
    OPT_BLOCK,
    OPT_JSON,
    OPT_STRICT,
    OPT_QUIET,
    OPT_CHECK,
    OPT_TIER,
    OPT_BYTES_PER_TOKEN,
    OPT_MODEL,
    OPT_KV_TYPE,
    OPT_SWEEP,
    OPT_CSV,
    OPT_PLOT,
    OPT_JOBS,
    OPT_MODEL_TIMING,
    OPT_PREFILL_TPS,
    OPT_DECODE_TPS
};

/* Parses a speed in tokens/s: a decimal number above 0 (at most 1e12). 0 or -1 (said). */
static int parse_tps(const char *cmd, const char *opt, const char *s, double *out)
{
    char *end;
    double v;
    errno = 0;
    v = strtod(s, &end);
    if (!isdigit((unsigned char)*s) || errno || *end != '\0' || !(v > 0) || v > 1e12) {
        fprintf(stderr, "%s: %s: '%s' is not a speed in tokens/s (a number above 0)\n", cmd, opt,
                s);
        return -1;
    }
    *out = v;
    return 0;
}

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
        {"tier", required_argument, NULL, OPT_TIER},
        {"bytes-per-token", required_argument, NULL, OPT_BYTES_PER_TOKEN},
        {"model", required_argument, NULL, OPT_MODEL},
        {"kv-type", required_argument, NULL, OPT_KV_TYPE},
        {"sweep", required_argument, NULL, OPT_SWEEP},
        {"csv", required_argument, NULL, OPT_CSV},
        {"plot", required_argument, NULL, OPT_PLOT},
        {"jobs", required_argument, NULL, OPT_JOBS},
        {"model-timing", no_argument, NULL, OPT_MODEL_TIMING},
        {"prefill-tps", required_argument, NULL, OPT_PREFILL_TPS},
        {"decode-tps", required_argument, NULL, OPT_DECODE_TPS},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *cmd = argv[0], *path, *name, *model = NULL;
    sim_params sp;
    sim_result res;
    trace_set ts = {0};
    trace_load_stats ls;
    trace_load_opts lo;
    uint64_t capacity = DEFAULT_CAPACITY_TOKENS, block = DEFAULT_BLOCK_TOKENS, bpt = 0;
    sim_tier tiers[SIM_MAX_TIERS];
    uint32_t n_tiers = 0;
    pgd_kv_type kv_type = PGD_KV_F16;
    kv_size kv;
    int have_kv_type = 0, json = 0, strict = 0, quiet = 0, check = 0, opt, rc = CLI_EXIT_FAIL, prc;
    pgd_policy_kind pols[PGD_POLICY_COUNT];
    sweep_cap caps[MAX_SWEEP];
    sweep_opts so;
    int n_pols = 1, n_caps = 0, model_timing = 0;
    uint64_t jobs = 1;
    double prefill_tps = SIM_DEFAULT_PREFILL_TPS, decode_tps = SIM_DEFAULT_DECODE_TPS;
    char err[256];
    FILE *f;
    double t0, load_s;

    memset(&sp, 0, sizeof sp);
    memset(&kv, 0, sizeof kv);
    memset(&so, 0, sizeof so);
    sp.policy = PGD_POLICY_LRU;
    pols[0] = PGD_POLICY_LRU;
    optind = 0; /* glibc: full re-initialisation, in case another command parsed first */
    for (;;) {
        opt = getopt_long(argc, argv, "h", opts, NULL);
        if (opt == -1) break;
        switch (opt) {
        case OPT_POLICY:
            n_pols = parse_policy_list(cmd, optarg, pols);
            if (n_pols < 0) return cli_usage_error(cmd);
            sp.policy = pols[0];
            break;
        case OPT_SWEEP:
            n_caps = parse_sweep(cmd, optarg, caps);
            if (n_caps < 0) return cli_usage_error(cmd);
            break;
        case OPT_CSV:
            so.csv = optarg;
            break;
        case OPT_PLOT: {
            size_t pl = strlen(optarg);
            if (pl < 5 ||
                (strcmp(optarg + pl - 4, ".png") != 0 && strcmp(optarg + pl - 4, ".svg") != 0)) {
                fprintf(stderr, "%s: --plot: '%s' does not end in .png or .svg\n", cmd, optarg);
                return cli_usage_error(cmd);
            }
            so.plot = optarg;
            break;
        }
        case OPT_JOBS:
            if (cli_parse_u64(cmd, "--jobs", optarg, 1, MAX_JOBS, &jobs) != 0) {
                return cli_usage_error(cmd);
            }
            break;
        case OPT_MODEL_TIMING:
            model_timing = 1;
            break;
        case OPT_PREFILL_TPS:
            if (parse_tps(cmd, "--prefill-tps", optarg, &prefill_tps) != 0) {
                return cli_usage_error(cmd);
            }
            break;
        case OPT_DECODE_TPS:
            if (parse_tps(cmd, "--decode-tps", optarg, &decode_tps) != 0) {
                return cli_usage_error(cmd);
            }
            break;
        case OPT_CAPACITY:
            if (strcmp(optarg, "unlimited") == 0) {
                capacity = 0;
            } else {
                prc = parse_tokens(optarg, &capacity);
                if (prc == 0 && capacity == 0) {
                    fprintf(stderr, "%s: --capacity-tokens: %s is out of range (at least 1)\n", cmd,
                            optarg);
                    return cli_usage_error(cmd);
                }
                if (prc != 0) {
                    tokens_error(cmd, "--capacity-tokens", optarg, prc);
                    return cli_usage_error(cmd);
                }
            }
            break;
        case OPT_TIER:
            if (n_tiers == SIM_MAX_TIERS) {
                fprintf(stderr, "%s: --tier: at most %d tiers\n", cmd, SIM_MAX_TIERS);
                return cli_usage_error(cmd);
            }
            if (parse_tier(cmd, optarg, &tiers[n_tiers]) != 0) return cli_usage_error(cmd);
            n_tiers++;
            break;
        case OPT_BYTES_PER_TOKEN:
            if (cli_parse_size(cmd, "--bytes-per-token", optarg, 1, UINT64_C(1) << 40, &bpt) != 0) {
                return cli_usage_error(cmd);
            }
            break;
        case OPT_MODEL:
            model = optarg;
            break;
        case OPT_KV_TYPE:
            if (pgd_kv_type_parse(optarg, &kv_type) != PGD_OK) {
                fprintf(stderr,
                        "%s: --kv-type: '%s' is not one of f32, f16, bf16, q8_0, q4_0, kivi2\n",
                        cmd, optarg);
                return cli_usage_error(cmd);
            }
            have_kv_type = 1;
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
    if (model && bpt) {
        fprintf(stderr, "%s: --model and --bytes-per-token both size a block: give one\n", cmd);
        return cli_usage_error(cmd);
    }
    if (have_kv_type && !model) {
        fprintf(stderr, "%s: --kv-type needs --model (the geometry it applies to)\n", cmd);
        return cli_usage_error(cmd);
    }
    if (bpt) {
        kv.page_bytes = bpt * block;
        kv.token_bytes = (double)bpt;
        snprintf(kv.source, sizeof kv.source, "--bytes-per-token");
    } else if (model) {
        prc = kv_from_model(cmd, model, kv_type, (uint32_t)block, &kv);
        if (prc == CLI_EXIT_USAGE) return cli_usage_error(cmd);
        if (prc != 0) return prc;
    }
    sp.capacity_tokens = capacity;
    sp.block_tokens = (uint32_t)block;
    sp.progress = !quiet && isatty(STDERR_FILENO);
    sp.check = check;
    sp.tiers = tiers;
    sp.n_tiers = n_tiers;
    sp.model_timing = model_timing;
    sp.prefill_tps = prefill_tps;
    sp.decode_tps = decode_tps;
    so.pols = pols;
    so.n_pols = (size_t)n_pols;
    so.caps = caps;
    so.n_caps = (size_t)n_caps;
    so.capacity = capacity;
    so.jobs = (unsigned)jobs;
    so.json = json;

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

    if (n_caps || n_pols > 1 || so.csv || so.plot) {
        rc = run_sweep(cmd, name, &ts, &sp, &so);
        goto done;
    }
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
        if (print_json(name, &sp, &res, &ls, load_s, &kv) != 0) {
            fprintf(stderr, "%s: cannot write the JSON output\n", cmd);
            goto done;
        }
    } else {
        print_table(&sp, &res, &ls);
        if (n_tiers) print_tiers(&sp, &res, &kv);
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
