/* SPDX-License-Identifier: MIT */
/*
 * bench_tier_disk.c - the measurement behind the disk tier's layout (src/tier/disk.c).
 *
 * Layout: write and read N records of a given size (default 180 KiB and 45 KiB, a
 * quarter: an f16 page and about a q4_0 one) laid out two ways:
 *   files    one file per record, DIR/records/XX/<32 hex>.rec, written as a temp file and
 *            renamed (what a torn write needs to stay invisible), pwrite / pread
 *   segment  one append-only segment file, pwrite at its end, pread at an offset
 * then the restart scan: files = readdir of the 256 subdirectories + open + pread of each
 * 128-byte header; segment = pread of each header, skipping payloads. Reads are in random
 * order, warm (page cache) and cold (posix_fadvise DONTNEED on every file first, which
 * drops clean pages without root).
 *
 * Figures on this machine (ext4 on virtio, 2 cores, 2000 records, page cache warm unless
 * "cold"), microseconds per record:
 *                   180 KiB: files  segment     45 KiB: files  segment
 *   write                   110      51                  49       14
 *   write + fsync           762     427                 487      422   (200 records)
 *   read warm                33      25                  11        8
 *   read cold               257     315                 105       83
 *   scan (per record)       5.5     1.1                 3.9      0.7
 * So one file per record costs 2-3x on writes (create + rename; 1.6 GB/s is still far
 * above what demotion needs, and it is off the request path), ~1.3x on warm reads and
 * nothing on cold reads (the promotion path), and its scan is 0.5 s per 100k records. In
 * exchange eviction is an unlink that frees space at once (a segment needs compaction),
 * a torn write is never visible (rename), and one damaged record is one file to
 * quarantine. The disk tier uses one file per record.
 *
 * Then "tier": the same records through the disk tier itself (pgd_tier_put of a chain,
 * pgd_tier_get warm and cold in random order, and the restart: close, create, bind). In a
 * later run on the same machine, loaded by other builds (files write 410 us there), the
 * tier's put cost 450 us, its gets 54 warm / 319 cold, its scan 7.6 us per 180 KiB record:
 * what the files layout costs plus the checksums.
 *
 * Figures are per record (microseconds) and MiB/s; the checksum folds bytes read back.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <pagoda/tier.h>

#include "bench.h"

#define HDR 128

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_tier_disk [options]\n"
               "Disk tier layout: one file per record vs one append-only segment file, then\n"
               "the disk tier itself (put, get warm and cold, restart scan).\n"
               "  --records N   records per size (default 1000)\n"
               "  --sizes A,B   record payload bytes (default 184320,46080)\n"
               "  --dir D       scratch directory, created and emptied (default\n"
               "                /tmp/bench_tier_disk.<pid>)\n"
               "  --fsync       fsync each record (file, then directory for 'files')\n"
               "  --seed N      payload and order seed (default 1)\n"
               "  --json        one JSON object per result line\n"
               "  --smoke       tiny and fast (16 records): for ctest\n"
               "  --help        show this help\n");
}

static uint64_t fold(uint64_t sum, uint64_t v)
{
    sum ^= v + 0x9E3779B97F4A7C15ull + (sum << 6) + (sum >> 2);
    return sum;
}

static uint64_t fold_bytes(uint64_t sum, const uint8_t *p, size_t n)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i += 4096)
        v = v * 31 + p[i];
    return fold(sum, v ^ p[n - 1] ^ n);
}

static int write_all(int fd, const void *buf, size_t n, off_t off)
{
    const uint8_t *p = buf;
    while (n) {
        ssize_t w = pwrite(fd, p, n, off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
        off += w;
    }
    return 0;
}

static int read_all(int fd, void *buf, size_t n, off_t off)
{
    uint8_t *p = buf;
    while (n) {
        ssize_t r = pread(fd, p, n, off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
        off += r;
    }
    return 0;
}

/* Removes dir's records/ tree and segment file (what this bench writes there). */
static void clean(const char *dir)
{
    char path[4096];
    for (int x = 0; x < 256; x++) {
        snprintf(path, sizeof path, "%s/records/%02x", dir, x);
        DIR *d = opendir(path);
        if (!d) continue;
        for (struct dirent *e = readdir(d); e; e = readdir(d)) {
            char f[4400];
            if (e->d_name[0] == '.') continue;
            snprintf(f, sizeof f, "%s/%s", path, e->d_name);
            unlink(f);
        }
        closedir(d);
        rmdir(path);
    }
    snprintf(path, sizeof path, "%s/records", dir);
    rmdir(path);
    snprintf(path, sizeof path, "%s/segment", dir);
    unlink(path);
}

typedef struct run_ctx {
    const char *dir;
    size_t n, size;
    int fsync_each;
    uint8_t *buf;   /* [HDR + size]: one record */
    uint8_t *rbuf;  /* [HDR + size]: read back */
    uint64_t *hash; /* [n]: the records' names */
    size_t *order;  /* [n]: a random permutation */
    uint64_t checksum;
} run_ctx;

static void rec_path(const run_ctx *c, size_t i, char *buf, size_t len, int tmp)
{
    uint64_t h = c->hash[i];
    snprintf(buf, len, "%s/records/%02x/%016" PRIx64 "%016" PRIx64 ".rec%s", c->dir,
             (unsigned)(h >> 56), h, ~h, tmp ? ".tmp" : "");
}

static void fill(run_ctx *c, size_t i)
{
    memcpy(c->buf, &c->hash[i], 8);
    memset(c->buf + 8, (int)(c->hash[i] & 0xff), 16);
    c->buf[HDR] = (uint8_t)i;
}

static int files_write(run_ctx *c)
{
    char path[4096], tmp[4096];
    for (size_t i = 0; i < c->n; i++) {
        rec_path(c, i, path, sizeof path, 0);
        rec_path(c, i, tmp, sizeof tmp, 1);
        fill(c, i);
        int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0) return -1;
        int rc = write_all(fd, c->buf, HDR + c->size, 0);
        if (rc == 0 && c->fsync_each) rc = fsync(fd);
        close(fd);
        if (rc != 0 || rename(tmp, path) != 0) return -1;
        if (c->fsync_each) {
            char d[4096];
            snprintf(d, sizeof d, "%s/records/%02x", c->dir, (unsigned)(c->hash[i] >> 56));
            int dfd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (dfd < 0 || fsync(dfd) != 0) return -1;
            close(dfd);
        }
    }
    return 0;
}

static int files_read(run_ctx *c, int cold)
{
    char path[4096];
    for (size_t k = 0; k < c->n; k++) {
        size_t i = c->order[k];
        rec_path(c, i, path, sizeof path, 0);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) return -1;
        if (cold) (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        int rc = read_all(fd, c->rbuf, HDR + c->size, 0);
        close(fd);
        if (rc != 0 || memcmp(c->rbuf, &c->hash[i], 8) != 0) return -1;
        c->checksum = fold_bytes(c->checksum, c->rbuf, HDR + c->size);
    }
    return 0;
}

static int files_drop(run_ctx *c)
{
    char path[4096];
    for (size_t i = 0; i < c->n; i++) {
        rec_path(c, i, path, sizeof path, 0);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) return -1;
        (void)fdatasync(fd);
        (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
    return 0;
}

static int files_scan(run_ctx *c, size_t *found)
{
    char path[4096];
    uint8_t hdr[HDR];
    *found = 0;
    for (int x = 0; x < 256; x++) {
        snprintf(path, sizeof path, "%s/records/%02x", c->dir, x);
        DIR *d = opendir(path);
        if (!d) continue;
        for (struct dirent *e = readdir(d); e; e = readdir(d)) {
            char f[4400];
            if (e->d_name[0] == '.') continue;
            snprintf(f, sizeof f, "%s/%s", path, e->d_name);
            int fd = open(f, O_RDONLY | O_CLOEXEC);
            if (fd < 0) continue;
            if (read_all(fd, hdr, HDR, 0) == 0) {
                (*found)++;
                c->checksum = fold(c->checksum, hdr[0]);
            }
            close(fd);
        }
        closedir(d);
    }
    return 0;
}

static int seg_write(run_ctx *c, int fd)
{
    for (size_t i = 0; i < c->n; i++) {
        fill(c, i);
        if (write_all(fd, c->buf, HDR + c->size, (off_t)(i * (HDR + c->size))) != 0) return -1;
        if (c->fsync_each && fdatasync(fd) != 0) return -1;
    }
    return 0;
}

static int seg_read(run_ctx *c, int fd)
{
    for (size_t k = 0; k < c->n; k++) {
        size_t i = c->order[k];
        if (read_all(fd, c->rbuf, HDR + c->size, (off_t)(i * (HDR + c->size))) != 0) return -1;
        if (memcmp(c->rbuf, &c->hash[i], 8) != 0) return -1;
        c->checksum = fold_bytes(c->checksum, c->rbuf, HDR + c->size);
    }
    return 0;
}

static int seg_scan(run_ctx *c, int fd, size_t *found)
{
    uint8_t hdr[HDR];
    *found = 0;
    for (size_t i = 0; i < c->n; i++) {
        if (read_all(fd, hdr, HDR, (off_t)(i * (HDR + c->size))) != 0) return -1;
        (*found)++;
        c->checksum = fold(c->checksum, hdr[0]);
    }
    return 0;
}

static void report(const run_ctx *c, int json, const char *layout, const char *phase, double s)
{
    double us = s * 1e6 / (double)c->n;
    double mibs = (double)c->n * (double)(HDR + c->size) / s / (1024.0 * 1024.0);
    if (!strcmp(phase, "scan")) mibs = 0;
    if (json)
        printf("{\"bench\":\"tier_disk\",\"layout\":\"%s\",\"record_bytes\":%zu,\"records\":%zu,"
               "\"phase\":\"%s\",\"us_per_record\":%.2f,\"mib_per_s\":%.1f}\n",
               layout, c->size, c->n, phase, us, mibs);
    else
        printf("%-8s %10zu %8zu  %-11s %12.2f %10.1f\n", layout, c->size, c->n, phase, us, mibs);
}

static int run_layouts(run_ctx *c, int json)
{
    char path[4096];
    double t;
    size_t found;

    clean(c->dir);
    snprintf(path, sizeof path, "%s/records", c->dir);
    if (mkdir(path, 0700) != 0) return -1;
    for (int x = 0; x < 256; x++) {
        snprintf(path, sizeof path, "%s/records/%02x", c->dir, x);
        if (mkdir(path, 0700) != 0) return -1;
    }
    t = bench_now_s();
    if (files_write(c) != 0) return -1;
    report(c, json, "files", "write", bench_now_s() - t);
    t = bench_now_s();
    if (files_read(c, 0) != 0) return -1;
    report(c, json, "files", "read warm", bench_now_s() - t);
    if (files_drop(c) != 0) return -1;
    t = bench_now_s();
    if (files_read(c, 1) != 0) return -1;
    report(c, json, "files", "read cold", bench_now_s() - t);
    t = bench_now_s();
    if (files_scan(c, &found) != 0 || found != c->n) return -1;
    report(c, json, "files", "scan", bench_now_s() - t);

    snprintf(path, sizeof path, "%s/segment", c->dir);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    int rc = -1;
    t = bench_now_s();
    if (seg_write(c, fd) != 0) goto out;
    report(c, json, "segment", "write", bench_now_s() - t);
    t = bench_now_s();
    if (seg_read(c, fd) != 0) goto out;
    report(c, json, "segment", "read warm", bench_now_s() - t);
    (void)fdatasync(fd);
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    t = bench_now_s();
    if (seg_read(c, fd) != 0) goto out;
    report(c, json, "segment", "read cold", bench_now_s() - t);
    t = bench_now_s();
    if (seg_scan(c, fd, &found) != 0 || found != c->n) goto out;
    report(c, json, "segment", "scan", bench_now_s() - t);
    rc = 0;
out:
    close(fd);
    clean(c->dir);
    return rc;
}

/* ---- the disk tier itself ---- */

static pgd_hash tier_hash(const run_ctx *c, size_t i)
{
    pgd_hash h = {c->hash[i], ~c->hash[i]};
    return h;
}

/* Drops the page cache of every record file of the tier at tdir (clean pages only). */
static void tier_drop(const run_ctx *c, const char *tdir)
{
    char path[4400], hex[33];
    for (size_t i = 0; i < c->n; i++) {
        pgd_hash_hex(tier_hash(c, i), hex);
        snprintf(path, sizeof path, "%s/records/%.2s/%s.rec", tdir, hex, hex);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        (void)fdatasync(fd);
        (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
}

static int tier_open(const run_ctx *c, const char *tdir, const pgd_record_ident *id, pgd_tier **out)
{
    pgd_tier_disk_params p = pgd_tier_disk_default_params();
    p.dir = tdir;
    p.capacity_bytes = 2 * (uint64_t)(c->n + 1) * (HDR + id->page_bytes);
    p.fsync = c->fsync_each;
    if (pgd_tier_disk_create(&p, out) != PGD_OK) return -1;
    if (pgd_tier_bind(*out, id) != PGD_OK) {
        pgd_tier_close(*out);
        *out = NULL;
        return -1;
    }
    return 0;
}

static int tier_gets(run_ctx *c, pgd_tier *t)
{
    for (size_t k = 0; k < c->n; k++) {
        size_t i = c->order[k];
        if (pgd_tier_get(t, tier_hash(c, i), c->rbuf, NULL) != PGD_OK) return -1;
        if (c->rbuf[0] != (uint8_t)i) return -1;
        c->checksum = fold_bytes(c->checksum, c->rbuf, c->size);
    }
    return 0;
}

/* put, get warm, get cold and restart (close, create, bind: the scan) through the disk
 * tier, on records of c->size payload bytes (a geometry of c->size / 1024 f16 layers). */
static int run_tier(run_ctx *c, int json)
{
    char tdir[4096], path[4200];
    pgd_pool_params pp = pgd_pool_default_params();
    pgd_record_ident id;
    pgd_tier *t = NULL;
    pgd_hash parent = {0, 0}, fp = {1, 2};
    pgd_tier_stats st;
    double t0;
    int rc = -1;

    pp.n_layers = (uint32_t)((c->size + 1023) / 1024); /* 2 x 16 tokens x 16 x f16 = 1 KiB */
    pp.n_kv_heads = 1;
    pp.head_dim = 16;
    pp.page_tokens = 16;
    pp.capacity_pages = 1;
    if (pgd_record_ident_make(&pp, fp, &id) != PGD_OK || id.page_bytes > c->size + 1023) return -1;
    uint8_t *page = calloc(1, id.page_bytes);
    uint8_t *rb = realloc(c->rbuf, id.page_bytes + HDR);
    if (!page || !rb) {
        free(page);
        return -1;
    }
    c->rbuf = rb;
    snprintf(tdir, sizeof tdir, "%s/tier", c->dir);
    if (tier_open(c, tdir, &id, &t) != 0) goto out;
    for (size_t i = 0; i < id.page_bytes; i++)
        page[i] = c->buf[HDR + i % c->size];
    t0 = bench_now_s();
    for (size_t i = 0; i < c->n; i++) {
        page[0] = (uint8_t)i;
        if (pgd_tier_put(t, tier_hash(c, i), parent, page, NULL, NULL, NULL) != PGD_OK) goto out;
        parent = tier_hash(c, i);
    }
    report(c, json, "tier", "put", bench_now_s() - t0);
    t0 = bench_now_s();
    if (tier_gets(c, t) != 0) goto out;
    report(c, json, "tier", "get warm", bench_now_s() - t0);
    tier_drop(c, tdir);
    t0 = bench_now_s();
    if (tier_gets(c, t) != 0) goto out;
    report(c, json, "tier", "get cold", bench_now_s() - t0);
    pgd_tier_close(t);
    t = NULL;
    t0 = bench_now_s();
    if (tier_open(c, tdir, &id, &t) != 0) goto out;
    report(c, json, "tier", "scan", bench_now_s() - t0);
    pgd_tier_get_stats(t, &st);
    if (st.n_records != c->n) goto out;
    rc = 0;
out:
    pgd_tier_close(t);
    if (pgd_tier_disk_clear(tdir, NULL, NULL, NULL) == PGD_OK) {
        snprintf(path, sizeof path, "%s/key", tdir);
        unlink(path);
        snprintf(path, sizeof path, "%s/LOCK", tdir);
        unlink(path);
        rmdir(tdir);
    }
    free(page);
    return rc;
}

int main(int argc, char **argv)
{
    static const struct option own[] = {{"records", required_argument, NULL, 'n'},
                                        {"sizes", required_argument, NULL, 's'},
                                        {"dir", required_argument, NULL, 'd'},
                                        {"fsync", no_argument, NULL, 'f'},
                                        {0}};
    bench_cli cli = {.prog = "bench_tier_disk",
                     .usage = usage,
                     .own = own,
                     .common = BENCH_SEED | BENCH_JSON | BENCH_SMOKE,
                     .a = {.seed = 1}};
    uint64_t n = 1000;
    uint32_t sizes[4] = {184320, 46080};
    int n_sizes = 2, fsync_each = 0, rc = 1;
    char dirbuf[256] = "";
    const char *dir = NULL;

    for (;;) {
        int c = bench_cli_next(&cli, argc, argv);
        if (c == -1) break;
        switch (c) {
        case 'n':
            if (bench_parse_u64(optarg, &n) != 0 || n == 0 || n > 1000000) {
                fprintf(stderr, "bench_tier_disk: --records: bad number '%s'\n", optarg);
                return 2;
            }
            break;
        case 's':
            n_sizes = bench_parse_u32_list(optarg, sizes, 4, 1);
            if (n_sizes < 0) {
                fprintf(stderr, "bench_tier_disk: --sizes: bad list '%s'\n", optarg);
                return 2;
            }
            break;
        case 'd':
            dir = optarg;
            break;
        case 'f':
            fsync_each = 1;
            break;
        }
    }
    if (cli.status >= 0) return cli.status;
    if (optind < argc) {
        fprintf(stderr, "bench_tier_disk: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (cli.a.smoke) n = 16;
    if (!dir) {
        snprintf(dirbuf, sizeof dirbuf, "/tmp/bench_tier_disk.%ld", (long)getpid());
        dir = dirbuf;
    }
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        fprintf(stderr, "bench_tier_disk: %s: %s\n", dir, strerror(errno));
        return 1;
    }

    uint64_t checksum = 0, seed = cli.a.seed ? cli.a.seed : 1;
    if (!cli.a.json)
        printf("%-8s %10s %8s  %-11s %12s %10s\n", "layout", "bytes", "records", "phase",
               "us/record", "MiB/s");
    for (int s = 0; s < n_sizes; s++) {
        run_ctx c = {.dir = dir, .n = n, .size = sizes[s], .fsync_each = fsync_each};
        c.buf = calloc(1, HDR + c.size);
        c.rbuf = calloc(1, HDR + c.size);
        c.hash = calloc(n, sizeof *c.hash);
        c.order = calloc(n, sizeof *c.order);
        if (!c.buf || !c.rbuf || !c.hash || !c.order) goto next;
        for (size_t i = 0; i < n; i++) {
            c.hash[i] = bench_rng(&seed);
            c.order[i] = i;
        }
        for (size_t i = n; i > 1; i--) {
            size_t j = bench_rng(&seed) % i, t = c.order[i - 1];
            c.order[i - 1] = c.order[j];
            c.order[j] = t;
        }
        for (size_t i = HDR; i < HDR + c.size; i++)
            c.buf[i] = (uint8_t)bench_rng(&seed);
        if (run_layouts(&c, cli.a.json) != 0) {
            fprintf(stderr, "bench_tier_disk: layout run failed in %s: %s\n", dir, strerror(errno));
            goto next;
        }
        if (run_tier(&c, cli.a.json) != 0) {
            fprintf(stderr, "bench_tier_disk: disk tier run failed in %s\n", dir);
            goto next;
        }
        checksum = fold(checksum, c.checksum);
        if (s == n_sizes - 1) rc = 0;
    next:
        free(c.buf);
        free(c.rbuf);
        free(c.hash);
        free(c.order);
    }
    if (dir == dirbuf) rmdir(dir); /* a user's --dir is left in place, emptied */
    bench_print_checksum(checksum, cli.a.json);
    return rc;
}
