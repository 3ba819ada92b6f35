/* SPDX-License-Identifier: MIT */
/*
 * cli.c - helpers shared by the commands of the `pagoda` CLI (see cli.h).
 */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <pagoda/pool.h>

int cli_parse_u64(const char *cmd, const char *opt, const char *s, uint64_t min, uint64_t max,
                  uint64_t *out)
{
    char *end = NULL;
    unsigned long long v;

    /* strtoull accepts leading blanks and a minus sign: insist on a plain number. */
    if (!isdigit((unsigned char)s[0])) {
        fprintf(stderr, "%s: %s: '%s' is not a non-negative integer\n", cmd, opt, s);
        return -1;
    }
    errno = 0;
    v = strtoull(s, &end, 10);
    if (*end != '\0') {
        fprintf(stderr, "%s: %s: '%s' is not a non-negative integer\n", cmd, opt, s);
        return -1;
    }
    if (errno == ERANGE || v < min || v > max) {
        fprintf(stderr, "%s: %s: %s is out of range [%llu, %llu]\n", cmd, opt, s,
                (unsigned long long)min, (unsigned long long)max);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_size(const char *cmd, const char *opt, const char *s, uint64_t min, uint64_t max,
                   uint64_t *out)
{
    uint64_t v = 0, mul = 1;
    const char *p = s;

    if (!isdigit((unsigned char)*p)) goto bad;
    for (; isdigit((unsigned char)*p); p++) {
        uint64_t d = (uint64_t)(*p - '0');
        if (v > (UINT64_MAX - d) / 10) goto range;
        v = v * 10 + d;
    }
    switch (*p) {
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
    case 't':
    case 'T':
        mul = 1ull << 40;
        break;
    case '\0':
        break;
    default:
        goto bad;
    }
    if (mul > 1 && p[1] != '\0') goto bad;
    if (v > UINT64_MAX / mul) goto range;
    v *= mul;
    if (v < min || v > max) goto range;
    *out = v;
    return 0;
bad:
    fprintf(stderr,
            "%s: %s: '%s' is not a size in bytes (digits with an optional K, M, G or T suffix, "
            "e.g. 4096, 512M, 2G)\n",
            cmd, opt, s);
    return -1;
range:
    fprintf(stderr, "%s: %s: %s is out of range [%llu, %llu] bytes\n", cmd, opt, s,
            (unsigned long long)min, (unsigned long long)max);
    return -1;
}

int cli_parse_float(const char *cmd, const char *opt, const char *s, float *out)
{
    const char *p = s;
    int n_int = 0, n_frac = 0;
    char *end = NULL;
    float v;

    /* The grammar first: strtof also takes blanks, "nan", "inf" and hex floats. */
    if (*p == '+' || *p == '-') p++;
    for (; isdigit((unsigned char)*p); p++)
        n_int++;
    if (*p == '.')
        for (p++; isdigit((unsigned char)*p); p++)
            n_frac++;
    if (!n_int && !n_frac) goto bad;
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-') p++;
        if (!isdigit((unsigned char)*p)) goto bad;
        while (isdigit((unsigned char)*p))
            p++;
    }
    if (*p) goto bad;
    errno = 0;
    v = strtof(s, &end);
    if (*end || !isfinite(v) || (errno == ERANGE && v != 0)) {
        fprintf(stderr, "%s: %s: %s is out of range for a float\n", cmd, opt, s);
        return -1;
    }
    *out = v;
    return 0;
bad:
    fprintf(stderr, "%s: %s: '%s' is not a decimal number\n", cmd, opt, s);
    return -1;
}

int cli_usage_error(const char *cmd)
{
    fprintf(stderr, "Try '%s --help'.\n", cmd);
    return CLI_EXIT_USAGE;
}

int cli_unexpected_arg(const char *cmd, const char *arg)
{
    fprintf(stderr, "%s: unexpected argument '%s'\n", cmd, arg);
    return cli_usage_error(cmd);
}

double cli_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

char *cli_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
        if (n + 1 == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return NULL;
    }
    if (buf) buf[n] = '\0';
    if (buf && len) *len = n;
    return buf;
}

void cli_load_progress(void *ud, uint64_t done, uint64_t total)
{
    cli_progress *p = ud;
    int step = p->step_pct > 0 ? p->step_pct : 1;
    int pct = total ? (int)(done * 100 / total) : 100;
    if (pct / step != p->last_pct / step || pct == 100) {
        if (pct != p->last_pct)
            fprintf(stderr, "\rloading model: %3d%%%s", pct, pct == 100 ? "\n" : "");
        p->last_pct = pct;
    }
}

int cli_parse_policy(const char *cmd, const char *opt, const char *name, int allow_belady,
                     pgd_policy_kind *out)
{
    static const struct {
        const char *name;
        pgd_policy_kind kind;
    } names[] = {{"lru", PGD_POLICY_LRU},           {"s3fifo", PGD_POLICY_S3FIFO},
                 {"arc", PGD_POLICY_ARC},           {"cost", PGD_POLICY_COST},
                 {"priority", PGD_POLICY_PRIORITY}, {"belady", PGD_POLICY_BELADY}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(name, names[i].name) != 0) continue;
        if (names[i].kind == PGD_POLICY_BELADY && !allow_belady) {
            fprintf(stderr,
                    "%s: %s: belady needs to know every block's next use, which only a trace "
                    "replay has (pagoda replay --policy belady); use lru, s3fifo, arc, cost or "
                    "priority\n",
                    cmd, opt);
            return -1;
        }
        *out = names[i].kind;
        return 0;
    }
    fprintf(stderr, "%s: %s: unknown policy '%s' (lru, s3fifo, arc, cost, priority%s)\n", cmd, opt,
            name, allow_belady ? " or belady" : "");
    return -1;
}

int cli_kv_option(const char *cmd, int opt, const char *arg, pe_ctx_params *cp)
{
    uint64_t v;
    switch (opt) {
    case CLI_OPT_KV_TYPE:
        if (pgd_kv_type_parse(arg, &cp->kv_type) != PGD_OK) {
            fprintf(stderr, "%s: --kv-type: '%s' is not one of f32, f16, bf16, q8_0, q4_0, kivi2\n",
                    cmd, arg);
            return -1;
        }
        return 1;
    case CLI_OPT_KV_ROTATE:
        cp->kv_rotate = 1;
        return 1;
    case CLI_OPT_DETERMINISTIC:
        cp->deterministic = 1;
        return 1;
    case CLI_OPT_KV_RESIDUAL: /* omitted: the cache's default (128) */
        if (cli_parse_u64(cmd, "--kv-residual", arg, 1, 1u << 20, &v)) return -1;
        cp->kv_residual = (uint32_t)v;
        return 1;
    case CLI_OPT_KV_SELECT:
        if (cli_parse_u64(cmd, "--kv-select-pages", arg, 0, 1u << 24, &v)) return -1;
        if (v == 1) {
            fprintf(stderr, "%s: --kv-select-pages: 1 is too few (0 = dense, else >= 2)\n", cmd);
            return -1;
        }
        cp->kv_select_pages = (uint32_t)v;
        return 1;
    case CLI_OPT_POLICY:
        return cli_parse_policy(cmd, "--policy", arg, 0, &cp->policy) ? -1 : 1;
    case CLI_OPT_KV_BUDGET:
        if (cli_parse_u64(cmd, "--kv-budget", arg, 1, 1u << 22, &v)) return -1;
        cp->budget.budget = (uint32_t)v;
        return 1;
    case CLI_OPT_KV_BUDGET_METHOD: {
        pgd_budget_method m;
        if (pgd_budget_method_parse(arg, &m) != PGD_OK || m == PGD_BUDGET_NONE) {
            fprintf(stderr,
                    "%s: --kv-budget-method: '%s' is not one of streaming, h2o, tova, snapkv, "
                    "pyramidkv, adakv\n",
                    cmd, arg);
            return -1;
        }
        cp->budget.method = m;
        return 1;
    }
    case CLI_OPT_KV_WINDOW_DENSE:
        cp->kv_window_dense = 1;
        return 1;
    case CLI_OPT_KV_WINDOW_TOKENS:
        if (cli_parse_u64(cmd, "--kv-window-tokens", arg, 1, 1ull << 36, &v)) return -1;
        cp->kv_window_tokens = v;
        return 1;
    case CLI_OPT_PAGE_TOKENS:
        if (cli_parse_u64(cmd, "--page-tokens", arg, 1, 1u << 16, &v)) return -1;
        { /* the library's rule, before the model loads */
            pgd_pool_params pp = pgd_pool_default_params();
            char why[128];
            pp.n_layers = pp.n_kv_heads = pp.head_dim = 1;
            pp.page_tokens = (uint32_t)v;
            if (pgd_pool_params_check(&pp, why, sizeof why) != PGD_OK) {
                fprintf(stderr, "%s: --page-tokens: %s\n", cmd, why);
                return -1;
            }
        }
        cp->page_tokens = (uint32_t)v;
        return 1;
    default:
        return 0;
    }
}

int cli_kv_finish(const char *cmd, pe_ctx_params *cp)
{
    if (!cp->budget.budget) {
        if (cp->budget.method != PGD_BUDGET_NONE) {
            fprintf(stderr, "%s: --kv-budget-method: needs --kv-budget TOKENS\n", cmd);
            return -1;
        }
        return 0;
    }
    pgd_budget_method m =
        cp->budget.method == PGD_BUDGET_NONE ? PGD_BUDGET_SNAPKV : cp->budget.method;
    cp->budget = pgd_budget_default_params(m, cp->budget.budget);
    char why[200];
    if (pgd_budget_params_check(&cp->budget, 1, why, sizeof why) != PGD_OK) {
        fprintf(stderr, "%s: --kv-budget %u (%s): %s\n", cmd, cp->budget.budget,
                pgd_budget_method_name(m), why);
        return -1;
    }
    return 0;
}
