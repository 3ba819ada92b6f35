/* SPDX-License-Identifier: MIT */
/*
 * buf.c - growable byte buffer (see buf.h). Capacity doubles, so n appends cost O(total).
 */
#include "buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ps_buf_init(ps_buf *b)
{
    memset(b, 0, sizeof *b);
}

void ps_buf_deinit(ps_buf *b)
{
    free(b->data);
    memset(b, 0, sizeof *b);
}

void ps_buf_reset(ps_buf *b)
{
    b->len = 0;
    if (b->data) b->data[0] = '\0';
}

/* Makes room for n more bytes plus the NUL. Returns 0 or -1. */
static int reserve(ps_buf *b, size_t n)
{
    if (b->oom) return -1;
    if (b->len + n + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) {
        if (cap > ((size_t)-1) / 2) {
            b->oom = 1;
            return -1;
        }
        cap *= 2;
    }
    char *d = realloc(b->data, cap);
    if (!d) {
        b->oom = 1;
        return -1;
    }
    b->data = d;
    b->cap = cap;
    return 0;
}

int ps_buf_add(ps_buf *b, const void *p, size_t n)
{
    if (reserve(b, n)) return -1;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

int ps_buf_adds(ps_buf *b, const char *s)
{
    return ps_buf_add(b, s, strlen(s));
}

int ps_buf_printf(ps_buf *b, const char *fmt, ...)
{
    va_list ap;
    char small[256];
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->oom = 1;
        return -1;
    }
    if ((size_t)n < sizeof small) return ps_buf_add(b, small, (size_t)n);
    if (reserve(b, (size_t)n)) return -1;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

void ps_buf_consume(ps_buf *b, size_t n)
{
    if (n >= b->len) {
        ps_buf_reset(b);
        return;
    }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
    b->data[b->len] = '\0';
}
