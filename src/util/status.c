/* SPDX-License-Identifier: MIT */
/*
 * status.c - version, status strings, hash formatting and the always-on check hook.
 */
#include <stdio.h>
#include <stdlib.h>

#include "pgd_int.h"

const char *pgd_version(void)
{
    return PGD_VERSION_STRING;
}

const char *pgd_strerror(int status)
{
    switch (status) {
    case PGD_OK:
        return "ok";
    case PGD_ENOMEM:
        return "out of memory";
    case PGD_EINVAL:
        return "invalid argument";
    case PGD_ENOSPC:
        return "no space: pool full and nothing evictable";
    case PGD_ENOTFOUND:
        return "not found";
    case PGD_EBUSY:
        return "busy: object in use or limit reached";
    case PGD_EIO:
        return "i/o error";
    case PGD_ECORRUPT:
        return "corrupt data or broken invariant";
    case PGD_ESTATE:
        return "call not valid in the object's current state";
    case PGD_ENOTSUP:
        return "operation not supported";
    default:
        return status >= 0 ? "ok (count)" : "unknown error";
    }
}

void pgd_hash_hex(pgd_hash h, char buf[33])
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        buf[i] = digits[(h.hi >> (60 - 4 * i)) & 15];
        buf[16 + i] = digits[(h.lo >> (60 - 4 * i)) & 15];
    }
    buf[32] = '\0';
}

void pgd__check_fail(const char *file, int line, const char *expr)
{
    /* The one place the library may abort: a broken invariant that would corrupt memory. */
    fprintf(stderr, "pagoda: check failed at %s:%d: %s\n", file, line, expr);
    abort();
}
