/* SPDX-License-Identifier: MIT */
/*
 * loadgen.c - `pagoda bench`: a load generator for OpenAI-compatible completion servers,
 * with a synthetic shared-prefix workload (loadgen.h). Called by the CLI dispatcher.
 *
 *   pagoda bench -m MODEL [serve flags]   starts `pagoda serve` itself (this executable,
 *                                         --port 0, the port read from its ready line),
 *                                         runs the workload with prefix caching, then on a
 *                                         fresh server with --no-prefix-cache, and compares
 *   pagoda bench --url URL                runs the workload once against any server
 *   pagoda bench --trace FILE ...         the workload from a Mooncake trace instead
 *                                         (lg_workload_from_trace): prompts from its hash
 *                                         ids, in its order, one at a time by default
 *
 * Each request is POST /v1/completions with the prompt as an array of token ids,
 * temperature 0, max_tokens O, "ignore_eos": true (so every request makes O tokens where
 * the server supports it), streamed with usage in the last chunk. TTFT is the time from
 * sending a request to its first streamed token; ITL the gaps between streamed tokens
 * (per SSE chunk that carries text). The prefix hit ratio comes from the responses'
 * usage.prompt_tokens_details.cached_tokens; KV usage peak and prompt tokens computed
 * from the server's /metrics when it has pagoda_ names (sampled every 10 ms).
 *
 * One thread drives every request through libcurl's multi interface, so token times are
 * taken as the bytes arrive and no locking is needed. Failures (no server, HTTP errors,
 * broken streams) are counted by kind and reported, never fatal to the run.
 *
 *   loadgen.c         the command line and the runs (this file)
 *   loadgen_curl.c    the libcurl driver: probing the server, running the workload
 *   loadgen_spawn.c   starting and stopping `pagoda serve`
 *   loadgen_report.c  the table and the JSON report
 *   loadgen_util.c    the workload, SSE and Prometheus parsers, summaries (tested alone)
 *   loadgen.h         what they share
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "cli.h"
#include "loadgen.h"
#include "trace.h"

/* ---- command line ---- */

static void usage(FILE *f, const char *cmd)
{
    fprintf(f,
            "usage: %s -m MODEL [options] [serve flags...] [-- serve flags...]\n"
            "       %s --url URL [options]\n"
            "\n"
            "A load generator with a synthetic shared-prefix workload: G groups x P prompts,\n"
            "each group's P prompts sharing a system prompt of S tokens, each adding a question\n"
            "of Q tokens; O output tokens each (temperature 0, \"ignore_eos\": true). Prompts are\n"
            "token-id arrays (deterministic from --seed), streamed, so TTFT and inter-token\n"
            "latency (ITL) are measured per token.\n"
            "\n"
            "With --trace FILE the workload is a Mooncake-format trace instead (pagoda\n"
            "gen-trace writes one): each line one request, in file order, one at a time (or\n"
            "--concurrency, --rate, or at its timestamps with --speedup). Its prompt is token\n"
            "ids made from its hash ids (each id a block of --block-tokens ids, deterministic\n"
            "from the id and --seed, so the trace's prefix sharing is kept exactly), its\n"
            "max_tokens the line's output_length (at most --output-tokens). With --tenants K\n"
            "each conversation (the line's first hash id) belongs to one of K tenants, sent\n"
            "as \"cache_salt\": \"tenant-<k>\".\n"
            "\n"
            "With -m it starts `pagoda serve -m MODEL --port 0` itself, runs the workload, then\n"
            "runs it again on a fresh server started with --no-prefix-cache, and prints both\n"
            "with their ratio. Options it does not know (-t 2, --max-running 8, ...) and all\n"
            "after `--` are passed to `pagoda serve`. With --url it runs once against that\n"
            "server (any OpenAI-compatible one; the KV figures need pagoda's /metrics).\n"
            "\n"
            "options:\n"
            "  -m, --model FILE        the GGUF model for the spawned servers\n"
            "  --url URL               an already running server (http://HOST:PORT)\n"
            "  --groups G              distinct system prompts (default 4)\n"
            "  --prompts P             prompts per group (default 8)\n"
            "  --system-tokens S       tokens of each shared system prompt (default 256)\n"
            "  --question-tokens Q     tokens each prompt adds (default 32)\n"
            "  --output-tokens O       max_tokens of each request (default 64; --trace: the\n"
            "                          cap on output_length)\n"
            "  --concurrency C         requests in flight at once (default 8; --trace: 1)\n"
            "  --rate R                Poisson arrivals at R requests/s instead\n"
            "  --seed N                workload seed (default 1)\n"
            "  --trace FILE            the workload from a Mooncake JSONL trace (see above)\n"
            "  --block-tokens N        --trace: tokens per hash id (default 512, Mooncake's)\n"
            "  --tenants K             --trace: K tenants by conversation (default 0: none)\n"
            "  --trace-requests N      --trace: only the first N requests (default: all)\n"
            "  --speedup X             --trace: send at the timestamps divided by X\n"
            "  --json                  print one JSON object instead of the table\n"
            "  --no-compare            only the run with the prefix cache\n"
            "  --model-name NAME       the requests' \"model\" (default: /v1/models' first id)\n"
            "  --api-key KEY           bearer token (also given to the spawned server)\n"
            "  --no-ignore-eos         do not send \"ignore_eos\": true\n"
            "  --timeout SECONDS       per-request limit (default 600)\n"
            "  -h, --help              show this help\n"
            "\n"
            "Exit status: 0 when every request succeeded, 1 when a request failed or a server\n"
            "could not start or stop cleanly, 2 for a bad command line.\n",
            cmd, cmd);
}

/* Matches option `name` that takes a value, as "NAME VALUE" or "NAME=VALUE". Returns 1
 * (value in *val), 0 (another option), or -1 (the value is missing). */
static int opt_val(const char *name, int argc, char **argv, int *i, const char **val)
{
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0) return 0;
    if (strncmp(a + n, "=", 1) == 0) {
        *val = a + n + 1;
        return 1;
    }
    if (a[n] != '\0') return 0;
    if (*i + 1 >= argc) return -1;
    *i += 1;
    *val = argv[*i];
    return 1;
}

/* Parses argv into o. Returns -1 to go on, or the exit code to return. */
static int parse_args(int argc, char **argv, lg_opts *o)
{
    struct {
        const char *name;
        uint64_t *dst, min, max;
    } nums[] = {
        {"--groups", &o->groups, 1, 1u << 20},
        {"--prompts", &o->prompts, 1, 1u << 20},
        {"--system-tokens", &o->system_tokens, 0, 1u << 24},
        {"--question-tokens", &o->question_tokens, 0, 1u << 24},
        {"--output-tokens", &o->output_tokens, 1, 1u << 24},
        {"--concurrency", &o->concurrency, 1, 1u << 16},
        {"--seed", &o->seed, 0, UINT64_MAX},
        {"--timeout", &o->timeout_s, 1, 7u * 86400u},
        {"--block-tokens", &o->block_tokens, 1, 1u << 20},
        {"--tenants", &o->tenants, 0, 1u << 20},
        {"--trace-requests", &o->trace_requests, 0, 1000000},
    };
    /* Indices in nums: the synthetic workload's four, then --trace's three. */
    enum { N_SYNTHETIC = 4, N_TRACE_FIRST = 8, N_NUMS = 11 };
    _Static_assert(sizeof nums / sizeof nums[0] == N_NUMS, "N_NUMS is the size of nums");
    int given[N_NUMS] = {0};
    const char **pass = calloc((size_t)argc + 1, sizeof *pass);
    const char *cmd = o->cmd;
    int concurrency_given = 0;

    if (!pass) {
        fprintf(stderr, "%s: out of memory\n", cmd);
        return CLI_EXIT_FAIL;
    }
    o->serve_args = pass;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int k = 0, matched = 0;

        if (strcmp(a, "--") == 0) {
            while (++i < argc)
                pass[o->n_serve_args++] = argv[i];
            break;
        }
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout, cmd);
            return CLI_EXIT_OK;
        }
        if (strcmp(a, "--json") == 0) {
            o->json = 1;
            continue;
        }
        if (strcmp(a, "--no-compare") == 0) {
            o->compare = 0;
            continue;
        }
        if (strcmp(a, "--no-ignore-eos") == 0) {
            o->ignore_eos = 0;
            continue;
        }
        for (size_t j = 0; j < sizeof nums / sizeof nums[0] && !matched; j++) {
            k = opt_val(nums[j].name, argc, argv, &i, &v);
            if (k == 0) continue;
            matched = 1;
            if (k < 0) break;
            if (cli_parse_u64(cmd, nums[j].name, v, nums[j].min, nums[j].max, nums[j].dst) != 0) {
                return cli_usage_error(cmd);
            }
            if (nums[j].dst == &o->concurrency) concurrency_given = 1;
            given[j] = 1;
        }
        if (!matched) {
            static const char *const strs[] = {"--url",     "-m",     "--model", "--model-name",
                                               "--api-key", "--rate", "--trace", "--speedup"};
            for (size_t j = 0; j < sizeof strs / sizeof strs[0] && !matched; j++) {
                k = opt_val(strs[j], argc, argv, &i, &v);
                if (k == 0) continue;
                matched = 1;
                if (k < 0) break;
                if (j == 0) o->url = v;
                if (j == 1 || j == 2) o->model_path = v;
                if (j == 3) o->model_name = v;
                if (j == 4) o->api_key = v;
                if (j == 6) o->trace = v;
                if (j == 5 || j == 7) {
                    double *dst = j == 5 ? &o->rate : &o->speedup;
                    char *end = NULL;
                    *dst = strtod(v, &end);
                    if (end == v || *end != '\0' || !(*dst > 0) || !isfinite(*dst)) {
                        fprintf(stderr, "%s: %s: '%s' is not a positive number\n", cmd, strs[j], v);
                        return cli_usage_error(cmd);
                    }
                }
            }
        }
        if (matched && k < 0) {
            fprintf(stderr, "%s: %s needs a value\n", cmd, a);
            return cli_usage_error(cmd);
        }
        if (matched) continue;
        if (a[0] == '-' && a[1] != '\0') {
            /* A serve flag; a following word that is not an option is its value. */
            pass[o->n_serve_args++] = a;
            if (!strstr(a, "=") && i + 1 < argc && argv[i + 1][0] != '-') {
                pass[o->n_serve_args++] = argv[++i];
            }
            continue;
        }
        return cli_unexpected_arg(cmd, a);
    }

    if (!o->url == !o->model_path) {
        fprintf(stderr, "%s: %s\n", cmd,
                o->url ? "give either --url or -m, not both"
                       : "give -m MODEL (to start a server) or --url URL");
        return cli_usage_error(cmd);
    }
    if (o->url && o->n_serve_args > 0) {
        fprintf(stderr,
                "%s: '%s' is not a bench option (server flags need -m: with --url no "
                "server is started)\n",
                cmd, o->serve_args[0]);
        return cli_usage_error(cmd);
    }
    if (concurrency_given && o->rate > 0) {
        fprintf(stderr, "%s: give --concurrency or --rate, not both\n", cmd);
        return cli_usage_error(cmd);
    }
    if ((concurrency_given || o->rate > 0) && o->speedup > 0) {
        fprintf(stderr, "%s: give --speedup, --concurrency or --rate, only one\n", cmd);
        return cli_usage_error(cmd);
    }
    for (int j = 0; j < N_NUMS; j++) {
        if (o->trace && j < N_SYNTHETIC && given[j]) {
            fprintf(stderr, "%s: %s is for the synthetic workload, not --trace\n", cmd,
                    nums[j].name);
            return cli_usage_error(cmd);
        }
        if (!o->trace && j >= N_TRACE_FIRST && given[j]) {
            fprintf(stderr, "%s: %s needs --trace FILE\n", cmd, nums[j].name);
            return cli_usage_error(cmd);
        }
    }
    if (!o->trace && o->speedup > 0) {
        fprintf(stderr, "%s: --speedup needs --trace FILE\n", cmd);
        return cli_usage_error(cmd);
    }
    if (o->trace) {
        if (!concurrency_given) o->concurrency = 1; /* sequential: TTFT without queueing */
        return -1;
    }
    if (o->system_tokens + o->question_tokens == 0) {
        fprintf(stderr, "%s: the prompt is empty: give --system-tokens or --question-tokens\n",
                cmd);
        return cli_usage_error(cmd);
    }
    if (o->groups * o->prompts > 1000000 ||
        o->groups * o->prompts * (o->system_tokens + o->question_tokens) > (1ull << 28)) {
        fprintf(stderr,
                "%s: the workload is too big (at most 1,000,000 requests and 2^28 "
                "prompt tokens in all)\n",
                cmd);
        return cli_usage_error(cmd);
    }
    return -1;
}

/* Normalises a --url: drops trailing slashes and a trailing /v1. */
static char *base_url(const char *url)
{
    size_t n = strlen(url);
    char *s = malloc(n + 1);
    if (!s) return NULL;
    memcpy(s, url, n + 1);
    while (n > 0 && s[n - 1] == '/')
        s[--n] = '\0';
    if (n >= 3 && strcmp(s + n - 3, "/v1") == 0) {
        n -= 3;
        s[n] = '\0';
    }
    while (n > 0 && s[n - 1] == '/')
        s[--n] = '\0';
    return s;
}

/* ---- a trace ---- */

/* A trace read into memory: its lines as lg_trace_req, their ids in one array. */
typedef struct trace_buf {
    lg_trace_req *reqs; /* [n]; their ids set by trace_buf_link */
    size_t *off;        /* [n]: where each one's ids start in ids */
    uint32_t n, cap;
    uint64_t *ids;
    size_t n_ids, cap_ids;
} trace_buf;

static void trace_buf_deinit(trace_buf *t)
{
    free(t->reqs);
    free(t->off);
    free(t->ids);
    memset(t, 0, sizeof *t);
}

/* Appends one parsed line. Returns 0 or -1 (no memory). The reqs' ids point into t->ids
 * only once the whole trace is read (trace_buf_link): t->ids may move until then. */
static int trace_buf_add(trace_buf *t, const trace_req *r)
{
    if (t->n == t->cap) {
        uint32_t c = t->cap ? t->cap * 2 : 1024;
        lg_trace_req *p = realloc(t->reqs, (size_t)c * sizeof *p);
        size_t *q;
        if (!p) return -1;
        t->reqs = p;
        q = realloc(t->off, (size_t)c * sizeof *q);
        if (!q) return -1;
        t->off = q;
        t->cap = c;
    }
    if (t->n_ids + r->n_ids > t->cap_ids) {
        size_t c = t->cap_ids ? t->cap_ids : 16384;
        uint64_t *p;
        while (c < t->n_ids + r->n_ids)
            c *= 2;
        p = realloc(t->ids, c * sizeof *p);
        if (!p) return -1;
        t->ids = p;
        t->cap_ids = c;
    }
    memcpy(t->ids + t->n_ids, r->ids, r->n_ids * sizeof *r->ids);
    t->reqs[t->n].timestamp_ms = r->timestamp_ms;
    t->reqs[t->n].input_length = r->input_length;
    t->reqs[t->n].output_length = r->output_length;
    t->reqs[t->n].ids = NULL;
    t->reqs[t->n].n_ids = r->n_ids;
    t->off[t->n] = t->n_ids;
    t->n_ids += r->n_ids;
    t->n++;
    return 0;
}

static void trace_buf_link(trace_buf *t)
{
    for (uint32_t i = 0; i < t->n; i++)
        t->reqs[i].ids = t->ids + t->off[i];
}

/* Reads the first --trace-requests requests (all when 0) of --trace into t. Returns 0, or
 * -1 after a message (no file, a bad line, no request, no memory). */
static int read_trace(const lg_opts *o, trace_buf *t)
{
    FILE *f = strcmp(o->trace, "-") == 0 ? stdin : fopen(o->trace, "r");
    trace_req r;
    char *line = NULL, err[256];
    size_t cap = 0;
    ssize_t len;
    uint64_t lineno = 0;
    int rc = 0;

    memset(t, 0, sizeof *t);
    memset(&r, 0, sizeof r);
    if (!f) {
        fprintf(stderr, "%s: cannot open '%s': %s\n", o->cmd, o->trace, strerror(errno));
        return -1;
    }
    while (rc == 0 && (o->trace_requests == 0 || t->n < o->trace_requests)) {
        int k;
        len = getline(&line, &cap, f);
        if (len < 0) break;
        lineno++;
        k = trace_parse_line(line, (size_t)len, &r, err, sizeof err);
        if (k == TRACE_BLANK) continue;
        if (k == TRACE_BAD) {
            fprintf(stderr, "%s: %s:%llu: %s\n", o->cmd, o->trace, (unsigned long long)lineno, err);
            rc = -1;
        } else if (k == TRACE_NOMEM || trace_buf_add(t, &r) != 0) {
            fprintf(stderr, "%s: out of memory reading '%s'\n", o->cmd, o->trace);
            rc = -1;
        } else if (r.n_ids == 0 || r.input_length == 0) {
            fprintf(stderr, "%s: %s:%llu: a request without hash ids or input tokens\n", o->cmd,
                    o->trace, (unsigned long long)lineno);
            rc = -1;
        }
    }
    if (rc == 0 && ferror(f)) {
        fprintf(stderr, "%s: cannot read '%s'\n", o->cmd, o->trace);
        rc = -1;
    }
    if (rc == 0 && t->n == 0) {
        fprintf(stderr, "%s: '%s' holds no request\n", o->cmd, o->trace);
        rc = -1;
    }
    free(line);
    trace_req_deinit(&r);
    if (f != stdin) fclose(f);
    if (rc != 0) {
        trace_buf_deinit(t);
        return -1;
    }
    trace_buf_link(t);
    return 0;
}

/* Builds b->w from the trace t for the server info. Returns 0, or -1 after a message. */
static int trace_workload(const lg_opts *o, lg_bench *b, const trace_buf *t)
{
    lg_trace_params tp;
    memset(&tp, 0, sizeof tp);
    tp.block_tokens = (uint32_t)o->block_tokens;
    tp.n_vocab = b->info.n_vocab > LG_FIRST_ID ? b->info.n_vocab : 256;
    tp.tenants = (uint32_t)o->tenants;
    tp.max_output = (uint32_t)o->output_tokens;
    tp.n_ctx = b->info.n_ctx;
    tp.speedup = o->speedup;
    tp.seed = o->seed;
    if (tp.n_ctx && tp.n_ctx <= tp.max_output) {
        fprintf(stderr,
                "%s: --output-tokens %llu leaves no room for a prompt in the server's "
                "context of %u\n",
                o->cmd, (unsigned long long)o->output_tokens, tp.n_ctx);
        return -1;
    }
    if (lg_workload_from_trace(&b->w, &tp, t->reqs, t->n) != 0) {
        fprintf(stderr, "%s: %s\n", o->cmd,
                errno == ENOMEM ? "out of memory for the workload"
                                : "the trace is too big (at most 2^32 prompt tokens in all)");
        return -1;
    }
    if (b->w.n_truncated > 0) {
        fprintf(stderr,
                "%s: note: %u of %u prompts were cut to fit the server's context of %u "
                "(their prefixes kept)\n",
                o->cmd, b->w.n_truncated, b->w.n_requests, b->info.n_ctx);
    }
    return 0;
}

int cmd_bench(int argc, char **argv)
{
    lg_opts o;
    lg_bench b;
    lg_run_stats rs[2];
    trace_buf tb;
    char *url = NULL, auth[512];
    int n_runs, n_done = 0, failed = 0, rc;

    memset(&o, 0, sizeof o);
    memset(&b, 0, sizeof b);
    memset(rs, 0, sizeof rs);
    memset(&tb, 0, sizeof tb);
    o.cmd = argv[0];
    o.groups = 4;
    o.prompts = 8;
    o.system_tokens = 256;
    o.question_tokens = 32;
    o.output_tokens = 64;
    o.concurrency = 8;
    o.seed = 1;
    o.timeout_s = 600;
    o.compare = 1;
    o.ignore_eos = 1;
    o.block_tokens = 512;
    rc = parse_args(argc, argv, &o);
    if (rc >= 0) {
        free((void *)o.serve_args);
        return rc;
    }
    /* The trace is read before any server starts, so a bad file costs no start. */
    if (o.trace && read_trace(&o, &tb) != 0) {
        free((void *)o.serve_args);
        return CLI_EXIT_FAIL;
    }
    b.o = &o;
    if (o.url) {
        url = base_url(o.url);
        if (!url || !url[0]) {
            fprintf(stderr, "%s: --url: '%s' is not a URL\n", o.cmd, o.url);
            free(url);
            free((void *)o.serve_args);
            trace_buf_deinit(&tb);
            return url ? cli_usage_error(o.cmd) : CLI_EXIT_FAIL;
        }
        o.url = url;
    }
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "%s: libcurl failed to initialise\n", o.cmd);
        free(url);
        free((void *)o.serve_args);
        trace_buf_deinit(&tb);
        return CLI_EXIT_FAIL;
    }
    signal(SIGPIPE, SIG_IGN);
    b.hdrs = curl_slist_append(NULL, "Content-Type: application/json");
    b.hdrs = curl_slist_append(b.hdrs, "Expect:"); /* no 100-continue round trip */
    if (o.api_key) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", o.api_key);
        b.hdrs = curl_slist_append(b.hdrs, auth);
    }

    n_runs = o.url || !o.compare ? 1 : 2;
    for (int r = 0; r < n_runs && !failed; r++) {
        lg_run_stats *s = &rs[r];
        lg_server sv;
        lg_server_info info;
        const char *base = url;

        memset(&sv, 0, sizeof sv);
        sv.log_fd = -1;
        s->name = o.url ? "url" : r == 0 ? "prefix_cache" : "no_prefix_cache";
        s->prefix_cache = o.url ? -1 : r == 0;
        if (!o.url) {
            fprintf(stderr, "%s: run %d/%d (%s): starting pagoda serve -m %s\n", o.cmd, r + 1,
                    n_runs, r == 0 ? "prefix cache on" : "--no-prefix-cache", o.model_path);
            if (lg_server_start(&o, r == 0, &sv) != 0) {
                failed = 1;
                break;
            }
            base = sv.url;
        }
        if (lg_probe_models(&b, base, &info) != 0) {
            failed = 1;
        } else if (r == 0 && o.trace) {
            b.info = info;
            if (trace_workload(&o, &b, &tb) != 0) failed = 1;
        } else if (r == 0) {
            lg_workload_params wp;
            uint64_t need = o.system_tokens + o.question_tokens + o.output_tokens;
            b.info = info;
            if (info.n_ctx && need > info.n_ctx) {
                fprintf(stderr,
                        "%s: a request needs %llu tokens (system %llu + question %llu + output "
                        "%llu), more than the server's context of %u\n",
                        o.cmd, (unsigned long long)need, (unsigned long long)o.system_tokens,
                        (unsigned long long)o.question_tokens, (unsigned long long)o.output_tokens,
                        info.n_ctx);
                failed = 1;
            }
            memset(&wp, 0, sizeof wp);
            wp.groups = (uint32_t)o.groups;
            wp.prompts = (uint32_t)o.prompts;
            wp.system_tokens = (uint32_t)o.system_tokens;
            wp.question_tokens = (uint32_t)o.question_tokens;
            wp.n_vocab = info.n_vocab > LG_FIRST_ID ? info.n_vocab : 256;
            wp.seed = o.seed;
            if (!failed && lg_workload_init(&b.w, &wp) != 0) {
                fprintf(stderr, "%s: out of memory for the workload\n", o.cmd);
                failed = 1;
            }
        }
        if (!failed) {
            fprintf(stderr, "%s: sending %u requests to %s\n", o.cmd, b.w.n_requests, base);
            if (lg_run_workload(&b, base, s) != 0) {
                failed = 1;
            } else {
                n_done++;
                if (s->n_failed > 0) {
                    fprintf(stderr, "%s: %u of %u requests failed\n", o.cmd, s->n_failed,
                            s->n_requests);
                }
            }
        }
        if (!o.url && lg_server_stop(&o, &sv) != 0) failed = 1;
    }

    if (n_done == n_runs) {
        if (o.json) {
            lg_print_json(&o, &b, rs, n_runs);
        } else {
            lg_print_table(&o, &b, rs, n_runs);
        }
    }
    for (int r = 0; r < n_runs; r++) {
        if (rs[r].n_failed > 0) failed = 1;
        lg_run_stats_deinit(&rs[r]);
    }
    lg_workload_deinit(&b.w);
    trace_buf_deinit(&tb);
    curl_slist_free_all(b.hdrs);
    curl_global_cleanup();
    free(url);
    free((void *)o.serve_args);
    return failed ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}
