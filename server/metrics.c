/* SPDX-License-Identifier: MIT */
/*
 * metrics.c - counters, histograms and the Prometheus page (see metrics.h), and the
 * labels of the cache's tiers. A remote tier (pgd_tier_stats.remote: the Redis tier) adds
 * its own families (connection state, reconnects, timeouts, deadline misses, MAC
 * failures, cluster redirections, KV events), sampled for the remote tiers only and absent
 * without one.
 */
#include "metrics.h"

#include <stdio.h>
#include <stdlib.h>
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
    if ((unsigned)u->kv_budget_method < PGD_BUDGET_COUNT) m->budget_requests[u->kv_budget_method]++;
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

/* ---- tier labels ---- */

static int label_taken(const ps_metrics_info *info, uint32_t n, const char *s)
{
    if (strcmp(s, "pool") == 0) return 1;
    for (uint32_t i = 0; i < n; i++)
        if (strcmp(info->tier_labels[i], s) == 0) return 1;
    return 0;
}

void ps_metrics_tier_labels(ps_metrics_info *info, pgd_cache *cache)
{
    uint32_t n = pgd_cache_n_tiers(cache);
    if (n > PGD_MAX_TIERS) n = PGD_MAX_TIERS;
    for (uint32_t i = 0; i < n; i++) {
        const char *name = pgd_tier_name(pgd_cache_tier(cache, i));
        char base[PS_TIER_LABEL_MAX - 4]; /* room for a suffix up to "999" */
        size_t l = 0;
        for (; name && name[l] && l + 1 < sizeof base; l++) {
            char ch = name[l];
            int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                     (ch >= '0' && ch <= '9') || ch == '_' || ch == '-' || ch == '.';
            base[l] = ok ? ch : '_';
        }
        if (!l) base[l++] = 't';
        base[l] = '\0';
        char *out = info->tier_labels[i];
        snprintf(out, PS_TIER_LABEL_MAX, "%s", base);
        for (unsigned k = 2; label_taken(info, i, out); k++)
            snprintf(out, PS_TIER_LABEL_MAX, "%s%u", base, k);
    }
    info->n_tiers = n;
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

/* One sample of a per-tier family: name{tier="label"} v. */
static void tier_sample(ps_buf *b, const char *name, const char *label, double v)
{
    ps_buf_printf(b, "%s{tier=\"%s\"} %.17g\n", name, label, v);
}

/* A latency histogram of a tier (pgd_tier_stats get_hist / put_hist: counts per bucket,
 * bounds pgd_tier_hist_bounds_us, the last +Inf; get_ns_sum / put_ns_sum), in seconds. */
static void tier_hist(ps_buf *b, const char *name, const char *label, const uint64_t *counts,
                      uint64_t sum_ns)
{
    const double *le_us = pgd_tier_hist_bounds_us();
    uint64_t cum = 0;
    for (int i = 0; i < PGD_TIER_HIST_BUCKETS - 1; i++) {
        cum += counts[i];
        ps_buf_printf(b, "%s_bucket{tier=\"%s\",le=\"%g\"} %llu\n", name, label, le_us[i] * 1e-6,
                      (unsigned long long)cum);
    }
    cum += counts[PGD_TIER_HIST_BUCKETS - 1];
    ps_buf_printf(b, "%s_bucket{tier=\"%s\",le=\"+Inf\"} %llu\n", name, label,
                  (unsigned long long)cum);
    ps_buf_printf(b, "%s_sum{tier=\"%s\"} %.9f\n", name, label, (double)sum_ns * 1e-9);
    ps_buf_printf(b, "%s_count{tier=\"%s\"} %llu\n", name, label, (unsigned long long)cum);
}

/* The figures of one tier that the page shows: the tier's own (pgd_tier_stats) and the
 * cache's movement counters of it (pgd_cache_tier_stats). */
typedef struct tier_snap {
    pgd_tier_stats t;
    pgd_cache_tier_stats c;
} tier_snap;

/* What a per-tier family reads from a snapshot. */
typedef double (*tier_field_fn)(const tier_snap *ts, uint32_t page_tokens);

#define TIER_FIELD(fname, expr)                                                                    \
    static double fname(const tier_snap *ts, uint32_t page_tokens)                                 \
    {                                                                                              \
        (void)page_tokens;                                                                         \
        return (double)(expr);                                                                     \
    }
TIER_FIELD(tf_bytes_used, ts->t.bytes_used)
TIER_FIELD(tf_bytes_capacity, ts->t.bytes_capacity)
TIER_FIELD(tf_records, ts->t.n_records)
TIER_FIELD(tf_full, ts->t.full ? 1 : 0)
TIER_FIELD(tf_hit_pages, ts->c.hit_pages)
TIER_FIELD(tf_hit_tokens, ts->c.hit_tokens)
TIER_FIELD(tf_miss_pages, ts->c.miss_pages)
TIER_FIELD(tf_miss_tokens, ts->c.miss_pages *(uint64_t)page_tokens)
TIER_FIELD(tf_promoted_pages, ts->c.promoted_pages)
TIER_FIELD(tf_promoted_bytes, ts->c.promoted_bytes)
TIER_FIELD(tf_promote_failed, ts->c.promote_failed)
TIER_FIELD(tf_demoted_pages, ts->c.demoted_pages)
TIER_FIELD(tf_demoted_bytes, ts->c.demoted_bytes)
TIER_FIELD(tf_demote_dropped, ts->c.demote_dropped)
TIER_FIELD(tf_prefetched, ts->c.prefetched_pages)
TIER_FIELD(tf_parked, ts->c.parked_pages)
TIER_FIELD(tf_evictions, ts->t.n_evictions)
TIER_FIELD(tf_put_refused, ts->t.n_put_refused)
TIER_FIELD(tf_corrupt, ts->t.n_corrupt)
TIER_FIELD(tf_foreign, ts->t.n_foreign)
TIER_FIELD(tf_io_errors, ts->t.n_io_errors)
TIER_FIELD(tf_connected, ts->t.n_nodes && ts->t.n_nodes_up >= ts->t.n_nodes ? 1 : 0)
TIER_FIELD(tf_nodes, ts->t.n_nodes)
TIER_FIELD(tf_nodes_up, ts->t.n_nodes_up)
TIER_FIELD(tf_reconnects, ts->t.n_reconnects)
TIER_FIELD(tf_connect_failures, ts->t.n_connect_failures)
TIER_FIELD(tf_timeouts, ts->t.n_timeouts)
TIER_FIELD(tf_deadline_misses, ts->t.n_deadline_misses)
TIER_FIELD(tf_mac_failures, ts->t.n_mac_failures)
TIER_FIELD(tf_slot_refreshes, ts->t.n_slot_refreshes)
TIER_FIELD(tf_lookups_remote, ts->t.n_lookups_remote)
TIER_FIELD(tf_events, ts->t.n_events)
TIER_FIELD(tf_events_dropped, ts->t.n_events_dropped)
TIER_FIELD(tf_put_queue_bytes, ts->t.put_queue_bytes)
#undef TIER_FIELD

static const struct {
    const char *name, *type, *help;
    tier_field_fn f;
} tier_families[] = {
    {"pagoda_tier_bytes_used", "gauge", "Bytes of records a tier holds (headers included).",
     tf_bytes_used},
    {"pagoda_tier_bytes_capacity", "gauge", "A tier's capacity bound in bytes.", tf_bytes_capacity},
    {"pagoda_tier_records", "gauge", "Page records a tier holds.", tf_records},
    {"pagoda_tier_full", "gauge", "1 while a tier's writes are stopped (disk full).", tf_full},
    {"pagoda_tier_hit_pages_total", "counter", "KV pages matched from a tier (promoted).",
     tf_hit_pages},
    {"pagoda_tier_hit_tokens_total", "counter", "Prompt tokens matched from a tier (promoted).",
     tf_hit_tokens},
    {"pagoda_tier_miss_pages_total", "counter",
     "Matches that looked past the pool and found the next page in no tier down to this one.",
     tf_miss_pages},
    {"pagoda_tier_miss_tokens_total", "counter", "Those misses in tokens (pages x page tokens).",
     tf_miss_tokens},
    {"pagoda_tier_promoted_pages_total", "counter", "KV pages filled from a tier into the pool.",
     tf_promoted_pages},
    {"pagoda_tier_promoted_bytes_total", "counter", "Bytes filled from a tier into the pool.",
     tf_promoted_bytes},
    {"pagoda_tier_promote_failed_total", "counter",
     "Fills from a tier that failed (record damaged, gone, I/O): the engine computed them.",
     tf_promote_failed},
    {"pagoda_tier_demoted_pages_total", "counter", "KV pages written to a tier (any path).",
     tf_demoted_pages},
    {"pagoda_tier_demoted_bytes_total", "counter", "Bytes written to a tier (any path).",
     tf_demoted_bytes},
    {"pagoda_tier_demote_dropped_total", "counter",
     "Evicted KV pages not written to a tier: write-back queue full, or the write failed.",
     tf_demote_dropped},
    {"pagoda_tier_prefetched_pages_total", "counter",
     "Pages moved up into a tier by prefetch on admission.", tf_prefetched},
    {"pagoda_tier_parked_pages_total", "counter", "Pages queued to a tier by preemption swap-out.",
     tf_parked},
    {"pagoda_tier_evictions_total", "counter", "Records a tier dropped for capacity.",
     tf_evictions},
    {"pagoda_tier_put_refused_total", "counter",
     "Writes a tier refused: disk full (ENOSPC) or over capacity.", tf_put_refused},
    {"pagoda_tier_checksum_failures_total", "counter",
     "Damaged records a tier found (checksum, format): dropped, never served.", tf_corrupt},
    {"pagoda_tier_foreign_records_total", "counter",
     "Records of another model or geometry a tier saw: ignored, never served.", tf_foreign},
    {"pagoda_tier_io_errors_total", "counter", "Failed tier reads or writes (ENOSPC aside).",
     tf_io_errors},
};

/* The families of remote tiers only (pgd_tier_stats.remote); redirections, by kind, are
 * rendered after them. */
static const struct {
    const char *name, *type, *help;
    tier_field_fn f;
} remote_families[] = {
    {"pagoda_tier_connected", "gauge",
     "1 while a remote tier is connected to every node it knows, else 0 (an outage: requests "
     "compute).",
     tf_connected},
    {"pagoda_tier_nodes", "gauge", "Nodes a remote tier knows (standalone: 1).", tf_nodes},
    {"pagoda_tier_nodes_up", "gauge", "Nodes a remote tier is connected to now.", tf_nodes_up},
    {"pagoda_tier_reconnects_total", "counter",
     "Connections a remote tier re-established after a failure.", tf_reconnects},
    {"pagoda_tier_connect_failures_total", "counter",
     "Connection or AUTH attempts of a remote tier that failed.", tf_connect_failures},
    {"pagoda_tier_timeouts_total", "counter",
     "Commands of a remote tier past their timeout (the connection is dropped).", tf_timeouts},
    {"pagoda_tier_deadline_misses_total", "counter",
     "Remote gets abandoned at their deadline: the request computed those pages.",
     tf_deadline_misses},
    {"pagoda_tier_mac_failures_total", "counter",
     "Remote records whose MAC did not verify (forged or damaged): deleted, never served.",
     tf_mac_failures},
    {"pagoda_tier_slot_refreshes_total", "counter",
     "Cluster slot map reloads (CLUSTER SLOTS) of a remote tier.", tf_slot_refreshes},
    {"pagoda_tier_remote_lookups_total", "counter",
     "Look-ups a remote tier asked the store (not answered from what it knows).",
     tf_lookups_remote},
    {"pagoda_tier_events_total", "counter", "KV events a remote tier published.", tf_events},
    {"pagoda_tier_events_dropped_total", "counter",
     "KV events a remote tier dropped (queue full, store down).", tf_events_dropped},
    {"pagoda_tier_put_queue_bytes", "gauge",
     "Bytes of puts a remote tier accepted and has not written yet.", tf_put_queue_bytes},
};

static void render_remote(const ps_metrics_info *info, const tier_snap *ts, ps_buf *b)
{
    uint32_t n = info->n_tiers, any = 0;
    for (uint32_t i = 0; i < n; i++)
        any |= ts[i].t.remote != 0;
    if (!any) return;
    for (size_t f = 0; f < sizeof remote_families / sizeof remote_families[0]; f++) {
        head(b, remote_families[f].name, remote_families[f].type, remote_families[f].help);
        for (uint32_t i = 0; i < n; i++)
            if (ts[i].t.remote)
                tier_sample(b, remote_families[f].name, info->tier_labels[i],
                            remote_families[f].f(&ts[i], info->page_tokens));
    }
    head(b, "pagoda_tier_redirects_total", "counter",
         "Cluster redirections a remote tier followed, by kind (MOVED, ASK).");
    for (uint32_t i = 0; i < n; i++) {
        if (!ts[i].t.remote) continue;
        ps_buf_printf(b, "pagoda_tier_redirects_total{tier=\"%s\",kind=\"moved\"} %llu\n",
                      info->tier_labels[i], (unsigned long long)ts[i].t.n_moved);
        ps_buf_printf(b, "pagoda_tier_redirects_total{tier=\"%s\",kind=\"ask\"} %llu\n",
                      info->tier_labels[i], (unsigned long long)ts[i].t.n_ask);
    }
}

static void render_tiers(const ps_metrics_info *info, pgd_cache *cache, ps_buf *b)
{
    tier_snap ts[PGD_MAX_TIERS];
    uint32_t n = info->n_tiers;
    for (uint32_t i = 0; i < n; i++) {
        pgd_tier_get_stats(pgd_cache_tier(cache, i), &ts[i].t);
        if (pgd_cache_get_tier_stats(cache, i, &ts[i].c) != PGD_OK)
            memset(&ts[i].c, 0, sizeof ts[i].c);
    }
    for (size_t f = 0; f < sizeof tier_families / sizeof tier_families[0]; f++) {
        head(b, tier_families[f].name, tier_families[f].type, tier_families[f].help);
        for (uint32_t i = 0; i < n; i++)
            tier_sample(b, tier_families[f].name, info->tier_labels[i],
                        tier_families[f].f(&ts[i], info->page_tokens));
    }
    gauge(b, "pagoda_tier_writeback_queue_pages",
          "Evicted KV pages copied out of the pool and waiting for a mover (all tiers).",
          (double)ts[0].c.writeback_depth);
    head(b, "pagoda_tier_get_latency_seconds", "histogram",
         "Time a tier took to read one record into a pool page.");
    for (uint32_t i = 0; i < n; i++)
        tier_hist(b, "pagoda_tier_get_latency_seconds", info->tier_labels[i], ts[i].t.get_hist,
                  ts[i].t.get_ns_sum);
    head(b, "pagoda_tier_put_latency_seconds", "histogram",
         "Time a tier took to store one record.");
    for (uint32_t i = 0; i < n; i++)
        tier_hist(b, "pagoda_tier_put_latency_seconds", info->tier_labels[i], ts[i].t.put_hist,
                  ts[i].t.put_ns_sum);
    render_remote(info, ts, b);
}

/* Per tenant (hashed id, pgd_tenant_stats.id, never the salt): pages held, hits and
 * evictions; and the pinned pages of all tenants. */
static void render_tenants(pgd_cache *cache, ps_buf *b)
{
    uint32_t n = pgd_cache_n_tenants(cache);
    pgd_tenant_stats *ts = calloc(n ? n : 1, sizeof *ts);
    uint64_t pinned = 0;
    if (!ts) {
        b->oom = 1;
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (pgd_cache_get_tenant_stats(cache, i, &ts[i]) != PGD_OK) memset(&ts[i], 0, sizeof *ts);
        pinned += ts[i].pages_pinned;
    }
    gauge(b, "pagoda_kv_pages_pinned", "KV pages pinned (requests' pagoda.pin, /v1/cache/pin).",
          (double)pinned);
    static const struct {
        const char *name, *type, *help;
    } fam[] = {
        {"pagoda_tenant_pages", "gauge", "Cached KV pages charged to a tenant (hashed id)."},
        {"pagoda_tenant_pages_reserved", "gauge", "KV pages reserved for a tenant (quota)."},
        {"pagoda_tenant_hits_total", "counter", "KV pages a tenant's prompts matched in the pool."},
        {"pagoda_tenant_evictions_total", "counter", "A tenant's KV pages evicted."},
    };
    for (size_t f = 0; f < sizeof fam / sizeof fam[0]; f++) {
        head(b, fam[f].name, fam[f].type, fam[f].help);
        for (uint32_t i = 0; i < n; i++) {
            uint64_t v = f == 0   ? ts[i].pages_held
                         : f == 1 ? ts[i].reserved_pages
                         : f == 2 ? ts[i].hit_pages
                                  : ts[i].evictions;
            ps_buf_printf(b, "%s{tenant=\"%016llx\"} %llu\n", fam[f].name,
                          (unsigned long long)ts[i].id, (unsigned long long)v);
        }
    }
    free(ts);
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
    if (cs.n_window_pages_total) { /* sliding-window layers: a pool of their own */
        gauge(b, "pagoda_kv_window_pages_total",
              "KV pages in the sliding-window layers' pool (the pages above: global layers).",
              cs.n_window_pages_total);
        gauge(b, "pagoda_kv_window_pages_used",
              "Sliding-window layers' KV pages held by at least one running request.",
              cs.n_window_pages_used);
        gauge(b, "pagoda_kv_window_pages_cached",
              "Sliding-window layers' KV pages registered in their prefix index.",
              cs.n_window_pages_cached);
        counter(b, "pagoda_kv_window_released_pages_total",
                "Sliding-window layers' KV pages requests released as their windows slid.",
                cs.n_window_released);
        counter(b, "pagoda_kv_window_cut_tokens_total",
                "Prefix-cache hit tokens given up because window layers' pages were evicted.",
                cs.n_window_cut_tokens);
    }
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
    counter(b, "pagoda_kv_budget_dropped_tokens_total",
            "KV slots (tokens) dropped by token budgets (compaction).", cs.n_compact_dropped);
    counter(b, "pagoda_kv_compaction_freed_pages_total",
            "KV pages the sequences compacted by token budgets held less after it.",
            cs.n_compact_freed);
    counter(b, "pagoda_kv_compactions_total", "Compactions of sequences by token budgets.",
            cs.n_compactions);
    head(b, "pagoda_requests_with_budget_total", "counter",
         "Submitted requests that ran with a token budget, by method (at their end).");
    for (int i = PGD_BUDGET_NONE + 1; i < PGD_BUDGET_COUNT; i++)
        ps_buf_printf(b, "pagoda_requests_with_budget_total{method=\"%s\"} %llu\n",
                      pgd_budget_method_name((pgd_budget_method)i),
                      (unsigned long long)snap.budget_requests[i]);
    render_tenants(cache, b);

    gauge(b, "pagoda_requests_running", "Requests in the running batch.", ss.n_running);
    gauge(b, "pagoda_requests_waiting", "Requests queued for admission.", ss.n_waiting);
    counter(b, "pagoda_preemptions_total",
            "Running requests released for lack of KV pages and requeued.", ss.n_preemptions);
    head(b, "pagoda_preemptions_by_kind_total", "counter",
         "Preemptions by how the released request's pages were kept: swap (parked in the "
         "first tier) or recompute (dropped to the pool's cache).");
    ps_buf_printf(b, "pagoda_preemptions_by_kind_total{kind=\"swap\"} %llu\n",
                  (unsigned long long)ss.n_preempt_swap);
    ps_buf_printf(b, "pagoda_preemptions_by_kind_total{kind=\"recompute\"} %llu\n",
                  (unsigned long long)ss.n_preempt_recompute);
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

    if (info->n_tiers) render_tiers(info, cache, b);

    hist(b, "pagoda_time_to_first_token_seconds",
         "Time from a request's arrival to its first generated token.", &snap.ttft);
    hist(b, "pagoda_inter_token_latency_seconds",
         "Time between consecutive generated tokens of one request.", &snap.itl);
    hist(b, "pagoda_request_duration_seconds",
         "Time from a request's arrival to its last generated token.", &snap.duration);
}
