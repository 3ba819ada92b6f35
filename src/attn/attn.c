/* SPDX-License-Identifier: MIT */
/*
 * attn.c - the fast paged attention path: pgd_attn_create / pgd_attn_run.
 * Callers: the engine (one run per layer per forward step), tests, bench_attn.
 *
 * A run plans a compact queue of work items over the whole batch, hands it to the
 * caller's parallel fn, and merges split results:
 *
 *   tile    up to tile_rows consecutive query rows of one item (a decode row is a tile of
 *           one row); tile_rows * group <= 64 query vectors
 *   task    (tile, KV head): its list of pages is every page up to the tile's last row, or
 *           the Quest selection of a decode row; every K/V row it loads serves all the
 *           tile's rows and all query heads of the GQA group (k_scores / v_accum take
 *           nq = rows * group query vectors), never reloaded per query head.
 *           A one-row tile without a Quest selection (decode) makes tasks of up to `wide`
 *           KV heads (all of them for usual shapes; <= 64 query vectors): for each page it
 *           reads the K regions of its heads one after the other, then their V regions;
 *           the pool lays a page's heads side by side ([layer][K|V][kv_head]), so a
 *           decode task reads n_kv_heads * region-byte runs instead of single regions at
 *           a page's stride. Each head still gets its own kernel calls, so the results
 *           equal one head per task bit for bit. Measured (bench_attn --threads 1
 *           --cpu-time, 8 KV heads, head_dim 128): at 32k context 1.03-1.26x faster than
 *           one head per task for f16 / q8_0 / q4_0 (f16 GQA 1: 63% -> 71% of the read
 *           probe; paged / contiguous 0.87-0.96 -> 0.96-1.0), but at 4k, where the bench's
 *           16 MiB of K/V stay in this machine's 260 MiB L3, 0.86-0.98x: so only decode
 *           rows of at least WIDE_MIN_KEYS keys get such tasks.
 *   range   range_pages consecutive entries of a task's page list (RANGE_KEYS keys, or
 *           params.split_pages pages), counted from the list's start: a fixed function of
 *           the row's own pages. Each range runs the online softmax from a fresh state, and
 *           the ranges' states are merged by log-sum-exp in page order (merge_one).
 *   piece   (task, its whole page list or one range of it): a long task is split into one
 *           piece per range so that one long sequence uses every thread; short tasks stay
 *           whole and don't wait. Split pieces are queued first (the largest work), whole
 *           tasks after; empty items make no task. A whole task merges its ranges as it
 *           goes, the last piece of a split task merges the pieces' states, in the same
 *           order with the same function: so a row's output is the same bits whether its
 *           task was split or not, whatever the rest of the batch and the thread count
 *           (batch invariance; test_attn checks it). Cost: bench_attn, see the commit.
 *
 * One piece, for blocks of up to BLOCK_KEYS keys (whole pages):
 *
 *   S[q][j] = log2(e)/sqrt(hd) * q . k_j       codec k_scores, page by page into S
 *                                              (q8_0 / q4_0 VNNI: the query quantized
 *                                              once per piece, codec prepare_q, then
 *                                              k_scores_prep page by page)
 *   online softmax per query q (softmax.c):    m, l, O <- rescaled; S <- 2^(S - m)
 *   O[q] += sum_j S[q][j] v_j                  codec v_accum, page by page
 *
 * Causality: a tile's rows see keys up to their own position; within a block the keys a
 * row sees are a prefix of the block (pages ascend), so the step gets its valid count.
 * A range ends in a state (m, l, O), merged into the task's running state (M, L, A):
 * M' = max(M, m), A' = 2^(M - M') A + 2^(m - M') O, L' likewise. A whole task writes
 * out = A / L; a piece of a split task stores its state in its slot, and the last piece to
 * finish (atomic counter, acq_rel) merges the slots the same way, in order.
 *
 * Rotated pools: queries are rotated when copied into the tile's scratch, outputs
 * inverse-rotated when written. Staged pools (kivi2, q8_0 / q4_0 with head_dim < 32): a
 * tile's rows share one page, which they read from the residual ring with the f16 kernels
 * (pgd__attn_ring_page, pgd__attn_src); every other page comes from the pool.
 *
 * Quest: a first pass (one task per decode item and KV head) selects the pages of every
 * decode row over budget (common.c); the tasks of those rows then run over the selection.
 *
 * Scores (pgd_attn_run_scored, token budgets): a scored tile (one holding rows of its item's
 * last sc.rows rows) runs its S in W, per-thread scratch of score_keys columns per query
 * vector (sized at create), so that the weights 2^(s - m) that the step writes for the V
 * pass stay there for every key of its list, with MP, the running max m after each page's
 * block. Once the task's final state (MA, LA) is known, a key's probability is
 * W * 2^(MP - MA) / LA = 2^(s - MA) / LA (one multiply per weight, no second exp2 and no
 * second pass over K), summed per key over the tile's scored rows and the group's heads
 * in that order and added to the item's scores (add_scores). Determinism: a scored task is
 * never split into pieces (its page ranges still merge the same way, so its outputs are
 * the bits of an unscored run), and all the scored tiles of an item and KV head run in one
 * task, one after the other in tile order, so no two tasks ever add to the same scores
 * (items of one run must not share a scores buffer):
 * the same bits whatever the thread count and the batch. The price: a scored decode row
 * uses at most n_kv_heads threads (its tasks are one KV head each when n_threads > 1),
 * and an item's scored prefill tiles one thread per KV head.
 * Cost, bench_attn --scores --threads 1 --cpu-time (8 KV heads, head_dim 128, GQA 4, one
 * decode row, on a loaded 2-core VM), scored / plain: f16 1.03-1.07 at 4k keys, 1.08-1.09
 * at 32k; q8_0 1.04-1.06 at 4k, 1.10-1.11 at 32k. Instructions +1.7-2.1% (callgrind, AVX2);
 * the rest at 32k is W's traffic, G floats per key and head (4 MiB) written and read back.
 * Tried without gain: one KV head per scored decode task (W in L2; 1.2-1.27), non-temporal
 * copies of S into W (no RFO; 1.05-1.13), huge pages for the scratch.
 *
 * Gemma (pgd_attn_params scale, softcap, layer_window):
 *   scale    k_scores gets log2(e) * scale instead of log2(e) / sqrt(hd) (0: that constant,
 *            the same bits as before)
 *   softcap  after a block's K scores and before any masking, each score s (log2 domain)
 *            becomes C tanh(s / C), C = log2(e) * softcap (softmax.c, vectorised tanh);
 *            softcap 0 skips the pass
 *   window   a layer of window W: row p sees slots p - W + 1 .. p. A tile's page list starts
 *            at the page of its first row's window start (tile_pages), so pages wholly
 *            before every row's window are never read: a decode row reads about W / pt + 1
 *            pages. Ranges and blocks stay at fixed pages (multiples of range_pages from
 *            page 0, blocks from a range's start), the list's first range and block being
 *            partial; a row's valid keys in a block are the columns [c0, nv) (window start,
 *            causal end), which the step gets alone (s + c0), the columns before c0 being
 *            zeroed (weight 0 in V and in the scores). So a window row computes the very same
 *            blocks and ranges as a decode row or as any row of a prefill tile: the earlier
 *            rows' extra pages only add ranges the row has no key in (empty states, which
 *            merge_one skips) and columns before its c0. No Quest on window layers (dense
 *            inside the window, as the reference).
 *   Cost, bench_attn --gemma --threads 1 --cpu-time (8 KV heads, head_dim 128, one decode
 *   row, loaded 2-core VM): soft-cap 50 / plain at 4k keys 0.99-1.03 (f16, q8_0, GQA 1 and
 *   4; the bench's small logits keep the tanh on its polynomial side, softmax.c; 1.01-1.08
 *   computing both sides); a window-1024 layer / a global one at 32k keys 0.017-0.028
 *   (bytes alone: 0.032; the window's 4 MiB stays in cache between repetitions).
 *
 * Dead slots (compacted sequences, pgd__attn_dead): after the K scores of a block, the
 * columns of a head's dead slots are set to -inf (the step's maximum ignores them) and
 * zeroed again after the step (the vector exp2 clamps -inf to 2^-125), so they weigh 0 in
 * V and in the scores; a row whose valid keys in a block are all dead treats the block as
 * one without valid keys (its state stays empty; merge_one skips empty states).
 *
 * Shared prefix (shared tiles; ChunkAttention / Hydragen / FlashInfer's cascade, bit-exact):
 * decode rows of sequences that share their first pages (forks, prefix-cache matches: one
 * system prompt for many requests) read each shared page once per step for all of them.
 *   plan     candidates are the decode rows (n_rows 1) of a global layer without a Quest
 *            selection, scores or dead slots; each may share its pages before its own page
 *            on staged pools (that one comes from its residual ring), else all of them.
 *            Sorted by first page id (insertion sort, arrays sized at create), a group of k
 *            >= 2 rows with one first page becomes ceil(k / tile_rows) tiles of nearly equal
 *            size (tile_rows * group <= 64 query vectors), each with n_shared: its leading
 *            page indices that hold the same page for every row. The rest plan as before.
 *   task     one per (shared tile, KV head): its list is page indices 0 .. the longest
 *            row's last page; split into ranges like any task (pieces, slots, merge_task).
 *   piece    (run_shared) for a page index below n_shared, one k_scores and one v_accum
 *            call serve all the tile's query vectors (nk: the most keys a row sees there);
 *            any other page is read by its own row alone (nk its own), from the pool or its
 *            ring. Page index i lies at column (i - block start) * pt of every row's S.
 *   bits     each row gets the bits of its own decode task: its queries are prepared per
 *            vector (prepare_q), a key's score does not depend on the call's other query
 *            vectors nor on nk (the invariance prefill tiles already rely on); blocks and
 *            ranges lie at the same page indices; the step sees the row's own valid count
 *            (nb only sets the zeroed tail), so its weights past it are 0 and the extra keys
 *            of a shared page's wider V call add exact zeros; the page-order V sums, the
 *            per-range states and their merge are the row's; ranges past a row's last page
 *            are empty states, which merge_one skips. test_attn_prefix checks the bits
 *            against each row alone, with sharing off, on 1 and 2 threads, split or not.
 *   counts   pgd__attn_stats: region-pair reads and the reads sharing saved.
 *   Cost, bench_attn --shared-prefix 1157 --tail 64 --batch 8 --gqa 4 (8 KV heads, a loaded
 *   2-core AVX-512 VM; own = the same run with shared tiles off; K/V read 5.5x less: f16
 *   head_dim 128 7.0 MB against 38.5 per step and layer), own / shared time:
 *     1 thread (--cpu-time)   f16 hd 128: 1.09-1.10 AVX-512, 1.05 AVX2; hd 64: 1.08, 1.04
 *                             q8_0 hd 128: 1.16-1.18 AVX-512, 1.08 AVX2; hd 64: 1.16, 1.07
 *     2 threads (--fastest)   f16 hd 128: 1.10, AVX2 0.98; hd 64: 1.07, AVX2 1.23
 *                             q8_0 hd 128: 1.20, AVX2 1.13; hd 64: 1.11, AVX2 1.03
 *   By GQA (head_dim 128, 1 thread, --cpu-time, batch 4 / 8 / 16): GQA 1 1.87 / 2.33 /
 *   2.26 (f16), 1.82 / 2.02 / 2.15 (q8_0); GQA 4 1.15 / 1.24 / 1.11, 1.16 / 1.18 / 1.20;
 *   GQA 8 1.02 / 1.08 / 1.11, 1.05 / 1.10 / 1.07.
 *   The time falls far less than the bytes: here a step's K/V stays in this machine's L3
 *   between rows, and the kernels' work is per (key, query vector) once a call has 4
 *   vectors (k_scores tiles 4 keys x at most 4 query vectors, so a shared call of 32
 *   vectors decodes a page's rows 8 times, as 8 rows of GQA 4 alone do): sharing saves the
 *   traffic, and the arithmetic only where a row alone has fewer than 4 query vectors
 *   (GQA 1, 2). A machine whose last-level cache does not hold a layer's K/V of a step
 *   (small cloud VMs) saves up to the bytes' ratio. Engine level (pagoda serve, 1B q8_0,
 *   f16 KV, head_dim 64, GQA 4, 8 requests x 1157 shared + 32 own tokens, 2 threads, this
 *   loaded VM): 11.7 / 11.6 output tok/s against 11.8 / 12.0 for main, within the noise;
 *   attention is a few % of that step (the q8_0 matrix products dominate).
 *
 * Figures: bench/bench_attn (decode GB/s against a read-bandwidth probe of the same bytes,
 * paged against contiguous page tables, prefill rows/s; --help lists the options).
 *
 * Invariants: run never allocates (plan arrays and per-thread scratch are sized at
 * create from max_rows, n_threads, the pool geometry, select_pages and score_keys); thread t
 * touches only scratch t and the slots and outputs of its own pieces (and of its task, when
 * it finishes it), and the scores of its scored tasks' (item, KV heads).
 */
#include <math.h>
#include <stdatomic.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "attn_int.h"
#include "util/cpu.h" /* ISA levels of the forced codec tables */

enum {
    TILE_Q = 64,           /* most query vectors (rows x group) per task */
    TILE_ROWS = 16,        /* most rows of one item per task */
    BLOCK_KEYS = 256,      /* keys per online-softmax block (rounded to whole pages) */
    RANGE_KEYS = 2048,     /* keys of a page range (whole pages, whole blocks; see above):
                              bench_attn --threads 1 --cpu-time, head_dim 128, 8 KV heads,
                              GQA 4, against the cost-split planner: 512 keys cost f16 6-8%
                              at 32k, 2048 within 1% (f16, q8_0, kivi2; 4k and 32k) */
    PIECES_PER_THREAD = 4, /* automatic split: aim at this many pieces of work per thread */
    ATTN_SCORE_WORK = 32,  /* a score's softmax, in multiply-adds (parallel_min_work): with
                              it, stories260K (8 heads, head_dim 8: 384 per key) goes
                              parallel from 342 keys; 2 threads / 1 measured 0.77x with
                              every row parallel up to 100 keys, 0.88x up to 300, 1.27x up
                              to 1,000 (bench/contention.sh, quiet) */
    SPARE_PIECES = 1024,   /* pieces beyond one per task (forced splits in tests) */
    SLOTS_PER_THREAD = 16, /* partial states of split tasks: slots per thread (min 64) */
    PREFETCH_BYTES = 4096, /* software prefetch of a region's first bytes: q8_0 / q4_0
                              regions (2.1 / 1.1 KiB at head_dim 128) whole; 1 KiB left
                              q8_0 decode at 32k 1.5x slower */
    SPREAD_ROWS = 4,       /* plain codecs: rows per kernel call between prefetch bursts */
    SPREAD_V_BYTES = 1024, /* spread mode: the block's first V region, its first bytes */
    WIDE_HEADS = 16,       /* most KV heads of one decode task */
    WIDE_MIN_KEYS = 8192,  /* ... of a decode row of at least this many keys (see above) */
    SCORE_CHUNK = 512,     /* keys summed at a time by add_scores (whole pages) */
    W_AHEAD = 64,          /* scored tiles: write prefetch of W this many keys ahead */
};

typedef struct iview {
    pgd__attn_view v;
    const pgd_attn_item *it;
    uint32_t *sel;             /* [n_kv_heads][select_pages] Quest selections (decode items) */
    int select;                /* a decode row with more pages than the budget */
    const pgd_attn_scores *sc; /* scores asked for (rows > 0), or NULL */
    uint32_t sc_row0;          /* first scored row: n_rows - sc->rows */
    uint32_t tile_end;         /* one past the view's last tile */
    uint32_t share;            /* shared tiles: the pages it may share (0: not a candidate) */
    int in_shared;             /* its row runs in a shared tile */
} iview;

typedef struct tile {
    uint32_t view, row0, n_rows;
    uint32_t n_shared; /* a shared tile: its leading pages common to all rows (> 0), else 0 */
    uint32_t sv0;      /* a shared tile: row t is the decode row of view srow[sv0 + t] */
} tile;

typedef struct task {
    uint32_t tile, kvh, nh, n_list, n_pieces; /* KV heads kvh .. kvh + nh - 1 */
    uint32_t p0;         /* no selection: the list is pages p0 .. p0 + n_list - 1 */
    uint32_t n_tiles;    /* scored items: tiles tile .. tile + n_tiles - 1, run in order */
    int scored;          /* adds scores (then whole: n_pieces 1) */
    const uint32_t *sel; /* page indices (then p0 = 0), or NULL: pages p0 .. */
    float *slots;        /* split tasks: n_pieces x [O nq*hd | m nq | l nq] */
} task;

typedef struct piece {
    uint32_t task, a, b, k; /* page list range [a, b), piece number k */
} piece;

struct pgd_attn {
    pgd__alloc al;
    pgd__attn_geom g;
    pgd_attn_params p;
    pgd__softmax_step_fn step;
    pgd__attn_axpy_fn axpy;
    pgd__attn_softcap_fn softcap;
    float cap;        /* the soft-cap in the scores' log2 domain (log2(e) * softcap); 0: none */
    uint64_t work;    /* the planned run's multiply-adds (plan; run_tasks' choice) */
    uint32_t *window; /* [n_layers] copy of params.layer_window, or NULL */
    uint32_t tile_rows, nq_max, ld_s, block_pages, range_pages, max_tasks, max_pieces;
    int prefetch;
    int shared;        /* shared tiles on (pgd__attn_set_shared) */
    uint32_t wide;     /* KV heads per decode task (1: one per task; see pgd__attn_set_wide) */
    uint32_t wide_min; /* ... for decode rows of at least this many pages */
    int spread;        /* f32 / f16 / bf16: spread prefetch of the next page (see spread_*) */
    size_t region_bytes;
    float q_scale;
    uint32_t ldw, mp_ld; /* scoring scratch: W row stride (keys), MP row stride (pages) */
    uint32_t ws_pages;   /* pages of keys summed at a time (add_scores) */

    /* the current run */
    uint32_t layer, n_views, n_tiles, n_tasks, n_pieces, n_select;
    uint32_t win;       /* the layer's window (keys a row sees), 0: a global layer */
    iview *views;       /* [max_rows] */
    uint32_t *sel_view; /* [max_rows] views that need a selection */
    uint32_t *sel;      /* [max_rows][n_kv_heads][select_pages] */
    tile *tiles;        /* [max_rows] */
    uint32_t *cand;     /* [max_rows] shared-tile candidates (views), sorted by first page */
    uint32_t *srow;     /* [max_rows] the views of the shared tiles' rows */
    atomic_ullong st_reads, st_saved; /* pgd__attn_stats */
    task *tasks;                      /* [max_tasks] */
    piece *pieces;                    /* [max_pieces] */
    atomic_uint *done;                /* [max_tasks] pieces finished, split tasks */
    float *slots;                     /* [slot_cap] */
    size_t slot_cap;

    /* per-thread scratch: Q O [nq_max][hd], m l [nq_max], S [nq_max][ld_s], heap, block;
     * with score_keys, W [nq_max][ldw], MP [nq_max][mp_ld], a page of sums [page_tokens] */
    unsigned char *scratch;
    size_t scratch_stride, off_o, off_m, off_l, off_s, off_hs, off_hp, off_blk, off_pq, off_oa,
        off_ma, off_la, off_w, off_mp, off_ws;
};

pgd_attn_params pgd_attn_default_params(void)
{
    pgd_attn_params p;
    memset(&p, 0, sizeof p);
    p.n_threads = 1;
    p.max_rows = 512;
    return p;
}

static size_t up64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

/* Scoring scratch on huge pages where the kernel allows it (a hint; failure is harmless):
 * a scored tile's S rows lie score_keys apart, so a block touches one 4 KiB page per query
 * vector (no gain measured on this machine's 1-thread bench, within its noise). */
static void advise_huge(void *p, size_t n)
{
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const uintptr_t huge = (uintptr_t)2 << 20;
    uintptr_t b = ((uintptr_t)p + huge - 1) & ~(huge - 1), e = ((uintptr_t)p + n) & ~(huge - 1);
    if (e > b) (void)madvise((void *)b, e - b, MADV_HUGEPAGE);
#else
    (void)p;
    (void)n;
#endif
}

void pgd_attn_destroy(pgd_attn *a)
{
    if (!a) return;
    pgd__free(&a->al, a->views);
    pgd__free(&a->al, a->sel_view);
    pgd__free(&a->al, a->sel);
    pgd__free(&a->al, a->tiles);
    pgd__free(&a->al, a->cand);
    pgd__free(&a->al, a->srow);
    pgd__free(&a->al, a->tasks);
    pgd__free(&a->al, a->pieces);
    pgd__free(&a->al, a->done);
    pgd__free(&a->al, a->slots);
    pgd__free(&a->al, a->scratch);
    pgd__free(&a->al, a->window);
    pgd__alloc al = a->al;
    pgd__free(&al, a);
}

int pgd_attn_create(pgd_cache *c, const pgd_attn_params *p, pgd_attn **out)
{
    pgd__alloc al;
    pgd_attn *a;
    int rc;
    *out = NULL;
    if (!c || !p) return PGD_EINVAL;
    pgd__alloc_init(&al, p->alloc);
    a = pgd__calloc(&al, 1, sizeof *a);
    if (!a) return PGD_ENOMEM;
    a->al = al;
    a->p = *p;
    if (!a->p.n_threads) a->p.n_threads = 1;
    if (!a->p.max_rows) a->p.max_rows = 512;
    rc = pgd__attn_geom_init(&a->g, c, p->n_head, p->select_pages, 0);
    if (rc != PGD_OK) goto fail;
    rc = PGD_EINVAL;
    if (a->p.n_threads > 4096 || a->p.max_rows > (1u << 20) || a->p.score_keys > (1u << 30) ||
        !pgd__attn_gemma_ok(p))
        goto fail;
    a->step = pgd__attn_softmax_step(pgd__attn_isa());
    a->axpy = pgd__attn_axpy(pgd__attn_isa());
    a->softcap = pgd__attn_softcap(pgd__attn_isa());
    if (!a->step || !a->axpy || !a->softcap) goto fail;
    a->cap = p->softcap > 0 ? (float)(1.4426950408889634 * p->softcap) : 0.0f;
    if (p->layer_window) {
        rc = PGD_ENOMEM;
        a->window = pgd__malloc(&al, (size_t)a->g.n_layers * sizeof *a->window);
        if (!a->window) goto fail;
        memcpy(a->window, p->layer_window, (size_t)a->g.n_layers * sizeof *a->window);
        rc = PGD_EINVAL;
    }
    a->p.layer_window = a->window;

    const uint32_t G = a->g.group, hd = a->g.head_dim, pt = a->g.page_tokens;
    const uint32_t R = a->p.max_rows, T = a->p.n_threads, B = a->p.select_pages;
    a->tile_rows = TILE_Q / G ? TILE_Q / G : 1;
    if (a->tile_rows > TILE_ROWS) a->tile_rows = TILE_ROWS;
    if (a->tile_rows > R) a->tile_rows = R;
    a->nq_max = a->tile_rows * G;
    /* Decode tasks cover up to WIDE_HEADS KV heads (all their query vectors at once). */
    a->wide = a->g.n_kv_heads < WIDE_HEADS ? a->g.n_kv_heads : WIDE_HEADS;
    if (a->wide * G > TILE_Q) a->wide = TILE_Q / G ? TILE_Q / G : 1;
    if (a->nq_max < a->wide * G) a->nq_max = a->wide * G;
    a->wide_min = WIDE_MIN_KEYS / pt ? WIDE_MIN_KEYS / pt : 1;
    a->block_pages = BLOCK_KEYS / pt ? BLOCK_KEYS / pt : 1;
    /* Page ranges: the forced split size, else RANGE_KEYS, a whole number of blocks. */
    a->range_pages = p->split_pages ? p->split_pages : (RANGE_KEYS / pt ? RANGE_KEYS / pt : 1);
    if (!p->split_pages && a->range_pages % a->block_pages)
        a->range_pages = (a->range_pages / a->block_pages + 1) * a->block_pages;
    a->ld_s = (a->block_pages * pt + 15) & ~15u;
    /* Scores in the log2 domain: log2(e) times the logit scale (0: 1 / sqrt(hd)). */
    a->q_scale = p->scale > 0 ? (float)(1.4426950408889634 * p->scale)
                              : (float)(1.4426950408889634 / sqrt((double)hd));
    a->region_bytes = (size_t)pgd_pool_region_bytes(a->g.pool);
    a->prefetch = 2;
    a->shared = 1;
    a->spread = a->g.type == PGD_KV_F32 || a->g.type == PGD_KV_F16 || a->g.type == PGD_KV_BF16;
    a->max_tasks = R * a->g.n_kv_heads;
    a->max_pieces = a->max_tasks + SPARE_PIECES + 2 * PIECES_PER_THREAD * T;
    uint32_t n_slots = SLOTS_PER_THREAD * T > 64 ? SLOTS_PER_THREAD * T : 64;
    a->slot_cap = (size_t)n_slots * a->nq_max * (hd + 2);

    /* Per-thread scratch. */
    const size_t vec = up64((size_t)a->nq_max * hd * sizeof(float));
    const size_t row = up64((size_t)a->nq_max * sizeof(float));
    a->off_o = vec;
    a->off_m = a->off_o + vec;
    a->off_l = a->off_m + row;
    a->off_s = a->off_l + row;
    a->off_hs = a->off_s + up64((size_t)a->nq_max * a->ld_s * sizeof(float));
    a->off_hp = a->off_hs + up64((size_t)(B ? B : 1) * sizeof(float));
    a->off_blk = a->off_hp + up64((size_t)(B ? B : 1) * sizeof(uint32_t));
    a->off_pq = a->off_blk + up64((size_t)a->block_pages * 3 * sizeof(uint32_t));
    a->off_oa =
        a->off_pq + (a->g.codec->prepare_q ? up64((size_t)a->nq_max * PGD__PREP_Q_HEAD_BYTES) : 0);
    a->off_ma = a->off_oa + vec;
    a->off_la = a->off_ma + row;
    /* Scoring: a scored tile's S is W (every key of its list, in list order), the weights
     * stay there for the scores; MP gets each page's running max. */
    /* W's rows start 1 KiB past a multiple of 4 KiB, as S's do: the rows of a block then
     * spread over the L1 sets instead of aliasing to the same ones (a 4 KiB-multiple stride
     * cost f16 decode 3% more at 32k, bench_attn --scores). */
    /* A window layer's scored tile lists the pages from its first row's window start to its
     * last row: up to W + rows - 1 keys over whole pages, 2 + rows / pt pages more than the
     * score_keys >= W that its rows may see. */
    const uint32_t sk = a->p.score_keys,
                   sp = (sk + pt - 1) / pt + (a->window ? 2 + (a->tile_rows + pt - 1) / pt : 0);
    a->ldw = (uint32_t)((((uint64_t)sp * pt + 1023) & ~(uint64_t)1023) + 256);
    a->mp_ld = sp;
    a->ws_pages = SCORE_CHUNK / pt ? SCORE_CHUNK / pt : 1;
    a->off_w = a->off_la + row;
    a->off_mp = a->off_w + (sk ? up64((size_t)a->nq_max * a->ldw * sizeof(float)) : 0);
    a->off_ws = a->off_mp + (sk ? up64((size_t)a->nq_max * a->mp_ld * sizeof(float)) : 0);
    a->scratch_stride = a->off_ws + (sk ? up64((size_t)a->ws_pages * pt * sizeof(float)) : 0);

    rc = PGD_ENOMEM;
    a->views = pgd__calloc(&al, R, sizeof *a->views);
    a->sel_view = pgd__calloc(&al, R, sizeof *a->sel_view);
    a->tiles = pgd__calloc(&al, R, sizeof *a->tiles);
    a->cand = pgd__calloc(&al, R, sizeof *a->cand);
    a->srow = pgd__calloc(&al, R, sizeof *a->srow);
    a->tasks = pgd__calloc(&al, a->max_tasks, sizeof *a->tasks);
    a->pieces = pgd__calloc(&al, a->max_pieces, sizeof *a->pieces);
    a->done = pgd__calloc(&al, a->max_tasks, sizeof *a->done);
    a->slots = pgd__calloc(&al, a->slot_cap, sizeof *a->slots);
    a->scratch = pgd__malloc(&al, a->scratch_stride * T + 64);
    if (a->scratch && a->p.score_keys) advise_huge(a->scratch, a->scratch_stride * T + 64);
    if (B) a->sel = pgd__calloc(&al, (size_t)R * a->g.n_kv_heads, (size_t)B * sizeof *a->sel);
    if (!a->views || !a->sel_view || !a->tiles || !a->cand || !a->srow || !a->tasks || !a->pieces ||
        !a->done || !a->slots || !a->scratch || (B && !a->sel))
        goto fail;
    for (uint32_t i = 0; i < R; i++)
        a->views[i].sel = B ? a->sel + (size_t)i * a->g.n_kv_heads * B : NULL;
    *out = a;
    return PGD_OK;
fail:
    pgd_attn_destroy(a);
    return rc;
}

int pgd__attn_force_isa(pgd_attn *a, int isa)
{
    pgd__softmax_step_fn f = pgd__attn_softmax_step(isa);
    if (!f) return PGD_EINVAL;
    a->step = f;
    a->axpy = pgd__attn_axpy(isa);
    a->softcap = pgd__attn_softcap(isa);
    /* The codec kernels of that level (AVX-512: the CPU's best, VNNI included), so that a
     * forced AVX2 level runs what an AVX2-only CPU runs. */
    const int level = isa == PGD__ATTN_SCALAR ? PGD__ISA_SCALAR
                      : isa == PGD__ATTN_AVX2 ? PGD__ISA_AVX2
                                              : pgd__cpu_isa();
    a->g.codec = pgd__codec_at(a->g.type, level);
    if (a->g.ring) a->g.ring = pgd__codec_at(PGD_KV_F16, level);
    return PGD_OK;
}

void pgd__attn_set_prefetch(pgd_attn *a, int on)
{
    a->prefetch = on;
}
void pgd__attn_set_wide(pgd_attn *a, uint32_t n)
{
    uint32_t mx = a->nq_max / a->g.group;
    if (mx > a->g.n_kv_heads) mx = a->g.n_kv_heads;
    a->wide = n == 0 ? mx : n > mx ? mx : n;
    a->wide_min =
        n == 0 ? (WIDE_MIN_KEYS / a->g.page_tokens ? WIDE_MIN_KEYS / a->g.page_tokens : 1) : 0;
}

void pgd__attn_set_shared(pgd_attn *a, int on)
{
    a->shared = on;
}

void pgd__attn_stats(const pgd_attn *a, uint64_t *page_reads, uint64_t *shared_saved)
{
    *page_reads = atomic_load_explicit(&a->st_reads, memory_order_relaxed);
    *shared_saved = atomic_load_explicit(&a->st_saved, memory_order_relaxed);
}

void pgd__attn_last_plan(const pgd_attn *a, uint32_t *n_pieces, uint32_t *n_split_pieces)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < a->n_pieces; i++)
        n += a->tasks[a->pieces[i].task].n_pieces > 1;
    *n_pieces = a->n_pieces;
    *n_split_pieces = n;
}

/* ---- per-thread scratch ---- */

/* Prefetches the first PREFETCH_BYTES of a region (the hardware prefetcher streams the
 * rest). Measured, f16, head_dim 128, one thread, ctx 32k (DRAM): 1 KiB 8.5 GB/s against
 * 7.3 without; the whole 4 KiB region 8.7 but 25% slower at ctx 4k (L3-resident), where
 * 1 KiB costs nothing. */
static void prefetch(const void *p, size_t n)
{
    const char *c = p;
    if (n > PREFETCH_BYTES) n = PREFETCH_BYTES;
    for (size_t o = 0; o < n; o += 64)
        __builtin_prefetch(c + o, 0, 3);
}

/* Plain codecs (f32, f16, bf16), decode: the kernel is called on SPREAD_ROWS rows at a time and,
 * before each call, the matching share of the NEXT page's region (K while scoring K, V while
 * accumulating V) is prefetched, so the prefetches run steadily about one region ahead of
 * the loads instead of in one burst. A row-chunked call costs these codecs nothing (no
 * per-call query preparation); block codecs keep whole-page calls and the burst prefetch.
 * Decode tiles only (see piece_task). Measured against the burst prefetch (one thread,
 * thread CPU clock, head_dim 128, 8 KV heads, batch 1, A/B interleaved in one process on a
 * loaded 2-core VM): f16 ctx 32k GQA 1 10.8 -> 13.0 GB/s, GQA 4 7.4 -> 10.2; bf16 9.6 ->
 * 11.4, 7.0 -> 9.3; L3-resident ctx 4k f16 GQA 1 23.2 -> 23.6, GQA 4 15.6 -> 15.3. Variants
 * that lost: the whole next region in one burst (-25% at 4k in one run, even in another);
 * the current page's V during K, 64 KiB before its use (-14% at 4k); 8 or 16 rows per call.
 * Codecs with k_scores_pf / v_accum_pf (f32, f16, bf16 at the SIMD levels) do the same in one
 * call per page: the 4-row groups' prefetch shares sit inside the kernel, and v_accum keeps
 * one head's 128 outputs in registers over the page instead of reloading them per group.
 * Bits unchanged (test_codec). Measured (one thread, thread CPU clock, best of 1000-3000
 * decode runs, 8 KV heads, head_dim 128, f16 GQA 1, loaded 2-core VM): AVX2 ctx 4k 18.6 ->
 * 21.7 GB/s, 1k 20.7 -> 24.6, GQA 4 at 4k 9.0 -> 10.7; AVX-512 4k 23.0 -> 24.0, 1k 24.0 ->
 * 27.0. */
static void spread_k(const pgd__attn_geom *g, const void *reg, uint32_t pt, uint32_t r0, uint32_t n,
                     const float *q, uint32_t nq, float scale, float *s, size_t ld,
                     const char *next, size_t region_bytes)
{
    if (g->codec->k_scores_pf) {
        g->codec->k_scores_pf(reg, pt, g->head_dim, r0, n, q, nq, scale, s, ld, next, region_bytes);
        return;
    }
    const size_t chunk = region_bytes * SPREAD_ROWS / pt;
    for (uint32_t j = 0; j < n; j += SPREAD_ROWS) {
        const uint32_t m = n - j < SPREAD_ROWS ? n - j : SPREAD_ROWS;
        for (size_t o = 0; next && o < chunk; o += 64)
            __builtin_prefetch(next + (size_t)j / SPREAD_ROWS * chunk + o, 0, 3);
        g->codec->k_scores(reg, pt, g->head_dim, r0 + j, m, q, nq, scale, s + j, ld);
    }
}

static void spread_v(const pgd__attn_geom *g, const void *reg, uint32_t pt, uint32_t r0, uint32_t n,
                     const float *w, size_t ld, uint32_t nq, float *o, const char *next,
                     size_t region_bytes)
{
    if (g->codec->v_accum_pf) {
        g->codec->v_accum_pf(reg, pt, g->head_dim, r0, n, w, ld, nq, o, next, region_bytes);
        return;
    }
    const size_t chunk = region_bytes * SPREAD_ROWS / pt;
    for (uint32_t j = 0; j < n; j += SPREAD_ROWS) {
        const uint32_t m = n - j < SPREAD_ROWS ? n - j : SPREAD_ROWS;
        for (size_t b = 0; next && b < chunk; b += 64)
            __builtin_prefetch(next + (size_t)j / SPREAD_ROWS * chunk + b, 0, 3);
        g->codec->v_accum(reg, pt, g->head_dim, r0 + j, m, w + j, ld, nq, o);
    }
}

static unsigned char *scratch_of(const pgd_attn *a, uint32_t thread)
{
    uintptr_t base = ((uintptr_t)a->scratch + 63) & ~(uintptr_t)63;
    return (unsigned char *)base + (size_t)thread * a->scratch_stride;
}

/* Copies the group's query heads of a tile's rows into q[rows * group][hd], rotated as the
 * stored keys are. */
static void load_queries(const pgd_attn *a, const pgd_attn_item *it, uint32_t row0, uint32_t n_rows,
                         uint32_t kvh, uint32_t nh, float *q)
{
    const pgd__attn_geom *g = &a->g;
    const uint32_t hd = g->head_dim, G = g->group * nh;
    for (uint32_t t = 0; t < n_rows; t++) {
        const float *src = it->q + ((size_t)(row0 + t) * g->n_head + (size_t)kvh * g->group) * hd;
        memcpy(q + (size_t)t * G * hd, src, (size_t)G * hd * sizeof *q);
    }
    for (uint32_t i = 0; g->rotate && i < n_rows * G; i++)
        pgd__hadamard(q + (size_t)i * hd, hd, g->rotate_seed, 0);
}

/* Writes o * inv_l (inverse-rotated when the pool is rotated) to query vector qi of a
 * task of nr rows from KV head kvh (vectors [head][row][group]: a task of several KV heads
 * has one row); o is scratch and is overwritten. */
static void store_out(const pgd_attn *a, const pgd_attn_item *it, uint32_t row0, uint32_t nr,
                      uint32_t kvh, uint32_t qi, float *o, float inv_l)
{
    const pgd__attn_geom *g = &a->g;
    const uint32_t hd = g->head_dim, G = g->group, t = qi / G % nr, h = qi % G;
    kvh += qi / G / nr;
    float *dst = it->out + ((size_t)(row0 + t) * g->n_head + (size_t)kvh * G + h) * hd;
    if (g->rotate) {
        for (uint32_t d = 0; d < hd; d++)
            o[d] *= inv_l;
        pgd__hadamard(o, hd, g->rotate_seed, 1);
        memcpy(dst, o, hd * sizeof *o);
    } else {
        for (uint32_t d = 0; d < hd; d++)
            dst[d] = o[d] * inv_l;
    }
}

/* ---- Quest selection pass ---- */

static void select_task(void *ud, uint32_t idx, uint32_t thread)
{
    pgd_attn *a = ud;
    PGD_CHECK(thread < a->p.n_threads);
    const uint32_t nkv = a->g.n_kv_heads, kvh = idx % nkv;
    iview *iv = &a->views[a->sel_view[idx / nkv]];
    unsigned char *sc = scratch_of(a, thread);
    float *q = (float *)sc;
    load_queries(a, iv->it, 0, 1, kvh, 1, q);
    pgd__attn_select(&a->g, &iv->v, a->layer, kvh, q, a->p.select_pages,
                     iv->sel + (size_t)kvh * a->p.select_pages, (uint32_t *)(sc + a->off_hp),
                     (float *)(sc + a->off_hs));
}

/* ---- the work-item kernel ---- */

/* K scores of one page: from the prepared query pq (the pool's codec's prepare_q) when
 * there is one and the page is the pool's, else from the float queries q. */
static void k_call(const pgd_attn *a, const pgd__codec *cd, const void *reg, uint32_t rpt,
                   uint32_t r0, uint32_t nk, const float *q, const void *pq, uint32_t nq, float *s,
                   size_t ld)
{
    if (pq && cd == a->g.codec)
        cd->k_scores_prep(reg, rpt, a->g.head_dim, r0, nk, pq, nq, a->q_scale, s, ld);
    else
        cd->k_scores(reg, rpt, a->g.head_dim, r0, nk, q, nq, a->q_scale, s, ld);
}

/* Merges the state (m, l, o) of one page range into the running state (*ma, *la, oa) of a
 * query vector, by log-sum-exp; a range without valid keys (l == 0) changes nothing, and
 * the first one is copied. The one merge both paths use (pieces of one task, page ranges
 * of one piece), in page order: noinline, so both get the very same arithmetic. */
static __attribute__((noinline)) void merge_one(uint32_t hd, float *oa, float *ma, float *la,
                                                const float *o, float m, float l)
{
    if (!(l > 0)) return;
    if (!(*la > 0)) {
        memcpy(oa, o, hd * sizeof *oa);
        *ma = m;
        *la = l;
        return;
    }
    const float mx = m > *ma ? m : *ma, wa = exp2f(*ma - mx), wb = exp2f(m - mx);
    for (uint32_t d = 0; d < hd; d++)
        oa[d] = oa[d] * wa + o[d] * wb;
    *la = *la * wa + l * wb;
    *ma = mx;
}

/* Writes query vector qi of task tk (tile tl, of view iv) as store_out does; a shared tile's
 * vectors are [row t][group h], row t being the decode row of view srow[sv0 + t]. */
static void task_out(const pgd_attn *a, const task *tk, const tile *tl, const iview *iv,
                     uint32_t qi, float *o, float inv_l)
{
    if (!tl->n_shared) {
        store_out(a, iv->it, tl->row0, tl->n_rows, tk->kvh, qi, o, inv_l);
        return;
    }
    const uint32_t G = a->g.group;
    store_out(a, a->views[a->srow[tl->sv0 + qi / G]].it, 0, 1, tk->kvh, qi % G, o, inv_l);
}

/* The last piece of a split task: merges the pieces' states (one page range each) in page
 * order, as piece_task merges the ranges of a whole task, so both give the same bits. */
static void merge_task(pgd_attn *a, const task *tk, const tile *tl, const iview *iv, float *o)
{
    const uint32_t hd = a->g.head_dim, nq = tl->n_rows * a->g.group * tk->nh;
    const size_t slot = (size_t)nq * (hd + 2);
    for (uint32_t qi = 0; qi < nq; qi++) {
        float mx = -INFINITY, l = 0;
        memset(o, 0, hd * sizeof *o);
        for (uint32_t k = 0; k < tk->n_pieces; k++) {
            const float *s = tk->slots + k * slot;
            merge_one(hd, o, &mx, &l, s + (size_t)qi * hd, s[(size_t)nq * hd + qi],
                      s[(size_t)nq * hd + nq + qi]);
        }
        task_out(a, tk, tl, iv, qi, o, 1.0f / l);
    }
}

/* The page list of a tile without a Quest selection: returns n and sets *p0, for pages
 * p0 .. p0 + n - 1, from the page of its first row's window start (a window layer; page 0
 * on a global one) to its last row's page. */
static uint32_t tile_pages(const pgd_attn *a, const iview *iv, const tile *tl, uint32_t *p0)
{
    const uint32_t pt = a->g.page_tokens;
    const uint64_t pos0 = iv->v.len - iv->it->n_rows + tl->row0, last = pos0 + tl->n_rows - 1;
    const uint64_t lo = a->win && pos0 + 1 > a->win ? pos0 + 1 - a->win : 0;
    *p0 = (uint32_t)(lo / pt);
    return (uint32_t)(last / pt + 1) - *p0;
}

/* Dead columns of a block for a KV head whose dead slots are [d0, d1): the block's pages
 * bpage[0..nbp) start at columns boff[], with bn[] keys each. Sets the dead columns below
 * lim to v in the n rows s[0], s[ld], ... and returns their number. */
static uint32_t dead_cols(uint32_t pt, const uint32_t *bpage, const uint32_t *boff,
                          const uint32_t *bn, uint32_t nbp, uint32_t d0, uint32_t d1, uint32_t lim,
                          float *s, size_t ld, uint32_t n, float v)
{
    uint32_t count = 0;
    for (uint32_t b = 0; b < nbp; b++) {
        const uint64_t start = (uint64_t)bpage[b] * pt;
        const uint64_t lo = start > d0 ? start : d0;
        const uint64_t hi = start + bn[b] < d1 ? start + bn[b] : d1;
        if (lo >= hi) continue;
        const uint32_t c0 = boff[b] + (uint32_t)(lo - start);
        const uint32_t c1 =
            boff[b] + (uint32_t)(hi - start) < lim ? boff[b] + (uint32_t)(hi - start) : lim;
        if (c0 >= c1) continue;
        count += c1 - c0;
        for (uint32_t r = 0; r < n; r++)
            for (uint32_t c = c0; c < c1; c++)
                s[(size_t)r * ld + c] = v;
    }
    return count;
}

/* Adds a scored tile's probabilities to its item's scores (its list: tk->sel, or pages
 * p0 .. p0 + n_list - 1): for KV head kvh + j, key slot k of list entry i, the sum over the tile's
 * scored rows t and the group's heads h (in that order) of W[qi][i * pt + r] * 2^(MP[qi][i] -
 * MA[qi]) / LA[qi]: W holds the weights 2^(s - m) of the block's step, m the running max after it
 * (MP), so the product is 2^(s - MA) / LA, the probability under the row's final state. The
 * per-page factors overwrite MP; one exp2f per distinct m (a block's pages share theirs). The sums
 * run a chunk of SCORE_CHUNK list keys at a time, in ws. */
static void add_scores(const pgd_attn *a, const task *tk, const tile *tl, const iview *iv,
                       uint32_t p0, uint32_t n_list, uint64_t last, unsigned char *sc)
{
    const pgd__attn_geom *g = &a->g;
    const uint32_t pt = g->page_tokens, G = g->group, nr = tl->n_rows, NH = tk->nh;
    const uint32_t t0 = iv->sc_row0 > tl->row0 ? iv->sc_row0 - tl->row0 : 0;
    const uint32_t chunk = a->ws_pages;
    const float *W = (const float *)(sc + a->off_w), *MA = (const float *)(sc + a->off_ma);
    const float *LA = (const float *)(sc + a->off_la);
    float *MP = (float *)(sc + a->off_mp), *ws = (float *)(sc + a->off_ws);
    for (uint32_t j = 0; j < NH; j++) {
        for (uint32_t t = t0; t < nr; t++)
            for (uint32_t h = 0; h < G; h++) {
                const uint32_t qi = (j * nr + t) * G + h;
                const float inv = LA[qi] > 0 ? 1.0f / LA[qi] : 0.0f;
                float *c = MP + (size_t)qi * a->mp_ld, pm = NAN, pc = 0;
                for (uint32_t i = 0; i < n_list; i++) {
                    if (!(c[i] == pm)) {
                        pm = c[i];
                        pc = pm == -INFINITY || !(inv > 0) ? 0.0f : exp2f(pm - MA[qi]) * inv;
                    }
                    c[i] = pc;
                }
            }
        float *dst = iv->sc->scores + (size_t)(tk->kvh + j) * iv->sc->ld;
        for (uint32_t i0 = 0; i0 < n_list; i0 += chunk) {
            const uint32_t i1 = n_list - i0 < chunk ? n_list : i0 + chunk;
            /* Keys of the chunk: whole pages but the list's last. */
            const uint64_t lstart = (uint64_t)(tk->sel ? tk->sel[i1 - 1] : p0 + i1 - 1) * pt;
            const uint32_t nlast = last + 1 - lstart < pt ? (uint32_t)(last + 1 - lstart) : pt;
            const uint32_t nk = (i1 - 1 - i0) * pt + nlast;
            memset(ws, 0, (size_t)nk * sizeof *ws);
            for (uint32_t t = t0; t < nr; t++)
                for (uint32_t h = 0; h < G; h++) {
                    const uint32_t qi = (j * nr + t) * G + h;
                    const float *c = MP + (size_t)qi * a->mp_ld;
                    const float *w = W + (size_t)qi * a->ldw + (size_t)i0 * pt;
                    /* Runs of pages of one factor (a block's, at least) in one call. */
                    for (uint32_t i = i0; i < i1;) {
                        uint32_t k = i + 1;
                        while (k < i1 && c[k] == c[i])
                            k++;
                        const uint32_t o = (i - i0) * pt, e = k < i1 ? (k - i0) * pt : nk;
                        if (c[i] != 0.0f) a->axpy(ws + o, w + o, c[i], e - o);
                        i = k;
                    }
                }
            if (!tk->sel) {
                float *d = dst + ((size_t)p0 + i0) * pt;
                for (uint32_t r = 0; r < nk; r++)
                    d[r] += ws[r];
                continue;
            }
            for (uint32_t i = i0; i < i1; i++) {
                const uint32_t o = (i - i0) * pt, n = i + 1 < i1 ? pt : nk - o;
                float *d = dst + (size_t)tk->sel[i] * pt;
                for (uint32_t r = 0; r < n; r++)
                    d[r] += ws[o + r];
            }
        }
    }
}

/* One piece: list entries [pa, pb) of task tk for its tile ti (a scored task runs each of
 * its tiles as one whole piece). Without a selection, entry i is page p0 + i (tile_pages). */
static void run_piece(pgd_attn *a, const task *tk, uint32_t ti, uint32_t pa, uint32_t pb,
                      uint32_t pk, uint32_t thread)
{
    const pgd__attn_geom *g = &a->g;
    const tile *tl = &a->tiles[ti];
    const iview *iv = &a->views[tl->view];
    const uint32_t hd = g->head_dim, pt = g->page_tokens, G = g->group, kvh = tk->kvh;
    const uint32_t nr = tl->n_rows, NH = tk->nh, gq = nr * G, nq = gq * NH;
    const uint64_t pos0 = iv->v.len - iv->it->n_rows + tl->row0, last = pos0 + nr - 1;
    /* A tile's rows lie in one page when there is a ring (plan): they read that page from
     * the ring, every other page from the pool. */
    const uint32_t rpage = pgd__attn_ring_page(g, &iv->v, pos0);
    PGD_CHECK(NH <= WIDE_HEADS);
    atomic_fetch_add_explicit(&a->st_reads, (uint64_t)(pb - pa) * NH, memory_order_relaxed);
    uint32_t p0 = 0;
    if (!tk->sel) (void)tile_pages(a, iv, tl, &p0);
    const uint32_t R = a->range_pages, BP = a->block_pages;

    unsigned char *sc = scratch_of(a, thread);
    float *Q = (float *)sc, *O = (float *)(sc + a->off_o), *M = (float *)(sc + a->off_m);
    float *L = (float *)(sc + a->off_l), *S = (float *)(sc + a->off_s);
    float *OA = (float *)(sc + a->off_oa), *MA = (float *)(sc + a->off_ma);
    float *LA = (float *)(sc + a->off_la);
    uint32_t *bpage = (uint32_t *)(sc + a->off_blk), *boff = bpage + a->block_pages;
    uint32_t *bn = boff + a->block_pages;
    /* A scored tile (one with rows of the item's last sc->rows) keeps every weight: its S is
     * W, one column per key of its list (block by block), and MP the running maxima. */
    const int scored = tk->scored && tl->row0 + nr > iv->sc_row0;
    float *W = scored ? (float *)(sc + a->off_w) : NULL;
    float *MP = scored ? (float *)(sc + a->off_mp) : NULL;
    const size_t ld = scored ? a->ldw : a->ld_s;
    /* Dead slots of compacted sequences: per head j, [dd0[j], dd1[j]) when masked[j]. */
    uint32_t dd0[WIDE_HEADS], dd1[WIDE_HEADS];
    int masked[WIDE_HEADS], any_masked = 0;
    for (uint32_t j = 0; j < NH; j++) {
        masked[j] = pgd__attn_dead(g, &iv->v, a->layer, kvh + j, &dd0[j], &dd1[j]);
        any_masked |= masked[j];
    }

    /* Spread prefetch for decode tiles only: prefill tiles are compute-bound, and 4-row
     * calls reload their up to 64 output vectors 4x as often (prefill 10-17% slower). */
    const int spread = a->prefetch >= 2 && a->spread && nr == 1;
    /* Query vectors [head j][row t][group h] (a task of several heads has one row), so
     * head j's are the gq vectors from j * gq. */
    load_queries(a, iv->it, tl->row0, nr, kvh, NH, Q);
    /* Block codecs: the query quantized once per piece, not once per page. */
    const unsigned char *PQ = NULL;
    if (g->codec->prepare_q && g->codec->prepare_q(hd, Q, nq, sc + a->off_pq)) PQ = sc + a->off_pq;
    for (uint32_t qi = 0; qi < nq; qi++) {
        MA[qi] = -INFINITY;
        LA[qi] = 0;
    }

    /* Page ranges of range_pages list entries, each from a fresh online-softmax state,
     * merged into (MA, LA, OA) in page order: where a task is cut into pieces (at range
     * boundaries) and how many threads run it never changes the result. Ranges and the
     * blocks in them lie at fixed pages (multiples of R from page 0, blocks of BP pages from
     * a range's start; list entries under Quest), whatever page the list starts at: a window
     * row gets the same blocks, and so the same bits, as a decode row as in any prefill tile
     * (where the earlier rows' pages only add ranges and columns that it does not see). */
    for (uint32_t i = pa; i < pb;) {
        const uint32_t rs = (p0 + i) / R * R; /* the range's first page (or entry) */
        const uint32_t rend = rs + R - p0 < pb ? rs + R - p0 : pb;
        memset(O, 0, (size_t)nq * hd * sizeof *O);
        for (uint32_t qi = 0; qi < nq; qi++) {
            M[qi] = -INFINITY;
            L[qi] = 0;
        }
        while (i < rend) {
            /* A block of whole pages: K scores of every query vector into S. Pages outer, heads
             * inner: the K regions of one page's heads are adjacent in the pool. A scored
             * tile's block lies at its first entry's column of W (all pages but the list's
             * last are full). */
            float *SB = scored ? W + (size_t)i * pt : S;
            const uint32_t i0 = i;
            const uint32_t bend0 = rs + ((p0 + i - rs) / BP + 1) * BP - p0;
            const uint32_t bend = bend0 < rend ? bend0 : rend;
            uint32_t nbp = 0, nb = 0;
            while (i < bend) {
                const uint32_t pi = tk->sel ? tk->sel[i] : p0 + i;
                const uint64_t start = (uint64_t)pi * pt;
                const uint32_t nk = last + 1 - start < pt ? (uint32_t)(last + 1 - start) : pt;
                const int pool_src = pi != rpage;
                int next_pool = 0;
                uint32_t nx = 0;
                if (i + 1 < pb) {
                    nx = tk->sel ? tk->sel[i + 1] : p0 + i + 1;
                    next_pool = nx != rpage;
                }
                for (uint32_t j = 0; j < NH; j++) {
                    const pgd__codec *cd;
                    uint32_t rpt, r0;
                    const void *reg = pgd__attn_src(g, &iv->v, pi, rpage, a->layer, PGD__K, kvh + j,
                                                    &cd, &rpt, &r0);
                    const float *qj = Q + (size_t)j * gq * hd;
                    float *sj = SB + (size_t)j * gq * ld + nb;
                    const void *pqj = PQ ? PQ + (size_t)j * gq * PGD__PREP_Q_HEAD_BYTES : NULL;
                    /* Scored: W's lines W_AHEAD keys on, for writing (their misses, not
                     * their bytes, are what W costs: at 32k f16 GQA 4, scored / plain 1.11
                     * without, 1.07-1.08 with 16-64 keys ahead, bench_attn --scores). */
                    for (uint32_t q = 0; scored && q < gq; q++)
                        for (uint32_t c = 0; c < nk; c += 16)
                            __builtin_prefetch(sj + (size_t)q * ld + W_AHEAD + c, 1, 3);
                    if (spread && pool_src) {
                        /* The next page's K, spread over this page's calls; the first V page of
                         * the block now (its regions follow at V time, spread the same way). */
                        const char *next =
                            next_pool ? pgd_pool_k(g->pool, iv->v.pages[nx], a->layer, kvh + j)
                                      : NULL;
                        if (nbp == 0)
                            prefetch(pgd_pool_v(g->pool, iv->v.pages[pi], a->layer, kvh + j),
                                     SPREAD_V_BYTES);
                        spread_k(g, reg, rpt, r0, nk, qj, gq, a->q_scale, sj, ld, next,
                                 a->region_bytes);
                    } else if (a->prefetch) {
                        /* The next page's K and this page's V: page regions are scattered 4
                         * KiB-ish chunks that the hardware prefetcher does not run ahead into. */
                        if (next_pool)
                            prefetch(pgd_pool_k(g->pool, iv->v.pages[nx], a->layer, kvh + j),
                                     a->region_bytes);
                        if (pool_src)
                            prefetch(pgd_pool_v(g->pool, iv->v.pages[pi], a->layer, kvh + j),
                                     a->region_bytes);
                        k_call(a, cd, reg, rpt, r0, nk, qj, pqj, gq, sj, ld);
                    } else {
                        k_call(a, cd, reg, rpt, r0, nk, qj, pqj, gq, sj, ld);
                    }
                }
                bpage[nbp] = pi;
                boff[nbp] = nb;
                bn[nbp++] = nk;
                nb += nk;
                i++;
            }
            /* Gemma2's soft-cap, on every score of the block before any is masked (tanh would
             * make -inf finite). */
            for (uint32_t qi = 0; a->cap > 0 && qi < nq; qi++)
                a->softcap(SB + (size_t)qi * ld, nb, a->cap);
            /* Dead slots score -inf: the step's maximum ignores them. */
            for (uint32_t j = 0; any_masked && j < NH; j++)
                if (masked[j])
                    dead_cols(pt, bpage, boff, bn, nbp, dd0[j], dd1[j], nb,
                              SB + (size_t)j * gq * ld, ld, gq, -INFINITY);
            /* Online softmax, row by row: a row's valid keys are the columns [c0, nv) of the
             * block (causal end nv; a window row's start c0, its keys being contiguous), which
             * the step gets alone, so that they give the same bits whatever precedes them in
             * the block; the columns before c0 weigh 0. */
            for (uint32_t t = 0; t < nr; t++) {
                const uint64_t pos = pos0 + t;
                uint32_t nv = 0, c0 = 0;
                for (uint32_t b = 0; b < nbp; b++) {
                    const uint64_t start = (uint64_t)bpage[b] * pt;
                    if (pos >= start)
                        nv += pos + 1 - start < bn[b] ? (uint32_t)(pos + 1 - start) : bn[b];
                }
                if (a->win && pos + 1 > a->win) {
                    const uint64_t lo = pos + 1 - a->win, bs = (uint64_t)bpage[0] * pt;
                    c0 = lo <= bs ? 0 : lo - bs < nv ? (uint32_t)(lo - bs) : nv;
                }
                for (uint32_t j = 0; j < NH; j++) {
                    /* A row whose valid keys of the block are all dead has none. */
                    const uint32_t nd = masked[j] ? dead_cols(pt, bpage, boff, bn, nbp, dd0[j],
                                                              dd1[j], nv, NULL, 0, 0, 0.0f) -
                                                        dead_cols(pt, bpage, boff, bn, nbp, dd0[j],
                                                                  dd1[j], c0, NULL, 0, 0, 0.0f)
                                                  : 0;
                    for (uint32_t h = 0; h < G; h++) {
                        const uint32_t qi = (j * nr + t) * G + h;
                        float *s = SB + (size_t)qi * ld, sum;
                        if (nv - c0 == nd) {
                            memset(s, 0, nb * sizeof *s);
                            continue;
                        }
                        const float alpha = a->step(s + c0, nv - c0, nb - c0, &M[qi], &sum);
                        if (c0) memset(s, 0, c0 * sizeof *s);
                        /* The vector steps give -inf 2^-125 (their clamp): dead weighs 0. */
                        if (nd)
                            dead_cols(pt, bpage, boff, bn, nbp, dd0[j], dd1[j], nv, s, 0, 1, 0.0f);
                        L[qi] = L[qi] * alpha + sum;
                        if (alpha != 1.0f) {
                            float *o = O + (size_t)qi * hd;
                            for (uint32_t d = 0; d < hd; d++)
                                o[d] *= alpha;
                        }
                    }
                }
            }
            /* Scored tiles: each page's running max after its block's step. */
            for (uint32_t qi = 0; scored && qi < nq; qi++)
                for (uint32_t b = 0; b < nbp; b++)
                    MP[(size_t)qi * a->mp_ld + i0 + b] = M[qi];
            /* V: every row of the block serves every query vector of its head. */
            for (uint32_t b = 0; b < nbp; b++) {
                const int next_pool = b + 1 < nbp && bpage[b + 1] != rpage;
                for (uint32_t j = 0; j < NH; j++) {
                    const pgd__codec *cd;
                    uint32_t rpt, r0;
                    const void *reg = pgd__attn_src(g, &iv->v, bpage[b], rpage, a->layer, PGD__V,
                                                    kvh + j, &cd, &rpt, &r0);
                    const float *wj = SB + (size_t)j * gq * ld + boff[b];
                    float *oj = O + (size_t)j * gq * hd;
                    if (spread && cd == g->codec) {
                        const char *next =
                            next_pool
                                ? pgd_pool_v(g->pool, iv->v.pages[bpage[b + 1]], a->layer, kvh + j)
                                : NULL;
                        spread_v(g, reg, rpt, r0, bn[b], wj, ld, gq, oj, next, a->region_bytes);
                    } else {
                        cd->v_accum(reg, rpt, hd, r0, bn[b], wj, ld, gq, oj);
                    }
                }
            }
        }
        for (uint32_t qi = 0; qi < nq; qi++)
            merge_one(hd, OA + (size_t)qi * hd, &MA[qi], &LA[qi], O + (size_t)qi * hd, M[qi],
                      L[qi]);
    }

    if (tk->n_pieces == 1) {
        for (uint32_t qi = 0; qi < nq; qi++)
            store_out(a, iv->it, tl->row0, nr, kvh, qi, OA + (size_t)qi * hd, 1.0f / LA[qi]);
        if (scored) add_scores(a, tk, tl, iv, p0, pb, last, sc);
        return;
    }
    float *slot = tk->slots + (size_t)pk * nq * (hd + 2);
    memcpy(slot, OA, (size_t)nq * hd * sizeof *OA);
    memcpy(slot + (size_t)nq * hd, MA, nq * sizeof *MA);
    memcpy(slot + (size_t)nq * hd + nq, LA, nq * sizeof *LA);
    /* The last piece to finish merges: acq_rel orders every piece's slot writes before
     * its increment, and the merging thread's reads after. */
    unsigned prev = atomic_fetch_add_explicit(&a->done[tk - a->tasks], 1, memory_order_acq_rel);
    if (prev + 1 == tk->n_pieces) merge_task(a, tk, tl, iv, O);
}

/* One piece of a shared tile's task (one KV head; see "Shared prefix" above): list entries
 * [pa, pb) are page indices (a global layer's list starts at page 0), up to the longest row's
 * last page. A page index below the tile's n_shared holds the same page for every row: one
 * k_scores and one v_accum call serve all the tile's query vectors. Every other page is read
 * by its own row alone, from the pool or (its own page) from its residual ring. Blocks and
 * ranges are those of the row alone (fixed by page index), the columns of page index i lie at
 * (i - block start) * pt for every row, and each row's step gets its own valid count, so each
 * row computes the bits of its own decode task. */
static void run_shared(pgd_attn *a, const task *tk, uint32_t pa, uint32_t pb, uint32_t pk,
                       uint32_t thread)
{
    const pgd__attn_geom *g = &a->g;
    const tile *tl = &a->tiles[tk->tile];
    const uint32_t hd = g->head_dim, pt = g->page_tokens, G = g->group, kvh = tk->kvh;
    const uint32_t nr = tl->n_rows, nq = nr * G, P = tl->n_shared;
    const uint32_t R = a->range_pages, BP = a->block_pages;
    const iview *vw[TILE_ROWS];
    uint64_t last[TILE_ROWS];
    uint32_t rpage[TILE_ROWS], npg[TILE_ROWS];
    PGD_CHECK(nr <= TILE_ROWS && nq <= a->nq_max && tk->nh == 1);

    unsigned char *sc = scratch_of(a, thread);
    float *Q = (float *)sc, *O = (float *)(sc + a->off_o), *M = (float *)(sc + a->off_m);
    float *L = (float *)(sc + a->off_l), *S = (float *)(sc + a->off_s);
    float *OA = (float *)(sc + a->off_oa), *MA = (float *)(sc + a->off_ma);
    float *LA = (float *)(sc + a->off_la);
    const size_t ld = a->ld_s;
    for (uint32_t t = 0; t < nr; t++) {
        vw[t] = &a->views[a->srow[tl->sv0 + t]];
        last[t] = vw[t]->v.len - 1;
        rpage[t] = pgd__attn_ring_page(g, &vw[t]->v, last[t]);
        npg[t] = vw[t]->v.n_pages;
        load_queries(a, vw[t]->it, 0, 1, kvh, 1, Q + (size_t)t * G * hd);
    }
    const unsigned char *PQ = NULL;
    if (g->codec->prepare_q && g->codec->prepare_q(hd, Q, nq, sc + a->off_pq)) PQ = sc + a->off_pq;
    for (uint32_t qi = 0; qi < nq; qi++) {
        MA[qi] = -INFINITY;
        LA[qi] = 0;
    }
    uint64_t reads = 0, saved = 0;
    for (uint32_t i = pa; i < pb;) {
        const uint32_t rs = i / R * R, rend = rs + R < pb ? rs + R : pb;
        memset(O, 0, (size_t)nq * hd * sizeof *O);
        for (uint32_t qi = 0; qi < nq; qi++) {
            M[qi] = -INFINITY;
            L[qi] = 0;
        }
        while (i < rend) {
            const uint32_t i0 = i, bend0 = rs + ((i - rs) / BP + 1) * BP;
            const uint32_t bend = bend0 < rend ? bend0 : rend;
            /* K: page index i at column (i - i0) * pt of every row. */
            for (; i < bend; i++) {
                const uint64_t start = (uint64_t)i * pt;
                const uint32_t col = (i - i0) * pt;
                if (i < P) {
                    uint32_t nk = 0;
                    for (uint32_t t = 0; t < nr; t++) {
                        const uint32_t n =
                            last[t] + 1 - start < pt ? (uint32_t)(last[t] + 1 - start) : pt;
                        nk = n > nk ? n : nk;
                    }
                    const uint32_t pg = vw[0]->v.pages[i];
                    if (a->prefetch) {
                        if (i + 1 < P)
                            prefetch(pgd_pool_k(g->pool, vw[0]->v.pages[i + 1], a->layer, kvh),
                                     a->region_bytes);
                        prefetch(pgd_pool_v(g->pool, pg, a->layer, kvh), a->region_bytes);
                    }
                    k_call(a, g->codec, pgd_pool_k(g->pool, pg, a->layer, kvh), pt, 0, nk, Q, PQ,
                           nq, S + col, ld);
                    reads++;
                    saved += nr - 1;
                    continue;
                }
                for (uint32_t t = 0; t < nr; t++) {
                    if (i >= npg[t]) continue;
                    const uint32_t nk =
                        last[t] + 1 - start < pt ? (uint32_t)(last[t] + 1 - start) : pt;
                    const pgd__codec *cd;
                    uint32_t rpt, r0;
                    const void *reg = pgd__attn_src(g, &vw[t]->v, i, rpage[t], a->layer, PGD__K,
                                                    kvh, &cd, &rpt, &r0);
                    if (a->prefetch && i != rpage[t]) {
                        if (i + 1 < npg[t] && i + 1 != rpage[t])
                            prefetch(pgd_pool_k(g->pool, vw[t]->v.pages[i + 1], a->layer, kvh),
                                     a->region_bytes);
                        prefetch(pgd_pool_v(g->pool, vw[t]->v.pages[i], a->layer, kvh),
                                 a->region_bytes);
                    }
                    k_call(a, cd, reg, rpt, r0, nk, Q + (size_t)t * G * hd,
                           PQ ? PQ + (size_t)t * G * PGD__PREP_Q_HEAD_BYTES : NULL, G,
                           S + (size_t)t * G * ld + col, ld);
                    reads++;
                }
            }
            /* Each row's valid keys are the columns [0, nv) (its pages before its last are
             * full); nb, the block's widest row, is what the step zeroes up to. */
            const uint64_t b0 = (uint64_t)i0 * pt, b1 = (uint64_t)bend * pt;
            uint32_t nvr[TILE_ROWS], nb = 0;
            for (uint32_t t = 0; t < nr; t++) {
                const uint64_t e = last[t] + 1 < b1 ? last[t] + 1 : b1;
                nvr[t] = e > b0 ? (uint32_t)(e - b0) : 0;
                nb = nvr[t] > nb ? nvr[t] : nb;
            }
            for (uint32_t t = 0; t < nr; t++)
                for (uint32_t h = 0; h < G; h++) {
                    const uint32_t qi = t * G + h, nv = nvr[t];
                    float *s = S + (size_t)qi * ld, sum;
                    if (!nv) {
                        memset(s, 0, nb * sizeof *s);
                        continue;
                    }
                    if (a->cap > 0) a->softcap(s, nv, a->cap);
                    const float alpha = a->step(s, nv, nb, &M[qi], &sum);
                    L[qi] = L[qi] * alpha + sum;
                    if (alpha != 1.0f) {
                        float *o = O + (size_t)qi * hd;
                        for (uint32_t d = 0; d < hd; d++)
                            o[d] *= alpha;
                    }
                }
            /* V, page by page in the same order: shared pages once for all rows. */
            for (uint32_t j = i0; j < bend; j++) {
                const uint64_t start = (uint64_t)j * pt;
                const uint32_t col = (j - i0) * pt;
                if (j < P) {
                    uint32_t nk = 0;
                    for (uint32_t t = 0; t < nr; t++) {
                        const uint32_t n =
                            last[t] + 1 - start < pt ? (uint32_t)(last[t] + 1 - start) : pt;
                        nk = n > nk ? n : nk;
                    }
                    g->codec->v_accum(pgd_pool_v(g->pool, vw[0]->v.pages[j], a->layer, kvh), pt, hd,
                                      0, nk, S + col, ld, nq, O);
                    continue;
                }
                for (uint32_t t = 0; t < nr; t++) {
                    if (j >= npg[t]) continue;
                    const uint32_t nk =
                        last[t] + 1 - start < pt ? (uint32_t)(last[t] + 1 - start) : pt;
                    const pgd__codec *cd;
                    uint32_t rpt, r0;
                    const void *reg = pgd__attn_src(g, &vw[t]->v, j, rpage[t], a->layer, PGD__V,
                                                    kvh, &cd, &rpt, &r0);
                    cd->v_accum(reg, rpt, hd, r0, nk, S + (size_t)t * G * ld + col, ld, G,
                                O + (size_t)t * G * hd);
                }
            }
        }
        for (uint32_t qi = 0; qi < nq; qi++)
            merge_one(hd, OA + (size_t)qi * hd, &MA[qi], &LA[qi], O + (size_t)qi * hd, M[qi],
                      L[qi]);
    }
    atomic_fetch_add_explicit(&a->st_reads, reads, memory_order_relaxed);
    atomic_fetch_add_explicit(&a->st_saved, saved, memory_order_relaxed);

    if (tk->n_pieces == 1) {
        for (uint32_t qi = 0; qi < nq; qi++)
            task_out(a, tk, tl, vw[0], qi, OA + (size_t)qi * hd, 1.0f / LA[qi]);
        return;
    }
    float *slot = tk->slots + (size_t)pk * nq * (hd + 2);
    memcpy(slot, OA, (size_t)nq * hd * sizeof *OA);
    memcpy(slot + (size_t)nq * hd, MA, nq * sizeof *MA);
    memcpy(slot + (size_t)nq * hd + nq, LA, nq * sizeof *LA);
    unsigned prev = atomic_fetch_add_explicit(&a->done[tk - a->tasks], 1, memory_order_acq_rel);
    if (prev + 1 == tk->n_pieces) merge_task(a, tk, tl, vw[0], O);
}

static void piece_task(void *ud, uint32_t idx, uint32_t thread)
{
    pgd_attn *a = ud;
    PGD_CHECK(thread < a->p.n_threads);
    const piece *pc = &a->pieces[idx];
    const task *tk = &a->tasks[pc->task];
    if (a->tiles[tk->tile].n_shared) {
        run_shared(a, tk, pc->a, pc->b, pc->k, thread);
        return;
    }
    if (tk->n_tiles == 1) {
        run_piece(a, tk, tk->tile, pc->a, pc->b, pc->k, thread);
        return;
    }
    /* The tiles of a scored item, one whole piece each, in order: each adds to the same
     * scores, so one task runs them (deterministic sums, no race). */
    for (uint32_t k = 0; k < tk->n_tiles; k++) {
        uint32_t p0;
        const tile *tl = &a->tiles[tk->tile + k];
        run_piece(a, tk, tk->tile + k, 0, tile_pages(a, &a->views[tl->view], tl, &p0), 0, thread);
    }
}

/* ---- planning ---- */

/* Runs tasks 0 .. n-1 of fn: on the caller's parallel fn when there are several and their
 * work (multiply-adds, see parallel_min_work) is worth waking other threads, else here. */
static void run_tasks(pgd_attn *a, pgd_task_fn fn, uint32_t n, uint64_t work)
{
    if (!n) return;
    const uint64_t min_work =
        a->p.parallel_min_work ? a->p.parallel_min_work : PGD_ATTN_PARALLEL_MIN_WORK;
    if (a->p.parallel && n > 1 && work >= min_work) {
        a->p.parallel(a->p.parallel_ud, fn, a, n);
        return;
    }
    for (uint32_t i = 0; i < n; i++)
        fn(a, i, 0);
}

/* The first page id of a candidate view (the shared tiles' sort key). */
static uint32_t first_page(const pgd_attn *a, uint32_t vi)
{
    return a->views[vi].v.pages[0];
}

/* Shared tiles (see "Shared prefix" above): the decode rows of a global layer without a
 * selection, scores or dead slots whose first page is another such row's first page, up to
 * tile_rows rows per tile, written to tiles[0 ..) (returns their number). Candidates are
 * sorted by (first page, view) by insertion sort: a step's decode rows are few, and a
 * sorted run costs n compares. Allocation-free: cand and srow are sized at create. */
static uint32_t plan_shared(pgd_attn *a)
{
    const pgd__attn_geom *g = &a->g;
    uint32_t nc = 0, n_tiles = 0, n_srow = 0;
    for (uint32_t vi = 0; vi < a->n_views; vi++) {
        iview *iv = &a->views[vi];
        iv->in_shared = 0;
        iv->share = 0;
        if (!a->shared || a->win || iv->it->n_rows != 1 || iv->select || iv->sc || iv->v.n_live)
            continue;
        /* A row's own page comes from its residual ring on staged pools: never shared. */
        const uint32_t rp = pgd__attn_ring_page(g, &iv->v, iv->v.len - 1);
        iv->share = rp != PGD__NO_PAGE && rp < iv->v.n_pages ? rp : iv->v.n_pages;
        if (!iv->share) continue;
        uint32_t k = nc++;
        for (; k > 0; k--) {
            const uint32_t o = a->cand[k - 1];
            if (first_page(a, o) < first_page(a, vi) ||
                (first_page(a, o) == first_page(a, vi) && o < vi))
                break;
            a->cand[k] = o;
        }
        a->cand[k] = vi;
    }
    for (uint32_t c0 = 0; c0 < nc;) {
        uint32_t c1 = c0 + 1;
        while (c1 < nc && first_page(a, a->cand[c1]) == first_page(a, a->cand[c0]))
            c1++;
        /* A group of k sharers: ceil(k / tile_rows) tiles of nearly equal size. */
        const uint32_t k = c1 - c0, nt = (k + a->tile_rows - 1) / a->tile_rows;
        for (uint32_t j = 0; k >= 2 && j < nt; j++) {
            const uint32_t b0 = c0 + (uint32_t)((uint64_t)k * j / nt);
            const uint32_t b1 = c0 + (uint32_t)((uint64_t)k * (j + 1) / nt);
            if (b1 - b0 < 2) continue;
            /* The leading page indices where every row has the same page. */
            const iview *v0 = &a->views[a->cand[b0]];
            uint32_t P = v0->share;
            for (uint32_t r = b0 + 1; r < b1; r++) {
                const iview *vr = &a->views[a->cand[r]];
                if (vr->share < P) P = vr->share;
                uint32_t i = 1;
                while (i < P && vr->v.pages[i] == v0->v.pages[i])
                    i++;
                P = i;
            }
            tile *tl = &a->tiles[n_tiles++];
            tl->view = a->cand[b0];
            tl->row0 = 0;
            tl->n_rows = b1 - b0;
            tl->n_shared = P;
            tl->sv0 = n_srow;
            for (uint32_t r = b0; r < b1; r++) {
                a->srow[n_srow++] = a->cand[r];
                a->views[a->cand[r]].in_shared = 1;
            }
        }
        c0 = c1;
    }
    return n_tiles;
}

/* Builds tiles, tasks and the piece queue for the views of this run. */
static void plan(pgd_attn *a)
{
    const pgd__attn_geom *g = &a->g;
    const uint32_t pt = g->page_tokens, nkv = g->n_kv_heads, B = a->p.select_pages;
    const uint32_t hd = g->head_dim;
    uint64_t total = 0;

    a->n_tiles = plan_shared(a);
    for (uint32_t vi = 0; vi < a->n_views; vi++) {
        iview *iv = &a->views[vi];
        const uint32_t rows = iv->it->n_rows;
        if (iv->in_shared) continue;
        for (uint32_t r0 = 0; r0 < rows;) {
            tile *tl = &a->tiles[a->n_tiles++];
            tl->view = vi;
            tl->row0 = r0;
            tl->n_rows = rows - r0 < a->tile_rows ? rows - r0 : a->tile_rows;
            if (iv->v.ring) {
                /* The rows of a tile share their page (the one they read from the ring). */
                const uint64_t pos = iv->v.len - rows + r0;
                const uint32_t left = pt - (uint32_t)(pos % pt);
                if (tl->n_rows > left) tl->n_rows = left;
            }
            tl->n_shared = 0;
            r0 += tl->n_rows;
        }
        iv->tile_end = a->n_tiles;
    }
    a->n_tasks = 0;
    for (uint32_t ti = 0; ti < a->n_tiles; ti++) {
        const tile *tl = &a->tiles[ti];
        const iview *iv = &a->views[tl->view];
        if (tl->n_shared) {
            /* A shared tile: one task per KV head over page indices 0 .. the longest row's
             * last page. */
            uint32_t np = 0;
            for (uint32_t t = 0; t < tl->n_rows; t++) {
                const uint32_t n = a->views[a->srow[tl->sv0 + t]].v.n_pages;
                np = n > np ? n : np;
            }
            for (uint32_t kvh = 0; kvh < nkv; kvh++) {
                task *tk = &a->tasks[a->n_tasks++];
                memset(tk, 0, sizeof *tk);
                tk->tile = ti;
                tk->kvh = kvh;
                tk->nh = 1;
                tk->n_pieces = 1;
                tk->n_tiles = 1;
                tk->n_list = np;
                total += (uint64_t)np * tl->n_rows;
            }
            continue;
        }
        uint32_t p0;
        const uint32_t np = tile_pages(a, iv, tl, &p0);
        /* A scored item's scored tiles: one task per KV head runs them all, in order. */
        const int scored = iv->sc && tl->row0 + tl->n_rows > iv->sc_row0;
        const uint32_t n_chain = scored ? iv->tile_end - ti : 1;
        /* A decode row without a Quest selection: tasks of a->wide KV heads (scored ones on
         * several threads: one head per task, since they are never split). */
        uint32_t wide = tl->n_rows == 1 && !iv->select && np >= a->wide_min ? a->wide : 1;
        if (scored && a->p.n_threads > 1) wide = 1;
        uint64_t cost = 0;
        for (uint32_t k = 0; k < n_chain; k++) {
            uint32_t p2;
            const tile *tk2 = &a->tiles[ti + k];
            cost += (uint64_t)tile_pages(a, iv, tk2, &p2) * tk2->n_rows;
        }
        for (uint32_t kvh = 0; kvh < nkv; kvh += wide) {
            task *tk = &a->tasks[a->n_tasks++];
            tk->tile = ti;
            tk->kvh = kvh;
            tk->nh = nkv - kvh < wide ? nkv - kvh : wide;
            tk->n_pieces = 1;
            tk->n_tiles = n_chain;
            tk->scored = scored;
            tk->slots = NULL;
            tk->sel = iv->select ? iv->sel + (size_t)kvh * B : NULL;
            tk->p0 = iv->select ? 0 : p0;
            tk->n_list = iv->select ? pgd__attn_n_selected(np, B) : np;
            total += iv->select ? (uint64_t)tk->n_list * tk->nh : cost * tk->nh;
        }
        ti += n_chain - 1;
    }

    /* total counts pages x rows x KV heads; each page row is page_tokens keys for every
     * query head of the group: head_dim multiply-adds in K and in V, and the score's share
     * of the softmax, which costs about ATTN_SCORE_WORK multiply-adds' time (a vector exp,
     * max and scale): it dominates at small head_dim (stories260K's 8) */
    a->work = total * pt * g->group * (hd * 2 + ATTN_SCORE_WORK);

    /* How many pieces each task gets: one, or one per page range (the ranges of a task are
     * fixed by its own pages, so the batch and the thread count only choose between the
     * two, which give the same bits). */
    const uint64_t target = total / ((uint64_t)a->p.n_threads * PIECES_PER_THREAD) + 1;
    uint32_t extra = 0;
    size_t slot_used = 0;
    for (uint32_t k = 0; k < a->n_tasks; k++) {
        task *tk = &a->tasks[k];
        const uint32_t nr = a->tiles[tk->tile].n_rows * tk->nh; /* cost per page */
        /* Ranges at fixed pages (run_piece): the list's first may be partial. */
        const uint64_t R = a->range_pages;
        const uint64_t n_ranges = (tk->p0 + tk->n_list + R - 1) / R - tk->p0 / R;
        uint64_t pieces = 1;
        if (!tk->scored &&
            (a->p.split_pages || (a->p.n_threads > 1 && (uint64_t)tk->n_list * nr > target)))
            pieces = n_ranges;
        if (pieces <= 1) continue;
        const size_t need = (size_t)pieces * nr * g->group * (hd + 2);
        if (extra + pieces - 1 > a->max_pieces - a->max_tasks || slot_used + need > a->slot_cap)
            continue; /* no room: the task stays whole (correct, less balanced) */
        tk->n_pieces = (uint32_t)pieces;
        tk->slots = a->slots + slot_used;
        slot_used += need;
        extra += (uint32_t)pieces - 1;
        atomic_store_explicit(&a->done[k], 0, memory_order_relaxed);
    }

    /* The queue: pieces of split tasks first, then whole tasks. */
    a->n_pieces = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t k = 0; k < a->n_tasks; k++) {
            const task *tk = &a->tasks[k];
            if ((tk->n_pieces > 1) != (pass == 0)) continue;
            const uint32_t R = a->range_pages, r0 = tk->p0 / R * R;
            for (uint32_t j = 0; j < tk->n_pieces; j++) {
                piece *pc = &a->pieces[a->n_pieces++];
                pc->task = k;
                pc->k = j;
                pc->a = 0;
                pc->b = tk->n_list;
                if (tk->n_pieces == 1) continue;
                /* Range j: pages [r0 + j R, r0 + (j + 1) R) of the list's pages. */
                if (j) pc->a = r0 + j * R - tk->p0;
                if (r0 + (j + 1) * R - tk->p0 < tk->n_list) pc->b = r0 + (j + 1) * R - tk->p0;
            }
        }
    }
}

/* Returns the keys the last row of a view sees (every key up to it, its window's, or the
 * Quest selection's). */
static uint64_t row_keys(const pgd_attn *a, const iview *iv)
{
    const uint32_t pt = a->g.page_tokens, np = iv->v.n_pages;
    if (a->win && iv->v.len > a->win) return a->win;
    if (!iv->select) return iv->v.len;
    return (uint64_t)(pgd__attn_n_selected(np, a->p.select_pages) - 1) * pt + iv->v.len -
           (uint64_t)(np - 1) * pt;
}

int pgd_attn_run_scored(pgd_attn *a, uint32_t layer, const pgd_attn_item *items,
                        const pgd_attn_scores *sc, uint32_t n)
{
    if (!a || layer >= a->g.n_layers || (n && !items)) return PGD_EINVAL;
    const uint32_t B = a->p.select_pages;
    a->win = a->window ? a->window[layer] : 0;
    const uint32_t local = pgd__attn_geom_layer(&a->g, layer); /* its group and index */
    uint64_t rows = 0;
    a->n_views = 0;
    a->n_select = 0;
    for (uint32_t i = 0; i < n; i++) {
        const pgd_attn_scores *si = sc && sc[i].scores && sc[i].rows ? &sc[i] : NULL;
        if (si && si->rows > items[i].n_rows) return PGD_EINVAL;
        if (!items[i].n_rows) continue;
        rows += items[i].n_rows;
        if (rows > a->p.max_rows) return PGD_EINVAL;
        iview *iv = &a->views[a->n_views];
        int rc = pgd__attn_view_init(&a->g, &items[i], &iv->v);
        if (rc != PGD_OK) return rc;
        iv->it = &items[i];
        /* A window layer attends densely inside its window: no Quest there. */
        iv->select = B && !a->win && items[i].n_rows == 1 && iv->v.n_pages > B;
        iv->sc = si;
        iv->sc_row0 = si ? items[i].n_rows - si->rows : items[i].n_rows;
        if (si && (si->ld < iv->v.len || row_keys(a, iv) > a->p.score_keys)) return PGD_EINVAL;
        if (iv->select) a->sel_view[a->n_select++] = a->n_views;
        a->n_views++;
    }
    a->layer = local;
    if (a->n_select) {
        /* Quest's bounds: two multiply-adds per channel of each page, per query vector */
        uint64_t work = 0;
        for (uint32_t k = 0; k < a->n_select; k++)
            work += (uint64_t)a->views[a->sel_view[k]].v.n_pages * 2 * a->g.head_dim;
        run_tasks(a, select_task, a->n_select * a->g.n_kv_heads,
                  work * a->g.n_kv_heads * a->g.group);
    }
    plan(a);
    run_tasks(a, piece_task, a->n_pieces, a->work);
    return PGD_OK;
}

int pgd_attn_run(pgd_attn *a, uint32_t layer, const pgd_attn_item *items, uint32_t n)
{
    return pgd_attn_run_scored(a, layer, items, NULL, n);
}
