/* SPDX-License-Identifier: MIT */
/*
 * test_loadgen_util.c - unit tests of the network-free parts of `pagoda bench`
 * (tools/loadgen_util.c, compiled into this test): the shared-prefix workload (shape,
 * sharing, id range, determinism, every pair once), Poisson arrivals, the SSE parser
 * (every split point, CRLF/CR/LF, comments, multi-line data, early stop), the Prometheus
 * sample reader and the percentile summaries.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loadgen.h"
#include "t.h"

/* ---- workload ---- */

static lg_workload_params params(uint32_t g, uint32_t p, uint32_t s, uint32_t q, uint64_t seed)
{
    lg_workload_params wp;
    memset(&wp, 0, sizeof wp);
    wp.groups = g;
    wp.prompts = p;
    wp.system_tokens = s;
    wp.question_tokens = q;
    wp.n_vocab = 512;
    wp.seed = seed;
    return wp;
}

static const int32_t *prompt(const lg_workload *w, uint32_t i)
{
    return w->tokens + (size_t)i * w->prompt_tokens;
}

static int test_workload_shape(void)
{
    lg_workload_params wp = params(3, 5, 40, 7, 9);
    lg_workload w;
    uint32_t seen[3] = {0};

    T_OK(lg_workload_init(&w, &wp));
    T_EQ(w.n_requests, 15);
    T_EQ(w.prompt_tokens, 47);
    for (uint32_t i = 0; i < w.n_requests; i++) {
        T_ASSERT(w.group[i] < 3);
        seen[w.group[i]]++;
        for (uint32_t k = 0; k < w.prompt_tokens; k++) {
            T_ASSERT(prompt(&w, i)[k] >= (int32_t)LG_FIRST_ID && prompt(&w, i)[k] < 512);
        }
        for (uint32_t j = 0; j < i; j++) {
            int same_sys = memcmp(prompt(&w, i), prompt(&w, j), 40 * sizeof(int32_t)) == 0;
            /* The system prompt is shared exactly within a group; the questions differ. */
            T_EQ(same_sys, w.group[i] == w.group[j]);
            T_ASSERT(memcmp(prompt(&w, i) + 40, prompt(&w, j) + 40, 7 * sizeof(int32_t)) != 0);
        }
    }
    T_EQ(seen[0], 5);
    T_EQ(seen[1], 5);
    T_EQ(seen[2], 5);
    lg_workload_deinit(&w);
    return 0;
}

static int test_workload_deterministic(void)
{
    lg_workload_params wp = params(2, 4, 16, 4, 5);
    lg_workload a, b, c, d;
    int order_differs = 0;

    T_OK(lg_workload_init(&a, &wp));
    T_OK(lg_workload_init(&b, &wp));
    T_ASSERT(memcmp(a.tokens, b.tokens, (size_t)8 * 20 * sizeof(int32_t)) == 0);
    T_ASSERT(memcmp(a.group, b.group, 8 * sizeof(uint32_t)) == 0);
    wp.seed = 6;
    T_OK(lg_workload_init(&c, &wp));
    T_ASSERT(memcmp(a.tokens, c.tokens, (size_t)8 * 20 * sizeof(int32_t)) != 0);
    /* A group's system prompt does not depend on how many prompts it has. */
    wp = params(2, 9, 16, 4, 5);
    T_OK(lg_workload_init(&d, &wp));
    for (uint32_t i = 0; i < d.n_requests; i++) {
        for (uint32_t j = 0; j < a.n_requests; j++) {
            if (d.group[i] != a.group[j]) continue;
            T_ASSERT(memcmp(prompt(&d, i), prompt(&a, j), 16 * sizeof(int32_t)) == 0);
        }
    }
    /* The send order is shuffled, not group after group. */
    for (uint32_t i = 1; i < d.n_requests; i++)
        order_differs |= d.group[i] < d.group[i - 1];
    T_ASSERT(order_differs);
    lg_workload_deinit(&a);
    lg_workload_deinit(&b);
    lg_workload_deinit(&c);
    lg_workload_deinit(&d);
    return 0;
}

static int test_workload_bad_params(void)
{
    lg_workload_params wp = params(0, 4, 16, 4, 1);
    lg_workload w;
    T_EQ(lg_workload_init(&w, &wp), -1);
    T_ASSERT(w.tokens == NULL && w.n_requests == 0);
    wp = params(1, 1, 0, 0, 1);
    T_EQ(lg_workload_init(&w, &wp), -1);
    wp = params(1, 1, 4, 0, 1);
    wp.n_vocab = LG_FIRST_ID;
    T_EQ(lg_workload_init(&w, &wp), -1);
    /* Only a question, no system prompt: fine. */
    wp = params(1, 2, 0, 3, 1);
    T_OK(lg_workload_init(&w, &wp));
    T_EQ(w.prompt_tokens, 3);
    lg_workload_deinit(&w);
    lg_workload_deinit(&w); /* twice: zeroed */
    return 0;
}

static int test_arrivals(void)
{
    enum { N = 20000 };
    double *t = malloc(N * sizeof *t), *u = malloc(N * sizeof *u), mean;
    T_ASSERT(t && u);
    lg_arrivals(t, N, 4.0, 3);
    lg_arrivals(u, N, 4.0, 3);
    T_ASSERT(t[0] == 0.0);
    for (int i = 1; i < N; i++)
        T_ASSERT(t[i] >= t[i - 1]);
    T_ASSERT(memcmp(t, u, N * sizeof *t) == 0);
    mean = t[N - 1] / (N - 1);
    T_ASSERT(fabs(mean - 0.25) < 0.25 * 0.05);
    free(t);
    free(u);
    return 0;
}

/* ---- SSE ---- */

typedef struct events {
    char got[16][256];
    int n;
    int stop_at; /* return 1 from this event on (0: never) */
} events;

static int on_event(void *user, const char *data, size_t len)
{
    events *e = user;
    if (strlen(data) != len) return -2;
    if (e->n < 16) snprintf(e->got[e->n], sizeof e->got[0], "%s", data);
    e->n++;
    return e->stop_at && e->n >= e->stop_at ? 1 : 0;
}

/* Feeds text split at position cut (and whole when cut < 0); checks the events. */
static int check_stream(const char *text, const char *const *want, int n_want)
{
    size_t len = strlen(text);
    for (long cut = -1; cut <= (long)len; cut++) {
        lg_sse s;
        events e;
        memset(&s, 0, sizeof s);
        memset(&e, 0, sizeof e);
        if (cut < 0) {
            /* One byte at a time. */
            for (size_t i = 0; i < len; i++)
                T_EQ(lg_sse_feed(&s, text + i, 1, on_event, &e), 0);
        } else {
            T_EQ(lg_sse_feed(&s, text, (size_t)cut, on_event, &e), 0);
            T_EQ(lg_sse_feed(&s, text + cut, len - (size_t)cut, on_event, &e), 0);
        }
        if (e.n != n_want) T_FAIL("cut %ld: %d events, want %d", cut, e.n, n_want);
        for (int i = 0; i < n_want; i++) {
            if (strcmp(e.got[i], want[i]) != 0) {
                T_FAIL("cut %ld: event %d is '%s', want '%s'", cut, i, e.got[i], want[i]);
            }
        }
        lg_sse_deinit(&s);
    }
    return 0;
}

static int test_sse(void)
{
    static const char *const want1[] = {"{\"a\":1}", "{\"b\":2}", "[DONE]"};
    static const char *const want2[] = {"x\ny", "", "z", "", "w"};
    static const char *const want3[] = {"one", "two"};

    T_OK(check_stream("data: {\"a\":1}\n\ndata: {\"b\":2}\n\ndata: [DONE]\n\n", want1, 3));
    T_OK(check_stream("data: {\"a\":1}\r\n\r\ndata: {\"b\":2}\r\n\r\ndata: [DONE]\r\n\r\n", want1,
                      3));
    T_OK(check_stream("data: {\"a\":1}\r\rdata: {\"b\":2}\r\rdata: [DONE]\r\r", want1, 3));
    /* Comments, other fields, two data lines, an empty data, "data" without a colon, no
     * space after the colon; an event without data dispatches nothing; an unfinished
     * event at the end is not dispatched. */
    T_OK(check_stream(": keep-alive\n\nevent: x\nid: 3\ndata: x\ndata: y\n\ndata:\n\n"
                      "retry: 5\n\ndata:z\n\ndata\n\ndata: not finished\n",
                      want2, 4));
    T_OK(check_stream("data: w\n\n", want2 + 4, 1));
    T_OK(check_stream("\n\n\ndata: one\n\n\n\ndata: two\n\n", want3, 2));
    return 0;
}

static int test_sse_stop(void)
{
    const char *text = "data: 1\n\ndata: 2\n\ndata: 3\n\n";
    lg_sse s;
    events e;
    memset(&s, 0, sizeof s);
    memset(&e, 0, sizeof e);
    e.stop_at = 2;
    T_EQ(lg_sse_feed(&s, text, strlen(text), on_event, &e), 1);
    T_EQ(e.n, 2);
    lg_sse_deinit(&s);
    return 0;
}

/* ---- Prometheus ---- */

static int test_metric(void)
{
    const char *text = "# HELP pagoda_kv_usage_ratio Fraction of pages in use.\n"
                       "# TYPE pagoda_kv_usage_ratio gauge\n"
                       "pagoda_kv_usage_ratio 0.25\n"
                       "pagoda_kv_usage_ratio_peak 0.75\n"
                       "pagoda_requests_finished_total{reason=\"stop\"} 3\n"
                       "pagoda_requests_finished_total{reason=\"len}gth\"} 4 1700000000\n"
                       "pagoda_x\t1e3\n"
                       "pagoda_bad{a=\"b\"} nope\n"
                       "pagoda_tail 5";
    double v = -1;

    T_EQ(lg_metric(text, strlen(text), "pagoda_kv_usage_ratio", &v), 1);
    T_ASSERT(v == 0.25);
    T_EQ(lg_metric(text, strlen(text), "pagoda_requests_finished_total", &v), 2);
    T_ASSERT(v == 7.0);
    T_EQ(lg_metric(text, strlen(text), "pagoda_x", &v), 1);
    T_ASSERT(v == 1000.0);
    T_EQ(lg_metric(text, strlen(text), "pagoda_bad", &v), 0);
    T_EQ(lg_metric(text, strlen(text), "pagoda_kv", &v), 0);
    T_ASSERT(v == 0.0);
    T_EQ(lg_metric(text, strlen(text), "pagoda_tail", &v), 1);
    T_ASSERT(v == 5.0);
    /* The length bounds the text: the last line cut to "pagoda_tail " has no value. */
    T_EQ(lg_metric(text, strlen(text) - 1, "pagoda_tail", &v), 0);
    T_EQ(lg_metric("", 0, "pagoda_x", &v), 0);
    return 0;
}

/* ---- summaries ---- */

static int test_summary(void)
{
    double two[] = {2.0, 1.0}, one[] = {3.0}, hundred[100];
    lg_summary s = lg_summarize(two, 2);

    T_EQ(s.n, 2);
    T_ASSERT(s.p50 == 1.5 && s.mean == 1.5);
    T_ASSERT(two[0] == 1.0); /* sorted in place */
    s = lg_summarize(one, 1);
    T_ASSERT(s.p50 == 3.0 && s.p90 == 3.0 && s.p99 == 3.0);
    s = lg_summarize(NULL, 0);
    T_ASSERT(s.n == 0 && s.p50 == 0.0);
    for (int i = 0; i < 100; i++)
        hundred[i] = 100 - i; /* 100..1 */
    s = lg_summarize(hundred, 100);
    T_ASSERT(fabs(s.p50 - 50.5) < 1e-9);
    T_ASSERT(fabs(s.p90 - 90.1) < 1e-9);
    T_ASSERT(fabs(s.p99 - 99.01) < 1e-9);
    T_ASSERT(lg_percentile(hundred, 100, 0) == 1.0 && lg_percentile(hundred, 100, 100) == 100.0);
    return 0;
}

int main(void)
{
    T_RUN(test_workload_shape);
    T_RUN(test_workload_deterministic);
    T_RUN(test_workload_bad_params);
    T_RUN(test_arrivals);
    T_RUN(test_sse);
    T_RUN(test_sse_stop);
    T_RUN(test_metric);
    T_RUN(test_summary);
    T_DONE();
}
