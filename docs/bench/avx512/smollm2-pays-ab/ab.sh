#!/bin/bash
# A = c98c500 (HEAD before the per-draft check), B = that plus gate.pays in _draft; SmolLM2, llama.cpp,
# both cores; bench free-form + unseen prompts, A B A B
cd /work/main
n=0
for arm in A B A B; do
  n=$((n+1))
  if [ $arm = A ]; then src=/tmp/base/src; else src=/tmp/abB/src; fi
  PYTHONPATH=$src .venv/bin/python -m draftless bench -m smollm2 --backend llamacpp --tasks free-form benchmarks/unseen-free-form --no-peers --reps 3 --out /work/notes/s19/ab-$arm$n > /work/notes/s19/ab-$arm$n.out 2>&1
done
echo done > /work/notes/s19/ab.done
