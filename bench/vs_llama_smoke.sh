#!/usr/bin/env bash
# vs_llama_smoke.sh - ctest's run of bench/vs_llama.sh (test vs_llama_smoke): QUICK=1 on
# stories260K (MODEL=), seconds, no timing asserted. It checks that the script runs and
# prints its table rows:
#   1. with a stand-in llama.cpp dir (LLAMA_CPP_DIR): a llama-bench that prints llama-bench's
#      markdown rows with fixed t/s (100 for pp, 10 for tg, "pp64 @ d2048" as llama-bench
#      names a depth) and a llama-server that is `pagoda serve` under llama-server's flags,
#      on ISAS="scalar avx2": every row has both columns and a ratio, the ISA each level ran
#      on is the one asked for (bench_engine's own "isa" line), and a checksum per level and
#      KV type;
#   2. without LLAMA_CPP_DIR: Pagoda's column only, and it says llama.cpp was skipped.
# Usage: vs_llama_smoke.sh BUILD_DIR. Exit 0, 1 (a check failed), 77 (no stories260K).
set -euo pipefail

build=$1
src=$(cd "$(dirname "$0")/.." && pwd)
model=${PGD_MODELS_DIR:-$src/../shared/models}/stories260K.gguf
[ -f "$model" ] || { echo "vs_llama_smoke: $model not found, skipped"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/vs_llama_smoke.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() {
    echo "vs_llama_smoke: $*" >&2
    exit 1
}

mkdir -p "$tmp/llama/build/bin"
cat >"$tmp/llama/build/bin/llama-bench" <<'EOF'
#!/usr/bin/env bash
# a stand-in llama-bench: the markdown rows of its output, fixed t/s
p=512 n=128 d=0
while [ $# -gt 0 ]; do
    case "$1" in
    --help) echo "  -d, --n-depth <n>"; echo "  -fa, --flash-attn <on|off|auto>"; exit 0 ;;
    -p) p=$2; shift ;;
    -n) n=$2; shift ;;
    -d) d=$2; shift ;;
    esac
    shift
done
echo "| model | size | params | backend | threads | fa | test | t/s |"
echo "| ----- | ---: | -----: | ------- | ------: | -: | ---: | --: |"
IFS=, read -r -a ds <<<"$d"
for x in "${ds[@]}"; do
    at=""
    [ "$x" = 0 ] || at=" @ d$x"
    echo "| llama ?B Q8_0 | 1 MiB | 1 M | CPU | 2 | 1 | pp$p$at | 100.00 ± 1.00 |"
    echo "| llama ?B Q8_0 | 1 MiB | 1 M | CPU | 2 | 1 | tg$n$at | 10.00 ± 0.10 |"
done
EOF
cat >"$tmp/llama/build/bin/llama-server" <<EOF
#!/usr/bin/env bash
# a stand-in llama-server: pagoda serve with llama-server's flags translated
args=()
while [ \$# -gt 0 ]; do
    case "\$1" in
    --help) echo "  -fa, --flash-attn [on|off|auto]"; exit 0 ;;
    -np | -c) shift ;;
    -fa) [ "\${2:-}" = on ] && shift ;;
    *) args+=("\$1") ;;
    esac
    shift
done
exec "$build/pagoda" serve -c 256 "\${args[@]}"
EOF
chmod +x "$tmp/llama/build/bin/llama-bench" "$tmp/llama/build/bin/llama-server"

# 1. with llama.cpp
QUICK=1 MODEL="$model" ISAS="scalar avx2" LLAMA_CPP_DIR="$tmp/llama" \
    "$src/bench/vs_llama.sh" "$build" >"$tmp/out1" 2>&1 || { cat "$tmp/out1"; fail "run 1 failed"; }
cat "$tmp/out1"
for isa in scalar avx2; do
    grep -q "^### Pagoda isa $isa (PGD_ISA=$isa)" "$tmp/out1" || fail "no table for isa $isa"
done
rows=$(grep -cE '^\| (prefill pp64|decode tg8), (f16|q8_0) KV, depth 0 \| (100|10)\.00 \| [0-9.]+ \| \*\*[0-9.]+x\*\* \|$' \
    "$tmp/out1" | tr -d ' ' || true)
[ "$rows" = 8 ] || fail "$rows prefill/decode rows with a ratio, want 8 (4 per ISA level)"
srows=$(grep -cE '^\| serving: .* \| [0-9.]+ \| [0-9.]+ \| \*\*[0-9.]+x\*\* \|$' "$tmp/out1" || true)
[ "$srows" = 4 ] || fail "$srows serving rows with a ratio, want 4"
# one checksum per ISA level and KV type (equal across reps: vs_llama.sh checks that itself;
# across levels and types they may differ, near-tie logits of another summation order)
n_ck=$(grep -cE '^  (scalar|avx2) (f16|q8_0): [0-9a-f]{16}$' "$tmp/out1" || true)
[ "$n_ck" = 4 ] || fail "$n_ck checksum lines, want 4"

# 2. without llama.cpp
QUICK=1 MODEL="$model" ISAS=default SERVE=0 "$src/bench/vs_llama.sh" "$build" >"$tmp/out2" \
    2>&1 || { cat "$tmp/out2"; fail "run 2 failed"; }
cat "$tmp/out2"
grep -q 'llama.cpp skipped: LLAMA_CPP_DIR not set' "$tmp/out2" || fail "no 'llama.cpp skipped'"
rows=$(grep -cE '^\| (prefill pp64|decode tg8), (f16|q8_0) KV, depth 0 \| [0-9.]+ \|$' \
    "$tmp/out2" || true)
[ "$rows" = 4 ] || fail "$rows Pagoda-only rows, want 4"
! grep -q '^| serving' "$tmp/out2" || fail "SERVE=0 printed serving rows"
echo "vs_llama_smoke: ok"
