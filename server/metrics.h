/* SPDX-License-Identifier: MIT */
/*
 * metrics.h - the server's counters and latency histograms, and the Prometheus text page
 * of GET /metrics (names prefixed pagoda_). Callers: the server's HTTP threads count
 * responses and finishes (routes.c, generate.c); the stepping thread's token callback
 * observes latencies (handoff.c).
 *
 * Thread-safety: one mutex guards everything here; each call holds it for O(buckets).
 * Gauges that live elsewhere (KV pages, running/waiting requests, scheduler and prefix
 * cache counters, the tiers' figures) are read at render time from pe_sched / pgd_cache /
 * pgd_tier stats, so they are never stale.
 *
 * Tiers (issue 11): each tier of the cache (pgd_cache_tier) gets a label, its
 * pgd_tier_name, made unique with a number from 2 when two tiers share a name ("disk",
 * "disk2"); the labels name the tiers both on this page (tier="ram") and in the usage of
 * a response (usage.pagoda.cached_tokens_by_tier, render.c).
 *
 * Tenants (issue 13): pagoda_tenant_pages, _pages_reserved, _hits_total (pool pages
 * matched) and _evictions_total by tenant="<16 hex digits>", the hashed tenant id
 * (pgd_tenant_stats.id: 0000000000000000 the default tenant, ffffffffffffffff "other"),
 * never the salt; pagoda_kv_pages_pinned, all tenants' pinned pages.
 *
 * Token budgets (issue 14): pagoda_kv_budget_dropped_tokens_total,
 * pagoda_kv_compaction_freed_pages_total and pagoda_kv_compactions_total (the cache's
 * pgd_cache_stats n_compact_dropped / n_compact_freed / n_compactions), and
 * pagoda_requests_with_budget_total by method (counted at a request's final callback, from
 * its pe_usage.kv_budget_method).
 */
#ifndef PS_METRICS_H
#define PS_METRICS_H

#include <pthread.h>
#include <stdint.h>

#include "buf.h"
#include "scheduler.h"

#define PS_HIST_MAX 16
#define PS_TIER_LABEL_MAX 32 /* bytes of a tier label, NUL included */

typedef struct ps_hist {
    const double *le;                 /* [n] upper bounds in seconds, ascending */
    uint32_t n;                       /* buckets before +Inf */
    uint64_t counts[PS_HIST_MAX + 1]; /* per bucket (not cumulative); [n] is +Inf */
    double sum;
    uint64_t count;
} ps_hist;

/* Request outcomes as the client sees them. */
typedef enum ps_outcome {
    PS_OUT_STOP = 0,  /* end-of-generation token or a stop string */
    PS_OUT_LENGTH,    /* max_tokens or the context */
    PS_OUT_CANCELLED, /* the client went away, or shutdown */
    PS_OUT_ERROR,     /* the forward pass failed or the request did not fit the pool */
    PS_OUT_N
} ps_outcome;

typedef struct ps_metrics {
    pthread_mutex_t mu;
    ps_hist ttft;     /* arrival to first token */
    ps_hist itl;      /* between consecutive tokens of one request */
    ps_hist duration; /* arrival to the final token */
    uint64_t finished[PS_OUT_N];
    uint64_t prompt_tokens;        /* prompt tokens of every submitted request, once each */
    uint64_t prompt_tokens_cached; /* of those, from the prefix cache at first admission */
    uint64_t completion_tokens;    /* completion tokens of finished requests */
    uint64_t http_by_status[6];    /* 200, 400, 401, 404, 405, 413; see metrics.c */
    uint64_t http_other[4];        /* 429, 500, 503, anything else */
    uint64_t http_active;          /* requests being handled (header seen, not completed) */
    /* submitted requests by the token budget they ran with (pe_usage.kv_budget_method) */
    uint64_t budget_requests[PGD_BUDGET_COUNT];
} ps_metrics;

void ps_metrics_init(ps_metrics *m);
void ps_metrics_deinit(ps_metrics *m);
void ps_metrics_observe_ttft(ps_metrics *m, double seconds);
void ps_metrics_observe_itl(ps_metrics *m, double seconds);
/* A request's outcome as the client saw it (once per HTTP generation). */
void ps_metrics_finish(ps_metrics *m, ps_outcome o, double seconds, uint32_t completion_tokens);
/* A submitted request's prompt: u->prompt_tokens and u->cached_tokens (matched at first
 * admission, so never more than the prompt) from its final callback, which every
 * submitted request gets once, cancelled or not. The three prompt counters of the page
 * (total, cached, computed = total - cached) thus count each request once, and a hit
 * ratio cached / total stays within [0, 1]. */
void ps_metrics_prompt(ps_metrics *m, const pe_usage *u);
/* (ps_metrics_prompt also counts the request under its u->kv_budget_method.) */
void ps_metrics_http(ps_metrics *m, int status);
void ps_metrics_http_active(ps_metrics *m, int delta);

/* Static facts the page repeats (pagoda_info and geometry). */
typedef struct ps_metrics_info {
    const char *model_id;
    const char *kv_type;
    uint32_t page_tokens;
    double kv_bytes_per_token; /* K+V of all layers, scales included */
    uint32_t n_ctx;
    int prefix_cache;                                   /* 0 with --no-prefix-cache */
    uint32_t n_tiers;                                   /* pgd_cache_n_tiers */
    char tier_labels[PGD_MAX_TIERS][PS_TIER_LABEL_MAX]; /* ps_metrics_tier_labels */
} ps_metrics_info;

/* Fills info->n_tiers and info->tier_labels from the cache's tiers: each tier's
 * pgd_tier_name (a name too long, or with characters other than [A-Za-z0-9_.-], is
 * shortened and those characters become '_'), then "2", "3", ... on a name already
 * taken ("pool" is taken from the start: the usage's key for the pool). Once, at start. */
void ps_metrics_tier_labels(ps_metrics_info *info, pgd_cache *cache);

/* Appends the Prometheus text exposition (version 0.0.4) to out. */
void ps_metrics_render(ps_metrics *m, const ps_metrics_info *info, pe_sched *s, pgd_cache *cache,
                       ps_buf *out);

#endif /* PS_METRICS_H */
