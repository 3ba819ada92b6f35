/* SPDX-License-Identifier: MIT */
/*
 * log.c - formats a message and hands it to the user's log hook (never prints itself).
 */
#include <stdarg.h>
#include <stdio.h>

#include "pgd_int.h"

void pgd__logf(const pgd__log *lg, int level, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    if (!lg || !lg->fn) return;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    lg->fn(lg->ud, level, buf);
}
