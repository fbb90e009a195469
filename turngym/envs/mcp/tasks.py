"""Tasks of the ``mcp`` family: a prompt, the reference answer(s), optional metadata and expert solution.

A task file is JSONL (one object a line) or JSON (one object, a list, or ``{"tasks": [...]}``). Fields:

* ``prompt`` (required): what the user asks;
* ``answer`` (a string) or ``answers`` (a list of acceptable strings); ``reference`` is accepted as an alias
  of ``answer`` (a string, a list, or an object with ``answer``/``answers``). Omitted: an open task, scored
  only by the env's judge (the answer metrics pay 0);
* ``id`` (default ``task-<index>``), ``metadata`` (an object, passed to ``info``);
* ``solution``: the calls a scripted expert makes before answering, ``[{"name": ..., "arguments": {...}}]``
  (a name is the tool's name on its server, or ``server__tool``; add ``"server"`` when two servers share it).

Errors name the file, the line (JSONL) or index (JSON) and the field.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class SolutionCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    server: str | None = None


class McpTask(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = ""
    prompt: str = Field(min_length=1)
    answers: list[str] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    solution: list[SolutionCall] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise ValueError(f"a task must be a JSON object, got {type(data).__name__}")
        data = dict(data)
        ref = data.pop("reference", None)
        answer = data.pop("answer", None)
        if isinstance(ref, dict):
            answer = answer if answer is not None else ref.get("answers", ref.get("answer"))
        elif ref is not None and answer is None:
            answer = ref
        if answer is not None:
            if "answers" in data:
                raise ValueError("give 'answer' or 'answers', not both")
            data["answers"] = answer if isinstance(answer, list) else [answer]
        if isinstance(data.get("answers"), list):
            data["answers"] = [a if isinstance(a, str) else json.dumps(a) for a in data["answers"]]
        return data


def load_tasks(source: str | os.PathLike[str] | list[Any]) -> list[McpTask]:
    """Tasks from a JSON/JSONL file or a list of dicts/``McpTask``; ``ValueError`` naming where on bad input."""
    if isinstance(source, list):
        rows = [(f"task {i}", item) for i, item in enumerate(source)]
        where = "tasks"
    else:
        path = Path(source)
        where = str(path)
        if not path.is_file():
            raise ValueError(f"tasks: no such file {where!r}")
        text = path.read_text(encoding="utf-8")
        rows = _rows(text, where)
    out: list[McpTask] = []
    for i, (label, item) in enumerate(rows):
        if isinstance(item, McpTask):
            task = item
        else:
            try:
                task = McpTask.model_validate(item)
            except ValidationError as e:
                msgs = "; ".join(
                    f"{'.'.join(map(str, x['loc'])) or 'task'}: {x['msg'].removeprefix('Value error, ')}"
                    for x in e.errors()
                )
                raise ValueError(f"{where}: {label}: {msgs}") from None
        if not task.id:
            task = task.model_copy(update={"id": f"task-{i}"})
        out.append(task)
    if not out:
        raise ValueError(f"{where}: no tasks")
    ids = [t.id for t in out]
    dupes = sorted({x for x in ids if ids.count(x) > 1})
    if dupes:
        raise ValueError(f"{where}: task ids must be unique, repeated: {', '.join(dupes[:5])}")
    return out


def _rows(text: str, where: str) -> list[tuple[str, Any]]:
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not valid JSON: {e}") from e
        return [(f"item {i}", x) for i, x in enumerate(data)]
    if stripped.startswith("{"):
        try:  # one object, or {"tasks": [...]}; else JSONL
            data = json.loads(text)
        except json.JSONDecodeError:
            pass
        else:
            if isinstance(data, dict) and isinstance(data.get("tasks"), list):
                return [(f"item {i}", x) for i, x in enumerate(data["tasks"])]
            return [("item 0", data)]
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append((f"line {n}", json.loads(line)))
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{where}: line {n}: not valid JSON ({e.msg}); a task file is JSONL or JSON"
            ) from e
    return rows
