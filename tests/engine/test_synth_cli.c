/* SPDX-License-Identifier: MIT */
/*
 * test_synth_cli.c - end-to-end tests of `pagoda synth-model` and `pagoda inspect`, run as
 * the real binary (argv[1]) with scratch files in a directory (argv[2]).
 *
 * Checks: a tiny model of each weight type (f32 f16 bf16 q8_0 q4_0) is written, reads
 * back through the GGUF reader with the expected tensors, types and metadata, and
 * `pagoda inspect` (text and --json) shows its version, architecture, hyper-parameters,
 * tensor table and KV bytes per token; the same seed gives the same bytes and another
 * seed other weights; --vocab copies a vocabulary (the llama-spm vocab GGUF from
 * ../shared/models when present); a corrupt or truncated file makes inspect exit 1 with
 * the reader's message; bad command lines exit 2. Without that vocab GGUF (tests/proc.h
 * says where models are looked for) its part is left out and the program exits 77
 * (skipped) once the rest has passed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "gguf.h"
#include "proc.h"
#include "t.h"

static const char *bin;   /* the pagoda executable */
static const char *dir;   /* scratch directory */
static char out[1 << 17]; /* stdout of the last run */
static char err[1 << 16]; /* stderr of the last run */

static const char *path_of(const char *name)
{
    static char buf[4][1024];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

static int g_missing; /* the llama-spm vocab GGUF was not found */

/* Runs `pagoda ARGS` through sh; fills out and err; returns the exit status (-1 on error). */
static int run(const char *args)
{
    return t_run_bin(bin, dir, args, out, sizeof out, err, sizeof err);
}

static int runf(const char *fmt, const char *a, const char *b)
{
    char args[4096];
    snprintf(args, sizeof args, fmt, a, b);
    return run(args);
}

/* The first occurrence of needle (n bytes) in buf, or NULL. */
static uint8_t *find_bytes(uint8_t *buf, size_t size, const char *needle, size_t n)
{
    for (size_t i = 0; i + n <= size; i++) {
        if (memcmp(buf + i, needle, n) == 0) return buf + i;
    }
    return NULL;
}

#define T_HAS(hay, needle)                                                                         \
    do {                                                                                           \
        if (!strstr((hay), (needle))) T_FAIL("output lacks '%s':\n%s", (needle), (hay));           \
    } while (0)

/* Checks a tiny model file through the reader: 21 tensors of the right types. */
static int check_tiny(const char *path, uint32_t wtype)
{
    char e[256];
    pe_gguf_file *f;
    const pe_gguf_tensor *t;
    uint32_t u32;
    pe_gguf_str s;
    uint32_t down =
        (wtype == PE_GGML_TYPE_Q8_0 || wtype == PE_GGML_TYPE_Q4_0) ? PE_GGML_TYPE_F16 : wtype;
    if (pe_gguf_open(path, &f, e, sizeof e) != 0) T_FAIL("%s: %s", path, e);
    T_EQ(pe_gguf_n_tensors(f), 21);
    T_EQ(pe_gguf_get_str(f, "general.architecture", &s), 0);
    T_ASSERT(pe_gguf_str_eq(s, "llama"));
    T_EQ(pe_gguf_get_str(f, "general.name", &s), 0);
    T_ASSERT(pe_gguf_str_eq(s, "pagoda synthetic tiny (random weights)"));
    T_EQ(pe_gguf_get_u32(f, "llama.embedding_length", &u32), 0);
    T_EQ(u32, 64);
    T_EQ(pe_gguf_get_u32(f, "llama.attention.head_count_kv", &u32), 0);
    T_EQ(u32, 2);
    T_EQ(pe_gguf_get_u32(f, "llama.rope.dimension_count", &u32), 0);
    T_EQ(u32, 16);
    T_EQ(pe_gguf_get_u32(f, "tokenizer.ggml.eos_token_id", &u32), 0);
    T_EQ(u32, 2);
    t = pe_gguf_find_tensor(f, "token_embd.weight");
    T_ASSERT(t && t->type == wtype && t->ne[0] == 64 && t->ne[1] == 512);
    t = pe_gguf_find_tensor(f, "blk.1.attn_k.weight");
    T_ASSERT(t && t->type == wtype && t->ne[0] == 64 && t->ne[1] == 32);
    t = pe_gguf_find_tensor(f, "blk.1.ffn_down.weight");
    T_ASSERT(t && t->type == down && t->ne[0] == 172 && t->ne[1] == 64);
    t = pe_gguf_find_tensor(f, "blk.0.ffn_norm.weight");
    T_ASSERT(t && t->type == PE_GGML_TYPE_F32 && t->n_dims == 1);
    T_ASSERT(pe_gguf_find_tensor(f, "output.weight") &&
             pe_gguf_find_tensor(f, "output_norm.weight"));
    pe_gguf_close(f);
    return 0;
}

static int test_each_type(void)
{
    static const struct {
        const char *name;
        uint32_t type;
    } types[] = {{"f32", PE_GGML_TYPE_F32},
                 {"f16", PE_GGML_TYPE_F16},
                 {"bf16", PE_GGML_TYPE_BF16},
                 {"q8_0", PE_GGML_TYPE_Q8_0},
                 {"q4_0", PE_GGML_TYPE_Q4_0}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        char file[64], args[2048];
        snprintf(file, sizeof file, "tiny_%s.gguf", types[i].name);
        snprintf(args, sizeof args, "synth-model --shape tiny --type %s -o '%s'", types[i].name,
                 path_of(file));
        T_EQ(run(args), 0);
        T_HAS(out, "wrote ");
        if (types[i].type == PE_GGML_TYPE_Q8_0 || types[i].type == PE_GGML_TYPE_Q4_0) {
            T_HAS(err, "note: ffn_down.weight rows of 172 values");
        }
        if (check_tiny(path_of(file), types[i].type) != 0) T_FAIL("%s", file);

        T_EQ(runf("inspect '%s'%s", path_of(file), ""), 0);
        T_HAS(out, "version       3");
        T_HAS(out, "alignment     32");
        T_HAS(out, "architecture  llama");
        T_HAS(out, "pagoda synthetic tiny (random weights)");
        T_HAS(out, "block_count                        2");
        T_HAS(out, "attention.head_count_kv            2");
        T_HAS(out, "rope.freq_base                     10000");
        T_HAS(out, "attention.layer_norm_rms_epsilon   1e-05");
        T_HAS(out, "tokens                             512");
        T_HAS(out, "tensors: 21, 156480 params");
        T_HAS(out, "blk.1.ffn_up.weight");
        T_HAS(out, "[64, 172]");
        T_HAS(out, types[i].name);
        /* 2 x 2 layers x 2 KV heads x head_dim 16 x 4 bytes */
        T_HAS(out, "f32  KV bytes per token 512, per 1k tokens 500.00 KiB, at context 512 "
                   "256.00 KiB");
        T_HAS(out, "f16  KV bytes per token 256");
    }
    return 0;
}

static int test_inspect_json(void)
{
    json_error_t je;
    json_t *o, *kv, *t0;
    T_EQ(runf("inspect --json '%s'%s", path_of("tiny_q8_0.gguf"), ""), 0);
    o = json_loads(out, 0, &je);
    if (!o) T_FAIL("bad JSON: %s", je.text);
    T_EQ(json_integer_value(json_object_get(o, "version")), 3);
    T_ASSERT(strcmp(json_string_value(json_object_get(o, "architecture")), "llama") == 0);
    T_EQ(json_integer_value(json_object_get(json_object_get(o, "hparams"), "block_count")), 2);
    T_EQ(json_array_size(json_object_get(o, "tensors")), 21);
    t0 = json_array_get(json_object_get(o, "tensors"), 0);
    T_ASSERT(strcmp(json_string_value(json_object_get(t0, "name")), "token_embd.weight") == 0);
    T_ASSERT(strcmp(json_string_value(json_object_get(t0, "type")), "q8_0") == 0);
    T_EQ(json_integer_value(json_object_get(t0, "bytes")), 512 * 2 * 34);
    T_EQ(json_integer_value(json_object_get(json_object_get(o, "tokenizer"), "n_tokens")), 512);
    kv = json_object_get(o, "kv_cache");
    T_EQ(json_integer_value(json_object_get(json_object_get(kv, "bytes_per_token"), "f16")), 256);
    T_EQ(json_integer_value(json_object_get(json_object_get(kv, "bytes_at_context"), "f32")),
         512 * 512);
    json_decref(o);
    return 0;
}

static int same_file(const char *a, const char *b)
{
    size_t na, nb;
    uint8_t *x = t_read_all(a, &na), *y = t_read_all(b, &nb);
    int same = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

static int test_seed(void)
{
    T_EQ(runf("synth-model --type q4_0 --seed 7 -o '%s'%s", path_of("s7a.gguf"), ""), 0);
    T_EQ(runf("synth-model --type q4_0 --seed 7 --threads 1 -o '%s'%s", path_of("s7b.gguf"), ""),
         0);
    T_EQ(runf("synth-model --type q4_0 --seed 8 -o '%s'%s", path_of("s8.gguf"), ""), 0);
    T_ASSERT(same_file(path_of("s7a.gguf"), path_of("s7b.gguf")));
    T_ASSERT(!same_file(path_of("s7a.gguf"), path_of("s8.gguf")));
    return 0;
}

static int test_custom_dims(void)
{
    char e[256];
    pe_gguf_file *f;
    uint32_t u32;
    T_EQ(runf("synth-model --type q8_0 --dim 80 --heads 4 --kv-heads 1 --layers 3 --ffn 96 "
              "--vocab-size 300 --ctx 64 -o '%s'%s",
              path_of("custom.gguf"), ""),
         0);
    T_HAS(err, "note: matrix rows of 80 values are not a multiple of the q8_0 block");
    T_ASSERT(pe_gguf_open(path_of("custom.gguf"), &f, e, sizeof e) == 0);
    T_EQ(pe_gguf_n_tensors(f), 3 + 9 * 3);
    T_EQ(pe_gguf_get_u32(f, "llama.context_length", &u32), 0);
    T_EQ(u32, 64);
    T_EQ(pe_gguf_find_tensor(f, "blk.2.attn_v.weight")->ne[1], 20);
    T_EQ(pe_gguf_find_tensor(f, "blk.2.attn_v.weight")->type, PE_GGML_TYPE_F16);
    T_EQ(pe_gguf_find_tensor(f, "blk.2.ffn_down.weight")->type, PE_GGML_TYPE_Q8_0); /* 96 % 32 */
    T_EQ(pe_gguf_find_tensor(f, "output.weight")->ne[1], 300);
    pe_gguf_close(f);
    T_EQ(runf("inspect '%s'%s", path_of("custom.gguf"), ""), 0);
    T_HAS(out, "pagoda synthetic tiny custom (random weights)");
    return 0;
}

static int test_vocab(void)
{
    char spm[1024], e[256];
    pe_gguf_file *f;
    const pe_gguf_kv *kv;

    /* A vocabulary copied from another synthetic model: always available. */
    T_EQ(runf("synth-model --vocab '%s' -o '%s'", path_of("tiny_f16.gguf"), path_of("v1.gguf")), 0);
    T_EQ(runf("inspect '%s'%s", path_of("v1.gguf"), ""), 0);
    T_HAS(out, "tokens                             512");
    T_EQ(runf("synth-model --vocab '%s' --vocab-size 999 -o '%s'", path_of("tiny_f16.gguf"),
              path_of("v2.gguf")),
         2);
    T_HAS(err, "differs");
    T_EQ(runf("synth-model --vocab '%s' -o '%s'", path_of("missing.gguf"), path_of("v2.gguf")), 1);
    T_HAS(err, "cannot open");

    if (!t_model_file(spm, sizeof spm, "vocab/ggml-vocab-llama-spm.gguf")) {
        fprintf(stderr, "     (llama-spm vocab part skipped: %s not found)\n", spm);
        g_missing = 1;
        return 0;
    }
    T_EQ(runf("synth-model --type q8_0 --vocab '%s' -o '%s'", spm, path_of("spm.gguf")), 0);
    T_ASSERT(pe_gguf_open(path_of("spm.gguf"), &f, e, sizeof e) == 0);
    T_EQ(pe_gguf_get_arr(f, "tokenizer.ggml.tokens", PE_GGUF_TYPE_STRING, &kv), 0);
    T_EQ(kv->n, 32000);
    T_ASSERT(pe_gguf_str_eq(pe_gguf_arr_str(kv, 3), "<0x00>"));
    T_EQ(pe_gguf_find_tensor(f, "token_embd.weight")->ne[1], 32000);
    T_ASSERT(pe_gguf_find_kv(f, "tokenizer.ggml.scores") &&
             pe_gguf_find_kv(f, "tokenizer.ggml.pre"));
    pe_gguf_close(f);
    T_EQ(runf("inspect '%s'%s", path_of("spm.gguf"), ""), 0);
    T_HAS(out, "tokens                             32000");
    T_HAS(out, "add_bos_token                      true");
    return 0;
}

static int test_bad_files(void)
{
    size_t n;
    uint8_t *b = t_read_all(path_of("tiny_q8_0.gguf"), &n);
    uint8_t *p;
    uint32_t bad = 99, orig;
    T_ASSERT(b != NULL);
    /* The type field of blk.0.attn_q.weight: after its name, n_dims and two ne. */
    p = find_bytes(b, n, "blk.0.attn_q.weight", 19);
    T_ASSERT(p != NULL);
    memcpy(&orig, p + 19 + 4 + 16, 4);
    memcpy(p + 19 + 4 + 16, &bad, 4);
    T_EQ(t_write_all(path_of("bad_type.gguf"), b, n), 0);
    memcpy(p + 19 + 4 + 16, &orig, 4);
    T_EQ(runf("inspect '%s'%s", path_of("bad_type.gguf"), ""), 1);
    T_HAS(err, "tensor 'blk.0.attn_q.weight': unknown tensor type 99");
    T_HAS(err, "bad_type.gguf");
    T_ASSERT(out[0] == '\0');
    T_EQ(t_write_all(path_of("short.gguf"), b, n / 2), 0);
    T_EQ(runf("inspect --json '%s'%s", path_of("short.gguf"), ""), 1);
    T_HAS(err, "past end of file");
    memcpy(b, "GGML", 4);
    T_EQ(t_write_all(path_of("magic.gguf"), b, n), 0);
    T_EQ(runf("inspect '%s'%s", path_of("magic.gguf"), ""), 1);
    T_HAS(err, "bad magic");
    free(b);
    T_EQ(runf("inspect '%s'%s", path_of("missing.gguf"), ""), 1);
    T_HAS(err, "cannot open");
    return 0;
}

static int test_bad_flags(void)
{
    T_EQ(run("inspect"), 2);
    T_EQ(run("inspect a b"), 2);
    T_EQ(run("inspect --bogus x"), 2);
    T_EQ(run("inspect --help"), 0);
    T_HAS(out, "KV cache");
    T_EQ(run("synth-model --help"), 0);
    T_HAS(out, "--vocab");
    T_EQ(runf("synth-model --type q8_1 -o '%s'%s", path_of("x.gguf"), ""), 2);
    T_HAS(err, "q8_1");
    T_EQ(runf("synth-model --shape huge -o '%s'%s", path_of("x.gguf"), ""), 2);
    T_EQ(run("synth-model --shape tiny"), 2);
    T_HAS(err, "-o FILE");
    T_EQ(runf("synth-model --dim 65 -o '%s'%s", path_of("x.gguf"), ""), 2);
    T_EQ(runf("synth-model --heads 4 --kv-heads 3 -o '%s'%s", path_of("x.gguf"), ""), 2);
    T_EQ(runf("synth-model --vocab-size 10 -o '%s'%s", path_of("x.gguf"), ""), 2);
    T_EQ(run("synth-model -o /nonexistent-dir/x.gguf"), 1);
    T_HAS(err, "/nonexistent-dir/x.gguf.tmp");
    return 0;
}

int main(int argc, char **argv)
{
    int rc = t_cli_args(argc, argv, NULL, &bin, &dir);
    if (rc != 0) return rc;
    T_RUN(test_each_type);
    T_RUN(test_inspect_json);
    T_RUN(test_seed);
    T_RUN(test_custom_dims);
    T_RUN(test_vocab);
    T_RUN(test_bad_files);
    T_RUN(test_bad_flags);
    if (g_missing && !t_failed) T_SKIP("the llama-spm vocab GGUF not found (set PGD_MODELS_DIR)");
    T_DONE();
}
