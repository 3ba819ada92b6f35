/* SPDX-License-Identifier: MIT */
/*
 * fuzz_redis_url.c - fuzz target for the Redis tier's URL parser (src/tier/redis/
 * redis_url.c, pgd__redis_url_parse behind pgd_tier_redis_parse_url): what a user types
 * after --tier, so anything at all.
 *
 * Properties: the parser returns PGD_OK or PGD_EINVAL and never crashes or reads past the
 * string; PGD_EINVAL always comes with a message that starts "redis url: " and leaves the
 * params unchanged; the buffer the header promises (2x strlen + 64) is always enough (the
 * error is never "the buffer is too small"); an accepted URL names 1..16 seeds with ports
 * in 1..65535 (0 for a unix socket, whose path is absolute), its strings lie in the buffer
 * and are NUL-terminated, its namespace has no braces; parsing the same URL again gives
 * the same result. Built as a libFuzzer target with -DPGD_FUZZ=ON (clang), and always as a
 * corpus replayer (replay_main.c) that ctest runs over corpus/redis_url/.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tier/redis/redis_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { MAX_URL = 4096 };

/* Aborts unless s is NULL, the default, or a NUL-terminated string inside buf[0..cap). */
static void check_str(const char *s, const char *deflt, const char *buf, size_t cap)
{
    if (!s || s == deflt) return;
    if (s < buf || s >= buf + cap) abort();
    if (!memchr(s, '\0', (size_t)(buf + cap - s))) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > MAX_URL) return 0;
    char *url = malloc(size + 1);
    if (!url) return 0;
    memcpy(url, data, size);
    url[size] = '\0';
    size_t cap = 2 * strlen(url) + 64;
    char *buf = malloc(cap), *buf2 = malloc(cap);
    char err[256], err2[256];
    pgd_tier_redis_params p = pgd_tier_redis_default_params(), before = p, p2 = p;
    pgd__redis_url u, u2;
    if (!buf || !buf2) abort();
    memset(&u, 0, sizeof u);
    int rc = pgd__redis_url_parse(url, &p, &u, buf, cap, err, sizeof err);
    if (rc != PGD_OK && rc != PGD_EINVAL) abort();
    if (rc == PGD_EINVAL) {
        if (strncmp(err, "redis url: ", 11) != 0) abort();
        if (strstr(err, "buffer is too small")) abort();
        if (p.ns != before.ns || p.ttl_s != before.ttl_s || p.conns != before.conns ||
            p.cluster != before.cluster || p.put_queue_bytes != before.put_queue_bytes ||
            p.events_stream != before.events_stream || p.instance_id != before.instance_id ||
            p.command_timeout_ms != before.command_timeout_ms)
            abort();
    } else {
        if (u.n_seeds < 1 || u.n_seeds > PGD__REDIS_MAX_SEEDS) abort();
        for (size_t i = 0; i < u.n_seeds; i++) {
            const pgd__rc_addr *a = &u.seeds[i];
            if (!memchr(a->host, '\0', sizeof a->host) || !a->host[0]) abort();
            if (a->port < 0 || a->port > 65535) abort();
            if (a->port == 0 && (a->host[0] != '/' || u.n_seeds != 1)) abort();
        }
        check_str(p.ns, before.ns, buf, cap);
        check_str(p.events_stream, NULL, buf, cap);
        check_str(p.instance_id, NULL, buf, cap);
        check_str(u.user, NULL, buf, cap);
        check_str(u.password, NULL, buf, cap);
        if (!p.ns || strchr(p.ns, '{') || strchr(p.ns, '}')) abort();
        if (p.conns < 1 || p.command_timeout_ms < 1 || p.connect_timeout_ms < 1) abort();
        if (u.user && !u.password) abort();
    }
    /* Deterministic: the same URL, the same answer. */
    int rc2 = pgd__redis_url_parse(url, &p2, &u2, buf2, cap, err2, sizeof err2);
    if (rc2 != rc) abort();
    if (rc == PGD_EINVAL && strcmp(err, err2) != 0) abort();
    if (rc == PGD_OK && (u2.n_seeds != u.n_seeds || u2.db != u.db || p2.ttl_s != p.ttl_s)) abort();
    /* The public call agrees, and takes a zero-length error buffer. */
    pgd_tier_redis_params p3 = pgd_tier_redis_default_params();
    if (pgd_tier_redis_parse_url(url, &p3, buf2, cap, NULL, 0) != rc) abort();
    free(buf);
    free(buf2);
    free(url);
    return 0;
}
