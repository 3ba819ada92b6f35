/* SPDX-License-Identifier: MIT */
/*
 * redis_value.c - what the Redis tier stores and how it proves it (tier_redis.h):
 *
 *   key    NS ":" IDENT ":{" BLOCK "}"          IDENT = XXH3-64 of the identity's fields
 *   value  +--------- record (tier.h) ---------+----------------------------------+
 *          | header (128) | page | key bounds  | HMAC-SHA256(mac_key, key||record) |
 *          +-----------------------------------+----------------------------------+
 *   mac_key = HMAC-SHA256(shared key, "pagoda redis record v1")
 *
 * The MAC covers the key too, so a valid value copied under another block's key does not
 * verify. Opening checks the MAC before anything else reads the bytes (a forged header
 * never reaches the record parser), then the header against the bound identity and the
 * block asked for, then copies the payload verifying its checksum. Also the JSON of the
 * KV events (written by hand: libpagoda does not link a JSON library).
 *
 * HMAC: OpenSSL 3's EVP_MAC ("HMAC", digest SHA256). mac_init keys one EVP_MAC_CTX; each
 * MAC duplicates it (EVP_MAC_CTX_dup only reads its source), so threads share nothing
 * mutable and the key schedule is not redone per record.
 *
 * Callers: redis.c (put, get, get_many), test_tier_redis.c, test_fault_redis.c (forged
 * values), fuzz_redis_value.c. Pure (OpenSSL allocates the per-call context).
 */
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "tier/redis/redis_int.h"

static const char mac_label[] = "pagoda redis record v1";

/* ---- identity and keys ---- */

static void le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

uint64_t pgd__redis_ident_hash(const pgd_record_ident *id)
{
    uint8_t b[48];
    le64(b, id->model_fingerprint.lo);
    le64(b + 8, id->model_fingerprint.hi);
    le32(b + 16, id->kv_type);
    le32(b + 20, id->n_layers);
    le32(b + 24, id->n_kv_heads);
    le32(b + 28, id->head_dim);
    le32(b + 32, id->page_tokens);
    le32(b + 36, id->flags);
    le64(b + 40, id->rotate_seed);
    return XXH3_64bits(b, sizeof b);
}

size_t pgd__redis_key(const char *ns, uint64_t ident_hash, pgd_hash block, char *buf, size_t cap)
{
    char hex[33];
    pgd_hash_hex(block, hex);
    int n = snprintf(buf, cap, "%s:%016llx:{%s}", ns, (unsigned long long)ident_hash, hex);
    if (n < 0 || (size_t)n >= cap) {
        if (cap) buf[0] = '\0';
        return 0;
    }
    return (size_t)n;
}

/* ---- MAC ---- */

/* A context keyed with key[0..key_len) for HMAC-SHA256, or NULL. */
static EVP_MAC_CTX *keyed_ctx(EVP_MAC *mac, const uint8_t *key, size_t key_len)
{
    EVP_MAC_CTX *ctx = EVP_MAC_CTX_new(mac);
    if (!ctx) return NULL;
    char digest[] = "SHA256";
    OSSL_PARAM params[2] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                            OSSL_PARAM_construct_end()};
    if (EVP_MAC_init(ctx, key, key_len, params) != 1) {
        EVP_MAC_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}

int pgd__redis_mac_init(pgd__redis_mac *m, const uint8_t *key, size_t key_len)
{
    memset(m, 0, sizeof *m);
    if (!key || key_len < 1 || key_len > 256) return PGD_EINVAL;
    EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    if (!mac) return PGD_ENOMEM;
    m->mac = mac;
    EVP_MAC_CTX *k = keyed_ctx(mac, key, key_len);
    size_t outl = 0;
    int ok = k && EVP_MAC_update(k, (const uint8_t *)mac_label, sizeof mac_label - 1) == 1 &&
             EVP_MAC_final(k, m->mac_key, &outl, sizeof m->mac_key) == 1 &&
             outl == sizeof m->mac_key;
    EVP_MAC_CTX_free(k);
    if (ok) m->tmpl = keyed_ctx(mac, m->mac_key, sizeof m->mac_key);
    if (!ok || !m->tmpl) {
        pgd__redis_mac_deinit(m);
        return PGD_ENOMEM;
    }
    return PGD_OK;
}

void pgd__redis_mac_deinit(pgd__redis_mac *m)
{
    if (!m) return;
    EVP_MAC_CTX_free(m->tmpl);
    EVP_MAC_free(m->mac);
    OPENSSL_cleanse(m->mac_key, sizeof m->mac_key);
    m->tmpl = NULL;
    m->mac = NULL;
}

int pgd__redis_mac_compute(const pgd__redis_mac *m, const void *a, size_t a_len, const void *b,
                           size_t b_len, uint8_t out[PGD__REDIS_MAC_BYTES])
{
    EVP_MAC_CTX *ctx = EVP_MAC_CTX_dup(m->tmpl);
    size_t outl = 0;
    int ok = ctx && (a_len == 0 || EVP_MAC_update(ctx, a, a_len) == 1) &&
             (b_len == 0 || EVP_MAC_update(ctx, b, b_len) == 1) &&
             EVP_MAC_final(ctx, out, &outl, PGD__REDIS_MAC_BYTES) == 1 &&
             outl == PGD__REDIS_MAC_BYTES;
    EVP_MAC_CTX_free(ctx);
    return ok ? PGD_OK : PGD_ENOMEM;
}

/* ---- values ---- */

uint64_t pgd__redis_value_bytes(const pgd_record_ident *id)
{
    return PGD_RECORD_HEADER_BYTES + id->page_bytes + id->bounds_bytes + PGD__REDIS_MAC_BYTES;
}

int pgd__redis_value_seal(const pgd__redis_mac *m, const char *key, size_t key_len,
                          const pgd_record_ident *id, pgd_hash block, pgd_hash parent,
                          const void *page, const void *bounds, uint8_t *value)
{
    if (!page || (id->bounds_bytes && !bounds)) return PGD_EINVAL;
    pgd_record_info info;
    memset(&info, 0, sizeof info);
    info.ident = *id;
    info.block = block;
    info.parent = parent;
    info.payload_bytes = id->page_bytes + id->bounds_bytes;
    info.store_type = id->kv_type;
    info.compression = PGD_RECORD_RAW;
    info.raw_bytes = info.payload_bytes;
    uint8_t *payload = value + PGD_RECORD_HEADER_BYTES;
    memcpy(payload, page, (size_t)id->page_bytes);
    if (id->bounds_bytes) memcpy(payload + id->page_bytes, bounds, (size_t)id->bounds_bytes);
    int rc = pgd_record_write_header(&info, payload, value);
    if (rc != PGD_OK) return rc;
    size_t rec = PGD_RECORD_HEADER_BYTES + (size_t)info.payload_bytes;
    return pgd__redis_mac_compute(m, key, key_len, value, rec, value + rec);
}

int pgd__redis_value_open(const pgd__redis_mac *m, const char *key, size_t key_len,
                          const void *value, size_t value_len, const pgd_record_ident *id,
                          pgd_hash block, void *page, void *bounds, pgd_record_info *info)
{
    const uint8_t *v = value;
    uint8_t mac[PGD__REDIS_MAC_BYTES];
    if (value_len < PGD_RECORD_HEADER_BYTES + PGD__REDIS_MAC_BYTES) return PGD__RV_MAC;
    size_t rec = value_len - PGD__REDIS_MAC_BYTES;
    if (pgd__redis_mac_compute(m, key, key_len, v, rec, mac) != PGD_OK ||
        CRYPTO_memcmp(mac, v + rec, sizeof mac) != 0)
        return PGD__RV_MAC;
    pgd_record_info in;
    int rc = pgd_record_read_header(v, NULL, 0, id, &in);
    if (rc == PGD_ECORRUPT) return PGD__RV_CORRUPT;
    if (in.payload_bytes != rec - PGD_RECORD_HEADER_BYTES) return PGD__RV_CORRUPT;
    if (info) *info = in;
    if (rc != PGD_OK) return PGD__RV_FOREIGN; /* another identity */
    if (!pgd_hash_eq(in.block, block)) return PGD__RV_CORRUPT;
    if (in.compression != PGD_RECORD_RAW || in.store_type != id->kv_type) return PGD__RV_FOREIGN;
    const uint8_t *payload = v + PGD_RECORD_HEADER_BYTES;
    if (!page) {
        rc = pgd_record_read_header(v, payload, in.payload_bytes, id, &in);
        return rc == PGD_OK ? PGD__RV_OK : PGD__RV_CORRUPT;
    }
    rc = pgd__record_copy_verified(v, payload, page, id->page_bytes, bounds,
                                   bounds ? id->bounds_bytes : 0);
    return rc == PGD_OK ? PGD__RV_OK : PGD__RV_CORRUPT;
}

/* ---- events ---- */

/* Appends s (NUL-terminated) to out at *len. Returns 0, or -1 when it does not fit. */
static int put_str(char *out, size_t cap, size_t *len, const char *s)
{
    size_t n = strlen(s);
    if (cap - *len < n + 1) return -1;
    memcpy(out + *len, s, n + 1);
    *len += n;
    return 0;
}

/* Appends s as a JSON string (quotes, escapes). */
static int put_json_str(char *out, size_t cap, size_t *len, const char *s)
{
    if (put_str(out, cap, len, "\"") != 0) return -1;
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        char esc[8];
        if (*c == '"' || *c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)*c;
            esc[2] = '\0';
        } else if (*c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", *c);
        } else {
            esc[0] = (char)*c;
            esc[1] = '\0';
        }
        if (put_str(out, cap, len, esc) != 0) return -1;
    }
    return put_str(out, cap, len, "\"");
}

static int put_hash(char *out, size_t cap, size_t *len, pgd_hash h)
{
    char hex[36];
    hex[0] = '"';
    pgd_hash_hex(h, hex + 1);
    hex[33] = '"';
    hex[34] = '\0';
    return put_str(out, cap, len, hex);
}

int pgd__redis_event_json(char *out, size_t cap, size_t *len, int type, const pgd_hash *blocks,
                          size_t n, pgd_hash parent, int has_parent, uint32_t block_size,
                          const char *medium)
{
    size_t l = *len;
    int bad = 0;
    if (cap <= l) return PGD_ENOSPC;
    if (type == PGD_KV_EVENT_CLEARED) {
        bad = put_str(out, cap, &l, "{\"type\":\"AllBlocksCleared\"}");
    } else {
        bad |=
            put_str(out, cap, &l,
                    type == PGD_KV_EVENT_STORED ? "{\"type\":\"BlockStored\",\"block_hashes\":["
                                                : "{\"type\":\"BlockRemoved\",\"block_hashes\":[");
        for (size_t i = 0; i < n && !bad; i++) {
            if (i) bad |= put_str(out, cap, &l, ",");
            bad |= put_hash(out, cap, &l, blocks[i]);
        }
        bad |= put_str(out, cap, &l, "]");
        if (type == PGD_KV_EVENT_STORED && !bad) {
            char num[48];
            bad |= put_str(out, cap, &l, ",\"parent_block_hash\":");
            bad |= has_parent ? put_hash(out, cap, &l, parent) : put_str(out, cap, &l, "null");
            snprintf(num, sizeof num, ",\"block_size\":%u", block_size);
            bad |= put_str(out, cap, &l, num);
        }
        bad |= put_str(out, cap, &l, ",\"medium\":");
        bad |= put_json_str(out, cap, &l, medium ? medium : "");
        bad |= put_str(out, cap, &l, "}");
    }
    if (bad) {
        out[*len] = '\0';
        return PGD_ENOSPC;
    }
    *len = l;
    return PGD_OK;
}
