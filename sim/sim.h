/* SPDX-License-Identifier: MIT */
/*
 * sim.h - the replay simulator behind `pagoda replay` and bench/bench_replay.c: runs an
 * in-memory trace through the real cache manager (include/pagoda/cache.h) over a
 * metadata-only pool whose pages are trace blocks, and counts hits.
 *
 * Model: by default requests are served one at a time, in trace order (no concurrency). For each
 * request: create a sequence, match its block hashes (the hits are the leading run of
 * resident blocks), then grow by one block and commit its hash, block by block, for the
 * rest; destroy the sequence, so its blocks stay cached until the policy evicts them.
 * When a request needs more pages than the pool has (everything else pinned by it), the
 * rest of that request is not inserted and counted in uncached_blocks.
 *
 * Timing model (params.model_timing): requests overlap. Request r arrives at its
 * timestamp and runs until arrival + its prefill + its decode are done:
 *     run_s = (tokens not found in the pool or a tier) / prefill_tps
 *           + output_length / decode_tps
 * (each request at those speeds, whatever else runs: no batching or queueing model).
 * While it runs its sequence lives, so its blocks stay referenced and cannot be evicted;
 * before a request is served, every request done by its arrival is destroyed, in
 * completion order (ties: trace order), and the rest at the end. The trace order is the
 * arrival order (timestamps are taken as non-decreasing; an earlier one counts as equal
 * to the one before). A request that finds the pool full of running requests' pages is
 * cut short as above (uncached_blocks).
 *
 * Block hashes: block i of a request is keyed by XXH3-128 of (key of block i-1, id i),
 * from a fixed seed. On a well-formed trace (equal ids at i imply equal prefixes) this
 * names exactly the blocks the ids name; on a malformed one (an id reused after another
 * prefix, or twice in one request) it still gives the cache a consistent prefix tree.
 *
 * Tokens: a request's tokens are its input_length, unless input_length does not reach
 * into its last block ((n-1)*block_tokens < input_length fails, e.g. 0 or a trace made
 * with another block size): then n*block_tokens, and the request is counted in
 * length_mismatch. Hit tokens of a request with k hit blocks: min(tokens, k*block_tokens);
 * block j holds min(tokens, (j+1)*bt) - min(tokens, j*bt) of them (the last may be partial).
 *
 * Tiers (params.tiers, fastest first) model the storage below the pool as the cache
 * manager moves pages (cache.h "Tiers"), write-back: each tier is a set of the same block
 * hashes, holding at most capacity_tokens / block_tokens blocks, ordered by a policy of
 * its own (any pgd_policy_ops of policy.h, the pool's policy unless the tier names one;
 * Belady in a tier asks the same future oracle as in the pool). A block the tier holds is
 * evictable there at once (no sequence references a tier copy): demotion is insert() +
 * unreferenced(), a promotion is hit() + unreferenced(), an eviction victim() + remove().
 *
 *     pool --evict--> tier 0 --evict--> tier 1 --> ... --> dropped
 *          <-----promote (copy stays in the tier)-----
 *
 *   Demotion: a block the pool evicts that no tier holds is written to tier 0; a block a
 *   tier evicts for room is written to the next tier unless that one holds it already
 *   (the last tier drops it). A tier of capacity 0 is skipped: it changes nothing.
 *   Eviction within a tier keeps the pool's leaf-only rule: the policy's accept() allows
 *   only a block of which the tier holds no child (its chain successor), so a tier loses
 *   the ends of its prefixes first (under LRU: the least recently used such block).
 *   Promotion: after the pool's match of k blocks, the blocks k, k+1, ... that some tier
 *   holds, in a row, are tier hits, each counted in the fastest tier holding it (the
 *   tiers were missed by the pool and by the faster tiers); they are touched (deepest
 *   first, as the pool releases them) and inserted into the pool like computed blocks, and
 *   their tier copies stay. So the pool's own hits do not depend on the tiers.
 *   Every block is a pool hit, a tier hit or a miss: blocks = hit_blocks + the tiers'
 *   hit_blocks + miss_blocks (the same for tokens).
 */
#ifndef PGD_TOOLS_SIM_H
#define PGD_TOOLS_SIM_H

#include <stddef.h>
#include <stdint.h>

#include "pagoda/cache.h"
#include "trace.h"

/* Largest block size: keeps blocks * block_tokens far from overflow. */
#define SIM_MAX_BLOCK_TOKENS (1u << 20)

/* Most tiers below the pool (as the cache manager allows). */
#define SIM_MAX_TIERS PGD_MAX_TIERS

/* One tier below the pool. */
typedef struct sim_tier {
    char name[16];            /* a label ("ram", "disk"): every tier is the same model */
    uint64_t capacity_tokens; /* rounded down to whole blocks; 0: the tier changes nothing */
    int has_policy;           /* 0: the pool's policy (sim_params.policy) */
    pgd_policy_kind policy;   /* with has_policy: this tier's (a built-in kind) */
} sim_tier;

typedef struct sim_params {
    pgd_policy_kind policy;
    uint64_t capacity_tokens; /* 0: unlimited, a page for every distinct block */
    uint32_t block_tokens;    /* tokens per block and page; power of two */
    int progress;             /* non-zero: \r progress line on stderr */
    int check;                /* non-zero: pgd_cache_check() after every request */
    const sim_tier *tiers;    /* [n_tiers] below the pool, fastest first; borrowed */
    uint32_t n_tiers;         /* 0: no tiers; at most SIM_MAX_TIERS */
    int model_timing;         /* non-zero: the timing model above; 0: sequential */
    double prefill_tps;       /* tokens/s of one request's prefill (model_timing), > 0 */
    double decode_tps;        /* tokens/s of one request's decode (model_timing), > 0 */
} sim_params;

/* Defaults of the timing model (`pagoda replay --prefill-tps / --decode-tps`). */
#define SIM_DEFAULT_PREFILL_TPS 10000.0
#define SIM_DEFAULT_DECODE_TPS 50.0

/* What one tier saw. Blocks moved are whole pages: bytes = blocks * block_tokens * bytes
 * per token of the model. */
typedef struct sim_tier_result {
    uint64_t capacity_blocks;
    uint64_t capacity_tokens; /* capacity_blocks * block_tokens */
    uint64_t hit_blocks;      /* missed by the pool and the faster tiers, found here and
                                 promoted (copied up into the pool); a block that finds no
                                 pool page (request larger than the pool) is a miss */
    uint64_t hit_tokens;      /* the tokens of those blocks */
    uint64_t demoted_blocks;  /* written into this tier (from the pool or the tier above) */
    uint64_t evicted_blocks;  /* dropped for room (then demoted to the next tier, if any) */
    uint64_t resident_blocks; /* held at the end of the replay */
} sim_tier_result;

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
    uint32_t n_tiers;         /* params.n_tiers */
    sim_tier_result tiers[SIM_MAX_TIERS];
    uint64_t miss_blocks; /* blocks neither the pool nor a tier held */
    uint64_t miss_tokens;
    uint64_t max_running; /* most requests alive at once (1 without model_timing) */
} sim_result;

/*
 * Replays t. Returns 0, or -1 with a reason in err (bad parameters, a policy kind that is
 * not built in, capacity too large for the pool, out of memory, cache or tier integrity
 * check failed). Runs on separate trace_sets or the same one (read only) may go on in
 * parallel threads.
 */
int sim_run(const sim_params *p, const trace_set *t, sim_result *out, char *err, size_t errlen);

#endif /* PGD_TOOLS_SIM_H */
