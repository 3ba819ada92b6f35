/* SPDX-License-Identifier: MIT */
/*
 * policy.c - names and lookup of the built-in eviction policies (ops table: policy.h).
 * Adding a built-in policy: one file with its ops table, one enum value in policy.h, one
 * line here. A user policy needs none of this: pgd_cache_params.policy_ops.
 */
#include <string.h>

#include "pgd_int.h"

static const struct {
    pgd_policy_kind kind;
    const char *name;
    const pgd_policy_ops *ops;
} policies[] = {
    {PGD_POLICY_LRU, "lru", &pgd__policy_lru},
    {PGD_POLICY_BELADY, "belady", &pgd__policy_belady},
    {PGD_POLICY_S3FIFO, "s3fifo", &pgd__policy_s3fifo},
    {PGD_POLICY_ARC, "arc", &pgd__policy_arc},
    {PGD_POLICY_COST, "cost", &pgd__policy_cost},
    {PGD_POLICY_PRIORITY, "priority", &pgd__policy_priority},
};

const pgd_policy_ops *pgd_policy_builtin(pgd_policy_kind kind)
{
    for (size_t i = 0; i < sizeof policies / sizeof policies[0]; i++)
        if (policies[i].kind == kind) return policies[i].ops;
    return NULL;
}

const char *pgd_policy_name(pgd_policy_kind kind)
{
    for (size_t i = 0; i < sizeof policies / sizeof policies[0]; i++)
        if (policies[i].kind == kind) return policies[i].name;
    return "?";
}

int pgd_policy_from_name(const char *name, pgd_policy_kind *out)
{
    for (size_t i = 0; name && i < sizeof policies / sizeof policies[0]; i++) {
        if (strcmp(policies[i].name, name) == 0) {
            *out = policies[i].kind;
            return PGD_OK;
        }
    }
    return PGD_EINVAL;
}

void pgd_cost_model_default(pgd_cost_model *m, uint32_t n_layers, uint32_t n_kv_heads,
                            uint32_t head_dim)
{
    double width = (double)n_kv_heads * head_dim;
    if (!(m->attn_flops_per_pos > 0)) m->attn_flops_per_pos = 4.0 * n_layers * width;
    if (!(m->linear_flops_per_token > 0))
        m->linear_flops_per_token = 24.0 * n_layers * width * width;
}

double pgd_cost_model_page(const pgd_cost_model *m, uint32_t page_tokens, uint32_t depth)
{
    double t = page_tokens;
    return t * m->linear_flops_per_token +
           m->attn_flops_per_pos * t * ((double)depth * t + (t + 1.0) / 2.0);
}
