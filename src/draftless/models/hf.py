"""Hugging Face transformers backend: any causal LM transformers loads, behind the model contract.

    model = HFModel.load(resolve("smollm2"))    # a GGUF: converted once, then read from the cache
    model.prefill([5, 9])                       # cache: 5 9
    rows = model.forward([2, 7, 7])             # [3, vocab] float32; cache: 5 9 2 7 7
    model.truncate(4)                           # cache: 5 9 2 7

Where the weights come from:
    a model directory   AutoModelForCausalLM.from_pretrained, in `dtype` (float32 on CPU).
    a GGUF file         transformers' `gguf_file=` path converts the tokenizer and dequantizes
                        every weight to float32 (tens of seconds). The result is saved once
                        with save_pretrained into `cache_dir()/converted/<stem>-<key>`; the key
                        hashes the file's bytes (SHA-256, remembered per path, size and times)
                        and the transformers version, so the same file installed at another
                        path (a new virtualenv, a fresh clone) finds the same conversion. It is
                        written to a temporary sibling and renamed into place, so a directory
                        with that name is always a whole conversion; later loads read its
                        safetensors in about a second. Writing one removes the conversions
                        whose GGUF is gone (`prune_conversions`): the cache does not grow by a
                        model's float32 size with every reinstall.

The cache keeps every position on every layer, so `truncate(n)` can go anywhere; see
`rewindable_cache` for why and how the sliding window is still applied.

Exactness: re-appending the same chunks after a truncate gives bitwise the logits of a fresh run;
a verify batch forward([t0..t7]) matches eight forwards of one to 5e-5 on SmolLM2's float32
logits (2e-6 of their scale: GEMMs over different row counts reassociate), argmax unchanged.

Models whose state cannot be rewound are refused at load with UnsupportedModelError: recurrent and
hybrid architectures (Mamba, RWKV, Jamba, Falcon-H1, Qwen3-Next / Qwen3.5, LFM2, xLSTM, ...) keep a
state that summarizes every past token and cannot be cut back to an earlier position. They are
recognized by model type (and GGUF architecture), by `config.layer_types`, by the cache layers
`DynamicCache(config)` builds, and finally by a one-token probe that must grow the cache by one row.

transformers 5.23 needs `accelerate` to read a GGUF (not for a converted directory).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import operator
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

from draftless.models.base import (
    ContextFull,
    ModelError,
    ModelSpec,
    Tokenizer,
    UnsupportedModelError,
    cache_dir,
)

BACKEND = "hf"
PREFILL_CHUNK = 512  # tokens per prefill forward: bounds the [chunk, context] attention scratch
CONVERTED_MARKER = "draftless-conversion.json"  # written last inside a conversion directory
DIGESTS = "digests.json"  # in converted/: {"path\0size\0mtime\0ctime": the file's sha256}
_READ_CHUNK = 8 << 20

# Architectures that keep a recurrent (or convolutional) state: it folds in every past token and
# cannot be cut back to an earlier position, so a rejected draft could never be taken back.
RECURRENT_MODEL_TYPES = frozenset({
    "bailing_hybrid", "bamba", "falcon_h1", "falcon_mamba", "granitemoehybrid", "jamba",
    "kimi_linear", "lfm2", "lfm2_moe", "lfm2_vl", "lfm3", "lfm3_vl", "mamba", "mamba2", "minimax",
    "nemotron_h", "olmo_hybrid", "plamo2", "qwen3_5", "qwen3_5_moe", "qwen3_next",
    "recurrent_gemma", "rwkv", "xlstm", "zamba", "zamba2",
})  # fmt: skip
# The same families as llama.cpp names them in a GGUF's `general.architecture`: refused before
# spending tens of seconds on a conversion.
RECURRENT_GGUF_ARCHITECTURES = frozenset({
    "bamba", "falcon-h1", "granitehybrid", "jamba", "kimi-linear", "lfm2", "lfm2moe", "mamba",
    "mamba2", "nemotron_h", "plamo2", "qwen35", "qwen35moe", "qwen3next", "rwkv6", "rwkv6qwen2",
    "rwkv7", "arwkv7",
})  # fmt: skip
# `config.layer_types` entries that hold per-token keys and values (or nothing at all).
ATTENTION_LAYER_TYPES = frozenset({
    "full_attention", "sliding_attention", "chunked_attention", "indexed_attention", "dummy", "moe",
    "mlp",
})  # fmt: skip

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float64": torch.float64, "fp64": torch.float64, "double": torch.float64,
}  # fmt: skip


def _one_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    return text.splitlines()[0]


# --- load options -------------------------------------------------------------------------------


def _parse_device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ModelError(f"unknown device {device!r}: use 'cpu', 'cuda' or 'cuda:N'") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelError(f"device {device!r} was asked for but torch sees no CUDA device")
    if dev.type not in ("cpu", "cuda"):
        raise ModelError(f"device {device!r} is not supported: use 'cpu', 'cuda' or 'cuda:N'")
    return dev


def _parse_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """None -> float32 on CPU; on CUDA bfloat16 where supported, else float16."""
    if dtype is None:
        if device.type == "cpu":
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if isinstance(dtype, torch.dtype):
        if dtype in _DTYPES.values():
            return dtype
    elif isinstance(dtype, str) and dtype.lower().removeprefix("torch.") in _DTYPES:
        return _DTYPES[dtype.lower().removeprefix("torch.")]
    raise ModelError(f"unknown dtype {dtype!r}: use float32, bfloat16, float16 or float64")


# --- what can be rewound ------------------------------------------------------------------------


def check_rewindable(config: Any, name: str) -> None:
    """Raise UnsupportedModelError if the architecture keeps state that cannot be cut back."""
    text_config = (
        config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    )
    for cfg in (config, text_config):
        model_type = getattr(cfg, "model_type", None)
        if model_type in RECURRENT_MODEL_TYPES:
            raise UnsupportedModelError(
                f"{name}: {model_type} keeps a recurrent state that cannot be rewound to an "
                "earlier position, which speculative decoding needs; use an attention-only model"
            )
    layer_types = getattr(text_config, "layer_types", None) or ()
    odd = sorted({str(kind) for kind in layer_types} - ATTENTION_LAYER_TYPES)
    if odd:
        raise UnsupportedModelError(
            f"{name}: its {', '.join(odd)} layers keep state that cannot be rewound to an earlier "
            "position, which speculative decoding needs; use an attention-only model"
        )


def rewindable_cache(config: Any, name: str = "model") -> DynamicCache:
    """The model's own DynamicCache with every sliding-window layer made a full one.

    A full layer never drops a key, so `crop` to any length works; the sliding-window attention
    mask, which compares absolute positions, keeps the window.

    Why: transformers 5 gives a sliding-window layer (Gemma 2/3, Mistral, gpt-oss, ...) a
    `DynamicSlidingWindowLayer` that keeps only the last `sliding_window - 1` keys. Once a
    sequence is longer than the window the older keys are gone, so `crop` raises ("does not
    track past states") unless past recording is on, and recording only keeps what arrived
    since the previous `crop`: a rewind further back is still impossible. A StaticCache is
    no better (its sliding layers are ring buffers). Speculation rewinds after every verify
    and `truncate(n)` may go anywhere, so the cache here is the model's own
    `DynamicCache(config)` with every `DynamicSlidingWindowLayer` swapped for a plain
    `DynamicLayer`: nothing is ever dropped and `crop` (a slice) always works. The window is
    still applied, by the attention mask: a full layer's `get_mask_sizes` reports the whole
    cache at offset 0 and transformers' sliding-window mask function compares absolute
    positions (`kv > q - window`), so each query sees exactly the keys the windowed layer
    would give it. Tested against `generate` with the model's default cache on a tiny Gemma
    3 with an 8-token window over 60 tokens (bitwise equal logits), and measured on Gemma 3
    270M over 700 tokens (window 512: same 24 greedy tokens, logits within 3e-5). The price
    is memory and attention time linear in the whole context on the sliding layers; at 700
    tokens a Gemma 3 270M step costs the same CPU time as with the default cache (111 ms,
    one thread).
    """
    try:
        cache = DynamicCache(config=config)
    except (KeyError, ValueError, TypeError, AttributeError) as err:
        raise UnsupportedModelError(
            f"{name}: transformers builds no dynamic KV cache for it ({_one_line(err)})"
        ) from None
    for i, layer in enumerate(cache.layers):
        if type(layer) is DynamicSlidingWindowLayer:
            cache.layers[i] = DynamicLayer()
        elif isinstance(layer, DynamicSlidingWindowLayer) or not (
            isinstance(layer, DynamicLayer) or type(layer).__name__ == "DummyLayer"
        ):
            raise UnsupportedModelError(
                f"{name}: its layer {i} caches in a {type(layer).__name__}, which cannot be "
                "rewound to an earlier position"
            )
    return cache


# --- GGUF conversion cache ----------------------------------------------------------------------


def file_digest(path: Path) -> str:
    """SHA-256 of the file's bytes, remembered in the conversion cache by path, size, mtime
    and ctime: a 1 GB GGUF is read once per install, not once per load."""
    path = Path(path).resolve()
    stat = path.stat()
    memo_path = cache_dir() / "converted" / DIGESTS
    # ctime moves with any write, also one that puts the mtime back
    memo_key = f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\0{stat.st_ctime_ns}"
    try:
        memo = json.loads(memo_path.read_text())
        if not isinstance(memo, dict):
            memo = {}
    except (OSError, ValueError):
        memo = {}
    known = memo.get(memo_key)
    if isinstance(known, str):
        return known
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_READ_CHUNK):
            digest.update(chunk)
    memo = {k: v for k, v in memo.items() if os.path.exists(k.split("\0", 1)[0])}
    memo[memo_key] = digest.hexdigest()
    with contextlib.suppress(OSError):  # a memo we cannot write costs a re-read, no more
        memo_path.parent.mkdir(parents=True, exist_ok=True)
        _replace_json(memo_path, memo)
    return memo[memo_key]


def _replace_json(path: Path, data: Any) -> None:
    """Write `data` to `path` whole or not at all (a reader never sees half a file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data) + "\n")
    os.replace(tmp, path)


def _marker(source: Path | None) -> dict[str, Any]:
    """What a conversion's marker records: the GGUF it serves, and the transformers."""
    return {
        "source": str(Path(source).resolve()) if source else None,
        "transformers": transformers.__version__,
    }


def conversion_key(gguf_path: Path) -> str:
    """`<stem>-<16 hex>`, from the file's bytes and the transformers version (not its path)."""
    path = Path(gguf_path)
    tag = f"{file_digest(path)}\0transformers {transformers.__version__}"
    return f"{path.stem}-{hashlib.sha256(tag.encode()).hexdigest()[:16]}"


def converted_dir(gguf_path: Path) -> Path:
    """Where the conversion of `gguf_path` lives (whether or not it exists yet)."""
    return cache_dir() / "converted" / conversion_key(gguf_path)


def is_complete_conversion(directory: Path) -> bool:
    return (directory / CONVERTED_MARKER).is_file() and (directory / "config.json").is_file()


def conversion_source(directory: Path) -> Path | None:
    """The GGUF a conversion was last used for, as its marker records it."""
    try:
        source = json.loads((directory / CONVERTED_MARKER).read_text()).get("source")
    except (OSError, ValueError, AttributeError):
        return None
    return Path(source) if isinstance(source, str) else None


def claim_conversion(directory: Path, source: Path) -> None:
    """Record `source` as the GGUF `directory` serves, when the recorded one is gone: the
    same bytes at a new path keep their conversion out of `prune_conversions`' reach."""
    recorded = conversion_source(directory)
    if recorded is not None and recorded.exists():
        return
    with contextlib.suppress(OSError):
        _replace_json(directory / CONVERTED_MARKER, _marker(source))


def prune_conversions(root: Path, keep: Path) -> list[Path]:
    """Remove the whole conversions under `root`, other than `keep`, that no load would find
    again: their GGUF is gone (a deleted virtualenv, an older copy of the model), or its key
    is no longer their name (other bytes now, another transformers, an older key scheme).
    Each is a model in float32. Returns what was removed."""
    removed = []
    for directory in sorted(root.iterdir()) if root.is_dir() else ():
        if directory == keep or not is_complete_conversion(directory):
            continue
        source = conversion_source(directory)
        try:
            live = source is not None and conversion_key(source) == directory.name
        except OSError:  # gone, or unreadable
            live = False
        if not live:
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(directory)
    return removed


def save_atomically(target: Path, write: Any, source: Path | None = None) -> bool:
    """Call `write(tmp_dir)`, then rename the directory to `target` in one step.

    Returns False (and leaves no temporary directory behind) if `target` already exists, e.g.
    another process finished the same conversion first. A crash mid-write leaves only a
    `.<name>.tmp-*` sibling, which no loader ever reads.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        return False
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        write(tmp)
        (tmp / CONVERTED_MARKER).write_text(json.dumps(_marker(source)) + "\n")
        try:
            os.rename(tmp, target)
        except OSError:
            if target.exists():  # lost a race to another process: theirs is as good as ours
                return False
            raise
        return True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --- tokenizer ----------------------------------------------------------------------------------


def _as_ids(value: Any) -> list[int]:
    """The token ids out of whatever apply_chat_template returned (list, BatchEncoding, tensor)."""
    if isinstance(value, Mapping) or hasattr(value, "input_ids"):
        value = value["input_ids"]
    if hasattr(value, "tolist"):
        value = value.tolist()
    value = list(value)
    if value and isinstance(value[0], (list, tuple)):
        value = list(value[0])  # a batch of one
    return [int(t) for t in value]


def _id_set(value: Any) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, int):
        return {value}
    return {int(v) for v in value}


class HFTokenizer:
    """The `Tokenizer` protocol over a transformers tokenizer."""

    def __init__(
        self, tokenizer: Any, *, extra_eos: Iterable[int] = (), name: str = "model"
    ) -> None:
        self._tok = tokenizer
        self._name = name
        self.bos_token_id: int | None = tokenizer.bos_token_id
        self.eos_token_ids: frozenset[int] = frozenset(
            _id_set(tokenizer.eos_token_id) | {int(t) for t in extra_eos}
        )
        special = set(getattr(tokenizer, "all_special_ids", ()))
        for token_id, added in getattr(tokenizer, "added_tokens_decoder", {}).items():
            if getattr(added, "special", False):
                special.add(int(token_id))
        self._special = frozenset(special)

    @property
    def hf_tokenizer(self) -> Any:
        return self._tok

    def encode(self, text: str, *, add_special: bool = False) -> list[int]:
        return [int(t) for t in self._tok.encode(text, add_special_tokens=add_special)]

    def decode(self, token_ids: Sequence[int], *, skip_special: bool = False) -> str:
        text = self._tok.decode(
            [int(t) for t in token_ids],
            skip_special_tokens=skip_special,
            clean_up_tokenization_spaces=False,
        )
        return str(text)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        """Render the tokenizer's chat template and tokenize it.

        The markers the template writes become special tokens; text in the messages is text
        (transformers' `sanitize_control_tokens`): a message saying `<|im_end|>` gives the
        tokens of those ten characters, not the turn marker. A message without control-token
        text gives the same tokens as the rendering tokenized whole.
        """
        if not getattr(self._tok, "chat_template", None):
            raise ModelError(f"{self._name} has no chat template")
        try:
            rendered = self._tok.apply_chat_template(
                [dict(m) for m in messages],
                add_generation_prompt=add_generation_prompt,
                tools=None if tools is None else [dict(t) for t in tools],
                tokenize=True,
                sanitize_control_tokens=True,
            )
        except ValueError as err:  # e.g. a control token the tokenizer makes from plain text
            raise ModelError(f"{self._name}: cannot apply the chat template: {err}") from None
        return _as_ids(rendered)

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special


# --- the model ----------------------------------------------------------------------------------


class HFModel:
    """A transformers causal LM behind the model contract (see models/base.py).

    One sequence, one KV cache. Token ids are checked before the cache is touched (ValueError);
    a forward that raises leaves the cache at the length it had before the call.
    """

    backend = BACKEND

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        name: str,
        prefill_chunk: int = PREFILL_CHUNK,
        n_ctx: int | None = None,
        source: str | None = None,
        path: Path | None = None,
    ) -> None:
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        if n_ctx is not None and n_ctx < 1:
            raise ValueError(f"n_ctx must be >= 1, got {n_ctx}")
        self.name = name
        self.source = source  # the file or directory the weights were read from
        self.path = path  # the model file or directory it was loaded from
        self.n_ctx = n_ctx  # None: no limit beyond memory
        self._model: Any = model.eval()
        self._config = model.config
        check_rewindable(self._config, name)
        param = next(model.parameters())
        self.device: str = str(param.device)
        self.dtype: str = str(param.dtype).removeprefix("torch.")
        self._device = param.device
        # what sets this model's verify costs (the cost-table cache keys by it)
        self.kernels: str = f"torch {torch.__version__} {self.device} {self.dtype}"
        self.vocab_size: int = self._logits_width()
        embeddings = model.get_input_embeddings()
        n_embed = getattr(embeddings, "num_embeddings", self.vocab_size)
        self._id_limit = min(self.vocab_size, int(n_embed))  # valid ids: [0, _id_limit)
        self._prefill_chunk = prefill_chunk
        self._hf_tokenizer = tokenizer
        generation_config = getattr(model, "generation_config", None)
        self.tokenizer: Tokenizer = HFTokenizer(
            tokenizer,
            extra_eos=_id_set(getattr(generation_config, "eos_token_id", None)),
            name=name,
        )
        self._cache: Any = rewindable_cache(self._config, name)
        self._n_past = 0
        self._probe()

    # -- construction --

    @classmethod
    def from_model(
        cls,
        model: Any,
        tokenizer: Any,
        *,
        name: str = "model",
        prefill_chunk: int = PREFILL_CHUNK,
        n_ctx: int | None = None,
    ) -> HFModel:
        """Wrap an already built transformers causal LM (on its own device, in its own dtype)."""
        return cls(model, tokenizer, name=name, prefill_chunk=prefill_chunk, n_ctx=n_ctx)

    @classmethod
    def load(
        cls,
        spec: ModelSpec,
        *,
        device: str | torch.device = "cpu",
        dtype: str | torch.dtype | None = None,
        attn_implementation: str | None = None,
        prefill_chunk: int = PREFILL_CHUNK,
        n_ctx: int | None = None,
        n_threads: int | None = None,
        use_conversion_cache: bool = True,
        **unknown: Any,
    ) -> HFModel:
        """Load `spec` (a model directory or a GGUF file) on `device` in `dtype`.

        dtype None means float32 on CPU and bfloat16 (float16 where unsupported) on CUDA.
        A GGUF is converted once and cached (see the module docstring); use_conversion_cache=False
        converts every time and writes nothing.
        """
        if unknown:
            raise ModelError(f"unknown option(s) for the hf backend: {', '.join(sorted(unknown))}")
        if prefill_chunk < 1:
            raise ModelError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        if n_ctx is not None and n_ctx < 1:
            raise ModelError(f"n_ctx must be >= 1, got {n_ctx}")
        dev = _parse_device(device)
        torch_dtype = _parse_dtype(dtype, dev)
        if n_threads is not None:
            if n_threads < 1:
                raise ModelError(f"n_threads must be >= 1, got {n_threads}")
            torch.set_num_threads(n_threads)
        name = spec.name
        if spec.is_gguf:
            model, tokenizer, source = _load_gguf(
                spec.path, name, attn_implementation, use_conversion_cache
            )
        else:
            model, tokenizer = _load_pretrained(spec.path, name, torch_dtype, attn_implementation)
            source = spec.path
        model = model.to(device=dev, dtype=torch_dtype)
        return cls(
            model,
            tokenizer,
            name=name,
            prefill_chunk=prefill_chunk,
            n_ctx=n_ctx,
            source=str(source),
            path=Path(spec.path),
        )

    @staticmethod
    def tokenizer_only(spec: ModelSpec) -> HFTokenizer:
        """transformers' tokenizer of `spec` without its weights: from the model directory,
        from the conversion cache of a GGUF already converted, or converted from the GGUF now
        (slow on a large vocabulary; nothing is cached)."""
        path = Path(spec.path)
        with _quiet():
            try:
                if not spec.is_gguf:
                    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
                elif is_complete_conversion(converted_dir(path)):
                    tok = AutoTokenizer.from_pretrained(
                        str(converted_dir(path)), local_files_only=True
                    )
                else:
                    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            except (ValueError, KeyError, OSError, TypeError, NotImplementedError) as err:
                raise ModelError(
                    f"transformers cannot load the tokenizer of {spec.name}: {_one_line(err)}"
                ) from None
        return HFTokenizer(tok, name=spec.name)

    @property
    def threads(self) -> int:
        """torch's intra-op threads (process-wide: torch has no per-model setting)."""
        return int(torch.get_num_threads())

    @property
    def torch_model(self) -> Any:
        """The wrapped transformers model (for inspection; its cache is ours, not its own)."""
        return self._model

    @property
    def hf_tokenizer(self) -> Any:
        """The wrapped transformers tokenizer."""
        return self._hf_tokenizer

    # -- the contract --

    @property
    def n_past(self) -> int:
        return self._n_past

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self.tokenizer.eos_token_ids

    def forward(self, token_ids: Sequence[int]) -> np.ndarray:
        """Append `token_ids` (k >= 1); return float32 logits [k, vocab], row i after token i."""
        ids = self._checked(token_ids)
        if not ids:
            raise ValueError("forward needs at least one token id")
        logits = self._append(ids, logits_to_keep=0)  # [1, k, vocab]
        return logits[0].to(dtype=torch.float32, device="cpu").numpy()

    def prefill(self, token_ids: Sequence[int]) -> None:
        """Append `token_ids` in chunks, computing only the last row's logits of each chunk."""
        ids = self._checked(token_ids)
        before = self._n_past
        try:
            for start in range(0, len(ids), self._prefill_chunk):
                self._append(ids[start : start + self._prefill_chunk], logits_to_keep=1)
        except BaseException:
            self._crop(before)
            raise

    def truncate(self, n: int) -> None:
        """Drop every cache row past `n` (0 <= n <= n_past)."""
        n = operator.index(n)
        if not 0 <= n <= self._n_past:
            raise ValueError(
                f"truncate({n}) is out of range: the cache holds {self._n_past} tokens"
            )
        if n < self._n_past:
            self._crop(n)

    def reset(self) -> None:
        """Empty the cache (same as truncate(0))."""
        self.truncate(0)

    def close(self) -> None:
        """Release the weights and the cache; the model cannot be used afterwards."""
        self._cache = None
        self._model = None
        self._n_past = 0
        if self._device.type == "cuda":
            torch.cuda.empty_cache()

    def __repr__(self) -> str:
        return (
            f"HFModel(name={self.name!r}, device={self.device!r}, dtype={self.dtype!r}, "
            f"vocab_size={self.vocab_size}, n_past={self._n_past})"
        )

    # -- internals --

    def _logits_width(self) -> int:
        head = self._model.get_output_embeddings()
        weight = getattr(head, "weight", None)
        if weight is not None and weight.ndim == 2:
            return int(weight.shape[0])
        return int(self._config.get_text_config(decoder=True).vocab_size)

    def _checked(self, token_ids: Sequence[int]) -> list[int]:
        """The ids as ints, after every check that must pass before the cache is touched."""
        if self._model is None:
            raise ModelError(f"{self.name} is closed")
        try:
            ids = [operator.index(t) for t in token_ids]
        except TypeError:
            raise ValueError(f"token ids must be integers, got {list(token_ids)[:8]!r}") from None
        if ids and (min(ids) < 0 or max(ids) >= self._id_limit):
            bad = next(t for t in ids if not 0 <= t < self._id_limit)
            raise ValueError(f"token id {bad} is out of range: the vocabulary has {self._id_limit}")
        if self.n_ctx is not None and self._n_past + len(ids) > self.n_ctx:
            raise ContextFull(self._n_past, len(ids), self.n_ctx)
        return ids

    def _append(self, ids: list[int], *, logits_to_keep: int) -> torch.Tensor:
        """One forward over `ids` on top of the cache; on any error the cache is cut back."""
        before = self._n_past
        input_ids = torch.tensor([ids], dtype=torch.long, device=self._device)  # [1, k]
        try:
            with torch.inference_mode():
                out = self._model(
                    input_ids=input_ids,
                    past_key_values=self._cache,
                    use_cache=True,
                    logits_to_keep=logits_to_keep,
                )
        except BaseException:
            self._crop(before)
            raise
        self._n_past = before + len(ids)
        return out.logits

    def _crop(self, n: int) -> None:
        """Cut every layer back to `n` rows (layers a failed forward never reached are shorter)."""
        with torch.inference_mode():
            for layer in self._cache.layers:
                if isinstance(layer, DynamicLayer) and layer.is_initialized:
                    extra = layer.get_seq_length() - n
                    if extra > 0:
                        layer.crop(-extra)
        self._n_past = n

    def _probe(self) -> None:
        """One token through the model: it must extend our cache by exactly one row."""
        token = self.tokenizer.bos_token_id
        token = token if token is not None and 0 <= token < self._id_limit else 0
        try:
            self._append([token], logits_to_keep=1)
        except (RuntimeError, TypeError, ValueError) as err:
            raise UnsupportedModelError(
                f"{self.name}: a forward with a KV cache failed ({_one_line(err)})"
            ) from None
        grown = self._cache.get_seq_length()
        self._crop(0)
        if grown != 1:
            raise UnsupportedModelError(
                f"{self.name}: the model does not keep its state in a KV cache draftless can rewind"
            )


# --- loading ------------------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet() -> Any:
    """Silence transformers' progress bars and advisory warnings while loading."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.enable_progress_bar()
        hf_logging.set_verbosity(verbosity)


def _checked_config(name: str, attn_implementation: str | None, *args: Any, **kwargs: Any) -> Any:
    """AutoConfig.from_pretrained(*args, **kwargs), refused before any weight is read if the
    model cannot be rewound, with the requested attention implementation set."""
    try:
        config = AutoConfig.from_pretrained(*args, **kwargs)
    except (ValueError, KeyError, OSError) as err:
        raise ModelError(f"transformers cannot load {name}: {_one_line(err)}") from None
    check_rewindable(config, name)
    if attn_implementation is not None:
        config._attn_implementation = attn_implementation
    return config


def _load_pretrained(
    directory: Path, name: str, dtype: torch.dtype, attn_implementation: str | None
) -> tuple[Any, Any]:
    """Config (checked before the weights are read), tokenizer and model from a local directory."""
    with _quiet():
        config = _checked_config(name, attn_implementation, str(directory), local_files_only=True)
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(
                str(directory), config=config, dtype=dtype, local_files_only=True
            )
        except (ValueError, KeyError, OSError, TypeError) as err:
            raise ModelError(f"transformers cannot load {name}: {_one_line(err)}") from None
    return model, tokenizer


def _load_gguf(
    path: Path, name: str, attn_implementation: str | None, use_cache: bool
) -> tuple[Any, Any, Path]:
    """A GGUF's float32 model and tokenizer: from the conversion cache, or converted and cached."""
    target = converted_dir(path) if use_cache else None
    if target is not None and is_complete_conversion(target):
        try:
            model, tokenizer = _load_pretrained(target, name, torch.float32, attn_implementation)
        except UnsupportedModelError:
            raise
        except ModelError as err:
            raise ModelError(f"{err} (delete {target} to convert {path.name} again)") from None
        claim_conversion(target, path)
        return model, tokenizer, target
    _check_gguf_architecture(path, name)
    if importlib.util.find_spec("accelerate") is None:
        raise ModelError(
            "loading a GGUF with the hf backend needs accelerate: pip install accelerate"
        )
    from transformers import GgufConfig

    with _quiet():
        config = _checked_config(name, attn_implementation, str(path.parent), gguf_file=path.name)
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            model = AutoModelForCausalLM.from_pretrained(
                str(path.parent),
                gguf_file=path.name,
                config=config,
                dtype=torch.float32,
                quantization_config=GgufConfig(dequantize=True),
            )
        except (ValueError, KeyError, OSError, TypeError, NotImplementedError) as err:
            raise ModelError(f"transformers cannot convert {name}: {_one_line(err)}") from None
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:  # the weights are plain dense tensors: let save_pretrained see so
        quantizer.remove_quantization_config(model)
    if target is not None:
        try:
            save_atomically(target, lambda tmp: _save(model, tokenizer, tmp), source=path)
            prune_conversions(target.parent, keep=target)
        except Exception as err:  # a cache we cannot write must not fail a load that worked
            warnings.warn(
                f"could not cache the converted {name} in {target}: {_one_line(err)}", stacklevel=3
            )
    return model, tokenizer, path


def _save(model: Any, tokenizer: Any, directory: Path) -> None:
    with _quiet():
        model.save_pretrained(str(directory))
        tokenizer.save_pretrained(str(directory))


def _check_gguf_architecture(path: Path, name: str) -> None:
    """Refuse a recurrent GGUF from its header (milliseconds) before converting it (a minute)."""
    try:
        from transformers.integrations.gguf import read_gguf_metadata
    except ImportError:  # older transformers: the config check after parsing still applies
        return
    try:
        metadata, _ = read_gguf_metadata(str(path))
    except (ValueError, OSError) as err:
        raise ModelError(f"cannot read the GGUF header of {name}: {_one_line(err)}") from None
    arch = str(metadata.get("general.architecture", ""))
    if arch in RECURRENT_GGUF_ARCHITECTURES:
        raise UnsupportedModelError(
            f"{name}: {arch} keeps a recurrent state that cannot be rewound to an earlier "
            "position, which speculative decoding needs; use an attention-only model"
        )
