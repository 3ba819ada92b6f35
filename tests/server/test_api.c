/* SPDX-License-Identifier: MIT */
/*
 * test_api.c - server/api.c: OpenAI request parsing and the error shape.
 *   - a completion with every field, a chat with text parts, token-id prompts;
 *   - defaults (temperature 1, top_p 1, no max_tokens, no salt);
 *   - each bad field gives 400 with param set to the field and named in the message;
 *   - an empty cache_salt and a NUL in model, prompt, a role or content: 400 naming it;
 *   - the size limits: a token-id prompt of n_ctx ids, a body over PS_MAX_VALUES (a
 *     16 MB one refused in milliseconds), strings full of ',' ':' '[' and escapes that
 *     are no values;
 *   - malformed JSON, and 20,000 random mutations of valid bodies: never a crash or a
 *     leak (ASan), always 0, 400 or 413;
 *   - ps_error_json writes {"error":{"message","type","param","code"}};
 *   - retention fields (issue 13): prompt_cache_retention, prompt_cache_key (its salt is
 *     longer than any cache_salt), cache_control on a message and on a part (the longest
 *     ttl wins), the "pagoda" object; each malformed form a 400 naming the field; the
 *     mapping ps_req_retention; the admin bodies (ps_admin_parse);
 *   - token budgets (issue 14): pagoda.kv_budget and pagoda.kv_budget_method parsed and
 *     each malformed form a 400 naming the field; ps_req_budget against a server with and
 *     without a default: the method's defaults, 0 dense, a method alone, every method
 *     and budget as pgd_budget_params_check judges it;
 *   - ps_err_status: every row of the pgd_status -> HTTP table (status, type, code, param,
 *     message), the stage defaults for statuses no row names, and that the old messages
 *     (which the HTTP tests match) are kept byte for byte.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "api.h"
#include "t.h"

static int parse(ps_kind k, const char *s, ps_req *r, ps_error *e)
{
    return ps_req_parse(k, s, strlen(s), 512, 0, r, e);
}

static int test_full_completion(void)
{
    ps_req r;
    ps_error e;
    const char *body =
        "{\"model\":\"m\",\"prompt\":\"Once\",\"max_tokens\":7,\"temperature\":0.5,"
        "\"top_p\":0.9,\"top_k\":40,\"min_p\":0.1,\"seed\":-3,\"stop\":[\"a\",\"bc\"],"
        "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"n\":1,"
        "\"cache_salt\":\"t1\",\"ignore_eos\":true,\"frequency_penalty\":0,\"user\":\"x\",\"echo\":"
        "false,"
        "\"logprobs\":null}";
    T_EQ(parse(PS_COMPLETION, body, &r, &e), 0);
    T_ASSERT(strcmp(r.model, "m") == 0);
    T_ASSERT(strcmp(r.prompt, "Once") == 0);
    T_EQ(r.prompt_len, 4);
    T_EQ(r.max_tokens, 7);
    T_ASSERT(r.temperature == 0.5 && r.top_p == 0.9 && r.min_p == 0.1);
    T_EQ(r.top_k, 40);
    T_ASSERT(r.has_seed && r.seed == (uint64_t)-3);
    T_EQ(r.n_stop, 2);
    T_ASSERT(strcmp(r.stop[1], "bc") == 0);
    T_ASSERT(r.stream && r.include_usage);
    T_EQ(r.salt_len, 2);
    T_ASSERT(r.ignore_eos);
    ps_req_deinit(&r);

    T_EQ(parse(PS_COMPLETION, "{\"prompt\":\"x\"}", &r, &e), 0);
    T_ASSERT(!r.model && r.temperature == 1.0 && r.top_p == 1.0 && !r.max_tokens && !r.salt);
    T_ASSERT(!r.stream && !r.has_seed && !r.n_stop);
    ps_req_deinit(&r);

    /* Token ids, bare or nested once; a one-string array; nulls mean absent. */
    T_EQ(parse(PS_COMPLETION, "{\"prompt\":[1,2,511],\"max_tokens\":null,\"stop\":null}", &r, &e),
         0);
    T_EQ(r.n_prompt_toks, 3);
    T_EQ(r.prompt_toks[2], 511);
    ps_req_deinit(&r);
    T_EQ(parse(PS_COMPLETION, "{\"prompt\":[[4,5]]}", &r, &e), 0);
    T_EQ(r.n_prompt_toks, 2);
    ps_req_deinit(&r);
    T_EQ(parse(PS_COMPLETION, "{\"prompt\":[\"hi\"]}", &r, &e), 0);
    T_ASSERT(strcmp(r.prompt, "hi") == 0);
    ps_req_deinit(&r);
    /* A salt is bytes with a length: NUL is fine there. */
    T_EQ(parse(PS_COMPLETION, "{\"prompt\":\"x\",\"cache_salt\":\"a\\u0000b\"}", &r, &e), 0);
    T_EQ(r.salt_len, 3);
    ps_req_deinit(&r);
    return 0;
}

static int test_chat(void)
{
    ps_req r;
    ps_error e;
    const char *body =
        "{\"messages\":[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":"
        "[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]}],"
        "\"max_tokens\":3,\"max_completion_tokens\":9}";
    T_EQ(parse(PS_CHAT, body, &r, &e), 0);
    T_EQ(r.n_msgs, 2);
    T_ASSERT(strcmp(r.msgs[0].role, "system") == 0 && strcmp(r.msgs[0].content, "S") == 0);
    T_ASSERT(strcmp(r.msgs[1].content, "ab") == 0);
    T_EQ(r.max_tokens, 9); /* max_completion_tokens wins */
    ps_req_deinit(&r);
    return 0;
}

static int test_errors(void)
{
    static const struct {
        ps_kind k;
        const char *body, *param;
    } cases[] = {
        {PS_COMPLETION, "", ""},
        {PS_COMPLETION, "{", ""},
        {PS_COMPLETION, "null", ""},
        {PS_COMPLETION, "{\"prompt\":\"x\"} trailing", ""},
        {PS_COMPLETION, "{\"prompt\":\"x\",\"prompt\":\"y\"}", ""},
        {PS_COMPLETION, "{}", "prompt"},
        {PS_COMPLETION, "{\"prompt\":{}}", "prompt"},
        {PS_COMPLETION, "{\"prompt\":[1,\"a\"]}", "prompt"},
        {PS_COMPLETION, "{\"prompt\":[-1]}", "prompt"},
        {PS_COMPLETION, "{\"prompt\":[512]}", "prompt"},
        {PS_COMPLETION, "{\"prompt\":[\"a\",\"b\"]}", "prompt"},
        {PS_COMPLETION, "{\"prompt\":[[]]}", "prompt"},
        {PS_COMPLETION, "{\"prompt\":\"x\",\"max_tokens\":0}", "max_tokens"},
        {PS_COMPLETION, "{\"prompt\":\"x\",\"max_tokens\":1.5}", "max_tokens"},
        {PS_COMPLETION, "{\"prompt\":\"x\",\"temperature\":-1}", "temperature"},
        {PS_COMPLETION, "{\"prompt\":\"x\",\"top_p\":1.5}", "top_p"},
        {PS_COMPLETION, "{\"prompt\":\"x\",\"top_k\":-2}", "top_k"},
        {PS_COMPLETION, "{\"prompt\":\"x\",\"min_p\":2}", "min_p"},
        {PS_COMPLETION, "{\"prompt\":\"x\",\"seed\":\"s\"}", "seed"},
        {PS_COMPLETION, "{\"prompt\":\"x\",\"stop\":[1]}", "stop"},
        {PS_COMPLETION, "{\"prompt\":\"x\",\"stop\":\"\"}", "stop"},
        {PS_COMPLETION, "{\"prompt\":\"x\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", "stop"},
        {PS_COMPLETION, "{\"prompt\":\"x\",\"stream\":1}", "stream"},
        {PS_COMPLETION, "{\"prompt\":\"x\",\"ignore_eos\":\"y\"}", "ignore_eos"},
        {PS_COMPLETION, "{\"prompt\":\"x\",\"stream_options\":[]}", "stream_options"},
        {PS_COMPLETION, "{\"prompt\":\"x\",\"n\":3}", "n"},
        {PS_COMPLETION, "{\"prompt\":\"x\",\"best_of\":2}", "best_of"},
        {PS_COMPLETION, "{\"prompt\":\"x\",\"echo\":true}", "echo"},
        {PS_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":5}", "logprobs"},
        {PS_COMPLETION, "{\"prompt\":\"x\",\"cache_salt\":[]}", "cache_salt"},
        {PS_COMPLETION, "{\"prompt\":\"x\",\"model\":1}", "model"},
        /* issue 10: an empty salt is refused (vLLM does), it never means the default tenant */
        {PS_COMPLETION, "{\"prompt\":\"x\",\"cache_salt\":\"\"}", "cache_salt"},
        /* issue 10: NUL in any text field is refused, naming the field (one rule) */
        {PS_COMPLETION, "{\"prompt\":\"x\",\"model\":\"m\\u0000x\"}", "model"},
        {PS_COMPLETION, "{\"prompt\":\"a\\u0000b\"}", "prompt"},
        {PS_COMPLETION, "{\"prompt\":[\"a\\u0000b\"]}", "prompt"},
        {PS_CHAT, "{\"messages\":[{\"role\":\"user\\u0000x\",\"content\":\"x\"}]}", "messages"},
        {PS_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}", "messages"},
        {PS_CHAT,
         "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":"
         "\"a\\u0000\"}]}]}",
         "messages"},
        {PS_CHAT, "{\"prompt\":\"x\"}", "messages"},
        {PS_CHAT, "{\"messages\":[]}", "messages"},
        {PS_CHAT, "{\"messages\":[1]}", "messages"},
        {PS_CHAT, "{\"messages\":[{\"content\":\"x\"}]}", "messages"},
        {PS_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":null}]}", "messages"},
        {PS_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\"}]}]}",
         "messages"},
        {PS_CHAT,
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":0}",
         "max_completion_tokens"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ps_req r;
        ps_error e;
        if (parse(cases[i].k, cases[i].body, &r, &e) != -1) T_FAIL("accepted: %s", cases[i].body);
        T_EQ(e.status, 400);
        if (strcmp(e.param, cases[i].param) != 0)
            T_FAIL("%s: param '%s', want '%s'", cases[i].body, e.param, cases[i].param);
        if (cases[i].param[0] && !strstr(e.message, cases[i].param))
            T_FAIL("%s: message '%s' does not name the field", cases[i].body, e.message);
        T_ASSERT(r.prompt == NULL && r.msgs == NULL && r.n_stop == 0);
        if (strstr(cases[i].body, "\\u0000") && !strstr(e.message, "NUL"))
            T_FAIL("%s: message '%s' does not say NUL", cases[i].body, e.message);
    }
    /* The NUL messages name the exact place. */
    {
        ps_req r;
        ps_error e;
        T_EQ(parse(PS_CHAT,
                   "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},"
                   "{\"role\":\"assistant\\u0000\",\"content\":\"y\"}]}",
                   &r, &e),
             -1);
        T_ASSERT(strstr(e.message, "'messages'[1].role contains a NUL") != NULL);
    }
    return 0;
}

/* Builds {"prompt":[1,1,...]} with n ids into a malloc'ed string. */
static char *token_body(size_t n, size_t *len)
{
    char *b = malloc(16 + 2 * n);
    size_t k = 0;
    memcpy(b, "{\"prompt\":[", 11);
    k = 11;
    for (size_t i = 0; i < n; i++) {
        if (i) b[k++] = ',';
        b[k++] = '1';
    }
    b[k++] = ']';
    b[k++] = '}';
    b[k] = '\0';
    *len = k;
    return b;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* issue 10: the size limits that bound what a body makes the server allocate. */
static int test_limits(void)
{
    ps_req r;
    ps_error e;
    size_t len;
    char *b;
    /* A token-id prompt of n_ctx ids or more: 413 context_length_exceeded, named prompt. */
    b = token_body(15, &len);
    T_EQ(ps_req_parse(PS_COMPLETION, b, len, 512, 16, &r, &e), 0);
    T_EQ(r.n_prompt_toks, 15);
    ps_req_deinit(&r);
    free(b);
    b = token_body(16, &len);
    T_EQ(ps_req_parse(PS_COMPLETION, b, len, 512, 16, &r, &e), -1);
    T_EQ(e.status, 413);
    T_ASSERT(strcmp(e.code, "context_length_exceeded") == 0 && strcmp(e.param, "prompt") == 0);
    free(b);
    /* More JSON values than PS_MAX_VALUES: refused before parsing. */
    b = token_body(PS_MAX_VALUES(16), &len);
    T_EQ(ps_req_parse(PS_COMPLETION, b, len, 512, 16, &r, &e), -1);
    T_EQ(e.status, 413);
    T_ASSERT(strcmp(e.code, "request_too_large") == 0);
    free(b);
    /* Commas, colons and brackets inside strings are no values, nor is what follows an
     * escaped quote; an escaped backslash before the closing quote closes it. */
    {
        const size_t n = 20000;
        char *s = malloc(n * 3 + 64);
        size_t k = 0;
        memcpy(s, "{\"prompt\":\"", 11);
        k = 11;
        for (size_t i = 0; i < n; i++) {
            s[k++] = ",:["[i % 3];
            if (i % 100 == 0) {
                s[k++] = '\\';
                s[k++] = i % 200 ? '"' : '\\';
            }
        }
        memcpy(s + k, "\\\\\"}", 4); /* \\ then the closing quote */
        k += 4;
        T_EQ(ps_req_parse(PS_COMPLETION, s, k, 512, 16, &r, &e), 0);
        T_ASSERT(r.prompt && r.prompt_len > n);
        ps_req_deinit(&r);
        free(s);
    }
    /* 16 MB of token ids against a 2,048-token context: refused at once, no tree built. */
    {
        double t0;
        b = token_body(8u << 20, &len);
        t0 = now_s();
        T_EQ(ps_req_parse(PS_COMPLETION, b, len, 512, 2048, &r, &e), -1);
        printf("     16 MB body of token ids: %d in %.4f s\n", e.status, now_s() - t0);
        T_EQ(e.status, 413);
        T_ASSERT(now_s() - t0 < 5.0);
        free(b);
    }
    return 0;
}

static int test_mutations(void)
{
    static const char *seeds[] = {
        "{\"prompt\":\"Once\",\"max_tokens\":7,\"stop\":[\"a\",\"bc\"],\"stream\":true}",
        "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"}]}]}",
        "{\"prompt\":[[1,2,3]],\"cache_salt\":\"s\",\"seed\":1,\"stream_options\":{}}",
    };
    uint64_t rng = 42;
    char buf[256];
    int ok = 0;
    for (int it = 0; it < 20000; it++) {
        const char *s = seeds[it % 3];
        size_t n = strlen(s);
        memcpy(buf, s, n);
        int edits = 1 + (int)(t_rand(&rng) % 4);
        for (int k = 0; k < edits; k++) {
            size_t at = (size_t)(t_rand(&rng) % n);
            static const char alpha[] = "{}[]\":,0123456789-.eEtrufalsn \\u\x01\xff";
            buf[at] = alpha[t_rand(&rng) % (sizeof alpha - 1)];
        }
        if (t_rand(&rng) % 8 == 0) n = (size_t)(t_rand(&rng) % n);
        ps_req r;
        ps_error e;
        int rc = ps_req_parse(it % 3 == 1 ? PS_CHAT : PS_COMPLETION, buf, n, 512, 64, &r, &e);
        if (rc == 0) {
            ok++;
            ps_req_deinit(&r);
        } else {
            T_ASSERT(e.status == 400 || e.status == 413);
        }
    }
    printf("mutations: %d of 20000 still valid\n", ok);
    return 0;
}

static int test_error_json(void)
{
    ps_error e;
    ps_buf b;
    json_error_t je;
    ps_err(&e, 413, "prompt", "context_length_exceeded", "too long: %d", 5);
    ps_buf_init(&b);
    T_OK(ps_error_json(&e, &b));
    json_t *o = json_loads(b.data, 0, &je);
    T_ASSERT(o);
    json_t *err = json_object_get(o, "error");
    T_ASSERT(strcmp(json_string_value(json_object_get(err, "message")), "too long: 5") == 0);
    T_ASSERT(strcmp(json_string_value(json_object_get(err, "type")), "invalid_request_error") == 0);
    T_ASSERT(strcmp(json_string_value(json_object_get(err, "param")), "prompt") == 0);
    T_ASSERT(strcmp(json_string_value(json_object_get(err, "code")), "context_length_exceeded") ==
             0);
    json_decref(o);
    ps_buf_reset(&b);
    ps_err(&e, 401, NULL, NULL, "no");
    T_OK(ps_error_json(&e, &b));
    o = json_loads(b.data, 0, &je);
    err = json_object_get(o, "error");
    T_ASSERT(json_is_null(json_object_get(err, "param")) &&
             json_is_null(json_object_get(err, "code")));
    T_ASSERT(strcmp(json_string_value(json_object_get(err, "type")), "authentication_error") == 0);
    json_decref(o);
    ps_buf_deinit(&b);
    return 0;
}

/* One row of the table: e's status, type, code (NULL: none), param ("" none), message. */
static int check_status(ps_stage at, int status, const char *detail, int http, const char *type,
                        const char *code, const char *param, const char *message)
{
    ps_error e;
    memset(&e, 0x55, sizeof e);
    T_EQ(ps_err_status(&e, at, status, detail), -1);
    T_EQ(e.status, http);
    T_ASSERT(strcmp(e.type, type) == 0);
    T_ASSERT(code ? e.code && strcmp(e.code, code) == 0 : e.code == NULL);
    T_ASSERT(strcmp(e.param, param) == 0);
    if (strcmp(e.message, message) != 0) T_FAIL("message '%s', want '%s'", e.message, message);
    return 0;
}

static int test_status_table(void)
{
    const char *ise = "server_error", *bad = "invalid_request_error";
    /* Reading the request. */
    T_EQ(check_status(PS_AT_REQUEST, PGD_ENOMEM, NULL, 500, ise, NULL, "", "out of memory"), 0);
    T_EQ(check_status(PS_AT_REQUEST, PGD_EIO, NULL, 500, ise, NULL, "",
                      "cannot read the request: i/o error"),
         0);
    /* The chat template: its own words for bad messages. */
    T_EQ(check_status(PS_AT_TEMPLATE, PGD_EINVAL, "unknown role 'x'", 400, bad, NULL, "messages",
                      "'messages': unknown role 'x'"),
         0);
    T_EQ(check_status(PS_AT_TEMPLATE, PGD_ENOMEM, "ignored", 500, ise, NULL, "", "out of memory"),
         0);
    /* Submitting. */
    T_EQ(check_status(PS_AT_SUBMIT, PGD_EBUSY, NULL, 429, "rate_limit_error", "queue_full", "",
                      "the request queue is full (--max-queued); retry later"),
         0);
    T_EQ(check_status(PS_AT_SUBMIT, PGD_EINVAL, NULL, 400, bad, NULL, "",
                      "the request was refused: invalid argument"),
         0);
    T_EQ(check_status(PS_AT_SUBMIT, PGD_ENOMEM, NULL, 500, ise, NULL, "",
                      "cannot queue the request: out of memory"),
         0);
    /* A request that failed while generating (the final callback's usage.status). */
    T_EQ(check_status(PS_AT_GENERATE, PGD_ENOSPC, NULL, 400, bad, "context_length_exceeded", "",
                      "the request does not fit the KV cache even alone (prompt and output "
                      "together): send a shorter prompt or a lower max_tokens"),
         0);
    T_EQ(check_status(PS_AT_GENERATE, PGD_ENOMEM, NULL, 500, ise, NULL, "",
                      "out of memory while generating"),
         0);
    T_EQ(check_status(PS_AT_GENERATE, PGD_OK, NULL, 500, ise, NULL, "",
                      "generation failed: the request does not fit the KV pool, or the forward "
                      "pass failed (see the server log)"),
         0);
    T_EQ(check_status(PS_AT_GENERATE, PGD_EIO, NULL, 500, ise, NULL, "",
                      "generation failed (see the server log): i/o error"),
         0);
    /* Shutting down: whatever the status. */
    T_EQ(check_status(PS_AT_SHUTDOWN, PGD_ESTATE, NULL, 503, "service_unavailable_error",
                      "shutting_down", "", "the server is shutting down"),
         0);
    T_EQ(check_status(PS_AT_SHUTDOWN, PGD_OK, NULL, 503, "service_unavailable_error",
                      "shutting_down", "", "the server is shutting down"),
         0);
    /* A stage outside the enum still gives a well-formed server error. */
    T_EQ(check_status((ps_stage)99, PGD_EIO, NULL, 500, ise, NULL, "", "internal error: i/o error"),
         0);
    /* The parser's out-of-memory path uses the same row: its rendering is OpenAI's shape. */
    ps_error e;
    ps_buf b;
    ps_buf_init(&b);
    ps_err_status(&e, PS_AT_GENERATE, PGD_ENOSPC, NULL);
    T_OK(ps_error_json(&e, &b));
    T_ASSERT(strstr(b.data, "\"type\":\"invalid_request_error\"") != NULL);
    T_ASSERT(strstr(b.data, "\"code\":\"context_length_exceeded\"") != NULL);
    T_ASSERT(strstr(b.data, "\"param\":null") != NULL);
    ps_buf_deinit(&b);
    return 0;
}

static int test_retention(void)
{
    ps_req r;
    ps_error e;
    pgd_retention rt;
    /* nothing: the default, and nothing to tell the cache */
    T_EQ(parse(PS_COMPLETION, "{\"prompt\":\"x\"}", &r, &e), 0);
    T_EQ(ps_req_retention(&r, &rt), 0);
    T_ASSERT(rt.priority == PGD_PRIORITY_DEFAULT && !rt.ttl_ms && !rt.pin && !rt.next_use_ms);
    ps_req_deinit(&r);
    /* in_memory: 1 h */
    T_EQ(
        parse(PS_COMPLETION, "{\"prompt\":\"x\",\"prompt_cache_retention\":\"in_memory\"}", &r, &e),
        0);
    T_EQ(ps_req_retention(&r, &rt), 1);
    T_EQ(rt.ttl_ms, 3600000);
    T_EQ(rt.priority, PGD_PRIORITY_DEFAULT);
    ps_req_deinit(&r);
    /* 24h: 24 h at priority 60; pagoda fields override */
    T_EQ(parse(PS_COMPLETION,
               "{\"prompt\":\"x\",\"prompt_cache_retention\":\"24h\",\"pagoda\":{\"priority\":90,"
               "\"pin\":true,\"next_use_s\":30,\"ttl_s\":null}}",
               &r, &e),
         0);
    T_EQ(ps_req_retention(&r, &rt), 1);
    T_EQ(rt.ttl_ms, 86400000ll);
    T_EQ(rt.priority, 90);
    T_ASSERT(rt.pin);
    T_EQ(rt.next_use_ms, 30000);
    ps_req_deinit(&r);
    T_EQ(parse(PS_COMPLETION,
               "{\"prompt\":\"x\",\"prompt_cache_retention\":\"24h\",\"pagoda\":{"
               "\"ttl_s\":0,\"pin\":false}}",
               &r, &e),
         0);
    T_EQ(ps_req_retention(&r, &rt), 1);
    T_ASSERT(rt.ttl_ms == 0 && rt.priority == 60 && !rt.pin);
    ps_req_deinit(&r);
    /* cache_control on a message and on a part: the longest ttl */
    T_EQ(parse(PS_CHAT,
               "{\"messages\":[{\"role\":\"system\",\"content\":\"s\",\"cache_control\":{\"type\":"
               "\"ephemeral\"}},{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"u\","
               "\"cache_control\":{\"type\":\"ephemeral\",\"ttl\":\"1h\"}}]}]}",
               &r, &e),
         0);
    T_EQ(r.ephemeral_ttl_s, 3600);
    T_EQ(ps_req_retention(&r, &rt), 1);
    T_EQ(rt.ttl_ms, 3600000);
    ps_req_deinit(&r);
    T_EQ(parse(PS_CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"u\",\"cache_control\":{\"type\":"
               "\"ephemeral\",\"ttl\":\"5m\"}}],\"prompt_cache_retention\":\"in_memory\"}",
               &r, &e),
         0);
    T_EQ(ps_req_retention(&r, &rt), 1);
    T_EQ(rt.ttl_ms, 3600000); /* in_memory's hour is longer */
    ps_req_deinit(&r);
    /* prompt_cache_key: a salt of its own namespace, longer than any cache_salt */
    T_EQ(parse(PS_COMPLETION, "{\"prompt\":\"x\",\"prompt_cache_key\":\"user-7\"}", &r, &e), 0);
    T_ASSERT(r.has_cache_key && r.salt);
    T_EQ(r.salt_len, PS_KEY_SALT_PAD + 6);
    T_ASSERT(r.salt_len > PS_MAX_SALT_BYTES && memcmp(r.salt + PS_KEY_SALT_PAD, "user-7", 6) == 0);
    T_EQ(ps_req_retention(&r, &rt), 0);
    ps_req_deinit(&r);
    T_EQ(parse(PS_COMPLETION, "{\"prompt\":\"x\",\"prompt_cache_key\":\"k\",\"cache_salt\":\"t\"}",
               &r, &e),
         0);
    T_ASSERT(r.salt_len == 1 && r.salt[0] == 't'); /* cache_salt wins */
    ps_req_deinit(&r);
    T_EQ(parse(PS_COMPLETION, "{\"prompt\":\"x\",\"prompt_cache_key\":\"\"}", &r, &e), 0);
    T_ASSERT(!r.salt && !r.has_cache_key);
    ps_req_deinit(&r);

    static const struct {
        ps_kind k;
        const char *body, *param;
    } bad[] = {
        {PS_COMPLETION, "{\"prompt\":\"x\",\"prompt_cache_retention\":\"1h\"}",
         "prompt_cache_retention"},
        {PS_COMPLETION, "{\"prompt\":\"x\",\"prompt_cache_retention\":24}",
         "prompt_cache_retention"},
        {PS_COMPLETION, "{\"prompt\":\"x\",\"prompt_cache_retention\":\"24h\\u0000\"}",
         "prompt_cache_retention"},
        {PS_COMPLETION, "{\"prompt\":\"x\",\"prompt_cache_key\":7}", "prompt_cache_key"},
        {PS_COMPLETION, "{\"prompt\":\"x\",\"pagoda\":[]}", "pagoda"},
        {PS_COMPLETION, "{\"prompt\":\"x\",\"pagoda\":{\"priority\":101}}", "pagoda.priority"},
        {PS_COMPLETION, "{\"prompt\":\"x\",\"pagoda\":{\"priority\":-1}}", "pagoda.priority"},
        {PS_COMPLETION, "{\"prompt\":\"x\",\"pagoda\":{\"priority\":5.5}}", "pagoda.priority"},
        {PS_COMPLETION, "{\"prompt\":\"x\",\"pagoda\":{\"ttl_s\":-1}}", "pagoda.ttl_s"},
        {PS_COMPLETION, "{\"prompt\":\"x\",\"pagoda\":{\"ttl_s\":\"1h\"}}", "pagoda.ttl_s"},
        {PS_COMPLETION, "{\"prompt\":\"x\",\"pagoda\":{\"ttl_s\":99999999999}}", "pagoda.ttl_s"},
        {PS_COMPLETION, "{\"prompt\":\"x\",\"pagoda\":{\"pin\":1}}", "pagoda.pin"},
        {PS_COMPLETION, "{\"prompt\":\"x\",\"pagoda\":{\"next_use_s\":-5}}", "pagoda.next_use_s"},
        {PS_COMPLETION, "{\"prompt\":\"x\",\"pagoda\":{\"ttl\":5}}", "pagoda.ttl"},
        {PS_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"u\",\"cache_control\":1}]}",
         "cache_control"},
        {PS_CHAT,
         "{\"messages\":[{\"role\":\"user\",\"content\":\"u\",\"cache_control\":{\"type\":"
         "\"persistent\"}}]}",
         "cache_control"},
        {PS_CHAT,
         "{\"messages\":[{\"role\":\"user\",\"content\":\"u\",\"cache_control\":{\"type\":"
         "\"ephemeral\",\"ttl\":\"2h\"}}]}",
         "cache_control"},
        {PS_CHAT,
         "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"u\","
         "\"cache_control\":{\"ttl\":\"5m\"}}]}]}",
         "cache_control"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = parse(bad[i].k, bad[i].body, &r, &e);
        if (rc != -1 || e.status != 400 || strcmp(e.param, bad[i].param) != 0)
            T_FAIL("case %zu (%s): rc %d status %d param '%s'", i, bad[i].body, rc, e.status,
                   e.param);
        /* the message names the field (its last part, e.g. "ttl" of cache_control.ttl) */
        const char *dot = strrchr(bad[i].param, '.');
        if (!strstr(e.message, dot ? dot + 1 : bad[i].param))
            T_FAIL("case %zu: message '%s' does not name %s", i, e.message, bad[i].param);
    }
    return 0;
}

static int admin(const char *s, int need, int ttl, ps_req *r, ps_error *e)
{
    return ps_admin_parse(s, strlen(s), 512, 64, need, ttl, r, e);
}

static int test_admin_bodies(void)
{
    ps_req r;
    ps_error e;
    T_EQ(admin("{\"prompt\":\"Once\",\"cache_salt\":\"a\",\"ttl_s\":60}", 1, 1, &r, &e), 0);
    T_ASSERT(r.kind == PS_COMPLETION && r.prompt && strcmp(r.prompt, "Once") == 0);
    T_ASSERT(r.salt_len == 1 && r.ttl_s_admin == 60);
    ps_req_deinit(&r);
    T_EQ(admin("{\"tokens\":[1,2,3]}", 1, 0, &r, &e), 0);
    T_EQ(r.n_prompt_toks, 3);
    T_EQ(r.prompt_toks[2], 3);
    ps_req_deinit(&r);
    T_EQ(admin("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", 1, 0, &r, &e), 0);
    T_ASSERT(r.kind == PS_CHAT && r.n_msgs == 1);
    ps_req_deinit(&r);
    T_EQ(admin("", 0, 0, &r, &e), 0); /* stats: no body */
    T_EQ(admin("{}", 0, 0, &r, &e), 0);
    ps_req_deinit(&r);
    static const struct {
        const char *body, *param;
        int need, ttl;
    } bad[] = {
        {"{}", "prompt", 1, 0},
        {"", "", 1, 0},
        {"[1]", "", 1, 0},
        {"{\"prompt\":\"a\",\"tokens\":[1]}", "prompt", 1, 0},
        {"{\"tokens\":\"a\"}", "tokens", 1, 0},
        {"{\"tokens\":[1,999]}", "tokens", 1, 0},
        {"{\"tokens\":[]}", "tokens", 1, 0},
        {"{\"prompt\":\"a\",\"cache_salt\":\"\"}", "cache_salt", 1, 0},
        {"{\"prompt\":\"a\",\"salt\":\"x\"}", "salt", 1, 0},
        {"{\"prompt\":\"a\",\"ttl_s\":5}", "ttl_s", 1, 0},
        {"{\"prompt\":\"a\",\"ttl_s\":-5}", "ttl_s", 1, 1},
        {"{\"prompt\":\"a\",\"ttl_s\":\"5\"}", "ttl_s", 1, 1},
        {"{\"messages\":[]}", "messages", 1, 0},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = admin(bad[i].body, bad[i].need, bad[i].ttl, &r, &e);
        if (rc != -1 || e.status != 400 || strcmp(e.param, bad[i].param) != 0)
            T_FAIL("case %zu (%s): rc %d status %d param '%s'", i, bad[i].body, rc, e.status,
                   e.param);
    }
    return 0;
}

/* A completion body with "pagoda": {pagoda} (pagoda: the object's members). */
static int parse_pagoda(const char *pagoda, ps_req *r, ps_error *e)
{
    char body[512];
    snprintf(body, sizeof body, "{\"prompt\":\"x\",\"pagoda\":{%s}}", pagoda);
    return parse(PS_COMPLETION, body, r, e);
}

/* ps_req_budget of the body's pagoda object against dflt (NULL: a server without one). */
static int budget_of(const char *pagoda, const pgd_budget_params *dflt, pgd_budget_params *out,
                     ps_error *e)
{
    ps_req r;
    if (parse_pagoda(pagoda, &r, e)) return -2;
    int rc = ps_req_budget(&r, dflt, 8, out, e);
    ps_req_deinit(&r);
    return rc;
}

static int expect_400(int rc, const ps_error *e, const char *param, const char *what)
{
    if (rc != -1 || e->status != 400 || strcmp(e->param, param) != 0)
        T_FAIL("%s: rc %d status %d param '%s' (want 400 %s)", what, rc, e->status, e->param,
               param);
    if (!strstr(e->message, strrchr(param, '.') + 1))
        T_FAIL("%s: message '%s' does not name %s", what, e->message, param);
    return 0;
}

static int test_budget_fields(void)
{
    ps_req r;
    ps_error e;
    pgd_budget_params p, none = pgd_budget_default_params(PGD_BUDGET_NONE, 0);
    pgd_budget_params dflt = pgd_budget_default_params(PGD_BUDGET_H2O, 96);
    /* parsed */
    T_EQ(parse_pagoda("\"kv_budget\":64,\"kv_budget_method\":\"tova\",\"priority\":5", &r, &e), 0);
    T_ASSERT(r.has_kv_budget && r.kv_budget == 64 && r.has_kv_budget_method);
    T_EQ(r.kv_budget_method, PGD_BUDGET_TOVA);
    T_EQ(r.priority, 5);
    ps_req_deinit(&r);
    T_EQ(parse_pagoda("\"kv_budget\":null,\"kv_budget_method\":null", &r, &e), 0);
    T_ASSERT(!r.has_kv_budget && !r.has_kv_budget_method);
    ps_req_deinit(&r);
    T_EQ(parse(PS_CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"}],\"pagoda\":{"
               "\"kv_budget\":4194304}}",
               &r, &e),
         0);
    T_EQ(r.kv_budget, PS_MAX_KV_BUDGET);
    ps_req_deinit(&r);

    /* nothing: the server's default (0) */
    T_EQ(budget_of("\"priority\":5", &dflt, &p, &e), 0);
    T_EQ(budget_of("", NULL, &p, &e), 0);
    /* kv_budget 0: dense, even on a server with a default */
    T_EQ(budget_of("\"kv_budget\":0", &dflt, &p, &e), 1);
    T_EQ(p.method, PGD_BUDGET_NONE);
    T_EQ(budget_of("\"kv_budget\":0", &none, &p, &e), 1);
    T_EQ(p.method, PGD_BUDGET_NONE);
    /* a budget alone: the server's method, else snapkv */
    T_EQ(budget_of("\"kv_budget\":64", &dflt, &p, &e), 1);
    T_ASSERT(p.method == PGD_BUDGET_H2O && p.budget == 64);
    T_EQ(budget_of("\"kv_budget\":64", NULL, &p, &e), 1);
    T_ASSERT(p.method == PGD_BUDGET_SNAPKV && p.budget == 64);
    T_EQ(budget_of("\"kv_budget\":64", &none, &p, &e), 1);
    T_EQ(p.method, PGD_BUDGET_SNAPKV);
    /* the method alone: the server's budget */
    T_EQ(budget_of("\"kv_budget_method\":\"pyramidkv\"", &dflt, &p, &e), 1);
    T_ASSERT(p.method == PGD_BUDGET_PYRAMIDKV && p.budget == 96);
    T_OK(expect_400(budget_of("\"kv_budget_method\":\"pyramidkv\"", &none, &p, &e), &e,
                    "pagoda.kv_budget_method", "a method on a server without a default"));
    T_ASSERT(strstr(e.message, "--kv-budget") != NULL);
    T_OK(expect_400(budget_of("\"kv_budget_method\":\"snapkv\"", NULL, &p, &e), &e,
                    "pagoda.kv_budget_method", "a method with no default given"));
    T_OK(expect_400(budget_of("\"kv_budget\":0,\"kv_budget_method\":\"h2o\"", &dflt, &p, &e), &e,
                    "pagoda.kv_budget_method", "a method with budget 0"));
    /* each method: the method's defaults, checked as pgd_budget_params_check does */
    for (int m = PGD_BUDGET_STREAMING; m < PGD_BUDGET_COUNT; m++) {
        static const uint32_t budgets[] = {1, 2, 5, 33, 64, 4096};
        for (size_t i = 0; i < sizeof budgets / sizeof budgets[0]; i++) {
            char obj[128], why[200];
            snprintf(obj, sizeof obj, "\"kv_budget\":%u,\"kv_budget_method\":\"%s\"", budgets[i],
                     pgd_budget_method_name((pgd_budget_method)m));
            pgd_budget_params want = pgd_budget_default_params((pgd_budget_method)m, budgets[i]);
            int ok = pgd_budget_params_check(&want, 8, why, sizeof why) == PGD_OK;
            int rc = budget_of(obj, &none, &p, &e);
            if (ok) {
                if (rc != 1 || memcmp(&p, &want, sizeof p) != 0)
                    T_FAIL("%s: rc %d, not the method's defaults", obj, rc);
            } else {
                T_OK(expect_400(rc, &e, "pagoda.kv_budget", obj));
                if (!strstr(e.message, why)) T_FAIL("%s: '%s' lacks '%s'", obj, e.message, why);
            }
        }
    }
    /* every method's defaults fit its smallest budget (sinks + window <= 1) */
    for (int m = PGD_BUDGET_STREAMING; m < PGD_BUDGET_COUNT; m++) {
        char obj[96];
        snprintf(obj, sizeof obj, "\"kv_budget\":1,\"kv_budget_method\":\"%s\"",
                 pgd_budget_method_name((pgd_budget_method)m));
        T_EQ(budget_of(obj, NULL, &p, &e), 1);
        T_ASSERT(p.budget == 1 && p.sinks + p.window <= 1);
    }

    static const char *const bad[][2] = {
        {"\"kv_budget\":-1", "pagoda.kv_budget"},
        {"\"kv_budget\":1.5", "pagoda.kv_budget"},
        {"\"kv_budget\":\"64\"", "pagoda.kv_budget"},
        {"\"kv_budget\":true", "pagoda.kv_budget"},
        {"\"kv_budget\":4194305", "pagoda.kv_budget"},
        {"\"kv_budget\":99999999999999", "pagoda.kv_budget"},
        {"\"kv_budget\":[64]", "pagoda.kv_budget"},
        {"\"kv_budget_method\":\"x\"", "pagoda.kv_budget_method"},
        {"\"kv_budget_method\":0", "pagoda.kv_budget_method"},
        {"\"kv_budget_method\":\"none\"", "pagoda.kv_budget_method"},
        {"\"kv_budget_method\":\"SnapKV\"", "pagoda.kv_budget_method"},
        {"\"kv_budget_method\":\"snapkv\\u0000\"", "pagoda.kv_budget_method"},
        {"\"kv_budget_method\":\"\"", "pagoda.kv_budget_method"},
        {"\"kv_budget_method\":[\"h2o\"]", "pagoda.kv_budget_method"},
        {"\"kv_budget_methods\":\"h2o\"", "pagoda.kv_budget_methods"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char what[96];
        snprintf(what, sizeof what, "case %zu (%s)", i, bad[i][0]);
        T_OK(expect_400(parse_pagoda(bad[i][0], &r, &e), &e, bad[i][1], what));
    }
    /* chat takes the same fields */
    T_EQ(parse(PS_CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"}],\"pagoda\":{"
               "\"kv_budget_method\":\"stream\"}}",
               &r, &e),
         -1);
    T_ASSERT(strcmp(e.param, "pagoda.kv_budget_method") == 0);
    return 0;
}

int main(void)
{
    T_RUN(test_full_completion);
    T_RUN(test_chat);
    T_RUN(test_errors);
    T_RUN(test_mutations);
    T_RUN(test_limits);
    T_RUN(test_error_json);
    T_RUN(test_status_table);
    T_RUN(test_retention);
    T_RUN(test_admin_bodies);
    T_RUN(test_budget_fields);
    T_DONE();
}
