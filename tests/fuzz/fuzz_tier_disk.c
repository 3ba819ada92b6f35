/* SPDX-License-Identifier: MIT */
/*
 * fuzz_tier_disk.c - fuzz target for the disk tier (src/tier/disk.c) over a directory
 * that anyone may have written: the input becomes the files of a disk tier directory in a
 * fresh temp directory (record files of raw input bytes, or records the target builds from
 * input fields with a valid checksum and then damages as the input says; a key file, an
 * ident file, temp files, quarantined files, a LOCK, and odd things: symlinks, directories
 * where files go, files where directories go), then
 *   pgd_tier_disk_inspect, pgd_tier_disk_create (a second create must be refused: EBUSY),
 *   bind, lookup / get of every block the files name, puts (with a spill hook) and dels,
 *   close, a restart (create + bind + gets again), inspect, pgd_tier_disk_clear, inspect.
 * Properties: nothing crashes or leaks (memory: LeakSanitizer; file descriptors: counted);
 * every status is one the API lists; a held record that a get misses (damaged) is gone from
 * records/ (quarantined); every get that returns PGD_OK is checked against the
 * record file's bytes (pgd_record_read_header with the bound identity, the block, the
 * payload equal to what get returned), and so is every spilled record (against what was
 * written under that block); a record inspect calls OK verifies; a record put is held and
 * reads back, and is still held after the restart; the key get returns is the key file's;
 * after a clear that returns PGD_OK nothing is left to inspect. The temp directory is
 * removed after each input (under /dev/shm when it can be written, else $TMPDIR or /tmp).
 *
 * Input layout: [flags (FLAG_*)][capacity byte][put mask][del mask], then entries until the
 * input ends: [kind][sel][len lo][len hi][len bytes of data] (len mod 1024, cut at the end).
 * See make_entry() for what each kind writes.
 */
#define _GNU_SOURCE /* nftw, mkdtemp, futimens */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <pagoda/tier.h>

#include "t_dir.h"
#include "tier/disk_int.h" /* pgd__tier_disk_fault */

enum { NL = 1, NH = 1, HD = 4, PT = 4, N_HASHES = 8, MAX_FILE = 8192 };

enum {
    FLAG_BOUNDS = 1,   /* the identity has key bounds */
    FLAG_DIRECT = 2,   /* o_direct */
    FLAG_FSYNC = 4,    /* fsync each record */
    FLAG_OTHER_FP = 8, /* bind another fingerprint: the records built "correct" are foreign */
    FLAG_ENOSPC = 16,  /* record writes fail with ENOSPC (pgd__tier_disk_fault) ... */
    FLAG_EIO = 32      /* ... or EIO, after (flags >> 6) writes, for two writes */
};

static void fail(const char *what)
{
    fprintf(stderr, "fuzz_tier_disk: %s\n", what);
    abort();
}

/* ---- the blocks the files name: two subdirectories (ab.., cd..) ---- */

static pgd_hash table_hash(uint32_t i)
{
    pgd_hash h;
    h.hi = ((uint64_t)(i < 4 ? 0xab : 0xcd) << 56) | (0x1111ull * (i + 1));
    h.lo = 0x100 + i;
    return h;
}

static pgd_record_ident g_ident;  /* the identity bound */
static pgd_record_ident g_record; /* the identity "correct" records are built with */
static char g_dir[512];
static uint8_t g_buf[MAX_FILE];

static void rec_rel(pgd_hash h, int wrong_sub, const char *suffix, char *out, size_t n)
{
    char hex[33];
    pgd_hash_hex(h, hex);
    snprintf(out, n, "records/%.2s/%s%s", wrong_sub ? "00" : hex, hex, suffix);
}

/* Reads dir/rel whole into g_buf. Returns its length, or -1. */
static long read_rel(const char *rel)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", g_dir, rel);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return -1;
    long len = 0;
    for (;;) {
        ssize_t r = read(fd, g_buf + len, sizeof g_buf - (size_t)len);
        if (r <= 0) break;
        len += r;
        if ((size_t)len == sizeof g_buf) break;
    }
    close(fd);
    return len;
}

/* ---- building the directory ---- */

static void mkdir_rel(const char *rel)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", g_dir, rel);
    (void)mkdir(path, 0700);
}

/* Makes the parent directories of rel (records/XX/, quarantine/). */
static void mkparents(const char *rel)
{
    char sub[512];
    for (const char *p = strchr(rel, '/'); p; p = strchr(p + 1, '/')) {
        snprintf(sub, sizeof sub, "%.*s", (int)(p - rel), rel);
        mkdir_rel(sub);
    }
}

/* Writes data[0..n) to dir/rel (replacing a file, symlink or empty directory there) with
 * mtime mtime_s when nonzero. Returns 0, or -1 (left as it was). */
static int write_rel(const char *rel, const uint8_t *data, size_t n, int64_t mtime_s)
{
    char path[1024];
    mkparents(rel);
    snprintf(path, sizeof path, "%s/%s", g_dir, rel);
    (void)remove(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return -1;
    int rc = n && write(fd, data, n) != (ssize_t)n ? -1 : 0;
    if (mtime_s) {
        struct timespec ts[2] = {{mtime_s, 0}, {mtime_s, 0}};
        (void)futimens(fd, ts);
    }
    close(fd);
    return rc;
}

static void ident_text(const pgd_record_ident *id, char *out, size_t n)
{
    char hex[33];
    pgd_hash_hex(id->model_fingerprint, hex);
    snprintf(out, n,
             "pagoda disk tier identity 1\nfingerprint %s\nkv_type %" PRIu32 "\nn_layers %" PRIu32
             "\nn_kv_heads %" PRIu32 "\nhead_dim %" PRIu32 "\npage_tokens %" PRIu32
             "\nflags %" PRIu32 "\nrotate_seed %" PRIu64 "\n",
             hex, id->kv_type, id->n_layers, id->n_kv_heads, id->head_dim, id->page_tokens,
             id->flags, id->rotate_seed);
}

/* The identity variant v: 0 the records' own, then one field changed. */
static pgd_record_ident ident_variant(uint32_t v)
{
    pgd_record_ident id = g_record;
    pgd_pool_params p = pgd_pool_default_params();
    p.n_layers = id.n_layers;
    p.n_kv_heads = id.n_kv_heads;
    p.head_dim = id.head_dim;
    p.page_tokens = id.page_tokens;
    p.kv_type = (pgd_kv_type)id.kv_type;
    p.key_bounds = (id.flags & PGD_RECORD_KEY_BOUNDS) != 0;
    switch (v % 5) {
    case 1:
        id.model_fingerprint.lo ^= 1;
        return id;
    case 2:
        p.kv_type = PGD_KV_F16;
        break;
    case 3:
        p.page_tokens = 8;
        break;
    case 4:
        p.key_bounds = !p.key_bounds;
        break;
    default:
        return id;
    }
    if (pgd_record_ident_make(&p, id.model_fingerprint, &id) != PGD_OK) abort();
    return id;
}

/* Per block: the bytes last written at its record path (for the spill check). */
typedef struct written {
    int present;
    size_t len;
    uint8_t bytes[MAX_FILE];
} written;

static written g_written[N_HASHES];

static void note_written(uint32_t i, int wrong_sub, const uint8_t *data, size_t n, int ok)
{
    if (wrong_sub) return; /* not the path the tier reads */
    g_written[i].present = ok == 0 && n <= MAX_FILE;
    g_written[i].len = n;
    if (g_written[i].present) memcpy(g_written[i].bytes, data, n);
}

/* A record built from data: d[0] the parent (0-7 a block, 8 none, 9 the block itself),
 * d[1] the identity variant (5: LZ4 claimed, 6: a short payload_bytes, 7: q8_0 stored),
 * d[2] damage (1: flip the byte at d[3..4] by d[5], 2: cut at d[3..4], 3: d[5] bytes more),
 * d[6] the mtime (seconds past a fixed date), then the payload's bytes (repeated). */
static void make_record(uint32_t block, uint32_t name_as, int wrong_sub, const uint8_t *d, size_t n)
{
    static uint8_t rec[MAX_FILE];
    uint8_t h[8] = {0};
    memcpy(h, d, n < 8 ? n : 8);
    pgd_record_info info;
    memset(&info, 0, sizeof info);
    uint32_t v = h[1] % 8;
    info.ident = ident_variant(v < 5 ? v : 0);
    info.block = table_hash(block);
    if (h[0] % 10 < 8)
        info.parent = table_hash(h[0] % 10);
    else if (h[0] % 10 == 9)
        info.parent = info.block;
    info.raw_bytes = info.ident.page_bytes + info.ident.bounds_bytes;
    info.payload_bytes = info.raw_bytes - (v == 6 ? 4 : 0);
    info.store_type = v == 7 ? PGD_KV_Q8_0 : info.ident.kv_type;
    info.compression = v == 5 ? PGD_RECORD_LZ4 : PGD_RECORD_RAW;
    size_t len = PGD_RECORD_HEADER_BYTES + (size_t)info.payload_bytes;
    if (len > sizeof rec - 256) return;
    for (size_t i = PGD_RECORD_HEADER_BYTES; i < len; i++)
        rec[i] = n > 8 ? d[8 + (i - PGD_RECORD_HEADER_BYTES) % (n - 8)] : (uint8_t)i;
    if (pgd_record_write_header(&info, rec + PGD_RECORD_HEADER_BYTES, rec) != PGD_OK)
        return; /* a form the writer refuses (q8_0 needs head_dim 32): no file */
    size_t off = ((size_t)h[3] | (size_t)h[4] << 8) % len;
    switch (h[2] % 4) {
    case 1:
        rec[off] ^= h[5] ? h[5] : 1;
        break;
    case 2:
        len = off;
        break;
    case 3:
        memset(rec + len, 0, h[5]);
        len += h[5];
        break;
    default:
        break;
    }
    char rel[128];
    rec_rel(table_hash(name_as), wrong_sub, ".rec", rel, sizeof rel);
    int rc = write_rel(rel, rec, len, 1500000000 + (int64_t)h[6]);
    note_written(name_as, wrong_sub, rec, len, rc);
}

/* One entry: kind % 8 is
 *   0 a record file of the data's bytes (sel: block 0-7, bit 3 a wrong subdirectory)
 *   1 a record built by make_record (sel: block 0-7, bits 3-4 the name: 1 another block's
 *     (bits 5-7), 2 a wrong subdirectory), 2 the key file (sel bit 0: a directory),
 *   3 the ident file (sel bit 0: an identity's text, variant sel >> 1; else the data),
 *   4 a temp file (records/XX/<hex>.tmp.<sel>), 5 LOCK (sel bit 0: a directory, bit 1: a
 *   symlink to key; else the data), 6 a quarantined record, 7 odd things (sel % 6: a
 *   symlink as a record, a directory as a record, records/ a file, quarantine/ a file, a
 *   file of another name in records/XX/, a record name in upper case). */
static void make_entry(uint8_t kind, uint8_t sel, const uint8_t *d, size_t n)
{
    char rel[128], path[1024], text[512];
    uint32_t blk = sel & 7;
    switch (kind % 8) {
    case 0: {
        int wrong = (sel >> 3) & 1;
        rec_rel(table_hash(blk), wrong, ".rec", rel, sizeof rel);
        note_written(blk, wrong, d, n, write_rel(rel, d, n, 0));
        break;
    }
    case 1: {
        uint32_t name = (sel >> 3) & 3;
        make_record(blk, name == 1 ? (uint32_t)(sel >> 5) : blk, name == 2, d, n);
        break;
    }
    case 2:
        if (sel & 1) {
            snprintf(path, sizeof path, "%s/key", g_dir);
            (void)remove(path);
            mkdir_rel("key");
        } else {
            write_rel("key", d, n, 0);
        }
        break;
    case 3:
        if (sel & 1) {
            pgd_record_ident id = (sel >> 1) & 1 ? ident_variant(sel >> 2) : g_ident;
            ident_text(&id, text, sizeof text);
            write_rel("ident", (const uint8_t *)text, strlen(text), 0);
        } else {
            write_rel("ident", d, n, 0);
        }
        break;
    case 4: {
        char suffix[16];
        snprintf(suffix, sizeof suffix, ".tmp.%u", (unsigned)sel);
        rec_rel(table_hash(blk), 0, suffix, rel, sizeof rel);
        write_rel(rel, d, n, 0);
        break;
    }
    case 5:
        snprintf(path, sizeof path, "%s/LOCK", g_dir);
        (void)remove(path);
        if (sel & 1)
            mkdir_rel("LOCK");
        else if (sel & 2)
            (void)!symlink("key", path);
        else
            write_rel("LOCK", d, n, 0);
        break;
    case 6: {
        char hex[33];
        pgd_hash_hex(table_hash(blk), hex);
        snprintf(rel, sizeof rel, "quarantine/%s.rec", hex);
        write_rel(rel, d, n, 0);
        break;
    }
    default:
        switch (sel % 6) {
        case 0:
            rec_rel(table_hash(blk), 0, ".rec", rel, sizeof rel);
            mkparents(rel);
            snprintf(path, sizeof path, "%s/%s", g_dir, rel);
            (void)remove(path);
            (void)!symlink("../../key", path);
            g_written[blk].present = 0;
            break;
        case 1:
            rec_rel(table_hash(blk), 0, ".rec", rel, sizeof rel);
            mkparents(rel);
            snprintf(path, sizeof path, "%s/%s", g_dir, rel);
            (void)remove(path);
            (void)mkdir(path, 0700);
            g_written[blk].present = 0;
            break;
        case 2:
            snprintf(path, sizeof path, "%s/records", g_dir);
            if (access(path, F_OK) != 0) write_rel("records", d, n, 0);
            break;
        case 3:
            snprintf(path, sizeof path, "%s/quarantine", g_dir);
            if (access(path, F_OK) != 0) write_rel("quarantine", d, n, 0);
            break;
        case 4:
            snprintf(rel, sizeof rel, "records/%s/junk.rec", blk < 4 ? "ab" : "cd");
            write_rel(rel, d, n, 0);
            break;
        default: {
            char hex[33];
            pgd_hash_hex(table_hash(blk), hex);
            for (char *c = hex; *c; c++)
                if (*c >= 'a' && *c <= 'f') *c = (char)(*c - 'a' + 'A');
            snprintf(rel, sizeof rel, "records/%.2s/%s.rec", hex, hex);
            write_rel(rel, d, n, 0);
            break;
        }
        }
        break;
    }
}

/* ---- checks ---- */

static int n_open_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    for (struct dirent *e = readdir(d); e; e = readdir(d))
        n++;
    closedir(d);
    return n;
}

static void on_log(void *ud, int level, const char *msg)
{
    (void)ud;
    (void)level;
    if (!msg || strlen(msg) == 0) fail("an empty log line");
}

/* A record get returned OK for block h: the file it came from must verify against the
 * bound identity and hold exactly page / bounds. */
static void check_served(pgd_hash h, const uint8_t *page, const uint8_t *bounds)
{
    char rel[128];
    pgd_record_info info;
    rec_rel(h, 0, ".rec", rel, sizeof rel);
    long len = read_rel(rel);
    if (len < PGD_RECORD_HEADER_BYTES) fail("get served a record whose file is gone or short");
    if (pgd_record_read_header(g_buf, g_buf + PGD_RECORD_HEADER_BYTES,
                               (uint64_t)len - PGD_RECORD_HEADER_BYTES, &g_ident, &info) != PGD_OK)
        fail("get served a record that does not verify");
    if (!pgd_hash_eq(info.block, h) || info.compression != PGD_RECORD_RAW ||
        info.store_type != g_ident.kv_type ||
        info.payload_bytes != g_ident.page_bytes + g_ident.bounds_bytes)
        fail("get served a record of another block or form");
    const uint8_t *pl = g_buf + PGD_RECORD_HEADER_BYTES;
    if (memcmp(pl, page, (size_t)g_ident.page_bytes) != 0 ||
        (g_ident.bounds_bytes &&
         memcmp(pl + g_ident.page_bytes, bounds, (size_t)g_ident.bounds_bytes) != 0))
        fail("get served bytes that are not the record's");
}

static void on_spill(void *ud, pgd_hash block, pgd_hash parent, const void *page,
                     const void *bounds)
{
    pgd_record_info info;
    (void)ud;
    (void)parent;
    for (uint32_t i = 0; i < N_HASHES; i++) {
        if (!pgd_hash_eq(block, table_hash(i))) continue;
        const written *w = &g_written[i];
        if (!w->present || w->len < PGD_RECORD_HEADER_BYTES ||
            pgd_record_read_header(w->bytes, w->bytes + PGD_RECORD_HEADER_BYTES,
                                   w->len - PGD_RECORD_HEADER_BYTES, &g_ident, &info) != PGD_OK)
            fail("spilled a record that was not written valid");
        const uint8_t *pl = w->bytes + PGD_RECORD_HEADER_BYTES;
        if (memcmp(pl, page, (size_t)g_ident.page_bytes) != 0 ||
            (g_ident.bounds_bytes &&
             memcmp(pl + g_ident.page_bytes, bounds, (size_t)g_ident.bounds_bytes) != 0))
            fail("spilled bytes that are not the record's");
        return;
    }
    fail("spilled a block no file named");
}

typedef struct inspect_ctx {
    pgd_record_ident bound, sentinel; /* bound == sentinel: no DIR/ident */
    uint32_t n_files;
} inspect_ctx;

static void on_visit(void *ud, const pgd_tier_disk_file *f)
{
    inspect_ctx *x = ud;
    pgd_record_info info;
    x->n_files++;
    if (!f || !f->path || f->path[0] == '/' || strstr(f->path, "..")) fail("inspect: a bad path");
    if (f->kind < PGD_TIER_DISK_OK || f->kind > PGD_TIER_DISK_QUARANTINED)
        fail("inspect: an unknown kind");
    if (f->kind != PGD_TIER_DISK_OK && f->kind != PGD_TIER_DISK_FOREIGN) return;
    if (!f->has_info) fail("inspect: a record without its header");
    long len = read_rel(f->path);
    if (len < PGD_RECORD_HEADER_BYTES) fail("inspect: a record that is not there");
    const uint8_t *pl = g_buf + PGD_RECORD_HEADER_BYTES;
    uint64_t pn = (uint64_t)len - PGD_RECORD_HEADER_BYTES;
    if (pgd_record_read_header(g_buf, pl, pn, NULL, &info) != PGD_OK)
        fail("inspect: a record that does not verify");
    if (!pgd_hash_eq(info.block, f->info.block)) fail("inspect: another block's header");
    char hex[33];
    pgd_hash_hex(info.block, hex);
    const char *base = strrchr(f->path, '/');
    if (!base || strncmp(base + 1, hex, 32) != 0) fail("inspect: a record under another name");
    int has_bound = memcmp(&x->bound, &x->sentinel, sizeof x->bound) != 0;
    int same = !has_bound || pgd_record_ident_eq(&x->bound, &info.ident);
    if (same != (f->kind == PGD_TIER_DISK_OK)) fail("inspect: OK and FOREIGN mixed up");
}

/* Runs pgd_tier_disk_inspect, every file checked by on_visit. The identity DIR/ident names
 * is stored before the walk: a bound that is not the sentinel then is one. */
static int inspect(inspect_ctx *x)
{
    memset(x, 0, sizeof *x);
    memset(&x->bound, 0xff, sizeof x->bound);
    x->sentinel = x->bound;
    int rc = pgd_tier_disk_inspect(g_dir, on_visit, x, &x->bound);
    if (rc != 0 && rc != 1 && rc != PGD_ENOTFOUND && rc != PGD_EIO) fail("inspect: a bad status");
    if ((rc == 1) != (memcmp(&x->bound, &x->sentinel, sizeof x->bound) != 0))
        fail("inspect: the bound identity and the status disagree");
    return rc;
}

/* ---- the tier's life ---- */

static int create(const pgd_tier_disk_params *dp, pgd_tier **t)
{
    int rc = pgd_tier_disk_create(dp, t);
    if (rc != PGD_OK && rc != PGD_EINVAL && rc != PGD_EIO && rc != PGD_ECORRUPT && rc != PGD_ENOMEM)
        fail("create: a bad status");
    if ((rc == PGD_OK) != (*t != NULL)) fail("create: *out and the status disagree");
    return rc;
}

/* Looks up, gets and checks every block; returns the mask of blocks held after. */
static uint32_t get_all(pgd_tier *t)
{
    static uint8_t page[4096], bounds[4096];
    pgd_hash hs[N_HASHES];
    uint32_t held = 0;
    for (uint32_t i = 0; i < N_HASHES; i++) {
        pgd_hash h = table_hash(i);
        hs[i] = h;
        size_t in = pgd_tier_lookup(t, &h, 1);
        if (in > 1) fail("lookup: more than asked");
        int rc = pgd_tier_get(t, h, page, bounds);
        if (rc == PGD_OK) {
            if (!in) fail("get: served a block lookup said is not held");
            check_served(h, page, bounds);
        } else if (rc == PGD_ENOTFOUND) {
            char rel[128], path[1024];
            struct stat sb;
            if (pgd_tier_lookup(t, &h, 1)) fail("get: a miss that stays held");
            /* Held, then a miss: the record did not verify, and left records/ (quarantine). */
            rec_rel(h, 0, ".rec", rel, sizeof rel);
            snprintf(path, sizeof path, "%s/%s", g_dir, rel);
            if (in && lstat(path, &sb) == 0) fail("get: a damaged record left in records/");
        } else if (rc != PGD_EIO && rc != PGD_ENOMEM) {
            fail("get: a bad status");
        }
        if (pgd_tier_lookup(t, &h, 1)) held |= 1u << i;
    }
    size_t lead = 0;
    while (lead < N_HASHES && (held >> lead & 1))
        lead++;
    if (pgd_tier_lookup(t, hs, N_HASHES) != lead) fail("lookup: a run that is not what is held");
    pgd_tier_stats st;
    pgd_tier_get_stats(t, &st);
    if (st.n_records != (uint64_t)__builtin_popcount(held)) fail("stats: records not held");
    return held;
}

static void tag_payload(uint32_t i, uint8_t *page, uint8_t *bounds)
{
    for (uint64_t k = 0; k < g_ident.page_bytes; k++)
        page[k] = (uint8_t)(i * 37 + k * 11);
    for (uint64_t k = 0; k < g_ident.bounds_bytes; k++)
        bounds[k] = (uint8_t)(i * 53 + k * 7);
}

/* Puts the blocks of put_mask (parent: the block before), then dels those of del_mask.
 * Returns the blocks put (held right after their put). */
static uint32_t put_some(pgd_tier *t, uint32_t put_mask, uint32_t del_mask)
{
    static uint8_t page[4096], bounds[4096], back[4096], bback[4096];
    uint32_t put = 0;
    for (uint32_t i = 0; i < N_HASHES; i++) {
        if (!(put_mask >> i & 1)) continue;
        pgd_hash h = table_hash(i), none = {0, 0};
        int was_held = pgd_tier_lookup(t, &h, 1) == 1;
        tag_payload(i, page, bounds);
        int rc = pgd_tier_put(t, h, i ? table_hash(i - 1) : none, page,
                              g_ident.bounds_bytes ? bounds : NULL, on_spill, NULL);
        if (rc != PGD_OK && rc != PGD_ENOSPC && rc != PGD_EIO && rc != PGD_ENOMEM)
            fail("put: a bad status");
        if (rc != PGD_OK) continue;
        if (!pgd_tier_lookup(t, &h, 1)) fail("put: OK but not held");
        if (!was_held) {
            /* Written now: the record's bytes are these (and what a spill must give). */
            uint8_t hdr[PGD_RECORD_HEADER_BYTES];
            pgd_record_info info;
            memset(&info, 0, sizeof info);
            info.ident = g_ident;
            info.block = h;
            info.parent = i ? table_hash(i - 1) : none;
            info.payload_bytes = info.raw_bytes = g_ident.page_bytes + g_ident.bounds_bytes;
            info.store_type = g_ident.kv_type;
            written *w = &g_written[i];
            memcpy(w->bytes + PGD_RECORD_HEADER_BYTES, page, (size_t)g_ident.page_bytes);
            memcpy(w->bytes + PGD_RECORD_HEADER_BYTES + g_ident.page_bytes, bounds,
                   (size_t)g_ident.bounds_bytes);
            if (pgd_record_write_header(&info, w->bytes + PGD_RECORD_HEADER_BYTES, hdr) != PGD_OK)
                abort();
            memcpy(w->bytes, hdr, sizeof hdr);
            w->len = PGD_RECORD_HEADER_BYTES + (size_t)info.payload_bytes;
            w->present = 1;
        }
        rc = pgd_tier_get(t, h, back, bback);
        if (rc == PGD_OK) {
            check_served(h, back, bback);
            if (!was_held && (memcmp(back, page, (size_t)g_ident.page_bytes) != 0 ||
                              memcmp(bback, bounds, (size_t)g_ident.bounds_bytes) != 0))
                fail("get: not what was put");
        } else if (!was_held && rc != PGD_ENOMEM) {
            fail("get: a record just put is not served");
        }
        if (pgd_tier_lookup(t, &h, 1)) put |= 1u << i;
    }
    for (uint32_t i = 0; i < N_HASHES; i++) {
        if (!(del_mask >> i & 1)) continue;
        pgd_hash h = table_hash(i);
        int held = pgd_tier_lookup(t, &h, 1) == 1;
        int rc = pgd_tier_del(t, h);
        if (rc != (held ? PGD_OK : PGD_ENOTFOUND)) fail("del: a bad status");
        if (pgd_tier_lookup(t, &h, 1)) fail("del: still held");
    }
    for (uint32_t i = 0; i < N_HASHES; i++) { /* a later put may have evicted it */
        pgd_hash h = table_hash(i);
        if (!pgd_tier_lookup(t, &h, 1)) put &= ~(1u << i);
    }
    return put;
}

/* ---- the target ---- */

static const char *tmp_root(void)
{
    const char *t = getenv("TMPDIR");
    if (access("/dev/shm", W_OK) == 0) return "/dev/shm";
    return t && t[0] ? t : "/tmp";
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 4) return 0;
    uint8_t flags = data[0], cap = data[1], put_mask = data[2], del_mask = data[3];
    size_t pos = 4;
    int fds0 = n_open_fds();

    pgd_pool_params pp = pgd_pool_default_params();
    pp.n_layers = NL;
    pp.n_kv_heads = NH;
    pp.head_dim = HD;
    pp.page_tokens = PT;
    pp.kv_type = PGD_KV_F32;
    pp.key_bounds = (flags & FLAG_BOUNDS) != 0;
    pgd_hash fp = {1, 2};
    if (pgd_record_ident_make(&pp, fp, &g_record) != PGD_OK) abort();
    g_ident = g_record;
    if (flags & FLAG_OTHER_FP) g_ident.model_fingerprint.hi ^= 4;
    memset(g_written, 0, sizeof g_written);

    snprintf(g_dir, sizeof g_dir, "%s/pgd-fuzz-disk-XXXXXX", tmp_root());
    if (!mkdtemp(g_dir)) fail("mkdtemp failed");
    while (pos + 4 <= size) {
        uint8_t kind = data[pos], sel = data[pos + 1];
        size_t n = ((size_t)data[pos + 2] | (size_t)data[pos + 3] << 8) % 1024;
        pos += 4;
        if (n > size - pos) n = size - pos;
        make_entry(kind, sel, data + pos, n);
        pos += n;
    }

    inspect_ctx x;
    inspect(&x);

    uint64_t rec_bytes = PGD_RECORD_HEADER_BYTES + g_ident.page_bytes + g_ident.bounds_bytes;
    pgd_tier_disk_params dp = pgd_tier_disk_default_params();
    dp.dir = g_dir;
    dp.capacity_bytes = (cap & 15) * rec_bytes + (cap >> 4) * 64;
    dp.fsync = (flags & FLAG_FSYNC) != 0;
    dp.o_direct = (flags & FLAG_DIRECT) != 0;
    dp.log = on_log;
    pgd_tier *t = NULL, *t2 = NULL;
    int bound = 0;
    uint32_t put = 0;
    if (create(&dp, &t) == PGD_OK) {
        uint8_t key[32];
        if (pgd_tier_disk_create(&dp, &t2) != PGD_EBUSY || t2)
            fail("a second create on a locked directory was not refused");
        if (pgd_tier_disk_key(t, key) != PGD_OK) fail("key: refused");
        if (read_rel("key") != 32 || memcmp(g_buf, key, 32) != 0) fail("key: not the key file's");
        int rc = pgd_tier_bind(t, &g_ident);
        if (rc != PGD_OK && rc != PGD_EIO && rc != PGD_ENOMEM) fail("bind: a bad status");
        if (rc == PGD_OK) {
            bound = 1;
            if (flags & (FLAG_ENOSPC | FLAG_EIO))
                pgd__tier_disk_fault(t, flags & FLAG_ENOSPC ? ENOSPC : EIO, flags >> 6, 2);
            pgd_record_ident other = g_ident;
            other.page_tokens = 8;
            if (pgd_tier_bind(t, &g_ident) != PGD_OK) fail("bind: again refused");
            if (pgd_tier_bind(t, &other) != PGD_EBUSY) fail("bind: another identity taken");
            get_all(t);
            put = put_some(t, put_mask, del_mask);
            get_all(t);
            rc = pgd_tier_flush(t);
            if (rc != PGD_OK && rc != PGD_EIO) fail("flush: a bad status");
        }
        pgd_tier_close(t);
        t = NULL;
        /* A restart: what was put and kept is held again, and every get verifies. */
        if (create(&dp, &t) != PGD_OK) fail("create: refused after a first success");
        rc = pgd_tier_bind(t, &g_ident);
        if (bound && rc != PGD_OK && rc != PGD_ENOMEM) fail("bind: refused after a first success");
        if (rc == PGD_OK) {
            uint32_t held = get_all(t);
            if ((put & held) != put) fail("restart: a record put is lost");
        }
        pgd_tier_close(t);
        t = NULL;
    }

    int rc = inspect(&x);
    if (bound && (rc != 1 || !pgd_record_ident_eq(&x.bound, &g_ident)))
        fail("inspect: not the identity bound");
    uint64_t n_removed = 0;
    rc = pgd_tier_disk_clear(g_dir, on_log, NULL, &n_removed);
    if (rc != PGD_OK && rc != PGD_EIO && rc != PGD_ENOTFOUND) fail("clear: a bad status");
    if (rc == PGD_OK) {
        inspect(&x);
        if (x.n_files) fail("clear: files left to inspect");
    }
    t_rm_rf(g_dir);
    if (access(g_dir, F_OK) == 0) fail("the temp directory could not be removed");
    if (fds0 >= 0 && n_open_fds() != fds0) fail("a file descriptor leaked");
    return 0;
}
