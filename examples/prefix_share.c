/* SPDX-License-Identifier: MIT */
/*
 * prefix_share.c - the smallest complete client of libpagoda, built against the
 * installed library through pkg-config (scripts/test.sh does exactly that):
 *
 *     cc prefix_share.c $(pkg-config --cflags --libs pagoda) -o prefix_share
 *
 * Two requests share a 64-token system prompt: the second one finds it cached, writes
 * K/V only for its own tokens, and both read the shared pages.
 */
#include <stdio.h>
#include <string.h>

#include <pagoda/cache.h>

static int run_request(pgd_cache *c, const int32_t *tokens, size_t n)
{
    pgd_seq *s;
    int rc = pgd_seq_create(c, "tenant-a", 8, &s);
    if (rc != PGD_OK) return rc;
    int64_t cached = pgd_seq_match(c, s, tokens, n);
    if (cached < 0) goto fail;
    rc = pgd_seq_grow(c, s, n - (size_t)cached);
    if (rc != PGD_OK) goto fail;
    for (uint64_t pos = (uint64_t)cached; pos < n; pos++) {
        uint32_t page, slot;
        rc = pgd_seq_write_slot(c, s, pos, &page, &slot);
        if (rc != PGD_OK) goto fail;
        /* A real engine writes this token's key and value vectors here. */
        uint16_t *k = pgd_pool_k(pgd_cache_pool(c), page, 0, 0);
        memset(k + (size_t)slot * 64, 0, 64 * sizeof *k);
    }
    rc = pgd_seq_commit(c, s, tokens + cached, n - (size_t)cached);
    if (rc < 0) goto fail;
    printf("request of %zu tokens: %lld cached, %lld computed\n", n, (long long)cached,
           (long long)(n - (size_t)cached));
    pgd_seq_destroy(c, s);
    return PGD_OK;
fail:
    pgd_seq_destroy(c, s);
    return rc < 0 ? rc : (int)cached;
}

int main(void)
{
    pgd_cache_params p = pgd_cache_default_params();
    p.pool.n_layers = 2;
    p.pool.n_kv_heads = 2;
    p.pool.head_dim = 64;
    p.pool.capacity_bytes = 1 << 20;
    pgd_cache *c;
    int rc = pgd_cache_create(&p, &c);
    if (rc != PGD_OK) {
        fprintf(stderr, "pgd_cache_create: %s\n", pgd_strerror(rc));
        return 1;
    }
    int32_t a[80], b[90];
    for (int i = 0; i < 64; i++)
        a[i] = b[i] = 1000 + i; /* the shared system prompt */
    for (int i = 64; i < 80; i++)
        a[i] = i;
    for (int i = 64; i < 90; i++)
        b[i] = 7 * i;
    rc = run_request(c, a, 80);
    if (rc == PGD_OK) rc = run_request(c, b, 90);
    pgd_cache_stats st;
    pgd_cache_get_stats(c, &st);
    printf("libpagoda %s: %llu of %llu prompt tokens served from cache\n", pgd_version(),
           (unsigned long long)st.n_hit_tokens, (unsigned long long)st.n_query_tokens);
    pgd_cache_destroy(c);
    if (rc != PGD_OK) {
        fprintf(stderr, "request failed: %s\n", pgd_strerror(rc));
        return 1;
    }
    return st.n_hit_tokens == 64 ? 0 : 1;
}
