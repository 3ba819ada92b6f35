/* SPDX-License-Identifier: MIT */
/*
 * test_loadgen_util.c - unit tests of the network-free parts of `pagoda bench`
 * (tools/loadgen_util.c, compiled into this test): the shared-prefix workload (shape,
 * sharing, id range, determinism, every pair once), the workload from a trace (tokens
 * from hash ids: equal ids give equal tokens, so prefixes are shared exactly as in the
 * trace; partial last blocks, caps, the context cut, tenants by conversation, timestamps),
 * Poisson arrivals, the SSE parser
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

/* ---- a workload from a trace ---- */

static lg_trace_params trace_params(uint32_t block_tokens, uint32_t tenants)
{
    lg_trace_params tp;
    memset(&tp, 0, sizeof tp);
    tp.block_tokens = block_tokens;
    tp.n_vocab = 300;
    tp.tenants = tenants;
    tp.seed = 7;
    return tp;
}

static int test_block_tokens(void)
{
    int32_t a[64], b[64], c[64], d[64];
    int differ = 0;

    lg_block_tokens(a, 64, 42, 300, 7);
    lg_block_tokens(b, 64, 42, 300, 7);
    lg_block_tokens(c, 64, 43, 300, 7);
    lg_block_tokens(d, 64, 42, 300, 8);
    T_ASSERT(memcmp(a, b, sizeof a) == 0);
    T_ASSERT(memcmp(a, c, sizeof a) != 0);
    T_ASSERT(memcmp(a, d, sizeof a) != 0);
    for (int k = 0; k < 64; k++) {
        T_ASSERT(a[k] >= (int32_t)LG_FIRST_ID && a[k] < 300);
        differ |= a[k] != a[0];
    }
    T_ASSERT(differ);
    /* Fewer tokens are the first ones of the same block. */
    lg_block_tokens(b, 10, 42, 300, 7);
    T_ASSERT(memcmp(a, b, 10 * sizeof a[0]) == 0);
    return 0;
}

static int test_tenant_of(void)
{
    uint32_t count[4] = {0};
    for (uint64_t id = 0; id < 4000; id++) {
        uint32_t t = lg_tenant_of(id, 4, 7);
        T_ASSERT(t < 4);
        T_EQ(t, lg_tenant_of(id, 4, 7));
        count[t]++;
    }
    for (int t = 0; t < 4; t++)
        T_ASSERT(count[t] > 800 && count[t] < 1200); /* about 1000 each */
    T_EQ(lg_tenant_of(12345, 1, 7), 0);
    return 0;
}

static int test_trace_workload(void)
{
    /* Two conversations: A = [1 2] then [1 2 3] (turn 2 extends turn 1), B = [9 10];
     * a one-off [1 5] shares A's first block only. block_tokens 4. */
    static const uint64_t i0[] = {1, 2}, i1[] = {1, 2, 3}, i2[] = {9, 10}, i3[] = {1, 5};
    lg_trace_req r[4] = {
        {1000, 8, 5, i0, 2},
        {1500, 11, 100, i1, 3}, /* the last block 3 of 4 tokens */
        {3000, 99, 0, i2, 2},   /* input beyond the blocks: 8 tokens */
        {3000, 6, 2, i3, 2},
    };
    lg_trace_params tp = trace_params(4, 3);
    lg_workload w;
    const int32_t *p[4];
    uint32_t n[4];
    int32_t blk[4];

    tp.max_output = 16;
    tp.speedup = 2.0;
    T_OK(lg_workload_from_trace(&w, &tp, r, 4));
    T_EQ(w.n_requests, 4);
    T_EQ(w.n_truncated, 0);
    for (uint32_t i = 0; i < 4; i++)
        p[i] = lg_workload_prompt(&w, i, &n[i]);
    T_EQ(n[0], 8);
    T_EQ(n[1], 11);
    T_EQ(n[2], 8);
    T_EQ(n[3], 6);
    /* Prefix sharing is exactly the trace's: turn 2 starts with all of turn 1. */
    T_ASSERT(memcmp(p[1], p[0], 8 * sizeof(int32_t)) == 0);
    T_ASSERT(memcmp(p[3], p[0], 4 * sizeof(int32_t)) == 0);
    T_ASSERT(memcmp(p[3] + 4, p[0] + 4, 2 * sizeof(int32_t)) != 0);
    T_ASSERT(memcmp(p[2], p[0], 4 * sizeof(int32_t)) != 0);
    /* Each block is lg_block_tokens of its id; the partial one its first tokens. */
    lg_block_tokens(blk, 4, 3, 300, 7);
    T_ASSERT(memcmp(p[1] + 8, blk, 3 * sizeof(int32_t)) == 0);
    lg_block_tokens(blk, 4, 10, 300, 7);
    T_ASSERT(memcmp(p[2] + 4, blk, 4 * sizeof(int32_t)) == 0);
    /* max_tokens: output_length, capped, at least 1. */
    T_EQ(w.max_tokens[0], 5);
    T_EQ(w.max_tokens[1], 16);
    T_EQ(w.max_tokens[2], 1);
    T_EQ(w.max_tokens[3], 2);
    /* A conversation (its first id) has one tenant: A's turns and the one-off on block 1. */
    T_ASSERT(w.tenant != NULL);
    T_EQ(w.tenant[0], (int32_t)lg_tenant_of(1, 3, 7));
    T_EQ(w.tenant[1], w.tenant[0]);
    T_EQ(w.tenant[3], w.tenant[0]);
    T_EQ(w.tenant[2], (int32_t)lg_tenant_of(9, 3, 7));
    T_EQ(w.group[2], (uint32_t)w.tenant[2]);
    /* Send times: from the first timestamp, in seconds, divided by the speedup. */
    T_ASSERT(w.at_s && w.at_s[0] == 0.0 && w.at_s[1] == 0.25 && w.at_s[2] == 1.0);
    T_ASSERT(w.at_s[3] == 1.0);
    lg_workload_deinit(&w);

    /* No tenants, no speedup: neither array. */
    tp = trace_params(4, 0);
    T_OK(lg_workload_from_trace(&w, &tp, r, 2));
    T_ASSERT(w.tenant == NULL && w.at_s == NULL);
    T_EQ(w.max_tokens[1], 100);
    lg_workload_deinit(&w);
    return 0;
}

static int test_trace_workload_ctx(void)
{
    static const uint64_t ids[] = {1, 2, 3, 4};
    lg_trace_req r[2] = {{0, 16, 4, ids, 4}, {0, 8, 4, ids, 2}};
    lg_trace_params tp = trace_params(4, 0);
    lg_workload w, full;
    const int32_t *a, *b;
    uint32_t na, nb;

    /* Context 14: a prompt of 16 + 4 output is cut to 10 tokens, its prefix kept. */
    T_OK(lg_workload_from_trace(&full, &tp, r, 2));
    tp.n_ctx = 14;
    T_OK(lg_workload_from_trace(&w, &tp, r, 2));
    T_EQ(w.n_truncated, 1);
    a = lg_workload_prompt(&w, 0, &na);
    b = lg_workload_prompt(&full, 0, &nb);
    T_EQ(na, 10);
    T_EQ(nb, 16);
    T_ASSERT(memcmp(a, b, 10 * sizeof(int32_t)) == 0);
    lg_workload_prompt(&w, 1, &na);
    T_EQ(na, 8);
    lg_workload_deinit(&w);
    lg_workload_deinit(&full);

    /* Out of range: context <= max_tokens, no ids, no input, no requests, bad block size. */
    tp.n_ctx = 4;
    T_EQ(lg_workload_from_trace(&w, &tp, r, 2), -1);
    T_ASSERT(w.tokens == NULL && w.n_requests == 0);
    tp = trace_params(4, 0);
    r[1].n_ids = 0;
    T_EQ(lg_workload_from_trace(&w, &tp, r, 2), -1);
    r[1].n_ids = 2;
    r[1].input_length = 0;
    T_EQ(lg_workload_from_trace(&w, &tp, r, 2), -1);
    r[1].input_length = 8;
    T_EQ(lg_workload_from_trace(&w, &tp, r, 0), -1);
    tp.block_tokens = 0;
    T_EQ(lg_workload_from_trace(&w, &tp, r, 2), -1);
    lg_workload_deinit(&w);
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
    T_RUN(test_block_tokens);
    T_RUN(test_tenant_of);
    T_RUN(test_trace_workload);
    T_RUN(test_trace_workload_ctx);
    T_RUN(test_arrivals);
    T_RUN(test_sse);
    T_RUN(test_sse_stop);
    T_RUN(test_metric);
    T_RUN(test_summary);
    T_DONE();
}
