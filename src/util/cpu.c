/* SPDX-License-Identifier: MIT */
/*
 * cpu.c - ISA detection (see cpu.h). Callers: codec/registry.c (kernel tables),
 * util/fp16.c (F16C rows), tests and benches (through the codec tables).
 * State: the detected level, an atomic set once (-1 until then); two threads racing on
 * the first call both detect and store the same value.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

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

/* PGD_ISA (the engine's switch, engine/ops/ops.c) lowers the library's level too, so that
 * an AVX-512 machine runs what an AVX2-only CPU runs, attention and codecs included:
 * scalar -> SCALAR, avx2 and avx2vnni -> AVX2 (the library has no AVX-VNNI kernels),
 * avx512 -> AVX512 without the VNNI tables. Anything else (auto, unset, a typo, which the
 * engine reports) leaves the detected level; a level above the CPU's is ignored. */
static int env_cap(int best)
{
    const char *s = getenv("PGD_ISA");
    int want = best;
    if (!s) return best;
    if (!strcmp(s, "scalar"))
        want = PGD__ISA_SCALAR;
    else if (!strcmp(s, "avx2") || !strcmp(s, "avx2vnni"))
        want = PGD__ISA_AVX2;
    else if (!strcmp(s, "avx512"))
        want = PGD__ISA_AVX512;
    return want < best ? want : best;
}

int pgd__cpu_isa(void)
{
    int v = atomic_load_explicit(&isa_level, memory_order_relaxed);
    if (v < 0) {
        v = env_cap(detect());
        atomic_store_explicit(&isa_level, v, memory_order_relaxed);
    }
    return v;
}
