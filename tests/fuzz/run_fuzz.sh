#!/usr/bin/env bash
# run_fuzz.sh - one short libFuzzer run of one target, as a ctest test (label "fuzzrun",
# registered by tests/fuzz/CMakeLists.txt in a -DPGD_FUZZ=ON build; scripts/test.sh runs them).
#
#     run_fuzz.sh FUZZER CORPUS WORKDIR [libFuzzer options...]
#
# Fuzzes for $PGD_FUZZ_SECONDS seconds (default 20), starting from the committed corpus
# CORPUS, which libFuzzer first replays. New inputs go to WORKDIR/new (emptied first), never
# into CORPUS, so the committed corpus does not grow on every run. Any failure (crash,
# sanitizer report, leak, timeout, out of memory) fails the test, and the input that caused
# it is copied into CORPUS (unless CORPUS already holds the same bytes) so that the corpus
# replayer (fuzz_<target>_replay) keeps it as a regression test; the path is printed.
# Exits 0 or 1.
set -u
if [ $# -lt 3 ]; then
    echo "usage: run_fuzz.sh FUZZER CORPUS WORKDIR [libFuzzer options...]" >&2
    exit 1
fi
fuzzer=$1 corpus=$2 work=$3
shift 3
secs=${PGD_FUZZ_SECONDS:-20}
name=$(basename "$fuzzer")

rm -rf "$work"
mkdir -p "$work/new" "$work/artifacts"
# -timeout: an input that runs for 25 s is a hang (every corpus input takes milliseconds).
# The first corpus directory receives the new inputs.
"$fuzzer" -max_total_time="$secs" -timeout=25 -print_final_stats=1 \
    -artifact_prefix="$work/artifacts/" "$@" "$work/new" "$corpus"
rc=$?
[ $rc -eq 0 ] && exit 0

kept=0
for f in "$work"/artifacts/*; do
    [ -f "$f" ] || continue
    case $(basename "$f") in slow-unit-*) continue ;; esac # slow, not failing
    dup=""
    for c in "$corpus"/*; do
        if [ -f "$c" ] && cmp -s "$f" "$c"; then
            dup=$c
            break
        fi
    done
    if [ -n "$dup" ]; then
        echo "run_fuzz: $name failed on $dup, already in the corpus" >&2
    else
        cp "$f" "$corpus/" && echo "run_fuzz: $name failed; the input is kept as" \
            "$corpus/$(basename "$f")" >&2
    fi
    kept=1
done
[ $kept -eq 1 ] || echo "run_fuzz: $name exited with $rc and left no input" >&2
exit 1
