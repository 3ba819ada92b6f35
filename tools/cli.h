/* SPDX-License-Identifier: MIT */
/*
 * cli.h - what the `pagoda` CLI's commands share: their entry points (called by the
 * dispatcher in main.c with argv[0] set to "pagoda <command>"), exit codes and option
 * value parsing. Each command prints its own errors and returns an exit code.
 */
#ifndef PGD_TOOLS_CLI_H
#define PGD_TOOLS_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

enum {
    CLI_EXIT_OK = 0,
    CLI_EXIT_FAIL = 1, /* the command ran and failed: unreadable input, bad data, ... */
    CLI_EXIT_USAGE = 2 /* bad command line */
};

int cmd_replay(int argc, char **argv);
int cmd_gen_trace(int argc, char **argv);
int cmd_run(int argc, char **argv);         /* run.c */
int cmd_inspect(int argc, char **argv);     /* inspect.c */
int cmd_synth_model(int argc, char **argv); /* synth_model.c */
int cmd_serve(int argc, char **argv);       /* serve.c */
int cmd_bench(int argc, char **argv);       /* loadgen.c */
int cmd_eval(int argc, char **argv);
int cmd_tier(int argc, char **argv); /* tier.c */

/*
 * Parses s as a decimal integer in [min, max] for option opt of command cmd. Returns 0,
 * or -1 after printing "cmd: opt: why" on stderr.
 */
int cli_parse_u64(const char *cmd, const char *opt, const char *s, uint64_t min, uint64_t max,
                  uint64_t *out);

/*
 * Parses s as a size in bytes for option opt of command cmd: decimal digits with an
 * optional K, M, G or T suffix (either case; powers of 1024) and nothing else (no sign,
 * blank, fraction, exponent, hex, "nan", "B" or "iB"), in [min, max]. Returns 0, or -1
 * after printing "cmd: opt: why" on stderr.
 */
int cli_parse_size(const char *cmd, const char *opt, const char *s, uint64_t min, uint64_t max,
                   uint64_t *out);

/*
 * Parses s as a finite decimal number ([+-]digits[.digits][e[+-]digits], digits on at
 * least one side of the point) for option opt of command cmd: "nan", "inf" and hex floats
 * are refused. Range checks are the caller's. Returns 0, or -1 after printing why.
 */
int cli_parse_float(const char *cmd, const char *opt, const char *s, float *out);

/* The most compute threads -t/--threads takes (run, eval, serve); more threads than cores
 * only slow a step down, but the option does not second-guess the machine. */
#define CLI_MAX_THREADS 1024

/* Prints "Try '<cmd> --help'." on stderr and returns CLI_EXIT_USAGE. */
int cli_usage_error(const char *cmd);

/* Prints "<cmd>: unexpected argument '<arg>'" and the usage hint on stderr; returns
 * CLI_EXIT_USAGE. For an operand left after the options: argv[optind]. */
int cli_unexpected_arg(const char *cmd, const char *arg);

/*
 * The KV-cache options every engine command takes (run, eval, serve): --kv-type,
 * --kv-rotate, --kv-residual, --kv-select-pages, --page-tokens, --deterministic
 * (batch-invariant matrix products, pe_ctx_params.deterministic), --policy NAME (the
 * pool's eviction policy, pe_ctx_params.policy: cli_parse_policy without belady), and the
 * token budget --kv-budget TOKENS / --kv-budget-method NAME (pe_ctx_params.budget; the
 * method defaults to snapkv), and the sliding-window layers' --kv-window-dense (every page
 * kept, the window a mask only) / --kv-window-tokens N (their own pool's size). A command puts
 * CLI_KV_LONG_OPTIONS in its getopt_long table, passes every option to cli_kv_option first, and
 * calls cli_kv_finish after the options; its own option values must stay below CLI_OPT_KV_FIRST.
 */
enum {
    CLI_OPT_KV_FIRST = 0x4b00,
    CLI_OPT_KV_TYPE = CLI_OPT_KV_FIRST,
    CLI_OPT_KV_ROTATE,
    CLI_OPT_KV_RESIDUAL,
    CLI_OPT_KV_SELECT,
    CLI_OPT_PAGE_TOKENS,
    CLI_OPT_DETERMINISTIC,
    CLI_OPT_POLICY,
    CLI_OPT_KV_BUDGET,
    CLI_OPT_KV_BUDGET_METHOD,
    CLI_OPT_KV_WINDOW_DENSE,
    CLI_OPT_KV_WINDOW_TOKENS
};
#define CLI_KV_LONG_OPTIONS                                                                        \
    {"kv-type", required_argument, 0, CLI_OPT_KV_TYPE},                                            \
        {"kv-rotate", no_argument, 0, CLI_OPT_KV_ROTATE},                                          \
        {"kv-residual", required_argument, 0, CLI_OPT_KV_RESIDUAL},                                \
        {"kv-select-pages", required_argument, 0, CLI_OPT_KV_SELECT},                              \
        {"deterministic", no_argument, 0, CLI_OPT_DETERMINISTIC},                                  \
        {"policy", required_argument, 0, CLI_OPT_POLICY},                                          \
        {"kv-budget", required_argument, 0, CLI_OPT_KV_BUDGET},                                    \
        {"kv-budget-method", required_argument, 0, CLI_OPT_KV_BUDGET_METHOD},                      \
        {"kv-window-dense", no_argument, 0, CLI_OPT_KV_WINDOW_DENSE},                              \
        {"kv-window-tokens", required_argument, 0, CLI_OPT_KV_WINDOW_TOKENS},                      \
    {                                                                                              \
        "page-tokens", required_argument, 0, CLI_OPT_PAGE_TOKENS                                   \
    }

/* Applies option opt (with argument arg) to *cp when it is one of the KV options.
 * Returns 1 when it was one and is applied, 0 when opt is not a KV option, -1 after
 * printing "cmd: --option: why" on stderr. */
int cli_kv_option(const char *cmd, int opt, const char *arg, pe_ctx_params *cp);
/* After the options: turns --kv-budget / --kv-budget-method into cp->budget (the method's
 * defaults, pgd_budget_default_params) and checks it (pgd_budget_params_check; the model's
 * layers are checked again at pe_ctx_create). Returns 0, or -1 after printing "cmd:
 * --kv-budget...: why" on stderr (a method without --kv-budget, a budget the method's
 * sinks and window do not fit). */
int cli_kv_finish(const char *cmd, pe_ctx_params *cp);

/* Parses an eviction policy name for option opt of command cmd: lru, s3fifo, arc, cost,
 * priority, and belady when allow_belady (replay: it needs the future). Returns 0, or -1
 * after printing "cmd: opt: ..." on stderr naming the value and the valid names (belady
 * without allow_belady: why it is refused). The names are the CLI's: a kind this build's
 * library does not have is refused later, by the cache or tier that would run it. */
int cli_parse_policy(const char *cmd, const char *opt, const char *name, int allow_belady,
                     pgd_policy_kind *out);

/* Seconds on a monotonic clock. */
double cli_now_s(void);

/* Reads the whole file at path. Returns a malloc'ed buffer (caller frees) holding its
 * bytes plus a terminating NUL, with the byte count in *len (len may be NULL); NULL when
 * the file cannot be opened or read, or on out of memory. */
char *cli_read_file(const char *path, size_t *len);

/* Model-loading progress on stderr for pe_model_load (a pe_progress_fn; ud is a
 * cli_progress): "\rloading model: NN%" whenever the percentage reaches a new multiple of
 * step_pct, and at 100% followed by a newline. Start with last_pct = -1. */
typedef struct cli_progress {
    int step_pct; /* 1: every percent (run); 10: every 10% (serve) */
    int last_pct; /* -1 before the first call */
} cli_progress;
void cli_load_progress(void *ud, uint64_t done, uint64_t total);

#endif /* PGD_TOOLS_CLI_H */
