/* SPDX-License-Identifier: MIT */
/*
 * loadgen.h - the parts of `pagoda bench` (loadgen.c) that need no network, in
 * loadgen_util.c so tests/integration/test_loadgen_util.c can check them on their own:
 *
 *   lg_workload   the synthetic shared-prefix workload: G groups x P prompts, each prompt
 *                 = its group's system prompt (S token ids) + its own question (Q ids), in
 *                 a shuffled send order; deterministic from the seed
 *   lg_arrivals   Poisson arrival times for --rate
 *   lg_sse        an incremental Server-Sent Events parser (bytes in, `data` payloads out)
 *   lg_metric     reads one sample from a Prometheus text exposition
 *   lg_summary    mean and p50/p90/p99 of a set of values
 *
 * Nothing here is thread-safe or needs to be: the bench runs its requests from one thread.
 */
#ifndef PGD_TOOLS_LOADGEN_H
#define PGD_TOOLS_LOADGEN_H

#include <stddef.h>
#include <stdint.h>

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
    uint32_t prompt_tokens; /* S + Q, the same for every request */
    int32_t *tokens;        /* [n_requests][prompt_tokens], in send order */
    uint32_t *group;        /* [n_requests]: the group of each request */
} lg_workload;

/* Fills w. Returns 0, or -1 when memory runs out or a parameter is out of range (w is
 * then empty). Request i of the send order is a shuffle (seeded) of the G x P pairs; the
 * tokens of a (group, prompt) pair depend on the seed and the pair only. */
int lg_workload_init(lg_workload *w, const lg_workload_params *p);
void lg_workload_deinit(lg_workload *w); /* zeroed or initialised w */

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

#endif /* PGD_TOOLS_LOADGEN_H */
