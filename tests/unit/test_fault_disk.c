/* SPDX-License-Identifier: MIT */
/*
 * test_fault_disk.c - fault injection on the disk tier (src/tier/disk.c), the style of
 * test_fault_alloc.c: a counting allocator fails the Nth allocation for N = 1, 2, ...
 * through create, bind (the scan of a directory holding records), put (with key bounds, so
 * through the bounce buffer; with evictions that spill), get and a restart, until the run
 * goes through without a failure. Each failed call must return PGD_ENOMEM and leave the
 * tier usable: the same call then succeeds; closing leaks nothing. Then the write faults
 * (pgd__tier_disk_fault): the Nth record write fails with EIO for each N, exactly that put
 * returns PGD_EIO, no temp file is left, and the put tried again succeeds; after a restart
 * every record is there.
 */
#define _GNU_SOURCE /* nftw */
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pagoda/tier.h"
#include "tier/disk_int.h"
#include "t.h"
#include "t_alloc.h"
#include "t_dir.h"

/* ---- counting allocator (tests/t_alloc.h) ---- */

static t_counting A;
static const pgd_allocator alloc = T_COUNTING_ALLOCATOR(&A);

/* Stops injecting: the retry of a failed call must succeed. */
static void disarm(void)
{
    A.fail_at = 0;
}

/* ---- helpers ---- */

static char base[512];

static pgd_record_ident make_ident(void)
{
    pgd_pool_params pp = pgd_pool_default_params();
    pgd_record_ident id;
    pp.n_layers = 2;
    pp.n_kv_heads = 1;
    pp.head_dim = 8;
    pp.page_tokens = 4;
    pp.capacity_pages = 4;
    pp.key_bounds = 1;
    pgd_hash fp = {3, 4};
    if (pgd_record_ident_make(&pp, fp, &id) != PGD_OK) abort();
    return id;
}

static pgd_hash hash_of(uint64_t k)
{
    pgd_hash h = {k * 0x9E3779B97F4A7C15ull + 3, k};
    return h;
}

static uint8_t page[4096], bounds[4096], got_page[4096], got_bounds[4096];

static void fill(const pgd_record_ident *id, uint64_t k)
{
    memset(page, (int)(k + 1), id->page_bytes);
    memset(bounds, (int)(k + 101), id->bounds_bytes);
}

static int n_spilled;

static void on_spill(void *ud, pgd_hash block, pgd_hash parent, const void *p, const void *b)
{
    (void)ud;
    (void)block;
    (void)parent;
    (void)p;
    (void)b;
    n_spilled++;
}

static int put_k(pgd_tier *t, const pgd_record_ident *id, uint64_t k)
{
    pgd_hash none = {0, 0};
    fill(id, k);
    return pgd_tier_put(t, hash_of(k), k ? hash_of(k - 1) : none, page, bounds, on_spill, NULL);
}

static int get_k(pgd_tier *t, const pgd_record_ident *id, uint64_t k)
{
    int rc = pgd_tier_get(t, hash_of(k), got_page, got_bounds);
    if (rc != PGD_OK) return rc;
    fill(id, k);
    if (memcmp(page, got_page, id->page_bytes) || memcmp(bounds, got_bounds, id->bounds_bytes))
        return -100;
    return PGD_OK;
}

/* A call that may fail with ENOMEM at the armed allocation: then, disarmed, it must
 * succeed when called again. */
#define T_RETRY(call)                                                                              \
    do {                                                                                           \
        int r_ = (call);                                                                           \
        if (r_ == PGD_ENOMEM) {                                                                    \
            disarm();                                                                              \
            r_ = (call);                                                                           \
        }                                                                                          \
        T_EQ(r_, PGD_OK);                                                                          \
    } while (0)

static int count_temp_files(const char *dir)
{
    char path[1200];
    int n = 0;
    for (int x = 0; x < 256; x++) {
        snprintf(path, sizeof path, "%s/records/%02x", dir, x);
        DIR *d = opendir(path);
        if (!d) continue;
        for (struct dirent *e = readdir(d); e; e = readdir(d))
            if (strstr(e->d_name, ".tmp.")) n++;
        closedir(d);
    }
    return n;
}

/* ---- allocation failures ---- */

static pgd_tier_disk_params params(const char *dir, uint64_t capacity, int o_direct)
{
    pgd_tier_disk_params p = pgd_tier_disk_default_params();
    p.dir = dir;
    p.capacity_bytes = capacity;
    p.o_direct = o_direct;
    p.alloc = &alloc;
    return p;
}

static int alloc_run(long fail_at, int o_direct, int *fired)
{
    char dir[1024];
    pgd_record_ident id = make_ident();
    uint64_t rec = PGD_RECORD_HEADER_BYTES + id.page_bytes + id.bounds_bytes;
    if (o_direct) rec = (rec + 4095) / 4096 * 4096;
    pgd_tier_disk_params p = params(dir, 6 * rec, o_direct);
    pgd_tier *t = NULL;
    snprintf(dir, sizeof dir, "%s/alloc%d", base, o_direct);

    /* A directory holding 4 records, written without faults. */
    memset(&A, 0, sizeof A);
    t_rm_rf(dir);
    T_OK(pgd_tier_disk_create(&p, &t));
    T_OK(pgd_tier_bind(t, &id));
    for (uint64_t k = 0; k < 4; k++)
        T_OK(put_k(t, &id, k));
    pgd_tier_close(t);
    T_EQ(A.n_live, 0);

    memset(&A, 0, sizeof A);
    A.fail_at = fail_at;
    int rc = pgd_tier_disk_create(&p, &t);
    if (rc == PGD_ENOMEM) {
        T_ASSERT(t == NULL);
        T_EQ(A.n_live, 0);
        *fired = 1;
        return 0;
    }
    T_OK(rc);
    T_RETRY(pgd_tier_bind(t, &id));
    for (uint64_t k = 0; k < 4; k++)
        T_EQ(pgd_tier_lookup(t, (pgd_hash[]){hash_of(k)}, 1), 1);
    /* Puts past the capacity: evictions, each spilled through a read-back buffer. */
    for (uint64_t k = 4; k < 12; k++)
        T_RETRY(put_k(t, &id, k));
    for (uint64_t k = 8; k < 12; k++)
        T_RETRY(get_k(t, &id, k));
    pgd_tier_stats st;
    pgd_tier_get_stats(t, &st);
    T_ASSERT(st.n_records <= 6);
    T_EQ(st.n_corrupt, 0);
    pgd_tier_close(t);
    t = NULL;
    rc = pgd_tier_disk_create(&p, &t);
    if (rc == PGD_ENOMEM) {
        disarm();
        rc = pgd_tier_disk_create(&p, &t);
    }
    T_OK(rc);
    T_RETRY(pgd_tier_bind(t, &id));
    for (uint64_t k = 8; k < 12; k++)
        T_RETRY(get_k(t, &id, k));
    pgd_tier_close(t);
    *fired = A.fired;
    T_EQ(A.n_live, 0);
    T_EQ(count_temp_files(dir), 0);
    t_rm_rf(dir);
    return 0;
}

static int sweep_alloc(int o_direct)
{
    long n;
    for (n = 1; n < 10000; n++) {
        int fired = 0;
        if (alloc_run(n, o_direct, &fired)) {
            fprintf(stderr, "  (failing allocation %ld)\n", n);
            return 1;
        }
        if (!fired) break;
    }
    T_ASSERT(n > 5); /* the run allocates: the sweep reached something */
    T_ASSERT(n < 10000);
    return 0;
}

static int test_alloc_failures(void)
{
    return sweep_alloc(0);
}

static int test_alloc_failures_o_direct(void)
{
    return sweep_alloc(1);
}

/* ---- write failures ---- */

static int test_write_failures(void)
{
    char dir[1024];
    pgd_record_ident id = make_ident();
    snprintf(dir, sizeof dir, "%s/eio", base);
    for (uint64_t n = 0; n < 5; n++) {
        pgd_tier_disk_params p = params(dir, 1 << 20, 0);
        pgd_tier *t = NULL;
        pgd_tier_stats st;
        t_rm_rf(dir);
        memset(&A, 0, sizeof A);
        T_OK(pgd_tier_disk_create(&p, &t));
        T_OK(pgd_tier_bind(t, &id));
        T_OK(pgd__tier_disk_fault(t, EIO, n, 1));
        for (uint64_t k = 0; k < 5; k++) {
            int rc = put_k(t, &id, k);
            T_EQ(rc, k == n ? PGD_EIO : PGD_OK);
            T_EQ(pgd_tier_lookup(t, (pgd_hash[]){hash_of(k)}, 1), k != n);
            T_EQ(count_temp_files(dir), 0);
        }
        pgd_tier_get_stats(t, &st);
        T_EQ(st.n_io_errors, 1);
        T_EQ(st.full, 0);
        T_OK(put_k(t, &id, n)); /* the same put again */
        pgd_tier_close(t);
        T_OK(pgd_tier_disk_create(&p, &t));
        T_OK(pgd_tier_bind(t, &id));
        for (uint64_t k = 0; k < 5; k++)
            T_OK(get_k(t, &id, k));
        pgd_tier_close(t);
        T_EQ(A.n_live, 0);
    }
    t_rm_rf(dir);
    return 0;
}

int main(void)
{
    if (t_scratch_root(base, sizeof base, "test_fault_disk")) return 1;
    T_RUN(test_alloc_failures);
    T_RUN(test_alloc_failures_o_direct);
    T_RUN(test_write_failures);
    if (!t_failed) t_rm_rf(base);
    T_DONE();
}
