/* SPDX-License-Identifier: MIT */
/*
 * cpu.h - the ISA level of this CPU (util/cpu.c), detected once by cpuid. The codecs pick
 * their kernel tables by it (codec/registry.c) and the f16 row conversions their F16C path
 * (util/fp16.c). Internal to libpagoda.
 */
#ifndef PGD_UTIL_CPU_H
#define PGD_UTIL_CPU_H

/* ISA levels, each including the ones below:
 *   PGD__ISA_SCALAR  portable C
 *   PGD__ISA_AVX2    AVX2 + FMA + F16C
 *   PGD__ISA_AVX512  AVX-512 F, BW, VL, DQ
 *   PGD__ISA_VNNI    AVX-512 + VNNI + VBMI (the integer kernels of q8_0, q4_0, kivi2) */
enum { PGD__ISA_SCALAR = 0, PGD__ISA_AVX2 = 1, PGD__ISA_AVX512 = 2, PGD__ISA_VNNI = 3 };

/* The best ISA level of this CPU: PGD__ISA_SCALAR on other architectures. Detected at the
 * first call, then a relaxed atomic load. Thread-safe. */
int pgd__cpu_isa(void);

#endif /* PGD_UTIL_CPU_H */
