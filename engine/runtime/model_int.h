/* SPDX-License-Identifier: MIT */
/*
 * model_int.h - declarations shared by the files of engine/runtime only (weights.c,
 * forward.c): never included from outside this folder. Clients use model.h.
 */
#ifndef PE_MODEL_INT_H
#define PE_MODEL_INT_H

#include <stddef.h>

#include "model.h"

/* Writes one formatted line into err (when err and errlen are set) and returns -1. */
int pe__errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif /* PE_MODEL_INT_H */
