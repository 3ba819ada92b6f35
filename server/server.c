/* SPDX-License-Identifier: MIT */
/*
 * server.c - the server's lifecycle (see server.h): start (chat setup, bind, the MHD
 * daemon, the stepping thread, the connection guard), the shutdown stages and destroy.
 * Caller: tools/serve.c.
 * The request path is in routes.c, generate.c, render.c; the token handoff in handoff.c;
 * the stepping thread in step.c (server_int.h maps them).
 *
 * Invariants:
 *  - srv->mu guards n_jobs, n_http and the shutdown flags (shutting_down, cancel_all,
 *    stopping, stop_stepper) and the random counter.
 *  - srv->sock_mu (a leaf) guards the list of socks (one per TCP connection, from MHD's
 *    STARTED to its CLOSED notification) and the guard's stop flag. The guard shuts a
 *    socket down only under sock_mu while its sock is listed, and CLOSED comes before
 *    libmicrohttpd closes the descriptor, so a reused descriptor is never touched.
 *  - Shutdown runs in this order, each stage named for the watchdog (g_stage): refuse new
 *    requests with 503 (the listening socket stays open, so none hangs in the backlog);
 *    wait for requests in flight (the caller's ps_server_wait_idle); cancel every job,
 *    wait for every final callback, and give the requests left STREAMS_END_S to write
 *    their ends (a stream's error event and [DONE]) before `stopping` is set; close every
 *    connection and the listening socket and join their threads (MHD_stop_daemon); stop
 *    the guard and the stepping thread. So no callback ever runs on a freed server.
 */
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server_int.h"

/* ---- shutdown stage (for the watchdog's message) ---- */

static const char *g_stage = "serving";

static void set_stage(const char *what)
{
    __atomic_store_n(&g_stage, what, __ATOMIC_RELEASE);
}

const char *ps_server_shutdown_stage(void)
{
    return __atomic_load_n(&g_stage, __ATOMIC_ACQUIRE);
}

/* ---- small helpers ---- */

static uint64_t mix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

uint64_t ps__next_random(ps_server *srv)
{
    pthread_mutex_lock(&srv->mu);
    uint64_t c = ++srv->counter;
    pthread_mutex_unlock(&srv->mu);
    return mix64(c ^ ((uint64_t)srv->t_start << 20) ^ (uint64_t)(uintptr_t)srv);
}

static char *dup_s(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    fputs("pagoda serve: http: ", stderr);
    vfprintf(stderr, fmt, ap);
}

/* ---- the connection guard ---- */

/* MHD's connection notification: a sock per TCP connection, listed for the guard. The
 * CLOSED call comes before libmicrohttpd closes the socket, and the guard shuts a socket
 * down only under sock_mu with the sock still listed, so it never touches a reused fd. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    ps_server *srv = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        sock *k = calloc(1, sizeof *k);
        *socket_context = k;
        if (!k) return; /* not guarded: the idle timeout still applies */
        if (!ci) {
            free(k);
            *socket_context = NULL;
            return;
        }
        k->fd = ci->connect_fd;
        k->t_wait = now_s();
        pthread_mutex_lock(&srv->sock_mu);
        k->next = srv->socks;
        if (srv->socks) srv->socks->prev = k;
        srv->socks = k;
        pthread_mutex_unlock(&srv->sock_mu);
        return;
    }
    sock *k = *socket_context;
    *socket_context = NULL;
    if (!k) return;
    pthread_mutex_lock(&srv->sock_mu);
    if (k->prev)
        k->prev->next = k->next;
    else if (srv->socks == k)
        srv->socks = k->next;
    if (k->next) k->next->prev = k->prev;
    pthread_mutex_unlock(&srv->sock_mu);
    free(k);
}

static sock *sock_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

void ps__sock_phase(ps_server *srv, struct MHD_Connection *c, sock_phase ph)
{
    sock *k = sock_of(c);
    if (!k) return;
    double t = now_s();
    pthread_mutex_lock(&srv->sock_mu);
    if (ph == SOCK_BODY) {
        k->t_body = t;
        k->n_body_bytes = 0;
    } else if (ph == SOCK_HEADERS) {
        k->t_wait = t;
        k->n_requests++;
    }
    k->phase = ph;
    pthread_mutex_unlock(&srv->sock_mu);
}

void ps__sock_body(ps_server *srv, struct MHD_Connection *c, size_t n)
{
    sock *k = sock_of(c);
    if (!k) return;
    pthread_mutex_lock(&srv->sock_mu);
    k->n_body_bytes += n;
    pthread_mutex_unlock(&srv->sock_mu);
}

/* Whether k is too slow at t: its headers took longer than header_timeout_s (counted from
 * accept; on a kept-alive connection the idle timeout comes first), or its body arrives
 * slower than min_body_rate once header_timeout_s has passed. */
static int too_slow(const ps_server *srv, const sock *k, double t)
{
    double ht = (double)srv->p.header_timeout_s;
    if (k->phase == SOCK_HEADERS) {
        if (!ht) return 0;
        if (k->n_requests) {
            if (!srv->p.idle_timeout_s) return 0;
            ht += (double)srv->p.idle_timeout_s;
        }
        return t - k->t_wait > ht;
    }
    if (k->phase == SOCK_BODY && srv->p.min_body_rate) {
        double dt = t - k->t_body;
        return dt > (ht ? ht : 1.0) && (double)k->n_body_bytes < dt * srv->p.min_body_rate;
    }
    return 0;
}

/* The guard thread: every GUARD_MS, shuts down the connections that are too slow (their
 * connection thread then sees the end of input and libmicrohttpd closes them). */
static void *guard_main(void *arg)
{
    ps_server *srv = arg;
    pthread_mutex_lock(&srv->sock_mu);
    while (!srv->stop_guard) {
        struct timespec ts;
        deadline_in(&ts, GUARD_MS * 1e-3);
        pthread_cond_timedwait(&srv->guard_cv, &srv->sock_mu, &ts);
        double t = now_s();
        for (sock *k = srv->socks; k && !srv->stop_guard; k = k->next) {
            if (k->cut || !too_slow(srv, k, t)) continue;
            k->cut = 1;
            shutdown(k->fd, SHUT_RDWR);
        }
    }
    pthread_mutex_unlock(&srv->sock_mu);
    return NULL;
}

/* ---- lifecycle ---- */

ps_server_params ps_server_default_params(void)
{
    ps_server_params p;
    memset(&p, 0, sizeof p);
    p.host = "127.0.0.1";
    p.port = 8080;
    p.max_body_bytes = DEFAULT_MAX_BODY;
    p.chat_family = -1;
    p.prefix_cache = 1;
    p.idle_timeout_s = DEFAULT_IDLE_TIMEOUT_S;
    p.max_connections = DEFAULT_MAX_CONNECTIONS;
    p.max_connections_per_ip = DEFAULT_MAX_CONNECTIONS_PER_IP;
    p.header_timeout_s = DEFAULT_HEADER_TIMEOUT_S;
    p.min_body_rate = DEFAULT_MIN_BODY_RATE;
    p.hint_lead_ms = DEFAULT_HINT_LEAD_MS;
    return p;
}

/* The template's turn-end strings that the tokenizer does not already stop on. */
static int setup_chat(ps_server *srv)
{
    const pe_vocab *v = pe_model_vocab(srv->m);
    if (srv->p.chat_family >= 0) {
        srv->chat = (pe_chat_family)srv->p.chat_family;
    } else {
        pe_gguf_str t;
        char *tmpl = NULL;
        if (pe_gguf_get_str(pe_model_gguf(srv->m), "tokenizer.chat_template", &t) == 0) {
            tmpl = malloc(t.len + 1);
            if (!tmpl) return -1;
            memcpy(tmpl, t.ptr, t.len);
            tmpl[t.len] = '\0';
        }
        srv->chat = pe_chat_detect(tmpl);
        free(tmpl);
    }
    const char *const *cs = pe_chat_stop_strings(srv->chat);
    for (size_t i = 0; cs && cs[i] && srv->n_chat_stops < PS_MAX_STOPS - PS_MAX_USER_STOPS; i++) {
        int32_t tok[2];
        int64_t n = pe_tokenize(v, cs[i], strlen(cs[i]), 0, 1, tok, 2);
        if (n == 1 && pe_vocab_is_eog(v, tok[0])) continue; /* the scheduler stops there */
        srv->chat_stops[srv->n_chat_stops] = dup_s(cs[i]);
        if (!srv->chat_stops[srv->n_chat_stops]) return -1;
        srv->n_chat_stops++;
    }
    return 0;
}

int ps_server_start(const ps_server_params *pp, pe_model *m, pe_ctx *ctx, pe_sched *s,
                    ps_server **out, char *err, size_t errlen)
{
    ps_server_params p = pp ? *pp : ps_server_default_params();
    struct addrinfo hints, *ai = NULL;
    char port_s[16];
    ps_server *srv;

    *out = NULL;
    if (!p.host) p.host = "127.0.0.1";
    if (!p.max_body_bytes) p.max_body_bytes = DEFAULT_MAX_BODY;
    if (!p.model_id) {
        snprintf(err, errlen, "no model id");
        return -1;
    }
    srv = calloc(1, sizeof *srv);
    if (!srv) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    srv->p = p;
    srv->m = m;
    srv->ctx = ctx;
    srv->sched = s;
    srv->cache = pe_ctx_cache(ctx);
    srv->t_start = (long long)time(NULL);
    set_stage("serving");
    pthread_mutex_init(&srv->mu, NULL);
    pthread_cond_init(&srv->work_cv, NULL);
    pthread_cond_init(&srv->idle_cv, NULL);
    pthread_mutex_init(&srv->sock_mu, NULL);
    pthread_cond_init(&srv->guard_cv, NULL);
    ps_metrics_init(&srv->metrics);
    srv->host = dup_s(p.host);
    srv->model_id = dup_s(p.model_id);
    srv->api_key = p.api_key ? dup_s(p.api_key) : NULL;
    if (!srv->host || !srv->model_id || (p.api_key && !srv->api_key) || setup_chat(srv)) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    const pe_ctx_params *cp = pe_ctx_params_get(ctx);
    snprintf(srv->kv_type_name, sizeof srv->kv_type_name, "%s", pgd_kv_type_name(cp->kv_type));
    srv->info.model_id = srv->model_id;
    srv->info.kv_type = srv->kv_type_name;
    srv->info.page_tokens = pgd_cache_page_tokens(srv->cache);
    srv->info.kv_bytes_per_token =
        pgd_kv_bytes_per_token(cp->kv_type, srv->info.page_tokens, pe_model_hparams(m)->n_layer,
                               pe_model_hparams(m)->n_head_kv, pe_model_hparams(m)->head_dim);
    srv->info.n_ctx = cp->n_ctx;
    srv->info.prefix_cache = p.prefix_cache;
    ps_metrics_tier_labels(&srv->info, srv->cache);

    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    snprintf(port_s, sizeof port_s, "%u", (unsigned)p.port);
    int gai = getaddrinfo(p.host, port_s, &hints, &ai);
    if (gai) {
        snprintf(err, errlen, "--host %s: %s", p.host, gai_strerror(gai));
        goto fail;
    }
    /* One thread per connection: a generation's answer blocks its thread while it waits
     * for tokens. What keeps slow or idle clients from holding every connection: a high
     * connection limit (a thread costs stack address space, little memory), the per-IP
     * limit, the idle timeout, and the guard thread (header deadline, body rate). */
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG | MHD_USE_POLL;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    srv->d = MHD_start_daemon(
        flags, p.port, NULL, NULL, ps__on_request, srv, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, srv,
        MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, ps__on_completed, srv,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, srv, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)(p.max_connections ? p.max_connections : DEFAULT_MAX_CONNECTIONS),
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)p.max_connections_per_ip,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)p.idle_timeout_s, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!srv->d) {
        snprintf(err, errlen, "cannot listen on %s port %u: %s", p.host, (unsigned)p.port,
                 errno ? strerror(errno) : "libmicrohttpd refused to start");
        goto fail;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(srv->d, MHD_DAEMON_INFO_BIND_PORT);
    srv->port = di ? di->port : p.port;
    if (pthread_create(&srv->stepper, NULL, ps__step_main, srv)) {
        snprintf(err, errlen, "cannot start the stepping thread");
        goto fail;
    }
    srv->stepper_started = 1;
    if (pthread_create(&srv->guard, NULL, guard_main, srv)) {
        snprintf(err, errlen, "cannot start the connection guard thread");
        goto fail;
    }
    srv->guard_started = 1;
    *out = srv;
    return 0;
fail:
    ps_server_destroy(srv);
    return -1;
}

uint16_t ps_server_port(const ps_server *srv)
{
    return srv->port;
}

pe_chat_family ps_server_chat_family(const ps_server *srv)
{
    return srv->chat;
}

void ps_server_begin_shutdown(ps_server *srv)
{
    pthread_mutex_lock(&srv->mu);
    int was = srv->shutting_down;
    srv->shutting_down = 1;
    pthread_mutex_unlock(&srv->mu);
    if (was || !srv->d) return;
    /* The listening socket stays open: a new request gets 503 at once (routes.c) rather
     * than waiting in the kernel's backlog for an accept that never comes. It closes with
     * MHD_stop_daemon (connections are then refused). */
    set_stage("finishing requests in flight");
}

int ps_server_wait_idle(ps_server *srv, double timeout_s)
{
    struct timespec ts;
    deadline_in(&ts, timeout_s);
    pthread_mutex_lock(&srv->mu);
    while (srv->n_http && pthread_cond_timedwait(&srv->idle_cv, &srv->mu, &ts) != ETIMEDOUT) {
    }
    int idle = srv->n_http == 0;
    pthread_mutex_unlock(&srv->mu);
    return idle;
}

void ps_server_destroy(ps_server *srv)
{
    if (!srv) return;
    ps_server_begin_shutdown(srv);
    pthread_mutex_lock(&srv->mu);
    srv->cancel_all = 1;
    pthread_mutex_unlock(&srv->mu);
    if (srv->stepper_started) {
        /* Every job gets its final callback from the stepping thread, then it stops. */
        set_stage("cancelling requests");
        pe_sched_cancel_all(srv->sched);
        pthread_mutex_lock(&srv->mu);
        while (srv->n_jobs)
            pthread_cond_wait(&srv->idle_cv, &srv->mu);
        pthread_mutex_unlock(&srv->mu);
        /* Every request in flight now has its final callback: within WAIT_MS it writes
         * its error (a stream: the error event and [DONE]) and completes. Give them that
         * time, bounded (a client that does not read cannot hold the shutdown). */
        set_stage("ending streams");
        ps_server_wait_idle(srv, STREAMS_END_S);
    }
    pthread_mutex_lock(&srv->mu);
    srv->stopping = 1;
    pthread_mutex_unlock(&srv->mu);
    /* Closes every connection, idle keep-alive ones included (shutdown() wakes their
     * threads), and joins their threads: requests still in flight see `stopping` within
     * WAIT_MS and return. */
    set_stage("closing connections");
    if (srv->d) MHD_stop_daemon(srv->d);
    if (srv->guard_started) {
        pthread_mutex_lock(&srv->sock_mu);
        srv->stop_guard = 1;
        pthread_cond_signal(&srv->guard_cv);
        pthread_mutex_unlock(&srv->sock_mu);
        pthread_join(srv->guard, NULL);
    }
    set_stage("stopping the stepping thread");
    if (srv->stepper_started) {
        pthread_mutex_lock(&srv->mu);
        srv->stop_stepper = 1;
        pthread_cond_signal(&srv->work_cv);
        pthread_mutex_unlock(&srv->mu);
        pthread_join(srv->stepper, NULL);
    }
    for (size_t i = 0; i < srv->n_chat_stops; i++)
        free(srv->chat_stops[i]);
    ps_metrics_deinit(&srv->metrics);
    pthread_cond_destroy(&srv->guard_cv);
    pthread_mutex_destroy(&srv->sock_mu);
    pthread_cond_destroy(&srv->idle_cv);
    pthread_cond_destroy(&srv->work_cv);
    pthread_mutex_destroy(&srv->mu);
    free(srv->host);
    free(srv->model_id);
    free(srv->api_key);
    free(srv);
    set_stage("stopped");
}
