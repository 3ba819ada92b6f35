/* SPDX-License-Identifier: MIT */
/*
 * t_alloc.h - the counting allocator of the fault-injection tests (test_fault_alloc.c,
 * test_fault_disk.c, test_tier_ram.c, test_cache_tiers.c): a pgd_allocator that counts the
 * live blocks and bytes and fails the fail_at-th allocation (malloc or realloc) after
 * t_counting_arm. Header-only (static functions), like t.h. Not thread-safe: only the test
 * thread (and the library under its own lock) may allocate through one.
 *
 *   static t_counting A;
 *   static const pgd_allocator alloc = T_COUNTING_ALLOCATOR(&A);
 *   t_counting_arm(&A, n);  ...the call under test...  t_counting_arm(&A, 0);
 *   if (A.fired) ...it must have returned PGD_ENOMEM...;  T_EQ(A.n_live, 0);
 */
#ifndef PGD_TESTS_T_ALLOC_H
#define PGD_TESTS_T_ALLOC_H

#include <stdalign.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <pagoda/pagoda.h>

typedef struct t_counting {
    long n_calls;   /* allocations attempted since t_counting_arm */
    long fail_at;   /* fail the fail_at-th one; 0: never */
    int fired;      /* the failure was injected */
    long n_live;    /* live blocks */
    size_t n_bytes; /* live bytes */
} t_counting;

/* Each block carries its size in a header this long, keeping malloc's alignment. */
enum {
    T_ALLOC_HDR = alignof(max_align_t) > sizeof(size_t) ? alignof(max_align_t) : sizeof(size_t)
};

static inline int t_counting_fail(t_counting *a)
{
    a->n_calls++;
    if (a->fail_at && a->n_calls == a->fail_at) {
        a->fired = 1;
        return 1;
    }
    return 0;
}

static inline void *t_counting_malloc(void *ud, size_t n)
{
    t_counting *a = ud;
    if (t_counting_fail(a)) return NULL;
    unsigned char *p = malloc(n + T_ALLOC_HDR);
    if (!p) return NULL;
    memcpy(p, &n, sizeof n);
    a->n_live++;
    a->n_bytes += n;
    return p + T_ALLOC_HDR;
}

static inline void *t_counting_realloc(void *ud, void *ptr, size_t n)
{
    t_counting *a = ud;
    if (!ptr) return t_counting_malloc(ud, n);
    if (t_counting_fail(a)) return NULL;
    unsigned char *h = (unsigned char *)ptr - T_ALLOC_HDR;
    size_t old;
    memcpy(&old, h, sizeof old);
    unsigned char *p = realloc(h, n + T_ALLOC_HDR);
    if (!p) return NULL;
    memcpy(p, &n, sizeof n);
    a->n_bytes = a->n_bytes - old + n;
    return p + T_ALLOC_HDR;
}

static inline void t_counting_free(void *ud, void *ptr)
{
    t_counting *a = ud;
    if (!ptr) return;
    unsigned char *h = (unsigned char *)ptr - T_ALLOC_HDR;
    size_t old;
    memcpy(&old, h, sizeof old);
    a->n_live--;
    a->n_bytes -= old;
    free(h);
}

/* A pgd_allocator initializer counting into the t_counting *a. */
#define T_COUNTING_ALLOCATOR(a)                                                                    \
    {                                                                                              \
        t_counting_malloc, t_counting_realloc, t_counting_free, (a)                                \
    }

/* Fails the n-th allocation from now (0: none), counting from zero again. */
static inline void t_counting_arm(t_counting *a, long n)
{
    a->n_calls = 0;
    a->fail_at = n;
    a->fired = 0;
}

#endif /* PGD_TESTS_T_ALLOC_H */
