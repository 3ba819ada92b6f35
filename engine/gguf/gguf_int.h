/* SPDX-License-Identifier: MIT */
/*
 * gguf_int.h - what the three files of the GGUF module share: gguf.c (the reader and its
 * typed getters), gguf_render.c (values as text) and gguf_write.c (the writer). Other
 * callers use gguf.h.
 *
 * Invariant: the value helpers read values whose bytes the reader has validated
 * (pe_gguf_open*) or the writer has encoded; they check nothing themselves.
 */
#ifndef PE_GGUF_INT_H
#define PE_GGUF_INT_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

#define PE_GGUF_DEFAULT_ALIGNMENT 32 /* when general.alignment is absent */

/* Returns the bytes of a scalar value; 0 for string, array and unknown types. */
static inline uint64_t pe__gguf_scalar_size(uint32_t t)
{
    static const uint8_t sz[PE_GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < PE_GGUF_TYPE_COUNT ? sz[t] : 0;
}

/* snprintf into err[0..errlen) (err NULL or errlen 0: nothing). */
void pe__gguf_set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Reads a scalar integer value of type at p: *neg is set when it is negative (then *mag is
 * its magnitude, as an unsigned). Returns 0, or -2 if type is not an integer type. */
int pe__gguf_int_value(uint32_t type, const uint8_t *p, uint64_t *mag, int *neg);

/* Returns the bytes of the value of type at p (a string with its length, an array with
 * its element type and count). */
uint64_t pe__gguf_value_span(uint32_t type, const uint8_t *p);
/* Returns the bytes of the n elements of elem_type of an array body at p. */
uint64_t pe__gguf_array_body_span(uint32_t elem_type, uint64_t n, const uint8_t *p);

#endif /* PE_GGUF_INT_H */
