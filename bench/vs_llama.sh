#!/usr/bin/env bash
# vs_llama.sh - Pagoda against llama.cpp on one machine, in one run: the comparison table of
# issue 16 (prefill pp512 and decode at several context depths with an f16 and a q8_0 KV
# cache, 2 threads; then serving 8 concurrent requests that share a system prompt), with
# the ratios Pagoda / llama.cpp. It builds nothing.
#
# The model is made with this build's `pagoda synth-model --shape 1b --type q8_0` into a
# temp dir (about 1.2 GiB; removed on every exit path), unless MODEL names one. Then, for
# each ISA level (see ISAS) and each repetition, in alternated order (llama.cpp first in odd
# repetitions, Pagoda first in even ones, so a drift of the machine's other load hits both):
#   - per KV type: `llama-bench -m M -t T -fa on|1 -ctk K -ctv K -p PP -n TG -d DEPTHS -r 1`
#     (-d only when its llama-bench has it; without, llama.cpp has depth 0 only), and
#     `bench_engine --model M --pp PP --tg TG --depth DEPTHS -t T --kv-type K --reps 1`;
#   - serving, each server started fresh per run (no cache left from the run before) and
#     driven by `pagoda bench --url` (temperature 0, ignore_eos): `pagoda serve -t T` and
#     `llama-server -t T -np 8 -fa`, on (a) 1 group of 8 prompts sharing a 1157-token system
#     prompt, 32-token questions, 64-token answers, 8 concurrent, and (b) 4 such groups
#     (4 system prompts, 32 requests), 8 concurrent. The figure is output tokens/s.
# It prints a markdown table per ISA level: median (min-max) over the repetitions of each
# side, and the median over the repetitions of each repetition's ratio Pagoda / llama.cpp
# (a paired ratio is steadier than a ratio of medians). bench_engine's greedy checksum must
# be the same in every repetition of a KV type (a kernel that is fast but wrong changes it).
#
# ISA: PGD_ISA (engine/ops/ops.c) lowers the engine's kernels (matrix products, norms,
# softmax, activations) for bench_engine and pagoda serve, and libpagoda's own attention and
# KV codec kernels (src/util/cpu.c), so the avx2 level runs what an AVX2-only CPU runs.
# llama.cpp runs as built;
# LLAMA_CPP_DIR_AVX2 may name a second build (e.g. -DGGML_NATIVE=OFF -DGGML_AVX2=ON) for
# the avx2 level.
#
# Usage: bench/vs_llama.sh [PAGODA_BUILD_DIR]          (settings by environment variable)
#   PGD_BUILD_DIR     Pagoda's build dir, holding pagoda and bench/bench_engine (default:
#                     the argument, else build)
#   LLAMA_CPP_DIR     llama.cpp's dir holding llama-bench and llama-server, or its build/bin
#                     (or build/, bin/); unset: llama.cpp is skipped, Pagoda's columns only
#   LLAMA_CPP_DIR_AVX2  the llama.cpp build for the avx2 level (default LLAMA_CPP_DIR)
#   ISAS              space-separated ISA levels to run, each as PGD_ISA (default: $PGD_ISA
#                     when set; else "avx512 avx2" on a CPU with AVX-512, else the default)
#   REPS              repetitions (default 3)
#   DEPTHS            comma-separated context depths (default 0,2048,8192)
#   KV_TYPES          comma-separated KV cache types (default f16,q8_0)
#   THREADS           threads (default 2)
#   PP, TG            prompt tokens per prefill test, tokens per decode test (512, 32)
#   SERVE             0: no serving rows (default 1)
#   KERNELS           0: no prefill and decode rows, the serving rows only (default 1)
#   MODEL             a GGUF to use instead of the synthetic 1b q8_0 one
#   QUICK             1: a smoke run: one repetition, depth 0, PP 64, TG 8, serving with a
#                     128-token system prompt, 16-token questions and answers, 2 groups of 4
#                     (timings meaningless; it checks that every step runs)
#   TMPDIR            where the temp dir goes (default /tmp)
# Exit status: 0, 1 (a step failed), 2 (usage). The targets are reported, not enforced.
set -euo pipefail

me=vs_llama.sh
die() {
    echo "$me: $*" >&2
    exit 1
}
case "${1:-}" in
-h | --help) sed -n '/^# Usage:/,/^# Exit status/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
[ $# -le 1 ] || { echo "$me: one argument at most, the build dir (see --help)" >&2; exit 2; }

build=${PGD_BUILD_DIR:-${1:-build}}
pagoda="$build/pagoda"
bench="$build/bench/bench_engine"
quick=${QUICK:-0}
reps=${REPS:-3}
depths=${DEPTHS:-0,2048,8192}
kv_types=${KV_TYPES:-f16,q8_0}
threads=${THREADS:-2}
pp=${PP:-512}
tg=${TG:-32}
serve=${SERVE:-1}
kernels=${KERNELS:-1}
sys_tokens=1157
q_tokens=32
o_tokens=64
per_group=8
groups_b=4
if [ "$quick" = 1 ]; then
    reps=1 depths=0 pp=64 tg=8 sys_tokens=128 q_tokens=16 o_tokens=16 per_group=4 groups_b=2
fi
[ "$kernels" = 1 ] || [ "$serve" = 1 ] || { echo "$me: KERNELS=0 and SERVE=0: nothing to run" >&2; exit 2; }
[ "$kernels" = 1 ] || kv_types=f16
for n in "$reps" "$threads" "$pp" "$tg"; do
    case "$n" in '' | *[!0-9]* | 0) echo "$me: '$n' is not a positive number" >&2; exit 2 ;; esac
done
case "$depths" in '' | *[!0-9,]*) echo "$me: DEPTHS '$depths': not a list of numbers" >&2; exit 2 ;; esac
[ -x "$pagoda" ] || die "$pagoda: not an executable (PGD_BUILD_DIR)"
[ -x "$bench" ] || die "$bench: not an executable (PGD_BUILD_DIR; -DPGD_BUILD_BENCH=ON)"
IFS=, read -r -a kvs <<<"$kv_types"

# The llama.cpp binaries of one dir: sets lb (llama-bench) and ls (llama-server).
find_llama() {
    local d
    lb= ls=
    for d in "$1" "$1/build/bin" "$1/build" "$1/bin"; do
        if [ -x "$d/llama-bench" ]; then
            lb="$d/llama-bench"
            [ -x "$d/llama-server" ] && ls="$d/llama-server"
            return 0
        fi
    done
    return 1
}
llama=${LLAMA_CPP_DIR:-}
if [ -n "$llama" ]; then
    find_llama "$llama" || die "LLAMA_CPP_DIR=$llama: no llama-bench in it, nor in build/bin"
    [ -n "$ls" ] || echo "$me: no llama-server beside $lb: the serving rows are Pagoda's only" >&2
fi

if [ -n "${ISAS:-}" ]; then
    isas=$ISAS
elif [ -n "${PGD_ISA:-}" ]; then
    isas=$PGD_ISA
elif grep -qw avx512f /proc/cpuinfo 2>/dev/null && grep -qw avx512_vnni /proc/cpuinfo; then
    isas="avx512 avx2"
else
    isas=default
fi

dir=$(mktemp -d "${TMPDIR:-/tmp}/vs_llama.XXXXXX")
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

if [ -n "${MODEL:-}" ]; then
    model=$MODEL
    [ -f "$model" ] || die "MODEL=$model: no such file"
else
    model="$dir/1b-q8_0.gguf"
    echo "$me: making the model: pagoda synth-model --shape 1b --type q8_0"
    "$pagoda" synth-model --shape 1b --type q8_0 -o "$model" >"$dir/synth.log" 2>&1 ||
        { cat "$dir/synth.log" >&2; die "synth-model failed"; }
fi
: >"$dir/results" # lines: isa engine kind depth kv rep value

# ---- one run of each side ----

# The command prefix that runs a program on ISA $1: `env PGD_ISA=$1` (nothing for "default",
# which leaves PGD_ISA as it is). Sets isa_env.
set_isa_env() {
    isa_env=()
    [ "$1" = default ] || isa_env=(env "PGD_ISA=$1")
}

# bench_engine for ISA $1, rep $2, KV type $3: appends "pp"/"tg" rows to the results.
run_pagoda() {
    local out
    set_isa_env "$1"
    out=$("${isa_env[@]}" "$bench" --model "$model" --pp "$pp" --tg "$tg" --depth "$depths" \
        -t "$threads" --kv-type "$3" --reps 1 2>"$dir/be.err") ||
        { cat "$dir/be.err" >&2; die "bench_engine --kv-type $3 failed"; }
    echo "$out" | awk -v isa="$1" -v rep="$2" -v kv="$3" '
        $1 == "model" { for (i = 1; i < NF; i++) if ($i == "isa") { sub(/,$/, "", $(i + 1)); a = $(i + 1) } }
        $1 == kv && ($3 == "pp" || $3 == "tg") { print isa, "pagoda", $3, $2, kv, rep, $6 }
        $1 == "checksum" { print isa, "pagoda", "checksum", 0, kv, rep, $2 }
        END { print isa, "pagoda", "isa", 0, kv, rep, a }' >>"$dir/results"
    grep -h '^pagoda: PGD_ISA' "$dir/be.err" >&2 || true
}

# llama-bench for rep $2, KV type $3 with the binaries of ISA $1's build.
run_llama() {
    local args=(-m "$model" -t "$threads" -fa "$lb_fa" -ctk "$3" -ctv "$3" -p "$pp" -n "$tg" -r 1
        -o md)
    [ "$lb_depth" = 1 ] && args+=(-d "$depths")
    "$lb" "${args[@]}" >"$dir/lb.out" 2>"$dir/lb.err" ||
        { cat "$dir/lb.err" >&2; die "llama-bench failed: $lb ${args[*]}"; }
    # its "build: <commit> (<number>)" line, for the table's header
    sed -n 's/^build: //p' "$dir/lb.out" | head -1 >"$dir/llama_build.$1"
    # md rows: | model | ... | test | t/s |, test "pp512", "tg32", "pp512 @ d2048" (older: "pp 512")
    awk -F'|' -v isa="$1" -v rep="$2" -v kv="$3" '
        NF > 3 && $(NF - 1) ~ /[0-9]/ && $(NF - 2) ~ /(pp|tg) ?[0-9]/ {
            t = $(NF - 2); v = $(NF - 1); d = 0
            if (match(t, /@ *d[0-9]+/)) { d = substr(t, RSTART, RLENGTH); gsub(/[^0-9]/, "", d) }
            k = t ~ /pp/ ? "pp" : "tg"
            split(v, a, " "); print isa, "llama", k, d + 0, kv, rep, a[1]
        }' "$dir/lb.out" >>"$dir/results"
}

# Starts a server in the background: $1 name, then the command; its stdout and stderr go to
# $dir/$1.log. Sets srv_pid.
start_server() {
    local name=$1
    shift
    "$@" >"$dir/$name.log" 2>&1 &
    srv_pid=$!
    pids+=("$srv_pid")
}
stop_server() {
    kill "$srv_pid" 2>/dev/null || true
    wait "$srv_pid" 2>/dev/null || true
}
# Waits until $1/health answers 200 (the model loaded), at most 600 s.
wait_health() {
    local i
    for i in $(seq 1 1200); do
        curl -sf -o /dev/null "$1/health" && return 0
        kill -0 "$srv_pid" 2>/dev/null || return 1
        sleep 0.5
    done
    return 1
}
free_port() {
    local p
    for p in $(seq $((20000 + $$ % 20000)) $((20100 + $$ % 20000))); do
        (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return 0; }
    done
    die "no free port"
}

# `pagoda bench --url $1` on workload $2 (serve1 | serve4): prints output tokens/s.
drive() {
    local g=1 out
    [ "$2" = serve4 ] && g=$groups_b
    out=$("$pagoda" bench --url "$1" --groups "$g" --prompts "$per_group" \
        --system-tokens "$sys_tokens" --question-tokens "$q_tokens" --output-tokens "$o_tokens" \
        --concurrency 8 --seed 1 2>"$dir/drive.err") ||
        { cat "$dir/drive.err" >&2; echo "$out" >&2; return 1; }
    echo "$out" >"$dir/drive.out"
    echo "$out" | awk '/^requests ok \/ failed/ { if ($(NF) != 0) bad = 1 }
        /^output throughput/ { v = $NF } END { if (bad || v == "") exit 1; print v }' ||
        { echo "$out" >&2; return 1; }
}

# One serving run: ISA $1, engine $2 (pagoda | llama), workload $3, rep $4.
run_serve() {
    local url port v ctx=$(((sys_tokens + q_tokens + o_tokens + 64) * 8))
    if [ "$2" = pagoda ]; then
        set_isa_env "$1"
        start_server pagoda "${isa_env[@]}" "$pagoda" serve -m "$model" --port 0 -t "$threads" \
            -c $((sys_tokens + q_tokens + o_tokens + 64))
        for _ in $(seq 1 1200); do
            url=$(sed -n 's/^pagoda serve: listening on \(http:[^ ]*\).*/\1/p' "$dir/pagoda.log")
            [ -n "$url" ] && break
            kill -0 "$srv_pid" 2>/dev/null || break
            sleep 0.5
        done
        [ -n "$url" ] || { cat "$dir/pagoda.log" >&2; die "pagoda serve did not start"; }
    else
        port=$(free_port)
        url="http://127.0.0.1:$port"
        start_server llama "$ls" -m "$model" -t "$threads" -np 8 -c "$ctx" --host 127.0.0.1 \
            --port "$port" "${ls_fa[@]}"
    fi
    wait_health "$url" || { cat "$dir/$2.log" >&2; stop_server; die "$2 server did not start"; }
    v=$(drive "$url" "$3") || { stop_server; die "pagoda bench --url $url ($2, $3) failed"; }
    stop_server
    echo "$1 $2 $3 0 f16 $4 $v" >>"$dir/results"
}

# ---- the runs ----

echo "$me: model $model, $threads threads, $reps reps, depths $depths, KV $kv_types," \
    "pp $pp, tg $tg, ISA levels: $isas"
echo "$me: the machine: $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(nproc) CPUs;" \
    "other processes share it: figures move with their load"
for isa in $isas; do
    lb= ls=
    if [ -n "$llama" ]; then
        d=$llama
        [ "$isa" = avx2 ] && [ -n "${LLAMA_CPP_DIR_AVX2:-}" ] && d=$LLAMA_CPP_DIR_AVX2
        find_llama "$d" || die "$d: no llama-bench"
        # -fa takes on|off|auto in newer llama-bench, 0|1 before; -d came in mid-2025.
        lb_help=$("$lb" --help 2>&1 || true)
        lb_fa=1
        echo "$lb_help" | grep -- '--flash-attn' | grep -q 'on|off' && lb_fa=on
        lb_depth=0
        echo "$lb_help" | grep -q -- '--n-depth' && lb_depth=1
        [ "$lb_depth" = 1 ] || echo "$me: $lb has no -d: llama.cpp rows at depth 0 only" >&2
        ls_fa=(-fa)
        if [ -n "$ls" ]; then
            "$ls" --help 2>&1 | grep -- '--flash-attn' | grep -q 'on|off' && ls_fa=(-fa on)
        fi
        echo "$me: [$isa] llama.cpp: $lb (-fa $lb_fa)"
    fi
    for r in $(seq 1 "$reps"); do
        for kv in "${kvs[@]}"; do
            [ "$kernels" = 1 ] || break
            if [ -z "$lb" ]; then
                run_pagoda "$isa" "$r" "$kv"
            elif [ $((r % 2)) = 1 ]; then
                run_llama "$isa" "$r" "$kv"
                run_pagoda "$isa" "$r" "$kv"
            else
                run_pagoda "$isa" "$r" "$kv"
                run_llama "$isa" "$r" "$kv"
            fi
            echo "$me: [$isa] rep $r kv $kv:" $(awk -v i="$isa" -v r="$r" -v k="$kv" \
                '$1 == i && $6 == r && $5 == k && ($3 == "pp" || $3 == "tg") {
                    printf "%s %s d%s %s; ", $2, $3, $4, $7 }' "$dir/results")
        done
        if [ "$serve" = 1 ]; then
            for w in serve1 serve4; do
                if [ -z "$ls" ]; then
                    run_serve "$isa" pagoda "$w" "$r"
                elif [ $((r % 2)) = 1 ]; then
                    run_serve "$isa" llama "$w" "$r"
                    run_serve "$isa" pagoda "$w" "$r"
                else
                    run_serve "$isa" pagoda "$w" "$r"
                    run_serve "$isa" llama "$w" "$r"
                fi
                echo "$me: [$isa] rep $r $w:" $(awk -v i="$isa" -v r="$r" -v w="$w" \
                    '$1 == i && $6 == r && $3 == w { printf "%s %s t/s; ", $2, $7 }' \
                    "$dir/results")
            done
        fi
    done
done

# ---- the table ----

echo
awk -v isas="$isas" -v depths="$depths" -v kvs="$kv_types" -v pp="$pp" -v tg="$tg" \
    -v threads="$threads" -v reps="$reps" -v have_llama="${llama:+1}" -v serve="$serve" \
    -v sys="$sys_tokens" -v q="$q_tokens" -v o="$o_tokens" -v pg="$per_group" \
    -v gb="$groups_b" -v model="$(basename "$model")" -v quick="$quick" -v kernels="$kernels" \
    -v lbuild="$(cat "$dir"/llama_build.* 2>/dev/null | head -1)" '
function median(a, n,   i, j, t, b) {
    for (i = 1; i <= n; i++) b[i] = a[i]
    for (i = 2; i <= n; i++) for (j = i; j > 1 && b[j] < b[j - 1]; j--) {
        t = b[j]; b[j] = b[j - 1]; b[j - 1] = t }
    return n % 2 ? b[(n + 1) / 2] : (b[n / 2] + b[n / 2 + 1]) / 2
}
# "median (min-max)" of the reps of one key; "-" when none.
function cell(key,   r, n, a, lo, hi, v) {
    n = 0
    for (r = 1; r <= reps; r++) if ((key, r) in val) {
        v = val[key, r]; a[++n] = v
        if (n == 1 || v < lo) lo = v
        if (n == 1 || v > hi) hi = v
    }
    if (!n) return "-"
    if (n == 1) return sprintf("%.2f", a[1])
    return sprintf("%.2f (%.2f-%.2f)", median(a, n), lo, hi)
}
# the median over the reps of the paired ratio pagoda / llama
function ratio(kp, kl,   r, n, a) {
    n = 0
    for (r = 1; r <= reps; r++) if ((kp, r) in val && (kl, r) in val && val[kl, r] > 0)
        a[++n] = val[kp, r] / val[kl, r]
    return n ? sprintf("**%.2fx**", median(a, n)) : "-"
}
function row(label, kp, kl) {
    if (have_llama) printf "| %s | %s | %s | %s |\n", label, cell(kl), cell(kp), ratio(kp, kl)
    else printf "| %s | %s |\n", label, cell(kp)
}
{
    if ($3 == "checksum") { ck[$1, $5, $6] = $7; next }
    if ($3 == "isa") { got_isa[$1] = $7; next }
    val[$1 SUBSEP $2 SUBSEP $3 SUBSEP $4 SUBSEP $5, $6] = $7
}
END {
    ni = split(isas, il, " "); nd = split(depths, dl, ","); nk = split(kvs, kl, ",")
    bad = 0
    for (i = 1; i <= ni; i++) {
        isa = il[i]
        printf "### Pagoda isa %s (PGD_ISA=%s), %s, %s threads, %d rep%s%s\n\n",
            (got_isa[isa] != "" ? got_isa[isa] : isa),
            (isa == "default" ? "unset" : isa), model, threads, reps, (reps > 1 ? "s" : ""),
            (quick ? ", QUICK (smoke sizes: timings meaningless)" : "")
        if (have_llama) {
            printf "| %s, %s threads | llama.cpp (llama-bench, -fa on) | Pagoda (bench_engine) | Pagoda / llama.cpp |\n", model, threads
            print "|---|---:|---:|---:|"
        } else {
            printf "| %s, %s threads | Pagoda (bench_engine) |\n", model, threads
            print "|---|---:|"
        }
        for (t = 0; kernels && t < 2; t++) for (d = 1; d <= nd; d++) for (k = 1; k <= nk; k++) {
            test = t ? "tg" : "pp"
            label = t ? sprintf("decode tg%d, %s KV, depth %d", tg, kl[k], dl[d]) \
                      : sprintf("prefill pp%d, %s KV, depth %d", pp, kl[k], dl[d])
            row(label, isa SUBSEP "pagoda" SUBSEP test SUBSEP dl[d] SUBSEP kl[k],
                isa SUBSEP "llama" SUBSEP test SUBSEP dl[d] SUBSEP kl[k])
        }
        if (serve) {
            row(sprintf("serving: %d concurrent, shared %d-token system prompt, %d-token questions, %d-token answers (output t/s)", pg < 8 ? pg : 8, sys, q, o),
                isa SUBSEP "pagoda" SUBSEP "serve1" SUBSEP 0 SUBSEP "f16",
                isa SUBSEP "llama" SUBSEP "serve1" SUBSEP 0 SUBSEP "f16")
            row(sprintf("serving: %d groups, %d requests, 8 concurrent (output t/s)", gb, gb * pg),
                isa SUBSEP "pagoda" SUBSEP "serve4" SUBSEP 0 SUBSEP "f16",
                isa SUBSEP "llama" SUBSEP "serve4" SUBSEP 0 SUBSEP "f16")
        }
        for (k = 1; k <= nk; k++) for (r = 2; r <= reps; r++)
            if (ck[isa, kl[k], r] != ck[isa, kl[k], 1]) bad = 1
        printf "\n"
    }
    if (have_llama && lbuild != "") print "llama.cpp build: " lbuild
    if (have_llama) print "(t/s: median (min-max) over the reps; ratio: the median of each rep'"'"'s paired ratio)"
    else print "(t/s: median (min-max) over the reps; llama.cpp skipped: LLAMA_CPP_DIR not set)"
    if (kernels) print "checksums (bench_engine greedy tokens per isa and KV type, the same in every rep):"
    for (i = 1; kernels && i <= ni; i++) for (k = 1; k <= nk; k++)
        printf "  %s %s: %s\n", il[i], kl[k], ck[il[i], kl[k], 1]
    if (bad) { print "vs_llama.sh: checksums differ between reps" > "/dev/stderr"; exit 1 }
}' "$dir/results"
