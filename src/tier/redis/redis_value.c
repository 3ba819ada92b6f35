/* SPDX-License-Identifier: MIT */
/*
 * redis_value.c - what the Redis tier stores and how it proves it (tier_redis.h):
 *
 *   key    NS ":" IDENT ":{" BLOCK "}"          IDENT = XXH3-64 of the identity's fields
 *   value  +--------- record (tier.h) ---------+------------- trailer --------------+
 *          | header (128) | page | key bounds  | gmac: nonce (12) | tag (16) | "PGM1"  |
 *          |                                   | hmac: HMAC-SHA256 (32)      | "PGH1"  |
 *          +-----------------------------------+------------------------------------+
 *   mac_key = HMAC-SHA256(shared key, "pagoda redis record v1 gmac" | "... hmac")
 *   gmac tag = AES-256-GCM(mac_key, nonce, AAD = "pagoda-gmac-v1" || key || record), no
 *              plaintext (GMAC, NIST SP 800-38D); the nonce is RAND_bytes, fresh per seal
 *   hmac     = HMAC-SHA256(mac_key, key || record)
 *
 * The MAC covers the key too, so a valid value copied under another block's key does not
 * verify. The magic (last 4 bytes) is trusted for one thing only: it must be the configured
 * algorithm's, else the value is a MAC failure (the instances must agree on the algorithm;
 * each algorithm has its own key, so one's tag never verifies as the other's). Opening
 * checks the MAC before anything else reads the bytes (a forged header never reaches the
 * record parser), then the header against the bound identity and the block asked for, then
 * copies the payload verifying its checksum (kept under the MAC: it is cheap and catches a
 * writer's bug). Also the JSON of the KV events (written by hand: libpagoda does not link
 * a JSON library).
 *
 * OpenSSL 3: mac_init keys one template, an EVP_CIPHER_CTX (AES-256-GCM, 12-byte IV) or an
 * EVP_MAC_CTX (HMAC, SHA256); each MAC works on a copy of it (EVP_CIPHER_CTX_copy,
 * EVP_MAC_CTX_dup: they only read their source), so threads share nothing mutable and the
 * key schedule (AES round keys and the GHASH table) is not redone per record. GMAC costs
 * about 0.1 ms per MiB (AES-NI + PCLMULQDQ), HMAC-SHA256 0.75 ms (SHA-NI).
 *
 * Callers: redis.c (put, get, get_many), test_tier_redis.c, test_fault_redis.c (forged
 * values), fuzz_redis_value.c. Pure but for OpenSSL (it allocates the per-call context;
 * a GMAC seal draws its nonce from RAND_bytes, thread-safe).
 */
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>
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

static const uint8_t magic_gmac[PGD__REDIS_MAGIC_BYTES] = {'P', 'G', 'M', '1'};
static const uint8_t magic_hmac[PGD__REDIS_MAGIC_BYTES] = {'P', 'G', 'H', '1'};
static const char gmac_aad_label[] = "pagoda-gmac-v1";

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

size_t pgd__redis_mac_trailer_bytes(int alg)
{
    switch (alg) {
    case PGD_TIER_REDIS_MAC_GMAC:
        return PGD__REDIS_GMAC_NONCE + PGD__REDIS_GMAC_TAG + PGD__REDIS_MAGIC_BYTES;
    case PGD_TIER_REDIS_MAC_HMAC:
        return PGD__REDIS_HMAC_BYTES + PGD__REDIS_MAGIC_BYTES;
    default:
        return 0;
    }
}

const char *pgd__redis_mac_name(int alg)
{
    switch (alg) {
    case PGD_TIER_REDIS_MAC_GMAC:
        return "gmac";
    case PGD_TIER_REDIS_MAC_HMAC:
        return "hmac";
    default:
        return NULL;
    }
}

int pgd__redis_mac_init(pgd__redis_mac *m, int alg, const uint8_t *key, size_t key_len)
{
    memset(m, 0, sizeof *m);
    const char *name = pgd__redis_mac_name(alg);
    if (!name || !key || key_len < 1 || key_len > 256) return PGD_EINVAL;
    m->alg = alg;
    m->trailer_bytes = pgd__redis_mac_trailer_bytes(alg);
    EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    if (!mac) return PGD_ENOMEM;
    m->hmac = mac;
    /* mac_key = HMAC-SHA256(key, "pagoda redis record v1 " name): one key per algorithm. */
    EVP_MAC_CTX *k = keyed_ctx(mac, key, key_len);
    size_t outl = 0;
    int ok = k && EVP_MAC_update(k, (const uint8_t *)mac_label, sizeof mac_label - 1) == 1 &&
             EVP_MAC_update(k, (const uint8_t *)" ", 1) == 1 &&
             EVP_MAC_update(k, (const uint8_t *)name, strlen(name)) == 1 &&
             EVP_MAC_final(k, m->mac_key, &outl, sizeof m->mac_key) == 1 &&
             outl == sizeof m->mac_key;
    EVP_MAC_CTX_free(k);
    if (ok && alg == PGD_TIER_REDIS_MAC_HMAC) {
        m->tmpl = keyed_ctx(mac, m->mac_key, sizeof m->mac_key);
        ok = m->tmpl != NULL;
    } else if (ok) {
        EVP_CIPHER *c = EVP_CIPHER_fetch(NULL, "AES-256-GCM", NULL);
        EVP_CIPHER_CTX *cx = c ? EVP_CIPHER_CTX_new() : NULL;
        m->cipher = c;
        m->tmpl = cx;
        int ivlen = PGD__REDIS_GMAC_NONCE;
        OSSL_PARAM params[2] = {OSSL_PARAM_construct_int(OSSL_CIPHER_PARAM_AEAD_IVLEN, &ivlen),
                                OSSL_PARAM_construct_end()};
        ok = cx && EVP_EncryptInit_ex2(cx, c, m->mac_key, NULL, params) == 1;
    }
    if (!ok) {
        pgd__redis_mac_deinit(m);
        return PGD_ENOMEM;
    }
    return PGD_OK;
}

void pgd__redis_mac_deinit(pgd__redis_mac *m)
{
    if (!m) return;
    if (m->alg == PGD_TIER_REDIS_MAC_GMAC)
        EVP_CIPHER_CTX_free(m->tmpl);
    else
        EVP_MAC_CTX_free(m->tmpl);
    EVP_CIPHER_free(m->cipher);
    EVP_MAC_free(m->hmac);
    OPENSSL_cleanse(m->mac_key, sizeof m->mac_key);
    m->tmpl = NULL;
    m->cipher = NULL;
    m->hmac = NULL;
}

/* out = HMAC-SHA256(mac_key, a || b). Returns PGD_OK or PGD_ENOMEM. */
static int hmac_of(const pgd__redis_mac *m, const void *a, size_t a_len, const void *b,
                   size_t b_len, uint8_t out[PGD__REDIS_HMAC_BYTES])
{
    EVP_MAC_CTX *ctx = EVP_MAC_CTX_dup(m->tmpl);
    size_t outl = 0;
    int ok = ctx && (a_len == 0 || EVP_MAC_update(ctx, a, a_len) == 1) &&
             (b_len == 0 || EVP_MAC_update(ctx, b, b_len) == 1) &&
             EVP_MAC_final(ctx, out, &outl, PGD__REDIS_HMAC_BYTES) == 1 &&
             outl == PGD__REDIS_HMAC_BYTES;
    EVP_MAC_CTX_free(ctx);
    return ok ? PGD_OK : PGD_ENOMEM;
}

/* tag = AES-256-GCM(mac_key, nonce, AAD = label || a || b, no plaintext): GMAC. The keyed
 * template is copied (its key schedule and GHASH table are not redone), then the nonce set.
 * Returns PGD_OK or PGD_ENOMEM. */
static int gmac_of(const pgd__redis_mac *m, const uint8_t nonce[PGD__REDIS_GMAC_NONCE],
                   const void *a, size_t a_len, const void *b, size_t b_len,
                   uint8_t tag[PGD__REDIS_GMAC_TAG])
{
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    int outl = 0, ok = ctx && EVP_CIPHER_CTX_copy(ctx, m->tmpl) == 1 &&
                       EVP_EncryptInit_ex2(ctx, NULL, NULL, nonce, NULL) == 1 &&
                       EVP_EncryptUpdate(ctx, NULL, &outl, (const uint8_t *)gmac_aad_label,
                                         (int)(sizeof gmac_aad_label - 1)) == 1;
    /* EVP's lengths are ints: feed the AAD in pieces of at most 1 GiB. */
    const void *part[2] = {a, b};
    size_t plen[2] = {a_len, b_len};
    for (int i = 0; i < 2 && ok; i++) {
        const uint8_t *p = part[i];
        for (size_t left = plen[i]; left && ok;) {
            size_t n = left < (1u << 30) ? left : (1u << 30);
            ok = EVP_EncryptUpdate(ctx, NULL, &outl, p, (int)n) == 1;
            p += n;
            left -= n;
        }
    }
    uint8_t none[16];
    ok = ok && EVP_EncryptFinal_ex(ctx, none, &outl) == 1 &&
         EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, PGD__REDIS_GMAC_TAG, tag) == 1;
    EVP_CIPHER_CTX_free(ctx);
    return ok ? PGD_OK : PGD_ENOMEM;
}

int pgd__redis_mac_seal(const pgd__redis_mac *m, const char *key, size_t key_len, const void *rec,
                        size_t rec_len, uint8_t *trailer)
{
    if (m->alg == PGD_TIER_REDIS_MAC_HMAC) {
        memcpy(trailer + PGD__REDIS_HMAC_BYTES, magic_hmac, sizeof magic_hmac);
        return hmac_of(m, key, key_len, rec, rec_len, trailer);
    }
    uint8_t *nonce = trailer, *tag = trailer + PGD__REDIS_GMAC_NONCE;
    if (RAND_bytes(nonce, PGD__REDIS_GMAC_NONCE) != 1) return PGD_ENOMEM;
    memcpy(tag + PGD__REDIS_GMAC_TAG, magic_gmac, sizeof magic_gmac);
    return gmac_of(m, nonce, key, key_len, rec, rec_len, tag);
}

int pgd__redis_mac_verify(const pgd__redis_mac *m, const char *key, size_t key_len,
                          const void *value, size_t value_len)
{
    const uint8_t *v = value;
    size_t tb = m->trailer_bytes;
    if (value_len < tb) return PGD_ECORRUPT;
    size_t rec = value_len - tb;
    const uint8_t *trailer = v + rec;
    uint8_t mac[PGD__REDIS_HMAC_BYTES];
    /* The magic only picks the algorithm, and must be the configured one's. */
    if (m->alg == PGD_TIER_REDIS_MAC_HMAC) {
        if (memcmp(trailer + PGD__REDIS_HMAC_BYTES, magic_hmac, sizeof magic_hmac) != 0)
            return PGD_ECORRUPT;
        if (hmac_of(m, key, key_len, v, rec, mac) != PGD_OK) return PGD_ENOMEM;
        return CRYPTO_memcmp(mac, trailer, PGD__REDIS_HMAC_BYTES) == 0 ? PGD_OK : PGD_ECORRUPT;
    }
    const uint8_t *tag = trailer + PGD__REDIS_GMAC_NONCE;
    if (memcmp(tag + PGD__REDIS_GMAC_TAG, magic_gmac, sizeof magic_gmac) != 0) return PGD_ECORRUPT;
    if (gmac_of(m, trailer, key, key_len, v, rec, mac) != PGD_OK) return PGD_ENOMEM;
    return CRYPTO_memcmp(mac, tag, PGD__REDIS_GMAC_TAG) == 0 ? PGD_OK : PGD_ECORRUPT;
}

/* ---- values ---- */

uint64_t pgd__redis_value_bytes(const pgd__redis_mac *m, const pgd_record_ident *id)
{
    return PGD_RECORD_HEADER_BYTES + id->page_bytes + id->bounds_bytes + m->trailer_bytes;
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
    return pgd__redis_mac_seal(m, key, key_len, value, rec, value + rec);
}

int pgd__redis_value_open(const pgd__redis_mac *m, const char *key, size_t key_len,
                          const void *value, size_t value_len, const pgd_record_ident *id,
                          pgd_hash block, void *page, void *bounds, pgd_record_info *info)
{
    const uint8_t *v = value;
    if (value_len < PGD_RECORD_HEADER_BYTES + m->trailer_bytes) return PGD__RV_MAC;
    size_t rec = value_len - m->trailer_bytes;
    if (pgd__redis_mac_verify(m, key, key_len, v, value_len) != PGD_OK) return PGD__RV_MAC;
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
