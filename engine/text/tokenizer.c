/* SPDX-License-Identifier: MIT */
/*
 * tokenizer.c - GGUF vocabularies, tokenization and decoding, a C port of llama.cpp's
 * src/llama-vocab.cpp (llm_tokenizer_spm, llm_tokenizer_bpe, tokenizer_st_partition,
 * token_to_piece) for the "llama" and "gpt2" tokenizer models.
 *
 *   text --partition--> [raw | special id | raw ...]      special tokens found by substring
 *                                                         search, longest first (llama.cpp)
 *        raw, SentencePiece:  " " + text, ' ' -> "▁", split into UTF-8 characters, merge
 *                             the adjacent pair whose concatenation is the highest-scoring
 *                             token (ties: leftmost) until none is; a final piece that is
 *                             not a token becomes <0xNN> byte tokens
 *        raw, byte-level BPE: pre-tokenize (tokenizer_pre.c) into byte-encoded words; in
 *                             each, merge the pair of lowest merge rank (ties: leftmost)
 *
 * Both merge loops use a binary heap of candidate pairs with lazy deletion (a popped pair
 * whose sides changed since it was pushed is skipped), so a text of n characters costs
 * O(n log n), never O(n^2): 1 MB of text takes 0.1-0.5 s on the 2-core CI machine with
 * the Llama-2 and GPT-2 vocabularies (test_tokenizer's test_big_inputs prints the times).
 *
 * Callers: see tokenizer.h. Invariants: a pe_vocab is never written after pe_vocab_create
 * returns; token texts are unique (a duplicate is refused); every id stored in it (bos,
 * eos, byte tokens, special list) is -1 ("none") or in [0, n_tokens).
 */
#include "tokenizer.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pagoda/pagoda.h>

#include "tokenizer_pre.h"
#include "unicode.h"

/* Token attributes (llama.cpp's llama_token_attr, in our own bits). */
enum {
    A_UNKNOWN = 1u << 0,
    A_UNUSED = 1u << 1,
    A_NORMAL = 1u << 2,
    A_CONTROL = 1u << 3,
    A_USER_DEFINED = 1u << 4,
    A_BYTE = 1u << 5,
    A_LSTRIP = 1u << 6,
    A_RSTRIP = 1u << 7,
    A_EOG = 1u << 8, /* not an attribute in llama.cpp: its special_eog_ids set */
};

/* pe_tokenize's input limit. Escaping ' ' as "▁" triples a text at most and byte-level
 * encoding multiplies it by 6 at most, so symbol offsets fit uint32 and indices int32. */
#define MAX_TEXT_BYTES (256u << 20)

struct pe_vocab {
    int spm; /* 1: "llama" (SentencePiece), 0: "gpt2" (byte-level BPE) */
    uint32_t n_tokens;
    char *text;          /* all token texts, back to back */
    uint64_t *text_off;  /* [n_tokens + 1] */
    float *scores;       /* [n_tokens] */
    uint16_t *attr;      /* [n_tokens] A_* bits */
    char *piece;         /* rendered pieces (control tokens as their text) */
    uint64_t *piece_off; /* [n_tokens + 1] */
    size_t max_piece;

    int32_t *tok_tab; /* open addressing: token text -> id, -1 empty */
    uint64_t tok_mask;

    uint32_t n_merges;
    char *merge_text;    /* merge strings, back to back */
    uint64_t *merge_off; /* [n_merges + 1] */
    int32_t *merge_tab;  /* open addressing: merge string -> rank, -1 empty */
    uint64_t merge_mask;

    int32_t byte_tok[256]; /* SentencePiece byte fallback: <0xNN> (or the byte), -1 none */
    int32_t bos, eos, unk, eot, eom, pad;
    int add_bos, add_eos, add_space_prefix;

    int32_t *special; /* ids partitioned out of raw text, longest text first */
    uint32_t n_special;

    pe_pretok *pre; /* gpt2 only */
    int ignore_merges;
};

/* ---- hashing ---- */

static uint64_t hash_bytes(const char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    size_t i;
    for (i = 0; i < n; i++) {
        h ^= (uint8_t)p[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

static uint64_t table_size(uint64_t n)
{
    uint64_t c = 16;
    while (c < 2 * n)
        c *= 2;
    return c;
}

static const char *tok_text(const pe_vocab *v, int32_t id, size_t *len)
{
    *len = (size_t)(v->text_off[id + 1] - v->text_off[id]);
    return v->text + v->text_off[id];
}

/* Returns the id of the token whose text is s[0..n), or -1. */
static int32_t tok_find(const pe_vocab *v, const char *s, size_t n)
{
    uint64_t i = hash_bytes(s, n) & v->tok_mask;
    for (;;) {
        int32_t id = v->tok_tab[i];
        size_t len;
        const char *t;
        if (id < 0) return -1;
        t = tok_text(v, id, &len);
        if (len == n && memcmp(t, s, n) == 0) return id;
        i = (i + 1) & v->tok_mask;
    }
}

/* Returns the rank of merge string s[0..n) ("left right"), or -1. */
static int32_t merge_find(const pe_vocab *v, const char *s, size_t n)
{
    uint64_t i;
    if (!v->merge_tab) return -1;
    i = hash_bytes(s, n) & v->merge_mask;
    for (;;) {
        int32_t r = v->merge_tab[i];
        size_t len;
        if (r < 0) return -1;
        len = (size_t)(v->merge_off[r + 1] - v->merge_off[r]);
        if (len == n && memcmp(v->merge_text + v->merge_off[r], s, n) == 0) return r;
        i = (i + 1) & v->merge_mask;
    }
}

/* ---- growable token list ---- */

typedef struct tokvec {
    int32_t *ids;
    size_t n, cap;
    int oom;
} tokvec;

static void tv_push(tokvec *tv, int32_t id)
{
    if (tv->n == tv->cap) {
        size_t c = tv->cap ? tv->cap * 2 : 64;
        int32_t *p = realloc(tv->ids, c * sizeof *p);
        if (!p) {
            tv->oom = 1;
            return;
        }
        tv->ids = p;
        tv->cap = c;
    }
    tv->ids[tv->n++] = id;
}

/* ---- merge heap (shared by both tokenizers) ----
 * A pair (left, right) of adjacent symbols; key1 orders first (higher is better), then
 * the smaller left index. SentencePiece: key1 = score. BPE: key1 = -rank. */

typedef struct pair {
    float key;    /* SentencePiece score */
    int32_t rank; /* BPE merge rank */
    int32_t left, right;
    uint32_t size; /* bytes of left + right when pushed */
} pair;

typedef struct heap {
    pair *a;
    size_t n, cap;
    int by_rank; /* 1: lowest rank first; 0: highest score first */
    int oom;
} heap;

/* Returns 1 if x comes out of the heap before y. */
static int before(const heap *h, const pair *x, const pair *y)
{
    if (h->by_rank) {
        if (x->rank != y->rank) return x->rank < y->rank;
    } else {
        if (x->key != y->key) return x->key > y->key;
    }
    return x->left < y->left;
}

static void heap_push(heap *h, pair p)
{
    size_t i;
    if (h->n == h->cap) {
        size_t c = h->cap ? h->cap * 2 : 64;
        pair *np = realloc(h->a, c * sizeof *np);
        if (!np) {
            h->oom = 1;
            return;
        }
        h->a = np;
        h->cap = c;
    }
    i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!before(h, &p, &h->a[parent])) break;
        h->a[i] = h->a[parent];
        i = parent;
    }
    h->a[i] = p;
}

static pair heap_pop(heap *h)
{
    pair top = h->a[0], last = h->a[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && before(h, &h->a[c + 1], &h->a[c])) c++;
        if (!before(h, &h->a[c], &last)) break;
        h->a[i] = h->a[c];
        i = c;
    }
    if (h->n > 0) h->a[i] = last;
    return top;
}

/* ---- symbols (a doubly linked list over the text, in an array) ---- */

typedef struct sym {
    int32_t prev, next;
    uint32_t off, n; /* n == 0: merged into its left neighbour */
} sym;

typedef struct session {
    sym *s;
    size_t n, cap;
    heap h;
    char *key; /* BPE: "left right" scratch */
    size_t key_cap;
    pe_words words;
} session;

static void session_deinit(session *ss)
{
    free(ss->s);
    free(ss->h.a);
    free(ss->key);
    pe_words_deinit(&ss->words);
}

/* Splits t[0..n) into UTF-8 characters by lead byte (llama.cpp: no validation; the last
 * one is cut at the end of the text). Returns 0 or -1 (ENOMEM). */
static int split_chars(session *ss, const char *t, uint32_t n)
{
    uint32_t off = 0;
    ss->n = 0;
    if (ss->cap < n) {
        sym *p = realloc(ss->s, (size_t)n * sizeof *p);
        if (!p) return -1;
        ss->s = p;
        ss->cap = n;
    }
    while (off < n) {
        uint32_t len = (uint32_t)pe_utf8_len((uint8_t)t[off]);
        sym *y = &ss->s[ss->n];
        if (len > n - off) len = n - off;
        y->prev = (int32_t)ss->n - 1;
        y->off = off;
        y->n = len;
        off += len;
        y->next = off == n ? -1 : (int32_t)ss->n + 1;
        ss->n++;
    }
    return 0;
}

/* Merges symbol r into its left neighbour l. */
static void merge_syms(session *ss, int32_t l, int32_t r)
{
    sym *a = &ss->s[l], *b = &ss->s[r];
    a->n += b->n;
    b->n = 0;
    a->next = b->next;
    if (b->next >= 0) ss->s[b->next].prev = l;
}

/* ---- SentencePiece ---- */

static void spm_try_pair(const pe_vocab *v, session *ss, const char *t, int32_t l, int32_t r)
{
    pair p;
    int32_t id;
    if (l < 0 || r < 0) return;
    p.size = ss->s[l].n + ss->s[r].n;
    id = tok_find(v, t + ss->s[l].off, p.size);
    if (id < 0) return;
    p.key = v->scores[id];
    p.rank = 0;
    p.left = l;
    p.right = r;
    heap_push(&ss->h, p);
}

/* llm_tokenizer_spm_session::tokenize on the escaped text t[0..n) (n > 0). */
static int spm_tokenize(const pe_vocab *v, session *ss, const char *t, uint32_t n, tokvec *out)
{
    int32_t i;
    if (split_chars(ss, t, n)) return -1;
    ss->h.n = 0;
    ss->h.by_rank = 0;
    for (i = 1; i < (int32_t)ss->n; i++)
        spm_try_pair(v, ss, t, i - 1, i);
    while (ss->h.n > 0 && !ss->h.oom) {
        pair p = heap_pop(&ss->h);
        sym *l = &ss->s[p.left], *r = &ss->s[p.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != p.size) continue; /* stale */
        merge_syms(ss, p.left, p.right);
        spm_try_pair(v, ss, t, ss->s[p.left].prev, p.left);
        spm_try_pair(v, ss, t, p.left, ss->s[p.left].next);
    }
    if (ss->h.oom) return -1;
    for (i = 0; i != -1; i = ss->s[i].next) {
        const sym *y = &ss->s[i];
        int32_t id = tok_find(v, t + y->off, y->n);
        uint32_t k;
        if (id >= 0) {
            tv_push(out, id);
            continue;
        }
        /* Byte fallback. llama.cpp throws when a byte has no token; we use UNK then. */
        for (k = 0; k < y->n; k++) {
            int32_t b = v->byte_tok[(uint8_t)t[y->off + k]];
            if (b < 0) b = v->unk;
            if (b >= 0) tv_push(out, b);
        }
    }
    return 0;
}

/* ---- byte-level BPE ---- */

static void bpe_try_pair(const pe_vocab *v, session *ss, const char *t, int32_t l, int32_t r)
{
    const sym *a, *b;
    size_t need;
    pair p;
    if (l < 0 || r < 0) return;
    a = &ss->s[l];
    b = &ss->s[r];
    need = (size_t)a->n + 1 + b->n;
    if (need > ss->key_cap) {
        char *k = realloc(ss->key, need * 2);
        if (!k) {
            ss->h.oom = 1;
            return;
        }
        ss->key = k;
        ss->key_cap = need * 2;
    }
    memcpy(ss->key, t + a->off, a->n);
    ss->key[a->n] = ' ';
    memcpy(ss->key + a->n + 1, t + b->off, b->n);
    p.rank = merge_find(v, ss->key, need);
    if (p.rank < 0) return;
    p.key = 0;
    p.left = l;
    p.right = r;
    p.size = a->n + b->n;
    heap_push(&ss->h, p);
}

/* llm_tokenizer_bpe_session::tokenize for one pre-tokenized word t[0..n) (n > 0). */
static int bpe_word(const pe_vocab *v, session *ss, const char *t, uint32_t n, tokvec *out)
{
    int32_t i;
    if (v->ignore_merges) {
        int32_t id = tok_find(v, t, n);
        if (id >= 0) {
            tv_push(out, id);
            return 0;
        }
    }
    if (split_chars(ss, t, n)) return -1;
    ss->h.n = 0;
    ss->h.by_rank = 1;
    for (i = 1; i < (int32_t)ss->n; i++)
        bpe_try_pair(v, ss, t, i - 1, i);
    while (ss->h.n > 0 && !ss->h.oom) {
        pair p = heap_pop(&ss->h);
        sym *l = &ss->s[p.left], *r = &ss->s[p.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != p.size) continue; /* stale */
        merge_syms(ss, p.left, p.right);
        bpe_try_pair(v, ss, t, ss->s[p.left].prev, p.left);
        bpe_try_pair(v, ss, t, p.left, ss->s[p.left].next);
    }
    if (ss->h.oom) return -1;
    for (i = 0; i != -1; i = ss->s[i].next) {
        const sym *y = &ss->s[i];
        int32_t id = tok_find(v, t + y->off, y->n);
        uint32_t k;
        if (id >= 0) {
            tv_push(out, id);
            continue;
        }
        /* llama.cpp looks each byte of the (encoded) text up on its own and drops misses. */
        for (k = 0; k < y->n; k++) {
            int32_t b = tok_find(v, t + y->off + k, 1);
            if (b >= 0) tv_push(out, b);
        }
    }
    return 0;
}

/* ---- special-token partition (llama.cpp tokenizer_st_partition) ---- */

typedef struct frag {
    int32_t tok; /* -1: raw text [off, off + len) */
    size_t off, len;
} frag;

typedef struct fragvec {
    frag *a;
    size_t n, cap;
} fragvec;

static int fv_push(fragvec *fv, int32_t tok, size_t off, size_t len)
{
    if (fv->n == fv->cap) {
        size_t c = fv->cap ? fv->cap * 2 : 16;
        frag *p = realloc(fv->a, c * sizeof *p);
        if (!p) return -1;
        fv->a = p;
        fv->cap = c;
    }
    fv->a[fv->n].tok = tok;
    fv->a[fv->n].off = off;
    fv->a[fv->n].len = len;
    fv->n++;
    return 0;
}

/* Returns the first occurrence of needle[0..m) (m > 0) in hay[0..n), or NULL (memmem is
 * a GNU extension). memchr finds the candidates, so this is fast on real text. */
static const char *find_bytes(const char *hay, size_t n, const char *needle, size_t m)
{
    const char *p = hay, *end = hay + n;
    while ((size_t)(end - p) >= m) {
        p = memchr(p, needle[0], (size_t)(end - p) - m + 1);
        if (!p) return NULL;
        if (memcmp(p, needle, m) == 0) return p;
        p++;
    }
    return NULL;
}

/* Splits the raw fragments of *fv around every occurrence of special token id. */
static int partition_one(const pe_vocab *v, const char *text, int32_t id, fragvec *fv, fragvec *tmp)
{
    size_t tl, i;
    const char *t = tok_text(v, id, &tl);
    uint16_t attr = v->attr[id];
    tmp->n = 0;
    for (i = 0; i < fv->n; i++) {
        const frag *f = &fv->a[i];
        size_t pos, end;
        if (f->tok >= 0) {
            if (fv_push(tmp, f->tok, 0, 0)) return -1;
            continue;
        }
        pos = f->off;
        end = f->off + f->len;
        for (;;) {
            const char *m = find_bytes(text + pos, end - pos, t, tl);
            size_t mpos, left;
            if (!m) break;
            mpos = (size_t)(m - text);
            left = mpos - pos;
            if (attr & A_LSTRIP) {
                while (left > 0 && isspace((unsigned char)text[pos + left - 1]))
                    left--;
            }
            if (left > 0 && fv_push(tmp, -1, pos, left)) return -1;
            if (fv_push(tmp, id, 0, 0)) return -1;
            pos = mpos + tl;
            if (attr & A_RSTRIP) {
                while (pos < end && isspace((unsigned char)text[pos]))
                    pos++;
            }
        }
        if (pos < end && fv_push(tmp, -1, pos, end - pos)) return -1;
    }
    {
        fragvec sw = *fv;
        *fv = *tmp;
        *tmp = sw;
    }
    return 0;
}

/* ---- tokenize ---- */

int64_t pe_tokenize(const pe_vocab *v, const char *text, size_t len, int add_special,
                    int parse_special, int32_t *out, size_t max_out)
{
    fragvec fv = {0}, tmp = {0};
    tokvec tv = {0};
    session ss;
    char *buf = NULL;
    size_t i, buf_cap = 0;
    int64_t rc = PGD_ENOMEM;
    int prev_special = 1;

    memset(&ss, 0, sizeof ss);
    if (len > MAX_TEXT_BYTES) return PGD_EINVAL;
    if (len > 0) {
        if (fv_push(&fv, -1, 0, len)) goto out;
        for (i = 0; i < v->n_special && fv.n > 0; i++) {
            int32_t id = v->special[i];
            if (!parse_special && (v->attr[id] & (A_CONTROL | A_UNKNOWN))) continue;
            if (partition_one(v, text, id, &fv, &tmp)) goto out;
        }
    }
    if (add_special && v->add_bos) tv_push(&tv, v->bos);
    for (i = 0; i < fv.n; i++) {
        const frag *f = &fv.a[i];
        if (f->tok >= 0) {
            tv_push(&tv, f->tok);
            prev_special = 1;
            continue;
        }
        if (v->spm) {
            /* " " prefix after the start or a special token, then ' ' -> "▁" (3 bytes) */
            size_t need = 3 * (f->len + 1), k, n = 0;
            if (need > buf_cap) {
                char *nb = realloc(buf, need);
                if (!nb) goto out;
                buf = nb;
                buf_cap = need;
            }
            if (v->add_space_prefix && prev_special) {
                memcpy(buf, "\xe2\x96\x81", 3);
                n = 3;
            }
            for (k = 0; k < f->len; k++) {
                char c = text[f->off + k];
                if (c == ' ') {
                    memcpy(buf + n, "\xe2\x96\x81", 3);
                    n += 3;
                } else {
                    buf[n++] = c;
                }
            }
            if (spm_tokenize(v, &ss, buf, (uint32_t)n, &tv)) goto out;
        } else {
            size_t w, start = 0;
            int src = pe_pretok_split(v->pre, text + f->off, f->len, &ss.words);
            if (src == -2) {
                rc = PGD_EINVAL;
                goto out;
            }
            if (src) goto out;
            for (w = 0; w < ss.words.n; w++) {
                size_t end = ss.words.ends[w];
                if (end > start &&
                    bpe_word(v, &ss, ss.words.buf + start, (uint32_t)(end - start), &tv))
                    goto out;
                start = end;
            }
        }
        prev_special = 0;
    }
    if (add_special && v->add_eos) tv_push(&tv, v->eos);
    if (tv.oom) goto out;
    if (out && tv.n > 0 && max_out > 0)
        memcpy(out, tv.ids, (tv.n < max_out ? tv.n : max_out) * sizeof *out);
    rc = (int64_t)tv.n;
out:
    free(fv.a);
    free(tmp.a);
    free(tv.ids);
    free(buf);
    session_deinit(&ss);
    return rc;
}

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

/* ---- accessors ---- */

uint32_t pe_vocab_n_tokens(const pe_vocab *v)
{
    return v->n_tokens;
}

int32_t pe_vocab_bos(const pe_vocab *v)
{
    return v->bos;
}

int32_t pe_vocab_eos(const pe_vocab *v)
{
    return v->eos;
}

int32_t pe_vocab_eot(const pe_vocab *v)
{
    return v->eot;
}

int32_t pe_vocab_unk(const pe_vocab *v)
{
    return v->unk;
}

int pe_vocab_add_bos(const pe_vocab *v)
{
    return v->add_bos;
}

int pe_vocab_add_eos(const pe_vocab *v)
{
    return v->add_eos;
}

int pe_vocab_add_space_prefix(const pe_vocab *v)
{
    return v->add_space_prefix;
}

int pe_vocab_is_spm(const pe_vocab *v)
{
    return v->spm;
}

int pe_vocab_is_eog(const pe_vocab *v, int32_t tok)
{
    return tok >= 0 && (uint32_t)tok < v->n_tokens && (v->attr[tok] & A_EOG) != 0;
}

int pe_vocab_is_control(const pe_vocab *v, int32_t tok)
{
    return tok >= 0 && (uint32_t)tok < v->n_tokens && (v->attr[tok] & (A_CONTROL | A_UNKNOWN)) != 0;
}

const char *pe_vocab_text(const pe_vocab *v, int32_t tok, size_t *len)
{
    if (tok < 0 || (uint32_t)tok >= v->n_tokens) return NULL;
    return tok_text(v, tok, len);
}

size_t pe_vocab_max_piece(const pe_vocab *v)
{
    return v->max_piece;
}

/* ---- build ---- */

void pe_vocab_destroy(pe_vocab *v)
{
    if (!v) return;
    free(v->text);
    free(v->text_off);
    free(v->scores);
    free(v->attr);
    free(v->piece);
    free(v->piece_off);
    free(v->tok_tab);
    free(v->merge_text);
    free(v->merge_off);
    free(v->merge_tab);
    free(v->special);
    pe_pretok_destroy(v->pre);
    free(v);
}

pe_vocab_params pe_vocab_default_params(void)
{
    pe_vocab_params p;
    memset(&p, 0, sizeof p);
    p.bos_id = -2;
    p.eos_id = -2;
    p.unk_id = -2;
    p.eot_id = -2;
    p.eom_id = -2;
    p.pad_id = -2;
    p.add_bos = -1;
    p.add_eos = -1;
    p.add_space_prefix = -1;
    return p;
}

/* Copies at most 40 bytes of s, printable, for error messages. */
static const char *show(const char *s, size_t n, char out[48])
{
    size_t i, k = 0;
    for (i = 0; i < n && k < 40; i++)
        out[k++] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
    if (i < n) {
        memcpy(out + k, "...", 3);
        k += 3;
    }
    out[k] = 0;
    return out;
}

static int copy_texts(pe_vocab *v, const pe_vocab_params *p, char *err, size_t errlen)
{
    uint64_t total = 0, i;
    char name[32];
    for (i = 0; i < v->n_tokens; i++)
        total += p->tokens[i].len ? p->tokens[i].len : 24;
    v->text_off = malloc((v->n_tokens + 1ull) * sizeof *v->text_off);
    v->text = malloc(total ? total : 1);
    if (!v->text_off || !v->text) goto oom;
    total = 0;
    for (i = 0; i < v->n_tokens; i++) {
        const pe_gguf_str *s = &p->tokens[i];
        v->text_off[i] = total;
        if (s->len == 0) {
            /* llama.cpp renames empty tokens so that they stay unique */
            int k = snprintf(name, sizeof name, "[EMPTY_%u]", (unsigned)i);
            memcpy(v->text + total, name, (size_t)k);
            total += (uint64_t)k;
        } else {
            if (!s->ptr) {
                snprintf(err, errlen, "tokenizer.ggml.tokens[%u]: NULL text", (unsigned)i);
                return -1;
            }
            memcpy(v->text + total, s->ptr, s->len);
            total += s->len;
        }
    }
    v->text_off[v->n_tokens] = total;
    return 0;
oom:
    snprintf(err, errlen, "out of memory for %u tokens", (unsigned)v->n_tokens);
    return -1;
}

static int build_token_table(pe_vocab *v, char *err, size_t errlen)
{
    uint64_t cap = table_size(v->n_tokens), i;
    v->tok_tab = malloc(cap * sizeof *v->tok_tab);
    if (!v->tok_tab) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    memset(v->tok_tab, 0xff, cap * sizeof *v->tok_tab);
    v->tok_mask = cap - 1;
    for (i = 0; i < v->n_tokens; i++) {
        size_t len;
        const char *t = tok_text(v, (int32_t)i, &len);
        int32_t dup = tok_find(v, t, len);
        uint64_t h;
        char s[48];
        if (dup >= 0) {
            snprintf(err, errlen, "tokenizer.ggml.tokens: duplicate token '%s' (ids %d and %u)",
                     show(t, len, s), dup, (unsigned)i);
            return -1;
        }
        h = hash_bytes(t, len) & v->tok_mask;
        while (v->tok_tab[h] >= 0)
            h = (h + 1) & v->tok_mask;
        v->tok_tab[h] = (int32_t)i;
    }
    return 0;
}

static int build_merges(pe_vocab *v, const pe_vocab_params *p, char *err, size_t errlen)
{
    uint64_t total = 0, cap, i;
    if (p->n_merges > 0 && !p->merges) {
        snprintf(err, errlen, "tokenizer.ggml.merges: missing");
        return -1;
    }
    v->n_merges = p->n_merges;
    for (i = 0; i < p->n_merges; i++)
        total += p->merges[i].len;
    cap = table_size(p->n_merges);
    v->merge_text = malloc(total ? total : 1);
    v->merge_off = malloc((p->n_merges + 1ull) * sizeof *v->merge_off);
    v->merge_tab = malloc(cap * sizeof *v->merge_tab);
    if (!v->merge_text || !v->merge_off || !v->merge_tab) {
        snprintf(err, errlen, "out of memory for %u merges", (unsigned)p->n_merges);
        return -1;
    }
    memset(v->merge_tab, 0xff, cap * sizeof *v->merge_tab);
    v->merge_mask = cap - 1;
    total = 0;
    for (i = 0; i < p->n_merges; i++) {
        const pe_gguf_str *s = &p->merges[i];
        uint64_t h;
        v->merge_off[i] = total;
        if (s->len) memcpy(v->merge_text + total, s->ptr, s->len);
        total += s->len;
        v->merge_off[i + 1] = total;
        /* llama.cpp keeps the first rank of a repeated merge */
        if (merge_find(v, v->merge_text + v->merge_off[i], s->len) >= 0) continue;
        h = hash_bytes(v->merge_text + v->merge_off[i], s->len) & v->merge_mask;
        while (v->merge_tab[h] >= 0)
            h = (h + 1) & v->merge_mask;
        v->merge_tab[h] = (int32_t)i;
    }
    v->merge_off[p->n_merges] = total;
    return 0;
}

static int32_t find_cstr(const pe_vocab *v, const char *s)
{
    return tok_find(v, s, strlen(s));
}

/* Token texts llama.cpp recognises (load(), "auto-detect special tokens by text"). */
static const char *const eot_texts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<\357\275\234end\342\226\201of\342\226\201sentence\357\275\234>",
    "<end_of_utterance>",
    NULL};
static const char *const fim_pre_texts[] = {"<|fim_prefix|>",
                                            "<fim-prefix>",
                                            "<fim_prefix>",
                                            "<\357\275\234fim\342\226\201begin\357\275\234>",
                                            "<PRE>",
                                            "\342\226\201<PRE>",
                                            "<|code_prefix|>",
                                            "<|prefix|>",
                                            NULL};
static const char *const fim_suf_texts[] = {"<|fim_suffix|>",
                                            "<fim-suffix>",
                                            "<fim_suffix>",
                                            "<\357\275\234fim\342\226\201hole\357\275\234>",
                                            "<SUF>",
                                            "\342\226\201<SUF>",
                                            "<|code_suffix|>",
                                            "<|suffix|>",
                                            NULL};
static const char *const fim_mid_texts[] = {"<|fim_middle|>",
                                            "<fim-middle>",
                                            "<fim_middle>",
                                            "<\357\275\234fim\342\226\201end\357\275\234>",
                                            "<MID>",
                                            "\342\226\201<MID>",
                                            "<|code_middle|>",
                                            "<|middle|>",
                                            NULL};
static const char *const fim_pad_texts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>",
                                            "<PAD>",       "[PAD]",     NULL};
static const char *const fim_rep_texts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
                                            "<REPO>",       "<reponame>",    NULL};
static const char *const fim_sep_texts[] = {"<|file_sep|>", NULL};
static const char *const eog_texts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<\357\275\234end\342\226\201of\342\226\201sentence\357\275\234>",
    "[e~[",
    NULL};

/* Returns the first token of list present in v (marked CONTROL), or -1. */
static int32_t detect(pe_vocab *v, const char *const *list)
{
    for (; *list; list++) {
        int32_t id = find_cstr(v, *list);
        if (id >= 0) {
            v->attr[id] |= A_CONTROL;
            return id;
        }
    }
    return -1;
}

static void mark_eog(pe_vocab *v, int32_t id)
{
    if (id >= 0) v->attr[id] |= A_EOG;
}

/* llama.cpp's special-token detection and EOG set, in its order. */
static void detect_specials(pe_vocab *v)
{
    const char *const *t;
    int32_t fim_pad, fim_rep, fim_sep, end_id, s_id;
    if (v->eot < 0) v->eot = detect(v, eot_texts);
    if (v->eom < 0) v->eom = detect(v, (const char *const[]){"<|eom_id|>", NULL});
    (void)detect(v, fim_pre_texts);
    (void)detect(v, fim_suf_texts);
    (void)detect(v, fim_mid_texts);
    fim_pad = detect(v, fim_pad_texts);
    fim_rep = detect(v, fim_rep_texts);
    fim_sep = detect(v, fim_sep_texts);
    mark_eog(v, fim_pad);
    mark_eog(v, fim_rep);
    mark_eog(v, fim_sep);
    for (t = eog_texts; *t; t++) {
        int32_t id = find_cstr(v, *t);
        if (id < 0) continue;
        v->attr[id] |= A_EOG | A_CONTROL;
    }
    mark_eog(v, v->eos);
    mark_eog(v, v->eot);
    mark_eog(v, v->eom);
    /* o200k_harmony / solar-open: "<|end|>" is not the end of generation there */
    end_id = find_cstr(v, "<|end|>");
    if (end_id >= 0 && (v->attr[end_id] & A_EOG)) {
        int32_t ret = find_cstr(v, "<|return|>"), call = find_cstr(v, "<|call|>");
        int32_t calls = find_cstr(v, "<|calls|>"), flush = find_cstr(v, "<|flush|>");
        int has_ret = ret >= 0 && (v->attr[ret] & A_EOG);
        int has_call =
            (call >= 0 && (v->attr[call] & A_EOG)) || (calls >= 0 && (v->attr[calls] & A_EOG));
        int has_flush = flush >= 0 && (v->attr[flush] & A_EOG);
        if ((has_ret && has_call) || (has_call && has_flush)) v->attr[end_id] = A_USER_DEFINED;
    }
    /* gemma4 / paddleocr: "</s>" is not the end of generation when "<|tool_response>" is */
    s_id = find_cstr(v, "</s>");
    if (s_id >= 0 && (v->attr[s_id] & A_EOG)) {
        int32_t tr = find_cstr(v, "<|tool_response>");
        if (tr >= 0 && (v->attr[tr] & A_EOG)) v->attr[s_id] = A_NORMAL;
    }
}

/* Attribute from a GGUF token type (llama.cpp: unknown numbers are UNDEFINED = 0). */
static uint16_t type_attr(int32_t t)
{
    switch (t) {
    case PE_TOKEN_TYPE_NORMAL:
        return A_NORMAL;
    case PE_TOKEN_TYPE_UNKNOWN:
        return A_UNKNOWN;
    case PE_TOKEN_TYPE_CONTROL:
        return A_CONTROL;
    case PE_TOKEN_TYPE_USER_DEFINED:
        return A_USER_DEFINED;
    case PE_TOKEN_TYPE_UNUSED:
        return A_UNUSED;
    case PE_TOKEN_TYPE_BYTE:
        return A_BYTE;
    default:
        return 0;
    }
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* llama.cpp token_to_byte: strtol(text.substr(3, 2), 16). */
static uint8_t token_byte(const char *t, size_t n)
{
    int v = 0, k;
    size_t i;
    for (i = 3; i < 5 && i < n; i++) {
        k = hexval(t[i]);
        if (k < 0) break;
        v = v * 16 + k;
    }
    return (uint8_t)v;
}

/* Appends the rendered piece of token id (llama.cpp token_to_piece, special = true). */
static int render_piece(const pe_vocab *v, int32_t id, char **buf, size_t *len, size_t *cap)
{
    size_t n, i, need;
    const char *t = tok_text(v, id, &n);
    uint16_t a = v->attr[id];
    /* "[UNK_BYTE_0x" + 2 hex digits per byte + text + "]" per code point, at worst */
    need = *len + 24 * n + n * n + 16;
    if (need > *cap) {
        size_t c = *cap ? *cap : 4096;
        char *nb;
        while (c < need)
            c *= 2;
        nb = realloc(*buf, c);
        if (!nb) return -1;
        *buf = nb;
        *cap = c;
    }
    if (a & (A_UNKNOWN | A_CONTROL | A_USER_DEFINED)) {
        memcpy(*buf + *len, t, n);
        *len += n;
    } else if (a & A_NORMAL) {
        if (v->spm) {
            for (i = 0; i < n; i++) {
                if (i + 2 < n && memcmp(t + i, "\xe2\x96\x81", 3) == 0) {
                    (*buf)[(*len)++] = ' ';
                    i += 2;
                } else {
                    (*buf)[(*len)++] = t[i];
                }
            }
        } else {
            /* llama_decode_text: each code point back to its byte */
            for (i = 0; i < n;) {
                size_t adv, k, nu;
                uint8_t u[4];
                uint32_t cp = pe_utf8_decode((const uint8_t *)t + i, n - i, &adv);
                int b = pe_gpt2_cp_to_byte(cp);
                i += adv;
                if (b >= 0) {
                    (*buf)[(*len)++] = (char)b;
                    continue;
                }
                nu = pe_utf8_encode(cp, u);
                memcpy(*buf + *len, "[UNK_BYTE_0x", 12);
                *len += 12;
                for (k = 0; k < nu; k++) {
                    snprintf(*buf + *len, 3, "%02x", u[k]);
                    *len += 2;
                }
                memcpy(*buf + *len, t, n);
                *len += n;
                (*buf)[(*len)++] = ']';
            }
        }
    } else if (a & A_BYTE) {
        (*buf)[(*len)++] = (char)token_byte(t, n);
    }
    return 0;
}

static int build_pieces(pe_vocab *v, char *err, size_t errlen)
{
    size_t len = 0, cap = 0;
    uint32_t i;
    v->piece_off = malloc((v->n_tokens + 1ull) * sizeof *v->piece_off);
    if (!v->piece_off) goto oom;
    for (i = 0; i < v->n_tokens; i++) {
        size_t n0 = len;
        v->piece_off[i] = len;
        if (render_piece(v, (int32_t)i, &v->piece, &len, &cap)) goto oom;
        if (len - n0 > v->max_piece) v->max_piece = len - n0;
    }
    v->piece_off[v->n_tokens] = len;
    return 0;
oom:
    snprintf(err, errlen, "out of memory");
    return -1;
}

/* Sorts ids by text length, longest first, then by id: llama.cpp's order (its std::sort
 * leaves equal lengths unordered; by id is the deterministic choice). Insertion sort:
 * the ids arrive in id order and the list is short. */
static void sort_special(pe_vocab *v)
{
    uint32_t i;
    for (i = 1; i < v->n_special; i++) {
        int32_t id = v->special[i];
        uint32_t j = i;
        while (j > 0) {
            int32_t prev = v->special[j - 1];
            uint64_t lp = v->text_off[prev + 1] - v->text_off[prev];
            uint64_t li = v->text_off[id + 1] - v->text_off[id];
            if (lp > li || (lp == li && prev < id)) break;
            v->special[j] = prev;
            j--;
        }
        v->special[j] = id;
    }
}

/* Resolves a special id: -2 the default (if in range), -1 none, else must be in range. */
static int resolve_id(const pe_vocab *v, const char *key, int32_t given, int32_t def, int32_t *out,
                      char *err, size_t errlen)
{
    if (given == -2) {
        *out = (def >= 0 && (uint32_t)def < v->n_tokens) ? def : -1;
        return 0;
    }
    if (given < 0) {
        *out = -1;
        return 0;
    }
    if ((uint32_t)given >= v->n_tokens) {
        snprintf(err, errlen, "%s = %d: out of range (%u tokens)", key, given,
                 (unsigned)v->n_tokens);
        return -1;
    }
    *out = given;
    return 0;
}

static int contains_ci(const char *s, const char *sub)
{
    size_t n = strlen(s), m = strlen(sub), i, k;
    for (i = 0; i + m <= n; i++) {
        for (k = 0; k < m; k++)
            if (tolower((unsigned char)s[i + k]) != sub[k]) break;
        if (k == m) return 1;
    }
    return 0;
}

int pe_vocab_create(const pe_vocab_params *p, pe_vocab **out, char *err, size_t errlen)
{
    pe_vocab *v;
    uint32_t i;
    int def_bos = -1, def_eos = -1, def_unk = -1;

    *out = NULL;
    if (!p->model || (strcmp(p->model, "llama") != 0 && strcmp(p->model, "gpt2") != 0)) {
        snprintf(err, errlen,
                 "tokenizer.ggml.model = '%.40s': unsupported tokenizer (supported: llama, "
                 "gpt2)",
                 p->model ? p->model : "");
        return -1;
    }
    if (p->n_tokens == 0 || !p->tokens) {
        snprintf(err, errlen, "tokenizer.ggml.tokens: missing or empty");
        return -1;
    }
    if (p->n_tokens > (uint32_t)INT32_MAX) {
        snprintf(err, errlen, "tokenizer.ggml.tokens: %u tokens is too many",
                 (unsigned)p->n_tokens);
        return -1;
    }
    v = calloc(1, sizeof *v);
    if (!v) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    v->spm = strcmp(p->model, "llama") == 0;
    v->n_tokens = p->n_tokens;
    if (copy_texts(v, p, err, errlen)) goto fail;
    v->scores = malloc(v->n_tokens * sizeof *v->scores);
    v->attr = malloc(v->n_tokens * sizeof *v->attr);
    v->special = malloc(v->n_tokens * sizeof *v->special);
    if (!v->scores || !v->attr || !v->special) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    for (i = 0; i < v->n_tokens; i++) {
        float s = p->scores ? p->scores[i] : 0.0f;
        if (isnan(s)) {
            snprintf(err, errlen, "tokenizer.ggml.scores[%u] is NaN", (unsigned)i);
            goto fail;
        }
        v->scores[i] = s;
        v->attr[i] = p->token_types ? type_attr(p->token_types[i]) : A_NORMAL;
    }
    if (build_token_table(v, err, errlen)) goto fail;

    if (v->spm) {
        def_bos = 1;
        def_eos = 2;
        def_unk = 0;
        v->add_bos = 1;
        v->add_space_prefix = 1;
    } else {
        pe_pretok_info info;
        const char *pre = p->pre ? p->pre : "";
        if (pe_pretok_create(pre, strlen(pre), &v->pre, &info, err, errlen)) goto fail;
        v->ignore_merges = info.ignore_merges;
        v->add_bos = info.add_bos > 0;
        if (build_merges(v, p, err, errlen)) goto fail;
        def_bos = 11; /* llama.cpp's defaults for BPE, used only when in range */
        def_eos = 11;
    }
    if (p->add_bos >= 0) v->add_bos = p->add_bos != 0;
    if (p->add_eos >= 0) v->add_eos = p->add_eos != 0;
    if (p->add_space_prefix >= 0) v->add_space_prefix = p->add_space_prefix != 0;

    if (resolve_id(v, "tokenizer.ggml.bos_token_id", p->bos_id, def_bos, &v->bos, err, errlen) ||
        resolve_id(v, "tokenizer.ggml.eos_token_id", p->eos_id, def_eos, &v->eos, err, errlen) ||
        resolve_id(v, "tokenizer.ggml.unknown_token_id", p->unk_id, def_unk, &v->unk, err,
                   errlen) ||
        resolve_id(v, "tokenizer.ggml.eot_token_id", p->eot_id, -1, &v->eot, err, errlen) ||
        resolve_id(v, "tokenizer.ggml.eom_token_id", p->eom_id, -1, &v->eom, err, errlen) ||
        resolve_id(v, "tokenizer.ggml.padding_token_id", p->pad_id, -1, &v->pad, err, errlen))
        goto fail;
    if (v->add_bos && v->bos < 0) {
        snprintf(err, errlen,
                 "tokenizer.ggml.add_bos_token is true, but tokenizer.ggml.bos_token_id is not "
                 "set");
        goto fail;
    }
    if (v->add_eos && v->eos < 0) {
        snprintf(err, errlen,
                 "tokenizer.ggml.add_eos_token is true, but tokenizer.ggml.eos_token_id is not "
                 "set");
        goto fail;
    }

    detect_specials(v);

    /* special tokens partitioned out of raw text, longest first */
    v->n_special = 0;
    for (i = 0; i < v->n_tokens; i++)
        if (v->attr[i] & (A_CONTROL | A_USER_DEFINED | A_UNKNOWN))
            v->special[v->n_special++] = (int32_t)i;
    sort_special(v);

    if (build_pieces(v, err, errlen)) goto fail;

    /* llama.cpp's per-model attributes: Phi-3 strips spaces after its special tokens */
    if (p->name && (contains_ci(p->name, "phi-3") || contains_ci(p->name, "phi3"))) {
        static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
        int32_t id;
        for (i = 0; i < v->n_special; i++)
            v->attr[v->special[i]] |= A_RSTRIP;
        id = find_cstr(v, "</s>");
        if (id >= 0) v->attr[id] |= A_RSTRIP;
        for (i = 0; i < 3; i++) {
            id = find_cstr(v, keep[i]);
            if (id >= 0) v->attr[id] &= (uint16_t)~A_RSTRIP;
        }
    }

    /* SentencePiece byte fallback: "<0xNN>", else the byte itself as a token */
    for (i = 0; i < 256; i++) {
        char hex[7];
        snprintf(hex, sizeof hex, "<0x%02X>", i);
        v->byte_tok[i] = find_cstr(v, hex);
        if (v->byte_tok[i] < 0) {
            char b = (char)i;
            v->byte_tok[i] = tok_find(v, &b, 1);
        }
    }
    *out = v;
    return 0;
fail:
    pe_vocab_destroy(v);
    return -1;
}

/* ---- load from GGUF ---- */

/* Reads an optional id key into *out: -2 absent, -1 "none" (-1 or 0xFFFFFFFF). */
static int load_id(const pe_gguf_file *f, const char *key, int32_t *out, char *err, size_t errlen)
{
    int32_t i;
    uint32_t u;
    int rc = pe_gguf_get_i32(f, key, &i);
    *out = -2;
    if (rc == -1) return 0;
    if (rc == 0) {
        if (i < -1) {
            snprintf(err, errlen, "%s = %d: not a token id", key, i);
            return -1;
        }
        *out = i;
        return 0;
    }
    rc = pe_gguf_get_u32(f, key, &u);
    if (rc == 0 && u == UINT32_MAX) {
        *out = -1;
        return 0;
    }
    if (rc == 0) {
        snprintf(err, errlen, "%s = %u: out of range", key, (unsigned)u);
        return -1;
    }
    snprintf(err, errlen, "%s: not an integer", key);
    return -1;
}

static int load_bool(const pe_gguf_file *f, const char *key, int *out, char *err, size_t errlen)
{
    int b, rc = pe_gguf_get_bool(f, key, &b);
    *out = -1;
    if (rc == -1) return 0;
    if (rc != 0) {
        snprintf(err, errlen, "%s: not a bool", key);
        return -1;
    }
    *out = b;
    return 0;
}

/* Reads an optional string key as a NUL-terminated copy into buf (truncated names are
 * still refused by the caller's comparisons). Returns 0 (absent: buf = ""), or -1. */
static int load_str(const pe_gguf_file *f, const char *key, char *buf, size_t buflen, int *present,
                    char *err, size_t errlen)
{
    pe_gguf_str s;
    int rc = pe_gguf_get_str(f, key, &s);
    size_t n;
    buf[0] = 0;
    *present = rc == 0;
    if (rc == -1) return 0;
    if (rc != 0) {
        snprintf(err, errlen, "%s: not a string", key);
        return -1;
    }
    n = s.len < buflen - 1 ? (size_t)s.len : buflen - 1;
    memcpy(buf, s.ptr, n);
    buf[n] = 0;
    return 0;
}

/* Checks an optional numeric array key: its element type must be one of t1/t2 and its
 * length n_tokens. Returns the kv, NULL when absent (*bad = 0) or invalid (*bad = 1). */
static const pe_gguf_kv *load_arr(const pe_gguf_file *f, const char *key, uint32_t t1, uint32_t t2,
                                  uint32_t n_tokens, int *bad, char *err, size_t errlen)
{
    const pe_gguf_kv *kv = pe_gguf_find_kv(f, key);
    *bad = 0;
    if (!kv) return NULL;
    if (kv->type != PE_GGUF_TYPE_ARRAY || (kv->arr_type != t1 && kv->arr_type != t2)) {
        snprintf(err, errlen, "%s: must be an array of %s (is %s)", key, pe_gguf_type_name(t1),
                 kv->type == PE_GGUF_TYPE_ARRAY ? pe_gguf_type_name(kv->arr_type)
                                                : pe_gguf_type_name(kv->type));
        *bad = 1;
        return NULL;
    }
    if (kv->n != n_tokens) {
        snprintf(err, errlen, "%s: %llu entries for %u tokens", key, (unsigned long long)kv->n,
                 (unsigned)n_tokens);
        *bad = 1;
        return NULL;
    }
    return kv;
}

int pe_vocab_load(const pe_gguf_file *f, pe_vocab **out, char *err, size_t errlen)
{
    pe_vocab_params p = pe_vocab_default_params();
    const pe_gguf_kv *toks, *kv;
    char model[64], pre[64], name[256];
    float *scores = NULL;
    int32_t *types = NULL;
    int present, bad, rc = -1;
    uint64_t i;

    *out = NULL;
    if (load_str(f, "tokenizer.ggml.model", model, sizeof model, &present, err, errlen)) return -1;
    if (!present) {
        snprintf(err, errlen, "tokenizer.ggml.model: missing");
        return -1;
    }
    if (load_str(f, "tokenizer.ggml.pre", pre, sizeof pre, &present, err, errlen)) return -1;
    p.pre = present ? pre : NULL;
    if (load_str(f, "general.name", name, sizeof name, &present, err, errlen)) return -1;
    p.name = present ? name : NULL;
    p.model = model;

    rc = pe_gguf_get_arr(f, "tokenizer.ggml.tokens", PE_GGUF_TYPE_STRING, &toks);
    if (rc != 0) {
        snprintf(err, errlen, "tokenizer.ggml.tokens: %s",
                 rc == -1 ? "missing" : "must be an array of strings");
        return -1;
    }
    if (toks->n == 0 || toks->n > (uint64_t)INT32_MAX || !toks->strs) {
        snprintf(err, errlen, "tokenizer.ggml.tokens: %llu tokens", (unsigned long long)toks->n);
        return -1;
    }
    p.n_tokens = (uint32_t)toks->n;
    p.tokens = toks->strs;
    rc = -1;

    kv = load_arr(f, "tokenizer.ggml.scores", PE_GGUF_TYPE_FLOAT32, PE_GGUF_TYPE_INT32, p.n_tokens,
                  &bad, err, errlen);
    if (bad) goto out;
    if (kv) {
        scores = malloc(p.n_tokens * sizeof *scores);
        if (!scores) goto oom;
        for (i = 0; i < p.n_tokens; i++)
            scores[i] = (float)pe_gguf_arr_f64(kv, i);
        p.scores = scores;
    }
    kv = load_arr(f, "tokenizer.ggml.token_type", PE_GGUF_TYPE_INT32, PE_GGUF_TYPE_INT32,
                  p.n_tokens, &bad, err, errlen);
    if (bad) goto out;
    if (kv) {
        types = malloc(p.n_tokens * sizeof *types);
        if (!types) goto oom;
        for (i = 0; i < p.n_tokens; i++)
            types[i] = (int32_t)pe_gguf_arr_i64(kv, i);
        p.token_types = types;
    }
    if (strcmp(model, "gpt2") == 0) {
        int mrc = pe_gguf_get_arr(f, "tokenizer.ggml.merges", PE_GGUF_TYPE_STRING, &kv);
        if (mrc != 0) {
            snprintf(err, errlen, "tokenizer.ggml.merges: %s",
                     mrc == -1 ? "missing (a gpt2 vocabulary needs it)"
                               : "must be an array of strings");
            goto out;
        }
        if (kv->n > (uint64_t)INT32_MAX || (kv->n > 0 && !kv->strs)) {
            snprintf(err, errlen, "tokenizer.ggml.merges: %llu merges", (unsigned long long)kv->n);
            goto out;
        }
        p.n_merges = (uint32_t)kv->n;
        p.merges = kv->strs;
    }
    if (load_id(f, "tokenizer.ggml.bos_token_id", &p.bos_id, err, errlen) ||
        load_id(f, "tokenizer.ggml.eos_token_id", &p.eos_id, err, errlen) ||
        load_id(f, "tokenizer.ggml.unknown_token_id", &p.unk_id, err, errlen) ||
        load_id(f, "tokenizer.ggml.eot_token_id", &p.eot_id, err, errlen) ||
        load_id(f, "tokenizer.ggml.eom_token_id", &p.eom_id, err, errlen) ||
        load_id(f, "tokenizer.ggml.padding_token_id", &p.pad_id, err, errlen) ||
        load_bool(f, "tokenizer.ggml.add_bos_token", &p.add_bos, err, errlen) ||
        load_bool(f, "tokenizer.ggml.add_eos_token", &p.add_eos, err, errlen) ||
        load_bool(f, "tokenizer.ggml.add_space_prefix", &p.add_space_prefix, err, errlen))
        goto out;
    rc = pe_vocab_create(&p, out, err, errlen);
    goto out;
oom:
    snprintf(err, errlen, "out of memory");
out:
    free(scores);
    free(types);
    return rc;
}
