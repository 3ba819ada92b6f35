/* SPDX-License-Identifier: MIT */
/*
 * fuzz_rclient.c - the Redis client's parsers (src/tier/redis/rclient.c) on any bytes.
 * The first byte picks the target, the rest is its input:
 *   % 3 == 0   pgd__rc_parse_redirect on the bytes (an error reply's text): a result of
 *              1 or 2 has a slot < 16384, a port 1..65535, a NUL-terminated host
 *   % 3 == 1   the bytes fed to hiredis's reader (RESP, as a server would send them);
 *              each reply it makes goes to pgd__rc_parse_slots (cap from the first
 *              byte): ranges within 0..16383, lo <= hi, ports 1..65535
 *   % 3 == 2   pgd__rc_key_slot against a plain reading of the Cluster spec's hash tag
 *              rule
 * Seeds (corpus/rclient/): real MOVED / ASK replies, a real CLUSTER SLOTS reply of a
 * 3-master cluster in RESP, malformed ones, keys with tags. A crash or a failed check
 * aborts.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "tier/redis/rclient.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        if (!(x)) abort();                                                                         \
    } while (0)

static void fuzz_redirect(const uint8_t *d, size_t n)
{
    pgd__rc_addr a;
    uint32_t slot = 99999;
    int kind;
    memset(&a, 0x55, sizeof a);
    kind = pgd__rc_parse_redirect((const char *)d, n, &slot, &a);
    CHECK(kind >= -1 && kind <= 2);
    if (kind > 0) {
        CHECK(slot < PGD__RC_SLOTS);
        CHECK(a.port >= 1 && a.port <= 65535);
        CHECK(memchr(a.host, '\0', sizeof a.host) != NULL);
        CHECK(memcmp(d, kind == 1 ? "MOVED " : "ASK ", kind == 1 ? 6 : 4) == 0);
    }
}

/* 1 when d holds an array header "*N" with N > 100000: hiredis 0.14 allocates N
 * elements up front (it has no maxelements; the client talks only to the servers it
 * authenticated with), so such an input measures the allocator, not the parser. */
static int huge_array(const uint8_t *d, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t v = 0;
        if (d[i] != '*') continue;
        for (size_t j = i + 1; j < n && d[j] >= '0' && d[j] <= '9' && v <= 100000; j++)
            v = v * 10 + (uint64_t)(d[j] - '0');
        if (v > 100000) return 1;
    }
    return 0;
}

static void fuzz_slots(uint8_t sel, const uint8_t *d, size_t n)
{
    static pgd__rc_range out[64];
    size_t cap = 1 + (size_t)(sel / 3) % 64;
    redisReader *r;
    if (huge_array(d, n)) return;
    r = redisReaderCreate();
    if (!r) return;
    if (redisReaderFeed(r, (const char *)d, n) == REDIS_OK) {
        for (int i = 0; i < 16; i++) {
            void *rep = NULL;
            int got;
            if (redisReaderGetReply(r, &rep) != REDIS_OK || !rep) break;
            got = pgd__rc_parse_slots(rep, (sel & 0x80) ? "10.0.0.1" : NULL, out, cap);
            CHECK(got >= -1 && (size_t)(got < 0 ? 0 : got) <= cap);
            for (int k = 0; k < got; k++) {
                CHECK(out[k].lo <= out[k].hi && out[k].hi < PGD__RC_SLOTS);
                CHECK(out[k].master.port >= 1 && out[k].master.port <= 65535);
                CHECK(out[k].master.host[0] != '\0');
                CHECK(memchr(out[k].master.host, '\0', PGD__RC_HOST_MAX) != NULL);
            }
            freeReplyObject(rep);
        }
    }
    redisReaderFree(r);
}

static void fuzz_key_slot(const uint8_t *d, size_t n)
{
    size_t open = n, close = n;
    uint32_t want;
    for (size_t i = 0; i < n && open == n; i++)
        if (d[i] == '{') open = i;
    for (size_t i = open + 1; i < n && close == n; i++)
        if (d[i] == '}') close = i;
    if (open < n && close < n && close > open + 1)
        want = pgd__rc_crc16(d + open + 1, close - open - 1) % 16384;
    else
        want = pgd__rc_crc16(d, n) % 16384;
    CHECK(pgd__rc_key_slot(d, n) == want);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0) return 0;
    switch (data[0] % 3) {
    case 0:
        fuzz_redirect(data + 1, size - 1);
        break;
    case 1:
        fuzz_slots(data[0], data + 1, size - 1);
        break;
    default:
        fuzz_key_slot(data + 1, size - 1);
        break;
    }
    return 0;
}
