#!/usr/bin/env bash
# quant_speed.sh - prefill and decode speed of one synthetic model in several weight types, in
# one run (issue 15, "Speed": on the 1B shape, Q4_K_M decode faster than Q8_0, and Q4_K_M
# prefill within 25% of Q4_0).
#
# It writes the model with `pagoda synth-model --shape SHAPE --type T` for each type (same seed,
# so the same weights before quantization) into a temp dir, then runs
#   bench_engine --model M --pp PP --tg TG --depth 0 -t T --reps 1
# once per type and round, interleaved (A B C A B C ...): the machine's other load drifts, and
# within a round the types see about the same load. It prints, per type, the file size, prefill
# (pp) and decode (tg) tokens/s as min / median / max over the rounds, and the median over the
# rounds of each round's ratio to q8_0 and to q4_0 (same round: the paired ratio is steadier
# than a ratio of medians), then the two targets. bench_engine's greedy checksum must be the
# same in every round of a type (it is printed; a kernel that is fast but wrong changes it).
# The temp dir (about 2.5 GiB for the 1b shape) is removed on every exit path.
#
# Usage: bench/quant_speed.sh [options]
#   --pagoda BIN        the CLI (default $PGD_BUILD_DIR/pagoda, else build/pagoda)
#   --bench BIN         bench_engine (default $PGD_BUILD_DIR/bench/bench_engine, else
#                       build/bench/bench_engine)
#   --types LIST        comma-separated --type values (default q8_0,q4_0,q4_k_m; q8_0 and
#                       q4_0 must be in it for the ratios)
#   --shape NAME        synth-model --shape (default 1b: dim 2048, 16 layers, ffn 8192)
#   --pp N              prompt tokens prefilled in one test (default 512)
#   --tg N              tokens decoded in one test (default 32)
#   -t N                threads (default 2)
#   --rounds N          rounds of all types (default 3)
#   --seed N            synth-model --seed and bench_engine --seed (default 1)
#   --tmp DIR           where the temp dir goes (default $TMPDIR or /tmp)
#   -h, --help
# Exit status: 0, 1 (a step failed), 2 (usage). The targets are reported, not enforced.
set -euo pipefail

build=${PGD_BUILD_DIR:-build}
pagoda="$build/pagoda"
bench="$build/bench/bench_engine"
types=q8_0,q4_0,q4_k_m
shape=1b
pp=512
tg=32
threads=2
rounds=3
seed=1
tmp=${TMPDIR:-/tmp}

usage() { sed -n '/^# Usage:/,/^# Exit status/p' "$0" | sed 's/^# \{0,1\}//'; }
die() {
    echo "quant_speed.sh: $*" >&2
    exit 1
}
while [ $# -gt 0 ]; do
    case "$1" in
    --pagoda) pagoda=$2; shift 2 ;;
    --bench) bench=$2; shift 2 ;;
    --types) types=$2; shift 2 ;;
    --shape) shape=$2; shift 2 ;;
    --pp) pp=$2; shift 2 ;;
    --tg) tg=$2; shift 2 ;;
    -t) threads=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --tmp) tmp=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "quant_speed.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
for n in "$pp" "$tg" "$threads" "$rounds" "$seed"; do
    case "$n" in '' | *[!0-9]*) echo "quant_speed.sh: '$n' is not a number" >&2; exit 2 ;; esac
done
[ "$rounds" -ge 1 ] && [ "$threads" -ge 1 ] && [ "$pp" -ge 1 ] && [ "$tg" -ge 1 ] ||
    { echo "quant_speed.sh: --rounds, -t, --pp and --tg must be at least 1" >&2; exit 2; }
IFS=, read -r -a tlist <<<"$types"
case ",$types," in *,q8_0,*) ;; *) echo "quant_speed.sh: --types must hold q8_0" >&2; exit 2 ;; esac
case ",$types," in *,q4_0,*) ;; *) echo "quant_speed.sh: --types must hold q4_0" >&2; exit 2 ;; esac
[ -x "$pagoda" ] || die "$pagoda: not an executable (--pagoda)"
[ -x "$bench" ] || die "$bench: not an executable (--bench)"

dir=$(mktemp -d "$tmp/quant_speed.XXXXXX")
trap 'rm -rf "$dir"' EXIT
trap 'exit 1' INT TERM

echo "quant_speed: shape $shape, pp $pp, tg $tg, $threads threads, $rounds rounds, types $types"
for t in "${tlist[@]}"; do
    "$pagoda" synth-model --shape "$shape" --type "$t" --seed "$seed" -o "$dir/$t.gguf" \
        >"$dir/$t.synth" 2>&1 || { cat "$dir/$t.synth" >&2; die "synth-model --type $t failed"; }
    tail -n 1 "$dir/$t.synth"
done

# One bench_engine run: "pp_tps tg_tps checksum" on stdout.
one_run() {
    local out
    out=$("$bench" --model "$dir/$1.gguf" --pp "$pp" --tg "$tg" --depth 0 -t "$threads" \
        --reps 1 --seed "$seed") || { echo "$out" >&2; return 1; }
    echo "$out" | grep '^model ' >"$dir/$1.model" || true
    echo "$out" | awk '$3 == "pp" { pp = $6 } $3 == "tg" { tg = $6 } $1 == "checksum" { c = $2 }
        END { if (pp == "" || tg == "" || c == "") exit 1; print pp, tg, c }'
}

: >"$dir/results"
for r in $(seq 1 "$rounds"); do
    for t in "${tlist[@]}"; do
        res=$(one_run "$t") || die "bench_engine on $t failed"
        echo "$r $t $res" >>"$dir/results"
        [ "$r" -gt 1 ] || sed 's/^/bench_engine: /' "$dir/$t.model"
        printf 'round %d %-8s pp %9.2f t/s  tg %7.2f t/s  checksum %s\n' "$r" "$t" $res
    done
done

# The table: per type min/median/max of pp and tg, and the median of the paired ratios.
awk -v types="$types" -v dir="$dir" '
function median(a, n,   i, j, t, b) {
    for (i = 1; i <= n; i++) b[i] = a[i]
    for (i = 2; i <= n; i++) for (j = i; j > 1 && b[j] < b[j - 1]; j--) {
        t = b[j]; b[j] = b[j - 1]; b[j - 1] = t }
    return n % 2 ? b[(n + 1) / 2] : (b[n / 2] + b[n / 2 + 1]) / 2
}
function mn(a, n,   i, m) { m = a[1]; for (i = 2; i <= n; i++) if (a[i] < m) m = a[i]; return m }
function mx(a, n,   i, m) { m = a[1]; for (i = 2; i <= n; i++) if (a[i] > m) m = a[i]; return m }
{ pp[$2, $1] = $3; tg[$2, $1] = $4; ck[$2, $1] = $5; if ($1 > nr) nr = $1 }
END {
    nt = split(types, tl, ",")
    printf "\n%-8s %8s  %-26s %-23s %-15s %-15s\n", "type", "GiB", "pp t/s min/med/max",
        "tg t/s min/med/max", "pp vs q8_0/q4_0", "tg vs q8_0/q4_0"
    bad_ck = 0
    for (k = 1; k <= nt; k++) {
        t = tl[k]
        for (r = 1; r <= nr; r++) {
            p[r] = pp[t, r]; g[r] = tg[t, r]
            p8[r] = pp[t, r] / pp["q8_0", r]; p4[r] = pp[t, r] / pp["q4_0", r]
            g8[r] = tg[t, r] / tg["q8_0", r]; g4[r] = tg[t, r] / tg["q4_0", r]
            if (ck[t, r] != ck[t, 1]) bad_ck = 1
        }
        cmd = "stat -c %s \"" dir "/" t ".gguf\""; cmd | getline sz; close(cmd)
        printf "%-8s %8.2f  %7.1f %7.1f %7.1f    %6.2f %6.2f %6.2f    %5.3f %5.3f    %5.3f %5.3f\n",
            t, sz / 1073741824, mn(p, nr), median(p, nr), mx(p, nr), mn(g, nr), median(g, nr),
            mx(g, nr), median(p8, nr), median(p4, nr), median(g8, nr), median(g4, nr)
        if (t == "q4_k_m") { kg8 = median(g8, nr); kp4 = median(p4, nr); have_k = 1 }
    }
    printf "(ratios: the median over the %d rounds of the ratio within each round)\n", nr
    if (have_k) {
        printf "target: q4_k_m decode faster than q8_0:        %.3fx  %s\n", kg8,
            (kg8 > 1 ? "met" : "NOT met")
        printf "target: q4_k_m prefill within 25%% of q4_0:     %.3fx  %s\n", kp4,
            (kp4 >= 0.75 ? "met" : "NOT met")
    }
    if (bad_ck) { print "checksums differ between rounds of one type" > "/dev/stderr"; exit 1 }
}' "$dir/results"
