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
 * Invariants (checked by pgd_cache_check):
 *   refcount(p) == #tables holding p + (page_entry[p] != NONE)
 *   policy contains p  <=>  page_entry[p] != NONE && refcount(p) == 1
 *   a sequence's registered pages form a chain in the index (parent = previous page), so
 *   any sequence holding a page holds all its ancestors; with leaf-only eviction a cached
 *   prefix never loses its middle.
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
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "pgd_int.h"

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
};

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
    uint32_t tier;      /* PUT: the tier written (spills go below it); PREFETCH: read from */
    int kind;           /* SLOT_* */
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
    uint32_t *page_entry; /* [n_pages] index entry of a cached page, or PGD__NONE */
    pgd_seq *seqs;        /* list of live sequences */
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
};

static void lock(pgd_cache *c);
static void unlock(pgd_cache *c);
static int register_page(pgd_cache *c, pgd_seq *s, uint32_t i, pgd_hash h);
static void wait_locked(pgd_cache *c, pgd_seq *s);
static void promote(pgd_cache *c, pgd_seq *s, const int32_t *tokens, const pgd_hash *hashes,
                    size_t n_hashes, size_t n_pages, uint32_t k);
static void demote(pgd_cache *c, uint32_t entry, uint32_t page);
static void write_through(pgd_cache *c, uint32_t mask, uint32_t entry, uint32_t page);

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
    pgd__alloc_init(&al, p->alloc ? p->alloc : p->pool.alloc);
    pgd__log lg = {p->log ? p->log : p->pool.log, p->log ? p->log_ud : p->pool.log_ud};
    const pgd_policy_ops *pol = p->policy_ops ? p->policy_ops : pgd_policy_builtin(p->policy);
    if (!pol) {
        pgd__logf(&lg, PGD_LOG_ERROR, "cache: unknown policy %d", (int)p->policy);
        return PGD_EINVAL;
    }
    if (!pol->create || !pol->destroy || !pol->insert || !pol->hit || !pol->unreferenced ||
        !pol->victim || !pol->remove || !pol->contains || !pol->size) {
        pgd__logf(&lg, PGD_LOG_ERROR, "cache: policy_ops has a NULL member");
        return PGD_EINVAL;
    }
    if (!p->policy_ops && p->policy == PGD_POLICY_BELADY && !p->next_use) {
        pgd__logf(&lg, PGD_LOG_ERROR, "cache: the belady policy needs a next_use oracle");
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
    rc = PGD_ENOMEM;
    c->page_entry = pgd__malloc(&c->al, (size_t)c->n_pages * sizeof *c->page_entry);
    if (!c->page_entry) goto fail;
    memset(c->page_entry, 0xff, (size_t)c->n_pages * sizeof *c->page_entry);
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
    pgd__free(&c->al, s->table);
    pgd__free(&c->al, s);
}

void pgd_cache_destroy(pgd_cache *c)
{
    if (!c) return;
    pgd__alloc al = c->al;
    /* The movers first: their jobs write into pages and promotion records freed below. */
    tiers_destroy(c);
    while (c->seqs) {
        pgd_seq *s = c->seqs;
        c->seqs = s->next;
        seq_free(c, s);
    }
    pgd__free(&al, c->scratch);
    pgd__free(&al, c->page_entry);
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
}
static void unlock(pgd_cache *c)
{
    pthread_mutex_unlock(&c->mu);
}

/* ---- page references (lock held) ---- */

static pgd_policy_page page_info(const pgd_cache *c, uint32_t page)
{
    const pgd__entry *e = pgd__index_entry(c->ix, c->page_entry[page]);
    pgd_policy_page info = {.hash = e->hash, .depth = e->depth, .priority = PGD_PRIORITY_DEFAULT};
    return info;
}

/* A sequence takes a reference on page; a cached page is no longer evictable. */
static void page_ref(pgd_cache *c, uint32_t page)
{
    pgd_pool_ref(c->pool, page);
    if (c->page_entry[page] != PGD__NONE) {
        pgd_policy_page info = page_info(c, page);
        c->pol->hit(c->pstate, page, &info);
    }
}

/* A sequence drops its reference; a cached page only the index holds becomes evictable. */
static void page_unref(pgd_cache *c, uint32_t page)
{
    uint32_t r = pgd_pool_unref(c->pool, page);
    if (r == 1 && c->page_entry[page] != PGD__NONE) {
        pgd_policy_page info = page_info(c, page);
        c->pol->unreferenced(c->pstate, page, &info);
    }
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
        put_chain(c, w->tier, w->block, w->parent, w->buf, bounds, &ta);
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

/* Evicts one page through the policy: reports it (on_evict, payload still intact), then
 * unindexes and frees it. Returns 1, or 0 when nothing is evictable (or a user policy chose
 * a page that is not an evictable leaf: refused, logged). */
static int evict_one(pgd_cache *c)
{
    uint32_t page = c->pol->victim(c->pstate, accept_leaf, c);
    if (page == PGD_POLICY_NO_PAGE) return 0;
    if (page >= c->n_pages || c->page_entry[page] == PGD__NONE ||
        pgd_pool_refcount(c->pool, page) != 1 || !accept_leaf(c, page)) {
        pgd__logf(&c->log, PGD_LOG_ERROR,
                  "cache: policy %s chose page %u, which is not an evictable leaf", c->pol->name,
                  page);
        return 0;
    }
    uint32_t e = c->page_entry[page];
    c->pol->remove(c->pstate, page);
    if (c->on_evict) c->on_evict(c->event_ud, pgd__index_entry(c->ix, e)->hash, page);
    if (c->n_tiers) demote(c, e, page);
    pgd__index_remove(c->ix, e);
    c->page_entry[page] = PGD__NONE;
    pgd_pool_unref(c->pool, page);
    c->st.n_evictions++;
    return 1;
}

/* Pages that an allocation could get: free now, or evictable. */
static uint64_t n_available(const pgd_cache *c)
{
    pgd_pool_stats ps;
    pgd_pool_get_stats(c->pool, &ps);
    return (uint64_t)ps.n_pages_free + c->pol->size(c->pstate);
}

/* Allocates a page, evicting if the pool is full. Returns PGD_OK or PGD_ENOSPC. */
static int alloc_page(pgd_cache *c, uint32_t *page)
{
    for (;;) {
        if (pgd_pool_alloc(c->pool, page) == PGD_OK) return PGD_OK;
        if (!evict_one(c)) return PGD_ENOSPC;
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

static int seq_alloc(pgd_cache *c, pgd_seq **out)
{
    *out = NULL;
    if (c->max_seqs && c->n_seqs >= c->max_seqs) return PGD_EBUSY;
    pgd_seq *s = pgd__calloc(&c->al, 1, sizeof *s + (size_t)c->page_tokens * sizeof(int32_t));
    if (!s) return PGD_ENOMEM;
    s->partial = (int32_t *)(s + 1);
    s->last_entry = PGD__NONE;
    *out = s;
    return PGD_OK;
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
    lock(c);
    int rc = seq_alloc(c, &s);
    if (rc == PGD_OK) {
        s->last = s->seed = seed;
        seq_link(c, s);
        *out = s;
    }
    unlock(c);
    return rc;
}

void pgd_seq_destroy(pgd_cache *c, pgd_seq *s)
{
    if (!s) return;
    lock(c);
    if (s->promo) wait_locked(c, s);
    /* Deepest page first: the policy then evicts a released prefix from its end. */
    for (uint32_t i = s->n_pages; i-- > 0;)
        page_unref(c, s->table[i]);
    if (s->prev)
        s->prev->next = s->next;
    else
        c->seqs = s->next;
    if (s->next) s->next->prev = s->prev;
    c->n_seqs--;
    seq_free(c, s);
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
    int rc = src->n_full + 1 < src->n_pages ? PGD_ESTATE : PGD_OK;
    if (rc != PGD_OK) goto out;
    rc = seq_alloc(c, &s);
    if (rc != PGD_OK) goto out;
    rc = table_reserve(c, s, src->n_pages);
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
    memcpy(s->partial, src->partial, (size_t)c->page_tokens * sizeof *s->partial);
    for (uint32_t i = 0; i < s->n_pages; i++)
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

static void count_query(pgd_cache *c, uint64_t n_pages_q, uint64_t n_tokens_q, uint32_t hit)
{
    c->st.n_query_pages += n_pages_q;
    c->st.n_query_tokens += n_tokens_q;
    c->st.n_hit_pages += hit;
    c->st.n_hit_tokens += (uint64_t)hit * c->page_tokens;
}

/* The three matches: tokens (hashes NULL), tokens with precomputed hashes, hashes only
 * (tokens NULL, mode MODE_HASHES). n_pages full pages are looked up. */
static int64_t match(pgd_cache *c, pgd_seq *s, const int32_t *tokens, size_t n_tokens,
                     const pgd_hash *hashes, size_t n_hashes, size_t n_pages)
{
    int64_t rc;
    lock(c);
    if (s->len || s->mode != MODE_NONE) {
        rc = PGD_ESTATE;
        goto out;
    }
    rc = table_reserve(c, s, n_pages);
    if (rc != PGD_OK) goto out;
    uint32_t k = pin_chain(c, s, tokens, hashes, n_hashes, n_pages);
    s->mode = tokens ? MODE_TOKENS : MODE_HASHES;
    count_query(c, n_pages, n_tokens, k);
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
    /* No sequence can outgrow the pool: this bound also keeps the arithmetic exact. */
    uint64_t max_len = (uint64_t)c->n_pages * c->page_tokens;
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
        rc = alloc_page(c, &page);
        if (rc != PGD_OK) {
            /* Only a user policy that refuses its own pages gets here (free + evictable
             * covered the pages): give back what this call took. */
            while (s->n_pages > n_old)
                pgd_pool_unref(c->pool, s->table[--s->n_pages]);
            goto out;
        }
        s->table[s->n_pages++] = page;
    }
    s->len = len;
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
    uint32_t e = pgd__index_find(c->ix, h);
    if (e != PGD__NONE) {
        const pgd__entry *en = pgd__index_entry(c->ix, e);
        if (en->parent != s->last_entry) {
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
        s->last_entry = e;
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
    e = pgd__index_insert(c->ix, h, s->last_entry, pgd__loc_pool(page));
    PGD_CHECK(e != PGD__NONE); /* capacity >= pages, each page at most once */
    pgd_pool_ref(c->pool, page);
    c->page_entry[page] = e;
    pgd_policy_page info = {
        .hash = h, .depth = pgd__index_entry(c->ix, e)->depth, .priority = PGD_PRIORITY_DEFAULT};
    c->pol->insert(c->pstate, page, &info);
    if (c->on_register) {
        pgd_hash parent = {0, 0};
        if (s->last_entry != PGD__NONE) parent = pgd__index_entry(c->ix, s->last_entry)->hash;
        c->on_register(c->event_ud, h, parent, info.depth, page);
    }
    if (c->n_tiers) { /* one branch without tiers */
        if (c->wt_register) write_through(c, c->wt_register, e, page);
    }
    s->last_entry = e;
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
    if (s->mode == MODE_TOKENS || s->n_committed % c->page_tokens) {
        rc = PGD_ESTATE;
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
    while (got < n && alloc_page(c, &pr->pages[got]) == PGD_OK)
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
    while (s->promo && !s->promo->done)
        pthread_cond_wait(&c->cv, &c->mu);
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
    if (ps.n_pages_free == 0 && !evict_one(c)) return PGD_ENOSPC;
    uint32_t copy = page;
    int rc = pgd_pool_cow(c->pool, &copy);
    if (rc < 0) return rc; /* the caller's copy hook failed; nothing changed */
    PGD_CHECK(rc == 1);
    /* The old page lost one holder: it may have become evictable. */
    if (pgd_pool_refcount(c->pool, page) == 1 && c->page_entry[page] != PGD__NONE) {
        pgd_policy_page info = page_info(c, page);
        c->pol->unreferenced(c->pstate, page, &info);
    }
    s->table[i] = copy;
    c->st.n_cow_copies++;
    return PGD_OK;
}

int pgd_seq_write_slot(pgd_cache *c, pgd_seq *s, uint64_t pos, uint32_t *page_id, uint32_t *slot)
{
    int rc = PGD_OK;
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
    lock(c);
    if (s->promo) wait_locked(c, s);
    if (!c->scratch || c->g.arena_device || layer >= c->g.n_layers || pos0 > s->len ||
        n > s->len - pos0 || pos0 / pt < s->n_full || (c->window && pos0 < s->ring_lo)) {
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
    unlock(c);
}

static int check_locked(pgd_cache *c)
{
    int rc = pgd_pool_check(c->pool);
    if (rc != PGD_OK) return rc;
    rc = pgd__index_check(c->ix, &c->log);
    if (rc != PGD_OK) return rc;
    uint32_t *holders = pgd__calloc(&c->al, c->n_pages, sizeof *holders);
    if (!holders) return PGD_ENOMEM;
    rc = PGD_ECORRUPT;
    uint32_t n_seqs = 0, n_evictable = 0, n_cached = 0, n_promos = 0;
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
        for (uint32_t i = 0; i < s->n_pages; i++) {
            uint32_t page = s->table[i];
            if (page >= c->n_pages || pgd_pool_refcount(c->pool, page) == 0) {
                pgd__logf(&c->log, PGD_LOG_ERROR, "cache check: table holds a free page %u", page);
                goto out;
            }
            holders[page]++;
            if (i < s->n_full && !s->unregistrable) {
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
        }
        uint32_t ref = pgd_pool_refcount(c->pool, page);
        if (ref != holders[page] + cached) {
            pgd__logf(&c->log, PGD_LOG_ERROR,
                      "cache check: page %u has refcount %u but %u holders%s", page, ref,
                      holders[page], cached ? " + index" : "");
            goto out;
        }
        int evictable = cached && ref == 1;
        n_evictable += evictable;
        if (evictable != !!c->pol->contains(c->pstate, page)) {
            pgd__logf(&c->log, PGD_LOG_ERROR, "cache check: policy %s page %u wrongly",
                      evictable ? "misses" : "holds", page);
            goto out;
        }
    }
    if (n_evictable != c->pol->size(c->pstate)) goto out;
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
    lock(c);
    int rc = check_locked(c);
    unlock(c);
    return rc;
}
