/* SPDX-License-Identifier: MIT */
/*
 * hash.c - keyed, chained 128-bit block hashes on XXH3-128 (libxxhash).
 *
 *   secret   = XXH3_generateSecret(key)       key: user-pinned bytes or 32 random bytes
 *   h_{-1}   = XXH3-128(secret, "pgd-seed-v1" || fingerprint || salt)
 *   h_i      = XXH3-128(secret, h_{i-1} || tokens of page i as little-endian int32)
 *
 * The secret makes the hash keyed: without it a client cannot craft a prompt whose
 * blocks collide with another tenant's, and the salt in the seed separates tenants.
 */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include "pgd_int.h"

int pgd__hasher_init(pgd__hasher *h, const uint8_t *key, size_t key_len, pgd_hash fingerprint)
{
    uint8_t rnd[32];
    if (!key) {
        size_t got = 0;
        while (got < sizeof rnd) {
            ssize_t r = getrandom(rnd + got, sizeof rnd - got, 0);
            if (r < 0) {
                if (errno == EINTR) continue;
                return PGD_EIO;
            }
            got += (size_t)r;
        }
        key = rnd;
        key_len = sizeof rnd;
    }
    if (key_len == 0 || key_len > 256) return PGD_EINVAL;
    if (XXH3_generateSecret(h->secret, sizeof h->secret, key, key_len) != XXH_OK) return PGD_EINVAL;
    h->fingerprint = fingerprint;
    memset(rnd, 0, sizeof rnd);
    return PGD_OK;
}

static pgd_hash from_xxh(XXH128_hash_t x)
{
    pgd_hash r = {x.low64, x.high64};
    return r;
}

pgd_hash pgd__hash_seed(const pgd__hasher *h, const void *salt, size_t salt_len)
{
    static const char tag[] = "pgd-seed-v1";
    XXH3_state_t st;
    uint8_t fp[16];
    memcpy(fp, &h->fingerprint.lo, 8);
    memcpy(fp + 8, &h->fingerprint.hi, 8);
    XXH3_128bits_reset_withSecret(&st, h->secret, sizeof h->secret);
    XXH3_128bits_update(&st, tag, sizeof tag);
    XXH3_128bits_update(&st, fp, sizeof fp);
    if (salt_len) XXH3_128bits_update(&st, salt, salt_len);
    return from_xxh(XXH3_128bits_digest(&st));
}

pgd_hash pgd__hash_block(const pgd__hasher *h, pgd_hash prev, const int32_t *tokens, size_t n)
{
    /* One-shot on a stack buffer is ~4x faster than the streaming API for small pages. */
    uint8_t buf[16 + 4 * 1024];
    if (n <= 1024) {
        memcpy(buf, &prev.lo, 8);
        memcpy(buf + 8, &prev.hi, 8);
        memcpy(buf + 16, tokens, 4 * n); /* x86/arm little-endian: tokens as stored */
        return from_xxh(XXH3_128bits_withSecret(buf, 16 + 4 * n, h->secret, sizeof h->secret));
    }
    XXH3_state_t st;
    XXH3_128bits_reset_withSecret(&st, h->secret, sizeof h->secret);
    memcpy(buf, &prev.lo, 8);
    memcpy(buf + 8, &prev.hi, 8);
    XXH3_128bits_update(&st, buf, 16);
    XXH3_128bits_update(&st, tokens, 4 * n);
    return from_xxh(XXH3_128bits_digest(&st));
}
