/* SPDX-License-Identifier: MIT */
/*
 * record.c - the page record format (version 1) of tier.h: identity, header encode and
 * decode, verification. Pure functions, no state, no allocation.
 *
 *     +---------------------------- 128-byte header ----------------------------+---------+
 *     | magic | ver | hbytes | identity (fp, type, geometry, flags, seed) | ... | payload |
 *     +--------------------------------------------------------------------------+---------+
 *       the field table: tier.h; checksum = XXH3-64(header[0..120) || payload)
 *
 * Callers: every tier (ram.c, disk.c, user tiers through the public calls), `pagoda tier
 * inspect`, the fuzz target fuzz_record.c.
 *
 * Invariant: a header pgd_record_write_header accepts is one pgd_record_read_header
 * accepts (both go through derive()), so a tier never writes a record it would refuse.
 * Lengths are derived from the geometry, never trusted: a record whose payload_bytes or
 * raw_bytes disagree with its geometry, type and compression is damaged.
 */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <lz4.h>
#include <string.h>
#include <zstd.h>

#include "tier/tier_int.h"

/* libxxhash's runtime-dispatched update (AVX2 / AVX-512 when the CPU has them; the same
 * hash): 10.6 -> 37-44 GB/s over 16 KiB chunks on this machine, which took the RAM tier's
 * get of raw f16 pages from 0.42-0.66x to 0.73-0.87x of memcpy (bench_tier_ram). Weak:
 * NULL where the library was built without xxh_x86dispatch; the portable update serves. */
#if defined(__x86_64__) && defined(__GNUC__)
XXH_errorcode XXH3_64bits_update_dispatch(XXH3_state_t *state, const void *input, size_t len)
    __attribute__((weak));
#define HAVE_DISPATCH 1
#endif

static void sum_update(XXH3_state_t *st, const void *p, size_t n)
{
#ifdef HAVE_DISPATCH
    if (XXH3_64bits_update_dispatch) {
        XXH3_64bits_update_dispatch(st, p, n);
        return;
    }
#endif
    XXH3_64bits_update(st, p, n);
}

static const uint8_t magic[8] = {'P', 'G', 'D', 'K', 'V', 'R', 'E', 'C'};

enum { CHECKSUM_OFF = 120 };

/* ---- little-endian fields ---- */

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* ---- geometry ---- */

/* Page bytes of a pool of type t with the geometry of id, or 0 when such a pool is refused
 * (zero dimension, unknown type, page_tokens not a power of two, a block type's head_dim,
 * rotation with head_dim not a power of two, overflow). Uses pgd_pool_params_check so
 * that the rules are exactly the pool's. */
static uint64_t page_bytes_of(const pgd_record_ident *id, uint32_t t)
{
    pgd_pool_params p = pgd_pool_default_params();
    p.n_layers = id->n_layers;
    p.n_kv_heads = id->n_kv_heads;
    p.head_dim = id->head_dim;
    p.page_tokens = id->page_tokens;
    p.kv_type = (pgd_kv_type)t;
    p.kv_rotate = (id->flags & PGD_RECORD_ROTATED) != 0;
    p.rotate_seed = id->rotate_seed;
    p.key_bounds = (id->flags & PGD_RECORD_KEY_BOUNDS) != 0;
    p.metadata_only = 1;
    p.capacity_pages = 1;
    if (t > (uint32_t)PGD_KV_KIVI2 || pgd_pool_params_check(&p, NULL, 0) != PGD_OK) return 0;
    /* Checked above: region bytes * 2 * heads * layers does not overflow. */
    return (uint64_t)pgd__codec_region_bytes(p.kv_type, p.page_tokens, p.head_dim) * 2 *
           p.n_kv_heads * p.n_layers;
}

/* Fills the derived fields of id (page_bytes, bounds_bytes). Returns PGD_OK or PGD_EINVAL
 * (a geometry no pool has, unknown flags, a seed without ROTATED). */
static int derive_ident(pgd_record_ident *id)
{
    if (id->flags & ~(uint32_t)(PGD_RECORD_ROTATED | PGD_RECORD_KEY_BOUNDS)) return PGD_EINVAL;
    if (!(id->flags & PGD_RECORD_ROTATED) && id->rotate_seed) return PGD_EINVAL;
    id->page_bytes = page_bytes_of(id, id->kv_type);
    if (!id->page_bytes) return PGD_EINVAL;
    id->bounds_bytes = (id->flags & PGD_RECORD_KEY_BOUNDS)
                           ? 2ull * id->n_layers * id->n_kv_heads * id->head_dim * sizeof(float)
                           : 0;
    return PGD_OK;
}

/* The largest payload a compressed record of raw bytes may have: the compressor's worst
 * case (a tier stores RAW when compression does not help, but a writer need not). 0 for a
 * raw size the compressor cannot take. */
static uint64_t compressed_bound(uint32_t compression, uint64_t raw)
{
    if (compression == PGD_RECORD_LZ4)
        return raw <= LZ4_MAX_INPUT_SIZE ? (uint64_t)LZ4_compressBound((int)raw) : 0;
    size_t b = ZSTD_compressBound((size_t)raw);
    return ZSTD_isError(b) ? 0 : b;
}

/* Fills info's derived identity fields and checks every length of info against its
 * geometry. Returns PGD_OK or PGD_EINVAL (inconsistent; the reader reports it damaged). */
static int derive(pgd_record_info *info)
{
    if (derive_ident(&info->ident) != PGD_OK) return PGD_EINVAL;
    uint64_t store_page = info->store_type == info->ident.kv_type
                              ? info->ident.page_bytes
                              : page_bytes_of(&info->ident, info->store_type);
    if (!store_page) return PGD_EINVAL;
    if (info->raw_bytes != store_page + info->ident.bounds_bytes) return PGD_EINVAL;
    switch (info->compression) {
    case PGD_RECORD_RAW:
        return info->payload_bytes == info->raw_bytes ? PGD_OK : PGD_EINVAL;
    case PGD_RECORD_LZ4:
    case PGD_RECORD_ZSTD:
        if (!info->payload_bytes) return PGD_EINVAL;
        return info->payload_bytes <= compressed_bound(info->compression, info->raw_bytes)
                   ? PGD_OK
                   : PGD_EINVAL;
    default:
        return PGD_EINVAL;
    }
}

/* ---- identity ---- */

int pgd_record_ident_make(const pgd_pool_params *pool, pgd_hash model_fingerprint,
                          pgd_record_ident *out)
{
    if (!pool || !out || pgd_pool_params_check(pool, NULL, 0) != PGD_OK) return PGD_EINVAL;
    pgd_record_ident id;
    memset(&id, 0, sizeof id);
    id.model_fingerprint = model_fingerprint;
    id.kv_type = (uint32_t)pool->kv_type;
    id.n_layers = pool->n_layers;
    id.n_kv_heads = pool->n_kv_heads;
    id.head_dim = pool->head_dim;
    id.page_tokens = pool->page_tokens;
    id.flags = (pool->kv_rotate ? PGD_RECORD_ROTATED : 0u) |
               (pool->key_bounds ? PGD_RECORD_KEY_BOUNDS : 0u);
    id.rotate_seed = pool->kv_rotate ? pool->rotate_seed : 0;
    if (derive_ident(&id) != PGD_OK) return PGD_EINVAL;
    *out = id;
    return PGD_OK;
}

int pgd_record_ident_eq(const pgd_record_ident *a, const pgd_record_ident *b)
{
    return pgd_hash_eq(a->model_fingerprint, b->model_fingerprint) && a->kv_type == b->kv_type &&
           a->n_layers == b->n_layers && a->n_kv_heads == b->n_kv_heads &&
           a->head_dim == b->head_dim && a->page_tokens == b->page_tokens && a->flags == b->flags &&
           a->rotate_seed == b->rotate_seed;
}

/* ---- header ---- */

static uint64_t checksum(const uint8_t *header, const void *payload, uint64_t payload_bytes)
{
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, header, CHECKSUM_OFF);
    if (payload_bytes) sum_update(&st, payload, (size_t)payload_bytes);
    return XXH3_64bits_digest(&st);
}

int pgd_record_write_header(const pgd_record_info *info, const void *payload, void *header)
{
    if (!info || !header || (!payload && info->payload_bytes)) return PGD_EINVAL;
    pgd_record_info in = *info;
    if (derive(&in) != PGD_OK) return PGD_EINVAL;
    uint8_t *h = header;
    memset(h, 0, PGD_RECORD_HEADER_BYTES);
    memcpy(h, magic, sizeof magic);
    put32(h + 8, PGD_RECORD_VERSION);
    put32(h + 12, PGD_RECORD_HEADER_BYTES);
    put64(h + 16, in.ident.model_fingerprint.lo);
    put64(h + 24, in.ident.model_fingerprint.hi);
    put32(h + 32, in.ident.kv_type);
    put32(h + 36, in.ident.n_layers);
    put32(h + 40, in.ident.n_kv_heads);
    put32(h + 44, in.ident.head_dim);
    put32(h + 48, in.ident.page_tokens);
    put32(h + 52, in.ident.flags);
    put64(h + 56, in.ident.rotate_seed);
    put64(h + 64, in.block.lo);
    put64(h + 72, in.block.hi);
    put64(h + 80, in.parent.lo);
    put64(h + 88, in.parent.hi);
    put64(h + 96, in.payload_bytes);
    put32(h + 104, in.store_type);
    put32(h + 108, in.compression);
    put64(h + 112, in.raw_bytes);
    put64(h + CHECKSUM_OFF, checksum(h, payload, in.payload_bytes));
    return PGD_OK;
}

int pgd_record_read_header(const void *header, const void *payload, uint64_t payload_len,
                           const pgd_record_ident *expect, pgd_record_info *out)
{
    const uint8_t *h = header;
    pgd_record_info in;
    if (!h || !out) return PGD_EINVAL;
    if (memcmp(h, magic, sizeof magic) != 0 || get32(h + 8) != PGD_RECORD_VERSION ||
        get32(h + 12) != PGD_RECORD_HEADER_BYTES)
        return PGD_ECORRUPT;
    memset(&in, 0, sizeof in);
    in.ident.model_fingerprint.lo = get64(h + 16);
    in.ident.model_fingerprint.hi = get64(h + 24);
    in.ident.kv_type = get32(h + 32);
    in.ident.n_layers = get32(h + 36);
    in.ident.n_kv_heads = get32(h + 40);
    in.ident.head_dim = get32(h + 44);
    in.ident.page_tokens = get32(h + 48);
    in.ident.flags = get32(h + 52);
    in.ident.rotate_seed = get64(h + 56);
    in.block.lo = get64(h + 64);
    in.block.hi = get64(h + 72);
    in.parent.lo = get64(h + 80);
    in.parent.hi = get64(h + 88);
    in.payload_bytes = get64(h + 96);
    in.store_type = get32(h + 104);
    in.compression = get32(h + 108);
    in.raw_bytes = get64(h + 112);
    if (derive(&in) != PGD_OK) return PGD_ECORRUPT;
    if (payload) {
        if (payload_len < in.payload_bytes) return PGD_ECORRUPT;
        if (checksum(h, payload, in.payload_bytes) != get64(h + CHECKSUM_OFF)) return PGD_ECORRUPT;
    }
    *out = in;
    if (expect && !pgd_record_ident_eq(expect, &in.ident)) return PGD_EINVAL;
    return PGD_OK;
}

/* ---- checksums for tiers (tier_int.h) ---- */

uint64_t pgd__record_checksum(const void *header, const void *const *parts,
                              const uint64_t *part_bytes, int n_parts)
{
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, header, CHECKSUM_OFF);
    for (int i = 0; i < n_parts; i++)
        if (part_bytes[i]) sum_update(&st, parts[i], (size_t)part_bytes[i]);
    return XXH3_64bits_digest(&st);
}

uint64_t pgd__record_stored_checksum(const void *header)
{
    return get64((const uint8_t *)header + CHECKSUM_OFF);
}

/* 16 KiB: a chunk copied is still in L1/L2 when it is hashed. */
enum { COPY_CHUNK = 16 << 10 };

int pgd__record_copy_verified(const void *header, const void *payload, void *page,
                              uint64_t page_bytes, void *bounds, uint64_t bounds_bytes)
{
    XXH3_state_t st;
    const uint8_t *src = payload;
    uint8_t *dst[2] = {page, bounds};
    uint64_t n[2] = {page_bytes, bounds_bytes};
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, header, CHECKSUM_OFF);
    for (int part = 0; part < 2; part++)
        for (uint64_t off = 0; off < n[part]; off += COPY_CHUNK) {
            size_t len = (size_t)(n[part] - off < COPY_CHUNK ? n[part] - off : COPY_CHUNK);
            memcpy(dst[part] + off, src, len);
            sum_update(&st, dst[part] + off, len);
            src += len;
        }
    return XXH3_64bits_digest(&st) == get64((const uint8_t *)header + CHECKSUM_OFF) ? PGD_OK
                                                                                    : PGD_ECORRUPT;
}
