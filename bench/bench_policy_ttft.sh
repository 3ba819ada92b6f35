#!/usr/bin/env bash
# bench_policy_ttft.sh - TTFT of `pagoda serve` under each eviction policy at equal memory,
# on a generated multi-tenant, multi-turn workload (issue 13, "Benchmarks": a server run
# where the cost-aware or S3-FIFO policy improves TTFT p90 against LRU).
#
# It writes a trace with `pagoda gen-trace` (multi-turn conversations on shared system
# prompts, one-offs; its distinct blocks several times the pool), a model with `pagoda
# synth-model --shape tiny --ctx 2048` (or takes --model), then for each policy runs
#   pagoda bench --trace TRACE --block-tokens B --tenants K --output-tokens O -m MODEL
#                --no-compare --json -- -t T --ctx C --kv-memory M --policy P
# (the same M for every policy: equal memory; M = --kv-tokens x the model's KV bytes per
# token), the requests one at a time, so a TTFT is the prefill of the tokens the cache did
# not hold, without queueing. It prints, per policy, TTFT p50/p90/p99, the share of prompt
# tokens served from the cache, the prompt tokens computed, and each figure's ratio to
# LRU's in the same invocation. With --reps N each policy runs N times, in turn (lru,
# s3fifo, ..., lru, s3fifo, ...), and the median of each figure is shown: the machine's
# other load moves single runs by up to 2x. Everything it started is gone on every exit path
# (the bench stops its servers; the temp dir is removed).
#
# Usage: bench/bench_policy_ttft.sh [options] [-- more `pagoda serve` flags]
#   --model FILE        the model (default: a synthetic tiny one with a 2048 context, made
#                       in the temp dir; stories260K's context of 128 is too short)
#   --pagoda BIN        the CLI (default $PGD_BUILD_DIR/pagoda or build/pagoda)
#   --policies LIST     comma-separated (default lru,s3fifo,arc,cost; lru must be in it)
#   --kv-tokens N       the pool of every server, in tokens (default 2048; at least --ctx)
#   --requests N --sessions N --turns N --turn-blocks N --groups N --system-blocks N
#   --one-off PCT --block-tokens N --seed N
#                       the trace, passed to `pagoda gen-trace` (defaults 300, 16, 8, 2,
#                       4, 4, 10, 64, 1: 735 distinct blocks of 64 tokens, 22x the pool;
#                       prompts of up to 1151 tokens). Long conversations are where a
#                       policy beats LRU: with 5 turns of 3 blocks and 24 sessions, LRU
#                       still caches less (0.28 against 0.38-0.39) but TTFT p90 is a wash
#   --tenants K         tenants by conversation, as cache_salt (default 4)
#   --output-tokens O   cap on each request's max_tokens (default 4: TTFT is the point)
#   --ctx N             the servers' --ctx (default 1536: the longest prompt + O)
#   -t N                threads of the server (default 2)
#   --reps N            runs per policy (default 3; about 8 s each on 2 cores)
#   --json              print one JSON object instead of the table
# Figures: see README.md, "pagoda bench". Needs jq. Exit status: 0, 1 (something failed),
# 2 (usage), 77 (jq missing, or a CLI without `serve --policy`).
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${PGD_BUILD_DIR:-build}/pagoda
model="" policies=lru,s3fifo,arc,cost kv_tokens=2048
requests=300 sessions=16 turns=8 turn_blocks=2 groups=4 system_blocks=4 one_off=10
block=64 seed=1 tenants=4 output=4 ctx=1536 threads=2 reps=3 json=0
serve_extra=()

die() {
    echo "bench_policy_ttft: $*" >&2
    exit 1
}

while [ $# -gt 0 ]; do
    case $1 in
    --model) model=$2; shift 2 ;;
    --pagoda) BIN=$2; shift 2 ;;
    --policies) policies=$2; shift 2 ;;
    --kv-tokens) kv_tokens=$2; shift 2 ;;
    --requests) requests=$2; shift 2 ;;
    --sessions) sessions=$2; shift 2 ;;
    --turns) turns=$2; shift 2 ;;
    --turn-blocks) turn_blocks=$2; shift 2 ;;
    --groups) groups=$2; shift 2 ;;
    --system-blocks) system_blocks=$2; shift 2 ;;
    --one-off) one_off=$2; shift 2 ;;
    --block-tokens) block=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --tenants) tenants=$2; shift 2 ;;
    --output-tokens) output=$2; shift 2 ;;
    --ctx) ctx=$2; shift 2 ;;
    -t) threads=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --json) json=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; serve_extra=("$@"); break ;;
    *) echo "bench_policy_ttft: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

for n in "$kv_tokens" "$reps" "$ctx"; do
    case $n in
    '' | *[!0-9]*) echo "bench_policy_ttft: '$n' is not a number" >&2; exit 2 ;;
    esac
done
[ "$reps" -ge 1 ] || { echo "bench_policy_ttft: --reps must be >= 1" >&2; exit 2; }
case ",$policies," in
*,lru,*) ;;
*) echo "bench_policy_ttft: --policies must include lru (the ratios are to it)" >&2; exit 2 ;;
esac
if ! command -v jq >/dev/null 2>&1; then
    echo "bench_policy_ttft: jq not installed, skipped" >&2
    exit 77
fi
[ -x "$BIN" ] || die "$BIN not found: build the CLI (cmake --build build --target pagoda_cli)"
serve_help=$("$BIN" serve --help 2>/dev/null || true)
if ! grep -q -- '--policy NAME' <<<"$serve_help"; then
    echo "bench_policy_ttft: $BIN serve has no --policy (issue 13's CLI), skipped" >&2
    exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench_policy_ttft.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM

model_name=$model
if [ -z "$model" ]; then
    model=$tmp/tiny.gguf
    model_name="synthetic tiny (synth-model --shape tiny --ctx 2048)"
    "$BIN" synth-model --shape tiny --ctx 2048 --seed 1 --threads "$threads" -o "$model" \
        >/dev/null || die "synth-model failed"
fi
[ -f "$model" ] || die "no model '$model'"

# The pool: --kv-tokens of the model's f16 KV (2 bytes x K and V x layers x KV heads x
# head_dim per token), as serve's --kv-memory (it has no flag in tokens).
bpt=$("$BIN" inspect "$model" | awk '
    $1 == "block_count" { l = $2 }
    $1 == "embedding_length" { d = $2 }
    $1 == "attention.head_count" { h = $2 }
    $1 == "attention.head_count_kv" { kv = $2 }
    END { if (l && d && h) print 2 * 2 * l * (kv ? kv : h) * (d / h) }')
[ -n "$bpt" ] || die "cannot read the model's shape (pagoda inspect $model)"
kv_memory=$((kv_tokens * bpt))

"$BIN" gen-trace --seed "$seed" --requests "$requests" --groups "$groups" \
    --system-blocks "$system_blocks" --sessions "$sessions" --turns "$turns" \
    --turn-blocks "$turn_blocks" --one-off "$one_off" --block-tokens "$block" \
    -o "$tmp/trace.jsonl" --expect "$tmp/expect.json" || die "gen-trace failed"

IFS=, read -r -a pols <<<"$policies"
t0=$(date +%s.%N)
for rep in $(seq "$reps"); do
    for p in "${pols[@]}"; do
        out=$tmp/$p.$rep.json
        if ! "$BIN" bench --trace "$tmp/trace.jsonl" --block-tokens "$block" \
            --tenants "$tenants" --output-tokens "$output" --seed "$seed" -m "$model" \
            --no-compare --json -- -t "$threads" --ctx "$ctx" --kv-memory "$kv_memory" \
            --policy "$p" "${serve_extra[@]}" >"$out" 2>"$tmp/$p.$rep.err"; then
            cat "$tmp/$p.$rep.err" >&2
            die "pagoda bench failed (--policy $p, run $rep)"
        fi
        [ $json -eq 1 ] || echo "bench_policy_ttft: $p run $rep: $(jq -r '.runs[0] |
            "TTFT p90 \(.ttft_ms.p90 * 100 | round / 100) ms, cached \(.cached_tokens)"' "$out")" >&2
    done
done
t1=$(date +%s.%N)

# One object per policy: the median of each figure over its runs.
for p in "${pols[@]}"; do
    jq -s --arg p "$p" '
      def med: sort | if length % 2 == 1 then .[length / 2 | floor]
                      else (.[length / 2 - 1] + .[length / 2]) / 2 end;
      [.[] | .runs[0]] as $r |
      {policy: $p, runs: ($r | length), failed: ($r | map(.failed) | add),
       ttft_p50_ms: ($r | map(.ttft_ms.p50) | med), ttft_p90_ms: ($r | map(.ttft_ms.p90) | med),
       ttft_p99_ms: ($r | map(.ttft_ms.p99) | med),
       cached_share: ($r | map(.cached_tokens / .prompt_tokens) | med),
       prompt_tokens_computed: ($r | map(.prompt_tokens_computed // 0) | med),
       duration_s: ($r | map(.duration_s) | med)}' "$tmp/$p".*.json
done >"$tmp/policies.json"

result=$(jq -s --slurpfile ex "$tmp/expect.json" --arg model "$model_name" \
    --argjson kv_tokens "$kv_tokens" --argjson kv_memory "$kv_memory" \
    --argjson secs "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')" '
    (map(select(.policy == "lru")) | .[0]) as $l |
    def r(x; y): if y > 0 then x / y else null end;
    {model: $model, kv_tokens: $kv_tokens, kv_memory_bytes: $kv_memory, seconds: $secs,
     trace: $ex[0], unlimited_cached_share: ($ex[0].unlimited_hit_tokens / $ex[0].tokens),
     policies: map(. + {ratios: {ttft_p50: r(.ttft_p50_ms; $l.ttft_p50_ms),
                                 ttft_p90: r(.ttft_p90_ms; $l.ttft_p90_ms),
                                 ttft_p99: r(.ttft_p99_ms; $l.ttft_p99_ms),
                                 cached_share: r(.cached_share; $l.cached_share),
                                 prompt_tokens_computed:
                                   r(.prompt_tokens_computed; $l.prompt_tokens_computed)}})}' \
    "$tmp/policies.json")
if [ $json -eq 1 ]; then
    echo "$result"
else
    echo "$result" | jq -r --arg wl "$requests requests ($sessions sessions x $turns turns of ~$turn_blocks blocks, $groups system prompts of $system_blocks blocks, $one_off% one-offs), $block tokens per block, $tenants tenants, max_tokens <= $output, one at a time; -t $threads --ctx $ctx; $reps run(s) per policy (median)" '
      def pad(n): if n > 0 then " " * n else "" end;
      def f(x; d): if x == null then "-" else (x * pow(10; d) | round / pow(10; d) | tostring) end;
      def cell(s; w): "\(pad(w - (s | length)))\(s)";
      "policy TTFT, \(.model): \($wl)",
      "pool \(.kv_tokens) tokens (\(.kv_memory_bytes) bytes) for every policy; the trace: \(.trace.distinct_ids) distinct blocks (\(.trace.distinct_ids * .trace.block_tokens / .kv_tokens | floor)x the pool), unlimited-cache share \(f(.unlimited_cached_share; 3)); \(f(.seconds; 1)) s in all",
      "",
      (["policy", "p50 ms", "p90 ms", "p99 ms", "cached", "computed", "p50/LRU", "p90/LRU", "p99/LRU", "cached/LRU"]
       | "\(cell(.[0]; 8))\(cell(.[1]; 9))\(cell(.[2]; 9))\(cell(.[3]; 9))\(cell(.[4]; 8))\(cell(.[5]; 10))\(cell(.[6]; 9))\(cell(.[7]; 9))\(cell(.[8]; 9))\(cell(.[9]; 11))"),
      (.policies[] |
       [.policy, f(.ttft_p50_ms; 2), f(.ttft_p90_ms; 2), f(.ttft_p99_ms; 2), f(.cached_share; 3),
        f(.prompt_tokens_computed; 0), f(.ratios.ttft_p50; 3), f(.ratios.ttft_p90; 3),
        f(.ratios.ttft_p99; 3), f(.ratios.cached_share; 3)]
       | "\(cell(.[0]; 8))\(cell(.[1]; 9))\(cell(.[2]; 9))\(cell(.[3]; 9))\(cell(.[4]; 8))\(cell(.[5]; 10))\(cell(.[6]; 9))\(cell(.[7]; 9))\(cell(.[8]; 9))\(cell(.[9]; 11))")'
fi
if [ "$(echo "$result" | jq '[.policies[].failed] | add')" != 0 ]; then
    die "some requests failed"
fi
