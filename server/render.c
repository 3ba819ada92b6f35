/* SPDX-License-Identifier: MIT */
/*
 * render.c - what the client of a generation sees: the outcome of a finished request, its
 * error, the JSON of a whole answer and the Server-Sent Events chunks of a stream, in
 * OpenAI's shapes (text_completion, chat.completion, chat.completion.chunk). Callers:
 * generate.c, on the request's connection thread.
 *
 * Invariants: only the conn is read (and, for streams, k->out written), so no lock is
 * taken. Usage is exact: completion_tokens counts what the client got (the tokens before
 * a stop string, or the scheduler's count), cached_tokens is the scheduler's, and so is
 * its split by where the tokens came from (usage.pagoda.cached_tokens_by_tier).
 */
#include <stdlib.h>
#include <time.h>

#include "server_int.h"

/* ---- pieces ---- */

/* Dumps o (stolen) compactly into out. Returns 0 or -1. */
int ps__put_json(ps_buf *out, json_t *o)
{
    if (!o) {
        out->oom = 1;
        return -1;
    }
    char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(o);
    if (!s) {
        out->oom = 1;
        return -1;
    }
    int rc = ps_buf_adds(out, s);
    free(s);
    return rc;
}

/* usage.pagoda.retention: what the cache was told to keep of this request's pages (api.h
 * "Retention"), counted from now (the request's pages were released when it finished):
 *   priority      0..100
 *   ttl_s         seconds the cache ranks the pages as retained after the request; null:
 *                 no expiry (kept as long as the policy keeps them)
 *   expires_at    unix seconds when the TTL ends, or null
 *   pinned        true: the prompt's pages are pinned (a promise: not evicted until
 *                 unpinned or pinned_until); false when no pin was asked for or the pin
 *                 share refused it at admission
 *   pinned_until  unix seconds the pin ends (its TTL), or null (until unpinned, or no pin)
 * Only a pin is a promise; a TTL is no guarantee that the pages stay. */
static json_t *retention_json(const conn *k)
{
    const pgd_retention *r = &k->ret;
    long long now = (long long)time(NULL), ttl = (long long)(r->ttl_ms / 1000);
    int pinned = r->pin && !k->usage.pin_refused;
    json_t *exp = r->ttl_ms ? json_integer(now + ttl) : json_null();
    json_t *until = pinned && r->ttl_ms ? json_integer(now + ttl) : json_null();
    return json_pack("{s:I,s:o,s:o,s:b,s:o}", "priority", (json_int_t)r->priority, "ttl_s",
                     r->ttl_ms ? json_integer(ttl) : json_null(), "expires_at", exp, "pinned",
                     pinned, "pinned_until", until);
}

/* usage.pagoda.kv_budget of a request that ran with a token budget (api.h "Token budgets";
 * the scheduler's pe_usage figures), NULL for a dense one (the key is then absent):
 *   method          the method's name (budget.h)
 *   budget          mean tokens kept per (layer, KV head)
 *   dropped_tokens  slots compaction dropped over the request's life (preemption and
 *                   recompute included)
 *   kv_tokens       the slots its sequence held at the end (what its KV pages held) */
static json_t *budget_json(const conn *k)
{
    const pe_usage *u = &k->usage;
    const char *name = pgd_budget_method_name(u->kv_budget_method);
    if (u->kv_budget_method == PGD_BUDGET_NONE || !name) return NULL;
    return json_pack("{s:s,s:I,s:I,s:I}", "method", name, "budget", (json_int_t)u->kv_budget,
                     "dropped_tokens", (json_int_t)u->kv_budget_dropped, "kv_tokens",
                     (json_int_t)u->kv_slots);
}

/* usage: OpenAI's fields, then the extension "pagoda": {"cached_tokens_by_tier": {"pool":
 * N, <tier label>: N, ...}, "retention": {...}, "kv_budget": {...}}: the scheduler's split
 * of cached_tokens (pe_usage; the labels are the /metrics ones, ps_metrics_tier_labels),
 * whose values add up to cached_tokens, the retention (retention_json) and, for a request
 * with a token budget, the budget (budget_json). */
static json_t *usage_json(const conn *k)
{
    const ps_metrics_info *info = &k->srv->info;
    uint32_t p = k->usage.prompt_tokens,
             c = k->stopped ? k->tx.n_tokens : k->usage.completion_tokens;
    json_t *by_tier = json_pack("{s:I}", "pool", (json_int_t)k->usage.cached_pool_tokens);
    for (uint32_t i = 0; by_tier && i < info->n_tiers; i++) {
        uint32_t n = i < k->usage.n_tiers ? k->usage.cached_tier_tokens[i] : 0;
        if (json_object_set_new(by_tier, info->tier_labels[i], json_integer((json_int_t)n))) {
            json_decref(by_tier);
            by_tier = NULL;
        }
    }
    if (!by_tier) return NULL;
    json_t *pagoda =
        json_pack("{s:o,s:o}", "cached_tokens_by_tier", by_tier, "retention", retention_json(k));
    if (!pagoda) return NULL;
    if (k->usage.kv_budget_method != PGD_BUDGET_NONE &&
        json_object_set_new(pagoda, "kv_budget", budget_json(k))) {
        json_decref(pagoda);
        return NULL;
    }
    return json_pack("{s:I,s:I,s:I,s:{s:I},s:o}", "prompt_tokens", (json_int_t)p,
                     "completion_tokens", (json_int_t)c, "total_tokens", (json_int_t)p + c,
                     "prompt_tokens_details", "cached_tokens", (json_int_t)k->usage.cached_tokens,
                     "pagoda", pagoda);
}

/* {"id","object","created","model"} of a response or chunk. */
static json_t *base_json(const conn *k, const char *object)
{
    return json_pack("{s:s,s:s,s:I,s:s}", "id", k->rid, "object", object, "created",
                     (json_int_t)k->created, "model", k->srv->model_id);
}

/* The outcome of a finished generation as the client sees it. */
ps_outcome ps__outcome_of(const conn *k)
{
    if (k->job_oom) return PS_OUT_ERROR;
    if (k->stopped) return PS_OUT_STOP;
    switch (k->fin) {
    case PE_FINISH_EOG:
        return PS_OUT_STOP;
    case PE_FINISH_LENGTH:
        return PS_OUT_LENGTH;
    case PE_FINISH_CANCELLED:
        return PS_OUT_CANCELLED;
    default:
        return PS_OUT_ERROR;
    }
}

/* The error a generation that did not finish normally reports. A request the client
 * still waits for was cancelled by the shutdown; a failed one carries the scheduler's
 * status (k->usage.status, from the final callback) unless the server itself ran out of
 * memory for it. */
void ps__outcome_error(const conn *k, ps_outcome o, ps_error *e)
{
    if (o == PS_OUT_CANCELLED)
        ps_err_status(e, PS_AT_SHUTDOWN, PGD_ESTATE, NULL);
    else
        ps_err_status(e, PS_AT_GENERATE, k->job_oom ? PGD_ENOMEM : k->usage.status, NULL);
}

static const char *finish_name(const conn *k)
{
    return ps__outcome_of(k) == PS_OUT_LENGTH ? "length" : "stop";
}

/* ---- a whole answer ---- */

/* The answer of a finished request that neither failed nor was cancelled; NULL when memory
 * runs out. Takes the text out of k->tx. */
json_t *ps__whole_json(conn *k)
{
    const char *text;
    size_t n = ps_textout_take(&k->tx, &text);
    json_t *choice;
    if (k->kind == PS_CHAT)
        choice = json_pack("{s:i,s:{s:s,s:s%},s:n,s:s}", "index", 0, "message", "role", "assistant",
                           "content", text, n, "logprobs", "finish_reason", finish_name(k));
    else
        choice = json_pack("{s:i,s:s%,s:n,s:s}", "index", 0, "text", text, n, "logprobs",
                           "finish_reason", finish_name(k));
    json_t *o_json = base_json(k, k->kind == PS_CHAT ? "chat.completion" : "text_completion");
    if (!choice || !o_json) {
        json_decref(choice);
        json_decref(o_json);
        return NULL;
    }
    json_object_set_new(o_json, "choices", json_pack("[o]", choice));
    json_object_set_new(o_json, "usage", usage_json(k));
    return o_json;
}

/* ---- a stream (Server-Sent Events) ---- */

static void sse(conn *k, json_t *o)
{
    ps_buf_adds(&k->out, "data: ");
    ps__put_json(&k->out, o);
    ps_buf_adds(&k->out, "\n\n");
}

/* One chunk: text (may be empty), finish (NULL: not yet), role: the chat's first chunk,
 * with_usage: usage on this chunk. */
void ps__sse_chunk(conn *k, const char *text, size_t n, const char *finish, int role,
                   int with_usage)
{
    json_t *o = base_json(k, k->kind == PS_CHAT ? "chat.completion.chunk" : "text_completion");
    json_t *choice;
    json_t *fin = finish ? json_string(finish) : json_null();
    if (k->kind == PS_CHAT) {
        json_t *delta;
        if (role)
            delta = json_pack("{s:s,s:s}", "role", "assistant", "content", "");
        else if (finish)
            delta = json_object();
        else
            delta = json_pack("{s:s%}", "content", text, n);
        choice = json_pack("{s:i,s:o,s:n,s:o}", "index", 0, "delta", delta, "logprobs",
                           "finish_reason", fin);
    } else {
        choice = json_pack("{s:i,s:s%,s:n,s:o}", "index", 0, "text", text, n, "logprobs",
                           "finish_reason", fin);
    }
    if (o && choice) {
        json_object_set_new(o, "choices", json_pack("[o]", choice));
        if (with_usage)
            json_object_set_new(o, "usage", usage_json(k));
        else if (k->include_usage)
            json_object_set_new(o, "usage", json_null());
    } else {
        json_decref(choice);
    }
    sse(k, o);
}

/* The end of a stream of outcome o: the finishing chunk, usage, [DONE]. */
void ps__sse_finish(conn *k, ps_outcome o)
{
    const char *text;
    size_t n = ps_textout_take(&k->tx, &text);
    if (n) ps__sse_chunk(k, text, n, NULL, 0, 0);
    if (o == PS_OUT_CANCELLED || o == PS_OUT_ERROR) {
        ps_error e;
        ps__outcome_error(k, o, &e);
        ps_buf_adds(&k->out, "data: ");
        ps_error_json(&e, &k->out);
        ps_buf_adds(&k->out, "\n\n");
    } else if (k->include_usage) {
        /* OpenAI's shape: usage null on every chunk, then one chunk with no choices. */
        ps__sse_chunk(k, "", 0, finish_name(k), 0, 0);
        json_t *u = base_json(k, k->kind == PS_CHAT ? "chat.completion.chunk" : "text_completion");
        if (u) {
            json_object_set_new(u, "choices", json_array());
            json_object_set_new(u, "usage", usage_json(k));
        }
        sse(k, u);
    } else {
        /* Usage is always reported: on the finishing chunk when not asked for. */
        ps__sse_chunk(k, "", 0, finish_name(k), 0, 1);
    }
    ps_buf_adds(&k->out, "data: [DONE]\n\n");
    k->stream_done = 1;
}
