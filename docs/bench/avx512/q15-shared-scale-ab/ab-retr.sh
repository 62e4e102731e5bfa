#!/usr/bin/env bash
# 1.5B retrieval tasks, llama.cpp, 2 threads, no peers: A = HEAD 825e340, B = shared LiveCosts; B A
cd /work/main
for t in B A; do
  if [ $t = A ]; then P=/tmp/base/src; else P=/tmp/wt-B/src; fi
  PYTHONPATH=$P .venv/bin/python -m draftless bench -m qwen2.5-coder-1.5b --backend llamacpp \
    --tasks grounded-copy code-edit repetition rag-reference --no-peers --reps 3 --out /work/notes/s17/retr-$t > /work/notes/s17/retr-$t.out 2>&1
done
echo done > /work/notes/s17/retr.done
