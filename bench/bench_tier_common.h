/* SPDX-License-Identifier: MIT */
/*
 * bench_tier_common.h - what the tier benches (bench_tier.c, bench_tier_modes.c) share:
 * the --smoke model, loading the model with its pages' size, the tiers' directory, a RAM
 * tier over a disk tier and a context on them. Header-only (static functions) like
 * bench.h, which it includes; the benches are built with the engine (bench/CMakeLists.txt).
 * Messages go to stderr prefixed with the bench's name (prog); figures stay in the benches.
 */
#ifndef PGD_BENCH_TIER_COMMON_H
#define PGD_BENCH_TIER_COMMON_H

#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <pagoda/tier.h>

#include "bench.h"
#include "model.h"

/* A progress hook for pe_model_load: loading with one prefaults the weights. */
static inline void bench_tier_touch(void *ud, uint64_t done, uint64_t total)
{
    (void)ud, (void)done, (void)total;
}

/* The --smoke model: $PGD_MODELS_DIR/stories260K.gguf, else ../shared/models beside the
 * source tree, into path. Returns 0, or 77 (ctest: skipped, bench/CMakeLists.txt) with a
 * message when it is absent. */
static inline int bench_tier_smoke_model(const char *prog, char *path, size_t cap)
{
    const char *dir = getenv("PGD_MODELS_DIR");
    snprintf(path, cap, "%s/stories260K.gguf", dir ? dir : PGD_SOURCE_DIR "/../shared/models");
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s --smoke: %s not found, skipped\n", prog, path);
        return 77;
    }
    fclose(f);
    return 0;
}

/* Loads the model at path into *m, with the context's page size into *page_tokens and a
 * page's f16 KV bytes, estimated from the shape, into *page_bytes. Returns its hparams, or
 * NULL with a message. */
static inline const pe_hparams *bench_tier_model_load(const char *prog, const char *path,
                                                      pe_model **m, uint32_t *page_tokens,
                                                      uint64_t *page_bytes)
{
    char err[512];
    if (pe_model_load(path, bench_tier_touch, NULL, m, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", prog, err);
        return NULL;
    }
    const pe_hparams *hp = pe_model_hparams(*m);
    *page_tokens = pe_ctx_default_params().page_tokens;
    double bpt =
        pgd_kv_bytes_per_token(PGD_KV_F16, *page_tokens, hp->n_layer, hp->n_head_kv, hp->head_dim);
    *page_bytes = (uint64_t)(bpt * *page_tokens + 0.5);
    return hp;
}

/* Where the tiers' directories are made by default: $TMPDIR, else /tmp. */
static inline const char *bench_tier_tmpdir(void)
{
    const char *parent = getenv("TMPDIR");
    return parent && *parent ? parent : "/tmp";
}

/* A fresh directory parent/name.XXXXXX into dir. Returns 0, or -1 with a message. */
static inline int bench_tier_mkdtemp(const char *prog, const char *parent, const char *name,
                                     char *dir, size_t cap)
{
    snprintf(dir, cap, "%s/%s.XXXXXX", parent, name);
    if (mkdtemp(dir)) return 0;
    fprintf(stderr, "%s: mkdtemp %s: %s\n", prog, dir, strerror(errno));
    return -1;
}

static int bench_tier_rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)ftw;
    return flag == FTW_DP ? rmdir(path) : unlink(path);
}

/* Removes dir and everything below it (links are not followed). */
static inline void bench_tier_rm_tree(const char *dir)
{
    nftw(dir, bench_tier_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* An empty RAM tier of ram_capacity bytes into *ram, the disk tier on dir (its records
 * kept) into *disk and the disk tier's key into key. Returns PGD_OK, or the failed call's
 * status with *what naming the step ("RAM tier", "disk tier", "disk tier key"); the tiers
 * made so far stay in *ram and *disk, for the caller to close. */
static inline int bench_tier_open(uint64_t ram_capacity, const char *dir, uint64_t disk_capacity,
                                  int o_direct, pgd_tier **ram, pgd_tier **disk, uint8_t key[32],
                                  const char **what)
{
    pgd_tier_ram_params rp = pgd_tier_ram_default_params();
    rp.capacity_bytes = ram_capacity;
    *what = "RAM tier";
    int rc = pgd_tier_ram_create(&rp, ram);
    if (rc != PGD_OK) return rc;
    pgd_tier_disk_params dp = pgd_tier_disk_default_params();
    dp.dir = dir;
    dp.capacity_bytes = disk_capacity;
    dp.o_direct = o_direct;
    *what = "disk tier";
    rc = pgd_tier_disk_create(&dp, disk);
    if (rc != PGD_OK) return rc;
    *what = "disk tier key";
    return pgd_tier_disk_key(*disk, key);
}

/* Context params cp on the two tiers use[0] (RAM), use[1] (disk), with the disk tier's
 * key, so that its records match across restarts. use and key must outlive the context. */
static inline void bench_tier_ctx_tiers(pe_ctx_params *cp, const pgd_tier_use use[2],
                                        const uint8_t key[32])
{
    cp->tiers = use;
    cp->n_tiers = 2;
    cp->hash_key = key;
    cp->hash_key_len = 32;
}

/* pe_ctx_create on m with cp into *out. Returns 0, or -1 with a message. */
static inline int bench_tier_ctx_create(const char *prog, pe_model *m, const pe_ctx_params *cp,
                                        pe_ctx **out)
{
    char err[512];
    if (pe_ctx_create(m, cp, out, err, sizeof err) == 0) return 0;
    fprintf(stderr, "%s: context: %s\n", prog, err);
    return -1;
}

#endif /* PGD_BENCH_TIER_COMMON_H */
