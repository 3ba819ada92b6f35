/* SPDX-License-Identifier: MIT */
/*
 * run.c - `pagoda run`: load a GGUF model, prefill the prompt in chunks through the paged
 * KV cache, then sample and stream tokens until -n tokens or an end-of-generation token.
 * Generated text goes to stdout as it is produced; the timing line goes to stderr.
 *
 * With --tier, the prompt is first matched against the tiers (pages an earlier run left
 * there: a disk tier survives the process), its promoted pages are waited for, and only
 * the rest is computed; the timing line then says how many prompt tokens came from where.
 * At exit every cached page is evicted through the tiers (write-back) and the tiers are
 * flushed, so the next run with the same disk tier finds this one's prompt and output.
 *
 * With --kv-budget, the sequence runs under a token budget (budget.h: pgd_budget, one per
 * sequence, through pe_forward_budget): the prompt's chunks and every decode token are
 * scored and the budget enforced after each, and the timing line then says the method,
 * the budget, the slots the sequence held at the end, the tokens dropped and the pages
 * the compactions freed.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "model.h"
#include "sample.h"
#include "tier_spec.h"

static void usage(FILE *out)
{
    fputs("usage: pagoda run -m MODEL.gguf -p PROMPT [options]\n"
          "\n"
          "Generates text with a Llama-family GGUF model on the paged KV cache.\n"
          "\n"
          "  -m, --model FILE        GGUF model (llama, qwen2, qwen3, phi3,\n"
          "                          gemma2, gemma3)\n"
          "  -p, --prompt TEXT       the prompt (BOS is added when the model asks for it)\n"
          "  -f, --file FILE         read the prompt from a file instead\n"
          "  -n, --n-predict N       tokens to generate (default 128; -1: until EOS or the\n"
          "                          context is full; never more than the context holds)\n"
          "  -c, --ctx-size N        context length in tokens (default: the model's)\n"
          "  -t, --threads N         threads, 1..1024 (default: all cores)\n"
          "  -b, --batch-size N      prompt tokens per forward chunk (default 512)\n"
          "      --temp T            temperature; 0 = greedy (default 0.8)\n"
          "      --top-k N           (default 40; 0 = off)\n"
          "      --top-p P           (default 0.95; 1 = off)\n"
          "      --min-p P           (default 0.05; 0 = off)\n"
          "      --repeat-penalty R  (default 1.0 = off)\n"
          "      --repeat-last-n N   (default 64)\n"
          "  -s, --seed S            RNG seed (default 3735928559)\n"
          "      --kv-type T         KV codec: f32 | f16 | bf16 | q8_0 | q4_0 | kivi2\n"
          "                          (default f16)\n"
          "      --kv-rotate         Hadamard-rotate K and V before encoding\n"
          "      --kv-residual N     staged codecs: least f16 staging ring (default 128)\n"
          "      --kv-select-pages N Quest: attend to at most N pages per decoded token\n"
          "                          (0 = dense, the default; else at least 2)\n"
          "      --attn-ref          attend with libpagoda's scalar reference (slow; checks)\n"
          "      --deterministic     batch-invariant products: a prompt's logits do not depend\n"
          "                          on its chunking (slower decode on AVX-512)\n"
          "      --page-tokens N     tokens per KV page, a power of two (default 16)\n"
          "      --policy NAME       the pool's eviction policy: lru (default), s3fifo, arc,\n"
          "                          cost (what a hit saves per byte) or priority (belady is\n"
          "                          pagoda replay's only: it needs the future)\n"
          "      --kv-budget N       token budget: keep N tokens per layer and KV head (mean)\n"
          "      --kv-budget-method M  streaming|h2o|tova|snapkv|pyramidkv|adakv (default snapkv)\n"
          "      --kv-window-dense   sliding-window layers keep every page (the window only\n"
          "                          masks; default: they free the pages their window left)\n"
          "      --kv-window-tokens N  the window layers' page pool in tokens (default: a\n"
          "                          window and a chunk per sequence)\n"
          "      --no-display-prompt do not echo the prompt\n",
          out);
    cli_tier_help(out);
    fputs("                          run: the prompt is matched in the tiers first, and at\n"
          "                          exit every page is written back to them and flushed\n"
          "  -h, --help\n",
          out);
}

int cmd_run(int argc, char **argv)
{
    enum { O_TEMP = 1000, O_TOPK, O_TOPP, O_MINP, O_RP, O_RLN, O_NDP, O_AREF };
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"prompt", required_argument, 0, 'p'},
                                         {"file", required_argument, 0, 'f'},
                                         {"n-predict", required_argument, 0, 'n'},
                                         {"ctx-size", required_argument, 0, 'c'},
                                         {"threads", required_argument, 0, 't'},
                                         {"batch-size", required_argument, 0, 'b'},
                                         {"seed", required_argument, 0, 's'},
                                         {"temp", required_argument, 0, O_TEMP},
                                         {"top-k", required_argument, 0, O_TOPK},
                                         {"top-p", required_argument, 0, O_TOPP},
                                         {"min-p", required_argument, 0, O_MINP},
                                         {"repeat-penalty", required_argument, 0, O_RP},
                                         {"repeat-last-n", required_argument, 0, O_RLN},
                                         {"attn-ref", no_argument, 0, O_AREF},
                                         {"no-display-prompt", no_argument, 0, O_NDP},
                                         CLI_KV_LONG_OPTIONS,
                                         CLI_TIER_LONG_OPTIONS,
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *cmd = "pagoda run";
    const char *model_path = NULL, *prompt = NULL, *prompt_file = NULL;
    int64_t n_predict = 128;
    uint64_t v;
    int display_prompt = 1;
    /* log: pe_log_stderr, so libpagoda's warnings show as "libpagoda: ..." lines. */
    pe_ctx_params cp = pe_ctx_default_params();
    pe_sampler_params sp = pe_sampler_default_params();
    sp.seed = 3735928559u;
    cli_tiers tiers;
    memset(&tiers, 0, sizeof tiers);
    int c;
    optind = 1;
    for (;;) {
        c = getopt_long(argc, argv, "m:p:f:n:c:t:b:s:h", opts, NULL);
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
        case 'p':
            prompt = optarg;
            break;
        case 'f':
            prompt_file = optarg;
            break;
        case 'n':
            if (strcmp(optarg, "-1") == 0) {
                n_predict = -1;
                break;
            }
            if (optarg[0] == '-') {
                fprintf(stderr,
                        "%s: -n: '%s' is neither -1 (until the context is full) nor a "
                        "number of tokens\n",
                        cmd, optarg);
                return CLI_EXIT_USAGE;
            }
            if (cli_parse_u64(cmd, "-n", optarg, 0, 1u << 30, &v)) return CLI_EXIT_USAGE;
            n_predict = (int64_t)v;
            break;
        case 'c':
            if (cli_parse_u64(cmd, "-c", optarg, 1, 1u << 24, &v)) return CLI_EXIT_USAGE;
            cp.n_ctx = (uint32_t)v;
            break;
        case 't':
            if (cli_parse_u64(cmd, "-t", optarg, 1, CLI_MAX_THREADS, &v)) return CLI_EXIT_USAGE;
            cp.n_threads = (uint32_t)v;
            break;
        case 'b':
            if (cli_parse_u64(cmd, "-b", optarg, 1, 1u << 16, &v)) return CLI_EXIT_USAGE;
            cp.n_batch = (uint32_t)v;
            break;
        case 's':
            if (cli_parse_u64(cmd, "--seed", optarg, 0, UINT64_MAX, &v)) return CLI_EXIT_USAGE;
            sp.seed = v;
            break;
        case O_TEMP:
            if (cli_parse_float(cmd, "--temp", optarg, &sp.temp)) return CLI_EXIT_USAGE;
            break;
        case O_TOPK:
            if (cli_parse_u64(cmd, "--top-k", optarg, 0, 1u << 30, &v)) return CLI_EXIT_USAGE;
            sp.top_k = (int32_t)v;
            break;
        case O_TOPP:
            if (cli_parse_float(cmd, "--top-p", optarg, &sp.top_p)) return CLI_EXIT_USAGE;
            break;
        case O_MINP:
            if (cli_parse_float(cmd, "--min-p", optarg, &sp.min_p)) return CLI_EXIT_USAGE;
            break;
        case O_RP:
            if (cli_parse_float(cmd, "--repeat-penalty", optarg, &sp.repeat_penalty))
                return CLI_EXIT_USAGE;
            break;
        case O_RLN:
            if (cli_parse_u64(cmd, "--repeat-last-n", optarg, 0, 1u << 20, &v))
                return CLI_EXIT_USAGE;
            sp.repeat_last_n = (int32_t)v;
            break;
        case O_AREF:
            cp.attn_ref = 1;
            break;
        case O_NDP:
            display_prompt = 0;
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
    if (!model_path) {
        fprintf(stderr, "%s: -m MODEL is required\n", cmd);
        return cli_usage_error(cmd);
    }
    if (sp.temp < 0 || sp.top_p <= 0 || sp.min_p < 0 || sp.min_p > 1 || sp.repeat_penalty <= 0) {
        fprintf(stderr, "%s: sampling parameters out of range\n", cmd);
        return CLI_EXIT_USAGE;
    }
    char *owned_prompt = NULL;
    if (prompt_file) {
        owned_prompt = cli_read_file(prompt_file, NULL);
        if (!owned_prompt) {
            fprintf(stderr, "%s: cannot read %s\n", cmd, prompt_file);
            return CLI_EXIT_FAIL;
        }
        prompt = owned_prompt;
    }
    if (!prompt) prompt = "";

    int rc = CLI_EXIT_FAIL;
    char err[512];
    pe_model *m = NULL;
    pe_ctx *ctx = NULL;
    pe_sampler *smp = NULL;
    int32_t *toks = NULL;
    float *logits = NULL;
    cli_progress prog = {1, -1};
    pgd_seq *seq = NULL;
    pgd_budget *bud = NULL;
    char *piece = NULL;
    int show = isatty(2);
    /* The tiers first: a disk tier held by another process fails before the model loads. */
    if (cli_tiers_open(cmd, &tiers, pe_log_stderr, NULL)) goto out;
    cli_tiers_apply(&tiers, &cp);
    if (pe_model_load(model_path, show ? cli_load_progress : NULL, &prog, &m, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", cmd, err);
        goto out;
    }
    if (pe_ctx_create(m, &cp, &ctx, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", cmd, err);
        goto out;
    }
    const pe_ctx_params *ap = pe_ctx_params_get(ctx);
    size_t plen = strlen(prompt);
    int add_bos = pe_vocab_add_bos(pe_model_vocab(m));
    int64_t n_prompt = pe_tokenize(pe_model_vocab(m), prompt, plen, add_bos, 1, NULL, 0);
    if (n_prompt < 0) {
        fprintf(stderr, "%s: cannot tokenize the prompt\n", cmd);
        goto out;
    }
    /* Generation stops when the context is full whatever -n says: -n -1 means exactly
     * that, and a larger -n allocates no more than the context holds. */
    uint64_t n_gen_max =
        n_predict < 0 || (uint64_t)n_predict > ap->n_ctx ? ap->n_ctx : (uint64_t)n_predict;
    toks = malloc(((size_t)n_prompt + n_gen_max + 1) * sizeof *toks);
    logits = malloc((size_t)pe_model_hparams(m)->n_vocab * sizeof *logits);
    smp = pe_sampler_create(&sp, pe_model_hparams(m)->n_vocab);
    if (!toks || !logits || !smp) {
        fprintf(stderr, "%s: out of memory\n", cmd);
        goto out;
    }
    pe_tokenize(pe_model_vocab(m), prompt, plen, add_bos, 1, toks, (size_t)n_prompt);
    if (n_prompt == 0) {
        fprintf(stderr, "%s: the prompt is empty and the model adds no BOS token\n", cmd);
        goto out;
    }
    if ((uint64_t)n_prompt >= ap->n_ctx) {
        fprintf(stderr, "%s: the prompt has %lld tokens, the context only %u\n", cmd,
                (long long)n_prompt, ap->n_ctx);
        goto out;
    }
    if ((int)pgd_seq_create(pe_ctx_cache(ctx), NULL, 0, &seq) != PGD_OK) {
        fprintf(stderr, "%s: cannot create a sequence\n", cmd);
        goto out;
    }
    if (ap->budget.method != PGD_BUDGET_NONE) {
        int brc = pgd_budget_create(pe_ctx_cache(ctx), &ap->budget, &bud);
        if (brc != PGD_OK) {
            fprintf(stderr, "%s: --kv-budget: %s\n", cmd, pgd_strerror(brc));
            goto out;
        }
    }
    pe_detok dt;
    pe_detok_init(&dt, pe_model_vocab(m));
    /* A piece never exceeds the longest token plus a held partial UTF-8 sequence. */
    size_t piece_cap = pe_vocab_max_piece(pe_model_vocab(m)) + 16;
    piece = malloc(piece_cap);
    if (!piece) {
        fprintf(stderr, "%s: out of memory\n", cmd);
        goto out;
    }
    for (int64_t i = 0; i < n_prompt; i++) {
        pe_detok_push(&dt, toks[i], piece, piece_cap); /* state only: the prompt is echoed */
        pe_sampler_accept(smp, toks[i]);
    }
    if (display_prompt) {
        fputs(prompt, stdout);
        fflush(stdout);
    }

    double t0 = cli_now_s();
    /* With tiers: match all but the last token (its logits are needed), wait for the
     * promoted pages, and compute from the sequence's length (a failed fill cuts it). */
    int64_t n_cached = 0;
    pgd_match_info mi;
    memset(&mi, 0, sizeof mi);
    if (tiers.n) {
        int64_t mrc = pgd_seq_match(pe_ctx_cache(ctx), seq, toks, (size_t)n_prompt - 1);
        if (mrc < 0) {
            fprintf(stderr, "%s: prefix match failed: %s\n", cmd, pgd_strerror((int)mrc));
            goto out;
        }
        pgd_seq_wait(pe_ctx_cache(ctx), seq);
        n_cached = (int64_t)pgd_seq_length(pe_ctx_cache(ctx), seq);
        pgd_seq_match_info(pe_ctx_cache(ctx), seq, &mi);
    }
    for (int64_t i = n_cached; i < n_prompt; i += ap->n_batch) {
        uint32_t n = (uint32_t)(n_prompt - i < ap->n_batch ? n_prompt - i : ap->n_batch);
        int frc = pe_forward_budget(ctx, seq, bud, toks + i, n, (uint64_t)(n_prompt - i),
                                    i + n == n_prompt ? logits : NULL, 0);
        if (frc < 0) {
            fprintf(stderr, "\n%s: forward failed: %s\n", cmd, pgd_strerror(frc));
            goto out;
        }
    }
    double t1 = cli_now_s();
    uint64_t n_gen = 0;
    int64_t pos = n_prompt;
    while (n_gen < n_gen_max && (uint64_t)pos < ap->n_ctx) {
        int32_t tok = pe_sampler_sample(smp, logits);
        if (pe_vocab_is_eog(pe_model_vocab(m), tok)) break;
        pe_sampler_accept(smp, tok);
        size_t len = pe_detok_push(&dt, tok, piece, piece_cap);
        fwrite(piece, 1, len <= piece_cap ? len : 0, stdout);
        fflush(stdout);
        toks[pos] = tok;
        n_gen++;
        if (n_gen == n_gen_max || (uint64_t)pos + 1 >= ap->n_ctx) break;
        int frc = pe_forward_budget(ctx, seq, bud, &toks[pos], 1, 0, logits, 0);
        if (frc < 0) {
            fprintf(stderr, "\n%s: forward failed: %s\n", cmd, pgd_strerror(frc));
            goto out;
        }
        pos++;
    }
    size_t len = pe_detok_flush(&dt, piece, piece_cap);
    fwrite(piece, 1, len <= piece_cap ? len : 0, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    double t2 = cli_now_s();
    pgd_cache_stats st;
    pgd_cache_get_stats(pe_ctx_cache(ctx), &st);
    double tp = t1 - t0, tg = t2 - t1;
    char cached[256] = "";
    if (tiers.n) {
        /* " | cached: N tokens (pool N, ram N, disk N)": from pgd_seq_match_info. */
        uint64_t in_tiers = 0;
        for (uint32_t i = 0; i < mi.n_tiers; i++)
            in_tiers += mi.tier_tokens[i];
        uint64_t in_pool = (uint64_t)n_cached > in_tiers ? (uint64_t)n_cached - in_tiers : 0;
        int w = snprintf(cached, sizeof cached, " | cached: %lld tokens (pool %llu",
                         (long long)n_cached, (unsigned long long)in_pool);
        for (uint32_t i = 0; i < mi.n_tiers && i < tiers.n && w > 0 && w < (int)sizeof cached; i++)
            w += snprintf(cached + w, sizeof cached - (size_t)w, ", %s %llu",
                          pgd_tier_name(tiers.tiers[i]), (unsigned long long)mi.tier_tokens[i]);
        if (w > 0 && w < (int)sizeof cached) snprintf(cached + w, sizeof cached - (size_t)w, ")");
    }
    char window[160] = "";
    if (st.n_window_pages_total)
        /* " | window layers: N pages used of M, R released": their own group. */
        snprintf(window, sizeof window, " | window layers: %u pages used of %u, %llu released",
                 st.n_window_pages_used, st.n_window_pages_total,
                 (unsigned long long)st.n_window_released);
    char budget[256] = "";
    if (bud) {
        /* " | budget: streaming 64 tokens, 70 slots held, 336 tokens dropped, 21 pages
         * freed (N compactions)": what the budget kept the sequence to. */
        pgd_budget_stats bs;
        pgd_budget_get_stats(bud, &bs);
        int bstat = PGD_OK;
        uint64_t n_fail = pe_ctx_budget_failures(ctx, &bstat);
        int w = snprintf(budget, sizeof budget,
                         " | budget: %s %u tokens, %llu slots held, %llu tokens dropped, "
                         "%llu pages freed (%llu compactions)",
                         pgd_budget_method_name(ap->budget.method), ap->budget.budget,
                         (unsigned long long)pgd_seq_length(pe_ctx_cache(ctx), seq),
                         (unsigned long long)pgd_seq_n_dropped(pe_ctx_cache(ctx), seq),
                         (unsigned long long)bs.freed_pages, (unsigned long long)bs.compactions);
        if (n_fail && w > 0 && w < (int)sizeof budget)
            snprintf(budget + w, sizeof budget - (size_t)w, ", %llu failed: %s",
                     (unsigned long long)n_fail, pgd_strerror(bstat));
    }
    fprintf(stderr,
            "prompt: %lld tokens, %.2f s, %.1f t/s | generated: %llu tokens, %.2f s, %.1f t/s"
            " | KV pages used: %u of %u (%u tokens each, %s)%s%s%s\n",
            (long long)n_prompt, tp, tp > 0 ? n_prompt / tp : 0.0, (unsigned long long)n_gen, tg,
            tg > 0 ? n_gen / tg : 0.0, st.n_pages_used, st.n_pages_total, ap->page_tokens,
            pgd_kv_type_name(ap->kv_type), window, cached, budget);
    rc = CLI_EXIT_OK;
    if (tiers.n) {
        /* Commit what the generated tokens filled, then write everything back. */
        pgd_seq_destroy(pe_ctx_cache(ctx), seq);
        seq = NULL;
        int wrc = cli_cache_write_back(pe_ctx_cache(ctx));
        if (wrc != PGD_OK) {
            fprintf(stderr, "%s: writing the KV pages back to the tiers: %s\n", cmd,
                    pgd_strerror(wrc));
            rc = CLI_EXIT_FAIL;
        }
    }
out:
    pgd_budget_destroy(bud);
    if (seq) pgd_seq_destroy(pe_ctx_cache(ctx), seq);
    pe_sampler_destroy(smp);
    free(piece);
    free(logits);
    free(toks);
    pe_ctx_destroy(ctx);
    cli_tiers_close(&tiers);
    pe_model_destroy(m);
    free(owned_prompt);
    return rc;
}
