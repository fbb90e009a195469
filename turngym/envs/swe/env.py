"""``swe-docker``: fix a real bug in a real Python package inside a locked-down Docker container.

Tools (:mod:`turngym.envs.swe.tools`) follow the R2E-Gym / SWE-agent convention; observations are
mini-swe-agent style (``<returncode>`` + ``<output>``, long output cut in the middle with a marker).

Reward: ``resolved`` (1.0 iff every FAIL_TO_PASS and PASS_TO_PASS test passes), graded in a *fresh*
container seeded with the task's pristine files plus the agent's patch minus any test-file changes.
``info["reward_components"]`` also carries the inputs of the ``gated`` (G-RA) credit method, which
do not add to the reward (documented exception to the components-sum rule):

* ``outcome_level`` (final turn only): 0 no submit, 1 empty patch, 2 patch fails the tests,
  3 patch passes them;
* ``format_ok`` (every turn): the action held well-formed calls of known tools;
* ``edit_applied`` (every turn): a file edit of the repository succeeded this turn;
* ``tests_run`` (every turn): a bash command ran tests this turn;
* ``fail_to_pass`` / ``pass_to_pass`` (final turn, when a patch was graded): the fraction of
  FAIL_TO_PASS / PASS_TO_PASS tests that succeeded.

Loaded SWE-bench instances are graded by the ``swebench`` package's rules (``repo.GRADERS``):
RESOLVED_FULL pays 1.0; ``info["grade"]["status"]`` holds RESOLVED_FULL / PARTIAL / NO.

A container that dies mid-episode ends the episode with an error observation, ``info["sandbox_error"]``
and ``info["sandbox_death"]`` (its cause). Killed from outside (``"external"``): ``info["masked"]`` too,
the rollout engine masks the trajectory (not the policy's doing). Killed by the OOM killer (``"oom"``:
its own processes ran it out of memory): a failed episode, reward 0, not masked, so a policy cannot
drop its failures from training by killing its container. The graded patch leaves out test and
test-runner files (``repo.gradable_patch``); ``info["grade"]`` holds the verdict after ``submit``.

``fork()`` / ``afork()`` branch an episode: a container of its own (a slot of the pool) holding a
snapshot of the parent's writable mounts, plus a copy of the Python-side state (see ``_fork``).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from turngym.core.env import Task
from turngym.core.types import Message, ToolResult
from turngym.envs.swe.container import copy_container, grade_in_fresh_container, repository_digest
from turngym.envs.swe.packages import REPO_DIR
from turngym.envs.swe.prompts import HARBOR_USER_PROMPT, SYSTEM_PROMPT, USER_PROMPT
from turngym.envs.swe.tasks import SweTask
from turngym.envs.swe.tools import SweTools, gold_command
from turngym.tools import ToolError
from turngym.tools.env import Env

_MALFORMED = frozenset({"parse_error", "no_call", "bad_arguments", "unknown_tool", "too_many_calls"})
_IMAGE_CACHE: dict[tuple[Any, ...], str] = {}


class SweDockerEnv(SweTools, Env):
    """One task per episode, one container per episode (from a warm pool), graded in a fresh one."""

    default_max_turns = 40
    forkable = True
    #: read-only or replaced in the fork by its own (``_fork``): the task list, the pools, the container
    _fork_shared = ("tasks", "_by_id", "_swe", "_pools", "_staged", "_sb", "_pool")

    def __init__(
        self,
        tasks: str | Path | Sequence[SweTask | dict[str, Any]] | None = None,
        *,
        task_ids: Sequence[str] | None = None,
        packages: Sequence[str] | None = None,
        snapshot: str | None = None,
        image: str | None = None,
        src_root: str = "",
        test_requires: Sequence[str] = (),
        allow_unpinned: bool = False,
        base_image: str | None = None,
        limits: Any = None,
        pool_warm: int = 1,
        max_active: int = 8,
        command_timeout: float = 60.0,
        test_timeout: float = 300.0,
        max_output_chars: int = 10_000,
        fork_wait: float = 0.0,
        **kwargs: Any,
    ):
        from turngym.sandboxes.limits import Limits

        self.tasks = _load_tasks(
            tasks,
            base_image=base_image,
            snapshot=snapshot,
            image=image,
            src_root=src_root,
            test_requires=tuple(test_requires),
            allow_unpinned=allow_unpinned,
        )
        if packages:
            self.tasks = [t for t in self.tasks if t.repo in set(packages) or t.package in set(packages)]
        if task_ids:
            wanted = set(task_ids)
            self.tasks = [t for t in self.tasks if t.instance_id in wanted]
        if not self.tasks:
            raise ValueError("no SWE tasks selected (check tasks=, task_ids=, packages=)")
        from turngym.envs.swe.repo import check_grader

        for name in {t.grader for t in self.tasks if t.harbor is None}:
            check_grader(name)  # a missing grading package fails here, not mid-rollout
        self._by_id = {t.instance_id: t for t in self.tasks}
        self.base_image = base_image
        self.limits = limits or Limits()
        self.pool_warm = pool_warm
        self.max_active = max_active
        self.command_timeout = float(command_timeout)
        self.test_timeout = float(test_timeout)
        self.output_limit = int(max_output_chars)
        self.fork_wait = float(fork_wait)
        if not self.limits.read_only:
            self.forkable = False
            self._not_forkable_reason = (
                "its containers have a writable root file system (Limits.read_only=False), so the fork's "
                "snapshot of the writable mounts would miss changes elsewhere; use read-only limits"
            )
        super().__init__(
            tool_timeout=max(self.command_timeout, self.test_timeout) + 120.0,
            max_output_chars=self.output_limit + 2_000,
            **kwargs,
        )
        self._pools: dict[tuple[str, str], Any] = {}
        self._staged: dict[int, dict[str, bytes] | None] = {}
        self._sb: Any = None
        self._pool: Any = None
        self._swe: SweTask | None = None
        self._reset_episode_state()

    def _reset_episode_state(self) -> None:
        self._history: dict[str, list[str | None]] = {}
        self._edited: dict[str, str] = {}
        self._expert_done: set[int] = set()
        self._gold_tried = False
        self._submitted = False
        self._patch: str | None = None
        self._grade: Any = None
        self._dead: str | None = None
        self._dead_cause = "external"
        self._flags = {"edit_applied": 0.0, "tests_run": 0.0}
        self._key = f"unkeyed-{uuid.uuid4().hex}"  # until the first ``_refresh_key``
        self._key_error: str | None = None

    # ------------------------------------------------------------ sandbox plumbing
    def _pool_for(self, task: SweTask) -> Any:
        """The shared pool of the task's image; for package tasks its warm containers come with the
        pristine package already uploaded (``stage_repo``), so a reset only writes the bug."""
        from functools import partial

        from turngym.envs.swe.packages import sdist_files
        from turngym.envs.swe.repo import stage_repo
        from turngym.sandboxes.pool import SandboxPool

        # an env image depends on src_root and test_requires too, not only on the repository's name
        key = (task.image or task.package or task.repo, task.src_root, task.test_requires, self.base_image)
        image = _IMAGE_CACHE.get(key)
        if image is None:
            image = _IMAGE_CACHE[key] = task.image_tag(self.base_image)
        spec = task.spec
        pool_key = (image, spec.key if spec else "")
        pool = self._pools.get(pool_key)
        if pool is None or pool.closed:
            staged = sdist_files(spec) if spec is not None else None
            pool = SandboxPool.shared(
                image,
                warm=self.pool_warm,
                max_active=self.max_active,
                limits=self._limits_for(task),
                workdir=REPO_DIR,
                prepare=partial(stage_repo, files=staged) if staged is not None else None,
                prepare_key=f"stage:{spec.key}" if spec is not None else "",
            )
            self._pools[pool_key] = pool
            self._staged[id(pool)] = staged
        return pool

    def _limits_for(self, task: SweTask) -> Any:
        """A Harbor task's verifier writes /tests and /logs: they are tmpfs mounts too."""
        if task.harbor is None:
            return self.limits
        from dataclasses import replace

        extra = tuple(p for p in ("/tests", "/logs") if p not in self.limits.writable)
        return replace(self.limits, writable=self.limits.writable + extra)

    async def _sandbox_call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run a blocking sandbox call; a dead container ends the episode with a clear error."""
        from turngym.sandboxes.docker import SandboxDead, SandboxError, run_blocking

        if self._dead:
            raise ToolError(f"the sandbox is gone ({self._dead}); the episode is over")
        try:
            return await run_blocking(fn, *args, **kwargs)
        except SandboxDead as e:
            self._dead, self._dead_cause = str(e), e.cause
            self.end_episode()
            raise ToolError(f"the sandbox container died ({e}). The episode ends here.") from e
        except SandboxError as e:
            raise ToolError(str(e)) from e

    async def _exec(self, command: str, timeout: float | None = None) -> Any:
        return await self._sandbox_call(
            self._sb.exec,
            command,
            timeout=timeout or self.command_timeout,
            workdir=REPO_DIR,
            max_output_bytes=self.output_limit,
        )

    def _release_sandbox(self) -> None:
        if self._sb is not None and self._pool is not None:
            self._pool.release_later(self._sb)
        self._sb = None

    # ------------------------------------------------------------ episode
    async def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> Task:
        from turngym.envs.swe.repo import seed_repo
        from turngym.sandboxes.docker import SandboxDead, run_blocking

        self._release_sandbox()
        self._reset_episode_state()
        if "task_id" in options:
            if options["task_id"] not in self._by_id:
                raise KeyError(f"unknown task_id {options['task_id']!r}")
            task = self._by_id[options["task_id"]]
        elif "index" in options:
            task = self.tasks[int(options["index"]) % len(self.tasks)]
        else:
            task = self.tasks[int(rng.integers(len(self.tasks)))]
        self._swe = task
        self._pool = await run_blocking(self._pool_for, task)
        for attempt in range(2):  # a container that dies between hand-out and seeding is replaced once
            self._sb = await self._pool.aacquire()
            try:
                head = await run_blocking(
                    seed_repo, self._sb, task.files(), staged=self._staged.get(id(self._pool))
                )
                break
            except SandboxDead:
                self._release_sandbox()
                if attempt:
                    raise
            except Exception:
                self._release_sandbox()
                raise
        await self._refresh_key()
        system = SYSTEM_PROMPT + ("\n\n" + self.tool_instructions() if self.tools_in_prompt else "")
        if task.harbor is not None:
            user = HARBOR_USER_PROMPT.format(
                instruction=task.problem_statement.strip(), workdir=task.harbor["workdir"], repo_dir=REPO_DIR
            )
        else:
            user = USER_PROMPT.format(repo_dir=REPO_DIR, issue=task.problem_statement.strip())
        return Task(
            messages=[Message(role="system", content=system.strip()), Message(role="user", content=user)],
            task_id=task.instance_id,
            reference={
                "patch": task.patch,
                "FAIL_TO_PASS": list(task.fail_to_pass),
                "num_PASS_TO_PASS": len(task.pass_to_pass),
                "mutation": task.mutation,
                "graded_commit": task.graded_commit,
            },
            info={
                "repo": task.repo,
                "base_commit": head,
                "graded_commit": task.graded_commit,
                "container": self._sb.name,
                **({"state_key_error": self._key_error} if self._key_error is not None else {}),
            },
        )

    def _reward(self, components: dict[str, float]) -> float:
        """Only ``resolved`` is paid; the G-RA inputs are diagnostics (see the module docstring)."""
        return float(components.get("resolved", 0.0))

    def _step_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {}
        if self._grade is not None:
            info["grade"] = self._grade.as_dict()
        if self._key_error is not None:
            info["state_key_error"] = self._key_error
        if self._dead:
            info.update(sandbox_error=self._dead, sandbox_death=self._dead_cause)
            if self._dead_cause != "oom":  # not the policy's doing: the trajectory must not be trained on
                info.update(masked=True, mask_reason=f"sandbox fault: {self._dead}")
        return info

    async def _turn_reward(self, results: list[ToolResult], done: bool) -> dict[str, float]:
        comps = {
            "format_ok": float(bool(results) and not any(r.error_kind in _MALFORMED for r in results)),
            **self._flags,
        }
        self._flags = {"edit_applied": 0.0, "tests_run": 0.0}
        if not done:
            return comps
        level, resolved = 0.0, 0.0
        if self._submitted and self._patch is not None:
            if not self._patch.strip():
                level = 1.0
            else:
                self._grade = await self._grade_patch(self._patch)
                score = self._grade.score  # a Harbor verifier's own reward
                resolved = float(self._grade.resolved) if score is None else float(score)
                comps.update(self._grade.components())
                level = 3.0 if self._grade.resolved else 2.0
        comps.update(outcome_level=level, resolved=resolved)
        return comps

    async def agrade(self, patch: str, task_id: str) -> Any:
        """Grade ``patch`` for task ``task_id`` outside an episode (a fresh container, as after
        ``submit``); returns the :class:`~turngym.envs.swe.repo.Grade`. ``swe validate`` uses it to
        check that an empty patch does not resolve an instance."""
        from turngym.sandboxes.docker import run_blocking

        if task_id not in self._by_id:
            raise KeyError(f"unknown task_id {task_id!r}")
        task = self._by_id[task_id]
        pool = await run_blocking(self._pool_for, task)
        return await self._grade_patch(patch, task, pool)

    async def _grade_patch(self, patch: str, task: SweTask | None = None, pool: Any = None) -> Any:
        """The verdict on ``patch`` from a fresh container (:func:`~.container.grade_in_fresh_container`)."""
        task, pool = task or self._swe, pool or self._pool
        assert task is not None and pool is not None
        staged = self._staged.get(id(pool))
        return await grade_in_fresh_container(pool, task, patch, staged=staged, timeout=self.test_timeout)

    def _state_key(self) -> str:
        """The key of the repository state after the last reset or step (``_refresh_key``)."""
        return self._key

    async def _refresh_key(self) -> None:
        """Key the repository as it is now: the task plus :func:`~.container.repository_digest`. A digest
        that cannot be made (the container is gone, git fails) gives a key no other state can have (a
        fresh random one) and says why in ``info["state_key_error"]``: GiGPO and tree credit then group
        the turn with nothing, which is right, where a stale key would group it wrongly."""
        from turngym.sandboxes.docker import SandboxDead

        self._key_error, digest = None, ""
        if self._dead:
            self._key_error = f"the sandbox is gone ({self._dead})"
        elif self._sb is None:
            self._key_error = "the episode holds no container"
        else:
            try:
                digest, self._key_error = await repository_digest(self._sb, min(self.command_timeout, 30.0))
            except SandboxDead as e:
                self._dead, self._dead_cause = str(e), e.cause  # the episode ends this turn (``_step_info``)
                self.end_episode()
                self._key_error = f"the sandbox container died ({e})"
        if self._key_error is not None:
            self._key = f"unkeyed-{uuid.uuid4().hex}"
            return
        payload = json.dumps([self._swe.instance_id if self._swe else "", digest])
        self._key = hashlib.sha256(payload.encode()).hexdigest()[:16]

    async def _observe(self, results: list[ToolResult]) -> list[Message]:
        """No extra messages; keys the repository after the turn's tools ran (before the episode's end
        is decided, so a container found dead ends it this turn)."""
        await self._refresh_key()
        return []

    async def _close(self) -> None:
        """Give the container back before returning (not in the background, as a reset does): a closed
        env holds none of the pool's ``max_active`` slots, which tree rollouts plan with (``max_live``)."""
        from turngym.sandboxes.docker import run_blocking

        sb, pool = self._sb, self._pool
        self._sb = None
        if sb is not None and pool is not None:
            await run_blocking(pool.release, sb)
        for pool in self._pools.values():
            pool.detach()
        self._pools.clear()
        self._staged.clear()

    # ------------------------------------------------------------ forking
    @property
    def max_live(self) -> int:
        """At most this many envs of this family hold a container at once (the pool's ``max_active``:
        episodes and forks alike); tree rollouts reserve a tree's paths within it
        (``turngym.rollout.tree``), so a fork never finds the pool full."""
        return self.max_active

    async def _fork(self) -> SweDockerEnv:
        """The fork: a copy of the Python-side state (``Env._fork_copy``) and a container of its own, a
        slot of the parent's pool, holding what the parent's writable mounts hold now
        (:func:`~.container.copy_container`); no slot free within ``fork_wait`` seconds (default 0), a
        dead parent container or a failed copy is a :class:`ForkError` that leaves the parent as it was."""
        from turngym.core.env import ForkError

        name = f"{self.spec.id if self.spec is not None else type(self).__name__}"
        if self._dead:
            raise ForkError(f"{name}: cannot fork, its container died ({self._dead}); the episode is over")
        if self._sb is None or self._pool is None:
            raise ForkError(f"{name}: cannot fork, the episode holds no container")
        self._busy = "fork"
        try:
            child = self._fork_copy()  # the Python-side state, at the same instant as the files
            sb = await copy_container(self._sb, self._pool, wait=self.fork_wait, name=name)
        finally:
            self._busy = None
        child._sb, child._pool, child._staged = sb, self._pool, dict(self._staged)
        child._pools = {key: p.attach() for key, p in self._pools.items()}
        assert child.task is not None
        child.task.info["container"] = sb.name
        return child

    async def areset(self, **kwargs: Any) -> tuple[list[Message], dict[str, Any]]:
        self._refuse_during_fork("reset")
        return await super().areset(**kwargs)

    async def astep(self, action: str | Message) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        self._refuse_during_fork("step")
        return await super().astep(action)

    def _refuse_during_fork(self, what: str) -> None:
        if self._busy == "fork":
            raise RuntimeError(f"{type(self).__name__} is being forked: {what} after fork() returns")

    # ------------------------------------------------------------ scripted expert
    def _note_expert_edit(self, path: str, old: str, new: str) -> None:
        if self._swe is None:
            return
        for i, e in enumerate(self._swe.expert_edits):
            if f"{REPO_DIR}/{e['path']}" == path and e["old_str"] == old and e["new_str"] == new:
                self._expert_done.add(i)

    def expert_action(self) -> str | None:
        """The gold patch, then ``submit``: a synthesised task's revert edits through ``file_editor``;
        a loaded instance (no edits) applies its ``patch`` with ``git apply`` through ``bash``; a
        Harbor task runs its ``solution/solve.sh`` through ``bash``."""
        if self._swe is None:
            return None
        gold = gold_command(self._swe)
        if not self._swe.expert_edits and gold and not self._gold_tried:
            return self.format_call("bash", {"command": gold})
        for i, e in enumerate(self._swe.expert_edits):
            if i not in self._expert_done:
                args = {
                    "command": "str_replace",
                    "path": f"{REPO_DIR}/{e['path']}",
                    "old_str": e["old_str"],
                    "new_str": e["new_str"],
                }
                return self.format_call("file_editor", args)
        return self.format_call("submit", {})


def _load_tasks(
    tasks: str | Path | Sequence[SweTask | dict[str, Any]] | None,
    *,
    snapshot: str | None,
    image: str | None,
    src_root: str,
    test_requires: tuple[str, ...],
    allow_unpinned: bool = False,
    base_image: str | None = None,
) -> list[SweTask]:
    extra: dict[str, Any] = {
        "snapshot": snapshot,
        "image": image,
        "src_root": src_root,
        "test_requires": test_requires,
        "allow_unpinned": allow_unpinned,
    }
    if tasks is None or isinstance(tasks, str | Path):
        from turngym.envs.swe.formats import load_tasks

        return load_tasks(tasks, base_image=base_image, **extra)
    return [t if isinstance(t, SweTask) else SweTask.from_swebench(t, **extra) for t in tasks]
