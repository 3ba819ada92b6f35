#!/usr/bin/env bash
# window_memory.sh - what sliding-window layers in a page group of their own save (issue 15:
# "sliding-window layers keep only their window's pages per layer"), against the window as a
# mask over every page (--kv-window-dense), in one run.
#
# It writes a synthetic gemma2 model (`pagoda synth-model --arch gemma2 --shape SHAPE --ctx
# CTX`: every other layer a window layer of CTX / 16 tokens) into a temp dir, then runs
#   pagoda run -m M -f PROMPT -n GEN -c CTX --temp 0 [--kv-window-dense]
# ROUNDS times each, alternated (A B A B ...), and prints from each run's summary line the KV
# pages the sequence held at its end (global + window layers), the KV bytes that is, the pages
# each pool reserves, decode tokens/s, and the ratios grouped / dense (memory held, pool
# reserved, decode speed: median over rounds of each round's ratio). The generated text must be
# the same in both modes (md5 printed: the window group changes where K/V lives, not a bit of
# what attention computes). The temp dir is removed on every exit path.
#
# Usage: bench/window_memory.sh [options]
#   --pagoda BIN   the CLI (default $PGD_BUILD_DIR/pagoda, else build/pagoda)
#   --shape NAME   synth-model --shape (default small: dim 512, 8 layers, 4 KV heads)
#   --ctx N        context; the window is N / 16 (default 8192: window 512)
#   --prompt N     prompt tokens (default 256, pseudo-random words)
#   --gen N        tokens generated (default 1536)
#   -t N           threads (default 2)
#   --rounds N     rounds of both modes (default 3)
#   --tmp DIR      where the temp dir goes (default $TMPDIR or /tmp)
# Exit status: 0, 1 (a step failed or the modes' texts differ), 2 (usage).
set -euo pipefail

build=${PGD_BUILD_DIR:-build}
pagoda="$build/pagoda"
shape=small
ctx=8192
prompt=256
gen=1536
threads=2
rounds=3
tmp=${TMPDIR:-/tmp}
while [ $# -gt 0 ]; do
    case "$1" in
    --pagoda) pagoda=$2; shift 2 ;;
    --shape) shape=$2; shift 2 ;;
    --ctx) ctx=$2; shift 2 ;;
    --prompt) prompt=$2; shift 2 ;;
    --gen) gen=$2; shift 2 ;;
    -t) threads=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --tmp) tmp=$2; shift 2 ;;
    -h | --help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "window_memory.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
[ -x "$pagoda" ] || { echo "window_memory.sh: no pagoda binary at $pagoda" >&2; exit 1; }
dir=$(mktemp -d "$tmp/window_memory.XXXXXX")
trap 'rm -rf "$dir"' EXIT
model="$dir/gemma2-$shape.gguf"
"$pagoda" synth-model --arch gemma2 --shape "$shape" --ctx "$ctx" --type q8_0 -o "$model" \
    >/dev/null
words=(the a little girl boy dog cat sun tree ran saw big happy said and then play park day)
for ((i = 0; i < prompt; i++)); do printf '%s ' "${words[$(((i * 7 + i / 3) % ${#words[@]}))]}"; done \
    >"$dir/prompt.txt"

# One run: prints "pages_global pages_window window_total global_total tg_tps md5".
one() {
    local out err
    out=$("$pagoda" run -m "$model" -f "$dir/prompt.txt" -n "$gen" -c "$ctx" -t "$threads" \
        --temp 0 "$@" 2>"$dir/err")
    err=$(tail -1 "$dir/err")
    local tg gp gt wp wt
    tg=$(sed -n 's/.*generated: [0-9]* tokens, [0-9.]* s, \([0-9.]*\) t\/s.*/\1/p' <<<"$err")
    gp=$(sed -n 's/.*KV pages used: \([0-9]*\) of \([0-9]*\).*/\1/p' <<<"$err")
    gt=$(sed -n 's/.*KV pages used: \([0-9]*\) of \([0-9]*\).*/\2/p' <<<"$err")
    wp=$(sed -n 's/.*window layers: \([0-9]*\) pages used of \([0-9]*\).*/\1/p' <<<"$err")
    wt=$(sed -n 's/.*window layers: \([0-9]*\) pages used of \([0-9]*\).*/\2/p' <<<"$err")
    echo "$gp ${wp:-0} ${wt:-0} $gt $tg $(md5sum <<<"$out" | cut -c1-12)"
}

# Bytes of one page of L layers (f16 K and V: 2 x 2 bytes x heads x head_dim x 16 tokens).
layers=$("$pagoda" inspect "$model" 2>/dev/null | sed -n 's/.*block_count[^0-9]*\([0-9]*\).*/\1/p' | head -1)
echo "model: synthetic gemma2 ($shape, q8_0 weights, ${layers:-?} layers, half of them window"
echo "layers of $((ctx / 16)) tokens), prompt $prompt + $gen generated, context $ctx, f16 KV"
echo
printf '%-6s %-8s %14s %14s %10s %10s %s\n' round mode "held: global" "+ window" reserved "tg t/s" text
declare -a r_held r_res r_tg
md5_g="" md5_d=""
for ((r = 1; r <= rounds; r++)); do
    read -r gp wp wt gt tg md5 < <(one)
    read -r dgp dwp dwt dgt dtg dmd5 < <(one --kv-window-dense)
    md5_g=$md5
    md5_d=$dmd5
    # Every global page holds half the layers when grouped, all of them when dense.
    printf '%-6s %-8s %14s %14s %10s %10s %s\n' "$r" grouped "$gp x L/2" "$wp x L/2" \
        "$((gt + wt)) x L/2" "$tg" "$md5"
    printf '%-6s %-8s %14s %14s %10s %10s %s\n' "$r" dense "$dgp x L" "-" "$dgt x L" "$dtg" "$dmd5"
    r_held+=("$(awk -v a="$gp" -v b="$wp" -v c="$dgp" 'BEGIN { printf "%.3f", (a + b) / 2 / c }')")
    r_res+=("$(awk -v a="$gt" -v b="$wt" -v c="$dgt" 'BEGIN { printf "%.3f", (a + b) / 2 / c }')")
    r_tg+=("$(awk -v a="$tg" -v b="$dtg" 'BEGIN { printf "%.3f", a / b }')")
done
med() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
echo
echo "grouped / dense (median of $rounds rounds; L/2-layer pages counted as half a page):"
echo "  KV held at the end:  $(med "${r_held[@]}")"
echo "  KV pools reserved:   $(med "${r_res[@]}")"
echo "  decode tokens/s:     $(med "${r_tg[@]}")"
if [ "$md5_g" != "$md5_d" ]; then
    echo "window_memory.sh: the grouped and dense texts differ ($md5_g vs $md5_d)" >&2
    exit 1
fi
echo "  texts: identical ($md5_g)"
