/* SPDX-License-Identifier: MIT */
/*
 * bench_tier_redis.c - what the Redis tier (tier_redis.h) costs and buys, in ratios against
 * baselines measured in the same run (issue 12, "Benchmarks"). Each part talks to a
 * redis-server that the bench starts on an ephemeral 127.0.0.1 port (tests/t_redis.h:
 * --save "" --appendonly no, in a temp dir, stopped at the end and on every exit path), or
 * to --url:
 *
 *  1. Value size against throughput on loopback: SET then pipelined GET (hiredis, --depth
 *     commands in flight, default 16) of values of 4 KiB .. 16 MiB, MiB/s each; with
 *     `redis-benchmark -t get -d SIZE -P 16 -c 1` (one connection, 16 in flight: the same
 *     depth; -d takes up to 1 GiB) as a second baseline when it is installed. Backs the
 *     header's one page record per value: see "FIGURES".
 *  2. The record MACs (libcrypto EVP_MAC over key || record: HMAC-SHA256, the tier's
 *     mac=hmac; GMAC-AES256, its default mac=gmac; Poly1305 for comparison) per MiB and per
 *     record, and their share of a get of one record (pipelined, and one round trip).
 *  3. Promotion throughput: pgd_tier_get_many of N records in batches of 64 (cache.c's
 *     FILL_BATCH: one fill job's call) on --fill-threads threads (default 2, the cache's
 *     fill threads) against raw pipelined GET of the same keys (16 and 64 in flight, one
 *     connection per thread) in the same run, for the record sizes of stories260K and of
 *     the synthetic 1b model's page (f16 KV, 16-token pages: computed from the geometry);
 *     ratio (target >= 0.70), the MAC's share of the tier's time, and the tier's time per
 *     record beside the sum of its serial steps measured alone (fetch, MAC, checksum and
 *     copy).
 *  4. TTFT of an N-token prompt (--tokens, default 8192) on a model (--model; default the
 *     synthetic 1b, made with `pagoda synth-model --shape 1b --type q8_0 --ctx 16384` into
 *     /tmp once and reused) served from Redis: context A on a write-through Redis tier
 *     computes it cold (the baseline) and its pages go to Redis; context B, with a tier
 *     handle of its own (another instance: same URL, key and hash key), matches the
 *     prompt, promotes it from Redis and computes the last page. B's logits must equal
 *     A's own pool hit's bit for bit (lossless records, same computation).
 *
 *   bench_tier_redis [--parts 1,2,3,4] [--url redis://...] [--model M.gguf] [--tokens N]
 *   bench_tier_redis --smoke     tiny sizes, stories260K for part 4 (ctest; 77 without
 *                                redis-server)
 *
 * Two instances sharing Redis under `pagoda serve` are bench/bench_redis_instances.sh.
 *
 * FIGURES on the 2-core development machine (AVX-512, SHA-NI; other builds running, one
 * run each, so +-30%), redis-server 7.0, hiredis 0.14:
 *   1. GET MiB/s, 16 in flight:  4 KiB 814, 16 KiB 1353, 64 KiB 1468, 256 KiB 1955,
 *      1 MiB 2215, 4 MiB 1758, 16 MiB 885 (redis-benchmark: 590, 2170, 1533, 2098, 2695,
 *      1089, 613). The peak is 256 KiB - 1 MiB; above it (likely) hiredis's reader buffer
 *      grows 1 MiB at a time (sds: a copy per realloc), below it per-command costs rule. One page
 * record per value is at the peak for a real model (the 1b shape: 512 KiB); only records under 16
 * KiB (stories260K: 10 KiB) would gain, at most ~2x, from several pages per value.
 *   2. HMAC-SHA256: 730 us/MiB (1.37 GB/s), 0.62 of a pipelined GET + MAC of a 1b record
 *      (365 of 588 us), 0.53 of a lone GET's; GMAC-AES256 85 us/MiB, Poly1305 99 us/MiB.
 *   3. get_many, 2 fill threads: 0.38x (stories260K) and 0.37x (1b) of raw GET (target
 *      0.70); per record the tier took 1209 us of thread time where its steps alone sum to
 *      894 (fetch 495 + MAC 368 + checksum and copy 31): it opened values one after
 *      another once the whole batch was read. With values opened on several threads
 *      (i12/tier 6950e28): 0.42x and 0.32x (1 fill thread: 0.41x, 0.26x), the same on 2
 *      cores, where redis-server, the client and the MAC already share both: the MAC's
 *      CPU time (730 us/MiB, as much as the fetch's) is what a faster MAC would remove.
 *      Then (AES-256-GMAC the default, values opened as their replies arrive), quiet
 *      machine: GMAC 0.74-0.87x (stories260K) and 0.50-0.55x (1b; 900 us per record
 *      against steps of 640); --mac hmac 0.46x and 0.36x.
 *   4. 8192 tokens, 1b q8_0, 2 threads: A cold 90.4 s; B from Redis 1.35 s (promotion
 *      1.08 s, last page 0.27 s): 67x (target 20x), logits equal to A's pool hit's. Again
 *      with the parallel opening, less loaded: 69.6 s against 1.25 s (promotion 0.95 s),
 *      55x.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>

#include <hiredis/hiredis.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include <pagoda/tier_redis.h>

#include "bench_tier_common.h"
#include "t_redis.h"

#define PROG "bench_tier_redis"

static void usage(FILE *f)
{
    fputs("usage: bench_tier_redis [options]\n"
          "  --parts LIST       which parts to run, of 1 (value size), 2 (MAC), 3 (promotion),\n"
          "                     4 (TTFT from another instance) (default 1,2,3,4)\n"
          "  --url URL          an existing standalone Redis (redis://[user:password@]host:port\n"
          "                     [/db]: the raw baselines do not follow cluster redirections);\n"
          "                     default: start redis-server on an ephemeral 127.0.0.1 port\n"
          "  --sizes LIST       part 1 value sizes in bytes (default 4 KiB, 16 KiB, 64 KiB,\n"
          "                     256 KiB, 1 MiB, 4 MiB, 16 MiB)\n"
          "  --mib N            MiB read per value size and repetition (default 256)\n"
          "  --depth N          commands in flight of the raw pipelines (default 16)\n"
          "  --deadline-ms N    part 3's tier deadline_ms (default 10000: throughput, not the\n"
          "                     deadline, is measured; part 4 runs with the tier's defaults)\n"
          "  --fill-threads N   part 3's threads reading at once, tier and raw alike (default\n"
          "                     2: the cache's fill threads, pgd_cache_params.tier_threads)\n"
          "  --mac gmac|hmac    the tier's record MAC in parts 3 and 4 (default gmac, the\n"
          "                     tier's default)\n"
          "  --reps N           repetitions; medians printed (default 3)\n"
          "  --redis-benchmark PATH  the second baseline of part 1 (default redis-benchmark;\n"
          "                     'none': skip it)\n"
          "  --model FILE       part 4's model (default: the synthetic 1b shape, generated\n"
          "                     once into $TMPDIR or /tmp and reused)\n"
          "  --tokens N         part 4's prompt tokens (default 8192)\n"
          "  -t N               part 4's threads (default 2)\n"
          "  --batch N          part 4's prompt chunk size (default 512)\n"
          "  --seed S           payload and prompt seed (default 1)\n"
          "  --json             one JSON object per result line\n"
          "  --smoke            tiny run (ctest): skips (77) without redis-server\n"
          "  --help\n",
          f);
}

/* ---- the run's options and shared state ---- */

enum { MAX_SIZES = 16, PIPE_BATCH = 64, MAX_FILL_THREADS = 8 };

typedef struct bench {
    unsigned parts; /* bit k: part k */
    const char *url;
    char own_url[128];
    uint64_t sizes[MAX_SIZES];
    int n_sizes;
    uint64_t mib, depth, reps, tokens, threads, batch, fill_threads;
    uint64_t deadline_ms;         /* the tier's deadline_ms while set (part 3), 0: its default */
    uint64_t promote_deadline_ms; /* --deadline-ms: part 3's */
    const char *redis_benchmark;
    const char *model_path;
    int json, smoke;
    int mac; /* --mac: the tier's PGD_TIER_REDIS_MAC_* (part 3's steps use the same) */
    uint64_t seed;
    /* where the raw baselines connect (parsed from the url) */
    char host[256];
    int port;
    char user[128], password[256];
    int db;
    uint8_t key[32]; /* the tier's key and the block-hash key of part 4 */
    char ns[64];     /* the run's key namespace: nothing of another run is read */
    uint64_t checksum;
} bench;

static int fail(const char *what, int rc)
{
    fprintf(stderr, PROG ": %s: %s\n", what, pgd_strerror(rc));
    return -1;
}

static uint64_t fold(uint64_t sum, uint64_t v)
{
    return sum ^ (v + 0x9E3779B97F4A7C15ull + (sum << 6) + (sum >> 2));
}

/* Folds a sample of p[0..n) (every 4 KiB and the last byte): enough to see a wrong value. */
static uint64_t fold_bytes(uint64_t sum, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i += 4096)
        sum = fold(sum, b[i]);
    return n ? fold(sum, b[n - 1]) : sum;
}

static void fill_random(void *p, size_t n, uint64_t *seed)
{
    uint8_t *b = p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v = bench_rng(seed);
        memcpy(b + i, &v, 8);
    }
    for (; i < n; i++)
        b[i] = (uint8_t)bench_rng(seed);
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- the bench's own redis-server (tests/t_redis.h) ---- */

/* The redis-server this bench started: stopped at exit and on SIGINT / SIGTERM (and
 * killed by the kernel if the bench dies: t_redis.h's PR_SET_PDEATHSIG). */
static t_redis g_redis;

static void rserver_stop(void)
{
    t_redis_stop(&g_redis);
}

static void on_signal(int sig)
{
    if (g_redis.pid > 0) kill(g_redis.pid, SIGKILL);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* A connection to host:port, or NULL (message printed unless quiet). */
static redisContext *rconnect(const bench *b, int quiet)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout(b->host, b->port, tv);
    if (!c || c->err) {
        if (!quiet)
            fprintf(stderr, PROG ": connect %s:%d: %s\n", b->host, b->port,
                    c ? c->errstr : "out of memory");
        if (c) redisFree(c);
        return NULL;
    }
    struct timeval cmd = {60, 0}; /* a 16 MiB batch on a loaded machine */
    redisSetTimeout(c, cmd);
    redisReply *r = NULL;
    if (b->password[0])
        r = b->user[0] ? redisCommand(c, "AUTH %s %s", b->user, b->password)
                       : redisCommand(c, "AUTH %s", b->password);
    if (r && r->type == REDIS_REPLY_ERROR) {
        fprintf(stderr, PROG ": AUTH: %s\n", r->str);
        freeReplyObject(r);
        redisFree(c);
        return NULL;
    }
    freeReplyObject(r);
    r = b->db > 0 ? redisCommand(c, "SELECT %d", b->db) : NULL;
    freeReplyObject(r);
    return c;
}

/* Starts redis-server on an ephemeral port (t_redis_start); sets b->host / port / url.
 * Returns 0, 77 (redis-server not installed) or -1. */
static int rserver_start(bench *b)
{
    if (!t_redis_available()) return 77;
    atexit(rserver_stop);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    if (t_redis_start(&g_redis, NULL)) return -1;
    snprintf(b->host, sizeof b->host, "127.0.0.1");
    b->port = g_redis.port;
    snprintf(b->own_url, sizeof b->own_url, "redis://127.0.0.1:%d", g_redis.port);
    b->url = b->own_url;
    return 0;
}

/* Host, port, user, password and db of a redis:// URL, for the raw baselines (the tier
 * parses the URL itself). Returns 0 or -1 with a message. */
static int parse_url(bench *b, const char *url)
{
    const char *p = url, *at, *slash, *colon;
    if (strncmp(p, "redis://", 8) != 0) {
        fprintf(stderr, PROG ": --url: the raw baselines need redis://host:port, got %s\n", url);
        return -1;
    }
    p += 8;
    slash = strchr(p, '/');
    at = strchr(p, '@');
    if (at && (!slash || at < slash)) {
        const char *c = memchr(p, ':', (size_t)(at - p));
        if (c) {
            snprintf(b->user, sizeof b->user, "%.*s", (int)(c - p), p);
            snprintf(b->password, sizeof b->password, "%.*s", (int)(at - c - 1), c + 1);
        } else {
            snprintf(b->password, sizeof b->password, "%.*s", (int)(at - p), p);
        }
        p = at + 1;
    }
    size_t hl = strcspn(p, ",/?");
    colon = memchr(p, ':', hl);
    if (!colon || hl >= sizeof b->host) {
        fprintf(stderr, PROG ": --url: no host:port in %s\n", url);
        return -1;
    }
    snprintf(b->host, sizeof b->host, "%.*s", (int)(colon - p), p);
    b->port = (int)strtol(colon + 1, NULL, 10);
    if (p[hl] == '/') b->db = (int)strtol(p + hl + 1, NULL, 10);
    return b->port > 0 && b->port < 65536 ? 0 : -1;
}

/* ---- raw pipelines (hiredis, as the tier's client reads) ---- */

/* SETs (values != NULL: value i % n_values under keys[i]) or GETs keys[0..n) in rounds
 * of n_ops commands (keys reused in order), depth in flight. Returns the seconds taken, or
 * -1 (message printed). *bytes gets the value bytes moved, *sum folds what GET read. */
static double raw_pipe(redisContext *c, char **keys, const size_t *klen, size_t n, size_t n_ops,
                       uint64_t depth, const void *value, size_t value_len, uint64_t *bytes,
                       uint64_t *sum)
{
    size_t sent = 0, got = 0;
    double t0 = bench_now_s();
    *bytes = 0;
    while (got < n_ops) {
        while (sent < n_ops && sent - got < depth) {
            size_t k = sent % n;
            int rc = value ? redisAppendCommand(c, "SET %b %b", keys[k], klen[k], value, value_len)
                           : redisAppendCommand(c, "GET %b", keys[k], klen[k]);
            if (rc != REDIS_OK) goto io;
            sent++;
        }
        redisReply *r;
        if (redisGetReply(c, (void **)&r) != REDIS_OK) goto io;
        if (value ? r->type != REDIS_REPLY_STATUS : r->type != REDIS_REPLY_STRING) {
            fprintf(stderr, PROG ": %s: unexpected reply (type %d%s%s)\n", value ? "SET" : "GET",
                    r->type, r->type == REDIS_REPLY_ERROR ? ": " : "",
                    r->type == REDIS_REPLY_ERROR ? r->str : "");
            freeReplyObject(r);
            return -1;
        }
        if (!value) {
            *bytes += r->len;
            *sum = fold_bytes(*sum, r->str, r->len);
        } else {
            *bytes += value_len;
        }
        freeReplyObject(r);
        got++;
    }
    return bench_now_s() - t0;
io:
    fprintf(stderr, PROG ": redis: %s\n", c->errstr);
    return -1;
}

/* DELs keys[0..n), pipelined. */
static void raw_del(redisContext *c, char **keys, const size_t *klen, size_t n)
{
    for (size_t i = 0; i < n; i += PIPE_BATCH) {
        size_t m = n - i < PIPE_BATCH ? n - i : PIPE_BATCH;
        for (size_t k = 0; k < m; k++)
            redisAppendCommand(c, "DEL %b", keys[i + k], klen[i + k]);
        for (size_t k = 0; k < m; k++) {
            redisReply *r = NULL;
            if (redisGetReply(c, (void **)&r) != REDIS_OK) return;
            freeReplyObject(r);
        }
    }
}

static void keys_free(char **keys, size_t *klen, size_t n)
{
    for (size_t i = 0; keys && i < n; i++)
        free(keys[i]);
    free(keys);
    free(klen);
}

/* ---- part 1: value size against throughput ---- */

/* redis-benchmark GET of one SIZE-byte value, 16 in flight on one connection, n requests.
 * Returns MiB/s, or -1 (not installed, or no GET line). */
static double redis_benchmark_mibs(const bench *b, uint64_t size, uint64_t n)
{
    if (!b->redis_benchmark || !strcmp(b->redis_benchmark, "none")) return -1;
    char auth[512] = "";
    if (b->password[0])
        snprintf(auth, sizeof auth, "%s%s -a '%s'", b->user[0] ? "--user " : "", b->user,
                 b->password);
    double rps = -1;
    /* The value once (-t set -n 1: redis-benchmark's SET of big values is slow and not
     * what is measured), then the GETs; its key is the fixed "key:__rand_int__" without
     * -r. */
    for (int step = 0; step < 2; step++) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd,
                 "%s -h %s -p %d %s --dbnum %d -t %s -d %" PRIu64 " -P 16 -c 1 -n %" PRIu64
                 " --csv 2>/dev/null",
                 b->redis_benchmark, b->host, b->port, auth, b->db, step ? "get" : "set", size,
                 step ? n : 1);
        FILE *f = popen(cmd, "r");
        if (!f) return -1;
        char line[512];
        while (fgets(line, sizeof line, f))
            if (step && !strncmp(line, "\"GET\",\"", 7)) rps = strtod(line + 7, NULL);
        if (pclose(f) != 0) return -1;
    }
    redisContext *c = rconnect(b, 1);
    if (c) {
        freeReplyObject(redisCommand(c, "DEL key:__rand_int__"));
        redisFree(c);
    }
    return rps > 0 ? rps * (double)size / 1048576.0 : -1;
}

static int part_sizes(bench *b)
{
    redisContext *c = rconnect(b, 0);
    if (!c) return -1;
    if (!b->json)
        printf("1. value size vs throughput, loopback, one connection, %" PRIu64
               " in flight, %" PRIu64 " MiB read per size (median of %" PRIu64 ")\n"
               "%10s %8s %12s %12s %12s %12s %12s\n",
               b->depth, b->mib, b->reps, "value", "keys", "GET MiB/s", "GET ops/s", "SET MiB/s",
               "r-bench MiB/s", "GET vs 1MiB");
    double get_mibs[MAX_SIZES], ref = -1;
    double set_mibs[MAX_SIZES], rb_mibs[MAX_SIZES];
    size_t n_keys_of[MAX_SIZES];
    for (int s = 0; s < b->n_sizes; s++) {
        const uint64_t size = b->sizes[s];
        const uint64_t total = b->mib << 20;
        /* distinct keys: 128 MiB of values at most (at least 16 keys); reads go round them */
        size_t n_keys = (size_t)((total / 2) / size);
        if (n_keys < 16) n_keys = 16;
        if (n_keys > 65536) n_keys = 65536;
        size_t n_ops = (size_t)(total / size);
        if (n_ops < n_keys) n_ops = n_keys;
        char **keys = calloc(n_keys, sizeof *keys);
        size_t *klen = calloc(n_keys, sizeof *klen);
        void *value = malloc(size);
        uint64_t seed = b->seed + (uint64_t)s, bytes = 0;
        if (!keys || !klen || !value) goto oom;
        for (size_t i = 0; i < n_keys; i++) {
            char k[96];
            klen[i] = (size_t)snprintf(k, sizeof k, "%s:v%" PRIu64 ":%zu", b->ns, size, i);
            keys[i] = strdup(k);
            if (!keys[i]) goto oom;
        }
        fill_random(value, size, &seed);
        double st[16], gt[16];
        uint64_t reps = b->reps > 16 ? 16 : b->reps;
        for (uint64_t r = 0; r < reps; r++) {
            st[r] = raw_pipe(c, keys, klen, n_keys, n_keys, b->depth, value, size, &bytes, NULL);
            if (st[r] < 0) goto io;
            st[r] = (double)bytes / st[r] / 1048576.0;
            gt[r] = raw_pipe(c, keys, klen, n_keys, n_ops, b->depth, NULL, 0, &bytes, &b->checksum);
            if (gt[r] < 0) goto io;
            if (bytes != (uint64_t)n_ops * size) {
                fprintf(stderr, PROG ": GET read %" PRIu64 " bytes, not %" PRIu64 "\n", bytes,
                        (uint64_t)n_ops * size);
                goto io;
            }
            gt[r] = (double)bytes / gt[r] / 1048576.0;
        }
        raw_del(c, keys, klen, n_keys);
        keys_free(keys, klen, n_keys);
        free(value);
        set_mibs[s] = bench_median(st, reps);
        get_mibs[s] = bench_median(gt, reps);
        rb_mibs[s] = redis_benchmark_mibs(b, size, n_ops);
        n_keys_of[s] = n_keys;
        if (size == 1048576) ref = get_mibs[s];
        continue;
    oom:
        fprintf(stderr, PROG ": out of memory\n");
    io:
        keys_free(keys, klen, n_keys);
        free(value);
        redisFree(c);
        return -1;
    }
    for (int s = 0; s < b->n_sizes; s++) {
        const uint64_t size = b->sizes[s];
        double ops = get_mibs[s] * 1048576.0 / (double)size;
        if (b->json) {
            printf("{\"test\": \"value_size\", \"bytes\": %" PRIu64 ", \"keys\": %zu, "
                   "\"get_mib_per_s\": %.1f, \"get_ops_per_s\": %.0f, \"set_mib_per_s\": %.1f, "
                   "\"redis_benchmark_get_mib_per_s\": ",
                   size, n_keys_of[s], get_mibs[s], ops, set_mibs[s]);
            if (rb_mibs[s] > 0)
                printf("%.1f}\n", rb_mibs[s]);
            else
                printf("null}\n");
        } else {
            char sz[32], rb[32] = "-", vs[32] = "-";
            if (size >= 1048576)
                snprintf(sz, sizeof sz, "%.0f MiB", size / 1048576.0);
            else
                snprintf(sz, sizeof sz, "%.0f KiB", size / 1024.0);
            if (rb_mibs[s] > 0) snprintf(rb, sizeof rb, "%.1f", rb_mibs[s]);
            if (ref > 0) snprintf(vs, sizeof vs, "%.2f", get_mibs[s] / ref);
            printf("%10s %8zu %12.1f %12.0f %12.1f %12s %12s\n", sz, n_keys_of[s], get_mibs[s], ops,
                   set_mibs[s], rb, vs);
        }
    }
    redisFree(c);
    return 0;
}

/* ---- part 2: HMAC-SHA256 ---- */

/* The MACs measured: the tier's, and two faster libcrypto ones for comparison (a value
 * would then carry its nonce). */
enum { MAC_HMAC = 0, MAC_GMAC = 1, MAC_POLY1305 = 2 };
static const char *const mac_names[] = {"HMAC-SHA256", "GMAC-AES256", "Poly1305"};

typedef struct mac {
    int kind;
    EVP_MAC *mac, *hmac;
    EVP_MAC_CTX *ctx, *hctx; /* hctx: Poly1305's one-time key, HMAC(key, nonce) */
} mac;

static void mac_close(mac *m)
{
    EVP_MAC_CTX_free(m->ctx);
    EVP_MAC_CTX_free(m->hctx);
    EVP_MAC_free(m->mac);
    EVP_MAC_free(m->hmac);
}

static int mac_open(mac *m, int kind)
{
    static const char *const fetch[] = {"HMAC", "GMAC", "POLY1305"};
    memset(m, 0, sizeof *m);
    m->kind = kind;
    m->mac = EVP_MAC_fetch(NULL, fetch[kind], NULL);
    m->ctx = m->mac ? EVP_MAC_CTX_new(m->mac) : NULL;
    if (kind == MAC_POLY1305) {
        m->hmac = EVP_MAC_fetch(NULL, "HMAC", NULL);
        m->hctx = m->hmac ? EVP_MAC_CTX_new(m->hmac) : NULL;
    }
    if (m->ctx && (kind != MAC_POLY1305 || m->hctx)) return 0;
    fprintf(stderr, PROG ": libcrypto has no %s\n", mac_names[kind]);
    mac_close(m);
    return -1;
}

/* The MAC of a || b with key into out[32] (the tier's: HMAC-SHA256(key, key || record)).
 * GMAC takes a 12-byte IV and Poly1305 a one-time key HMAC-SHA256(key, nonce), both from
 * nonce[16] (what a value would carry). */
static int mac_compute(mac *m, const uint8_t *key, size_t key_len, const uint8_t nonce[16],
                       const void *a, size_t a_len, const void *b, size_t b_len, uint8_t out[32])
{
    char sha[] = "SHA256", gcm[] = "AES-256-GCM";
    OSSL_PARAM hp[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, sha, 0),
                       OSSL_PARAM_construct_end()};
    OSSL_PARAM gp[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_CIPHER, gcm, 0),
                       OSSL_PARAM_construct_octet_string(OSSL_MAC_PARAM_IV, (void *)nonce, 12),
                       OSSL_PARAM_construct_end()};
    uint8_t otk[32];
    size_t len = 0;
    switch (m->kind) {
    case MAC_HMAC:
        if (!EVP_MAC_init(m->ctx, key, key_len, hp)) return -1;
        break;
    case MAC_GMAC:
        if (!EVP_MAC_init(m->ctx, key, 32, gp)) return -1;
        break;
    default:
        if (!EVP_MAC_init(m->hctx, key, key_len, hp) || !EVP_MAC_update(m->hctx, nonce, 16) ||
            !EVP_MAC_final(m->hctx, otk, &len, sizeof otk) || !EVP_MAC_init(m->ctx, otk, 32, NULL))
            return -1;
    }
    if (!EVP_MAC_update(m->ctx, a, a_len) || !EVP_MAC_update(m->ctx, b, b_len) ||
        !EVP_MAC_final(m->ctx, out, &len, 32) || len < 16)
        return -1;
    return 0;
}

/* Seconds per MAC (kind) of a key of 60 bytes and a value of size bytes (median of reps,
 * each about 64 MiB of MACs). Returns -1 on failure. */
static double mac_seconds(bench *b, uint64_t size, int kind)
{
    mac m;
    if (mac_open(&m, kind)) return -1;
    void *rec = malloc(size);
    uint8_t out[32] = {0}, nonce[16] = {0};
    const char k[] = "pgd:0123456789abcdef:{0123456789abcdef0123456789abcdef}";
    uint64_t seed = b->seed;
    double x[16];
    uint64_t reps = b->reps > 16 ? 16 : b->reps;
    if (!rec) {
        mac_close(&m);
        return -1;
    }
    fill_random(rec, size, &seed);
    uint64_t n = (64ull << 20) / size + 1;
    if (b->smoke) n = n / 64 + 1;
    mac_compute(&m, b->key, sizeof b->key, nonce, k, sizeof k - 1, rec, size, out); /* warm */
    for (uint64_t r = 0; r < reps; r++) {
        double t0 = bench_now_s();
        for (uint64_t i = 0; i < n; i++) {
            nonce[i % 16] ^= (uint8_t)i;
            if (mac_compute(&m, b->key, sizeof b->key, nonce, k, sizeof k - 1, rec, size, out)) {
                free(rec);
                mac_close(&m);
                return -1;
            }
            ((uint8_t *)rec)[i % size] ^= out[0]; /* each MAC depends on the last */
        }
        x[r] = (bench_now_s() - t0) / (double)n;
    }
    b->checksum = fold(b->checksum, out[0]);
    free(rec);
    mac_close(&m);
    return bench_median(x, reps);
}

/* Record sizes of the two models of part 3 (f16 KV, 16-token pages) as the tier stores
 * them: 128-byte header + page + 32-byte MAC trailer (GMAC's; HMAC's is 36). */
typedef struct geometry {
    const char *name;
    uint32_t n_layers, n_kv_heads, head_dim;
} geometry;

/* stories260K: dim 64, 5 layers, 8 heads, 4 KV heads (head_dim 8); the synthetic 1b shape
 * (tools/synth_model.c): dim 2048, 16 layers, 32 heads, 8 KV heads (head_dim 64). */
static const geometry geometries[] = {{"stories260K", 5, 4, 8}, {"synthetic 1b", 16, 8, 64}};

static uint64_t page_bytes_of(const geometry *g)
{
    return (uint64_t)PGD_DEFAULT_PAGE_TOKENS * g->n_layers * 2 * g->n_kv_heads * g->head_dim * 2;
}

/* Seconds per GET of one value of size bytes: pipelined (b->depth in flight) and one at a
 * time (a round trip each). Returns 0 or -1. */
static int get_seconds(bench *b, uint64_t size, double *pipelined, double *single)
{
    redisContext *c = rconnect(b, 0);
    if (!c) return -1;
    size_t n_keys = 64;
    char **keys = calloc(n_keys, sizeof *keys);
    size_t *klen = calloc(n_keys, sizeof *klen);
    void *value = malloc(size);
    uint64_t seed = b->seed, bytes;
    int rc = -1;
    if (!keys || !klen || !value) goto out;
    for (size_t i = 0; i < n_keys; i++) {
        char k[96];
        klen[i] = (size_t)snprintf(k, sizeof k, "%s:m%" PRIu64 ":%zu", b->ns, size, i);
        keys[i] = strdup(k);
        if (!keys[i]) goto out;
    }
    fill_random(value, size, &seed);
    if (raw_pipe(c, keys, klen, n_keys, n_keys, b->depth, value, size, &bytes, NULL) < 0) goto out;
    size_t n_ops = (size_t)((b->smoke ? 4ull << 20 : 64ull << 20) / size) + n_keys;
    double x[16], y[16];
    uint64_t reps = b->reps > 16 ? 16 : b->reps;
    for (uint64_t r = 0; r < reps; r++) {
        x[r] = raw_pipe(c, keys, klen, n_keys, n_ops, b->depth, NULL, 0, &bytes, &b->checksum);
        y[r] = raw_pipe(c, keys, klen, n_keys, n_ops / 4 + 1, 1, NULL, 0, &bytes, &b->checksum);
        if (x[r] < 0 || y[r] < 0) goto out;
        x[r] /= (double)n_ops;
        y[r] /= (double)(n_ops / 4 + 1);
    }
    *pipelined = bench_median(x, reps);
    *single = bench_median(y, reps);
    raw_del(c, keys, klen, n_keys);
    rc = 0;
out:
    keys_free(keys, klen, n_keys);
    free(value);
    redisFree(c);
    return rc;
}

static int part_mac(bench *b)
{
    uint64_t sizes[4];
    const char *names[4] = {"stories260K record", "1b record", "1 MiB", "4 MiB"};
    for (int g = 0; g < 2; g++)
        sizes[g] = PGD_RECORD_HEADER_BYTES + page_bytes_of(&geometries[g]) + 32;
    sizes[2] = 1 << 20;
    sizes[3] = 4 << 20;
    if (!b->json)
        printf("2. MAC of key || value (libcrypto EVP_MAC; the tier's: GMAC-AES256, HMAC-SHA256 "
               "with mac=hmac) and its "
               "share of a GET of one value\n%-19s %-11s %8s %8s %9s %7s %8s %6s %9s\n",
               "value", "MAC", "bytes", "MAC us", "MAC MiB/s", "us/MiB", "GET us", "share",
               "RTT share");
    for (int i = 0; i < 4; i++) {
        double gp, g1;
        if (get_seconds(b, sizes[i], &gp, &g1)) return -1;
        /* the faster MACs, for comparison, at the record sizes only */
        for (int kind = MAC_HMAC; kind <= (i < 2 ? MAC_POLY1305 : MAC_HMAC); kind++) {
            double ms = mac_seconds(b, sizes[i], kind);
            if (ms < 0) return fail("MAC", PGD_EIO);
            double mibs = (double)sizes[i] / ms / 1048576.0;
            /* share: of a pipelined get with its MAC (what promotion pays per record);
             * RTT share: of one get on its own (a round trip) */
            double share = ms / (ms + gp), rtt = ms / (ms + g1);
            if (b->json)
                printf("{\"test\": \"mac\", \"value\": \"%s\", \"mac\": \"%s\", \"bytes\": "
                       "%" PRIu64 ", \"mac_us\": %.2f, \"mac_mib_per_s\": %.1f, "
                       "\"mac_us_per_mib\": %.1f, \"get_us\": %.2f, \"get_rtt_us\": %.2f, "
                       "\"share\": %.3f, \"rtt_share\": %.3f}\n",
                       names[i], mac_names[kind], sizes[i], ms * 1e6, mibs, 1e6 / mibs, gp * 1e6,
                       g1 * 1e6, share, rtt);
            else
                printf("%-19s %-11s %8" PRIu64 " %8.1f %9.1f %7.1f %8.1f %6.3f %9.3f\n", names[i],
                       mac_names[kind], sizes[i], ms * 1e6, mibs, 1e6 / mibs, gp * 1e6, share, rtt);
        }
    }
    return 0;
}

/* ---- part 3: promotion throughput, tier against raw GET ---- */

/* Waits (at most 120 s) until t's put queue is empty, then flushes it. Returns 0 or -1. */
static int tier_drain(pgd_tier *t)
{
    for (int i = 0; i < 12000; i++) {
        pgd_tier_stats st;
        pgd_tier_get_stats(t, &st);
        if (st.put_queue_bytes == 0) return pgd_tier_flush(t) == PGD_OK ? 0 : -1;
        sleep_ms(10);
    }
    fprintf(stderr, PROG ": the Redis tier's put queue did not drain in 120 s\n");
    return -1;
}

/* A Redis tier on b->url with b->key and the run's namespace into *out. */
static int tier_open(bench *b, pgd_tier **out)
{
    char err[512] = "";
    pgd_tier_redis_params p = pgd_tier_redis_default_params();
    p.url = b->url;
    p.key = b->key;
    p.key_len = sizeof b->key;
    p.ns = b->ns;
    p.ttl_s = 3600; /* what a crashed run leaves in a --url Redis goes away */
    p.put_queue_bytes = 256ull << 20;
    if (b->deadline_ms) p.deadline_ms = (uint32_t)b->deadline_ms;
    p.mac = b->mac;
    int rc = pgd_tier_redis_create(&p, out, err, sizeof err);
    if (rc != PGD_OK)
        fprintf(stderr, PROG ": Redis tier on %s: %s (%s)\n", b->url, err, pgd_strerror(rc));
    return rc;
}

/* Puts block[i]'s record (payload i % n_payloads of pages) through t, retrying a put
 * refused for a full queue until it drains. Returns 0 or -1. */
static int tier_put_all(pgd_tier *t, const pgd_hash *blocks, size_t n, const uint8_t *pages,
                        size_t n_payloads, uint64_t page_bytes)
{
    for (size_t i = 0; i < n; i++) {
        pgd_hash parent = i ? blocks[i - 1] : (pgd_hash){0, 0};
        const uint8_t *page = pages + (i % n_payloads) * page_bytes;
        int rc = PGD_ENOSPC;
        for (int tries = 0; tries < 60000 && rc != PGD_OK; tries++) {
            rc = pgd_tier_put(t, blocks[i], parent, page, NULL, NULL, NULL);
            if (rc == PGD_ENOSPC) sleep_ms(1);
        }
        if (rc != PGD_OK) return fail("pgd_tier_put", rc);
    }
    return tier_drain(t);
}

/* One fill thread's share of a promotion: records [lo, hi) in batches of PIPE_BATCH,
 * through the tier (depth 0: pgd_tier_get_many into dst's pages) or raw (GET, depth in
 * flight, on c). */
typedef struct fill_job {
    pgd_tier *t;
    redisContext *c;
    const pgd_hash *blocks;
    char **keys;
    const size_t *klen;
    size_t lo, hi;
    uint64_t page_bytes, depth;
    uint8_t *dst; /* [PIPE_BATCH][page_bytes] */
    size_t n_ok;
    uint64_t sum, bytes; /* order-free: a sum of per-record folds */
    int failed;
    pthread_t th;
} fill_job;

static void *fill_main(void *arg)
{
    fill_job *j = arg;
    j->n_ok = 0;
    j->sum = j->bytes = 0;
    j->failed = 0;
    if (j->depth) {
        uint64_t sum = 0;
        double s = raw_pipe(j->c, j->keys + j->lo, j->klen + j->lo, j->hi - j->lo, j->hi - j->lo,
                            j->depth, NULL, 0, &j->bytes, &sum);
        j->failed = s < 0;
        j->sum = sum;
        j->n_ok = s < 0 ? 0 : j->hi - j->lo;
        return NULL;
    }
    void *pages[PIPE_BATCH], *bounds[PIPE_BATCH] = {0};
    int results[PIPE_BATCH];
    for (int k = 0; k < PIPE_BATCH; k++)
        pages[k] = j->dst + (size_t)k * j->page_bytes;
    for (size_t i = j->lo; i < j->hi; i += PIPE_BATCH) {
        size_t m = j->hi - i < PIPE_BATCH ? j->hi - i : PIPE_BATCH;
        size_t ok = pgd_tier_get_many(j->t, m, j->blocks + i, pages, bounds, results);
        j->n_ok += ok;
        for (size_t k = 0; k < ok; k++)
            j->sum += fold_bytes(0, pages[k], (size_t)j->page_bytes);
    }
    return NULL;
}

/* Runs jobs[0..n) at once, each on its own thread (depth: 0 the tier, else raw). Returns
 * the wall seconds, or -1 when a thread could not start or a raw pipeline failed. */
static double fill_run(fill_job *jobs, int n, uint64_t depth)
{
    int started = 0, failed = 0;
    double t0 = bench_now_s();
    for (; started < n; started++) {
        jobs[started].depth = depth;
        if (pthread_create(&jobs[started].th, NULL, fill_main, &jobs[started])) break;
    }
    for (int i = 0; i < started; i++) {
        pthread_join(jobs[i].th, NULL);
        failed |= jobs[i].failed;
    }
    double s = bench_now_s() - t0;
    return started == n && !failed ? s : -1;
}

/* Seconds per record of what the tier does to a value after reading it, besides the MAC:
 * the record's checksum (pgd_record_read_header over header and payload) and the copy of
 * the payload into a pool page (dst). key is a record's key in Redis. Returns -1 on
 * failure. */
static double verify_seconds(bench *b, redisContext *c, const char *key, size_t klen,
                             const pgd_record_ident *ident, void *dst)
{
    redisReply *r = redisCommand(c, "GET %b", key, klen);
    double x[16] = {0};
    uint64_t reps = b->reps > 16 ? 16 : b->reps;
    if (!r || r->type != REDIS_REPLY_STRING || r->len < PGD_RECORD_HEADER_BYTES + 32) {
        freeReplyObject(r);
        return -1;
    }
    const uint64_t payload = r->len - PGD_RECORD_HEADER_BYTES - 32;
    uint64_t n = (b->smoke ? 4ull << 20 : 64ull << 20) / payload + 1;
    for (uint64_t k = 0; k < reps; k++) {
        double t0 = bench_now_s();
        for (uint64_t i = 0; i < n; i++) {
            pgd_record_info info;
            if (pgd_record_read_header(r->str, r->str + PGD_RECORD_HEADER_BYTES, payload, ident,
                                       &info) != PGD_OK) {
                freeReplyObject(r);
                return -1;
            }
            memcpy(dst, r->str + PGD_RECORD_HEADER_BYTES, (size_t)ident->page_bytes);
        }
        x[k] = (bench_now_s() - t0) / (double)n;
    }
    b->checksum = fold_bytes(b->checksum, dst, (size_t)ident->page_bytes);
    freeReplyObject(r);
    return bench_median(x, reps);
}

static int part_promote(bench *b)
{
    if (!b->json)
        printf("3. promotion: pgd_tier_get_many (batches of %d, as a fill job) vs raw "
               "pipelined GET of the same values, %" PRIu64 " thread(s) each with a "
               "connection of its own (median of %" PRIu64 ")\n"
               "%-13s %9s %7s %9s %10s %10s %10s %8s %8s %9s %s\n",
               PIPE_BATCH, b->fill_threads, b->reps, "model", "record", "records", "MiB",
               "tier MiB/s", "raw MiB/s", "raw64 MiB/s", "ratio", "ratio64", "MAC share", "target");
    for (int g = 0; g < 2; g++) {
        const geometry *geo = &geometries[g];
        pgd_pool_params pp = pgd_pool_default_params();
        pp.n_layers = geo->n_layers;
        pp.n_kv_heads = geo->n_kv_heads;
        pp.head_dim = geo->head_dim;
        pp.kv_type = PGD_KV_F16;
        pgd_record_ident ident;
        int rc = pgd_record_ident_make(&pp, (pgd_hash){0x5eed + (uint64_t)g, 0xbe4c}, &ident);
        if (rc != PGD_OK) return fail("pgd_record_ident_make", rc);
        const uint64_t page_bytes = ident.page_bytes;
        /* the trailer: GMAC 12-byte nonce + 16-byte tag, HMAC 32 bytes; then a 4-byte marker */
        const uint64_t value_bytes =
            PGD_RECORD_HEADER_BYTES + page_bytes + (b->mac == PGD_TIER_REDIS_MAC_HMAC ? 36 : 32);
        size_t n = (size_t)((b->mib << 20) / page_bytes);
        if (n < PIPE_BATCH) n = PIPE_BATCH;
        n = (n + PIPE_BATCH - 1) / PIPE_BATCH * PIPE_BATCH;
        const size_t n_payloads = n < 64 ? n : 64;
        pgd_tier *t = NULL;
        redisContext *c = NULL;
        pgd_hash *blocks = malloc(n * sizeof *blocks);
        uint8_t *payloads = malloc(n_payloads * page_bytes);
        uint8_t *dst = malloc(PIPE_BATCH * page_bytes);
        char **keys = calloc(n, sizeof *keys);
        size_t *klen = calloc(n, sizeof *klen);
        double tt[16], r16[16], r64[16];
        uint64_t reps = b->reps > 16 ? 16 : b->reps, seed = b->seed + 77 * (uint64_t)g, bytes;
        uint64_t want = 0, got = 0;
        pgd_tier_stats st0, st1;
        const int T = (int)b->fill_threads;
        fill_job jobs[MAX_FILL_THREADS] = {0};
        size_t short_reads = 0;
        int ok = -1;
        if (!blocks || !payloads || !dst || !keys || !klen) {
            fprintf(stderr, PROG ": out of memory\n");
            goto out;
        }
        b->deadline_ms = b->promote_deadline_ms;
        rc = tier_open(b, &t);
        b->deadline_ms = 0;
        if (rc != PGD_OK) goto out;
        rc = pgd_tier_bind(t, &ident);
        if (rc != PGD_OK) {
            fail("pgd_tier_bind", rc);
            goto out;
        }
        fill_random(payloads, n_payloads * page_bytes, &seed);
        for (size_t i = 0; i < n; i++)
            blocks[i] = (pgd_hash){bench_rng(&seed), bench_rng(&seed)};
        if (tier_put_all(t, blocks, n, payloads, n_payloads, page_bytes)) goto out;
        for (size_t i = 0; i < n; i++) {
            char k[256];
            klen[i] = pgd_tier_redis_key(t, blocks[i], k, sizeof k);
            keys[i] = klen[i] ? strdup(k) : NULL;
            if (!keys[i]) {
                fprintf(stderr, PROG ": pgd_tier_redis_key failed\n");
                goto out;
            }
            want += fold_bytes(0, payloads + (i % n_payloads) * page_bytes, page_bytes);
        }
        c = rconnect(b, 0);
        if (!c) goto out;
        for (int k = 0; k < T; k++) {
            size_t lo = n * (size_t)k / (size_t)T / PIPE_BATCH * PIPE_BATCH;
            size_t hi = k + 1 == T ? n : n * (size_t)(k + 1) / (size_t)T / PIPE_BATCH * PIPE_BATCH;
            jobs[k] = (fill_job){.t = t,
                                 .c = rconnect(b, 0),
                                 .blocks = blocks,
                                 .keys = keys,
                                 .klen = klen,
                                 .lo = lo,
                                 .hi = hi,
                                 .page_bytes = page_bytes,
                                 .dst = malloc(PIPE_BATCH * page_bytes)};
            if (!jobs[k].c || !jobs[k].dst) goto out;
        }
        pgd_tier_get_stats(t, &st0);
        for (uint64_t r = 0; r < reps; r++) {
            /* the tier: what promotion reads, verified and copied into pool pages */
            double s = fill_run(jobs, T, 0);
            size_t n_ok = 0;
            got = 0;
            for (int k = 0; k < T; k++) {
                n_ok += jobs[k].n_ok;
                got += jobs[k].sum;
            }
            if (s < 0) goto out;
            if (n_ok != n) {
                fprintf(stderr, PROG ": %s: %zu of %zu records read (see the stats below)\n",
                        geo->name, n_ok, n);
                short_reads++;
            }
            tt[r] = (double)n_ok * (double)page_bytes / s / 1048576.0;
            /* raw GET of the same values: the record and its MAC, unverified; MiB/s of
             * payload, so that the three compare the same bytes */
            for (int d = 0; d < 2; d++) {
                s = fill_run(jobs, T, d ? 64 : b->depth);
                bytes = 0;
                for (int k = 0; k < T; k++) {
                    bytes += jobs[k].bytes;
                    b->checksum = fold(b->checksum, jobs[k].sum);
                }
                if (s < 0 || bytes != n * value_bytes) goto out;
                (d ? r64 : r16)[r] = (double)n * (double)page_bytes / s / 1048576.0;
            }
        }
        pgd_tier_get_stats(t, &st1);
        if (!short_reads && got != want) {
            fprintf(stderr, PROG ": %s: the records read differ from those written\n", geo->name);
            goto out;
        }
        b->checksum = fold(b->checksum, got);
        double tm = bench_median(tt, reps), m16 = bench_median(r16, reps);
        double m64 = bench_median(r64, reps);
        double mac_s =
            mac_seconds(b, value_bytes, b->mac == PGD_TIER_REDIS_MAC_HMAC ? MAC_HMAC : MAC_GMAC);
        double ver_s = verify_seconds(b, c, keys[0], klen[0], &ident, dst);
        if (mac_s < 0 || ver_s < 0) {
            fprintf(stderr, PROG ": %s: timing the MAC or the checksum failed\n", geo->name);
            goto out;
        }
        /* per record: the tier's time, and what it does one after another: the pipelined
         * fetch (as raw64: get_many sends its 64 GETs at once), the MAC, the checksum and
         * the copy */
        const double mib = (double)page_bytes / 1048576.0;
        /* thread time per record (T threads at once: wall time x T) */
        double tier_us = mib / tm * 1e6 * T, fetch_us = mib / m64 * 1e6 * T;
        double share = mac_s * 1e6 / tier_us; /* the MAC's share of the tier's time */
        uint64_t misses = st1.n_deadline_misses - st0.n_deadline_misses;
        uint64_t macf = st1.n_mac_failures - st0.n_mac_failures;
        if (b->json)
            printf("{\"test\": \"promotion\", \"model\": \"%s\", \"record_bytes\": %" PRIu64
                   ", \"records\": %zu, \"tier_mib_per_s\": %.1f, \"raw_mib_per_s\": %.1f, "
                   "\"raw64_mib_per_s\": %.1f, \"ratio\": %.3f, \"ratio64\": %.3f, "
                   "\"mac_share\": %.3f, \"tier_us\": %.1f, \"fetch64_us\": %.1f, "
                   "\"mac_us\": %.1f, \"checksum_copy_us\": %.1f, \"deadline_misses\": %" PRIu64
                   ", \"mac_failures\": %" PRIu64 "}\n",
                   geo->name, value_bytes, n, tm, m16, m64, tm / m16, tm / m64, share, tier_us,
                   fetch_us, mac_s * 1e6, ver_s * 1e6, misses, macf);
        else
            printf("%-13s %9" PRIu64 " %7zu %9.1f %10.1f %10.1f %10.1f %8.3f %8.3f %9.3f %s\n"
                   "  thread time per record: tier %.1f us; its steps alone: fetch %.1f (raw64) "
                   "+ MAC %.1f + checksum and copy %.1f = %.1f us\n",
                   geo->name, value_bytes, n, (double)n * page_bytes / 1048576.0, tm, m16, m64,
                   tm / m16, tm / m64, share, "target >= 0.70", tier_us, fetch_us, mac_s * 1e6,
                   ver_s * 1e6, fetch_us + (mac_s + ver_s) * 1e6);
        if (misses || macf)
            fprintf(stderr, PROG ": %s: %" PRIu64 " deadline misses, %" PRIu64 " MAC failures\n",
                    geo->name, misses, macf);
        ok = 0;
    out:
        for (int k = 0; k < T; k++) {
            if (jobs[k].c) redisFree(jobs[k].c);
            free(jobs[k].dst);
        }
        if (c) raw_del(c, keys, klen, n);
        if (c) redisFree(c);
        pgd_tier_close(t);
        keys_free(keys, klen, n);
        free(blocks);
        free(payloads);
        free(dst);
        if (ok) return -1;
    }
    return 0;
}

/* ---- part 4: TTFT of a prompt computed by another instance ---- */

typedef struct prompt {
    pe_model *m;
    uint32_t n_vocab, page_tokens, n_tokens, batch, threads;
    int32_t *toks;
    pgd_hash *hashes;
    size_t n_hash;
    float *logits;
} prompt;

typedef struct run_result {
    double ttft_s, promote_s;
    pgd_match_info mi;
    uint32_t first;
} run_result;

static uint32_t argmax(const float *x, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* The prompt on ctx as a new sequence: hashes it, matches its first N - 1 tokens (when
 * match), waits for the promotions, computes the rest in chunks (the last token's logits
 * into pr->logits). Returns 0 or -1. As bench_tier.c's run_prompt. */
static int run_prompt(prompt *pr, pe_ctx *ctx, int match, run_result *r)
{
    pgd_cache *c = pe_ctx_cache(ctx);
    pgd_seq *s;
    memset(r, 0, sizeof *r);
    double t0 = bench_now_s();
    int rc = pgd_seq_create(c, NULL, 0, &s);
    if (rc != PGD_OK) return fail("pgd_seq_create", rc);
    size_t nh = pgd_cache_hash_tokens(c, NULL, 0, pr->toks, pr->n_tokens, pr->hashes, pr->n_hash);
    if (match) {
        int64_t got = pgd_seq_match_hashed(c, s, pr->toks, pr->n_tokens - 1, pr->hashes, nh);
        if (got < 0) {
            pgd_seq_destroy(c, s);
            return fail("pgd_seq_match_hashed", (int)got);
        }
        pgd_seq_wait(c, s);
        r->promote_s = bench_now_s() - t0;
        pgd_seq_match_info(c, s, &r->mi);
    }
    for (uint64_t pos = pgd_seq_length(c, s); pos < pr->n_tokens;) {
        uint32_t n = pr->n_tokens - pos < pr->batch ? (uint32_t)(pr->n_tokens - pos) : pr->batch;
        pe_batch_item it = {.seq = s,
                            .tokens = pr->toks + pos,
                            .n = n,
                            .logits = pos + n == pr->n_tokens ? pr->logits : NULL,
                            .hashes = pr->hashes,
                            .n_hashes = (uint32_t)nh};
        rc = pe_forward_batch(ctx, &it, 1);
        if (rc) {
            pgd_seq_destroy(c, s);
            return fail("pe_forward_batch", rc);
        }
        pos += n;
    }
    r->ttft_s = bench_now_s() - t0;
    r->first = argmax(pr->logits, pr->n_vocab);
    pgd_seq_destroy(c, s);
    return 0;
}

/* The 1b model at $TMPDIR/pagoda-synth-1b-q8_0-ctx16384.gguf, made with the CLI when
 * absent (PGD_CLI_PATH: the pagoda binary of this build). Returns 0 or -1. */
static int synth_model(char *path, size_t cap, double *seconds)
{
    snprintf(path, cap, "%s/pagoda-synth-1b-q8_0-ctx16384.gguf", bench_tier_tmpdir());
    *seconds = 0;
    if (access(path, R_OK) == 0) return 0;
#ifdef PGD_CLI_PATH
    char tmp[1100], cmd[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    snprintf(cmd, sizeof cmd,
             "'%s' synth-model --shape 1b --type q8_0 --ctx 16384 --seed 1 -o '%s' >&2 && "
             "mv '%s' '%s'",
             PGD_CLI_PATH, tmp, tmp, path);
    fprintf(stderr, PROG ": making %s (once)\n", path);
    double t0 = bench_now_s();
    int rc = system(cmd);
    *seconds = bench_now_s() - t0;
    if (rc == 0) return 0;
    unlink(tmp);
    fprintf(stderr, PROG ": `%s` failed\n", cmd);
#else
    fprintf(stderr, PROG ": no pagoda CLI in this build: give --model\n");
#endif
    return -1;
}

static int ctx_open(prompt *pr, pgd_tier_use *use, const uint8_t key[32], pe_ctx **out)
{
    pe_ctx_params cp = pe_ctx_default_params();
    cp.n_ctx = pr->n_tokens + 2 * pr->page_tokens;
    cp.n_batch = pr->batch;
    cp.n_threads = pr->threads;
    cp.kv_tokens = (uint64_t)pr->n_tokens + 4ull * pr->page_tokens;
    cp.tiers = use;
    cp.n_tiers = 1;
    cp.hash_key = key;
    cp.hash_key_len = 32;
    return bench_tier_ctx_create(PROG, pr->m, &cp, out);
}

static int part_ttft(bench *b)
{
    char path[1024];
    double gen_s = 0;
    prompt pr = {.n_tokens = (uint32_t)b->tokens,
                 .batch = (uint32_t)b->batch,
                 .threads = (uint32_t)b->threads};
    const char *model = b->model_path;
    if (!model) {
        if (synth_model(path, sizeof path, &gen_s)) return -1;
        model = path;
    }
    uint64_t page_bytes;
    double t0 = bench_now_s();
    const pe_hparams *hp = bench_tier_model_load(PROG, model, &pr.m, &pr.page_tokens, &page_bytes);
    if (!hp) return -1;
    double load_s = bench_now_s() - t0;
    pr.n_vocab = hp->n_vocab;
    if (pr.n_tokens < 2 * pr.page_tokens) {
        fprintf(stderr, PROG ": --tokens must be at least %u\n", 2 * pr.page_tokens);
        pe_model_destroy(pr.m);
        return -1;
    }
    pr.n_hash = pr.n_tokens / pr.page_tokens;
    pr.toks = malloc(pr.n_tokens * sizeof *pr.toks);
    pr.hashes = malloc(pr.n_hash * sizeof *pr.hashes);
    pr.logits = malloc(pr.n_vocab * sizeof *pr.logits);
    float *ref = malloc(pr.n_vocab * sizeof *ref);
    pgd_tier *ta = NULL, *tb = NULL;
    pgd_tier_use ua = {0}, ub = {0};
    pe_ctx *a = NULL, *bctx = NULL;
    run_result cold, hit, remote;
    int ok = -1;
    if (!pr.toks || !pr.hashes || !pr.logits || !ref) goto out;
    uint64_t seed = b->seed;
    pr.toks[0] = 1;
    for (uint32_t i = 1; i < pr.n_tokens; i++)
        pr.toks[i] = 3 + (int32_t)(bench_rng(&seed) % (pr.n_vocab - 3));
    if (!b->json)
        printf("4. TTFT of a prompt of %u tokens computed by another instance: model %s (%.2f GiB, "
               "%u threads, isa %s), %zu pages of %.1f KiB\n",
               pr.n_tokens, model, pe_model_weight_bytes(pr.m) / 1073741824.0, pr.threads,
               pe_isa_name(pe_isa_detect()), pr.n_hash, page_bytes / 1024.0);

    /* A: cold, its pages written through to Redis */
    if (tier_open(b, &ta) != PGD_OK) goto out;
    ua = (pgd_tier_use){.tier = ta, .write_through = 1};
    if (ctx_open(&pr, &ua, b->key, &a)) goto out;
    if (run_prompt(&pr, a, 0, &cold)) goto out;
    t0 = bench_now_s();
    pgd_cache_flush(pe_ctx_cache(a));
    if (tier_drain(ta)) goto out;
    double drain_s = bench_now_s() - t0;
    pgd_tier_stats sa;
    pgd_tier_get_stats(ta, &sa);
    /* A's own pool hit: the reference logits of a matched prompt */
    if (run_prompt(&pr, a, 1, &hit)) goto out;
    memcpy(ref, pr.logits, pr.n_vocab * sizeof *ref);

    /* B: another instance (its own tier handle and context), same key */
    t0 = bench_now_s();
    if (tier_open(b, &tb) != PGD_OK) goto out;
    ub = (pgd_tier_use){.tier = tb};
    if (ctx_open(&pr, &ub, b->key, &bctx)) goto out;
    double open_s = bench_now_s() - t0;
    if (run_prompt(&pr, bctx, 1, &remote)) goto out;
    const char *same = memcmp(ref, pr.logits, pr.n_vocab * sizeof *ref) ? "DIFF" : "same";
    pgd_tier_stats sb;
    pgd_tier_get_stats(tb, &sb);
    b->checksum = fold(fold(fold(b->checksum, cold.first), hit.first), remote.first);
    if (b->json) {
        printf("{\"test\": \"ttft\", \"tokens\": %u, \"cold_s\": %.6f, \"pool_s\": %.6f, "
               "\"redis_s\": %.6f, \"redis_promote_s\": %.6f, \"vs_cold\": %.2f, "
               "\"redis_tokens\": %" PRIu64 ", \"first_token\": %u, \"logits\": \"%s\", "
               "\"records_written\": %" PRIu64 ", \"put_refused\": %" PRIu64
               ", \"deadline_misses\": %" PRIu64 ", \"model_make_s\": %.3f, \"model_load_s\": "
               "%.3f, \"drain_s\": %.3f, \"open_b_s\": %.3f}\n",
               pr.n_tokens, cold.ttft_s, hit.ttft_s, remote.ttft_s, remote.promote_s,
               cold.ttft_s / remote.ttft_s, remote.mi.tier_tokens[0], remote.first, same, sa.n_puts,
               sa.n_put_refused, sb.n_deadline_misses, gen_s, load_s, drain_s, open_s);
    } else {
        printf("%-24s %10s %10s %10s %s\n", "case", "seconds", "vs cold", "tokens", "");
        printf("%-24s %10.4f %9.1fx %10u %s\n", "A cold (computes)", cold.ttft_s, 1.0, pr.n_tokens,
               "(baseline)");
        printf("%-24s %10.4f %9.1fx %10" PRIu64 " %s\n", "A pool hit", hit.ttft_s,
               cold.ttft_s / hit.ttft_s, hit.mi.pool_tokens, "(reference logits)");
        printf("%-24s %10.4f %9.1fx %10" PRIu64 " first %u, logits %s, target >= 20x\n",
               "B from Redis", remote.ttft_s, cold.ttft_s / remote.ttft_s, remote.mi.tier_tokens[0],
               remote.first, same);
        printf("parts: model made %.1f s, loaded %.1f s; A's write-through drained %.3f s after "
               "its prefill (%" PRIu64 " records written, %" PRIu64 " refused); B's tier and "
               "context opened in %.3f s; B promoted in %.3f s and computed the rest in "
               "%.3f s (%" PRIu64 " deadline misses)\n",
               gen_s, load_s, drain_s, sa.n_puts, sa.n_put_refused, open_s, remote.promote_s,
               remote.ttft_s - remote.promote_s, sb.n_deadline_misses);
    }
    if (strcmp(same, "same") || remote.mi.tier_tokens[0] == 0) {
        fprintf(stderr, PROG ": B %s\n",
                remote.mi.tier_tokens[0] ? "computed other logits than A's pool hit"
                                         : "found nothing in Redis");
        goto out;
    }
    ok = 0;
out:
    pe_ctx_destroy(bctx);
    pe_ctx_destroy(a);
    /* what this run wrote goes away with the namespace's records */
    for (size_t i = 0; ta && i < pr.n_hash; i++)
        pgd_tier_del(ta, pr.hashes[i]);
    if (ta) tier_drain(ta);
    pgd_tier_close(tb);
    pgd_tier_close(ta);
    free(pr.toks);
    free(pr.hashes);
    free(pr.logits);
    free(ref);
    pe_model_destroy(pr.m);
    return ok;
}

/* ---- main ---- */

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"parts", required_argument, NULL, 'P'},           {"url", required_argument, NULL, 'u'},
        {"sizes", required_argument, NULL, 'S'},           {"mib", required_argument, NULL, 'm'},
        {"depth", required_argument, NULL, 'D'},           {"reps", required_argument, NULL, 'r'},
        {"redis-benchmark", required_argument, NULL, 'R'}, {"model", required_argument, NULL, 'M'},
        {"tokens", required_argument, NULL, 'n'},          {"batch", required_argument, NULL, 'b'},
        {"fill-threads", required_argument, NULL, 'F'},    {"mac", required_argument, NULL, 'A'},
        {"deadline-ms", required_argument, NULL, 'L'},     {NULL, 0, NULL, 0},
    };
    bench b = {.parts = 0x1e,
               .sizes = {4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20},
               .n_sizes = 7,
               .mib = 256,
               .depth = 16,
               .reps = 3,
               .tokens = 8192,
               .threads = 2,
               .batch = 512,
               .fill_threads = 2,
               .promote_deadline_ms = 10000,
               .redis_benchmark = "redis-benchmark"};
    bench_cli cli = {.prog = PROG,
                     .usage = usage,
                     .own = lo,
                     .optstring = "t:",
                     .common = BENCH_SEED | BENCH_JSON | BENCH_SMOKE,
                     .a = {.seed = 1}};
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (;;) {
        int c = bench_cli_next(&cli, argc, argv);
        if (c == -1) break;
        uint64_t v = 0;
        uint32_t list[MAX_SIZES];
        int n;
        if (strchr("mDrntbFL", c) && (bench_parse_u64(optarg, &v) || v < 1 || v > (1u << 24))) {
            fprintf(stderr, PROG ": bad number '%s'\n", optarg);
            return 2;
        }
        switch (c) {
        case 'P':
            n = bench_parse_u32_list(optarg, list, 4, 1);
            b.parts = 0;
            for (int i = 0; i < n; i++)
                b.parts |= list[i] <= 4 ? 1u << list[i] : 0;
            if (n < 1 || !b.parts) {
                fprintf(stderr, PROG ": --parts: a list of 1, 2, 3, 4, got '%s'\n", optarg);
                return 2;
            }
            break;
        case 'u':
            b.url = optarg;
            break;
        case 'A':
            if (strcmp(optarg, "gmac") && strcmp(optarg, "hmac")) {
                fprintf(stderr, PROG ": --mac: gmac or hmac, got '%s'\n", optarg);
                return 2;
            }
            b.mac = strcmp(optarg, "hmac") ? PGD_TIER_REDIS_MAC_GMAC : PGD_TIER_REDIS_MAC_HMAC;
            break;
        case 'S':
            b.n_sizes = bench_parse_u32_list(optarg, list, MAX_SIZES, 1);
            if (b.n_sizes < 1) {
                fprintf(stderr, PROG ": --sizes: bad list '%s' (bytes, at most 16 MiB)\n", optarg);
                return 2;
            }
            for (int i = 0; i < b.n_sizes; i++)
                b.sizes[i] = list[i];
            break;
        case 'm':
            b.mib = v;
            break;
        case 'D':
            b.depth = v;
            break;
        case 'r':
            b.reps = v > 16 ? 16 : v;
            break;
        case 'R':
            b.redis_benchmark = optarg;
            break;
        case 'M':
            b.model_path = optarg;
            break;
        case 'n':
            b.tokens = v;
            break;
        case 't':
            b.threads = v;
            break;
        case 'b':
            b.batch = v;
            break;
        case 'L':
            b.promote_deadline_ms = v;
            break;
        case 'F':
            b.fill_threads = v > MAX_FILL_THREADS ? MAX_FILL_THREADS : v;
            break;
        }
    }
    if (cli.status >= 0) return cli.status;
    if (optind != argc) {
        fprintf(stderr, PROG ": unexpected argument %s (see --help)\n", argv[optind]);
        return 2;
    }
    b.json = cli.a.json;
    b.smoke = cli.a.smoke;
    b.seed = cli.a.seed ? cli.a.seed : 1;
    char smoke_model[1024];
    if (b.smoke) {
        b.sizes[0] = 16 << 10;
        b.sizes[1] = 1 << 20;
        b.n_sizes = 2;
        b.mib = 4;
        b.reps = 1;
        b.tokens = 64;
        b.batch = 32;
        b.redis_benchmark = "none";
        if (!(b.parts & 16) || bench_tier_smoke_model(PROG, smoke_model, sizeof smoke_model))
            b.parts &= ~16u;
        else
            b.model_path = smoke_model;
    }
    uint64_t kseed = b.seed ^ 0x6b6579ull;
    for (int i = 0; i < 32; i++)
        b.key[i] = (uint8_t)bench_rng(&kseed);
    snprintf(b.ns, sizeof b.ns, "pgdbench%d", (int)getpid());
    int rc;
    if (b.url)
        rc = parse_url(&b, b.url);
    else
        rc = rserver_start(&b);
    if (rc) return rc == 77 ? 77 : 1;
    if (!b.json)
        printf("bench_tier_redis: Redis at %s (%s), namespace %s; %ld cores online\n", b.url,
               g_redis.pid ? "started by the bench" : "--url", b.ns, sysconf(_SC_NPROCESSORS_ONLN));
    rc = 0;
    if (!rc && (b.parts & 2)) rc = part_sizes(&b);
    if (!rc && (b.parts & 4)) rc = part_mac(&b);
    if (!rc && (b.parts & 8)) rc = part_promote(&b);
    if (!rc && (b.parts & 16)) rc = part_ttft(&b);
    if (!rc) bench_print_checksum(b.checksum, b.json);
    rserver_stop();
    return rc ? 1 : 0;
}
