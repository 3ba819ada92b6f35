/* SPDX-License-Identifier: MIT */
/*
 * step.c - the stepping thread: the only thread that calls pe_sched_step, so the forward
 * pass and every scheduler callback (handoff.c's ps__job_on_token) run here. Started and
 * joined by server.c.
 *
 * Invariants: it sleeps on srv->work_cv while no job is submitted (srv->n_jobs == 0) and
 * leaves only once stop_stepper is set and every job had its final callback, so no final
 * callback is ever lost. srv->mu is held only around those checks, never while stepping.
 */
#include <stdio.h>
#include <time.h>

#include "server_int.h"

/* ---- the stepping thread ---- */

void *ps__step_main(void *arg)
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
