/* SPDX-License-Identifier: MIT */
/*
 * fuzz_record.c - fuzz target for the page record reader (src/tier/record.c,
 * pgd_record_read_header), the parser of what a disk tier reads back from files that
 * anyone may have written. The input is a record: its first 128 bytes are the header
 * (zero-padded when shorter: a torn write), the rest the payload.
 *
 * Properties: the reader returns PGD_OK, PGD_ECORRUPT or PGD_EINVAL, never crashes; a
 * record it accepts has a payload within the input, and writing its decoded header again
 * gives the same 128 bytes (the encoding is canonical, so nothing in a header escapes the
 * checks); a compressed payload it accepts decompresses safely (or is refused) into
 * raw_bytes; with an expected identity, OK means equal identities. Built as a libFuzzer
 * target with -DPGD_FUZZ=ON (clang), and always as a corpus replayer (replay_main.c) that
 * ctest runs over corpus/record/.
 */
#include <lz4.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "pagoda/tier.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Decompressed payloads larger than this are not tried (the reader does not decompress;
 * this only exercises the path a tier takes next). */
enum { MAX_RAW = 1 << 20 };

static void check_accepted(const uint8_t *header, const uint8_t *payload, size_t payload_len,
                           const pgd_record_info *info)
{
    uint8_t again[PGD_RECORD_HEADER_BYTES];
    if (info->payload_bytes > payload_len) abort();
    if (pgd_record_write_header(info, payload, again) != PGD_OK) abort();
    if (memcmp(again, header, sizeof again) != 0) abort();
    if (info->ident.page_bytes == 0) abort();
    if (info->raw_bytes < info->ident.bounds_bytes) abort();
    if (info->compression == PGD_RECORD_RAW || info->raw_bytes > MAX_RAW) return;
    uint8_t *raw = malloc((size_t)info->raw_bytes);
    if (!raw) abort();
    if (info->compression == PGD_RECORD_LZ4) {
        int n = LZ4_decompress_safe((const char *)payload, (char *)raw, (int)info->payload_bytes,
                                    (int)info->raw_bytes);
        if (n > (int)info->raw_bytes) abort();
    } else {
        size_t n =
            ZSTD_decompress(raw, (size_t)info->raw_bytes, payload, (size_t)info->payload_bytes);
        if (!ZSTD_isError(n) && n > info->raw_bytes) abort();
    }
    free(raw);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t header[PGD_RECORD_HEADER_BYTES];
    size_t hn = size < sizeof header ? size : sizeof header;
    const uint8_t *payload = data + hn;
    size_t payload_len = size - hn;
    pgd_record_info info;

    memset(header, 0, sizeof header);
    memcpy(header, data, hn);

    /* The identity of the seed corpus (tests/fuzz/corpus/record: f16, 1 layer, 1 head,
     * head_dim 32, 2 tokens a page, model {1, 2}). */
    pgd_pool_params p = pgd_pool_default_params();
    p.n_layers = 1;
    p.n_kv_heads = 1;
    p.head_dim = 32;
    p.page_tokens = 2;
    pgd_hash fp = {1, 2};
    pgd_record_ident expect;
    if (pgd_record_ident_make(&p, fp, &expect) != PGD_OK) abort();

    int rc = pgd_record_read_header(header, payload, payload_len, NULL, &info);
    if (rc != PGD_OK && rc != PGD_ECORRUPT && rc != PGD_EINVAL) abort();
    if (rc == PGD_EINVAL) abort(); /* foreign needs an expected identity */
    if (rc == PGD_OK) check_accepted(header, payload, payload_len, &info);

    int rc2 = pgd_record_read_header(header, payload, payload_len, &expect, &info);
    if (rc2 != PGD_OK && rc2 != PGD_ECORRUPT && rc2 != PGD_EINVAL) abort();
    if ((rc2 == PGD_ECORRUPT) != (rc == PGD_ECORRUPT)) abort();
    if (rc2 == PGD_OK && !pgd_record_ident_eq(&expect, &info.ident)) abort();
    if (rc2 == PGD_EINVAL && pgd_record_ident_eq(&expect, &info.ident)) abort();

    /* The header alone: never stricter than with its payload. */
    int rc3 = pgd_record_read_header(header, NULL, 0, NULL, &info);
    if (rc3 != PGD_OK && rc3 != PGD_ECORRUPT) abort();
    if (rc == PGD_OK && rc3 != PGD_OK) abort();
    return 0;
}
