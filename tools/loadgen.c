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
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>

#include "cli.h"
#include "loadgen.h"

/* Metric names of `pagoda serve` (server/metrics.c). */
#define M_KV_USAGE "pagoda_kv_usage_ratio"
#define M_KV_USED "pagoda_kv_pages_used"
#define M_KV_TOTAL "pagoda_kv_pages_total"
#define M_PROMPT_COMPUTED "pagoda_prompt_tokens_computed_total"
#define M_CONTEXT "pagoda_context_tokens"

#define METRICS_PERIOD_S 0.010
#define START_TIMEOUT_S 300.0 /* a multi-GB model may take a while to map and warm */
#define STOP_TIMEOUT_S 20.0
#define MAX_ERR_KINDS 8
#define MAX_ERRBODY 4096

typedef struct opts {
    const char *cmd;
    const char *url;        /* --url: run once against it */
    const char *model_path; /* -m: spawn `pagoda serve -m` */
    const char *model_name; /* --model-name: the request's "model" */
    const char *api_key;
    uint64_t groups, prompts, system_tokens, question_tokens, output_tokens;
    uint64_t concurrency, seed, timeout_s;
    double rate; /* req/s; 0: fixed concurrency */
    int json, compare, ignore_eos;
    const char **serve_args; /* passed through to `pagoda serve` */
    int n_serve_args;
} opts;

typedef struct err_kind {
    char key[32];    /* "connect", "http_429", ... */
    uint32_t count;  /* requests that failed so */
    char first[512]; /* the first such failure's message */
} err_kind;

/* One run of the workload against one server. */
typedef struct run_stats {
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
    err_kind errs[MAX_ERR_KINDS];
    uint32_t n_errs;
} run_stats;

/* What GET /v1/models said. */
typedef struct server_info {
    char model_id[256]; /* "" when unknown */
    uint32_t n_vocab;   /* 0: unknown */
    uint32_t n_ctx;     /* 0: unknown */
} server_info;

typedef struct bench {
    const opts *o;
    server_info info;
    lg_workload w;
    struct curl_slist *hdrs; /* Content-Type, Authorization, no Expect */
} bench;

typedef struct req {
    bench *b;
    CURL *h;
    char *body;
    double t_start, t_last;
    double ttft;
    uint32_t n_tokens; /* SSE chunks that carried text */
    double *itl;       /* [n_tokens - 1] */
    size_t cap_itl;
    int done; /* data: [DONE] seen */
    int have_usage, have_cached;
    uint64_t prompt_tokens, cached_tokens, completion_tokens;
    int oom;
    char stream_err[512]; /* an "error" object inside the stream */
    char errbuf[CURL_ERROR_SIZE];
    char *errbody; /* the body of a non-200 answer (first MAX_ERRBODY bytes) */
    size_t errbody_len;
    lg_sse sse;
} req;

/* A growable byte buffer for whole (small) responses. */
typedef struct buf {
    char *p;
    size_t len, cap;
} buf;

static double now_s(void)
{
    return cli_now_s();
}

static void sleep_s(double s)
{
    struct timespec ts;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    nanosleep(&ts, NULL);
}

/* ---- errors by kind ---- */

static void add_err(run_stats *rs, const char *key, const char *msg)
{
    err_kind *e = NULL;
    rs->n_failed++;
    for (uint32_t i = 0; i < rs->n_errs; i++) {
        if (strcmp(rs->errs[i].key, key) == 0) e = &rs->errs[i];
    }
    if (!e) {
        /* More kinds than slots: the last slot collects the rest. */
        e = &rs->errs[rs->n_errs < MAX_ERR_KINDS ? rs->n_errs++ : MAX_ERR_KINDS - 1];
        if (e->count == 0) {
            snprintf(e->key, sizeof e->key, "%s", key);
            snprintf(e->first, sizeof e->first, "%s", msg);
        }
    }
    e->count++;
}

/* ---- blocking requests (models, metrics) ---- */

static size_t on_buf(char *ptr, size_t size, size_t nmemb, void *user)
{
    buf *b = user;
    size_t n = size * nmemb;
    if (b->len + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 4096;
        char *p;
        while (c < b->len + n + 1)
            c *= 2;
        p = realloc(b->p, c);
        if (!p) return 0;
        b->p = p;
        b->cap = c;
    }
    memcpy(b->p + b->len, ptr, n);
    b->len += n;
    b->p[b->len] = '\0';
    return n;
}

/* Sets up h to GET base+path into out (reset first). */
static void setup_get(bench *b, CURL *h, const char *base, const char *path, buf *out, char *url,
                      size_t url_len, char *errbuf)
{
    snprintf(url, url_len, "%s%s", base, path);
    out->len = 0;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, b->hdrs);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_buf);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, out);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 30L);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    errbuf[0] = '\0';
}

/* GETs base+path; returns the HTTP status (body in out), or -1 after writing the
 * transfer's error into msg. */
static long http_get(bench *b, const char *base, const char *path, buf *out, char *msg,
                     size_t msg_len)
{
    char url[1024], errbuf[CURL_ERROR_SIZE];
    CURL *h = curl_easy_init();
    CURLcode cc;
    long code = -1;

    if (!h) {
        snprintf(msg, msg_len, "curl_easy_init failed");
        return -1;
    }
    setup_get(b, h, base, path, out, url, sizeof url, errbuf);
    cc = curl_easy_perform(h);
    if (cc != CURLE_OK) {
        snprintf(msg, msg_len, "%s", errbuf[0] ? errbuf : curl_easy_strerror(cc));
    } else {
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    }
    curl_easy_cleanup(h);
    return code;
}

/* Reads the first model of GET /v1/models: its id and, from pagoda's extension
 * "pagoda": {"n_vocab", "n_ctx"} (or vLLM's "max_model_len"), the vocabulary and context
 * sizes. Returns 0, or -1
 * after a message when the server cannot be reached at all. A server without the route
 * (or with another shape) leaves the fields unknown. */
static int probe_models(bench *b, const char *base, server_info *info)
{
    buf out = {0};
    char msg[512];
    long code = http_get(b, base, "/v1/models", &out, msg, sizeof msg);
    json_t *o, *m, *ext, *v;

    memset(info, 0, sizeof *info);
    if (code < 0) {
        fprintf(stderr, "%s: cannot reach %s: %s\n", b->o->cmd, base, msg);
        free(out.p);
        return -1;
    }
    if (code != 200) {
        fprintf(stderr, "%s: note: GET %s/v1/models answered %ld; token ids stay below 256\n",
                b->o->cmd, base, code);
        free(out.p);
        return 0;
    }
    o = json_loadb(out.p ? out.p : "", out.len, 0, NULL);
    m = json_array_get(json_object_get(o, "data"), 0);
    v = json_object_get(m, "id");
    if (json_is_string(v))
        snprintf(info->model_id, sizeof info->model_id, "%s", json_string_value(v));
    ext = json_object_get(m, "pagoda");
    v = json_object_get(ext, "n_vocab");
    if (json_is_integer(v) && json_integer_value(v) > 0 && json_integer_value(v) < (1 << 30)) {
        info->n_vocab = (uint32_t)json_integer_value(v);
    }
    v = json_object_get(ext, "n_ctx");
    if (!json_is_integer(v)) v = json_object_get(m, "max_model_len"); /* vLLM's name */
    if (json_is_integer(v) && json_integer_value(v) > 0 && json_integer_value(v) < (1 << 30)) {
        info->n_ctx = (uint32_t)json_integer_value(v);
    }
    json_decref(o);
    /* No "pagoda" extension in /v1/models: pagoda's /metrics also tells the context. */
    if (info->n_ctx == 0 && http_get(b, base, "/metrics", &out, msg, sizeof msg) == 200 && out.p) {
        double ctx = 0;
        if (lg_metric(out.p, out.len, M_CONTEXT, &ctx) > 0 && ctx >= 1 && ctx < (1 << 30)) {
            info->n_ctx = (uint32_t)ctx;
        }
    }
    free(out.p);
    return 0;
}

/* Metric figures of one /metrics text. Returns 1 when it has pagoda_ names. */
static int read_metrics(const buf *m, double *kv_usage, double *kv_pages, int *have_kv,
                        double *computed, int *have_computed)
{
    double used = -1, total;
    if (!m->p || !strstr(m->p, "pagoda_")) return 0;
    *have_kv = 0;
    if (lg_metric(m->p, m->len, M_KV_USED, &used) == 0) used = -1;
    *kv_pages = used;
    if (lg_metric(m->p, m->len, M_KV_USAGE, kv_usage) > 0) {
        *have_kv = 1;
    } else if (used >= 0 && lg_metric(m->p, m->len, M_KV_TOTAL, &total) > 0 && total > 0) {
        *kv_usage = used / total;
        *have_kv = 1;
    }
    *have_computed = lg_metric(m->p, m->len, M_PROMPT_COMPUTED, computed) > 0;
    return 1;
}

/* ---- one streamed completion ---- */

static void req_cleanup(req *r)
{
    if (r->h) curl_easy_cleanup(r->h);
    free(r->body);
    free(r->itl);
    free(r->errbody);
    lg_sse_deinit(&r->sse);
    memset(r, 0, sizeof *r);
}

static void token_event(req *r)
{
    double t = now_s();
    if (r->n_tokens == 0) {
        r->ttft = t - r->t_start;
    } else {
        if (r->n_tokens > r->cap_itl) {
            size_t c = r->cap_itl ? r->cap_itl * 2 : 64;
            double *p = realloc(r->itl, c * sizeof *p);
            if (!p) {
                r->oom = 1;
                return;
            }
            r->itl = p;
            r->cap_itl = c;
        }
        r->itl[r->n_tokens - 1] = t - r->t_last;
    }
    r->t_last = t;
    r->n_tokens++;
}

static uint64_t get_count(json_t *o, const char *key, int *have)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0) return 0;
    *have = 1;
    return (uint64_t)json_integer_value(v);
}

/* One SSE event of a completion stream. */
static int on_event(void *user, const char *data, size_t len)
{
    req *r = user;
    json_t *o, *c0, *text, *usage, *err;
    json_error_t je;

    if (strcmp(data, "[DONE]") == 0) {
        r->done = 1;
        return 0;
    }
    o = json_loadb(data, len, JSON_ALLOW_NUL, &je); /* "\u0000" is valid JSON */
    if (!json_is_object(o)) {
        if (!r->stream_err[0]) {
            snprintf(r->stream_err, sizeof r->stream_err,
                     "an event is not a JSON object (%.100s at byte %d): %.60s",
                     o ? "not an object" : je.text, o ? 0 : je.position, data);
        }
        json_decref(o);
        return 0;
    }
    err = json_object_get(o, "error");
    if (err && !r->stream_err[0]) {
        json_t *m = json_object_get(err, "message");
        snprintf(r->stream_err, sizeof r->stream_err, "error in the stream: %s",
                 json_is_string(m) ? json_string_value(m) : "(no message)");
    }
    c0 = json_array_get(json_object_get(o, "choices"), 0);
    text = json_object_get(c0, "text");
    if (!text) text = json_object_get(json_object_get(c0, "delta"), "content");
    if (json_is_string(text)) {
        /* A closing chunk (empty text with a finish_reason) carries no token. */
        json_t *fin = json_object_get(c0, "finish_reason");
        if (json_string_length(text) > 0 || !fin || json_is_null(fin)) token_event(r);
    }
    usage = json_object_get(o, "usage");
    if (json_is_object(usage)) {
        int have = 0, have_cached = 0;
        r->prompt_tokens = get_count(usage, "prompt_tokens", &have);
        r->completion_tokens = get_count(usage, "completion_tokens", &have);
        r->cached_tokens = get_count(json_object_get(usage, "prompt_tokens_details"),
                                     "cached_tokens", &have_cached);
        r->have_usage = have;
        r->have_cached = have_cached;
    }
    json_decref(o);
    return 0;
}

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *user)
{
    req *r = user;
    size_t n = size * nmemb;
    long code = 0;

    curl_easy_getinfo(r->h, CURLINFO_RESPONSE_CODE, &code);
    if (code != 200) {
        size_t k = r->errbody_len + n > MAX_ERRBODY ? MAX_ERRBODY - r->errbody_len : n;
        if (!r->errbody) r->errbody = malloc(MAX_ERRBODY + 1);
        if (!r->errbody) return 0;
        memcpy(r->errbody + r->errbody_len, ptr, k);
        r->errbody_len += k;
        r->errbody[r->errbody_len] = '\0';
        return n;
    }
    if (lg_sse_feed(&r->sse, ptr, n, on_event, r) != 0 || r->oom) {
        r->oom = 1;
        return 0;
    }
    return n;
}

/* Builds request i's body and handle and adds it to m. Returns 0 or -1 (no memory). */
static int req_start(bench *b, CURLM *m, req *r, uint32_t i, const char *url)
{
    const opts *o = b->o;
    json_t *body = json_object(), *prompt = json_array(), *so = json_object();
    const int32_t *t = b->w.tokens + (size_t)i * b->w.prompt_tokens;
    int bad = !body || !prompt || !so;

    memset(r, 0, sizeof *r);
    r->b = b;
    for (uint32_t k = 0; !bad && k < b->w.prompt_tokens; k++) {
        bad = json_array_append_new(prompt, json_integer(t[k])) != 0;
    }
    if (!bad) {
        const char *name = o->model_name ? o->model_name : b->info.model_id;
        if (name[0]) json_object_set_new(body, "model", json_string(name));
        json_object_set(body, "prompt", prompt);
        json_object_set_new(body, "max_tokens", json_integer((json_int_t)o->output_tokens));
        json_object_set_new(body, "temperature", json_integer(0));
        json_object_set_new(body, "stream", json_true());
        json_object_set_new(so, "include_usage", json_true());
        json_object_set(body, "stream_options", so);
        if (o->ignore_eos) json_object_set_new(body, "ignore_eos", json_true());
        r->body = json_dumps(body, JSON_COMPACT);
    }
    json_decref(prompt);
    json_decref(so);
    json_decref(body);
    r->h = r->body ? curl_easy_init() : NULL;
    if (!r->h) {
        req_cleanup(r);
        return -1;
    }
    curl_easy_setopt(r->h, CURLOPT_URL, url);
    curl_easy_setopt(r->h, CURLOPT_HTTPHEADER, b->hdrs);
    curl_easy_setopt(r->h, CURLOPT_POSTFIELDS, r->body);
    curl_easy_setopt(r->h, CURLOPT_POSTFIELDSIZE, (long)strlen(r->body));
    curl_easy_setopt(r->h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(r->h, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(r->h, CURLOPT_PRIVATE, r);
    curl_easy_setopt(r->h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(r->h, CURLOPT_TIMEOUT, (long)o->timeout_s);
    curl_easy_setopt(r->h, CURLOPT_ERRORBUFFER, r->errbuf);
    r->t_start = now_s();
    if (curl_multi_add_handle(m, r->h) != CURLM_OK) {
        req_cleanup(r);
        return -1;
    }
    return 0;
}

/* Files a finished request's figures or failure into rs. */
static void req_finish(run_stats *rs, req *r, CURLcode cc)
{
    char key[32], msg[300];
    long code = 0;

    curl_easy_getinfo(r->h, CURLINFO_RESPONSE_CODE, &code);
    if (cc != CURLE_OK && !(cc == CURLE_WRITE_ERROR && r->oom)) {
        const char *k = cc == CURLE_COULDNT_CONNECT           ? "connect"
                        : cc == CURLE_OPERATION_TIMEDOUT      ? "timeout"
                        : cc == CURLE_GOT_NOTHING             ? "no_response"
                        : cc == CURLE_RECV_ERROR || code == 0 ? "transfer"
                                                              : "stream_broken";
        snprintf(msg, sizeof msg, "%s", r->errbuf[0] ? r->errbuf : curl_easy_strerror(cc));
        add_err(rs, k, msg);
        return;
    }
    if (r->oom) {
        add_err(rs, "client_memory", "out of memory reading the stream");
        return;
    }
    if (code != 200) {
        json_t *o = r->errbody ? json_loads(r->errbody, 0, NULL) : NULL;
        json_t *m = json_object_get(json_object_get(o, "error"), "message");
        snprintf(key, sizeof key, "http_%ld", code);
        snprintf(msg, sizeof msg, "HTTP %ld: %.200s", code,
                 json_is_string(m) ? json_string_value(m)
                 : r->errbody      ? r->errbody
                                   : "");
        json_decref(o);
        add_err(rs, key, msg);
        return;
    }
    if (r->stream_err[0]) {
        add_err(rs, "stream_error", r->stream_err);
        return;
    }
    if (!r->done) {
        add_err(rs, "incomplete", "the stream ended without data: [DONE]");
        return;
    }
    rs->n_ok++;
    rs->prompt_tokens += r->have_usage ? r->prompt_tokens : r->b->w.prompt_tokens;
    rs->completion_tokens += r->have_usage ? r->completion_tokens : r->n_tokens;
    if (r->have_cached) {
        rs->cached_tokens += r->cached_tokens;
        rs->n_cached_reported++;
    }
    if (r->n_tokens > 0) rs->ttft[rs->n_ttft++] = r->ttft;
    if (r->n_tokens > 1) {
        size_t k = r->n_tokens - 1;
        if (rs->n_itl + k > rs->cap_itl) {
            size_t c = rs->cap_itl ? rs->cap_itl : 1024;
            double *p;
            while (c < rs->n_itl + k)
                c *= 2;
            p = realloc(rs->itl, c * sizeof *p);
            if (!p) return; /* the ITL figures then miss this request */
            rs->itl = p;
            rs->cap_itl = c;
        }
        memcpy(rs->itl + rs->n_itl, r->itl, k * sizeof *r->itl);
        rs->n_itl += k;
    }
}

/* ---- one run ---- */

/* The /metrics sampler: one GET at a time, every METRICS_PERIOD_S, in the same multi. */
typedef struct sampler {
    CURL *h;
    buf out;
    char url[1024];
    char errbuf[CURL_ERROR_SIZE];
    int busy;
    double next_at;
} sampler;

static void note_kv(run_stats *rs, const buf *m)
{
    double kv, pages, c;
    int have_kv = 0, have_c;
    if (read_metrics(m, &kv, &pages, &have_kv, &c, &have_c) && have_kv) {
        if (!rs->have_kv || kv > rs->kv_usage_peak) {
            rs->kv_usage_peak = kv;
            rs->kv_pages_peak = pages;
        }
        rs->have_kv = 1;
    }
}

/* Runs the workload against the server at base; fills rs. Returns 0, or -1 when the
 * client itself ran out of memory before it could start. */
static int run_workload(bench *b, const char *base, run_stats *rs)
{
    const opts *o = b->o;
    uint32_t n = b->w.n_requests, next = 0, active = 0, done = 0;
    req *reqs = calloc(n, sizeof *reqs);
    double *arr = o->rate > 0 ? malloc(n * sizeof *arr) : NULL;
    CURLM *m = curl_multi_init();
    sampler sm;
    buf mbuf = {0};
    char url[1024], emsg[512];
    double t0, t_end, kv, pages, c0 = 0.0, c1 = 0.0;
    int have_kv = 0, have_c0 = 0, have_c1 = 0, metrics = 0, rc = -1;

    memset(&sm, 0, sizeof sm);
    rs->n_requests = n;
    rs->ttft = malloc((size_t)n * sizeof *rs->ttft);
    if (!reqs || !m || !rs->ttft || (o->rate > 0 && !arr)) goto out;
    if (arr) lg_arrivals(arr, n, o->rate, o->seed);
    snprintf(url, sizeof url, "%s/v1/completions", base);

    /* /metrics before the run: does the server have pagoda_ names, and where does its
     * computed-prompt-token counter start. */
    if (http_get(b, base, "/metrics", &mbuf, emsg, sizeof emsg) == 200 &&
        read_metrics(&mbuf, &kv, &pages, &have_kv, &c0, &have_c0)) {
        metrics = 1;
        note_kv(rs, &mbuf);
        sm.h = curl_easy_init();
    }

    t0 = now_s();
    t_end = t0;
    while (done < n) {
        double t = now_s(), wait_s = 0.1;
        int running = 0;

        while (next < n) {
            if (arr ? t - t0 < arr[next] : active >= o->concurrency) break;
            if (req_start(b, m, &reqs[next], next, url) != 0) {
                add_err(rs, "client_memory", "out of memory building a request");
                done++;
            } else {
                active++;
            }
            next++;
        }
        if (sm.h && !sm.busy && t >= sm.next_at) {
            setup_get(b, sm.h, base, "/metrics", &sm.out, sm.url, sizeof sm.url, sm.errbuf);
            sm.busy = curl_multi_add_handle(m, sm.h) == CURLM_OK;
            sm.next_at = t + METRICS_PERIOD_S;
        }
        curl_multi_perform(m, &running);
        for (;;) {
            int left = 0;
            CURLMsg *msg = curl_multi_info_read(m, &left);
            CURL *h;
            CURLcode cc;
            char *priv = NULL;
            long code = 0;

            if (!msg) break;
            if (msg->msg != CURLMSG_DONE) continue;
            h = msg->easy_handle;
            cc = msg->data.result;
            curl_multi_remove_handle(m, h);
            if (h == sm.h) {
                sm.busy = 0;
                curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
                if (cc == CURLE_OK && code == 200) note_kv(rs, &sm.out);
                continue;
            }
            curl_easy_getinfo(h, CURLINFO_PRIVATE, &priv);
            req_finish(rs, (req *)(void *)priv, cc);
            req_cleanup((req *)(void *)priv);
            active--;
            done++;
            t_end = now_s();
        }
        if (done == n) break;
        t = now_s();
        if (arr && next < n && t0 + arr[next] - t < wait_s) wait_s = t0 + arr[next] - t;
        if (sm.h && !sm.busy && sm.next_at - t < wait_s) wait_s = sm.next_at - t;
        if (wait_s > 0) curl_multi_poll(m, NULL, 0, (int)ceil(wait_s * 1000.0), NULL);
    }
    rs->duration_s = t_end - t0;
    if (sm.busy) curl_multi_remove_handle(m, sm.h);

    /* /metrics after: the computed-prompt-token counter's end, a last KV sample. */
    if (metrics && http_get(b, base, "/metrics", &mbuf, emsg, sizeof emsg) == 200 &&
        read_metrics(&mbuf, &kv, &pages, &have_kv, &c1, &have_c1)) {
        note_kv(rs, &mbuf);
        if (have_c0 && have_c1) {
            rs->have_computed = 1;
            rs->prompt_computed = c1 - c0;
        }
    }
    rs->ttft_s = lg_summarize(rs->ttft, rs->n_ttft);
    rs->itl_s = lg_summarize(rs->itl, rs->n_itl);
    rc = 0;
out:
    if (rc != 0) fprintf(stderr, "%s: out of memory\n", o->cmd);
    for (uint32_t i = 0; reqs && i < n; i++) {
        if (reqs[i].h) {
            curl_multi_remove_handle(m, reqs[i].h);
            req_cleanup(&reqs[i]);
        }
    }
    if (sm.h) curl_easy_cleanup(sm.h);
    free(sm.out.p);
    free(mbuf.p);
    if (m) curl_multi_cleanup(m);
    free(reqs);
    free(arr);
    return rc;
}

static void run_stats_deinit(run_stats *rs)
{
    free(rs->ttft);
    free(rs->itl);
}

/* ---- the spawned server ---- */

typedef struct server {
    pid_t pid;     /* 0: none */
    int log_fd;    /* its stdout and stderr (an unlinked temporary file) */
    char url[256]; /* http://HOST:PORT from its ready line */
} server;

/* Prints the last lines of the server's output, indented, on stderr. */
static void print_log_tail(const server *sv)
{
    char text[4096];
    struct stat st;
    off_t from = 0;
    ssize_t n;
    const char *p;
    int lines = 0;

    if (sv->log_fd < 0 || fstat(sv->log_fd, &st) != 0) return;
    if (st.st_size > (off_t)sizeof text - 1) from = st.st_size - (off_t)(sizeof text - 1);
    n = pread(sv->log_fd, text, sizeof text - 1, from);
    if (n <= 0) {
        fprintf(stderr, "  (the server wrote nothing)\n");
        return;
    }
    text[n] = '\0';
    /* Keep the last 20 lines. */
    p = text + n;
    while (p > text && lines <= 20) {
        p--;
        if (*p == '\n' && p + 1 < text + n) lines++;
    }
    if (*p == '\n') p++;
    fprintf(stderr, "  --- the server's output (last lines) ---\n");
    while (*p) {
        const char *nl = strchr(p, '\n');
        int len = nl ? (int)(nl - p) : (int)strlen(p);
        fprintf(stderr, "  | %.*s\n", len, p);
        p += len + (nl ? 1 : 0);
    }
}

/* Finds "listening on http://HOST:PORT\n" in the server's output so far. 1: found. */
static int find_ready(server *sv)
{
    char text[16384];
    ssize_t n = pread(sv->log_fd, text, sizeof text - 1, 0);
    const char *p, *e;

    if (n <= 0) return 0;
    text[n] = '\0';
    p = strstr(text, "listening on http://");
    if (!p) return 0;
    p += strlen("listening on ");
    e = p;
    while (*e && *e != '\n' && *e != '\r' && *e != ' ')
        e++;
    if (*e == '\0' || e - p >= (ptrdiff_t)sizeof sv->url) return 0; /* the line is not whole yet */
    memcpy(sv->url, p, (size_t)(e - p));
    sv->url[e - p] = '\0';
    while (e > p && sv->url[e - p - 1] == '/') {
        sv->url[e - p - 1] = '\0';
        e--;
    }
    return 1;
}

/* Starts `pagoda serve -m MODEL --host 127.0.0.1 --port 0 [passed flags]
 * [--no-prefix-cache]` and waits for its ready line. Returns 0, or -1 after printing why
 * (with the server's last output lines). */
static int server_start(const opts *o, int prefix_cache, server *sv)
{
    const char **argv = calloc((size_t)o->n_serve_args + 16, sizeof *argv);
    char tmpl[] = "/tmp/pagoda-bench-XXXXXX";
    double deadline;
    int n = 0, st;

    memset(sv, 0, sizeof *sv);
    sv->log_fd = -1;
    if (!argv) {
        fprintf(stderr, "%s: out of memory\n", o->cmd);
        return -1;
    }
    argv[n++] = "pagoda";
    argv[n++] = "serve";
    argv[n++] = "-m";
    argv[n++] = o->model_path;
    argv[n++] = "--host";
    argv[n++] = "127.0.0.1";
    argv[n++] = "--port";
    argv[n++] = "0";
    if (o->api_key) {
        argv[n++] = "--api-key";
        argv[n++] = o->api_key;
    }
    for (int i = 0; i < o->n_serve_args; i++)
        argv[n++] = o->serve_args[i];
    if (!prefix_cache) argv[n++] = "--no-prefix-cache";
    argv[n] = NULL;

    sv->log_fd = mkstemp(tmpl);
    if (sv->log_fd < 0) {
        fprintf(stderr, "%s: cannot create a log file in /tmp: %s\n", o->cmd, strerror(errno));
        free(argv);
        return -1;
    }
    unlink(tmpl);
    fflush(NULL);
    sv->pid = fork();
    if (sv->pid < 0) {
        fprintf(stderr, "%s: fork: %s\n", o->cmd, strerror(errno));
        sv->pid = 0;
        free(argv);
        return -1;
    }
    if (sv->pid == 0) {
        /* The child: only async-signal-safe calls until exec. The server dies with us. */
        int devnull = open("/dev/null", O_RDONLY);
        static const char msg[] = "pagoda bench: cannot exec /proc/self/exe\n";
        if (devnull >= 0) dup2(devnull, 0);
        dup2(sv->log_fd, 1);
        dup2(sv->log_fd, 2);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        execv("/proc/self/exe", (char *const *)argv);
        if (write(2, msg, sizeof msg - 1) < 0) _exit(127);
        _exit(127);
    }
    free(argv);

    deadline = now_s() + START_TIMEOUT_S;
    for (;;) {
        if (find_ready(sv)) return 0;
        if (waitpid(sv->pid, &st, WNOHANG) == sv->pid) {
            sv->pid = 0;
            if (WIFEXITED(st)) {
                fprintf(stderr, "%s: pagoda serve exited with status %d before it was ready\n",
                        o->cmd, WEXITSTATUS(st));
            } else {
                fprintf(stderr, "%s: pagoda serve died of signal %d before it was ready\n", o->cmd,
                        WIFSIGNALED(st) ? WTERMSIG(st) : 0);
            }
            print_log_tail(sv);
            return -1;
        }
        if (now_s() > deadline) {
            fprintf(stderr, "%s: pagoda serve printed no ready line in %.0f s\n", o->cmd,
                    START_TIMEOUT_S);
            print_log_tail(sv);
            return -1;
        }
        sleep_s(0.02);
    }
}

/* Stops the server (SIGTERM, then SIGKILL after STOP_TIMEOUT_S). Returns 0 when it was
 * running and exited with status 0, -1 (after a message and its last output) otherwise. */
static int server_stop(const opts *o, server *sv)
{
    double deadline = now_s() + STOP_TIMEOUT_S;
    int st = 0, rc = 0;
    pid_t w = 0;

    if (sv->pid > 0) {
        kill(sv->pid, SIGTERM);
        for (;;) {
            w = waitpid(sv->pid, &st, WNOHANG);
            if (w != 0 || now_s() > deadline) break;
            sleep_s(0.01);
        }
        if (w == 0) {
            fprintf(stderr, "%s: pagoda serve did not stop in %.0f s after SIGTERM; killed\n",
                    o->cmd, STOP_TIMEOUT_S);
            kill(sv->pid, SIGKILL);
            waitpid(sv->pid, &st, 0);
            rc = -1;
        } else if (w < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            if (w > 0 && WIFSIGNALED(st)) {
                fprintf(stderr, "%s: pagoda serve died of signal %d\n", o->cmd, WTERMSIG(st));
            } else {
                fprintf(stderr, "%s: pagoda serve exited with status %d on SIGTERM\n", o->cmd,
                        w > 0 ? WEXITSTATUS(st) : -1);
            }
            rc = -1;
        }
        if (rc != 0) print_log_tail(sv);
        sv->pid = 0;
    }
    if (sv->log_fd >= 0) close(sv->log_fd);
    sv->log_fd = -1;
    return rc;
}

/* ---- report ---- */

static double out_tps(const run_stats *r)
{
    return r->duration_s > 0 ? (double)r->completion_tokens / r->duration_s : 0.0;
}

static double total_tps(const run_stats *r)
{
    return r->duration_s > 0 ? (double)(r->prompt_tokens + r->completion_tokens) / r->duration_s
                             : 0.0;
}

/* cached / prompt tokens; -1 when the server reported no cached_tokens. */
static double hit_ratio(const run_stats *r)
{
    if (r->n_cached_reported == 0 || r->prompt_tokens == 0) return -1.0;
    return (double)r->cached_tokens / (double)r->prompt_tokens;
}

/* a / b, or -1 when it is undefined. */
static double ratio(double a, double b)
{
    return a >= 0 && b > 0 ? a / b : -1.0;
}

/* One table row: a value per run (negative: unknown, "-"), then with/without. */
static void row(const char *label, const double *v, int n, int decimals, int show_ratio)
{
    printf("%-28s", label);
    for (int i = 0; i < n; i++) {
        if (v[i] >= 0) {
            printf("%18.*f", decimals, v[i]);
        } else {
            printf("%18s", "-");
        }
    }
    if (show_ratio && n == 2) {
        double r = ratio(v[0], v[1]);
        if (r >= 0) printf("%14.2fx", r);
    }
    printf("\n");
}

static void describe_workload(const opts *o, const bench *b, char *s, size_t len)
{
    char arrival[64];
    if (o->rate > 0) {
        snprintf(arrival, sizeof arrival, "Poisson arrivals at %g req/s", o->rate);
    } else {
        snprintf(arrival, sizeof arrival, "concurrency %llu", (unsigned long long)o->concurrency);
    }
    snprintf(s, len,
             "%u requests = %llu groups x %llu prompts; prompt = %llu shared + %llu own tokens; "
             "%llu output tokens; %s; seed %llu",
             b->w.n_requests, (unsigned long long)o->groups, (unsigned long long)o->prompts,
             (unsigned long long)o->system_tokens, (unsigned long long)o->question_tokens,
             (unsigned long long)o->output_tokens, arrival, (unsigned long long)o->seed);
}

static void print_table(const opts *o, const bench *b, const run_stats *rs, int n)
{
    char wl[512];
    double v[2];

#define ROW(label, expr, dec, r)                                                                   \
    do {                                                                                           \
        for (int i_ = 0; i_ < n; i_++)                                                             \
            v[i_] = (expr);                                                                        \
        row(label, v, n, dec, r);                                                                  \
    } while (0)

    describe_workload(o, b, wl, sizeof wl);
    printf("pagoda bench: model %s%s%s\n", b->info.model_id[0] ? b->info.model_id : "(unnamed)",
           o->model_path ? " from " : "", o->model_path ? o->model_path : "");
    printf("  %s\n", wl);
    if (o->url) printf("  server %s\n", o->url);
    printf("\n%-28s", "");
    for (int i = 0; i < n; i++) {
        printf("%18s", rs[i].prefix_cache == 1   ? "prefix cache"
                       : rs[i].prefix_cache == 0 ? "no prefix cache"
                                                 : "result");
    }
    printf(n == 2 ? "%15s\n" : "%s\n", n == 2 ? "with/without" : "");
    printf("%-28s", "requests ok / failed");
    for (int i = 0; i < n; i++) {
        char s[40];
        snprintf(s, sizeof s, "%u / %u", rs[i].n_ok, rs[i].n_failed);
        printf("%18s", s);
    }
    printf("\n");
    ROW("duration (s)", rs[i_].duration_s, 3, 1);
    ROW("output throughput (tok/s)", out_tps(&rs[i_]), 1, 1);
    ROW("total throughput (tok/s)", total_tps(&rs[i_]), 1, 1);
    ROW("TTFT p50 (ms)", rs[i_].ttft_s.n ? rs[i_].ttft_s.p50 * 1e3 : -1, 2, 1);
    ROW("TTFT p90 (ms)", rs[i_].ttft_s.n ? rs[i_].ttft_s.p90 * 1e3 : -1, 2, 1);
    ROW("TTFT p99 (ms)", rs[i_].ttft_s.n ? rs[i_].ttft_s.p99 * 1e3 : -1, 2, 1);
    ROW("ITL p50 (ms)", rs[i_].itl_s.n ? rs[i_].itl_s.p50 * 1e3 : -1, 2, 1);
    ROW("ITL p90 (ms)", rs[i_].itl_s.n ? rs[i_].itl_s.p90 * 1e3 : -1, 2, 1);
    ROW("ITL p99 (ms)", rs[i_].itl_s.n ? rs[i_].itl_s.p99 * 1e3 : -1, 2, 1);
    ROW("prompt tokens (sent)", (double)rs[i_].prompt_tokens, 0, 0);
    ROW("prefix hit ratio (cached)", hit_ratio(&rs[i_]), 3, 0);
    ROW("prompt tokens computed", rs[i_].have_computed ? rs[i_].prompt_computed : -1, 0, 1);
    ROW("output tokens", (double)rs[i_].completion_tokens, 0, 0);
    ROW("KV usage peak (%)", rs[i_].have_kv ? rs[i_].kv_usage_peak * 100.0 : -1, 3, 0);
    ROW("KV pages used at peak", rs[i_].have_kv ? rs[i_].kv_pages_peak : -1, 0, 0);
#undef ROW
    for (int i = 0; i < n; i++) {
        for (uint32_t k = 0; k < rs[i].n_errs; k++) {
            printf("  failed (%s): %s x%u, first: %s\n", rs[i].name, rs[i].errs[k].key,
                   rs[i].errs[k].count, rs[i].errs[k].first);
        }
    }
    if (n == 2) {
        printf("\nWith the prefix cache: %.2fx the output throughput, TTFT p50 %.2fx; the server "
               "computed %.2fx the prompt tokens.\n",
               ratio(out_tps(&rs[0]), out_tps(&rs[1])), ratio(rs[0].ttft_s.p50, rs[1].ttft_s.p50),
               rs[0].have_computed && rs[1].have_computed
                   ? ratio(rs[0].prompt_computed, rs[1].prompt_computed)
                   : -1.0);
    }
}

/* A number, or null when negative (unknown). */
static json_t *num(double v)
{
    return v >= 0 && isfinite(v) ? json_real(v) : json_null();
}

static json_t *summary_json(const lg_summary *s)
{
    json_t *o = json_object();
    json_object_set_new(o, "n", json_integer((json_int_t)s->n));
    json_object_set_new(o, "mean", s->n ? json_real(s->mean * 1e3) : json_null());
    json_object_set_new(o, "p50", s->n ? json_real(s->p50 * 1e3) : json_null());
    json_object_set_new(o, "p90", s->n ? json_real(s->p90 * 1e3) : json_null());
    json_object_set_new(o, "p99", s->n ? json_real(s->p99 * 1e3) : json_null());
    return o;
}

static json_t *run_json(const run_stats *r)
{
    json_t *o = json_object(), *errs = json_object();
    json_object_set_new(o, "name", json_string(r->name));
    json_object_set_new(o, "prefix_cache",
                        r->prefix_cache < 0 ? json_null() : json_boolean(r->prefix_cache));
    json_object_set_new(o, "requests", json_integer(r->n_requests));
    json_object_set_new(o, "ok", json_integer(r->n_ok));
    json_object_set_new(o, "failed", json_integer(r->n_failed));
    for (uint32_t k = 0; k < r->n_errs; k++) {
        json_object_set_new(errs, r->errs[k].key,
                            json_pack("{s:i, s:s}", "count", (json_int_t)r->errs[k].count, "first",
                                      r->errs[k].first));
    }
    json_object_set_new(o, "errors", errs);
    json_object_set_new(o, "duration_s", json_real(r->duration_s));
    json_object_set_new(o, "prompt_tokens", json_integer((json_int_t)r->prompt_tokens));
    json_object_set_new(o, "cached_tokens", json_integer((json_int_t)r->cached_tokens));
    json_object_set_new(o, "completion_tokens", json_integer((json_int_t)r->completion_tokens));
    json_object_set_new(o, "output_throughput_tps", json_real(out_tps(r)));
    json_object_set_new(o, "total_throughput_tps", json_real(total_tps(r)));
    json_object_set_new(o, "ttft_ms", summary_json(&r->ttft_s));
    json_object_set_new(o, "itl_ms", summary_json(&r->itl_s));
    json_object_set_new(o, "prefix_hit_ratio", num(hit_ratio(r)));
    json_object_set_new(o, "kv_usage_peak", r->have_kv ? json_real(r->kv_usage_peak) : json_null());
    json_object_set_new(o, "kv_pages_used_peak", r->have_kv ? num(r->kv_pages_peak) : json_null());
    json_object_set_new(o, "prompt_tokens_computed",
                        r->have_computed ? json_real(r->prompt_computed) : json_null());
    return o;
}

static void print_json(const opts *o, const bench *b, const run_stats *rs, int n)
{
    json_t *root = json_object(), *wl = json_object(), *runs = json_array();
    char *s;

    json_object_set_new(root, "model",
                        b->info.model_id[0] ? json_string(b->info.model_id) : json_null());
    json_object_set_new(root, "model_path",
                        o->model_path ? json_string(o->model_path) : json_null());
    json_object_set_new(root, "url", o->url ? json_string(o->url) : json_null());
    json_object_set_new(wl, "requests", json_integer(b->w.n_requests));
    json_object_set_new(wl, "groups", json_integer((json_int_t)o->groups));
    json_object_set_new(wl, "prompts", json_integer((json_int_t)o->prompts));
    json_object_set_new(wl, "system_tokens", json_integer((json_int_t)o->system_tokens));
    json_object_set_new(wl, "question_tokens", json_integer((json_int_t)o->question_tokens));
    json_object_set_new(wl, "output_tokens", json_integer((json_int_t)o->output_tokens));
    json_object_set_new(wl, "concurrency",
                        o->rate > 0 ? json_null() : json_integer((json_int_t)o->concurrency));
    json_object_set_new(wl, "rate", o->rate > 0 ? json_real(o->rate) : json_null());
    json_object_set_new(wl, "seed", json_integer((json_int_t)o->seed));
    json_object_set_new(wl, "n_vocab", json_integer(b->info.n_vocab));
    json_object_set_new(root, "workload", wl);
    for (int i = 0; i < n; i++)
        json_array_append_new(runs, run_json(&rs[i]));
    json_object_set_new(root, "runs", runs);
    if (n == 2) {
        json_t *r = json_object();
        json_object_set_new(r, "output_throughput", num(ratio(out_tps(&rs[0]), out_tps(&rs[1]))));
        json_object_set_new(r, "total_throughput",
                            num(ratio(total_tps(&rs[0]), total_tps(&rs[1]))));
        json_object_set_new(r, "duration", num(ratio(rs[0].duration_s, rs[1].duration_s)));
        json_object_set_new(r, "ttft_p50", num(ratio(rs[0].ttft_s.p50, rs[1].ttft_s.p50)));
        json_object_set_new(r, "ttft_p90", num(ratio(rs[0].ttft_s.p90, rs[1].ttft_s.p90)));
        json_object_set_new(r, "ttft_p99", num(ratio(rs[0].ttft_s.p99, rs[1].ttft_s.p99)));
        json_object_set_new(r, "itl_p50", num(ratio(rs[0].itl_s.p50, rs[1].itl_s.p50)));
        json_object_set_new(r, "prompt_tokens_computed",
                            rs[0].have_computed && rs[1].have_computed
                                ? num(ratio(rs[0].prompt_computed, rs[1].prompt_computed))
                                : json_null());
        json_object_set_new(root, "ratios", r);
    } else {
        json_object_set_new(root, "ratios", json_null());
    }
    s = json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
    if (s) printf("%s\n", s);
    free(s);
    json_decref(root);
}

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
            "  --output-tokens O       max_tokens of each request (default 64)\n"
            "  --concurrency C         requests in flight at once (default 8)\n"
            "  --rate R                Poisson arrivals at R requests/s instead\n"
            "  --seed N                workload seed (default 1)\n"
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
static int parse_args(int argc, char **argv, opts *o)
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
    };
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
        }
        if (!matched) {
            static const char *const strs[] = {"--url",        "-m",        "--model",
                                               "--model-name", "--api-key", "--rate"};
            for (size_t j = 0; j < sizeof strs / sizeof strs[0] && !matched; j++) {
                k = opt_val(strs[j], argc, argv, &i, &v);
                if (k == 0) continue;
                matched = 1;
                if (k < 0) break;
                if (j == 0) o->url = v;
                if (j == 1 || j == 2) o->model_path = v;
                if (j == 3) o->model_name = v;
                if (j == 4) o->api_key = v;
                if (j == 5) {
                    char *end = NULL;
                    o->rate = strtod(v, &end);
                    if (end == v || *end != '\0' || !(o->rate > 0) || !isfinite(o->rate)) {
                        fprintf(stderr, "%s: --rate: '%s' is not a positive number\n", cmd, v);
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
        fprintf(stderr, "%s: unexpected argument '%s'\n", cmd, a);
        return cli_usage_error(cmd);
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

int cmd_bench(int argc, char **argv)
{
    opts o;
    bench b;
    run_stats rs[2];
    char *url = NULL, auth[512];
    int n_runs, n_done = 0, failed = 0, rc;

    memset(&o, 0, sizeof o);
    memset(&b, 0, sizeof b);
    memset(rs, 0, sizeof rs);
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
    rc = parse_args(argc, argv, &o);
    if (rc >= 0) {
        free((void *)o.serve_args);
        return rc;
    }
    b.o = &o;
    if (o.url) {
        url = base_url(o.url);
        if (!url || !url[0]) {
            fprintf(stderr, "%s: --url: '%s' is not a URL\n", o.cmd, o.url);
            free(url);
            free((void *)o.serve_args);
            return url ? cli_usage_error(o.cmd) : CLI_EXIT_FAIL;
        }
        o.url = url;
    }
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "%s: libcurl failed to initialise\n", o.cmd);
        free(url);
        free((void *)o.serve_args);
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
        run_stats *s = &rs[r];
        server sv;
        server_info info;
        const char *base = url;

        memset(&sv, 0, sizeof sv);
        sv.log_fd = -1;
        s->name = o.url ? "url" : r == 0 ? "prefix_cache" : "no_prefix_cache";
        s->prefix_cache = o.url ? -1 : r == 0;
        if (!o.url) {
            fprintf(stderr, "%s: run %d/%d (%s): starting pagoda serve -m %s\n", o.cmd, r + 1,
                    n_runs, r == 0 ? "prefix cache on" : "--no-prefix-cache", o.model_path);
            if (server_start(&o, r == 0, &sv) != 0) {
                failed = 1;
                break;
            }
            base = sv.url;
        }
        if (probe_models(&b, base, &info) != 0) {
            failed = 1;
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
            if (run_workload(&b, base, s) != 0) {
                failed = 1;
            } else {
                n_done++;
                if (s->n_failed > 0) {
                    fprintf(stderr, "%s: %u of %u requests failed\n", o.cmd, s->n_failed,
                            s->n_requests);
                }
            }
        }
        if (!o.url && server_stop(&o, &sv) != 0) failed = 1;
    }

    if (n_done == n_runs) {
        if (o.json) {
            print_json(&o, &b, rs, n_runs);
        } else {
            print_table(&o, &b, rs, n_runs);
        }
    }
    for (int r = 0; r < n_runs; r++) {
        if (rs[r].n_failed > 0) failed = 1;
        run_stats_deinit(&rs[r]);
    }
    lg_workload_deinit(&b.w);
    curl_slist_free_all(b.hdrs);
    curl_global_cleanup();
    free(url);
    free((void *)o.serve_args);
    return failed ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}
