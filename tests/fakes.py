"""Test doubles: a numpy model that honours the model contract, and adversarial sources.

`InductionModel` is deterministic and exact: the logits of a position are a pure function of
the prefix, computed in float64 and cast to float32, so a row is bitwise the same however the
tokens were batched. It copies like an induction head (boosts the token that followed the
previous occurrence of the current token), so drafts from the stream get accepted often.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from draftless.models.base import ContextFull
from draftless.sources.base import Draft


class FakeTokenizer:
    bos_token_id = None

    def __init__(self, vocab: int, eos: frozenset[int]) -> None:
        self.vocab = vocab
        self.eos_token_ids = eos

    def encode(self, text: str, *, add_special: bool = False) -> list[int]:
        return [b % self.vocab for b in text.encode()]

    def decode(self, token_ids: Sequence[int], *, skip_special: bool = False) -> str:
        return "".join(chr(32 + t % 90) for t in token_ids)

    def apply_chat_template(self, messages, *, add_generation_prompt=True, tools=None) -> list[int]:
        return [t for m in messages for t in self.encode(m["content"])]

    def is_special(self, token_id: int) -> bool:
        return token_id in self.eos_token_ids


class InductionModel:
    backend = "fake"
    path = None
    threads = 1
    kernels = "numpy"

    def __init__(
        self,
        vocab: int = 50,
        seed: int = 0,
        copy_strength: float = 3.0,
        eos: int | None = None,
        n_ctx: int | None = None,
    ) -> None:
        rng = np.random.default_rng(seed)
        self.name = f"induction-{vocab}-{seed}"
        self.vocab_size = vocab
        self.copy_strength = copy_strength
        self.n_ctx = n_ctx  # None: no limit
        self._bigram = rng.normal(size=(vocab, vocab))  # [vocab, vocab]
        self._pos = rng.normal(scale=0.5, size=(64, vocab))  # [64, vocab] position wobble
        self._tokens: list[int] = []
        self._eos = frozenset() if eos is None else frozenset({eos})  # no eos: runs go the distance
        self.tokenizer = FakeTokenizer(vocab, self._eos)
        self.forward_calls: list[list[int]] = []
        self.fail_after: int | None = None  # raise on the forward call with this index
        self.on_forward: Callable[[list[int]], None] | None = None

    @property
    def n_past(self) -> int:
        return len(self._tokens)

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos

    def row(self, prefix: Sequence[int]) -> np.ndarray:
        """Logits after `prefix` (non-empty): float32 [vocab]."""
        last = prefix[-1]
        logits = self._bigram[last] + self._pos[len(prefix) % 64]
        for j in range(len(prefix) - 2, -1, -1):  # most recent earlier occurrence of `last`
            if prefix[j] == last:
                logits = logits.copy()
                logits[prefix[j + 1]] += self.copy_strength
                break
        return logits.astype(np.float32)

    def forward(self, token_ids: Sequence[int]) -> np.ndarray:
        ids = [int(t) for t in token_ids]
        if not ids:
            raise ValueError("forward needs at least one token")
        for t in ids:
            if not 0 <= t < self.vocab_size:
                raise ValueError(f"token id {t} outside the vocabulary")
        self._check_room(len(ids))
        self.forward_calls.append(ids)
        if self.on_forward is not None:
            self.on_forward(ids)
        start = len(self._tokens)
        self._tokens.extend(ids)  # the cache grows before the "kernel" runs
        if self.fail_after is not None and len(self.forward_calls) > self.fail_after:
            raise RuntimeError("injected failure mid-verify")
        return np.stack([self.row(self._tokens[: start + i + 1]) for i in range(len(ids))])

    def prefill(self, token_ids: Sequence[int]) -> None:
        ids = [int(t) for t in token_ids]
        self._check_room(len(ids))
        self._tokens.extend(ids)

    def _check_room(self, k: int) -> None:
        if self.n_ctx is not None and len(self._tokens) + k > self.n_ctx:
            raise ContextFull(len(self._tokens), k, self.n_ctx)

    def truncate(self, n: int) -> None:
        if n < 0:
            raise ValueError("negative truncate")
        del self._tokens[n:]

    def close(self) -> None:
        pass


class ScriptedSource:
    """Drafts from a function of the committed stream; records what it was told."""

    wants_topk = False
    topk_member = None

    def __init__(self, script: Callable[[list[int], int], Sequence[int]]) -> None:
        self.script = script
        self.stream: list[int] = []
        self.propose_calls = 0

    def propose(self, budget: int) -> Draft | None:
        self.propose_calls += 1
        tokens = [int(t) for t in self.script(self.stream, budget)][:budget]
        return Draft(tokens, "draft") if tokens else None

    def observe(self, committed: Sequence[int]) -> None:
        self.stream.extend(int(t) for t in committed)

    def observe_topk(self, token_ids, topk_ids) -> None:  # pragma: no cover - not wanted
        raise AssertionError("observe_topk called although wants_topk is False")


def perfect_source(reference: list[int]) -> ScriptedSource:
    """Knows the plain run's full stream (prompt + generation): always right."""
    return ScriptedSource(lambda s, n: reference[len(s) : len(s) + n])


def garbage_source(vocab: int, seed: int = 1) -> ScriptedSource:
    rng = np.random.default_rng(seed)
    return ScriptedSource(lambda s, n: rng.integers(0, vocab, size=n).tolist())


def alternating_source(reference: list[int], vocab: int, seed: int = 2) -> ScriptedSource:
    """Perfect on even calls, garbage on odd ones, half-right (right then wrong) otherwise."""
    rng = np.random.default_rng(seed)
    calls = [0]

    def propose(s: list[int], n: int) -> list[int]:
        calls[0] += 1
        good = reference[len(s) : len(s) + n]
        if calls[0] % 3 == 0:
            return good
        if calls[0] % 3 == 1:
            return rng.integers(0, vocab, size=n).tolist()
        half = len(good) // 2
        return good[:half] + [(t + 1) % vocab for t in good[half:]]

    return ScriptedSource(propose)


def random_source(vocab: int, seed: int = 3) -> ScriptedSource:
    """Random lengths (0..n) of random tokens, sometimes copying the stream's tail."""
    rng = np.random.default_rng(seed)

    def propose(s: list[int], n: int) -> list[int]:
        length = int(rng.integers(0, n + 1))
        if rng.random() < 0.5 and len(s) > length:
            start = int(rng.integers(0, len(s) - length))
            return s[start : start + length]
        return rng.integers(0, vocab, size=length).tolist()

    return ScriptedSource(propose)
