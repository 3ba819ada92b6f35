/* SPDX-License-Identifier: MIT */
/*
 * fuzz_redis_value.c - fuzz target for opening a value read back from Redis (src/tier/
 * redis/redis_value.c, pgd__redis_value_open): Redis is shared infrastructure, so a value
 * may be anything anyone wrote. Most inputs die at the MAC; to get past it the target also
 * seals records itself and then edits them, with or without sealing them again:
 *
 *   byte 0  flags: 1 key bounds, 2 seal again after the edits, 4 raw (the rest of the
 *           input is the whole value), 8 raw record (the rest is a record: the target
 *           appends its correct MAC), 16 ask for another block, 32 expect another model
 *   then    up to 8 edits of 3 bytes (offset lo, offset hi, xor), while byte 1 says how
 *           many (byte 1 % 9); the rest seeds the page bytes
 *
 * Properties: open never crashes and returns a PGD__RV_*; the page buffer is untouched
 * (a canary) unless the MAC and the header verified; a value whose bytes were edited and
 * not sealed again never opens (the MAC); a sealed value that was not edited opens OK
 * (unless the block asked for or the model differs) with the page and bounds it was
 * sealed from; OK means the payload copied is the value's own and its header is the
 * block's and the identity's. Built as a libFuzzer target with -DPGD_FUZZ=ON (clang), and
 * always as a corpus replayer (replay_main.c) that ctest runs over corpus/redis_value/.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tier/redis/redis_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { MAX_VALUE = 1 << 16, CANARY = 0xA5 };

static pgd__redis_mac mac;
static int mac_ok;

static void ident_of(int bounds, pgd_hash fp, pgd_record_ident *id)
{
    pgd_pool_params p = pgd_pool_default_params();
    p.n_layers = 1;
    p.n_kv_heads = 1;
    p.head_dim = 8;
    p.page_tokens = 4;
    p.kv_type = PGD_KV_F32;
    p.key_bounds = bounds;
    if (pgd_record_ident_make(&p, fp, id) != PGD_OK) abort();
}

static int untouched(const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (b[i] != CANARY) return 0;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint8_t key[] = "fuzz shared key";
    if (!mac_ok) {
        if (pgd__redis_mac_init(&mac, key, sizeof key - 1) != PGD_OK) abort();
        mac_ok = 1;
    }
    if (size < 1 || size > MAX_VALUE) return 0;
    int flags = data[0];
    const pgd_hash fp = {0x1234, 0x5678}, other_fp = {0x1234, 0x5679};
    const pgd_hash block = {0xb10c, 0x1}, parent = {0xb10c, 0x0}, other = {0xb10d, 0x1};
    pgd_record_ident id, expect;
    ident_of(flags & 1, fp, &id);
    ident_of(flags & 1, (flags & 32) ? other_fp : fp, &expect);
    char k[PGD__REDIS_KEY_MAX];
    size_t kl = pgd__redis_key("pgd", pgd__redis_ident_hash(&expect), block, k, sizeof k);
    if (!kl) abort();
    pgd_hash ask = (flags & 16) ? other : block;

    uint8_t *value = NULL;
    size_t vlen = 0;
    int edited = 0, sealed = 0;
    const uint8_t *page_src = NULL;
    if (flags & (4 | 8)) {
        vlen = size - 1 + ((flags & 4) ? 0 : PGD__REDIS_MAC_BYTES);
        value = malloc(vlen + 1);
        if (!value) abort();
        memcpy(value, data + 1, size - 1);
        if (!(flags & 4)) {
            if (pgd__redis_mac_compute(&mac, k, kl, value, size - 1, value + size - 1) != PGD_OK)
                abort();
            sealed = 1;
        }
        edited = 1; /* not built by seal: anything may be in it */
    } else {
        size_t pos = 1, n_edits = size > 1 ? data[1] % 9 : 0;
        pos += size > 1;
        vlen = (size_t)pgd__redis_value_bytes(&id);
        value = malloc(vlen);
        uint8_t *page = malloc((size_t)(id.page_bytes + id.bounds_bytes));
        if (!value || !page) abort();
        size_t seed_at = pos + 3 * n_edits;
        for (uint64_t i = 0; i < id.page_bytes + id.bounds_bytes; i++)
            page[i] = seed_at < size ? data[seed_at + i % (size - seed_at)] : (uint8_t)i;
        if (pgd__redis_value_seal(&mac, k, kl, &id, block, parent, page,
                                  id.bounds_bytes ? page + id.page_bytes : NULL, value) != PGD_OK)
            abort();
        sealed = 1;
        for (size_t e = 0; e < n_edits && pos + 3 <= size; e++, pos += 3) {
            size_t off = (size_t)(data[pos] | data[pos + 1] << 8) % vlen;
            if (data[pos + 2]) edited = 1;
            value[off] ^= data[pos + 2];
        }
        if (edited && (flags & 2)) {
            size_t rec = vlen - PGD__REDIS_MAC_BYTES;
            if (pgd__redis_mac_compute(&mac, k, kl, value, rec, value + rec) != PGD_OK) abort();
        } else if (edited) {
            sealed = 0;
        }
        page_src = edited ? NULL : page;
        if (!page_src) free(page);
    }

    size_t pb = (size_t)expect.page_bytes, bb = (size_t)expect.bounds_bytes;
    uint8_t *out = malloc(pb + bb + 1);
    if (!out) abort();
    memset(out, CANARY, pb + bb + 1);
    pgd_record_info info;
    int rc = pgd__redis_value_open(&mac, k, kl, value, vlen, &expect, ask, out,
                                   bb ? out + pb : NULL, &info);
    if (rc < PGD__RV_OK || rc > PGD__RV_FOREIGN) abort();
    if (out[pb + bb] != CANARY) abort(); /* never past the buffer */
    if ((rc == PGD__RV_MAC || rc == PGD__RV_FOREIGN) && !untouched(out, pb + bb)) abort();
    if (!sealed && rc != PGD__RV_MAC) abort(); /* edited, not sealed again: the MAC fails */
    if (rc == PGD__RV_OK) {
        const uint8_t *payload = value + PGD_RECORD_HEADER_BYTES;
        if (vlen != (size_t)pgd__redis_value_bytes(&expect)) abort();
        if (memcmp(out, payload, pb + bb) != 0) abort();
        if (!pgd_hash_eq(info.block, ask) && !pgd_hash_eq(ask, block)) abort();
        if (!pgd_record_ident_eq(&info.ident, &expect)) abort();
        /* Checks only (no page) agrees. */
        if (pgd__redis_value_open(&mac, k, kl, value, vlen, &expect, ask, NULL, NULL, NULL) !=
            PGD__RV_OK)
            abort();
    }
    if (page_src) {
        /* Sealed and not edited: OK unless another block or model was asked for. */
        int want = (flags & 32) ? PGD__RV_FOREIGN : (flags & 16) ? PGD__RV_CORRUPT : PGD__RV_OK;
        if (rc != want) abort();
        if (rc == PGD__RV_OK && memcmp(out, page_src, pb + bb) != 0) abort();
        free((void *)page_src);
    }
    free(out);
    free(value);
    return 0;
}
