/* SPDX-License-Identifier: MIT */
/*
 * api.c - OpenAI request parsing and validation, error JSON (see api.h). Uses jansson;
 * every field is type-checked before use, so any bytes give either a request or a 400.
 */
#include "api.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "unicode.h"

/* ---- errors ---- */

static const char *type_of(int status)
{
    switch (status) {
    case 401:
        return "authentication_error";
    case 404:
        return "not_found_error";
    case 429:
        return "rate_limit_error";
    case 500:
        return "server_error";
    case 503:
        return "service_unavailable_error";
    default:
        return "invalid_request_error";
    }
}

/* Replaces every byte of the NUL-terminated s that is not part of valid UTF-8 with '?', so
 * that the message renders as JSON: messages may quote outside bytes (jansson's parse
 * errors do) and truncation may cut a character. */
static void utf8_sanitize(char *s)
{
    unsigned char *p = (unsigned char *)s;
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        size_t k = pe_utf8_valid_len(p + i, n - i);
        if (k) {
            i += k;
        } else {
            p[i++] = '?';
        }
    }
}

int ps_err(ps_error *e, int status, const char *param, const char *code, const char *fmt, ...)
{
    va_list ap;
    e->status = status;
    e->type = type_of(status);
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    utf8_sanitize(e->param);
    utf8_sanitize(e->message);
    return -1;
}

int ps_error_json(const ps_error *e, ps_buf *out)
{
    json_t *o = json_pack("{s:{s:s,s:s,s:o,s:o}}", "error", "message", e->message, "type", e->type,
                          "param", e->param[0] ? json_string(e->param) : json_null(), "code",
                          e->code ? json_string(e->code) : json_null());
    if (!o) return -1;
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s) return -1;
    int rc = ps_buf_adds(out, s);
    free(s);
    return rc;
}

/* ---- parsing helpers ---- */

static char *dup_str(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

static int oom(ps_error *e)
{
    return ps_err_status(e, PS_AT_REQUEST, PGD_ENOMEM, NULL);
}

/* Looks up an optional field: NULL when absent or null. */
static json_t *opt(json_t *root, const char *key)
{
    json_t *v = json_object_get(root, key);
    return v && !json_is_null(v) ? v : NULL;
}

static int get_number(json_t *root, const char *key, double lo, double hi, int lo_open, double *out,
                      ps_error *e)
{
    json_t *v = opt(root, key);
    if (!v) return 0;
    if (!json_is_number(v)) return ps_err(e, 400, key, NULL, "'%s' must be a number", key);
    double d = json_number_value(v);
    if (!isfinite(d) || d < lo || d > hi || (lo_open && d == lo))
        return ps_err(e, 400, key, NULL, "'%s' must be in %c%g, %g]", key, lo_open ? '(' : '[', lo,
                      hi);
    *out = d;
    return 0;
}

static int get_bool(json_t *root, const char *key, int *out, ps_error *e)
{
    json_t *v = opt(root, key);
    if (!v) return 0;
    if (!json_is_boolean(v)) return ps_err(e, 400, key, NULL, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 0;
}

/* Token ids: a non-empty array of integers in [0, n_vocab); key names the field. */
static int parse_token_array_of(json_t *a, const char *key, uint32_t n_vocab, uint32_t n_ctx,
                                ps_req *r, ps_error *e)
{
    size_t n = json_array_size(a);
    if (!n) return ps_err(e, 400, key, NULL, "'%s' is an empty array", key);
    if (n_ctx && n >= n_ctx)
        return ps_err(e, 413, key, "context_length_exceeded",
                      "the prompt has %zu tokens; the context holds %u (prompt and output "
                      "together)",
                      n, n_ctx);
    r->prompt_toks = malloc(n * sizeof *r->prompt_toks);
    if (!r->prompt_toks) return oom(e);
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(a, i);
        if (!json_is_integer(t))
            return ps_err(e, 400, key, NULL, "'%s'[%zu] must be a token id (integer)", key, i);
        json_int_t id = json_integer_value(t);
        if (id < 0 || id >= (json_int_t)n_vocab)
            return ps_err(e, 400, key, NULL,
                          "'%s'[%zu]: token id %lld is outside the vocabulary [0, %u)", key, i,
                          (long long)id, n_vocab);
        r->prompt_toks[i] = (int32_t)id;
    }
    r->n_prompt_toks = n;
    return 0;
}

static int parse_token_array(json_t *a, uint32_t n_vocab, uint32_t n_ctx, ps_req *r, ps_error *e)
{
    return parse_token_array_of(a, "prompt", n_vocab, n_ctx, r, e);
}

/* Returns 1 when v is the JSON string lit exactly (a NUL inside never matches). */
static int str_is(json_t *v, const char *lit)
{
    return json_is_string(v) && json_string_length(v) == strlen(lit) &&
           memcmp(json_string_value(v), lit, json_string_length(v)) == 0;
}

/* cache_control (Anthropic-style) of a message or content part, where names it in the
 * message: {"type":"ephemeral","ttl":"5m"|"1h"} (ttl default "5m"). Raises
 * r->ephemeral_ttl_s to its ttl, so the longest one present applies. */
static int parse_cache_control(json_t *cc, const char *where, ps_req *r, ps_error *e)
{
    if (!json_is_object(cc))
        return ps_err(e, 400, "cache_control", NULL,
                      "%s.cache_control must be an object {\"type\":\"ephemeral\",\"ttl\":"
                      "\"5m\"|\"1h\"}",
                      where);
    if (!str_is(json_object_get(cc, "type"), "ephemeral"))
        return ps_err(e, 400, "cache_control", NULL, "%s.cache_control.type must be \"ephemeral\"",
                      where);
    json_t *ttl = opt(cc, "ttl");
    uint32_t s = 300;
    if (ttl && str_is(ttl, "1h"))
        s = 3600;
    else if (ttl && !str_is(ttl, "5m"))
        return ps_err(e, 400, "cache_control", NULL,
                      "%s.cache_control.ttl must be \"5m\" or \"1h\"", where);
    if (s > r->ephemeral_ttl_s) r->ephemeral_ttl_s = s;
    return 0;
}

/* Returns 1 when the JSON string s holds a NUL character. */
static int has_nul(json_t *s)
{
    return strlen(json_string_value(s)) != json_string_length(s);
}

/* A text prompt: a string without NUL (see api.h). */
static int take_prompt_text(json_t *s, ps_req *r, ps_error *e)
{
    if (has_nul(s)) return ps_err(e, 400, "prompt", NULL, "'prompt' contains a NUL character");
    r->prompt_len = json_string_length(s);
    r->prompt = dup_str(json_string_value(s), r->prompt_len);
    return r->prompt ? 0 : oom(e);
}

static int parse_prompt(json_t *root, uint32_t n_vocab, uint32_t n_ctx, ps_req *r, ps_error *e)
{
    json_t *p = opt(root, "prompt");
    if (!p) return ps_err(e, 400, "prompt", NULL, "'prompt' is required");
    if (json_is_string(p)) return take_prompt_text(p, r, e);
    if (!json_is_array(p))
        return ps_err(e, 400, "prompt", NULL, "'prompt' must be a string or an array of token ids");
    json_t *first = json_array_get(p, 0);
    if (first && (json_is_string(first) || json_is_array(first))) {
        if (json_array_size(p) != 1)
            return ps_err(e, 400, "prompt", NULL,
                          "'prompt' holds %zu prompts; one per request is supported",
                          json_array_size(p));
        if (json_is_string(first)) return take_prompt_text(first, r, e);
        return parse_token_array(first, n_vocab, n_ctx, r, e);
    }
    return parse_token_array(p, n_vocab, n_ctx, r, e);
}

/* content: a string, or an array of {"type":"text","text":...} parts (joined). */
static int parse_content(json_t *c, size_t i, ps_msg *m, ps_req *r, ps_error *e)
{
    if (json_is_string(c)) {
        if (has_nul(c))
            return ps_err(e, 400, "messages", NULL,
                          "'messages'[%zu].content contains a NUL character", i);
        m->content = dup_str(json_string_value(c), json_string_length(c));
        return m->content ? 0 : oom(e);
    }
    if (!json_is_array(c))
        return ps_err(e, 400, "messages", NULL,
                      "'messages'[%zu].content must be a string or an array of text parts", i);
    ps_buf b;
    ps_buf_init(&b);
    ps_buf_add(&b, "", 0);
    for (size_t k = 0; k < json_array_size(c); k++) {
        json_t *part = json_array_get(c, k);
        json_t *type = json_object_get(part, "type");
        json_t *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type) ||
            strcmp(json_string_value(type), "text") != 0 || !json_is_string(text)) {
            ps_buf_deinit(&b);
            return ps_err(e, 400, "messages", NULL,
                          "'messages'[%zu].content[%zu] must be {\"type\":\"text\",\"text\":...}"
                          " (only text parts are supported)",
                          i, k);
        }
        if (has_nul(text)) {
            ps_buf_deinit(&b);
            return ps_err(e, 400, "messages", NULL,
                          "'messages'[%zu].content[%zu].text contains a NUL character", i, k);
        }
        json_t *cc = opt(part, "cache_control");
        if (cc) {
            char where[64];
            snprintf(where, sizeof where, "'messages'[%zu].content[%zu]", i, k);
            if (parse_cache_control(cc, where, r, e)) {
                ps_buf_deinit(&b);
                return -1;
            }
        }
        ps_buf_add(&b, json_string_value(text), json_string_length(text));
    }
    if (b.oom) {
        ps_buf_deinit(&b);
        return oom(e);
    }
    m->content = b.data; /* ownership moves to the message */
    return 0;
}

static int parse_messages(json_t *root, ps_req *r, ps_error *e)
{
    json_t *a = opt(root, "messages");
    if (!a) return ps_err(e, 400, "messages", NULL, "'messages' is required");
    if (!json_is_array(a) || !json_array_size(a))
        return ps_err(e, 400, "messages", NULL, "'messages' must be a non-empty array");
    size_t n = json_array_size(a);
    r->msgs = calloc(n, sizeof *r->msgs);
    if (!r->msgs) return oom(e);
    r->n_msgs = n;
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(a, i);
        if (!json_is_object(m))
            return ps_err(e, 400, "messages", NULL, "'messages'[%zu] must be an object", i);
        json_t *role = json_object_get(m, "role");
        json_t *content = json_object_get(m, "content");
        if (!json_is_string(role))
            return ps_err(e, 400, "messages", NULL, "'messages'[%zu].role must be a string", i);
        if (has_nul(role))
            return ps_err(e, 400, "messages", NULL, "'messages'[%zu].role contains a NUL character",
                          i);
        if (!content || json_is_null(content))
            return ps_err(e, 400, "messages", NULL, "'messages'[%zu].content is required", i);
        r->msgs[i].role = dup_str(json_string_value(role), json_string_length(role));
        if (!r->msgs[i].role) return oom(e);
        if (parse_content(content, i, &r->msgs[i], r, e)) return -1;
        json_t *cc = opt(m, "cache_control");
        if (cc) {
            char where[48];
            snprintf(where, sizeof where, "'messages'[%zu]", i);
            if (parse_cache_control(cc, where, r, e)) return -1;
        }
    }
    return 0;
}

static int parse_stop(json_t *root, ps_req *r, ps_error *e)
{
    json_t *s = opt(root, "stop");
    if (!s) return 0;
    if (json_is_string(s)) {
        if (!json_string_length(s)) return ps_err(e, 400, "stop", NULL, "'stop' is empty");
        if (strlen(json_string_value(s)) != json_string_length(s))
            return ps_err(e, 400, "stop", NULL, "'stop' contains a NUL character");
        r->stop[0] = dup_str(json_string_value(s), json_string_length(s));
        if (!r->stop[0]) return oom(e);
        r->n_stop = 1;
        return 0;
    }
    if (!json_is_array(s))
        return ps_err(e, 400, "stop", NULL, "'stop' must be a string or an array of strings");
    if (json_array_size(s) > PS_MAX_USER_STOPS)
        return ps_err(e, 400, "stop", NULL, "'stop' holds %zu strings; at most %d are allowed",
                      json_array_size(s), PS_MAX_USER_STOPS);
    for (size_t i = 0; i < json_array_size(s); i++) {
        json_t *v = json_array_get(s, i);
        if (!json_is_string(v) || !json_string_length(v))
            return ps_err(e, 400, "stop", NULL, "'stop'[%zu] must be a non-empty string", i);
        if (strlen(json_string_value(v)) != json_string_length(v))
            return ps_err(e, 400, "stop", NULL, "'stop'[%zu] contains a NUL character", i);
        r->stop[i] = dup_str(json_string_value(v), json_string_length(v));
        if (!r->stop[i]) return oom(e);
        r->n_stop = i + 1;
    }
    return 0;
}

static int parse_max_tokens(json_t *root, const char *key, ps_req *r, ps_error *e)
{
    json_t *v = opt(root, key);
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 1)
        return ps_err(e, 400, key, NULL, "'%s' must be an integer >= 1", key);
    json_int_t n = json_integer_value(v);
    r->max_tokens = n > INT32_MAX ? INT32_MAX : (int64_t)n;
    return 0;
}

static int parse_salt(json_t *root, ps_req *r, ps_error *e)
{
    json_t *v = opt(root, "cache_salt");
    if (!v) return 0;
    if (!json_is_string(v))
        return ps_err(e, 400, "cache_salt", NULL, "'cache_salt' must be a string");
    if (!json_string_length(v))
        return ps_err(e, 400, "cache_salt", NULL,
                      "'cache_salt' is empty; leave it out for the default tenant");
    if (json_string_length(v) > PS_MAX_SALT_BYTES)
        return ps_err(e, 400, "cache_salt", NULL, "'cache_salt' is longer than %d bytes",
                      PS_MAX_SALT_BYTES);
    r->salt_len = json_string_length(v);
    r->salt = dup_str(json_string_value(v), r->salt_len);
    return r->salt ? 0 : oom(e);
}

/* The salt of a prompt_cache_key tenant (api.h): PS_KEY_SALT_PAD bytes (a tag, then
 * zeros), then the key. Longer than any cache_salt, so it equals none. */
static int key_salt(json_t *key, ps_req *r, ps_error *e)
{
    static const char tag[] = "pagoda:prompt_cache_key";
    size_t n = json_string_length(key);
    r->salt = calloc(1, PS_KEY_SALT_PAD + n + 1);
    if (!r->salt) return oom(e);
    memcpy(r->salt, tag, sizeof tag - 1);
    memcpy(r->salt + PS_KEY_SALT_PAD, json_string_value(key), n);
    r->salt_len = PS_KEY_SALT_PAD + n;
    return 0;
}

/* A whole number of seconds in [0, PS_MAX_TTL_S] of the pagoda object. */
static int get_seconds(json_t *v, const char *name, uint64_t *out, ps_error *e)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        (uint64_t)json_integer_value(v) > PS_MAX_TTL_S)
        return ps_err(e, 400, name, NULL, "'%s' must be an integer of seconds in [0, %llu]", name,
                      (unsigned long long)PS_MAX_TTL_S);
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

/* "pagoda": {"priority", "ttl_s", "pin", "next_use_s", "kv_budget", "kv_budget_method"};
 * any other key is refused (a typo must not silently drop a pin or a budget). The budget
 * fields are checked here one by one; together, and against the server's default, by
 * ps_req_budget. */
static int parse_pagoda(json_t *root, ps_req *r, ps_error *e)
{
    json_t *p = opt(root, "pagoda");
    if (!p) return 0;
    if (!json_is_object(p)) return ps_err(e, 400, "pagoda", NULL, "'pagoda' must be an object");
    const char *key;
    json_t *v;
    json_object_foreach(p, key, v)
    {
        if (json_is_null(v)) continue;
        if (strcmp(key, "priority") == 0) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 100)
                return ps_err(e, 400, "pagoda.priority", NULL,
                              "'pagoda.priority' must be an integer in [0, 100]");
            r->has_priority = 1;
            r->priority = (uint32_t)json_integer_value(v);
        } else if (strcmp(key, "ttl_s") == 0) {
            if (get_seconds(v, "pagoda.ttl_s", &r->ttl_s, e)) return -1;
            r->has_ttl = 1;
        } else if (strcmp(key, "pin") == 0) {
            if (!json_is_boolean(v))
                return ps_err(e, 400, "pagoda.pin", NULL, "'pagoda.pin' must be a boolean");
            r->has_pin = 1;
            r->pin = json_is_true(v);
        } else if (strcmp(key, "next_use_s") == 0) {
            if (get_seconds(v, "pagoda.next_use_s", &r->next_use_s, e)) return -1;
            r->has_next_use = 1;
        } else if (strcmp(key, "kv_budget") == 0) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                json_integer_value(v) > (json_int_t)PS_MAX_KV_BUDGET)
                return ps_err(e, 400, "pagoda.kv_budget", NULL,
                              "'pagoda.kv_budget' must be an integer of tokens in [0, %u] (0: "
                              "dense)",
                              PS_MAX_KV_BUDGET);
            r->has_kv_budget = 1;
            r->kv_budget = (uint32_t)json_integer_value(v);
        } else if (strcmp(key, "kv_budget_method") == 0) {
            pgd_budget_method m = PGD_BUDGET_NONE;
            if (!json_is_string(v) || has_nul(v) ||
                pgd_budget_method_parse(json_string_value(v), &m) != PGD_OK || m == PGD_BUDGET_NONE)
                return ps_err(e, 400, "pagoda.kv_budget_method", NULL,
                              "'pagoda.kv_budget_method' must be one of streaming, h2o, tova, "
                              "snapkv, pyramidkv, adakv");
            r->has_kv_budget_method = 1;
            r->kv_budget_method = m;
        } else {
            char param[64];
            snprintf(param, sizeof param, "pagoda.%s", key);
            return ps_err(e, 400, param, NULL,
                          "'pagoda.%.40s' is not a field: 'pagoda' takes priority, ttl_s, pin, "
                          "next_use_s, kv_budget and kv_budget_method",
                          key);
        }
    }
    return 0;
}

/* prompt_cache_retention, prompt_cache_key and "pagoda" (cache_control comes with the
 * messages). After parse_salt. */
static int parse_retention(json_t *root, ps_req *r, ps_error *e)
{
    json_t *v = opt(root, "prompt_cache_retention");
    if (v) {
        if (str_is(v, "in_memory"))
            r->cache_retention = PS_RETAIN_IN_MEMORY;
        else if (str_is(v, "24h"))
            r->cache_retention = PS_RETAIN_24H;
        else
            return ps_err(e, 400, "prompt_cache_retention", NULL,
                          "'prompt_cache_retention' must be \"in_memory\" or \"24h\"");
    }
    v = opt(root, "prompt_cache_key");
    if (v) {
        if (!json_is_string(v))
            return ps_err(e, 400, "prompt_cache_key", NULL, "'prompt_cache_key' must be a string");
        if (json_string_length(v) > PS_MAX_CACHE_KEY_BYTES)
            return ps_err(e, 400, "prompt_cache_key", NULL,
                          "'prompt_cache_key' is longer than %d bytes", PS_MAX_CACHE_KEY_BYTES);
        r->has_cache_key = json_string_length(v) > 0;
        if (r->has_cache_key && !r->salt && key_salt(v, r, e)) return -1;
    }
    return parse_pagoda(root, r, e);
}

int ps_req_retention(const ps_req *r, pgd_retention *out)
{
    uint64_t ttl_s = 0;
    uint32_t prio = PGD_PRIORITY_DEFAULT;
    int any = r->cache_retention || r->ephemeral_ttl_s || r->has_priority || r->has_ttl ||
              r->has_pin || r->has_next_use;
    if (r->cache_retention == PS_RETAIN_IN_MEMORY) ttl_s = 3600;
    if (r->cache_retention == PS_RETAIN_24H) {
        ttl_s = 24 * 3600;
        prio = 60;
    }
    if (r->ephemeral_ttl_s > ttl_s) ttl_s = r->ephemeral_ttl_s;
    if (r->has_priority) prio = r->priority;
    if (r->has_ttl) ttl_s = r->ttl_s;
    memset(out, 0, sizeof *out);
    out->priority = prio;
    out->ttl_ms = ttl_s * 1000;
    out->pin = r->has_pin && r->pin;
    out->next_use_ms = r->has_next_use ? r->next_use_s * 1000 : 0;
    return any;
}

int ps_req_budget(const ps_req *r, const pgd_budget_params *dflt, uint32_t n_layers,
                  pgd_budget_params *out, ps_error *e)
{
    int has_dflt = dflt && dflt->method != PGD_BUDGET_NONE && dflt->budget > 0;
    if (!r->has_kv_budget && !r->has_kv_budget_method) return 0;
    if (r->has_kv_budget && r->kv_budget == 0) {
        if (r->has_kv_budget_method)
            return ps_err(e, 400, "pagoda.kv_budget_method", NULL,
                          "'pagoda.kv_budget_method' cannot go with 'pagoda.kv_budget' 0 (dense: "
                          "no budget); give a budget of at least 1 token, or leave the method out");
        *out = pgd_budget_default_params(PGD_BUDGET_NONE, 0);
        return 1;
    }
    if (!r->has_kv_budget && !has_dflt)
        return ps_err(e, 400, "pagoda.kv_budget_method", NULL,
                      "'pagoda.kv_budget_method' needs 'pagoda.kv_budget': this server has no "
                      "default budget (--kv-budget)");
    uint32_t budget = r->has_kv_budget ? r->kv_budget : dflt->budget;
    pgd_budget_method m = r->has_kv_budget_method ? r->kv_budget_method
                          : has_dflt              ? dflt->method
                                                  : PGD_BUDGET_SNAPKV;
    pgd_budget_params p = pgd_budget_default_params(m, budget);
    char why[200];
    if (pgd_budget_params_check(&p, n_layers, why, sizeof why) != PGD_OK) {
        if (r->has_kv_budget)
            return ps_err(e, 400, "pagoda.kv_budget", NULL, "'pagoda.kv_budget' %u (%s): %s",
                          budget, pgd_budget_method_name(m), why);
        return ps_err(e, 400, "pagoda.kv_budget_method", NULL,
                      "'pagoda.kv_budget_method' %s with the server's --kv-budget %u: %s",
                      pgd_budget_method_name(m), budget, why);
    }
    *out = p;
    return 1;
}

static int parse_fields(json_t *root, ps_kind kind, uint32_t n_vocab, uint32_t n_ctx, ps_req *r,
                        ps_error *e)
{
    json_t *v;
    v = opt(root, "model");
    if (v) {
        if (!json_is_string(v)) return ps_err(e, 400, "model", NULL, "'model' must be a string");
        if (has_nul(v)) return ps_err(e, 400, "model", NULL, "'model' contains a NUL character");
        r->model = dup_str(json_string_value(v), json_string_length(v));
        if (!r->model) return oom(e);
    }
    if (kind == PS_COMPLETION ? parse_prompt(root, n_vocab, n_ctx, r, e)
                              : parse_messages(root, r, e))
        return -1;
    if (parse_max_tokens(root, "max_tokens", r, e)) return -1;
    if (kind == PS_CHAT && parse_max_tokens(root, "max_completion_tokens", r, e)) return -1;
    if (get_number(root, "temperature", 0, 2, 0, &r->temperature, e)) return -1;
    if (get_number(root, "top_p", 0, 1, 1, &r->top_p, e)) return -1;
    if (get_number(root, "min_p", 0, 1, 0, &r->min_p, e)) return -1;
    v = opt(root, "top_k");
    if (v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            return ps_err(e, 400, "top_k", NULL, "'top_k' must be an integer >= 0");
        r->top_k = json_integer_value(v);
    }
    v = opt(root, "seed");
    if (v) {
        if (!json_is_integer(v)) return ps_err(e, 400, "seed", NULL, "'seed' must be an integer");
        r->has_seed = 1;
        r->seed = (uint64_t)json_integer_value(v);
    }
    if (parse_stop(root, r, e)) return -1;
    if (get_bool(root, "stream", &r->stream, e)) return -1;
    if (get_bool(root, "ignore_eos", &r->ignore_eos, e)) return -1;
    v = opt(root, "stream_options");
    if (v) {
        if (!json_is_object(v))
            return ps_err(e, 400, "stream_options", NULL, "'stream_options' must be an object");
        json_t *iu = opt(v, "include_usage");
        if (iu && !json_is_boolean(iu))
            return ps_err(e, 400, "stream_options", NULL,
                          "'stream_options.include_usage' must be a boolean");
        r->include_usage = iu && json_is_true(iu);
    }
    v = opt(root, "n");
    if (v && (!json_is_integer(v) || json_integer_value(v) != 1))
        return ps_err(e, 400, "n", NULL, "'n' must be 1 (one choice per request)");
    v = opt(root, "best_of");
    if (v && (!json_is_integer(v) || json_integer_value(v) != 1))
        return ps_err(e, 400, "best_of", NULL, "'best_of' must be 1");
    v = opt(root, "echo");
    if (v && !json_is_false(v)) return ps_err(e, 400, "echo", NULL, "'echo' is not supported");
    v = opt(root, "logprobs");
    if (v && !json_is_false(v) && !(json_is_integer(v) && json_integer_value(v) == 0))
        return ps_err(e, 400, "logprobs", NULL, "'logprobs' is not supported");
    if (parse_salt(root, r, e)) return -1;
    return parse_retention(root, r, e);
}

/* Returns an upper bound on the JSON values body[0..len) holds, without parsing: every
 * value but the first follows a ':' (an object member), a ',' or a '[' outside strings
 * (keys are counted by their ':'). A string is skipped with memchr: a '"' ends it unless
 * an odd run of backslashes precedes it. Malformed JSON gives some count; jansson refuses
 * it afterwards. O(len), one pass (16 MB: about 10 ms). */
static size_t count_values(const char *b, size_t len)
{
    size_t n = 1, i = 0;
    while (i < len) {
        char c = b[i++];
        if (c == ',' || c == ':' || c == '[') {
            n++;
        } else if (c == '"') {
            for (;;) {
                const char *q = i < len ? memchr(b + i, '"', len - i) : NULL;
                size_t k, bs = 0;
                if (!q) return n;
                k = (size_t)(q - b);
                while (bs < k - i && b[k - 1 - bs] == '\\')
                    bs++;
                i = k + 1;
                if (bs % 2 == 0) break;
            }
        }
    }
    return n;
}

int ps_req_parse(ps_kind kind, const char *body, size_t len, uint32_t n_vocab, uint32_t n_ctx,
                 ps_req *r, ps_error *e)
{
    json_error_t je;
    memset(r, 0, sizeof *r);
    r->kind = kind;
    if (n_ctx) {
        size_t max = PS_MAX_VALUES(n_ctx), n = count_values(body, len);
        if (n > max)
            return ps_err(e, 413, NULL, "request_too_large",
                          "the body holds about %zu JSON values; at most %zu are accepted (%d per "
                          "context token and %d), as a request that fits the context (%u tokens) "
                          "needs fewer",
                          n, max, PS_VALUES_PER_CTX_TOKEN, PS_VALUES_BASE, n_ctx);
    }
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    if (!root)
        return ps_err(e, 400, NULL, NULL, "the body is not valid JSON (line %d, column %d): %s",
                      je.line, je.column, je.text);
    r->temperature = 1.0;
    r->top_p = 1.0;
    int rc = 0;
    if (!json_is_object(root))
        rc = ps_err(e, 400, NULL, NULL, "the body must be a JSON object");
    else
        rc = parse_fields(root, kind, n_vocab, n_ctx, r, e);
    json_decref(root);
    if (rc) {
        ps_req_deinit(r);
        r->kind = kind;
    }
    return rc;
}

/* The admin body's fields (ps_admin_parse): one prompt form, salt, ttl. */
static int admin_fields(json_t *root, uint32_t n_vocab, uint32_t n_ctx, int need_prompt,
                        int want_ttl, ps_req *r, ps_error *e)
{
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        if (strcmp(key, "prompt") && strcmp(key, "tokens") && strcmp(key, "messages") &&
            strcmp(key, "cache_salt") && strcmp(key, "model") &&
            !(want_ttl && strcmp(key, "ttl_s") == 0))
            return ps_err(e, 400, key, NULL,
                          "'%.40s' is not a field here: give one of prompt, tokens or messages, "
                          "and cache_salt%s",
                          key, want_ttl ? " and ttl_s" : "");
    }
    int n_forms = !!opt(root, "prompt") + !!opt(root, "tokens") + !!opt(root, "messages");
    if (n_forms > 1)
        return ps_err(e, 400, "prompt", NULL,
                      "give one of 'prompt', 'tokens' or 'messages', not several");
    if (!n_forms && need_prompt)
        return ps_err(e, 400, "prompt", NULL,
                      "one of 'prompt', 'tokens' or 'messages' is required");
    v = opt(root, "tokens");
    if (v) {
        if (!json_is_array(v))
            return ps_err(e, 400, "tokens", NULL, "'tokens' must be an array of token ids");
        if (parse_token_array_of(v, "tokens", n_vocab, n_ctx, r, e)) return -1;
    } else if (opt(root, "messages")) {
        r->kind = PS_CHAT;
        if (parse_messages(root, r, e)) return -1;
    } else if (opt(root, "prompt")) {
        if (parse_prompt(root, n_vocab, n_ctx, r, e)) return -1;
    }
    if (parse_salt(root, r, e)) return -1;
    v = want_ttl ? opt(root, "ttl_s") : NULL;
    if (v) {
        double d = json_is_number(v) ? json_number_value(v) : -1;
        if (!(d >= 0 && d <= (double)PS_MAX_TTL_S))
            return ps_err(e, 400, "ttl_s", NULL, "'ttl_s' must be a number of seconds in [0, %llu]",
                          (unsigned long long)PS_MAX_TTL_S);
        r->ttl_s_admin = d;
    }
    return 0;
}

int ps_admin_parse(const char *body, size_t len, uint32_t n_vocab, uint32_t n_ctx, int need_prompt,
                   int want_ttl, ps_req *r, ps_error *e)
{
    json_error_t je;
    memset(r, 0, sizeof *r);
    r->kind = PS_COMPLETION;
    if (!len && !need_prompt) return 0;
    if (n_ctx && count_values(body, len) > PS_MAX_VALUES(n_ctx))
        return ps_err(e, 413, NULL, "request_too_large", "the body holds too many JSON values");
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    if (!root)
        return ps_err(e, 400, NULL, NULL, "the body is not valid JSON (line %d, column %d): %s",
                      je.line, je.column, je.text);
    int rc = json_is_object(root) ? admin_fields(root, n_vocab, n_ctx, need_prompt, want_ttl, r, e)
                                  : ps_err(e, 400, NULL, NULL, "the body must be a JSON object");
    json_decref(root);
    if (rc) ps_req_deinit(r);
    return rc;
}

void ps_req_deinit(ps_req *r)
{
    free(r->model);
    free(r->prompt);
    free(r->prompt_toks);
    for (size_t i = 0; i < r->n_msgs; i++) {
        free(r->msgs[i].role);
        free(r->msgs[i].content);
    }
    free(r->msgs);
    for (size_t i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    free(r->salt);
    memset(r, 0, sizeof *r);
}

/* ---- pgd_status -> HTTP (the table api.h shows) ---- */

#define ANY_STATUS 1 /* a row for every status of its stage not listed before it */

static const struct status_row {
    ps_stage at;
    int status;        /* a pgd_status, or ANY_STATUS: the stage's last row */
    int http;          /* HTTP status; the OpenAI error type follows from it */
    const char *param; /* NULL: none */
    const char *code;  /* NULL: none */
    const char *text;  /* the message, or its start */
    int detail;        /* 1: the message goes on with the detail (or pgd_strerror) */
} status_rows[] = {
    {PS_AT_REQUEST, PGD_ENOMEM, 500, NULL, NULL, "out of memory", 0},
    {PS_AT_REQUEST, ANY_STATUS, 500, NULL, NULL, "cannot read the request: ", 1},
    {PS_AT_TEMPLATE, PGD_EINVAL, 400, "messages", NULL, "'messages': ", 1},
    {PS_AT_TEMPLATE, PGD_ENOMEM, 500, NULL, NULL, "out of memory", 0},
    {PS_AT_TEMPLATE, ANY_STATUS, 500, NULL, NULL, "cannot render the chat template: ", 1},
    {PS_AT_SUBMIT, PGD_EBUSY, 429, NULL, "queue_full",
     "the request queue is full (--max-queued); retry later", 0},
    {PS_AT_SUBMIT, PGD_EINVAL, 400, NULL, NULL, "the request was refused: ", 1},
    {PS_AT_SUBMIT, ANY_STATUS, 500, NULL, NULL, "cannot queue the request: ", 1},
    {PS_AT_GENERATE, PGD_ENOSPC, 400, NULL, "context_length_exceeded",
     "the request does not fit the KV cache even alone (prompt and output together): send a "
     "shorter prompt or a lower max_tokens",
     0},
    {PS_AT_GENERATE, PGD_ENOMEM, 500, NULL, NULL, "out of memory while generating", 0},
    {PS_AT_GENERATE, PGD_OK, 500, NULL, NULL,
     "generation failed: the request does not fit the KV pool, or the forward pass failed "
     "(see the server log)",
     0},
    {PS_AT_GENERATE, ANY_STATUS, 500, NULL, NULL, "generation failed (see the server log): ", 1},
    {PS_AT_SHUTDOWN, ANY_STATUS, 503, NULL, "shutting_down", "the server is shutting down", 0},
};

int ps_err_status(ps_error *e, ps_stage at, int status, const char *detail)
{
    const struct status_row *row = NULL;
    size_t n = sizeof status_rows / sizeof status_rows[0];
    for (size_t i = 0; i < n && !row; i++) {
        if (status_rows[i].at == at &&
            (status_rows[i].status == status || status_rows[i].status == ANY_STATUS))
            row = &status_rows[i];
    }
    if (!row) /* an unknown stage: a server error all the same */
        return ps_err(e, 500, NULL, NULL, "internal error: %s", pgd_strerror(status));
    const char *tail = row->detail ? (detail ? detail : pgd_strerror(status)) : "";
    return ps_err(e, row->http, row->param, row->code, "%s%s", row->text, tail);
}
