/* SPDX-License-Identifier: MIT */
/*
 * mover.c - the cache's mover threads: two classes of jobs over bounded queues, the
 * background half of tier movement (cache.c: promotion fills, demotion puts, prefetch).
 *
 *     submit (cache lock held)  ->  fill queue        ->  N fill threads (normal priority)
 *                                   background queue  ->  N background threads (nice 19)
 *
 * Promotion fills are latency-critical (a request waits on them); puts and prefetches are
 * not, and must not take decode's CPU. So each class has its own threads: a demotion storm
 * never delays a fill (the fill threads never run a put while the background queue is
 * shallow), and the background threads run at the lowest CPU priority (Linux: a per-thread
 * nice of 19, set once at start, since an unprivileged thread can never lower it again):
 * under load they run on what compute leaves. When the background queue reaches
 * help_depth jobs (the cache's write-back slab half full, so it would soon drop pages),
 * the fill threads help drain it at normal priority, fills still first. Below that depth
 * the background threads also pace themselves (PACE below): nice shares the CPU, not the
 * memory bandwidth their copies take from decode.
 *
 * A job is a node embedded in its owner's memory (a write-back slot, a promotion record):
 * submitting allocates nothing and never blocks. The queues together hold at most
 * max_jobs; a full queue refuses (PGD_EBUSY) and the caller gives up the move (counted),
 * so that nothing ever waits on the request path. A job runs with no lock held: it does
 * its tier I/O, then takes the cache lock only to publish its result. The mover never
 * touches a job after its fn returns (the fn may have freed it, or published it to a
 * thread that frees it), and a job's fn must not touch its cache after releasing the cache
 * lock for the last time: drain (no job queued or running) then makes it safe to free it.
 * Locking: m->mu guards the queues and counters; it is taken under the cache lock by
 * submit and never held while a job runs (lock order: cache lock, then m->mu).
 * Callers: cache.c only (internal API in pgd_int.h).
 */
#include <pthread.h>
#include <time.h>
#ifdef __linux__
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "pgd_int.h"

typedef struct mover_arg {
    struct pgd__mover *m;
    int cls;
} mover_arg;

typedef struct jobq {
    pgd__job *head, *tail;
    uint32_t n;
} jobq;

struct pgd__mover {
    pthread_mutex_t mu;
    pthread_cond_t work[2]; /* a job of the class was queued (or help is due), or stop */
    pthread_cond_t idle;    /* both queues emptied and no job runs */
    jobq q[2];              /* [PGD__JOB_FILL], [PGD__JOB_BACKGROUND] */
    uint32_t n_running, max_jobs, help_depth;
    uint32_t n_draining; /* threads in drain: background jobs run unpaced meanwhile */
    int stop;
    pgd__alloc al;
    const pgd__log *lg;
    pthread_t *threads;  /* [2 x n_threads asked]: fill threads, then background threads */
    uint32_t n_threads;  /* started */
    mover_arg args[128]; /* [i]: thread i's start argument */
};

static pgd__job *pop(jobq *q)
{
    pgd__job *j = q->head;
    q->head = j->next;
    if (!q->head) q->tail = NULL;
    q->n--;
    return j;
}

/* The job a thread of class cls runs next, or NULL: fills first; a fill thread takes a
 * background job only while that queue is help_depth deep. m->mu held. */
static pgd__job *next_job(pgd__mover *m, int cls)
{
    if (cls == PGD__JOB_BACKGROUND) return m->q[1].head ? pop(&m->q[1]) : NULL;
    if (m->q[0].head) return pop(&m->q[0]);
    if (m->help_depth && m->q[1].n >= m->help_depth) return pop(&m->q[1]);
    return NULL;
}

/* Lowers the calling thread's CPU priority to the least (nice 19). Linux only: there the
 * nice value is per thread; elsewhere setpriority would renice the whole process. */
static void lower_priority(const pgd__log *lg)
{
#ifdef __linux__
    if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19) != 0)
        pgd__logf(lg, PGD_LOG_WARN, "cache: cannot lower a background mover's priority");
#else
    (void)lg;
#endif
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Background pacing: after a job that took d, a background thread rests PACE x d (at most
 * PACE_MAX_NS) unless the queue is help_depth deep or someone drains, so each runs at most
 * 1 / (1 + PACE) of the time. Measured (bench_tier --tokens 1024 -t 2, 2 shared cores, two
 * runs each): decode ITL under the maximal demotion storm 1.26x / 1.17x of quiet with no
 * pacing, 1.09x / 1.12x with PACE 2 (the storm's write-back 230 / 149 -> 89 / 67 MiB/s);
 * at 16 MiB/s both within the noise (1.0 - 1.06x). Nice alone leaves the memory bandwidth
 * that the copies and hashes take from a bandwidth-bound decode. */
enum { PACE = 2, PACE_MAX_NS = 10000000 };

static void *mover_main(void *arg)
{
    pgd__mover *m = ((mover_arg *)arg)->m;
    const int cls = ((mover_arg *)arg)->cls;
    if (cls == PGD__JOB_BACKGROUND) lower_priority(m->lg);
    pthread_mutex_lock(&m->mu);
    for (;;) {
        pgd__job *j = next_job(m, cls);
        while (!j && !m->stop) {
            pthread_cond_wait(&m->work[cls], &m->mu);
            j = next_job(m, cls);
        }
        if (!j) break; /* stop, and nothing left for this class: drained */
        m->n_running++;
        pthread_mutex_unlock(&m->mu);
        uint64_t t0 = now_ns();
        j->fn(j); /* j may be gone once this returns */
        uint64_t d = now_ns() - t0;
        pthread_mutex_lock(&m->mu);
        m->n_running--;
        if (!m->q[0].head && !m->q[1].head && !m->n_running) pthread_cond_broadcast(&m->idle);
        if (cls == PGD__JOB_BACKGROUND && !m->stop && !m->n_draining &&
            (!m->help_depth || m->q[1].n < m->help_depth)) {
            uint64_t ns = d * PACE < PACE_MAX_NS ? d * PACE : PACE_MAX_NS;
            struct timespec ts = {0, (long)ns};
            pthread_mutex_unlock(&m->mu);
            nanosleep(&ts, NULL);
            pthread_mutex_lock(&m->mu);
        }
    }
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

int pgd__mover_create(const pgd__alloc *al, const pgd__log *lg, uint32_t n_threads,
                      uint32_t max_jobs, uint32_t help_depth, pgd__mover **out)
{
    *out = NULL;
    if (n_threads == 0 || n_threads > 64 || max_jobs == 0) return PGD_EINVAL;
    pgd__mover *m = pgd__calloc(al, 1, sizeof *m);
    if (!m) return PGD_ENOMEM;
    m->al = *al;
    m->lg = lg;
    m->max_jobs = max_jobs;
    m->help_depth = help_depth;
    m->threads = pgd__calloc(al, 2 * (size_t)n_threads, sizeof *m->threads);
    if (!m->threads) {
        pgd__free(al, m);
        return PGD_ENOMEM;
    }
    if (pthread_mutex_init(&m->mu, NULL) != 0) goto fail_mu;
    if (pthread_cond_init(&m->work[0], NULL) != 0) goto fail_work0;
    if (pthread_cond_init(&m->work[1], NULL) != 0) goto fail_work1;
    if (pthread_cond_init(&m->idle, NULL) != 0) goto fail_idle;
    for (; m->n_threads < 2 * n_threads; m->n_threads++) {
        mover_arg *a = &m->args[m->n_threads];
        a->m = m;
        a->cls = m->n_threads < n_threads ? PGD__JOB_FILL : PGD__JOB_BACKGROUND;
        if (pthread_create(&m->threads[m->n_threads], NULL, mover_main, a) != 0) {
            pgd__logf(lg, PGD_LOG_ERROR, "cache: cannot start mover thread %u of %u",
                      m->n_threads + 1, 2 * n_threads);
            pgd__mover_destroy(m);
            return PGD_ENOMEM;
        }
    }
    *out = m;
    return PGD_OK;
fail_idle:
    pthread_cond_destroy(&m->work[1]);
fail_work1:
    pthread_cond_destroy(&m->work[0]);
fail_work0:
    pthread_mutex_destroy(&m->mu);
fail_mu:
    pgd__free(al, m->threads);
    pgd__free(al, m);
    return PGD_ENOMEM;
}

int pgd__mover_submit(pgd__mover *m, pgd__job *chain, int cls)
{
    uint32_t n = 0;
    pgd__job *last = chain;
    for (pgd__job *j = chain; j; j = j->next) {
        last = j;
        n++;
    }
    if (n == 0 || (cls != PGD__JOB_FILL && cls != PGD__JOB_BACKGROUND)) return PGD_EINVAL;
    int rc = PGD_OK;
    pthread_mutex_lock(&m->mu);
    if (m->q[0].n + m->q[1].n + n > m->max_jobs || m->stop) {
        rc = PGD_EBUSY;
    } else {
        jobq *q = &m->q[cls];
        if (q->tail)
            q->tail->next = chain;
        else
            q->head = chain;
        q->tail = last;
        q->n += n;
        if (n == 1)
            pthread_cond_signal(&m->work[cls]);
        else
            pthread_cond_broadcast(&m->work[cls]);
        /* Deep enough for the fill threads to help. */
        if (cls == PGD__JOB_BACKGROUND && m->help_depth && q->n >= m->help_depth)
            pthread_cond_signal(&m->work[PGD__JOB_FILL]);
    }
    pthread_mutex_unlock(&m->mu);
    return rc;
}

void pgd__mover_drain(pgd__mover *m)
{
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->n_draining++;
    while (m->q[0].head || m->q[1].head || m->n_running)
        pthread_cond_wait(&m->idle, &m->mu);
    m->n_draining--;
    pthread_mutex_unlock(&m->mu);
}

uint32_t pgd__mover_depth(pgd__mover *m)
{
    pthread_mutex_lock(&m->mu);
    uint32_t n = m->q[0].n + m->q[1].n + m->n_running;
    pthread_mutex_unlock(&m->mu);
    return n;
}

void pgd__mover_destroy(pgd__mover *m)
{
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->stop = 1; /* the threads run what is queued for their class, then exit */
    pthread_cond_broadcast(&m->work[0]);
    pthread_cond_broadcast(&m->work[1]);
    pthread_mutex_unlock(&m->mu);
    for (uint32_t i = 0; i < m->n_threads; i++)
        pthread_join(m->threads[i], NULL);
    pthread_cond_destroy(&m->idle);
    pthread_cond_destroy(&m->work[1]);
    pthread_cond_destroy(&m->work[0]);
    pthread_mutex_destroy(&m->mu);
    pgd__alloc al = m->al;
    pgd__free(&al, m->threads);
    pgd__free(&al, m);
}
