/* SPDX-License-Identifier: MIT */
/*
 * trace.h - request traces in the Mooncake FAST'25 JSONL format, for `pagoda replay`.
 *
 * One request per line:
 *
 *     {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47]}
 *
 * Each hash id names one prefix-chained block of block_tokens tokens: equal ids at
 * position i mean equal prefixes through block i. All four fields are required and must
 * be non-negative integers (ids in [0, 2^63), lengths and timestamps up to
 * TRACE_MAX_LENGTH); other keys are ignored; duplicate keys are rejected.
 *
 * Three parts: trace_parse_line() parses one line and is pure (no I/O, no globals), so it
 * is the fuzz target (tests/fuzz/fuzz_trace.c); trace_set holds a whole trace in memory,
 * compactly; trace_load() reads a file into a trace_set and reports each bad line on
 * stderr as "NAME:LINE: what is wrong".
 *
 * Tool-local code: a client of nothing in libpagoda, so names use the trace_ prefix.
 */
#ifndef PGD_TOOLS_TRACE_H
#define PGD_TOOLS_TRACE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Largest accepted timestamp and length (2^40): bounds every sum the replay makes. */
#define TRACE_MAX_LENGTH (UINT64_C(1) << 40)

/* Results of trace_parse_line(). */
enum {
    TRACE_REQ = 1,   /* *out holds a request */
    TRACE_BLANK = 0, /* empty or whitespace-only line: skip it silently */
    TRACE_BAD = -1,  /* malformed line: err says why */
    TRACE_NOMEM = -2 /* out of memory (not the line's fault) */
};

/* One parsed request. Zero-initialize before the first parse; the parser reuses ids. */
typedef struct trace_req {
    uint64_t timestamp_ms;
    uint64_t input_length;  /* prompt tokens */
    uint64_t output_length; /* generated tokens */
    uint64_t *ids;          /* [n_ids] hash ids; owned, release with trace_req_deinit */
    size_t n_ids;
    size_t cap_ids;
} trace_req;

/*
 * Parses line[0..len) (no terminating NUL needed; a trailing '\n' or "\r\n" is fine).
 * Returns TRACE_REQ, TRACE_BLANK, TRACE_BAD (err gets a one-line reason such as
 * "hash_ids[3] is not an integer") or TRACE_NOMEM. err may be NULL when errlen is 0.
 */
int trace_parse_line(const char *line, size_t len, trace_req *out, char *err, size_t errlen);
/* Frees the id buffer and zeroes *r. */
void trace_req_deinit(trace_req *r);

/* ---- a trace in memory ---- */

typedef struct trace_rec {
    uint64_t input_length;
    uint64_t ids_off; /* first id in trace_set.ids */
    uint64_t n_ids;
    uint64_t timestamp_ms;  /* 0 unless set after trace_set_add (trace_load sets it) */
    uint64_t output_length; /* likewise; what --model-timing's decode time is made of */
} trace_rec;

typedef struct trace_set {
    trace_rec *reqs; /* [n_reqs], in file order */
    size_t n_reqs, cap_reqs;
    uint64_t *ids; /* [n_ids], every request's ids back to back */
    size_t n_ids, cap_ids;
} trace_set; /* zero-initialize; release with trace_set_deinit */

/* Appends a request (ids are copied; timestamp and output length 0). Returns 0, or -1 when
 * out of memory (set unchanged). */
int trace_set_add(trace_set *s, uint64_t input_length, const uint64_t *ids, size_t n_ids);
/* Appends a parsed request with its timestamp and output length. 0 or -1 (memory). */
int trace_set_add_req(trace_set *s, const trace_req *r);
void trace_set_deinit(trace_set *s);

/* ---- loading a file ---- */

typedef struct trace_load_opts {
    const char *name;     /* for messages: the path, or "<stdin>" */
    int strict;           /* stop at the first bad line */
    int progress;         /* \r progress line on stderr */
    unsigned max_reports; /* bad lines reported one by one; the rest are only counted */
} trace_load_opts;

typedef struct trace_load_stats {
    uint64_t n_lines; /* lines read, blank and bad ones included */
    uint64_t n_blank;
    uint64_t n_bad;
} trace_load_stats;

/*
 * Reads every line of f into *out (appending). Blank lines are skipped; bad lines are
 * reported on stderr and counted, or end the load with --strict.
 * Returns 0, or -1 after printing why on stderr (strict bad line, read error, no memory).
 */
int trace_load(FILE *f, const trace_load_opts *o, trace_set *out, trace_load_stats *st);

#endif /* PGD_TOOLS_TRACE_H */
