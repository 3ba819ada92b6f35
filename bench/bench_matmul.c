/* SPDX-License-Identifier: MIT */
/*
 * bench_matmul.c - speed of the engine's matrix kernels (engine/ops/ops.h) on 1B-model shapes:
 * matvec (decode, 1 token) and matmul (prefill, 512 tokens) for each weight type, thread
 * count and ISA, as GFLOP/s and GB/s of weight reads, with ratios against the scalar path
 * and the AVX2 path of the same run. A STREAM-like probe (summing a 256 MiB buffer) gives
 * the machine's read bandwidth (4 prefetched streams per thread), so matvec GB/s reads as
 * a fraction of it.
 *
 * Matvec cycles through copies of the matrix filling --ws-mib MiB, so the weights come from
 * memory as in a real decode step (a 1B Q8_0 model reads ~1.2 GB per token), not from
 * cache. The scalar path at 512 tokens runs on the first rows only and is scaled up. Each
 * figure is the best of --reps timed runs after one untimed warm-up. "err" is the largest
 * difference to the scalar path's outputs relative to the largest output; the checksum
 * folds every output, so a change that is fast but wrong shows up. --invariant measures the
 * batch-invariant products (PE_MM_INVARIANT) that `--deterministic` selects. --packed runs
 * the AVX-512 Q8_0 products on weights packed once (pe_mat_pack, as the engine loads them;
 * each matvec copy packed on its own), shown as isa "avx512pk".
 *
 * "%peak" is the share of the machine's peak for the ISA and thread count, measured here
 * (not from a data sheet): each thread runs 12 independent chains of the ISA's widest
 * multiply-add, and the peak is the operations per CPU second of each thread, summed over
 * the threads, 2 per multiply-add, as GFLOP/s counts them. Quantized types (integer dots) are set
 * against the int8 instruction: vpmaddubsw ymm for avx2 (32 int8 products; an exact int32 dot needs
 * a vpmaddwd and an add besides, so avx2 kernels stay well below it), vpdpbusd ymm for avx2vnni,
 * vpdpbusd zmm for avx512; float types against vfmadd ymm (avx2, avx2vnni) or zmm (avx512) in f32.
 * The scalar path has no peak here.
 */
#include <sys/mman.h>
#include <math.h>
#include <stddef.h>

#include "bench.h"
#include "ops.h"
#include "threadpool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

static const struct {
    uint32_t n_in, n_out;
    const char *what;
} all_shapes[] = {
    {2048, 2048, "attn q/o"},
    {2048, 8192, "ffn gate/up"},
    {8192, 2048, "ffn down"},
    {2048, 32000, "output"},
};
enum { N_SHAPES = sizeof all_shapes / sizeof all_shapes[0] };

static const uint32_t all_types[] = {
    PE_GGML_TYPE_F16,  PE_GGML_TYPE_Q8_0, PE_GGML_TYPE_Q4_0, PE_GGML_TYPE_BF16,  PE_GGML_TYPE_F32,
    PE_GGML_TYPE_Q4_K, PE_GGML_TYPE_Q5_K, PE_GGML_TYPE_Q6_K, PE_GGML_TYPE_Q2_K,  PE_GGML_TYPE_Q3_K,
    PE_GGML_TYPE_Q4_1, PE_GGML_TYPE_Q5_0, PE_GGML_TYPE_Q5_1, PE_GGML_TYPE_IQ4_NL};
enum { DEFAULT_TYPES = 0x1f }; /* the first five */
enum { N_TYPES = sizeof all_types / sizeof all_types[0] };

typedef struct opts {
    bench_args b; /* --seed, --json, --smoke */
    int reps, thp;
    uint32_t mm_flags; /* --invariant: PE_MM_INVARIANT */
    int packed;        /* --packed: pe_mat_pack the AVX-512 Q8_0 weights */
    uint32_t ws_mib, probe_mib, gemm_tok;
    uint32_t type_mask, shape_mask, thread_mask, isa_mask, tok_mask;
} opts;

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_matmul [options]\n"
               "GFLOP/s and GB/s of pe_matmul on 1B-model shapes, per type, threads and ISA.\n"
               "  --types LIST    f16,q8_0,q4_0,bf16,f32,q4_k,q5_k,q6_k,q2_k,q3_k,q4_1,q5_0,\n"
               "                  q5_1,iq4_nl (default the first five)\n"
               "  --shapes LIST   indices into 2048x2048,2048x8192,8192x2048,2048x32000\n"
               "                  (n_in x n_out; default 0,1,2,3)\n"
               "  --threads LIST  thread counts, 1 and/or 2 (default 1,2)\n"
               "  --isa LIST      scalar,avx2,avx2vnni,avx512 (default all this CPU has)\n"
               "  --tok LIST      1 (matvec) and/or 512 (matmul) (default 1,512)\n"
               "  --gemm-tok N    tokens of the matmul runs (default 512)\n"
               "  --reps N        timed runs per figure, best reported (default 3)\n"
               "  --ws-mib N      matvec working set in MiB: copies of the matrix (default 512)\n"
               "  --probe-mib N   bandwidth probe buffer in MiB (default 256)\n"
               "  --seed N        weights/activations seed (default 1)\n"
               "  --thp           back the matvec copies with transparent huge pages (madvise)\n"
               "  --invariant     batch-invariant products (PE_MM_INVARIANT, --deterministic)\n"
               "  --packed        AVX-512 Q8_0: weights packed once (pe_mat_pack), as loaded\n"
               "  --json          one JSON object per line instead of the table\n"
               "  --smoke         tiny and fast (for ctest)\n"
               "  --help          show this help\n");
}

/* Parses "a,b,c" against names (or numbers when names is NULL) into a bit mask. */
static int parse_list(const char *arg, const char *const *names, int n, uint32_t *mask)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", arg);
    *mask = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int found = -1;
        for (int i = 0; i < n; i++)
            if (strcmp(tok, names[i]) == 0) found = i;
        if (found < 0) return -1;
        *mask |= 1u << found;
    }
    return *mask ? 0 : -1;
}

/* ---- bandwidth probe ---- */

typedef struct probe_ctx {
    const uint64_t *buf;
    size_t n_words, per_task;
    uint64_t sums[64];
} probe_ctx;

/* Sums a thread's slice as 4 interleaved sub-streams, prefetching 1 KB ahead into L2 like
 * the GEMV kernels do: one plain sequential stream reaches only ~55-60% of what the memory
 * system delivers to a core (measured 7.8 vs 13 GB/s on the 2-vCPU VM). */
static void probe_task(void *ctx, uint32_t task, uint32_t thread)
{
    probe_ctx *p = ctx;
    size_t i0 = (size_t)task * p->per_task, i1 = i0 + p->per_task;
    if (i1 > p->n_words) i1 = p->n_words;
    const size_t q = (i1 - i0) / 4 / 8 * 8; /* words per sub-stream, a multiple of 8 */
    const uint64_t *s[4] = {p->buf + i0, p->buf + i0 + q, p->buf + i0 + 2 * q, p->buf + i0 + 3 * q};
    uint64_t a[8] = {0};
    for (size_t i = 0; i < q; i += 8) {
        for (int k = 0; k < 4; k++) {
            __builtin_prefetch(s[k] + i + 128, 0, 2);
            for (int j = 0; j < 8; j++)
                a[j] += s[k][i + j];
        }
    }
    for (size_t i = i0 + 4 * q; i < i1; i++)
        a[0] += p->buf[i];
    p->sums[task] = a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
}

/* Best read bandwidth in GB/s of n_threads summing a buffer of mib MiB. */
static double probe(uint32_t n_threads, uint32_t mib, int reps, uint64_t *check)
{
    size_t bytes = (size_t)mib << 20;
    uint64_t *buf = malloc(bytes);
    if (!buf) return 0.0;
    for (size_t i = 0; i < bytes / 8; i++)
        buf[i] = i;
    pe_threadpool *tp = pe_tp_create(n_threads);
    probe_ctx p = {buf, bytes / 8, (bytes / 8 + n_threads - 1) / n_threads, {0}};
    double best = 1e30;
    for (int r = 0; r <= reps; r++) {
        double t0 = bench_now_s();
        pe_tp_run(tp, probe_task, &p, n_threads);
        double dt = bench_now_s() - t0;
        if (r > 0 && dt < best) best = dt;
    }
    for (uint32_t i = 0; i < n_threads; i++)
        *check += p.sums[i];
    pe_tp_destroy(tp);
    free(buf);
    return (double)bytes / best / 1e9;
}

/* ---- peak ---- */

enum { PEAK_CHAINS = 12 };

/* Runs n rounds of PEAK_CHAINS independent multiply-adds; returns a value that depends on
 * all of them (so that none is optimized away). */
typedef uint32_t (*peak_fn)(uint64_t n, uint32_t seed);

#if defined(__x86_64__) || defined(__i386__)
/* Each loop: PEAK_CHAINS accumulators in registers, one multiply-add each per round, then a
 * value folded from all of them. */
#define PEAK_FOLD(get)                                                                             \
    uint32_t r = 0;                                                                                \
    for (int i = 0; i < PEAK_CHAINS; i++)                                                          \
        r += (uint32_t)(get);                                                                      \
    return r

__attribute__((target("avx2"))) static uint32_t peak_avx2_i8(uint64_t n, uint32_t seed)
{
    __m256i a[PEAK_CHAINS];
    const __m256i b = _mm256_set1_epi32((int)seed);
    for (int i = 0; i < PEAK_CHAINS; i++)
        a[i] = _mm256_set1_epi32((int)seed + i);
    for (uint64_t it = 0; it < n; it++) {
#pragma GCC unroll 12
        for (int i = 0; i < PEAK_CHAINS; i++)
            a[i] = _mm256_maddubs_epi16(a[i], b);
    }
    PEAK_FOLD(_mm256_extract_epi32(a[i], 0));
}

__attribute__((target("avx2,avxvnni"))) static uint32_t peak_vnni_i8(uint64_t n, uint32_t seed)
{
    __m256i a[PEAK_CHAINS];
    const __m256i b = _mm256_set1_epi32((int)seed);
    for (int i = 0; i < PEAK_CHAINS; i++)
        a[i] = _mm256_set1_epi32((int)seed + i);
    for (uint64_t it = 0; it < n; it++) {
#pragma GCC unroll 12
        for (int i = 0; i < PEAK_CHAINS; i++)
            a[i] = _mm256_dpbusd_avx_epi32(a[i], b, b);
    }
    PEAK_FOLD(_mm256_extract_epi32(a[i], 0));
}

__attribute__((target("avx512f,avx512vnni"))) static uint32_t peak_avx512_i8(uint64_t n,
                                                                             uint32_t seed)
{
    __m512i a[PEAK_CHAINS];
    const __m512i b = _mm512_set1_epi32((int)seed);
    for (int i = 0; i < PEAK_CHAINS; i++)
        a[i] = _mm512_set1_epi32((int)seed + i);
    for (uint64_t it = 0; it < n; it++) {
#pragma GCC unroll 12
        for (int i = 0; i < PEAK_CHAINS; i++)
            a[i] = _mm512_dpbusd_epi32(a[i], b, b);
    }
    PEAK_FOLD(_mm_cvtsi128_si32(_mm512_castsi512_si128(a[i])));
}

__attribute__((target("avx2,fma"))) static uint32_t peak_avx2_f32(uint64_t n, uint32_t seed)
{
    __m256 a[PEAK_CHAINS];
    const __m256 b = _mm256_set1_ps(1.0f - 1e-7f * (float)seed);
    for (int i = 0; i < PEAK_CHAINS; i++)
        a[i] = _mm256_set1_ps((float)i);
    for (uint64_t it = 0; it < n; it++) {
#pragma GCC unroll 12
        for (int i = 0; i < PEAK_CHAINS; i++)
            a[i] = _mm256_fmadd_ps(a[i], b, b);
    }
    PEAK_FOLD(_mm256_cvtss_f32(a[i]));
}

__attribute__((target("avx512f"))) static uint32_t peak_avx512_f32(uint64_t n, uint32_t seed)
{
    __m512 a[PEAK_CHAINS];
    const __m512 b = _mm512_set1_ps(1.0f - 1e-7f * (float)seed);
    for (int i = 0; i < PEAK_CHAINS; i++)
        a[i] = _mm512_set1_ps((float)i);
    for (uint64_t it = 0; it < n; it++) {
#pragma GCC unroll 12
        for (int i = 0; i < PEAK_CHAINS; i++)
            a[i] = _mm512_fmadd_ps(a[i], b, b);
    }
    PEAK_FOLD(_mm512_cvtss_f32(a[i]));
}
#undef PEAK_FOLD
#endif

/* The peak loop of (isa, kind) and its operations per round (2 per multiply-add). */
static peak_fn peak_of(pe_isa isa, int kind, double *ops)
{
#if defined(__x86_64__) || defined(__i386__)
    const double lanes = isa == PE_ISA_AVX512 ? (kind ? 16 : 64) : (kind ? 8 : 32);
    *ops = 2.0 * lanes * PEAK_CHAINS;
    if (isa == PE_ISA_AVX2) return kind ? peak_avx2_f32 : peak_avx2_i8;
    if (isa == PE_ISA_AVX2_VNNI) return kind ? peak_avx2_f32 : peak_vnni_i8;
    if (isa == PE_ISA_AVX512) return kind ? peak_avx512_f32 : peak_avx512_i8;
#endif
    (void)isa, (void)kind;
    *ops = 0;
    return NULL;
}

typedef struct peak_ctx {
    peak_fn fn;
    uint64_t n;
    uint32_t out[64];
    double cpu_s[64]; /* CPU seconds of each thread's loop */
} peak_ctx;

static void peak_task(void *ctx, uint32_t task, uint32_t thread)
{
    peak_ctx *p = ctx;
    const double t0 = bench_clock_s(CLOCK_THREAD_CPUTIME_ID);
    p->out[task % 64] = p->fn(p->n, task + 1);
    p->cpu_s[task % 64] = bench_clock_s(CLOCK_THREAD_CPUTIME_ID) - t0;
}

/* Peak GFLOP/s of n_threads cores running the (isa, kind) loop at once (~5-10 ms each), the
 * best of reps runs after a warm-up: the sum over threads of each one's operations per CPU
 * second of its own loop, so that time the thread spends descheduled on a shared machine
 * does not count (wall time would). 0 where there is none. */
static double peak_gflops(pe_threadpool *tp, uint32_t n_threads, pe_isa isa, int kind, int reps,
                          uint64_t *check)
{
    double ops;
    peak_ctx p = {peak_of(isa, kind, &ops), 1u << 20, {0}, {0}};
    if (!p.fn) return 0.0;
    double best = 0.0;
    for (int r = 0; r <= reps; r++) {
        pe_tp_run(tp, peak_task, &p, n_threads);
        double g = 0.0;
        for (uint32_t i = 0; i < n_threads; i++)
            g += p.cpu_s[i] > 0 ? ops * (double)p.n / p.cpu_s[i] / 1e9 : 0.0;
        if (r > 0 && g > best) best = g;
    }
    for (uint32_t i = 0; i < n_threads; i++)
        *check += p.out[i];
    return best;
}

/* ---- matmul runs ---- */

typedef struct result {
    uint32_t shape, type, n_tok, threads;
    pe_isa isa;
    double ms, gflops, gbs, err;
} result;

/* The f16 scale fields of a block of the types pe_quant_row does not quantize (issue 15):
 * byte offsets, at most 2. */
static int f16_fields(uint32_t type, size_t off[2])
{
    switch (type) {
    case PE_GGML_TYPE_Q2_K:
        off[0] = offsetof(block_q2_K, d), off[1] = offsetof(block_q2_K, dmin);
        return 2;
    case PE_GGML_TYPE_Q3_K:
        off[0] = offsetof(block_q3_K, d);
        return 1;
    case PE_GGML_TYPE_Q6_K:
        off[0] = offsetof(block_q6_K, d);
        return 1;
    case PE_GGML_TYPE_Q5_0:
    case PE_GGML_TYPE_IQ4_NL:
        off[0] = 0;
        return 1;
    default: /* Q4_K, Q5_K: d, dmin; Q4_1, Q5_1: d, m */
        off[0] = 0, off[1] = 2;
        return 2;
    }
}

/* Those types get random bytes with f16 scales of the size pe_quant_row gives Q4_0: the
 * speed of their kernels does not depend on the values. */
static void random_blocks(uint32_t type, uint8_t *row, uint32_t n_in, uint64_t *seed)
{
    const pe_ggml_type_traits *tr = pe_ggml_get_traits(type);
    const size_t nb = n_in / tr->blck_size;
    for (size_t i = 0; i < nb * tr->type_size; i++)
        row[i] = (uint8_t)(bench_rng(seed) >> 56);
    for (size_t b = 0; b < nb; b++) {
        size_t off[2];
        const int n = f16_fields(type, off);
        for (int k = 0; k < n; k++) {
            const uint16_t h = pe_f32_to_f16(bench_randf(seed) * 0.002f);
            memcpy(row + b * tr->type_size + off[k], &h, 2);
        }
    }
}

static void *make_weights(uint32_t type, uint32_t n_in, uint32_t n_out, uint64_t *seed,
                          uint64_t *row_bytes)
{
    *row_bytes = pe_ggml_row_size(type, n_in);
    uint8_t *w = malloc(*row_bytes * n_out);
    float *row = malloc(n_in * sizeof *row);
    if (!w || !row) {
        free(w);
        free(row);
        return NULL;
    }
    for (uint32_t o = 0; o < n_out; o++) {
        for (uint32_t i = 0; i < n_in; i++)
            row[i] = bench_randf(seed) * 0.05f;
        if (type == PE_GGML_TYPE_F32 || type == PE_GGML_TYPE_F16 || type == PE_GGML_TYPE_Q4_0 ||
            type == PE_GGML_TYPE_Q8_0 || type == PE_GGML_TYPE_BF16)
            pe_quant_row(type, row, w + o * *row_bytes, n_in);
        else
            random_blocks(type, w + o * *row_bytes, n_in, seed);
    }
    free(row);
    return w;
}

static double max_abs(const float *y, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++)
        m = fabs(y[i]) > m ? fabs(y[i]) : m;
    return m;
}

int main(int argc, char **argv)
{
    opts o = {.reps = 3,
              .ws_mib = 512,
              .probe_mib = 256,
              .gemm_tok = 512,
              .type_mask = DEFAULT_TYPES,
              .shape_mask = 0xf,
              .thread_mask = 0x3,
              .isa_mask = 0xf,
              .tok_mask = 0x3};
    static const char *const type_names[] = {"f16",  "q8_0", "q4_0", "bf16",  "f32",
                                             "q4_k", "q5_k", "q6_k", "q2_k",  "q3_k",
                                             "q4_1", "q5_0", "q5_1", "iq4_nl"};
    static const char *const shape_names[] = {"0", "1", "2", "3"};
    static const char *const thread_names[] = {"1", "2"};
    static const char *const isa_names[] = {"scalar", "avx2", "avx2vnni", "avx512"};
    static const char *const tok_names[] = {"1", "512"};
    static const struct option lo[] = {
        {"types", required_argument, 0, 'T'},
        {"shapes", required_argument, 0, 'S'},
        {"threads", required_argument, 0, 't'},
        {"isa", required_argument, 0, 'I'},
        {"tok", required_argument, 0, 'k'},
        {"gemm-tok", required_argument, 0, 'g'},
        {"reps", required_argument, 0, 'r'},
        {"ws-mib", required_argument, 0, 'w'},
        {"probe-mib", required_argument, 0, 'p'},
        {"thp", no_argument, 0, 'H'},
        {"invariant", no_argument, 0, 'V'},
        {"packed", no_argument, 0, 'P'},
        {0, 0, 0, 0},
    };
    bench_cli cli = {.prog = "bench_matmul",
                     .usage = usage,
                     .own = lo,
                     .common = BENCH_SEED | BENCH_JSON | BENCH_SMOKE,
                     .a = {.seed = 1}};
    int bad = 0;
    for (;;) {
        int c = bench_cli_next(&cli, argc, argv);
        if (c == -1) break;
        switch (c) {
        case 'T':
            bad |= parse_list(optarg, type_names, N_TYPES, &o.type_mask);
            break;
        case 'S':
            bad |= parse_list(optarg, shape_names, N_SHAPES, &o.shape_mask);
            break;
        case 't':
            bad |= parse_list(optarg, thread_names, 2, &o.thread_mask);
            break;
        case 'I':
            bad |= parse_list(optarg, isa_names, 4, &o.isa_mask);
            break;
        case 'k':
            bad |= parse_list(optarg, tok_names, 2, &o.tok_mask);
            break;
        case 'g':
        case 'r':
        case 'w':
        case 'p': {
            uint64_t v = 0;
            bad |= bench_parse_u64(optarg, &v) != 0 || v > (1u << 24);
            if (c == 'g') o.gemm_tok = (uint32_t)v;
            if (c == 'r') o.reps = (int)v;
            if (c == 'w') o.ws_mib = (uint32_t)v;
            if (c == 'p') o.probe_mib = (uint32_t)v;
            break;
        }
        case 'H':
            o.thp = 1;
            break;
        case 'V':
            o.mm_flags = PE_MM_INVARIANT;
            break;
        case 'P':
            o.packed = 1;
            break;
        }
    }
    if (cli.status >= 0) return cli.status;
    o.b = cli.a;
    if (bad || optind != argc || o.reps < 1 || o.gemm_tok < 1 || o.probe_mib < 1) {
        usage(stderr);
        return 2;
    }
    uint32_t shapes_in[N_SHAPES], shapes_out[N_SHAPES];
    for (int i = 0; i < N_SHAPES; i++) {
        shapes_in[i] = all_shapes[i].n_in;
        shapes_out[i] = all_shapes[i].n_out;
    }
    if (o.b.smoke) { /* tiny: exercise every path once */
        for (int i = 0; i < N_SHAPES; i++) {
            shapes_in[i] = 256 + 32 * (uint32_t)i;
            shapes_out[i] = 64 + 3 * (uint32_t)i;
        }
        o.gemm_tok = 19;
        o.reps = 1;
        o.ws_mib = 1;
        o.probe_mib = 4;
    }
    const pe_isa best_isa = pe_isa_detect();
    uint64_t check = 0;

    /* read bandwidth */
    double bw[3] = {0};
    for (uint32_t nt = 1; nt <= 2; nt++)
        if (o.thread_mask & (1u << (nt - 1))) bw[nt] = probe(nt, o.probe_mib, o.reps, &check);
    if (o.b.json) {
        printf(
            "{\"probe_mib\": %u, \"read_gbs_1t\": %.2f, \"read_gbs_2t\": %.2f, \"isa\": \"%s\"}\n",
            o.probe_mib, bw[1], bw[2], pe_isa_name(best_isa));
    } else {
        printf(
            "isa %s; read bandwidth (sum over %u MiB): 1 thread %.1f GB/s, 2 threads %.1f GB/s\n",
            pe_isa_name(best_isa), o.probe_mib, bw[1], bw[2]);
    }

    pe_threadpool *pools[3] = {NULL, pe_tp_create(1), pe_tp_create(2)};
    /* peaks[isa][kind][threads] (GFLOP/s), measured once before the products */
    double peaks[4][2][3] = {{{0}}};
    for (int isa = PE_ISA_AVX2; isa <= (int)best_isa; isa++) {
        if (!(o.isa_mask & (1u << isa)) || !pe_isa_has((pe_isa)isa)) continue;
        for (int kind = 0; kind < 2; kind++) {
            for (uint32_t nt = 1; nt <= 2; nt++) {
                if (!(o.thread_mask & (1u << (nt - 1)))) continue;
                peaks[isa][kind][nt] =
                    peak_gflops(pools[nt], nt, (pe_isa)isa, kind, o.reps, &check);
                if (o.b.json)
                    printf("{\"peak_isa\": \"%s\", \"kind\": \"%s\", \"threads\": %u, "
                           "\"peak_gflops\": %.1f}\n",
                           pe_isa_name((pe_isa)isa), kind ? "f32" : "int8", nt,
                           peaks[isa][kind][nt]);
                else
                    printf("peak %-8s %-4s %u thread%s: %8.1f GFLOP/s (measured)\n",
                           pe_isa_name((pe_isa)isa), kind ? "f32" : "int8", nt, nt > 1 ? "s" : "",
                           peaks[isa][kind][nt]);
            }
        }
    }
    if (!o.b.json)
        printf("%-12s %-5s %4s %3s %-8s %9s %8s %7s %6s %6s %8s %8s %8s\n", "shape", "type", "tok",
               "thr", "isa", "ms", "GFLOP/s", "GB/s", "%bw", "%peak", "x_scalar", "x_avx2", "err");
    uint64_t seed = o.b.seed;
    int rc = 0;
    for (int si = 0; si < N_SHAPES && rc == 0; si++) {
        if (!(o.shape_mask & (1u << si))) continue;
        const uint32_t n_in = shapes_in[si], n_out = shapes_out[si];
        for (int ti = 0; ti < N_TYPES && rc == 0; ti++) {
            if (!(o.type_mask & (1u << ti))) continue;
            const uint32_t type = all_types[ti];
            uint64_t rb;
            uint8_t *w0 = make_weights(type, n_in, n_out, &seed, &rb);
            const size_t mat_bytes = rb * n_out;
            /* copies for matvec: at least the working set, at least one */
            size_t n_copies = ((size_t)o.ws_mib << 20) / mat_bytes + 1;
            uint8_t *copies = NULL;
            if (posix_memalign((void **)&copies, 2u << 20, mat_bytes * n_copies) != 0)
                copies = NULL;
            if (copies && o.thp) madvise(copies, mat_bytes * n_copies, MADV_HUGEPAGE);
            float *x = malloc((size_t)o.gemm_tok * n_in * sizeof *x);
            float *y = malloc((size_t)o.gemm_tok * n_out * sizeof *y);
            float *ys = malloc((size_t)o.gemm_tok * n_out * sizeof *ys);
            pe_mat wm = {type, n_in, n_out, w0, rb, NULL};
            void *scratch = malloc(pe_matmul_scratch_bytes(&wm, o.gemm_tok));
            if (!w0 || !copies || !x || !y || !ys || !scratch) {
                fprintf(stderr, "bench_matmul: out of memory\n");
                rc = 1;
            }
            for (size_t i = 0; rc == 0 && i < n_copies; i++)
                memcpy(copies + i * mat_bytes, w0, mat_bytes);
            for (size_t i = 0; rc == 0 && i < (size_t)o.gemm_tok * n_in; i++)
                x[i] = bench_randf(&seed);
            for (int ki = 0; ki < 2 && rc == 0; ki++) {
                if (!(o.tok_mask & (1u << ki))) continue;
                const uint32_t n_tok = ki == 0 ? 1 : o.gemm_tok;
                for (uint32_t nt = 1; nt <= 2; nt++) {
                    if (!(o.thread_mask & (1u << (nt - 1)))) continue;
                    double ms_isa[4] = {0};
                    uint32_t scalar_rows = n_out;
                    for (int isa = 0; isa <= (int)best_isa; isa++) {
                        /* the scalar path always runs (it is the baseline of the ratios) */
                        if (isa != 0 && !(o.isa_mask & (1u << isa))) continue;
                        if (!pe_isa_has((pe_isa)isa)) continue; /* AVX-512 without AVX-VNNI */
                        pe_isa_force((pe_isa)isa);
                        pe_mat m = wm;
                        if (isa == 0 && n_tok > 1 && !o.b.smoke) /* scaled-up estimate */
                            m.n_out = scalar_rows = n_out < 128 ? n_out : 128;
                        /* --packed: one packed pe_mat per matvec copy, or w0's */
                        const size_t n_pk = n_tok == 1 ? n_copies : 1;
                        pe_mat *pkm = NULL;
                        if (o.packed && isa != PE_ISA_SCALAR && pe_mat_packed_bytes(&m)) {
                            pkm = calloc(n_pk, sizeof *pkm);
                            for (size_t i = 0; pkm && i < n_pk; i++) {
                                pkm[i] = m;
                                pkm[i].data = n_tok == 1 ? copies + i * mat_bytes : w0;
                                if (pe_mat_pack(&pkm[i]) != 1) {
                                    fprintf(stderr, "bench_matmul: out of memory\n");
                                    return 1;
                                }
                            }
                            if (!pkm) return 1;
                        }
                        double best = 1e30;
                        size_t copy = 0;
                        for (int r = 0; r <= o.reps; r++) {
                            m.data = n_tok == 1 ? copies + copy * mat_bytes : w0;
                            if (pkm) m = pkm[n_tok == 1 ? copy : 0];
                            copy = (copy + 1) % n_copies;
                            double t0 = bench_now_s(), dt;
                            if (n_tok == 1) { /* sweep the working set: one pass per rep */
                                size_t passes = n_copies;
                                for (size_t p = 0; p < passes; p++) {
                                    m.data = copies + ((copy + p) % n_copies) * mat_bytes;
                                    if (pkm) m = pkm[(copy + p) % n_copies];
                                    pe_matmul_ex(pools[nt], &m, x, n_tok, y, scratch, o.mm_flags);
                                }
                                dt = (bench_now_s() - t0) / (double)passes;
                            } else {
                                pe_matmul_ex(pools[nt], &m, x, n_tok, y, scratch, o.mm_flags);
                                dt = bench_now_s() - t0;
                            }
                            if (r > 0 && dt < best) best = dt;
                        }
                        char isa_name[16]; /* "avx512pk": on packed weights */
                        snprintf(isa_name, sizeof isa_name, "%s%s", pe_isa_name((pe_isa)isa),
                                 pkm ? "pk" : "");
                        for (size_t i = 0; pkm && i < n_pk; i++)
                            pe_mat_unpack(&pkm[i]);
                        free(pkm);
                        best *= (double)n_out / m.n_out;
                        ms_isa[isa] = best * 1e3;
                        /* outputs to compare: token-major [n_tok][m.n_out] */
                        double err = 0.0;
                        if (isa == 0) {
                            memcpy(ys, y, (size_t)n_tok * m.n_out * sizeof *y);
                        } else {
                            double scale = 0.0, diff = 0.0;
                            for (uint32_t t = 0; t < n_tok; t++) {
                                for (uint32_t r = 0; r < scalar_rows; r++) {
                                    double a = y[(size_t)t * n_out + r],
                                           b = ys[(size_t)t * scalar_rows + r];
                                    diff = fabs(a - b) > diff ? fabs(a - b) : diff;
                                }
                            }
                            scale = max_abs(ys, (size_t)n_tok * scalar_rows);
                            err = scale > 0 ? diff / scale : diff;
                        }
                        for (size_t i = 0; i < (size_t)n_tok * m.n_out; i++) {
                            uint32_t bits;
                            float v = y[i] * 1024.0f;
                            memcpy(&bits, &v, 4);
                            check += (uint64_t)lrintf(v) + (bits >> 31);
                        }
                        result res = {(uint32_t)si,
                                      type,
                                      n_tok,
                                      nt,
                                      (pe_isa)isa,
                                      best * 1e3,
                                      2.0 * n_in * n_out * n_tok / best / 1e9,
                                      (double)mat_bytes / best / 1e9,
                                      err};
                        if (isa != 0 && !(o.isa_mask & (1u << isa))) continue;
                        if (isa == 0 && !(o.isa_mask & 1u)) continue;
                        double xs = ms_isa[0] > 0 ? ms_isa[0] / res.ms : 0.0;
                        double xa = ms_isa[1] > 0 ? ms_isa[1] / res.ms : 0.0;
                        const int fkind = type == PE_GGML_TYPE_F32 || type == PE_GGML_TYPE_F16 ||
                                          type == PE_GGML_TYPE_BF16;
                        const double pk = peaks[isa][fkind][nt];
                        const double pfrac = pk > 0 ? res.gflops / pk : 0.0;
                        char shape[32];
                        snprintf(shape, sizeof shape, "%ux%u", n_in, n_out);
                        if (o.b.json) {
                            printf("{\"shape\": \"%s\", \"type\": \"%s\", \"n_tok\": %u, "
                                   "\"threads\": %u, \"isa\": \"%s\", \"ms\": %.4f, "
                                   "\"gflops\": %.2f, \"gbs\": %.2f, \"bw_frac\": %.3f, "
                                   "\"peak_frac\": %.3f, \"x_scalar\": %.2f, \"x_avx2\": %.2f, "
                                   "\"err\": %.2e}\n",
                                   shape, pe_ggml_type_name(type), n_tok, nt, isa_name, res.ms,
                                   res.gflops, res.gbs, bw[nt] > 0 ? res.gbs / bw[nt] : 0.0, pfrac,
                                   xs, xa, err);
                        } else {
                            printf(
                                "%-12s %-5s %4u %3u %-8s %9.3f %8.1f %7.2f %5.0f%% %5.1f%% %8.2f "
                                "%8.2f %8.1e\n",
                                shape, pe_ggml_type_name(type), n_tok, nt, isa_name, res.ms,
                                res.gflops, res.gbs, bw[nt] > 0 ? 100.0 * res.gbs / bw[nt] : 0.0,
                                100.0 * pfrac, xs, xa, err);
                        }
                        fflush(stdout);
                        if (err > 1e-4) {
                            fprintf(stderr, "bench_matmul: %s %s differs from the scalar path\n",
                                    shape, pe_ggml_type_name(type));
                            rc = 1;
                        }
                    }
                }
            }
            free(w0);
            free(copies);
            free(x);
            free(y);
            free(ys);
            free(scratch);
        }
    }
    pe_isa_force(best_isa);
    pe_tp_destroy(pools[1]);
    pe_tp_destroy(pools[2]);
    bench_print_checksum(check, o.b.json);
    return rc;
}
