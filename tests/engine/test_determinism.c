/* SPDX-License-Identifier: MIT */
/*
 * test_determinism.c - the cache is transparent end to end (issue 10, section 1): with
 * pe_ctx_params.deterministic, for every kv type (f32 f16 bf16 q8_0 q4_0 kivi2),
 *   - sched: 20 greedy requests through the scheduler with a pool so small that requests
 *     are preempted and recomputed (pe_sched_get_stats: preemptions > 0) give exactly the
 *     tokens they get with a large pool (0 differences of 20);
 *   - batch: one request alone and the same request in a batch of 8 concurrent sequences
 *     (pe_forward_batch: prefill of all 8 in one step, then decode steps of all 8) give
 *     bit-identical logits (memcmp) at the prompt's last token and at every decode step.
 * Models: stories260K (f32 weights, head_dim 8, so a q8_0/q4_0 block spans 4 tokens) and a
 * random-weight model with head_dim 64 (f16 weights) written by `pagoda synth-model`.
 *
 * Every kv type runs even when an earlier one fails; each prints one line with its figures
 * and the program fails if any does. Usage: test_determinism [PAGODA_BINARY SCRATCH_DIR]:
 * without the binary the random-weight model is left out; without stories260K (tests/proc.h
 * says where models are looked for) that part is, and with neither the test exits 77.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "proc.h"
#include "scheduler.h"
#include "t.h"

enum {
    N_PROMPTS = 20,
    MAX_PROMPT = 40,
    GEN = 24,
    N_SEQS = 8,
    DECODE_STEPS = 12,
};

static pe_model *g_model;
static const char *g_name;

static const pgd_kv_type kv_types[] = {PGD_KV_F32,  PGD_KV_F16,  PGD_KV_BF16,
                                       PGD_KV_Q8_0, PGD_KV_Q4_0, PGD_KV_KIVI2};
enum { N_KV = sizeof kv_types / sizeof kv_types[0] };

static pe_ctx *make_ctx(pgd_kv_type kv, uint64_t kv_tokens)
{
    pe_ctx_params p = pe_ctx_default_params();
    char err[256];
    pe_ctx *c;
    p.n_ctx = 256;
    p.n_batch = 256;
    p.page_tokens = 16;
    p.kv_type = kv;
    p.n_threads = 2;
    p.kv_tokens = kv_tokens;
    p.deterministic = 1;
    p.log = NULL; /* preemption warnings are expected here */
    if (pe_ctx_create(g_model, &p, &c, err, sizeof err)) {
        fprintf(stderr, "pe_ctx_create (%s): %s\n", pgd_kv_type_name(kv), err);
        return NULL;
    }
    return c;
}

static void random_tokens(uint64_t *seed, int32_t *t, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        t[i] = 3 + (int32_t)(t_rand(seed) % (pe_model_hparams(g_model)->n_vocab - 3));
}

/* ---- 20 prompts: tiny pool (preemptions) vs large pool ---- */

typedef struct out {
    int32_t toks[GEN];
    uint32_t n;
    pe_finish finish;
} out;

static void on_token(void *ud, uint64_t id, int32_t tok, pe_finish why, const pe_usage *u)
{
    out *o = ud;
    (void)id, (void)u;
    if (why == PE_FINISH_NONE) {
        if (o->n < GEN) o->toks[o->n++] = tok;
        return;
    }
    o->finish = why;
}

/* Runs the prompts concurrently on a pool of kv_tokens; outputs into o, preemptions into
 * *n_pre. */
static int run_prompts(pgd_kv_type kv, uint64_t kv_tokens, int32_t (*prompts)[MAX_PROMPT],
                       const uint32_t *lens, out *o, uint64_t *n_pre)
{
    pe_ctx *c = make_ctx(kv, kv_tokens);
    T_ASSERT(c);
    pe_sched_params sp = pe_sched_default_params();
    pe_sched *s;
    sp.model = g_model;
    sp.max_running = 8;
    sp.max_queued = N_PROMPTS;
    sp.chunk = 16;
    T_OK(pe_sched_create(c, &sp, &s));
    pe_request_params rp = pe_request_default_params();
    rp.max_tokens = GEN;
    rp.sampler.temp = 0;
    rp.stop_on_eog = 0;
    for (int i = 0; i < N_PROMPTS; i++) {
        uint64_t id;
        memset(&o[i], 0, sizeof o[i]);
        T_OK(pe_sched_submit(s, &rp, prompts[i], lens[i], on_token, &o[i], &id));
    }
    T_OK(pe_sched_run_until_idle(s));
    pe_sched_stats st;
    pe_sched_get_stats(s, &st);
    *n_pre = st.n_preemptions;
    T_EQ(pgd_cache_check(pe_ctx_cache(c)), PGD_OK);
    pe_sched_destroy(s);
    pe_ctx_destroy(c);
    for (int i = 0; i < N_PROMPTS; i++) {
        T_EQ(o[i].finish, PE_FINISH_LENGTH);
        T_EQ(o[i].n, GEN);
    }
    return 0;
}

static int check_sched(pgd_kv_type kv)
{
    static int32_t prompts[N_PROMPTS][MAX_PROMPT];
    static out big[N_PROMPTS], tiny[N_PROMPTS];
    uint32_t lens[N_PROMPTS];
    uint64_t seed = 1234, pre_big, pre_tiny;
    for (int i = 0; i < N_PROMPTS; i++) {
        lens[i] = 8 + (uint32_t)(t_rand(&seed) % (MAX_PROMPT - 8));
        random_tokens(&seed, prompts[i], lens[i]);
        prompts[i][0] = 1;
    }
    /* one request needs at most 64 tokens (4 pages): 6 pages hold one and a bit */
    T_OK(run_prompts(kv, 4096, prompts, lens, big, &pre_big));
    T_OK(run_prompts(kv, 96, prompts, lens, tiny, &pre_tiny));
    int diff = 0;
    for (int i = 0; i < N_PROMPTS; i++)
        diff += memcmp(big[i].toks, tiny[i].toks, sizeof big[i].toks) != 0;
    printf("%s %-5s sched: %d of %d outputs differ (tiny pool: %llu preemptions)\n", g_name,
           pgd_kv_type_name(kv), diff, N_PROMPTS, (unsigned long long)pre_tiny);
    T_EQ(pre_big, 0);
    T_ASSERT(pre_tiny > 0);
    T_EQ(diff, 0);
    return 0;
}

/* ---- one request alone vs in a batch of 8 ---- */

static int argmax(const float *v, uint32_t n)
{
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return (int)b;
}

static int check_batch(pgd_kv_type kv)
{
    const uint32_t V = pe_model_hparams(g_model)->n_vocab;
    static int32_t prompts[N_SEQS][MAX_PROMPT];
    uint32_t lens[N_SEQS];
    uint64_t seed = 77;
    for (int i = 0; i < N_SEQS; i++) {
        lens[i] = 5 + (uint32_t)(t_rand(&seed) % (MAX_PROMPT - 5));
        random_tokens(&seed, prompts[i], lens[i]);
        prompts[i][0] = 1;
    }
    float *alone = malloc((size_t)(DECODE_STEPS + 1) * V * sizeof(float));
    float *batch = malloc((size_t)N_SEQS * V * sizeof(float));
    int32_t next[DECODE_STEPS + 1];
    T_ASSERT(alone && batch);

    /* sequence 3 alone: its prompt, then greedy decode one token at a time */
    const int who = 3;
    pe_ctx *c = make_ctx(kv, 4096);
    T_ASSERT(c);
    pgd_seq *s;
    T_OK(pgd_seq_create(pe_ctx_cache(c), NULL, 0, &s));
    T_OK(pe_forward(c, s, prompts[who], lens[who], alone, 0));
    for (int k = 0; k < DECODE_STEPS; k++) {
        next[k] = argmax(alone + (size_t)k * V, V);
        T_OK(pe_forward(c, s, &next[k], 1, alone + (size_t)(k + 1) * V, 0));
    }
    pgd_seq_destroy(pe_ctx_cache(c), s);
    pe_ctx_destroy(c);

    /* the 8 together: one prefill step of all prompts, then decode steps of all 8 (the
     * others decode their own greedy tokens) */
    c = make_ctx(kv, 4096);
    T_ASSERT(c);
    pgd_seq *seqs[N_SEQS];
    int32_t tok[N_SEQS];
    pe_batch_item it[N_SEQS];
    for (int i = 0; i < N_SEQS; i++) {
        T_OK(pgd_seq_create(pe_ctx_cache(c), NULL, 0, &seqs[i]));
        it[i] = (pe_batch_item){seqs[i], prompts[i], lens[i], batch + (size_t)i * V, 0, NULL,
                                0,       NULL,       0};
    }
    int bad_step = -1;
    for (int k = 0; k <= DECODE_STEPS; k++) {
        T_OK(pe_forward_batch(c, it, N_SEQS));
        if (bad_step < 0 && memcmp(batch + (size_t)who * V, alone + (size_t)k * V, V * 4))
            bad_step = k;
        for (int i = 0; i < N_SEQS; i++) {
            tok[i] = i == who && k < DECODE_STEPS ? next[k] : argmax(batch + (size_t)i * V, V);
            it[i].tokens = &tok[i];
            it[i].n = 1;
        }
    }
    for (int i = 0; i < N_SEQS; i++)
        pgd_seq_destroy(pe_ctx_cache(c), seqs[i]);
    pe_ctx_destroy(c);
    free(alone);
    free(batch);
    if (bad_step < 0)
        printf("%s %-5s batch: logits alone == in a batch of %d (prefill + %d decode steps)\n",
               g_name, pgd_kv_type_name(kv), N_SEQS, DECODE_STEPS);
    else
        printf("%s %-5s batch: logits alone != in a batch of %d, first at step %d (%s)\n", g_name,
               pgd_kv_type_name(kv), N_SEQS, bad_step, bad_step ? "decode" : "prefill");
    T_EQ(bad_step, -1);
    return 0;
}

/* Every kv type of the model loaded in g_model, counted as t.h's T_RUN counts. */
static void run_model(const char *name)
{
    g_name = name;
    for (int k = 0; k < N_KV; k++) {
        t_run += 2;
        t_failed += check_batch(kv_types[k]) != 0;
        t_failed += check_sched(kv_types[k]) != 0;
    }
}

static int load(const char *path)
{
    char err[256];
    if (pe_model_load(path, NULL, NULL, &g_model, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", path, err);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    char path[1024];
    int ran = 0;
    if (argc != 1 && argc != 3) {
        fprintf(stderr, "usage: %s [PAGODA_BINARY SCRATCH_DIR]\n", argv[0]);
        return 2;
    }
    if (t_model_file(path, sizeof path, "stories260K.gguf")) {
        if (load(path)) return 1;
        run_model("stories260K");
        pe_model_destroy(g_model);
        ran++;
    } else {
        fprintf(stderr, "stories260K.gguf not found: its part is left out\n");
    }
    if (argc == 3) {
        /* random weights, head_dim 256 / 4 = 64; near-uniform logits make greedy decoding
         * sensitive to any difference in the last bit */
        char sout[4096], errbuf[4096], args[2048];
        if (t_scratch_dir(argv[2])) return 1;
        snprintf(path, sizeof path, "%s/rand-hd64.gguf", argv[2]);
        snprintf(args, sizeof args,
                 "synth-model --shape tiny --dim 256 --heads 4 --kv-heads 2 --layers 2 --ffn 512 "
                 "--vocab-size 512 --type f16 --seed 5 -o '%s'",
                 path);
        if (t_run_bin(argv[1], argv[2], args, sout, sizeof sout, errbuf, sizeof errbuf) != 0) {
            fprintf(stderr, "synth-model failed: %s\n", errbuf);
            return 1;
        }
        if (load(path)) return 1;
        run_model("rand-hd64");
        pe_model_destroy(g_model);
        ran++;
    }
    if (!ran) T_SKIP("no model: stories260K.gguf not found and no pagoda binary given");
    T_DONE();
}
