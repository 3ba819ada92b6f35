/* SPDX-License-Identifier: MIT */
/*
 * test_synth_arch.c - `pagoda synth-model --arch` and `pagoda inspect` across the
 * architectures (issue 15), run as the real binary (argv[1]) in a scratch directory (argv[2]).
 *
 * Checks: each --arch (llama qwen2 qwen3 phi3 gemma2 gemma3) file loads and runs (`pagoda run -n 8`
 * generates 8 tokens, `pagoda eval` gives a finite perplexity) and `pagoda inspect --json`
 * shows its architecture, its tensors with their types, the count by type and the KV bytes
 * per token of its geometry; --arch llama is byte-identical to no --arch; an unknown --arch
 * exits 2 naming it. With ../shared/models/reference ($PGD_REFERENCE_DIR overrides): a file
 * of each architecture written with the reference models' dimensions has exactly the tensor
 * names and shapes and the <arch>.* keys of models/tiny-<arch>-f16, and `pagoda inspect`
 * shows, for every reference model, the architecture and each tensor's type as its
 * tensor-types.md lists them, and for gemma2/gemma3 the window layer counted by its window. Without
 * the folder those parts are left out and the program exits 77 (skipped) once the rest has passed.
 */
#include <dirent.h>
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

static const char *const arch_names[] = {"llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3"};
#define N_ARCHS (sizeof arch_names / sizeof arch_names[0])

static int run(const char *args)
{
    return t_run_bin(bin, dir, args, out, sizeof out, err, sizeof err);
}

/* `pagoda inspect --json path` parsed, or NULL after a message. */
static json_t *inspect_json(const char *path)
{
    char args[2048];
    json_error_t je;
    snprintf(args, sizeof args, "inspect --json '%s'", path);
    if (run(args) != 0) {
        fprintf(stderr, "inspect %s failed: %s\n", path, err);
        return NULL;
    }
    json_t *o = json_loads(out, 0, &je);
    if (!o) fprintf(stderr, "inspect %s: not JSON (%s)\n", path, je.text);
    return o;
}

/* The tensor called name in inspect's "tensors" array, or NULL. */
static json_t *find_tensor(json_t *o, const char *name)
{
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(o, "tensors"), i, t)
    {
        if (strcmp(json_string_value(json_object_get(t, "name")), name) == 0) return t;
    }
    return NULL;
}

static int test_each_arch_loads_runs_and_inspects(void)
{
    char args[4096], path[1024], text[1024];
    FILE *f;
    snprintf(text, sizeof text, "%s/text.txt", dir);
    f = fopen(text, "w");
    T_ASSERT(f != NULL);
    for (int i = 0; i < 40; i++)
        fputs("once upon a time a little girl went to the park to play with a ball. ", f);
    T_ASSERT(fclose(f) == 0);
    for (size_t a = 0; a < N_ARCHS; a++) {
        const char *an = arch_names[a];
        snprintf(path, sizeof path, "%s/%s.gguf", dir, an);
        snprintf(args, sizeof args, "synth-model --arch %s --seed 3 -o '%s'", an, path);
        if (run(args) != 0) T_FAIL("%s: synth-model: %s", an, err);
        char want[128];
        snprintf(want, sizeof want, ": %s tiny, f16 weights", an);
        if (!strstr(out, want)) T_FAIL("%s: synth-model said: %s", an, out);

        snprintf(args, sizeof args, "run -m '%s' -p 'once upon a time' -n 8 --temp 0 -t 1", path);
        if (run(args) != 0) T_FAIL("%s: run: %s", an, err);
        if (!strstr(out, "generated: 8 tokens") && !strstr(err, "generated: 8 tokens"))
            T_FAIL("%s: run did not generate 8 tokens:\n%s\n%s", an, out, err);

        snprintf(args, sizeof args, "eval -m '%s' -f '%s' -c 64 -b 64 -t 1 --json", path, text);
        if (run(args) != 0) T_FAIL("%s: eval: %s", an, err);
        json_t *e = json_loads(out, 0, NULL);
        if (!e) T_FAIL("%s: eval output not JSON: %s", an, out);
        double ppl = json_number_value(json_object_get(e, "ppl"));
        json_decref(e);
        if (!(ppl > 1.0 && isfinite(ppl))) T_FAIL("%s: eval ppl %g", an, ppl);

        json_t *o = inspect_json(path);
        T_ASSERT(o != NULL);
        int ok = strcmp(json_string_value(json_object_get(o, "architecture")), an) == 0;
        json_t *kvc = json_object_get(o, "kv_cache");
        /* tiny: 2 layers, 2 KV heads, head_dim 64 / 4 = 16: 2 * 2 * 2 * 16 * 2 bytes in f16 */
        ok = ok && json_integer_value(json_object_get(kvc, "key_length")) == 16 &&
             json_integer_value(json_object_get(kvc, "n_kv_heads")) == 2 &&
             json_integer_value(json_object_get(json_object_get(kvc, "bytes_per_token"), "f16")) ==
                 256 &&
             json_real_value(
                 json_object_get(json_object_get(kvc, "bytes_per_token_by_codec"), "f16")) == 256.0;
        /* the per-tensor types, and the count by type, add up */
        json_t *tt = json_object_get(o, "tensors"), *jt, *types = json_object_get(o, "types");
        size_t i, n_f32 = 0, n_f16 = 0;
        json_array_foreach(tt, i, jt)
        {
            const char *ty = json_string_value(json_object_get(jt, "type"));
            n_f32 += ty && strcmp(ty, "f32") == 0;
            n_f16 += ty && strcmp(ty, "f16") == 0;
        }
        ok = ok && n_f32 + n_f16 == json_array_size(tt) &&
             (json_int_t)n_f32 ==
                 json_integer_value(json_object_get(json_object_get(types, "f32"), "tensors")) &&
             (json_int_t)n_f16 ==
                 json_integer_value(json_object_get(json_object_get(types, "f16"), "tensors"));
        /* what each architecture has of its own */
        int tied = a == 1 || a == 2 || a >= 4;
        ok = ok && (find_tensor(o, "output.weight") == NULL) == tied;
        if (a == 1)
            ok = ok && find_tensor(o, "blk.0.attn_q.bias") && find_tensor(o, "blk.1.attn_v.bias");
        if (a == 2 || a == 5) {
            json_t *qn = find_tensor(o, "blk.0.attn_q_norm.weight");
            ok = ok && qn && find_tensor(o, "blk.1.attn_k_norm.weight") &&
                 json_integer_value(json_array_get(json_object_get(qn, "shape"), 0)) == 16 &&
                 json_integer_value(
                     json_object_get(json_object_get(o, "hparams"), "attention.key_length")) == 16;
        }
        if (a == 3) {
            json_t *qkv = find_tensor(o, "blk.0.attn_qkv.weight");
            json_t *up = find_tensor(o, "blk.1.ffn_up.weight");
            ok = ok && qkv && up && !find_tensor(o, "blk.0.ffn_gate.weight") &&
                 !find_tensor(o, "blk.0.attn_q.weight") &&
                 json_integer_value(json_array_get(json_object_get(qkv, "shape"), 1)) ==
                     64 + 2 * 32 &&
                 json_integer_value(json_array_get(json_object_get(up, "shape"), 1)) == 2 * 172;
        }
        if (a >= 4) { /* gemma: post-norms, a window of ctx / 16 on layer 0 of 2 */
            json_t *sw = json_object_get(kvc, "sliding_window");
            json_t *ll = json_object_get(sw, "local_layers");
            ok = ok && find_tensor(o, "blk.0.post_attention_norm.weight") &&
                 find_tensor(o, "blk.1.post_ffw_norm.weight") &&
                 (a == 5) == (find_tensor(o, "blk.1.attn_k_norm.weight") != NULL) &&
                 json_integer_value(json_object_get(sw, "window")) == 512 / 16 &&
                 json_array_size(ll) == 1 && json_integer_value(json_array_get(ll, 0)) == 0;
        }
        if (!ok) {
            char *s = json_dumps(o, JSON_INDENT(1));
            fprintf(stderr, "%s: inspect --json:\n%s\n", an, s ? s : "?");
            free(s);
        }
        json_decref(o);
        if (!ok) T_FAIL("%s: inspect does not show the architecture's file", an);
    }
    return 0;
}

static int test_llama_default_unchanged(void)
{
    char args[2048], a[1024], b[1024];
    size_t nx = 0, ny = 0;
    snprintf(a, sizeof a, "%s/default.gguf", dir);
    snprintf(b, sizeof b, "%s/arch-llama.gguf", dir);
    snprintf(args, sizeof args, "synth-model --type q8_0 --dim 128 -o '%s'", a);
    T_EQ(run(args), 0);
    snprintf(args, sizeof args, "synth-model --arch llama --type q8_0 --dim 128 -o '%s'", b);
    T_EQ(run(args), 0);
    uint8_t *x = t_read_all(a, &nx), *y = t_read_all(b, &ny);
    int same = x && y && nx > 1000 && nx == ny && memcmp(x, y, nx) == 0;
    free(x);
    free(y);
    if (!same) T_FAIL("--arch llama (%zu bytes) differs from the default (%zu bytes)", ny, nx);
    return 0;
}

static int test_bad_arch(void)
{
    char args[2048];
    snprintf(args, sizeof args, "synth-model --arch mamba -o '%s/bad.gguf'", dir);
    T_EQ(run(args), 2);
    if (!strstr(err, "mamba")) T_FAIL("the message does not name the value: %s", err);
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp((const char *)a, (const char *)b);
}

/* The <arch>.* keys of f, sorted, joined by ' ' into buf. */
static void arch_keys(const pe_gguf_file *f, const char *an, char *buf, size_t n)
{
    static char keys[128][96];
    size_t k = 0, plen = strlen(an), o = 0;
    for (uint64_t i = 0; i < pe_gguf_n_kv(f) && k < 128; i++) {
        const pe_gguf_kv *kv = pe_gguf_kv_at(f, i);
        if (kv->key.len > plen && kv->key.len < sizeof keys[0] &&
            memcmp(kv->key.ptr, an, plen) == 0 && kv->key.ptr[plen] == '.') {
            memcpy(keys[k], kv->key.ptr, kv->key.len);
            keys[k++][kv->key.len] = '\0';
        }
    }
    qsort(keys, k, sizeof keys[0], cmp_str);
    buf[0] = '\0';
    for (size_t i = 0; i < k && o < n; i++) {
        int w = snprintf(buf + o, n - o, "%s%s", i ? " " : "", keys[i]);
        if (w < 0) break;
        o += (size_t)w;
    }
}

/* 0 when a and b hold the same tensor names with the same shapes, else -1 after saying
 * what differs. */
static int same_tensors(const char *an, const pe_gguf_file *a, const pe_gguf_file *b)
{
    int bad = 0;
    for (int pass = 0; pass < 2; pass++) {
        const pe_gguf_file *x = pass ? b : a, *y = pass ? a : b;
        for (uint64_t i = 0; i < pe_gguf_n_tensors(x); i++) {
            const pe_gguf_tensor *t = pe_gguf_tensor_at(x, i);
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
            const pe_gguf_tensor *u = pe_gguf_find_tensor(y, name);
            if (!u) {
                fprintf(stderr, "%s: %s only in the %s file\n", an, name,
                        pass ? "reference" : "synth");
                bad++;
            } else if (!pass && (u->n_dims != t->n_dims || memcmp(u->ne, t->ne, sizeof t->ne))) {
                fprintf(stderr, "%s: %s: shape %llux%llu (synth) vs %llux%llu (reference)\n", an,
                        name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                        (unsigned long long)u->ne[0], (unsigned long long)u->ne[1]);
                bad++;
            }
        }
    }
    return bad ? -1 : 0;
}

static int test_same_tensors_and_keys_as_reference(void)
{
    for (size_t a = 0; a < N_ARCHS; a++) {
        const char *an = arch_names[a];
        char args[4096], path[1024], ref[2048], e[512];
        static char ka[8192], kb[8192];
        pe_gguf_file *fa, *fb;
        int rc;
        snprintf(path, sizeof path, "%s/ref-shape-%s.gguf", dir, an);
        snprintf(ref, sizeof ref, "%s/models/tiny-%s-f16/tiny-%s-f16.gguf", refdir, an, an);
        /* the reference models' dimensions (README: "The models") */
        snprintf(args, sizeof args,
                 "synth-model --arch %s --dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 512 "
                 "--vocab-size 512 --ctx 512 -o '%s'",
                 an, path);
        if (run(args) != 0) T_FAIL("%s: synth-model: %s", an, err);
        if (pe_gguf_open(path, &fa, e, sizeof e) != 0) T_FAIL("%s: %s", path, e);
        if (pe_gguf_open(ref, &fb, e, sizeof e) != 0) {
            pe_gguf_close(fa);
            T_FAIL("%s: %s", ref, e);
        }
        rc = same_tensors(an, fa, fb);
        arch_keys(fa, an, ka, sizeof ka);
        arch_keys(fb, an, kb, sizeof kb);
        pe_gguf_close(fa);
        pe_gguf_close(fb);
        if (rc != 0) T_FAIL("%s: the tensors differ from %s", an, ref);
        if (strcmp(ka, kb) != 0) T_FAIL("%s: keys\n  synth:     %s\n  reference: %s", an, ka, kb);
        printf("     %-6s same tensors and %s.* keys as tiny-%s-f16\n", an, an, an);
    }
    return 0;
}

/* inspect on every reference model: its architecture (from the folder name: tiny-<arch>-...,
 * llama3 being llama) and each tensor's type as tensor-types.md lists it. */
static int test_inspect_reference_models(void)
{
    char mdir[1100];
    int n_models = 0;
    snprintf(mdir, sizeof mdir, "%s/models", refdir);
    DIR *d = opendir(mdir);
    if (!d) T_FAIL("cannot open %s", mdir);
    for (struct dirent *de = readdir(d); de; de = readdir(d)) {
        char stem[256], path[2048], md[2048], arch[64];
        static char table[1 << 15];
        if (strncmp(de->d_name, "tiny-", 5) != 0) continue;
        snprintf(stem, sizeof stem, "%s", de->d_name);
        snprintf(path, sizeof path, "%s/%s/%s.gguf", mdir, stem, stem);
        snprintf(md, sizeof md, "%s/%s/tensor-types.md", mdir, stem);
        if (!t_is_file(path) || !t_is_file(md)) continue;
        t_slurp(md, table, sizeof table);
        const char *dash = strchr(stem + 5, '-');
        snprintf(arch, sizeof arch, "%.*s", dash ? (int)(dash - stem - 5) : 0, stem + 5);
        if (strcmp(arch, "llama3") == 0) snprintf(arch, sizeof arch, "llama");
        json_t *o = inspect_json(path);
        if (!o) {
            closedir(d);
            T_FAIL("%s: inspect failed", stem);
        }
        int bad = strcmp(json_string_value(json_object_get(o, "architecture")), arch) != 0;
        if (bad) fprintf(stderr, "%s: architecture is not %s\n", stem, arch);
        /* rows "| `name` | TYPE | shape |" */
        size_t n_rows = 0;
        for (const char *p = strstr(table, "| `"); p; p = strstr(p + 1, "| `")) {
            char name[128], type[32];
            if (sscanf(p, "| `%127[^`]` | %31s |", name, type) != 2) continue;
            n_rows++;
            json_t *t = find_tensor(o, name);
            const char *ty = t ? json_string_value(json_object_get(t, "type")) : NULL;
            if (!ty || strcasecmp(ty, type) != 0) {
                fprintf(stderr, "%s: %s: inspect type %s, tensor-types.md %s\n", stem, name,
                        ty ? ty : "(missing)", type);
                bad++;
            }
        }
        json_int_t n_by_type = 0;
        const char *k;
        json_t *v;
        json_object_foreach(json_object_get(o, "types"), k, v)
        {
            n_by_type += json_integer_value(json_object_get(v, "tensors"));
        }
        if (n_rows == 0 || (size_t)json_array_size(json_object_get(o, "tensors")) != n_rows ||
            (size_t)n_by_type != n_rows) {
            fprintf(stderr, "%s: %zu rows in tensor-types.md, %zu tensors, %lld by type\n", stem,
                    n_rows, json_array_size(json_object_get(o, "tensors")), (long long)n_by_type);
            bad++;
        }
        /* gemma2/gemma3: layer 0 of 2 is a 32-token window layer (README "Sliding window");
         * 2 KV heads x (64 + 64) x 2 bytes = 512 f16 bytes per layer and token: at 512
         * tokens 512 * (512 + 32) bytes, beyond the window only layer 1 grows */
        json_t *sw = json_object_get(json_object_get(o, "kv_cache"), "sliding_window");
        if (strcmp(arch, "gemma2") == 0 || strcmp(arch, "gemma3") == 0) {
            json_t *ll = json_object_get(sw, "local_layers");
            if (!sw || json_integer_value(json_object_get(sw, "window")) != 32 ||
                json_array_size(ll) != 1 || json_integer_value(json_array_get(ll, 0)) != 0 ||
                json_integer_value(json_object_get(json_object_get(sw, "bytes_at_tokens"),
                                                   "f16")) != 512 * (512 + 32) ||
                json_integer_value(json_object_get(
                    json_object_get(sw, "bytes_per_token_beyond_window"), "f16")) != 512) {
                fprintf(stderr, "%s: window layers not counted by their window\n", stem);
                bad++;
            }
        } else if (sw) {
            fprintf(stderr, "%s: a sliding window where there is none\n", stem);
            bad++;
        }
        json_decref(o);
        if (bad) {
            closedir(d);
            T_FAIL("%s: inspect differs from tensor-types.md", stem);
        }
        n_models++;
    }
    closedir(d);
    printf("     inspect: architecture and tensor types of %d reference models\n", n_models);
    T_ASSERT(n_models >= 7);
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
    snprintf(probe, sizeof probe, "%s/models/tiny-phi3-f16/tiny-phi3-f16.gguf", refdir);
    T_RUN(test_each_arch_loads_runs_and_inspects);
    T_RUN(test_llama_default_unchanged);
    T_RUN(test_bad_arch);
    if (!t_is_file(probe)) {
        if (t_failed) T_DONE();
        T_SKIP("the reference set (../shared/models/reference) not found: the comparison with "
               "its models left out");
    }
    T_RUN(test_same_tensors_and_keys_as_reference);
    T_RUN(test_inspect_reference_models);
    T_DONE();
}
