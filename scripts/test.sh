#!/usr/bin/env bash
# test.sh - builds and runs the whole test suite:
#   - source checks (checksrc, clang-format);
#   - the normal build's ctest (build/);
#   - libpagoda alone (build-lib/: PGD_BUILD_ENGINE/SERVER/TOOLS=OFF and PGD_WITH_REDIS=OFF,
#     so libxxhash, liblz4 and libzstd are the only packages looked for, which the script
#     checks): its own tests, then installed, and every examples/*.c built against the
#     installed library through pkg-config and run;
#   - unless --quick: an ASan+UBSan pass (build-asan/) over everything but the threaded tests
#     (-LE thread), plus the server's HTTP tests (-L http) and the Redis tests (-L redis), and
#     a TSan pass (build-tsan/) over the threaded tests (-L thread, the HTTP and Redis tests
#     among them), and a libFuzzer pass
#     (build-fuzz/: clang, -DPGD_FUZZ=ON, only the fuzz binaries built) that fuzzes every
#     target for $PGD_FUZZ_SECONDS seconds (default 20) from its corpus (ctest -L fuzzrun,
#     tests/fuzz/run_fuzz.sh); a failure's input is copied into tests/fuzz/corpus/<target>/
#     and its path printed, new inputs stay in build-fuzz/tests/fuzz/run/.
# A failing test does not stop the run: every pass runs, the closing line counts them all,
# "all passes: N passed, N failed, N skipped", and the script exits 1 when any test failed.
# A build or check error stops it at once.
# Usage: scripts/test.sh [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
[ "${1:-}" = "--quick" ] && quick=1

logs=(build/ctest.log build-lib/ctest.log build-asan/ctest.log build-tsan/ctest.log
      build-fuzz/ctest.log)
rm -f "${logs[@]}"
failed=0

# run_ctest DIR [ctest args...]: runs ctest in DIR, appending to DIR/ctest.log; a failure is
# remembered and the script goes on.
run_ctest() {
    local dir=$1
    shift
    (cd "$dir" && ctest --output-on-failure "$@") 2>&1 | tee -a "$dir/ctest.log" || failed=1
}

scripts/setup.sh
scripts/checksrc
echo "== clang-format =="
clang-format --dry-run --Werror $(git ls-files '*.c' '*.h' 2>/dev/null || find src include tools tests bench examples -name '*.[ch]')
echo "clang-format: ok"
run_ctest build -j2

echo "== libpagoda alone (build-lib: engine, server, tools, redis OFF) =="
rm -f build-lib/CMakeCache.txt # a fresh configure, so the lookup check below sees only it
PGD_BUILD_DIR=build-lib scripts/setup.sh -DPGD_BUILD_ENGINE=OFF -DPGD_BUILD_SERVER=OFF \
    -DPGD_BUILD_TOOLS=OFF -DPGD_BUILD_BENCH=OFF -DPGD_WITH_REDIS=OFF
# Every pkg-config lookup leaves __pkg_config_checked_<PREFIX> in the cache.
looked=$(sed -n 's/^__pkg_config_checked_\([A-Za-z0-9_]*\):.*/\1/p' build-lib/CMakeCache.txt |
    sort | tr '\n' ' ')
if [ "$looked" != "LZ4 XXHASH ZSTD " ]; then
    echo "build-lib: the library alone looked for more than libxxhash, liblz4, libzstd: $looked" >&2
    exit 1
fi
echo "build-lib: only libxxhash, liblz4 and libzstd looked for"
run_ctest build-lib -j2

echo "== install + pkg-config clients (examples/*.c) =="
rm -rf build-lib/_install build-lib/examples
cmake --install build-lib --prefix "$PWD/build-lib/_install" >/dev/null
if [ -e build-lib/_install/bin/pagoda ]; then
    echo "build-lib: pagoda installed although the tools are OFF" >&2
    exit 1
fi
mkdir -p build-lib/examples
(
    export PKG_CONFIG_PATH="$PWD/build-lib/_install/lib/pkgconfig:$PWD/build-lib/_install/lib/x86_64-linux-gnu/pkgconfig"
    for src in examples/*.c; do # each example runs without arguments and exits 0
        exe=build-lib/examples/$(basename "$src" .c)
        echo "-- $src"
        cc -std=c11 -Wall -Wextra -Werror "$src" $(pkg-config --cflags pagoda) \
            $(pkg-config --libs --static pagoda) -o "$exe"
        "$exe"
    done
)

if [ $quick -eq 0 ]; then
    echo "== ASan + UBSan =="
    PGD_BUILD_DIR=build-asan scripts/setup.sh -DPGD_SANITIZE=address,undefined \
        -DPGD_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Debug
    ASAN_OPTIONS=detect_leaks=1 run_ctest build-asan -j2 -LE thread
    # The HTTP tests are labelled thread too (TSan runs them); ASan runs them here.
    ASAN_OPTIONS=detect_leaks=1 run_ctest build-asan -L http
    # So are the Redis tests (the tier's writer thread); they parse what Redis sends back.
    # (-LE http: the server's Redis tests ran with the HTTP ones just above.)
    ASAN_OPTIONS=detect_leaks=1 run_ctest build-asan -L redis -LE http
    echo "== TSan =="
    PGD_BUILD_DIR=build-tsan scripts/setup.sh -DPGD_SANITIZE=thread \
        -DPGD_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Debug
    run_ctest build-tsan -L thread
    echo "== libFuzzer (build-fuzz: clang, PGD_FUZZ=ON) =="
    cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DPGD_WERROR=ON -DPGD_FUZZ=ON -DPGD_BUILD_BENCH=OFF >/dev/null
    cmake --build build-fuzz -j"$(nproc)" --target fuzzers
    run_ctest build-fuzz -j"$(nproc)" -L '^fuzzrun$'
fi
# One closing line over every pass. ctest counts a skipped test as not failed, so
# passed = total - failed - skipped; the skipped ones are listed as "NN - name (Skipped)".
cat "${logs[@]}" 2>/dev/null |
    awk '/tests passed, [0-9]+ tests? failed out of/ {
             for (i = 1; i <= NF; i++) if ($i == "out") total += $(i + 2)
             for (i = 1; i <= NF; i++) if ($i == "failed") failed += $(i - 2)
         }
         /^[ \t]*[0-9]+ - .* \(Skipped\)$/ { skipped++ }
         END { printf "all passes: %d passed, %d failed, %d skipped\n",
                      total - failed - skipped, failed, skipped }'
exit $failed
