/* SPDX-License-Identifier: MIT */
/*
 * routes.c - libmicrohttpd's side: the access handler (reads the body, refuses oversized
 * ones unread), dispatch by route (auth, method, size checks), GET /health, /v1/models[/ID]
 * and /metrics, queueing a response, and the request-completed callback that cancels an
 * unfinished generation. Generations go to generate.c. Callers: libmicrohttpd (registered
 * by server.c), on the request's connection thread.
 *
 * Invariants:
 *  - A conn lives from its request's first access-handler call to its completed callback
 *    and is touched only by that connection's thread.
 *  - srv->n_http counts the conns (under srv->mu; idle_cv is broadcast when it drops), so
 *    ps_server_wait_idle knows when every request has completed.
 *  - The completed callback cancels a job that is not done before it drops the conn's
 *    reference: a client that went away frees its pages at once.
 *  - Every response goes through ps__queue (or generate.c's stream), which counts it in
 *    the metrics by status.
 */
#define _GNU_SOURCE /* POLLRDHUP */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include "server_int.h"

/* ---- responses ---- */

/* Whether route rt takes POST only: the generations and the admin API's changes. */
static int route_posts(route rt)
{
    return rt == R_COMPLETIONS || rt == R_CHAT || rt == R_CACHE_PIN || rt == R_CACHE_UNPIN ||
           rt == R_CACHE_PREFETCH || rt == R_CACHE_EVICT;
}

enum MHD_Result ps__queue(conn *k, int status, const char *ctype, const char *data, size_t n,
                          int close_conn)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(n, (void *)data, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (status == 405) {
        const char *allow = k->rt == R_CACHE_STATS ? "GET, HEAD, POST"
                            : route_posts(k->rt)   ? "POST"
                                                   : "GET, HEAD";
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    }
    if (status == 401) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (close_conn) MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ret = MHD_queue_response(k->c, (unsigned)status, r);
    MHD_destroy_response(r);
    ps_metrics_http(&k->srv->metrics, status);
    return ret;
}

enum MHD_Result ps__send_json(conn *k, int status, const ps_buf *b)
{
    if (b->oom || !b->data) return MHD_NO;
    return ps__queue(k, status, "application/json", b->data, b->len, 0);
}

enum MHD_Result ps__send_obj(conn *k, int status, json_t *o)
{
    ps_buf b;
    ps_buf_init(&b);
    ps__put_json(&b, o);
    enum MHD_Result r = ps__send_json(k, status, &b);
    ps_buf_deinit(&b);
    return r;
}

enum MHD_Result ps__send_error(conn *k, const ps_error *e, int close_conn)
{
    ps_buf b;
    ps_buf_init(&b);
    if (ps_error_json(e, &b) || b.oom) {
        ps_buf_deinit(&b);
        return MHD_NO;
    }
    enum MHD_Result r = ps__queue(k, e->status, "application/json", b.data, b.len, close_conn);
    ps_buf_deinit(&b);
    return r;
}

/* 413 for a body over --max-body; the connection closes (the rest is not read). */
static enum MHD_Result send_too_big(conn *k)
{
    ps_error e;
    ps_err(&e, 413, NULL, "request_too_large", "the body is larger than %llu bytes",
           (unsigned long long)k->srv->p.max_body_bytes);
    return ps__send_error(k, &e, 1);
}

/* ---- routes other than generation ---- */

static enum MHD_Result handle_models(conn *k)
{
    ps_server *srv = k->srv;
    /* "pagoda": what a client (pagoda bench) needs to build token prompts and size work. */
    json_t *m = json_pack("{s:s,s:s,s:I,s:s,s:I,s:{s:I,s:I,s:I,s:s}}", "id", srv->model_id,
                          "object", "model", "created", (json_int_t)srv->t_start, "owned_by",
                          "pagoda", "max_model_len", (json_int_t)srv->info.n_ctx, "pagoda",
                          "n_vocab", (json_int_t)pe_model_hparams(srv->m)->n_vocab, "n_ctx",
                          (json_int_t)srv->info.n_ctx, "page_tokens",
                          (json_int_t)srv->info.page_tokens, "kv_type", srv->kv_type_name);
    if (!m) return MHD_NO;
    json_t *o;
    if (k->rt == R_MODEL_ONE) {
        const char *name = k->url + strlen("/v1/models/");
        if (!model_ok(srv, name)) {
            json_decref(m);
            ps_error e;
            ps_err(&e, 404, "model", "model_not_found", "the model '%s' does not exist", name);
            return ps__send_error(k, &e, 0);
        }
        o = m;
    } else {
        o = json_pack("{s:s,s:[o]}", "object", "list", "data", m);
    }
    return ps__send_obj(k, 200, o);
}

static enum MHD_Result handle_metrics(conn *k)
{
    ps_buf b;
    ps_buf_init(&b);
    ps_metrics_render(&k->srv->metrics, &k->srv->info, k->srv->sched, k->srv->cache, &b);
    enum MHD_Result r =
        b.oom ? MHD_NO
              : ps__queue(k, 200, "text/plain; version=0.0.4; charset=utf-8", b.data, b.len, 0);
    ps_buf_deinit(&b);
    return r;
}

static route route_of(const char *url)
{
    if (strcmp(url, "/v1/completions") == 0) return R_COMPLETIONS;
    if (strcmp(url, "/v1/chat/completions") == 0) return R_CHAT;
    if (strcmp(url, "/v1/models") == 0) return R_MODELS;
    if (strncmp(url, "/v1/models/", 11) == 0 && url[11]) return R_MODEL_ONE;
    if (strcmp(url, "/health") == 0) return R_HEALTH;
    if (strcmp(url, "/metrics") == 0) return R_METRICS;
    if (strcmp(url, "/v1/cache/pin") == 0) return R_CACHE_PIN;
    if (strcmp(url, "/v1/cache/unpin") == 0) return R_CACHE_UNPIN;
    if (strcmp(url, "/v1/cache/prefetch") == 0) return R_CACHE_PREFETCH;
    if (strcmp(url, "/v1/cache/evict") == 0) return R_CACHE_EVICT;
    if (strcmp(url, "/v1/cache/stats") == 0) return R_CACHE_STATS;
    return R_UNKNOWN;
}

/* Constant-time comparison of the bearer token, so timing does not reveal the key. */
static int auth_ok(conn *k)
{
    const char *key = k->srv->api_key;
    if (!key) return 1;
    const char *h = MHD_lookup_connection_value(k->c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return 0;
    h += 7;
    size_t a = strlen(h), b = strlen(key);
    unsigned diff = (unsigned)(a ^ b);
    for (size_t i = 0; i < a; i++)
        diff |= (unsigned)(unsigned char)h[i] ^ (unsigned)(unsigned char)key[i % (b ? b : 1)];
    return diff == 0;
}

struct hcount {
    const char *name;
    int n;
};

/* Counts the headers named h->name (cls), case-insensitively. */
static enum MHD_Result count_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                    const char *value)
{
    struct hcount *h = cls;
    (void)kind;
    (void)value;
    if (key && strcasecmp(key, h->name) == 0) h->n++;
    return MHD_YES;
}

static int n_headers(struct MHD_Connection *c, const char *name)
{
    struct hcount h = {name, 0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_header, &h);
    return h.n;
}

/* What the headers alone decide, before any byte of the body is read: framing that a proxy
 * could read another way (request smuggling), the route, the API key, the method, the
 * shutdown. Returns 1 after queueing the refusal (the connection closes: its body, if any,
 * is never read), 0 when the request may go on. */
static int refuse_on_headers(conn *k, const char *method, const char *version, enum MHD_Result *ret)
{
    ps_server *srv = k->srv;
    ps_error e;
    int is_post = strcmp(method, "POST") == 0;
    int is_get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    int n_cl = n_headers(k->c, MHD_HTTP_HEADER_CONTENT_LENGTH);
    int n_te = n_headers(k->c, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    const char *cl =
        MHD_lookup_connection_value(k->c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    /* A refusal with a body on its way closes the connection: the body is never read. */
    int close_conn = n_te || (cl && strtoull(cl, NULL, 10) > 0);

    if (n_cl > 1) {
        close_conn = 1;
        ps_err(&e, 400, NULL, "invalid_request", "more than one Content-Length header");
    } else if (n_cl && n_te) {
        close_conn = 1;
        ps_err(&e, 400, NULL, "invalid_request",
               "both Content-Length and Transfer-Encoding headers");
    } else if (strcmp(version, MHD_HTTP_VERSION_1_0) != 0 &&
               n_headers(k->c, MHD_HTTP_HEADER_HOST) != 1) {
        close_conn = 1;
        ps_err(&e, 400, NULL, "invalid_request", "an HTTP/1.1 request needs one Host header");
    } else if (k->rt == R_UNKNOWN) {
        ps_err(&e, 404, NULL, "not_found", "no route %s %s", method, k->url);
    } else if (strncmp(k->url, "/v1/", 4) == 0 && !auth_ok(k)) {
        ps_err(&e, 401, NULL, "invalid_api_key",
               "missing or wrong API key: send 'Authorization: Bearer KEY'");
    } else if (k->rt == R_CACHE_STATS ? !is_get && !is_post
               : route_posts(k->rt)   ? !is_post
                                      : !is_get) {
        int want_post = route_posts(k->rt);
        ps_err(&e, 405, NULL, "method_not_allowed", "%s %s: use %s", method, k->url,
               k->rt == R_CACHE_STATS ? "GET or POST"
               : want_post            ? "POST"
                                      : "GET");
    } else {
        /* While shutting down, a new generation (or /health) gets 503 at once, its body
         * unread, also on a connection opened before: none waits for a server that is
         * going. /metrics and /v1/models still answer. */
        pthread_mutex_lock(&srv->mu);
        int down = srv->shutting_down;
        pthread_mutex_unlock(&srv->mu);
        if (!down || !(k->rt == R_COMPLETIONS || k->rt == R_CHAT || k->rt == R_HEALTH)) return 0;
        close_conn = 1;
        ps_err_status(&e, PS_AT_SHUTDOWN, PGD_ESTATE, NULL);
    }
    k->refused = 1;
    *ret = ps__send_error(k, &e, close_conn);
    return 1;
}

static enum MHD_Result dispatch(conn *k)
{
    ps_server *srv = k->srv;
    ps_error e;

    if (k->too_big) return send_too_big(k);
    if (k->rt == R_COMPLETIONS || k->rt == R_CHAT) {
        /* A generation may run for minutes between two writes (a long prefill, a
         * non-streamed answer): no idle timeout while it is handled (its own loops watch
         * the client and the shutdown); ps__on_completed turns it back on. */
        if (srv->p.idle_timeout_s &&
            MHD_set_connection_option(k->c, MHD_CONNECTION_OPTION_TIMEOUT, 0u) == MHD_YES)
            k->no_timeout = 1;
    }
    switch (k->rt) {
    case R_HEALTH: {
        pthread_mutex_lock(&srv->mu);
        int down = srv->shutting_down;
        pthread_mutex_unlock(&srv->mu);
        if (down) {
            ps_err_status(&e, PS_AT_SHUTDOWN, PGD_ESTATE, NULL);
            return ps__send_error(k, &e, 0);
        }
        static const char ok[] = "{\"status\":\"ok\"}";
        return ps__queue(k, 200, "application/json", ok, sizeof ok - 1, 0);
    }
    case R_METRICS:
        return handle_metrics(k);
    case R_MODELS:
    case R_MODEL_ONE:
        return handle_models(k);
    case R_CACHE_PIN:
    case R_CACHE_UNPIN:
    case R_CACHE_PREFETCH:
    case R_CACHE_EVICT:
    case R_CACHE_STATS:
        return ps__handle_cache(k);
    default:
        return ps__handle_generate(k);
    }
}

/* ---- the client's socket ---- */

int ps__client_gone(conn *k)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(k->c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    MHD_socket fd = ci->connect_fd;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return 1; /* reset, or shut both ways */
    char b;
    ssize_t r = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (r > 0) return 0; /* a pipelined request */
    if (r < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
    /* End of input: a disconnect, or a half-close (the client shut down its write side
     * and still reads; `nc -N` does). Only a write tells them apart: a closed socket
     * answers data with a reset. A stream writes anyway; before a whole answer, an
     * interim "100 Continue" (HTTP/1.1 clients must accept 1xx) is the probe. HTTP/1.0
     * clients get none and always get their answer. */
    if (k->stream || k->eof_probed) return 0;
    k->eof_probed = 1;
    if (k->http10) return 0;
    static const char probe[] = "HTTP/1.1 100 Continue\r\n\r\n";
    ssize_t w = send(fd, probe, sizeof probe - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    return w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

/* ---- libmicrohttpd callbacks ---- */

static void conn_destroy(conn *k)
{
    ps_buf_deinit(&k->body);
    ps_buf_deinit(&k->out);
    if (k->tx_init) ps_textout_deinit(&k->tx);
    free(k->scratch);
    free(k);
}

enum MHD_Result ps__on_request(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version, const char *upload_data,
                               size_t *upload_data_size, void **con_cls)
{
    ps_server *srv = cls;
    conn *k = *con_cls;
    if (!k) {
        k = calloc(1, sizeof *k);
        if (!k) return MHD_NO;
        k->srv = srv;
        k->c = c;
        k->t0 = now_s();
        k->rt = route_of(url);
        snprintf(k->url, sizeof k->url, "%s", url);
        k->http10 = strcmp(version, MHD_HTTP_VERSION_1_1) != 0;
        k->created = (long long)time(NULL);
        snprintf(k->rid, sizeof k->rid, "%s-%016llx", route_of(url) == R_CHAT ? "chatcmpl" : "cmpl",
                 (unsigned long long)ps__next_random(srv));
        ps_buf_init(&k->body);
        ps_buf_init(&k->out);
        *con_cls = k;
        pthread_mutex_lock(&srv->mu);
        srv->n_http++;
        pthread_mutex_unlock(&srv->mu);
        ps_metrics_http_active(&srv->metrics, 1);
        ps__sock_phase(srv, c, SOCK_BODY);
        enum MHD_Result ret;
        if (refuse_on_headers(k, method, version, &ret)) return ret;
        /* Refuse an announced oversized body before reading any of it. */
        const char *cl =
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > srv->p.max_body_bytes) {
            k->too_big = 1;
            return send_too_big(k);
        }
        return MHD_YES;
    }
    if (k->refused) {
        *upload_data_size = 0; /* answered on the headers: drop what arrives */
        return MHD_YES;
    }
    if (*upload_data_size) {
        ps__sock_body(srv, c, *upload_data_size);
        if (!k->too_big && k->body.len + *upload_data_size > srv->p.max_body_bytes) {
            k->too_big = 1; /* a chunked body that grew too large: read and drop the rest */
            ps_buf_deinit(&k->body);
        }
        if (!k->too_big && ps_buf_add(&k->body, upload_data, *upload_data_size)) return MHD_NO;
        *upload_data_size = 0;
        return MHD_YES;
    }
    ps__sock_phase(srv, c, SOCK_HANDLING);
    return dispatch(k);
}

void ps__on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe)
{
    ps_server *srv = cls;
    conn *k = *con_cls;
    if (!k) return;
    *con_cls = NULL;
    ps__sock_phase(srv, c, SOCK_HEADERS);
    /* Idle again (keep-alive): the idle timeout applies, counted from now. */
    if (k->no_timeout && toe == MHD_REQUEST_TERMINATED_COMPLETED_OK)
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, srv->p.idle_timeout_s);
    if (k->j) {
        /* The client went away (or the server stops) before the end: free its pages now. */
        if (!ps__job_done(k->j)) pe_sched_cancel(srv->sched, k->id);
        ps__record_outcome(k, PS_OUT_CANCELLED);
        ps__job_unref(k->j);
    }
    conn_destroy(k);
    ps_metrics_http_active(&srv->metrics, -1);
    pthread_mutex_lock(&srv->mu);
    srv->n_http--;
    pthread_cond_broadcast(&srv->idle_cv);
    pthread_mutex_unlock(&srv->mu);
}
