#!/usr/bin/env bash
# setup.sh - installs what the build needs (Debian 12 packages, only those missing),
# then configures and builds Pagoda in ./build (or $PGD_BUILD_DIR).
# Usage: scripts/setup.sh [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(gcc g++ make cmake pkgconf git libxxhash-dev liblz4-dev libzstd-dev libjansson-dev libpcre2-dev clang clang-format libclang-rt-14-dev
      valgrind libmicrohttpd-dev libcurl4-openssl-dev strace
      libhiredis-dev libssl-dev redis-server redis-tools
      gnuplot-nox)
missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js + npm drive the server tests (the official `openai` client); the machine's own
# Node (for example NodeSource's, which bundles npm) is used when there is one.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO=sudo
    echo "setup: installing ${missing[*]}" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The server tests' one npm dependency (the official `openai` client), pinned by the lockfile.
if [ -f tests/server/package-lock.json ] && [ ! -d tests/server/node_modules/openai ]; then
    echo "setup: npm ci in tests/server" >&2
    (cd tests/server && npm ci --no-audit --no-fund --loglevel=error)
fi

BUILD=${PGD_BUILD_DIR:-build}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPGD_WERROR=ON "$@" >/dev/null
cmake --build "$BUILD" -j"$(nproc)"
