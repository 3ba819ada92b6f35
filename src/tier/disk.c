/* SPDX-License-Identifier: MIT */
/*
 * disk.c - the disk tier: page records in a directory that survives restarts.
 *
 *   DIR/LOCK                    flock(LOCK_EX | LOCK_NB) while a tier has DIR open; holds
 *                               the holder's pid, for the refusal's log line
 *   DIR/key                     the stable hash key, 32 random bytes, 0600
 *   DIR/ident                   the identity last bound (text), for `pagoda tier inspect`
 *   DIR/records/XX/<hex>.rec    one record per file (tier.h format), XX = its first two
 *                               hex digits, <hex> = pgd_hash_hex of the block hash
 *   DIR/records/XX/<hex>.tmp.N  a record being written: renamed to .rec once complete
 *   DIR/quarantine/<hex>.rec    damaged records, moved aside (never read again)
 * Files are created 0600, directories 0700.
 *
 * Layout: one file per record, chosen on bench/bench_tier_disk.c's figures (ext4, 2000
 * records; us per 180 KiB / 45 KiB record): writes 110 / 49 against 51 / 14 for one
 * append-only segment file, warm reads 33 / 11 against 25 / 8, cold reads 257 / 105
 * against 315 / 83, restart scan 5.5 / 3.9 against 1.1 / 0.7. The cost is on the writes,
 * which the movers do off the request path (1.6 GB/s is plenty); the promotion path (cold
 * reads) costs the same. In exchange an eviction is an unlink that frees space at once (a
 * segment needs compaction), a torn write is never visible (temp file + rename), and a
 * damaged record is one file to quarantine.
 *
 * Record I/O is pwritev / preadv on the caller's thread (the cache's movers): the header,
 * then the page and its key bounds straight from / into the caller's buffers; with
 * o_direct, through a page-aligned bounce buffer and files padded to 4096 bytes. With
 * fsync, a record is fsync'ed before its rename and its directory after, so a record that
 * is visible is durable; without it, flush (syncfs) makes every completed put durable.
 *
 * bind scans records/: each .rec file's header is read (not its payload): a record of the
 * bound identity is indexed, one of another identity is counted (n_foreign) and left on
 * disk, a damaged one (bad header, a size or name that disagrees with it) is counted
 * (n_corrupt) and moved to quarantine/; leftover temp files (a write that a crash cut
 * short) are removed. Records are indexed oldest first (mtime), so the LRU order after a
 * restart is the order they were written. Then the capacity is enforced. get reads the
 * whole record and verifies its checksum: a record is served only when it verifies.
 *
 * Disk full (ENOSPC or EDQUOT on a write): full = 1, one log line, puts are refused
 * (n_put_refused) and gets go on; a put is tried again after an eviction or a del freed
 * space, and one that succeeds clears full. Other write errors count n_io_errors.
 *
 * Locking: one mutex guards the index and the counters; file I/O runs outside it. A block
 * being written is on the pending list, so a second put of it returns at once and no
 * eviction or del races with its rename.
 */
#define _GNU_SOURCE /* O_DIRECT, syncfs */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "tier/disk_int.h"
#include "tier/tier_int.h"

#define KEY_BYTES 32
#define DIRECT_ALIGN 4096u
#define PATH_BYTES 4096
#define DIR_MAX_BYTES 3000 /* leaves room for "/records/XX/<32 hex>.tmp.N" */

typedef struct disk {
    pgd__alloc al;
    pgd__log lg;
    char dir[DIR_MAX_BYTES + 1];
    int lock_fd;
    uint8_t key[KEY_BYTES];
    uint64_t capacity_bytes;
    int fsync_each;
    int o_direct;
    const pgd_policy_ops *policy; /* params.policy's table */
    double pin_share;             /* resolved: (0, 1] */
    pthread_mutex_t mu;
    int mu_ok;

    /* Guarded by mu: */
    int bound;
    pgd_record_ident ident;
    uint64_t rec_bytes;  /* header + page + bounds */
    uint64_t file_bytes; /* rec_bytes, padded to DIRECT_ALIGN with o_direct */
    pgd__tmap *map;      /* block -> slot: leaf-only, ordered by policy (bind) */
    pgd_clock_fn clock;  /* the map's clock (NULL: CLOCK_REALTIME; a test hook) */
    void *clock_ud;
    uint64_t *slot_bytes;    /* [map capacity]: the file's bytes of each live slot */
    uint64_t used_bytes;     /* sum of slot_bytes over live slots */
    uint32_t max_slots;      /* the most records the capacity can hold */
    uint64_t reserved_bytes; /* puts in flight */
    pgd_hash *pending;       /* [n_pending]: blocks being written */
    size_t n_pending, cap_pending;
    uint64_t tmp_seq;
    int freed_since_full; /* an eviction or del since full was set: try writing again */
    pgd_tier_stats st;    /* counters; bytes_used / n_records come from the map */
    int fault_err;
    uint64_t fault_after, fault_count;
} disk;

static const pgd_tier_ops disk_ops;

/* ---- small helpers ---- */

static uint64_t round_up(uint64_t n, uint64_t a)
{
    return (n + a - 1) / a * a;
}

static int is_hex(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return 0;
    }
    return 1;
}

static int hex_val(char c)
{
    return c <= '9' ? c - '0' : c - 'a' + 10;
}

/* Parses 32 hex digits (pgd_hash_hex: hi then lo) into *h. */
static void hash_parse(const char *s, pgd_hash *h)
{
    h->hi = 0;
    h->lo = 0;
    for (int i = 0; i < 16; i++)
        h->hi = h->hi << 4 | (uint64_t)hex_val(s[i]);
    for (int i = 16; i < 32; i++)
        h->lo = h->lo << 4 | (uint64_t)hex_val(s[i]);
}

/* Non-zero when name is "<32 hex>.rec". */
static int is_record_name(const char *name)
{
    return strlen(name) == 36 && is_hex(name, 32) && strcmp(name + 32, ".rec") == 0;
}

/* Non-zero when name is a temp file of a record write ("<32 hex>.tmp.N"). */
static int is_temp_name(const char *name)
{
    return strlen(name) > 37 && is_hex(name, 32) && strncmp(name + 32, ".tmp.", 5) == 0;
}

/* A status for errno e of a write: full (ENOSPC, EDQUOT) or an I/O error. */
static int write_status(int e)
{
    return e == ENOSPC || e == EDQUOT ? PGD_ENOSPC : PGD_EIO;
}

static void rec_path(const disk *d, pgd_hash block, char *buf)
{
    char hex[33];
    pgd_hash_hex(block, hex);
    snprintf(buf, PATH_BYTES, "%s/records/%.2s/%s.rec", d->dir, hex, hex);
}

static int read_full(int fd, void *buf, size_t n, off_t off)
{
    uint8_t *p = buf;
    while (n) {
        ssize_t r = pread(fd, p, n, off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) {
            errno = 0; /* short file */
            return -1;
        }
        p += r;
        n -= (size_t)r;
        off += r;
    }
    return 0;
}

static int write_full(int fd, const void *buf, size_t n)
{
    const uint8_t *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* fsync of the directory at path. Returns 0 or -1 (errno). */
static int fsync_dir(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

/* A buffer of n bytes aligned to DIRECT_ALIGN, from al; *raw gets what to free. */
static void *alloc_aligned(const pgd__alloc *al, size_t n, void **raw)
{
    uint8_t *p = pgd__malloc(al, n + DIRECT_ALIGN);
    *raw = p;
    if (!p) return NULL;
    return p + (DIRECT_ALIGN - (uintptr_t)p % DIRECT_ALIGN) % DIRECT_ALIGN;
}

/* ---- the pending list (blocks being written; mu held) ---- */

static int pending_has(const disk *d, pgd_hash h)
{
    for (size_t i = 0; i < d->n_pending; i++)
        if (pgd_hash_eq(d->pending[i], h)) return 1;
    return 0;
}

static int pending_add(disk *d, pgd_hash h)
{
    if (d->n_pending == d->cap_pending) {
        size_t cap = d->cap_pending ? 2 * d->cap_pending : 8;
        pgd_hash *p = pgd__realloc(&d->al, d->pending, cap * sizeof *p);
        if (!p) return PGD_ENOMEM;
        d->pending = p;
        d->cap_pending = cap;
    }
    d->pending[d->n_pending++] = h;
    return PGD_OK;
}

static void pending_del(disk *d, pgd_hash h)
{
    for (size_t i = 0; i < d->n_pending; i++) {
        if (pgd_hash_eq(d->pending[i], h)) {
            d->pending[i] = d->pending[--d->n_pending];
            return;
        }
    }
}

/* ---- the index (tier_int.h's record map; mu held) ---- */

static uint32_t m_find(const disk *d, pgd_hash h)
{
    return d->map ? pgd__tmap_find(d->map, h) : PGD__NONE;
}

/* Makes a map of n slots (and its byte array) holding what the current one holds, in the
 * same eviction order near enough (drained leaf by leaf, oldest first). Returns PGD_OK or
 * PGD_ENOMEM (the current map is kept). */
static int m_resize(disk *d, uint32_t n)
{
    pgd__tmap *m = NULL;
    uint64_t *b = pgd__calloc(&d->al, n, sizeof *b);
    if (!b || pgd__tmap_create(&d->al, n, d->policy, &d->ident, &m) != PGD_OK) {
        pgd__free(&d->al, b);
        return PGD_ENOMEM;
    }
    pgd__tmap_set_clock(m, d->clock, d->clock_ud);
    pgd__tmap_set_pin_limit(m, (uint64_t)(d->pin_share * (double)d->capacity_bytes));
    if (d->map) {
        PGD_CHECK(pgd__tmap_count(d->map) <= n);
        for (uint32_t t = 0; t < PGD__TMAP_TENANTS; t++)
            pgd__tmap_set_share(m, t, pgd__tmap_share(d->map, t));
        for (uint32_t v = pgd__tmap_victim(d->map); v != PGD__NONE; v = pgd__tmap_victim(d->map)) {
            const pgd__tmap_slot *sl = pgd__tmap_slot_get(d->map, v);
            uint32_t ns = pgd__tmap_insert(m, sl->hash, sl->parent);
            PGD_CHECK(ns != PGD__NONE);
            pgd__tmap_restore(m, ns, sl);
            b[ns] = d->slot_bytes[v];
            d->slot_bytes[v] = 0;
            pgd__tmap_remove(d->map, v);
        }
        /* What no victim reaches (a cycle of parents, which only crafted files make):
         * copied in slot order. A live slot has bytes > 0. */
        for (uint32_t v = 0; pgd__tmap_count(d->map) && v < pgd__tmap_capacity(d->map); v++) {
            if (!d->slot_bytes[v]) continue;
            const pgd__tmap_slot *sl = pgd__tmap_slot_get(d->map, v);
            uint32_t ns = pgd__tmap_insert(m, sl->hash, sl->parent);
            PGD_CHECK(ns != PGD__NONE);
            pgd__tmap_restore(m, ns, sl);
            b[ns] = d->slot_bytes[v];
            d->slot_bytes[v] = 0;
            pgd__tmap_remove(d->map, v);
        }
        PGD_CHECK(pgd__tmap_count(d->map) == 0);
        pgd__tmap_destroy(d->map);
    }
    pgd__free(&d->al, d->slot_bytes);
    d->map = m;
    d->slot_bytes = b;
    return PGD_OK;
}

/* Adds block (absent) to the index, growing the map when it is full and the capacity
 * allows more records. Returns PGD_OK, PGD_ENOSPC (max_slots records held) or
 * PGD_ENOMEM. */
static int m_insert(disk *d, pgd_hash block, pgd_hash parent, uint64_t bytes)
{
    uint32_t cap = pgd__tmap_capacity(d->map);
    if (pgd__tmap_count(d->map) == cap) {
        if (cap >= d->max_slots) return PGD_ENOSPC;
        uint32_t n = cap > d->max_slots / 2 ? d->max_slots : 2 * cap;
        if (m_resize(d, n) != PGD_OK) return PGD_ENOMEM;
    }
    uint32_t slot = pgd__tmap_insert(d->map, block, parent);
    PGD_CHECK(slot != PGD__NONE);
    d->slot_bytes[slot] = bytes;
    d->used_bytes += bytes;
    return PGD_OK;
}

static void m_remove(disk *d, uint32_t slot)
{
    d->used_bytes -= d->slot_bytes[slot];
    d->slot_bytes[slot] = 0;
    pgd__tmap_remove(d->map, slot);
}

static uint64_t m_count(const disk *d)
{
    return d->map ? pgd__tmap_count(d->map) : 0;
}

/* ---- record files ---- */

/* Moves the record file at path to quarantine/ (created if absent); on failure it is
 * unlinked instead, so that it is never read again. */
static void quarantine(const disk *d, const char *path)
{
    char q[PATH_BYTES];
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    snprintf(q, sizeof q, "%s/quarantine", d->dir);
    if (mkdir(q, 0700) != 0 && errno != EEXIST) {
        unlink(path);
        return;
    }
    snprintf(q, sizeof q, "%s/quarantine/%s", d->dir, base);
    if (rename(path, q) != 0) unlink(path);
}

/* Writes block's record into its file: temp file, then rename. Returns PGD_OK,
 * PGD_ENOSPC (the filesystem is full), PGD_EIO (logged) or PGD_ENOMEM. Never holds mu
 * (fault injection takes it briefly). */
static int write_record(disk *d, pgd_hash block, pgd_hash parent, const void *page,
                        const void *bounds, uint64_t seq)
{
    char path[PATH_BYTES], tmp[PATH_BYTES], hex[33];
    uint8_t hdr[PGD_RECORD_HEADER_BYTES];
    uint64_t page_bytes = d->ident.page_bytes, bounds_bytes = d->ident.bounds_bytes;
    void *raw = NULL, *payload = NULL;
    uint8_t *bounce = NULL;
    pgd_record_info info;
    int fd = -1, rc = PGD_EIO, e = 0;
    const char *what = "open";

    memset(&info, 0, sizeof info);
    info.ident = d->ident;
    info.block = block;
    info.parent = parent;
    info.payload_bytes = page_bytes + bounds_bytes;
    info.store_type = d->ident.kv_type;
    info.compression = PGD_RECORD_RAW;
    info.raw_bytes = info.payload_bytes;

    /* The checksum needs the payload in one piece: the page alone when there are no
     * bounds (no copy); else, and always with o_direct, a bounce buffer. */
    if (d->o_direct || bounds_bytes) {
        bounce = alloc_aligned(&d->al, (size_t)d->file_bytes, &raw);
        if (!bounce) return PGD_ENOMEM;
        memcpy(bounce + PGD_RECORD_HEADER_BYTES, page, (size_t)page_bytes);
        if (bounds_bytes)
            memcpy(bounce + PGD_RECORD_HEADER_BYTES + page_bytes, bounds, (size_t)bounds_bytes);
        memset(bounce + d->rec_bytes, 0, (size_t)(d->file_bytes - d->rec_bytes));
        payload = bounce + PGD_RECORD_HEADER_BYTES;
    } else {
        payload = (void *)page;
    }
    if (pgd_record_write_header(&info, payload, hdr) != PGD_OK) {
        pgd__free(&d->al, raw);
        return PGD_EINVAL;
    }

    pgd_hash_hex(block, hex);
    snprintf(path, sizeof path, "%s/records/%.2s/%s.rec", d->dir, hex, hex);
    snprintf(tmp, sizeof tmp, "%s/records/%.2s/%s.tmp.%" PRIu64, d->dir, hex, hex, seq);
    int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | (d->o_direct ? O_DIRECT : 0);
    fd = open(tmp, flags, 0600);
    if (fd < 0 && errno == ENOENT) {
        /* The first record of its subdirectory (or records/ was removed behind us). */
        char top[PATH_BYTES], sub[PATH_BYTES];
        snprintf(top, sizeof top, "%s/records", d->dir);
        (void)mkdir(top, 0700);
        snprintf(sub, sizeof sub, "%s/records/%.2s", d->dir, hex);
        if (mkdir(sub, 0700) == 0) {
            if (d->fsync_each) (void)fsync_dir(top); /* the new directory's entry */
            fd = open(tmp, flags, 0600);
        } else if (errno == EEXIST) {
            fd = open(tmp, flags, 0600);
        }
    }
    if (fd < 0) {
        e = errno;
        goto fail;
    }

    what = "write";
    pthread_mutex_lock(&d->mu);
    if (d->fault_count) {
        if (d->fault_after) {
            d->fault_after--;
        } else {
            e = d->fault_err;
            if (d->fault_count != UINT64_MAX) d->fault_count--;
        }
    }
    pthread_mutex_unlock(&d->mu);
    if (e) goto fail;

    if (bounce) {
        memcpy(bounce, hdr, sizeof hdr);
        if (write_full(fd, bounce, (size_t)d->file_bytes) != 0) {
            e = errno;
            goto fail;
        }
    } else {
        struct iovec iov[2] = {{hdr, sizeof hdr}, {(void *)page, (size_t)page_bytes}};
        size_t want = sizeof hdr + (size_t)page_bytes;
        ssize_t w = pwritev(fd, iov, 2, 0);
        if (w < 0) {
            e = errno;
            goto fail;
        }
        if ((size_t)w < want) {
            /* A short write: finish it plainly (rare: a signal, a nearly full disk). */
            size_t done = (size_t)w;
            if (done < sizeof hdr) {
                if (write_full(fd, hdr + done, sizeof hdr - done) != 0) {
                    e = errno;
                    goto fail;
                }
                done = sizeof hdr;
            }
            if (write_full(fd, (const uint8_t *)page + (done - sizeof hdr), want - done) != 0) {
                e = errno;
                goto fail;
            }
        }
    }
    if (d->fsync_each && fsync(fd) != 0) {
        e = errno;
        what = "fsync";
        goto fail;
    }
    if (close(fd) != 0) {
        fd = -1;
        e = errno;
        what = "close";
        goto fail;
    }
    fd = -1;
    if (rename(tmp, path) != 0) {
        e = errno;
        what = "rename";
        goto fail;
    }
    if (d->fsync_each) {
        char sub[PATH_BYTES];
        snprintf(sub, sizeof sub, "%s/records/%.2s", d->dir, hex);
        if (fsync_dir(sub) != 0) {
            /* The record is complete and visible; only its durability is in doubt. */
            pgd__logf(&d->lg, PGD_LOG_WARN, "disk tier %s: fsync of %s: %s", d->dir, sub,
                      strerror(errno));
        }
    }
    pgd__free(&d->al, raw);
    return PGD_OK;

fail:
    if (fd >= 0) close(fd);
    unlink(tmp);
    pgd__free(&d->al, raw);
    rc = write_status(e);
    if (rc == PGD_EIO)
        pgd__logf(&d->lg, PGD_LOG_ERROR, "disk tier %s: %s of %s: %s", d->dir, what, tmp,
                  e ? strerror(e) : "short write");
    return rc;
}

/* Reads and verifies block's record into page / bounds. Returns PGD_OK, PGD_ENOTFOUND (no
 * such file), PGD_ECORRUPT (damaged: size, header, name or checksum), PGD_EINVAL (a valid
 * record of another identity) or PGD_EIO (a read error; logged) or PGD_ENOMEM. On error
 * page and bounds hold garbage. mu not held. */
static int read_record(disk *d, pgd_hash block, const char *path, void *page, void *bounds)
{
    uint8_t hdr[PGD_RECORD_HEADER_BYTES];
    uint64_t page_bytes = d->ident.page_bytes, bounds_bytes = d->ident.bounds_bytes;
    void *raw = NULL;
    uint8_t *bounce = NULL;
    struct stat sb;
    pgd_record_info info;
    int rc = PGD_ECORRUPT;

    int fd = open(path, O_RDONLY | O_CLOEXEC | (d->o_direct ? O_DIRECT : 0));
    if (fd < 0) {
        if (errno == ENOENT) return PGD_ENOTFOUND;
        pgd__logf(&d->lg, PGD_LOG_ERROR, "disk tier %s: open %s: %s", d->dir, path,
                  strerror(errno));
        return PGD_EIO;
    }
    if (fstat(fd, &sb) != 0) goto io;
    if ((uint64_t)sb.st_size != d->rec_bytes &&
        (uint64_t)sb.st_size != round_up(d->rec_bytes, DIRECT_ALIGN))
        goto out; /* damaged: a size the record cannot have */
    if (d->o_direct) {
        bounce = alloc_aligned(&d->al, (size_t)d->file_bytes, &raw);
        if (!bounce) {
            rc = PGD_ENOMEM;
            goto out;
        }
        size_t want = (size_t)round_up((uint64_t)sb.st_size, DIRECT_ALIGN);
        if (want > d->file_bytes) want = (size_t)d->file_bytes;
        ssize_t r = pread(fd, bounce, want, 0);
        if (r < 0) goto io;
        if ((uint64_t)r < d->rec_bytes) goto out;
        memcpy(hdr, bounce, sizeof hdr);
    } else {
        struct iovec iov[3] = {
            {hdr, sizeof hdr}, {page, (size_t)page_bytes}, {bounds, (size_t)bounds_bytes}};
        ssize_t r = preadv(fd, iov, bounds_bytes ? 3 : 2, 0);
        if (r < 0) goto io;
        if ((uint64_t)r < d->rec_bytes) {
            /* A short read of a file of the right size: finish it plainly. */
            uint64_t done = (uint64_t)r;
            while (done < d->rec_bytes) {
                uint8_t *dst;
                uint64_t left;
                if (done < sizeof hdr) {
                    dst = hdr + done;
                    left = sizeof hdr - done;
                } else if (done < sizeof hdr + page_bytes) {
                    dst = (uint8_t *)page + (done - sizeof hdr);
                    left = sizeof hdr + page_bytes - done;
                } else {
                    dst = (uint8_t *)bounds + (done - sizeof hdr - page_bytes);
                    left = d->rec_bytes - done;
                }
                if (read_full(fd, dst, (size_t)left, (off_t)done) != 0) {
                    if (errno) goto io;
                    goto out;
                }
                done += left;
            }
        }
    }
    rc = pgd_record_read_header(hdr, NULL, 0, &d->ident, &info);
    if (rc == PGD_EINVAL) goto out; /* foreign */
    rc = PGD_ECORRUPT;
    if (pgd_record_read_header(hdr, NULL, 0, NULL, &info) != PGD_OK) goto out;
    if (!pgd_hash_eq(info.block, block) || info.compression != PGD_RECORD_RAW ||
        info.store_type != d->ident.kv_type || info.payload_bytes != page_bytes + bounds_bytes)
        goto out;
    if (bounce) {
        /* Out of the bounce buffer, verified on the way. */
        rc = pgd__record_copy_verified(hdr, bounce + sizeof hdr, page, page_bytes, bounds,
                                       bounds_bytes);
        goto out;
    }
    const void *parts[2] = {page, bounds};
    const uint64_t part_bytes[2] = {page_bytes, bounds_bytes};
    if (pgd__record_checksum(hdr, parts, part_bytes, 2) != pgd__record_stored_checksum(hdr))
        goto out;
    rc = PGD_OK;
    goto out;
io:
    pgd__logf(&d->lg, PGD_LOG_ERROR, "disk tier %s: read %s: %s", d->dir, path, strerror(errno));
    rc = PGD_EIO;
out:
    close(fd);
    pgd__free(&d->al, raw);
    return rc;
}

/* ---- capacity (mu held) ---- */

/* Drops the LRU leaf record: out of the index, file unlinked. With spill, the file is
 * opened first (an unlinked file stays readable), and its payload read, verified and
 * handed to spill with mu released. Returns 1 when a record was dropped, 0 when none. */
static int evict_one(disk *d, pgd_tier_spill_fn spill, void *spill_ud)
{
    char path[PATH_BYTES];
    uint32_t v = d->map ? pgd__tmap_victim(d->map) : PGD__NONE;
    if (v == PGD__NONE) return 0;
    const pgd__tmap_slot *sl = pgd__tmap_slot_get(d->map, v);
    pgd_hash block = sl->hash, parent = sl->parent;
    m_remove(d, v);
    rec_path(d, block, path);
    d->st.n_evictions++;
    d->freed_since_full = 1;
    if (!spill) {
        unlink(path);
        return 1;
    }
    size_t n = (size_t)(d->ident.page_bytes + d->ident.bounds_bytes);
    uint8_t *buf = pgd__malloc(&d->al, n ? n : 1);
    /* Nothing else writes this block's file while it is pending. */
    if (!buf || pending_add(d, block) != PGD_OK) {
        pgd__free(&d->al, buf);
        unlink(path);
        return 1;
    }
    pthread_mutex_unlock(&d->mu);
    int rc = read_record(d, block, path, buf, buf + d->ident.page_bytes);
    unlink(path);
    if (rc == PGD_OK)
        spill(spill_ud, block, parent, buf,
              d->ident.bounds_bytes ? buf + d->ident.page_bytes : NULL);
    pthread_mutex_lock(&d->mu);
    if (rc == PGD_ECORRUPT) d->st.n_corrupt++; /* not spilled: never data */
    pending_del(d, block);
    pgd__free(&d->al, buf);
    return 1;
}

/* ---- ops ---- */

static int disk_put(void *state, pgd_hash block, pgd_hash parent, const void *page,
                    const void *bounds, pgd_tier_spill_fn spill, void *spill_ud)
{
    disk *d = state;
    uint64_t t0 = pgd__tier_now_ns();
    int rc;

    pthread_mutex_lock(&d->mu);
    if (!d->bound || !page || (d->ident.bounds_bytes && !bounds) || pgd_hash_eq(block, parent)) {
        pthread_mutex_unlock(&d->mu);
        return PGD_EINVAL;
    }
    for (;;) {
        uint32_t slot = m_find(d, block);
        if (slot != PGD__NONE || pending_has(d, block)) {
            if (slot != PGD__NONE) pgd__tmap_touch(d->map, slot);
            pthread_mutex_unlock(&d->mu);
            return PGD_OK;
        }
        if ((d->st.full && !d->freed_since_full) || d->file_bytes > d->capacity_bytes) {
            d->st.n_put_refused++;
            pthread_mutex_unlock(&d->mu);
            return PGD_ENOSPC;
        }
        if (d->used_bytes + d->reserved_bytes + d->file_bytes <= d->capacity_bytes &&
            m_count(d) + d->n_pending < d->max_slots)
            break;
        /* Evicting may release mu (spill): look at the block again after it. */
        if (!evict_one(d, spill, spill_ud)) {
            d->st.n_put_refused++;
            pthread_mutex_unlock(&d->mu);
            return PGD_ENOSPC;
        }
    }
    rc = pending_add(d, block);
    if (rc != PGD_OK) {
        pthread_mutex_unlock(&d->mu);
        return rc;
    }
    d->reserved_bytes += d->file_bytes;
    uint64_t seq = ++d->tmp_seq;
    pthread_mutex_unlock(&d->mu);

    rc = write_record(d, block, parent, page, bounds, seq);

    pthread_mutex_lock(&d->mu);
    d->reserved_bytes -= d->file_bytes;
    pending_del(d, block);
    if (rc == PGD_OK) {
        rc = m_insert(d, block, parent, d->file_bytes);
        if (rc != PGD_OK) {
            /* The index is full (puts raced for the last slots) or out of memory: the
             * record cannot be found again, so its file goes. */
            char path[PATH_BYTES];
            rec_path(d, block, path);
            unlink(path);
            if (rc == PGD_ENOSPC) d->st.n_put_refused++;
        } else {
            d->st.n_puts++;
            d->st.n_put_bytes += d->ident.page_bytes + d->ident.bounds_bytes;
            pgd__tier_lat_add(d->st.put_hist, &d->st.put_ns_sum, pgd__tier_now_ns() - t0);
            if (d->st.full) {
                d->st.full = 0;
                pgd__logf(&d->lg, PGD_LOG_INFO, "disk tier %s: writes resumed", d->dir);
            }
        }
    } else if (rc == PGD_ENOSPC) {
        if (!d->st.full)
            pgd__logf(&d->lg, PGD_LOG_WARN,
                      "disk tier %s: filesystem full: writes stop, reads go on (%" PRIu64
                      " records held)",
                      d->dir, m_count(d));
        d->st.full = 1;
        d->freed_since_full = 0;
        d->st.n_put_refused++;
    } else if (rc == PGD_EIO) {
        d->st.n_io_errors++;
    }
    pthread_mutex_unlock(&d->mu);
    return rc;
}

static int disk_get(void *state, pgd_hash block, void *page, void *bounds)
{
    disk *d = state;
    char path[PATH_BYTES];
    uint64_t t0 = pgd__tier_now_ns();

    pthread_mutex_lock(&d->mu);
    if (!d->bound || !page || (d->ident.bounds_bytes && !bounds)) {
        pthread_mutex_unlock(&d->mu);
        return PGD_EINVAL;
    }
    uint32_t slot = m_find(d, block);
    if (slot == PGD__NONE) {
        d->st.n_get_misses++;
        pthread_mutex_unlock(&d->mu);
        return PGD_ENOTFOUND;
    }
    pgd__tmap_touch(d->map, slot);
    pthread_mutex_unlock(&d->mu);

    rec_path(d, block, path);
    int rc = read_record(d, block, path, page, bounds);

    pthread_mutex_lock(&d->mu);
    slot = m_find(d, block);
    switch (rc) {
    case PGD_OK:
        d->st.n_gets++;
        d->st.n_get_bytes += d->ident.page_bytes + d->ident.bounds_bytes;
        pgd__tier_lat_add(d->st.get_hist, &d->st.get_ns_sum, pgd__tier_now_ns() - t0);
        break;
    case PGD_ENOTFOUND: /* evicted meanwhile, or removed behind the tier's back */
        if (slot != PGD__NONE) m_remove(d, slot);
        d->st.n_get_misses++;
        break;
    case PGD_ECORRUPT:
    case PGD_EINVAL:
        /* Never data: a damaged record goes to quarantine, a foreign one (which the scan
         * would have left alone) stays where it is; both leave the index. */
        d->st.n_get_misses++;
        if (slot != PGD__NONE) {
            m_remove(d, slot);
            d->freed_since_full = 1;
            if (rc == PGD_ECORRUPT) {
                d->st.n_corrupt++;
                quarantine(d, path);
                pgd__logf(&d->lg, PGD_LOG_WARN,
                          "disk tier %s: damaged record %s moved to quarantine/", d->dir,
                          path + strlen(d->dir) + 1);
            } else {
                d->st.n_foreign++;
            }
        }
        rc = PGD_ENOTFOUND;
        break;
    case PGD_EIO:
        d->st.n_io_errors++;
        break;
    default:
        break;
    }
    pthread_mutex_unlock(&d->mu);
    return rc;
}

static size_t disk_lookup(void *state, const pgd_hash *hashes, size_t n)
{
    disk *d = state;
    size_t i = 0;
    pthread_mutex_lock(&d->mu);
    if (d->bound)
        while (i < n && m_find(d, hashes[i]) != PGD__NONE)
            i++;
    pthread_mutex_unlock(&d->mu);
    return i;
}

static int disk_del(void *state, pgd_hash block)
{
    disk *d = state;
    char path[PATH_BYTES];
    int rc = PGD_ENOTFOUND;
    pthread_mutex_lock(&d->mu);
    uint32_t slot = m_find(d, block);
    if (slot != PGD__NONE) {
        m_remove(d, slot);
        rec_path(d, block, path);
        unlink(path);
        d->freed_since_full = 1;
        rc = PGD_OK;
    }
    pthread_mutex_unlock(&d->mu);
    return rc;
}

static void disk_stats(void *state, pgd_tier_stats *out)
{
    disk *d = state;
    pthread_mutex_lock(&d->mu);
    *out = d->st;
    out->bytes_used = d->used_bytes;
    out->n_records = m_count(d);
    out->bytes_capacity = d->capacity_bytes;
    pthread_mutex_unlock(&d->mu);
}

static int disk_flush(void *state)
{
    disk *d = state;
    if (d->fsync_each) return PGD_OK; /* every record was fsync'ed before its rename */
    int fd = open(d->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || syncfs(fd) != 0) {
        pgd__logf(&d->lg, PGD_LOG_ERROR, "disk tier %s: syncfs: %s", d->dir, strerror(errno));
        if (fd >= 0) close(fd);
        return PGD_EIO;
    }
    close(fd);
    return PGD_OK;
}

static void disk_close(void *state)
{
    disk *d = state;
    if (!d) return;
    pgd__tmap_destroy(d->map);
    pgd__free(&d->al, d->slot_bytes);
    pgd__free(&d->al, d->pending);
    if (d->lock_fd >= 0) close(d->lock_fd); /* releases the flock */
    if (d->mu_ok) pthread_mutex_destroy(&d->mu);
    pgd__alloc al = d->al;
    pgd__free(&al, d);
}

/* ---- bind: the scan ---- */

typedef struct scan_rec {
    pgd_hash block, parent;
    uint64_t bytes;
    int64_t mtime_ns;
} scan_rec;

static int cmp_mtime(const void *a, const void *b)
{
    const scan_rec *x = a, *y = b;
    return (x->mtime_ns > y->mtime_ns) - (x->mtime_ns < y->mtime_ns);
}

/* What one .rec file is: SCAN_OK (*r filled), SCAN_FOREIGN, SCAN_DAMAGED, SCAN_GONE (not
 * a regular file, or vanished). Reads the header only. */
enum { SCAN_OK, SCAN_FOREIGN, SCAN_DAMAGED, SCAN_GONE };

static int scan_one(const disk *d, const char *path, const char *name, scan_rec *r)
{
    uint8_t hdr[PGD_RECORD_HEADER_BYTES];
    pgd_record_info info;
    struct stat sb;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return SCAN_GONE;
    int kind = SCAN_DAMAGED;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        kind = SCAN_GONE;
        goto out;
    }
    if (read_full(fd, hdr, sizeof hdr, 0) != 0) goto out;
    if (pgd_record_read_header(hdr, NULL, 0, NULL, &info) != PGD_OK) goto out;
    hash_parse(name, &r->block);
    if (!pgd_hash_eq(info.block, r->block) || pgd_hash_eq(info.parent, info.block)) goto out;
    uint64_t exact = PGD_RECORD_HEADER_BYTES + info.payload_bytes;
    if ((uint64_t)sb.st_size != exact && (uint64_t)sb.st_size != round_up(exact, DIRECT_ALIGN))
        goto out;
    if (!pgd_record_ident_eq(&info.ident, &d->ident) || info.compression != PGD_RECORD_RAW ||
        info.store_type != d->ident.kv_type) {
        kind = SCAN_FOREIGN; /* another identity, or a form this tier does not serve */
        goto out;
    }
    r->parent = info.parent;
    r->bytes = (uint64_t)sb.st_size;
    r->mtime_ns = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
    kind = SCAN_OK;
out:
    close(fd);
    return kind;
}

/* Writes DIR/ident, the identity bound (for pgd_tier_disk_inspect). Best effort. */
static void write_ident(const disk *d)
{
    char path[PATH_BYTES], tmp[PATH_BYTES], hex[33], text[512];
    const pgd_record_ident *id = &d->ident;
    pgd_hash_hex(id->model_fingerprint, hex);
    int n = snprintf(text, sizeof text,
                     "pagoda disk tier identity 1\nfingerprint %s\nkv_type %" PRIu32
                     "\nn_layers %" PRIu32 "\nn_kv_heads %" PRIu32 "\nhead_dim %" PRIu32
                     "\npage_tokens %" PRIu32 "\nflags %" PRIu32 "\nrotate_seed %" PRIu64 "\n",
                     hex, id->kv_type, id->n_layers, id->n_kv_heads, id->head_dim, id->page_tokens,
                     id->flags, id->rotate_seed);
    snprintf(path, sizeof path, "%s/ident", d->dir);
    snprintf(tmp, sizeof tmp, "%s/ident.tmp", d->dir);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return;
    int ok = write_full(fd, text, (size_t)n) == 0;
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) unlink(tmp);
}

static int disk_bind(void *state, const pgd_record_ident *ident)
{
    disk *d = state;
    char path[PATH_BYTES];
    scan_rec *recs = NULL;
    size_t n_recs = 0, cap_recs = 0;
    uint64_t n_temp = 0, n_foreign = 0, n_damaged = 0;
    int rc = PGD_OK;

    if (!ident) return PGD_EINVAL;
    pthread_mutex_lock(&d->mu);
    if (d->bound) {
        rc = pgd_record_ident_eq(&d->ident, ident) ? PGD_OK : PGD_EBUSY;
        pthread_mutex_unlock(&d->mu);
        return rc;
    }
    d->ident = *ident;
    d->rec_bytes = PGD_RECORD_HEADER_BYTES + ident->page_bytes + ident->bounds_bytes;
    d->file_bytes = d->o_direct ? round_up(d->rec_bytes, DIRECT_ALIGN) : d->rec_bytes;
    /* The map grows by doubling up to what the capacity holds (a 100 GiB tier of small
     * pages would otherwise reserve ~80 bytes per possible record up front). */
    uint64_t slots = d->capacity_bytes / d->rec_bytes;
    d->max_slots = (uint32_t)(slots > (1u << 30) ? (1u << 30) : slots ? slots : 1);
    if (m_resize(d, d->max_slots < 64 ? d->max_slots : 64) != PGD_OK) {
        rc = PGD_ENOMEM;
        goto done;
    }

    snprintf(path, sizeof path, "%s/records", d->dir);
    if (mkdir(path, 0700) != 0 && errno != EEXIST) {
        pgd__logf(&d->lg, PGD_LOG_ERROR, "disk tier %s: cannot create %s: %s", d->dir, path,
                  strerror(errno));
        rc = PGD_EIO;
        goto done;
    }
    DIR *top = opendir(path);
    if (!top) {
        pgd__logf(&d->lg, PGD_LOG_ERROR, "disk tier %s: cannot read %s: %s", d->dir, path,
                  strerror(errno));
        rc = PGD_EIO;
        goto done;
    }
    for (struct dirent *te = readdir(top); te; te = readdir(top)) {
        char sub[PATH_BYTES];
        if (strlen(te->d_name) != 2 || !is_hex(te->d_name, 2)) continue;
        snprintf(sub, sizeof sub, "%s/records/%s", d->dir, te->d_name);
        DIR *sd = opendir(sub);
        if (!sd) continue;
        for (struct dirent *e = readdir(sd); e; e = readdir(sd)) {
            char f[PATH_BYTES + 256];
            snprintf(f, sizeof f, "%s/%s", sub, e->d_name);
            if (is_temp_name(e->d_name)) {
                if (unlink(f) == 0) n_temp++;
                continue;
            }
            if (!is_record_name(e->d_name) || strncmp(e->d_name, te->d_name, 2) != 0) continue;
            if (n_recs == cap_recs) {
                size_t cap = cap_recs ? 2 * cap_recs : 256;
                scan_rec *p = pgd__realloc(&d->al, recs, cap * sizeof *p);
                if (!p) {
                    rc = PGD_ENOMEM;
                    break;
                }
                recs = p;
                cap_recs = cap;
            }
            switch (scan_one(d, f, e->d_name, &recs[n_recs])) {
            case SCAN_OK:
                n_recs++;
                break;
            case SCAN_FOREIGN:
                n_foreign++;
                break;
            case SCAN_DAMAGED:
                n_damaged++;
                quarantine(d, f);
                break;
            default:
                break;
            }
        }
        closedir(sd);
        if (rc != PGD_OK) break;
    }
    closedir(top);
    if (rc != PGD_OK) goto done;

    /* Oldest first, so the least recently written records are the first evicted. */
    if (n_recs) qsort(recs, n_recs, sizeof *recs, cmp_mtime);
    uint64_t n_over = 0;
    for (size_t i = 0; i < n_recs && rc == PGD_OK; i++) {
        rc = m_insert(d, recs[i].block, recs[i].parent, recs[i].bytes);
        if (rc == PGD_ENOSPC) { /* more records than the capacity holds */
            n_over++;
            if (evict_one(d, NULL, NULL)) {
                rc = m_insert(d, recs[i].block, recs[i].parent, recs[i].bytes);
            } else { /* nothing evictable (a cycle of parents): this one goes */
                rec_path(d, recs[i].block, path);
                unlink(path);
                rc = PGD_OK;
            }
        }
    }
    if (rc != PGD_OK) goto done;
    d->st.n_foreign += n_foreign;
    d->st.n_corrupt += n_damaged;
    while (d->used_bytes > d->capacity_bytes && evict_one(d, NULL, NULL))
        n_over++;
    d->bound = 1;
    write_ident(d);
    pgd__logf(&d->lg, PGD_LOG_INFO,
              "disk tier %s: %" PRIu64 " records (%" PRIu64 " bytes); %" PRIu64
              " of another model or geometry ignored, %" PRIu64
              " damaged moved to quarantine/, %" PRIu64 " temp files removed, %" PRIu64
              " evicted over capacity",
              d->dir, m_count(d), d->used_bytes, n_foreign, n_damaged, n_temp, n_over);
done:
    if (rc != PGD_OK) {
        /* Unbound again: a later bind scans afresh (nothing on disk was lost). */
        pgd__tmap_destroy(d->map);
        pgd__free(&d->al, d->slot_bytes);
        d->map = NULL;
        d->slot_bytes = NULL;
        d->used_bytes = 0;
    }
    pthread_mutex_unlock(&d->mu);
    pgd__free(&d->al, recs);
    return rc;
}

/* Retention lives in the map only: a restart forgets it (the records come back with the
 * default priority, no expiry and no pin; the cache sets it again on their next use). */
static int disk_retain(void *state, pgd_hash block, const pgd_tier_retention *r)
{
    disk *d = state;
    int rc = PGD_ENOTFOUND;
    if (!r) return PGD_EINVAL;
    pthread_mutex_lock(&d->mu);
    uint32_t slot = m_find(d, block);
    if (slot != PGD__NONE) rc = pgd__tmap_retain(d->map, slot, r, d->slot_bytes[slot]);
    pthread_mutex_unlock(&d->mu);
    return rc;
}

static const pgd_tier_ops disk_ops = {
    "disk",     disk_bind,  disk_put,   disk_get, disk_lookup, disk_del,
    disk_stats, disk_flush, disk_close, NULL,     disk_retain,
};

/* ---- create: the directory, its lock and its key ---- */

/* Takes DIR/LOCK. Returns PGD_OK (*fd_out holds it), PGD_EBUSY (logged, with the holder's
 * pid when the file names one) or PGD_EIO (logged). */
static int take_lock(const char *dir, const pgd__log *lg, int *fd_out)
{
    char path[PATH_BYTES], pid[32];
    snprintf(path, sizeof path, "%s/LOCK", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        pgd__logf(lg, PGD_LOG_ERROR, "disk tier %s: cannot open %s: %s", dir, path,
                  strerror(errno));
        return PGD_EIO;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        ssize_t n = e == EWOULDBLOCK ? pread(fd, pid, sizeof pid - 1, 0) : -1;
        pid[n > 0 ? n : 0] = '\0';
        pid[strcspn(pid, "\n")] = '\0';
        close(fd);
        if (e != EWOULDBLOCK) {
            pgd__logf(lg, PGD_LOG_ERROR, "disk tier %s: flock %s: %s", dir, path, strerror(e));
            return PGD_EIO;
        }
        pgd__logf(lg, PGD_LOG_ERROR,
                  "disk tier %s: in use by another process%s%s%s (%s is locked): refusing to "
                  "share it",
                  dir, pid[0] ? " (pid " : "", pid, pid[0] ? ")" : "", path);
        return PGD_EBUSY;
    }
    int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) == 0) (void)!pwrite(fd, pid, (size_t)n, 0);
    *fd_out = fd;
    return PGD_OK;
}

/* Reads DIR/key, or creates it (32 random bytes, 0600, written to a temp file and renamed
 * so that a crash never leaves half a key). Returns PGD_OK, PGD_ECORRUPT (a key file that
 * is not 32 bytes: logged; the user decides) or PGD_EIO (logged). */
static int load_key(const char *dir, const pgd__log *lg, uint8_t key[KEY_BYTES])
{
    char path[PATH_BYTES], tmp[PATH_BYTES];
    struct stat sb;
    snprintf(path, sizeof path, "%s/key", dir);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd >= 0) {
        int rc = PGD_OK;
        uint8_t extra;
        if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size != KEY_BYTES ||
            read_full(fd, key, KEY_BYTES, 0) != 0 || pread(fd, &extra, 1, KEY_BYTES) != 0) {
            pgd__logf(lg, PGD_LOG_ERROR,
                      "disk tier %s: %s is not a %d-byte key file: move it away to start "
                      "afresh (the records will not match again)",
                      dir, path, KEY_BYTES);
            rc = PGD_ECORRUPT;
        } else if (sb.st_mode & 077) {
            pgd__logf(lg, PGD_LOG_WARN, "disk tier %s: %s is readable by others (mode %03o)", dir,
                      path, (unsigned)(sb.st_mode & 0777));
        }
        close(fd);
        return rc;
    }
    if (errno != ENOENT) {
        pgd__logf(lg, PGD_LOG_ERROR, "disk tier %s: cannot read %s: %s", dir, path,
                  strerror(errno));
        return PGD_EIO;
    }
    size_t got = 0;
    while (got < KEY_BYTES) {
        ssize_t r = getrandom(key + got, KEY_BYTES - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            pgd__logf(lg, PGD_LOG_ERROR, "disk tier %s: getrandom: %s", dir, strerror(errno));
            return PGD_EIO;
        }
        got += (size_t)r;
    }
    snprintf(tmp, sizeof tmp, "%s/key.tmp", dir);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    int ok = fd >= 0 && write_full(fd, key, KEY_BYTES) == 0 && fsync(fd) == 0;
    if (fd >= 0) ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        pgd__logf(lg, PGD_LOG_ERROR, "disk tier %s: cannot write %s: %s", dir, path,
                  strerror(errno));
        unlink(tmp);
        return PGD_EIO;
    }
    (void)fsync_dir(dir);
    return PGD_OK;
}

/* Creates dir (0700) when absent and checks that it is a directory this process can
 * write. Returns PGD_OK or PGD_EIO (logged: what is wrong with it). */
static int check_dir(const char *dir, const pgd__log *lg)
{
    struct stat sb;
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        pgd__logf(lg, PGD_LOG_ERROR, "disk tier %s: cannot create the directory: %s", dir,
                  strerror(errno));
        return PGD_EIO;
    }
    if (stat(dir, &sb) != 0) {
        pgd__logf(lg, PGD_LOG_ERROR, "disk tier %s: %s", dir, strerror(errno));
        return PGD_EIO;
    }
    if (!S_ISDIR(sb.st_mode)) {
        pgd__logf(lg, PGD_LOG_ERROR, "disk tier %s: not a directory", dir);
        return PGD_EIO;
    }
    if (access(dir, R_OK | W_OK | X_OK) != 0) {
        pgd__logf(lg, PGD_LOG_ERROR, "disk tier %s: not readable and writable: %s", dir,
                  strerror(errno));
        return PGD_EIO;
    }
    return PGD_OK;
}

/* With o_direct: whether the filesystem under dir takes O_DIRECT; logs and returns 0
 * when it does not (tmpfs before Linux 6.6, some FUSE). */
static int probe_direct(const char *dir, const pgd__log *lg)
{
    char path[PATH_BYTES];
    snprintf(path, sizeof path, "%s/direct.probe", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0600);
    if (fd >= 0) {
        close(fd);
        unlink(path);
        return 1;
    }
    pgd__logf(lg, PGD_LOG_WARN, "disk tier %s: O_DIRECT not available (%s): buffered I/O", dir,
              strerror(errno));
    unlink(path);
    return 0;
}

pgd_tier_disk_params pgd_tier_disk_default_params(void)
{
    pgd_tier_disk_params p;
    memset(&p, 0, sizeof p);
    p.capacity_bytes = (uint64_t)10 << 30;
    p.policy = PGD_POLICY_LRU;
    p.pin_share = 0.5;
    return p;
}

int pgd_tier_disk_create(const pgd_tier_disk_params *p, pgd_tier **out)
{
    pgd__alloc al;
    disk *d = NULL;
    int rc = PGD_EINVAL;

    if (!out) return PGD_EINVAL;
    *out = NULL;
    if (!p || !p->dir || !p->dir[0] || strlen(p->dir) > DIR_MAX_BYTES || !p->capacity_bytes)
        return PGD_EINVAL;
    pgd__log lg = {p->log, p->log_ud};
    const pgd_policy_ops *policy = pgd__tier_policy_ops(p->policy, "disk", &lg);
    double share = pgd__tier_pin_share(p->pin_share);
    if (!policy) return PGD_EINVAL;
    if (share < 0) {
        pgd__logf(&lg, PGD_LOG_ERROR, "disk tier: pin_share %g is outside (0, 1]", p->pin_share);
        return PGD_EINVAL;
    }
    pgd__alloc_init(&al, p->alloc);
    d = pgd__calloc(&al, 1, sizeof *d);
    if (!d) return PGD_ENOMEM;
    d->al = al;
    d->lg = lg;
    d->policy = policy;
    d->pin_share = share;
    d->lock_fd = -1;
    snprintf(d->dir, sizeof d->dir, "%s", p->dir);
    d->capacity_bytes = p->capacity_bytes;
    d->fsync_each = p->fsync != 0;
    rc = PGD_ENOMEM;
    if (pthread_mutex_init(&d->mu, NULL) != 0) goto fail;
    d->mu_ok = 1;
    rc = check_dir(d->dir, &d->lg);
    if (rc != PGD_OK) goto fail;
    /* An absolute path, so that a later chdir of the process does not move the tier. */
    char *abs = realpath(p->dir, NULL);
    if (abs && strlen(abs) <= DIR_MAX_BYTES) snprintf(d->dir, sizeof d->dir, "%s", abs);
    free(abs); /* realpath's malloc, not ours */
    rc = take_lock(d->dir, &d->lg, &d->lock_fd);
    if (rc != PGD_OK) goto fail;
    rc = load_key(d->dir, &d->lg, d->key);
    if (rc != PGD_OK) goto fail;
    d->o_direct = p->o_direct ? probe_direct(d->dir, &d->lg) : 0;
    rc = pgd__tier_new(&al, &disk_ops, d, out);
    if (rc != PGD_OK) goto fail;
    return PGD_OK;
fail:
    disk_close(d);
    return rc;
}

int pgd_tier_disk_key(const pgd_tier *t, uint8_t key[32])
{
    const disk *d = t ? pgd__tier_state(t, &disk_ops) : NULL;
    if (!d || !key) return PGD_EINVAL;
    memcpy(key, d->key, KEY_BYTES);
    return PGD_OK;
}

int pgd__tier_disk_set_clock(pgd_tier *t, pgd_clock_fn clock, void *ud)
{
    disk *d = t ? pgd__tier_state(t, &disk_ops) : NULL;
    if (!d) return PGD_EINVAL;
    pthread_mutex_lock(&d->mu);
    d->clock = clock;
    d->clock_ud = ud;
    if (d->map) pgd__tmap_set_clock(d->map, clock, ud);
    pthread_mutex_unlock(&d->mu);
    return PGD_OK;
}

int pgd__tier_disk_fault(pgd_tier *t, int err, uint64_t after, uint64_t count)
{
    disk *d = t ? pgd__tier_state(t, &disk_ops) : NULL;
    if (!d) return PGD_EINVAL;
    pthread_mutex_lock(&d->mu);
    d->fault_err = err;
    d->fault_after = after;
    d->fault_count = err ? count : 0;
    pthread_mutex_unlock(&d->mu);
    return PGD_OK;
}

/* ---- inspect and clear (no tier open: `pagoda tier`) ---- */

/* Reads DIR/ident into *out. Returns 1, or 0 when it is absent or unreadable. */
static int read_ident(const char *dir, pgd_record_ident *out)
{
    char path[PATH_BYTES], text[1024], fp[40];
    pgd_record_ident id;
    snprintf(path, sizeof path, "%s/ident", dir);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return 0;
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n <= 0) return 0;
    text[n] = '\0';
    memset(&id, 0, sizeof id);
    if (sscanf(text,
               "pagoda disk tier identity 1 fingerprint %39s kv_type %" SCNu32 " n_layers %" SCNu32
               " n_kv_heads %" SCNu32 " head_dim %" SCNu32 " page_tokens %" SCNu32 " flags %" SCNu32
               " rotate_seed %" SCNu64,
               fp, &id.kv_type, &id.n_layers, &id.n_kv_heads, &id.head_dim, &id.page_tokens,
               &id.flags, &id.rotate_seed) != 8 ||
        strlen(fp) != 32 || !is_hex(fp, 32))
        return 0;
    hash_parse(fp, &id.model_fingerprint);
    *out = id;
    return 1;
}

/* Non-zero when dir looks like a disk tier's directory (a key or a records/ in it). */
static int is_tier_dir(const char *dir)
{
    char path[PATH_BYTES];
    struct stat sb;
    snprintf(path, sizeof path, "%s/key", dir);
    if (lstat(path, &sb) == 0) return 1;
    snprintf(path, sizeof path, "%s/records", dir);
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* Classifies the record file rel (under dir) for pgd_tier_disk_inspect, reading it whole. */
static void inspect_record(const pgd__alloc *al, const char *dir, const char *rel, const char *name,
                           const pgd_record_ident *bound, pgd_tier_disk_file *f)
{
    char path[PATH_BYTES];
    struct stat sb;
    uint8_t *buf = NULL;
    pgd_hash block;
    memset(f, 0, sizeof *f);
    f->path = rel;
    f->kind = PGD_TIER_DISK_DAMAGED;
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) goto out;
    f->file_bytes = (uint64_t)sb.st_size;
    if (f->file_bytes < PGD_RECORD_HEADER_BYTES || f->file_bytes > ((uint64_t)1 << 34)) goto out;
    buf = pgd__malloc(al, (size_t)f->file_bytes);
    if (!buf || read_full(fd, buf, (size_t)f->file_bytes, 0) != 0) goto out;
    if (pgd_record_read_header(buf, buf + PGD_RECORD_HEADER_BYTES,
                               f->file_bytes - PGD_RECORD_HEADER_BYTES, NULL, &f->info) != PGD_OK)
        goto out;
    hash_parse(name, &block);
    uint64_t exact = PGD_RECORD_HEADER_BYTES + f->info.payload_bytes;
    if (!pgd_hash_eq(block, f->info.block) ||
        (f->file_bytes != exact && f->file_bytes != round_up(exact, DIRECT_ALIGN)))
        goto out;
    f->has_info = 1;
    f->kind = bound && !pgd_record_ident_eq(bound, &f->info.ident) ? PGD_TIER_DISK_FOREIGN
                                                                   : PGD_TIER_DISK_OK;
out:
    close(fd);
    pgd__free(al, buf);
}

int pgd_tier_disk_inspect(const char *dir, pgd_tier_disk_visit_fn visit, void *ud,
                          pgd_record_ident *bound)
{
    char path[PATH_BYTES], rel[600];
    pgd_record_ident id;
    pgd__alloc al;
    pgd_tier_disk_file f;
    struct stat sb;

    if (!dir || !visit || strlen(dir) > DIR_MAX_BYTES) return PGD_EINVAL;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode) || access(dir, R_OK | X_OK) != 0)
        return PGD_EIO;
    if (!is_tier_dir(dir)) return PGD_ENOTFOUND;
    pgd__alloc_init(&al, NULL);
    int has_bound = read_ident(dir, &id);
    if (has_bound && bound) *bound = id;

    snprintf(path, sizeof path, "%s/records", dir);
    DIR *top = opendir(path);
    for (struct dirent *te = top ? readdir(top) : NULL; te; te = readdir(top)) {
        char sub[PATH_BYTES];
        if (strlen(te->d_name) != 2 || !is_hex(te->d_name, 2)) continue;
        snprintf(sub, sizeof sub, "%s/records/%s", dir, te->d_name);
        DIR *sd = opendir(sub);
        if (!sd) continue;
        for (struct dirent *e = readdir(sd); e; e = readdir(sd)) {
            if (is_temp_name(e->d_name)) {
                memset(&f, 0, sizeof f);
                snprintf(rel, sizeof rel, "records/%s/%s", te->d_name, e->d_name);
                f.path = rel;
                f.kind = PGD_TIER_DISK_TEMP;
                visit(ud, &f);
            } else if (is_record_name(e->d_name)) {
                snprintf(rel, sizeof rel, "records/%s/%s", te->d_name, e->d_name);
                inspect_record(&al, dir, rel, e->d_name, has_bound ? &id : NULL, &f);
                visit(ud, &f);
            }
        }
        closedir(sd);
    }
    if (top) closedir(top);

    snprintf(path, sizeof path, "%s/quarantine", dir);
    DIR *qd = opendir(path);
    for (struct dirent *e = qd ? readdir(qd) : NULL; e; e = readdir(qd)) {
        char fpath[PATH_BYTES + 64];
        if (!is_record_name(e->d_name)) continue;
        memset(&f, 0, sizeof f);
        snprintf(rel, sizeof rel, "quarantine/%s", e->d_name);
        snprintf(fpath, sizeof fpath, "%s/%s", dir, rel);
        if (stat(fpath, &sb) == 0) f.file_bytes = (uint64_t)sb.st_size;
        f.path = rel;
        f.kind = PGD_TIER_DISK_QUARANTINED;
        visit(ud, &f);
    }
    if (qd) closedir(qd);
    return has_bound;
}

/* Unlinks path when it exists; counts it. Returns 0, or -1 (errno) on another failure. */
static int remove_file(const char *path, uint64_t *n)
{
    if (unlink(path) == 0) {
        (*n)++;
        return 0;
    }
    return errno == ENOENT ? 0 : -1;
}

int pgd_tier_disk_clear(const char *dir, pgd_log_fn log, void *log_ud, uint64_t *n_removed)
{
    char path[PATH_BYTES];
    pgd__log lg = {log, log_ud};
    uint64_t n = 0;
    int fd = -1, rc = PGD_OK;
    struct stat sb;

    if (n_removed) *n_removed = 0;
    if (!dir || strlen(dir) > DIR_MAX_BYTES) return PGD_EINVAL;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        pgd__logf(&lg, PGD_LOG_ERROR, "disk tier %s: not a directory", dir);
        return PGD_EIO;
    }
    if (!is_tier_dir(dir)) {
        pgd__logf(&lg, PGD_LOG_ERROR, "%s: not a disk tier directory (no key, no records/)", dir);
        return PGD_ENOTFOUND;
    }
    rc = take_lock(dir, &lg, &fd);
    if (rc != PGD_OK) return rc;

    snprintf(path, sizeof path, "%s/records", dir);
    DIR *top = opendir(path);
    for (struct dirent *te = top ? readdir(top) : NULL; te; te = readdir(top)) {
        char sub[PATH_BYTES];
        if (strlen(te->d_name) != 2 || !is_hex(te->d_name, 2)) continue;
        snprintf(sub, sizeof sub, "%s/records/%s", dir, te->d_name);
        DIR *sd = opendir(sub);
        if (!sd) continue;
        for (struct dirent *e = readdir(sd); e; e = readdir(sd)) {
            char f[PATH_BYTES + 256];
            if (!is_record_name(e->d_name) && !is_temp_name(e->d_name)) continue;
            snprintf(f, sizeof f, "%s/%s", sub, e->d_name);
            if (remove_file(f, &n) != 0) {
                pgd__logf(&lg, PGD_LOG_ERROR, "disk tier %s: cannot remove %s: %s", dir, f,
                          strerror(errno));
                rc = PGD_EIO;
            }
        }
        closedir(sd);
        (void)rmdir(sub); /* fails, harmlessly, when a file it does not know is left */
    }
    if (top) closedir(top);
    (void)rmdir(path);

    snprintf(path, sizeof path, "%s/quarantine", dir);
    DIR *qd = opendir(path);
    for (struct dirent *e = qd ? readdir(qd) : NULL; e; e = readdir(qd)) {
        char f[PATH_BYTES + 256];
        if (!is_record_name(e->d_name)) continue;
        snprintf(f, sizeof f, "%s/%s", path, e->d_name);
        if (remove_file(f, &n) != 0) {
            pgd__logf(&lg, PGD_LOG_ERROR, "disk tier %s: cannot remove %s: %s", dir, f,
                      strerror(errno));
            rc = PGD_EIO;
        }
    }
    if (qd) closedir(qd);
    (void)rmdir(path);

    static const char *const extra[] = {"ident", "ident.tmp", "key.tmp", "direct.probe"};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, extra[i]);
        if (remove_file(path, &n) != 0) rc = PGD_EIO;
    }
    close(fd);
    if (n_removed) *n_removed = n;
    return rc;
}
