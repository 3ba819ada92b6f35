/* SPDX-License-Identifier: MIT */
/*
 * test_record.c - the page record format (src/tier/record.c, tier.h): identity from pool
 * params, header round trips, and that no damaged or foreign record reads as data: every
 * header byte flipped, every field changed (with a valid checksum too), a payload byte, a
 * short payload and a truncated header are PGD_ECORRUPT or PGD_EINVAL, never PGD_OK.
 */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "pagoda/tier.h"
#include "t.h"

static pgd_pool_params geometry(pgd_kv_type type, int key_bounds, int rotate)
{
    pgd_pool_params p = pgd_pool_default_params();
    p.n_layers = 3;
    p.n_kv_heads = 2;
    p.head_dim = 32;
    p.page_tokens = 8;
    p.kv_type = type;
    p.key_bounds = key_bounds;
    p.kv_rotate = rotate;
    p.rotate_seed = rotate ? 77 : 0;
    return p;
}

static const pgd_hash fp = {0x1111222233334444ull, 0x5555666677778888ull};

/* A record of ident (raw, in the pool's type) in buf: header then payload. */
static size_t make_record(const pgd_record_ident *id, uint8_t *buf, uint64_t seed)
{
    pgd_record_info in;
    memset(&in, 0, sizeof in);
    in.ident = *id;
    in.block.lo = seed * 3 + 1;
    in.block.hi = seed * 5 + 2;
    in.parent.lo = seed;
    in.parent.hi = ~seed;
    in.store_type = id->kv_type;
    in.compression = PGD_RECORD_RAW;
    in.raw_bytes = id->page_bytes + id->bounds_bytes;
    in.payload_bytes = in.raw_bytes;
    uint8_t *payload = buf + PGD_RECORD_HEADER_BYTES;
    for (uint64_t i = 0; i < in.payload_bytes; i++)
        payload[i] = (uint8_t)(t_rand(&seed) >> 56);
    if (pgd_record_write_header(&in, payload, buf) != PGD_OK) return 0;
    return PGD_RECORD_HEADER_BYTES + (size_t)in.payload_bytes;
}

static void set32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void set64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Rewrites the checksum of a header whose payload is payload_bytes at h + 128. */
static void reseal(uint8_t *h, uint64_t payload_bytes)
{
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, h, 120);
    XXH3_64bits_update(&st, h + PGD_RECORD_HEADER_BYTES, (size_t)payload_bytes);
    set64(h + 120, XXH3_64bits_digest(&st));
}

static int test_ident(void)
{
    pgd_record_ident id;
    for (int t = PGD_KV_F32; t <= PGD_KV_KIVI2; t++)
        for (int kb = 0; kb < 2; kb++) {
            pgd_pool_params p = geometry((pgd_kv_type)t, kb, t % 2);
            p.metadata_only = 0;
            p.capacity_pages = 2;
            T_OK(pgd_record_ident_make(&p, fp, &id));
            pgd_pool *pool;
            T_OK(pgd_pool_create(&p, &pool));
            T_EQ(id.page_bytes, pgd_pool_page_bytes(pool));
            pgd_pool_destroy(pool);
            T_EQ(id.bounds_bytes, kb ? 3 * 2 * 2 * 32 * 4 : 0);
            T_EQ(id.flags, (kb ? PGD_RECORD_KEY_BOUNDS : 0) | (t % 2 ? PGD_RECORD_ROTATED : 0));
            T_EQ(id.rotate_seed, t % 2 ? 77 : 0);
            T_EQ(id.kv_type, t);
            T_ASSERT(pgd_record_ident_eq(&id, &id));
        }
    pgd_pool_params bad = geometry(PGD_KV_Q8_0, 0, 0);
    bad.head_dim = 48; /* neither a multiple nor a divisor of 32 */
    T_EQ(pgd_record_ident_make(&bad, fp, &id), PGD_EINVAL);
    bad = geometry(PGD_KV_F16, 0, 0);
    bad.n_layers = 0;
    T_EQ(pgd_record_ident_make(&bad, fp, &id), PGD_EINVAL);
    bad = geometry(PGD_KV_F16, 0, 0);
    bad.page_tokens = 6;
    T_EQ(pgd_record_ident_make(&bad, fp, &id), PGD_EINVAL);
    T_EQ(pgd_record_ident_make(NULL, fp, &id), PGD_EINVAL);
    /* The seed of an unrotated pool is not part of the identity. */
    pgd_pool_params a = geometry(PGD_KV_F16, 0, 0), b = a;
    pgd_record_ident ia, ib;
    b.rotate_seed = 99;
    T_OK(pgd_record_ident_make(&a, fp, &ia));
    T_OK(pgd_record_ident_make(&b, fp, &ib));
    T_ASSERT(pgd_record_ident_eq(&ia, &ib));
    b.kv_rotate = 1;
    T_OK(pgd_record_ident_make(&b, fp, &ib));
    T_ASSERT(!pgd_record_ident_eq(&ia, &ib));
    return 0;
}

static int test_round_trip(void)
{
    static uint8_t buf[1 << 16];
    for (int t = PGD_KV_F32; t <= PGD_KV_KIVI2; t++) {
        pgd_pool_params p = geometry((pgd_kv_type)t, t == PGD_KV_F16, t == PGD_KV_BF16);
        pgd_record_ident id;
        pgd_record_info out;
        T_OK(pgd_record_ident_make(&p, fp, &id));
        size_t n = make_record(&id, buf, (uint64_t)t + 10);
        T_ASSERT(n > PGD_RECORD_HEADER_BYTES && n <= sizeof buf);
        T_EQ(pgd_record_read_header(buf, buf + 128, n - 128, &id, &out), PGD_OK);
        T_ASSERT(pgd_record_ident_eq(&out.ident, &id));
        T_EQ(out.ident.page_bytes, id.page_bytes);
        T_EQ(out.ident.bounds_bytes, id.bounds_bytes);
        T_EQ(out.block.lo, (uint64_t)(t + 10) * 3 + 1);
        T_EQ(out.block.hi, (uint64_t)(t + 10) * 5 + 2);
        T_EQ(out.parent.lo, (uint64_t)(t + 10));
        T_EQ(out.parent.hi, ~(uint64_t)(t + 10));
        T_EQ(out.payload_bytes, n - 128);
        T_EQ(out.raw_bytes, n - 128);
        T_EQ(out.store_type, t);
        T_EQ(out.compression, PGD_RECORD_RAW);
        /* Without an expected identity, and the header alone. */
        T_EQ(pgd_record_read_header(buf, buf + 128, n - 128, NULL, &out), PGD_OK);
        T_EQ(pgd_record_read_header(buf, NULL, 0, &id, &out), PGD_OK);
        /* A longer buffer than the record is fine: the record says its length. */
        T_EQ(pgd_record_read_header(buf, buf + 128, n - 128 + 7, &id, &out), PGD_OK);
        /* Fixed fields of the format. */
        T_ASSERT(memcmp(buf, "PGDKVREC", 8) == 0);
        T_EQ(buf[8], 1);
        T_EQ(buf[12], 128);
    }
    return 0;
}

/* Compressed and re-encoded records: lengths are checked against the stored type. */
static int test_store_and_compression(void)
{
    static uint8_t buf[1 << 16];
    pgd_pool_params p = geometry(PGD_KV_F16, 1, 0);
    pgd_record_ident id;
    pgd_record_info in, out;
    T_OK(pgd_record_ident_make(&p, fp, &id));
    pgd_pool_params q = p;
    q.kv_type = PGD_KV_Q8_0;
    pgd_record_ident idq;
    T_OK(pgd_record_ident_make(&q, fp, &idq));
    memset(&in, 0, sizeof in);
    in.ident = id;
    in.store_type = PGD_KV_Q8_0;
    in.raw_bytes = idq.page_bytes + id.bounds_bytes;
    in.payload_bytes = in.raw_bytes;
    memset(buf + 128, 0x5a, (size_t)in.payload_bytes);
    T_OK(pgd_record_write_header(&in, buf + 128, buf));
    T_EQ(pgd_record_read_header(buf, buf + 128, in.payload_bytes, &id, &out), PGD_OK);
    T_EQ(out.store_type, PGD_KV_Q8_0);
    T_EQ(out.ident.page_bytes, id.page_bytes); /* of the pool, not of the stored type */
    /* raw_bytes of the pool type with a q8_0 store type: inconsistent. */
    in.raw_bytes = id.page_bytes + id.bounds_bytes;
    in.payload_bytes = in.raw_bytes;
    T_EQ(pgd_record_write_header(&in, buf + 128, buf), PGD_EINVAL);
    /* Compressed: any payload up to the compressor's bound. */
    in.store_type = PGD_KV_F16;
    in.compression = PGD_RECORD_LZ4;
    in.payload_bytes = 100;
    T_OK(pgd_record_write_header(&in, buf + 128, buf));
    T_EQ(pgd_record_read_header(buf, buf + 128, 100, &id, &out), PGD_OK);
    T_EQ(out.compression, PGD_RECORD_LZ4);
    T_EQ(out.payload_bytes, 100);
    in.compression = PGD_RECORD_ZSTD;
    T_OK(pgd_record_write_header(&in, buf + 128, buf));
    T_EQ(pgd_record_read_header(buf, buf + 128, 100, &id, &out), PGD_OK);
    in.payload_bytes = 0;
    T_EQ(pgd_record_write_header(&in, buf + 128, buf), PGD_EINVAL);
    in.payload_bytes = in.raw_bytes * 2;
    T_EQ(pgd_record_write_header(&in, buf + 128, buf), PGD_EINVAL);
    /* Unknown compression or type, a store type the geometry refuses. */
    in.payload_bytes = in.raw_bytes;
    in.compression = 3;
    T_EQ(pgd_record_write_header(&in, buf + 128, buf), PGD_EINVAL);
    in.compression = PGD_RECORD_RAW;
    in.store_type = 6;
    T_EQ(pgd_record_write_header(&in, buf + 128, buf), PGD_EINVAL);
    in.store_type = PGD_KV_F16;
    in.ident.flags |= 8;
    T_EQ(pgd_record_write_header(&in, buf + 128, buf), PGD_EINVAL);
    return 0;
}

static int test_foreign(void)
{
    static uint8_t buf[1 << 16];
    pgd_pool_params p = geometry(PGD_KV_F16, 0, 0);
    pgd_record_ident a, b;
    pgd_record_info out;
    T_OK(pgd_record_ident_make(&p, fp, &a));
    pgd_hash other = fp;
    other.hi ^= 1;
    T_OK(pgd_record_ident_make(&p, other, &b));
    size_t n = make_record(&b, buf, 3);
    T_EQ(pgd_record_read_header(buf, buf + 128, n - 128, &a, &out), PGD_EINVAL);
    T_ASSERT(pgd_record_ident_eq(&out.ident, &b)); /* *out filled: the tier can log it */
    /* Same model, another geometry. */
    p.page_tokens = 16;
    T_OK(pgd_record_ident_make(&p, fp, &b));
    n = make_record(&b, buf, 4);
    T_EQ(pgd_record_read_header(buf, buf + 128, n - 128, &a, &out), PGD_EINVAL);
    T_EQ(pgd_record_read_header(buf, NULL, 0, &a, &out), PGD_EINVAL);
    return 0;
}

/* Every byte of the header flipped, one at a time: damaged (the checksum covers 0..119,
 * and 120..127 is the checksum). */
static int test_every_header_byte(void)
{
    static uint8_t buf[1 << 16], orig[1 << 16];
    pgd_pool_params p = geometry(PGD_KV_Q4_0, 1, 1);
    pgd_record_ident id;
    pgd_record_info out;
    T_OK(pgd_record_ident_make(&p, fp, &id));
    size_t n = make_record(&id, orig, 9);
    for (size_t off = 0; off < PGD_RECORD_HEADER_BYTES; off++)
        for (int bit = 0; bit < 8; bit += 3) {
            memcpy(buf, orig, n);
            buf[off] ^= (uint8_t)(1u << bit);
            int rc = pgd_record_read_header(buf, buf + 128, n - 128, &id, &out);
            if (rc != PGD_ECORRUPT) T_FAIL("byte %zu bit %d: %d", off, bit, rc);
        }
    return 0;
}

/* Every field given another value and the checksum recomputed (a writer's bug or a
 * deliberate forgery, not bit rot): identity fields are foreign, the rest damaged. */
static int test_every_field_resealed(void)
{
    static uint8_t buf[1 << 16], orig[1 << 16];
    pgd_pool_params p = geometry(PGD_KV_F16, 1, 1);
    pgd_record_ident id;
    pgd_record_info out;
    T_OK(pgd_record_ident_make(&p, fp, &id));
    size_t n = make_record(&id, orig, 21);
    uint64_t pb = n - 128;
    struct {
        size_t off, size;
        uint64_t value;
        int want; /* PGD_EINVAL foreign, PGD_ECORRUPT damaged, 1: either */
    } cases[] = {
        {0, 8, 0x434552564b444750ull ^ 1, PGD_ECORRUPT}, /* magic */
        {8, 4, 2, PGD_ECORRUPT},                         /* version */
        {8, 4, 0, PGD_ECORRUPT},
        {12, 4, 120, PGD_ECORRUPT}, /* header_bytes */
        {12, 4, 256, PGD_ECORRUPT},
        {16, 8, fp.lo ^ 4, PGD_EINVAL}, /* fingerprint */
        {24, 8, fp.hi ^ 4, PGD_EINVAL},
        {32, 4, PGD_KV_BF16, PGD_EINVAL}, /* kv_type: same page bytes, another type */
        {32, 4, PGD_KV_F32, PGD_EINVAL},  /* a consistent f16-stored record of an f32 pool */
        {32, 4, 99, PGD_ECORRUPT},
        {36, 4, 4, PGD_ECORRUPT}, /* n_layers */
        {36, 4, 0, PGD_ECORRUPT},
        {40, 4, 3, PGD_ECORRUPT},  /* n_kv_heads */
        {44, 4, 64, PGD_ECORRUPT}, /* head_dim */
        {44, 4, 0, PGD_ECORRUPT},
        {48, 4, 16, PGD_ECORRUPT}, /* page_tokens */
        {48, 4, 4, PGD_ECORRUPT},
        {48, 4, 7, PGD_ECORRUPT},
        {52, 4, PGD_RECORD_ROTATED, PGD_ECORRUPT},    /* flags: bounds gone, lengths disagree */
        {52, 4, PGD_RECORD_KEY_BOUNDS, PGD_ECORRUPT}, /* a seed without ROTATED */
        {52, 4, 3 | 4, PGD_ECORRUPT},
        {56, 8, 78, PGD_EINVAL},       /* rotate_seed */
        {96, 8, pb - 1, PGD_ECORRUPT}, /* payload_bytes */
        {96, 8, pb + 1, PGD_ECORRUPT},
        {96, 8, UINT64_MAX, PGD_ECORRUPT},
        {104, 4, PGD_KV_BF16, PGD_ECORRUPT}, /* store_type: raw_bytes disagree once... */
        {104, 4, PGD_KV_Q8_0, PGD_ECORRUPT},
        {104, 4, 77, PGD_ECORRUPT},
        {108, 4, PGD_RECORD_LZ4, 1}, /* compression: valid lengths, the payload is not lz4 */
        {108, 4, 9, PGD_ECORRUPT},
        {112, 8, pb + 2, PGD_ECORRUPT}, /* raw_bytes */
        {112, 8, 0, PGD_ECORRUPT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memcpy(buf, orig, n);
        if (cases[i].size == 4)
            set32(buf + cases[i].off, (uint32_t)cases[i].value);
        else
            set64(buf + cases[i].off, cases[i].value);
        reseal(buf, pb);
        int rc = pgd_record_read_header(buf, buf + 128, pb, &id, &out);
        /* store_type bf16 == f16 page bytes: a consistent record of another stored type
         * is data only after decoding, which the tier does; the format accepts it. */
        if (cases[i].off == 104 && cases[i].value == PGD_KV_BF16) {
            T_EQ(rc, PGD_OK);
            T_EQ(out.store_type, PGD_KV_BF16);
            continue;
        }
        if (cases[i].want == 1) {
            /* The format cannot tell an lz4 payload from another: the tier's decompression
             * does (ram.c, disk.c). The header is consistent. */
            T_EQ(rc, PGD_OK);
            continue;
        }
        if (rc != cases[i].want)
            T_FAIL("case %zu (offset %zu = %llu): %d, want %d", i, cases[i].off,
                   (unsigned long long)cases[i].value, rc, cases[i].want);
    }
    /* The block and parent hashes are not checked against anything but the checksum:
     * resealed they are another (valid) record. */
    memcpy(buf, orig, n);
    set64(buf + 64, 12345);
    reseal(buf, pb);
    T_EQ(pgd_record_read_header(buf, buf + 128, pb, &id, &out), PGD_OK);
    T_EQ(out.block.lo, 12345);
    return 0;
}

static int test_payload_damage(void)
{
    static uint8_t buf[1 << 16], orig[1 << 16];
    pgd_pool_params p = geometry(PGD_KV_Q8_0, 0, 0);
    pgd_record_ident id;
    pgd_record_info out;
    T_OK(pgd_record_ident_make(&p, fp, &id));
    size_t n = make_record(&id, orig, 5);
    uint64_t pb = n - 128;
    /* One payload byte, at the ends and inside. */
    size_t offs[] = {0, 1, (size_t)pb / 2, (size_t)pb - 1};
    for (size_t i = 0; i < 4; i++) {
        memcpy(buf, orig, n);
        buf[128 + offs[i]] ^= 0x10;
        T_EQ(pgd_record_read_header(buf, buf + 128, pb, &id, &out), PGD_ECORRUPT);
    }
    /* A short payload (a torn write). */
    memcpy(buf, orig, n);
    T_EQ(pgd_record_read_header(buf, buf + 128, pb - 1, &id, &out), PGD_ECORRUPT);
    T_EQ(pgd_record_read_header(buf, buf + 128, 0, &id, &out), PGD_ECORRUPT);
    /* A truncated header: what a reader has after a torn write of k < 128 bytes, the
     * rest zeros. */
    for (size_t k = 0; k < PGD_RECORD_HEADER_BYTES; k += 7) {
        memset(buf, 0, n);
        memcpy(buf, orig, k);
        int rc = pgd_record_read_header(buf, buf + 128, pb, &id, &out);
        if (rc != PGD_ECORRUPT) T_FAIL("header truncated to %zu bytes: %d", k, rc);
        /* The header alone (no checksum): up to raw_bytes' first byte, a field is zero. */
        rc = pgd_record_read_header(buf, NULL, 0, &id, &out);
        if (k <= 112 && rc != PGD_ECORRUPT && rc != PGD_EINVAL)
            T_FAIL("header alone truncated to %zu bytes: %d", k, rc);
    }
    /* Arguments. */
    T_EQ(pgd_record_read_header(NULL, NULL, 0, &id, &out), PGD_EINVAL);
    T_EQ(pgd_record_read_header(orig, NULL, 0, &id, NULL), PGD_EINVAL);
    return 0;
}

/* Random headers (random bytes, then random fields over a valid header) never read OK
 * unless they are consistent; none crashes. */
static int test_random_headers(void)
{
    static uint8_t buf[1 << 16], ref[1 << 16];
    pgd_pool_params p = geometry(PGD_KV_F16, 0, 0);
    pgd_record_ident id;
    pgd_record_info out;
    uint64_t seed = 42;
    T_OK(pgd_record_ident_make(&p, fp, &id));
    for (int it = 0; it < 20000; it++) {
        size_t n = make_record(&id, buf, (uint64_t)it);
        int n_flips = 1 + (int)(t_rand(&seed) % 4);
        for (int f = 0; f < n_flips; f++)
            buf[t_rand(&seed) % 120] = (uint8_t)t_rand(&seed);
        if (it % 2) reseal(buf, n - 128);
        int rc = pgd_record_read_header(buf, buf + 128, n - 128, &id, &out);
        T_ASSERT(rc == PGD_OK || rc == PGD_ECORRUPT || rc == PGD_EINVAL);
        if (rc == PGD_OK && !(it % 2)) {
            /* Unsealed: only a flip that wrote the same byte back may read as OK. */
            make_record(&id, ref, (uint64_t)it);
            T_ASSERT(memcmp(ref, buf, 120) == 0);
        }
    }
    return 0;
}

/* ---- the tier handle: pgd_tier_wrap and dispatch ---- */

typedef struct fake_tier {
    int calls[8];
    int closed;
} fake_tier;

static int fake_bind(void *s, const pgd_record_ident *id)
{
    (void)id;
    return ((fake_tier *)s)->calls[0]++, PGD_OK;
}
static int fake_put(void *s, pgd_hash b, pgd_hash p, const void *page, const void *bounds,
                    pgd_tier_spill_fn spill, void *ud)
{
    (void)b, (void)p, (void)page, (void)bounds;
    ((fake_tier *)s)->calls[1]++;
    if (spill) spill(ud, b, p, page, bounds);
    return PGD_ENOSPC;
}
static int fake_get(void *s, pgd_hash b, void *page, void *bounds)
{
    (void)b, (void)page, (void)bounds;
    return ((fake_tier *)s)->calls[2]++, PGD_ENOTFOUND;
}
static size_t fake_lookup(void *s, const pgd_hash *h, size_t n)
{
    (void)h;
    ((fake_tier *)s)->calls[3]++;
    return n - 1;
}
static int fake_del(void *s, pgd_hash b)
{
    (void)b;
    return ((fake_tier *)s)->calls[4]++, PGD_OK;
}
static void fake_stats(void *s, pgd_tier_stats *out)
{
    ((fake_tier *)s)->calls[5]++;
    out->n_records = 7;
}
static int fake_flush(void *s)
{
    return ((fake_tier *)s)->calls[6]++, PGD_EIO;
}
static void fake_close(void *s)
{
    ((fake_tier *)s)->closed++;
}

static int n_spilled;
static void count_spill(void *ud, pgd_hash b, pgd_hash p, const void *page, const void *bounds)
{
    (void)ud, (void)b, (void)p, (void)page, (void)bounds;
    n_spilled++;
}

static int test_wrap(void)
{
    pgd_tier_ops ops = {"fake",     fake_bind,  fake_put,   fake_get, fake_lookup, fake_del,
                        fake_stats, fake_flush, fake_close, NULL,     NULL};
    fake_tier ft;
    pgd_tier *t;
    memset(&ft, 0, sizeof ft);
    /* Every member is required. */
    for (int m = 0; m < 9; m++) {
        pgd_tier_ops o = ops;
        if (m == 0) o.name = NULL;
        if (m == 1) o.bind = NULL;
        if (m == 2) o.put = NULL;
        if (m == 3) o.get = NULL;
        if (m == 4) o.lookup = NULL;
        if (m == 5) o.del = NULL;
        if (m == 6) o.stats = NULL;
        if (m == 7) o.flush = NULL;
        if (m == 8) o.close = NULL;
        t = (pgd_tier *)&ft;
        T_EQ(pgd_tier_wrap(&o, &ft, &t), PGD_EINVAL);
        T_ASSERT(t == NULL);
    }
    T_EQ(pgd_tier_wrap(NULL, &ft, &t), PGD_EINVAL);
    T_OK(pgd_tier_wrap(&ops, &ft, &t));
    T_ASSERT(strcmp(pgd_tier_name(t), "fake") == 0);
    pgd_record_ident id;
    pgd_pool_params p = geometry(PGD_KV_F16, 0, 0);
    T_OK(pgd_record_ident_make(&p, fp, &id));
    pgd_hash h[3] = {{1, 2}, {3, 4}, {5, 6}};
    pgd_tier_stats st;
    T_EQ(pgd_tier_bind(t, &id), PGD_OK);
    T_EQ(pgd_tier_put(t, h[0], h[1], NULL, NULL, count_spill, NULL), PGD_ENOSPC);
    T_EQ(n_spilled, 1);
    T_EQ(pgd_tier_get(t, h[0], NULL, NULL), PGD_ENOTFOUND);
    T_EQ(pgd_tier_lookup(t, h, 3), 2);
    T_EQ(pgd_tier_lookup(t, h, 0), 0); /* n == 0 does not reach the tier */
    T_EQ(pgd_tier_del(t, h[0]), PGD_OK);
    memset(&st, 0xff, sizeof st);
    pgd_tier_get_stats(t, &st);
    T_EQ(st.n_records, 7);
    T_EQ(st.n_puts, 0); /* zeroed before the tier fills it */
    T_EQ(pgd_tier_flush(t), PGD_EIO);
    for (int i = 0; i < 7; i++)
        T_EQ(ft.calls[i], 1);
    T_EQ(ft.closed, 0);
    pgd_tier_close(t);
    T_EQ(ft.closed, 1);
    pgd_tier_close(NULL);
    return 0;
}

static int test_hist_bounds(void)
{
    const double *b = pgd_tier_hist_bounds_us();
    const double want[] = {10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 50000};
    for (int i = 0; i < PGD_TIER_HIST_BUCKETS - 1; i++)
        T_ASSERT(b[i] == want[i]);
    T_ASSERT(b[PGD_TIER_HIST_BUCKETS - 1] > 1e300);
    return 0;
}

int main(void)
{
    T_RUN(test_ident);
    T_RUN(test_round_trip);
    T_RUN(test_store_and_compression);
    T_RUN(test_foreign);
    T_RUN(test_every_header_byte);
    T_RUN(test_every_field_resealed);
    T_RUN(test_payload_damage);
    T_RUN(test_random_headers);
    T_RUN(test_wrap);
    T_RUN(test_hist_bounds);
    T_DONE();
}
