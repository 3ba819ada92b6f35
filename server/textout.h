/* SPDX-License-Identifier: MIT */
/*
 * textout.h - turns one request's generated tokens into the text the client sees:
 * incremental detokenization on UTF-8 boundaries (pe_detok), text-level stop sequences,
 * and the hold-back that streaming needs. Callers: the server's HTTP threads, the tests.
 *
 *   tokens --pe_detok--> text[0 .. len)          everything decoded so far
 *                        text[0 .. emitted)      handed to the client already
 *                        text[emitted .. ready)  safe to hand out now
 *                        text[ready .. len)      held back: a stop string may start here
 *
 * Invariants: emitted <= ready <= len. A stop string is never part of the text: when one
 * matches, the text is cut where it starts and stopped is set (no more tokens are taken).
 * While not finished, text[ready..len) is the longest suffix of the text that is a proper
 * prefix of some stop string, so a stream never shows the start of a stop sequence that
 * later completes. After ps_textout_finish (or a stop), ready == len.
 *
 * One owner thread; plain data (init/deinit).
 */
#ifndef PS_TEXTOUT_H
#define PS_TEXTOUT_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

#define PS_MAX_STOPS 8 /* 4 from the request plus the chat template's turn ends */

typedef struct ps_textout {
    pe_detok dt;
    char *text; /* [cap] the decoded text, NUL-terminated */
    size_t len, cap, emitted, ready;
    char *stops[PS_MAX_STOPS]; /* owned copies */
    size_t stop_len[PS_MAX_STOPS];
    size_t n_stops;
    char *piece; /* [piece_cap] pe_detok output scratch */
    size_t piece_cap;
    uint32_t n_tokens; /* tokens taken (up to and including a stop's end) */
    int stopped;       /* a stop string matched */
    int finished;      /* ps_textout_finish was called */
} ps_textout;

/* Starts a text for vocabulary v (borrowed; must outlive t) with stops[0..n_stops)
 * (copied; empty strings are ignored). Returns 0, PGD_EINVAL (more than PS_MAX_STOPS) or
 * PGD_ENOMEM (t is then deinit-safe). */
int ps_textout_init(ps_textout *t, const pe_vocab *v, const char *const *stops, size_t n_stops);
void ps_textout_deinit(ps_textout *t);

/* Says that the text continues prompt[0..n) (a completion, not a chat message): the
 * tokenizer's leading-space rule (tokenizer.h) then applies only when the prompt renders
 * no text (only BOS / control tokens), so a continuation keeps the space of its first
 * piece, as llama.cpp's server and the OpenAI API return it ("Lily wanted" -> " to play").
 * Call before the first push. */
void ps_textout_continue(ps_textout *t, const int32_t *prompt, size_t n);

/* Appends token tok. Returns 1 when a stop string completed (the text now ends before it;
 * later pushes are ignored and return 1), 0 otherwise, PGD_ENOMEM. */
int ps_textout_push(ps_textout *t, int32_t tok);

/* Ends the text: flushes an incomplete UTF-8 sequence (as U+FFFD) and releases the held
 * back tail (unless a stop matched, which already cut it). Returns 0 or PGD_ENOMEM. */
int ps_textout_finish(ps_textout *t);

/* Returns the bytes that are ready and not yet handed out (*p borrowed until the next
 * call on t) and marks them handed out. */
size_t ps_textout_take(ps_textout *t, const char **p);

#endif /* PS_TEXTOUT_H */
