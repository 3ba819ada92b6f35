/* SPDX-License-Identifier: MIT */
/*
 * mover.c - the cache's mover threads: N threads serving a bounded FIFO of jobs, the
 * background half of tier movement (cache.c: demotion puts, promotion fills, prefetch).
 *
 *     submit (cache lock held)  ->  [job][job][job]  ->  thread 1..N: job->fn(job)
 *
 * A job is a node embedded in its owner's memory (a write-back slot, a promotion record):
 * submitting allocates nothing and never blocks. The queue is bounded by max_jobs; a full
 * queue refuses (PGD_EBUSY) and the caller gives up the move (counted), so that nothing
 * ever waits on the request path. A job runs with no lock held: it does its tier I/O,
 * then takes the cache lock only to publish its result. The mover never touches a job
 * after its fn returns (the fn may have freed it, or published it to a thread that frees
 * it), and a job's fn must not touch its cache after releasing the cache lock for the last
 * time: drain (no job queued or running) then makes it safe to free the cache.
 * Locking: m->mu guards the queue and counters; it is taken under the cache lock by
 * submit and never held while a job runs (lock order: cache lock, then m->mu).
 * Callers: cache.c only (internal API in pgd_int.h).
 */
#include <pthread.h>

#include "pgd_int.h"

struct pgd__mover {
    pthread_mutex_t mu;
    pthread_cond_t work; /* a job was queued, or stop */
    pthread_cond_t idle; /* the queue emptied and no job runs */
    pgd__job *head, *tail;
    uint32_t n_queued, n_running, max_jobs;
    int stop;
    pgd__alloc al;
    pthread_t *threads;
    uint32_t n_threads; /* started */
};

static void *mover_main(void *arg)
{
    pgd__mover *m = arg;
    pthread_mutex_lock(&m->mu);
    for (;;) {
        while (!m->head && !m->stop)
            pthread_cond_wait(&m->work, &m->mu);
        if (!m->head) break; /* stop, and nothing left: drained */
        pgd__job *j = m->head;
        m->head = j->next;
        if (!m->head) m->tail = NULL;
        m->n_queued--;
        m->n_running++;
        pthread_mutex_unlock(&m->mu);
        j->fn(j); /* j may be gone once this returns */
        pthread_mutex_lock(&m->mu);
        m->n_running--;
        if (!m->head && !m->n_running) pthread_cond_broadcast(&m->idle);
    }
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

int pgd__mover_create(const pgd__alloc *al, const pgd__log *lg, uint32_t n_threads,
                      uint32_t max_jobs, pgd__mover **out)
{
    *out = NULL;
    if (n_threads == 0 || n_threads > 64 || max_jobs == 0) return PGD_EINVAL;
    pgd__mover *m = pgd__calloc(al, 1, sizeof *m);
    if (!m) return PGD_ENOMEM;
    m->al = *al;
    m->max_jobs = max_jobs;
    m->threads = pgd__calloc(al, n_threads, sizeof *m->threads);
    if (!m->threads) {
        pgd__free(al, m);
        return PGD_ENOMEM;
    }
    if (pthread_mutex_init(&m->mu, NULL) != 0) goto fail_mu;
    if (pthread_cond_init(&m->work, NULL) != 0) goto fail_work;
    if (pthread_cond_init(&m->idle, NULL) != 0) goto fail_idle;
    for (; m->n_threads < n_threads; m->n_threads++) {
        if (pthread_create(&m->threads[m->n_threads], NULL, mover_main, m) != 0) {
            pgd__logf(lg, PGD_LOG_ERROR, "cache: cannot start mover thread %u of %u",
                      m->n_threads + 1, n_threads);
            pgd__mover_destroy(m);
            return PGD_ENOMEM;
        }
    }
    *out = m;
    return PGD_OK;
fail_idle:
    pthread_cond_destroy(&m->work);
fail_work:
    pthread_mutex_destroy(&m->mu);
fail_mu:
    pgd__free(al, m->threads);
    pgd__free(al, m);
    return PGD_ENOMEM;
}

int pgd__mover_submit(pgd__mover *m, pgd__job *job)
{
    int rc = PGD_OK;
    pthread_mutex_lock(&m->mu);
    if (m->n_queued >= m->max_jobs || m->stop) {
        rc = PGD_EBUSY;
    } else {
        job->next = NULL;
        if (m->tail)
            m->tail->next = job;
        else
            m->head = job;
        m->tail = job;
        m->n_queued++;
        pthread_cond_signal(&m->work);
    }
    pthread_mutex_unlock(&m->mu);
    return rc;
}

void pgd__mover_drain(pgd__mover *m)
{
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    while (m->head || m->n_running)
        pthread_cond_wait(&m->idle, &m->mu);
    pthread_mutex_unlock(&m->mu);
}

uint32_t pgd__mover_depth(pgd__mover *m)
{
    pthread_mutex_lock(&m->mu);
    uint32_t n = m->n_queued + m->n_running;
    pthread_mutex_unlock(&m->mu);
    return n;
}

void pgd__mover_destroy(pgd__mover *m)
{
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->stop = 1; /* the threads run what is queued, then exit */
    pthread_cond_broadcast(&m->work);
    pthread_mutex_unlock(&m->mu);
    for (uint32_t i = 0; i < m->n_threads; i++)
        pthread_join(m->threads[i], NULL);
    pthread_cond_destroy(&m->idle);
    pthread_cond_destroy(&m->work);
    pthread_mutex_destroy(&m->mu);
    pgd__alloc al = m->al;
    pgd__free(&al, m->threads);
    pgd__free(&al, m);
}
