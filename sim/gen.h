/* SPDX-License-Identifier: MIT */
/*
 * gen.h - a synthetic request trace generator (Mooncake format) with a known answer, for
 * `pagoda gen-trace`, the replay tests and bench/bench_replay.c.
 *
 * Workload: n_groups system prompts of system_blocks blocks each; n_sessions session slots,
 * each running a multi-turn conversation of `turns` turns (then a new conversation starts
 * in the slot); one-off requests (one_off_pct percent). Each step picks, pseudo-randomly,
 * a one-off or the next turn of a random slot, so sessions interleave.
 *   - a conversation picks a group; its first turn is the system prompt plus fresh blocks;
 *     turn t is turn t-1's full blocks plus 1 .. 2*turn_blocks-1 fresh blocks (a partial
 *     last block of turn t-1 is not reused: its content grew, so it is a new block);
 *   - a one-off is, half of the time, a random group's system prompt plus fresh blocks,
 *     else fresh blocks only (1 .. 4*turn_blocks of them);
 *   - input_length puts the last block at 1 .. block_tokens tokens (system prompt blocks
 *     and reused blocks are always full).
 * Ids are allocated when first emitted, counting up from id_base, so an id is fresh
 * exactly when this request allocated it; equal ids at position i always mean equal
 * prefixes. With unlimited capacity a block hits iff its id appeared before, hence
 *     unlimited_hit_blocks = blocks - distinct_ids,
 * which the generator counts from its construction (and likewise the hit tokens).
 * Everything is a pure function of the params (splitmix64 from seed).
 */
#ifndef PGD_TOOLS_GEN_H
#define PGD_TOOLS_GEN_H

#include <stddef.h>
#include <stdint.h>

typedef struct gen_params {
    uint64_t seed;
    uint64_t n_requests;
    uint32_t n_groups;      /* system prompts */
    uint32_t system_blocks; /* blocks per system prompt (0: none) */
    uint32_t n_sessions;    /* concurrently open conversations */
    uint32_t turns;         /* turns per conversation */
    uint32_t turn_blocks;   /* mean fresh blocks per turn */
    uint32_t one_off_pct;   /* percent of requests that are one-offs, 0..100 */
    uint32_t block_tokens;  /* tokens per block, for input_length */
    uint64_t id_base;       /* first id; ids stay below 2^63 */
} gen_params;

/* Returns the defaults: seed 1, 1000 requests, 8 groups of 8 system blocks, 32 sessions
 * of 6 turns of ~4 blocks, 25% one-offs, 512 tokens per block, ids from 0. */
gen_params gen_default_params(void);

typedef struct gen_request {
    uint64_t timestamp_ms;
    uint64_t input_length;
    uint64_t output_length;
    const uint64_t *ids; /* [n_ids], borrowed for the emit call */
    size_t n_ids;
} gen_request;

typedef struct gen_stats {
    uint64_t requests;
    uint64_t blocks;
    uint64_t distinct_ids;
    uint64_t tokens;               /* sum of input_length */
    uint64_t unlimited_hit_blocks; /* blocks - distinct_ids */
    uint64_t unlimited_hit_tokens; /* tokens of those blocks */
} gen_stats;

/* Called once per request, in order; a non-zero return stops the generator. */
typedef int (*gen_emit_fn)(void *ud, const gen_request *r);

/* Returns NULL if p is valid, else a message saying which parameter is wrong. */
const char *gen_check_params(const gen_params *p);

/*
 * Generates p->n_requests requests. Returns 0; -1 for bad params or no memory (*why set,
 * static storage); or emit's non-zero return. *st is filled in every case.
 */
int gen_run(const gen_params *p, gen_emit_fn emit, void *ud, gen_stats *st, const char **why);

#endif /* PGD_TOOLS_GEN_H */
