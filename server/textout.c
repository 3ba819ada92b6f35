/* SPDX-License-Identifier: MIT */
/*
 * textout.c - generated tokens to client text with stop sequences (see textout.h).
 * Cost per token: O(piece + sum of stop lengths^2) for the match and the hold-back scan,
 * which is nothing next to a forward pass (stops are at most a few dozen bytes).
 */
#include "textout.h"

#include <stdlib.h>
#include <string.h>

#include <pagoda/pagoda.h>

int ps_textout_init(ps_textout *t, const pe_vocab *v, const char *const *stops, size_t n_stops)
{
    memset(t, 0, sizeof *t);
    pe_detok_init(&t->dt, v);
    t->piece_cap = 3 * (pe_vocab_max_piece(v) + 4) + 16;
    t->piece = malloc(t->piece_cap);
    t->cap = 256;
    t->text = malloc(t->cap);
    if (!t->piece || !t->text) return PGD_ENOMEM;
    t->text[0] = '\0';
    for (size_t i = 0; i < n_stops; i++) {
        if (!stops[i] || !stops[i][0]) continue;
        if (t->n_stops == PS_MAX_STOPS) return PGD_EINVAL;
        size_t n = strlen(stops[i]);
        t->stops[t->n_stops] = malloc(n + 1);
        if (!t->stops[t->n_stops]) return PGD_ENOMEM;
        memcpy(t->stops[t->n_stops], stops[i], n + 1);
        t->stop_len[t->n_stops++] = n;
    }
    return PGD_OK;
}

void ps_textout_continue(ps_textout *t, const int32_t *prompt, size_t n)
{
    for (size_t i = 0; i < n && t->dt.strip_space; i++)
        if (pe_token_to_piece(t->dt.v, prompt[i], NULL, 0) > 0) t->dt.strip_space = 0;
}

void ps_textout_deinit(ps_textout *t)
{
    for (size_t i = 0; i < t->n_stops; i++)
        free(t->stops[i]);
    free(t->piece);
    free(t->text);
    memset(t, 0, sizeof *t);
}

static int append(ps_textout *t, const char *p, size_t n)
{
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap * 2;
        while (cap < t->len + n + 1)
            cap *= 2;
        char *d = realloc(t->text, cap);
        if (!d) return PGD_ENOMEM;
        t->text = d;
        t->cap = cap;
    }
    memcpy(t->text + t->len, p, n);
    t->len += n;
    t->text[t->len] = '\0';
    return PGD_OK;
}

/* Returns the offset of the first occurrence of needle in hay[from..n), or (size_t)-1. */
static size_t find(const char *hay, size_t n, size_t from, const char *needle, size_t m)
{
    if (m > n) return (size_t)-1;
    for (size_t i = from; i + m <= n; i++)
        if (hay[i] == needle[0] && memcmp(hay + i, needle, m) == 0) return i;
    return (size_t)-1;
}

/* Length of the longest suffix of the text that is a proper prefix of some stop string. */
static size_t held_back(const ps_textout *t)
{
    size_t best = 0;
    for (size_t s = 0; s < t->n_stops; s++) {
        size_t m = t->stop_len[s] - 1;
        if (m > t->len) m = t->len;
        for (size_t k = m; k > best; k--) {
            if (memcmp(t->text + t->len - k, t->stops[s], k) == 0) {
                best = k;
                break;
            }
        }
    }
    return best;
}

/* Looks for a stop string that ends in the bytes appended after old_len; cuts the text at
 * the earliest match. Returns 1 on a match. */
static int match_stops(ps_textout *t, size_t old_len)
{
    size_t cut = (size_t)-1;
    for (size_t s = 0; s < t->n_stops; s++) {
        size_t m = t->stop_len[s];
        size_t from = old_len >= m - 1 ? old_len - (m - 1) : 0;
        size_t at = find(t->text, t->len, from, t->stops[s], m);
        if (at < cut) cut = at;
    }
    if (cut == (size_t)-1) return 0;
    if (cut < t->emitted) cut = t->emitted; /* cannot happen: held-back covers it */
    t->len = cut;
    t->text[cut] = '\0';
    t->ready = cut;
    t->stopped = 1;
    return 1;
}

int ps_textout_push(ps_textout *t, int32_t tok)
{
    if (t->stopped) return 1;
    if (t->finished) return 0;
    size_t n = pe_detok_push(&t->dt, tok, t->piece, t->piece_cap);
    if (n > t->piece_cap) return PGD_ENOMEM; /* cannot happen: piece_cap is the bound */
    t->n_tokens++;
    size_t old = t->len;
    if (n && append(t, t->piece, n)) return PGD_ENOMEM;
    if (n && t->n_stops && match_stops(t, old)) return 1;
    t->ready = t->len - held_back(t);
    if (t->ready < t->emitted) t->ready = t->emitted;
    return 0;
}

int ps_textout_finish(ps_textout *t)
{
    if (t->finished) return PGD_OK;
    t->finished = 1;
    if (t->stopped) return PGD_OK;
    size_t n = pe_detok_flush(&t->dt, t->piece, t->piece_cap);
    if (n > t->piece_cap) n = 0;
    if (n && append(t, t->piece, n)) return PGD_ENOMEM;
    t->ready = t->len;
    return PGD_OK;
}

size_t ps_textout_take(ps_textout *t, const char **p)
{
    size_t n = t->ready - t->emitted;
    *p = t->text + t->emitted;
    t->emitted = t->ready;
    return n;
}
