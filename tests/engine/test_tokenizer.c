/* SPDX-License-Identifier: MIT */
/*
 * test_tokenizer.c - the tokenizer (engine/text/vocab*.c, tokenize.c, detok.c,
 * tokenizer_pre.c, unicode.c):
 *   - conformance: every string of ../shared/models/vocab/<vocab>.gguf.inp must tokenize
 *     (no BOS/EOS, no special parsing: llama.cpp's tests/test-tokenizer-0.cpp) to exactly
 *     its line of .out, for ggml-vocab-llama-spm, ggml-vocab-phi-3 and ggml-vocab-gpt-2;
 *     the first mismatch of each vocab is printed with input, expected and got;
 *   - decode(encode(s)) == s for those strings (SentencePiece: after the leading-space
 *     rule of tokenizer.h; byte-level BPE: exactly);
 *   - stories260K.gguf: "Once upon a time" with BOS is [1, 403, 407, 261, 378];
 *   - in-memory vocabularies (no files): SentencePiece score order and leftmost ties,
 *     byte fallback, BPE rank order, special-token partitioning, streaming decode of
 *     characters split across byte tokens, invalid UTF-8, empty input, the max_out
 *     contract, load errors naming their key, and 1 MB inputs in O(n log n);
 *   - pe_tokenize_ex: bounded tokenization equals pe_tokenize when the tokens fit and
 *     reports more than max_tokens when not, the bytes-per-token bound holds on random
 *     texts (invalid and overlong UTF-8, special texts, whitespace), a 16 MB text is
 *     refused in milliseconds, a vocabulary that drops bytes has no bound and stays
 *     exact; plain ranges keep control-token text inside them as text;
 *   - the strict UTF-8 validator of unicode.h (pe_utf8_valid_len, pe_utf8_valid) against
 *     an independent code-point reference, on every 1- and 2-byte input and every lead and
 *     second byte of 3- and 4-byte inputs (the other bytes at their boundary values).
 * Model files come from $PGD_MODELS_DIR, else PGD_SOURCE_DIR/../shared/models; when they
 * are absent the in-memory tests still run and the program exits 77 (skipped) with a
 * message, unless something failed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gguf.h"
#include "t.h"
#include "tokenizer.h"
#include "tokenizer_pre.h"
#include "unicode.h"

static int g_missing; /* model files not found */
static char g_tmp[256];

/* ---- helpers ---- */

static const char *models_dir(void)
{
    const char *d = getenv("PGD_MODELS_DIR");
    return d && *d ? d : PGD_SOURCE_DIR "/../shared/models";
}

static char *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long n;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc((size_t)(n > 0 ? n : 0) + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) buf[n] = 0;
    *size = (size_t)n;
    return buf;
}

/* Opens models_dir()/rel as a vocabulary; NULL (and g_missing set) when absent. */
static pe_vocab *load_vocab(const char *rel)
{
    char path[1024], err[256];
    pe_gguf_file *f;
    pe_vocab *v = NULL;
    snprintf(path, sizeof path, "%s/%s", models_dir(), rel);
    if (access(path, R_OK) != 0) {
        fprintf(stderr, "     (%s not found; set PGD_MODELS_DIR)\n", path);
        g_missing = 1;
        return NULL;
    }
    if (pe_gguf_open(path, &f, err, sizeof err) != 0) {
        fprintf(stderr, "%s: %s\n", path, err);
        return NULL;
    }
    if (pe_vocab_load(f, &v, err, sizeof err) != 0) fprintf(stderr, "%s: %s\n", path, err);
    pe_gguf_close(f);
    return v;
}

/* Tokenizes into a malloc'd array (retrying on a short buffer); *n < 0 on error. */
static int32_t *tok(const pe_vocab *v, const char *s, size_t len, int add_special,
                    int parse_special, int64_t *n)
{
    int32_t *ids = malloc(16 * sizeof *ids);
    *n = pe_tokenize(v, s, len, add_special, parse_special, ids, 16);
    if (*n > 16) {
        int64_t n2;
        free(ids);
        ids = malloc((size_t)*n * sizeof *ids);
        n2 = pe_tokenize(v, s, len, add_special, parse_special, ids, (size_t)*n);
        if (n2 != *n) *n = -100;
    }
    return ids;
}

static void print_escaped(const char *label, const char *s, size_t n)
{
    size_t i;
    fprintf(stderr, "  %s '", label);
    for (i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            fputs("\\n", stderr);
        else if (c == '\t')
            fputs("\\t", stderr);
        else if (c < 0x20)
            fprintf(stderr, "\\x%02x", c);
        else
            fputc(c, stderr);
    }
    fputs("'\n", stderr);
}

static void print_ids(const char *label, const int32_t *ids, int64_t n)
{
    int64_t i;
    fprintf(stderr, "  %s", label);
    for (i = 0; i < n; i++)
        fprintf(stderr, " %d", ids[i]);
    fputc('\n', stderr);
}

/* ---- conformance ---- */

#define SEP "\n__ggml_vocab_test__\n"

/* Runs one vocabulary's .inp/.out. Returns 0 on success (or skip), 1 on failure. */
static int conformance(const char *name, int is_spm)
{
    char rel[256], path[1024];
    char *inp = NULL, *outf = NULL, *line, *pos, *detok = NULL;
    size_t ni, no, n_tests = 0, n_pass = 0, n_rt = 0;
    pe_vocab *v;
    int failed_shown = 0, rc = 1;

    snprintf(rel, sizeof rel, "vocab/%s.gguf", name);
    v = load_vocab(rel);
    if (!v) return g_missing ? 0 : 1;
    T_EQ(pe_vocab_is_spm(v), is_spm);
    snprintf(path, sizeof path, "%s/vocab/%s.gguf.inp", models_dir(), name);
    inp = read_file(path, &ni);
    snprintf(path, sizeof path, "%s/vocab/%s.gguf.out", models_dir(), name);
    outf = read_file(path, &no);
    if (!inp || !outf) {
        fprintf(stderr, "%s: cannot read .inp/.out\n", name);
        goto out;
    }
    detok = malloc(4 * ni + 64);
    pos = inp;
    line = outf;
    /* test-tokenizer-0.cpp: split on SEP; a final piece without SEP is a test too */
    while (pos < inp + ni) {
        char *next = strstr(pos, SEP), *eol;
        size_t slen = next ? (size_t)(next - pos) : (size_t)(inp + ni - pos);
        int32_t expect[512];
        int64_t n_expect = 0, n_got, k;
        int32_t *got;
        int ok;
        if (!line || !*line) {
            fprintf(stderr, "%s: more inputs than output lines\n", name);
            goto out;
        }
        eol = strchr(line, '\n');
        if (eol) *eol = 0;
        {
            char *q = line, *end;
            for (;;) {
                long x = strtol(q, &end, 10);
                if (end == q) break;
                if (n_expect < 512) expect[n_expect++] = (int32_t)x;
                q = end;
            }
        }
        line = eol ? eol + 1 : NULL;
        n_tests++;
        got = tok(v, pos, slen, 0, 0, &n_got);
        ok = n_got == n_expect;
        for (k = 0; ok && k < n_got; k++)
            ok = got[k] == expect[k];
        if (ok) {
            size_t dn = pe_detokenize(v, got, (size_t)n_got, detok, 4 * ni + 64);
            n_pass++;
            if (dn == slen && memcmp(detok, pos, slen) == 0) {
                n_rt++;
            } else if (!failed_shown) {
                failed_shown = 1;
                fprintf(stderr, "%s: round trip of test %zu differs:\n", name, n_tests);
                print_escaped("input:  ", pos, slen);
                print_escaped("decoded:", detok, dn);
            }
        } else if (!failed_shown) {
            failed_shown = 1;
            fprintf(stderr, "%s: test %zu FAILED\n", name, n_tests);
            print_escaped("input:", pos, slen);
            print_ids("expected:", expect, n_expect);
            print_ids("got:     ", got, n_got);
        }
        free(got);
        if (!next) break;
        pos = next + strlen(SEP);
    }
    if (line && *line) {
        fprintf(stderr, "%s: more output lines than inputs\n", name);
        goto out;
    }
    printf("     %s: %zu/%zu strings match .out, %zu/%zu round-trip\n", name, n_pass, n_tests, n_rt,
           n_pass);
    if (n_tests > 0 && n_pass == n_tests && n_rt == n_pass) rc = 0;
out:
    free(inp);
    free(outf);
    free(detok);
    pe_vocab_destroy(v);
    return rc;
}

static int test_conformance_llama_spm(void)
{
    return conformance("ggml-vocab-llama-spm", 1);
}

static int test_conformance_phi3(void)
{
    const char *chat = "<|user|>\nHello<|end|>\n<|assistant|>";
    int64_t n, nh, i;
    int32_t *ids, *hello;
    pe_vocab *v;
    if (conformance("ggml-vocab-phi-3", 1) != 0) return 1;
    v = load_vocab("vocab/ggml-vocab-phi-3.gguf");
    if (!v) return g_missing ? 0 : 1;
    T_EQ(pe_vocab_eos(v), 32000);
    T_EQ(pe_vocab_eot(v), 32007); /* "<|end|>", found by its text */
    T_ASSERT(pe_vocab_is_eog(v, 32000) && pe_vocab_is_eog(v, 32007));
    T_ASSERT(!pe_vocab_is_eog(v, 32010));
    /* chat markup: Phi-3's special tokens strip the whitespace after them (llama.cpp
     * rstrip), and the text after a special token gets the space prefix again */
    ids = tok(v, chat, strlen(chat), 0, 1, &n);
    hello = tok(v, "Hello", 5, 0, 0, &nh);
    T_EQ(n, nh + 3);
    T_EQ(ids[0], 32010);
    for (i = 0; i < nh; i++)
        T_EQ(ids[1 + i], hello[i]);
    T_EQ(ids[1 + nh], 32007);
    T_EQ(ids[2 + nh], 32001);
    free(ids);
    free(hello);
    pe_vocab_destroy(v);
    return 0;
}

static int test_conformance_gpt2(void)
{
    return conformance("ggml-vocab-gpt-2", 0);
}

static int test_stories260k(void)
{
    static const int32_t want[] = {1, 403, 407, 261, 378};
    const char *prompt = "Once upon a time";
    pe_vocab *v = load_vocab("stories260K.gguf");
    int32_t ids[16];
    char out[256];
    size_t n, i;
    int64_t nt;
    pe_detok d;
    if (!v) return g_missing ? 0 : 1;
    T_EQ(pe_vocab_add_bos(v), 1);
    T_EQ(pe_vocab_bos(v), 1);
    T_EQ(pe_vocab_eos(v), 2);
    T_ASSERT(pe_vocab_is_eog(v, 2));
    nt = pe_tokenize(v, prompt, strlen(prompt), 1, 0, ids, 16);
    T_EQ(nt, 5);
    for (i = 0; i < 5; i++)
        T_EQ(ids[i], want[i]);
    /* prompt + generation prints the prompt as typed: BOS is empty, "▁Once" loses its space */
    pe_detok_init(&d, v);
    n = 0;
    for (i = 0; i < 5; i++)
        n += pe_detok_push(&d, ids[i], out + n, sizeof out - n);
    n += pe_detok_flush(&d, out + n, sizeof out - n);
    T_EQ(n, strlen(prompt));
    T_ASSERT(memcmp(out, prompt, n) == 0);
    /* raw pieces keep the space; PE_PIECE_SPECIAL renders BOS */
    n = pe_token_to_piece(v, 403, out, sizeof out);
    T_ASSERT(n == 5 && memcmp(out, " Once", 5) == 0);
    T_EQ(pe_token_to_piece(v, 1, out, sizeof out), 0);
    n = pe_token_to_piece_ex(v, 1, PE_PIECE_SPECIAL, out, sizeof out);
    T_ASSERT(n == 3 && memcmp(out, "<s>", 3) == 0);
    /* "<s>" in the text: a token only with parse_special */
    nt = pe_tokenize(v, "<s>Once", 7, 0, 1, ids, 16);
    T_ASSERT(nt >= 2 && ids[0] == 1 && ids[1] == 403);
    nt = pe_tokenize(v, "<s>Once", 7, 0, 0, ids, 16);
    T_ASSERT(nt >= 2 && ids[0] != 1);
    pe_vocab_destroy(v);
    return 0;
}

/* ---- in-memory vocabularies ---- */

typedef struct mem_vocab {
    pe_gguf_str toks[600];
    float scores[600];
    int32_t types[600];
    char text[600][16];
    uint32_t n;
} mem_vocab;

static int32_t mv_add(mem_vocab *m, const char *s, float score, int32_t type)
{
    size_t len = strlen(s);
    memcpy(m->text[m->n], s, len);
    m->toks[m->n].ptr = m->text[m->n];
    m->toks[m->n].len = len;
    m->scores[m->n] = score;
    m->types[m->n] = type;
    return (int32_t)m->n++;
}

/* SentencePiece: <unk> <s> </s> <0x00>..<0xFF>, then "▁", "a", "b", "aa", "ab", "▁ab". */
static pe_vocab *make_spm(mem_vocab *m, int space_prefix)
{
    pe_vocab_params p = pe_vocab_default_params();
    pe_vocab *v = NULL;
    char err[256];
    int i;
    memset(m, 0, sizeof *m);
    mv_add(m, "<unk>", 0, PE_TOKEN_TYPE_UNKNOWN);
    mv_add(m, "<s>", 0, PE_TOKEN_TYPE_CONTROL);
    mv_add(m, "</s>", 0, PE_TOKEN_TYPE_CONTROL);
    for (i = 0; i < 256; i++) {
        char b[8];
        snprintf(b, sizeof b, "<0x%02X>", i);
        mv_add(m, b, 0, PE_TOKEN_TYPE_BYTE);
    }
    mv_add(m, "\xe2\x96\x81", -5, PE_TOKEN_TYPE_NORMAL); /* 259 */
    mv_add(m, "a", -3, PE_TOKEN_TYPE_NORMAL);            /* 260 */
    mv_add(m, "b", -3, PE_TOKEN_TYPE_NORMAL);            /* 261 */
    mv_add(m, "aa", -1, PE_TOKEN_TYPE_NORMAL);           /* 262 */
    mv_add(m, "ab", -1, PE_TOKEN_TYPE_NORMAL);           /* 263 */
    mv_add(m,
           "\xe2\x96\x81"
           "ab",
           -2, PE_TOKEN_TYPE_NORMAL);                  /* 264 */
    mv_add(m, "<|im_end|>", 0, PE_TOKEN_TYPE_CONTROL); /* 265 */
    p.model = "llama";
    p.n_tokens = m->n;
    p.tokens = m->toks;
    p.scores = m->scores;
    p.token_types = m->types;
    p.add_space_prefix = space_prefix;
    if (pe_vocab_create(&p, &v, err, sizeof err) != 0) fprintf(stderr, "make_spm: %s\n", err);
    return v;
}

static int expect_ids(const pe_vocab *v, const char *s, int add_special, int parse_special,
                      const int32_t *want, int64_t n_want)
{
    int64_t n, i;
    int32_t *got = tok(v, s, strlen(s), add_special, parse_special, &n);
    int ok = n == n_want;
    for (i = 0; ok && i < n; i++)
        ok = got[i] == want[i];
    if (!ok) {
        print_escaped("input:", s, strlen(s));
        print_ids("expected:", want, n_want);
        print_ids("got:     ", got, n);
    }
    free(got);
    return ok ? 0 : 1;
}

#define EXPECT(v, s, add, parse, ...)                                                              \
    do {                                                                                           \
        static const int32_t w_[] = {__VA_ARGS__};                                                 \
        if (expect_ids(v, s, add, parse, w_, (int64_t)(sizeof w_ / sizeof w_[0])) != 0)            \
            T_FAIL("tokenize mismatch");                                                           \
    } while (0)

static int test_spm_merges(void)
{
    mem_vocab m;
    pe_vocab *v = make_spm(&m, 0);
    int64_t n;
    T_ASSERT(v);
    /* "aaa": both pairs are "aa" with equal scores: the leftmost merges first */
    EXPECT(v, "aaa", 0, 0, 262, 260);
    /* "aab": "aa" and "ab" tie (-1); leftmost wins */
    EXPECT(v, "aab", 0, 0, 262, 261);
    /* unknown characters fall back to bytes: "é" = C3 A9 */
    EXPECT(v, "\xc3\xa9", 0, 0, 3 + 0xc3, 3 + 0xa9);
    /* add_special: BOS first (add_bos defaults to 1 for llama), no EOS */
    EXPECT(v, "ab", 1, 0, 1, 263);
    n = pe_tokenize(v, "", 0, 0, 0, NULL, 0);
    T_EQ(n, 0);
    EXPECT(v, "", 1, 0, 1);
    pe_vocab_destroy(v);

    v = make_spm(&m, 1);
    T_ASSERT(v);
    /* "▁ab" (-2) beats "▁" + "ab" once "ab" (-1) has merged */
    EXPECT(v, "ab", 0, 0, 264);
    EXPECT(v, "ab ab", 0, 0, 264, 264);
    /* parse_special: "<|im_end|>" is a token; the text after it gets the space prefix */
    EXPECT(v, "ab<|im_end|>ab", 0, 1, 264, 265, 264);
    pe_vocab_destroy(v);
    return 0;
}

static int test_streaming_decode(void)
{
    mem_vocab m;
    pe_vocab *v = make_spm(&m, 1);
    /* "🦙" = F0 9F A6 99, tokenized as four byte tokens */
    const char *llama = "\xf0\x9f\xa6\x99";
    int32_t ids[8];
    char out[64];
    size_t n, i;
    pe_detok d;
    T_ASSERT(v);
    T_EQ(pe_tokenize(v, llama, 4, 0, 0, ids, 8), 5); /* ▁ + 4 bytes */
    T_EQ(ids[0], 259);
    pe_detok_init(&d, v);
    T_EQ(pe_detok_push(&d, ids[0], out, sizeof out), 0); /* " " stripped: leading space */
    for (i = 1; i < 4; i++)
        T_EQ(pe_detok_push(&d, ids[i], out, sizeof out), 0); /* incomplete: held back */
    n = pe_detok_push(&d, ids[4], out, sizeof out);
    T_EQ(n, 4);
    T_ASSERT(memcmp(out, llama, 4) == 0);
    T_EQ(pe_detok_flush(&d, out, sizeof out), 0);
    /* a too-small buffer: nothing written, state kept, the size needed returned */
    pe_detok_init(&d, v);
    d.strip_space = 0;
    T_EQ(pe_detok_push(&d, 263, out, 1), 2); /* "ab" needs 2 */
    T_EQ(pe_detok_push(&d, 263, out, 2), 2);
    T_ASSERT(memcmp(out, "ab", 2) == 0);
    /* an incomplete sequence then ASCII: U+FFFD, then the ASCII */
    pe_detok_init(&d, v);
    T_EQ(pe_detok_push(&d, 3 + 0xf0, out, sizeof out), 0);
    n = pe_detok_push(&d, 260, out, sizeof out);
    T_EQ(n, 4);
    T_ASSERT(memcmp(out,
                    "\xef\xbf\xbd"
                    "a",
                    4) == 0);
    /* an incomplete sequence at the end: flush gives U+FFFD */
    T_EQ(pe_detok_push(&d, 3 + 0xe2, out, sizeof out), 0);
    T_EQ(pe_detok_push(&d, 3 + 0x96, out, sizeof out), 0);
    T_EQ(pe_detok_flush(&d, out, 2), 3);
    T_EQ(pe_detok_flush(&d, out, sizeof out), 3);
    T_ASSERT(memcmp(out, "\xef\xbf\xbd", 3) == 0);
    T_EQ(pe_detok_flush(&d, out, sizeof out), 0);
    /* a byte that never starts a character */
    T_EQ(pe_detok_push(&d, 3 + 0xff, out, sizeof out), 3);
    /* control tokens render empty and keep the leading-space rule armed */
    pe_detok_init(&d, v);
    T_EQ(pe_detok_push(&d, 1, out, sizeof out), 0);
    T_EQ(pe_detok_push(&d, 264, out, sizeof out), 2); /* "▁ab" -> "ab" */
    T_EQ(pe_detok_push(&d, 264, out, sizeof out), 3); /* -> " ab" */
    pe_vocab_destroy(v);
    return 0;
}

/* Byte-level BPE: the 256 byte characters, then "he" "Ġt" "Ġthe", merges in that order. */
static pe_vocab *make_bpe(mem_vocab *m, const char *pre)
{
    static const char *merges_c[] = {"h e", "\xc4\xa0 t", "\xc4\xa0t he"};
    pe_gguf_str merges[3];
    pe_vocab_params p = pe_vocab_default_params();
    pe_vocab *v = NULL;
    char err[256];
    int i;
    memset(m, 0, sizeof *m);
    for (i = 0; i < 256; i++) {
        /* GPT-2 alphabet: printable bytes stand for themselves, the rest shift to 256+ */
        uint32_t cp;
        char s[4];
        int n_low = 0, b;
        if ((i >= 0x21 && i <= 0x7e) || (i >= 0xa1 && i <= 0xac) || (i >= 0xae)) {
            cp = (uint32_t)i;
        } else {
            for (b = 0; b < i; b++)
                if (!((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae))) n_low++;
            cp = 256u + (uint32_t)n_low;
        }
        if (cp < 0x80) {
            s[0] = (char)cp;
            s[1] = 0;
        } else {
            s[0] = (char)(0xc0 | (cp >> 6));
            s[1] = (char)(0x80 | (cp & 0x3f));
            s[2] = 0;
        }
        mv_add(m, s, 0, PE_TOKEN_TYPE_NORMAL);
    }
    mv_add(m, "he", 0, PE_TOKEN_TYPE_NORMAL);             /* 256 */
    mv_add(m, "\xc4\xa0t", 0, PE_TOKEN_TYPE_NORMAL);      /* 257 */
    mv_add(m, "\xc4\xa0the", 0, PE_TOKEN_TYPE_NORMAL);    /* 258 */
    mv_add(m, "<|endoftext|>", 0, PE_TOKEN_TYPE_CONTROL); /* 259 */
    for (i = 0; i < 3; i++) {
        merges[i].ptr = merges_c[i];
        merges[i].len = strlen(merges_c[i]);
    }
    p.model = "gpt2";
    p.pre = pre;
    p.n_tokens = m->n;
    p.tokens = m->toks;
    p.token_types = m->types;
    p.n_merges = 3;
    p.merges = merges;
    p.bos_id = 259;
    p.eos_id = 259;
    if (pe_vocab_create(&p, &v, err, sizeof err) != 0) fprintf(stderr, "make_bpe: %s\n", err);
    return v;
}

static int test_bpe(void)
{
    static const char *pres[] = {"gpt-2",          "llama-bpe", "qwen2",     "deepseek-llm",
                                 "deepseek-coder", "default",   "starcoder", "falcon"};
    mem_vocab m;
    pe_vocab *v = make_bpe(&m, "gpt-2");
    char out[64];
    size_t i;
    T_ASSERT(v);
    T_EQ(pe_vocab_add_bos(v), 0);
    EXPECT(v, " the", 0, 0, 258);
    EXPECT(v, "the", 0, 0, 't', 256);
    /* "a<|endoftext|>b": one token with parse_special, bytes without */
    EXPECT(v, "a<|endoftext|>b", 0, 1, 'a', 259, 'b');
    EXPECT(v, "a<|endoftext|>b", 0, 0, 'a', '<', '|', 'e', 'n', 'd', 'o', 'f', 't', 'e', 'x', 't',
           '|', '>', 'b');
    T_ASSERT(pe_vocab_is_eog(v, 259));
    T_EQ(pe_detokenize(v, (const int32_t[]){258, 259, 't'}, 3, out, sizeof out), 5);
    T_ASSERT(memcmp(out, " thet", 5) == 0);
    pe_vocab_destroy(v);
    /* every supported pre-tokenizer compiles and keeps " the" together */
    for (i = 0; i < sizeof pres / sizeof pres[0]; i++) {
        v = make_bpe(&m, pres[i]);
        T_ASSERT(v);
        EXPECT(v, " the", 0, 0, 258);
        pe_vocab_destroy(v);
    }
    return 0;
}

/* Pre-tokenizer splits (GPT-2 encoded: "\xc4\xa0" is a space, "\xc4\x8a" a newline). */
static int check_split(const char *pre, const char *text, const char *const *want)
{
    pe_pretok *p;
    pe_words w;
    char err[256];
    size_t i, start = 0;
    memset(&w, 0, sizeof w);
    if (pe_pretok_create(pre, strlen(pre), &p, NULL, err, sizeof err) != 0) T_FAIL("%s", err);
    T_EQ(pe_pretok_split(p, text, strlen(text), &w), 0);
    for (i = 0; want[i]; i++) {
        size_t end = i < w.n ? w.ends[i] : start;
        if (i >= w.n || end - start != strlen(want[i]) ||
            memcmp(w.buf + start, want[i], end - start) != 0) {
            fprintf(stderr, "%s: word %zu: want '%s'\n", pre, i, want[i]);
            print_escaped("got:", w.buf + start, end - start);
            T_FAIL("split mismatch");
        }
        start = end;
    }
    T_EQ(w.n, i);
    pe_words_deinit(&w);
    pe_pretok_destroy(p);
    return 0;
}

static int test_pre_splits(void)
{
    static const char *text = "I'VE 1234567 don't\n\n  x!!\n";
    static const char *const llama3[] = {"I",
                                         "'VE",
                                         "\xc4\xa0",
                                         "123",
                                         "456",
                                         "7",
                                         "\xc4\xa0"
                                         "don",
                                         "'t",
                                         "\xc4\x8a\xc4\x8a",
                                         "\xc4\xa0",
                                         "\xc4\xa0x",
                                         "!!\xc4\x8a",
                                         NULL};
    static const char *const gpt2[] = {"I",
                                       "'",
                                       "VE",
                                       "\xc4\xa0"
                                       "1234567",
                                       "\xc4\xa0"
                                       "don",
                                       "'t",
                                       "\xc4\x8a\xc4\x8a\xc4\xa0",
                                       "\xc4\xa0x",
                                       "!!",
                                       "\xc4\x8a",
                                       NULL};
    /* U+0085 is White_Space for llama.cpp (PCRE2's \s lacks it) */
    static const char *const nel[] = {"a", "\xc3\x82\xc4\xa7", "\xc3\x82\xc4\xa7", "b", NULL};
    /* invalid bytes become U+FFFD (EF BF BD -> "ï¿½") */
    static const char *const bad[] = {"a", "\xc3\xaf\xc2\xbf\xc2\xbd", NULL};
    mem_vocab m;
    pe_vocab *v;
    T_EQ(check_split("llama3", text, llama3), 0);
    T_EQ(check_split("gpt-2", text, gpt2), 0);
    T_EQ(check_split("gpt-2",
                     "a\xc2\x85\xc2\x85"
                     "b",
                     nel),
         0);
    T_EQ(check_split("gpt-2", "a\xff", bad), 0);
    T_EQ(check_split("qwen2", "12", (const char *const[]){"1", "2", NULL}), 0);
    T_EQ(check_split("default", "12345", (const char *const[]){"123", "45", NULL}), 0);
    v = make_bpe(&m, "llama3");
    T_ASSERT(v);
    T_EQ(pe_vocab_add_bos(v), 1); /* llama3 defaults to BOS */
    EXPECT(v, " the", 1, 0, 259, 258);
    pe_vocab_destroy(v);
    T_ASSERT(make_bpe(&m, "no-such-pre") == NULL);
    return 0;
}

static int test_invalid_utf8(void)
{
    static const char *cases[] = {
        "\xff",     "\xc3",         "a\xe2\x96", "\xed\xa0\x80x",     "\xf7\xbf\xbf\xbfz",
        "\xc0\x80", "\x80\x80\x80", "\xf0\x9f",  "<|endoftext|\xff>", "\xe2\x96\x81\xe2\x96",
    };
    mem_vocab m1, m2;
    pe_vocab *vs[2];
    uint64_t seed = 42;
    size_t i, k, j;
    vs[0] = make_spm(&m1, 1);
    vs[1] = make_bpe(&m2, "llama3");
    T_ASSERT(vs[0] && vs[1]);
    for (k = 0; k < 2; k++) {
        for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            int64_t n, t;
            int32_t *ids = tok(vs[k], cases[i], strlen(cases[i]), 1, 1, &n);
            T_ASSERT(n > 0);
            for (t = 0; t < n; t++)
                T_ASSERT(ids[t] >= 0 && (uint32_t)ids[t] < pe_vocab_n_tokens(vs[k]));
            free(ids);
        }
        /* random bytes */
        for (i = 0; i < 200; i++) {
            char buf[64];
            int64_t n, t;
            int32_t *ids;
            char out[4096];
            size_t len = t_rand(&seed) % sizeof buf;
            for (j = 0; j < len; j++)
                buf[j] = (char)t_rand(&seed);
            ids = tok(vs[k], buf, len, 0, (int)(i & 1), &n);
            T_ASSERT(n >= 0);
            for (t = 0; t < n; t++)
                T_ASSERT(ids[t] >= 0 && (uint32_t)ids[t] < pe_vocab_n_tokens(vs[k]));
            /* SentencePiece keeps every byte (fallback): decoding gives them back */
            if (k == 0) {
                size_t dn = pe_detokenize(vs[k], ids, (size_t)n, out, sizeof out);
                T_ASSERT(dn <= sizeof out);
            }
            free(ids);
        }
    }
    pe_vocab_destroy(vs[0]);
    pe_vocab_destroy(vs[1]);
    return 0;
}

/* ---- strict UTF-8 validation ---- */

/* The reference: decode the code point, then refuse overlong forms, surrogates and values
 * above U+10FFFF (what the GGUF renderer and server/api.c each had before unicode.h). */
static size_t ref_valid_len(const uint8_t *s, size_t n)
{
    size_t len;
    uint32_t cp;
    if (n == 0) return 0;
    if (s[0] < 0x80) return 1;
    if (s[0] >= 0xc2 && s[0] <= 0xdf) {
        len = 2;
        cp = s[0] & 0x1f;
    } else if (s[0] >= 0xe0 && s[0] <= 0xef) {
        len = 3;
        cp = s[0] & 0x0f;
    } else if (s[0] >= 0xf0 && s[0] <= 0xf4) {
        len = 4;
        cp = s[0] & 0x07;
    } else {
        return 0;
    }
    if (len > n) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff))) return 0;
    if (cp >= 0xd800 && cp <= 0xdfff) return 0;
    return len;
}

/* Checks pe_utf8_valid_len against the reference on s[0..n) and on every prefix. */
static int check_valid_len(const uint8_t *s, size_t n)
{
    for (size_t k = 0; k <= n; k++) {
        if (pe_utf8_valid_len(s, k) != ref_valid_len(s, k)) {
            T_FAIL("pe_utf8_valid_len(%02x %02x %02x %02x, %zu) = %zu, reference %zu", s[0],
                   n > 1 ? s[1] : 0, n > 2 ? s[2] : 0, n > 3 ? s[3] : 0, k, pe_utf8_valid_len(s, k),
                   ref_valid_len(s, k));
        }
    }
    return 0;
}

static int test_utf8_validator(void)
{
    static const uint8_t edge[] = {0x00, 0x41, 0x7f, 0x80, 0x8f, 0x90, 0x9f,
                                   0xa0, 0xbf, 0xc0, 0xc2, 0xe0, 0xf4, 0xff};
    static const struct {
        const char *s;
        int valid;
    } strs[] = {
        {"", 1},
        {"plain ascii", 1},
        {"caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80", 1},
        {"\xef\xbf\xbf", 1},     /* U+FFFF */
        {"\xf4\x8f\xbf\xbf", 1}, /* U+10FFFF */
        {"\xed\x9f\xbf", 1},     /* U+D7FF */
        {"\xee\x80\x80", 1},     /* U+E000 */
        {"\xc0\x80", 0},         /* overlong NUL */
        {"\xc1\xbf", 0},         /* overlong */
        {"\xe0\x9f\xbf", 0},     /* overlong 3-byte */
        {"\xf0\x8f\xbf\xbf", 0}, /* overlong 4-byte */
        {"\xed\xa0\x80", 0},     /* U+D800 */
        {"\xed\xbf\xbf", 0},     /* U+DFFF */
        {"\xf4\x90\x80\x80", 0}, /* U+110000 */
        {"\xf5\x80\x80\x80", 0}, /* lead above F4 */
        {"a\x80", 0},            /* stray continuation */
        {"\xe2\x96", 0},         /* cut short */
        {"\xc3\xa9\xff", 0},     /* 0xFF */
    };
    uint8_t s[4];
    for (unsigned a = 0; a < 256; a++) {
        s[0] = (uint8_t)a;
        if (check_valid_len(s, 1)) return 1;
        for (unsigned b = 0; b < 256; b++) {
            s[1] = (uint8_t)b;
            if (check_valid_len(s, 2)) return 1;
            for (size_t c = 0; c < sizeof edge; c++) {
                s[2] = edge[c];
                if (check_valid_len(s, 3)) return 1;
                for (size_t d = 0; d < sizeof edge; d++) {
                    s[3] = edge[d];
                    if (check_valid_len(s, 4)) return 1;
                }
            }
        }
    }
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++) {
        if (pe_utf8_valid(strs[i].s, strlen(strs[i].s)) != strs[i].valid)
            T_FAIL("pe_utf8_valid(case %zu) != %d", i, strs[i].valid);
    }
    T_EQ(pe_utf8_valid("\xc3\xa9", 1), 0); /* n cuts the sequence */
    T_EQ(pe_utf8_valid(NULL, 0), 1);
    return 0;
}

static int test_max_out(void)
{
    mem_vocab m;
    pe_vocab *v = make_spm(&m, 0);
    int32_t ids[8];
    int i;
    T_ASSERT(v);
    for (i = 0; i < 8; i++)
        ids[i] = -7;
    /* "aaaaa" -> aa aa a: 3 tokens; room for 2 */
    T_EQ(pe_tokenize(v, "aaaaa", 5, 0, 0, ids, 2), 3);
    T_EQ(ids[0], 262);
    T_EQ(ids[1], 262);
    T_EQ(ids[2], -7);
    T_EQ(pe_tokenize(v, "aaaaa", 5, 0, 0, NULL, 0), 3);
    pe_vocab_destroy(v);
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* 1 MB inputs: words, one huge word, one run of spaces. The merge loops are
 * O(n log n); an O(n^2) one would take minutes here. */
static int big_inputs(const pe_vocab *v, const char *name)
{
    static const char *words[] = {"the ",  "quick ", "brown ",  "fox, ", "jumps\n",
                                  "über ", "12345 ", "日本語 ", "🦙 ", "don't "};
    const size_t size = 1u << 20;
    char *buf = malloc(size + 16);
    uint64_t seed = 7;
    size_t len = 0;
    int kind;
    T_ASSERT(buf);
    while (len < size) {
        const char *w = words[t_rand(&seed) % 10];
        size_t n = strlen(w);
        memcpy(buf + len, w, n);
        len += n;
    }
    for (kind = 0; kind < 3; kind++) {
        double t0;
        int64_t n;
        if (kind == 1) memset(buf, 'a', len);
        if (kind == 2) memset(buf, ' ', len);
        t0 = now_s();
        n = pe_tokenize(v, buf, len, 0, 0, NULL, 0);
        T_ASSERT(n > 0);
        printf("     %s: 1 MB (%s) -> %lld tokens in %.2f s\n", name,
               kind == 0   ? "words"
               : kind == 1 ? "'a' x 1M"
                           : "' ' x 1M",
               (long long)n, now_s() - t0);
        T_ASSERT(now_s() - t0 < 20.0);
    }
    free(buf);
    return 0;
}

static int test_big_inputs(void)
{
    mem_vocab m1, m2;
    pe_vocab *v = make_spm(&m1, 1);
    T_ASSERT(v && big_inputs(v, "spm (in memory)") == 0);
    pe_vocab_destroy(v);
    v = make_bpe(&m2, "gpt-2");
    T_ASSERT(v && big_inputs(v, "bpe gpt-2 (in memory)") == 0);
    pe_vocab_destroy(v);
    v = make_bpe(&m2, "llama3");
    T_ASSERT(v && big_inputs(v, "bpe llama3 (in memory)") == 0);
    pe_vocab_destroy(v);
    v = make_bpe(&m2, "deepseek-llm");
    T_ASSERT(v && big_inputs(v, "bpe deepseek-llm (in memory)") == 0);
    pe_vocab_destroy(v);
    v = load_vocab("vocab/ggml-vocab-llama-spm.gguf");
    if (v) {
        T_ASSERT(big_inputs(v, "llama-spm") == 0);
        pe_vocab_destroy(v);
    }
    v = load_vocab("vocab/ggml-vocab-gpt-2.gguf");
    if (v) {
        T_ASSERT(big_inputs(v, "gpt-2") == 0);
        pe_vocab_destroy(v);
    }
    return 0;
}

/* ---- bounded tokenization (pe_tokenize_ex) ---- */

/* Random texts built from pieces that stress the bound: words, runs of spaces, special
 * token texts, invalid and overlong UTF-8 (a code point from 4 bytes), NUL. */
static size_t random_text(uint64_t *seed, char *buf, size_t cap)
{
    static const char *pieces[] = {
        "the ",
        "a",
        "ab",
        "  ",
        "\n",
        "\xff",
        "\xc0\x80",
        "\xf0\x80\x80\x80",
        "\xf0\x9f\xa6\x99",
        "<s>",
        "</s>",
        "<|im_end|>",
        "<|endoftext|>",
        "<|end|>",
        "<|user|>",
        "\t \t",
        "Once upon",
        "\0",
    };
    size_t n = 0, want = t_rand(seed) % 160;
    while (n < want) {
        size_t k = t_rand(seed) % (sizeof pieces / sizeof pieces[0]);
        size_t len = k == sizeof pieces / sizeof pieces[0] - 1 ? 1 : strlen(pieces[k]);
        if (n + len > cap) break;
        memcpy(buf + n, pieces[k], len);
        n += len;
    }
    return n;
}

/* For random texts: pe_tokenize_ex gives pe_tokenize's tokens when they fit max_tokens
 * and a count in (max_tokens, n] when not; n is at least the documented bound. strips:
 * whether the vocabulary may strip whitespace (the bound then counts non-space bytes). */
static int bounded_matches(const pe_vocab *v, const char *name, int strips)
{
    uint64_t seed = 99;
    size_t bytes = pe_vocab_max_token_bytes(v), it;
    char text[256];
    for (it = 0; it < 400; it++) {
        size_t len = random_text(&seed, text, sizeof text), i, nonspace = 0;
        int add = (int)(it & 1), parse = (int)((it >> 1) & 1);
        int64_t n, r;
        int32_t *want = tok(v, text, len, add, parse, &n), *got = NULL;
        pe_tokenize_params p = pe_tokenize_default_params();
        T_ASSERT(n >= 0);
        for (i = 0; i < len; i++)
            nonspace += !(text[i] == ' ' || (text[i] >= '\t' && text[i] <= '\r'));
        if (bytes) {
            size_t base = strips ? nonspace : len;
            if ((size_t)n < base / bytes + (base % bytes != 0)) {
                print_escaped("input:", text, len);
                T_FAIL("%s: %lld tokens, under the bound %zu / %zu", name, (long long)n, base,
                       bytes);
            }
        }
        p.add_special = add;
        p.parse_special = parse;
        p.max_tokens = (size_t)n;
        r = pe_tokenize_ex(v, text, len, &p, &got);
        T_EQ(r, n);
        T_ASSERT(n == 0 ? got == NULL : got != NULL);
        for (i = 0; i < (size_t)n; i++)
            T_EQ(got[i], want[i]);
        free(got);
        if (n > 0) {
            size_t max = (size_t)n / 2 + (it % 3 == 0 ? 0 : (size_t)(n - 1) / 2);
            if (max >= (size_t)n) max = (size_t)n - 1;
            p.max_tokens = max;
            got = (int32_t *)1;
            r = pe_tokenize_ex(v, text, len, &p, &got);
            T_ASSERT(r > (int64_t)max && r <= n);
            T_ASSERT(got == NULL);
        }
        free(want);
    }
    printf("     %s: bound %zu bytes per token holds, bounded == full on 400 texts\n", name, bytes);
    return 0;
}

/* A 16 MB text against a 4,096-token limit is refused without being tokenized. */
static int refused_fast(const pe_vocab *v, const char *name)
{
    const size_t size = 16u << 20;
    char *buf = malloc(size);
    pe_tokenize_params p = pe_tokenize_default_params();
    int32_t *out = NULL;
    double t0;
    int64_t r;
    size_t i;
    T_ASSERT(buf);
    for (i = 0; i < size; i++)
        buf[i] = "Once upon a time "[i % 17];
    p.add_special = 1;
    p.parse_special = 1;
    p.max_tokens = 4096;
    t0 = now_s();
    r = pe_tokenize_ex(v, buf, size, &p, &out);
    printf("     %s: 16 MB, max_tokens 4096 -> at least %lld tokens in %.4f s\n", name,
           (long long)r, now_s() - t0);
    T_ASSERT(r > 4096 && out == NULL);
    T_ASSERT(now_s() - t0 < 5.0);
    free(buf);
    return 0;
}

static int test_bounded(void)
{
    mem_vocab m1, m2;
    pe_vocab *v = make_spm(&m1, 1);
    T_ASSERT(v && pe_vocab_max_token_bytes(v) == 10); /* "<|im_end|>" */
    T_ASSERT(bounded_matches(v, "spm (in memory)", 0) == 0);
    T_ASSERT(refused_fast(v, "spm (in memory)") == 0);
    pe_vocab_destroy(v);
    v = make_bpe(&m2, "gpt-2");
    T_ASSERT(v && pe_vocab_max_token_bytes(v) == 4 * 13); /* "<|endoftext|>" */
    T_ASSERT(bounded_matches(v, "bpe gpt-2 (in memory)", 0) == 0);
    T_ASSERT(refused_fast(v, "bpe gpt-2 (in memory)") == 0);
    pe_vocab_destroy(v);
    v = make_bpe(&m2, "llama3");
    T_ASSERT(v && bounded_matches(v, "bpe llama3 (in memory)", 0) == 0);
    pe_vocab_destroy(v);
    {
        static const struct {
            const char *file;
            int strips;
        } files[] = {{"vocab/ggml-vocab-llama-spm.gguf", 0},
                     {"vocab/ggml-vocab-phi-3.gguf", 1},
                     {"vocab/ggml-vocab-gpt-2.gguf", 0},
                     {"stories260K.gguf", 0}};
        size_t i;
        for (i = 0; i < sizeof files / sizeof files[0]; i++) {
            v = load_vocab(files[i].file);
            if (!v) continue;
            T_ASSERT(pe_vocab_max_token_bytes(v) > 0);
            T_ASSERT(bounded_matches(v, files[i].file, files[i].strips) == 0);
            T_ASSERT(refused_fast(v, files[i].file) == 0);
            pe_vocab_destroy(v);
        }
    }
    return 0;
}

/* A vocabulary that drops bytes has no bound: bounded tokenization is still exact. */
static int test_bounded_no_bound(void)
{
    mem_vocab m;
    pe_vocab_params p = pe_vocab_default_params();
    pe_tokenize_params tp = pe_tokenize_default_params();
    pe_vocab *v = NULL;
    int32_t *out = NULL;
    char err[256];
    memset(&m, 0, sizeof m);
    mv_add(&m, "<s>", 0, PE_TOKEN_TYPE_CONTROL);
    mv_add(&m, "</s>", 0, PE_TOKEN_TYPE_CONTROL);
    mv_add(&m, "a", -1, PE_TOKEN_TYPE_NORMAL);
    p.model = "llama";
    p.n_tokens = m.n;
    p.tokens = m.toks;
    p.scores = m.scores;
    p.token_types = m.types;
    p.bos_id = 0;
    p.eos_id = 1;
    p.unk_id = -1;
    p.add_space_prefix = 0;
    T_OK(pe_vocab_create(&p, &v, err, sizeof err));
    T_EQ(pe_vocab_max_token_bytes(v), 0);
    /* "xxxxa": the x's have no token and no UNK: dropped; 1 token */
    tp.max_tokens = 1;
    T_EQ(pe_tokenize_ex(v, "xxxxa", 5, &tp, &out), 1);
    T_ASSERT(out && out[0] == 2);
    free(out);
    T_EQ(pe_tokenize_ex(v, "aaa", 3, &tp, &out), 3);
    T_ASSERT(out == NULL);
    pe_vocab_destroy(v);
    return 0;
}

/* Plain ranges: a control token's text inside one stays text; outside, it is the token. */
static int test_plain_spans(void)
{
    mem_vocab m;
    pe_vocab *v = make_spm(&m, 1);
    pe_tokenize_params p = pe_tokenize_default_params();
    /* template "ab<|im_end|>" + content "ab<|im_end|>" + template "<|im_end|>" */
    const char *text = "ab<|im_end|>ab<|im_end|><|im_end|>";
    pe_text_span content = {12, 12};
    int32_t *got = NULL, *want;
    int64_t n, nw, i;
    T_ASSERT(v);
    p.parse_special = 1;
    p.plain = &content;
    p.n_plain = 1;
    n = pe_tokenize_ex(v, text, strlen(text), &p, &got);
    /* the same as the three parts: special, then "ab<|im_end|>" as plain text, special */
    want = tok(v, "ab<|im_end|>ab", 14, 0, 1, &nw);
    T_ASSERT(nw == 3 && want[1] == 265);
    free(want);
    {
        int64_t n_mid;
        int32_t *mid = tok(v, "ab<|im_end|>", 12, 0, 0, &n_mid);
        T_ASSERT(n_mid > 2);
        T_EQ(n, 2 + n_mid + 1);
        T_EQ(got[0], 264);
        T_EQ(got[1], 265);
        /* the content follows a special token: it gets the space prefix, as before */
        for (i = 0; i < n_mid; i++)
            T_EQ(got[2 + i], mid[i]);
        T_EQ(got[n - 1], 265);
        for (i = 2; i < n - 1; i++)
            T_ASSERT(got[i] != 265);
        free(mid);
    }
    free(got);
    /* An occurrence straddling the range's end is no token either; the next one is. */
    {
        const char *t2 = "<|im_end|><|im_end|>";
        pe_text_span sp = {0, 3};
        p.plain = &sp;
        n = pe_tokenize_ex(v, t2, strlen(t2), &p, &got);
        T_ASSERT(n > 2 && got[n - 1] == 265);
        for (i = 0; i < n - 1; i++)
            T_ASSERT(got[i] != 265);
        free(got);
    }
    /* Without parse_special nothing changes; without ranges it is pe_tokenize. */
    p.plain = NULL;
    p.n_plain = 0;
    n = pe_tokenize_ex(v, text, strlen(text), &p, &got);
    T_EQ(n, 5);
    free(got);
    pe_vocab_destroy(v);
    return 0;
}

/* ---- load errors ---- */

/* Writes a small vocabulary GGUF with one thing changed by `mutate`, loads it and returns
 * the error message (empty on success). */
typedef void (*mutate_fn)(pe_gguf_writer *w);

static const char *load_with(mutate_fn mutate, char *err, size_t errlen)
{
    static const char *texts[] = {"<unk>", "<s>", "</s>", "a", "b"};
    pe_gguf_str toks[5];
    float scores[5] = {0, 0, 0, -1, -2};
    int32_t types[5] = {2, 3, 3, 1, 1};
    char path[512];
    pe_gguf_writer *w = pe_gguf_writer_create(3, 32);
    pe_gguf_file *f;
    pe_vocab *v = NULL;
    int i;
    for (i = 0; i < 5; i++) {
        toks[i].ptr = texts[i];
        toks[i].len = strlen(texts[i]);
    }
    err[0] = 0;
    pe_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    pe_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 5);
    pe_gguf_writer_set_arr(w, "tokenizer.ggml.scores", PE_GGUF_TYPE_FLOAT32, scores, 5);
    pe_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", PE_GGUF_TYPE_INT32, types, 5);
    pe_gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", 0xffffffffu);
    if (mutate) mutate(w);
    snprintf(path, sizeof path, "%s/v.gguf", g_tmp);
    if (pe_gguf_writer_write(w, path, NULL, NULL, err, errlen) != 0) {
        pe_gguf_writer_destroy(w);
        return err;
    }
    pe_gguf_writer_destroy(w);
    if (pe_gguf_open(path, &f, err, errlen) != 0) return err;
    if (pe_vocab_load(f, &v, err, errlen) == 0) err[0] = 0;
    pe_gguf_close(f);
    pe_vocab_destroy(v);
    unlink(path);
    return err;
}

static void m_model(pe_gguf_writer *w)
{
    pe_gguf_writer_set_str(w, "tokenizer.ggml.model", "t5");
}

static void m_bos(pe_gguf_writer *w)
{
    pe_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 5);
}

static void m_scores(pe_gguf_writer *w)
{
    static const float s[4] = {0};
    pe_gguf_writer_set_arr(w, "tokenizer.ggml.scores", PE_GGUF_TYPE_FLOAT32, s, 4);
}

static void m_types(pe_gguf_writer *w)
{
    static const float s[5] = {0};
    pe_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", PE_GGUF_TYPE_FLOAT32, s, 5);
}

static void m_dup(pe_gguf_writer *w)
{
    pe_gguf_str t[5] = {{"<unk>", 5}, {"<s>", 3}, {"</s>", 4}, {"a", 1}, {"a", 1}};
    pe_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", t, 5);
}

static void m_gpt2_no_merges(pe_gguf_writer *w)
{
    pe_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    pe_gguf_writer_set_str(w, "tokenizer.ggml.pre", "gpt-2");
}

static void m_gpt2_bad_pre(pe_gguf_writer *w)
{
    pe_gguf_str mg[1] = {{"a b", 3}};
    pe_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    pe_gguf_writer_set_str(w, "tokenizer.ggml.pre", "made-up");
    pe_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", mg, 1);
}

static void m_add_eos(pe_gguf_writer *w)
{
    pe_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", 1);
    pe_gguf_writer_set_i32(w, "tokenizer.ggml.eos_token_id", -1);
}

static void m_add_bos_type(pe_gguf_writer *w)
{
    pe_gguf_writer_set_u32(w, "tokenizer.ggml.add_bos_token", 1);
}

static int test_load_errors(void)
{
    char err[256];
    T_EQ(strlen(load_with(NULL, err, sizeof err)), 0);
#define EXPECT_ERR(fn, needle)                                                                     \
    do {                                                                                           \
        load_with(fn, err, sizeof err);                                                            \
        if (!strstr(err, needle)) T_FAIL("%s: got '%s', want '%s'", #fn, err, needle);             \
        printf("     %-18s -> %s\n", #fn, err);                                                    \
    } while (0)
    EXPECT_ERR(m_model, "tokenizer.ggml.model");
    EXPECT_ERR(m_bos, "tokenizer.ggml.bos_token_id");
    EXPECT_ERR(m_scores, "tokenizer.ggml.scores");
    EXPECT_ERR(m_types, "tokenizer.ggml.token_type");
    EXPECT_ERR(m_dup, "duplicate token 'a'");
    EXPECT_ERR(m_gpt2_no_merges, "tokenizer.ggml.merges");
    EXPECT_ERR(m_gpt2_bad_pre, "tokenizer.ggml.pre");
    EXPECT_ERR(m_add_eos, "tokenizer.ggml.add_eos_token");
    EXPECT_ERR(m_add_bos_type, "tokenizer.ggml.add_bos_token");
#undef EXPECT_ERR
    return 0;
}

int main(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(g_tmp, sizeof g_tmp, "%s/test_tokenizer.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_tmp)) {
        perror(g_tmp);
        return 1;
    }
    T_RUN(test_spm_merges);
    T_RUN(test_streaming_decode);
    T_RUN(test_bpe);
    T_RUN(test_pre_splits);
    T_RUN(test_invalid_utf8);
    T_RUN(test_utf8_validator);
    T_RUN(test_max_out);
    T_RUN(test_load_errors);
    T_RUN(test_conformance_llama_spm);
    T_RUN(test_conformance_phi3);
    T_RUN(test_conformance_gpt2);
    T_RUN(test_stories260k);
    T_RUN(test_big_inputs);
    T_RUN(test_bounded);
    T_RUN(test_bounded_no_bound);
    T_RUN(test_plain_spans);
    rmdir(g_tmp);
    if (!t_failed && g_missing) {
        fprintf(stderr, "skipped: %d passed; model files missing, so conformance was skipped\n",
                t_run);
        return 77;
    }
    T_DONE();
}
