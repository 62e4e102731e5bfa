"""Scratch (session 30): `benchmarks/gate_sim.py` with gate.py's module constants changed.

    PYTHONPATH=src python docs/bench/avx2/s30-lockstep/gate_variant.py STEEP_PROBE_STEPS=3 \
        replay /tmp/q15-streams.json --table docs/bench/avx2/s30-lockstep/q15-2t-table.json
"""
import runpy
import sys
from pathlib import Path

import draftless.gate as gate

for pair in filter(None, sys.argv[1].split(",")):
    name, value = pair.split("=")
    setattr(gate, name, type(getattr(gate, name))(value))
sys.argv = ["gate_sim.py", *sys.argv[2:]]
runpy.run_path(str(Path(__file__).resolve().parents[4] / "benchmarks/gate_sim.py"), run_name="__main__")
