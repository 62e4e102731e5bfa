#!/usr/bin/env bash
# 1.5B free-form, 2 threads: B = 49920ed (live costs per decoder), D = live costs per model; B D B D
cd /work/main
for r in 1 2; do for t in B D; do
  PYTHONPATH=/tmp/wt-$t/src .venv/bin/python -m draftless bench -m qwen2.5-coder-1.5b --backend llamacpp \
    --tasks free-form --no-peers --reps 3 --out /work/notes/s17/d-$t$r > /work/notes/s17/d-$t$r.out 2>&1
done; done
echo done > /work/notes/s17/d.done
