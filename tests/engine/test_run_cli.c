/* SPDX-License-Identifier: MIT */
/*
 * test_run_cli.c - drives the real `pagoda run` binary:
 *   - golden: stories260K, greedy, "Once upon a time", 64 tokens prints exactly the text
 *     llama.cpp prints (../shared/models/README.md);
 *   - the timing line names prompt and generated tokens and KV pages;
 *   - a missing model, a corrupt GGUF and a bad flag fail with a clear message;
 *   - numbers on the command line are parsed strictly (run, eval, serve): sizes are digits
 *     with an optional K/M/G/T suffix ("nan", "1e3", "0x10", "-5", "5MB" exit 2 naming
 *     the option), floats are finite decimals ("nan", "inf", hex refused), -n is -1 or a
 *     count, -t is 1..1024, --kv-memory is at most the machine's memory and --max-body at
 *     most 4G; valid values get past parsing (to the missing model: exit 1);
 *   - --policy NAME: every built-in kind generates what lru does; bogus and belady exit 2;
 *   - PGD_ISA=scalar and PGD_ISA=avx2 (the engine's ISA switch, engine/ops/ops.c) generate
 *     the default's text, on a prompt long enough for the matrix-matrix kernels; an unknown
 *     value warns, naming it, and changes nothing.
 * argv[1]: the pagoda binary; argv[2]: a scratch directory. The model comes from
 * $PGD_MODELS_DIR or ../shared/models beside the source tree (tests/proc.h); without it the
 * golden parts are left out and the program exits 77 (skipped) once the rest has passed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pagoda/policy.h>

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

/* Runs `pagoda ARGS` and expects exit 2 with want in the message on stderr. */
static int refused(const char *args, const char *want)
{
    int rc = run(args);
    if (rc != 2) T_FAIL("pagoda %s: exit %d, expected 2 (stderr: %s)", args, rc, err);
    if (!strstr(err, want)) T_FAIL("pagoda %s: stderr '%s' does not say '%s'", args, err, want);
    return 0;
}

/* Runs `pagoda ARGS` (a missing model) and expects the options to be accepted: exit 1
 * after trying to open the model. */
static int accepted(const char *args)
{
    int rc = run(args);
    if (rc != 1 || !strstr(err, "nonexistent")) T_FAIL("pagoda %s: exit %d: %s", args, rc, err);
    return 0;
}

static int test_numeric_flags(void)
{
    static const char *const bad_sizes[] = {"nan",  "inf",  "1e3", "0x10", "-5",  " 5", "5MB",
                                            "5KiB", "1.5G", "",    "M",    "5 M", "5MM"};
    static const char *const bad_floats[] = {"nan", "inf", "-inf", "0x1p-1", "1e400", "",
                                             ".",   "e5",  "1e",   "0.5x",   " 1"};
    char args[512];
    for (size_t i = 0; i < sizeof bad_sizes / sizeof *bad_sizes; i++) {
        snprintf(args, sizeof args, "serve -m /nonexistent.gguf --kv-memory '%s'", bad_sizes[i]);
        T_EQ(refused(args, "--kv-memory: '"), 0);
        T_ASSERT(strstr(err, "is not a size in bytes") != NULL);
        snprintf(args, sizeof args, "serve -m /nonexistent.gguf --max-body '%s'", bad_sizes[i]);
        T_EQ(refused(args, "--max-body: '"), 0);
    }
    T_EQ(refused("serve -m /nonexistent.gguf --kv-memory 0", "out of range"), 0);
    T_EQ(refused("serve -m /nonexistent.gguf --kv-memory 99999999999999999999", "out of range"), 0);
    T_EQ(refused("serve -m /nonexistent.gguf --kv-memory 16383T", "machine's memory"), 0);
    T_EQ(refused("serve -m /nonexistent.gguf --max-body 0", "out of range"), 0);
    T_EQ(refused("serve -m /nonexistent.gguf --max-body 5G", "out of range"), 0);
    T_EQ(accepted("serve -m /nonexistent.gguf --kv-memory 16M --max-body 4G"), 0);
    T_EQ(accepted("serve -m /nonexistent.gguf --kv-memory 4096 --max-body 256k"), 0);

    for (size_t i = 0; i < sizeof bad_floats / sizeof *bad_floats; i++) {
        snprintf(args, sizeof args, "run -m /nonexistent.gguf -p hi --temp '%s'", bad_floats[i]);
        T_EQ(refused(args, "--temp: "), 0);
        snprintf(args, sizeof args, "run -m /nonexistent.gguf -p hi --top-p '%s'", bad_floats[i]);
        T_EQ(refused(args, "--top-p: "), 0);
    }
    T_EQ(accepted("run -m /nonexistent.gguf -p hi --temp .5 --top-p 1. --min-p 5e-2 "
                  "--repeat-penalty +1.1"),
         0);

    T_EQ(refused("run -m /nonexistent.gguf -p hi -n -2", "-n: '-2' is neither -1"), 0);
    T_EQ(refused("run -m /nonexistent.gguf -p hi -n 1e3", "-n: "), 0);
    T_EQ(accepted("run -m /nonexistent.gguf -p hi -n -1"), 0);
    T_EQ(refused("run -m /nonexistent.gguf -p hi -t 1025", "-t: 1025 is out of range [1, 1024]"),
         0);
    T_EQ(refused("run -m /nonexistent.gguf -p hi -t 0", "-t: "), 0);
    T_EQ(accepted("run -m /nonexistent.gguf -p hi -t 1024"), 0);
    T_EQ(refused("eval -m /nonexistent.gguf -f x -t 1025", "-t: 1025 is out of range"), 0);
    T_EQ(refused("serve -m /nonexistent.gguf -t 1025", "--threads: 1025 is out of range"), 0);
    return 0;
}

/* --policy NAME (run, eval, serve: the pool's eviction policy): each built-in kind but
 * belady runs the golden prompt to the same text as LRU (a policy changes what stays
 * cached, never what is computed); an unknown name and belady exit 2 naming them; a tier's
 * policy= takes the same names. */
static int test_policy_flag(void)
{
    static const char *const kinds[] = {"lru", "s3fifo", "arc", "cost", "priority"};
    static const pgd_policy_kind kind_ids[] = {PGD_POLICY_LRU, PGD_POLICY_S3FIFO, PGD_POLICY_ARC,
                                               PGD_POLICY_COST, PGD_POLICY_PRIORITY};
    char args[4096], lru_out[8192] = "";
    T_EQ(refused("run -m /nonexistent.gguf -p hi --policy bogus",
                 "--policy: unknown policy 'bogus' (lru, s3fifo, arc, cost, priority)"),
         0);
    T_EQ(refused("run -m /nonexistent.gguf -p hi --policy belady", "only a trace replay"), 0);
    T_EQ(refused("serve -m /nonexistent.gguf --policy LRU", "unknown policy 'LRU'"), 0);
    T_EQ(refused("eval -m /nonexistent.gguf -f x --policy fifo", "unknown policy 'fifo'"), 0);
    T_EQ(refused("run -m /nonexistent.gguf -p hi --tier ram:1M:policy=belady",
                 "policy=: belady needs"),
         0);
    T_EQ(accepted("run -m /nonexistent.gguf -p hi --policy cost --tier ram:1M:policy=lru"), 0);
    T_EQ(accepted("serve -m /nonexistent.gguf --policy priority"), 0);
    T_EQ(run("eval -m /nonexistent.gguf -f /nonexistent.txt --policy arc"), 1); /* parsed */
    if (!model[0]) return 0;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        if (!pgd_policy_builtin(kind_ids[i])) {
            printf("  --policy %s: not built into libpagoda yet, skipped\n", kinds[i]);
            continue;
        }
        snprintf(args, sizeof args,
                 "run -m '%s' -p 'Once upon a time' -n 24 --temp 0 -c 128 -t 1 --policy %s "
                 "--tier ram:1M:policy=%s",
                 model, kinds[i], kinds[i]);
        if (run(args) != 0) T_FAIL("--policy %s: %s", kinds[i], err);
        if (!lru_out[0])
            snprintf(lru_out, sizeof lru_out, "%s", out);
        else if (strcmp(out, lru_out) != 0)
            T_FAIL("--policy %s printed [%s], lru [%s]", kinds[i], out, lru_out);
    }
    return 0;
}

/* Runs ARGS with PGD_ISA=ISA in the environment (NULL: unset). */
static int run_isa(const char *isa, const char *args)
{
    int rc;
    if (isa)
        setenv("PGD_ISA", isa, 1);
    else
        unsetenv("PGD_ISA");
    rc = run(args);
    unsetenv("PGD_ISA");
    return rc;
}

static int test_isa_env(void)
{
    static const char *const isas[] = {"scalar", "avx2", "avx2vnni", "avx512", "auto"};
    char args[4096], want[8192];
    if (!model[0]) return 0;
    /* 40-odd prompt tokens: the prefill goes through the matrix-matrix kernels too */
    snprintf(args, sizeof args,
             "run -m '%s' -p 'Once upon a time, there was a little girl named Lily. She loved "
             "to play outside in the park. One day, she saw a big, red ball.' -n 48 --temp 0 "
             "-c 256 -t 2",
             model);
    T_EQ(run_isa(NULL, args), 0);
    T_ASSERT(strlen(out) > 40);
    snprintf(want, sizeof want, "%s", out);
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        if (run_isa(isas[i], args) != 0) T_FAIL("PGD_ISA=%s: %s", isas[i], err);
        if (strcmp(out, want) != 0)
            T_FAIL("PGD_ISA=%s printed [%s], the default [%s]", isas[i], out, want);
    }
    T_EQ(run_isa("avx1024", args), 0);
    T_ASSERT(strstr(err, "PGD_ISA=avx1024 is not scalar, avx2, avx2vnni, avx512 or auto") != NULL);
    if (strcmp(out, want) != 0) T_FAIL("PGD_ISA=avx1024 printed [%s]", out);
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
    T_RUN(test_numeric_flags);
    T_RUN(test_policy_flag);
    T_RUN(test_isa_env);
    if (!model[0] && !t_failed) T_SKIP("stories260K.gguf not found (set PGD_MODELS_DIR)");
    T_DONE();
}
