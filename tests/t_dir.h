/* SPDX-License-Identifier: MIT */
/*
 * t_dir.h - the scratch directories of the tests that write files (the disk tier's tests:
 * test_tier_disk.c, test_fault_disk.c, test_cache_tiers.c, fuzz_tier_disk.c):
 *   t_rm_rf          removes a directory and everything below it (links not followed)
 *   t_scratch_root   a fresh NAME.d.PID below the working directory (ctest's build folder)
 * Header-only (static functions), like t.h. nftw needs _XOPEN_SOURCE 500 or later (or
 * _GNU_SOURCE) defined before the first system header of the test.
 */
#ifndef PGD_TESTS_T_DIR_H
#define PGD_TESTS_T_DIR_H

#include <ftw.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

static inline int t_rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

/* Removes path and everything below it; what cannot be removed stays, silently. */
static inline void t_rm_rf(const char *path)
{
    nftw(path, t_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* Makes buf = CWD/name.d.PID, empty (what a killed earlier run left is removed). Returns 0,
 * or -1 when the working directory is unknown or the directory cannot be made. */
static inline int t_scratch_root(char *buf, size_t len, const char *name)
{
    char cwd[400];
    if (!getcwd(cwd, sizeof cwd)) return -1;
    snprintf(buf, len, "%s/%s.d.%ld", cwd, name, (long)getpid());
    t_rm_rf(buf);
    return mkdir(buf, 0755) == 0 ? 0 : -1;
}

#endif /* PGD_TESTS_T_DIR_H */
