/* SPDX-License-Identifier: MIT */
/*
 * tier_spec.c - --tier and --hash-key-file for the engine commands (see tier_spec.h):
 * parses the specs, creates the tiers in the order given, reads or fetches the hash key,
 * and prints the --help block that run, eval and serve share.
 *
 * Grammar (fields separated by ':', so a disk PATH may not contain one):
 *   ram:SIZE[:q8_0|q4_0][:lz4|zstd]                      options in any order, each once
 *   disk:PATH:SIZE[:fsync][:direct][:write-through[=N]]  likewise
 * SIZE is cli_parse_size's: digits with an optional K, M, G or T suffix (powers of 1024).
 */
#include "tier_spec.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* ---- parsing ---- */

/* Splits s at ':' into at most max fields (pointers into buf, a copy of s). Returns the
 * number of fields, or -1 when there are more than max. */
static int split(const char *s, char *buf, size_t cap, char **fields, int max)
{
    int n = 0;
    snprintf(buf, cap, "%s", s);
    char *p = buf;
    for (;;) {
        if (n == max) return -1;
        fields[n++] = p;
        char *c = strchr(p, ':');
        if (!c) break;
        *c = '\0';
        p = c + 1;
    }
    return n;
}

static int bad(const char *cmd, const cli_tier_spec *o, const char *what, const char *part)
{
    fprintf(stderr, "%s: --tier '%s': %s '%s'\n", cmd, o->text, what, part);
    return -1;
}

/* Parses the SIZE field. Returns 0 or -1 (printed). */
static int parse_size(const char *cmd, cli_tier_spec *o, const char *s)
{
    char opt[CLI_TIER_PATH_MAX + 96];
    snprintf(opt, sizeof opt, "--tier '%s': size", o->text);
    if (cli_parse_size(cmd, opt, s, 0, UINT64_MAX, &o->capacity_bytes)) return -1;
    if (!o->capacity_bytes) return bad(cmd, o, "a tier holds at least one byte; the size is", s);
    return 0;
}

static int parse_ram(const char *cmd, cli_tier_spec *o, char **f, int n)
{
    int have_type = 0, have_comp = 0;
    if (n < 2 || !f[1][0]) return bad(cmd, o, "a RAM tier needs a size: ram:SIZE, got", o->text);
    if (parse_size(cmd, o, f[1])) return -1;
    for (int i = 2; i < n; i++) {
        const char *a = f[i];
        if (!strcmp(a, "q8_0") || !strcmp(a, "q4_0")) {
            if (have_type++) return bad(cmd, o, "a second re-encoding type", a);
            o->store_type = !strcmp(a, "q8_0") ? PGD_KV_Q8_0 : PGD_KV_Q4_0;
        } else if (!strcmp(a, "lz4") || !strcmp(a, "zstd")) {
            if (have_comp++) return bad(cmd, o, "a second compression", a);
            o->compression = !strcmp(a, "lz4") ? PGD_RECORD_LZ4 : PGD_RECORD_ZSTD;
        } else {
            return bad(cmd, o, "unknown RAM tier option (q8_0, q4_0, lz4 or zstd)", a);
        }
    }
    return 0;
}

static int parse_disk(const char *cmd, cli_tier_spec *o, char **f, int n)
{
    int have_fsync = 0, have_direct = 0, have_wt = 0;
    if (n < 3)
        return bad(cmd, o, "a disk tier needs a directory and a size: disk:PATH:SIZE, got",
                   o->text);
    if (!f[1][0]) return bad(cmd, o, "the directory is empty in", o->text);
    if (strlen(f[1]) >= sizeof o->path) return bad(cmd, o, "the directory is too long", f[1]);
    snprintf(o->path, sizeof o->path, "%s", f[1]);
    if (!f[2][0]) return bad(cmd, o, "the size is empty in", o->text);
    if (n > 3 && (f[2][0] < '0' || f[2][0] > '9'))
        return bad(cmd, o, "PATH may not contain ':'; the size field is", f[2]);
    if (parse_size(cmd, o, f[2])) return -1;
    for (int i = 3; i < n; i++) {
        const char *a = f[i];
        if (!strcmp(a, "fsync")) {
            if (have_fsync++) return bad(cmd, o, "option given twice", a);
            o->fsync = 1;
        } else if (!strcmp(a, "direct")) {
            if (have_direct++) return bad(cmd, o, "option given twice", a);
            o->o_direct = 1;
        } else if (!strcmp(a, "write-through") || !strncmp(a, "write-through=", 14)) {
            if (have_wt++) return bad(cmd, o, "option given twice", a);
            o->write_through = 1;
            if (a[13] != '\0') { /* write-through=N */
                char opt[CLI_TIER_PATH_MAX + 96];
                uint64_t v;
                snprintf(opt, sizeof opt, "--tier '%s': write-through=N", o->text);
                if (cli_parse_u64(cmd, opt, a + 14, 0, UINT32_MAX, &v)) return -1;
                o->admit_hits = (uint32_t)v;
            }
        } else {
            return bad(cmd, o,
                       "unknown disk tier option (fsync, direct, write-through or "
                       "write-through=N)",
                       a);
        }
    }
    return 0;
}

int cli_tier_spec_parse(const char *cmd, const char *spec, cli_tier_spec *out)
{
    char buf[CLI_TIER_PATH_MAX + 128];
    char *f[8];
    int n;

    memset(out, 0, sizeof *out);
    out->store_type = -1;
    out->compression = PGD_RECORD_RAW;
    snprintf(out->text, sizeof out->text, "%s", spec);
    if (strlen(spec) >= sizeof buf) return bad(cmd, out, "the spec is too long", "");
    n = split(spec, buf, sizeof buf, f, (int)(sizeof f / sizeof f[0]));
    if (n < 0) return bad(cmd, out, "too many ':' fields in", spec);
    if (!strcmp(f[0], "ram")) {
        out->kind = CLI_TIER_RAM;
        return parse_ram(cmd, out, f, n);
    }
    if (!strcmp(f[0], "disk")) {
        out->kind = CLI_TIER_DISK;
        return parse_disk(cmd, out, f, n);
    }
    return bad(cmd, out, "unknown tier kind (ram or disk)", f[0]);
}

int cli_tier_option(const char *cmd, int opt, const char *arg, cli_tiers *t)
{
    switch (opt) {
    case CLI_OPT_TIER:
        if (t->n >= PGD_MAX_TIERS) {
            fprintf(stderr, "%s: --tier '%s': at most %d tiers\n", cmd, arg, PGD_MAX_TIERS);
            return -1;
        }
        if (cli_tier_spec_parse(cmd, arg, &t->specs[t->n])) return -1;
        t->n++;
        return 1;
    case CLI_OPT_HASH_KEY_FILE:
        if (t->key_file) {
            fprintf(stderr, "%s: --hash-key-file: given twice\n", cmd);
            return -1;
        }
        if (!arg[0]) {
            fprintf(stderr, "%s: --hash-key-file: the file name is empty\n", cmd);
            return -1;
        }
        t->key_file = arg;
        return 1;
    default:
        return 0;
    }
}

/* ---- opening ---- */

/* Reads the key file into t->key. Returns 0 or -1 (printed). */
static int read_key(const char *cmd, cli_tiers *t)
{
    FILE *f = fopen(t->key_file, "rb");
    uint8_t extra;
    if (!f) {
        fprintf(stderr, "%s: --hash-key-file: cannot open %s: %s\n", cmd, t->key_file,
                strerror(errno));
        return -1;
    }
    size_t n = fread(t->key, 1, sizeof t->key, f);
    int more = n == sizeof t->key && fread(&extra, 1, 1, f) == 1;
    int err = ferror(f);
    fclose(f);
    if (err) {
        fprintf(stderr, "%s: --hash-key-file: cannot read %s\n", cmd, t->key_file);
        return -1;
    }
    if (n == 0 || more) {
        fprintf(stderr, "%s: --hash-key-file: %s holds %s bytes; a key is 1 to %d bytes\n", cmd,
                t->key_file, more ? "more than 256" : "no", CLI_HASH_KEY_MAX);
        return -1;
    }
    t->key_len = n;
    return 0;
}

static int open_one(const char *cmd, const cli_tier_spec *sp, pgd_log_fn log, void *log_ud,
                    pgd_tier **out)
{
    int rc;
    if (sp->kind == CLI_TIER_RAM) {
        pgd_tier_ram_params p = pgd_tier_ram_default_params();
        p.capacity_bytes = sp->capacity_bytes;
        p.store_type = sp->store_type;
        p.compression = sp->compression;
        p.log = log;
        p.log_ud = log_ud;
        rc = pgd_tier_ram_create(&p, out);
    } else {
        pgd_tier_disk_params p = pgd_tier_disk_default_params();
        p.dir = sp->path;
        p.capacity_bytes = sp->capacity_bytes;
        p.fsync = sp->fsync;
        p.o_direct = sp->o_direct;
        p.log = log;
        p.log_ud = log_ud;
        rc = pgd_tier_disk_create(&p, out);
    }
    if (rc == PGD_OK) return 0;
    switch (rc) {
    case PGD_EBUSY:
        fprintf(stderr,
                "%s: --tier '%s': %s is in use by another process (its lock file is held); "
                "one directory serves one process at a time\n",
                cmd, sp->text, sp->path);
        break;
    case PGD_EIO:
        fprintf(stderr,
                "%s: --tier '%s': cannot use the directory %s (not readable or not "
                "writable)\n",
                cmd, sp->text, sp->path);
        break;
    default:
        fprintf(stderr, "%s: --tier '%s': %s\n", cmd, sp->text, pgd_strerror(rc));
        break;
    }
    return -1;
}

int cli_tiers_open(const char *cmd, cli_tiers *t, pgd_log_fn log, void *log_ud)
{
    int have_key = 0;
    if (t->key_file) {
        if (read_key(cmd, t)) return -1;
        have_key = 1;
    }
    for (uint32_t i = 0; i < t->n; i++) {
        const cli_tier_spec *sp = &t->specs[i];
        if (open_one(cmd, sp, log, log_ud, &t->tiers[i])) {
            cli_tiers_close(t);
            return -1;
        }
        t->use[i].tier = t->tiers[i];
        t->use[i].write_through = sp->write_through;
        t->use[i].admit_hits = sp->admit_hits;
        if (!have_key && sp->kind == CLI_TIER_DISK) {
            if (pgd_tier_disk_key(t->tiers[i], t->key) != PGD_OK) {
                fprintf(stderr, "%s: --tier '%s': cannot read the directory's hash key\n", cmd,
                        sp->text);
                cli_tiers_close(t);
                return -1;
            }
            t->key_len = 32;
            have_key = 1;
        }
    }
    return 0;
}

void cli_tiers_apply(const cli_tiers *t, pe_ctx_params *cp)
{
    if (t->n) {
        cp->tiers = t->use;
        cp->n_tiers = t->n;
    }
    if (t->key_len) {
        cp->hash_key = t->key;
        cp->hash_key_len = t->key_len;
    }
}

void cli_tiers_close(cli_tiers *t)
{
    for (uint32_t i = 0; i < PGD_MAX_TIERS; i++) {
        pgd_tier_close(t->tiers[i]);
        t->tiers[i] = NULL;
        t->use[i].tier = NULL;
    }
    memset(t->key, 0, sizeof t->key);
    t->key_len = 0;
}

int cli_cache_write_back(pgd_cache *c)
{
    int rc = pgd_cache_flush(c);
    while (rc == PGD_OK && pgd_cache_evict(c, 64) > 0)
        rc = pgd_cache_flush(c);
    return rc;
}

/* ---- help ---- */

void cli_tier_help(FILE *out)
{
    fputs("      --tier SPEC         a storage tier below the KV pool; repeat it for a\n"
          "                          hierarchy, fastest first (pool -> 1st -> 2nd), at most 8:\n"
          "        ram:SIZE[:q8_0|q4_0][:lz4|zstd]\n"
          "                          host memory. Records keep the pool's codec (lossless)\n"
          "                          unless re-encoded to q8_0 or q4_0 (lossy: your choice);\n"
          "                          lz4 or zstd compress them (lossless)\n"
          "        disk:PATH:SIZE[:fsync][:direct][:write-through[=N]]\n"
          "                          a directory (created 0700, files 0600) that survives\n"
          "                          restarts; PATH may not contain ':'. One process per\n"
          "                          directory: a lock file refuses a second one\n"
          "                          SIZE: bytes the tier may hold, digits with an optional\n"
          "                          K, M, G or T (powers of 1024): ram:8G,\n"
          "                          disk:/var/cache/pagoda:100G\n"
          "                          Write-back (the default): a page evicted from the pool\n"
          "                          is written to the first tier, and what a tier evicts to\n"
          "                          the next, by background threads, never on the request\n"
          "                          path; a crash loses what only the pool or RAM held.\n"
          "                          write-through: every committed page is written to that\n"
          "                          disk tier at once (=N: only blocks matched N times, to\n"
          "                          spare the SSD), so a crash loses nothing it was given.\n"
          "                          Write-back is the default: what a crash loses is only\n"
          "                          recomputed, never served wrong, while write-through\n"
          "                          writes every one-off prompt to the disk (1.2x to 2.5x\n"
          "                          write-back's records in bench_tier_modes, README\n"
          "                          \"Tiers\"); =2 keeps the reused blocks at about\n"
          "                          write-back's cost.\n"
          "                          fsync policy: without fsync a record is written to a\n"
          "                          temp file and renamed into place, and the OS flushes it\n"
          "                          (all at once at a clean exit): a crash may lose the\n"
          "                          latest records but never serves a wrong one (a record\n"
          "                          that does not verify is a miss). fsync: each record and\n"
          "                          its directory are fsynced before it counts as stored.\n"
          "                          direct: O_DIRECT record I/O\n"
          "      --hash-key-file F   the block-hash key: the bytes of F (1 to 256); default:\n"
          "                          the first disk tier's stable key (in its directory, mode\n"
          "                          0600), so a restart matches what an earlier run stored\n",
          out);
}
