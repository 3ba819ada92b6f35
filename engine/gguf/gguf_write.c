/* SPDX-License-Identifier: MIT */
/*
 * gguf_write.c - the streaming GGUF writer declared in gguf.h (pe_gguf_writer_*).
 *
 * Callers: `pagoda synth-model` (tools/synth_model.c) and the tests that make valid and
 * malformed files.
 *
 * Metadata is kept encoded in memory, as it will stand in the file (it is small, even a
 * 150k-token vocabulary); tensor data is requested from a callback tensor by tensor, in
 * pieces of at most PE_GGUF_CHUNK_BYTES (whole rows), and written straight to PATH.tmp,
 * which is renamed to PATH once complete, so a reader never sees a half-written file.
 *
 *   [magic|version|n_tensors|n_kv][kv ...][tensor info ...][pad][tensor 0|pad][tensor 1|pad]...
 *
 * Invariants: keys and tensor names are unique (a key set again replaces its value, a
 * duplicate tensor name is refused); the alignment is a power of two and the one the file
 * declares (general.alignment); every tensor offset is a multiple of it.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"
#include "gguf_int.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf_write.c writes little-endian GGUF with plain memcpy: little-endian hosts only"
#endif

#define PE_GGUF_CHUNK_BYTES (64u << 20) /* largest piece of tensor data asked of a fill_chunk */

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
    if (pe__gguf_scalar_size(type) == 0) return -1;
    return put_bytes(w, key, type, v, pe__gguf_scalar_size(type));
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
    uint64_t esz = pe__gguf_scalar_size(elem_type);
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
        uint64_t body = pe__gguf_array_body_span(kv->arr_type, kv->n, kv->data);
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
        rc = put_bytes(w, key, kv->type, kv->data, pe__gguf_value_span(kv->type, kv->data));
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
        pe__gguf_set_err(err, errlen, "out of memory for the metadata");
        goto out;
    }
    if (buf_bytes) {
        buf = malloc(buf_bytes);
        if (!buf) {
            pe__gguf_set_err(err, errlen, "out of memory for a %" PRIu64 "-byte tensor buffer",
                             buf_bytes);
            goto out;
        }
    }

    tmp = malloc(strlen(path) + 5);
    if (!tmp) {
        pe__gguf_set_err(err, errlen, "out of memory");
        goto out;
    }
    memcpy(tmp, path, strlen(path));
    memcpy(tmp + strlen(path), ".tmp", 5);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        pe__gguf_set_err(err, errlen, "cannot create '%s': %s", tmp, strerror(errno));
        goto out;
    }
    if (write_all(fd, b.p, b.len) != 0) {
        pe__gguf_set_err(err, errlen, "write '%s': %s", tmp, strerror(errno));
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
                pe__gguf_set_err(err, errlen, "tensor '%s': the data callback failed", t->name);
                goto out;
            }
            if (write_all(fd, buf, n) != 0) {
                pe__gguf_set_err(err, errlen, "write '%s': tensor '%s': %s", tmp, t->name,
                                 strerror(errno));
                goto out;
            }
            pos += n;
        }
        while (pad) {
            uint64_t n = pad < sizeof zeros ? pad : sizeof zeros;
            if (write_all(fd, zeros, n) != 0) {
                pe__gguf_set_err(err, errlen, "write '%s': %s", tmp, strerror(errno));
                goto out;
            }
            pad -= n;
        }
    }
    if (close(fd) != 0) {
        fd = -1;
        pe__gguf_set_err(err, errlen, "close '%s': %s", tmp, strerror(errno));
        goto out;
    }
    fd = -1;
    if (rename(tmp, path) != 0) {
        pe__gguf_set_err(err, errlen, "rename '%s' to '%s': %s", tmp, path, strerror(errno));
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
