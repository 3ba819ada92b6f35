/* SPDX-License-Identifier: MIT */
/*
 * test_run_cli.c - drives the real `pagoda run` binary:
 *   - golden: stories260K, greedy, "Once upon a time", 64 tokens prints exactly the text
 *     llama.cpp prints (../shared/models/README.md);
 *   - the timing line names prompt and generated tokens and KV pages;
 *   - a missing model, a corrupt GGUF and a bad flag fail with a clear message.
 * argv[1]: the pagoda binary; argv[2]: a scratch directory. The model comes from
 * $PGD_MODELS_DIR or ../shared/models beside the source tree (tests/proc.h); without it the
 * golden parts are left out and the program exits 77 (skipped) once the rest has passed.
 */
#include <stdio.h>
#include <string.h>

#include "proc.h"
#include "t.h"

static const char *bin, *dir;
static char model[1024];
static char out[8192], err[8192]; /* stdout and stderr of the last run */

/* Runs `pagoda ARGS`; fills out and err; returns the exit status (-1 on error). */
static int run(const char *args)
{
    return t_run_bin(bin, dir, args, out, sizeof out, err, sizeof err);
}

static int test_golden(void)
{
    static const char want[] =
        "Once upon a time, there was a little girl named Lily. She loved to play outside in "
        "the park. One day, she saw a big, red ball. She wanted to play with it, but it was "
        "too high.\nLily's mom said\n";
    char args[4096];
    if (!model[0]) return 0;
    snprintf(args, sizeof args, "run -m '%s' -p 'Once upon a time' -n 64 --temp 0 -c 512 -t 2",
             model);
    T_EQ(run(args), 0);
    if (strcmp(out, want) != 0) T_FAIL("golden text differs:\n got: [%s]\nwant: [%s]", out, want);
    T_ASSERT(strstr(err, "prompt: 5 tokens") != NULL);
    T_ASSERT(strstr(err, "generated: 64 tokens") != NULL);
    T_ASSERT(strstr(err, "KV pages used: ") != NULL);
    /* the same with an f32 cache and one-token pages */
    snprintf(args, sizeof args,
             "run -m '%s' -p 'Once upon a time' -n 64 --temp 0 -c 512 --kv-type f32 "
             "--page-tokens 1 -b 2",
             model);
    T_EQ(run(args), 0);
    if (strcmp(out, want) != 0) T_FAIL("golden text (f32, 1-token pages) differs: [%s]", out);
    return 0;
}

static int test_errors(void)
{
    static const char corrupt[] = "GGUF\x03\x00\x00\x00garbage";
    char args[4096], bad[1100];
    T_EQ(run("run -m /nonexistent.gguf -p hi"), 1);
    T_ASSERT(strstr(err, "nonexistent.gguf") != NULL);

    snprintf(bad, sizeof bad, "%s/corrupt.gguf", dir);
    T_EQ(t_write_all(bad, corrupt, sizeof corrupt - 1), 0);
    snprintf(args, sizeof args, "run -m '%s' -p hi", bad);
    T_EQ(run(args), 1);
    T_ASSERT(strstr(err, "corrupt.gguf") != NULL);

    T_EQ(run("run -m x.gguf --kv-type q9"), 2);
    T_ASSERT(strstr(err, "--kv-type") != NULL);
    T_EQ(run("run -p hi"), 2);
    if (model[0]) {
        snprintf(args, sizeof args, "run -m '%s' -p hi --page-tokens 3", model);
        T_EQ(run(args), 2);
    }
    return 0;
}

int main(int argc, char **argv)
{
    int rc = t_cli_args(argc, argv, NULL, &bin, &dir);
    if (rc != 0) return rc;
    if (!t_model_file(model, sizeof model, "stories260K.gguf")) {
        fprintf(stderr, "note: %s not found: the golden tests are skipped\n", model);
        model[0] = '\0';
    }
    T_RUN(test_golden);
    T_RUN(test_errors);
    if (!model[0] && !t_failed) T_SKIP("stories260K.gguf not found (set PGD_MODELS_DIR)");
    T_DONE();
}
