"""Does a verify row equal the single-token row, bitwise, under a llama.cpp configuration?

    PYTHONPATH=src .venv/bin/python benchmarks/llamacpp_exact_rows.py [--model smollm2]
        [--threads 1 2] [--configs today fa-off exact ...]

For each configuration and thread count: prefill c tokens of ordinary text (this
repository's README and sources), then for each width k compare forward(k tokens) with k
forwards of one token from the same position. Prints, per configuration and thread count,
how many (context, width) cells are bitwise equal, the largest |logit difference| and the
number of rows whose argmax differs.

Configurations (fields of llama_context_params / llama_model_params over llama.cpp's
defaults; `exact` is what models/llamacpp.py uses):

    today       flash attention AUTO (= on on CPU), K and V cache f16, weight repacking on
    fa-off      flash attention off
    k16-vbf16   flash attention on, K cache f16, V cache bf16, no weight repacking: what
                models/llamacpp.py uses on a build without patch 0005 (with
                GGML_CPU_TILED_MM=0, which it sets at import; run with GGML_CPU_TILED_MM=1 in
                the environment to see the tiled matmul's part)
    k16-vbf16-repack  the same with repacked weights: what it uses on a build with 0005
    ...         see CONFIGS below (an f32 K or V is cast to f16 for flash attention by
                llama.cpp, so kf32-v16 and k16-vf32 run the `today` kernels)
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from draftless.models import llamacpp
from draftless.models.llamacpp import LlamaCppModel, lib
from draftless.models.registry import resolve

FA_ON, FA_OFF, FA_AUTO = (
    lib.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    lib.LLAMA_FLASH_ATTN_TYPE_DISABLED,
    lib.LLAMA_FLASH_ATTN_TYPE_AUTO,
)
F32, F16, BF16, Q8 = lib.GGML_TYPE_F32, lib.GGML_TYPE_F16, 30, lib.GGML_TYPE_Q8_0

# name -> (context params, model params)
CONFIGS: dict[str, tuple[dict[str, int], dict[str, int]]] = {
    "today": (
        {"flash_attn_type": FA_AUTO, "type_k": F16, "type_v": F16},
        {"use_extra_bufts": True},
    ),
    "fa-off": (
        {"flash_attn_type": FA_OFF, "type_k": F16, "type_v": F16},
        {"use_extra_bufts": True},
    ),
    "fa-on-f32kv": (
        {"flash_attn_type": FA_ON, "type_k": F32, "type_v": F32},
        {"use_extra_bufts": True},
    ),
    "fa-on-k8": (
        {"flash_attn_type": FA_ON, "type_k": Q8, "type_v": F16},
        {"use_extra_bufts": True},
    ),
    "kf32-v16-repack": (
        {"flash_attn_type": FA_ON, "type_k": F32, "type_v": F16},
        {"use_extra_bufts": True},
    ),
    "kf32-v16": (
        {"flash_attn_type": FA_ON, "type_k": F32, "type_v": F16},
        {"use_extra_bufts": False},
    ),
    "k16-vbf16": (
        {"flash_attn_type": FA_ON, "type_k": F16, "type_v": BF16},
        {"use_extra_bufts": False},
    ),
    "kbf16-v16": (
        {"flash_attn_type": FA_ON, "type_k": BF16, "type_v": F16},
        {"use_extra_bufts": False},
    ),
    "bf16": (
        {"flash_attn_type": FA_ON, "type_k": BF16, "type_v": BF16},
        {"use_extra_bufts": False},
    ),
    "k16-vbf16-repack": (
        {"flash_attn_type": FA_ON, "type_k": F16, "type_v": BF16},
        {"use_extra_bufts": True},
    ),
    "k16-vf32": (
        {"flash_attn_type": FA_ON, "type_k": F16, "type_v": F32},
        {"use_extra_bufts": False},
    ),
}
CONTEXTS = (0, 200, 255, 256, 300, 511, 512, 700, 1024, 1500, 2047 - 32)
WIDTHS = (1, 2, 3, 4, 5, 8, 12, 16, 24, 32)


def corpus_ids(model: LlamaCppModel, n: int) -> list[int]:
    root = Path(__file__).resolve().parents[1]
    files = [root / "README.md", *sorted((root / "src" / "draftless").rglob("*.py"))]
    text = "\n".join(f.read_text() for f in files)
    ids = model.tokenizer.encode(text)
    assert len(ids) >= n, len(ids)
    return ids[:n]


def measure(
    model: LlamaCppModel, ids: list[int], contexts, widths, verbose: bool = False
) -> dict[str, float]:
    cells = equal = flips = 0
    worst = 0.0
    for c in contexts:
        model.truncate(0)
        if c:
            model.prefill(ids[:c])
        for k in widths:
            stream = ids[c : c + k]
            batched = model.forward(stream)  # [k, vocab]
            model.truncate(c)
            single = np.concatenate([model.forward([t]) for t in stream])  # [k, vocab]
            model.truncate(c)
            cells += 1
            equal += bool(np.array_equal(batched, single))
            if verbose and not np.array_equal(batched, single):
                rows = [i for i in range(k) if not np.array_equal(batched[i], single[i])]
                print(f"  context {c} width {k}: rows {rows} differ", flush=True)
            worst = max(worst, float(np.abs(batched - single).max()))
            flips += int((batched.argmax(1) != single.argmax(1)).sum())
    return {"cells": cells, "bitwise": equal, "max_abs": worst, "argmax_flips": flips}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS))
    parser.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS))
    parser.add_argument("--widths", type=int, nargs="+", default=list(WIDTHS))
    parser.add_argument("--verbose", action="store_true", help="print every differing cell")
    args = parser.parse_args()
    spec = resolve(args.model)
    for name in args.configs:
        context_params, model_params = CONFIGS[name]
        llamacpp.EXACT_CONTEXT_PARAMS.clear()
        llamacpp.EXACT_CONTEXT_PARAMS.update(context_params)
        llamacpp.EXACT_MODEL_PARAMS.clear()
        llamacpp.EXACT_MODEL_PARAMS.update(model_params)
        for threads in args.threads:
            t0 = time.perf_counter()
            model = LlamaCppModel.load(spec, n_threads=threads, n_ctx=2048)
            try:
                ids = corpus_ids(model, max(args.contexts) + max(args.widths))
                result = measure(model, ids, args.contexts, args.widths, args.verbose)
            finally:
                model.close()
            print(
                f"{args.model} {name:16s} threads={threads}: {result['bitwise']}/{result['cells']}"
                f" bitwise, max |diff| {result['max_abs']:.3g},"
                f" argmax flips {result['argmax_flips']}  ({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )


if __name__ == "__main__":
    main()
