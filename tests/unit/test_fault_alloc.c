/* SPDX-License-Identifier: MIT */
/*
 * test_fault_alloc.c - allocation-failure injection. A counting allocator fails the Nth
 * allocation (malloc or realloc) for N = 1, 2, ... until the call under test succeeds
 * without a failure. Each failed call must return PGD_ENOMEM, leak nothing, leave the
 * object unchanged (stats, check) and usable: the same call then succeeds.
 * Covered: pool and cache create, the sequence calls (create, match, grow, fork, commit,
 * write_slot, write_kv into the kivi2 residual window, truncate), evict / clear, attention
 * create (dense and Quest) and the scalar attention reference.
 */
#include <pagoda/attn.h>
#include <pagoda/cache.h>

#include "t.h"
#include "t_alloc.h"

/* ---- counting allocator (tests/t_alloc.h) ---- */

static t_counting A;
static const pgd_allocator alloc = T_COUNTING_ALLOCATOR(&A);

static void arm(long n)
{
    t_counting_arm(&A, n);
}

static void disarm(void)
{
    A.fail_at = 0;
}

/* ---- constructors ---- */

static int test_pool_create(void)
{
    pgd_pool_params p = pgd_pool_default_params();
    p.capacity_pages = 32;
    p.alloc = &alloc;
    for (long n = 1;; n++) {
        pgd_pool *pool = (pgd_pool *)(uintptr_t)1;
        arm(n);
        int rc = pgd_pool_create(&p, &pool);
        disarm();
        if (A.fired) {
            if (rc != PGD_ENOMEM) T_FAIL("alloc %ld failed but create returned %d", n, rc);
            T_ASSERT(pool == NULL);
            T_EQ(A.n_live, 0);
            T_EQ(A.n_bytes, 0);
            continue;
        }
        T_EQ(rc, PGD_OK);
        T_EQ(pgd_pool_check(pool), PGD_OK);
        T_ASSERT(A.n_live > 0);
        pgd_pool_destroy(pool);
        T_EQ(A.n_live, 0);
        printf("     pool_create: %ld allocations\n", n - 1);
        return 0;
    }
}

static pgd_cache_params cparams(uint32_t n_pages)
{
    static const uint8_t key[16] = "fault-injection";
    pgd_cache_params p = pgd_cache_default_params();
    p.pool.n_layers = 2;
    p.pool.head_dim = 8;
    p.pool.page_tokens = 4;
    p.pool.capacity_pages = n_pages;
    p.hash_key = key;
    p.hash_key_len = sizeof key;
    p.alloc = &alloc;
    return p;
}

static int test_cache_create(void)
{
    pgd_cache_params p = cparams(64);
    for (long n = 1;; n++) {
        pgd_cache *c = (pgd_cache *)(uintptr_t)1;
        arm(n);
        int rc = pgd_cache_create(&p, &c);
        disarm();
        if (A.fired) {
            if (rc != PGD_ENOMEM) T_FAIL("alloc %ld failed but create returned %d", n, rc);
            T_ASSERT(c == NULL);
            T_EQ(A.n_live, 0);
            T_EQ(A.n_bytes, 0);
            continue;
        }
        T_EQ(rc, PGD_OK);
        T_EQ(pgd_cache_check(c), PGD_OK);
        pgd_cache_destroy(c);
        T_EQ(A.n_live, 0);
        printf("     cache_create: %ld allocations\n", n - 1);
        return 0;
    }
}

static uint64_t far_future(void *ud, pgd_hash h)
{
    (void)ud;
    return h.lo;
}

static int test_cache_create_belady(void)
{
    pgd_cache_params p = cparams(64);
    p.policy = PGD_POLICY_BELADY;
    p.next_use = far_future;
    for (long n = 1;; n++) {
        pgd_cache *c = (pgd_cache *)(uintptr_t)1;
        arm(n);
        int rc = pgd_cache_create(&p, &c);
        disarm();
        if (A.fired) {
            if (rc != PGD_ENOMEM) T_FAIL("alloc %ld failed but create returned %d", n, rc);
            T_ASSERT(c == NULL);
            T_EQ(A.n_live, 0);
            continue;
        }
        T_EQ(rc, PGD_OK);
        pgd_cache_destroy(c);
        T_EQ(A.n_live, 0);
        return 0;
    }
}

/* ---- calls on a live cache ---- */

enum { PT = 4, LONG_TOKENS = 400 }; /* 100 pages: page tables must grow */

typedef struct {
    pgd_cache *c;
    pgd_seq *s;   /* the sequence under test */
    pgd_seq *out; /* made by the call (fork, create) */
    int32_t toks[LONG_TOKENS];
    pgd_hash hashes[LONG_TOKENS / PT];
} fx;

typedef int (*setup_fn)(fx *f);
typedef int64_t (*call_fn)(fx *f);

/* A cache of 160 pages where a 100-page prompt is cached and unreferenced. */
static int setup_base(fx *f)
{
    pgd_cache_params p = cparams(160);
    pgd_seq *w;
    memset(f, 0, sizeof *f);
    for (int i = 0; i < LONG_TOKENS; i++)
        f->toks[i] = i * 3 + 1;
    if (pgd_cache_create(&p, &f->c) != PGD_OK) return 1;
    if (pgd_cache_hash_tokens(f->c, "t", 1, f->toks, LONG_TOKENS, f->hashes, LONG_TOKENS / PT) !=
        LONG_TOKENS / PT)
        return 1;
    if (pgd_seq_create(f->c, "t", 1, &w) != PGD_OK) return 1;
    if (pgd_seq_grow(f->c, w, LONG_TOKENS) != PGD_OK) return 1;
    if (pgd_seq_commit(f->c, w, f->toks, LONG_TOKENS) != LONG_TOKENS / PT) return 1;
    pgd_seq_destroy(f->c, w);
    return pgd_seq_create(f->c, "t", 1, &f->s) != PGD_OK;
}

/* The sequence under test holds 100 matched pages plus 3 uncommitted tokens. */
static int setup_matched(fx *f)
{
    if (setup_base(f)) return 1;
    if (pgd_seq_match(f->c, f->s, f->toks, LONG_TOKENS) != LONG_TOKENS) return 1;
    return pgd_seq_grow(f->c, f->s, 3) != PGD_OK;
}

/* The sequence under test is empty, on salt "u" (nothing cached for it), and the cache's
 * 100 cached pages must be evicted for a long grow. */
static int setup_fresh(fx *f)
{
    if (setup_base(f)) return 1;
    pgd_seq_destroy(f->c, f->s);
    return pgd_seq_create(f->c, "u", 1, &f->s) != PGD_OK;
}

/* A kivi2 cache of 64 pages (residual window 8 pages) and a sequence of KIVI_TOKENS
 * positions, none written yet: its residual window is not allocated. */
enum { KIVI_TOKENS = 9 * PT };

static int setup_kivi2(fx *f)
{
    pgd_cache_params p = cparams(64);
    p.pool.kv_type = PGD_KV_KIVI2;
    p.kv_residual = 8 * PT;
    memset(f, 0, sizeof *f);
    if (pgd_cache_create(&p, &f->c) != PGD_OK) return 1;
    if (pgd_seq_create(f->c, "k", 1, &f->s) != PGD_OK) return 1;
    return pgd_seq_grow(f->c, f->s, KIVI_TOKENS) != PGD_OK;
}

/* K and V rows of KIVI_TOKENS positions, one KV head of head_dim 8. */
static float kv_rows[KIVI_TOKENS * 8];

static int64_t call_write_kv(fx *f)
{
    for (size_t i = 0; i < sizeof kv_rows / sizeof kv_rows[0]; i++)
        kv_rows[i] = (float)(i % 13) * 0.25f - 1.5f;
    /* Both layers: each of the first 8 pages is encoded from the window as it fills, the
     * last 4 positions overwrite the window slots of page 0. */
    for (uint32_t l = 0; l < 2; l++) {
        int rc = pgd_seq_write_kv(f->c, f->s, 0, KIVI_TOKENS, l, kv_rows, kv_rows);
        if (rc != PGD_OK) return rc;
    }
    return 0;
}

/* The kivi2 sequence with its window written. */
static int setup_kivi2_written(fx *f)
{
    return setup_kivi2(f) || call_write_kv(f) != 0;
}

/* ... and committed, so that it can be forked (a fork copies the window). */
static int setup_kivi2_committed(fx *f)
{
    if (setup_kivi2_written(f)) return 1;
    return pgd_seq_commit(f->c, f->s, f->toks, KIVI_TOKENS) != KIVI_TOKENS / PT;
}

static long truncate_allocs = -1; /* allocations the last pgd_seq_truncate made */

static int64_t call_truncate(fx *f)
{
    int rc = pgd_seq_truncate(f->c, f->s, LONG_TOKENS); /* drops the 3-token page */
    truncate_allocs = A.n_calls;
    return rc;
}

static int64_t call_truncate_kivi2(fx *f)
{
    int rc = pgd_seq_truncate(f->c, f->s, 8 * PT + 2); /* keeps a partial page */
    truncate_allocs = A.n_calls;
    return rc;
}

static int64_t call_seq_create(fx *f)
{
    return pgd_seq_create(f->c, "x", 1, &f->out);
}

static int64_t call_match(fx *f)
{
    return pgd_seq_match(f->c, f->s, f->toks, LONG_TOKENS);
}

static int64_t call_match_hashes(fx *f)
{
    return pgd_seq_match_hashes(f->c, f->s, f->hashes, LONG_TOKENS / PT);
}

static int64_t call_grow(fx *f)
{
    return pgd_seq_grow(f->c, f->s, 150 * PT); /* 60 free pages, 90 to evict */
}

static int64_t call_fork(fx *f)
{
    return pgd_seq_fork(f->c, f->s, &f->out);
}

static int64_t call_commit(fx *f)
{
    int64_t rc = 0;
    if (pgd_seq_length(f->c, f->s) == 0) {
        rc = pgd_seq_grow(f->c, f->s, LONG_TOKENS);
    }
    if (rc < 0) return rc == PGD_ENOMEM ? -100 : rc; /* not the call under test */
    return pgd_seq_commit(f->c, f->s, f->toks, LONG_TOKENS);
}

static int64_t call_commit_hashes(fx *f)
{
    int64_t rc = 0;
    if (pgd_seq_length(f->c, f->s) == 0) {
        rc = pgd_seq_grow(f->c, f->s, LONG_TOKENS);
    }
    if (rc < 0) return rc == PGD_ENOMEM ? -100 : rc;
    pgd_hash h[LONG_TOKENS / PT];
    pgd_cache_hash_tokens(f->c, "u", 1, f->toks, LONG_TOKENS, h, LONG_TOKENS / PT);
    return pgd_seq_commit_hashes(f->c, f->s, h, LONG_TOKENS / PT);
}

static int64_t call_write_slot(fx *f)
{
    uint32_t page, slot;
    int64_t rc = f->out ? 0 : pgd_seq_fork(f->c, f->s, &f->out);
    if (rc < 0) return rc == PGD_ENOMEM ? -100 : rc;
    return pgd_seq_write_slot(f->c, f->s, LONG_TOKENS + 1, &page, &slot);
}

static int64_t call_evict_clear(fx *f)
{
    int64_t r = pgd_cache_evict(f->c, 10);
    if (r < 0) return r;
    return pgd_cache_clear(f->c);
}

static void teardown(fx *f)
{
    pgd_seq_destroy(f->c, f->out);
    pgd_seq_destroy(f->c, f->s);
    pgd_cache_destroy(f->c);
}

static int fault_loop(const char *name, setup_fn setup, call_fn call)
{
    for (long n = 1;; n++) {
        fx f;
        pgd_cache_stats st0, st1;
        if (setup(&f)) T_FAIL("%s: setup failed", name);
        long live0 = A.n_live;
        size_t bytes0 = A.n_bytes;
        pgd_cache_get_stats(f.c, &st0);
        uint64_t len0 = pgd_seq_length(f.c, f.s), nc0 = pgd_seq_n_committed(f.c, f.s);
        arm(n);
        int64_t rc = call(&f);
        disarm();
        int fired = A.fired;
        if (rc == -100) { /* a helper call before the one under test failed: skip this n */
            teardown(&f);
            T_EQ(A.n_live, 0);
            continue;
        }
        if (fired && rc >= 0) {
            /* a failure that the call absorbed: allowed only if nothing leaked */
            printf("     %s: allocation %ld failed, call still returned %" PRId64 "\n", name, n,
                   rc);
        } else if (fired) {
            if (rc != PGD_ENOMEM)
                T_FAIL("%s: allocation %ld failed, call returned %" PRId64, name, n, rc);
            pgd_cache_get_stats(f.c, &st1);
            if (A.n_live != live0 || A.n_bytes != bytes0)
                T_FAIL("%s: allocation %ld failed: %ld blocks / %zu bytes live, were %ld / %zu",
                       name, n, A.n_live, A.n_bytes, live0, bytes0);
            if (memcmp(&st0, &st1, sizeof st0) != 0)
                T_FAIL("%s: allocation %ld failed: stats changed", name, n);
            T_EQ(pgd_seq_length(f.c, f.s), len0);
            T_EQ(pgd_seq_n_committed(f.c, f.s), nc0);
            T_ASSERT(f.out == NULL);
            T_EQ(pgd_cache_check(f.c), PGD_OK);
            /* usable: the same call succeeds now */
            rc = call(&f);
            if (rc < 0) T_FAIL("%s: after failure %ld, retry returned %" PRId64, name, n, rc);
        }
        if (!fired && rc < 0) T_FAIL("%s: call returned %" PRId64 " without a failure", name, rc);
        T_EQ(pgd_cache_check(f.c), PGD_OK);
        teardown(&f);
        if (A.n_live != 0) T_FAIL("%s: %ld blocks leaked after teardown", name, A.n_live);
        if (!fired) {
            printf("     %s: %ld allocation(s) injected\n", name, n - 1);
            return 0;
        }
    }
}

static int test_seq_create(void)
{
    return fault_loop("seq_create", setup_base, call_seq_create);
}

static int test_seq_match(void)
{
    return fault_loop("seq_match", setup_base, call_match);
}

static int test_seq_match_hashes(void)
{
    return fault_loop("seq_match_hashes", setup_base, call_match_hashes);
}

static int test_seq_grow(void)
{
    return fault_loop("seq_grow", setup_fresh, call_grow);
}

static int test_seq_fork(void)
{
    return fault_loop("seq_fork", setup_matched, call_fork);
}

static int test_seq_commit(void)
{
    return fault_loop("seq_commit", setup_fresh, call_commit);
}

static int test_seq_commit_hashes(void)
{
    return fault_loop("seq_commit_hashes", setup_fresh, call_commit_hashes);
}

static int test_seq_write_slot(void)
{
    return fault_loop("seq_write_slot", setup_matched, call_write_slot);
}

static int test_evict_clear(void)
{
    return fault_loop("cache_evict/clear", setup_base, call_evict_clear);
}

static int test_seq_write_kv_kivi2(void)
{
    return fault_loop("seq_write_kv (kivi2 window)", setup_kivi2, call_write_kv);
}

static int test_seq_fork_kivi2(void)
{
    return fault_loop("seq_fork (kivi2 window)", setup_kivi2_committed, call_fork);
}

/* Truncation only releases: it must succeed without allocating. */
static int test_seq_truncate(void)
{
    if (fault_loop("seq_truncate", setup_matched, call_truncate)) return 1;
    T_EQ(truncate_allocs, 0);
    truncate_allocs = -1;
    if (fault_loop("seq_truncate (kivi2)", setup_kivi2_written, call_truncate_kivi2)) return 1;
    T_EQ(truncate_allocs, 0);
    return 0;
}

/* ---- attention ---- */

/* An f16 cache with key bounds (2 layers, 2 KV heads of head_dim 8) and one sequence of 10
 * written positions; n_head 4 query heads. */
enum { AT_KV = 2, AT_HD = 8, AT_HEADS = 4, AT_LEN = 10 };

typedef struct afx {
    pgd_cache *c;
    pgd_seq *s;
    float q[AT_HEADS * AT_HD], out[AT_HEADS * AT_HD];
} afx;

static int afx_init(afx *f, pgd_kv_type type)
{
    pgd_cache_params p = cparams(16);
    static float kv[AT_LEN * AT_KV * AT_HD];
    memset(f, 0, sizeof *f);
    p.pool.n_kv_heads = AT_KV;
    p.pool.kv_type = type;
    p.pool.key_bounds = 1;
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++)
        kv[i] = (float)((i * 7) % 11) * 0.2f - 1.0f;
    for (size_t i = 0; i < AT_HEADS * AT_HD; i++)
        f->q[i] = (float)(i % 5) * 0.3f - 0.6f;
    if (pgd_cache_create(&p, &f->c) != PGD_OK || pgd_seq_create(f->c, "a", 1, &f->s) != PGD_OK ||
        pgd_seq_grow(f->c, f->s, AT_LEN) != PGD_OK)
        return 1;
    for (uint32_t l = 0; l < 2; l++)
        if (pgd_seq_write_kv(f->c, f->s, 0, AT_LEN, l, kv, kv) != PGD_OK) return 1;
    return 0;
}

static void afx_deinit(afx *f)
{
    pgd_seq_destroy(f->c, f->s);
    pgd_cache_destroy(f->c);
}

/* pgd_attn_create under failures, dense (select_pages 0) or Quest, with Gemma's options or
 * without (layer_window, copied at create, is one more allocation); the context made by the
 * successful call must run. */
static int attn_create_loop(uint32_t select_pages, int gemma)
{
    static const uint32_t windows[2] = {0, 3};
    afx f;
    if (afx_init(&f, PGD_KV_F16)) T_FAIL("attention fixture failed");
    pgd_attn_params ap = pgd_attn_default_params();
    ap.n_head = AT_HEADS;
    ap.n_threads = 2;
    ap.max_rows = 8;
    ap.select_pages = select_pages;
    ap.alloc = &alloc;
    ap.layer_window = gemma ? windows : NULL;
    ap.softcap = gemma ? 30.0f : 0.0f;
    const long live0 = A.n_live;
    const size_t bytes0 = A.n_bytes;
    for (long n = 1;; n++) {
        pgd_attn *a = (pgd_attn *)(uintptr_t)1;
        arm(n);
        int rc = pgd_attn_create(f.c, &ap, &a);
        disarm();
        if (A.fired) {
            if (rc != PGD_ENOMEM) T_FAIL("alloc %ld failed but attn_create returned %d", n, rc);
            T_ASSERT(a == NULL);
            T_EQ(A.n_live, live0);
            T_EQ(A.n_bytes, bytes0);
            continue;
        }
        T_EQ(rc, PGD_OK);
        pgd_attn_item it = {f.s, 1, f.q, f.out};
        T_EQ(pgd_attn_run(a, 1, &it, 1), PGD_OK);
        pgd_attn_destroy(a);
        T_EQ(A.n_live, live0);
        printf("     attn_create (select_pages %u%s): %ld allocations\n", select_pages,
               gemma ? ", window, soft-cap" : "", n - 1);
        break;
    }
    afx_deinit(&f);
    T_EQ(A.n_live, 0);
    return 0;
}

static int test_attn_create(void)
{
    return attn_create_loop(0, 0) || attn_create_loop(2, 0) || attn_create_loop(2, 1);
}

/* pgd_attn_run_ref allocates its scratch per call through the cache's allocator: each
 * failure gives PGD_ENOMEM, writes nothing and leaks nothing (kivi2: the pages that the
 * residual window holds are read from it). */
static int ref_loop(pgd_kv_type type)
{
    afx f;
    if (afx_init(&f, type)) T_FAIL("attention fixture failed");
    for (long n = 1;; n++) {
        pgd_attn_item it = {f.s, 1, f.q, f.out};
        const long live0 = A.n_live;
        memset(f.out, 0xff, sizeof f.out);
        arm(n);
        int rc = pgd_attn_run_ref(f.c, AT_HEADS, 1, &it, 1, 0);
        disarm();
        if (A.fired) {
            if (rc != PGD_ENOMEM) T_FAIL("alloc %ld failed but attn_run_ref returned %d", n, rc);
            T_EQ(A.n_live, live0);
            for (size_t i = 0; i < sizeof f.out; i++)
                T_EQ(((unsigned char *)f.out)[i], 0xff);
            continue;
        }
        T_EQ(rc, PGD_OK);
        T_ASSERT(n > 1); /* the scratch came from the counting allocator */
        T_EQ(A.n_live, live0);
        T_ASSERT(f.out[0] == f.out[0]); /* written: no longer the 0xff NaN pattern */
        printf("     attn_run_ref (%s): %ld allocations\n", pgd_kv_type_name(type), n - 1);
        break;
    }
    afx_deinit(&f);
    T_EQ(A.n_live, 0);
    return 0;
}

static int test_attn_run_ref(void)
{
    return ref_loop(PGD_KV_F16) || ref_loop(PGD_KV_Q8_0) || ref_loop(PGD_KV_KIVI2);
}

int main(void)
{
    T_RUN(test_pool_create);
    T_RUN(test_cache_create);
    T_RUN(test_cache_create_belady);
    T_RUN(test_seq_create);
    T_RUN(test_seq_match);
    T_RUN(test_seq_match_hashes);
    T_RUN(test_seq_grow);
    T_RUN(test_seq_fork);
    T_RUN(test_seq_commit);
    T_RUN(test_seq_commit_hashes);
    T_RUN(test_seq_write_slot);
    T_RUN(test_evict_clear);
    T_RUN(test_seq_write_kv_kivi2);
    T_RUN(test_seq_fork_kivi2);
    T_RUN(test_seq_truncate);
    T_RUN(test_attn_create);
    T_RUN(test_attn_run_ref);
    T_DONE();
}
