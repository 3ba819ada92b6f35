/* SPDX-License-Identifier: MIT */
/*
 * test_eval_budget.c - `pagoda eval --kv-budget` (the budget protocol, tools/eval.c) as the
 * real binary on stories260K and text/stories-dev.txt, one 512-token chunk
 * (--chunks) so that each case runs in a few seconds on 2 cores:
 *   - --json has the keys eval always has (ppl, kl_mean, top1_agree, ...) and "kv_budget"
 *     {method, budget, kv_tokens_mean, dropped_tokens, compactions, dense_ppl}; the dense
 *     run of the protocol scores the positions plain eval scores, with its ppl (the same
 *     tokens, fed one at a time instead of in one batch);
 *   - a budget that keeps every token of the chunk (snapkv at half the chunk, pyramidkv at
 *     a budget whose top layer still holds the half) drops nothing: kl_mean 0 and
 *     top1_agree 1 exactly, and a note on stderr says the result equals dense; pyramidkv
 *     at half the chunk takes tokens from its top layers (kl_mean > 0, no note);
 *   - streaming at 64 drops: kl_mean > 0, and the sequence held at most budget +
 *     page_tokens slots while decoding (kv_tokens_mean <= 64 + 16);
 *   - the text output has the table row and the one "kv budget:" line;
 *   - bad values exit 2 naming the option: --kv-budget 0, --kv-budget-method x, a method
 *     without --kv-budget, --chunks 0, --kv-budget with --tier.
 * argv[1]: the pagoda binary; argv[2]: a scratch directory. Without the model or the text
 * (PGD_MODELS_DIR or ../shared/models) the model cases are left out and the program exits 77
 * once the rest has passed.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "proc.h"
#include "t.h"

static const char *bin, *dir;
static char model[1024], text[1024];
static char out[1 << 16], err[1 << 14];

/* Runs `pagoda ARGS`; fills out and err; returns the exit status (-1 on error). */
static int run(const char *args)
{
    return t_run_bin(bin, dir, args, out, sizeof out, err, sizeof err);
}

/* Runs `pagoda eval -c 512 --json` with extra args; parses the object into *o (caller
 * decrefs). */
static int eval_json(const char *extra, json_t **o)
{
    char args[4096];
    json_error_t je;
    snprintf(args, sizeof args, "eval -m '%s' -f '%s' -c 512 -t 2 --json %s", model, text, extra);
    int rc = run(args);
    if (rc != 0) T_FAIL("eval %s: exit %d: %s", extra, rc, err);
    *o = json_loads(out, 0, &je);
    if (!*o) T_FAIL("eval --json %s: not JSON (%s): %s", extra, je.text, out);
    return 0;
}

static double jnum(const json_t *o, const char *key)
{
    return json_number_value(json_object_get(o, key));
}

static int test_budget_json(void)
{
    static const char *const keys[] = {"tokens",     "ctx",      "chunks",  "scored",
                                       "ppl",        "ppl_err",  "kl_mean", "kl_max",
                                       "top1_agree", "compared", "ppl_f32", "kv_budget"};
    static const char *const bkeys[] = {"method",         "budget",      "kv_tokens_mean",
                                        "dropped_tokens", "compactions", "dense_ppl"};
    json_t *o, *plain;
    if (!model[0]) return 0;
    T_OK(eval_json("--chunks 1 --kv-budget 128", &o));
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
        if (!json_object_get(o, keys[k])) T_FAIL("eval --kv-budget --json: no key '%s'", keys[k]);
    json_t *kb = json_object_get(o, "kv_budget");
    for (size_t k = 0; k < sizeof bkeys / sizeof bkeys[0]; k++)
        if (!json_object_get(kb, bkeys[k])) T_FAIL("kv_budget: no key '%s'", bkeys[k]);
    T_ASSERT(strcmp(json_string_value(json_object_get(kb, "method")), "snapkv") == 0);
    T_EQ(json_integer_value(json_object_get(kb, "budget")), 128);
    T_EQ(json_integer_value(json_object_get(o, "chunks")), 1);
    T_EQ(json_integer_value(json_object_get(o, "scored")), 255); /* 512 - 1 - 256 */
    T_ASSERT(json_is_true(json_object_get(o, "compared")));
    /* snapkv compresses the 256-token prompt to 128 once: 128 slots dropped */
    T_EQ(json_integer_value(json_object_get(kb, "dropped_tokens")), 128);
    double kvt = jnum(kb, "kv_tokens_mean");
    if (!(kvt > 128 && kvt < 128 + 256)) T_FAIL("snapkv 128: kv_tokens_mean %g", kvt);
    double kl = jnum(o, "kl_mean"), top1 = jnum(o, "top1_agree");
    if (!(kl > 0 && top1 > 0 && top1 <= 1)) T_FAIL("snapkv 128: kl_mean %g top1 %g", kl, top1);
    /* the dense run of the protocol: plain eval's positions and (up to the batching of the
     * products) its ppl; the f32 cache makes it ppl_f32 too */
    T_OK(eval_json("--chunks 1", &plain));
    T_EQ(json_integer_value(json_object_get(plain, "scored")), 255);
    double dense = jnum(kb, "dense_ppl");
    if (fabs(dense / jnum(plain, "ppl") - 1) > 1e-4)
        T_FAIL("dense_ppl %.6f, plain eval %.6f", dense, jnum(plain, "ppl"));
    T_ASSERT(jnum(o, "ppl_f32") == dense);
    json_decref(plain);
    json_decref(o);
    return 0;
}

static int test_budget_keeps_all(void)
{
    static const char *const cases[] = {
        "--kv-budget 256",                              /* snapkv: the whole prompt */
        "--kv-budget 512 --kv-budget-method pyramidkv", /* top layer: 0.5 x 512 = 256 */
    };
    if (!model[0]) return 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char extra[256];
        json_t *o;
        snprintf(extra, sizeof extra, "--chunks 1 %s", cases[i]);
        T_OK(eval_json(extra, &o));
        json_t *kb = json_object_get(o, "kv_budget");
        if (jnum(o, "kl_mean") != 0.0 || jnum(o, "top1_agree") != 1.0)
            T_FAIL("%s: kl_mean %g top1_agree %.17g, want 0 and 1", cases[i], jnum(o, "kl_mean"),
                   jnum(o, "top1_agree"));
        T_EQ(json_integer_value(json_object_get(kb, "dropped_tokens")), 0);
        T_ASSERT(jnum(o, "ppl") == jnum(kb, "dense_ppl"));
        if (!strstr(err, "note:") || !strstr(err, "equals dense"))
            T_FAIL("%s: no note that the result equals dense: %s", cases[i], err);
        json_decref(o);
    }
    /* pyramidkv at 256 gives its top layers less than the prompt: they lose tokens (dead
     * slots; the bottom layer keeps all 256, so the sequence's slots stay), no note */
    json_t *o;
    T_OK(eval_json("--chunks 1 --kv-budget 256 --kv-budget-method pyramidkv", &o));
    json_t *kb = json_object_get(o, "kv_budget");
    T_EQ(json_integer_value(json_object_get(kb, "compactions")), 1);
    T_ASSERT(jnum(o, "kl_mean") > 0);
    T_ASSERT(strstr(err, "equals dense") == NULL);
    json_decref(o);
    return 0;
}

static int test_streaming_64(void)
{
    json_t *o;
    if (!model[0]) return 0;
    T_OK(eval_json("--chunks 1 --kv-budget 64 --kv-budget-method streaming", &o));
    json_t *kb = json_object_get(o, "kv_budget");
    T_ASSERT(strcmp(json_string_value(json_object_get(kb, "method")), "streaming") == 0);
    double kl = jnum(o, "kl_mean"), kvt = jnum(kb, "kv_tokens_mean");
    json_int_t pt = json_integer_value(json_object_get(o, "page_tokens"));
    if (!(kl > 0)) T_FAIL("streaming 64: kl_mean %g", kl);
    if (!(kvt >= 64 && kvt <= 64 + (double)pt))
        T_FAIL("streaming 64: kv_tokens_mean %g, want 64 .. %lld", kvt, (long long)(64 + pt));
    /* 511 tokens seen, at most 64 + page_tokens - 1 held at the end */
    T_ASSERT(json_integer_value(json_object_get(kb, "dropped_tokens")) >= 511 - 64 - pt);
    T_ASSERT(json_integer_value(json_object_get(kb, "compactions")) > 0);
    json_decref(o);
    return 0;
}

static int test_text_line(void)
{
    char args[4096];
    if (!model[0]) return 0;
    snprintf(args, sizeof args,
             "eval -m '%s' -f '%s' -c 512 -t 2 --chunks 1 --kv-budget 128 "
             "--kv-budget-method adakv",
             model, text);
    T_EQ(run(args), 0);
    if (!strstr(out, "\nf32+adakv:128 ") || !strstr(out, "\nkv budget: adakv 128 tokens") ||
        !strstr(out, "kv_tokens_mean") || !strstr(out, "(dense "))
        T_FAIL("eval --kv-budget: the table row or the budget line is missing: [%s]", out);
    return 0;
}

static int test_bad_values(void)
{
    static const struct {
        const char *args, *names;
    } cases[] = {
        {"--kv-budget 0", "--kv-budget"},
        {"--kv-budget -5", "--kv-budget"},
        {"--kv-budget x", "--kv-budget"},
        {"--kv-budget 64 --kv-budget-method x", "--kv-budget-method"},
        {"--kv-budget-method streaming", "--kv-budget-method"},
        {"--kv-budget 64 --chunks 0", "--chunks"},
        {"--kv-budget 64 --tier ram:1M", "--tier"},
    };
    char args[4096];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(args, sizeof args, "eval -m x.gguf -f x.txt %s", cases[i].args);
        int rc = run(args);
        if (rc != 2) T_FAIL("eval %s: exit %d, want 2 (%s)", cases[i].args, rc, err);
        if (!strstr(err, cases[i].names))
            T_FAIL("eval %s: the error does not name %s: %s", cases[i].args, cases[i].names, err);
    }
    return 0;
}

int main(int argc, char **argv)
{
    int rc = t_cli_args(argc, argv, NULL, &bin, &dir);
    if (rc != 0) return rc;
    int have_model = t_model_file(model, sizeof model, "stories260K.gguf");
    int have_text = t_model_file(text, sizeof text, "text/stories-dev.txt");
    if (!have_model || !have_text) {
        fprintf(stderr, "note: %s or %s not found: the model tests are skipped\n", model, text);
        model[0] = '\0';
    }
    T_RUN(test_bad_values);
    T_RUN(test_budget_json);
    T_RUN(test_budget_keeps_all);
    T_RUN(test_streaming_64);
    T_RUN(test_text_line);
    if (!model[0] && !t_failed) T_SKIP("stories260K.gguf or its text not found (PGD_MODELS_DIR)");
    T_DONE();
}
