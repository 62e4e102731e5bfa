"""The shape of the package: no import circles, and a core that imports with numpy alone."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "draftless"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    """Every draftless module -> the draftless modules it imports, at the top or lazily
    inside a function (`from draftless.x import y` counts as x, or x.y if that is a module)."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for target in targets:
                if target in modules and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_planted_cycle() -> None:
    graph = import_graph()
    assert "draftless.decoder" in graph["draftless.chat"]
    planted = {k: set(v) for k, v in graph.items()}
    planted["draftless.sampling"].add("draftless.chat")  # chat -> decoder -> sampling -> chat
    assert any({"draftless.chat", "draftless.sampling"} <= set(c) for c in cycles(planted))


def test_no_import_circles() -> None:
    """A module that imports a package's own parent (`draftless.cli.x` importing `draftless
    .cli`) or two modules importing each other, at the top or lazily, is a circle."""
    assert cycles(import_graph()) == []


def test_the_core_imports_with_numpy_alone() -> None:
    code = (
        "import sys\n"
        "import draftless.decoder, draftless.gate, draftless.sampling, draftless.sources\n"
        "import draftless.costs, draftless.metrics, draftless.chat, draftless.text\n"
        "import draftless.constraint\n"
        "heavy = [m for m in ('torch', 'transformers', 'llama_cpp', 'fastapi', 'uvicorn',\n"
        "                     'llguidance')\n"
        "         if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    env = dict(os.environ, PYTHONPATH=str(SRC))
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)
