/* SPDX-License-Identifier: MIT */
/*
 * fuzz_cache_ops.c - fuzz target: the input is a program of cache-manager operations
 * (create/match/grow/write/commit/fork/destroy/evict, with token and hash streams from
 * the input bytes) run against a tiny pool, with pgd_cache_check() after every step.
 * Any broken invariant aborts (pgd_cache_check failing is turned into abort()), so the
 * fuzzer finds op sequences that corrupt refcounts, the index tree or the policy.
 * The index events (on_register / on_evict) feed a model that aborts when a page is
 * registered twice, evicted without being registered or twice, or before a child.
 * Token matches and commits also run with precomputed hashes (match_hashed with the
 * sequence's real hashes or input bytes, commit_hashed with input bytes: trusted, so any
 * garbage must still leave the cache consistent).
 *
 * Input layout: byte 0 picks the policy (even: LRU, odd: Belady with a pseudo-oracle),
 * then a stream of ops: [op byte][argument bytes...]; a short tail ends the program.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pagoda/cache.h>

#define MAX_SEQS 8

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

static uint64_t oracle(void *ud, pgd_hash h)
{
    (void)ud;
    return (h.lo * 0x9E3779B97F4A7C15ull) >> 40; /* any total order will do */
}

/* ---- event model: the live index entries, as the events tell them ---- */

#define MAX_LIVE 64

typedef struct {
    pgd_hash hash, parent;
    uint32_t depth;
} live_entry;

static live_entry live[MAX_LIVE];
static uint32_t n_live;

static void fail(const char *what)
{
    fprintf(stderr, "fuzz_cache_ops: %s\n", what);
    abort();
}

static int live_find(pgd_hash h)
{
    for (uint32_t i = 0; i < n_live; i++)
        if (pgd_hash_eq(live[i].hash, h)) return (int)i;
    return -1;
}

static void on_register(void *ud, pgd_hash hash, pgd_hash parent, uint32_t depth, uint32_t page)
{
    (void)ud, (void)page;
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

static void must_check(pgd_cache *c)
{
    pgd_cache_stats st;
    if (pgd_cache_check(c) != PGD_OK) fail("pgd_cache_check failed");
    pgd_cache_get_stats(c, &st);
    if (st.n_pages_cached != n_live) fail("events disagree with n_pages_cached");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    reader r = {data, size};
    uint8_t b;
    if (!take(&r, &b)) return 0;
    pgd_cache_params p = pgd_cache_default_params();
    static const uint8_t key[16] = "fuzz-cache-ops!";
    p.pool.n_layers = 1;
    p.pool.n_kv_heads = 1;
    p.pool.head_dim = 4;
    p.pool.page_tokens = 4;
    p.pool.capacity_pages = 12;
    p.pool.kv_type = PGD_KV_F32;
    p.hash_key = key;
    p.hash_key_len = sizeof key;
    p.on_register = on_register;
    p.on_evict = on_evict;
    n_live = 0;
    if (b & 1) {
        p.policy = PGD_POLICY_BELADY;
        p.next_use = oracle;
    }
    pgd_cache *c;
    if (pgd_cache_create(&p, &c) != PGD_OK) abort();
    pgd_seq *seqs[MAX_SEQS] = {0};
    size_t salt_len[MAX_SEQS] = {0};
    int32_t toks[64] = {0};
    pgd_hash hs[16];

    while (take(&r, &b)) {
        uint8_t a = 0, n = 0;
        take(&r, &a);
        pgd_seq **sp = &seqs[a % MAX_SEQS];
        switch (b % 10) {
        case 0: /* create with one of three salts */
            if (!*sp && pgd_seq_create(c, "salt", (a >> 3) % 3, sp) == PGD_OK)
                salt_len[a % MAX_SEQS] = (a >> 3) % 3;
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
            if (b % 10 == 1) {
                if (b & 0x80) { /* with its own hashes (or wrong ones: refused) */
                    size_t nh =
                        pgd_cache_hash_tokens(c, "salt", salt_len[a % MAX_SEQS], toks, n, hs, 16);
                    if (b & 0x40) hs[0].hi ^= 1;
                    pgd_seq_match_hashed(c, *sp, toks, n, hs, nh);
                } else {
                    pgd_seq_match(c, *sp, toks, n);
                }
            } else {
                uint64_t room = pgd_seq_length(c, *sp) - pgd_seq_n_committed(c, *sp);
                size_t m = n < room ? n : (size_t)room;
                if (b & 0x80) { /* trusted hashes from the input */
                    for (uint8_t i = 0; i < 16; i++) {
                        hs[i].lo = (uint64_t)toks[i % 40] + 3 * i;
                        hs[i].hi = 78;
                    }
                    pgd_seq_commit_hashed(c, *sp, toks, m, hs, (b >> 4) % 16);
                } else {
                    pgd_seq_commit(c, *sp, toks, m);
                }
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
            if (b % 10 == 3) {
                pgd_seq_match_hashes(c, *sp, hs, n);
            } else {
                uint64_t full = (pgd_seq_length(c, *sp) - pgd_seq_n_committed(c, *sp)) / 4;
                pgd_seq_commit_hashes(c, *sp, hs, n < full ? n : (size_t)full);
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
            if (*sp && !seqs[n % MAX_SEQS]) pgd_seq_fork(c, *sp, &seqs[n % MAX_SEQS]);
            break;
        case 8: /* destroy */
            pgd_seq_destroy(c, *sp);
            *sp = NULL;
            break;
        case 9: /* evict or clear */
            if (a & 1)
                pgd_cache_clear(c);
            else
                pgd_cache_evict(c, a >> 1);
            break;
        }
        must_check(c);
    }
    for (int i = 0; i < MAX_SEQS; i++)
        pgd_seq_destroy(c, seqs[i]);
    pgd_cache_clear(c);
    must_check(c);
    if (n_live) fail("pages left after clear");
    pgd_cache_stats st;
    pgd_cache_get_stats(c, &st);
    if (st.n_pages_free != st.n_pages_total) abort(); /* a leaked page */
    pgd_cache_destroy(c);
    return 0;
}
