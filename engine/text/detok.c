/* SPDX-License-Identifier: MIT */
/*
 * detok.c - token ids -> text: pe_token_to_piece (llama.cpp's token_to_piece, from the
 * pieces vocab.c renders once per token) and the streaming decoder pe_detok_*, which only
 * emits whole UTF-8 characters and applies the leading-space rule of tokenizer.h.
 *
 *   piece bytes --> [carry: an incomplete sequence, up to 3 bytes] --> complete characters
 *                   a byte that cannot continue it ends it as U+FFFD (strict UTF-8,
 *                   pe_utf8_seq_len / pe_utf8_continues)
 *
 * Callers: see tokenizer.h. Invariants: the output of push/flush is always valid UTF-8;
 * push writes nothing and changes nothing when the output does not fit.
 */
#include <string.h>

#include "tokenizer_int.h"
#include "unicode.h"

/* ---- pieces ---- */

size_t pe_token_to_piece_ex(const pe_vocab *v, int32_t tok, unsigned flags, char *buf,
                            size_t buflen)
{
    size_t n;
    if (tok < 0 || (uint32_t)tok >= v->n_tokens) return 0;
    if (!(flags & PE_PIECE_SPECIAL) && (v->attr[tok] & (A_UNKNOWN | A_CONTROL))) return 0;
    n = (size_t)(v->piece_off[tok + 1] - v->piece_off[tok]);
    if (buf) memcpy(buf, v->piece + v->piece_off[tok], n < buflen ? n : buflen);
    return n;
}

size_t pe_token_to_piece(const pe_vocab *v, int32_t tok, char *buf, size_t buflen)
{
    return pe_token_to_piece_ex(v, tok, 0, buf, buflen);
}

/* ---- streaming decode ---- */

void pe_detok_init(pe_detok *d, const pe_vocab *v)
{
    memset(d, 0, sizeof *d);
    d->v = v;
    d->strip_space = v->add_space_prefix;
}

/* Writes n bytes at *pos when they fit (always counts them). */
static void put(char *out, size_t outlen, size_t *pos, const void *p, size_t n)
{
    if (out && *pos + n <= outlen) memcpy(out + *pos, p, n);
    *pos += n;
}

static const char replacement[3] = {'\xef', '\xbf', '\xbd'};

/* Feeds bytes through the UTF-8 assembler of d; returns the bytes produced. */
static size_t feed(pe_detok *d, const uint8_t *p, size_t n, char *out, size_t outlen)
{
    size_t i, pos = 0;
    for (i = 0; i < n; i++) {
        uint8_t b = p[i];
        size_t sl;
        if (d->n_pend > 0) {
            if (pe_utf8_continues(d->pend, d->n_pend, b)) {
                d->pend[d->n_pend++] = b;
                if (d->n_pend == pe_utf8_seq_len(d->pend[0])) {
                    put(out, outlen, &pos, d->pend, d->n_pend);
                    d->n_pend = 0;
                }
                continue;
            }
            put(out, outlen, &pos, replacement, 3);
            d->n_pend = 0;
        }
        sl = pe_utf8_seq_len(b);
        if (sl == 1) {
            put(out, outlen, &pos, &b, 1);
        } else if (sl == 0) {
            put(out, outlen, &pos, replacement, 3);
        } else {
            d->pend[0] = b;
            d->n_pend = 1;
        }
    }
    return pos;
}

/* Decodes one token into out (writing what fits); always advances the state. */
static size_t push_impl(pe_detok *d, int32_t tok, char *out, size_t outlen)
{
    const pe_vocab *v = d->v;
    const uint8_t *p;
    size_t n;
    if (tok < 0 || (uint32_t)tok >= v->n_tokens) return 0;
    if (!(d->flags & PE_PIECE_SPECIAL) && (v->attr[tok] & (A_UNKNOWN | A_CONTROL))) return 0;
    p = (const uint8_t *)v->piece + v->piece_off[tok];
    n = (size_t)(v->piece_off[tok + 1] - v->piece_off[tok]);
    if (n == 0) return 0;
    if (d->strip_space) {
        d->strip_space = 0;
        if (p[0] == ' ') {
            p++;
            n--;
        }
    }
    return feed(d, p, n, out, outlen);
}

size_t pe_detok_push(pe_detok *d, int32_t tok, char *out, size_t outlen)
{
    pe_detok probe = *d;
    size_t need = push_impl(&probe, tok, NULL, 0);
    if (need > outlen) return need;
    return push_impl(d, tok, out, outlen);
}

size_t pe_detok_flush(pe_detok *d, char *out, size_t outlen)
{
    if (d->n_pend == 0) return 0;
    if (outlen < 3) return 3;
    memcpy(out, replacement, 3);
    d->n_pend = 0;
    return 3;
}

size_t pe_detokenize(const pe_vocab *v, const int32_t *tokens, size_t n, char *out, size_t outlen)
{
    pe_detok d;
    size_t i, pos = 0;
    pe_detok_init(&d, v);
    for (i = 0; i < n; i++) {
        size_t room = pos < outlen ? outlen - pos : 0;
        pos += push_impl(&d, tokens[i], room ? out + pos : NULL, room);
    }
    if (d.n_pend > 0) {
        put(out, outlen, &pos, replacement, 3);
        d.n_pend = 0;
    }
    return pos;
}
