/* SPDX-License-Identifier: MIT */
/*
 * t.h - the whole test harness (Redis testhelp.h style). A test program is a main()
 * that calls T_RUN(fn) for each static int fn(void); a test returns 0 on success.
 * A failure returns -1 (T_FAIL), so that a helper's failure fails the T_OK that calls it
 * (T_OK fails on a negative result: a helper returning 1 would pass unnoticed).
 * Exit 77 means skipped (ctest SKIP_RETURN_CODE): T_SKIP says why on stderr.
 */
#ifndef PGD_T_H
#define PGD_T_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int t_failed, t_run;

#define T_FAIL(...)                                                                                \
    do {                                                                                           \
        fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                                            \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        return -1;                                                                                 \
    } while (0)

#define T_ASSERT(x)                                                                                \
    do {                                                                                           \
        if (!(x)) T_FAIL("assertion failed: %s", #x);                                              \
    } while (0)

#define T_EQ(a, b)                                                                                 \
    do {                                                                                           \
        long long t_a_ = (long long)(a), t_b_ = (long long)(b);                                    \
        if (t_a_ != t_b_) T_FAIL("%s == %s: %lld != %lld", #a, #b, t_a_, t_b_);                    \
    } while (0)

#define T_OK(x)                                                                                    \
    do {                                                                                           \
        long long t_r_ = (long long)(x);                                                           \
        if (t_r_ < 0) T_FAIL("%s returned %lld", #x, t_r_);                                        \
    } while (0)

#define T_RUN(fn)                                                                                  \
    do {                                                                                           \
        t_run++;                                                                                   \
        if ((fn)() != 0) {                                                                         \
            t_failed++;                                                                            \
            fprintf(stderr, "FAIL %s\n", #fn);                                                     \
        } else {                                                                                   \
            printf("ok   %s\n", #fn);                                                              \
        }                                                                                          \
    } while (0)

#define T_DONE()                                                                                   \
    do {                                                                                           \
        printf("%d passed, %d failed\n", t_run - t_failed, t_failed);                              \
        return t_failed ? 1 : 0;                                                                   \
    } while (0)

#define T_SKIP(why)                                                                                \
    do {                                                                                           \
        fprintf(stderr, "skipped: %s\n", why);                                                     \
        return 77;                                                                                 \
    } while (0)

/* Deterministic xorshift64* for randomized tests. */
static inline uint64_t t_rand(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ULL;
}

#endif /* PGD_T_H */
