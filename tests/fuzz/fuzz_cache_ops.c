/* SPDX-License-Identifier: MIT */
/*
 * fuzz_cache_ops.c - fuzz target: the input is a program of cache-manager operations
 * (create/match/grow/write/commit/fork/destroy/evict, with token and hash streams from
 * the input bytes) run against a tiny pool, with pgd_cache_check() after every step.
 * Any broken invariant aborts (pgd_cache_check failing is turned into abort()), so the
 * fuzzer finds op sequences that corrupt refcounts, the index tree or the policy.
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

static void must_check(pgd_cache *c)
{
    if (pgd_cache_check(c) != PGD_OK) {
        fprintf(stderr, "fuzz_cache_ops: pgd_cache_check failed\n");
        abort();
    }
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
    if (b & 1) {
        p.policy = PGD_POLICY_BELADY;
        p.next_use = oracle;
    }
    pgd_cache *c;
    if (pgd_cache_create(&p, &c) != PGD_OK) abort();
    pgd_seq *seqs[MAX_SEQS] = {0};
    int32_t toks[64];
    pgd_hash hs[16];

    while (take(&r, &b)) {
        uint8_t a = 0, n = 0;
        take(&r, &a);
        pgd_seq **sp = &seqs[a % MAX_SEQS];
        switch (b % 10) {
        case 0: /* create with one of three salts */
            if (!*sp) pgd_seq_create(c, "salt", (a >> 3) % 3, sp);
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
                pgd_seq_match(c, *sp, toks, n);
            } else {
                uint64_t room = pgd_seq_length(c, *sp) - pgd_seq_n_committed(c, *sp);
                pgd_seq_commit(c, *sp, toks, n < room ? n : (size_t)room);
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
    pgd_cache_stats st;
    pgd_cache_get_stats(c, &st);
    if (st.n_pages_free != st.n_pages_total) abort(); /* a leaked page */
    pgd_cache_destroy(c);
    return 0;
}
