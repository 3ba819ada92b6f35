/* SPDX-License-Identifier: MIT */
/*
 * budget.c - token budgets (include/pagoda/budget.h): method names, parameters and their
 * checks, the methods' ops table and the selection helpers they share (budget_int.h), the
 * selection entry point, and the per-sequence state the engine drives around each step.
 *
 * Callers: the engine's forward step and scheduler (begin / scores / end), pagoda eval
 * (apply), tests (select). The methods live one per file beside this one.
 *
 * Per-sequence state: scores [n_layers][n_kv_heads][ld] floats, slot-indexed, ld >= the
 * sequence's length + the step's rows (grown geometrically at begin, data moved to the new
 * ld). Invariant: every score at a slot >= the sequence's length is 0 (new slots start at
 * 0; a compaction moves the kept slots' scores down and zeroes the rest).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "budget_int.h"
#include "pgd_int.h"
#include "pagoda/budget.h"
#include "pagoda/pool.h"

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
    if ((uint64_t)p->sinks + p->window > p->budget)
        return bad(why, why_len,
                   "kv_budget %u: must be at least sinks (%u) + window (%u), the tokens every "
                   "head keeps",
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

/* ---- the ops table ---- */

static const pgd__budget_ops *const ops_table[PGD_BUDGET_COUNT] = {
    NULL,
    &pgd__budget_streaming,
    &pgd__budget_h2o,
    &pgd__budget_tova,
    &pgd__budget_snapkv,
    &pgd__budget_pyramidkv,
    &pgd__budget_adakv,
};

const pgd__budget_ops *pgd__budget_ops_get(pgd_budget_method m)
{
    return (unsigned)m < PGD_BUDGET_COUNT ? ops_table[m] : NULL;
}

uint32_t pgd__budget_head_max(const pgd_budget_params *p, uint32_t budget)
{
    if (p->method != PGD_BUDGET_ADAKV) return budget;
    double cap = floor((double)p->adakv_cap * budget);
    if (cap > (double)UINT32_MAX) cap = (double)UINT32_MAX;
    return cap < budget ? budget : (uint32_t)cap;
}

/* ---- selection helpers ---- */

void pgd__budget_view_get(const pgd__budget_sel *sel, uint32_t h, pgd__budget_view *v)
{
    v->sc = sel->scores ? sel->scores + (size_t)h * sel->ld : NULL;
    v->nl = sel->n_keys;
    v->gap = 0;
    if (sel->n_live && sel->mask_len) {
        uint32_t end = sel->mask_len < sel->n_keys ? sel->mask_len : sel->n_keys;
        uint32_t nl = sel->n_live[h] < end ? sel->n_live[h] : end;
        v->nl = nl;
        v->gap = end - nl;
    }
    v->m = sel->n_keys - v->gap;
}

static uint32_t view_slot(const pgd__budget_view *v, uint32_t i)
{
    return i < v->nl ? i : i + v->gap;
}

void pgd__budget_scratch_deinit(pgd__budget_scratch *scr)
{
    pgd__free(scr->al, scr->dense);
    pgd__free(scr->al, scr->pooled);
    pgd__free(scr->al, scr->dq);
    pgd__free(scr->al, scr->ents);
    pgd__free(scr->al, scr->picks);
    scr->dense = scr->pooled = NULL;
    scr->dq = scr->picks = NULL;
    scr->ents = NULL;
    scr->cap = scr->n_ents = scr->n_picks = 0;
}

int pgd__budget_scratch_reserve(pgd__budget_scratch *scr, size_t n, size_t n_ents, size_t n_picks)
{
    if (n > scr->cap) {
        float *d = pgd__calloc(scr->al, n, sizeof *d), *q = pgd__calloc(scr->al, n, sizeof *q);
        uint32_t *dq = pgd__calloc(scr->al, n, sizeof *dq);
        if (!d || !q || !dq) {
            pgd__free(scr->al, d);
            pgd__free(scr->al, q);
            pgd__free(scr->al, dq);
            return PGD_ENOMEM;
        }
        pgd__free(scr->al, scr->dense);
        pgd__free(scr->al, scr->pooled);
        pgd__free(scr->al, scr->dq);
        scr->dense = d;
        scr->pooled = q;
        scr->dq = dq;
        scr->cap = n;
    }
    if (n_ents > scr->n_ents) {
        pgd__budget_ent *e = pgd__calloc(scr->al, n_ents, sizeof *e);
        if (!e) return PGD_ENOMEM;
        pgd__free(scr->al, scr->ents);
        scr->ents = e;
        scr->n_ents = n_ents;
    }
    if (n_picks > scr->n_picks) {
        uint32_t *u = pgd__calloc(scr->al, n_picks, sizeof *u);
        if (!u) return PGD_ENOMEM;
        pgd__free(scr->al, scr->picks);
        scr->picks = u;
        scr->n_picks = n_picks;
    }
    return PGD_OK;
}

void pgd__budget_gather(pgd__budget_scratch *scr, const pgd__budget_view *v)
{
    for (uint32_t i = 0; i < v->m; i++) {
        float x = v->sc ? v->sc[view_slot(v, i)] : 0.0f;
        scr->dense[i] = isnan(x) ? -INFINITY : x;
    }
}

void pgd__budget_pool(const float *in, uint32_t n, uint32_t kernel, uint32_t *dq, float *out)
{
    const uint32_t r = kernel / 2;
    uint32_t head = 0, tail = 0, next = 0;
    if (r == 0) {
        memcpy(out, in, (size_t)n * sizeof *out);
        return;
    }
    for (uint32_t j = 0; j < n; j++) {
        uint32_t hi = (uint64_t)j + r < n ? j + r : n - 1;
        for (; next <= hi; next++) {
            while (tail > head && in[dq[tail - 1]] <= in[next])
                tail--;
            dq[tail++] = next;
        }
        while (dq[head] + r < j)
            head++;
        out[j] = in[dq[head]];
    }
}

/* a ranks below b: lower score, lower raw score, then the newer token, the higher head. */
static int worse(const pgd__budget_ent *a, const pgd__budget_ent *b)
{
    if (a->s != b->s) return a->s < b->s;
    if (a->r != b->r) return a->r < b->r;
    if (a->i != b->i) return a->i > b->i;
    return a->h > b->h;
}

/* Ranks a below b; inverted: a above b. */
static int below(const pgd__budget_ent *a, const pgd__budget_ent *b, int inv)
{
    return inv ? worse(b, a) : worse(a, b);
}

/* Min-heap on rank (the root is the worst kept); inverted, a max-heap (the root is the best
 * of the kept worst). */
static void sift_down(pgd__budget_ent *e, uint32_t n, uint32_t i, int inv)
{
    for (;;) {
        uint32_t l = 2 * i + 1, w = i;
        if (l < n && below(&e[l], &e[w], inv)) w = l;
        if (l + 1 < n && below(&e[l + 1], &e[w], inv)) w = l + 1;
        if (w == i) return;
        pgd__budget_ent t = e[i];
        e[i] = e[w];
        e[w] = t;
        i = w;
    }
}

/* The k best (inv: worst) of s[lo, hi) into ents[0..k) in heap order. */
static void heap_select(const float *s, const float *raw, uint32_t lo, uint32_t hi, uint32_t k,
                        uint32_t head, int inv, pgd__budget_ent *ents)
{
    uint32_t n = 0;
    for (uint32_t i = lo; i < hi; i++) {
        pgd__budget_ent e = {s[i], raw ? raw[i] : s[i], i, head};
        if (n < k) {
            ents[n++] = e;
            if (n == k)
                for (uint32_t j = k / 2; j-- > 0;)
                    sift_down(ents, k, j, inv);
        } else if (below(&ents[0], &e, inv)) {
            ents[0] = e;
            sift_down(ents, k, 0, inv);
        }
    }
}

void pgd__budget_top(const float *s, const float *raw, uint32_t lo, uint32_t hi, uint32_t k,
                     uint32_t head, int ranked, pgd__budget_ent *ents)
{
    if (!k) return;
    heap_select(s, raw, lo, hi, k, head, 0, ents);
    /* Heapsort: the worst goes last, so the array ends best first. */
    for (uint32_t m = ranked ? k : 0; m > 1; m--) {
        pgd__budget_ent t = ents[0];
        ents[0] = ents[m - 1];
        ents[m - 1] = t;
        sift_down(ents, m - 1, 0, 0);
    }
}

uint32_t pgd__budget_top_ascending(const float *s, const float *raw, uint32_t lo, uint32_t hi,
                                   uint32_t k, uint32_t *mark, pgd__budget_ent *ents,
                                   uint32_t *picks)
{
    const uint32_t c = hi - lo;
    uint32_t n = 0;
    if (!k) return 0;
    if (k <= c / 2) {
        heap_select(s, raw, lo, hi, k, 0, 0, ents);
        for (uint32_t j = 0; j < k; j++)
            picks[j] = ents[j].i;
        pgd__budget_sort_u32(picks, k);
        return k;
    }
    /* Most candidates stay (an online budget: a page more than the budget): find the
     * c - k worst instead, and the rest come out in index order. */
    const uint32_t d = c - k;
    heap_select(s, raw, lo, hi, d, 0, 1, ents);
    memset(mark + lo, 0, (size_t)c * sizeof *mark);
    for (uint32_t j = 0; j < d; j++)
        mark[ents[j].i] = 1;
    for (uint32_t i = lo; i < hi; i++)
        if (!mark[i]) picks[n++] = i;
    return n;
}

static int ent_cmp(const void *a, const void *b)
{
    const pgd__budget_ent *x = a, *y = b;
    if (worse(x, y)) return 1;
    if (worse(y, x)) return -1;
    return 0;
}

void pgd__budget_rank(pgd__budget_ent *ents, size_t n)
{
    if (n > 1) qsort(ents, n, sizeof *ents, ent_cmp);
}

static int u32_cmp(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

void pgd__budget_sort_u32(uint32_t *u, size_t n)
{
    if (n > 1) qsort(u, n, sizeof *u, u32_cmp);
}

uint32_t pgd__budget_emit(const pgd__budget_view *v, uint32_t sinks, const uint32_t *picks,
                          uint32_t n_picks, uint32_t window, uint32_t *out)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < sinks; i++)
        out[n++] = view_slot(v, i);
    for (uint32_t j = 0; j < n_picks; j++)
        out[n++] = view_slot(v, picks[j]);
    for (uint32_t i = v->m - window; i < v->m; i++)
        out[n++] = view_slot(v, i);
    return n;
}

uint32_t pgd__budget_emit_all(const pgd__budget_view *v, uint32_t *out)
{
    for (uint32_t i = 0; i < v->m; i++)
        out[i] = view_slot(v, i);
    return v->m;
}

int pgd__budget_select_uniform(const pgd__budget_sel *sel, int pooled)
{
    const pgd_budget_params *p = sel->p;
    const uint32_t B = sel->budget, S = p->sinks, W = p->window;
    const uint32_t k = B - S - W;
    pgd__budget_scratch *scr = sel->scr;
    int rc = pgd__budget_scratch_reserve(scr, sel->n_keys, k, k);
    if (rc != PGD_OK) return rc;
    for (uint32_t h = 0; h < sel->n_kv_heads; h++) {
        pgd__budget_view v;
        uint32_t *out = sel->keep + (size_t)h * sel->max_keep;
        pgd__budget_view_get(sel, h, &v);
        if (v.m <= B) {
            sel->n_keep[h] = pgd__budget_emit_all(&v, out);
            continue;
        }
        const float *s = scr->dense;
        pgd__budget_gather(scr, &v);
        if (pooled) {
            pgd__budget_pool(scr->dense, v.m - W, p->pool_kernel, scr->dq, scr->pooled);
            s = scr->pooled;
        }
        uint32_t np = pgd__budget_top_ascending(s, pooled ? scr->dense : NULL, S, v.m - W, k,
                                                scr->dq, scr->ents, scr->picks);
        sel->n_keep[h] = pgd__budget_emit(&v, S, scr->picks, np, W, out);
    }
    return PGD_OK;
}

/* ---- selection ---- */

/* One layer, with an optional dead-slot mask; the state's scratch. */
static int select_layer(const pgd_budget_params *p, uint32_t layer, uint32_t n_layers,
                        uint32_t n_kv_heads, uint32_t n_keys, const float *scores, size_t ld,
                        uint32_t mask_len, const uint32_t *n_live, uint32_t *keep,
                        uint32_t max_keep, uint32_t *n_keep, pgd__budget_scratch *scr)
{
    const pgd__budget_ops *ops = pgd__budget_ops_get(p->method);
    if (!ops) return PGD_EINVAL;
    pgd__budget_sel sel = {
        .p = p,
        .budget = pgd_budget_layer_budget(p, layer, n_layers),
        .n_kv_heads = n_kv_heads,
        .n_keys = n_keys,
        .scores = scores,
        .ld = ld,
        .mask_len = mask_len,
        .n_live = n_live,
        .keep = keep,
        .max_keep = max_keep,
        .n_keep = n_keep,
        .scr = scr,
    };
    int rc = ops->select(&sel);
    if (rc != PGD_OK) return rc;
    uint32_t most = 0;
    for (uint32_t h = 0; h < n_kv_heads; h++)
        if (n_keep[h] > most) most = n_keep[h];
    return (int)most;
}

int pgd_budget_select(const pgd_budget_params *p, uint32_t layer, uint32_t n_layers,
                      uint32_t n_kv_heads, uint64_t n_keys, const float *scores, size_t ld,
                      uint32_t *keep, uint32_t max_keep, uint32_t *n_keep)
{
    if (pgd_budget_params_check(p, n_layers, NULL, 0) != PGD_OK) return PGD_EINVAL;
    if (p->method == PGD_BUDGET_NONE || layer >= n_layers || !n_kv_heads || !keep || !n_keep)
        return PGD_EINVAL;
    if (n_keys > INT32_MAX) return PGD_EINVAL;
    if (p->method != PGD_BUDGET_STREAMING && (!scores || ld < n_keys)) return PGD_EINVAL;
    uint32_t need = pgd__budget_head_max(p, pgd_budget_layer_budget(p, layer, n_layers));
    if (max_keep < (n_keys < need ? n_keys : need)) return PGD_EINVAL;
    pgd__alloc al;
    pgd__alloc_init(&al, NULL);
    pgd__budget_scratch scr = {.al = &al};
    int rc = select_layer(p, layer, n_layers, n_kv_heads, (uint32_t)n_keys, scores, ld, 0, NULL,
                          keep, max_keep, n_keep, &scr);
    pgd__budget_scratch_deinit(&scr);
    return rc;
}

/* ---- per-sequence state ---- */

struct pgd_budget {
    pgd_cache *c;
    const pgd__alloc *al;
    pgd_budget_params p;
    const pgd__budget_ops *ops;
    int online;
    uint32_t n_layers, n_kv, page_tokens;
    uint32_t due_slots; /* online: compact at >= due_slots + page_tokens slots */
    float *scores;      /* [n_layers][n_kv][ld] */
    size_t ld;
    int ends_prompt; /* the step begun ends the prompt */
    pgd__budget_scratch scr;
    uint32_t *keep;   /* [n_layers * n_kv][keep_ld] */
    size_t keep_cap;  /* uint32s at keep */
    uint32_t *n_keep; /* [n_layers * n_kv] */
    pgd_budget_stats stats;
};

int pgd_budget_create(pgd_cache *c, const pgd_budget_params *p, pgd_budget **out)
{
    if (out) *out = NULL;
    if (!c || !p || !out) return PGD_EINVAL;
    pgd__pool_geom g;
    pgd__pool_geom_get(pgd_cache_pool(c), &g);
    if (pgd_budget_params_check(p, g.n_layers, NULL, 0) != PGD_OK) return PGD_EINVAL;
    const pgd__alloc *al = pgd__cache_alloc(c);
    pgd_budget *b = pgd__calloc(al, 1, sizeof *b);
    if (!b) return PGD_ENOMEM;
    b->c = c;
    b->al = al;
    b->p = *p;
    b->ops = pgd__budget_ops_get(p->method);
    b->online = p->online >= 0 ? p->online : (b->ops ? b->ops->online : 0);
    b->n_layers = g.n_layers;
    b->n_kv = g.n_kv_heads;
    b->page_tokens = g.page_tokens;
    b->scr.al = al;
    for (uint32_t l = 0; l < g.n_layers; l++) {
        uint32_t m = pgd__budget_head_max(p, pgd_budget_layer_budget(p, l, g.n_layers));
        if (m > b->due_slots) b->due_slots = m;
    }
    b->n_keep = pgd__calloc(al, (size_t)g.n_layers * g.n_kv_heads, sizeof *b->n_keep);
    if (!b->n_keep) {
        pgd_budget_destroy(b);
        return PGD_ENOMEM;
    }
    *out = b;
    return PGD_OK;
}

void pgd_budget_destroy(pgd_budget *b)
{
    if (!b) return;
    const pgd__alloc *al = b->al;
    pgd__budget_scratch_deinit(&b->scr);
    pgd__free(al, b->scores);
    pgd__free(al, b->keep);
    pgd__free(al, b->n_keep);
    pgd__free(al, b);
}

void pgd_budget_reset(pgd_budget *b)
{
    if (!b) return;
    if (b->scores) memset(b->scores, 0, (size_t)b->n_layers * b->n_kv * b->ld * sizeof(float));
    b->ends_prompt = 0;
}

const pgd_budget_params *pgd_budget_get_params(const pgd_budget *b)
{
    return b ? &b->p : NULL;
}

/* Makes the score buffers cover n slots (ld >= n), moving the data. */
static int ensure_ld(pgd_budget *b, uint64_t n)
{
    if (!b->ops || b->ops->feed == PGD__FEED_NONE || n <= b->ld) return PGD_OK;
    size_t ld = b->ld ? b->ld : 64;
    while (ld < n)
        ld *= 2;
    const size_t rows = (size_t)b->n_layers * b->n_kv;
    float *s = pgd__calloc(b->al, rows * ld, sizeof *s);
    if (!s) return PGD_ENOMEM;
    for (size_t r = 0; b->scores && r < rows; r++)
        memcpy(s + r * ld, b->scores + r * b->ld, b->ld * sizeof *s);
    pgd__free(b->al, b->scores);
    b->scores = s;
    b->ld = ld;
    return PGD_OK;
}

int pgd_budget_begin(pgd_budget *b, pgd_seq *s, uint32_t n_rows, uint64_t prompt_left)
{
    if (!b || !s) return PGD_EINVAL;
    b->ends_prompt = n_rows > 0 && prompt_left == n_rows;
    if (!b->ops || b->ops->feed == PGD__FEED_NONE || !n_rows) return 0;
    uint64_t len = pgd_seq_length(b->c, s);
    int rc = ensure_ld(b, len + n_rows);
    if (rc != PGD_OK) return rc;
    switch (b->ops->feed) {
    case PGD__FEED_ALL:
        return (int)n_rows;
    case PGD__FEED_LAST:
        /* Slots past the length are 0 already (the invariant): zero what the last step
         * wrote, not the whole buffer (ld may be the prompt's length, the length a budget). */
        for (size_t r = 0; r < (size_t)b->n_layers * b->n_kv; r++)
            memset(b->scores + r * b->ld, 0, (size_t)(len + n_rows) * sizeof(float));
        return 1;
    case PGD__FEED_OBS: {
        if (!prompt_left) return 0;
        uint64_t after = prompt_left > n_rows ? prompt_left - n_rows : 0;
        if (after >= b->p.obs_window) return 0;
        uint64_t r = b->p.obs_window - after;
        return (int)(r < n_rows ? r : n_rows);
    }
    default:
        return 0;
    }
}

float *pgd_budget_scores(pgd_budget *b, uint32_t layer)
{
    if (!b || !b->scores || layer >= b->n_layers) return NULL;
    return b->scores + (size_t)layer * b->n_kv * b->ld;
}

size_t pgd_budget_score_ld(const pgd_budget *b)
{
    return b ? b->ld : 0;
}

int64_t pgd_budget_end(pgd_budget *b, pgd_seq *s)
{
    if (!b || !s) return PGD_EINVAL;
    int ends = b->ends_prompt;
    b->ends_prompt = 0;
    if (!b->ops) return 0;
    uint64_t len = pgd_seq_length(b->c, s);
    int due = b->online ? len >= (uint64_t)b->due_slots + b->page_tokens : ends;
    return due ? pgd_budget_apply(b, s) : 0;
}

int64_t pgd_budget_apply(pgd_budget *b, pgd_seq *s)
{
    if (!b || !s) return PGD_EINVAL;
    if (!b->ops) return 0;
    const uint64_t len = pgd_seq_length(b->c, s);
    if (len > INT32_MAX) return PGD_EINVAL;
    uint32_t mask_len = 0;
    const uint32_t *n_live = NULL;
    pgd__seq_mask(s, &mask_len, &n_live);
    /* Shorter than every layer's budget and no dead slots: nothing to drop. */
    uint32_t least = UINT32_MAX;
    for (uint32_t l = 0; l < b->n_layers; l++) {
        uint32_t lb = pgd_budget_layer_budget(&b->p, l, b->n_layers);
        if (lb < least) least = lb;
    }
    if (len <= least) return 0;
    int rc = ensure_ld(b, len);
    if (rc != PGD_OK) return rc;
    const size_t rows = (size_t)b->n_layers * b->n_kv;
    const uint32_t kld = b->due_slots < len ? b->due_slots : (uint32_t)len;
    if (rows * kld > b->keep_cap) {
        uint32_t *k = pgd__calloc(b->al, rows * kld, sizeof *k);
        if (!k) return PGD_ENOMEM;
        pgd__free(b->al, b->keep);
        b->keep = k;
        b->keep_cap = rows * kld;
    }
    uint32_t n_out = 0;
    int change = 0;
    for (uint32_t l = 0; l < b->n_layers; l++) {
        const size_t r0 = (size_t)l * b->n_kv;
        rc = select_layer(&b->p, l, b->n_layers, b->n_kv, (uint32_t)len,
                          b->scores ? b->scores + r0 * b->ld : NULL, b->ld, mask_len,
                          n_live ? n_live + r0 : NULL, b->keep + r0 * kld, kld, b->n_keep + r0,
                          &b->scr);
        if (rc < 0) return rc;
        if ((uint32_t)rc > n_out) n_out = (uint32_t)rc;
        for (uint32_t h = 0; h < b->n_kv; h++) {
            pgd__budget_sel one = {.n_keys = (uint32_t)len,
                                   .mask_len = mask_len,
                                   .n_live = n_live ? n_live + r0 : NULL};
            pgd__budget_view v;
            pgd__budget_view_get(&one, h, &v);
            if (b->n_keep[r0 + h] != v.m) change = 1;
        }
    }
    if (!change) return 0;
    rc = pgd_seq_compact(b->c, s, n_out, b->keep, kld, b->n_keep);
    if (rc < 0) return rc;
    for (size_t r = 0; b->scores && r < rows; r++) {
        float *sc = b->scores + r * b->ld;
        const uint32_t *k = b->keep + r * kld;
        for (uint32_t j = 0; j < b->n_keep[r]; j++)
            sc[j] = sc[k[j]];
        memset(sc + b->n_keep[r], 0, (len - b->n_keep[r]) * sizeof *sc);
    }
    b->stats.compactions++;
    b->stats.dropped_tokens += len - n_out;
    b->stats.freed_pages += (uint64_t)rc;
    b->stats.max_keep = n_out;
    return (int64_t)(len - n_out);
}

void pgd_budget_get_stats(const pgd_budget *b, pgd_budget_stats *out)
{
    if (!out) return;
    if (b)
        *out = b->stats;
    else
        memset(out, 0, sizeof *out);
}
