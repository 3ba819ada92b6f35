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
 * A null value means "absent" for every optional field.
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

#include <pagoda/pagoda.h> /* pgd_status, pgd_strerror */

#include "buf.h"

typedef enum ps_kind { PS_COMPLETION = 0, PS_CHAT = 1 } ps_kind;

#define PS_MAX_USER_STOPS 4
#define PS_MAX_SALT_BYTES 1024
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
    char *salt;     /* owned; NULL: the default tenant */
    size_t salt_len;
} ps_req;

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
