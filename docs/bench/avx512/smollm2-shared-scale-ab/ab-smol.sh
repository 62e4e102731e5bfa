#!/usr/bin/env bash
# SmolLM2 free-form, llama.cpp, 2 threads: A = 825e340 (per-gate live scale), B = 49920ed (shared LiveCosts); A B A B
cd /work/main
for r in 1 2; do for t in A B; do
  if [ $t = A ]; then P=/tmp/base/src; else P=/tmp/wt-B/src; fi
  PYTHONPATH=$P .venv/bin/python -m draftless bench -m smollm2 --backend llamacpp \
    --tasks free-form --no-peers --reps 3 --out /work/notes/s17/smol-$t$r > /work/notes/s17/smol-$t$r.out 2>&1
done; done
echo done > /work/notes/s17/smol.done
