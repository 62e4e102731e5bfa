#!/usr/bin/env bash
# llama.cpp's CMake flags for the CPU in hand, shared by setup.sh (the llama-cpp-python wheel) and
# build-llama-server.sh (llama.cpp's own server), so both run the same kernels.
#
# Sourced: defines llama_cpp_flags, which reads a /proc/cpuinfo "flags" line (its argument, or
# this machine's first one) and prints the flags. Run directly: prints this machine's flags.
#
# - GGML_NATIVE=OFF always: a native build crashed in ggml's AMX kernels on one machine of this
#   kind, and -march=native bakes in whatever the build host has.
# - AVX-512 (F, BW, VL, DQ: the set GGML_AVX512 compiles for) where the CPU has all four, with
#   VNNI, BF16 and VBMI each where present; AMX always off.
# - Otherwise x86-64-v3 (AVX2 + FMA + F16C). This string is byte-for-byte the one setup.sh used
#   before it detected anything, so the wheel cache keyed by it stays valid.

llama_cpp_flags() {
  local line=${1-}
  if [ $# -eq 0 ]; then
    line=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
  fi
  # One flag a line, padded, so a flag matches whole ("avx512f" never matches "avx512fp16").
  local have=" ${line#*:} "
  _lcf_has() { case "$have" in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
  local base="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
  if _lcf_has avx512f && _lcf_has avx512bw && _lcf_has avx512vl && _lcf_has avx512dq; then
    local flags="$base -DGGML_AVX512=ON"
    if _lcf_has avx512_vnni; then flags="$flags -DGGML_AVX512_VNNI=ON"; else flags="$flags -DGGML_AVX512_VNNI=OFF"; fi
    if _lcf_has avx512_bf16; then flags="$flags -DGGML_AVX512_BF16=ON"; else flags="$flags -DGGML_AVX512_BF16=OFF"; fi
    if _lcf_has avx512vbmi; then flags="$flags -DGGML_AVX512_VBMI=ON"; else flags="$flags -DGGML_AVX512_VBMI=OFF"; fi
    printf '%s\n' "$flags -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
  else
    # AMX needs AVX-512 in ggml's CMake and defaults to OFF with GGML_NATIVE=OFF.
    printf '%s\n' "$base -DGGML_AVX512=OFF"
  fi
}

# The cache key of a build: the version and the flags, as setup.sh has always computed it.
llama_cpp_flags_key() {
  printf '%s %s' "$1" "$2" | sha256sum | cut -c1-12
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  llama_cpp_flags "$@"
fi
