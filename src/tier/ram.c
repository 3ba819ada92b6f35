/* SPDX-License-Identifier: MIT */
/*
 * ram.c - the RAM tier: page records in host memory, one lock, a bound in bytes, leaf-only
 * eviction within itself ordered by a policy (params.policy, LRU by default; retention:
 * expired records first, retention pins kept, map.c), each victim handed to the caller's
 * spill callback.
 *
 *     map (tier_int.h: hash -> slot, children, LRU)      recs[slot]
 *                                                        +------+------+----------------+
 *                                                        | refs | size | header|payload |
 *                                                        +------+------+----------------+
 *
 * A record is the page record of tier.h, header included, in one allocation. Its payload
 * is the page in the pool's codec (default), or re-encoded into another codec (a lossy
 * choice: params.store_type, e.g. q8_0: decoded to f32 per region, encoded again; get
 * decodes back into the pool's codec), then compressed when params.compression asks for
 * lz4 or zstd and compression shrinks it (else it is stored RAW: the header says which).
 *
 * Locking: one mutex guards the map, the counters and refs. Encoding, compression,
 * checksums and copies run outside it: put encodes before it takes the lock, get pins the
 * record (refs) and copies it out unlocked; an evicted or deleted record leaves the map at
 * once and is freed by its last reference. spill is called with the lock released.
 * Accounting: bytes_used is the header and payload bytes of the records in the map (a
 * record being read after it left the map is not counted); at most capacity_bytes.
 * Slots: capacity_bytes / (header + raw payload) records, or / (header + raw / 16) with
 * compression (so a page compressed more than 16x does not add records); about 90 bytes
 * of map per slot (tier_int.h), 0.4% of the bound at 16x for a 1B model's f16 page.
 *
 * Callers: the cache's movers (through the tier handle), tests, benches.
 */
#include <lz4.h>
#include <pthread.h>
#include <zstd.h>

#include "tier/tier_int.h"

/* Records compress at most this much for the slot count (see above). */
enum { SLOT_RATIO = 16 };
/* zstd level: 1 is the fastest; bench_tier_ram measures the ratio it gets. */
enum { ZSTD_LEVEL = 1 };

typedef struct ram_rec {
    uint32_t refs;        /* 1 for the map while in it, + 1 per reader or evictor */
    uint32_t slot;        /* slot in the map, PGD__NONE once it left the map */
    uint64_t bytes;       /* header + payload */
    struct ram_rec *next; /* on a put's victim list */
    uint8_t data[];       /* header (128 bytes), then payload */
} ram_rec;

typedef struct ram_tier {
    pgd__alloc al;
    pgd__log lg;
    pthread_mutex_t mu;
    uint64_t capacity_bytes;
    int want_store;               /* params.store_type */
    uint32_t compression;         /* params.compression */
    const pgd_policy_ops *policy; /* params.policy's table */
    double pin_share;             /* resolved: (0, 1] */
    /* Set by bind (once). */
    int bound;
    pgd_record_ident ident;
    uint32_t store_type;
    const pgd__codec *pool_codec, *store_codec;
    size_t pool_region, store_region; /* region bytes of either codec */
    uint64_t store_page_bytes;        /* page bytes in the stored codec */
    uint64_t raw_bytes;               /* store_page_bytes + bounds_bytes */
    uint64_t pool_raw_bytes;          /* page_bytes + bounds_bytes: what put / get move */
    pgd__tmap *map;
    ram_rec **recs; /* [map capacity] */
    pgd_tier_stats st;
} ram_tier;

static const pgd_tier_ops ram_ops;

/* ---- records ---- */

static void rec_release(ram_tier *t, ram_rec *r)
{
    /* Called with the lock held. */
    if (--r->refs == 0) pgd__free(&t->al, r);
}

/* Takes r out of the map (eviction, del, a damaged record). The map's reference goes to
 * the caller, who releases it. Lock held. */
static void rec_detach(ram_tier *t, ram_rec *r)
{
    pgd__tmap_remove(t->map, r->slot);
    t->recs[r->slot] = NULL;
    r->slot = PGD__NONE;
    t->st.bytes_used -= r->bytes;
}

/* Decodes one whole region (page_tokens x head_dim values) to f32: the layouts of
 * layout.h for f32, f16, q8_0 and q4_0 directly, the others through the codec (whose
 * decode_rows is the reference, a call per value). bench_tier_ram, get of f16 pages
 * stored as q8_0: 350-860 -> 1250-1790 MB/s; as q4_0: 400 -> 1620-2130 MB/s. (Encoding
 * stays the codecs' encode_page: q8_0 / q4_0 quantization is what bounds a re-encoding
 * put, and a get into a q8_0 pool, at 70-160 MB/s.) */
static void decode_region(const pgd__codec *c, pgd__kv_kind kind, const uint8_t *region,
                          uint32_t pt, uint32_t hd, float *out)
{
    size_t n = (size_t)pt * hd;
    const int8_t *codes = (const int8_t *)region;
    uint16_t sc16;
    switch (c->type) {
    case PGD_KV_F32:
        memcpy(out, region, n * sizeof(float));
        return;
    case PGD_KV_F16:
        pgd__f16_to_f32_n((const uint16_t *)(const void *)region, out, n);
        return;
    case PGD_KV_Q8_0: /* codes[n], then f16 scales[n / 32] */
        for (size_t b = 0; b < n / 32; b++) {
            memcpy(&sc16, region + n + 2 * b, 2);
            float d = pgd__f16_to_f32(sc16);
            for (size_t i = 0; i < 32; i++)
                out[32 * b + i] = (float)codes[32 * b + i] * d;
        }
        return;
    case PGD_KV_Q4_0: /* codes[n / 2] (block b: bytes 16 b .., low nibbles first), scales */
        for (size_t b = 0; b < n / 32; b++) {
            memcpy(&sc16, region + n / 2 + 2 * b, 2);
            float d = pgd__f16_to_f32(sc16);
            const uint8_t *q = region + 16 * b;
            for (size_t i = 0; i < 16; i++) {
                out[32 * b + i] = (float)((int)(q[i] & 15) - 8) * d;
                out[32 * b + 16 + i] = (float)((int)(q[i] >> 4) - 8) * d;
            }
        }
        return;
    default:
        c->decode_rows(kind, region, pt, hd, 0, pt, out);
    }
}

/* Re-encodes a page from codec `from` (regions of from_region bytes) into codec `to`
 * (to_region), region by region through f32 rows (f32: page_tokens x head_dim floats). */
static void reencode(const ram_tier *t, const uint8_t *src, const pgd__codec *from,
                     size_t from_region, uint8_t *dst, const pgd__codec *to, size_t to_region,
                     uint64_t dst_page_bytes, float *f32)
{
    const pgd_record_ident *id = &t->ident;
    memset(dst, 0, (size_t)dst_page_bytes); /* padding: the same bytes for the same values */
    for (uint32_t l = 0; l < id->n_layers; l++)
        for (uint32_t kv = 0; kv < 2; kv++)
            for (uint32_t h = 0; h < id->n_kv_heads; h++) {
                size_t r = ((size_t)l * 2 + kv) * id->n_kv_heads + h;
                pgd__kv_kind kind = kv ? PGD__V : PGD__K;
                decode_region(from, kind, src + r * from_region, id->page_tokens, id->head_dim,
                              f32);
                to->encode_page(kind, dst + r * to_region, id->page_tokens, id->head_dim, f32,
                                id->page_tokens);
            }
}

/* Scratch of one put or get, each buffer allocated when first needed: a stored raw
 * payload (raw_bytes), f32 rows of one region (f32), a pool raw payload (pool). */
typedef struct scratch {
    uint8_t *raw;
    float *f32;
    uint8_t *pool;
} scratch;

static uint8_t *scratch_raw(ram_tier *t, scratch *s)
{
    if (!s->raw) s->raw = pgd__malloc(&t->al, (size_t)t->raw_bytes);
    return s->raw;
}

static float *scratch_f32(ram_tier *t, scratch *s)
{
    if (!s->f32) s->f32 = pgd__malloc(&t->al, (size_t)t->ident.page_tokens * t->ident.head_dim * 4);
    return s->f32;
}

static uint8_t *scratch_pool(ram_tier *t, scratch *s)
{
    if (!s->pool) s->pool = pgd__malloc(&t->al, (size_t)t->pool_raw_bytes);
    return s->pool;
}

static void scratch_free(ram_tier *t, scratch *s)
{
    pgd__free(&t->al, s->raw);
    pgd__free(&t->al, s->f32);
    pgd__free(&t->al, s->pool);
    s->raw = NULL;
    s->f32 = NULL;
    s->pool = NULL;
}

/* Builds the record of (block, parent) from the pool's raw page and bounds. Returns
 * PGD_OK (*out: refs 1, not in the map) or PGD_ENOMEM. No lock needed: t's bound
 * fields do not change after bind. */
static int rec_build(ram_tier *t, pgd_hash block, pgd_hash parent, const void *page,
                     const void *bounds, scratch *s, ram_rec **out)
{
    const pgd_record_ident *id = &t->ident;
    int reencoded = t->store_type != id->kv_type;
    uint64_t cap = t->raw_bytes;
    *out = NULL;
    if (t->compression == PGD_RECORD_LZ4)
        cap = (uint64_t)LZ4_compressBound((int)t->raw_bytes);
    else if (t->compression == PGD_RECORD_ZSTD)
        cap = ZSTD_compressBound((size_t)t->raw_bytes);
    if (reencoded && !scratch_f32(t, s)) return PGD_ENOMEM;
    /* The stored raw payload, contiguous: the pool page itself when it is that (same
     * codec, no bounds), else staged in scratch. Not needed raw: encoded in place. */
    const uint8_t *src = page;
    if (t->compression != PGD_RECORD_RAW && (reencoded || id->bounds_bytes)) {
        uint8_t *stage = scratch_raw(t, s);
        if (!stage) return PGD_ENOMEM;
        if (reencoded)
            reencode(t, page, t->pool_codec, t->pool_region, stage, t->store_codec, t->store_region,
                     t->store_page_bytes, s->f32);
        else
            memcpy(stage, page, (size_t)id->page_bytes);
        if (id->bounds_bytes) memcpy(stage + t->store_page_bytes, bounds, (size_t)id->bounds_bytes);
        src = stage;
    }
    ram_rec *r = pgd__malloc(&t->al, sizeof *r + PGD_RECORD_HEADER_BYTES + (size_t)cap);
    if (!r) return PGD_ENOMEM;
    uint8_t *payload = r->data + PGD_RECORD_HEADER_BYTES;
    pgd_record_info info;
    memset(&info, 0, sizeof info);
    info.ident = *id;
    info.block = block;
    info.parent = parent;
    info.store_type = t->store_type;
    info.raw_bytes = t->raw_bytes;
    info.compression = PGD_RECORD_RAW;
    info.payload_bytes = t->raw_bytes;
    if (t->compression == PGD_RECORD_RAW) {
        if (reencoded)
            reencode(t, page, t->pool_codec, t->pool_region, payload, t->store_codec,
                     t->store_region, t->store_page_bytes, s->f32);
        else
            memcpy(payload, page, (size_t)id->page_bytes);
        if (id->bounds_bytes)
            memcpy(payload + t->store_page_bytes, bounds, (size_t)id->bounds_bytes);
    } else {
        uint64_t n = 0;
        if (t->compression == PGD_RECORD_LZ4) {
            int c = LZ4_compress_default((const char *)src, (char *)payload, (int)t->raw_bytes,
                                         (int)cap);
            n = c > 0 ? (uint64_t)c : 0;
        } else {
            size_t c = ZSTD_compress(payload, (size_t)cap, src, (size_t)t->raw_bytes, ZSTD_LEVEL);
            n = ZSTD_isError(c) ? 0 : c;
        }
        if (n && n < t->raw_bytes) {
            info.compression = t->compression;
            info.payload_bytes = n;
        } else {
            memcpy(payload, src, (size_t)t->raw_bytes); /* incompressible: stored raw */
        }
        if (info.payload_bytes < cap) {
            ram_rec *small = pgd__realloc(
                &t->al, r, sizeof *r + PGD_RECORD_HEADER_BYTES + (size_t)info.payload_bytes);
            if (small) r = small;
            payload = r->data + PGD_RECORD_HEADER_BYTES;
        }
    }
    PGD_CHECK(pgd_record_write_header(&info, payload, r->data) == PGD_OK);
    r->refs = 1;
    r->slot = PGD__NONE;
    r->bytes = PGD_RECORD_HEADER_BYTES + info.payload_bytes;
    r->next = NULL;
    *out = r;
    return PGD_OK;
}

/* Verifies record r of block and decodes it into page and bounds (the pool's raw
 * payload). Returns PGD_OK, PGD_ECORRUPT (damaged: the destination holds garbage) or
 * PGD_ENOMEM. No lock: the caller holds a reference. */
static int rec_decode(ram_tier *t, const ram_rec *r, pgd_hash block, void *page, void *bounds,
                      scratch *s)
{
    const pgd_record_ident *id = &t->ident;
    const uint8_t *payload = r->data + PGD_RECORD_HEADER_BYTES;
    pgd_record_info info;
    int rc = pgd_record_read_header(r->data, NULL, 0, id, &info);
    if (rc != PGD_OK || !pgd_hash_eq(info.block, block) || info.store_type != t->store_type ||
        r->bytes != PGD_RECORD_HEADER_BYTES + info.payload_bytes)
        return PGD_ECORRUPT;
    if (info.compression == PGD_RECORD_RAW && info.store_type == id->kv_type)
        return pgd__record_copy_verified(r->data, payload, page, id->page_bytes, bounds,
                                         id->bounds_bytes);
    /* Verify first, then decompress / decode: garbage never reaches a decoder. */
    const void *parts[1] = {payload};
    uint64_t part_bytes[1] = {info.payload_bytes};
    if (pgd__record_checksum(r->data, parts, part_bytes, 1) != pgd__record_stored_checksum(r->data))
        return PGD_ECORRUPT;
    const uint8_t *raw = payload;
    if (info.compression != PGD_RECORD_RAW) {
        uint8_t *dst;
        if (info.store_type == id->kv_type && !id->bounds_bytes) {
            dst = page; /* straight into the pool page */
        } else {
            dst = scratch_raw(t, s);
            if (!dst) return PGD_ENOMEM;
        }
        uint64_t n = 0;
        if (info.compression == PGD_RECORD_LZ4) {
            int c = LZ4_decompress_safe((const char *)payload, (char *)dst, (int)info.payload_bytes,
                                        (int)info.raw_bytes);
            n = c > 0 ? (uint64_t)c : 0;
        } else {
            size_t c =
                ZSTD_decompress(dst, (size_t)info.raw_bytes, payload, (size_t)info.payload_bytes);
            n = ZSTD_isError(c) ? 0 : c;
        }
        if (n != info.raw_bytes) return PGD_ECORRUPT;
        if (dst == page) return PGD_OK;
        raw = dst;
    }
    if (info.store_type == id->kv_type) {
        memcpy(page, raw, (size_t)id->page_bytes);
    } else {
        if (!scratch_f32(t, s)) return PGD_ENOMEM;
        /* raw may be s->raw: decode into page region by region does not overwrite it. */
        reencode(t, raw, t->store_codec, t->store_region, page, t->pool_codec, t->pool_region,
                 id->page_bytes, s->f32);
    }
    if (id->bounds_bytes) memcpy(bounds, raw + t->store_page_bytes, (size_t)id->bounds_bytes);
    return PGD_OK;
}

/* ---- ops ---- */

static int ram_bind(void *state, const pgd_record_ident *ident)
{
    ram_tier *t = state;
    int rc = PGD_OK;
    pthread_mutex_lock(&t->mu);
    if (t->bound) {
        rc = pgd_record_ident_eq(&t->ident, ident) ? PGD_OK : PGD_EBUSY;
        goto out;
    }
    rc = PGD_EINVAL;
    uint32_t store = t->want_store < 0 ? ident->kv_type : (uint32_t)t->want_store;
    const pgd__codec *pc = pgd__codec_get((pgd_kv_type)ident->kv_type);
    const pgd__codec *sc = pgd__codec_get((pgd_kv_type)store);
    if (!pc || !sc || !ident->page_bytes ||
        pgd__codec_geometry_error((pgd_kv_type)store, ident->page_tokens, ident->head_dim)) {
        pgd__logf(&t->lg, PGD_LOG_ERROR, "ram tier: cannot store %s pages as %s (head_dim %u)",
                  pgd_kv_type_name((pgd_kv_type)ident->kv_type),
                  pgd_kv_type_name((pgd_kv_type)store), ident->head_dim);
        goto out;
    }
    t->pool_region =
        pgd__codec_region_bytes((pgd_kv_type)ident->kv_type, ident->page_tokens, ident->head_dim);
    t->store_region =
        pgd__codec_region_bytes((pgd_kv_type)store, ident->page_tokens, ident->head_dim);
    uint64_t n_regions = 2ull * ident->n_layers * ident->n_kv_heads;
    PGD_CHECK(t->pool_region * n_regions == ident->page_bytes);
    t->store_page_bytes = t->store_region * n_regions;
    t->raw_bytes = t->store_page_bytes + ident->bounds_bytes;
    t->pool_raw_bytes = ident->page_bytes + ident->bounds_bytes;
    if ((t->compression == PGD_RECORD_LZ4 && t->raw_bytes > LZ4_MAX_INPUT_SIZE) ||
        t->capacity_bytes < PGD_RECORD_HEADER_BYTES + t->raw_bytes) {
        pgd__logf(&t->lg, PGD_LOG_ERROR,
                  "ram tier: capacity of %llu bytes is below one record of %llu bytes",
                  (unsigned long long)t->capacity_bytes,
                  (unsigned long long)(PGD_RECORD_HEADER_BYTES + t->raw_bytes));
        goto out;
    }
    uint64_t min_record =
        PGD_RECORD_HEADER_BYTES +
        (t->compression == PGD_RECORD_RAW ? t->raw_bytes : t->raw_bytes / SLOT_RATIO + 1);
    uint64_t n_slots = t->capacity_bytes / min_record;
    if (n_slots > (1u << 30)) n_slots = 1u << 30;
    rc = pgd__tmap_create(&t->al, (uint32_t)n_slots, t->policy, ident, &t->map);
    if (rc != PGD_OK) goto out;
    pgd__tmap_set_pin_limit(t->map, (uint64_t)(t->pin_share * (double)t->capacity_bytes));
    t->recs = pgd__calloc(&t->al, (size_t)n_slots, sizeof *t->recs);
    if (!t->recs) {
        pgd__tmap_destroy(t->map);
        t->map = NULL;
        rc = PGD_ENOMEM;
        goto out;
    }
    t->ident = *ident;
    t->store_type = store;
    t->pool_codec = pc;
    t->store_codec = sc;
    t->bound = 1;
    rc = PGD_OK;
out:
    pthread_mutex_unlock(&t->mu);
    return rc;
}

/* Hands each victim on list to spill (lock released), then drops it. */
static void spill_victims(ram_tier *t, ram_rec *list, pgd_tier_spill_fn spill, void *ud, scratch *s)
{
    const pgd_record_ident *id = &t->ident;
    while (list) {
        ram_rec *r = list;
        list = r->next;
        int damaged = 0;
        if (spill) {
            pgd_record_info info;
            const uint8_t *payload = r->data + PGD_RECORD_HEADER_BYTES;
            if (pgd_record_read_header(r->data, NULL, 0, &t->ident, &info) != PGD_OK ||
                r->bytes != PGD_RECORD_HEADER_BYTES + info.payload_bytes) {
                damaged = 1; /* the header rotted in memory */
            } else if (info.compression == PGD_RECORD_RAW && info.store_type == id->kv_type) {
                /* Zero copy: the raw payload is the page and the bounds. */
                const void *parts[1] = {payload};
                uint64_t part_bytes[1] = {info.payload_bytes};
                damaged = pgd__record_checksum(r->data, parts, part_bytes, 1) !=
                          pgd__record_stored_checksum(r->data);
                if (!damaged)
                    spill(ud, info.block, info.parent, payload,
                          id->bounds_bytes ? payload + id->page_bytes : NULL);
            } else {
                /* Decoded into the pool's codec. Out of memory: dropped unspilled (the
                 * next tier misses a page it could have had; nothing wrong is served). */
                uint8_t *page = scratch_pool(t, s);
                if (page) {
                    uint8_t *bounds = id->bounds_bytes ? page + id->page_bytes : NULL;
                    int rc = rec_decode(t, r, info.block, page, bounds, s);
                    damaged = rc == PGD_ECORRUPT;
                    if (rc == PGD_OK) spill(ud, info.block, info.parent, page, bounds);
                }
            }
        }
        pthread_mutex_lock(&t->mu);
        if (damaged) t->st.n_corrupt++;
        rec_release(t, r);
        pthread_mutex_unlock(&t->mu);
    }
}

static int ram_put(void *state, pgd_hash block, pgd_hash parent, const void *page,
                   const void *bounds, pgd_tier_spill_fn spill, void *spill_ud)
{
    ram_tier *t = state;
    scratch s = {NULL, NULL, NULL};
    ram_rec *r = NULL, *victims = NULL, **tail = &victims; /* in eviction order */
    uint64_t t0 = pgd__tier_now_ns();
    int rc;

    pthread_mutex_lock(&t->mu);
    if (!t->bound || !page || (t->ident.bounds_bytes && !bounds) || pgd_hash_eq(block, parent)) {
        pthread_mutex_unlock(&t->mu);
        return PGD_EINVAL; /* a block is never its own parent (the disk tier refuses it too) */
    }
    uint32_t held = pgd__tmap_find(t->map, block);
    if (held != PGD__NONE) pgd__tmap_touch(t->map, held); /* demoted again: still in use */
    pthread_mutex_unlock(&t->mu);
    if (held != PGD__NONE) return PGD_OK;

    rc = rec_build(t, block, parent, page, bounds, &s, &r);
    if (rc != PGD_OK) {
        scratch_free(t, &s);
        return rc;
    }

    pthread_mutex_lock(&t->mu);
    if (pgd__tmap_find(t->map, block) != PGD__NONE) {
        rec_release(t, r); /* another thread put it meanwhile */
        pthread_mutex_unlock(&t->mu);
        scratch_free(t, &s);
        return PGD_OK;
    }
    while (t->st.bytes_used + r->bytes > t->capacity_bytes ||
           pgd__tmap_count(t->map) == pgd__tmap_capacity(t->map)) {
        uint32_t v = pgd__tmap_victim(t->map);
        if (v == PGD__NONE) break;
        ram_rec *vr = t->recs[v];
        rec_detach(t, vr); /* the map's reference passes to the victim list */
        *tail = vr;
        tail = &vr->next;
        t->st.n_evictions++;
    }
    if (t->st.bytes_used + r->bytes > t->capacity_bytes ||
        pgd__tmap_count(t->map) == pgd__tmap_capacity(t->map)) {
        t->st.n_put_refused++; /* everything left is pinned by readers */
        rec_release(t, r);
        rc = PGD_ENOSPC;
    } else {
        uint32_t slot = pgd__tmap_insert(t->map, block, parent);
        PGD_CHECK(slot != PGD__NONE);
        r->slot = slot;
        t->recs[slot] = r;
        t->st.bytes_used += r->bytes;
        t->st.n_puts++;
        t->st.n_put_bytes += t->pool_raw_bytes;
        pgd__tier_lat_add(t->st.put_hist, &t->st.put_ns_sum, pgd__tier_now_ns() - t0);
        rc = PGD_OK;
    }
    pthread_mutex_unlock(&t->mu);
    spill_victims(t, victims, spill, spill_ud, &s);
    scratch_free(t, &s);
    return rc;
}

static int ram_get(void *state, pgd_hash block, void *page, void *bounds)
{
    ram_tier *t = state;
    scratch s = {NULL, NULL, NULL};
    uint64_t t0 = pgd__tier_now_ns();

    pthread_mutex_lock(&t->mu);
    if (!t->bound || !page || (t->ident.bounds_bytes && !bounds)) {
        pthread_mutex_unlock(&t->mu);
        return PGD_EINVAL;
    }
    uint32_t slot = pgd__tmap_find(t->map, block);
    if (slot == PGD__NONE) {
        t->st.n_get_misses++;
        pthread_mutex_unlock(&t->mu);
        return PGD_ENOTFOUND;
    }
    ram_rec *r = t->recs[slot];
    r->refs++;
    pgd__tmap_touch(t->map, slot);
    pthread_mutex_unlock(&t->mu);

    int rc = rec_decode(t, r, block, page, bounds, &s);

    pthread_mutex_lock(&t->mu);
    if (rc == PGD_ECORRUPT) {
        t->st.n_corrupt++;
        t->st.n_get_misses++;
        pgd__logf(&t->lg, PGD_LOG_WARN, "ram tier: a damaged record was dropped");
        if (r->slot != PGD__NONE) {
            rec_detach(t, r);
            rec_release(t, r); /* the map's reference */
        }
        rc = PGD_ENOTFOUND;
    } else if (rc == PGD_OK) {
        t->st.n_gets++;
        t->st.n_get_bytes += t->pool_raw_bytes;
        pgd__tier_lat_add(t->st.get_hist, &t->st.get_ns_sum, pgd__tier_now_ns() - t0);
    }
    rec_release(t, r);
    pthread_mutex_unlock(&t->mu);
    scratch_free(t, &s);
    return rc;
}

static size_t ram_lookup(void *state, const pgd_hash *hashes, size_t n)
{
    ram_tier *t = state;
    size_t i = 0;
    pthread_mutex_lock(&t->mu);
    if (t->bound)
        while (i < n && pgd__tmap_find(t->map, hashes[i]) != PGD__NONE)
            i++;
    pthread_mutex_unlock(&t->mu);
    return i;
}

static int ram_del(void *state, pgd_hash block)
{
    ram_tier *t = state;
    int rc = PGD_ENOTFOUND;
    pthread_mutex_lock(&t->mu);
    uint32_t slot = t->bound ? pgd__tmap_find(t->map, block) : PGD__NONE;
    if (slot != PGD__NONE) {
        ram_rec *r = t->recs[slot];
        rec_detach(t, r);
        rec_release(t, r);
        rc = PGD_OK;
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

static void ram_stats(void *state, pgd_tier_stats *out)
{
    ram_tier *t = state;
    pthread_mutex_lock(&t->mu);
    *out = t->st;
    out->bytes_capacity = t->capacity_bytes;
    out->n_records = t->bound ? pgd__tmap_count(t->map) : 0;
    pthread_mutex_unlock(&t->mu);
}

static int ram_flush(void *state)
{
    (void)state; /* nothing to make durable */
    return PGD_OK;
}

static void ram_close(void *state)
{
    ram_tier *t = state;
    if (!t) return;
    if (t->map) {
        for (uint32_t s = 0; s < pgd__tmap_capacity(t->map); s++)
            if (t->recs[s]) pgd__free(&t->al, t->recs[s]);
        pgd__tmap_destroy(t->map);
    }
    pgd__free(&t->al, t->recs);
    pthread_mutex_destroy(&t->mu);
    pgd__alloc al = t->al;
    pgd__free(&al, t);
}

static int ram_retain(void *state, pgd_hash block, const pgd_tier_retention *r)
{
    ram_tier *t = state;
    int rc = PGD_ENOTFOUND;
    if (!r) return PGD_EINVAL;
    pthread_mutex_lock(&t->mu);
    uint32_t slot = t->bound ? pgd__tmap_find(t->map, block) : PGD__NONE;
    if (slot != PGD__NONE) rc = pgd__tmap_retain(t->map, slot, r, t->recs[slot]->bytes);
    pthread_mutex_unlock(&t->mu);
    return rc;
}

static const pgd_tier_ops ram_ops = {
    "ram",     ram_bind,  ram_put,   ram_get, ram_lookup, ram_del,
    ram_stats, ram_flush, ram_close, NULL,    ram_retain,
};

/* ---- create ---- */

pgd_tier_ram_params pgd_tier_ram_default_params(void)
{
    pgd_tier_ram_params p;
    memset(&p, 0, sizeof p);
    p.capacity_bytes = 1ull << 30;
    p.store_type = -1;
    p.compression = PGD_RECORD_RAW;
    p.policy = PGD_POLICY_LRU;
    p.pin_share = 0.5;
    return p;
}

int pgd_tier_ram_create(const pgd_tier_ram_params *p, pgd_tier **out)
{
    pgd__alloc al;
    if (!out) return PGD_EINVAL;
    *out = NULL;
    if (!p || !p->capacity_bytes || p->store_type < -1 || p->store_type > (int)PGD_KV_KIVI2 ||
        p->compression > PGD_RECORD_ZSTD)
        return PGD_EINVAL;
    pgd__log lg = {p->log, p->log_ud};
    const pgd_policy_ops *policy = pgd__tier_policy_ops(p->policy, "ram", &lg);
    double share = pgd__tier_pin_share(p->pin_share);
    if (!policy) return PGD_EINVAL;
    if (share < 0) {
        pgd__logf(&lg, PGD_LOG_ERROR, "ram tier: pin_share %g is outside (0, 1]", p->pin_share);
        return PGD_EINVAL;
    }
    pgd__alloc_init(&al, p->alloc);
    ram_tier *t = pgd__calloc(&al, 1, sizeof *t);
    if (!t) return PGD_ENOMEM;
    t->al = al;
    t->lg = lg;
    t->policy = policy;
    t->pin_share = share;
    t->capacity_bytes = p->capacity_bytes;
    t->want_store = p->store_type;
    t->compression = p->compression;
    pthread_mutex_init(&t->mu, NULL);
    int rc = pgd__tier_new(&al, &ram_ops, t, out);
    if (rc != PGD_OK) ram_close(t);
    return rc;
}

/* ---- test hook (tier_int.h) ---- */

int pgd__tier_ram_corrupt(pgd_tier *tier, pgd_hash block, uint64_t offset)
{
    ram_tier *t = pgd__tier_state(tier, &ram_ops);
    int rc = PGD_ENOTFOUND;
    if (!t) return PGD_EINVAL;
    pthread_mutex_lock(&t->mu);
    uint32_t slot = t->bound ? pgd__tmap_find(t->map, block) : PGD__NONE;
    if (slot != PGD__NONE) {
        ram_rec *r = t->recs[slot];
        r->data[offset % r->bytes] ^= 0x20;
        rc = PGD_OK;
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

int pgd__tier_ram_set_clock(pgd_tier *tier, pgd_clock_fn clock, void *ud)
{
    ram_tier *t = tier ? pgd__tier_state(tier, &ram_ops) : NULL;
    if (!t) return PGD_EINVAL;
    pthread_mutex_lock(&t->mu);
    if (t->map) pgd__tmap_set_clock(t->map, clock, ud);
    pthread_mutex_unlock(&t->mu);
    return t->map ? PGD_OK : PGD_EINVAL;
}

int pgd__tier_ram_check(pgd_tier *tier)
{
    ram_tier *t = pgd__tier_state(tier, &ram_ops);
    if (!t) return PGD_EINVAL;
    int rc = PGD_OK;
    pthread_mutex_lock(&t->mu);
    if (t->bound) {
        uint64_t bytes = 0, n = 0;
        rc = pgd__tmap_check(t->map, &t->lg);
        for (uint32_t s = 0; s < pgd__tmap_capacity(t->map) && rc == PGD_OK; s++) {
            const ram_rec *r = t->recs[s];
            if (!r) continue;
            n++;
            bytes += r->bytes;
            pgd_record_info info;
            if (r->slot != s || r->refs < 1 ||
                pgd_record_read_header(r->data, NULL, 0, &t->ident, &info) != PGD_OK ||
                !pgd_hash_eq(info.block, pgd__tmap_slot_get(t->map, s)->hash) ||
                !pgd_hash_eq(info.parent, pgd__tmap_slot_get(t->map, s)->parent))
                rc = PGD_ECORRUPT;
        }
        if (rc == PGD_OK && (n != pgd__tmap_count(t->map) || bytes != t->st.bytes_used ||
                             bytes > t->capacity_bytes))
            rc = PGD_ECORRUPT;
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}
