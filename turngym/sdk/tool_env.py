"""``ToolEnv``: the shortest way to write an environment.

An author writes only:

* a task source: ``tasks`` (a list of dicts, or a path to a JSONL file), or override
  ``sample_task(rng)`` for generated tasks;
* tools: ``@tool`` methods, sync or async; ``@tool(terminal=True)`` ends the episode;
* ``reward(task, done) -> dict[str, float]``: reward components (declare their names in
  ``reward_components`` so tools and the viewer know them);
* optionally ``start(task)`` (reset per-episode state), ``is_done(task)`` (a terminal condition besides terminal tools) and ``expert(task)``.

Each task dict needs ``"prompt"``; ``"id"`` is optional (a content hash otherwise). Keys named in
``references`` travel to ``info["reference"]`` (for credit assignment) and never into the prompt.
``self.task_dict`` holds the current task dict (``self.task`` is the core ``Task``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from turngym.core.env import Task
from turngym.core.types import Message, ToolResult
from turngym.tools.env import Env


class ToolEnv(Env):
    """A declarative ``Env``: tasks + tools + reward (+ terminal condition)."""

    #: The system prompt; the tool instructions are appended when ``tools_in_prompt``.
    system_prompt: ClassVar[str] = "You are a helpful agent. Use the tools to complete the task."
    #: Task dicts, or a JSONL path (relative paths resolve against the subclass's module file).
    tasks: ClassVar[Sequence[dict[str, Any]] | str | None] = None
    #: Names of the reward components ``reward`` returns (documentation and validation).
    reward_components: ClassVar[tuple[str, ...]] = ()
    #: Task keys copied into ``info["reference"]``.
    references: ClassVar[tuple[str, ...]] = ("answer",)

    def __init__(self, tasks: Sequence[dict[str, Any]] | str | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        source = tasks if tasks is not None else type(self).tasks
        self._tasks = _load_tasks(source, type(self)) if source is not None else None
        self.task_dict: dict[str, Any] = {}

    # ---- what authors override ----
    def sample_task(self, rng: np.random.Generator) -> dict[str, Any]:
        if not self._tasks:
            raise NotImplementedError(f"{type(self).__name__}: set `tasks` or override `sample_task`")
        return dict(self._tasks[int(rng.integers(len(self._tasks)))])

    def start(self, task: dict[str, Any]) -> None:
        """Reset per-episode state for a new task (called by ``reset``)."""

    def reward(self, task: dict[str, Any], done: bool) -> dict[str, float]:
        return {}

    def is_done(self, task: dict[str, Any]) -> bool:
        return False

    def expert(self, task: dict[str, Any]) -> str | None:
        return None

    def prompt_messages(self, task: dict[str, Any]) -> list[Message]:
        system = "\n".join(p for p in (self.system_prompt, self.tool_instructions()) if p)
        return [Message(role="system", content=system), Message(role="user", content=str(task["prompt"]))]

    # ---- Env hooks ----
    def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> Task:
        task = dict(options["task"]) if "task" in options else self.sample_task(rng)
        if "prompt" not in task:
            raise ValueError(f"{type(self).__name__}: a task needs a 'prompt' key, got {sorted(task)}")
        self.task_dict = task
        self.start(task)
        task_id = str(task.get("id") or _digest(task))
        reference = {k: task[k] for k in self.references if k in task}
        return Task(self.prompt_messages(task), task_id=task_id, reference=reference)

    def _observe(self, results: list[ToolResult]) -> list[Message]:
        if self.is_done(self.task_dict):
            self.end_episode()
        return []

    def _turn_reward(self, results: list[ToolResult], done: bool) -> dict[str, float]:
        comps = self.reward(self.task_dict, done)
        unknown = set(comps) - set(self.reward_components) if self.reward_components else set()
        if unknown:
            raise ValueError(f"{type(self).__name__}.reward returned undeclared components {sorted(unknown)}")
        return comps

    def expert_action(self) -> str | None:
        return self.expert(self.task_dict)


def _load_tasks(source: Sequence[dict[str, Any]] | str, owner: type) -> list[dict[str, Any]]:
    if isinstance(source, str):
        import sys

        path = Path(source)
        if not path.is_absolute():
            module = sys.modules.get(owner.__module__)
            base = (
                Path(module.__file__).parent if module and getattr(module, "__file__", None) else Path.cwd()
            )
            path = base / path
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        return rows
    return [dict(t) for t in source]


def _digest(task: dict[str, Any]) -> str:
    return hashlib.sha1(json.dumps(task, sort_keys=True, default=str).encode()).hexdigest()[:12]
