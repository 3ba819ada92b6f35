/* SPDX-License-Identifier: MIT */
/*
 * loadgen.h - the parts of `pagoda bench` (loadgen.c) that need no network, in
 * loadgen_util.c so tests/integration/test_loadgen_util.c can check them on their own:
 *
 *   lg_workload   the synthetic shared-prefix workload: G groups x P prompts, each prompt
 *                 = its group's system prompt (S token ids) + its own question (Q ids), in
 *                 a shuffled send order; deterministic from the seed. Or (--trace) one made
 *                 from a Mooncake trace: a prompt per line from its hash ids, each id a
 *                 block of token ids (lg_block_tokens), a tenant per conversation
 *   lg_arrivals   Poisson arrival times for --rate
 *   lg_sse        an incremental Server-Sent Events parser (bytes in, `data` payloads out)
 *   lg_metric     reads one sample from a Prometheus text exposition
 *   lg_summary    mean and p50/p90/p99 of a set of values
 *
 * Nothing here is thread-safe or needs to be: the bench runs its requests from one thread.
 *
 * The second part is what the bench's own files share (loadgen.c: the command line and
 * the runs; loadgen_curl.c: the libcurl driver; loadgen_spawn.c: the spawned servers;
 * loadgen_report.c: the table and JSON): the options, a run's figures, the servers. It
 * needs no libcurl header, so the tests can include this file alone.
 */
#ifndef PGD_TOOLS_LOADGEN_H
#define PGD_TOOLS_LOADGEN_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* ---- workload ---- */

typedef struct lg_workload_params {
    uint32_t groups;          /* G: distinct system prompts, >= 1 */
    uint32_t prompts;         /* P: prompts per group, >= 1 */
    uint32_t system_tokens;   /* S: tokens of each group's shared system prompt */
    uint32_t question_tokens; /* Q: tokens each prompt adds; S + Q >= 1 */
    uint32_t n_vocab;         /* ids are drawn from [LG_FIRST_ID, n_vocab); > LG_FIRST_ID */
    uint64_t seed;
} lg_workload_params;

/* Ids below this are left out: SentencePiece vocabularies put <unk> <s> </s> there. */
#define LG_FIRST_ID 3u

typedef struct lg_workload {
    uint32_t n_requests;    /* G * P */
    uint32_t prompt_tokens; /* S + Q, the same for every request; 0 when off is set */
    int32_t *tokens;        /* [n_requests][prompt_tokens], in send order */
    uint32_t *group;        /* [n_requests]: the group of each request */
    /* A trace workload (lg_workload_from_trace) sets these; the synthetic one leaves them
     * NULL. Read prompts with lg_workload_prompt either way. */
    uint64_t *off;        /* [n_requests + 1]: request i's tokens are tokens[off[i], off[i+1]) */
    uint32_t *max_tokens; /* [n_requests]: its max_tokens (NULL: the --output-tokens) */
    double *at_s;         /* [n_requests]: send times from the first, seconds (NULL: none) */
    int32_t *tenant;      /* [n_requests]: its tenant, 0..K-1 (NULL: no tenants) */
    uint32_t n_truncated; /* prompts cut to fit the context (their prefix kept) */
} lg_workload;

/* Fills w. Returns 0, or -1 when memory runs out or a parameter is out of range (w is
 * then empty). Request i of the send order is a shuffle (seeded) of the G x P pairs; the
 * tokens of a (group, prompt) pair depend on the seed and the pair only. */
int lg_workload_init(lg_workload *w, const lg_workload_params *p);
void lg_workload_deinit(lg_workload *w); /* zeroed or initialised w */

/* Returns request i's prompt (borrowed from w) and writes its length to *n_tokens. */
const int32_t *lg_workload_prompt(const lg_workload *w, uint32_t i, uint32_t *n_tokens);

/* ---- a workload from a trace ---- */

/* One line of a Mooncake trace (sim/trace.h parses them): ids borrowed for the call. */
typedef struct lg_trace_req {
    uint64_t timestamp_ms;
    uint64_t input_length;  /* prompt tokens: at most n_ids * block_tokens are used */
    uint64_t output_length; /* max_tokens, before the cap */
    const uint64_t *ids;    /* [n_ids] hash ids, one per block of block_tokens tokens */
    size_t n_ids;
} lg_trace_req;

typedef struct lg_trace_params {
    uint32_t block_tokens; /* tokens per hash id, >= 1 */
    uint32_t n_vocab;      /* ids are drawn from [LG_FIRST_ID, n_vocab); > LG_FIRST_ID */
    uint32_t tenants;      /* K: conversations map to K tenants; 0: no tenants */
    uint32_t max_output;   /* cap on max_tokens (output_length); 0: none */
    uint32_t n_ctx;        /* prompt + max_tokens <= n_ctx, the prompt cut; 0: no limit */
    double speedup;        /* > 0: at_s from the timestamps / speedup; 0: no at_s */
    uint64_t seed;
} lg_trace_params;

/* Writes block id's n token ids to out: a pure function of (seed, id), so equal ids give
 * equal tokens and a prompt built from a trace's ids shares exactly the trace's prefixes.
 * Ids are in [LG_FIRST_ID, n_vocab), n_vocab > LG_FIRST_ID. */
void lg_block_tokens(int32_t *out, uint32_t n, uint64_t id, uint32_t n_vocab, uint64_t seed);

/* Returns the tenant (0..k-1) of the conversation whose first hash id is first_id: a
 * pure function of (seed, first_id), about uniform over the tenants. k >= 1. */
uint32_t lg_tenant_of(uint64_t first_id, uint32_t k, uint64_t seed);

/* Fills w with r[n] in order: request i's prompt is the first input_length tokens of the
 * blocks of its ids (lg_block_tokens), cut to n_ctx - max_tokens when longer (counted in
 * n_truncated); max_tokens = output_length capped by max_output, at least 1; with tenants
 * K, tenant[i] = lg_tenant_of(ids[0], K, seed); with speedup, at_s[i] = (timestamp -
 * the first timestamp) / 1000 / speedup (0 for a timestamp before the first). w->group is
 * the tenant (0 without tenants). Returns 0, or -1 when memory runs out or a parameter is
 * out of range: no requests, a request without ids, input_length 0, n_ctx <= max_tokens,
 * more than 2^32 tokens in all (w is then empty). */
int lg_workload_from_trace(lg_workload *w, const lg_trace_params *p, const lg_trace_req *r,
                           uint32_t n);

/* Writes t[n]: arrival times in seconds of a Poisson process of rate req/s from 0: t[0] = 0,
 * then exponential gaps of mean 1/rate, deterministic from seed. */
void lg_arrivals(double *t, uint32_t n, double rate, uint64_t seed);

/* ---- Server-Sent Events ---- */

/* Called once per event that has data, with the event's data lines joined by '\n'
 * (NUL-terminated; borrowed for the call). A nonzero return stops the feed. */
typedef int (*lg_sse_fn)(void *user, const char *data, size_t len);

typedef struct lg_sse {
    char *line; /* the unfinished line */
    size_t line_len, line_cap;
    char *data; /* the data of the event being read */
    size_t data_len, data_cap;
    int have_data; /* a data field was seen in this event */
    int skip_lf;   /* the last byte was a CR: a following LF ends nothing */
} lg_sse;

/* Feeds n bytes (any split: lines and events may span calls). Lines end with LF, CR or
 * CRLF; a blank line dispatches the event; ':' lines are comments; fields other than
 * data are ignored. Returns 0, the callback's nonzero value, or -1 when memory runs out. */
int lg_sse_feed(lg_sse *s, const char *bytes, size_t n, lg_sse_fn fn, void *user);
void lg_sse_deinit(lg_sse *s); /* zeroed or used s; leaves it zeroed */

/* ---- Prometheus text ---- */

/* Sums the values of every sample of metric `name` (any labels) in a Prometheus text
 * exposition of len bytes (need not be NUL-terminated). Returns the number of samples
 * found (0: absent; *out is then 0). Comment lines and other names are skipped. */
int lg_metric(const char *text, size_t len, const char *name, double *out);

/* ---- summaries ---- */

typedef struct lg_summary {
    size_t n;
    double mean, p50, p90, p99; /* 0 when n == 0 */
} lg_summary;

/* Summarises v[n] (sorted in place). Percentiles interpolate linearly between closest
 * ranks (numpy's default), so p50 of {1, 2} is 1.5. */
lg_summary lg_summarize(double *v, size_t n);

/* The p-th percentile (0..100) of sorted v[n]; 0 when n == 0. */
double lg_percentile(const double *v, size_t n, double p);

/* ==== the bench's own files ==== */

struct curl_slist;

#define LG_MAX_ERR_KINDS 8 /* failure kinds kept per run; the last slot collects the rest */

/* The command line (loadgen.c). */
typedef struct lg_opts {
    const char *cmd;
    const char *url;        /* --url: run once against it */
    const char *model_path; /* -m: spawn `pagoda serve -m` */
    const char *model_name; /* --model-name: the request's "model" */
    const char *api_key;
    uint64_t groups, prompts, system_tokens, question_tokens, output_tokens;
    uint64_t concurrency, seed, timeout_s;
    double rate;       /* req/s; 0: fixed concurrency */
    const char *trace; /* --trace FILE: the workload from a trace (NULL: synthetic) */
    uint64_t block_tokens, tenants, trace_requests; /* --output-tokens caps max_tokens */
    double speedup; /* --speedup: send at the trace's timestamps / speedup; 0: not */
    int json, compare, ignore_eos;
    const char **serve_args; /* passed through to `pagoda serve` */
    int n_serve_args;
} lg_opts;

typedef struct lg_err_kind {
    char key[32];    /* "connect", "http_429", ... */
    uint32_t count;  /* requests that failed so */
    char first[512]; /* the first such failure's message */
} lg_err_kind;

/* One run of the workload against one server: its figures. */
typedef struct lg_run_stats {
    const char *name; /* "prefix_cache", "no_prefix_cache", "url" */
    int prefix_cache; /* 1, 0; -1: unknown (--url) */
    uint32_t n_requests, n_ok, n_failed;
    double duration_s;
    uint64_t prompt_tokens, cached_tokens, completion_tokens;
    uint32_t n_cached_reported; /* ok requests whose usage had cached_tokens */
    double *ttft;               /* [n_ok] seconds */
    size_t n_ttft;
    double *itl; /* seconds, every gap of every ok request */
    size_t n_itl, cap_itl;
    lg_summary ttft_s, itl_s;
    int have_kv; /* the server exposed a KV usage */
    double kv_usage_peak;
    double kv_pages_peak; /* pages used at the sampled peak; -1: unknown */
    int have_computed;    /* the server exposed its computed prompt tokens */
    double prompt_computed;
    lg_err_kind errs[LG_MAX_ERR_KINDS];
    uint32_t n_errs;
} lg_run_stats;

/* What GET /v1/models said. */
typedef struct lg_server_info {
    char model_id[256]; /* "" when unknown */
    uint32_t n_vocab;   /* 0: unknown */
    uint32_t n_ctx;     /* 0: unknown */
} lg_server_info;

/* What every request of a bench needs. */
typedef struct lg_bench {
    const lg_opts *o;
    lg_server_info info;
    lg_workload w;
    struct curl_slist *hdrs; /* Content-Type, Authorization, no Expect */
} lg_bench;

/* A spawned `pagoda serve`. */
typedef struct lg_server {
    pid_t pid;     /* 0: none */
    int log_fd;    /* its stdout and stderr (an unlinked temporary file) */
    char url[256]; /* http://HOST:PORT from its ready line */
} lg_server;

/* ---- loadgen_curl.c ---- */

/* Reads the first model of GET /v1/models: its id and, from pagoda's extension
 * "pagoda": {"n_vocab", "n_ctx"} (or vLLM's "max_model_len"), the vocabulary and context
 * sizes. Returns 0, or -1 after a message when the server cannot be reached at all. A
 * server without the route (or with another shape) leaves the fields unknown. */
int lg_probe_models(lg_bench *b, const char *base, lg_server_info *info);
/* Runs the workload against the server at base; fills rs. Returns 0, or -1 when the
 * client itself ran out of memory before it could start. */
int lg_run_workload(lg_bench *b, const char *base, lg_run_stats *rs);
/* Frees what a run allocated (zeroed or filled rs). */
void lg_run_stats_deinit(lg_run_stats *rs);

/* ---- loadgen_spawn.c ---- */

/* Starts `pagoda serve -m MODEL --host 127.0.0.1 --port 0 [passed flags]
 * [--no-prefix-cache]` and waits for its ready line. Returns 0, or -1 after printing why
 * (with the server's last output lines). */
int lg_server_start(const lg_opts *o, int prefix_cache, lg_server *sv);
/* Stops the server (SIGTERM, then SIGKILL after 20 s) and closes its log. Returns 0 when
 * it was running and exited with status 0, -1 (after a message and its last output)
 * otherwise. */
int lg_server_stop(const lg_opts *o, lg_server *sv);

/* ---- loadgen_report.c ---- */

/* Prints the n (1 or 2) runs rs as the table / as one JSON object on stdout. */
void lg_print_table(const lg_opts *o, const lg_bench *b, const lg_run_stats *rs, int n);
void lg_print_json(const lg_opts *o, const lg_bench *b, const lg_run_stats *rs, int n);

#endif /* PGD_TOOLS_LOADGEN_H */
