/* SPDX-License-Identifier: MIT */
/*
 * test_gguf.c - the GGUF reader, renderer and writer (engine/gguf/gguf*.c):
 *   - writer -> reader round trip of every value type, arrays, nested arrays, tensors of
 *     each supported type, v2 and v3, alignments 32 and 64, chunked tensor data;
 *   - typed getters: width conversions, absent keys, wrong types;
 *   - stories260K.gguf from ../shared/models ($PGD_MODELS_DIR) when present (else that
 *     part is left out and the program exits 77, skipped, once the rest has passed);
 *   - malformed files: truncation at every byte offset, then each header field corrupted
 *     in turn; each must fail with a message naming the field or tensor, never crash.
 * Files go to a fresh directory under $TMPDIR (or /tmp), removed at the end.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf.h"
#include "t.h"

static char g_dir[256];
static int g_missing; /* stories260K.gguf was not found */

static const char *tmp_path(const char *name)
{
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

static uint8_t *read_all(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf;
    long n;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *size = (size_t)n;
    return buf;
}

/* Tensor data is a pattern of its index and byte position, so every byte is checkable. */
static uint8_t pattern(uint64_t tensor, uint64_t pos)
{
    return (uint8_t)(tensor * 31 + pos * 7 + (pos >> 8));
}

static int fill_pattern(void *ud, uint64_t ti, void *dst, uint64_t n)
{
    uint8_t *d = dst;
    (void)ud;
    for (uint64_t i = 0; i < n; i++)
        d[i] = pattern(ti, i);
    return 0;
}

static int fill_fails(void *ud, uint64_t ti, void *dst, uint64_t n)
{
    (void)ud;
    memset(dst, 0, n);
    return ti == 1 ? -1 : 0;
}

/* Opens buf[0..size) from an exact-size copy (so ASan catches any over-read). Returns 0 on
 * success; on failure copies the message into err. */
static int open_copy(const uint8_t *buf, size_t size, char *err, size_t errlen)
{
    uint8_t *c = malloc(size ? size : 1);
    pe_gguf_file *f = NULL;
    int rc;
    memcpy(c, buf, size);
    rc = pe_gguf_open_memory(c, size, &f, err, errlen);
    if (rc == 0) {
        char s[256];
        for (uint64_t i = 0; i < pe_gguf_n_kv(f); i++)
            pe_gguf_kv_to_string(pe_gguf_kv_at(f, i), s, 256);
        pe_gguf_close(f);
    }
    free(c);
    return rc;
}

/* ---- round trip ---- */

static const uint64_t ne_q[2] = {64, 3};
static const uint64_t ne_f[3] = {5, 2, 3};

static pe_gguf_writer *make_writer(uint32_t version, uint64_t align)
{
    pe_gguf_writer *w = pe_gguf_writer_create(version, align);
    uint8_t u8 = 200;
    int8_t i8 = -100;
    uint16_t u16 = 60000;
    int16_t i16 = -30000;
    int64_t i64 = -((int64_t)1 << 40);
    double f64 = 3.25e100;
    static const uint32_t arr_u32[4] = {1, 2, 3, 4000000000u};
    static const int8_t arr_i8[3] = {-1, 0, 127};
    static const float arr_f32[3] = {0.5f, -2.0f, 1e-5f};
    static const double arr_f64[2] = {1.5, -7.25};
    static const uint8_t arr_bool[3] = {1, 0, 1};
    static const int64_t arr_i64[2] = {INT64_MIN, INT64_MAX};
    pe_gguf_str strs[3] = {{"alpha", 5},
                           {"", 0},
                           {"\xe2\x96\x81"
                            "b\n",
                            5}};

    if (!w) return NULL;
    pe_gguf_writer_set_str(w, "general.architecture", "llama");
    pe_gguf_writer_set_str(w, "general.name", "round trip");
    pe_gguf_writer_set_val(w, "t.u8", PE_GGUF_TYPE_UINT8, &u8);
    pe_gguf_writer_set_val(w, "t.i8", PE_GGUF_TYPE_INT8, &i8);
    pe_gguf_writer_set_val(w, "t.u16", PE_GGUF_TYPE_UINT16, &u16);
    pe_gguf_writer_set_val(w, "t.i16", PE_GGUF_TYPE_INT16, &i16);
    pe_gguf_writer_set_u32(w, "t.u32", 4000000000u);
    pe_gguf_writer_set_i32(w, "t.i32", -5);
    pe_gguf_writer_set_f32(w, "t.f32", 0.125f);
    pe_gguf_writer_set_bool(w, "t.bool", 1);
    pe_gguf_writer_set_u64(w, "t.u64", UINT64_MAX);
    pe_gguf_writer_set_val(w, "t.i64", PE_GGUF_TYPE_INT64, &i64);
    pe_gguf_writer_set_val(w, "t.f64", PE_GGUF_TYPE_FLOAT64, &f64);
    pe_gguf_writer_set_arr(w, "a.u32", PE_GGUF_TYPE_UINT32, arr_u32, 4);
    pe_gguf_writer_set_arr(w, "a.i8", PE_GGUF_TYPE_INT8, arr_i8, 3);
    pe_gguf_writer_set_arr(w, "a.f32", PE_GGUF_TYPE_FLOAT32, arr_f32, 3);
    pe_gguf_writer_set_arr(w, "a.f64", PE_GGUF_TYPE_FLOAT64, arr_f64, 2);
    pe_gguf_writer_set_arr(w, "a.bool", PE_GGUF_TYPE_BOOL, arr_bool, 3);
    pe_gguf_writer_set_arr(w, "a.i64", PE_GGUF_TYPE_INT64, arr_i64, 2);
    pe_gguf_writer_set_arr(w, "a.empty", PE_GGUF_TYPE_UINT16, NULL, 0);
    pe_gguf_writer_set_arr_str(w, "a.str", strs, 3);
    pe_gguf_writer_set_i32(w, "t.replaced", 1);
    pe_gguf_writer_set_i32(w, "t.replaced", 2); /* replaces, does not duplicate */
    pe_gguf_writer_add_tensor(w, "w.q8", PE_GGML_TYPE_Q8_0, 2, ne_q);
    pe_gguf_writer_add_tensor(w, "w.f32", PE_GGML_TYPE_F32, 3, ne_f);
    pe_gguf_writer_add_tensor(w, "w.q4", PE_GGML_TYPE_Q4_0, 2, ne_q);
    pe_gguf_writer_add_tensor(w, "w.f16", PE_GGML_TYPE_F16, 1, ne_f);
    pe_gguf_writer_add_tensor(w, "w.bf16", PE_GGML_TYPE_BF16, 2, ne_q);
    return w;
}

static int check_file(const pe_gguf_file *f, uint32_t version, uint64_t align)
{
    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    float f32;
    int b;
    pe_gguf_str s;
    const pe_gguf_kv *kv;
    const pe_gguf_tensor *t;
    char buf[256];

    T_EQ(pe_gguf_version(f), version);
    T_EQ(pe_gguf_alignment(f), align);
    T_EQ(pe_gguf_data_offset(f) % align, 0);
    T_EQ(pe_gguf_n_kv(f), 22 + (align != 32));
    T_EQ(pe_gguf_n_tensors(f), 5);

    T_EQ(pe_gguf_get_str(f, "general.name", &s), 0);
    T_ASSERT(pe_gguf_str_eq(s, "round trip"));
    T_EQ(pe_gguf_get_u32(f, "t.u8", &u32), 0);
    T_EQ(u32, 200);
    T_EQ(pe_gguf_get_i32(f, "t.i8", &i32), 0);
    T_EQ(i32, -100);
    T_EQ(pe_gguf_get_u32(f, "t.u16", &u32), 0);
    T_EQ(u32, 60000);
    T_EQ(pe_gguf_get_i32(f, "t.i16", &i32), 0);
    T_EQ(i32, -30000);
    T_EQ(pe_gguf_get_u32(f, "t.u32", &u32), 0);
    T_EQ(u32, 4000000000u);
    T_EQ(pe_gguf_get_i32(f, "t.u32", &i32), -2); /* does not fit */
    T_EQ(pe_gguf_get_i32(f, "t.i32", &i32), 0);
    T_EQ(i32, -5);
    T_EQ(pe_gguf_get_u32(f, "t.i32", &u32), -2); /* negative */
    T_EQ(pe_gguf_get_u64(f, "t.i32", &u64), -2);
    T_EQ(pe_gguf_get_f32(f, "t.f32", &f32), 0);
    T_ASSERT(f32 == 0.125f);
    T_EQ(pe_gguf_get_f32(f, "t.f64", &f32), 0);
    T_ASSERT(f32 == (float)3.25e100);
    T_EQ(pe_gguf_get_f32(f, "t.i32", &f32), -2);
    T_EQ(pe_gguf_get_bool(f, "t.bool", &b), 0);
    T_EQ(b, 1);
    T_EQ(pe_gguf_get_bool(f, "t.u8", &b), -2);
    T_EQ(pe_gguf_get_u64(f, "t.u64", &u64), 0);
    T_ASSERT(u64 == UINT64_MAX);
    T_EQ(pe_gguf_get_u32(f, "t.u64", &u32), -2);
    T_EQ(pe_gguf_get_i32(f, "t.replaced", &i32), 0);
    T_EQ(i32, 2);
    T_EQ(pe_gguf_get_u32(f, "absent", &u32), -1);
    T_EQ(pe_gguf_get_str(f, "t.u32", &s), -2);
    kv = pe_gguf_find_kv(f, "t.i64");
    T_ASSERT(kv && kv->type == PE_GGUF_TYPE_INT64);
    pe_gguf_kv_to_string(kv, buf, sizeof buf);
    T_ASSERT(strcmp(buf, "-1099511627776") == 0);
    kv = pe_gguf_find_kv(f, "t.f64");
    pe_gguf_kv_to_string(kv, buf, sizeof buf);
    T_ASSERT(strcmp(buf, "3.25e+100") == 0);

    T_EQ(pe_gguf_get_arr(f, "a.u32", PE_GGUF_TYPE_UINT32, &kv), 0);
    T_EQ(kv->n, 4);
    T_EQ(pe_gguf_arr_i64(kv, 3), 4000000000ll);
    T_EQ(pe_gguf_arr_i64(kv, 4), 0); /* out of range */
    T_EQ(pe_gguf_get_arr(f, "a.u32", PE_GGUF_TYPE_INT32, &kv), -2);
    T_EQ(pe_gguf_get_arr(f, "a.i8", PE_GGUF_TYPE_INT8, &kv), 0);
    T_EQ(pe_gguf_arr_i64(kv, 0), -1);
    T_ASSERT(pe_gguf_arr_f64(kv, 2) == 127.0);
    T_EQ(pe_gguf_get_arr(f, "a.f32", PE_GGUF_TYPE_FLOAT32, &kv), 0);
    T_ASSERT(pe_gguf_arr_f64(kv, 2) == (double)1e-5f);
    T_EQ(pe_gguf_arr_i64(kv, 1), -2);
    T_EQ(pe_gguf_get_arr(f, "a.f64", PE_GGUF_TYPE_FLOAT64, &kv), 0);
    T_ASSERT(pe_gguf_arr_f64(kv, 1) == -7.25);
    T_EQ(pe_gguf_get_arr(f, "a.bool", PE_GGUF_TYPE_BOOL, &kv), 0);
    T_EQ(pe_gguf_arr_i64(kv, 1), 0);
    T_EQ(pe_gguf_arr_i64(kv, 2), 1);
    T_EQ(pe_gguf_get_arr(f, "a.i64", PE_GGUF_TYPE_INT64, &kv), 0);
    T_ASSERT(pe_gguf_arr_i64(kv, 0) == INT64_MIN && pe_gguf_arr_i64(kv, 1) == INT64_MAX);
    T_EQ(pe_gguf_get_arr(f, "a.empty", PE_GGUF_TYPE_UINT16, &kv), 0);
    T_EQ(kv->n, 0);
    pe_gguf_kv_to_string(kv, buf, sizeof buf);
    T_ASSERT(strcmp(buf, "[0 x u16] []") == 0);
    T_EQ(pe_gguf_get_arr(f, "a.str", PE_GGUF_TYPE_STRING, &kv), 0);
    T_EQ(kv->n, 3);
    T_ASSERT(kv->strs != NULL);
    T_ASSERT(pe_gguf_str_eq(pe_gguf_arr_str(kv, 0), "alpha"));
    T_EQ(pe_gguf_arr_str(kv, 1).len, 0);
    T_ASSERT(pe_gguf_str_eq(pe_gguf_arr_str(kv, 2), "\xe2\x96\x81"
                                                    "b\n"));
    T_EQ(pe_gguf_arr_str(kv, 3).len, 0);
    pe_gguf_kv_to_string(kv, buf, sizeof buf);
    T_ASSERT(strcmp(buf, "[3 x string] [\"alpha\", \"\", \"\xe2\x96\x81"
                         "b\\n\"]") == 0);
    /* A small buffer truncates with "..." and stays terminated. */
    pe_gguf_kv_to_string(kv, buf, 12);
    T_ASSERT(strlen(buf) < 12 && strstr(buf, "...") != NULL);

    T_ASSERT(pe_gguf_find_tensor(f, "w.missing") == NULL);
    T_ASSERT(pe_gguf_tensor_at(f, 5) == NULL);
    T_ASSERT(pe_gguf_kv_at(f, pe_gguf_n_kv(f)) == NULL);
    for (uint64_t i = 0; i < 5; i++) {
        char name[64];
        const uint8_t *d;
        t = pe_gguf_tensor_at(f, i);
        T_ASSERT(t != NULL);
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        T_ASSERT(pe_gguf_find_tensor(f, name) == t);
        T_EQ(t->offset % align, 0);
        d = t->data;
        for (uint64_t j = 0; j < t->n_bytes; j++) {
            if (d[j] != pattern(i, j)) T_FAIL("tensor %s byte %llu", name, (unsigned long long)j);
        }
    }
    t = pe_gguf_find_tensor(f, "w.q8");
    T_EQ(t->type, PE_GGML_TYPE_Q8_0);
    T_EQ(t->n_dims, 2);
    T_EQ(t->ne[0], 64);
    T_EQ(t->ne[1], 3);
    T_EQ(t->ne[2], 1);
    T_EQ(t->n_bytes, 2 * 34 * 3);
    t = pe_gguf_find_tensor(f, "w.f32");
    T_EQ(t->n_dims, 3);
    T_EQ(t->n_bytes, 5 * 2 * 3 * 4);
    T_EQ(pe_gguf_find_tensor(f, "w.q4")->n_bytes, 2 * 18 * 3);
    T_EQ(pe_gguf_find_tensor(f, "w.f16")->n_bytes, 10);
    T_EQ(pe_gguf_find_tensor(f, "w.bf16")->n_bytes, 64 * 2 * 3);
    return 0;
}

static int test_round_trip(void)
{
    static const uint32_t versions[2] = {3, 2};
    static const uint64_t aligns[2] = {32, 64};
    for (int v = 0; v < 2; v++) {
        for (int a = 0; a < 2; a++) {
            char err[256];
            pe_gguf_writer *w = make_writer(versions[v], aligns[a]);
            pe_gguf_file *f;
            const char *path = tmp_path("rt.gguf");
            T_ASSERT(w != NULL);
            T_EQ(pe_gguf_writer_write(w, path, fill_pattern, NULL, err, sizeof err), 0);
            pe_gguf_writer_destroy(w);
            if (pe_gguf_open(path, &f, err, sizeof err) != 0) T_FAIL("open: %s", err);
            if (check_file(f, versions[v], aligns[a]) != 0) {
                pe_gguf_close(f);
                T_FAIL("version %u alignment %llu", versions[v], (unsigned long long)aligns[a]);
            }
            T_EQ(pe_gguf_file_size(f) % aligns[a], 0);
            pe_gguf_close(f);
        }
    }
    return 0;
}

/* Copying every kv of a file into a new writer reproduces the values byte for byte. */
static int test_copy_kv(void)
{
    char err[256];
    pe_gguf_writer *w = make_writer(3, 32), *w2 = pe_gguf_writer_create(3, 32);
    pe_gguf_file *f, *g;
    T_EQ(pe_gguf_writer_write(w, tmp_path("a.gguf"), fill_pattern, NULL, err, sizeof err), 0);
    pe_gguf_writer_destroy(w);
    T_EQ(pe_gguf_open(tmp_path("a.gguf"), &f, err, sizeof err), 0);
    for (uint64_t i = 0; i < pe_gguf_n_kv(f); i++)
        T_EQ(pe_gguf_writer_copy_kv(w2, pe_gguf_kv_at(f, i)), 0);
    T_EQ(pe_gguf_writer_write(w2, tmp_path("b.gguf"), NULL, NULL, err, sizeof err), 0);
    pe_gguf_writer_destroy(w2);
    T_EQ(pe_gguf_open(tmp_path("b.gguf"), &g, err, sizeof err), 0);
    T_EQ(pe_gguf_n_kv(g), pe_gguf_n_kv(f));
    T_EQ(pe_gguf_n_tensors(g), 0);
    for (uint64_t i = 0; i < pe_gguf_n_kv(f); i++) {
        const pe_gguf_kv *a = pe_gguf_kv_at(f, i), *b = pe_gguf_kv_at(g, i);
        char sa[256], sb[256];
        T_ASSERT(a->key.len == b->key.len && memcmp(a->key.ptr, b->key.ptr, a->key.len) == 0);
        T_EQ(a->type, b->type);
        T_EQ(a->arr_type, b->arr_type);
        T_EQ(a->n, b->n);
        pe_gguf_kv_to_string(a, sa, sizeof sa);
        pe_gguf_kv_to_string(b, sb, sizeof sb);
        T_ASSERT(strcmp(sa, sb) == 0);
    }
    pe_gguf_close(g);
    pe_gguf_close(f);
    return 0;
}

/* ---- a byte builder for hand-made files ---- */

typedef struct bld {
    uint8_t b[4096];
    size_t n;
} bld;

static void put(bld *b, const void *p, size_t n)
{
    memcpy(b->b + b->n, p, n);
    b->n += n;
}

static void put32(bld *b, uint32_t v)
{
    put(b, &v, 4);
}

static void put64(bld *b, uint64_t v)
{
    put(b, &v, 8);
}

static void putstr(bld *b, const char *s)
{
    put64(b, strlen(s));
    put(b, s, strlen(s));
}

static void header(bld *b, uint64_t n_tensors, uint64_t n_kv)
{
    b->n = 0;
    put(b, "GGUF", 4);
    put32(b, 3);
    put64(b, n_tensors);
    put64(b, n_kv);
}

/* Arrays of arrays (allowed by the spec): parsed, bounds-checked, summarised, copied. */
static int test_nested_arrays(void)
{
    bld b;
    char err[256], buf[256];
    pe_gguf_file *f, *g;
    pe_gguf_writer *w;
    const pe_gguf_kv *kv;

    header(&b, 0, 1);
    putstr(&b, "nested");
    put32(&b, PE_GGUF_TYPE_ARRAY);
    put32(&b, PE_GGUF_TYPE_ARRAY);
    put64(&b, 3);
    put32(&b, PE_GGUF_TYPE_UINT32); /* [1, 2] */
    put64(&b, 2);
    put32(&b, 1);
    put32(&b, 2);
    put32(&b, PE_GGUF_TYPE_STRING); /* ["xy"] */
    put64(&b, 1);
    putstr(&b, "xy");
    put32(&b, PE_GGUF_TYPE_ARRAY); /* [[]] */
    put64(&b, 1);
    put32(&b, PE_GGUF_TYPE_INT8);
    put64(&b, 0);
    if (pe_gguf_open_memory(b.b, b.n, &f, err, sizeof err) != 0) T_FAIL("%s", err);
    kv = pe_gguf_find_kv(f, "nested");
    T_ASSERT(kv && kv->type == PE_GGUF_TYPE_ARRAY && kv->arr_type == PE_GGUF_TYPE_ARRAY);
    T_EQ(kv->n, 3);
    T_ASSERT(kv->strs == NULL);
    pe_gguf_kv_to_string(kv, buf, sizeof buf);
    T_ASSERT(strcmp(buf, "[3 x array] [[2 x u32], [1 x string], [1 x array]]") == 0);
    T_EQ(pe_gguf_arr_i64(kv, 0), 0); /* not numeric */

    w = pe_gguf_writer_create(3, 0);
    T_EQ(pe_gguf_writer_copy_kv(w, kv), 0);
    T_EQ(pe_gguf_writer_write(w, tmp_path("nested.gguf"), NULL, NULL, err, sizeof err), 0);
    pe_gguf_writer_destroy(w);
    T_EQ(pe_gguf_open(tmp_path("nested.gguf"), &g, err, sizeof err), 0);
    kv = pe_gguf_find_kv(g, "nested");
    T_ASSERT(kv != NULL);
    pe_gguf_kv_to_string(kv, buf, sizeof buf);
    T_ASSERT(strcmp(buf, "[3 x array] [[2 x u32], [1 x string], [1 x array]]") == 0);
    pe_gguf_close(g);
    pe_gguf_close(f);

    /* A nested string past the end of the file. */
    header(&b, 0, 1);
    putstr(&b, "nested");
    put32(&b, PE_GGUF_TYPE_ARRAY);
    put32(&b, PE_GGUF_TYPE_ARRAY);
    put64(&b, 1);
    put32(&b, PE_GGUF_TYPE_STRING);
    put64(&b, 1);
    put64(&b, 1000);
    T_EQ(open_copy(b.b, b.n, err, sizeof err), -1);
    T_ASSERT(strstr(err, "'nested'") && strstr(err, "past end of file"));

    /* Nesting deeper than the limit. */
    header(&b, 0, 1);
    putstr(&b, "deep");
    put32(&b, PE_GGUF_TYPE_ARRAY);
    for (int d = 0; d < 12; d++) {
        put32(&b, PE_GGUF_TYPE_ARRAY);
        put64(&b, 1);
    }
    put32(&b, PE_GGUF_TYPE_UINT8);
    put64(&b, 0);
    T_EQ(open_copy(b.b, b.n, err, sizeof err), -1);
    T_ASSERT(strstr(err, "'deep'") && strstr(err, "nested deeper"));
    return 0;
}

/* 150k strings are indexed once; random access and key lookup stay O(1). */
static int test_big_vocab(void)
{
    enum { N = 150000 };
    pe_gguf_str *strs = malloc(N * sizeof *strs);
    char *text = malloc(N * 12);
    char err[256];
    pe_gguf_writer *w = pe_gguf_writer_create(3, 0);
    pe_gguf_file *f;
    const pe_gguf_kv *kv;
    for (uint32_t i = 0; i < N; i++) {
        int n = snprintf(text + (size_t)i * 12, 12, "tok%u", i);
        strs[i].ptr = text + (size_t)i * 12;
        strs[i].len = (uint64_t)n;
    }
    T_EQ(pe_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", strs, N), 0);
    for (uint32_t i = 0; i < 1000; i++) {
        char key[32];
        snprintf(key, sizeof key, "k.%u", i);
        T_EQ(pe_gguf_writer_set_u32(w, key, i), 0);
    }
    T_EQ(pe_gguf_writer_write(w, tmp_path("vocab.gguf"), NULL, NULL, err, sizeof err), 0);
    pe_gguf_writer_destroy(w);
    T_EQ(pe_gguf_open(tmp_path("vocab.gguf"), &f, err, sizeof err), 0);
    T_EQ(pe_gguf_get_arr(f, "tokenizer.ggml.tokens", PE_GGUF_TYPE_STRING, &kv), 0);
    T_EQ(kv->n, N);
    for (uint32_t i = 0; i < N; i += 997) {
        char want[16];
        snprintf(want, sizeof want, "tok%u", i);
        T_ASSERT(pe_gguf_str_eq(pe_gguf_arr_str(kv, i), want));
    }
    T_ASSERT(pe_gguf_str_eq(pe_gguf_arr_str(kv, N - 1), "tok149999"));
    for (uint32_t i = 0; i < 1000; i++) {
        char key[32];
        uint32_t v;
        snprintf(key, sizeof key, "k.%u", i);
        T_EQ(pe_gguf_get_u32(f, key, &v), 0);
        T_EQ(v, i);
    }
    pe_gguf_close(f);
    free(strs);
    free(text);
    return 0;
}

typedef struct chunk_log {
    uint64_t next[3]; /* expected next offset per tensor */
    uint64_t max_piece;
    int bad;
} chunk_log;

static const uint64_t chunk_rows[3] = {4096 * 4, 4096 / 32 * 34, 64 / 32 * 34};

static int fill_chunk(void *ud, uint64_t ti, uint64_t off, void *dst, uint64_t n)
{
    chunk_log *c = ud;
    if (ti > 2 || off != c->next[ti] || off % chunk_rows[ti] || n % chunk_rows[ti]) c->bad = 1;
    if (ti <= 2) c->next[ti] = off + n;
    if (n > c->max_piece) c->max_piece = n;
    memset(dst, (int)(ti + 1), n);
    return 0;
}

/* Tensors over 64 MiB are asked for in whole-row pieces of at most 64 MiB, each with its
 * own row size (f32 rows of 16 KiB, q8_0 rows of 4352 bytes). */
static int test_chunks(void)
{
    const uint64_t ne_big[2] = {4096, 4200}, ne_bq[2] = {4096, 15500}, ne_small[2] = {64, 3};
    chunk_log log = {{0, 0, 0}, 0, 0};
    pe_gguf_writer *w = pe_gguf_writer_create(3, 0);
    char err[256];
    pe_gguf_file *f;
    const pe_gguf_tensor *t;
    T_EQ(pe_gguf_writer_add_tensor(w, "big", PE_GGML_TYPE_F32, 2, ne_big), 0);
    T_EQ(pe_gguf_writer_add_tensor(w, "bigq", PE_GGML_TYPE_Q8_0, 2, ne_bq), 0);
    T_EQ(pe_gguf_writer_add_tensor(w, "small", PE_GGML_TYPE_Q8_0, 2, ne_small), 0);
    T_EQ(pe_gguf_writer_data_bytes(w), 4096ull * 4200 * 4 + 4352ull * 15500 + 224);
    T_EQ(pe_gguf_writer_write_chunks(w, tmp_path("big.gguf"), fill_chunk, &log, err, sizeof err),
         0);
    pe_gguf_writer_destroy(w);
    T_EQ(log.bad, 0);
    T_EQ(log.next[0], 4096ull * 4200 * 4);
    T_EQ(log.next[1], 4352ull * 15500);
    T_EQ(log.next[2], 204);
    T_ASSERT(log.max_piece <= (64u << 20));
    T_EQ(pe_gguf_open(tmp_path("big.gguf"), &f, err, sizeof err), 0);
    t = pe_gguf_find_tensor(f, "big");
    T_EQ(((const uint8_t *)t->data)[t->n_bytes - 1], 1);
    t = pe_gguf_find_tensor(f, "bigq");
    T_EQ(((const uint8_t *)t->data)[t->n_bytes - 1], 2);
    t = pe_gguf_find_tensor(f, "small");
    T_EQ(((const uint8_t *)t->data)[0], 3);
    pe_gguf_close(f);
    unlink(tmp_path("big.gguf"));
    return 0;
}

static int test_writer_errors(void)
{
    char err[256];
    const uint64_t ne_bad[2] = {48, 2}, ne_zero[2] = {32, 0};
    pe_gguf_writer *w;
    struct stat st;
    T_ASSERT(pe_gguf_writer_create(1, 32) == NULL);
    T_ASSERT(pe_gguf_writer_create(4, 32) == NULL);
    T_ASSERT(pe_gguf_writer_create(3, 48) == NULL);
    w = make_writer(3, 32);
    T_EQ(pe_gguf_writer_add_tensor(w, "w.q8", PE_GGML_TYPE_F32, 2, ne_q), -1); /* duplicate */
    T_EQ(pe_gguf_writer_add_tensor(w, "x", PE_GGML_TYPE_Q8_0, 2, ne_bad), -1); /* 48 % 32 */
    T_EQ(pe_gguf_writer_add_tensor(w, "x", PE_GGML_TYPE_F32, 2, ne_zero), -1);
    T_EQ(pe_gguf_writer_add_tensor(w, "x", 99, 2, ne_q), -1);
    T_EQ(pe_gguf_writer_add_tensor(w, "x", PE_GGML_TYPE_F32, 5, ne_q), -1);
    T_EQ(pe_gguf_writer_set_val(w, "x", PE_GGUF_TYPE_STRING, "x"), -1);
    T_EQ(pe_gguf_writer_set_arr(w, "x", PE_GGUF_TYPE_STRING, "x", 1), -1);

    T_EQ(pe_gguf_writer_write(w, "/nonexistent-dir/x.gguf", fill_pattern, NULL, err, sizeof err),
         -1);
    T_ASSERT(strstr(err, "/nonexistent-dir/x.gguf.tmp") != NULL);
    T_EQ(pe_gguf_writer_write(w, tmp_path("fail.gguf"), fill_fails, NULL, err, sizeof err), -1);
    T_ASSERT(strstr(err, "tensor 'w.f32'") != NULL);
    T_ASSERT(stat(tmp_path("fail.gguf.tmp"), &st) != 0); /* removed */
    T_ASSERT(stat(tmp_path("fail.gguf"), &st) != 0);
    if (access("/dev/full", W_OK) == 0) {
        /* ENOSPC on the data: /dev/full cannot be renamed over, but the write fails first. */
        T_EQ(symlink("/dev/full", tmp_path("full.gguf.tmp")), 0);
        T_EQ(pe_gguf_writer_write(w, tmp_path("full.gguf"), fill_pattern, NULL, err, sizeof err),
             -1);
        T_ASSERT(strstr(err, "write") != NULL);
        unlink(tmp_path("full.gguf.tmp"));
    }
    pe_gguf_writer_destroy(w);
    pe_gguf_writer_destroy(NULL);
    pe_gguf_close(NULL);
    return 0;
}

/* ---- stories260K ---- */

static int test_stories260k(void)
{
    char path[512], err[256];
    const char *dir = getenv("PGD_MODELS_DIR");
    pe_gguf_file *f;
    uint32_t u32;
    float eps;
    pe_gguf_str s;
    const pe_gguf_kv *kv;
    const pe_gguf_tensor *t;
    struct stat st;

    snprintf(path, sizeof path, "%s/stories260K.gguf",
             dir ? dir : PGD_SOURCE_DIR "/../shared/models");
    if (stat(path, &st) != 0) {
        fprintf(stderr, "     (skipped: %s not found; set PGD_MODELS_DIR)\n", path);
        g_missing = 1;
        return 0;
    }
    if (pe_gguf_open(path, &f, err, sizeof err) != 0) T_FAIL("%s: %s", path, err);
    T_EQ(pe_gguf_version(f), 3);
    T_EQ(pe_gguf_n_tensors(f), 48);
    T_EQ(pe_gguf_alignment(f), 32);
    T_EQ(pe_gguf_file_size(f), st.st_size);
    T_EQ(pe_gguf_get_str(f, "general.architecture", &s), 0);
    T_ASSERT(pe_gguf_str_eq(s, "llama"));
    T_EQ(pe_gguf_get_u32(f, "llama.context_length", &u32), 0);
    T_EQ(u32, 128);
    T_EQ(pe_gguf_get_u32(f, "llama.embedding_length", &u32), 0);
    T_EQ(u32, 64);
    T_EQ(pe_gguf_get_u32(f, "llama.block_count", &u32), 0);
    T_EQ(u32, 5);
    T_EQ(pe_gguf_get_u32(f, "llama.attention.head_count_kv", &u32), 0);
    T_EQ(u32, 4);
    T_EQ(pe_gguf_get_f32(f, "llama.attention.layer_norm_rms_epsilon", &eps), 0);
    T_ASSERT(fabsf(eps - 1e-5f) < 1e-9f);
    T_EQ(pe_gguf_get_str(f, "tokenizer.ggml.model", &s), 0);
    T_ASSERT(pe_gguf_str_eq(s, "llama"));
    T_EQ(pe_gguf_get_arr(f, "tokenizer.ggml.tokens", PE_GGUF_TYPE_STRING, &kv), 0);
    T_EQ(kv->n, 512);
    T_ASSERT(pe_gguf_str_eq(pe_gguf_arr_str(kv, 1), "<s>"));
    T_ASSERT(pe_gguf_str_eq(pe_gguf_arr_str(kv, 3), "<0x00>"));
    T_EQ(pe_gguf_get_u32(f, "tokenizer.ggml.bos_token_id", &u32), 0);
    T_EQ(u32, 1);
    t = pe_gguf_find_tensor(f, "token_embd.weight");
    T_ASSERT(t && t->type == PE_GGML_TYPE_F32 && t->ne[0] == 64 && t->ne[1] == 512);
    t = pe_gguf_find_tensor(f, "blk.4.ffn_down.weight");
    T_ASSERT(t && t->ne[0] == 172 && t->ne[1] == 64);
    T_EQ(t->n_bytes, 172 * 64 * 4);
    pe_gguf_close(f);
    return 0;
}

/* ---- malformed files ---- */

/* The base file for corruption: kvs of several kinds and three tensors. */
static uint8_t *make_base(size_t *size)
{
    char err[256];
    pe_gguf_writer *w = pe_gguf_writer_create(3, 0);
    pe_gguf_str toks[3] = {{"<unk>", 5}, {"<s>", 3}, {"</s>", 4}};
    static const float scores[3] = {0, -1, -2};
    const uint64_t ne_a[2] = {64, 2}, ne_b[2] = {64, 2}, ne_c[1] = {8};
    pe_gguf_writer_set_str(w, "general.architecture", "llama");
    pe_gguf_writer_set_u32(w, "llama.block_count", 1);
    pe_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 3);
    pe_gguf_writer_set_arr(w, "tokenizer.ggml.scores", PE_GGUF_TYPE_FLOAT32, scores, 3);
    pe_gguf_writer_add_tensor(w, "blk.0.attn_q.weight", PE_GGML_TYPE_Q8_0, 2, ne_a);
    pe_gguf_writer_add_tensor(w, "blk.0.attn_k.weight", PE_GGML_TYPE_F16, 2, ne_b);
    pe_gguf_writer_add_tensor(w, "output_norm.weight", PE_GGML_TYPE_F32, 1, ne_c);
    if (pe_gguf_writer_write(w, tmp_path("base.gguf"), fill_pattern, NULL, err, sizeof err) != 0) {
        fprintf(stderr, "make_base: %s\n", err);
        pe_gguf_writer_destroy(w);
        return NULL;
    }
    pe_gguf_writer_destroy(w);
    return read_all(tmp_path("base.gguf"), size);
}

/* Offset of the length field of the first string record equal to s. */
static size_t find_str(const uint8_t *buf, size_t size, const char *s)
{
    size_t n = strlen(s);
    for (size_t i = 8; i + n <= size; i++) {
        uint64_t len;
        memcpy(&len, buf + i - 8, 8);
        if (len == n && memcmp(buf + i, s, n) == 0) return i - 8;
    }
    return 0;
}

/* Offset of field k of the tensor info named name: 0 n_dims, 1+d ne[d], 5 type, 6 offset. */
static size_t tensor_field(const uint8_t *buf, size_t size, const char *name, int k)
{
    size_t p = find_str(buf, size, name) + 8 + strlen(name);
    uint32_t n_dims;
    memcpy(&n_dims, buf + p, 4);
    if (k == 0) return p;
    if (k <= 4) return p + 4 + 8 * (size_t)(k - 1);
    return p + 4 + 8 * n_dims + (k == 6 ? 4 : 0);
}

static void poke32(uint8_t *b, size_t at, uint32_t v)
{
    memcpy(b + at, &v, 4);
}

static void poke64(uint8_t *b, size_t at, uint64_t v)
{
    memcpy(b + at, &v, 8);
}

/* Opens a corrupted copy; the open must fail with a message that contains want and want2
 * ("" matches anything). Returns 0, or 1 after printing why. */
static int expect_fail(const uint8_t *buf, size_t size, const char *want, const char *want2,
                       int line)
{
    char e[512] = "";
    if (open_copy(buf, size, e, sizeof e) == 0) {
        fprintf(stderr, "line %d: accepted; want '%s'\n", line, want);
        return 1;
    }
    if (!strstr(e, want) || !strstr(e, want2)) {
        fprintf(stderr, "line %d: message '%s' lacks '%s' / '%s'\n", line, e, want, want2);
        return 1;
    }
    return 0;
}

#define EXPECT_FAIL(buf, size, want, want2)                                                        \
    do {                                                                                           \
        if (expect_fail((buf), (size), (want), (want2), __LINE__) != 0) return 1;                  \
    } while (0)

static int test_truncation(void)
{
    size_t size;
    uint8_t *base = make_base(&size);
    char err[512];
    T_ASSERT(base != NULL);
    T_EQ(open_copy(base, size, err, sizeof err), 0);
    /* Every prefix short of the last tensor's end is refused (the last tensor, 32 bytes,
     * is followed by no padding). */
    for (size_t n = 0; n < size; n++) {
        err[0] = '\0';
        if (open_copy(base, n, err, sizeof err) == 0) T_FAIL("truncated at %zu accepted", n);
        if (strlen(err) < 10 || strchr(err, '\n')) T_FAIL("at %zu: message '%s'", n, err);
    }
    EXPECT_FAIL(base, 0, "magic", "past end of file");
    EXPECT_FAIL(base, 6, "version", "");
    EXPECT_FAIL(base, 20, "n_kv", "");
    EXPECT_FAIL(base, size - 1, "tensor 'output_norm.weight'", "past end of file");
    free(base);
    return 0;
}

static int test_corruptions(void)
{
    size_t size, at;
    uint8_t *base = make_base(&size), *b = malloc(size);
    uint64_t off_q;
    T_ASSERT(base != NULL && b != NULL);

#define RESET() memcpy(b, base, size)
    RESET();
    memcpy(b, "GGUE", 4);
    EXPECT_FAIL(b, size, "bad magic", "");
    RESET();
    poke32(b, 4, 1);
    EXPECT_FAIL(b, size, "unsupported GGUF version 1", "");
    RESET();
    poke32(b, 4, 4);
    EXPECT_FAIL(b, size, "unsupported GGUF version 4", "");
    RESET();
    poke32(b, 4, 0x03000000u);
    EXPECT_FAIL(b, size, "big-endian", "");
    RESET();
    poke64(b, 8, UINT64_MAX);
    EXPECT_FAIL(b, size, "n_tensors", "too large");
    RESET();
    poke64(b, 8, (uint64_t)1 << 62);
    EXPECT_FAIL(b, size, "n_tensors", "too large");
    RESET();
    poke64(b, 16, UINT64_MAX);
    EXPECT_FAIL(b, size, "n_kv", "too large");
    RESET();
    poke64(b, 16, 5); /* one kv more than the file holds: the tensor infos are misread */
    EXPECT_FAIL(b, size, "past end of file", "");

    /* Strings and arrays. */
    RESET();
    poke64(b, 24, UINT64_MAX); /* the first key's length */
    EXPECT_FAIL(b, size, "kv 0", "key length");
    RESET();
    poke64(b, find_str(b, size, "llama"), (uint64_t)size); /* a string value */
    EXPECT_FAIL(b, size, "kv 0 'general.architecture'", "past end of file");
    RESET();
    poke64(b, find_str(b, size, "</s>"), (uint64_t)1 << 40); /* a string inside an array */
    EXPECT_FAIL(b, size, "'tokenizer.ggml.tokens'", "string 2");
    RESET();
    at = find_str(b, size, "tokenizer.ggml.tokens") + 8 + 21 + 8; /* array length */
    poke64(b, at, UINT64_MAX);
    EXPECT_FAIL(b, size, "'tokenizer.ggml.tokens'", "array of");
    RESET();
    at = find_str(b, size, "tokenizer.ggml.scores") + 8 + 21 + 8;
    poke64(b, at, (uint64_t)1 << 62); /* 2^62 floats: the byte count would overflow */
    EXPECT_FAIL(b, size, "'tokenizer.ggml.scores'", "past end of file");
    RESET();
    poke32(b, find_str(b, size, "llama.block_count") + 8 + 17, 13); /* kv type */
    EXPECT_FAIL(b, size, "'llama.block_count'", "unknown value type 13");
    RESET();
    poke32(b, find_str(b, size, "tokenizer.ggml.scores") + 8 + 21 + 4, 77); /* element type */
    EXPECT_FAIL(b, size, "'tokenizer.ggml.scores'", "element type 77");
    RESET();
    at = find_str(b, size, "tokenizer.ggml.scores") + 8;
    memcpy(b + at, "tokenizer.ggml.tokens", 21);
    EXPECT_FAIL(b, size, "duplicate key", "tokenizer.ggml.tokens");

    /* Tensor infos. */
    RESET();
    poke32(b, tensor_field(b, size, "blk.0.attn_q.weight", 5), 99);
    EXPECT_FAIL(b, size, "tensor 'blk.0.attn_q.weight'", "unknown tensor type 99");
    RESET();
    poke32(b, tensor_field(b, size, "blk.0.attn_k.weight", 5), PE_GGML_TYPE_COUNT);
    EXPECT_FAIL(b, size, "tensor 'blk.0.attn_k.weight'", "unknown tensor type 40");
    RESET();
    poke32(b, tensor_field(b, size, "blk.0.attn_k.weight", 0), 5);
    EXPECT_FAIL(b, size, "tensor 'blk.0.attn_k.weight'", "n_dims 5");
    RESET();
    poke32(b, tensor_field(b, size, "blk.0.attn_k.weight", 0), 0);
    EXPECT_FAIL(b, size, "tensor 'blk.0.attn_k.weight'", "n_dims 0");
    RESET();
    poke64(b, tensor_field(b, size, "blk.0.attn_k.weight", 2), 0);
    EXPECT_FAIL(b, size, "tensor 'blk.0.attn_k.weight'", "ne[1] = 0");
    RESET();
    poke64(b, tensor_field(b, size, "blk.0.attn_k.weight", 1), (uint64_t)1 << 32);
    poke64(b, tensor_field(b, size, "blk.0.attn_k.weight", 2), (uint64_t)1 << 32);
    EXPECT_FAIL(b, size, "tensor 'blk.0.attn_k.weight'", "2^63");
    RESET();
    poke64(b, tensor_field(b, size, "blk.0.attn_k.weight", 1), UINT64_MAX);
    EXPECT_FAIL(b, size, "tensor 'blk.0.attn_k.weight'", "ne[0]");
    RESET();
    poke64(b, tensor_field(b, size, "blk.0.attn_q.weight", 1), 48);
    EXPECT_FAIL(b, size, "tensor 'blk.0.attn_q.weight'", "block size 32");
    RESET();
    poke64(b, tensor_field(b, size, "blk.0.attn_q.weight", 1), (uint64_t)1 << 40);
    EXPECT_FAIL(b, size, "tensor 'blk.0.attn_q.weight'", "past end of file");
    RESET();
    poke64(b, find_str(b, size, "blk.0.attn_q.weight"), UINT64_MAX - 4);
    EXPECT_FAIL(b, size, "tensor 0", "name length");
    RESET();
    at = tensor_field(b, size, "output_norm.weight", 6);
    poke64(b, at, 1024 * 1024);
    EXPECT_FAIL(b, size, "tensor 'output_norm.weight'", "past end of file");
    RESET();
    poke64(b, at, UINT64_MAX - 31); /* offset + size overflows */
    EXPECT_FAIL(b, size, "tensor 'output_norm.weight'", "past end of file");
    RESET();
    memcpy(&off_q, b + at, 8);
    poke64(b, at, off_q + 4);
    EXPECT_FAIL(b, size, "tensor 'output_norm.weight'", "not a multiple of the alignment 32");
    RESET();
    poke64(b, at, 0); /* on top of blk.0.attn_q.weight */
    EXPECT_FAIL(b, size, "overlaps", "'output_norm.weight'");
    RESET();
    memcpy(b + find_str(b, size, "blk.0.attn_k.weight") + 8, "blk.0.attn_q.weight", 19);
    EXPECT_FAIL(b, size, "tensor 'blk.0.attn_q.weight'", "duplicate tensor name");
    free(b);
    free(base);
    return 0;
#undef RESET
}

/* general.alignment: wrong type, zero, not a power of two; honoured when valid. */
static int test_alignment_kv(void)
{
    static const struct {
        int as_u64;
        uint32_t v;
        const char *want;
    } cases[] = {{1, 32, "expected u32"},
                 {0, 0, "not a power of two"},
                 {0, 3, "3 is not"},
                 {0, 48, "not a power of two"}};
    const uint64_t ne[1] = {8};
    char err[256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pe_gguf_writer *w = pe_gguf_writer_create(3, 0);
        size_t size;
        uint8_t *buf;
        if (cases[i].as_u64) {
            pe_gguf_writer_set_u64(w, "general.alignment", cases[i].v);
        } else {
            pe_gguf_writer_set_u32(w, "general.alignment", cases[i].v);
        }
        pe_gguf_writer_add_tensor(w, "t", PE_GGML_TYPE_F32, 1, ne);
        T_EQ(pe_gguf_writer_write(w, tmp_path("al.gguf"), NULL, NULL, err, sizeof err), 0);
        pe_gguf_writer_destroy(w);
        buf = read_all(tmp_path("al.gguf"), &size);
        T_ASSERT(buf != NULL);
        EXPECT_FAIL(buf, size, "general.alignment", cases[i].want);
        free(buf);
    }
    return 0;
}

/* Files with no tensors may end before the padding of the (empty) data section, as
 * llama.cpp's vocab-only files do. */
static int test_no_tensors(void)
{
    bld b;
    pe_gguf_file *f;
    char err[256];
    header(&b, 0, 1);
    putstr(&b, "k");
    put32(&b, PE_GGUF_TYPE_UINT8);
    put(&b, "\x07", 1);
    T_EQ(pe_gguf_open_memory(b.b, b.n, &f, err, sizeof err), 0);
    T_EQ(pe_gguf_data_offset(f), 64);
    T_EQ(pe_gguf_n_tensors(f), 0);
    pe_gguf_close(f);
    header(&b, 0, 0);
    T_EQ(pe_gguf_open_memory(b.b, b.n, &f, err, sizeof err), 0);
    pe_gguf_close(f);
    T_EQ(pe_gguf_open(tmp_path("missing.gguf"), &f, err, sizeof err), -1);
    T_ASSERT(strstr(err, "cannot open") != NULL);
    T_EQ(pe_gguf_open(g_dir, &f, err, sizeof err), -1);
    T_ASSERT(strstr(err, "not a regular file") != NULL);
    return 0;
}

int main(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/test_gguf.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) {
        perror(g_dir);
        return 1;
    }
    T_RUN(test_round_trip);
    T_RUN(test_copy_kv);
    T_RUN(test_nested_arrays);
    T_RUN(test_big_vocab);
    T_RUN(test_chunks);
    T_RUN(test_writer_errors);
    T_RUN(test_stories260k);
    T_RUN(test_truncation);
    T_RUN(test_corruptions);
    T_RUN(test_alignment_kv);
    T_RUN(test_no_tensors);
    {
        static const char *files[] = {"rt.gguf",    "a.gguf",   "b.gguf",    "nested.gguf",
                                      "vocab.gguf", "big.gguf", "base.gguf", "al.gguf"};
        for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
            unlink(tmp_path(files[i]));
        rmdir(g_dir);
    }
    if (g_missing && !t_failed) T_SKIP("stories260K.gguf not found (set PGD_MODELS_DIR)");
    T_DONE();
}
