/* SPDX-License-Identifier: MIT */
/*
 * bench_threadpool.c - dispatch latency of the engine's thread pool (engine/ops/threadpool.h):
 * the wall time of one pe_tp_run of a few trivial tasks, per thread count and task count.
 * A decode step issues ~130 runs per token, so a run should cost a few microseconds.
 *
 * Each figure is the median over --reps repetitions of --runs back-to-back runs (one
 * untimed warm-up of --runs / 20 runs first, which also wakes the workers). Every task
 * bumps its own counter (one writer per task and run, no atomics), and the checksum is
 * sum over tasks of count * (task + 1): a pool that skips or repeats tasks shows up there,
 * and the bench fails when it differs from the expected value.
 *
 * --work N gives each task N steps of a dependent integer chain (~1 ns each), so that the
 * workers have time to join: "worker%" is the share of the tasks that the workers ran
 * (the rest ran on the calling thread), and us/run minus the 1-thread figure is what the
 * pool costs or saves.
 */
#include "bench.h"
#include "threadpool.h"

enum { MAX_TASKS = 256 };

typedef struct counts {
    uint64_t n[MAX_TASKS];         /* runs that executed task i */
    uint64_t by_worker[MAX_TASKS]; /* of those, runs where a worker (thread > 0) ran it */
    uint64_t sink[MAX_TASKS];      /* the work chain's result, so it is not optimized out */
    uint64_t work;                 /* steps of the chain per task */
} counts;

static void count_task(void *ctx, uint32_t task, uint32_t thread)
{
    counts *c = ctx;
    uint64_t x = c->sink[task] | 1;
    for (uint64_t i = 0; i < c->work; i++)
        x = x * 6364136223846793005u + 1442695040888963407u;
    c->sink[task] = x;
    c->by_worker[task] += thread > 0;
    c->n[task]++;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_threadpool [options]\n"
               "Wall time of one pe_tp_run of trivial tasks (the engine's dispatch cost).\n"
               "  --threads LIST  pool sizes (default 1,2,4)\n"
               "  --tasks LIST    tasks per run, at most 256 (default 2,16)\n"
               "  --runs N        runs per timed repetition (default 20000)\n"
               "  --reps N        timed repetitions, median reported (default 5)\n"
               "  --work N        steps of work per task, ~1 ns each (default 0)\n"
               "  --json          one JSON object per result line\n"
               "  --smoke         tiny and fast (200 runs, 1 rep): for ctest\n"
               "  --help          show this help\n");
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"threads", required_argument, NULL, 't'}, {"tasks", required_argument, NULL, 'n'},
        {"runs", required_argument, NULL, 'r'},    {"reps", required_argument, NULL, 'R'},
        {"work", required_argument, NULL, 'w'},    {NULL, 0, NULL, 0},
    };
    bench_cli cli = {
        .prog = "bench_threadpool", .usage = usage, .own = lo, .common = BENCH_JSON | BENCH_SMOKE};
    uint32_t threads[8] = {1, 2, 4}, tasks[8] = {2, 16};
    int n_threads = 3, n_tasks = 2;
    uint64_t runs = 20000, reps = 5, work = 0;
    for (;;) {
        int c = bench_cli_next(&cli, argc, argv);
        if (c == -1) break;
        int bad = 0;
        if (c == 't') {
            n_threads = bench_parse_u32_list(optarg, threads, 8, 1);
            bad = n_threads < 1;
        } else if (c == 'n') {
            n_tasks = bench_parse_u32_list(optarg, tasks, 8, 1);
            bad = n_tasks < 1;
            for (int i = 0; !bad && i < n_tasks; i++)
                bad = tasks[i] > MAX_TASKS;
        } else {
            bad = bench_parse_u64(optarg, c == 'r' ? &runs : c == 'w' ? &work : &reps) != 0;
        }
        if (bad) {
            fprintf(stderr, "bench_threadpool: bad option value '%s' (see --help)\n", optarg);
            return 2;
        }
    }
    if (cli.status >= 0) return cli.status;
    if (optind != argc || runs < 1 || runs > 100000000 || reps < 1 || reps > 1000 ||
        work > 100000000) {
        usage(stderr);
        return 2;
    }
    if (cli.a.smoke) {
        runs = 200;
        reps = 1;
    }
    const uint64_t warmup = runs / 20 + 1;
    if (!cli.a.json) {
        printf("bench_threadpool: %" PRIu64 " runs per repetition, median of %" PRIu64
               ", work %" PRIu64 " per task\n",
               runs, reps, work);
        printf("%7s %5s %12s %12s %8s\n", "threads", "tasks", "us/run", "Mruns/s", "worker%");
    }
    static counts cnt;
    double t[1000];
    uint64_t checksum = 0, expect = 0;
    for (int ti = 0; ti < n_threads; ti++) {
        pe_threadpool *tp = pe_tp_create(threads[ti]);
        if (!tp) {
            fprintf(stderr, "bench_threadpool: cannot start %u threads\n", threads[ti]);
            return 1;
        }
        for (int ni = 0; ni < n_tasks; ni++) {
            const uint32_t n = tasks[ni];
            memset(&cnt, 0, sizeof cnt);
            cnt.work = work;
            for (uint64_t i = 0; i < warmup; i++)
                pe_tp_run(tp, count_task, &cnt, n);
            for (uint64_t r = 0; r < reps; r++) {
                double t0 = bench_now_s();
                for (uint64_t i = 0; i < runs; i++)
                    pe_tp_run(tp, count_task, &cnt, n);
                t[r] = (bench_now_s() - t0) / (double)runs;
            }
            uint64_t n_worker = 0;
            for (uint32_t i = 0; i < n; i++) {
                checksum += cnt.n[i] * (i + 1);
                expect += (warmup + reps * runs) * (i + 1);
                n_worker += cnt.by_worker[i];
            }
            const double share = 100.0 * (double)n_worker / ((double)(warmup + reps * runs) * n);
            const double us = bench_median(t, (size_t)reps) * 1e6;
            if (cli.a.json)
                printf("{\"threads\": %u, \"tasks\": %u, \"work\": %" PRIu64
                       ", \"us_per_run\": %.3f, \"worker_pct\": %.1f}\n",
                       pe_tp_n_threads(tp), n, work, us, share);
            else
                printf("%7u %5u %12.3f %12.3f %8.1f\n", pe_tp_n_threads(tp), n, us, 1.0 / us,
                       share);
        }
        pe_tp_destroy(tp);
    }
    bench_print_checksum(checksum, cli.a.json);
    if (checksum != expect) {
        fprintf(stderr, "bench_threadpool: tasks skipped or repeated (expected %016" PRIx64 ")\n",
                expect);
        return 1;
    }
    return 0;
}
