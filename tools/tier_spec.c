/* SPDX-License-Identifier: MIT */
/*
 * tier_spec.c - --tier and --hash-key-file for the engine commands (see tier_spec.h):
 * parses the specs, creates the tiers in the order given, reads or fetches the hash key,
 * and prints the --help block that run, eval and serve share.
 *
 * Grammar (fields separated by ':', so a disk PATH may not contain one):
 *   ram:SIZE[:q8_0|q4_0][:lz4|zstd][:policy=NAME]                    options in any order,
 *   disk:PATH:SIZE[:fsync][:direct][:write-through[=N]][:policy=NAME] each once
 * policy=NAME: the tier's eviction order (lru, s3fifo, arc, cost, priority; default lru;
 * belady is refused: a tier has no future to look at). A Redis tier takes no policy=:
 * Redis's own maxmemory-policy orders it.
 * SIZE is cli_parse_size's: digits with an optional K, M, G or T suffix (powers of 1024).
 *   redis://... | unix://...   a URL (any spec with "://"): the library's grammar
 *                              (pgd_tier_redis_parse_url), whose query string may also hold
 *                              the CLI's write-back and write-through[=N], taken out here
 * The query string starts at the first '?', as for the library (a '?', '/' or '@' in a
 * password is percent-encoded: %3F, %2F, %40). The password (between the userinfo's ':'
 * and the last '@' before the query; the whole userinfo without a ':') and the value of
 * a password= option are shown as "***" in every message, the library's included.
 */
#include "tier_spec.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#ifdef PGD_HAVE_REDIS
#include <pagoda/tier_redis.h>
#endif

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

/* A policy=NAME field (a starts with "policy="). Returns 0 or -1 (printed). */
static int parse_policy(const char *cmd, cli_tier_spec *o, const char *a, int *have)
{
    char opt[CLI_TIER_PATH_MAX + 96];
    pgd_policy_kind k;
    if ((*have)++) return bad(cmd, o, "option given twice", a);
    snprintf(opt, sizeof opt, "--tier '%s': policy=", o->text);
    if (cli_parse_policy(cmd, opt, a + 7, 0, &k)) return -1;
    o->policy = (int)k;
    return 0;
}

static int parse_ram(const char *cmd, cli_tier_spec *o, char **f, int n)
{
    int have_type = 0, have_comp = 0, have_policy = 0;
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
        } else if (!strncmp(a, "policy=", 7)) {
            if (parse_policy(cmd, o, a, &have_policy)) return -1;
        } else {
            return bad(cmd, o, "unknown RAM tier option (q8_0, q4_0, lz4, zstd or policy=NAME)", a);
        }
    }
    return 0;
}

static int parse_disk(const char *cmd, cli_tier_spec *o, char **f, int n)
{
    int have_fsync = 0, have_direct = 0, have_wt = 0, have_policy = 0;
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
        } else if (!strncmp(a, "policy=", 7)) {
            if (parse_policy(cmd, o, a, &have_policy)) return -1;
        } else {
            return bad(cmd, o,
                       "unknown disk tier option (fsync, direct, write-through, "
                       "write-through=N or policy=NAME)",
                       a);
        }
    }
    return 0;
}

/* Where the query string of URL u starts (its first '?', or the terminating NUL). */
static const char *url_query(const char *u)
{
    const char *q = strchr(u, '?');
    return q ? q : u + strlen(u);
}

/* The secrets of a URL: spans of spec never shown (the userinfo's password, or the whole
 * userinfo when it has no ':'; the value of each password= option). */
typedef struct secrets {
    const char *at[8];
    size_t len[8];
    int n;
} secrets;

static void add_secret(secrets *sc, const char *at, size_t len)
{
    if (len && sc->n < 8) {
        sc->at[sc->n] = at;
        sc->len[sc->n++] = len;
    }
}

static void find_secrets(const char *spec, secrets *sc)
{
    const char *a = strstr(spec, "://");
    const char *q = url_query(spec);
    const char *at = NULL, *colon = NULL;
    sc->n = 0;
    if (!a) return;
    for (const char *p = a + 3; p < q; p++)
        if (*p == '@') at = p;
    if (at) {
        for (const char *p = a + 3; p < at && !colon; p++)
            if (*p == ':') colon = p;
        if (colon)
            add_secret(sc, colon + 1, (size_t)(at - colon - 1));
        else
            add_secret(sc, a + 3, (size_t)(at - a - 3));
    }
    for (const char *p = *q ? q + 1 : q; *p;) {
        const char *e = strchr(p, '&');
        if (!e) e = p + strlen(p);
        if (!strncmp(p, "password=", 9) && p + 9 < e) add_secret(sc, p + 9, (size_t)(e - p - 9));
        p = *e ? e + 1 : e;
    }
}

/* Copies spec into text (cap bytes) with each secret as "***". */
static void redact(const char *spec, const secrets *sc, char *text, size_t cap)
{
    size_t len = 0;
    const char *p = spec;
    text[0] = '\0';
    for (int i = 0; i < sc->n && len < cap; i++) { /* spans in spec's order */
        len += (size_t)snprintf(text + len, cap - len, "%.*s***", (int)(sc->at[i] - p), p);
        p = sc->at[i] + sc->len[i];
    }
    if (len < cap) snprintf(text + len, cap - len, "%s", p);
}

static int bad_redis(const char *cmd, const cli_tier_spec *o, const char *why)
{
    fprintf(stderr, "%s: --tier '%s': %s\n", cmd, o->text, why);
    return -1;
}

#ifdef PGD_HAVE_REDIS
/* Replaces each secret of sc that occurs in msg (cap bytes) with "***", in place. */
static void scrub(char *msg, size_t cap, const secrets *sc)
{
    for (int i = 0; i < sc->n; i++) {
        char secret[CLI_TIER_PATH_MAX], *hit, *from = msg;
        snprintf(secret, sizeof secret, "%.*s", (int)sc->len[i], sc->at[i]);
        for (hit = strstr(from, secret); hit; hit = strstr(from, secret)) {
            char rest[512];
            snprintf(rest, sizeof rest, "%s", hit + sc->len[i]);
            snprintf(hit, cap - (size_t)(hit - msg), "***%s", rest);
            from = hit + 3 < msg + cap ? hit + 3 : msg + cap - 1;
        }
    }
}

/* The library's message about url (err, cap bytes) without url's secrets, or fallback. */
static const char *lib_err(const char *url, char *err, size_t cap, const char *fallback)
{
    secrets sc;
    find_secrets(url, &sc);
    scrub(err, cap, &sc);
    return err[0] ? err : fallback;
}
#endif

/* A Redis spec (a URL): takes the CLI's options out of the query string into o, keeps the
 * rest for the library in o->url, and checks it with pgd_tier_redis_parse_url. */
static int parse_redis(const char *cmd, cli_tier_spec *o, const char *spec)
{
    int have_wb = 0, have_wt = 0;
    const char *q = url_query(spec);
    size_t base = (size_t)(q - spec);
    char query[CLI_TIER_PATH_MAX];

#ifndef PGD_HAVE_REDIS
    if (strncmp(spec, "redis://", 8) && strncmp(spec, "unix://", 7)) {
        char scheme[32];
        snprintf(scheme, sizeof scheme, "%.*s", (int)(strstr(spec, "://") - spec), spec);
        return bad(cmd, o, "unknown tier kind (ram or disk)", scheme);
    }
    return bad_redis(cmd, o, "this pagoda was built without the Redis tier (PGD_WITH_REDIS=OFF)");
#endif
    o->kind = CLI_TIER_REDIS;
    o->write_through = 1; /* a committed page is shared with the other instances at once */
    if (strlen(spec) >= sizeof o->url) return bad_redis(cmd, o, "the URL is too long");
    memcpy(o->url, spec, base);
    o->url[base] = '\0';
    snprintf(query, sizeof query, "%s", *q ? q + 1 : "");
    size_t len = base;
    int kept = 0;
    for (char *opt = query, *next; opt; opt = next) {
        next = strchr(opt, '&');
        if (next) *next++ = '\0';
        if (!strcmp(opt, "write-back")) {
            if (have_wb++) return bad(cmd, o, "option given twice", opt);
            o->write_through = 0;
        } else if (!strncmp(opt, "policy=", 7)) {
            return bad_redis(cmd, o,
                             "policy= is for the ram and disk tiers: a Redis tier's eviction "
                             "order is Redis's own maxmemory-policy (e.g. allkeys-lru, "
                             "volatile-lru: pinned blocks are kept, their keys have no TTL)");
        } else if (!strncmp(opt, "write-back=", 11)) {
            return bad(cmd, o, "write-back takes no value; the option is", opt);
        } else if (!strcmp(opt, "write-through") || !strncmp(opt, "write-through=", 14)) {
            if (have_wt++) return bad(cmd, o, "option given twice", opt);
            if (opt[13] != '\0') { /* write-through=N */
                char what[CLI_TIER_PATH_MAX + 96];
                uint64_t v;
                snprintf(what, sizeof what, "--tier '%s': write-through=N", o->text);
                if (cli_parse_u64(cmd, what, opt + 14, 0, UINT32_MAX, &v)) return -1;
                o->admit_hits = (uint32_t)v;
            }
        } else if (opt[0]) { /* the library's */
            len += (size_t)snprintf(o->url + len, sizeof o->url - len, "%c%s", kept++ ? '&' : '?',
                                    opt);
        }
    }
    if (have_wb && have_wt)
        return bad_redis(cmd, o,
                         "write-back and write-through exclude each other (the default is "
                         "write-through)");
#ifdef PGD_HAVE_REDIS
    pgd_tier_redis_params p = pgd_tier_redis_default_params();
    char buf[2 * CLI_TIER_PATH_MAX + 64], err[256];
    err[0] = '\0';
    if (pgd_tier_redis_parse_url(o->url, &p, buf, sizeof buf, err, sizeof err) != PGD_OK)
        return bad_redis(cmd, o, lib_err(o->url, err, sizeof err, "not a Redis URL"));
    o->events = p.events_stream && p.events_stream[0];
#endif
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
    out->policy = PGD_POLICY_LRU;
    secrets sc;
    find_secrets(spec, &sc);
    redact(spec, &sc, out->text, sizeof out->text);
    if (strlen(spec) >= sizeof buf) return bad(cmd, out, "the spec is too long", "");
    if (strstr(spec, "://")) return parse_redis(cmd, out, spec);
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
    return bad(cmd, out, "unknown tier kind (ram, disk, redis:// or unix://)", f[0]);
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

/* Creates the Redis tier of sp with t's key (read already). Returns 0 or -1 (printed: the
 * library's reason, host:port and Redis's own message). */
static int open_redis(const char *cmd, const cli_tier_spec *sp, const cli_tiers *t, pgd_log_fn log,
                      void *log_ud, pgd_tier **out)
{
#ifdef PGD_HAVE_REDIS
    pgd_tier_redis_params p = pgd_tier_redis_default_params();
    char err[512];
    err[0] = '\0';
    p.url = sp->url;
    p.key = t->key;
    p.key_len = t->key_len;
    p.log = log;
    p.log_ud = log_ud;
    int rc = pgd_tier_redis_create(&p, out, err, sizeof err);
    if (rc == PGD_OK) return 0;
    fprintf(stderr, "%s: --tier '%s': %s\n", cmd, sp->text,
            lib_err(sp->url, err, sizeof err, pgd_strerror(rc)));
    return -1;
#else
    (void)t, (void)log, (void)log_ud, (void)out; /* refused by the parser already */
    fprintf(stderr, "%s: --tier '%s': this pagoda was built without the Redis tier\n", cmd,
            sp->text);
    return -1;
#endif
}

static int open_one(const char *cmd, const cli_tier_spec *sp, const cli_tiers *t, pgd_log_fn log,
                    void *log_ud, pgd_tier **out)
{
    int rc;
    if (sp->kind == CLI_TIER_REDIS) return open_redis(cmd, sp, t, log, log_ud, out);
    if (sp->kind == CLI_TIER_RAM) {
        pgd_tier_ram_params p = pgd_tier_ram_default_params();
        p.capacity_bytes = sp->capacity_bytes;
        p.store_type = sp->store_type;
        p.compression = sp->compression;
        p.policy = sp->policy;
        p.log = log;
        p.log_ud = log_ud;
        rc = pgd_tier_ram_create(&p, out);
    } else {
        pgd_tier_disk_params p = pgd_tier_disk_default_params();
        p.dir = sp->path;
        p.capacity_bytes = sp->capacity_bytes;
        p.fsync = sp->fsync;
        p.o_direct = sp->o_direct;
        p.policy = sp->policy;
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
    for (uint32_t i = 0; i < t->n && !t->key_file; i++)
        if (t->specs[i].kind == CLI_TIER_REDIS) {
            fprintf(stderr,
                    "%s: --tier '%s': a Redis tier needs --hash-key-file (the key that the "
                    "instances share: it authenticates their records and pins the block-hash "
                    "key)\n",
                    cmd, t->specs[i].text);
            return -1;
        }
    if (t->key_file) {
        if (read_key(cmd, t)) return -1;
        have_key = 1;
    }
    for (uint32_t i = 0; i < t->n; i++) {
        const cli_tier_spec *sp = &t->specs[i];
        if (open_one(cmd, sp, t, log, log_ud, &t->tiers[i])) {
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
#ifdef PGD_HAVE_REDIS
    for (uint32_t i = 0; i < t->n; i++)
        if (t->specs[i].kind == CLI_TIER_REDIS && t->specs[i].events && t->tiers[i]) {
            cp->on_register = pgd_tier_redis_on_register;
            cp->on_evict = pgd_tier_redis_on_evict;
            cp->event_ud = t->tiers[i];
            break;
        }
#endif
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
          "        ram:SIZE[:q8_0|q4_0][:lz4|zstd][:policy=NAME]\n"
          "                          host memory. Records keep the pool's codec (lossless)\n"
          "                          unless re-encoded to q8_0 or q4_0 (lossy: your choice);\n"
          "                          lz4 or zstd compress them (lossless)\n"
          "        disk:PATH:SIZE[:fsync][:direct][:write-through[=N]][:policy=NAME]\n"
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
          "                          policy=NAME: the tier's eviction order: lru (default),\n"
          "                          s3fifo, arc, cost or priority (as --policy; every one\n"
          "                          evicts a chain from its end, and a record's retention\n"
          "                          counts: expired ones go first, pinned ones stay)\n"
          "        redis://[user:password@]host:port[,host:port...][/db][?options]\n"
          "        unix:///path/to/redis.sock[?options]\n"
          "                          Redis or Redis Cluster (detected; the seeds are tried in\n"
          "                          turn), shared by every instance with the same model and\n"
          "                          --hash-key-file, which it requires: the key signs each\n"
          "                          record (a MAC; a forged one is a miss, deleted).\n"
          "                          Put it after the local tiers (or alone). Options, joined\n"
          "                          by '&': ns=PREFIX (pgd), ttl=SECONDS (86400; 0: none),\n"
          "                          timeout_ms=N (200), connect_timeout_ms=N (500),\n"
          "                          deadline_ms=N (20) and deadline_page_ms=N (5): a\n"
          "                          promotion's gets wait N + N per page at most, then the\n"
          "                          request computes; conns=N per node (4), cluster=0|1|auto,\n"
          "                          queue=SIZE of unwritten puts (64M), mac=gmac|hmac (the\n"
          "                          records' MAC: AES-256-GMAC, or HMAC-SHA256, ~9x the\n"
          "                          CPU; every instance the same), db=N, user=NAME,\n"
          "                          password=P (percent-encoded, as in the URL), and the\n"
          "                          CLI's own: write-through (the default: a committed page\n"
          "                          is shared at once, by the tier's writer thread),\n"
          "                          write-through=N (after N matches) or write-back (shared\n"
          "                          only when the pool evicts it). KV events for routers:\n"
          "                          events=STREAM XADDs BlockStored / BlockRemoved /\n"
          "                          AllBlocksCleared of the pool and of Redis to that stream\n"
          "                          (events_maxlen=N, 100000), tagged instance=ID (default\n"
          "                          hostname:pid).\n"
          "                          Its eviction order is Redis's maxmemory-policy (no\n"
          "                          policy=): a pinned block's key loses its TTL (PERSIST),\n"
          "                          which volatile-* policies never evict.\n"
          "                          While Redis is down requests compute; it reconnects.\n"
          "                          e.g. redis://:secret@10.0.0.5:6379/0?events=pgd-events\n"
          "      --hash-key-file F   the block-hash key: the bytes of F (1 to 256); default:\n"
          "                          the first disk tier's stable key (in its directory, mode\n"
          "                          0600), so a restart matches what an earlier run stored.\n"
          "                          Required with a Redis tier: give every instance the same\n"
          "                          file (it is also the records' MAC key)\n",
          out);
}
