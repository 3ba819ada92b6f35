/* SPDX-License-Identifier: MIT */
/*
 * model.c - Llama-family forward pass on the paged KV cache.
 *
 * Per chunk of n tokens at positions pos0..pos0+n-1 of one sequence:
 *
 *   grow seq by n -> write_slot for each position (page, slot; copy-on-write once)
 *   x = embed(tokens)                                          [n][n_embd]
 *   for each layer l:
 *     xb = rmsnorm(x);  q,k,v = xb*Wq, xb*Wk, xb*Wv              (matrix-matrix over n)
 *     rope(q, k);  store k, v into page rows (layer l, kv head g, slot)
 *     att = softmax(q . K / sqrt(hd)) . V   over the page table, per (token, kv head):
 *           each K/V row read once serves every query head of its GQA group
 *     x += att*Wo;  x += W_down(silu(xb*W_gate) * (xb*W_up))   with xb = rmsnorm(x)
 *   logits = rmsnorm(x_last) * W_out;  commit tokens (full pages join the prefix index)
 *
 * Callers: tools/run.c, the scheduler, tests. Uses include/pagoda only.
 */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

/* Rows of one sequence per prefill attention task (see attn_tile_task). */
#define ATT_TILE 8

/* ---- loading ---- */

static int errf(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#include <stdarg.h>
static int errf(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (err && errlen) vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

static int get_u32(const gguf_file *f, const char *arch, const char *suffix, uint32_t *out,
                   int required, char *err, size_t errlen)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = gguf_get_u32(f, key, out);
    if (rc == -1 && !required) return 0;
    if (rc == -1) return errf(err, errlen, "missing hyper-parameter %s", key);
    if (rc != 0) return errf(err, errlen, "hyper-parameter %s has the wrong type", key);
    return 0;
}

static int get_f32(const gguf_file *f, const char *arch, const char *suffix, float *out, char *err,
                   size_t errlen)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = gguf_get_f32(f, key, out);
    if (rc == -1) return 0; /* optional: caller set the default */
    if (rc != 0) return errf(err, errlen, "hyper-parameter %s has the wrong type", key);
    return 0;
}

/* Finds a tensor and checks its shape {ne0, ne1} (ne1 == 0: a vector). */
static const gguf_tensor *find_checked(const gguf_file *f, const char *name, uint64_t ne0,
                                       uint64_t ne1, int required, char *err, size_t errlen)
{
    const gguf_tensor *t = gguf_find_tensor(f, name);
    if (!t) {
        if (required) errf(err, errlen, "missing tensor '%s'", name);
        return NULL;
    }
    uint64_t n1 = t->n_dims >= 2 ? t->ne[1] : 1;
    int extra = t->n_dims > 2 && (t->ne[2] != 1 || (t->n_dims > 3 && t->ne[3] != 1));
    if (t->ne[0] != ne0 || n1 != (ne1 ? ne1 : 1) || extra || t->n_dims > 4) {
        char want[64];
        if (ne1)
            snprintf(want, sizeof want, "[%llu, %llu]", (unsigned long long)ne0,
                     (unsigned long long)ne1);
        else
            snprintf(want, sizeof want, "[%llu]", (unsigned long long)ne0);
        errf(err, errlen, "tensor '%s' has shape [%llu, %llu] (%u-d), expected %s", name,
             (unsigned long long)t->ne[0], (unsigned long long)n1, t->n_dims, want);
        return NULL;
    }
    const ggml_type_traits *tr = ggml_get_traits(t->type);
    if (!tr || !tr->supported) {
        errf(err, errlen,
             "tensor '%s' has type %s, which the engine does not support "
             "(supported: f32, f16, bf16, q8_0, q4_0)",
             name, ggml_type_name(t->type));
        return NULL;
    }
    return t;
}

static int load_mat(const gguf_file *f, const char *name, uint32_t n_in, uint32_t n_out,
                    int required, pe_mat *out, char *err, size_t errlen)
{
    const gguf_tensor *t = find_checked(f, name, n_in, n_out, required, err, errlen);
    memset(out, 0, sizeof *out);
    if (!t) return required ? -1 : (err && err[0] ? -1 : 0);
    out->type = t->type;
    out->n_in = n_in;
    out->n_out = n_out;
    out->data = t->data;
    out->row_bytes = ggml_row_size(t->type, n_in);
    if (!out->row_bytes)
        return errf(err, errlen, "tensor '%s': row of %u values does not fit type %s", name, n_in,
                    ggml_type_name(t->type));
    return 0;
}

/* Loads a norm vector as f32: in place when stored as f32, else converted into *owned. */
static int load_vec(const gguf_file *f, const char *name, uint32_t n, float **owned_cursor,
                    const float **out, char *err, size_t errlen)
{
    const gguf_tensor *t = find_checked(f, name, n, 0, 1, err, errlen);
    if (!t) return -1;
    if (t->type == GGML_TYPE_F32) {
        *out = t->data;
        return 0;
    }
    if (ggml_get_traits(t->type)->blck_size != 1 && n % 32)
        return errf(err, errlen, "tensor '%s': length %u does not fit type %s", name, n,
                    ggml_type_name(t->type));
    pe_dequant_row(t->type, t->data, *owned_cursor, n);
    *out = *owned_cursor;
    *owned_cursor += n;
    return 0;
}

void pe_model_free(pe_model *m)
{
    if (!m) return;
    pe_vocab_free(m->vocab);
    free(m->layers);
    free(m->owned);
    gguf_close(m->gf);
    free(m);
}

static pgd_hash fingerprint(const gguf_file *f)
{
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    uint64_t n = gguf_n_tensors(f);
    for (uint64_t i = 0; i < n; i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        XXH3_128bits_update(&st, t->name.ptr, t->name.len);
        XXH3_128bits_update(&st, &t->type, sizeof t->type);
        XXH3_128bits_update(&st, t->ne, sizeof t->ne);
        XXH3_128bits_update(&st, t->data, t->n_bytes < 256 ? t->n_bytes : 256);
    }
    uint64_t nkv = gguf_n_kv(f);
    for (uint64_t i = 0; i < nkv; i++) {
        char buf[256];
        const gguf_kv *kv = gguf_kv_at(f, i);
        XXH3_128bits_update(&st, kv->key.ptr, kv->key.len);
        gguf_kv_to_string(kv, buf, sizeof buf);
        XXH3_128bits_update(&st, buf, strlen(buf));
    }
    XXH128_hash_t h = XXH3_128bits_digest(&st);
    pgd_hash r = {h.low64, h.high64};
    return r;
}

int pe_model_load(const char *path, pe_progress_fn progress, void *ud, pe_model **out, char *err,
                  size_t errlen)
{
    pe_model *m = calloc(1, sizeof *m);
    char msg[512];
    *out = NULL;
    if (err && errlen) err[0] = '\0';
    if (!m) return errf(err, errlen, "out of memory");
    if (gguf_open(path, &m->gf, msg, sizeof msg) != 0) {
        errf(err, errlen, "%s: %s", path, msg);
        goto fail;
    }
    const gguf_file *f = m->gf;
    gguf_str arch;
    if (gguf_get_str(f, "general.architecture", &arch) != 0) {
        errf(err, errlen, "%s: missing general.architecture", path);
        goto fail;
    }
    if (arch.len != 5 || memcmp(arch.ptr, "llama", 5) != 0) {
        errf(err, errlen, "%s: architecture '%.*s' is not supported (supported: llama)", path,
             (int)(arch.len > 64 ? 64 : arch.len), arch.ptr);
        goto fail;
    }
    gguf_str name;
    if (gguf_get_str(f, "general.name", &name) == 0)
        snprintf(m->name, sizeof m->name, "%.*s", (int)(name.len > 100 ? 100 : name.len), name.ptr);

    pe_hparams *hp = &m->hp;
    hp->rope_theta = 10000.0f;
    hp->rms_eps = 1e-5f;
    hp->rope_scale = 1.0f;
    if (get_u32(f, "llama", "context_length", &hp->n_ctx_train, 1, err, errlen) ||
        get_u32(f, "llama", "embedding_length", &hp->n_embd, 1, err, errlen) ||
        get_u32(f, "llama", "block_count", &hp->n_layer, 1, err, errlen) ||
        get_u32(f, "llama", "feed_forward_length", &hp->n_ff, 1, err, errlen) ||
        get_u32(f, "llama", "attention.head_count", &hp->n_head, 1, err, errlen) ||
        get_f32(f, "llama", "rope.freq_base", &hp->rope_theta, err, errlen) ||
        get_f32(f, "llama", "attention.layer_norm_rms_epsilon", &hp->rms_eps, err, errlen))
        goto fail;
    hp->n_head_kv = hp->n_head;
    if (get_u32(f, "llama", "attention.head_count_kv", &hp->n_head_kv, 0, err, errlen)) goto fail;
    if (!hp->n_embd || !hp->n_layer || !hp->n_head || !hp->n_head_kv || !hp->n_ff ||
        hp->n_embd % hp->n_head || hp->n_head % hp->n_head_kv || hp->n_layer > 4096 ||
        hp->n_embd > (1u << 20) || hp->n_ff > (1u << 22)) {
        errf(err, errlen,
             "%s: inconsistent hyper-parameters (embedding %u, layers %u, heads %u, kv heads "
             "%u, ffn %u)",
             path, hp->n_embd, hp->n_layer, hp->n_head, hp->n_head_kv, hp->n_ff);
        goto fail;
    }
    hp->head_dim = hp->n_embd / hp->n_head;
    if (get_u32(f, "llama", "attention.key_length", &hp->head_dim, 0, err, errlen)) goto fail;
    hp->n_rot = hp->head_dim;
    if (get_u32(f, "llama", "rope.dimension_count", &hp->n_rot, 0, err, errlen)) goto fail;
    if (hp->n_rot > hp->head_dim || hp->n_rot % 2 || hp->head_dim > 1024 || !hp->head_dim) {
        errf(err, errlen, "%s: rope.dimension_count %u does not fit head_dim %u", path, hp->n_rot,
             hp->head_dim);
        goto fail;
    }
    gguf_str stype;
    if (gguf_get_str(f, "llama.rope.scaling.type", &stype) == 0 && stype.len == 6 &&
        memcmp(stype.ptr, "linear", 6) == 0) {
        float factor = 1.0f;
        if (gguf_get_f32(f, "llama.rope.scaling.factor", &factor) == 0 && factor > 0)
            hp->rope_scale = 1.0f / factor;
    }

    if (pe_vocab_load(f, &m->vocab, msg, sizeof msg) != 0) {
        errf(err, errlen, "%s: tokenizer: %s", path, msg);
        goto fail;
    }
    hp->n_vocab = pe_vocab_n_tokens(m->vocab);

    const uint32_t E = hp->n_embd, Q = hp->n_head * hp->head_dim;
    const uint32_t KV = hp->n_head_kv * hp->head_dim;
    m->layers = calloc(hp->n_layer, sizeof *m->layers);
    m->owned = malloc(((size_t)2 * hp->n_layer + 1) * E * sizeof(float));
    if (!m->layers || !m->owned) {
        errf(err, errlen, "out of memory");
        goto fail;
    }
    float *cursor = m->owned;
    if (load_mat(f, "token_embd.weight", E, hp->n_vocab, 1, &m->tok_embd, err, errlen) ||
        load_vec(f, "output_norm.weight", E, &cursor, &m->output_norm, err, errlen) ||
        load_mat(f, "output.weight", E, hp->n_vocab, 0, &m->output, err, errlen))
        goto fail;
    if (!m->output.data) m->output = m->tok_embd; /* tied */
    const gguf_tensor *rf = gguf_find_tensor(f, "rope_freqs.weight");
    if (rf) {
        if (rf->type != GGML_TYPE_F32 || rf->ne[0] != hp->n_rot / 2) {
            errf(err, errlen, "tensor 'rope_freqs.weight' must be f32 [%u]", hp->n_rot / 2);
            goto fail;
        }
        m->rope_freqs = rf->data;
    }
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        pe_layer *L = &m->layers[l];
        char nm[96];
#define NAME(s) (snprintf(nm, sizeof nm, "blk.%u." s ".weight", l), nm)
        if (load_vec(f, NAME("attn_norm"), E, &cursor, &L->attn_norm, err, errlen) ||
            load_vec(f, NAME("ffn_norm"), E, &cursor, &L->ffn_norm, err, errlen) ||
            load_mat(f, NAME("attn_q"), E, Q, 1, &L->wq, err, errlen) ||
            load_mat(f, NAME("attn_k"), E, KV, 1, &L->wk, err, errlen) ||
            load_mat(f, NAME("attn_v"), E, KV, 1, &L->wv, err, errlen) ||
            load_mat(f, NAME("attn_output"), Q, E, 1, &L->wo, err, errlen) ||
            load_mat(f, NAME("ffn_gate"), E, hp->n_ff, 1, &L->w_gate, err, errlen) ||
            load_mat(f, NAME("ffn_up"), E, hp->n_ff, 1, &L->w_up, err, errlen) ||
            load_mat(f, NAME("ffn_down"), hp->n_ff, E, 1, &L->w_down, err, errlen))
            goto fail;
#undef NAME
    }
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++)
        m->weight_bytes += gguf_tensor_at(f, i)->n_bytes;
    /* Touch the weights once, so that the first token does not pay for page faults, and
     * so that a large model shows progress while it comes off the disk. */
    if (progress) {
        uint64_t total = m->weight_bytes, done = 0;
        volatile uint8_t sink = 0;
        for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
            const gguf_tensor *t = gguf_tensor_at(f, i);
            const uint8_t *p = t->data;
            for (uint64_t o = 0; o < t->n_bytes; o += 4096)
                sink ^= p[o];
            done += t->n_bytes;
            progress(ud, done, total);
        }
        (void)sink;
    }
    m->fingerprint = fingerprint(f);
    *out = m;
    return 0;
fail:
    pe_model_free(m);
    return -1;
}

/* ---- context ---- */

struct pe_ctx {
    pe_model *m;
    pe_ctx_params p;
    pgd_cache *cache;
    pgd_pool *pool;
    pe_threadpool *tp;
    uint32_t n_threads;
    float *x, *xb, *q, *k, *v, *ao, *hb, *hb2; /* [n_batch][...] activations */
    float *att;                                /* [n_threads][att_stride] scores */
    size_t att_stride;                         /* ATT_TILE * group * (n_ctx + 15) floats */
    float *pagebuf;                            /* [n_threads][pagebuf_stride] */
    size_t pagebuf_stride;
    uint32_t *tile_row, *tile_len, n_tiles; /* [n_batch] prefill attention tiles */
    float *rope;                            /* [n_batch][n_rot/2][2] cos, sin */
    float *inv_freq;                        /* [n_rot/2] */
    uint32_t *slot_page, *slot_off;         /* [n_batch] where each row's K/V goes */
    uint64_t *row_pos;                      /* [n_batch] position of each row */
    const uint32_t **row_pages;             /* [n_batch] page table of each row's seq */
    float *logits_tmp;                      /* [cap][n_vocab], batches of several seqs */
    uint32_t logits_cap;
    void *scratch;
    float *kc, *vc; /* contiguous reference [layer][n_ctx][kv] */
};

pe_ctx_params pe_ctx_default_params(void)
{
    pe_ctx_params p;
    memset(&p, 0, sizeof p);
    p.n_batch = 512;
    p.page_tokens = 16;
    p.kv_type = PGD_KV_F16;
    p.policy = PGD_POLICY_LRU;
    return p;
}

pgd_cache *pe_ctx_cache(pe_ctx *ctx)
{
    return ctx->cache;
}
const pe_ctx_params *pe_ctx_params_get(const pe_ctx *ctx)
{
    return &ctx->p;
}

void pe_ctx_free(pe_ctx *ctx)
{
    if (!ctx) return;
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
    free(ctx->att);
    free(ctx->pagebuf);
    free(ctx->tile_row);
    free(ctx->tile_len);
    free(ctx->rope);
    free(ctx->inv_freq);
    free(ctx->slot_page);
    free(ctx->slot_off);
    free(ctx->row_pos);
    free(ctx->row_pages);
    free(ctx->logits_tmp);
    free(ctx->scratch);
    free(ctx->kc);
    free(ctx->vc);
    free(ctx);
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

int pe_ctx_create(pe_model *m, const pe_ctx_params *pp, pe_ctx **out, char *err, size_t errlen)
{
    const pe_hparams *hp = &m->hp;
    pe_ctx *c = calloc(1, sizeof *c);
    *out = NULL;
    if (!c) return errf(err, errlen, "out of memory");
    c->m = m;
    c->p = pp ? *pp : pe_ctx_default_params();
    if (!c->p.n_ctx) c->p.n_ctx = hp->n_ctx_train;
    if (!c->p.n_batch) c->p.n_batch = 512;
    if (c->p.n_batch > c->p.n_ctx) c->p.n_batch = c->p.n_ctx;
    if (!c->p.page_tokens) c->p.page_tokens = 16;
    if (!c->p.kv_tokens) c->p.kv_tokens = c->p.n_ctx;
    if (c->p.n_ctx > (1u << 22)) {
        errf(err, errlen, "context of %u tokens is too large", c->p.n_ctx);
        goto fail;
    }
    c->tp = pe_tp_create(c->p.n_threads);
    if (!c->tp) {
        errf(err, errlen, "cannot start threads");
        goto fail;
    }
    c->n_threads = pe_tp_n_threads(c->tp);

    pgd_cache_params cp = pgd_cache_default_params();
    cp.pool.n_layers = hp->n_layer;
    cp.pool.n_kv_heads = hp->n_head_kv;
    cp.pool.head_dim = hp->head_dim;
    cp.pool.page_tokens = c->p.page_tokens;
    cp.pool.kv_type = c->p.kv_type;
    cp.pool.capacity_pages = (uint32_t)((c->p.kv_tokens + c->p.page_tokens - 1) / c->p.page_tokens);
    cp.policy = c->p.policy;
    cp.model_fingerprint = m->fingerprint;
    int rc = pgd_cache_create(&cp, &c->cache);
    if (rc != PGD_OK) {
        errf(err, errlen, "KV cache of %llu tokens: %s", (unsigned long long)c->p.kv_tokens,
             pgd_strerror(rc));
        goto fail;
    }
    c->pool = pgd_cache_pool(c->cache);

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
    c->att_stride = (size_t)ATT_TILE * G * ((c->p.n_ctx + 15) & ~(size_t)7);
    c->att = malloc((size_t)c->n_threads * c->att_stride * sizeof(float));
    const size_t ldk = (c->p.page_tokens + 7) & ~(size_t)7;
    c->pagebuf_stride = ldk * hp->head_dim + (size_t)c->p.page_tokens * hp->head_dim + ldk * G + 16;
    c->pagebuf = malloc((size_t)c->n_threads * c->pagebuf_stride * sizeof(float));
    c->tile_row = malloc(n * sizeof(uint32_t));
    c->tile_len = malloc(n * sizeof(uint32_t));
    c->rope = malloc(n * hp->n_rot * sizeof(float));
    c->inv_freq = malloc(hp->n_rot / 2 * sizeof(float) + sizeof(float));
    c->slot_page = malloc(n * sizeof(uint32_t));
    c->slot_off = malloc(n * sizeof(uint32_t));
    c->row_pos = malloc(n * sizeof(uint64_t));
    c->row_pages = malloc(n * sizeof(uint32_t *));
    c->scratch = malloc(max_scratch(m, (uint32_t)n) + 64);
    if (!c->x || !c->xb || !c->q || !c->k || !c->v || !c->ao || !c->hb || !c->hb2 || !c->att ||
        !c->rope || !c->inv_freq || !c->slot_page || !c->slot_off || !c->row_pos || !c->row_pages ||
        !c->scratch || !c->pagebuf || !c->tile_row || !c->tile_len) {
        errf(err, errlen, "out of memory for activations of %zu tokens", n);
        goto fail;
    }
    if (c->p.contiguous_ref) {
        c->kc = calloc((size_t)hp->n_layer * c->p.n_ctx * KV, sizeof(float));
        c->vc = calloc((size_t)hp->n_layer * c->p.n_ctx * KV, sizeof(float));
        if (!c->kc || !c->vc) {
            errf(err, errlen, "out of memory for the contiguous reference cache");
            goto fail;
        }
    }
    for (uint32_t i = 0; i < hp->n_rot / 2; i++) {
        double f = pow((double)hp->rope_theta, -2.0 * i / hp->n_rot);
        if (m->rope_freqs) f /= m->rope_freqs[i];
        c->inv_freq[i] = (float)f;
    }
    *out = c;
    return 0;
fail:
    pe_ctx_free(c);
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

#if defined(__x86_64__)
#include <immintrin.h>
/* Converts n f16 values to f32. */
__attribute__((target("avx2,fma,f16c"))) static void f16_to_f32_avx2(const uint16_t *x, float *y,
                                                                     size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < n; i++)
        y[i] = pe_f16_to_f32(x[i]);
}

/* out[h][j] = scale * sum_d q[h][d] * kt[d][j] for h < nq (query vectors q + h * hd),
 * j < 8 * n_blk: keys in the lanes, so no horizontal sums; four queries at a time keep
 * eight independent accumulators in flight (a single chain of FMAs is latency-bound).
 * kt is the page's K transposed, row stride ldk; out rows have stride ldo. */
__attribute__((target("avx2,fma"))) static void scores_avx2(const float *kt, uint32_t ldk,
                                                            uint32_t n_blk, const float *q,
                                                            uint32_t nq, uint32_t hd, float scale,
                                                            float *out, uint32_t ldo)
{
    const __m256 vs = _mm256_set1_ps(scale);
    for (uint32_t b = 0; b < n_blk; b++) {
        uint32_t h = 0;
        for (; h + 4 <= nq; h += 4) {
            const float *q0 = q + (size_t)h * hd;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (uint32_t d = 0; d < hd; d++) {
                __m256 k = _mm256_loadu_ps(kt + (size_t)d * ldk + 8 * b);
                a0 = _mm256_fmadd_ps(_mm256_set1_ps(q0[d]), k, a0);
                a1 = _mm256_fmadd_ps(_mm256_set1_ps(q0[hd + d]), k, a1);
                a2 = _mm256_fmadd_ps(_mm256_set1_ps(q0[2 * hd + d]), k, a2);
                a3 = _mm256_fmadd_ps(_mm256_set1_ps(q0[3 * hd + d]), k, a3);
            }
            _mm256_storeu_ps(out + (size_t)h * ldo + 8 * b, _mm256_mul_ps(a0, vs));
            _mm256_storeu_ps(out + (size_t)(h + 1) * ldo + 8 * b, _mm256_mul_ps(a1, vs));
            _mm256_storeu_ps(out + (size_t)(h + 2) * ldo + 8 * b, _mm256_mul_ps(a2, vs));
            _mm256_storeu_ps(out + (size_t)(h + 3) * ldo + 8 * b, _mm256_mul_ps(a3, vs));
        }
        for (; h < nq; h++) {
            __m256 a0 = _mm256_setzero_ps(), a1 = a0;
            const float *q0 = q + (size_t)h * hd;
            uint32_t d = 0;
            for (; d + 2 <= hd; d += 2) {
                a0 = _mm256_fmadd_ps(_mm256_set1_ps(q0[d]),
                                     _mm256_loadu_ps(kt + (size_t)d * ldk + 8 * b), a0);
                a1 = _mm256_fmadd_ps(_mm256_set1_ps(q0[d + 1]),
                                     _mm256_loadu_ps(kt + (size_t)(d + 1) * ldk + 8 * b), a1);
            }
            for (; d < hd; d++)
                a0 = _mm256_fmadd_ps(_mm256_set1_ps(q0[d]),
                                     _mm256_loadu_ps(kt + (size_t)d * ldk + 8 * b), a0);
            _mm256_storeu_ps(out + (size_t)h * ldo + 8 * b,
                             _mm256_mul_ps(_mm256_add_ps(a0, a1), vs));
        }
    }
}

/* out[0..hd) += sum_r a[r] * v[r][0..hd) with the output row held in registers
 * (hd a multiple of 8, at most 128). */
__attribute__((target("avx2,fma"))) static void
acc_rows_avx2(const float *v, uint32_t rows, const float *a, uint32_t hd, float *out)
{
    __m256 acc[16];
    const uint32_t nc = hd / 8;
    for (uint32_t c = 0; c < nc; c++)
        acc[c] = _mm256_loadu_ps(out + 8 * c);
    for (uint32_t r = 0; r < rows; r++) {
        __m256 ar = _mm256_set1_ps(a[r]);
        const float *vr = v + (size_t)r * hd;
        for (uint32_t c = 0; c < nc; c++)
            acc[c] = _mm256_fmadd_ps(ar, _mm256_loadu_ps(vr + 8 * c), acc[c]);
    }
    for (uint32_t c = 0; c < nc; c++)
        _mm256_storeu_ps(out + 8 * c, acc[c]);
}

#endif

static int have_avx2 = -1;

static void f16_to_f32(const uint16_t *x, float *y, size_t n)
{
#if defined(__x86_64__)
    if (have_avx2) {
        f16_to_f32_avx2(x, y, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        y[i] = pe_f16_to_f32(x[i]);
}

static void scores(const float *kt, uint32_t ldk, uint32_t n_blk, const float *q, uint32_t nq,
                   uint32_t hd, float scale, float *out, uint32_t ldo)
{
#if defined(__x86_64__)
    if (have_avx2) {
        scores_avx2(kt, ldk, n_blk, q, nq, hd, scale, out, ldo);
        return;
    }
#endif
    for (uint32_t h = 0; h < nq; h++) {
        for (uint32_t j = 0; j < 8 * n_blk; j++) {
            float acc = 0;
            for (uint32_t d = 0; d < hd; d++)
                acc += q[(size_t)h * hd + d] * kt[(size_t)d * ldk + j];
            out[(size_t)h * ldo + j] = acc * scale;
        }
    }
}

static void acc_rows(const float *v, uint32_t rows, const float *a, uint32_t hd, float *out)
{
#if defined(__x86_64__)
    if (have_avx2 && hd % 8 == 0 && hd <= 128) {
        acc_rows_avx2(v, rows, a, hd, out);
        return;
    }
#endif
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t d = 0; d < hd; d++)
            out[d] += a[r] * v[(size_t)r * hd + d];
}

/* ---- attention over pages ---- */

typedef struct attn_job {
    pe_ctx *c;
    uint32_t layer;
} attn_job;

/* The contiguous reference (tests): one task = (token t, kv head g), K/V from plain
 * per-layer arrays, scalar loops. */
static void attn_task(void *ud, uint32_t task, uint32_t thread)
{
    attn_job *j = ud;
    pe_ctx *c = j->c;
    const pe_hparams *hp = &c->m->hp;
    const uint32_t hd = hp->head_dim, G = hp->n_head / hp->n_head_kv;
    const uint32_t t = task / hp->n_head_kv, g = task % hp->n_head_kv;
    const uint64_t n_keys = c->row_pos[t] + 1;
    const float scale = 1.0f / sqrtf((float)hd);
    float *sc = c->att + (size_t)thread * G * c->p.n_ctx; /* [G][n_keys] */
    const float *q = c->q + (size_t)t * hp->n_head * hd + (size_t)g * G * hd;
    float *out = c->ao + (size_t)t * hp->n_head * hd + (size_t)g * G * hd;
    const size_t KV = (size_t)hp->n_head_kv * hd;
    const float *K = c->kc + (size_t)j->layer * c->p.n_ctx * KV + (size_t)g * hd;
    const float *V = c->vc + (size_t)j->layer * c->p.n_ctx * KV + (size_t)g * hd;
    for (uint32_t h = 0; h < G; h++) {
        float *s = sc + (size_t)h * n_keys, *o = out + (size_t)h * hd;
        for (uint64_t p = 0; p < n_keys; p++) {
            float d = 0;
            for (uint32_t i = 0; i < hd; i++)
                d += q[h * hd + i] * K[p * KV + i];
            s[p] = d * scale;
        }
        pe_softmax(s, (uint32_t)n_keys);
        memset(o, 0, hd * sizeof *o);
        for (uint64_t p = 0; p < n_keys; p++)
            for (uint32_t i = 0; i < hd; i++)
                o[i] += s[p] * V[p * KV + i];
    }
}

/* Copies a page's K or V rows of one head to f32 [rows][hd]. */
static void page_rows_f32(const pe_ctx *c, const void *src, uint32_t rows, uint32_t hd, float *dst)
{
    if (c->p.kv_type == PGD_KV_F16)
        f16_to_f32(src, dst, (size_t)rows * hd);
    else
        memcpy(dst, src, (size_t)rows * hd * sizeof(float));
}

/*
 * Paged attention: one task = (up to ATT_TILE consecutive rows of one sequence, kv head g);
 * a decode token is a tile of one row.
 * Each K page is converted and transposed once ([hd][keys], keys in SIMD lanes) and
 * serves every row of the tile and every query head of the group; each V page likewise.
 * Rows are causal: row t sees keys [0, pos_t].
 */
static void attn_tile_task(void *ud, uint32_t task, uint32_t thread)
{
    attn_job *j = ud;
    pe_ctx *c = j->c;
    const pe_hparams *hp = &c->m->hp;
    const uint32_t hd = hp->head_dim, G = hp->n_head / hp->n_head_kv, pt = c->p.page_tokens;
    const uint32_t tile = task / hp->n_head_kv, g = task % hp->n_head_kv;
    const uint32_t r0 = c->tile_row[tile], nr = c->tile_len[tile];
    const uint32_t *pages = c->row_pages[r0];
    const uint64_t max_keys = c->row_pos[r0 + nr - 1] + 1;
    const uint32_t ldk = (pt + 7) & ~7u;
    const float scale = 1.0f / sqrtf((float)hd);
    /* Score rows have stride ldo >= max_keys + 7: a page's scores are stored in whole
     * SIMD blocks straight into place; what spills past a row's valid keys lies beyond
     * them (never read) or is overwritten by the next page. */
    const size_t ldo = (size_t)((max_keys + 15) & ~(uint64_t)7);
    float *sc = c->att + (size_t)thread * c->att_stride;         /* [nr][G][ldo] */
    float *kt = c->pagebuf + (size_t)thread * c->pagebuf_stride; /* [hd][ldk] */
    float *vf = kt + (size_t)hd * ldk;                           /* [pt][hd] */

    for (uint64_t p0 = 0; p0 < max_keys; p0 += pt) {
        uint32_t rows = max_keys - p0 < pt ? (uint32_t)(max_keys - p0) : pt;
        page_rows_f32(c, pgd_pool_k(c->pool, pages[p0 / pt], j->layer, g), rows, hd, vf);
        for (uint32_t d = 0; d < hd; d++) {
            for (uint32_t r = 0; r < ldk; r++)
                kt[(size_t)d * ldk + r] = r < rows ? vf[(size_t)r * hd + d] : 0.0f;
        }
        for (uint32_t t = 0; t < nr; t++) {
            uint64_t nk = c->row_pos[r0 + t] + 1;
            if (p0 >= nk) continue;
            uint32_t valid = nk - p0 < rows ? (uint32_t)(nk - p0) : rows;
            const float *q = c->q + (size_t)(r0 + t) * hp->n_head * hd + (size_t)g * G * hd;
            scores(kt, ldk, (valid + 7) / 8, q, G, hd, scale, sc + (size_t)t * G * ldo + p0,
                   (uint32_t)ldo);
        }
    }
    for (uint32_t t = 0; t < nr; t++) {
        uint64_t nk = c->row_pos[r0 + t] + 1;
        float *out = c->ao + (size_t)(r0 + t) * hp->n_head * hd + (size_t)g * G * hd;
        for (uint32_t h = 0; h < G; h++) {
            pe_softmax(sc + ((size_t)t * G + h) * ldo, (uint32_t)nk);
            memset(out + (size_t)h * hd, 0, hd * sizeof(float));
        }
    }
    for (uint64_t p0 = 0; p0 < max_keys; p0 += pt) {
        uint32_t rows = max_keys - p0 < pt ? (uint32_t)(max_keys - p0) : pt;
        page_rows_f32(c, pgd_pool_v(c->pool, pages[p0 / pt], j->layer, g), rows, hd, vf);
        for (uint32_t t = 0; t < nr; t++) {
            uint64_t nk = c->row_pos[r0 + t] + 1;
            if (p0 >= nk) continue;
            uint32_t valid = nk - p0 < rows ? (uint32_t)(nk - p0) : rows;
            float *out = c->ao + (size_t)(r0 + t) * hp->n_head * hd + (size_t)g * G * hd;
            const float *a = sc + (size_t)t * G * ldo + p0;
            for (uint32_t h = 0; h < G; h++)
                acc_rows(vf, valid, a + h * ldo, hd, out + (size_t)h * hd);
        }
    }
}

/* Stores the chunk's k and v rows of one layer into their page slots. */
static void store_kv(pe_ctx *c, uint32_t layer, uint32_t n)
{
    const pe_hparams *hp = &c->m->hp;
    const uint32_t hd = hp->head_dim;
    const size_t KV = (size_t)hp->n_head_kv * hd;
    for (uint32_t t = 0; t < n; t++) {
        for (uint32_t g = 0; g < hp->n_head_kv; g++) {
            const float *ks = c->k + t * KV + (size_t)g * hd;
            const float *vs = c->v + t * KV + (size_t)g * hd;
            void *kd = pgd_pool_k(c->pool, c->slot_page[t], layer, g);
            void *vd = pgd_pool_v(c->pool, c->slot_page[t], layer, g);
            if (c->p.kv_type == PGD_KV_F16) {
                uint16_t *k16 = (uint16_t *)kd + (size_t)c->slot_off[t] * hd;
                uint16_t *v16 = (uint16_t *)vd + (size_t)c->slot_off[t] * hd;
                for (uint32_t i = 0; i < hd; i++) {
                    k16[i] = pe_f32_to_f16(ks[i]);
                    v16[i] = pe_f32_to_f16(vs[i]);
                }
            } else {
                memcpy((float *)kd + (size_t)c->slot_off[t] * hd, ks, hd * sizeof(float));
                memcpy((float *)vd + (size_t)c->slot_off[t] * hd, vs, hd * sizeof(float));
            }
        }
        if (c->kc) {
            float *kc = c->kc + ((size_t)layer * c->p.n_ctx + c->row_pos[t]) * KV;
            float *vc = c->vc + ((size_t)layer * c->p.n_ctx + c->row_pos[t]) * KV;
            for (size_t i = 0; i < KV; i++) { /* same rounding as the pages */
                kc[i] = c->p.kv_type == PGD_KV_F16 ? pe_f16_to_f32(pe_f32_to_f16(c->k[t * KV + i]))
                                                   : c->k[t * KV + i];
                vc[i] = c->p.kv_type == PGD_KV_F16 ? pe_f16_to_f32(pe_f32_to_f16(c->v[t * KV + i]))
                                                   : c->v[t * KV + i];
            }
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
    uint64_t pos0[PE_MAX_BATCH_SEQS];
    uint32_t n = 0, n_out = 0;
    int rc;

    if (have_avx2 < 0) have_avx2 = pe_isa_detect() >= PE_ISA_AVX2;
    if (n_items == 0 || n_items > PE_MAX_BATCH_SEQS || (c->kc && n_items > 1)) return PGD_EINVAL;
    for (uint32_t i = 0; i < n_items; i++) {
        const pe_batch_item *it = &items[i];
        if (!it->seq || !it->n || it->n > c->p.n_batch - n) return PGD_EINVAL;
        pos0[i] = pgd_seq_length(c->cache, it->seq);
        if (pos0[i] + it->n > c->p.n_ctx) return PGD_EINVAL;
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
        for (uint32_t t = 0; t < items[i].n; t++, r++) {
            c->row_pos[r] = pos0[i] + t;
            rc = pgd_seq_write_slot(c->cache, items[i].seq, c->row_pos[r], &c->slot_page[r],
                                    &c->slot_off[r]);
            if (rc != PGD_OK) {
                undo_grows(c, items, pos0, n_items);
                return rc;
            }
        }
    }
    /* Attention tiles: runs of up to ATT_TILE rows of one sequence. */
    c->n_tiles = 0;
    r = 0;
    for (uint32_t i = 0; i < n_items; i++) {
        for (uint32_t t = 0; t < items[i].n; t += ATT_TILE) {
            c->tile_row[c->n_tiles] = r + t;
            c->tile_len[c->n_tiles++] = items[i].n - t < ATT_TILE ? items[i].n - t : ATT_TILE;
        }
        r += items[i].n;
    }
    r = 0;
    for (uint32_t i = 0; i < n_items; i++) {
        const uint32_t *pages;
        pgd_seq_pages(c->cache, items[i].seq, &pages);
        for (uint32_t t = 0; t < items[i].n; t++, r++) {
            c->row_pages[r] = pages;
            int32_t tok = items[i].tokens[t];
            pe_dequant_row(m->tok_embd.type,
                           (const uint8_t *)m->tok_embd.data + (size_t)tok * m->tok_embd.row_bytes,
                           c->x + (size_t)r * E, E);
            float pos = (float)c->row_pos[r] * hp->rope_scale;
            for (uint32_t k = 0; k < hp->n_rot / 2; k++) {
                float th = pos * c->inv_freq[k];
                c->rope[(size_t)r * hp->n_rot + 2 * k] = cosf(th);
                c->rope[(size_t)r * hp->n_rot + 2 * k + 1] = sinf(th);
            }
        }
    }

    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const pe_layer *L = &m->layers[l];
        for (uint32_t t = 0; t < n; t++)
            pe_rmsnorm(c->xb + (size_t)t * E, c->x + (size_t)t * E, L->attn_norm, E, hp->rms_eps);
        pe_matmul(c->tp, &L->wq, c->xb, n, c->q, c->scratch);
        pe_matmul(c->tp, &L->wk, c->xb, n, c->k, c->scratch);
        pe_matmul(c->tp, &L->wv, c->xb, n, c->v, c->scratch);
        for (uint32_t t = 0; t < n; t++) {
            const float *cs = c->rope + (size_t)t * hp->n_rot;
            rope_apply(c->q + t * Q, cs, hp->n_head, hd, hp->n_rot);
            rope_apply(c->k + t * KV, cs, hp->n_head_kv, hd, hp->n_rot);
        }
        store_kv(c, l, n);
        attn_job job = {c, l};
        if (c->kc)
            pe_tp_run(c->tp, attn_task, &job, n * hp->n_head_kv);
        else
            pe_tp_run(c->tp, attn_tile_task, &job, c->n_tiles * hp->n_head_kv);
        pe_matmul(c->tp, &L->wo, c->ao, n, c->xb, c->scratch);
        for (size_t i = 0; i < (size_t)n * E; i++)
            c->x[i] += c->xb[i];

        for (uint32_t t = 0; t < n; t++)
            pe_rmsnorm(c->xb + (size_t)t * E, c->x + (size_t)t * E, L->ffn_norm, E, hp->rms_eps);
        pe_matmul(c->tp, &L->w_gate, c->xb, n, c->hb, c->scratch);
        pe_matmul(c->tp, &L->w_up, c->xb, n, c->hb2, c->scratch);
        pe_swiglu_f32(c->hb, c->hb2, (size_t)n * F);
        pe_matmul(c->tp, &L->w_down, c->hb, n, c->xb, c->scratch);
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
        pe_matmul(c->tp, &m->output, c->xb, n_out, dst, c->scratch);
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
        rc = pgd_seq_commit(c->cache, items[i].seq, items[i].tokens, items[i].n);
        if (rc < 0) return rc;
    }
    return 0;
}

int pe_forward(pe_ctx *c, pgd_seq *seq, const int32_t *tokens, uint32_t n, float *logits,
               int all_logits)
{
    pe_batch_item it = {seq, tokens, n, logits, all_logits};
    return pe_forward_batch(c, &it, 1);
}
