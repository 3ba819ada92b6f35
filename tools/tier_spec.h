/* SPDX-License-Identifier: MIT */
/*
 * tier_spec.h - the storage-tier options the engine commands share (`pagoda run`,
 * `pagoda eval`, `pagoda serve`): repeatable --tier specs and --hash-key-file, parsed into
 * created tiers (tier.h) and the pgd_tier_use list a context takes (pe_ctx_params.tiers).
 *
 *   --tier ram:SIZE[:q8_0|q4_0][:lz4|zstd][:policy=NAME]
 *   --tier disk:PATH:SIZE[:fsync][:direct][:write-through[=N]][:policy=NAME]
 *   --tier redis://[user:password@]host:port[,host:port...][/db][?options]
 *   --tier unix:///path/to/redis.sock[?options]
 *   --hash-key-file FILE
 *
 * Use: a command puts CLI_TIER_LONG_OPTIONS in its getopt_long table and passes every
 * option to cli_tier_option (which only parses: nothing is created yet); after the command
 * line, cli_tiers_open creates the tiers in the order given (fastest first) and reads the
 * hash key; cli_tiers_apply points a pe_ctx_params at them; cli_tiers_close closes them
 * after the context is destroyed. cli_tier_help prints the --help block.
 *
 * The hash key: the bytes of --hash-key-file (1..256 of them), else the stable key of the
 * first disk tier (pgd_tier_disk_key: kept in its directory, so block hashes match after
 * a restart), else none (a random key per context).
 *
 * A Redis tier (tier_redis.h; any position, documented as "after the local tiers") is
 * shared by instances: it requires --hash-key-file (its bytes are the tier's MAC key and
 * pin the block-hash key, so every instance with the file agrees on hashes and records).
 * Its URL is the library's (pgd_tier_redis_parse_url) plus two options of the CLI's,
 * removed before the library sees it: write-back (default: write-through, every committed
 * page is shared at once) and write-through=N (admission after N matches). With the
 * library's events=STREAM, cli_tiers_apply installs the tier's KV-event hooks as the
 * context's prefix-index events ("pool" BlockStored / BlockRemoved). Without
 * PGD_HAVE_REDIS (PGD_WITH_REDIS=OFF) such a spec is refused with a line saying so.
 */
#ifndef PGD_TOOLS_TIER_SPEC_H
#define PGD_TOOLS_TIER_SPEC_H

#include <stdint.h>
#include <stdio.h>

#include <pagoda/cache.h>

#include "model.h"

enum { CLI_TIER_RAM = 1, CLI_TIER_DISK = 2, CLI_TIER_REDIS = 3 };

#define CLI_TIER_PATH_MAX 1024
#define CLI_HASH_KEY_MAX 256

/* One --tier spec, parsed. */
typedef struct cli_tier_spec {
    char text[CLI_TIER_PATH_MAX + 64]; /* the spec as given (messages), maybe truncated; a
                                          Redis URL's password reads "***" */
    int kind;                          /* CLI_TIER_RAM, CLI_TIER_DISK or CLI_TIER_REDIS */
    uint64_t capacity_bytes;           /* SIZE */
    int store_type;                    /* ram: -1 (the pool's codec) or PGD_KV_Q8_0 / PGD_KV_Q4_0 */
    uint32_t compression;              /* ram: PGD_RECORD_RAW, _LZ4 or _ZSTD */
    char path[CLI_TIER_PATH_MAX];      /* disk: the directory */
    int fsync;                         /* disk: fsync each record */
    int o_direct;                      /* disk: O_DIRECT */
    int write_through;                 /* disk, redis: every committed page is written at once
                                          (redis: the default; write-back clears it) */
    uint32_t admit_hits; /* disk, redis, write-through: after this many matches (0: at once) */
    char url[CLI_TIER_PATH_MAX]; /* redis: the URL for the library (the CLI's options removed) */
    int events;                  /* redis: the URL names a KV-events stream (events=) */
    int policy; /* ram, disk: pgd_policy_kind ordering the tier (policy=; default LRU). A
                   Redis tier has none: Redis's maxmemory-policy orders it */
} cli_tier_spec;

/* The tiers of one command: specs from the command line, then what cli_tiers_open made. */
typedef struct cli_tiers {
    cli_tier_spec specs[PGD_MAX_TIERS];
    uint32_t n;                      /* specs given (and, once open, tiers) */
    const char *key_file;            /* --hash-key-file (borrowed from argv), or NULL */
    pgd_tier *tiers[PGD_MAX_TIERS];  /* open tiers, NULL before cli_tiers_open */
    pgd_tier_use use[PGD_MAX_TIERS]; /* for pe_ctx_params.tiers */
    uint8_t key[CLI_HASH_KEY_MAX];   /* the hash key */
    size_t key_len;                  /* 0: none (random per context) */
} cli_tiers;

/* Parses one --tier spec into *out. Returns 0, or -1 after printing one line on stderr,
 * "cmd: --tier 'SPEC': what is wrong", naming the part that is wrong. Pure otherwise. */
int cli_tier_spec_parse(const char *cmd, const char *spec, cli_tier_spec *out);

/* Option values of the two options (below the KV options' CLI_OPT_KV_FIRST is the
 * commands' own; these sit above both). */
enum { CLI_OPT_TIER = 0x5400, CLI_OPT_HASH_KEY_FILE };
#define CLI_TIER_LONG_OPTIONS                                                                      \
    {"tier", required_argument, 0, CLI_OPT_TIER},                                                  \
    {                                                                                              \
        "hash-key-file", required_argument, 0, CLI_OPT_HASH_KEY_FILE                               \
    }

/* Applies option opt (argument arg) to *t when it is --tier or --hash-key-file (t must be
 * zeroed before the first call). Returns 1 when it was one and is recorded, 0 when opt is
 * another option, -1 after printing "cmd: ...: why" on stderr (a bad spec, too many tiers,
 * --hash-key-file twice). */
int cli_tier_option(const char *cmd, int opt, const char *arg, cli_tiers *t);

/* Creates every tier of t in order and reads the hash key (see the file comment).
 * log / log_ud go to the tiers (pe_log_stderr shows their errors). Returns 0, or -1 after
 * printing one line per problem on stderr (a directory in use by another process, an
 * unreadable directory, a key file that is unreadable, empty or over 256 bytes, a Redis
 * tier without --hash-key-file (checked first: nothing is created) or one that cannot
 * connect or authenticate: the library's reason); then nothing is left open. */
int cli_tiers_open(const char *cmd, cli_tiers *t, pgd_log_fn log, void *log_ud);

/* Points cp at t's tiers and hash key (borrowed: t must outlive the context), and, when
 * its first Redis tier with an events stream is open, cp's prefix-index events at that
 * tier's hooks. With no tiers and no key file it changes nothing. */
void cli_tiers_apply(const cli_tiers *t, pe_ctx_params *cp);

/* Closes every open tier (after pe_ctx_destroy). Safe on a zeroed or half-open t. */
void cli_tiers_close(cli_tiers *t);

/* Evicts every cached page of c (none may be held by a sequence to be evicted) through
 * the write-back path into its tiers, a batch at a time (the write-back queue is bounded:
 * a full one drops pages), flushing the tiers after each batch: what `pagoda run` does at
 * exit so that the next run finds its pages in a disk tier. Returns PGD_OK or the first
 * flush error. */
int cli_cache_write_back(pgd_cache *c);

/* Prints the --help block of the two options (syntax, sizes, fsync policy, write-back vs
 * write-through, the Redis tier: its URL, options, key requirement and KV events; the hash
 * key), indented as the commands' option lists are. */
void cli_tier_help(FILE *out);

#endif /* PGD_TOOLS_TIER_SPEC_H */
