/* SPDX-License-Identifier: MIT */
/*
 * loadgen_curl.c - the libcurl side of `pagoda bench`: GET /v1/models and /metrics
 * (blocking), and one run of the workload: every request a streamed POST
 * /v1/completions, driven with the /metrics sampler through one curl multi handle.
 * Callers: loadgen.c (lg_probe_models, lg_run_workload, lg_run_stats_deinit).
 *
 * Invariants: one thread does everything (the multi interface), so token times are taken
 * as the bytes arrive and nothing is locked. At most `concurrency` requests are in
 * flight (or they start at their Poisson arrival times, or at a trace's timestamps), and
 * one /metrics GET at a time. A trace workload's requests carry their own max_tokens and,
 * with tenants, "cache_salt": "tenant-<k>".
 * A failure is filed by kind in the run's figures and never ends the run; only the
 * client running out of memory before it starts does.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>
#include <jansson.h>

#include "cli.h"
#include "loadgen.h"

/* Metric names of `pagoda serve` (server/metrics.c). */
#define M_KV_USAGE "pagoda_kv_usage_ratio"
#define M_KV_USED "pagoda_kv_pages_used"
#define M_KV_TOTAL "pagoda_kv_pages_total"
#define M_PROMPT_COMPUTED "pagoda_prefill_tokens_computed_total" /* work, recomputes included */
#define M_CONTEXT "pagoda_context_tokens"

#define METRICS_PERIOD_S 0.010
#define MAX_ERRBODY 4096

typedef struct req {
    lg_bench *b;
    CURL *h;
    char *body;
    double t_start, t_last;
    double ttft;
    uint32_t n_prompt; /* tokens of its prompt */
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

/* ---- errors by kind ---- */

static void add_err(lg_run_stats *rs, const char *key, const char *msg)
{
    lg_err_kind *e = NULL;
    rs->n_failed++;
    for (uint32_t i = 0; i < rs->n_errs; i++) {
        if (strcmp(rs->errs[i].key, key) == 0) e = &rs->errs[i];
    }
    if (!e) {
        /* More kinds than slots: the last slot collects the rest. */
        e = &rs->errs[rs->n_errs < LG_MAX_ERR_KINDS ? rs->n_errs++ : LG_MAX_ERR_KINDS - 1];
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
static void setup_get(lg_bench *b, CURL *h, const char *base, const char *path, buf *out, char *url,
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
static long http_get(lg_bench *b, const char *base, const char *path, buf *out, char *msg,
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
int lg_probe_models(lg_bench *b, const char *base, lg_server_info *info)
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
    double t = cli_now_s();
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
static int req_start(lg_bench *b, CURLM *m, req *r, uint32_t i, const char *url)
{
    const lg_opts *o = b->o;
    json_t *body = json_object(), *prompt = json_array(), *so = json_object();
    uint32_t n_tokens;
    const int32_t *t = lg_workload_prompt(&b->w, i, &n_tokens);
    uint64_t max_tokens = b->w.max_tokens ? b->w.max_tokens[i] : o->output_tokens;
    int bad = !body || !prompt || !so;

    memset(r, 0, sizeof *r);
    r->b = b;
    r->n_prompt = n_tokens;
    for (uint32_t k = 0; !bad && k < n_tokens; k++) {
        bad = json_array_append_new(prompt, json_integer(t[k])) != 0;
    }
    if (!bad) {
        const char *name = o->model_name ? o->model_name : b->info.model_id;
        if (name[0]) json_object_set_new(body, "model", json_string(name));
        json_object_set(body, "prompt", prompt);
        json_object_set_new(body, "max_tokens", json_integer((json_int_t)max_tokens));
        json_object_set_new(body, "temperature", json_integer(0));
        json_object_set_new(body, "stream", json_true());
        json_object_set_new(so, "include_usage", json_true());
        json_object_set(body, "stream_options", so);
        if (o->ignore_eos) json_object_set_new(body, "ignore_eos", json_true());
        if (b->w.tenant && b->w.tenant[i] >= 0) {
            char salt[32];
            snprintf(salt, sizeof salt, "tenant-%d", (int)b->w.tenant[i]);
            json_object_set_new(body, "cache_salt", json_string(salt));
        }
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
    r->t_start = cli_now_s();
    if (curl_multi_add_handle(m, r->h) != CURLM_OK) {
        req_cleanup(r);
        return -1;
    }
    return 0;
}

/* Files a finished request's figures or failure into rs. */
static void req_finish(lg_run_stats *rs, req *r, CURLcode cc)
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
    rs->prompt_tokens += r->have_usage ? r->prompt_tokens : r->n_prompt;
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

static void note_kv(lg_run_stats *rs, const buf *m)
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
int lg_run_workload(lg_bench *b, const char *base, lg_run_stats *rs)
{
    const lg_opts *o = b->o;
    uint32_t n = b->w.n_requests, next = 0, active = 0, done = 0;
    req *reqs = calloc(n, sizeof *reqs);
    double *arr = o->rate > 0 || b->w.at_s ? malloc(n * sizeof *arr) : NULL;
    CURLM *m = curl_multi_init();
    sampler sm;
    buf mbuf = {0};
    char url[1024], emsg[512];
    double t0, t_end, kv, pages, c0 = 0.0, c1 = 0.0;
    int have_kv = 0, have_c0 = 0, have_c1 = 0, metrics = 0, rc = -1;

    memset(&sm, 0, sizeof sm);
    rs->n_requests = n;
    rs->ttft = malloc((size_t)n * sizeof *rs->ttft);
    if (!reqs || !m || !rs->ttft || ((o->rate > 0 || b->w.at_s) && !arr)) goto out;
    if (o->rate > 0) {
        lg_arrivals(arr, n, o->rate, o->seed);
    } else if (arr) {
        memcpy(arr, b->w.at_s, n * sizeof *arr); /* the trace's timestamps, --speedup */
    }
    snprintf(url, sizeof url, "%s/v1/completions", base);

    /* /metrics before the run: does the server have pagoda_ names, and where does its
     * computed-prompt-token counter start. */
    if (http_get(b, base, "/metrics", &mbuf, emsg, sizeof emsg) == 200 &&
        read_metrics(&mbuf, &kv, &pages, &have_kv, &c0, &have_c0)) {
        metrics = 1;
        note_kv(rs, &mbuf);
        sm.h = curl_easy_init();
    }

    t0 = cli_now_s();
    t_end = t0;
    while (done < n) {
        double t = cli_now_s(), wait_s = 0.1;
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
            t_end = cli_now_s();
        }
        if (done == n) break;
        t = cli_now_s();
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

void lg_run_stats_deinit(lg_run_stats *rs)
{
    free(rs->ttft);
    free(rs->itl);
}
