/* SPDX-License-Identifier: MIT */
/*
 * gguf.h - GGUF v2/v3 reader (mmap'd, read-only, every size and offset bounds-checked;
 * gguf.c), values rendered as text (gguf_render.c) and a streaming GGUF writer (used by
 * `pagoda synth-model` and by tests that make malformed files; gguf_write.c).
 *
 * File layout (little-endian):
 *   magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *   n_kv x { string key | u32 type | value }        string = u64 len + bytes (no NUL)
 *   n_tensors x { string name | u32 n_dims | u64 ne[n_dims] | u32 pe_ggml_type | u64 offset }
 *   padding to general.alignment (default 32) | tensor data (offsets relative to here)
 *
 * Errors: every failing call writes one line naming the field or tensor into err
 * (e.g. "tensor 'blk.3.attn_q.weight': data [1234, 5678) past end of file (4000 bytes)").
 * Reader messages do not include the path; callers prefix it.
 *
 * Thread-safety: a pe_gguf_file is immutable after open; any number of threads may read it.
 */
#ifndef PE_GGUF_H
#define PE_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "ggml_types.h"

typedef enum pe_gguf_type {
    PE_GGUF_TYPE_UINT8 = 0,
    PE_GGUF_TYPE_INT8 = 1,
    PE_GGUF_TYPE_UINT16 = 2,
    PE_GGUF_TYPE_INT16 = 3,
    PE_GGUF_TYPE_UINT32 = 4,
    PE_GGUF_TYPE_INT32 = 5,
    PE_GGUF_TYPE_FLOAT32 = 6,
    PE_GGUF_TYPE_BOOL = 7,
    PE_GGUF_TYPE_STRING = 8,
    PE_GGUF_TYPE_ARRAY = 9,
    PE_GGUF_TYPE_UINT64 = 10,
    PE_GGUF_TYPE_INT64 = 11,
    PE_GGUF_TYPE_FLOAT64 = 12,
    PE_GGUF_TYPE_COUNT = 13
} pe_gguf_type;

/* A string inside the mapping: not NUL-terminated. */
typedef struct pe_gguf_str {
    const char *ptr;
    uint64_t len;
} pe_gguf_str;

typedef struct pe_gguf_kv {
    pe_gguf_str key;
    uint32_t type;           /* pe_gguf_type */
    uint32_t arr_type;       /* element type when type == ARRAY */
    uint64_t n;              /* elements when type == ARRAY, else 1 */
    const uint8_t *data;     /* the value bytes in the mapping (for string arrays: the first
                                string record; use pe_gguf_arr_str) */
    const pe_gguf_str *strs; /* type == ARRAY of STRING: n strings, else NULL */
} pe_gguf_kv;

typedef struct pe_gguf_tensor {
    pe_gguf_str name;
    uint32_t n_dims;  /* 1..4 */
    uint64_t ne[4];   /* ne[0] is the row length (innermost); unused dims are 1 */
    uint32_t type;    /* pe_ggml_type */
    uint64_t offset;  /* relative to the data section */
    uint64_t n_bytes; /* checked: inside the file */
    const void *data; /* in the mapping */
} pe_gguf_tensor;

typedef struct pe_gguf_file pe_gguf_file;

/* Opens and validates a file (mmap). Returns 0, or -1 with a message in err. */
int pe_gguf_open(const char *path, pe_gguf_file **out, char *err, size_t errlen);
/* Same over a caller's buffer (borrowed until pe_gguf_close); for fuzzing and tests. */
int pe_gguf_open_memory(const void *data, size_t size, pe_gguf_file **out, char *err,
                        size_t errlen);
void pe_gguf_close(pe_gguf_file *f); /* NULL: no-op */

uint32_t pe_gguf_version(const pe_gguf_file *f);
uint64_t pe_gguf_alignment(const pe_gguf_file *f);
uint64_t pe_gguf_data_offset(const pe_gguf_file *f);
uint64_t pe_gguf_file_size(const pe_gguf_file *f);

uint64_t pe_gguf_n_kv(const pe_gguf_file *f);
const pe_gguf_kv *pe_gguf_kv_at(const pe_gguf_file *f, uint64_t i);
/* Returns the kv with this key, or NULL. O(1) expected. */
const pe_gguf_kv *pe_gguf_find_kv(const pe_gguf_file *f, const char *key);

/* Typed getters. Return 0 on success, -1 if the key is absent, -2 if its type does not
 * fit (integers convert between widths when the value fits; a float key accepts f32/f64). */
int pe_gguf_get_u32(const pe_gguf_file *f, const char *key, uint32_t *out);
int pe_gguf_get_u64(const pe_gguf_file *f, const char *key, uint64_t *out);
int pe_gguf_get_i32(const pe_gguf_file *f, const char *key, int32_t *out);
int pe_gguf_get_f32(const pe_gguf_file *f, const char *key, float *out);
int pe_gguf_get_bool(const pe_gguf_file *f, const char *key, int *out);
int pe_gguf_get_str(const pe_gguf_file *f, const char *key, pe_gguf_str *out);
/* Array access: *kv is the array, its element type must be elem_type (-2 otherwise). */
int pe_gguf_get_arr(const pe_gguf_file *f, const char *key, uint32_t elem_type,
                    const pe_gguf_kv **kv);
/* Scalar value of element i of a numeric array as double / int64 (bounds-checked). */
double pe_gguf_arr_f64(const pe_gguf_kv *kv, uint64_t i);
int64_t pe_gguf_arr_i64(const pe_gguf_kv *kv, uint64_t i);
/* Returns the short name of a pe_gguf_type ("u32", "string", ...), "unknown" past the end. */
const char *pe_gguf_type_name(uint32_t t);
/* String i of a string array (kv->strs[i]); an empty string when out of range or when kv
 * is not a string array. O(1). */
pe_gguf_str pe_gguf_arr_str(const pe_gguf_kv *kv, uint64_t i);
/* 1 if s equals the C string c, else 0. */
int pe_gguf_str_eq(pe_gguf_str s, const char *c);

uint64_t pe_gguf_n_tensors(const pe_gguf_file *f);
const pe_gguf_tensor *pe_gguf_tensor_at(const pe_gguf_file *f, uint64_t i);
/* Returns the tensor with this name, or NULL. O(1) expected. */
const pe_gguf_tensor *pe_gguf_find_tensor(const pe_gguf_file *f, const char *name);

/* ---- values as text ---- */

/* A value rendered as text for `inspect` (arrays summarised); writes at most buflen
 * (gguf_render.c). */
void pe_gguf_kv_to_string(const pe_gguf_kv *kv, char *buf, size_t buflen);

/* ---- writer ---- */

typedef struct pe_gguf_writer pe_gguf_writer;

/* Fills dst (n_bytes) with the data of tensor i; returns 0, or -1 to abort the write. */
typedef int (*pe_gguf_fill_fn)(void *ud, uint64_t tensor_index, void *dst, uint64_t n_bytes);

/* version 2 or 3; alignment a power of two (0: the default 32; any other value is also
 * written as general.alignment). NULL: ENOMEM or a bad argument. */
pe_gguf_writer *pe_gguf_writer_create(uint32_t version, uint64_t alignment);
void pe_gguf_writer_destroy(pe_gguf_writer *w);
/* Metadata; keys and strings are copied. Return 0 or -1 (ENOMEM). */
int pe_gguf_writer_set_u32(pe_gguf_writer *w, const char *key, uint32_t v);
int pe_gguf_writer_set_i32(pe_gguf_writer *w, const char *key, int32_t v);
int pe_gguf_writer_set_u64(pe_gguf_writer *w, const char *key, uint64_t v);
int pe_gguf_writer_set_f32(pe_gguf_writer *w, const char *key, float v);
int pe_gguf_writer_set_bool(pe_gguf_writer *w, const char *key, int v);
int pe_gguf_writer_set_str(pe_gguf_writer *w, const char *key, const char *v);
/* Any scalar numeric type (u8 .. f64, bool): *v holds one value of that type. -1 for
 * string/array types. Setting a key again replaces its value. */
int pe_gguf_writer_set_val(pe_gguf_writer *w, const char *key, uint32_t type, const void *v);
/* Copies n elements of elem_type from data (numeric types only). */
int pe_gguf_writer_set_arr(pe_gguf_writer *w, const char *key, uint32_t elem_type, const void *data,
                           uint64_t n);
int pe_gguf_writer_set_arr_str(pe_gguf_writer *w, const char *key, const pe_gguf_str *strs,
                               uint64_t n);
/* Copies an existing kv (any type) from a reader, e.g. a vocabulary. */
int pe_gguf_writer_copy_kv(pe_gguf_writer *w, const pe_gguf_kv *kv);
/* Declares a tensor; its data comes from fill at write time (streamed, never all in
 * memory). ne has n_dims entries. */
int pe_gguf_writer_add_tensor(pe_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                              const uint64_t *ne);
/* Writes the file to path.tmp, then renames it to path. fill is called once per tensor,
 * in order, with the whole tensor (NULL: zeros). Returns 0, or -1 with a message in err
 * (path.tmp is removed). */
int pe_gguf_writer_write(pe_gguf_writer *w, const char *path, pe_gguf_fill_fn fill, void *ud,
                         char *err, size_t errlen);

/* Fills dst with n_bytes of tensor i starting at byte offset (a whole number of rows). */
typedef int (*pe_gguf_fill_chunk_fn)(void *ud, uint64_t tensor_index, uint64_t offset, void *dst,
                                     uint64_t n_bytes);
/* As pe_gguf_writer_write, but the data of each tensor is asked for in consecutive pieces of
 * at most 64 MiB (whole rows; one row if a row is larger), so the writer's memory stays
 * bounded whatever the tensor sizes. */
int pe_gguf_writer_write_chunks(pe_gguf_writer *w, const char *path, pe_gguf_fill_chunk_fn fill,
                                void *ud, char *err, size_t errlen);
/* Bytes of the data section the writer will write (tensors with their padding). */
uint64_t pe_gguf_writer_data_bytes(const pe_gguf_writer *w);

#endif /* PE_GGUF_H */
