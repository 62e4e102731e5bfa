"""Scratch (session 34): a stop-loss on the gate's bets, replayed on recorded streams.

    zcat docs/bench/avx512/edits/q15-streams-edits.json.gz > /tmp/q15-streams.json
    PYTHONPATH=src python docs/bench/avx2/s34/stoploss_replay.py /tmp/q15-streams.json \
        docs/bench/avx2/s30-lockstep/q15-2t-table.json
    zcat docs/bench/avx512/edits/smol-streams-edits.json.gz > /tmp/smol-streams.json
    PYTHONPATH=src python docs/bench/avx2/s34/stoploss_replay.py /tmp/smol-streams.json \
        docs/bench/avx2/s34/smol-table.json

The rule, stop=S,H[,prior]: a verify whose draft, all lost, would cost more than S x max(tokens
committed so far, H) plus what the verifies have gained so far (committed minus cost, by the
table) is cut to the longest draft whose loss fits, else becomes a plain step (",prior": only
drafts of a gate on its prior alone); by construction the verifies' net loss by the table
stays under S x max(n, H): a floor of 1 / (1 + S) on answers of H tokens or more. cut=S,H:
the same, but a draft is never refused, only cut, down to the shortest the decoder verifies
(min_draft). Scored as docs/bench/avx2/s31/floor_variants.py scores (its `score`, its saved
hooks).
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "docs/bench/avx2/s31"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import floor_variants as F  # noqa: E402

import draftless.decoder as D  # noqa: E402
from draftless.costs import CostTable  # noqa: E402


def stoploss(args):
    slack, horizon, prior_only, keep_min = args

    def account(self, draft, committed, seconds, gate):
        if draft is not None:
            cost = self.live_costs.verify_cost(len(draft.tokens) + 1)
            self._balance = getattr(self, "_balance", 0.0) + len(committed) - cost
        return F.ACCOUNT(self, draft, committed, seconds, gate)

    def judge(self, proposal, room, stop_ids, min_draft):
        draft, gate = F.JUDGE(self, proposal, room, stop_ids, min_draft)
        if draft is None or gate is None or (prior_only and not gate._on_prior):
            return draft, gate
        budget = slack * max(self.stats.committed, horizon) + getattr(self, "_balance", 0.0)
        loss = self.live_costs.verify_cost(len(draft.tokens) + 1) - 1
        if loss > budget:
            # the longest draft whose loss fits, else a plain step
            d = len(draft.tokens)
            while d >= min_draft and self.live_costs.verify_cost(d + 1) - 1 > budget:
                d -= 1
            if d < min_draft and keep_min:
                d = min_draft  # never refused: cut to the shortest draft
            elif d < min_draft:
                return None, None
            return type(draft)(draft.tokens[:d], draft.member, draft.match_len), gate
        return draft, gate

    D.SpeculativeDecoder._account, D.SpeculativeDecoder._judge = account, judge


data = json.loads(Path(sys.argv[1]).read_text())
spec = json.loads(Path(sys.argv[2]).read_text())
table = CostTable(tuple(spec["ks"]), tuple(spec["costs"]))
variants = [("base", None, None)]
for h in (64, 128, 192):
    for s in (0.02,):
        variants.append((f"stop={s},{h}", stoploss, (s, h, False, False)))
        variants.append((f"stop={s},{h},prior", stoploss, (s, h, True, False)))
for s in (0.01, 0.02):
    for h in (0, 64, 192):
        variants.append((f"cut={s},{h}", stoploss, (s, h, False, True)))
for name, rule, value in variants:
    F.reset()
    if rule is not None:
        rule(value)
    F.score(name, data, table)
