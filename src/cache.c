/* SPDX-License-Identifier: MIT */
/*
 * cache.c - the cache manager: pool + prefix index + eviction policy, behind one lock.
 *
 * Who holds a page (its pool refcount counts them all):
 *   - every sequence whose page table lists it (once per sequence), and
 *   - the prefix index, once, while the page is registered (cached).
 * So a cached page is evictable exactly when its refcount is 1 (only the index holds it);
 * the policy holds exactly those pages, and page_entry[] maps a page to its index entry.
 *
 *   seq A: [p0][p1][p2][p3*]        p0..p2 registered (full, immutable), p3 partial
 *   seq B: [p0][p1][q2]              B shares A's prefix p0,p1 (matched), q2 its own
 *   index: h0->p0, h1->p1 (parent h0), h2->p2 (parent h1), h2'->q2 (parent h1)
 *
 * The index may be larger than the pool (params.index_capacity): an entry's location is a
 * pool page (tier 0) today; page_entry[] is the reverse map for pool pages.
 * Events: on_register when register_page inserts an entry, on_evict in evict_one before
 * the entry is removed and the page freed (so the payload is readable); both under c->mu.
 * Hashing: a token-mode sequence hashes each full page once: under the lock in match and
 * commit, unless the caller passes the hashes (match_hashed / commit_hashed), computed
 * before the lock is taken (the scheduler hashes each prompt once at submit).
 * Retention (cache.h "Retention"): ret[] holds each pool page's priority, expiry, next-use
 * hint, pin count and uses, reset when the page is registered; a sequence's retention is
 * merged into its registered pages at its release (retention_merge). The pins of a page hold
 * one pool reference together, so a pinned page is out of the policy's set as a held page
 * is. Two indexed min-heaps: the expiry heap (evictable leaves with an expiry: pick_victim
 * takes its top before asking the policy once it has passed) and the pin heap (pins with a
 * TTL, ended lazily by pins_expire before a victim is chosen or pages are counted). The pin
 * budget: pinned pages + the pages sequences reserved (pgd_seq_set_retention) <= max_pins
 * (pin_share of the pool). Hints: a fixed array of PGD__MAX_HINTS copied chains.
 * Tenants (cache.h "tenants"; the table is tenants.c): each sequence has a tenant index
 * (its salt's entry, taken at create); page_tenant[p] is the tenant a cached page is
 * charged to (set at register, uncharged at eviction). An eviction for a sequence goes
 * through pick_victim's quota filters (own pages, then over-share pages) only while some
 * tenant has a reservation; otherwise the victims are the policy's alone.
 * Invariants (checked by pgd_cache_check):
 *   refcount(p) == #tables holding p + (page_entry[p] != NONE) + (pins(p) > 0)
 *   policy contains p  <=>  page_entry[p] != NONE && refcount(p) == 1
 *   expiry heap holds p  <=>  policy contains p && expires(p) && p is a leaf
 *   pin heap holds p  <=>  pins(p) > 0 && pin_until(p) != 0
 *   pages_held(t) == #cached p with page_tenant[p] == t (pages_pinned(t): of those pinned)
 *   a sequence's registered pages form a chain in the index (parent = previous page), so
 *   any sequence holding a page holds all its ancestors; with leaf-only eviction a cached
 *   prefix never loses its middle. A compacted sequence (pgd_seq_compact, the last section)
 *   registers nothing more: its registered pages are the prefix it kept whole, every other
 *   page it holds is its own (or its forks'), never registered.
 * Writes: pgd_seq_write_kv rotates (kv_rotate), encodes with the pool's codec and keeps
 * key bounds. Staged codecs (pgd__codec_staged: kivi2, and q8_0 / q4_0 with head_dim < 32,
 * whose blocks span several rows) never encode a page piecemeal: each sequence owns an f16
 * residual ring
 *
 *     ring = [n_layers][K|V][n_kv_heads][window][head_dim] f16, position p in slot p % window
 *
 * and a page's region of a layer is encoded from the ring, once, when that layer's write
 * fills the page's last slot. So every full page is encoded (full pages may be shared), and
 * from the same f16 rows whatever the path (one prefill, chunks, one token at a time,
 * recompute after preemption): a full page's bytes depend only on its K/V values. Per
 * sequence: ring_lo (a page start) is the lowest position whose ring copy is valid (0, or
 * the matched length after a match, raised by truncation), hi the highest position written
 * plus one (hi <= len). window (>= params.kv_residual) grows when a write spans more than
 * it, so the ring always holds the whole page of every position a write just wrote.
 * Attention (pgd__seq_residual) reads, for a query row at position r, the rows of r's own
 * page from the ring and every earlier page from the pool: the source of a key depends only
 * on (key, query) positions, never on how the sequence was computed.
 * Tiers (params.tiers; cache.h "Tiers"): the index describes pool pages only; each tier
 * indexes its own records, and the cache asks them (pgd_tier_lookup, fastest first, under
 * c->mu: lock order cache, then tier; a remote tier only for promotion, see holds()). Moves run on
 * mover threads (tier/mover.c), never holding c->mu during I/O: write-back  evict_one -> demote:
 * the page (+ key bounds) is copied into a free slot of the write-back slab and a job puts it in
 * tiers[0] (what a tier evicts spills to the next); no free slot: dropped, counted. Write-through
 * (at register or the admit_hits-th match) and park use the same slots. promotion   match ->
 * promote: pool pages for the run of blocks the tiers hold, filled by up to tier_threads jobs
 * (contiguous sub-ranges, on the movers' fill class: ahead of every put); the sequence's len /
 * n_committed include the run while n_full stays at the pool prefix until settle() registers the
 *               pages (a failed fill cuts the sequence back). Every call that mutates a
 *               sequence waits on c->cv for its promotion first; pgd_cache_destroy drains
 *               the movers first.
 * Callers: engines, the server, tools. Every public call takes c->mu.
 */
#include <math.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "pgd_int.h"
#include "tenants.h"

enum { MODE_NONE = 0, MODE_TOKENS = 1, MODE_HASHES = 2 };

struct pgd_seq {
    pgd_seq *prev, *next; /* live sequences of the cache */
    uint32_t *table;      /* [cap] page ids; n_pages used */
    uint32_t n_pages, cap;
    uint64_t len;              /* positions reserved (match + grow) */
    uint64_t n_committed;      /* tokens committed (match + commit) */
    uint32_t n_full;           /* full pages committed: n_committed / page_tokens */
    int mode;                  /* MODE_*: how pages are hashed */
    int unregistrable;         /* a hash conflict broke the chain: register nothing more */
    uint32_t last_entry;       /* index entry of page n_full-1, PGD__NONE if none */
    pgd_hash last;             /* hash of page n_full-1, or the seed */
    pgd_hash seed;             /* the chain seed h_{-1}; immutable after create (read unlocked) */
    int32_t *partial;          /* [page_tokens] tokens of the page being filled */
    uint16_t *ring;            /* staged codecs: f16 ring (see the header), NULL until needed */
    uint32_t window;           /* ring rows per (layer, K|V, head); 0 while ring is NULL */
    uint64_t ring_lo;          /* staged: lowest position with a valid ring copy; page start */
    uint64_t hi;               /* highest position written by pgd_seq_write_kv, plus one */
    struct promo *promo;       /* the pending promotion of pages n_full.. (tiers), or NULL */
    uint32_t match_pool_pages; /* pgd_seq_match_info: pool pages matched */
    uint32_t match_tier_pages[PGD_MAX_TIERS]; /* and pages promoted from each tier */
    uint32_t tenant;                          /* its tenant's index (tenants.h) */
    pgd_retention ret; /* pgd_seq_set_retention (merged into its pages at release) */
    int has_ret;       /* ret was set: else the default, merged on a fast path */
    int internal;      /* pgd_cache_warm's own sequence: releases without a merge */
    uint32_t pin_resv; /* pages reserved against the pin budget (c->pin_reserved) */
    /* Compaction (pgd_seq_compact; see the section at the end). */
    int compacted;      /* compacted once: registers nothing more, commit only counts */
    uint64_t n_dropped; /* slots dropped so far: a slot's token position is slot + this */
    uint32_t *n_live;   /* [n_layers * n_kv_heads] live slots of (l, h) below mask_len, or
                           NULL: no dead slots */
    uint32_t mask_len;  /* slots [n_live[i], mask_len) of (l, h) are dead; 0 without mask */
    /* Window layers (the section "window layers" at the end). */
    pgd_seq *win;        /* its sequence in c->win (same positions), or NULL */
    uint32_t first_live; /* a window group's sequence: table[0 .. first_live) released */
};

/* The retention of a pool page (cache.h "Retention"; reset when it is registered). A page
 * is pinned when pins > 0: the pins hold one pool reference together, so a pinned page is
 * out of the policy's set exactly as a page a sequence holds. */
typedef struct page_ret {
    uint64_t expires_ns;   /* 0: none */
    uint64_t next_use_ns;  /* 0: no hint */
    uint64_t pin_until_ns; /* while pinned: the pins end then (pin heap); 0: until unpinned */
    uint32_t uses;         /* matches (and dedups) of the page since it was registered */
    uint32_t pins;         /* pin count */
    uint32_t heap_pos[2];  /* position in c->heap[HEAP_EXPIRY / HEAP_PIN], or PGD__NONE */
    uint8_t priority;      /* 0..100 */
    uint8_t used;          /* released once: later releases merge (else they set) */
} page_ret;

/* Two indexed min-heaps of pool pages: HEAP_EXPIRY holds the evictable leaves with an
 * expiry (keyed by expires_ns), HEAP_PIN the pinned pages whose pins end (pin_until_ns). */
enum { HEAP_EXPIRY = 0, HEAP_PIN = 1 };
typedef struct page_heap {
    uint32_t *a; /* [n_pages] */
    uint32_t n;
} page_heap;

/* A next-use hint (pgd_cache_hint): a copied chain and its tenant's salt, one block. */
#define PGD__MAX_HINTS 256
typedef struct hint {
    pgd_hash *hashes; /* [n] then salt_len bytes; NULL: a free entry */
    size_t n, salt_len;
    uint64_t due_ns;
} hint;

/* One fill job of a promotion: pages [lo, hi) of its run. */
typedef struct fill {
    pgd__job job; /* first member: the mover's node */
    struct promo *pr;
    uint32_t lo, hi;
} fill;

/* A promotion: the run of pages [k0, k0 + n) of s that the tiers hold, allocated in the
 * pool by match and filled by n_fills mover jobs (contiguous sub-ranges, in parallel);
 * settle() registers it under the lock once the last of them is done. */
typedef struct promo {
    pgd_cache *c;
    pgd_seq *s;
    uint32_t k0, n;   /* the run: pages k0 .. k0+n-1 of s */
    uint32_t n_fills; /* jobs: fills[n_fills] */
    uint32_t n_left;  /* jobs not finished (under c->mu) */
    int done;         /* set by the last job under c->mu; then result[] is final */
    fill *fills;      /* [n_fills] */
    pgd_hash *hashes; /* [n] block hashes */
    uint32_t *pages;  /* [n] pool pages (also s->table[k0 ..]) */
    uint8_t *src;     /* [n] the tier each page is read from (set by match) */
    uint8_t *from;    /* [n] the tier each page was read from (set by the job: final once
                         done; a record may have spilled one tier down meanwhile) */
    uint8_t *origin;  /* [n] 1 + the tier a prefetch moved the block up from, or 0 (set by
                         match from c->origin: what pgd_seq_match_info reports) */
    int *result;      /* [n] the fill's status; PROMO_SKIPPED after the first failure (once
                         done: a job past it may have read its own pages, not counted) */
} promo;

/* A write-back slot: one page copied out of the pool (page bytes, then bounds bytes) and
 * the job that writes it to a tier, or (prefetch) a buffer for a move between tiers. */
enum { SLOT_FREE = 0, SLOT_PUT = 1, SLOT_PREFETCH = 2 };
#define PGD__ORIGIN_SLOTS 1024 /* power of two */
typedef struct wb_slot {
    pgd__job job; /* first member: the mover's node */
    pgd_cache *c;
    uint8_t *buf; /* [slot_bytes] in c->slab */
    pgd_hash block, parent;
    uint32_t tier; /* PUT: the tier written (spills go below it); PREFETCH: read from */
    int kind;      /* SLOT_* */
    int has_ret;   /* PUT: the page's retention is not the default: retain after it */
    pgd_tier_retention ret;
    uint32_t next_free; /* free list link, PGD__NONE at its end */
} wb_slot;

struct pgd_cache {
    pthread_mutex_t mu;
    pgd__alloc al;
    pgd__log log;
    pgd_pool *pool;
    pgd__index *ix;
    const pgd_policy_ops *pol;
    void *pstate;
    pgd_register_fn on_register; /* events (cache.h), called under mu */
    pgd_evict_fn on_evict;
    void *event_ud;
    pgd__hasher hasher;
    uint32_t page_tokens;
    uint32_t n_pages;
    uint32_t *page_entry;  /* [n_pages] index entry of a cached page, or PGD__NONE */
    uint16_t *page_tenant; /* [n_pages] tenant charged for a cached page (valid while cached) */
    pgd__tenants tn;       /* the tenant table: quotas and per-tenant stats (tenants.c) */
    pgd_seq *seqs;         /* list of live sequences */
    uint32_t n_seqs, max_seqs;
    pgd_cache_stats st; /* counters; gauges are filled in get_stats */
    const pgd__codec *codec;
    pgd__pool_geom g;
    uint32_t window;  /* staged codecs: least ring rows of a sequence; 0 for other codecs */
    size_t row_elems; /* f16 elements of one ring row over every (layer, K|V, head) */
    float *scratch;   /* [page_tokens * head_dim + 2 * head_dim] for write_kv (lock held) */
    /* Tiers (immutable after create, so mover jobs read these fields unlocked). */
    uint32_t n_tiers;
    pgd_tier_use tiers[PGD_MAX_TIERS];
    pgd_record_ident ident; /* of every record this cache writes and reads */
    pgd__mover *mover;      /* NULL without tiers */
    uint32_t n_movers;      /* mover threads per class: most fill jobs of one promotion */
    uint32_t wt_register;   /* bit t: tiers[t] is write-through at register (admit_hits 0) */
    uint32_t wt_admit;      /* bit t: tiers[t] is write-through at its admit_hits-th match */
    uint32_t remote;        /* bit t: tiers[t] is remote (pgd_tier_stats.remote): see holds() */
    /* Tier state (under mu). */
    pthread_cond_t cv; /* a promotion finished (waited on with mu) */
    uint8_t *slab;     /* [n_slots][slot_bytes] write-back buffers */
    wb_slot *slots;    /* [n_slots] */
    uint32_t n_slots, slot_free, n_slots_busy;
    uint64_t slot_bytes; /* page_bytes + bounds_bytes, rounded up to 64 */
    uint8_t *sketch;     /* write-through admission (wt_admit): matches of each block over
                            its whole life, a count-min sketch of 2 rows of sketch_mask + 1
                            saturating counters (see sketch_hit); NULL without wt_admit */
    uint32_t sketch_mask;
    uint32_t n_promos;     /* pending promotion records */
    int warned_full;       /* the write-back queue was full once (logged once) */
    pgd_hash *scan_hashes; /* [scan_cap] match's look-up past the pool (lock held) */
    uint8_t *scan_src;     /* [scan_cap] the tier holding each */
    size_t scan_cap;
    pgd_cache_tier_stats tst[PGD_MAX_TIERS];
    /* Where prefetched blocks came from, for the usage split: a block that
     * pgd_cache_prefetch moved from tier T up into tiers[0] is reported by the match that
     * promotes it as found in T (where it was when its request was queued), not in
     * tiers[0]. Direct-mapped on the hash (a collision forgets the older block: it is then
     * reported as tiers[0]'s); entries are cleared when a match consumes them. */
    struct {
        pgd_hash block;
        uint8_t tier; /* 1 + T; 0: empty */
    } origin[PGD__ORIGIN_SLOTS];
    /* Retention (immutable after create: clock, cost, page_bytes, max_pins). */
    pgd_clock_fn clock;
    void *clock_ud;
    pgd_cost_model cost;   /* resolved */
    uint64_t page_bytes;   /* pool page + key bounds */
    page_ret *ret;         /* [n_pages] (under mu, as the rest) */
    page_heap heap[2];     /* HEAP_EXPIRY, HEAP_PIN */
    uint32_t n_pinned;     /* pages with pins > 0 */
    uint32_t pin_reserved; /* pages sequences reserved for pins at their release */
    uint32_t max_pins;     /* pin_share of the pool's pages */
    hint *hints;           /* [PGD__MAX_HINTS] */
    uint32_t n_hints;
    uint64_t now;  /* the clock as now_ns read it in this locked section */
    int now_valid; /* now was read since the lock was taken */
    /* Window layers (immutable after create; the section "window layers" at the end). */
    pgd_cache *win;        /* the window layers' group, a cache of its own, or NULL */
    uint32_t win_tokens;   /* W, in this cache and in its group */
    uint32_t n_layers_all; /* the model's layers (both groups) */
    uint8_t *layer_group;  /* [n_layers_all] 1: a window layer; NULL without window layers */
    uint32_t *layer_local; /* [n_layers_all] the layer's index in its group's pool */
    int flat;              /* this cache is a window group: entries have no parent, any
                              unheld page is evictable, sequences release their old pages */
    uint64_t n_released;   /* flat: pages sequences released as their windows slid */
    uint64_t n_cut_tokens; /* matches' hit tokens cut back for missing window pages */
};

static void lock(pgd_cache *c);
static void unlock(pgd_cache *c);
static int register_page(pgd_cache *c, pgd_seq *s, uint32_t i, pgd_hash h);
static void mask_clip(pgd_cache *c, pgd_seq *s, uint32_t n);
static void wait_locked(pgd_cache *c, pgd_seq *s);
static void promote(pgd_cache *c, pgd_seq *s, const int32_t *tokens, const pgd_hash *hashes,
                    size_t n_hashes, size_t n_pages, uint32_t k);
static void demote(pgd_cache *c, uint32_t entry, uint32_t page);
static void write_through(pgd_cache *c, uint32_t mask, uint32_t entry, uint32_t page);
static int hint_insert(pgd_cache *c, pgd_hash *copy, size_t n, size_t salt_len, uint64_t due_ns);
static int create_windowed(const pgd_cache_params *p, pgd_cache **out);
static void window_release(pgd_cache *w, pgd_seq *s, uint64_t q);
static int window_check(pgd_cache *c);

pgd_cache_params pgd_cache_default_params(void)
{
    pgd_cache_params p;
    memset(&p, 0, sizeof p);
    p.pool = pgd_pool_default_params();
    p.policy = PGD_POLICY_LRU;
    return p;
}

/* ---- create / destroy ---- */

/* Refuses tier lists the cache cannot use: too many, a NULL tier, or a pool whose pages
 * have no host payload to copy (metadata-only, device arena). Pure. */
static int tiers_check(const pgd_cache_params *p, const pgd__log *lg)
{
    if (p->n_tiers == 0) return PGD_OK;
    const char *why = NULL;
    if (p->n_tiers > PGD_MAX_TIERS)
        why = "more tiers than PGD_MAX_TIERS";
    else if (!p->tiers)
        why = "n_tiers without a tiers array";
    else if (p->pool.metadata_only)
        why = "a metadata-only pool has no pages to move";
    else if (p->pool.arena_device)
        why = "a device arena cannot be copied on the host";
    for (uint32_t i = 0; !why && i < p->n_tiers; i++)
        if (!p->tiers[i].tier) why = "a NULL tier";
    if (!why) return PGD_OK;
    pgd__logf(lg, PGD_LOG_ERROR, "cache: %u tiers refused: %s", p->n_tiers, why);
    return PGD_EINVAL;
}

/* Binds the tiers to the cache's record identity and reserves what moves need: the
 * write-back slab, the admission counters and the mover threads. Returns PGD_OK,
 * PGD_EINVAL, a bind's PGD_EBUSY / PGD_EIO, or PGD_ENOMEM; tiers_destroy undoes a partial
 * setup. Called by create before the cache is visible (no lock needed). */
static int tiers_create(pgd_cache *c, const pgd_cache_params *p, const pgd_pool_params *pp)
{
    if (p->n_tiers == 0) return PGD_OK;
    int rc = pgd_record_ident_make(pp, p->model_fingerprint, &c->ident);
    if (rc != PGD_OK) return rc;
    /* Moves copy exactly these many bytes of a page and of its bounds. */
    PGD_CHECK(c->ident.page_bytes == pgd_pool_page_bytes(c->pool));
    PGD_CHECK(c->ident.bounds_bytes == (c->g.key_bounds ? 2ull * c->g.n_layers * c->g.n_kv_heads *
                                                              c->g.head_dim * sizeof(float)
                                                        : 0));
    for (uint32_t i = 0; i < p->n_tiers; i++) {
        const pgd_tier_use *u = &p->tiers[i];
        rc = pgd_tier_bind(u->tier, &c->ident);
        if (rc != PGD_OK) {
            pgd__logf(&c->log, PGD_LOG_ERROR, "cache: tier %u (%s) refused to bind: %s", i,
                      pgd_tier_name(u->tier), pgd_strerror(rc));
            return rc;
        }
        c->tiers[i] = *u;
        if (u->write_through && u->admit_hits == 0) c->wt_register |= 1u << i;
        if (u->write_through && u->admit_hits > 0) c->wt_admit |= 1u << i;
        pgd_tier_stats ts;
        pgd_tier_get_stats(u->tier, &ts);
        if (ts.remote) c->remote |= 1u << i;
    }
    c->n_tiers = p->n_tiers;
    c->slot_bytes = (c->ident.page_bytes + c->ident.bounds_bytes + 63) / 64 * 64;
    c->n_slots = p->writeback_pages ? p->writeback_pages : 256;
    c->slot_free = PGD__NONE;
    if (c->n_slots > SIZE_MAX / 2 / c->slot_bytes || c->n_slots >= PGD__NONE) {
        pgd__logf(&c->log, PGD_LOG_ERROR, "cache: writeback_pages %u is too large", c->n_slots);
        return PGD_EINVAL;
    }
    c->slab = pgd__malloc(&c->al, (size_t)c->n_slots * c->slot_bytes);
    c->slots = pgd__calloc(&c->al, c->n_slots, sizeof *c->slots);
    if (!c->slab || !c->slots) return PGD_ENOMEM;
    for (uint32_t i = c->n_slots; i-- > 0;) {
        c->slots[i].c = c;
        c->slots[i].buf = c->slab + (size_t)i * c->slot_bytes;
        c->slots[i].next_free = c->slot_free;
        c->slot_free = i;
    }
    if (c->wt_admit) {
        /* 4 counters per pool page (at least 4096, at most 2^22) per row: a block evicted
         * and promoted again keeps its count, which a per-page counter would restart. */
        uint64_t rows = 4096;
        while (rows < 4ull * c->n_pages && rows < (1u << 22))
            rows <<= 1;
        c->sketch_mask = (uint32_t)(rows - 1);
        c->sketch = pgd__calloc(&c->al, 2, (size_t)rows);
        if (!c->sketch) return PGD_ENOMEM;
    }
    /* The queue holds every slot's job plus the promotions: one per sequence (max_seqs),
     * else up to 4096 at once, each up to n_threads fill jobs; a full queue refuses a
     * promotion (the engine computes). The fill threads help with puts once half the slab
     * waits (the background threads are behind compute), before a full slab drops pages. */
    uint32_t n_promos = p->max_seqs ? p->max_seqs : 4096;
    uint32_t n_threads = p->tier_threads ? p->tier_threads : 2;
    if (n_threads > 64) {
        pgd__logf(&c->log, PGD_LOG_ERROR, "cache: tier_threads %u is above 64", n_threads);
        return PGD_EINVAL;
    }
    c->n_movers = n_threads;
    uint64_t max_jobs = (uint64_t)c->n_slots + (uint64_t)n_promos * n_threads;
    uint32_t help_depth = c->n_slots / 2 ? c->n_slots / 2 : 1;
    return pgd__mover_create(&c->al, &c->log, n_threads,
                             max_jobs > UINT32_MAX ? UINT32_MAX : (uint32_t)max_jobs, help_depth,
                             &c->mover);
}

/* Stops the movers (running what is queued: nothing may hold mu) and frees the tier
 * state. Partial-safe. */
static void tiers_destroy(pgd_cache *c)
{
    pgd__mover_destroy(c->mover);
    c->mover = NULL;
    pgd__free(&c->al, c->sketch);
    pgd__free(&c->al, c->scan_hashes);
    pgd__free(&c->al, c->scan_src);
    c->scan_hashes = NULL;
    c->scan_src = NULL;
    pgd__free(&c->al, c->slots);
    pgd__free(&c->al, c->slab);
    c->sketch = NULL;
    c->slots = NULL;
    c->slab = NULL;
}

/* A page's retention as registration leaves it: the default, no pin, in no heap. */
static void ret_reset(pgd_cache *c, uint32_t page)
{
    page_ret *r = &c->ret[page];
    memset(r, 0, sizeof *r);
    r->priority = PGD_PRIORITY_DEFAULT;
    r->heap_pos[0] = r->heap_pos[1] = PGD__NONE;
}

/* Frees the retention state (partial-safe; create's failure path and destroy). */
static void retention_free(pgd_cache *c)
{
    for (uint32_t i = 0; c->hints && i < PGD__MAX_HINTS; i++)
        pgd__free(&c->al, c->hints[i].hashes);
    pgd__free(&c->al, c->hints);
    pgd__free(&c->al, c->heap[0].a);
    pgd__free(&c->al, c->heap[1].a);
    pgd__free(&c->al, c->ret);
    c->hints = NULL;
    c->heap[0].a = c->heap[1].a = NULL;
    c->ret = NULL;
}

static uint64_t cache_clock_mono(void *ud)
{
    (void)ud;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int pgd_cache_create(const pgd_cache_params *p, pgd_cache **out)
{
    pgd__alloc al;
    pgd_cache *c = NULL;
    int rc;

    *out = NULL;
    if (!p) return PGD_EINVAL;
    if (p->window_tokens) return create_windowed(p, out);
    pgd__alloc_init(&al, p->alloc ? p->alloc : p->pool.alloc);
    pgd__log lg = {p->log ? p->log : p->pool.log, p->log ? p->log_ud : p->pool.log_ud};
    const pgd_policy_ops *pol = p->policy_ops ? p->policy_ops : pgd_policy_builtin(p->policy);
    if (!pol) {
        pgd__logf(&lg, PGD_LOG_ERROR, "cache: unknown policy %d", (int)p->policy);
        return PGD_EINVAL;
    }
    /* leaf may be NULL: the cache does not call it (policy.h). */
    if (!pol->create || !pol->destroy || !pol->insert || !pol->hit || !pol->unreferenced ||
        !pol->victim || !pol->remove || !pol->contains || !pol->size) {
        pgd__logf(&lg, PGD_LOG_ERROR, "cache: policy_ops has a NULL member");
        return PGD_EINVAL;
    }
    if (!p->policy_ops && p->policy == PGD_POLICY_BELADY && !p->next_use) {
        pgd__logf(&lg, PGD_LOG_ERROR, "cache: the belady policy needs a next_use oracle");
        return PGD_EINVAL;
    }
    if (!(p->pin_share >= 0 && p->pin_share <= 1)) {
        pgd__logf(&lg, PGD_LOG_ERROR, "cache: pin_share must be 0..1");
        return PGD_EINVAL;
    }
    if (p->hash_key && (p->hash_key_len == 0 || p->hash_key_len > 256)) {
        pgd__logf(&lg, PGD_LOG_ERROR, "cache: hash_key_len must be 1..256");
        return PGD_EINVAL;
    }
    rc = tiers_check(p, &lg);
    if (rc != PGD_OK) return rc;
    c = pgd__calloc(&al, 1, sizeof *c);
    if (!c) return PGD_ENOMEM;
    c->al = al;
    c->log = lg;
    c->pol = pol;
    c->on_register = p->on_register;
    c->on_evict = p->on_evict;
    c->event_ud = p->event_ud;
    c->max_seqs = p->max_seqs;
    rc = pgd__hasher_init(&c->hasher, p->hash_key, p->hash_key_len, p->model_fingerprint);
    if (rc != PGD_OK) goto fail;
    pgd_pool_params pp = p->pool;
    pp.alloc = &c->al.a;
    pp.log = lg.fn;
    pp.log_ud = lg.ud;
    rc = pgd_pool_create(&pp, &c->pool);
    if (rc != PGD_OK) goto fail;
    c->page_tokens = pgd_pool_page_tokens(c->pool);
    c->n_pages = pgd_pool_n_pages(c->pool);
    c->codec = pgd__pool_codec(c->pool);
    pgd__pool_geom_get(c->pool, &c->g);
    c->n_layers_all = c->g.n_layers;
    if (pgd__codec_staged(c->codec, c->g.head_dim)) {
        uint64_t w = p->kv_residual ? p->kv_residual : 128;
        w = (w + c->page_tokens - 1) / c->page_tokens * c->page_tokens;
        uint64_t elems = 2ull * c->g.n_layers * c->g.n_kv_heads * c->g.head_dim;
        if (w > (1u << 24) || elems > (SIZE_MAX / 4) / w) {
            pgd__logf(&lg, PGD_LOG_ERROR, "cache: kv_residual %u is too large", p->kv_residual);
            rc = PGD_EINVAL;
            goto fail;
        }
        c->window = (uint32_t)w;
        c->row_elems = (size_t)elems;
    }
    if (pgd_pool_has_payload(c->pool)) {
        rc = PGD_ENOMEM;
        c->scratch =
            pgd__calloc(&c->al, (size_t)c->page_tokens * c->g.head_dim + 2 * (size_t)c->g.head_dim,
                        sizeof(float));
        if (!c->scratch) goto fail;
    }
    if (p->index_capacity && p->index_capacity < c->n_pages) {
        pgd__logf(&lg, PGD_LOG_ERROR, "cache: index_capacity %u is below the pool's %u pages",
                  p->index_capacity, c->n_pages);
        rc = PGD_EINVAL;
        goto fail;
    }
    rc = pgd__index_create(&c->al, p->index_capacity ? p->index_capacity : c->n_pages, &c->ix);
    if (rc != PGD_OK) goto fail;
    pgd_policy_init pi = {.n_pages = c->n_pages,
                          .alloc = &c->al.a,
                          .next_use = p->next_use,
                          .next_use_ud = p->next_use_ud,
                          .ud = p->policy_ud,
                          .clock = p->clock ? p->clock : cache_clock_mono,
                          .clock_ud = p->clock_ud,
                          .page_bytes = pgd_pool_page_bytes(c->pool),
                          .cost = p->cost,
                          .page_tokens = c->page_tokens};
    pgd_cost_model_default(&pi.cost, c->g.n_layers, c->g.n_kv_heads, c->g.head_dim);
    rc = pol->create(&pi, &c->pstate);
    if (rc != PGD_OK) {
        c->pstate = NULL;
        goto fail;
    }
    c->clock = pi.clock;
    c->clock_ud = pi.clock_ud;
    c->cost = pi.cost;
    c->page_bytes = pi.page_bytes;
    c->max_pins = (uint32_t)((p->pin_share > 0 ? p->pin_share : 0.5) * c->n_pages);
    rc = PGD_ENOMEM;
    c->page_entry = pgd__malloc(&c->al, (size_t)c->n_pages * sizeof *c->page_entry);
    if (!c->page_entry) goto fail;
    memset(c->page_entry, 0xff, (size_t)c->n_pages * sizeof *c->page_entry);
    c->page_tenant = pgd__calloc(&c->al, c->n_pages, sizeof *c->page_tenant);
    if (!c->page_tenant) goto fail;
    rc = pgd__tenants_init(&c->tn, &c->al, p->max_tenants, c->n_pages,
                           pgd__hash_seed(&c->hasher, NULL, 0));
    if (rc != PGD_OK) {
        if (rc == PGD_EINVAL)
            pgd__logf(&lg, PGD_LOG_ERROR, "cache: max_tenants %u is above %u", p->max_tenants,
                      PGD__TENANTS_MAX);
        goto fail;
    }
    rc = PGD_ENOMEM;
    c->ret = pgd__malloc(&c->al, (size_t)c->n_pages * sizeof *c->ret);
    c->heap[0].a = pgd__malloc(&c->al, (size_t)c->n_pages * sizeof(uint32_t));
    c->heap[1].a = pgd__malloc(&c->al, (size_t)c->n_pages * sizeof(uint32_t));
    c->hints = pgd__calloc(&c->al, PGD__MAX_HINTS, sizeof *c->hints);
    if (!c->ret || !c->heap[0].a || !c->heap[1].a || !c->hints) goto fail;
    for (uint32_t i = 0; i < c->n_pages; i++)
        ret_reset(c, i);
    if (pthread_mutex_init(&c->mu, NULL) != 0) goto fail;
    if (pthread_cond_init(&c->cv, NULL) != 0) {
        pthread_mutex_destroy(&c->mu);
        goto fail;
    }
    rc = tiers_create(c, p, &pp);
    if (rc != PGD_OK) {
        tiers_destroy(c);
        pthread_cond_destroy(&c->cv);
        pthread_mutex_destroy(&c->mu);
        goto fail;
    }
    *out = c;
    return PGD_OK;
fail:
    pgd__tenants_deinit(&c->tn, &c->al);
    pgd__free(&c->al, c->page_tenant);
    retention_free(c);
    pgd__free(&c->al, c->scratch);
    pgd__free(&c->al, c->page_entry);
    if (c->pstate) pol->destroy(c->pstate);
    pgd__index_destroy(c->ix);
    pgd_pool_destroy(c->pool);
    pgd__free(&al, c);
    return rc;
}

static void promo_free(pgd_cache *c, promo *pr)
{
    pgd__free(&c->al, pr);
}

static void seq_free(pgd_cache *c, pgd_seq *s)
{
    if (s->promo) {
        promo_free(c, s->promo);
        c->n_promos--;
    }
    pgd__free(&c->al, s->ring);
    pgd__free(&c->al, s->n_live);
    pgd__free(&c->al, s->table);
    pgd__free(&c->al, s);
}

void pgd_cache_destroy(pgd_cache *c)
{
    if (!c) return;
    pgd__alloc al = c->al;
    pgd_cache_destroy(c->win); /* its sequences go with it (c's point into it) */
    pgd__free(&al, c->layer_group);
    pgd__free(&al, c->layer_local);
    /* The movers first: their jobs write into pages and promotion records freed below. */
    tiers_destroy(c);
    while (c->seqs) {
        pgd_seq *s = c->seqs;
        c->seqs = s->next;
        seq_free(c, s);
    }
    retention_free(c);
    pgd__free(&al, c->scratch);
    pgd__free(&al, c->page_entry);
    pgd__free(&al, c->page_tenant);
    pgd__tenants_deinit(&c->tn, &al);
    c->pol->destroy(c->pstate);
    pgd__index_destroy(c->ix);
    pgd_pool_destroy(c->pool);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    pgd__free(&al, c);
}

pgd_pool *pgd_cache_pool(pgd_cache *c)
{
    return c->pool;
}
uint32_t pgd_cache_page_tokens(const pgd_cache *c)
{
    return c->page_tokens;
}

static void lock(pgd_cache *c)
{
    pthread_mutex_lock(&c->mu);
    c->now_valid = 0;
}
static void unlock(pgd_cache *c)
{
    pthread_mutex_unlock(&c->mu);
}

/* ---- page references (lock held) ---- */

/* The clock, read once per locked section (lock() and a wait forget it): a call that
 * releases many pages reads it once, not once per page. Lock held. */
static uint64_t now_ns(pgd_cache *c)
{
    if (!c->now_valid) {
        c->now = c->clock(c->clock_ud);
        c->now_valid = 1;
    }
    return c->now;
}

/* pgd_cost_model_page, inline on the hot path (the same expression: the same value). */
static double page_cost(const pgd_cache *c, uint32_t depth)
{
    double t = c->page_tokens;
    return t * c->cost.linear_flops_per_token +
           c->cost.attn_flops_per_pos * t * ((double)depth * t + (t + 1.0) / 2.0);
}

static pgd_policy_page page_info(pgd_cache *c, uint32_t page)
{
    const pgd__entry *e = pgd__index_entry(c->ix, c->page_entry[page]);
    const page_ret *r = &c->ret[page];
    pgd_policy_page info = {.hash = e->hash,
                            .depth = e->depth,
                            .priority = r->priority,
                            .expires_ns = r->expires_ns,
                            .next_use_ns = r->next_use_ns,
                            .now_ns = now_ns(c),
                            .tenant = c->page_tenant[page],
                            .uses = r->uses,
                            .bytes = c->page_bytes,
                            .cost = page_cost(c, e->depth)};
    return info;
}

/* ---- the heaps of retention (lock held) ----
 *
 * Indexed binary min-heaps of pages (ties: the lower page id), O(log n) per change; each
 * page's position lives in c->ret[page].heap_pos[which]. */

static uint64_t heap_key(const pgd_cache *c, int which, uint32_t page)
{
    return which == HEAP_PIN ? c->ret[page].pin_until_ns : c->ret[page].expires_ns;
}

static int heap_less(const pgd_cache *c, int which, uint32_t a, uint32_t b)
{
    uint64_t ka = heap_key(c, which, a), kb = heap_key(c, which, b);
    return ka < kb || (ka == kb && a < b);
}

static void heap_set(pgd_cache *c, int which, uint32_t i, uint32_t page)
{
    c->heap[which].a[i] = page;
    c->ret[page].heap_pos[which] = i;
}

static void heap_sift(pgd_cache *c, int which, uint32_t i)
{
    page_heap *h = &c->heap[which];
    uint32_t page = h->a[i];
    while (i > 0 && heap_less(c, which, page, h->a[(i - 1) / 2])) {
        heap_set(c, which, i, h->a[(i - 1) / 2]);
        i = (i - 1) / 2;
    }
    for (;;) {
        uint32_t l = 2 * i + 1, m = i;
        uint32_t best = page;
        if (l < h->n && heap_less(c, which, h->a[l], best)) best = h->a[m = l];
        if (l + 1 < h->n && heap_less(c, which, h->a[l + 1], best)) best = h->a[m = l + 1];
        if (m == i) break;
        heap_set(c, which, i, best);
        i = m;
    }
    heap_set(c, which, i, page);
}

static void heap_push(pgd_cache *c, int which, uint32_t page)
{
    if (c->ret[page].heap_pos[which] != PGD__NONE) return;
    page_heap *h = &c->heap[which];
    heap_set(c, which, h->n++, page);
    heap_sift(c, which, h->n - 1);
}

static void heap_remove(pgd_cache *c, int which, uint32_t page)
{
    uint32_t i = c->ret[page].heap_pos[which];
    if (i == PGD__NONE) return;
    page_heap *h = &c->heap[which];
    c->ret[page].heap_pos[which] = PGD__NONE;
    uint32_t last = h->a[--h->n];
    if (i < h->n) {
        heap_set(c, which, i, last);
        heap_sift(c, which, i);
    }
}

/* Whether a cached page is a leaf of the prefix tree (no cached child). */
static int is_leaf(const pgd_cache *c, uint32_t page)
{
    const pgd__entry *e = pgd__index_entry(c->ix, c->page_entry[page]);
    return e && e->n_children == 0;
}

/* A page joined the policy's set (or became a leaf in it): the expiry heap takes it when
 * it has an expiry and is a leaf. */
static void expiry_in(pgd_cache *c, uint32_t page)
{
    if (c->ret[page].expires_ns && is_leaf(c, page)) heap_push(c, HEAP_EXPIRY, page);
}

/* A cached page that only the index holds now joins the policy's set. */
static void became_evictable(pgd_cache *c, uint32_t page)
{
    pgd_policy_page info = page_info(c, page);
    c->pol->unreferenced(c->pstate, page, &info);
    expiry_in(c, page);
}

/* A sequence takes a reference on page; a cached page is no longer evictable. */
static void page_ref(pgd_cache *c, uint32_t page)
{
    pgd_pool_ref(c->pool, page);
    if (c->page_entry[page] != PGD__NONE) {
        c->ret[page].uses++;
        pgd_policy_page info = page_info(c, page);
        c->pol->hit(c->pstate, page, &info);
        heap_remove(c, HEAP_EXPIRY, page);
    }
}

/* A sequence drops its reference; a cached page only the index holds becomes evictable. */
static void page_unref(pgd_cache *c, uint32_t page)
{
    uint32_t r = pgd_pool_unref(c->pool, page);
    if (r == 1 && c->page_entry[page] != PGD__NONE) became_evictable(c, page);
}

/* ---- pins (lock held) ---- */

/* Pins cached page until `until` (0: until unpinned; a page pinned both ways keeps the
 * longer). The first pin takes the pins' pool reference and takes the page out of the
 * policy's set (a hit, as a sequence's reference). The caller checked the budget. */
static void pin_page(pgd_cache *c, uint32_t page, uint64_t until)
{
    page_ret *r = &c->ret[page];
    if (r->pins++ == 0) {
        pgd_pool_ref(c->pool, page);
        pgd_policy_page info = page_info(c, page);
        c->pol->hit(c->pstate, page, &info);
        heap_remove(c, HEAP_EXPIRY, page);
        c->n_pinned++;
        c->tn.e[c->page_tenant[page]].pages_pinned++; /* a cached page: charged */
        r->pin_until_ns = until;
        if (until) heap_push(c, HEAP_PIN, page);
        return;
    }
    if (r->pin_until_ns == 0) return; /* already until unpinned */
    heap_remove(c, HEAP_PIN, page);
    if (until && until < r->pin_until_ns) until = r->pin_until_ns;
    r->pin_until_ns = until;
    if (until) heap_push(c, HEAP_PIN, page);
}

/* Drops every pin of page (a no-op when it has none): it may become evictable. */
static void unpin_page(pgd_cache *c, uint32_t page)
{
    page_ret *r = &c->ret[page];
    if (r->pins == 0) return;
    r->pins = 0;
    r->pin_until_ns = 0;
    heap_remove(c, HEAP_PIN, page);
    c->n_pinned--;
    PGD_CHECK(c->tn.e[c->page_tenant[page]].pages_pinned > 0);
    c->tn.e[c->page_tenant[page]].pages_pinned--;
    page_unref(c, page);
}

/* Ends the pins whose TTL passed (lazily: before a victim is chosen or the evictable pages
 * are counted). O(log n) per pin ended; nothing without timed pins. */
static void pins_expire(pgd_cache *c)
{
    if (c->heap[HEAP_PIN].n == 0) return;
    uint64_t now = now_ns(c);
    while (c->heap[HEAP_PIN].n && c->ret[c->heap[HEAP_PIN].a[0]].pin_until_ns <= now)
        unpin_page(c, c->heap[HEAP_PIN].a[0]);
}

/* Whether n more pinned pages fit pin_share, besides the reservations. */
static int pins_fit(const pgd_cache *c, uint64_t n)
{
    return (uint64_t)c->n_pinned + c->pin_reserved + n <= c->max_pins;
}

static int accept_leaf(void *ctx, uint32_t page)
{
    pgd_cache *c = ctx;
    const pgd__entry *e = pgd__index_entry(c->ix, c->page_entry[page]);
    return e && e->n_children == 0;
}

/* ---- tier movement: write-back slots and their jobs ----
 *
 * Every move out of the pool copies the page (and its key bounds) into a slot under the
 * lock, one memcpy, and queues the slot's job; the job writes the tier with no lock held
 * and takes mu only to give the slot back and count. A full slab drops the move (counted
 * in demote_dropped), so the request path never waits for a tier. */

/* What one job did, counted per tier, published under mu when it ends. */
typedef struct tally {
    uint32_t demoted[PGD_MAX_TIERS];
    uint32_t dropped[PGD_MAX_TIERS];
    uint32_t prefetched[PGD_MAX_TIERS];
} tally;

typedef struct spill_ctx {
    pgd_cache *c;
    uint32_t tier; /* where the spilled records go */
    tally *t;
} spill_ctx;

static int put_chain(pgd_cache *c, uint32_t t, pgd_hash block, pgd_hash parent, const void *page,
                     const void *bounds, tally *ta);

/* Whether tiers[t] holds block, asked before a write to skip a needless one. A remote tier
 * is not asked (a look-up there is a round trip, and this runs under mu on every eviction
 * and commit): its put skips what it knows it holds, and rewriting a record it did not
 * know of only renews the record. Promotion asks every tier (promote). */
static int holds(pgd_cache *c, uint32_t t, pgd_hash block)
{
    return !(c->remote >> t & 1) && pgd_tier_lookup(c->tiers[t].tier, &block, 1);
}

/* A tier evicted a record to make room: it goes one tier down (the tier's lock is not
 * held, nor mu). */
static void spill_down(void *ud, pgd_hash block, pgd_hash parent, const void *page,
                       const void *bounds)
{
    spill_ctx *sc = ud;
    if (sc->tier >= sc->c->n_tiers || holds(sc->c, sc->tier, block))
        return; /* off the last tier, or already held there (write-through): nothing to do */
    put_chain(sc->c, sc->tier, block, parent, page, bounds, sc->t);
}

/* Writes a record to tiers[t], its spills to tiers[t + 1] and so on. No lock held. */
static int put_chain(pgd_cache *c, uint32_t t, pgd_hash block, pgd_hash parent, const void *page,
                     const void *bounds, tally *ta)
{
    if (t >= c->n_tiers) return PGD_OK; /* spilled off the last tier: gone */
    spill_ctx next = {c, t + 1, ta};
    int rc = pgd_tier_put(c->tiers[t].tier, block, parent, page, bounds,
                          t + 1 < c->n_tiers ? spill_down : NULL, &next);
    if (rc == PGD_OK)
        ta->demoted[t]++;
    else
        ta->dropped[t]++;
    return rc;
}

static void tally_publish(pgd_cache *c, const tally *ta)
{
    const uint64_t rec_bytes = c->ident.page_bytes + c->ident.bounds_bytes;
    for (uint32_t t = 0; t < c->n_tiers; t++) {
        c->tst[t].demoted_pages += ta->demoted[t];
        c->tst[t].demoted_bytes += ta->demoted[t] * rec_bytes;
        c->tst[t].demote_dropped += ta->dropped[t];
        c->tst[t].prefetched_pages += ta->prefetched[t];
    }
}

static void slot_release(pgd_cache *c, wb_slot *w)
{
    w->kind = SLOT_FREE;
    w->next_free = c->slot_free;
    c->slot_free = (uint32_t)(w - c->slots);
    c->n_slots_busy--;
}

/* The job of a slot: a put (demotion, write-through, park) or a prefetch (read from a
 * slower tier, write to tiers[0]). */
static void slot_run(pgd__job *j)
{
    wb_slot *w = (wb_slot *)j;
    pgd_cache *c = w->c;
    tally ta;
    memset(&ta, 0, sizeof ta);
    void *bounds = c->ident.bounds_bytes ? w->buf + c->ident.page_bytes : NULL;
    if (w->kind == SLOT_PREFETCH) {
        if (pgd_tier_get(c->tiers[w->tier].tier, w->block, w->buf, bounds) == PGD_OK &&
            put_chain(c, 0, w->block, w->parent, w->buf, bounds, &ta) == PGD_OK)
            ta.prefetched[0]++;
    } else {
        int rc = put_chain(c, w->tier, w->block, w->parent, w->buf, bounds, &ta);
        /* The record carries the page's retention (a tier without the op keeps none). */
        if (rc == PGD_OK && w->has_ret) pgd_tier_retain(c->tiers[w->tier].tier, w->block, &w->ret);
    }
    lock(c);
    tally_publish(c, &ta);
    slot_release(c, w);
    unlock(c); /* the last touch of c: drain may free it after */
}

/* Non-zero when some tier at or below `from` holds block (one look-up per tier). */
static int held_below(pgd_cache *c, uint32_t from, pgd_hash block)
{
    for (uint32_t t = from; t < c->n_tiers; t++)
        if (holds(c, t, block)) return 1;
    return 0;
}

/* Non-zero when a slot is moving block now (so it is not queued twice). O(slots). */
static int in_flight(const pgd_cache *c, pgd_hash block)
{
    if (c->n_slots_busy == 0) return 0;
    for (uint32_t i = 0; i < c->n_slots; i++)
        if (c->slots[i].kind != SLOT_FREE && pgd_hash_eq(c->slots[i].block, block)) return 1;
    return 0;
}

/* Takes a free slot, or NULL when the slab is full. */
static wb_slot *slot_take(pgd_cache *c)
{
    if (c->slot_free == PGD__NONE) return NULL;
    wb_slot *w = &c->slots[c->slot_free];
    c->slot_free = w->next_free;
    c->n_slots_busy++;
    return w;
}

/* The parent hash of an index entry's block ({0, 0} for a first block). */
static pgd_hash entry_parent(const pgd_cache *c, uint32_t entry)
{
    pgd_hash none = {0, 0};
    uint32_t p = pgd__index_entry(c->ix, entry)->parent;
    return p == PGD__NONE ? none : pgd__index_entry(c->ix, p)->hash;
}

/* TTL in whole seconds from now to expires (at least 1; 0: none). */
static uint64_t ttl_s(uint64_t expires, uint64_t now)
{
    if (!expires) return 0;
    return expires > now ? (expires - now + 999999999u) / 1000000000u : 1;
}

/* The tenant of a cached page in a tier retention: its id and index (pgd_tier_retention
 * says < 64: tenants past the 64th share index 63 there, their ids stay apart). */
static void tier_tenant(const pgd_cache *c, uint32_t page, pgd_tier_retention *out)
{
    const uint32_t ti = c->page_tenant[page];
    out->tenant = c->tn.e[ti].id;
    out->tenant_index = ti < 64 ? ti : 63;
}

/* The retention a put of page to tiers[t] carries: returns 0 when it is the default (or
 * the tier keeps none), else fills *out. Lock held. */
static int tier_retention(pgd_cache *c, uint32_t t, uint32_t page, pgd_tier_retention *out)
{
    const page_ret *r = &c->ret[page];
    const uint32_t ti = c->page_tenant[page];
    /* A tenant with a reserved share of this tier: the tier needs the tenant of each of its
     * records, default retention or not. */
    if (!pgd_tier_has_retain(c->tiers[t].tier) ||
        (r->priority == PGD_PRIORITY_DEFAULT && !r->expires_ns && !r->pins &&
         !(c->tn.e[ti].tier_share[t] > 0)))
        return 0;
    memset(out, 0, sizeof *out);
    out->priority = r->priority;
    out->ttl_s = ttl_s(r->expires_ns, now_ns(c));
    out->pin = r->pins ? 1 : 0;
    tier_tenant(c, page, out);
    out->tenant_share = c->tn.e[ti].tier_share[t];
    return 1;
}

/* Copies registered page (index entry `entry`) into a slot and queues its put to
 * tiers[t]. Returns PGD_OK, or PGD_ENOSPC (slab or queue full: counted as dropped). */
static int queue_put(pgd_cache *c, uint32_t t, uint32_t entry, uint32_t page)
{
    wb_slot *w = slot_take(c);
    if (!w) {
        c->tst[t].demote_dropped++;
        if (!c->warned_full) { /* once: the counter says how often */
            c->warned_full = 1;
            pgd__logf(&c->log, PGD_LOG_WARN,
                      "cache: the write-back queue is full (%u pages): pages leaving the pool "
                      "are dropped, not demoted (counted in demote_dropped)",
                      c->n_slots);
        }
        return PGD_ENOSPC;
    }
    memcpy(w->buf, pgd_pool_page_data(c->pool, page), c->ident.page_bytes);
    if (c->ident.bounds_bytes)
        memcpy(w->buf + c->ident.page_bytes, pgd__pool_key_bounds_mut(c->pool, page, 0, 0),
               c->ident.bounds_bytes);
    w->kind = SLOT_PUT;
    w->tier = t;
    w->has_ret = tier_retention(c, t, page, &w->ret);
    w->block = pgd__index_entry(c->ix, entry)->hash;
    w->parent = entry_parent(c, entry);
    w->job.fn = slot_run;
    w->job.next = NULL;
    if (pgd__mover_submit(c->mover, &w->job, PGD__JOB_BACKGROUND) != PGD_OK) {
        slot_release(c, w);
        c->tst[t].demote_dropped++;
        return PGD_ENOSPC;
    }
    return PGD_OK;
}

/* Write-back: an evicted registered page that tiers[0] does not hold (nor is being moved)
 * goes to tiers[0]. A slower tier holding it does not stop that: a block promoted from the
 * disk (or written through to it) that the pool evicts again is hot, and its next hit
 * should read the RAM tier; when the RAM tier spills it later, the slower tier's put finds
 * it held and writes nothing. Called by evict_one after on_evict, before the page is
 * unindexed. Lock held. */
static void demote(pgd_cache *c, uint32_t entry, uint32_t page)
{
    pgd_hash h = pgd__index_entry(c->ix, entry)->hash;
    if (in_flight(c, h) || holds(c, 0, h)) return;
    queue_put(c, 0, entry, page);
}

/* Write-through: registered page to every tier of mask that lacks it. Lock held. */
static void write_through(pgd_cache *c, uint32_t mask, uint32_t entry, uint32_t page)
{
    pgd_hash h = pgd__index_entry(c->ix, entry)->hash;
    if (in_flight(c, h)) return;
    for (uint32_t t = 0; t < c->n_tiers; t++)
        if ((mask >> t & 1) && !holds(c, t, h)) queue_put(c, t, entry, page);
}

/* Tenant quotas (cache.h "tenants"), composed with the leaf check: who may lose a page
 * when a sequence of tenant `tenant` needs one. */
typedef struct quota_ctx {
    pgd_cache *c;
    uint32_t tenant; /* the requester */
} quota_ctx;

/* A leaf of the requester's own (it holds at least its reservation). */
static int accept_own(void *ctx, uint32_t page)
{
    const quota_ctx *q = ctx;
    return q->c->page_tenant[page] == q->tenant && accept_leaf(q->c, page);
}

/* A leaf of a tenant holding more than its reservation (any tenant without one). */
static int accept_over(void *ctx, uint32_t page)
{
    const quota_ctx *q = ctx;
    return pgd__tenants_over(&q->c->tn, q->c->page_tenant[page]) && accept_leaf(q->c, page);
}

/* The page to evict next for a sequence of tenant, or PGD_POLICY_NO_PAGE. Ends expired
 * pins first. An expired evictable leaf goes first (the expiry heap's top), else the
 * policy's victim among the evictable leaves. tenant PGD__TENANT_NONE (no sequence: an
 * admin eviction) or no reservation anywhere: no quota filter, exactly the victims of a
 * cache without tenants. With reservations every step passes the quota filter: the
 * requester's own pages first while it holds at least its reservation, then pages of
 * tenants over theirs, never a page of a tenant at or under its reservation (an expired
 * top that the filter refuses waits; the policy's scans find the others). `extra`: pages
 * the requester took in this call already (a grow of several pages), counted as held, so
 * that a tenant at its share recycles its own pages for the whole grow instead of dipping
 * below it and taking others'. A user policy's victim that is not an evictable leaf the
 * filter allows is refused (logged). */
static uint32_t pick_victim(pgd_cache *c, uint32_t tenant, uint32_t extra)
{
    pins_expire(c);
    quota_ctx q = {c, tenant};
    const int quotas = tenant != PGD__TENANT_NONE && pgd__tenants_quotas(&c->tn);
    const int own = quotas && pgd__tenants_own_first(&c->tn, tenant, extra);
    if (c->heap[HEAP_EXPIRY].n) {
        uint32_t page = c->heap[HEAP_EXPIRY].a[0];
        if (c->ret[page].expires_ns <= now_ns(c) &&
            (!quotas || (own && c->page_tenant[page] == tenant) ||
             pgd__tenants_over(&c->tn, c->page_tenant[page])))
            return page;
    }
    pgd_policy_accept_fn ok = accept_leaf;
    void *ok_ctx = c;
    uint32_t page = PGD_POLICY_NO_PAGE;
    if (quotas) {
        ok_ctx = &q;
        if (own) {
            ok = accept_own;
            page = c->pol->victim(c->pstate, accept_own, &q);
        }
        if (page == PGD_POLICY_NO_PAGE) {
            ok = accept_over;
            page = c->pol->victim(c->pstate, accept_over, &q);
        }
    } else {
        page = c->pol->victim(c->pstate, accept_leaf, c);
    }
    if (page == PGD_POLICY_NO_PAGE) return page;
    if (page >= c->n_pages || c->page_entry[page] == PGD__NONE ||
        pgd_pool_refcount(c->pool, page) != 1 || !ok(ok_ctx, page)) {
        pgd__logf(&c->log, PGD_LOG_ERROR,
                  "cache: policy %s chose page %u, which is not an evictable leaf", c->pol->name,
                  page);
        return PGD_POLICY_NO_PAGE;
    }
    return page;
}

/* Evicts an evictable leaf for a sequence of tenant (PGD__TENANT_NONE: none, counted as
 * the owner's eviction, not "by others"): reports it (on_evict, payload still intact),
 * demotes it, then unindexes and frees it, uncharging its tenant; its parent may become an
 * expired leaf. */
static void evict_page(pgd_cache *c, uint32_t page, uint32_t tenant)
{
    uint32_t e = c->page_entry[page];
    uint32_t parent = pgd__index_entry(c->ix, e)->parent;
    c->pol->remove(c->pstate, page);
    heap_remove(c, HEAP_EXPIRY, page);
    if (c->on_evict) c->on_evict(c->event_ud, pgd__index_entry(c->ix, e)->hash, page);
    if (c->n_tiers) demote(c, e, page);
    pgd__index_remove(c->ix, e);
    c->page_entry[page] = PGD__NONE;
    pgd__tenants_uncharge(&c->tn, c->page_tenant[page]);
    pgd__tenants_evicted(&c->tn, c->page_tenant[page], tenant);
    pgd_pool_unref(c->pool, page);
    c->st.n_evictions++;
    if (parent != PGD__NONE) {
        uint32_t pp = pgd__index_entry(c->ix, parent)->loc_id;
        if (pgd_pool_refcount(c->pool, pp) == 1) expiry_in(c, pp); /* evictable */
    }
}

/* Evicts one page for a sequence of tenant (pick_victim). Returns 1, or 0 when nothing is
 * evictable (within the quotas). */
static int evict_for(pgd_cache *c, uint32_t tenant, uint32_t extra)
{
    uint32_t page = pick_victim(c, tenant, extra);
    if (page == PGD_POLICY_NO_PAGE) return 0;
    evict_page(c, page, tenant);
    return 1;
}

/* An eviction no sequence asked for (pgd_cache_evict, clear): quotas do not apply. */
static int evict_one(pgd_cache *c)
{
    return evict_for(c, PGD__TENANT_NONE, 0);
}

/* Pages that an allocation could get: free now, or evictable. */
static uint64_t n_available(pgd_cache *c)
{
    pins_expire(c);
    pgd_pool_stats ps;
    pgd_pool_get_stats(c->pool, &ps);
    return (uint64_t)ps.n_pages_free + c->pol->size(c->pstate);
}

/* Allocates a page for a sequence of tenant that took `extra` pages in this call already,
 * evicting if the pool is full (within the quotas). Returns PGD_OK or PGD_ENOSPC. */
static int alloc_page(pgd_cache *c, uint32_t tenant, uint32_t extra, uint32_t *page)
{
    for (;;) {
        if (pgd_pool_alloc(c->pool, page) == PGD_OK) return PGD_OK;
        if (!evict_for(c, tenant, extra)) return PGD_ENOSPC;
    }
}

static int table_reserve(pgd_cache *c, pgd_seq *s, uint64_t n)
{
    if (n <= s->cap) return PGD_OK;
    if (n > UINT32_MAX / 2) return PGD_ENOMEM;
    uint32_t cap = s->cap ? s->cap : 8;
    while (cap < n)
        cap *= 2;
    uint32_t *t = pgd__realloc(&c->al, s->table, (size_t)cap * sizeof *t);
    if (!t) return PGD_ENOMEM;
    s->table = t;
    s->cap = cap;
    return PGD_OK;
}

/* ---- sequences ---- */

/* A sequence, whatever max_seqs says (pgd_cache_warm's own). */
static int seq_alloc_any(pgd_cache *c, pgd_seq **out)
{
    *out = NULL;
    pgd_seq *s = pgd__calloc(&c->al, 1, sizeof *s + (size_t)c->page_tokens * sizeof(int32_t));
    if (!s) return PGD_ENOMEM;
    s->partial = (int32_t *)(s + 1);
    s->last_entry = PGD__NONE;
    s->ret = pgd_retention_default();
    *out = s;
    return PGD_OK;
}

static int seq_alloc(pgd_cache *c, pgd_seq **out)
{
    *out = NULL;
    if (c->max_seqs && c->n_seqs >= c->max_seqs) return PGD_EBUSY;
    return seq_alloc_any(c, out);
}

static void seq_link(pgd_cache *c, pgd_seq *s)
{
    s->prev = NULL;
    s->next = c->seqs;
    if (c->seqs) c->seqs->prev = s;
    c->seqs = s;
    c->n_seqs++;
}

int pgd_seq_create(pgd_cache *c, const void *salt, size_t salt_len, pgd_seq **out)
{
    pgd_seq *s;
    *out = NULL;
    if (salt_len && !salt) return PGD_EINVAL;
    pgd_hash seed = pgd__hash_seed(&c->hasher, salt, salt_len);
    uint64_t id = salt_len ? pgd__tenant_id(&c->hasher, salt, salt_len) : 0;
    lock(c);
    int rc = seq_alloc(c, &s);
    /* Its twin in the window group first, under c's lock (window_check reads s->win). */
    if (rc == PGD_OK && c->win) {
        rc = pgd_seq_create(c->win, salt, salt_len, &s->win);
        if (rc != PGD_OK) seq_free(c, s);
    }
    if (rc == PGD_OK) {
        s->last = s->seed = seed;
        s->tenant = pgd__tenants_get(&c->tn, seed, id); /* a new salt takes a free entry */
        seq_link(c, s);
        *out = s;
    }
    unlock(c);
    return rc;
}

/* Merges the retention of s into the registered pages it holds (cache.h "Retention") and
 * pins them when s asks (within the budget, shallowest first). A sequence with the default
 * retention leaves a page with the default as it is (no clock read). Lock held. */
static void retention_merge(pgd_cache *c, pgd_seq *s)
{
    const pgd_retention *r = &s->ret;
    uint64_t now = 0;
    uint32_t refused = 0;
    for (uint32_t i = s->first_live; i < s->n_pages; i++) {
        uint32_t page = s->table[i];
        if (c->page_entry[page] == PGD__NONE) continue; /* not registered */
        page_ret *pr = &c->ret[page];
        if (!s->has_ret && pr->priority == PGD_PRIORITY_DEFAULT && !pr->expires_ns &&
            !pr->next_use_ns) {
            pr->used = 1; /* default merged into default */
            continue;
        }
        if (!now) now = now_ns(c);
        uint64_t exp = r->ttl_ms ? now + r->ttl_ms * 1000000u : 0;
        uint64_t next = r->next_use_ms ? now + r->next_use_ms * 1000000u : 0;
        if (!pr->used) { /* the first release sets the page's retention */
            pr->priority = (uint8_t)r->priority;
            pr->expires_ns = exp;
            pr->next_use_ns = next;
            pr->used = 1;
        } else {
            int expired = pr->expires_ns && pr->expires_ns <= now;
            uint32_t prio = expired ? 0 : pr->priority;
            pr->priority = (uint8_t)(prio > r->priority ? prio : r->priority);
            pr->expires_ns =
                pr->expires_ns && exp ? (pr->expires_ns > exp ? pr->expires_ns : exp) : 0;
            pr->next_use_ns = next ? next : (pr->next_use_ns > now ? pr->next_use_ns : 0);
        }
        if (r->pin) {
            if (pr->pins || pins_fit(c, 1))
                pin_page(c, page, exp);
            else
                refused++;
        }
    }
    if (refused)
        pgd__logf(&c->log, PGD_LOG_WARN,
                  "cache: %u pages of a pinned sequence past its reservation were not pinned "
                  "(pin_share)",
                  refused);
}

/* A sequence released with a next-use hint: its registered chain (from its first page, as
 * far as it is registered) becomes a hint due then (hints_run prefetches it from the tiers
 * before), when the hint array has room and memory (else it is only the pages' hint).
 * Lock held. */
static void hint_release(pgd_cache *c, pgd_seq *s)
{
    uint32_t n = 0;
    while (n < s->n_full && c->page_entry[s->table[n]] != PGD__NONE)
        n++;
    if (n == 0) return;
    pgd_hash *copy = pgd__malloc(&c->al, (size_t)n * sizeof *copy);
    if (!copy) return;
    for (uint32_t i = 0; i < n; i++)
        copy[i] = pgd__index_entry(c->ix, c->page_entry[s->table[i]])->hash;
    if (hint_insert(c, copy, n, 0, now_ns(c) + s->ret.next_use_ms * 1000000u) != PGD_OK)
        pgd__logf(&c->log, PGD_LOG_DEBUG, "cache: a next-use hint was dropped (%u waiting)",
                  c->n_hints);
}

/* Releases s: gives back its pin reservation, merges its retention, then drops its page
 * references (deepest page first, so that the policy evicts a released prefix from its
 * end) and frees it. Lock held; no promotion pending. */
static void seq_release(pgd_cache *c, pgd_seq *s)
{
    c->pin_reserved -= s->pin_resv;
    s->pin_resv = 0;
    if (!s->internal) retention_merge(c, s);
    if (s->has_ret && s->ret.next_use_ms) hint_release(c, s);
    for (uint32_t i = s->n_pages; i-- > s->first_live;)
        page_unref(c, s->table[i]);
    if (s->prev)
        s->prev->next = s->next;
    else
        c->seqs = s->next;
    if (s->next) s->next->prev = s->prev;
    c->n_seqs--;
    seq_free(c, s);
}

void pgd_seq_destroy(pgd_cache *c, pgd_seq *s)
{
    if (!s) return;
    lock(c);
    if (s->promo) wait_locked(c, s);
    pgd_seq_destroy(c->win, s->win); /* lock order: c, then c->win */
    seq_release(c, s);
    unlock(c);
}

int pgd_seq_fork(pgd_cache *c, pgd_seq *src, pgd_seq **out)
{
    pgd_seq *s;
    *out = NULL;
    lock(c);
    if (src->promo) wait_locked(c, src);
    /* Only the last page may be shared uncommitted: then any page a sequence holds past
     * its own chain sits right after it, and a holder of a cached page holds all of the
     * page's ancestors (what makes every evictable page reachable leaf-first). */
    /* A compacted sequence registers nothing more, and its registered pages are a prefix
     * it kept whole (pgd_seq_compact): its other pages are its own, never registered. */
    int rc = !src->compacted && src->n_full + 1 < src->n_pages ? PGD_ESTATE : PGD_OK;
    if (rc != PGD_OK) goto out;
    rc = seq_alloc(c, &s);
    if (rc != PGD_OK) goto out;
    rc = table_reserve(c, s, src->n_pages);
    if (rc == PGD_OK && src->n_live) {
        size_t bytes = (size_t)c->g.n_layers * c->g.n_kv_heads * sizeof *s->n_live;
        s->n_live = pgd__malloc(&c->al, bytes);
        if (s->n_live)
            memcpy(s->n_live, src->n_live, bytes);
        else
            rc = PGD_ENOMEM;
    }
    if (rc == PGD_OK && src->ring) {
        size_t bytes = c->row_elems * src->window * sizeof *s->ring;
        s->ring = pgd__malloc(&c->al, bytes);
        if (s->ring) {
            memcpy(s->ring, src->ring, bytes);
            s->window = src->window;
        } else {
            rc = PGD_ENOMEM;
        }
    }
    if (rc != PGD_OK) {
        seq_free(c, s);
        goto out;
    }
    s->ring_lo = src->ring_lo;
    s->hi = src->hi;
    if (src->n_pages) memcpy(s->table, src->table, (size_t)src->n_pages * sizeof *s->table);
    s->n_pages = src->n_pages;
    s->len = src->len;
    s->n_committed = src->n_committed;
    s->n_full = src->n_full;
    s->mode = src->mode;
    s->unregistrable = src->unregistrable;
    s->last_entry = src->last_entry;
    s->last = src->last;
    s->seed = src->seed;
    s->tenant = src->tenant;
    s->ret = src->ret; /* the retention, not the pin reservation (src keeps it) */
    s->has_ret = src->has_ret;
    s->compacted = src->compacted;
    s->n_dropped = src->n_dropped;
    s->mask_len = src->mask_len; /* n_live: copied above */
    s->first_live = src->first_live;
    if (c->win) {
        rc = pgd_seq_fork(c->win, src->win, &s->win);
        if (rc != PGD_OK) {
            seq_free(c, s);
            goto out;
        }
    }
    memcpy(s->partial, src->partial, (size_t)c->page_tokens * sizeof *s->partial);
    for (uint32_t i = s->first_live; i < s->n_pages; i++)
        pgd_pool_ref(c->pool, s->table[i]); /* src holds them: none is evictable */
    seq_link(c, s);
    *out = s;
out:
    unlock(c);
    return rc;
}

/* ---- match ---- */

/* The estimate of block h's matches (sketch_hit without counting). Lock held. */
static uint32_t sketch_peek(const pgd_cache *c, pgd_hash h)
{
    uint8_t a = c->sketch[h.lo & c->sketch_mask];
    uint8_t b = c->sketch[(size_t)c->sketch_mask + 1 + (h.hi & c->sketch_mask)];
    return a < b ? a : b;
}

/* Counts one match of block h over its life (pool matches and promotions from a tier) and
 * returns the estimate: a count-min sketch, two rows indexed by the two halves of the
 * keyed hash (uniform), counters saturating at 255, never aged. A collision can only
 * over-count, which admits a block early: a write, never a wrong record. Lock held. */
static uint32_t sketch_hit(pgd_cache *c, pgd_hash h)
{
    uint8_t *a = &c->sketch[h.lo & c->sketch_mask];
    uint8_t *b = &c->sketch[(size_t)c->sketch_mask + 1 + (h.hi & c->sketch_mask)];
    if (*a < 255) (*a)++;
    if (*b < 255) (*b)++;
    return *a < *b ? *a : *b;
}

/* Write-through admission: a registered page (entry e) whose block has been matched hits
 * times (sketch_hit) is written, from a tier's admit_hits-th match on, to that tier unless
 * the tier holds it. Lock held. */
static void admit_hits(pgd_cache *c, uint32_t e, uint32_t page, uint32_t hits)
{
    uint32_t mask = 0;
    for (uint32_t t = 0; t < c->n_tiers; t++)
        if ((c->wt_admit >> t & 1) && hits >= c->tiers[t].admit_hits) mask |= 1u << t;
    if (mask) write_through(c, mask, e, page); /* skips a tier that holds it already */
}

/* Pins the longest cached chain of full pages for an empty sequence whose table has room
 * for n pages, and makes them its prefix. Page k's hash is hashes[k] for k < n_hashes,
 * else it is computed from tokens here, lazily (a prompt that diverges early costs one
 * hash, not n). Stops at the first miss or at an entry that does not extend the previous
 * one. Returns the number of pages pinned. Lock held. */
static uint32_t pin_chain(pgd_cache *c, pgd_seq *s, const int32_t *tokens, const pgd_hash *hashes,
                          size_t n_hashes, size_t n)
{
    uint32_t k = 0, prev = PGD__NONE;
    pgd_hash h = s->last;
    const int admit = c->sketch != NULL; /* read once: the loop calls out */
    for (; k < n; k++) {
        h = k < n_hashes ? hashes[k]
                         : pgd__hash_block(&c->hasher, h, tokens + (size_t)k * c->page_tokens,
                                           c->page_tokens);
        uint32_t e = pgd__index_find(c->ix, h);
        if (e == PGD__NONE) break;
        const pgd__entry *en = pgd__index_entry(c->ix, e);
        if (en->parent != prev) break;
        pgd_assert(pgd__index_loc(c->ix, e).tier == PGD__TIER_POOL);
        page_ref(c, en->loc_id);
        if (admit) admit_hits(c, e, en->loc_id, sketch_hit(c, h));
        s->table[k] = en->loc_id;
        s->last = h;
        prev = e;
    }
    s->n_pages = k;
    s->n_full = k;
    s->len = s->n_committed = (uint64_t)k * c->page_tokens;
    s->ring_lo = s->hi = s->len; /* matched pages are read from the pool */
    s->last_entry = prev;
    return k;
}

static void count_query(pgd_cache *c, const pgd_seq *s, uint64_t n_pages_q, uint64_t n_tokens_q,
                        uint32_t hit)
{
    c->st.n_query_pages += n_pages_q;
    c->st.n_query_tokens += n_tokens_q;
    c->st.n_hit_pages += hit;
    c->st.n_hit_tokens += (uint64_t)hit * c->page_tokens;
    pgd__tenant *t = &c->tn.e[s->tenant];
    t->query_pages += n_pages_q;
    t->hit_pages += hit;
    t->hit_tokens += (uint64_t)hit * c->page_tokens;
}

static uint32_t window_cut(pgd_cache *c, pgd_seq *s, uint32_t k);

/* The three matches: tokens (hashes NULL), tokens with precomputed hashes, hashes only
 * (tokens NULL, mode MODE_HASHES). n_pages full pages are looked up. */
static int64_t match(pgd_cache *c, pgd_seq *s, const int32_t *tokens, size_t n_tokens,
                     const pgd_hash *hashes, size_t n_hashes, size_t n_pages)
{
    int64_t rc;
    lock(c);
    if (s->len || s->mode != MODE_NONE || s->compacted) {
        rc = PGD_ESTATE;
        goto out;
    }
    rc = table_reserve(c, s, n_pages);
    if (rc != PGD_OK) goto out;
    uint32_t k = pin_chain(c, s, tokens, hashes, n_hashes, n_pages);
    s->mode = tokens ? MODE_TOKENS : MODE_HASHES;
    if (s->win) k = window_cut(c, s, k);
    count_query(c, s, n_pages, n_tokens, k);
    s->match_pool_pages = k;
    if (c->n_tiers && k < n_pages) promote(c, s, tokens, hashes, n_hashes, n_pages, k);
    rc = tokens ? (int64_t)s->len : (int64_t)s->n_pages;
out:
    unlock(c);
    return rc;
}

int64_t pgd_seq_match(pgd_cache *c, pgd_seq *s, const int32_t *tokens, size_t n_tokens)
{
    if (n_tokens && !tokens) return PGD_EINVAL;
    return match(c, s, tokens, n_tokens, NULL, 0, n_tokens / c->page_tokens);
}

int64_t pgd_seq_match_hashed(pgd_cache *c, pgd_seq *s, const int32_t *tokens, size_t n_tokens,
                             const pgd_hash *hashes, size_t n_hashes)
{
    const uint32_t pt = c->page_tokens;
    size_t n_full = n_tokens / pt;
    if ((n_tokens && !tokens) || (n_hashes && !hashes)) return PGD_EINVAL;
    if (n_hashes > n_full) n_hashes = n_full;
    /* One hash, before the lock, proves the hashes belong to this sequence's tenant (and
     * model and key): hashes of another salt would share that tenant's pages. s->seed is
     * immutable, so reading it unlocked is safe. */
    if (n_hashes && !pgd_hash_eq(pgd__hash_block(&c->hasher, s->seed, tokens, pt), hashes[0])) {
        pgd__logf(&c->log, PGD_LOG_ERROR,
                  "cache: match_hashed: hashes[0] is not the hash of the sequence's first page");
        return PGD_EINVAL;
    }
    return match(c, s, tokens, n_tokens, hashes, n_hashes, n_full);
}

int64_t pgd_seq_match_hashes(pgd_cache *c, pgd_seq *s, const pgd_hash *hashes, size_t n_hashes)
{
    if (n_hashes && !hashes) return PGD_EINVAL;
    return match(c, s, NULL, (uint64_t)n_hashes * c->page_tokens, hashes, n_hashes, n_hashes);
}

/* ---- grow ---- */

int pgd_seq_grow(pgd_cache *c, pgd_seq *s, size_t n_tokens)
{
    int rc = PGD_OK;
    lock(c);
    if (s->promo) wait_locked(c, s);
    const uint64_t len0 = s->len;
    const uint32_t n_pages0 = s->n_pages;
    if (c->flat) window_release(c, s, s->len);
    /* No sequence can outgrow the pool: this bound also keeps the arithmetic exact (a
     * window group's sequence holds its pages from first_live on). */
    uint64_t max_len = ((uint64_t)c->n_pages + s->first_live) * c->page_tokens;
    if (n_tokens > max_len - s->len) {
        rc = PGD_ENOSPC;
        goto out;
    }
    uint64_t len = s->len + n_tokens;
    uint64_t need_pages = (len + c->page_tokens - 1) / c->page_tokens;
    uint64_t n_new = need_pages - s->n_pages;
    if (n_new > n_available(c)) {
        rc = PGD_ENOSPC; /* checked first, so that nothing is evicted in vain */
        goto out;
    }
    rc = table_reserve(c, s, need_pages);
    if (rc != PGD_OK) goto out;
    uint32_t n_old = s->n_pages;
    while (s->n_pages < need_pages) {
        uint32_t page;
        rc = alloc_page(c, s->tenant, s->n_pages - n_old, &page);
        if (rc != PGD_OK) {
            /* Only quotas (the evictable pages are other tenants' reserved ones) or a user
             * policy that refuses its own pages get here (free + evictable covered the
             * pages): give back what this call took. */
            while (s->n_pages > n_old)
                pgd_pool_unref(c->pool, s->table[--s->n_pages]);
            goto out;
        }
        s->table[s->n_pages++] = page;
    }
    s->len = len;
    if (s->win) {
        rc = pgd_seq_grow(c->win, s->win, n_tokens);
        if (rc != PGD_OK) { /* the window group had no room: undo this group's grow */
            while (s->n_pages > n_pages0)
                page_unref(c, s->table[--s->n_pages]);
            s->len = len0;
        }
    }
out:
    unlock(c);
    return rc;
}

int pgd_seq_truncate(pgd_cache *c, pgd_seq *s, uint64_t n_tokens)
{
    int rc = PGD_OK;
    lock(c);
    if (s->promo) wait_locked(c, s);
    if (n_tokens < s->n_committed || n_tokens > s->len) {
        rc = PGD_ESTATE;
        goto out;
    }
    if (c->flat && s->first_live &&
        n_tokens + 1 < (uint64_t)s->first_live * c->page_tokens + c->win_tokens) {
        /* Rows from n_tokens on would need keys of released pages. */
        pgd__logf(
            &c->log, PGD_LOG_ERROR,
            "cache: truncating to %llu tokens needs window keys from position %llu, "
            "released (the window group holds positions %llu..)",
            (unsigned long long)n_tokens,
            (unsigned long long)(n_tokens + 1 > c->win_tokens ? n_tokens + 1 - c->win_tokens : 0),
            (unsigned long long)s->first_live * c->page_tokens);
        rc = PGD_ESTATE;
        goto out;
    }
    if (s->win) {
        /* The window group first: the checks that only it makes (released pages) come
         * before anything changes. Both groups hold the same positions, so the checks
         * shared with this group give the same answer. */
        rc = pgd_seq_truncate(c->win, s->win, n_tokens);
        if (rc != PGD_OK) goto out;
    }
    if (c->window) {
        /* Ring slots of positions below hi - window were overwritten. */
        const uint32_t pt = c->page_tokens;
        uint64_t lo = s->ring_lo;
        if (s->hi > s->window) {
            uint64_t over = (s->hi - s->window + pt - 1) / pt * pt;
            lo = lo > over ? lo : over;
        }
        if (n_tokens % pt && lo > n_tokens / pt * pt) {
            pgd__logf(&c->log, PGD_LOG_ERROR,
                      "cache: truncating a staged (%s) sequence to %llu tokens would lose the "
                      "only copy of its last partial page (written up to %llu, window %u)",
                      c->codec->name, (unsigned long long)n_tokens, (unsigned long long)s->hi,
                      s->window);
            rc = PGD_EINVAL;
            goto out;
        }
        s->ring_lo = lo < n_tokens ? lo : n_tokens / pt * pt;
    }
    if (s->hi > n_tokens) s->hi = n_tokens;
    if (s->n_live && n_tokens < s->mask_len) mask_clip(c, s, (uint32_t)n_tokens);
    uint32_t keep = (uint32_t)((n_tokens + c->page_tokens - 1) / c->page_tokens);
    while (s->n_pages > keep)
        page_unref(c, s->table[--s->n_pages]);
    s->len = n_tokens;
out:
    unlock(c);
    return rc;
}

/* ---- commit ---- */

/* Registers page i of s (full, committed) under hash h. */
static int register_page(pgd_cache *c, pgd_seq *s, uint32_t i, pgd_hash h)
{
    uint32_t page = s->table[i];
    if (s->unregistrable) return 0;
    if (page == PGD__NONE) { /* a window page released before its commit */
        s->last = h;
        return 0;
    }
    uint32_t e = pgd__index_find(c->ix, h);
    if (e != PGD__NONE) {
        const pgd__entry *en = pgd__index_entry(c->ix, e);
        /* A window group's entries have no parent (looked up by hash alone). */
        if (!c->flat && en->parent != s->last_entry) {
            /* The same hash under another parent: a caller's hashes are not a chain.
             * Keep the page private and stop registering this sequence. */
            pgd__logf(&c->log, PGD_LOG_WARN, "cache: block hash reused at another position");
            s->unregistrable = 1;
            return 0;
        }
        pgd_assert(pgd__index_loc(c->ix, e).tier == PGD__TIER_POOL);
        if (en->loc_id != page) {
            /* Computed twice: keep the cached copy, free ours. */
            uint32_t cached = en->loc_id;
            page_ref(c, cached);
            page_unref(c, page);
            s->table[i] = cached;
            c->st.n_dedup++;
        }
        if (!c->flat) s->last_entry = e;
        s->last = h;
        return 0;
    }
    if (c->page_entry[page] != PGD__NONE) {
        /* Shared (forked) page already registered under another hash: the two sequences
         * committed different tokens without writing. Keep the chain honest. */
        pgd__logf(&c->log, PGD_LOG_WARN, "cache: page %u already cached under another hash", page);
        s->unregistrable = 1;
        return 0;
    }
    e = pgd__index_insert(c->ix, h, c->flat ? PGD__NONE : s->last_entry, pgd__loc_pool(page));
    PGD_CHECK(e != PGD__NONE); /* capacity >= pages, each page at most once */
    pgd_pool_ref(c->pool, page);
    c->page_entry[page] = e;
    c->page_tenant[page] = (uint16_t)s->tenant;
    pgd__tenants_charge(&c->tn, s->tenant);
    ret_reset(c, page);
    /* The parent is no leaf now (a sequence holds it: it is in no heap; a page another
     * sequence dedups onto may be). */
    if (s->last_entry != PGD__NONE)
        heap_remove(c, HEAP_EXPIRY, pgd__index_entry(c->ix, s->last_entry)->loc_id);
    pgd_policy_page info = page_info(c, page);
    c->pol->insert(c->pstate, page, &info);
    if (c->on_register) {
        pgd_hash parent = {0, 0};
        if (s->last_entry != PGD__NONE) parent = pgd__index_entry(c->ix, s->last_entry)->hash;
        c->on_register(c->event_ud, h, parent, info.depth, page);
    }
    if (c->n_tiers) { /* one branch without tiers */
        if (c->wt_register) write_through(c, c->wt_register, e, page);
    }
    if (!c->flat) s->last_entry = e;
    s->last = h;
    c->st.n_registered++;
    return 1;
}

/* Token-mode commit. Page k of the sequence (counted from position 0) that becomes full
 * takes hashes[k] when k < n_hashes, else it is hashed here under the lock. */
static int commit(pgd_cache *c, pgd_seq *s, const int32_t *tokens, size_t n_tokens,
                  const pgd_hash *hashes, size_t n_hashes)
{
    int rc = 0;
    const uint32_t pt = c->page_tokens;
    lock(c);
    if (s->promo) wait_locked(c, s);
    if (s->mode == MODE_HASHES) {
        rc = PGD_ESTATE;
        goto out;
    }
    if (n_tokens > s->len - s->n_committed) {
        rc = PGD_EINVAL;
        goto out;
    }
    s->mode = MODE_TOKENS;
    if (s->compacted) {
        /* Its pages no longer hold what block hashes of its tokens name: count only. */
        s->n_committed += n_tokens;
        s->n_full = (uint32_t)(s->n_committed / pt);
        goto out;
    }
    size_t i = 0;
    while (i < n_tokens) {
        uint32_t off = (uint32_t)(s->n_committed % pt);
        size_t take = n_tokens - i < pt - off ? n_tokens - i : pt - off;
        const int32_t *page_tokens = NULL;
        if (off == 0 && take == pt) {
            page_tokens = tokens + i; /* a whole page straight from the caller's buffer */
        } else {
            memcpy(s->partial + off, tokens + i, take * sizeof *tokens);
            if (off + take == pt) page_tokens = s->partial;
        }
        if (page_tokens) {
            pgd_hash h = s->n_full < n_hashes
                             ? hashes[s->n_full]
                             : pgd__hash_block(&c->hasher, s->last, page_tokens, pt);
            rc += register_page(c, s, s->n_full, h);
            s->n_full++;
        }
        s->n_committed += take;
        i += take;
    }
out:
    if (rc >= 0 && s->win) {
        /* The same tokens in the window group (one hasher for both), under c's lock. */
        int r2 = commit(c->win, s->win, tokens, n_tokens, hashes, n_hashes);
        if (r2 < 0) rc = r2;
    }
    unlock(c);
    return rc;
}

int pgd_seq_commit(pgd_cache *c, pgd_seq *s, const int32_t *tokens, size_t n_tokens)
{
    if (n_tokens && !tokens) return PGD_EINVAL;
    return commit(c, s, tokens, n_tokens, NULL, 0);
}

int pgd_seq_commit_hashed(pgd_cache *c, pgd_seq *s, const int32_t *tokens, size_t n_tokens,
                          const pgd_hash *hashes, size_t n_hashes)
{
    if ((n_tokens && !tokens) || (n_hashes && !hashes)) return PGD_EINVAL;
    return commit(c, s, tokens, n_tokens, hashes, n_hashes);
}

int pgd_seq_commit_hashes(pgd_cache *c, pgd_seq *s, const pgd_hash *hashes, size_t n_hashes)
{
    int rc = 0;
    if (n_hashes && !hashes) return PGD_EINVAL;
    lock(c);
    if (s->promo) wait_locked(c, s);
    if (s->mode == MODE_TOKENS || (!s->compacted && s->n_committed % c->page_tokens)) {
        rc = PGD_ESTATE;
        goto out;
    }
    if (s->compacted) {
        /* Counts n_hashes pages of tokens (a compaction leaves n_committed anywhere). */
        if (n_hashes > (s->len - s->n_committed) / c->page_tokens) {
            rc = PGD_EINVAL;
            goto out;
        }
        s->mode = MODE_HASHES;
        s->n_committed += (uint64_t)n_hashes * c->page_tokens;
        s->n_full = (uint32_t)(s->n_committed / c->page_tokens);
        goto out;
    }
    if ((uint64_t)(s->n_full + n_hashes) * c->page_tokens > s->len) {
        rc = PGD_EINVAL;
        goto out;
    }
    s->mode = MODE_HASHES;
    for (size_t k = 0; k < n_hashes; k++) {
        rc += register_page(c, s, s->n_full, hashes[k]);
        s->n_full++;
        s->n_committed += c->page_tokens;
    }
out:
    if (rc >= 0 && s->win) {
        int r2 = pgd_seq_commit_hashes(c->win, s->win, hashes, n_hashes);
        if (r2 < 0) rc = r2;
    }
    unlock(c);
    return rc;
}

/* ---- promotion: tier -> pool ----
 *
 * match pins the pool prefix (pages 0..k-1), then asks the tiers, page by page and fastest
 * first, which of the next blocks they hold (stopping at the first none holds), allocates
 * pool pages for that run and queues its fill jobs: up to one per fill thread, over
 * contiguous sub-ranges of at least FILL_MIN_PAGES pages, all or none. The sequence's length
 * includes the run at once, n_full stays k: the pages are registered by settle(), under the
 * lock, once the last job is done (pgd_seq_ready / pgd_seq_wait, and every call that
 * mutates the sequence waits first). A failed fill cuts the sequence back to the pages
 * before the first failed page, whichever job read it; the tier stats count what a single
 * job stopping there would have (the pages before it promoted, it failed, none after). */

enum { PROMO_SKIPPED = 1 }; /* result[] of the pages after a failed fill: not used */
/* Least pages of one fill job: a job costs a queue round trip and a lock; 8 pages are a few
 * MiB of copy and hash on the 1B shape. */
enum { FILL_MIN_PAGES = 8 };

/* Doubles the match scan arrays. Returns PGD_OK or PGD_ENOMEM (unchanged). Lock held. */
static int scan_grow(pgd_cache *c)
{
    size_t cap = c->scan_cap ? c->scan_cap * 2 : 64;
    pgd_hash *h = pgd__realloc(&c->al, c->scan_hashes, cap * sizeof *h);
    if (!h) return PGD_ENOMEM;
    c->scan_hashes = h;
    uint8_t *src = pgd__realloc(&c->al, c->scan_src, cap * sizeof *src);
    if (!src) return PGD_ENOMEM;
    c->scan_src = src;
    c->scan_cap = cap;
    return PGD_OK;
}

/* One block: the record, then fills[n_fills], hashes[n], result[n], pages[n], src[n],
 * from[n], origin[n]. */
static promo *promo_alloc(pgd_cache *c, size_t n, uint32_t n_fills)
{
    size_t each = sizeof(pgd_hash) + sizeof(int) + sizeof(uint32_t) + 3;
    promo *pr = pgd__malloc(&c->al, sizeof *pr + n_fills * sizeof(fill) + n * each);
    if (!pr) return NULL;
    memset(pr, 0, sizeof *pr);
    pr->fills = (fill *)(pr + 1);
    pr->n_fills = n_fills;
    pr->hashes = (pgd_hash *)(pr->fills + n_fills);
    pr->result = (int *)(pr->hashes + n);
    pr->pages = (uint32_t *)(pr->result + n);
    pr->src = (uint8_t *)(pr->pages + n);
    pr->from = pr->src + n;
    pr->origin = pr->from + n;
    return pr;
}

/* The last fill job's epilogue, mu held: marks the pages after the first failed one
 * skipped (a later job may have read them: they are not used), counts what is used, and
 * publishes the promotion as done. */
static void promo_finish(pgd_cache *c, promo *pr)
{
    const uint64_t rec_bytes = c->ident.page_bytes + c->ident.bounds_bytes;
    uint32_t i = 0;
    for (; i < pr->n && pr->result[i] == PGD_OK; i++) {
        c->tst[pr->from[i]].promoted_pages++;
        c->tst[pr->from[i]].promoted_bytes += rec_bytes;
    }
    if (i < pr->n && pr->result[i] < 0) c->tst[pr->src[i]].promote_failed++;
    for (i++; i < pr->n; i++)
        pr->result[i] = PROMO_SKIPPED;
    pr->done = 1;
    pthread_cond_broadcast(&c->cv);
}

/* Reads page i of a promotion from a tier below its src, when src no longer holds it: a
 * tier that made room may have spilled it one tier down (the record reads the same from
 * any tier). Returns the status of the last get. */
static int fill_below(pgd_cache *c, promo *pr, uint32_t i, void *data, void *bounds)
{
    int rc = PGD_ENOTFOUND;
    for (uint32_t t = pr->src[i] + 1; rc == PGD_ENOTFOUND && t < c->n_tiers; t++) {
        rc = pgd_tier_get(c->tiers[t].tier, pr->hashes[i], data, bounds);
        if (rc == PGD_OK) pr->from[i] = (uint8_t)t;
    }
    return rc;
}

#define FILL_BATCH 64 /* pages per pgd_tier_get_many call of a fill job */

/* A fill job: reads its sub-range's records into their pool pages (payload, then the
 * writable key bounds), a batch of consecutive pages of one tier at a time
 * (pgd_tier_get_many: a remote tier pipelines them), stopping at its first failure; the
 * last job to end finishes the promotion under mu. */
static void fill_run(pgd__job *j)
{
    fill *f = (fill *)j;
    promo *pr = f->pr;
    pgd_cache *c = pr->c;
    int rc = PGD_OK;
    uint32_t i = f->lo;
    void *data[FILL_BATCH], *bnds[FILL_BATCH];
    while (i < f->hi && rc == PGD_OK) {
        uint32_t n = 0;
        while (i + n < f->hi && n < FILL_BATCH && pr->src[i + n] == pr->src[i]) {
            uint32_t page = pr->pages[i + n];
            bnds[n] = c->ident.bounds_bytes ? pgd__pool_key_bounds_mut(c->pool, page, 0, 0) : NULL;
            data[n] = pgd_pool_page_data(c->pool, page);
            pr->from[i + n] = pr->src[i + n];
            n++;
        }
        pgd_tier_get_many(c->tiers[pr->src[i]].tier, n, pr->hashes + i, data,
                          c->ident.bounds_bytes ? bnds : NULL, pr->result + i);
        for (uint32_t k = 0; k < n && rc == PGD_OK; k++, i++) {
            rc = pr->result[i];
            if (rc == PGD_ENOTFOUND) rc = pr->result[i] = fill_below(c, pr, i, data[k], bnds[k]);
        }
    }
    for (; i < f->hi; i++)
        pr->result[i] = PROMO_SKIPPED;
    lock(c);
    if (--pr->n_left == 0) promo_finish(c, pr);
    unlock(c); /* the last touch of c and pr (f is in pr): settle may free pr now */
}

/* Starts the promotion of pages k.. of s (see the section comment). Page j's hash is
 * hashes[j] for j < n_hashes, else computed from tokens. Leaves s as pin_chain did when
 * nothing is promoted (no tier holds page k, no pool page, no memory, the queue full).
 * Lock held. */
static void promote(pgd_cache *c, pgd_seq *s, const int32_t *tokens, const pgd_hash *hashes,
                    size_t n_hashes, size_t n_pages, uint32_t k)
{
    const uint32_t pt = c->page_tokens;
    uint64_t avail = n_available(c);
    size_t n_cand = 0, n = 0;
    pgd_hash h = s->last;
    for (size_t j = k; j < n_pages && n_cand < avail; j++) {
        h = j < n_hashes ? hashes[j] : pgd__hash_block(&c->hasher, h, tokens + j * pt, pt);
        if (pgd__index_find(c->ix, h) != PGD__NONE) break; /* cached under another chain */
        if (n_cand == c->scan_cap && scan_grow(c) != PGD_OK) break;
        c->scan_hashes[n_cand++] = h;
    }
    /* The run the tiers hold, one look-up of the rest of the run per tier and segment (a
     * remote tier answers a run in one round trip): each segment comes from the fastest
     * tier that holds its first block. */
    while (n < n_cand) {
        size_t run = 0;
        uint32_t t = 0;
        for (; t < c->n_tiers && !run; t++)
            run = pgd_tier_lookup(c->tiers[t].tier, c->scan_hashes + n, n_cand - n);
        if (!run) {
            for (t = 0; t < c->n_tiers; t++)
                c->tst[t].miss_pages++;
            break;
        }
        t--;
        for (uint32_t u = 0; u < t; u++) /* the faster tiers missed the segment's pages */
            c->tst[u].miss_pages += run;
        memset(c->scan_src + n, (int)t, run);
        n += run;
    }
    if (n == 0) return;
    size_t n_fills = (n + FILL_MIN_PAGES - 1) / FILL_MIN_PAGES;
    if (n_fills > c->n_movers) n_fills = c->n_movers;
    promo *pr = promo_alloc(c, n, (uint32_t)n_fills);
    if (!pr) return;
    uint32_t got = 0;
    while (got < n && alloc_page(c, s->tenant, got, &pr->pages[got]) == PGD_OK)
        got++;
    pr->c = c;
    pr->s = s;
    pr->k0 = k;
    pr->n = got;
    /* Fewer pages than asked (the pool): as few jobs as FILL_MIN_PAGES allows. */
    if (pr->n_fills > (got + FILL_MIN_PAGES - 1) / FILL_MIN_PAGES)
        pr->n_fills = (got + FILL_MIN_PAGES - 1) / FILL_MIN_PAGES;
    pr->n_left = pr->n_fills;
    for (uint32_t f = 0; f < pr->n_fills; f++) {
        fill *fl = &pr->fills[f];
        fl->job.fn = fill_run;
        fl->job.next = f + 1 < pr->n_fills ? &pr->fills[f + 1].job : NULL;
        fl->pr = pr;
        fl->lo = (uint32_t)((uint64_t)got * f / pr->n_fills);
        fl->hi = (uint32_t)((uint64_t)got * (f + 1) / pr->n_fills);
    }
    memcpy(pr->hashes, c->scan_hashes, got * sizeof *pr->hashes);
    memcpy(pr->src, c->scan_src, got);
    for (uint32_t i = 0; i < got; i++) {
        uint32_t o = (uint32_t)(pr->hashes[i].lo & (PGD__ORIGIN_SLOTS - 1));
        pr->origin[i] = 0;
        if (c->origin[o].tier && pgd_hash_eq(c->origin[o].block, pr->hashes[i])) {
            pr->origin[i] = c->origin[o].tier;
            c->origin[o].tier = 0;
        }
    }
    if (got == 0 || pgd__mover_submit(c->mover, &pr->fills[0].job, PGD__JOB_FILL) != PGD_OK) {
        for (uint32_t i = 0; i < got; i++)
            pgd_pool_unref(c->pool, pr->pages[i]); /* fresh, unregistered: freed */
        promo_free(c, pr);
        return;
    }
    if (c->sketch) /* a promotion is a hit of the block too (write-through admission) */
        for (uint32_t i = 0; i < got; i++)
            sketch_hit(c, pr->hashes[i]);
    for (uint32_t i = 0; i < got; i++) {
        s->table[k + i] = pr->pages[i];
        s->match_tier_pages[pr->origin[i] ? pr->origin[i] - 1u : pr->src[i]]++;
    }
    s->n_pages = k + got;
    s->len = s->n_committed = (uint64_t)s->n_pages * pt;
    s->ring_lo = s->hi = s->len; /* promoted pages are read from the pool, as matched ones */
    s->promo = pr;
    c->n_promos++;
}

/* Registers a finished promotion's pages in order, up to the first failed fill, and cuts
 * the sequence back there (as pin_chain would have left it). No-op while a job runs.
 * Lock held. */
static void settle(pgd_cache *c, pgd_seq *s)
{
    promo *pr = s->promo;
    if (!pr || !pr->done) return;
    s->promo = NULL;
    c->n_promos--;
    uint32_t ok = 0;
    while (ok < pr->n && pr->result[ok] == PGD_OK)
        ok++;
    for (uint32_t i = 0; i < ok; i++) {
        register_page(c, s, pr->k0 + i, pr->hashes[i]); /* may dedup: fine */
        s->n_full++;
        /* The promotion counted a hit (promote): admit the block now if that made it. */
        uint32_t page = s->table[pr->k0 + i];
        if (c->sketch && c->page_entry[page] != PGD__NONE)
            admit_hits(c, c->page_entry[page], page, sketch_peek(c, pr->hashes[i]));
    }
    if (ok < pr->n) {
        uint32_t cut = pr->k0 + ok;
        while (s->n_pages > cut)
            page_unref(c, s->table[--s->n_pages]);
        s->len = s->n_committed = (uint64_t)cut * c->page_tokens;
        s->ring_lo = s->hi = s->len;
    }
    /* What was really filled, from where (a fill may have read a slower tier). */
    memset(s->match_tier_pages, 0, sizeof s->match_tier_pages);
    for (uint32_t i = 0; i < ok; i++) {
        s->match_tier_pages[pr->from[i] == 0 && pr->origin[i] ? pr->origin[i] - 1u : pr->from[i]]++;
        c->tst[pr->from[i]].hit_pages++; /* a hit is a page served: a failed fill is none */
        c->tst[pr->from[i]].hit_tokens += c->page_tokens;
    }
    promo_free(c, pr);
}

/* Waits for s's promotion (if any) and settles it. Lock held (released while waiting). */
static void wait_locked(pgd_cache *c, pgd_seq *s)
{
    while (s->promo && !s->promo->done) {
        pthread_cond_wait(&c->cv, &c->mu);
        c->now_valid = 0;
    }
    settle(c, s);
}

int pgd_seq_ready(pgd_cache *c, pgd_seq *s)
{
    int r = 1;
    lock(c);
    if (s->promo) {
        if (s->promo->done)
            settle(c, s);
        else
            r = 0;
    }
    unlock(c);
    return r;
}

int pgd_seq_wait(pgd_cache *c, pgd_seq *s)
{
    lock(c);
    wait_locked(c, s);
    unlock(c);
    return PGD_OK;
}

void pgd_seq_match_info(pgd_cache *c, const pgd_seq *s, pgd_match_info *out)
{
    memset(out, 0, sizeof *out);
    lock(c);
    out->pool_tokens = (uint64_t)s->match_pool_pages * c->page_tokens;
    out->n_tiers = c->n_tiers;
    for (uint32_t t = 0; t < c->n_tiers; t++)
        out->tier_tokens[t] = (uint64_t)s->match_tier_pages[t] * c->page_tokens;
    unlock(c);
}

/* ---- park, prefetch, flush, tier stats ---- */

int pgd_seq_park(pgd_cache *c, pgd_seq *s)
{
    int n = 0;
    lock(c);
    wait_locked(c, s);
    for (uint32_t i = 0; c->n_tiers && i < s->n_full; i++) {
        uint32_t page = s->table[i], e = c->page_entry[page];
        if (e == PGD__NONE) continue; /* a private page (a hash conflict broke the chain) */
        pgd_hash h = pgd__index_entry(c->ix, e)->hash;
        if (in_flight(c, h) || held_below(c, 0, h)) continue;
        if (queue_put(c, 0, e, page) != PGD_OK) break; /* the slab is full */
        c->tst[0].parked_pages++;
        n++;
    }
    unlock(c);
    return n;
}

int pgd_cache_prefetch(pgd_cache *c, const pgd_hash *hashes, size_t n)
{
    int queued = 0;
    if (n && !hashes) return PGD_EINVAL;
    if (c->n_tiers < 2) return 0;
    lock(c);
    for (size_t i = 0; i < n && queued < INT32_MAX; i++) {
        pgd_hash h = hashes[i];
        if (pgd__index_find(c->ix, h) != PGD__NONE) continue; /* in the pool */
        if (holds(c, 0, h) || in_flight(c, h)) continue;
        uint32_t t = 1;
        while (t < c->n_tiers && !pgd_tier_lookup(c->tiers[t].tier, &h, 1))
            t++;
        if (t == c->n_tiers) break; /* nobody holds it: the chain ends here */
        wb_slot *w = slot_take(c);
        if (!w) break;
        pgd_hash none = {0, 0};
        w->kind = SLOT_PREFETCH;
        w->tier = t;
        w->has_ret = 0;
        uint32_t o = (uint32_t)(h.lo & (PGD__ORIGIN_SLOTS - 1));
        c->origin[o].block = h;
        c->origin[o].tier = (uint8_t)(t + 1);
        w->block = h;
        w->parent = i ? hashes[i - 1] : none;
        w->job.fn = slot_run;
        w->job.next = NULL;
        if (pgd__mover_submit(c->mover, &w->job, PGD__JOB_BACKGROUND) != PGD_OK) {
            slot_release(c, w);
            break;
        }
        queued++;
    }
    unlock(c);
    return queued;
}

int pgd_cache_flush(pgd_cache *c)
{
    int rc = PGD_OK;
    pgd__mover_drain(c->mover); /* without mu: the jobs take it */
    for (uint32_t t = 0; t < c->n_tiers; t++) {
        int r = pgd_tier_flush(c->tiers[t].tier);
        if (r != PGD_OK && rc == PGD_OK) rc = r;
    }
    return rc;
}

int pgd_cache_get_tier_stats(pgd_cache *c, uint32_t i, pgd_cache_tier_stats *out)
{
    if (i >= c->n_tiers) return PGD_EINVAL;
    lock(c);
    *out = c->tst[i];
    out->writeback_depth = c->n_slots_busy;
    unlock(c);
    return PGD_OK;
}

uint32_t pgd_cache_n_tiers(const pgd_cache *c)
{
    return c->n_tiers; /* set once by create: no lock */
}

pgd_tier *pgd_cache_tier(pgd_cache *c, uint32_t i)
{
    return i < c->n_tiers ? c->tiers[i].tier : NULL;
}

/* ---- write access ---- */

/* Makes page i of s private (copy-on-write when shared; may evict). Lock held.
 * Returns PGD_OK or PGD_ENOSPC (nothing changed). */
static int make_private(pgd_cache *c, pgd_seq *s, uint64_t i)
{
    uint32_t page = s->table[i];
    if (pgd_pool_refcount(c->pool, page) <= 1) return PGD_OK;
    pgd_pool_stats ps;
    pgd_pool_get_stats(c->pool, &ps);
    if (ps.n_pages_free == 0 && !evict_for(c, s->tenant, 0)) return PGD_ENOSPC;
    uint32_t copy = page;
    int rc = pgd_pool_cow(c->pool, &copy);
    if (rc < 0) return rc; /* the caller's copy hook failed; nothing changed */
    PGD_CHECK(rc == 1);
    /* The old page lost one holder: it may have become evictable. */
    if (pgd_pool_refcount(c->pool, page) == 1 && c->page_entry[page] != PGD__NONE)
        became_evictable(c, page);
    s->table[i] = copy;
    c->st.n_cow_copies++;
    return PGD_OK;
}

int pgd_seq_write_slot(pgd_cache *c, pgd_seq *s, uint64_t pos, uint32_t *page_id, uint32_t *slot)
{
    int rc = PGD_OK;
    if (c->win || c->flat) return PGD_EINVAL; /* a slot names no layer: write_kv routes */
    lock(c);
    if (s->promo) wait_locked(c, s);
    uint64_t i = pos / c->page_tokens;
    if (pos >= s->len || i < s->n_full) {
        rc = PGD_EINVAL;
        goto out;
    }
    rc = make_private(c, s, i);
    if (rc != PGD_OK) goto out;
    *page_id = s->table[i];
    *slot = (uint32_t)(pos % c->page_tokens);
out:
    unlock(c);
    return rc;
}

/* The ring rows of (layer, K|V, head) in a ring of w rows: w rows of head_dim f16. */
static uint16_t *ring_at(const pgd_cache *c, uint16_t *ring, uint32_t w, uint32_t layer,
                         uint32_t kind, uint32_t head)
{
    return ring + (((size_t)layer * 2 + kind) * c->g.n_kv_heads + head) * w * (size_t)c->g.head_dim;
}

static uint16_t *ring_rows(const pgd_cache *c, const pgd_seq *s, uint32_t layer, uint32_t kind,
                           uint32_t head)
{
    return ring_at(c, s->ring, s->window, layer, kind, head);
}

/* Gives s a ring of at least `rows` rows (and at least c->window), keeping the rows of
 * positions [hi - old window, hi) it holds. Returns PGD_OK, PGD_ENOMEM (nothing changed) or
 * PGD_EINVAL (too large). Lock held. */
static int ring_reserve(pgd_cache *c, pgd_seq *s, uint64_t rows)
{
    if (!c->window || (s->ring && s->window >= rows)) return PGD_OK;
    const uint32_t pt = c->page_tokens, hd = c->g.head_dim;
    uint64_t w = (rows + pt - 1) / pt * pt;
    if (w < c->window) w = c->window;
    if (w > (1u << 24) || c->row_elems > (SIZE_MAX / 4) / w) return PGD_EINVAL;
    uint16_t *ring = pgd__calloc(&c->al, c->row_elems * w, sizeof *ring);
    if (!ring) return PGD_ENOMEM;
    if (s->ring) {
        uint64_t p0 = s->hi > s->window ? s->hi - s->window : 0;
        for (uint32_t l = 0; l < c->g.n_layers; l++)
            for (uint32_t kind = 0; kind < 2; kind++)
                for (uint32_t h = 0; h < c->g.n_kv_heads; h++) {
                    const uint16_t *src = ring_rows(c, s, l, kind, h);
                    uint16_t *dst = ring_at(c, ring, (uint32_t)w, l, kind, h);
                    for (uint64_t p = p0; p < s->hi; p++)
                        memcpy(dst + (size_t)(p % w) * hd, src + (size_t)(p % s->window) * hd,
                               (size_t)hd * sizeof *ring);
                }
        pgd__free(&c->al, s->ring);
    }
    s->ring = ring;
    s->window = (uint32_t)w;
    return PGD_OK;
}

/* Encodes page i of s for one layer (every head, K and V) from the ring. Lock held. */
static void encode_from_ring(pgd_cache *c, pgd_seq *s, uint64_t i, uint32_t layer)
{
    const uint32_t pt = c->page_tokens, hd = c->g.head_dim;
    uint32_t slot0 = (uint32_t)((i * pt) % s->window); /* pages never wrap: window % pt == 0 */
    for (uint32_t kind = 0; kind < 2; kind++)
        for (uint32_t h = 0; h < c->g.n_kv_heads; h++) {
            const uint16_t *src = ring_rows(c, s, layer, kind, h) + (size_t)slot0 * hd;
            pgd__f16_to_f32_n(src, c->scratch, (size_t)pt * hd);
            void *region = kind ? pgd_pool_v(c->pool, s->table[i], layer, h)
                                : pgd_pool_k(c->pool, s->table[i], layer, h);
            c->codec->encode_page(kind ? PGD__V : PGD__K, region, pt, hd, c->scratch, pt);
        }
}

int pgd_seq_write_kv(pgd_cache *c, pgd_seq *s, uint64_t pos0, uint32_t n, uint32_t layer,
                     const float *k, const float *v)
{
    const uint32_t pt = c->page_tokens, hd = c->g.head_dim, nh = c->g.n_kv_heads;
    int rc = PGD_OK;
    if (!s || (n && (!k || !v))) return PGD_EINVAL;
    if (c->win) { /* model layer -> its group and its index there */
        if (layer >= c->n_layers_all) return PGD_EINVAL;
        if (c->layer_group[layer])
            return pgd_seq_write_kv(c->win, s->win, pos0, n, c->layer_local[layer], k, v);
        layer = c->layer_local[layer];
    }
    lock(c);
    if (s->promo) wait_locked(c, s);
    if (!c->scratch || c->g.arena_device || layer >= c->g.n_layers || pos0 > s->len ||
        n > s->len - pos0 || pos0 / pt < s->n_full || (c->window && pos0 < s->ring_lo) ||
        pos0 / pt < s->first_live) {
        pgd__logf(&c->log, PGD_LOG_ERROR,
                  "cache: write_kv of positions %llu..+%u, layer %u: out of range, immutable, "
                  "or no host payload",
                  (unsigned long long)pos0, n, layer);
        rc = PGD_EINVAL;
        goto out;
    }
    if (n == 0) goto out;
    /* The ring holds every row of the pages this write touches (attention reads a row's
     * own page from it), from the first page's start. */
    rc = ring_reserve(c, s, pos0 + n - pos0 / pt * pt);
    if (rc != PGD_OK) goto out;
    for (uint64_t i = pos0 / pt; i <= (pos0 + n - 1) / pt; i++) {
        rc = make_private(c, s, i);
        if (rc != PGD_OK) goto out;
    }
    float *kr = c->scratch + (size_t)pt * hd, *vr = kr + hd;
    for (uint32_t t = 0; t < n; t++) {
        uint64_t p = pos0 + t, i = p / pt;
        uint32_t slot = (uint32_t)(p % pt), page = s->table[i];
        for (uint32_t h = 0; h < nh; h++) {
            memcpy(kr, k + ((size_t)t * nh + h) * hd, (size_t)hd * sizeof *kr);
            memcpy(vr, v + ((size_t)t * nh + h) * hd, (size_t)hd * sizeof *vr);
            if (c->g.kv_rotate) {
                pgd__hadamard(kr, hd, c->g.rotate_seed, 0);
                pgd__hadamard(vr, hd, c->g.rotate_seed, 0);
            }
            float *b = pgd__pool_key_bounds_mut(c->pool, page, layer, h);
            if (b)
                for (uint32_t d = 0; d < hd; d++) {
                    b[d] = kr[d] < b[d] ? kr[d] : b[d];
                    b[hd + d] = kr[d] > b[hd + d] ? kr[d] : b[hd + d];
                }
            if (!c->window) {
                c->codec->write_row(PGD__K, pgd_pool_k(c->pool, page, layer, h), pt, hd, slot, kr);
                c->codec->write_row(PGD__V, pgd_pool_v(c->pool, page, layer, h), pt, hd, slot, vr);
            } else {
                size_t off = (size_t)(p % s->window) * hd;
                pgd__f32_to_f16_n(kr, ring_rows(c, s, layer, 0, h) + off, hd);
                pgd__f32_to_f16_n(vr, ring_rows(c, s, layer, 1, h) + off, hd);
            }
        }
        if (c->window && slot == pt - 1) encode_from_ring(c, s, i, layer);
        if (p + 1 > s->hi) s->hi = p + 1;
    }
out:
    unlock(c);
    return rc;
}

uint32_t pgd_cache_kv_residual(const pgd_cache *c)
{
    return c->window; /* set once by create: no lock */
}

int pgd__seq_residual(pgd_cache *c, pgd_seq *s, const uint16_t **ring, uint32_t *window,
                      uint64_t *lo)
{
    int rc = PGD_OK;
    lock(c);
    if (s->promo) wait_locked(c, s);
    if (!c->window) {
        rc = PGD_EINVAL;
        goto out;
    }
    rc = ring_reserve(c, s, c->window);
    if (rc != PGD_OK) goto out;
    /* Ring slots of positions below hi - window were overwritten since: pages there read
     * from the pool (only a query older than the last write would ask). */
    uint64_t l = s->ring_lo;
    if (s->hi > s->window) {
        uint64_t w = (s->hi - s->window + c->page_tokens - 1) / c->page_tokens * c->page_tokens;
        l = l > w ? l : w;
    }
    *ring = s->ring;
    *window = s->window;
    *lo = l;
out:
    unlock(c);
    return rc;
}

/* ---- accessors ---- */

const pgd__alloc *pgd__cache_alloc(const pgd_cache *c)
{
    return &c->al; /* set at create, never changed: no lock */
}

uint64_t pgd_seq_length(pgd_cache *c, const pgd_seq *s)
{
    lock(c);
    uint64_t n = s->len;
    unlock(c);
    return n;
}

uint64_t pgd_seq_n_committed(pgd_cache *c, const pgd_seq *s)
{
    lock(c);
    uint64_t n = s->n_committed;
    unlock(c);
    return n;
}

uint32_t pgd_seq_pages(pgd_cache *c, const pgd_seq *s, const uint32_t **ids)
{
    lock(c);
    *ids = s->table;
    uint32_t n = s->n_pages;
    unlock(c);
    return n;
}

size_t pgd_cache_hash_tokens(const pgd_cache *c, const void *salt, size_t salt_len,
                             const int32_t *tokens, size_t n_tokens, pgd_hash *hashes,
                             size_t max_hashes)
{
    size_t n = n_tokens / c->page_tokens;
    if (n > max_hashes) n = max_hashes;
    pgd_hash h = pgd__hash_seed(&c->hasher, salt, salt_len);
    for (size_t k = 0; k < n; k++) {
        h = pgd__hash_block(&c->hasher, h, tokens + k * c->page_tokens, c->page_tokens);
        hashes[k] = h;
    }
    return n;
}

/* ---- retention, admin operations, hints ---- */

pgd_retention pgd_retention_default(void)
{
    pgd_retention r = {PGD_PRIORITY_DEFAULT, 0, 0, 0};
    return r;
}

uint64_t pgd_cache_now_ns(const pgd_cache *c)
{
    pgd_cache *m = (pgd_cache *)c; /* the clock is called under the lock */
    lock(m);
    uint64_t t = now_ns(m);
    unlock(m);
    return t;
}

int pgd_seq_set_retention(pgd_cache *c, pgd_seq *s, const pgd_retention *r, uint64_t expect_tokens)
{
    if (!s || !r || r->priority > PGD_PRIORITY_MAX) return PGD_EINVAL;
    int rc = PGD_OK;
    lock(c);
    pins_expire(c); /* ended pins leave the budget */
    uint64_t need = r->pin ? (expect_tokens + c->page_tokens - 1) / c->page_tokens : 0;
    if (r->pin && need < s->pin_resv) need = s->pin_resv; /* set twice: the larger */
    uint32_t others = c->pin_reserved - s->pin_resv;
    if (need && (uint64_t)c->n_pinned + others + need > c->max_pins) {
        rc = PGD_ENOSPC;
        goto out;
    }
    c->pin_reserved = others + (uint32_t)need;
    s->pin_resv = (uint32_t)need;
    s->ret = *r;
    s->has_ret = 1;
    if (s->win) {
        /* The window pages take the priority and expiry; pins and hints hold the global
         * group's pages only (cache.h "Window layers"). */
        pgd_retention wr = *r;
        wr.pin = 0;
        wr.next_use_ms = 0;
        rc = pgd_seq_set_retention(c->win, s->win, &wr, 0);
    }
out:
    unlock(c);
    return rc;
}

/* How many blocks of the chain hashes[0..n) the pool holds, in a row from the first (each
 * a child of the one before). Their pages: pgd__index_find(hashes[k]). Lock held. */
static size_t chain_len(const pgd_cache *c, const pgd_hash *hashes, size_t n)
{
    uint32_t prev = PGD__NONE;
    size_t k = 0;
    for (; k < n; k++) {
        uint32_t e = pgd__index_find(c->ix, hashes[k]);
        if (e == PGD__NONE || pgd__index_entry(c->ix, e)->parent != prev) break;
        prev = e;
    }
    return k;
}

static uint32_t chain_page(const pgd_cache *c, pgd_hash h)
{
    return pgd__index_entry(c->ix, pgd__index_find(c->ix, h))->loc_id;
}

/* Sets a pin (pin 1) or drops it (-1) on blocks hashes[0..m) in every tier that keeps
 * retention. A tier refusing a pin (PGD_ENOSPC: its pin share) undoes this call's pins
 * and returns PGD_ENOSPC; other results (a record the tier lacks, I/O) are ignored. Lock
 * held (lock order: cache, then tier). */
static int tiers_pin(pgd_cache *c, const pgd_hash *hashes, size_t m, int pin, uint64_t ttl_ms)
{
    for (uint32_t t = 0; t < c->n_tiers; t++) {
        pgd_tier *tier = c->tiers[t].tier;
        if (!pgd_tier_has_retain(tier)) continue;
        for (size_t k = 0; k < m; k++) {
            pgd_tier_retention tr;
            memset(&tr, 0, sizeof tr);
            tr.priority = c->ret[chain_page(c, hashes[k])].priority;
            tier_tenant(c, chain_page(c, hashes[k]), &tr);
            tr.tenant_share = c->tn.e[c->page_tenant[chain_page(c, hashes[k])]].tier_share[t];
            tr.ttl_s = pin > 0 && ttl_ms ? (ttl_ms + 999) / 1000 : 0;
            tr.pin = pin;
            if (pgd_tier_retain(tier, hashes[k], &tr) != PGD_ENOSPC || pin < 0) continue;
            pgd__logf(&c->log, PGD_LOG_WARN, "cache: tier %u (%s) refused a pin (its pin share)", t,
                      pgd_tier_name(tier));
            tr.pin = -1;
            tr.ttl_s = 0;
            for (uint32_t u = 0; u <= t; u++)
                for (size_t j = 0; j < (u == t ? k : m); j++)
                    if (pgd_tier_has_retain(c->tiers[u].tier))
                        pgd_tier_retain(c->tiers[u].tier, hashes[j], &tr);
            return PGD_ENOSPC;
        }
    }
    return PGD_OK;
}

int pgd_cache_pin(pgd_cache *c, const pgd_hash *hashes, size_t n, uint64_t ttl_ms)
{
    if (n && !hashes) return PGD_EINVAL;
    int rc;
    lock(c);
    pins_expire(c);
    size_t m = chain_len(c, hashes, n);
    uint64_t fresh = 0;
    for (size_t k = 0; k < m; k++)
        fresh += c->ret[chain_page(c, hashes[k])].pins == 0;
    if (!pins_fit(c, fresh)) {
        pgd__logf(&c->log, PGD_LOG_WARN,
                  "cache: pinning %llu more pages would pass pin_share (%u pinned, %u reserved, "
                  "at most %u)",
                  (unsigned long long)fresh, c->n_pinned, c->pin_reserved, c->max_pins);
        rc = PGD_ENOSPC;
        goto out;
    }
    rc = tiers_pin(c, hashes, m, 1, ttl_ms);
    if (rc != PGD_OK) goto out;
    uint64_t until = ttl_ms ? now_ns(c) + ttl_ms * 1000000u : 0;
    for (size_t k = 0; k < m; k++)
        pin_page(c, chain_page(c, hashes[k]), until);
    rc = m > INT32_MAX ? INT32_MAX : (int)m;
out:
    unlock(c);
    return rc;
}

/* Drops the pins of the chain's first m pages, deepest first (the order a release gives
 * the policy). Returns the pages that were pinned. Lock held. */
static int unpin_chain(pgd_cache *c, const pgd_hash *hashes, size_t m)
{
    int n = 0;
    for (size_t k = m; k-- > 0;) {
        uint32_t page = chain_page(c, hashes[k]);
        if (c->ret[page].pins == 0) continue;
        unpin_page(c, page);
        n++;
    }
    tiers_pin(c, hashes, m, -1, 0);
    return n;
}

int pgd_cache_unpin(pgd_cache *c, const pgd_hash *hashes, size_t n)
{
    if (n && !hashes) return PGD_EINVAL;
    lock(c);
    int rc = unpin_chain(c, hashes, chain_len(c, hashes, n));
    unlock(c);
    return rc;
}

int pgd_cache_evict_chain(pgd_cache *c, const pgd_hash *hashes, size_t n)
{
    if (n && !hashes) return PGD_EINVAL;
    int rc = 0;
    lock(c);
    size_t m = chain_len(c, hashes, n);
    unpin_chain(c, hashes, m);
    for (size_t k = m; k-- > 0 && rc < INT32_MAX;) {
        uint32_t page = chain_page(c, hashes[k]);
        if (pgd_pool_refcount(c->pool, page) != 1 || !is_leaf(c, page))
            break; /* held, or extended outside the chain: it and its ancestors stay */
        evict_page(c, page, PGD__TENANT_NONE);
        rc++;
    }
    unlock(c);
    return rc;
}

/* Warms hashes[0..n) of the tenant whose chain seed is seed (its index: tenant, for quotas
 * and stats): an internal sequence matches
 * them (pool prefix, then a promotion from the tiers), waits for the fills and releases the
 * pages without merging a retention. Counts no query. Returns the pages the pool holds for
 * the chain. Lock held (released while the fills run). */
static int warm_locked(pgd_cache *c, pgd_hash seed, uint32_t tenant, const pgd_hash *hashes,
                       size_t n)
{
    pgd_seq *s;
    if (n > c->n_pages) n = c->n_pages; /* the pool holds no more */
    int rc = seq_alloc_any(c, &s);
    if (rc != PGD_OK) return rc;
    s->internal = 1;
    s->last = s->seed = seed;
    s->tenant = tenant;
    seq_link(c, s);
    if (table_reserve(c, s, n) != PGD_OK) {
        seq_release(c, s);
        return PGD_ENOMEM;
    }
    uint32_t k = pin_chain(c, s, NULL, hashes, n, n);
    s->mode = MODE_HASHES;
    if (c->n_tiers && k < n) promote(c, s, NULL, hashes, n, n, k);
    wait_locked(c, s);
    rc = (int)s->n_full;
    seq_release(c, s);
    return rc;
}

int pgd_cache_warm(pgd_cache *c, const void *salt, size_t salt_len, const pgd_hash *hashes,
                   size_t n)
{
    if ((n && !hashes) || (salt_len && !salt)) return PGD_EINVAL;
    pgd_hash seed = pgd__hash_seed(&c->hasher, salt, salt_len);
    uint64_t id = salt_len ? pgd__tenant_id(&c->hasher, salt, salt_len) : 0;
    lock(c);
    int rc = warm_locked(c, seed, pgd__tenants_get(&c->tn, seed, id), hashes, n);
    unlock(c);
    return rc;
}

size_t pgd_cache_lookup(pgd_cache *c, const pgd_hash *hashes, size_t n)
{
    if (n && !hashes) return 0;
    lock(c);
    size_t m = chain_len(c, hashes, n);
    unlock(c);
    return m;
}

/* Registers the chain copy[0..n) (salt_len salt bytes after it; allocated by the caller,
 * owned by the hint array from here on, freed on PGD_ENOSPC) as due at due_ns, replacing
 * the entry of the same first and last hash. Returns PGD_OK or PGD_ENOSPC. Lock held. */
static int hint_insert(pgd_cache *c, pgd_hash *copy, size_t n, size_t salt_len, uint64_t due_ns)
{
    uint32_t slot = PGD__NONE;
    for (uint32_t i = 0; i < PGD__MAX_HINTS; i++) {
        const hint *h = &c->hints[i];
        if (!h->hashes) {
            if (slot == PGD__NONE) slot = i;
            continue;
        }
        if (pgd_hash_eq(h->hashes[0], copy[0]) && pgd_hash_eq(h->hashes[h->n - 1], copy[n - 1])) {
            slot = i; /* hinted again: replaces its entry */
            break;
        }
    }
    if (slot == PGD__NONE) {
        pgd__free(&c->al, copy);
        return PGD_ENOSPC;
    }
    hint *h = &c->hints[slot];
    if (h->hashes)
        pgd__free(&c->al, h->hashes);
    else
        c->n_hints++;
    h->hashes = copy;
    h->n = n;
    h->salt_len = salt_len;
    h->due_ns = due_ns;
    return PGD_OK;
}

int pgd_cache_hint(pgd_cache *c, const void *salt, size_t salt_len, const pgd_hash *hashes,
                   size_t n, uint64_t due_ns)
{
    if (n == 0 || !hashes || (salt_len && !salt)) return PGD_EINVAL;
    if (n > (SIZE_MAX - salt_len) / sizeof *hashes) return PGD_ENOMEM;
    pgd_hash *copy = pgd__malloc(&c->al, n * sizeof *hashes + salt_len);
    if (!copy) return PGD_ENOMEM;
    memcpy(copy, hashes, n * sizeof *hashes);
    if (salt_len) memcpy((uint8_t *)(copy + n), salt, salt_len);
    lock(c);
    int rc = hint_insert(c, copy, n, salt_len, due_ns);
    unlock(c);
    return rc;
}

int pgd_cache_hints_run(pgd_cache *c, uint64_t lead_ns)
{
    int n = 0;
    lock(c);
    uint64_t now = now_ns(c);
    uint64_t limit = now + lead_ns < now ? UINT64_MAX : now + lead_ns;
    for (uint32_t i = 0; i < PGD__MAX_HINTS; i++) {
        hint h = c->hints[i];
        if (!h.hashes || h.due_ns > limit) continue;
        /* Forgotten before the warm, which drops the lock while fills run (another thread
         * may hint meanwhile: it gets a free entry). */
        memset(&c->hints[i], 0, sizeof c->hints[i]);
        c->n_hints--;
        pgd_hash seed = pgd__hash_seed(&c->hasher, h.hashes + h.n, h.salt_len);
        uint64_t id = h.salt_len ? pgd__tenant_id(&c->hasher, h.hashes + h.n, h.salt_len) : 0;
        warm_locked(c, seed, pgd__tenants_get(&c->tn, seed, id), h.hashes, h.n);
        pgd__free(&c->al, h.hashes);
        n++;
    }
    unlock(c);
    return n;
}

uint32_t pgd_cache_n_hints(pgd_cache *c)
{
    lock(c);
    uint32_t n = c->n_hints;
    unlock(c);
    return n;
}

/* ---- tenants (quotas and per-tenant stats; the table is tenants.c) ---- */

int pgd_cache_set_tenant(pgd_cache *c, const void *salt, size_t salt_len,
                         const pgd_tenant_params *tp)
{
    if (!tp || (salt_len && !salt)) return PGD_EINVAL;
    pgd_hash key = pgd__hash_seed(&c->hasher, salt, salt_len);
    uint64_t id = salt_len ? pgd__tenant_id(&c->hasher, salt, salt_len) : 0;
    lock(c);
    int rc = pgd__tenants_set(&c->tn, key, id, tp);
    unlock(c);
    return rc;
}

uint32_t pgd_cache_n_tenants(pgd_cache *c)
{
    lock(c);
    uint32_t n = c->tn.n_used;
    unlock(c);
    return n;
}

int pgd_cache_get_tenant_stats(pgd_cache *c, uint32_t i, pgd_tenant_stats *out)
{
    if (!out) return PGD_EINVAL;
    lock(c);
    int rc = pgd__tenants_stats(&c->tn, i, out);
    unlock(c);
    return rc;
}

uint32_t pgd_cache_tenant_of(pgd_cache *c, const void *salt, size_t salt_len)
{
    if (salt_len && !salt) salt_len = 0;
    pgd_hash key = pgd__hash_seed(&c->hasher, salt, salt_len);
    lock(c);
    uint32_t i = pgd__tenants_find(&c->tn, key);
    unlock(c);
    return i;
}

/* ---- eviction, stats, check ---- */

int pgd_cache_evict(pgd_cache *c, uint32_t n_pages)
{
    int n = 0;
    lock(c);
    while ((uint32_t)n < n_pages && n < INT32_MAX && evict_one(c))
        n++;
    unlock(c);
    return n;
}

int pgd_cache_clear(pgd_cache *c)
{
    int n = 0;
    lock(c);
    while (n < INT32_MAX && evict_one(c))
        n++;
    unlock(c);
    if (c->win) {
        int w = pgd_cache_clear(c->win);
        n = w > INT32_MAX - n ? INT32_MAX : n + w;
    }
    return n;
}

void pgd_cache_get_stats(pgd_cache *c, pgd_cache_stats *out)
{
    pgd_pool_stats ps;
    lock(c);
    *out = c->st;
    pgd_pool_get_stats(c->pool, &ps);
    out->n_pages_total = ps.n_pages_total;
    out->n_pages_free = ps.n_pages_free;
    out->n_pages_cached = pgd__index_size(c->ix);
    out->n_pages_evictable = c->pol->size(c->pstate);
    out->n_pages_used = ps.n_pages_used - out->n_pages_evictable;
    out->n_seqs = c->n_seqs;
    out->n_cow_copies = c->st.n_cow_copies;
    out->n_window_cut_tokens = c->n_cut_tokens;
    unlock(c);
    if (c->win) {
        pgd_cache_stats w;
        pgd_cache_get_stats(c->win, &w);
        out->n_window_pages_total = w.n_pages_total;
        out->n_window_pages_free = w.n_pages_free;
        out->n_window_pages_used = w.n_pages_used;
        out->n_window_pages_cached = w.n_pages_cached;
        out->n_window_evictions = w.n_evictions;
        lock(c->win);
        out->n_window_released = c->win->n_released;
        unlock(c->win);
    }
}

/* The pin counts and the budget add up; each heap is ordered and its positions point back.
 * n_pinned: the pinned pages the page walk counted. Lock held. */
static int check_retention(pgd_cache *c, uint32_t n_pinned)
{
    uint64_t resv = 0;
    for (const pgd_seq *s = c->seqs; s; s = s->next)
        resv += s->pin_resv;
    if (n_pinned != c->n_pinned || resv != c->pin_reserved ||
        (uint64_t)c->n_pinned + c->pin_reserved > c->max_pins) {
        pgd__logf(&c->log, PGD_LOG_ERROR,
                  "cache check: %u pinned pages (%u counted), %u reserved (%llu counted), "
                  "at most %u",
                  n_pinned, c->n_pinned, c->pin_reserved, (unsigned long long)resv, c->max_pins);
        return PGD_ECORRUPT;
    }
    for (int w = 0; w < 2; w++) {
        const page_heap *h = &c->heap[w];
        for (uint32_t i = 0; i < h->n; i++) {
            uint32_t page = h->a[i];
            if (page >= c->n_pages || c->ret[page].heap_pos[w] != i ||
                (i && heap_less(c, w, page, h->a[(i - 1) / 2]))) {
                pgd__logf(&c->log, PGD_LOG_ERROR, "cache check: the %s heap is broken at %u",
                          w == HEAP_PIN ? "pin" : "expiry", i);
                return PGD_ECORRUPT;
            }
        }
    }
    return PGD_OK;
}

/* The dead-slot mask of s: only a compacted sequence has one, within its length, every
 * (l, h) with at least one live slot, and some (l, h) with a dead one. Lock held. */
static int check_mask(pgd_cache *c, const pgd_seq *s)
{
    if (!s->n_live && !s->mask_len) return PGD_OK;
    const uint32_t n_cols = c->g.n_layers * c->g.n_kv_heads;
    int bad = !s->n_live || !s->compacted || s->mask_len == 0 || s->mask_len > s->len;
    uint32_t n_dead = 0;
    for (uint32_t i = 0; !bad && i < n_cols; i++) {
        bad = s->n_live[i] == 0 || s->n_live[i] > s->mask_len;
        n_dead += s->n_live[i] < s->mask_len;
    }
    if (!bad && n_dead) return PGD_OK;
    pgd__logf(&c->log, PGD_LOG_ERROR,
              "cache check: a sequence's dead-slot mask (length %u) disagrees with it (length "
              "%llu)",
              s->mask_len, (unsigned long long)s->len);
    return PGD_ECORRUPT;
}

static int check_locked(pgd_cache *c)
{
    int rc = pgd_pool_check(c->pool);
    if (rc != PGD_OK) return rc;
    rc = pgd__index_check(c->ix, &c->log);
    if (rc != PGD_OK) return rc;
    rc = pgd__tenants_check(&c->tn, &c->log);
    if (rc != PGD_OK) return rc;
    /* holders[n_pages + t]: the cached pages charged to tenant t, recounted;
     * holders[n_pages + n_entries + t]: of those, pinned. */
    uint32_t *holders =
        pgd__calloc(&c->al, (size_t)c->n_pages + 2 * (size_t)c->tn.n_entries, sizeof *holders);
    if (!holders) return PGD_ENOMEM;
    rc = PGD_ECORRUPT;
    uint32_t n_seqs = 0, n_evictable = 0, n_cached = 0, n_promos = 0, n_pinned = 0;
    uint32_t n_in_heap[2] = {0, 0};
    for (const pgd_seq *s = c->seqs; s; s = s->next) {
        n_seqs++;
        uint64_t want_pages = (s->len + c->page_tokens - 1) / c->page_tokens;
        /* A pending promotion's pages count as committed, not yet as full (registered). */
        uint32_t want_full = s->promo ? s->promo->k0 : (uint32_t)(s->n_committed / c->page_tokens);
        if (s->n_pages != want_pages || s->n_committed > s->len || s->n_full != want_full ||
            s->hi > s->len || s->ring_lo % c->page_tokens || (s->ring && !c->window)) {
            pgd__logf(&c->log, PGD_LOG_ERROR, "cache check: sequence lengths disagree");
            goto out;
        }
        if (s->promo) {
            const promo *pr = s->promo;
            n_promos++;
            int bad = pr->s != s || pr->c != c || pr->n == 0 || s->n_pages != pr->k0 + pr->n ||
                      s->len != s->n_committed ||
                      s->n_committed != (uint64_t)s->n_pages * c->page_tokens;
            /* Its jobs tile the run in order; done exactly when none is left. */
            bad = bad || pr->n_fills == 0 || pr->n_fills > c->n_movers ||
                  pr->n_left > pr->n_fills || pr->done != (pr->n_left == 0);
            for (uint32_t f = 0; !bad && f < pr->n_fills; f++)
                bad = pr->fills[f].pr != pr || pr->fills[f].lo >= pr->fills[f].hi ||
                      pr->fills[f].lo != (f ? pr->fills[f - 1].hi : 0) ||
                      (f + 1 == pr->n_fills && pr->fills[f].hi != pr->n);
            for (uint32_t i = 0; !bad && i < pr->n; i++)
                bad = s->table[pr->k0 + i] != pr->pages[i] || pr->src[i] >= c->n_tiers ||
                      c->page_entry[pr->pages[i]] != PGD__NONE ||
                      pgd_pool_refcount(c->pool, pr->pages[i]) != 1;
            if (bad) {
                pgd__logf(&c->log, PGD_LOG_ERROR,
                          "cache check: a promotion record disagrees "
                          "with its sequence");
                goto out;
            }
        }
        uint32_t prev = PGD__NONE;
        int ended = 0; /* compacted: past its registered prefix */
        if (s->first_live > s->n_pages || (s->first_live && !c->flat)) {
            pgd__logf(&c->log, PGD_LOG_ERROR, "cache check: released pages past the table");
            goto out;
        }
        for (uint32_t i = 0; i < s->n_pages; i++) {
            uint32_t page = s->table[i];
            if (i < s->first_live) { /* a window group's released page */
                if (page != PGD__NONE) {
                    pgd__logf(&c->log, PGD_LOG_ERROR, "cache check: released page %u kept", i);
                    goto out;
                }
                continue;
            }
            if (page >= c->n_pages || pgd_pool_refcount(c->pool, page) == 0) {
                pgd__logf(&c->log, PGD_LOG_ERROR, "cache check: table holds a free page %u", page);
                goto out;
            }
            holders[page]++;
            int chained = i < s->n_full && !s->unregistrable && !c->flat;
            if (s->compacted) {
                /* Its registered pages are the prefix it kept whole; the rest its own. */
                if (c->page_entry[page] == PGD__NONE) {
                    ended = 1;
                } else if (ended) {
                    pgd__logf(&c->log, PGD_LOG_ERROR,
                              "cache check: page %u of a compacted sequence is registered past "
                              "its kept prefix",
                              i);
                    goto out;
                }
                chained = !ended;
            }
            if (chained) {
                /* Registered pages form a chain in the index. */
                uint32_t e = c->page_entry[page];
                const pgd__entry *en = pgd__index_entry(c->ix, e);
                if (!en || en->parent != prev || pgd__index_loc(c->ix, e).tier != PGD__TIER_POOL ||
                    en->loc_id != page) {
                    pgd__logf(&c->log, PGD_LOG_ERROR,
                              "cache check: page %u of a sequence breaks its chain", i);
                    goto out;
                }
                prev = e;
            }
        }
        if (check_mask(c, s) != PGD_OK) goto out;
    }
    if (n_seqs != c->n_seqs || n_promos != c->n_promos) goto out;
    if (c->n_tiers) {
        /* The write-back slab: the free list and the busy slots add up. */
        uint32_t n_free = 0, n_busy = 0;
        for (uint32_t i = c->slot_free; i != PGD__NONE && n_free <= c->n_slots;
             i = c->slots[i].next_free) {
            if (i >= c->n_slots || c->slots[i].kind != SLOT_FREE) break;
            n_free++;
        }
        for (uint32_t i = 0; i < c->n_slots; i++)
            n_busy += c->slots[i].kind != SLOT_FREE;
        if (n_busy != c->n_slots_busy || n_free + n_busy != c->n_slots) {
            pgd__logf(&c->log, PGD_LOG_ERROR,
                      "cache check: write-back slab: %u free + %u busy of %u slots (%u counted)",
                      n_free, n_busy, c->n_slots, c->n_slots_busy);
            goto out;
        }
    }
    for (uint32_t page = 0; page < c->n_pages; page++) {
        uint32_t e = c->page_entry[page];
        uint32_t cached = e != PGD__NONE;
        n_cached += cached;
        if (cached) {
            const pgd__entry *en = pgd__index_entry(c->ix, e);
            if (!en || pgd__index_loc(c->ix, e).tier != PGD__TIER_POOL || en->loc_id != page) {
                pgd__logf(&c->log, PGD_LOG_ERROR, "cache check: page %u maps to a bad entry", page);
                goto out;
            }
            if (c->page_tenant[page] >= c->tn.n_used) {
                pgd__logf(&c->log, PGD_LOG_ERROR, "cache check: page %u charged to tenant %u", page,
                          c->page_tenant[page]);
                goto out;
            }
            holders[c->n_pages + c->page_tenant[page]]++;
        }
        const page_ret *r = &c->ret[page];
        uint32_t pinned = r->pins > 0;
        n_pinned += pinned;
        if (pinned && cached) holders[c->n_pages + c->tn.n_entries + c->page_tenant[page]]++;
        int in_pin = pinned && r->pin_until_ns;
        n_in_heap[HEAP_PIN] += r->heap_pos[HEAP_PIN] != PGD__NONE;
        n_in_heap[HEAP_EXPIRY] += r->heap_pos[HEAP_EXPIRY] != PGD__NONE;
        if ((pinned && !cached) || (!pinned && r->pin_until_ns) ||
            in_pin != (r->heap_pos[HEAP_PIN] != PGD__NONE)) {
            pgd__logf(&c->log, PGD_LOG_ERROR, "cache check: page %u: pins disagree", page);
            goto out;
        }
        uint32_t ref = pgd_pool_refcount(c->pool, page);
        if (ref != holders[page] + cached + pinned) {
            pgd__logf(&c->log, PGD_LOG_ERROR,
                      "cache check: page %u has refcount %u but %u holders%s%s", page, ref,
                      holders[page], cached ? " + index" : "", pinned ? " + pins" : "");
            goto out;
        }
        int evictable = cached && ref == 1;
        /* The expiry heap: exactly the evictable leaves with an expiry. */
        int in_exp = evictable && r->expires_ns && is_leaf(c, page);
        if (in_exp != (r->heap_pos[HEAP_EXPIRY] != PGD__NONE)) {
            pgd__logf(&c->log, PGD_LOG_ERROR, "cache check: page %u %s the expiry heap", page,
                      in_exp ? "misses" : "wrongly in");
            goto out;
        }
        n_evictable += evictable;
        if (evictable != !!c->pol->contains(c->pstate, page)) {
            pgd__logf(&c->log, PGD_LOG_ERROR, "cache check: policy %s page %u wrongly",
                      evictable ? "misses" : "holds", page);
            goto out;
        }
    }
    if (n_evictable != c->pol->size(c->pstate)) goto out;
    /* Each tenant is charged exactly the cached pages that name it. */
    for (uint32_t t = 0; t < c->tn.n_entries; t++)
        if (holders[c->n_pages + t] != c->tn.e[t].pages_held ||
            holders[c->n_pages + c->tn.n_entries + t] != c->tn.e[t].pages_pinned) {
            pgd__logf(&c->log, PGD_LOG_ERROR,
                      "cache check: tenant %u holds %u pages (%u pinned), %u (%u) counted", t,
                      c->tn.e[t].pages_held, c->tn.e[t].pages_pinned, holders[c->n_pages + t],
                      holders[c->n_pages + c->tn.n_entries + t]);
            goto out;
        }
    if (n_in_heap[0] != c->heap[0].n || n_in_heap[1] != c->heap[1].n) {
        pgd__logf(&c->log, PGD_LOG_ERROR, "cache check: heap sizes disagree");
        goto out;
    }
    if (check_retention(c, n_pinned) != PGD_OK) goto out;
    /* Every index entry is a pool page that points back at it: the index describes the
     * pool only (each tier indexes its own records). */
    if (pgd__index_size(c->ix) != n_cached) {
        pgd__logf(&c->log, PGD_LOG_ERROR, "cache check: %u index entries but %u cached pages",
                  pgd__index_size(c->ix), n_cached);
        goto out;
    }
    rc = PGD_OK;
out:
    pgd__free(&c->al, holders);
    return rc;
}

int pgd_cache_check(pgd_cache *c)
{
    if (c->win) {
        int rw = window_check(c);
        if (rw != PGD_OK) return rw;
    }
    lock(c);
    int rc = check_locked(c);
    unlock(c);
    return rc;
}

/* ---- compaction (pgd_seq_compact) ----
 *
 * A compaction rewrites the slots of one sequence from keep lists, one per (layer, KV head),
 * into the P1 = ceil(n_out / page_tokens) pages it holds afterwards:
 *
 *   old table: [a0][a1][b2][b3][c4][c5]    a: kept whole (every list keeps their slots)
 *   new table: [a0][a1][d2][c5]            c: moved: a private page whose rows, in order,
 *                                             are a written page's rows in every list
 *                                          d: written: the sequence's own private pages
 *                                             (refcount 1, unregistered) in place first,
 *                                             then its other private pages it no longer
 *                                             needs, then fresh pages from the pool
 *
 * Pages kept whole are the leading full pages whose every slot each list keeps in place
 * (keep[j] == j; a list ascends from distinct slots, so keep[j] >= j, and a slot kept in
 * place means every slot before it is): they are not touched, shared or registered, so such
 * a prefix stays in the index and in the other sequences. A full page that every list
 * takes whole from one private page (a window moving by whole pages: StreamingLLM) moves by
 * id: no copy, its key bounds with it. Every other slot is gathered per column (layer, K|V,
 * head) into a buffer first (row codecs: the row's bytes; staged codecs: f16 rows, from the
 * ring where it holds them, else decoded from the pool), then written to the destination
 * pages; so a destination may be any page the sequence holds privately, whatever rows it
 * held. Staged codecs encode each written full page (encode_page of the f16 rows, as the
 * write path does) and put rows [ring_lo, n_out) in the ring, as if the kept rows had been
 * written at their new slots; ring_lo is past the pages kept whole or moved (they are
 * encoded already), and at least n_out - window. Dead slots are zeros. Key bounds of a
 * written page: min / max over its live rows of the values stored (row codecs: decoded;
 * staged: the f16 rows encoded). Old pages not reused are released last, deepest first.
 * Everything that can fail (memory, pages) is reserved before anything changes.
 */

/* Clips the dead-slot mask of s to n slots (a truncation below mask_len): dead slots past
 * the end are gone, and a mask with no dead slot left is dropped. Lock held. */
static void mask_clip(pgd_cache *c, pgd_seq *s, uint32_t n)
{
    const uint32_t n_cols = c->g.n_layers * c->g.n_kv_heads;
    uint32_t n_dead = 0;
    for (uint32_t i = 0; i < n_cols; i++) {
        if (s->n_live[i] > n) s->n_live[i] = n;
        n_dead += s->n_live[i] < n;
    }
    s->mask_len = n;
    if (n_dead) return;
    pgd__free(&c->al, s->n_live);
    s->n_live = NULL;
    s->mask_len = 0;
}

void pgd__seq_mask(const pgd_seq *s, uint32_t *mask_len, const uint32_t **n_live)
{
    *mask_len = s->mask_len;
    *n_live = s->n_live;
}

uint64_t pgd_seq_n_dropped(pgd_cache *c, const pgd_seq *s)
{
    lock(c);
    uint64_t n = s->n_dropped;
    unlock(c);
    return n;
}

/* Checks a compaction's lists and counts against s (cache.h). Returns PGD_OK or PGD_EINVAL
 * (logged). O(total list length). Lock held. */
static int compact_check(pgd_cache *c, const pgd_seq *s, uint32_t n_out, const uint32_t *keep,
                         size_t ld, const uint32_t *n_live)
{
    const uint32_t n_cols = c->g.n_layers * c->g.n_kv_heads;
    const char *why = NULL;
    if (n_out == 0 || n_out > s->len)
        why = "n_out is 0 or above the length";
    else if (c->g.arena_device)
        why = "a device arena cannot be compacted on the host";
    else if (ld > SIZE_MAX / n_cols)
        why = "ld is too large";
    for (uint32_t i = 0; !why && i < n_cols; i++) {
        uint32_t n = n_live ? n_live[i] : n_out;
        const uint32_t *k = keep + i * ld;
        if (n == 0 || n > n_out)
            why = "an n_live is 0 or above n_out";
        else if (n > ld)
            why = "ld is below a list's length";
        for (uint32_t j = 0; !why && j < n; j++)
            if (k[j] >= s->len || (j && k[j] <= k[j - 1]))
                why = "a keep list is not ascending, distinct and below the length";
            else if (s->n_live && k[j] >= s->n_live[i] && k[j] < s->mask_len)
                why = "a keep list keeps a dead slot";
    }
    if (!why) return PGD_OK;
    pgd__logf(&c->log, PGD_LOG_ERROR, "cache: compact to %u slots of %llu refused: %s", n_out,
              (unsigned long long)s->len, why);
    return PGD_EINVAL;
}

/* Leading slots that a list of n entries keeps in place (k[j] == j), by bisection: k[j] >= j,
 * and k[j] == j holds exactly below the first slot that moves. */
static uint32_t kept_in_place(const uint32_t *k, uint32_t n)
{
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (k[mid] == mid)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Whether s holds page alone: no other sequence, no index entry (so no pin either). */
static int page_private(const pgd_cache *c, uint32_t page)
{
    return pgd_pool_refcount(c->pool, page) == 1 && c->page_entry[page] == PGD__NONE;
}

/* A compaction's plan: pages [0, m) stay, pages [m, p1) are written to dst[]. */
typedef struct compact_plan {
    const uint32_t *keep;    /* the caller's lists, [n_cols][ld] */
    size_t ld;               /* list stride */
    const uint32_t *n_live;  /* NULL: every list has n_out entries */
    uint32_t n_out, m, p1;   /* slots after; pages kept whole; pages after */
    uint32_t *dst;           /* [p1 - m] the page each written page goes to */
    uint8_t *moved;          /* [p1 - m] 1: dst is an old private page of the same rows, in
                                order, for every column: moved by id, not written */
    uint8_t *buf;            /* a column's gathered rows, from slot g0 */
    uint64_t g0;             /* the first slot gathered */
    uint64_t lo_old, hi_old; /* staged: old ring rows [lo_old, hi_old) are valid */
    int ring_old;            /* staged: s had a ring before */
    uint64_t lo_new;         /* staged: ring rows [lo_new, n_out) after */
} compact_plan;

static uint8_t *region_at(pgd_cache *c, uint32_t page, uint32_t layer, uint32_t kind, uint32_t h)
{
    return kind ? pgd_pool_v(c->pool, page, layer, h) : pgd_pool_k(c->pool, page, layer, h);
}

/* Sets the key bounds of (page, layer, head) to min / max over rows[n][head_dim] (n 0:
 * empty bounds). No-op without bounds. Lock held. */
static void bounds_set(pgd_cache *c, uint32_t page, uint32_t layer, uint32_t h, const float *rows,
                       uint32_t n)
{
    const uint32_t hd = c->g.head_dim;
    float *b = pgd__pool_key_bounds_mut(c->pool, page, layer, h);
    if (!b) return;
    for (uint32_t d = 0; d < hd; d++) {
        b[d] = INFINITY;
        b[hd + d] = -INFINITY;
    }
    for (uint32_t r = 0; r < n; r++)
        for (uint32_t d = 0; d < hd; d++) {
            float x = rows[(size_t)r * hd + d];
            b[d] = x < b[d] ? x : b[d];
            b[hd + d] = x > b[hd + d] ? x : b[hd + d];
        }
}

/* Where row `slot` of a region of a row codec lives: span 0 (elements, or block codes) and
 * span 1 (the row's block scales; none for plain types), each at off + slot * len. */
typedef struct row_spans {
    size_t off[2], len[2];
} row_spans;

static row_spans row_spans_of(const pgd_cache *c, uint32_t kind)
{
    pgd_pool_layout lay;
    pgd_pool_get_layout(c->pool, &lay);
    row_spans r = {{0, 0}, {0, 0}};
    if (lay.row_stride) {
        r.len[0] = (size_t)lay.row_stride;
    } else { /* q8_0 / q4_0 with head_dim a multiple of 32: blocks along the row */
        r.len[0] = (size_t)(lay.codes_bytes / lay.page_tokens);
        r.off[1] = (size_t)(kind ? lay.v_scales_offset : lay.k_scales_offset);
        r.len[1] = lay.head_dim / 32 * sizeof(uint16_t);
    }
    return r;
}

/* Row codecs: moves column (layer, kind, head) i's kept rows as bytes: gathered into two
 * planes (span 0, span 1 of each row), runs of consecutive slots of one page at a time,
 * then each written page takes its rows with one copy per span. Lock held. */
static void compact_rows(pgd_cache *c, pgd_seq *s, const compact_plan *pl, uint32_t layer,
                         uint32_t kind, uint32_t h)
{
    const uint32_t pt = c->page_tokens, i = layer * c->g.n_kv_heads + h;
    const uint32_t n_i = pl->n_live ? pl->n_live[i] : pl->n_out;
    const uint32_t *keep = pl->keep + i * pl->ld;
    const row_spans rs = row_spans_of(c, kind);
    const size_t l0 = rs.len[0], l1 = rs.len[1];
    uint8_t *b0 = pl->buf, *b1 = pl->buf + (size_t)(pl->n_out - pl->g0) * l0;
    for (uint64_t j = pl->g0; j < pl->n_out;) {
        uint64_t page_end = (j / pt + 1) * pt;
        if (pl->moved[j / pt - pl->m]) {
            j = page_end;
            continue;
        }
        if (j >= n_i) { /* dead slots: the rest of the list (a moved page has none) */
            memset(b0 + (size_t)(j - pl->g0) * l0, 0, (size_t)(pl->n_out - j) * l0);
            memset(b1 + (size_t)(j - pl->g0) * l1, 0, (size_t)(pl->n_out - j) * l1);
            break;
        }
        uint32_t src = keep[j], slot = src % pt, run = 1;
        while (j + run < pl->n_out && j + run < n_i && j + run < page_end &&
               keep[j + run] == src + run && slot + run < pt)
            run++;
        const uint8_t *reg = region_at(c, s->table[src / pt], layer, kind, h);
        memcpy(b0 + (size_t)(j - pl->g0) * l0, reg + rs.off[0] + slot * l0, run * l0);
        if (l1) memcpy(b1 + (size_t)(j - pl->g0) * l1, reg + rs.off[1] + slot * l1, run * l1);
        j += run;
    }
    for (uint32_t k = pl->m; k < pl->p1; k++) {
        if (pl->moved[k - pl->m]) continue;
        uint8_t *reg = region_at(c, pl->dst[k - pl->m], layer, kind, h);
        uint64_t j0 = (uint64_t)k * pt;
        uint32_t n = pl->n_out - j0 < pt ? (uint32_t)(pl->n_out - j0) : pt;
        memcpy(reg + rs.off[0], b0 + (size_t)(j0 - pl->g0) * l0, n * l0);
        if (l1) memcpy(reg + rs.off[1], b1 + (size_t)(j0 - pl->g0) * l1, n * l1);
        if (kind == PGD__K && c->g.key_bounds) {
            uint32_t live = n_i > j0 ? (n_i - j0 < n ? (uint32_t)(n_i - j0) : n) : 0;
            if (live) c->codec->decode_rows(PGD__K, reg, pt, c->g.head_dim, 0, live, c->scratch);
            bounds_set(c, pl->dst[k - pl->m], layer, h, c->scratch, live);
        }
    }
}

/* Staged codecs: gathers column (layer, kind, head) i's kept rows in f16, encodes the new
 * full pages and puts rows [lo_new, n_out) in the ring. Lock held. */
static void compact_staged(pgd_cache *c, pgd_seq *s, const compact_plan *pl, uint32_t layer,
                           uint32_t kind, uint32_t h)
{
    const uint32_t pt = c->page_tokens, hd = c->g.head_dim, i = layer * c->g.n_kv_heads + h;
    const uint32_t n_i = pl->n_live ? pl->n_live[i] : pl->n_out;
    const uint32_t *keep = pl->keep + i * pl->ld;
    uint16_t *col = (uint16_t *)(void *)pl->buf, *ring = ring_rows(c, s, layer, kind, h);
    for (uint64_t j = pl->g0; j < pl->n_out; j++) {
        uint16_t *row = col + (size_t)(j - pl->g0) * hd;
        if (j < pl->lo_new && pl->moved[j / pt - pl->m])
            continue; /* a moved page's rows: needed for the ring only */
        if (j >= n_i) {
            memset(row, 0, (size_t)hd * sizeof *row); /* a dead slot */
            continue;
        }
        uint32_t src = keep[j];
        if (pl->ring_old && src >= pl->lo_old && src < pl->hi_old) {
            memcpy(row, ring + (size_t)(src % s->window) * hd, (size_t)hd * sizeof *row);
        } else {
            const uint8_t *reg = region_at(c, s->table[src / pt], layer, kind, h);
            c->codec->decode_rows(kind, reg, pt, hd, src % pt, 1, c->scratch);
            pgd__f32_to_f16_n(c->scratch, row, hd);
        }
    }
    for (uint32_t k = pl->m; k < pl->p1; k++) {
        if (pl->moved[k - pl->m]) continue;
        uint64_t j0 = (uint64_t)k * pt;
        uint32_t n = pl->n_out - j0 < pt ? (uint32_t)(pl->n_out - j0) : pt;
        pgd__f16_to_f32_n(col + (size_t)(j0 - pl->g0) * hd, c->scratch, (size_t)n * hd);
        if (n == pt) /* a full page is encoded; a partial one lives in the ring */
            c->codec->encode_page(kind, region_at(c, pl->dst[k - pl->m], layer, kind, h), pt, hd,
                                  c->scratch, pt);
        if (kind == PGD__K) {
            uint32_t live = n_i > j0 ? (n_i - j0 < n ? (uint32_t)(n_i - j0) : n) : 0;
            bounds_set(c, pl->dst[k - pl->m], layer, h, c->scratch, live);
        }
    }
    for (uint64_t p = pl->lo_new; p < pl->n_out; p++)
        memcpy(ring + (size_t)(p % s->window) * hd, col + (size_t)(p - pl->g0) * hd,
               (size_t)hd * sizeof *col);
}

int pgd_seq_compact(pgd_cache *c, pgd_seq *s, uint32_t n_out, const uint32_t *keep, size_t ld,
                    const uint32_t *n_live)
{
    const uint32_t pt = c->page_tokens, nl = c->g.n_layers, nh = c->g.n_kv_heads;
    const uint32_t n_cols = nl * nh;
    compact_plan pl;
    uint32_t *mask = NULL, *fresh = NULL, n_fresh = 0, n_dead = 0;
    uint8_t *reused = NULL;
    int rc;
    if (!s || !keep) return PGD_EINVAL;
    if (c->win || c->flat) {
        pgd__logf(&c->log, PGD_LOG_ERROR,
                  "cache: compaction (token budgets) is not supported with window layers");
        return PGD_EINVAL;
    }
    memset(&pl, 0, sizeof pl);
    lock(c);
    if (s->promo) settle(c, s); /* a finished promotion settles; a pending one refuses */
    rc = s->promo ? PGD_ESTATE : compact_check(c, s, n_out, keep, ld, n_live);
    if (rc != PGD_OK) goto out;
    for (uint32_t i = 0; n_live && i < n_cols; i++)
        n_dead += n_live[i] < n_out;
    if (n_out == s->len && !n_dead) goto out; /* every slot stays: nothing changes */

    /* The plan: pages kept whole, then where each written page goes. */
    const uint32_t p0 = s->n_pages, p1 = (uint32_t)(((uint64_t)n_out + pt - 1) / pt);
    uint32_t m = n_out / pt;
    for (uint32_t i = 0; i < n_cols && m; i++) {
        uint32_t t = kept_in_place(keep + i * ld, n_live ? n_live[i] : n_out) / pt;
        m = t < m ? t : m;
    }
    pl.keep = keep;
    pl.ld = ld;
    pl.n_live = n_live;
    pl.n_out = n_out;
    pl.m = m;
    pl.p1 = p1;
    pl.g0 = (uint64_t)m * pt;
    rc = PGD_ENOMEM;
    pl.dst = pgd__malloc(&c->al, (size_t)(p1 - m + 1) * sizeof *pl.dst);
    pl.moved = pgd__calloc(&c->al, (size_t)(p1 - m + 1), 1);
    fresh = pgd__malloc(&c->al, (size_t)(p1 - m + 1) * sizeof *fresh);
    reused = pgd__calloc(&c->al, (size_t)(p0 - m + 1), 1);
    if (!pl.dst || !pl.moved || !fresh || !reused) goto out;
    if (n_dead) {
        mask = pgd__malloc(&c->al, (size_t)n_cols * sizeof *mask);
        if (!mask) goto out;
        memcpy(mask, n_live, (size_t)n_cols * sizeof *mask);
    }
    const int bytes = c->scratch != NULL; /* metadata-only pools: the page tables only */
    if (bytes && c->window) {
        pl.ring_old = s->ring != NULL;
        pl.hi_old = s->hi;
        pl.lo_old = s->ring_lo;
        if (s->hi > s->window) {
            uint64_t w = (s->hi - s->window + pt - 1) / pt * pt;
            pl.lo_old = pl.lo_old > w ? pl.lo_old : w;
        }
        uint64_t w_new = s->ring ? s->window : c->window; /* the ring after ring_reserve */
        pl.lo_new = n_out > w_new ? (n_out - w_new + pt - 1) / pt * pt : 0;
        pl.lo_new = pl.lo_new > pl.g0 ? pl.lo_new : pl.g0; /* and past the pages moved below */
    }
    if (bytes) {
        /* A gathered row: f16 (staged), else its bytes (K and V rows alike for row codecs). */
        row_spans rs = row_spans_of(c, PGD__K);
        size_t rb = c->window ? (size_t)c->g.head_dim * sizeof(uint16_t) : rs.len[0] + rs.len[1];
        pl.buf = pgd__malloc(&c->al, (size_t)(n_out - pl.g0 + 1) * rb);
        if (!pl.buf) goto out;
    }
    /* The last allocation: a ring for a staged sequence that had none (it keeps its rows). */
    if (bytes && c->window) {
        rc = ring_reserve(c, s, c->window);
        if (rc != PGD_OK) goto out;
    }
    /* Whole pages first: a full written page whose rows are, for every list, all the rows of
     * one old private page in order (a staged pool's page encoded: below hi) takes that page
     * by id, unwritten (a window that moves by whole pages costs no copy). It is a later
     * page (k >= m: keep[j] > j somewhere in it), so q > k. */
    for (uint32_t k = m; k < p1; k++)
        pl.dst[k - m] = PGD__NONE;
    for (uint32_t k = m; k < n_out / pt; k++) {
        if ((n_live ? n_live[0] : n_out) < (k + 1) * pt) continue; /* list 0 ends before */
        uint32_t q0 = keep[(size_t)k * pt], q = q0 / pt;           /* validated: q < p0 */
        int whole = q0 % pt == 0 && !reused[q - m] && page_private(c, s->table[q]) &&
                    (!c->window || (uint64_t)(q + 1) * pt <= s->hi);
        for (uint32_t i = 0; whole && i < n_cols; i++) {
            const uint32_t *ki = keep + i * ld + (size_t)k * pt;
            whole = (n_live ? n_live[i] : n_out) >= (k + 1) * pt && ki[0] == q0 &&
                    ki[pt - 1] == q0 + pt - 1; /* ascending and distinct: the pt in between */
        }
        if (!whole) continue;
        pl.dst[k - m] = s->table[q];
        pl.moved[k - m] = 1;
        reused[q - m] = 1;
        if (pl.lo_new < (uint64_t)(k + 1) * pt && c->window) pl.lo_new = (uint64_t)(k + 1) * pt;
    }
    /* Then each written page in place where the sequence holds the old one alone, then its
     * other private pages it no longer needs, then fresh pages. */
    for (uint32_t k = m; k < p1 && k < p0; k++)
        if (pl.dst[k - m] == PGD__NONE && !reused[k - m] && page_private(c, s->table[k])) {
            pl.dst[k - m] = s->table[k];
            reused[k - m] = 1;
        }
    for (uint32_t k = m, q = m; k < p1; k++) {
        if (pl.dst[k - m] != PGD__NONE) continue;
        while (q < p0 && (reused[q - m] || !page_private(c, s->table[q])))
            q++;
        if (q < p0) {
            pl.dst[k - m] = s->table[q];
            reused[q - m] = 1;
        } else {
            n_fresh++;
        }
    }
    rc = n_fresh > n_available(c) ? PGD_ENOSPC : PGD_OK; /* checked first: no eviction in vain */
    uint32_t got = 0;
    while (rc == PGD_OK && got < n_fresh) {
        rc = alloc_page(c, s->tenant, got, &fresh[got]);
        got += rc == PGD_OK;
    }
    if (rc != PGD_OK) {
        /* Only quotas or a policy that refuses its own pages get here (free + evictable
         * covered the pages): give back what this call took. */
        while (got)
            pgd_pool_unref(c->pool, fresh[--got]);
        goto out;
    }
    for (uint32_t k = m; k < p1; k++)
        if (pl.dst[k - m] == PGD__NONE) pl.dst[k - m] = fresh[--got];

    /* Nothing fails from here on. */
    for (uint32_t l = 0; bytes && l < nl; l++)
        for (uint32_t kind = 0; kind < 2; kind++)
            for (uint32_t h = 0; h < nh; h++) {
                if (c->window)
                    compact_staged(c, s, &pl, l, kind, h);
                else
                    compact_rows(c, s, &pl, l, kind, h);
            }
    for (uint32_t k = p0; k-- > m;)
        if (!reused[k - m]) page_unref(c, s->table[k]);
    if (p1 > m) memcpy(s->table + m, pl.dst, (size_t)(p1 - m) * sizeof *s->table);
    s->n_pages = p1;
    uint64_t dropped = s->len - n_out;
    s->len = n_out;
    if (s->n_committed > n_out) s->n_committed = n_out;
    s->n_full = (uint32_t)(s->n_committed / pt);
    s->hi = n_out;
    if (c->window && bytes)
        s->ring_lo = pl.lo_new;
    else if (s->ring_lo > (uint64_t)n_out / pt * pt)
        s->ring_lo = (uint64_t)n_out / pt * pt;
    s->compacted = 1;
    s->n_dropped += dropped;
    pgd__free(&c->al, s->n_live);
    s->n_live = mask;
    s->mask_len = mask ? n_out : 0;
    mask = NULL;
    c->st.n_compactions++;
    c->st.n_compact_dropped += dropped;
    c->st.n_compact_freed += p0 - p1;
    rc = (int)(p0 - p1);
out:
    pgd__free(&c->al, mask);
    pgd__free(&c->al, pl.buf);
    pgd__free(&c->al, pl.dst);
    pgd__free(&c->al, pl.moved);
    pgd__free(&c->al, fresh);
    pgd__free(&c->al, reused);
    unlock(c);
    return rc;
}

/* ---- window layers (cache.h "Window layers") ----
 *
 * A cache with window layers is two caches: c holds the global layers (its pool's layers
 * are the model's global layers, in order) and c->win, a cache of its own (flat), the
 * window layers. Every sequence s of c has s->win in c->win, created, forked, grown,
 * truncated, committed and destroyed with it, so both have the same positions. Lock order:
 * c, then c->win (c->win never calls c). The window group differs from a plain cache in
 * three ways, all keyed on c->flat:
 *   - its index entries have no parent: a page is found by its block hash (chained, so it
 *     names the whole prefix) and any cached page nobody holds is evictable;
 *   - a sequence's table keeps its positions, but entries below first_live are released
 *     (PGD__NONE): pgd_seq_grow drops the pages wholly before the next row's window;
 *   - its matches are window_match's: the pages of the keys the first new row sees.
 * Invariant (window_check): a sequence and its window sequence agree on len, n_committed
 * and mode, and first_live never passes the window of the next row to compute. */

static int create_windowed(const pgd_cache_params *p, pgd_cache **out)
{
    pgd__log lg = {p->log ? p->log : p->pool.log, p->log ? p->log_ud : p->pool.log_ud};
    const uint32_t nl = p->pool.n_layers, W = p->window_tokens;
    uint32_t n_win = 0;
    if (!p->window_layers || W > (1u << 24) || nl == 0) {
        pgd__logf(&lg, PGD_LOG_ERROR,
                  "cache: window layers need window_layers[n_layers] and a window of 1..2^24");
        return PGD_EINVAL;
    }
    for (uint32_t l = 0; l < nl; l++)
        n_win += p->window_layers[l] != 0;
    if (n_win == 0 || n_win == nl) {
        pgd__logf(&lg, PGD_LOG_ERROR,
                  "cache: window_layers marks %u of %u layers: it must mark at least one "
                  "window layer and leave at least one global layer",
                  n_win, nl);
        return PGD_EINVAL;
    }
    if (p->n_tiers || p->pool.arena) {
        pgd__logf(&lg, PGD_LOG_ERROR, "cache: window layers take no %s",
                  p->n_tiers ? "tiers" : "caller arena");
        return PGD_EINVAL;
    }
    pgd_cache_params pg = *p;
    pg.window_tokens = 0;
    pg.window_layers = NULL;
    pg.window_pages = 0;
    pg.pool.n_layers = nl - n_win;
    pgd_cache *c;
    int rc = pgd_cache_create(&pg, &c);
    if (rc != PGD_OK) return rc;
    const uint32_t pt = c->page_tokens;
    const uint64_t least = ((uint64_t)W - 1 + pt - 1) / pt + 2;
    if (p->window_pages < least) {
        pgd__logf(&lg, PGD_LOG_ERROR,
                  "cache: window_pages %u: a window of %u tokens needs at least %llu pages",
                  p->window_pages, W, (unsigned long long)least);
        pgd_cache_destroy(c);
        return PGD_EINVAL;
    }
    pgd_cache_params pw = pgd_cache_default_params();
    pw.pool = p->pool;
    pw.pool.n_layers = n_win;
    pw.pool.capacity_pages = p->window_pages;
    pw.policy = p->policy_ops || p->policy == PGD_POLICY_BELADY ? PGD_POLICY_LRU : p->policy;
    pw.hash_key = p->hash_key;
    pw.hash_key_len = p->hash_key_len;
    pw.model_fingerprint = p->model_fingerprint;
    pw.alloc = p->alloc;
    pw.log = lg.fn;
    pw.log_ud = lg.ud;
    pw.kv_residual = p->kv_residual;
    pw.clock = p->clock;
    pw.clock_ud = p->clock_ud;
    pw.cost = p->cost;
    pw.max_tenants = p->max_tenants;
    rc = pgd_cache_create(&pw, &c->win);
    if (rc != PGD_OK) {
        pgd_cache_destroy(c);
        return rc;
    }
    pgd_cache *w = c->win;
    w->flat = 1;
    w->win_tokens = c->win_tokens = W;
    /* One hasher for both groups, so that a block has one hash (the global group's key
     * may be random): the tenant table is seeded from it again. */
    w->hasher = c->hasher;
    pgd__tenants_deinit(&w->tn, &w->al);
    rc = pgd__tenants_init(&w->tn, &w->al, p->max_tenants, w->n_pages,
                           pgd__hash_seed(&w->hasher, NULL, 0));
    c->layer_group = pgd__malloc(&c->al, nl);
    c->layer_local = pgd__malloc(&c->al, (size_t)nl * sizeof *c->layer_local);
    if (rc != PGD_OK || !c->layer_group || !c->layer_local) {
        pgd_cache_destroy(c);
        return rc != PGD_OK ? rc : PGD_ENOMEM;
    }
    uint32_t n_each[2] = {0, 0};
    for (uint32_t l = 0; l < nl; l++) {
        c->layer_group[l] = p->window_layers[l] != 0;
        c->layer_local[l] = n_each[c->layer_group[l]]++;
    }
    c->n_layers_all = nl;
    *out = c;
    return PGD_OK;
}

/* The first page holding a key that a row at position q (or later) sees in a window of
 * W keys: the page of q - W + 1. */
static uint32_t window_first_page(const pgd_cache *w, uint64_t q)
{
    return q + 1 > w->win_tokens ? (uint32_t)((q + 1 - w->win_tokens) / w->page_tokens) : 0;
}

/* Releases the pages of window sequence s that no row from position q on sees. Lock of w
 * held. */
static void window_release(pgd_cache *w, pgd_seq *s, uint64_t q)
{
    uint32_t upto = window_first_page(w, q);
    if (upto > s->n_pages) upto = s->n_pages;
    while (s->first_live < upto) {
        page_unref(w, s->table[s->first_live]);
        s->table[s->first_live++] = PGD__NONE;
        w->n_released++;
    }
}

/* The window group's match for a global hit of k pages with block hashes h[0..k): the
 * largest k2 <= k whose first new row's window pages (window_first_page(k2 * pt) .. k2 - 1)
 * are all cached, pinned into window sequence s. Returns k2. Takes w's lock. */
static uint32_t window_match(pgd_cache *w, pgd_seq *s, const pgd_hash *h, uint32_t k, int mode)
{
    const uint32_t pt = w->page_tokens;
    uint32_t best = 0, run = 0;
    lock(w);
    for (uint32_t i = 0; i < k; i++) {
        run = pgd__index_find(w->ix, h[i]) != PGD__NONE ? run + 1 : 0;
        uint32_t lo = window_first_page(w, (uint64_t)(i + 1) * pt);
        if (run >= i + 1 - lo) best = i + 1;
    }
    if (best && table_reserve(w, s, best) != PGD_OK) best = 0; /* correct, only slower */
    const uint32_t lo = window_first_page(w, (uint64_t)best * pt);
    for (uint32_t i = 0; i < lo; i++)
        s->table[i] = PGD__NONE;
    for (uint32_t i = lo; i < best; i++) {
        uint32_t e = pgd__index_find(w->ix, h[i]);
        uint32_t page = pgd__index_entry(w->ix, e)->loc_id;
        page_ref(w, page);
        s->table[i] = page;
    }
    s->first_live = lo;
    s->n_pages = s->n_full = best;
    s->len = s->n_committed = (uint64_t)best * pt;
    s->ring_lo = s->hi = s->len;
    s->mode = mode;
    s->last = best ? h[best - 1] : s->seed;
    count_query(w, s, k, (uint64_t)k * pt, best - lo);
    unlock(w);
    return best;
}

/* Cuts the global hit of k pages that s pinned back to what the window group can serve.
 * Returns the pages kept. Lock of c held. */
static uint32_t window_cut(pgd_cache *c, pgd_seq *s, uint32_t k)
{
    pgd_hash *h = k ? pgd__malloc(&c->al, (size_t)k * sizeof *h) : NULL;
    uint32_t k2 = 0;
    if (h) {
        for (uint32_t i = 0; i < k; i++)
            h[i] = pgd__index_entry(c->ix, c->page_entry[s->table[i]])->hash;
        k2 = window_match(c->win, s->win, h, k, s->mode);
    } else {
        window_match(c->win, s->win, NULL, 0, s->mode); /* no memory: no hit */
    }
    if (k2 < k) {
        while (s->n_pages > k2)
            page_unref(c, s->table[--s->n_pages]);
        s->n_full = k2;
        s->len = s->n_committed = (uint64_t)k2 * c->page_tokens;
        s->ring_lo = s->hi = s->len;
        s->last_entry = k2 ? c->page_entry[s->table[k2 - 1]] : PGD__NONE;
        s->last = k2 ? h[k2 - 1] : s->seed;
        c->n_cut_tokens += (uint64_t)(k - k2) * c->page_tokens;
    }
    pgd__free(&c->al, h);
    return k2;
}

/* Each sequence of c agrees with its window sequence, which holds every page the next
 * row's window needs. */
static int window_check(pgd_cache *c)
{
    int rc = PGD_OK;
    lock(c);
    lock(c->win);
    for (const pgd_seq *s = c->seqs; s && rc == PGD_OK; s = s->next) {
        const pgd_seq *w = s->win;
        if (!w) continue; /* pgd_cache_warm's own sequence */
        if (w->len != s->len || w->n_committed != s->n_committed || w->mode != s->mode ||
            w->first_live > window_first_page(c->win, s->len)) {
            pgd__logf(&c->log, PGD_LOG_ERROR,
                      "cache check: a sequence and its window layers' sequence disagree");
            rc = PGD_ECORRUPT;
        }
    }
    unlock(c->win);
    unlock(c);
    if (rc == PGD_OK) rc = pgd_cache_check(c->win);
    return rc;
}

pgd_pool *pgd_cache_layer_pool(pgd_cache *c, uint32_t layer, uint32_t *pool_layer)
{
    if (layer >= c->n_layers_all) return NULL;
    if (!c->win) {
        *pool_layer = layer;
        return c->pool;
    }
    *pool_layer = c->layer_local[layer];
    return c->layer_group[layer] ? c->win->pool : c->pool;
}

uint32_t pgd_cache_n_layers(const pgd_cache *c)
{
    return c->n_layers_all;
}

uint32_t pgd_cache_window(const pgd_cache *c)
{
    return c->win ? c->win_tokens : 0;
}

int pgd_cache_layer_is_window(const pgd_cache *c, uint32_t layer)
{
    return c->win && layer < c->n_layers_all && c->layer_group[layer];
}

pgd_cache *pgd__cache_group(pgd_cache *c, uint32_t layer, uint32_t *local)
{
    if (!c->win) {
        *local = layer;
        return c;
    }
    if (layer >= c->n_layers_all) {
        *local = UINT32_MAX;
        return c;
    }
    *local = c->layer_local[layer];
    return c->layer_group[layer] ? c->win : c;
}

pgd_seq *pgd__seq_group(const pgd_cache *c, pgd_seq *s, const pgd_cache *group)
{
    return group != c && s ? s->win : s;
}

uint32_t pgd_seq_layer_pages(pgd_cache *c, const pgd_seq *s, uint32_t layer, const uint32_t **ids)
{
    uint32_t local;
    *ids = NULL;
    if (layer >= c->n_layers_all) return 0;
    pgd_cache *g = pgd__cache_group(c, layer, &local);
    return pgd_seq_pages(g, g == c ? s : s->win, ids);
}
