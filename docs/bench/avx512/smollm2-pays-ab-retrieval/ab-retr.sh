#!/bin/bash
# A = c98c500 (before the per-draft check), B = HEAD; SmolLM2, llama.cpp, both cores; retrieval tasks, A B
cd /work/main
n=0
for arm in A B; do
  n=$((n+1))
  PYTHONPATH=/tmp/ab$arm/src .venv/bin/python -m draftless bench -m smollm2 --backend llamacpp --tasks grounded-copy code-edit repetition rag-reference --no-peers --reps 3 --out /work/notes/s19/retr-$arm$n > /work/notes/s19/retr-$arm$n.out 2>&1
done
echo done > /work/notes/s19/retr.done
