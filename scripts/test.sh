#!/usr/bin/env bash
# test.sh - builds and runs the whole test suite: source checks, the normal build's ctest,
# then (unless --quick) an ASan+UBSan pass over unit/fault/integration/fuzz tests and a
# TSan pass over the threaded tests.
# Usage: scripts/test.sh [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
[ "${1:-}" = "--quick" ] && quick=1

rm -f build/ctest.log build-asan/ctest.log build-tsan/ctest.log
scripts/setup.sh
scripts/checksrc
echo "== clang-format =="
clang-format --dry-run --Werror $(git ls-files '*.c' '*.h' 2>/dev/null || find src include tools tests bench examples -name '*.[ch]')
echo "clang-format: ok"
(cd build && ctest --output-on-failure -j2) 2>&1 | tee build/ctest.log

echo "== install + pkg-config client =="
rm -rf build/_install
cmake --install build --prefix "$PWD/build/_install" >/dev/null
PKG_CONFIG_PATH="$PWD/build/_install/lib/pkgconfig:$PWD/build/_install/lib/x86_64-linux-gnu/pkgconfig" \
    sh -c 'cc -std=c11 -Wall -Wextra -Werror examples/prefix_share.c \
           $(pkg-config --cflags pagoda) $(pkg-config --libs --static pagoda) -o build/prefix_share'
build/prefix_share

if [ $quick -eq 0 ]; then
    echo "== ASan + UBSan =="
    PGD_BUILD_DIR=build-asan scripts/setup.sh -DPGD_SANITIZE=address,undefined \
        -DPGD_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Debug
    (cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j2 -LE thread) \
        2>&1 | tee build-asan/ctest.log
    echo "== TSan =="
    PGD_BUILD_DIR=build-tsan scripts/setup.sh -DPGD_SANITIZE=thread \
        -DPGD_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Debug
    (cd build-tsan && ctest --output-on-failure -L thread) 2>&1 | tee build-tsan/ctest.log
fi
# One closing line over every pass: "N passed, N failed".
cat build/ctest.log build-asan/ctest.log build-tsan/ctest.log 2>/dev/null |
    awk '/tests passed, [0-9]+ tests failed out of/ {
             for (i = 1; i <= NF; i++) if ($i == "out") total += $(i + 2)
             for (i = 1; i <= NF; i++) if ($i == "failed") failed += $(i - 2)
         }
         END { printf "all passes: %d passed, %d failed\n", total - failed, failed }'

