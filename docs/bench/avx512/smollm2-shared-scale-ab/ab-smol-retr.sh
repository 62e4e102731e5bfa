#!/usr/bin/env bash
# SmolLM2 retrieval tasks, llama.cpp, 2 threads, no peers: A = 825e340, B = 49920ed (shared LiveCosts); A B A B
cd /work/main
while [ ! -f /work/notes/s17/dr.done ]; do sleep 5; done
for r in 1 2; do for t in A B; do
  if [ $t = A ]; then P=/tmp/base/src; else P=/tmp/wt-B/src; fi
  PYTHONPATH=$P .venv/bin/python -m draftless bench -m smollm2 --backend llamacpp \
    --tasks grounded-copy code-edit repetition rag-reference --no-peers --reps 3 --out /work/notes/s17/sr-$t$r > /work/notes/s17/sr-$t$r.out 2>&1
done; done
echo done > /work/notes/s17/sr.done
