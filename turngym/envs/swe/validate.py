"""Run the scripted expert over a task set: every task must end with reward 1 (validates the chain:
image, repository seeding, editor, patch extraction, grading on pristine tests). On loaded SWE-bench
instances the expert applies each instance's gold ``patch``, so this checks the instances, their
snapshot (pinned to ``base_commit`` when it is a git checkout) and their image; with
``check_empty`` an empty patch is graded too and must not resolve the instance (else its
FAIL_TO_PASS tests do not test the fix)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from turngym.envs.swe.formats import load_tasks


async def expert_episode(env: Any, task_id: str, max_steps: int = 10) -> tuple[float, dict[str, Any]]:
    """One episode of ``env.expert_action()`` on ``task_id``; returns (final reward, final info)."""
    await env.areset(options={"task_id": task_id})
    reward, info = 0.0, {}
    for _ in range(max_steps):
        action = env.expert_action()
        _, reward, terminated, truncated, info = await env.astep(action)
        if terminated or truncated:
            break
    return reward, info


async def run_expert(
    tasks: str | Path | None = None,
    *,
    limit: int | None = None,
    concurrency: int = 2,
    check_empty: bool = False,
    **load: Any,
) -> dict[str, dict[str, Any]]:
    """Per task id: ``{"gold": expert reward, "grade": the expert's grade}`` plus, with
    ``check_empty`` and on loaded instances (no package), ``"empty"``: 1.0 if an empty patch resolves
    the task (it must not). ``concurrency`` episodes at once (one env each); ``load`` goes to
    :func:`~turngym.envs.swe.formats.load_tasks` (``snapshot``, ``image``, ``src_root``, ``base_image``,
    ...)."""
    from turngym.envs.swe.env import SweDockerEnv

    all_tasks = load_tasks(tasks, **load)[:limit]
    queue: asyncio.Queue[str] = asyncio.Queue()
    for t in all_tasks:
        queue.put_nowait(t.instance_id)
    results: dict[str, dict[str, Any]] = {}
    by_id = {t.instance_id: t for t in all_tasks}

    async def worker() -> None:
        env = SweDockerEnv(
            all_tasks, pool_warm=1, max_active=concurrency * 2, base_image=load.get("base_image")
        )
        try:
            while not queue.empty():
                task_id = queue.get_nowait()
                reward, info = await expert_episode(env, task_id)
                results[task_id] = {"gold": reward, "grade": info.get("grade")}
                if check_empty and by_id[task_id].package is None:
                    grade = await env.agrade("", task_id)
                    results[task_id]["empty"] = float(grade.resolved)
        finally:
            await env.aclose()

    await asyncio.gather(*(worker() for _ in range(max(concurrency, 1))))
    return results
