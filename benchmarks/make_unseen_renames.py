"""Write benchmarks/unseen-renames/task.json: renames in real code, for wall-time runs.

    python benchmarks/make_unseen_renames.py      # CPython 3.11's standard library
    draftless bench --tasks benchmarks/unseen-renames

Made once (2026-12-06) after the edit learner (`sources/edits.py`) was written and before any
wall-time run on them, from functions none of the other prompt sets use: each renames an
identifier that occurs four or more times in the function, so a model that renames
consistently leaves the source and rejoins it several times. Kept as written since.
"""

from __future__ import annotations

import copy
import functools
import getopt
import gzip
import html
import json
import locale
import string
import tempfile
import textwrap
import urllib.parse
from pathlib import Path

from make_heldout_real import rename_prompts

RENAMES = [  # (function, identifier, its new name)
    (urllib.parse.urljoin, "base", "base_url"),
    (functools.total_ordering, "cls", "target_class"),
    (getopt.gnu_getopt, "opts", "parsed"),
    (textwrap.shorten, "width", "max_width"),
    (tempfile.mkstemp, "prefix", "name_prefix"),
    (locale.format_string, "val", "value"),
    (string.capwords, "sep", "separator"),
    (urllib.parse.urlsplit, "netloc", "host_part"),
    (gzip.compress, "data", "payload"),
    (html.escape, "quote", "escape_quotes"),
    (copy.deepcopy, "memo", "seen"),
]


def main() -> None:
    prompts = rename_prompts(RENAMES)
    task = {
        "title": "Renames, unseen",
        "kind": "retrieval",
        "temperature": 0.0,
        "answer_prefix": "```python\n",
        "description": "Renames of an identifier that occurs four or more times in a function "
        "of CPython 3.11's standard library, written on 2026-12-06 by "
        "benchmarks/make_unseen_renames.py after the edit learner and never used to tune it. "
        "Run with: draftless bench --tasks benchmarks/unseen-renames",
        "prompts": prompts,
    }
    out = Path(__file__).with_name("unseen-renames") / "task.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(task, indent=1) + "\n")
    print(f"{len(prompts)} prompts -> {out}")


if __name__ == "__main__":
    main()
