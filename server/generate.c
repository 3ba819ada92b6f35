/* SPDX-License-Identifier: MIT */
/*
 * generate.c - POST /v1/completions and /v1/chat/completions: tokenizes the prompt
 * (chat: renders the template first), submits it to the scheduler with a job (handoff.c),
 * then either waits for the whole answer or streams it, as render.c renders it. Caller:
 * routes.c's dispatch, on the request's connection thread.
 *
 * Invariants:
 *  - A request is submitted only after it counted itself in srv->n_jobs while
 *    srv->shutting_down was clear (under srv->mu); after submitting it re-reads cancel_all,
 *    so ps_server_destroy's pe_sched_cancel_all never misses one.
 *  - Every wait is timed (WAIT_MS) and re-checks whether the client closed its socket and
 *    whether the server is stopping; either ends the response (the request-completed
 *    callback then cancels the job).
 *  - Stop strings cancel the request; the answer still waits for the final callback (one
 *    step at most), so usage (cached tokens) is exact.
 *  - What a request can make the server allocate before admission is bounded: the body
 *    (--max-body), its JSON (at most PS_MAX_VALUES(n_ctx) values, api.h), the parsed
 *    copies and the rendered chat prompt (each at most about the body), and the
 *    tokenizer's work, which pe_tokenize_ex bounds by max_tokens = n_ctx - 1 (at most
 *    pe_vocab_max_token_bytes x that many bytes are tokenized). A 16 MB prompt is refused
 *    with 413 in milliseconds (it was tokenized twice: 16 s of CPU, +512 MB RSS).
 *  - Every submitted request's prompt tokens, and how many of them the prefix cache gave
 *    at first admission, are counted once, at its final callback (on_token), whether it
 *    finished, failed or was cancelled: so cached <= total on /metrics.
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/socket.h>

#include "server_int.h"

/* Retry-After of a 429 (queue full), in seconds. */
#define PS_RETRY_AFTER_S "1"

/* ---- outcome ---- */

/* Counts the outcome in the metrics, once per request (the completed callback records
 * PS_OUT_CANCELLED for a request that had none). */
void ps__record_outcome(conn *k, ps_outcome o)
{
    if (k->outcome_recorded) return;
    k->outcome_recorded = 1;
    uint32_t c = k->stopped ? k->tx.n_tokens : k->usage.completion_tokens;
    ps_metrics_finish(&k->srv->metrics, o, now_s() - k->t0, c);
}

/* Whether the client went away (a half-close is not: see ps__client_gone). */
static int client_gone(conn *k)
{
    return ps__client_gone(k);
}

static int stopping(ps_server *srv)
{
    pthread_mutex_lock(&srv->mu);
    int s = srv->stopping;
    pthread_mutex_unlock(&srv->mu);
    return s;
}

/* ---- answers ---- */

/* Waits for the whole answer of k and queues it (or its error). */
static enum MHD_Result respond_whole(conn *k)
{
    for (;;) {
        int got;
        if (ps__job_drain(k, &got)) break;
        if (got) continue;
        if (client_gone(k) || stopping(k->srv)) return MHD_NO; /* completed: cancels */
        ps__job_wait(k->j);
    }
    ps_outcome o = ps__outcome_of(k);
    ps__record_outcome(k, o);
    if (o == PS_OUT_CANCELLED || o == PS_OUT_ERROR) {
        ps_error e;
        ps__outcome_error(k, o, &e);
        return ps__send_error(k, &e, 0);
    }
    return ps__send_obj(k, 200, ps__whole_json(k));
}

/* MHD's content reader of a streamed answer: hands out k->out, refilling it from the job
 * until the stream is done. */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    conn *k = cls;
    (void)pos;
    for (;;) {
        if (k->out.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (k->out.len > k->out_off) {
            size_t n = k->out.len - k->out_off;
            if (n > max) n = max;
            memcpy(buf, k->out.data + k->out_off, n);
            k->out_off += n;
            if (k->out_off == k->out.len) {
                ps_buf_reset(&k->out);
                k->out_off = 0;
            }
            return (ssize_t)n;
        }
        if (k->stream_done) return MHD_CONTENT_READER_END_OF_STREAM;
        int got;
        if (ps__job_drain(k, &got)) {
            ps_outcome o = ps__outcome_of(k);
            ps__record_outcome(k, o);
            ps__sse_finish(k, o);
            continue;
        }
        const char *text;
        size_t n = ps_textout_take(&k->tx, &text);
        if (n) {
            ps__sse_chunk(k, text, n, NULL, 0, 0);
            continue;
        }
        if (got) continue;
        if (client_gone(k) || stopping(k->srv)) return MHD_CONTENT_READER_END_WITH_ERROR;
        ps__job_wait(k->j);
    }
}

/* ---- the request ---- */

/* 413 for a prompt of n tokens (at_least: n is a lower bound, tokenizing stopped). */
static int too_long(const conn *k, size_t n, int at_least, ps_error *e)
{
    return ps_err(e, 413, k->kind == PS_CHAT ? "messages" : "prompt", "context_length_exceeded",
                  "the prompt has %s%zu tokens; the context holds %u (prompt and output together)",
                  at_least ? "at least " : "", n, k->srv->info.n_ctx);
}

/* Tokenizes the request's prompt (chat: renders the template first) into *toks, once,
 * stopping as soon as it cannot fit the context (pe_tokenize_ex's bound: a 16 MB text is
 * refused without being tokenized). Chat message content is plain text unless the server
 * runs with --parse-special-in-messages: only the template's markers become control
 * tokens. Fills e (a 413 for a prompt of n_ctx tokens or more) and returns -1 on error. */
int ps__build_prompt(conn *k, const ps_req *r, int32_t **toks, size_t *n, ps_error *e)
{
    ps_server *srv = k->srv;
    const pe_vocab *v = pe_model_vocab(srv->m);
    const char *param = r->kind == PS_CHAT ? "messages" : "prompt";
    char *owned = NULL;
    pe_text_span *spans = NULL;
    size_t n_spans = 0;
    const char *text = r->prompt;
    size_t len = r->prompt_len;
    *toks = NULL;
    *n = 0;
    if (r->prompt_toks) {
        *toks = malloc(r->n_prompt_toks * sizeof **toks);
        if (!*toks) return ps_err_status(e, PS_AT_REQUEST, PGD_ENOMEM, NULL);
        memcpy(*toks, r->prompt_toks, r->n_prompt_toks * sizeof **toks);
        *n = r->n_prompt_toks;
        return 0;
    }
    if (r->kind == PS_CHAT) {
        pe_chat_msg *msgs = calloc(r->n_msgs, sizeof *msgs);
        char err[256];
        if (!msgs) return ps_err_status(e, PS_AT_REQUEST, PGD_ENOMEM, NULL);
        for (size_t i = 0; i < r->n_msgs; i++) {
            msgs[i].role = r->msgs[i].role;
            msgs[i].content = r->msgs[i].content;
        }
        int plain = !srv->p.parse_special_in_messages;
        int rc =
            pe_chat_render_spans(srv->chat, msgs, r->n_msgs, &owned, &len, plain ? &spans : NULL,
                                 plain ? &n_spans : NULL, err, sizeof err);
        free(msgs);
        if (rc) return ps_err_status(e, PS_AT_TEMPLATE, rc, err);
        text = owned;
    }
    pe_tokenize_params tp = pe_tokenize_default_params();
    tp.add_special = pe_vocab_add_bos(v);
    tp.parse_special = 1;
    tp.plain = spans;
    tp.n_plain = n_spans;
    tp.max_tokens = srv->info.n_ctx - 1; /* n_ctx >= 2 */
    int64_t cnt = pe_tokenize_ex(v, text, len, &tp, toks);
    free(owned);
    free(spans);
    if (cnt > (int64_t)tp.max_tokens) return too_long(k, (size_t)cnt, 1, e);
    if (cnt == PGD_ENOMEM) return ps_err_status(e, PS_AT_REQUEST, PGD_ENOMEM, NULL);
    if (cnt < 0) return ps_err(e, 400, param, NULL, "cannot tokenize '%s'", param);
    if (cnt == 0) return ps_err(e, 400, param, NULL, "'%s' is empty", param);
    *n = (size_t)cnt;
    return 0;
}

/* ---- retention (api.h "Retention") ---- */

int ps__pin_share_error(ps_server *srv, uint64_t n_new, const char *param, ps_error *e)
{
    pgd_cache_stats cs;
    pgd_tenant_stats ts;
    uint64_t pinned = 0;
    double share = pe_ctx_params_get(srv->ctx)->pin_share;
    pgd_cache_get_stats(srv->cache, &cs);
    for (uint32_t i = 0, n = pgd_cache_n_tenants(srv->cache); i < n; i++)
        if (pgd_cache_get_tenant_stats(srv->cache, i, &ts) == PGD_OK) pinned += ts.pages_pinned;
    if (share <= 0) share = 0.5; /* pgd_cache_params.pin_share's default */
    return ps_err(e, 400, param, "pin_share_exceeded",
                  "pinned blocks would exceed the pin share (%llu of %llu pages); unpin some "
                  "(POST /v1/cache/unpin) or raise --pin-share",
                  (unsigned long long)(pinned + n_new),
                  (unsigned long long)(share * cs.n_pages_total));
}

/* Tells the cache what r asked to keep of its prompt of n tokens: a pin is checked against
 * the pin share now (a sequence of the tenant reserves the prompt's pages, as the
 * scheduler's does at admission, then lets them go), so a request over it gets its 400
 * before it is queued. A next-use hint goes with the retention: the cache registers the
 * sequence's chain as a hint when it releases it (due next_use_s after the request ended;
 * warmed hint_lead_ms before, the stepping thread runs the hints). k->ret gets the retention
 * that goes with the request (rp->retention points to it, or NULL for the default).
 * Returns 0 or -1 with *e. */
static int set_retention(conn *k, const ps_req *r, size_t n, pe_request_params *rp, ps_error *e)
{
    ps_server *srv = k->srv;
    pgd_cache *c = srv->cache;
    uint32_t pt = pgd_cache_page_tokens(c);
    int any = ps_req_retention(r, &k->ret);
    if (!srv->p.prefix_cache) { /* nothing is kept at all */
        memset(&k->ret, 0, sizeof k->ret);
        k->ret.priority = PGD_PRIORITY_DEFAULT;
    }
    if (!any || !srv->p.prefix_cache) return 0;
    rp->retention = &k->ret;
    if (k->ret.pin) {
        pgd_seq *s = NULL;
        int rc = pgd_seq_create(c, r->salt, r->salt_len, &s);
        if (rc == PGD_OK) {
            rc = pgd_seq_set_retention(c, s, &k->ret, n);
            pgd_seq_destroy(c, s);
        } else if (rc == PGD_EBUSY) {
            rc = PGD_OK; /* no sequence to spare now: admission checks it */
        }
        if (rc == PGD_ENOSPC) return ps__pin_share_error(srv, (n + pt - 1) / pt, "pagoda.pin", e);
        if (rc) return ps_err_status(e, PS_AT_REQUEST, rc, NULL);
    }
    return 0;
}

/* The scheduler's callback for a generation (ud: its job): counts the request's prompt
 * tokens in the metrics at its final call, which every submitted request gets exactly
 * once (finished, failed or cancelled, even before admission), then hands over to the
 * job (handoff.c), which may free it. Stepping thread. */
static void on_token(void *ud, uint64_t id, int32_t tok, pe_finish why, const pe_usage *u)
{
    job *j = ud;
    if (why != PE_FINISH_NONE) ps_metrics_prompt(&j->srv->metrics, u);
    ps__job_on_token(ud, id, tok, why, u);
}

/* Sends e; a 429 carries Retry-After (RFC 9110 10.2.3), which the OpenAI clients honour
 * before retrying: the queue has room again once a request finishes. */
static enum MHD_Result send_error(conn *k, const ps_error *e)
{
    if (e->status != 429) return ps__send_error(k, e, 0);
    ps_buf b;
    ps_buf_init(&b);
    if (ps_error_json(e, &b) || b.oom) {
        ps_buf_deinit(&b);
        return MHD_NO;
    }
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(b.len, b.data, MHD_RESPMEM_MUST_COPY);
    ps_buf_deinit(&b);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, PS_RETRY_AFTER_S);
    enum MHD_Result ret = MHD_queue_response(k->c, 429, resp);
    MHD_destroy_response(resp);
    ps_metrics_http(&k->srv->metrics, 429);
    return ret;
}

enum MHD_Result ps__handle_generate(conn *k)
{
    ps_server *srv = k->srv;
    ps_req r;
    ps_error e;
    int32_t *toks = NULL;
    size_t n = 0;
    enum MHD_Result ret;

    k->kind = k->rt == R_CHAT ? PS_CHAT : PS_COMPLETION;
    k->ret.priority = PGD_PRIORITY_DEFAULT;
    if (ps_req_parse(k->kind, k->body.data ? k->body.data : "", k->body.len,
                     pe_model_hparams(srv->m)->n_vocab, srv->info.n_ctx, &r, &e))
        return ps__send_error(k, &e, 0);
    if (r.model && !model_ok(srv, r.model)) {
        ps_err(&e, 404, "model", "model_not_found",
               "the model '%s' does not exist; this server serves '%s'", r.model, srv->model_id);
        goto error;
    }
    if (ps__build_prompt(k, &r, &toks, &n, &e)) goto error;
    if (n >= srv->info.n_ctx) {
        too_long(k, n, 0, &e);
        goto error;
    }

    const char *stops[PS_MAX_STOPS];
    size_t n_stops = 0;
    for (size_t i = 0; i < r.n_stop; i++)
        stops[n_stops++] = r.stop[i];
    for (size_t i = 0; k->kind == PS_CHAT && i < srv->n_chat_stops; i++)
        stops[n_stops++] = srv->chat_stops[i];
    if (ps_textout_init(&k->tx, pe_model_vocab(srv->m), stops, n_stops)) {
        ps_err_status(&e, PS_AT_REQUEST, PGD_ENOMEM, NULL);
        goto error;
    }
    k->tx_init = 1;
    if (k->kind != PS_CHAT) ps_textout_continue(&k->tx, toks, n);
    k->stream = r.stream;
    k->include_usage = r.stream && r.include_usage;

    pe_request_params rp = pe_request_default_params();
    rp.max_tokens = (uint32_t)r.max_tokens;
    if (!r.max_tokens) rp.max_tokens = k->kind == PS_CHAT ? 0 : DEFAULT_COMPLETION_TOKENS;
    rp.sampler = pe_sampler_default_params();
    rp.sampler.temp = (float)r.temperature;
    rp.sampler.top_p = (float)r.top_p;
    rp.sampler.top_k = (int32_t)r.top_k;
    rp.sampler.min_p = (float)r.min_p;
    rp.sampler.repeat_penalty = 1.0f;
    rp.sampler.seed = r.has_seed ? r.seed : ps__next_random(srv);
    rp.salt = r.salt;
    rp.salt_len = r.salt_len;
    rp.stop_on_eog = !r.ignore_eos;
    /* The request's token budget (api.h "Token budgets"), copied by pe_sched_submit. */
    pgd_budget_params budget;
    int has_budget = ps_req_budget(&r, &pe_ctx_params_get(srv->ctx)->budget,
                                   pe_model_hparams(srv->m)->n_layer, &budget, &e);
    if (has_budget < 0) goto error;
    if (has_budget && budget.method != PGD_BUDGET_NONE &&
        pgd_cache_window(pe_ctx_cache(srv->ctx))) {
        ps_err(&e, 400, "pagoda.kv_budget", NULL,
               "'pagoda.kv_budget': this model's sliding-window layers keep only their window's "
               "pages, which token budgets cannot compact (serve it with --kv-window-dense to "
               "use budgets)");
        goto error;
    }
    if (has_budget) rp.budget = &budget;
    if (set_retention(k, &r, n, &rp, &e)) goto error;

    job *j = ps__job_create(srv);
    if (!j) {
        ps_err_status(&e, PS_AT_REQUEST, PGD_ENOMEM, NULL);
        goto error;
    }
    j->t_arrival = k->t0;
    pthread_mutex_lock(&srv->mu);
    int refused = srv->shutting_down;
    if (!refused) srv->n_jobs++;
    pthread_mutex_unlock(&srv->mu);
    if (refused) {
        ps__job_discard(j);
        ps_err_status(&e, PS_AT_SHUTDOWN, PGD_ESTATE, NULL);
        goto error;
    }
    uint64_t id = 0;
    int rc = pe_sched_submit(srv->sched, &rp, toks, n, on_token, j, &id);
    pthread_mutex_lock(&srv->mu);
    if (rc) {
        srv->n_jobs--;
        pthread_cond_broadcast(&srv->idle_cv);
    } else {
        pthread_cond_signal(&srv->work_cv);
    }
    int cancel_now = srv->cancel_all;
    pthread_mutex_unlock(&srv->mu);
    if (rc) {
        ps__job_discard(j);
        ps_err_status(&e, PS_AT_SUBMIT, rc, NULL);
        goto error;
    }
    if (cancel_now) pe_sched_cancel(srv->sched, id);
    k->j = j;
    k->id = id;
    free(toks);
    ps_req_deinit(&r);

    if (!k->stream) return respond_whole(k);

    if (k->kind == PS_CHAT) ps__sse_chunk(k, "", 0, NULL, 1, 0);
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_reader, k, NULL);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    ret = MHD_queue_response(k->c, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    ps_metrics_http(&srv->metrics, 200);
    return ret;

error:
    free(toks);
    ps_req_deinit(&r);
    return send_error(k, &e);
}
