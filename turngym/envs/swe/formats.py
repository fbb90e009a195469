"""Task formats swe-docker loads, by name: a registry (add one with :func:`task_format`).

``load_tasks(path)`` asks each format, in registration order, whether ``path`` is one of its own and
loads it with the first that says yes: ``harbor`` (a Harbor task directory, or a directory of them;
:mod:`turngym.envs.swe.harbor`), then ``swebench`` (a JSON/JSONL file of SWE-bench instances;
:func:`turngym.envs.swe.tasks.load_instances`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turngym.envs.swe.harbor import is_harbor_task, load_harbor_tasks
from turngym.envs.swe.tasks import DEFAULT_TASKS, SweTask, load_instances


@dataclass(frozen=True)
class TaskFormat:
    name: str
    detect: Callable[[Path], bool]
    load: Callable[..., list[SweTask]]


TASK_FORMATS: dict[str, TaskFormat] = {}


def task_format(name: str, detect: Callable[[Path], bool]) -> Callable[[Callable[..., list[SweTask]]], Any]:
    """Register ``load(path, **options) -> list[SweTask]`` for the paths ``detect`` accepts."""

    def register(load: Callable[..., list[SweTask]]) -> Callable[..., list[SweTask]]:
        TASK_FORMATS[name] = TaskFormat(name, detect, load)
        return load

    return register


def _harbor_dir(p: Path) -> bool:
    return p.is_dir() and (is_harbor_task(p) or any(is_harbor_task(d) for d in p.iterdir() if d.is_dir()))


@task_format("harbor", _harbor_dir)
def _load_harbor(path: Path, *, base_image: str | None = None, **_: Any) -> list[SweTask]:
    """Harbor tasks build their own images (on ``base_image``); SWE-bench options do not apply."""
    return load_harbor_tasks(path, base_image=base_image)


@task_format("swebench", lambda p: p.is_file())
def _load_swebench(path: Path, *, base_image: str | None = None, **options: Any) -> list[SweTask]:
    return load_instances(path, **options)


def load_tasks(path: str | os.PathLike[str] | None = None, **options: Any) -> list[SweTask]:
    """Tasks from ``path`` in whichever registered format it is (default: the shipped task set)."""
    p = Path(path) if path is not None else DEFAULT_TASKS
    for fmt in TASK_FORMATS.values():
        if fmt.detect(p):
            return fmt.load(p, **options)
    known = ", ".join(TASK_FORMATS)
    raise FileNotFoundError(f"{p}: not a task file or task directory of a known format ({known})")
