/* SPDX-License-Identifier: MIT */
/*
 * test_arch_ref.c - the architectures of model.h (llama, qwen2, qwen3, phi3, gemma2, gemma3)
 * against
 * llama.cpp on the reference set (../shared/models/reference/README.md: small random-weight
 * F16 models made with llama.cpp's tools, and llama.cpp's outputs on them):
 *   - `pagoda eval -c 128 -b 128 --kv-type f16` (the real binary; llama.cpp's F16 cache)
 *     gives each model's perplexity on text/stories-dev.txt within 0.2% of
 *     llama-perplexity's (perplexity.stderr.txt, -c 128);
 *   - the same on gemma copies with one feature changed, against llama.cpp's perplexity of
 *     the same change (the README's ablation table): each soft-cap off, other windows, the
 *     sliding_window_pattern key removed (llama.cpp's default 6 makes both layers local),
 *     gemma3's local rope base and its rope scaling; each moves the perplexity by 0.3-4%,
 *     so each is checked on its own;
 *   - greedy decoding through the engine (pe_forward, f16 KV as llama-server keeps it)
 *     from both prompts' token ids, with each of the engine's attention paths (paged,
 *     --attn-ref's scalar reference, the contiguous reference), gives llama-server's first
 *     16 generated ids
 *     (server-completion.json); where a later id differs, the step and both candidates'
 *     logits are printed (a near tie decided by rounding order, not a bug: see below);
 *   - copies missing a tensor of an architecture (qwen2's biases, qwen3's Q/K norms, phi3's
 *     fused attn_qkv, gemma's post-norms and gemma3's Q/K norms) or with one mis-shaped, with
 *     a value_length other than key_length, a rope scaling type other than linear / none
 *     (gemma), a vision tower tensor (gemma3) or a zero sliding_window_pattern, are refused
 *     with an error naming it.
 * The greedy ids depend on rounding near ties: qwen3, prompt 1, step 3 has ',' and '.'
 * 0.002 nats apart in llama.cpp; the engine gets llama.cpp's pick since it rounds the input
 * of f16 products to f16 as ggml does (forward.c act_for); measured: all 32 ids equal for
 * every model and prompt, the test requires the first 16.
 * argv[1]: the pagoda binary; argv[2]: a scratch directory. The reference folder is
 * $PGD_REFERENCE_DIR, else ../shared/models/reference beside the source tree; without it
 * the program exits 77 (skipped) with a message.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "model.h"
#include "proc.h"
#include "t.h"

#define N_GREEDY 16 /* generated ids that must equal llama.cpp's */

static const char *bin, *dir;
static char ref[1024];
static char out[1 << 16], err[1 << 14];

/* The models checked, with llama.cpp's final perplexity (perplexity.stderr.txt, -c 128). */
static const struct {
    const char *stem;
    double ppl;
} models[] = {
    {"tiny-llama-f16", 54.9259},  {"tiny-llama3-f16", 57.2468}, {"tiny-qwen2-f16", 54.3245},
    {"tiny-qwen3-f16", 55.8881},  {"tiny-phi3-f16", 61.8928},   {"tiny-gemma2-f16", 35.5719},
    {"tiny-gemma3-f16", 46.4950},
};

static void model_file(char *buf, size_t n, const char *stem, const char *name)
{
    snprintf(buf, n, "%s/models/%s/%s", ref, stem, name);
}

/* `pagoda eval` of the GGUF at gguf (label: what it is) against llama.cpp's perplexity. */
static int test_ppl_file(const char *label, const char *gguf, double want)
{
    char text[1200], args[4096];
    json_error_t je;
    snprintf(text, sizeof text, "%s/../text/stories-dev.txt", ref);
    snprintf(args, sizeof args, "eval -m '%s' -f '%s' -c 128 -b 128 --kv-type f16 -t 2 --json",
             gguf, text);
    T_EQ(t_run_bin(bin, dir, args, out, sizeof out, err, sizeof err), 0);
    json_t *o = json_loads(out, 0, &je);
    if (!o) T_FAIL("%s: eval --json: not JSON (%s): %s", label, je.text, out);
    double ppl = json_number_value(json_object_get(o, "ppl"));
    json_decref(o);
    double rel = fabs(ppl - want) / want;
    printf("%-18s ppl %.4f, llama.cpp %.4f, diff %+.4f%%\n", label, ppl, want,
           100.0 * (ppl - want) / want);
    if (!(rel <= 0.002))
        T_FAIL("%s: ppl %.4f, llama.cpp %.4f (more than 0.2%% apart)", label, ppl, want);
    return 0;
}

static int test_ppl(const char *stem, double want)
{
    char gguf[1200];
    model_file(gguf, sizeof gguf, stem, "");
    snprintf(gguf + strlen(gguf), sizeof gguf - strlen(gguf), "%s.gguf", stem);
    return test_ppl_file(stem, gguf, want);
}

/* The engine's three attention paths (forward.c): each greedy run goes through all. */
static const char *const attn_modes[] = {"paged", "attn-ref", "contiguous"};
enum { N_MODES = 3 };

/* Greedy ids from prompt ids (f16 KV) with attention mode (attn_modes): n ids into gen;
 * logits of every step into lg. */
static int greedy(pe_model *m, int mode, const int32_t *prompt, uint32_t n_prompt, int32_t *gen,
                  uint32_t n, float *lg)
{
    char e[256];
    pe_ctx_params p = pe_ctx_default_params();
    p.n_ctx = 512;
    p.n_threads = 2;
    p.attn_ref = mode == 1;
    p.contiguous_ref = mode == 2;
    pe_ctx *c;
    if (pe_ctx_create(m, &p, &c, e, sizeof e)) T_FAIL("pe_ctx_create: %s", e);
    pgd_seq *s;
    T_OK(pgd_seq_create(pe_ctx_cache(c), NULL, 0, &s));
    const uint32_t V = pe_model_hparams(m)->n_vocab;
    int rc = pe_forward(c, s, prompt, n_prompt, lg, 0);
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        const float *l = lg + (size_t)i * V;
        int32_t best = 0;
        for (uint32_t v = 1; v < V; v++)
            if (l[v] > l[best]) best = (int32_t)v;
        gen[i] = best;
        if (i + 1 < n) rc = pe_forward(c, s, &gen[i], 1, lg + (size_t)(i + 1) * V, 0);
    }
    pgd_seq_destroy(pe_ctx_cache(c), s);
    pe_ctx_destroy(c);
    T_EQ(rc, 0);
    return 0;
}

static int test_greedy(const char *stem)
{
    char path[1200], e[256];
    json_error_t je;
    model_file(path, sizeof path, stem, "server-completion.json");
    json_t *doc = json_load_file(path, 0, &je);
    if (!doc) T_FAIL("%s: %s", path, je.text);
    model_file(path, sizeof path, stem, "");
    snprintf(path + strlen(path), sizeof path - strlen(path), "%s.gguf", stem);
    pe_model *m;
    if (pe_model_load(path, NULL, NULL, &m, e, sizeof e)) {
        json_decref(doc);
        T_FAIL("%s: %s", stem, e);
    }
    const uint32_t V = pe_model_hparams(m)->n_vocab;
    json_t *results = json_object_get(doc, "results");
    int fails = 0;
    for (size_t r = 0; r < json_array_size(results); r++) {
        json_t *res = json_array_get(results, r);
        json_t *pt = json_object_get(res, "prompt_tokens"), *gt = json_object_get(res, "tokens");
        uint32_t np = (uint32_t)json_array_size(pt), ng = (uint32_t)json_array_size(gt);
        int32_t prompt[64], want[64], gen[64];
        if (!np || np > 64 || ng < N_GREEDY || ng > 64) {
            fails++;
            fprintf(stderr, "%s: bad server-completion.json result %zu\n", stem, r);
            continue;
        }
        for (uint32_t i = 0; i < np; i++)
            prompt[i] = (int32_t)json_integer_value(json_array_get(pt, i));
        for (uint32_t i = 0; i < ng; i++)
            want[i] = (int32_t)json_integer_value(json_array_get(gt, i));
        float *lg = malloc((size_t)ng * V * sizeof *lg);
        for (int mode = 0; lg && mode < N_MODES; mode++) {
            if (greedy(m, mode, prompt, np, gen, ng, lg) < 0) {
                fails++;
                continue;
            }
            uint32_t same = 0;
            while (same < ng && gen[same] == want[same])
                same++;
            printf("%-18s prompt %zu, %-10s: %u of %u greedy ids equal llama.cpp's", stem, r + 1,
                   attn_modes[mode], same, ng);
            if (same < ng) {
                const float *l = lg + (size_t)same * V;
                printf(" (step %u: ours %d logit %.5f, llama.cpp's %d logit %.5f)", same, gen[same],
                       (double)l[gen[same]], want[same], (double)l[want[same]]);
            }
            printf("\n");
            if (same < N_GREEDY) {
                fails++;
                fprintf(stderr, "%s prompt %zu (%s): greedy id %u is %d, llama.cpp %d\n", stem,
                        r + 1, attn_modes[mode], same, gen[same], want[same]);
            }
        }
        fails += !lg;
        free(lg);
    }
    pe_model_destroy(m);
    json_decref(doc);
    T_EQ(fails, 0);
    return 0;
}

/* ---- load errors ---- */

typedef struct variant {
    const pe_gguf_file *src;
    uint64_t map[256]; /* the written tensor i is the source's map[i] */
} variant;

/* What a copy changes (NULL / 0 fields: nothing). */
typedef struct edit {
    const char *drop, *resize; /* tensor left out; tensor whose ne1 (a vector: ne0) is n */
    uint64_t n;
    const char *key; /* a u32 key set to kval */
    uint32_t kval;
    const char *fkey; /* an f32 key set to fval */
    float fval;
    const char *skey, *sval; /* a string key set to sval */
    const char *del;         /* keys with this prefix left out */
    const char *extra;       /* a tensor added, a copy of output_norm.weight */
} edit;

static int fill_tensor(void *ud, uint64_t i, void *dst, uint64_t n_bytes)
{
    const variant *v = ud;
    const pe_gguf_tensor *t = pe_gguf_tensor_at(v->src, v->map[i]);
    if (n_bytes > t->n_bytes) return -1;
    memcpy(dst, t->data, n_bytes); /* a shrunk tensor: its first bytes */
    return 0;
}

/* Writes the reference model stem to out_path with the changes of ed. */
static int write_variant(const char *stem, const char *out_path, const edit *ed)
{
    char path[1200], e[256], name[256];
    model_file(path, sizeof path, stem, "");
    snprintf(path + strlen(path), sizeof path - strlen(path), "%s.gguf", stem);
    variant v;
    pe_gguf_file *f;
    if (pe_gguf_open(path, &f, e, sizeof e)) T_FAIL("%s: %s", path, e);
    v.src = f;
    pe_gguf_writer *w = pe_gguf_writer_create(3, 0);
    T_ASSERT(w);
    for (uint64_t i = 0; i < pe_gguf_n_kv(f); i++) {
        const pe_gguf_kv *kv = pe_gguf_kv_at(f, i);
        if (pe_gguf_str_eq(kv->key, "general.alignment")) continue;
        if (ed->del && kv->key.len >= strlen(ed->del) &&
            memcmp(kv->key.ptr, ed->del, strlen(ed->del)) == 0)
            continue;
        T_EQ(pe_gguf_writer_copy_kv(w, kv), 0);
    }
    if (ed->key) T_EQ(pe_gguf_writer_set_u32(w, ed->key, ed->kval), 0);
    if (ed->fkey) T_EQ(pe_gguf_writer_set_f32(w, ed->fkey, ed->fval), 0);
    if (ed->skey) T_EQ(pe_gguf_writer_set_str(w, ed->skey, ed->sval), 0);
    uint64_t k = 0;
    for (uint64_t i = 0; i < pe_gguf_n_tensors(f) && k < 255; i++) {
        const pe_gguf_tensor *t = pe_gguf_tensor_at(f, i);
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        if (ed->drop && strcmp(name, ed->drop) == 0) continue;
        uint64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
        if (ed->resize && strcmp(name, ed->resize) == 0) ne[t->n_dims >= 2 ? 1 : 0] = ed->n;
        T_EQ(pe_gguf_writer_add_tensor(w, name, t->type, t->n_dims, ne), 0);
        v.map[k++] = i;
        if (ed->extra && strcmp(name, "output_norm.weight") == 0) {
            T_EQ(pe_gguf_writer_add_tensor(w, ed->extra, t->type, t->n_dims, ne), 0);
            v.map[k++] = i;
        }
    }
    int rc = pe_gguf_writer_write(w, out_path, fill_tensor, &v, e, sizeof e);
    pe_gguf_writer_destroy(w);
    pe_gguf_close(f);
    if (rc) T_FAIL("write %s: %s", out_path, e);
    return 0;
}

/* Each architecture's tensors are checked: a missing or mis-shaped one, or a value_length
 * the engine does not support, is refused with an error naming it. */
static int test_load_errors(void)
{
    static const struct {
        const char *stem;
        edit ed;
        const char *want;
    } cases[] = {
        {"tiny-qwen2-f16", {.drop = "blk.1.attn_v.bias"}, "missing tensor 'blk.1.attn_v.bias'"},
        {"tiny-qwen2-f16",
         {.resize = "blk.0.attn_q.bias", .n = 128},
         "tensor 'blk.0.attn_q.bias' has shape [128, 1] (1-d), expected [256]"},
        {"tiny-qwen3-f16",
         {.drop = "blk.0.attn_q_norm.weight"},
         "missing tensor 'blk.0.attn_q_norm.weight'"},
        {"tiny-qwen3-f16",
         {.resize = "blk.1.attn_k_norm.weight", .n = 32},
         "tensor 'blk.1.attn_k_norm.weight' has shape [32, 1] (1-d), expected [64]"},
        {"tiny-qwen3-f16",
         {.key = "qwen3.attention.value_length", .kval = 32},
         "qwen3.attention.value_length 32 differs from key_length 64"},
        {"tiny-phi3-f16",
         {.drop = "blk.0.attn_qkv.weight"},
         "missing tensor 'blk.0.attn_qkv.weight'"},
        {"tiny-phi3-f16",
         {.resize = "blk.1.attn_qkv.weight", .n = 384},
         "tensor 'blk.1.attn_qkv.weight' has shape [256, 384] (2-d), expected [256, 512]"},
        {"tiny-phi3-f16",
         {.resize = "blk.0.ffn_up.weight", .n = 512},
         "tensor 'blk.0.ffn_up.weight' has shape [256, 512] (2-d), expected [256, 1024]"},
        {"tiny-gemma2-f16",
         {.drop = "blk.1.post_ffw_norm.weight"},
         "missing tensor 'blk.1.post_ffw_norm.weight'"},
        {"tiny-gemma2-f16",
         {.resize = "blk.0.post_attention_norm.weight", .n = 128},
         "tensor 'blk.0.post_attention_norm.weight' has shape [128, 1] (1-d), expected [256]"},
        {"tiny-gemma2-f16",
         {.key = "gemma2.attention.sliding_window_pattern", .kval = 0},
         "gemma2.attention.sliding_window_pattern is 0"},
        {"tiny-gemma3-f16",
         {.drop = "blk.1.attn_k_norm.weight"},
         "missing tensor 'blk.1.attn_k_norm.weight'"},
        {"tiny-gemma3-f16",
         {.drop = "blk.0.post_attention_norm.weight"},
         "missing tensor 'blk.0.post_attention_norm.weight'"},
        {"tiny-gemma3-f16",
         {.skey = "gemma3.rope.scaling.type", .sval = "yarn"},
         "gemma3.rope.scaling.type 'yarn' is not supported (supported: linear, none)"},
        {"tiny-gemma3-f16",
         {.extra = "v.patch_embd.weight"},
         "gemma3 vision tower tensors (tensor 'v.patch_embd.weight') are not supported"},
        {"tiny-gemma3-f16",
         {.extra = "mm.input_projection.weight"},
         "gemma3 vision tower tensors (tensor 'mm.input_projection.weight') are not supported"},
    };
    char path[1200], e[512];
    snprintf(path, sizeof path, "%s/variant.gguf", dir);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        T_OK(write_variant(cases[i].stem, path, &cases[i].ed));
        pe_model *m = NULL;
        e[0] = '\0';
        if (pe_model_load(path, NULL, NULL, &m, e, sizeof e) == 0) {
            pe_model_destroy(m);
            T_FAIL("case %zu (%s): loaded, expected \"%s\"", i, cases[i].stem, cases[i].want);
        }
        if (!strstr(e, cases[i].want))
            T_FAIL("case %zu (%s): error '%s' does not say \"%s\"", i, cases[i].stem, e,
                   cases[i].want);
        printf("     refused: %s\n", e);
    }
    /* the unchanged copies load: the writer, not the check, is what the cases vary */
    static const edit none;
    static const char *const plain[] = {"tiny-phi3-f16", "tiny-gemma2-f16", "tiny-gemma3-f16"};
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) {
        T_OK(write_variant(plain[i], path, &none));
        pe_model *m = NULL;
        if (pe_model_load(path, NULL, NULL, &m, e, sizeof e)) T_FAIL("plain copy: %s", e);
        pe_model_destroy(m);
    }
    return 0;
}

/* Gemma copies with one feature changed, against llama.cpp on the same change (README,
 * "Feature ablations": llama-perplexity on a patched copy, -c 128). */
static int test_gemma_ablations(void)
{
    static const struct {
        const char *stem, *what;
        edit ed;
        double ppl;
    } cases[] = {
        {"tiny-gemma2-f16",
         "attn soft-cap off",
         {.fkey = "gemma2.attn_logit_softcapping", .fval = 1e9f},
         35.8545},
        {"tiny-gemma2-f16",
         "final soft-cap off",
         {.fkey = "gemma2.final_logit_softcapping", .fval = 1e9f},
         36.9806},
        {"tiny-gemma2-f16",
         "window 4096",
         {.key = "gemma2.attention.sliding_window", .kval = 4096},
         34.8435},
        {"tiny-gemma3-f16",
         "no window pattern",
         {.del = "gemma3.attention.sliding_window_pattern"},
         46.2887},
        {"tiny-gemma3-f16",
         "window 4096",
         {.key = "gemma3.attention.sliding_window", .kval = 4096},
         48.1967},
        {"tiny-gemma3-f16",
         "local base 1e6",
         {.fkey = "gemma3.rope.freq_base_swa", .fval = 1e6f},
         46.4005},
        {"tiny-gemma3-f16", "no rope scaling", {.del = "gemma3.rope.scaling."}, 47.3816},
    };
    char path[1200], label[128];
    int fails = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(path, sizeof path, "%s/ablation-%zu.gguf", dir, i);
        T_OK(write_variant(cases[i].stem, path, &cases[i].ed));
        snprintf(label, sizeof label, "%s, %s", cases[i].stem + 5, cases[i].what);
        fails += test_ppl_file(label, path, cases[i].ppl) != 0;
    }
    T_EQ(fails, 0);
    return 0;
}

int main(int argc, char **argv)
{
    int rc = t_cli_args(argc, argv, NULL, &bin, &dir);
    if (rc) return rc;
    const char *env = getenv("PGD_REFERENCE_DIR");
    snprintf(ref, sizeof ref, "%s",
             env && *env ? env : PGD_SOURCE_DIR "/../shared/models/reference");
    char probe[1200];
    snprintf(probe, sizeof probe, "%s/README.md", ref);
    if (!t_is_file(probe)) {
        fprintf(stderr, "test_arch_ref: no reference set at %s (set PGD_REFERENCE_DIR): skipped\n",
                ref);
        return 77;
    }
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        const char *stem = models[i].stem;
        t_run += 2;
        if (test_ppl(stem, models[i].ppl) != 0) {
            t_failed++;
            fprintf(stderr, "FAIL test_ppl %s\n", stem);
        }
        if (test_greedy(stem) != 0) {
            t_failed++;
            fprintf(stderr, "FAIL test_greedy %s\n", stem);
        }
    }
    T_RUN(test_load_errors);
    T_RUN(test_gemma_ablations);
    T_DONE();
}
