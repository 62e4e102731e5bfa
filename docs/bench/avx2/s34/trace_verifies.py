"""Scratch (session 34): every verify draftless makes on a prompt, with the gate behind it.

    PYTHONPATH=src python docs/bench/avx2/s34/trace_verifies.py MODEL PROMPT [PROMPT ...]

llama.cpp, both cores, greedy, 192 new tokens, the cascade and the model's cost table as the
bench uses them. Per verify: where (stream position), the gate (member / evidence bucket),
the draft's length and the tokens committed, whether the gate was on its prior alone, its
prior and the prior lowered by the member's record (`current_prior`), the member's pool
[accepted draft tokens, drafts that met a rejection], the shadow checks so far, the draft
and what the model wrote.
"""

import sys

import draftless.decoder as D
from draftless import SpeculativeDecoder, load_model, table_for
from draftless.sources.cascade import SpeculationIndex

model = load_model(sys.argv[1], backend="llamacpp", n_threads=2)
table = table_for(model)[0]
ACCOUNT = D.SpeculativeDecoder._account


def account(self, draft, committed, seconds, gate):
    if draft is not None and gate is not None:
        name = self._gate_for(draft)[0]
        decode = model.tokenizer.decode
        print(
            f"  at {len(self.history) - len(committed):4} {name:20} d={len(draft.tokens):2}"
            f" committed {len(committed):2} on_prior={gate._on_prior} prior {gate.prior:.2f}"
            f" lowered {gate.current_prior():.2f} pool {self._pool.get(draft.member)}"
            f" shadows {self.stats.shadow_checks}: {decode(draft.tokens)!r} -> "
            f"{decode(committed)!r}"
        )
    return ACCOUNT(self, draft, committed, seconds, gate)


D.SpeculativeDecoder._account = account
for text in sys.argv[2:]:
    print(f"# {text}")
    ids = model.tokenizer.apply_chat_template([{"role": "user", "content": text}])
    dec = SpeculativeDecoder(model, source=SpeculationIndex(model.vocab_size), cost_table=table)
    dec.append(ids)
    for _ in dec.stream(192):
        pass
    s = dec.stats
    print(f"  {len(ids)} prompt tokens, {s.verify_steps} verifies, {s.shadow_checks} shadow checks")
