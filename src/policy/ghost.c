/* SPDX-License-Identifier: MIT */
/*
 * ghost.c - ghost lists of block hashes for the policies that remember what they evicted
 * (s3fifo.c: one ghost FIFO; arc.c: B1 and B2). Declared in pgd_int.h.
 *
 * A fixed node pool of cap entries shared by up to PGD__GHOST_LISTS FIFO lists (doubly
 * linked, oldest at the tail), and an open-addressing hash set (linear probing, a power of
 * two at least twice cap, backward-shift deletion) from a hash to its node. Everything is
 * allocated in pgd__ghost_init: push, find and del never allocate. O(1) expected per call.
 *
 * Invariants: a hash is in at most one list once; table[] holds exactly the used nodes;
 * len[0] + len[1] <= cap.
 */
#include <string.h>

#include "pgd_int.h"

static uint32_t slot_of(const pgd__ghost *g, pgd_hash h)
{
    uint64_t x = (h.lo ^ (h.hi * 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull;
    return (uint32_t)(x >> 32) & g->mask;
}

static int same(pgd_hash a, pgd_hash b)
{
    return a.lo == b.lo && a.hi == b.hi;
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
    g->hash = pgd__malloc(al, (size_t)cap * sizeof *g->hash);
    g->prev = pgd__malloc(al, (size_t)cap * sizeof *g->prev);
    g->next = pgd__malloc(al, (size_t)cap * sizeof *g->next);
    g->list = pgd__malloc(al, cap);
    if (!g->table || !g->hash || !g->prev || !g->next || !g->list) {
        pgd__ghost_deinit(g, al);
        return PGD_ENOMEM;
    }
    for (uint32_t i = 0; i < size; i++)
        g->table[i] = PGD__NONE;
    for (uint32_t i = 0; i < cap; i++) {
        g->next[i] = i + 1 < cap ? i + 1 : PGD__NONE;
        g->list[i] = PGD__GHOST_FREE;
    }
    g->free = 0;
    for (int l = 0; l < PGD__GHOST_LISTS; l++)
        g->head[l] = g->tail[l] = PGD__NONE;
    return PGD_OK;
}

void pgd__ghost_deinit(pgd__ghost *g, const pgd__alloc *al)
{
    pgd__free(al, g->table);
    pgd__free(al, g->hash);
    pgd__free(al, g->prev);
    pgd__free(al, g->next);
    pgd__free(al, g->list);
    memset(g, 0, sizeof *g);
}

/* Table slot holding h, or the empty slot where it would go. */
static uint32_t probe(const pgd__ghost *g, pgd_hash h)
{
    uint32_t i = slot_of(g, h);
    while (g->table[i] != PGD__NONE && !same(g->hash[g->table[i]], h))
        i = (i + 1) & g->mask;
    return i;
}

int pgd__ghost_find(const pgd__ghost *g, pgd_hash h)
{
    uint32_t node = g->table[probe(g, h)];
    return node == PGD__NONE ? -1 : g->list[node];
}

/* Frees node: out of its list, out of the table (backward shift), onto the free list. */
static void drop(pgd__ghost *g, uint32_t node)
{
    int l = g->list[node];
    uint32_t p = g->prev[node], n = g->next[node];
    if (p != PGD__NONE)
        g->next[p] = n;
    else
        g->head[l] = n;
    if (n != PGD__NONE)
        g->prev[n] = p;
    else
        g->tail[l] = p;
    g->len[l]--;
    uint32_t i = probe(g, g->hash[node]);
    g->table[i] = PGD__NONE;
    for (uint32_t j = (i + 1) & g->mask; g->table[j] != PGD__NONE; j = (j + 1) & g->mask) {
        uint32_t home = slot_of(g, g->hash[g->table[j]]);
        /* move j back into the hole i unless its home lies cyclically in (i, j] */
        if (((j - home) & g->mask) >= ((j - i) & g->mask)) {
            g->table[i] = g->table[j];
            g->table[j] = PGD__NONE;
            i = j;
        }
    }
    g->list[node] = PGD__GHOST_FREE;
    g->next[node] = g->free;
    g->free = node;
}

void pgd__ghost_del(pgd__ghost *g, pgd_hash h)
{
    uint32_t node = g->table[probe(g, h)];
    if (node != PGD__NONE) drop(g, node);
}

void pgd__ghost_pop(pgd__ghost *g, int l)
{
    if (g->tail[l] != PGD__NONE) drop(g, g->tail[l]);
}

void pgd__ghost_push(pgd__ghost *g, int l, pgd_hash h)
{
    pgd__ghost_del(g, h);
    if (g->free == PGD__NONE) pgd__ghost_pop(g, g->len[l] ? l : !l);
    uint32_t node = g->free;
    g->free = g->next[node];
    g->hash[node] = h;
    g->list[node] = (uint8_t)l;
    g->prev[node] = PGD__NONE;
    g->next[node] = g->head[l];
    if (g->head[l] != PGD__NONE)
        g->prev[g->head[l]] = node;
    else
        g->tail[l] = node;
    g->head[l] = node;
    g->len[l]++;
    g->table[probe(g, h)] = node;
}
