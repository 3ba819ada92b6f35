/* SPDX-License-Identifier: MIT */
/*
 * model.h - Llama-family models (architectures llama: Llama 1/2/3, Mistral, TinyLlama,
 * SmolLM; qwen2; qwen3; phi3; gemma2; gemma3: see pe_arch) loaded from GGUF, and the forward
 * pass whose attention reads and writes K/V through libpagoda pages and page tables.
 *
 *   pe_model_load(path)            mmap the GGUF, read <arch>.* hyper-parameters, check every
 *                                  tensor's type and shape, load the vocabulary
 *   pe_ctx_create(model, params)   a cache manager (pool sized in tokens), a thread pool,
 *                                  scratch buffers for chunks of up to n_batch tokens
 *   pe_forward(ctx, seq, tokens)   one chunk of a sequence: grows the sequence, writes K/V
 *                                  of every layer into its pages, commits the tokens (full
 *                                  pages become shareable prefix-cache entries), returns
 *                                  logits of the last token (or of every token)
 *
 * A context is used by one thread at a time (the scheduler's); the cache manager inside
 * it is thread-safe on its own.
 */
#ifndef PE_MODEL_H
#define PE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include <pagoda/budget.h>
#include <pagoda/cache.h>

#include "gguf.h"
#include "ops.h"
#include "threadpool.h"
#include "tokenizer.h"

/* The architectures the engine runs (general.architecture); every other one is refused
 * at load, naming it. Each reads its hyper-parameters under its own "<arch>." keys.
 *   llama  Llama 1/2/3, Mistral, TinyLlama, SmolLM: NORM rope, SwiGLU
 *   qwen2  Qwen2 / Qwen2.5: llama plus Q/K/V biases (attn_{q,k,v}.bias); NEOX rope
 *   qwen3  Qwen3 (dense): llama plus per-head RMSNorm of Q and K (attn_{q,k}_norm) before
 *          RoPE; NEOX rope; head_dim from attention.key_length
 *   phi3   Phi-3 / Phi-3.5 mini: fused attn_qkv (rows Q | K | V) and ffn_up (rows gate | up);
 *          NEOX rope
 *   gemma2 Gemma 2: embedding x sqrt(n_embd), RMSNorm after attention and after the FFN
 *          (post_attention_norm, post_ffw_norm), GeGLU FFN (tanh GELU, ggml's f16 table),
 *          attention and final logit soft-caps, sliding-window layers (every other one),
 *          tied output; NEOX rope
 *   gemma3 Gemma 3 (text): gemma2 without soft-caps, plus per-head Q/K RMSNorm; local
 *          (window) layers use rope.freq_base_swa unscaled, global ones rope.freq_base with
 *          the file's linear scaling */
typedef enum pe_arch {
    PE_ARCH_LLAMA = 0,
    PE_ARCH_QWEN2,
    PE_ARCH_QWEN3,
    PE_ARCH_PHI3,
    PE_ARCH_GEMMA2,
    PE_ARCH_GEMMA3,
} pe_arch;

/* The architecture's general.architecture string ("llama", ...); "?" when out of range. */
const char *pe_arch_name(pe_arch a);

typedef struct pe_hparams {
    uint32_t n_vocab;
    uint32_t n_ctx_train;
    uint32_t n_embd;
    uint32_t n_layer;
    uint32_t n_head;
    uint32_t n_head_kv;
    uint32_t n_ff;
    uint32_t head_dim; /* attention.key_length, or n_embd / n_head */
    uint32_t n_rot;    /* rope.dimension_count, or head_dim */
    float rope_theta;  /* rope.freq_base, default 10000 */
    float rope_scale;  /* 1 / rope.scaling.factor for linear scaling, else 1 */
    float rms_eps;     /* attention.layer_norm_rms_epsilon */
    pe_arch arch;      /* general.architecture */
    int rope_neox;     /* 1: NEOX rope, pairs (i, i + n_rot/2) (every architecture but
                          llama); 0: NORM rope, adjacent pairs (2i, 2i+1) (llama) */
    /* Gemma (gemma2, gemma3); the other architectures have the neutral values noted. */
    float embd_scale;     /* the token embedding's multiplier: sqrt(n_embd); else 1 */
    float attn_scale;     /* the attention logit scale (pgd_attn_params.scale): 0 =
                             1/sqrt(head_dim); gemma: 1/sqrt(attention.query_pre_attn_scalar)
                             when the key is there, else llama.cpp's rule (27B shapes:
                             1/sqrt(n_embd/n_head), others 1/sqrt(head_dim)) */
    float attn_softcap;   /* gemma2.attn_logit_softcapping (default 50); 0: none */
    float final_softcap;  /* <arch>.final_logit_softcapping: logits z -> c tanh(z / c)
                             (gemma2's default 30); 0: none */
    uint32_t n_swa;       /* attention.sliding_window: a local layer's query at slot p sees
                             the keys of slots p - n_swa + 1 .. p; 0: no local layers */
    uint32_t swa_period;  /* layer il is local iff n_swa && il % swa_period < swa_period - 1
                             (attention.sliding_window_pattern; llama.cpp's defaults: 2 for
                             gemma2, 6 for gemma3); 1 elsewhere */
    float rope_theta_swa; /* local layers' rope base: gemma3 rope.freq_base_swa (default
                             10000); else rope_theta */
    float rope_scale_swa; /* local layers' position scale: 1 for gemma3; else rope_scale */
} pe_hparams;

/* The sliding window of layer il (pe_hparams.n_swa when il is local, see swa_period), or
 * 0 for a global layer (every layer of the architectures without windows). O(1). */
uint32_t pe_hparams_layer_window(const pe_hparams *hp, uint32_t il);

/* A loaded model: immutable after pe_model_load, so any number of threads may read it.
 * Opaque: read it through the accessors below. */
typedef struct pe_model pe_model;

/* Progress callback for loading large models: done/total bytes. */
typedef void (*pe_progress_fn)(void *ud, uint64_t done, uint64_t total);

/* Loads a model. Returns 0, or -1 with one line naming the problem in err (missing or
 * mis-shaped tensor, unsupported type by name, bad hyper-parameter). */
int pe_model_load(const char *path, pe_progress_fn progress, void *ud, pe_model **out, char *err,
                  size_t errlen);
void pe_model_destroy(pe_model *m);

/* Accessors: what a client of the engine reads of a loaded model (the struct itself is
 * private to engine/runtime, in model_int.h). Pointers stay valid until pe_model_destroy.
 * Any thread; O(1). */
const pe_hparams *pe_model_hparams(const pe_model *m);
const pe_vocab *pe_model_vocab(const pe_model *m);
const pe_gguf_file *pe_model_gguf(const pe_model *m); /* the file's metadata and tensors */
const char *pe_model_name(const pe_model *m);         /* general.name, or the file name */
/* The model's identity, the seed of every prefix-cache block hash (cache.h
 * model_fingerprint): XXH3-128 of the file's header bytes as stored (all metadata keys and
 * values in file order, every array element, the tensor table: names, dims, types,
 * offsets) and of a sample of each tensor's data (all of a tensor up to 72 KiB, else the
 * first and last 4 KiB and 16 evenly spaced 4 KiB blocks between them). Files equal in
 * those bytes get equal fingerprints; a weight changed outside the sampled blocks does
 * not change it. */
pgd_hash pe_model_fingerprint(const pe_model *m);
uint64_t pe_model_weight_bytes(const pe_model *m); /* bytes of all weight tensors */
/* Bytes of the weights' packed copies (pe_mat_pack: Q8_0 products on AVX-512, unless
 * PGD_PACK=0 at load); 0 when none. */
uint64_t pe_model_packed_bytes(const pe_model *m);

typedef struct pe_ctx_params {
    uint32_t n_ctx;           /* max tokens of one sequence; 0: the model's n_ctx_train */
    uint32_t n_batch;         /* max tokens per pe_forward call (chunk); default 512 */
    uint32_t n_threads;       /* 0: all cores */
    uint32_t page_tokens;     /* default 16 */
    pgd_kv_type kv_type;      /* KV codec, any pgd_kv_type; default f16 */
    uint64_t kv_tokens;       /* pool capacity in tokens; 0: n_ctx (with a budget, plus the
                                 most one compaction keeps and a page: its private copies) */
    int contiguous_ref;       /* also keep K/V in plain f32 arrays (f16-rounded for an f16
                                 cache) and attend from them (the reference path for tests);
                                 one sequence per step only */
    int ref_ggml_fa;          /* with contiguous_ref: attend in the arithmetic of ggml-cpu's
                                 flash attention for batches under 64 rows (llama.cpp's
                                 prompt and decode steps on CPU; f16 cache: q rounded to
                                 f16, the output accumulated in f16): the reference for
                                 comparing with llama.cpp's greedy tokens (tests) */
    pgd_policy_kind policy;   /* the pool's eviction policy; default LRU. pe_ctx_create gives
                                 the cache the model's cost model (pgd_cache_params.cost,
                                 read by cost-aware policies: policy.h pgd_cost_model):
                                   linear_flops_per_token = 2 x n_layer x (n_embd x head_dim
                                     x (2 n_head + 2 n_head_kv)   Q, K, V, O projections
                                     + 3 x n_embd x n_ff)          the SwiGLU MLP
                                   (2 FLOPs per weight touched per token; the output head
                                   and embeddings left out: a prefill runs the head on its
                                   last token only, and an embedding is a look-up)
                                   attn_flops_per_pos = 4 x n_layer x n_head x head_dim
                                   (QK^T and PV per (query, key) pair, every query head) */
    int kv_rotate;            /* Hadamard-rotate K/V before encoding (head_dim a power of 2) */
    uint32_t kv_residual;     /* kivi2: newest tokens kept in f16; 0: the cache's default */
    uint32_t kv_select_pages; /* Quest: at most this many pages per decode row; 0: dense */
    int attn_ref;             /* attend with pgd_attn_run_ref_ex, the scalar spec (tests) */
    pgd_log_fn log;           /* libpagoda's diagnostics (cache and pool); default
                                 pe_log_stderr; NULL: silent */
    void *log_ud;             /* passed to log */
    int deterministic;        /* batch-invariant matrix products (PE_MM_INVARIANT): a row's
                                 logits and K/V get the same bits whatever else is in its
                                 batch (decode alone, batched, or recomputed as a prefill
                                 chunk); slower decode on AVX-512 (docs: bench_matmul
                                 --invariant) */
    /* Storage tiers below the pool (cache.h "Tiers"), borrowed: the caller creates them
     * (pgd_tier_ram_create, pgd_tier_disk_create) and closes them after pe_ctx_destroy.
     * NULL / 0: none. */
    const pgd_tier_use *tiers;
    uint32_t n_tiers;
    /* Pins the block-hash key (pgd_cache_params.hash_key: a disk tier's stable key, or
     * --hash-key-file), so that hashes match across restarts and instances; NULL: a
     * random key per context. Borrowed for pe_ctx_create. */
    const uint8_t *hash_key;
    size_t hash_key_len;
    /* Prefix-index events (pgd_cache_params.on_register / on_evict, cache.h: called under
     * the cache lock), passed to the cache as they are: the CLI sets them to a Redis tier's
     * KV-event hooks (pgd_tier_redis_on_register / _on_evict, event_ud the tier) so that
     * routers see what this instance's pool holds. NULL: none. */
    pgd_register_fn on_register;
    pgd_evict_fn on_evict;
    void *event_ud;
    double pin_share; /* pgd_cache_params.pin_share: pinned pages' share (0: the default) */
    /* Token budgets (budget.h): the budget of every sequence run, eval and the scheduler
     * create unless a request names its own (pe_request_params.budget); method
     * PGD_BUDGET_NONE (the default): dense. Checked at pe_ctx_create against the model
     * (pgd_budget_params_check for its n_layer; refused with contiguous_ref). */
    pgd_budget_params budget;
    int budget_scores; /* reserve attention's scoring scratch (pgd_attn_params.score_keys =
                          n_ctx) even when budget is none: requests may ask for budgets
                          (serve); set automatically when budget.method is not none */
    /* Sliding-window layers (gemma2/gemma3): by default they get a page group of their own
     * that frees the pages their window left (cache.h "Window layers"), unless the context
     * has tiers or a token budget (budget.method), which keep the window a mask over every
     * page (as kv_window_dense does). Requests then may not ask for budgets. */
    int kv_window_dense;       /* nonzero: window layers keep every page (the mask only) */
    uint64_t kv_window_tokens; /* the window group's pool in tokens; 0: n_seq_max sequences'
                                  windows and chunks, at most kv_tokens. pe_ctx_create sets
                                  what it used (0: no window group) */
    uint32_t n_seq_max;        /* sequences expected at once (the scheduler's max_running), for
                                  the window group's default size; 0: kv_tokens / n_ctx, >= 1 */
} pe_ctx_params;

/* Returns the defaults: n_batch 512, page_tokens 16, f16 KV, LRU, log = pe_log_stderr,
 * every other field 0. */
pe_ctx_params pe_ctx_default_params(void);

/* The sliding-window layers' own pool that pe_ctx_create would make for m with p, in
 * tokens (0: no window group), with *window their window and *n_window_layers their count:
 * what a caller sizing KV memory (serve's --kv-memory) splits between the two pools. */
uint64_t pe_ctx_window_plan(const pe_model *m, const pe_ctx_params *p, uint32_t *window,
                            uint32_t *n_window_layers);

/* A pgd_log_fn that prints libpagoda's errors and warnings on stderr, one line each:
 * "libpagoda: error: MSG" or "libpagoda: warning: MSG"; info and debug messages are
 * dropped. ud is unused. Any thread (one write per line); it may run with the cache lock
 * held, and calls nothing of libpagoda. */
void pe_log_stderr(void *ud, int level, const char *msg);

typedef struct pe_ctx pe_ctx;

int pe_ctx_create(pe_model *m, const pe_ctx_params *p, pe_ctx **out, char *err, size_t errlen);
void pe_ctx_destroy(pe_ctx *ctx);
pgd_cache *pe_ctx_cache(pe_ctx *ctx);
const pe_ctx_params *pe_ctx_params_get(const pe_ctx *ctx);

/* One sequence's part of a batch: tokens[0..n) at positions [length, length + n). */
typedef struct pe_batch_item {
    pgd_seq *seq;
    const int32_t *tokens;
    uint32_t n;
    float *logits; /* NULL, [n_vocab] for the last token, or [n][n_vocab] if all_logits */
    int all_logits;
    /* Block hashes of the sequence's pages from position 0 (pgd_cache_hash_tokens for its
     * salt and tokens; borrowed for the call), so the commit hashes nothing twice; NULL:
     * the cache hashes the pages this item fills. */
    const pgd_hash *hashes;
    uint32_t n_hashes;
    /* The sequence's token budget (budget.h; borrowed), NULL: dense. The step scores its
     * rows for it (pgd_budget_begin / pgd_attn_run_scored) and enforces it after the commit
     * (pgd_budget_end); positions (RoPE) are slots + pgd_seq_n_dropped. */
    pgd_budget *budget;
    uint64_t prompt_left; /* with a budget: prompt tokens not yet run, this item's included
                             (a prefill chunk >= n, the last chunk == n, decode 0) */
} pe_batch_item;

#define PE_MAX_BATCH_SEQS 256

/* Runs one step of continuous batching: the tokens of every item (prefill chunks and
 * decode tokens of different sequences, at most n_batch in all, each sequence once) go
 * through each weight matrix as one matrix-matrix product; attention reads each item's
 * own page table. An item's tokens sit at positions pgd_seq_n_dropped + its slots (a
 * sequence compacted by a budget continues its positions). Items with a budget are scored
 * and their budgets enforced after the commit (see pe_batch_item.budget); a compaction
 * that fails there leaves its sequence whole (every token kept, uncompacted) and does not
 * fail the step: pe_ctx_budget_failures counts it.
 * Returns 0, or a negative pgd_status with no sequence changed (PGD_ENOSPC: the pool
 * cannot hold the new tokens; PGD_EINVAL: bad tokens, too many tokens, a sequence twice,
 * positions past n_ctx, a budget with the contiguous reference, prompt_left below n, a
 * scored budget on a context without scoring scratch (pe_ctx_params.budget_scores);
 * PGD_ENOMEM). */
int pe_forward_batch(pe_ctx *ctx, const pe_batch_item *items, uint32_t n_items);

/* Runs tokens[0..n) at positions [pgd_seq_length(seq), +n) of seq. n <= n_batch.
 * logits: NULL, or [n_vocab] for the last token, or [n][n_vocab] when all_logits.
 * pe_forward_batch with one item: same returns. */
int pe_forward(pe_ctx *ctx, pgd_seq *seq, const int32_t *tokens, uint32_t n, float *logits,
               int all_logits);

/* pe_forward with a token budget (borrowed; NULL: pe_forward): the chunk is scored for it
 * and the budget enforced after the commit. prompt_left: the prompt tokens not yet run,
 * this chunk's included (a prefill chunk >= n, the prompt's last chunk == n, a decode
 * token 0). What `pagoda run` and `pagoda eval` call. pe_forward_batch with one item:
 * same returns. */
int pe_forward_budget(pe_ctx *ctx, pgd_seq *seq, pgd_budget *budget, const int32_t *tokens,
                      uint32_t n, uint64_t prompt_left, float *logits, int all_logits);

/* Compactions that failed after a step (pgd_budget_end < 0: no page for a private copy)
 * over the context's life; *last_status (when not NULL) gets the latest one's status, or
 * PGD_OK when none failed. The sequences stayed whole: online methods try again after
 * their next step. O(1); the context's thread. */
uint64_t pe_ctx_budget_failures(const pe_ctx *ctx, int *last_status);

#endif /* PE_MODEL_H */
