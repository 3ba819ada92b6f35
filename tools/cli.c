/* SPDX-License-Identifier: MIT */
/*
 * cli.c - helpers shared by the commands of the `pagoda` CLI (see cli.h).
 */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
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

int cli_usage_error(const char *cmd)
{
    fprintf(stderr, "Try '%s --help'.\n", cmd);
    return CLI_EXIT_USAGE;
}

double cli_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
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
    case CLI_OPT_PAGE_TOKENS:
        if (cli_parse_u64(cmd, "--page-tokens", arg, 1, 1u << 16, &v)) return -1;
        if (v & (v - 1)) {
            fprintf(stderr, "%s: --page-tokens: %llu is not a power of two\n", cmd,
                    (unsigned long long)v);
            return -1;
        }
        cp->page_tokens = (uint32_t)v;
        return 1;
    default:
        return 0;
    }
}
