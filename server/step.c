/* SPDX-License-Identifier: MIT */
/*
 * step.c - the stepping thread: the only thread that calls pe_sched_step, so the forward
 * pass and every scheduler callback (handoff.c's ps__job_on_token) run here. Started and
 * joined by server.c.
 *
 * Invariants: it sleeps on srv->work_cv while no job is submitted (srv->n_jobs == 0) and
 * leaves only once stop_stepper is set and every job had its final callback, so no final
 * callback is ever lost. srv->mu is held only around those checks, never while stepping.
 * Next-use hints (pgd_cache_hints_run, hint_lead_ms ahead) run here every HINTS_EVERY_S,
 * between steps, and while idle with hints waiting (a timed wait instead of the plain
 * one). The hints are warmed without srv->mu; pgd_cache_n_hints is read under it (the
 * cache lock nests inside srv->mu, never the other way: no cache callback takes it).
 */
#include <stdio.h>
#include <time.h>

#include "server_int.h"

/* ---- the stepping thread ---- */

/* Warms the next-use hints due within hint_lead_ms (pgd_cache_hints_run), at most every
 * HINTS_EVERY_S. *last: when they last ran. */
static void run_hints(ps_server *srv, double *last)
{
    double t = now_s();
    if (!srv->p.hint_lead_ms || t - *last < HINTS_EVERY_S) return;
    *last = t;
    if (pgd_cache_n_hints(srv->cache))
        pgd_cache_hints_run(srv->cache, (uint64_t)srv->p.hint_lead_ms * 1000000ull);
}

void *ps__step_main(void *arg)
{
    ps_server *srv = arg;
    double last_hints = 0;
    for (;;) {
        pthread_mutex_lock(&srv->mu);
        while (!srv->stop_stepper && !srv->n_jobs) {
            if (!srv->p.hint_lead_ms || !pgd_cache_n_hints(srv->cache)) {
                pthread_cond_wait(&srv->work_cv, &srv->mu);
                continue;
            }
            /* Hints wait: wake up to warm them while idle. */
            struct timespec ts;
            deadline_in(&ts, HINTS_EVERY_S);
            pthread_cond_timedwait(&srv->work_cv, &srv->mu, &ts);
            pthread_mutex_unlock(&srv->mu);
            run_hints(srv, &last_hints);
            pthread_mutex_lock(&srv->mu);
        }
        int quit = srv->stop_stepper && !srv->n_jobs;
        pthread_mutex_unlock(&srv->mu);
        if (quit) break;
        run_hints(srv, &last_hints);
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
