/* SPDX-License-Identifier: MIT */
/*
 * test_budget_cli.c - `pagoda run --kv-budget` as the real binary (issue 14):
 *   - stories260K, streaming at 64 tokens, 100 greedy tokens: exit 0, the timing line names
 *     the method and budget and reports tokens dropped (at least the tokens run beyond
 *     budget + a page) and pages freed; the sequence holds fewer than budget + a page of
 *     slots; the same with the default method (snapkv) over a longer prompt;
 *   - bad values exit 2 with a message naming the option: --kv-budget-method foo,
 *     --kv-budget 0 or negative, a method without --kv-budget; --help lists both options.
 * argv[1]: the pagoda binary; argv[2]: a scratch directory. The model comes from
 * $PGD_MODELS_DIR or ../shared/models beside the source tree (tests/proc.h); without it the
 * generation parts are left out and the program exits 77 (skipped) once the rest passed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proc.h"
#include "t.h"

static const char *bin, *dir;
static char model[1024];
static char out[16384], err[16384]; /* stdout and stderr of the last run */

static int run(const char *args)
{
    return t_run_bin(bin, dir, args, out, sizeof out, err, sizeof err);
}

/* The number after `key` in the timing line (err), or -1. */
static long long after(const char *key)
{
    const char *p = strstr(err, key);
    if (!p) return -1;
    return strtoll(p + strlen(key), NULL, 10);
}

/* The number just before " what" in the budget part of the timing line, or -1. */
static long long before(const char *what)
{
    const char *b = strstr(err, " | budget: ");
    const char *p = b ? strstr(b, what) : NULL;
    if (!p) return -1;
    while (p > b && p[-1] == ' ')
        p--;
    while (p > b && p[-1] >= '0' && p[-1] <= '9')
        p--;
    return strtoll(p, NULL, 10);
}

static int test_streaming(void)
{
    char args[4096];
    if (!model[0]) return 0;
    snprintf(args, sizeof args,
             "run -m '%s' -p 'Once upon a time' -n 100 --temp 0 -c 512 -t 2 --kv-budget 64 "
             "--kv-budget-method streaming",
             model);
    T_EQ(run(args), 0);
    if (!strstr(err, "budget: streaming 64 tokens")) T_FAIL("no budget in: %s", err);
    long long gen = after("generated: "), dropped = before("tokens dropped");
    long long slots = before("slots held"), freed = before("pages freed");
    T_EQ(gen, 100);
    /* 5 prompt tokens + 99 run after them; at most 64 + 15 slots held */
    T_ASSERT(slots > 0 && slots < 64 + 16);
    T_EQ(dropped + slots, 5 + 99);
    T_ASSERT(freed > 0);
    T_ASSERT(strlen(out) > 20); /* text was generated */
    return 0;
}

static int test_snapkv_default(void)
{
    char args[8192], prompt[4096];
    if (!model[0]) return 0;
    /* a prompt of some 200 tokens: snapkv (the default method) compresses it once */
    size_t n = 0;
    for (int i = 0; i < 40 && n + 64 < sizeof prompt; i++)
        n += (size_t)snprintf(prompt + n, sizeof prompt - n, "the little dog ran in the park. ");
    snprintf(args, sizeof args, "run -m '%s' -p '%s' -n 20 --temp 0 -c 512 -t 2 --kv-budget 64",
             model, prompt);
    T_EQ(run(args), 0);
    if (!strstr(err, "budget: snapkv 64 tokens")) T_FAIL("no snapkv budget in: %s", err);
    long long np = after("prompt: "), dropped = before("tokens dropped");
    long long slots = before("slots held");
    T_ASSERT(np > 128);
    T_EQ(dropped, np - 64);   /* once, at the prompt's end, to the budget */
    T_EQ(slots, 64 + 20 - 1); /* then one slot per token run */
    T_ASSERT(strstr(err, "(1 compactions)") != NULL);
    return 0;
}

/* `pagoda run ARGS` exits 2 with a message containing want on stderr. */
static int refused(const char *args, const char *want)
{
    char full[2048];
    snprintf(full, sizeof full, "run -m '%s' -p hi %s", model[0] ? model : "/nonexistent.gguf",
             args);
    T_EQ(run(full), 2);
    if (!strstr(err, want)) T_FAIL("%s: stderr does not name %s: %s", args, want, err);
    return 0;
}

static int test_bad_values(void)
{
    T_OK(refused("--kv-budget 64 --kv-budget-method foo", "--kv-budget-method"));
    T_OK(refused("--kv-budget-method foo", "'foo'"));
    T_OK(refused("--kv-budget 0", "--kv-budget"));
    T_OK(refused("--kv-budget -3", "--kv-budget"));
    T_OK(refused("--kv-budget-method h2o", "needs --kv-budget"));
    T_EQ(run("run --help"), 0);
    T_ASSERT(strstr(out, "--kv-budget N") != NULL);
    T_ASSERT(strstr(out, "--kv-budget-method") != NULL && strstr(out, "default snapkv") != NULL);
    return 0;
}

int main(int argc, char **argv)
{
    int rc = t_cli_args(argc, argv, NULL, &bin, &dir);
    if (rc != 0) return rc;
    if (!t_model_file(model, sizeof model, "stories260K.gguf")) {
        fprintf(stderr, "note: %s not found: the generation tests are skipped\n", model);
        model[0] = '\0';
    }
    T_RUN(test_bad_values);
    T_RUN(test_streaming);
    T_RUN(test_snapkv_default);
    if (!model[0] && !t_failed) T_SKIP("stories260K.gguf not found (set PGD_MODELS_DIR)");
    T_DONE();
}
