/* SPDX-License-Identifier: MIT */
/*
 * budget.c - token budgets (include/pagoda/budget.h): method names, parameters and their
 * checks. (The per-method selection and the per-sequence state land with the methods.)
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "pgd_int.h"
#include "pagoda/budget.h"

static const char *const names[PGD_BUDGET_COUNT] = {
    "none", "streaming", "h2o", "tova", "snapkv", "pyramidkv", "adakv",
};

const char *pgd_budget_method_name(pgd_budget_method m)
{
    return (unsigned)m < PGD_BUDGET_COUNT ? names[m] : NULL;
}

int pgd_budget_method_parse(const char *name, pgd_budget_method *out)
{
    if (!name || !out) return PGD_EINVAL;
    for (int i = 0; i < PGD_BUDGET_COUNT; i++)
        if (!strcmp(name, names[i])) {
            *out = (pgd_budget_method)i;
            return PGD_OK;
        }
    return PGD_EINVAL;
}

pgd_budget_params pgd_budget_default_params(pgd_budget_method m, uint32_t budget)
{
    pgd_budget_params p;
    memset(&p, 0, sizeof p);
    p.method = m;
    p.budget = budget;
    p.obs_window = 32;
    p.pool_kernel = 5;
    p.pyramid_min = 0.5f;
    p.adakv_floor = 0.2f;
    p.adakv_cap = 2.0f;
    p.online = -1;
    switch (m) {
    case PGD_BUDGET_STREAMING:
        p.sinks = budget < 4 ? (budget ? budget - 1 : 0) : 4;
        p.window = budget - p.sinks;
        break;
    case PGD_BUDGET_H2O:
        p.window = budget / 2;
        break;
    case PGD_BUDGET_TOVA:
        p.window = budget ? 1 : 0;
        break;
    case PGD_BUDGET_SNAPKV:
    case PGD_BUDGET_PYRAMIDKV:
    case PGD_BUDGET_ADAKV:
        p.window = p.obs_window < budget ? p.obs_window : (budget ? budget - 1 : 0);
        break;
    default:
        break;
    }
    return p;
}

static int bad(char *why, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(char *why, size_t n, const char *fmt, ...)
{
    if (why && n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, n, fmt, ap);
        va_end(ap);
    }
    return PGD_EINVAL;
}

int pgd_budget_params_check(const pgd_budget_params *p, uint32_t n_layers, char *why,
                            size_t why_len)
{
    if (!p) return bad(why, why_len, "no budget parameters");
    if ((unsigned)p->method >= PGD_BUDGET_COUNT)
        return bad(why, why_len, "kv_budget_method %d: unknown", (int)p->method);
    if (p->method == PGD_BUDGET_NONE) return PGD_OK;
    if (p->budget < 1) return bad(why, why_len, "kv_budget %u: must be at least 1", p->budget);
    if (p->budget > (1u << 22))
        return bad(why, why_len, "kv_budget %u: at most %u tokens", p->budget, 1u << 22);
    if (!n_layers) return bad(why, why_len, "a model of 0 layers");
    if ((uint64_t)p->sinks + p->window >= p->budget)
        return bad(why, why_len,
                   "kv_budget %u: must exceed sinks (%u) + window (%u), the tokens every head "
                   "keeps",
                   p->budget, p->sinks, p->window);
    switch (p->method) {
    case PGD_BUDGET_SNAPKV:
    case PGD_BUDGET_PYRAMIDKV:
    case PGD_BUDGET_ADAKV:
        if (p->obs_window < 1)
            return bad(why, why_len, "obs_window %u: must be at least 1", p->obs_window);
        if (p->pool_kernel < 1 || p->pool_kernel % 2 == 0 || p->pool_kernel > 255)
            return bad(why, why_len, "pool_kernel %u: must be odd, 1 to 255", p->pool_kernel);
        break;
    default:
        break;
    }
    if (p->method == PGD_BUDGET_PYRAMIDKV && !(p->pyramid_min > 0.0f && p->pyramid_min <= 1.0f))
        return bad(why, why_len, "pyramid_min %g: must be in (0, 1]", (double)p->pyramid_min);
    if (p->method == PGD_BUDGET_ADAKV) {
        if (!(p->adakv_floor >= 0.0f && p->adakv_floor <= 1.0f))
            return bad(why, why_len, "adakv_floor %g: must be in [0, 1]", (double)p->adakv_floor);
        if (!(p->adakv_cap >= 1.0f && p->adakv_cap <= 64.0f))
            return bad(why, why_len, "adakv_cap %g: must be in [1, 64]", (double)p->adakv_cap);
    }
    if (p->online < -1 || p->online > 1)
        return bad(why, why_len, "online %d: must be -1, 0 or 1", p->online);
    return PGD_OK;
}

uint32_t pgd_budget_layer_budget(const pgd_budget_params *p, uint32_t layer, uint32_t n_layers)
{
    if (!p || p->method != PGD_BUDGET_PYRAMIDKV || n_layers < 2) return p ? p->budget : 0;
    const double top = p->pyramid_min * p->budget, bottom = (2.0 - p->pyramid_min) * p->budget;
    double b = bottom + (top - bottom) * (double)layer / (double)(n_layers - 1);
    uint32_t r = (uint32_t)lround(b), least = p->sinks + p->window + 1;
    return r < least ? least : r;
}

/* ---- placeholders until the methods land ---- */

int pgd_budget_select(const pgd_budget_params *p, uint32_t layer, uint32_t n_layers,
                      uint32_t n_kv_heads, uint64_t n_keys, const float *scores, size_t ld,
                      uint32_t *keep, uint32_t max_keep, uint32_t *n_keep)
{
    (void)p, (void)layer, (void)n_layers, (void)n_kv_heads, (void)n_keys, (void)scores, (void)ld;
    (void)keep, (void)max_keep, (void)n_keep;
    return PGD_ENOTSUP;
}

int pgd_budget_create(pgd_cache *c, const pgd_budget_params *p, pgd_budget **out)
{
    (void)c, (void)p;
    *out = NULL;
    return PGD_ENOTSUP;
}
void pgd_budget_destroy(pgd_budget *b)
{
    (void)b;
}
void pgd_budget_reset(pgd_budget *b)
{
    (void)b;
}
const pgd_budget_params *pgd_budget_get_params(const pgd_budget *b)
{
    (void)b;
    return NULL;
}
int pgd_budget_begin(pgd_budget *b, pgd_seq *s, uint32_t n_rows, uint64_t prompt_left)
{
    (void)b, (void)s, (void)n_rows, (void)prompt_left;
    return PGD_ENOTSUP;
}
float *pgd_budget_scores(pgd_budget *b, uint32_t layer)
{
    (void)b, (void)layer;
    return NULL;
}
size_t pgd_budget_score_ld(const pgd_budget *b)
{
    (void)b;
    return 0;
}
int64_t pgd_budget_end(pgd_budget *b, pgd_seq *s)
{
    (void)b, (void)s;
    return PGD_ENOTSUP;
}
int64_t pgd_budget_apply(pgd_budget *b, pgd_seq *s)
{
    (void)b, (void)s;
    return PGD_ENOTSUP;
}
void pgd_budget_get_stats(const pgd_budget *b, pgd_budget_stats *out)
{
    (void)b;
    memset(out, 0, sizeof *out);
}
