"""Every verify of draftless on one bench prompt: where it drafted, how long, how much was
accepted, the length of the match behind it and its member.

    PYTHONPATH=src python benchmarks/verify_trace.py -m qwen2.5-coder-1.5b grounded-copy honeybees

The decoder runs as the bench runs it (the cascade, the task's references, the model's stored
or default cost table, the model's stop ids). A line per verify:
    pos 136 draft 55 acc 20 committed 21 match 136 conversation
"""

from __future__ import annotations

import argparse

from draftless.bench.runner import _cascade, _chat_ids, _encode
from draftless.bench.tasks import load_task
from draftless.costs import table_for
from draftless.decoder import SpeculativeDecoder
from draftless.models.registry import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task")
    parser.add_argument("prompt_id")
    parser.add_argument("-m", "--model", default="smollm2")
    parser.add_argument("-n", type=int, default=192, help="new tokens at most")
    args = parser.parse_args()
    model = load_model(args.model, backend="llamacpp")
    task = load_task(args.task)
    prompt = next(p for p in task.prompts if p.id == args.prompt_id)
    source = _cascade(model)
    for ref in task.references:
        source.add_reference(model.tokenizer.encode(ref))
    dec = SpeculativeDecoder(model, source=source, cost_table=table_for(model)[0])
    proposed = []
    propose = source.propose
    source.propose = lambda budget: proposed.append(propose(budget)) or proposed[-1]
    dec.append(_chat_ids(model, prompt.text) + _encode(model, prompt.answer_prefix))
    out: list[int] = []
    stops = model.eos_token_ids
    while len(out) < args.n and not (out and out[-1] in stops):
        drafted, accepted = dec.stats.drafted, dec.stats.accepted
        proposed.clear()
        got = dec.step(args.n - len(out), stops)
        if dec.stats.drafted > drafted:
            d = proposed[-1]
            print(
                f"pos {len(out):3d} draft {dec.stats.drafted - drafted:2d} "
                f"acc {dec.stats.accepted - accepted:2d} committed {len(got):2d} "
                f"match {d.match_len} {d.member}"
            )
        out += got
    model.close()


if __name__ == "__main__":
    main()
