/* SPDX-License-Identifier: MIT */
/*
 * weights.c - loading a Llama-family model (architectures llama, qwen2, qwen3, phi3, gemma2,
 * gemma3: model.h pe_arch) from GGUF: hyper-parameters, every weight tensor checked for type and
 * shape, the vocabulary, and the model fingerprint.
 *
 *   pe_model_load(path)   mmap the file (pe_gguf_open), read <arch>.* hyper-parameters
 *                         (refused unless floats are finite and in range, integers sane),
 *                         point each pe_mat at its tensor in the mapping (no copy; norms
 *                         stored as f16/bf16 are converted to f32 into one owned array),
 *                         load the tokenizer, compute the fingerprint, then (x86 kernels,
 *                         unless PGD_PACK=0) pack the Q8_0 product weights (pack_weights)
 *
 * Packing (pe_mat_pack): each Q8_0 matrix of a product (attention, FFN, output; phi3's views
 * each on its own; token_embd only as a tied output) gets a copy in the x86 kernels' panel
 * layout (one layout for AVX-512, AVX-VNNI and AVX2), which they read at every token count
 * instead of repacking per call; the file pages of its stored copy are then released
 * (MADV_DONTNEED), so that RSS holds the packed copy (anonymous memory, as many bytes as the
 * stored weights) instead of the file pages. The scalar kernels, forced after load, read the
 * stored rows, which refault from the file. On AVX-512 every logit is bit-identical with and
 * without packing; on the AVX2 levels the packed decode products are pe_matmul_ref's bits
 * and the stored rows' GEMV tiles round differently, so logits differ by rounding
 * (tests/engine/test_packed.c). Until the AVX2 levels had a GEMV on the packed copy they
 * kept both (1B q8_0, PGD_ISA=avx2, bench_engine tg32: VmHWM 2233 MB packed, 1155 MB with
 * PGD_PACK=0; now 1220 MB, decode within the noise of the stored rows' speed).
 * 1B q8_0 on AVX-512 (2 vCPUs): load 0.08 -> 0.73-0.91 s (the repack on every core);
 * VmRSS of pagoda run while it generates 1099 -> 1148 MB (1083 MB of packed copies; the
 * rest are embedding rows get_rows refaults, in 2 MiB file folios), of pagoda serve at
 * 'listening' 851 MB (file pages, partly faulted) -> 1093 MB.
 *
 * Invariant: a loaded pe_model is immutable; forward passes on any number of contexts
 * may read it at once. Callers: tools, the server (through pe_model_load), forward.c and
 * the scheduler (through model_int.h and the accessors). Uses include/pagoda only.
 */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "model_int.h"
#include "threadpool.h"

/* ---- loading ---- */

/* The largest llama.context_length accepted (16M tokens, above every trained context
 * published): a larger or zero one is a broken file, not a model. */
#define PE_MAX_CTX_TRAIN (1u << 24)

int pe__errf(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (err && errlen) vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

static int get_u32(const pe_gguf_file *f, const char *arch, const char *suffix, uint32_t *out,
                   int required, char *err, size_t errlen)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = pe_gguf_get_u32(f, key, out);
    if (rc == -1 && !required) return 0;
    if (rc == -1) return pe__errf(err, errlen, "missing hyper-parameter %s", key);
    if (rc != 0) return pe__errf(err, errlen, "hyper-parameter %s has the wrong type", key);
    return 0;
}

/* Reads the optional f32 hyper-parameter arch.suffix into *out (left at the caller's
 * default when absent) and checks that it is finite and in (lo, hi] (hi INFINITY: above lo):
 * a NaN or infinite epsilon or rope base would load and then turn every logit into NaN
 * (`pagoda run` printed nothing). */
static int get_f32(const pe_gguf_file *f, const char *arch, const char *suffix, float *out,
                   float lo, float hi, char *err, size_t errlen)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = pe_gguf_get_f32(f, key, out);
    if (rc != 0 && rc != -1)
        return pe__errf(err, errlen, "hyper-parameter %s has the wrong type", key);
    if (!isfinite(*out) || !(*out > lo) || !(*out <= hi)) {
        if (isinf(hi))
            return pe__errf(err, errlen, "hyper-parameter %s is %g, expected a finite number > %g",
                            key, (double)*out, (double)lo);
        return pe__errf(err, errlen,
                        "hyper-parameter %s is %g, expected a finite number in (%g, %g]", key,
                        (double)*out, (double)lo, (double)hi);
    }
    return 0;
}

/* Finds a tensor and checks its shape {ne0, ne1} (ne1 == 0: a vector). */
static const pe_gguf_tensor *find_checked(const pe_gguf_file *f, const char *name, uint64_t ne0,
                                          uint64_t ne1, int required, char *err, size_t errlen)
{
    const pe_gguf_tensor *t = pe_gguf_find_tensor(f, name);
    if (!t) {
        if (required) pe__errf(err, errlen, "missing tensor '%s'", name);
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
        pe__errf(err, errlen, "tensor '%s' has shape [%llu, %llu] (%u-d), expected %s", name,
                 (unsigned long long)t->ne[0], (unsigned long long)n1, t->n_dims, want);
        return NULL;
    }
    const pe_ggml_type_traits *tr = pe_ggml_get_traits(t->type);
    if (!tr || !tr->supported) {
        pe__errf(err, errlen,
                 "tensor '%s' has type %s, which the engine does not support "
                 "(supported: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, "
                 "q2_K, q3_K, q4_K, q5_K, q6_K)",
                 name, pe_ggml_type_name(t->type));
        return NULL;
    }
    return t;
}

static int load_mat(const pe_gguf_file *f, const char *name, uint32_t n_in, uint32_t n_out,
                    int required, pe_mat *out, char *err, size_t errlen)
{
    const pe_gguf_tensor *t = find_checked(f, name, n_in, n_out, required, err, errlen);
    memset(out, 0, sizeof *out);
    if (!t) return required ? -1 : (err && err[0] ? -1 : 0);
    out->type = t->type;
    out->n_in = n_in;
    out->n_out = n_out;
    out->data = t->data;
    out->row_bytes = pe_ggml_row_size(t->type, n_in);
    if (!out->row_bytes)
        return pe__errf(err, errlen, "tensor '%s': row of %u values does not fit type %s", name,
                        n_in, pe_ggml_type_name(t->type));
    return 0;
}

/* Loads a norm vector as f32: in place when stored as f32, else converted into *owned. */
static int load_vec(const pe_gguf_file *f, const char *name, uint32_t n, float **owned_cursor,
                    const float **out, char *err, size_t errlen)
{
    const pe_gguf_tensor *t = find_checked(f, name, n, 0, 1, err, errlen);
    if (!t) return -1;
    if (t->type == PE_GGML_TYPE_F32) {
        *out = t->data;
        return 0;
    }
    if (n % pe_ggml_get_traits(t->type)->blck_size)
        return pe__errf(err, errlen, "tensor '%s': length %u does not fit type %s", name, n,
                        pe_ggml_type_name(t->type));
    pe_dequant_row(t->type, t->data, *owned_cursor, n);
    *out = *owned_cursor;
    *owned_cursor += n;
    return 0;
}

/* ---- architectures ---- */

static const char *const arch_names[] = {"llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3"};

static int is_gemma(pe_arch a)
{
    return a == PE_ARCH_GEMMA2 || a == PE_ARCH_GEMMA3;
}

uint32_t pe_hparams_layer_window(const pe_hparams *hp, uint32_t il)
{
    if (!hp->n_swa || hp->swa_period < 2) return 0;
    return il % hp->swa_period < hp->swa_period - 1 ? hp->n_swa : 0;
}

const char *pe_arch_name(pe_arch a)
{
    return (unsigned)a < sizeof arch_names / sizeof arch_names[0] ? arch_names[a] : "?";
}

/* general.architecture -> pe_arch; -1 when the engine does not run it. */
static int parse_arch(pe_gguf_str s, pe_arch *out)
{
    for (size_t i = 0; i < sizeof arch_names / sizeof arch_names[0]; i++)
        if (s.len == strlen(arch_names[i]) && memcmp(s.ptr, arch_names[i], s.len) == 0) {
            *out = (pe_arch)i;
            return 0;
        }
    return -1;
}

/* Rows [first, first + n) of a loaded matrix as a matrix of their own (no copy): phi3's
 * fused attn_qkv and ffn_up. */
static pe_mat mat_rows(const pe_mat *all, uint32_t first, uint32_t n)
{
    pe_mat r = *all;
    r.data = (const uint8_t *)all->data + (size_t)first * all->row_bytes;
    r.n_out = n;
    return r;
}

/* Loads layer l's tensors for hp->arch, each checked by name, type and shape (the error
 * names the first missing or mis-shaped one). */
static int load_layer(const pe_gguf_file *f, const pe_hparams *hp, uint32_t l, pe_layer *L,
                      float **cursor, char *err, size_t errlen)
{
    const uint32_t E = hp->n_embd, Q = hp->n_head * hp->head_dim;
    const uint32_t KV = hp->n_head_kv * hp->head_dim, F = hp->n_ff;
    char nm[96];
#define NAME(s) (snprintf(nm, sizeof nm, "blk.%u." s, l), nm)
    if (load_vec(f, NAME("attn_norm.weight"), E, cursor, &L->attn_norm, err, errlen) ||
        load_vec(f, NAME("ffn_norm.weight"), E, cursor, &L->ffn_norm, err, errlen) ||
        load_mat(f, NAME("attn_output.weight"), Q, E, 1, &L->wo, err, errlen) ||
        load_mat(f, NAME("ffn_down.weight"), F, E, 1, &L->w_down, err, errlen))
        return -1;
    if (hp->arch == PE_ARCH_PHI3) {
        pe_mat qkv, gu;
        if (load_mat(f, NAME("attn_qkv.weight"), E, Q + 2 * KV, 1, &qkv, err, errlen) ||
            load_mat(f, NAME("ffn_up.weight"), E, 2 * F, 1, &gu, err, errlen))
            return -1;
        L->wq = mat_rows(&qkv, 0, Q);
        L->wk = mat_rows(&qkv, Q, KV);
        L->wv = mat_rows(&qkv, Q + KV, KV);
        L->w_gate = mat_rows(&gu, 0, F);
        L->w_up = mat_rows(&gu, F, F);
    } else if (load_mat(f, NAME("attn_q.weight"), E, Q, 1, &L->wq, err, errlen) ||
               load_mat(f, NAME("attn_k.weight"), E, KV, 1, &L->wk, err, errlen) ||
               load_mat(f, NAME("attn_v.weight"), E, KV, 1, &L->wv, err, errlen) ||
               load_mat(f, NAME("ffn_gate.weight"), E, F, 1, &L->w_gate, err, errlen) ||
               load_mat(f, NAME("ffn_up.weight"), E, F, 1, &L->w_up, err, errlen)) {
        return -1;
    }
    if (hp->arch == PE_ARCH_QWEN2 &&
        (load_vec(f, NAME("attn_q.bias"), Q, cursor, &L->bq, err, errlen) ||
         load_vec(f, NAME("attn_k.bias"), KV, cursor, &L->bk, err, errlen) ||
         load_vec(f, NAME("attn_v.bias"), KV, cursor, &L->bv, err, errlen)))
        return -1;
    if ((hp->arch == PE_ARCH_QWEN3 || hp->arch == PE_ARCH_GEMMA3) &&
        (load_vec(f, NAME("attn_q_norm.weight"), hp->head_dim, cursor, &L->q_norm, err, errlen) ||
         load_vec(f, NAME("attn_k_norm.weight"), hp->head_dim, cursor, &L->k_norm, err, errlen)))
        return -1;
    if (is_gemma(hp->arch) &&
        (load_vec(f, NAME("post_attention_norm.weight"), E, cursor, &L->post_attn_norm, err,
                  errlen) ||
         load_vec(f, NAME("post_ffw_norm.weight"), E, cursor, &L->post_ffn_norm, err, errlen)))
        return -1;
#undef NAME
    return 0;
}

const pe_hparams *pe_model_hparams(const pe_model *m)
{
    return &m->hp;
}

const pe_vocab *pe_model_vocab(const pe_model *m)
{
    return m->vocab;
}

const pe_gguf_file *pe_model_gguf(const pe_model *m)
{
    return m->gf;
}

const char *pe_model_name(const pe_model *m)
{
    return m->name;
}

pgd_hash pe_model_fingerprint(const pe_model *m)
{
    return m->fingerprint;
}

uint64_t pe_model_weight_bytes(const pe_model *m)
{
    return m->weight_bytes;
}

/* The product weights of layer L (phi3's views each on its own). */
enum { LAYER_MATS = 7 };
static void layer_mats(pe_layer *L, pe_mat *out[LAYER_MATS])
{
    out[0] = &L->wq, out[1] = &L->wk, out[2] = &L->wv, out[3] = &L->wo;
    out[4] = &L->w_gate, out[5] = &L->w_up, out[6] = &L->w_down;
}

/* Frees the packed copies (pe_mat_unpack): each pe_mat owns its own. */
static void unpack_weights(pe_model *m)
{
    pe_mat *mats[LAYER_MATS];
    for (uint32_t l = 0; m->layers && l < m->hp.n_layer; l++) {
        layer_mats(&m->layers[l], mats);
        for (size_t i = 0; i < LAYER_MATS; i++)
            pe_mat_unpack(mats[i]);
    }
    pe_mat_unpack(&m->output);
}

/* The matrices pack_weights packs, and what became of each (pack_task). */
typedef struct pack_job {
    pe_mat **mats;
    int *rc; /* pe_mat_pack's */
    size_t page;
} pack_job;

/* Packs mats[task] (pe_mat_pack), then releases the file pages of its stored rows from the
 * process (the packer faulted them in). */
static void pack_task(void *ctx, uint32_t task, uint32_t thread)
{
    (void)thread;
    pack_job *j = ctx;
    pe_mat *w = j->mats[task];
    j->rc[task] = pe_mat_pack(w);
    if (j->rc[task] <= 0) return;
    uintptr_t a = ((uintptr_t)w->data + j->page - 1) / j->page * j->page;
    uintptr_t e = ((uintptr_t)w->data + (size_t)w->n_out * w->row_bytes) / j->page * j->page;
    if (e > a) (void)madvise((void *)a, e - a, MADV_DONTNEED);
}

/* Packs every Q8_0 product weight for the x86 kernels (pe_mat_pack: they then read the
 * packed copy at every token count), unless PGD_PACK=0 or the kernels are scalar
 * (pe_mat_pack declines). Each view of phi3's fused
 * tensors is packed on its own (any first row: the packer reads rows from the view's
 * data); token_embd only as a tied output, whose stored rows get_rows keeps reading. Then
 * the file pages of each packed tensor's stored copy are released from the process
 * (MADV_DONTNEED on the page-aligned interior of its rows: the mapping is private and
 * read-only, so they refault from the file if anything reads them again, e.g. get_rows of
 * a tied embedding or the scalar kernels after pe_isa_force), so that RSS
 * holds the packed copy only. The matrices are packed on a pool of every core, one task
 * each. */
static int pack_weights(pe_model *m, char *err, size_t errlen)
{
    const char *env = getenv("PGD_PACK");
    if (env && !strcmp(env, "0")) return 0;
    const size_t n = (size_t)m->hp.n_layer * LAYER_MATS + 1;
    pack_job j = {calloc(n, sizeof *j.mats), calloc(n, sizeof *j.rc),
                  (size_t)sysconf(_SC_PAGESIZE)};
    pe_threadpool *tp = j.mats && j.rc ? pe_tp_create(0) : NULL;
    int rc = tp ? 0 : -1;
    if (tp) {
        for (uint32_t l = 0; l < m->hp.n_layer; l++)
            layer_mats(&m->layers[l], j.mats + (size_t)l * LAYER_MATS);
        j.mats[n - 1] = &m->output;
        pe_tp_run(tp, pack_task, &j, (uint32_t)n);
        pe_tp_destroy(tp);
        for (size_t i = 0; i < n; i++) {
            if (j.rc[i] < 0) rc = -1;
            if (j.rc[i] > 0) m->packed_bytes += pe_mat_packed_bytes(j.mats[i]);
        }
    }
    free(j.mats);
    free(j.rc);
    return rc ? pe__errf(err, errlen, "out of memory packing the weights") : 0;
}

uint64_t pe_model_packed_bytes(const pe_model *m)
{
    return m->packed_bytes;
}

void pe_model_destroy(pe_model *m)
{
    if (!m) return;
    unpack_weights(m);
    pe_vocab_destroy(m->vocab);
    free(m->layers);
    free(m->owned);
    pe_gguf_close(m->gf);
    free(m);
}

/* ---- fingerprint ---- */

/* Tensor data sample: blocks of this many bytes... */
#define FP_BLOCK_BYTES 4096u
/* ...this many per tensor: the first, the last, and 16 evenly spaced between them. */
#define FP_N_BLOCKS 18u

/* Returns the model fingerprint (XXH3-128), which seeds every prefix-cache block hash, so
 * that two models share cached K/V only when the fingerprint says they are the same. It
 * covers, in this order:
 *   1. the file's header bytes [0, data offset) exactly as stored: magic, version, counts,
 *      every metadata key and value in file order (arrays in full, every element, nested
 *      arrays too), the tensor table (names, n_dims, dims, types, offsets) and the
 *      padding before the data section;
 *   2. a sample of every tensor's data, in table order: the whole tensor when it holds at
 *      most FP_N_BLOCKS * FP_BLOCK_BYTES (72 KiB), else FP_N_BLOCKS blocks of 4 KiB at
 *      offsets k * (n_bytes - 4096) / 17 for k = 0..17 (the first and last 4 KiB and 16
 *      evenly spaced blocks between them).
 * Weights that differ only outside the sampled blocks get the same fingerprint: the
 * sample catches a re-quantization or a fine-tune (they change every block), not a
 * single edited weight deep in a large tensor. Cost: the header plus at most 72 KiB per
 * tensor; on a 1B q8_0 model (147 tensors, ~10 MiB sampled) pe_model_load went from 4 to
 * 11 ms, mostly page faults of the sampled blocks.
 * The header is located through the reader's invariant data = file + data offset +
 * offset (gguf.h), taken from the first tensor; a loaded model has at least one. */
static pgd_hash fingerprint(const pe_gguf_file *f)
{
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    uint64_t n = pe_gguf_n_tensors(f);
    if (n) {
        const pe_gguf_tensor *t0 = pe_gguf_tensor_at(f, 0);
        const uint8_t *file = (const uint8_t *)t0->data - t0->offset - pe_gguf_data_offset(f);
        XXH3_128bits_update(&st, file, pe_gguf_data_offset(f));
    }
    for (uint64_t i = 0; i < n; i++) {
        const pe_gguf_tensor *t = pe_gguf_tensor_at(f, i);
        const uint8_t *d = t->data;
        if (t->n_bytes <= (uint64_t)FP_N_BLOCKS * FP_BLOCK_BYTES) {
            XXH3_128bits_update(&st, d, t->n_bytes);
            continue;
        }
        for (uint64_t k = 0; k < FP_N_BLOCKS; k++)
            XXH3_128bits_update(&st, d + k * (t->n_bytes - FP_BLOCK_BYTES) / (FP_N_BLOCKS - 1),
                                FP_BLOCK_BYTES);
    }
    XXH128_hash_t h = XXH3_128bits_digest(&st);
    pgd_hash r = {h.low64, h.high64};
    return r;
}

/* The Gemma hyper-parameters (model.h pe_hparams, "Gemma"), with llama.cpp's defaults for
 * absent keys (src/llama-model.cpp load_hparams): gemma2 window 4096, pattern 2, soft-caps
 * 50 (attention) and 30 (final); gemma3 no window without the key, pattern 6, local rope
 * base 10000 unscaled, no soft-cap unless final_logit_softcapping is there. The attention
 * scale is llama.cpp's f_attention_scale: 1/sqrt(n_embd/n_head) for the 27B shapes (46
 * gemma2 layers, 62 gemma3 layers), else 1/sqrt(head_dim); a file that says
 * attention.query_pre_attn_scalar (HF's name, f32 or integer) gets 1/sqrt of it. */
static int load_gemma(const pe_gguf_file *f, const char *an, const char *path, pe_hparams *hp,
                      char *err, size_t errlen)
{
    const int g2 = hp->arch == PE_ARCH_GEMMA2;
    hp->embd_scale = sqrtf((float)hp->n_embd);
    hp->n_swa = g2 ? 4096 : 0;
    hp->swa_period = g2 ? 2 : 6;
    hp->attn_softcap = g2 ? 50.0f : 0.0f;
    hp->final_softcap = g2 ? 30.0f : 0.0f;
    if (get_u32(f, an, "attention.sliding_window", &hp->n_swa, 0, err, errlen) ||
        get_u32(f, an, "attention.sliding_window_pattern", &hp->swa_period, 0, err, errlen))
        return -1;
    if (!hp->swa_period)
        return pe__errf(err, errlen, "%s: %s.attention.sliding_window_pattern is 0", path, an);
    if (g2 && get_f32(f, an, "attn_logit_softcapping", &hp->attn_softcap, 0, INFINITY, err, errlen))
        return -1;
    char key[128];
    snprintf(key, sizeof key, "%s.final_logit_softcapping", an);
    if (pe_gguf_find_kv(f, key) &&
        get_f32(f, an, "final_logit_softcapping", &hp->final_softcap, 0, INFINITY, err, errlen))
        return -1;
    if (!g2) {
        hp->rope_theta_swa = 10000.0f;
        hp->rope_scale_swa = 1.0f;
        if (get_f32(f, an, "rope.freq_base_swa", &hp->rope_theta_swa, 0, INFINITY, err, errlen))
            return -1;
    }
    const int big = hp->n_layer == (g2 ? 46u : 62u); /* llama.cpp's LLM_TYPE_27B */
    float qpas = big ? (float)(hp->n_embd / hp->n_head) : (float)hp->head_dim;
    uint32_t qpas_u;
    snprintf(key, sizeof key, "%s.attention.query_pre_attn_scalar", an);
    if (pe_gguf_get_u32(f, key, &qpas_u) == 0)
        qpas = (float)qpas_u;
    else if (pe_gguf_find_kv(f, key) &&
             get_f32(f, an, "attention.query_pre_attn_scalar", &qpas, 0, INFINITY, err, errlen))
        return -1;
    if (!(qpas > 0)) return pe__errf(err, errlen, "%s: %s is 0", path, key);
    /* 0 where it is attention's default 1/sqrt(head_dim) */
    hp->attn_scale = qpas == (float)hp->head_dim ? 0.0f : 1.0f / sqrtf(qpas);
    return 0;
}

int pe_model_load(const char *path, pe_progress_fn progress, void *ud, pe_model **out, char *err,
                  size_t errlen)
{
    pe_model *m = calloc(1, sizeof *m);
    char msg[512];
    *out = NULL;
    if (err && errlen) err[0] = '\0';
    if (!m) return pe__errf(err, errlen, "out of memory");
    if (pe_gguf_open(path, &m->gf, msg, sizeof msg) != 0) {
        pe__errf(err, errlen, "%s: %s", path, msg);
        goto fail;
    }
    const pe_gguf_file *f = m->gf;
    pe_gguf_str arch;
    if (pe_gguf_get_str(f, "general.architecture", &arch) != 0) {
        pe__errf(err, errlen, "%s: missing general.architecture", path);
        goto fail;
    }
    if (parse_arch(arch, &m->hp.arch) != 0) {
        pe__errf(err, errlen,
                 "%s: architecture '%.*s' is not supported (supported: llama, qwen2, qwen3, phi3, "
                 "gemma2, gemma3)",
                 path, (int)(arch.len > 64 ? 64 : arch.len), arch.ptr);
        goto fail;
    }
    const char *an = pe_arch_name(m->hp.arch);
    pe_gguf_str name;
    if (pe_gguf_get_str(f, "general.name", &name) == 0)
        snprintf(m->name, sizeof m->name, "%.*s", (int)(name.len > 100 ? 100 : name.len), name.ptr);

    pe_hparams *hp = &m->hp;
    hp->rope_theta = 10000.0f;
    hp->rms_eps = 1e-5f;
    hp->rope_scale = 1.0f;
    if (get_u32(f, an, "context_length", &hp->n_ctx_train, 1, err, errlen) ||
        get_u32(f, an, "embedding_length", &hp->n_embd, 1, err, errlen) ||
        get_u32(f, an, "block_count", &hp->n_layer, 1, err, errlen) ||
        get_u32(f, an, "feed_forward_length", &hp->n_ff, 1, err, errlen) ||
        get_u32(f, an, "attention.head_count", &hp->n_head, 1, err, errlen) ||
        get_f32(f, an, "rope.freq_base", &hp->rope_theta, 0, INFINITY, err, errlen) ||
        get_f32(f, an, "attention.layer_norm_rms_epsilon", &hp->rms_eps, 0, 1, err, errlen))
        goto fail;
    if (!hp->n_ctx_train || hp->n_ctx_train > PE_MAX_CTX_TRAIN) {
        pe__errf(err, errlen, "hyper-parameter %s.context_length %u is out of range [1, %u]", an,
                 hp->n_ctx_train, PE_MAX_CTX_TRAIN);
        goto fail;
    }
    hp->n_head_kv = hp->n_head;
    if (get_u32(f, an, "attention.head_count_kv", &hp->n_head_kv, 0, err, errlen)) goto fail;
    if (!hp->n_embd || !hp->n_layer || !hp->n_head || !hp->n_head_kv || !hp->n_ff ||
        hp->n_embd % hp->n_head || hp->n_head % hp->n_head_kv || hp->n_layer > 4096 ||
        hp->n_embd > (1u << 20) || hp->n_ff > (1u << 22)) {
        pe__errf(err, errlen,
                 "%s: inconsistent hyper-parameters (embedding %u, layers %u, heads %u, kv heads "
                 "%u, ffn %u)",
                 path, hp->n_embd, hp->n_layer, hp->n_head, hp->n_head_kv, hp->n_ff);
        goto fail;
    }
    hp->head_dim = hp->n_embd / hp->n_head;
    if (get_u32(f, an, "attention.key_length", &hp->head_dim, 0, err, errlen)) goto fail;
    hp->n_rot = hp->head_dim;
    if (get_u32(f, an, "rope.dimension_count", &hp->n_rot, 0, err, errlen)) goto fail;
    if (hp->n_rot > hp->head_dim || hp->n_rot % 2 || hp->head_dim > 1024 || !hp->head_dim) {
        pe__errf(err, errlen, "%s: rope.dimension_count %u does not fit head_dim %u", path,
                 hp->n_rot, hp->head_dim);
        goto fail;
    }
    uint32_t v_len = hp->head_dim;
    if (get_u32(f, an, "attention.value_length", &v_len, 0, err, errlen)) goto fail;
    if (v_len != hp->head_dim) {
        pe__errf(err, errlen,
                 "%s: %s.attention.value_length %u differs from key_length %u, which the "
                 "engine does not support",
                 path, an, v_len, hp->head_dim);
        goto fail;
    }
    hp->rope_neox = hp->arch != PE_ARCH_LLAMA;
    pe_gguf_str stype;
    char skey[64];
    snprintf(skey, sizeof skey, "%s.rope.scaling.type", an);
    if (pe_gguf_get_str(f, skey, &stype) == 0 && stype.len == 6 &&
        memcmp(stype.ptr, "linear", 6) == 0) {
        float factor = 1.0f;
        if (get_f32(f, an, "rope.scaling.factor", &factor, 1e-6f, 1e6f, err, errlen)) goto fail;
        hp->rope_scale = 1.0f / factor;
    } else if (pe_gguf_find_kv(f, skey)) {
        /* Linear scaling or none; another type (yarn, longrope, ...) would run with the
         * wrong positions and frequencies, so it is refused, naming it. (llama3's scaling
         * is its rope_freqs tensor, not this key.) */
        if (pe_gguf_get_str(f, skey, &stype) != 0) {
            pe__errf(err, errlen, "%s: hyper-parameter %s has the wrong type", path, skey);
            goto fail;
        }
        if (!pe_gguf_str_eq(stype, "none")) {
            pe__errf(err, errlen, "%s: %s '%.*s' is not supported (supported: linear, none)", path,
                     skey, (int)(stype.len > 32 ? 32 : stype.len), stype.ptr);
            goto fail;
        }
    }
    uint32_t n_expert = 0;
    if (get_u32(f, an, "expert_count", &n_expert, 0, err, errlen)) goto fail;
    if (n_expert > 0) {
        pe__errf(err, errlen, "%s: %s.expert_count %u: mixture-of-experts models are not supported",
                 path, an, n_expert);
        goto fail;
    }
    hp->embd_scale = 1.0f;
    hp->swa_period = 1;
    hp->rope_theta_swa = hp->rope_theta;
    hp->rope_scale_swa = hp->rope_scale;
    if (is_gemma(hp->arch) && load_gemma(f, an, path, hp, err, errlen)) goto fail;

    if (pe_vocab_load(f, &m->vocab, msg, sizeof msg) != 0) {
        pe__errf(err, errlen, "%s: tokenizer: %s", path, msg);
        goto fail;
    }
    hp->n_vocab = pe_vocab_n_tokens(m->vocab);

    const uint32_t E = hp->n_embd, Q = hp->n_head * hp->head_dim;
    const uint32_t KV = hp->n_head_kv * hp->head_dim;
    m->layers = calloc(hp->n_layer, sizeof *m->layers);
    /* Room for every vector converted to f32: per layer four norms (gemma's post-norms),
     * and the biases and Q/K norms of the architectures that have them; plus output_norm. */
    m->owned =
        malloc(((size_t)hp->n_layer * (4 * E + Q + 2 * KV + 2 * hp->head_dim) + E) * sizeof(float));
    if (!m->layers || !m->owned) {
        pe__errf(err, errlen, "out of memory");
        goto fail;
    }
    float *cursor = m->owned;
    if (load_mat(f, "token_embd.weight", E, hp->n_vocab, 1, &m->tok_embd, err, errlen) ||
        load_vec(f, "output_norm.weight", E, &cursor, &m->output_norm, err, errlen) ||
        load_mat(f, "output.weight", E, hp->n_vocab, 0, &m->output, err, errlen))
        goto fail;
    if (!m->output.data) m->output = m->tok_embd; /* tied */
    const pe_gguf_tensor *rf = pe_gguf_find_tensor(f, "rope_freqs.weight");
    if (rf) {
        if (rf->type != PE_GGML_TYPE_F32 || rf->ne[0] != hp->n_rot / 2) {
            pe__errf(err, errlen, "tensor 'rope_freqs.weight' must be f32 [%u]", hp->n_rot / 2);
            goto fail;
        }
        m->rope_freqs = rf->data;
    }
    if (hp->arch == PE_ARCH_PHI3 && (pe_gguf_find_tensor(f, "rope_factors_long.weight") ||
                                     pe_gguf_find_tensor(f, "rope_factors_short.weight"))) {
        pe__errf(err, errlen,
                 "%s: phi3 LongRoPE (tensors rope_factors_long/short.weight) is not supported",
                 path);
        goto fail;
    }
    if (hp->arch == PE_ARCH_GEMMA3) {
        /* A Gemma 3 file with its vision tower (v.*) or projector (mm.*) in it: the engine
         * runs the text model only (llama.cpp takes those from a separate mmproj file). */
        for (uint64_t i = 0; i < pe_gguf_n_tensors(f); i++) {
            pe_gguf_str tn = pe_gguf_tensor_at(f, i)->name;
            if ((tn.len > 2 && memcmp(tn.ptr, "v.", 2) == 0) ||
                (tn.len > 3 && memcmp(tn.ptr, "mm.", 3) == 0)) {
                pe__errf(err, errlen,
                         "%s: gemma3 vision tower tensors (tensor '%.*s') are not supported: "
                         "the engine runs the text model only",
                         path, (int)(tn.len > 64 ? 64 : tn.len), tn.ptr);
                goto fail;
            }
        }
    }
    for (uint32_t l = 0; l < hp->n_layer; l++)
        if (load_layer(f, hp, l, &m->layers[l], &cursor, err, errlen)) goto fail;
    for (uint64_t i = 0; i < pe_gguf_n_tensors(f); i++)
        m->weight_bytes += pe_gguf_tensor_at(f, i)->n_bytes;
    /* Touch the weights once, so that the first token does not pay for page faults, and
     * so that a large model shows progress while it comes off the disk. */
    if (progress) {
        uint64_t total = m->weight_bytes, done = 0;
        volatile uint8_t sink = 0;
        for (uint64_t i = 0; i < pe_gguf_n_tensors(f); i++) {
            const pe_gguf_tensor *t = pe_gguf_tensor_at(f, i);
            const uint8_t *p = t->data;
            for (uint64_t o = 0; o < t->n_bytes; o += 4096)
                sink ^= p[o];
            done += t->n_bytes;
            progress(ud, done, total);
        }
        (void)sink;
    }
    m->fingerprint = fingerprint(f);
    if (pack_weights(m, err, errlen)) goto fail;
    *out = m;
    return 0;
fail:
    pe_model_destroy(m);
    return -1;
}
