/* SPDX-License-Identifier: MIT */
/*
 * test_tier_disk.c - the disk tier (src/tier/disk.c) against a reference model.
 *
 * The randomized test runs put / get / lookup / del / restart (close, create, bind) on a
 * small capacity, so evictions happen, and keeps the set of blocks the tier must hold:
 * put and not evicted (the spill callback names each eviction, with its payload, which must
 * be byte-equal to what was put, and must be a leaf: none of its children held) and not
 * deleted. After every step lookup agrees with the model, and every get of a held block is
 * byte-equal; after a restart everything held is still there. Then the faults: torn temp
 * files ignored and removed, a damaged record (one flipped byte, a truncated file) is a
 * miss and lands in quarantine/, foreign records are ignored and left on disk, injected
 * ENOSPC fails no get and sets full (one log line), EIO counts, a regular file or a missing
 * parent as the directory is a clear error, a second create is EBUSY, modes are 0600/0700.
 * Four threads put / get / del at once; a child process killed (SIGKILL) in the middle of
 * its writes leaves a directory that opens (the lock died with it) and serves only
 * records that verify.
 * Scratch directories live under the working directory (the build tree).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pagoda/tier.h"
#include "tier/disk_int.h"
#include "t.h"
#include "t_dir.h"

/* ---- helpers ---- */

static char base[512]; /* this run's scratch root */
static char logbuf[1 << 14];
static int log_lines;

static void log_fn(void *ud, int level, const char *msg)
{
    (void)ud;
    (void)level;
    size_t n = strlen(logbuf);
    snprintf(logbuf + n, sizeof logbuf - n, "%s\n", msg);
    log_lines++;
}

static void log_reset(void)
{
    logbuf[0] = '\0';
    log_lines = 0;
}

static int count_in_log(const char *what)
{
    int n = 0;
    for (const char *p = strstr(logbuf, what); p; p = strstr(p + 1, what))
        n++;
    return n;
}

static int t_write_all_bytes(const char *path, const void *buf, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) return -1;
    int rc = write(fd, buf, n) == (ssize_t)n ? 0 : -1;
    close(fd);
    return rc;
}

static int t_is_regular(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static void scratch(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/%s", base, name);
    t_rm_rf(buf);
}

static pgd_record_ident make_ident(uint64_t fingerprint, int bounds)
{
    pgd_pool_params pp = pgd_pool_default_params();
    pgd_record_ident id;
    pp.n_layers = 2;
    pp.n_kv_heads = 2;
    pp.head_dim = 8;
    pp.page_tokens = 4;
    pp.capacity_pages = 4;
    pp.key_bounds = bounds;
    pgd_hash fp = {fingerprint, ~fingerprint};
    if (pgd_record_ident_make(&pp, fp, &id) != PGD_OK) abort();
    return id;
}

static pgd_tier *open_tier(const char *dir, uint64_t capacity, const pgd_record_ident *id,
                           int o_direct)
{
    pgd_tier_disk_params p = pgd_tier_disk_default_params();
    pgd_tier *t = NULL;
    p.dir = dir;
    p.capacity_bytes = capacity;
    p.o_direct = o_direct;
    p.log = log_fn;
    if (pgd_tier_disk_create(&p, &t) != PGD_OK) return NULL;
    if (id && pgd_tier_bind(t, id) != PGD_OK) {
        pgd_tier_close(t);
        return NULL;
    }
    return t;
}

/* The payload of block number k: page then bounds, a function of k only. */
static void payload_of(const pgd_record_ident *id, uint64_t k, uint8_t *page, uint8_t *bounds)
{
    uint64_t s = k * 0x9E3779B97F4A7C15ull + 1;
    for (uint64_t i = 0; i < id->page_bytes; i++)
        page[i] = (uint8_t)(t_rand(&s) >> 56);
    for (uint64_t i = 0; i < id->bounds_bytes; i++)
        bounds[i] = (uint8_t)(t_rand(&s) >> 56);
}

static pgd_hash hash_of(uint64_t k)
{
    pgd_hash h = {k * 0xD6E8FEB86659FD93ull + 7, k ^ 0xA5A5A5A5ull};
    return h;
}

static uint64_t rec_bytes(const pgd_record_ident *id)
{
    return PGD_RECORD_HEADER_BYTES + id->page_bytes + id->bounds_bytes;
}

static void rec_file(const char *dir, pgd_hash h, char *buf, size_t len)
{
    char hex[33];
    pgd_hash_hex(h, hex);
    snprintf(buf, len, "%s/records/%.2s/%s.rec", dir, hex, hex);
}

static int file_mode(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 ? (int)(sb.st_mode & 0777) : -1;
}

/* ---- the reference model ---- */

#define N_BLOCKS 96 /* block numbers 0..N_BLOCKS-1; block k's parent is (k - 1) / 2 */

typedef struct model {
    const pgd_record_ident *id;
    int held[N_BLOCKS];
    uint64_t file_bytes; /* bytes of one record file */
    int spilled, bad_spill;
    uint8_t *page, *bounds, *want_page, *want_bounds;
    uint8_t *spill_page, *spill_bounds; /* on_spill's, since it runs inside a put */
} model;

static int block_no(pgd_hash h)
{
    for (int k = 0; k < N_BLOCKS; k++)
        if (pgd_hash_eq(hash_of((uint64_t)k), h)) return k;
    return -1;
}

static pgd_hash parent_of(int k)
{
    pgd_hash none = {0, 0};
    return k == 0 ? none : hash_of((uint64_t)(k - 1) / 2);
}

static void on_spill(void *ud, pgd_hash block, pgd_hash parent, const void *page,
                     const void *bounds)
{
    model *m = ud;
    int k = block_no(block);
    m->spilled++;
    if (k < 0 || !m->held[k] || !pgd_hash_eq(parent, parent_of(k))) {
        m->bad_spill++;
        return;
    }
    payload_of(m->id, (uint64_t)k, m->spill_page, m->spill_bounds);
    if (memcmp(page, m->spill_page, m->id->page_bytes) != 0 ||
        (m->id->bounds_bytes && memcmp(bounds, m->spill_bounds, m->id->bounds_bytes) != 0))
        m->bad_spill++;
    /* Leaf-only: no child of k is held. */
    for (int c = 2 * k + 1; c <= 2 * k + 2 && c < N_BLOCKS; c++)
        if (m->held[c]) m->bad_spill++;
    m->held[k] = 0;
}

/* Every block agrees: lookup, and get byte-equal for held ones, ENOTFOUND for others. */
static int check_model(pgd_tier *t, model *m)
{
    pgd_tier_stats st;
    uint64_t n_held = 0;
    for (int k = 0; k < N_BLOCKS; k++) {
        pgd_hash h = hash_of((uint64_t)k);
        T_EQ(pgd_tier_lookup(t, &h, 1), (size_t)m->held[k]);
        int rc = pgd_tier_get(t, h, m->page, m->bounds);
        if (!m->held[k]) {
            T_EQ(rc, PGD_ENOTFOUND);
            continue;
        }
        n_held++;
        T_EQ(rc, PGD_OK);
        payload_of(m->id, (uint64_t)k, m->want_page, m->want_bounds);
        T_ASSERT(memcmp(m->page, m->want_page, m->id->page_bytes) == 0);
        if (m->id->bounds_bytes)
            T_ASSERT(memcmp(m->bounds, m->want_bounds, m->id->bounds_bytes) == 0);
    }
    pgd_tier_get_stats(t, &st);
    T_EQ(st.n_records, n_held);
    T_EQ(st.bytes_used, n_held * m->file_bytes);
    T_ASSERT(st.bytes_used <= st.bytes_capacity);
    T_EQ(st.n_corrupt, 0);
    T_EQ(st.n_io_errors, 0);
    return 0;
}

static int run_model(int bounds, int o_direct, uint64_t seed)
{
    char dir[1024];
    pgd_record_ident id = make_ident(42, bounds);
    model m = {.id = &id};
    uint64_t s = seed;
    uint64_t cap = 20 * rec_bytes(&id) + rec_bytes(&id) / 2; /* 20 records */
    m.file_bytes = rec_bytes(&id);
    if (o_direct) {
        m.file_bytes = (rec_bytes(&id) + 4095) / 4096 * 4096;
        cap = 20 * m.file_bytes;
    }
    scratch(dir, sizeof dir, "model");
    m.page = malloc(id.page_bytes);
    m.want_page = malloc(id.page_bytes);
    m.bounds = malloc(id.bounds_bytes + 1);
    m.want_bounds = malloc(id.bounds_bytes + 1);
    m.spill_page = malloc(id.page_bytes);
    m.spill_bounds = malloc(id.bounds_bytes + 1);
    pgd_tier *t = open_tier(dir, cap, &id, o_direct);
    T_ASSERT(t != NULL);
    for (int step = 0; step < 600; step++) {
        uint64_t r = t_rand(&s) % 100;
        int k = (int)(t_rand(&s) % N_BLOCKS);
        pgd_hash h = hash_of((uint64_t)k);
        if (r < 55) {
            payload_of(&id, (uint64_t)k, m.want_page, m.want_bounds);
            int was = m.held[k];
            T_EQ(pgd_tier_put(t, h, parent_of(k), m.want_page, bounds ? m.want_bounds : NULL,
                              on_spill, &m),
                 PGD_OK);
            T_EQ(m.bad_spill, 0);
            m.held[k] = 1;
            (void)was;
        } else if (r < 70) {
            T_EQ(pgd_tier_del(t, h), m.held[k] ? PGD_OK : PGD_ENOTFOUND);
            m.held[k] = 0;
        } else if (r < 78) {
            /* A run: lookup counts from the first. */
            pgd_hash run[4];
            size_t want = 0;
            int c = k;
            for (int i = 0; i < 4; i++) {
                run[3 - i] = hash_of((uint64_t)c);
                c = c ? (c - 1) / 2 : 0;
            }
            int chain[4];
            c = k;
            for (int i = 3; i >= 0; i--) {
                chain[i] = c;
                c = c ? (c - 1) / 2 : 0;
            }
            while (want < 4 && m.held[chain[want]])
                want++;
            T_EQ(pgd_tier_lookup(t, run, 4), want);
        } else if (r < 82) {
            pgd_tier_close(t);
            t = open_tier(dir, cap, &id, o_direct);
            T_ASSERT(t != NULL);
            if (check_model(t, &m)) return 1;
        } else {
            int rc = pgd_tier_get(t, h, m.page, m.bounds);
            T_EQ(rc, m.held[k] ? PGD_OK : PGD_ENOTFOUND);
            if (rc == PGD_OK) {
                payload_of(&id, (uint64_t)k, m.want_page, m.want_bounds);
                T_ASSERT(memcmp(m.page, m.want_page, id.page_bytes) == 0);
            }
        }
        if (step % 50 == 0 && check_model(t, &m)) return 1;
    }
    if (check_model(t, &m)) return 1;
    T_ASSERT(m.spilled > 0); /* the capacity was reached */
    pgd_tier_close(t);
    /* The restart after the last step: everything held is still there. */
    t = open_tier(dir, cap, &id, o_direct);
    T_ASSERT(t != NULL);
    if (check_model(t, &m)) return 1;
    pgd_tier_close(t);
    free(m.page);
    free(m.want_page);
    free(m.bounds);
    free(m.want_bounds);
    free(m.spill_page);
    free(m.spill_bounds);
    t_rm_rf(dir);
    return 0;
}

static int test_model_random(void)
{
    return run_model(0, 0, 1);
}

static int test_model_random_bounds(void)
{
    return run_model(1, 0, 2);
}

static int test_model_random_o_direct(void)
{
    return run_model(1, 1, 3);
}

/* ---- faults and edges ---- */

static int put_k(pgd_tier *t, const pgd_record_ident *id, int k)
{
    uint8_t page[4096], bounds[4096];
    payload_of(id, (uint64_t)k, page, bounds);
    return pgd_tier_put(t, hash_of((uint64_t)k), parent_of(k), page, bounds, NULL, NULL);
}

static int get_k(pgd_tier *t, const pgd_record_ident *id, int k)
{
    uint8_t page[4096], bounds[4096], want_page[4096], want_bounds[4096];
    int rc = pgd_tier_get(t, hash_of((uint64_t)k), page, bounds);
    if (rc != PGD_OK) return rc;
    payload_of(id, (uint64_t)k, want_page, want_bounds);
    if (memcmp(page, want_page, id->page_bytes) != 0) return -100;
    return PGD_OK;
}

static int test_temp_files_removed(void)
{
    char dir[1024], path[1200], hex[33];
    pgd_record_ident id = make_ident(1, 0);
    scratch(dir, sizeof dir, "temp");
    pgd_tier *t = open_tier(dir, 1 << 20, &id, 0);
    T_ASSERT(t != NULL);
    T_OK(put_k(t, &id, 0));
    pgd_tier_close(t);
    /* A write cut short by a crash: a partial temp file beside the record. */
    pgd_hash_hex(hash_of(5), hex);
    snprintf(path, sizeof path, "%s/records/%.2s", dir, hex);
    mkdir(path, 0700);
    snprintf(path, sizeof path, "%s/records/%.2s/%s.tmp.3", dir, hex, hex);
    T_OK(t_write_all_bytes(path, "PGDKVREC", 8));
    log_reset();
    t = open_tier(dir, 1 << 20, &id, 0);
    T_ASSERT(t != NULL);
    T_ASSERT(access(path, F_OK) != 0);
    T_ASSERT(strstr(logbuf, "1 temp files removed") != NULL);
    T_EQ(pgd_tier_lookup(t, (pgd_hash[]){hash_of(5)}, 1), 0);
    T_EQ(get_k(t, &id, 0), PGD_OK);
    pgd_tier_stats st;
    pgd_tier_get_stats(t, &st);
    T_EQ(st.n_records, 1);
    T_EQ(st.n_corrupt, 0);
    pgd_tier_close(t);
    t_rm_rf(dir);
    return 0;
}

static int flip_byte(const char *path, long off)
{
    int fd = open(path, O_RDWR);
    uint8_t b;
    if (fd < 0 || pread(fd, &b, 1, off) != 1) return -1;
    b ^= 0x40;
    int rc = pwrite(fd, &b, 1, off) == 1 ? 0 : -1;
    close(fd);
    return rc;
}

static int test_corrupt_byte_quarantined(void)
{
    char dir[1024], path[1200], q[1200], hex[33];
    pgd_record_ident id = make_ident(1, 1);
    pgd_tier_stats st;
    scratch(dir, sizeof dir, "corrupt");
    pgd_tier *t = open_tier(dir, 1 << 20, &id, 0);
    T_ASSERT(t != NULL);
    for (int k = 0; k < 4; k++)
        T_OK(put_k(t, &id, k));
    pgd_tier_close(t);

    /* Block 1: a payload byte (seen at get). Block 2: a header byte (seen at scan).
     * Block 3: cut short (seen at scan). */
    rec_file(dir, hash_of(1), path, sizeof path);
    T_OK(flip_byte(path, PGD_RECORD_HEADER_BYTES + 17));
    rec_file(dir, hash_of(2), path, sizeof path);
    T_OK(flip_byte(path, 40)); /* n_kv_heads */
    rec_file(dir, hash_of(3), path, sizeof path);
    T_OK(truncate(path, (off_t)rec_bytes(&id) - 1));

    log_reset();
    t = open_tier(dir, 1 << 20, &id, 0);
    T_ASSERT(t != NULL);
    pgd_tier_get_stats(t, &st);
    T_EQ(st.n_corrupt, 2);
    T_EQ(st.n_records, 2);
    T_ASSERT(strstr(logbuf, "2 damaged moved to quarantine/") != NULL);
    for (int k = 2; k <= 3; k++) {
        pgd_hash_hex(hash_of((uint64_t)k), hex);
        snprintf(q, sizeof q, "%s/quarantine/%s.rec", dir, hex);
        T_ASSERT(t_is_regular(q));
        rec_file(dir, hash_of((uint64_t)k), path, sizeof path);
        T_ASSERT(access(path, F_OK) != 0);
    }
    /* The payload flip is found by the checksum at get: a miss, then quarantined. */
    T_EQ(pgd_tier_lookup(t, (pgd_hash[]){hash_of(1)}, 1), 1);
    T_EQ(get_k(t, &id, 1), PGD_ENOTFOUND);
    pgd_tier_get_stats(t, &st);
    T_EQ(st.n_corrupt, 3);
    T_EQ(st.n_records, 1);
    T_EQ(pgd_tier_lookup(t, (pgd_hash[]){hash_of(1)}, 1), 0);
    pgd_hash_hex(hash_of(1), hex);
    snprintf(q, sizeof q, "%s/quarantine/%s.rec", dir, hex);
    T_ASSERT(t_is_regular(q));
    T_EQ(file_mode(q), 0600);
    T_EQ(file_mode(dir), 0700);
    snprintf(q, sizeof q, "%s/quarantine", dir);
    T_EQ(file_mode(q), 0700);
    T_EQ(get_k(t, &id, 0), PGD_OK); /* the good one is still served */
    pgd_tier_close(t);
    t_rm_rf(dir);
    return 0;
}

static int test_foreign_ignored(void)
{
    char dir[1024], path[1200];
    pgd_record_ident a = make_ident(1, 0), b = make_ident(2, 0), c = make_ident(1, 1);
    pgd_tier_stats st;
    scratch(dir, sizeof dir, "foreign");
    pgd_tier *t = open_tier(dir, 1 << 20, &a, 0);
    T_ASSERT(t != NULL);
    for (int k = 0; k < 5; k++)
        T_OK(put_k(t, &a, k));
    pgd_tier_close(t);

    /* Another model (fingerprint), then another geometry (key bounds): nothing served. */
    const pgd_record_ident *others[2] = {&b, &c};
    for (int i = 0; i < 2; i++) {
        t = open_tier(dir, 1 << 20, others[i], 0);
        T_ASSERT(t != NULL);
        pgd_tier_get_stats(t, &st);
        T_EQ(st.n_foreign, 5);
        T_EQ(st.n_records, 0);
        for (int k = 0; k < 5; k++) {
            T_EQ(pgd_tier_lookup(t, (pgd_hash[]){hash_of((uint64_t)k)}, 1), 0);
            T_EQ(get_k(t, others[i], k), PGD_ENOTFOUND);
        }
        /* Binding again to another identity is refused; to the same one is fine. */
        T_EQ(pgd_tier_bind(t, &a), PGD_EBUSY);
        T_EQ(pgd_tier_bind(t, others[i]), PGD_OK);
        pgd_tier_close(t);
        rec_file(dir, hash_of(3), path, sizeof path);
        T_ASSERT(t_is_regular(path)); /* left on disk */
    }
    t = open_tier(dir, 1 << 20, &a, 0);
    T_ASSERT(t != NULL);
    for (int k = 0; k < 5; k++)
        T_EQ(get_k(t, &a, k), PGD_OK);
    pgd_tier_close(t);
    t_rm_rf(dir);
    return 0;
}

static int test_enospc_sets_full(void)
{
    char dir[1024], path[1200];
    pgd_record_ident id = make_ident(1, 0);
    pgd_tier_stats st;
    scratch(dir, sizeof dir, "full");
    log_reset();
    pgd_tier *t = open_tier(dir, 1 << 20, &id, 0);
    T_ASSERT(t != NULL);
    T_OK(pgd__tier_disk_fault(t, ENOSPC, 3, UINT64_MAX));
    for (int k = 0; k < 3; k++)
        T_OK(put_k(t, &id, k));
    for (int k = 3; k < 8; k++)
        T_EQ(put_k(t, &id, k), PGD_ENOSPC);
    pgd_tier_get_stats(t, &st);
    T_EQ(st.full, 1);
    T_EQ(st.n_put_refused, 5);
    T_EQ(st.n_io_errors, 0);
    T_EQ(st.n_records, 3);
    T_EQ(count_in_log("filesystem full"), 1); /* one line, not one per put */
    for (int k = 0; k < 3; k++)
        T_EQ(get_k(t, &id, k), PGD_OK); /* reads go on */
    /* No temp file is left behind by the failed writes. */
    rec_file(dir, hash_of(4), path, sizeof path);
    T_ASSERT(access(path, F_OK) != 0);
    /* A del frees space: the next put is tried again (and fails again: still one line). */
    T_OK(pgd_tier_del(t, hash_of(2)));
    T_EQ(put_k(t, &id, 5), PGD_ENOSPC);
    T_EQ(count_in_log("filesystem full"), 1);
    /* The disk has room again: the put after the next del succeeds and clears full. */
    T_OK(pgd__tier_disk_fault(t, 0, 0, 0));
    T_EQ(put_k(t, &id, 6), PGD_ENOSPC); /* nothing freed since the last failure */
    T_OK(pgd_tier_del(t, hash_of(1)));
    T_OK(put_k(t, &id, 6));
    pgd_tier_get_stats(t, &st);
    T_EQ(st.full, 0);
    T_EQ(get_k(t, &id, 6), PGD_OK);
    T_ASSERT(strstr(logbuf, "writes resumed") != NULL);
    /* EDQUOT reads as full too. */
    T_OK(pgd__tier_disk_fault(t, EDQUOT, 0, 1));
    T_EQ(put_k(t, &id, 7), PGD_ENOSPC);
    pgd_tier_get_stats(t, &st);
    T_EQ(st.full, 1);
    pgd_tier_close(t);
    t_rm_rf(dir);
    return 0;
}

static int test_eio_counted(void)
{
    char dir[1024];
    pgd_record_ident id = make_ident(1, 0);
    pgd_tier_stats st;
    scratch(dir, sizeof dir, "eio");
    log_reset();
    pgd_tier *t = open_tier(dir, 1 << 20, &id, 0);
    T_ASSERT(t != NULL);
    T_OK(pgd__tier_disk_fault(t, EIO, 1, 2));
    T_OK(put_k(t, &id, 0));
    T_EQ(put_k(t, &id, 1), PGD_EIO);
    T_EQ(put_k(t, &id, 2), PGD_EIO);
    T_OK(put_k(t, &id, 3)); /* the fault is over */
    pgd_tier_get_stats(t, &st);
    T_EQ(st.n_io_errors, 2);
    T_EQ(st.full, 0);
    T_EQ(st.n_records, 2);
    T_ASSERT(strstr(logbuf, "Input/output error") != NULL);
    T_OK(pgd_tier_flush(t));
    pgd_tier_close(t);
    t_rm_rf(dir);
    return 0;
}

static int test_bad_dirs(void)
{
    char dir[1024], file[1200];
    pgd_tier_disk_params p = pgd_tier_disk_default_params();
    pgd_tier *t = (pgd_tier *)&t;
    p.log = log_fn;

    /* A regular file where the directory should be. */
    scratch(file, 1024, "plainfile");
    T_OK(t_write_all_bytes(file, "x", 1));
    p.dir = file;
    log_reset();
    T_EQ(pgd_tier_disk_create(&p, &t), PGD_EIO);
    T_ASSERT(t == NULL);
    T_ASSERT(strstr(logbuf, "not a directory") != NULL);
    /* A missing parent. */
    snprintf(dir, sizeof dir, "%s/missing/parent/tier", base);
    p.dir = dir;
    log_reset();
    T_EQ(pgd_tier_disk_create(&p, &t), PGD_EIO);
    T_ASSERT(strstr(logbuf, "No such file or directory") != NULL);
    T_ASSERT(strstr(logbuf, dir) != NULL);
    /* Nonsense. */
    p.dir = NULL;
    T_EQ(pgd_tier_disk_create(&p, &t), PGD_EINVAL);
    p.dir = "";
    T_EQ(pgd_tier_disk_create(&p, &t), PGD_EINVAL);
    p.dir = base;
    p.capacity_bytes = 0;
    T_EQ(pgd_tier_disk_create(&p, &t), PGD_EINVAL);
    T_EQ(pgd_tier_disk_key(NULL, (uint8_t[32]){0}), PGD_EINVAL);
    /* A key file that is not a key is refused, not replaced. */
    scratch(dir, sizeof dir, "badkey");
    mkdir(dir, 0700);
    snprintf(file, sizeof file, "%s/key", dir);
    T_OK(t_write_all_bytes(file, "short", 5));
    p.dir = dir;
    p.capacity_bytes = 1 << 20;
    T_EQ(pgd_tier_disk_create(&p, &t), PGD_ECORRUPT);
    t_rm_rf(dir);
    return 0;
}

static int test_lock_and_key(void)
{
    char dir[1024], path[1200];
    pgd_record_ident id = make_ident(1, 0);
    uint8_t k1[32], k2[32], zero[32] = {0};
    scratch(dir, sizeof dir, "lock");
    pgd_tier *a = open_tier(dir, 1 << 20, &id, 0);
    T_ASSERT(a != NULL);
    T_OK(pgd_tier_disk_key(a, k1));
    T_ASSERT(memcmp(k1, zero, 32) != 0);
    /* A second opener of the same directory (even in this process) is refused. */
    pgd_tier_disk_params p = pgd_tier_disk_default_params();
    pgd_tier *b = (pgd_tier *)&b;
    p.dir = dir;
    p.log = log_fn;
    log_reset();
    T_EQ(pgd_tier_disk_create(&p, &b), PGD_EBUSY);
    T_ASSERT(b == NULL);
    T_ASSERT(strstr(logbuf, "in use by another process") != NULL);
    char pid[32];
    snprintf(pid, sizeof pid, "pid %ld", (long)getpid());
    T_ASSERT(strstr(logbuf, pid) != NULL);
    T_OK(put_k(a, &id, 0));
    pgd_tier_close(a);
    /* Free again; the key is the same. */
    b = open_tier(dir, 1 << 20, &id, 0);
    T_ASSERT(b != NULL);
    T_OK(pgd_tier_disk_key(b, k2));
    T_ASSERT(memcmp(k1, k2, 32) == 0);
    /* Modes: files 0600, directories 0700. */
    snprintf(path, sizeof path, "%s/key", dir);
    T_EQ(file_mode(path), 0600);
    struct stat sb;
    T_OK(stat(path, &sb));
    T_EQ(sb.st_size, 32);
    snprintf(path, sizeof path, "%s/LOCK", dir);
    T_EQ(file_mode(path), 0600);
    snprintf(path, sizeof path, "%s/ident", dir);
    T_EQ(file_mode(path), 0600);
    snprintf(path, sizeof path, "%s/records", dir);
    T_EQ(file_mode(path), 0700);
    rec_file(dir, hash_of(0), path, sizeof path);
    T_EQ(file_mode(path), 0600);
    *strrchr(path, '/') = '\0';
    T_EQ(file_mode(path), 0700);
    T_ASSERT(strcmp(pgd_tier_name(b), "disk") == 0);
    pgd_tier_close(b);
    /* Another tier's handle is not a disk tier. */
    pgd_tier_ram_params rp = pgd_tier_ram_default_params();
    pgd_tier *ram = NULL;
    rp.capacity_bytes = 1 << 20;
    T_OK(pgd_tier_ram_create(&rp, &ram));
    T_EQ(pgd_tier_disk_key(ram, k2), PGD_EINVAL);
    T_EQ(pgd__tier_disk_fault(ram, EIO, 0, 1), PGD_EINVAL);
    T_ASSERT(strcmp(pgd_tier_name(ram), "ram") == 0);
    pgd_tier_close(ram);
    t_rm_rf(dir);
    return 0;
}

static int test_capacity_and_unbound(void)
{
    char dir[1024];
    pgd_record_ident id = make_ident(1, 0);
    pgd_tier_stats st;
    scratch(dir, sizeof dir, "cap");
    pgd_tier *t = open_tier(dir, 1 << 20, NULL, 0);
    T_ASSERT(t != NULL);
    /* Unbound: nothing is served or stored. */
    T_EQ(put_k(t, &id, 0), PGD_EINVAL);
    T_EQ(pgd_tier_lookup(t, (pgd_hash[]){hash_of(0)}, 1), 0);
    T_OK(pgd_tier_bind(t, &id));
    for (int k = 0; k < 10; k++)
        T_OK(put_k(t, &id, k));
    pgd_tier_close(t);
    /* Reopened with room for 4: the scan evicts down to the capacity. */
    t = open_tier(dir, 4 * rec_bytes(&id), &id, 0);
    T_ASSERT(t != NULL);
    pgd_tier_get_stats(t, &st);
    T_EQ(st.n_records, 4);
    T_EQ(st.n_evictions, 6);
    T_ASSERT(st.bytes_used <= 4 * rec_bytes(&id));
    /* A record larger than the whole capacity is refused. */
    pgd_tier_close(t);
    t = open_tier(dir, rec_bytes(&id) - 1, &id, 0);
    T_ASSERT(t != NULL);
    T_EQ(put_k(t, &id, 20), PGD_ENOSPC);
    pgd_tier_get_stats(t, &st);
    T_EQ(st.n_put_refused, 1);
    T_EQ(st.full, 0);
    pgd_tier_close(t);
    t_rm_rf(dir);
    return 0;
}

/* ---- threads: movers put, get and del at once ---- */

typedef struct worker {
    pgd_tier *t;
    const pgd_record_ident *id;
    uint64_t seed;
    int bad; /* gets that returned bytes other than the block's */
    int errors;
} worker;

static void *worker_main(void *arg)
{
    worker *w = arg;
    uint8_t page[4096], bounds[4096], want_page[4096], want_bounds[4096];
    for (int i = 0; i < 400; i++) {
        int k = (int)(t_rand(&w->seed) % 48);
        uint64_t r = t_rand(&w->seed) % 10;
        pgd_hash h = hash_of((uint64_t)k);
        if (r < 5) {
            payload_of(w->id, (uint64_t)k, want_page, want_bounds);
            int rc = pgd_tier_put(w->t, h, parent_of(k), want_page, want_bounds, NULL, NULL);
            if (rc != PGD_OK) w->errors++;
        } else if (r < 9) {
            int rc = pgd_tier_get(w->t, h, page, bounds);
            if (rc == PGD_OK) {
                payload_of(w->id, (uint64_t)k, want_page, want_bounds);
                if (memcmp(page, want_page, w->id->page_bytes) != 0 ||
                    memcmp(bounds, want_bounds, w->id->bounds_bytes) != 0)
                    w->bad++;
            } else if (rc != PGD_ENOTFOUND) {
                w->errors++;
            }
        } else {
            (void)pgd_tier_del(w->t, h);
        }
    }
    return NULL;
}

static int test_threads(void)
{
    char dir[1024];
    pgd_record_ident id = make_ident(9, 1);
    pthread_t th[4];
    worker w[4];
    pgd_tier_stats st;
    scratch(dir, sizeof dir, "threads");
    pgd_tier *t = open_tier(dir, 16 * rec_bytes(&id), &id, 0);
    T_ASSERT(t != NULL);
    for (int i = 0; i < 4; i++) {
        w[i] = (worker){.t = t, .id = &id, .seed = (uint64_t)i + 77};
        T_EQ(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        T_EQ(w[i].bad, 0);
        T_EQ(w[i].errors, 0);
    }
    pgd_tier_get_stats(t, &st);
    T_ASSERT(st.n_records <= 16);
    T_EQ(st.bytes_used, st.n_records * rec_bytes(&id));
    T_EQ(st.n_corrupt, 0);
    uint64_t held = 0;
    for (int k = 0; k < 48; k++)
        held += pgd_tier_lookup(t, (pgd_hash[]){hash_of((uint64_t)k)}, 1);
    T_EQ(held, st.n_records);
    pgd_tier_close(t);
    /* What the index held is what is on disk, and every record verifies. */
    t = open_tier(dir, 16 * rec_bytes(&id), &id, 0);
    T_ASSERT(t != NULL);
    pgd_tier_stats st2;
    pgd_tier_get_stats(t, &st2);
    T_EQ(st2.n_records, st.n_records);
    for (int k = 0; k < 48; k++) {
        int rc = get_k(t, &id, k);
        T_ASSERT(rc == PGD_OK || rc == PGD_ENOTFOUND);
    }
    pgd_tier_get_stats(t, &st2);
    T_EQ(st2.n_corrupt, 0);
    pgd_tier_close(t);
    t_rm_rf(dir);
    return 0;
}

/* ---- many records: the index grows; crafted parents ---- */

/* Writes a record file for block (parent) by hand, as another writer could. */
static int craft_record(const char *dir, const pgd_record_ident *id, pgd_hash block,
                        pgd_hash parent)
{
    char path[1200], hex[33];
    uint8_t hdr[PGD_RECORD_HEADER_BYTES], payload[4096];
    pgd_record_info info;
    memset(&info, 0, sizeof info);
    memset(payload, 0x3c, sizeof payload);
    info.ident = *id;
    info.block = block;
    info.parent = parent;
    info.payload_bytes = id->page_bytes + id->bounds_bytes;
    info.store_type = id->kv_type;
    info.compression = PGD_RECORD_RAW;
    info.raw_bytes = info.payload_bytes;
    if (pgd_record_write_header(&info, payload, hdr) != PGD_OK) return -1;
    pgd_hash_hex(block, hex);
    snprintf(path, sizeof path, "%s/records/%.2s", dir, hex);
    mkdir(path, 0700);
    snprintf(path, sizeof path, "%s/records/%.2s/%s.rec", dir, hex, hex);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) return -1;
    int ok = write(fd, hdr, sizeof hdr) == (ssize_t)sizeof hdr &&
             write(fd, payload, info.payload_bytes) == (ssize_t)info.payload_bytes;
    close(fd);
    return ok ? 0 : -1;
}

static int test_many_records_and_crafted_parents(void)
{
    char dir[1024];
    pgd_record_ident id = make_ident(11, 0);
    pgd_tier_stats st;
    pgd_hash x = {1, 1}, y = {2, 2}, z = {3, 3};
    scratch(dir, sizeof dir, "many");
    pgd_tier *t = open_tier(dir, 1000 * rec_bytes(&id), &id, 0);
    T_ASSERT(t != NULL);
    /* A record that is its own parent is refused. */
    uint8_t page[4096] = {0};
    T_EQ(pgd_tier_put(t, x, x, page, NULL, NULL, NULL), PGD_EINVAL);
    /* 300 records: the index grows from 64 slots, LRU order kept through each doubling. */
    for (int k = 0; k < 300; k++)
        T_OK(put_k(t, &id, k));
    pgd_tier_get_stats(t, &st);
    T_EQ(st.n_records, 300);
    pgd_tier_close(t);
    /* Crafted files: a cycle of parents (x <-> y) and one that is its own parent (z). */
    T_OK(craft_record(dir, &id, x, y));
    T_OK(craft_record(dir, &id, y, x));
    T_OK(craft_record(dir, &id, z, z));
    t = open_tier(dir, 1000 * rec_bytes(&id), &id, 0);
    T_ASSERT(t != NULL);
    pgd_tier_get_stats(t, &st);
    T_EQ(st.n_records, 302); /* the cycle is indexed (grown past it), z is damaged */
    T_EQ(st.n_corrupt, 1);
    T_EQ(pgd_tier_lookup(t, (pgd_hash[]){x, y}, 2), 2);
    for (int k = 0; k < 300; k += 37)
        T_OK(get_k(t, &id, k));
    pgd_tier_close(t);
    /* Reopened with room for 10: eviction down to the capacity, the cycle included. */
    t = open_tier(dir, 10 * rec_bytes(&id), &id, 0);
    T_ASSERT(t != NULL);
    pgd_tier_get_stats(t, &st);
    T_ASSERT(st.n_records <= 10);
    T_OK(put_k(t, &id, 5000));
    pgd_tier_close(t);
    t_rm_rf(dir);
    return 0;
}

/* ---- kill -9 in the middle of writes ---- */

static int test_kill9_during_writes(void)
{
    char dir[1024];
    pgd_record_ident id = make_ident(5, 1);
    pgd_tier_stats st;
    int pipefd[2];
    scratch(dir, sizeof dir, "kill9");
    T_EQ(pipe(pipefd), 0);
    fflush(NULL);
    pid_t pid = fork();
    T_ASSERT(pid >= 0);
    if (pid == 0) {
        /* The child writes records as fast as it can until it is killed. */
        close(pipefd[0]);
        pgd_tier *t = open_tier(dir, 1 << 20, &id, 0);
        if (!t) _exit(3);
        for (uint64_t k = 0;; k++) {
            if (put_k(t, &id, (int)(k % N_BLOCKS)) != PGD_OK) _exit(4);
            if (k == 8 && write(pipefd[1], "x", 1) != 1) _exit(5);
            if (k % N_BLOCKS == N_BLOCKS - 1) {
                for (int j = 0; j < N_BLOCKS; j++)
                    (void)pgd_tier_del(t, hash_of((uint64_t)j));
            }
        }
    }
    close(pipefd[1]);
    char c;
    T_EQ(read(pipefd[0], &c, 1), 1); /* the child is in its loop */
    close(pipefd[0]);
    usleep(20000);
    T_EQ(kill(pid, SIGKILL), 0);
    int status = 0;
    T_EQ(waitpid(pid, &status, 0), pid);
    T_ASSERT(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

    /* The lock died with the child; nothing damaged is indexed or served. */
    log_reset();
    pgd_tier *t = open_tier(dir, 1 << 20, &id, 0);
    T_ASSERT(t != NULL);
    pgd_tier_get_stats(t, &st);
    T_EQ(st.n_corrupt, 0);
    uint64_t served = 0;
    for (int k = 0; k < N_BLOCKS; k++) {
        int rc = get_k(t, &id, k);
        T_ASSERT(rc == PGD_OK || rc == PGD_ENOTFOUND);
        served += rc == PGD_OK;
    }
    T_EQ(served, st.n_records);
    pgd_tier_get_stats(t, &st);
    T_EQ(st.n_corrupt, 0);
    pgd_tier_close(t);
    t_rm_rf(dir);
    return 0;
}

typedef struct tally {
    int n[5];
    int bad_info;
    pgd_hash fp_ok, fp_foreign;
} tally;

static void on_file(void *ud, const pgd_tier_disk_file *f)
{
    tally *t = ud;
    t->n[f->kind]++;
    if ((f->kind == PGD_TIER_DISK_OK || f->kind == PGD_TIER_DISK_FOREIGN) != f->has_info)
        t->bad_info++;
    if (f->kind == PGD_TIER_DISK_OK) t->fp_ok = f->info.ident.model_fingerprint;
    if (f->kind == PGD_TIER_DISK_FOREIGN) t->fp_foreign = f->info.ident.model_fingerprint;
}

static int test_inspect_and_clear(void)
{
    char dir[1024], path[1200], hex[33];
    pgd_record_ident a = make_ident(7, 0), b = make_ident(8, 0), bound;
    uint8_t k1[32], k2[32];
    uint64_t n_removed = 0;
    tally ta;
    scratch(dir, sizeof dir, "inspect");
    T_EQ(pgd_tier_disk_inspect(dir, on_file, &ta, NULL), PGD_EIO); /* absent */
    mkdir(dir, 0700);
    T_EQ(pgd_tier_disk_inspect(dir, on_file, &ta, NULL), PGD_ENOTFOUND); /* not a tier */
    T_EQ(pgd_tier_disk_clear(dir, NULL, NULL, NULL), PGD_ENOTFOUND);

    pgd_tier *t = open_tier(dir, 1 << 20, &b, 0);
    T_ASSERT(t != NULL);
    for (int k = 10; k < 12; k++)
        T_OK(put_k(t, &b, k));
    pgd_tier_close(t);
    t = open_tier(dir, 1 << 20, &a, 0);
    T_ASSERT(t != NULL);
    T_OK(pgd_tier_disk_key(t, k1));
    for (int k = 0; k < 4; k++)
        T_OK(put_k(t, &a, k));
    rec_file(dir, hash_of(3), path, sizeof path);
    T_OK(flip_byte(path, PGD_RECORD_HEADER_BYTES + 3)); /* only a full read sees it */
    pgd_hash_hex(hash_of(3), hex);
    snprintf(path, sizeof path, "%s/records/%.2s/%s.tmp.9", dir, hex, hex);
    T_OK(t_write_all_bytes(path, "x", 1));

    /* While the tier runs: inspect reads, changes nothing. */
    memset(&ta, 0, sizeof ta);
    T_EQ(pgd_tier_disk_inspect(dir, on_file, &ta, &bound), 1);
    T_ASSERT(pgd_record_ident_eq(&bound, &a));
    T_EQ(ta.n[PGD_TIER_DISK_OK], 3);
    T_EQ(ta.n[PGD_TIER_DISK_DAMAGED], 1);
    T_EQ(ta.n[PGD_TIER_DISK_FOREIGN], 2);
    T_EQ(ta.n[PGD_TIER_DISK_TEMP], 1);
    T_EQ(ta.n[PGD_TIER_DISK_QUARANTINED], 0);
    T_EQ(ta.bad_info, 0);
    T_EQ(ta.fp_ok.lo, 7);
    T_EQ(ta.fp_foreign.lo, 8);
    T_ASSERT(t_is_regular(path));
    /* clear refuses while the tier holds the lock. */
    log_reset();
    T_EQ(pgd_tier_disk_clear(dir, log_fn, NULL, NULL), PGD_EBUSY);
    T_ASSERT(strstr(logbuf, "in use by another process") != NULL);
    T_EQ(get_k(t, &a, 3), PGD_ENOTFOUND); /* the damaged one goes to quarantine */
    pgd_tier_close(t);
    memset(&ta, 0, sizeof ta);
    T_EQ(pgd_tier_disk_inspect(dir, on_file, &ta, NULL), 1);
    T_EQ(ta.n[PGD_TIER_DISK_QUARANTINED], 1);
    T_EQ(ta.n[PGD_TIER_DISK_DAMAGED], 0);

    T_OK(pgd_tier_disk_clear(dir, NULL, NULL, &n_removed));
    T_EQ(n_removed, 3 + 2 + 1 + 1 + 1); /* records, temp, quarantined, ident */
    memset(&ta, 0, sizeof ta);
    T_EQ(pgd_tier_disk_inspect(dir, on_file, &ta, NULL), 0);
    for (int i = 0; i < 5; i++)
        T_EQ(ta.n[i], 0);
    snprintf(path, sizeof path, "%s/records", dir);
    T_ASSERT(access(path, F_OK) != 0);
    /* The key stays: the same hashes after a clear. */
    t = open_tier(dir, 1 << 20, &a, 0);
    T_ASSERT(t != NULL);
    T_OK(pgd_tier_disk_key(t, k2));
    T_ASSERT(memcmp(k1, k2, 32) == 0);
    T_EQ(pgd_tier_lookup(t, (pgd_hash[]){hash_of(0)}, 1), 0);
    pgd_tier_close(t);
    t_rm_rf(dir);
    return 0;
}

/* ---- policies and retention ---- */

static uint64_t fake_ns;

static uint64_t fake_clock(void *ud)
{
    (void)ud;
    return fake_ns;
}

/* Block k as the first block of its own chain. */
static int put_root(pgd_tier *t, const pgd_record_ident *id, int k)
{
    uint8_t page[4096], bounds[4096];
    pgd_hash none = {0, 0};
    payload_of(id, (uint64_t)k, page, bounds);
    return pgd_tier_put(t, hash_of((uint64_t)k), none, page, bounds, NULL, NULL);
}

static int held_k(pgd_tier *t, int k)
{
    pgd_hash h = hash_of((uint64_t)k);
    return (int)pgd_tier_lookup(t, &h, 1);
}

static pgd_tier *open_policy(const char *dir, uint64_t capacity, const pgd_record_ident *id,
                             int policy, double pin_share)
{
    pgd_tier_disk_params p = pgd_tier_disk_default_params();
    pgd_tier *t = NULL;
    p.dir = dir;
    p.capacity_bytes = capacity;
    p.policy = policy;
    p.pin_share = pin_share;
    p.log = log_fn;
    if (pgd_tier_disk_create(&p, &t) != PGD_OK) return NULL;
    if (pgd_tier_bind(t, id) != PGD_OK || pgd__tier_disk_set_clock(t, fake_clock, NULL)) {
        pgd_tier_close(t);
        return NULL;
    }
    return t;
}

/* Retention in the disk tier: expiry first, pins survive pressure and the map's growth
 * (64 slots, then 128, 256), the pin share refuses (PGD_ENOSPC); a restart forgets it. */
static int test_retention(void)
{
    char dir[1024];
    pgd_record_ident id = make_ident(1, 0);
    scratch(dir, sizeof dir, "retain");
    fake_ns = 5000ull * 1000000000ull;
    pgd_tier *t = open_policy(dir, 200 * rec_bytes(&id), &id, PGD_POLICY_LRU, 0.01);
    T_ASSERT(t != NULL);
    pgd_tier_retention pin = {PGD_PRIORITY_DEFAULT, 0, 1, 0, 0, 0};
    pgd_tier_retention ttl = {PGD_PRIORITY_DEFAULT, 30, 0, 0, 0, 0};
    T_EQ(pgd_tier_retain(t, hash_of(1000), &pin), PGD_ENOTFOUND);
    for (int k = 1000; k < 1010; k++)
        T_OK(put_root(t, &id, k));
    T_OK(pgd_tier_retain(t, hash_of(1000), &pin));
    T_OK(pgd_tier_retain(t, hash_of(1001), &pin));
    T_EQ(pgd_tier_retain(t, hash_of(1002), &pin), PGD_ENOSPC); /* 1% of 200 records: 2 */
    T_OK(pgd_tier_retain(t, hash_of(1005), &ttl));
    for (int k = 1010; k < 1190; k++) /* grows the map twice; the tier is not full yet */
        T_OK(put_root(t, &id, k));
    T_EQ(held_k(t, 1002), 1);
    fake_ns += 31ull * 1000000000ull;
    T_OK(put_root(t, &id, 1190));
    for (int k = 1191; k < 1201; k++) /* the 201st record: the expired one goes */
        T_OK(put_root(t, &id, k));
    T_EQ(held_k(t, 1005), 0);
    T_EQ(held_k(t, 1002), 1);
    T_OK(put_root(t, &id, 1201)); /* then the oldest unpinned, in LRU order */
    T_EQ(held_k(t, 1002), 0);
    T_EQ(held_k(t, 1003), 1);
    for (int k = 1201; k < 1600; k++) /* a flood: twice the capacity */
        T_OK(put_root(t, &id, k));
    T_EQ(held_k(t, 1000), 1);
    T_EQ(held_k(t, 1001), 1);
    T_EQ(held_k(t, 1100), 0);
    pgd_tier_close(t);
    /* Reopened: retention is not kept across a restart (tier.h); the records are. */
    t = open_policy(dir, 200 * rec_bytes(&id), &id, PGD_POLICY_LRU, 0.01);
    T_ASSERT(t != NULL);
    T_EQ(held_k(t, 1000), 1);
    for (int k = 2000; k < 2400; k++)
        T_OK(put_root(t, &id, k));
    T_EQ(held_k(t, 1000), 0);
    pgd_tier_close(t);
    t_rm_rf(dir);
    return 0;
}

/* Every policy a tier takes keeps leaf-only on the randomized model run's tree of blocks
 * (run_model checks each spill is a leaf); belady and unknown kinds are refused. */
static int test_policies(void)
{
    char dir[1024];
    pgd_record_ident id = make_ident(1, 0);
    scratch(dir, sizeof dir, "policies");
    for (int kind = 0; kind < PGD_POLICY_COUNT; kind++) {
        log_reset();
        pgd_tier *t = open_policy(dir, 24 * rec_bytes(&id), &id, kind, 0);
        if (kind == PGD_POLICY_BELADY || !pgd_policy_builtin((pgd_policy_kind)kind)) {
            T_ASSERT(t == NULL);
            T_EQ(count_in_log(kind == PGD_POLICY_BELADY ? "belady needs the future"
                                                        : "is not built into this libpagoda"),
                 1);
            continue;
        }
        T_ASSERT(t != NULL);
        /* The model's tree of blocks (k's parent (k - 1) / 2): on_spill checks that each
         * evicted block is held and a leaf (no child held). */
        model m = {.id = &id};
        uint8_t page[4096], bounds[4096], spage[4096], sbounds[4096];
        m.spill_page = spage;
        m.spill_bounds = sbounds;
        uint64_t seed = 5 + (uint64_t)kind;
        for (int step = 0; step < 600; step++) {
            int k = (int)(t_rand(&seed) % N_BLOCKS);
            if (t_rand(&seed) % 3) {
                payload_of(&id, (uint64_t)k, page, bounds);
                T_OK(pgd_tier_put(t, hash_of((uint64_t)k), parent_of(k), page, NULL, on_spill, &m));
                m.held[k] = 1;
            } else {
                int rc = get_k(t, &id, k);
                T_EQ(rc, m.held[k] ? PGD_OK : PGD_ENOTFOUND);
            }
        }
        T_EQ(m.bad_spill, 0);
        pgd_tier_stats st;
        pgd_tier_get_stats(t, &st);
        T_ASSERT(st.n_evictions > 50);
        pgd_tier_close(t);
        t_rm_rf(dir);
    }
    return 0;
}

int main(void)
{
    if (t_scratch_root(base, sizeof base, "test_tier_disk")) return 1;
    T_RUN(test_model_random);
    T_RUN(test_model_random_bounds);
    T_RUN(test_model_random_o_direct);
    T_RUN(test_temp_files_removed);
    T_RUN(test_corrupt_byte_quarantined);
    T_RUN(test_foreign_ignored);
    T_RUN(test_enospc_sets_full);
    T_RUN(test_eio_counted);
    T_RUN(test_bad_dirs);
    T_RUN(test_lock_and_key);
    T_RUN(test_capacity_and_unbound);
    T_RUN(test_inspect_and_clear);
    T_RUN(test_threads);
    T_RUN(test_kill9_during_writes);
    T_RUN(test_many_records_and_crafted_parents);
    T_RUN(test_retention);
    T_RUN(test_policies);
    if (!t_failed) t_rm_rf(base);
    T_DONE();
}
