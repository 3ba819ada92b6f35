/* SPDX-License-Identifier: MIT */
/*
 * gguf.c - the GGUF v2/v3 reader declared in gguf.h: open (mmap or memory), lookups,
 * typed getters. The module's other two files: gguf_render.c (values as text) and
 * gguf_write.c (the writer); gguf_int.h holds what the three share.
 *
 * Callers: the model loader and the tokenizer, `pagoda inspect`, the tests, the fuzz
 * target (reader over memory).
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
#include "gguf_int.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.c reads little-endian GGUF with plain memcpy: little-endian hosts only"
#endif

#define PE_GGUF_MAX_DEPTH 8 /* arrays of arrays nested deeper are refused */

/* Smallest possible records, used to bound counts before anything is allocated. */
#define MIN_KV_BYTES 13     /* u64 key length + u32 type + a 1-byte value */
#define MIN_TENSOR_BYTES 32 /* u64 name length + u32 n_dims + u64 ne[0] + u32 type + u64 */

void pe__gguf_set_err(char *err, size_t errlen, const char *fmt, ...)
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
    pe__gguf_set_err(r->err, r->errlen, "%s%s%s", r->ctx, r->ctx[0] ? ": " : "", msg);
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
    if (type != PE_GGUF_TYPE_ARRAY) return rd_bytes(r, pe__gguf_scalar_size(type), "value", &p);
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
    uint64_t esz = pe__gguf_scalar_size(elem_type);
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
        pe__gguf_set_err(err, errlen, "no buffer");
        return -1;
    }
    f = calloc(1, sizeof *f);
    if (!f) {
        pe__gguf_set_err(err, errlen, "out of memory");
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
    /* O_NONBLOCK: opening a FIFO (or a device) must not block waiting for a writer; a
     * non-regular file is refused below, and the flag changes nothing for the mmap. */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        pe__gguf_set_err(err, errlen, "cannot open: %s", strerror(errno));
        return -1;
    }
    if (fstat(fd, &st) != 0) {
        pe__gguf_set_err(err, errlen, "cannot stat: %s", strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        pe__gguf_set_err(err, errlen, "not a regular file (a FIFO, device or directory)");
        close(fd);
        return -1;
    }
    if (st.st_size > 0) {
        map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            pe__gguf_set_err(err, errlen, "cannot mmap %lld bytes: %s", (long long)st.st_size,
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

int pe__gguf_int_value(uint32_t type, const uint8_t *p, uint64_t *mag, int *neg)
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
    return pe__gguf_int_value(kv->type, kv->data, mag, neg);
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
    if (kv->type != PE_GGUF_TYPE_ARRAY || i >= kv->n || pe__gguf_scalar_size(kv->arr_type) == 0)
        return 0;
    p = kv->data + i * pe__gguf_scalar_size(kv->arr_type);
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
    if (pe__gguf_int_value(kv->arr_type, p, &mag, &neg) != 0) return 0;
    return neg ? -(double)mag : (double)mag;
}

/* Element i of a numeric array, as int64 (floats truncated, out-of-range values clamped);
 * 0 when not numeric or out of range. */
int64_t pe_gguf_arr_i64(const pe_gguf_kv *kv, uint64_t i)
{
    const uint8_t *p = NULL;
    uint64_t mag;
    int neg;
    if (kv->type != PE_GGUF_TYPE_ARRAY || i >= kv->n || pe__gguf_scalar_size(kv->arr_type) == 0)
        return 0;
    p = kv->data + i * pe__gguf_scalar_size(kv->arr_type);
    if (kv->arr_type == PE_GGUF_TYPE_FLOAT32 || kv->arr_type == PE_GGUF_TYPE_FLOAT64) {
        double d = pe_gguf_arr_f64(kv, i);
        if (!(d == d)) return 0; /* NaN */
        if (d >= 9223372036854775807.0) return INT64_MAX;
        if (d <= -9223372036854775808.0) return INT64_MIN;
        return (int64_t)d;
    }
    if (kv->arr_type == PE_GGUF_TYPE_BOOL) return p[0] != 0;
    if (pe__gguf_int_value(kv->arr_type, p, &mag, &neg) != 0) return 0;
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

/* ---- value spans (for the renderer and the writer) ---- */

uint64_t pe__gguf_array_body_span(uint32_t elem_type, uint64_t n, const uint8_t *p)
{
    uint64_t off = 0;
    if (pe__gguf_scalar_size(elem_type)) return n * pe__gguf_scalar_size(elem_type);
    for (uint64_t i = 0; i < n; i++)
        off += pe__gguf_value_span(elem_type, p + off);
    return off;
}

uint64_t pe__gguf_value_span(uint32_t type, const uint8_t *p)
{
    uint64_t n;
    uint32_t et;
    if (type == PE_GGUF_TYPE_STRING) {
        memcpy(&n, p, 8);
        return 8 + n;
    }
    if (type != PE_GGUF_TYPE_ARRAY) return pe__gguf_scalar_size(type);
    memcpy(&et, p, 4);
    memcpy(&n, p + 4, 8);
    return 12 + pe__gguf_array_body_span(et, n, p + 12);
}
