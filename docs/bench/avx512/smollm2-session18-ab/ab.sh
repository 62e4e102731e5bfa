#!/bin/bash
# A = 59a4b9b (session start), B = HEAD; SmolLM2, llama.cpp, both cores; bench free-form + unseen prompts
cd /work/main
for arm in A B A B; do
  n=$((${n:-0}+1))
  PYTHONPATH=/tmp/ab$arm/src .venv/bin/python -m draftless bench -m smollm2 --backend llamacpp --tasks free-form benchmarks/unseen-free-form --no-peers --reps 3 --out /work/notes/s18/ab-$arm$n > /work/notes/s18/ab-$arm$n.out 2>&1
done
echo done > /work/notes/s18/ab.done
