/* SPDX-License-Identifier: MIT */
/*
 * eval.c - `pagoda eval`: perplexity of a GGUF model over a text file, computed exactly as
 * llama.cpp's `llama-perplexity` does, and (with a KV codec other than plain f32) the
 * damage the codec does to the model's next-token distribution.
 *
 * Method (llama.cpp's, see shared/models/README.md "Perplexity reference"):
 *
 *   tokens = tokenize(text) with BOS            n_chunks = floor(n_tokens / ctx)
 *   chunk i = tokens[i*ctx .. (i+1)*ctx), its first token replaced by BOS, evaluated
 *             from an empty sequence; logits at positions ctx/2 .. ctx-2 predict the
 *             tokens at ctx/2+1 .. ctx-1  (ctx - 1 - ctx/2 scored tokens per chunk)
 *   PPL = exp(mean NLL),  NLL = -log softmax(logits)[next token]  (double sums)
 *
 * With --kv-type other than f32 (or --kv-rotate, --kv-select-pages) a second context with
 * a plain f32 cache runs the same windows in lockstep, and for every scored position we
 * add KL(p_f32 || p_codec) and whether both argmaxes agree (top-1 agreement).
 *
 * With --tier the codec context has those storage tiers and every chunk goes through the
 * promotion path: it is computed once (unscored), every page is evicted into the tiers
 * (write-back) and flushed, then it runs again from an empty sequence whose first half
 * (the whole pages before the first scored position) is matched and promoted from the
 * tiers; only the rest is computed and scored, attending to the promoted pages. So a lossy
 * RAM tier (ram:SIZE:q8_0 / q4_0) shows as KL and top-1 against the f32 reference, which
 * runs the same positions in the same batches without tiers.
 *
 * With --kv-budget N (a token budget, budget.h) eval runs the budget protocol instead, so
 * the score measures what the compressed context still predicts:
 *
 *   chunk i:  [0 .. ctx/2)             prefilled in chunks of at most -b tokens, the item
 *                                      carrying the budget and prompt_left (the prompt
 *                                      ends at ctx/2, where the snapkv family compresses;
 *                                      online methods enforce after every step)
 *             [ctx/2 .. ctx-1)          decoded one token at a time, teacher-forced (the
 *                                      true token is fed), each step's logits scored
 *                                      (the same positions as above)
 *
 * and a second context with the same cache but no budget runs the same chunks with the same
 * protocol (dense): ppl, kl_mean and top1_agree are the budget run's against it, and
 * "kv_budget" in the JSON (one line of text) has the method, the budget, the mean slots
 * the sequence held while decoding (kv_tokens_mean), the slots dropped and the dense ppl.
 * A budget that keeps the whole first half (and, for online methods, every token of the
 * window) drops nothing: allowed, with a note that the result equals dense. Budgets do not
 * run through the tiers' promotion path (--tier with --kv-budget exits 2).
 *
 * Output: a short table on stdout, or one JSON object with --json. Bad input (missing or
 * empty text, a context that does not fit, text shorter than 2 * ctx) exits 1 with one
 * line on stderr; a bad command line exits 2. Called by the dispatcher in main.c.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli.h"
#include "model.h"
#include "tier_spec.h"

static void usage(FILE *out)
{
    fputs("usage: pagoda eval -m MODEL.gguf -f TEXT [options]\n"
          "\n"
          "Perplexity of the model over a text file, by llama.cpp's method: the text is\n"
          "tokenized once (with BOS), cut into floor(tokens / CTX) chunks of CTX tokens\n"
          "that each start with BOS and run from an empty cache, and only the second half\n"
          "of each chunk is scored. With a KV codec other than f32 the f32 cache runs the\n"
          "same chunks too, and the mean KL divergence KL(p_f32 || p_codec) and the top-1\n"
          "agreement over the scored tokens are reported.\n"
          "\n"
          "  -m, --model FILE          GGUF model (llama, qwen2, qwen3, phi3,\n"
          "                            gemma2, gemma3)\n"
          "  -f, --file FILE           the text to score\n"
          "  -c, --ctx-size N          tokens per chunk (default 512; at least 4)\n"
          "  -b, --batch-size N        tokens per forward call (default 512)\n"
          "  -t, --threads N           threads, 1..1024 (default: all cores)\n"
          "      --kv-type T           f32 | f16 | bf16 | q8_0 | q4_0 | kivi2 (default f32)\n"
          "      --kv-rotate           Hadamard-rotate K and V before encoding\n"
          "      --kv-residual N       staged codecs: least f16 staging ring (default 128)\n"
          "      --kv-select-pages N   Quest: attend to at most N pages per decode row\n"
          "                            (0 = dense, the default); it applies to rows\n"
          "                            evaluated one at a time, so pair it with -b 1\n"
          "      --deterministic       batch-invariant products (scores do not depend on -b)\n"
          "      --page-tokens N       tokens per KV page, a power of two (default 16)\n"
          "      --kv-budget N         the budget protocol: keep N tokens per (layer, KV head)\n"
          "                            (the mean); each chunk's first half is prefilled and\n"
          "                            compressed, its second half decoded token by token and\n"
          "                            scored, against the same protocol without a budget\n"
          "      --kv-window-dense     sliding-window layers keep every page (the window only\n"
          "                            masks; default: they free the pages their window left)\n"
          "      --kv-window-tokens N  the window layers' page pool in tokens\n"
          "      --kv-budget-method M  streaming | h2o | tova | snapkv | pyramidkv | adakv\n"
          "                            (default snapkv; needs --kv-budget)\n"
          "      --chunks N            score the first N chunks only (default: all)\n"
          "      --policy NAME         the pool's eviction policy: lru (default), s3fifo, arc,\n"
          "                            cost or priority (belady: pagoda replay only)\n"
          "      --json                one JSON object instead of the table\n",
          out);
    cli_tier_help(out);
    fputs("                          eval: each chunk is computed, evicted to the tiers and\n"
          "                          run again with its first half promoted from them (KL\n"
          "                          and top-1 against f32 show a lossy tier's damage)\n"
          "  -h, --help\n",
          out);
}

/* ---- scoring ---- */

typedef struct eval_sums {
    double nll, nll2;  /* sums over scored tokens of -log p(next) and its square */
    double nll_ref;    /* the same sum for the f32 reference */
    double kl, kl_max; /* KL(p_ref || p) sum and maximum */
    uint64_t n, agree; /* scored tokens; argmax(p) == argmax(p_ref) */
} eval_sums;

/* log-softmax of logits[V] into out (double), as llama.cpp's log_softmax: max in float,
 * exp sums in double. Returns the argmax. */
static uint32_t log_softmax(const float *logits, uint32_t V, double *out)
{
    float mx = logits[0];
    uint32_t best = 0;
    for (uint32_t i = 1; i < V; i++) {
        if (logits[i] > mx) {
            mx = logits[i];
            best = i;
        }
    }
    double sum = 0;
    for (uint32_t i = 0; i < V; i++)
        sum += expf(logits[i] - mx);
    double lse = log(sum);
    for (uint32_t i = 0; i < V; i++)
        out[i] = (double)(logits[i] - mx) - lse;
    return best;
}

/* Scores one position: lg predicts tok; ref (may be NULL) is the f32 reference's logits. */
static void score(eval_sums *s, const float *lg, const float *ref, uint32_t V, int32_t tok,
                  double *lp, double *lq)
{
    uint32_t a = log_softmax(lg, V, lq);
    double nll = -lq[tok];
    s->nll += nll;
    s->nll2 += nll * nll;
    s->n++;
    if (!ref) {
        s->nll_ref += nll;
        s->agree++;
        return;
    }
    uint32_t b = log_softmax(ref, V, lp);
    double kl = 0;
    for (uint32_t i = 0; i < V; i++)
        kl += exp(lp[i]) * (lp[i] - lq[i]);
    if (kl < 0) kl = 0; /* rounding when the two are equal */
    s->kl += kl;
    if (kl > s->kl_max) s->kl_max = kl;
    s->nll_ref += -lp[tok];
    s->agree += a == b;
}

typedef struct eval_run {
    pe_model *m;
    pe_ctx *ctx, *ref; /* ref: the f32 comparison context or NULL */
    uint32_t n_ctx, n_batch;
    float *lg, *lg_ref;    /* [n_batch][V] */
    double *lp, *lq;       /* [V] scratch */
    int32_t *chunk;        /* [n_ctx] */
    int tiered;            /* ctx has tiers: run each chunk through the promotion path */
    uint64_t n_promoted;   /* prefix tokens matched from the tiers, all chunks */
    uint64_t n_promotable; /* prefix tokens that could have been */
    uint64_t tier_tokens[PGD_MAX_TIERS]; /* n_promoted by tier */
    /* The budget protocol: ctx runs under the budget bp, ref the same cache dense. */
    int budgeted;
    pgd_budget_params bp;   /* ctx's budget, as pe_ctx_create checked it */
    uint64_t kv_slots_sum;  /* the sequence's slots after each decode step, summed */
    uint64_t kv_slots_n;    /* decode steps counted in it */
    uint64_t n_dropped;     /* slots dropped by the budget, all chunks */
    uint64_t n_compactions; /* compactions the budget ran, all chunks */
} eval_run;

/* Runs tokens[0..n) of seq in batches of n_batch with no logits. Returns 0 or a status. */
static int prefill(pe_ctx *ctx, pgd_seq *seq, const int32_t *tokens, uint32_t n, uint32_t n_batch)
{
    int rc = 0;
    for (uint32_t b = 0; b < n && rc == 0; b += n_batch)
        rc = pe_forward(ctx, seq, tokens + b, n - b < n_batch ? n - b : n_batch, NULL, 0);
    return rc;
}

/* The promotion path of one chunk in the tiered context: computes chunk[0..n_ctx) once,
 * evicts and flushes every page into the tiers, and leaves *seq a new sequence with the
 * whole pages of chunk[0..first) matched from them (promoted, waited for). Returns the
 * matched length or a negative status. */
static int64_t promote_chunk(eval_run *r, pgd_seq **seq, uint32_t first)
{
    pgd_cache *c = pe_ctx_cache(r->ctx);
    pgd_match_info mi;
    int rc = prefill(r->ctx, *seq, r->chunk, r->n_ctx, r->n_batch);
    pgd_seq_destroy(c, *seq);
    *seq = NULL;
    if (rc == 0) rc = cli_cache_write_back(c);
    if (rc == 0) rc = pgd_seq_create(c, NULL, 0, seq);
    if (rc != 0) return rc;
    int64_t got = pgd_seq_match(c, *seq, r->chunk, first);
    if (got < 0) return got;
    pgd_seq_wait(c, *seq);
    got = (int64_t)pgd_seq_length(c, *seq);
    pgd_seq_match_info(c, *seq, &mi);
    for (uint32_t i = 0; i < mi.n_tiers && i < PGD_MAX_TIERS; i++)
        r->tier_tokens[i] += mi.tier_tokens[i];
    r->n_promoted += (uint64_t)got;
    r->n_promotable += first / pgd_cache_page_tokens(c) * pgd_cache_page_tokens(c);
    return got;
}

/* Evaluates one chunk (tokens[0..n_ctx) of the text, the first replaced by BOS) in every
 * context and scores its second half. Returns 0 or a negative pgd_status. */
static int eval_chunk(eval_run *r, const int32_t *tokens, int add_bos, eval_sums *s)
{
    const uint32_t V = pe_model_hparams(r->m)->n_vocab, n_ctx = r->n_ctx, first = n_ctx / 2;
    pe_ctx *ctxs[2] = {r->ctx, r->ref};
    float *lgs[2] = {r->lg, r->lg_ref};
    pgd_seq *seqs[2] = {NULL, NULL};
    int rc = 0;
    memcpy(r->chunk, tokens, n_ctx * sizeof *r->chunk);
    if (add_bos) r->chunk[0] = pe_vocab_bos(pe_model_vocab(r->m));
    uint32_t start = 0;
    for (int k = 0; k < 2 && rc == 0; k++)
        if (ctxs[k]) rc = pgd_seq_create(pe_ctx_cache(ctxs[k]), NULL, 0, &seqs[k]);
    if (r->tiered && rc == 0) {
        /* The reference computes the promoted prefix itself; then both run the same
         * positions in the same batches. */
        int64_t got = promote_chunk(r, &seqs[0], first);
        rc = got < 0 ? (int)got : 0;
        start = got < 0 ? 0 : (uint32_t)got;
        if (rc == 0 && start) rc = prefill(r->ref, seqs[1], r->chunk, start, r->n_batch);
    }
    for (uint32_t b = start; b < n_ctx && rc == 0; b += r->n_batch) {
        uint32_t n = n_ctx - b < r->n_batch ? n_ctx - b : r->n_batch;
        int want = b + n > first;
        for (int k = 0; k < 2 && rc == 0; k++)
            if (ctxs[k])
                rc = pe_forward(ctxs[k], seqs[k], r->chunk + b, n, want ? lgs[k] : NULL, 1);
        if (rc || !want) continue;
        for (uint32_t j = b > first ? b : first; j < b + n && j + 1 < n_ctx; j++) {
            const size_t row = (size_t)(j - b) * V;
            score(s, r->lg + row, r->ref ? r->lg_ref + row : NULL, V, tokens[j + 1], r->lp, r->lq);
        }
    }
    for (int k = 0; k < 2; k++) {
        if (!ctxs[k]) continue;
        pgd_seq_destroy(pe_ctx_cache(ctxs[k]), seqs[k]);
        pgd_cache_clear(pe_ctx_cache(ctxs[k])); /* every chunk starts from an empty cache */
    }
    return rc;
}

/* ---- the budget protocol ---- */

/* One chunk under the budget protocol: ctx with a fresh budget state and ref dense run
 * chunk[0..first) as the prompt (chunks of n_batch), then chunk[first..n_ctx-1) one token
 * at a time, each step's logits scored against the next token. Returns 0 or a negative
 * pgd_status. */
static int eval_chunk_budget(eval_run *r, const int32_t *tokens, int add_bos, eval_sums *s)
{
    const uint32_t V = pe_model_hparams(r->m)->n_vocab, n_ctx = r->n_ctx, first = n_ctx / 2;
    pe_ctx *ctxs[2] = {r->ctx, r->ref};
    float *lgs[2] = {r->lg, r->lg_ref};
    pgd_seq *seqs[2] = {NULL, NULL};
    pgd_cache *c = pe_ctx_cache(r->ctx);
    pgd_budget *b = NULL;
    memcpy(r->chunk, tokens, n_ctx * sizeof *r->chunk);
    if (add_bos) r->chunk[0] = pe_vocab_bos(pe_model_vocab(r->m));
    int rc = pgd_budget_create(c, &r->bp, &b);
    for (int k = 0; k < 2 && rc == 0; k++)
        rc = pgd_seq_create(pe_ctx_cache(ctxs[k]), NULL, 0, &seqs[k]);
    for (uint32_t p = 0; p < first && rc == 0; p += r->n_batch) {
        uint32_t n = first - p < r->n_batch ? first - p : r->n_batch;
        for (int k = 0; k < 2 && rc == 0; k++)
            rc = pe_forward_budget(ctxs[k], seqs[k], k ? NULL : b, r->chunk + p, n, first - p, NULL,
                                   0);
    }
    for (uint32_t j = first; j + 1 < n_ctx && rc == 0; j++) {
        for (int k = 0; k < 2 && rc == 0; k++)
            rc = pe_forward_budget(ctxs[k], seqs[k], k ? NULL : b, r->chunk + j, 1, 0, lgs[k], 0);
        if (rc) break;
        score(s, r->lg, r->lg_ref, V, tokens[j + 1], r->lp, r->lq);
        r->kv_slots_sum += pgd_seq_length(c, seqs[0]);
        r->kv_slots_n++;
    }
    if (seqs[0]) r->n_dropped += pgd_seq_n_dropped(c, seqs[0]);
    if (b) {
        pgd_budget_stats st;
        pgd_budget_get_stats(b, &st);
        r->n_compactions += st.compactions;
    }
    pgd_budget_destroy(b);
    for (int k = 0; k < 2; k++) {
        pgd_seq_destroy(pe_ctx_cache(ctxs[k]), seqs[k]);
        pgd_cache_clear(pe_ctx_cache(ctxs[k]));
    }
    return rc;
}

/* Whether budget p keeps every token of a chunk of n_ctx tokens under the protocol. An
 * online method compacts only once the sequence holds a page more than its budget
 * (budget.h), and the chunk's sequence grows to n_ctx - 1 slots; the others compress once,
 * at the prompt's end (the first half), to each layer's budget. */
static int budget_keeps_all(const pgd_budget_params *p, uint32_t n_layers, uint32_t n_ctx,
                            uint32_t page_tokens)
{
    int online = p->online >= 0 ? p->online
                                : p->method == PGD_BUDGET_STREAMING ||
                                      p->method == PGD_BUDGET_H2O || p->method == PGD_BUDGET_TOVA;
    if (online) return (uint64_t)p->budget + page_tokens > (uint64_t)n_ctx - 1;
    for (uint32_t l = 0; l < n_layers; l++)
        if (pgd_budget_layer_budget(p, l, n_layers) < n_ctx / 2) return 0;
    return 1;
}

/* ---- the command ---- */

static int print_json(const char *model, const char *text, const pe_ctx_params *cp,
                      uint64_t n_tokens, uint32_t n_chunks, const eval_sums *s, double ppl,
                      double ppl_err, double bpt, double bpt_f32, double secs, int compared,
                      const cli_tiers *tiers, const eval_run *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "model", json_string(model));
    json_object_set_new(o, "file", json_string(text));
    json_object_set_new(o, "tokens", json_integer((json_int_t)n_tokens));
    json_object_set_new(o, "ctx", json_integer(cp->n_ctx));
    json_object_set_new(o, "batch", json_integer(cp->n_batch));
    json_object_set_new(o, "chunks", json_integer(n_chunks));
    json_object_set_new(o, "scored", json_integer((json_int_t)s->n));
    json_object_set_new(o, "kv_type", json_string(pgd_kv_type_name(cp->kv_type)));
    json_object_set_new(o, "kv_rotate", json_boolean(cp->kv_rotate));
    json_object_set_new(o, "kv_residual", json_integer(cp->kv_residual));
    json_object_set_new(o, "kv_select_pages", json_integer(cp->kv_select_pages));
    json_object_set_new(o, "page_tokens", json_integer(cp->page_tokens));
    json_object_set_new(o, "kv_bytes_per_token", json_real(bpt));
    json_object_set_new(o, "kv_bytes_per_token_f32", json_real(bpt_f32));
    json_object_set_new(o, "ppl", json_real(ppl));
    json_object_set_new(o, "ppl_err", json_real(ppl_err));
    json_object_set_new(o, "nll_mean", json_real(s->nll / (double)s->n));
    if (!r->budgeted || cp->kv_type == PGD_KV_F32) /* the budget's reference: the same codec */
        json_object_set_new(o, "ppl_f32", json_real(exp(s->nll_ref / (double)s->n)));
    json_object_set_new(o, "kl_mean", json_real(s->kl / (double)s->n));
    json_object_set_new(o, "kl_max", json_real(s->kl_max));
    json_object_set_new(o, "top1_agree", json_real((double)s->agree / (double)s->n));
    json_object_set_new(o, "compared", json_boolean(compared));
    json_object_set_new(o, "seconds", json_real(secs));
    if (r->budgeted) {
        json_t *kb = json_object();
        json_object_set_new(kb, "method", json_string(pgd_budget_method_name(r->bp.method)));
        json_object_set_new(kb, "budget", json_integer(r->bp.budget));
        json_object_set_new(
            kb, "kv_tokens_mean",
            json_real(r->kv_slots_n ? (double)r->kv_slots_sum / (double)r->kv_slots_n : 0.0));
        json_object_set_new(kb, "dropped_tokens", json_integer((json_int_t)r->n_dropped));
        json_object_set_new(kb, "compactions", json_integer((json_int_t)r->n_compactions));
        json_object_set_new(kb, "dense_ppl", json_real(exp(s->nll_ref / (double)s->n)));
        json_object_set_new(o, "kv_budget", kb);
    }
    if (tiers->n) {
        /* The promotion path: the tiers as given, and the prefix tokens they served. */
        json_t *ta = json_array(), *by = json_object();
        for (uint32_t i = 0; i < tiers->n; i++) {
            json_array_append_new(ta, json_string(tiers->specs[i].text));
            json_object_set_new(by, pgd_tier_name(tiers->tiers[i]),
                                json_integer((json_int_t)r->tier_tokens[i]));
        }
        json_object_set_new(o, "tiers", ta);
        json_object_set_new(o, "promoted_tokens", json_integer((json_int_t)r->n_promoted));
        json_object_set_new(o, "promotable_tokens", json_integer((json_int_t)r->n_promotable));
        json_object_set_new(o, "promoted_tokens_by_tier", by);
    }
    int rc = json_dumpf(o, stdout, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
    fputc('\n', stdout);
    json_decref(o);
    return rc;
}

int cmd_eval(int argc, char **argv)
{
    enum { O_JSON = 1000, O_CHUNKS };
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"file", required_argument, 0, 'f'},
                                         {"ctx-size", required_argument, 0, 'c'},
                                         {"batch-size", required_argument, 0, 'b'},
                                         {"threads", required_argument, 0, 't'},
                                         {"json", no_argument, 0, O_JSON},
                                         {"chunks", required_argument, 0, O_CHUNKS},
                                         CLI_KV_LONG_OPTIONS,
                                         CLI_TIER_LONG_OPTIONS,
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *cmd = "pagoda eval";
    const char *model_path = NULL, *text_path = NULL;
    int json = 0;
    uint64_t v, max_chunks = 0;
    pe_ctx_params cp = pe_ctx_default_params();
    cp.n_ctx = 512;
    cp.kv_type = PGD_KV_F32;
    cli_tiers tiers;
    memset(&tiers, 0, sizeof tiers);
    int c;
    optind = 1;
    for (;;) {
        c = getopt_long(argc, argv, "m:f:c:b:t:h", opts, NULL);
        if (c == -1) break;
        {
            int kr = cli_kv_option(cmd, c, optarg, &cp);
            if (kr < 0) return CLI_EXIT_USAGE;
            if (kr > 0) continue;
            kr = cli_tier_option(cmd, c, optarg, &tiers);
            if (kr < 0) return CLI_EXIT_USAGE;
            if (kr > 0) continue;
        }
        switch (c) {
        case 'm':
            model_path = optarg;
            break;
        case 'f':
            text_path = optarg;
            break;
        case 'c':
            if (cli_parse_u64(cmd, "-c", optarg, 4, 1u << 20, &v)) return CLI_EXIT_USAGE;
            cp.n_ctx = (uint32_t)v;
            break;
        case 'b':
            if (cli_parse_u64(cmd, "-b", optarg, 1, 1u << 16, &v)) return CLI_EXIT_USAGE;
            cp.n_batch = (uint32_t)v;
            break;
        case 't':
            if (cli_parse_u64(cmd, "-t", optarg, 1, CLI_MAX_THREADS, &v)) return CLI_EXIT_USAGE;
            cp.n_threads = (uint32_t)v;
            break;
        case O_JSON:
            json = 1;
            break;
        case O_CHUNKS:
            if (cli_parse_u64(cmd, "--chunks", optarg, 1, 1u << 30, &max_chunks))
                return CLI_EXIT_USAGE;
            break;
        case 'h':
            usage(stdout);
            return CLI_EXIT_OK;
        default:
            return cli_usage_error(cmd);
        }
    }
    if (optind < argc) return cli_unexpected_arg(cmd, argv[optind]);
    if (cli_kv_finish(cmd, &cp)) return CLI_EXIT_USAGE;
    if (!model_path || !text_path) {
        fprintf(stderr, "%s: -m MODEL and -f TEXT are required\n", cmd);
        return cli_usage_error(cmd);
    }
    if (cp.n_batch > cp.n_ctx) cp.n_batch = cp.n_ctx;
    const int budgeted = cp.budget.method != PGD_BUDGET_NONE;
    if (budgeted && tiers.n) {
        fprintf(stderr,
                "%s: --kv-budget: the budget protocol does not run through the tiers' "
                "promotion path (--tier)\n",
                cmd);
        return cli_usage_error(cmd);
    }

    int rc = CLI_EXIT_FAIL;
    char err[512];
    size_t text_len = 0;
    char *text = cli_read_file(text_path, &text_len);
    pe_model *m = NULL;
    eval_run r;
    memset(&r, 0, sizeof r);
    int32_t *tokens = NULL;
    if (!text) {
        fprintf(stderr, "%s: cannot read %s\n", cmd, text_path);
        goto out;
    }
    if (text_len == 0) {
        fprintf(stderr, "%s: %s is empty\n", cmd, text_path);
        goto out;
    }
    if (cli_tiers_open(cmd, &tiers, pe_log_stderr, NULL)) goto out;
    cli_tiers_apply(&tiers, &cp);
    if (pe_model_load(model_path, NULL, NULL, &m, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", cmd, err);
        goto out;
    }
    const pe_hparams *hp0 = pe_model_hparams(m);
    const uint32_t V = hp0->n_vocab;
    if (cp.n_ctx > pe_model_hparams(m)->n_ctx_train)
        fprintf(stderr, "%s: note: context %u is beyond the model's training context %u\n", cmd,
                cp.n_ctx, pe_model_hparams(m)->n_ctx_train);
    int add_bos = pe_vocab_add_bos(pe_model_vocab(m)) && pe_vocab_bos(pe_model_vocab(m)) >= 0;
    int64_t n_tokens = pe_tokenize(pe_model_vocab(m), text, text_len, 1, 0, NULL, 0);
    if (n_tokens < 0) {
        fprintf(stderr, "%s: cannot tokenize %s: %s\n", cmd, text_path,
                pgd_strerror((int)n_tokens));
        goto out;
    }
    if ((uint64_t)n_tokens < 2 * (uint64_t)cp.n_ctx) {
        fprintf(stderr,
                "%s: %s has %lld tokens; a context of %u needs at least %llu (two chunks)\n", cmd,
                text_path, (long long)n_tokens, cp.n_ctx, 2 * (unsigned long long)cp.n_ctx);
        goto out;
    }
    tokens = malloc((size_t)n_tokens * sizeof *tokens);
    if (!tokens) {
        fprintf(stderr, "%s: out of memory for %lld tokens\n", cmd, (long long)n_tokens);
        goto out;
    }
    pe_tokenize(pe_model_vocab(m), text, text_len, 1, 0, tokens, (size_t)n_tokens);

    int compared =
        cp.kv_type != PGD_KV_F32 || cp.kv_rotate || cp.kv_select_pages || tiers.n || budgeted;
    /* A compaction copies the registered pages it keeps before it lets them go: room for a
     * second window's pages, so that the budget never meets a full pool here. */
    cp.kv_tokens = budgeted ? 2 * (uint64_t)cp.n_ctx : cp.n_ctx;
    if (pe_ctx_create(m, &cp, &r.ctx, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", cmd, err);
        goto out;
    }
    const pe_ctx_params *ap = pe_ctx_params_get(r.ctx);
    if (compared) {
        pe_ctx_params rp = *ap;
        if (budgeted) {
            /* The budget's reference: the same cache, dense. */
            rp.budget = pgd_budget_default_params(PGD_BUDGET_NONE, 0);
            rp.budget_scores = 0;
            rp.kv_tokens = ap->n_ctx;
        } else {
            rp.kv_type = PGD_KV_F32;
            rp.kv_rotate = 0;
            rp.kv_residual = 0;
            rp.kv_select_pages = 0;
        }
        rp.tiers = NULL; /* the reference computes everything */
        rp.n_tiers = 0;
        rp.hash_key = NULL;
        rp.hash_key_len = 0;
        if (pe_ctx_create(m, &rp, &r.ref, err, sizeof err)) {
            fprintf(stderr, "%s: f32 reference: %s\n", cmd, err);
            goto out;
        }
    }
    r.m = m;
    r.tiered = tiers.n > 0;
    r.budgeted = budgeted;
    r.bp = ap->budget;
    if (budgeted) {
        /* The budget state every chunk creates, tried once here so that a method this
         * build cannot run is refused before any work. */
        pgd_budget *b = NULL;
        int brc = pgd_budget_create(pe_ctx_cache(r.ctx), &r.bp, &b);
        pgd_budget_destroy(b);
        if (brc != PGD_OK) {
            fprintf(stderr, "%s: --kv-budget %u (%s): %s\n", cmd, r.bp.budget,
                    pgd_budget_method_name(r.bp.method), pgd_strerror(brc));
            goto out;
        }
        if (budget_keeps_all(&r.bp, hp0->n_layer, ap->n_ctx, ap->page_tokens))
            fprintf(stderr,
                    "%s: note: --kv-budget %u (%s) keeps every token of a %u-token chunk: "
                    "nothing is dropped and the result equals dense\n",
                    cmd, r.bp.budget, pgd_budget_method_name(r.bp.method), ap->n_ctx);
    }
    r.n_ctx = ap->n_ctx;
    r.n_batch = ap->n_batch;
    r.lg = malloc((size_t)r.n_batch * V * sizeof *r.lg);
    r.lg_ref = compared ? malloc((size_t)r.n_batch * V * sizeof *r.lg_ref) : NULL;
    r.lp = malloc((size_t)V * sizeof *r.lp);
    r.lq = malloc((size_t)V * sizeof *r.lq);
    r.chunk = malloc((size_t)r.n_ctx * sizeof *r.chunk);
    if (!r.lg || (compared && !r.lg_ref) || !r.lp || !r.lq || !r.chunk) {
        fprintf(stderr, "%s: out of memory for logits\n", cmd);
        goto out;
    }

    uint32_t n_chunks = (uint32_t)((uint64_t)n_tokens / r.n_ctx);
    if (max_chunks && max_chunks < n_chunks) n_chunks = (uint32_t)max_chunks;
    eval_sums s;
    memset(&s, 0, sizeof s);
    double t0 = cli_now_s();
    for (uint32_t i = 0; i < n_chunks; i++) {
        int frc = budgeted ? eval_chunk_budget(&r, tokens + (size_t)i * r.n_ctx, add_bos, &s)
                           : eval_chunk(&r, tokens + (size_t)i * r.n_ctx, add_bos, &s);
        if (frc < 0) {
            fprintf(stderr, "%s: chunk %u: forward failed: %s\n", cmd, i, pgd_strerror(frc));
            goto out;
        }
    }
    double secs = cli_now_s() - t0;
    if (budgeted) {
        /* A compaction that failed left its sequence whole: the figures would not be the
         * budget's. */
        int bst;
        uint64_t nf = pe_ctx_budget_failures(r.ctx, &bst);
        if (nf) {
            fprintf(stderr, "%s: --kv-budget: %llu compactions failed (%s)\n", cmd,
                    (unsigned long long)nf, pgd_strerror(bst));
            goto out;
        }
    }
    double nll = s.nll / (double)s.n, ppl = exp(nll);
    double var = s.nll2 / (double)s.n - nll * nll;
    double ppl_err = var > 0 && s.n > 1 ? sqrt(var / (double)(s.n - 1)) * ppl : 0;
    const pe_hparams *hp = pe_model_hparams(m);
    double bpt = pgd_kv_bytes_per_token(ap->kv_type, ap->page_tokens, hp->n_layer, hp->n_head_kv,
                                        hp->head_dim);
    double bpt32 = pgd_kv_bytes_per_token(PGD_KV_F32, ap->page_tokens, hp->n_layer, hp->n_head_kv,
                                          hp->head_dim);
    if (json) {
        if (print_json(model_path, text_path, ap, (uint64_t)n_tokens, n_chunks, &s, ppl, ppl_err,
                       bpt, bpt32, secs, compared, &tiers, &r)) {
            fprintf(stderr, "%s: cannot write the JSON output\n", cmd);
            goto out;
        }
    } else {
        printf("pagoda eval: %s on %s: %lld tokens, %u chunks of %u, %llu scored, %.2f s\n",
               model_path, text_path, (long long)n_tokens, n_chunks, r.n_ctx,
               (unsigned long long)s.n, secs);
        if (ap->kv_type == PGD_KV_KIVI2)
            printf("kivi2 residual window: %u tokens\n", ap->kv_residual);
        if (ap->kv_select_pages)
            printf("Quest: at most %u pages per decode row\n", ap->kv_select_pages);
        printf("%-16s %12s %10s %10s %12s %8s\n", "kv", "bytes/token", "ppl", "+/-", "kl_mean",
               "top-1");
        if (compared)
            printf("%-16s %12.1f %10.4f %10s %12s %8s\n",
                   budgeted ? pgd_kv_type_name(ap->kv_type) : "f32", budgeted ? bpt : bpt32,
                   exp(s.nll_ref / (double)s.n), "", "0", "100.00%");
        if (tiers.n) {
            printf("tiers: %llu of %llu prefix tokens promoted (", (unsigned long long)r.n_promoted,
                   (unsigned long long)r.n_promotable);
            for (uint32_t i = 0; i < tiers.n; i++)
                printf("%s%s %llu", i ? ", " : "", tiers.specs[i].text,
                       (unsigned long long)r.tier_tokens[i]);
            printf(")\n");
        }
        char name[96], tname[40] = "", bname[40] = "";
        if (budgeted)
            snprintf(bname, sizeof bname, "+%s:%u", pgd_budget_method_name(r.bp.method),
                     r.bp.budget);
        if (tiers.n) {
            /* "+ram:q8_0:zstd": the first tier's kind and, for RAM, how it stores. */
            const cli_tier_spec *ts = &tiers.specs[0];
            const char *comp = ts->compression == PGD_RECORD_LZ4    ? ":lz4"
                               : ts->compression == PGD_RECORD_ZSTD ? ":zstd"
                                                                    : "";
            const char *kind = ts->kind == CLI_TIER_RAM    ? "ram"
                               : ts->kind == CLI_TIER_DISK ? "disk"
                                                           : "redis";
            snprintf(tname, sizeof tname, "+%s%s%s%s", kind, ts->store_type >= 0 ? ":" : "",
                     ts->store_type >= 0 ? pgd_kv_type_name((pgd_kv_type)ts->store_type) : "",
                     comp);
        }
        snprintf(name, sizeof name, "%s%s%s%s%s", pgd_kv_type_name(ap->kv_type),
                 ap->kv_rotate ? "+rotate" : "", ap->kv_select_pages ? "+quest" : "", tname, bname);
        printf("%-16s %12.1f %10.4f %10.5f %12.6f %7.2f%%\n", name, bpt, ppl, ppl_err,
               s.kl / (double)s.n, 100.0 * (double)s.agree / (double)s.n);
        if (budgeted)
            printf("kv budget: %s %u tokens per (layer, kv head): ppl %.4f (dense %.4f), "
                   "kl_mean %.6f, top-1 %.2f%%, kv_tokens_mean %.1f, %llu tokens dropped\n",
                   pgd_budget_method_name(r.bp.method), r.bp.budget, ppl,
                   exp(s.nll_ref / (double)s.n), s.kl / (double)s.n,
                   100.0 * (double)s.agree / (double)s.n,
                   r.kv_slots_n ? (double)r.kv_slots_sum / (double)r.kv_slots_n : 0.0,
                   (unsigned long long)r.n_dropped);
    }
    rc = CLI_EXIT_OK;
out:
    free(r.lg);
    free(r.lg_ref);
    free(r.lp);
    free(r.lq);
    free(r.chunk);
    pe_ctx_destroy(r.ref);
    pe_ctx_destroy(r.ctx);
    cli_tiers_close(&tiers);
    free(tokens);
    pe_model_destroy(m);
    free(text);
    return rc;
}
