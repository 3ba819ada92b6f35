#!/usr/bin/env bash
# budget_quality.sh - the quality table of token budgets (issue 14, "Quality, measured"):
# every budget method x budget on stories260K with 512-token chunks, by `pagoda eval`'s
# budget protocol (tools/eval.c: each chunk's first half prefilled and compressed to the
# budget, its second half decoded token by token, teacher-forced, and scored against the
# same protocol without a budget). For each method M and budget B it runs
#   pagoda eval -m MODEL -f TEXT -c 512 -t T --json --kv-budget B --kv-budget-method M
# and prints one row: method, budget, ppl, kl_mean (KL(p_dense || p_budget), mean over
# the scored tokens), top1_agree (argmax equal to dense's), kv_tokens_mean (slots the
# sequence held while its second half was decoded, mean: the online methods hold their
# budget + less than a page throughout, the snapkv family compresses the prompt once and
# then adds the decoded tokens, pyramidkv / adakv hold the max over layers / heads), then
# the dense ppl. With 512 tokens a chunk's prompt is 256 tokens: budget 128 is 25% of
# the context at its longest (512), 50% of the prompt the snapkv family compresses.
#
# Usage: bench/budget_quality.sh [options] [-- more `pagoda eval` flags]
#   --model FILE     the model (default ../shared/models/stories260K.gguf, or
#                    $PGD_MODELS_DIR/stories260K.gguf)
#   --text FILE      the text (default text/stories-dev.txt beside the model)
#   --pagoda BIN     the CLI (default $PGD_BUILD_DIR/pagoda or build/pagoda)
#   --methods LIST   comma-separated (default streaming,h2o,tova,snapkv,pyramidkv,adakv)
#   --budgets LIST   comma-separated (default 64,128,256)
#   -c N             tokens per chunk (default 512)
#   -t N             threads (default 2)
#   --json           one JSON object {"dense_ppl", "rows": [eval's objects]} instead
# Exit status: 0, 1 (an eval failed), 2 (usage), 77 (no model or text, or jq missing).
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${PGD_BUILD_DIR:-build}/pagoda
models=${PGD_MODELS_DIR:-../shared/models}
model="" text="" methods=streaming,h2o,tova,snapkv,pyramidkv,adakv budgets=64,128,256
ctx=512 threads=2 json=0
extra=()

usage() {
    sed -n '/^# Usage/,/^# Exit/p' "$0" | sed 's/^# \{0,1\}//'
}

while [ $# -gt 0 ]; do
    case $1 in
    --model) model=$2; shift 2 ;;
    --text) text=$2; shift 2 ;;
    --pagoda) BIN=$2; shift 2 ;;
    --methods) methods=$2; shift 2 ;;
    --budgets) budgets=$2; shift 2 ;;
    -c) ctx=$2; shift 2 ;;
    -t) threads=$2; shift 2 ;;
    --json) json=1; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "budget_quality: unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
done

[ -n "$model" ] || model=$models/stories260K.gguf
[ -n "$text" ] || text=$(dirname "$model")/text/stories-dev.txt
if [ ! -f "$model" ] || [ ! -f "$text" ]; then
    echo "budget_quality: skipped: $model or $text not found" >&2
    exit 77
fi
command -v jq >/dev/null || { echo "budget_quality: skipped: needs jq" >&2; exit 77; }
[ -x "$BIN" ] || { echo "budget_quality: $BIN not found (build pagoda_cli)" >&2; exit 1; }

rows=()
for m in ${methods//,/ }; do
    for b in ${budgets//,/ }; do
        if ! o=$("$BIN" eval -m "$model" -f "$text" -c "$ctx" -t "$threads" --json \
            --kv-budget "$b" --kv-budget-method "$m" ${extra[@]+"${extra[@]}"} 2>/dev/null); then
            echo "budget_quality: eval --kv-budget $b --kv-budget-method $m failed:" >&2
            "$BIN" eval -m "$model" -f "$text" -c "$ctx" -t "$threads" --json --kv-budget "$b" \
                --kv-budget-method "$m" ${extra[@]+"${extra[@]}"} >/dev/null || true
            exit 1
        fi
        rows+=("$o")
    done
done

all=$(printf '%s\n' "${rows[@]}" | jq -s .)
dense=$(jq '.[0].kv_budget.dense_ppl' <<<"$all")
if [ "$json" = 1 ]; then
    jq -c --argjson d "$dense" '{dense_ppl: $d, rows: .}' <<<"$all"
    exit 0
fi
echo "budget_quality: $model on $text, -c $ctx, $(jq '.[0].chunks' <<<"$all") chunks," \
    "$(jq '.[0].scored' <<<"$all") scored tokens"
printf '%-10s %6s %10s %10s %10s %14s %8s\n' method budget ppl kl_mean top1_agree \
    kv_tokens_mean dropped
jq -r '.[] | [.kv_budget.method, .kv_budget.budget, .ppl, .kl_mean, .top1_agree,
              .kv_budget.kv_tokens_mean, .kv_budget.dropped_tokens] | @tsv' <<<"$all" |
    while IFS=$'\t' read -r m b p k t kv d; do
        printf '%-10s %6d %10.4f %10.5f %10.4f %14.1f %8d\n' "$m" "$b" "$p" "$k" "$t" "$kv" "$d"
    done
printf 'dense ppl (the same protocol without a budget): %.4f\n' "$dense"
