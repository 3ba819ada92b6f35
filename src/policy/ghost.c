/* SPDX-License-Identifier: MIT */
/*
 * ghost.c - ghost lists of block hashes for the policies that remember what they evicted
 * (s3fifo.c: one ghost FIFO; arc.c: B1 and B2). Declared in pgd_int.h.
 *
 * A fixed node pool of cap entries shared by up to PGD__GHOST_LISTS FIFO lists (doubly
 * linked, oldest at the tail), and an open-addressing hash set (linear probing, a power of
 * two at least twice cap, backward-shift deletion) from a hash to its node. A table slot
 * keeps 32 mixed bits of the hash (its home slot among them), so a probe reads a node only
 * when those bits match, and deletion never reads one; a node keeps its slot. Everything
 * is allocated in pgd__ghost_init: push, find and del never allocate. O(1) expected.
 *
 * Invariants: a hash is in at most one list once; table[] holds exactly the used nodes,
 * node[table[i].node].slot == i; len[0] + len[1] <= cap.
 */
#include <string.h>

#include "pgd_int.h"

static uint32_t tag_of(pgd_hash h)
{
    uint64_t x = (h.lo ^ (h.hi * 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull;
    return (uint32_t)(x >> 32);
}

int pgd__ghost_init(pgd__ghost *g, const pgd__alloc *al, uint32_t cap)
{
    memset(g, 0, sizeof *g);
    if (cap == 0) cap = 1;
    uint32_t size = 4;
    while (size < 2 * (uint64_t)cap)
        size *= 2;
    g->cap = cap;
    g->mask = size - 1;
    g->table = pgd__malloc(al, (size_t)size * sizeof *g->table);
    g->node = pgd__malloc(al, (size_t)cap * sizeof *g->node);
    if (!g->table || !g->node) {
        pgd__ghost_deinit(g, al);
        return PGD_ENOMEM;
    }
    for (uint32_t i = 0; i < size; i++)
        g->table[i].node = PGD__NONE, g->table[i].tag = 0;
    for (uint32_t i = 0; i < cap; i++) {
        g->node[i].next = i + 1 < cap ? i + 1 : PGD__NONE;
        g->node[i].list = PGD__GHOST_FREE;
    }
    g->free = 0;
    for (int l = 0; l < PGD__GHOST_LISTS; l++)
        g->head[l] = g->tail[l] = PGD__NONE;
    return PGD_OK;
}

void pgd__ghost_deinit(pgd__ghost *g, const pgd__alloc *al)
{
    pgd__free(al, g->table);
    pgd__free(al, g->node);
    memset(g, 0, sizeof *g);
}

/* Table slot holding h, or the empty slot where it would go. */
static uint32_t probe(const pgd__ghost *g, pgd_hash h, uint32_t tag)
{
    uint32_t i = tag & g->mask;
    for (;; i = (i + 1) & g->mask) {
        const pgd__ghost_slot *s = &g->table[i];
        if (s->node == PGD__NONE) return i;
        if (s->tag == tag) {
            const pgd__ghost_node *n = &g->node[s->node];
            if (n->hash.lo == h.lo && n->hash.hi == h.hi) return i;
        }
    }
}

int pgd__ghost_find(const pgd__ghost *g, pgd_hash h)
{
    uint32_t node = g->table[probe(g, h, tag_of(h))].node;
    return node == PGD__NONE ? -1 : (int)g->node[node].list;
}

/* Frees node: out of its list, out of the table (backward shift), onto the free list. */
static void drop(pgd__ghost *g, uint32_t id)
{
    pgd__ghost_node *n = &g->node[id];
    uint32_t l = n->list;
    if (n->prev != PGD__NONE)
        g->node[n->prev].next = n->next;
    else
        g->head[l] = n->next;
    if (n->next != PGD__NONE)
        g->node[n->next].prev = n->prev;
    else
        g->tail[l] = n->prev;
    g->len[l]--;
    uint32_t i = n->slot;
    g->table[i].node = PGD__NONE;
    for (uint32_t j = (i + 1) & g->mask; g->table[j].node != PGD__NONE; j = (j + 1) & g->mask) {
        uint32_t home = g->table[j].tag & g->mask;
        /* move j back into the hole i unless its home lies cyclically in (i, j] */
        if (((j - home) & g->mask) >= ((j - i) & g->mask)) {
            g->table[i] = g->table[j];
            g->node[g->table[i].node].slot = i;
            g->table[j].node = PGD__NONE;
            i = j;
        }
    }
    n->list = PGD__GHOST_FREE;
    n->next = g->free;
    g->free = id;
}

void pgd__ghost_del(pgd__ghost *g, pgd_hash h)
{
    uint32_t node = g->table[probe(g, h, tag_of(h))].node;
    if (node != PGD__NONE) drop(g, node);
}

void pgd__ghost_pop(pgd__ghost *g, int l)
{
    if (g->tail[l] != PGD__NONE) drop(g, g->tail[l]);
}

void pgd__ghost_push(pgd__ghost *g, int l, pgd_hash h)
{
    uint32_t tag = tag_of(h), i = probe(g, h, tag);
    if (g->table[i].node != PGD__NONE) {
        drop(g, g->table[i].node);
        i = probe(g, h, tag);
    }
    if (g->free == PGD__NONE) {
        pgd__ghost_pop(g, g->len[l] ? l : !l);
        i = probe(g, h, tag); /* the pop may have shifted the table */
    }
    uint32_t id = g->free;
    pgd__ghost_node *n = &g->node[id];
    g->free = n->next;
    n->hash = h;
    n->list = (uint32_t)l;
    n->slot = i;
    n->prev = PGD__NONE;
    n->next = g->head[l];
    if (g->head[l] != PGD__NONE)
        g->node[g->head[l]].prev = id;
    else
        g->tail[l] = id;
    g->head[l] = id;
    g->len[l]++;
    g->table[i].node = id;
    g->table[i].tag = tag;
}
