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
