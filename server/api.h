/* SPDX-License-Identifier: MIT */
/*
 * api.h - the OpenAI-compatible request bodies and error shape: parses and validates a
 * POST /v1/completions or /v1/chat/completions body into a ps_req, and renders errors as
 * {"error":{"message","type","param","code"}}. Callers: generate.c, routes.c, the tests
 * and tests/fuzz (ps_req_parse takes arbitrary bytes: it never trusts its input).
 *
 * Fields (anything else is ignored, as OpenAI-compatible servers do):
 *   model                      string; NULL when absent (any model is then accepted)
 *   prompt       completions   string | [token ids] | [one string] | [[token ids]]; token
 *                              ids: fewer than n_ctx (413 context_length_exceeded)
 *   messages     chat          [{role, content: string | [{type:"text", text}]}], non-empty
 *   max_tokens                 integer >= 1 (chat: max_completion_tokens wins if both)
 *   temperature                number in [0, 2]; 0 is greedy            (default 1)
 *   top_p                      number in (0, 1]                         (default 1)
 *   top_k, min_p               extensions: integer >= 0, number in [0, 1] (default off)
 *   seed                       integer
 *   stop                       string | [up to 4 strings], non-empty, without NUL
 *   stream                     boolean; stream_options.include_usage boolean
 *   n                          1 only
 *   ignore_eos                 extension: boolean; true keeps generating past EOS (benches)
 *   cache_salt                 non-empty string of at most 1024 bytes: the tenant;
 *                              different salts never share cached pages (vLLM refuses ""
 *                              too; leave the field out for the default tenant)
 *   prompt_cache_retention     "in_memory" | "24h" (OpenAI)
 *   prompt_cache_key           string of at most 256 bytes (OpenAI): without cache_salt it
 *                              names the request's tenant (see Retention below)
 *   messages[i].cache_control  chat, on a message or on a content part (Anthropic-style):
 *                              {"type": "ephemeral", "ttl": "5m" | "1h"} (ttl default
 *                              "5m"); the longest ttl present applies to the prompt
 *   pagoda                     extension object: {"priority": 0-100, "ttl_s": N >= 0,
 *                              "pin": bool, "next_use_s": N >= 0, "kv_budget": N >= 0,
 *                              "kv_budget_method": NAME}; other keys are refused
 * A null value means "absent" for every optional field.
 *
 * Retention (ps_req_retention maps the fields onto a pgd_retention, cache.h):
 *   nothing                    the default: priority 35 (PGD_PRIORITY_DEFAULT), no TTL
 *   "in_memory"                TTL 1 h (OpenAI keeps in-memory prefixes up to an hour)
 *   "24h"                      TTL 24 h and priority 60 (kept over default traffic by
 *                              the priority policy; the tiers keep TTL and priority too)
 *   ephemeral "5m" / "1h"      TTL 5 min / 1 h
 *   several of those           the longest TTL and the highest priority
 *   pagoda.priority / ttl_s    override priority / TTL (ttl_s 0: no expiry)
 *   pagoda.pin                 pin the prompt's pages (until unpinned, or the TTL when
 *                              one is set); bounded by --pin-share (400 past it)
 *   pagoda.next_use_s          a next-use hint: the prompt is needed again that many
 *                              seconds after the request (prefetched from the tiers)
 * A TTL is no promise: it is how long the cache ranks the pages as retained (after it
 * they are dropped first); only a pin is a promise.
 * prompt_cache_key: when the request has no cache_salt, the tenant is the key, in a
 * namespace of its own (PS_KEY_SALT_PAD bytes of padding first, so no cache_salt, which
 * has at most PS_MAX_SALT_BYTES, can equal it): requests with the same key share pages,
 * stats and quota; a key never shares with the default tenant or with any cache_salt.
 * So the key can only narrow sharing, never widen it. With cache_salt the key is ignored.
 *
 * Token budgets (budget.h; ps_req_budget resolves the fields against the server's default,
 * pe_ctx_params.budget, from --kv-budget / --kv-budget-method):
 *   nothing                    the server's default (dense when it has none)
 *   pagoda.kv_budget N         an integer of tokens in [0, PS_MAX_KV_BUDGET]: the mean
 *                              tokens a (layer, KV head) keeps; 0: dense for this request
 *                              even when the server has a default
 *   pagoda.kv_budget_method M  streaming | h2o | tova | snapkv | pyramidkv | adakv; without
 *                              it, the server's default method, else snapkv (as the CLI's)
 *   the method alone           the server's default budget with method M: 400 naming
 *                              pagoda.kv_budget_method when the server has no default
 *   kv_budget 0 with a method  400 naming pagoda.kv_budget_method (0 is dense: no method)
 * The method's defaults (pgd_budget_default_params) fill the rest, and the result must pass
 * pgd_budget_params_check for the model: params it refuses are a 400 naming
 * pagoda.kv_budget (or the method, when the budget is the server's) with the check's line
 * (the defaults' sinks and window fit every budget from 1 up, so today that is a guard).
 * usage.pagoda.kv_budget reports what the request ran with (render.c).
 *
 * NUL characters ("\u0000"): one rule for every text field (model, prompt, a message's
 * role and content, stop): refused with 400 naming the field. The engine takes text as
 * C strings in places (a role or model compared by strcmp, message content rendered into
 * a template), so a NUL would silently cut the text or make "user\u0000x" a "user"; a
 * token-id prompt can still express any token. cache_salt is bytes with a length (its
 * hash covers every byte) and may hold NUL.
 *
 * Size (bounding what a request makes the server allocate before admission): with n_ctx,
 * a body holding more than PS_MAX_VALUES(n_ctx) JSON values is refused with 413
 * request_too_large before jansson builds anything (a 16 MB array of token ids would
 * otherwise take ~380 MB of json_t), and a token-id prompt of n_ctx or more ids is refused
 * with 413 context_length_exceeded before it is copied.
 */
#ifndef PS_API_H
#define PS_API_H

#include <stddef.h>
#include <stdint.h>

#include <pagoda/budget.h> /* pgd_budget_params */
#include <pagoda/cache.h>  /* pgd_retention */
#include <pagoda/pagoda.h> /* pgd_status, pgd_strerror */

#include "buf.h"

typedef enum ps_kind { PS_COMPLETION = 0, PS_CHAT = 1 } ps_kind;

#define PS_MAX_USER_STOPS 4
#define PS_MAX_SALT_BYTES 1024
#define PS_MAX_CACHE_KEY_BYTES 256
#define PS_KEY_SALT_PAD (PS_MAX_SALT_BYTES + 1) /* see "prompt_cache_key" above */
#define PS_MAX_TTL_S (366ull * 24 * 3600)       /* ttl_s and next_use_s: at most a year */
#define PS_MAX_KV_BUDGET (1u << 22)             /* pagoda.kv_budget: pgd_budget_params_check's */
/* The JSON values a body may hold: a prompt that fits the context takes fewer than n_ctx
 * token ids, and a chat message makes a token at least (its template text), so 4 per
 * context token leaves room for content parts and the other fields. */
#define PS_VALUES_PER_CTX_TOKEN 4
#define PS_VALUES_BASE 4096
#define PS_MAX_VALUES(n_ctx) ((size_t)PS_VALUES_PER_CTX_TOKEN * (n_ctx) + PS_VALUES_BASE)

typedef struct ps_msg {
    char *role;    /* owned */
    char *content; /* owned; text parts joined */
} ps_msg;

typedef struct ps_req {
    ps_kind kind;
    char *model;          /* owned; NULL: absent */
    char *prompt;         /* completions with a text prompt (owned), else NULL */
    size_t prompt_len;    /* bytes (a prompt may hold NUL bytes) */
    int32_t *prompt_toks; /* completions with token ids (owned), else NULL */
    size_t n_prompt_toks;
    ps_msg *msgs; /* chat: [n_msgs] (owned) */
    size_t n_msgs;
    int64_t max_tokens; /* 0: absent */
    double temperature; /* default 1 */
    double top_p;       /* default 1 */
    int64_t top_k;      /* default 0 (off) */
    double min_p;       /* default 0 (off) */
    int has_seed;
    uint64_t seed;
    char *stop[PS_MAX_USER_STOPS]; /* owned */
    size_t n_stop;
    int stream;
    int include_usage;
    int ignore_eos; /* extension (vLLM's): keep generating past end-of-generation tokens */
    char *salt;     /* owned; NULL: the default tenant (prompt_cache_key: its salt) */
    size_t salt_len;
    /* retention fields (see Retention); 0 / absent unless the body has them */
    int cache_retention;                              /* PS_RETAIN_* of prompt_cache_retention */
    uint32_t ephemeral_ttl_s;                         /* the longest cache_control ttl; 0: none */
    int has_priority, has_ttl, has_pin, has_next_use; /* the pagoda fields present */
    uint32_t priority;
    uint64_t ttl_s;
    int pin;
    uint64_t next_use_s;
    int has_cache_key; /* prompt_cache_key was given (and may have become the salt) */
    /* token budget fields (see Token budgets); 0 / absent unless the body has them */
    int has_kv_budget, has_kv_budget_method;
    uint32_t kv_budget;                 /* tokens, <= PS_MAX_KV_BUDGET; 0: dense */
    pgd_budget_method kv_budget_method; /* with has_kv_budget_method: never NONE */
    double ttl_s_admin;                 /* the admin API's "ttl_s" (ps_admin_parse); 0: none */
} ps_req;

enum { PS_RETAIN_NONE = 0, PS_RETAIN_IN_MEMORY = 1, PS_RETAIN_24H = 2 };

/* An error response: HTTP status, OpenAI type, the offending field (or empty), a code
 * (or NULL) and a message that names the field. */
typedef struct ps_error {
    int status;
    const char *type; /* static */
    const char *code; /* static or NULL */
    char param[64];
    char message[512];
} ps_error;

/* Fills e. fmt: printf-style message. Bytes of param and message that are not valid UTF-8
 * (quoted input, a cut character) become '?', so the error always renders as JSON.
 * Returns -1 for convenient `return ps_err(...)`. */
int ps_err(ps_error *e, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Parses body[0..len) (need not be NUL-terminated) as a request of kind. n_vocab bounds
 * token ids in a token-array prompt; n_ctx (0: no limit) bounds the body's JSON values and
 * a token-array prompt (see Size above). Returns 0 with *r filled (release with
 * ps_req_deinit), or -1 with *e filled (400 for malformed JSON or a bad field, message
 * naming it; 413 for the size limits) and *r zeroed. Allocation failure: -1 with status
 * 500. */
int ps_req_parse(ps_kind kind, const char *body, size_t len, uint32_t n_vocab, uint32_t n_ctx,
                 ps_req *r, ps_error *e);
void ps_req_deinit(ps_req *r);

/* Fills *out with r's retention (the mapping in Retention above). Returns 1 when the
 * request asked for any (the cache should be told), 0 for the default. Pure. */
int ps_req_retention(const ps_req *r, pgd_retention *out);

/* Resolves r's token budget (see Token budgets) against the server's default dflt
 * (pe_ctx_params.budget; method PGD_BUDGET_NONE: the server has none) for a model of
 * n_layers layers. Returns 0 when r names no budget (the default applies:
 * pe_request_params.budget NULL), 1 with *out filled (method PGD_BUDGET_NONE: dense; else
 * params that pass pgd_budget_params_check), or -1 with *e (a 400 whose param is
 * "pagoda.kv_budget" or "pagoda.kv_budget_method" and whose message names it). Pure. */
int ps_req_budget(const ps_req *r, const pgd_budget_params *dflt, uint32_t n_layers,
                  pgd_budget_params *out, ps_error *e);

/* Parses the body of an admin call (POST /v1/cache/pin, unpin, prefetch, evict, stats):
 * one of "prompt" (a string, or token ids as in completions), "tokens" ([token ids]) or
 * "messages" (as in chat), plus optional "cache_salt" (as in requests) and, with
 * want_ttl, "ttl_s" (a number >= 0, at most PS_MAX_TTL_S). The prompt goes into r as a
 * completion's or a chat's would (r->kind says which). need_prompt 0: an empty body or
 * one without a prompt is fine (stats). Returns 0, or -1 with *e (400 naming the field,
 * 413 as ps_req_parse). */
int ps_admin_parse(const char *body, size_t len, uint32_t n_vocab, uint32_t n_ctx, int need_prompt,
                   int want_ttl, ps_req *r, ps_error *e);

/* Appends e as OpenAI's JSON error object to out. Returns 0 or -1 (oom). */
int ps_error_json(const ps_error *e, ps_buf *out);

/* ---- pgd_status -> HTTP ----
 *
 * Every pgd_status the server turns into an HTTP error goes through one table (api.c),
 * keyed by the stage that returned it, since one status means different things at each:
 *
 *   stage           status        HTTP  code                     message
 *   request         ENOMEM        500   -                        out of memory
 *   template        EINVAL        400   - (param "messages")     'messages': DETAIL
 *   submit          EBUSY         429   queue_full               the request queue is full
 *   submit          EINVAL        400   -                        the request was refused: ...
 *   submit          other         500   -                        cannot queue the request: ...
 *   generate        ENOSPC        400   context_length_exceeded  does not fit the KV cache
 *   generate        ENOMEM        500   -                        out of memory while generating
 *   generate        OK (unknown)  500   -                        does not fit, or forward failed
 *   generate        other         500   -                        generation failed: ...
 *   shutdown        any           503   shutting_down            the server is shutting down
 *
 * Why 400 for a request that does not fit the KV pool even alone (PGD_ENOSPC from the
 * scheduler's final callback): it is a limit of this deployment on the request's size,
 * like the context length (413 context_length_exceeded, checked before submitting, stays):
 * retrying cannot help, the client has to send less. OpenAI, vLLM and llama.cpp answer an
 * oversized request with 400 invalid_request_error, and the OpenAI clients do not retry a
 * 400; they do retry 503 (and any 5xx), which would only repeat the failure. 507 is
 * WebDAV's and unknown to those clients. A streamed request has sent 200 already: the
 * same error object then ends the stream. */
typedef enum ps_stage {
    PS_AT_REQUEST = 0, /* reading the request: parsing, the prompt, buffers */
    PS_AT_TEMPLATE,    /* pe_chat_render on the request's messages */
    PS_AT_SUBMIT,      /* pe_sched_submit */
    PS_AT_GENERATE,    /* a PE_FINISH_ERROR final callback: its usage.status (PGD_OK: unknown) */
    PS_AT_SHUTDOWN     /* the server refuses or cancelled the work: it is stopping */
} ps_stage;

/* Fills e for status (a pgd_status) returned at stage `at`, from the table above. detail:
 * what ends the message of rows that take one (NULL: pgd_strerror(status)). Returns -1,
 * like ps_err. Any thread; no allocation. */
int ps_err_status(ps_error *e, ps_stage at, int status, const char *detail);

#endif /* PS_API_H */
