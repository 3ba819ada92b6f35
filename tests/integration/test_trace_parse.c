/* SPDX-License-Identifier: MIT */
/*
 * test_trace_parse.c - unit tests of the Mooncake trace line parser and loader
 * (sim/trace.c, compiled into this test): valid lines, every kind of bad line with its
 * message, huge ids, reals, nested garbage, embedded NULs, multi-megabyte lines, buffer
 * reuse across lines, and the loader's line counting under both modes.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "t.h"
#include "trace.h"

static trace_req req;
static char err[256];

static int parse(const char *line)
{
    return trace_parse_line(line, strlen(line), &req, err, sizeof err);
}

/* Parses a bad line and checks that the message contains needle. */
static int bad(const char *line, const char *needle)
{
    int rc = parse(line);
    if (rc != TRACE_BAD) T_FAIL("'%s' parsed as %d, expected bad", line, rc);
    if (!strstr(err, needle)) T_FAIL("'%s': message '%s' lacks '%s'", line, err, needle);
    if (req.n_ids != 0) T_FAIL("'%s': n_ids %zu after a bad line", line, req.n_ids);
    return 0;
}

static int test_valid(void)
{
    T_EQ(parse("{\"timestamp\": 27482, \"input_length\": 6955, \"output_length\": 52, "
               "\"hash_ids\": [46, 47, 48]}\n"),
         TRACE_REQ);
    T_EQ(req.timestamp_ms, 27482);
    T_EQ(req.input_length, 6955);
    T_EQ(req.output_length, 52);
    T_EQ(req.n_ids, 3);
    T_EQ(req.ids[0], 46);
    T_EQ(req.ids[2], 48);
    /* Key order, extra keys, blanks and CRLF do not matter; no ids is a valid request. */
    T_EQ(parse("  {\"hash_ids\":[],\"extra\":{\"a\":[1,2]},\"output_length\":0,"
               "\"input_length\":0,\"timestamp\":0}\r\n"),
         TRACE_REQ);
    T_EQ(req.n_ids, 0);
    T_EQ(req.input_length, 0);
    /* Ids up to 2^63 - 1. */
    T_EQ(parse("{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, "
               "\"hash_ids\": [9223372036854775807, 0]}"),
         TRACE_REQ);
    T_ASSERT(req.ids[0] == UINT64_C(9223372036854775807));
    T_EQ(req.ids[1], 0);
    /* The largest length accepted. */
    T_EQ(parse("{\"timestamp\": 1099511627776, \"input_length\": 1099511627776, "
               "\"output_length\": 1, \"hash_ids\": [1]}"),
         TRACE_REQ);
    T_ASSERT(req.input_length == TRACE_MAX_LENGTH);
    return 0;
}

static int test_blank(void)
{
    T_EQ(parse(""), TRACE_BLANK);
    T_EQ(parse("\n"), TRACE_BLANK);
    T_EQ(parse(" \t \r\n"), TRACE_BLANK);
    T_EQ(trace_parse_line(NULL, 0, &req, NULL, 0), TRACE_BLANK);
    return 0;
}

static int test_bad_kinds(void)
{
    const char *head = "{\"timestamp\": 1, \"input_length\": 10, \"output_length\": 1, ";
    char line[512];
    T_EQ(bad("not json", "invalid JSON at column"), 0);
    T_EQ(bad("{\"timestamp\": 1,", "invalid JSON"), 0); /* truncated */
    T_EQ(bad("{} {}", "invalid JSON"), 0);              /* trailing garbage */
    T_EQ(bad("42", "not a JSON object (got an integer)"), 0);
    T_EQ(bad("\"s\"", "not a JSON object (got a string)"), 0);
    T_EQ(bad("null", "not a JSON object (got null)"), 0);
    T_EQ(bad("[1, 2]", "not a JSON object (got an array)"), 0);
    T_EQ(bad("{\"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}",
             "missing field \"timestamp\""),
         0);
    T_EQ(bad("{\"timestamp\": 1, \"output_length\": 1, \"hash_ids\": []}",
             "missing field \"input_length\""),
         0);
    T_EQ(bad("{\"timestamp\": 1, \"input_length\": 1, \"hash_ids\": []}",
             "missing field \"output_length\""),
         0);
    T_EQ(bad("{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1}",
             "missing field \"hash_ids\""),
         0);
    T_EQ(bad("{\"timestamp\": 1, \"input_length\": -1, \"output_length\": 1, \"hash_ids\": []}",
             "input_length is negative (-1)"),
         0);
    T_EQ(bad("{\"timestamp\": 1, \"input_length\": 1, \"output_length\": -7, \"hash_ids\": []}",
             "output_length is negative (-7)"),
         0);
    T_EQ(bad("{\"timestamp\": 1, \"input_length\": 1099511627777, \"output_length\": 1, "
             "\"hash_ids\": []}",
             "input_length is too large"),
         0);
    T_EQ(bad("{\"timestamp\": 2.5, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}",
             "timestamp is not an integer (got a real number)"),
         0);
    T_EQ(bad("{\"timestamp\": \"1\", \"input_length\": 1, \"output_length\": 1, "
             "\"hash_ids\": []}",
             "timestamp is not an integer (got a string)"),
         0);
    T_EQ(bad("{\"timestamp\": 1, \"input_length\": true, \"output_length\": 1, "
             "\"hash_ids\": []}",
             "input_length is not an integer (got true)"),
         0);
    T_EQ(bad("{\"timestamp\": 1, \"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, "
             "\"hash_ids\": []}",
             "duplicate"),
         0);

    snprintf(line, sizeof line, "%s\"hash_ids\": {\"0\": 1}}", head);
    T_EQ(bad(line, "hash_ids is not an array (got an object)"), 0);
    snprintf(line, sizeof line, "%s\"hash_ids\": [1, 2, 3, \"4\"]}", head);
    T_EQ(bad(line, "hash_ids[3] is not an integer (got a string)"), 0);
    snprintf(line, sizeof line, "%s\"hash_ids\": [3.0]}", head);
    T_EQ(bad(line, "hash_ids[0] is not an integer (got a real number)"), 0);
    snprintf(line, sizeof line, "%s\"hash_ids\": [1e3]}", head);
    T_EQ(bad(line, "hash_ids[0] is not an integer"), 0);
    snprintf(line, sizeof line, "%s\"hash_ids\": [5, -1]}", head);
    T_EQ(bad(line, "hash_ids[1] is negative (-1)"), 0);
    snprintf(line, sizeof line, "%s\"hash_ids\": [[1], 2]}", head);
    T_EQ(bad(line, "hash_ids[0] is not an integer (got an array)"), 0);
    snprintf(line, sizeof line, "%s\"hash_ids\": [null]}", head);
    T_EQ(bad(line, "hash_ids[0] is not an integer (got null)"), 0);
    /* 2^63 and 2^64 - 1 do not fit jansson's integers: rejected, never wrapped. */
    snprintf(line, sizeof line, "%s\"hash_ids\": [9223372036854775808]}", head);
    T_EQ(bad(line, "invalid JSON"), 0);
    snprintf(line, sizeof line, "%s\"hash_ids\": [18446744073709551615]}", head);
    T_EQ(bad(line, "invalid JSON"), 0);
    return 0;
}

static int test_nested_garbage(void)
{
    const size_t depth = 100000;
    char *s = malloc(2 * depth + 1);
    T_ASSERT(s != NULL);
    memset(s, '[', depth);
    memset(s + depth, ']', depth);
    s[2 * depth] = '\0';
    T_EQ(parse(s), TRACE_BAD); /* jansson's depth limit, not a stack overflow */
    memset(s, '{', depth);
    s[depth] = '\0';
    T_EQ(parse(s), TRACE_BAD);
    free(s);
    T_EQ(bad("{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": "
             "[{\"a\": [[[{}]]]}]}",
             "hash_ids[0] is not an integer (got an object)"),
         0);
    return 0;
}

static int test_embedded_nul(void)
{
    static const char line[] = "{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, "
                               "\"hash_ids\": [1]}\0{\"x\": 2}";
    T_EQ(trace_parse_line(line, sizeof line - 1, &req, err, sizeof err), TRACE_BAD);
    T_EQ(trace_parse_line(line, strlen(line), &req, err, sizeof err), TRACE_REQ);
    return 0;
}

/* A multi-megabyte line (500k ids), then a short one reusing the buffer, then a bad one. */
static int test_huge_line_and_reuse(void)
{
    const size_t n = 500000;
    size_t cap = n * 12 + 256, len;
    char *s = malloc(cap);
    T_ASSERT(s != NULL);
    len = (size_t)snprintf(s, cap,
                           "{\"timestamp\": 1, \"input_length\": %zu, "
                           "\"output_length\": 1, \"hash_ids\": [",
                           n * 16);
    for (size_t i = 0; i < n; i++) {
        len += (size_t)snprintf(s + len, cap - len, i ? ",%zu" : "%zu", i * 7919);
    }
    len += (size_t)snprintf(s + len, cap - len, "]}\n");
    T_ASSERT(len > 3000000);
    T_EQ(trace_parse_line(s, len, &req, err, sizeof err), TRACE_REQ);
    T_EQ(req.n_ids, n);
    T_EQ(req.ids[n - 1], (n - 1) * 7919);
    free(s);
    T_EQ(parse("{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, "
               "\"hash_ids\": [8, 9]}"),
         TRACE_REQ);
    T_EQ(req.n_ids, 2);
    T_EQ(req.ids[1], 9);
    T_EQ(bad("{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, "
             "\"hash_ids\": [8, 9, \"x\"]}",
             "hash_ids[2]"),
         0);
    return 0;
}

static int test_small_error_buffer(void)
{
    char small[8];
    memset(small, 'x', sizeof small);
    T_EQ(trace_parse_line("[]", 2, &req, small, sizeof small), TRACE_BAD);
    T_EQ(small[7], '\0');
    T_EQ(trace_parse_line("[]", 2, &req, NULL, 0), TRACE_BAD);
    return 0;
}

static const char load_text[] =
    "{\"timestamp\": 1, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\n"
    "\n"
    "garbage\n"
    "{\"timestamp\": 2, \"input_length\": 20, \"output_length\": 1, \"hash_ids\": [1, 2]}\n"
    "{\"timestamp\": 3, \"input_length\": 30, \"output_length\": 1, \"hash_ids\": [1, -2]}\n"
    "{\"timestamp\": 4, \"input_length\": 40, \"output_length\": 1, \"hash_ids\": []}";

static int test_load(void)
{
    trace_set ts = {0};
    trace_load_stats st;
    trace_load_opts o = {"mem.jsonl", 0, 0, 1};
    FILE *f = fmemopen((void *)load_text, sizeof load_text - 1, "r");
    T_ASSERT(f != NULL);
    T_EQ(trace_load(f, &o, &ts, &st), 0);
    fclose(f);
    T_EQ(st.n_lines, 6);
    T_EQ(st.n_blank, 1);
    T_EQ(st.n_bad, 2);
    T_EQ(ts.n_reqs, 3);
    T_EQ(ts.n_ids, 3);
    T_EQ(ts.reqs[1].input_length, 20);
    T_EQ(ts.reqs[1].ids_off, 1);
    T_EQ(ts.reqs[1].n_ids, 2);
    T_EQ(ts.ids[ts.reqs[1].ids_off + 1], 2);
    T_EQ(ts.reqs[2].n_ids, 0);
    trace_set_deinit(&ts);

    o.strict = 1;
    f = fmemopen((void *)load_text, sizeof load_text - 1, "r");
    T_ASSERT(f != NULL);
    T_EQ(trace_load(f, &o, &ts, &st), -1);
    fclose(f);
    T_EQ(st.n_lines, 3); /* stopped at the first bad line */
    T_EQ(ts.n_reqs, 1);
    trace_set_deinit(&ts);
    return 0;
}

int main(void)
{
    T_RUN(test_valid);
    T_RUN(test_blank);
    T_RUN(test_bad_kinds);
    T_RUN(test_nested_garbage);
    T_RUN(test_embedded_nul);
    T_RUN(test_huge_line_and_reuse);
    T_RUN(test_small_error_buffer);
    T_RUN(test_load);
    trace_req_deinit(&req);
    T_DONE();
}
