/* SPDX-License-Identifier: MIT */
/*
 * fuzz_tokenizer.c - fuzz target for the tokenizer (engine/text/vocab*.c, tokenize.c,
 * detok.c, tokenizer_pre.c, unicode.c): arbitrary bytes, which the chat server will pass
 * straight from clients.
 *
 * Input: byte 0 selects the vocabulary (a SentencePiece one, or byte-level BPE with one
 * of five pre-tokenizers) and the flags add_special / parse_special; the rest is the text.
 * The vocabularies are built in memory from arrays (no files), once: byte tokens, a few
 * merges, multi-byte and control/user-defined tokens, and the Phi-3 rstrip rule.
 *
 * Checks (abort on failure; ASan/UBSan catch the rest): tokenize succeeds, every id is in
 * range, a short out buffer gets exactly its prefix and nothing past it, streaming decode
 * of the ids (in a buffer of the documented size) gives valid UTF-8, pe_detokenize gives
 * the same bytes, and SentencePiece text that is valid UTF-8 without "▁" or special
 * tokens decodes back to itself.
 *
 * Built as a libFuzzer target with -DPGD_FUZZ=ON (clang), and always as a corpus replayer
 * (replay_main.c) that ctest runs over corpus/tokenizer/.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"
#include "unicode.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define N_VOCABS 6

static pe_vocab *g_vocab[N_VOCABS]; /* built on the first call, kept for the process */

static char g_text[600][24];
static pe_gguf_str g_toks[600];

static uint32_t add_tok(uint32_t n, const char *s)
{
    size_t len = strlen(s);
    memcpy(g_text[n], s, len);
    g_toks[n].ptr = g_text[n];
    g_toks[n].len = len;
    return n + 1;
}

static pe_vocab *build_spm(void)
{
    static const char *extra[] = {
        "\xe2\x96\x81",
        "a",
        "b",
        "ab",
        "\xe2\x96\x81"
        "a",
        "\xe2\x96\x81"
        "ab",
        "\xc3\xa9",
        "\xe6\x97\xa5",
        "\xe6\x97\xa5\xe6\x9c\xac",
        "<|im_start|>",
        "<|im_end|>",
        "<tool>",
        "</s>x",
        "\xe2\x96\x81\xe2\x96\x81",
    };
    static float scores[600];
    static int32_t types[600];
    pe_vocab_params p = pe_vocab_default_params();
    pe_vocab *v = NULL;
    char err[256];
    uint32_t n = 0, i;
    n = add_tok(n, "<unk>");
    n = add_tok(n, "<s>");
    n = add_tok(n, "</s>");
    types[0] = PE_TOKEN_TYPE_UNKNOWN;
    types[1] = types[2] = PE_TOKEN_TYPE_CONTROL;
    for (i = 0; i < 256; i++) {
        char b[8];
        snprintf(b, sizeof b, "<0x%02X>", i);
        types[n] = PE_TOKEN_TYPE_BYTE;
        n = add_tok(n, b);
    }
    for (i = 0; i < sizeof extra / sizeof extra[0]; i++) {
        scores[n] = -(float)(i % 5);
        types[n] = PE_TOKEN_TYPE_NORMAL;
        if (strchr(extra[i], '|')) types[n] = PE_TOKEN_TYPE_CONTROL;
        if (strcmp(extra[i], "<tool>") == 0) types[n] = PE_TOKEN_TYPE_USER_DEFINED;
        n = add_tok(n, extra[i]);
    }
    p.model = "llama";
    p.name = "Phi3-fuzz";
    p.n_tokens = n;
    p.tokens = g_toks;
    p.scores = scores;
    p.token_types = types;
    if (pe_vocab_create(&p, &v, err, sizeof err) != 0) {
        fprintf(stderr, "build_spm: %s\n", err);
        abort();
    }
    return v;
}

static pe_vocab *build_bpe(const char *pre)
{
    static const char *merges_c[] = {"h e",  "\xc4\xa0 t",        "\xc4\xa0t he",     "1 2",
                                     "12 3", "\xc4\x8a \xc4\x8a", "\xc3\xa6 \xc2\x97"};
    static const char *extra[] = {"he",  "\xc4\xa0t",        "\xc4\xa0the",     "12",
                                  "123", "\xc4\x8a\xc4\x8a", "\xc3\xa6\xc2\x97"};
    static char text[300][8];
    static pe_gguf_str toks[300];
    static int32_t types[300];
    pe_gguf_str merges[7];
    pe_vocab_params p = pe_vocab_default_params();
    pe_vocab *v = NULL;
    char err[256];
    uint32_t n = 0, i, k = 0;
    for (i = 0; i < 256; i++) {
        int printable = (i >= 0x21 && i <= 0x7e) || (i >= 0xa1 && i <= 0xac) || i >= 0xae;
        uint32_t cp = printable ? i : 256 + k++;
        if (cp < 0x80) {
            text[n][0] = (char)cp;
            toks[n].len = 1;
        } else {
            text[n][0] = (char)(0xc0 | (cp >> 6));
            text[n][1] = (char)(0x80 | (cp & 0x3f));
            toks[n].len = 2;
        }
        toks[n].ptr = text[n];
        types[n++] = PE_TOKEN_TYPE_NORMAL;
    }
    for (i = 0; i < sizeof extra / sizeof extra[0]; i++) {
        toks[n].ptr = extra[i];
        toks[n].len = strlen(extra[i]);
        types[n++] = PE_TOKEN_TYPE_NORMAL;
    }
    toks[n].ptr = "<|endoftext|>";
    toks[n].len = 13;
    types[n++] = PE_TOKEN_TYPE_CONTROL;
    toks[n].ptr = "<|im_end|>";
    toks[n].len = 10;
    types[n++] = PE_TOKEN_TYPE_USER_DEFINED;
    for (i = 0; i < 7; i++) {
        merges[i].ptr = merges_c[i];
        merges[i].len = strlen(merges_c[i]);
    }
    p.model = "gpt2";
    p.pre = pre;
    p.n_tokens = n;
    p.tokens = toks;
    p.token_types = types;
    p.n_merges = 7;
    p.merges = merges;
    p.bos_id = (int32_t)n - 2;
    p.eos_id = (int32_t)n - 2;
    if (pe_vocab_create(&p, &v, err, sizeof err) != 0) {
        fprintf(stderr, "build_bpe(%s): %s\n", pre, err);
        abort();
    }
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *pres[N_VOCABS] = {NULL,    "gpt-2",        "llama-bpe",
                                         "qwen2", "deepseek-llm", "default"};
    const pe_vocab *v;
    const char *text;
    size_t len, i, cap, pos = 0, n2;
    int32_t *ids, *ids2;
    int64_t n;
    int add_special, parse_special;
    char *out, *out2;
    pe_detok d;

    if (!g_vocab[0]) {
        g_vocab[0] = build_spm();
        for (i = 1; i < N_VOCABS; i++)
            g_vocab[i] = build_bpe(pres[i]);
    }
    if (size == 0) return 0;
    v = g_vocab[data[0] % N_VOCABS];
    add_special = (data[0] >> 3) & 1;
    parse_special = (data[0] >> 4) & 1;
    text = (const char *)data + 1;
    len = size - 1;

    n = pe_tokenize(v, text, len, add_special, parse_special, NULL, 0);
    if (n < 0) abort();
    ids = malloc(((size_t)n + 1) * sizeof *ids);
    ids2 = malloc(((size_t)n + 1) * sizeof *ids2);
    if (!ids || !ids2) abort();
    if (pe_tokenize(v, text, len, add_special, parse_special, ids, (size_t)n) != n) abort();
    for (i = 0; i < (size_t)n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= pe_vocab_n_tokens(v)) abort();
    /* a short buffer: exactly the prefix, nothing past it */
    ids2[n / 2] = -12345;
    if (pe_tokenize(v, text, len, add_special, parse_special, ids2, (size_t)n / 2) != n) abort();
    if (memcmp(ids, ids2, (size_t)(n / 2) * sizeof *ids) != 0 || ids2[n / 2] != -12345) abort();

    /* streaming decode, in a buffer of the documented bound per push */
    cap = 3 * (pe_vocab_max_piece(v) + 4);
    out = malloc(cap * ((size_t)n + 1) + 3);
    out2 = malloc(cap * ((size_t)n + 1) + 3);
    if (!out || !out2) abort();
    pe_detok_init(&d, v);
    for (i = 0; i < (size_t)n; i++) {
        size_t k = pe_detok_push(&d, ids[i], out + pos, cap);
        if (k > cap) abort();
        pos += k;
    }
    pos += pe_detok_flush(&d, out + pos, 3);
    if (!pe_utf8_valid(out, pos)) abort();
    n2 = pe_detokenize(v, ids, (size_t)n, out2, cap * ((size_t)n + 1) + 3);
    if (n2 != pos || memcmp(out, out2, pos) != 0) abort();
    /* SentencePiece keeps every byte: plain valid text decodes back to itself */
    if (pe_vocab_is_spm(v) && !add_special && pe_utf8_valid(text, len) && !memchr(text, '<', len) &&
        !memchr(text, '\xe2', len)) {
        if (pos != len || memcmp(out, text, len) != 0) abort();
    }
    free(ids);
    free(ids2);
    free(out);
    free(out2);
    return 0;
}
