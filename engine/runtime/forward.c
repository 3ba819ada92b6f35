/* SPDX-License-Identifier: MIT */
/*
 * forward.c - the context (pe_ctx: cache manager, thread pool, activations) and the
 * Llama-family forward pass on the paged KV cache (llama, qwen2, qwen3, phi3, gemma2,
 * gemma3: model.h).
 *
 * Per step (a batch of chunks, each of n tokens at positions pos0..pos0+n-1 of one sequence):
 *
 *   grow every seq by its n (all pages reserved first: a full pool changes nothing)
 *   x = embed(tokens)  (x sqrt(n_embd): gemma)                 [n][n_embd]
 *   for each layer l:
 *     xb = rmsnorm(x);  q,k,v = xb*Wq, xb*Wk, xb*Wv              (matrix-matrix over n)
 *     q,k,v += biases (qwen2);  q,k = rmsnorm of each head (qwen3, gemma3)
 *     rope(q, k)  (NORM: adjacent pairs, llama; NEOX: pairs (i, i + n_rot/2), the others;
 *                  gemma3's local layers with their own base and no scaling)
 *     pgd_seq_write_kv(k, v)                 (copy-on-write, rotation, the pool's codec)
 *     att = pgd_attn_run(q)                  softmax(q . K * scale) . V over each
 *           sequence's pages, all sequences of the step at once, on the thread pool
 *           (gemma: its scale, gemma2's soft-cap, the window of local layers: attn.h)
 *     x += att*Wo;  x += W_down(silu(xb*W_gate) * (xb*W_up))   with xb = rmsnorm(x)
 *     (gemma: rmsnorm of att*Wo and of the FFN output before each add, gelu for silu)
 *   (a product with f16 / bf16 weights reads its input rounded to that type: act_for)
 *   logits = rmsnorm(x_last) * W_out (gemma2: soft-capped);  commit tokens (full pages
 *   join the prefix index)
 *
 * Sliding-window layers (gemma): attention masks each row to its window
 * (pgd_attn_params.layer_window), and the cache keeps the window layers in a page group of
 * their own (cache.h "Window layers": pgd_cache_params.window_tokens / window_layers /
 * window_pages) that releases the pages every later row's window has left and cuts a prefix
 * hit back to where their window pages are cached. write_kv and attention route a model
 * layer to its group themselves, so this file passes model layers as for any model. The
 * group is off (every page kept, the mask only) with kv_window_dense, tiers, a default
 * token budget, or windows of different sizes (window_group_size); its pool holds
 * kv_window_tokens (default: n_seq_max x (window + n_batch + 2 pages), at most kv_tokens).
 *
 * Token budgets (pe_batch_item.budget, budget.h): an item with a budget sizes its score
 * buffers first (pgd_budget_begin), its attention adds the softmax probabilities of its
 * scored rows to them (pgd_attn_run_scored, every layer), and the budget is enforced after
 * the commit (pgd_budget_end: compaction into fewer pages). A compacted sequence's slots
 * are not positions: row r of an item sits at slot pos0 + t and position pos0 + t +
 * pgd_seq_n_dropped, which RoPE and the n_ctx bound use. A compaction that fails (no page
 * for a private copy) leaves the sequence whole and valid: the step stands and
 * pe_ctx_budget_failures counts it. The contiguous reference takes no budget.
 *
 * Batch invariance: every per-row step (embedding, rmsnorm, rope, swiglu, the residual
 * adds, the logits' rmsnorm) reads and writes its own row only; with p.deterministic the
 * matrix products are batch-invariant too (PE_MM_INVARIANT), so a row's logits and K/V do
 * not depend on the other rows of its step. Attention's own order is libpagoda's.
 *
 * Attention has three implementations behind one switch (pe_ctx_params):
 *   default         pgd_attn_run, libpagoda's fast paged attention (every codec, Quest)
 *   attn_ref        pgd_attn_run_ref_ex with the context's parameters, libpagoda's scalar
 *                   reference (the spec; slow)
 *   contiguous_ref  K/V also kept in plain per-layer f32 arrays (rounded to f16 when the
 *                   cache is f16) and attended by a scalar loop here: the reference that
 *                   the paged paths are tested against; one sequence per step only
 *                   (with ref_ggml_fa: in the arithmetic of ggml-cpu's flash attention,
 *                   ggml_fa_head, to compare with llama.cpp's greedy tokens)
 *
 * Storage tiers (pe_ctx_params.tiers) go to the cache as they are: a match may promote
 * pages from them, and a batch waits for its sequences' promotions (pgd_seq_wait) before
 * it reads their lengths; callers that want to overlap that wait with other work check
 * pgd_seq_ready first (the scheduler does). The prefix-index events (on_register /
 * on_evict) go to the cache as they are too.
 *
 * Callers: tools/run.c, tools/eval.c, the scheduler, tests. Uses include/pagoda only.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_int.h"

#include <pagoda/attn.h>

/* Seed of the Hadamard rotation's signs (kv_rotate): fixed, so runs are reproducible. */
#define PE_ROTATE_SEED 0x9e3779b97f4a7c15ull

/* ---- context ---- */

struct pe_ctx {
    pe_model *m;
    pe_ctx_params p;
    pgd_cache *cache;
    pgd_pool *pool;
    pe_threadpool *tp;
    uint32_t n_threads;
    uint32_t mm_flags;                         /* PE_MM_INVARIANT when p.deterministic */
    float *x, *xb, *q, *k, *v, *ao, *hb, *hb2; /* [n_batch][...] activations */
    /* [n_batch][max(E, Q, F)]: a product's input rounded to its f16 / bf16 weights' type
     * (act_for), the rounding of xr_src to type xr_type; NULL when no matrix is f16 / bf16 */
    float *xr;
    const float *xr_src;
    uint32_t xr_type;
    pgd_attn *attn;                         /* the fast paged attention */
    pgd_attn_params ap;                     /* its parameters, which the reference reads */
    uint32_t *layer_window;                 /* [n_layer] windows (ap.layer_window) or NULL */
    uint8_t *win_layers;                    /* pe_ctx_create's window_layers, until created */
    pgd_attn_item items[PE_MAX_BATCH_SEQS]; /* this step's attention items */
    float *rope;                            /* [n_batch][n_rot/2][2] cos, sin */
    float *inv_freq;                        /* [n_rot/2] */
    float *rope_swa, *inv_freq_swa;         /* local layers' own (gemma3); NULL: the same */
    uint64_t *row_pos;                      /* [n_batch] position of each row: slot +
                                               pgd_seq_n_dropped (RoPE) */
    float *logits_tmp;                      /* [cap][n_vocab], batches of several seqs */
    uint32_t logits_cap;
    void *scratch;
    float *kc, *vc;      /* contiguous reference [layer][n_ctx][kv] */
    float *att;          /* contiguous reference: [n_threads][group][n_ctx] scores */
    uint32_t score_keys; /* attention's scoring scratch (0: none) */
    pgd_attn_scores sc[PE_MAX_BATCH_SEQS]; /* this step's scores, per item and layer */
    uint32_t sc_rows[PE_MAX_BATCH_SEQS];   /* scored rows of each item (pgd_budget_begin) */
    uint64_t n_budget_fail;                /* pgd_budget_end failures (sequence kept) */
    int budget_fail_status;                /* the latest one's status */
};

pe_ctx_params pe_ctx_default_params(void)
{
    pe_ctx_params p;
    memset(&p, 0, sizeof p);
    p.n_batch = 512;
    p.page_tokens = PGD_DEFAULT_PAGE_TOKENS;
    p.kv_type = PGD_KV_F16;
    p.policy = PGD_POLICY_LRU;
    p.log = pe_log_stderr;
    return p;
}

void pe_log_stderr(void *ud, int level, const char *msg)
{
    char line[640];
    if (level != PGD_LOG_ERROR && level != PGD_LOG_WARN) return;
    snprintf(line, sizeof line, "libpagoda: %s: %s\n", level == PGD_LOG_ERROR ? "error" : "warning",
             msg);
    fputs(line, stderr);
}

pgd_cache *pe_ctx_cache(pe_ctx *ctx)
{
    return ctx->cache;
}
const pe_ctx_params *pe_ctx_params_get(const pe_ctx *ctx)
{
    return &ctx->p;
}

void pe_ctx_destroy(pe_ctx *ctx)
{
    if (!ctx) return;
    pgd_attn_destroy(ctx->attn);
    pgd_cache_destroy(ctx->cache);
    pe_tp_destroy(ctx->tp);
    free(ctx->x);
    free(ctx->xb);
    free(ctx->q);
    free(ctx->k);
    free(ctx->v);
    free(ctx->ao);
    free(ctx->hb);
    free(ctx->hb2);
    free(ctx->xr);
    free(ctx->att);
    free(ctx->rope);
    free(ctx->inv_freq);
    free(ctx->rope_swa);
    free(ctx->inv_freq_swa);
    free(ctx->layer_window);
    free(ctx->win_layers);
    free(ctx->row_pos);
    free(ctx->logits_tmp);
    free(ctx->scratch);
    free(ctx->kc);
    free(ctx->vc);
    free(ctx);
}

static int is_half(const pe_mat *w)
{
    return w->type == PE_GGML_TYPE_F16 || w->type == PE_GGML_TYPE_BF16;
}

/* Whether any of the model's products has f16 or bf16 weights (act_for's buffer). */
static int has_half(const pe_model *m)
{
    if (is_half(&m->output)) return 1;
    for (uint32_t l = 0; l < m->hp.n_layer; l++) {
        const pe_layer *L = &m->layers[l];
        const pe_mat *ms[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
            if (is_half(ms[i])) return 1;
    }
    return 0;
}

static size_t max_scratch(const pe_model *m, uint32_t n)
{
    size_t s = pe_matmul_scratch_bytes(&m->output, n);
    for (uint32_t l = 0; l < m->hp.n_layer; l++) {
        const pe_layer *L = &m->layers[l];
        const pe_mat *ms[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
            size_t b = pe_matmul_scratch_bytes(ms[i], n);
            if (b > s) s = b;
        }
    }
    return s;
}

/* pgd_parallel_fn over the engine's thread pool (exec_ud): pe_task_fn has the same
 * signature as pgd_task_fn. */
static void tp_parallel(void *exec_ud, pgd_task_fn fn, void *fn_ud, uint32_t n_tasks)
{
    pe_tp_run(exec_ud, fn, fn_ud, n_tasks);
}

/* Writes ", tiers ram, disk" (the names of p's tiers) into buf, or "" without tiers. */
static void tier_names(const pgd_cache_params *p, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
    for (uint32_t i = 0; i < p->n_tiers && len < n; i++) {
        const char *name = p->tiers[i].tier ? pgd_tier_name(p->tiers[i].tier) : "(none)";
        int w = snprintf(buf + len, n - len, "%s%s", i ? ", " : ", tiers ", name);
        if (w < 0) break;
        len += (size_t)w;
    }
}

/* The window of the window layers when they get a page group of their own (model.h
 * pe_ctx_params.kv_window_dense), else 0: none, one kind of layer only, windows of
 * different sizes, tiers or a token budget (the mask over every page then). */
static uint32_t window_group_size(const pe_ctx_params *p, const pe_hparams *hp)
{
    uint32_t W = 0, n_win = 0;
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        uint32_t w = pe_hparams_layer_window(hp, l);
        if (!w) continue;
        if (W && w != W) return 0;
        W = w;
        n_win++;
    }
    if (!n_win || n_win == hp->n_layer || p->kv_window_dense || (p->tiers && p->n_tiers) ||
        p->budget.method != PGD_BUDGET_NONE)
        return 0;
    return W;
}

/* The window layers' pool in pages for p with its defaults resolved (n_batch, page_tokens,
 * kv_tokens), or 0 without a window group. */
static uint64_t window_pages(const pe_ctx_params *p, uint32_t W)
{
    const uint64_t pt = p->page_tokens, per = W + p->n_batch + 2 * pt;
    uint64_t n_seq = p->n_seq_max ? p->n_seq_max : p->kv_tokens / p->n_ctx;
    uint64_t wt = p->kv_window_tokens ? p->kv_window_tokens : (n_seq ? n_seq : 1) * per;
    if (!p->kv_window_tokens && wt > p->kv_tokens) wt = p->kv_tokens;
    uint64_t wp = (wt + pt - 1) / pt, least = (W - 1 + pt - 1) / pt + 2;
    if (wp < least) wp = least;
    return wp > UINT32_MAX / 2 ? UINT32_MAX / 2 : wp;
}

uint64_t pe_ctx_window_plan(const pe_model *m, const pe_ctx_params *pp, uint32_t *window,
                            uint32_t *n_window_layers)
{
    const pe_hparams *hp = &m->hp;
    pe_ctx_params p = *pp;
    *window = window_group_size(&p, hp);
    *n_window_layers = 0;
    if (!*window) return 0;
    for (uint32_t l = 0; l < hp->n_layer; l++)
        *n_window_layers += pe_hparams_layer_window(hp, l) != 0;
    if (!p.n_ctx) p.n_ctx = hp->n_ctx_train;
    if (!p.n_batch) p.n_batch = 512;
    if (p.n_batch > p.n_ctx) p.n_batch = p.n_ctx;
    if (!p.page_tokens) p.page_tokens = PGD_DEFAULT_PAGE_TOKENS;
    if (!p.kv_tokens) p.kv_tokens = p.n_ctx;
    return window_pages(&p, *window) * p.page_tokens;
}

/* What a pgd_cache_create failure means when the cache has tiers (their bind is where
 * EBUSY and EIO come from), as a clause to append to the status; "" otherwise. */
static const char *tier_why(const pgd_cache_params *p, int rc)
{
    if (!p->n_tiers) return "";
    switch (rc) {
    case PGD_EBUSY:
        return " (a tier is bound to another model or geometry, or its directory's lock is "
               "held by another process)";
    case PGD_EIO:
        return " (a tier's directory or records could not be read or written; the lines "
               "above say which)";
    case PGD_EINVAL:
        return " (bad tier parameters: a NULL tier, or more than the cache takes)";
    default:
        return "";
    }
}

/* The most slots one (layer, KV head) of budget p keeps (budget.h "The budget"):
 * pyramidkv's lowest layer, adakv's cap. */
static uint64_t budget_max_keep(const pgd_budget_params *p, uint32_t n_layer)
{
    if (p->method == PGD_BUDGET_PYRAMIDKV) return pgd_budget_layer_budget(p, 0, n_layer);
    if (p->method == PGD_BUDGET_ADAKV) return (uint64_t)ceil((double)p->adakv_cap * p->budget);
    return p->budget;
}

int pe_ctx_create(pe_model *m, const pe_ctx_params *pp, pe_ctx **out, char *err, size_t errlen)
{
    const pe_hparams *hp = &m->hp;
    pe_ctx *c = calloc(1, sizeof *c);
    *out = NULL;
    if (!c) return pe__errf(err, errlen, "out of memory");
    c->m = m;
    c->p = pp ? *pp : pe_ctx_default_params();
    if (!c->p.n_ctx) c->p.n_ctx = hp->n_ctx_train;
    if (c->p.ref_ggml_fa && (!c->p.contiguous_ref || hp->head_dim % 32 || hp->head_dim > 256)) {
        pe__errf(err, errlen,
                 "ref_ggml_fa needs contiguous_ref and a head_dim of 32..256 "
                 "in steps of 32 (head_dim %u)",
                 hp->head_dim);
        goto fail;
    }
    if (!c->p.n_batch) c->p.n_batch = 512;
    if (c->p.n_batch > c->p.n_ctx) c->p.n_batch = c->p.n_ctx;
    if (!c->p.page_tokens) c->p.page_tokens = PGD_DEFAULT_PAGE_TOKENS;
    /* The budget first: the pool's default size reads it. */
    if (c->p.budget.method != PGD_BUDGET_NONE) {
        char bwhy[160];
        const char *mname = pgd_budget_method_name(c->p.budget.method);
        if (pgd_budget_params_check(&c->p.budget, hp->n_layer, bwhy, sizeof bwhy) != PGD_OK) {
            pe__errf(err, errlen, "token budget (%s, %u tokens): %s", mname ? mname : "?",
                     c->p.budget.budget, bwhy);
            goto fail;
        }
        if (c->p.contiguous_ref) {
            pe__errf(err, errlen,
                     "token budget (%s): the contiguous reference keeps every "
                     "token; it takes no budget",
                     mname);
            goto fail;
        }
    }
    if (!c->p.kv_tokens) {
        c->p.kv_tokens = c->p.n_ctx;
        /* A compaction writes what it keeps into fresh pages where the sequence's own are
         * registered (cache.h): room for the most one keeps, so a sequence that filled
         * n_ctx can still be compacted (measured: snapkv 64 over a 482-token prompt in a
         * 512-token pool failed with ENOSPC without it). */
        if (c->p.budget.method != PGD_BUDGET_NONE)
            c->p.kv_tokens += budget_max_keep(&c->p.budget, hp->n_layer) + c->p.page_tokens;
    }
    if (c->p.n_ctx > (1u << 22)) {
        pe__errf(err, errlen, "context of %u tokens is too large", c->p.n_ctx);
        goto fail;
    }
    if (c->p.kv_select_pages == 1) {
        pe__errf(err, errlen, "--kv-select-pages must be 0 (dense) or at least 2");
        goto fail;
    }
    pgd_cache_params cp = pgd_cache_default_params();
    cp.pool.n_layers = hp->n_layer;
    cp.pool.n_kv_heads = hp->n_head_kv;
    cp.pool.head_dim = hp->head_dim;
    cp.pool.page_tokens = c->p.page_tokens;
    cp.pool.kv_type = c->p.kv_type;
    cp.pool.kv_rotate = c->p.kv_rotate;
    cp.pool.rotate_seed = PE_ROTATE_SEED;
    cp.pool.key_bounds = c->p.kv_select_pages > 0;
    cp.kv_residual = c->p.kv_residual;
    cp.pool.capacity_pages = (uint32_t)((c->p.kv_tokens + c->p.page_tokens - 1) / c->p.page_tokens);
    cp.policy = c->p.policy;
    /* The cost model of cost-aware policies (model.h, pe_ctx_params.policy). */
    double attn_proj = (double)hp->n_embd * hp->head_dim * (2.0 * hp->n_head + 2.0 * hp->n_head_kv);
    double mlp = 3.0 * (double)hp->n_embd * hp->n_ff;
    cp.cost.linear_flops_per_token = 2.0 * hp->n_layer * (attn_proj + mlp);
    cp.cost.attn_flops_per_pos = 4.0 * hp->n_layer * hp->n_head * hp->head_dim;
    cp.model_fingerprint = m->fingerprint;
    cp.log = c->p.log; /* the cache hands it to its pool */
    cp.log_ud = c->p.log_ud;
    cp.tiers = c->p.tiers;
    cp.n_tiers = c->p.tiers ? c->p.n_tiers : 0;
    cp.hash_key = c->p.hash_key;
    cp.hash_key_len = c->p.hash_key ? c->p.hash_key_len : 0;
    cp.on_register = c->p.on_register;
    cp.on_evict = c->p.on_evict;
    cp.event_ud = c->p.event_ud;
    cp.pin_share = c->p.pin_share;
    /* Window layers in a page group of their own (cache.h "Window layers"), when every
     * window layer has the same window. */
    const uint32_t W = window_group_size(&c->p, hp);
    if (W) {
        uint8_t *win_layers = c->win_layers = calloc(hp->n_layer, 1);
        if (!win_layers) {
            pe__errf(err, errlen, "out of memory");
            goto fail;
        }
        for (uint32_t l = 0; l < hp->n_layer; l++)
            win_layers[l] = pe_hparams_layer_window(hp, l) != 0;
        const uint64_t wp = window_pages(&c->p, W), pt = c->p.page_tokens;
        cp.window_tokens = W;
        cp.window_layers = win_layers;
        cp.window_pages = (uint32_t)wp;
        c->p.kv_window_tokens = wp * pt;
    } else {
        c->p.kv_window_tokens = 0;
    }
    c->p.hash_key = NULL; /* borrowed for pe_ctx_create only */
    c->p.hash_key_len = 0;
    if (cp.n_tiers > PGD_MAX_TIERS) {
        pe__errf(err, errlen, "%u storage tiers: at most %d", cp.n_tiers, PGD_MAX_TIERS);
        goto fail;
    }
    if (cp.hash_key && (cp.hash_key_len < 1 || cp.hash_key_len > 256)) {
        pe__errf(err, errlen, "hash key of %zu bytes: it takes 1 to 256", cp.hash_key_len);
        goto fail;
    }
    /* The library's own rules (codec geometry, rotation), explained in one line. */
    char why[160];
    if (pgd_pool_params_check(&cp.pool, why, sizeof why) != PGD_OK) {
        pe__errf(err, errlen, "%s", why);
        goto fail;
    }
    c->tp = pe_tp_create(c->p.n_threads);
    if (!c->tp) {
        pe__errf(err, errlen, "cannot start threads");
        goto fail;
    }
    c->n_threads = pe_tp_n_threads(c->tp);
    c->mm_flags = c->p.deterministic ? PE_MM_INVARIANT : 0;
    int rc = pgd_cache_create(&cp, &c->cache);
    free(c->win_layers); /* copied by the cache */
    c->win_layers = NULL;
    if (rc != PGD_OK) {
        char tiers[128];
        tier_names(&cp, tiers, sizeof tiers);
        pe__errf(err, errlen, "KV cache of %llu tokens (%s%s): %s%s",
                 (unsigned long long)c->p.kv_tokens, pgd_kv_type_name(c->p.kv_type), tiers,
                 pgd_strerror(rc), tier_why(&cp, rc));
        goto fail;
    }
    c->pool = pgd_cache_pool(c->cache);
    c->p.kv_residual = pgd_cache_kv_residual(c->cache); /* what the cache uses */

    pgd_attn_params ap = pgd_attn_default_params();
    ap.n_head = hp->n_head;
    ap.n_threads = c->n_threads;
    ap.parallel = tp_parallel;
    ap.parallel_ud = c->tp;
    ap.max_rows = c->p.n_batch;
    ap.select_pages = c->p.kv_select_pages;
    /* Scores for token budgets: a scored row sees at most n_ctx keys (positions are
     * bounded by n_ctx, and a sequence holds no more slots than positions). */
    if (c->p.budget.method != PGD_BUDGET_NONE || c->p.budget_scores) {
        ap.score_keys = c->p.n_ctx;
        c->p.budget_scores = 1;
    }
    c->score_keys = ap.score_keys;
    /* Gemma: the logit scale, gemma2's soft-cap and the local layers' windows. */
    ap.scale = hp->attn_scale;
    ap.softcap = hp->attn_softcap;
    int any_window = 0;
    for (uint32_t l = 0; l < hp->n_layer; l++)
        any_window |= pe_hparams_layer_window(hp, l) != 0;
    if (any_window) {
        c->layer_window = malloc(hp->n_layer * sizeof *c->layer_window);
        if (!c->layer_window) {
            pe__errf(err, errlen, "out of memory");
            goto fail;
        }
        for (uint32_t l = 0; l < hp->n_layer; l++)
            c->layer_window[l] = pe_hparams_layer_window(hp, l);
        ap.layer_window = c->layer_window;
    }
    c->ap = ap;
    rc = pgd_attn_create(c->cache, &ap, &c->attn);
    if (rc != PGD_OK) {
        pe__errf(err, errlen, "paged attention (%u heads, %s): %s", hp->n_head,
                 pgd_kv_type_name(c->p.kv_type), pgd_strerror(rc));
        goto fail;
    }

    const size_t n = c->p.n_batch, E = hp->n_embd, Q = (size_t)hp->n_head * hp->head_dim;
    const size_t KV = (size_t)hp->n_head_kv * hp->head_dim, G = hp->n_head / hp->n_head_kv;
    c->x = malloc(n * E * sizeof(float));
    c->xb = malloc(n * (E > Q ? E : Q) * sizeof(float));
    c->q = malloc(n * Q * sizeof(float));
    c->k = malloc(n * KV * sizeof(float));
    c->v = malloc(n * KV * sizeof(float));
    c->ao = malloc(n * Q * sizeof(float));
    c->hb = malloc(n * hp->n_ff * sizeof(float));
    c->hb2 = malloc(n * hp->n_ff * sizeof(float));
    if (has_half(m)) {
        size_t w = E > Q ? E : Q;
        c->xr = malloc(n * (w > hp->n_ff ? w : hp->n_ff) * sizeof(float));
        if (!c->xr) {
            pe__errf(err, errlen, "out of memory for activations of %zu tokens", n);
            goto fail;
        }
    }
    c->rope = malloc(n * hp->n_rot * sizeof(float));
    c->inv_freq = malloc(hp->n_rot / 2 * sizeof(float) + sizeof(float));
    if (any_window &&
        (hp->rope_theta_swa != hp->rope_theta || hp->rope_scale_swa != hp->rope_scale)) {
        c->rope_swa = malloc(n * hp->n_rot * sizeof(float));
        c->inv_freq_swa = malloc(hp->n_rot / 2 * sizeof(float) + sizeof(float));
        if (!c->rope_swa || !c->inv_freq_swa) {
            pe__errf(err, errlen, "out of memory for activations of %zu tokens", n);
            goto fail;
        }
    }
    c->row_pos = malloc(n * sizeof(uint64_t));
    c->scratch = malloc(max_scratch(m, (uint32_t)n) + 64);
    if (!c->x || !c->xb || !c->q || !c->k || !c->v || !c->ao || !c->hb || !c->hb2 || !c->rope ||
        !c->inv_freq || !c->row_pos || !c->scratch) {
        pe__errf(err, errlen, "out of memory for activations of %zu tokens", n);
        goto fail;
    }
    if (c->p.contiguous_ref) {
        c->kc = calloc((size_t)hp->n_layer * c->p.n_ctx * KV, sizeof(float));
        c->vc = calloc((size_t)hp->n_layer * c->p.n_ctx * KV, sizeof(float));
        c->att = malloc((size_t)c->n_threads * G * c->p.n_ctx * sizeof(float));
        if (!c->kc || !c->vc || !c->att) {
            pe__errf(err, errlen, "out of memory for the contiguous reference cache");
            goto fail;
        }
    }
    for (uint32_t i = 0; i < hp->n_rot / 2; i++) {
        double f = pow((double)hp->rope_theta, -2.0 * i / hp->n_rot);
        if (m->rope_freqs) f /= m->rope_freqs[i];
        c->inv_freq[i] = (float)f;
        if (c->inv_freq_swa) {
            f = pow((double)hp->rope_theta_swa, -2.0 * i / hp->n_rot);
            if (m->rope_freqs) f /= m->rope_freqs[i];
            c->inv_freq_swa[i] = (float)f;
        }
    }
    *out = c;
    return 0;
fail:
    pe_ctx_destroy(c);
    return -1;
}

/* ---- kernels local to the forward pass ---- */

static void rope_apply(float *v, const float *cs, uint32_t n_heads, uint32_t hd, uint32_t n_rot)
{
    for (uint32_t h = 0; h < n_heads; h++) {
        float *x = v + (size_t)h * hd;
        for (uint32_t i = 0; i < n_rot / 2; i++) {
            float c = cs[2 * i], s = cs[2 * i + 1];
            float x0 = x[2 * i], x1 = x[2 * i + 1];
            x[2 * i] = x0 * c - x1 * s;
            x[2 * i + 1] = x0 * s + x1 * c;
        }
    }
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

/* x[0..n) rounded to f16 and back with F16C (round to nearest even, as pe_f32_to_f16 and
 * ggml's conversion); returns the first index not done (the tail is the caller's). */
__attribute__((target("avx,f16c"))) static size_t round_f16_f16c(float *y, const float *x, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(h));
    }
    return i;
}
#endif

static void round_f16(float *y, const float *x, size_t n)
{
    size_t i = 0;
#if defined(__x86_64__) || defined(__i386__)
    if (pe_isa_detect() != PE_ISA_SCALAR) i = round_f16_f16c(y, x, n); /* AVX2 implies F16C */
#endif
    for (; i < n; i++)
        y[i] = pe_f16_to_f32(pe_f32_to_f16(x[i]));
}

/* The input a product with w reads: x[0..n) rounded to f16 (bf16) in c->xr when w is f16
 * (bf16), else x itself. llama.cpp's CPU backend converts the activations of an f16 / bf16
 * product to the weights' type first (ggml's vec_dot_type), and that rounding decides
 * greedy near ties: on the qwen3 reference model, prompt "Once upon a time", step 3 has
 * ',' and '.' 0.002 nats apart in llama.cpp, and f32 activations picked the other one.
 * Per element, so batch-invariant. same: x is unchanged since the previous call (K and V
 * after Q, up after gate), so a rounding of it to w's type is reused. Cost: n conversions
 * per product (F16C: ~0.1 ns each), against n x n_out multiply-adds. Other types: their
 * kernels' own (f32: none). */
static const float *act_for(pe_ctx *c, const pe_mat *w, const float *x, size_t n, int same)
{
    if (w->type != PE_GGML_TYPE_F16 && w->type != PE_GGML_TYPE_BF16) return x;
    if (same && c->xr_src == x && c->xr_type == w->type) return c->xr;
    if (w->type == PE_GGML_TYPE_F16) {
        round_f16(c->xr, x, n);
    } else {
        for (size_t i = 0; i < n; i++)
            c->xr[i] = pe_bf16_to_f32(pe_f32_to_bf16(x[i]));
    }
    c->xr_src = x;
    c->xr_type = w->type;
    return c->xr;
}

/* pe_matmul_ex of n rows of x (d values each) through w, on act_for's input. */
static void mm(pe_ctx *c, const pe_mat *w, const float *x, uint32_t n, size_t d, float *y, int same)
{
    pe_matmul_ex(c->tp, w, act_for(c, w, x, (size_t)n * d, same), n, y, c->scratch, c->mm_flags);
}

/* NEOX rope (every architecture but llama): rotates the pairs (i, i + n_rot/2) of each
 * head, pair i with pair i's angle (the same table as rope_apply). */
static void rope_apply_neox(float *v, const float *cs, uint32_t n_heads, uint32_t hd,
                            uint32_t n_rot)
{
    const uint32_t half = n_rot / 2;
    for (uint32_t h = 0; h < n_heads; h++) {
        float *x = v + (size_t)h * hd;
        for (uint32_t i = 0; i < half; i++) {
            float c = cs[2 * i], s = cs[2 * i + 1];
            float x0 = x[i], x1 = x[i + half];
            x[i] = x0 * c - x1 * s;
            x[i + half] = x0 * s + x1 * c;
        }
    }
}

/* Adds bias b[0..d) to each of n rows of y (qwen2's Q/K/V biases). */
static void add_bias(float *y, const float *b, uint32_t n, size_t d)
{
    for (uint32_t t = 0; t < n; t++)
        for (size_t i = 0; i < d; i++)
            y[(size_t)t * d + i] += b[i];
}

/* RMSNorm of each hd-wide head of n rows of n_heads heads, in place (qwen3's Q/K norms). */
static void head_norm(float *y, const float *w, uint32_t n, uint32_t n_heads, uint32_t hd,
                      float eps, float *tmp)
{
    for (size_t h = 0; h < (size_t)n * n_heads; h++) {
        memcpy(tmp, y + h * hd, hd * sizeof *tmp);
        pe_rmsnorm(y + h * hd, tmp, w, hd, eps);
    }
}

/* ---- the contiguous reference ---- */

typedef struct attn_job {
    pe_ctx *c;
    uint32_t layer;
} attn_job;

/* x rounded to f16 and back when f16 (ggml's F16 stores round to nearest even), else x. */
static float to_f16_if(float x, int f16)
{
    return f16 ? pe_f16_to_f32(pe_f32_to_f16(x)) : x;
}

/* One head of attention as ggml-cpu's flash attention computes it for a batch of fewer
 * than 64 query rows and a KV view of fewer than 512 cells (ops.cpp,
 * ggml_compute_forward_flash_attn_ext_f16_one_chunk, built for AVX2 + FMA + F16C: what
 * llama.cpp runs for a prompt and each decoded token of a greedy continuation; 64 or more
 * rows take its tiled kernel, in f32, which this does not model). With an f16 cache
 * (f16: 1): q is rounded to f16 (the K type's vec_dot_type); each K.q is
 * ggml_vec_dot_f16's sum: 4 accumulators of 8 lanes by FMA over steps of 32, reduced
 * (0+2, 1+3), (0+1), lanes l+4, then pairs; the online softmax keeps the running maximum M
 * and sum S (f32) and the output in an f16 vector, rounded after every rescale
 * (ggml_vec_scale_f16) and every added key (ggml_vec_mad_f16); out = f32(acc) / S.
 * f32 cache (f16: 0): the same with no rounding (ggml's f32 V path). hd <= 256, a
 * multiple of 32. */
static void ggml_fa_head(const float *q, const float *K, const float *V, size_t ld, uint64_t n_keys,
                         uint32_t hd, float scale, int f16, float *out)
{
    float qh[256], acc[256];
    for (uint32_t i = 0; i < hd; i++) {
        qh[i] = to_f16_if(q[i], f16);
        acc[i] = 0.0f;
    }
    float S = 0.0f, M = -INFINITY;
    for (uint64_t p = 0; p < n_keys; p++) {
        const float *k = K + p * ld, *v = V + p * ld;
        float lane[4][8] = {{0}};
        for (uint32_t i = 0; i < hd; i += 32)
            for (int a = 0; a < 4; a++)
                for (int l = 0; l < 8; l++)
                    lane[a][l] = fmaf(k[i + a * 8 + l], qh[i + a * 8 + l], lane[a][l]);
        float t[4];
        for (int l = 0; l < 8; l++) {
            lane[0][l] += lane[2][l];
            lane[1][l] += lane[3][l];
            lane[0][l] += lane[1][l];
        }
        for (int l = 0; l < 4; l++)
            t[l] = lane[0][l] + lane[0][l + 4];
        const float sc = ((t[0] + t[1]) + (t[2] + t[3])) * scale;
        float ms = 1.0f, vs = 1.0f;
        if (sc > M) {
            ms = expf(M - sc);
            M = sc;
            for (uint32_t i = 0; i < hd; i++)
                acc[i] = to_f16_if(acc[i] * ms, f16);
        } else {
            vs = expf(sc - M);
        }
        for (uint32_t i = 0; i < hd; i++)
            acc[i] = to_f16_if(fmaf(v[i], vs, acc[i]), f16);
        S = fmaf(S, ms, vs);
    }
    const float inv = S == 0.0f ? 0.0f : 1.0f / S;
    for (uint32_t i = 0; i < hd; i++)
        out[i] = acc[i] * inv;
}

/* One task = (token t, kv head g), K/V from plain per-layer arrays, scalar loops
 * (ref_ggml_fa: ggml_fa_head). */
static void attn_task(void *ud, uint32_t task, uint32_t thread)
{
    attn_job *j = ud;
    pe_ctx *c = j->c;
    const pe_hparams *hp = &c->m->hp;
    const uint32_t hd = hp->head_dim, G = hp->n_head / hp->n_head_kv;
    const uint32_t t = task / hp->n_head_kv, g = task % hp->n_head_kv;
    const uint64_t n_keys = c->row_pos[t] + 1;
    const float scale = hp->attn_scale > 0 ? hp->attn_scale : 1.0f / sqrtf((float)hd);
    const float cap = hp->attn_softcap;
    /* a local layer's row sees its window's keys only: [first, n_keys) */
    const uint32_t win = c->layer_window ? c->layer_window[j->layer] : 0;
    const uint64_t first = win && n_keys > win ? n_keys - win : 0, n_seen = n_keys - first;
    float *sc = c->att + (size_t)thread * G * c->p.n_ctx; /* [G][n_keys] */
    const float *q = c->q + (size_t)t * hp->n_head * hd + (size_t)g * G * hd;
    float *out = c->ao + (size_t)t * hp->n_head * hd + (size_t)g * G * hd;
    const size_t KV = (size_t)hp->n_head_kv * hd;
    const float *K = c->kc + (size_t)j->layer * c->p.n_ctx * KV + (size_t)g * hd;
    const float *V = c->vc + (size_t)j->layer * c->p.n_ctx * KV + (size_t)g * hd;
    if (c->p.ref_ggml_fa) {
        for (uint32_t h = 0; h < G; h++)
            ggml_fa_head(q + (size_t)h * hd, K, V, KV, n_keys, hd, scale,
                         c->p.kv_type == PGD_KV_F16, out + (size_t)h * hd);
        return;
    }
    for (uint32_t h = 0; h < G; h++) {
        float *s = sc + (size_t)h * n_keys, *o = out + (size_t)h * hd;
        for (uint64_t p = first; p < n_keys; p++) {
            float d = 0;
            for (uint32_t i = 0; i < hd; i++)
                d += q[h * hd + i] * K[p * KV + i];
            d *= scale;
            s[p - first] = cap > 0 ? cap * tanhf(d / cap) : d;
        }
        pe_softmax(s, (uint32_t)n_seen);
        memset(o, 0, hd * sizeof *o);
        for (uint64_t p = first; p < n_keys; p++)
            for (uint32_t i = 0; i < hd; i++)
                o[i] += s[p - first] * V[p * KV + i];
    }
}

/* Copies the step's k and v rows of one layer into the contiguous arrays, rounded to f16
 * when the cache is f16 (so the reference sees what f16 pages hold); any other type is
 * kept exact: the f32 reference. */
static void store_contig(pe_ctx *c, uint32_t layer, uint32_t n)
{
    const size_t KV = (size_t)c->m->hp.n_head_kv * c->m->hp.head_dim;
    const int f16 = c->p.kv_type == PGD_KV_F16;
    for (uint32_t t = 0; t < n; t++) {
        float *kc = c->kc + ((size_t)layer * c->p.n_ctx + c->row_pos[t]) * KV;
        float *vc = c->vc + ((size_t)layer * c->p.n_ctx + c->row_pos[t]) * KV;
        for (size_t i = 0; i < KV; i++) {
            float k = c->k[t * KV + i], v = c->v[t * KV + i];
            kc[i] = f16 ? pe_f16_to_f32(pe_f32_to_f16(k)) : k;
            vc[i] = f16 ? pe_f16_to_f32(pe_f32_to_f16(v)) : v;
        }
    }
}

/* ---- forward ---- */

/* Undoes the grows of items[0..n) (a batch that could not run). */
static void undo_grows(pe_ctx *c, const pe_batch_item *items, const uint64_t *pos0, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        pgd_seq_truncate(c->cache, items[i].seq, pos0[i]);
}

int pe_forward_batch(pe_ctx *c, const pe_batch_item *items, uint32_t n_items)
{
    const pe_model *m = c->m;
    const pe_hparams *hp = &m->hp;
    const uint32_t E = hp->n_embd, hd = hp->head_dim, F = hp->n_ff;
    const size_t Q = (size_t)hp->n_head * hd, KV = (size_t)hp->n_head_kv * hd;
    const int gelu = hp->arch == PE_ARCH_GEMMA2 || hp->arch == PE_ARCH_GEMMA3; /* GeGLU FFN */
    uint64_t pos0[PE_MAX_BATCH_SEQS], dropped[PE_MAX_BATCH_SEQS];
    uint32_t n = 0, n_out = 0, n_scored = 0;
    int rc;

    if (n_items == 0 || n_items > PE_MAX_BATCH_SEQS || (c->kc && n_items > 1)) return PGD_EINVAL;
    for (uint32_t i = 0; i < n_items; i++) {
        const pe_batch_item *it = &items[i];
        if (!it->seq || !it->n || it->n > c->p.n_batch - n) return PGD_EINVAL;
        /* A matched sequence whose tier pages are still being filled: wait, since a failed
         * fill cuts its length back (a no-op when nothing is pending). */
        pgd_seq_wait(c->cache, it->seq);
        pos0[i] = pgd_seq_length(c->cache, it->seq);
        /* Slots are not positions once a budget compacted the sequence: a slot's token
         * position is slot + the slots dropped (RoPE, and the context bound). */
        dropped[i] = pgd_seq_n_dropped(c->cache, it->seq);
        if (dropped[i] + pos0[i] + it->n > c->p.n_ctx) return PGD_EINVAL;
        /* The contiguous reference indexes its arrays by position and keeps every token. */
        if (c->kc && (it->budget || dropped[i])) return PGD_EINVAL;
        if (it->budget && it->prompt_left && it->prompt_left < it->n) return PGD_EINVAL;
        for (uint32_t t = 0; t < it->n; t++)
            if (it->tokens[t] < 0 || (uint32_t)it->tokens[t] >= hp->n_vocab) return PGD_EINVAL;
        for (uint32_t k = 0; k < i; k++)
            if (items[k].seq == it->seq) return PGD_EINVAL;
        n += it->n;
        n_out += it->logits ? (it->all_logits ? it->n : 1) : 0;
    }
    if (n_items > 1 && n_out > c->logits_cap) {
        float *lt = realloc(c->logits_tmp, (size_t)n_out * hp->n_vocab * sizeof *lt);
        if (!lt) return PGD_ENOMEM;
        c->logits_tmp = lt;
        c->logits_cap = n_out;
    }

    /* Budgets: size each item's score buffers for its rows (before the grows, so a failure
     * here changes no sequence). The scores only change in attention, after every write
     * of layer 0, so a step that fails before it (a full pool) leaves them as they were. */
    for (uint32_t i = 0; i < n_items; i++) {
        c->sc_rows[i] = 0;
        if (!items[i].budget) continue;
        rc = pgd_budget_begin(items[i].budget, items[i].seq, items[i].n, items[i].prompt_left);
        if (rc < 0) return rc;
        if (rc > 0 && !c->score_keys && !c->p.attn_ref) return PGD_EINVAL; /* no scratch */
        c->sc_rows[i] = (uint32_t)rc;
        n_scored += rc > 0;
    }

    /* Reserve every item's pages first, so that a full pool changes nothing. */
    for (uint32_t i = 0; i < n_items; i++) {
        rc = pgd_seq_grow(c->cache, items[i].seq, items[i].n);
        if (rc != PGD_OK) {
            undo_grows(c, items, pos0, i);
            return rc;
        }
    }
    uint32_t r = 0;
    for (uint32_t i = 0; i < n_items; i++) {
        c->items[i] =
            (pgd_attn_item){items[i].seq, items[i].n, c->q + (size_t)r * Q, c->ao + (size_t)r * Q};
        for (uint32_t t = 0; t < items[i].n; t++, r++) {
            /* The position: RoPE's; the contiguous reference indexes by it too, where
             * no sequence is compacted (dropped 0: slot == position). */
            c->row_pos[r] = dropped[i] + pos0[i] + t;
            int32_t tok = items[i].tokens[t];
            float *xr = c->x + (size_t)r * E;
            pe_dequant_row(m->tok_embd.type,
                           (const uint8_t *)m->tok_embd.data + (size_t)tok * m->tok_embd.row_bytes,
                           xr, E);
            if (hp->embd_scale != 1.0f)
                for (uint32_t k = 0; k < E; k++)
                    xr[k] *= hp->embd_scale;
            float pos = (float)c->row_pos[r] * hp->rope_scale;
            for (uint32_t k = 0; k < hp->n_rot / 2; k++) {
                float th = pos * c->inv_freq[k];
                c->rope[(size_t)r * hp->n_rot + 2 * k] = cosf(th);
                c->rope[(size_t)r * hp->n_rot + 2 * k + 1] = sinf(th);
            }
            pos = (float)c->row_pos[r] * hp->rope_scale_swa;
            for (uint32_t k = 0; c->rope_swa && k < hp->n_rot / 2; k++) {
                float th = pos * c->inv_freq_swa[k];
                c->rope_swa[(size_t)r * hp->n_rot + 2 * k] = cosf(th);
                c->rope_swa[(size_t)r * hp->n_rot + 2 * k + 1] = sinf(th);
            }
        }
    }

    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const pe_layer *L = &m->layers[l];
        for (uint32_t t = 0; t < n; t++)
            pe_rmsnorm(c->xb + (size_t)t * E, c->x + (size_t)t * E, L->attn_norm, E, hp->rms_eps);
        mm(c, &L->wq, c->xb, n, E, c->q, 0);
        mm(c, &L->wk, c->xb, n, E, c->k, 1);
        mm(c, &L->wv, c->xb, n, E, c->v, 1);
        if (L->bq) { /* qwen2: biases after the products, before RoPE */
            add_bias(c->q, L->bq, n, Q);
            add_bias(c->k, L->bk, n, KV);
            add_bias(c->v, L->bv, n, KV);
        }
        if (L->q_norm) { /* qwen3, gemma3: per-head RMSNorm of Q and K, before RoPE */
            head_norm(c->q, L->q_norm, n, hp->n_head, hd, hp->rms_eps, c->xb);
            head_norm(c->k, L->k_norm, n, hp->n_head_kv, hd, hp->rms_eps, c->xb);
        }
        const float *rope_l =
            c->rope_swa && c->layer_window && c->layer_window[l] ? c->rope_swa : c->rope;
        for (uint32_t t = 0; t < n; t++) {
            const float *cs = rope_l + (size_t)t * hp->n_rot;
            if (hp->rope_neox) {
                rope_apply_neox(c->q + t * Q, cs, hp->n_head, hd, hp->n_rot);
                rope_apply_neox(c->k + t * KV, cs, hp->n_head_kv, hd, hp->n_rot);
            } else {
                rope_apply(c->q + t * Q, cs, hp->n_head, hd, hp->n_rot);
                rope_apply(c->k + t * KV, cs, hp->n_head_kv, hd, hp->n_rot);
            }
        }
        /* K/V of every item; a failure can only come at layer 0 (copy-on-write of a
         * shared page, the kivi2 window), before anything was committed. */
        r = 0;
        for (uint32_t i = 0; i < n_items; i++) {
            rc = pgd_seq_write_kv(c->cache, items[i].seq, pos0[i], items[i].n, l,
                                  c->k + (size_t)r * KV, c->v + (size_t)r * KV);
            if (rc != PGD_OK) {
                undo_grows(c, items, pos0, n_items);
                return rc;
            }
            r += items[i].n;
        }
        if (c->kc) {
            attn_job job = {c, l};
            store_contig(c, l, n);
            pe_tp_run(c->tp, attn_task, &job, n * hp->n_head_kv);
        } else if (n_scored) {
            for (uint32_t i = 0; i < n_items; i++)
                c->sc[i] = c->sc_rows[i] ? (pgd_attn_scores){pgd_budget_scores(items[i].budget, l),
                                                             c->sc_rows[i],
                                                             pgd_budget_score_ld(items[i].budget)}
                                         : (pgd_attn_scores){NULL, 0, 0};
            rc = c->p.attn_ref ? pgd_attn_run_ref_ex(c->cache, &c->ap, l, c->items, c->sc, n_items)
                               : pgd_attn_run_scored(c->attn, l, c->items, c->sc, n_items);
            if (rc != PGD_OK) {
                undo_grows(c, items, pos0, n_items);
                return rc;
            }
        } else {
            rc = c->p.attn_ref ? pgd_attn_run_ref_ex(c->cache, &c->ap, l, c->items, NULL, n_items)
                               : pgd_attn_run(c->attn, l, c->items, n_items);
            if (rc != PGD_OK) {
                undo_grows(c, items, pos0, n_items);
                return rc;
            }
        }
        mm(c, &L->wo, c->ao, n, Q, c->xb, 0);
        if (L->post_attn_norm) /* gemma: the attention output normed before the add */
            for (uint32_t t = 0; t < n; t++)
                pe_rmsnorm(c->xb + (size_t)t * E, c->xb + (size_t)t * E, L->post_attn_norm, E,
                           hp->rms_eps);
        for (size_t i = 0; i < (size_t)n * E; i++)
            c->x[i] += c->xb[i];

        for (uint32_t t = 0; t < n; t++)
            pe_rmsnorm(c->xb + (size_t)t * E, c->x + (size_t)t * E, L->ffn_norm, E, hp->rms_eps);
        mm(c, &L->w_gate, c->xb, n, E, c->hb, 0);
        mm(c, &L->w_up, c->xb, n, E, c->hb2, 1);
        /* row by row: a vector kernel's tail (the last n % 8 values on AVX2) then falls on
         * the same columns whatever the number of rows */
        for (uint32_t t = 0; t < n; t++) {
            if (gelu)
                pe_geglu_f32(c->hb + (size_t)t * F, c->hb2 + (size_t)t * F, F);
            else
                pe_swiglu_f32(c->hb + (size_t)t * F, c->hb2 + (size_t)t * F, F);
        }
        mm(c, &L->w_down, c->hb, n, F, c->xb, 0);
        if (L->post_ffn_norm)
            for (uint32_t t = 0; t < n; t++)
                pe_rmsnorm(c->xb + (size_t)t * E, c->xb + (size_t)t * E, L->post_ffn_norm, E,
                           hp->rms_eps);
        for (size_t i = 0; i < (size_t)n * E; i++)
            c->x[i] += c->xb[i];
    }

    /* Logits: the selected rows go through the output matrix as one product. */
    if (n_out) {
        uint32_t o = 0;
        r = 0;
        for (uint32_t i = 0; i < n_items; i++) {
            const pe_batch_item *it = &items[i];
            uint32_t first = it->all_logits ? 0 : it->n - 1;
            for (uint32_t t = first; it->logits && t < it->n; t++, o++)
                pe_rmsnorm(c->xb + (size_t)o * E, c->x + (size_t)(r + t) * E, m->output_norm, E,
                           hp->rms_eps);
            r += it->n;
        }
        float *dst = n_items == 1 ? items[0].logits : c->logits_tmp;
        mm(c, &m->output, c->xb, n_out, E, dst, 0);
        if (hp->final_softcap > 0) { /* gemma2: z -> cap tanh(z / cap), as ggml's three ops */
            const float cap = hp->final_softcap, inv = 1.0f / cap;
            for (size_t i = 0; i < (size_t)n_out * hp->n_vocab; i++)
                dst[i] = tanhf(dst[i] * inv) * cap;
        }
        if (n_items > 1) {
            o = 0;
            for (uint32_t i = 0; i < n_items; i++) {
                const pe_batch_item *it = &items[i];
                if (!it->logits) continue;
                uint32_t rows = it->all_logits ? it->n : 1;
                memcpy(it->logits, c->logits_tmp + (size_t)o * hp->n_vocab,
                       (size_t)rows * hp->n_vocab * sizeof(float));
                o += rows;
            }
        }
    }
    for (uint32_t i = 0; i < n_items; i++) {
        rc = pgd_seq_commit_hashed(c->cache, items[i].seq, items[i].tokens, items[i].n,
                                   items[i].hashes, items[i].n_hashes);
        if (rc < 0) return rc;
    }
    /* Budgets: enforce after the commit (the full pages committed before a sequence's
     * first compaction stay in the prefix index). A failed compaction leaves the sequence
     * as it was, every token kept: the step stands, and the failure is counted. */
    for (uint32_t i = 0; i < n_items; i++) {
        if (!items[i].budget) continue;
        int64_t d = pgd_budget_end(items[i].budget, items[i].seq);
        if (d >= 0) continue;
        c->n_budget_fail++;
        c->budget_fail_status = (int)d;
        if (c->p.log && c->n_budget_fail == 1) {
            char msg[160];
            snprintf(msg, sizeof msg,
                     "token budget: compaction failed (%s); the sequence keeps its tokens",
                     pgd_strerror((int)d));
            c->p.log(c->p.log_ud, PGD_LOG_WARN, msg);
        }
    }
    return 0;
}

int pe_forward(pe_ctx *c, pgd_seq *seq, const int32_t *tokens, uint32_t n, float *logits,
               int all_logits)
{
    pe_batch_item it = {seq, tokens, n, logits, all_logits, NULL, 0, NULL, 0};
    return pe_forward_batch(c, &it, 1);
}

int pe_forward_budget(pe_ctx *c, pgd_seq *seq, pgd_budget *budget, const int32_t *tokens,
                      uint32_t n, uint64_t prompt_left, float *logits, int all_logits)
{
    pe_batch_item it = {seq, tokens, n, logits, all_logits, NULL, 0, budget, prompt_left};
    return pe_forward_batch(c, &it, 1);
}

uint64_t pe_ctx_budget_failures(const pe_ctx *c, int *last_status)
{
    if (last_status) *last_status = c->n_budget_fail ? c->budget_fail_status : PGD_OK;
    return c->n_budget_fail;
}
