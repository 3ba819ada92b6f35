/* SPDX-License-Identifier: MIT */
/*
 * cpu.c - ISA detection (see cpu.h). Callers: codec/registry.c (kernel tables),
 * util/fp16.c (F16C rows), tests and benches (through the codec tables).
 * State: the detected level, an atomic set once (-1 until then); two threads racing on
 * the first call both detect and store the same value.
 */
#include <stdatomic.h>

#include "util/cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define CPU_X86 1
#endif

static atomic_int isa_level = -1;

static int detect(void)
{
#ifdef CPU_X86
    unsigned a, b, c, d;
    __builtin_cpu_init();
    /* F16C by CPUID (leaf 1, ECX bit 29): older compilers' __builtin_cpu_supports lacks it. */
    int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    int avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    int vnni =
        avx512 && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi");
    if (vnni) return PGD__ISA_VNNI;
    if (avx512) return PGD__ISA_AVX512;
    if (avx2) return PGD__ISA_AVX2;
#endif
    return PGD__ISA_SCALAR;
}

int pgd__cpu_isa(void)
{
    int v = atomic_load_explicit(&isa_level, memory_order_relaxed);
    if (v < 0) {
        v = detect();
        atomic_store_explicit(&isa_level, v, memory_order_relaxed);
    }
    return v;
}
