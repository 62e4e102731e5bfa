"""Write benchmarks/heldout-real.json: prompts no gate change was tried on before it was made.

    python benchmarks/make_heldout_real.py      # CPython 3.11's standard library

Three families, made once (2026-12-04) and kept as written since:
- held-copy: "repeat this text" over module docstrings (real prose, 250-900 characters);
- held-edit: "rename this identifier" over whole functions (real code);
- held-free: free-form requests in genres the bench's free-form family lacks.
"""

from __future__ import annotations

import argparse
import base64
import calendar
import colorsys
import contextlib
import csv
import difflib
import fnmatch
import fractions
import graphlib
import heapq
import inspect
import ipaddress
import json
import queue
import random
import sched
import secrets
import shlex
import shutil
import statistics
import string
import textwrap
import zipfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

COPY_FROM: list[ModuleType] = [
    difflib, heapq, argparse, contextlib, string, fractions, statistics,
    queue, sched, graphlib, csv, random, secrets, ipaddress,
]  # fmt: skip
RENAMES = [  # (function, identifier, its new name)
    (textwrap.dedent, "margin", "common_prefix"),
    (fnmatch.translate, "res", "pattern_parts"),
    (colorsys.rgb_to_hls, "maxc", "max_channel"),
    (shutil.which, "normdir", "normalized_dir"),
    (difflib.get_close_matches, "cutoff", "min_ratio"),
    (shlex.split, "posix", "posix_mode"),
    (statistics.median_grouped, "interval", "width"),
    (calendar.monthrange, "year", "yr"),
    (heapq.merge, "iterables", "sources"),
    (textwrap.indent, "predicate", "should_indent"),
    (base64.b64decode, "altchars", "alt_chars"),
    (zipfile.is_zipfile, "filename", "path"),
]
FREE = [
    "Write a haiku sequence (three haiku) about a city at dawn.",
    "I have two job offers, one remote and one in an office. How should I decide?",
    "Explain what a hash table is to a ten-year-old.",
    "Write the opening paragraph of a mystery novel set on a train.",
    "What is the difference between weather and climate?",
    "Draft a polite email asking my landlord to fix a leaking tap.",
    "List some good habits for learning a new language, with a sentence on each.",
    "Tell me a fable about a fox and a crow, with a moral at the end.",
    "Why do leaves change colour in autumn?",
    "Write a short speech for a friend's wedding toast.",
    "Compare tea and coffee in a table with four rows.",
    "Give step-by-step instructions for changing a bicycle tyre.",
    "What was the significance of the printing press for science?",
    "Write a short conversation between a robot and a gardener.",
    "Suggest a three-day itinerary for a first visit to Rome.",
    "Explain recursion with an example in Python.",
]


def first_part(module: ModuleType, limit: int = 900) -> str:
    """The module's docstring up to `limit` characters, cut at a line end."""
    doc = inspect.getdoc(module) or ""
    return doc[:limit].rsplit("\n", 1)[0] if len(doc) > limit else doc


def rename_prompts(renames: list[tuple[Callable[..., object], str, str]]) -> list[dict]:
    """A "rename this identifier" prompt over each function's source in this Python."""
    prompts = []
    for fn, old, new in renames:
        source = inspect.getsource(fn)
        if old not in source:
            raise SystemExit(f"{fn.__qualname__} has no {old!r} in this Python")
        prompts.append({
            "id": f"{fn.__module__}.{fn.__name__}",
            "text": f"Rename `{old}` to `{new}` everywhere in this Python function. Reply with "
            f"the whole function and nothing else.\n\n```python\n{source}```",
        })  # fmt: skip
    return prompts


def main() -> None:
    copy = [
        {"id": m.__name__, "text": "Repeat the following text exactly, word for word, and "
         f"nothing else:\n\n{text}"}
        for m in COPY_FROM
        if len(text := first_part(m)) >= 250
    ]  # fmt: skip
    edit = rename_prompts(RENAMES)
    families = {
        "held-copy": copy,
        "held-edit": edit,
        "held-free": [{"id": f"f{i}", "text": text} for i, text in enumerate(FREE)],
    }
    about = (
        "Held out from every gate change: copy prompts from module docstrings and rename "
        "prompts from function sources of CPython 3.11's standard library (real prose, real "
        "code), and free-form prompts in genres the bench lacks. Built by "
        "benchmarks/make_heldout_real.py on 2026-12-04 before any gate change was tried on them."
    )
    out = Path(__file__).with_name("heldout-real.json")
    out.write_text(json.dumps({"about": about, "families": families}, indent=1) + "\n")
    print({name: len(items) for name, items in families.items()})


if __name__ == "__main__":
    main()
