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
