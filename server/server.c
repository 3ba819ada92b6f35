/* SPDX-License-Identifier: MIT */
/*
 * server.c - HTTP routes, request lifecycle and the stepping thread (see server.h).
 *
 * Objects and who holds them:
 *
 *   conn  one HTTP request (MHD's per-request pointer). Created at its first access-handler
 *         call, freed by the request-completed callback. Touched only by its connection's
 *         thread (MHD runs one thread per connection), so it needs no lock.
 *   job   one submitted generation: the queue of tokens the stepping thread produced and
 *         not yet taken, the final reason and usage. Shared by the conn and the scheduler,
 *         so it has a mutex, a condition variable and two references; the scheduler's is
 *         dropped by the final callback, the conn's when the request completes.
 *
 * Invariants:
 *  - srv->mu guards n_jobs (submitted, final callback pending), n_http (requests between
 *    their first call and completion) and the shutdown flags. A request is submitted only
 *    after it counted itself in n_jobs while shutting_down was clear; after submitting it
 *    re-reads cancel_all, so ps_server_destroy's pe_sched_cancel_all never misses one.
 *  - A request whose job is not done when it completes (the client went away, or the
 *    server is stopping) is cancelled at once: its pages return to the pool before the
 *    completed callback returns, or right after the in-flight step.
 *  - Stop strings cancel the request too; the response waits for the final callback
 *    (one step at most) so that usage (cached tokens) is always exact.
 *  - Waits on a job are timed (WAIT_MS) and re-check whether the client socket closed
 *    and whether the server is stopping, so no thread sleeps through either.
 */
#include "server.h"

#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <microhttpd.h>

#include "api.h"
#include "buf.h"
#include "metrics.h"
#include "textout.h"

#define WAIT_MS 50
#define DEFAULT_MAX_BODY (16u << 20)
#define DEFAULT_IDLE_TIMEOUT_S 60u
#define DEFAULT_COMPLETION_TOKENS 16 /* OpenAI's default max_tokens for /v1/completions */

typedef enum route {
    R_UNKNOWN = 0,
    R_COMPLETIONS,
    R_CHAT,
    R_MODELS,
    R_MODEL_ONE,
    R_HEALTH,
    R_METRICS
} route;

typedef struct job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;      /* conn + scheduler; mu */
    int32_t *toks; /* [cap] tokens produced and not yet taken; mu */
    size_t n_toks, cap;
    int oom;          /* a token could not be queued; mu */
    int done;         /* the final callback came; mu */
    pe_finish finish; /* mu */
    pe_usage usage;   /* mu */
    ps_server *srv;
    double t_arrival; /* set before submit; read by the stepping thread */
    double t_last;    /* stepping thread only */
    uint32_t n_seen;  /* stepping thread only */
} job;

typedef struct conn {
    ps_server *srv;
    struct MHD_Connection *c;
    route rt;
    char url[256];
    double t0;
    ps_buf body;
    int too_big;
    /* a generation */
    job *j;
    uint64_t id;
    ps_kind kind;
    int stream, include_usage;
    ps_textout tx;
    int tx_init;
    int stopped;    /* a stop string matched; the request was cancelled */
    int no_timeout; /* the idle timeout is off while this request is handled */
    int have_final; /* the final callback's reason and usage are in fin / usage */
    pe_finish fin;
    pe_usage usage;
    int job_oom;
    int32_t *scratch; /* [scratch_cap] tokens taken from the job */
    size_t scratch_cap;
    ps_buf out; /* SSE bytes not yet handed to MHD */
    size_t out_off;
    int stream_done;
    int outcome_recorded;
    char rid[48];
    long long created;
} conn;

struct ps_server {
    ps_server_params p;
    char *host, *model_id, *api_key;
    pe_model *m;
    pe_ctx *ctx;
    pe_sched *sched;
    pgd_cache *cache;
    struct MHD_Daemon *d;
    MHD_socket listen_fd; /* from MHD_quiesce_daemon; closed after MHD_stop_daemon */
    uint16_t port;
    pe_chat_family chat;
    char *chat_stops[PS_MAX_STOPS - PS_MAX_USER_STOPS];
    size_t n_chat_stops;
    ps_metrics metrics;
    ps_metrics_info info;
    char kv_type_name[16];
    pthread_mutex_t mu;
    pthread_cond_t work_cv, idle_cv;
    uint64_t n_jobs, n_http;
    int shutting_down, cancel_all, stopping, stop_stepper;
    pthread_t stepper;
    int stepper_started;
    uint64_t counter;
    long long t_start;
};

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

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void deadline_in(struct timespec *ts, double s)
{
    clock_gettime(CLOCK_REALTIME, ts);
    long long ns = (long long)(s * 1e9) + ts->tv_nsec;
    ts->tv_sec += (time_t)(ns / 1000000000);
    ts->tv_nsec = (long)(ns % 1000000000);
}

static uint64_t mix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static uint64_t next_random(ps_server *srv)
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

/* ---- jobs ---- */

static job *job_create(ps_server *srv)
{
    job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 2;
    j->srv = srv;
    return j;
}

static void job_unref(job *j)
{
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left) return;
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j->toks);
    free(j);
}

/* The scheduler's callback, on the stepping thread (see pe_token_cb). */
static void on_token(void *ud, uint64_t id, int32_t tok, pe_finish why, const pe_usage *u)
{
    job *j = ud;
    ps_server *srv = j->srv;
    double t = now_s();
    (void)id;
    if (why == PE_FINISH_NONE) {
        if (j->n_seen++ == 0)
            ps_metrics_observe_ttft(&srv->metrics, t - j->t_arrival);
        else
            ps_metrics_observe_itl(&srv->metrics, t - j->t_last);
        j->t_last = t;
        pthread_mutex_lock(&j->mu);
        if (j->n_toks == j->cap) {
            size_t cap = j->cap ? j->cap * 2 : 64;
            int32_t *nt = realloc(j->toks, cap * sizeof *nt);
            if (nt) {
                j->toks = nt;
                j->cap = cap;
            }
        }
        if (j->n_toks < j->cap)
            j->toks[j->n_toks++] = tok;
        else
            j->oom = 1;
        pthread_cond_signal(&j->cv);
        pthread_mutex_unlock(&j->mu);
        return;
    }
    pthread_mutex_lock(&j->mu);
    j->done = 1;
    j->finish = why;
    j->usage = *u;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
    pthread_mutex_lock(&srv->mu);
    srv->n_jobs--;
    pthread_cond_broadcast(&srv->idle_cv);
    pthread_mutex_unlock(&srv->mu);
    job_unref(j);
}

/* ---- the stepping thread ---- */

static void *stepper_main(void *arg)
{
    ps_server *srv = arg;
    for (;;) {
        pthread_mutex_lock(&srv->mu);
        while (!srv->stop_stepper && !srv->n_jobs)
            pthread_cond_wait(&srv->work_cv, &srv->mu);
        int quit = srv->stop_stepper && !srv->n_jobs;
        pthread_mutex_unlock(&srv->mu);
        if (quit) break;
        int rc = pe_sched_step(srv->sched);
        if (rc < 0) fprintf(stderr, "pagoda serve: forward pass failed: %s\n", pgd_strerror(rc));
        if (rc <= 0) {
            /* Nothing ran. Either final callbacks were delivered (n_jobs drops) or a
             * request waits that cannot be admitted yet: do not spin on it. */
            pe_sched_stats st;
            pe_sched_get_stats(srv->sched, &st);
            if (!st.n_running) {
                struct timespec ts = {0, 1000000};
                nanosleep(&ts, NULL);
            }
        }
    }
    return NULL;
}

/* ---- responses ---- */

static enum MHD_Result queue(conn *k, int status, const char *ctype, const char *data, size_t n,
                             int close_conn)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(n, (void *)data, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (status == 405) {
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW,
                                k->rt == R_COMPLETIONS || k->rt == R_CHAT ? "POST" : "GET, HEAD");
    }
    if (status == 401) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (close_conn) MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ret = MHD_queue_response(k->c, (unsigned)status, r);
    MHD_destroy_response(r);
    ps_metrics_http(&k->srv->metrics, status);
    return ret;
}

static enum MHD_Result send_json(conn *k, int status, const ps_buf *b)
{
    if (b->oom || !b->data) return MHD_NO;
    return queue(k, status, "application/json", b->data, b->len, 0);
}

static enum MHD_Result send_error(conn *k, const ps_error *e, int close_conn)
{
    ps_buf b;
    ps_buf_init(&b);
    if (ps_error_json(e, &b) || b.oom) {
        ps_buf_deinit(&b);
        return MHD_NO;
    }
    enum MHD_Result r = queue(k, e->status, "application/json", b.data, b.len, close_conn);
    ps_buf_deinit(&b);
    return r;
}

/* Dumps o (stolen) compactly into out. Returns 0 or -1. */
static int put_json(ps_buf *out, json_t *o)
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

static json_t *usage_json(const conn *k)
{
    uint32_t p = k->usage.prompt_tokens,
             c = k->stopped ? k->tx.n_tokens : k->usage.completion_tokens;
    return json_pack("{s:I,s:I,s:I,s:{s:I}}", "prompt_tokens", (json_int_t)p, "completion_tokens",
                     (json_int_t)c, "total_tokens", (json_int_t)p + c, "prompt_tokens_details",
                     "cached_tokens", (json_int_t)k->usage.cached_tokens);
}

/* {"id","object","created","model"} of a response or chunk. */
static json_t *base_json(const conn *k, const char *object)
{
    return json_pack("{s:s,s:s,s:I,s:s}", "id", k->rid, "object", object, "created",
                     (json_int_t)k->created, "model", k->srv->model_id);
}

/* The outcome of a finished generation as the client sees it. */
static ps_outcome outcome_of(const conn *k)
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

static void record_outcome(conn *k, ps_outcome o)
{
    if (k->outcome_recorded) return;
    k->outcome_recorded = 1;
    uint32_t c = k->stopped ? k->tx.n_tokens : k->usage.completion_tokens;
    ps_metrics_finish(&k->srv->metrics, o, now_s() - k->t0, k->usage.prompt_tokens, c);
}

/* The error a generation that did not finish normally reports. */
static void outcome_error(const conn *k, ps_outcome o, ps_error *e)
{
    if (o == PS_OUT_CANCELLED)
        ps_err(e, 503, NULL, "shutting_down", "the server is shutting down");
    else if (k->job_oom)
        ps_err(e, 500, NULL, NULL, "out of memory while generating");
    else
        ps_err(e, 500, NULL, NULL,
               "generation failed: the request does not fit the KV pool, or the forward "
               "pass failed (see the server log)");
}

/* ---- taking tokens from a job ---- */

/* Whether the client closed its end of the connection. */
static int client_gone(conn *k)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(k->c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    char b;
    ssize_t r = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (r == 0) return 1;
    if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return 1;
    return 0;
}

static int stopping(ps_server *srv)
{
    pthread_mutex_lock(&srv->mu);
    int s = srv->stopping;
    pthread_mutex_unlock(&srv->mu);
    return s;
}

static void wait_job(job *j)
{
    struct timespec ts;
    deadline_in(&ts, WAIT_MS * 1e-3);
    pthread_mutex_lock(&j->mu);
    if (!j->n_toks && !j->done) pthread_cond_timedwait(&j->cv, &j->mu, &ts);
    pthread_mutex_unlock(&j->mu);
}

/* Moves the job's new tokens through the text output. *got: whether anything happened.
 * Returns 1 once the final callback came (then the text is finished). */
static int drain(conn *k, int *got)
{
    job *j = k->j;
    pthread_mutex_lock(&j->mu);
    size_t n = j->n_toks;
    if (n > k->scratch_cap) {
        int32_t *s = realloc(k->scratch, n * sizeof *s);
        if (!s) {
            j->oom = 1;
            n = 0;
        } else {
            k->scratch = s;
            k->scratch_cap = n;
        }
    }
    if (n) memcpy(k->scratch, j->toks, n * sizeof *j->toks);
    j->n_toks = 0;
    int done = j->done;
    if (done) {
        k->fin = j->finish;
        k->usage = j->usage;
        k->have_final = 1;
    }
    if (j->oom) k->job_oom = 1;
    pthread_mutex_unlock(&j->mu);

    for (size_t i = 0; i < n && !k->stopped; i++) {
        int rc = ps_textout_push(&k->tx, k->scratch[i]);
        if (rc < 0) k->job_oom = 1;
        if (rc == 1 || rc < 0) {
            k->stopped = rc == 1;
            pe_sched_cancel(k->srv->sched, k->id); /* its final callback follows */
        }
    }
    *got = n > 0 || done;
    if (done) ps_textout_finish(&k->tx);
    return done;
}

static const char *finish_name(const conn *k)
{
    return outcome_of(k) == PS_OUT_LENGTH ? "length" : "stop";
}

/* ---- non-streaming responses ---- */

static enum MHD_Result respond_whole(conn *k)
{
    for (;;) {
        int got;
        if (drain(k, &got)) break;
        if (got) continue;
        if (client_gone(k) || stopping(k->srv)) return MHD_NO; /* completed: cancels */
        wait_job(k->j);
    }
    ps_outcome o = outcome_of(k);
    record_outcome(k, o);
    if (o == PS_OUT_CANCELLED || o == PS_OUT_ERROR) {
        ps_error e;
        outcome_error(k, o, &e);
        return send_error(k, &e, 0);
    }
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
        return MHD_NO;
    }
    json_object_set_new(o_json, "choices", json_pack("[o]", choice));
    json_object_set_new(o_json, "usage", usage_json(k));
    ps_buf b;
    ps_buf_init(&b);
    put_json(&b, o_json);
    enum MHD_Result r = send_json(k, 200, &b);
    ps_buf_deinit(&b);
    return r;
}

/* ---- streaming responses (Server-Sent Events) ---- */

static void sse(conn *k, json_t *o)
{
    ps_buf_adds(&k->out, "data: ");
    put_json(&k->out, o);
    ps_buf_adds(&k->out, "\n\n");
}

/* One chunk: text (may be empty), finish (NULL: not yet), role: the chat's first chunk. */
static void sse_chunk(conn *k, const char *text, size_t n, const char *finish, int role,
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

/* The end of a stream: the finishing chunk, usage, [DONE]. */
static void sse_finish(conn *k)
{
    ps_outcome o = outcome_of(k);
    record_outcome(k, o);
    const char *text;
    size_t n = ps_textout_take(&k->tx, &text);
    if (n) sse_chunk(k, text, n, NULL, 0, 0);
    if (o == PS_OUT_CANCELLED || o == PS_OUT_ERROR) {
        ps_error e;
        outcome_error(k, o, &e);
        ps_buf_adds(&k->out, "data: ");
        ps_error_json(&e, &k->out);
        ps_buf_adds(&k->out, "\n\n");
    } else if (k->include_usage) {
        /* OpenAI's shape: usage null on every chunk, then one chunk with no choices. */
        sse_chunk(k, "", 0, finish_name(k), 0, 0);
        json_t *u = base_json(k, k->kind == PS_CHAT ? "chat.completion.chunk" : "text_completion");
        if (u) {
            json_object_set_new(u, "choices", json_array());
            json_object_set_new(u, "usage", usage_json(k));
        }
        sse(k, u);
    } else {
        /* Usage is always reported: on the finishing chunk when not asked for. */
        sse_chunk(k, "", 0, finish_name(k), 0, 1);
    }
    ps_buf_adds(&k->out, "data: [DONE]\n\n");
    k->stream_done = 1;
}

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
        if (drain(k, &got)) {
            sse_finish(k);
            continue;
        }
        const char *text;
        size_t n = ps_textout_take(&k->tx, &text);
        if (n) {
            sse_chunk(k, text, n, NULL, 0, 0);
            continue;
        }
        if (got) continue;
        if (client_gone(k) || stopping(k->srv)) return MHD_CONTENT_READER_END_WITH_ERROR;
        wait_job(k->j);
    }
}

/* ---- generation requests ---- */

static int model_ok(const ps_server *srv, const char *name)
{
    return strcmp(name, srv->model_id) == 0;
}

/* Tokenizes the request's prompt (chat: renders the template first) into *toks. */
static int build_prompt(conn *k, const ps_req *r, int32_t **toks, size_t *n, ps_error *e)
{
    ps_server *srv = k->srv;
    const pe_vocab *v = pe_model_vocab(srv->m);
    const char *param = r->kind == PS_CHAT ? "messages" : "prompt";
    char *owned = NULL;
    const char *text = r->prompt;
    size_t len = r->prompt_len;
    *toks = NULL;
    *n = 0;
    if (r->prompt_toks) {
        *toks = malloc(r->n_prompt_toks * sizeof **toks);
        if (!*toks) return ps_err(e, 500, NULL, NULL, "out of memory");
        memcpy(*toks, r->prompt_toks, r->n_prompt_toks * sizeof **toks);
        *n = r->n_prompt_toks;
        return 0;
    }
    if (r->kind == PS_CHAT) {
        pe_chat_msg *msgs = calloc(r->n_msgs, sizeof *msgs);
        char err[256];
        if (!msgs) return ps_err(e, 500, NULL, NULL, "out of memory");
        for (size_t i = 0; i < r->n_msgs; i++) {
            msgs[i].role = r->msgs[i].role;
            msgs[i].content = r->msgs[i].content;
        }
        int rc = pe_chat_render(srv->chat, msgs, r->n_msgs, &owned, err, sizeof err);
        free(msgs);
        if (rc == PGD_EINVAL) return ps_err(e, 400, "messages", NULL, "'messages': %s", err);
        if (rc) return ps_err(e, 500, NULL, NULL, "out of memory");
        text = owned;
        len = strlen(owned);
    }
    int add_bos = pe_vocab_add_bos(v);
    int64_t cnt = pe_tokenize(v, text, len, add_bos, 1, NULL, 0);
    if (cnt > 0) {
        *toks = malloc((size_t)cnt * sizeof **toks);
        if (*toks) pe_tokenize(v, text, len, add_bos, 1, *toks, (size_t)cnt);
    }
    free(owned);
    if (cnt < 0 || (cnt > 0 && !*toks))
        return ps_err(e, 400, param, NULL, "cannot tokenize '%s'", param);
    if (cnt == 0) return ps_err(e, 400, param, NULL, "'%s' is empty", param);
    *n = (size_t)cnt;
    return 0;
}

static enum MHD_Result handle_generate(conn *k)
{
    ps_server *srv = k->srv;
    ps_req r;
    ps_error e;
    int32_t *toks = NULL;
    size_t n = 0;
    enum MHD_Result ret;

    k->kind = k->rt == R_CHAT ? PS_CHAT : PS_COMPLETION;
    if (ps_req_parse(k->kind, k->body.data ? k->body.data : "", k->body.len,
                     pe_model_hparams(srv->m)->n_vocab, &r, &e))
        return send_error(k, &e, 0);
    if (r.model && !model_ok(srv, r.model)) {
        ps_err(&e, 404, "model", "model_not_found",
               "the model '%s' does not exist; this server serves '%s'", r.model, srv->model_id);
        goto error;
    }
    if (build_prompt(k, &r, &toks, &n, &e)) goto error;
    if (n >= srv->info.n_ctx) {
        ps_err(&e, 413, k->kind == PS_CHAT ? "messages" : "prompt", "context_length_exceeded",
               "the prompt has %zu tokens; the context holds %u (prompt and output together)", n,
               srv->info.n_ctx);
        goto error;
    }

    const char *stops[PS_MAX_STOPS];
    size_t n_stops = 0;
    for (size_t i = 0; i < r.n_stop; i++)
        stops[n_stops++] = r.stop[i];
    for (size_t i = 0; k->kind == PS_CHAT && i < srv->n_chat_stops; i++)
        stops[n_stops++] = srv->chat_stops[i];
    if (ps_textout_init(&k->tx, pe_model_vocab(srv->m), stops, n_stops)) {
        ps_err(&e, 500, NULL, NULL, "out of memory");
        goto error;
    }
    k->tx_init = 1;
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
    rp.sampler.seed = r.has_seed ? r.seed : next_random(srv);
    rp.salt = r.salt;
    rp.salt_len = r.salt_len;
    rp.stop_on_eog = !r.ignore_eos;

    job *j = job_create(srv);
    if (!j) {
        ps_err(&e, 500, NULL, NULL, "out of memory");
        goto error;
    }
    j->t_arrival = k->t0;
    pthread_mutex_lock(&srv->mu);
    int refused = srv->shutting_down;
    if (!refused) srv->n_jobs++;
    pthread_mutex_unlock(&srv->mu);
    if (refused) {
        j->refs = 1;
        job_unref(j);
        ps_err(&e, 503, NULL, "shutting_down", "the server is shutting down");
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
        j->refs = 1;
        job_unref(j);
        if (rc == PGD_EBUSY)
            ps_err(&e, 429, NULL, "queue_full",
                   "the request queue is full (--max-queued); retry later");
        else if (rc == PGD_EINVAL)
            ps_err(&e, 400, NULL, NULL, "the request was refused: %s", pgd_strerror(rc));
        else
            ps_err(&e, 500, NULL, NULL, "cannot queue the request: %s", pgd_strerror(rc));
        goto error;
    }
    if (cancel_now) pe_sched_cancel(srv->sched, id);
    k->j = j;
    k->id = id;
    free(toks);
    ps_req_free(&r);

    if (!k->stream) return respond_whole(k);

    if (k->kind == PS_CHAT) sse_chunk(k, "", 0, NULL, 1, 0);
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
    ps_req_free(&r);
    return send_error(k, &e, 0);
}

/* ---- other routes ---- */

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
            return send_error(k, &e, 0);
        }
        o = m;
    } else {
        o = json_pack("{s:s,s:[o]}", "object", "list", "data", m);
    }
    ps_buf b;
    ps_buf_init(&b);
    put_json(&b, o);
    enum MHD_Result r = send_json(k, 200, &b);
    ps_buf_deinit(&b);
    return r;
}

static enum MHD_Result handle_metrics(conn *k)
{
    ps_buf b;
    ps_buf_init(&b);
    ps_metrics_render(&k->srv->metrics, &k->srv->info, k->srv->sched, k->srv->cache, &b);
    enum MHD_Result r =
        b.oom ? MHD_NO
              : queue(k, 200, "text/plain; version=0.0.4; charset=utf-8", b.data, b.len, 0);
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

static enum MHD_Result dispatch(conn *k, const char *method)
{
    ps_server *srv = k->srv;
    ps_error e;
    int is_post = strcmp(method, "POST") == 0;
    int is_get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;

    if (k->rt == R_UNKNOWN) {
        ps_err(&e, 404, NULL, "not_found", "no route %s %s", method, k->url);
        return send_error(k, &e, 0);
    }
    if (strncmp(k->url, "/v1/", 4) == 0 && !auth_ok(k)) {
        ps_err(&e, 401, NULL, "invalid_api_key",
               "missing or wrong API key: send 'Authorization: Bearer KEY'");
        return send_error(k, &e, 0);
    }
    int want_post = k->rt == R_COMPLETIONS || k->rt == R_CHAT;
    if (want_post ? !is_post : !is_get) {
        ps_err(&e, 405, NULL, "method_not_allowed", "%s %s: use %s", method, k->url,
               want_post ? "POST" : "GET");
        return send_error(k, &e, 0);
    }
    if (k->too_big) {
        ps_err(&e, 413, NULL, "request_too_large", "the body is larger than %llu bytes",
               (unsigned long long)srv->p.max_body_bytes);
        return send_error(k, &e, 1);
    }
    if (k->rt == R_COMPLETIONS || k->rt == R_CHAT) {
        /* A generation may run for minutes between two writes (a long prefill, a
         * non-streamed answer): no idle timeout while it is handled (its own loops watch
         * the client and the shutdown); on_completed turns it back on. */
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
            ps_err(&e, 503, NULL, "shutting_down", "the server is shutting down");
            return send_error(k, &e, 0);
        }
        static const char ok[] = "{\"status\":\"ok\"}";
        return queue(k, 200, "application/json", ok, sizeof ok - 1, 0);
    }
    case R_METRICS:
        return handle_metrics(k);
    case R_MODELS:
    case R_MODEL_ONE:
        return handle_models(k);
    default:
        return handle_generate(k);
    }
}

/* ---- libmicrohttpd callbacks ---- */

static void conn_free(conn *k)
{
    ps_buf_deinit(&k->body);
    ps_buf_deinit(&k->out);
    if (k->tx_init) ps_textout_deinit(&k->tx);
    free(k->scratch);
    free(k);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    ps_server *srv = cls;
    conn *k = *con_cls;
    (void)version;
    if (!k) {
        k = calloc(1, sizeof *k);
        if (!k) return MHD_NO;
        k->srv = srv;
        k->c = c;
        k->t0 = now_s();
        k->rt = route_of(url);
        snprintf(k->url, sizeof k->url, "%s", url);
        k->created = (long long)time(NULL);
        snprintf(k->rid, sizeof k->rid, "%s-%016llx", route_of(url) == R_CHAT ? "chatcmpl" : "cmpl",
                 (unsigned long long)next_random(srv));
        ps_buf_init(&k->body);
        ps_buf_init(&k->out);
        *con_cls = k;
        pthread_mutex_lock(&srv->mu);
        srv->n_http++;
        pthread_mutex_unlock(&srv->mu);
        ps_metrics_http_active(&srv->metrics, 1);
        /* Refuse an announced oversized body before reading any of it. */
        const char *cl =
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > srv->p.max_body_bytes) {
            k->too_big = 1;
            ps_error e;
            ps_err(&e, 413, NULL, "request_too_large", "the body is larger than %llu bytes",
                   (unsigned long long)srv->p.max_body_bytes);
            return send_error(k, &e, 1);
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        if (!k->too_big && k->body.len + *upload_data_size > srv->p.max_body_bytes) {
            k->too_big = 1; /* a chunked body that grew too large: read and drop the rest */
            ps_buf_deinit(&k->body);
        }
        if (!k->too_big && ps_buf_add(&k->body, upload_data, *upload_data_size)) return MHD_NO;
        *upload_data_size = 0;
        return MHD_YES;
    }
    return dispatch(k, method);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    ps_server *srv = cls;
    conn *k = *con_cls;
    if (!k) return;
    *con_cls = NULL;
    /* Idle again (keep-alive): the idle timeout applies, counted from now. */
    if (k->no_timeout && toe == MHD_REQUEST_TERMINATED_COMPLETED_OK)
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, srv->p.idle_timeout_s);
    if (k->j) {
        pthread_mutex_lock(&k->j->mu);
        int done = k->j->done;
        pthread_mutex_unlock(&k->j->mu);
        /* The client went away (or the server stops) before the end: free its pages now. */
        if (!done) pe_sched_cancel(srv->sched, k->id);
        record_outcome(k, PS_OUT_CANCELLED);
        job_unref(k->j);
    }
    conn_free(k);
    ps_metrics_http_active(&srv->metrics, -1);
    pthread_mutex_lock(&srv->mu);
    srv->n_http--;
    pthread_cond_broadcast(&srv->idle_cv);
    pthread_mutex_unlock(&srv->mu);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    fputs("pagoda serve: http: ", stderr);
    vfprintf(stderr, fmt, ap);
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
    srv->listen_fd = MHD_INVALID_SOCKET;
    set_stage("serving");
    pthread_mutex_init(&srv->mu, NULL);
    pthread_cond_init(&srv->work_cv, NULL);
    pthread_cond_init(&srv->idle_cv, NULL);
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
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG | MHD_USE_POLL;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    srv->d = MHD_start_daemon(
        flags, p.port, NULL, NULL, on_request, srv, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, srv,
        MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)(p.max_connections ? p.max_connections : 1000),
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)p.idle_timeout_s, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!srv->d) {
        snprintf(err, errlen, "cannot listen on %s port %u: %s", p.host, (unsigned)p.port,
                 errno ? strerror(errno) : "libmicrohttpd refused to start");
        goto fail;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(srv->d, MHD_DAEMON_INFO_BIND_PORT);
    srv->port = di ? di->port : p.port;
    if (pthread_create(&srv->stepper, NULL, stepper_main, srv)) {
        snprintf(err, errlen, "cannot start the stepping thread");
        goto fail;
    }
    srv->stepper_started = 1;
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
    set_stage("finishing requests in flight");
    /* No new connections from here on. The socket stays open until MHD_stop_daemon has
     * returned, as libmicrohttpd asks: its polling thread may still hold it. */
    srv->listen_fd = MHD_quiesce_daemon(srv->d);
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
    srv->stopping = 1;
    pthread_mutex_unlock(&srv->mu);
    if (srv->stepper_started) {
        /* Every job gets its final callback from the stepping thread, then it stops. */
        set_stage("cancelling requests");
        pe_sched_cancel_all(srv->sched);
        pthread_mutex_lock(&srv->mu);
        while (srv->n_jobs)
            pthread_cond_wait(&srv->idle_cv, &srv->mu);
        pthread_mutex_unlock(&srv->mu);
    }
    /* Closes every connection, idle keep-alive ones included (shutdown() wakes their
     * threads), and joins their threads: requests in flight see `stopping` within
     * WAIT_MS and return. */
    set_stage("closing connections");
    if (srv->d) MHD_stop_daemon(srv->d);
    if (srv->listen_fd != MHD_INVALID_SOCKET) close(srv->listen_fd);
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
    pthread_cond_destroy(&srv->idle_cv);
    pthread_cond_destroy(&srv->work_cv);
    pthread_mutex_destroy(&srv->mu);
    free(srv->host);
    free(srv->model_id);
    free(srv->api_key);
    free(srv);
    set_stage("stopped");
}
