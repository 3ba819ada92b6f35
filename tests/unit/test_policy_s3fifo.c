/* SPDX-License-Identifier: MIT */
/*
 * test_policy_s3fifo.c - the S3-FIFO policy (src/policy/s3fifo.c) against a brute-force
 * model of it written here with arrays and linear scans, on random cache-shaped operation
 * sequences (policy_fixture.h), plus hand-made cases: one-hit wonders leave through the
 * small queue while a reused page moves to main, a ghost hit enters main, the walk over
 * pages that may not go, and lookup by name.
 */
#include <pagoda/policy.h>

#include "pgd_int.h"
#include "policy_fixture.h"
#include "t.h"

/* ---- the reference model: queues as arrays, [0] the oldest (tail) ---- */

#define M_SKIPS 64

typedef struct model {
    uint32_t n, s, g_cap;
    uint32_t small[PF_MAX], main[PF_MAX], evl[PF_MAX], n_small, n_main, n_evl;
    pgd_hash ghost[PF_MAX];
    uint32_t n_ghost;
    uint8_t q[PF_MAX], freq[PF_MAX], ev[PF_MAX], fresh[PF_MAX]; /* q: 0 none, 1 small, 2 main */
    pgd_hash hash[PF_MAX];
} model;

static int arr_find(const uint32_t *a, uint32_t n, uint32_t x)
{
    for (uint32_t i = 0; i < n; i++)
        if (a[i] == x) return (int)i;
    return -1;
}

static void arr_del(uint32_t *a, uint32_t *n, uint32_t x)
{
    int i = arr_find(a, *n, x);
    if (i < 0) return;
    memmove(a + i, a + i + 1, (*n - (uint32_t)i - 1) * sizeof *a);
    (*n)--;
}

static int ghost_find(const model *m, pgd_hash h)
{
    for (uint32_t i = 0; i < m->n_ghost; i++)
        if (m->ghost[i].lo == h.lo && m->ghost[i].hi == h.hi) return (int)i;
    return -1;
}

static void ghost_del(model *m, pgd_hash h)
{
    int i = ghost_find(m, h);
    if (i < 0) return;
    memmove(m->ghost + i, m->ghost + i + 1, (m->n_ghost - (uint32_t)i - 1) * sizeof *m->ghost);
    m->n_ghost--;
}

static void ghost_push(model *m, pgd_hash h)
{
    ghost_del(m, h);
    if (m->n_ghost == m->g_cap) {
        memmove(m->ghost, m->ghost + 1, (m->n_ghost - 1) * sizeof *m->ghost);
        m->n_ghost--;
    }
    m->ghost[m->n_ghost++] = h;
}

static uint32_t *queue(model *m, uint32_t id, uint32_t **n)
{
    *n = m->q[id] == 1 ? &m->n_small : &m->n_main;
    return m->q[id] == 1 ? m->small : m->main;
}

static void take_out(model *m, uint32_t id)
{
    uint32_t *n;
    if (m->q[id]) {
        uint32_t *a = queue(m, id, &n);
        arr_del(a, n, id);
    }
    m->q[id] = 0;
    arr_del(m->evl, &m->n_evl, id);
    m->ev[id] = 0;
}

static void m_reset(void *mp, uint32_t n)
{
    model *m = mp;
    memset(m, 0, sizeof *m);
    m->n = n;
    m->s = n / 10 ? n / 10 : 1;
    m->g_cap = n > m->s ? n - m->s : 1;
}

static void m_insert(void *mp, uint32_t id, pgd_hash h)
{
    model *m = mp;
    take_out(m, id);
    m->hash[id] = h;
    m->freq[id] = 0;
    m->fresh[id] = 1;
    if (ghost_find(m, h) >= 0) {
        ghost_del(m, h);
        m->q[id] = 2;
        m->main[m->n_main++] = id;
    } else {
        m->q[id] = 1;
        m->small[m->n_small++] = id;
    }
}

static void m_hit(void *mp, uint32_t id)
{
    model *m = mp;
    if (m->freq[id] < 3) m->freq[id]++;
    arr_del(m->evl, &m->n_evl, id);
    m->ev[id] = 0;
}

static void m_unref(void *mp, uint32_t id)
{
    model *m = mp;
    if (m->fresh[id]) { /* first release: to the newest end of its queue */
        uint32_t *n, *a = queue(m, id, &n);
        arr_del(a, n, id);
        a[(*n)++] = id;
        m->fresh[id] = 0;
    }
    m->evl[m->n_evl++] = id;
    m->ev[id] = 1;
}

static uint32_t m_victim(void *mp, const uint8_t *acc)
{
    model *m = mp;
    if (m->n_evl == 0) return PGD_POLICY_NO_PAGE;
    uint32_t skips = 0;
    while (m->n_small + m->n_main) {
        int from_small = m->n_small && (m->n_small >= m->s || !m->n_main);
        uint32_t *a = from_small ? m->small : m->main, *n = from_small ? &m->n_small : &m->n_main;
        uint32_t t = a[0];
        arr_del(a, n, t);
        if (m->freq[t] > 0) {
            m->freq[t] = from_small ? 0 : m->freq[t] - 1;
            m->q[t] = 2;
            m->main[m->n_main++] = t;
            continue;
        }
        if (m->ev[t] && (!acc || acc[t])) {
            /* put it back where it was: victim() does not move the page it returns */
            memmove(a + 1, a, *n * sizeof *a);
            a[0] = t;
            (*n)++;
            return t;
        }
        a[(*n)++] = t;
        if (++skips >= M_SKIPS) break;
    }
    for (uint32_t i = 0; i < m->n_evl; i++)
        if (!acc || acc[m->evl[i]]) return m->evl[i];
    return PGD_POLICY_NO_PAGE;
}

static void m_remove(void *mp, uint32_t id)
{
    model *m = mp;
    if (m->q[id] == 1) ghost_push(m, m->hash[id]);
    take_out(m, id);
    m->freq[id] = 0;
    m->fresh[id] = 0;
}

static const pf_model s3_model = {m_reset, m_insert, m_hit, m_unref, m_victim, m_remove};

static int test_random_against_model(void)
{
    static model m;
    const uint32_t sizes[] = {1, 7, 40, 150};
    for (uint32_t si = 0; si < 4; si++)
        for (uint64_t seed = 1; seed <= 6; seed++)
            T_OK(pf_random(&pgd__policy_s3fifo, &s3_model, &m, sizes[si], seed, 6000));
    return 0;
}

/* ---- hand-made cases ---- */

typedef struct {
    pgd__alloc al;
    void *st;
} pol;

static const pgd_policy_ops *P = &pgd__policy_s3fifo;

static void ins(pol *p, uint32_t id, uint32_t k)
{
    pgd_policy_page i = pf_info(pf_hash(k));
    P->insert(p->st, id, &i);
}
static void unref(pol *p, uint32_t id)
{
    pgd_policy_page i = pf_info(pf_hash(0));
    P->unreferenced(p->st, id, &i);
}
static void hit(pol *p, uint32_t id)
{
    pgd_policy_page i = pf_info(pf_hash(0));
    P->hit(p->st, id, &i);
}
static uint32_t evict(pol *p, pgd_policy_accept_fn acc, void *ctx)
{
    uint32_t v = P->victim(p->st, acc, ctx);
    if (v != PGD_POLICY_NO_PAGE) P->remove(p->st, v);
    return v;
}

/* Ten pages in a pool of 20 (small target 2): page 0 is matched once, the others never.
 * The one-hit wonders leave from the small queue in FIFO order; page 0 moved to main and
 * goes only once the small queue is under its share. */
static int test_one_hit_wonders_leave_through_small(void)
{
    pol p;
    T_OK(pf_open(P, 20, &p.al, &p.st));
    for (uint32_t i = 0; i < 10; i++)
        ins(&p, i, 100 + i);
    for (uint32_t i = 0; i < 10; i++)
        unref(&p, i);
    T_EQ(P->size(p.st), 10);
    hit(&p, 0);
    T_ASSERT(!P->contains(p.st, 0));
    unref(&p, 0);
    const uint32_t want[] = {1, 2, 3, 4, 5, 6, 7, 8, 0, 9};
    for (uint32_t i = 0; i < 10; i++)
        T_EQ(evict(&p, NULL, NULL), want[i]);
    T_EQ(evict(&p, NULL, NULL), PGD_POLICY_NO_PAGE);
    T_EQ(P->size(p.st), 0);
    P->destroy(p.st);
    return 0;
}

/* A block evicted from the small queue is remembered: registered again, it enters main,
 * so it outlives newer one-hit pages of the small queue. */
static int test_ghost_hit_goes_to_main(void)
{
    pol p;
    T_OK(pf_open(P, 20, &p.al, &p.st));
    for (uint32_t i = 0; i < 5; i++)
        ins(&p, i, 100 + i), unref(&p, i);
    T_EQ(evict(&p, NULL, NULL), 0); /* hash 100 -> ghost */
    ins(&p, 0, 100);                /* ghost hit: main */
    for (uint32_t i = 5; i < 8; i++)
        ins(&p, i, 100 + i);
    unref(&p, 0);
    for (uint32_t i = 5; i < 8; i++)
        unref(&p, i);
    /* small: 1..7 (FIFO); main: 0. Without the ghost, 0 would leave last. */
    const uint32_t want[] = {1, 2, 3, 4, 5, 6, 0, 7};
    for (uint32_t i = 0; i < 8; i++)
        T_EQ(evict(&p, NULL, NULL), want[i]);
    P->destroy(p.st);
    return 0;
}

/* A chain registered root first and released deepest first leaves leaf first, with the
 * leaf-only accept (a page is a leaf when every deeper page of its chain is gone). */
static uint32_t chain_len;
static uint8_t chain_gone[64];
static int accept_chain_leaf(void *ctx, uint32_t id)
{
    (void)ctx;
    return id + 1 == chain_len || chain_gone[id + 1];
}

static int test_chain_leaf_first(void)
{
    pol p;
    chain_len = 30;
    memset(chain_gone, 0, sizeof chain_gone);
    T_OK(pf_open(P, 64, &p.al, &p.st));
    for (uint32_t i = 0; i < chain_len; i++)
        ins(&p, i, 500 + i);
    for (uint32_t i = chain_len; i-- > 0;)
        unref(&p, i);
    for (uint32_t i = chain_len; i-- > 0;) {
        T_EQ(evict(&p, accept_chain_leaf, NULL), i);
        chain_gone[i] = 1;
    }
    P->destroy(p.st);
    return 0;
}

/* Pages in use and pages accept() refuses are passed over; victim still finds the one
 * page that may go, even past the skip bound (the release-order fallback). */
static int accept_one(void *ctx, uint32_t id)
{
    return id == *(uint32_t *)ctx;
}

static int test_skips_and_fallback(void)
{
    pol p;
    T_OK(pf_open(P, 150, &p.al, &p.st));
    for (uint32_t i = 0; i < 150; i++)
        ins(&p, i, 1000 + i);
    for (uint32_t i = 0; i < 150; i++)
        if (i % 3) unref(&p, i); /* a third stays in use */
    T_EQ(P->size(p.st), 100);
    uint32_t want = 149;
    T_EQ(P->victim(p.st, accept_one, &want), 149);
    want = 3; /* in use */
    T_EQ(P->victim(p.st, accept_one, &want), PGD_POLICY_NO_PAGE);
    T_EQ(P->size(p.st), 100); /* victim() changed nothing in the set */
    for (uint32_t i = 0; i < 150; i++)
        T_EQ(!!P->contains(p.st, i), i % 3 != 0);
    /* removing a page in use takes it out of the queues; unknown ids are no-ops */
    P->remove(p.st, 3);
    P->remove(p.st, 100000);
    T_EQ(P->size(p.st), 100);
    P->destroy(p.st);
    return 0;
}

static int test_lookup(void)
{
    pgd_policy_kind k;
    T_ASSERT(pgd_policy_builtin(PGD_POLICY_S3FIFO) == &pgd__policy_s3fifo);
    T_OK(pgd_policy_from_name("s3fifo", &k));
    T_EQ(k, PGD_POLICY_S3FIFO);
    T_ASSERT(strcmp(pgd_policy_name(PGD_POLICY_S3FIFO), "s3fifo") == 0);
    T_ASSERT(strcmp(pgd__policy_s3fifo.name, "s3fifo") == 0);
    /* a zero-page pool is valid (nothing to evict) */
    pol p;
    T_OK(pf_open(P, 0, &p.al, &p.st));
    T_EQ(P->victim(p.st, NULL, NULL), PGD_POLICY_NO_PAGE);
    T_EQ(P->size(p.st), 0);
    P->destroy(p.st);
    return 0;
}

int main(void)
{
    T_RUN(test_lookup);
    T_RUN(test_one_hit_wonders_leave_through_small);
    T_RUN(test_ghost_hit_goes_to_main);
    T_RUN(test_chain_leaf_first);
    T_RUN(test_skips_and_fallback);
    T_RUN(test_random_against_model);
    T_DONE();
}
