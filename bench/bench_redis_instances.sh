#!/usr/bin/env bash
# bench_redis_instances.sh - two `pagoda serve` instances sharing one Redis against two
# without it, on a shared-prefix workload (issue 12, "Benchmarks").
#
# It starts a redis-server (127.0.0.1, an ephemeral port, --save "" --appendonly no, in a
# temp dir), two `pagoda serve` with `--tier redis://127.0.0.1:PORT --hash-key-file KEY`
# (one key file, so both compute the same block hashes and MACs), and drives both at once
# with two `pagoda bench --url` processes (one per URL, the same --seed: both see the same
# system prompts, in the same order, offset by --stagger seconds). Then it stops them and
# does the same with two instances without the tier. It prints, per setup, the aggregate
# requests/s (requests of both / the time from the first start to the last end), output
# tokens/s, TTFT p50 and p90 (the mean of the two processes' percentiles), the prompt
# tokens the servers computed, and the ratio of the two setups. Everything it started is stopped on every
# exit path (SIGTERM, then SIGKILL after 10 s); each wait is bounded.
#
# Usage: bench/bench_redis_instances.sh [options] [-- more `pagoda serve` flags]
#   --model FILE        the model (default stories260K.gguf from $PGD_MODELS_DIR or
#                       ../shared/models; the synthetic 1b one works too)
#   --pagoda BIN        the CLI (default $PGD_BUILD_DIR/pagoda or build/pagoda)
#   --groups G --prompts P --system-tokens S --question-tokens Q --output-tokens O
#   --concurrency C --seed N     the workload, passed to both `pagoda bench` (defaults
#                       8, 8, 384, 32, 16, 4, 1: a request fits stories260K's 512
#                       positions)
#   --stagger SECONDS   start the second `pagoda bench` this much later (default 0)
#   --tier-opts STR     appended to the redis URL (e.g. "?deadline_ms=50")
#   --kv-memory SIZE    both servers' KV pool (default: serve's)
#   --ctx N             both servers' --ctx (default 512: stories260K's positions)
#   -t N                threads of each server (default 1: two servers on two cores)
#   --timeout SECONDS   bound on a server's start and on each bench run (default 600)
#   --json              print one JSON object instead of the table
# Figures on the 2-core development machine (one run each, other builds running): the
# synthetic 1b (--ctx 2048 --groups 4 --prompts 4 --system-tokens 1024 --output-tokens 8
# --concurrency 2): at once, 0.89x the requests/s of two without Redis and 0.99x the
# prompt tokens computed (both compute each system prompt at the same moment); with
# --stagger 20, 1.26x the requests/s and 0.76x the tokens computed. stories260K (the
# defaults, --groups 16): its compute is so cheap that requests/s swing 0.6-1.4x between
# runs; with --stagger 1 the servers compute 0.60x the prompt tokens.
# Needs redis-server, redis-cli and jq. Exit status: 0, 1 (something failed), 2 (usage),
# 77 (redis-server, redis-cli or jq missing).
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${PGD_BUILD_DIR:-build}/pagoda
model=""
groups=8 prompts=8 system=384 question=32 output=16 conc=4 seed=1
stagger=0 tier_opts="" kv_memory="" ctx=512 threads=1 timeout=600 json=0
serve_extra=()

die() {
    echo "bench_redis_instances: $*" >&2
    exit 1
}

while [ $# -gt 0 ]; do
    case $1 in
    --model) model=$2; shift 2 ;;
    --pagoda) BIN=$2; shift 2 ;;
    --groups) groups=$2; shift 2 ;;
    --prompts) prompts=$2; shift 2 ;;
    --system-tokens) system=$2; shift 2 ;;
    --question-tokens) question=$2; shift 2 ;;
    --output-tokens) output=$2; shift 2 ;;
    --concurrency) conc=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --stagger) stagger=$2; shift 2 ;;
    --tier-opts) tier_opts=$2; shift 2 ;;
    --kv-memory) kv_memory=$2; shift 2 ;;
    --ctx) ctx=$2; shift 2 ;;
    -t) threads=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --json) json=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; serve_extra=("$@"); break ;;
    *) echo "bench_redis_instances: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

for tool in redis-server redis-cli jq; do
    if ! command -v $tool >/dev/null 2>&1; then
        echo "bench_redis_instances: $tool not installed, skipped" >&2
        exit 77
    fi
done
[ -x "$BIN" ] || die "$BIN not found: build the CLI (cmake --build build --target pagoda_cli)"
if [ -z "$model" ]; then
    for d in "${PGD_MODELS_DIR:-}" ../shared/models; do
        if [ -n "$d" ] && [ -f "$d/stories260K.gguf" ]; then
            model=$d/stories260K.gguf
            break
        fi
    done
fi
if [ -z "$model" ] || [ ! -f "$model" ]; then
    die "no model: give --model FILE"
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench_redis_instances.XXXXXX")
pids=()
url_a="" url_b="" pid_a="" pid_b=""

# Stops one process: SIGTERM, then SIGKILL after 10 s.
stop_pid() {
    local pid=$1
    kill -TERM "$pid" 2>/dev/null || return 0
    for _ in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

cleanup() {
    local pid
    for pid in "${pids[@]}"; do
        stop_pid "$pid"
    done
    pids=()
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# ---- redis-server ----
redis_port=""
for _ in 1 2 3 4 5; do
    port=$((20000 + RANDOM % 40000))
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" \
        --protected-mode no >"$tmp/redis.log" 2>&1 &
    rpid=$!
    for _ in $(seq 100); do # 5 s
        if [ "$(redis-cli -p "$port" ping 2>/dev/null)" = PONG ]; then
            redis_port=$port
            break
        fi
        kill -0 "$rpid" 2>/dev/null || break # the port was taken: another one
        sleep 0.05
    done
    if [ -n "$redis_port" ]; then
        pids+=("$rpid")
        break
    fi
    stop_pid "$rpid"
done
[ -n "$redis_port" ] || die "redis-server did not start (see $tmp/redis.log)"
head -c 32 /dev/urandom >"$tmp/key"

# ---- servers ----
# start_server NAME [serve flags...]: starts `pagoda serve` on port 0, waits for its
# "listening on" line; sets url_NAME.
start_server() {
    local name=$1 log=$tmp/$1.log pid url=""
    shift
    local args=(serve -m "$model" --host 127.0.0.1 --port 0 -t "$threads" --ctx "$ctx")
    [ -n "$kv_memory" ] && args+=(--kv-memory "$kv_memory")
    "$BIN" "${args[@]}" "$@" "${serve_extra[@]}" >"$log" 2>&1 &
    pid=$!
    pids+=("$pid")
    for _ in $(seq $((timeout * 10))); do
        url=$(sed -n 's/^pagoda serve: listening on \(http:[^ ]*\)$/\1/p' "$log" | head -1)
        [ -n "$url" ] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if [ -z "$url" ]; then
        tail -5 "$log" >&2
        die "pagoda serve ($name) did not start"
    fi
    printf -v "url_$name" '%s' "$url"
    printf -v "pid_$name" '%s' "$pid"
}

stop_servers() {
    local keep=() pid
    for pid in "${pids[@]}"; do
        if [ "$pid" = "$pid_a" ] || [ "$pid" = "$pid_b" ]; then
            stop_pid "$pid"
        else
            keep+=("$pid")
        fi
    done
    pids=("${keep[@]}")
}

# run_pair LABEL: both `pagoda bench --url` at once; their JSON in $tmp/LABEL.{a,b}.json.
run_pair() {
    local label=$1 pa pb rc=0
    local wl=(--groups "$groups" --prompts "$prompts" --system-tokens "$system"
        --question-tokens "$question" --output-tokens "$output" --concurrency "$conc"
        --seed "$seed" --timeout "$timeout" --json)
    timeout "$timeout" "$BIN" bench --url "$url_a" "${wl[@]}" >"$tmp/$label.a.json" \
        2>"$tmp/$label.a.err" &
    pa=$!
    sleep "$stagger"
    timeout "$timeout" "$BIN" bench --url "$url_b" "${wl[@]}" >"$tmp/$label.b.json" \
        2>"$tmp/$label.b.err" &
    pb=$!
    wait "$pa" || rc=1
    wait "$pb" || rc=1
    if [ $rc -ne 0 ]; then
        cat "$tmp/$label.a.err" "$tmp/$label.b.err" >&2
        die "pagoda bench failed ($label)"
    fi
}

# The setup's figures as one JSON object, from both runs.
summarize() {
    jq -s --arg setup "$1" --argjson stagger "$stagger" '
      [.[] | .runs[0]] as $r |
      ([$r[0].duration_s, $stagger + $r[1].duration_s] | max) as $d |
      {setup: $setup,
       requests: ($r | map(.ok) | add), failed: ($r | map(.failed) | add),
       duration_s: $d,
       requests_per_s: (($r | map(.ok) | add) / $d),
       output_tps: (($r | map(.completion_tokens) | add) / $d),
       ttft_p50_ms: ($r | map(.ttft_ms.p50) | add / length),
       ttft_p90_ms: ($r | map(.ttft_ms.p90) | add / length),
       cached_tokens: ($r | map(.cached_tokens) | add),
       prompt_tokens: ($r | map(.prompt_tokens) | add),
       prompt_tokens_computed: ($r | map(.prompt_tokens_computed // 0) | add)}' \
        "$tmp/$1.a.json" "$tmp/$1.b.json"
}

t0=$(date +%s.%N)
start_server a --tier "redis://127.0.0.1:$redis_port$tier_opts" --hash-key-file "$tmp/key"
start_server b --tier "redis://127.0.0.1:$redis_port$tier_opts" --hash-key-file "$tmp/key"
run_pair shared
stop_servers
redis_keys=$(redis-cli -p "$redis_port" dbsize)
start_server a
start_server b
run_pair alone
stop_servers
t1=$(date +%s.%N)

shared=$(summarize shared)
alone=$(summarize alone)
result=$(jq -n --argjson s "$shared" --argjson a "$alone" --arg model "$model" \
    --argjson keys "$redis_keys" --argjson secs "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')" '
    {model: $model, redis_records: $keys, seconds: $secs, shared: $s, alone: $a,
     ratios: {requests_per_s: ($s.requests_per_s / $a.requests_per_s),
              output_tps: ($s.output_tps / $a.output_tps),
              ttft_p50: ($s.ttft_p50_ms / $a.ttft_p50_ms),
              ttft_p90: ($s.ttft_p90_ms / $a.ttft_p90_ms),
              prompt_tokens_computed:
                (if $a.prompt_tokens_computed > 0
                 then $s.prompt_tokens_computed / $a.prompt_tokens_computed else null end)}}')
if [ $json -eq 1 ]; then
    echo "$result"
else
    echo "$result" | jq -r --arg wl "$groups groups x $prompts prompts, system $system + question $question tokens, output $output, concurrency $conc per instance, seed $seed, stagger ${stagger}s" '
      def pad(n): if n > 0 then " " * n else "" end;
      def f(x; d): if x == null then "-" else (x * pow(10; d) | round / pow(10; d) | tostring) end;
      "two instances, \(.model): \($wl)",
      "Redis held \(.redis_records) keys after the shared run; \(f(.seconds; 1)) s in all",
      "",
      (["setup", "with Redis", "without Redis", "with/without"],
       ["requests ok / failed", "\(.shared.requests) / \(.shared.failed)", "\(.alone.requests) / \(.alone.failed)", ""],
       ["requests/s (aggregate)", f(.shared.requests_per_s; 2), f(.alone.requests_per_s; 2), f(.ratios.requests_per_s; 3)],
       ["output tok/s (aggregate)", f(.shared.output_tps; 1), f(.alone.output_tps; 1), f(.ratios.output_tps; 3)],
       ["TTFT p50 ms (mean of 2)", f(.shared.ttft_p50_ms; 2), f(.alone.ttft_p50_ms; 2), f(.ratios.ttft_p50; 3)],
       ["TTFT p90 ms (mean of 2)", f(.shared.ttft_p90_ms; 2), f(.alone.ttft_p90_ms; 2), f(.ratios.ttft_p90; 3)],
       ["cached prompt tokens", f(.shared.cached_tokens; 0), f(.alone.cached_tokens; 0), ""],
       ["prompt tokens computed", f(.shared.prompt_tokens_computed; 0), f(.alone.prompt_tokens_computed; 0), f(.ratios.prompt_tokens_computed; 3)]
       | "\(.[0])\(pad(26 - (.[0] | length))) \(pad(14 - (.[1] | length)))\(.[1]) \(pad(14 - (.[2] | length)))\(.[2]) \(pad(12 - (.[3] | length)))\(.[3])")'
fi
