"""Scratch: shadow-style acceptance of every recorded conversation draft, split by match bucket
and by where the matched occurrence lies (the prompt, or the model's own output)."""
import json, sys
from collections import defaultdict
ROOT = __import__("pathlib").Path(__file__).resolve().parents[4]; sys.path.insert(0, str(ROOT / "src"))
from draftless.gate import evidence_bucket
data = json.load(open(sys.argv[1]))
fam_stats = defaultdict(lambda: [0, 0, 0])  # drafts, accepted tokens, rejections (first 8 tokens)
D = int(sys.argv[2]) if len(sys.argv) > 2 else 8
for key, e in data["streams"].items():
    fam = key.split("/")[0]
    stream = e["prompt"] + e["generated"]; P = len(e["prompt"])
    for pos_s, (toks, mem, m) in e["drafts"].items():
        pos = int(pos_s)
        if mem != "conversation" or m < 1 or pos < P: continue
        suf = stream[pos - m:pos]; toks = toks[:D]
        region = "?"
        for end in range(pos - 1, m - 1, -1):
            if stream[end - m:end] == suf and stream[end:end + len(toks)] == toks[: max(0, min(len(toks), pos - end))] :
                region = "prompt" if end <= P else "gen"; break
        a = 0
        while a < len(toks) and pos + a < len(stream) and toks[a] == stream[pos + a]: a += 1
        s = fam_stats[(fam, evidence_bucket(m), region)]
        s[0] += 1; s[1] += a; s[2] += a < len(toks)
for k in sorted(fam_stats):
    n, acc, rej = fam_stats[k]
    p = acc / (acc + rej) if acc + rej else 0
    print(f"{k[0]:14s} {k[1]:5s} {k[2]:6s} drafts {n:5d}  mean acc {acc/n:5.2f}  p {p:.2f}")
