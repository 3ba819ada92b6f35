/* SPDX-License-Identifier: MIT */
/*
 * test_policy_priority.c - the priority / TTL / next-use policy (src/policy/priority.c)
 * through its ops table: TTL expiry with an injected clock (an expired page goes first
 * whatever its priority, also when it expired while waiting), priority order, hint order,
 * and a brute-force reference (plain arrays, linear scans, the order of the file header)
 * on random operation sequences with random accept sets: victim() equal at every step,
 * also with the caller's leaf() calls on random chains (accept = the leaves).
 */
#include <pagoda/policy.h>

#include "pgd_int.h"
#include "t.h"
#include "t_alloc.h"

static uint64_t fake_clock(void *ud)
{
    return *(const uint64_t *)ud;
}

static int accept_all(void *ctx, uint32_t id)
{
    (void)ctx, (void)id;
    return 1;
}

/* ctx: a uint64_t mask of accepted ids (ids < 64). */
static int accept_mask(void *ctx, uint32_t id)
{
    return id < 64 && ((*(const uint64_t *)ctx >> id) & 1);
}

typedef struct {
    const pgd_policy_ops *ops;
    pgd__alloc al;
    void *st;
    uint64_t now;
} pol;

static int pol_open(pol *p, uint32_t n)
{
    p->ops = pgd_policy_builtin(PGD_POLICY_PRIORITY);
    if (!p->ops) return -1;
    pgd__alloc_init(&p->al, NULL);
    p->st = NULL;
    p->now = 1000;
    pgd_policy_init init = {.n_pages = n,
                            .alloc = &p->al.a,
                            .clock = fake_clock,
                            .clock_ud = &p->now,
                            .page_bytes = 1,
                            .cost = {1, 1}};
    return p->ops->create(&init, &p->st);
}

static pgd_policy_page page(const pol *p, uint32_t prio, uint64_t expires, uint64_t next_use)
{
    pgd_policy_page i;
    memset(&i, 0, sizeof i);
    i.priority = prio;
    i.expires_ns = expires;
    i.next_use_ns = next_use;
    i.now_ns = p->now;
    i.bytes = 1;
    return i;
}

/* insert + unreferenced of id with that retention */
static void release(pol *p, uint32_t id, uint32_t prio, uint64_t expires, uint64_t next_use)
{
    pgd_policy_page i = page(p, prio, expires, next_use);
    p->ops->insert(p->st, id, &i);
    p->ops->unreferenced(p->st, id, &i);
}

static uint32_t evict(pol *p)
{
    uint32_t v = p->ops->victim(p->st, accept_all, NULL);
    if (v != PGD_POLICY_NO_PAGE) p->ops->remove(p->st, v);
    return v;
}

static int test_name(void)
{
    pgd_policy_kind k;
    T_OK(pgd_policy_from_name("priority", &k));
    T_EQ(k, PGD_POLICY_PRIORITY);
    T_ASSERT(strcmp(pgd_policy_name(PGD_POLICY_PRIORITY), "priority") == 0);
    T_ASSERT(pgd_policy_builtin(PGD_POLICY_PRIORITY) == &pgd__policy_priority);
    return 0;
}

/* Lower priority first, LRU within a priority. */
static int test_priority_order(void)
{
    pol p;
    T_OK(pol_open(&p, 16));
    T_EQ(p.ops->victim(p.st, accept_all, NULL), PGD_POLICY_NO_PAGE);
    release(&p, 0, 100, 0, 0);
    release(&p, 1, 35, 0, 0);
    release(&p, 2, 0, 0, 0);
    release(&p, 3, 35, 0, 0);
    release(&p, 4, 0, 0, 0);
    release(&p, 5, 250, 0, 0); /* clamped to 100, released after 0 */
    T_EQ(p.ops->size(p.st), 6);
    T_EQ(evict(&p), 2);
    T_EQ(evict(&p), 4);
    T_EQ(evict(&p), 1);
    T_EQ(evict(&p), 3);
    T_EQ(evict(&p), 0);
    T_EQ(evict(&p), 5);
    T_EQ(evict(&p), PGD_POLICY_NO_PAGE);
    p.ops->destroy(p.st);
    return 0;
}

/* An expired page goes first even with the highest priority, also one that expired while
 * it waited; an unexpired TTL does not change the order. */
static int test_ttl_expiry(void)
{
    pol p;
    T_OK(pol_open(&p, 16));
    release(&p, 0, 100, 1500, 0); /* expires at 1500 */
    release(&p, 1, 10, 0, 0);
    release(&p, 2, 100, 1200, 0); /* expires at 1200 */
    release(&p, 3, 50, 5000, 0);
    T_EQ(p.ops->victim(p.st, accept_all, NULL), 1); /* now 1000: nothing expired */
    p.now = 1200;
    T_EQ(p.ops->victim(p.st, accept_all, NULL), 2); /* 2 expired while it waited */
    p.now = 2000;
    T_EQ(p.ops->victim(p.st, accept_all, NULL), 2); /* earliest expiry first */
    uint64_t no2 = ~(1ull << 2);
    T_EQ(p.ops->victim(p.st, accept_mask, &no2), 0); /* 2 refused: the next expired */
    T_EQ(evict(&p), 2);
    T_EQ(evict(&p), 0);
    T_EQ(evict(&p), 1); /* none expired: priority order */
    T_EQ(evict(&p), 3);
    /* a page released already expired goes first */
    release(&p, 7, 35, 0, 0);
    release(&p, 8, 100, 2000, 0);
    T_EQ(evict(&p), 8);
    /* a hit takes an expired page out; released again with no TTL it is ordinary */
    release(&p, 9, 100, 2001, 0);
    p.now = 3000;
    pgd_policy_page i = page(&p, 100, 0, 0);
    p.ops->hit(p.st, 9, &i);
    T_ASSERT(!p.ops->contains(p.st, 9));
    p.ops->unreferenced(p.st, 9, &i);
    T_EQ(evict(&p), 7);
    T_EQ(evict(&p), 9);
    T_EQ(p.ops->size(p.st), 0);
    p.ops->destroy(p.st);
    return 0;
}

/* Within a priority: unhinted first (a hint in the past counts as none), then the
 * farthest next use first; ties by release order. */
static int test_hint_order(void)
{
    pol p;
    T_OK(pol_open(&p, 16));
    release(&p, 0, 35, 0, 5000);
    release(&p, 1, 35, 0, 0);
    release(&p, 2, 35, 0, 9000);
    release(&p, 3, 35, 0, 500); /* before now: no hint */
    release(&p, 4, 35, 0, 5000);
    release(&p, 5, 20, 0, 99999); /* lower priority wins over any hint */
    T_EQ(evict(&p), 5);
    T_EQ(evict(&p), 1);
    T_EQ(evict(&p), 3);
    T_EQ(evict(&p), 2);
    T_EQ(evict(&p), 0);
    T_EQ(evict(&p), 4);
    p.ops->destroy(p.st);
    return 0;
}

/* ---- the brute-force reference ---- */

enum { N = 48 };

typedef struct {
    int state[N]; /* 0 absent, 1 registered and referenced, 2 evictable */
    uint32_t prio[N];
    int hinted[N];
    uint64_t next_use[N], expires[N], seq[N];
    uint64_t n_released;
} ref;

static int ref_before(const ref *r, uint32_t a, uint32_t b)
{
    if (r->prio[a] != r->prio[b]) return r->prio[a] < r->prio[b];
    if (r->hinted[a] != r->hinted[b]) return !r->hinted[a];
    if (r->hinted[a] && r->next_use[a] != r->next_use[b]) return r->next_use[a] > r->next_use[b];
    if (r->seq[a] != r->seq[b]) return r->seq[a] < r->seq[b];
    return a < b;
}

static uint32_t ref_victim(const ref *r, uint64_t now, uint64_t mask)
{
    uint32_t best = PGD_POLICY_NO_PAGE;
    for (uint32_t i = 0; i < N; i++) { /* expired first: earliest expiry, then released first */
        if (r->state[i] != 2 || !((mask >> i) & 1) || !r->expires[i] || r->expires[i] > now)
            continue;
        if (best == PGD_POLICY_NO_PAGE || r->expires[i] < r->expires[best] ||
            (r->expires[i] == r->expires[best] && r->seq[i] < r->seq[best]))
            best = i;
    }
    if (best != PGD_POLICY_NO_PAGE) return best;
    for (uint32_t i = 0; i < N; i++)
        if (r->state[i] == 2 && ((mask >> i) & 1) &&
            (best == PGD_POLICY_NO_PAGE || ref_before(r, i, best)))
            best = i;
    return best;
}

static int run_random(uint64_t seed, int steps)
{
    static const uint32_t prios[] = {0, 10, 35, 35, 35, 50, 100};
    pol p;
    ref r;
    memset(&r, 0, sizeof r);
    T_OK(pol_open(&p, N));
    for (int step = 0; step < steps; step++) {
        uint32_t id = (uint32_t)(t_rand(&seed) % N), op = (uint32_t)(t_rand(&seed) % 8);
        pgd_policy_page i = page(&p, 0, 0, 0);
        if (op == 0 && r.state[id] == 0) {
            p.ops->insert(p.st, id, &i);
            r.state[id] = 1;
        } else if (op <= 2 && r.state[id] == 1) {
            i.priority = prios[t_rand(&seed) % 7];
            if (t_rand(&seed) % 2) i.expires_ns = p.now - 20 + t_rand(&seed) % 200;
            if (t_rand(&seed) % 2) i.next_use_ns = p.now - 50 + t_rand(&seed) % 8 * 50;
            p.ops->unreferenced(p.st, id, &i);
            r.state[id] = 2;
            r.prio[id] = i.priority;
            r.hinted[id] = i.next_use_ns > p.now;
            r.next_use[id] = i.next_use_ns;
            r.expires[id] = i.expires_ns;
            r.seq[id] = ++r.n_released;
        } else if (op == 3 && r.state[id] != 0) {
            p.ops->hit(p.st, id, &i);
            r.state[id] = 1;
        } else if (op == 4 && r.state[id] != 0 && t_rand(&seed) % 4 == 0) {
            p.ops->remove(p.st, id);
            r.state[id] = 0;
        } else if (op == 5) {
            p.now += t_rand(&seed) % 40;
        } else if (op == 6) { /* evict with a random accept set */
            uint64_t mask = t_rand(&seed) | t_rand(&seed);
            uint32_t v = p.ops->victim(p.st, accept_mask, &mask);
            T_EQ(v, ref_victim(&r, p.now, mask));
            if (v != PGD_POLICY_NO_PAGE) {
                p.ops->remove(p.st, v);
                r.state[v] = 0;
            }
        }
        uint64_t mask = t_rand(&seed);
        T_EQ(p.ops->victim(p.st, accept_all, NULL), ref_victim(&r, p.now, ~0ull));
        T_EQ(p.ops->victim(p.st, accept_mask, &mask), ref_victim(&r, p.now, mask));
        uint32_t n_ev = 0;
        for (uint32_t k = 0; k < N; k++) {
            n_ev += r.state[k] == 2;
            T_EQ(!!p.ops->contains(p.st, k), r.state[k] == 2);
        }
        T_EQ(p.ops->size(p.st), n_ev);
    }
    p.ops->destroy(p.st);
    return 0;
}

static int test_random_against_reference(void)
{
    for (uint64_t seed = 1; seed <= 6; seed++)
        if (run_random(seed * 7919, 5000)) return -1;
    return 0;
}

/* ctx: a counted_mask; counts the calls. */
typedef struct {
    uint64_t mask;
    uint32_t calls;
} counted_mask;

static int accept_counted(void *ctx, uint32_t id)
{
    counted_mask *cm = ctx;
    cm->calls++;
    return accept_mask(&cm->mask, id);
}

/*
 * Random chains as a tier sees them: a fixed forest (parent[] of each page), pages
 * registered in any order (a child before its parent), and the caller's leaf() calls
 * whenever a registered page gains its first registered child or loses its last. The
 * reference knows nothing of leaf(): victim(accept = the leaves, or a random part of them)
 * equals the reference's victim over the same set at every step, expired pages included;
 * an accept set of non-leaves only (no leaf accepted) too (the parked heap). With every
 * leaf accepted (one at least) and nothing expired, victim() asks accept() once.
 */
static int run_leaf(uint64_t seed, int steps)
{
    static const uint32_t prios[] = {0, 10, 35, 35, 35, 50, 100};
    pol p;
    ref r;
    uint32_t parent[N], kids[N]; /* kids: registered children, registered or not */
    memset(&r, 0, sizeof r);
    memset(kids, 0, sizeof kids);
    for (uint32_t id = 0; id < N; id++)
        parent[id] =
            id == 0 || t_rand(&seed) % 4 == 0 ? UINT32_MAX : (uint32_t)(t_rand(&seed) % id);
    T_OK(pol_open(&p, N));
    uint32_t n_parked_victims = 0;
    for (int step = 0; step < steps; step++) {
        uint32_t id = (uint32_t)(t_rand(&seed) % N), op = (uint32_t)(t_rand(&seed) % 8);
        uint32_t up = parent[id];
        pgd_policy_page i = page(&p, 0, 0, 0);
        if (op == 0 && r.state[id] == 0) {
            if (up != UINT32_MAX && kids[up]++ == 0 && r.state[up] != 0) p.ops->leaf(p.st, up, 0);
            p.ops->insert(p.st, id, &i);
            if (kids[id]) p.ops->leaf(p.st, id, 0);
            r.state[id] = 1;
        } else if (op <= 2 && r.state[id] == 1) {
            i.priority = prios[t_rand(&seed) % 7];
            if (t_rand(&seed) % 4 == 0) i.expires_ns = p.now - 20 + t_rand(&seed) % 200;
            if (t_rand(&seed) % 2) i.next_use_ns = p.now - 50 + t_rand(&seed) % 8 * 50;
            p.ops->unreferenced(p.st, id, &i);
            r.state[id] = 2;
            r.prio[id] = i.priority;
            r.hinted[id] = i.next_use_ns > p.now;
            r.next_use[id] = i.next_use_ns;
            r.expires[id] = i.expires_ns;
            r.seq[id] = ++r.n_released;
        } else if (op == 3 && r.state[id] != 0) {
            p.ops->hit(p.st, id, &i);
            r.state[id] = 1;
        } else if (op == 4) {
            p.now += t_rand(&seed) % 40;
        } else if (op >= 5) { /* evict among the leaves, or remove any registered page */
            uint64_t leaves = 0;
            for (uint32_t k = 0; k < N; k++)
                if (r.state[k] == 2 && !kids[k]) leaves |= 1ull << k;
            uint64_t mask = op == 5 ? leaves & (t_rand(&seed) | t_rand(&seed)) : leaves;
            uint32_t v = p.ops->victim(p.st, accept_mask, &mask);
            T_EQ(v, ref_victim(&r, p.now, mask));
            if (op == 7 && r.state[id] != 0) v = id;
            if (v == PGD_POLICY_NO_PAGE) continue;
            p.ops->remove(p.st, v);
            r.state[v] = 0;
            if (parent[v] != UINT32_MAX && --kids[parent[v]] == 0 && r.state[parent[v]] != 0)
                p.ops->leaf(p.st, parent[v], 1);
        }
        uint64_t leaves = 0, inner = 0, expired = 0, mask = t_rand(&seed);
        for (uint32_t k = 0; k < N; k++) {
            if (r.state[k] != 2) continue;
            *(kids[k] ? &inner : &leaves) |= 1ull << k;
            if (r.expires[k] && r.expires[k] <= p.now) expired |= 1ull << k;
        }
        counted_mask cm = {leaves, 0};
        T_EQ(p.ops->victim(p.st, accept_counted, &cm), ref_victim(&r, p.now, leaves));
        T_ASSERT(cm.calls <= 1 || !leaves || expired);
        mask = leaves & mask;
        T_EQ(p.ops->victim(p.st, accept_mask, &mask), ref_victim(&r, p.now, mask));
        if (!leaves && inner) {
            n_parked_victims++;
            T_EQ(p.ops->victim(p.st, accept_mask, &inner), ref_victim(&r, p.now, inner));
        }
        mask = inner & t_rand(&seed);
        if (!leaves) T_EQ(p.ops->victim(p.st, accept_mask, &mask), ref_victim(&r, p.now, mask));
        uint32_t n_ev = 0;
        for (uint32_t k = 0; k < N; k++) {
            n_ev += r.state[k] == 2;
            T_EQ(!!p.ops->contains(p.st, k), r.state[k] == 2);
        }
        T_EQ(p.ops->size(p.st), n_ev);
    }
    p.ops->destroy(p.st);
    T_ASSERT(n_parked_victims > 0);
    return 0;
}

static int test_leaf_op_against_reference(void)
{
    T_ASSERT(pgd_policy_builtin(PGD_POLICY_PRIORITY)->leaf != NULL);
    for (uint64_t seed = 1; seed <= 6; seed++)
        if (run_leaf(seed * 6007, 8000)) return -1;
    return 0;
}

/* Every allocation of create failing in turn: PGD_ENOMEM, *state NULL, nothing leaked. */
static int test_create_oom(void)
{
    static t_counting A;
    const pgd_allocator alloc = T_COUNTING_ALLOCATOR(&A);
    uint64_t now = 1;
    for (long n = 1;; n++) {
        void *st = &A;
        pgd_policy_init init = {.n_pages = 100,
                                .alloc = &alloc,
                                .page_bytes = 1,
                                .clock = fake_clock,
                                .clock_ud = &now};
        t_counting_arm(&A, n);
        int rc = pgd_policy_builtin(PGD_POLICY_PRIORITY)->create(&init, &st);
        A.fail_at = 0;
        if (A.fired) {
            T_EQ(rc, PGD_ENOMEM);
            T_ASSERT(st == NULL);
            T_EQ(A.n_live, 0);
            continue;
        }
        T_OK(rc);
        pgd_policy_builtin(PGD_POLICY_PRIORITY)->destroy(st);
        T_EQ(A.n_live, 0);
        T_ASSERT(n > 2);
        return 0;
    }
}

int main(void)
{
    T_RUN(test_name);
    T_RUN(test_create_oom);
    T_RUN(test_priority_order);
    T_RUN(test_ttl_expiry);
    T_RUN(test_hint_order);
    T_RUN(test_random_against_reference);
    T_RUN(test_leaf_op_against_reference);
    T_DONE();
}
