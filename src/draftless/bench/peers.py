"""The peers: prompt-lookup decoding as two popular libraries ship it, on the same model, and
llama.cpp's own server with its speculation types (bench/llama_server.py).

    transformers       model.generate(..., prompt_lookup_num_tokens=n) on the very torch module
                       the hf backend wraps, against the same module's plain generate()
    llama-cpp-python   Llama(draft_model=LlamaPromptLookupDecoding(num_pred_tokens=n)) against a
                       Llama without a draft model, both on the GGUF the llamacpp backend loaded
    llama-server       plain, --spec-type ngram-simple / ngram-map-k / ngram-mod, and a draft
                       model where one is known (qwen2.5-coder-0.5b for the 1.5b), each
                       against llama-server plain; skipped with a note when no binary is built

Every peer gets the prompt token ids we use (chat template included), max_new_tokens, our
stop ids and greedy decoding (or temperature with the prompt's seed, in the peer's own
sampler), and is timed prompt in -> tokens out like ours. Forward passes are counted with a
hook, so a peer reports steps, drafted and accepted tokens in our vocabulary (accepted is
committed - steps: each forward commits its accepted drafts plus one).

A peer whose library is missing is skipped with a note; its import is lazy.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from draftless.bench.runner import Job, Method, Run
from draftless.metrics import DecodeStats
from draftless.models.base import Model

HF_PLD = (10, 3)  # transformers' prompt_lookup_num_tokens
LLAMACPP_PLD = (2, 10)  # LlamaPromptLookupDecoding(num_pred_tokens=...)
PEER_N_CTX = 2048  # llama-cpp-python keeps n_ctx x vocab floats of logits with a draft model


def peer_names() -> tuple[str, ...]:
    """Every peer's name on any backend (what `draftless bench --peers` accepts), known
    before a model is loaded."""
    from draftless.bench.llama_server import CONFIGS, DRAFT_KEY

    names = [_names("hf", "transformers", n)[0] for n in (None, *HF_PLD)]
    names += [_names("lcp", "llama-cpp-python", n)[0] for n in (None, *LLAMACPP_PLD)]
    names += [c.name for c in CONFIGS] + [f"lsrv-{DRAFT_KEY}"]
    return tuple(names)


def peer_stats(calls: Sequence[int], prompt_len: int, committed: int) -> DecodeStats:
    """Forward widths of one run -> DecodeStats. The first forward holds the prompt (and, for
    transformers, the first draft); every later one holds the last token and a draft.

    peer_stats([5, 3, 1], 5, 4): the prompt forward commits 1, a forward of 3 verifies a
    2-token draft, a plain forward commits 1 -> 3 steps, 1 verify, 2 drafted, 1 accepted.
    """
    drafted = [w - prompt_len if i == 0 else w - 1 for i, w in enumerate(calls)]
    drafted = [max(0, d) for d in drafted]
    verify = sum(1 for d in drafted if d > 0)
    total = sum(drafted)
    accepted = min(total, max(0, committed - len(calls)))
    return DecodeStats(
        steps=len(calls),
        verify_steps=verify,
        plain_steps=len(calls) - verify,
        committed=committed,
        drafted=total,
        accepted=accepted,
    )


def _names(
    key: str, library: str, lookup: int | None, *, plain: str | None = None
) -> tuple[str, str, str | None]:
    """(name, label, baseline) of a peer: its library's plain generate (labelled `plain`, or
    the library's name) when lookup is None, else prompt lookup with `lookup` tokens, measured
    against that plain generate."""
    if lookup is None:
        return f"{key}-generate", plain or library, None
    return f"{key}-pld-{lookup}", f"{library} PLD n={lookup}", f"{key}-generate"


def _truncate_at_stop(tokens: list[int], stops: frozenset[int], limit: int) -> list[int]:
    out: list[int] = []
    for t in tokens[:limit]:
        out.append(t)
        if t in stops:
            break
    return out


# -- transformers -------------------------------------------------------------------------------
def torch_module(model: Model) -> Any:
    """The transformers module behind an hf-backend model."""
    from draftless.models.hf import HFModel

    if not isinstance(model, HFModel):
        raise TypeError(f"{model!r} does not wrap a transformers model")
    return model.torch_model


class TransformersGenerate:
    """`generate()` of transformers: plain (n None) or prompt lookup with n tokens."""

    exact = False  # transformers' sampler, not ours

    def __init__(self, model: Model, prompt_lookup: int | None) -> None:
        self.module = torch_module(model)
        self.n = prompt_lookup
        self.stops = frozenset(model.eos_token_ids)
        self.name, self.label, self.baseline = _names(
            "hf", "transformers", prompt_lookup, plain="transformers generate"
        )

    def run(self, job: Job) -> Run:
        import torch
        from transformers import GenerationConfig

        stops = sorted(self.stops)
        sampled = job.temperature > 0
        config = GenerationConfig(
            max_new_tokens=job.max_new_tokens,
            do_sample=sampled,
            temperature=job.temperature if sampled else None,
            top_k=0 if sampled else None,  # our sampler keeps the whole distribution
            top_p=1.0 if sampled else None,
            repetition_penalty=1.0,
            num_beams=1,
            eos_token_id=stops or None,
            pad_token_id=stops[0] if stops else 0,
            prompt_lookup_num_tokens=self.n,
            use_cache=True,
        )
        ids = torch.tensor([list(job.ids)], dtype=torch.long)  # [1, L]
        calls: list[int] = []  # forward widths
        cached: list[int] = []  # tokens in the cache when each forward starts
        first_end: list[float] = []  # when the first forward returned

        def before(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            x = kwargs.get("input_ids", args[0] if args else None)
            if x is not None:
                calls.append(int(x.shape[-1]))
                cached.append(_cache_length(kwargs))

        def after(*_: Any) -> None:
            if not first_end:
                first_end.append(time.perf_counter())

        if sampled:
            torch.manual_seed(job.seed or 0)
        hooks = [
            self.module.register_forward_pre_hook(before, with_kwargs=True),
            self.module.register_forward_hook(after),
        ]
        try:
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = self.module.generate(
                    ids, attention_mask=torch.ones_like(ids), generation_config=config
                )
            seconds = time.perf_counter() - t0
        finally:
            for hook in hooks:
                hook.remove()
        tokens = _truncate_at_stop(out[0, ids.shape[1] :].tolist(), self.stops, job.max_new_tokens)
        # The second forward starts on a cache of the prompt and the first forward's tokens
        # but the last one (which it carries); without a second forward, all came from the first.
        first = cached[1] - len(job.ids) + 1 if len(cached) > 1 and cached[1] > 0 else len(tokens)
        first = max(1, min(first, len(tokens)))
        first_seconds = (first_end[0] - t0) if first_end else seconds
        stats = peer_stats(calls, len(job.ids), len(tokens))
        return Run(tuple(tokens), seconds, first_seconds, first, stats)


def _cache_length(kwargs: dict[str, Any]) -> int:
    """Tokens already in the KV cache when a transformers forward starts (0 if unknown)."""
    position = kwargs.get("cache_position")
    if position is not None and position.numel():
        return int(position.reshape(-1)[0])
    cache = kwargs.get("past_key_values")
    try:
        return int(cache.get_seq_length()) if cache is not None else 0
    except (AttributeError, TypeError):
        return 0


# -- llama-cpp-python ---------------------------------------------------------------------------
class LlamaCppPython:
    """llama-cpp-python's high-level `Llama.generate`: plain, or with prompt lookup."""

    exact = False  # llama.cpp's sampler, not ours

    def __init__(self, llm: Any, stops: frozenset[int], num_pred_tokens: int | None) -> None:
        self.llm = llm
        self.stops = stops
        self.n = num_pred_tokens
        self.name, self.label, self.baseline = _names("lcp", "llama-cpp-python", num_pred_tokens)

    def run(self, job: Job) -> Run:
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        llm = self.llm
        llm.draft_model = (
            None if self.n is None else LlamaPromptLookupDecoding(num_pred_tokens=self.n)
        )
        calls: list[int] = []
        evaluate = llm.eval

        def counted(tokens: Sequence[int]) -> None:
            calls.append(len(tokens))
            evaluate(tokens)

        sampled = job.temperature > 0
        llm.set_seed(job.seed or 0)
        llm.reset()  # no prompt-prefix reuse from the previous run: prefill is timed too
        llm.eval = counted
        tokens: list[int] = []
        first_seconds, first = 0.0, 0  # until the prompt forward's token; its token count
        try:
            t0 = time.perf_counter()
            if job.max_new_tokens > 0:
                for token in llm.generate(
                    list(job.ids),
                    temp=job.temperature if sampled else 0.0,
                    top_k=0,
                    top_p=1.0,
                    min_p=0.0,
                    typical_p=1.0,
                    repeat_penalty=1.0,
                    reset=True,
                ):
                    tokens.append(int(token))
                    if len(calls) == 1:  # still tokens of the prompt forward
                        first_seconds, first = time.perf_counter() - t0, len(tokens)
                    if token in self.stops or len(tokens) >= job.max_new_tokens:
                        break
            seconds = time.perf_counter() - t0
        finally:
            del llm.eval  # back to the class method
        stats = peer_stats(calls, len(job.ids), len(tokens))
        return Run(tuple(tokens), seconds, first_seconds, first, stats)


def llama_cpp_python_peers(
    model: Model, *, n_ctx: int = PEER_N_CTX, sizes: Sequence[int] = LLAMACPP_PLD
) -> list[Method]:
    """The llama-cpp-python baseline and its prompt-lookup configurations.

    Two `Llama` objects on the model's GGUF: the baseline without a draft model (logits of the
    last row only, as users run it), and one with `logits_all=True`, which
    LlamaPromptLookupDecoding needs (its verify reads every row's logits; without it the
    logits buffer holds n_batch rows and verifies past position n_batch fail). The draft model
    is swapped per run. Same thread counts and batch size as our backend, and flash attention
    on: our context takes llama.cpp's default (auto), which enables it on the CPU, while
    `Llama()` would turn it off.
    """
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    if model.path is None:
        raise TypeError(f"{model!r} has no GGUF path")
    threads = model.threads or os.cpu_count() or 1
    common: dict[str, Any] = dict(
        model_path=str(model.path),
        n_ctx=n_ctx,
        n_threads=threads,
        n_threads_batch=threads,
        n_batch=512,
        verbose=False,
        flash_attn=True,
    )
    plain = Llama(**common)
    spec = Llama(**common, logits_all=True, draft_model=LlamaPromptLookupDecoding())
    stops = frozenset(model.eos_token_ids)
    methods: list[Method] = [LlamaCppPython(plain, stops, None)]
    methods += [LlamaCppPython(spec, stops, n) for n in sizes]
    return methods


def transformers_peers(model: Model, sizes: Sequence[int] = HF_PLD) -> list[Method]:
    methods: list[Method] = [TransformersGenerate(model, None)]
    methods += [TransformersGenerate(model, n) for n in sizes]
    return methods


def peers_for(model: Model) -> tuple[list[Method], list[str]]:
    """The peers of `model`'s backend, and notes on any that had to be skipped."""
    makers: dict[str, tuple[str, Callable[[Model], list[Method]]]] = {
        "hf": ("transformers", transformers_peers),
        "llamacpp": ("llama_cpp", llama_cpp_python_peers),
    }
    if model.backend not in makers:
        return [], [f"no peers for backend {model.backend}"]
    package, make = makers[model.backend]
    if importlib.util.find_spec(package) is None:
        return [], [f"peers skipped: {package} is not installed"]
    methods: list[Method] = []
    notes: list[str] = []
    if model.backend == "llamacpp":
        from draftless.bench.llama_server import llama_server_peers

        # The list returned is the server group's own: a speculative configuration whose
        # output differs from llama-server plain's is appended to it while the bench runs.
        servers, notes = llama_server_peers(model)
        methods += servers
    try:
        methods = make(model) + methods
    except (TypeError, ImportError, ValueError, RuntimeError) as err:
        notes.append(f"peers skipped on {model.backend}: {err}")
    return methods, notes
