"""The llama.cpp backend: GGUF models through llama-cpp-python's low-level C API.

One context, one sequence (seq 0), one `llama_batch` allocated once for `n_batch` tokens.
The cache is llama.cpp's KV cache; `n_past` is the number of positions it holds, always
0 .. n_past - 1 with no holes. Only the rows a call asks for are computed and copied:

    forward([2, 7, 7])   positions n_past .. n_past + 2, logits flag 1 on every token
                         -> float32 [3, vocab], row i = next-token logits after token i
    prefill([5, 9])      logits flag 0 on every token: no row is computed or copied
    truncate(4)          llama_memory_seq_rm(mem, 0, 4, -1): positions >= 4 are gone

llama.cpp keeps an output buffer of (most rows asked for in one decode) x vocab floats, and
its compute graph is reserved for at most `n_outputs_max` rows, so memory is O(k x vocab),
never n_ctx x vocab (Gemma 3's vocabulary is 262,144 wide: 1 MiB per row).

Sliding-window models (Gemma 3) are created with `swa_full=True`: the window layers keep
every position instead of recycling cells older than the window, so truncating far behind
the window and re-appending gives a fresh run's logits. Recurrent and hybrid models keep a
state that cannot be rewound to an earlier position, and are refused at load.

Exactness: after truncate + re-append the rows are bitwise those of a fresh context fed the
same pieces. llama.cpp picks kernels by batch size, so one forward of k and k forwards of 1
agree only up to quantization noise (bitwise for SmolLM2 up to k = 48 on AVX2; Gemma 3 from
k = 4 on differs by up to ~2 logits, which can flip the argmax at a near tie).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import json
import operator
import os
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

import jinja2
import jinja2.ext
import jinja2.sandbox
import numpy as np

# ggml's CPU threads meet at an OpenMP barrier after every op. libgomp's default is to spin
# there; when the cores are shared with other work a spinning thread burns the time slice
# the thread it waits for needs (measured on 2 busy cores: 846 ms per SmolLM2 token with 2
# threads against 42 ms passive). libgomp reads it once, when it loads: a process that
# imported llama_cpp before this module keeps the spinning default. A value set by the user
# (OMP_WAIT_POLICY=ACTIVE for a machine of one's own) is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from llama_cpp import llama_cpp as lib

from draftless.models.base import (
    ContextFull,
    ModelError,
    ModelSpec,
    Tokenizer,
    UnsupportedModelError,
)

_GGML_LOG_LEVEL_ERROR = 4  # ggml.h: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5
_LOG_ERRORS: collections.deque[str] = collections.deque(maxlen=8)  # recent llama.cpp errors


def _install_log_sink() -> Any:
    """Silence llama.cpp (unless DRAFTLESS_VERBOSE=1) but remember its recent error lines.

    Returns the ctypes callback, which must stay referenced for as long as llama.cpp may log.
    """
    if os.environ.get("DRAFTLESS_VERBOSE") == "1":
        lib.llama_log_set(lib.llama_log_callback(), None)  # NULL: llama.cpp logs to stderr
        return None
    errors = _LOG_ERRORS  # bound here: no module globals needed while the interpreter exits

    def sink(level: int, text: bytes | None, _user_data: Any) -> None:
        if level == _GGML_LOG_LEVEL_ERROR and text:
            errors.append(text.decode("utf-8", errors="replace").strip())

    callback = lib.llama_log_callback(sink)
    lib.llama_log_set(callback, None)
    return callback


lib.llama_backend_init()
_LOG_SINK = _install_log_sink()


def _first_error(default: str) -> str:
    """The first error llama.cpp logged since the last call (the cause; the lines after it
    say what gave up), without its "function_name: " prefix; or `default`."""
    detail = _LOG_ERRORS[0] if _LOG_ERRORS else default
    _LOG_ERRORS.clear()
    head, sep, rest = detail.partition(": ")
    if sep and head.isidentifier():
        detail = rest
    return " ".join(detail.split())[:300]


@dataclass(frozen=True, slots=True)
class LlamaCppOptions:
    n_ctx: int = 4096  # tokens the cache holds; capped at the model's training context
    # 1 by default: with more threads llama.cpp's attention splits its work by batch shape, so
    # a verify batch and single steps round differently past ~256 tokens of context (logits
    # off by up to 0.85 on SmolLM2) and a speculative stream can leave the plain one at a
    # near-tie. One thread is bitwise exact for every batch shape measured. 0: all cores.
    n_threads: int = 1
    n_batch: int = 512  # tokens per llama_decode (prefill and forward split longer inputs)
    n_outputs_max: int = 64  # logits rows per llama_decode; forward splits larger k

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            low = 0 if f.name == "n_threads" else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ModelError(
                    f"llamacpp option {f.name} must be an integer >= {low}, got {value!r}"
                )

    @classmethod
    def from_kwargs(cls, options: dict[str, Any]) -> LlamaCppOptions:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ModelError(
                f"unknown option for the llamacpp backend: {', '.join(unknown)} "
                f"(known: {', '.join(sorted(known))})"
            )
        return cls(**options)


def _load_model_file(path: Path, name: str, *, vocab_only: bool) -> int:
    """A llama_model pointer; a one-line ModelError if llama.cpp cannot read the file."""
    if not path.is_file():
        raise ModelError(f"model file not found: {path}")
    params = lib.llama_model_default_params()
    params.vocab_only = vocab_only
    _LOG_ERRORS.clear()
    model = lib.llama_model_load_from_file(os.fsencode(path), params)
    if not model:
        detail = _first_error("llama.cpp could not read it")
        raise ModelError(f"cannot load {name} from {path}: {detail}")
    return int(model)


def _check_rewindable(model: int, name: str) -> None:
    """Refuse models whose cache cannot be cut back to an earlier position."""
    why = None
    if lib.llama_model_is_recurrent(model):
        why = "it is recurrent (its state cannot be rewound to an earlier position)"
    elif lib.llama_model_is_hybrid(model):
        why = "it is hybrid: its recurrent layers' state cannot be rewound"
    elif lib.llama_model_has_encoder(model):
        why = "it is an encoder-decoder model"
    elif lib.llama_model_is_diffusion(model):
        why = "it is a diffusion model, not an autoregressive one"
    if why is not None:
        raise UnsupportedModelError(f"{name} cannot be used for speculative decoding: {why}")


def _meta_str(model: int, key: str) -> str | None:
    """A GGUF metadata string, or None if the key is absent."""
    size = 4096
    while True:
        buf = ctypes.create_string_buffer(size)
        n = lib.llama_model_meta_val_str(model, key.encode(), buf, size)
        if n < 0:
            return None
        if n < size:
            return buf.raw[:n].decode("utf-8", errors="replace")
        size = n + 1


# -- tokenizer -----------------------------------------------------------------------------


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, indent: int | None = None, **kwargs: Any) -> str:
    # Hugging Face's tojson: no HTML escaping, non-ASCII kept.
    return json.dumps(value, ensure_ascii=False, indent=indent, **kwargs)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _compile_chat_template(source: str) -> jinja2.Template:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


class LlamaCppTokenizer:
    """The GGUF's own vocabulary, through llama_tokenize / llama_token_to_piece.

    `encode` parses special-token text (as Hugging Face tokenizers and `llama-tokenize` do).
    `decode` joins the bytes of every piece before decoding them as UTF-8, so a character
    split over several tokens comes out whole; a sequence cut inside one gives U+FFFD.
    """

    def __init__(self, model: int, name: str, *, owns_model: bool) -> None:
        self.name = name
        self._model: int | None = model
        self._vocab: int | None = int(lib.llama_model_get_vocab(model))
        self._owns_model = owns_model
        self.vocab_size: int = lib.llama_vocab_n_tokens(self._vocab)
        bos = lib.llama_vocab_bos(self._vocab)
        self.bos_token_id: int | None = bos if 0 <= bos < self.vocab_size else None
        self.add_bos: bool = bool(lib.llama_vocab_get_add_bos(self._vocab)) and bos >= 0
        is_eog = lib.llama_vocab_is_eog
        vocab = self._vocab
        self.eos_token_ids: frozenset[int] = frozenset(
            t for t in range(self.vocab_size) if is_eog(vocab, t)
        )
        self.chat_template: str | None = _meta_str(model, "tokenizer.chat_template")
        self._template: jinja2.Template | None = None
        self._pieces: dict[int, tuple[bytes, bool]] = {}  # id -> (piece bytes, is special)
        self._piece_buf = ctypes.create_string_buffer(256)

    def _live_vocab(self) -> int:
        if self._vocab is None:
            raise ModelError(f"the tokenizer of {self.name} is closed")
        return self._vocab

    def _check_id(self, token_id: int) -> None:
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(
                f"token id {token_id} is outside the vocabulary [0, {self.vocab_size})"
            )

    def _tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        vocab = self._live_vocab()
        data = text.encode("utf-8")
        capacity = len(data) + 8
        while True:
            out = (ctypes.c_int32 * capacity)()
            n = lib.llama_tokenize(
                vocab, data, len(data), out, capacity, add_special, parse_special
            )
            if n >= 0:
                return list(out[:n])
            if n == -(2**31):  # INT32_MIN: the count itself overflows
                raise ValueError("text is too long to tokenize")
            capacity = -n

    def encode(self, text: str, *, add_special: bool = False) -> list[int]:
        return self._tokenize(text, add_special=add_special, parse_special=True)

    def _piece(self, token_id: int) -> tuple[bytes, bool]:
        cached = self._pieces.get(token_id)
        if cached is not None:
            return cached
        self._check_id(token_id)
        vocab = self._live_vocab()
        buf = self._piece_buf
        n = lib.llama_token_to_piece(vocab, token_id, buf, len(buf), 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = lib.llama_token_to_piece(vocab, token_id, buf, len(buf), 0, True)
        special = bool(lib.llama_vocab_is_control(vocab, token_id)) or (
            token_id in self.eos_token_ids
        )
        entry = (buf.raw[:n], special)
        self._pieces[token_id] = entry
        return entry

    def decode(self, token_ids: Sequence[int], *, skip_special: bool = False) -> str:
        pieces = [self._piece(int(t)) for t in token_ids]
        data = b"".join(p for p, special in pieces if not (skip_special and special))
        return data.decode("utf-8", errors="replace")

    def is_special(self, token_id: int) -> bool:
        """Control tokens (BOS, turn markers ...) and every end-of-generation token."""
        return self._piece(int(token_id))[1]

    def apply_chat_template(
        self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = True
    ) -> list[int]:
        """Render the GGUF's `tokenizer.chat_template` (Jinja) and tokenize it.

        Special-token text in the rendering becomes special tokens; BOS is put first only if
        the model adds one and the template did not already write it.
        """
        if self.chat_template is None:
            raise ModelError(
                f"{self.name} has no chat template (the GGUF has no tokenizer.chat_template)"
            )
        if self._template is None:
            try:
                self._template = _compile_chat_template(self.chat_template)
            except jinja2.exceptions.TemplateError as err:
                raise ModelError(
                    f"the chat template of {self.name} does not compile: {err}"
                ) from None
        vocab = self._live_vocab()
        bos = lib.llama_vocab_bos(vocab)
        eos = lib.llama_vocab_eos(vocab)
        try:
            text = self._template.render(
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                bos_token=self._special_text(bos),
                eos_token=self._special_text(eos),
            )
        except jinja2.exceptions.TemplateError as err:
            raise ModelError(f"the chat template of {self.name} failed: {err}") from None
        ids = self._tokenize(text, add_special=False, parse_special=True)
        if self.add_bos and self.bos_token_id is not None and ids[:1] != [self.bos_token_id]:
            ids.insert(0, self.bos_token_id)
        return ids

    def _special_text(self, token_id: int) -> str:
        if not 0 <= token_id < self.vocab_size:
            return ""
        return self._piece(token_id)[0].decode("utf-8", errors="replace")

    def close(self) -> None:
        """Release the vocabulary (and the model, for a tokenizer loaded on its own)."""
        model, self._model, self._vocab = self._model, None, None
        if model is not None and self._owns_model:
            lib.llama_model_free(model)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


# -- model ---------------------------------------------------------------------------------


class LlamaCppModel:
    """A GGUF model behind the draftless model contract (see models.base)."""

    backend = "llamacpp"

    def __init__(
        self,
        name: str,
        path: Path,
        model: int,
        tokenizer: LlamaCppTokenizer,
        options: LlamaCppOptions,
    ) -> None:
        """Takes ownership of `model`: freed by close(), also if this constructor fails."""
        self.name = name
        self.path = path
        self._model: int | None = model
        self._ctx: int | None = None
        self._batch: Any = None
        self._tokenizer = tokenizer
        self.tokenizer: Tokenizer = tokenizer
        self.vocab_size: int = self._tokenizer.vocab_size
        self._n_past = 0

        n_ctx_train = lib.llama_model_n_ctx_train(model)
        n_ctx = min(options.n_ctx, n_ctx_train) if n_ctx_train > 0 else options.n_ctx
        n_threads = options.n_threads or os.cpu_count() or 1
        self.threads: int = n_threads
        params = lib.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = options.n_batch
        params.n_seq_max = 1
        params.n_outputs_max = min(options.n_outputs_max, options.n_batch)
        params.n_threads = params.n_threads_batch = n_threads
        params.swa_full = True  # window layers keep every position: truncation stays exact
        params.no_perf = True
        params.embeddings = False
        _LOG_ERRORS.clear()
        ctx = lib.llama_init_from_model(model, params)
        if not ctx:
            detail = _first_error("llama_init_from_model failed")
            self.close()
            raise ModelError(f"cannot create a context for {name}: {detail}")
        self._ctx = int(ctx)
        self._mem = lib.llama_get_memory(self._ctx)
        self.n_ctx: int = lib.llama_n_ctx(self._ctx)
        self.n_batch: int = lib.llama_n_batch(self._ctx)  # tokens per llama_decode
        self.n_outputs_max: int = min(params.n_outputs_max, self.n_batch)  # rows per decode

        batch = lib.llama_batch_init(self.n_batch, 0, 1)
        self._batch = batch
        # Views of the batch's arrays [n_batch]; every token belongs to sequence 0.
        self._tokens = np.ctypeslib.as_array(batch.token, shape=(self.n_batch,))
        self._pos = np.ctypeslib.as_array(batch.pos, shape=(self.n_batch,))
        self._flags = np.ctypeslib.as_array(batch.logits, shape=(self.n_batch,))
        np.ctypeslib.as_array(batch.n_seq_id, shape=(self.n_batch,))[:] = 1
        for i in range(self.n_batch):
            batch.seq_id[i][0] = 0
        self._arange = np.arange(self.n_batch, dtype=np.int32)  # [n_batch]

    @classmethod
    def load(cls, spec: ModelSpec, **options: Any) -> LlamaCppModel:
        """Load a GGUF. Options: n_ctx (4096), n_threads (1; 0 = all cores), n_batch (512),
        n_outputs_max (64: logits rows per decode)."""
        opts = LlamaCppOptions.from_kwargs(options)
        path = Path(spec.path)
        model = _load_model_file(path, spec.name, vocab_only=False)
        try:
            _check_rewindable(model, spec.name)
            tokenizer = LlamaCppTokenizer(model, spec.name, owns_model=False)
        except BaseException:
            lib.llama_model_free(model)
            raise
        return cls(spec.name, path, model, tokenizer, opts)

    @staticmethod
    def tokenizer_only(path: str | os.PathLike[str]) -> LlamaCppTokenizer:
        """The vocabulary of a GGUF without its weights (llama_model_params.vocab_only).
        Call `close()` on it when done."""
        path = Path(path)
        model = _load_model_file(path, path.name, vocab_only=True)
        return LlamaCppTokenizer(model, path.name, owns_model=True)

    # -- the contract ---------------------------------------------------------------------

    @property
    def n_past(self) -> int:
        return self._n_past

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._tokenizer.eos_token_ids

    def forward(self, token_ids: Sequence[int]) -> np.ndarray:
        """Append k >= 1 tokens; return their logits, float32 [k, vocab].

        Decodes in pieces of at most `n_outputs_max` tokens; a llama.cpp failure leaves the
        cache as it was before the call.
        """
        ids = self._checked(token_ids)  # [k]
        k = len(ids)
        if k == 0:
            raise ValueError("forward needs at least one token")
        out = np.empty((k, self.vocab_size), dtype=np.float32)  # [k, vocab]
        start = self._n_past
        step = self.n_outputs_max
        try:
            for i in range(0, k, step):
                n = min(step, k - i)
                self._decode(ids[i : i + n], start + i, logits=True, restore_to=start)
                # The flagged rows are contiguous, in batch order (llama.h, llama_get_logits).
                rows = lib.llama_get_logits(self._ctx)
                ctypes.memmove(out[i].ctypes.data, rows, n * self.vocab_size * 4)
        except BaseException:  # e.g. Ctrl-C right after a decode: leave no rows behind
            lib.llama_memory_seq_rm(self._mem, 0, start, -1)
            raise
        self._n_past = start + k
        return out

    def prefill(self, token_ids: Sequence[int]) -> None:
        """Append tokens without computing any logits, in pieces of `n_batch`."""
        ids = self._checked(token_ids)
        start = self._n_past
        try:
            for i in range(0, len(ids), self.n_batch):
                self._decode(ids[i : i + self.n_batch], start + i, logits=False, restore_to=start)
        except BaseException:  # e.g. Ctrl-C between two pieces: leave no rows behind
            lib.llama_memory_seq_rm(self._mem, 0, start, -1)
            raise
        self._n_past = start + len(ids)

    def truncate(self, n: int) -> None:
        """Drop every cache row at position >= n (0 <= n <= n_past)."""
        n = operator.index(n)
        if not 0 <= n <= self._n_past:
            raise ValueError(f"truncate({n}): n must be in [0, n_past={self._n_past}]")
        if n == self._n_past:
            return
        self._require_open()
        if n > 0 and lib.llama_memory_seq_pos_min(self._mem, 0) > 0:
            # Cannot happen with swa_full; if llama.cpp ever recycles window cells, the rows
            # an earlier position needs are gone and re-appending would not be exact.
            raise ModelError(
                f"{self.name}: the cache has dropped its oldest rows; "
                "it cannot be truncated exactly"
            )
        if not lib.llama_memory_seq_rm(self._mem, 0, n, -1):
            raise ModelError(f"{self.name}: llama.cpp refused to truncate the cache to {n}")
        self._n_past = n

    def close(self) -> None:
        """Free the batch, the context and the model. Safe to call twice."""
        batch, self._batch = self._batch, None
        ctx, self._ctx = self._ctx, None
        model, self._model = self._model, None
        if batch is not None:
            self._tokens = self._pos = self._flags = np.empty(0)
            lib.llama_batch_free(batch)
        if ctx is not None:
            lib.llama_free(ctx)
        if model is not None:
            self._tokenizer.close()
            lib.llama_model_free(model)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def __repr__(self) -> str:
        return (
            f"LlamaCppModel({self.name!r}, n_ctx={self.n_ctx}, vocab={self.vocab_size}, "
            f"n_past={self._n_past})"
        )

    # -- helpers --------------------------------------------------------------------------

    def _require_open(self) -> None:
        if self._ctx is None:
            raise ModelError(f"{self.name} is closed")

    def _checked(self, token_ids: Sequence[int]) -> np.ndarray:
        """The ids as int32 [k], after every check that must pass before the cache changes."""
        self._require_open()
        ids = np.asarray(token_ids)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise ValueError(
                f"token ids must be a flat sequence of integers, got {ids.dtype} "
                f"with shape {ids.shape}"
            )
        if ids.size:
            low, high = int(ids.min()), int(ids.max())
            if low < 0 or high >= self.vocab_size:
                bad = low if low < 0 else high
                raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.vocab_size})")
        if self._n_past + ids.size > self.n_ctx:
            raise ContextFull(self._n_past, int(ids.size), self.n_ctx)
        return ids.astype(np.int32, copy=False)

    def _decode(self, ids: np.ndarray, pos0: int, *, logits: bool, restore_to: int) -> None:
        """One llama_decode of ids [n <= n_batch] at positions pos0 .. pos0 + n - 1."""
        n = len(ids)
        self._tokens[:n] = ids
        self._pos[:n] = self._arange[:n] + pos0
        self._flags[:n] = logits
        self._batch.n_tokens = n
        _LOG_ERRORS.clear()
        rc = lib.llama_decode(self._ctx, self._batch)
        if rc != 0:
            lib.llama_memory_seq_rm(self._mem, 0, restore_to, -1)
            self._n_past = restore_to
            detail = _first_error(f"llama_decode returned {rc}")
            raise ModelError(f"{self.name}: decoding failed: {detail}")
