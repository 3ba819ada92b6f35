/* SPDX-License-Identifier: MIT */
/*
 * registry.c - the table of codecs: maps a pgd_kv_type to its ops table at the best ISA
 * level of this CPU (pgd__codec_get), to its scalar reference (pgd__codec_ref) or to a
 * given level (pgd__codec_at, tests and benchmarks), and checks a pool's geometry against
 * a codec. Callers: pool.c, cache.c, src/attn/, tests. Stateless but for the ISA level
 * (util/cpu.c).
 */
#include "codec_impl.h"

static const pgd__codec *const ref_tables[] = {
    &pgd__codec_f32_ref,  &pgd__codec_f16_ref,  &pgd__codec_bf16_ref,
    &pgd__codec_q8_0_ref, &pgd__codec_q4_0_ref, &pgd__codec_kivi2_ref,
};
#ifdef PGD__CODEC_X86
static const pgd__codec *const avx2_tables[] = {
    &pgd__codec_f32_avx2,  &pgd__codec_f16_avx2,  &pgd__codec_bf16_avx2,
    &pgd__codec_q8_0_avx2, &pgd__codec_q4_0_avx2, &pgd__codec_kivi2_avx2,
};
static const pgd__codec *const avx512_tables[] = {
    &pgd__codec_f32_avx512,  &pgd__codec_f16_avx512,  &pgd__codec_bf16_avx512,
    &pgd__codec_q8_0_avx512, &pgd__codec_q4_0_avx512, &pgd__codec_kivi2_avx512,
};
static const pgd__codec *const vnni_tables[] = {
    &pgd__codec_f32_avx512, &pgd__codec_f16_avx512, &pgd__codec_bf16_avx512,
    &pgd__codec_q8_0_vnni,  &pgd__codec_q4_0_vnni,  &pgd__codec_kivi2_vnni,
};
#endif
#define N_TYPES (sizeof ref_tables / sizeof ref_tables[0])

const pgd__codec *pgd__codec_at(pgd_kv_type type, int isa)
{
    if ((unsigned)type >= N_TYPES || isa < 0 || isa > pgd__cpu_isa()) return NULL;
#ifdef PGD__CODEC_X86
    if (isa == PGD__ISA_VNNI) return vnni_tables[type];
    if (isa == PGD__ISA_AVX512) return avx512_tables[type];
    if (isa == PGD__ISA_AVX2) return avx2_tables[type];
#endif
    return isa == PGD__ISA_SCALAR ? ref_tables[type] : NULL;
}

const pgd__codec *pgd__codec_get(pgd_kv_type type)
{
    return pgd__codec_at(type, pgd__cpu_isa());
}

const pgd__codec *pgd__codec_ref(pgd_kv_type type)
{
    return pgd__codec_at(type, PGD__ISA_SCALAR);
}

const char *pgd__codec_geometry_error(pgd_kv_type type, uint32_t page_tokens, uint32_t head_dim)
{
    if ((unsigned)type >= N_TYPES) return "is unknown";
    if (!page_tokens || !head_dim) return "needs non-zero page_tokens and head_dim";
    if (type == PGD_KV_Q8_0 || type == PGD_KV_Q4_0 || type == PGD_KV_KIVI2) {
        if (head_dim % 32 != 0 && 32 % head_dim != 0)
            return "needs head_dim a multiple of 32 or a divisor of 32";
        if (((uint64_t)page_tokens * head_dim) % 32 != 0)
            return "needs page_tokens x head_dim a multiple of 32";
    }
    /* Row and page sizes stay far below 2^32 elements, so size_t arithmetic cannot wrap. */
    if ((uint64_t)page_tokens * head_dim > (1ull << 31))
        return "needs page_tokens x head_dim at most 2^31";
    return NULL;
}

int pgd__codec_staged(const pgd__codec *codec, uint32_t head_dim)
{
    if (!codec->row_writable) return 1;
    return (codec->type == PGD_KV_Q8_0 || codec->type == PGD_KV_Q4_0) && head_dim < 32;
}

size_t pgd__codec_region_bytes(pgd_kv_type type, uint32_t page_tokens, uint32_t head_dim)
{
    if (pgd__codec_geometry_error(type, page_tokens, head_dim)) return 0;
    const pgd__codec *c = ref_tables[type];
    size_t k = c->region_bytes(PGD__K, page_tokens, head_dim);
    size_t v = c->region_bytes(PGD__V, page_tokens, head_dim);
    return pgd__round16(k > v ? k : v);
}
