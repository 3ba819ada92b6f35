/* SPDX-License-Identifier: MIT */
/*
 * test_tier_cli.c - `pagoda tier inspect` and `pagoda tier clear` as the real binary
 * (argv[1]) on disk tier directories this test fills through the public API (argv[2] is
 * the scratch directory).
 *
 * Checks: inspect groups records by identity (the one opened last "ok", another model's
 * "foreign"), counts ok / damaged / foreign / temp / quarantined, names a damaged file
 * (one flipped payload byte) and exits 1 for it, and changes nothing; clear refuses while
 * a tier has the directory open (this process holds its lock: exit 1, the holder's pid on
 * stderr), then removes records, temp and quarantined files and keeps the key; --help
 * spells out both; bad command lines exit 2; a missing, plain-file or non-tier directory
 * exits 1.
 */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pagoda/tier.h"
#include "proc.h"
#include "t.h"

static const char *bin;   /* the pagoda executable */
static const char *dir;   /* scratch directory */
static char out[1 << 16]; /* stdout of the last run */
static char err[1 << 16]; /* stderr of the last run */

static int run(const char *args)
{
    return t_run_bin(bin, dir, args, out, sizeof out, err, sizeof err);
}

static pgd_record_ident make_ident(uint64_t fingerprint)
{
    pgd_pool_params pp = pgd_pool_default_params();
    pgd_record_ident id;
    pp.n_layers = 3;
    pp.n_kv_heads = 2;
    pp.head_dim = 8;
    pp.page_tokens = 4;
    pp.capacity_pages = 4;
    pgd_hash fp = {fingerprint, fingerprint * 3};
    if (pgd_record_ident_make(&pp, fp, &id) != PGD_OK) abort();
    return id;
}

static pgd_hash hash_of(uint64_t k)
{
    pgd_hash h = {k * 0x9E3779B97F4A7C15ull + 11, k + 5};
    return h;
}

static pgd_tier *open_tier(const char *path, const pgd_record_ident *id)
{
    pgd_tier_disk_params p = pgd_tier_disk_default_params();
    pgd_tier *t = NULL;
    p.dir = path;
    p.capacity_bytes = 1 << 20;
    if (pgd_tier_disk_create(&p, &t) != PGD_OK) return NULL;
    if (pgd_tier_bind(t, id) != PGD_OK) {
        pgd_tier_close(t);
        return NULL;
    }
    return t;
}

/* Puts blocks first .. first + n - 1 (a chain) into t. */
static int put_chain(pgd_tier *t, const pgd_record_ident *id, uint64_t first, int n)
{
    uint8_t page[8192];
    pgd_hash parent = {0, 0};
    if (id->page_bytes > sizeof page) return -1;
    for (int i = 0; i < n; i++) {
        memset(page, (int)(first + (uint64_t)i), id->page_bytes);
        pgd_hash h = hash_of(first + (uint64_t)i);
        if (pgd_tier_put(t, h, parent, page, NULL, NULL, NULL) != PGD_OK) return -1;
        parent = h;
    }
    return 0;
}

static void rec_file(const char *tier_dir, pgd_hash h, char *buf, size_t len)
{
    char hex[33];
    pgd_hash_hex(h, hex);
    snprintf(buf, len, "%s/records/%.2s/%s.rec", tier_dir, hex, hex);
}

static int test_inspect_and_clear(void)
{
    char tdir[1024], args[2048], path[1200], hex_a[33], hex_b[33], line[256];
    pgd_record_ident a = make_ident(0xA1), b = make_ident(0xB2);
    snprintf(tdir, sizeof tdir, "%s/tier", dir);
    snprintf(args, sizeof args, "rm -rf '%s'", tdir);
    T_EQ(t_sh(args, out, sizeof out), 0);

    /* Model B's records, then model A's: A is the identity opened last. */
    pgd_tier *t = open_tier(tdir, &b);
    T_ASSERT(t != NULL);
    T_OK(put_chain(t, &b, 100, 2));
    pgd_tier_close(t);
    t = open_tier(tdir, &a);
    T_ASSERT(t != NULL);
    T_OK(put_chain(t, &a, 0, 3));
    pgd_tier_close(t);
    pgd_hash_hex(a.model_fingerprint, hex_a);
    pgd_hash_hex(b.model_fingerprint, hex_b);

    snprintf(args, sizeof args, "tier inspect '%s'", tdir);
    T_EQ(run(args), 0);
    T_ASSERT(strstr(out, "files: ok 3, damaged 0, foreign 2, temp 0, quarantined 0") != NULL);
    T_ASSERT(strstr(out, "key: present (mode 0600)") != NULL);
    T_ASSERT(strstr(out, hex_a) != NULL);
    T_ASSERT(strstr(out, hex_b) != NULL);
    uint64_t rec = PGD_RECORD_HEADER_BYTES + a.page_bytes;
    snprintf(line, sizeof line, "%9d %14llu  ok", 3, (unsigned long long)(3 * rec));
    T_ASSERT(strstr(out, line) != NULL);
    snprintf(line, sizeof line, "%9d %14llu  foreign", 2, (unsigned long long)(2 * rec));
    T_ASSERT(strstr(out, line) != NULL);
    T_ASSERT(strstr(out, "identity opened last: model ") != NULL);

    /* One payload byte flipped: damaged, named, exit 1; a temp file is counted. */
    rec_file(tdir, hash_of(1), path, sizeof path);
    int fd = open(path, O_RDWR);
    T_ASSERT(fd >= 0);
    uint8_t byte = 0x55;
    T_EQ(pwrite(fd, &byte, 1, PGD_RECORD_HEADER_BYTES + 9), 1);
    close(fd);
    char tmp[1300];
    snprintf(tmp, sizeof tmp, "%.*s.tmp.4", (int)(strlen(path) - 4), path);
    T_OK(t_write_all(tmp, "PGDK", 4));
    snprintf(args, sizeof args, "tier inspect '%s'", tdir);
    T_EQ(run(args), 1);
    T_ASSERT(strstr(out, "files: ok 2, damaged 1, foreign 2, temp 1, quarantined 0") != NULL);
    T_ASSERT(strstr(out, "damaged: records/") != NULL);
    T_ASSERT(strstr(out, strrchr(path, '/') + 1) != NULL);
    T_ASSERT(t_is_file(path) && t_is_file(tmp)); /* inspect changed nothing */

    /* A tier has the directory open: clear refuses and names this process. */
    t = open_tier(tdir, &a);
    T_ASSERT(t != NULL);
    snprintf(args, sizeof args, "tier clear '%s'", tdir);
    T_EQ(run(args), 1);
    snprintf(line, sizeof line, "pid %ld", (long)getpid());
    T_ASSERT(strstr(err, "in use by another process") != NULL);
    T_ASSERT(strstr(err, line) != NULL);
    /* inspect works while the tier runs: the scan removed the temp file, and read headers
     * only, so the damage is found by the first get, which quarantines the record. */
    snprintf(args, sizeof args, "tier inspect '%s'", tdir);
    T_EQ(run(args), 1);
    T_ASSERT(strstr(out, "files: ok 2, damaged 1, foreign 2, temp 0, quarantined 0") != NULL);
    uint8_t page[8192];
    T_EQ(pgd_tier_get(t, hash_of(1), page, NULL), PGD_ENOTFOUND);
    T_EQ(run(args), 0);
    T_ASSERT(strstr(out, "files: ok 2, damaged 0, foreign 2, temp 0, quarantined 1") != NULL);
    pgd_tier_close(t);

    snprintf(args, sizeof args, "tier clear '%s'", tdir);
    T_EQ(run(args), 0);
    T_ASSERT(strstr(out, "removed 6 files") != NULL); /* 4 records, 1 quarantined, ident */
    snprintf(path, sizeof path, "%s/key", tdir);
    T_ASSERT(t_is_file(path));
    snprintf(args, sizeof args, "tier inspect '%s'", tdir);
    T_EQ(run(args), 0);
    T_ASSERT(strstr(out, "files: ok 0, damaged 0, foreign 0, temp 0, quarantined 0") != NULL);
    return 0;
}

static int test_help_and_usage(void)
{
    char args[2048], plain[1100], empty[1100];
    T_EQ(run("tier --help"), 0);
    T_ASSERT(strstr(out, "inspect DIR") != NULL);
    T_ASSERT(strstr(out, "clear DIR") != NULL);
    T_ASSERT(strstr(out, "quarantined") != NULL);
    T_ASSERT(strstr(out, "keeping the hash key") != NULL);
    T_EQ(run("help tier"), 0);
    T_ASSERT(strstr(out, "inspect DIR") != NULL);
    T_EQ(run("tier inspect --help"), 0);
    T_EQ(run("--help"), 0);
    T_ASSERT(strstr(out, "tier") != NULL);

    T_EQ(run("tier"), 2);
    T_ASSERT(strstr(err, "missing subcommand") != NULL);
    T_EQ(run("tier bogus x"), 2);
    T_ASSERT(strstr(err, "unknown subcommand 'bogus'") != NULL);
    T_EQ(run("tier inspect"), 2);
    T_ASSERT(strstr(err, "missing DIR") != NULL);
    T_EQ(run("tier inspect a b"), 2);
    T_EQ(run("tier clear --force x"), 2);
    T_EQ(run("tier --bogus"), 2);

    snprintf(args, sizeof args, "tier inspect '%s/does/not/exist'", dir);
    T_EQ(run(args), 1);
    snprintf(plain, sizeof plain, "%s/plain.txt", dir);
    T_OK(t_write_all(plain, "x", 1));
    snprintf(args, sizeof args, "tier inspect '%s'", plain);
    T_EQ(run(args), 1);
    snprintf(args, sizeof args, "tier clear '%s'", plain);
    T_EQ(run(args), 1);
    snprintf(empty, sizeof empty, "%s/empty", dir);
    mkdir(empty, 0700);
    snprintf(args, sizeof args, "tier inspect '%s'", empty);
    T_EQ(run(args), 1);
    T_ASSERT(strstr(err, "not a disk tier directory") != NULL);
    snprintf(args, sizeof args, "tier clear '%s'", empty);
    T_EQ(run(args), 1);
    T_ASSERT(strstr(err, "not a disk tier directory") != NULL);
    return 0;
}

int main(int argc, char **argv)
{
    int rc = t_cli_args(argc, argv, NULL, &bin, &dir);
    if (rc != 0) return rc;
    T_RUN(test_inspect_and_clear);
    T_RUN(test_help_and_usage);
    T_DONE();
}
