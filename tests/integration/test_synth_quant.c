/* SPDX-License-Identifier: MIT */
/*
 * test_synth_quant.c - `pagoda synth-model --type` with the weight types and llama.cpp mixes of
 * issue 15 (tools/synth_model.c), run as the real binary (argv[1]) in a scratch directory
 * (argv[2]); a sibling of test_synth_arch.c.
 *
 * Checks:
 *   - a q4_k_m and a q6_k file of the reference models' dimensions (dim 256, ffn 512, 2 layers,
 *     4/2 heads) load and run: `pagoda run -n 8` generates 8 tokens, `pagoda eval` gives a
 *     finite perplexity, and `pagoda inspect --json` shows each tensor's type as the mix
 *     gives it (q4_k_m: Q6_K for output.weight and for layer 1's attn_v and ffn_down, Q4_K for
 *     the other matrices, f32 norms) and counts them by type;
 *   - the mix rules where they depend on the shape: 8 layers put q4_k_m's Q6_K attn_v and
 *     ffn_down in the use_more_bits layers 0, 3, 6, 7; q2_k gives attn_v Q4_K with 8 heads on 2
 *     KV heads (GQA 4) and Q3_K with GQA 2; rows of 64 values (the tiny shape) fall back as
 *     llama-quantize does (Q4_K to Q5_0, the Q6_K output to Q8_0) and rows of 172 to f16;
 *   - every --type is accepted, an unknown one exits 2 naming it;
 *   - with ../shared/models/reference ($PGD_REFERENCE_DIR overrides): for every llama-quantize'd
 *     tiny-llama-<type> file, a synth-model file of the same dimensions and --type has the same
 *     general.file_type, and, for the mixes (q2_k q3_k_m q4_k_s q4_k_m q5_k_m) and the types
 *     whose llama.cpp ftype is one type throughout (q6_k, q8_0), every tensor of the same type.
 *     Without the folder that part is left out and the program exits 77 once the rest passed.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "gguf.h"
#include "proc.h"
#include "t.h"

static const char *bin, *dir;
static char refdir[1024];
static char out[1 << 18], err[1 << 16];

#define REF_DIMS "--dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 512 --vocab-size 512 --ctx 512"

static int run(const char *args)
{
    return t_run_bin(bin, dir, args, out, sizeof out, err, sizeof err);
}

/* Writes dir/<stem>.gguf with synth-model --type type and extra options. */
static int synth(const char *stem, const char *type, const char *opts, char *path, size_t n)
{
    char args[4096];
    snprintf(path, n, "%s/%s.gguf", dir, stem);
    snprintf(args, sizeof args, "synth-model --type %s %s --seed 5 -o '%s'", type, opts, path);
    if (run(args) != 0) {
        fprintf(stderr, "synth-model --type %s %s: %s\n", type, opts, err);
        return -1;
    }
    return 0;
}

/* The type (ggml's name, e.g. "q4_K") of tensor name in file path, into buf; "" if absent. */
static const char *tensor_type(const pe_gguf_file *f, const char *name)
{
    const pe_gguf_tensor *t = pe_gguf_find_tensor(f, name);
    return t ? pe_ggml_type_name(t->type) : "";
}

/* 0 when the tensor's type in f is want (case-insensitive), else -1 after saying so. */
static int expect_type(const pe_gguf_file *f, const char *what, const char *name, const char *want)
{
    const char *got = tensor_type(f, name);
    if (strcasecmp(got, want) == 0) return 0;
    fprintf(stderr, "%s: %s is %s, want %s\n", what, name, got[0] ? got : "(missing)", want);
    return -1;
}

static int test_q4_k_m_and_q6_k_run_eval_inspect(void)
{
    static const char *const types[] = {"q4_k_m", "q6_k"};
    char path[1024], text[1024], args[4096];
    snprintf(text, sizeof text, "%s/text.txt", dir);
    FILE *f = fopen(text, "w");
    T_ASSERT(f != NULL);
    for (int i = 0; i < 40; i++)
        fputs("once upon a time a little girl went to the park to play with a ball. ", f);
    T_ASSERT(fclose(f) == 0);
    for (int k = 0; k < 2; k++) {
        const char *ty = types[k];
        const int mix = k == 0;
        T_OK(synth(ty, ty, REF_DIMS, path, sizeof path));
        char want[64];
        snprintf(want, sizeof want, ", %s weights, dim 256", ty);
        if (!strstr(out, want)) T_FAIL("%s: synth-model said: %s", ty, out);

        snprintf(args, sizeof args, "run -m '%s' -p 'once upon a time' -n 8 --temp 0 -t 1", path);
        if (run(args) != 0) T_FAIL("%s: run: %s", ty, err);
        if (!strstr(out, "generated: 8 tokens") && !strstr(err, "generated: 8 tokens"))
            T_FAIL("%s: run did not generate 8 tokens:\n%s\n%s", ty, out, err);

        snprintf(args, sizeof args, "eval -m '%s' -f '%s' -c 64 -b 64 -t 1 --json", path, text);
        if (run(args) != 0) T_FAIL("%s: eval: %s", ty, err);
        json_t *e = json_loads(out, 0, NULL);
        if (!e) T_FAIL("%s: eval output not JSON: %s", ty, out);
        const double ppl = json_number_value(json_object_get(e, "ppl"));
        json_decref(e);
        if (!(ppl > 1.0 && isfinite(ppl))) T_FAIL("%s: eval ppl %g", ty, ppl);

        snprintf(args, sizeof args, "inspect --json '%s'", path);
        if (run(args) != 0) T_FAIL("%s: inspect: %s", ty, err);
        json_t *o = json_loads(out, 0, NULL);
        if (!o) T_FAIL("%s: inspect output not JSON", ty);
        size_t i, n_q4 = 0, n_q6 = 0, n_f32 = 0, n_bad = 0;
        json_t *jt;
        json_array_foreach(json_object_get(o, "tensors"), i, jt)
        {
            const char *name = json_string_value(json_object_get(jt, "name"));
            const char *got = json_string_value(json_object_get(jt, "type"));
            const int is_1d = json_array_size(json_object_get(jt, "shape")) == 1;
            const int more = strcmp(name, "output.weight") == 0 ||
                             strcmp(name, "blk.1.attn_v.weight") == 0 ||
                             strcmp(name, "blk.1.ffn_down.weight") == 0;
            const char *w = is_1d ? "f32" : !mix || more ? "q6_K" : "q4_K";
            if (!got || strcmp(got, w) != 0) {
                fprintf(stderr, "%s: inspect: %s is %s, want %s\n", ty, name, got ? got : "?", w);
                n_bad++;
            }
            n_q4 += got && strcmp(got, "q4_K") == 0;
            n_q6 += got && strcmp(got, "q6_K") == 0;
            n_f32 += got && strcmp(got, "f32") == 0;
        }
        json_t *by = json_object_get(o, "types");
#define N_BY(t) json_integer_value(json_object_get(json_object_get(by, t), "tensors"))
        const int counts_ok = (json_int_t)n_q4 == (mix ? N_BY("q4_K") : 0) &&
                              (json_int_t)n_q6 == N_BY("q6_K") && (json_int_t)n_f32 == N_BY("f32");
#undef N_BY
        json_decref(o);
        if (n_bad) T_FAIL("%s: %zu tensors of the wrong type", ty, n_bad);
        if (!counts_ok || n_q6 != (mix ? 3u : 16u) || n_q4 != (mix ? 13u : 0u) || n_f32 != 5)
            T_FAIL("%s: %zu q4_K, %zu q6_K, %zu f32 tensors; the counts by type differ", ty, n_q4,
                   n_q6, n_f32);
        printf("     %-6s runs, eval ppl %.2f, inspect shows the mix's types\n", ty, ppl);
    }
    return 0;
}

static int test_mix_rules_by_shape(void)
{
    char path[1024], e[512], name[64];
    pe_gguf_file *f;
    int bad = 0;
    /* 8 layers: use_more_bits is layers 0 (< 8/8), 7 (>= 7*8/8), 3 and 6 ((i - 1) % 3 == 2) */
    T_OK(synth("q4km-8", "q4_k_m", "--dim 256 --ffn 256 --layers 8 --heads 4 --kv-heads 2", path,
               sizeof path));
    if (pe_gguf_open(path, &f, e, sizeof e) != 0) T_FAIL("%s: %s", path, e);
    for (int l = 0; l < 8; l++) {
        const char *w = l == 0 || l == 3 || l == 6 || l == 7 ? "q6_K" : "q4_K";
        snprintf(name, sizeof name, "blk.%d.attn_v.weight", l);
        bad |= expect_type(f, "q4_k_m 8 layers", name, w);
        snprintf(name, sizeof name, "blk.%d.ffn_down.weight", l);
        bad |= expect_type(f, "q4_k_m 8 layers", name, w);
        snprintf(name, sizeof name, "blk.%d.ffn_up.weight", l);
        bad |= expect_type(f, "q4_k_m 8 layers", name, "q4_K");
    }
    pe_gguf_close(f);
    /* q2_k: attn_v by the GQA ratio; ffn_down and attn_output Q3_K; the rest Q2_K */
    for (int g = 0; g < 2; g++) {
        T_OK(synth("q2k", "q2_k",
                   g ? "--dim 256 --ffn 256 --layers 1 --heads 8 --kv-heads 2"
                     : "--dim 256 --ffn 256 --layers 1 --heads 4 --kv-heads 2",
                   path, sizeof path));
        if (pe_gguf_open(path, &f, e, sizeof e) != 0) T_FAIL("%s: %s", path, e);
        bad |= expect_type(f, "q2_k", "blk.0.attn_v.weight", g ? "q4_K" : "q3_K");
        bad |= expect_type(f, "q2_k", "blk.0.ffn_down.weight", "q3_K");
        bad |= expect_type(f, "q2_k", "blk.0.attn_output.weight", "q3_K");
        bad |= expect_type(f, "q2_k", "blk.0.attn_q.weight", "q2_K");
        bad |= expect_type(f, "q2_k", "output.weight", "q6_K");
        pe_gguf_close(f);
    }
    /* the tiny shape: rows of 64 and 172 values */
    T_OK(synth("q4km-tiny", "q4_k_m", "", path, sizeof path));
    if (!strstr(err, "written as q5_0") || !strstr(err, "written as f16"))
        T_FAIL("no fallback note: %s", err);
    if (pe_gguf_open(path, &f, e, sizeof e) != 0) T_FAIL("%s: %s", path, e);
    bad |= expect_type(f, "q4_k_m tiny", "output.weight", "q8_0");
    bad |= expect_type(f, "q4_k_m tiny", "token_embd.weight", "q5_0");
    bad |= expect_type(f, "q4_k_m tiny", "blk.1.attn_v.weight", "q8_0");
    bad |= expect_type(f, "q4_k_m tiny", "blk.0.ffn_down.weight", "f16");
    pe_gguf_close(f);
    /* a tied architecture: token_embd.weight is the output and takes its Q6_K */
    T_OK(synth("q4km-qwen2", "q4_k_m", "--arch qwen2 " REF_DIMS, path, sizeof path));
    if (pe_gguf_open(path, &f, e, sizeof e) != 0) T_FAIL("%s: %s", path, e);
    bad |= expect_type(f, "qwen2 q4_k_m", "token_embd.weight", "q6_K");
    bad |= expect_type(f, "qwen2 q4_k_m", "blk.0.attn_q.bias", "f32");
    pe_gguf_close(f);
    return bad ? -1 : 0;
}

static int test_every_type_accepted(void)
{
    static const char *const all[] = {"q4_1", "q5_0", "q5_1", "iq4_nl", "q3_k",   "q4_k",
                                      "q5_k", "q6_k", "q2_k", "q3_k_m", "q4_k_s", "Q5_K_M"};
    char path[1024], args[2048];
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        T_OK(synth("any", all[i], "--dim 256 --ffn 256 --layers 1", path, sizeof path));
    snprintf(args, sizeof args, "synth-model --type q4_k_x -o '%s/bad.gguf'", dir);
    T_EQ(run(args), 2);
    if (!strstr(err, "q4_k_x") || !strstr(err, "q4_k_m"))
        T_FAIL("the message does not name the value and the choices: %s", err);
    return 0;
}

/* Against llama-quantize's files: general.file_type, and the per-tensor types. */
static int test_same_types_as_llama_quantize(void)
{
    static const struct {
        const char *stem, *type;
        int same_types; /* the ftype is a mix or one type throughout, as --type writes it */
    } cases[] = {
        {"q2_k", "q2_k", 1},     {"q3_k_m", "q3_k_m", 1}, {"q4_k_s", "q4_k_s", 1},
        {"q4_k_m", "q4_k_m", 1}, {"q5_k_m", "q5_k_m", 1}, {"q6_k", "q6_k", 1},
        {"q8_0", "q8_0", 1},     {"q4_0", "q4_0", 0},     {"q4_1", "q4_1", 0},
        {"q5_0", "q5_0", 0},     {"q5_1", "q5_1", 0},     {"iq4_nl", "iq4_nl", 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char path[1024], ref[2048], e[512];
        pe_gguf_file *fa, *fb;
        uint32_t fta = 0, ftb = 0;
        int bad = 0;
        T_OK(synth(cases[c].stem, cases[c].type, REF_DIMS, path, sizeof path));
        snprintf(ref, sizeof ref, "%s/models/tiny-llama-%s/tiny-llama-%s.gguf", refdir,
                 cases[c].stem, cases[c].stem);
        if (pe_gguf_open(path, &fa, e, sizeof e) != 0) T_FAIL("%s: %s", path, e);
        if (pe_gguf_open(ref, &fb, e, sizeof e) != 0) {
            pe_gguf_close(fa);
            T_FAIL("%s: %s", ref, e);
        }
        if (pe_gguf_get_u32(fa, "general.file_type", &fta) != 0 ||
            pe_gguf_get_u32(fb, "general.file_type", &ftb) != 0 || fta != ftb) {
            fprintf(stderr, "%s: general.file_type %u, llama-quantize's %u\n", cases[c].stem, fta,
                    ftb);
            bad++;
        }
        for (uint64_t i = 0; cases[c].same_types && i < pe_gguf_n_tensors(fb); i++) {
            const pe_gguf_tensor *t = pe_gguf_tensor_at(fb, i);
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
            if (expect_type(fa, cases[c].stem, name, pe_ggml_type_name(t->type)) != 0) bad++;
        }
        const uint64_t n_a = pe_gguf_n_tensors(fa), n_b = pe_gguf_n_tensors(fb);
        pe_gguf_close(fa);
        pe_gguf_close(fb);
        if (bad || n_a != n_b) T_FAIL("%s: differs from llama-quantize's file", cases[c].stem);
        printf("     %-6s general.file_type %u%s as llama-quantize's\n", cases[c].stem, fta,
               cases[c].same_types ? " and every tensor's type" : "");
    }
    return 0;
}

int main(int argc, char **argv)
{
    int rc = t_cli_args(argc, argv, NULL, &bin, &dir);
    if (rc != 0) return rc;
    const char *env = getenv("PGD_REFERENCE_DIR");
    snprintf(refdir, sizeof refdir, "%s",
             env && *env ? env : PGD_SOURCE_DIR "/../shared/models/reference");
    char probe[2048];
    snprintf(probe, sizeof probe, "%s/models/tiny-llama-q4_k_m/tiny-llama-q4_k_m.gguf", refdir);
    T_RUN(test_q4_k_m_and_q6_k_run_eval_inspect);
    T_RUN(test_mix_rules_by_shape);
    T_RUN(test_every_type_accepted);
    if (!t_is_file(probe)) {
        if (t_failed) T_DONE();
        T_SKIP("the reference set (../shared/models/reference) not found: the comparison with "
               "llama-quantize's files left out");
    }
    T_RUN(test_same_types_as_llama_quantize);
    T_DONE();
}
