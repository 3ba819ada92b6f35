/* SPDX-License-Identifier: MIT */
/*
 * test_cache_retention.c - the retention contract of the cache manager (cache.h
 * "Retention"): TTL expiry on an injected clock (an expired page goes before an LRU-older
 * one, leaf first), the merge rule of a page's retention over the sequences that release
 * it, pins (out of the evictable set, bounded by pin_share, ended by unpin or their TTL),
 * the admin operations (pin, unpin, evict_chain, warm from a RAM tier, lookup) and the
 * next-use hints (hint, hints_run warming a chain from the tier before it is due; a
 * request's next_use_ms registering one), retention carried to a tier with the retain op
 * (a wrapped RAM tier that counts the calls and can refuse pins), a randomized run of every
 * operation (8 seeds x 3000 steps, with and without a tier) and three threads at once.
 *
 * Chains are precomputed block hashes (match_hashes / commit_hashes); every step is
 * followed by pgd_cache_check, which verifies the pins and the expiry heap too. A wrapped
 * LRU policy records the page info the cache gives it, so the merged retention is read
 * back exactly as a policy sees it. Single-threaded.
 */
#include <pagoda/cache.h>
#include <pthread.h>

#include "t.h"

enum { NL = 1, NH = 1, HD = 4, PT = 4 };
#define MS 1000000ull /* ns */

static void log_stderr(void *ud, int level, const char *msg)
{
    (void)ud;
    if (level <= PGD_LOG_ERROR) fprintf(stderr, "  [pagoda %d] %s\n", level, msg);
}

static const uint8_t test_key[32] = "0123456789abcdef0123456789abcdef";

/* ---- an injected clock and a policy that records what it is told ---- */

static uint64_t fake_now = 1000 * MS;

static uint64_t fake_clock(void *ud)
{
    (void)ud;
    return fake_now;
}

#define MAX_PAGES 64
static pgd_policy_page seen[MAX_PAGES]; /* the last info of each page (unreferenced) */
static const pgd_policy_ops *lru;

static int rec_create(const pgd_policy_init *init, void **state)
{
    lru = pgd_policy_builtin(PGD_POLICY_LRU);
    return lru->create(init, state);
}
static void rec_destroy(void *st)
{
    lru->destroy(st);
}
static void rec_insert(void *st, uint32_t page, const pgd_policy_page *info)
{
    lru->insert(st, page, info);
}
static void rec_hit(void *st, uint32_t page, const pgd_policy_page *info)
{
    lru->hit(st, page, info);
}
static void rec_unref(void *st, uint32_t page, const pgd_policy_page *info)
{
    if (page < MAX_PAGES) seen[page] = *info;
    lru->unreferenced(st, page, info);
}
static uint32_t rec_victim(void *st, pgd_policy_accept_fn accept, void *ctx)
{
    return lru->victim(st, accept, ctx);
}
static void rec_remove(void *st, uint32_t page)
{
    lru->remove(st, page);
}
static int rec_contains(const void *st, uint32_t page)
{
    return lru->contains(st, page);
}
static uint32_t rec_size(const void *st)
{
    return lru->size(st);
}
static const pgd_policy_ops rec_ops = {"rec",        rec_create, rec_destroy, rec_insert,
                                       rec_hit,      rec_unref,  rec_victim,  rec_remove,
                                       rec_contains, rec_size,   NULL};

/* ---- caches and chains ---- */

static pgd_cache_params params(uint32_t n_pages)
{
    pgd_cache_params p = pgd_cache_default_params();
    p.pool.n_layers = NL;
    p.pool.n_kv_heads = NH;
    p.pool.head_dim = HD;
    p.pool.page_tokens = PT;
    p.pool.kv_type = PGD_KV_F32;
    p.pool.capacity_pages = n_pages;
    p.hash_key = test_key;
    p.hash_key_len = sizeof test_key;
    p.log = log_stderr;
    p.clock = fake_clock;
    p.policy_ops = &rec_ops;
    return p;
}

static pgd_cache *make_cache(uint32_t n_pages, double pin_share)
{
    pgd_cache_params p = params(n_pages);
    p.pin_share = pin_share;
    pgd_cache *c = NULL;
    if (pgd_cache_create(&p, &c) != PGD_OK) return NULL;
    return c;
}

/* The hashes of chain `id`: n blocks. */
static void chain(uint64_t id, uint32_t n, pgd_hash *h)
{
    for (uint32_t k = 0; k < n; k++) {
        h[k].lo = id * 1000 + k + 1;
        h[k].hi = id;
    }
}

/* The pages of the last request (its page table before the release). */
static uint32_t req_pages[32];

/* A request on chain id of n blocks: matches what is cached, computes and commits the rest,
 * releases with retention r (NULL: the default, nothing set). Returns the pages matched,
 * or a negative status. */
static int request(pgd_cache *c, uint64_t id, uint32_t n, const pgd_retention *r)
{
    pgd_hash h[32];
    pgd_seq *s = NULL;
    chain(id, n, h);
    int rc = pgd_seq_create(c, NULL, 0, &s);
    if (rc != PGD_OK) return rc;
    if (r) rc = pgd_seq_set_retention(c, s, r, (uint64_t)n * PT);
    int64_t m = rc == PGD_OK ? pgd_seq_match_hashes(c, s, h, n) : rc;
    if (m >= 0 && (uint32_t)m < n) {
        rc = pgd_seq_grow(c, s, (size_t)(n - m) * PT);
        if (rc == PGD_OK) rc = pgd_seq_commit_hashes(c, s, h + m, n - (size_t)m);
        if (rc < 0) m = rc;
    }
    const uint32_t *ids = NULL;
    uint32_t np = pgd_seq_pages(c, s, &ids);
    for (uint32_t i = 0; i < np && i < 32; i++)
        req_pages[i] = ids[i];
    pgd_seq_destroy(c, s);
    return (int)m;
}

static size_t lookup(pgd_cache *c, uint64_t id, uint32_t n)
{
    pgd_hash h[32];
    chain(id, n, h);
    return pgd_cache_lookup(c, h, n);
}

/* Fills the pool with n_chains chains of 2 blocks (ids from base): a flood of prefixes. */
static int flood(pgd_cache *c, uint64_t base, uint32_t n_chains)
{
    for (uint32_t i = 0; i < n_chains; i++) {
        T_OK(request(c, base + i, 2, NULL));
        T_EQ(pgd_cache_check(c), PGD_OK);
    }
    return 0;
}

/* ---- tests ---- */

static int test_defaults(void)
{
    pgd_retention r = pgd_retention_default();
    T_EQ(r.priority, PGD_PRIORITY_DEFAULT);
    T_EQ(r.ttl_ms, 0);
    T_EQ(r.pin, 0);
    T_EQ(r.next_use_ms, 0);
    pgd_cache_params p = params(8);
    p.pin_share = 1.5;
    pgd_cache *c = NULL;
    T_EQ(pgd_cache_create(&p, &c), PGD_EINVAL);
    c = make_cache(8, 0);
    T_ASSERT(c);
    T_EQ(pgd_cache_now_ns(c), fake_now);
    pgd_seq *s = NULL;
    T_EQ(pgd_seq_create(c, NULL, 0, &s), PGD_OK);
    r.priority = 101;
    T_EQ(pgd_seq_set_retention(c, s, &r, 0), PGD_EINVAL);
    T_EQ(pgd_seq_set_retention(c, s, NULL, 0), PGD_EINVAL);
    pgd_seq_destroy(c, s);
    /* The default retention as the policy sees it. */
    T_EQ(request(c, 1, 2, NULL), 0);
    uint32_t p1 = req_pages[1];
    T_ASSERT(p1 < MAX_PAGES);
    T_EQ(request(c, 1, 2, NULL), 2);
    T_EQ(request(c, 1, 2, NULL), 2);
    T_EQ(seen[p1].priority, PGD_PRIORITY_DEFAULT);
    T_EQ(seen[p1].expires_ns, 0);
    T_EQ(seen[p1].next_use_ns, 0);
    T_EQ(seen[p1].now_ns, fake_now);
    T_EQ(seen[p1].depth, 1);
    T_EQ(seen[p1].uses, 2); /* two matches since it was registered */
    T_ASSERT(seen[p1].bytes >= (uint64_t)2 * PT * HD * sizeof(float));
    T_ASSERT(seen[p1].cost > 0);
    pgd_cost_model m = {0, 0};
    pgd_cost_model_default(&m, NL, NH, HD);
    T_ASSERT(seen[p1].cost == pgd_cost_model_page(&m, PT, 1));
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_cache_destroy(c);
    return 0;
}

/* An expired page goes before an LRU-older one, leaf first; the parent follows. */
static int test_ttl_expiry(void)
{
    pgd_cache *c = make_cache(8, 0);
    T_ASSERT(c);
    pgd_retention r = pgd_retention_default();
    r.ttl_ms = 1000;
    T_EQ(request(c, 1, 2, NULL), 0); /* the LRU-oldest */
    T_EQ(request(c, 2, 2, &r), 0);   /* expires in 1 s */
    T_EQ(pgd_cache_check(c), PGD_OK);
    /* Before its expiry, LRU order: chain 1's leaf first. */
    T_EQ(pgd_cache_evict(c, 1), 1);
    T_EQ(lookup(c, 1, 2), 1);
    T_EQ(lookup(c, 2, 2), 2);
    T_EQ(pgd_cache_check(c), PGD_OK);
    fake_now += 2000 * MS;
    T_EQ(pgd_cache_check(c), PGD_OK);
    /* Expired: chain 2 goes first, its leaf, then its first block (now a leaf). */
    T_EQ(pgd_cache_evict(c, 1), 1);
    T_EQ(lookup(c, 2, 2), 1);
    T_EQ(lookup(c, 1, 2), 1);
    T_EQ(pgd_cache_check(c), PGD_OK);
    T_EQ(pgd_cache_evict(c, 1), 1);
    T_EQ(lookup(c, 2, 2), 0);
    T_EQ(lookup(c, 1, 2), 1);
    T_EQ(pgd_cache_check(c), PGD_OK);
    /* Through a grow too: a full pool evicts the expired page before the LRU one. */
    pgd_cache_clear(c);
    T_EQ(request(c, 3, 4, NULL), 0);
    T_EQ(request(c, 4, 4, &r), 0); /* the pool is full: 8 pages */
    fake_now += 2000 * MS;
    T_EQ(request(c, 5, 1, NULL), 0);
    T_EQ(lookup(c, 3, 4), 4);
    T_EQ(lookup(c, 4, 4), 3);
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_cache_destroy(c);
    return 0;
}

/* priority = max(page's unless expired, sequence's); expiry = the later, none when either
 * has none; next use = the sequence's hint, else the page's unless passed. */
static int test_merge(void)
{
    pgd_cache *c = make_cache(16, 0);
    T_ASSERT(c);
    pgd_retention r = pgd_retention_default();
    r.priority = 80;
    r.ttl_ms = 1000;
    T_EQ(request(c, 1, 2, &r), 0);
    uint32_t p = req_pages[1];
    T_ASSERT(p < MAX_PAGES);
    T_EQ(seen[p].priority, 80);
    T_EQ(seen[p].expires_ns, fake_now + 1000 * MS);
    T_EQ(request(c, 1, 2, NULL), 2); /* a use without a TTL: no expiry, priority kept */
    T_EQ(seen[p].priority, 80);
    T_EQ(seen[p].expires_ns, 0);
    r.priority = 50;
    r.ttl_ms = 5000;
    r.next_use_ms = 3000;
    T_EQ(request(c, 1, 2, &r), 2);
    T_EQ(seen[p].priority, 80);
    T_EQ(seen[p].expires_ns, 0);
    T_EQ(seen[p].next_use_ns, fake_now + 3000 * MS);
    uint64_t hinted = fake_now + 3000 * MS;
    fake_now += 1000 * MS;
    T_EQ(request(c, 1, 2, NULL), 2); /* no hint: the page's, not passed yet */
    T_EQ(seen[p].next_use_ns, hinted);
    fake_now += 5000 * MS;
    T_EQ(request(c, 1, 2, NULL), 2); /* passed: none */
    T_EQ(seen[p].next_use_ns, 0);
    T_EQ(pgd_cache_check(c), PGD_OK);
    /* An expired page's priority does not count; both TTLs: the later expiry. */
    r = pgd_retention_default();
    r.priority = 90;
    r.ttl_ms = 1000;
    T_EQ(request(c, 2, 1, &r), 0);
    uint32_t q = req_pages[0];
    T_EQ(seen[q].priority, 90);
    fake_now += 2000 * MS;
    r.priority = 20;
    r.ttl_ms = 500;
    T_EQ(request(c, 2, 1, &r), 1);
    T_EQ(seen[q].priority, 20);
    T_EQ(seen[q].expires_ns, fake_now + 500 * MS);
    r.priority = 30;
    r.ttl_ms = 100;
    T_EQ(request(c, 2, 1, &r), 1);
    T_EQ(seen[q].priority, 30);
    T_EQ(seen[q].expires_ns, fake_now + 500 * MS); /* the later of the two */
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_cache_destroy(c);
    return 0;
}

/* A pinned request's pages survive a flood of other prefixes until unpinned. */
static int test_pin_flood(void)
{
    pgd_cache *c = make_cache(16, 0);
    T_ASSERT(c);
    pgd_retention r = pgd_retention_default();
    r.pin = 1;
    T_EQ(request(c, 1, 3, &r), 0);
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_cache_stats st;
    pgd_cache_get_stats(c, &st);
    T_EQ(st.n_pages_evictable, 0);
    T_OK(flood(c, 100, 40));
    T_EQ(lookup(c, 1, 3), 3);
    pgd_cache_get_stats(c, &st);
    T_ASSERT(st.n_evictions > 0);
    /* A second use of the pinned pages keeps them pinned (a pin is not a reference). */
    T_EQ(request(c, 1, 3, NULL), 3);
    T_OK(flood(c, 200, 40));
    T_EQ(lookup(c, 1, 3), 3);
    pgd_hash h[3];
    chain(1, 3, h);
    T_EQ(pgd_cache_unpin(c, h, 3), 3);
    T_EQ(pgd_cache_check(c), PGD_OK);
    T_EQ(pgd_cache_unpin(c, h, 3), 0);
    T_OK(flood(c, 300, 40));
    T_EQ(lookup(c, 1, 3), 0);
    /* pgd_cache_pin, then a flood: kept. */
    T_EQ(request(c, 2, 3, NULL), 0);
    chain(2, 3, h);
    T_EQ(pgd_cache_pin(c, h, 3, 0), 3);
    T_EQ(pgd_cache_check(c), PGD_OK);
    T_OK(flood(c, 400, 40));
    T_EQ(lookup(c, 2, 3), 3);
    pgd_cache_destroy(c);
    return 0;
}

/* A pin with a TTL holds until then; the page is then evictable (and expired). */
static int test_pin_ttl(void)
{
    pgd_cache *c = make_cache(16, 0);
    T_ASSERT(c);
    pgd_hash h[3];
    chain(1, 3, h);
    T_EQ(request(c, 1, 3, NULL), 0);
    T_EQ(pgd_cache_pin(c, h, 3, 1000), 3);
    T_EQ(pgd_cache_check(c), PGD_OK);
    T_OK(flood(c, 100, 20));
    T_EQ(lookup(c, 1, 3), 3);
    fake_now += 1500 * MS;
    T_EQ(pgd_cache_check(c), PGD_OK);
    T_OK(flood(c, 200, 20));
    T_EQ(lookup(c, 1, 3), 0);
    /* A request pin with a TTL: the pin and the expiry end together. */
    pgd_retention r = pgd_retention_default();
    r.pin = 1;
    r.ttl_ms = 1000;
    T_EQ(request(c, 2, 3, &r), 0);
    T_OK(flood(c, 300, 20));
    T_EQ(lookup(c, 2, 3), 3);
    fake_now += 1500 * MS;
    T_EQ(request(c, 5, 1, NULL), 0); /* one eviction: an expired page of chain 2 first */
    T_EQ(lookup(c, 2, 3), 2);
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_cache_destroy(c);
    return 0;
}

/* pin_share: a reservation or a pin past it is PGD_ENOSPC and changes nothing. */
static int test_pin_share(void)
{
    pgd_cache *c = make_cache(16, 0.25); /* 4 pinned pages at most */
    T_ASSERT(c);
    pgd_retention r = pgd_retention_default();
    r.pin = 1;
    pgd_seq *a = NULL, *b = NULL;
    T_EQ(pgd_seq_create(c, NULL, 0, &a), PGD_OK);
    T_EQ(pgd_seq_create(c, NULL, 0, &b), PGD_OK);
    T_EQ(pgd_seq_set_retention(c, a, &r, 5 * PT), PGD_ENOSPC);
    T_EQ(pgd_cache_check(c), PGD_OK);
    T_EQ(pgd_seq_set_retention(c, a, &r, 3 * PT - 1), PGD_OK); /* 3 pages */
    T_EQ(pgd_seq_set_retention(c, b, &r, 2 * PT), PGD_ENOSPC);
    T_EQ(pgd_seq_set_retention(c, b, &r, 1 * PT), PGD_OK);
    T_EQ(pgd_cache_check(c), PGD_OK);
    /* A pin of a cached chain does not fit either: nothing pinned. */
    pgd_hash h[2];
    chain(7, 2, h);
    T_EQ(request(c, 7, 2, NULL), 0);
    T_EQ(pgd_cache_pin(c, h, 2, 0), PGD_ENOSPC);
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_cache_stats st;
    pgd_cache_get_stats(c, &st);
    T_EQ(st.n_pages_evictable, 2);
    /* b gives its reservation back unused (no pages): now one page fits, not two. */
    pgd_seq_destroy(c, b);
    T_EQ(pgd_cache_pin(c, h, 2, 0), PGD_ENOSPC);
    T_EQ(pgd_cache_pin(c, h, 1, 0), 1);
    T_EQ(pgd_cache_check(c), PGD_OK);
    /* a commits 3 pages and pins them at its release: 4 pinned, the budget is full. */
    pgd_hash ha[3];
    chain(8, 3, ha);
    T_EQ(pgd_seq_match_hashes(c, a, ha, 3), 0);
    T_EQ(pgd_seq_grow(c, a, 3 * PT), PGD_OK);
    T_EQ(pgd_seq_commit_hashes(c, a, ha, 3), 3);
    pgd_seq_destroy(c, a);
    T_EQ(pgd_cache_check(c), PGD_OK);
    T_EQ(pgd_seq_create(c, NULL, 0, &a), PGD_OK);
    T_EQ(pgd_seq_set_retention(c, a, &r, 1), PGD_ENOSPC);
    T_EQ(pgd_cache_pin(c, h, 2, 0), PGD_ENOSPC);
    T_EQ(pgd_cache_pin(c, h, 1, 0), 1); /* already pinned: no new page */
    pgd_seq_destroy(c, a);
    T_EQ(pgd_cache_unpin(c, ha, 3), 3);
    T_EQ(pgd_cache_pin(c, h, 2, 0), 2);
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_cache_destroy(c);
    return 0;
}

/* evict_chain: deepest first, as far as no sequence holds a page and no other child
 * extends it; pinned pages are unpinned first. */
static int test_evict_chain(void)
{
    pgd_cache *c = make_cache(16, 0);
    T_ASSERT(c);
    pgd_hash f[3], g[3];
    chain(1, 3, f);
    T_EQ(request(c, 1, 3, NULL), 0);
    /* g shares f's first two blocks and adds another child of f[1]. */
    g[0] = f[0];
    g[1] = f[1];
    g[2].lo = 999;
    g[2].hi = 999;
    pgd_seq *s = NULL;
    T_EQ(pgd_seq_create(c, NULL, 0, &s), PGD_OK);
    T_EQ(pgd_seq_match_hashes(c, s, g, 3), 2);
    T_EQ(pgd_seq_grow(c, s, PT), PGD_OK);
    T_EQ(pgd_seq_commit_hashes(c, s, g + 2, 1), 1);
    pgd_seq_destroy(c, s);
    T_EQ(pgd_cache_evict_chain(c, f, 3), 1); /* f[1] has another child: it stays */
    T_EQ(pgd_cache_lookup(c, f, 3), 2);
    T_EQ(pgd_cache_lookup(c, g, 3), 3);
    T_EQ(pgd_cache_check(c), PGD_OK);
    /* A held page stays, and so do its ancestors. */
    T_EQ(pgd_seq_create(c, NULL, 0, &s), PGD_OK);
    T_EQ(pgd_seq_match_hashes(c, s, g, 3), 3);
    T_EQ(pgd_cache_evict_chain(c, g, 3), 0);
    pgd_seq_destroy(c, s);
    T_EQ(pgd_cache_check(c), PGD_OK);
    /* Pinned: unpinned first, then evicted whole. */
    T_EQ(pgd_cache_pin(c, g, 3, 0), 3);
    T_EQ(pgd_cache_evict_chain(c, g, 3), 3);
    T_EQ(pgd_cache_lookup(c, g, 3), 0);
    T_EQ(pgd_cache_lookup(c, f, 3), 0);
    pgd_cache_stats st;
    pgd_cache_get_stats(c, &st);
    T_EQ(st.n_pages_cached, 0);
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_cache_destroy(c);
    return 0;
}

/* ---- with a RAM tier: warm and hints ---- */

static pgd_tier *ram_tier(void)
{
    pgd_tier_ram_params p = pgd_tier_ram_default_params();
    p.capacity_bytes = 64ull * (PGD_RECORD_HEADER_BYTES + 2ull * PT * HD * sizeof(float));
    p.log = log_stderr;
    pgd_tier *t = NULL;
    if (pgd_tier_ram_create(&p, &t) != PGD_OK) return NULL;
    return t;
}

static pgd_cache *tier_cache(pgd_tier *t, uint32_t n_pages)
{
    pgd_tier_use use = {t, 0, 0};
    pgd_cache_params p = params(n_pages);
    p.tiers = &use;
    p.n_tiers = 1;
    p.writeback_pages = 16;
    pgd_cache *c = NULL;
    if (pgd_cache_create(&p, &c) != PGD_OK) return NULL;
    return c;
}

static int test_warm(void)
{
    pgd_tier *t = ram_tier();
    T_ASSERT(t);
    pgd_cache *c = tier_cache(t, 8);
    T_ASSERT(c);
    pgd_hash h[4];
    chain(1, 4, h);
    T_EQ(request(c, 1, 4, NULL), 0);
    T_EQ(pgd_cache_clear(c), 4); /* demoted to the tier */
    T_EQ(pgd_cache_flush(c), PGD_OK);
    T_EQ(pgd_tier_lookup(t, h, 4), 4);
    T_EQ(pgd_cache_lookup(c, h, 4), 0);
    pgd_cache_stats before, after;
    pgd_cache_get_stats(c, &before);
    T_EQ(pgd_cache_warm(c, NULL, 0, h, 4), 4);
    T_EQ(pgd_cache_lookup(c, h, 4), 4);
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_cache_get_stats(c, &after);
    T_EQ(after.n_query_pages, before.n_query_pages); /* warm is no query */
    T_EQ(after.n_pages_evictable, 4);                /* cached, released */
    pgd_cache_tier_stats ts;
    T_EQ(pgd_cache_get_tier_stats(c, 0, &ts), PGD_OK);
    T_EQ(ts.promoted_pages, 4);
    /* Warm of what the pool holds: the pool prefix; a partial chain: prefix + promoted. */
    T_EQ(pgd_cache_warm(c, NULL, 0, h, 4), 4);
    T_EQ(pgd_cache_evict(c, 2), 2);
    T_EQ(pgd_cache_flush(c), PGD_OK);
    T_EQ(pgd_cache_lookup(c, h, 4), 2);
    T_EQ(pgd_cache_warm(c, NULL, 0, h, 4), 4);
    T_EQ(pgd_cache_check(c), PGD_OK);
    /* A request now hits the pool. */
    T_EQ(request(c, 1, 4, NULL), 4);
    pgd_cache_destroy(c);
    pgd_tier_close(t);
    return 0;
}

static int test_hints(void)
{
    pgd_tier *t = ram_tier();
    T_ASSERT(t);
    pgd_cache *c = tier_cache(t, 8);
    T_ASSERT(c);
    pgd_hash h[3];
    chain(1, 3, h);
    T_EQ(request(c, 1, 3, NULL), 0);
    T_EQ(pgd_cache_clear(c), 3);
    T_EQ(pgd_cache_flush(c), PGD_OK);
    T_EQ(pgd_cache_hint(c, NULL, 0, h, 0, 0), PGD_EINVAL);
    uint64_t due = fake_now + 10000 * MS;
    T_EQ(pgd_cache_hint(c, NULL, 0, h, 3, due), PGD_OK);
    T_EQ(pgd_cache_hint(c, NULL, 0, h, 3, due), PGD_OK); /* replaces its entry */
    T_EQ(pgd_cache_n_hints(c), 1);
    T_EQ(pgd_cache_hints_run(c, 1000 * MS), 0); /* not due within the lead */
    T_EQ(pgd_cache_lookup(c, h, 3), 0);
    fake_now += 9500 * MS;
    T_EQ(pgd_cache_hints_run(c, 1000 * MS), 1);
    T_EQ(pgd_cache_n_hints(c), 0);
    T_EQ(pgd_cache_lookup(c, h, 3), 3); /* warmed from the tier before it is due */
    T_EQ(pgd_cache_check(c), PGD_OK);
    T_EQ(pgd_cache_hints_run(c, 1000 * MS), 0);
    /* A request's next-use hint registers its chain as a hint too. */
    pgd_retention r = pgd_retention_default();
    r.next_use_ms = 5000;
    T_EQ(request(c, 2, 2, &r), 0);
    T_EQ(pgd_cache_n_hints(c), 1);
    T_EQ(pgd_cache_evict(c, 8), 5);
    T_EQ(pgd_cache_flush(c), PGD_OK);
    T_EQ(lookup(c, 2, 2), 0);
    fake_now += 4000 * MS;
    T_EQ(pgd_cache_hints_run(c, 2000 * MS), 1);
    T_EQ(lookup(c, 2, 2), 2);
    T_EQ(pgd_cache_check(c), PGD_OK);
    /* 256 chains wait at most; a hint with a salt warms that tenant's chain. */
    for (uint64_t i = 0; i < 256; i++) {
        pgd_hash x[1];
        chain(100 + i, 1, x);
        T_EQ(pgd_cache_hint(c, "tenant", 6, x, 1, fake_now + i), PGD_OK);
    }
    pgd_hash y[1];
    chain(99, 1, y);
    T_EQ(pgd_cache_hint(c, NULL, 0, y, 1, fake_now), PGD_ENOSPC);
    T_EQ(pgd_cache_n_hints(c), 256);
    fake_now += 1000 * MS;
    T_EQ(pgd_cache_hints_run(c, 0), 256); /* none of them held anywhere: warmed 0 pages */
    T_EQ(pgd_cache_n_hints(c), 0);
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_cache_destroy(c); /* frees any hint left */
    pgd_tier_close(t);
    return 0;
}

/* A tier with the retain op: a RAM tier wrapped, counting the retain calls (the movers
 * call put and retain from their threads: a mutex). refuse: pins get PGD_ENOSPC. */
typedef struct ret_tier {
    pgd_tier *inner;
    pthread_mutex_t mu;
    int refuse;
    uint32_t n_pin, n_unpin, n_keep; /* calls with pin 1, -1, 0 */
    uint32_t last_priority;
    uint64_t last_ttl_s;
} ret_tier;

static int rt_bind(void *st, const pgd_record_ident *id)
{
    return pgd_tier_bind(((ret_tier *)st)->inner, id);
}
static int rt_put(void *st, pgd_hash b, pgd_hash p, const void *page, const void *bounds,
                  pgd_tier_spill_fn spill, void *ud)
{
    return pgd_tier_put(((ret_tier *)st)->inner, b, p, page, bounds, spill, ud);
}
static int rt_get(void *st, pgd_hash b, void *page, void *bounds)
{
    return pgd_tier_get(((ret_tier *)st)->inner, b, page, bounds);
}
static size_t rt_lookup(void *st, const pgd_hash *h, size_t n)
{
    return pgd_tier_lookup(((ret_tier *)st)->inner, h, n);
}
static int rt_del(void *st, pgd_hash b)
{
    return pgd_tier_del(((ret_tier *)st)->inner, b);
}
static void rt_stats(void *st, pgd_tier_stats *out)
{
    pgd_tier_get_stats(((ret_tier *)st)->inner, out);
}
static int rt_flush(void *st)
{
    return pgd_tier_flush(((ret_tier *)st)->inner);
}
static void rt_close(void *st)
{
    (void)st; /* the test closes the inner tier */
}
static int rt_retain(void *st, pgd_hash b, const pgd_tier_retention *r)
{
    ret_tier *t = st;
    int rc = pgd_tier_lookup(t->inner, &b, 1) ? PGD_OK : PGD_ENOTFOUND;
    pthread_mutex_lock(&t->mu);
    if (r->pin == 1 && t->refuse) {
        rc = PGD_ENOSPC;
    } else {
        t->n_pin += r->pin == 1;
        t->n_unpin += r->pin == -1;
        t->n_keep += r->pin == 0;
        t->last_priority = r->priority;
        t->last_ttl_s = r->ttl_s;
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}
static const pgd_tier_ops rt_ops = {"ret",    rt_bind,  rt_put,   rt_get, rt_lookup, rt_del,
                                    rt_stats, rt_flush, rt_close, NULL,   rt_retain};

static int test_tier_retain(void)
{
    ret_tier rt;
    memset(&rt, 0, sizeof rt);
    pthread_mutex_init(&rt.mu, NULL);
    rt.inner = ram_tier();
    T_ASSERT(rt.inner);
    pgd_tier *t = NULL;
    T_EQ(pgd_tier_wrap(&rt_ops, &rt, &t), PGD_OK);
    T_ASSERT(pgd_tier_has_retain(t));
    pgd_cache *c = tier_cache(t, 8);
    T_ASSERT(c);
    /* Default retention: a put and no retain. */
    T_EQ(request(c, 1, 2, NULL), 0);
    T_EQ(pgd_cache_clear(c), 2);
    T_EQ(pgd_cache_flush(c), PGD_OK);
    T_EQ(rt.n_keep + rt.n_pin + rt.n_unpin, 0);
    /* A page with a priority and a TTL carries them to the tier after its put. */
    pgd_retention r = pgd_retention_default();
    r.priority = 80;
    r.ttl_ms = 90000;
    T_EQ(request(c, 2, 2, &r), 0);
    fake_now += 30000 * MS;
    T_EQ(pgd_cache_clear(c), 2);
    T_EQ(pgd_cache_flush(c), PGD_OK);
    T_EQ(rt.n_keep, 2);
    T_EQ(rt.last_priority, 80);
    T_EQ(rt.last_ttl_s, 60);
    /* pin / unpin reach the tier; a tier refusing the pin: PGD_ENOSPC, nothing pinned. */
    pgd_hash h[2];
    chain(3, 2, h);
    T_EQ(request(c, 3, 2, NULL), 0);
    T_EQ(pgd_cache_pin(c, h, 2, 0), 2);
    T_EQ(rt.n_pin, 2);
    T_EQ(pgd_cache_unpin(c, h, 2), 2);
    T_EQ(rt.n_unpin, 2);
    rt.refuse = 1;
    T_EQ(pgd_cache_pin(c, h, 2, 0), PGD_ENOSPC);
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_cache_stats st;
    pgd_cache_get_stats(c, &st);
    T_EQ(st.n_pages_evictable, 2);
    pgd_cache_destroy(c);
    pgd_tier_close(t);
    pgd_tier_close(rt.inner);
    pthread_mutex_destroy(&rt.mu);
    return 0;
}

/* ---- randomized: every retention operation, a check after each step ---- */

/* Chain of family f, branch b: the first 2 blocks are the family's, the rest the branch's
 * (so branches share a prefix and the prefix tree has inner pages with several children). */
static void rchain(uint32_t f, uint32_t b, uint32_t n, pgd_hash *h)
{
    for (uint32_t k = 0; k < n; k++) {
        h[k].lo = k < 2 ? 7000 + f * 10 + k : 9000000 + f * 10000 + b * 10 + k;
        h[k].hi = 77;
    }
}

static int rand_steps(uint64_t seed, int with_tier)
{
    pgd_tier *t = with_tier ? ram_tier() : NULL;
    pgd_cache *c = NULL;
    if (with_tier) {
        c = tier_cache(t, 12);
    } else {
        pgd_cache_params p = params(12);
        p.pin_share = 0.5;
        T_EQ(pgd_cache_create(&p, &c), PGD_OK);
    }
    T_ASSERT(c);
    uint64_t rs = seed * 2654435761u + 1;
    pgd_seq *live[3] = {NULL, NULL, NULL};
    uint64_t n_match = 0, n_pin = 0, n_enospc = 0, n_evict = 0, n_warm = 0;
    for (int step = 0; step < 3000; step++) {
        uint32_t op = (uint32_t)(t_rand(&rs) % 12), f = (uint32_t)(t_rand(&rs) % 4),
                 b = (uint32_t)(t_rand(&rs) % 3), n = 1 + (uint32_t)(t_rand(&rs) % 5);
        pgd_hash h[8];
        rchain(f, b, n, h);
        pgd_retention r = pgd_retention_default();
        r.priority = (uint32_t)(t_rand(&rs) % 101);
        r.ttl_ms = t_rand(&rs) % 3 ? 0 : 1 + t_rand(&rs) % 3000;
        r.pin = t_rand(&rs) % 4 == 0;
        r.next_use_ms = t_rand(&rs) % 5 ? 0 : 1 + t_rand(&rs) % 3000;
        uint32_t slot = (uint32_t)(t_rand(&rs) % 3);
        int rc = 0;
        switch (op) {
        case 0:
        case 1:
        case 2: /* a request, held for a while in a slot (released by a later one) */
            if (live[slot]) {
                pgd_seq_destroy(c, live[slot]);
                live[slot] = NULL;
            }
            T_OK(pgd_seq_create(c, NULL, 0, &live[slot]));
            rc = pgd_seq_set_retention(c, live[slot], &r, (uint64_t)n * PT);
            if (rc != PGD_OK && rc != PGD_ENOSPC) T_FAIL("set_retention %d", rc);
            {
                int64_t m = pgd_seq_match_hashes(c, live[slot], h, n);
                T_OK(m);
                n_match += (uint64_t)m;
                T_OK(pgd_seq_wait(c, live[slot]));
                m = (int64_t)(pgd_seq_n_committed(c, live[slot]) / PT);
                if (m < n && pgd_seq_grow(c, live[slot], (size_t)(n - m) * PT) == PGD_OK)
                    T_OK(pgd_seq_commit_hashes(c, live[slot], h + m, n - (size_t)m));
            }
            break;
        case 3:
            rc = pgd_cache_pin(c, h, n, t_rand(&rs) % 2 ? 0 : 1 + t_rand(&rs) % 2000);
            if (rc < 0 && rc != PGD_ENOSPC) T_FAIL("pin %d", rc);
            n_pin += rc > 0 ? (uint64_t)rc : 0;
            n_enospc += rc == PGD_ENOSPC;
            break;
        case 4:
            T_OK(pgd_cache_unpin(c, h, n));
            break;
        case 5:
            rc = pgd_cache_evict_chain(c, h, n);
            T_OK(rc);
            n_evict += (uint64_t)rc;
            break;
        case 6:
            rc = pgd_cache_warm(c, NULL, 0, h, n);
            T_OK(rc);
            n_warm += (uint64_t)rc;
            break;
        case 7:
            T_ASSERT(pgd_cache_lookup(c, h, n) <= n);
            break;
        case 8:
            rc = pgd_cache_hint(c, NULL, 0, h, n, fake_now + t_rand(&rs) % 4000 * MS);
            if (rc != PGD_OK && rc != PGD_ENOSPC) T_FAIL("hint %d", rc);
            T_OK(pgd_cache_hints_run(c, t_rand(&rs) % 2000 * MS));
            break;
        case 9:
            T_OK(pgd_cache_evict(c, 1 + (uint32_t)(t_rand(&rs) % 3)));
            break;
        default:
            fake_now += t_rand(&rs) % 1500 * MS;
            break;
        }
        if (pgd_cache_check(c) != PGD_OK)
            T_FAIL("seed %llu step %d op %u", (unsigned long long)seed, step, op);
    }
    for (int i = 0; i < 3; i++)
        pgd_seq_destroy(c, live[i]);
    T_EQ(pgd_cache_check(c), PGD_OK);
    /* Not vacuous: each kind of operation had an effect. */
    T_ASSERT(n_match > 0 && n_pin > 0 && n_enospc > 0 && n_evict > 0 && n_warm > 0);
    if (getenv("PGD_TEST_VERBOSE"))
        printf("  seed %llu tier %d: matched %llu, pinned %llu, enospc %llu, evicted %llu, "
               "warm %llu\n",
               (unsigned long long)seed, with_tier, (unsigned long long)n_match,
               (unsigned long long)n_pin, (unsigned long long)n_enospc, (unsigned long long)n_evict,
               (unsigned long long)n_warm);
    pgd_cache_destroy(c);
    pgd_tier_close(t);
    return 0;
}

static int test_random(void)
{
    for (uint64_t seed = 1; seed <= 8; seed++) {
        T_OK(rand_steps(seed, 0));
        T_OK(rand_steps(seed, 1));
    }
    return 0;
}

/* ---- threads: every new path under the cache lock ---- */

typedef struct thr_arg {
    pgd_cache *c;
    uint64_t seed;
    int failed;
} thr_arg;

static void *thr_run(void *p)
{
    thr_arg *a = p;
    uint64_t rs = a->seed;
    for (int i = 0; i < 1500 && !a->failed; i++) {
        uint32_t f = (uint32_t)(t_rand(&rs) % 4), b = (uint32_t)(t_rand(&rs) % 3),
                 n = 1 + (uint32_t)(t_rand(&rs) % 5);
        pgd_hash h[8];
        rchain(f, b, n, h);
        int rc = 0;
        switch (t_rand(&rs) % 6) {
        case 0:
        case 1: {
            pgd_seq *s = NULL;
            pgd_retention r = pgd_retention_default();
            r.pin = t_rand(&rs) % 4 == 0;
            r.ttl_ms = t_rand(&rs) % 2 ? 0 : 1 + t_rand(&rs) % 5;
            r.next_use_ms = t_rand(&rs) % 3 ? 0 : 1;
            if (pgd_seq_create(a->c, NULL, 0, &s) != PGD_OK) break;
            pgd_seq_set_retention(a->c, s, &r, (uint64_t)n * PT);
            int64_t m = pgd_seq_match_hashes(a->c, s, h, n);
            pgd_seq_wait(a->c, s);
            m = (int64_t)(pgd_seq_n_committed(a->c, s) / PT);
            if (m >= 0 && m < n && pgd_seq_grow(a->c, s, (size_t)(n - m) * PT) == PGD_OK)
                rc = pgd_seq_commit_hashes(a->c, s, h + m, n - (size_t)m) < 0;
            pgd_seq_destroy(a->c, s);
            break;
        }
        case 2:
            rc = pgd_cache_pin(a->c, h, n, t_rand(&rs) % 2 ? 0 : 2);
            rc = rc < 0 && rc != PGD_ENOSPC;
            break;
        case 3:
            rc = pgd_cache_unpin(a->c, h, n) < 0 || pgd_cache_evict_chain(a->c, h, n) < 0;
            break;
        case 4:
            rc = pgd_cache_warm(a->c, NULL, 0, h, n) < 0;
            break;
        default:
            pgd_cache_hint(a->c, NULL, 0, h, n, pgd_cache_now_ns(a->c) + 1000000);
            rc = pgd_cache_hints_run(a->c, 500000) < 0;
            break;
        }
        if (rc || (i % 64 == 0 && pgd_cache_check(a->c) != PGD_OK)) a->failed = 1;
    }
    return NULL;
}

static int test_threads(void)
{
    pgd_tier *t = ram_tier();
    T_ASSERT(t);
    pgd_tier_use use = {t, 0, 0};
    pgd_cache_params p = params(16);
    p.clock = NULL; /* CLOCK_MONOTONIC: the fake one is not thread-safe */
    p.tiers = &use;
    p.n_tiers = 1;
    pgd_cache *c = NULL;
    T_EQ(pgd_cache_create(&p, &c), PGD_OK);
    pthread_t th[3];
    thr_arg args[3];
    for (int i = 0; i < 3; i++) {
        args[i] = (thr_arg){c, 1000 + (uint64_t)i * 77, 0};
        T_EQ(pthread_create(&th[i], NULL, thr_run, &args[i]), 0);
    }
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 3; i++)
        T_EQ(args[i].failed, 0);
    T_EQ(pgd_cache_check(c), PGD_OK);
    pgd_cache_destroy(c);
    pgd_tier_close(t);
    return 0;
}

/* A hint left at destroy is freed (checked by the sanitizer builds). */
static int test_hint_left(void)
{
    pgd_cache *c = make_cache(8, 0);
    T_ASSERT(c);
    pgd_hash h[2];
    chain(1, 2, h);
    T_EQ(pgd_cache_hint(c, "s", 1, h, 2, fake_now), PGD_OK);
    T_EQ(pgd_cache_warm(c, NULL, 0, h, 2), 0); /* no tier, nothing cached */
    T_EQ(pgd_cache_lookup(c, h, 0), 0);
    pgd_cache_destroy(c);
    return 0;
}

int main(void)
{
    T_RUN(test_defaults);
    T_RUN(test_ttl_expiry);
    T_RUN(test_merge);
    T_RUN(test_pin_flood);
    T_RUN(test_pin_ttl);
    T_RUN(test_pin_share);
    T_RUN(test_evict_chain);
    T_RUN(test_warm);
    T_RUN(test_hints);
    T_RUN(test_tier_retain);
    T_RUN(test_hint_left);
    T_RUN(test_random);
    T_RUN(test_threads);
    T_DONE();
}
