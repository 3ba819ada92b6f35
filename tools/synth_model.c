/* SPDX-License-Identifier: MIT */
/*
 * synth_model.c - `pagoda synth-model`: writes a valid GGUF of the llama (default), qwen2,
 * qwen3, phi3, gemma2 or gemma3 architecture (--arch) with random weights of a realistic
 * shape, for tests and benchmarks (nothing is downloaded).
 *
 * Tensor names, shapes (ne[0] is the input dimension) and metadata keys are the ones
 * llama.cpp's converters write, as in ../shared/models/reference/models/tiny-<arch>-f16:
 *   llama  separate output.weight; <arch>.vocab_size and rope.dimension_count
 *   qwen2  Q/K/V biases (f32), tied output (no output.weight), eps 1e-6, rope base 1e6
 *   qwen3  per-head attn_q_norm / attn_k_norm, attention.key_length / value_length, tied
 *          output, eps 1e-6, rope base 1e6
 *   phi3   fused attn_qkv (Q rows, then K, then V) and fused ffn_up (gate rows, then up),
 *          no ffn_gate, separate output.weight, rope.dimension_count and
 *          rope.scaling.original_context_length (= the context), rope base 10000
 *   gemma2 post_attention_norm / post_ffw_norm, tied output, attention.key_length /
 *          value_length, attn_logit_softcapping 50 and final_logit_softcapping 30 (Gemma 2's),
 *          attention.sliding_window = the context / 16 (so that a test's context reaches past
 *          the window of the local layers), eps 1e-6, rope base 10000
 *   gemma3 gemma2's tensors plus attn_q_norm / attn_k_norm, no soft-caps, rope base 1e6 with
 *          rope.scaling.type linear, factor 8 and rope.freq_base_swa 10000 (Gemma 3's), the
 *          same window, attention.sliding_window_pattern 6 (Gemma 3's 5 local : 1 global),
 *          or 2 below 6 layers so that a small model has a global layer
 * The llama file is what synth-model wrote before --arch existed, byte for byte. Weights are
 * deterministic from --seed and independent of the thread count: each row has its own generator,
 * seeded from (seed, tensor, row). Values are normal-ish (a sum of four uniforms) with std
 * 1/sqrt(n_in), so activations keep their scale through the layers (the two projections back into
 * the residual stream are scaled down by a further 1/sqrt(2 * n_layers)); norm weights are 1 +-
 * 0.02.
 *
 * The 2-D weights take --type, converted by the engine's own pe_quant_row (ggml's reference
 * quantizers without an importance matrix, so the bytes are llama-quantize's for the same
 * values); norms and biases are f32. A plain type (f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1
 * iq4_nl q3_k q4_k q5_k q6_k) is every matrix's, as `llama-quantize --pure` writes it; q2_k,
 * q3_k_m, q4_k_s, q4_k_m and q5_k_m are llama.cpp's mixes, with the per-tensor rules of its
 * llama_tensor_get_type (src/llama-quant.cpp) for the tensors synth-model writes:
 *   output.weight (token_embd.weight when tied): Q6_K (Q8_0 if its rows do not fit 256)
 *   attn_v    q2_k: Q4_K if heads / kv_heads >= 4, else Q3_K; q3_k_m: Q5_K in layers 0-1,
 *             else Q4_K; q4_k_m, q5_k_m: Q6_K in the "use_more_bits" layers (the first and
 *             last eighth, and every third between); q4_k_s: Q5_K in layers 0-3
 *   ffn_down  q2_k: Q3_K; q3_k_m: Q5_K in the first sixteenth, else Q4_K; q4_k_m, q5_k_m:
 *             Q6_K in the use_more_bits layers; q4_k_s: Q5_K in the first eighth
 *   attn_output  q2_k: Q3_K; q3_k_m: Q4_K
 *   attn_qkv  q3_k_m: Q4_K; q4_k_m: Q5_K; q5_k_m: Q6_K
 * general.file_type is llama.cpp's value for the type (the mix's, or for a plain K type the
 * ftype `llama-quantize --pure` writes: q3_k 11 Q3_K_S, q4_k 14 Q4_K_S, q5_k 16 Q5_K_S).
 * A matrix whose rows are not a multiple of its type's block falls back as llama-quantize
 * does (Q2_K/Q3_K to IQ4_NL, Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0), then to f16 (q8_0 and
 * q4_0 straight to f16), with a note.
 * Data is produced in pieces of at most 64 MiB (pe_gguf_writer_write_chunks), the rows of a
 * piece spread over all cores, so multi-GB models never sit in memory.
 *
 * Vocabulary: with --vocab, every tokenizer.* key of that GGUF is copied and its token
 * count is the vocabulary size; without, a minimal SentencePiece-style vocabulary is
 * generated: <unk> <s> </s>, the 256 byte tokens <0x00>..<0xFF>, then "▁a", "a", "▁b", ...
 */
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cli.h"
#include "gguf.h"
#include "ops.h"

/* A --type: the type of the 2-D weights, or one of llama.cpp's mixes (MIX_*), and its
 * general.file_type (llama.cpp's enum llama_ftype). */
enum { MIX_NONE, MIX_Q2_K, MIX_Q3_K_M, MIX_Q4_K_S, MIX_Q4_K_M, MIX_Q5_K_M };

typedef struct wtype_desc {
    const char *name;
    uint32_t type; /* the base type */
    uint32_t ftype;
    int mix;
} wtype_desc;

static const wtype_desc wtypes[] = {
    {"f32", PE_GGML_TYPE_F32, 0, MIX_NONE},        {"f16", PE_GGML_TYPE_F16, 1, MIX_NONE},
    {"bf16", PE_GGML_TYPE_BF16, 32, MIX_NONE},     {"q8_0", PE_GGML_TYPE_Q8_0, 7, MIX_NONE},
    {"q4_0", PE_GGML_TYPE_Q4_0, 2, MIX_NONE},      {"q4_1", PE_GGML_TYPE_Q4_1, 3, MIX_NONE},
    {"q5_0", PE_GGML_TYPE_Q5_0, 8, MIX_NONE},      {"q5_1", PE_GGML_TYPE_Q5_1, 9, MIX_NONE},
    {"iq4_nl", PE_GGML_TYPE_IQ4_NL, 25, MIX_NONE}, {"q3_k", PE_GGML_TYPE_Q3_K, 11, MIX_NONE},
    {"q4_k", PE_GGML_TYPE_Q4_K, 14, MIX_NONE},     {"q5_k", PE_GGML_TYPE_Q5_K, 16, MIX_NONE},
    {"q6_k", PE_GGML_TYPE_Q6_K, 18, MIX_NONE},     {"q2_k", PE_GGML_TYPE_Q2_K, 10, MIX_Q2_K},
    {"q3_k_m", PE_GGML_TYPE_Q3_K, 12, MIX_Q3_K_M}, {"q4_k_s", PE_GGML_TYPE_Q4_K, 14, MIX_Q4_K_S},
    {"q4_k_m", PE_GGML_TYPE_Q4_K, 15, MIX_Q4_K_M}, {"q5_k_m", PE_GGML_TYPE_Q5_K, 17, MIX_Q5_K_M},
};

#define WTYPE_NAMES                                                                                \
    "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, q3_k, q4_k, q5_k, q6_k, q2_k, "         \
    "q3_k_m, q4_k_s, q4_k_m, q5_k_m"

#define MAX_THREADS 64

/* An architecture: general.architecture, what its layers and keys hold. */
typedef struct arch_desc {
    const char *name;
    int qkv_bias; /* attn_q/k/v.bias */
    int qk_norm;  /* attn_q_norm / attn_k_norm and key_length / value_length */
    int fused;    /* attn_qkv and gate+up ffn_up */
    int tied;     /* no output.weight */
    int llama_kv; /* vocab_size and rope.dimension_count keys */
    float eps;    /* attention.layer_norm_rms_epsilon */
    float rope;   /* rope.freq_base; 0: the shape's */
    int gemma;    /* 2 or 3: Gemma's post-norms, key_length / value_length, window keys;
                     gemma2's soft-caps, gemma3's rope keys (see the header) */
} arch_desc;

static const arch_desc archs[] = {
    {"llama", 0, 0, 0, 0, 1, 1e-5f, 0.0f, 0},      {"qwen2", 1, 0, 0, 1, 0, 1e-6f, 1e6f, 0},
    {"qwen3", 0, 1, 0, 1, 0, 1e-6f, 1e6f, 0},      {"phi3", 0, 0, 1, 0, 0, 1e-5f, 10000.0f, 0},
    {"gemma2", 0, 0, 0, 1, 0, 1e-6f, 10000.0f, 2}, {"gemma3", 0, 1, 0, 1, 0, 1e-6f, 1e6f, 3},
};

typedef struct shape {
    const char *name;
    uint64_t dim, layers, heads, kv_heads, ffn, vocab, ctx;
    float rope_base;
} shape;

static const shape shapes[] = {
    {"tiny", 64, 2, 4, 2, 172, 512, 512, 10000.0f},
    {"small", 512, 8, 8, 4, 1536, 32000, 2048, 10000.0f},
    {"1b", 2048, 16, 32, 8, 8192, 32000, 4096, 500000.0f},
};

static void usage(FILE *f, const char *cmd)
{
    fprintf(f,
            "usage: %s [--arch A] [--shape tiny|small|1b] [--type T] -o FILE [options]\n"
            "\n"
            "Writes a GGUF model with random weights (deterministic from --seed) of a\n"
            "realistic shape, for tests and benchmarks.\n"
            "\n"
            "shapes:  tiny   dim 64, 2 layers, 4 heads, 2 KV heads, ffn 172, vocab 512, ctx 512\n"
            "         small  dim 512, 8 layers, 8 heads, 4 KV heads, ffn 1536, vocab 32000,\n"
            "                ctx 2048\n"
            "         1b     dim 2048, 16 layers, 32 heads, 8 KV heads, ffn 8192, vocab 32000,\n"
            "                ctx 4096, rope base 500000\n"
            "\n"
            "options:\n"
            "  --arch A            llama (default), qwen2 (Q/K/V biases, tied output),\n"
            "                      qwen3 (Q/K norms, tied output), phi3 (fused QKV and\n"
            "                      gate+up), gemma2 (post-norms, soft-caps, sliding window:\n"
            "                      the context / 16, tied output) or gemma3 (gemma2's with\n"
            "                      Q/K norms, local rope base, no soft-caps), with the\n"
            "                      tensors and keys llama.cpp writes\n"
            "  --shape NAME        tiny (default), small or 1b\n"
            "  --type T            type of the 2-D weights: f32, f16 (default), bf16, q8_0,\n"
            "                      q4_0, q4_1, q5_0, q5_1, iq4_nl, q3_k, q4_k, q5_k, q6_k\n"
            "                      (every matrix), or llama.cpp's mixes q2_k, q3_k_m,\n"
            "                      q4_k_s, q4_k_m, q5_k_m (its per-tensor rules); a matrix\n"
            "                      whose rows do not fit the type's block falls back as\n"
            "                      llama-quantize does, then to f16; norms are f32\n"
            "  -o, --output FILE   the GGUF file to write (via FILE.tmp, then renamed)\n"
            "  --vocab FILE        copy the tokenizer.* keys of this GGUF; its token count is\n"
            "                      the vocabulary size (default: a generated SentencePiece-\n"
            "                      style vocabulary of --vocab-size tokens)\n"
            "  --seed N            random seed (default 1)\n"
            "  --dim N, --layers N, --heads N, --kv-heads N, --ffn N, --vocab-size N, --ctx N\n"
            "                      override a dimension of the shape\n"
            "  --threads N         threads generating weights (default: all cores)\n"
            "  -h, --help          show this help\n",
            cmd);
}

/* ---- random numbers ---- */

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Fills x[n] with normal-ish values of mean `mean` and std `std`: the sum of the four
 * 16-bit parts of one xorshift64* draw (Irwin-Hall, n = 4) is close enough to a normal
 * for weights, and costs one multiply per value. */
static void gen_row(uint64_t state, float *x, uint64_t n, float mean, float std)
{
    const float scale = std / 37837.23f; /* std of a sum of four U{0..65535} */
    uint64_t s = state ? state : 1;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t r;
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        r = s * 2685821657736338717ull;
        int32_t sum = (int32_t)(r & 0xffff) + (int32_t)((r >> 16) & 0xffff) +
                      (int32_t)((r >> 32) & 0xffff) + (int32_t)(r >> 48) - 131070;
        x[i] = mean + (float)sum * scale;
    }
}

/* ---- the model description ---- */

typedef struct tdesc {
    char name[64];
    uint32_t type;
    uint32_t n_dims;
    uint64_t ne[2];
    float mean, std;
} tdesc;

typedef struct synth {
    uint64_t seed;
    tdesc *t;
    uint64_t n_t;
    uint32_t n_threads;
    /* progress */
    uint64_t total_bytes, done_bytes;
    int progress; /* 0 none, 1 tty (\r updates), 2 log lines every 10% */
    int last_pct;
    const char *path;
} synth;

typedef struct job {
    const synth *s;
    uint64_t ti;
    uint64_t row0, n_rows; /* rows of this job */
    uint8_t *dst;          /* the first row's bytes */
    uint64_t row_bytes;
    int failed;
} job;

static void *run_job(void *arg)
{
    job *j = arg;
    const tdesc *t = &j->s->t[j->ti];
    float *x = malloc(t->ne[0] * sizeof *x);
    if (!x) {
        j->failed = 1;
        return NULL;
    }
    for (uint64_t r = 0; r < j->n_rows; r++) {
        uint64_t row = j->row0 + r;
        uint64_t st = splitmix64(j->s->seed ^ splitmix64((j->ti << 32) ^ row));
        gen_row(st, x, t->ne[0], t->mean, t->std);
        pe_quant_row(t->type, x, j->dst + r * j->row_bytes, t->ne[0]);
    }
    free(x);
    return NULL;
}

static void show_progress(synth *s, int done)
{
    int pct = s->total_bytes ? (int)(s->done_bytes * 100 / s->total_bytes) : 100;
    if (!s->progress) return;
    if (s->progress == 1 && (pct != s->last_pct || done)) {
        fprintf(stderr, "\rwriting %s: %3d%% (%llu / %llu MiB)", s->path, pct,
                (unsigned long long)(s->done_bytes >> 20),
                (unsigned long long)(s->total_bytes >> 20));
        if (done) fputc('\n', stderr);
    } else if (s->progress == 2 && pct / 10 != s->last_pct / 10) {
        fprintf(stderr, "writing %s: %d%%\n", s->path, pct / 10 * 10);
    }
    s->last_pct = pct;
}

static int fill(void *ud, uint64_t ti, uint64_t offset, void *dst, uint64_t n_bytes)
{
    synth *s = ud;
    const tdesc *t = &s->t[ti];
    uint64_t row_bytes = pe_ggml_row_size(t->type, t->ne[0]);
    uint64_t row0 = offset / row_bytes, n_rows = n_bytes / row_bytes;
    uint32_t n_jobs = s->n_threads;
    pthread_t th[MAX_THREADS];
    job jobs[MAX_THREADS];
    int started[MAX_THREADS] = {0}, failed = 0;

    if (n_rows * t->ne[0] < (1u << 16)) n_jobs = 1; /* not worth a thread */
    if (n_jobs > n_rows) n_jobs = (uint32_t)n_rows;
    for (uint32_t k = 0; k < n_jobs; k++) {
        uint64_t a = n_rows * k / n_jobs, b = n_rows * (k + 1) / n_jobs;
        jobs[k] = (job){s, ti, row0 + a, b - a, (uint8_t *)dst + a * row_bytes, row_bytes, 0};
    }
    for (uint32_t k = 1; k < n_jobs; k++) {
        started[k] = pthread_create(&th[k], NULL, run_job, &jobs[k]) == 0;
        if (!started[k]) run_job(&jobs[k]);
    }
    run_job(&jobs[0]);
    for (uint32_t k = 0; k < n_jobs; k++) {
        if (k > 0 && started[k]) pthread_join(th[k], NULL);
        failed |= jobs[k].failed;
    }
    if (failed) return -1;
    s->done_bytes += n_bytes;
    show_progress(s, 0);
    return 0;
}

/* ---- vocabulary ---- */

/* Writes the generated SentencePiece-style vocabulary of n tokens (n >= 260). */
static int gen_vocab(pe_gguf_writer *w, uint64_t n)
{
    static const char letters[] = "abcdefghijklmnopqrstuvwxyz";
    static const char sp[] = "\xe2\x96\x81"; /* U+2581, SentencePiece's space */
    pe_gguf_str *strs = malloc(n * sizeof *strs);
    float *scores = malloc(n * sizeof *scores);
    int32_t *types = malloc(n * sizeof *types);
    char *arena = malloc(n * 16);
    uint64_t i, used = 0;
    int rc = -1;

    if (!strs || !scores || !types || !arena) goto out;
    for (i = 0; i < n; i++) {
        char *p = arena + used;
        int len;
        if (i < 3) {
            static const char *const special[3] = {"<unk>", "<s>", "</s>"};
            len = snprintf(p, 16, "%s", special[i]);
            types[i] = i == 0 ? 2 : 3; /* UNKNOWN, CONTROL */
            scores[i] = 0.0f;
        } else if (i < 259) {
            len = snprintf(p, 16, "<0x%02X>", (unsigned)(i - 3));
            types[i] = 6; /* BYTE */
            scores[i] = 0.0f;
        } else if (i == 259) {
            len = snprintf(p, 16, "%s", sp);
            types[i] = 1; /* NORMAL */
            scores[i] = -1.0f;
        } else {
            /* Words over a..z by length (a, b, .., z, aa, ab, ..), each with and without
             * the space prefix: "▁a", "a", "▁b", "b", ... */
            uint64_t k = (i - 260) / 2, base = 26, w_len = 1;
            char buf[8];
            while (k >= base) {
                k -= base;
                base *= 26;
                w_len++;
            }
            for (uint64_t c = 0; c < w_len; c++) {
                buf[w_len - 1 - c] = letters[k % 26];
                k /= 26;
            }
            buf[w_len] = '\0';
            len = snprintf(p, 16, "%s%s", (i - 260) % 2 == 0 ? sp : "", buf);
            types[i] = 1;
            scores[i] = -(float)(i - 258);
        }
        strs[i].ptr = p;
        strs[i].len = (uint64_t)len;
        used += (uint64_t)len;
    }
    if (pe_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama") != 0 ||
        pe_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", strs, n) != 0 ||
        pe_gguf_writer_set_arr(w, "tokenizer.ggml.scores", PE_GGUF_TYPE_FLOAT32, scores, n) != 0 ||
        pe_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", PE_GGUF_TYPE_INT32, types, n) != 0 ||
        pe_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1) != 0 ||
        pe_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2) != 0 ||
        pe_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0) != 0 ||
        pe_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", 1) != 0 ||
        pe_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", 0) != 0) {
        goto out;
    }
    rc = 0;
out:
    free(strs);
    free(scores);
    free(types);
    free(arena);
    return rc;
}

/* Copies the tokenizer.* keys of the GGUF at path; sets *n_vocab. Returns 0, or -1 after
 * printing why. */
static int copy_vocab(const char *cmd, pe_gguf_writer *w, const char *path, uint64_t *n_vocab)
{
    char err[512];
    pe_gguf_file *f;
    const pe_gguf_kv *tokens;
    if (pe_gguf_open(path, &f, err, sizeof err) != 0) {
        fprintf(stderr, "%s: --vocab %s: %s\n", cmd, path, err);
        return -1;
    }
    if (pe_gguf_get_arr(f, "tokenizer.ggml.tokens", PE_GGUF_TYPE_STRING, &tokens) != 0 ||
        tokens->n == 0) {
        fprintf(stderr, "%s: --vocab %s: no tokenizer.ggml.tokens string array\n", cmd, path);
        pe_gguf_close(f);
        return -1;
    }
    *n_vocab = tokens->n;
    for (uint64_t i = 0; i < pe_gguf_n_kv(f); i++) {
        const pe_gguf_kv *kv = pe_gguf_kv_at(f, i);
        if (kv->key.len < 10 || memcmp(kv->key.ptr, "tokenizer.", 10) != 0) continue;
        if (pe_gguf_writer_copy_kv(w, kv) != 0) {
            fprintf(stderr, "%s: out of memory\n", cmd);
            pe_gguf_close(f);
            return -1;
        }
    }
    pe_gguf_close(f);
    return 0;
}

/* ---- the command ---- */

enum { N_SEED, N_DIM, N_LAYERS, N_HEADS, N_KV_HEADS, N_FFN, N_VOCAB, N_CTX, N_THREADS, N_COUNT };
enum { OPT_NUM = 256, OPT_SHAPE = OPT_NUM + N_COUNT, OPT_TYPE, OPT_VOCAB, OPT_ARCH };

static void add_tensor(tdesc *t, uint64_t *n, const char *name, uint32_t type, uint32_t n_dims,
                       uint64_t ne0, uint64_t ne1, float mean, float std)
{
    tdesc *d = &t[*n];
    snprintf(d->name, sizeof d->name, "%s", name);
    d->type = type;
    d->n_dims = n_dims;
    d->ne[0] = ne0;
    d->ne[1] = ne1;
    d->mean = mean;
    d->std = std;
    (*n)++;
}

/* <arch>.suffix = v (u32) or f32. */
static int set_arch_u32(pe_gguf_writer *w, const arch_desc *a, const char *suffix, uint64_t v)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", a->name, suffix);
    return pe_gguf_writer_set_u32(w, key, (uint32_t)v);
}

static int set_arch_f32(pe_gguf_writer *w, const arch_desc *a, const char *suffix, float v)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", a->name, suffix);
    return pe_gguf_writer_set_f32(w, key, v);
}

static int set_arch_str(pe_gguf_writer *w, const arch_desc *a, const char *suffix, const char *v)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", a->name, suffix);
    return pe_gguf_writer_set_str(w, key, v);
}

/* llama.cpp's use_more_bits: the first and last eighth of the layers and every third between. */
static int use_more_bits(uint64_t i, uint64_t n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

/* The type a mix gives tensor `name` (2-D), i its index among the tensors of its kind
 * (attn_v, ffn_down) out of n (llama_tensor_get_type, for the tensors written here). */
static uint32_t mix_type(const wtype_desc *wt, const char *name, int is_output, uint64_t i,
                         uint64_t n, uint64_t n_gqa)
{
    const int mix = wt->mix;
    if (is_output) return PE_GGML_TYPE_Q6_K;
    if (strstr(name, "attn_v.weight")) {
        if (mix == MIX_Q2_K) return n_gqa >= 4 ? PE_GGML_TYPE_Q4_K : PE_GGML_TYPE_Q3_K;
        if (mix == MIX_Q3_K_M) return i < 2 ? PE_GGML_TYPE_Q5_K : PE_GGML_TYPE_Q4_K;
        if ((mix == MIX_Q4_K_M || mix == MIX_Q5_K_M) && use_more_bits(i, n))
            return PE_GGML_TYPE_Q6_K;
        if (mix == MIX_Q4_K_S && i < 4) return PE_GGML_TYPE_Q5_K;
    } else if (strstr(name, "ffn_down")) {
        if (mix == MIX_Q2_K) return PE_GGML_TYPE_Q3_K;
        if (mix == MIX_Q3_K_M) return i < n / 16 ? PE_GGML_TYPE_Q5_K : PE_GGML_TYPE_Q4_K;
        if ((mix == MIX_Q4_K_M || mix == MIX_Q5_K_M) && use_more_bits(i, n))
            return PE_GGML_TYPE_Q6_K;
        if (mix == MIX_Q4_K_S && i < n / 8) return PE_GGML_TYPE_Q5_K;
    } else if (strstr(name, "attn_output.weight")) {
        if (mix == MIX_Q2_K) return PE_GGML_TYPE_Q3_K;
        if (mix == MIX_Q3_K_M) return PE_GGML_TYPE_Q4_K;
    } else if (strstr(name, "attn_qkv.weight")) {
        if (mix == MIX_Q3_K_M) return PE_GGML_TYPE_Q4_K;
        if (mix == MIX_Q4_K_M) return PE_GGML_TYPE_Q5_K;
        if (mix == MIX_Q5_K_M) return PE_GGML_TYPE_Q6_K;
    }
    return wt->type;
}

/* The type of a tensor whose rows do not fit type's block: llama-quantize's fallback for the
 * K-quants (convert_incompatible_tensor), f16 for the others and when that does not fit
 * either. */
static uint32_t fallback_type(uint32_t type, uint64_t n_in)
{
    uint32_t f = type == PE_GGML_TYPE_Q2_K || type == PE_GGML_TYPE_Q3_K ? PE_GGML_TYPE_IQ4_NL
                 : type == PE_GGML_TYPE_Q4_K                            ? PE_GGML_TYPE_Q5_0
                 : type == PE_GGML_TYPE_Q5_K                            ? PE_GGML_TYPE_Q5_1
                 : type == PE_GGML_TYPE_Q6_K                            ? PE_GGML_TYPE_Q8_0
                                                                        : PE_GGML_TYPE_F16;
    return n_in % pe_ggml_get_traits(f)->blck_size == 0 ? f : PE_GGML_TYPE_F16;
}

/* Sets the type of every 2-D tensor of t (added with the base type): the mix's rule, then the
 * fallback where rows do not fit the block, noted once per tensor kind (ffn_down or other) and
 * type. */
static void assign_types(const char *cmd, const wtype_desc *wt, tdesc *t, uint64_t n_t, int tied,
                         uint64_t n_layers, uint64_t n_gqa)
{
    uint64_t i_v = 0, i_down = 0;
    uint8_t noted[2][PE_GGML_TYPE_COUNT] = {{0}};
    for (uint64_t k = 0; k < n_t; k++) {
        tdesc *d = &t[k];
        if (d->n_dims != 2) continue;
        const int is_down = strstr(d->name, "ffn_down") != NULL;
        const int is_out = strcmp(d->name, "output.weight") == 0 ||
                           (tied && strcmp(d->name, "token_embd.weight") == 0);
        uint32_t type = wt->type;
        if (wt->mix != MIX_NONE) {
            const int is_v = strstr(d->name, "attn_v.weight") != NULL;
            type = mix_type(wt, d->name, is_out, is_v ? i_v : i_down, n_layers, n_gqa);
            if (is_out && d->ne[0] % QK_K != 0) type = PE_GGML_TYPE_Q8_0;
            i_v += is_v;
            i_down += is_down;
        }
        const pe_ggml_type_traits *tr = pe_ggml_get_traits(type);
        if (d->ne[0] % tr->blck_size != 0) {
            const uint32_t f = fallback_type(type, d->ne[0]);
            if (!noted[is_down][type]) {
                fprintf(stderr,
                        "%s: note: %s rows of %llu values are not a multiple of the %s block "
                        "(%u): written as %s\n",
                        cmd, is_down ? "ffn_down.weight" : "matrix", (unsigned long long)d->ne[0],
                        tr->name, tr->blck_size, pe_ggml_type_name(f));
                noted[is_down][type] = 1;
            }
            type = f;
        }
        d->type = type;
    }
}

int cmd_synth_model(int argc, char **argv)
{
    static const struct option opts[] = {
        {"arch", required_argument, NULL, OPT_ARCH},
        {"shape", required_argument, NULL, OPT_SHAPE},
        {"type", required_argument, NULL, OPT_TYPE},
        {"output", required_argument, NULL, 'o'},
        {"vocab", required_argument, NULL, OPT_VOCAB},
        {"seed", required_argument, NULL, OPT_NUM + N_SEED},
        {"dim", required_argument, NULL, OPT_NUM + N_DIM},
        {"layers", required_argument, NULL, OPT_NUM + N_LAYERS},
        {"heads", required_argument, NULL, OPT_NUM + N_HEADS},
        {"kv-heads", required_argument, NULL, OPT_NUM + N_KV_HEADS},
        {"ffn", required_argument, NULL, OPT_NUM + N_FFN},
        {"vocab-size", required_argument, NULL, OPT_NUM + N_VOCAB},
        {"ctx", required_argument, NULL, OPT_NUM + N_CTX},
        {"threads", required_argument, NULL, OPT_NUM + N_THREADS},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    static const struct {
        const char *name;
        uint64_t min, max;
    } lim[N_COUNT] = {
        [N_SEED] = {"--seed", 0, UINT64_MAX},        [N_DIM] = {"--dim", 2, 1u << 16},
        [N_LAYERS] = {"--layers", 1, 1024},          [N_HEADS] = {"--heads", 1, 1024},
        [N_KV_HEADS] = {"--kv-heads", 1, 1024},      [N_FFN] = {"--ffn", 1, 1u << 18},
        [N_VOCAB] = {"--vocab-size", 260, 1u << 22}, [N_CTX] = {"--ctx", 1, 1u << 24},
        [N_THREADS] = {"--threads", 1, MAX_THREADS},
    };
    const char *cmd = argv[0], *out_path = NULL, *vocab_path = NULL, *shape_name = "tiny";
    const char *type_name = "f16", *arch_name = "llama";
    const arch_desc *ar = NULL;
    uint64_t val[N_COUNT] = {0};
    int given[N_COUNT] = {0};
    const shape *sh = NULL;
    shape s;
    const wtype_desc *wt = NULL;
    uint32_t hd;
    uint64_t n_vocab, n_t = 0;
    synth syn;
    tdesc *t = NULL;
    pe_gguf_writer *w = NULL;
    char err[512], name[160];
    int opt, rc = CLI_EXIT_FAIL;
    long nproc;
    double t0;

    optind = 0; /* glibc: full re-initialisation */
    for (;;) {
        opt = getopt_long(argc, argv, "ho:", opts, NULL);
        if (opt == -1) break;
        if (opt >= OPT_NUM && opt < OPT_NUM + N_COUNT) {
            int k = opt - OPT_NUM;
            if (cli_parse_u64(cmd, lim[k].name, optarg, lim[k].min, lim[k].max, &val[k]) != 0) {
                return cli_usage_error(cmd);
            }
            given[k] = 1;
            continue;
        }
        switch (opt) {
        case OPT_ARCH:
            arch_name = optarg;
            break;
        case OPT_SHAPE:
            shape_name = optarg;
            break;
        case OPT_TYPE:
            type_name = optarg;
            break;
        case OPT_VOCAB:
            vocab_path = optarg;
            break;
        case 'o':
            out_path = optarg;
            break;
        case 'h':
            usage(stdout, cmd);
            return CLI_EXIT_OK;
        default:
            return cli_usage_error(cmd);
        }
    }
    if (optind < argc) return cli_unexpected_arg(cmd, argv[optind]);
    if (!out_path) {
        fprintf(stderr, "%s: -o FILE is required\n", cmd);
        return cli_usage_error(cmd);
    }
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        if (strcmp(shapes[i].name, shape_name) == 0) sh = &shapes[i];
    }
    if (!sh) {
        fprintf(stderr, "%s: --shape: '%s' is not one of tiny, small, 1b\n", cmd, shape_name);
        return cli_usage_error(cmd);
    }
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++) {
        if (strcmp(archs[i].name, arch_name) == 0) ar = &archs[i];
    }
    if (!ar) {
        fprintf(stderr,
                "%s: --arch: '%s' is not one of llama, qwen2, qwen3, phi3, gemma2, gemma3\n", cmd,
                arch_name);
        return cli_usage_error(cmd);
    }
    for (size_t i = 0; i < sizeof wtypes / sizeof wtypes[0]; i++) {
        if (strcasecmp(wtypes[i].name, type_name) == 0) wt = &wtypes[i];
    }
    if (!wt) {
        fprintf(stderr, "%s: --type: '%s' is not one of " WTYPE_NAMES "\n", cmd, type_name);
        return cli_usage_error(cmd);
    }
    s = *sh;
    if (given[N_DIM]) s.dim = val[N_DIM];
    if (given[N_LAYERS]) s.layers = val[N_LAYERS];
    if (given[N_HEADS]) s.heads = val[N_HEADS];
    if (given[N_KV_HEADS]) s.kv_heads = val[N_KV_HEADS];
    if (given[N_FFN]) s.ffn = val[N_FFN];
    if (given[N_VOCAB]) s.vocab = val[N_VOCAB];
    if (given[N_CTX]) s.ctx = val[N_CTX];
    if (!given[N_SEED]) val[N_SEED] = 1;
    if (s.dim % s.heads != 0 || (s.dim / s.heads) % 2 != 0) {
        fprintf(stderr, "%s: dim %llu must be a multiple of 2 x heads (%llu)\n", cmd,
                (unsigned long long)s.dim, (unsigned long long)s.heads);
        return cli_usage_error(cmd);
    }
    if (s.kv_heads > s.heads || s.heads % s.kv_heads != 0) {
        fprintf(stderr, "%s: heads %llu must be a multiple of kv-heads %llu\n", cmd,
                (unsigned long long)s.heads, (unsigned long long)s.kv_heads);
        return cli_usage_error(cmd);
    }
    hd = (uint32_t)(s.dim / s.heads);
    w = pe_gguf_writer_create(3, 0);
    if (!w) goto oom;
    n_vocab = s.vocab;
    if (vocab_path) {
        if (copy_vocab(cmd, w, vocab_path, &n_vocab) != 0) goto out;
        if (given[N_VOCAB] && n_vocab != s.vocab) {
            fprintf(stderr, "%s: --vocab-size %llu differs from the %llu tokens of %s\n", cmd,
                    (unsigned long long)s.vocab, (unsigned long long)n_vocab, vocab_path);
            rc = CLI_EXIT_USAGE;
            goto out;
        }
        s.vocab = n_vocab;
    }
    {
        int custom = 0;
        for (int k = N_DIM; k <= N_CTX; k++)
            custom |= given[k];
        snprintf(name, sizeof name, "pagoda synthetic %s%s%s%s (random weights)",
                 ar == &archs[0] ? "" : ar->name, ar == &archs[0] ? "" : " ", s.name,
                 custom ? " custom" : "");
    }
    if (ar->rope > 0) s.rope_base = ar->rope;
    if (pe_gguf_writer_set_str(w, "general.architecture", ar->name) != 0 ||
        pe_gguf_writer_set_str(w, "general.name", name) != 0 ||
        pe_gguf_writer_set_u32(w, "general.file_type", wt->ftype) != 0 ||
        pe_gguf_writer_set_u32(w, "general.quantization_version", 2) != 0 ||
        set_arch_u32(w, ar, "context_length", s.ctx) != 0 ||
        set_arch_u32(w, ar, "embedding_length", s.dim) != 0 ||
        set_arch_u32(w, ar, "block_count", s.layers) != 0 ||
        set_arch_u32(w, ar, "feed_forward_length", s.ffn) != 0 ||
        set_arch_u32(w, ar, "attention.head_count", s.heads) != 0 ||
        set_arch_u32(w, ar, "attention.head_count_kv", s.kv_heads) != 0 ||
        set_arch_f32(w, ar, "rope.freq_base", s.rope_base) != 0 ||
        set_arch_f32(w, ar, "attention.layer_norm_rms_epsilon", ar->eps) != 0 ||
        (ar->llama_kv && (set_arch_u32(w, ar, "rope.dimension_count", hd) != 0 ||
                          set_arch_u32(w, ar, "vocab_size", s.vocab) != 0)) ||
        ((ar->qk_norm || ar->gemma) && (set_arch_u32(w, ar, "attention.key_length", hd) != 0 ||
                                        set_arch_u32(w, ar, "attention.value_length", hd) != 0)) ||
        (ar->gemma &&
         set_arch_u32(w, ar, "attention.sliding_window", s.ctx >= 32 ? s.ctx / 16 : 2) != 0) ||
        (ar->gemma == 2 && (set_arch_f32(w, ar, "attn_logit_softcapping", 50.0f) != 0 ||
                            set_arch_f32(w, ar, "final_logit_softcapping", 30.0f) != 0)) ||
        (ar->gemma == 3 &&
         (set_arch_str(w, ar, "rope.scaling.type", "linear") != 0 ||
          set_arch_f32(w, ar, "rope.scaling.factor", 8.0f) != 0 ||
          set_arch_f32(w, ar, "rope.freq_base_swa", 10000.0f) != 0 ||
          set_arch_u32(w, ar, "attention.sliding_window_pattern", s.layers >= 6 ? 6 : 2) != 0)) ||
        (ar->fused && (set_arch_u32(w, ar, "rope.dimension_count", hd) != 0 ||
                       set_arch_u32(w, ar, "rope.scaling.original_context_length", s.ctx) != 0))) {
        goto oom;
    }
    if (!vocab_path && gen_vocab(w, s.vocab) != 0) goto oom;

    /* Tensors, in the order llama.cpp's converters write them. */
    t = calloc(3 + 16 * s.layers, sizeof *t);
    if (!t) goto oom;
    {
        const float sd = 1.0f / sqrtf((float)s.dim), sf = 1.0f / sqrtf((float)s.ffn);
        const float res = 1.0f / sqrtf(2.0f * (float)s.layers); /* residual branches */
        const uint64_t kv_dim = s.kv_heads * hd;
        const uint32_t mt = wt->type, mt_down = wt->type; /* assign_types() decides */
        add_tensor(t, &n_t, "token_embd.weight", mt, 2, s.dim, s.vocab, 0.0f, 1.0f);
        add_tensor(t, &n_t, "output_norm.weight", PE_GGML_TYPE_F32, 1, s.dim, 1, 1.0f, 0.02f);
        if (!ar->tied) add_tensor(t, &n_t, "output.weight", mt, 2, s.dim, s.vocab, 0.0f, sd);
        for (uint64_t l = 0; l < s.layers; l++) {
            char tn[64];
#define LAYER_TENSOR(part, type, n_dims, ne0, ne1, mean, std)                                      \
    do {                                                                                           \
        snprintf(tn, sizeof tn, "blk.%llu.%s", (unsigned long long)l, part);                       \
        add_tensor(t, &n_t, tn, type, n_dims, ne0, ne1, mean, std);                                \
    } while (0)
            LAYER_TENSOR("attn_norm.weight", PE_GGML_TYPE_F32, 1, s.dim, 1, 1.0f, 0.02f);
            if (ar->fused) {
                LAYER_TENSOR("attn_qkv.weight", mt, 2, s.dim, s.dim + 2 * kv_dim, 0.0f, sd);
            } else {
                LAYER_TENSOR("attn_q.weight", mt, 2, s.dim, s.dim, 0.0f, sd);
                LAYER_TENSOR("attn_k.weight", mt, 2, s.dim, kv_dim, 0.0f, sd);
                LAYER_TENSOR("attn_v.weight", mt, 2, s.dim, kv_dim, 0.0f, sd);
            }
            if (ar->qkv_bias) {
                LAYER_TENSOR("attn_q.bias", PE_GGML_TYPE_F32, 1, s.dim, 1, 0.0f, 0.02f);
                LAYER_TENSOR("attn_k.bias", PE_GGML_TYPE_F32, 1, kv_dim, 1, 0.0f, 0.02f);
                LAYER_TENSOR("attn_v.bias", PE_GGML_TYPE_F32, 1, kv_dim, 1, 0.0f, 0.02f);
            }
            if (ar->qk_norm) {
                LAYER_TENSOR("attn_q_norm.weight", PE_GGML_TYPE_F32, 1, hd, 1, 1.0f, 0.02f);
                LAYER_TENSOR("attn_k_norm.weight", PE_GGML_TYPE_F32, 1, hd, 1, 1.0f, 0.02f);
            }
            LAYER_TENSOR("attn_output.weight", mt, 2, s.dim, s.dim, 0.0f, sd * res);
            if (ar->gemma)
                LAYER_TENSOR("post_attention_norm.weight", PE_GGML_TYPE_F32, 1, s.dim, 1, 1.0f,
                             0.02f);
            LAYER_TENSOR("ffn_norm.weight", PE_GGML_TYPE_F32, 1, s.dim, 1, 1.0f, 0.02f);
            if (!ar->fused) LAYER_TENSOR("ffn_gate.weight", mt, 2, s.dim, s.ffn, 0.0f, sd);
            LAYER_TENSOR("ffn_down.weight", mt_down, 2, s.ffn, s.dim, 0.0f, sf * res);
            LAYER_TENSOR("ffn_up.weight", mt, 2, s.dim, ar->fused ? 2 * s.ffn : s.ffn, 0.0f, sd);
            if (ar->gemma)
                LAYER_TENSOR("post_ffw_norm.weight", PE_GGML_TYPE_F32, 1, s.dim, 1, 1.0f, 0.02f);
#undef LAYER_TENSOR
        }
    }
    assign_types(cmd, wt, t, n_t, ar->tied, s.layers, s.heads / s.kv_heads);
    for (uint64_t i = 0; i < n_t; i++) {
        if (pe_gguf_writer_add_tensor(w, t[i].name, t[i].type, t[i].n_dims, t[i].ne) != 0) {
            fprintf(stderr, "%s: cannot add tensor '%s'\n", cmd, t[i].name);
            goto out;
        }
    }

    nproc = sysconf(_SC_NPROCESSORS_ONLN);
    memset(&syn, 0, sizeof syn);
    syn.seed = val[N_SEED];
    syn.t = t;
    syn.n_t = n_t;
    syn.n_threads = given[N_THREADS]      ? (uint32_t)val[N_THREADS]
                    : nproc < 1           ? 1
                    : nproc > MAX_THREADS ? MAX_THREADS
                                          : (uint32_t)nproc;
    syn.total_bytes = pe_gguf_writer_data_bytes(w);
    syn.progress = isatty(STDERR_FILENO) ? 1 : syn.total_bytes > (100u << 20) ? 2 : 0;
    syn.last_pct = -1;
    syn.path = out_path;
    t0 = cli_now_s();
    if (pe_gguf_writer_write_chunks(w, out_path, fill, &syn, err, sizeof err) != 0) {
        if (syn.progress == 1) fputc('\n', stderr);
        fprintf(stderr, "%s: %s\n", cmd, err);
        goto out;
    }
    show_progress(&syn, 1);
    {
        uint64_t n_params = 0, n_bytes = 0;
        for (uint64_t i = 0; i < n_t; i++) {
            n_params += t[i].ne[0] * t[i].ne[1];
            n_bytes += pe_ggml_row_size(t[i].type, t[i].ne[0]) * t[i].ne[1];
        }
        printf("wrote %s: %s %s, %s weights, dim %llu, %llu layers, %llu/%llu heads, ffn %llu, "
               "vocab %llu, ctx %llu: %llu params, %llu tensor bytes in %.2f s\n",
               out_path, ar->name, s.name, wt->name, (unsigned long long)s.dim,
               (unsigned long long)s.layers, (unsigned long long)s.heads,
               (unsigned long long)s.kv_heads, (unsigned long long)s.ffn,
               (unsigned long long)s.vocab, (unsigned long long)s.ctx, (unsigned long long)n_params,
               (unsigned long long)n_bytes, cli_now_s() - t0);
    }
    rc = CLI_EXIT_OK;
    goto out;
oom:
    fprintf(stderr, "%s: out of memory\n", cmd);
out:
    pe_gguf_writer_destroy(w);
    free(t);
    return rc;
}
