/* SPDX-License-Identifier: MIT */
/*
 * metrics.c - counters, histograms and the Prometheus page (see metrics.h).
 */
#include "metrics.h"

#include <string.h>

static const double ttft_le[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                 0.25,  0.5,    1,     2.5,  5,     10,   30};
static const double itl_le[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                0.05,   0.1,   0.25,   0.5,   1,    2.5};
static const double dur_le[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};

static const int http_codes[] = {200, 400, 401, 404, 405, 413};
static const int http_codes_other[] = {429, 500, 503};

static void hist_init(ps_hist *h, const double *le, uint32_t n)
{
    memset(h, 0, sizeof *h);
    h->le = le;
    h->n = n;
}

static void hist_add(ps_hist *h, double v)
{
    uint32_t i = 0;
    while (i < h->n && v > h->le[i])
        i++;
    h->counts[i]++;
    h->sum += v;
    h->count++;
}

void ps_metrics_init(ps_metrics *m)
{
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    hist_init(&m->ttft, ttft_le, sizeof ttft_le / sizeof ttft_le[0]);
    hist_init(&m->itl, itl_le, sizeof itl_le / sizeof itl_le[0]);
    hist_init(&m->duration, dur_le, sizeof dur_le / sizeof dur_le[0]);
}

void ps_metrics_deinit(ps_metrics *m)
{
    pthread_mutex_destroy(&m->mu);
}

void ps_metrics_observe_ttft(ps_metrics *m, double seconds)
{
    pthread_mutex_lock(&m->mu);
    hist_add(&m->ttft, seconds);
    pthread_mutex_unlock(&m->mu);
}

void ps_metrics_observe_itl(ps_metrics *m, double seconds)
{
    pthread_mutex_lock(&m->mu);
    hist_add(&m->itl, seconds);
    pthread_mutex_unlock(&m->mu);
}

void ps_metrics_finish(ps_metrics *m, ps_outcome o, double seconds, uint32_t completion_tokens)
{
    pthread_mutex_lock(&m->mu);
    m->finished[o]++;
    m->completion_tokens += completion_tokens;
    hist_add(&m->duration, seconds);
    pthread_mutex_unlock(&m->mu);
}

void ps_metrics_prompt(ps_metrics *m, const pe_usage *u)
{
    uint32_t cached = u->cached_tokens < u->prompt_tokens ? u->cached_tokens : u->prompt_tokens;
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += u->prompt_tokens;
    m->prompt_tokens_cached += cached;
    pthread_mutex_unlock(&m->mu);
}

void ps_metrics_http(ps_metrics *m, int status)
{
    pthread_mutex_lock(&m->mu);
    size_t i;
    for (i = 0; i < 6; i++)
        if (http_codes[i] == status) break;
    if (i < 6) {
        m->http_by_status[i]++;
    } else {
        for (i = 0; i < 3; i++)
            if (http_codes_other[i] == status) break;
        m->http_other[i]++;
    }
    pthread_mutex_unlock(&m->mu);
}

void ps_metrics_http_active(ps_metrics *m, int delta)
{
    pthread_mutex_lock(&m->mu);
    m->http_active += (uint64_t)(int64_t)delta;
    pthread_mutex_unlock(&m->mu);
}

/* ---- rendering ---- */

static void head(ps_buf *b, const char *name, const char *type, const char *help)
{
    ps_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void gauge(ps_buf *b, const char *name, const char *help, double v)
{
    head(b, name, "gauge", help);
    ps_buf_printf(b, "%s %.17g\n", name, v);
}

static void counter(ps_buf *b, const char *name, const char *help, uint64_t v)
{
    head(b, name, "counter", help);
    ps_buf_printf(b, "%s %llu\n", name, (unsigned long long)v);
}

static void hist(ps_buf *b, const char *name, const char *help, const ps_hist *h)
{
    uint64_t cum = 0;
    head(b, name, "histogram", help);
    for (uint32_t i = 0; i < h->n; i++) {
        cum += h->counts[i];
        ps_buf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, h->le[i], (unsigned long long)cum);
    }
    cum += h->counts[h->n];
    ps_buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    ps_buf_printf(b, "%s_sum %.9g\n%s_count %llu\n", name, h->sum, name,
                  (unsigned long long)h->count);
}

/* Prometheus label values escape backslash, quote and newline. */
static void label_value(ps_buf *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\' || *s == '"')
            ps_buf_printf(b, "\\%c", *s);
        else if (*s == '\n')
            ps_buf_adds(b, "\\n");
        else
            ps_buf_add(b, s, 1);
    }
}

void ps_metrics_render(ps_metrics *m, const ps_metrics_info *info, pe_sched *s, pgd_cache *cache,
                       ps_buf *b)
{
    static const char *const outcome[PS_OUT_N] = {"stop", "length", "cancelled", "error"};
    pe_sched_stats ss;
    pgd_cache_stats cs;
    ps_metrics snap;

    pe_sched_get_stats(s, &ss);
    pgd_cache_get_stats(cache, &cs);
    pthread_mutex_lock(&m->mu);
    snap = *m;
    pthread_mutex_unlock(&m->mu);

    head(b, "pagoda_info", "gauge", "Served model and KV cache configuration.");
    ps_buf_adds(b, "pagoda_info{model=\"");
    label_value(b, info->model_id);
    ps_buf_printf(b, "\",kv_type=\"%s\",page_tokens=\"%u\",prefix_cache=\"%s\"} 1\n", info->kv_type,
                  info->page_tokens, info->prefix_cache ? "on" : "off");
    gauge(b, "pagoda_context_tokens", "Maximum tokens of one request (prompt + output).",
          info->n_ctx);

    gauge(b, "pagoda_kv_pages_total", "KV pages in the pool.", cs.n_pages_total);
    gauge(b, "pagoda_kv_pages_used", "KV pages held by at least one running request.",
          cs.n_pages_used);
    gauge(b, "pagoda_kv_pages_cached", "KV pages registered in the prefix index.",
          cs.n_pages_cached);
    gauge(b, "pagoda_kv_pages_free", "KV pages on the free list.", cs.n_pages_free);
    gauge(b, "pagoda_kv_pages_evictable", "Cached KV pages no request holds.",
          cs.n_pages_evictable);
    gauge(b, "pagoda_kv_usage_ratio", "Fraction of KV pages held by running requests.",
          cs.n_pages_total ? (double)cs.n_pages_used / cs.n_pages_total : 0.0);
    gauge(b, "pagoda_kv_bytes_per_token", "KV cache bytes one token takes (all layers, K+V).",
          info->kv_bytes_per_token);
    gauge(b, "pagoda_page_tokens", "Tokens per KV page.", info->page_tokens);
    counter(b, "pagoda_prefix_cache_queried_tokens_total",
            "Prompt tokens looked up in the prefix cache.", cs.n_query_tokens);
    counter(b, "pagoda_prefix_cache_hit_tokens_total", "Prompt tokens found in the prefix cache.",
            cs.n_hit_tokens);
    counter(b, "pagoda_kv_evictions_total", "Cached KV pages evicted to make room.",
            cs.n_evictions);

    gauge(b, "pagoda_requests_running", "Requests in the running batch.", ss.n_running);
    gauge(b, "pagoda_requests_waiting", "Requests queued for admission.", ss.n_waiting);
    counter(b, "pagoda_preemptions_total",
            "Running requests released for lack of KV pages and requeued.", ss.n_preemptions);
    /* One request, one count in each of the three, at its end (finished, failed or
     * cancelled): total = cached + computed. The scheduler's own counters (recomputes
     * after preemption, matches at re-admission) are the prefill_* ones below. */
    counter(b, "pagoda_prompt_tokens_total",
            "Prompt tokens of submitted requests (finished, failed or cancelled), once each.",
            snap.prompt_tokens);
    counter(b, "pagoda_prompt_tokens_cached_total",
            "Of those, tokens matched from the prefix cache at first admission.",
            snap.prompt_tokens_cached);
    counter(b, "pagoda_prompt_tokens_computed_total",
            "Of those, tokens not matched from the prefix cache (total - cached).",
            snap.prompt_tokens - snap.prompt_tokens_cached);
    counter(b, "pagoda_prefill_tokens_computed_total",
            "Prefill tokens through the forward pass (recomputes after preemption included).",
            ss.n_prompt_tokens_computed);
    counter(b, "pagoda_prefill_tokens_cached_total",
            "Prefill tokens matched from the prefix cache at every admission (re-admissions "
            "after preemption included).",
            ss.n_prompt_tokens_cached);
    counter(b, "pagoda_generation_tokens_total", "Tokens sampled.", ss.n_generated_tokens);
    counter(b, "pagoda_completion_tokens_total",
            "Completion tokens returned in finished responses.", snap.completion_tokens);
    counter(b, "pagoda_steps_total", "Scheduler steps that ran a forward pass.", ss.n_steps);

    head(b, "pagoda_requests_finished_total", "counter", "Finished requests by reason.");
    for (int i = 0; i < PS_OUT_N; i++)
        ps_buf_printf(b, "pagoda_requests_finished_total{reason=\"%s\"} %llu\n", outcome[i],
                      (unsigned long long)snap.finished[i]);
    head(b, "pagoda_http_responses_total", "counter", "HTTP responses by status code.");
    for (int i = 0; i < 6; i++)
        ps_buf_printf(b, "pagoda_http_responses_total{code=\"%d\"} %llu\n", http_codes[i],
                      (unsigned long long)snap.http_by_status[i]);
    for (int i = 0; i < 3; i++)
        ps_buf_printf(b, "pagoda_http_responses_total{code=\"%d\"} %llu\n", http_codes_other[i],
                      (unsigned long long)snap.http_other[i]);
    ps_buf_printf(b, "pagoda_http_responses_total{code=\"other\"} %llu\n",
                  (unsigned long long)snap.http_other[3]);
    gauge(b, "pagoda_http_requests_active", "HTTP requests being handled, this one included.",
          (double)snap.http_active);

    hist(b, "pagoda_time_to_first_token_seconds",
         "Time from a request's arrival to its first generated token.", &snap.ttft);
    hist(b, "pagoda_inter_token_latency_seconds",
         "Time between consecutive generated tokens of one request.", &snap.itl);
    hist(b, "pagoda_request_duration_seconds",
         "Time from a request's arrival to its last generated token.", &snap.duration);
}
