#!/usr/bin/env bash
# demo.sh - the main job: `pagoda bench` on a short shared-prefix workload against a
# `pagoda serve` it spawns on the default model, once with the prefix cache and once
# without, printing the table (throughput, TTFT/ITL percentiles, prefix hit ratio, KV
# usage peak, prompt tokens computed) and the ratio. Finishes in a few seconds on 2 cores.
#
# Usage: scripts/demo.sh [-m MODEL.gguf] [more `pagoda bench` options...]
# The model: -m, else stories260K.gguf from $PGD_MODELS_DIR or ../shared/models, else the
# synthetic tiny model the build writes (build/models/synthetic-tiny.gguf: random weights).
# The build directory is ./build, or $PGD_BUILD_DIR (scripts/setup.sh makes it).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${PGD_BUILD_DIR:-build}
BIN=$BUILD/pagoda
if [ ! -x "$BIN" ]; then
    echo "demo: $BIN not found: run scripts/setup.sh first" >&2
    exit 1
fi

if ! "$BIN" bench --help >/dev/null 2>&1; then
    echo "demo: $BIN has no 'bench' command: rebuild it (scripts/setup.sh)" >&2
    exit 1
fi

model=""
if [ "${1:-}" = "-m" ] || [ "${1:-}" = "--model" ]; then
    if [ $# -lt 2 ]; then
        echo "demo: $1 needs a model file" >&2
        exit 2
    fi
    model=$2
    shift 2
fi
random=0
if [ -z "$model" ]; then
    for d in "${PGD_MODELS_DIR:-}" ../shared/models; do
        if [ -n "$d" ] && [ -f "$d/stories260K.gguf" ]; then
            model=$d/stories260K.gguf
            break
        fi
    done
fi
if [ -z "$model" ]; then
    model=$BUILD/models/synthetic-tiny.gguf
    random=1
    if [ ! -f "$model" ]; then
        mkdir -p "$BUILD/models"
        "$BIN" synth-model --shape tiny --seed 1 -o "$model" >/dev/null
    fi
fi
if [ ! -f "$model" ]; then
    echo "demo: model $model not found" >&2
    exit 1
fi

if [ $random -eq 1 ]; then
    cat <<MSG
========================================================================================
  NOTE: stories260K.gguf was not found, so this demo uses $model,
  a SYNTHETIC model with RANDOM WEIGHTS made by the build: its text is noise, but the
  cache figures below are real. Put stories260K.gguf in \$PGD_MODELS_DIR (or give -m).
========================================================================================
MSG
fi
echo "demo: 32 requests (4 system prompts of 448 tokens, each shared by 8 prompts that add 16"
echo "      tokens; 16 output tokens each) against pagoda serve -m $model -c 512,"
echo "      once with the prefix cache and once without it"
echo

# 448 + 16 + 16 = 480 tokens per request, so the server runs with a 512-token context:
# stories260K was trained on 128, but text quality is beside the point here, and prompts
# this long make the saved prefill stand well clear of timing noise on a busy machine.
"$BIN" bench -m "$model" --groups 4 --prompts 8 --system-tokens 448 --question-tokens 16 \
    --output-tokens 16 --concurrency 8 -c 512 "$@"

cat <<MSG

To serve the model yourself:   $BIN serve -m $model --port 8080
and call it:                   curl -s localhost:8080/v1/completions -H 'Content-Type: application/json' \\
                                 -d '{"prompt": "Once upon a time", "max_tokens": 32}'
MSG
