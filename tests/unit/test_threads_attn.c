/* SPDX-License-Identifier: MIT */
/*
 * test_threads_attn.c - paged attention on real threads (label "thread": runs under TSan).
 * (1) A parallel fn of 4 pthreads runs the fast path with long sequences split into pieces,
 * whose last finisher merges (atomic counter): outputs equal the serial run bit for bit.
 * (2) Two callers, each with its own pgd_attn, attend at once over one cache whose
 * sequences share prefix pages (the supported concurrent use: one caller per pgd_attn).
 */
#include "attn_fixture.h"

enum { NH = 8, HD = 64 };

typedef struct caller {
    pgd_attn *a;
    pgd_attn_item it[3];
    float *expect[3];
    int bad;
} caller;

static void *caller_main(void *arg)
{
    caller *c = arg;
    for (int rep = 0; rep < 6 && !c->bad; rep++) {
        if (pgd_attn_run(c->a, 0, c->it, 3) != PGD_OK) c->bad = 1;
        for (int i = 0; i < 3 && !c->bad; i++)
            if (memcmp(c->it[i].out, c->expect[i],
                       (size_t)c->it[i].n_rows * NH * HD * sizeof(float)) != 0)
                c->bad = 1;
    }
    return NULL;
}

static int test_split_pieces_on_threads(void)
{
    fx f;
    T_OK(fx_init(&f, PGD_KV_F16, 1, 2, HD, 16, 800, 0, 0, 3));
    pgd_seq *base = fx_seq(&f, 2048);
    T_ASSERT(base != NULL);
    int32_t toks[2048];
    for (int i = 0; i < 2048; i++)
        toks[i] = i;
    T_OK(pgd_seq_commit(f.c, base, toks, 2048));
    pgd_seq *s[4];
    for (int i = 0; i < 4; i++) {
        T_OK(pgd_seq_fork(f.c, base, &s[i]));
        T_OK(fx_extend(&f, s[i], 1 + 37 * (uint32_t)i));
    }

    fx_exec ex = {.n_threads = 4};
    pgd_attn_params p = pgd_attn_default_params();
    p.n_head = NH;
    p.n_threads = 4;
    caller cl[2];
    memset(cl, 0, sizeof cl);
    for (int k = 0; k < 2; k++) {
        /* Serial run first: the expected outputs. */
        T_OK(pgd_attn_create(f.c, &p, &cl[k].a));
        for (int i = 0; i < 3; i++) {
            uint32_t rows = i == 2 ? 20 : 1;
            cl[k].it[i].seq = i == 0 ? base : s[2 * k + i - 1];
            cl[k].it[i].n_rows = rows;
            cl[k].it[i].q = fx_queries(&f, rows, NH);
            cl[k].it[i].out = calloc((size_t)rows * NH * HD, sizeof(float));
            cl[k].expect[i] = calloc((size_t)rows * NH * HD, sizeof(float));
        }
        T_OK(pgd_attn_run(cl[k].a, 0, cl[k].it, 3));
        for (int i = 0; i < 3; i++)
            memcpy(cl[k].expect[i], cl[k].it[i].out,
                   (size_t)cl[k].it[i].n_rows * NH * HD * sizeof(float));
        pgd_attn_destroy(cl[k].a);
    }
    p.parallel = fx_parallel;
    p.parallel_ud = &ex;
    p.parallel_min_work = 1; /* on the threads however small the run */
    for (int k = 0; k < 2; k++)
        T_OK(pgd_attn_create(f.c, &p, &cl[k].a));
    pthread_t th;
    T_EQ(pthread_create(&th, NULL, caller_main, &cl[1]), 0);
    caller_main(&cl[0]);
    pthread_join(th, NULL);
    for (int k = 0; k < 2; k++) {
        T_ASSERT(!cl[k].bad);
        pgd_attn_destroy(cl[k].a);
        for (int i = 0; i < 3; i++) {
            free((void *)cl[k].it[i].q);
            free(cl[k].it[i].out);
            free(cl[k].expect[i]);
        }
    }
    for (int i = 0; i < 4; i++)
        pgd_seq_destroy(f.c, s[i]);
    pgd_seq_destroy(f.c, base);
    T_OK(pgd_cache_check(f.c));
    fx_deinit(&f);
    return 0;
}

int main(void)
{
    T_RUN(test_split_pieces_on_threads);
    T_DONE();
}
