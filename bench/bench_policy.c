/* SPDX-License-Identifier: MIT */
/*
 * bench_policy.c - eviction-policy bookkeeping per operation (ns/op) for every built-in
 * policy (pgd_policy_builtin over 0 .. PGD_POLICY_COUNT-1; Belady with an oracle built from
 * the known request stream), against LRU in the same run, and the replay throughput it
 * allows (blocks/s: issue 13 requires at least 1M for every policy).
 *
 * The op stream is shaped like the cache's: requests for documents (a skewed choice over
 * --docs documents of 8..64 pages, every document behind one of 64 shared 4-page system
 * prefixes, so the pages form a prefix tree); a request walks its chain, taking cached
 * pages (hit), then registers the rest (insert), allocating from a free list or evicting
 * (victim with a leaf-only accept callback, then remove); --inflight requests are held at
 * once, and the oldest is released deepest page first (unreferenced). The driver is a plain
 * array tree, far cheaper than the cache itself, but its time is included: ns/op is the
 * loop's time over the policy calls it made. The request stream is the same for every
 * policy (and gives Belady its future); the hit ratio shows that each policy did its job.
 * Each figure is the median of --reps runs, in process CPU time (the bench is single-
 * threaded; CPU time is steadier than wall time on a shared machine).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pagoda/policy.h>

#include "bench.h"

#define GROUPS 64
#define PREFIX 4 /* pages of a group's shared prefix */
#define MAXLEN 64
#define NONE UINT32_MAX

typedef struct world {
    /* the stream */
    uint32_t n_docs, n_req, n_pages, inflight;
    uint32_t *doc_len;                         /* [n_docs] pages, PREFIX + 4 .. MAXLEN */
    uint32_t *req_doc;                         /* [n_req] */
    uint32_t *next_same_doc, *next_same_group; /* [n_req] next request index, or NONE */
    /* nodes: GROUPS * PREFIX group nodes, then n_docs * MAXLEN document nodes */
    uint32_t *page_of; /* [nodes] */
    /* pages */
    uint32_t *node_of, *parent, *n_children, *refs, *depth; /* [n_pages] */
    uint32_t *free_list, n_free;
    /* Belady's clock: the next request of each document and group after the current one */
    uint64_t *doc_next, *group_next;
    /* in-flight requests: their pages */
    uint32_t (*held)[MAXLEN];
    uint32_t *n_held;
    /* counters */
    uint64_t ops, blocks, hits, failed;
    double cost[MAXLEN]; /* pgd_cost_model_page by depth */
} world;

static uint32_t node_id(uint32_t doc, uint32_t i)
{
    if (i < PREFIX) return (doc % GROUPS) * PREFIX + i;
    return GROUPS * PREFIX + doc * MAXLEN + i;
}

static uint64_t oracle(void *ud, pgd_hash h)
{
    const world *w = ud;
    uint32_t node = (uint32_t)h.lo;
    if (node < GROUPS * PREFIX) return w->group_next[node / PREFIX];
    return w->doc_next[(node - GROUPS * PREFIX) / MAXLEN];
}

static uint64_t zero_clock(void *ud)
{
    (void)ud;
    return 0;
}

static void *a_malloc(void *ud, size_t n)
{
    (void)ud;
    return malloc(n);
}
static void *a_realloc(void *ud, void *p, size_t n)
{
    (void)ud;
    return realloc(p, n);
}
static void a_free(void *ud, void *p)
{
    (void)ud;
    free(p);
}
static const pgd_allocator libc = {a_malloc, a_realloc, a_free, NULL};

static int accept_leaf(void *ctx, uint32_t page)
{
    const world *w = ctx;
    return w->node_of[page] != NONE && w->n_children[page] == 0;
}

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p) {
        fprintf(stderr, "bench_policy: out of memory\n");
        exit(1);
    }
    return p;
}

/* The request stream and its future (shared by every policy). */
static void make_stream(world *w, uint64_t seed)
{
    uint64_t rs = seed * 0x9E3779B97F4A7C15ull + 1;
    w->doc_len = xcalloc(w->n_docs, sizeof *w->doc_len);
    w->req_doc = xcalloc(w->n_req, sizeof *w->req_doc);
    w->next_same_doc = xcalloc(w->n_req, sizeof *w->next_same_doc);
    w->next_same_group = xcalloc(w->n_req, sizeof *w->next_same_group);
    for (uint32_t d = 0; d < w->n_docs; d++)
        w->doc_len[d] = PREFIX + 4 + (uint32_t)(bench_rng(&rs) % (MAXLEN - PREFIX - 3));
    for (uint32_t r = 0; r < w->n_req; r++) {
        double u = (double)(bench_rng(&rs) >> 11) / 9007199254740992.0;
        w->req_doc[r] = (uint32_t)(u * u * u * w->n_docs); /* skewed: low ids are popular */
    }
    uint32_t *last_doc = xcalloc(w->n_docs, sizeof *last_doc);
    uint32_t last_group[GROUPS];
    for (uint32_t d = 0; d < w->n_docs; d++)
        last_doc[d] = NONE;
    for (uint32_t g = 0; g < GROUPS; g++)
        last_group[g] = NONE;
    for (uint32_t r = w->n_req; r-- > 0;) {
        uint32_t d = w->req_doc[r];
        w->next_same_doc[r] = last_doc[d];
        w->next_same_group[r] = last_group[d % GROUPS];
        last_doc[d] = r;
        last_group[d % GROUPS] = r;
    }
    w->doc_next = xcalloc(w->n_docs, sizeof *w->doc_next);
    w->group_next = xcalloc(GROUPS, sizeof *w->group_next);
    for (uint32_t d = 0; d < w->n_docs; d++)
        w->doc_next[d] = last_doc[d] == NONE ? UINT64_MAX : last_doc[d];
    for (uint32_t g = 0; g < GROUPS; g++)
        w->group_next[g] = last_group[g] == NONE ? UINT64_MAX : last_group[g];
    free(last_doc);
    size_t nodes = (size_t)GROUPS * PREFIX + (size_t)w->n_docs * MAXLEN;
    w->page_of = xcalloc(nodes, sizeof *w->page_of);
    w->node_of = xcalloc(w->n_pages, sizeof *w->node_of);
    w->parent = xcalloc(w->n_pages, sizeof *w->parent);
    w->n_children = xcalloc(w->n_pages, sizeof *w->n_children);
    w->refs = xcalloc(w->n_pages, sizeof *w->refs);
    w->depth = xcalloc(w->n_pages, sizeof *w->depth);
    w->free_list = xcalloc(w->n_pages, sizeof *w->free_list);
    w->held = xcalloc(w->inflight, sizeof *w->held);
    w->n_held = xcalloc(w->inflight, sizeof *w->n_held);
}

/* Back to an empty cache (the stream stays). */
static void reset(world *w)
{
    size_t nodes = (size_t)GROUPS * PREFIX + (size_t)w->n_docs * MAXLEN;
    for (size_t i = 0; i < nodes; i++)
        w->page_of[i] = NONE;
    for (uint32_t p = 0; p < w->n_pages; p++) {
        w->node_of[p] = NONE;
        w->n_children[p] = w->refs[p] = 0;
        w->free_list[p] = w->n_pages - 1 - p;
    }
    w->n_free = w->n_pages;
    memset(w->n_held, 0, w->inflight * sizeof *w->n_held);
    w->ops = w->blocks = w->hits = w->failed = 0;
}

/* What the cache tells the policy about page (the cost by depth precomputed, as the cache
 * keeps it per page). */
static pgd_policy_page info_of(const world *w, uint32_t page)
{
    uint32_t d = w->depth[page];
    pgd_policy_page i = {.hash = {w->node_of[page], 0x5eed},
                         .depth = d,
                         .priority = PGD_PRIORITY_DEFAULT,
                         .bytes = 1 << 20,
                         .cost = w->cost[d]};
    return i;
}

static void release(world *w, const pgd_policy_ops *ops, void *st, uint32_t slot)
{
    for (uint32_t k = w->n_held[slot]; k-- > 0;) { /* deepest first */
        uint32_t p = w->held[slot][k];
        if (--w->refs[p] == 0) {
            pgd_policy_page i = info_of(w, p);
            ops->unreferenced(st, p, &i);
            w->ops++;
        }
    }
    w->n_held[slot] = 0;
}

/* One pass of the stream under ops. Returns 0, or -1 if the policy could not be created. */
static int run(world *w, const pgd_policy_ops *ops)
{
    pgd_cost_model cm = {0, 0};
    pgd_cost_model_default(&cm, 32, 8, 128);
    for (uint32_t d = 0; d < MAXLEN; d++)
        w->cost[d] = pgd_cost_model_page(&cm, 16, d);
    pgd_policy_init init = {.n_pages = w->n_pages,
                            .alloc = &libc,
                            .next_use = oracle,
                            .next_use_ud = w,
                            .clock = zero_clock,
                            .page_bytes = 1 << 20,
                            .cost = cm};
    void *st = NULL;
    reset(w);
    /* Belady's clock back to the start of the stream */
    for (uint32_t d = 0; d < w->n_docs; d++)
        w->doc_next[d] = UINT64_MAX;
    for (uint32_t g = 0; g < GROUPS; g++)
        w->group_next[g] = UINT64_MAX;
    for (uint32_t r = w->n_req; r-- > 0;) {
        w->doc_next[w->req_doc[r]] = r;
        w->group_next[w->req_doc[r] % GROUPS] = r;
    }
    if (ops->create(&init, &st) != PGD_OK) return -1;
    for (uint32_t r = 0; r < w->n_req; r++) {
        uint32_t slot = r % w->inflight, d = w->req_doc[r];
        release(w, ops, st, slot); /* the request inflight ago is done */
        w->doc_next[d] = w->next_same_doc[r] == NONE ? UINT64_MAX : w->next_same_doc[r];
        w->group_next[d % GROUPS] =
            w->next_same_group[r] == NONE ? UINT64_MAX : w->next_same_group[r];
        uint32_t prev = NONE;
        for (uint32_t i = 0; i < w->doc_len[d]; i++) {
            uint32_t node = node_id(d, i), p = w->page_of[node];
            w->blocks++;
            if (p != NONE) { /* cached: a match takes it */
                pgd_policy_page in = info_of(w, p);
                ops->hit(st, p, &in);
                w->ops++;
                w->hits++;
                w->refs[p]++;
            } else {
                if (w->n_free == 0) {
                    uint32_t v = ops->victim(st, accept_leaf, w);
                    w->ops++;
                    if (v == PGD_POLICY_NO_PAGE || !accept_leaf(w, v) || w->refs[v]) {
                        w->failed++;
                        break;
                    }
                    ops->remove(st, v);
                    w->ops++;
                    w->page_of[w->node_of[v]] = NONE;
                    if (w->parent[v] != NONE) w->n_children[w->parent[v]]--;
                    w->node_of[v] = NONE;
                    w->free_list[w->n_free++] = v;
                }
                p = w->free_list[--w->n_free];
                w->page_of[node] = p;
                w->node_of[p] = node;
                w->parent[p] = prev;
                w->depth[p] = i;
                w->refs[p] = 1;
                if (prev != NONE) w->n_children[prev]++;
                pgd_policy_page in = info_of(w, p);
                ops->insert(st, p, &in);
                w->ops++;
            }
            w->held[slot][w->n_held[slot]++] = p;
            prev = p;
        }
    }
    for (uint32_t s = 0; s < w->inflight; s++)
        release(w, ops, st, s);
    ops->destroy(st);
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_policy [options]\n"
               "Eviction policy bookkeeping (ns/op) for every built-in policy, against LRU.\n"
               "  --pages N     pool pages (default 32768)\n"
               "  --docs N      documents, 8..64 pages each (default 8192)\n"
               "  --requests N  requests (default 200000)\n"
               "  --inflight N  requests held at once (default 8)\n"
               "  --reps N      runs per policy, median reported (default 3)\n"
               "  --policy NAME only this policy (and LRU, the reference)\n"
               "  --seed N      stream seed (default 1)\n"
               "  --smoke       tiny and fast (1024 pages, 2000 requests, 1 rep): for ctest\n"
               "  --help        show this help\n");
}

int main(int argc, char **argv)
{
    static const struct option own[] = {{"pages", required_argument, NULL, 'p'},
                                        {"docs", required_argument, NULL, 'd'},
                                        {"requests", required_argument, NULL, 'r'},
                                        {"inflight", required_argument, NULL, 'i'},
                                        {"reps", required_argument, NULL, 'n'},
                                        {"policy", required_argument, NULL, 'P'},
                                        {NULL, 0, NULL, 0}};
    bench_cli cli = {.prog = "bench_policy",
                     .usage = usage,
                     .own = own,
                     .common = BENCH_SEED | BENCH_SMOKE,
                     .a = {.seed = 1}};
    uint64_t pages = 32768, docs = 8192, requests = 200000, inflight = 8, reps = 3, v;
    const char *only = NULL;
    for (;;) {
        int c = bench_cli_next(&cli, argc, argv);
        if (c == -1) break;
        if (c == 'P') {
            only = optarg;
            continue;
        }
        if (bench_parse_u64(optarg, &v) != 0 || v == 0 || v > (1u << 26)) {
            fprintf(stderr, "bench_policy: bad number '%s'\n", optarg);
            return 2;
        }
        switch (c) {
        case 'p':
            pages = v;
            break;
        case 'd':
            docs = v;
            break;
        case 'r':
            requests = v;
            break;
        case 'i':
            inflight = v;
            break;
        case 'n':
            reps = v;
            break;
        }
    }
    if (cli.status >= 0) return cli.status;
    if (cli.a.smoke) pages = 1024, docs = 256, requests = 2000, reps = 1;
    if (pages < inflight * MAXLEN + 1) {
        fprintf(stderr, "bench_policy: --pages must exceed inflight x %d\n", MAXLEN);
        return 2;
    }
    world w;
    memset(&w, 0, sizeof w);
    w.n_pages = (uint32_t)pages, w.n_docs = (uint32_t)docs, w.n_req = (uint32_t)requests;
    w.inflight = (uint32_t)inflight;
    make_stream(&w, cli.a.seed);
    printf("bench_policy: %u pages, %u documents, %u requests, %u in flight, %u reps\n", w.n_pages,
           w.n_docs, w.n_req, w.inflight, (unsigned)reps);
    printf("%-10s %12s %12s %9s %8s %14s %9s\n", "policy", "ops", "blocks", "ns/op", "x lru",
           "blocks/s", "hit ratio");
    double lru_ns = 0;
    int rc = 0;
    for (int k = 0; k < PGD_POLICY_COUNT; k++) {
        const pgd_policy_ops *ops = pgd_policy_builtin((pgd_policy_kind)k);
        if (!ops || (only && strcmp(only, ops->name) != 0 && k != PGD_POLICY_LRU)) continue;
        double t[16];
        uint32_t n = reps < 16 ? (uint32_t)reps : 16;
        for (uint32_t i = 0; i < n; i++) {
            double t0 = bench_clock_s(CLOCK_PROCESS_CPUTIME_ID);
            if (run(&w, ops) != 0) {
                fprintf(stderr, "bench_policy: %s: create failed\n", ops->name);
                return 1;
            }
            t[i] = bench_clock_s(CLOCK_PROCESS_CPUTIME_ID) - t0;
        }
        double s = bench_median(t, n), ns = s * 1e9 / (double)w.ops;
        if (k == PGD_POLICY_LRU) lru_ns = ns;
        printf("%-10s %12" PRIu64 " %12" PRIu64 " %9.1f %8.2f %14.0f %9.4f\n", ops->name, w.ops,
               w.blocks, ns, lru_ns > 0 ? ns / lru_ns : 0.0, (double)w.blocks / s,
               (double)w.hits / (double)w.blocks);
        if (w.failed) {
            fprintf(stderr, "bench_policy: %s: %" PRIu64 " allocations found no victim\n",
                    ops->name, w.failed);
            rc = 1;
        }
    }
    return rc;
}
