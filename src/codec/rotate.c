/* SPDX-License-Identifier: MIT */
/*
 * rotate.c - the randomized Hadamard rotation of a head vector (pgd__hadamard, declared in
 * codec_int.h): x <- H D x forward, x <- D H x inverse, with H the normalised Walsh-Hadamard
 * matrix (in-place butterflies, O(head_dim log head_dim)) and D the +-1 signs drawn from a
 * seed. Callers: cache.c (pgd_seq_write_kv rotates K and V of kv_rotate pools), the
 * attention kernels (rotate queries, inverse-rotate outputs). No state.
 */
#include <math.h>

#include "codec_int.h"
#include "pagoda/pagoda.h"

static uint64_t splitmix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Sign i of D is negative when bit (i % 64) of splitmix64(seed + i / 64) is set. */
static void apply_signs(float *x, uint32_t n, uint64_t seed)
{
    for (uint32_t i0 = 0; i0 < n; i0 += 64) {
        uint64_t bits = splitmix64(seed + i0 / 64);
        for (uint32_t i = i0; i < n && i < i0 + 64; i++)
            if ((bits >> (i - i0)) & 1u) x[i] = -x[i];
    }
}

int pgd__hadamard(float *x, uint32_t head_dim, uint64_t seed, int inverse)
{
    uint32_t n = head_dim;
    if (n == 0 || (n & (n - 1))) return PGD_EINVAL;
    if (!inverse) apply_signs(x, n, seed);
    for (uint32_t len = 1; len < n; len <<= 1)
        for (uint32_t i = 0; i < n; i += len << 1)
            for (uint32_t j = i; j < i + len; j++) {
                float a = x[j], b = x[j + len];
                x[j] = a + b;
                x[j + len] = a - b;
            }
    float norm = 1.0f / sqrtf((float)n);
    for (uint32_t i = 0; i < n; i++)
        x[i] *= norm;
    if (inverse) apply_signs(x, n, seed);
    return PGD_OK;
}
