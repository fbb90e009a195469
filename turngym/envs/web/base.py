"""``MiniWoBEnvBase``: what the DOM and the pixel MiniWoB++ envs share.

One episode = one fresh browser context from a :class:`~turngym.sandboxes.browser.BrowserPool`
(the process-wide shared pool unless one is passed in), a task page started through the
task's own JavaScript, and the task's own reward. The episode ends when the task reports
done (its ``core.endEpisode``), on a terminal tool, or at the turn limit.

Faults: a browser that dies mid-episode ends the episode with an error observation and
``info["masked"] = True`` (the pool relaunches it for the next episode); a page that does not
load in ``load_timeout_s`` makes ``reset`` raise :class:`~turngym.sandboxes.browser.BrowserError`;
JavaScript exceptions in the page are reported in the next observation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np

from turngym.core.env import ForkError, Task
from turngym.core.types import ToolResult
from turngym.envs.browser.env import BrowserEnv, Calls, short_error
from turngym.envs.web import page as wp
from turngym.envs.web.expert import Step, expert_steps
from turngym.envs.web.tasks import get_task, html_dir, resolve_tasks
from turngym.sandboxes.browser import BrowserCrashed, BrowserError, BrowserPool

RewardMode = Literal["raw", "binary", "timed"]


class MiniWoBEnvBase(BrowserEnv):
    """What ``web-miniwob`` and ``gui-miniwob`` share on top of :class:`BrowserEnv` (not registered itself).

    Args:
        task: one task name, a list of names, ``"deterministic"`` (default: the tasks the wheel
            does not flag nondeterministic), ``"all"`` (all 130) or ``"expert"``. Each reset picks
            one with the episode's RNG unless ``options={"task": name}`` names it.
        reward: ``"raw"`` (the task's reward in [-1, 1], no time penalty), ``"binary"``
            (1 if raw > 0 else 0) or ``"timed"`` (the benchmark's time-scaled reward; set
            ``time_limit_s``).
        time_limit_s: the page's own episode timer; None (default) disables it.
        pool: a :class:`BrowserPool`; default the process-wide shared one.
        viewport: browser viewport in CSS px.
        scale: device scale factor (screenshots have ``scale`` pixels per CSS px).
        action_timeout_s: limit of one browser action (a click on a covered element fails after it).
        load_timeout_s: limit for loading and starting the task page.
        animations: keep jQuery animations (default off, so every observation is a settled page).
        html: folder holding ``miniwob/<task>.html`` (default: the ``miniwob`` wheel's).
        preload: have the pool load the next episode's task page in the background (a fresh context,
            loaded but not started), so a reset only seeds and starts it. With several tasks the page
            preloaded is this episode's task; another task still loads faster on its warm renderer.
        direct_input: act on MiniWoB pages with input events at a hit-tested point of the element
            (one page round trip for the checks), instead of playwright's actionability waits (which
            wait for the element to be stable over animation frames). Off with ``animations``.
    """

    # fork(): the task page started again with the same seed, the episode's page functions replayed (see
    # turngym.envs.browser.fork); refused with the page's own timer on (time_limit_s)

    def __init__(
        self,
        task: str | list[str] | None = None,
        *,
        reward: RewardMode = "raw",
        time_limit_s: float | None = None,
        pool: BrowserPool | None = None,
        viewport: tuple[int, int] = (500, 320),
        scale: float = 1.0,
        action_timeout_s: float = 5.0,
        load_timeout_s: float = 10.0,
        animations: bool = False,
        html: str | Path | None = None,
        preload: bool = True,
        direct_input: bool = True,
        **kwargs: Any,
    ):
        if reward not in ("raw", "binary", "timed"):
            raise ValueError(f"reward must be 'raw', 'binary' or 'timed', got {reward!r}")
        self.html = Path(html) if html is not None else html_dir()
        self.task_names = (
            resolve_tasks(task) if html is None else ([task] if isinstance(task, str) else list(task or []))
        )
        if not self.task_names:
            raise ValueError("no task given")
        self.reward_mode: RewardMode = reward
        self.time_limit_s = time_limit_s
        self.animations = animations
        self.preload = preload
        self.direct_input = direct_input
        super().__init__(
            pool=pool,
            viewport=viewport,
            scale=scale,
            action_timeout_s=action_timeout_s,
            load_timeout_s=load_timeout_s,
            **kwargs,
        )
        self.task_name = ""
        self.fields: dict[str, str] = {}
        self.status = wp.Status(False, 0.0, 0.0, None)
        #: act with direct input events (set once a MiniWoB episode has started on a settled page)
        self._direct = False

    # ------------------------------------------------------------------ the task page
    def task_url(self, name: str) -> str:
        return (self.html / "miniwob" / f"{name}.html").as_uri()

    async def _start(self, name: str, seed: int) -> wp.Started:
        url = self.task_url(name)
        max_ms = int(self.time_limit_s * 1000) if self.time_limit_s else wp.NO_TIME_LIMIT_MS
        # what the pool preloads for the next episode: the only task, or this one (any task page starts
        # the renderer and compiles the scripts most tasks share); without preload, a cheap warm-up page
        warm = url if self.preload else (self.html / "core" / "core.css").as_uri()
        self._direct = False
        for attempt in (0, 1):  # one retry: a crashed browser is relaunched, a slow load gets another go
            await self._release()
            try:
                self.lease = await self.pool.lease(
                    self.viewport,
                    device_scale_factor=self.scale,
                    timeout_s=self.action_timeout_s,
                    warm_url=warm,
                    warm_timeout_s=self.load_timeout_s,
                    defer_spare=True,  # opened once this episode's page is up (see _reset)
                )
                started = await self.lease.run(
                    wp.start_episode,
                    url,
                    seed,
                    max_time_ms=max_ms,
                    no_animations=not self.animations,
                    load_timeout_s=self.load_timeout_s,
                    loaded=self.lease.preloaded == url,
                    timeout=self.load_timeout_s * 2 + 5,
                )
                self._direct = self.direct_input and not self.animations
                return started
            except (BrowserCrashed, TimeoutError) as e:
                if attempt == 1:
                    await self._release()
                    if isinstance(e, BrowserCrashed):
                        raise
                    raise BrowserError(f"MiniWoB task {name!r} did not start: {short_error(e)}") from e
            except BrowserError:  # the pool's own (no browser could be launched, ...): as it is
                await self._release()
                raise
            except Exception as e:
                await self._release()
                raise BrowserError(f"MiniWoB task {name!r} did not start: {short_error(e)}") from e
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ env hooks
    async def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> Task:
        name = str(options.get("task") or self.task_names[int(rng.integers(len(self.task_names)))])
        if self.html == html_dir():
            get_task(name)  # clear error for unknown names
        js_seed = int(options.get("page_seed", rng.integers(0, 2**31 - 1)))
        started = await self._start(name, js_seed)
        self.task_name, self.fields = name, started.fields
        self.status = wp.Status(False, 0.0, 0.0, None)
        self._begin_episode(started.instruction)
        first = await self._first_page()
        if self.lease is not None:
            self.lease.prepare_next()  # the next episode's page loads while the agent thinks
        return Task(
            messages=[self._system_message(), first],
            task_id=f"miniwob/{name}/{js_seed}",
            reference={"task": name, "page_seed": js_seed, "fields": dict(self.fields)},
            info={"instruction": self.instruction},
        )

    async def _look(self, clip: tuple[float, float, float, float] | None = None) -> wp.View:
        """Read the page once: the task's status and the pruned DOM (and a screenshot of ``clip``)."""
        assert self.lease is not None
        view = await self.lease.run(wp.observe, clip, timeout=self.load_timeout_s)
        self.status, self.snap = view.status, view.snapshot
        return view

    async def _episode_notes(self) -> list[str]:
        if not self.status.done:
            return []
        self.end_episode()
        await self._release()
        return [f"The task is over (task reward {self._reward_value():g})."]

    async def _fork_start(self) -> None:
        assert self.task is not None
        started = await self._start(self.task_name, int(self.task.reference["page_seed"]))
        if started.fields != self.fields:
            raise ForkError(
                f"replay diverged at the start page: the task page seeded {self.task.reference['page_seed']} "
                f"gave other fields ({started.fields}) than the original episode's ({self.fields})"
            )

    def _fork_refusal(self) -> str:
        if self.time_limit_s and not self._done:
            return (
                "the task page runs its own episode timer (time_limit_s); a replayed page would not have "
                "the same time left"
            )
        return super()._fork_refusal()

    def _reward_value(self) -> float:
        if self.reward_mode == "binary":
            return 1.0 if self.status.raw_reward > 0 else 0.0
        if self.reward_mode == "timed":
            return self.status.reward
        return self.status.raw_reward

    def _turn_reward(self, results: list[ToolResult], done: bool) -> dict[str, float]:
        if self.fault or self._paid:
            return {}
        if self.status.done:
            self._paid = True
            return {"task": self._reward_value()}
        return {"task": 0.0} if done else {}

    def _page_info(self) -> dict[str, Any]:
        return {"task_done": self.status.done, "task_reason": self.status.reason}

    def render_step(self, step: Step) -> Calls | None:
        """An expert step as this env's tool calls (None when this env's tools cannot express it)."""
        raise NotImplementedError

    def _expert_calls(self) -> Calls | None:
        """The scripted expert's next action (several calls, within ``max_calls_per_turn``), or None."""
        if self._done or self.lease is None:
            return None
        steps = expert_steps(self.task_name, self.instruction, self.snap, self.fields)
        if not steps:
            return None
        calls: Calls = []
        for step in steps:
            rendered = self.render_step(step)
            if rendered is None:
                return None
            if calls and len(calls) + len(rendered) > self.max_calls_per_turn:
                break  # the rest next turn: the expert re-plans from the new page
            calls.extend(rendered)
        return calls

    def _state_key(self) -> str:
        return f"{self.task_name}:{self.snap.key()}"
