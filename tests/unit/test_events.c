/* SPDX-License-Identifier: MIT */
/*
 * test_events.c - prefix-index events (cache.h, pgd_cache_params.on_register / on_evict)
 * through the public API. A model of the index, fed by the events alone, checks that:
 *   - on_register matches the sequence's chain: hash = the block hash of the page
 *     (pgd_cache_hash_tokens), parent = the previous block's hash ({0, 0} at depth 0),
 *     depth = the page's index, page = the sequence's page;
 *   - on_evict reports every registered page exactly once, leaves first (no live child in
 *     the model), with its payload still readable (K/V read through pgd_pool_k / v in the
 *     callback equal the values written for the block's tokens);
 *   - unindexed pages (partial pages, dedup copies, truncated pages) give no event;
 *   - the stats agree (n_pages_cached = live entries, n_registered / n_evictions = events).
 * A randomized workload (create / match / match_hashed / grow + write + commit /
 * commit_hashed / fork / truncate / destroy / evict / clear, two tenants, shared prefixes,
 * a pool small enough to evict) runs pgd_cache_check after each step.
 * PGD_TEST_SEED=n runs one seed.
 */
#include <pagoda/cache.h>

#include "t.h"

enum { PT = 4, HD = 2, N_PAGES = 24, MAXLEN = 40, MAXSEQ = 5, MAXEV = 64, MODEL = 512 };

static const uint8_t key[16] = "events-test-key";

/* ---- event log (filled in the callbacks, checked after each call) ---- */

typedef struct {
    int kind; /* 'r' or 'e' */
    pgd_hash hash, parent;
    uint32_t depth, page;
    float k[PT * HD], v[PT * HD]; /* evict: the payload as the callback read it */
} event;

typedef struct {
    pgd_cache *c;
    uint32_t n;
    event ev[MAXEV];
    int overflow;
} evlog;

static void on_register(void *ud, pgd_hash hash, pgd_hash parent, uint32_t depth, uint32_t page)
{
    evlog *l = ud;
    if (l->n == MAXEV) {
        l->overflow = 1;
        return;
    }
    event *e = &l->ev[l->n++];
    e->kind = 'r';
    e->hash = hash;
    e->parent = parent;
    e->depth = depth;
    e->page = page;
}

static void on_evict(void *ud, pgd_hash hash, uint32_t page)
{
    evlog *l = ud;
    if (l->n == MAXEV) {
        l->overflow = 1;
        return;
    }
    event *e = &l->ev[l->n++];
    e->kind = 'e';
    e->hash = hash;
    e->page = page;
    /* The payload is still there: read it through the public pool accessors. */
    pgd_pool *pool = pgd_cache_pool(l->c);
    memcpy(e->k, pgd_pool_k(pool, page, 0, 0), sizeof e->k);
    memcpy(e->v, pgd_pool_v(pool, page, 0, 0), sizeof e->v);
}

static void log_stderr(void *ud, int level, const char *msg)
{
    (void)ud;
    if (level <= PGD_LOG_WARN) fprintf(stderr, "  [pagoda %d] %s\n", level, msg);
}

static pgd_cache *make_cache(evlog *l, uint32_t n_pages)
{
    pgd_cache_params p = pgd_cache_default_params();
    p.pool.n_layers = 1;
    p.pool.n_kv_heads = 1;
    p.pool.head_dim = HD;
    p.pool.page_tokens = PT;
    p.pool.kv_type = PGD_KV_F32;
    p.pool.capacity_pages = n_pages;
    p.hash_key = key;
    p.hash_key_len = sizeof key;
    p.log = log_stderr;
    p.on_register = on_register;
    p.on_evict = on_evict;
    p.event_ud = l;
    memset(l, 0, sizeof *l);
    if (pgd_cache_create(&p, &l->c) != PGD_OK) return NULL;
    return l->c;
}

/* K and V of position pos holding token tok for tenant salt: what on_evict must read. */
static void kv_of(int32_t tok, uint32_t pos, int salt, float *k, float *v)
{
    k[0] = (float)tok;
    k[1] = (float)pos;
    v[0] = (float)-tok;
    v[1] = (float)(salt * 1000 + (int)pos);
}

/* ---- the model: live index entries, learned from the events ---- */

typedef struct {
    int live;
    pgd_hash hash, parent;
    uint32_t depth, page;
    int salt;
    int32_t toks[PT]; /* the block's tokens */
} mentry;

typedef struct {
    mentry e[MODEL];
    uint32_t n;
    uint64_t n_reg, n_ev;
} model;

static mentry *m_find(model *m, pgd_hash h)
{
    for (uint32_t i = 0; i < m->n; i++)
        if (m->e[i].live && pgd_hash_eq(m->e[i].hash, h)) return &m->e[i];
    return NULL;
}

static uint32_t m_live(const model *m)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < m->n; i++)
        n += m->e[i].live;
    return n;
}

/* A sequence as the test sees it. */
typedef struct {
    pgd_seq *s;
    int salt;
    uint32_t len, nc, n_tok;
    int32_t t[MAXLEN];
    pgd_hash h[MAXLEN / PT]; /* pgd_cache_hash_tokens of t: what the scheduler keeps */
    uint32_t n_h;
} tseq;

static const char *salt_str(int salt)
{
    return salt ? "tenant-b" : "tenant-a";
}

static const pgd_hash zero_hash = {0, 0};

/* Checks the events logged since the last call. q is the sequence whose commit may have
 * registered pages (NULL if the call could not register), pages [k0, k1) of it. */
static int drain(evlog *l, model *m, const tseq *q, uint32_t k0, uint32_t k1)
{
    T_ASSERT(!l->overflow);
    for (uint32_t i = 0; i < l->n; i++) {
        const event *e = &l->ev[i];
        if (e->kind == 'r') {
            T_ASSERT(q != NULL);
            T_ASSERT(m_find(m, e->hash) == NULL); /* registered once while cached */
            uint32_t k = e->depth;
            T_ASSERT(k >= k0 && k < k1);
            T_ASSERT(pgd_hash_eq(e->hash, q->h[k]));
            T_ASSERT(pgd_hash_eq(e->parent, k ? q->h[k - 1] : zero_hash));
            if (k) {
                mentry *p = m_find(m, e->parent);
                T_ASSERT(p != NULL && p->depth + 1 == k);
            }
            const uint32_t *ids;
            uint32_t np = pgd_seq_pages(l->c, q->s, &ids);
            T_ASSERT(k < np);
            T_EQ(e->page, ids[k]);
            T_ASSERT(m->n < MODEL);
            mentry *n = &m->e[m->n++];
            n->live = 1;
            n->hash = e->hash;
            n->parent = e->parent;
            n->depth = k;
            n->page = e->page;
            n->salt = q->salt;
            memcpy(n->toks, q->t + k * PT, sizeof n->toks);
            m->n_reg++;
        } else {
            mentry *x = m_find(m, e->hash);
            T_ASSERT(x != NULL); /* indexed, and not reported before */
            T_EQ(e->page, x->page);
            for (uint32_t j = 0; j < m->n; j++) /* leaves first */
                T_ASSERT(
                    !(m->e[j].live && m->e[j].depth > 0 && pgd_hash_eq(m->e[j].parent, x->hash)));
            for (uint32_t s = 0; s < PT; s++) {
                float k[HD], v[HD];
                kv_of(x->toks[s], x->depth * PT + s, x->salt, k, v);
                T_ASSERT(memcmp(k, e->k + s * HD, sizeof k) == 0);
                T_ASSERT(memcmp(v, e->v + s * HD, sizeof v) == 0);
            }
            x->live = 0;
            m->n_ev++;
        }
    }
    l->n = 0;
    /* compact dead entries now and then */
    if (m->n > MODEL - 64) {
        uint32_t w = 0;
        for (uint32_t i = 0; i < m->n; i++)
            if (m->e[i].live) m->e[w++] = m->e[i];
        m->n = w;
    }
    pgd_cache_stats st;
    pgd_cache_get_stats(l->c, &st);
    T_EQ(st.n_pages_cached, m_live(m));
    T_EQ(st.n_registered, m->n_reg);
    T_EQ(st.n_evictions, m->n_ev);
    T_EQ(pgd_cache_check(l->c), PGD_OK);
    return 0;
}

/* Writes K/V of positions [pos0, pos0 + n) of q. */
static int write_kv(pgd_cache *c, tseq *q, uint32_t pos0, uint32_t n)
{
    float k[MAXLEN * HD], v[MAXLEN * HD];
    for (uint32_t i = 0; i < n; i++)
        kv_of(q->t[pos0 + i], pos0 + i, q->salt, k + i * HD, v + i * HD);
    return pgd_seq_write_kv(c, q->s, pos0, n, 0, k, v);
}

/* ---- deterministic cases ---- */

/* A three-page chain: three register events in chain order, then (after release) three
 * evict events leaf first, payload intact. A partial page and a dedup copy give none. */
static int test_chain_events(void)
{
    evlog l;
    model m;
    memset(&m, 0, sizeof m);
    pgd_cache *c = make_cache(&l, N_PAGES);
    T_ASSERT(c != NULL);
    tseq q;
    memset(&q, 0, sizeof q);
    q.n_tok = 3 * PT + 2;
    for (uint32_t i = 0; i < q.n_tok; i++)
        q.t[i] = 500 + (int32_t)i;
    q.n_h = (uint32_t)pgd_cache_hash_tokens(c, salt_str(0), 8, q.t, q.n_tok, q.h, MAXLEN / PT);
    T_EQ(q.n_h, 3);
    T_OK(pgd_seq_create(c, salt_str(0), 8, &q.s));
    T_OK(pgd_seq_grow(c, q.s, q.n_tok));
    T_OK(write_kv(c, &q, 0, q.n_tok));
    T_EQ(pgd_seq_commit(c, q.s, q.t, q.n_tok), 3);
    T_EQ(l.n, 3);
    for (uint32_t k = 0; k < 3; k++) {
        T_EQ(l.ev[k].kind, 'r');
        T_EQ(l.ev[k].depth, k);
    }
    T_EQ(drain(&l, &m, &q, 0, 3), 0);

    /* A second sequence computes the same pages: dedup, no event (its copies were never
     * indexed), and its partial page gives none either. */
    tseq r = q;
    T_OK(pgd_seq_create(c, salt_str(0), 8, &r.s));
    T_OK(pgd_seq_grow(c, r.s, r.n_tok));
    T_OK(write_kv(c, &r, 0, r.n_tok));
    T_EQ(pgd_seq_commit(c, r.s, r.t, r.n_tok), 0);
    T_EQ(l.n, 0);
    pgd_seq_destroy(c, r.s);
    pgd_seq_destroy(c, q.s);
    T_EQ(l.n, 0); /* releasing is not evicting */
    T_EQ(drain(&l, &m, NULL, 0, 0), 0);

    T_EQ(pgd_cache_evict(c, 1), 1);
    T_EQ(l.n, 1);
    T_ASSERT(pgd_hash_eq(l.ev[0].hash, q.h[2])); /* the leaf */
    T_EQ(drain(&l, &m, NULL, 0, 0), 0);
    T_EQ(pgd_cache_clear(c), 2);
    T_EQ(l.n, 2);
    T_ASSERT(pgd_hash_eq(l.ev[0].hash, q.h[1]));
    T_ASSERT(pgd_hash_eq(l.ev[1].hash, q.h[0]));
    T_EQ(drain(&l, &m, NULL, 0, 0), 0);
    T_EQ(m_live(&m), 0);
    T_EQ(pgd_cache_clear(c), 0);
    T_EQ(l.n, 0);
    pgd_cache_destroy(c);
    return 0;
}

/* Pages evicted by an allocation (grow on a full pool) are reported before reuse: the
 * callback still reads the old payload, although the page is handed out right after. */
static int test_evict_on_grow(void)
{
    evlog l;
    model m;
    memset(&m, 0, sizeof m);
    pgd_cache *c = make_cache(&l, 4);
    T_ASSERT(c != NULL);
    tseq q;
    memset(&q, 0, sizeof q);
    q.n_tok = 4 * PT;
    for (uint32_t i = 0; i < q.n_tok; i++)
        q.t[i] = 9000 + (int32_t)i;
    q.n_h = (uint32_t)pgd_cache_hash_tokens(c, salt_str(1), 8, q.t, q.n_tok, q.h, MAXLEN / PT);
    q.salt = 1;
    T_OK(pgd_seq_create(c, salt_str(1), 8, &q.s));
    T_OK(pgd_seq_grow(c, q.s, q.n_tok));
    T_OK(write_kv(c, &q, 0, q.n_tok));
    T_EQ(pgd_seq_commit_hashed(c, q.s, q.t, q.n_tok, q.h, q.n_h), 4);
    T_EQ(drain(&l, &m, &q, 0, 4), 0);
    pgd_seq_destroy(c, q.s);

    tseq r;
    memset(&r, 0, sizeof r);
    r.n_tok = 3 * PT;
    for (uint32_t i = 0; i < r.n_tok; i++)
        r.t[i] = 7 + (int32_t)i;
    T_OK(pgd_seq_create(c, NULL, 0, &r.s));
    T_OK(pgd_seq_grow(c, r.s, r.n_tok)); /* evicts the chain's three deepest pages */
    T_EQ(l.n, 3);
    T_ASSERT(pgd_hash_eq(l.ev[0].hash, q.h[3]));
    T_ASSERT(pgd_hash_eq(l.ev[1].hash, q.h[2]));
    T_ASSERT(pgd_hash_eq(l.ev[2].hash, q.h[1]));
    T_EQ(drain(&l, &m, NULL, 0, 0), 0);
    pgd_seq_destroy(c, r.s); /* never committed: no event */
    T_EQ(pgd_cache_clear(c), 1);
    T_EQ(drain(&l, &m, NULL, 0, 0), 0);
    T_EQ(m_live(&m), 0);
    pgd_cache_destroy(c);
    return 0;
}

/* ---- randomized workload ---- */

static void make_tokens(tseq *q, uint64_t *rng, const int32_t streams[2][MAXLEN])
{
    q->n_tok = 2 + (uint32_t)(t_rand(rng) % (MAXLEN - 2));
    const int32_t *src = streams[t_rand(rng) % 2];
    uint32_t diverge = (uint32_t)(t_rand(rng) % (MAXLEN + 8));
    for (uint32_t i = 0; i < q->n_tok; i++)
        q->t[i] = i < diverge ? src[i] : (int32_t)(t_rand(rng) % 5000);
}

static int random_run(uint64_t seed, int steps)
{
    evlog l;
    static model m;
    memset(&m, 0, sizeof m);
    pgd_cache *c = make_cache(&l, N_PAGES);
    T_ASSERT(c != NULL);
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 11;
    int32_t streams[2][MAXLEN];
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < MAXLEN; i++)
            streams[s][i] = 100 * s + i;
    tseq seqs[MAXSEQ];
    memset(seqs, 0, sizeof seqs);

    for (int step = 0; step < steps; step++) {
        tseq *q = &seqs[t_rand(&rng) % MAXSEQ];
        uint32_t op = (uint32_t)(t_rand(&rng) % 100);
        uint32_t k0 = 0, k1 = 0;
        const tseq *reg = NULL;
        if (!q->s) {
            /* create, then maybe match (tokens, or tokens + precomputed hashes) */
            q->salt = (int)(t_rand(&rng) % 2);
            make_tokens(q, &rng, (const int32_t(*)[MAXLEN])streams);
            q->n_h = (uint32_t)pgd_cache_hash_tokens(c, salt_str(q->salt), 8, q->t, q->n_tok, q->h,
                                                     MAXLEN / PT);
            q->len = q->nc = 0;
            if (pgd_seq_create(c, salt_str(q->salt), 8, &q->s) != PGD_OK) T_FAIL("create");
            if (op < 70) {
                uint32_t n = (uint32_t)(t_rand(&rng) % (q->n_tok + 1));
                int64_t mm = op < 35 ? pgd_seq_match(c, q->s, q->t, n)
                                     : pgd_seq_match_hashed(c, q->s, q->t, n, q->h, q->n_h);
                T_OK(mm);
                q->len = q->nc = (uint32_t)mm;
            }
        } else if (op < 45) {
            /* grow, write, commit (plain or with the precomputed hashes) */
            uint32_t room = q->n_tok - q->nc;
            if (room) {
                uint32_t n = 1 + (uint32_t)(t_rand(&rng) % room);
                uint32_t need = q->nc + n > q->len ? q->nc + n - q->len : 0;
                int rc = pgd_seq_grow(c, q->s, need);
                if (rc == PGD_OK) q->len += need;
                /* A write into a page shared with a fork copies it first: ENOSPC when the
                 * pool has nothing left; then nothing is committed. */
                if (rc == PGD_OK) rc = write_kv(c, q, q->nc, n);
                if (rc == PGD_OK) {
                    k0 = q->nc / PT;
                    int64_t cm = t_rand(&rng) % 2 ? pgd_seq_commit(c, q->s, q->t + q->nc, n)
                                                  : pgd_seq_commit_hashed(c, q->s, q->t + q->nc, n,
                                                                          q->h, q->n_h);
                    T_OK(cm);
                    q->nc += n;
                    k1 = q->nc / PT;
                    reg = q;
                } else {
                    T_EQ(rc, PGD_ENOSPC);
                }
            }
        } else if (op < 55) {
            /* fork into a free slot (only when all but the last page are committed) */
            tseq *f = NULL;
            for (int i = 0; i < MAXSEQ && !f; i++)
                if (!seqs[i].s) f = &seqs[i];
            if (f && (q->len + PT - 1) / PT <= q->nc / PT + 1) {
                *f = *q;
                T_OK(pgd_seq_fork(c, q->s, &f->s));
            }
        } else if (op < 62) {
            uint32_t n = q->nc + (uint32_t)(t_rand(&rng) % (q->len - q->nc + 1));
            T_OK(pgd_seq_truncate(c, q->s, n));
            q->len = n;
        } else if (op < 80) {
            pgd_seq_destroy(c, q->s);
            q->s = NULL;
        } else if (op < 95) {
            T_OK(pgd_cache_evict(c, 1 + (uint32_t)(t_rand(&rng) % 4)));
        } else {
            T_OK(pgd_cache_clear(c));
        }
        if (drain(&l, &m, reg, k0, k1) != 0)
            T_FAIL("seed %llu step %d", (unsigned long long)seed, step);
    }
    for (int i = 0; i < MAXSEQ; i++)
        pgd_seq_destroy(c, seqs[i].s);
    T_OK(pgd_cache_clear(c));
    T_EQ(drain(&l, &m, NULL, 0, 0), 0);
    T_EQ(m_live(&m), 0); /* every registered page was reported exactly once */
    T_EQ(m.n_reg, m.n_ev);
    pgd_cache_destroy(c);
    return 0;
}

static int test_random_workload(void)
{
    const char *one = getenv("PGD_TEST_SEED");
    if (one) return random_run(strtoull(one, NULL, 10), 20000);
    for (uint64_t seed = 1; seed <= 12; seed++)
        if (random_run(seed, 3000) != 0) T_FAIL("seed %llu", (unsigned long long)seed);
    return 0;
}

int main(void)
{
    T_RUN(test_chain_events);
    T_RUN(test_evict_on_grow);
    T_RUN(test_random_workload);
    T_DONE();
}
