/* SPDX-License-Identifier: MIT */
/*
 * loadgen_report.c - what `pagoda bench` prints at the end: a fixed-width table (one
 * column per run, then with/without ratios) or, with --json, one JSON object. Callers:
 * loadgen.c (lg_print_table, lg_print_json), once every run is done.
 *
 * Invariants: figures the server did not give (no cached_tokens, no pagoda /metrics) are
 * shown as "-" or null, never as 0; ratios need both sides.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <jansson.h>

#include "loadgen.h"

/* ---- figures ---- */

static double out_tps(const lg_run_stats *r)
{
    return r->duration_s > 0 ? (double)r->completion_tokens / r->duration_s : 0.0;
}

static double total_tps(const lg_run_stats *r)
{
    return r->duration_s > 0 ? (double)(r->prompt_tokens + r->completion_tokens) / r->duration_s
                             : 0.0;
}

/* cached / prompt tokens; -1 when the server reported no cached_tokens. */
static double hit_ratio(const lg_run_stats *r)
{
    if (r->n_cached_reported == 0 || r->prompt_tokens == 0) return -1.0;
    return (double)r->cached_tokens / (double)r->prompt_tokens;
}

/* a / b, or -1 when it is undefined. */
static double ratio(double a, double b)
{
    return a >= 0 && b > 0 ? a / b : -1.0;
}

/* ---- the table ---- */

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

static void describe_workload(const lg_opts *o, const lg_bench *b, char *s, size_t len)
{
    char arrival[64];
    if (o->rate > 0) {
        snprintf(arrival, sizeof arrival, "Poisson arrivals at %g req/s", o->rate);
    } else if (o->speedup > 0) {
        snprintf(arrival, sizeof arrival, "at the trace's timestamps / %g", o->speedup);
    } else {
        snprintf(arrival, sizeof arrival, "concurrency %llu", (unsigned long long)o->concurrency);
    }
    if (o->trace) {
        uint64_t tokens = b->w.off ? b->w.off[b->w.n_requests] : 0;
        snprintf(s, len,
                 "%u requests from trace %s (%llu prompt tokens, %llu per hash id); %s%llu "
                 "tenants; max_tokens = output_length <= %llu; %s; seed %llu",
                 b->w.n_requests, o->trace, (unsigned long long)tokens,
                 (unsigned long long)o->block_tokens, o->tenants ? "" : "no ",
                 (unsigned long long)o->tenants, (unsigned long long)o->output_tokens, arrival,
                 (unsigned long long)o->seed);
        return;
    }
    snprintf(s, len,
             "%u requests = %llu groups x %llu prompts; prompt = %llu shared + %llu own tokens; "
             "%llu output tokens; %s; seed %llu",
             b->w.n_requests, (unsigned long long)o->groups, (unsigned long long)o->prompts,
             (unsigned long long)o->system_tokens, (unsigned long long)o->question_tokens,
             (unsigned long long)o->output_tokens, arrival, (unsigned long long)o->seed);
}

void lg_print_table(const lg_opts *o, const lg_bench *b, const lg_run_stats *rs, int n)
{
    char wl[1024];
    double v[2] = {0.0, 0.0}; /* n <= 2; set so GCC sees row() read no garbage */

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

/* ---- JSON ---- */

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

static json_t *run_json(const lg_run_stats *r)
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

void lg_print_json(const lg_opts *o, const lg_bench *b, const lg_run_stats *rs, int n)
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
                        o->rate > 0 || o->speedup > 0 ? json_null()
                                                      : json_integer((json_int_t)o->concurrency));
    json_object_set_new(wl, "rate", o->rate > 0 ? json_real(o->rate) : json_null());
    json_object_set_new(wl, "seed", json_integer((json_int_t)o->seed));
    json_object_set_new(wl, "n_vocab", json_integer(b->info.n_vocab));
    if (o->trace) {
        /* A trace workload: the synthetic fields above do not apply to it. */
        json_object_set_new(wl, "trace", json_string(o->trace));
        json_object_set_new(wl, "block_tokens", json_integer((json_int_t)o->block_tokens));
        json_object_set_new(wl, "tenants", json_integer((json_int_t)o->tenants));
        json_object_set_new(wl, "speedup", o->speedup > 0 ? json_real(o->speedup) : json_null());
        json_object_set_new(wl, "prompt_tokens",
                            json_integer(b->w.off ? (json_int_t)b->w.off[b->w.n_requests] : 0));
        json_object_set_new(wl, "truncated", json_integer(b->w.n_truncated));
    }
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
