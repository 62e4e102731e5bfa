#!/usr/bin/env bash
# Build the llama-cpp-python wheel draftless runs on: the pinned sdist, its vendored llama.cpp
# patched with patches/llama.cpp/*.patch (in order), compiled with this CPU's flags
# (scripts/cpu-flags.sh). Used by setup.sh; run directly to rebuild by hand:
#
#     scripts/build-llama-cpp-wheel.sh OUT_DIR [PYTHON]
#
# writes OUT_DIR/llama_cpp_python-*.whl (OUT_DIR is replaced only when the build succeeded).
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:?usage: build-llama-cpp-wheel.sh OUT_DIR [PYTHON]}
PYTHON=${2:-${PYTHON:-python3}}
LLAMA_CPP_VERSION=${LLAMA_CPP_VERSION:-0.3.36}
# shellcheck source=cpu-flags.sh
source scripts/cpu-flags.sh
LLAMA_CPP_FLAGS=${LLAMA_CPP_FLAGS:-$(llama_cpp_flags)}

quiet_pip() {
  # This machine's pip config names local indexes that may be absent: drop those warnings.
  "$PYTHON" -m pip --disable-pip-version-check -q "$@" 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2
}

work=$(mktemp -d "${TMPDIR:-/tmp}/draftless-llama-cpp.XXXXXX")
trap 'rm -rf "$work" "$out.tmp"' EXIT
quiet_pip download --no-binary :all: --no-deps -d "$work" "llama-cpp-python==$LLAMA_CPP_VERSION"
tar -xzf "$work/llama_cpp_python-$LLAMA_CPP_VERSION.tar.gz" -C "$work"
sdist="$work/llama_cpp_python-$LLAMA_CPP_VERSION"
for p in patches/llama.cpp/*.patch; do
  echo "draftless: applying $p" >&2
  patch -p1 --quiet --forward -d "$sdist/vendor/llama.cpp" <"$p"
done
rm -rf "$out.tmp" && mkdir -p "$out.tmp"
CMAKE_ARGS="$LLAMA_CPP_FLAGS" quiet_pip wheel --no-cache-dir --no-deps -w "$out.tmp" "$sdist"
ls "$out.tmp"/llama_cpp_python-*.whl >/dev/null
rm -rf "$out" && mv "$out.tmp" "$out"
