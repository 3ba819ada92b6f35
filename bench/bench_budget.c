/* SPDX-License-Identifier: MIT */
/*
 * bench_budget.c - speed and memory of token budgets (budget.h) through the engine: for
 * each context length of --ctx the prompt's context is prepared once, then each run (dense
 * first, then every budget x method) takes it from the prefix cache, prefills the prompt's
 * last 32 tokens for real with its budget (so snapkv's observation window is real),
 * compresses, and decodes --steps tokens greedily (pe_forward_batch with the budget item).
 * Per run it prints decode tokens/s and the ratio to dense, the KV bytes the sequence
 * holds (its pages x page bytes) and their ratio, the compaction's cost, attention's share of a
 * decode step, and the scoring cost: pgd_attn_run_scored / pgd_attn_run on the run's sequence (one
 * layer, a decode row). Figures only: nothing is asserted on timing.
 *
 *   bench_budget [--model M.gguf] [--ctx 8192,32768] [--budget 1024,2048]
 *                [--methods snapkv,streaming] [--steps 32] [--threads 2]
 *   bench_budget --smoke        stories260K from ../shared/models, tiny sizes (ctest)
 *
 * Without --model: the synthetic 1b model at $TMPDIR/pagoda-synth-1b-q8_0.gguf, made once
 * with this build's CLI (`pagoda synth-model --shape 1b --type q8_0 --seed 1 -o FILE`).
 *
 * The prompt's context. A real prefill of 32k tokens of a 1B model takes far too long on a
 * small machine, so the prompt [0, ctx) is prepared as
 *
 *   [0, R)              a real prefill of R tokens (--real-prefix, 64)
 *   [R, ctx - 32)       the real prefix's K/V rows replicated: position p holds the rows
 *                       of position p mod R in every layer (read back from the f16 pages),
 *                       written with pgd_seq_write_kv and committed, so every full page is
 *                       registered in the prefix index
 *   [ctx - 32, ctx)     each run's real prefill chunk, which ends the prompt
 *
 * The replicated rows have the magnitudes and per-head structure of real K/V; only their
 * RoPE phases are those of their source positions, which changes nothing of the cost. The
 * preparing sequence is destroyed and its pages stay cached (the pool is sized so nothing
 * is evicted; a line says so otherwise).
 *
 * Ratios to dense are paired: the dense run's sequence at the prompt's end is kept, and
 * each budget run decodes a fork of it in turn with its own steps (dense first on even
 * steps, second on odd ones), so both see the same load on a shared machine; "x dense" is
 * the partner's time over the run's, in wall and in CPU time.
 *
 * Compaction. The snapkv family (once-methods) compresses at the prompt's end: the bench
 * runs the chunk with prompt_left one above its tokens (its rows score, all but the
 * window's last one) and times pgd_budget_apply on its own, the compression that
 * pgd_budget_end runs at the prompt's end. Online methods (streaming, h2o, tova) compact
 * inside a decode step every page_tokens steps; every step is timed, and the excess of the
 * compacting steps over the median of the others, summed and divided by the steps, is the
 * amortized cost per decode step.
 *
 * Timing: wall time, and CPU time of the process (the machine may be shared: tokens per
 * CPU-second and CPU milliseconds are steadier under contention). "cmp ms/cpu" is the
 * once-methods' compaction (wall / CPU ms), "/step ms/cpu" online compaction's cost per
 * decode step (wall / CPU ms, each from the steps' own clock).
 * Columns: "attn%" is n_layer x one layer's decode-row attention (measured on the run's
 * sequence) over the median decode step: what a budget can shrink. Hence the line after
 * the dense run: a decode step's median, its attention, and the speed-up a budget could
 * reach if its attention cost nothing, dense step / (dense step - dense attention); the
 * rest of a step (the weight matmuls, norms, the logits) a budget does not touch.
 */
#include <math.h>
#include <unistd.h>

#include <pagoda/attn.h>
#include <pagoda/budget.h>

#include "bench.h"
#include "model.h"
#include "threadpool.h"

#define PROG "bench_budget"

enum { MAX_LIST = 8, MAX_STEPS = 4096, MAX_REPS = 99, CHUNK = 32 };

static void usage(FILE *f)
{
    fputs("usage: bench_budget [options]\n"
          "  --model FILE      GGUF model (default: the synthetic 1b model, q8_0, at\n"
          "                    $TMPDIR/pagoda-synth-1b-q8_0.gguf, made once with pagoda\n"
          "                    synth-model when absent)\n"
          "  --ctx LIST        prompt lengths, multiples of 16 (default 8192,32768)\n"
          "  --budget LIST     token budgets, mean tokens per (layer, KV head)\n"
          "                    (default 1024,2048)\n"
          "  --methods LIST    streaming, h2o, tova, snapkv, pyramidkv, adakv\n"
          "                    (default snapkv,streaming)\n"
          "  --steps N         timed decode steps per run, after one untimed (default 32)\n"
          "  --threads N, -t N threads (default 2)\n"
          "  --real-prefix N   prompt tokens prefilled for real; the rest of the context\n"
          "                    replicates their K/V (default 64)\n"
          "  --reps N          repetitions of each attention timing; medians (default 9)\n"
          "  --seed S          prompt token seed (default 1)\n"
          "  --json            one JSON object per result line\n"
          "  --smoke           tiny run on stories260K (skips when absent)\n"
          "  --help\n",
          f);
}

static void touch(void *ud, uint64_t done, uint64_t total)
{
    (void)ud, (void)done, (void)total; /* loading with a progress hook prefaults weights */
}

static void tp_parallel(void *exec_ud, pgd_task_fn fn, void *fn_ud, uint32_t n_tasks)
{
    pe_tp_run(exec_ud, fn, fn_ud, n_tasks);
}

static uint32_t argmax(const float *x, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Online methods enforce after every step (budget.h "When a budget is enforced"). */
static int is_online(const pgd_budget_params *p)
{
    if (p->online >= 0) return p->online;
    return p->method == PGD_BUDGET_STREAMING || p->method == PGD_BUDGET_H2O ||
           p->method == PGD_BUDGET_TOVA;
}

/* "snapkv,streaming": at most max method names. Returns the count (>= 1) or -1. */
static int parse_methods(const char *s, pgd_budget_method *out, int max)
{
    char buf[256];
    int n = 0;
    snprintf(buf, sizeof buf, "%s", s);
    for (char *p = buf; p && *p;) {
        char *comma = strchr(p, ',');
        if (comma) *comma = '\0';
        if (n == max || pgd_budget_method_parse(p, &out[n]) != PGD_OK || out[n] == PGD_BUDGET_NONE)
            return -1;
        n++;
        p = comma ? comma + 1 : NULL;
    }
    return n ? n : -1;
}

/* The 1b model at $TMPDIR/pagoda-synth-1b-q8_0.gguf, made with the CLI when absent
 * (PGD_CLI_PATH: the pagoda binary of this build). Returns 0 or -1. */
static int synth_model(char *path, size_t cap)
{
    const char *dir = getenv("TMPDIR");
    snprintf(path, cap, "%s/pagoda-synth-1b-q8_0.gguf", dir && *dir ? dir : "/tmp");
    if (access(path, R_OK) == 0) return 0;
#ifdef PGD_CLI_PATH
    char tmp[1100], cmd[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    snprintf(cmd, sizeof cmd,
             "'%s' synth-model --shape 1b --type q8_0 --seed 1 -o '%s' >&2 && mv '%s' '%s'",
             PGD_CLI_PATH, tmp, tmp, path);
    fprintf(stderr, PROG ": making %s (once)\n", path);
    if (system(cmd) == 0) return 0;
    unlink(tmp);
    fprintf(stderr, PROG ": `%s` failed\n", cmd);
#else
    fprintf(stderr, PROG ": no pagoda CLI in this build: give --model\n");
#endif
    return -1;
}

/* ---- one context ---- */

typedef struct bench {
    pe_model *m;
    const pe_hparams *hp;
    pe_ctx *c;
    pgd_cache *cache;
    pgd_attn *attn;    /* the bench's own, for the scoring figures */
    pe_threadpool *tp; /* its threads */
    int32_t *toks;     /* [ctx] the prompt */
    float *logits;     /* [n_vocab] */
    float *q, *out;    /* [CHUNK][n_head][head_dim] */
    float *scores;     /* [n_kv_heads][score_ld] */
    size_t score_ld;   /* n_ctx */
    uint32_t ctx;      /* prompt tokens */
    uint32_t prefix;   /* ctx - CHUNK: what the runs take from the prefix cache */
    uint32_t steps;    /* timed decode steps */
    uint32_t reps;     /* attention timings */
    uint64_t page_bytes;
    uint64_t checksum;          /* greedy tokens of every run */
    pgd_seq *d0;                /* the dense run's sequence at the prompt's end (partners) */
    int32_t d0_tok;             /* its next token */
    double step_s[MAX_STEPS];   /* wall seconds of each timed decode step */
    double step_cpu[MAX_STEPS]; /* CPU seconds of the process in it */
    int step_compacted[MAX_STEPS];
} bench;

typedef struct run_result {
    int ok;                     /* 0: skipped (the budget could not be created) */
    double chunk_s;             /* the real prefill chunk (with scoring, online compaction) */
    double tps;                 /* decode tokens/s over the timed steps (wall) */
    double tps_cpu;             /* decode tokens per CPU-second of the process */
    double pair_tps;            /* the same of the dense partner, stepped in turn with it */
    double pair_tps_cpu;        /* (the dense run: its own figures) */
    double step_med_s;          /* median decode step */
    uint64_t kv_bytes;          /* pages used x page bytes after the decode */
    uint32_t pages;             /* pages used */
    uint64_t slots;             /* the sequence's length (slots) after the decode */
    uint64_t dropped;           /* pgd_seq_n_dropped after the decode */
    double compact_ms;          /* once-methods: pgd_budget_apply, wall; NAN otherwise */
    double compact_cpu_ms;      /* the same in CPU time (it runs on the calling thread) */
    double select_cpu_ms;       /* of which the selection (pgd_budget_select, every layer, on
                                   the same scores), timed apart before it; NAN otherwise */
    double compact_step_ms;     /* online: amortized per decode step, wall; NAN otherwise */
    double compact_step_cpu_ms; /* the same from the steps' CPU times */
    uint64_t compactions;       /* budget stats */
    double attn_ms, scored_ms;  /* one layer, a decode row, on the run's sequence */
} run_result;

/* Median attention times of rows query rows of s, layer 0: pgd_attn_run and
 * pgd_attn_run_scored, interleaved. Returns 0 or a negative status. */
static int time_attn(bench *b, pgd_seq *s, uint32_t rows, double *plain_ms, double *scored_ms)
{
    double tp[MAX_REPS], ts[MAX_REPS];
    const pgd_attn_item it = {s, rows, b->q, b->out};
    const pgd_attn_scores sc = {b->scores, rows, b->score_ld};
    int rc = pgd_attn_run(b->attn, 0, &it, 1); /* warm-up */
    if (rc == PGD_OK) rc = pgd_attn_run_scored(b->attn, 0, &it, &sc, 1);
    for (uint32_t r = 0; r < b->reps && rc == PGD_OK; r++) {
        double t0 = bench_now_s();
        rc = pgd_attn_run(b->attn, 0, &it, 1);
        double t1 = bench_now_s();
        if (rc == PGD_OK) rc = pgd_attn_run_scored(b->attn, 0, &it, &sc, 1);
        tp[r] = t1 - t0;
        ts[r] = bench_now_s() - t1;
    }
    if (rc != PGD_OK) return rc;
    *plain_ms = 1e3 * bench_median(tp, b->reps);
    *scored_ms = 1e3 * bench_median(ts, b->reps);
    return 0;
}

/* The CPU ms of what pgd_budget_apply selects first: pgd_budget_select of every layer on
 * the scores bud gathered for s (the accumulators stay readable after the step). Returns 0
 * or -1 with a message. */
static int time_select(bench *b, const pgd_budget_params *bp, pgd_budget *bud, pgd_seq *s,
                       double *cpu_ms)
{
    const uint32_t n_layer = b->hp->n_layer, n_kv = b->hp->n_head_kv;
    const uint64_t len = pgd_seq_length(b->cache, s);
    uint32_t max_keep = 0;
    for (uint32_t l = 0; l < n_layer; l++) {
        uint32_t lb = pgd_budget_layer_budget(bp, l, n_layer);
        if (bp->method == PGD_BUDGET_ADAKV) lb = (uint32_t)ceil(bp->adakv_cap * lb);
        if (lb > max_keep) max_keep = lb;
    }
    uint32_t *keep = malloc((size_t)n_kv * max_keep * sizeof *keep);
    uint32_t *n_keep = malloc(n_kv * sizeof *n_keep);
    int rc = keep && n_keep ? 0 : PGD_ENOMEM;
    const double c0 = bench_clock_s(CLOCK_THREAD_CPUTIME_ID);
    for (uint32_t l = 0; l < n_layer && rc >= 0; l++)
        rc = pgd_budget_select(bp, l, n_layer, n_kv, len, pgd_budget_scores(bud, l),
                               pgd_budget_score_ld(bud), keep, max_keep, n_keep);
    *cpu_ms = 1e3 * (bench_clock_s(CLOCK_THREAD_CPUTIME_ID) - c0);
    free(keep);
    free(n_keep);
    if (rc >= 0) return 0;
    fprintf(stderr, PROG ": pgd_budget_select: %s\n", pgd_strerror(rc));
    return -1;
}

/* Online compaction's cost per step: the excess of the steps that compacted
 * (compacted[i]) over the median of the others, summed and divided by the n steps; NAN
 * when every step compacted. */
static double amortized_ms(const double *t, const int *compacted, uint32_t n)
{
    double plain[MAX_STEPS], excess = 0;
    uint32_t n_plain = 0;
    for (uint32_t i = 0; i < n; i++)
        if (!compacted[i]) plain[n_plain++] = t[i];
    if (!n_plain) return NAN;
    const double med = bench_median(plain, n_plain);
    for (uint32_t i = 0; i < n; i++)
        if (compacted[i]) excess += t[i] - med;
    return 1e3 * excess / n;
}

/* Prepares the prompt's context [0, prefix) in the prefix cache (see the file comment).
 * Returns 0 or -1 with a message. */
static int prepare(bench *b, uint32_t real, double *real_s, double *fill_s)
{
    const pe_hparams *hp = b->hp;
    const uint32_t pt = pgd_cache_page_tokens(b->cache), hd = hp->head_dim;
    const size_t KV = (size_t)hp->n_head_kv * hd;
    const uint32_t n_batch = pe_ctx_params_get(b->c)->n_batch, block = 1024;
    pgd_pool *pool = pgd_cache_pool(b->cache);
    float *rk = malloc((size_t)hp->n_layer * real * KV * sizeof *rk);
    float *rv = malloc((size_t)hp->n_layer * real * KV * sizeof *rv);
    float *kb = malloc(block * KV * sizeof *kb), *vb = malloc(block * KV * sizeof *vb);
    pgd_seq *s = NULL;
    int ret = -1;
    if (!rk || !rv || !kb || !vb || pgd_seq_create(b->cache, NULL, 0, &s) != PGD_OK) {
        fprintf(stderr, PROG ": out of memory preparing the prompt\n");
        goto out;
    }
    double t0 = bench_now_s();
    for (uint32_t i = 0; i < real; i += n_batch) {
        uint32_t n = real - i < n_batch ? real - i : n_batch;
        int rc = pe_forward(b->c, s, b->toks + i, n, NULL, 0);
        if (rc) {
            fprintf(stderr, PROG ": real prefix: %s\n", pgd_strerror(rc));
            goto out;
        }
    }
    *real_s = bench_now_s() - t0;
    /* Read the real rows back from the f16 pages: [layer][position][kv_head][head_dim]. */
    const uint32_t *ids;
    pgd_seq_pages(b->cache, s, &ids);
    for (uint32_t l = 0; l < hp->n_layer; l++)
        for (uint32_t p = 0; p < real; p++)
            for (uint32_t h = 0; h < hp->n_head_kv; h++) {
                const uint16_t *k = (const uint16_t *)pgd_pool_k(pool, ids[p / pt], l, h);
                const uint16_t *v = (const uint16_t *)pgd_pool_v(pool, ids[p / pt], l, h);
                float *dk = rk + ((size_t)l * real + p) * KV + (size_t)h * hd;
                float *dv = rv + ((size_t)l * real + p) * KV + (size_t)h * hd;
                for (uint32_t d = 0; d < hd; d++) {
                    dk[d] = pe_f16_to_f32(k[(size_t)(p % pt) * hd + d]);
                    dv[d] = pe_f16_to_f32(v[(size_t)(p % pt) * hd + d]);
                }
            }
    t0 = bench_now_s();
    for (uint32_t pos = real; pos < b->prefix;) {
        uint32_t n = b->prefix - pos < block ? b->prefix - pos : block;
        int rc = pgd_seq_grow(b->cache, s, n);
        for (uint32_t l = 0; l < hp->n_layer && rc == PGD_OK; l++) {
            for (uint32_t t = 0; t < n; t++) {
                size_t src = ((size_t)l * real + (pos + t) % real) * KV;
                memcpy(kb + t * KV, rk + src, KV * sizeof *kb);
                memcpy(vb + t * KV, rv + src, KV * sizeof *vb);
            }
            rc = pgd_seq_write_kv(b->cache, s, pos, n, l, kb, vb);
        }
        if (rc == PGD_OK) rc = pgd_seq_commit(b->cache, s, b->toks + pos, n);
        if (rc < 0) {
            fprintf(stderr, PROG ": filling the context at %u: %s\n", pos, pgd_strerror(rc));
            goto out;
        }
        pos += n;
    }
    *fill_s = bench_now_s() - t0;
    ret = 0;
out:
    pgd_seq_destroy(b->cache, s); /* its full pages stay cached: the runs match them */
    free(rk);
    free(rv);
    free(kb);
    free(vb);
    return ret;
}

/* One greedy decode step of s (budget bud, or NULL): *tok in, the next token out. Wall
 * and CPU seconds of the step in *dt, *dc. Returns 0 or a negative status. */
static int decode_step(bench *b, pgd_seq *s, pgd_budget *bud, int32_t *tok, double *dt, double *dc)
{
    const pe_batch_item it = {.seq = s, .tokens = tok, .n = 1, .logits = b->logits, .budget = bud};
    const double c0 = bench_clock_s(CLOCK_PROCESS_CPUTIME_ID), t0 = bench_now_s();
    const int rc = pe_forward_batch(b->c, &it, 1);
    *dt = bench_now_s() - t0;
    *dc = bench_clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
    if (rc) return rc;
    *tok = (int32_t)argmax(b->logits, b->hp->n_vocab);
    b->checksum = b->checksum * 31 + (uint64_t)*tok;
    return 0;
}

/* One run: bp NULL is dense. Returns 0 (r->ok 0: skipped, with a message) or -1. */
static int run_one(bench *b, const pgd_budget_params *bp, run_result *r)
{
    const pe_hparams *hp = b->hp;
    pgd_seq *s = NULL, *d = NULL; /* d: the dense partner of a budget run */
    pgd_budget *bud = NULL;
    int ret = -1, rc;
    memset(r, 0, sizeof *r);
    r->compact_ms = r->compact_cpu_ms = r->compact_step_ms = r->compact_step_cpu_ms = NAN;
    r->select_cpu_ms = NAN;
    if (pgd_seq_create(b->cache, NULL, 0, &s) != PGD_OK) return -1;
    int64_t got = pgd_seq_match(b->cache, s, b->toks, b->prefix);
    if (got != (int64_t)b->prefix) {
        fprintf(stderr, PROG ": the prefix cache gave %lld of %u tokens\n", (long long)got,
                b->prefix);
        goto out;
    }
    if (bp) {
        rc = pgd_budget_create(b->cache, bp, &bud);
        if (rc != PGD_OK) {
            fprintf(stderr, PROG ": %s budget %u: %s, skipped\n",
                    pgd_budget_method_name(bp->method), bp->budget, pgd_strerror(rc));
            ret = 0;
            goto out;
        }
    }
    const int once = bp && !is_online(bp);
    const uint64_t fail0 = pe_ctx_budget_failures(b->c, NULL);
    const uint32_t chunk = b->ctx - b->prefix;
    pe_batch_item it = {.seq = s,
                        .tokens = b->toks + b->prefix,
                        .n = chunk,
                        .logits = b->logits,
                        .budget = bud,
                        .prompt_left = chunk + (once ? 1 : 0)};
    double t0 = bench_now_s();
    rc = pe_forward_batch(b->c, &it, 1);
    r->chunk_s = bench_now_s() - t0;
    if (rc) {
        fprintf(stderr, PROG ": prefill chunk: %s\n", pgd_strerror(rc));
        goto out;
    }
    if (once) {
        if (time_select(b, bp, bud, s, &r->select_cpu_ms)) goto out;
        const double c0 = bench_clock_s(CLOCK_THREAD_CPUTIME_ID);
        t0 = bench_now_s();
        int64_t dropped = pgd_budget_apply(bud, s);
        r->compact_ms = 1e3 * (bench_now_s() - t0);
        r->compact_cpu_ms = 1e3 * (bench_clock_s(CLOCK_THREAD_CPUTIME_ID) - c0);
        if (dropped < 0) {
            fprintf(stderr, PROG ": %s budget %u: pgd_budget_apply: %s%s\n",
                    pgd_budget_method_name(bp->method), bp->budget, pgd_strerror((int)dropped),
                    dropped == PGD_ENOTSUP ? ", skipped" : "");
            ret = dropped == PGD_ENOTSUP ? 0 : -1; /* ENOTSUP: a placeholder of the library */
            goto out;
        }
    }
    int32_t tok = (int32_t)argmax(b->logits, hp->n_vocab), dtok = b->d0_tok;
    if (!bp) { /* the dense base of the partners: this sequence at the prompt's end */
        if (pgd_seq_fork(b->cache, s, &b->d0) != PGD_OK) goto out;
        b->d0_tok = tok;
    } else if (pgd_seq_fork(b->cache, b->d0, &d) != PGD_OK) {
        goto out;
    }
    double total = 0, total_cpu = 0, d_total = 0, d_cpu = 0;
    for (uint32_t i = 0; i <= b->steps; i++) { /* step 0: warm-up, untimed */
        pgd_budget_stats st0 = {0}, st1 = {0};
        double dt = 0, dc = 0, pt = 0, pc = 0;
        rc = d && i % 2 == 0 ? decode_step(b, d, NULL, &dtok, &pt, &pc) : 0;
        if (bud) pgd_budget_get_stats(bud, &st0);
        if (rc == 0) rc = decode_step(b, s, bud, &tok, &dt, &dc);
        if (bud) pgd_budget_get_stats(bud, &st1);
        if (rc == 0 && d && i % 2 == 1) rc = decode_step(b, d, NULL, &dtok, &pt, &pc);
        if (rc) {
            fprintf(stderr, PROG ": decode step %u: %s\n", i, pgd_strerror(rc));
            goto out;
        }
        if (i == 0) continue;
        b->step_s[i - 1] = dt;
        b->step_cpu[i - 1] = dc;
        b->step_compacted[i - 1] = st1.compactions > st0.compactions;
        total += dt;
        total_cpu += dc;
        d_total += pt;
        d_cpu += pc;
    }
    /* The engine keeps a sequence whole when its compaction fails, and counts it. */
    int fail_status = PGD_OK;
    const uint64_t fails = pe_ctx_budget_failures(b->c, &fail_status) - fail0;
    if (fails) {
        fprintf(stderr, PROG ": %s budget %u: %" PRIu64 " compactions failed (%s)%s\n",
                pgd_budget_method_name(bp->method), bp->budget, fails, pgd_strerror(fail_status),
                fail_status == PGD_ENOTSUP ? ", skipped" : "");
        ret = fail_status == PGD_ENOTSUP ? 0 : -1;
        goto out;
    }
    r->tps = b->steps / total;
    r->tps_cpu = b->steps / total_cpu;
    r->pair_tps = d ? b->steps / d_total : r->tps;
    r->pair_tps_cpu = d ? b->steps / d_cpu : r->tps_cpu;
    if (bp && !once) {
        r->compact_step_ms = amortized_ms(b->step_s, b->step_compacted, b->steps);
        r->compact_step_cpu_ms = amortized_ms(b->step_cpu, b->step_compacted, b->steps);
    }
    double plain[MAX_STEPS];
    memcpy(plain, b->step_s, b->steps * sizeof *plain);
    r->step_med_s = bench_median(plain, b->steps);
    if (bud) {
        pgd_budget_stats st;
        pgd_budget_get_stats(bud, &st);
        r->compactions = st.compactions;
    }
    const uint32_t *ids;
    r->pages = pgd_seq_pages(b->cache, s, &ids);
    r->kv_bytes = (uint64_t)r->pages * b->page_bytes;
    r->slots = pgd_seq_length(b->cache, s);
    r->dropped = pgd_seq_n_dropped(b->cache, s);
    rc = time_attn(b, s, 1, &r->attn_ms, &r->scored_ms);
    if (rc) {
        fprintf(stderr, PROG ": attention timing: %s\n", pgd_strerror(rc));
        goto out;
    }
    r->ok = 1;
    ret = 0;
out:
    pgd_budget_destroy(bud);
    pgd_seq_destroy(b->cache, d);
    pgd_seq_destroy(b->cache, s);
    return ret;
}

/* JSON has no NaN: a figure that does not apply is -1. */
static double nan_neg(double x)
{
    return isnan(x) ? -1.0 : x;
}

static void print_run(const bench *b, const char *method, uint32_t budget, const run_result *r,
                      const run_result *dense, int json)
{
    const double mib = 1.0 / 1048576.0;
    const double score_x = r->scored_ms / r->attn_ms;
    const double attn_share = b->hp->n_layer * r->attn_ms * 1e-3 / r->step_med_s;
    if (json) {
        printf("{\"ctx\": %u, \"budget\": %u, \"method\": \"%s\", \"decode_tps\": %.3f, "
               "\"decode_vs_dense\": %.3f, \"decode_tps_cpu\": %.3f, "
               "\"decode_cpu_vs_dense\": %.3f, \"kv_bytes\": %" PRIu64 ", \"kv_vs_dense\": %.4f, "
               "\"pages\": %u, \"slots\": %" PRIu64 ", \"dropped\": %" PRIu64 ", "
               "\"chunk_s\": %.3f, \"compact_ms\": %.3f, \"compact_cpu_ms\": %.3f, "
               "\"select_cpu_ms\": %.3f, "
               "\"compact_ms_per_step\": %.3f, \"compact_cpu_ms_per_step\": %.3f, "
               "\"compactions\": %" PRIu64 ", \"attn_ms\": %.4f, \"attn_scored_ms\": %.4f, "
               "\"score_ratio\": %.4f, \"attn_share\": %.4f}\n",
               b->ctx, budget, method, r->tps, r->tps / r->pair_tps, r->tps_cpu,
               r->tps_cpu / r->pair_tps_cpu, r->kv_bytes, (double)r->kv_bytes / dense->kv_bytes,
               r->pages, r->slots, r->dropped, r->chunk_s, nan_neg(r->compact_ms),
               nan_neg(r->compact_cpu_ms), nan_neg(r->select_cpu_ms), nan_neg(r->compact_step_ms),
               nan_neg(r->compact_step_cpu_ms), r->compactions, r->attn_ms, r->scored_ms, score_x,
               attn_share);
        return;
    }
    char once[32] = "-", step[32] = "-", sel[16] = "-";
    if (!isnan(r->compact_ms))
        snprintf(once, sizeof once, "%.1f/%.1f", r->compact_ms, r->compact_cpu_ms);
    if (!isnan(r->select_cpu_ms)) snprintf(sel, sizeof sel, "%.1f", r->select_cpu_ms);
    if (!isnan(r->compact_step_ms))
        snprintf(step, sizeof step, "%.2f/%.2f", r->compact_step_ms, r->compact_step_cpu_ms);
    printf("%-6u %-6u %-9s %8.3f %7.2fx %8.3f %7.2fx %9.1f %7.3fx %7" PRIu64 " %8.2f %13s %7s "
           "%13s %7.3f %7.3f %7.3fx %5.1f%%\n",
           b->ctx, budget, method, r->tps, r->tps / r->pair_tps, r->tps_cpu,
           r->tps_cpu / r->pair_tps_cpu, r->kv_bytes * mib, (double)r->kv_bytes / dense->kv_bytes,
           r->slots, r->chunk_s, once, sel, step, r->attn_ms, r->scored_ms, score_x,
           100.0 * attn_share);
}

typedef struct config {
    const char *model_path;
    uint32_t ctxs[MAX_LIST], budgets[MAX_LIST];
    pgd_budget_method methods[MAX_LIST];
    int n_ctx, n_budget, n_method;
    uint32_t steps, threads, real, reps;
    uint64_t seed;
    int json;
} config;

/* Runs every (budget, method) at context ctx. Returns 0 or -1. */
static int bench_ctx(const config *cf, pe_model *m, uint32_t ctx, uint64_t *checksum)
{
    const pe_hparams *hp = pe_model_hparams(m);
    bench b = {.m = m, .hp = hp, .ctx = ctx, .steps = cf->steps, .reps = cf->reps};
    const uint32_t pt = 16;
    b.prefix = ctx - CHUNK;
    uint32_t max_budget = 0;
    for (int i = 0; i < cf->n_budget; i++)
        if (cf->budgets[i] > max_budget) max_budget = cf->budgets[i];
    /* Pages: the context, what each run leaves cached (its chunk and decode pages), and one
     * run's kept pages, with a margin; nothing needs evicting. */
    const uint32_t n_runs = 1 + (uint32_t)(cf->n_budget * cf->n_method);
    const uint64_t run_pages = (CHUNK + cf->steps + 1 + pt - 1) / pt + 1;
    const uint64_t pages =
        ctx / pt + n_runs * run_pages + (max_budget + CHUNK + cf->steps) / pt + n_runs + 16;
    pe_ctx_params cp = pe_ctx_default_params();
    cp.n_ctx = ctx + cf->steps + 2;
    cp.n_batch = cf->real > CHUNK ? cf->real : CHUNK;
    cp.n_threads = cf->threads;
    cp.page_tokens = pt;
    cp.kv_type = PGD_KV_F16;
    cp.kv_tokens = pages * pt;
    cp.budget_scores = 1;
    char err[512];
    int ret = -1;
    if (pe_ctx_create(m, &cp, &b.c, err, sizeof err)) {
        fprintf(stderr, PROG ": context of %u tokens: %s\n", ctx, err);
        return -1;
    }
    b.cache = pe_ctx_cache(b.c);
    b.page_bytes = pgd_pool_page_bytes(pgd_cache_pool(b.cache));
    /* Touch every page once (all are free now), as in a pool that has served a while:
     * else a page's first use (the fill, compaction's fresh pages) pays the kernel's
     * zeroing of its memory, 20% of a profile of a run at 8k. */
    for (uint32_t i = 0; i < pgd_pool_n_pages(pgd_cache_pool(b.cache)); i++)
        memset(pgd_pool_page_data(pgd_cache_pool(b.cache), i), 0, b.page_bytes);
    b.tp = pe_tp_create(cf->threads);
    pgd_attn_params ap = pgd_attn_default_params();
    ap.n_head = hp->n_head;
    ap.n_threads = b.tp ? pe_tp_n_threads(b.tp) : 1;
    ap.parallel = tp_parallel;
    ap.parallel_ud = b.tp;
    ap.max_rows = CHUNK;
    ap.score_keys = cp.n_ctx;
    b.score_ld = cp.n_ctx;
    const size_t qn = (size_t)CHUNK * hp->n_head * hp->head_dim;
    b.toks = malloc(ctx * sizeof *b.toks);
    b.logits = malloc(hp->n_vocab * sizeof *b.logits);
    b.q = malloc(qn * sizeof *b.q);
    b.out = malloc(qn * sizeof *b.out);
    b.scores = calloc(hp->n_head_kv * b.score_ld, sizeof *b.scores);
    run_result *res = calloc(n_runs, sizeof *res);
    if (!b.tp || !b.toks || !b.logits || !b.q || !b.out || !b.scores || !res ||
        pgd_attn_create(b.cache, &ap, &b.attn) != PGD_OK) {
        fprintf(stderr, PROG ": out of memory (context %u)\n", ctx);
        goto out;
    }
    uint64_t seed = cf->seed ^ ctx;
    b.toks[0] = 1;
    for (uint32_t i = 1; i < ctx; i++)
        b.toks[i] = 3 + (int32_t)(bench_rng(&seed) % (hp->n_vocab - 3));
    for (size_t i = 0; i < qn; i++)
        b.q[i] = bench_randf(&seed);

    double real_s = 0, fill_s = 0;
    if (prepare(&b, cf->real, &real_s, &fill_s)) goto out;
    if (run_one(&b, NULL, &res[0]) || !res[0].ok) goto out;
    /* Scoring the snapkv way: the observation window's rows over the dense sequence. */
    double obs_plain = 0, obs_scored = 0;
    {
        pgd_seq *s;
        if (pgd_seq_create(b.cache, NULL, 0, &s) != PGD_OK) goto out;
        int64_t got = pgd_seq_match(b.cache, s, b.toks, b.prefix);
        int rc = got == (int64_t)b.prefix ? time_attn(&b, s, CHUNK, &obs_plain, &obs_scored) : -1;
        pgd_seq_destroy(b.cache, s);
        if (rc) {
            fprintf(stderr, PROG ": observation window timing failed\n");
            goto out;
        }
    }
    if (!cf->json) {
        printf("ctx %u: real prefix %u tokens %.2f s, replicated K/V of %u tokens written in "
               "%.2f s, page %" PRIu64 " B\n",
               ctx, cf->real, real_s, b.prefix - cf->real, fill_s, b.page_bytes);
        printf("ctx %u: scoring %u rows (an observation window) over %u keys, layer 0: "
               "%.3f ms -> %.3f ms scored (%.3fx)\n",
               ctx, CHUNK, b.prefix, obs_plain, obs_scored, obs_scored / obs_plain);
        printf("%-6s %-6s %-9s %8s %8s %8s %8s %9s %8s %7s %8s %13s %7s %13s %7s %7s %8s %6s\n",
               "ctx", "budget", "method", "tok/s", "x dense", "t/cpu-s", "x dense", "KV MiB",
               "x dense", "slots", "chunk s", "cmp ms/cpu", "sel cpu", "/step ms/cpu", "attn ms",
               "scored", "score x", "attn%");
    } else {
        printf("{\"ctx\": %u, \"real_prefix\": %u, \"real_prefix_s\": %.3f, \"fill_s\": %.3f, "
               "\"obs_rows\": %u, \"obs_attn_ms\": %.4f, \"obs_scored_ms\": %.4f, "
               "\"obs_score_ratio\": %.4f}\n",
               ctx, cf->real, real_s, fill_s, CHUNK, obs_plain, obs_scored, obs_scored / obs_plain);
    }
    print_run(&b, "dense", 0, &res[0], &res[0], cf->json);
    {
        const run_result *d = &res[0];
        const double step_ms = 1e3 * d->step_med_s, attn_ms = hp->n_layer * d->attn_ms;
        if (cf->json)
            printf("{\"ctx\": %u, \"dense_step_ms\": %.3f, \"dense_attn_ms\": %.3f, "
                   "\"attn_free_limit\": %.3f}\n",
                   ctx, step_ms, attn_ms, step_ms / (step_ms - attn_ms));
        else
            printf("ctx %u: dense decode step %.1f ms (median), attention %u x %.2f ms = %.1f ms "
                   "of it: with attention free a budget could reach %.2fx\n",
                   ctx, step_ms, hp->n_layer, d->attn_ms, attn_ms, step_ms / (step_ms - attn_ms));
    }
    fflush(stdout);
    uint32_t k = 1;
    for (int bi = 0; bi < cf->n_budget; bi++)
        for (int mi = 0; mi < cf->n_method; mi++, k++) {
            pgd_budget_params bp = pgd_budget_default_params(cf->methods[mi], cf->budgets[bi]);
            char why[160];
            if (cf->budgets[bi] >= b.prefix ||
                pgd_budget_params_check(&bp, hp->n_layer, why, sizeof why) != PGD_OK) {
                fprintf(stderr, PROG ": ctx %u, %s budget %u: %s, skipped\n", ctx,
                        pgd_budget_method_name(cf->methods[mi]), cf->budgets[bi],
                        cf->budgets[bi] >= b.prefix ? "not below the context" : why);
                continue;
            }
            if (run_one(&b, &bp, &res[k])) goto out;
            if (!res[k].ok) continue;
            print_run(&b, pgd_budget_method_name(cf->methods[mi]), cf->budgets[bi], &res[k],
                      &res[0], cf->json);
            fflush(stdout);
        }
    pgd_cache_stats cs;
    pgd_cache_get_stats(b.cache, &cs);
    if (cs.n_evictions)
        fprintf(stderr, PROG ": ctx %u: %" PRIu64 " pages were evicted (pool too small)\n", ctx,
                cs.n_evictions);
    *checksum = *checksum * 1000003 + b.checksum;
    ret = 0;
out:
    free(res);
    free(b.toks);
    free(b.logits);
    free(b.q);
    free(b.out);
    free(b.scores);
    pgd_attn_destroy(b.attn);
    pgd_seq_destroy(b.cache, b.d0);
    pe_tp_destroy(b.tp);
    pe_ctx_destroy(b.c);
    return ret;
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"model", required_argument, NULL, 'M'},
        {"ctx", required_argument, NULL, 'c'},
        {"budget", required_argument, NULL, 'b'},
        {"methods", required_argument, NULL, 'm'},
        {"steps", required_argument, NULL, 's'},
        {"threads", required_argument, NULL, 't'},
        {"real-prefix", required_argument, NULL, 'R'},
        {"reps", required_argument, NULL, 'r'},
        {NULL, 0, NULL, 0},
    };
    config cf = {.ctxs = {8192, 32768},
                 .n_ctx = 2,
                 .budgets = {1024, 2048},
                 .n_budget = 2,
                 .methods = {PGD_BUDGET_SNAPKV, PGD_BUDGET_STREAMING},
                 .n_method = 2,
                 .steps = 32,
                 .threads = 2,
                 .real = 64,
                 .reps = 9};
    bench_cli cli = {.prog = PROG,
                     .usage = usage,
                     .own = lo,
                     .optstring = "t:",
                     .common = BENCH_SEED | BENCH_JSON | BENCH_SMOKE,
                     .a = {.seed = 1}};
    char path[1024];
    for (;;) {
        int c = bench_cli_next(&cli, argc, argv);
        if (c == -1) break;
        uint64_t v = 0;
        int bad = 0;
        switch (c) {
        case 'M':
            cf.model_path = optarg;
            break;
        case 'c':
            cf.n_ctx = bench_parse_u32_list(optarg, cf.ctxs, MAX_LIST, 1);
            bad = cf.n_ctx < 1;
            break;
        case 'b':
            cf.n_budget = bench_parse_u32_list(optarg, cf.budgets, MAX_LIST, 1);
            bad = cf.n_budget < 1;
            break;
        case 'm':
            cf.n_method = parse_methods(optarg, cf.methods, MAX_LIST);
            bad = cf.n_method < 1;
            break;
        case 's':
            bad = bench_parse_u64(optarg, &v) || v < 1 || v > MAX_STEPS;
            cf.steps = (uint32_t)v;
            break;
        case 't':
            bad = bench_parse_u64(optarg, &v) || v < 1 || v > 1024;
            cf.threads = (uint32_t)v;
            break;
        case 'R':
            bad = bench_parse_u64(optarg, &v) || v < 1 || v > 4096;
            cf.real = (uint32_t)v;
            break;
        case 'r':
            bad = bench_parse_u64(optarg, &v) || v < 1 || v > MAX_REPS;
            cf.reps = (uint32_t)v;
            break;
        }
        if (bad) {
            fprintf(stderr, PROG ": bad value '%s' (see --help)\n", optarg);
            return 2;
        }
    }
    if (cli.status >= 0) return cli.status;
    if (optind != argc) {
        fprintf(stderr, PROG ": unexpected argument %s (see --help)\n", argv[optind]);
        return 2;
    }
    cf.seed = cli.a.seed;
    cf.json = cli.a.json;
    if (cli.a.smoke) {
        const char *dir = getenv("PGD_MODELS_DIR");
        snprintf(path, sizeof path, "%s/stories260K.gguf",
                 dir ? dir : PGD_SOURCE_DIR "/../shared/models");
        if (access(path, R_OK) != 0) {
            fprintf(stderr, PROG " --smoke: %s not found, skipped\n", path);
            return 77; /* ctest: skipped (bench/CMakeLists.txt) */
        }
        cf.model_path = path;
        cf.ctxs[0] = 256;
        cf.n_ctx = 1;
        cf.budgets[0] = 64;
        cf.n_budget = 1;
        cf.steps = 20; /* past a page: streaming compacts during decode */
        cf.real = 32;
        cf.reps = 3;
    }
    if (!cf.model_path) {
        if (synth_model(path, sizeof path)) return 1;
        cf.model_path = path;
    }
    for (int i = 0; i < cf.n_ctx; i++)
        if (cf.ctxs[i] % 16 || cf.ctxs[i] < CHUNK + cf.real + 16 || cf.real % 16) {
            fprintf(stderr,
                    PROG ": --ctx %u: contexts are multiples of 16 of at least %u tokens, and "
                         "--real-prefix a multiple of 16\n",
                    cf.ctxs[i], CHUNK + cf.real + 16);
            return 2;
        }
    char err[512];
    pe_model *m;
    if (pe_model_load(cf.model_path, touch, NULL, &m, err, sizeof err)) {
        fprintf(stderr, PROG ": %s\n", err);
        return 1;
    }
    const pe_hparams *hp = pe_model_hparams(m);
    if (!cf.json)
        printf("model %s: %.2f GiB of weights, %u layers, %u/%u heads, head_dim %u; %u threads, "
               "isa %s; f16 KV, %u decode steps\n",
               cf.model_path, pe_model_weight_bytes(m) / 1073741824.0, hp->n_layer, hp->n_head,
               hp->n_head_kv, hp->head_dim, cf.threads, pe_isa_name(pe_isa_detect()), cf.steps);
    uint64_t checksum = 0;
    int rc = 0;
    for (int i = 0; i < cf.n_ctx && !rc; i++)
        rc = bench_ctx(&cf, m, cf.ctxs[i], &checksum);
    if (!rc) bench_print_checksum(checksum, cf.json);
    pe_model_destroy(m);
    return rc ? 1 : 0;
}
