/* SPDX-License-Identifier: MIT */
/*
 * fuzz_chat.c - fuzz target for the chat templates (engine/text/chat.c): pe_chat_detect on
 * arbitrary bytes (a GGUF's tokenizer.chat_template is outside input), and
 * pe_chat_render of fuzzed messages in every family (the server passes client messages).
 *
 * Input: the whole input, up to its first NUL, is a template text for pe_chat_detect.
 * For rendering, byte 0 sets the size of the error buffer (0..63, to fuzz truncation);
 * the rest is split on NUL bytes into at most 64 messages. The first byte of a chunk
 * picks the role (its value mod 8: 0-1 system, 2-3 user, 4-5 assistant, 6 the rest of
 * the chunk is the role, usually an unknown one, 7 a NULL content, or a NULL role when
 * the chunk is odd-sized); the rest of the chunk is the content.
 *
 * Checks (abort on failure; ASan/UBSan catch the rest): detection gives a family whose
 * name parses back to it; render returns 0 exactly when every role and content is valid,
 * else PGD_EINVAL with a terminated, non-empty message (room permitting) and *out NULL;
 * on success the chatml and plain results have exactly the length their format gives,
 * and every family ends with its generation prompt.
 *
 * Built as a libFuzzer target with -DPGD_FUZZ=ON (clang), and always as a corpus replayer
 * (replay_main.c) that ctest runs over corpus/chat/. From the fuzz build directory:
 *     ./tests/fuzz/fuzz_chat -max_total_time=150 -max_len=2048 \
 *         -dict=../tests/fuzz/chat.dict NEW_CORPUS_DIR ../tests/fuzz/corpus/chat
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pagoda/pagoda.h>

#include "chat.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_MSGS 64

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_chat: check failed: %s\n", what);
        abort();
    }
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

static int valid_role(const char *r)
{
    return r && (!strcmp(r, "system") || !strcmp(r, "user") || !strcmp(r, "assistant"));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size + 1);
    pe_chat_msg m[MAX_MSGS];
    size_t n = 0, errlen = 0;
    int all_valid = 1;
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = '\0';

    /* ---- detection ---- */
    pe_chat_family f = pe_chat_detect(buf), back;
    check((int)f >= 0 && (int)f < PE_CHAT_N_FAMILIES, "family in range");
    check(pe_chat_family_parse(pe_chat_family_name(f), &back) == 0 && back == f, "name");

    /* ---- messages ---- */
    if (size > 0) {
        errlen = data[0] % 64u;
        size_t pos = 1;
        while (pos < size && n < MAX_MSGS) {
            char *chunk = buf + pos;
            size_t len = strlen(chunk);
            unsigned sel = len ? (unsigned char)chunk[0] % 8u : 2u;
            const char *content = len ? chunk + 1 : chunk;
            static const char *const roles[] = {"system", "system",    "user",
                                                "user",   "assistant", "assistant"};
            if (sel < 6) {
                m[n].role = roles[sel];
                m[n].content = content;
            } else if (sel == 6) {
                m[n].role = content;
                m[n].content = content;
            } else {
                m[n].role = len % 2 ? NULL : "user";
                m[n].content = len % 2 ? content : NULL;
            }
            if (!valid_role(m[n].role) || !m[n].content) all_valid = 0;
            n++;
            pos += len + 1;
        }
    }

    /* ---- rendering in every family ---- */
    for (int fi = 0; fi < PE_CHAT_N_FAMILIES; fi++) {
        char err[64], *out = (char *)err;
        memset(err, 'x', sizeof err);
        int rc = pe_chat_render((pe_chat_family)fi, m, n, &out, errlen ? err : NULL, errlen);
        if (rc == PGD_ENOMEM) {
            check(out == NULL, "out NULL on ENOMEM");
            continue;
        }
        if (!all_valid) {
            check(rc == PGD_EINVAL && out == NULL, "EINVAL for a bad message");
            if (errlen) check(strlen(err) < errlen && (errlen == 1 || err[0]), "message");
            continue;
        }
        check(rc == 0 && out != NULL, "render succeeds");
        if (errlen) check(err[0] == '\0', "err cleared");
        size_t want = 0;
        for (size_t i = 0; i < n; i++) {
            size_t c = strlen(m[i].content), r = strlen(m[i].role);
            if (fi == PE_CHAT_CHATML)
                want += 12 + r + 1 + c + 11;                /* <|im_start|>r\nc<|im_end|>\n */
            if (fi == PE_CHAT_PLAIN) want += r + 2 + c + 1; /* "Role: c\n" */
        }
        if (fi == PE_CHAT_CHATML) check(strlen(out) == want + 22, "chatml length");
        if (fi == PE_CHAT_PLAIN) check(strlen(out) == want + 10, "plain length");
        static const char *const prompt[] = {
            "Assistant:",
            "<|im_start|>assistant\n",
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
            "",
            "<start_of_turn>model\n",
            "<|assistant|>\n",
        };
        check(ends_with(out, prompt[fi]), "ends with the generation prompt");
        free(out);
    }
    free(buf);
    return 0;
}
