#!/usr/bin/env bash
# SmolLM2, llama.cpp, the unseen free-form prompts: A = 825e340, B = shared LiveCosts; A B
cd /work/main
for t in A B; do
  if [ $t = A ]; then P=/tmp/base/src; else P=/tmp/wt-B/src; fi
  PYTHONPATH=$P .venv/bin/python -m draftless bench -m smollm2 --backend llamacpp \
    --tasks benchmarks/unseen-free-form --no-peers --reps 3 --out /work/notes/s17/un-$t > /work/notes/s17/un-$t.out 2>&1
done
