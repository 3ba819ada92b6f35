/* SPDX-License-Identifier: MIT */
/*
 * gen.c - the synthetic trace generator (workload and known answer described in gen.h).
 *
 * State: the system prompt of each group (allocated on first use), and per session slot
 * the full blocks of its conversation so far. Every id is allocated while emitting the
 * request that first carries it, so "allocated before this request" is exactly "seen
 * before", which is what the expected-hit counts rest on.
 */
#include "gen.h"

#include <stdlib.h>
#include <string.h>

#define ID_LIMIT (UINT64_C(1) << 63)

typedef struct session {
    uint32_t group;
    uint32_t turns_done;
    uint64_t *full; /* [n_full] ids of the conversation's full blocks */
    size_t n_full, cap_full;
} session;

typedef struct gen {
    const gen_params *p;
    uint64_t rng;
    uint64_t next_id;
    uint64_t **sys;    /* [n_groups] system prompt ids, NULL until first used */
    session *sessions; /* [n_sessions] */
    uint64_t *buf;     /* ids of the request being built */
    size_t n_buf, cap_buf;
    const char *why;
} gen;

gen_params gen_default_params(void)
{
    gen_params p;
    memset(&p, 0, sizeof p);
    p.seed = 1;
    p.n_requests = 1000;
    p.n_groups = 8;
    p.system_blocks = 8;
    p.n_sessions = 32;
    p.turns = 6;
    p.turn_blocks = 4;
    p.one_off_pct = 25;
    p.block_tokens = 512;
    p.id_base = 0;
    return p;
}

const char *gen_check_params(const gen_params *p)
{
    if (p->block_tokens == 0 || (p->block_tokens & (p->block_tokens - 1)) != 0 ||
        p->block_tokens > (1u << 20)) {
        return "block tokens must be a power of two in [1, 1048576]";
    }
    if (p->one_off_pct > 100) return "one-off percentage must be in [0, 100]";
    if (p->n_groups > (1u << 20)) return "groups must be at most 1048576";
    if (p->system_blocks > (1u << 16)) return "system blocks must be at most 65536";
    if (p->n_sessions > (1u << 20)) return "sessions must be at most 1048576";
    if (p->turns > (1u << 16)) return "turns must be at most 65536";
    if (p->turn_blocks == 0 || p->turn_blocks > (1u << 16)) {
        return "turn blocks must be in [1, 65536]";
    }
    if (p->one_off_pct < 100 && (p->n_sessions == 0 || p->turns == 0)) {
        return "sessions and turns must be at least 1 unless every request is a one-off";
    }
    if (p->id_base >= ID_LIMIT) return "id base must be below 2^63";
    return NULL;
}

/* splitmix64: tiny, full-period, and good enough to shape a workload. */
static uint64_t rnd(gen *g)
{
    uint64_t z;
    g->rng += UINT64_C(0x9e3779b97f4a7c15);
    z = g->rng;
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/* Returns a uniform number in [0, n), n >= 1 (the modulo bias is irrelevant here). */
static uint64_t below(gen *g, uint64_t n)
{
    return rnd(g) % n;
}

static int reserve(uint64_t **buf, size_t *cap, size_t need)
{
    size_t ncap = *cap ? *cap : 64;
    uint64_t *nb;
    if (need <= *cap) return 0;
    while (ncap < need)
        ncap *= 2;
    nb = realloc(*buf, ncap * sizeof *nb);
    if (!nb) return -1;
    *buf = nb;
    *cap = ncap;
    return 0;
}

static int push_ids(gen *g, const uint64_t *ids, size_t n)
{
    if (reserve(&g->buf, &g->cap_buf, g->n_buf + n) != 0) {
        g->why = "out of memory";
        return -1;
    }
    if (n) memcpy(g->buf + g->n_buf, ids, n * sizeof *ids);
    g->n_buf += n;
    return 0;
}

static int push_fresh(gen *g, uint64_t n)
{
    if (reserve(&g->buf, &g->cap_buf, g->n_buf + n) != 0) {
        g->why = "out of memory";
        return -1;
    }
    for (uint64_t i = 0; i < n; i++) {
        if (g->next_id >= ID_LIMIT) {
            g->why = "ids reached 2^63 (lower the id base)";
            return -1;
        }
        g->buf[g->n_buf++] = g->next_id++;
    }
    return 0;
}

/* Appends group's system prompt, allocating its ids on first use. */
static int push_system(gen *g, uint32_t group)
{
    const uint32_t n = g->p->system_blocks;
    if (!g->sys[group]) {
        size_t at = g->n_buf;
        if (push_fresh(g, n) != 0) return -1;
        g->sys[group] = malloc((n ? n : 1) * sizeof **g->sys);
        if (!g->sys[group]) {
            g->why = "out of memory";
            return -1;
        }
        memcpy(g->sys[group], g->buf + at, n * sizeof **g->sys);
        return 0;
    }
    return push_ids(g, g->sys[group], n);
}

/* Builds the next session turn into g->buf. */
static int build_turn(gen *g, session *s)
{
    const gen_params *p = g->p;
    if (s->turns_done >= p->turns) {
        s->turns_done = 0;
        s->n_full = 0;
        s->group = p->n_groups ? (uint32_t)below(g, p->n_groups) : 0;
    }
    if (s->turns_done == 0 && p->n_groups && p->system_blocks) {
        if (push_system(g, s->group) != 0) return -1;
    } else if (push_ids(g, s->full, s->n_full) != 0) {
        return -1;
    }
    return push_fresh(g, 1 + below(g, 2 * (uint64_t)p->turn_blocks - 1));
}

static int build_one_off(gen *g)
{
    const gen_params *p = g->p;
    if (p->n_groups && p->system_blocks && below(g, 2) == 0) {
        if (push_system(g, (uint32_t)below(g, p->n_groups)) != 0) return -1;
    }
    return push_fresh(g, 1 + below(g, 4 * (uint64_t)p->turn_blocks));
}

int gen_run(const gen_params *p, gen_emit_fn emit, void *ud, gen_stats *st, const char **why)
{
    gen g;
    uint64_t ts = 0;
    int rc = 0;

    memset(st, 0, sizeof *st);
    memset(&g, 0, sizeof g);
    *why = gen_check_params(p);
    if (*why) return -1;
    g.p = p;
    g.rng = p->seed;
    g.next_id = p->id_base;
    g.sys = calloc(p->n_groups ? p->n_groups : 1, sizeof *g.sys);
    g.sessions = calloc(p->n_sessions ? p->n_sessions : 1, sizeof *g.sessions);
    if (!g.sys || !g.sessions) {
        g.why = "out of memory";
        rc = -1;
        goto done;
    }
    for (uint32_t i = 0; i < p->n_sessions; i++)
        g.sessions[i].turns_done = p->turns;

    for (uint64_t r = 0; r < p->n_requests; r++) {
        const uint64_t mark = g.next_id, bt = p->block_tokens;
        session *s = NULL;
        gen_request req;
        uint64_t hits = 0;

        g.n_buf = 0;
        if (below(&g, 100) < p->one_off_pct) {
            rc = build_one_off(&g);
        } else {
            s = &g.sessions[below(&g, p->n_sessions)];
            rc = build_turn(&g, s);
        }
        if (rc != 0) goto done;

        ts += 1 + below(&g, 64);
        req.timestamp_ms = ts;
        req.input_length = (g.n_buf - 1) * bt + 1 + below(&g, bt);
        req.output_length = 1 + below(&g, 1024);
        req.ids = g.buf;
        req.n_ids = g.n_buf;
        while (hits < g.n_buf && g.buf[hits] < mark)
            hits++;

        st->requests++;
        st->blocks += g.n_buf;
        st->distinct_ids += g.next_id - mark;
        st->tokens += req.input_length;
        st->unlimited_hit_blocks += hits;
        st->unlimited_hit_tokens += hits * bt < req.input_length ? hits * bt : req.input_length;

        if (s) {
            /* The conversation keeps every block that is full: a partial last block will
             * have grown by the next turn, so it becomes a fresh block then. */
            size_t keep = req.input_length == g.n_buf * bt ? g.n_buf : g.n_buf - 1;
            if (reserve(&s->full, &s->cap_full, keep) != 0) {
                g.why = "out of memory";
                rc = -1;
                goto done;
            }
            if (keep) memcpy(s->full, g.buf, keep * sizeof *s->full);
            s->n_full = keep;
            s->turns_done++;
        }
        rc = emit(ud, &req);
        if (rc != 0) goto done;
    }
done:
    if (g.why) *why = g.why;
    for (uint32_t i = 0; g.sys && i < p->n_groups; i++)
        free(g.sys[i]);
    for (uint32_t i = 0; g.sessions && i < p->n_sessions; i++)
        free(g.sessions[i].full);
    free(g.sys);
    free(g.sessions);
    free(g.buf);
    return rc;
}
