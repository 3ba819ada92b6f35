/* SPDX-License-Identifier: MIT */
/*
 * buf.h - a growable byte buffer for the server: response bodies, SSE chunks, the metrics
 * page. Callers: every server/ module. Plain data (init/deinit); one owner thread.
 *
 * Invariant: data[len] == '\0' whenever data != NULL, so a buffer of text is a C string.
 * An allocation failure is sticky: oom is set, later appends do nothing, and the caller
 * checks oom once at the end instead of after every append.
 */
#ifndef PS_BUF_H
#define PS_BUF_H

#include <stddef.h>

typedef struct ps_buf {
    char *data; /* [cap], NUL-terminated; NULL until the first append */
    size_t len; /* bytes in use */
    size_t cap; /* bytes allocated */
    int oom;    /* an append failed; contents are truncated */
} ps_buf;

void ps_buf_init(ps_buf *b);
void ps_buf_deinit(ps_buf *b);
/* Empties the buffer, keeping its memory. */
void ps_buf_reset(ps_buf *b);
/* Appends n bytes. Returns 0, or -1 (and sets oom) when memory runs out. */
int ps_buf_add(ps_buf *b, const void *p, size_t n);
int ps_buf_adds(ps_buf *b, const char *s);
/* Appends printf-formatted text. Returns 0 or -1 (oom). */
int ps_buf_printf(ps_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Drops the first n bytes (n <= len), moving the rest to the front. */
void ps_buf_consume(ps_buf *b, size_t n);

#endif /* PS_BUF_H */
