/* SPDX-License-Identifier: MIT */
/*
 * map.c - the record map of a tier (tier_int.h): block hash -> slot, child counts within
 * the map, and leaf-only eviction through a policy ops table (LRU by default).
 *
 *     by_hash[] (>= 2x capacity)   slots[capacity]                 by_parent[] (>= 2x cap.)
 *     +----+----+----+----+        +------+--------+----------+    +----+----+----+----+
 *     | s3 | -- | s0 | s7 | ---->  | hash | parent | children | <--| s0 | s3 | -- | s7 |
 *     +----+----+----+----+        +------+--------+----------+    +----+----+----+----+
 *     keyed by slot.hash           pins, depth, live               keyed by slot.parent
 *
 * Both tables use open addressing with linear probing and backward-shift deletion (no
 * tombstones), as the prefix index does (index.c). by_parent is a multimap: siblings share
 * a key and lie in one cluster, so the children of a block present in the map are the
 * entries of its cluster whose parent is that block; insert counts them there, which is
 * how a parent that arrives after its children (demotion evicts leaves first) gets its
 * count. First blocks of chains (parent {0, 0}) are not in by_parent: they would all
 * share one cluster.
 *
 * Cost: find, insert, remove O(1) expected (insert walks the cluster of its own hash in
 * by_parent, which holds its siblings' entries when it has many). victim() is the
 * policy's: LRU walks from the oldest slot to the first leaf, which is the oldest itself
 * unless gets touched parents after their children.
 * Retention: slots with an expiry are on a list (exp_prev / exp_next); victim() walks it
 * only once the earliest expiry it knows of (next_exp_s) has passed, and returns the
 * first expired unpinned leaf it finds. An expired slot that is not a leaf (its children
 * are still held) stays until they go, so while one exists each victim() walks the list:
 * O(slots with an expiry). Retention pins hold a pin count (out of the policy's set) and
 * charge their record's bytes to pinned_bytes, bounded by pin_limit.
 * The policy is told the tree (its optional leaf() op, policy.h): a slot whose child
 * count goes 0 -> 1 stopped being a leaf, 1 -> 0 is one again, and a slot inserted (or
 * reinserted by retain / restore) with children present is not one, said right after
 * insert(). A heap policy then keeps those out of its victim search: a tier holds whole
 * chains, demoted leaf first, so a parent arrives after its children with a lower key
 * (cost at ram:8G:policy=cost walked thousands of refused parents a victim).
 * Callers: ram.c and disk.c, under their lock. Invariant (pgd__tmap_check): every live
 * slot is in by_hash once, and in by_parent once unless a first block; n_children counts
 * the live slots whose parent is the slot's block; the policy's set is exactly the
 * unpinned live slots; t_held[t] counts the live slots tagged with tenant t.
 * Quotas (accept_quota): no victim among the records of a tenant that holds no more than
 * its reserved share (pgd__tmap_set_share) of the capacity.
 */
#include <stdio.h>

#include "tier/tier_int.h"

struct pgd__tmap {
    pgd__alloc al;
    uint32_t capacity, n_live;
    uint32_t mask;         /* table slots - 1 */
    uint32_t *by_hash;     /* [mask + 1] slot or PGD__NONE */
    uint32_t *by_parent;   /* [mask + 1] slot or PGD__NONE */
    pgd__tmap_slot *slots; /* [capacity] */
    uint32_t *next_free;   /* [capacity] free-list links */
    uint32_t free_head;
    uint32_t n_pinned;         /* live slots with pins > 0 */
    const pgd_policy_ops *pol; /* borrowed */
    void *pol_state;
    /* Retention. */
    uint32_t *exp_prev, *exp_next; /* [capacity] links of the slots with an expiry */
    uint32_t exp_head;
    uint64_t next_exp_s;              /* no expiry on the list is earlier (0: walk) */
    uint64_t pinned_bytes, pin_limit; /* retention pins: bytes held, bound */
    pgd_clock_fn clock;               /* NULL: CLOCK_REALTIME */
    void *clock_ud;
    uint64_t page_bytes; /* pgd_policy_page.bytes */
    uint32_t page_tokens;
    pgd_cost_model cost;
    /* Quotas: records tagged with each tenant, and its reserved share (0: none). */
    uint32_t t_held[PGD__TMAP_TENANTS];
    double t_share[PGD__TMAP_TENANTS];
    uint32_t n_reserved; /* tenants with t_share > 0 */
};

static const pgd_hash no_parent = {0, 0};

static int is_root(pgd_hash parent)
{
    return pgd_hash_eq(parent, no_parent);
}

/* ---- create / destroy ---- */

void pgd__tmap_destroy(pgd__tmap *m)
{
    if (!m) return;
    pgd__alloc al = m->al;
    if (m->pol_state) m->pol->destroy(m->pol_state);
    pgd__free(&al, m->by_hash);
    pgd__free(&al, m->by_parent);
    pgd__free(&al, m->slots);
    pgd__free(&al, m->next_free);
    pgd__free(&al, m->exp_prev);
    pgd__free(&al, m->exp_next);
    pgd__free(&al, m);
}

/* The map's clock in ns (the policy's clock_fn, ud = the map). */
static uint64_t map_now_ns(void *ud)
{
    const pgd__tmap *m = ud;
    if (m->clock) return m->clock(m->clock_ud);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t map_now_s(const pgd__tmap *m)
{
    return map_now_ns((void *)m) / 1000000000ull;
}

int pgd__tmap_create(const pgd__alloc *al, uint32_t capacity, const pgd_policy_ops *policy,
                     const pgd_record_ident *ident, pgd__tmap **out)
{
    uint64_t n_tab = 16;
    *out = NULL;
    if (capacity == 0 || capacity > (1u << 30)) return PGD_EINVAL;
    if (!policy) policy = pgd_policy_builtin(PGD_POLICY_LRU);
    while (n_tab < 2ull * capacity)
        n_tab <<= 1;
    pgd__tmap *m = pgd__calloc(al, 1, sizeof *m);
    if (!m) return PGD_ENOMEM;
    m->al = *al;
    m->capacity = capacity;
    m->mask = (uint32_t)(n_tab - 1);
    m->pol = policy;
    m->by_hash = pgd__malloc(al, (size_t)n_tab * sizeof *m->by_hash);
    m->by_parent = pgd__malloc(al, (size_t)n_tab * sizeof *m->by_parent);
    m->slots = pgd__calloc(al, capacity, sizeof *m->slots);
    m->next_free = pgd__malloc(al, (size_t)capacity * sizeof *m->next_free);
    m->exp_prev = pgd__malloc(al, (size_t)capacity * sizeof *m->exp_prev);
    m->exp_next = pgd__malloc(al, (size_t)capacity * sizeof *m->exp_next);
    if (!m->by_hash || !m->by_parent || !m->slots || !m->next_free || !m->exp_prev ||
        !m->exp_next) {
        pgd__tmap_destroy(m);
        return PGD_ENOMEM;
    }
    memset(m->by_hash, 0xff, (size_t)n_tab * sizeof *m->by_hash);
    memset(m->by_parent, 0xff, (size_t)n_tab * sizeof *m->by_parent);
    for (uint32_t i = 0; i < capacity; i++)
        m->next_free[i] = i + 1 < capacity ? i + 1 : PGD__NONE;
    m->free_head = 0;
    m->exp_head = PGD__NONE;
    m->next_exp_s = UINT64_MAX;
    m->pin_limit = UINT64_MAX;
    m->page_bytes = ident ? ident->page_bytes + ident->bounds_bytes : 1;
    m->page_tokens = ident ? ident->page_tokens : 1;
    if (ident)
        pgd_cost_model_default(&m->cost, ident->n_layers, ident->n_kv_heads, ident->head_dim);
    else
        pgd_cost_model_default(&m->cost, 1, 1, 1);
    pgd_policy_init init;
    memset(&init, 0, sizeof init);
    init.n_pages = capacity;
    init.alloc = &m->al.a;
    init.clock = map_now_ns;
    init.clock_ud = m;
    init.page_bytes = m->page_bytes ? m->page_bytes : 1;
    init.cost = m->cost;
    init.page_tokens = m->page_tokens;
    int rc = policy->create(&init, &m->pol_state);
    if (rc != PGD_OK) {
        m->pol_state = NULL;
        pgd__tmap_destroy(m);
        return rc;
    }
    *out = m;
    return PGD_OK;
}

uint32_t pgd__tmap_capacity(const pgd__tmap *m)
{
    return m->capacity;
}

uint32_t pgd__tmap_count(const pgd__tmap *m)
{
    return m->n_live;
}

/* ---- the two tables ---- */

/* Home of a key in either table (both words mixed: the murmur3 finalizer, as index.c). */
static uint32_t home(const pgd__tmap *m, pgd_hash h)
{
    uint64_t x = h.lo ^ (h.hi * 0x9E3779B97F4A7C15ull);
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (uint32_t)x & m->mask;
}

/* The key of slot s in table tab (by_hash: its hash; by_parent: its parent). */
static pgd_hash key_of(const pgd__tmap *m, const uint32_t *tab, uint32_t s)
{
    return tab == m->by_hash ? m->slots[s].hash : m->slots[s].parent;
}

/* Position of slot s in tab (it must be there). */
static uint32_t position(const pgd__tmap *m, const uint32_t *tab, uint32_t s)
{
    uint32_t i = home(m, key_of(m, tab, s));
    while (tab[i] != s) {
        PGD_CHECK(tab[i] != PGD__NONE);
        i = (i + 1) & m->mask;
    }
    return i;
}

static void tab_insert(pgd__tmap *m, uint32_t *tab, uint32_t s)
{
    uint32_t i = home(m, key_of(m, tab, s));
    while (tab[i] != PGD__NONE)
        i = (i + 1) & m->mask;
    tab[i] = s;
}

/* Backward-shift deletion of slot s from tab: later members of the cluster move into the
 * hole when their home does not lie cyclically in (hole, their position]. */
static void tab_remove(pgd__tmap *m, uint32_t *tab, uint32_t s)
{
    uint32_t hole = position(m, tab, s), j = hole;
    for (;;) {
        j = (j + 1) & m->mask;
        uint32_t f = tab[j];
        if (f == PGD__NONE) break;
        uint32_t h = home(m, key_of(m, tab, f));
        int stays = hole <= j ? (hole < h && h <= j) : (hole < h || h <= j);
        if (!stays) {
            tab[hole] = f;
            hole = j;
        }
    }
    tab[hole] = PGD__NONE;
}

uint32_t pgd__tmap_find(const pgd__tmap *m, pgd_hash block)
{
    for (uint32_t i = home(m, block);; i = (i + 1) & m->mask) {
        uint32_t s = m->by_hash[i];
        if (s == PGD__NONE) return PGD__NONE;
        if (pgd_hash_eq(m->slots[s].hash, block)) return s;
    }
}

/* Live slots whose parent is block (its cluster in by_parent). */
static uint32_t count_children(const pgd__tmap *m, pgd_hash block)
{
    uint32_t n = 0;
    if (is_root(block)) return 0;
    for (uint32_t i = home(m, block);; i = (i + 1) & m->mask) {
        uint32_t s = m->by_parent[i];
        if (s == PGD__NONE) return n;
        if (pgd_hash_eq(m->slots[s].parent, block)) n++;
    }
}

/* ---- insert / remove ---- */

static pgd_policy_page page_info(const pgd__tmap *m, uint32_t s)
{
    const pgd__tmap_slot *sl = &m->slots[s];
    pgd_policy_page info = {
        .hash = sl->hash,
        .depth = sl->depth,
        .priority = sl->priority,
        .expires_ns = sl->expires_s ? sl->expires_s * 1000000000ull : 0,
        .now_ns = map_now_ns((void *)m),
        .tenant = sl->tenant,
        .uses = sl->uses,
        .bytes = m->page_bytes,
        .cost = pgd_cost_model_page(&m->cost, m->page_tokens, sl->depth),
    };
    return info;
}

/* The policy learns that slot s stopped (is_leaf 0) or started being a leaf. */
static void pol_leaf(pgd__tmap *m, uint32_t s, int is_leaf)
{
    if (m->pol->leaf) m->pol->leaf(m->pol_state, s, is_leaf);
}

/* Slot s (live, unpinned, out of the policy's set) joins the policy: insert, its leaf
 * state when it has children already, release. */
static void pol_enter(pgd__tmap *m, uint32_t s)
{
    pgd_policy_page info = page_info(m, s);
    m->pol->insert(m->pol_state, s, &info);
    if (m->slots[s].n_children) pol_leaf(m, s, 0);
    m->pol->unreferenced(m->pol_state, s, &info);
}

/* ---- the expiry list ---- */

static void exp_link(pgd__tmap *m, uint32_t s)
{
    m->exp_prev[s] = PGD__NONE;
    m->exp_next[s] = m->exp_head;
    if (m->exp_head != PGD__NONE) m->exp_prev[m->exp_head] = s;
    m->exp_head = s;
    if (m->slots[s].expires_s < m->next_exp_s) m->next_exp_s = m->slots[s].expires_s;
}

static void exp_unlink(pgd__tmap *m, uint32_t s)
{
    uint32_t p = m->exp_prev[s], n = m->exp_next[s];
    if (p != PGD__NONE)
        m->exp_next[p] = n;
    else
        m->exp_head = n;
    if (n != PGD__NONE) m->exp_prev[n] = p;
    if (m->exp_head == PGD__NONE) m->next_exp_s = UINT64_MAX;
}

uint32_t pgd__tmap_insert(pgd__tmap *m, pgd_hash block, pgd_hash parent)
{
    PGD_CHECK(pgd__tmap_find(m, block) == PGD__NONE);
    if (pgd_hash_eq(parent, block)) parent = no_parent; /* crafted: its own parent */
    uint32_t s = m->free_head;
    if (s == PGD__NONE) return PGD__NONE;
    m->free_head = m->next_free[s];
    pgd__tmap_slot *sl = &m->slots[s];
    sl->hash = block;
    sl->parent = parent;
    sl->pins = 0;
    sl->live = 1;
    sl->priority = PGD_PRIORITY_DEFAULT;
    sl->n_children = count_children(m, block);
    sl->depth = 0;
    if (!is_root(parent)) {
        uint32_t p = pgd__tmap_find(m, parent);
        if (p != PGD__NONE) {
            if (m->slots[p].n_children++ == 0) pol_leaf(m, p, 0);
            sl->depth = m->slots[p].depth + 1;
        }
        tab_insert(m, m->by_parent, s);
    }
    tab_insert(m, m->by_hash, s);
    m->n_live++;
    pol_enter(m, s);
    return s;
}

void pgd__tmap_remove(pgd__tmap *m, uint32_t s)
{
    PGD_CHECK(s < m->capacity && m->slots[s].live);
    pgd__tmap_slot *sl = &m->slots[s];
    uint32_t p = PGD__NONE;
    if (!is_root(sl->parent)) {
        p = pgd__tmap_find(m, sl->parent);
        if (p != PGD__NONE) {
            PGD_CHECK(m->slots[p].n_children > 0);
            m->slots[p].n_children--;
        }
        tab_remove(m, m->by_parent, s);
    }
    tab_remove(m, m->by_hash, s);
    m->pol->remove(m->pol_state, s);
    if (p != PGD__NONE && m->slots[p].n_children == 0) pol_leaf(m, p, 1);
    if (sl->pins) m->n_pinned--;
    if (sl->expires_s) exp_unlink(m, s);
    if (sl->retained) m->pinned_bytes -= sl->pin_bytes;
    if (sl->tagged) m->t_held[sl->tenant]--;
    memset(sl, 0, sizeof *sl);
    m->next_free[s] = m->free_head;
    m->free_head = s;
    m->n_live--;
}

/* ---- order and pins ---- */

void pgd__tmap_touch(pgd__tmap *m, uint32_t s)
{
    PGD_CHECK(s < m->capacity && m->slots[s].live);
    m->slots[s].uses++;
    if (m->slots[s].pins) return; /* it becomes the newest when unpinned */
    pgd_policy_page info = page_info(m, s);
    m->pol->hit(m->pol_state, s, &info);
    m->pol->unreferenced(m->pol_state, s, &info);
}

void pgd__tmap_pin(pgd__tmap *m, uint32_t s)
{
    PGD_CHECK(s < m->capacity && m->slots[s].live);
    if (m->slots[s].pins++ == 0) {
        m->n_pinned++;
        pgd_policy_page info = page_info(m, s);
        m->pol->hit(m->pol_state, s, &info);
    }
}

void pgd__tmap_unpin(pgd__tmap *m, uint32_t s)
{
    PGD_CHECK(s < m->capacity && m->slots[s].live && m->slots[s].pins > 0);
    if (--m->slots[s].pins == 0) {
        m->n_pinned--;
        pgd_policy_page info = page_info(m, s);
        m->pol->unreferenced(m->pol_state, s, &info);
    }
}

static int accept_leaf(void *ctx, uint32_t s)
{
    const pgd__tmap *m = ctx;
    return s < m->capacity && m->slots[s].live && !m->slots[s].pins && !m->slots[s].n_children;
}

/* A leaf that the quotas let go: not a record of a tenant holding no more than its
 * reservation. */
static int accept_quota(void *ctx, uint32_t s)
{
    const pgd__tmap *m = ctx;
    if (!accept_leaf(ctx, s)) return 0;
    if (!m->n_reserved || !m->slots[s].tagged) return 1;
    uint32_t t = m->slots[s].tenant;
    return !(m->t_share[t] > 0) || m->t_held[t] > (uint32_t)(m->t_share[t] * m->capacity);
}

static int accept_unpinned(void *ctx, uint32_t s)
{
    const pgd__tmap *m = ctx;
    return s < m->capacity && m->slots[s].live && !m->slots[s].pins;
}

/* The first expired unpinned leaf on the expiry list, or PGD__NONE. */
static uint32_t expired_leaf(pgd__tmap *m)
{
    if (m->exp_head == PGD__NONE) return PGD__NONE;
    uint64_t now = map_now_s(m);
    if (now < m->next_exp_s) return PGD__NONE;
    uint64_t next = UINT64_MAX;
    for (uint32_t s = m->exp_head; s != PGD__NONE; s = m->exp_next[s]) {
        uint64_t e = m->slots[s].expires_s;
        if (e <= now && accept_quota(m, s)) return s; /* next_exp_s stays <= now */
        if (e < next) next = e;
    }
    m->next_exp_s = next;
    return PGD__NONE;
}

uint32_t pgd__tmap_victim(pgd__tmap *m)
{
    uint32_t s = expired_leaf(m);
    if (s != PGD__NONE) return s;
    s = m->pol->victim(m->pol_state, accept_quota, m);
    if (s != PGD_POLICY_NO_PAGE) return accept_quota(m, s) ? s : PGD__NONE; /* policy.h */
    if (m->n_reserved) return PGD__NONE; /* what is left is reserved */
    /* No leaf, nothing pinned, slots left: the parents form a cycle (A names B, B names
     * A), which only crafted records make; a forest always has a leaf. Evict in the
     * policy's order then, so that such records cannot fill a tier for good. */
    if (m->n_pinned || !m->pol->size(m->pol_state)) return PGD__NONE;
    s = m->pol->victim(m->pol_state, accept_unpinned, m);
    return s != PGD_POLICY_NO_PAGE && accept_unpinned(m, s) ? s : PGD__NONE;
}

const pgd__tmap_slot *pgd__tmap_slot_get(const pgd__tmap *m, uint32_t s)
{
    PGD_CHECK(s < m->capacity && m->slots[s].live);
    return &m->slots[s];
}

/* ---- retention ---- */

void pgd__tmap_set_share(pgd__tmap *m, uint32_t tenant, double share)
{
    if (tenant >= PGD__TMAP_TENANTS) return;
    if (!(share > 0)) share = 0;
    m->n_reserved += (share > 0) - (m->t_share[tenant] > 0);
    m->t_share[tenant] = share;
}

double pgd__tmap_share(const pgd__tmap *m, uint32_t tenant)
{
    return tenant < PGD__TMAP_TENANTS ? m->t_share[tenant] : 0;
}

int pgd__tmap_retain(pgd__tmap *m, uint32_t s, const pgd_tier_retention *r, uint64_t bytes)
{
    PGD_CHECK(s < m->capacity && m->slots[s].live);
    pgd__tmap_slot *sl = &m->slots[s];
    if (r->pin > 0 && !sl->retained &&
        (bytes > m->pin_limit || m->pinned_bytes > m->pin_limit - bytes))
        return PGD_ENOSPC;
    uint32_t prio = r->priority > PGD_PRIORITY_MAX ? PGD_PRIORITY_MAX : r->priority;
    uint64_t exp = r->ttl_s ? map_now_s(m) + r->ttl_s : 0;
    uint32_t ten = r->tenant_index < PGD__TMAP_TENANTS ? r->tenant_index : PGD__TMAP_TENANTS - 1;
    double share = r->tenant_share > 0 ? (r->tenant_share < 1 ? r->tenant_share : 1) : 0;
    if (share > 0) pgd__tmap_set_share(m, ten, share); /* 0: leaves a reservation */
    if (sl->tagged) m->t_held[sl->tenant]--;
    sl->tagged = 1;
    m->t_held[ten]++;
    if (prio != sl->priority || exp != sl->expires_s || ten != sl->tenant) {
        int in_set = !sl->pins;
        if (in_set) m->pol->remove(m->pol_state, s);
        if (sl->expires_s) exp_unlink(m, s);
        sl->priority = prio;
        sl->expires_s = exp;
        sl->tenant = ten;
        if (exp) exp_link(m, s);
        if (in_set) pol_enter(m, s);
    }
    if (r->pin > 0 && !sl->retained) {
        sl->retained = 1;
        sl->pin_bytes = bytes;
        m->pinned_bytes += bytes;
        pgd__tmap_pin(m, s);
    } else if (r->pin < 0 && sl->retained) {
        sl->retained = 0;
        m->pinned_bytes -= sl->pin_bytes;
        sl->pin_bytes = 0;
        pgd__tmap_unpin(m, s);
    }
    return PGD_OK;
}

void pgd__tmap_restore(pgd__tmap *m, uint32_t s, const pgd__tmap_slot *from)
{
    PGD_CHECK(s < m->capacity && m->slots[s].live && !m->slots[s].retained);
    pgd__tmap_slot *sl = &m->slots[s];
    int in_set = !sl->pins;
    if (in_set) m->pol->remove(m->pol_state, s);
    if (sl->expires_s) exp_unlink(m, s);
    sl->priority = from->priority;
    if (sl->tagged) m->t_held[sl->tenant]--;
    sl->tenant = from->tenant;
    sl->tagged = from->tagged;
    if (sl->tagged) m->t_held[sl->tenant]++;
    sl->uses = from->uses;
    sl->expires_s = from->expires_s;
    if (sl->expires_s) exp_link(m, s);
    if (in_set) pol_enter(m, s);
    if (from->retained) {
        sl->retained = 1;
        sl->pin_bytes = from->pin_bytes;
        m->pinned_bytes += from->pin_bytes;
        pgd__tmap_pin(m, s);
    }
}

void pgd__tmap_set_pin_limit(pgd__tmap *m, uint64_t bytes)
{
    m->pin_limit = bytes;
}

uint64_t pgd__tmap_pinned_bytes(const pgd__tmap *m)
{
    return m->pinned_bytes;
}

void pgd__tmap_set_clock(pgd__tmap *m, pgd_clock_fn clock, void *ud)
{
    m->clock = clock;
    m->clock_ud = ud;
    m->next_exp_s = m->exp_head == PGD__NONE ? UINT64_MAX : 0; /* another time base */
}

const pgd_policy_ops *pgd__tier_policy_ops(int kind, const char *tier, const pgd__log *lg)
{
    const pgd_policy_ops *ops = NULL;
    if (kind >= 0 && kind < PGD_POLICY_COUNT && kind != PGD_POLICY_BELADY)
        ops = pgd_policy_builtin((pgd_policy_kind)kind);
    if (ops) return ops;
    char names[128] = "";
    size_t len = 0;
    for (int k = 0; k < PGD_POLICY_COUNT; k++) {
        if (k == PGD_POLICY_BELADY || !pgd_policy_builtin((pgd_policy_kind)k)) continue;
        int w = snprintf(names + len, sizeof names - len, "%s%s", len ? ", " : "",
                         pgd_policy_name((pgd_policy_kind)k));
        if (w < 0 || (size_t)w >= sizeof names - len) break;
        len += (size_t)w;
    }
    if (kind == PGD_POLICY_BELADY)
        pgd__logf(lg, PGD_LOG_ERROR,
                  "%s tier: policy belady needs the future (replay only); a tier takes %s", tier,
                  names);
    else if (kind >= 0 && kind < PGD_POLICY_COUNT)
        pgd__logf(lg, PGD_LOG_ERROR,
                  "%s tier: policy %d is not built into this libpagoda; valid: %s", tier, kind,
                  names);
    else
        pgd__logf(lg, PGD_LOG_ERROR, "%s tier: unknown policy %d; valid: %s", tier, kind, names);
    return NULL;
}

double pgd__tier_pin_share(double share)
{
    if (share == 0.0) return 0.5;
    return share > 0.0 && share <= 1.0 ? share : -1.0;
}

/* ---- check ---- */

int pgd__tmap_check(const pgd__tmap *m, const pgd__log *lg)
{
    uint32_t n_tab = m->mask + 1, n_live = 0, n_free = 0, n_unpinned = 0;
    uint32_t in_hash = 0, in_parent = 0, want_parent = 0;
    for (uint32_t i = 0; i < n_tab; i++) {
        uint32_t s = m->by_hash[i];
        if (s != PGD__NONE) {
            if (s >= m->capacity || !m->slots[s].live || pgd__tmap_find(m, m->slots[s].hash) != s)
                goto bad_table;
            in_hash++;
        }
        s = m->by_parent[i];
        if (s != PGD__NONE) {
            if (s >= m->capacity || !m->slots[s].live || is_root(m->slots[s].parent) ||
                position(m, m->by_parent, s) != i)
                goto bad_table;
            in_parent++;
        }
    }
    for (uint32_t s = 0; s < m->capacity; s++) {
        const pgd__tmap_slot *sl = &m->slots[s];
        int in_set = m->pol->contains(m->pol_state, s);
        if (!sl->live) {
            if (in_set) goto bad_slot;
            continue;
        }
        n_live++;
        if (!is_root(sl->parent)) want_parent++;
        if (!sl->pins) n_unpinned++;
        if (in_set != !sl->pins) goto bad_slot;
        /* Brute force: the children of s are the live slots whose parent is s's block. */
        uint32_t kids = 0;
        for (uint32_t c = 0; c < m->capacity; c++)
            if (m->slots[c].live && pgd_hash_eq(m->slots[c].parent, sl->hash) && !is_root(sl->hash))
                kids++;
        if (kids != sl->n_children) {
            pgd__logf(lg, PGD_LOG_ERROR, "tier map check: slot %u counts %u children, has %u", s,
                      sl->n_children, kids);
            return PGD_ECORRUPT;
        }
    }
    uint32_t n_exp = 0, n_exp_live = 0, held[PGD__TMAP_TENANTS] = {0}, n_res = 0;
    uint64_t pin_bytes = 0;
    for (uint32_t t = 0; t < PGD__TMAP_TENANTS; t++)
        n_res += m->t_share[t] > 0;
    for (uint32_t s = 0; s < m->capacity; s++) {
        if (!m->slots[s].live) continue;
        if (m->slots[s].tagged) {
            if (m->slots[s].tenant >= PGD__TMAP_TENANTS) goto bad_quota;
            held[m->slots[s].tenant]++;
        }
        if (m->slots[s].expires_s) n_exp_live++;
        if (m->slots[s].retained) pin_bytes += m->slots[s].pin_bytes;
        if (m->slots[s].retained && !m->slots[s].pins) goto bad_slot;
    }
    if (n_res != m->n_reserved || memcmp(held, m->t_held, sizeof held)) goto bad_quota;
    for (uint32_t s = m->exp_head; s != PGD__NONE; s = m->exp_next[s])
        if (s >= m->capacity || !m->slots[s].live || !m->slots[s].expires_s ||
            ++n_exp > m->capacity || m->slots[s].expires_s < m->next_exp_s) {
            pgd__logf(lg, PGD_LOG_ERROR, "tier map check: bad expiry list at %u", s);
            return PGD_ECORRUPT;
        }
    if (n_exp != n_exp_live || pin_bytes != m->pinned_bytes) {
        pgd__logf(lg, PGD_LOG_ERROR,
                  "tier map check: %u on the expiry list (want %u), %llu pinned bytes (want %llu)",
                  n_exp, n_exp_live, (unsigned long long)m->pinned_bytes,
                  (unsigned long long)pin_bytes);
        return PGD_ECORRUPT;
    }
    for (uint32_t s = m->free_head; s != PGD__NONE; s = m->next_free[s])
        if (s >= m->capacity || m->slots[s].live || ++n_free > m->capacity) {
            pgd__logf(lg, PGD_LOG_ERROR, "tier map check: bad free list at %u", s);
            return PGD_ECORRUPT;
        }
    if (n_live != m->n_live || in_hash != n_live || in_parent != want_parent ||
        n_live - n_unpinned != m->n_pinned || n_live + n_free != m->capacity ||
        m->pol->size(m->pol_state) != n_unpinned) {
        pgd__logf(lg, PGD_LOG_ERROR,
                  "tier map check: %u live (%u counted), %u in by_hash, %u in by_parent "
                  "(want %u), %u free, policy set %u (want %u)",
                  n_live, m->n_live, in_hash, in_parent, want_parent, n_free,
                  m->pol->size(m->pol_state), n_unpinned);
        return PGD_ECORRUPT;
    }
    return PGD_OK;
bad_table:
    pgd__logf(lg, PGD_LOG_ERROR, "tier map check: a table holds a bad slot");
    return PGD_ECORRUPT;
bad_slot:
    pgd__logf(lg, PGD_LOG_ERROR, "tier map check: the policy's set disagrees with the pins");
    return PGD_ECORRUPT;
bad_quota:
    pgd__logf(lg, PGD_LOG_ERROR, "tier map check: the tenants' record counts disagree");
    return PGD_ECORRUPT;
}
