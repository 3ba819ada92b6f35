/* SPDX-License-Identifier: MIT */
/*
 * scheduler.c - iteration-level continuous batching (see scheduler.h). Called by the server and
 * the tests; drives pe_forward_batch and the cache manager of one pe_ctx.
 *
 *   submit --> waiting[] --admit--> running[] --finish/cancel--> done list --> final cb
 *                 ^                     |
 *                 +------ preempt ------+   (front of the queue, prompt := all tokens)
 *
 * Invariants:
 *  - waiting[], running[], the done list, the counters and every request's `cancelled` flag
 *    are guarded by s->mu. A request's progress (toks, n_tok, n_done, sampler, logits) is
 *    touched by the stepping thread only.
 *  - A running request owns a sequence whose length is n_done (tokens toks[0..n_done) have
 *    K/V); a waiting or done request owns none. A running request with `promoting` set
 *    has pages still being filled from the tiers: it is left out of every batch until
 *    pgd_seq_ready says they are done (settle), and n_done may then shrink to the
 *    sequence's length (a failed fill).
 *  - With a token budget, a request's sequence holds fewer slots than tokens once it is
 *    compacted: n_done counts tokens, pgd_seq_length slots, and tokens = slots +
 *    pgd_seq_n_dropped. Everything that sizes pages (the room checks, the preemption
 *    cost) reads slots; everything that counts progress (prompt_left, the context bound,
 *    the settle after a failed fill) reads tokens. Its pgd_budget is created at the first
 *    admission, reset at each preemption (the recompute scores afresh) and destroyed with
 *    the request.
 *  - While a step's forward pass and sampling run (in_flight), cancel only flags running
 *    requests; the step releases them. Requests are freed by the stepping thread only,
 *    after their final callback.
 */
#include "scheduler.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct req {
    uint64_t id;
    pe_token_cb cb;
    void *ud;
    int32_t *toks;          /* [cap]: prompt, then generated tokens */
    uint32_t n_tok;         /* tokens in toks */
    uint32_t n_prompt;      /* submitted prompt */
    uint32_t n_gen;         /* tokens passed to the callback */
    uint32_t max_gen;       /* generation limit (max_tokens, bounded by the context) */
    uint32_t n_done;        /* tokens with K/V in seq */
    uint32_t n_prefill;     /* n_tok at admission: positions below are prompt work */
    uint32_t n_cached;      /* matched at first admission */
    uint32_t n_cached_pool; /* of those, pinned in the pool */
    uint32_t n_cached_tier[PGD_MAX_TIERS]; /* of those, promoted from tier i */
    pgd_hash *hashes; /* [cap / page_tokens]: block hashes of toks at (re)queue time */
    uint32_t n_hash;
    uint8_t *salt;
    size_t salt_len;
    pgd_seq *seq;
    pe_sampler *smp;
    float *logits; /* [n_vocab] */
    uint64_t admit_seq;
    uint64_t tenant;    /* FNV-1a of the salt: the tenant admission round-robins over */
    uint64_t queued_at; /* s->n_rounds when (re)queued: its wait is n_rounds - queued_at */
    int stop_eog;
    int admitted;    /* admitted at least once */
    int preempted;   /* requeued by preemption: goes first */
    int cancelled;   /* flagged by cancel while a step was in flight */
    int promoting;   /* admitted; tier pages of its match may still be filling */
    int first_match; /* promoting, and this is the first admission: fill n_cached* */
    int32_t out_tok; /* token to pass to the callback this step, -1 none */
    pe_finish finish;
    int status;        /* pgd_status of a PE_FINISH_ERROR finish; PGD_OK otherwise */
    pgd_retention ret; /* the request's retention, when has_ret */
    int has_ret;
    int pin_refused; /* an admission's pgd_seq_set_retention refused the pin */
    /* Its token budget (budget.h), when has_budget: copied and checked at submit. */
    pgd_budget_params bp;
    int has_budget;
    pgd_budget *bud;     /* created at the first admission, reset at preemption */
    int compacted;       /* this admission's sequence was compacted */
    int apply_pending;   /* its once-only compaction failed: retried after each step */
    uint32_t reg_pages;  /* compacted: its leading pages the prefix index may hold (those
                            committed before the first compaction) */
    uint64_t kv_dropped; /* slots dropped by the sequences it released so far */
    uint32_t kv_slots;   /* slots its sequence held when released */
    struct req *next;    /* done list */
} req;

/* One admission in the ring admission's round-robin reads: whose, and when. */
typedef struct served {
    uint64_t tenant;
    uint64_t admit_seq; /* the admitted request's admit_seq (>= 1) */
} served;

struct pe_sched {
    pe_ctx *ctx;
    pgd_cache *cache;
    const pe_model *model;
    pe_sched_params p;
    uint32_t n_ctx, n_vocab, pt, n_layer;
    int budget_scores; /* the context reserved attention's scoring scratch */
    int contiguous;    /* the context's contiguous reference: no budgets */
    pthread_mutex_t mu;
    req **waiting; /* [max_queued + max_running], front first */
    uint32_t n_waiting;
    req **running; /* [max_running], oldest admission first */
    uint32_t n_running;
    req *done; /* finished, final callback pending */
    req *done_tail;
    int in_flight;
    uint64_t next_id, admit_counter;
    uint64_t n_rounds;  /* admission rounds so far (one per pe_sched_step) */
    served *served;     /* [n_served_cap] ring of the latest admissions */
    uint32_t n_served;  /* entries in served (at most n_served_cap) */
    uint32_t served_at; /* next entry to overwrite once the ring is full */
    uint32_t n_served_cap;
    pe_sched_stats st;
    pe_batch_item *items; /* [max_running] */
    req **item_req;       /* [max_running] */
    int32_t *ev_tok;      /* [max_running]: token callbacks of a step, captured locked */
    uint32_t n_tiers;     /* the cache's storage tiers */
    /* The preemption cost model (scheduler.h "Preemption"). */
    double page_bytes;  /* payload bytes of one pool page */
    double flops_token; /* matrix-product FLOPs of one token (F) */
    double flops_attn;  /* attention FLOPs coefficient: 2 * n_layer * n_head * head_dim */
    double flops_per_s; /* measured forward rate (R); PE_SCHED_FLOPS_PER_S at first */
};

/* The preemption cost model's constants (scheduler.h "Preemption"). */
#define PE_SCHED_COPY_BYTES_PER_S 4e9 /* page copy out to the RAM tier and back, each way */
#define PE_SCHED_FLOPS_PER_S 2e10     /* forward rate before a step has measured it */
#define PE_SCHED_RATE_MIN_TOKENS 64   /* steps with fewer tokens do not measure R */

pe_sched_params pe_sched_default_params(void)
{
    pe_sched_params p;
    memset(&p, 0, sizeof p);
    p.max_running = 16;
    p.max_queued = 64;
    p.max_wait_steps = PE_SCHED_MAX_WAIT_STEPS;
    return p;
}

pe_request_params pe_request_default_params(void)
{
    pe_request_params p;
    memset(&p, 0, sizeof p);
    p.max_tokens = 128;
    p.sampler = pe_sampler_default_params();
    p.stop_on_eog = 1;
    return p;
}

const char *pe_finish_name(pe_finish f)
{
    switch (f) {
    case PE_FINISH_NONE:
        return "none";
    case PE_FINISH_LENGTH:
        return "length";
    case PE_FINISH_EOG:
        return "eog";
    case PE_FINISH_CANCELLED:
        return "cancelled";
    case PE_FINISH_ERROR:
        return "error";
    }
    return "?";
}

static void req_destroy(pe_sched *s, req *r)
{
    if (!r) return;
    pgd_budget_destroy(r->bud);
    pgd_seq_destroy(s->cache, r->seq);
    pe_sampler_destroy(r->smp);
    free(r->toks);
    free(r->hashes);
    free(r->salt);
    free(r->logits);
    free(r);
}

static uint32_t pages_of(const pe_sched *s, uint64_t n_tokens)
{
    return (uint32_t)((n_tokens + s->pt - 1) / s->pt);
}

/* Whether budget p enforces after every step (budget.h "When a budget is enforced"). */
static int budget_online(const pgd_budget_params *p)
{
    if (p->online >= 0) return p->online;
    return p->method == PGD_BUDGET_STREAMING || p->method == PGD_BUDGET_H2O ||
           p->method == PGD_BUDGET_TOVA;
}

/* The most slots one (layer, KV head) of budget p keeps, so the most a compaction leaves
 * a sequence (budget.h "The budget"): pyramidkv's lowest layer, adakv's cap. */
static uint64_t budget_max_keep(const pe_sched *s, const pgd_budget_params *p)
{
    if (p->method == PGD_BUDGET_PYRAMIDKV) return pgd_budget_layer_budget(p, 0, s->n_layer);
    if (p->method == PGD_BUDGET_ADAKV) return (uint64_t)ceil((double)p->adakv_cap * p->budget);
    return p->budget;
}

/* The most slots r's sequence holds while its next `todo` known tokens go in, from
 * slots_now: one per token when dense or when the budget waits for the prompt's end (the
 * snapkv family); under an online budget, which compacts after every step, at most its
 * largest keep plus a page less one (the page granularity) plus a chunk. */
static uint64_t slots_needed(const pe_sched *s, const req *r, uint64_t slots_now, uint64_t todo)
{
    uint64_t need = slots_now + todo;
    if (r->has_budget && budget_online(&r->bp)) {
        uint64_t cap = budget_max_keep(s, &r->bp) + s->pt - 1 + s->p.chunk;
        if (need > cap) need = slots_now > cap ? slots_now : cap;
    }
    return need;
}

/* A budget that compresses once (the snapkv family) whose compaction at the prompt's end
 * failed (no page for the private copies; pe_forward_batch kept the sequence whole) is not
 * due again by itself: it is applied after each later step of r until it holds (online
 * budgets are due again after every step anyway). it: r's item of the step that ran.
 * Stepping thread. */
static void budget_retry(pe_sched *s, req *r, const pe_batch_item *it)
{
    if (budget_online(&r->bp)) return;
    if (r->apply_pending) {
        if (pgd_budget_apply(r->bud, r->seq) >= 0) r->apply_pending = 0;
    } else if (it->prompt_left == it->n && pgd_seq_n_dropped(s->cache, r->seq) == 0 &&
               pgd_seq_length(s->cache, r->seq) > budget_max_keep(s, &r->bp)) {
        r->apply_pending = 1; /* every head was due to drop tokens and none did */
    }
}

/* The slots r's sequence holds (fewer than its tokens once a budget compacted it). */
static uint64_t slots_of(const pe_sched *s, const req *r)
{
    return r->seq ? pgd_seq_length(s->cache, r->seq) : 0;
}

/* Adds the slots r's sequence dropped to r->kv_dropped and notes the slots it holds,
 * before the sequence goes (finish or preemption). */
static void note_release(pe_sched *s, req *r)
{
    if (!r->seq) return;
    r->kv_dropped += pgd_seq_n_dropped(s->cache, r->seq);
    r->kv_slots = (uint32_t)pgd_seq_length(s->cache, r->seq);
}

static void rehash(pe_sched *s, req *r)
{
    r->n_hash = (uint32_t)pgd_cache_hash_tokens(s->cache, r->salt, r->salt_len, r->toks, r->n_tok,
                                                r->hashes, r->n_tok / s->pt);
}

int pe_sched_create(pe_ctx *ctx, const pe_sched_params *pp, pe_sched **out)
{
    pe_sched_params p = pp ? *pp : pe_sched_default_params();
    const pe_ctx_params *cp;
    pe_sched *s;

    *out = NULL;
    if (!ctx || !p.model || !p.max_running || p.max_running > PE_MAX_BATCH_SEQS || !p.max_queued)
        return PGD_EINVAL;
    cp = pe_ctx_params_get(ctx);
    if (!p.step_tokens || p.step_tokens > cp->n_batch) p.step_tokens = cp->n_batch;
    if (!p.chunk || p.chunk > p.step_tokens) p.chunk = p.step_tokens;
    if (!p.max_wait_steps) p.max_wait_steps = PE_SCHED_MAX_WAIT_STEPS;
    s = calloc(1, sizeof *s);
    if (!s) return PGD_ENOMEM;
    s->ctx = ctx;
    s->cache = pe_ctx_cache(ctx);
    s->model = p.model;
    s->p = p;
    s->n_ctx = cp->n_ctx;
    s->n_vocab = pe_model_hparams(p.model)->n_vocab;
    s->n_layer = pe_model_hparams(p.model)->n_layer;
    s->budget_scores = cp->budget_scores;
    s->contiguous = cp->contiguous_ref;
    s->pt = pgd_cache_page_tokens(s->cache);
    s->next_id = 1;
    s->n_tiers = pgd_cache_n_tiers(s->cache);
    {
        const pe_hparams *hp = pe_model_hparams(p.model);
        const double E = hp->n_embd, Q = (double)hp->n_head * hp->head_dim;
        const double KV = (double)hp->n_head_kv * hp->head_dim, F = hp->n_ff;
        s->page_bytes = (double)pgd_pool_page_bytes(pgd_cache_pool(s->cache));
        s->flops_token =
            2.0 * hp->n_layer * (E * Q + 2 * E * KV + Q * E + 3 * E * F) + 2.0 * E * hp->n_vocab;
        s->flops_attn = 2.0 * hp->n_layer * Q;
        s->flops_per_s = PE_SCHED_FLOPS_PER_S;
    }
    s->waiting = calloc((size_t)p.max_queued + p.max_running, sizeof *s->waiting);
    s->running = calloc(p.max_running, sizeof *s->running);
    s->items = calloc(p.max_running, sizeof *s->items);
    s->item_req = calloc(p.max_running, sizeof *s->item_req);
    s->ev_tok = calloc(p.max_running, sizeof *s->ev_tok);
    /* A tenant absent from the ring was served before every tenant in it, so the
     * round-robin order is exact but for ties between absent tenants (the queue order
     * breaks them); with one entry per queue slot, every waiting tenant's turn is kept. */
    s->n_served_cap = p.max_queued + p.max_running;
    s->served = calloc(s->n_served_cap, sizeof *s->served);
    if (!s->waiting || !s->running || !s->items || !s->item_req || !s->ev_tok || !s->served) {
        free(s->served);
        free(s->ev_tok);
        free(s->waiting);
        free(s->running);
        free(s->items);
        free(s->item_req);
        free(s);
        return PGD_ENOMEM;
    }
    pthread_mutex_init(&s->mu, NULL);
    *out = s;
    return PGD_OK;
}

void pe_sched_destroy(pe_sched *s)
{
    if (!s) return;
    for (uint32_t i = 0; i < s->n_waiting; i++)
        req_destroy(s, s->waiting[i]);
    for (uint32_t i = 0; i < s->n_running; i++)
        req_destroy(s, s->running[i]);
    while (s->done) {
        req *r = s->done;
        s->done = r->next;
        req_destroy(s, r);
    }
    pthread_mutex_destroy(&s->mu);
    free(s->waiting);
    free(s->running);
    free(s->items);
    free(s->item_req);
    free(s->ev_tok);
    free(s->served);
    free(s);
}

/* ---- submit / cancel ---- */

/* Returns the tenant key of a salt: FNV-1a over its bytes (the default tenant, no salt, is
 * the offset basis). A collision only merges two tenants' turns, never their cache. */
static uint64_t tenant_of(const void *salt, size_t n)
{
    const uint8_t *b = salt;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ULL;
    }
    return h;
}

int pe_sched_submit(pe_sched *s, const pe_request_params *rp, const int32_t *prompt, size_t n,
                    pe_token_cb cb, void *ud, uint64_t *id)
{
    pe_request_params dp = pe_request_default_params();
    req *r;
    int rc = PGD_ENOMEM;

    if (!rp) rp = &dp;
    if (!s || !prompt || !n || n >= s->n_ctx || !cb) return PGD_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (prompt[i] < 0 || (uint32_t)prompt[i] >= s->n_vocab) return PGD_EINVAL;
    /* The budget: the request's, else the context's; checked against the model, and only
     * where the context can score (its scratch) and compact (not the contiguous ref). */
    const pgd_budget_params *bp = rp->budget ? rp->budget : &pe_ctx_params_get(s->ctx)->budget;
    if (bp->method != PGD_BUDGET_NONE &&
        (pgd_budget_params_check(bp, s->n_layer, NULL, 0) != PGD_OK || !s->budget_scores ||
         s->contiguous || pgd_cache_window(s->cache)))
        return PGD_EINVAL;
    r = calloc(1, sizeof *r);
    if (!r) return PGD_ENOMEM;
    if (bp->method != PGD_BUDGET_NONE) {
        r->bp = *bp;
        r->has_budget = 1;
    }
    r->cb = cb;
    r->ud = ud;
    r->n_prompt = (uint32_t)n;
    r->n_tok = (uint32_t)n;
    r->max_gen = s->n_ctx - (uint32_t)n;
    if (rp->max_tokens && rp->max_tokens < r->max_gen) r->max_gen = rp->max_tokens;
    r->stop_eog = rp->stop_on_eog;
    r->out_tok = -1;
    if (rp->retention) {
        r->ret = *rp->retention;
        r->has_ret = 1;
    }
    r->toks = malloc(((size_t)n + r->max_gen) * sizeof *r->toks);
    r->hashes = malloc((((size_t)n + r->max_gen) / s->pt + 1) * sizeof *r->hashes);
    r->logits = malloc((size_t)s->n_vocab * sizeof *r->logits);
    if (rp->salt_len) {
        r->salt = malloc(rp->salt_len);
        if (r->salt) memcpy(r->salt, rp->salt, rp->salt_len);
        r->salt_len = rp->salt_len;
    }
    if (!r->toks || !r->hashes || !r->logits || (rp->salt_len && !r->salt)) goto fail;
    r->smp = pe_sampler_create(&rp->sampler, s->n_vocab);
    if (!r->smp) {
        rc = PGD_EINVAL;
        goto fail;
    }
    memcpy(r->toks, prompt, n * sizeof *prompt);
    for (size_t i = 0; i < n; i++)
        pe_sampler_accept(r->smp, prompt[i]);
    rehash(s, r);
    /* Prefetch: start moving the pages its match will want (all but the last token's)
     * up from the slower tiers now, so they are in the fastest one, or resident, when it
     * is admitted. Before the queue takes r: once queued, the stepping thread owns it. */
    if (s->n_tiers && !s->p.no_prefix_cache) {
        size_t n_match = (n - 1) / s->pt;
        pgd_cache_prefetch(s->cache, r->hashes, n_match < r->n_hash ? n_match : r->n_hash);
    }

    pthread_mutex_lock(&s->mu);
    if (s->n_waiting >= s->p.max_queued) {
        pthread_mutex_unlock(&s->mu);
        rc = PGD_EBUSY;
        goto fail;
    }
    r->id = s->next_id++;
    r->tenant = tenant_of(r->salt, r->salt_len);
    r->queued_at = s->n_rounds;
    s->waiting[s->n_waiting++] = r;
    if (id) *id = r->id;
    pthread_mutex_unlock(&s->mu);
    return PGD_OK;
fail:
    req_destroy(s, r);
    return rc;
}

/* Appends r to the done list with its finish reason. Lock held. */
static void push_done(pe_sched *s, req *r, pe_finish why)
{
    r->finish = why;
    r->next = NULL;
    if (s->done_tail)
        s->done_tail->next = r;
    else
        s->done = r;
    s->done_tail = r;
}

/* Removes running[i], destroys its sequence and finishes it. Lock held, not in flight. */
static void retire(pe_sched *s, uint32_t i, pe_finish why)
{
    req *r = s->running[i];
    memmove(&s->running[i], &s->running[i + 1], (s->n_running - i - 1) * sizeof *s->running);
    s->n_running--;
    note_release(s, r);
    pgd_seq_destroy(s->cache, r->seq);
    r->seq = NULL;
    push_done(s, r, why);
}

int pe_sched_cancel(pe_sched *s, uint64_t id)
{
    int rc = PGD_ENOTFOUND;
    pthread_mutex_lock(&s->mu);
    for (uint32_t i = 0; i < s->n_waiting; i++) {
        if (s->waiting[i]->id != id) continue;
        req *r = s->waiting[i];
        memmove(&s->waiting[i], &s->waiting[i + 1], (s->n_waiting - i - 1) * sizeof *s->waiting);
        s->n_waiting--;
        push_done(s, r, PE_FINISH_CANCELLED);
        rc = PGD_OK;
        break;
    }
    for (uint32_t i = 0; rc != PGD_OK && i < s->n_running; i++) {
        if (s->running[i]->id != id || s->running[i]->cancelled) continue;
        if (s->in_flight)
            s->running[i]->cancelled = 1;
        else
            retire(s, i, PE_FINISH_CANCELLED);
        rc = PGD_OK;
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int pe_sched_cancel_all(pe_sched *s)
{
    int n = 0;
    pthread_mutex_lock(&s->mu);
    for (uint32_t i = 0; i < s->n_waiting; i++, n++)
        push_done(s, s->waiting[i], PE_FINISH_CANCELLED);
    s->n_waiting = 0;
    for (uint32_t i = s->n_running; i-- > 0;) {
        if (s->running[i]->cancelled) continue;
        if (s->in_flight)
            s->running[i]->cancelled = 1;
        else
            retire(s, i, PE_FINISH_CANCELLED);
        n++;
    }
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* Releases the running requests flagged by cancel during a step. Lock held. */
static void reap_cancelled(pe_sched *s)
{
    for (uint32_t i = s->n_running; i-- > 0;)
        if (s->running[i]->cancelled) retire(s, i, PE_FINISH_CANCELLED);
}

/* ---- admission ---- */

static uint32_t lcp(const pgd_hash *a, uint32_t na, const pgd_hash *b, uint32_t nb)
{
    uint32_t n = na < nb ? na : nb, i = 0;
    while (i < n && pgd_hash_eq(a[i], b[i]))
        i++;
    return i;
}

/* Returns the number of w's leading pages that running requests have committed. *held
 * gets 1 when w should wait: a running request, or one ahead of w in the queue (w is
 * waiting[wi]), is still to compute pages that w shares. */
static int64_t cached_pages(const pe_sched *s, const req *w, uint32_t wi, int *held)
{
    uint32_t best = 0;
    *held = 0;
    for (uint32_t i = 0; i < s->n_running; i++) {
        const req *r = s->running[i];
        uint32_t l = lcp(w->hashes, w->n_hash, r->hashes, r->n_hash);
        uint32_t c = r->n_done / s->pt;
        if (r->compacted) {
            /* It registers nothing more: only what it committed before compacting. */
            if (l > r->reg_pages) l = r->reg_pages;
        } else if (l > c) {
            *held = 1;
            l = c;
        }
        if (l > best) best = l;
    }
    for (uint32_t j = 0; j < wi && !*held; j++) {
        const req *o = s->waiting[j];
        if (lcp(w->hashes, w->n_hash, o->hashes, o->n_hash) > best) *held = 1;
    }
    return best;
}

/* Returns the admit_seq of tenant t's latest admission in the ring, 0 when none is. */
static uint64_t last_served(const pe_sched *s, uint64_t t)
{
    uint64_t last = 0;
    for (uint32_t i = 0; i < s->n_served; i++)
        if (s->served[i].tenant == t && s->served[i].admit_seq > last)
            last = s->served[i].admit_seq;
    return last;
}

/* Records the admission of r in the ring, overwriting the oldest entry once it is full. */
static void note_served(pe_sched *s, const req *r)
{
    served e = {r->tenant, r->admit_seq};
    if (s->n_served < s->n_served_cap) {
        s->served[s->n_served++] = e;
        return;
    }
    s->served[s->served_at] = e;
    s->served_at = (s->served_at + 1) % s->n_served_cap;
}

/* Returns the index in waiting[] of the request to admit next (see scheduler.h for the
 * order), or -1 when every waiting request is held back; *pages gets the pages it shares
 * with what running requests have committed (an estimate for the room check). Lock held. */
static int64_t pick(const pe_sched *s, int64_t *pages)
{
    int64_t best = -1, best_pages = 0;
    uint64_t best_last = 0;
    int held;

    *pages = 0;
    if (s->p.no_prefix_cache) return 0;
    /* Aging: the longest-waiting overdue request, whatever its tenant, cache or hold. */
    for (uint32_t i = 0; i < s->n_waiting; i++) {
        const req *w = s->waiting[i];
        if (s->n_rounds - w->queued_at <= s->p.max_wait_steps) continue;
        if (best < 0 || w->queued_at < s->waiting[best]->queued_at) best = i;
    }
    if (best >= 0) {
        *pages = cached_pages(s, s->waiting[best], (uint32_t)best, &held);
        return best;
    }
    for (uint32_t i = 0; i < s->n_waiting; i++)
        if (s->waiting[i]->preempted) return i;
    /* The tenant served longest ago that has a request not held back; within it, the
     * request sharing the most committed pages; then the queue order. */
    for (uint32_t i = 0; i < s->n_waiting; i++) {
        const req *w = s->waiting[i];
        int64_t sc = cached_pages(s, w, i, &held);
        if (held) continue;
        uint64_t last = last_served(s, w->tenant);
        if (best < 0 || last < best_last || (last == best_last && sc > best_pages)) {
            best = i;
            best_last = last;
            best_pages = sc;
        }
    }
    *pages = best_pages;
    return best;
}

/* Free + evictable pages minus what running requests still need for their known tokens. */
static int64_t avail_pages(pe_sched *s)
{
    pgd_cache_stats cs;
    int64_t avail;
    pgd_cache_get_stats(s->cache, &cs);
    avail = (int64_t)cs.n_pages_free + cs.n_pages_evictable;
    for (uint32_t i = 0; i < s->n_running; i++) {
        const req *r = s->running[i];
        uint64_t now = slots_of(s, r);
        avail -=
            (int64_t)pages_of(s, slots_needed(s, r, now, r->n_tok - r->n_done)) - pages_of(s, now);
    }
    return avail;
}

/* Admits waiting requests while slots and pages allow. Lock held. */
static void admit(pe_sched *s)
{
    s->n_rounds++;
    while (s->n_running < s->p.max_running && s->n_waiting) {
        int64_t shared;
        int64_t best = pick(s, &shared);
        if (best < 0) return;
        req *w = s->waiting[best];
        uint64_t sh = (uint64_t)shared * s->pt;
        int64_t need = (int64_t)pages_of(s, slots_needed(s, w, sh, w->n_tok - sh)) - shared;
        if (s->n_running && need > avail_pages(s)) return;
        /* no_prefix_cache: each request is a tenant of its own (a private salt made of
         * this scheduler's address and the request id), so its full pages are registered
         * under a key no other request has: nothing is shared or deduplicated. */
        uint8_t own[8 + sizeof(void *) + sizeof w->id];
        const void *salt = w->salt;
        size_t salt_len = w->salt_len;
        if (s->p.no_prefix_cache) {
            memcpy(own, "pe-own\0\0", 8);
            memcpy(own + 8, &s, sizeof(void *));
            memcpy(own + 8 + sizeof(void *), &w->id, sizeof w->id);
            salt = own;
            salt_len = sizeof own;
        }
        if (pgd_seq_create(s->cache, salt, salt_len, &w->seq) != PGD_OK) return;
        if (w->has_ret && !s->p.no_prefix_cache &&
            pgd_seq_set_retention(s->cache, w->seq, &w->ret, w->n_tok) == PGD_ENOSPC) {
            w->ret.pin = 0; /* the pin share is full: keep the rest (scheduler.h) */
            w->pin_refused = 1;
            pgd_seq_set_retention(s->cache, w->seq, &w->ret, w->n_tok);
        }
        /* Match all but the last token: its logits must be computed. The block hashes
         * of w->toks were computed at (re)queue time, outside the cache lock: pass them. */
        int64_t cached = 0;
        if (!s->p.no_prefix_cache)
            cached =
                pgd_seq_match_hashed(s->cache, w->seq, w->toks, w->n_tok - 1, w->hashes, w->n_hash);
        if (cached < 0) cached = 0;
        need = (int64_t)pages_of(
                   s, slots_needed(s, w, (uint64_t)cached, w->n_tok - (uint64_t)cached)) -
               cached / s->pt;
        if ((s->n_running && need > avail_pages(s)) ||
            (w->has_budget && !w->bud && pgd_budget_create(s->cache, &w->bp, &w->bud) != PGD_OK)) {
            pgd_seq_destroy(s->cache, w->seq);
            w->seq = NULL;
            return;
        }
        memmove(&s->waiting[best], &s->waiting[best + 1],
                (s->n_waiting - best - 1) * sizeof *s->waiting);
        s->n_waiting--;
        w->n_done = (uint32_t)cached;
        w->n_prefill = w->n_tok;
        w->admit_seq = ++s->admit_counter;
        w->preempted = 0;
        w->compacted = 0;
        w->apply_pending = 0;
        /* With tiers, part of the match may still be filling: settle() finds out. */
        w->promoting = s->n_tiers && cached > 0;
        w->first_match = w->promoting && !w->admitted;
        if (!w->admitted) {
            w->admitted = 1;
            w->n_cached = (uint32_t)cached;
            w->n_cached_pool = (uint32_t)cached;
        }
        s->st.n_prompt_tokens_cached += (uint64_t)cached;
        s->running[s->n_running++] = w;
        note_served(s, w);
    }
}

/* Returns 1 when parking r's pages in the tiers (swap) costs less than recomputing them
 * (scheduler.h "Preemption" states the formula), 0 when recompute does or there is no
 * tier. Lock held. */
static int swap_cheaper(const pe_sched *s, const req *r)
{
    if (!s->n_tiers || s->p.no_prefix_cache) return 0;
    /* A compacted sequence's pages are private, not what block hashes name: only the
     * pages committed before were registered, and they are in the pool's cache already. */
    if (r->compacted) return 0;
    const double n_pages = (double)(r->n_done / s->pt), n = n_pages * s->pt;
    if (n_pages == 0) return 0;
    const double swap_s = 2.0 * n_pages * s->page_bytes / PE_SCHED_COPY_BYTES_PER_S;
    const double recompute_s = (n * s->flops_token + s->flops_attn * n * n) / s->flops_per_s;
    return swap_s < recompute_s;
}

/* Releases the newest running request and requeues it at the front: its pages are parked
 * in the tiers first when that is cheaper than recomputing them (swap), else dropped to
 * the pool's cache (recompute). Lock held. */
static void preempt_newest(pe_sched *s)
{
    uint32_t k = 0;
    for (uint32_t i = 1; i < s->n_running; i++)
        if (s->running[i]->admit_seq > s->running[k]->admit_seq) k = i;
    req *r = s->running[k];
    memmove(&s->running[k], &s->running[k + 1], (s->n_running - k - 1) * sizeof *s->running);
    s->n_running--;
    if (!r->promoting && swap_cheaper(s, r)) {
        pgd_seq_park(s->cache, r->seq);
        s->st.n_preempt_swap++;
    } else {
        s->st.n_preempt_recompute++;
    }
    r->promoting = 0;
    r->first_match = 0;
    note_release(s, r);
    r->kv_slots = 0; /* it holds none while it waits */
    pgd_seq_destroy(s->cache, r->seq);
    r->seq = NULL;
    r->n_done = 0;
    r->compacted = 0;
    r->apply_pending = 0;
    if (r->bud) pgd_budget_reset(r->bud); /* the recompute scores afresh */
    r->preempted = 1;
    r->queued_at = s->n_rounds;
    rehash(s, r);
    memmove(&s->waiting[1], &s->waiting[0], s->n_waiting * sizeof *s->waiting);
    s->waiting[0] = r;
    s->n_waiting++;
    s->st.n_preemptions++;
}

/* ---- step ---- */

/* A promoting request whose pages are all filled: its length may have been cut back by a
 * failed fill (n_done and, at the first admission, n_cached follow it), and at the first
 * admission the cached tokens are split by where they came from. Lock held. */
static void match_done(pe_sched *s, req *r)
{
    /* Tokens, not slots (a promoting request has not run yet, so they are equal). */
    uint64_t len = pgd_seq_length(s->cache, r->seq) + pgd_seq_n_dropped(s->cache, r->seq);
    if (len < r->n_done) {
        s->st.n_prompt_tokens_cached -= r->n_done - len;
        r->n_done = (uint32_t)len;
    }
    if (r->first_match) {
        pgd_match_info mi;
        uint64_t in_tiers = 0;
        pgd_seq_match_info(s->cache, r->seq, &mi);
        r->n_cached = r->n_done;
        for (uint32_t i = 0; i < mi.n_tiers && i < PGD_MAX_TIERS; i++) {
            uint64_t t = mi.tier_tokens[i];
            if (t > r->n_cached - in_tiers) t = r->n_cached - in_tiers;
            r->n_cached_tier[i] = (uint32_t)t;
            in_tiers += t;
        }
        r->n_cached_pool = r->n_cached - (uint32_t)in_tiers;
    }
    r->promoting = 0;
    r->first_match = 0;
}

/* Settles every running request whose promotions are done. Returns the first one still
 * promoting, or NULL. Lock held. */
static req *settle(pe_sched *s)
{
    req *first = NULL;
    for (uint32_t i = 0; i < s->n_running; i++) {
        req *r = s->running[i];
        if (!r->promoting || r->cancelled) continue;
        if (pgd_seq_ready(s->cache, r->seq))
            match_done(s, r);
        else if (!first)
            first = r;
    }
    return first;
}

/* Fills s->items with decode tokens first, then prefill chunks, within the budget.
 * Returns the number of items. Lock held. */
static uint32_t build_batch(pe_sched *s, uint32_t *n_tokens)
{
    uint32_t n = 0, budget = s->p.step_tokens;
    /* The request's block hashes (its salt, from position 0) go with it, so the commit
     * hashes nothing twice; not with no_prefix_cache, whose sequences have salts of their
     * own (admit). */
    const int own = s->p.no_prefix_cache;
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t i = 0; i < s->n_running && budget; i++) {
            req *r = s->running[i];
            uint32_t rem = r->n_tok - r->n_done;
            if (r->promoting || r->cancelled) continue; /* not ready, or being released */
            if ((pass == 0) != (rem == 1)) continue;
            uint32_t k = rem < s->p.chunk ? rem : s->p.chunk;
            if (k > budget) k = budget;
            int last = r->n_done + k == r->n_tok;
            s->items[n] = (pe_batch_item){r->seq,
                                          r->toks + r->n_done,
                                          k,
                                          last ? r->logits : NULL,
                                          0,
                                          own ? NULL : r->hashes,
                                          own ? 0 : r->n_hash,
                                          r->bud,
                                          r->n_done < r->n_prefill ? r->n_prefill - r->n_done : 0};
            s->item_req[n++] = r;
            budget -= k;
        }
    }
    *n_tokens = s->p.step_tokens - budget;
    return n;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Samples the next token of r from its logits; sets out_tok and finish. Stepping thread. */
static void sample_one(pe_sched *s, req *r)
{
    int32_t tok = pe_sampler_sample(r->smp, r->logits);
    if (r->stop_eog && pe_vocab_is_eog(pe_model_vocab(s->model), tok)) {
        r->finish = PE_FINISH_EOG;
        return;
    }
    pe_sampler_accept(r->smp, tok);
    r->toks[r->n_tok++] = tok;
    r->n_gen++;
    r->out_tok = tok;
    if (r->n_gen >= r->max_gen) r->finish = PE_FINISH_LENGTH;
}

/* Makes the callbacks of one step: tokens (captured in ev_tok under the lock; id, cb and
 * ud never change), then final calls; frees finished requests. Without the lock. */
static void deliver(pe_sched *s, uint32_t n_items, req *done)
{
    for (uint32_t i = 0; i < n_items; i++) {
        const req *r = s->item_req[i];
        if (s->ev_tok[i] >= 0) r->cb(r->ud, r->id, s->ev_tok[i], PE_FINISH_NONE, NULL);
    }
    while (done) {
        req *r = done;
        done = r->next;
        pe_usage u;
        memset(&u, 0, sizeof u);
        u.prompt_tokens = r->n_prompt;
        u.cached_tokens = r->n_cached;
        u.completion_tokens = r->n_gen;
        u.status = r->status;
        u.pin_refused = r->pin_refused;
        u.cached_pool_tokens = r->n_cached_pool;
        u.n_tiers = s->n_tiers;
        for (uint32_t i = 0; i < s->n_tiers && i < PGD_MAX_TIERS; i++)
            u.cached_tier_tokens[i] = r->n_cached_tier[i];
        u.kv_budget_method = r->has_budget ? r->bp.method : PGD_BUDGET_NONE;
        u.kv_budget = r->has_budget ? r->bp.budget : 0;
        u.kv_budget_dropped = r->kv_dropped;
        u.kv_slots = r->kv_slots;
        r->cb(r->ud, r->id, -1, r->finish, &u);
        req_destroy(s, r);
    }
}

int pe_sched_step(pe_sched *s)
{
    uint32_t n_items = 0, n_tokens = 0;
    int rc = 0;
    req *done;

    pthread_mutex_lock(&s->mu);
    admit(s);
    for (;;) {
        rc = 0;
        req *pending = settle(s);
        n_items = build_batch(s, &n_tokens);
        if (!n_items && pending) {
            /* Nothing else can run: wait for the oldest admission's promotions, without
             * the lock (in flight, so cancel only flags it). */
            pgd_seq *seq = pending->seq;
            s->in_flight = 1;
            pthread_mutex_unlock(&s->mu);
            pgd_seq_wait(s->cache, seq);
            pthread_mutex_lock(&s->mu);
            s->in_flight = 0;
            reap_cancelled(s);
            continue;
        }
        if (!n_items) break;
        s->in_flight = 1;
        pthread_mutex_unlock(&s->mu);
        double t0 = now_s();
        rc = pe_forward_batch(s->ctx, s->items, n_items);
        double dt = now_s() - t0;
        pthread_mutex_lock(&s->mu);
        if (rc == 0 && n_tokens >= PE_SCHED_RATE_MIN_TOKENS && dt > 0) {
            /* R of the cost model: this step's matrix-product rate, smoothed. */
            double r = (double)n_tokens * s->flops_token / dt;
            s->flops_per_s = 0.75 * s->flops_per_s + 0.25 * r;
        }
        if (rc != PGD_ENOSPC) break;
        s->in_flight = 0;
        reap_cancelled(s);
        if (s->n_running > 1) {
            preempt_newest(s);
        } else if (s->n_running == 1) {
            s->running[0]->status = PGD_ENOSPC; /* does not fit the pool alone */
            retire(s, 0, PE_FINISH_ERROR);
        }
    }
    if (n_items && rc == 0) {
        /* Still in flight: cancel only flags requests while this thread samples. */
        uint64_t n_computed = 0, n_sampled = 0;
        pthread_mutex_unlock(&s->mu);
        for (uint32_t i = 0; i < n_items; i++) {
            req *r = s->item_req[i];
            if (r->n_done < r->n_prefill) {
                uint32_t end = r->n_done + s->items[i].n;
                if (end > r->n_prefill) end = r->n_prefill;
                n_computed += end - r->n_done;
            }
            r->n_done += s->items[i].n;
            if (r->bud) budget_retry(s, r, &s->items[i]);
            if (r->bud && !r->compacted && pgd_seq_n_dropped(s->cache, r->seq) > 0) {
                /* Compacted after this step's commit: the full pages committed up to now
                 * were registered, and nothing after them will be. */
                r->compacted = 1;
                r->reg_pages = r->n_done / s->pt;
            }
            if (r->n_done == r->n_tok) {
                sample_one(s, r);
                n_sampled++;
            }
        }
        pthread_mutex_lock(&s->mu);
        s->in_flight = 0;
        s->st.n_steps++;
        s->st.n_prompt_tokens_computed += n_computed;
        s->st.n_generated_tokens += n_sampled;
        for (uint32_t i = 0; i < n_items; i++) {
            req *r = s->item_req[i];
            s->ev_tok[i] = r->cancelled ? -1 : r->out_tok;
            r->out_tok = -1;
        }
        for (uint32_t i = s->n_running; i-- > 0;) {
            req *r = s->running[i];
            if (r->cancelled)
                retire(s, i, PE_FINISH_CANCELLED);
            else if (r->finish != PE_FINISH_NONE)
                retire(s, i, r->finish);
        }
    } else if (n_items) {
        /* The forward pass failed without changing anything: end that batch's requests. */
        s->in_flight = 0;
        for (uint32_t i = s->n_running; i-- > 0;) {
            int in_batch = 0;
            for (uint32_t j = 0; j < n_items; j++)
                in_batch |= s->item_req[j] == s->running[i];
            if (s->running[i]->cancelled) {
                retire(s, i, PE_FINISH_CANCELLED);
            } else if (in_batch) {
                s->running[i]->status = rc;
                retire(s, i, PE_FINISH_ERROR);
            }
        }
        n_items = 0;
    }
    s->in_flight = 0;
    done = s->done;
    s->done = NULL;
    s->done_tail = NULL;
    pthread_mutex_unlock(&s->mu);
    deliver(s, n_items, done);
    return rc < 0 ? rc : (int)n_tokens;
}

int64_t pe_sched_run_until_idle(pe_sched *s)
{
    int64_t total = 0;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        int busy = s->n_running || s->n_waiting || s->done;
        pthread_mutex_unlock(&s->mu);
        if (!busy) return total;
        int rc = pe_sched_step(s);
        if (rc < 0) return rc;
        total += rc;
        if (rc == 0) {
            /* Nothing ran: if nothing is running either, admission is stuck (no sequence
             * could be created), and looping would never end. */
            pthread_mutex_lock(&s->mu);
            int stuck = !s->n_running && s->n_waiting && !s->done;
            pthread_mutex_unlock(&s->mu);
            if (stuck) return PGD_ENOMEM;
        }
    }
}

void pe_sched_get_stats(pe_sched *s, pe_sched_stats *out)
{
    pthread_mutex_lock(&s->mu);
    *out = s->st;
    out->n_running = s->n_running;
    out->n_waiting = s->n_waiting;
    pthread_mutex_unlock(&s->mu);
}
