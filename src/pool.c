/* SPDX-License-Identifier: MIT */
/*
 * pool.c - paged KV pool. A page holds K and V for page_tokens tokens of every layer:
 *
 *     page payload = [layer][K|V][kv_head] region       (region: the codec's layout of
 *                                                       page_tokens rows of head_dim values,
 *                                                       pgd__codec_region_bytes bytes, a
 *                                                       multiple of 16)
 *     arena:  | page 0 | page 1 | ... | page n-1 |    one allocation, 64-byte aligned, or
 *                                                    the caller's (params.arena, host or
 *                                                    device memory: see layout.h)
 *     meta:   ref[n]  next_free[n]                   host arrays, apart from the arena
 *     bounds: [n][n_layers][n_kv_heads][min|max][head_dim] f32 (key_bounds only)
 *
 * Payload bytes are touched here only by copy-on-write (memcpy, or params.copy_page, the
 * only way for a device arena); the published byte layout is include/pagoda/layout.h.
 * Callers: cache.c (under the cache lock) and tests. Not locked itself (see pool.h).
 * Invariant: a page is either free (ref == 0, on the free list exactly once) or live
 * (ref > 0, on no list). n_free counts the free list.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "pgd_int.h"

/* Asks for transparent huge pages over the arena's whole 2 MiB chunks. Attention walks
 * regions that lie a page apart (tens of KiB), so with 4 KiB pages nearly every region
 * read is a TLB miss; where THP is opt-in ("madvise" mode) this advice took 32k-token
 * decode attention from 6.9 to 8.3 GB/s (bench_attn --hugepages). Failure is harmless. */
static void advise_huge(void *p, size_t n)
{
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const uintptr_t huge = (uintptr_t)2 << 20;
    uintptr_t a = ((uintptr_t)p + huge - 1) & ~(huge - 1), e = ((uintptr_t)p + n) & ~(huge - 1);
    if (e > a) (void)madvise((void *)a, e - a, MADV_HUGEPAGE);
#else
    (void)p;
    (void)n;
#endif
}

struct pgd_pool {
    pgd__alloc al;
    pgd__log log;
    uint32_t n_layers, n_kv_heads, head_dim, page_tokens;
    pgd_kv_type kv_type;
    const pgd__codec *codec;
    uint64_t head_bytes; /* region bytes: pgd__codec_region_bytes(kv_type, ...) */
    uint64_t page_bytes; /* 2 * n_layers * n_kv_heads * head_bytes */
    int kv_rotate;
    uint64_t rotate_seed;
    float *bounds;          /* [n_pages][n_layers][n_kv_heads][2][head_dim], or NULL */
    size_t bounds_per_page; /* floats per page in bounds */
    uint32_t n_pages;
    uint32_t n_free;
    uint32_t free_head;         /* first free page, PGD__NONE if none */
    uint32_t *ref;              /* [n_pages] refcounts */
    uint32_t *next_free;        /* [n_pages] free-list links */
    void *arena_raw;            /* as allocated, NULL when the arena is the caller's */
    uint8_t *arena;             /* 64-byte aligned start of page 0 (own or params.arena) */
    int arena_device;           /* the caller's arena is device memory: never dereferenced here */
    pgd_copy_page_fn copy_page; /* params.copy_page, NULL: memcpy */
    void *copy_ud;
    uint64_t n_cow_copies;
};

static const char *const kv_names[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "kivi2"};

const char *pgd_kv_type_name(pgd_kv_type t)
{
    if ((unsigned)t < sizeof kv_names / sizeof kv_names[0]) return kv_names[t];
    return "?";
}

int pgd_kv_type_parse(const char *name, pgd_kv_type *out)
{
    if (!name) return PGD_EINVAL;
    for (unsigned i = 0; i < sizeof kv_names / sizeof kv_names[0]; i++)
        if (strcmp(name, kv_names[i]) == 0) {
            *out = (pgd_kv_type)i;
            return PGD_OK;
        }
    return PGD_EINVAL;
}

size_t pgd_kv_type_size(pgd_kv_type t)
{
    switch (t) {
    case PGD_KV_F32:
        return 4;
    case PGD_KV_F16:
    case PGD_KV_BF16:
        return 2;
    default:
        return 0;
    }
}

double pgd_kv_bytes_per_token(pgd_kv_type t, uint32_t page_tokens, uint32_t n_layers,
                              uint32_t n_kv_heads, uint32_t head_dim)
{
    size_t region = pgd__codec_region_bytes(t, page_tokens, head_dim);
    if (!region) return 0;
    return (double)region * 2.0 * n_layers * n_kv_heads / page_tokens;
}

pgd_pool_params pgd_pool_default_params(void)
{
    pgd_pool_params p;
    memset(&p, 0, sizeof p);
    p.n_layers = 1;
    p.n_kv_heads = 1;
    p.head_dim = 64;
    p.page_tokens = PGD_DEFAULT_PAGE_TOKENS;
    p.kv_type = PGD_KV_F16;
    p.capacity_bytes = 64u << 20;
    return p;
}

/* ---- validation ---- */

/* What pgd_pool_create derives from valid params. */
typedef struct pool_plan {
    const pgd__codec *codec;
    uint64_t head_bytes;      /* region bytes */
    uint64_t page_bytes;      /* 2 * n_layers * n_kv_heads * head_bytes */
    uint64_t n_pages;         /* 1 .. 2^31 */
    uint64_t bounds_per_page; /* floats of key bounds per page, 0 when off */
} pool_plan;

/* Writes a one-line reason to why (why_len bytes, may be 0) and returns PGD_EINVAL. */
static int refuse(char *why, size_t why_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int refuse(char *why, size_t why_len, const char *fmt, ...)
{
    if (why && why_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, why_len, fmt, ap);
        va_end(ap);
    }
    return PGD_EINVAL;
}

/* Checks p in the order the reasons matter to a user (a model's head_dim first, then
 * capacity) and derives the geometry. Returns PGD_OK (why = "") or PGD_EINVAL (why set). */
static int plan_pool(const pgd_pool_params *p, pool_plan *pl, char *why, size_t why_len)
{
    if (why && why_len) why[0] = 0;
    if (!p) return refuse(why, why_len, "no params");
    if (!p->n_layers || !p->n_kv_heads || !p->head_dim)
        return refuse(why, why_len, "zero dimension (n_layers %u, n_kv_heads %u, head_dim %u)",
                      p->n_layers, p->n_kv_heads, p->head_dim);
    pl->codec = pgd__codec_get(p->kv_type);
    if (!pl->codec) return refuse(why, why_len, "unknown kv type %d", (int)p->kv_type);
    if (!p->page_tokens || (p->page_tokens & (p->page_tokens - 1)))
        return refuse(why, why_len, "page_tokens %u is not a power of two", p->page_tokens);
    if (p->kv_rotate && (p->head_dim & (p->head_dim - 1)))
        return refuse(why, why_len, "kv_rotate needs head_dim a power of two (head_dim is %u)",
                      p->head_dim);
    const char *g = pgd__codec_geometry_error(p->kv_type, p->page_tokens, p->head_dim);
    if (g)
        return refuse(why, why_len, "kv type %s %s (page_tokens %u, head_dim %u)",
                      pgd_kv_type_name(p->kv_type), g, p->page_tokens, p->head_dim);
    /* Overflow-checked geometry: every factor is < 2^32, so check step by step. */
    pl->head_bytes = pgd__codec_region_bytes(p->kv_type, p->page_tokens, p->head_dim);
    uint64_t per_layer = 2ull * p->n_kv_heads;
    if (!pl->head_bytes || pl->head_bytes > UINT64_MAX / per_layer / p->n_layers)
        return refuse(why, why_len, "page size overflows");
    pl->page_bytes = pl->head_bytes * per_layer * p->n_layers;
    if (p->arena) {
        if (p->metadata_only) return refuse(why, why_len, "metadata_only with an arena");
        if ((uintptr_t)p->arena % 64) return refuse(why, why_len, "arena is not 64-byte aligned");
        if (p->arena_bytes < pl->page_bytes)
            return refuse(why, why_len, "arena of %llu bytes is below one page of %llu bytes",
                          (unsigned long long)p->arena_bytes, (unsigned long long)pl->page_bytes);
        if (p->arena_device && !p->copy_page)
            return refuse(why, why_len, "a device arena needs copy_page");
        if (p->arena_device && p->key_bounds)
            return refuse(why, why_len,
                          "key_bounds needs a host arena (bounds are computed "
                          "on the host by pgd_seq_write_kv)");
        pl->n_pages = p->capacity_pages ? p->capacity_pages : p->arena_bytes / pl->page_bytes;
        if (pl->n_pages > p->arena_bytes / pl->page_bytes)
            return refuse(why, why_len,
                          "arena of %llu bytes is below capacity_pages %u x %llu bytes",
                          (unsigned long long)p->arena_bytes, p->capacity_pages,
                          (unsigned long long)pl->page_bytes);
    } else {
        if (p->arena_bytes || p->arena_device)
            return refuse(why, why_len, "arena_bytes or arena_device without an arena");
        pl->n_pages = p->capacity_pages ? p->capacity_pages : p->capacity_bytes / pl->page_bytes;
    }
    if (pl->n_pages == 0 || pl->n_pages > (1u << 31))
        return refuse(why, why_len, "capacity of %llu pages is out of range (1 .. 2^31)",
                      (unsigned long long)pl->n_pages);
    if (!p->metadata_only && !p->arena && pl->page_bytes > (SIZE_MAX - 64) / pl->n_pages)
        return refuse(why, why_len, "arena size overflows");
    pl->bounds_per_page = p->key_bounds ? 2ull * p->head_dim * p->n_kv_heads * p->n_layers : 0;
    if (pl->bounds_per_page && pl->bounds_per_page > SIZE_MAX / sizeof(float) / pl->n_pages)
        return refuse(why, why_len, "key bounds size overflows");
    return PGD_OK;
}

int pgd_pool_params_check(const pgd_pool_params *p, char *why, size_t why_len)
{
    pool_plan pl;
    return plan_pool(p, &pl, why, why_len);
}

/* ---- create / destroy ---- */

int pgd_pool_create(const pgd_pool_params *p, pgd_pool **out)
{
    pgd__alloc al;
    pgd__log lg = {p ? p->log : NULL, p ? p->log_ud : NULL};
    pgd_pool *pool = NULL;
    pool_plan pl;
    char why[160];

    *out = NULL;
    int rc = plan_pool(p, &pl, why, sizeof why);
    if (rc != PGD_OK) {
        pgd__logf(&lg, PGD_LOG_ERROR, "pool: %s", why);
        return rc;
    }
    pgd__alloc_init(&al, p->alloc);
    uint64_t n_pages = pl.n_pages, page_bytes = pl.page_bytes;

    rc = PGD_ENOMEM;
    pool = pgd__calloc(&al, 1, sizeof *pool);
    if (!pool) goto fail;
    pool->al = al;
    pool->log = lg;
    pool->n_layers = p->n_layers;
    pool->n_kv_heads = p->n_kv_heads;
    pool->head_dim = p->head_dim;
    pool->page_tokens = p->page_tokens;
    pool->kv_type = p->kv_type;
    pool->codec = pl.codec;
    pool->kv_rotate = p->kv_rotate != 0;
    pool->rotate_seed = p->rotate_seed;
    pool->bounds_per_page = (size_t)pl.bounds_per_page;
    pool->head_bytes = pl.head_bytes;
    pool->page_bytes = page_bytes;
    pool->n_pages = (uint32_t)n_pages;
    pool->copy_page = p->copy_page;
    pool->copy_ud = p->copy_ud;
    pool->ref = pgd__calloc(&al, n_pages, sizeof *pool->ref);
    pool->next_free = pgd__calloc(&al, n_pages, sizeof *pool->next_free);
    if (!pool->ref || !pool->next_free) goto fail;
    if (pl.bounds_per_page) {
        pool->bounds =
            pgd__calloc(&al, (size_t)n_pages, (size_t)pl.bounds_per_page * sizeof(float));
        if (!pool->bounds) goto fail;
    }
    if (p->arena) {
        /* The caller's memory: never allocated, freed or touched on the host here when it
         * is device memory. */
        pool->arena = p->arena;
        pool->arena_device = p->arena_device != 0;
    } else if (!p->metadata_only) {
        pool->arena_raw = pgd__malloc(&al, (size_t)(page_bytes * n_pages) + 64);
        if (!pool->arena_raw) goto fail;
        pool->arena = (uint8_t *)(((uintptr_t)pool->arena_raw + 63) & ~(uintptr_t)63);
        advise_huge(pool->arena_raw, (size_t)(page_bytes * n_pages) + 64);
    }
    /* Free list in id order, so a fresh pool hands out 0, 1, 2, ... */
    for (uint32_t i = 0; i < pool->n_pages; i++)
        pool->next_free[i] = i + 1 < pool->n_pages ? i + 1 : PGD__NONE;
    pool->free_head = 0;
    pool->n_free = pool->n_pages;
    *out = pool;
    return PGD_OK;
fail:
    pgd_pool_destroy(pool);
    return rc;
}

void pgd_pool_destroy(pgd_pool *pool)
{
    if (!pool) return;
    pgd__alloc al = pool->al;
    pgd__free(&al, pool->arena_raw);
    pgd__free(&al, pool->bounds);
    pgd__free(&al, pool->next_free);
    pgd__free(&al, pool->ref);
    pgd__free(&al, pool);
}

/* ---- geometry ---- */

uint32_t pgd_pool_n_pages(const pgd_pool *pool)
{
    return pool->n_pages;
}
uint32_t pgd_pool_page_tokens(const pgd_pool *pool)
{
    return pool->page_tokens;
}
uint64_t pgd_pool_page_bytes(const pgd_pool *pool)
{
    return pool->page_bytes;
}
uint64_t pgd_pool_token_bytes(const pgd_pool *pool)
{
    return pool->page_bytes / pool->page_tokens;
}
pgd_kv_type pgd_pool_kv_type(const pgd_pool *pool)
{
    return pool->kv_type;
}
int pgd_pool_has_payload(const pgd_pool *pool)
{
    return pool->arena != NULL;
}
uint64_t pgd_pool_region_bytes(const pgd_pool *pool)
{
    return pool->head_bytes;
}
void pgd_pool_get_layout(const pgd_pool *pool, pgd_pool_layout *out)
{
    const uint64_t pt = pool->page_tokens, hd = pool->head_dim, n = pt * hd;
    memset(out, 0, sizeof *out);
    out->arena = pool->arena;
    out->arena_device = pool->arena_device;
    out->kv_type = pool->kv_type;
    out->n_pages = pool->n_pages;
    out->n_layers = pool->n_layers;
    out->n_kv_heads = pool->n_kv_heads;
    out->head_dim = pool->head_dim;
    out->page_tokens = pool->page_tokens;
    out->page_bytes = pool->page_bytes;
    out->page_stride = pool->page_bytes;
    out->layer_stride = 2 * pool->n_kv_heads * pool->head_bytes;
    out->kv_stride = pool->n_kv_heads * pool->head_bytes;
    out->head_stride = pool->head_bytes;
    out->region_bytes = pool->head_bytes;
    out->row_stride = hd * pgd_kv_type_size(pool->kv_type); /* 0 for block types */
    /* The block codecs' sub-layouts (layout.h; the codecs in src/codec/ implement them). */
    switch (pool->kv_type) {
    case PGD_KV_Q8_0:
        out->codes_bytes = n;
        out->k_scales_offset = out->v_scales_offset = n;
        break;
    case PGD_KV_Q4_0:
        out->codes_bytes = n / 2;
        out->k_scales_offset = out->v_scales_offset = n / 2;
        break;
    case PGD_KV_KIVI2:
        out->codes_bytes = n / 4;
        out->k_scales_offset = out->v_scales_offset = n / 4;
        out->k_mins_offset = n / 4 + 2 * hd;
        out->v_mins_offset = n / 4 + 2 * pt * (hd / (hd < 32 ? hd : 32));
        break;
    default:
        break;
    }
}

const pgd__log *pgd__pool_log(const pgd_pool *pool)
{
    return &pool->log;
}
const pgd__codec *pgd__pool_codec(const pgd_pool *pool)
{
    return pool->codec;
}
int pgd__pool_rotate(const pgd_pool *pool, uint64_t *seed)
{
    if (seed) *seed = pool->rotate_seed;
    return pool->kv_rotate;
}
void pgd__pool_geometry(const pgd_pool *pool, uint32_t *n_layers, uint32_t *n_kv_heads,
                        uint32_t *head_dim)
{
    *n_layers = pool->n_layers;
    *n_kv_heads = pool->n_kv_heads;
    *head_dim = pool->head_dim;
}
void pgd__pool_geom_get(const pgd_pool *pool, pgd__pool_geom *out)
{
    out->n_layers = pool->n_layers;
    out->n_kv_heads = pool->n_kv_heads;
    out->head_dim = pool->head_dim;
    out->page_tokens = pool->page_tokens;
    out->kv_rotate = pool->kv_rotate;
    out->rotate_seed = pool->rotate_seed;
    out->key_bounds = pool->bounds != NULL;
    out->arena_device = pool->arena_device;
}

/* ---- key bounds ---- */

/* Empty bounds of every (layer, head) of a page: min = +inf, max = -inf. */
static void bounds_reset(pgd_pool *pool, uint32_t page_id)
{
    float *b = pool->bounds + (size_t)page_id * pool->bounds_per_page;
    uint32_t hd = pool->head_dim;
    for (size_t i = 0; i < pool->bounds_per_page; i += 2 * (size_t)hd)
        for (uint32_t d = 0; d < hd; d++) {
            b[i + d] = INFINITY;
            b[i + hd + d] = -INFINITY;
        }
}

float *pgd__pool_key_bounds_mut(pgd_pool *pool, uint32_t page_id, uint32_t layer, uint32_t kv_head)
{
    if (!pool->bounds || page_id >= pool->n_pages || layer >= pool->n_layers ||
        kv_head >= pool->n_kv_heads)
        return NULL;
    return pool->bounds + (size_t)page_id * pool->bounds_per_page +
           ((size_t)layer * pool->n_kv_heads + kv_head) * 2 * pool->head_dim;
}

const float *pgd_pool_key_bounds(const pgd_pool *pool, uint32_t page_id, uint32_t layer,
                                 uint32_t kv_head)
{
    return pgd__pool_key_bounds_mut((pgd_pool *)pool, page_id, layer, kv_head);
}

/* ---- alloc / ref / unref ---- */

int pgd_pool_alloc(pgd_pool *pool, uint32_t *page_id)
{
    uint32_t id = pool->free_head;
    if (id == PGD__NONE) return PGD_ENOSPC;
    pool->free_head = pool->next_free[id];
    pool->next_free[id] = PGD__NONE;
    pool->n_free--;
    pgd_assert(pool->ref[id] == 0);
    pool->ref[id] = 1;
    if (pool->bounds) bounds_reset(pool, id);
    *page_id = id;
    return PGD_OK;
}

void pgd_pool_ref(pgd_pool *pool, uint32_t page_id)
{
    PGD_CHECK(page_id < pool->n_pages && pool->ref[page_id] > 0);
    PGD_CHECK(pool->ref[page_id] < UINT32_MAX);
    pool->ref[page_id]++;
}

uint32_t pgd_pool_unref(pgd_pool *pool, uint32_t page_id)
{
    PGD_CHECK(page_id < pool->n_pages && pool->ref[page_id] > 0);
    uint32_t r = --pool->ref[page_id];
    if (r == 0) {
        pool->next_free[page_id] = pool->free_head;
        pool->free_head = page_id;
        pool->n_free++;
    }
    return r;
}

uint32_t pgd_pool_refcount(const pgd_pool *pool, uint32_t page_id)
{
    return page_id < pool->n_pages ? pool->ref[page_id] : 0;
}

int pgd_pool_cow(pgd_pool *pool, uint32_t *page_id)
{
    uint32_t old = *page_id, fresh;
    PGD_CHECK(old < pool->n_pages && pool->ref[old] > 0);
    if (pool->ref[old] == 1) return 0;
    int rc = pgd_pool_alloc(pool, &fresh);
    if (rc != PGD_OK) return rc;
    if (pool->arena) {
        uint8_t *dst = pool->arena + (uint64_t)fresh * pool->page_bytes;
        const uint8_t *src = pool->arena + (uint64_t)old * pool->page_bytes;
        if (pool->copy_page) {
            /* The caller's copy (device memory, a DMA engine): on failure the fresh page
             * goes back and nothing changed. */
            rc = pool->copy_page(pool->copy_ud, dst, src, pool->page_bytes);
            if (rc != PGD_OK) {
                pgd_pool_unref(pool, fresh);
                pgd__logf(&pool->log, PGD_LOG_ERROR, "pool: copy_page of page %u failed: %d", old,
                          rc);
                return rc < 0 ? rc : PGD_EIO;
            }
        } else {
            memcpy(dst, src, pool->page_bytes);
        }
    }
    if (pool->bounds)
        memcpy(pool->bounds + (size_t)fresh * pool->bounds_per_page,
               pool->bounds + (size_t)old * pool->bounds_per_page,
               pool->bounds_per_page * sizeof(float));
    pgd_pool_unref(pool, old);
    pool->n_cow_copies++;
    *page_id = fresh;
    return 1;
}

/* ---- payload ---- */

void *pgd_pool_page_data(pgd_pool *pool, uint32_t page_id)
{
    if (!pool->arena || page_id >= pool->n_pages) return NULL;
    return pool->arena + (uint64_t)page_id * pool->page_bytes;
}

static void *kv_ptr(pgd_pool *pool, uint32_t page_id, uint32_t layer, uint32_t kv, uint32_t head)
{
    if (!pool->arena || page_id >= pool->n_pages || layer >= pool->n_layers ||
        head >= pool->n_kv_heads)
        return NULL;
    uint64_t off = (uint64_t)page_id * pool->page_bytes +
                   (((uint64_t)layer * 2 + kv) * pool->n_kv_heads + head) * pool->head_bytes;
    return pool->arena + off;
}

void *pgd_pool_k(pgd_pool *pool, uint32_t page_id, uint32_t layer, uint32_t kv_head)
{
    return kv_ptr(pool, page_id, layer, 0, kv_head);
}

void *pgd_pool_v(pgd_pool *pool, uint32_t page_id, uint32_t layer, uint32_t kv_head)
{
    return kv_ptr(pool, page_id, layer, 1, kv_head);
}

/* ---- stats / check ---- */

void pgd_pool_get_stats(const pgd_pool *pool, pgd_pool_stats *out)
{
    memset(out, 0, sizeof *out);
    out->n_pages_total = pool->n_pages;
    out->n_pages_free = pool->n_free;
    out->n_pages_used = pool->n_pages - pool->n_free;
    out->page_bytes = pool->page_bytes;
    out->arena_bytes = pool->arena ? pool->page_bytes * pool->n_pages : 0;
    out->metadata_bytes = (uint64_t)pool->n_pages * 2 * sizeof(uint32_t) + sizeof *pool +
                          (uint64_t)pool->n_pages * pool->bounds_per_page * sizeof(float);
    out->n_cow_copies = pool->n_cow_copies;
}

int pgd_pool_check(const pgd_pool *pool)
{
    uint32_t n = 0, live = 0;
    for (uint32_t id = pool->free_head; id != PGD__NONE; id = pool->next_free[id]) {
        if (id >= pool->n_pages || pool->ref[id] != 0 || ++n > pool->n_pages) {
            pgd__logf(&pool->log, PGD_LOG_ERROR, "pool check: bad free list at page %u", id);
            return PGD_ECORRUPT;
        }
    }
    for (uint32_t i = 0; i < pool->n_pages; i++)
        live += pool->ref[i] > 0;
    if (n != pool->n_free || live + n != pool->n_pages) {
        pgd__logf(&pool->log, PGD_LOG_ERROR,
                  "pool check: %u on free list, n_free %u, %u live of %u", n, pool->n_free, live,
                  pool->n_pages);
        return PGD_ECORRUPT;
    }
    return PGD_OK;
}
