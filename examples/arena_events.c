/* SPDX-License-Identifier: MIT */
/*
 * arena_events.c - libpagoda as a GPU engine adopts it, from include/pagoda/ alone:
 *
 *     cc arena_events.c $(pkg-config --cflags --libs pagoda) -o arena_events
 *
 * - The engine owns the pool's arena (arena_device: the library never touches a payload
 *   byte on the host) and supplies the page-copy routine used for copy-on-write; here the
 *   "device" is host memory and the copy a counted memcpy, where a CUDA engine would pass
 *   cudaMalloc'ed memory and a cudaMemcpyAsync wrapper.
 * - The engine writes K/V itself, at the address the published layout gives
 *   (pgd_pool_get_layout: page, layer, K/V, head and row strides).
 * - An offload layer listens to the prefix-index events: on_register when a full page
 *   joins the index, on_evict before an indexed page is freed (its payload still
 *   readable). It checks what the library promises: each evicted page was registered,
 *   is reported once, leaves first, with the bytes it had when registered.
 * scripts/test.sh builds and runs every example against the installed library.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pagoda/cache.h>
#include <pagoda/layout.h>

#define MAX_BLOCKS 256

typedef struct block {
    pgd_hash hash, parent;
    uint32_t page;
    uint64_t sum; /* checksum of the page's bytes when it was registered */
    int live;
} block;

typedef struct offload {
    pgd_pool_layout lay;
    block b[MAX_BLOCKS];
    int n;
    unsigned n_register, n_evict, n_errors;
} offload;

static uint64_t page_sum(const pgd_pool_layout *lay, uint32_t page)
{
    const unsigned char *p = (const unsigned char *)lay->arena + page * lay->page_stride;
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the page */
    for (uint64_t i = 0; i < lay->page_bytes; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static int same(pgd_hash a, pgd_hash b)
{
    return a.lo == b.lo && a.hi == b.hi;
}

static block *find(offload *o, pgd_hash h)
{
    for (int i = 0; i < o->n; i++)
        if (o->b[i].live && same(o->b[i].hash, h)) return &o->b[i];
    return NULL;
}

/* Called under the cache lock: record, never call back into the cache. */
static void on_register(void *ud, pgd_hash hash, pgd_hash parent, uint32_t depth, uint32_t page)
{
    offload *o = ud;
    o->n_register++;
    if (o->n == MAX_BLOCKS || find(o, hash) || (depth > 0 && !find(o, parent))) {
        o->n_errors++; /* a block twice, or a child before its parent */
        return;
    }
    o->b[o->n++] = (block){hash, parent, page, page_sum(&o->lay, page), 1};
}

static void on_evict(void *ud, pgd_hash hash, uint32_t page)
{
    offload *o = ud;
    block *b = find(o, hash);
    o->n_evict++;
    if (!b || b->page != page || page_sum(&o->lay, page) != b->sum) {
        o->n_errors++; /* unknown, reported twice, or its payload is gone */
        return;
    }
    for (int i = 0; i < o->n; i++)
        if (o->b[i].live && same(o->b[i].parent, hash)) o->n_errors++; /* not a leaf */
    /* A tier would copy the page out here (device -> host), before the pool reuses it. */
    b->live = 0;
}

static unsigned n_copies;

static int copy_page(void *ud, void *dst, const void *src, uint64_t n_bytes)
{
    (void)ud;
    n_copies++;
    memcpy(dst, src, n_bytes); /* a device engine: cudaMemcpyAsync on its stream */
    return PGD_OK;
}

/* The engine's "kernel": writes K and V of position pos (token tok) into every layer and
 * head, at the address the layout gives. Values depend on the token and position only, so
 * equal prefixes hold equal bytes. */
static void write_kv(const pgd_pool_layout *lay, uint32_t page, uint32_t slot, int32_t tok,
                     uint64_t pos)
{
    for (uint32_t l = 0; l < lay->n_layers; l++)
        for (uint32_t kv = 0; kv < 2; kv++)
            for (uint32_t h = 0; h < lay->n_kv_heads; h++) {
                uint16_t *row = (uint16_t *)((char *)lay->arena + page * lay->page_stride +
                                             l * lay->layer_stride + kv * lay->kv_stride +
                                             h * lay->head_stride + slot * lay->row_stride);
                for (uint32_t d = 0; d < lay->head_dim; d++)
                    row[d] = (uint16_t)(tok * 31 + pos * 7 + l + kv + h + d);
            }
}

static int run_request(pgd_cache *c, const pgd_pool_layout *lay, const int32_t *t, size_t n,
                       int fork_it)
{
    pgd_seq *s = NULL, *f = NULL;
    uint32_t page, slot;
    int rc = pgd_seq_create(c, "tenant", 6, &s);
    if (rc != PGD_OK) return rc;
    int64_t cached = pgd_seq_match(c, s, t, n);
    rc = cached < 0 ? (int)cached : pgd_seq_grow(c, s, n - (size_t)cached);
    for (uint64_t pos = (uint64_t)(cached > 0 ? cached : 0); rc == PGD_OK && pos < n; pos++) {
        rc = pgd_seq_write_slot(c, s, pos, &page, &slot); /* copy-on-write first */
        if (rc == PGD_OK) write_kv(lay, page, slot, t[pos], pos);
    }
    if (rc == PGD_OK) {
        int n_reg = pgd_seq_commit(c, s, t + cached, n - (size_t)cached);
        if (n_reg < 0) rc = n_reg;
    }
    /* A branch (say, a second sample) shares every page; its first write into the shared
     * partial page copies it through the engine's copy_page. */
    if (rc == PGD_OK && fork_it && n % lay->page_tokens) {
        rc = pgd_seq_fork(c, s, &f);
        if (rc == PGD_OK) rc = pgd_seq_grow(c, f, 1);
        if (rc == PGD_OK) rc = pgd_seq_write_slot(c, f, n, &page, &slot);
        if (rc == PGD_OK) write_kv(lay, page, slot, 9999, n);
        pgd_seq_destroy(c, f);
    }
    pgd_seq_destroy(c, s);
    return rc;
}

int main(void)
{
    pgd_cache_params p = pgd_cache_default_params();
    offload o;
    memset(&o, 0, sizeof o);
    p.pool.n_layers = 2;
    p.pool.n_kv_heads = 2;
    p.pool.head_dim = 64;
    p.pool.kv_type = PGD_KV_F16;
    p.pool.page_tokens = 16;
    /* The engine's arena: 12 pages of 16 tokens x 2 layers x K,V x 2 heads x 64 x f16. */
    uint64_t page_bytes = 16ull * 2 * 2 * 2 * 64 * 2, arena_bytes = 12 * page_bytes;
    void *arena = aligned_alloc(64, arena_bytes);
    if (!arena) return 1;
    p.pool.arena = arena;
    p.pool.arena_bytes = arena_bytes;
    p.pool.arena_device = 1; /* never read or written by the library */
    p.pool.copy_page = copy_page;
    p.on_register = on_register;
    p.on_evict = on_evict;
    p.event_ud = &o;
    char why[160];
    pgd_cache *c = NULL;
    int rc = pgd_pool_params_check(&p.pool, why, sizeof why);
    if (rc == PGD_OK) rc = pgd_cache_create(&p, &c);
    if (rc != PGD_OK) {
        fprintf(stderr, "pgd_cache_create: %s (%s)\n", pgd_strerror(rc), why);
        free(arena);
        return 1;
    }
    pgd_pool_get_layout(pgd_cache_pool(c), &o.lay);

    /* Eight requests: a 32-token system prompt, then 40 tokens of their own. The pool holds
     * 12 pages, so older requests' pages are evicted (leaves first) to make room. */
    int32_t t[72];
    for (int i = 0; i < 32; i++)
        t[i] = 100 + i;
    for (int r = 0; r < 8 && rc == PGD_OK; r++) {
        for (int i = 32; i < 72; i++)
            t[i] = 1000 * (r + 1) + i;
        rc = run_request(c, &o.lay, t, 72, r % 2);
    }
    pgd_cache_stats st;
    pgd_cache_get_stats(c, &st);
    if (rc == PGD_OK) rc = pgd_cache_check(c);
    printf("arena %llu bytes (%u pages), page copies through the hook: %u (cache: %llu)\n",
           (unsigned long long)arena_bytes, o.lay.n_pages, n_copies,
           (unsigned long long)st.n_cow_copies);
    printf("events: %u registered, %u evicted, %u errors; prompt tokens from cache: %llu of "
           "%llu\n",
           o.n_register, o.n_evict, o.n_errors, (unsigned long long)st.n_hit_tokens,
           (unsigned long long)st.n_query_tokens);
    pgd_cache_destroy(c);
    free(arena);
    if (rc != PGD_OK) {
        fprintf(stderr, "arena_events: %s\n", pgd_strerror(rc));
        return 1;
    }
    /* What the library promised: copies went through the hook, events came, none wrong,
     * and the shared system prompt was reused. */
    return n_copies == st.n_cow_copies && n_copies > 0 && o.n_evict > 0 && o.n_errors == 0 &&
                   st.n_hit_tokens >= 7 * 32
               ? 0
               : 1;
}
