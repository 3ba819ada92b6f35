/* SPDX-License-Identifier: MIT */
/*
 * belady.c - Belady's MIN (offline optimal): evict the page whose next use lies farthest
 * in the future. It needs the future, so it exists for trace replay, as the upper bound
 * the online policies are measured against.
 *
 * An indexed binary max-heap of the evictable pages keyed by (next_use, depth): a page's
 * next use is asked from the user's oracle when it becomes evictable, and stays fixed
 * until it is used again (which pins it, taking it off the heap). Ties go to the deeper
 * page: any future use of a page also uses its ancestors, so an ancestor's next use is
 * never later than a descendant's, and with the depth tie-break the top is a leaf.
 * O(log n) per operation. Ops table: policy.h.
 */
#include "pgd_int.h"

typedef struct belady {
    pgd__alloc al;
    uint32_t n, size;
    pgd_next_use_fn next_use;
    void *ud;
    uint32_t *heap;  /* [n] page ids, heap-ordered */
    uint32_t *pos;   /* [n] index in heap, PGD__NONE if absent */
    uint64_t *key;   /* [n] next use */
    uint32_t *depth; /* [n] */
} belady;

static void bel_destroy(void *state)
{
    belady *b = state;
    if (!b) return;
    pgd__alloc al = b->al;
    pgd__free(&al, b->heap);
    pgd__free(&al, b->pos);
    pgd__free(&al, b->key);
    pgd__free(&al, b->depth);
    pgd__free(&al, b);
}

static int bel_create(const pgd_policy_init *init, void **state)
{
    pgd__alloc a;
    pgd__alloc_init(&a, init->alloc);
    const pgd__alloc *al = &a;
    uint32_t n = init->n_pages;
    *state = NULL;
    if (!init->next_use) return PGD_EINVAL;
    belady *b = pgd__calloc(al, 1, sizeof *b);
    if (!b) return PGD_ENOMEM;
    b->al = a;
    b->n = n;
    b->next_use = init->next_use;
    b->ud = init->next_use_ud;
    b->heap = pgd__malloc(al, (size_t)n * sizeof *b->heap);
    b->pos = pgd__malloc(al, (size_t)n * sizeof *b->pos);
    b->key = pgd__malloc(al, (size_t)n * sizeof *b->key);
    b->depth = pgd__malloc(al, (size_t)n * sizeof *b->depth);
    if (!b->heap || !b->pos || !b->key || !b->depth) {
        bel_destroy(b);
        return PGD_ENOMEM;
    }
    for (uint32_t i = 0; i < n; i++)
        b->pos[i] = PGD__NONE;
    *state = b;
    return PGD_OK;
}

/* Returns non-zero if page a should be evicted before page b. */
static int before(const belady *b, uint32_t x, uint32_t y)
{
    if (b->key[x] != b->key[y]) return b->key[x] > b->key[y];
    if (b->depth[x] != b->depth[y]) return b->depth[x] > b->depth[y];
    return x < y;
}

static void place(belady *b, uint32_t i, uint32_t id)
{
    b->heap[i] = id;
    b->pos[id] = i;
}

static void sift_up(belady *b, uint32_t i)
{
    uint32_t id = b->heap[i];
    while (i > 0) {
        uint32_t p = (i - 1) / 2;
        if (!before(b, id, b->heap[p])) break;
        place(b, i, b->heap[p]);
        i = p;
    }
    place(b, i, id);
}

static void sift_down(belady *b, uint32_t i)
{
    uint32_t id = b->heap[i];
    for (;;) {
        uint32_t c = 2 * i + 1;
        if (c >= b->size) break;
        if (c + 1 < b->size && before(b, b->heap[c + 1], b->heap[c])) c++;
        if (!before(b, b->heap[c], id)) break;
        place(b, i, b->heap[c]);
        i = c;
    }
    place(b, i, id);
}

static void heap_remove(belady *b, uint32_t id)
{
    uint32_t i = b->pos[id];
    if (i == PGD__NONE) return;
    b->pos[id] = PGD__NONE;
    b->size--;
    if (i == b->size) return;
    uint32_t moved = b->heap[b->size];
    place(b, i, moved);
    sift_down(b, i);
    sift_up(b, b->pos[moved]);
}

static void bel_insert(void *state, uint32_t id, const pgd_policy_page *info)
{
    (void)state, (void)id, (void)info;
}

static void bel_hit(void *state, uint32_t id, const pgd_policy_page *info)
{
    (void)info;
    heap_remove(state, id);
}

static void bel_unreferenced(void *state, uint32_t id, const pgd_policy_page *info)
{
    belady *b = state;
    PGD_CHECK(id < b->n && b->pos[id] == PGD__NONE);
    b->key[id] = b->next_use(b->ud, info->hash);
    b->depth[id] = info->depth;
    place(b, b->size++, id);
    sift_up(b, b->size - 1);
}

static uint32_t bel_victim(void *state, pgd_policy_accept_fn accept, void *ctx)
{
    belady *b = state;
    if (b->size == 0) return PGD_POLICY_NO_PAGE;
    if (!accept || accept(ctx, b->heap[0])) return b->heap[0];
    /* Not reached while the tie-break keeps the top a leaf; stay correct anyway. */
    uint32_t best = PGD_POLICY_NO_PAGE;
    for (uint32_t i = 0; i < b->size; i++) {
        uint32_t id = b->heap[i];
        if (accept(ctx, id) && (best == PGD_POLICY_NO_PAGE || before(b, id, best))) best = id;
    }
    return best;
}

static void bel_remove(void *state, uint32_t id)
{
    heap_remove(state, id);
}

static int bel_contains(const void *state, uint32_t id)
{
    const belady *b = state;
    return id < b->n && b->pos[id] != PGD__NONE;
}

static uint32_t bel_size(const void *state)
{
    return ((const belady *)state)->size;
}

const pgd_policy_ops pgd__policy_belady = {
    "belady",   bel_create, bel_destroy,  bel_insert, bel_hit, bel_unreferenced,
    bel_victim, bel_remove, bel_contains, bel_size,   NULL,
};
