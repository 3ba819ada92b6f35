/* SPDX-License-Identifier: MIT */
/*
 * inspect.c - `pagoda inspect MODEL.gguf [--json]`: what a GGUF file holds, read through
 * the engine's GGUF reader (engine/gguf/gguf.h), which validates the whole file first.
 *
 * Prints the file header (version, alignment, size), the architecture and its
 * hyper-parameters (every `<arch>.*` key), the tokenizer summary, every other metadata
 * key summarised, the tensor table with totals per type, and the KV cache bytes per
 * token for f32 and f16 elements:
 *     2 (K and V) * n_layers * n_kv_heads * head_dim * element size
 * with head_dim = embedding_length / head_count unless attention.key_length (and
 * attention.value_length) are given; a per-layer head_count_kv array is summed. When K and
 * V share one head_dim and every layer the same KV head count, it also lists the bytes per
 * token of every KV codec libpagoda has (pgd_kv_bytes_per_token, 16-token pages: block
 * scales and padding included), marking the codecs that refuse the head_dim.
 * gemma2 / gemma3 files with attention.sliding_window W (and a uniform KV head count) also
 * get their window layers counted by their window: layer l is local when l % P < P - 1,
 * P = attention.sliding_window_pattern, else llama.cpp's default (2 gemma2, 6 gemma3); a
 * local layer holds at most W tokens, so at context C the cache holds
 *     (n_global * C + n_local * min(W, C)) * n_kv_heads * (K + V) * element size
 * and beyond W tokens only the global layers grow.
 * A file the reader refuses prints its message and exits 1.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli.h"
#include "gguf.h"
#include "pagoda/pool.h"

/* Pages of this many tokens for the per-codec sizes (the engine's default). */
#define INSPECT_PAGE_TOKENS 16

/* Hyper-parameters listed first, in this order, when the architecture has them. */
static const char *const known_hparams[] = {
    "context_length",
    "embedding_length",
    "block_count",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "rope.freq_base",
    "rope.dimension_count",
    "attention.layer_norm_rms_epsilon",
    "attention.layer_norm_epsilon",
    "vocab_size",
};

static void usage(FILE *f, const char *cmd)
{
    fprintf(f,
            "usage: %s [--json] MODEL.gguf\n"
            "\n"
            "Validates a GGUF file (v2 or v3) and shows what it holds: version, alignment and\n"
            "size; the architecture and its hyper-parameters; the tokenizer (model, pre-\n"
            "tokenizer, token count, special ids, merges, chat template); every other\n"
            "metadata key, summarised; the tensor table (name, type, shape, bytes) with\n"
            "totals per type; and the KV cache bytes per token for f32 and f16 elements,\n"
            "per 1k tokens and at the model's context length, and for every KV codec\n"
            "(f32 f16 bf16 q8_0 q4_0 kivi2, 16-token pages); gemma2/gemma3 window\n"
            "layers counted by their window. A bad file prints the reader's message and\n"
            "exits 1.\n"
            "\n"
            "options:\n"
            "  --json       print one JSON object instead of text\n"
            "  -h, --help   show this help\n",
            cmd);
}

/* ---- helpers ---- */

/* Copies s into out as printable text: control bytes become '?', at most max bytes (then
 * "..."). UTF-8 is kept as is. */
static const char *show(pe_gguf_str s, size_t max, char *out, size_t outlen)
{
    size_t o = 0;
    for (uint64_t i = 0; i < s.len && o + 4 < outlen; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        if (i == max) {
            memcpy(out + o, "...", 3);
            o += 3;
            break;
        }
        out[o] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
        o++;
    }
    out[o] = '\0';
    return out;
}

/* A JSON string from file bytes; "?" replaces the string when it is not valid UTF-8. */
static json_t *jstr(pe_gguf_str s)
{
    json_t *j = json_stringn(s.ptr, s.len);
    return j ? j : json_string("?");
}

static void human_bytes(double b, char *out, size_t n)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) {
        b /= 1024;
        u++;
    }
    if (u == 0) {
        snprintf(out, n, "%.0f B", b);
    } else {
        snprintf(out, n, "%.2f %s", b, units[u]);
    }
}

/* key = prefix + suffix */
static const pe_gguf_kv *find2(const pe_gguf_file *f, const char *prefix, const char *suffix)
{
    char key[256];
    snprintf(key, sizeof key, "%s%s", prefix, suffix);
    return pe_gguf_find_kv(f, key);
}

static int get_u64_2(const pe_gguf_file *f, const char *prefix, const char *suffix, uint64_t *v)
{
    char key[256];
    snprintf(key, sizeof key, "%s%s", prefix, suffix);
    return pe_gguf_get_u64(f, key, v);
}

/* Marks a kv as shown in an earlier section, so "metadata" does not repeat it. */
static void mark(const pe_gguf_file *f, const pe_gguf_kv *kv, unsigned char *shown)
{
    if (kv) shown[kv - pe_gguf_kv_at(f, 0)] = 1;
}

/* ---- the KV cache size ---- */

typedef struct kv_size {
    int ok;
    const char *missing; /* the key that made it impossible */
    uint64_t n_layers;
    uint64_t kv_heads; /* summed over layers when per-layer; else per layer */
    int per_layer;     /* head_count_kv is a per-layer array */
    uint64_t k_len, v_len;
    uint64_t head_units; /* sum over layers of n_kv_heads * (k_len + v_len) */
    uint64_t ctx;        /* context_length, 0 if absent */
    uint64_t window;     /* sliding window (gemma2/gemma3), 0 if none */
    uint64_t period;     /* sliding_window_pattern: layer l is local when l % period < period-1 */
    uint64_t n_local;    /* layers that keep only their window */
} kv_size;

/* Bytes of K and V for t tokens with elements of elem bytes, window layers counted by their
 * window (k->window > 0, uniform head count). */
static uint64_t window_bytes(const kv_size *k, uint64_t t, uint64_t elem)
{
    uint64_t per_layer_tok = k->kv_heads * (k->k_len + k->v_len) * elem;
    uint64_t local_t = t < k->window ? t : k->window;
    return per_layer_tok * ((k->n_layers - k->n_local) * t + k->n_local * local_t);
}

static kv_size kv_cache_size(const pe_gguf_file *f, const char *p)
{
    kv_size k;
    uint64_t n_embd = 0, n_head = 0;
    const pe_gguf_kv *hkv;
    memset(&k, 0, sizeof k);
    if (get_u64_2(f, p, "block_count", &k.n_layers) != 0 || k.n_layers == 0) {
        k.missing = "block_count";
        return k;
    }
    hkv = find2(f, p, "attention.head_count");
    if (hkv && hkv->type == PE_GGUF_TYPE_ARRAY && hkv->n > 0) {
        n_head = (uint64_t)pe_gguf_arr_i64(hkv, 0);
    } else if (get_u64_2(f, p, "attention.head_count", &n_head) != 0) {
        n_head = 0;
    }
    if (get_u64_2(f, p, "attention.key_length", &k.k_len) != 0) {
        if (n_head == 0 || get_u64_2(f, p, "embedding_length", &n_embd) != 0) {
            k.missing = n_head == 0 ? "attention.head_count" : "embedding_length";
            return k;
        }
        k.k_len = n_embd / n_head;
    }
    if (get_u64_2(f, p, "attention.value_length", &k.v_len) != 0) k.v_len = k.k_len;
    hkv = find2(f, p, "attention.head_count_kv");
    if (hkv && hkv->type == PE_GGUF_TYPE_ARRAY) {
        k.per_layer = 1;
        for (uint64_t l = 0; l < hkv->n && l < k.n_layers; l++) {
            int64_t h = pe_gguf_arr_i64(hkv, l);
            k.kv_heads += h > 0 ? (uint64_t)h : 0;
        }
        k.head_units = k.kv_heads * (k.k_len + k.v_len);
    } else {
        if (get_u64_2(f, p, "attention.head_count_kv", &k.kv_heads) != 0) k.kv_heads = n_head;
        if (k.kv_heads == 0) {
            k.missing = "attention.head_count_kv";
            return k;
        }
        k.head_units = k.n_layers * k.kv_heads * (k.k_len + k.v_len);
    }
    if (get_u64_2(f, p, "context_length", &k.ctx) != 0) k.ctx = 0;
    if (!k.per_layer && (strcmp(p, "gemma2.") == 0 || strcmp(p, "gemma3.") == 0) &&
        get_u64_2(f, p, "attention.sliding_window", &k.window) == 0 && k.window > 0) {
        if (get_u64_2(f, p, "attention.sliding_window_pattern", &k.period) != 0)
            k.period = strcmp(p, "gemma2.") == 0 ? 2 : 6;
        for (uint64_t l = 0; l < k.n_layers; l++)
            k.n_local += k.period == 0 || l % k.period < k.period - 1;
    } else {
        k.window = 0;
    }
    k.ok = k.head_units > 0;
    if (!k.ok) k.missing = "attention.key_length";
    return k;
}

/* K+V bytes per token of codec t for this geometry, or 0 when it is not uniform (per-layer
 * head counts, K and V of different lengths) or the codec refuses the head_dim. */
static double codec_bytes(const kv_size *k, pgd_kv_type t)
{
    if (!k->ok || k->per_layer || k->k_len != k->v_len || k->n_layers > UINT32_MAX ||
        k->kv_heads > UINT32_MAX || k->k_len > UINT32_MAX)
        return 0;
    return pgd_kv_bytes_per_token(t, INSPECT_PAGE_TOKENS, (uint32_t)k->n_layers,
                                  (uint32_t)k->kv_heads, (uint32_t)k->k_len);
}

static const pgd_kv_type all_codecs[] = {PGD_KV_F32,  PGD_KV_F16,  PGD_KV_BF16,
                                         PGD_KV_Q8_0, PGD_KV_Q4_0, PGD_KV_KIVI2};
#define N_CODECS (sizeof all_codecs / sizeof all_codecs[0])

/* ---- tensor totals per type ---- */

typedef struct type_total {
    uint64_t n_tensors, n_params, n_bytes;
} type_total;

static void tensor_totals(const pe_gguf_file *f, type_total tot[PE_GGML_TYPE_COUNT],
                          type_total *all)
{
    memset(tot, 0, sizeof(type_total) * PE_GGML_TYPE_COUNT);
    memset(all, 0, sizeof *all);
    for (uint64_t i = 0; i < pe_gguf_n_tensors(f); i++) {
        const pe_gguf_tensor *t = pe_gguf_tensor_at(f, i);
        uint64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        tot[t->type].n_tensors++;
        tot[t->type].n_params += n;
        tot[t->type].n_bytes += t->n_bytes;
        all->n_tensors++;
        all->n_params += n;
        all->n_bytes += t->n_bytes;
    }
}

static void shape_str(const pe_gguf_tensor *t, char *out, size_t n)
{
    size_t o = 0;
    for (uint32_t d = 0; d < t->n_dims && o < n; d++) {
        int k = snprintf(out + o, n - o, "%s%llu", d ? ", " : "[", (unsigned long long)t->ne[d]);
        if (k < 0) break;
        o += (size_t)k;
    }
    if (o < n) snprintf(out + o, n - o, "]");
}

/* ---- text output ---- */

static void print_kv_line(const char *label, const pe_gguf_kv *kv)
{
    char buf[1024];
    pe_gguf_kv_to_string(kv, buf, sizeof buf);
    printf("  %-34s %s\n", label, buf);
}

static void print_tokenizer(const pe_gguf_file *f, unsigned char *shown)
{
    static const char *const ids[][2] = {
        {"tokenizer.ggml.bos_token_id", "bos id"},
        {"tokenizer.ggml.eos_token_id", "eos id"},
        {"tokenizer.ggml.unknown_token_id", "unk id"},
        {"tokenizer.ggml.padding_token_id", "padding id"},
        {"tokenizer.ggml.add_bos_token", "add_bos_token"},
        {"tokenizer.ggml.add_eos_token", "add_eos_token"},
        {"tokenizer.ggml.add_space_prefix", "add_space_prefix"},
    };
    const pe_gguf_kv *kv;
    pe_gguf_str s;
    char buf[256];

    printf("\ntokenizer\n");
    kv = pe_gguf_find_kv(f, "tokenizer.ggml.model");
    mark(f, kv, shown);
    if (pe_gguf_get_str(f, "tokenizer.ggml.model", &s) == 0) {
        printf("  %-34s %s\n", "model", show(s, 64, buf, sizeof buf));
    } else {
        printf("  %-34s (none)\n", "model");
    }
    kv = pe_gguf_find_kv(f, "tokenizer.ggml.pre");
    mark(f, kv, shown);
    if (pe_gguf_get_str(f, "tokenizer.ggml.pre", &s) == 0) {
        printf("  %-34s %s\n", "pre", show(s, 64, buf, sizeof buf));
    }
    kv = pe_gguf_find_kv(f, "tokenizer.ggml.tokens");
    mark(f, kv, shown);
    printf("  %-34s %llu\n", "tokens", kv ? (unsigned long long)kv->n : 0ull);
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        kv = pe_gguf_find_kv(f, ids[i][0]);
        if (!kv) continue;
        mark(f, kv, shown);
        print_kv_line(ids[i][1], kv);
    }
    kv = pe_gguf_find_kv(f, "tokenizer.ggml.merges");
    if (kv) {
        printf("  %-34s yes (%llu)\n", "merges", (unsigned long long)kv->n);
    } else {
        printf("  %-34s no\n", "merges");
    }
    kv = pe_gguf_find_kv(f, "tokenizer.chat_template");
    mark(f, kv, shown);
    if (pe_gguf_get_str(f, "tokenizer.chat_template", &s) == 0) {
        const char *nl = memchr(s.ptr, '\n', s.len);
        pe_gguf_str first = {s.ptr, nl ? (uint64_t)(nl - s.ptr) : s.len};
        printf("  %-34s yes: %s%s\n", "chat template", show(first, 100, buf, sizeof buf),
               nl ? " ..." : "");
    } else {
        printf("  %-34s no\n", "chat template");
    }
}

static void print_kv_cache(const kv_size *k)
{
    static const struct {
        const char *name;
        uint64_t size;
    } types[] = {{"f32", 4}, {"f16", 2}};
    if (!k->ok) {
        printf("\nKV cache: unknown (missing %s)\n", k->missing);
        return;
    }
    if (k->per_layer) {
        printf("\nKV cache bytes per token = %llu KV heads summed over %llu layers x (K %llu + "
               "V %llu) x element size\n",
               (unsigned long long)k->kv_heads, (unsigned long long)k->n_layers,
               (unsigned long long)k->k_len, (unsigned long long)k->v_len);
    } else if (k->k_len == k->v_len) {
        printf("\nKV cache bytes per token = 2 x %llu layers x %llu KV heads x head_dim %llu x "
               "element size\n",
               (unsigned long long)k->n_layers, (unsigned long long)k->kv_heads,
               (unsigned long long)k->k_len);
    } else {
        printf("\nKV cache bytes per token = %llu layers x %llu KV heads x (K %llu + V %llu) x "
               "element size\n",
               (unsigned long long)k->n_layers, (unsigned long long)k->kv_heads,
               (unsigned long long)k->k_len, (unsigned long long)k->v_len);
    }
    for (size_t i = 0; i < 2; i++) {
        uint64_t per_tok = k->head_units * types[i].size;
        char b1[32], b2[32];
        human_bytes((double)per_tok * 1000, b1, sizeof b1);
        printf("  %-4s KV bytes per token %llu, per 1k tokens %s", types[i].name,
               (unsigned long long)per_tok, b1);
        if (k->ctx) {
            human_bytes((double)per_tok * (double)k->ctx, b2, sizeof b2);
            printf(", at context %llu %s", (unsigned long long)k->ctx, b2);
        }
        printf("\n");
    }
    if (k->window) {
        printf("sliding window %llu tokens on %llu of %llu layers (period %llu): a window layer "
               "keeps at most %llu tokens; beyond them only the %llu global layer(s) grow\n",
               (unsigned long long)k->window, (unsigned long long)k->n_local,
               (unsigned long long)k->n_layers, (unsigned long long)k->period,
               (unsigned long long)k->window, (unsigned long long)(k->n_layers - k->n_local));
        for (size_t i = 0; i < 2; i++) {
            uint64_t t = k->ctx ? k->ctx : 1000;
            uint64_t b = window_bytes(k, t, types[i].size), full = k->head_units * types[i].size;
            char b1[32];
            human_bytes((double)b, b1, sizeof b1);
            printf(
                "  %-4s window layers counted by their window: at %llu tokens%s %s (%.1f%% of %llu "
                "bytes), %llu bytes per token beyond the window\n",
                types[i].name, (unsigned long long)t, k->ctx ? " (the context)" : "", b1,
                100.0 * (double)b / ((double)full * (double)t), (unsigned long long)(full * t),
                (unsigned long long)(window_bytes(k, k->window + 1, types[i].size) -
                                     window_bytes(k, k->window, types[i].size)));
        }
    }
    double f16 = codec_bytes(k, PGD_KV_F16);
    if (f16 <= 0) return;
    printf("KV bytes per token by codec (%u-token pages, scales included):\n", INSPECT_PAGE_TOKENS);
    for (size_t i = 0; i < N_CODECS; i++) {
        double b = codec_bytes(k, all_codecs[i]);
        if (b <= 0) {
            printf("  %-6s refuses head_dim %llu\n", pgd_kv_type_name(all_codecs[i]),
                   (unsigned long long)k->k_len);
            continue;
        }
        char b1[32];
        human_bytes(b * 1000, b1, sizeof b1);
        printf("  %-6s %10.1f bytes per token (%.3fx f16), per 1k tokens %s\n",
               pgd_kv_type_name(all_codecs[i]), b, b / f16, b1);
    }
}

static void print_text(const char *path, const pe_gguf_file *f)
{
    uint64_t n_kv = pe_gguf_n_kv(f);
    unsigned char *shown = calloc(n_kv ? n_kv : 1, 1);
    type_total tot[PE_GGML_TYPE_COUNT], all;
    const pe_gguf_kv *kv;
    pe_gguf_str arch = {"", 0};
    char prefix[128], archs[80], buf[1024], hb[32];
    size_t plen, name_w = 4;
    kv_size k;

    if (!shown) return;
    human_bytes((double)pe_gguf_file_size(f), hb, sizeof hb);
    printf("file          %s\n", path);
    printf("version       %u\n", pe_gguf_version(f));
    printf("alignment     %llu\n", (unsigned long long)pe_gguf_alignment(f));
    printf("size          %llu bytes (%s), data at offset %llu\n",
           (unsigned long long)pe_gguf_file_size(f), hb,
           (unsigned long long)pe_gguf_data_offset(f));

    kv = pe_gguf_find_kv(f, "general.architecture");
    mark(f, kv, shown);
    if (pe_gguf_get_str(f, "general.architecture", &arch) == 0) {
        printf("architecture  %s\n", show(arch, 64, buf, sizeof buf));
    } else {
        printf("architecture  (none)\n");
    }
    kv = pe_gguf_find_kv(f, "general.name");
    mark(f, kv, shown);
    if (kv) print_kv_line("name", kv);

    /* <arch>.* keys: the known ones first, in a fixed order, then the rest in file order. */
    snprintf(prefix, sizeof prefix, "%s.", show(arch, 64, archs, sizeof archs));
    plen = strlen(prefix);
    printf("\nhyper-parameters (%s*)\n", prefix);
    for (size_t i = 0; i < sizeof known_hparams / sizeof known_hparams[0]; i++) {
        kv = find2(f, prefix, known_hparams[i]);
        if (!kv) continue;
        mark(f, kv, shown);
        print_kv_line(known_hparams[i], kv);
    }
    for (uint64_t i = 0; arch.len && i < n_kv; i++) {
        kv = pe_gguf_kv_at(f, i);
        if (shown[i] || kv->key.len <= plen || memcmp(kv->key.ptr, prefix, plen) != 0) continue;
        shown[i] = 1;
        {
            pe_gguf_str rest = {kv->key.ptr + plen, kv->key.len - plen};
            char label[128];
            print_kv_line(show(rest, 100, label, sizeof label), kv);
        }
    }

    print_tokenizer(f, shown);

    printf("\nmetadata (other keys)\n");
    for (uint64_t i = 0; i < n_kv; i++) {
        char key[160];
        if (shown[i]) continue;
        kv = pe_gguf_kv_at(f, i);
        pe_gguf_kv_to_string(kv, buf, sizeof buf);
        printf("  %-34s %s\n", show(kv->key, 120, key, sizeof key), buf);
    }
    free(shown);

    tensor_totals(f, tot, &all);
    human_bytes((double)all.n_bytes, hb, sizeof hb);
    printf("\ntensors: %llu, %llu params, %llu bytes (%s)\n", (unsigned long long)all.n_tensors,
           (unsigned long long)all.n_params, (unsigned long long)all.n_bytes, hb);
    for (uint64_t i = 0; i < pe_gguf_n_tensors(f); i++) {
        size_t n = pe_gguf_tensor_at(f, i)->name.len;
        if (n > name_w) name_w = n > 48 ? 48 : n;
    }
    if (pe_gguf_n_tensors(f)) {
        printf("  %-*s %-6s %-24s %14s\n", (int)name_w, "name", "type", "shape", "bytes");
    }
    for (uint64_t i = 0; i < pe_gguf_n_tensors(f); i++) {
        const pe_gguf_tensor *t = pe_gguf_tensor_at(f, i);
        char name[128], shape[128];
        shape_str(t, shape, sizeof shape);
        printf("  %-*s %-6s %-24s %14llu\n", (int)name_w, show(t->name, 100, name, sizeof name),
               pe_ggml_type_name(t->type), shape, (unsigned long long)t->n_bytes);
    }
    if (all.n_tensors) printf("totals by type\n");
    for (uint32_t t = 0; t < PE_GGML_TYPE_COUNT; t++) {
        if (!tot[t].n_tensors) continue;
        human_bytes((double)tot[t].n_bytes, hb, sizeof hb);
        printf("  %-6s %6llu tensors %14llu params %14llu bytes (%s)\n", pe_ggml_type_name(t),
               (unsigned long long)tot[t].n_tensors, (unsigned long long)tot[t].n_params,
               (unsigned long long)tot[t].n_bytes, hb);
    }

    k = kv_cache_size(f, prefix);
    print_kv_cache(&k);
}

/* ---- JSON output ---- */

/* A kv as a JSON value: numbers, strings and bools as such, arrays summarised as text. */
static json_t *kv_json(const pe_gguf_kv *kv)
{
    char buf[1024];
    uint64_t u;
    int64_t s;
    float f32;
    double f64;
    switch (kv->type) {
    case PE_GGUF_TYPE_UINT8:
        return json_integer(kv->data[0]);
    case PE_GGUF_TYPE_INT8:
        return json_integer((int8_t)kv->data[0]);
    case PE_GGUF_TYPE_UINT16:
    case PE_GGUF_TYPE_UINT32:
    case PE_GGUF_TYPE_UINT64:
        u = 0;
        memcpy(&u, kv->data,
               kv->type == PE_GGUF_TYPE_UINT16   ? 2
               : kv->type == PE_GGUF_TYPE_UINT32 ? 4
                                                 : 8);
        return u <= INT64_MAX ? json_integer((json_int_t)u) : json_real((double)u);
    case PE_GGUF_TYPE_INT16: {
        int16_t v;
        memcpy(&v, kv->data, 2);
        return json_integer(v);
    }
    case PE_GGUF_TYPE_INT32: {
        int32_t v;
        memcpy(&v, kv->data, 4);
        return json_integer(v);
    }
    case PE_GGUF_TYPE_INT64:
        memcpy(&s, kv->data, 8);
        return json_integer((json_int_t)s);
    case PE_GGUF_TYPE_FLOAT32:
        memcpy(&f32, kv->data, 4);
        return json_real((double)f32);
    case PE_GGUF_TYPE_FLOAT64:
        memcpy(&f64, kv->data, 8);
        return json_real(f64);
    case PE_GGUF_TYPE_BOOL:
        return json_boolean(kv->data[0] != 0);
    case PE_GGUF_TYPE_STRING: {
        pe_gguf_str str;
        memcpy(&str.len, kv->data, 8);
        str.ptr = (const char *)kv->data + 8;
        if (str.len > 4096) break; /* long strings (templates): summarised */
        return jstr(str);
    }
    default:
        break;
    }
    pe_gguf_kv_to_string(kv, buf, sizeof buf);
    return json_string(buf);
}

static void set_key(json_t *o, pe_gguf_str key, json_t *v)
{
    char k[256];
    json_object_set_new(o, show(key, 200, k, sizeof k), v ? v : json_null());
}

static int print_json(const char *path, const pe_gguf_file *f)
{
    json_t *o = json_object(), *hp = json_object(), *tok = json_object(), *meta = json_object();
    json_t *tensors = json_array(), *types = json_object(), *kvc = json_object();
    type_total tot[PE_GGML_TYPE_COUNT], all;
    pe_gguf_str arch = {"", 0}, s;
    char prefix[128], archs[80];
    size_t plen;
    const pe_gguf_kv *kv;
    kv_size k;
    int rc;

    json_object_set_new(o, "file", json_string(path));
    json_object_set_new(o, "version", json_integer(pe_gguf_version(f)));
    json_object_set_new(o, "alignment", json_integer((json_int_t)pe_gguf_alignment(f)));
    json_object_set_new(o, "size_bytes", json_integer((json_int_t)pe_gguf_file_size(f)));
    json_object_set_new(o, "data_offset", json_integer((json_int_t)pe_gguf_data_offset(f)));
    if (pe_gguf_get_str(f, "general.architecture", &arch) == 0) {
        json_object_set_new(o, "architecture", jstr(arch));
    } else {
        json_object_set_new(o, "architecture", json_null());
    }
    snprintf(prefix, sizeof prefix, "%s.", show(arch, 64, archs, sizeof archs));
    plen = strlen(prefix);
    for (uint64_t i = 0; i < pe_gguf_n_kv(f); i++) {
        kv = pe_gguf_kv_at(f, i);
        if (arch.len && kv->key.len > plen && memcmp(kv->key.ptr, prefix, plen) == 0) {
            pe_gguf_str rest = {kv->key.ptr + plen, kv->key.len - plen};
            set_key(hp, rest, kv_json(kv));
        } else {
            set_key(meta, kv->key, kv_json(kv));
        }
    }
    json_object_set_new(o, "hparams", hp);

    if (pe_gguf_get_str(f, "tokenizer.ggml.model", &s) == 0)
        json_object_set_new(tok, "model", jstr(s));
    if (pe_gguf_get_str(f, "tokenizer.ggml.pre", &s) == 0) json_object_set_new(tok, "pre", jstr(s));
    kv = pe_gguf_find_kv(f, "tokenizer.ggml.tokens");
    json_object_set_new(tok, "n_tokens", json_integer(kv ? (json_int_t)kv->n : 0));
    {
        static const char *const ids[][2] = {
            {"tokenizer.ggml.bos_token_id", "bos_token_id"},
            {"tokenizer.ggml.eos_token_id", "eos_token_id"},
            {"tokenizer.ggml.unknown_token_id", "unknown_token_id"},
            {"tokenizer.ggml.padding_token_id", "padding_token_id"},
            {"tokenizer.ggml.add_bos_token", "add_bos_token"},
            {"tokenizer.ggml.add_eos_token", "add_eos_token"},
            {"tokenizer.ggml.add_space_prefix", "add_space_prefix"},
        };
        for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
            kv = pe_gguf_find_kv(f, ids[i][0]);
            if (kv) json_object_set_new(tok, ids[i][1], kv_json(kv));
        }
    }
    kv = pe_gguf_find_kv(f, "tokenizer.ggml.merges");
    json_object_set_new(tok, "n_merges", json_integer(kv ? (json_int_t)kv->n : 0));
    if (pe_gguf_get_str(f, "tokenizer.chat_template", &s) == 0) {
        const char *nl = memchr(s.ptr, '\n', s.len);
        pe_gguf_str first = {s.ptr, nl ? (uint64_t)(nl - s.ptr) : s.len};
        json_object_set_new(tok, "chat_template", json_true());
        json_object_set_new(tok, "chat_template_first_line", jstr(first));
    } else {
        json_object_set_new(tok, "chat_template", json_false());
    }
    json_object_set_new(o, "tokenizer", tok);
    json_object_set_new(o, "metadata", meta);

    for (uint64_t i = 0; i < pe_gguf_n_tensors(f); i++) {
        const pe_gguf_tensor *t = pe_gguf_tensor_at(f, i);
        json_t *jt = json_object(), *shape = json_array();
        for (uint32_t d = 0; d < t->n_dims; d++) {
            json_array_append_new(shape, json_integer((json_int_t)t->ne[d]));
        }
        set_key(jt, (pe_gguf_str){"name", 4}, jstr(t->name));
        json_object_set_new(jt, "type", json_string(pe_ggml_type_name(t->type)));
        json_object_set_new(jt, "shape", shape);
        json_object_set_new(jt, "bytes", json_integer((json_int_t)t->n_bytes));
        json_object_set_new(jt, "offset", json_integer((json_int_t)t->offset));
        json_array_append_new(tensors, jt);
    }
    json_object_set_new(o, "tensors", tensors);
    tensor_totals(f, tot, &all);
    for (uint32_t t = 0; t < PE_GGML_TYPE_COUNT; t++) {
        if (!tot[t].n_tensors) continue;
        json_object_set_new(types, pe_ggml_type_name(t),
                            json_pack("{sIsIsI}", "tensors", (json_int_t)tot[t].n_tensors, "params",
                                      (json_int_t)tot[t].n_params, "bytes",
                                      (json_int_t)tot[t].n_bytes));
    }
    json_object_set_new(o, "types", types);
    json_object_set_new(o, "n_params", json_integer((json_int_t)all.n_params));
    json_object_set_new(o, "tensor_bytes", json_integer((json_int_t)all.n_bytes));

    k = kv_cache_size(f, prefix);
    if (k.ok) {
        json_t *pt = json_object(), *p1k = json_object(), *pctx = json_object();
        json_object_set_new(kvc, "n_layers", json_integer((json_int_t)k.n_layers));
        json_object_set_new(kvc, k.per_layer ? "n_kv_heads_total" : "n_kv_heads",
                            json_integer((json_int_t)k.kv_heads));
        json_object_set_new(kvc, "key_length", json_integer((json_int_t)k.k_len));
        json_object_set_new(kvc, "value_length", json_integer((json_int_t)k.v_len));
        json_object_set_new(kvc, "context_length", json_integer((json_int_t)k.ctx));
        json_object_set_new(pt, "f32", json_integer((json_int_t)(k.head_units * 4)));
        json_object_set_new(pt, "f16", json_integer((json_int_t)(k.head_units * 2)));
        json_object_set_new(p1k, "f32", json_integer((json_int_t)(k.head_units * 4 * 1000)));
        json_object_set_new(p1k, "f16", json_integer((json_int_t)(k.head_units * 2 * 1000)));
        json_object_set_new(pctx, "f32", json_integer((json_int_t)(k.head_units * 4 * k.ctx)));
        json_object_set_new(pctx, "f16", json_integer((json_int_t)(k.head_units * 2 * k.ctx)));
        json_object_set_new(kvc, "bytes_per_token", pt);
        json_object_set_new(kvc, "bytes_per_1k_tokens", p1k);
        json_object_set_new(kvc, "bytes_at_context", pctx);
        if (k.window) {
            json_t *sw = json_object(), *ll = json_array(), *at = json_object(),
                   *beyond = json_object();
            uint64_t t = k.ctx ? k.ctx : 1000;
            for (uint64_t l = 0; l < k.n_layers; l++) {
                if (k.period == 0 || l % k.period < k.period - 1)
                    json_array_append_new(ll, json_integer((json_int_t)l));
            }
            json_object_set_new(sw, "window", json_integer((json_int_t)k.window));
            json_object_set_new(sw, "period", json_integer((json_int_t)k.period));
            json_object_set_new(sw, "local_layers", ll);
            json_object_set_new(sw, "tokens", json_integer((json_int_t)t));
            json_object_set_new(at, "f32", json_integer((json_int_t)window_bytes(&k, t, 4)));
            json_object_set_new(at, "f16", json_integer((json_int_t)window_bytes(&k, t, 2)));
            json_object_set_new(beyond, "f32",
                                json_integer((json_int_t)(window_bytes(&k, k.window + 1, 4) -
                                                          window_bytes(&k, k.window, 4))));
            json_object_set_new(beyond, "f16",
                                json_integer((json_int_t)(window_bytes(&k, k.window + 1, 2) -
                                                          window_bytes(&k, k.window, 2))));
            json_object_set_new(sw, "bytes_at_tokens", at);
            json_object_set_new(sw, "bytes_per_token_beyond_window", beyond);
            json_object_set_new(kvc, "sliding_window", sw);
        }
        if (codec_bytes(&k, PGD_KV_F16) > 0) {
            json_t *bc = json_object();
            for (size_t i = 0; i < N_CODECS; i++) {
                double b = codec_bytes(&k, all_codecs[i]);
                json_object_set_new(bc, pgd_kv_type_name(all_codecs[i]),
                                    b > 0 ? json_real(b) : json_null());
            }
            json_object_set_new(kvc, "bytes_per_token_by_codec", bc);
            json_object_set_new(kvc, "codec_page_tokens", json_integer(INSPECT_PAGE_TOKENS));
        }
    } else {
        json_object_set_new(kvc, "missing", json_string(k.missing));
    }
    json_object_set_new(o, "kv_cache", kvc);

    rc = json_dumpf(o, stdout, JSON_PRESERVE_ORDER | JSON_INDENT(2) | JSON_REAL_PRECISION(9));
    fputc('\n', stdout);
    json_decref(o);
    return rc;
}

int cmd_inspect(int argc, char **argv)
{
    static const struct option opts[] = {
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *cmd = argv[0];
    pe_gguf_file *f;
    char err[512];
    int json = 0, opt, rc;

    optind = 0; /* glibc: full re-initialisation */
    for (;;) {
        opt = getopt_long(argc, argv, "h", opts, NULL);
        if (opt == -1) break;
        switch (opt) {
        case 'j':
            json = 1;
            break;
        case 'h':
            usage(stdout, cmd);
            return CLI_EXIT_OK;
        default:
            return cli_usage_error(cmd);
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "%s: %s\n", cmd,
                optind == argc ? "expected a GGUF file" : "expected one GGUF file");
        return cli_usage_error(cmd);
    }
    if (pe_gguf_open(argv[optind], &f, err, sizeof err) != 0) {
        fprintf(stderr, "%s: %s: %s\n", cmd, argv[optind], err);
        return CLI_EXIT_FAIL;
    }
    if (json) {
        rc = print_json(argv[optind], f);
    } else {
        print_text(argv[optind], f);
        rc = 0;
    }
    pe_gguf_close(f);
    if (rc != 0 || fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "%s: cannot write the output\n", cmd);
        return CLI_EXIT_FAIL;
    }
    return CLI_EXIT_OK;
}
