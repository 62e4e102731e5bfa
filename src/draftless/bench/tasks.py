"""The bench tasks: one folder per task under `bench/tasks/`, each with a `task.json`.

    tasks/grounded-copy/task.json      {"title", "kind", "description", "temperature",
                                        "seed"?, "references"?, "answer_prefix"?,
                                        "prompts" | "prompts_from"}
                                       a prompt: {"id", "text", "answer_prefix"?}
    tasks/grounded-copy/tea.txt        files a prompt pulls in with {{file:tea.txt}}

`kind` is "retrieval" (there is something to copy: the speculative target is to beat the best
peer) or "free" (nothing to retrieve: the target is never to lose time). `references` are files
of the folder injected into the cascade with `add_reference`. `prompts_from` reuses another
task's prompts (the sampled grounded copy). `answer_prefix` (per task, or per prompt) is the
text the assistant's answer starts with (e.g. "```python\n"), appended to the chat-templated
prompt: it gets a small model past "Sure, here is ..." into the answer itself. A sampled
task (temperature > 0) gives prompt i the seed `seed + i`, the same for every method and rep.

Worked example: a task.json with prompts [{"id": "tea", "text": "Copy: {{file:tea.txt}}"}]
loads as Task(prompts=(Prompt(id="tea", text="Copy: To make a good pot ...", seed=None),)).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TASKS_DIR = Path(__file__).with_name("tasks")
KINDS = ("retrieval", "free")
MIN_PROMPTS = 3
_FILE = re.compile(r"\{\{file:([^}]+)\}\}")

# The suite, in report order.
TASK_ORDER = (
    "grounded-copy",
    "code-edit",
    "repetition",
    "free-form",
    "rag-reference",
    "grounded-copy-sampled",
)


class TaskError(ValueError):
    """A task name or a task file is wrong; the message names it."""


@dataclass(frozen=True, slots=True)
class Prompt:
    id: str
    text: str  # the user message, files already pulled in
    seed: int | None  # sampling seed; None for greedy tasks
    answer_prefix: str = ""  # the start of the assistant's answer, put after the chat template


@dataclass(frozen=True, slots=True)
class Task:
    name: str  # the folder name, e.g. "grounded-copy"
    title: str
    kind: str  # "retrieval" | "free"
    description: str
    temperature: float  # <= 0: greedy
    prompts: tuple[Prompt, ...]
    references: tuple[str, ...]  # texts injected with add_reference

    @property
    def sampled(self) -> bool:
        return self.temperature > 0


def task_names(root: Path = TASKS_DIR) -> list[str]:
    """Every task folder under `root`: the suite order first, then any others, sorted."""
    found = sorted(p.name for p in root.iterdir() if (p / "task.json").is_file())
    return [n for n in TASK_ORDER if n in found] + [n for n in found if n not in TASK_ORDER]


def load_task(name: str, root: Path = TASKS_DIR) -> Task:
    folder = root / name
    spec = _read_spec(folder)
    title = _field(spec, "title", str, folder)
    kind = _field(spec, "kind", str, folder)
    if kind not in KINDS:
        raise TaskError(f"{folder}/task.json: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    temperature = float(_field(spec, "temperature", (int, float), folder))
    seed = spec.get("seed")
    if temperature > 0 and not isinstance(seed, int):
        raise TaskError(f"{folder}/task.json: a sampled task needs an integer 'seed'")
    if "prompts_from" in spec:
        source_folder = root / _field(spec, "prompts_from", str, folder)
        raw = _field(_read_spec(source_folder), "prompts", list, source_folder)
    else:
        source_folder = folder
        raw = _field(spec, "prompts", list, folder)
    default_prefix = _string(spec, "answer_prefix", folder)
    prompts = []
    for i, entry in enumerate(raw):
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("id"), str)
            or not isinstance(entry.get("text"), str)
        ):
            raise TaskError(f"{source_folder}/task.json: prompt {i} needs string 'id' and 'text'")
        text = _expand(entry["text"], source_folder)
        prefix = _string(entry, "answer_prefix", source_folder) or default_prefix
        sample_seed = seed + i if temperature > 0 and seed is not None else None
        prompts.append(Prompt(entry["id"], text, sample_seed, prefix))
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        raise TaskError(f"{source_folder}/task.json: prompt ids are not unique")
    if len(prompts) < MIN_PROMPTS:
        raise TaskError(
            f"{folder}/task.json: {len(prompts)} prompts; a task needs at least "
            f"{MIN_PROMPTS} (single-prompt speedups are fragile)"
        )
    refs = spec.get("references", [])
    if not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
        raise TaskError(f"{folder}/task.json: 'references' must be a list of file names")
    references = tuple(_read(folder / r) for r in refs)
    description = str(spec.get("description", ""))
    return Task(name, title, kind, description, temperature, tuple(prompts), references)


def load_tasks(names: Sequence[str] | None = None, root: Path = TASKS_DIR) -> list[Task]:
    """The named tasks in suite order (all of them for None), then any given as a folder
    holding a task.json (a user's own prompts, in the suite's format), in the order given.
    A name that is neither is a TaskError."""
    known = task_names(root)
    if names is None:
        return [load_task(n, root) for n in known]
    given = [n for n in names if n not in known]
    folders = [Path(n).resolve() for n in given]
    for name, folder in zip(given, folders, strict=True):
        if not (folder / "task.json").is_file():
            raise TaskError(
                f"unknown task {name!r}: use one of {', '.join(known)}, "
                "or a folder holding a task.json"
            )
    tasks = [load_task(n, root) for n in known if n in names]
    tasks += [load_task(f.name, f.parent) for f in folders]
    taken = [t.name for t in tasks]
    if len(set(taken)) != len(taken):
        raise TaskError(f"two tasks are named {next(n for n in taken if taken.count(n) > 1)!r}")
    return tasks


# -- helpers ---------------------------------------------------------------------------------
def _read_spec(folder: Path) -> dict[str, Any]:
    path = folder / "task.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TaskError(f"no task at {folder} (task.json is missing)") from None
    except json.JSONDecodeError as err:
        raise TaskError(f"{path}: invalid JSON ({err})") from None
    if not isinstance(data, dict):
        raise TaskError(f"{path}: the top level must be an object")
    return data


def _field(spec: dict[str, Any], key: str, kind: type | tuple[type, ...], folder: Path) -> Any:
    value = spec.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TaskError(f"{folder}/task.json: {key!r} is missing or has the wrong type")
    return value


def _string(spec: dict[str, Any], key: str, folder: Path) -> str:
    """An optional string field ("" when absent)."""
    value = spec.get(key, "")
    if not isinstance(value, str):
        raise TaskError(f"{folder}/task.json: {key!r} must be a string")
    return value


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TaskError(f"task file not found: {path}") from None


def _expand(text: str, folder: Path) -> str:
    """Replace every {{file:NAME}} with the text of folder/NAME."""
    return _FILE.sub(lambda m: _read(folder / m.group(1)), text)
