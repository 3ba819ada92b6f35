/* SPDX-License-Identifier: MIT */
/*
 * tokenize.c - pe_tokenize: text -> token ids, a C port of llama.cpp's
 * src/llama-vocab.cpp (llm_tokenizer_spm, llm_tokenizer_bpe, tokenizer_st_partition) for the
 * "llama" and "gpt2" tokenizer models.
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
 * pe_tokenize_ex adds two things. max_tokens: a text that must make more tokens than that
 * (by the bytes-per-token bound of tokenizer.h) is refused before it is partitioned, and
 * a raw fragment that cannot fit is never merged, so a server refuses a 16 MB prompt in
 * microseconds (test_bounded: 16 MB against 4,096 tokens, every vocabulary). Plain
 * ranges: the partition skips a control token's occurrence that overlaps one (chat
 * message content), so only the template's own markers become control tokens.
 *
 * Callers: see tokenizer.h. Invariants: the vocabulary is only read (see tokenizer_int.h);
 * all state of one call lives in its session, so calls may run in parallel.
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include <pagoda/pagoda.h>

#include "tokenizer_int.h"
#include "unicode.h"

/* pe_tokenize's input limit. Escaping ' ' as "▁" triples a text at most and byte-level
 * encoding multiplies it by 6 at most, so symbol offsets fit uint32 and indices int32. */
#define MAX_TEXT_BYTES (256u << 20)

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

/* ---- the merge loop (shared by both tokenizers) ---- */

/* Pushes the pair (l, r) of adjacent symbols as a candidate if it can merge. */
static void try_pair(const pe_vocab *v, session *ss, const char *t, int32_t l, int32_t r)
{
    if (ss->h.by_rank) {
        bpe_try_pair(v, ss, t, l, r);
    } else {
        spm_try_pair(v, ss, t, l, r);
    }
}

/* Splits t[0..n) (n > 0) into UTF-8 characters, then merges the best adjacent pair (by_rank:
 * lowest BPE merge rank, else highest SentencePiece score; ties: leftmost) until no pair
 * merges: llm_tokenizer_spm_session / llm_tokenizer_bpe_session::tokenize. Then appends
 * the id of each symbol; one that is not a token falls back to byte tokens: SentencePiece
 * <0xNN> (llama.cpp throws when a byte has no token; we use UNK then), BPE each byte of
 * the (encoded) text looked up on its own, misses dropped (as llama.cpp does). Returns 0
 * or -1 (ENOMEM). */
static int merge_word(const pe_vocab *v, session *ss, const char *t, uint32_t n, int by_rank,
                      tokvec *out)
{
    int32_t i;
    if (split_chars(ss, t, n)) return -1;
    ss->h.n = 0;
    ss->h.by_rank = by_rank;
    for (i = 1; i < (int32_t)ss->n; i++)
        try_pair(v, ss, t, i - 1, i);
    while (ss->h.n > 0 && !ss->h.oom) {
        pair p = heap_pop(&ss->h);
        sym *l = &ss->s[p.left], *r = &ss->s[p.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != p.size) continue; /* stale */
        merge_syms(ss, p.left, p.right);
        try_pair(v, ss, t, ss->s[p.left].prev, p.left);
        try_pair(v, ss, t, p.left, ss->s[p.left].next);
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
        for (k = 0; k < y->n; k++) {
            int32_t b;
            if (by_rank) {
                b = tok_find(v, t + y->off + k, 1);
            } else {
                b = v->byte_tok[(uint8_t)t[y->off + k]];
                if (b < 0) b = v->unk;
            }
            if (b >= 0) tv_push(out, b);
        }
    }
    return 0;
}

/* llm_tokenizer_bpe_session::tokenize for one pre-tokenized word t[0..n) (n > 0). */
static int bpe_word(const pe_vocab *v, session *ss, const char *t, uint32_t n, tokvec *out)
{
    if (v->ignore_merges) {
        int32_t id = tok_find(v, t, n);
        if (id >= 0) {
            tv_push(out, id);
            return 0;
        }
    }
    return merge_word(v, ss, t, n, 1, out);
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

/* Returns 1 when [pos, pos + n) overlaps one of the ascending, disjoint spans sp[0..n_sp):
 * a binary search for the first span that ends after pos. */
static int overlaps_plain(const pe_text_span *sp, size_t n_sp, size_t pos, size_t n)
{
    size_t lo = 0, hi = n_sp;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (sp[mid].off + sp[mid].len <= pos)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n_sp && sp[lo].off < pos + n;
}

/* Splits the raw fragments of *fv around every occurrence of special token id. With
 * plain spans (guard), an occurrence that overlaps one is no token: it stays raw text,
 * and the search goes on from its next byte. */
static int partition_one(const pe_vocab *v, const char *text, int32_t id, fragvec *fv, fragvec *tmp,
                         const pe_text_span *plain, size_t n_plain)
{
    size_t tl, i;
    const char *t = tok_text(v, id, &tl);
    uint16_t attr = v->attr[id];
    tmp->n = 0;
    for (i = 0; i < fv->n; i++) {
        const frag *f = &fv->a[i];
        size_t pos, end, from;
        if (f->tok >= 0) {
            if (fv_push(tmp, f->tok, 0, 0)) return -1;
            continue;
        }
        pos = f->off;
        end = f->off + f->len;
        from = pos;
        for (;;) {
            const char *m = find_bytes(text + from, end - from, t, tl);
            size_t mpos, left;
            if (!m) break;
            mpos = (size_t)(m - text);
            if (n_plain && overlaps_plain(plain, n_plain, mpos, tl)) {
                from = mpos + 1;
                continue;
            }
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
            from = pos;
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

pe_tokenize_params pe_tokenize_default_params(void)
{
    pe_tokenize_params p;
    memset(&p, 0, sizeof p);
    p.max_tokens = SIZE_MAX;
    return p;
}

/* Returns the fewest tokens n input bytes can make: ceil(n / v->max_token_bytes), or 0 when
 * the vocabulary has no such bound. */
static size_t fewest_tokens(const pe_vocab *v, size_t n)
{
    size_t b = v->max_token_bytes;
    return b ? n / b + (n % b != 0) : 0;
}

/* Returns a lower bound on the tokens text[0..len) makes (see pe_tokenize_ex). O(1), or
 * one pass over the text to leave out whitespace when a special token may strip it. */
static size_t text_fewest_tokens(const pe_vocab *v, const char *text, size_t len)
{
    size_t n = len;
    if (!v->max_token_bytes) return 0;
    if (v->has_strip) {
        size_t i;
        n = 0;
        for (i = 0; i < len; i++)
            n += !isspace((unsigned char)text[i]);
    }
    return fewest_tokens(v, n);
}

/* The whole tokenization into tv. Returns the number of tokens (tv->n), PGD_ENOMEM or
 * PGD_EINVAL. Once more than p->max_tokens are certain it stops: the return value is then
 * a count the text's tokens reach at least (tv may hold fewer). */
static int64_t tokenize(const pe_vocab *v, const char *text, size_t len,
                        const pe_tokenize_params *p, tokvec *tv)
{
    fragvec fv = {0}, tmp = {0};
    session ss;
    char *buf = NULL;
    size_t i, buf_cap = 0, max = p->max_tokens;
    int64_t rc = PGD_ENOMEM;
    int prev_special = 1;

    memset(&ss, 0, sizeof ss);
    /* The cheap refusal first: a text too long for max_tokens is never partitioned. */
    if (max != SIZE_MAX) {
        size_t least = text_fewest_tokens(v, text, len);
        if (least > max) return least > INT64_MAX ? INT64_MAX : (int64_t)least;
    }
    if (len > MAX_TEXT_BYTES) return PGD_EINVAL;
    if (len > 0) {
        if (fv_push(&fv, -1, 0, len)) goto out;
        for (i = 0; i < v->n_special && fv.n > 0; i++) {
            int32_t id = v->special[i];
            int control = (v->attr[id] & (A_CONTROL | A_UNKNOWN)) != 0;
            if (!p->parse_special && control) continue;
            if (partition_one(v, text, id, &fv, &tmp, p->plain,
                              control && p->plain ? p->n_plain : 0))
                goto out;
        }
    }
    if (p->add_special && v->add_bos) tv_push(tv, v->bos);
    for (i = 0; i < fv.n; i++) {
        const frag *f = &fv.a[i];
        if (tv->n > max) break;
        if (f->tok >= 0) {
            tv_push(tv, f->tok);
            prev_special = 1;
            continue;
        }
        /* A fragment that cannot fit is not tokenized: it makes at least this many. */
        if (max != SIZE_MAX && fewest_tokens(v, f->len) > max - tv->n) {
            size_t least = tv->n + fewest_tokens(v, f->len);
            rc = least > INT64_MAX ? INT64_MAX : (int64_t)least;
            goto out;
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
            if (merge_word(v, &ss, buf, (uint32_t)n, 0, tv)) goto out;
        } else {
            size_t w, start = 0;
            int src = pe_pretok_split(v->pre, text + f->off, f->len, &ss.words);
            if (src == -2) {
                rc = PGD_EINVAL;
                goto out;
            }
            if (src) goto out;
            for (w = 0; w < ss.words.n && tv->n <= max; w++) {
                size_t end = ss.words.ends[w];
                if (end > start &&
                    bpe_word(v, &ss, ss.words.buf + start, (uint32_t)(end - start), tv))
                    goto out;
                start = end;
            }
        }
        prev_special = 0;
    }
    if (p->add_special && v->add_eos && tv->n <= max) tv_push(tv, v->eos);
    if (tv->oom) goto out;
    rc = (int64_t)tv->n;
out:
    free(fv.a);
    free(tmp.a);
    free(buf);
    session_deinit(&ss);
    return rc;
}

int64_t pe_tokenize_ex(const pe_vocab *v, const char *text, size_t len, const pe_tokenize_params *p,
                       int32_t **out)
{
    tokvec tv = {0};
    int64_t rc = tokenize(v, text, len, p, &tv);
    if (out) *out = NULL;
    if (out && rc > 0 && (uint64_t)rc <= p->max_tokens) {
        *out = tv.ids; /* ownership moves to the caller */
        tv.ids = NULL;
    }
    free(tv.ids);
    return rc;
}

int64_t pe_tokenize(const pe_vocab *v, const char *text, size_t len, int add_special,
                    int parse_special, int32_t *out, size_t max_out)
{
    pe_tokenize_params p = pe_tokenize_default_params();
    tokvec tv = {0};
    int64_t rc;
    p.add_special = add_special;
    p.parse_special = parse_special;
    rc = tokenize(v, text, len, &p, &tv);
    if (rc > 0 && out && max_out > 0)
        memcpy(out, tv.ids, ((size_t)rc < max_out ? (size_t)rc : max_out) * sizeof *out);
    free(tv.ids);
    return rc;
}
