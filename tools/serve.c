/* SPDX-License-Identifier: MIT */
/*
 * serve.c - `pagoda serve`: loads a GGUF model, sizes the KV pool from --kv-memory,
 * creates the continuous-batching scheduler and runs the OpenAI-compatible HTTP server
 * (server/server.h) until SIGINT or SIGTERM.
 *
 * Output contract (tests and `pagoda bench` rely on it): once the server accepts
 * requests, exactly one line "pagoda serve: listening on http://HOST:PORT" goes to stdout
 * and is flushed (--port 0 binds an ephemeral port; the line names it). On the first
 * signal it prints "pagoda serve: shutting down" to stdout, refuses new requests with 503,
 * lets requests in flight finish for up to --shutdown-grace seconds (a second signal cuts
 * that short), cancels the rest and exits 0. Everything else goes to stderr.
 *
 * Tiers (--tier, --hash-key-file; tools/tier_spec.h): they are created before the model
 * loads (a disk directory another server holds is refused at once, exit 1), given to the
 * context, and closed after it is destroyed. At shutdown, once the server stopped and
 * before the context is destroyed, pgd_cache_flush lets the write-back queue drain into
 * the tiers and makes the disk tiers durable, so what was evicted survives the restart.
 *
 * The shutdown is bounded: after the grace period a watchdog thread gives the teardown
 * (cancel, close every connection, join every thread) HARD_STOP_S seconds; if it has not
 * finished by then, or another signal comes, the watchdog says which stage stalled and
 * ends the process with _exit(0).
 */
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "chat.h"
#include "cli.h"
#include "model.h"
#include "scheduler.h"
#include "server.h"
#include "tier_spec.h"

#define DEFAULT_KV_MEMORY (1ull << 30)
#define DEFAULT_CTX_CAP 8192
#define HARD_STOP_S 10
#define STR_(x) #x
#define STR(x) STR_(x)

static void usage(FILE *out)
{
    fputs("usage: pagoda serve -m MODEL.gguf [options]\n"
          "\n"
          "Serves a GGUF model over an OpenAI-compatible HTTP API with continuous batching\n"
          "and a shared prefix cache: POST /v1/completions, POST /v1/chat/completions,\n"
          "GET /v1/models, GET /health, GET /metrics (Prometheus), and the cache admin\n"
          "API: POST /v1/cache/pin, /unpin, /prefetch, /evict, GET /v1/cache/stats.\n"
          "\n"
          "  -m, --model FILE         GGUF model (llama, qwen2, qwen3, phi3,\n"
          "                           gemma2, gemma3)\n"
          "      --model-id NAME      the id /v1/models reports (default: the file name\n"
          "                           without .gguf)\n"
          "      --host ADDR          address to listen on (default 127.0.0.1)\n"
          "      --port N             TCP port (default 8080; 0: any free port, printed)\n"
          "      --api-key KEY        require 'Authorization: Bearer KEY' on /v1/ routes\n"
          "                           (default: $PAGODA_API_KEY if set, else no auth)\n"
          "  -c, --ctx N              max tokens of one request, prompt + output\n"
          "                           (default: the model's, at most 8192)\n"
          "      --kv-memory BYTES    KV pool size, e.g. 512M, 4G (default 1G, raised to\n"
          "                           one full context if that is more; at most the\n"
          "                           machine's memory)\n"
          "      --page-tokens N      tokens per KV page, a power of two (default 16)\n"
          "      --policy NAME        the pool's eviction policy: lru (default), s3fifo, arc,\n"
          "                           cost (what a hit saves per byte: recompute FLOPs of the\n"
          "                           block's depth) or priority (a request's priority and\n"
          "                           TTL; belady is pagoda replay's only: it needs the future)\n"
          "      --kv-type T          f32 | f16 | bf16 | q8_0 | q4_0 | kivi2 (default f16)\n"
          "      --kv-rotate          store K/V Hadamard-rotated (head_dim a power of 2)\n"
          "      --kv-residual N      staged codecs: least f16 staging ring (default 128)\n"
          "      --kv-select-pages N  decode attends to at most N pages per row (Quest);\n"
          "                           0: all (default)\n"
          "      --deterministic      batch-invariant products: a request's tokens do not\n"
          "                           depend on its batch or on preemption (slower decode)\n"
          "      --kv-budget TOKENS   default token budget of a request (pagoda.kv_budget)\n"
          "      --kv-budget-method NAME  streaming|h2o|tova|snapkv|pyramidkv|adakv (snapkv)\n"
          "      --kv-window-dense    sliding-window layers keep every page (the window only\n"
          "                           masks; needed for token budgets on such models)\n"
          "      --kv-window-tokens N the window layers' page pool in tokens (default: a\n"
          "                           window and a step per running request)\n"
          "      --max-running N      requests in the batch at once (default 16, max 256)\n"
          "      --max-queued N       waiting requests before 429 (default 64)\n"
          "  -b, --batch-size N       token budget of one step (default 512)\n"
          "      --chunk N            prefill tokens of one request per step (default: the\n"
          "                           whole budget)\n"
          "  -t, --threads N          compute threads, 1..1024 (default: all cores)\n"
          "      --no-prefix-cache    no KV sharing at all (for A/B measurements): every\n"
          "                           prompt is computed in full, and each request keeps\n"
          "                           its own pages, so identical prompts running at once\n"
          "                           use that many times the pages of one\n"
          "      --chat-template NAME chatml | llama3 | llama2 | gemma | phi3 | plain\n"
          "                           (aliases qwen, mistral; default: detected from the\n"
          "                           model's tokenizer.chat_template, else plain)\n"
          "      --max-body BYTES     larger request bodies get 413 (default 16M)\n"
          "      --parse-special-in-messages  chat message text that spells a control token\n"
          "                           becomes it (default: plain text, only the template's)\n"
          "      --shutdown-grace S   seconds requests in flight may finish after a signal\n"
          "                           (default 5); a second signal cuts it short\n"
          "      --idle-timeout S     close a connection idle this long, e.g. a keep-alive\n"
          "                           one between requests (default 60; 0: never); never\n"
          "                           while a request is generating\n"
          "      --max-connections N  open connections at most (default 4096); more are\n"
          "                           refused\n"
          "      --max-connections-per-ip N\n"
          "                           open connections from one address (default 1024;\n"
          "                           0: no limit)\n"
          "      --header-timeout S   a request's headers must arrive within S seconds of\n"
          "                           the connection opening (default 10; 0: no deadline)\n"
          "      --min-body-rate B    after --header-timeout, a body arriving slower than B\n"
          "                           bytes/s is cut (default 1024; 0: any rate)\n",
          out);
    fputs("      --pin-share F        pinned KV pages (pagoda.pin, /v1/cache/pin) may fill at\n"
          "                           most this share of the pool and of each tier, in\n"
          "                           (0, 1] (default 0.5); past it a pin gets 400\n"
          "      --tenant-quota SALT=SHARE\n"
          "                           reserve SHARE (0, 1] of the pool and of each tier for\n"
          "                           the tenant whose cache_salt is SALT: another tenant's\n"
          "                           flood never evicts it below that (repeatable; the\n"
          "                           shares sum to at most 1)\n"
          "      --hint-lead-ms N     warm next-use hints (pagoda.next_use_s) from the tiers\n"
          "                           N ms before they are due (default 2000; 0: never)\n",
          out);
    cli_tier_help(out);
    fputs("                          Responses report cached tokens by tier in\n"
          "                          usage.pagoda.cached_tokens_by_tier; /metrics has\n"
          "                          pagoda_tier_* by tier=\"ram\", \"disk\", \"redis\", ...\n"
          "  -h, --help\n",
          out);
}

/* The largest --max-body: a body over 4 GiB is no request for a context of at most 4M
 * tokens. */
#define MAX_BODY_CAP (1ull << 32)

/* Bytes of physical memory, or UINT64_MAX when the system does not say: --kv-memory beyond
 * it could never be backed, and asking for it only made the allocation run away. */
static uint64_t phys_memory_bytes(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0) return UINT64_MAX;
    return (uint64_t)pages * (uint64_t)page;
}

/* --tenant-quota SALT=SHARE (repeatable): SALT as requests give it in cache_salt. */
#define MAX_QUOTAS 64
typedef struct quota_list {
    const char *salt[MAX_QUOTAS]; /* argv text; the salt is up to the last '=' */
    size_t salt_len[MAX_QUOTAS];
    double share[MAX_QUOTAS];
    uint32_t n;
} quota_list;

static int add_quota(const char *cmd, const char *arg, quota_list *q)
{
    const char *eq = strrchr(arg, '=');
    char *end;
    if (!eq || eq == arg) {
        fprintf(stderr, "%s: --tenant-quota: '%s' is not SALT=SHARE\n", cmd, arg);
        return -1;
    }
    double f = strtod(eq + 1, &end);
    if (end == eq + 1 || *end || !(f > 0 && f <= 1)) {
        fprintf(stderr, "%s: --tenant-quota: the share of '%s' is not in (0, 1]\n", cmd, arg);
        return -1;
    }
    if (q->n == MAX_QUOTAS) {
        fprintf(stderr, "%s: --tenant-quota: at most %d tenants\n", cmd, MAX_QUOTAS);
        return -1;
    }
    q->salt[q->n] = arg;
    q->salt_len[q->n] = (size_t)(eq - arg);
    q->share[q->n++] = f;
    return 0;
}

/* Reserves each quota's share of the pool and of every tier (pgd_cache_set_tenant). */
static int apply_quotas(const char *cmd, const quota_list *q, pgd_cache *c)
{
    for (uint32_t i = 0; i < q->n; i++) {
        pgd_tenant_params tp;
        memset(&tp, 0, sizeof tp);
        tp.pool_share = q->share[i];
        for (uint32_t t = 0; t < PGD_MAX_TIERS; t++)
            tp.tier_share[t] = q->share[i];
        int rc = pgd_cache_set_tenant(c, q->salt[i], q->salt_len[i], &tp);
        if (rc < 0) {
            fprintf(stderr, "%s: --tenant-quota %s: %s%s\n", cmd, q->salt[i], pgd_strerror(rc),
                    rc == PGD_EINVAL ? " (the shares must sum to at most 1)" : "");
            return -1;
        }
    }
    return 0;
}

/* The shutdown watchdog (see the file comment). */
typedef struct watchdog {
    sigset_t sigs;
    int done;          /* atomic: the teardown finished */
    const char *stage; /* atomic: what serve.c itself is doing after the server stopped
                          (NULL: ask the server, ps_server_shutdown_stage) */
} watchdog;

static void say(const char *s)
{
    ssize_t r = write(2, s, strlen(s)); /* async-signal-safe, no stdio lock */
    (void)r;
}

static void *watchdog_main(void *arg)
{
    watchdog *w = arg;
    struct timespec ts = {HARD_STOP_S, 0};
    int sig = sigtimedwait(&w->sigs, NULL, &ts);
    if (__atomic_load_n(&w->done, __ATOMIC_ACQUIRE)) return NULL;
    say(sig > 0 ? "pagoda serve: second signal during shutdown"
                : "pagoda serve: shutdown did not finish in " STR(HARD_STOP_S) " s");
    say(" (stalled while: ");
    const char *stage = __atomic_load_n(&w->stage, __ATOMIC_ACQUIRE);
    say(stage ? stage : ps_server_shutdown_stage());
    say("); exiting now\n");
    _exit(0);
}

/* While the model loads (and the pool, scheduler and server are set up) nothing needs a
 * graceful shutdown: a signal ends the process at once. Signals stay blocked in every
 * thread (the main thread's sigwait takes them once serving), so this thread waits for
 * them until done is set; one it took after that is sent again, for the sigwait. */
typedef struct load_watch {
    sigset_t sigs;
    int done; /* atomic */
} load_watch;

static void *load_watch_main(void *arg)
{
    load_watch *w = arg;
    while (!__atomic_load_n(&w->done, __ATOMIC_ACQUIRE)) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        int sig = sigtimedwait(&w->sigs, NULL, &ts);
        if (sig <= 0) continue;
        if (__atomic_load_n(&w->done, __ATOMIC_ACQUIRE)) {
            kill(getpid(), sig);
            break;
        }
        say(sig == SIGINT ? "pagoda serve: SIGINT while loading; exiting\n"
                          : "pagoda serve: SIGTERM while loading; exiting\n");
        _exit(128 + sig);
    }
    return NULL;
}

/* Each connection holds a descriptor: raise the soft limit toward the hard one so that
 * --max-connections can be reached (a lower limit only makes accept fail sooner). */
static void raise_fd_limit(uint32_t max_connections)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl)) return;
    rlim_t want = (rlim_t)max_connections + 256;
    if (rl.rlim_max != RLIM_INFINITY && want > rl.rlim_max) want = rl.rlim_max;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
        rl.rlim_cur = want;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

static void default_model_id(const char *path, char *out, size_t n)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    snprintf(out, n, "%s", b);
    size_t l = strlen(out);
    if (l > 5 && strcmp(out + l - 5, ".gguf") == 0) out[l - 5] = '\0';
}

int cmd_serve(int argc, char **argv)
{
    enum {
        O_HOST = 1000,
        O_PORT,
        O_KEY,
        O_KVMEM,
        O_MAXRUN,
        O_MAXQ,
        O_CHUNK,
        O_NOPC,
        O_CHAT,
        O_BODY,
        O_GRACE,
        O_ID,
        O_IDLE,
        O_PSIM,
        O_MAXCONN,
        O_MAXIP,
        O_HDRTO,
        O_BODYRATE,
        O_PINSHARE,
        O_QUOTA,
        O_HINTLEAD
    };
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"model-id", required_argument, 0, O_ID},
                                         {"host", required_argument, 0, O_HOST},
                                         {"port", required_argument, 0, O_PORT},
                                         {"api-key", required_argument, 0, O_KEY},
                                         {"ctx", required_argument, 0, 'c'},
                                         {"ctx-size", required_argument, 0, 'c'},
                                         {"kv-memory", required_argument, 0, O_KVMEM},
                                         {"max-running", required_argument, 0, O_MAXRUN},
                                         {"max-queued", required_argument, 0, O_MAXQ},
                                         {"batch-size", required_argument, 0, 'b'},
                                         {"chunk", required_argument, 0, O_CHUNK},
                                         {"threads", required_argument, 0, 't'},
                                         {"no-prefix-cache", no_argument, 0, O_NOPC},
                                         {"chat-template", required_argument, 0, O_CHAT},
                                         {"max-body", required_argument, 0, O_BODY},
                                         {"shutdown-grace", required_argument, 0, O_GRACE},
                                         {"idle-timeout", required_argument, 0, O_IDLE},
                                         {"parse-special-in-messages", no_argument, 0, O_PSIM},
                                         {"max-connections", required_argument, 0, O_MAXCONN},
                                         {"max-connections-per-ip", required_argument, 0, O_MAXIP},
                                         {"header-timeout", required_argument, 0, O_HDRTO},
                                         {"min-body-rate", required_argument, 0, O_BODYRATE},
                                         {"pin-share", required_argument, 0, O_PINSHARE},
                                         {"tenant-quota", required_argument, 0, O_QUOTA},
                                         {"hint-lead-ms", required_argument, 0, O_HINTLEAD},
                                         CLI_KV_LONG_OPTIONS,
                                         CLI_TIER_LONG_OPTIONS,
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *cmd = "pagoda serve";
    const char *model_path = NULL, *model_id = NULL;
    uint64_t v, kv_memory = 0, grace_s = 5;
    int have_ctx = 0;
    /* log: pe_log_stderr, so libpagoda's warnings show as "libpagoda: ..." lines. */
    pe_ctx_params cp = pe_ctx_default_params();
    pe_sched_params sp = pe_sched_default_params();
    ps_server_params pp = ps_server_default_params();
    static cli_tiers tiers; /* large (paths); one serve per process */
    memset(&tiers, 0, sizeof tiers);
    static quota_list quotas; /* --tenant-quota */
    memset(&quotas, 0, sizeof quotas);
    const char *env_key = getenv("PAGODA_API_KEY");
    if (env_key && *env_key) pp.api_key = env_key;
    int c;
    optind = 1;
    for (;;) {
        c = getopt_long(argc, argv, "m:c:b:t:h", opts, NULL);
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
        case O_ID:
            if (!*optarg) {
                fprintf(stderr, "%s: --model-id is empty\n", cmd);
                return CLI_EXIT_USAGE;
            }
            model_id = optarg;
            break;
        case O_HOST:
            pp.host = optarg;
            break;
        case O_PORT:
            if (cli_parse_u64(cmd, "--port", optarg, 0, 65535, &v)) return CLI_EXIT_USAGE;
            pp.port = (uint16_t)v;
            break;
        case O_KEY:
            pp.api_key = *optarg ? optarg : NULL;
            break;
        case 'c':
            if (cli_parse_u64(cmd, "--ctx", optarg, 2, 1u << 22, &v)) return CLI_EXIT_USAGE;
            cp.n_ctx = (uint32_t)v;
            have_ctx = 1;
            break;
        case O_KVMEM:
            if (cli_parse_size(cmd, "--kv-memory", optarg, 1, UINT64_MAX, &kv_memory))
                return CLI_EXIT_USAGE;
            if (kv_memory > phys_memory_bytes()) {
                fprintf(stderr,
                        "%s: --kv-memory: %s is more than this machine's memory (%llu "
                        "bytes)\n",
                        cmd, optarg, (unsigned long long)phys_memory_bytes());
                return CLI_EXIT_USAGE;
            }
            break;
        case O_MAXRUN:
            if (cli_parse_u64(cmd, "--max-running", optarg, 1, PE_MAX_BATCH_SEQS, &v))
                return CLI_EXIT_USAGE;
            sp.max_running = (uint32_t)v;
            break;
        case O_MAXQ:
            if (cli_parse_u64(cmd, "--max-queued", optarg, 1, 1u << 20, &v)) return CLI_EXIT_USAGE;
            sp.max_queued = (uint32_t)v;
            break;
        case 'b':
            if (cli_parse_u64(cmd, "--batch-size", optarg, 1, 1u << 16, &v)) return CLI_EXIT_USAGE;
            cp.n_batch = (uint32_t)v;
            break;
        case O_CHUNK:
            if (cli_parse_u64(cmd, "--chunk", optarg, 1, 1u << 16, &v)) return CLI_EXIT_USAGE;
            sp.chunk = (uint32_t)v;
            break;
        case 't':
            if (cli_parse_u64(cmd, "--threads", optarg, 1, CLI_MAX_THREADS, &v))
                return CLI_EXIT_USAGE;
            cp.n_threads = (uint32_t)v;
            break;
        case O_NOPC:
            sp.no_prefix_cache = 1;
            break;
        case O_CHAT: {
            pe_chat_family f;
            if (pe_chat_family_parse(optarg, &f)) {
                fprintf(stderr,
                        "%s: --chat-template: '%s' is not one of chatml, llama3, llama2, gemma, "
                        "phi3, plain (or qwen, mistral)\n",
                        cmd, optarg);
                return CLI_EXIT_USAGE;
            }
            pp.chat_family = (int)f;
            break;
        }
        case O_BODY:
            if (cli_parse_size(cmd, "--max-body", optarg, 1, MAX_BODY_CAP, &pp.max_body_bytes))
                return CLI_EXIT_USAGE;
            break;
        case O_GRACE:
            if (cli_parse_u64(cmd, "--shutdown-grace", optarg, 0, 3600, &grace_s))
                return CLI_EXIT_USAGE;
            break;
        case O_IDLE:
            if (cli_parse_u64(cmd, "--idle-timeout", optarg, 0, 86400, &v)) return CLI_EXIT_USAGE;
            pp.idle_timeout_s = (uint32_t)v;
            break;
        case O_PSIM:
            pp.parse_special_in_messages = 1;
            break;
        case O_MAXCONN:
            if (cli_parse_u64(cmd, "--max-connections", optarg, 1, 1u << 20, &v))
                return CLI_EXIT_USAGE;
            pp.max_connections = (uint32_t)v;
            break;
        case O_MAXIP:
            if (cli_parse_u64(cmd, "--max-connections-per-ip", optarg, 0, 1u << 20, &v))
                return CLI_EXIT_USAGE;
            pp.max_connections_per_ip = (uint32_t)v;
            break;
        case O_HDRTO:
            if (cli_parse_u64(cmd, "--header-timeout", optarg, 0, 86400, &v)) return CLI_EXIT_USAGE;
            pp.header_timeout_s = (uint32_t)v;
            break;
        case O_BODYRATE:
            if (cli_parse_u64(cmd, "--min-body-rate", optarg, 0, 1u << 30, &v))
                return CLI_EXIT_USAGE;
            pp.min_body_rate = (uint32_t)v;
            break;
        case O_PINSHARE: {
            char *end;
            double f = strtod(optarg, &end);
            if (end == optarg || *end || !(f > 0 && f <= 1)) {
                fprintf(stderr, "%s: --pin-share: '%s' is not a share in (0, 1]\n", cmd, optarg);
                return CLI_EXIT_USAGE;
            }
            cp.pin_share = f;
            break;
        }
        case O_QUOTA:
            if (add_quota(cmd, optarg, &quotas)) return CLI_EXIT_USAGE;
            break;
        case O_HINTLEAD:
            if (cli_parse_u64(cmd, "--hint-lead-ms", optarg, 0, 86400000, &v))
                return CLI_EXIT_USAGE;
            pp.hint_lead_ms = (uint32_t)v;
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

    /* Signals are taken by sigwait in this thread only: block them before any thread
     * starts, so every thread inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    raise_fd_limit(pp.max_connections);
    static load_watch lw;
    lw.sigs = sigs;
    pthread_t lwt;
    int lw_started = pthread_create(&lwt, NULL, load_watch_main, &lw) == 0;

    int rc = CLI_EXIT_FAIL;
    cli_progress prog = {10, -1};
    char err[512], id_buf[256];
    pe_model *m = NULL;
    pe_ctx *ctx = NULL;
    pe_sched *sched = NULL;
    ps_server *srv = NULL;
    /* The tiers first: a directory in use or unreadable is an error before the load. */
    if (cli_tiers_open(cmd, &tiers, cp.log, cp.log_ud)) goto out;
    cli_tiers_apply(&tiers, &cp);
    if (pe_model_load(model_path, isatty(2) ? cli_load_progress : NULL, &prog, &m, err,
                      sizeof err)) {
        fprintf(stderr, "%s: %s\n", cmd, err);
        goto out;
    }
    if (!have_ctx)
        cp.n_ctx = pe_model_hparams(m)->n_ctx_train < DEFAULT_CTX_CAP
                       ? pe_model_hparams(m)->n_ctx_train
                       : DEFAULT_CTX_CAP;
    if (!cp.page_tokens) cp.page_tokens = PGD_DEFAULT_PAGE_TOKENS;
    double bpt =
        pgd_kv_bytes_per_token(cp.kv_type, cp.page_tokens, pe_model_hparams(m)->n_layer,
                               pe_model_hparams(m)->n_head_kv, pe_model_hparams(m)->head_dim);
    if (bpt <= 0) {
        fprintf(stderr,
                "%s: --kv-type %s cannot store this model's heads (head_dim %u) in "
                "pages of %u tokens\n",
                cmd, pgd_kv_type_name(cp.kv_type), pe_model_hparams(m)->head_dim, cp.page_tokens);
        goto out;
    }
    uint64_t kv_tokens;
    if (kv_memory) {
        kv_tokens = (uint64_t)((double)kv_memory / bpt);
        if (kv_tokens < cp.n_ctx) {
            fprintf(stderr,
                    "%s: --kv-memory %llu bytes holds %llu tokens (%.0f bytes each), less than "
                    "one full context (--ctx %u); raise --kv-memory or lower --ctx\n",
                    cmd, (unsigned long long)kv_memory, (unsigned long long)kv_tokens, bpt,
                    cp.n_ctx);
            rc = CLI_EXIT_USAGE;
            goto out;
        }
    } else {
        kv_tokens = (uint64_t)((double)DEFAULT_KV_MEMORY / bpt);
        if (kv_tokens < cp.n_ctx) kv_tokens = cp.n_ctx;
    }
    /* Sliding-window layers in a pool of their own (a window and a step per running
     * request): the memory they no longer hold goes to the global layers' pool. */
    cp.n_seq_max = sp.max_running;
    cp.kv_tokens = kv_tokens;
    uint32_t win = 0, n_win = 0;
    uint64_t win_tokens = pe_ctx_window_plan(m, &cp, &win, &n_win);
    if (win_tokens) {
        const pe_hparams *hp = pe_model_hparams(m);
        double bpt_w =
            pgd_kv_bytes_per_token(cp.kv_type, cp.page_tokens, n_win, hp->n_head_kv, hp->head_dim);
        double bpt_g = pgd_kv_bytes_per_token(cp.kv_type, cp.page_tokens, hp->n_layer - n_win,
                                              hp->n_head_kv, hp->head_dim);
        double mem = (double)(kv_memory ? kv_memory : DEFAULT_KV_MEMORY);
        uint64_t g = mem > win_tokens * bpt_w ? (uint64_t)((mem - win_tokens * bpt_w) / bpt_g) : 0;
        if (g > kv_tokens) kv_tokens = g;
        cp.kv_window_tokens = win_tokens;
    }
    if (kv_tokens > (1ull << 31) * cp.page_tokens / 2)
        kv_tokens = (1ull << 31) * cp.page_tokens / 2;
    cp.kv_tokens = kv_tokens;
    /* Requests may ask for a token budget (pagoda.kv_budget) whatever the default. */
    cp.budget_scores = 1;
    if (pe_ctx_create(m, &cp, &ctx, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", cmd, err);
        goto out;
    }
    if (apply_quotas(cmd, &quotas, pe_ctx_cache(ctx))) {
        rc = CLI_EXIT_USAGE;
        goto out;
    }
    sp.model = m;
    int src = pe_sched_create(ctx, &sp, &sched);
    if (src) {
        fprintf(stderr, "%s: cannot create the scheduler: %s\n", cmd, pgd_strerror(src));
        goto out;
    }
    if (!model_id) {
        default_model_id(model_path, id_buf, sizeof id_buf);
        model_id = id_buf;
    }
    pp.model_id = model_id;
    pp.prefix_cache = !sp.no_prefix_cache;
    if (ps_server_start(&pp, m, ctx, sched, &srv, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", cmd, err);
        goto out;
    }
    __atomic_store_n(&lw.done, 1, __ATOMIC_RELEASE);
    if (lw_started) pthread_join(lwt, NULL);
    lw_started = 0;
    const pe_ctx_params *ap = pe_ctx_params_get(ctx);
    pgd_cache_stats cs;
    pgd_cache_get_stats(pe_ctx_cache(ctx), &cs);
    fprintf(stderr,
            "%s: model %s (%s), context %u tokens, KV pool %u pages x %u tokens (%s, %.0f bytes "
            "per token), max running %u, queue %u, prefix cache %s, chat template %s%s\n",
            cmd, model_id, model_path, ap->n_ctx, cs.n_pages_total, ap->page_tokens,
            pgd_kv_type_name(ap->kv_type), bpt, sp.max_running, sp.max_queued,
            sp.no_prefix_cache ? "off" : "on", pe_chat_family_name(ps_server_chat_family(srv)),
            pp.api_key ? ", API key required" : "");
    if (cs.n_window_pages_total)
        fprintf(stderr,
                "%s: sliding-window layers (window %u tokens): a pool of their own, %u pages; "
                "the KV pool above holds the global layers\n",
                cmd, pgd_cache_window(pe_ctx_cache(ctx)), cs.n_window_pages_total);
    for (uint32_t i = 0; i < tiers.n; i++)
        fprintf(stderr, "%s: tier %u below the pool: %s\n", cmd, i + 1, tiers.specs[i].text);
    if (tiers.key_len)
        fprintf(stderr, "%s: block hashes keyed by %s\n", cmd,
                tiers.key_file ? "--hash-key-file" : "the first disk tier's stable key");
    int v6 = strchr(pp.host, ':') != NULL;
    printf("pagoda serve: listening on http://%s%s%s:%u\n", v6 ? "[" : "", pp.host, v6 ? "]" : "",
           (unsigned)ps_server_port(srv));
    fflush(stdout);

    int sig = 0;
    sigwait(&sigs, &sig);
    ps_server_begin_shutdown(srv);
    printf("pagoda serve: shutting down\n");
    fflush(stdout);
    fprintf(stderr, "%s: %s: finishing requests in flight (up to %llu s)\n", cmd,
            sig == SIGINT ? "SIGINT" : "SIGTERM", (unsigned long long)grace_s);
    double t_end = cli_now_s() + (double)grace_s;
    const struct timespec zero = {0, 0};
    while (!ps_server_wait_idle(srv, 0.1)) {
        if (cli_now_s() >= t_end || sigtimedwait(&sigs, NULL, &zero) > 0) break;
    }
    rc = CLI_EXIT_OK;
    static watchdog wd;
    wd.sigs = sigs;
    pthread_t wt;
    if (pthread_create(&wt, NULL, watchdog_main, &wd) == 0) pthread_detach(wt);
    ps_server_destroy(srv);
    srv = NULL;
    if (tiers.n) {
        /* Nothing steps any more: let the write-back queue drain into the tiers and make
         * them durable before the context (and its movers) go. */
        __atomic_store_n(&wd.stage, "flushing the tiers (write-back)", __ATOMIC_RELEASE);
        int frc = pgd_cache_flush(pe_ctx_cache(ctx));
        if (frc != PGD_OK)
            fprintf(stderr,
                    "%s: flushing the tiers failed: %s (records already written stay "
                    "valid)\n",
                    cmd, pgd_strerror(frc));
    }
    __atomic_store_n(&wd.done, 1, __ATOMIC_RELEASE);
out:
    __atomic_store_n(&lw.done, 1, __ATOMIC_RELEASE);
    if (lw_started) pthread_join(lwt, NULL);
    ps_server_destroy(srv);
    pe_sched_destroy(sched);
    pe_ctx_destroy(ctx);
    cli_tiers_close(&tiers); /* after the context: it borrowed them */
    pe_model_destroy(m);
    return rc;
}
