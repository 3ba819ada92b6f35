/* SPDX-License-Identifier: MIT */
/*
 * fuzz_gguf.c - fuzz target for the GGUF reader (engine/gguf/gguf.c) and value renderer
 * (gguf_render.c), the parsers of outside input behind `pagoda run` and `pagoda inspect`.
 * The input is a whole file, opened with pe_gguf_open_memory. A refused file must come with
 * a one-line message; an accepted one is walked completely: every kv rendered
 * (pe_gguf_kv_to_string, with a roomy and a tiny buffer) and read through the typed getters
 * and array accessors, every tensor looked up by name and its first and last data bytes
 * read. Any broken invariant aborts; ASan catches reads outside the input. Built as a
 * libFuzzer target with -DPGD_FUZZ=ON (clang), and always as a corpus replayer
 * (replay_main.c) that ctest runs over corpus/gguf/.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Reads a value so that ASan sees the access and the compiler cannot drop it. */
static volatile uint64_t sink;

static void walk_kv(const pe_gguf_file *f, const pe_gguf_kv *kv)
{
    char key[256], buf[512], tiny[7];
    uint32_t u32;
    uint64_t u64;
    int32_t i32;
    float f32;
    int b;
    pe_gguf_str s;
    const pe_gguf_kv *arr;

    pe_gguf_kv_to_string(kv, buf, sizeof buf);
    if (!memchr(buf, '\0', sizeof buf)) abort();
    pe_gguf_kv_to_string(kv, tiny, sizeof tiny);
    if (!memchr(tiny, '\0', sizeof tiny)) abort();
    if (kv->type >= PE_GGUF_TYPE_COUNT) abort();

    if (kv->key.len >= sizeof key || memchr(kv->key.ptr, '\0', kv->key.len)) return;
    memcpy(key, kv->key.ptr, kv->key.len);
    key[kv->key.len] = '\0';
    if (pe_gguf_find_kv(f, key) != kv) abort(); /* keys are unique */
    sink += (uint64_t)pe_gguf_get_u32(f, key, &u32);
    sink += (uint64_t)pe_gguf_get_u64(f, key, &u64);
    sink += (uint64_t)pe_gguf_get_i32(f, key, &i32);
    sink += (uint64_t)pe_gguf_get_f32(f, key, &f32);
    sink += (uint64_t)pe_gguf_get_bool(f, key, &b);
    if (pe_gguf_get_str(f, key, &s) == 0 && s.len) sink += (uint8_t)s.ptr[s.len - 1];
    if (kv->type != PE_GGUF_TYPE_ARRAY) return;
    if (pe_gguf_get_arr(f, key, kv->arr_type, &arr) != 0 || arr != kv) abort();
    if ((kv->arr_type == PE_GGUF_TYPE_STRING) != (kv->strs != NULL)) abort();
    for (uint64_t i = 0; i < kv->n && i < 64; i++) {
        uint64_t j = kv->n - 1 - i;
        pe_gguf_str a = pe_gguf_arr_str(kv, j);
        if (a.len) sink += (uint8_t)a.ptr[0] + (uint8_t)a.ptr[a.len - 1];
        sink += (uint64_t)pe_gguf_arr_i64(kv, j);
        sink += pe_gguf_arr_f64(kv, i) != 0.0;
    }
    sink += (uint64_t)pe_gguf_arr_i64(kv, kv->n);
    sink += pe_gguf_arr_str(kv, kv->n).len;
}

static void walk_tensor(const pe_gguf_file *f, const pe_gguf_tensor *t)
{
    const uint8_t *base, *d = t->data;
    char name[256];
    uint64_t n = 1;

    if (t->n_dims < 1 || t->n_dims > 4 || !pe_ggml_get_traits(t->type)) abort();
    for (uint32_t i = 0; i < 4; i++) {
        if (t->ne[i] == 0 || (i >= t->n_dims && t->ne[i] != 1)) abort();
        n *= t->ne[i];
    }
    if (n == 0 || t->n_bytes == 0 || t->offset % pe_gguf_alignment(f) != 0) abort();
    if (pe_ggml_row_size(t->type, t->ne[0]) * (n / t->ne[0]) != t->n_bytes) abort();
    base = (const uint8_t *)t->data - pe_gguf_data_offset(f) - t->offset;
    if (pe_gguf_data_offset(f) + t->offset + t->n_bytes > pe_gguf_file_size(f)) abort();
    sink += d[0] + d[t->n_bytes - 1] + base[0];
    if (t->name.len >= sizeof name || memchr(t->name.ptr, '\0', t->name.len)) return;
    memcpy(name, t->name.ptr, t->name.len);
    name[t->name.len] = '\0';
    if (pe_gguf_find_tensor(f, name) != t) abort(); /* names are unique */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pe_gguf_file *f = NULL;
    char err[256];

    memset(err, 'x', sizeof err);
    if (pe_gguf_open_memory(data, size, &f, err, sizeof err) != 0) {
        if (f || !memchr(err, '\0', sizeof err) || err[0] == '\0' || strchr(err, '\n')) abort();
        return 0;
    }
    if (pe_gguf_version(f) != 2 && pe_gguf_version(f) != 3) abort();
    if (pe_gguf_file_size(f) != size || pe_gguf_alignment(f) == 0) abort();
    if ((pe_gguf_alignment(f) & (pe_gguf_alignment(f) - 1)) != 0) abort();
    for (uint64_t i = 0; i < pe_gguf_n_kv(f); i++)
        walk_kv(f, pe_gguf_kv_at(f, i));
    for (uint64_t i = 0; i < pe_gguf_n_tensors(f); i++)
        walk_tensor(f, pe_gguf_tensor_at(f, i));
    if (pe_gguf_kv_at(f, pe_gguf_n_kv(f)) || pe_gguf_tensor_at(f, pe_gguf_n_tensors(f))) abort();
    pe_gguf_close(f);
    return 0;
}
