/* SPDX-License-Identifier: MIT */
/*
 * server_int.h - what the server's files share and nothing outside server/ may see: the
 * server, a connection (one HTTP request) and a job (one submitted generation), and the
 * ps__ functions one file of the server calls in another. Callers: server.c, routes.c,
 * generate.c, render.c, handoff.c, step.c. The public interface is server.h.
 *
 *   file         concept                                       runs on
 *   ----         -------                                       -------
 *   server.c     lifecycle: start, shutdown stages, destroy    main thread
 *   routes.c     MHD callbacks, dispatch, /health /v1/models   connection threads
 *                /metrics, queueing a response
 *   generate.c   POST /v1/completions and /chat/completions:   connection threads
 *                prompt, submit, wait, whole answer or stream
 *   render.c     JSON bodies and SSE chunks of a generation    connection threads
 *   handoff.c    the job: tokens from the stepping thread to   both
 *                the connection thread
 *   step.c       the stepping thread                           stepping thread
 *   server.c     also the connection guard: cuts connections   guard thread
 *                whose headers or body come too slowly
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
 *  - Locks: srv->mu and j->mu are never held together, and neither is held across a
 *    pe_sched_* call (the scheduler calls back without its own lock, see scheduler.h). The
 *    metrics mutex is a leaf: ps_metrics_* take it and no other lock while holding it.
 */
#ifndef PS_SERVER_INT_H
#define PS_SERVER_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

#include <jansson.h>
#include <microhttpd.h>

#include "api.h"
#include "buf.h"
#include "metrics.h"
#include "server.h"
#include "textout.h"

#define WAIT_MS 50
#define DEFAULT_MAX_BODY (16u << 20)
#define DEFAULT_IDLE_TIMEOUT_S 60u
#define DEFAULT_MAX_CONNECTIONS 4096u
#define DEFAULT_MAX_CONNECTIONS_PER_IP 1024u
#define DEFAULT_HEADER_TIMEOUT_S 10u
#define DEFAULT_MIN_BODY_RATE 1024u  /* bytes per second */
#define GUARD_MS 200                 /* how often the guard looks at the connections */
#define STREAMS_END_S 1.0            /* destroy: how long cancelled streams get to end */
#define DEFAULT_COMPLETION_TOKENS 16 /* OpenAI's default max_tokens for /v1/completions */
#define DEFAULT_HINT_LEAD_MS 2000
#define HINTS_EVERY_S 0.1 /* how often the stepping thread runs due hints */

typedef enum route {
    R_UNKNOWN = 0,
    R_COMPLETIONS,
    R_CHAT,
    R_MODELS,
    R_MODEL_ONE,
    R_HEALTH,
    R_METRICS,
    R_CACHE_PIN, /* the admin API (admin.c) */
    R_CACHE_UNPIN,
    R_CACHE_PREFETCH,
    R_CACHE_EVICT,
    R_CACHE_STATS
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
    pe_usage usage;   /* mu; usage.status: why a PE_FINISH_ERROR request failed */
    ps_server *srv;
    double t_arrival; /* set before submit; read by the stepping thread */
    double t_last;    /* stepping thread only */
    uint32_t n_seen;  /* stepping thread only */
} job;

/* One TCP connection (MHD's socket context), from accept to close: what the guard thread
 * needs to cut a client that sends its headers or body too slowly (slowloris). */
typedef enum sock_phase {
    SOCK_HEADERS = 0, /* waiting for a request's headers */
    SOCK_BODY,        /* headers in, the body arriving */
    SOCK_HANDLING     /* the request is being answered: never cut */
} sock_phase;

typedef struct sock {
    struct sock *prev, *next; /* srv->socks; srv->sock_mu */
    MHD_socket fd;
    sock_phase phase;      /* srv->sock_mu, like every field below */
    double t_wait;         /* when the headers began to be awaited (accept, last answer) */
    double t_body;         /* when the headers were complete */
    uint64_t n_body_bytes; /* body bytes received so far */
    uint32_t n_requests;   /* requests answered on this connection */
    int cut;               /* the guard shut it down */
} sock;

typedef struct conn {
    ps_server *srv;
    struct MHD_Connection *c;
    route rt;
    char url[256];
    double t0;
    ps_buf body;
    int too_big;
    int http10;     /* not HTTP/1.1: no interim responses */
    int refused;    /* answered on the headers alone: the body (if any) is dropped unread */
    int eof_probed; /* the client's end of input came; an interim 100 was sent to tell a
                       half-close from a disconnect (ps__client_gone) */
    /* a generation */
    job *j;
    uint64_t id;
    ps_kind kind;
    int stream, include_usage;
    ps_textout tx;
    int tx_init;
    int stopped;       /* a stop string matched; the request was cancelled */
    int no_timeout;    /* the idle timeout is off while this request is handled */
    int have_final;    /* the final callback's reason and usage are in fin / usage */
    pgd_retention ret; /* the request's retention (api.h), reported in usage */
    pe_finish fin;
    pe_usage usage; /* usage.status: the pgd_status of a failed generation */
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
    /* the connection guard (server.c): header deadline and minimum body rate */
    pthread_mutex_t sock_mu; /* a leaf: guards socks, every sock, stop_guard */
    pthread_cond_t guard_cv;
    sock *socks;
    int stop_guard;
    pthread_t guard;
    int guard_started;
    uint64_t counter;
    long long t_start;
};

/* ---- small helpers ---- */

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* *ts = now + s on CLOCK_REALTIME, for pthread_cond_timedwait. */
static inline void deadline_in(struct timespec *ts, double s)
{
    clock_gettime(CLOCK_REALTIME, ts);
    long long ns = (long long)(s * 1e9) + ts->tv_nsec;
    ts->tv_sec += (time_t)(ns / 1000000000);
    ts->tv_nsec = (long)(ns % 1000000000);
}

static inline int model_ok(const ps_server *srv, const char *name)
{
    return strcmp(name, srv->model_id) == 0;
}

/* server.c: a fresh random number (request ids, default seeds). Any thread; takes srv->mu. */
uint64_t ps__next_random(ps_server *srv);

/* server.c: the connection guard's view of k's request: its headers are in (phase
 * SOCK_BODY), n more body bytes came, it is being answered (SOCK_HANDLING), it completed
 * (SOCK_HEADERS again, the next request's headers awaited). Connection thread. */
void ps__sock_phase(ps_server *srv, struct MHD_Connection *c, sock_phase ph);
void ps__sock_body(ps_server *srv, struct MHD_Connection *c, size_t n);

/* ---- handoff.c: the job between the stepping thread and a connection thread ---- */

/* A job with two references (the conn's and the scheduler's). NULL: out of memory. */
job *ps__job_create(ps_server *srv);
/* Drops one reference; the last one frees the job. Any thread; takes j->mu. */
void ps__job_unref(job *j);
/* Frees a job that was never submitted (or that pe_sched_submit refused): nothing else
 * holds it, so both references go at once. */
void ps__job_discard(job *j);
/* Whether the final callback came. Takes j->mu. */
int ps__job_done(job *j);
/* The scheduler's callback (a pe_token_cb, ud = the job), on the stepping thread. */
void ps__job_on_token(void *ud, uint64_t id, int32_t tok, pe_finish why, const pe_usage *u);
/* Waits up to WAIT_MS for a token or the final callback. Connection thread. */
void ps__job_wait(job *j);
/* Moves k's job's new tokens through the text output (cancels the request on a stop
 * string). *got: whether anything happened. Returns 1 once the final callback came (the
 * reason and usage are then in k->fin and k->usage, the text is finished). */
int ps__job_drain(conn *k, int *got);

/* ---- step.c ---- */

/* The stepping thread's body (arg: the server): steps the scheduler while jobs exist. */
void *ps__step_main(void *arg);

/* ---- render.c: what a generation's client sees ---- */

/* The outcome of a finished generation as the client sees it. */
ps_outcome ps__outcome_of(const conn *k);
/* The error a generation that did not finish normally (cancelled or error) reports. */
void ps__outcome_error(const conn *k, ps_outcome o, ps_error *e);
/* Dumps o (stolen) compactly into out. Returns 0 or -1 (out->oom set). */
int ps__put_json(ps_buf *out, json_t *o);
/* The non-streamed answer of k (finished, neither failed nor cancelled), as a new object;
 * NULL when memory runs out. Takes the text out of k->tx. */
json_t *ps__whole_json(conn *k);
/* Appends one SSE chunk to k->out: text (may be empty), finish (NULL: not yet), role: the
 * chat's first chunk, with_usage: usage on this chunk. */
void ps__sse_chunk(conn *k, const char *text, size_t n, const char *finish, int role,
                   int with_usage);
/* Appends the end of a stream of outcome o to k->out: the last text, the finishing chunk,
 * usage (or the error), [DONE]; sets k->stream_done. */
void ps__sse_finish(conn *k, ps_outcome o);

/* ---- generate.c ---- */

/* Tokenizes r's prompt (chat: renders the template first) into *toks (malloc'ed), as a
 * generation does; k->kind names the field of errors. Returns 0 or -1 with *e. */
int ps__build_prompt(conn *k, const ps_req *r, int32_t **toks, size_t *n, ps_error *e);
/* The 400 of a pin past the pin share: "pinned blocks would exceed the pin share (N of M
 * pages)", N the pinned pages with the n_new asked for, M the share's pages; param names
 * the field. Returns -1. */
int ps__pin_share_error(ps_server *srv, uint64_t n_new, const char *param, ps_error *e);

/* ---- admin.c: /v1/cache/ ---- */

/* POST /v1/cache/pin, unpin, prefetch, evict; GET or POST /v1/cache/stats. */
enum MHD_Result ps__handle_cache(conn *k);

/* POST /v1/completions and /v1/chat/completions (the body is in k->body). */
enum MHD_Result ps__handle_generate(conn *k);
/* Counts k's outcome in the metrics, once per request. */
void ps__record_outcome(conn *k, ps_outcome o);

/* ---- routes.c ---- */

/* Whether k's client went away (reset, or closed its socket). A half-close (end of input
 * while the client still reads) is not going away: the answer is delivered. Connection
 * thread, with no response data written by anyone else meanwhile. */
int ps__client_gone(conn *k);

/* Queues a response of data[0..n) (copied), with the headers status needs. */
enum MHD_Result ps__queue(conn *k, int status, const char *ctype, const char *data, size_t n,
                          int close_conn);
enum MHD_Result ps__send_json(conn *k, int status, const ps_buf *b);
/* Dumps o (stolen) and queues it as application/json. */
enum MHD_Result ps__send_obj(conn *k, int status, json_t *o);
enum MHD_Result ps__send_error(conn *k, const ps_error *e, int close_conn);
/* libmicrohttpd's access handler and request-completed callback (cls: the server). */
enum MHD_Result ps__on_request(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version, const char *upload_data,
                               size_t *upload_data_size, void **con_cls);
void ps__on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe);

#endif /* PS_SERVER_INT_H */
