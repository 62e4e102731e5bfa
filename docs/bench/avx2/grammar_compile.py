"""Scratch (session 30): what compiling the auto-mode call grammar costs a request on the 0.5B (llama.cpp
vocabulary, 151k tokens); the first includes building the tokenizer for llguidance, cached after.

    .venv/bin/python docs/bench/avx2/grammar_compile.py
"""
import time, json
import sys, pathlib
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "src"))
from draftless import load_model
from draftless.grammar import GrammarSpec, compile_grammar
from draftless.serve.tools import auto_call_grammar
m = load_model("qwen2.5-coder-0.5b", backend="llamacpp", n_threads=2)
tools = [{"type":"function","function":{"name":n,"description":"d","parameters":{"type":"object","properties":{"path":{"type":"string"},"content":{"type":"string"},"days":{"type":"integer","maximum":7}},"required":["path"]}}} for n in ("read_file","write_file","get_weather","list_dir")]
from draftless.serve.protocol import ChatRequest
tags=(m.tokenizer.encode("<tool_call>")[0], m.tokenizer.encode("</tool_call>")[0])
g = auto_call_grammar(tools, True, tags)
for i in range(4):
    t=time.perf_counter(); gr=compile_grammar(m, GrammarSpec("lark", g), m.eos_token_ids); print("compile ms", (time.perf_counter()-t)*1e3)
