/* SPDX-License-Identifier: MIT */
/*
 * loadgen_util.c - the network-free parts of `pagoda bench` (see loadgen.h): the
 * synthetic shared-prefix workload, the workload from a trace (token ids from hash ids,
 * tenants), Poisson arrivals, the SSE parser, the Prometheus sample reader and percentile
 * summaries. Callers: loadgen.c and
 * tests/integration/test_loadgen_util.c.
 *
 * Randomness is splitmix64 keyed by (seed, purpose, index), so a group's system prompt
 * does not change when --prompts or the send order changes.
 */
#include "loadgen.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- random numbers ---- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A generator state for stream (purpose, a, b) of seed. */
static uint64_t stream(uint64_t seed, uint64_t purpose, uint64_t a, uint64_t b)
{
    uint64_t s = seed ^ (purpose * 0xd6e8feb86659fd93ull);
    s = splitmix64(&s) ^ (a * 0x9e3779b97f4a7c15ull);
    s = splitmix64(&s) ^ (b * 0xc2b2ae3d27d4eb4full);
    return splitmix64(&s);
}

/* Uniform in [0, n), n > 0 (the modulo bias is below 2^-32 for any vocabulary). */
static uint32_t below(uint64_t *s, uint32_t n)
{
    return (uint32_t)(splitmix64(s) % n);
}

/* Uniform in [0, 1). */
static double unit(uint64_t *s)
{
    return (double)(splitmix64(s) >> 11) * (1.0 / 9007199254740992.0);
}

/* ---- workload ---- */

enum {
    PURPOSE_SYSTEM = 1,
    PURPOSE_QUESTION = 2,
    PURPOSE_ORDER = 3,
    PURPOSE_ARRIVAL = 4,
    PURPOSE_BLOCK = 5,
    PURPOSE_TENANT = 6
};

void lg_workload_deinit(lg_workload *w)
{
    free(w->tokens);
    free(w->group);
    free(w->off);
    free(w->max_tokens);
    free(w->at_s);
    free(w->tenant);
    memset(w, 0, sizeof *w);
}

const int32_t *lg_workload_prompt(const lg_workload *w, uint32_t i, uint32_t *n_tokens)
{
    if (w->off) {
        *n_tokens = (uint32_t)(w->off[i + 1] - w->off[i]);
        return w->tokens + w->off[i];
    }
    *n_tokens = w->prompt_tokens;
    return w->tokens + (size_t)i * w->prompt_tokens;
}

int lg_workload_init(lg_workload *w, const lg_workload_params *p)
{
    uint64_t n, len, s;
    uint32_t span, *order = NULL;

    memset(w, 0, sizeof *w);
    if (p->groups == 0 || p->prompts == 0 || p->n_vocab <= LG_FIRST_ID ||
        (uint64_t)p->system_tokens + p->question_tokens == 0) {
        errno = EINVAL;
        return -1;
    }
    n = (uint64_t)p->groups * p->prompts;
    len = (uint64_t)p->system_tokens + p->question_tokens;
    if (n > UINT32_MAX || len > UINT32_MAX || n * len > ((uint64_t)1 << 32)) {
        errno = EINVAL;
        return -1;
    }
    w->tokens = malloc((size_t)(n * len) * sizeof *w->tokens);
    w->group = malloc((size_t)n * sizeof *w->group);
    order = malloc((size_t)n * sizeof *order);
    if (!w->tokens || !w->group || !order) {
        free(order);
        lg_workload_deinit(w);
        errno = ENOMEM;
        return -1;
    }
    w->n_requests = (uint32_t)n;
    w->prompt_tokens = (uint32_t)len;
    span = p->n_vocab - LG_FIRST_ID;

    /* The send order: a Fisher-Yates shuffle of pair indices g * P + q. */
    for (uint32_t i = 0; i < n; i++)
        order[i] = i;
    s = stream(p->seed, PURPOSE_ORDER, 0, 0);
    for (uint32_t i = (uint32_t)n; i > 1; i--) {
        uint32_t j = below(&s, i), t = order[i - 1];
        order[i - 1] = order[j];
        order[j] = t;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t g = order[i] / p->prompts, q = order[i] % p->prompts;
        int32_t *t = w->tokens + (size_t)i * len;
        w->group[i] = g;
        s = stream(p->seed, PURPOSE_SYSTEM, g, 0);
        for (uint32_t k = 0; k < p->system_tokens; k++) {
            t[k] = (int32_t)(LG_FIRST_ID + below(&s, span));
        }
        s = stream(p->seed, PURPOSE_QUESTION, g, q);
        for (uint32_t k = 0; k < p->question_tokens; k++) {
            t[p->system_tokens + k] = (int32_t)(LG_FIRST_ID + below(&s, span));
        }
    }
    free(order);
    return 0;
}

/* ---- a workload from a trace ---- */

void lg_block_tokens(int32_t *out, uint32_t n, uint64_t id, uint32_t n_vocab, uint64_t seed)
{
    uint64_t s = stream(seed, PURPOSE_BLOCK, id, 0);
    for (uint32_t k = 0; k < n; k++)
        out[k] = (int32_t)(LG_FIRST_ID + below(&s, n_vocab - LG_FIRST_ID));
}

uint32_t lg_tenant_of(uint64_t first_id, uint32_t k, uint64_t seed)
{
    uint64_t s = stream(seed, PURPOSE_TENANT, first_id, 0);
    return below(&s, k);
}

/* Request r's max_tokens and prompt length under p. Returns the prompt length, 0 when the
 * request is out of range. */
static uint64_t trace_lengths(const lg_trace_params *p, const lg_trace_req *r, uint32_t *max_tok,
                              int *cut)
{
    uint64_t out = r->output_length, len = r->input_length;
    if (p->max_output && out > p->max_output) out = p->max_output;
    if (out == 0) out = 1;
    if (out > UINT32_MAX) out = UINT32_MAX;
    *max_tok = (uint32_t)out;
    *cut = 0;
    if (r->n_ids == 0 || len == 0) return 0;
    if (len > (uint64_t)r->n_ids * p->block_tokens) len = (uint64_t)r->n_ids * p->block_tokens;
    if (p->n_ctx) {
        if (p->n_ctx <= out) return 0;
        if (len > p->n_ctx - out) {
            len = p->n_ctx - out;
            *cut = 1;
        }
    }
    return len;
}

int lg_workload_from_trace(lg_workload *w, const lg_trace_params *p, const lg_trace_req *r,
                           uint32_t n)
{
    uint64_t total = 0;
    uint32_t max_tok;
    int cut;

    memset(w, 0, sizeof *w);
    if (n == 0 || p->block_tokens == 0 || p->n_vocab <= LG_FIRST_ID || p->speedup < 0) {
        errno = EINVAL;
        return -1;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint64_t len = trace_lengths(p, &r[i], &max_tok, &cut);
        if (len == 0) {
            errno = EINVAL;
            return -1;
        }
        total += len;
    }
    if (total > ((uint64_t)1 << 32)) {
        errno = EINVAL;
        return -1;
    }
    w->tokens = malloc((size_t)total * sizeof *w->tokens);
    w->group = calloc(n, sizeof *w->group);
    w->off = malloc(((size_t)n + 1) * sizeof *w->off);
    w->max_tokens = malloc((size_t)n * sizeof *w->max_tokens);
    w->at_s = p->speedup > 0 ? malloc((size_t)n * sizeof *w->at_s) : NULL;
    w->tenant = p->tenants ? malloc((size_t)n * sizeof *w->tenant) : NULL;
    if (!w->tokens || !w->group || !w->off || !w->max_tokens || (p->speedup > 0 && !w->at_s) ||
        (p->tenants && !w->tenant)) {
        lg_workload_deinit(w);
        errno = ENOMEM;
        return -1;
    }
    w->n_requests = n;
    w->off[0] = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t len = trace_lengths(p, &r[i], &max_tok, &cut), done = 0;
        int32_t *t = w->tokens + w->off[i];
        /* Whole blocks, then the first tokens of the one the prompt ends in (a prefix of
         * that block's tokens: they are drawn in order from one stream). */
        for (size_t b = 0; done < len; b++) {
            uint32_t k = len - done < p->block_tokens ? (uint32_t)(len - done) : p->block_tokens;
            lg_block_tokens(t + done, k, r[i].ids[b], p->n_vocab, p->seed);
            done += k;
        }
        w->off[i + 1] = w->off[i] + len;
        w->max_tokens[i] = max_tok;
        w->n_truncated += (uint32_t)cut;
        if (w->tenant) {
            w->tenant[i] = (int32_t)lg_tenant_of(r[i].ids[0], p->tenants, p->seed);
            w->group[i] = (uint32_t)w->tenant[i];
        }
        if (w->at_s) {
            uint64_t t0 = r[0].timestamp_ms, ts = r[i].timestamp_ms;
            w->at_s[i] = ts > t0 ? (double)(ts - t0) / 1000.0 / p->speedup : 0.0;
        }
    }
    return 0;
}

void lg_arrivals(double *t, uint32_t n, double rate, uint64_t seed)
{
    uint64_t s = stream(seed, PURPOSE_ARRIVAL, 0, 0);
    double at = 0.0;
    for (uint32_t i = 0; i < n; i++) {
        t[i] = at;
        at += -log(1.0 - unit(&s)) / rate;
    }
}

/* ---- Server-Sent Events ---- */

/* Appends n bytes to a growable buffer, keeping a NUL after them. 0 or -1 (ENOMEM). */
static int append(char **buf, size_t *len, size_t *cap, const char *bytes, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 256;
        char *b;
        while (c < *len + n + 1)
            c *= 2;
        b = realloc(*buf, c);
        if (!b) return -1;
        *buf = b;
        *cap = c;
    }
    memcpy(*buf + *len, bytes, n);
    *len += n;
    (*buf)[*len] = '\0';
    return 0;
}

/* Handles one complete line (without its end). */
static int sse_line(lg_sse *s, const char *line, size_t len, lg_sse_fn fn, void *user)
{
    const char *colon, *val;
    size_t name_len, val_len;
    int rc;

    if (len == 0) {
        if (!s->have_data) return 0;
        /* The data buffer ends with the '\n' of its last line: drop it. */
        if (s->data_len > 0) s->data[--s->data_len] = '\0';
        rc = fn(user, s->data ? s->data : "", s->data_len);
        s->data_len = 0;
        if (s->data) s->data[0] = '\0';
        s->have_data = 0;
        return rc;
    }
    if (line[0] == ':') return 0;
    colon = memchr(line, ':', len);
    name_len = colon ? (size_t)(colon - line) : len;
    if (name_len != 4 || memcmp(line, "data", 4) != 0) return 0;
    val = colon ? colon + 1 : line + len;
    val_len = (size_t)(line + len - val);
    if (val_len > 0 && val[0] == ' ') {
        val++;
        val_len--;
    }
    if (append(&s->data, &s->data_len, &s->data_cap, val, val_len) != 0 ||
        append(&s->data, &s->data_len, &s->data_cap, "\n", 1) != 0) {
        return -1;
    }
    s->have_data = 1;
    return 0;
}

int lg_sse_feed(lg_sse *s, const char *bytes, size_t n, lg_sse_fn fn, void *user)
{
    size_t i = 0;
    int rc;

    while (i < n) {
        size_t j = i;
        if (s->skip_lf) {
            s->skip_lf = 0;
            if (bytes[i] == '\n') {
                i++;
                continue;
            }
        }
        while (j < n && bytes[j] != '\n' && bytes[j] != '\r')
            j++;
        if (j == n) {
            /* No line end yet: keep the piece for the next call. */
            return append(&s->line, &s->line_len, &s->line_cap, bytes + i, n - i);
        }
        if (s->line_len > 0) {
            if (append(&s->line, &s->line_len, &s->line_cap, bytes + i, j - i) != 0) return -1;
            rc = sse_line(s, s->line, s->line_len, fn, user);
            s->line_len = 0;
        } else {
            rc = sse_line(s, bytes + i, j - i, fn, user);
        }
        s->skip_lf = bytes[j] == '\r';
        i = j + 1;
        if (rc != 0) return rc;
    }
    return 0;
}

void lg_sse_deinit(lg_sse *s)
{
    free(s->line);
    free(s->data);
    memset(s, 0, sizeof *s);
}

/* ---- Prometheus text ---- */

int lg_metric(const char *text, size_t len, const char *name, double *out)
{
    size_t name_len = strlen(name), i = 0;
    int found = 0;
    double sum = 0.0;

    while (i < len) {
        const char *line = text + i, *nl = memchr(line, '\n', len - i);
        size_t line_len = nl ? (size_t)(nl - line) : len - i;
        i += line_len + 1;
        if (line_len <= name_len || line[0] == '#') continue;
        if (memcmp(line, name, name_len) != 0) continue;
        if (line[name_len] == '{' || line[name_len] == ' ' || line[name_len] == '\t') {
            /* The value follows the labels (whose strings may hold '}' only escaped
             * inside quotes: skip to the last '}' of the line) and blanks. */
            char buf[64], *end = NULL;
            size_t k = name_len, n;
            double v;
            if (line[k] == '{') {
                size_t last = k;
                for (size_t m = k; m < line_len; m++) {
                    if (line[m] == '}') last = m;
                }
                k = last + 1;
            }
            while (k < line_len && (line[k] == ' ' || line[k] == '\t'))
                k++;
            n = line_len - k < sizeof buf - 1 ? line_len - k : sizeof buf - 1;
            memcpy(buf, line + k, n);
            buf[n] = '\0';
            v = strtod(buf, &end);
            if (end == buf) continue;
            sum += v;
            found++;
        }
    }
    *out = sum;
    return found;
}

/* ---- summaries ---- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double lg_percentile(const double *v, size_t n, double p)
{
    double rank, frac;
    size_t lo;

    if (n == 0) return 0.0;
    if (p <= 0.0) return v[0];
    if (p >= 100.0) return v[n - 1];
    rank = p / 100.0 * (double)(n - 1);
    lo = (size_t)rank;
    frac = rank - (double)lo;
    if (lo + 1 >= n) return v[n - 1];
    return v[lo] + (v[lo + 1] - v[lo]) * frac;
}

lg_summary lg_summarize(double *v, size_t n)
{
    lg_summary s;
    double sum = 0.0;

    memset(&s, 0, sizeof s);
    if (n == 0) return s;
    qsort(v, n, sizeof *v, cmp_double);
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    s.n = n;
    s.mean = sum / (double)n;
    s.p50 = lg_percentile(v, n, 50.0);
    s.p90 = lg_percentile(v, n, 90.0);
    s.p99 = lg_percentile(v, n, 99.0);
    return s;
}
