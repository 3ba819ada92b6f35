/* SPDX-License-Identifier: MIT */
/*
 * test_index.c - the prefix index (index.c) and the keyed chained block hash (util/hash.c),
 * through the internal API of pgd_int.h: entries, locations (pool or tier), a capacity
 * beyond the pool's page count. pgd__index_check() runs after every mutation.
 */
#define XXH_INLINE_ALL
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "pgd_int.h"
#include "t.h"

static void log_stderr(void *ud, int level, const char *msg)
{
    (void)ud;
    fprintf(stderr, "  [log %d] %s\n", level, msg);
}

static const pgd__log test_log = {log_stderr, NULL};

/* A pool location (tier 0). */
static pgd__loc P(uint32_t page_id)
{
    return pgd__loc_pool(page_id);
}

static pgd_hash H(uint64_t lo, uint64_t hi)
{
    pgd_hash h = {lo, hi};
    return h;
}

/* ---- index: basics ---- */

static int test_insert_find_remove(void)
{
    pgd__alloc al;
    pgd__index *ix = NULL;
    pgd__alloc_init(&al, NULL);
    T_OK(pgd__index_create(&al, 8, &ix));
    T_ASSERT(ix != NULL);
    T_EQ(pgd__index_capacity(ix), 8);
    T_EQ(pgd__index_size(ix), 0);
    T_EQ(pgd__index_find(ix, H(1, 2)), PGD__NONE);
    T_EQ(pgd__index_check(ix, &test_log), PGD_OK);

    uint32_t a = pgd__index_insert(ix, H(1, 2), PGD__NONE, P(100));
    T_ASSERT(a != PGD__NONE && a < 8);
    T_EQ(pgd__index_check(ix, &test_log), PGD_OK);
    uint32_t b = pgd__index_insert(ix, H(3, 4), a, P(101));
    T_ASSERT(b != PGD__NONE && b < 8 && b != a);
    T_EQ(pgd__index_check(ix, &test_log), PGD_OK);
    uint32_t c = pgd__index_insert(ix, H(5, 6), a, P(102));
    T_ASSERT(c != PGD__NONE && c != a && c != b);
    uint32_t d = pgd__index_insert(ix, H(7, 8), c, P(103));
    T_ASSERT(d != PGD__NONE);
    T_EQ(pgd__index_check(ix, &test_log), PGD_OK);
    T_EQ(pgd__index_size(ix), 4);

    T_EQ(pgd__index_find(ix, H(1, 2)), a);
    T_EQ(pgd__index_find(ix, H(3, 4)), b);
    T_EQ(pgd__index_find(ix, H(5, 6)), c);
    T_EQ(pgd__index_find(ix, H(7, 8)), d);
    T_EQ(pgd__index_find(ix, H(2, 1)), PGD__NONE);
    T_EQ(pgd__index_find(ix, H(1, 3)), PGD__NONE); /* same lo, other hi */
    T_EQ(pgd__index_find(ix, H(0, 2)), PGD__NONE); /* same hi, other lo */

    const pgd__entry *e = pgd__index_entry(ix, a);
    T_ASSERT(pgd_hash_eq(e->hash, H(1, 2)));
    T_EQ(e->parent, PGD__NONE);
    T_EQ(e->n_children, 2);
    T_EQ(e->loc_id, 100);
    T_EQ(e->depth, 0);
    e = pgd__index_entry(ix, c);
    T_EQ(e->parent, a);
    T_EQ(e->n_children, 1);
    T_EQ(e->loc_id, 102);
    T_EQ(e->depth, 1);
    e = pgd__index_entry(ix, d);
    T_EQ(e->parent, c);
    T_EQ(e->n_children, 0);
    T_EQ(e->depth, 2);
    T_EQ(e->loc_id, 103);

    /* Remove leaves only: d, then c becomes a leaf. */
    pgd__index_remove(ix, d);
    T_EQ(pgd__index_check(ix, &test_log), PGD_OK);
    T_EQ(pgd__index_find(ix, H(7, 8)), PGD__NONE);
    T_EQ(pgd__index_entry(ix, c)->n_children, 0);
    T_EQ(pgd__index_size(ix), 3);
    pgd__index_remove(ix, b);
    T_EQ(pgd__index_check(ix, &test_log), PGD_OK);
    T_EQ(pgd__index_entry(ix, a)->n_children, 1);
    pgd__index_remove(ix, c);
    T_EQ(pgd__index_check(ix, &test_log), PGD_OK);
    T_EQ(pgd__index_entry(ix, a)->n_children, 0);
    pgd__index_remove(ix, a);
    T_EQ(pgd__index_check(ix, &test_log), PGD_OK);
    T_EQ(pgd__index_size(ix), 0);
    T_EQ(pgd__index_find(ix, H(1, 2)), PGD__NONE);
    T_EQ(pgd__index_find(ix, H(5, 6)), PGD__NONE);

    /* Reinsert after removal. */
    a = pgd__index_insert(ix, H(5, 6), PGD__NONE, P(7));
    T_ASSERT(a != PGD__NONE);
    T_EQ(pgd__index_find(ix, H(5, 6)), a);
    T_EQ(pgd__index_entry(ix, a)->loc_id, 7);
    T_EQ(pgd__index_entry(ix, a)->depth, 0);
    T_EQ(pgd__index_entry(ix, a)->n_children, 0);
    T_EQ(pgd__index_check(ix, &test_log), PGD_OK);

    /* Extreme hash values are ordinary keys (replay builds hashes from small ids). */
    uint32_t z = pgd__index_insert(ix, H(0, 0), PGD__NONE, P(1));
    uint32_t o = pgd__index_insert(ix, H(UINT64_MAX, UINT64_MAX), z, P(2));
    T_ASSERT(z != PGD__NONE && o != PGD__NONE && z != o);
    T_EQ(pgd__index_find(ix, H(0, 0)), z);
    T_EQ(pgd__index_find(ix, H(UINT64_MAX, UINT64_MAX)), o);
    T_EQ(pgd__index_check(ix, &test_log), PGD_OK);
    pgd__index_remove(ix, o);
    pgd__index_remove(ix, z);
    T_EQ(pgd__index_find(ix, H(0, 0)), PGD__NONE);
    T_EQ(pgd__index_check(ix, &test_log), PGD_OK);
    pgd__index_destroy(ix);
    pgd__index_destroy(NULL);
    return 0;
}

static int test_full_index(void)
{
    enum { CAP = 64 };
    pgd__alloc al;
    pgd__index *ix;
    uint32_t ids[CAP];
    unsigned char seen[CAP] = {0};
    pgd__alloc_init(&al, NULL);
    T_OK(pgd__index_create(&al, CAP, &ix));
    for (uint32_t i = 0; i < CAP; i++) {
        /* a chain: each entry the child of the previous one */
        ids[i] = pgd__index_insert(ix, H(i * 0x10000u, 42), i ? ids[i - 1] : PGD__NONE, P(i));
        T_ASSERT(ids[i] < CAP && !seen[ids[i]]);
        seen[ids[i]] = 1;
        T_EQ(pgd__index_entry(ix, ids[i])->depth, i);
        T_EQ(pgd__index_check(ix, &test_log), PGD_OK);
    }
    T_EQ(pgd__index_size(ix), CAP);
    T_EQ(pgd__index_insert(ix, H(999, 999), PGD__NONE, P(0)), PGD__NONE);
    T_EQ(pgd__index_insert(ix, H(998, 999), ids[CAP - 1], P(0)), PGD__NONE);
    T_EQ(pgd__index_size(ix), CAP);
    T_EQ(pgd__index_check(ix, &test_log), PGD_OK);
    for (uint32_t i = 0; i < CAP; i++)
        T_EQ(pgd__index_find(ix, H(i * 0x10000u, 42)), ids[i]);
    /* Remove from the leaf up, refill, repeat: deleted slots must not clog the table. */
    for (int round = 0; round < 50; round++) {
        for (uint32_t i = CAP; i-- > 0;) {
            pgd__index_remove(ix, ids[i]);
            if (i % 8 == 0) T_EQ(pgd__index_check(ix, &test_log), PGD_OK);
        }
        T_EQ(pgd__index_size(ix), 0);
        for (uint32_t i = 0; i < CAP; i++) {
            pgd_hash h = H(i * 0x10000u + (uint64_t)round * CAP * 0x10000u, 42);
            ids[i] = pgd__index_insert(ix, h, i ? ids[i - 1] : PGD__NONE, P(i));
            T_ASSERT(ids[i] < CAP);
        }
        T_EQ(pgd__index_check(ix, &test_log), PGD_OK);
        T_EQ(pgd__index_insert(ix, H(1, 1), PGD__NONE, P(0)), PGD__NONE);
    }
    pgd__index_destroy(ix);
    return 0;
}

/* ---- index: randomized against a model ---- */

typedef struct {
    int live;
    pgd_hash hash;
    uint32_t id, parent_slot, page, depth, children;
    uint8_t tier;
} mentry;

static pgd_hash rand_hash(uint64_t *s, int family)
{
    uint64_t a = t_rand(s), b = t_rand(s);
    switch (family) {
    case 0:
        return H(a, b); /* random */
    case 1:
        return H(0xABCDEF, b); /* identical lo */
    case 2:
        return H((a << 24) | 0x123456, 7); /* equal low 24 bits of lo, equal hi */
    case 3:
        return H(a & 0xFF, b & 0xFF00000000000000ull); /* tiny values */
    default:
        return H(0, b << 40); /* lo zero, hi differs in top bits */
    }
}

static int random_index_run(uint64_t seed, int family)
{
    enum { CAP = 200, STEPS = 4000 };
    pgd__alloc al;
    pgd__index *ix;
    mentry m[CAP * 2];
    uint32_t n_slots = 0, n_live = 0;
    pgd__alloc_init(&al, NULL);
    T_OK(pgd__index_create(&al, CAP, &ix));
    memset(m, 0, sizeof m);
    for (int step = 0; step < STEPS; step++) {
        uint32_t r = (uint32_t)(t_rand(&seed) % 100);
        if (r < 55) {
            pgd_hash h = rand_hash(&seed, family);
            int dup = 0;
            for (uint32_t i = 0; i < n_slots; i++)
                dup |= m[i].live && pgd_hash_eq(m[i].hash, h);
            if (dup) continue;
            /* pick a parent among live entries, or a root */
            uint32_t ps = PGD__NONE;
            if (n_live && t_rand(&seed) % 4) {
                uint32_t k = (uint32_t)(t_rand(&seed) % n_live);
                for (uint32_t i = 0; i < n_slots; i++)
                    if (m[i].live && k-- == 0) {
                        ps = i;
                        break;
                    }
            }
            uint32_t page = (uint32_t)(t_rand(&seed) % 100000);
            pgd__loc loc = {page, (uint8_t)(t_rand(&seed) % 4)}; /* pool or tiers 1..3 */
            if (t_rand(&seed) % 16 == 0) loc.tier = PGD__TIER_MAX;
            uint32_t id = pgd__index_insert(ix, h, ps == PGD__NONE ? PGD__NONE : m[ps].id, loc);
            if (n_live == CAP) {
                T_EQ(id, PGD__NONE);
            } else {
                T_ASSERT(id < CAP);
                for (uint32_t i = 0; i < n_slots; i++)
                    T_ASSERT(!(m[i].live && m[i].id == id));
                /* compact the model when it fills up */
                if (n_slots == CAP * 2) {
                    uint32_t w = 0, map[CAP * 2];
                    for (uint32_t i = 0; i < n_slots; i++) {
                        map[i] = PGD__NONE;
                        if (m[i].live) {
                            map[i] = w;
                            m[w++] = m[i];
                        }
                    }
                    for (uint32_t i = 0; i < w; i++)
                        if (m[i].parent_slot != PGD__NONE) m[i].parent_slot = map[m[i].parent_slot];
                    if (ps != PGD__NONE) ps = map[ps];
                    n_slots = w;
                }
                mentry *e = &m[n_slots++];
                e->live = 1;
                e->hash = h;
                e->id = id;
                e->parent_slot = ps;
                e->page = page;
                e->tier = loc.tier;
                e->depth = ps == PGD__NONE ? 0 : m[ps].depth + 1;
                e->children = 0;
                if (ps != PGD__NONE) m[ps].children++;
                n_live++;
            }
        } else if (n_live) {
            /* remove a random leaf */
            uint32_t n_leaves = 0;
            for (uint32_t i = 0; i < n_slots; i++)
                n_leaves += m[i].live && !m[i].children;
            T_ASSERT(n_leaves > 0);
            uint32_t k = (uint32_t)(t_rand(&seed) % n_leaves);
            for (uint32_t i = 0; i < n_slots; i++) {
                if (!m[i].live || m[i].children || k-- != 0) continue;
                pgd__index_remove(ix, m[i].id);
                m[i].live = 0;
                if (m[i].parent_slot != PGD__NONE) m[m[i].parent_slot].children--;
                n_live--;
                T_EQ(pgd__index_find(ix, m[i].hash), PGD__NONE);
                break;
            }
        }
        if (pgd__index_check(ix, &test_log) != PGD_OK) T_FAIL("check failed at step %d", step);
        T_EQ(pgd__index_size(ix), n_live);
        /* every entry every 64 steps, else a sample (clustered families probe long runs) */
        int all = step % 64 == 0;
        for (uint32_t i = 0; i < n_slots; i++) {
            if (!all && t_rand(&seed) % 16) continue;
            uint32_t id = pgd__index_find(ix, m[i].hash);
            if (!m[i].live) {
                int again = 0; /* the hash may have been reinserted in a later slot */
                for (uint32_t j = i + 1; id != PGD__NONE && j < n_slots; j++)
                    again |= m[j].live && pgd_hash_eq(m[j].hash, m[i].hash);
                if (!again) T_EQ(id, PGD__NONE);
                continue;
            }
            T_EQ(id, m[i].id);
            const pgd__entry *e = pgd__index_entry(ix, id);
            T_ASSERT(pgd_hash_eq(e->hash, m[i].hash));
            T_EQ(e->loc_id, m[i].page);
            T_EQ(pgd__index_loc(ix, id).tier, m[i].tier);
            T_EQ(e->depth, m[i].depth);
            T_EQ(e->n_children, m[i].children);
            T_EQ(e->parent, m[i].parent_slot == PGD__NONE ? PGD__NONE : m[m[i].parent_slot].id);
        }
    }
    pgd__index_destroy(ix);
    return 0;
}

static int test_random_against_model(void)
{
    for (int family = 0; family < 5; family++)
        for (uint64_t seed = 1; seed <= 2; seed++)
            if (random_index_run(seed * 7919 + (uint64_t)family, family)) {
                fprintf(stderr, "family %d seed %" PRIu64 "\n", family, seed);
                return 1;
            }
    return 0;
}

/* ---- hashing ---- */

static const uint8_t key1[16] = "pagoda-test-key";
static const uint8_t key2[16] = "pagoda-test-kez";

static int test_hash_deterministic_with_pinned_key(void)
{
    pgd__hasher a, b, c;
    pgd_hash fp = H(0x1111, 0x2222);
    T_EQ(pgd__hasher_init(&a, key1, sizeof key1, fp), PGD_OK);
    T_EQ(pgd__hasher_init(&b, key1, sizeof key1, fp), PGD_OK);
    T_EQ(pgd__hasher_init(&c, key2, sizeof key2, fp), PGD_OK);
    int32_t toks[16];
    for (int i = 0; i < 16; i++)
        toks[i] = i * 1000 - 3;
    pgd_hash sa = pgd__hash_seed(&a, "tenant", 6), sb = pgd__hash_seed(&b, "tenant", 6);
    pgd_hash sc = pgd__hash_seed(&c, "tenant", 6);
    T_ASSERT(pgd_hash_eq(sa, sb));
    T_ASSERT(!pgd_hash_eq(sa, sc));
    pgd_hash ha = pgd__hash_block(&a, sa, toks, 16), hb = pgd__hash_block(&b, sb, toks, 16);
    pgd_hash hc = pgd__hash_block(&c, sa, toks, 16); /* other key, same prev */
    T_ASSERT(pgd_hash_eq(ha, hb));
    T_ASSERT(!pgd_hash_eq(ha, hc));
    T_ASSERT(!pgd_hash_eq(ha, sa));
    T_ASSERT(ha.lo != ha.hi);

    /* The documented formula: h_i = XXH3-128(secret(key), h_{i-1} || tokens as LE int32). */
    uint8_t secret[PGD__SECRET_BYTES], buf[16 + 64];
    T_EQ(XXH3_generateSecret(secret, sizeof secret, key1, sizeof key1), XXH_OK);
    memcpy(buf, &sa.lo, 8);
    memcpy(buf + 8, &sa.hi, 8);
    for (int i = 0; i < 16; i++) {
        uint32_t u = (uint32_t)toks[i];
        for (int j = 0; j < 4; j++)
            buf[16 + 4 * i + j] = (uint8_t)(u >> (8 * j));
    }
    XXH128_hash_t x = XXH3_128bits_withSecret(buf, sizeof buf, secret, sizeof secret);
    T_EQ(ha.lo, x.low64);
    T_EQ(ha.hi, x.high64);

    /* Long pages (more than the one-shot buffer) hash the same as the documented formula. */
    enum { LONG = 2048 };
    int32_t *lt = malloc(sizeof *lt * LONG);
    uint8_t *lb = malloc(16 + 4 * LONG);
    T_ASSERT(lt && lb);
    for (int i = 0; i < LONG; i++)
        lt[i] = i * 7 - 100;
    memcpy(lb, &sa.lo, 8);
    memcpy(lb + 8, &sa.hi, 8);
    for (int i = 0; i < LONG; i++) {
        uint32_t u = (uint32_t)lt[i];
        for (int j = 0; j < 4; j++)
            lb[16 + 4 * i + j] = (uint8_t)(u >> (8 * j));
    }
    x = XXH3_128bits_withSecret(lb, 16 + 4 * LONG, secret, sizeof secret);
    pgd_hash hl = pgd__hash_block(&a, sa, lt, LONG);
    T_EQ(hl.lo, x.low64);
    T_EQ(hl.hi, x.high64);
    free(lt);
    free(lb);
    return 0;
}

static int test_hash_seed_separates(void)
{
    pgd__hasher a, f2, r1, r2;
    T_OK(pgd__hasher_init(&a, key1, sizeof key1, H(1, 0)));
    T_OK(pgd__hasher_init(&f2, key1, sizeof key1, H(2, 0)));
    pgd_hash s0 = pgd__hash_seed(&a, NULL, 0);
    pgd_hash s1 = pgd__hash_seed(&a, "a", 1);
    pgd_hash s2 = pgd__hash_seed(&a, "b", 1);
    pgd_hash s3 = pgd__hash_seed(&a, "ab", 2);
    pgd_hash s4 = pgd__hash_seed(&f2, "a", 1);
    T_ASSERT(pgd_hash_eq(s1, pgd__hash_seed(&a, "a", 1)));
    T_ASSERT(!pgd_hash_eq(s0, s1));
    T_ASSERT(!pgd_hash_eq(s1, s2));
    T_ASSERT(!pgd_hash_eq(s1, s3));
    T_ASSERT(!pgd_hash_eq(s1, s4)); /* other model fingerprint */
    /* Random keys: two instances disagree. */
    T_EQ(pgd__hasher_init(&r1, NULL, 0, H(1, 0)), PGD_OK);
    T_EQ(pgd__hasher_init(&r2, NULL, 0, H(1, 0)), PGD_OK);
    T_ASSERT(!pgd_hash_eq(pgd__hash_seed(&r1, "a", 1), pgd__hash_seed(&r2, "a", 1)));
    T_ASSERT(!pgd_hash_eq(pgd__hash_seed(&r1, "a", 1), s1));
    return 0;
}

static void chain(const pgd__hasher *h, const char *salt, const int32_t *toks, int n_pages,
                  int page, pgd_hash *out)
{
    pgd_hash prev = pgd__hash_seed(h, salt, strlen(salt));
    for (int i = 0; i < n_pages; i++) {
        prev = pgd__hash_block(h, prev, toks + i * page, (size_t)page);
        out[i] = prev;
    }
}

static int test_hash_chain_property(void)
{
    enum { PAGES = 12, PT = 16 };
    pgd__hasher h;
    int32_t a[PAGES * PT], b[PAGES * PT];
    pgd_hash ha[PAGES], hb[PAGES];
    uint64_t seed = 99;
    T_OK(pgd__hasher_init(&h, key1, sizeof key1, H(5, 5)));
    for (int i = 0; i < PAGES * PT; i++)
        a[i] = (int32_t)(t_rand(&seed) % 50000);
    chain(&h, "s", a, PAGES, PT, ha);
    memcpy(b, a, sizeof a);
    chain(&h, "s", b, PAGES, PT, hb);
    for (int i = 0; i < PAGES; i++)
        T_ASSERT(pgd_hash_eq(ha[i], hb[i]));
    for (int i = 0; i < PAGES; i++)
        for (int j = 0; j < i; j++)
            T_ASSERT(!pgd_hash_eq(ha[i], ha[j]));
    for (int p = 0; p < PAGES; p++) {
        for (int slot = 0; slot < PT; slot += 5) {
            memcpy(b, a, sizeof a);
            b[p * PT + slot] ^= 1;
            chain(&h, "s", b, PAGES, PT, hb);
            for (int i = 0; i < PAGES; i++) {
                if (i < p)
                    T_ASSERT(pgd_hash_eq(ha[i], hb[i]));
                else
                    T_ASSERT(!pgd_hash_eq(ha[i], hb[i]));
            }
        }
    }
    /* Another salt: every hash differs. */
    chain(&h, "t", a, PAGES, PT, hb);
    for (int i = 0; i < PAGES; i++)
        T_ASSERT(!pgd_hash_eq(ha[i], hb[i]));
    /* Token boundaries matter: swapping two tokens changes the hash. */
    memcpy(b, a, sizeof a);
    b[0] = a[1];
    b[1] = a[0];
    if (a[0] != a[1]) {
        chain(&h, "s", b, 1, PT, hb);
        T_ASSERT(!pgd_hash_eq(ha[0], hb[0]));
    }
    return 0;
}

/* ---- locations and capacity beyond the pool ---- */

/* Every entry keeps the location it was given, pool or tier, and set_loc moves one (a
 * block changing tier) without touching the tree. */
static int test_location_round_trip(void)
{
    enum { N = 64 };
    pgd__alloc al;
    pgd__index *ix;
    uint32_t id[N];
    pgd__alloc_init(&al, NULL);
    T_OK(pgd__index_create(&al, N, &ix));
    for (uint32_t i = 0; i < N; i++) {
        pgd__loc loc = {0xFFFFFF00u + i % 200, (uint8_t)(PGD__TIER_MAX - i % 6)};
        if (i % 3 == 0) loc = P(i);
        id[i] = pgd__index_insert(ix, H(i + 1, 7), i ? id[i - 1] : PGD__NONE, loc);
        T_ASSERT(id[i] != PGD__NONE);
    }
    T_EQ(pgd__index_check(ix, &test_log), PGD_OK);
    for (uint32_t i = 0; i < N; i++) {
        uint32_t eid = pgd__index_find(ix, H(i + 1, 7));
        const pgd__entry *e = pgd__index_entry(ix, eid);
        T_ASSERT(e != NULL);
        pgd__loc l = pgd__index_loc(ix, eid);
        T_EQ(l.id, e->loc_id);
        if (i % 3 == 0) {
            T_EQ(l.tier, PGD__TIER_POOL);
            T_EQ(l.id, i);
        } else {
            T_EQ(l.tier, PGD__TIER_MAX - i % 6);
            T_EQ(l.id, 0xFFFFFF00u + i % 200);
        }
    }
    /* Demote every pool entry to tier 1, then bring one back to another pool page. */
    for (uint32_t i = 0; i < N; i += 3) {
        pgd__loc t1 = {1000 + i, 1};
        pgd__index_set_loc(ix, id[i], t1);
    }
    pgd__index_set_loc(ix, id[30], P(5));
    T_EQ(pgd__index_check(ix, &test_log), PGD_OK);
    for (uint32_t i = 0; i < N; i += 3) {
        const pgd__entry *e = pgd__index_entry(ix, id[i]);
        T_EQ(pgd__index_loc(ix, id[i]).tier, i == 30 ? PGD__TIER_POOL : 1);
        T_EQ(e->loc_id, i == 30 ? 5 : 1000 + i);
        T_EQ(e->depth, i);
        T_EQ(e->n_children, i + 1 < N);
    }
    pgd__index_destroy(ix);
    return 0;
}

static void count_log_fn(void *ud, int level, const char *msg)
{
    (void)level, (void)msg;
    ++*(int *)ud;
}

/* The index capacity is its own: an index describes far more blocks than a pool holds
 * (the pool's pages plus blocks in tiers), and a cache can be built with such an index. */
static int test_more_entries_than_pool_pages(void)
{
    enum { POOL_PAGES = 16, CAP = POOL_PAGES * 64 };
    pgd__alloc al;
    pgd__index *ix;
    pgd__alloc_init(&al, NULL);
    T_OK(pgd__index_create(&al, CAP, &ix));
    /* One long chain: the first POOL_PAGES blocks in the pool, the rest in tier 1. */
    uint32_t prev = PGD__NONE;
    for (uint32_t i = 0; i < CAP; i++) {
        pgd__loc loc = i < POOL_PAGES ? P(i) : (pgd__loc){i - POOL_PAGES, 1};
        prev = pgd__index_insert(ix, H(0xABC0000 + i, i), prev, loc);
        T_ASSERT(prev != PGD__NONE);
    }
    T_EQ(pgd__index_size(ix), CAP);
    T_EQ(pgd__index_insert(ix, H(1, 1), PGD__NONE, P(0)), PGD__NONE); /* full */
    T_EQ(pgd__index_check(ix, &test_log), PGD_OK);
    for (uint32_t i = 0; i < CAP; i++) {
        uint32_t eid = pgd__index_find(ix, H(0xABC0000 + i, i));
        const pgd__entry *e = pgd__index_entry(ix, eid);
        T_ASSERT(e != NULL);
        T_EQ(e->depth, i);
        T_EQ(pgd__index_loc(ix, eid).tier, i < POOL_PAGES ? 0 : 1);
        T_EQ(e->loc_id, i < POOL_PAGES ? i : i - POOL_PAGES);
    }
    /* Leaves first: drop the tier tail, the pool head stays intact. */
    for (uint32_t i = CAP; i-- > POOL_PAGES;)
        pgd__index_remove(ix, pgd__index_find(ix, H(0xABC0000 + i, i)));
    T_EQ(pgd__index_size(ix), POOL_PAGES);
    T_EQ(pgd__index_check(ix, &test_log), PGD_OK);
    pgd__index_destroy(ix);

    /* Through the cache: index_capacity beyond the pool is accepted; below it is not. */
    int n_logs = 0;
    pgd_cache_params p = pgd_cache_default_params();
    pgd_cache *c;
    p.pool.page_tokens = 4;
    p.pool.capacity_pages = POOL_PAGES;
    p.pool.metadata_only = 1;
    p.log = count_log_fn;
    p.log_ud = &n_logs;
    p.index_capacity = CAP;
    T_OK(pgd_cache_create(&p, &c));
    int32_t toks[POOL_PAGES * 4];
    for (int i = 0; i < POOL_PAGES * 4; i++)
        toks[i] = i * 7 + 1;
    pgd_seq *s;
    T_OK(pgd_seq_create(c, NULL, 0, &s));
    T_OK(pgd_seq_grow(c, s, POOL_PAGES * 4));
    T_EQ(pgd_seq_commit(c, s, toks, POOL_PAGES * 4), POOL_PAGES);
    pgd_seq_destroy(c, s);
    T_OK(pgd_cache_check(c));
    pgd_cache_stats st;
    pgd_cache_get_stats(c, &st);
    T_EQ(st.n_pages_cached, POOL_PAGES);
    pgd_cache_destroy(c);
    T_EQ(n_logs, 0);
    p.index_capacity = POOL_PAGES - 1;
    T_EQ(pgd_cache_create(&p, &c), PGD_EINVAL);
    T_ASSERT(c == NULL);
    T_EQ(n_logs, 1);
    return 0;
}

int main(void)
{
    T_RUN(test_insert_find_remove);
    T_RUN(test_full_index);
    T_RUN(test_location_round_trip);
    T_RUN(test_more_entries_than_pool_pages);
    T_RUN(test_random_against_model);
    T_RUN(test_hash_deterministic_with_pinned_key);
    T_RUN(test_hash_seed_separates);
    T_RUN(test_hash_chain_property);
    T_DONE();
}
