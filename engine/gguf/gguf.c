/* SPDX-License-Identifier: MIT */
/*
 * gguf.c - the GGUF v2/v3 reader and the streaming GGUF writer declared in gguf.h.
 *
 * Callers: the model loader and the tokenizer (reader), `pagoda inspect` (reader),
 * `pagoda synth-model` and the tests (writer), the fuzz target (reader over memory).
 *
 * Reader: one pass over the header, the key/value pairs and the tensor infos, through a
 * cursor that checks every read against the end of the buffer first, so no length, count
 * or offset taken from the file is trusted before it is compared with the bytes that
 * remain (counts are divided, never multiplied, so nothing overflows). Then the tensor
 * data ranges are checked: inside the file, aligned, not overlapping.
 *
 *   [magic|version|n_tensors|n_kv][kv 0]...[kv n-1][tensor info 0]...[pad][data ...]
 *                                                                     ^ data_offset
 *
 * Invariants after a successful open: every pe_gguf_kv and pe_gguf_tensor points inside the
 * buffer; every value's bytes (including nested arrays) lie inside it; each string array
 * kv has its strings indexed in kv->strs; keys and tensor names are unique and found in
 * O(1) through open-addressing hash tables; tensor data is aligned to pe_gguf_alignment(),
 * inside the file, and no two tensors overlap.
 *
 * Writer: metadata is kept encoded in memory (it is small, even a 150k-token vocabulary);
 * tensor data is requested from a callback tensor by tensor, in pieces, and written
 * straight to PATH.tmp, which is renamed to PATH once complete.
 *
 * Byte order: GGUF is little-endian and so is every host this builds for (checked below).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf.h"
#include "unicode.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.c reads and writes little-endian GGUF with plain memcpy: little-endian hosts only"
#endif

#define PE_GGUF_DEFAULT_ALIGNMENT 32
#define PE_GGUF_MAX_DEPTH 8             /* arrays of arrays nested deeper are refused */
#define PE_GGUF_CHUNK_BYTES (64u << 20) /* largest piece of tensor data asked of a fill_chunk */

/* Smallest possible records, used to bound counts before anything is allocated. */
#define MIN_KV_BYTES 13     /* u64 key length + u32 type + a 1-byte value */
#define MIN_TENSOR_BYTES 32 /* u64 name length + u32 n_dims + u64 ne[0] + u32 type + u64 */

/* Bytes of a scalar value; 0 for string, array and unknown types. */
static uint64_t scalar_size(uint32_t t)
{
    static const uint8_t sz[PE_GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < PE_GGUF_TYPE_COUNT ? sz[t] : 0;
}

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    if (!err || errlen == 0) return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* Copies at most 64 bytes of a name from the file into out, printable ASCII only, so an
 * error message stays one readable line whatever the file holds. */
static const char *printable(const char *p, uint64_t n, char out[80])
{
    size_t o = 0;
    for (uint64_t i = 0; i < n && o < 64; i++) {
        unsigned char c = (unsigned char)p[i];
        out[o] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
        o++;
    }
    if (n > 64) {
        memcpy(out + o, "...", 3);
        o += 3;
    }
    out[o] = '\0';
    return out;
}

static uint64_t hash_bytes(const char *p, uint64_t n)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (uint64_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 0x100000001b3ull;
    }
    return h ^ (h >> 29);
}

static int str_eq(pe_gguf_str a, const char *p, uint64_t n)
{
    return a.len == n && (n == 0 || memcmp(a.ptr, p, n) == 0);
}

/* ---- name hash tables ----
 * Open addressing over the kv or tensor array: slots hold index + 1 (0 = empty). Entries
 * are found through their name, a pe_gguf_str at offset 0 of both pe_gguf_kv and pe_gguf_tensor. */

_Static_assert(offsetof(pe_gguf_kv, key) == 0, "pe_gguf_kv.key must come first");
_Static_assert(offsetof(pe_gguf_tensor, name) == 0, "pe_gguf_tensor.name must come first");

typedef struct name_table {
    uint64_t *slots;
    uint64_t mask;
    const char *base; /* the entry array */
    size_t stride;    /* sizeof one entry */
} name_table;

static int table_init(name_table *t, uint64_t n, const void *base, size_t stride)
{
    uint64_t cap = 8;
    while (cap < 2 * n)
        cap *= 2;
    t->slots = calloc(cap, sizeof *t->slots);
    t->mask = cap - 1;
    t->base = base;
    t->stride = stride;
    return t->slots ? 0 : -1;
}

static const pe_gguf_str *table_name(const name_table *t, uint64_t idx)
{
    return (const pe_gguf_str *)(const void *)(t->base + idx * t->stride);
}

/* Returns the index of the entry named (p, n), or UINT64_MAX. */
static uint64_t table_find(const name_table *t, const char *p, uint64_t n)
{
    if (!t->slots) return UINT64_MAX;
    for (uint64_t s = hash_bytes(p, n) & t->mask;; s = (s + 1) & t->mask) {
        uint64_t v = t->slots[s];
        if (v == 0) return UINT64_MAX;
        if (str_eq(*table_name(t, v - 1), p, n)) return v - 1;
    }
}

/* Inserts entry idx; returns UINT64_MAX, or the index of an entry with the same name. */
static uint64_t table_insert(name_table *t, uint64_t idx)
{
    const pe_gguf_str *name = table_name(t, idx);
    for (uint64_t s = hash_bytes(name->ptr, name->len) & t->mask;; s = (s + 1) & t->mask) {
        uint64_t v = t->slots[s];
        if (v == 0) {
            t->slots[s] = idx + 1;
            return UINT64_MAX;
        }
        if (str_eq(*table_name(t, v - 1), name->ptr, name->len)) return v - 1;
    }
}

/* ---- reader ---- */

struct pe_gguf_file {
    const uint8_t *base; /* the file's bytes */
    uint64_t size;
    void *map; /* the mmap'd region (pe_gguf_open), or NULL */
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;
    uint64_t n_kv, n_tensors;
    pe_gguf_kv *kvs;         /* [n_kv] */
    pe_gguf_tensor *tensors; /* [n_tensors] */
    name_table kv_table, tensor_table;
};

/* The parse cursor. ctx names what is being read ("kv 3 'general.name'") for errors. */
typedef struct rd {
    const uint8_t *base;
    uint64_t size, pos;
    char *err;
    size_t errlen;
    char ctx[160];
} rd;

static int fail(rd *r, const char *fmt, ...)
{
    va_list ap;
    char msg[256];
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    set_err(r->err, r->errlen, "%s%s%s", r->ctx, r->ctx[0] ? ": " : "", msg);
    return -1;
}

static uint64_t rd_left(const rd *r)
{
    return r->size - r->pos;
}

static int rd_bytes(rd *r, uint64_t n, const char *field, const uint8_t **out)
{
    if (n > rd_left(r)) {
        return fail(
            r, "%s (%" PRIu64 " bytes at offset %" PRIu64 ") past end of file (%" PRIu64 " bytes)",
            field, n, r->pos, r->size);
    }
    *out = r->base + r->pos;
    r->pos += n;
    return 0;
}

static int rd_u32(rd *r, const char *field, uint32_t *v)
{
    const uint8_t *p = NULL;
    if (rd_bytes(r, 4, field, &p) != 0) return -1;
    memcpy(v, p, 4);
    return 0;
}

static int rd_u64(rd *r, const char *field, uint64_t *v)
{
    const uint8_t *p = NULL;
    if (rd_bytes(r, 8, field, &p) != 0) return -1;
    memcpy(v, p, 8);
    return 0;
}

static int rd_str(rd *r, const char *field, pe_gguf_str *s)
{
    uint64_t len;
    if (rd_u64(r, field, &len) != 0) return -1;
    if (len > rd_left(r)) {
        return fail(r,
                    "%s length %" PRIu64 " at offset %" PRIu64 " runs past end of file (%" PRIu64
                    " bytes)",
                    field, len, r->pos - 8, r->size);
    }
    s->ptr = (const char *)(r->base + r->pos);
    s->len = len;
    r->pos += len;
    return 0;
}

static int parse_array_body(rd *r, uint32_t elem_type, uint64_t n, int depth, pe_gguf_str *strs);

/* Checks one value of type at the cursor and steps over it. */
static int parse_value(rd *r, uint32_t type, int depth)
{
    const uint8_t *p = NULL;
    pe_gguf_str s;
    uint32_t elem_type;
    uint64_t n;

    if (type >= PE_GGUF_TYPE_COUNT) return fail(r, "unknown value type %" PRIu32, type);
    if (type == PE_GGUF_TYPE_STRING) return rd_str(r, "string", &s);
    if (type != PE_GGUF_TYPE_ARRAY) return rd_bytes(r, scalar_size(type), "value", &p);
    if (depth >= PE_GGUF_MAX_DEPTH)
        return fail(r, "arrays nested deeper than %d", PE_GGUF_MAX_DEPTH);
    if (rd_u32(r, "nested array element type", &elem_type) != 0) return -1;
    if (rd_u64(r, "nested array length", &n) != 0) return -1;
    return parse_array_body(r, elem_type, n, depth + 1, NULL);
}

/* Checks the n elements of an array at the cursor; fills strs[n] for a string array when
 * strs is not NULL. */
static int parse_array_body(rd *r, uint32_t elem_type, uint64_t n, int depth, pe_gguf_str *strs)
{
    uint64_t esz = scalar_size(elem_type);
    if (elem_type >= PE_GGUF_TYPE_COUNT)
        return fail(r, "unknown array element type %" PRIu32, elem_type);
    if (esz) {
        if (n > rd_left(r) / esz) {
            return fail(r,
                        "array of %" PRIu64 " %s at offset %" PRIu64
                        " runs past end of file (%" PRIu64 " bytes)",
                        n, pe_gguf_type_name(elem_type), r->pos, r->size);
        }
        r->pos += n * esz;
        return 0;
    }
    /* Strings take at least 8 bytes, nested arrays 12: bound n before looping. */
    if (n > rd_left(r) / (elem_type == PE_GGUF_TYPE_STRING ? 8 : 12)) {
        return fail(r,
                    "array of %" PRIu64 " %s at offset %" PRIu64 " runs past end of file (%" PRIu64
                    " bytes)",
                    n, pe_gguf_type_name(elem_type), r->pos, r->size);
    }
    for (uint64_t i = 0; i < n; i++) {
        if (elem_type == PE_GGUF_TYPE_STRING) {
            pe_gguf_str s;
            char field[48];
            snprintf(field, sizeof field, "string %" PRIu64, i);
            if (rd_str(r, field, &s) != 0) return -1;
            if (strs) strs[i] = s;
        } else if (parse_value(r, PE_GGUF_TYPE_ARRAY, depth) != 0) {
            return -1;
        }
    }
    return 0;
}

static int parse_kv(pe_gguf_file *f, rd *r, uint64_t i)
{
    pe_gguf_kv *kv = &f->kvs[i];
    char name[80];
    uint64_t dup;

    snprintf(r->ctx, sizeof r->ctx, "kv %" PRIu64, i);
    if (rd_str(r, "key", &kv->key) != 0) return -1;
    snprintf(r->ctx, sizeof r->ctx, "kv %" PRIu64 " '%s'", i,
             printable(kv->key.ptr, kv->key.len, name));
    dup = table_insert(&f->kv_table, i);
    if (dup != UINT64_MAX) return fail(r, "duplicate key (also kv %" PRIu64 ")", dup);
    if (rd_u32(r, "type", &kv->type) != 0) return -1;
    if (kv->type >= PE_GGUF_TYPE_COUNT) return fail(r, "unknown value type %" PRIu32, kv->type);
    kv->n = 1;
    if (kv->type != PE_GGUF_TYPE_ARRAY) {
        kv->data = r->base + r->pos;
        return parse_value(r, kv->type, 0);
    }
    if (rd_u32(r, "array element type", &kv->arr_type) != 0) return -1;
    if (rd_u64(r, "array length", &kv->n) != 0) return -1;
    kv->data = r->base + r->pos;
    if (kv->arr_type == PE_GGUF_TYPE_STRING && kv->n <= rd_left(r) / 8) {
        pe_gguf_str *strs = malloc((kv->n ? kv->n : 1) * sizeof *strs);
        if (!strs) return fail(r, "out of memory for %" PRIu64 " strings", kv->n);
        kv->strs = strs;
        return parse_array_body(r, kv->arr_type, kv->n, 1, strs);
    }
    return parse_array_body(r, kv->arr_type, kv->n, 1, NULL);
}

static int parse_tensor_info(pe_gguf_file *f, rd *r, uint64_t i)
{
    pe_gguf_tensor *t = &f->tensors[i];
    const pe_ggml_type_traits *tr;
    char name[80];
    uint64_t dup, n_elems = 1, row_blocks, n_rows = 1;

    snprintf(r->ctx, sizeof r->ctx, "tensor %" PRIu64, i);
    if (rd_str(r, "name", &t->name) != 0) return -1;
    snprintf(r->ctx, sizeof r->ctx, "tensor '%s'", printable(t->name.ptr, t->name.len, name));
    dup = table_insert(&f->tensor_table, i);
    if (dup != UINT64_MAX) {
        return fail(r, "duplicate tensor name (tensors %" PRIu64 " and %" PRIu64 ")", dup, i);
    }
    if (rd_u32(r, "n_dims", &t->n_dims) != 0) return -1;
    if (t->n_dims < 1 || t->n_dims > 4) return fail(r, "n_dims %" PRIu32 " not in 1..4", t->n_dims);
    for (uint32_t d = 0; d < 4; d++)
        t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        char field[16];
        snprintf(field, sizeof field, "ne[%" PRIu32 "]", d);
        if (rd_u64(r, field, &t->ne[d]) != 0) return -1;
        if (t->ne[d] == 0 || t->ne[d] > (uint64_t)INT64_MAX) {
            return fail(r, "%s = %" PRIu64 " out of range", field, t->ne[d]);
        }
        if (n_elems > (uint64_t)INT64_MAX / t->ne[d]) {
            return fail(r, "shape has more than 2^63 elements");
        }
        n_elems *= t->ne[d];
    }
    if (rd_u32(r, "type", &t->type) != 0) return -1;
    tr = pe_ggml_get_traits(t->type);
    if (!tr) return fail(r, "unknown tensor type %" PRIu32, t->type);
    if (t->ne[0] % tr->blck_size != 0) {
        return fail(r, "ne[0] = %" PRIu64 " is not a multiple of the %s block size %" PRIu32,
                    t->ne[0], tr->name, tr->blck_size);
    }
    if (rd_u64(r, "offset", &t->offset) != 0) return -1;
    row_blocks = t->ne[0] / tr->blck_size;
    n_rows = n_elems / t->ne[0];
    if (row_blocks > UINT64_MAX / tr->type_size ||
        row_blocks * tr->type_size > UINT64_MAX / n_rows) {
        return fail(r, "size in bytes overflows");
    }
    t->n_bytes = row_blocks * tr->type_size * n_rows;
    return 0;
}

typedef struct span {
    uint64_t begin, end, idx;
} span;

static int span_cmp(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->idx < y->idx ? -1 : (x->idx > y->idx);
}

/* Checks the tensor data ranges and sets each tensor's data pointer. */
static int check_tensor_data(pe_gguf_file *f, rd *r)
{
    span *sp = NULL;
    char name[80], name2[80];
    int rc = -1;

    if (f->n_tensors == 0) return 0;
    sp = malloc(f->n_tensors * sizeof *sp);
    if (!sp) return fail(r, "out of memory");
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        pe_gguf_tensor *t = &f->tensors[i];
        uint64_t room = f->data_offset <= f->size ? f->size - f->data_offset : 0;
        snprintf(r->ctx, sizeof r->ctx, "tensor '%s'", printable(t->name.ptr, t->name.len, name));
        if (t->offset % f->alignment != 0) {
            fail(r, "offset %" PRIu64 " is not a multiple of the alignment %" PRIu64, t->offset,
                 f->alignment);
            goto out;
        }
        if (t->offset > room || t->n_bytes > room - t->offset) {
            uint64_t b =
                t->offset > UINT64_MAX - f->data_offset ? UINT64_MAX : f->data_offset + t->offset;
            uint64_t e = t->n_bytes > UINT64_MAX - b ? UINT64_MAX : b + t->n_bytes;
            fail(r, "data [%" PRIu64 ", %" PRIu64 ") past end of file (%" PRIu64 " bytes)", b, e,
                 f->size);
            goto out;
        }
        t->data = f->base + f->data_offset + t->offset;
        sp[i].begin = f->data_offset + t->offset;
        sp[i].end = sp[i].begin + t->n_bytes;
        sp[i].idx = i;
    }
    qsort(sp, f->n_tensors, sizeof *sp, span_cmp);
    for (uint64_t i = 1; i < f->n_tensors; i++) {
        if (sp[i].begin < sp[i - 1].end) {
            const pe_gguf_tensor *a = &f->tensors[sp[i - 1].idx], *b = &f->tensors[sp[i].idx];
            r->ctx[0] = '\0';
            fail(r,
                 "tensor '%s' data [%" PRIu64 ", %" PRIu64 ") overlaps tensor '%s' data [%" PRIu64
                 ", %" PRIu64 ")",
                 printable(b->name.ptr, b->name.len, name), sp[i].begin, sp[i].end,
                 printable(a->name.ptr, a->name.len, name2), sp[i - 1].begin, sp[i - 1].end);
            goto out;
        }
    }
    rc = 0;
out:
    free(sp);
    return rc;
}

static int parse(pe_gguf_file *f, char *err, size_t errlen)
{
    rd r = {.base = f->base, .size = f->size, .err = err, .errlen = errlen};
    const uint8_t *magic = NULL;
    const pe_gguf_kv *al;

    snprintf(r.ctx, sizeof r.ctx, "header");
    if (rd_bytes(&r, 4, "magic", &magic) != 0) return -1;
    if (memcmp(magic, "GGUF", 4) != 0) {
        char m[80];
        return fail(&r, "bad magic '%s' (not a GGUF file)", printable((const char *)magic, 4, m));
    }
    if (rd_u32(&r, "version", &f->version) != 0) return -1;
    if (f->version != 2 && f->version != 3) {
        if (f->version == 0x02000000u || f->version == 0x03000000u) {
            return fail(&r, "unsupported GGUF version %" PRIu32 " (a big-endian file)", f->version);
        }
        return fail(&r, "unsupported GGUF version %" PRIu32 " (2 and 3 are supported)", f->version);
    }
    if (rd_u64(&r, "n_tensors", &f->n_tensors) != 0) return -1;
    if (rd_u64(&r, "n_kv", &f->n_kv) != 0) return -1;
    if (f->n_tensors > rd_left(&r) / MIN_TENSOR_BYTES) {
        return fail(&r, "n_tensors %" PRIu64 " too large for a file of %" PRIu64 " bytes",
                    f->n_tensors, f->size);
    }
    if (f->n_kv > rd_left(&r) / MIN_KV_BYTES) {
        return fail(&r, "n_kv %" PRIu64 " too large for a file of %" PRIu64 " bytes", f->n_kv,
                    f->size);
    }

    f->kvs = calloc(f->n_kv ? f->n_kv : 1, sizeof *f->kvs);
    f->tensors = calloc(f->n_tensors ? f->n_tensors : 1, sizeof *f->tensors);
    if (!f->kvs || !f->tensors || table_init(&f->kv_table, f->n_kv, f->kvs, sizeof *f->kvs) != 0 ||
        table_init(&f->tensor_table, f->n_tensors, f->tensors, sizeof *f->tensors) != 0) {
        return fail(&r, "out of memory for %" PRIu64 " kvs and %" PRIu64 " tensors", f->n_kv,
                    f->n_tensors);
    }
    for (uint64_t i = 0; i < f->n_kv; i++) {
        if (parse_kv(f, &r, i) != 0) return -1;
    }

    r.ctx[0] = '\0';
    f->alignment = PE_GGUF_DEFAULT_ALIGNMENT;
    al = pe_gguf_find_kv(f, "general.alignment");
    if (al) {
        uint32_t a;
        snprintf(r.ctx, sizeof r.ctx, "kv 'general.alignment'");
        if (al->type != PE_GGUF_TYPE_UINT32) {
            return fail(&r, "type %s, expected u32", pe_gguf_type_name(al->type));
        }
        memcpy(&a, al->data, 4);
        if (a == 0 || (a & (a - 1)) != 0) return fail(&r, "%" PRIu32 " is not a power of two", a);
        f->alignment = a;
    }

    for (uint64_t i = 0; i < f->n_tensors; i++) {
        if (parse_tensor_info(f, &r, i) != 0) return -1;
    }
    /* pos <= size < 2^63 and alignment <= 2^31: no overflow. */
    f->data_offset = (r.pos + f->alignment - 1) / f->alignment * f->alignment;
    return check_tensor_data(f, &r);
}

int pe_gguf_open_memory(const void *data, size_t size, pe_gguf_file **out, char *err, size_t errlen)
{
    pe_gguf_file *f;
    *out = NULL;
    if (!data && size) {
        set_err(err, errlen, "no buffer");
        return -1;
    }
    f = calloc(1, sizeof *f);
    if (!f) {
        set_err(err, errlen, "out of memory");
        return -1;
    }
    f->base = data;
    f->size = size;
    if (parse(f, err, errlen) != 0) {
        pe_gguf_close(f);
        return -1;
    }
    *out = f;
    return 0;
}

int pe_gguf_open(const char *path, pe_gguf_file **out, char *err, size_t errlen)
{
    struct stat st;
    void *map = NULL;
    int fd, rc;

    *out = NULL;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        set_err(err, errlen, "cannot open: %s", strerror(errno));
        return -1;
    }
    if (fstat(fd, &st) != 0) {
        set_err(err, errlen, "cannot stat: %s", strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        set_err(err, errlen, "not a regular file");
        close(fd);
        return -1;
    }
    if (st.st_size > 0) {
        map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            set_err(err, errlen, "cannot mmap %lld bytes: %s", (long long)st.st_size,
                    strerror(errno));
            close(fd);
            return -1;
        }
    }
    close(fd);
    rc = pe_gguf_open_memory(map, map ? (size_t)st.st_size : 0, out, err, errlen);
    if (rc != 0) {
        if (map) munmap(map, (size_t)st.st_size);
        return -1;
    }
    (*out)->map = map;
    return 0;
}

void pe_gguf_close(pe_gguf_file *f)
{
    if (!f) return;
    if (f->kvs) {
        for (uint64_t i = 0; i < f->n_kv; i++)
            free((void *)f->kvs[i].strs);
    }
    free(f->kvs);
    free(f->tensors);
    free(f->kv_table.slots);
    free(f->tensor_table.slots);
    if (f->map) munmap(f->map, (size_t)f->size);
    free(f);
}

uint32_t pe_gguf_version(const pe_gguf_file *f)
{
    return f->version;
}

uint64_t pe_gguf_alignment(const pe_gguf_file *f)
{
    return f->alignment;
}

uint64_t pe_gguf_data_offset(const pe_gguf_file *f)
{
    return f->data_offset;
}

uint64_t pe_gguf_file_size(const pe_gguf_file *f)
{
    return f->size;
}

uint64_t pe_gguf_n_kv(const pe_gguf_file *f)
{
    return f->n_kv;
}

const pe_gguf_kv *pe_gguf_kv_at(const pe_gguf_file *f, uint64_t i)
{
    return i < f->n_kv ? &f->kvs[i] : NULL;
}

const pe_gguf_kv *pe_gguf_find_kv(const pe_gguf_file *f, const char *key)
{
    uint64_t i = table_find(&f->kv_table, key, strlen(key));
    return i == UINT64_MAX ? NULL : &f->kvs[i];
}

uint64_t pe_gguf_n_tensors(const pe_gguf_file *f)
{
    return f->n_tensors;
}

const pe_gguf_tensor *pe_gguf_tensor_at(const pe_gguf_file *f, uint64_t i)
{
    return i < f->n_tensors ? &f->tensors[i] : NULL;
}

const pe_gguf_tensor *pe_gguf_find_tensor(const pe_gguf_file *f, const char *name)
{
    uint64_t i = table_find(&f->tensor_table, name, strlen(name));
    return i == UINT64_MAX ? NULL : &f->tensors[i];
}

int pe_gguf_str_eq(pe_gguf_str s, const char *c)
{
    return str_eq(s, c, strlen(c));
}

/* ---- typed getters ---- */

/* Reads a scalar integer kv: *neg is set when the value is negative (then *mag is its
 * magnitude, as an unsigned). Returns 0, or -2 if the kv is not an integer. */
static int int_value(uint32_t type, const uint8_t *p, uint64_t *mag, int *neg)
{
    int64_t s;
    *neg = 0;
    switch (type) {
    case PE_GGUF_TYPE_UINT8:
        *mag = p[0];
        return 0;
    case PE_GGUF_TYPE_UINT16: {
        uint16_t v;
        memcpy(&v, p, 2);
        *mag = v;
        return 0;
    }
    case PE_GGUF_TYPE_UINT32: {
        uint32_t v;
        memcpy(&v, p, 4);
        *mag = v;
        return 0;
    }
    case PE_GGUF_TYPE_UINT64:
        memcpy(mag, p, 8);
        return 0;
    case PE_GGUF_TYPE_INT8:
        s = (int8_t)p[0];
        break;
    case PE_GGUF_TYPE_INT16: {
        int16_t v;
        memcpy(&v, p, 2);
        s = v;
        break;
    }
    case PE_GGUF_TYPE_INT32: {
        int32_t v;
        memcpy(&v, p, 4);
        s = v;
        break;
    }
    case PE_GGUF_TYPE_INT64:
        memcpy(&s, p, 8);
        break;
    default:
        return -2;
    }
    *neg = s < 0;
    *mag = s < 0 ? (uint64_t)0 - (uint64_t)s : (uint64_t)s;
    return 0;
}

/* Returns 0 with the kv's integer value in (mag, neg), -1 if absent, -2 if not an integer. */
static int get_int(const pe_gguf_file *f, const char *key, uint64_t *mag, int *neg)
{
    const pe_gguf_kv *kv = pe_gguf_find_kv(f, key);
    if (!kv) return -1;
    return int_value(kv->type, kv->data, mag, neg);
}

int pe_gguf_get_u32(const pe_gguf_file *f, const char *key, uint32_t *out)
{
    uint64_t mag;
    int neg, rc = get_int(f, key, &mag, &neg);
    if (rc != 0) return rc;
    if (neg || mag > UINT32_MAX) return -2;
    *out = (uint32_t)mag;
    return 0;
}

int pe_gguf_get_u64(const pe_gguf_file *f, const char *key, uint64_t *out)
{
    uint64_t mag;
    int neg, rc = get_int(f, key, &mag, &neg);
    if (rc != 0) return rc;
    if (neg) return -2;
    *out = mag;
    return 0;
}

int pe_gguf_get_i32(const pe_gguf_file *f, const char *key, int32_t *out)
{
    uint64_t mag;
    int neg, rc = get_int(f, key, &mag, &neg);
    if (rc != 0) return rc;
    if (neg ? mag > (uint64_t)INT32_MAX + 1 : mag > INT32_MAX) return -2;
    *out = neg ? (int32_t)(-(int64_t)mag) : (int32_t)mag;
    return 0;
}

int pe_gguf_get_f32(const pe_gguf_file *f, const char *key, float *out)
{
    const pe_gguf_kv *kv = pe_gguf_find_kv(f, key);
    if (!kv) return -1;
    if (kv->type == PE_GGUF_TYPE_FLOAT32) {
        memcpy(out, kv->data, 4);
        return 0;
    }
    if (kv->type == PE_GGUF_TYPE_FLOAT64) {
        double d;
        memcpy(&d, kv->data, 8);
        *out = (float)d;
        return 0;
    }
    return -2;
}

int pe_gguf_get_bool(const pe_gguf_file *f, const char *key, int *out)
{
    const pe_gguf_kv *kv = pe_gguf_find_kv(f, key);
    if (!kv) return -1;
    if (kv->type != PE_GGUF_TYPE_BOOL) return -2;
    *out = kv->data[0] != 0;
    return 0;
}

int pe_gguf_get_str(const pe_gguf_file *f, const char *key, pe_gguf_str *out)
{
    const pe_gguf_kv *kv = pe_gguf_find_kv(f, key);
    if (!kv) return -1;
    if (kv->type != PE_GGUF_TYPE_STRING) return -2;
    memcpy(&out->len, kv->data, 8);
    out->ptr = (const char *)kv->data + 8;
    return 0;
}

int pe_gguf_get_arr(const pe_gguf_file *f, const char *key, uint32_t elem_type,
                    const pe_gguf_kv **kv)
{
    const pe_gguf_kv *k = pe_gguf_find_kv(f, key);
    if (!k) return -1;
    if (k->type != PE_GGUF_TYPE_ARRAY || k->arr_type != elem_type) return -2;
    *kv = k;
    return 0;
}

pe_gguf_str pe_gguf_arr_str(const pe_gguf_kv *kv, uint64_t i)
{
    pe_gguf_str none = {"", 0};
    if (!kv->strs || i >= kv->n) return none;
    return kv->strs[i];
}

/* Element i of a numeric array, as double; 0 when not numeric or out of range. */
double pe_gguf_arr_f64(const pe_gguf_kv *kv, uint64_t i)
{
    const uint8_t *p = NULL;
    uint64_t mag;
    int neg;
    if (kv->type != PE_GGUF_TYPE_ARRAY || i >= kv->n || scalar_size(kv->arr_type) == 0) return 0;
    p = kv->data + i * scalar_size(kv->arr_type);
    if (kv->arr_type == PE_GGUF_TYPE_FLOAT32) {
        float v;
        memcpy(&v, p, 4);
        return v;
    }
    if (kv->arr_type == PE_GGUF_TYPE_FLOAT64) {
        double v;
        memcpy(&v, p, 8);
        return v;
    }
    if (kv->arr_type == PE_GGUF_TYPE_BOOL) return p[0] != 0;
    if (int_value(kv->arr_type, p, &mag, &neg) != 0) return 0;
    return neg ? -(double)mag : (double)mag;
}

/* Element i of a numeric array, as int64 (floats truncated, out-of-range values clamped);
 * 0 when not numeric or out of range. */
int64_t pe_gguf_arr_i64(const pe_gguf_kv *kv, uint64_t i)
{
    const uint8_t *p = NULL;
    uint64_t mag;
    int neg;
    if (kv->type != PE_GGUF_TYPE_ARRAY || i >= kv->n || scalar_size(kv->arr_type) == 0) return 0;
    p = kv->data + i * scalar_size(kv->arr_type);
    if (kv->arr_type == PE_GGUF_TYPE_FLOAT32 || kv->arr_type == PE_GGUF_TYPE_FLOAT64) {
        double d = pe_gguf_arr_f64(kv, i);
        if (!(d == d)) return 0; /* NaN */
        if (d >= 9223372036854775807.0) return INT64_MAX;
        if (d <= -9223372036854775808.0) return INT64_MIN;
        return (int64_t)d;
    }
    if (kv->arr_type == PE_GGUF_TYPE_BOOL) return p[0] != 0;
    if (int_value(kv->arr_type, p, &mag, &neg) != 0) return 0;
    if (neg) return mag > (uint64_t)INT64_MAX ? INT64_MIN : -(int64_t)mag;
    return mag > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)mag;
}

const char *pe_gguf_type_name(uint32_t t)
{
    static const char *const names[PE_GGUF_TYPE_COUNT] = {
        "u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
        "bool", "string", "array", "u64", "i64", "f64",
    };
    return t < PE_GGUF_TYPE_COUNT ? names[t] : "unknown";
}

/* ---- rendering values as text ---- */

/* A bounded output buffer: once text no longer fits, "..." ends it and the rest is
 * dropped; multi-byte UTF-8 sequences are never cut. */
typedef struct sbuf {
    char *buf;
    size_t cap; /* bytes of buf, NUL included */
    size_t len;
    int full;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->full || b->cap == 0) return;
    if (b->len + n + 3 >= b->cap) { /* keep room for "..." and the NUL */
        if (b->len + 3 < b->cap) {
            memcpy(b->buf + b->len, "...", 3);
            b->len += 3;
        }
        b->buf[b->len] = '\0';
        b->full = 1;
        return;
    }
    memcpy(b->buf + b->len, s, n);
    b->len += n;
    b->buf[b->len] = '\0';
}

static void sb_str(sbuf *b, const char *s)
{
    sb_put(b, s, strlen(s));
}

static void sb_fmt(sbuf *b, const char *fmt, ...)
{
    char tmp[64];
    va_list ap;
    int n;
    va_start(ap, fmt);
    n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) sb_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* Appends s quoted, with control characters and invalid UTF-8 escaped; at most max_bytes
 * of the string are shown. */
static void sb_quoted(sbuf *b, pe_gguf_str s, uint64_t max_bytes)
{
    const unsigned char *p = (const unsigned char *)s.ptr;
    uint64_t i = 0;
    sb_put(b, "\"", 1);
    while (i < s.len && !b->full) {
        size_t n = pe_utf8_valid_len(p + i, s.len - i);
        if (i >= max_bytes) {
            sb_str(b, "...");
            break;
        }
        if (n == 1 && p[i] >= 0x20 && p[i] != 0x7f && p[i] != '"' && p[i] != '\\') {
            sb_put(b, (const char *)p + i, 1);
        } else if (n > 1) {
            sb_put(b, (const char *)p + i, n);
        } else if (p[i] == '"' || p[i] == '\\') {
            char e[2] = {'\\', (char)p[i]};
            sb_put(b, e, 2);
        } else if (p[i] == '\n') {
            sb_str(b, "\\n");
        } else if (p[i] == '\t') {
            sb_str(b, "\\t");
        } else {
            sb_fmt(b, "\\x%02x", p[i]);
        }
        i += n ? n : 1;
    }
    sb_put(b, "\"", 1);
}

/* Bytes of the value of type at p (validated by the reader, or encoded by the writer). */
static uint64_t value_span(uint32_t type, const uint8_t *p);

static uint64_t array_body_span(uint32_t elem_type, uint64_t n, const uint8_t *p)
{
    uint64_t off = 0;
    if (scalar_size(elem_type)) return n * scalar_size(elem_type);
    for (uint64_t i = 0; i < n; i++)
        off += value_span(elem_type, p + off);
    return off;
}

static uint64_t value_span(uint32_t type, const uint8_t *p)
{
    uint64_t n;
    uint32_t et;
    if (type == PE_GGUF_TYPE_STRING) {
        memcpy(&n, p, 8);
        return 8 + n;
    }
    if (type != PE_GGUF_TYPE_ARRAY) return scalar_size(type);
    memcpy(&et, p, 4);
    memcpy(&n, p + 4, 8);
    return 12 + array_body_span(et, n, p + 12);
}

static void render_scalar(sbuf *b, uint32_t type, const uint8_t *p)
{
    uint64_t mag;
    int neg;
    if (type == PE_GGUF_TYPE_FLOAT32) {
        float v;
        memcpy(&v, p, 4);
        sb_fmt(b, "%.7g", (double)v);
    } else if (type == PE_GGUF_TYPE_FLOAT64) {
        double v;
        memcpy(&v, p, 8);
        sb_fmt(b, "%.15g", v);
    } else if (type == PE_GGUF_TYPE_BOOL) {
        sb_str(b, p[0] ? "true" : "false");
    } else if (type == PE_GGUF_TYPE_STRING) {
        pe_gguf_str s;
        memcpy(&s.len, p, 8);
        s.ptr = (const char *)p + 8;
        sb_quoted(b, s, 200);
    } else if (int_value(type, p, &mag, &neg) == 0) {
        sb_fmt(b, "%s%" PRIu64, neg ? "-" : "", mag);
    }
}

/* Appends "[n x type] [e0, e1, ...]" for an array body at p, showing at most max_elems. */
static void render_array(sbuf *b, uint32_t elem_type, uint64_t n, const uint8_t *p,
                         uint64_t max_elems, int depth)
{
    uint64_t off = 0;
    sb_fmt(b, "[%" PRIu64 " x %s]", n, pe_gguf_type_name(elem_type));
    if (depth > 1) return; /* inner arrays of nested arrays: type and length only */
    sb_str(b, " [");
    for (uint64_t i = 0; i < n && !b->full; i++) {
        if (i) sb_str(b, ", ");
        if (i == max_elems) {
            sb_str(b, "...");
            break;
        }
        if (elem_type == PE_GGUF_TYPE_ARRAY) {
            uint32_t et;
            uint64_t m;
            memcpy(&et, p + off, 4);
            memcpy(&m, p + off + 4, 8);
            render_array(b, et, m, p + off + 12, max_elems, depth + 1);
        } else if (elem_type == PE_GGUF_TYPE_STRING) {
            pe_gguf_str s;
            memcpy(&s.len, p + off, 8);
            s.ptr = (const char *)p + off + 8;
            sb_quoted(b, s, 40);
        } else {
            render_scalar(b, elem_type, p + off);
        }
        off += value_span(elem_type, p + off);
    }
    sb_str(b, "]");
}

void pe_gguf_kv_to_string(const pe_gguf_kv *kv, char *buf, size_t buflen)
{
    sbuf b = {buf, buflen, 0, 0};
    if (buflen == 0) return;
    buf[0] = '\0';
    if (kv->type == PE_GGUF_TYPE_ARRAY) {
        render_array(&b, kv->arr_type, kv->n, kv->data, 8, 1);
    } else {
        render_scalar(&b, kv->type, kv->data);
    }
}

/* ---- writer ---- */

typedef struct wkv {
    char *key;
    uint32_t type;
    uint8_t *val; /* the value as encoded in the file (arrays: elem type, n, elements) */
    uint64_t val_len;
} wkv;

typedef struct wtensor {
    char *name;
    uint32_t type, n_dims;
    uint64_t ne[4];
    uint64_t n_bytes, row_bytes, offset;
} wtensor;

struct pe_gguf_writer {
    uint32_t version;
    uint64_t alignment;
    wkv *kvs;
    uint64_t n_kv, cap_kv;
    wtensor *ts;
    uint64_t n_t, cap_t;
};

pe_gguf_writer *pe_gguf_writer_create(uint32_t version, uint64_t alignment)
{
    pe_gguf_writer *w;
    if (alignment == 0) alignment = PE_GGUF_DEFAULT_ALIGNMENT;
    if ((version != 2 && version != 3) || (alignment & (alignment - 1)) != 0 ||
        alignment > UINT32_MAX) {
        return NULL;
    }
    w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->version = version;
    w->alignment = PE_GGUF_DEFAULT_ALIGNMENT;
    if (alignment != PE_GGUF_DEFAULT_ALIGNMENT &&
        pe_gguf_writer_set_u32(w, "general.alignment", (uint32_t)alignment) != 0) {
        pe_gguf_writer_destroy(w);
        return NULL;
    }
    return w;
}

void pe_gguf_writer_destroy(pe_gguf_writer *w)
{
    if (!w) return;
    for (uint64_t i = 0; i < w->n_kv; i++) {
        free(w->kvs[i].key);
        free(w->kvs[i].val);
    }
    for (uint64_t i = 0; i < w->n_t; i++)
        free(w->ts[i].name);
    free(w->kvs);
    free(w->ts);
    free(w);
}

static char *dup_str(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

/* Adds or replaces key with an encoded value; takes ownership of val (freed on failure). */
static int put_kv(pe_gguf_writer *w, const char *key, uint32_t type, uint8_t *val, uint64_t val_len)
{
    wkv *kv = NULL;
    if (!key) {
        free(val);
        return -1;
    }
    for (uint64_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kvs[i].key, key) == 0) kv = &w->kvs[i];
    }
    if (!kv) {
        char *k;
        if (w->n_kv == w->cap_kv) {
            uint64_t cap = w->cap_kv ? 2 * w->cap_kv : 16;
            wkv *nk = realloc(w->kvs, cap * sizeof *nk);
            if (!nk) {
                free(val);
                return -1;
            }
            w->kvs = nk;
            w->cap_kv = cap;
        }
        k = dup_str(key, strlen(key));
        if (!k) {
            free(val);
            return -1;
        }
        kv = &w->kvs[w->n_kv];
        w->n_kv++;
        kv->key = k;
        kv->val = NULL;
    }
    free(kv->val);
    kv->type = type;
    kv->val = val;
    kv->val_len = val_len;
    /* The writer pads to the alignment the file declares. */
    if (strcmp(key, "general.alignment") == 0 && type == PE_GGUF_TYPE_UINT32) {
        uint32_t a;
        memcpy(&a, val, 4);
        if (a != 0 && (a & (a - 1)) == 0) w->alignment = a;
    }
    return 0;
}

static int put_bytes(pe_gguf_writer *w, const char *key, uint32_t type, const void *v, uint64_t n)
{
    uint8_t *val = malloc(n ? n : 1);
    if (!val) return -1;
    if (n) memcpy(val, v, n);
    return put_kv(w, key, type, val, n);
}

int pe_gguf_writer_set_val(pe_gguf_writer *w, const char *key, uint32_t type, const void *v)
{
    if (scalar_size(type) == 0) return -1;
    return put_bytes(w, key, type, v, scalar_size(type));
}

int pe_gguf_writer_set_u32(pe_gguf_writer *w, const char *key, uint32_t v)
{
    return put_bytes(w, key, PE_GGUF_TYPE_UINT32, &v, 4);
}

int pe_gguf_writer_set_i32(pe_gguf_writer *w, const char *key, int32_t v)
{
    return put_bytes(w, key, PE_GGUF_TYPE_INT32, &v, 4);
}

int pe_gguf_writer_set_u64(pe_gguf_writer *w, const char *key, uint64_t v)
{
    return put_bytes(w, key, PE_GGUF_TYPE_UINT64, &v, 8);
}

int pe_gguf_writer_set_f32(pe_gguf_writer *w, const char *key, float v)
{
    return put_bytes(w, key, PE_GGUF_TYPE_FLOAT32, &v, 4);
}

int pe_gguf_writer_set_bool(pe_gguf_writer *w, const char *key, int v)
{
    uint8_t b = v != 0;
    return put_bytes(w, key, PE_GGUF_TYPE_BOOL, &b, 1);
}

int pe_gguf_writer_set_str(pe_gguf_writer *w, const char *key, const char *v)
{
    uint64_t n = strlen(v);
    uint8_t *val = malloc(8 + n);
    if (!val) return -1;
    memcpy(val, &n, 8);
    memcpy(val + 8, v, n);
    return put_kv(w, key, PE_GGUF_TYPE_STRING, val, 8 + n);
}

int pe_gguf_writer_set_arr(pe_gguf_writer *w, const char *key, uint32_t elem_type, const void *data,
                           uint64_t n)
{
    uint64_t esz = scalar_size(elem_type);
    uint8_t *val;
    if (esz == 0 || n > (UINT64_MAX - 12) / esz || (n && !data)) return -1;
    val = malloc(12 + n * esz);
    if (!val) return -1;
    memcpy(val, &elem_type, 4);
    memcpy(val + 4, &n, 8);
    if (n) memcpy(val + 12, data, n * esz);
    return put_kv(w, key, PE_GGUF_TYPE_ARRAY, val, 12 + n * esz);
}

int pe_gguf_writer_set_arr_str(pe_gguf_writer *w, const char *key, const pe_gguf_str *strs,
                               uint64_t n)
{
    uint64_t len = 12;
    uint32_t et = PE_GGUF_TYPE_STRING;
    uint8_t *val, *p;
    for (uint64_t i = 0; i < n; i++)
        len += 8 + strs[i].len;
    val = malloc(len);
    if (!val) return -1;
    memcpy(val, &et, 4);
    memcpy(val + 4, &n, 8);
    p = val + 12;
    for (uint64_t i = 0; i < n; i++) {
        memcpy(p, &strs[i].len, 8);
        if (strs[i].len) memcpy(p + 8, strs[i].ptr, strs[i].len);
        p += 8 + strs[i].len;
    }
    return put_kv(w, key, PE_GGUF_TYPE_ARRAY, val, len);
}

int pe_gguf_writer_copy_kv(pe_gguf_writer *w, const pe_gguf_kv *kv)
{
    char *key;
    int rc;
    if (kv->type >= PE_GGUF_TYPE_COUNT) return -1;
    key = dup_str(kv->key.ptr, kv->key.len);
    if (!key) return -1;
    if (kv->type == PE_GGUF_TYPE_ARRAY) {
        uint64_t body = array_body_span(kv->arr_type, kv->n, kv->data);
        uint8_t *val = malloc(12 + body);
        if (!val) {
            free(key);
            return -1;
        }
        memcpy(val, &kv->arr_type, 4);
        memcpy(val + 4, &kv->n, 8);
        if (body) memcpy(val + 12, kv->data, body);
        rc = put_kv(w, key, PE_GGUF_TYPE_ARRAY, val, 12 + body);
    } else {
        rc = put_bytes(w, key, kv->type, kv->data, value_span(kv->type, kv->data));
    }
    free(key);
    return rc;
}

int pe_gguf_writer_add_tensor(pe_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                              const uint64_t *ne)
{
    wtensor *t;
    uint64_t n_rows = 1, row;
    if (!name || n_dims < 1 || n_dims > 4) return -1;
    row = pe_ggml_row_size(type, ne[0]);
    if (row == 0) return -1;
    for (uint32_t d = 1; d < n_dims; d++) {
        if (ne[d] == 0 || n_rows > UINT64_MAX / ne[d]) return -1;
        n_rows *= ne[d];
    }
    if (row > UINT64_MAX / n_rows) return -1;
    for (uint64_t i = 0; i < w->n_t; i++) {
        if (strcmp(w->ts[i].name, name) == 0) return -1;
    }
    if (w->n_t == w->cap_t) {
        uint64_t cap = w->cap_t ? 2 * w->cap_t : 64;
        wtensor *nt = realloc(w->ts, cap * sizeof *nt);
        if (!nt) return -1;
        w->ts = nt;
        w->cap_t = cap;
    }
    t = &w->ts[w->n_t];
    memset(t, 0, sizeof *t);
    t->name = dup_str(name, strlen(name));
    if (!t->name) return -1;
    t->type = type;
    t->n_dims = n_dims;
    for (uint32_t d = 0; d < 4; d++)
        t->ne[d] = d < n_dims ? ne[d] : 1;
    t->row_bytes = row;
    t->n_bytes = row * n_rows;
    w->n_t++;
    return 0;
}

uint64_t pe_gguf_writer_data_bytes(const pe_gguf_writer *w)
{
    uint64_t off = 0;
    for (uint64_t i = 0; i < w->n_t; i++) {
        off += (w->ts[i].n_bytes + w->alignment - 1) / w->alignment * w->alignment;
    }
    return off;
}

/* A growable byte buffer for the metadata. */
typedef struct bbuf {
    uint8_t *p;
    uint64_t len, cap;
    int oom;
} bbuf;

static void bb_put(bbuf *b, const void *src, uint64_t n)
{
    if (b->oom) return;
    if (b->len + n > b->cap) {
        uint64_t cap = b->cap ? b->cap : 4096;
        uint8_t *np;
        while (cap < b->len + n)
            cap *= 2;
        np = realloc(b->p, cap);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, src, n);
    b->len += n;
}

static void bb_u32(bbuf *b, uint32_t v)
{
    bb_put(b, &v, 4);
}

static void bb_u64(bbuf *b, uint64_t v)
{
    bb_put(b, &v, 8);
}

static void bb_str(bbuf *b, const char *s)
{
    uint64_t n = strlen(s);
    bb_u64(b, n);
    bb_put(b, s, n);
}

static int write_all(int fd, const void *p, uint64_t n)
{
    const char *c = p;
    while (n) {
        ssize_t k = write(fd, c, n > (1u << 30) ? (1u << 30) : (size_t)n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            if (k == 0) errno = EIO;
            return -1;
        }
        c += k;
        n -= (uint64_t)k;
    }
    return 0;
}

typedef struct whole_ctx {
    pe_gguf_fill_fn fill;
    void *ud;
} whole_ctx;

static int fill_whole(void *ud, uint64_t tensor_index, uint64_t offset, void *dst, uint64_t n_bytes)
{
    const whole_ctx *c = ud;
    (void)offset; /* always 0: the whole tensor in one piece */
    return c->fill(c->ud, tensor_index, dst, n_bytes);
}

/* The bytes of tensor t asked for at once: all of it, or the most whole rows that fit in
 * max_piece (at least one). */
static uint64_t piece_bytes(const wtensor *t, uint64_t max_piece)
{
    uint64_t rows = max_piece / t->row_bytes;
    if (t->n_bytes <= max_piece) return t->n_bytes;
    return t->row_bytes * (rows ? rows : 1);
}

/* Writes the file; tensors are requested in pieces of at most max_piece bytes (whole rows,
 * or one row when a row is larger). */
static int writer_write(pe_gguf_writer *w, const char *path, pe_gguf_fill_chunk_fn fill, void *ud,
                        uint64_t max_piece, char *err, size_t errlen)
{
    static const uint8_t zeros[256];
    bbuf b = {0};
    char *tmp = NULL;
    uint8_t *buf = NULL;
    uint64_t off = 0, buf_bytes = 0;
    int fd = -1, rc = -1;

    /* Offsets, and the largest piece the callback will be asked for. */
    for (uint64_t i = 0; i < w->n_t; i++) {
        wtensor *t = &w->ts[i];
        uint64_t piece = piece_bytes(t, max_piece);
        if (piece > buf_bytes) buf_bytes = piece;
        t->offset = off;
        off += (t->n_bytes + w->alignment - 1) / w->alignment * w->alignment;
    }

    bb_put(&b, "GGUF", 4);
    bb_u32(&b, w->version);
    bb_u64(&b, w->n_t);
    bb_u64(&b, w->n_kv);
    for (uint64_t i = 0; i < w->n_kv; i++) {
        bb_str(&b, w->kvs[i].key);
        bb_u32(&b, w->kvs[i].type);
        bb_put(&b, w->kvs[i].val, w->kvs[i].val_len);
    }
    for (uint64_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->ts[i];
        bb_str(&b, t->name);
        bb_u32(&b, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++)
            bb_u64(&b, t->ne[d]);
        bb_u32(&b, t->type);
        bb_u64(&b, t->offset);
    }
    bb_put(&b, zeros, (w->alignment - b.len % w->alignment) % w->alignment);
    if (b.oom) {
        set_err(err, errlen, "out of memory for the metadata");
        goto out;
    }
    if (buf_bytes) {
        buf = malloc(buf_bytes);
        if (!buf) {
            set_err(err, errlen, "out of memory for a %" PRIu64 "-byte tensor buffer", buf_bytes);
            goto out;
        }
    }

    tmp = malloc(strlen(path) + 5);
    if (!tmp) {
        set_err(err, errlen, "out of memory");
        goto out;
    }
    memcpy(tmp, path, strlen(path));
    memcpy(tmp + strlen(path), ".tmp", 5);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        set_err(err, errlen, "cannot create '%s': %s", tmp, strerror(errno));
        goto out;
    }
    if (write_all(fd, b.p, b.len) != 0) {
        set_err(err, errlen, "write '%s': %s", tmp, strerror(errno));
        goto out;
    }
    for (uint64_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->ts[i];
        uint64_t pad = (w->alignment - t->n_bytes % w->alignment) % w->alignment;
        uint64_t piece = piece_bytes(t, max_piece);
        for (uint64_t pos = 0; pos < t->n_bytes;) {
            uint64_t n = t->n_bytes - pos < piece ? t->n_bytes - pos : piece;
            if (!fill) {
                memset(buf, 0, n);
            } else if (fill(ud, i, pos, buf, n) != 0) {
                set_err(err, errlen, "tensor '%s': the data callback failed", t->name);
                goto out;
            }
            if (write_all(fd, buf, n) != 0) {
                set_err(err, errlen, "write '%s': tensor '%s': %s", tmp, t->name, strerror(errno));
                goto out;
            }
            pos += n;
        }
        while (pad) {
            uint64_t n = pad < sizeof zeros ? pad : sizeof zeros;
            if (write_all(fd, zeros, n) != 0) {
                set_err(err, errlen, "write '%s': %s", tmp, strerror(errno));
                goto out;
            }
            pad -= n;
        }
    }
    if (close(fd) != 0) {
        fd = -1;
        set_err(err, errlen, "close '%s': %s", tmp, strerror(errno));
        goto out;
    }
    fd = -1;
    if (rename(tmp, path) != 0) {
        set_err(err, errlen, "rename '%s' to '%s': %s", tmp, path, strerror(errno));
        goto out;
    }
    rc = 0;
out:
    if (fd >= 0) close(fd);
    if (rc != 0 && tmp) unlink(tmp);
    free(tmp);
    free(buf);
    free(b.p);
    return rc;
}

int pe_gguf_writer_write(pe_gguf_writer *w, const char *path, pe_gguf_fill_fn fill, void *ud,
                         char *err, size_t errlen)
{
    whole_ctx c = {fill, ud};
    return writer_write(w, path, fill ? fill_whole : NULL, &c, UINT64_MAX, err, errlen);
}

int pe_gguf_writer_write_chunks(pe_gguf_writer *w, const char *path, pe_gguf_fill_chunk_fn fill,
                                void *ud, char *err, size_t errlen)
{
    return writer_write(w, path, fill, ud, PE_GGUF_CHUNK_BYTES, err, errlen);
}
