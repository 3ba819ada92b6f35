/* SPDX-License-Identifier: MIT */
/*
 * pagoda.h - libpagoda: version, status codes, allocator and log hooks, block hashes.
 *
 * Every public header of libpagoda includes this one. It compiles alone as C11 and C++.
 * Conventions used across the API:
 *   - A call that can fail returns int: PGD_OK (0), a non-negative count where one is
 *     natural, or a negative pgd_status. On error, outputs are NULL/unchanged and the
 *     object is left as it was.
 *   - Objects are opaque handles created with *_create() from a params struct obtained
 *     from *_default_params() (append-only structs) and destroyed with *_destroy()
 *     (NULL is a no-op).
 *   - The library never prints, never exits and never aborts on a runtime condition;
 *     diagnostics go to the log hook.
 */
#ifndef PAGODA_H
#define PAGODA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define PGD_API __declspec(dllexport)
#elif defined(__GNUC__)
#define PGD_API __attribute__((visibility("default")))
#else
#define PGD_API
#endif

#define PGD_VERSION_MAJOR 0
#define PGD_VERSION_MINOR 1
#define PGD_VERSION_PATCH 0
#define PGD_VERSION_STRING "0.1.0"

/* Returns the library's version string ("MAJOR.MINOR.PATCH"); static storage. */
PGD_API const char *pgd_version(void);

/* Status codes. Only negative values are errors. Append only, never renumber. */
typedef enum pgd_status {
    PGD_OK = 0,
    PGD_ENOMEM = -1,    /* allocation failed; nothing changed */
    PGD_EINVAL = -2,    /* bad argument detected cheaply */
    PGD_ENOSPC = -3,    /* pool full and nothing evictable; nothing changed */
    PGD_ENOTFOUND = -4, /* no such key / sequence / entry */
    PGD_EBUSY = -5,     /* object in use (page pinned, sequence busy) */
    PGD_EIO = -6,       /* tier I/O failed; detail via the log hook */
    PGD_ECORRUPT = -7,  /* checksum or format mismatch on load */
    PGD_ESTATE = -8,    /* call not valid in the object's current state */
    PGD_ENOTSUP = -9    /* the object does not support the operation (an optional op) */
} pgd_status;

/* Returns a short English description of a status code; static storage, never NULL. */
PGD_API const char *pgd_strerror(int status);

/*
 * Allocator hook. Every allocation libpagoda makes goes through it (tests use a
 * counting allocator to inject failures). NULL in a params struct means libc.
 * realloc(ud, NULL, n) must behave as malloc; free(ud, NULL) must be a no-op.
 */
typedef struct pgd_allocator {
    void *(*malloc)(void *ud, size_t size);
    void *(*realloc)(void *ud, void *ptr, size_t size);
    void (*free)(void *ud, void *ptr);
    void *ud;
} pgd_allocator;

typedef enum pgd_log_level {
    PGD_LOG_ERROR = 0,
    PGD_LOG_WARN = 1,
    PGD_LOG_INFO = 2,
    PGD_LOG_DEBUG = 3
} pgd_log_level;

/* Log hook: msg is borrowed for the call. May be called with the cache lock held:
 * it must not call back into libpagoda. */
typedef void (*pgd_log_fn)(void *ud, int level, const char *msg);

/* A 128-bit block hash. Equal hashes mean equal prefixes (same model, tenant, tokens). */
typedef struct pgd_hash {
    uint64_t lo;
    uint64_t hi;
} pgd_hash;

/* Returns non-zero when a and b are the same hash. */
static inline int pgd_hash_eq(pgd_hash a, pgd_hash b)
{
    return a.lo == b.lo && a.hi == b.hi;
}

/* Writes the 32 lower-case hex digits of h (hi then lo) and a NUL into buf[33]. */
PGD_API void pgd_hash_hex(pgd_hash h, char buf[33]);

#ifdef __cplusplus
}
#endif
#endif /* PAGODA_H */
