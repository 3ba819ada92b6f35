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
 */
#include <ctype.h>
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
            "Tiers (--tier, repeatable, fastest first below the pool) model the storage tiers\n"
            "as the cache moves pages, write-back: each is an LRU over the same block hashes.\n"
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
            "  --policy NAME          eviction policy: lru (default) or belady (offline\n"
            "                         optimal, knows the trace's future)\n"
            "  --capacity-tokens N    pool size in tokens, rounded down to whole blocks\n"
            "                         (default %d); 'unlimited': a page per distinct block\n"
            "  --block-tokens N       tokens per block, a power of two (default %d)\n"
            "  --tier KIND:TOKENS     a tier below the pool (repeatable, at most %d, in order):\n"
            "                         KIND is ram or disk (a label), TOKENS its capacity,\n"
            "                         rounded down to whole blocks; 0: the tier changes\n"
            "                         nothing. e.g. --tier ram:3M --tier disk:30M\n"
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
            "  -h, --help             show this help\n"
            "\n"
            "Token counts (--capacity-tokens, --tier) are digits with an optional decimal\n"
            "suffix K, M, G, T (10^3, 10^6, 10^9, 10^12: 3M = 3000000) or binary suffix Ki,\n"
            "Mi, Gi, Ti (2^10 .. 2^40: 2Mi = 2097152).\n"
            "\n"
            "Exit status: 0 done; 1 unreadable trace, bad line under --strict, or replay\n"
            "failure; 2 bad command line.\n",
            cmd, DEFAULT_CAPACITY_TOKENS, DEFAULT_BLOCK_TOKENS, SIM_MAX_TIERS);
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

/* Parses a --tier spec KIND:TOKENS into *t. Returns 0, or -1 after printing why. */
static int parse_tier(const char *cmd, const char *spec, sim_tier *t)
{
    const char *colon = strchr(spec, ':');
    size_t kind_len = colon ? (size_t)(colon - spec) : 0;
    int rc;
    if (!colon || strchr(colon + 1, ':')) {
        fprintf(stderr,
                "%s: --tier: '%s' is not KIND:TOKENS (e.g. ram:3M or disk:30M; replay models "
                "capacity only: no path, codec or compression)\n",
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
    rc = parse_tokens(colon + 1, &t->capacity_tokens);
    if (rc != 0) {
        tokens_error(cmd, "--tier", colon + 1, rc);
        return -1;
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
    OPT_KV_TYPE
};

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
    char err[256];
    FILE *f;
    double t0, load_s;

    memset(&sp, 0, sizeof sp);
    memset(&kv, 0, sizeof kv);
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
