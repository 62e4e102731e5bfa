#!/usr/bin/env bash
# 1.5B free-form, llama.cpp, 2 threads: A = HEAD 825e340 (per-gate live scale), B = shared LiveCosts; A B A B
cd /work/main
for r in 1 2; do for t in A B; do
  if [ $t = A ]; then P=/tmp/base/src; else P=/tmp/wt-B/src; fi
  PYTHONPATH=$P .venv/bin/python -m draftless bench -m qwen2.5-coder-1.5b --backend llamacpp \
    --tasks free-form --no-peers --reps 3 --out /work/notes/s17/free-$t$r > /work/notes/s17/free-$t$r.out 2>&1
done; done
echo done > /work/notes/s17/free.done
