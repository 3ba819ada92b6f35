/* SPDX-License-Identifier: MIT */
/*
 * bench.h - what the benches of bench/ share: clocks, the xorshift64* generator, medians,
 * number and list parsing, the options every bench has (--seed, --json, --smoke, --help)
 * and the checksum line. Header-only (static functions), bench code only: each bench is
 * one translation unit that includes it.
 *
 * A bench's option loop:
 *
 *   static const struct option own[] = {{"ctx", required_argument, NULL, 'c'}, {0}};
 *   bench_cli cli = {.prog = "bench_x", .usage = usage, .own = own,
 *                    .common = BENCH_SEED | BENCH_SMOKE, .a = {.seed = 1}};
 *   for (;;) {
 *       int c = bench_cli_next(&cli, argc, argv);
 *       if (c == -1) break;
 *       switch (c) { case 'c': ...the bench's own options... }
 *   }
 *   if (cli.status >= 0) return cli.status;      (--help: 0; a bad option: 2)
 */
#ifndef PGD_BENCH_H
#define PGD_BENCH_H

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <pagoda/pool.h>

/* ---- clocks ---- */

/* Seconds on clock id (CLOCK_MONOTONIC for wall time, CLOCK_THREAD_CPUTIME_ID or
 * CLOCK_PROCESS_CPUTIME_ID for CPU time). */
static inline double bench_clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Wall-clock seconds (monotonic). */
static inline double bench_now_s(void)
{
    return bench_clock_s(CLOCK_MONOTONIC);
}

/* ---- random numbers ---- */

/* xorshift64*: the next 64 random bits of state *s (never 0). */
static inline uint64_t bench_rng(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ULL;
}

/* Uniform in [-1, 1), from 53 random bits. */
static inline float bench_randf(uint64_t *s)
{
    return (float)((double)(bench_rng(s) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

/* ---- statistics ---- */

static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of x[0..n) (n >= 1); sorts x. */
static inline double bench_median(double *x, size_t n)
{
    qsort(x, n, sizeof *x, bench_cmp_double);
    return x[n / 2];
}

/* ---- parsing ---- */

/* A decimal unsigned integer, the whole string. Returns 0, or -1 (empty, sign, junk,
 * overflow). */
static inline int bench_parse_u64(const char *s, uint64_t *out)
{
    char *end = NULL;
    if (!s || s[0] < '0' || s[0] > '9') return -1;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end != '\0' || errno != 0) return -1;
    *out = v;
    return 0;
}

/* "a,b,c": at most max numbers, each in [min, 2^24]. Returns the count (>= 1) or -1. */
static inline int bench_parse_u32_list(const char *s, uint32_t *out, int max, uint32_t min)
{
    int n = 0;
    while (*s) {
        char *end;
        unsigned long v = strtoul(s, &end, 10);
        if (end == s || *s == '-' || n == max || v < min || v > (1ul << 24)) return -1;
        out[n++] = (uint32_t)v;
        s = end;
        if (*s == ',')
            s++;
        else if (*s)
            return -1;
    }
    return n ? n : -1;
}

/* "f16,q8_0": at most max kv type names (pgd_kv_type_parse). Returns the count (>= 1) or
 * -1. */
static inline int bench_parse_kv_types(const char *s, pgd_kv_type *out, int max)
{
    char buf[256];
    int n = 0;
    snprintf(buf, sizeof buf, "%s", s);
    for (char *p = buf; p && *p;) {
        char *comma = strchr(p, ',');
        if (comma) *comma = '\0';
        if (n == max || pgd_kv_type_parse(p, &out[n]) != PGD_OK) return -1;
        n++;
        p = comma ? comma + 1 : NULL;
    }
    return n ? n : -1;
}

/* ---- the options every bench has ---- */

typedef struct bench_args {
    uint64_t seed; /* --seed N (the bench sets the default before parsing) */
    int json;      /* --json: one JSON object per result line */
    int smoke;     /* --smoke: tiny and fast, for ctest */
} bench_args;

/* The common options a bench takes besides --help (which every bench has). */
enum { BENCH_SEED = 1, BENCH_JSON = 2, BENCH_SMOKE = 4 };

enum { BENCH_MAX_OPTS = 48 }; /* the bench's own options plus the common ones */

/* A bench's command line: set prog, usage, own (its option table, ending with a zero
 * entry), common and the defaults of a (and optstring for short options), then call
 * bench_cli_next until it returns -1. */
typedef struct bench_cli {
    const char *prog;                 /* for messages */
    void (*usage)(FILE *f);           /* --help: to stdout; errors: to stderr */
    const struct option *own;         /* the bench's own long options */
    const char *optstring;            /* its short options; NULL: none */
    unsigned common;                  /* BENCH_SEED | BENCH_JSON | BENCH_SMOKE */
    bench_args a;                     /* the common options' values */
    int status;                       /* after -1 from bench_cli_next: >= 0, main returns it */
    struct option lo[BENCH_MAX_OPTS]; /* own, then the common ones (built at the first call) */
} bench_cli;

/* getopt_long values of the common options, above every character a bench uses. */
enum { BENCH_OPT_SEED = 0x100, BENCH_OPT_JSON, BENCH_OPT_SMOKE, BENCH_OPT_HELP };

/* Returns the getopt_long value of the next of the bench's own options (optarg is its
 * argument), handling the common ones on the way; -1 at the end. Then cli->status is -1 to
 * go on, or what main returns now: 0 after --help or -h (usage on stdout), 2 after a bad
 * --seed, an unknown option or a missing value (usage or a message on stderr). */
static inline int bench_cli_next(bench_cli *cli, int argc, char **argv)
{
    if (!cli->lo[0].name) {
        int n = 0;
        while (cli->own[n].name && n < BENCH_MAX_OPTS - 5) {
            cli->lo[n] = cli->own[n];
            n++;
        }
        if (cli->common & BENCH_SEED)
            cli->lo[n++] = (struct option){"seed", required_argument, NULL, BENCH_OPT_SEED};
        if (cli->common & BENCH_JSON)
            cli->lo[n++] = (struct option){"json", no_argument, NULL, BENCH_OPT_JSON};
        if (cli->common & BENCH_SMOKE)
            cli->lo[n++] = (struct option){"smoke", no_argument, NULL, BENCH_OPT_SMOKE};
        cli->lo[n] = (struct option){"help", no_argument, NULL, BENCH_OPT_HELP};
        cli->status = -1;
    }
    for (;;) {
        int c = getopt_long(argc, argv, cli->optstring ? cli->optstring : "", cli->lo, NULL);
        switch (c) {
        case -1:
            return -1;
        case BENCH_OPT_SEED:
            if (bench_parse_u64(optarg, &cli->a.seed) == 0) continue;
            fprintf(stderr, "%s: --seed: bad number '%s'\n", cli->prog, optarg);
            cli->status = 2;
            return -1;
        case BENCH_OPT_JSON:
            cli->a.json = 1;
            continue;
        case BENCH_OPT_SMOKE:
            cli->a.smoke = 1;
            continue;
        case BENCH_OPT_HELP:
        case 'h': /* -h, where optstring has it */
            cli->usage(stdout);
            cli->status = 0;
            return -1;
        case '?':
        case ':':
            cli->usage(stderr);
            cli->status = 2;
            return -1;
        default:
            return c;
        }
    }
}

/* ---- output ---- */

/* The checksum line: "checksum %016x", or {"checksum": "%016x"} under --json. */
static inline void bench_print_checksum(uint64_t checksum, int json)
{
    if (json)
        printf("{\"checksum\": \"%016" PRIx64 "\"}\n", checksum);
    else
        printf("checksum %016" PRIx64 "\n", checksum);
}

#endif /* PGD_BENCH_H */
