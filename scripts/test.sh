#!/usr/bin/env bash
# test.sh - builds and runs the whole test suite: source checks, the normal build's ctest,
# then (unless --quick) an ASan+UBSan pass over unit/fault/integration/fuzz tests and a
# TSan pass over the threaded tests.
# Usage: scripts/test.sh [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
[ "${1:-}" = "--quick" ] && quick=1

scripts/checksrc
scripts/setup.sh
(cd build && ctest --output-on-failure -j2)

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
    (cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j2 -LE thread)
    echo "== TSan =="
    PGD_BUILD_DIR=build-tsan scripts/setup.sh -DPGD_SANITIZE=thread \
        -DPGD_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Debug
    (cd build-tsan && ctest --output-on-failure -L thread)
fi
echo "all test passes done"
