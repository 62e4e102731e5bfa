#!/usr/bin/env bash
# C(k) of two llama-cpp-python wheels on this machine (e.g. the AVX2 and the AVX-512 build),
# swapped into .venv in turn, A B A B, one `draftless probe --no-store` per model and threads:
#
#     benchmarks/probe_builds.sh WHEEL_A WHEEL_B OUT_DIR [MODEL:THREADS ...]
#
# Build the second wheel with, e.g.,
#     LLAMA_CPP_FLAGS="$(bash scripts/cpu-flags.sh 'flags : avx2 fma f16c')" \
#         scripts/build-llama-cpp-wheel.sh /tmp/wheel-avx2 .venv/bin/python
# Writes OUT_DIR/ck-MODEL-Tt-{a,b}-ROUND.txt; reinstalls WHEEL_A at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
a=${1:?usage: probe_builds.sh WHEEL_A WHEEL_B OUT_DIR [MODEL:THREADS ...]}
b=${2:?}
out=${3:?}
shift 3
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(qwen2.5-coder-1.5b:1 qwen2.5-coder-1.5b:2 qwen2.5-coder-0.5b:1 qwen2.5-coder-0.5b:2 smollm2:2)
mkdir -p "$out"
use() { .venv/bin/python -m pip -q --disable-pip-version-check install --no-deps --force-reinstall "$1" 2>/dev/null; }
trap 'use "$a"' EXIT
for cfg in "${configs[@]}"; do
  model=${cfg%:*} threads=${cfg#*:}
  for round in 1 2; do
    for side in a b; do
      if [ $side = a ]; then use "$a"; else use "$b"; fi
      file="$out/ck-$model-${threads}t-$side-$round.txt"
      .venv/bin/draftless probe -m "$model" --threads "$threads" --no-store > "$file" 2>/dev/null
      echo "$file: $(head -1 "$file")"
    done
  done
done
