/* SPDX-License-Identifier: MIT */
/*
 * test_quantize.c - pe_quant_row for the weight types of issue 15 (engine/ops/quantize.c):
 * Q2_K Q3_K Q4_K Q5_K Q6_K Q4_1 Q5_0 Q5_1 IQ4_NL (and Q8_0/Q4_0 where the reference set
 * covers them).
 *
 *   round trip: dequant(quant(x)) against x, 64 rows of 512 values per distribution (each
 *     row its own scale, log-uniform in 1e-3..10): the mean over the rows of the relative RMS
 *     error sqrt(sum (y - x)^2 / sum x^2) under a bound per type, about 1.25 x what was
 *     measured (three seeds; gauss / uniform / outliers, about 1 value in 64 at 20x):
 *       q2_k   0.297 / 0.233 / 0.274      bounds 0.36 / 0.34
 *       q3_k   0.152 / 0.125 / 0.158      bounds 0.19 / 0.20
 *       q4_k   0.0716 / 0.0548 / 0.100    bounds 0.09 / 0.125
 *       q5_k   0.0363 / 0.0279 / 0.0511   bounds 0.045 / 0.064
 *       q6_k   0.0181 / 0.0147 / 0.0333   bounds 0.023 / 0.042
 *       q4_1   0.0784 / 0.0610 / 0.111    bounds 0.098 / 0.14
 *       q5_0   0.0429 / 0.0312 / 0.0871   bounds 0.054 / 0.11
 *       q5_1   0.0380 / 0.0295 / 0.0530   bounds 0.048 / 0.067
 *       iq4_nl 0.0767 / 0.0644 / 0.123    bounds 0.096 / 0.155
 *     Constant rows (0.37 and -1.3) come back within 3e-4 (the f16 rounding of the scale
 *     or min; bound 1e-3); all-zero rows come back all zero.
 *   exact: a row built from values the format represents exactly (power-of-two or integer
 *     multiple scales, every sub-block spanning its full integer range) comes back bit-exact.
 *   valid: rows of mixed magnitudes (1e-30 .. 3e4, signed, with zeros, denormals and single
 *     outliers) decode to finite values only, and each value lies within the row's range
 *     widened by its largest |x| (a block never decodes far outside its input).
 *   llama-quantize: ../shared/models/reference (or $PGD_REFERENCE_DIR): the f32 matrix of
 *     dequant/ quantized by pe_quant_row equals the bytes llama-quantize wrote for every type,
 *     and every quantized tensor of the tiny-llama-<type> files equals pe_quant_row of the same
 *     tensor of tiny-llama-f16. Without the folder that part is skipped (exit 77 after the rest).
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "ops.h"
#include "t.h"

static uint64_t seed = 0x9e3779b97f4a7c15ULL;

static double urand(void) /* uniform in [0, 1) */
{
    return (double)(t_rand(&seed) >> 11) * (1.0 / 9007199254740992.0);
}

static float grand(void) /* standard normal (Box-Muller) */
{
    double u = urand(), v = urand();
    return (float)(sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v));
}

typedef struct qtype {
    uint32_t type;
    const char *name;
    float bound, bound_outliers; /* relative RMS error bounds: gauss and uniform, outliers */
} qtype;

static const qtype types[] = {
    {PE_GGML_TYPE_Q2_K, "q2_k", 0.36f, 0.34f},       {PE_GGML_TYPE_Q3_K, "q3_k", 0.19f, 0.20f},
    {PE_GGML_TYPE_Q4_K, "q4_k", 0.09f, 0.125f},      {PE_GGML_TYPE_Q5_K, "q5_k", 0.045f, 0.064f},
    {PE_GGML_TYPE_Q6_K, "q6_k", 0.023f, 0.042f},     {PE_GGML_TYPE_Q4_1, "q4_1", 0.098f, 0.14f},
    {PE_GGML_TYPE_Q5_0, "q5_0", 0.054f, 0.11f},      {PE_GGML_TYPE_Q5_1, "q5_1", 0.048f, 0.067f},
    {PE_GGML_TYPE_IQ4_NL, "iq4_nl", 0.096f, 0.155f},
};
enum { N_TYPES = sizeof types / sizeof types[0], N = 512, ROWS = 64 };

/* Round trip of one row; returns sum (y - x)^2 and adds sum x^2 to *sx2. Fails (returns -1)
 * when a decoded value is not finite. */
static double round_trip(uint32_t type, const float *x, float *y, size_t n, double *sx2)
{
    uint8_t q[N / 32 * 34 + 64]; /* the largest row of N values (q8_0) */
    pe_quant_row(type, x, q, n);
    pe_dequant_row(type, q, y, n);
    double e = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(y[i])) return -1;
        e += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
        *sx2 += (double)x[i] * x[i];
    }
    return e;
}

enum { D_GAUSS, D_UNIFORM, D_OUTLIERS, D_CONST_POS, D_CONST_NEG, D_ZERO, N_DIST };
static const char *const dist_names[N_DIST] = {"gauss",  "uniform", "outliers",
                                               "c 0.37", "c -1.3",  "zero"};

static void gen(int dist, float *x, size_t n)
{
    const float scale = (float)exp(log(1e-3) + urand() * log(1e4)); /* 1e-3 .. 10 */
    for (size_t i = 0; i < n; i++) {
        switch (dist) {
        case D_GAUSS:
            x[i] = scale * grand();
            break;
        case D_UNIFORM:
            x[i] = scale * (float)(2 * urand() - 1);
            break;
        case D_OUTLIERS: /* about one value in 64 is 20x the others */
            x[i] = scale * grand() * (t_rand(&seed) % 64 == 0 ? 20.0f : 1.0f);
            break;
        case D_CONST_POS:
            x[i] = 0.37f;
            break;
        case D_CONST_NEG:
            x[i] = -1.3f;
            break;
        default:
            x[i] = 0.0f;
        }
    }
}

static int test_round_trip_error(void)
{
    float x[N], y[N];
    for (int k = 0; k < N_TYPES; k++) {
        char line[256];
        int len = snprintf(line, sizeof line, "     %-6s", types[k].name);
        for (int d = 0; d < N_DIST; d++) {
            double rel = 0; /* the mean over the rows of each row's relative RMS error */
            for (int r = 0; r < ROWS; r++) {
                double sx2 = 0;
                gen(d, x, N);
                double er = round_trip(types[k].type, x, y, N, &sx2);
                if (er < 0)
                    T_FAIL("%s %s row %d: a decoded value is not finite", types[k].name,
                           dist_names[d], r);
                if (d == D_ZERO && er != 0)
                    T_FAIL("%s: an all-zero row decodes to non-zero values", types[k].name);
                rel += d == D_ZERO ? 0 : sqrt(er / sx2) / ROWS;
            }
            if (d == D_ZERO) continue;
            const double bound = d >= D_CONST_POS  ? 1e-3
                                 : d == D_OUTLIERS ? types[k].bound_outliers
                                                   : types[k].bound;
            len += snprintf(line + len, sizeof line - (size_t)len, " %s %.4f", dist_names[d], rel);
            if (!(rel <= bound))
                T_FAIL("%s %s: relative RMS error %.4f over the bound %.4f", types[k].name,
                       dist_names[d], rel, bound);
        }
        printf("%s\n", line);
    }
    return 0;
}

/* ---- exactly representable rows ---- */

/* A row of n values that type represents exactly; every sub-block uses its extreme integer
 * values so that the quantizer's range search lands on the generating scale. */
static void gen_exact(uint32_t type, float *x, size_t n)
{
    static const int8_t iq4[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                   1,    13,   25,  38,  53,  69,  89,  113};
    for (size_t b = 0; b < n / 32; b++) {
        float *xb = x + b * 32;
        const float p2 = ldexpf(1.0f, (int)(t_rand(&seed) % 12) - 8); /* 2^-8 .. 2^3 */
        for (int j = 0; j < 32; j++) {
            const uint64_t r = t_rand(&seed) >> 32;
            switch (type) {
            case PE_GGML_TYPE_Q4_1: /* m + d q, q 0..15, with 0 and 15 present */
                xb[j] = p2 * (float)(j == 0 ? 0 : j == 1 ? 15 : (int)(r % 16)) - 3 * p2;
                break;
            case PE_GGML_TYPE_Q5_1:
                xb[j] = p2 * (float)(j == 0 ? 0 : j == 1 ? 31 : (int)(r % 32)) + 5 * p2;
                break;
            case PE_GGML_TYPE_Q5_0: /* d (q - 16), -16 present (the largest |x|) */
                xb[j] = p2 * (float)(j == 5 ? -16 : (int)(r % 32) - 16);
                break;
            case PE_GGML_TYPE_IQ4_NL: /* d * table, -127 present */
                xb[j] = p2 * iq4[j == 3 ? 0 : r % 16];
                break;
            default:
                break;
            }
        }
    }
    if (n % 256 != 0) return;
    for (size_t sb = 0; sb < n / 256; sb++) {
        float *xs = x + sb * 256;
        const int e = (int)(t_rand(&seed) % 8) - 10; /* unit of the sub-block scales */
        switch (type) {
        case PE_GGML_TYPE_Q6_K:
        case PE_GGML_TYPE_Q3_K: {
            /* x = 2^k q per 16 values, q in -32..31 (-4..3), the negative end present; the
             * scales are powers of two within the int8 (6-bit) scale's range */
            const int lo = type == PE_GGML_TYPE_Q6_K ? -32 : -4, span = -2 * lo;
            for (int g = 0; g < 16; g++) {
                const float s = ldexpf(1.0f, e + (g == 0 ? 5 : (int)(t_rand(&seed) % 6)));
                for (int l = 0; l < 16; l++) {
                    const int q = l == 7   ? lo
                                  : l == 8 ? lo + 1
                                           : lo + (int)((t_rand(&seed) >> 32) % (uint64_t)span);
                    xs[g * 16 + l] = s * (float)q;
                }
            }
            break;
        }
        case PE_GGML_TYPE_Q2_K:
        case PE_GGML_TYPE_Q4_K:
        case PE_GGML_TYPE_Q5_K: {
            /* x = d sc q - dmin m, sc 1..smax (smax present), m 0..smax, q 0..qmax with both
             * ends present in every sub-block */
            const int sub = type == PE_GGML_TYPE_Q2_K ? 16 : 32;
            const int smax = type == PE_GGML_TYPE_Q2_K ? 15 : 63;
            const int qmax = type == PE_GGML_TYPE_Q2_K ? 3 : type == PE_GGML_TYPE_Q4_K ? 15 : 31;
            const float d = ldexpf(1.0f, e), dmin = ldexpf(1.0f, e + 2);
            for (int g = 0; g < 256 / sub; g++) {
                const int sc = g == 1 ? smax : 1 + (int)(t_rand(&seed) % (uint64_t)smax);
                const int m = g == 2 ? smax : (int)(t_rand(&seed) % (uint64_t)(smax + 1));
                for (int l = 0; l < sub; l++) {
                    const int q = l == 0   ? 0
                                  : l == 1 ? qmax
                                  : l == 2 ? 1
                                  : l == 3 ? 2
                                           : (int)((t_rand(&seed) >> 32) % (uint64_t)(qmax + 1));
                    xs[g * sub + l] = d * (float)sc * (float)q - dmin * (float)m;
                }
            }
            break;
        }
        default:
            break;
        }
    }
}

static int test_exact_rows_come_back_exact(void)
{
    float x[N], y[N];
    for (int k = 0; k < N_TYPES; k++) {
        for (int r = 0; r < ROWS; r++) {
            double sx2 = 0;
            gen_exact(types[k].type, x, N);
            double e = round_trip(types[k].type, x, y, N, &sx2);
            T_ASSERT(e >= 0);
            for (int i = 0; i < N; i++) {
                if (x[i] != y[i])
                    T_FAIL("%s row %d: value %d %.9g comes back as %.9g", types[k].name, r, i, x[i],
                           y[i]);
            }
        }
    }
    return 0;
}

/* ---- validity on hostile inputs ---- */

static int test_blocks_are_valid(void)
{
    float x[N], y[N];
    for (int k = 0; k < N_TYPES; k++) {
        for (int r = 0; r < 4 * ROWS; r++) {
            float amax = 0.0f;
            for (int i = 0; i < N; i++) {
                const uint64_t c = t_rand(&seed) % 16;
                const float mag = (float)exp(log(1e-30) + urand() * (log(3e4) - log(1e-30)));
                x[i] = c == 0 ? 0.0f : c == 1 ? 1e-40f : (urand() < 0.5 ? -mag : mag);
                if (r % 3 == 0) x[i] *= 1e-3f; /* mostly small rows */
                if (r % 3 == 1 && i % 97 == 5) x[i] = (r & 4) ? 3e4f : -3e4f; /* outliers */
                if (r % 5 == 4) x[i] = (i / 32) % 2 ? 1e-20f : x[i];          /* tiny blocks */
                amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
            }
            double sx2 = 0;
            if (round_trip(types[k].type, x, y, N, &sx2) < 0)
                T_FAIL("%s row %d: a decoded value is not finite", types[k].name, r);
            for (int i = 0; i < N; i++) {
                if (!(fabsf(y[i]) <= 2.0f * amax + 1e-30f))
                    T_FAIL("%s row %d: value %d %.6g decodes to %.6g, outside 2 x max |x| %.6g",
                           types[k].name, r, i, x[i], y[i], amax);
            }
        }
    }
    return 0;
}

/* ---- against llama-quantize (the reference set) ---- */

static const char *ref_dir(char *buf, size_t len)
{
    const char *env = getenv("PGD_REFERENCE_DIR");
    if (env && env[0]) return env;
    snprintf(buf, len, "%s/../shared/models/reference", PGD_SOURCE_DIR);
    return buf;
}

static int have_reference = 1;

/* Quantizes the rows of src (f32 or f16, ne[0] values each) to want's type and compares with
 * want's bytes. Returns the number of differing rows, -1 on a shape mismatch. */
static long compare_tensor(const pe_gguf_tensor *src, const pe_gguf_tensor *want)
{
    const uint64_t n = src->ne[0], rows = src->ne[1];
    const uint64_t src_rb = pe_ggml_row_size(src->type, n), rb = pe_ggml_row_size(want->type, n);
    if (want->ne[0] != n || want->ne[1] != rows || rb == 0 || want->n_bytes != rb * rows) return -1;
    float *x = malloc(n * sizeof *x);
    uint8_t *q = malloc(rb);
    long bad = 0;
    if (!x || !q) abort();
    for (uint64_t r = 0; r < rows; r++) {
        pe_dequant_row(src->type, (const uint8_t *)src->data + r * src_rb, x, n);
        pe_quant_row(want->type, x, q, n);
        if (memcmp(q, (const uint8_t *)want->data + r * rb, rb) != 0) bad++;
    }
    free(x);
    free(q);
    return bad;
}

static int test_dequant_ref_bytes(void)
{
    char buf[4096], path[4200], err[256];
    const char *dir = ref_dir(buf, sizeof buf);
    static const char *const names[] = {"q2_k", "q3_k", "q4_k", "q5_k", "q6_k",  "q4_0",
                                        "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl"};
    pe_gguf_file *f = NULL;
    snprintf(path, sizeof path, "%s/dequant/dequant-ref.gguf", dir);
    if (pe_gguf_open(path, &f, err, sizeof err) != 0) {
        fprintf(stderr, "skipped: %s: %s (set PGD_REFERENCE_DIR)\n", path, err);
        have_reference = 0;
        return 0;
    }
    const size_t n = 256 * 512;
    float *orig = malloc(n * sizeof *orig);
    T_ASSERT(orig);
    snprintf(path, sizeof path, "%s/dequant/dequant-ref-original.f32", dir);
    FILE *fp = fopen(path, "rb");
    T_ASSERT(fp);
    T_EQ(fread(orig, sizeof *orig, n, fp), n);
    fclose(fp);
    pe_gguf_tensor src = {.n_dims = 2, .ne = {256, 512, 1, 1}, .type = PE_GGML_TYPE_F32};
    src.data = orig;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char tname[32];
        snprintf(tname, sizeof tname, "ref.%s", names[i]);
        const pe_gguf_tensor *t = pe_gguf_find_tensor(f, tname);
        T_ASSERT(t != NULL);
        long bad = compare_tensor(&src, t);
        if (bad != 0)
            T_FAIL("%s: %ld of 512 rows differ from llama-quantize's bytes", names[i], bad);
        printf("     %-6s 512 rows byte-identical to llama-quantize\n", names[i]);
    }
    free(orig);
    pe_gguf_close(f);
    return 0;
}

static int test_model_files_bytes(void)
{
    static const char *const stems[] = {"q2_k", "q3_k_m", "q4_k_m", "q4_k_s", "q5_k_m", "q6_k",
                                        "q4_0", "q4_1",   "q5_0",   "q5_1",   "q8_0",   "iq4_nl"};
    char buf[4096], path[4200], err[256];
    const char *dir = ref_dir(buf, sizeof buf);
    pe_gguf_file *f16 = NULL;
    if (!have_reference) return 0;
    snprintf(path, sizeof path, "%s/models/tiny-llama-f16/tiny-llama-f16.gguf", dir);
    if (pe_gguf_open(path, &f16, err, sizeof err) != 0) T_FAIL("%s: %s", path, err);
    for (size_t s = 0; s < sizeof stems / sizeof stems[0]; s++) {
        pe_gguf_file *fq = NULL;
        snprintf(path, sizeof path, "%s/models/tiny-llama-%s/tiny-llama-%s.gguf", dir, stems[s],
                 stems[s]);
        if (pe_gguf_open(path, &fq, err, sizeof err) != 0) T_FAIL("%s: %s", path, err);
        int n_checked = 0;
        for (uint64_t i = 0; i < pe_gguf_n_tensors(fq); i++) {
            const pe_gguf_tensor *t = pe_gguf_tensor_at(fq, i);
            char name[96];
            if (t->type == PE_GGML_TYPE_F32 || t->type == PE_GGML_TYPE_F16) continue;
            snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
            const pe_gguf_tensor *src = pe_gguf_find_tensor(f16, name);
            if (!src) T_FAIL("%s: no tensor %s in the f16 file", stems[s], name);
            long bad = compare_tensor(src, t);
            if (bad != 0)
                T_FAIL("%s: %s (%s): %ld of %llu rows differ from llama-quantize's", stems[s], name,
                       pe_ggml_type_name(t->type), bad, (unsigned long long)t->ne[1]);
            n_checked++;
        }
        printf("     tiny-llama-%-6s %d quantized tensors byte-identical\n", stems[s], n_checked);
        pe_gguf_close(fq);
    }
    pe_gguf_close(f16);
    return 0;
}

int main(void)
{
    T_RUN(test_round_trip_error);
    T_RUN(test_exact_rows_come_back_exact);
    T_RUN(test_blocks_are_valid);
    T_RUN(test_dequant_ref_bytes);
    T_RUN(test_model_files_bytes);
    if (!t_failed && !have_reference) T_SKIP("reference set not found: llama-quantize checks");
    T_DONE();
}
