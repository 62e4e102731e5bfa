"""The decoder's decisions on the bench's prompts, with the gate pricing by the cost table
alone (clock=None: no live timing), so a run is deterministic: per prompt the tokens, the
steps, the verifies and their draft lengths. Run under two trees and compare the outputs: an
identical file says the change did not alter one decision on these prompts.

    PYTHONPATH=<tree>/src .venv/bin/python decisions.py TASK... > out.json
"""

import hashlib
import json
import sys

from draftless import SpecOptions, SpeculativeDecoder, load_model, table_for
from draftless.bench.runner import Runner, Ours, _cascade
from draftless.bench.tasks import load_tasks
from draftless.sampling import SamplingOptions

model = load_model("smollm2", backend="llamacpp", n_threads=2)
table = table_for(model)[0]
plain = Ours(model, spec=False, cost_table=table)
runner = Runner(model, [plain], reps=1)
out = {}
for task in load_tasks(sys.argv[1:]):
    for job in runner.jobs(task):
        source = _cascade(model)
        for ref in job.references:
            source.add_reference(list(ref))
        sampling = SamplingOptions(temperature=max(0.0, job.temperature), seed=job.seed)
        model.truncate(0)
        dec = SpeculativeDecoder(
            model, sampling=sampling, source=source, options=SpecOptions(), cost_table=table,
            clock=None,
        )
        dec.append(job.ids)
        tokens = [t for chunk in dec.stream(job.max_new_tokens) for t in chunk]
        s = dec.stats
        out[f"{task.name}/{job.prompt_id}"] = {
            "tokens": hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16],
            "n": len(tokens),
            "steps": s.steps,
            "verifies": s.verify_steps,
            "drafted": s.drafted,
            "accepted": s.accepted,
            "shadow_checks": s.shadow_checks,
            "draft_lengths": dict(sorted(s.draft_lengths.items())),
        }
        print(task.name, job.prompt_id, s.steps, s.verify_steps, file=sys.stderr)
print(json.dumps(out, indent=1))
