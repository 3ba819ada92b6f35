/* SPDX-License-Identifier: MIT */
/*
 * alloc.c - every allocation of libpagoda goes through the user's allocator hook, so
 * tests can count allocations and inject failures (libuv uv_replace_allocator).
 */
#include <string.h>

#include "pgd_int.h"

static void *libc_malloc(void *ud, size_t n)
{
    (void)ud;
    return malloc(n);
}

static void *libc_realloc(void *ud, void *p, size_t n)
{
    (void)ud;
    return realloc(p, n);
}

static void libc_free(void *ud, void *p)
{
    (void)ud;
    free(p);
}

void pgd__alloc_init(pgd__alloc *al, const pgd_allocator *user)
{
    if (user && user->malloc && user->realloc && user->free) {
        al->a = *user;
    } else {
        al->a.malloc = libc_malloc;
        al->a.realloc = libc_realloc;
        al->a.free = libc_free;
        al->a.ud = NULL;
    }
}

void *pgd__malloc(const pgd__alloc *al, size_t n)
{
    return al->a.malloc(al->a.ud, n ? n : 1);
}

void *pgd__calloc(const pgd__alloc *al, size_t count, size_t size)
{
    if (size && count > SIZE_MAX / size) return NULL;
    size_t n = count * size;
    void *p = pgd__malloc(al, n);
    if (p) memset(p, 0, n ? n : 1);
    return p;
}

void *pgd__realloc(const pgd__alloc *al, void *p, size_t n)
{
    return al->a.realloc(al->a.ud, p, n ? n : 1);
}

void pgd__free(const pgd__alloc *al, void *p)
{
    if (p) al->a.free(al->a.ud, p);
}
