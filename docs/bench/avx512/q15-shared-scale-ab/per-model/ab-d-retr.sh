#!/usr/bin/env bash
# 1.5B retrieval tasks, 2 threads, no peers: D = live costs per model, B = per decoder (49920ed); D B
cd /work/main
for t in D B; do
  PYTHONPATH=/tmp/wt-$t/src .venv/bin/python -m draftless bench -m qwen2.5-coder-1.5b --backend llamacpp \
    --tasks grounded-copy code-edit repetition rag-reference --no-peers --reps 3 --out /work/notes/s17/dr-$t > /work/notes/s17/dr-$t.out 2>&1
done
echo done > /work/notes/s17/dr.done
