/* SPDX-License-Identifier: MIT */
/*
 * test_tier_restart.c - a disk tier across processes, through the real `pagoda` binary on
 * stories260K (greedy, --deterministic, so a cached prefix gives the very tokens a cold
 * run gives):
 *   - `pagoda run --tier disk:DIR:64M` on a prompt, then again: the second run reports
 *     its prompt's whole pages (all but the last token) cached from "disk" in its stats
 *     line, and both print what a cold run without tiers prints;
 *   - runs with a write-through disk tier killed with SIGKILL while they generate (after
 *     several short delays), each followed by `pagoda tier inspect DIR`: no damaged
 *     record, ever; then a run on that directory still prints the cold run's text, and
 *     matches its prompt from disk when a killed run got that far;
 *   - a second process on a directory in use is refused with a clear error (the lock);
 *   - `pagoda eval --tier` runs every chunk through the promotion path: a lossless RAM tier
 *     and a disk tier promote every prefix page and change nothing (KL 0, top-1 100%);
 *     q8_0 and q4_0 RAM tiers show their damage as KL and top-1 against f32, q4_0 more.
 * argv[1]: the pagoda binary; argv[2]: a scratch directory. The model comes from
 * $PGD_MODELS_DIR or ../shared/models beside the source tree (tests/proc.h); without it the
 * test exits 77 (skipped).
 */
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>

#include "proc.h"
#include "t.h"

static const char *bin, *dir;
static char model[1024];
static char out[16384], err[16384]; /* stdout and stderr of the last run */
static char cold[16384];

#define PROMPT                                                                                     \
    "Once upon a time, there was a little girl named Lily. She loved to play outside in "          \
    "the park with her friends. One day, she saw a big red ball under a tree and she"

static int run(const char *args)
{
    return t_run_bin(bin, dir, args, out, sizeof out, err, sizeof err);
}

/* `run -m MODEL -p PROMPT` plus the common flags and extra, into buf. */
static void run_args(char *buf, size_t n, const char *n_predict, const char *extra)
{
    snprintf(buf, n,
             "run -m '%s' -p '" PROMPT "' -n %s --temp 0 --deterministic -t 2 -c 512 "
             "--no-display-prompt %s",
             model, n_predict, extra);
}

/* The N of "cached: N tokens (pool P, disk D)" in err, with *from_disk = D; -1 if absent. */
static long cached_from(const char *s, long *from_disk)
{
    const char *p = strstr(s, "| cached: ");
    long n, pool, disk;
    *from_disk = -1;
    if (!p || sscanf(p, "| cached: %ld tokens (pool %ld, disk %ld)", &n, &pool, &disk) != 3)
        return -1;
    *from_disk = disk;
    return n;
}

/* The prompt's tokens, from the stats line ("prompt: N tokens"). */
static long prompt_tokens(const char *s)
{
    const char *p = strstr(s, "prompt: ");
    long n;
    return p && sscanf(p, "prompt: %ld tokens", &n) == 1 ? n : -1;
}

static int test_restart_matches_from_disk(void)
{
    char args[4096], spec[1200], tdir[1100];
    long disk;
    snprintf(tdir, sizeof tdir, "%s/tier", dir);
    snprintf(args, sizeof args, "rm -rf '%s'", tdir);
    T_EQ(t_sh(args, out, sizeof out), 0);

    run_args(args, sizeof args, "48", "");
    T_EQ(run(args), 0);
    snprintf(cold, sizeof cold, "%s", out);
    long n_prompt = prompt_tokens(err);
    T_ASSERT(n_prompt > 32);
    const long want = (n_prompt - 1) / 16 * 16;

    snprintf(spec, sizeof spec, "--tier 'disk:%s:64M'", tdir);
    run_args(args, sizeof args, "48", spec);
    T_EQ(run(args), 0);
    if (strcmp(out, cold)) T_FAIL("first tiered run differs:\n[%s]\n[%s]", out, cold);
    T_EQ(cached_from(err, &disk), 0);

    T_EQ(run(args), 0);
    if (strcmp(out, cold)) T_FAIL("run from disk differs:\n[%s]\n[%s]", out, cold);
    T_EQ(cached_from(err, &disk), want);
    T_EQ(disk, want);
    printf("     %ld prompt tokens, %ld cached from disk after a restart\n", n_prompt, disk);

    /* The key file wins over the directory's key: another key matches nothing. */
    char kf[1200], spec2[2600];
    snprintf(kf, sizeof kf, "%s/other.key", dir);
    T_EQ(t_write_all(kf, "another key", 11), 0);
    snprintf(spec2, sizeof spec2, "%s --hash-key-file '%s'", spec, kf);
    run_args(args, sizeof args, "48", spec2);
    T_EQ(run(args), 0);
    if (strcmp(out, cold)) T_FAIL("run with another key differs");
    T_EQ(cached_from(err, &disk), 0);
    return 0;
}

/* `pagoda tier inspect DIR`: exit 0 and no damaged record. Returns 0 or fails. */
static int inspect_clean(const char *tdir)
{
    char args[1200];
    snprintf(args, sizeof args, "tier inspect '%s'", tdir);
    int rc = run(args);
    if (rc != 0) T_FAIL("tier inspect exited %d: %s%s", rc, out, err);
    /* "files: ok N, damaged N, foreign N, temp N, quarantined N" */
    const char *p = strstr(out, "files: ");
    long n_ok = -1, n = -1;
    if (!p || sscanf(p, "files: ok %ld, damaged %ld", &n_ok, &n) != 2)
        T_FAIL("tier inspect does not count the damaged records: %s", out);
    if (n != 0) T_FAIL("tier inspect reports %ld damaged records: %s", n, out);
    return 0;
}

static int test_kill_during_write_through(void)
{
    char args[4096], cmd[8192], spec[1200], tdir[1100];
    long disk = -1, matched_once = 0;
    snprintf(tdir, sizeof tdir, "%s/tier_wt", dir);
    snprintf(args, sizeof args, "rm -rf '%s'", tdir);
    T_EQ(t_sh(args, out, sizeof out), 0);
    snprintf(spec, sizeof spec, "--tier 'disk:%s:64M:write-through'", tdir);
    static const char *delays[] = {"0.02", "0.05", "0.1", "0.2", "0.4"};
    for (size_t i = 0; i < sizeof delays / sizeof delays[0]; i++) {
        /* Until the context is full: 512 tokens, every page written through as committed. */
        run_args(args, sizeof args, "-1", spec);
        snprintf(cmd, sizeof cmd,
                 "'%s' %s >/dev/null 2>&1 & p=$!; sleep %s; kill -9 $p 2>/dev/null; "
                 "wait $p 2>/dev/null; echo $?",
                 bin, args, delays[i]);
        T_EQ(t_sh(cmd, out, sizeof out), 0);
        /* A kill before the tier made its directory and key (the first, 20 ms in, on a
         * loaded machine: the model loads first) leaves nothing to inspect: no directory,
         * or one without key and records/, which the next run completes. */
        char kpath[1200];
        struct stat st;
        snprintf(kpath, sizeof kpath, "%s/key", tdir);
        if (stat(kpath, &st) == 0) T_OK(inspect_clean(tdir));
        /* Restart: the cold text, from whatever the killed runs left. */
        run_args(args, sizeof args, "48", spec);
        T_EQ(run(args), 0);
        if (strcmp(out, cold))
            T_FAIL("after kill -9 at %s s the output differs:\n[%s]\n[%s]", delays[i], out, cold);
        long n = cached_from(err, &disk);
        T_ASSERT(n >= 0 && disk == n);
        if (n > 0) matched_once = 1;
        T_OK(inspect_clean(tdir));
    }
    /* The runs that finished wrote the prompt through: the last restart matched it. */
    T_ASSERT(matched_once);
    return 0;
}

static int test_second_process_refused(void)
{
    char args[4096], cmd[16384], spec[1200], tdir[1100];
    snprintf(tdir, sizeof tdir, "%s/tier_lock", dir);
    snprintf(spec, sizeof spec, "--tier 'disk:%s:64M'", tdir);
    /* A run that holds the directory for a while (generating to the end, at -t 1). */
    run_args(args, sizeof args, "-1", spec);
    snprintf(
        cmd, sizeof cmd,
        "'%s' %s -t 1 >/dev/null 2>&1 & p=$!; sleep 0.05; "
        "'%s' %s >/dev/null 2>'%s/lock.err'; r=$?; kill -9 $p 2>/dev/null; wait $p 2>/dev/null; "
        "echo $r",
        bin, args, bin, args, dir);
    T_EQ(t_sh(cmd, out, sizeof out), 0);
    char path[1200];
    snprintf(path, sizeof path, "%s/lock.err", dir);
    t_slurp(path, err, sizeof err);
    /* Either the first had already finished (exit 0) or the second was refused (1). */
    long r = strtol(out, NULL, 10);
    if (r == 1) {
        if (!strstr(err, "in use")) T_FAIL("the refusal does not say why: %s", err);
    } else {
        T_EQ(r, 0);
        printf("     (the first run ended before the second started)\n");
    }
    return 0;
}

/* The number after "key": in the JSON object in out; -1e300 when absent. */
static double json_num(const char *key)
{
    char pat[128];
    double v;
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(out, pat);
    return p && sscanf(p + strlen(pat), "%lf", &v) == 1 ? v : -1e300;
}

static int test_eval_promotion(void)
{
    char text[1024], args[4096], tdir[1100];
    static const char *tiers[] = {"ram:64M", "disk:%s:64M", "ram:64M:q8_0", "ram:64M:q4_0"};
    double kl[4], top1[4];
    if (!t_model_file(text, sizeof text, "text/stories-dev.txt")) {
        printf("     (no text/stories-dev.txt: eval left out)\n");
        return 0;
    }
    snprintf(tdir, sizeof tdir, "%s/tier_eval", dir);
    /* A fresh directory: the disk tier survives restarts, so a record left by an earlier
     * run (another build, or PGD_ISA lowered, whose K/V round differently) would be
     * promoted instead of this run's pages, and the lossless check would see that. */
    snprintf(args, sizeof args, "rm -rf '%s'", tdir);
    T_EQ(t_sh(args, out, sizeof out), 0);
    for (int i = 0; i < 4; i++) {
        char spec[1200];
        snprintf(spec, sizeof spec, tiers[i], tdir);
        snprintf(args, sizeof args, "eval -m '%s' -f '%s' -c 128 -t 2 --json --tier '%s'", model,
                 text, spec);
        T_EQ(run(args), 0);
        double promoted = json_num("promoted_tokens"), promotable = json_num("promotable_tokens");
        T_ASSERT(promotable > 0);
        if (promoted != promotable)
            T_FAIL("%s: %.0f of %.0f prefix tokens promoted", spec, promoted, promotable);
        kl[i] = json_num("kl_mean");
        top1[i] = json_num("top1_agree");
        T_ASSERT(kl[i] > -1 && top1[i] > -1);
        printf("     eval --tier %-14s KL %.6f, top-1 %.2f%%\n", i == 1 ? "disk:DIR:64M" : tiers[i],
               kl[i], 100 * top1[i]);
    }
    T_ASSERT(kl[0] < 1e-9 && top1[0] == 1); /* lossless: the pages come back as they were */
    T_ASSERT(kl[1] < 1e-9 && top1[1] == 1);
    T_ASSERT(kl[2] > 0 && kl[2] < 0.01);
    T_ASSERT(kl[3] > kl[2] && top1[3] < 1);
    return 0;
}

int main(int argc, char **argv)
{
    int rc = t_cli_args(argc, argv, NULL, &bin, &dir);
    if (rc) return rc;
    if (!t_model_file(model, sizeof model, "stories260K.gguf"))
        T_SKIP("stories260K.gguf not found (set PGD_MODELS_DIR)");
    T_RUN(test_restart_matches_from_disk);
    T_RUN(test_kill_during_write_through);
    T_RUN(test_second_process_refused);
    T_RUN(test_eval_promotion);
    T_DONE();
}
