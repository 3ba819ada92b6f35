/* SPDX-License-Identifier: MIT */
/*
 * server.h - the OpenAI-compatible HTTP server behind `pagoda serve`: libmicrohttpd (one
 * thread per connection, with a guard thread that cuts clients too slow to send a request)
 * in front of one pe_sched, stepped by a thread of its own.
 * Caller: tools/serve.c. Prefix: ps_ ("pagoda server").
 *
 *   HTTP threads                        stepping thread
 *   ------------                        ---------------
 *   parse + validate the body           loop: pe_sched_step()
 *   tokenize (chat: render template)      token callback -> job queue, signal
 *   pe_sched_submit ------------------->  final callback -> job done, usage
 *   wait on the job: detokenize, stop
 *   strings, write JSON or SSE chunks
 *   client gone -> pe_sched_cancel
 *
 * Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models[/ID],
 * GET /health, GET /metrics, and the cache admin API (admin.c): POST /v1/cache/pin,
 * /unpin, /prefetch, /evict, GET or POST /v1/cache/stats. See api.h for request fields
 * and their retention, metrics.h for the metrics.
 * A model object carries, besides OpenAI's fields and max_model_len, an extension
 * "pagoda": {"n_vocab", "n_ctx", "page_tokens", "kv_type"}.
 * Usage (every response, and the final usage chunk of a stream) carries, besides OpenAI's
 * fields, "pagoda": {"cached_tokens_by_tier": {"pool": N, "<tier>": N, ...}}: where the
 * prompt_tokens_details.cached_tokens came from, with the context's tiers labelled as on
 * /metrics (render.c, ps_metrics_tier_labels); and "retention": {"priority", "ttl_s",
 * "expires_at", "pinned", "pinned_until"}: what the cache was told to keep (render.c).
 *
 * Lifecycle: ps_server_start -> (serving) -> ps_server_begin_shutdown (new requests get
 * 503 at once) -> ps_server_wait_idle (in-flight requests finish) -> ps_server_destroy
 * (cancels what is left: every stream still ends with an error event and [DONE]; then
 * the listening socket and every connection close, every thread stops). The model, context
 * and scheduler are borrowed: they must outlive the server, and while it runs nothing
 * else may step the scheduler.
 */
#ifndef PS_SERVER_H
#define PS_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "chat.h"
#include "model.h"
#include "scheduler.h"

typedef struct ps_server ps_server;

typedef struct ps_server_params {
    const char *host;         /* address to bind (numeric or a name); default 127.0.0.1 */
    uint16_t port;            /* 0: an ephemeral port (ps_server_port tells which) */
    const char *api_key;      /* NULL: no auth; else /v1/ needs "Authorization: Bearer KEY" */
    const char *model_id;     /* the id /v1/models reports and requests may name; required */
    uint64_t max_body_bytes;  /* request bodies over this get 413 unread; 0: 16 MiB */
    int chat_family;          /* a pe_chat_family, or -1: detect from the GGUF template */
    int prefix_cache;         /* reported on /metrics (the scheduler does the work) */
    uint32_t max_connections; /* open connections at most (each has a thread); more are
                                 refused. 0: the default, 4096 */
    uint32_t idle_timeout_s;  /* a connection with no request in progress (idle keep-alive,
                                 a request or body arriving too slowly) is closed after
                                 this many seconds without traffic; 0: never. Default 60.
                                 Never applies while a generation is being handled. */
    uint32_t max_connections_per_ip; /* open connections from one address; 0: no limit.
                                        Default 1024 */
    uint32_t header_timeout_s;       /* a request's headers must be in this long after the
                                        connection opened (kept alive: after the idle
                                        timeout); 0: no deadline. Default 10 */
    uint32_t min_body_rate;          /* bytes per second a body must arrive at once
                                        header_timeout_s passed; 0: any. Default 1024 */
    int parse_special_in_messages;   /* 1: control-token text in chat messages becomes those
                                        tokens (the old behaviour); 0: plain text (default) */
    uint32_t hint_lead_ms;           /* next-use hints (pagoda.next_use_s) are warmed from the
                                        tiers this long before they are due
                                        (pgd_cache_hints_run); default 2000, 0: never */
} ps_server_params;

ps_server_params ps_server_default_params(void);

/* Binds, starts the HTTP threads and the stepping thread. Returns 0, or -1 with one line
 * in err (cannot resolve or bind the address, out of memory). */
int ps_server_start(const ps_server_params *p, pe_model *m, pe_ctx *ctx, pe_sched *s,
                    ps_server **out, char *err, size_t errlen);
/* The port actually bound. */
uint16_t ps_server_port(const ps_server *srv);
/* The chat family in use (detected or forced). */
pe_chat_family ps_server_chat_family(const ps_server *srv);
/* Stops taking new work: requests not yet submitted get 503 (new connections are still
 * accepted, to be told so at once; requests already submitted are still served). Any
 * thread; idempotent. */
void ps_server_begin_shutdown(ps_server *srv);
/* Waits up to timeout_s for every HTTP request in flight to complete. Returns 1 when none
 * is left, 0 on timeout. */
int ps_server_wait_idle(ps_server *srv, double timeout_s);
/* Cancels every request left, closes every connection (idle keep-alive ones too), joins
 * every thread, frees the server. NULL: no-op. Bounded: requests in flight notice within
 * 50 ms, and the cancelled ones finish after the step in flight. */
void ps_server_destroy(ps_server *srv);
/* What the shutdown is doing now ("serving", "finishing requests in flight", "cancelling
 * requests", "closing connections", ... "stopped"): static text, for a watchdog's message
 * if the shutdown ever stalls. Any thread, also after ps_server_destroy. */
const char *ps_server_shutdown_stage(void);

#endif /* PS_SERVER_H */
