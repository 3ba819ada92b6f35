/* SPDX-License-Identifier: MIT */
/*
 * test_textout.c - server/textout.c: tokens to client text with stop strings, on an
 * in-memory SentencePiece vocabulary whose byte tokens let a test push any text one byte
 * (one token) at a time:
 *   - without stops everything is ready at once; with stops, a suffix that may start a
 *     stop string is held back and released when it cannot (or at finish);
 *   - a stop string spanning tokens cuts the text where it starts; later tokens are
 *     ignored; the earliest completed stop wins; overlapping prefixes ("aab" in "aaab");
 *   - UTF-8: a character split over byte tokens is released whole;
 *   - limits: empty stop strings are ignored, more than PS_MAX_STOPS is refused.
 */
#include <stdio.h>
#include <string.h>

#include "t.h"
#include "textout.h"

#include <pagoda/pagoda.h>

typedef struct mem_vocab {
    pe_gguf_str toks[300];
    int32_t types[300];
    char text[300][16];
    uint32_t n;
} mem_vocab;

static void mv_add(mem_vocab *m, const char *s, int32_t type)
{
    size_t len = strlen(s);
    memcpy(m->text[m->n], s, len);
    m->toks[m->n].ptr = m->text[m->n];
    m->toks[m->n].len = len;
    m->types[m->n++] = type;
}

static pe_vocab *g_v;
static mem_vocab g_mv;

/* <unk> <s> </s>, then <0x00>..<0xFF> as ids 3..258, then "hello" (259). */
static pe_vocab *make_vocab(void)
{
    pe_vocab_params p = pe_vocab_default_params();
    pe_vocab *v = NULL;
    char err[256];
    mv_add(&g_mv, "<unk>", PE_TOKEN_TYPE_UNKNOWN);
    mv_add(&g_mv, "<s>", PE_TOKEN_TYPE_CONTROL);
    mv_add(&g_mv, "</s>", PE_TOKEN_TYPE_CONTROL);
    for (int i = 0; i < 256; i++) {
        char b[8];
        snprintf(b, sizeof b, "<0x%02X>", i);
        mv_add(&g_mv, b, PE_TOKEN_TYPE_BYTE);
    }
    mv_add(&g_mv, "hello", PE_TOKEN_TYPE_NORMAL);
    p.model = "llama";
    p.n_tokens = g_mv.n;
    p.tokens = g_mv.toks;
    p.token_types = g_mv.types;
    p.add_space_prefix = 0;
    if (pe_vocab_create(&p, &v, err, sizeof err)) fprintf(stderr, "vocab: %s\n", err);
    return v;
}

/* Pushes s one byte token at a time; returns the last push's result. */
static int push_str(ps_textout *t, const char *s)
{
    int rc = 0;
    for (; *s; s++)
        rc = ps_textout_push(t, 3 + (unsigned char)*s);
    return rc;
}

/* Appends what is ready to acc. */
static void take(ps_textout *t, char *acc, size_t cap)
{
    const char *p;
    size_t n = ps_textout_take(t, &p);
    size_t l = strlen(acc);
    if (l + n < cap) {
        memcpy(acc + l, p, n);
        acc[l + n] = '\0';
    }
}

static int test_no_stops(void)
{
    ps_textout t;
    char acc[64] = "";
    T_OK(ps_textout_init(&t, g_v, NULL, 0));
    T_EQ(push_str(&t, "Hi, "), 0);
    take(&t, acc, sizeof acc);
    T_ASSERT(strcmp(acc, "Hi, ") == 0);
    T_EQ(ps_textout_push(&t, 259), 0);
    take(&t, acc, sizeof acc);
    T_ASSERT(strcmp(acc, "Hi, hello") == 0);
    T_OK(ps_textout_finish(&t));
    take(&t, acc, sizeof acc);
    T_ASSERT(strcmp(acc, "Hi, hello") == 0);
    T_EQ(t.n_tokens, 5);
    ps_textout_deinit(&t);
    return 0;
}

static int test_hold_back_and_stop(void)
{
    const char *stops[] = {"STOP"};
    ps_textout t;
    char acc[64] = "";
    T_OK(ps_textout_init(&t, g_v, stops, 1));
    T_EQ(push_str(&t, "abcS"), 0);
    take(&t, acc, sizeof acc);
    T_ASSERT(strcmp(acc, "abc") == 0); /* "S" may start "STOP" */
    T_EQ(push_str(&t, "T"), 0);
    take(&t, acc, sizeof acc);
    T_ASSERT(strcmp(acc, "abc") == 0);
    T_EQ(push_str(&t, "x"), 0); /* "STx" is no stop: released */
    take(&t, acc, sizeof acc);
    T_ASSERT(strcmp(acc, "abcSTx") == 0);
    T_EQ(push_str(&t, "ySTO"), 0);
    take(&t, acc, sizeof acc);
    T_ASSERT(strcmp(acc, "abcSTxy") == 0);
    T_EQ(push_str(&t, "P"), 1);
    T_ASSERT(t.stopped);
    take(&t, acc, sizeof acc);
    T_ASSERT(strcmp(acc, "abcSTxy") == 0);
    T_ASSERT(strcmp(t.text, "abcSTxy") == 0);
    T_EQ(t.n_tokens, 11);
    T_EQ(push_str(&t, "more"), 1); /* ignored */
    T_EQ(t.n_tokens, 11);
    T_OK(ps_textout_finish(&t));
    take(&t, acc, sizeof acc);
    T_ASSERT(strcmp(acc, "abcSTxy") == 0);
    ps_textout_deinit(&t);
    return 0;
}

static int test_finish_releases_tail(void)
{
    const char *stops[] = {"xyz", ""};
    ps_textout t;
    char acc[64] = "";
    T_OK(ps_textout_init(&t, g_v, stops, 2));
    T_EQ(t.n_stops, 1); /* the empty one is ignored */
    T_EQ(push_str(&t, "abxy"), 0);
    take(&t, acc, sizeof acc);
    T_ASSERT(strcmp(acc, "ab") == 0);
    T_OK(ps_textout_finish(&t));
    take(&t, acc, sizeof acc);
    T_ASSERT(strcmp(acc, "abxy") == 0);
    ps_textout_deinit(&t);
    return 0;
}

static int test_earliest_and_overlapping(void)
{
    const char *stops[] = {"abcd", "bc"};
    ps_textout t;
    T_OK(ps_textout_init(&t, g_v, stops, 2));
    T_EQ(push_str(&t, "zab"), 0);
    T_EQ(t.ready, 1); /* "ab" may start "abcd" */
    T_EQ(push_str(&t, "c"), 1);
    T_ASSERT(strcmp(t.text, "za") == 0);
    ps_textout_deinit(&t);

    const char *s2[] = {"aab"};
    T_OK(ps_textout_init(&t, g_v, s2, 1));
    T_EQ(push_str(&t, "aaa"), 0);
    T_EQ(t.ready, 1);
    T_EQ(push_str(&t, "b"), 1);
    T_ASSERT(strcmp(t.text, "a") == 0);
    ps_textout_deinit(&t);

    /* A stop string inside one multi-byte token. */
    const char *s3[] = {"ell"};
    T_OK(ps_textout_init(&t, g_v, s3, 1));
    T_EQ(push_str(&t, ">"), 0);
    T_EQ(ps_textout_push(&t, 259), 1);
    T_ASSERT(strcmp(t.text, ">h") == 0);
    ps_textout_deinit(&t);
    return 0;
}

static int test_utf8(void)
{
    const char *stops[] = {"\xe2\x82\xac"}; /* the euro sign */
    ps_textout t;
    char acc[64] = "";
    T_OK(ps_textout_init(&t, g_v, NULL, 0));
    T_EQ(ps_textout_push(&t, 3 + 0xE2), 0);
    T_EQ(ps_textout_push(&t, 3 + 0x82), 0);
    take(&t, acc, sizeof acc);
    T_EQ(strlen(acc), 0); /* an incomplete character is not released */
    T_EQ(ps_textout_push(&t, 3 + 0xAC), 0);
    take(&t, acc, sizeof acc);
    T_ASSERT(strcmp(acc, "\xe2\x82\xac") == 0);
    /* A truncated character at the end becomes U+FFFD. */
    T_EQ(ps_textout_push(&t, 3 + 0xE2), 0);
    T_OK(ps_textout_finish(&t));
    take(&t, acc, sizeof acc);
    T_ASSERT(strcmp(acc, "\xe2\x82\xac\xef\xbf\xbd") == 0);
    ps_textout_deinit(&t);

    T_OK(ps_textout_init(&t, g_v, stops, 1));
    T_EQ(push_str(&t, "a\xe2\x82"), 0);
    T_EQ(push_str(&t, "\xac"), 1);
    T_ASSERT(strcmp(t.text, "a") == 0);
    ps_textout_deinit(&t);
    return 0;
}

static int test_limits(void)
{
    const char *many[PS_MAX_STOPS + 1];
    ps_textout t;
    for (int i = 0; i <= PS_MAX_STOPS; i++)
        many[i] = "s";
    T_EQ(ps_textout_init(&t, g_v, many, PS_MAX_STOPS + 1), PGD_EINVAL);
    ps_textout_deinit(&t);
    T_OK(ps_textout_init(&t, g_v, many, PS_MAX_STOPS));
    ps_textout_deinit(&t);
    return 0;
}

/* A completion continues its prompt: the leading-space rule (tokenizer.h) strips the first
 * piece's space only when the prompt renders no text. A SentencePiece vocabulary with
 * add_space_prefix: <unk> <s> </s> "Once" "\u2581time". */
static int test_continue_keeps_space(void)
{
    static mem_vocab mv;
    mv_add(&mv, "<unk>", PE_TOKEN_TYPE_UNKNOWN);
    mv_add(&mv, "<s>", PE_TOKEN_TYPE_CONTROL);
    mv_add(&mv, "</s>", PE_TOKEN_TYPE_CONTROL);
    mv_add(&mv, "Once", PE_TOKEN_TYPE_NORMAL);
    mv_add(&mv, "\xe2\x96\x81time", PE_TOKEN_TYPE_NORMAL);
    pe_vocab_params p = pe_vocab_default_params();
    pe_vocab *v = NULL;
    char err[256];
    p.model = "llama";
    p.n_tokens = mv.n;
    p.tokens = mv.toks;
    p.token_types = mv.types;
    p.add_space_prefix = 1;
    T_OK(pe_vocab_create(&p, &v, err, sizeof err));
    const int32_t text_prompt[] = {1, 3}, bos_only[] = {1};
    const struct {
        const int32_t *prompt;
        size_t n;
        int cont;
        const char *want;
    } cases[] = {
        {text_prompt, 2, 1, " time"}, /* "Once" + " time" */
        {bos_only, 1, 1, "time"},     /* the text starts here */
        {text_prompt, 2, 0, "time"},  /* a chat message: a fresh text */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ps_textout t;
        char acc[64] = "";
        T_OK(ps_textout_init(&t, v, NULL, 0));
        if (cases[i].cont) ps_textout_continue(&t, cases[i].prompt, cases[i].n);
        T_EQ(ps_textout_push(&t, 4), 0);
        T_OK(ps_textout_finish(&t));
        take(&t, acc, sizeof acc);
        if (strcmp(acc, cases[i].want) != 0)
            T_FAIL("case %zu: '%s', expected '%s'", i, acc, cases[i].want);
        ps_textout_deinit(&t);
    }
    pe_vocab_destroy(v);
    return 0;
}

int main(void)
{
    g_v = make_vocab();
    if (!g_v) return 1;
    T_RUN(test_no_stops);
    T_RUN(test_hold_back_and_stop);
    T_RUN(test_finish_releases_tail);
    T_RUN(test_earliest_and_overlapping);
    T_RUN(test_utf8);
    T_RUN(test_limits);
    T_RUN(test_continue_keeps_space);
    pe_vocab_destroy(g_v);
    T_DONE();
}
