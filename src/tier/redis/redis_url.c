/* SPDX-License-Identifier: MIT */
/*
 * redis_url.c - the Redis tier's URL (tier_redis.h) into params and seeds:
 *
 *   redis://[user:password@ | :password@]host[:port][,host[:port]...][/db][?opts]
 *   unix:///path/to/redis.sock[?db=N&opts]
 *   opts    name=value&...  ns ttl timeout_ms connect_timeout_ms deadline_ms
 *           deadline_page_ms conns cluster events instance events_maxlen queue mac
 *           db user password
 *
 * host is a name, an IPv4 address or a bracketed IPv6 address ("[::1]:6380"); the port
 * defaults to 6379. user, password and option values are percent-decoded ("%40" is '@').
 * Every error names the part that is wrong and quotes it. Strings go into the caller's
 * buffer: each decoded string is at most as long as its text in the URL, so strlen(url)
 * plus a NUL per string is enough (the header promises 2x + 64).
 *
 * Callers: pgd_tier_redis_parse_url and pgd_tier_redis_create (redis.c), fuzz_redis_url.c;
 * pgd_tier_redis_default_params lives here too (pure, like the parser).
 * Pure: no allocation, no I/O.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tier/redis/redis_int.h"

#define DEFAULT_PORT 6379
#define CONNS_MAX 64

/* The caller's buffer, handed out from the front. */
typedef struct store {
    char *buf;
    size_t cap, used;
} store;

static int fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        int n = snprintf(err, errlen, "redis url: ");
        va_list ap;
        va_start(ap, fmt);
        if (n >= 0 && (size_t)n < errlen) vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return PGD_EINVAL;
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Percent-decodes s[0..n) into the store (NUL-terminated). Returns the string, or NULL:
 * *bad is set for a malformed escape ("%4" or "%zz"), else the store is full. A decoded NUL
 * is malformed too (it would cut the string). */
static const char *store_str(store *st, const char *s, size_t n, int *bad)
{
    *bad = 0;
    if (st->cap - st->used < n + 1) return NULL;
    char *out = st->buf + st->used, *o = out;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '%') {
            *o++ = s[i];
            continue;
        }
        int hi = i + 2 < n ? hex_digit(s[i + 1]) : -1;
        int lo = i + 2 < n ? hex_digit(s[i + 2]) : -1;
        if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) {
            *bad = 1;
            return NULL;
        }
        *o++ = (char)(hi << 4 | lo);
        i += 2;
    }
    *o++ = '\0';
    st->used += (size_t)(o - out);
    return out;
}

/* Parses an unsigned decimal s[0..n) within [lo, hi]. Returns 0 or -1. */
static int parse_u64(const char *s, size_t n, uint64_t lo, uint64_t hi, uint64_t *out)
{
    uint64_t v = 0;
    if (n == 0 || n > 20) return -1;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        uint64_t d = (uint64_t)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10) return -1;
        v = v * 10 + d;
    }
    if (v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

/* Bytes with an optional K/M/G suffix (powers of 1024), optionally followed by "B" or
 * "iB": "64M", "1GiB", "4096". */
static int parse_bytes(const char *s, size_t n, uint64_t *out)
{
    size_t d = 0;
    while (d < n && s[d] >= '0' && s[d] <= '9')
        d++;
    uint64_t v, mul = 1;
    if (parse_u64(s, d, 1, UINT64_MAX, &v) != 0) return -1;
    const char *u = s + d;
    size_t un = n - d;
    if (un) {
        switch (*u) {
        case 'k':
        case 'K':
            mul = 1ull << 10;
            break;
        case 'm':
        case 'M':
            mul = 1ull << 20;
            break;
        case 'g':
        case 'G':
            mul = 1ull << 30;
            break;
        default:
            return -1;
        }
        u++;
        un--;
        if (!(un == 0 || (un == 1 && (*u == 'B' || *u == 'b')) ||
              (un == 2 && u[0] == 'i' && (u[1] == 'B' || u[1] == 'b'))))
            return -1;
    }
    if (v > UINT64_MAX / mul) return -1;
    *out = v * mul;
    return 0;
}

/* Parses one seed "host[:port]" or "[v6]:port" of s[0..n) into *a. */
static int parse_seed(const char *s, size_t n, pgd__rc_addr *a, char *err, size_t errlen)
{
    const char *host = s, *port = NULL;
    size_t hn = n, pn = 0;
    if (n && s[0] == '[') {
        const char *close = memchr(s, ']', n);
        if (!close)
            return fail(err, errlen, "host \"%.*s\": no ']' after an IPv6 address", (int)n, s);
        host = s + 1;
        hn = (size_t)(close - s) - 1;
        size_t rest = n - (size_t)(close - s) - 1;
        if (rest) {
            if (close[1] != ':')
                return fail(err, errlen, "host \"%.*s\": ':' expected after ']'", (int)n, s);
            port = close + 2;
            pn = rest - 1;
        }
    } else {
        const char *colon = memchr(s, ':', n);
        if (colon) {
            hn = (size_t)(colon - s);
            port = colon + 1;
            pn = n - hn - 1;
        }
    }
    if (hn == 0) return fail(err, errlen, "empty host in \"%.*s\"", (int)n, s);
    if (hn >= PGD__RC_HOST_MAX)
        return fail(err, errlen, "host \"%.*s...\" is longer than %d bytes", 32, host,
                    PGD__RC_HOST_MAX - 1);
    for (size_t i = 0; i < hn; i++) {
        char c = host[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '-' || c == '_' || (c == ':' && host != s);
        if (!ok) return fail(err, errlen, "bad character in host \"%.*s\"", (int)hn, host);
    }
    uint64_t p = DEFAULT_PORT;
    if (port && parse_u64(port, pn, 1, 65535, &p) != 0)
        return fail(err, errlen, "bad port \"%.*s\" in \"%.*s\" (1..65535)", (int)pn, port, (int)n,
                    s);
    memcpy(a->host, host, hn);
    a->host[hn] = '\0';
    a->port = (int)p;
    return PGD_OK;
}

/* Non-zero when s is a usable namespace: 1..PGD__REDIS_NS_MAX printable bytes without
 * braces (they would change the key's cluster hash tag) or spaces. */
static int ns_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > PGD__REDIS_NS_MAX) return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c <= ' ' || c >= 0x7f || c == '{' || c == '}') return 0;
    }
    return 1;
}

/* Applies option name=value (the value raw: percent-encoded). */
static int apply_option(const char *name, size_t nn, const char *val, size_t vn,
                        pgd_tier_redis_params *p, pgd__redis_url *u, store *st, char *err,
                        size_t errlen)
{
    uint64_t v = 0;
    int bad = 0;
#define IS(s) (nn == sizeof(s) - 1 && memcmp(name, s, nn) == 0)
#define BADVAL(what)                                                                               \
    fail(err, errlen, "option %.*s: bad value \"%.*s\" (%s)", (int)nn, name, (int)vn, val, what)
    if (IS("ttl")) {
        if (parse_u64(val, vn, 0, UINT32_MAX, &v) != 0) return BADVAL("seconds, 0: no expiry");
        p->ttl_s = (uint32_t)v;
    } else if (IS("timeout_ms")) {
        if (parse_u64(val, vn, 1, 3600000, &v) != 0) return BADVAL("1..3600000 ms");
        p->command_timeout_ms = (uint32_t)v;
    } else if (IS("connect_timeout_ms")) {
        if (parse_u64(val, vn, 1, 3600000, &v) != 0) return BADVAL("1..3600000 ms");
        p->connect_timeout_ms = (uint32_t)v;
    } else if (IS("deadline_ms")) {
        if (parse_u64(val, vn, 0, 3600000, &v) != 0) return BADVAL("0..3600000 ms");
        p->deadline_ms = (uint32_t)v;
    } else if (IS("deadline_page_ms")) {
        if (parse_u64(val, vn, 0, 3600000, &v) != 0) return BADVAL("0..3600000 ms");
        p->deadline_page_ms = (uint32_t)v;
    } else if (IS("conns")) {
        if (parse_u64(val, vn, 1, CONNS_MAX, &v) != 0) return BADVAL("1..64");
        p->conns = (uint32_t)v;
    } else if (IS("cluster")) {
        if (vn == 1 && val[0] == '0')
            p->cluster = 0;
        else if (vn == 1 && val[0] == '1')
            p->cluster = 1;
        else if (vn == 4 && memcmp(val, "auto", 4) == 0)
            p->cluster = -1;
        else
            return BADVAL("0, 1 or auto");
    } else if (IS("mac")) {
        if (vn == 4 && memcmp(val, "gmac", 4) == 0)
            p->mac = PGD_TIER_REDIS_MAC_GMAC;
        else if (vn == 4 && memcmp(val, "hmac", 4) == 0)
            p->mac = PGD_TIER_REDIS_MAC_HMAC;
        else
            return BADVAL("gmac or hmac");
    } else if (IS("events_maxlen")) {
        if (parse_u64(val, vn, 1, UINT32_MAX, &v) != 0) return BADVAL("1..4294967295");
        p->events_maxlen = (uint32_t)v;
    } else if (IS("queue")) {
        if (parse_bytes(val, vn, &v) != 0) return BADVAL("bytes, K/M/G suffixes");
        p->put_queue_bytes = v;
    } else if (IS("db")) {
        if (parse_u64(val, vn, 0, 1000000, &v) != 0) return BADVAL("a database number");
        if (u) {
            u->db = (int)v;
            u->db_given = 1;
        }
    } else if (IS("ns") || IS("events") || IS("instance") || IS("user") || IS("password")) {
        const char *s = store_str(st, val, vn, &bad);
        if (!s && bad) return BADVAL("a malformed %-escape");
        if (!s) return fail(err, errlen, "the buffer is too small for the URL's strings");
        if (IS("ns")) {
            if (!ns_ok(s)) return BADVAL("1..64 printable bytes, no braces or spaces");
            p->ns = s;
        } else if (IS("events")) {
            if (!*s) return BADVAL("a stream name");
            p->events_stream = s;
        } else if (IS("instance")) {
            if (!*s) return BADVAL("an instance id");
            p->instance_id = s;
        } else if (u && IS("user")) {
            u->user = *s ? s : NULL;
        } else if (u) {
            u->password = s;
        }
    } else {
        return fail(err, errlen,
                    "unknown option \"%.*s\" (ns, ttl, timeout_ms, connect_timeout_ms, "
                    "deadline_ms, deadline_page_ms, conns, cluster, events, instance, "
                    "events_maxlen, queue, mac, db, user, password)",
                    (int)nn, name);
    }
    return PGD_OK;
#undef IS
#undef BADVAL
}

/* Applies the query string q[0..n) ("a=1&b=2"). */
static int parse_query(const char *q, size_t n, pgd_tier_redis_params *p, pgd__redis_url *u,
                       store *st, char *err, size_t errlen)
{
    size_t i = 0;
    while (i < n) {
        const char *amp = memchr(q + i, '&', n - i);
        size_t end = amp ? (size_t)(amp - q) : n;
        const char *item = q + i;
        size_t in = end - i;
        if (in) {
            const char *eq = memchr(item, '=', in);
            if (!eq)
                return fail(err, errlen, "option \"%.*s\" has no value (name=value)", (int)in,
                            item);
            size_t nn = (size_t)(eq - item);
            if (nn == 0) return fail(err, errlen, "option \"%.*s\" has no name", (int)in, item);
            int rc = apply_option(item, nn, eq + 1, in - nn - 1, p, u, st, err, errlen);
            if (rc != PGD_OK) return rc;
        }
        i = end + 1;
    }
    return PGD_OK;
}

/* redis://: the authority (credentials, seeds) and the path (/db) of s[0..n). */
static int parse_tcp(const char *s, size_t n, pgd__redis_url *u, store *st, char *err,
                     size_t errlen)
{
    const char *slash = memchr(s, '/', n);
    size_t an = slash ? (size_t)(slash - s) : n;
    /* The last '@' ends the credentials: a password may hold a raw '@'. */
    const char *at = NULL;
    for (size_t i = an; i-- > 0;)
        if (s[i] == '@') {
            at = s + i;
            break;
        }
    const char *hosts = s;
    size_t hn = an;
    if (at) {
        size_t cn = (size_t)(at - s);
        const char *colon = memchr(s, ':', cn);
        if (!colon)
            return fail(err, errlen, "credentials \"%.*s@\": user:password@ or :password@ expected",
                        (int)cn, s);
        int bad;
        size_t un = (size_t)(colon - s);
        const char *user = store_str(st, s, un, &bad);
        if (!user && bad)
            return fail(err, errlen, "user: a malformed %%-escape in \"%.*s\"", (int)un, s);
        const char *pw = user ? store_str(st, colon + 1, cn - un - 1, &bad) : NULL;
        if (user && !pw && bad) return fail(err, errlen, "password: a malformed %%-escape");
        if (!pw) return fail(err, errlen, "the buffer is too small for the URL's strings");
        u->user = *user ? user : NULL;
        u->password = *pw ? pw : NULL; /* ":@": no AUTH */
        hosts = at + 1;
        hn = an - cn - 1;
    }
    if (hn == 0) return fail(err, errlen, "no host (redis://host:port)");
    size_t i = 0;
    while (i <= hn) {
        const char *comma = memchr(hosts + i, ',', hn - i);
        size_t end = comma ? (size_t)(comma - hosts) : hn;
        if (end == i)
            return fail(err, errlen, "an empty seed in \"%.*s\" (host:port,host:port)", (int)hn,
                        hosts);
        if (u->n_seeds == PGD__REDIS_MAX_SEEDS)
            return fail(err, errlen, "more than %d seed nodes", PGD__REDIS_MAX_SEEDS);
        int rc = parse_seed(hosts + i, end - i, &u->seeds[u->n_seeds], err, errlen);
        if (rc != PGD_OK) return rc;
        u->n_seeds++;
        i = end + 1;
    }
    if (slash && an + 1 < n) {
        uint64_t db;
        const char *d = slash + 1;
        size_t dn = n - an - 1;
        if (parse_u64(d, dn, 0, 1000000, &db) != 0)
            return fail(err, errlen, "bad db \"/%.*s\" (a database number)", (int)dn, d);
        u->db = (int)db;
        u->db_given = 1;
    }
    return PGD_OK;
}

int pgd__redis_url_parse(const char *url, pgd_tier_redis_params *p, pgd__redis_url *u_out,
                         char *buf, size_t cap, char *err, size_t errlen)
{
    pgd__redis_url u;
    store st = {buf, buf ? cap : 0, 0};
    if (err && errlen) err[0] = '\0';
    if (!url || !p) return fail(err, errlen, "no URL");
    memset(&u, 0, sizeof u);
    pgd_tier_redis_params q = *p; /* applied to *p only when the whole URL parses */
    size_t n = strlen(url);
    const char *query = memchr(url, '?', n);
    size_t body_end = query ? (size_t)(query - url) : n;
    int rc;
    if (strncmp(url, "redis://", 8) == 0) {
        rc = parse_tcp(url + 8, body_end - 8, &u, &st, err, errlen);
    } else if (strncmp(url, "unix://", 7) == 0) {
        const char *path = url + 7;
        size_t pn = body_end - 7;
        if (pn == 0 || path[0] != '/')
            return fail(err, errlen, "unix socket path \"%.*s\" is not absolute (unix:///path)",
                        (int)pn, path);
        if (pn >= PGD__RC_HOST_MAX)
            return fail(err, errlen, "unix socket path is longer than %d bytes",
                        PGD__RC_HOST_MAX - 1);
        memcpy(u.seeds[0].host, path, pn);
        u.seeds[0].host[pn] = '\0';
        u.seeds[0].port = 0;
        u.n_seeds = 1;
        rc = PGD_OK;
    } else if (strncmp(url, "rediss://", 9) == 0) {
        return fail(err, errlen,
                    "scheme \"rediss://\": TLS is not supported (redis:// or unix://)");
    } else {
        const char *colon = strstr(url, "://");
        int sn = colon ? (int)(colon - url) : (int)(n < 16 ? n : 16);
        return fail(err, errlen, "unknown scheme \"%.*s\" (redis://host:port or unix:///path)", sn,
                    url);
    }
    if (rc != PGD_OK) return rc;
    if (query) {
        rc = parse_query(query + 1, n - body_end - 1, &q, &u, &st, err, errlen);
        if (rc != PGD_OK) return rc;
    }
    if (u.n_seeds > 1 && u.db_given && u.db != 0)
        return fail(err, errlen, "db %d with several seed nodes: a cluster has database 0 only",
                    u.db);
    if (q.cluster == 1 && u.db_given && u.db != 0)
        return fail(err, errlen, "db %d with cluster=1: a cluster has database 0 only", u.db);
    if (u.user && !u.password) return fail(err, errlen, "user \"%s\" without a password", u.user);
    if (q.ns && !ns_ok(q.ns))
        return fail(err, errlen, "namespace \"%s\": 1..64 printable bytes, no braces or spaces",
                    q.ns);
    *p = q;
    if (u_out) *u_out = u;
    return PGD_OK;
}

int pgd_tier_redis_parse_url(const char *url, pgd_tier_redis_params *p, char *buf, size_t cap,
                             char *err, size_t errlen)
{
    return pgd__redis_url_parse(url, p, NULL, buf, cap, err, errlen);
}

pgd_tier_redis_params pgd_tier_redis_default_params(void)
{
    pgd_tier_redis_params p;
    memset(&p, 0, sizeof p);
    p.ns = "pgd";
    p.ttl_s = 86400;
    p.connect_timeout_ms = 500;
    p.command_timeout_ms = 200;
    p.deadline_ms = 20;
    p.deadline_page_ms = 5;
    p.conns = 4;
    p.cluster = -1;
    p.put_queue_bytes = 64ull << 20;
    p.events_maxlen = 100000;
    p.mac = PGD_TIER_REDIS_MAC_GMAC;
    return p;
}
