/* SPDX-License-Identifier: MIT */
/*
 * main.c - the `pagoda` CLI: `pagoda <command> [options]`. This file only dispatches:
 * each command is a function in its own file (declared in cli.h) that receives argv with
 * argv[0] = "pagoda <command>", parses its own options and returns the exit code.
 * Adding a command (run, serve, bench, inspect) is one line in the table below.
 *
 * The CLI is a client of libpagoda: it includes include/pagoda/ only, never src/.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "pagoda/pagoda.h"

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

static int cmd_version(int argc, char **argv);
static int cmd_help(int argc, char **argv);

static const command commands[] = {
    {"replay", cmd_replay, "replay a request trace through the cache manager, report hits"},
    {"gen-trace", cmd_gen_trace, "write a synthetic request trace (Mooncake JSONL format)"},
    {"run", cmd_run, "generate text with a GGUF model on the paged KV cache"},
    {"inspect", cmd_inspect, "show a GGUF model's metadata, tensors and KV bytes per token"},
    {"synth-model", cmd_synth_model, "write a GGUF model with random weights of a real shape"},
    {"serve", cmd_serve, "serve a model over an OpenAI-compatible HTTP API with a prefix cache"},
    {"bench", cmd_bench, "load-test a server: shared-prefix workload, with/without prefix cache"},
    {"eval", cmd_eval, "perplexity of a model over a text, and a KV codec's KL divergence"},
    {"tier", cmd_tier, "inspect or clear a disk tier's directory (records, checksums)"},
    {"version", cmd_version, "print the version of pagoda and libpagoda"},
    {"help", cmd_help, "show this help, or a command's help: pagoda help COMMAND"},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *f)
{
    fprintf(f, "usage: pagoda <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++) {
        fprintf(f, "  %-10s  %s\n", commands[i].name, commands[i].summary);
    }
    fprintf(f, "\n'pagoda <command> --help' describes a command's options.\n");
}

static const command *find(const char *name)
{
    for (size_t i = 0; i < N_COMMANDS; i++) {
        if (strcmp(commands[i].name, name) == 0) return &commands[i];
    }
    return NULL;
}

static int cmd_version(int argc, char **argv)
{
    if (argc > 1) {
        fprintf(stderr, "%s: takes no arguments\n", argv[0]);
        return CLI_EXIT_USAGE;
    }
    printf("pagoda %s (libpagoda %s)\n", PGD_VERSION_STRING, pgd_version());
    return CLI_EXIT_OK;
}

static int cmd_help(int argc, char **argv)
{
    const command *c;
    char name[64];
    char help[] = "--help";
    char *sub_argv[3];

    if (argc < 2) {
        usage(stdout);
        return CLI_EXIT_OK;
    }
    c = find(argv[1]);
    if (!c || c->run == cmd_help) {
        if (!c) fprintf(stderr, "pagoda: unknown command '%s'\n\n", argv[1]);
        usage(c ? stdout : stderr);
        return c ? CLI_EXIT_OK : CLI_EXIT_USAGE;
    }
    snprintf(name, sizeof name, "pagoda %s", c->name);
    sub_argv[0] = name;
    sub_argv[1] = help;
    sub_argv[2] = NULL;
    return c->run(2, sub_argv);
}

int main(int argc, char **argv)
{
    const command *c;
    char name[64];

    if (argc < 2) {
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(argv[1], "--version") == 0) return cmd_version(1, argv);
    c = find(argv[1]);
    if (!c) {
        fprintf(stderr, "pagoda: unknown command '%s'\n\n", argv[1]);
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    snprintf(name, sizeof name, "pagoda %s", c->name);
    argv[1] = name;
    return c->run(argc - 1, argv + 1);
}
