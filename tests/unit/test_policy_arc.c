/* SPDX-License-Identifier: MIT */
/*
 * test_policy_arc.c - the ARC policy (src/policy/arc.c) against a brute-force model of it
 * written here with arrays and linear scans, on random cache-shaped operation sequences
 * (policy_fixture.h), plus hand-made cases: p adapts to ghost hits in B1 and B2, matched
 * pages outlive a scan of one-use pages, chains leave leaf first, and lookup by name.
 */
#include <pagoda/policy.h>

#include "pgd_int.h"
#include "policy_fixture.h"
#include "t.h"

/* ---- the reference model: lists as arrays, [0] the LRU / oldest end ---- */

#define M_SKIPS 64

typedef struct model {
    uint32_t n, p;
    uint32_t t[3][PF_MAX], nt[3]; /* t[1] = T1, t[2] = T2 */
    uint32_t evl[PF_MAX], n_evl;
    pgd_hash b[2][PF_MAX]; /* B1, B2 */
    uint32_t nb[2];
    uint8_t l[PF_MAX], ev[PF_MAX];
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

static int ghost_find(const model *m, pgd_hash h, int *at)
{
    for (int g = 0; g < 2; g++)
        for (uint32_t i = 0; i < m->nb[g]; i++)
            if (m->b[g][i].lo == h.lo && m->b[g][i].hi == h.hi) {
                *at = (int)i;
                return g;
            }
    return -1;
}

static void ghost_del_at(model *m, int g, uint32_t i)
{
    memmove(m->b[g] + i, m->b[g] + i + 1, (m->nb[g] - i - 1) * sizeof m->b[g][0]);
    m->nb[g]--;
}

static void ghost_push(model *m, int g, pgd_hash h)
{
    int at, f = ghost_find(m, h, &at);
    if (f >= 0) ghost_del_at(m, f, (uint32_t)at);
    uint32_t cap = m->n ? m->n : 1;
    if (m->nb[0] + m->nb[1] == cap) ghost_del_at(m, m->nb[g] ? g : !g, 0);
    m->b[g][m->nb[g]++] = h;
}

static void move_to(model *m, uint32_t id, int to)
{
    if (m->l[id]) arr_del(m->t[m->l[id]], &m->nt[m->l[id]], id);
    m->l[id] = (uint8_t)to;
    m->t[to][m->nt[to]++] = id;
}

static void take_out(model *m, uint32_t id)
{
    if (m->l[id]) arr_del(m->t[m->l[id]], &m->nt[m->l[id]], id);
    m->l[id] = 0;
    arr_del(m->evl, &m->n_evl, id);
    m->ev[id] = 0;
}

static void m_reset(void *mp, uint32_t n)
{
    model *m = mp;
    memset(m, 0, sizeof *m);
    m->n = n;
}

static uint32_t max1(uint32_t x)
{
    return x > 1 ? x : 1;
}

static void m_insert(void *mp, uint32_t id, pgd_hash h)
{
    model *m = mp;
    take_out(m, id);
    m->hash[id] = h;
    int at, g = ghost_find(m, h, &at);
    if (g == 0) {
        m->p += max1(m->nb[1] / m->nb[0]);
        if (m->p > m->n) m->p = m->n;
    } else if (g == 1) {
        uint32_t d = max1(m->nb[0] / m->nb[1]);
        m->p = m->p > d ? m->p - d : 0;
    }
    if (g >= 0) {
        ghost_del_at(m, g, (uint32_t)at);
        move_to(m, id, 2);
        return;
    }
    while (m->nb[0] && m->nt[1] + m->nb[0] >= m->n)
        ghost_del_at(m, 0, 0);
    move_to(m, id, 1);
}

static void m_hit(void *mp, uint32_t id)
{
    model *m = mp;
    if (m->l[id]) move_to(m, id, 2);
    arr_del(m->evl, &m->n_evl, id);
    m->ev[id] = 0;
}

static void m_unref(void *mp, uint32_t id)
{
    model *m = mp;
    move_to(m, id, m->l[id] ? m->l[id] : 1);
    m->evl[m->n_evl++] = id;
    m->ev[id] = 1;
}

static uint32_t m_victim(void *mp, const uint8_t *acc)
{
    model *m = mp;
    if (m->n_evl == 0) return PGD_POLICY_NO_PAGE;
    int first = m->nt[1] && (m->nt[1] > m->p || !m->nt[2]) ? 1 : 2;
    uint32_t skips = 0;
    for (int k = 0; k < 2 && skips < M_SKIPS; k++) {
        int li = k == 0 ? first : 3 - first;
        uint32_t len = m->nt[li];
        for (uint32_t w = 0; w < len; w++) {
            uint32_t t = m->t[li][0];
            if (m->ev[t] && (!acc || acc[t])) return t;
            arr_del(m->t[li], &m->nt[li], t);
            m->t[li][m->nt[li]++] = t;
            if (++skips >= M_SKIPS) break;
        }
    }
    for (uint32_t i = 0; i < m->n_evl; i++)
        if (!acc || acc[m->evl[i]]) return m->evl[i];
    return PGD_POLICY_NO_PAGE;
}

static void m_remove(void *mp, uint32_t id)
{
    model *m = mp;
    if (m->l[id]) ghost_push(m, m->l[id] == 1 ? 0 : 1, m->hash[id]);
    take_out(m, id);
}

static const pf_model arc_model = {m_reset, m_insert, m_hit, m_unref, m_victim, m_remove};

static int test_random_against_model(void)
{
    static model m;
    const uint32_t sizes[] = {1, 7, 40, 150};
    for (uint32_t si = 0; si < 4; si++)
        for (uint64_t seed = 1; seed <= 6; seed++)
            T_OK(pf_random(&pgd__policy_arc, &arc_model, &m, sizes[si], seed, 6000));
    return 0;
}

/* ---- hand-made cases ---- */

typedef struct {
    pgd__alloc al;
    void *st;
} pol;

static const pgd_policy_ops *P = &pgd__policy_arc;

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
static uint32_t evict(pol *p)
{
    uint32_t v = P->victim(p->st, NULL, NULL);
    if (v != PGD_POLICY_NO_PAGE) P->remove(p->st, v);
    return v;
}

/* Four pages: A, B matched (T2), C, D used once (T1), p = 0. Evicting C (T1 > p) puts it
 * in B1; registering C again is a B1 hit: p grows to 1, so the next victim comes from T2
 * (A) although T1 still holds D. Registering A again is a B2 hit: p falls back to 0 and
 * T1's D goes next. */
static int test_p_adapts(void)
{
    pol p;
    T_OK(pf_open(P, 4, &p.al, &p.st));
    ins(&p, 0, 10), ins(&p, 1, 11);
    hit(&p, 0), hit(&p, 1);
    unref(&p, 0), unref(&p, 1);
    ins(&p, 2, 12), ins(&p, 3, 13);
    unref(&p, 2), unref(&p, 3);
    T_EQ(evict(&p), 2); /* T1 LRU, hash 12 -> B1 */
    ins(&p, 2, 12);     /* B1 hit: p = 1, C in T2 */
    unref(&p, 2);
    T_EQ(evict(&p), 0); /* |T1| = 1 is not over p: T2's LRU (A), hash 10 -> B2 */
    ins(&p, 0, 10);     /* B2 hit: p = 0 */
    unref(&p, 0);
    T_EQ(evict(&p), 3); /* |T1| = 1 > p: D */
    T_EQ(P->size(p.st), 3);
    P->destroy(p.st);
    return 0;
}

/* Pages matched again (T2) outlive a long scan of one-use pages (T1), unlike LRU. */
static int test_scan_resistance(void)
{
    pol p;
    T_OK(pf_open(P, 20, &p.al, &p.st));
    for (uint32_t i = 0; i < 5; i++)
        ins(&p, i, 100 + i), hit(&p, i), unref(&p, i);
    uint32_t k = 200;
    for (int round = 0; round < 40; round++) { /* fill the rest, evict, refill */
        for (uint32_t i = 5; i < 20; i++) {
            if (P->contains(p.st, i)) continue;
            ins(&p, i, k++), unref(&p, i);
        }
        uint32_t v = evict(&p);
        T_ASSERT(v >= 5);
    }
    for (uint32_t i = 0; i < 5; i++)
        T_ASSERT(P->contains(p.st, i));
    P->destroy(p.st);
    return 0;
}

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
        uint32_t v = P->victim(p.st, accept_chain_leaf, NULL);
        T_EQ(v, i);
        P->remove(p.st, v);
        chain_gone[i] = 1;
    }
    P->destroy(p.st);
    return 0;
}

static int test_lookup(void)
{
    pgd_policy_kind k;
    T_ASSERT(pgd_policy_builtin(PGD_POLICY_ARC) == &pgd__policy_arc);
    T_OK(pgd_policy_from_name("arc", &k));
    T_EQ(k, PGD_POLICY_ARC);
    T_ASSERT(strcmp(pgd_policy_name(PGD_POLICY_ARC), "arc") == 0);
    pol p;
    T_OK(pf_open(P, 0, &p.al, &p.st));
    T_EQ(P->victim(p.st, NULL, NULL), PGD_POLICY_NO_PAGE);
    P->destroy(p.st);
    return 0;
}

int main(void)
{
    T_RUN(test_lookup);
    T_RUN(test_p_adapts);
    T_RUN(test_scan_resistance);
    T_RUN(test_chain_leaf_first);
    T_RUN(test_random_against_model);
    T_DONE();
}
