"""The model contract: the only seam speculation uses.

A backend is duck-typed; it needs no base class. What the decoder relies on:

    forward(token_ids)  -> float32 array [k, vocab]
        Appends k tokens to the cache and returns the logits of every one of them:
        row i is the next-token distribution after token_ids[i].
    prefill(token_ids)  -> None
        Appends tokens whose logits nobody needs (the prompt, minus its last token).
    truncate(n)         -> None
        Drops every cache row past n. After truncate(n) and re-appending the same tokens,
        forward returns the logits a fresh run returns.
    n_past, n_ctx       tokens in the cache; tokens it can hold (None: no limit but memory).
        A forward or prefill past n_ctx raises ContextFull and changes nothing.
    name, backend, path, threads, vocab_size, eos_token_ids, tokenizer (see `Tokenizer`)

Worked example (carried-token discipline of the decoder): the prompt is [5, 9, 2].
prefill([5, 9]) leaves n_past == 2; the decoder carries 2 and, with draft [7, 7],
calls forward([2, 7, 7]) -> 3 rows; if only the first 7 is accepted and row 1 samples 4,
it calls truncate(4) (cache holds 5 9 2 7) and carries 4.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from draftless.errors import UserError


class ModelError(UserError):
    """A model cannot be loaded or used; the message is meant for the user, one line."""


class UnsupportedModelError(ModelError):
    """The model exists but cannot serve the contract (e.g. its state cannot be rewound)."""


class ContextFull(ModelError):
    """A forward or prefill would pass the context size; the cache is left as it was."""

    def __init__(self, n_past: int, k: int, n_ctx: int) -> None:
        self.n_past, self.k, self.n_ctx = n_past, k, n_ctx
        if n_past == 0:
            message = f"the prompt is {k:,} tokens; the context holds {n_ctx:,}"
        else:
            message = f"context full: {n_past:,} + {k:,} tokens > the context's {n_ctx:,}"
        super().__init__(message)


def cache_dir() -> Path:
    """Where draftless keeps assembled models, converted models and cost tables."""
    root = os.environ.get("DRAFTLESS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "draftless"
    )
    return Path(root)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str  # what the user typed, or the registry name
    path: Path  # a GGUF file or an HF model directory
    is_gguf: bool


@runtime_checkable
class Tokenizer(Protocol):
    bos_token_id: int | None
    eos_token_ids: frozenset[int]

    def encode(self, text: str, *, add_special: bool = False) -> list[int]:
        """Token ids of `text`; `add_special` adds what the model puts first (BOS)."""
        ...

    def decode(self, token_ids: Sequence[int], *, skip_special: bool = False) -> str: ...

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        """Token ids of a chat, rendered with the model's own template. Messages are OpenAI's
        ({"role", "content"}, an assistant's "tool_calls", a tool's "tool_call_id"); `tools`
        (OpenAI's function definitions) go to the template, which may or may not use them."""
        ...

    def is_special(self, token_id: int) -> bool: ...


@runtime_checkable
class Model(Protocol):
    name: str
    backend: str  # "llamacpp", "hf", ...
    vocab_size: int
    tokenizer: Tokenizer
    # What computes the forward ("" where nothing to name): a build or library version and
    # dtype. A stored cost table is keyed by it, since a new build changes what a verify costs.
    kernels: str

    @property
    def path(self) -> Path | None:
        """The model file or directory it was loaded from (None: built in memory)."""
        ...

    @property
    def n_ctx(self) -> int | None: ...

    @property
    def threads(self) -> int | None:
        """CPU threads the backend computes with (None: the backend's own default)."""
        ...

    @property
    def n_past(self) -> int: ...

    @property
    def eos_token_ids(self) -> frozenset[int]: ...

    def forward(self, token_ids: Sequence[int]) -> np.ndarray:
        """Append `token_ids` (k >= 1) and return their logits, float32 [k, vocab]."""
        ...

    def prefill(self, token_ids: Sequence[int]) -> None: ...

    def truncate(self, n: int) -> None: ...

    def close(self) -> None: ...
