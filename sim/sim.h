/* SPDX-License-Identifier: MIT */
/*
 * sim.h - the replay simulator behind `pagoda replay` and bench/bench_replay.c: runs an
 * in-memory trace through the real cache manager (include/pagoda/cache.h) over a
 * metadata-only pool whose pages are trace blocks, and counts hits.
 *
 * Model: requests are served one at a time, in trace order (no concurrency). For each
 * request: create a sequence, match its block hashes (the hits are the leading run of
 * resident blocks), then grow by one block and commit its hash, block by block, for the
 * rest; destroy the sequence, so its blocks stay cached until the policy evicts them.
 * When a request needs more pages than the pool has (everything else pinned by it), the
 * rest of that request is not inserted and counted in uncached_blocks.
 *
 * Block hashes: block i of a request is keyed by XXH3-128 of (key of block i-1, id i),
 * from a fixed seed. On a well-formed trace (equal ids at i imply equal prefixes) this
 * names exactly the blocks the ids name; on a malformed one (an id reused after another
 * prefix, or twice in one request) it still gives the cache a consistent prefix tree.
 *
 * Tokens: a request's tokens are its input_length, unless input_length does not reach
 * into its last block ((n-1)*block_tokens < input_length fails, e.g. 0 or a trace made
 * with another block size): then n*block_tokens, and the request is counted in
 * length_mismatch. Hit tokens of a request with k hit blocks: min(tokens, k*block_tokens).
 */
#ifndef PGD_TOOLS_SIM_H
#define PGD_TOOLS_SIM_H

#include <stddef.h>
#include <stdint.h>

#include "pagoda/cache.h"
#include "trace.h"

/* Largest block size: keeps blocks * block_tokens far from overflow. */
#define SIM_MAX_BLOCK_TOKENS (1u << 20)

typedef struct sim_params {
    pgd_policy_kind policy;
    uint64_t capacity_tokens; /* 0: unlimited, a page for every distinct block */
    uint32_t block_tokens;    /* tokens per block and page; power of two */
    int progress;             /* non-zero: \r progress line on stderr */
    int check;                /* non-zero: pgd_cache_check() after every request */
} sim_params;

typedef struct sim_result {
    uint64_t capacity_pages;
    uint64_t capacity_tokens; /* capacity_pages * block_tokens */
    uint64_t requests;
    uint64_t blocks;
    uint64_t hit_blocks;
    uint64_t tokens;
    uint64_t hit_tokens;
    uint64_t evictions;       /* pages evicted by the policy */
    uint64_t uncached_blocks; /* blocks not inserted: request larger than the pool */
    uint64_t length_mismatch; /* requests whose input_length disagrees with their blocks */
    double elapsed_s;         /* set-up (Belady's future index) + replay */
} sim_result;

/*
 * Replays t. Returns 0, or -1 with a reason in err (bad parameters, capacity too large
 * for the pool, out of memory, cache integrity check failed).
 */
int sim_run(const sim_params *p, const trace_set *t, sim_result *out, char *err, size_t errlen);

#endif /* PGD_TOOLS_SIM_H */
