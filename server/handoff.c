/* SPDX-License-Identifier: MIT */
/*
 * handoff.c - the job: how a generation's tokens pass from the stepping thread (which
 * produces them in the scheduler's callback) to the connection thread (which turns them
 * into text). Callers: step.c's pe_sched_step calls ps__job_on_token; generate.c submits
 * with it and drains; routes.c drops the conn's reference when the request completes.
 *
 *   stepping thread                          connection thread
 *   ps__job_on_token(tok)  -> toks[n_toks++]   ps__job_drain: take toks[0..n_toks),
 *                             signal cv                       push them through textout
 *   ps__job_on_token(final)-> done, usage      ps__job_wait: cv, at most WAIT_MS
 *                             srv->n_jobs--
 *
 * Invariants:
 *  - j->mu guards refs, toks/n_toks/cap, oom, done, finish and usage; t_last and n_seen
 *    belong to the stepping thread alone. j->mu is never held with srv->mu.
 *  - Two references: the scheduler's, dropped at the end of the final callback (after
 *    srv->n_jobs is decremented), and the conn's, dropped by the request-completed
 *    callback. The last one frees the job.
 *  - A token that cannot be queued (realloc failed) sets oom instead; the connection then
 *    reports an out-of-memory error. The stepping thread never blocks on a connection.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "server_int.h"

/* ---- the job ---- */

job *ps__job_create(ps_server *srv)
{
    job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 2;
    j->srv = srv;
    return j;
}

void ps__job_unref(job *j)
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

void ps__job_discard(job *j)
{
    j->refs = 1; /* the scheduler's reference was never handed out */
    ps__job_unref(j);
}

int ps__job_done(job *j)
{
    pthread_mutex_lock(&j->mu);
    int done = j->done;
    pthread_mutex_unlock(&j->mu);
    return done;
}

/* ---- the stepping thread's side ---- */

/* The scheduler's callback, on the stepping thread (see pe_token_cb). The final call's
 * usage (with usage->status, why a failed request failed) is kept for the connection. */
void ps__job_on_token(void *ud, uint64_t id, int32_t tok, pe_finish why, const pe_usage *u)
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
    ps__job_unref(j);
}

/* ---- the connection thread's side ---- */

void ps__job_wait(job *j)
{
    struct timespec ts;
    deadline_in(&ts, WAIT_MS * 1e-3);
    pthread_mutex_lock(&j->mu);
    if (!j->n_toks && !j->done) pthread_cond_timedwait(&j->cv, &j->mu, &ts);
    pthread_mutex_unlock(&j->mu);
}

/* Moves the job's new tokens through the text output. *got: whether anything happened.
 * Returns 1 once the final callback came: its reason and usage (status included) are then
 * the conn's, and the text is finished. */
int ps__job_drain(conn *k, int *got)
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
