/* SPDX-License-Identifier: MIT */
/*
 * redis_int.h - the pure parts of the Redis tier (tier_redis.h), which its tests and fuzz
 * targets call directly:
 *
 *   redis_url.c     the URL (seeds, user / password, db, query options) -> params + seeds
 *   redis_value.c   the record identity's IDENT, the keys, the MAC (AES-256-GMAC or
 *                   HMAC-SHA256 through OpenSSL's EVP), sealing a record into a value
 *                   and opening one
 *   redis_index.c   the local index: a bounded set of blocks known to be in Redis
 *   redis.c         the tier itself (queues, the writer thread, the ops): uses rclient.h
 *
 *   value = record (128-byte header + payload, tier.h) || MAC trailer (gmac: nonce, tag,
 *           "PGM1"; hmac: HMAC-SHA256, "PGH1"), over key || record
 *
 * Internal to libpagoda (src/tier/redis/ and INTERNAL tests, fuzz targets).
 */
#ifndef PGD_TIER_REDIS_INT_H
#define PGD_TIER_REDIS_INT_H

#include "pagoda/tier_redis.h"
#include "tier/redis/rclient.h"
#include "tier/tier_int.h"

/* ---- the URL (redis_url.c) ---- */

#define PGD__REDIS_MAX_SEEDS 16

/* What a URL says beyond pgd_tier_redis_params: where and who. */
typedef struct pgd__redis_url {
    pgd__rc_addr seeds[PGD__REDIS_MAX_SEEDS]; /* [n_seeds], in the URL's order */
    size_t n_seeds;
    const char *user;     /* ACL user (percent-decoded, into buf), NULL: none */
    const char *password; /* percent-decoded, into buf; NULL: no AUTH */
    int db;               /* /db or ?db=N; 0 when absent */
    int db_given;         /* nonzero: the URL named a db */
} pgd__redis_url;

/* pgd_tier_redis_parse_url, plus the seeds and credentials into *u (may be NULL).
 * Returns PGD_OK or PGD_EINVAL with err naming the bad part. Pure. */
int pgd__redis_url_parse(const char *url, pgd_tier_redis_params *p, pgd__redis_url *u, char *buf,
                         size_t cap, char *err, size_t errlen);

/* ---- values, keys, MAC (redis_value.c) ---- */

#define PGD__REDIS_IDENT_HEX 16
/* The longest key: ns (at most PGD__REDIS_NS_MAX), ':', 16 hex, ":{", 32 hex, '}'. */
#define PGD__REDIS_NS_MAX 64
#define PGD__REDIS_KEY_MAX (PGD__REDIS_NS_MAX + 1 + 16 + 2 + 32 + 1 + 1)

/* IDENT of a key: XXH3-64 (seed 0) of the identity's stored fields, little-endian in the
 * order of the record header (fingerprint lo, hi, kv_type, n_layers, n_kv_heads, head_dim,
 * page_tokens, flags, rotate_seed: 48 bytes). */
uint64_t pgd__redis_ident_hash(const pgd_record_ident *id);
/* Writes "ns:IDENT:{BLOCK}" (NUL-terminated) into buf[0..cap). Returns its length, or 0
 * when cap is too small. */
size_t pgd__redis_key(const char *ns, uint64_t ident_hash, pgd_hash block, char *buf, size_t cap);

/* The MAC of the instances (tier_redis.h), one of two algorithms, each with its own key:
 *   mac_key = HMAC-SHA256(shared key, "pagoda redis record v1 " NAME), NAME "gmac" | "hmac"
 *   gmac  trailer = nonce (12, RAND_bytes per seal) || tag (16) || "PGM1"
 *         tag = AES-256-GCM(mac_key, nonce, AAD = "pagoda-gmac-v1" || key || record)
 *   hmac  trailer = HMAC-SHA256(mac_key, key || record) (32) || "PGH1"
 * tmpl is keyed once (an EVP_CIPHER_CTX or an EVP_MAC_CTX) and each MAC works on a copy of
 * it, so calls from several threads share nothing mutable and nothing is re-keyed. */
#define PGD__REDIS_GMAC_NONCE 12
#define PGD__REDIS_GMAC_TAG 16
#define PGD__REDIS_HMAC_BYTES 32
#define PGD__REDIS_MAGIC_BYTES 4
#define PGD__REDIS_TRAILER_MAX (PGD__REDIS_HMAC_BYTES + PGD__REDIS_MAGIC_BYTES)

typedef struct pgd__redis_mac {
    int alg;              /* PGD_TIER_REDIS_MAC_* */
    size_t trailer_bytes; /* pgd__redis_mac_trailer_bytes(alg) */
    void *tmpl;           /* EVP_CIPHER_CTX * (gmac) or EVP_MAC_CTX * (hmac), keyed */
    void *cipher;         /* EVP_CIPHER * ("AES-256-GCM"), gmac only */
    void *hmac;           /* EVP_MAC * ("HMAC") */
    uint8_t mac_key[32];
} pgd__redis_mac;

/* Bytes after the record for alg (PGD_TIER_REDIS_MAC_*): 32 (gmac), 36 (hmac); 0: no such
 * algorithm. */
size_t pgd__redis_mac_trailer_bytes(int alg);
/* "gmac", "hmac", or NULL for an unknown alg. */
const char *pgd__redis_mac_name(int alg);
/* Derives alg's mac_key from key[0..key_len) (1..256 bytes) and keys the template.
 * Returns PGD_OK, PGD_EINVAL (alg, key length) or PGD_ENOMEM (OpenSSL failed). */
int pgd__redis_mac_init(pgd__redis_mac *m, int alg, const uint8_t *key, size_t key_len);
/* NULL-safe, and safe on a zeroed struct. */
void pgd__redis_mac_deinit(pgd__redis_mac *m);
/* Writes the trailer (m->trailer_bytes) of key[0..key_len) || rec[0..rec_len) to trailer
 * (gmac: with a fresh nonce). Returns PGD_OK or PGD_ENOMEM. Thread-safe (m is only read). */
int pgd__redis_mac_seal(const pgd__redis_mac *m, const char *key, size_t key_len, const void *rec,
                        size_t rec_len, uint8_t *trailer);
/* Verifies the trailer at the end of value[0..value_len) (the record before it) for key:
 * the magic must be m's algorithm's, the tag or HMAC must match (CRYPTO_memcmp). Returns
 * PGD_OK, PGD_ECORRUPT (too short, another magic, a wrong MAC) or PGD_ENOMEM. Thread-safe. */
int pgd__redis_mac_verify(const pgd__redis_mac *m, const char *key, size_t key_len,
                          const void *value, size_t value_len);

/* Bytes of a value of identity id sealed by m: header, page, bounds, m's trailer. */
uint64_t pgd__redis_value_bytes(const pgd__redis_mac *m, const pgd_record_ident *id);
/* Seals block's record (RAW, store_type = kv_type) into value[0..pgd__redis_value_bytes):
 * header, page (id->page_bytes), bounds (id->bounds_bytes; NULL when 0), then m's trailer
 * over key[0..key_len) || record. Returns PGD_OK, PGD_EINVAL or PGD_ENOMEM. Pure. */
int pgd__redis_value_seal(const pgd__redis_mac *m, const char *key, size_t key_len,
                          const pgd_record_ident *id, pgd_hash block, pgd_hash parent,
                          const void *page, const void *bounds, uint8_t *value);

/* What opening a value found. */
enum {
    PGD__RV_OK = 0,      /* a record of block, of identity id: copied to page / bounds */
    PGD__RV_MAC = 1,     /* too short for a trailer, another algorithm's trailer, or the MAC
                            does not verify: forged, damaged, or another instance's MAC */
    PGD__RV_CORRUPT = 2, /* the MAC verifies but the record is damaged (header, lengths,
                            checksum, another block than the key's) */
    PGD__RV_FOREIGN = 3  /* the MAC verifies, the record is sound, but of another identity
                            (or stored in a form this tier does not read: compressed,
                            re-encoded) */
};
/* Opens value[0..value_len), read back from key[0..key_len): checks the MAC first
 * (pgd__redis_mac_verify), then the header against id and block, then copies the payload into
 * page / bounds verifying its checksum (page NULL: checks only, the checksum included).
 * page is written only when the MAC and the header verify; after PGD__RV_CORRUPT it may
 * hold damaged bytes (a miss: the caller does not use it). *info (may be NULL) gets the
 * header for OK and FOREIGN. Returns PGD__RV_*. Pure, thread-safe. */
int pgd__redis_value_open(const pgd__redis_mac *m, const char *key, size_t key_len,
                          const void *value, size_t value_len, const pgd_record_ident *id,
                          pgd_hash block, void *page, void *bounds, pgd_record_info *info);

/* ---- events (redis_value.c) ---- */

/* Appends the JSON of one event (tier_redis.h's format) to out[*len..cap): type
 * PGD_KV_EVENT_*, blocks[0..n), parent (has_parent 0: null), block_size, medium.
 * Returns PGD_OK or PGD_ENOSPC (nothing appended). Pure. */
int pgd__redis_event_json(char *out, size_t cap, size_t *len, int type, const pgd_hash *blocks,
                          size_t n, pgd_hash parent, int has_parent, uint32_t block_size,
                          const char *medium);

/* ---- the local index (redis_index.c) ----
 *
 * A bounded set of the blocks this instance knows to be in Redis (it wrote them, read
 * them, or an EXISTS confirmed them), each with the time it learnt it (seconds) and
 * whether it wrote the record itself. Buckets of PGD__RIX_WAYS entries: a block lives in
 * the bucket of its hash; a full bucket replaces its oldest entry (the set forgets, never
 * grows). Not locked: the tier calls it under its lock.
 */
#define PGD__RIX_WAYS 8

typedef struct pgd__rix_entry {
    pgd_hash block;
    uint32_t t_s;      /* when it was learnt (pgd__tier_now_ns seconds); 0: empty entry */
    uint16_t mine;     /* nonzero: this instance wrote the record */
    uint16_t verified; /* nonzero: written or read (MAC checked) by this instance; zero:
                        * only an EXISTS saw it, its bytes never checked */
} pgd__rix_entry;

typedef struct pgd__rix {
    pgd__rix_entry *e; /* [n_buckets * WAYS] */
    uint32_t n_buckets;
    uint32_t n_mine;   /* entries with mine set */
    uint64_t n_forgot; /* entries replaced in a full bucket */
} pgd__rix;

/* Makes an index of about n_entries entries (rounded up to a power-of-two of buckets).
 * Returns PGD_OK or PGD_ENOMEM. */
int pgd__rix_init(pgd__rix *x, const pgd__alloc *al, uint32_t n_entries);
void pgd__rix_deinit(pgd__rix *x, const pgd__alloc *al);
/* The entry of block, or NULL. An entry learnt more than ttl_s seconds before now_s is not
 * trusted: it is dropped and NULL returned (ttl_s 0: always trusted). */
pgd__rix_entry *pgd__rix_find(pgd__rix *x, pgd_hash block, uint32_t now_s, uint32_t ttl_s);
/* How an entry was learnt (pgd__rix_add): an EXISTS saw the key, this instance wrote the
 * record, or it read the record and its MAC and checksum held. */
enum { PGD__RIX_SEEN = 0, PGD__RIX_MINE = 1, PGD__RIX_READ = 2 };
/* Records block as present since now_s, learnt by how (PGD__RIX_*). An entry only rises:
 * mine stays mine, verified (MINE or READ) stays verified. A put skips only a verified
 * entry: a value that an EXISTS saw may be forged or damaged, and the put overwrites it. */
void pgd__rix_add(pgd__rix *x, pgd_hash block, uint32_t now_s, int how);
/* Forgets block (a del, a miss, a damaged value). Returns 1 when it was there. */
int pgd__rix_remove(pgd__rix *x, pgd_hash block);
/* Forgets everything (Redis answered a restart: misses start). */
void pgd__rix_clear(pgd__rix *x);

#endif /* PGD_TIER_REDIS_INT_H */
