/* SPDX-License-Identifier: MIT */
/*
 * dlist.h - intrusive doubly linked lists of page ids for the policies that keep queues
 * (s3fifo.c, arc.c). A page is a record whose FIRST member is uint32_t link[2][2]: two
 * link pairs ([list][0 prev, 1 next]), so one page can be on two lists at once (its queue
 * and the evictable list). Ends are PGD__NONE; head is the newest. Internal to
 * src/policy/; not locked (the cache calls policies under its lock).
 */
#ifndef PGD_POLICY_DLIST_H
#define PGD_POLICY_DLIST_H

#include <stddef.h>
#include <stdint.h>

#include "pgd_int.h"

typedef struct dlist {
    uint32_t head, tail, n; /* head: newest */
} dlist;

/* The link pairs of page id in an array of records of stride bytes. */
static inline uint32_t (*pgd__dl_links(void *pages, size_t stride, uint32_t id))[2]
{
    return (uint32_t(*)[2])(void *)((char *)pages + stride * id);
}

static inline void pgd__dl_push_head(void *pages, size_t stride, int k, dlist *l, uint32_t id)
{
    uint32_t(*me)[2] = pgd__dl_links(pages, stride, id);
    me[k][0] = PGD__NONE;
    me[k][1] = l->head;
    if (l->head != PGD__NONE)
        pgd__dl_links(pages, stride, l->head)[k][0] = id;
    else
        l->tail = id;
    l->head = id;
    l->n++;
}

static inline void pgd__dl_unlink(void *pages, size_t stride, int k, dlist *l, uint32_t id)
{
    uint32_t(*me)[2] = pgd__dl_links(pages, stride, id);
    uint32_t p = me[k][0], n = me[k][1];
    if (p != PGD__NONE)
        pgd__dl_links(pages, stride, p)[k][1] = n;
    else
        l->head = n;
    if (n != PGD__NONE)
        pgd__dl_links(pages, stride, n)[k][0] = p;
    else
        l->tail = p;
    l->n--;
}

/* For a typed array pg of such records. */
#define dl_push_head(pg, k, l, id) pgd__dl_push_head((pg), sizeof *(pg), (k), (l), (id))
#define dl_unlink(pg, k, l, id) pgd__dl_unlink((pg), sizeof *(pg), (k), (l), (id))

#endif /* PGD_POLICY_DLIST_H */
