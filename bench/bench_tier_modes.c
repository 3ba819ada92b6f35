/* SPDX-License-Identifier: MIT */
/*
 * bench_tier_modes.c - write-back against write-through for the disk tier (issue 11,
 * "Movement": "measure both modes and say which is default and why").
 *
 * The same serving-like workload runs through the scheduler (engine/runtime/scheduler.h)
 * on a context with a RAM tier over a disk tier, once per mode:
 *   write-back       the default: pages the pool evicts go to the RAM tier, what the RAM
 *                    tier evicts to the disk tier (pgd_tier_use.write_through = 0)
 *   write-through    every committed page is also written to the disk tier at once
 *   write-through=N  only blocks matched N times (admit_hits = N; default 2)
 * The workload: S system prompts x R requests, each a system prompt plus a user suffix,
 * a share of them repeating an earlier request's prompt (a retry, a second user with the
 * same question); a closed loop keeps C requests in flight, each generating G tokens.
 * The pool holds a few requests' worth of pages, the RAM tier a quarter of the workload's
 * distinct prompt blocks, the disk tier all of them: so write-back reaches the disk too.
 *
 * Per mode it prints throughput (prompt + completion tokens per second of wall time) and
 * TTFT (submit to first token, median and p90), each against write-back in the same run;
 * the records and bytes written to the disk tier (pgd_tier_stats n_puts, n_put_bytes) and
 * to the RAM tier; pages dropped by a full write-back queue; and what a crash would lose:
 * right after the last request finished, with no pgd_cache_flush and no write-back at
 * exit, the share of the workload's distinct prompt blocks the disk tier holds (the
 * records a restart after kill -9 would serve; records still queued are lost), then the
 * same after pgd_cache_flush (what a clean SIGTERM stop of `pagoda serve` keeps).
 * With --reps N the modes run round-robin N times; medians are printed.
 * "outputs" compares each mode's greedy tokens with write-back's (request by request).
 * The modes batch differently (a prompt promoted from disk waits while others run), so
 * without --deterministic (batch-invariant matrix products) a near-tie on a random-weight
 * model can flip a token: DIFF is a finding only with --deterministic.
 *
 *   bench_tier_modes --model M.gguf [--requests 256] [--concurrency 8] [-t 2] [--dir D]
 *   bench_tier_modes --smoke      stories260K from ../shared/models, tiny sizes (ctest)
 */
#define _GNU_SOURCE
#include "bench_tier_common.h"
#include "scheduler.h"

static void usage(FILE *f)
{
    fputs("usage: bench_tier_modes --model FILE [options]\n"
          "  --model FILE        GGUF model (llama architecture)\n"
          "  --requests N        requests per mode (default 256)\n"
          "  --systems N         distinct system prompts (default 4)\n"
          "  --system-tokens N   tokens of each system prompt (default 192)\n"
          "  --user-tokens N     tokens of each user suffix (default 48)\n"
          "  --repeat PCT        percent of requests repeating an earlier prompt (default 25)\n"
          "  --gen N             tokens generated per request (default 16)\n"
          "  --concurrency N     requests in flight (closed loop; default 8)\n"
          "  --admit N           N of the write-through=N mode (default 2)\n"
          "  --pool-pages N      pool pages (default: 2 x concurrency x pages per request)\n"
          "  --ram-pages N       RAM tier records (default: a quarter of the distinct blocks)\n"
          "  -t N                threads (default 2)\n"
          "  --dir DIR           where the disk tier's directories are made ($TMPDIR or /tmp)\n"
          "  --reps N            round-robin repetitions of the three modes (default 1)\n"
          "  --deterministic     batch-invariant matrix products (pe_ctx_params.deterministic)\n"
          "  --seed S            workload seed (default 1)\n"
          "  --json              one JSON object per result line\n"
          "  --smoke             tiny run on stories260K (skips when absent)\n"
          "  --help\n",
          f);
}

enum { N_MODES = 3, MAX_REPS = 9 };

typedef struct bench {
    const char *model_path;
    const char *parent; /* where the disk tiers' directories are made */
    uint32_t n_requests, n_systems, system_tokens, user_tokens, repeat_pct, gen;
    uint32_t concurrency, admit, threads, reps;
    int deterministic;
    uint64_t pool_pages, ram_pages;
    int json;
    pe_model *m;
    uint32_t n_vocab, page_tokens, n_ctx;
    int32_t *toks;     /* every request's prompt, back to back */
    uint32_t *off;     /* [n_requests + 1]: request i is toks[off[i] .. off[i + 1]) */
    uint64_t n_blocks; /* distinct full-page blocks of the prompts */
    uint64_t page_bytes;
} bench;

/* One mode's figures, from one repetition. */
typedef struct result {
    double wall_s, tok_s, ttft_p50_ms, ttft_p90_ms;
    double cpu_s;           /* process CPU seconds (compute + movers + I/O): steadier than wall time
                               on a loaded machine */
    uint64_t tokens;        /* prompt + completion tokens served */
    uint64_t cached_tokens; /* prompt tokens matched (pool + tiers) */
    uint64_t disk_puts, disk_bytes;  /* written to the disk tier */
    uint64_t ram_puts, ram_bytes;    /* written to the RAM tier */
    uint64_t dropped;                /* pages a full write-back queue dropped (both tiers) */
    uint64_t queued_at_end;          /* write-back queue depth when the last request ended */
    uint64_t held_crash, held_flush; /* distinct blocks on disk: at the end, after a flush */
    uint64_t ram_hit_tokens;         /* prompt tokens promoted from the RAM tier */
    uint64_t disk_hit_tokens;        /* prompt tokens promoted from the disk tier */
    uint64_t checksum;               /* of the generated tokens, in request order */
} result;

static const char *mode_name(const bench *b, int mode, char *buf, size_t cap)
{
    if (mode == 0) return "write-back";
    if (mode == 1) return "write-through";
    snprintf(buf, cap, "write-through=%u", b->admit);
    return buf;
}

/* ---- the workload ---- */

static void fill_random(int32_t *t, uint32_t n, uint32_t n_vocab, uint64_t *seed)
{
    for (uint32_t i = 0; i < n; i++)
        t[i] = 3 + (int32_t)(bench_rng(seed) % (n_vocab - 3));
}

/* S system prompts (each starting with BOS), then per request a system prompt and a new
 * user suffix, or (repeat_pct percent of the time, after the first) an earlier request's
 * prompt again. Returns 0 or -1. */
static int make_workload(bench *b, uint64_t seed)
{
    const uint32_t plen = b->system_tokens + b->user_tokens;
    int32_t *sys = malloc((size_t)b->n_systems * b->system_tokens * sizeof *sys);
    b->toks = malloc((size_t)b->n_requests * plen * sizeof *b->toks);
    b->off = malloc((b->n_requests + 1) * sizeof *b->off);
    if (!sys || !b->toks || !b->off) {
        free(sys);
        return -1;
    }
    for (uint32_t s = 0; s < b->n_systems; s++) {
        int32_t *p = sys + (size_t)s * b->system_tokens;
        p[0] = 1;
        fill_random(p + 1, b->system_tokens - 1, b->n_vocab, &seed);
    }
    for (uint32_t i = 0; i < b->n_requests; i++) {
        int32_t *p = b->toks + (size_t)i * plen;
        b->off[i] = i * plen;
        if (i > 0 && bench_rng(&seed) % 100 < b->repeat_pct) {
            uint32_t j = (uint32_t)(bench_rng(&seed) % i);
            memcpy(p, b->toks + (size_t)j * plen, plen * sizeof *p);
            continue;
        }
        uint32_t s = (uint32_t)(bench_rng(&seed) % b->n_systems);
        memcpy(p, sys + (size_t)s * b->system_tokens, b->system_tokens * sizeof *p);
        fill_random(p + b->system_tokens, b->user_tokens, b->n_vocab, &seed);
    }
    b->off[b->n_requests] = b->n_requests * plen;
    free(sys);
    return 0;
}

static int cmp_hash(const void *x, const void *y)
{
    const pgd_hash *a = x, *b = y;
    if (a->hi != b->hi) return a->hi < b->hi ? -1 : 1;
    if (a->lo != b->lo) return a->lo < b->lo ? -1 : 1;
    return 0;
}

/* The distinct block hashes of the prompts under c's key (default tenant, as the
 * scheduler hashes them), sorted, into *out (caller frees). Returns the count or -1. */
static int64_t distinct_blocks(const bench *b, pgd_cache *c, pgd_hash **out)
{
    const uint32_t per = (b->system_tokens + b->user_tokens) / b->page_tokens;
    pgd_hash *h = malloc(((size_t)b->n_requests * per + 1) * sizeof *h);
    size_t n = 0, k = 0;
    if (!h) return -1;
    for (uint32_t i = 0; i < b->n_requests; i++)
        n += pgd_cache_hash_tokens(c, NULL, 0, b->toks + b->off[i], b->off[i + 1] - b->off[i],
                                   h + n, per);
    qsort(h, n, sizeof *h, cmp_hash);
    for (size_t i = 0; i < n; i++)
        if (k == 0 || cmp_hash(&h[k - 1], &h[i])) h[k++] = h[i];
    *out = h;
    return (int64_t)k;
}

/* ---- one run through the scheduler ---- */

typedef struct run {
    const bench *b;
    pe_sched *s;
    double *submit_t; /* [n_requests] */
    double *ttft_s;   /* [n_requests]; < 0 until the first token */
    uint64_t *out_h;  /* [n_requests]: hash of each request's generated tokens */
    uint32_t next, done, in_flight;
    uint64_t tokens, cached_tokens, ram_hit_tokens, disk_hit_tokens, checksum;
    int failed;
} run;

typedef struct slot {
    run *r;
    uint32_t i;
} slot;

static void on_token(void *ud, uint64_t id, int32_t token, pe_finish reason, const pe_usage *u)
{
    slot *sl = ud;
    run *r = sl->r;
    (void)id;
    if (reason == PE_FINISH_NONE) {
        if (r->ttft_s[sl->i] < 0) r->ttft_s[sl->i] = bench_now_s() - r->submit_t[sl->i];
        r->out_h[sl->i] = r->out_h[sl->i] * 31 + (uint64_t)token + 1;
        return;
    }
    if (reason == PE_FINISH_ERROR) r->failed = 1;
    r->tokens += u->prompt_tokens + u->completion_tokens;
    r->cached_tokens += u->cached_tokens;
    if (u->n_tiers == 2) { /* tiers[0] RAM, tiers[1] disk; none on the warm-up context */
        r->ram_hit_tokens += u->cached_tier_tokens[0];
        r->disk_hit_tokens += u->cached_tier_tokens[1];
    }
    r->done++;
    r->in_flight--;
}

/* Runs every request through the scheduler on ctx, C at a time. Returns 0 or -1. */
static int run_workload(const bench *b, pe_ctx *ctx, uint32_t n_requests, run *r)
{
    pe_sched_params sp = pe_sched_default_params();
    pe_request_params rp = pe_request_default_params();
    slot *slots = malloc(n_requests * sizeof *slots);
    int rc = -1;
    memset(r, 0, sizeof *r);
    r->b = b;
    r->submit_t = malloc(n_requests * sizeof *r->submit_t);
    r->ttft_s = malloc(n_requests * sizeof *r->ttft_s);
    r->out_h = calloc(n_requests, sizeof *r->out_h);
    sp.model = b->m;
    sp.max_running = b->concurrency;
    sp.max_queued = b->concurrency;
    rp.max_tokens = b->gen;
    if (!slots || !r->submit_t || !r->ttft_s || !r->out_h || pe_sched_create(ctx, &sp, &r->s) != 0)
        goto out;
    while (r->done < n_requests) {
        while (r->in_flight < b->concurrency && r->next < n_requests) {
            uint32_t i = r->next;
            uint64_t id;
            slots[i] = (slot){r, i};
            r->ttft_s[i] = -1;
            r->submit_t[i] = bench_now_s();
            if (pe_sched_submit(r->s, &rp, b->toks + b->off[i], b->off[i + 1] - b->off[i], on_token,
                                &slots[i], &id) != 0) {
                fprintf(stderr, "bench_tier_modes: submit of request %u failed\n", i);
                goto out;
            }
            r->next++;
            r->in_flight++;
        }
        int n = pe_sched_step(r->s);
        if (n < 0) {
            fprintf(stderr, "bench_tier_modes: step: %s\n", pgd_strerror(n));
            goto out;
        }
        if (n == 0) {
            pe_sched_stats st;
            pe_sched_get_stats(r->s, &st);
            if (!st.n_running && !st.n_waiting && r->done < n_requests && !r->in_flight) break;
        }
    }
    if (r->failed || r->done != n_requests) {
        fprintf(stderr, "bench_tier_modes: %u of %u requests done%s\n", r->done, n_requests,
                r->failed ? ", some failed" : "");
        goto out;
    }
    /* greedy outputs, in request order (not completion order): equal in every mode */
    for (uint32_t i = 0; i < n_requests; i++)
        r->checksum = r->checksum * 1000003 + r->out_h[i];
    rc = 0;
out:
    pe_sched_destroy(r->s);
    r->s = NULL;
    free(slots);
    return rc;
}

static void run_free(run *r)
{
    free(r->submit_t);
    free(r->ttft_s);
    free(r->out_h);
}

/* ---- one mode ---- */

static double quantile(double *x, uint32_t n, double q)
{
    qsort(x, n, sizeof *x, bench_cmp_double);
    uint32_t k = (uint32_t)(q * (n - 1) + 0.5);
    return x[k < n ? k : n - 1];
}

/* Runs the workload with tiers in mode (0 write-back, 1 write-through, 2 write-through=N)
 * in a fresh directory. Returns 0 or -1. */
static int run_mode(bench *b, int mode, result *res)
{
    char dir[1024];
    const char *what;
    pgd_tier *ram = NULL, *disk = NULL;
    pgd_tier_use use[2];
    uint8_t key[32];
    pe_ctx *ctx = NULL;
    pgd_hash *blocks = NULL;
    run r = {0};
    int rc = -1;
    memset(res, 0, sizeof *res);
    if (bench_tier_mkdtemp("bench_tier_modes", b->parent, "bench_tier_modes", dir, sizeof dir))
        return -1;
    /* RAM tier records carry a 128-byte header beside the page */
    if (bench_tier_open(b->ram_pages * (b->page_bytes + 128), dir,
                        2 * (b->n_blocks + 64) * (b->page_bytes + 4096), 0, &ram, &disk, key,
                        &what) != PGD_OK) {
        fprintf(stderr, "bench_tier_modes: cannot create the tiers in %s\n", dir);
        goto out;
    }
    use[0] = (pgd_tier_use){.tier = ram};
    use[1] = (pgd_tier_use){
        .tier = disk, .write_through = mode != 0, .admit_hits = mode == 2 ? b->admit : 0};
    pe_ctx_params cp = pe_ctx_default_params();
    cp.n_ctx = b->n_ctx;
    cp.n_threads = b->threads;
    cp.kv_tokens = b->pool_pages * b->page_tokens;
    cp.deterministic = b->deterministic;
    bench_tier_ctx_tiers(&cp, use, key);
    if (bench_tier_ctx_create("bench_tier_modes", b->m, &cp, &ctx)) goto out;
    pgd_cache *c = pe_ctx_cache(ctx);
    int64_t nb = distinct_blocks(b, c, &blocks);
    if (nb < 0) goto out;

    double t0 = bench_now_s(), c0 = bench_clock_s(CLOCK_PROCESS_CPUTIME_ID);
    if (run_workload(b, ctx, b->n_requests, &r)) goto out;
    res->wall_s = bench_now_s() - t0;
    res->cpu_s = bench_clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;

    /* The crash point: the last request has finished; nothing is flushed. */
    pgd_cache_tier_stats cs;
    pgd_cache_get_tier_stats(c, 1, &cs);
    res->queued_at_end = cs.writeback_depth;
    for (int64_t k = 0; k < nb; k++)
        res->held_crash += pgd_tier_lookup(disk, &blocks[k], 1);
    pgd_cache_flush(c);
    for (int64_t k = 0; k < nb; k++)
        res->held_flush += pgd_tier_lookup(disk, &blocks[k], 1);

    pgd_tier_stats ts;
    pgd_tier_get_stats(disk, &ts);
    res->disk_puts = ts.n_puts;
    res->disk_bytes = ts.n_put_bytes;
    pgd_tier_get_stats(ram, &ts);
    res->ram_puts = ts.n_puts;
    res->ram_bytes = ts.n_put_bytes;
    for (uint32_t t = 0; t < 2; t++) {
        pgd_cache_get_tier_stats(c, t, &cs);
        res->dropped += cs.demote_dropped;
    }
    res->tokens = r.tokens;
    res->cached_tokens = r.cached_tokens;
    res->ram_hit_tokens = r.ram_hit_tokens;
    res->disk_hit_tokens = r.disk_hit_tokens;
    res->tok_s = (double)r.tokens / res->wall_s;
    res->ttft_p50_ms = 1e3 * quantile(r.ttft_s, b->n_requests, 0.5);
    res->ttft_p90_ms = 1e3 * quantile(r.ttft_s, b->n_requests, 0.9);
    res->checksum = r.checksum;
    rc = 0;
out:
    run_free(&r);
    free(blocks);
    pe_ctx_destroy(ctx);
    pgd_tier_close(ram);
    pgd_tier_close(disk);
    bench_tier_rm_tree(dir);
    return rc;
}

/* ---- output ---- */

static double med(const result *x, uint32_t n, size_t field)
{
    double v[MAX_REPS];
    for (uint32_t k = 0; k < n; k++)
        v[k] = *(const double *)((const char *)&x[k] + field);
    return bench_median(v, n);
}

static uint64_t med_u(const result *x, uint32_t n, size_t field)
{
    double v[MAX_REPS];
    for (uint32_t k = 0; k < n; k++)
        v[k] = (double)*(const uint64_t *)((const char *)&x[k] + field);
    return (uint64_t)(bench_median(v, n) + 0.5);
}

#define MED(f) med(res[m], b->reps, offsetof(result, f))
#define MEDU(f) med_u(res[m], b->reps, offsetof(result, f))

static void print_results(const bench *b, result res[N_MODES][MAX_REPS])
{
    char buf[32];
    const double wb_tok = med(res[0], b->reps, offsetof(result, tok_s));
    const double wb_ttft = med(res[0], b->reps, offsetof(result, ttft_p50_ms));
    const double wb_cpu = med(res[0], b->reps, offsetof(result, cpu_s));
    if (!b->json)
        printf("%-17s %9s %7s %9s %7s %9s %8s %7s %8s %9s %8s %9s %7s %6s %9s %9s %8s %8s %s\n",
               "mode", "tok/s", "vs wb", "ttft p50", "vs wb", "ttft p90", "cpu s", "vs wb",
               "disk rec", "disk MiB", "ram rec", "ram MiB", "dropped", "queued", "crash",
               "flushed", "ram hit", "disk hit", "outputs");
    for (int m = 0; m < N_MODES; m++) {
        const char *name = mode_name(b, m, buf, sizeof buf);
        const double tok = MED(tok_s), p50 = MED(ttft_p50_ms), p90 = MED(ttft_p90_ms);
        const double cpu = MED(cpu_s);
        const uint64_t crash = MEDU(held_crash), flushed = MEDU(held_flush);
        const char *same = "same";
        for (uint32_t k = 0; k < b->reps; k++)
            if (res[m][k].checksum != res[0][k].checksum) same = "DIFF";
        if (b->json) {
            printf("{\"test\": \"tier_modes\", \"mode\": \"%s\", \"tok_per_s\": %.1f, "
                   "\"tok_vs_write_back\": %.3f, \"ttft_p50_ms\": %.2f, \"ttft_vs_write_back\": "
                   "%.3f, \"ttft_p90_ms\": %.2f, \"cpu_s\": %.3f, \"cpu_vs_write_back\": %.3f, "
                   "\"disk_records\": %" PRIu64 ", \"disk_bytes\": %" PRIu64
                   ", \"ram_records\": %" PRIu64 ", \"ram_bytes\": %" PRIu64
                   ", \"dropped\": %" PRIu64 ", \"queued_at_end\": %" PRIu64
                   ", \"blocks\": %" PRIu64 ", \"disk_blocks_crash\": %" PRIu64
                   ", \"disk_blocks_flushed\": %" PRIu64 ", \"cached_tokens\": %" PRIu64
                   ", \"ram_hit_tokens\": %" PRIu64 ", \"disk_hit_tokens\": %" PRIu64
                   ", \"outputs\": \"%s\"}\n",
                   name, tok, tok / wb_tok, p50, p50 / wb_ttft, p90, cpu, cpu / wb_cpu,
                   MEDU(disk_puts), MEDU(disk_bytes), MEDU(ram_puts), MEDU(ram_bytes),
                   MEDU(dropped), MEDU(queued_at_end), b->n_blocks, crash, flushed,
                   MEDU(cached_tokens), MEDU(ram_hit_tokens), MEDU(disk_hit_tokens), same);
        } else {
            printf("%-17s %9.1f %6.3fx %7.2fms %6.3fx %7.2fms %8.2f %6.3fx %8" PRIu64
                   " %9.2f %8" PRIu64 " %9.2f %7" PRIu64 " %6" PRIu64 " %8.1f%% %8.1f%% %8" PRIu64
                   " %8" PRIu64 " %s\n",
                   name, tok, tok / wb_tok, p50, p50 / wb_ttft, p90, cpu, cpu / wb_cpu,
                   MEDU(disk_puts), MEDU(disk_bytes) / 1048576.0, MEDU(ram_puts),
                   MEDU(ram_bytes) / 1048576.0, MEDU(dropped), MEDU(queued_at_end),
                   100.0 * (double)crash / (double)b->n_blocks,
                   100.0 * (double)flushed / (double)b->n_blocks, MEDU(ram_hit_tokens),
                   MEDU(disk_hit_tokens), same);
        }
    }
}

/* ---- main ---- */

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"model", required_argument, NULL, 'M'},
        {"requests", required_argument, NULL, 'n'},
        {"systems", required_argument, NULL, 'S'},
        {"system-tokens", required_argument, NULL, 'y'},
        {"user-tokens", required_argument, NULL, 'u'},
        {"repeat", required_argument, NULL, 'p'},
        {"gen", required_argument, NULL, 'g'},
        {"concurrency", required_argument, NULL, 'c'},
        {"admit", required_argument, NULL, 'a'},
        {"pool-pages", required_argument, NULL, 'P'},
        {"ram-pages", required_argument, NULL, 'R'},
        {"dir", required_argument, NULL, 'd'},
        {"reps", required_argument, NULL, 'r'},
        {"deterministic", no_argument, NULL, 'D'},
        {NULL, 0, NULL, 0},
    };
    bench b = {.n_requests = 256,
               .n_systems = 4,
               .system_tokens = 192,
               .user_tokens = 48,
               .repeat_pct = 25,
               .gen = 16,
               .concurrency = 8,
               .admit = 2,
               .threads = 2,
               .reps = 1};
    static result res[N_MODES][MAX_REPS];
    char smoke_path[1024], buf[32];
    bench_cli cli = {.prog = "bench_tier_modes",
                     .usage = usage,
                     .own = lo,
                     .optstring = "t:",
                     .common = BENCH_SEED | BENCH_JSON | BENCH_SMOKE,
                     .a = {.seed = 1}};
    b.parent = bench_tier_tmpdir();
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (;;) {
        int c = bench_cli_next(&cli, argc, argv);
        if (c == -1) break;
        uint64_t v = 0;
        if (c != 'M' && c != 'd' && c != 'D' && (bench_parse_u64(optarg, &v) || v > (1u << 24))) {
            fprintf(stderr, "bench_tier_modes: bad number '%s'\n", optarg);
            return 2;
        }
        switch (c) {
        case 'M':
            b.model_path = optarg;
            break;
        case 'n':
            b.n_requests = (uint32_t)v;
            break;
        case 'S':
            b.n_systems = (uint32_t)v;
            break;
        case 'y':
            b.system_tokens = (uint32_t)v;
            break;
        case 'u':
            b.user_tokens = (uint32_t)v;
            break;
        case 'p':
            b.repeat_pct = v <= 100 ? (uint32_t)v : 25;
            break;
        case 'g':
            b.gen = (uint32_t)v;
            break;
        case 'c':
            b.concurrency = (uint32_t)v;
            break;
        case 'a':
            b.admit = (uint32_t)v;
            break;
        case 'P':
            b.pool_pages = v;
            break;
        case 'R':
            b.ram_pages = v;
            break;
        case 't':
            b.threads = (uint32_t)v;
            break;
        case 'd':
            b.parent = optarg;
            break;
        case 'D':
            b.deterministic = 1;
            break;
        case 'r':
            b.reps = v >= 1 && v <= MAX_REPS ? (uint32_t)v : 1;
            break;
        }
    }
    if (cli.status >= 0) return cli.status;
    if (optind != argc) {
        fprintf(stderr, "bench_tier_modes: unexpected argument %s (see --help)\n", argv[optind]);
        return 2;
    }
    b.json = cli.a.json;
    if (cli.a.smoke) {
        if (bench_tier_smoke_model("bench_tier_modes", smoke_path, sizeof smoke_path)) return 77;
        b.model_path = smoke_path;
        b.n_requests = 24;
        b.n_systems = 2;
        b.system_tokens = 48;
        b.user_tokens = 32;
        b.gen = 4;
        b.concurrency = 2; /* pool 28 pages < 38 distinct blocks: pages get evicted */
        b.reps = 1;
    }
    if (!b.model_path || !b.threads || !b.n_requests || !b.n_systems || !b.concurrency ||
        !b.admit || b.system_tokens < 2 || !b.user_tokens) {
        usage(stderr);
        return 2;
    }

    const pe_hparams *hp = bench_tier_model_load("bench_tier_modes", b.model_path, &b.m,
                                                 &b.page_tokens, &b.page_bytes);
    if (!hp) return 1;
    b.n_vocab = hp->n_vocab;
    const uint32_t plen = b.system_tokens + b.user_tokens;
    const uint32_t req_pages = (plen + b.gen + b.page_tokens - 1) / b.page_tokens + 1;
    b.n_ctx = (req_pages + 1) * b.page_tokens;
    if (!b.pool_pages) b.pool_pages = 2ull * b.concurrency * req_pages;
    int ok = -1;
    if (make_workload(&b, cli.a.seed ? cli.a.seed : 1)) goto out;

    /* Warm-up on a context without tiers (weights and allocator warm for every mode), and
     * the distinct block count (it does not depend on the key). */
    {
        pe_ctx *plain;
        pe_ctx_params cp = pe_ctx_default_params();
        pgd_hash *blocks = NULL;
        run r;
        cp.n_ctx = b.n_ctx;
        cp.n_threads = b.threads;
        cp.kv_tokens = b.pool_pages * b.page_tokens;
        cp.deterministic = b.deterministic;
        if (bench_tier_ctx_create("bench_tier_modes", b.m, &cp, &plain)) goto out;
        int64_t nb = distinct_blocks(&b, pe_ctx_cache(plain), &blocks);
        free(blocks);
        uint32_t warm = b.n_requests < b.concurrency ? b.n_requests : b.concurrency;
        int wrc = nb < 0 ? -1 : run_workload(&b, plain, warm, &r);
        run_free(&r);
        pe_ctx_destroy(plain);
        if (wrc) goto out;
        b.n_blocks = (uint64_t)nb;
    }
    if (!b.n_blocks) {
        fprintf(stderr, "bench_tier_modes: the prompts hold no full page of %u tokens\n",
                b.page_tokens);
        goto out;
    }
    if (!b.ram_pages) b.ram_pages = b.n_blocks / 4 ? b.n_blocks / 4 : 1;
    if (!b.json)
        printf("model %s, %u threads; %u requests (%u system prompts x %u tokens + %u user "
               "tokens, %u%% repeated, %u generated), %u in flight; %" PRIu64
               " distinct prompt blocks of %.1f KiB; pool %" PRIu64 " pages, RAM tier %" PRIu64
               " records, disk tier all; %u rep%s\n",
               b.model_path, b.threads, b.n_requests, b.n_systems, b.system_tokens, b.user_tokens,
               b.repeat_pct, b.gen, b.concurrency, b.n_blocks, b.page_bytes / 1024.0, b.pool_pages,
               b.ram_pages, b.reps, b.reps > 1 ? "s" : "");

    uint64_t checksum = 0;
    for (uint32_t k = 0; k < b.reps; k++)
        for (int m = 0; m < N_MODES; m++) {
            if (run_mode(&b, m, &res[m][k])) {
                fprintf(stderr, "bench_tier_modes: mode %s failed\n",
                        mode_name(&b, m, buf, sizeof buf));
                goto out;
            }
            checksum = checksum * 31 + res[m][k].checksum;
        }
    print_results(&b, res);
    bench_print_checksum(checksum, b.json);
    ok = 0;
out:
    free(b.toks);
    free(b.off);
    pe_model_destroy(b.m);
    return ok ? 1 : 0;
}
