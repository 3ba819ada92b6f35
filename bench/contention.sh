#!/usr/bin/env bash
# contention.sh - decode speed with 1 and 2 threads, on a quiet machine and with a competing
# busy process (issue 16, "The thread pool under contention": `pagoda run -t 2` fell to 831
# t/s on stories260K while another process kept one core busy, against 7,387 t/s with -t 1).
# A benchmark, not a test: the figures are printed, never asserted.
#
# Each round runs, in turn,
#   pagoda run -m MODEL -p PROMPT -n N -c CTX --temp 0 -t T     (T = 1, then 2)
# alone, then again with one busy-loop process beside it (a shell `while :` under `timeout`,
# started before the run and killed after it, so it never outlives the script nor --busy-max
# seconds). The machine's other load drifts, so the configurations alternate within each
# round (and with --base the two CLIs swap places every other round) and the ratios are
# taken per round (paired), then their median over the rounds.
# It prints per configuration the decode tokens/s that pagoda run reports (its "generated:
# ... t/s" figure) as min / median / max, then the ratios: 2 threads / 1 thread quiet, and
# with the busy core 2 threads / 1 thread (quiet and busy). The goal is never below 1.
# The generated text must be the same in every run of one CLI (greedy; the threads and
# the load change the speed only): a mismatch is reported and the exit status is 1.
#
# Usage: bench/contention.sh [options]
#   --pagoda BIN        the CLI (default $PGD_BUILD_DIR/pagoda, else build/pagoda)
#   --base BIN          a second CLI (e.g. a build of the base commit) run in the same rounds,
#                       reported beside the first
#   --model FILE        GGUF model (default ../shared/models/stories260K.gguf, else
#                       models/stories260K.gguf, from the repository root)
#   -n N                tokens to generate per run (default 1000)
#   -c N                context size (default 1024; prompt + N must fit)
#   --prompt TEXT       (default "Once upon a time")
#   --rounds N          rounds of all configurations (default 5)
#   --busy-max S        upper bound on one busy process's life in seconds (default 300)
#   -h, --help
# Exit status: 0, 1 (a run failed or outputs differ), 2 (usage).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${PGD_BUILD_DIR:-$root/build}
pagoda="$build/pagoda"
base=""
model=""
n=1000
ctx=1024
prompt="Once upon a time"
rounds=5
busy_max=300

usage() { sed -n '/^# Usage:/,/^# Exit status/p' "$0" | sed 's/^# \{0,1\}//'; }
die() {
    echo "contention.sh: $*" >&2
    exit 1
}
while [ $# -gt 0 ]; do
    case "$1" in
    --pagoda) pagoda=$2; shift 2 ;;
    --base) base=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    -n) n=$2; shift 2 ;;
    -c) ctx=$2; shift 2 ;;
    --prompt) prompt=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --busy-max) busy_max=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "contention.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
for v in "$n" "$ctx" "$rounds" "$busy_max"; do
    case "$v" in '' | *[!0-9]*) echo "contention.sh: '$v' is not a number" >&2; exit 2 ;; esac
done
[ "$rounds" -ge 1 ] && [ "$n" -ge 1 ] && [ "$busy_max" -ge 1 ] ||
    { echo "contention.sh: --rounds, -n and --busy-max must be at least 1" >&2; exit 2; }
if [ -z "$model" ]; then
    for m in "$root/../shared/models/stories260K.gguf" "$root/models/stories260K.gguf"; do
        [ -f "$m" ] && { model=$m; break; }
    done
    [ -n "$model" ] || die "no stories260K.gguf found (--model)"
fi
[ -f "$model" ] || die "$model: no such file (--model)"
[ -x "$pagoda" ] || die "$pagoda: not an executable (--pagoda)"
[ -z "$base" ] || [ -x "$base" ] || die "$base: not an executable (--base)"

dir=$(mktemp -d "${TMPDIR:-/tmp}/contention.XXXXXX")
busy_pid=""
stop_busy() {
    if [ -n "$busy_pid" ]; then
        kill "$busy_pid" 2>/dev/null || true
        wait "$busy_pid" 2>/dev/null || true
        busy_pid=""
    fi
}
trap 'stop_busy; rm -rf "$dir"' EXIT
trap 'exit 1' INT TERM

# The CLIs: "new" is --pagoda, "base" is --base.
clis=(new)
[ -z "$base" ] || clis+=(base)
bin_of() { if [ "$1" = base ]; then echo "$base"; else echo "$pagoda"; fi; }
confs=(t1 t2 t1busy t2busy)

# run CLI CONF ROUND: one pagoda run; appends its decode t/s to $dir/CLI.CONF.
run_one() {
    local cli=$1 conf=$2 round=$3 t=${2:1:1}
    case "$conf" in
    *busy)
        timeout "$busy_max" sh -c 'while :; do :; done' &
        busy_pid=$!
        sleep 0.2 ;;
    esac
    local out="$dir/$cli.$conf.$round"
    if ! "$(bin_of "$cli")" run -m "$model" -p "$prompt" -n "$n" -c "$ctx" --temp 0 -t "$t" \
        --no-display-prompt >"$out.txt" 2>"$out.err"; then
        stop_busy
        cat "$out.err" >&2
        die "$cli $conf: pagoda run failed"
    fi
    stop_busy
    local tps
    tps=$(sed -n 's/.*generated: [0-9]* tokens, [0-9.]* s, \([0-9.]*\) t\/s.*/\1/p' "$out.err")
    [ -n "$tps" ] || die "$cli $conf: no 'generated: ... t/s' in the output of pagoda run"
    echo "$tps" >>"$dir/$cli.$conf"
}

echo "contention.sh: $(basename "$model"), -n $n -c $ctx, $rounds rounds, $(nproc) CPUs"
for r in $(seq 1 "$rounds"); do
    order=("${clis[@]}")
    # with --base, every other round runs base first: neither CLI always runs second
    [ $((r % 2)) -eq 1 ] || [ ${#clis[@]} -eq 1 ] || order=(base new)
    for conf in "${confs[@]}"; do
        for cli in "${order[@]}"; do
            run_one "$cli" "$conf" "$r"
        done
    done
done

status=0
for cli in "${clis[@]}"; do
    ref="$dir/$cli.t1.1.txt"
    for f in "$dir/$cli".*.txt; do
        cmp -s "$ref" "$f" ||
            { echo "contention.sh: $cli: $(basename "$f") differs from t1.1" >&2; status=1; }
    done
done

# median of the numbers on stdin
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
# ratio A B: the median over the rounds of A's t/s / B's t/s
ratio() { paste "$1" "$2" | awk '{ print $1 / $2 }' | median; }

printf '%-5s %-8s %10s %10s %10s   (decode t/s)\n' cli conf min median max
for cli in "${clis[@]}"; do
    for conf in "${confs[@]}"; do
        f="$dir/$cli.$conf"
        printf '%-5s %-8s %10.1f %10.1f %10.1f\n' "$cli" "$conf" "$(sort -g "$f" | head -1)" \
            "$(median <"$f")" "$(sort -g "$f" | tail -1)"
    done
done
printf '%-5s %16s %16s %16s %16s\n' cli t2/t1 t1busy/t1 t2busy/t1 t2busy/t1busy
for cli in "${clis[@]}"; do
    d="$dir/$cli"
    printf '%-5s %16.3f %16.3f %16.3f %16.3f\n' "$cli" "$(ratio "$d.t2" "$d.t1")" \
        "$(ratio "$d.t1busy" "$d.t1")" "$(ratio "$d.t2busy" "$d.t1")" \
        "$(ratio "$d.t2busy" "$d.t1busy")"
done
if [ -n "$base" ]; then
    printf '%-18s' "new/base (t/s)"
    for conf in "${confs[@]}"; do
        printf ' %s %.3f' "$conf" "$(ratio "$dir/new.$conf" "$dir/base.$conf")"
    done
    echo
fi
exit $status
