/* SPDX-License-Identifier: MIT */
/*
 * fuzz_cache_ops.c - fuzz target: the input is a program of cache-manager operations
 * (create/match/grow/write/commit/fork/destroy/evict/truncate, with token and hash streams
 * from the input bytes) run against a tiny pool, with pgd_cache_check() after every step.
 * Any broken invariant aborts (pgd_cache_check failing is turned into abort()), so the
 * fuzzer finds op sequences that corrupt refcounts, the index tree or the policy.
 * The index events (on_register / on_evict) feed a model that aborts when a page is
 * registered twice, evicted without being registered or twice, or before a child.
 * Token matches and commits also run with precomputed hashes (match_hashed with the
 * sequence's real hashes or input bytes, commit_hashed with input bytes: trusted, so any
 * garbage must still leave the cache consistent).
 *
 * Tiers (cache.h "Tiers"): flags of the first byte put a small RAM tier below the pool
 * (a few records: it evicts, and spills into the next), optionally a second RAM tier below
 * it, optionally wrap one of them (pgd_tier_wrap) so that its gets fail on calls the input
 * chooses (fills fail, sequences are cut back), with key bounds, write-through and
 * compression as the input says. The ops then also flush, prefetch (hashes of a live
 * sequence's query, of the input, or of the cached blocks), park, ready / wait and arm the
 * faults. Every page is tagged when it is registered by a commit: its payload and key
 * bounds become a function of its block hash (as tests/unit/test_cache_tiers.c does), so
 * a page registered by a promotion (settled by ready / wait or a mutating call) must hold
 * its hash's tag, or the target aborts: a tier served bytes that were never demoted under
 * that hash. A match with flag 0x20 also waits and checks every page of the sequence.
 * The RAM tiers must never find a damaged record, stay within their bound and pass
 * pgd__tier_ram_check (map, headers, byte counts) after every step, and the cache's tier
 * counters must add up (fills <= pages promoted, the write-back depth within its slots).
 * Determinism for libFuzzer: one mover thread, and pgd_cache_flush after every op, so
 * the movers are idle at every check; the "racy" flag leaves two movers running between
 * ops (the checks hold at any time; only the coverage becomes noisy).
 *
 * Retention, admin operations and tenants (op 9's variants): a sequence's retention, pin /
 * unpin / evict_chain / warm of a live query's chain, a tenant's reservation of the pool and
 * tier 0, next-use hints, and the cache's clock (an injected one the ops move), so TTLs and
 * pin expiries run under the same checks. Op 9's variant 7 compacts a sequence (token
 * budgets: compact_op) with valid or broken lists. The policy: Belady with FLAG_BELADY, else one
 * of the online policies picked by the input's length.
 *
 * Window layers (cache.h "Window layers"): FLAG_FAULTY without FLAG_TIER0 (no tier to wrap)
 * gives the pool a second layer that is a window layer of W = 6 positions, in a group of 6
 * pages of its own: grows release its old pages, matches are cut back to cached windows,
 * and pgd_cache_check walks both groups and their agreement after every op.
 *
 * Input layout: byte 0 is the flags (FLAG_*); with FLAG_TIER0 two configuration bytes
 * follow (see config()); then a stream of ops: [op byte][argument bytes...], op = low 4
 * bits, variants in the high bits; a short tail ends the program.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pagoda/cache.h>
#include <pagoda/tier.h>

#include "pgd_int.h"       /* pgd__pool_key_bounds_mut: the tags of key bounds */
#include "tier/tier_int.h" /* pgd__tier_ram_check */

#include "t_tier.h"

#define MAX_SEQS 8

enum { NL = 1, NH = 1, HD = 4, PT = 4, N_BOUNDS = NL * NH * 2 * HD };

enum {
    FLAG_BELADY = 1,     /* else LRU */
    FLAG_TIER0 = 2,      /* a RAM tier below the pool (two config bytes follow) */
    FLAG_TIER1 = 4,      /* a second RAM tier below it */
    FLAG_FAULTY = 8,     /* one tier is wrapped: its gets fail when the faults say */
    FLAG_BOUNDS = 16,    /* the pool keeps key bounds (records carry them) */
    FLAG_WT = 32,        /* write-through to tier 0 */
    FLAG_RACY = 64,      /* two movers, not drained between ops */
    FLAG_FAULTY_T1 = 128 /* the wrapped tier is tier 1 (when there is one) */
};

typedef struct reader {
    const uint8_t *p;
    size_t n;
} reader;

static int take(reader *r, uint8_t *b)
{
    if (!r->n) return 0;
    *b = *r->p++;
    r->n--;
    return 1;
}

/* The cache's clock (params.clock): moved by the ops, so TTLs expire on the input's say. */
static uint64_t g_now;
static uint64_t fuzz_clock(void *ud)
{
    (void)ud;
    return g_now;
}

static uint64_t oracle(void *ud, pgd_hash h)
{
    (void)ud;
    return (h.lo * 0x9E3779B97F4A7C15ull) >> 40; /* any total order will do */
}

static void fail(const char *what)
{
    fprintf(stderr, "fuzz_cache_ops: %s\n", what);
    abort();
}

/* ---- tags: a registered page's bytes as a function of its block hash ---- */

static pgd_pool *g_pool; /* the cache's pool, for the event callbacks */
static int g_bounds;     /* the pool keeps key bounds */
static int g_committing; /* a commit runs: registrations tag; else they are checked */

/* Repeats every 16 bytes, so that a compressing tier really compresses. */
static uint8_t tag_byte(pgd_hash h, uint64_t i)
{
    return (uint8_t)(t_mix(h.lo ^ t_mix(h.hi + ((i >> 3) & 1))) >> ((i & 7) * 8));
}

static float tag_bound(pgd_hash h, uint32_t i)
{
    return (float)((int)tag_byte(h, 16 + i) - 128);
}

static void tag_page(uint32_t page, pgd_hash h)
{
    uint8_t *d = pgd_pool_page_data(g_pool, page);
    for (uint64_t i = 0; i < pgd_pool_page_bytes(g_pool); i++)
        d[i] = tag_byte(h, i);
    if (g_bounds) {
        float *b = pgd__pool_key_bounds_mut(g_pool, page, 0, 0);
        for (uint32_t i = 0; i < N_BOUNDS; i++)
            b[i] = tag_bound(h, i);
    }
}

static int page_tagged(uint32_t page, pgd_hash h)
{
    const uint8_t *d = pgd_pool_page_data(g_pool, page);
    for (uint64_t i = 0; i < pgd_pool_page_bytes(g_pool); i++)
        if (d[i] != tag_byte(h, i)) return 0;
    if (g_bounds) {
        const float *b = pgd_pool_key_bounds(g_pool, page, 0, 0);
        for (uint32_t i = 0; i < N_BOUNDS; i++)
            if (b[i] != tag_bound(h, i)) return 0;
    }
    return 1;
}

/* ---- event model: the live index entries, as the events tell them ---- */

#define MAX_LIVE 64

typedef struct {
    pgd_hash hash, parent;
    uint32_t depth;
} live_entry;

static live_entry live[MAX_LIVE];
static uint32_t n_live;

static int live_find(pgd_hash h)
{
    for (uint32_t i = 0; i < n_live; i++)
        if (pgd_hash_eq(live[i].hash, h)) return (int)i;
    return -1;
}

static void on_register(void *ud, pgd_hash hash, pgd_hash parent, uint32_t depth, uint32_t page)
{
    (void)ud;
    if (live_find(hash) >= 0) fail("a cached hash registered twice");
    if (depth > 0) {
        int p = live_find(parent);
        if (p < 0 || live[p].depth + 1 != depth) fail("registered under a parent not cached");
    }
    if (n_live == MAX_LIVE) fail("more entries than pages");
    live[n_live].hash = hash;
    live[n_live].parent = parent;
    live[n_live].depth = depth;
    n_live++;
    if (g_committing)
        tag_page(page, hash);
    else if (!page_tagged(page, hash)) /* not a commit: a promotion settled */
        fail("a promoted page holds bytes not demoted under its hash");
}

static void on_evict(void *ud, pgd_hash hash, uint32_t page)
{
    (void)ud, (void)page;
    int i = live_find(hash);
    if (i < 0) fail("evicted a page not registered, or twice");
    for (uint32_t j = 0; j < n_live; j++)
        if (live[j].depth > 0 && pgd_hash_eq(live[j].parent, hash)) fail("parent evicted first");
    live[i] = live[--n_live];
}

/* Unpins the chain of every registered page (from its root, as the events model knows
 * it), so that clear can drop everything. */
static void unpin_all(pgd_cache *c)
{
    for (uint32_t i = 0; i < n_live; i++) {
        pgd_hash chain[MAX_LIVE];
        int k = (int)i, n = 0;
        while (k >= 0 && n < MAX_LIVE) {
            chain[n++] = live[k].hash;
            k = live[k].depth ? live_find(live[k].parent) : -1;
        }
        for (int a = 0, b = n - 1; a < b; a++, b--) {
            pgd_hash t = chain[a];
            chain[a] = chain[b];
            chain[b] = t;
        }
        if (pgd_cache_unpin(c, chain, (size_t)n) < 0) fail("pgd_cache_unpin failed");
    }
}

/* ---- a tier whose gets fail on the calls the input chose ---- */

typedef struct faulty {
    pgd_tier *inner;
    pthread_mutex_t mu;
    uint32_t fail_mask; /* bit i: the i-th next get fails */
    int fail_eio;       /* fail with PGD_EIO (the record stays), else drop it (damaged) */
} faulty;

static int f_get(void *st, pgd_hash b, void *page, void *bounds)
{
    faulty *f = st;
    pthread_mutex_lock(&f->mu);
    int fails = f->fail_mask & 1, eio = f->fail_eio;
    f->fail_mask >>= 1;
    pthread_mutex_unlock(&f->mu);
    if (!fails) return pgd_tier_get(f->inner, b, page, bounds);
    if (eio) return PGD_EIO;
    pgd_tier_del(f->inner, b); /* damaged: the tier drops it */
    return PGD_ENOTFOUND;
}
static void f_close(void *st)
{
    faulty *f = st;
    pgd_tier_close(f->inner);
    pthread_mutex_destroy(&f->mu);
    free(f);
}
static const pgd_tier_ops faulty_ops = {"faulty",
                                        t_tier_fwd_bind,
                                        t_tier_fwd_put,
                                        f_get,
                                        t_tier_fwd_lookup,
                                        t_tier_fwd_del,
                                        t_tier_fwd_stats,
                                        t_tier_fwd_flush,
                                        f_close,
                                        NULL,
                                        NULL};

static faulty *g_fault; /* the wrapped tier's state, NULL: none */

static void fault_arm(uint32_t mask, int eio)
{
    if (!g_fault) return;
    pthread_mutex_lock(&g_fault->mu);
    g_fault->fail_mask = mask;
    g_fault->fail_eio = eio;
    pthread_mutex_unlock(&g_fault->mu);
}

/* A RAM tier of n_records records of rec_bytes, compressed or not; wrapped when asked.
 * *ram gets the RAM tier itself. */
static pgd_tier *ram_tier(uint64_t n_records, uint64_t rec_bytes, uint32_t compression, int wrap,
                          pgd_tier **ram)
{
    pgd_tier_ram_params rp = pgd_tier_ram_default_params();
    pgd_tier *t = NULL, *w = NULL;
    rp.capacity_bytes = n_records * rec_bytes;
    rp.compression = compression;
    if (pgd_tier_ram_create(&rp, &t) != PGD_OK) fail("pgd_tier_ram_create failed");
    *ram = t;
    if (!wrap) return t;
    faulty *f = calloc(1, sizeof *f);
    if (!f) abort();
    f->inner = t;
    pthread_mutex_init(&f->mu, NULL);
    if (pgd_tier_wrap(&faulty_ops, f, &w) != PGD_OK) fail("pgd_tier_wrap failed");
    g_fault = f;
    return w;
}

/* ---- checks ---- */

static pgd_tier *g_tiers[2]; /* as the cache has them */
static pgd_tier *g_rams[2];  /* the RAM tiers (g_tiers[i], or what wraps) */
static uint32_t g_n_tiers;

static uint32_t g_writeback_pages; /* the write-back queue's slots */

static void must_check(pgd_cache *c)
{
    pgd_cache_stats st;
    uint64_t hits = 0, promoted = 0;
    if (pgd_cache_check(c) != PGD_OK) fail("pgd_cache_check failed");
    pgd_cache_get_stats(c, &st);
    if (st.n_pages_cached != n_live) fail("events disagree with n_pages_cached");
    for (uint32_t i = 0; i < g_n_tiers; i++) {
        pgd_cache_tier_stats cs;
        if (pgd_cache_get_tier_stats(c, i, &cs) != PGD_OK) fail("tier stats refused");
        hits += cs.hit_pages;
        promoted += cs.promoted_pages; /* a hit is a promoted page once settled */
        if (cs.hit_tokens != cs.hit_pages * PT) fail("tier stats: hit tokens are not pages");
        if (cs.writeback_depth > g_writeback_pages) fail("write-back queue over its slots");
    }
    if (hits > promoted) fail("tier stats: more hits than pages promoted");
    for (uint32_t i = 0; i < g_n_tiers; i++) {
        pgd_tier_stats ts;
        pgd_tier_get_stats(g_tiers[i], &ts);
        if (ts.bytes_used > ts.bytes_capacity) fail("a RAM tier over its bound");
        if (ts.n_corrupt) fail("a RAM tier found a damaged record");
        if (!!ts.n_records != !!ts.bytes_used) fail("a RAM tier's records and bytes disagree");
        if (pgd__tier_ram_check(g_rams[i]) != PGD_OK) fail("pgd__tier_ram_check failed");
    }
}

/* Checks that the pages [0, length) of s, just matched against hashes qh[0..n_qh) and
 * settled, hold their blocks' tags. */
static void check_matched(pgd_cache *c, pgd_seq *s, const pgd_hash *qh, size_t n_qh)
{
    const uint32_t *ids;
    if (pgd_seq_wait(c, s) != PGD_OK) fail("pgd_seq_wait failed");
    if (pgd_seq_ready(c, s) != 1) fail("not ready after pgd_seq_wait");
    uint64_t len = pgd_seq_length(c, s);
    if (len % PT || len != pgd_seq_n_committed(c, s) || len / PT > n_qh)
        fail("a matched sequence's length is not whole matched pages");
    uint32_t n = pgd_seq_pages(c, s, &ids);
    for (uint32_t i = 0; i < n; i++)
        if (!page_tagged(ids[i], qh[i])) fail("a matched page holds another block's bytes");
}

/* ---- compaction ---- */

/* Compacts s (pgd_seq_compact, one list: NL = NH = 1) to 1 + n % length slots drawn (from
 * a seed byte of the input) from the slots that are not dead (its mask), with dead slots of its own
 * (n_live below n_out) when a says, or a broken list when a says: a repeat, a slot past the length,
 * a dead slot, n_live 0. A valid list must succeed (the pages it returns are the page count
 * it took off) or find no page (ENOSPC) or a pending promotion (ESTATE); a broken one must
 * be refused (EINVAL, or ESTATE first); on error the length stays. */
static void compact_op(pgd_cache *c, pgd_seq *s, reader *r, uint8_t a, uint8_t n)
{
    uint32_t keep[64], cand[64], n_cand = 0, mask_len;
    const uint32_t *dead_from, *ids;
    uint64_t len = pgd_seq_length(c, s);
    if (len == 0 || len > 64) return;
    pgd__seq_mask(s, &mask_len, &dead_from); /* single caller: s is not changing */
    for (uint32_t t = 0; t < len; t++)
        if (!dead_from || t < dead_from[0] || t >= mask_len) cand[n_cand++] = t;
    uint32_t n_out = 1 + n % (uint32_t)len;
    uint32_t n_keep = a & 0x10 ? 1 + (uint32_t)(n >> 3) % n_out : n_out;
    if (n_keep > n_cand) n_keep = n_cand;
    if (!(a & 0x10)) n_out = n_keep;
    uint8_t seed = 0;
    take(r, &seed);
    uint64_t x = (uint64_t)seed << 8 | n;
    for (uint32_t i = 0, got = 0; i < n_cand && got < n_keep; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull; /* the slots: from the seed */
        if ((x >> 33) % (n_cand - i) < n_keep - got) keep[got++] = cand[i];
    }
    int broken = 0;
    switch (a >> 5) {
    case 4: /* a repeat */
        if (n_keep >= 2) keep[n_keep - 1] = keep[n_keep - 2], broken = 1;
        break;
    case 5: /* past the length */
        keep[n_keep - 1] = (uint32_t)len, broken = 1;
        break;
    case 6: /* a dead slot of the mask */
        if (dead_from && dead_from[0] < mask_len) {
            keep[0] = dead_from[0];
            broken = 1;
        }
        break;
    case 7: /* n_live 0 */
        n_keep = 0, broken = 1;
        break;
    }
    uint32_t before = pgd_seq_pages(c, s, &ids);
    int rc = pgd_seq_compact(c, s, n_out, keep, 64, a & 0x10 || n_keep == 0 ? &n_keep : NULL);
    uint64_t after_len = pgd_seq_length(c, s);
    uint32_t after = pgd_seq_pages(c, s, &ids);
    if (pgd_cache_window(c)) { /* window layers: compaction is refused, nothing changes */
        if (rc != PGD_EINVAL || after_len != len || after != before)
            fail("pgd_seq_compact with window layers: not refused");
        return;
    }
    if (rc >= 0) {
        if (broken) fail("pgd_seq_compact accepted a broken list");
        if (after_len != n_out || (uint32_t)rc != before - after)
            fail("pgd_seq_compact: length or pages freed disagree");
    } else {
        if (after_len != len || after != before) fail("pgd_seq_compact changed s on error");
        if (rc != PGD_ESTATE && rc != (broken ? PGD_EINVAL : PGD_ENOSPC))
            fail("pgd_seq_compact: an unexpected status");
    }
}

/* ---- the program ---- */

typedef struct cfg {
    uint32_t flags;
    uint32_t t0_records, t1_records; /* RAM tier bounds in records */
    uint32_t t0_comp, t1_comp;       /* PGD_RECORD_RAW / LZ4 / ZSTD */
    uint32_t admit_hits;             /* write-through admission */
    uint32_t writeback_pages;
} cfg;

/* Byte 1: t0 records 1 + bits 0-2, t1 records 2 + bits 3-5, t0 compression bits 6-7 (mod 3).
 * Byte 2: admit_hits bits 0-1, t1 compression bits 2-3 (mod 3), write-back slots 1 + bits
 * 4-7. */
static void config(reader *r, uint8_t flags, cfg *cf)
{
    uint8_t b1 = 0, b2 = 0;
    memset(cf, 0, sizeof *cf);
    cf->flags = flags;
    if (!(flags & FLAG_TIER0)) return;
    take(r, &b1);
    take(r, &b2);
    cf->t0_records = 1 + (b1 & 7);
    cf->t1_records = 2 + ((b1 >> 3) & 7);
    cf->t0_comp = (uint32_t)(b1 >> 6) % 3;
    cf->admit_hits = b2 & 3;
    cf->t1_comp = (uint32_t)((b2 >> 2) & 3) % 3;
    cf->writeback_pages = 1 + (b2 >> 4);
}

typedef struct seq_state {
    pgd_seq *s;
    size_t salt_len;
    pgd_hash qh[16]; /* the hashes of its match query, for prefetch */
    size_t n_qh;
} seq_state;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    reader r = {data, size};
    uint8_t b;
    cfg cf;
    if (!take(&r, &b)) return 0;
    config(&r, b, &cf);
    pgd_cache_params p = pgd_cache_default_params();
    static const uint8_t key[16] = "fuzz-cache-ops!";
    static const uint8_t win_layers[2] = {0, 1};
    p.pool.n_layers = NL;
    if ((cf.flags & FLAG_FAULTY) && !(cf.flags & FLAG_TIER0)) { /* window layers */
        p.pool.n_layers = NL + 1;
        p.window_tokens = 6;
        p.window_layers = win_layers;
        p.window_pages = 6;
    }
    p.pool.n_kv_heads = NH;
    p.pool.head_dim = HD;
    p.pool.page_tokens = PT;
    p.pool.capacity_pages = 12;
    p.pool.kv_type = PGD_KV_F32;
    p.pool.key_bounds = (cf.flags & FLAG_BOUNDS) != 0;
    p.hash_key = key;
    p.hash_key_len = sizeof key;
    p.on_register = on_register;
    p.on_evict = on_evict;
    n_live = 0;
    g_bounds = p.pool.key_bounds;
    g_committing = 0;
    g_fault = NULL;
    g_n_tiers = 0;
    g_now = 1;
    p.clock = fuzz_clock;
    if (cf.flags & FLAG_BELADY) {
        p.policy = PGD_POLICY_BELADY;
        p.next_use = oracle;
    } else { /* the online policies, by the input's length */
        static const pgd_policy_kind online[] = {PGD_POLICY_LRU, PGD_POLICY_S3FIFO, PGD_POLICY_ARC,
                                                 PGD_POLICY_COST, PGD_POLICY_PRIORITY};
        p.policy = online[size % 5];
    }
    int racy = 0;
    pgd_tier_use use[2];
    memset(use, 0, sizeof use);
    if (cf.flags & FLAG_TIER0) {
        pgd_record_ident id;
        if (pgd_record_ident_make(&p.pool, p.model_fingerprint, &id) != PGD_OK) abort();
        uint64_t rec = PGD_RECORD_HEADER_BYTES + id.page_bytes + id.bounds_bytes;
        int two = (cf.flags & FLAG_TIER1) != 0;
        int wrap1 = two && (cf.flags & FLAG_FAULTY_T1);
        int wrap0 = (cf.flags & FLAG_FAULTY) && !wrap1;
        g_tiers[0] = ram_tier(cf.t0_records, rec, cf.t0_comp, wrap0, &g_rams[0]);
        g_n_tiers = 1;
        if (two) g_tiers[1] = ram_tier(cf.t1_records, rec, cf.t1_comp, wrap1, &g_rams[1]);
        g_n_tiers += two;
        for (uint32_t i = 0; i < g_n_tiers; i++)
            use[i].tier = g_tiers[i];
        use[0].write_through = (cf.flags & FLAG_WT) != 0;
        use[0].admit_hits = cf.admit_hits;
        racy = (cf.flags & FLAG_RACY) != 0;
        p.tiers = use;
        p.n_tiers = g_n_tiers;
        p.tier_threads = racy ? 2 : 1;
        p.writeback_pages = cf.writeback_pages;
        g_writeback_pages = cf.writeback_pages;
    }
    pgd_cache *c;
    if (pgd_cache_create(&p, &c) != PGD_OK) abort();
    g_pool = pgd_cache_pool(c);
    seq_state seqs[MAX_SEQS];
    memset(seqs, 0, sizeof seqs);
    int32_t toks[64] = {0};
    pgd_hash hs[16];

    while (take(&r, &b)) {
        uint8_t a = 0, n = 0;
        take(&r, &a);
        seq_state *q = &seqs[a % MAX_SEQS];
        pgd_seq **sp = &q->s;
        switch (b & 15) {
        case 0: /* create with one of three salts */
            if (!*sp && pgd_seq_create(c, "salt", (a >> 3) % 3, sp) == PGD_OK) {
                q->salt_len = (a >> 3) % 3;
                q->n_qh = 0;
            }
            break;
        case 1: /* match tokens */
        case 2: /* commit tokens */
            take(&r, &n);
            n %= 40;
            for (uint8_t i = 0; i < n; i++) {
                uint8_t t = 0;
                take(&r, &t);
                toks[i] = t % 3; /* tiny alphabet: prefixes repeat */
            }
            if (!*sp) break;
            if ((b & 15) == 1) {
                size_t nh = pgd_cache_hash_tokens(c, "salt", q->salt_len, toks, n, hs, 16);
                int64_t m;
                if (b & 0x80) { /* with its own hashes (or wrong ones: refused) */
                    pgd_hash h0 = hs[0];
                    if (b & 0x40) hs[0].hi ^= 1;
                    m = pgd_seq_match_hashed(c, *sp, toks, n, hs, nh);
                    hs[0] = h0;
                } else {
                    m = pgd_seq_match(c, *sp, toks, n);
                }
                if (m >= 0) {
                    memcpy(q->qh, hs, nh * sizeof *hs);
                    q->n_qh = nh;
                    if (b & 0x20) check_matched(c, *sp, hs, nh);
                }
            } else {
                pgd_seq_wait(c, *sp); /* settled before: its registrations are checked */
                uint64_t room = pgd_seq_length(c, *sp) - pgd_seq_n_committed(c, *sp);
                size_t m = n < room ? n : (size_t)room;
                g_committing = 1;
                if (b & 0x80) { /* trusted hashes from the input */
                    for (uint8_t i = 0; i < 16; i++) {
                        hs[i].lo = (uint64_t)toks[i % 40] + 3 * i;
                        hs[i].hi = 78;
                    }
                    pgd_seq_commit_hashed(c, *sp, toks, m, hs, (b >> 4) % 16);
                } else {
                    pgd_seq_commit(c, *sp, toks, m);
                }
                g_committing = 0;
            }
            break;
        case 3: /* match hashes */
        case 4: /* commit hashes */
            take(&r, &n);
            n %= 16;
            for (uint8_t i = 0; i < n; i++) {
                uint8_t t = 0;
                take(&r, &t);
                hs[i].lo = t % 8;
                hs[i].hi = 77;
            }
            if (!*sp) break;
            if ((b & 15) == 3) {
                if (pgd_seq_match_hashes(c, *sp, hs, n) >= 0) {
                    memcpy(q->qh, hs, n * sizeof *hs);
                    q->n_qh = n;
                    if (b & 0x20) check_matched(c, *sp, hs, n);
                }
            } else {
                pgd_seq_wait(c, *sp);
                uint64_t full = (pgd_seq_length(c, *sp) - pgd_seq_n_committed(c, *sp)) / 4;
                g_committing = 1;
                pgd_seq_commit_hashes(c, *sp, hs, n < full ? n : (size_t)full);
                g_committing = 0;
            }
            break;
        case 5: /* grow */
            take(&r, &n);
            if (*sp) pgd_seq_grow(c, *sp, n % 24);
            break;
        case 6: /* write a slot */
            take(&r, &n);
            if (*sp) {
                uint32_t page, slot;
                uint64_t len = pgd_seq_length(c, *sp);
                if (len && pgd_seq_write_slot(c, *sp, n % len, &page, &slot) == PGD_OK) {
                    float *k = pgd_pool_k(pgd_cache_pool(c), page, 0, 0);
                    k[slot * 4] = (float)n;
                }
            }
            break;
        case 7: /* fork */
            take(&r, &n);
            if (*sp && !seqs[n % MAX_SEQS].s &&
                pgd_seq_fork(c, *sp, &seqs[n % MAX_SEQS].s) == PGD_OK)
                seqs[n % MAX_SEQS].salt_len = q->salt_len;
            break;
        case 8: /* destroy */
            pgd_seq_destroy(c, *sp);
            *sp = NULL;
            break;
        case 9: /* evict or clear; retention, admin operations, tenants, the clock */
            take(&r, &n);
            switch ((b >> 4) & 7) {
            case 0:
                if (a & 1)
                    pgd_cache_clear(c);
                else
                    pgd_cache_evict(c, a >> 1);
                break;
            case 1: /* a sequence's retention (priority, TTL, pin, hint) */
                if (*sp) {
                    pgd_retention rt = {(uint32_t)(n % 102), (uint64_t)(a >> 3) * 100,
                                        (b & 0x80) != 0, (uint64_t)(n >> 4) * 50};
                    int rc = pgd_seq_set_retention(c, *sp, &rt, (uint64_t)n % 64);
                    if (rc != PGD_OK && rc != PGD_EINVAL && rc != PGD_ENOSPC)
                        fail("pgd_seq_set_retention: an unexpected status");
                    if (rt.priority > 100 && rc != PGD_EINVAL) fail("priority > 100 accepted");
                }
                break;
            case 2: /* pin (ttl from n) or unpin a live sequence's query chain */
                if (b & 0x80)
                    pgd_cache_unpin(c, q->qh, q->n_qh);
                else if (pgd_cache_pin(c, q->qh, q->n_qh, (uint64_t)n * 100) == PGD_ENOMEM)
                    fail("pgd_cache_pin: out of memory");
                break;
            case 3: /* evict the chain, or warm it into the pool */
                if (b & 0x80)
                    pgd_cache_warm(c, "salt", q->salt_len, q->qh, q->n_qh);
                else
                    pgd_cache_evict_chain(c, q->qh, q->n_qh);
                break;
            case 4: { /* a tenant's reservation of the pool and tier 0 */
                pgd_tenant_params tp;
                memset(&tp, 0, sizeof tp);
                tp.pool_share = (double)(n % 5) / 10;
                tp.tier_share[0] = (double)((n >> 3) % 5) / 10;
                int rc = pgd_cache_set_tenant(c, "salt", (a >> 3) % 3, &tp);
                if (rc < 0 && rc != PGD_EINVAL) fail("pgd_cache_set_tenant: an unexpected status");
                break;
            }
            case 5: /* a next-use hint of the chain, then the hints due */
                if (q->n_qh)
                    pgd_cache_hint(c, "salt", q->salt_len, q->qh, q->n_qh, g_now + n * 1000000ull);
                pgd_cache_hints_run(c, (uint64_t)a * 1000000ull);
                break;
            case 7: /* compaction: valid lists, or broken ones */
                if (*sp) compact_op(c, *sp, &r, a, n);
                break;
            default: /* the clock moves: TTLs and pins expire */
                g_now += (uint64_t)n * 50000000ull;
                break;
            }
            break;
        case 10: /* flush: waits for every move */
            if (pgd_cache_flush(c) != PGD_OK) fail("pgd_cache_flush failed");
            break;
        case 11: { /* prefetch: a live query's hashes, input hashes, the cached blocks */
            const pgd_hash *ph = hs;
            size_t pn = 0;
            take(&r, &n);
            switch ((b >> 4) & 3) {
            case 0:
                ph = q->qh;
                pn = n % (q->n_qh + 1);
                break;
            case 1:
                pn = n % 16;
                for (size_t i = 0; i < pn; i++) {
                    uint8_t t = 0;
                    take(&r, &t);
                    hs[i].lo = t % 8;
                    hs[i].hi = 77;
                }
                break;
            case 2:
                pn = n % (n_live < 16 ? n_live + 1 : 17);
                for (size_t i = 0; i < pn; i++)
                    hs[i] = live[i].hash;
                break;
            default:
                if (pgd_cache_prefetch(c, NULL, 1 + n % 4) != PGD_EINVAL)
                    fail("prefetch of NULL hashes not refused");
                ph = NULL;
                break;
            }
            if (ph) {
                int rc = pgd_cache_prefetch(c, ph, pn);
                if (rc < 0 || (size_t)rc > pn || (g_n_tiers < 2 && rc != 0))
                    fail("pgd_cache_prefetch returned a bad count");
            }
            break;
        }
        case 12: /* park */
            if (*sp) {
                int rc = pgd_seq_park(c, *sp);
                if (rc < 0 || (g_n_tiers == 0 && rc != 0))
                    fail("pgd_seq_park returned a bad count");
            }
            break;
        case 13: /* ready / wait */
            if (!*sp) break;
            if (b & 0x80) {
                if (pgd_seq_wait(c, *sp) != PGD_OK) fail("pgd_seq_wait failed");
                if (pgd_seq_ready(c, *sp) != 1) fail("not ready after pgd_seq_wait");
            } else {
                int rc = pgd_seq_ready(c, *sp);
                if (rc != 0 && rc != 1) fail("pgd_seq_ready returned neither 0 nor 1");
            }
            break;
        case 14: /* faults: which of the wrapped tier's next 8 gets fail, and how */
            take(&r, &n);
            fault_arm(n, (b & 0x80) != 0);
            break;
        case 15: /* truncate back to between the committed length and the length */
            take(&r, &n);
            if (*sp) {
                pgd_seq_wait(c, *sp);
                uint64_t nc = pgd_seq_n_committed(c, *sp), len = pgd_seq_length(c, *sp);
                uint64_t t = nc + n % (len - nc + 1), released = 0;
                const uint32_t *ids;
                uint32_t np = pgd_seq_layer_pages(c, *sp, 1, &ids);
                while (pgd_cache_window(c) && released < np && ids[released] == PGD_NO_PAGE)
                    released++;
                /* Window layers: rows from t need the keys from t - W + 1 (cache.h). */
                int ok = !released || t + 1 >= released * PT + pgd_cache_window(c);
                if ((pgd_seq_truncate(c, *sp, t) == PGD_OK) != ok)
                    fail(ok ? "pgd_seq_truncate refused a length in range"
                            : "pgd_seq_truncate kept a sequence without its window's keys");
            }
            break;
        }
        if (g_n_tiers && !racy && pgd_cache_flush(c) != PGD_OK) fail("pgd_cache_flush failed");
        must_check(c);
    }
    for (int i = 0; i < MAX_SEQS; i++)
        pgd_seq_destroy(c, seqs[i].s);
    unpin_all(c);
    pgd_cache_clear(c);
    must_check(c);
    if (n_live) fail("pages left after clear");
    pgd_cache_stats st;
    pgd_cache_get_stats(c, &st);
    if (st.n_pages_free != st.n_pages_total) abort(); /* a leaked page */
    if (g_n_tiers && pgd_cache_flush(c) != PGD_OK) fail("pgd_cache_flush failed");
    for (uint32_t i = 0; i < g_n_tiers; i++) {
        pgd_cache_tier_stats ts;
        if (pgd_cache_get_tier_stats(c, i, &ts) != PGD_OK) fail("tier stats refused");
        if (ts.writeback_depth) fail("write-back queue not empty after flush");
    }
    pgd_cache_destroy(c);
    for (uint32_t i = 0; i < g_n_tiers; i++)
        pgd_tier_close(g_tiers[i]);
    g_n_tiers = 0;
    g_fault = NULL;
    g_pool = NULL;
    return 0;
}
