/* SPDX-License-Identifier: MIT */
/*
 * test_tier_ram.c - the RAM tier (src/tier/ram.c) and the record map it is built on
 * (src/tier/map.c): a randomized run against a reference model (a plain array of what
 * should be held, in LRU order), leaf-only eviction, the byte bound, spill of exactly the
 * evicted records, a record damaged in memory is a miss, and every storage option
 * round-trips (lz4 / zstd: bytes equal; q8_0 / q4_0 re-encoding: within the codec's
 * bound), threads; every policy keeps leaf-only, s3fifo / arc keep a re-used record over
 * one-hit ones (LRU does not), priority orders, retention (expiry first, pins survive
 * pressure, the pin share refuses with PGD_ENOSPC), belady refused.
 */
#include <math.h>
#include <pthread.h>

#include "tier/tier_int.h"
#include "t.h"
#include "t_tier.h"
#include "t_alloc.h"

static const pgd_hash fp = {0xfeedull, 0xbeefull};

static pgd_pool_params geometry(pgd_kv_type type, int key_bounds)
{
    pgd_pool_params p = pgd_pool_default_params();
    p.n_layers = 2;
    p.n_kv_heads = 2;
    p.head_dim = 64;
    p.page_tokens = 16;
    p.kv_type = type;
    p.key_bounds = key_bounds;
    return p;
}

/* fill, then (zero_mid) bytes 100 .. n-100 zeroed for blocks whose hash is odd: a
 * compressible payload. */
static void fill_block(uint8_t *buf, uint64_t n, pgd_hash h, int zero_mid)
{
    t_fill_block(buf, n, h);
    if (zero_mid && (h.lo & 1) && n > 200) memset(buf + 100, 0, (size_t)n - 200);
}

/* ---- the record map alone ---- */

static int test_map(void)
{
    pgd__alloc al;
    pgd__tmap *m;
    pgd__alloc_init(&al, NULL);
    T_EQ(pgd__tmap_create(&al, 0, NULL, NULL, &m), PGD_EINVAL);
    T_EQ(pgd__tmap_create(&al, 8, pgd_policy_builtin(PGD_POLICY_BELADY), NULL, &m), PGD_EINVAL);
    T_OK(pgd__tmap_create(&al, 8, NULL, NULL, &m));
    /* A chain inserted leaf first (as demotion does): the child counts come right. */
    uint32_t s[4];
    for (int d = 3; d >= 0; d--) {
        s[d] = pgd__tmap_insert(m, t_block_of(0, (uint32_t)d), t_parent_of(0, (uint32_t)d));
        T_ASSERT(s[d] != PGD__NONE);
        T_OK(pgd__tmap_check(m, NULL));
    }
    for (int d = 0; d < 4; d++)
        T_EQ(pgd__tmap_slot_get(m, s[d])->n_children, d < 3 ? 1 : 0);
    /* The leaf is the only victim, whatever the age order says. */
    T_EQ(pgd__tmap_victim(m), s[3]);
    pgd__tmap_touch(m, s[3]);
    T_EQ(pgd__tmap_victim(m), s[3]);
    /* A pinned leaf is not a victim, and nothing else is a leaf. */
    pgd__tmap_pin(m, s[3]);
    T_EQ(pgd__tmap_victim(m), PGD__NONE);
    T_OK(pgd__tmap_check(m, NULL));
    pgd__tmap_unpin(m, s[3]);
    /* Siblings: two children of depth 1. */
    uint32_t sib = pgd__tmap_insert(m, t_block_of(9, 0), t_block_of(0, 1));
    T_EQ(pgd__tmap_slot_get(m, s[1])->n_children, 2);
    T_OK(pgd__tmap_check(m, NULL));
    /* Removing a middle block: its children stay, parentless. */
    pgd__tmap_remove(m, s[1]);
    T_EQ(pgd__tmap_slot_get(m, s[0])->n_children, 0);
    T_OK(pgd__tmap_check(m, NULL));
    T_EQ(pgd__tmap_find(m, t_block_of(0, 1)), PGD__NONE);
    T_EQ(pgd__tmap_find(m, t_block_of(0, 2)), s[2]);
    /* Back: it counts both its children again. */
    s[1] = pgd__tmap_insert(m, t_block_of(0, 1), t_parent_of(0, 1));
    T_EQ(pgd__tmap_slot_get(m, s[1])->n_children, 2);
    T_EQ(pgd__tmap_slot_get(m, s[0])->n_children, 1);
    T_OK(pgd__tmap_check(m, NULL));
    (void)sib;
    /* Full. */
    for (uint32_t c = 1; pgd__tmap_count(m) < 8; c++)
        T_ASSERT(pgd__tmap_insert(m, t_block_of(c, 0), t_parent_of(c, 0)) != PGD__NONE);
    T_EQ(pgd__tmap_insert(m, t_block_of(100, 0), t_parent_of(100, 0)), PGD__NONE);
    T_OK(pgd__tmap_check(m, NULL));
    pgd__tmap_destroy(m);
    pgd__tmap_destroy(NULL);
    return 0;
}

/* Parents that only crafted records have: a block that is its own parent, two blocks
 * that name each other. No abort, the check holds, and the cycle is evictable when
 * nothing is pinned (a forest always has a leaf; a cycle has none). */
static int test_map_crafted_parents(void)
{
    pgd__alloc al;
    pgd__tmap *m;
    pgd__alloc_init(&al, NULL);
    T_OK(pgd__tmap_create(&al, 4, NULL, NULL, &m));
    pgd_hash a = t_block_of(1, 1), b = t_block_of(2, 2);
    uint32_t self = pgd__tmap_insert(m, a, a);
    T_OK(pgd__tmap_check(m, NULL));
    T_EQ(pgd__tmap_slot_get(m, self)->n_children, 0);
    T_EQ(pgd__tmap_victim(m), self);
    pgd__tmap_remove(m, self);
    T_OK(pgd__tmap_check(m, NULL));
    uint32_t sa = pgd__tmap_insert(m, a, b), sb = pgd__tmap_insert(m, b, a);
    T_EQ(pgd__tmap_slot_get(m, sa)->n_children, 1);
    T_EQ(pgd__tmap_slot_get(m, sb)->n_children, 1);
    T_OK(pgd__tmap_check(m, NULL));
    T_EQ(pgd__tmap_victim(m), sa); /* no leaf, nothing pinned: the oldest */
    pgd__tmap_pin(m, sb);
    T_EQ(pgd__tmap_victim(m), PGD__NONE); /* a pin may be what hides a leaf: wait */
    T_OK(pgd__tmap_check(m, NULL));
    pgd__tmap_unpin(m, sb);
    pgd__tmap_remove(m, sa);
    T_EQ(pgd__tmap_slot_get(m, sb)->n_children, 0);
    T_EQ(pgd__tmap_victim(m), sb);
    pgd__tmap_remove(m, sb);
    T_OK(pgd__tmap_check(m, NULL));
    pgd__tmap_destroy(m);
    /* The RAM tier refuses a block named as its own parent. */
    pgd_pool_params pp = geometry(PGD_KV_F16, 0);
    pgd_record_ident id;
    T_OK(pgd_record_ident_make(&pp, fp, &id));
    pgd_tier_ram_params rp = pgd_tier_ram_default_params();
    pgd_tier *t;
    T_OK(pgd_tier_ram_create(&rp, &t));
    T_OK(pgd_tier_bind(t, &id));
    static uint8_t page[1 << 16];
    T_EQ(pgd_tier_put(t, a, a, page, NULL, NULL, NULL), PGD_EINVAL);
    pgd_tier_close(t);
    return 0;
}

/* Random operations on a small map against brute force, many collisions (capacity 64,
 * 200 blocks in 20 chains). */
static int test_map_random(void)
{
    pgd__alloc al;
    pgd__tmap *m;
    uint64_t seed = 7;
    pgd__alloc_init(&al, NULL);
    T_OK(pgd__tmap_create(&al, 64, NULL, NULL, &m));
    for (int it = 0; it < 20000; it++) {
        uint32_t c = (uint32_t)(t_rand(&seed) % 20), d = (uint32_t)(t_rand(&seed) % 10);
        pgd_hash h = t_block_of(c, d);
        uint32_t s = pgd__tmap_find(m, h);
        int op = (int)(t_rand(&seed) % 4);
        if (s == PGD__NONE && op < 3) {
            if (pgd__tmap_count(m) == 64) {
                uint32_t v = pgd__tmap_victim(m);
                T_ASSERT(v != PGD__NONE); /* nothing pinned: a forest has a leaf */
                T_EQ(pgd__tmap_slot_get(m, v)->n_children, 0);
                pgd__tmap_remove(m, v);
            }
            T_ASSERT(pgd__tmap_insert(m, h, t_parent_of(c, d)) != PGD__NONE);
        } else if (s != PGD__NONE && op == 3) {
            pgd__tmap_remove(m, s);
        } else if (s != PGD__NONE) {
            pgd__tmap_touch(m, s);
        }
        if (it % 97 == 0) T_OK(pgd__tmap_check(m, NULL));
    }
    T_OK(pgd__tmap_check(m, NULL));
    pgd__tmap_destroy(m);
    return 0;
}

/* ---- the RAM tier against a reference model ---- */

typedef struct spilled {
    pgd_hash block[64];
    int n;
    int zero_mid; /* the payloads were made by fill_block(..., 1) */
    int bad;      /* a spilled payload that is not the block's */
    uint64_t page_bytes, bounds_bytes;
} spilled;

static void on_spill(void *ud, pgd_hash block, pgd_hash parent, const void *page,
                     const void *bounds)
{
    spilled *sp = ud;
    static uint8_t want[1 << 20];
    (void)parent;
    fill_block(want, sp->page_bytes + sp->bounds_bytes, block, sp->zero_mid);
    if (memcmp(want, page, (size_t)sp->page_bytes) != 0) sp->bad = 1;
    if (sp->bounds_bytes &&
        (!bounds || memcmp(want + sp->page_bytes, bounds, (size_t)sp->bounds_bytes) != 0))
        sp->bad = 1;
    if (!sp->bounds_bytes && bounds) sp->bad = 1;
    if (sp->n < 64) sp->block[sp->n] = block;
    sp->n++;
}

/* The model: held blocks in LRU order, oldest first. */
typedef struct model {
    uint32_t c[256], d[256];
    int n;
} model;

static int model_find(const model *md, uint32_t c, uint32_t d)
{
    for (int i = 0; i < md->n; i++)
        if (md->c[i] == c && md->d[i] == d) return i;
    return -1;
}

static void model_take(model *md, int i)
{
    memmove(md->c + i, md->c + i + 1, (size_t)(md->n - i - 1) * sizeof md->c[0]);
    memmove(md->d + i, md->d + i + 1, (size_t)(md->n - i - 1) * sizeof md->d[0]);
    md->n--;
}

static void model_push(model *md, uint32_t c, uint32_t d)
{
    md->c[md->n] = c;
    md->d[md->n] = d;
    md->n++;
}

static void model_touch(model *md, int i)
{
    uint32_t c = md->c[i], d = md->d[i];
    model_take(md, i);
    model_push(md, c, d);
}

/* The oldest held block with no held child. */
static int model_victim(const model *md)
{
    for (int i = 0; i < md->n; i++)
        if (model_find(md, md->c[i], md->d[i] + 1) < 0) return i;
    return -1;
}

static int run_model(int key_bounds, uint64_t seed)
{
    pgd_pool_params pp = geometry(PGD_KV_F16, key_bounds);
    pgd_record_ident id;
    T_OK(pgd_record_ident_make(&pp, fp, &id));
    uint64_t rec_bytes = PGD_RECORD_HEADER_BYTES + id.page_bytes + id.bounds_bytes;
    const int cap_records = 12;
    pgd_tier_ram_params rp = pgd_tier_ram_default_params();
    rp.capacity_bytes = rec_bytes * cap_records + rec_bytes / 2; /* not a multiple */
    pgd_tier *t;
    T_OK(pgd_tier_ram_create(&rp, &t));
    T_EQ(pgd_tier_put(t, t_block_of(0, 0), t_parent_of(0, 0), "x", NULL, NULL, NULL), PGD_EINVAL);
    T_OK(pgd_tier_bind(t, &id));
    T_OK(pgd_tier_bind(t, &id)); /* the same identity again */
    pgd_record_ident other = id;
    other.model_fingerprint.lo ^= 1;
    T_EQ(pgd_tier_bind(t, &other), PGD_EBUSY);

    static uint8_t buf[1 << 20], want[1 << 20];
    uint8_t *page = buf, *bounds = key_bounds ? buf + id.page_bytes : NULL;
    model md = {{0}, {0}, 0};
    uint64_t n_puts = 0, n_gets = 0, n_misses = 0, n_evictions = 0;
    for (int it = 0; it < 6000; it++) {
        uint32_t c = (uint32_t)(t_rand(&seed) % 6), d = (uint32_t)(t_rand(&seed) % 6);
        pgd_hash h = t_block_of(c, d);
        int op = (int)(t_rand(&seed) % 10), i = model_find(&md, c, d);
        spilled sp;
        memset(&sp, 0, sizeof sp);
        sp.page_bytes = id.page_bytes;
        sp.bounds_bytes = id.bounds_bytes;
        if (op < 5) { /* put */
            t_fill_block(buf, id.page_bytes + id.bounds_bytes, h);
            int want_victims[64], nv = 0;
            if (i >= 0) {
                model_touch(&md, i);
            } else {
                while (md.n >= cap_records) {
                    int v = model_victim(&md);
                    T_ASSERT(v >= 0);
                    want_victims[nv++] = (int)(md.c[v] * 100 + md.d[v]);
                    model_take(&md, v);
                }
                model_push(&md, c, d);
                n_puts++;
                n_evictions += (uint64_t)nv;
            }
            T_EQ(pgd_tier_put(t, h, t_parent_of(c, d), page, bounds, on_spill, &sp), PGD_OK);
            T_EQ(sp.n, nv);
            T_EQ(sp.bad, 0);
            /* Victims come in eviction order: each the model's choice at its turn. */
            for (int k = 0; k < nv; k++) {
                uint32_t vc = (uint32_t)want_victims[k] / 100, vd = (uint32_t)want_victims[k] % 100;
                T_ASSERT(pgd_hash_eq(sp.block[k], t_block_of(vc, vd)));
            }
        } else if (op < 8) { /* get */
            memset(buf, 0, (size_t)(id.page_bytes + id.bounds_bytes));
            int rc = pgd_tier_get(t, h, page, bounds);
            if (i >= 0) {
                T_EQ(rc, PGD_OK);
                t_fill_block(want, id.page_bytes + id.bounds_bytes, h);
                T_ASSERT(memcmp(buf, want, (size_t)(id.page_bytes + id.bounds_bytes)) == 0);
                model_touch(&md, i);
                n_gets++;
            } else {
                T_EQ(rc, PGD_ENOTFOUND);
                n_misses++;
            }
        } else if (op == 8) { /* del */
            T_EQ(pgd_tier_del(t, h), i >= 0 ? PGD_OK : PGD_ENOTFOUND);
            if (i >= 0) model_take(&md, i);
        } else { /* lookup of chain c from its start */
            pgd_hash run[6];
            size_t want_run = 0;
            for (uint32_t k = 0; k < 6; k++)
                run[k] = t_block_of(c, k);
            while (want_run < 6 && model_find(&md, c, (uint32_t)want_run) >= 0)
                want_run++;
            T_EQ(pgd_tier_lookup(t, run, 6), want_run);
        }
        pgd_tier_stats st;
        pgd_tier_get_stats(t, &st);
        T_EQ(st.n_records, md.n);
        T_EQ(st.bytes_used, (uint64_t)md.n * rec_bytes);
        T_ASSERT(st.bytes_used <= st.bytes_capacity);
        if (it % 50 == 0) T_OK(pgd__tier_ram_check(t));
    }
    pgd_tier_stats st;
    pgd_tier_get_stats(t, &st);
    T_EQ(st.n_puts, n_puts);
    T_EQ(st.n_gets, n_gets);
    T_EQ(st.n_get_misses, n_misses);
    T_EQ(st.n_evictions, n_evictions);
    T_ASSERT(n_evictions > 200 && n_gets > 500 && n_misses > 200); /* the run did evict */
    T_EQ(st.n_put_bytes, n_puts * (id.page_bytes + id.bounds_bytes));
    T_EQ(st.n_get_bytes, n_gets * (id.page_bytes + id.bounds_bytes));
    T_EQ(st.n_corrupt, 0);
    uint64_t n_hist = 0;
    for (int b = 0; b < PGD_TIER_HIST_BUCKETS; b++)
        n_hist += st.get_hist[b];
    T_EQ(n_hist, n_gets);
    T_OK(pgd_tier_flush(t));
    pgd_tier_close(t);
    return 0;
}

static int test_model(void)
{
    T_OK(run_model(0, 1));
    T_OK(run_model(1, 2));
    return 0;
}

/* The victim's order is the model's: check it strictly on a simple case. */
static int test_eviction_order(void)
{
    pgd_pool_params pp = geometry(PGD_KV_F16, 0);
    pgd_record_ident id;
    T_OK(pgd_record_ident_make(&pp, fp, &id));
    pgd_tier_ram_params rp = pgd_tier_ram_default_params();
    rp.capacity_bytes = 3 * (PGD_RECORD_HEADER_BYTES + id.page_bytes);
    pgd_tier *t;
    T_OK(pgd_tier_ram_create(&rp, &t));
    T_OK(pgd_tier_bind(t, &id));
    static uint8_t page[1 << 20];
    spilled sp;
    memset(&sp, 0, sizeof sp);
    sp.page_bytes = id.page_bytes;
    /* Chain 0 of three blocks put root first: the root is the oldest but not a leaf. */
    for (uint32_t d = 0; d < 3; d++) {
        t_fill_block(page, id.page_bytes, t_block_of(0, d));
        T_OK(pgd_tier_put(t, t_block_of(0, d), t_parent_of(0, d), page, NULL, on_spill, &sp));
    }
    T_EQ(sp.n, 0);
    t_fill_block(page, id.page_bytes, t_block_of(1, 0));
    T_OK(pgd_tier_put(t, t_block_of(1, 0), t_parent_of(1, 0), page, NULL, on_spill, &sp));
    T_EQ(sp.n, 1);
    T_ASSERT(pgd_hash_eq(sp.block[0], t_block_of(0, 2))); /* the end of the chain, not its root */
    T_EQ(sp.bad, 0);
    pgd_hash run[3] = {t_block_of(0, 0), t_block_of(0, 1), t_block_of(0, 2)};
    T_EQ(pgd_tier_lookup(t, run, 3), 2);
    /* A put of a block held is no write and no eviction. */
    T_OK(pgd_tier_put(t, t_block_of(0, 0), t_parent_of(0, 0), page, NULL, on_spill, &sp));
    T_EQ(sp.n, 1);
    pgd_tier_stats st;
    pgd_tier_get_stats(t, &st);
    T_EQ(st.n_puts, 4);
    /* Without a spill callback the victim is dropped. */
    t_fill_block(page, id.page_bytes, t_block_of(2, 0));
    T_OK(pgd_tier_put(t, t_block_of(2, 0), t_parent_of(2, 0), page, NULL, NULL, NULL));
    T_EQ(pgd_tier_lookup(t, run, 3), 1);
    T_OK(pgd__tier_ram_check(t));
    pgd_tier_close(t);
    return 0;
}

/* A record damaged in memory is a miss, counted, dropped; never data, never spilled. */
static int test_corrupt(void)
{
    for (uint32_t comp = PGD_RECORD_RAW; comp <= PGD_RECORD_ZSTD; comp++) {
        pgd_pool_params pp = geometry(PGD_KV_F16, 1);
        pgd_record_ident id;
        T_OK(pgd_record_ident_make(&pp, fp, &id));
        pgd_tier_ram_params rp = pgd_tier_ram_default_params();
        rp.capacity_bytes = 4 * (PGD_RECORD_HEADER_BYTES + id.page_bytes + id.bounds_bytes);
        rp.compression = comp;
        pgd_tier *t;
        T_OK(pgd_tier_ram_create(&rp, &t));
        T_OK(pgd_tier_bind(t, &id));
        static uint8_t buf[1 << 20];
        uint8_t *bounds = buf + id.page_bytes;
        /* Compressible content, so lz4 / zstd really compress. */
        for (uint32_t c = 0; c < 4; c++) {
            memset(buf, (int)c, (size_t)(id.page_bytes + id.bounds_bytes));
            T_OK(pgd_tier_put(t, t_block_of(c, 0), t_parent_of(c, 0), buf, bounds, NULL, NULL));
        }
        T_OK(pgd__tier_ram_corrupt(t, t_block_of(0, 0), 128 + 5)); /* payload */
        T_OK(pgd__tier_ram_corrupt(t, t_block_of(1, 0), 70));      /* block hash in header */
        T_OK(pgd__tier_ram_corrupt(t, t_block_of(2, 0), 121));     /* checksum */
        T_EQ(pgd__tier_ram_corrupt(t, t_block_of(9, 0), 1), PGD_ENOTFOUND);
        for (uint32_t c = 0; c < 3; c++) {
            T_EQ(pgd_tier_get(t, t_block_of(c, 0), buf, bounds), PGD_ENOTFOUND);
            pgd_hash h = t_block_of(c, 0);
            T_EQ(pgd_tier_lookup(t, &h, 1), 0); /* dropped */
        }
        T_OK(pgd_tier_get(t, t_block_of(3, 0), buf, bounds));
        T_EQ(buf[0], 3);
        pgd_tier_stats st;
        pgd_tier_get_stats(t, &st);
        T_EQ(st.n_corrupt, 3);
        T_EQ(st.n_records, 1);
        T_OK(pgd__tier_ram_check(t));
        /* Damaged, then evicted: not spilled. */
        for (uint32_t c = 4; c < 7; c++) { /* incompressible: the bound is reached */
            t_fill_block(buf, id.page_bytes + id.bounds_bytes, t_block_of(c, 0));
            T_OK(pgd_tier_put(t, t_block_of(c, 0), t_parent_of(c, 0), buf, bounds, NULL, NULL));
        }
        T_OK(pgd__tier_ram_corrupt(t, t_block_of(3, 0), 128 + 1));
        spilled sp;
        memset(&sp, 0, sizeof sp);
        sp.page_bytes = id.page_bytes;
        sp.bounds_bytes = id.bounds_bytes;
        t_fill_block(buf, id.page_bytes + id.bounds_bytes, t_block_of(7, 0));
        T_OK(pgd_tier_put(t, t_block_of(7, 0), t_parent_of(7, 0), buf, bounds, on_spill, &sp));
        T_EQ(sp.n, 0);
        pgd_tier_get_stats(t, &st);
        T_EQ(st.n_corrupt, 4);
        T_EQ(st.n_evictions, 1);
        pgd_tier_close(t);
    }
    return 0;
}

/* ---- storage options ---- */

/* A page of realistic K/V in the pool's codec: random-walk values along each row and
 * across rows (correlated, not zeros), a few outliers. */
static void realistic_page(const pgd_record_ident *id, uint8_t *page, uint64_t seed)
{
    const pgd__codec *codec = pgd__codec_get((pgd_kv_type)id->kv_type);
    size_t region =
        pgd__codec_region_bytes((pgd_kv_type)id->kv_type, id->page_tokens, id->head_dim);
    size_t n = (size_t)id->page_tokens * id->head_dim;
    float *rows = malloc(n * sizeof *rows);
    memset(page, 0, (size_t)id->page_bytes);
    for (size_t r = 0; r < 2ull * id->n_layers * id->n_kv_heads; r++) {
        float x = 0;
        for (size_t i = 0; i < n; i++) {
            x += ((float)(t_rand(&seed) >> 40) / (float)(1 << 24) - 0.5f) * 0.2f;
            rows[i] = i % id->head_dim == 7 ? 4 * x : x;
        }
        codec->encode_page(r % 2 ? PGD__V : PGD__K, page + r * region, id->page_tokens,
                           id->head_dim, rows, id->page_tokens);
    }
    free(rows);
}

/* f32 values of a page in the pool's codec. */
static void decode_page(const pgd_record_ident *id, const uint8_t *page, float *out)
{
    const pgd__codec *codec = pgd__codec_get((pgd_kv_type)id->kv_type);
    size_t region =
        pgd__codec_region_bytes((pgd_kv_type)id->kv_type, id->page_tokens, id->head_dim);
    size_t n = (size_t)id->page_tokens * id->head_dim;
    for (size_t r = 0; r < 2ull * id->n_layers * id->n_kv_heads; r++)
        codec->decode_rows(r % 2 ? PGD__V : PGD__K, page + r * region, id->page_tokens,
                           id->head_dim, 0, id->page_tokens, out + r * n);
}

/* Puts and gets a realistic page (+ bounds) through a tier of these options. Lossless
 * (store -1): bytes equal. Lossy: within the stored codec's bound, per 32-value block
 * (q8_0: d / 2, d = amax / 127; q4_0: |d|, d = amax / 8; plus f16 rounding of d and of
 * the value written back), bounds exact. Returns the bytes held (for the capacity gain). */
static int round_trip(pgd_kv_type pool_type, int store, uint32_t comp, uint64_t *held)
{
    pgd_pool_params pp = geometry(pool_type, 1);
    pgd_record_ident id;
    T_OK(pgd_record_ident_make(&pp, fp, &id));
    pgd_tier_ram_params rp = pgd_tier_ram_default_params();
    rp.capacity_bytes = 64ull << 20;
    rp.store_type = store;
    rp.compression = comp;
    pgd_tier *t;
    T_OK(pgd_tier_ram_create(&rp, &t));
    T_OK(pgd_tier_bind(t, &id));
    size_t raw = (size_t)(id.page_bytes + id.bounds_bytes);
    uint8_t *in = malloc(raw), *out = malloc(raw);
    size_t nv = (size_t)id.page_bytes; /* at most this many values */
    float *a = malloc(nv * sizeof *a), *b = malloc(nv * sizeof *b);
    uint64_t bytes = 0;
    const int n_pages = 8;
    for (int k = 0; k < n_pages; k++) {
        realistic_page(&id, in, (uint64_t)k + 100);
        float *fb = (float *)(void *)(in + id.page_bytes);
        for (uint64_t i = 0; i < id.bounds_bytes / 4; i++)
            fb[i] = (float)i * 0.25f - (float)k;
        T_OK(pgd_tier_put(t, t_block_of((uint32_t)k, 0), t_parent_of((uint32_t)k, 0), in,
                          in + id.page_bytes, NULL, NULL));
        memset(out, 0xee, raw);
        T_OK(pgd_tier_get(t, t_block_of((uint32_t)k, 0), out, out + id.page_bytes));
        T_ASSERT(memcmp(in + id.page_bytes, out + id.page_bytes, (size_t)id.bounds_bytes) == 0);
        if (store < 0 || store == (int)pool_type) {
            T_ASSERT(memcmp(in, out, (size_t)id.page_bytes) == 0);
        } else {
            decode_page(&id, in, a);
            decode_page(&id, out, b);
            size_t n = 2ull * id.n_layers * id.n_kv_heads * id.page_tokens * id.head_dim;
            for (size_t blk = 0; blk < n; blk += 32) {
                float amax = 0;
                for (size_t i = blk; i < blk + 32; i++)
                    amax = fmaxf(amax, fabsf(a[i]));
                float bound = store == PGD_KV_Q8_0 ? amax / 127 / 2 : amax / 8;
                bound = bound * 1.01f + 1e-6f;
                /* Writing the value back in the pool's codec rounds once more. */
                if (pool_type == PGD_KV_Q8_0) bound += amax * 1.2f / 127 / 2;
                float rel = pool_type == PGD_KV_F16    ? 1.0f / 2000
                            : pool_type == PGD_KV_BF16 ? 1.0f / 250
                                                       : 1e-6f;
                for (size_t i = blk; i < blk + 32; i++) {
                    float tol = bound + fabsf(a[i]) * rel;
                    if (fabsf(a[i] - b[i]) > tol)
                        T_FAIL("store %d value %zu: %g vs %g (bound %g)", store, i, a[i], b[i],
                               tol);
                }
            }
        }
    }
    pgd_tier_stats st;
    pgd_tier_get_stats(t, &st);
    T_EQ(st.n_records, n_pages);
    T_EQ(st.n_corrupt, 0);
    bytes = st.bytes_used;
    /* Spill of a compressed / re-encoded record gives the pool's codec back: the bytes
     * get gives. */
    T_OK(pgd__tier_ram_check(t));
    *held = bytes;
    free(in);
    free(out);
    free(a);
    free(b);
    pgd_tier_close(t);
    return 0;
}

static int test_options_round_trip(void)
{
    pgd_kv_type pools[] = {PGD_KV_F16, PGD_KV_Q8_0, PGD_KV_BF16, PGD_KV_F32};
    for (size_t p = 0; p < 4; p++) {
        uint64_t raw_held, held;
        T_OK(round_trip(pools[p], -1, PGD_RECORD_RAW, &raw_held));
        for (uint32_t comp = PGD_RECORD_RAW; comp <= PGD_RECORD_ZSTD; comp++) {
            T_OK(round_trip(pools[p], -1, comp, &held));
            T_ASSERT(held <= raw_held);
            T_OK(round_trip(pools[p], (int)pools[p], comp, &held)); /* store = pool: lossless */
            T_OK(round_trip(pools[p], PGD_KV_Q8_0, comp, &held));
            if (pools[p] != PGD_KV_Q8_0) T_ASSERT(held < raw_held);
            T_OK(round_trip(pools[p], PGD_KV_Q4_0, comp, &held));
            T_ASSERT(held < raw_held);
        }
    }
    /* zstd of realistic f16 K/V shrinks it (f16 exponents are redundant). */
    uint64_t raw_held, z_held;
    T_OK(round_trip(PGD_KV_F16, -1, PGD_RECORD_RAW, &raw_held));
    T_OK(round_trip(PGD_KV_F16, -1, PGD_RECORD_ZSTD, &z_held));
    T_ASSERT(z_held < raw_held);
    if (getenv("T_VERBOSE"))
        printf("f16 pages: raw %llu bytes, zstd %llu\n", (unsigned long long)raw_held,
               (unsigned long long)z_held);
    return 0;
}

/* Spill of records stored compressed or re-encoded hands the pool's codec over. */
static int test_spill_decodes(void)
{
    pgd_pool_params pp = geometry(PGD_KV_F16, 1);
    pgd_record_ident id;
    T_OK(pgd_record_ident_make(&pp, fp, &id));
    for (uint32_t comp = PGD_RECORD_RAW; comp <= PGD_RECORD_ZSTD; comp++) {
        pgd_tier_ram_params rp = pgd_tier_ram_default_params();
        rp.capacity_bytes = 2 * (PGD_RECORD_HEADER_BYTES + id.page_bytes + id.bounds_bytes);
        rp.compression = comp;
        pgd_tier *t;
        T_OK(pgd_tier_ram_create(&rp, &t));
        T_OK(pgd_tier_bind(t, &id));
        static uint8_t buf[1 << 20];
        spilled sp;
        memset(&sp, 0, sizeof sp);
        sp.page_bytes = id.page_bytes;
        sp.bounds_bytes = id.bounds_bytes;
        /* Random bytes do not compress (stored raw), half the blocks do. */
        sp.zero_mid = 1;
        uint32_t n = 0;
        while (sp.n < 3) {
            fill_block(buf, id.page_bytes + id.bounds_bytes, t_block_of(n, 0), 1);
            T_OK(pgd_tier_put(t, t_block_of(n, 0), t_parent_of(n, 0), buf, buf + id.page_bytes,
                              on_spill, &sp));
            n++;
            T_ASSERT(n < 10000);
        }
        T_EQ(sp.bad, 0);
        pgd_tier_close(t);
    }
    return 0;
}

/* Refused combinations and parameters. */
static int test_refusals(void)
{
    pgd_tier_ram_params rp = pgd_tier_ram_default_params();
    pgd_tier *t = NULL;
    T_EQ(rp.store_type, -1);
    T_EQ(rp.compression, PGD_RECORD_RAW);
    rp.capacity_bytes = 0;
    T_EQ(pgd_tier_ram_create(&rp, &t), PGD_EINVAL);
    rp = pgd_tier_ram_default_params();
    rp.compression = 3;
    T_EQ(pgd_tier_ram_create(&rp, &t), PGD_EINVAL);
    rp = pgd_tier_ram_default_params();
    rp.store_type = 6;
    T_EQ(pgd_tier_ram_create(&rp, &t), PGD_EINVAL);
    T_EQ(pgd_tier_ram_create(NULL, &t), PGD_EINVAL);
    T_ASSERT(t == NULL);
    /* q8_0 storage of a head_dim the codec refuses (48). */
    pgd_pool_params pp = geometry(PGD_KV_F16, 0);
    pp.head_dim = 48;
    pgd_record_ident id;
    T_OK(pgd_record_ident_make(&pp, fp, &id));
    rp = pgd_tier_ram_default_params();
    rp.store_type = PGD_KV_Q8_0;
    T_OK(pgd_tier_ram_create(&rp, &t));
    T_EQ(pgd_tier_bind(t, &id), PGD_EINVAL);
    pgd_tier_close(t);
    /* A bound below one record. */
    rp = pgd_tier_ram_default_params();
    rp.capacity_bytes = id.page_bytes;
    T_OK(pgd_tier_ram_create(&rp, &t));
    T_EQ(pgd_tier_bind(t, &id), PGD_EINVAL);
    T_EQ(pgd_tier_lookup(t, &id.model_fingerprint, 1), 0); /* unbound: holds nothing */
    T_EQ(pgd_tier_del(t, id.model_fingerprint), PGD_ENOTFOUND);
    T_EQ(strcmp(pgd_tier_name(t), "ram"), 0);
    pgd_tier_close(t);
    return 0;
}

/* Random puts (of compressible and incompressible pages), gets and dels with lz4 / zstd
 * and q4_0 storage, where record sizes vary: the set held is exactly what was put minus
 * what was spilled or deleted, the bound holds, every get returns the block's bytes.
 * The spill callback calls into the tier (lookup): the lock is released for it. */
typedef struct held_model {
    pgd_tier *t;
    uint8_t held[8][8];
    int n_spilled, bad, reentered;
    uint64_t page_bytes;
    int lossless;
} held_model;

static void on_spill_held(void *ud, pgd_hash block, pgd_hash parent, const void *page,
                          const void *bounds)
{
    held_model *hm = ud;
    static uint8_t want[1 << 20];
    (void)parent, (void)bounds;
    for (uint32_t c = 0; c < 8; c++)
        for (uint32_t d = 0; d < 8; d++)
            if (pgd_hash_eq(block, t_block_of(c, d))) {
                if (!hm->held[c][d]) hm->bad = 1; /* spilled what was not held */
                hm->held[c][d] = 0;
                fill_block(want, hm->page_bytes, block, 1);
                if (hm->lossless && memcmp(want, page, (size_t)hm->page_bytes) != 0) hm->bad = 1;
            }
    /* Into the tier from spill: would deadlock if put held its lock. */
    if (pgd_tier_lookup(hm->t, &block, 1) != 0) hm->bad = 1; /* it left the map */
    hm->reentered = 1;
    hm->n_spilled++;
}

static int run_held(int store, uint32_t comp, uint64_t seed)
{
    pgd_pool_params pp = geometry(PGD_KV_F16, 0);
    pgd_record_ident id;
    T_OK(pgd_record_ident_make(&pp, fp, &id));
    pgd_tier_ram_params rp = pgd_tier_ram_default_params();
    /* About 6 incompressible records (a q4_0 record is a quarter of an f16 one). */
    rp.capacity_bytes = 6 * (PGD_RECORD_HEADER_BYTES + id.page_bytes) / (store >= 0 ? 4 : 1);
    rp.store_type = store;
    rp.compression = comp;
    held_model hm;
    memset(&hm, 0, sizeof hm);
    T_OK(pgd_tier_ram_create(&rp, &hm.t));
    T_OK(pgd_tier_bind(hm.t, &id));
    hm.page_bytes = id.page_bytes;
    hm.lossless = store < 0;
    static uint8_t buf[1 << 20], want[1 << 20];
    for (int it = 0; it < 3000; it++) {
        uint32_t c = (uint32_t)(t_rand(&seed) % 8), d = (uint32_t)(t_rand(&seed) % 8);
        pgd_hash h = t_block_of(c, d);
        int op = (int)(t_rand(&seed) % 8);
        if (op < 4) {
            fill_block(buf, id.page_bytes, h, 1);
            T_OK(pgd_tier_put(hm.t, h, t_parent_of(c, d), buf, NULL, on_spill_held, &hm));
            hm.held[c][d] = 1;
        } else if (op < 7) {
            int rc = pgd_tier_get(hm.t, h, buf, NULL);
            T_EQ(rc, hm.held[c][d] ? PGD_OK : PGD_ENOTFOUND);
            fill_block(want, id.page_bytes, h, 1);
            if (rc == PGD_OK && hm.lossless)
                T_ASSERT(memcmp(buf, want, (size_t)id.page_bytes) == 0);
        } else {
            T_EQ(pgd_tier_del(hm.t, h), hm.held[c][d] ? PGD_OK : PGD_ENOTFOUND);
            hm.held[c][d] = 0;
        }
        T_EQ(hm.bad, 0);
        uint64_t n_held = 0;
        for (uint32_t a = 0; a < 8; a++)
            for (uint32_t b = 0; b < 8; b++) {
                pgd_hash x = t_block_of(a, b);
                T_EQ(pgd_tier_lookup(hm.t, &x, 1), hm.held[a][b]);
                n_held += hm.held[a][b];
            }
        pgd_tier_stats st;
        pgd_tier_get_stats(hm.t, &st);
        T_EQ(st.n_records, n_held);
        T_ASSERT(st.bytes_used <= st.bytes_capacity);
        if (it % 100 == 0) T_OK(pgd__tier_ram_check(hm.t));
    }
    if (hm.n_spilled <= 100 || !hm.reentered)
        T_FAIL("store %d comp %u: %d spilled", store, comp, hm.n_spilled);
    pgd_tier_close(hm.t);
    return 0;
}

static int test_held_random(void)
{
    T_OK(run_held(-1, PGD_RECORD_RAW, 3));
    T_OK(run_held(-1, PGD_RECORD_LZ4, 4));
    T_OK(run_held(-1, PGD_RECORD_ZSTD, 5));
    T_OK(run_held(PGD_KV_Q4_0, PGD_RECORD_ZSTD, 6));
    return 0;
}

/* ---- allocation failures ---- */

/* Every allocation of create, bind, put (with eviction and spill), get fails in turn:
 * PGD_ENOMEM (put may succeed with a realloc that shrinks failing), the tier unchanged
 * and usable, nothing leaked at close. */
static int test_alloc_failures(void)
{
    static uint8_t buf[1 << 20];
    pgd_pool_params pp = geometry(PGD_KV_F16, 1);
    pgd_record_ident id;
    T_OK(pgd_record_ident_make(&pp, fp, &id));
    int stores[] = {-1, -1, PGD_KV_Q8_0};
    uint32_t comps[] = {PGD_RECORD_RAW, PGD_RECORD_LZ4, PGD_RECORD_ZSTD};
    for (int k = 0; k < 3; k++) {
        t_counting ca = {0};
        pgd_allocator al = T_COUNTING_ALLOCATOR(&ca);
        pgd_tier_ram_params rp = pgd_tier_ram_default_params();
        rp.capacity_bytes = 2 * (PGD_RECORD_HEADER_BYTES + id.page_bytes + id.bounds_bytes);
        rp.store_type = stores[k];
        rp.compression = comps[k];
        rp.alloc = &al;
        pgd_tier *t = NULL;
        int rc;
        for (long n = 1;; n++) {
            t_counting_arm(&ca, n);
            rc = pgd_tier_ram_create(&rp, &t);
            if (rc == PGD_OK) break;
            T_EQ(rc, PGD_ENOMEM);
            T_ASSERT(t == NULL);
            T_EQ(ca.n_live, 0);
        }
        for (long n = 1;; n++) {
            t_counting_arm(&ca, n);
            rc = pgd_tier_bind(t, &id);
            if (rc == PGD_OK) break;
            T_EQ(rc, PGD_ENOMEM);
        }
        t_counting_arm(&ca, 0);
        /* Three puts into room for two: the third evicts and spills. */
        for (uint32_t c = 0; c < 3; c++) {
            t_fill_block(buf, id.page_bytes + id.bounds_bytes, t_block_of(c, 0));
            spilled sp;
            memset(&sp, 0, sizeof sp);
            sp.page_bytes = id.page_bytes;
            sp.bounds_bytes = id.bounds_bytes;
            for (long n = 1;; n++) {
                pgd_tier_stats before, after;
                pgd_tier_get_stats(t, &before);
                t_counting_arm(&ca, n);
                rc = pgd_tier_put(t, t_block_of(c, 0), t_parent_of(c, 0), buf, buf + id.page_bytes,
                                  k == 0 ? on_spill : NULL, &sp);
                t_counting_arm(&ca, 0);
                T_OK(pgd__tier_ram_check(t));
                if (rc == PGD_OK) break;
                T_EQ(rc, PGD_ENOMEM);
                pgd_tier_get_stats(t, &after);
                T_EQ(after.n_records, before.n_records);
                T_EQ(after.bytes_used, before.bytes_used);
            }
            T_EQ(sp.bad, 0);
        }
        for (long n = 1;; n++) {
            t_counting_arm(&ca, n);
            rc = pgd_tier_get(t, t_block_of(2, 0), buf, buf + id.page_bytes);
            t_counting_arm(&ca, 0);
            if (rc == PGD_OK) break;
            T_EQ(rc, PGD_ENOMEM);
            pgd_hash h = t_block_of(2, 0);
            T_EQ(pgd_tier_lookup(t, &h, 1), 1); /* still held */
        }
        pgd_tier_close(t);
        T_EQ(ca.n_live, 0);
    }
    return 0;
}

/* ---- threads ---- */

typedef struct worker {
    pgd_tier *t;
    uint64_t page_bytes;
    uint64_t seed;
    int bad;
} worker;

static void *work(void *arg)
{
    worker *w = arg;
    uint8_t *buf = malloc((size_t)w->page_bytes), *want = malloc((size_t)w->page_bytes);
    for (int it = 0; it < 3000; it++) {
        uint32_t c = (uint32_t)(t_rand(&w->seed) % 16), d = (uint32_t)(t_rand(&w->seed) % 4);
        pgd_hash h = t_block_of(c, d);
        int op = (int)(t_rand(&w->seed) % 4);
        if (op < 2) {
            t_fill_block(buf, w->page_bytes, h);
            if (pgd_tier_put(w->t, h, t_parent_of(c, d), buf, NULL, NULL, NULL) != PGD_OK)
                w->bad = 1;
        } else if (op == 2) {
            int rc = pgd_tier_get(w->t, h, buf, NULL);
            t_fill_block(want, w->page_bytes, h);
            if (rc == PGD_OK && memcmp(buf, want, (size_t)w->page_bytes) != 0) w->bad = 1;
            if (rc != PGD_OK && rc != PGD_ENOTFOUND) w->bad = 1;
        } else {
            pgd_tier_del(w->t, h);
        }
    }
    free(buf);
    free(want);
    return NULL;
}

static int test_threads(void)
{
    pgd_pool_params pp = geometry(PGD_KV_F16, 0);
    pgd_record_ident id;
    T_OK(pgd_record_ident_make(&pp, fp, &id));
    for (uint32_t comp = PGD_RECORD_RAW; comp <= PGD_RECORD_LZ4; comp++) {
        pgd_tier_ram_params rp = pgd_tier_ram_default_params();
        rp.capacity_bytes = 20 * (PGD_RECORD_HEADER_BYTES + id.page_bytes);
        rp.compression = comp;
        pgd_tier *t;
        T_OK(pgd_tier_ram_create(&rp, &t));
        T_OK(pgd_tier_bind(t, &id));
        pthread_t th[4];
        worker w[4];
        for (int i = 0; i < 4; i++) {
            w[i].t = t;
            w[i].page_bytes = id.page_bytes;
            w[i].seed = (uint64_t)i + 11;
            w[i].bad = 0;
            pthread_create(&th[i], NULL, work, &w[i]);
        }
        for (int i = 0; i < 4; i++) {
            pthread_join(th[i], NULL);
            T_EQ(w[i].bad, 0);
        }
        T_OK(pgd__tier_ram_check(t));
        pgd_tier_stats st;
        pgd_tier_get_stats(t, &st);
        T_ASSERT(st.bytes_used <= st.bytes_capacity);
        pgd_tier_close(t);
    }
    return 0;
}

/* ---- policies and retention (params.policy, pin_share, the retain op) ---- */

static char pol_log[4096];

static void pol_log_fn(void *ud, int level, const char *msg)
{
    (void)ud, (void)level;
    size_t n = strlen(pol_log);
    snprintf(pol_log + n, sizeof pol_log - n, "%s\n", msg);
}

static uint64_t fake_ns;

static uint64_t fake_clock(void *ud)
{
    (void)ud;
    return fake_ns;
}

/* A RAM tier of n_records f16 records (no bounds) ordered by kind, bound to id. */
static pgd_tier *policy_tier(int kind, uint32_t n_records, double pin_share, pgd_record_ident *id)
{
    pgd_pool_params pp = geometry(PGD_KV_F16, 0);
    if (pgd_record_ident_make(&pp, fp, id) != PGD_OK) return NULL;
    pgd_tier_ram_params rp = pgd_tier_ram_default_params();
    rp.capacity_bytes = n_records * (PGD_RECORD_HEADER_BYTES + id->page_bytes);
    rp.policy = kind;
    rp.pin_share = pin_share;
    rp.log = pol_log_fn;
    pgd_tier *t = NULL;
    if (pgd_tier_ram_create(&rp, &t) != PGD_OK) return NULL;
    if (pgd_tier_bind(t, id) != PGD_OK) {
        pgd_tier_close(t);
        return NULL;
    }
    fake_ns = 1000ull * 1000000000ull;
    if (pgd__tier_ram_set_clock(t, fake_clock, NULL) != PGD_OK) {
        pgd_tier_close(t);
        return NULL;
    }
    return t;
}

static int put_cd(pgd_tier *t, const pgd_record_ident *id, uint32_t c, uint32_t d)
{
    static uint8_t page[1 << 20];
    t_fill_block(page, id->page_bytes, t_block_of(c, d));
    return pgd_tier_put(t, t_block_of(c, d), t_parent_of(c, d), page, NULL, NULL, NULL);
}

static int held_cd(pgd_tier *t, uint32_t c, uint32_t d)
{
    pgd_hash h = t_block_of(c, d);
    return (int)pgd_tier_lookup(t, &h, 1);
}

static int get_cd(pgd_tier *t, const pgd_record_ident *id, uint32_t c, uint32_t d)
{
    static uint8_t page[1 << 20];
    return pgd_tier_get(t, t_block_of(c, d), page, NULL);
}

/* Leaf-only under every policy a tier takes: a random run of chains put leaf first or
 * root first, gets and retention; each evicted record has no child held when it goes
 * (the spill callback looks), and the tier's check holds. */
typedef struct leaf_spy {
    pgd_tier *t;
    int bad, n;
    uint32_t n_chains, len;
    pgd_hash putting; /* the block of the put in progress (inserted after its victims) */
} leaf_spy;

static void leaf_spill(void *ud, pgd_hash block, pgd_hash parent, const void *page,
                       const void *bounds)
{
    leaf_spy *sp = ud;
    (void)parent, (void)page, (void)bounds;
    sp->n++;
    for (uint32_t c = 0; c < sp->n_chains; c++)
        for (uint32_t d = 0; d + 1 < sp->len; d++)
            if (pgd_hash_eq(block, t_block_of(c, d)) && held_cd(sp->t, c, d + 1) &&
                !pgd_hash_eq(sp->putting, t_block_of(c, d + 1)))
                sp->bad++;
}

static int test_policy_leaf_only(void)
{
    for (int kind = 0; kind < PGD_POLICY_COUNT; kind++) {
        pgd_record_ident id;
        pol_log[0] = '\0';
        pgd_tier *t = policy_tier(kind, 12, 0.25, &id);
        if (kind == PGD_POLICY_BELADY || !pgd_policy_builtin((pgd_policy_kind)kind)) {
            T_ASSERT(t == NULL); /* refused, with a line that names the valid ones */
            T_ASSERT(strstr(pol_log, "lru") != NULL);
            continue;
        }
        T_ASSERT(t != NULL);
        leaf_spy sp = {t, 0, 0, 16, 6, {0, 0}};
        static uint8_t page[1 << 20];
        uint64_t seed = 77 + (uint64_t)kind;
        for (int step = 0; step < 1500; step++) {
            uint32_t c = (uint32_t)(t_rand(&seed) % sp.n_chains);
            uint32_t op = (uint32_t)(t_rand(&seed) % 10);
            if (op < 5) { /* a chain's run, root first or leaf first (demotion) */
                int leaf_first = (int)(t_rand(&seed) & 1);
                for (uint32_t i = 0; i < sp.len; i++) {
                    uint32_t d = leaf_first ? sp.len - 1 - i : i;
                    t_fill_block(page, id.page_bytes, t_block_of(c, d));
                    sp.putting = t_block_of(c, d);
                    int rc = pgd_tier_put(t, t_block_of(c, d), t_parent_of(c, d), page, NULL,
                                          leaf_spill, &sp);
                    T_ASSERT(rc == PGD_OK || rc == PGD_ENOSPC);
                }
            } else if (op < 8) {
                uint32_t d = (uint32_t)(t_rand(&seed) % sp.len);
                int rc = get_cd(t, &id, c, d);
                T_ASSERT(rc == PGD_OK || rc == PGD_ENOTFOUND);
            } else {
                pgd_tier_retention r = {(uint32_t)(t_rand(&seed) % 101),
                                        t_rand(&seed) % 3,
                                        (int)(t_rand(&seed) % 3) - 1,
                                        0,
                                        0,
                                        0};
                int rc = pgd_tier_retain(t, t_block_of(c, (uint32_t)(t_rand(&seed) % sp.len)), &r);
                T_ASSERT(rc == PGD_OK || rc == PGD_ENOTFOUND || rc == PGD_ENOSPC);
                fake_ns += 1000000000ull; /* a second passes: TTLs of 1 and 2 s expire */
            }
            T_OK(pgd__tier_ram_check(t));
        }
        T_EQ(sp.bad, 0);
        T_ASSERT(sp.n > 100);
        pgd_tier_close(t);
    }
    return 0;
}

static const char *kind_name(int kind)
{
    static const char *names[] = {"lru", "belady", "s3fifo", "arc", "cost", "priority"};
    return kind >= 0 && kind < 6 ? names[kind] : "?";
}

/* Policies order a tier's evictions: a record used again is kept over one-hit records
 * by s3fifo and arc, where LRU drops it once enough one-hit records arrived. */
static int reuse_kept(int kind, int *kept)
{
    pgd_record_ident id;
    pgd_tier *t = policy_tier(kind, 20, 0, &id);
    T_ASSERT(t != NULL);
    T_OK(put_cd(t, &id, 0, 0));
    T_OK(get_cd(t, &id, 0, 0));
    T_OK(get_cd(t, &id, 0, 0));
    for (uint32_t c = 1; c <= 60; c++)
        T_OK(put_cd(t, &id, c, 0));
    *kept = held_cd(t, 0, 0);
    T_OK(pgd__tier_ram_check(t));
    pgd_tier_close(t);
    return 0;
}

static int test_policy_orders(void)
{
    int kept = -1;
    T_OK(reuse_kept(PGD_POLICY_LRU, &kept));
    T_EQ(kept, 0);
    static const int scan_resistant[] = {PGD_POLICY_S3FIFO, PGD_POLICY_ARC};
    for (size_t i = 0; i < sizeof scan_resistant / sizeof scan_resistant[0]; i++) {
        int kind = scan_resistant[i];
        if (!pgd_policy_builtin((pgd_policy_kind)kind)) {
            printf("  %s: not built in yet, skipped\n", kind_name(kind));
            continue;
        }
        T_OK(reuse_kept(kind, &kept));
        T_EQ(kept, 1);
    }
    /* priority: the lowest priority goes first, whatever its age. */
    if (pgd_policy_builtin(PGD_POLICY_PRIORITY)) {
        pgd_record_ident id;
        pgd_tier *t = policy_tier(PGD_POLICY_PRIORITY, 4, 0, &id);
        T_ASSERT(t != NULL);
        for (uint32_t c = 0; c < 4; c++)
            T_OK(put_cd(t, &id, c, 0));
        pgd_tier_retention hi = {90, 0, 0, 0, 0, 0}, lo = {5, 0, 0, 0, 0, 0};
        T_OK(pgd_tier_retain(t, t_block_of(0, 0), &hi));
        T_OK(pgd_tier_retain(t, t_block_of(3, 0), &lo));
        T_OK(put_cd(t, &id, 4, 0));
        T_EQ(held_cd(t, 3, 0), 0); /* the newest, but the lowest priority */
        T_EQ(held_cd(t, 0, 0), 1);
        pgd_tier_close(t);
    } else {
        printf("  priority: not built in yet, skipped\n");
    }
    return 0;
}

/* Retention: an expired record is evicted first; an expired record whose child is held
 * waits for it (leaf-only); a pinned one survives pressure; pins are bounded by the share. */
static int test_retention(void)
{
    pgd_record_ident id;
    pgd_tier *t = policy_tier(PGD_POLICY_LRU, 4, 0.5, &id);
    T_ASSERT(t != NULL);
    pgd_tier_retention ttl = {PGD_PRIORITY_DEFAULT, 10, 0, 0, 0, 0};
    T_EQ(pgd_tier_retain(t, t_block_of(9, 0), &ttl), PGD_ENOTFOUND);
    for (uint32_t c = 0; c < 4; c++)
        T_OK(put_cd(t, &id, c, 0));
    T_OK(pgd_tier_retain(t, t_block_of(2, 0), &ttl));
    /* Not expired yet: LRU's choice, the oldest. */
    T_OK(put_cd(t, &id, 4, 0));
    T_EQ(held_cd(t, 0, 0), 0);
    T_EQ(held_cd(t, 2, 0), 1);
    /* Past its expiry: it goes before the LRU record (1, 0). */
    fake_ns += 11ull * 1000000000ull;
    T_OK(put_cd(t, &id, 5, 0));
    T_EQ(held_cd(t, 2, 0), 0);
    T_EQ(held_cd(t, 1, 0), 1);
    T_OK(pgd__tier_ram_check(t));

    /* Pins: (1, 0), the oldest, pinned, survives a flood; the share is 2 of 4 records. */
    pgd_tier_retention pin = {PGD_PRIORITY_DEFAULT, 0, 1, 0, 0, 0};
    pgd_tier_retention unpin = {PGD_PRIORITY_DEFAULT, 0, -1, 0, 0, 0};
    T_OK(pgd_tier_retain(t, t_block_of(1, 0), &pin));
    T_OK(pgd_tier_retain(t, t_block_of(1, 0), &pin)); /* again: no second charge */
    for (uint32_t c = 10; c < 30; c++)
        T_OK(put_cd(t, &id, c, 0));
    T_EQ(held_cd(t, 1, 0), 1);
    T_OK(pgd_tier_retain(t, t_block_of(29, 0), &pin));
    T_EQ(pgd_tier_retain(t, t_block_of(28, 0), &pin), PGD_ENOSPC); /* over the share */
    T_OK(pgd__tier_ram_check(t));
    T_OK(pgd_tier_retain(t, t_block_of(1, 0), &unpin));
    T_OK(pgd_tier_retain(t, t_block_of(28, 0), &pin)); /* room again */
    for (uint32_t c = 30; c < 40; c++)
        T_OK(put_cd(t, &id, c, 0));
    T_EQ(held_cd(t, 1, 0), 0); /* unpinned: evicted like any other */
    T_EQ(held_cd(t, 28, 0), 1);
    T_EQ(held_cd(t, 29, 0), 1);
    /* Everything pinned but the share: puts go on in the unpinned half. */
    pgd_tier_stats st;
    pgd_tier_get_stats(t, &st);
    T_EQ(st.n_put_refused, 0);
    T_OK(pgd__tier_ram_check(t));
    pgd_tier_close(t);

    /* Leaf-only with expiry: root (0, 0) expired while its child (0, 1) is held stays;
     * the child goes first (the oldest leaf), then the root. */
    t = policy_tier(PGD_POLICY_LRU, 3, 0, &id);
    T_ASSERT(t != NULL);
    T_OK(put_cd(t, &id, 0, 0));
    T_OK(put_cd(t, &id, 0, 1));
    T_OK(put_cd(t, &id, 1, 0));
    T_OK(pgd_tier_retain(t, t_block_of(0, 0), &ttl));
    fake_ns += 11ull * 1000000000ull;
    T_OK(put_cd(t, &id, 2, 0));
    T_EQ(held_cd(t, 0, 0), 1);
    T_EQ(held_cd(t, 0, 1), 0);
    T_EQ(held_cd(t, 1, 0), 1);
    T_OK(put_cd(t, &id, 3, 0));
    T_EQ(held_cd(t, 0, 0), 0); /* a leaf now, and expired: before (1, 0) */
    T_EQ(held_cd(t, 1, 0), 1);
    T_OK(pgd__tier_ram_check(t));
    pgd_tier_close(t);
    return 0;
}

/* belady, an unknown kind and a bad share are refused at create, with a clear line. */
/* Quotas: tenant 1 reserves half of an 8-record tier; its 4 records survive a flood of
 * untagged ones, a fifth (over its share) is evictable, and without the reservation the
 * flood takes them all. */
static int quota_run(double share, int *kept)
{
    pgd_record_ident id;
    pgd_tier *t = policy_tier(PGD_POLICY_LRU, 8, 0.5, &id);
    T_ASSERT(t != NULL);
    pgd_tier_retention mine = {PGD_PRIORITY_DEFAULT, 0, 0, 77, 1, share};
    for (uint32_t c = 0; c < 5; c++) {
        T_OK(put_cd(t, &id, c, 0));
        T_OK(pgd_tier_retain(t, t_block_of(c, 0), &mine));
    }
    for (uint32_t c = 100; c < 140; c++)
        T_OK(put_cd(t, &id, c, 0));
    *kept = 0;
    for (uint32_t c = 0; c < 5; c++)
        *kept += held_cd(t, c, 0);
    T_OK(pgd__tier_ram_check(t));
    pgd_tier_close(t);
    return 0;
}

static int test_quotas(void)
{
    int kept;
    T_OK(quota_run(0.5, &kept));
    T_EQ(kept, 4); /* the reservation: 4 of 8; the fifth, over it, went like any other */
    T_OK(quota_run(0, &kept));
    T_EQ(kept, 0); /* no reservation: LRU alone */
    return 0;
}

static int test_policy_refusals(void)
{
    pgd_tier_ram_params rp = pgd_tier_ram_default_params();
    pgd_tier *t = NULL;
    T_EQ(rp.policy, PGD_POLICY_LRU);
    rp.log = pol_log_fn;
    pol_log[0] = '\0';
    rp.policy = PGD_POLICY_BELADY;
    T_EQ(pgd_tier_ram_create(&rp, &t), PGD_EINVAL);
    T_ASSERT(strstr(pol_log, "belady needs the future") != NULL);
    pol_log[0] = '\0';
    rp.policy = 99;
    T_EQ(pgd_tier_ram_create(&rp, &t), PGD_EINVAL);
    T_ASSERT(strstr(pol_log, "unknown policy 99") != NULL);
    rp.policy = PGD_POLICY_LRU;
    rp.pin_share = 1.5;
    T_EQ(pgd_tier_ram_create(&rp, &t), PGD_EINVAL);
    rp.pin_share = -0.1;
    T_EQ(pgd_tier_ram_create(&rp, &t), PGD_EINVAL);
    T_ASSERT(t == NULL);
    return 0;
}

int main(void)
{
    T_RUN(test_map);
    T_RUN(test_map_random);
    T_RUN(test_map_crafted_parents);
    T_RUN(test_model);
    T_RUN(test_eviction_order);
    T_RUN(test_corrupt);
    T_RUN(test_options_round_trip);
    T_RUN(test_spill_decodes);
    T_RUN(test_refusals);
    T_RUN(test_held_random);
    T_RUN(test_alloc_failures);
    T_RUN(test_threads);
    T_RUN(test_policy_leaf_only);
    T_RUN(test_policy_orders);
    T_RUN(test_retention);
    T_RUN(test_policy_refusals);
    T_RUN(test_quotas);
    T_DONE();
}
