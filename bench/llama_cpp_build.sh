#!/usr/bin/env bash
# llama_cpp_build.sh - builds the llama.cpp that bench/vs_llama.sh compares against: its
# native build (GGML_NATIVE: the CPU's best kernels) and its AVX2 level (ggml-cpu built
# again with AVX2/FMA/F16C/BMI2 and without AVX-512 or AVX-VNNI, the kernels an AVX2-only
# CPU runs), then prints the two settings vs_llama.sh takes.
#
# Source: SRC, a llama.cpp source tree (a git checkout), or else the llama.cpp source that
# the npm package node-llama-cpp carries (llama/gitRelease.bundle, a git bundle of the
# llama.cpp release it binds; `npm pack` fetches it from the npm registry, so this works
# on a machine that reaches npm but not GitHub). NODE_LLAMA_CPP picks that package's version
# (default: the latest).
#
# The AVX2 level reuses the native build's binaries: DEST/avx2/llama-bench and llama-server
# are wrappers that run them with LD_LIBRARY_PATH set to the AVX2 ggml-cpu, which the
# loader then takes before the native one (the binaries' RUNPATH comes after it). ggml's
# backend scan also dlopens the native libggml-cpu.so beside the binary and closes it again;
# no symbol binds to it (checked with LD_DEBUG=bindings on llama-bench: every ggml-cpu
# symbol, the native library's own references included, binds to the AVX2 one).
#
# Usage: bench/llama_cpp_build.sh DEST [SRC]
#   DEST  a directory for the source (DEST/src, when SRC is not given), the builds
#         (DEST/build-native, DEST/build-avx2) and the wrappers (DEST/avx2)
#   JOBS  parallel compile jobs (default: nproc)
# Needs cmake, a C++ compiler and git; npm without SRC. About 10 minutes on 2 cores.
# Exit status: 0 (then the last two lines are LLAMA_CPP_DIR=... LLAMA_CPP_DIR_AVX2=...),
# 1 (a step failed), 2 (usage).
set -euo pipefail

me=llama_cpp_build.sh
case "${1:-}" in
'' | -h | --help)
    sed -n '/^# Usage:/,/^# Exit status/p' "$0" | sed 's/^# \{0,1\}//'
    [ -n "${1:-}" ] && exit 0
    exit 2
    ;;
esac
[ $# -le 2 ] || { echo "$me: DEST and SRC at most (see --help)" >&2; exit 2; }
die() {
    echo "$me: $*" >&2
    exit 1
}
for t in cmake git; do command -v "$t" >/dev/null || die "$t: not found"; done
mkdir -p "$1"
dest=$(cd "$1" && pwd)
jobs=${JOBS:-$(nproc)}

if [ -n "${2:-}" ]; then
    src=$(cd "$2" && pwd)
    [ -f "$src/CMakeLists.txt" ] && [ -d "$src/ggml" ] || die "$src: not a llama.cpp source tree"
else
    command -v npm >/dev/null || die "npm: not found (or give SRC, a llama.cpp source tree)"
    src="$dest/src"
    if [ ! -f "$src/CMakeLists.txt" ]; then
        tmp=$(mktemp -d "${TMPDIR:-/tmp}/llama_cpp_build.XXXXXX")
        trap 'rm -rf "$tmp"' EXIT
        pkg="node-llama-cpp${NODE_LLAMA_CPP:+@$NODE_LLAMA_CPP}"
        echo "$me: npm pack $pkg (llama.cpp's source as a git bundle)"
        (cd "$tmp" && npm pack --silent "$pkg" >/dev/null) || die "npm pack $pkg failed"
        tar -xzf "$tmp"/node-llama-cpp-*.tgz -C "$tmp" package/llama ||
            die "the package has no llama/ directory"
        [ -f "$tmp/package/llama/gitRelease.bundle" ] ||
            die "the package has no llama/gitRelease.bundle"
        git clone -q "$tmp/package/llama/gitRelease.bundle" "$src" 2>/dev/null ||
            die "cloning the bundle failed"
        cp "$tmp/package/llama/llama.cpp.info.json" "$src/node-llama-cpp.info.json" 2>/dev/null ||
            true
    fi
fi
echo "$me: llama.cpp source $src ($(git -C "$src" log -1 --format='%h %cs' 2>/dev/null || echo 'no git'))"

common=(-DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_OPENSSL=OFF)
echo "$me: native build (GGML_NATIVE=ON): llama-bench, llama-server"
cmake -S "$src" -B "$dest/build-native" "${common[@]}" -DGGML_NATIVE=ON >"$dest/native.log" 2>&1 ||
    { tail -20 "$dest/native.log" >&2; die "cmake (native) failed: $dest/native.log"; }
cmake --build "$dest/build-native" -j "$jobs" --target llama-bench llama-server \
    >>"$dest/native.log" 2>&1 ||
    { tail -20 "$dest/native.log" >&2; die "build (native) failed: $dest/native.log"; }

echo "$me: AVX2 level (ggml-cpu only): AVX2, FMA, F16C, BMI2; no AVX-512, no AVX-VNNI"
cmake -S "$src" -B "$dest/build-avx2" "${common[@]}" -DGGML_NATIVE=OFF -DGGML_AVX=ON \
    -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF \
    -DGGML_AVX_VNNI=OFF >"$dest/avx2.log" 2>&1 ||
    { tail -20 "$dest/avx2.log" >&2; die "cmake (avx2) failed: $dest/avx2.log"; }
cmake --build "$dest/build-avx2" -j "$jobs" --target ggml-cpu >>"$dest/avx2.log" 2>&1 ||
    { tail -20 "$dest/avx2.log" >&2; die "build (avx2) failed: $dest/avx2.log"; }

bin="$dest/build-native/bin"
[ -x "$bin/llama-bench" ] || die "$bin/llama-bench: not built"
cpu_avx2=$(ls "$dest"/build-avx2/bin/libggml-cpu.so* 2>/dev/null | head -1)
[ -n "$cpu_avx2" ] || die "$dest/build-avx2/bin: no libggml-cpu.so (a static build? the wrappers need shared ggml)"
mkdir -p "$dest/avx2"
for b in llama-bench llama-server; do
    [ -x "$bin/$b" ] || continue
    printf '#!/bin/sh\n# %s at the AVX2 level: the native binary with the AVX2 ggml-cpu first\nLD_LIBRARY_PATH="%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "%s" "$@"\n' \
        "$b" "$dest/build-avx2/bin" "$bin/$b" >"$dest/avx2/$b"
    chmod +x "$dest/avx2/$b"
done
# The wrapper must load the AVX2 library: no zmm register in it, and the loader picks it.
if command -v objdump >/dev/null && objdump -d "$cpu_avx2" | grep -q zmm; then
    die "$cpu_avx2 has AVX-512 code: the AVX2 build did not take its flags"
fi
echo "LLAMA_CPP_DIR=$bin"
echo "LLAMA_CPP_DIR_AVX2=$dest/avx2"
