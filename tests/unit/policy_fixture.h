/* SPDX-License-Identifier: MIT */
/*
 * policy_fixture.h - a random driver that runs an eviction policy (its ops table) next to a
 * brute-force reference model written in the test, on cache-shaped operation sequences:
 * insert (a free page with a block hash, referenced), hit, unreferenced (last reference),
 * victim with a random accept set (then remove, as the cache evicts, or not), and remove of
 * any cached page. After every step it checks victim's choice against the model's, and
 * contains()/size() against the driver's own evictable set. Used by test_policy_s3fifo.c
 * and test_policy_arc.c.
 */
#ifndef PGD_POLICY_FIXTURE_H
#define PGD_POLICY_FIXTURE_H

#include <pagoda/policy.h>

#include "pgd_int.h"
#include "t.h"

#define PF_MAX 160 /* pages; hashes: 3 x pages */

/* The reference model of a policy: the same operations on plain arrays. */
typedef struct pf_model {
    void (*reset)(void *m, uint32_t n);
    void (*insert)(void *m, uint32_t id, pgd_hash h);
    void (*hit)(void *m, uint32_t id);
    void (*unref)(void *m, uint32_t id);
    uint32_t (*victim)(void *m, const uint8_t *acc); /* acc NULL: every page accepted */
    void (*remove)(void *m, uint32_t id);
} pf_model;

static pgd_hash pf_hash(uint32_t k)
{
    pgd_hash h = {(uint64_t)k * 0x9E3779B97F4A7C15ull + 7, k};
    return h;
}

static pgd_policy_page pf_info(pgd_hash h)
{
    pgd_policy_page i;
    memset(&i, 0, sizeof i);
    i.hash = h;
    i.priority = PGD_PRIORITY_DEFAULT;
    return i;
}

static int pf_accept(void *ctx, uint32_t id)
{
    const uint8_t *acc = ctx;
    return acc[id];
}

static int pf_open(const pgd_policy_ops *ops, uint32_t n, pgd__alloc *al, void **st)
{
    pgd__alloc_init(al, NULL);
    *st = NULL;
    pgd_policy_init init = {.n_pages = n, .alloc = &al->a, .page_bytes = 1};
    return ops->create(&init, st);
}

/* Runs steps random operations on n pages (n <= PF_MAX). Returns 0 or -1 (reported). */
static int pf_random(const pgd_policy_ops *ops, const pf_model *mo, void *m, uint32_t n,
                     uint64_t seed, int steps)
{
    static uint32_t refs[PF_MAX], hk[PF_MAX];
    static uint8_t cached[PF_MAX], evictable[PF_MAX], used[3 * PF_MAX], acc[PF_MAX];
    uint64_t rs = seed * 0x2545F4914F6CDD1Dull + 1;
    uint32_t nh = 3 * n, n_victims = 0, n_fallback_checks = 0;
    pgd__alloc al;
    void *st;
    T_ASSERT(n <= PF_MAX);
    T_OK(pf_open(ops, n, &al, &st));
    mo->reset(m, n);
    memset(refs, 0, sizeof refs);
    memset(cached, 0, sizeof cached);
    memset(evictable, 0, sizeof evictable);
    memset(used, 0, sizeof used);
    for (int step = 0; step < steps; step++) {
        uint32_t r = (uint32_t)(t_rand(&rs) % 100), id = (uint32_t)(t_rand(&rs) % n);
        if (r < 30) { /* insert: a free page, a hash no cached page has */
            uint32_t k = (uint32_t)(t_rand(&rs) % nh);
            if (cached[id] || used[k]) continue;
            cached[id] = 1, used[k] = 1, hk[id] = k, refs[id] = 1;
            pgd_policy_page i = pf_info(pf_hash(k));
            ops->insert(st, id, &i);
            mo->insert(m, id, pf_hash(k));
        } else if (r < 45) { /* hit: a sequence takes a cached page */
            if (!cached[id]) continue;
            refs[id]++;
            evictable[id] = 0;
            pgd_policy_page i = pf_info(pf_hash(hk[id]));
            ops->hit(st, id, &i);
            mo->hit(m, id);
        } else if (r < 70) { /* a sequence drops its reference */
            if (!cached[id] || !refs[id]) continue;
            if (--refs[id]) continue;
            evictable[id] = 1;
            pgd_policy_page i = pf_info(pf_hash(hk[id]));
            ops->unreferenced(st, id, &i);
            mo->unref(m, id);
        } else if (r < 95) { /* victim, with some accept set */
            uint32_t mode = (uint32_t)(t_rand(&rs) % 5), any = 0;
            for (uint32_t j = 0; j < n; j++) {
                uint64_t x = t_rand(&rs) % 10;
                acc[j] = mode <= 1 ? 1 : mode == 2 ? x < 5 : mode == 3 ? x < 1 : 0;
                any |= acc[j] && evictable[j];
            }
            uint32_t v = mode == 0 ? ops->victim(st, NULL, NULL) : ops->victim(st, pf_accept, acc);
            uint32_t want = mo->victim(m, mode == 0 ? NULL : acc);
            if (v != want)
                T_FAIL("seed %llu step %d n %u: victim %u, model %u", (unsigned long long)seed,
                       step, n, v, want);
            if (!any) {
                T_EQ(v, PGD_POLICY_NO_PAGE);
                continue;
            }
            T_ASSERT(v < n && evictable[v] && acc[v]);
            n_victims++;
            n_fallback_checks += mode == 3;
            if (t_rand(&rs) % 100 < 85) { /* evicted: the cache removes it */
                ops->remove(st, v);
                mo->remove(m, v);
                cached[v] = evictable[v] = 0, used[hk[v]] = 0;
            }
        } else { /* the cache is done with a cached page, referenced or not */
            if (!cached[id]) continue;
            ops->remove(st, id);
            mo->remove(m, id);
            cached[id] = evictable[id] = 0, used[hk[id]] = 0, refs[id] = 0;
        }
        uint32_t size = 0;
        for (uint32_t j = 0; j < n; j++) {
            size += evictable[j];
            if (!!ops->contains(st, j) != evictable[j])
                T_FAIL("seed %llu step %d: contains(%u) != %u", (unsigned long long)seed, step, j,
                       evictable[j]);
        }
        T_EQ(ops->size(st), size);
    }
    ops->destroy(st);
    T_ASSERT(n_victims > 0);
    (void)n_fallback_checks;
    return 0;
}

#endif /* PGD_POLICY_FIXTURE_H */
