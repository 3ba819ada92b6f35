/* SPDX-License-Identifier: MIT */
/*
 * trace.c - Mooncake FAST'25 JSONL traces: the line parser, the in-memory trace and the
 * file loader used by `pagoda replay` (format in trace.h).
 *
 * The parser treats every line as hostile: jansson parses it (depth-limited, duplicate
 * keys rejected, trailing garbage rejected), then each field is checked for presence,
 * type (integer, never a real), sign and range before anything is stored. It writes
 * nothing but *out and err, so the fuzzer (tests/fuzz/fuzz_trace.c) can call it directly.
 */
#include "trace.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

/* ---- the line parser ---- */

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    if (!err || errlen == 0) return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static int is_blank(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return 0;
    }
    return 1;
}

/* Returns what a JSON value is, for messages ("a string", "a real number", ...). */
static const char *type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a real number";
    case JSON_TRUE:
        return "true";
    case JSON_FALSE:
        return "false";
    case JSON_NULL:
        return "null";
    }
    return "unknown";
}

/* Reads a required non-negative integer field no larger than max. Returns 0 or -1. */
static int get_uint(const json_t *obj, const char *key, uint64_t max, uint64_t *out, char *err,
                    size_t errlen)
{
    const json_t *v = json_object_get(obj, key);
    json_int_t x;
    if (!v) {
        set_err(err, errlen, "missing field \"%s\"", key);
        return -1;
    }
    if (!json_is_integer(v)) {
        set_err(err, errlen, "%s is not an integer (got %s)", key, type_name(v));
        return -1;
    }
    x = json_integer_value(v);
    if (x < 0) {
        set_err(err, errlen, "%s is negative (%lld)", key, (long long)x);
        return -1;
    }
    if ((uint64_t)x > max) {
        set_err(err, errlen, "%s is too large (%lld > %llu)", key, (long long)x,
                (unsigned long long)max);
        return -1;
    }
    *out = (uint64_t)x;
    return 0;
}

static int get_ids(const json_t *obj, trace_req *out, char *err, size_t errlen)
{
    const json_t *a = json_object_get(obj, "hash_ids");
    size_t n;
    if (!a) {
        set_err(err, errlen, "missing field \"hash_ids\"");
        return TRACE_BAD;
    }
    if (!json_is_array(a)) {
        set_err(err, errlen, "hash_ids is not an array (got %s)", type_name(a));
        return TRACE_BAD;
    }
    n = json_array_size(a);
    if (n > out->cap_ids) {
        uint64_t *ids;
        if (n > SIZE_MAX / sizeof *ids) return TRACE_NOMEM;
        ids = realloc(out->ids, n * sizeof *ids);
        if (!ids) return TRACE_NOMEM;
        out->ids = ids;
        out->cap_ids = n;
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(a, i);
        json_int_t x;
        if (!json_is_integer(v)) {
            set_err(err, errlen, "hash_ids[%zu] is not an integer (got %s)", i, type_name(v));
            return TRACE_BAD;
        }
        x = json_integer_value(v);
        if (x < 0) {
            set_err(err, errlen, "hash_ids[%zu] is negative (%lld)", i, (long long)x);
            return TRACE_BAD;
        }
        out->ids[i] = (uint64_t)x;
    }
    out->n_ids = n;
    return TRACE_REQ;
}

int trace_parse_line(const char *line, size_t len, trace_req *out, char *err, size_t errlen)
{
    json_error_t je;
    json_t *root;
    int rc = TRACE_BAD;

    out->n_ids = 0;
    set_err(err, errlen, "%s", "");
    if (is_blank(line, len)) return TRACE_BLANK;

    root = json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
    if (!root) {
        set_err(err, errlen, "invalid JSON at column %d: %s", je.column, je.text);
        return TRACE_BAD;
    }
    if (!json_is_object(root)) {
        set_err(err, errlen, "not a JSON object (got %s)", type_name(root));
        goto done;
    }
    if (get_uint(root, "timestamp", TRACE_MAX_LENGTH, &out->timestamp_ms, err, errlen) != 0 ||
        get_uint(root, "input_length", TRACE_MAX_LENGTH, &out->input_length, err, errlen) != 0 ||
        get_uint(root, "output_length", TRACE_MAX_LENGTH, &out->output_length, err, errlen) != 0) {
        goto done;
    }
    rc = get_ids(root, out, err, errlen);
    if (rc != TRACE_REQ) out->n_ids = 0;
done:
    json_decref(root);
    if (rc == TRACE_NOMEM) set_err(err, errlen, "out of memory");
    return rc;
}

void trace_req_deinit(trace_req *r)
{
    free(r->ids);
    memset(r, 0, sizeof *r);
}

/* ---- a trace in memory ---- */

/* Grows *buf (of *cap elements of size sz) to hold at least need. Returns 0 or -1. */
static int grow(void **buf, size_t *cap, size_t need, size_t sz)
{
    size_t ncap = *cap ? *cap : 64;
    void *p;
    if (need <= *cap) return 0;
    while (ncap < need) {
        if (ncap > SIZE_MAX / 2) return -1;
        ncap *= 2;
    }
    if (ncap > SIZE_MAX / sz) return -1;
    p = realloc(*buf, ncap * sz);
    if (!p) return -1;
    *buf = p;
    *cap = ncap;
    return 0;
}

int trace_set_add(trace_set *s, uint64_t input_length, const uint64_t *ids, size_t n_ids)
{
    trace_rec *r;
    if (n_ids > SIZE_MAX - s->n_ids) return -1;
    if (grow((void **)&s->reqs, &s->cap_reqs, s->n_reqs + 1, sizeof *s->reqs) != 0) return -1;
    if (grow((void **)&s->ids, &s->cap_ids, s->n_ids + n_ids, sizeof *s->ids) != 0) return -1;
    r = &s->reqs[s->n_reqs++];
    memset(r, 0, sizeof *r);
    r->input_length = input_length;
    r->ids_off = s->n_ids;
    r->n_ids = n_ids;
    if (n_ids) memcpy(s->ids + s->n_ids, ids, n_ids * sizeof *ids);
    s->n_ids += n_ids;
    return 0;
}

int trace_set_add_req(trace_set *s, const trace_req *r)
{
    if (trace_set_add(s, r->input_length, r->ids, r->n_ids) != 0) return -1;
    s->reqs[s->n_reqs - 1].timestamp_ms = r->timestamp_ms;
    s->reqs[s->n_reqs - 1].output_length = r->output_length;
    return 0;
}

void trace_set_deinit(trace_set *s)
{
    free(s->reqs);
    free(s->ids);
    memset(s, 0, sizeof *s);
}

/* ---- loading a file ---- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int trace_load(FILE *f, const trace_load_opts *o, trace_set *out, trace_load_stats *st)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    trace_req req = {0};
    char err[256];
    int rc = 0, shown = 0;
    double last = now_s();

    memset(st, 0, sizeof *st);
    for (;;) {
        int r;
        errno = 0;
        n = getline(&line, &cap, f);
        if (n < 0) break;
        st->n_lines++;
        r = trace_parse_line(line, (size_t)n, &req, err, sizeof err);
        if (r == TRACE_BLANK) {
            st->n_blank++;
        } else if (r == TRACE_BAD) {
            const char *hint = (n > 0 && line[n - 1] != '\n') ? " (last line has no newline: "
                                                                "truncated?)"
                                                              : "";
            st->n_bad++;
            if (o->strict) {
                fprintf(stderr, "%s:%llu: %s%s\n", o->name, (unsigned long long)st->n_lines, err,
                        hint);
                fprintf(stderr, "%s: stopping at the first bad line (--strict)\n", o->name);
                rc = -1;
                break;
            }
            if (st->n_bad <= o->max_reports) {
                fprintf(stderr, "%s:%llu: %s%s; line skipped\n", o->name,
                        (unsigned long long)st->n_lines, err, hint);
            }
        } else if (r == TRACE_NOMEM || trace_set_add_req(out, &req) != 0) {
            fprintf(stderr, "%s:%llu: out of memory\n", o->name, (unsigned long long)st->n_lines);
            rc = -1;
            break;
        }
        if (o->progress && (st->n_lines & 4095) == 0 && now_s() - last >= 0.5) {
            last = now_s();
            shown = 1;
            fprintf(stderr, "\rreading %s: %llu lines", o->name, (unsigned long long)st->n_lines);
        }
    }
    if (rc == 0 && n < 0 && ferror(f)) {
        fprintf(stderr, "%s: read error: %s\n", o->name, strerror(errno ? errno : EIO));
        rc = -1;
    }
    if (shown) fprintf(stderr, "\r\033[K");
    if (rc == 0 && st->n_bad > o->max_reports) {
        fprintf(stderr, "%s: %llu bad lines in all (only the first %u shown)\n", o->name,
                (unsigned long long)st->n_bad, o->max_reports);
    }
    free(line);
    trace_req_deinit(&req);
    return rc;
}
