/* SPDX-License-Identifier: MIT */
/*
 * gen_trace.c - `pagoda gen-trace`: writes a synthetic Mooncake-format trace (gen.c) and,
 * on request, its known answer: the hits an unlimited cache must find, which the replay
 * tests compare with `pagoda replay --capacity-tokens unlimited`.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "cli.h"
#include "gen.h"

static void usage(FILE *f, const char *cmd)
{
    const gen_params d = gen_default_params();
    fprintf(f,
            "usage: %s [options]\n"
            "\n"
            "Writes a synthetic request trace in the Mooncake FAST'25 JSONL format (the input\n"
            "of pagoda replay), deterministic from --seed. Workload: multi-turn conversations\n"
            "(each turn extends the previous turn's prefix) whose first turn starts with one\n"
            "of --groups shared system prompts, interleaved pseudo-randomly with one-off\n"
            "requests (half of them starting with a system prompt); timestamps increase.\n"
            "Equal ids at position i mean equal prefixes; a fresh block gets a new id.\n"
            "\n"
            "options:\n"
            "  --seed N             random seed (default %llu)\n"
            "  --requests N         requests to write (default %llu)\n"
            "  --groups N           shared system prompts (default %u; 0: none)\n"
            "  --system-blocks N    blocks per system prompt (default %u)\n"
            "  --sessions N         conversations open at once (default %u)\n"
            "  --turns N            turns per conversation (default %u)\n"
            "  --turn-blocks N      mean new blocks per turn (default %u)\n"
            "  --one-off PCT        percent of requests that are one-offs (default %u)\n"
            "  --block-tokens N     tokens per block, a power of two (default %u)\n"
            "  --id-base N          first hash id (default %llu; ids stay below 2^63)\n"
            "  -o, --output FILE    write the trace to FILE instead of stdout\n"
            "  --expect FILE        write the known answer to FILE as one JSON object:\n"
            "                       requests, blocks, distinct_ids, tokens,\n"
            "                       unlimited_hit_blocks (= blocks - distinct_ids) and\n"
            "                       unlimited_hit_tokens, for an unlimited-capacity replay\n"
            "  --stats              print the same figures on stderr\n"
            "  -h, --help           show this help\n",
            cmd, (unsigned long long)d.seed, (unsigned long long)d.n_requests, d.n_groups,
            d.system_blocks, d.n_sessions, d.turns, d.turn_blocks, d.one_off_pct, d.block_tokens,
            (unsigned long long)d.id_base);
}

/* Writes one request as a JSON line. Returns 0, or 1 on a write error. */
static int emit_line(void *ud, const gen_request *r)
{
    FILE *f = ud;
    fprintf(f,
            "{\"timestamp\": %llu, \"input_length\": %llu, \"output_length\": %llu, "
            "\"hash_ids\": [",
            (unsigned long long)r->timestamp_ms, (unsigned long long)r->input_length,
            (unsigned long long)r->output_length);
    for (size_t i = 0; i < r->n_ids; i++) {
        fprintf(f, i ? ", %llu" : "%llu", (unsigned long long)r->ids[i]);
    }
    fputs("]}\n", f);
    return ferror(f) ? 1 : 0;
}

static json_t *expect_json(const gen_params *p, const gen_stats *st)
{
    json_t *o = json_object();
    if (!o) return NULL;
    json_object_set_new(o, "seed", json_integer((json_int_t)p->seed));
    json_object_set_new(o, "block_tokens", json_integer(p->block_tokens));
    json_object_set_new(o, "requests", json_integer((json_int_t)st->requests));
    json_object_set_new(o, "blocks", json_integer((json_int_t)st->blocks));
    json_object_set_new(o, "distinct_ids", json_integer((json_int_t)st->distinct_ids));
    json_object_set_new(o, "tokens", json_integer((json_int_t)st->tokens));
    json_object_set_new(o, "unlimited_hit_blocks",
                        json_integer((json_int_t)st->unlimited_hit_blocks));
    json_object_set_new(o, "unlimited_hit_tokens",
                        json_integer((json_int_t)st->unlimited_hit_tokens));
    return o;
}

/* Numeric options, parsed alike: their getopt values are OPT_NUM + index. */
enum {
    N_SEED,
    N_REQUESTS,
    N_GROUPS,
    N_SYSTEM,
    N_SESSIONS,
    N_TURNS,
    N_TURN_BLOCKS,
    N_ONE_OFF,
    N_BLOCK,
    N_ID_BASE,
    N_COUNT
};
enum { OPT_NUM = 256, OPT_EXPECT = OPT_NUM + N_COUNT, OPT_STATS };

typedef struct num_opt {
    const char *name;
    uint64_t max;
    uint64_t *u64; /* the field it sets: one of u64 and u32 */
    uint32_t *u32;
} num_opt;

int cmd_gen_trace(int argc, char **argv)
{
    static const struct option opts[] = {
        {"seed", required_argument, NULL, OPT_NUM + N_SEED},
        {"requests", required_argument, NULL, OPT_NUM + N_REQUESTS},
        {"groups", required_argument, NULL, OPT_NUM + N_GROUPS},
        {"system-blocks", required_argument, NULL, OPT_NUM + N_SYSTEM},
        {"sessions", required_argument, NULL, OPT_NUM + N_SESSIONS},
        {"turns", required_argument, NULL, OPT_NUM + N_TURNS},
        {"turn-blocks", required_argument, NULL, OPT_NUM + N_TURN_BLOCKS},
        {"one-off", required_argument, NULL, OPT_NUM + N_ONE_OFF},
        {"block-tokens", required_argument, NULL, OPT_NUM + N_BLOCK},
        {"id-base", required_argument, NULL, OPT_NUM + N_ID_BASE},
        {"output", required_argument, NULL, 'o'},
        {"expect", required_argument, NULL, OPT_EXPECT},
        {"stats", no_argument, NULL, OPT_STATS},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *cmd = argv[0], *out_path = NULL, *expect_path = NULL, *why = NULL;
    gen_params p = gen_default_params();
    const num_opt nums[N_COUNT] = {
        [N_SEED] = {"--seed", INT64_MAX, &p.seed, NULL},
        [N_REQUESTS] = {"--requests", UINT64_C(1) << 40, &p.n_requests, NULL},
        [N_GROUPS] = {"--groups", UINT32_MAX, NULL, &p.n_groups},
        [N_SYSTEM] = {"--system-blocks", UINT32_MAX, NULL, &p.system_blocks},
        [N_SESSIONS] = {"--sessions", UINT32_MAX, NULL, &p.n_sessions},
        [N_TURNS] = {"--turns", UINT32_MAX, NULL, &p.turns},
        [N_TURN_BLOCKS] = {"--turn-blocks", UINT32_MAX, NULL, &p.turn_blocks},
        [N_ONE_OFF] = {"--one-off", 100, NULL, &p.one_off_pct},
        [N_BLOCK] = {"--block-tokens", UINT32_MAX, NULL, &p.block_tokens},
        [N_ID_BASE] = {"--id-base", INT64_MAX, &p.id_base, NULL},
    };
    gen_stats st;
    int stats = 0, opt, rc;
    FILE *out = stdout;
    json_t *ex;

    optind = 0; /* glibc: full re-initialisation */
    for (;;) {
        opt = getopt_long(argc, argv, "ho:", opts, NULL);
        if (opt == -1) break;
        if (opt >= OPT_NUM && opt < OPT_NUM + N_COUNT) {
            const num_opt *n = &nums[opt - OPT_NUM];
            uint64_t v;
            if (cli_parse_u64(cmd, n->name, optarg, 0, n->max, &v) != 0) {
                return cli_usage_error(cmd);
            }
            if (n->u64) {
                *n->u64 = v;
            } else {
                *n->u32 = (uint32_t)v;
            }
            continue;
        }
        switch (opt) {
        case 'o':
            out_path = optarg;
            break;
        case OPT_EXPECT:
            expect_path = optarg;
            break;
        case OPT_STATS:
            stats = 1;
            break;
        case 'h':
            usage(stdout, cmd);
            return CLI_EXIT_OK;
        default:
            return cli_usage_error(cmd);
        }
    }
    if (optind < argc) return cli_unexpected_arg(cmd, argv[optind]);
    why = gen_check_params(&p);
    if (why) {
        fprintf(stderr, "%s: %s\n", cmd, why);
        return cli_usage_error(cmd);
    }
    if (out_path && strcmp(out_path, "-") != 0) {
        out = fopen(out_path, "w");
        if (!out) {
            fprintf(stderr, "%s: cannot create '%s': %s\n", cmd, out_path, strerror(errno));
            return CLI_EXIT_FAIL;
        }
    }
    rc = gen_run(&p, emit_line, out, &st, &why);
    if (out != stdout ? fclose(out) != 0 : fflush(out) != 0) rc = 1;
    if (rc != 0) {
        fprintf(stderr, "%s: %s\n", cmd, why ? why : "cannot write the trace");
        return CLI_EXIT_FAIL;
    }
    if (stats) {
        fprintf(stderr,
                "requests %llu, blocks %llu, distinct ids %llu, tokens %llu\n"
                "unlimited capacity: hit blocks %llu (%.4f), hit tokens %llu (%.4f)\n",
                (unsigned long long)st.requests, (unsigned long long)st.blocks,
                (unsigned long long)st.distinct_ids, (unsigned long long)st.tokens,
                (unsigned long long)st.unlimited_hit_blocks,
                st.blocks ? (double)st.unlimited_hit_blocks / (double)st.blocks : 0.0,
                (unsigned long long)st.unlimited_hit_tokens,
                st.tokens ? (double)st.unlimited_hit_tokens / (double)st.tokens : 0.0);
    }
    if (expect_path) {
        ex = expect_json(&p, &st);
        if (!ex || json_dump_file(ex, expect_path, JSON_PRESERVE_ORDER) != 0) {
            fprintf(stderr, "%s: cannot write '%s'\n", cmd, expect_path);
            json_decref(ex);
            return CLI_EXIT_FAIL;
        }
        json_decref(ex);
    }
    return CLI_EXIT_OK;
}
