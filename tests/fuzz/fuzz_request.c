/* SPDX-License-Identifier: MIT */
/*
 * fuzz_request.c - fuzz target for the HTTP request-body parser of `pagoda serve`
 * (server/api.c): ps_req_parse on arbitrary bytes, as a completions or a chat body, with
 * a small vocabulary, and ps_error_json on every error it reports. Request bodies are
 * the server's main outside input.
 *
 * Input: byte 0 picks the kind (bit 0: 0 completions, 1 chat) and n_vocab (byte >> 1,
 * 0..127, so token ids at and past the bound are easy to reach); n_ctx is 4 x n_vocab (0:
 * no limit), so the size limits are reached too; the rest is the body.
 *
 * Checks (abort on failure; ASan/UBSan catch the rest):
 *  - success: the kind is kept; completions hold exactly one of a text prompt and a
 *    non-empty token array whose ids all lie in [0, n_vocab); chat holds >= 1 message,
 *    each with a role and content; 0 <= temperature <= 2, 0 < top_p <= 1, 0 <= min_p <= 1,
 *    top_k >= 0, max_tokens >= 0, at most 4 non-empty stop strings, a salt of at most
 *    1024 bytes, non-empty when present; no NUL in a text prompt (its length is strlen's);
 *    a token prompt shorter than n_ctx; parsing again gives the same fields.
 *  - failure: status 400, 413 (the size limits, with a code) or 500 (out of memory), a
 *    non-empty terminated message,
 *    a terminated param, *r zeroed but for the kind, and ps_error_json renders it as JSON
 *    that jansson reads back, with a non-empty message (so a client always gets an
 *    error body, whatever bytes the message quotes).
 *  - ps_req_deinit leaves the request zeroed, so freeing twice is harmless.
 *  - the retention a parsed request maps to (ps_req_retention): priority 0..100, ttl and
 *    next use within PS_MAX_TTL_S; a default retention reports 0.
 *  - the token budget a parsed request resolves to (ps_req_budget) against a server with
 *    no default, and with one (h2o at 96): 0 exactly when neither pagoda.kv_budget nor
 *    pagoda.kv_budget_method was given; 1 with params pgd_budget_params_check accepts (or
 *    method none, for kv_budget 0); -1 a 400 naming one of the two fields.
 *  - the admin API's body parser (ps_admin_parse, POST /v1/cache/...) on the same bytes,
 *    with need_prompt and want_ttl from the low bits of the body's length: success has
 *    a completion or chat prompt (or none when not needed) and 0 <= ttl_s <= PS_MAX_TTL_S;
 *    failure is an error as above, with *r zeroed but for the kind.
 *
 * Built as a libFuzzer target with -DPGD_FUZZ=ON (clang), and always as a corpus replayer
 * (replay_main.c) that ctest runs over corpus/request/. From the fuzz build directory:
 *     ./tests/fuzz/fuzz_request -max_total_time=180 -max_len=4096 \
 *         -dict=../tests/fuzz/request.dict NEW_CORPUS_DIR ../tests/fuzz/corpus/request
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "api.h"
#include "buf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_request: check failed: %s\n", what);
        abort();
    }
}

/* Whether every byte of r but its kind is zero (parse and free clear it with memset). */
static int is_zeroed(const ps_req *r)
{
    ps_req z;
    memset(&z, 0, sizeof z);
    z.kind = r->kind;
    return memcmp(r, &z, sizeof z) == 0;
}

static int same_str(const char *a, const char *b, size_t n)
{
    if (!a || !b) return a == b;
    return memcmp(a, b, n) == 0;
}

static void check_ok(const ps_req *r, ps_kind kind, uint32_t n_vocab, uint32_t n_ctx)
{
    check(r->kind == kind, "kind kept");
    if (r->prompt) check(strlen(r->prompt) == r->prompt_len, "no NUL in a text prompt");
    if (n_ctx) check(r->n_prompt_toks < n_ctx, "token prompt shorter than the context");
    check(!r->salt || r->salt_len > 0, "salt non-empty");
    if (kind == PS_COMPLETION) {
        check(!r->msgs && !r->n_msgs, "completions: no messages");
        check(!!r->prompt != !!r->prompt_toks, "completions: text xor token prompt");
        if (r->prompt) check(r->prompt[r->prompt_len] == '\0', "text prompt terminated");
        if (r->prompt_toks) {
            check(r->n_prompt_toks > 0, "token prompt non-empty");
            for (size_t i = 0; i < r->n_prompt_toks; i++)
                check(r->prompt_toks[i] >= 0 && (uint32_t)r->prompt_toks[i] < n_vocab,
                      "token id inside the vocabulary");
        }
    } else {
        check(!r->prompt && !r->prompt_toks, "chat: no prompt");
        check(r->msgs && r->n_msgs > 0, "chat: messages");
        for (size_t i = 0; i < r->n_msgs; i++)
            check(r->msgs[i].role && r->msgs[i].content, "message role and content");
    }
    check(r->temperature >= 0 && r->temperature <= 2, "temperature range");
    check(r->top_p > 0 && r->top_p <= 1, "top_p range");
    check(r->min_p >= 0 && r->min_p <= 1, "min_p range");
    check(r->top_k >= 0 && r->top_k <= INT32_MAX, "top_k range");
    check(r->max_tokens >= 0 && r->max_tokens <= INT32_MAX, "max_tokens range");
    check(r->n_stop <= PS_MAX_USER_STOPS, "stop count");
    for (size_t i = 0; i < r->n_stop; i++)
        check(r->stop[i] && r->stop[i][0], "stop strings non-empty");
    for (size_t i = r->n_stop; i < PS_MAX_USER_STOPS; i++)
        check(!r->stop[i], "unused stop slots NULL");
    /* A prompt_cache_key without cache_salt is a salt of its own namespace: padded past
     * the longest cache_salt, so it equals none (api.h). */
    check(r->salt_len <= (r->has_cache_key && r->salt_len > PS_MAX_SALT_BYTES
                              ? PS_KEY_SALT_PAD + PS_MAX_CACHE_KEY_BYTES
                              : PS_MAX_SALT_BYTES),
          "salt length");
    check(r->salt_len <= PS_MAX_SALT_BYTES || r->has_cache_key, "a long salt is a key's");
    check(!r->salt_len || r->salt, "salt bytes present");
    check(r->include_usage == 0 || r->include_usage == 1, "include_usage boolean");
    check(r->stream == 0 || r->stream == 1, "stream boolean");
}

static void check_same(const ps_req *a, const ps_req *b)
{
    check(a->prompt_len == b->prompt_len && same_str(a->prompt, b->prompt, a->prompt_len),
          "reparse: prompt");
    check(a->n_prompt_toks == b->n_prompt_toks, "reparse: token count");
    if (a->n_prompt_toks)
        check(!memcmp(a->prompt_toks, b->prompt_toks, a->n_prompt_toks * sizeof *a->prompt_toks),
              "reparse: tokens");
    check(a->n_msgs == b->n_msgs, "reparse: message count");
    check(a->n_stop == b->n_stop, "reparse: stop count");
    check(a->salt_len == b->salt_len && same_str(a->salt, b->salt, a->salt_len), "reparse: salt");
    check(a->max_tokens == b->max_tokens && a->temperature == b->temperature &&
              a->top_p == b->top_p && a->seed == b->seed && a->has_seed == b->has_seed,
          "reparse: numbers");
}

static void check_error(const ps_error *e)
{
    check(e->status == 400 || e->status == 413 || e->status == 500, "error status 400/413/500");
    check(e->status != 413 || e->code, "a 413 has a code");
    check(e->type != NULL, "error type");
    check(memchr(e->message, '\0', sizeof e->message) != NULL && e->message[0],
          "error message terminated and non-empty");
    check(memchr(e->param, '\0', sizeof e->param) != NULL, "error param terminated");
    ps_buf b;
    ps_buf_init(&b);
    check(ps_error_json(e, &b) == 0 && !b.oom, "error renders as JSON");
    json_error_t je;
    json_t *o = json_loadb(b.data, b.len, 0, &je);
    check(o != NULL, "error JSON parses");
    json_t *m = json_object_get(json_object_get(o, "error"), "message");
    check(json_is_string(m) && json_string_length(m) > 0, "error JSON has a message");
    json_decref(o);
    ps_buf_deinit(&b);
}

/* ps_req_budget on a parsed request, against dflt (method none: a server without one). */
static void check_budget(const ps_req *r, const pgd_budget_params *dflt)
{
    pgd_budget_params p;
    ps_error e;
    memset(&e, 0, sizeof e);
    int rc = ps_req_budget(r, dflt, 4, &p, &e);
    int given = r->has_kv_budget || r->has_kv_budget_method;
    check(r->kv_budget <= PS_MAX_KV_BUDGET, "budget: kv_budget range");
    check(!r->has_kv_budget_method ||
              (r->kv_budget_method > PGD_BUDGET_NONE && r->kv_budget_method < PGD_BUDGET_COUNT),
          "budget: a method named");
    check((rc == 0) == !given, "budget: 0 exactly when no field was given");
    if (rc == 1) {
        check(p.method == PGD_BUDGET_NONE || pgd_budget_params_check(&p, 4, NULL, 0) == PGD_OK,
              "budget: resolved params pass the check");
        check(p.method != PGD_BUDGET_NONE || (r->has_kv_budget && !r->kv_budget),
              "budget: dense only for kv_budget 0");
    } else if (rc != 0) {
        check(rc == -1 && e.status == 400, "budget: error is a 400");
        check(!strcmp(e.param, "pagoda.kv_budget") || !strcmp(e.param, "pagoda.kv_budget_method"),
              "budget: error names a budget field");
        check_error(&e);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!size) return 0;
    ps_kind kind = (data[0] & 1) ? PS_CHAT : PS_COMPLETION;
    uint32_t n_vocab = data[0] >> 1, n_ctx = 4 * n_vocab;
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    ps_req r, r2;
    ps_error e;

    memset(&e, 0, sizeof e);
    int rc = ps_req_parse(kind, body, len, n_vocab, n_ctx, &r, &e);
    if (rc == 0) {
        check_ok(&r, kind, n_vocab, n_ctx);
        ps_error e2;
        check(ps_req_parse(kind, body, len, n_vocab, n_ctx, &r2, &e2) == 0, "reparse succeeds");
        check_same(&r, &r2);
        ps_req_deinit(&r2);
    } else {
        check(rc == -1, "error returns -1");
        check(r.kind == kind && is_zeroed(&r), "failed request zeroed");
        check_error(&e);
    }
    if (rc == 0) {
        pgd_retention ret;
        int asked = ps_req_retention(&r, &ret);
        check(asked == 0 || asked == 1, "retention: 0 or 1");
        check(ret.priority <= PGD_PRIORITY_MAX, "retention: priority range");
        check(ret.ttl_ms <= (uint64_t)PS_MAX_TTL_S * 1000 &&
                  ret.next_use_ms <= (uint64_t)PS_MAX_TTL_S * 1000,
              "retention: ttl and next use range");
        check(asked || (ret.priority == PGD_PRIORITY_DEFAULT && !ret.ttl_ms && !ret.pin &&
                        !ret.next_use_ms),
              "retention: the default when none was asked");
        pgd_budget_params none = pgd_budget_default_params(PGD_BUDGET_NONE, 0);
        pgd_budget_params h2o = pgd_budget_default_params(PGD_BUDGET_H2O, 96);
        check_budget(&r, &none);
        check_budget(&r, &h2o);
    }
    ps_req_deinit(&r);
    check(is_zeroed(&r) && r.kind == 0, "freed request zeroed");
    ps_req_deinit(&r);

    /* The admin API's bodies: need_prompt and want_ttl from the length's low bits. */
    int need_prompt = (int)(len & 1), want_ttl = (int)((len >> 1) & 1);
    memset(&e, 0, sizeof e);
    rc = ps_admin_parse(body, len, n_vocab, n_ctx, need_prompt, want_ttl, &r, &e);
    if (rc == 0) {
        int has_prompt = r.prompt || r.prompt_toks || r.n_msgs;
        check(has_prompt || !need_prompt, "admin: a prompt when one is needed");
        check(r.ttl_s_admin >= 0 && r.ttl_s_admin <= PS_MAX_TTL_S, "admin: ttl_s range");
        check(want_ttl || r.ttl_s_admin == 0, "admin: ttl_s only when asked for");
        check(!r.salt || r.salt_len > 0, "admin: salt non-empty");
    } else {
        check(rc == -1, "admin: error returns -1");
        check(is_zeroed(&r), "admin: failed request zeroed");
        check_error(&e);
    }
    ps_req_deinit(&r);
    check(is_zeroed(&r), "admin: freed request zeroed");
    return 0;
}
