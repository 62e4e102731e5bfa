#!/usr/bin/env bash
# Build llama.cpp's own server (llama-server) from the llama.cpp source vendored in the pinned
# llama-cpp-python sdist, with the same CPU flags as the wheel setup.sh builds, so the bench's
# llama-server peer runs the same kernels as draftless. The binary is cached under
#   ${DRAFTLESS_CACHE:-~/.cache/draftless}/llama-server-<key>/llama-server
# keyed by version + flags (the wheel's key), and its path is printed on stdout.
# Idempotent: a cached binary is reused. Needs cmake, ninja and a C++ compiler; the build took 37
# minutes here on 2 cores shared with another build (206 steps).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
LLAMA_CPP_VERSION=0.3.36  # keep equal to setup.sh's
# shellcheck source=cpu-flags.sh
source scripts/cpu-flags.sh
LLAMA_CPP_FLAGS=${LLAMA_CPP_FLAGS:-$(llama_cpp_flags)}
CACHE=${DRAFTLESS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/draftless}
key=$(llama_cpp_flags_key "$LLAMA_CPP_VERSION" "$LLAMA_CPP_FLAGS")
dest="$CACHE/llama-server-$key"

if [ -x "$dest/llama-server" ]; then
  echo "$dest/llama-server"
  exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/draftless-llama-server.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "draftless: building llama-server from llama-cpp-python $LLAMA_CPP_VERSION" >&2
echo "draftless: flags $LLAMA_CPP_FLAGS" >&2
"$PYTHON" -m pip --disable-pip-version-check -q download --no-binary :all: --no-deps \
  -d "$work" "llama-cpp-python==$LLAMA_CPP_VERSION" 2>&1 \
  | { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2
tar -xzf "$work"/llama_cpp_python-"$LLAMA_CPP_VERSION".tar.gz -C "$work"
src="$work/llama_cpp_python-$LLAMA_CPP_VERSION/vendor/llama.cpp"
# shellcheck disable=SC2086  # the flags are a word list
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release $LLAMA_CPP_FLAGS \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF >&2
cmake --build "$work/build" --target llama-server -j "$(nproc)" >&2
mkdir -p "$dest.tmp"
cp "$work/build/bin/llama-server" "$dest.tmp/llama-server"
printf '%s\n' "llama-cpp-python $LLAMA_CPP_VERSION" "$LLAMA_CPP_FLAGS" >"$dest.tmp/BUILD-INFO"
rm -rf "$dest" && mv "$dest.tmp" "$dest"
echo "$dest/llama-server"
