/* SPDX-License-Identifier: MIT */
/*
 * ops.c - the front of the kernels (ops.h): ISA detection and dispatch, the threading of
 * pe_matmul over the pool, and the portable scalar kernels used on CPUs without AVX2.
 * Callers: the forward pass (forward.c), tests and benches.
 *
 * pe_matmul cuts Y[n_tok][n_out] into tasks of rows x tokens:
 *   - n_tok < pe__gemm_min_tok() (decode): one task per thread, which claims chunks of rows
 *     (guided: long first, short last) for all tokens. The kernels stream each weight row
 *     once and are memory bound.
 *   - otherwise (prefill, batched decode): up to 128 rows x 256 tokens per task; the
 *     AVX-512 kernel (and the AVX2 one, for Q8_0/Q4_0) repacks its rows into L1-sized
 *     panels and reuses every weight load across tokens.
 * Activations of quantized products are quantized once per call, before the tasks start.
 * Each run takes at most one thread per MM_MIN_WORK_PER_THREAD multiply-adds (a small
 * product runs on the calling thread): pe_tp_run_max changes who runs the tasks, never the
 * tasks, so the results do not depend on it.
 * With PE_MM_INVARIANT the same split runs each task through the ISA's rows_invariant,
 * whose elements do not depend on the task's bounds (test_ops: test_batch_invariant).
 * The ISA is chosen once from the CPU (pe_isa_detect) and may be lowered by pe_isa_force;
 * PE_ISA_AVX2_VNNI (AVX2 + AVX-VNNI) runs the AVX2 kernels with vpdpbusd panels.
 * pe_mat_pack (Q8_0, x86 levels) repacks a matrix once into the panel layout of ops_avx512.c,
 * which the AVX-512, AVX-VNNI and AVX2 kernels then read (pe_mat.packed) at every token
 * count; the scalar kernels read data.
 * The environment variable PGD_ISA (scalar, avx2, avx2vnni, avx512; read once, at the first
 * product) lowers the default for every program of the engine (pagoda run/serve/bench, the
 * benches): a level this CPU cannot run falls back to the best it has, and an unknown value
 * is ignored, each with a warning on stderr. pe_isa_force overrides it.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "ops.h"
#include "ops_int.h"

enum {
    GEMV_MIN_ROWS = 32,   /* least rows per claim for small n_tok */
    GEMM_TASK_ROWS = 128, /* most rows per task for large n_tok (a multiple of 32) */
    GEMM_TASK_TOK = 256,  /* tokens per task for large n_tok */
    QUANT_TASK_TOK = 16,  /* tokens per activation-quantization task */
};

/* The least multiply-adds (or activation elements to quantize) worth one more thread. A
 * dispatch costs ~1-2 us while the workers spin (bench_threadpool) and much more when one
 * sleeps or is descheduled, and one thread does ~10-30 multiply-adds per ns, so a thread
 * must get ~5 us of work to pay for itself: stories260K's products (64 x 64 to 512 x 64,
 * 4K-32K multiply-adds) run on the calling thread, a 1B model's (2048 x 2048, 4M) on all. */
#define MM_MIN_WORK_PER_THREAD 65536u

/* ---- ISA detection and dispatch ---- */

static atomic_int isa_detected = -1;
static atomic_int isa_forced = -1;

#if defined(__x86_64__) || defined(__i386__)
/* F16C by CPUID (leaf 1, ECX bit 29): clang 14's __builtin_cpu_supports does not know it.
 * The AVX2 check below covers the OS's saving of the vector state. */
static int has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

/* AVX-VNNI (VEX-encoded vpdpbusd on ymm) by CPUID (leaf 7 subleaf 1, EAX bit 4). */
static int has_avx_vnni(void)
{
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4));
}
#endif

static atomic_int avx_vnni_detected = -1;

/* Whether the CPU has AVX2 (as detect() requires it) and AVX-VNNI. */
static int avx2_vnni(void)
{
    int v = atomic_load_explicit(&avx_vnni_detected, memory_order_relaxed);
    if (v < 0) {
#if defined(__x86_64__) || defined(__i386__)
        v = pe_isa_detect() >= PE_ISA_AVX2 && has_avx_vnni();
#else
        v = 0;
#endif
        atomic_store_explicit(&avx_vnni_detected, v, memory_order_relaxed);
    }
    return v;
}

static pe_isa detect(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
    int avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                 __builtin_cpu_supports("avx512vnni");
    if (avx512) return PE_ISA_AVX512;
    if (avx2 && has_avx_vnni()) return PE_ISA_AVX2_VNNI;
    if (avx2) return PE_ISA_AVX2;
#endif
    return PE_ISA_SCALAR;
}

pe_isa pe_isa_detect(void)
{
    int v = atomic_load_explicit(&isa_detected, memory_order_relaxed);
    if (v < 0) {
        v = (int)detect();
        atomic_store_explicit(&isa_detected, v, memory_order_relaxed);
    }
    return (pe_isa)v;
}

const char *pe_isa_name(pe_isa isa)
{
    switch (isa) {
    case PE_ISA_SCALAR:
        return "scalar";
    case PE_ISA_AVX2:
        return "avx2";
    case PE_ISA_AVX2_VNNI:
        return "avx2vnni";
    case PE_ISA_AVX512:
        return "avx512";
    }
    return "unknown";
}

int pe_isa_has(pe_isa isa)
{
    if ((int)isa < 0 || (int)isa > (int)pe_isa_detect()) return 0;
    return isa != PE_ISA_AVX2_VNNI || avx2_vnni();
}

pe_isa pe_isa_force(pe_isa isa)
{
    pe_isa best = pe_isa_detect();
    if ((int)isa > (int)best || (int)isa < 0) isa = best;
    if (!pe_isa_has(isa)) isa = PE_ISA_AVX2; /* AVX2_VNNI without AVX-VNNI */
    atomic_store_explicit(&isa_forced, (int)isa, memory_order_relaxed);
    return isa;
}

static pthread_once_t isa_env_once = PTHREAD_ONCE_INIT;
static int isa_env; /* the default ISA: pe_isa_detect, lowered by PGD_ISA */

static void read_isa_env(void)
{
    const char *s = getenv("PGD_ISA");
    pe_isa best = pe_isa_detect(), want = best;
    isa_env = (int)best;
    if (!s || !*s || !strcmp(s, "auto")) return;
    if (!strcmp(s, "scalar")) {
        want = PE_ISA_SCALAR;
    } else if (!strcmp(s, "avx2")) {
        want = PE_ISA_AVX2;
    } else if (!strcmp(s, "avx2vnni")) {
        want = PE_ISA_AVX2_VNNI;
    } else if (!strcmp(s, "avx512")) {
        want = PE_ISA_AVX512;
    } else {
        fprintf(stderr,
                "pagoda: PGD_ISA=%s is not scalar, avx2, avx2vnni, avx512 or auto; using %s\n", s,
                pe_isa_name(best));
        return;
    }
    if (want > best || !pe_isa_has(want)) {
        fprintf(stderr, "pagoda: PGD_ISA=%s: this CPU has no %s; using %s\n", s, s,
                pe_isa_name(best));
        return;
    }
    isa_env = (int)want;
}

pe_isa pe_isa_active(void)
{
    int v = atomic_load_explicit(&isa_forced, memory_order_relaxed);
    if (v >= 0) return (pe_isa)v;
    pthread_once(&isa_env_once, read_isa_env);
    return (pe_isa)isa_env;
}

static const pe_kernels *kernels(void)
{
    int v = (int)pe_isa_active();
#if defined(__x86_64__) || defined(__i386__)
    if (v == PE_ISA_AVX512) return &pe__kernels_avx512;
    if (v == PE_ISA_AVX2_VNNI) return &pe__kernels_avx2_vnni;
    if (v == PE_ISA_AVX2) return &pe__kernels_avx2;
#endif
    return &pe__kernels_scalar;
}

/* ---- packed weights (pe_mat_pack) ---- */

size_t pe_mat_packed_bytes(const pe_mat *m)
{
#if defined(__x86_64__) || defined(__i386__)
    if (m->type != PE_GGML_TYPE_Q8_0 || pe_isa_active() == PE_ISA_SCALAR || m->n_out == 0 ||
        m->n_in % QK8_0 || !m->data)
        return 0;
    return (size_t)((m->n_out + 15) / 16) * pe__pk_group_bytes(m->n_in / QK8_0);
#else
    (void)m;
    return 0;
#endif
}

int pe_mat_pack(pe_mat *m)
{
    size_t n = pe_mat_packed_bytes(m);
    if (!n || m->packed) return 0;
#if defined(__x86_64__) || defined(__i386__)
    void *p = NULL;
    if (posix_memalign(&p, 64, n) != 0) return -1;
    if (pe_isa_active() == PE_ISA_AVX512)
        pe__q8_pack_avx512(m, p);
    else
        pe__q8_pack_avx2(m, p);
    m->packed = p;
    return 1;
#else
    return 0;
#endif
}

void pe_mat_unpack(pe_mat *m)
{
    free((void *)(uintptr_t)m->packed);
    m->packed = NULL;
}

/* ---- pe_matmul ---- */

static size_t round_up(size_t v, size_t a)
{
    return (v + a - 1) / a * a;
}

/* The threads a run of `work` multiply-adds (or elements) is worth, at most the pool's:
 * the max_threads of pe_tp_run_max, which changes who runs the tasks, never the tasks. */
static uint32_t work_threads(const pe_threadpool *tp, uint64_t work)
{
    uint64_t n = work / MM_MIN_WORK_PER_THREAD;
    uint32_t max = pe_tp_n_threads(tp);
    return n < 1 ? 1 : n < max ? (uint32_t)n : max;
}

static uint64_t mm_work(const pe_mat *w, uint32_t n_tok)
{
    return (uint64_t)w->n_out * w->n_in * n_tok;
}

size_t pe_matmul_scratch_bytes(const pe_mat *w, uint32_t n_tok)
{
    if (pe__type_is_ext(w->type)) /* activations, then block sums (pe_ext_mm.xsum) */
        return 64 + (size_t)n_tok * (round_up(pe__act_row_bytes(w->type, w->n_in), 64) +
                                     (size_t)w->n_in / 32 * sizeof(int32_t));
    if (!pe__type_is_quant(w->type)) return 64;
    size_t nb = w->n_in / QK8_0;
    return 64 + (size_t)n_tok * (round_up(w->n_in, 64) + nb * (sizeof(float) + sizeof(int32_t)));
}

typedef struct mm_plan {
    pe_mm m;
    const pe_kernels *k;
    void (*rows)(const pe_mm *m, uint32_t r0, uint32_t r1, uint32_t t0, uint32_t t1);
    uint32_t rows_per_task, tok_per_task, n_row_tasks;
    uint32_t n_threads;
    atomic_uint next_row; /* GEMV: first row not yet claimed */
} mm_plan;

static void quant_task(void *ctx, uint32_t task, uint32_t thread)
{
    mm_plan *p = ctx;
    pe_mm *m = &p->m;
    int32_t off = pe__act_offset(m->w->type);
    uint32_t t1 = (task + 1) * QUANT_TASK_TOK < m->n_tok ? (task + 1) * QUANT_TASK_TOK : m->n_tok;
    for (uint32_t t = task * QUANT_TASK_TOK; t < t1; t++) {
        p->k->quant_act(m->x + (size_t)t * m->w->n_in, m->w->n_in, off,
                        (int8_t *)m->xq + t * m->xq_stride, (float *)m->xd + (size_t)t * m->nb,
                        (int32_t *)m->xc + (size_t)t * m->nb);
    }
}

static void mm_task(void *ctx, uint32_t task, uint32_t thread)
{
    mm_plan *p = ctx;
    uint32_t rt = task % p->n_row_tasks, tt = task / p->n_row_tasks;
    uint32_t r0 = rt * p->rows_per_task, t0 = tt * p->tok_per_task;
    uint32_t r1 = r0 + p->rows_per_task, t1 = t0 + p->tok_per_task;
    if (r1 > p->m.w->n_out) r1 = p->m.w->n_out;
    if (t1 > p->m.n_tok) t1 = p->m.n_tok;
    p->rows(&p->m, r0, r1, t0, t1);
}

/* GEMV: each thread claims rows until none are left, remaining / (2 n_threads) at a time
 * (at least GEMV_MIN_ROWS): the first chunks are long, which the kernels stream best (each
 * splits a chunk into 4 contiguous streams), and the last are short, so the threads finish
 * together. The end-of-run wait went from 3.6% to 2.6% of decode time (perf samples) against
 * fixed 128-row tasks. */
static void gemv_task(void *ctx, uint32_t task, uint32_t thread)
{
    mm_plan *p = ctx;
    const uint32_t n = p->m.w->n_out;
    uint32_t cur = atomic_load_explicit(&p->next_row, memory_order_relaxed);
    while (cur < n) {
        uint32_t left = n - cur;
        uint32_t chunk = (left / (2 * p->n_threads) + 15) & ~15u;
        if (chunk < GEMV_MIN_ROWS) chunk = GEMV_MIN_ROWS;
        if (chunk > left) chunk = left;
        if (atomic_compare_exchange_weak_explicit(&p->next_row, &cur, cur + chunk,
                                                  memory_order_relaxed, memory_order_relaxed)) {
            p->rows(&p->m, cur, cur + chunk, 0, p->m.n_tok);
            cur = atomic_load_explicit(&p->next_row, memory_order_relaxed);
        }
    }
}

/* ---- the types of issue 15 ----
 * The activations of each token are quantized (pe__quant_act_ref, ggml's vec_dot_type) into
 * the scratch. On AVX-512 the tasks then split as for Q8_0/Q4_0 (GEMV row claims below
 * pe__ext_gemm_min_tok tokens, rows x tokens tiles from it on) and run
 * pe__ext_rows_avx512; elsewhere the threads claim chunks of rows and run
 * pe__vec_dot_ext_ref for every token (on AVX2 CPUs: pe__ext_rows_avx2, or _vnni with
 * AVX-VNNI: rows x tokens tiles, K-quant panels from 12 tokens, bit-identical to it).
 * Each element depends on its weight row and token only (batch-invariant). */

typedef struct ext_plan {
    const pe_mat *w;
    const float *x;
    float *y;
    uint32_t n_tok;
    uint8_t *xq;
    size_t xq_stride;
    void (*rows)(const pe_mat *w, const uint8_t *xq, size_t xq_stride, float *y, uint32_t r0,
                 uint32_t r1, uint32_t t0, uint32_t t1); /* NULL: pe__vec_dot_ext_ref */
    atomic_uint next_row;
    /* AVX-512 (pe__ext_rows_avx512): the product, and the GEMM task split */
    pe_ext_mm em;
    uint32_t n_threads, rows_per_task, n_row_tasks;
    int q8_k_avx512; /* Q8_K activations by pe__quant_q8_k_avx512 */
    int q8_k_avx2;   /* Q8_K activations by pe__quant_q8_k_avx2 (AVX2 kernels) */
    int q8_avx512;   /* Q8_0/Q8_1 activations by pe__quant_q8_0_avx512 */
    int32_t *xsum;   /* AVX-512 with Q8_0 activations: pe_ext_mm.xsum (by q8_avx512) */
} ext_plan;

static void ext_quant_task(void *ctx, uint32_t task, uint32_t thread)
{
    ext_plan *p = ctx;
    uint32_t t1 = (task + 1) * QUANT_TASK_TOK < p->n_tok ? (task + 1) * QUANT_TASK_TOK : p->n_tok;
    for (uint32_t t = task * QUANT_TASK_TOK; t < t1; t++) {
        const float *x = p->x + (size_t)t * p->w->n_in;
        uint8_t *xq = p->xq + t * p->xq_stride;
#if defined(__x86_64__) || defined(__i386__)
        if (p->q8_k_avx512) {
            pe__quant_q8_k_avx512(x, (block_q8_K *)(void *)xq, p->w->n_in);
            continue;
        }
        if (p->q8_k_avx2) {
            pe__quant_q8_k_avx2(x, (block_q8_K *)(void *)xq, p->w->n_in);
            continue;
        }
        if (p->q8_avx512) { /* Q8_0 with the block sums, or Q8_1 */
            pe__quant_q8_0_avx512(x, xq, p->w->n_in,
                                  pe__vec_dot_type(p->w->type) == PE_GGML_TYPE_Q8_1,
                                  p->xsum ? p->xsum + (size_t)t * (p->w->n_in / 32) : NULL);
            continue;
        }
#endif
        pe__quant_act_ref(p->w->type, x, xq, p->w->n_in);
    }
}

static void ext_rows_task(void *ctx, uint32_t task, uint32_t thread)
{
    ext_plan *p = ctx;
    const pe_mat *w = p->w;
    for (;;) {
        uint32_t r0 = atomic_fetch_add_explicit(&p->next_row, GEMV_MIN_ROWS, memory_order_relaxed);
        if (r0 >= w->n_out) return;
        uint32_t r1 = r0 + GEMV_MIN_ROWS < w->n_out ? r0 + GEMV_MIN_ROWS : w->n_out;
        if (p->rows) {
            p->rows(w, p->xq, p->xq_stride, p->y, r0, r1, 0, p->n_tok);
            continue;
        }
        for (uint32_t r = r0; r < r1; r++) {
            const uint8_t *row = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
            for (uint32_t t = 0; t < p->n_tok; t++)
                p->y[(size_t)t * w->n_out + r] =
                    pe__vec_dot_ext_ref(w->type, row, p->xq + t * p->xq_stride, w->n_in);
        }
    }
}

#if defined(__x86_64__) || defined(__i386__)
/* AVX-512 GEMV: guided row claims as gemv_task, each chunk for all tokens. */
static void ext_gemv_task(void *ctx, uint32_t task, uint32_t thread)
{
    ext_plan *p = ctx;
    const uint32_t n = p->w->n_out;
    uint32_t cur = atomic_load_explicit(&p->next_row, memory_order_relaxed);
    while (cur < n) {
        uint32_t left = n - cur;
        uint32_t chunk = (left / (2 * p->n_threads) + 15) & ~15u;
        if (chunk < GEMV_MIN_ROWS) chunk = GEMV_MIN_ROWS;
        if (chunk > left) chunk = left;
        if (atomic_compare_exchange_weak_explicit(&p->next_row, &cur, cur + chunk,
                                                  memory_order_relaxed, memory_order_relaxed)) {
            pe__ext_rows_avx512(&p->em, cur, cur + chunk, 0, p->n_tok);
            cur = atomic_load_explicit(&p->next_row, memory_order_relaxed);
        }
    }
}

/* AVX-512 GEMM: tiles of rows x GEMM_TASK_TOK tokens, as mm_task. */
static void ext_gemm_task(void *ctx, uint32_t task, uint32_t thread)
{
    ext_plan *p = ctx;
    uint32_t rt = task % p->n_row_tasks, tt = task / p->n_row_tasks;
    uint32_t r0 = rt * p->rows_per_task, t0 = tt * GEMM_TASK_TOK;
    uint32_t r1 = r0 + p->rows_per_task, t1 = t0 + GEMM_TASK_TOK;
    if (r1 > p->w->n_out) r1 = p->w->n_out;
    if (t1 > p->n_tok) t1 = p->n_tok;
    pe__ext_rows_avx512(&p->em, r0, r1, t0, t1);
}

/* The AVX-512 products of matmul_ext: every element is bit-identical to the reference, so
 * the split may follow n_tok and the thread count (invariant as the scalar path). */
static void matmul_ext_avx512(pe_threadpool *tp, ext_plan *p)
{
    const uint32_t n_threads = pe_tp_n_threads(tp), n_out = p->w->n_out;
    p->em.w = p->w;
    p->em.xq = p->xq;
    p->em.xq_stride = p->xq_stride;
    p->em.y = p->y;
    p->em.n_tok = p->n_tok;
    p->em.xsum = p->xsum;
    p->n_threads = n_threads;
    if (p->n_tok < pe__ext_gemm_min_tok(p->w->type)) {
        pe_tp_run_max(tp, ext_gemv_task, p, n_threads, work_threads(tp, mm_work(p->w, p->n_tok)));
        return;
    }
    uint32_t rows = GEMM_TASK_ROWS;
    const uint32_t n_tt = (p->n_tok + GEMM_TASK_TOK - 1) / GEMM_TASK_TOK;
    while (rows > 32 && (size_t)((n_out + rows - 1) / rows) * n_tt < 4u * n_threads)
        rows /= 2;
    p->rows_per_task = rows;
    p->n_row_tasks = (n_out + rows - 1) / rows;
    pe_tp_run_max(tp, ext_gemm_task, p, p->n_row_tasks * n_tt,
                  work_threads(tp, mm_work(p->w, p->n_tok)));
}
#endif

static void matmul_ext(pe_threadpool *tp, const pe_mat *w, const float *x, uint32_t n_tok, float *y,
                       void *scratch)
{
    ext_plan p;
    memset(&p, 0, sizeof p);
    p.w = w;
    p.x = x;
    p.y = y;
    p.n_tok = n_tok;
    p.xq = (uint8_t *)round_up((uintptr_t)scratch, 64);
    p.xq_stride = round_up(pe__act_row_bytes(w->type, w->n_in), 64);
#if defined(__x86_64__) || defined(__i386__)
    if (kernels() != &pe__kernels_scalar) /* AVX2 or AVX-512 (which includes AVX2) */
        p.rows = kernels() == &pe__kernels_avx2_vnni ? pe__ext_rows_avx2_vnni : pe__ext_rows_avx2;
#endif
    atomic_init(&p.next_row, 0);
#if defined(__x86_64__) || defined(__i386__)
    const int avx512 = kernels() == &pe__kernels_avx512 && pe__ext_avx512_has(w->type);
    p.q8_k_avx512 = avx512 && pe__vec_dot_type(w->type) == PE_GGML_TYPE_Q8_K;
    p.q8_avx512 = avx512 && !p.q8_k_avx512;
    p.q8_k_avx2 = (kernels() == &pe__kernels_avx2 || kernels() == &pe__kernels_avx2_vnni) &&
                  pe__vec_dot_type(w->type) == PE_GGML_TYPE_Q8_K;
    if (avx512 && pe__vec_dot_type(w->type) == PE_GGML_TYPE_Q8_0)
        p.xsum = (int32_t *)(void *)(p.xq + (size_t)n_tok * p.xq_stride);
#endif
    pe_tp_run_max(tp, ext_quant_task, &p, (n_tok + QUANT_TASK_TOK - 1) / QUANT_TASK_TOK,
                  work_threads(tp, (uint64_t)n_tok * w->n_in));
#if defined(__x86_64__) || defined(__i386__)
    if (avx512) {
        matmul_ext_avx512(tp, &p);
        return;
    }
#endif
    pe_tp_run_max(tp, ext_rows_task, &p, pe_tp_n_threads(tp), work_threads(tp, mm_work(w, n_tok)));
}

/* Invariance (PE_MM_INVARIANT) needs nothing of the task split below: every task computes
 * whole output elements with rows_invariant, whose bits do not depend on the task's
 * bounds, so the split may follow n_tok and the thread count. */
void pe_matmul_ex(pe_threadpool *tp, const pe_mat *w, const float *x, uint32_t n_tok, float *y,
                  void *scratch, uint32_t flags)
{
    mm_plan p;
    memset(&p, 0, sizeof p);
    p.k = kernels();
    p.rows = flags & PE_MM_INVARIANT ? p.k->rows_invariant : p.k->rows;
    p.m.w = w;
    p.m.x = x;
    p.m.y = y;
    p.m.n_tok = n_tok;
    if (n_tok == 0 || w->n_out == 0) return;
    if (pe__type_is_ext(w->type)) {
        matmul_ext(tp, w, x, n_tok, y, scratch);
        return;
    }
    if (pe__type_is_quant(w->type)) {
        uint8_t *s = (uint8_t *)round_up((uintptr_t)scratch, 64);
        p.m.nb = w->n_in / QK8_0;
        p.m.xq_stride = round_up(w->n_in, 64);
        p.m.xq = (const int8_t *)s;
        p.m.xd = (const float *)(s + (size_t)n_tok * p.m.xq_stride);
        p.m.xc = (const int32_t *)(p.m.xd + (size_t)n_tok * p.m.nb);
        uint32_t n_qt = (n_tok + QUANT_TASK_TOK - 1) / QUANT_TASK_TOK;
        pe_tp_run_max(tp, quant_task, &p, n_qt, work_threads(tp, (uint64_t)n_tok * w->n_in));
    }
    uint32_t n_threads = pe_tp_n_threads(tp);
    if (n_tok < pe__gemm_min_tok(p.k, w->type)) {
        p.n_threads = n_threads;
        atomic_init(&p.next_row, 0);
        pe_tp_run_max(tp, gemv_task, &p, n_threads, work_threads(tp, mm_work(w, n_tok)));
        return;
    }
    /* GEMM: large tiles reuse each panel across many tokens, but keep >= 4 tasks per thread
     * so that the atomic task counter can balance them. */
    uint32_t rows = GEMM_TASK_ROWS;
    const uint32_t n_tt = (n_tok + GEMM_TASK_TOK - 1) / GEMM_TASK_TOK;
    while (rows > 32 && (size_t)((w->n_out + rows - 1) / rows) * n_tt < 4u * n_threads)
        rows /= 2;
    p.rows_per_task = rows;
    p.tok_per_task = GEMM_TASK_TOK;
    p.n_row_tasks = (w->n_out + rows - 1) / rows;
    pe_tp_run_max(tp, mm_task, &p, p.n_row_tasks * n_tt, work_threads(tp, mm_work(w, n_tok)));
}

void pe_matmul(pe_threadpool *tp, const pe_mat *w, const float *x, uint32_t n_tok, float *y,
               void *scratch)
{
    pe_matmul_ex(tp, w, x, n_tok, y, scratch, 0);
}

/* ---- vector helpers ---- */

void pe_rmsnorm(float *out, const float *x, const float *w, uint32_t n, float eps)
{
    kernels()->rmsnorm(out, x, w, n, eps);
}

float pe_dot_f32(const float *a, const float *b, uint32_t n)
{
    return kernels()->dot_f32(a, b, n);
}

void pe_axpy_f32(float *y, float a, const float *x, uint32_t n)
{
    kernels()->axpy_f32(y, a, x, n);
}

void pe_softmax(float *x, uint32_t n)
{
    kernels()->softmax(x, n);
}

void pe_swiglu_f32(float *g, const float *u, size_t n)
{
    kernels()->swiglu(g, u, n);
}

/* ---- GeGLU (gemma) ---- */

/* ggml's GELU table (ggml-cpu GGML_GELU_FP16, ggml_table_gelu_f16): the tanh GELU of every
 * f16 value, computed in f32 as ggml_gelu_f32 does and rounded to f16; kept here as the f32
 * values of those f16s (256 KiB). Written once (pthread_once), read-only after. */
static float gelu_table[1 << 16];
static pthread_once_t gelu_once = PTHREAD_ONCE_INIT;

static void gelu_init(void)
{
    const float a = 0.044715f, s = 0.79788456080286535587989211986876f;
    for (uint32_t i = 0; i < (1u << 16); i++) {
        const float x = pe_f16_to_f32((uint16_t)i);
        const float g = 0.5f * x * (1.0f + tanhf(s * x * (1.0f + a * x * x)));
        gelu_table[i] = pe_f16_to_f32(pe_f32_to_f16(g));
    }
}

/* One loop for every ISA: measured 0.5 ns a value on 2 x 8192 values (an F16C + AVX2-gather
 * version was no faster, ratio 0.94-1.48 over 5 runs), i.e. ~5 us for gemma2 2B's n_ff 9216
 * per token and layer, against its products' 3 x 2304 x 9216 multiply-adds: not worth a
 * kernel. */
void pe_geglu_f32(float *g, const float *u, size_t n)
{
    pthread_once(&gelu_once, gelu_init);
    for (size_t i = 0; i < n; i++) {
        const float x = g[i];
        g[i] = x <= -10.0f ? 0.0f : x >= 10.0f ? x * u[i] : gelu_table[pe_f32_to_f16(x)] * u[i];
    }
}

/* ---- scalar kernels (CPUs without AVX2) ---- */

static void quant_act_scalar(const float *x, uint32_t n, int32_t off, int8_t *q, float *d,
                             int32_t *c)
{
    for (uint32_t b = 0; b < n / QK8_0; b++) {
        block_q8_0 blk;
        pe__quant_q8_0_ref(x + (size_t)b * QK8_0, &blk, QK8_0);
        int32_t sum = 0;
        for (int j = 0; j < QK8_0; j++) {
            q[b * QK8_0 + j] = blk.qs[j];
            sum += blk.qs[j];
        }
        d[b] = pe_f16_to_f32(blk.d);
        c[b] = -off * sum;
    }
}

static float dot_f32_scalar(const float *a, const float *b, uint32_t n)
{
    float acc[8] = {0};
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += a[i + j] * b[i + j];
    for (; i < n; i++)
        acc[0] += a[i] * b[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static float row_dot_scalar(const pe_mm *m, const uint8_t *row, uint32_t t)
{
    const uint32_t n_in = m->w->n_in;
    const int8_t *xq = m->xq + t * m->xq_stride;
    const float *xd = m->xd + (size_t)t * m->nb;
    const float *x = m->x + (size_t)t * n_in;
    float acc[8] = {0};
    switch (m->w->type) {
    case PE_GGML_TYPE_Q8_0: {
        float s = 0.0f;
        for (uint32_t b = 0; b < m->nb; b++) {
            const block_q8_0 *blk = (const block_q8_0 *)row + b;
            int sumi = 0;
            for (int j = 0; j < QK8_0; j++)
                sumi += blk->qs[j] * xq[b * QK8_0 + j];
            s += (float)sumi * (pe_f16_to_f32(blk->d) * xd[b]);
        }
        return s;
    }
    case PE_GGML_TYPE_Q4_0: {
        float s = 0.0f;
        for (uint32_t b = 0; b < m->nb; b++) {
            const block_q4_0 *blk = (const block_q4_0 *)row + b;
            int sumi = 0;
            for (int j = 0; j < QK4_0 / 2; j++) {
                sumi += ((blk->qs[j] & 0x0f) - 8) * xq[b * QK4_0 + j];
                sumi += ((blk->qs[j] >> 4) - 8) * xq[b * QK4_0 + QK4_0 / 2 + j];
            }
            s += (float)sumi * pe_f16_to_f32(blk->d) * xd[b];
        }
        return s;
    }
    case PE_GGML_TYPE_F32:
        return dot_f32_scalar((const float *)row, x, n_in); /* the same 8-lane order */
    case PE_GGML_TYPE_F16:
    case PE_GGML_TYPE_BF16: {
        const uint16_t *wr = (const uint16_t *)row;
        const int f16 = m->w->type == PE_GGML_TYPE_F16;
        for (uint32_t i = 0; i < n_in; i++) {
            float wi = f16 ? pe_f16_to_f32(wr[i]) : pe_bf16_to_f32(wr[i]);
            acc[i & 7] += wi * x[i];
        }
        break;
    }
    default:
        PE_UNREACHABLE_TYPE(m->w->type);
    }
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static void rows_scalar(const pe_mm *m, uint32_t r0, uint32_t r1, uint32_t t0, uint32_t t1)
{
    const pe_mat *w = m->w;
    for (uint32_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
        for (uint32_t t = t0; t < t1; t++)
            m->y[(size_t)t * w->n_out + r] = row_dot_scalar(m, row, t);
    }
}

static void axpy_f32_scalar(float *y, float a, const float *x, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

/* Shared by every ISA: the sum of squares is a tiny part of the forward pass. */
static void rmsnorm_scalar(float *out, const float *x, const float *w, uint32_t n, float eps)
{
    double ss = 0.0;
    for (uint32_t i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    const float scale = 1.0f / sqrtf((float)(ss / n) + eps);
    for (uint32_t i = 0; i < n; i++)
        out[i] = (x[i] * scale) * w[i];
}

static void softmax_scalar(float *x, uint32_t n)
{
    if (n == 0) return;
    float max = x[0];
    for (uint32_t i = 1; i < n; i++)
        max = x[i] > max ? x[i] : max;
    double sum = 0.0;
    for (uint32_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    const float inv = (float)(1.0 / sum);
    for (uint32_t i = 0; i < n; i++)
        x[i] *= inv;
}

static void swiglu_scalar(float *g, const float *u, size_t n)
{
    for (size_t i = 0; i < n; i++)
        g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* rows_scalar is batch-invariant as it is: one loop per element, whatever the bounds. */
const pe_kernels pe__kernels_scalar = {
    quant_act_scalar, rows_scalar,    rows_scalar,    dot_f32_scalar,
    axpy_f32_scalar,  rmsnorm_scalar, softmax_scalar, swiglu_scalar,
};
