/* SPDX-License-Identifier: MIT */
/*
 * ops.h - compute kernels of the engine: row conversion (dequantize/quantize) and
 * matrix products over weights of type F32, F16, BF16, Q8_0 and Q4_0 (SIMD), and Q4_1, Q5_0,
 * Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (scalar, ggml's activation quantization).
 *
 * Every kernel has a scalar reference (the spec, in ops_ref.c) and SIMD versions
 * (AVX2/FMA/F16C and AVX-512, chosen once at run time from the CPU's features); tests
 * check each SIMD kernel against the reference on random shapes within a stated bound.
 *
 * Products: Y[t][o] = sum_i W[o][i] * X[t][i]  for t < n_tok, o < n_out, i < n_in.
 * W is row-major with n_out rows of n_in values of its type (ggml layout: a GGUF tensor of
 * ne = {n_in, n_out}). For Q8_0/Q4_0 weights the activations are quantized to Q8_0 per
 * row first (as llama.cpp does) and the dot products run on integers.
 */
#ifndef PE_OPS_H
#define PE_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "ggml_types.h"
#include "threadpool.h"

/* A weight matrix: n_out rows of n_in values of type. packed (NULL: none) is a copy of a
 * Q8_0 matrix repacked once by pe_mat_pack for the x86 kernels (AVX-512, AVX-VNNI, AVX2),
 * which then read it instead of data at every token count; the scalar kernels and the
 * reference read data, which stays valid. */
typedef struct pe_mat {
    uint32_t type; /* pe_ggml_type: F32 F16 BF16 Q8_0 Q4_0, or one of the types above */
    uint32_t n_in, n_out;
    const void *data;
    uint64_t row_bytes;
    const void *packed;
} pe_mat;

/* The kernel levels, in order. PE_ISA_AVX2_VNNI is AVX2 with AVX-VNNI (VEX vpdpbusd, CPUID
 * leaf 7 subleaf 1 EAX bit 4): the AVX2 kernels, with their matrix-matrix products on
 * vpdpbusd instead of maddubs/madd. A CPU may have AVX-512 without AVX-VNNI (Ice Lake). */
typedef enum pe_isa {
    PE_ISA_SCALAR = 0,
    PE_ISA_AVX2 = 1,
    PE_ISA_AVX2_VNNI = 2,
    PE_ISA_AVX512 = 3
} pe_isa;

/* The best ISA this CPU has (detected once). */
pe_isa pe_isa_detect(void);
/* "scalar", "avx2", "avx2vnni", "avx512". */
const char *pe_isa_name(pe_isa isa);
/* Whether this CPU can run isa (every level up to pe_isa_detect(), but PE_ISA_AVX2_VNNI
 * only with AVX-VNNI). */
int pe_isa_has(pe_isa isa);
/* Forces an ISA for the kernels below (tests and benches); never above the detected one,
 * and PE_ISA_AVX2 in place of PE_ISA_AVX2_VNNI where the CPU lacks AVX-VNNI. Returns the
 * ISA now in force. */
pe_isa pe_isa_force(pe_isa isa);
/* The ISA the kernels run on: the forced one, else pe_isa_detect lowered by the environment
 * variable PGD_ISA (scalar|avx2|avx512|auto, read once; a bad or too high value warns on
 * stderr and keeps the detected one). Thread-safe. */
pe_isa pe_isa_active(void);

/* Repacks m (Q8_0 only, and only while the active kernels are x86 ones) into m->packed:
 * per group of 16 rows (the last zero-padded), the f16 row scales of every block, then the
 * values as the panels of ops_avx512.c hold them (ops_avx512.c: "packed layout"), as many
 * bytes as m->data (plus at most 15 zero rows and 32 bytes of padding per group), 64-byte
 * aligned. On AVX-512 the products on it are bit-identical to those on m->data; on the AVX2
 * levels they are bit-identical to pe_matmul_ref at every token count (on m->data, their
 * decode tiles sum in another order). The caller owns the copy and frees it with
 * pe_mat_unpack before m's data goes away. Returns 1 when packed, 0 when m does not qualify
 * (left as it was), -1 when out of memory (left as it was). */
int pe_mat_pack(pe_mat *m);
/* Frees m->packed (if any) and sets it to NULL. */
void pe_mat_unpack(pe_mat *m);
/* The bytes pe_mat_pack allocates for m (0 when m would not be packed). */
size_t pe_mat_packed_bytes(const pe_mat *m);

/* Converts n values of a row of type to f32 (n a multiple of the block size). */
void pe_dequant_row(uint32_t type, const void *src, float *dst, size_t n);
/* Converts n f32 values to a row of type (n a multiple of the block size; every type that
 * pe_dequant_row decodes), as ggml's reference quantizers do without an importance matrix
 * (the bytes llama-quantize writes; engine/ops/quantize.c for the issue-15 types). */
void pe_quant_row(uint32_t type, const float *src, void *dst, size_t n);

/* Y[n_tok][n_out] = X[n_tok][n_in] * W^T, multithreaded over tp (NULL: this thread).
 * scratch: at least pe_matmul_scratch_bytes(W, n_tok) bytes (quantized activations).
 * x and y must not overlap. Matches pe_matmul_ref within 1e-5 * sum_i |w_i x_i| per output
 * (Q8_0/Q4_0: the integer block dots are exact; tests/engine/test_ops.c). Uses up to 40 KB
 * of stack per thread for repacked weight panels. Calls with different pools and scratch
 * may run concurrently. */
size_t pe_matmul_scratch_bytes(const pe_mat *w, uint32_t n_tok);
void pe_matmul(pe_threadpool *tp, const pe_mat *w, const float *x, uint32_t n_tok, float *y,
               void *scratch);

/* Flags of pe_matmul_ex. */
enum {
    /* Batch-invariant: each output element y[t][o] gets the same bits whatever n_tok, the
     * other rows of x and the thread count, because every element goes through one kernel
     * with one fixed reduction order (on AVX-512 the repacked panel path at every n_tok,
     * where plain pe_matmul streams the stored rows for few tokens; AVX2 and scalar have one
     * path already). Costs decode speed on AVX-512 (bench_matmul --invariant). */
    PE_MM_INVARIANT = 1u << 0,
};

/* pe_matmul with flags (PE_MM_*); flags 0 is pe_matmul. */
void pe_matmul_ex(pe_threadpool *tp, const pe_mat *w, const float *x, uint32_t n_tok, float *y,
                  void *scratch, uint32_t flags);

/* The scalar reference of pe_matmul (single thread), for tests. */
void pe_matmul_ref(const pe_mat *w, const float *x, uint32_t n_tok, float *y);

/* Small vector helpers used by the forward pass (SIMD where it pays). */
/* out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i]; out may be x (in place). */
void pe_rmsnorm(float *out, const float *x, const float *w, uint32_t n, float eps);
float pe_dot_f32(const float *a, const float *b, uint32_t n);
/* y += a * x */
void pe_axpy_f32(float *y, float a, const float *x, uint32_t n);
/* Softmax in place over n values (max-subtracted, f32). */
void pe_softmax(float *x, uint32_t n);
/* SwiGLU in place: g[i] = silu(g[i]) * u[i] = g[i] / (1 + e^-g[i]) * u[i] (vectorised exp,
 * relative error < 1e-6). */
void pe_swiglu_f32(float *g, const float *u, size_t n);
/* GeGLU in place, as llama.cpp's CPU backend computes it (ggml_vec_geglu_f32 with
 * GGML_GELU_FP16): g[i] = gelu(g[i]) * u[i] with the tanh GELU, where gelu(x) is 0 for
 * x <= -10, x for x >= 10, and otherwise ggml's table: x rounded to f16, its GELU rounded
 * to f16. Element by element (batch-invariant); any thread (the table is built once). */
void pe_geglu_f32(float *g, const float *u, size_t n);

#endif /* PE_OPS_H */
