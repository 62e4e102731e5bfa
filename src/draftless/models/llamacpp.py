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
same pieces, and one forward of k tokens gives bitwise the rows of k forwards of one, at any
thread count (measured on AVX2: SmolLM2 Q4_1 and Gemma 3 Q4_K_M, contexts to 2,048, k 1..32,
1 and 2 threads). llama.cpp's defaults give neither: ggml picks kernels by batch shape and
splits a single step's attention by thread count. Three such kernels are switched off:

- flash attention over one query splits the keys over the threads (from 512 cached cells)
  and merges the pieces, and over 64+ queries runs tiled: both sum in another order than
  the one-row kernel. Neither runs when K and V are cached in different types: K f16 (as
  llama.cpp's default), V bf16. That is no less accurate than f16/f16, whose V sums in f16:
  against attention in f32, SmolLM2's logits over 1,200 positions differ by a median row
  max of 0.62 (f16/bf16) and 0.64 (f16/f16), the argmax in 4.3% and 4.5% of rows;
- repacked weights (CPU_REPACK: Q4_0, Q4_K, IQ4_NL ... laid out 8 rows at a time) use a gemm
  for groups of 4 rows and a gemv for one row, and ggml's gemm adds each 64-element piece's
  integer sum into its float sums where the gemv adds a super block's once.
  patches/llama.cpp/0005 makes the x86 Q4_K gemm keep integer sums over the super block and
  multiply-add once, as the gemv does: each row is bitwise the gemv's (test_ggml_kernels.py on
  random blocks, test_llamacpp_exact.py on whole models). Repacked weights are on only where
  the build carries that patch (it exports a marker symbol); elsewhere the weights are kept
  as in the file. On Qwen2.5-Coder-1.5B Q4_K_M at two threads on an AVX-512 CPU they cut the
  plain step from 32-34 to 24-27 ms (llama.cpp's own: 27 ms) and a forward of 16 from
  240 to 164 ms (benchmarks/exactness_cost.py exact / exact-no-repack);
- the tiled K-quant matmul (batches of 8+ rows): GGML_CPU_TILED_MM=0.

The price: long-prompt prefill is slower than llama.cpp's (no tiled matmul), and single-step
attention is split over heads, not over keys.

patches/llama.cpp/0002 makes that attention as cheap as llama.cpp's own at a decode step: V
is widened from bf16 in registers inside the multiply-add (ggml converts it row by row with a
scalar loop) and a step's heads are split contiguously over the threads, the q heads of one
K/V head on one thread. Same bits; on the 1.5B at a 700-token context the step's attention
fell from ~15% to ~9% of its CPU time (perf, two threads: benchmarks/step_profile.py).

What makes a verify cheap again: set-up builds llama.cpp with patches/llama.cpp/, whose
Q4_K and Q6_K (0001) and Q4_1 (0003) dot products take up to four activation columns per
weight row, unpacking the row once, each column bitwise the one-column kernel's result
(tests/models/test_ggml_kernels.py checks the bits on random blocks). On Qwen2.5-Coder-1.5B
Q4_K_M at one thread a forward of 8 tokens fell from ~6.5 to ~3.7 plain steps and one of 64
from ~5.5 s to ~4.1 s; on SmolLM2 (Q4_1, two threads) a forward of 64 from ~410 to ~310 ms
(benchmarks/exactness_cost.py). Rows stay bitwise single-token rows. 0006 has those column
kernels multiply each 16-bit product pair by its block scale and accumulate it with one VNNI
instruction (vpdpwssd) where the build targets a CPU with it: integer sums, the same bits, a
verify of 16-64 tokens on the 1.5B 4-8% cheaper (exactness_cost.py, builds alternated).

patches/llama.cpp/0004 rewrites the exact configuration's attention row (K f16, V bf16 only):
keys in tiles of 256 at fixed cell indices, the softmax's maximum and rescale once a tile,
exp through ggml's vector routine, V accumulated in registers across a tile's keys. ggml's
loop paid a libm expf, a branch and a load and store of the accumulator at every key. The
arithmetic differs from ggml's (a verify row still equals the single-token row, bitwise:
test_llamacpp_exact.py, contexts crossing tile edges), and so do the bits of the logits; on
SmolLM2 at a 1,000-token context the plain step fell from ~16.8 to ~13.6 ms and a forward of
64 from ~610 to ~350 ms (with 0003; exactness_cost.py --context 1000).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import ctypes
import hashlib
import json
import operator
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any, NoReturn

import jinja2
import jinja2.ext
import jinja2.sandbox
import numpy as np
from llama_cpp import _utils as _llama_cpp_utils
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


def _close_devnull_at_exit() -> None:
    """llama_cpp opens two handles on os.devnull at import (for its high-level API's
    suppress_stdout_stderr) and never closes them, so the interpreter reports them as unclosed
    (ResourceWarning) when it exits. Close them at exit, before that report; a high-level
    `llama_cpp.Llama` in the same process keeps working until then."""
    for name in ("outnull_file", "errnull_file"):
        handle = getattr(_llama_cpp_utils, name, None)
        if handle is not None:
            atexit.register(handle.close)


_close_devnull_at_exit()
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


# How every model and context is made, so that a verify row (one forward of k tokens) equals
# the single-token rows (k forwards of one) bitwise at any thread count. Each entry switches
# off a kernel whose rounding depends on the batch shape or on the thread count (see
# "Exactness" above; tests/test_llamacpp_exact.py proves the result, and
# benchmarks/llamacpp_exact_rows.py measures the alternatives).
GGML_TYPE_BF16 = 30  # ggml.h; llama_cpp does not export it
EXACT_CONTEXT_PARAMS: dict[str, int] = {  # fields of llama_context_params
    "flash_attn_type": lib.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "type_k": lib.GGML_TYPE_F16,
    "type_v": GGML_TYPE_BF16,  # K and V of different types: no split-KV, no tiled attention
}


def _cpu_libraries() -> list[Path]:
    """The installed llama.cpp's CPU backend libraries (libggml-cpu*.so)."""
    return sorted((Path(lib.__file__).parent / "lib").glob("libggml-cpu*.so"))


def _repack_is_exact() -> bool:
    """Whether the installed llama.cpp's repacked-weight gemm gives bitwise its gemv's rows:
    true of a build with patches/llama.cpp/0005, which marks itself with a symbol. Stock
    builds sum a batch of 4+ rows in another order than one row, so they keep the weights as
    in the file."""
    for path in _cpu_libraries():
        with contextlib.suppress(OSError):
            if hasattr(ctypes.CDLL(str(path)), "ggml_cpu_draftless_repack_exact"):
                return True
    return False


def _build() -> str:
    """The installed llama.cpp build, as far as it sets verify costs: the llama-cpp-python
    version and a digest of its CPU libraries' bytes (our patches and the CPU flags change
    them). Their size alone did not tell builds apart: patch 0006 changed instructions and
    left libggml-cpu.so at the same 1,578,904 bytes, so a table probed on the build before
    it would have been taken for this one's. Hashing ~1.6 MB costs ~2 ms, once."""
    digest = hashlib.sha256()
    for path in _cpu_libraries():
        with contextlib.suppress(OSError):
            digest.update(path.read_bytes())
    return f"llama-cpp-python {version('llama_cpp_python')} ggml-cpu {digest.hexdigest()[:16]}"


# Repacked weights (CPU_REPACK) where the build makes their batch rows exact; else none.
EXACT_MODEL_PARAMS: dict[str, int] = {"use_extra_bufts": _repack_is_exact()}
_BUILD = _build()
# forward() and prefill() check at most this many ids given as a list without numpy
_SHORT = 64
# ggml's tiled K-quant matmul (batches of 8 rows and more) sums in another order than the
# one-row kernel. ggml reads this once, at its first matmul; a value the user set is kept.
os.environ.setdefault("GGML_CPU_TILED_MM", "0")


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), not the machine's total."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no sched_getaffinity (macOS, Windows)
        return os.cpu_count() or 1


def _note(message: str) -> None:
    """A one-line note to whoever loads the model: what was asked for is not what is used."""
    warnings.warn(message, UserWarning, stacklevel=4)


@dataclass(frozen=True, slots=True)
class LlamaCppOptions:
    n_ctx: int = 4096  # tokens the cache holds; capped at the model's training context
    n_threads: int = 0  # 0: every usable core; more than that is capped at it, with a note
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
        if "dtype" in options:
            raise ModelError(
                "dtype is a transformers option: llama.cpp computes in the GGUF's own types "
                "(use the hf backend to choose one)"
            )
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
    for field, value in EXACT_MODEL_PARAMS.items():
        setattr(params, field, value)
    params.vocab_only = vocab_only
    _LOG_ERRORS.clear()
    model = lib.llama_model_load_from_file(os.fsencode(path), params)
    if not model:
        detail = _first_error("llama.cpp could not read it")
        # A path typed by the user is its own name: say it once.
        where = str(path) if name in (str(path), path.name) else f"{name} from {path}"
        raise ModelError(f"cannot load {where}: {detail}")
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


# Message text is marked before the chat template renders it, so that afterwards the control
# tokens a user typed (`<|im_start|>` in a message) can be told apart from the markers the
# template writes itself: each control-token text in a message string is wrapped in these two
# private-use characters, the mark transformers' `apply_chat_template(sanitize_control_tokens=
# True)` uses. No vocabulary has them as text; any the user typed are dropped first, so they
# cannot forge a mark.
_MARK_START, _MARK_END = "\U000f0000", "\U000f0001"
_CONTROL_ATTRS = lib.LLAMA_TOKEN_ATTR_CONTROL | lib.LLAMA_TOKEN_ATTR_UNKNOWN  # parse_special's


def _mark_control_text(value: Any, control: re.Pattern[str]) -> Any:
    """`value` (a message, or any string, list or dict in one) with every control-token text
    in its strings wrapped in the marks. Dict keys are left alone."""
    if isinstance(value, str):
        value = value.replace(_MARK_START, "").replace(_MARK_END, "")
        return control.sub(lambda m: f"{_MARK_START}{m.group(0)}{_MARK_END}", value)
    if isinstance(value, dict):
        return {key: _mark_control_text(item, control) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_mark_control_text(item, control) for item in value]
    return value


def _token_bytes(vocab: int, token_id: int, buf: Any) -> bytes:
    """A token's piece (special tokens as their text), through `buf` or a bigger one."""
    n = lib.llama_token_to_piece(vocab, token_id, buf, len(buf), 0, True)
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = lib.llama_token_to_piece(vocab, token_id, buf, len(buf), 0, True)
    return bytes(buf.raw[:n])


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
        self._control: tuple[re.Pattern[str], re.Pattern[str]] | None = None  # see _patterns
        self._piece_buf = ctypes.create_string_buffer(256)

    def vocab_handle(self) -> int:
        """The llama_vocab pointer (for llguidance's tokenizer over the same pieces)."""
        return self._live_vocab()

    def tokenize_address(self) -> int:
        """The address of llama_tokenize, which llguidance calls with `vocab_handle()`."""
        return int(ctypes.cast(lib._lib.llama_tokenize, ctypes.c_void_p).value or 0)

    def grammar_pieces(self) -> list[bytes]:
        """Every token's bytes as a grammar engine reads the vocabulary: control tokens, and
        user-defined ones written like one (`<...>`), prefixed by 0xff, which no text holds,
        so no grammar writes them as text (llguidance's own reading of a llama.cpp vocab,
        which calls a function llama.cpp deprecated and warns once per token)."""
        vocab = self._live_vocab()
        buf = ctypes.create_string_buffer(256)
        user = lib.LLAMA_TOKEN_ATTR_USER_DEFINED
        pieces = []
        for t in range(self.vocab_size):
            piece = _token_bytes(vocab, t, buf)
            attr = lib.llama_vocab_get_attr(vocab, t)
            marked = attr & lib.LLAMA_TOKEN_ATTR_CONTROL or (
                attr & user and piece.startswith(b"<") and piece.endswith(b">")
            )
            pieces.append(b"\xff" + piece if marked else piece)
        return pieces

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
        special = bool(lib.llama_vocab_is_control(vocab, token_id)) or (
            token_id in self.eos_token_ids
        )
        entry = (_token_bytes(vocab, token_id, self._piece_buf), special)
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
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        """Render the GGUF's `tokenizer.chat_template` (Jinja) and tokenize it.

        The markers the template writes become special tokens; text in the messages is text:
        a message saying `<|im_end|>` gives the tokens of those ten characters, not the turn
        marker, so it cannot end its turn or start another. A message without control-token
        text gives exactly the tokens of the whole rendering tokenized with specials parsed.
        BOS is put first only if the model adds one and the template did not already write it.
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
        control, marked = self._patterns()
        try:
            text = self._template.render(
                messages=[_mark_control_text(dict(m), control) for m in messages],
                add_generation_prompt=add_generation_prompt,
                tools=None
                if tools is None
                else [_mark_control_text(dict(t), control) for t in tools],
                bos_token=self._special_text(bos),
                eos_token=self._special_text(eos),
            )
        except jinja2.exceptions.TemplateError as err:
            raise ModelError(f"the chat template of {self.name} failed: {err}") from None
        ids = self._encode_marked(text, control, marked)
        if self.add_bos and self.bos_token_id is not None and ids[:1] != [self.bos_token_id]:
            ids.insert(0, self.bos_token_id)
        return ids

    def _patterns(self) -> tuple[re.Pattern[str], re.Pattern[str]]:
        """(any control-token text, longest first; a marked control-token text or a lone mark).

        Control tokens are those llama_tokenize matches only with parse_special (attribute
        CONTROL or UNKNOWN); user-defined tokens are matched in plain text too."""
        if self._control is None:
            vocab = self._live_vocab()
            texts = {
                lib.llama_vocab_get_text(vocab, t).decode("utf-8", errors="replace")
                for t in range(self.vocab_size)
                if lib.llama_vocab_get_attr(vocab, t) & _CONTROL_ATTRS
            }
            longest_first = sorted(filter(None, texts), key=len, reverse=True)
            control = re.compile("|".join(map(re.escape, longest_first)) or "(?!)")
            marked = re.compile(
                f"{_MARK_START}({control.pattern}){_MARK_END}|[{_MARK_START}{_MARK_END}]"
            )
            self._control = (control, marked)
        return self._control

    def _encode_marked(
        self, text: str, control: re.Pattern[str], marked: re.Pattern[str]
    ) -> list[int]:
        """Tokens of a rendering whose message strings were marked by `_mark_control_text`.

        Without a mark (no message typed a control token) it is today's tokenization: the
        rendering tokenized whole, specials parsed. With one, see `_encode_runs`.
        """
        if _MARK_START not in text and _MARK_END not in text:
            return self._tokenize(text, add_special=False, parse_special=True)
        return self._encode_runs(text, control, marked)

    def _encode_runs(
        self, text: str, control: re.Pattern[str], marked: re.Pattern[str]
    ) -> list[int]:
        """The rendering as llama_tokenize(parse_special=True) cuts it, except that marked text
        is never a control token.

        llama.cpp cuts a text at its control tokens and tokenizes each run of text between
        them on its own. Here the control tokens are looked for in the template's text only;
        a marked token's text joins the run it sits in, and the run is tokenized as plain text:

            <|im_start|>user\n[Hi<|im_end|>]<|im_end|>    ([...]: a message's text)
            -> <|im_start|>  plain("user\nHi<|im_end|>")  <|im_end|>

        A lone mark (a template that cut a marked token apart) is dropped, but ends the run,
        so the halves on either side cannot join into a control token.
        """
        ids: list[int] = []
        run: list[str] = []  # plain text since the last control token or lone mark
        mid_text = False  # the run starts right after a lone mark, not a control token

        def flush() -> None:
            piece = "".join(run)
            run.clear()
            if piece:
                ids.extend(self._tokenize_plain(piece, mid_text=mid_text))

        for i, piece in enumerate(marked.split(text)):  # even: template text; odd: marked
            if i % 2 == 1:
                if piece is None:  # a lone mark
                    flush()
                    mid_text = True
                else:
                    run.append(piece)
                continue
            pos = 0
            for match in control.finditer(piece):
                run.append(piece[pos : match.start()])
                flush()
                ids.extend(self._tokenize(match.group(), add_special=False, parse_special=True))
                mid_text, pos = False, match.end()
            run.append(piece[pos:])
        flush()
        return ids

    def _tokenize_plain(self, piece: str, *, mid_text: bool) -> list[int]:
        """Tokens of `piece` with no control token parsed. `mid_text`: as it tokenizes in the
        middle of a text. SentencePiece vocabularies put a space before the start of a text;
        tokenizing after a newline and dropping the newline's tokens avoids it (as transformers
        does for the same cut)."""
        if mid_text:
            newline = self._tokenize("\n", add_special=False, parse_special=False)
            ids = self._tokenize("\n" + piece, add_special=False, parse_special=False)
            if ids[: len(newline)] == newline:
                return ids[len(newline) :]
        return self._tokenize(piece, add_special=False, parse_special=False)

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
    """A GGUF model behind the draftless model contract (see models.base).

    Besides the contract: `path` (the GGUF file), `n_ctx` (the context llama.cpp made, which
    can differ from the one asked for: a note says so), `threads` (the CPU threads used),
    `n_batch` (tokens per llama_decode) and `n_outputs_max` (logits rows per llama_decode).
    """

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
        self.path: Path = path
        self._model: int | None = model
        self._ctx: int | None = None
        self._batch: Any = None
        self._tokenizer = tokenizer
        self.tokenizer: Tokenizer = tokenizer
        self.vocab_size: int = self._tokenizer.vocab_size
        self._n_past = 0

        n_ctx_train = lib.llama_model_n_ctx_train(model)
        n_ctx = min(options.n_ctx, n_ctx_train) if n_ctx_train > 0 else options.n_ctx
        cores = usable_cores()
        threads = options.n_threads or cores
        if threads > cores:  # oversubscribed threads wait on each other at every barrier
            _note(f"{name}: {threads} threads asked for, {cores} usable cores: using {cores}")
            threads = cores
        self._threads = threads
        # what sets this model's verify costs (the cost-table cache keys by it): the build, and
        # the weights' layout as loaded (EXACT_MODEL_PARAMS at load time)
        repack = int(EXACT_MODEL_PARAMS.get("use_extra_bufts", True))
        self.kernels: str = f"{_BUILD} repack {repack}"
        params = lib.llama_context_default_params()
        for field, value in EXACT_CONTEXT_PARAMS.items():
            setattr(params, field, value)
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = options.n_batch
        params.n_seq_max = 1
        params.n_outputs_max = min(options.n_outputs_max, options.n_batch)
        params.n_threads = params.n_threads_batch = threads
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
        self.n_ctx: int = lib.llama_n_ctx(self._ctx)  # what llama.cpp made, not what was asked
        if self.n_ctx != options.n_ctx:
            why = (
                f"its training context is {n_ctx_train}"
                if n_ctx < options.n_ctx
                else "llama.cpp sizes contexts in multiples of 256"
            )
            _note(f"{name}: n_ctx {options.n_ctx} asked for, using {self.n_ctx} ({why})")
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
        """Load a GGUF. Options: n_ctx (4096), n_threads (0: every usable core), n_batch (512),
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
    def threads(self) -> int:
        """The CPU threads llama.cpp computes with (single steps and batches alike)."""
        return self._threads

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

    def _checked(self, token_ids: Sequence[int]) -> Sequence[int] | np.ndarray:
        """The ids (int32 [k], or the short list or tuple of Python ints as given), after
        every check that must pass before the cache changes."""
        self._require_open()
        if (
            type(token_ids) in (list, tuple)
            and len(token_ids) <= _SHORT
            and all(type(t) is int for t in token_ids)
        ):
            # A decode step's few ids: checked without numpy. A step's forward has just
            # streamed the weights through every cache, and numpy's call path, cold, costs
            # ~60 us against ~7 us warm (SmolLM2, 2 threads; benchmarks/step_overhead.py
            # --cold): ~0.5% of a step.
            if token_ids:
                self._check_range(min(token_ids), max(token_ids))
            if self._n_past + len(token_ids) > self.n_ctx:
                raise ContextFull(self._n_past, len(token_ids), self.n_ctx)
            return token_ids
        ids = np.asarray(token_ids)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise ValueError(
                f"token ids must be a flat sequence of integers, got {ids.dtype} "
                f"with shape {ids.shape}"
            )
        if ids.size:
            self._check_range(int(ids.min()), int(ids.max()))
        if self._n_past + ids.size > self.n_ctx:
            raise ContextFull(self._n_past, int(ids.size), self.n_ctx)
        return ids.astype(np.int32, copy=False)

    def _check_range(self, low: int, high: int) -> None:
        if low < 0 or high >= self.vocab_size:
            bad = low if low < 0 else high
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.vocab_size})")

    def _decode(
        self, ids: Sequence[int] | np.ndarray, pos0: int, *, logits: bool, restore_to: int
    ) -> None:
        """One llama_decode of ids [n <= n_batch] at positions pos0 .. pos0 + n - 1."""
        n = len(ids)
        if type(ids) is np.ndarray:
            self._tokens[:n] = ids
            self._pos[:n] = self._arange[:n] + pos0
            self._flags[:n] = logits
        else:  # a few Python ints (_checked): through ctypes, no numpy call
            tokens, pos, flags = self._batch.token, self._batch.pos, self._batch.logits
            for i, token in enumerate(ids):
                tokens[i] = token
                pos[i] = pos0 + i
                flags[i] = logits
        self._batch.n_tokens = n
        _LOG_ERRORS.clear()
        rc = lib.llama_decode(self._ctx, self._batch)
        if rc != 0:
            lib.llama_memory_seq_rm(self._mem, 0, restore_to, -1)
            self._n_past = restore_to
            detail = _first_error(f"llama_decode returned {rc}")
            raise ModelError(f"{self.name}: decoding failed: {detail}")
