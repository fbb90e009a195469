"""``gui-desktop``: real Debian desktop applications under X in a locked-down container.

Each episode takes a desktop from the warm pool (:func:`turngym.sandboxes.desktop.desktop_pool`), writes
the task's files into the user's home, launches the task's application and shows a screenshot (PNG,
``screenshot_size``), optionally with the accessibility tree as an element list and a set-of-marks
overlay (``a11y=True``, ``marks=True``). The agent acts with the computer tools of
:mod:`turngym.envs.desktop.actions`. After each turn the task's checker
(:mod:`turngym.envs.desktop.checkers`) reads the real state: the turn pays ``progress`` (the change of
the checker's partial credit, weight :data:`PROGRESS_WEIGHT`) and the last turn ``success``
(``1 - PROGRESS_WEIGHT`` if the checker passes), so a solved episode sums to 1.

An episode ends with a stated cause (``info["end_cause"]``) when the application exits, the X server
or the container dies, or the agent calls ``done``/``fail``. Forks replay the episode's tool calls on a
fresh desktop (:mod:`turngym.envs.desktop.fork`). ``env.tasks`` lists the tasks with their ``app``.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from turngym.core.env import ForkError, Task
from turngym.core.types import Message, ToolResult
from turngym.envs.desktop import observation as ob
from turngym.envs.desktop.actions import DesktopActions
from turngym.envs.desktop.checkers import Verdict, check, clipboard_verdict, watched_paths
from turngym.envs.desktop.tasks import DesktopTask, build_tasks
from turngym.sandboxes.desktop import DesktopDead, DesktopSandbox, Observation, desktop_pool
from turngym.sandboxes.docker import SandboxError, run_blocking
from turngym.tools.env import Env

PROGRESS_WEIGHT = 0.2
_SETUP = """set -e
mkdir -p {dirs}
"""


class DesktopEnv(DesktopActions, Env):
    """Desktop tasks through pixels (and optionally the accessibility tree).

    Args:
        task: a task id, a list of ids, or None (all tasks; ``options={"task": id}`` picks one).
        screen: the X screen in pixels.
        screenshot_size: size of the screenshot the agent sees (default: the screen); coordinates are
            pixels of the screenshot.
        a11y: add the accessibility tree as an element list (and the ``click_element`` tool works).
        marks: draw the element boxes and ids on the screenshot (set-of-marks; needs ``a11y``).
        screenshot: attach the screenshot to each observation; False (needs ``a11y``): the element list
            alone, for text-only policies (coordinates are then screen pixels).
        settle_s: the longest the screen may take to settle after a turn before the screenshot (through
            the helper, the screenshot is taken as soon as two captures 40 ms apart agree).
        helper: drive the desktop through its long-lived helper process (one round trip a step); False:
            one ``docker exec`` per command and a fixed ``settle_s`` wait (the old, slower path).
        warm: desktops the shared pool keeps started.
        task_seed: the seed the task contents are generated from.
    """

    default_max_turns = 30
    forkable = True
    sync_hooks_in_thread = False
    system_intro = (
        "You control a Linux desktop with the mouse and keyboard to complete a task. Each observation is a "
        "screenshot; coordinates are pixels of that screenshot, (0, 0) at the top left. Call done when the "
        "task is complete; the result is checked from the applications' saved state."
    )

    def __init__(
        self,
        task: str | list[str] | None = None,
        *,
        screen: tuple[int, int] = (1024, 768),
        screenshot_size: tuple[int, int] | None = None,
        a11y: bool = False,
        marks: bool = False,
        settle_s: float = 0.3,
        warm: int = 1,
        task_seed: int = 0,
        helper: bool = True,
        screenshot: bool = True,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.screen = (int(screen[0]), int(screen[1]))
        self.screen_size = tuple(int(v) for v in (screenshot_size or self.screen))  # type: ignore[assignment]
        self._scale = self.screen[0] / self.screen_size[0]
        if abs(self.screen[1] / self.screen_size[1] - self._scale) > 0.02:
            raise ValueError("screenshot_size must keep the screen's aspect ratio")
        if marks and not a11y:
            raise ValueError("marks=True needs a11y=True")
        if not screenshot and (marks or not a11y):
            raise ValueError(
                "screenshot=False needs a11y=True (the element list is then all the agent sees) and no marks"
            )
        self.screenshot = bool(screenshot)
        if not self.screenshot:  # the text-only policy's coordinates: the screen's own pixels
            self.screen_size, self._scale = self.screen, 1.0
        self.a11y, self.marks, self.settle_s, self.warm = a11y, marks, float(settle_s), int(warm)
        self.use_helper = bool(helper)
        self._app_seen = "running"
        self._check_fp: Any = None
        all_tasks = build_tasks(task_seed)
        by_id = {t.task_id: t for t in all_tasks}
        names = [task] if isinstance(task, str) else list(task or by_id)
        unknown = [n for n in names if n not in by_id]
        if unknown:
            raise ValueError(f"unknown gui-desktop task(s) {unknown}; see env.tasks")
        self._task_list: list[DesktopTask] = [by_id[n] for n in names]
        self.desk: DesktopSandbox | None = None
        self._pool: Any = None
        self.current: DesktopTask | None = None
        self._nodes: list[dict[str, Any]] = []
        self._mouse = (0, 0)
        self._progress = self._progress0 = 0.0
        self._verdict: Verdict | None = None
        self._check_cache: dict[str, Any] = {}
        self.end_cause = ""
        self._plan_pos = 0
        self._log: list[list[tuple[str, dict[str, Any]]]] = []
        self._keys: list[str] = []
        self._turn_calls: list[tuple[str, dict[str, Any]]] = []
        self._last_key = ""

    # ------------------------------------------------------------------ tasks
    @property
    def tasks(self) -> list[dict[str, Any]]:
        """The tasks this env draws from (``task_id``, ``app``, ``template``, ``instruction``, ``checker``)."""
        return [t.summary() for t in self._task_list]

    def _record(self, name: str, args: dict[str, Any]) -> None:
        self._turn_calls.append((name, dict(args)))

    # ------------------------------------------------------------------ desktop
    def _get_pool(self) -> Any:
        if self._pool is None or self._pool.closed:
            self._pool = desktop_pool(*self.screen, warm=self.warm)
        return self._pool

    async def _release(self) -> None:
        desk, self.desk = self.desk, None
        if desk is not None:
            if desk.helper is not None:
                desk.helper.close()
            pool = self._get_pool()
            await run_blocking(pool.release, desk.sb)

    async def _start_desktop(self, task: DesktopTask) -> None:
        """A fresh desktop with the task's files and application (``self.desk``)."""
        pool = self._get_pool()
        sb = await run_blocking(pool.acquire, 120.0)
        self.desk = DesktopSandbox(sb, *self.screen, helper=self.use_helper)
        try:
            await run_blocking(self._setup, self.desk, task)
        except BaseException:
            await self._release()
            raise

    @staticmethod
    def _setup(desk: DesktopSandbox, task: DesktopTask) -> None:
        if task.files:
            desk.sb.put_files(task.files)
        script = "set -e\n"
        if task.sheet is not None:
            path, text = task.sheet
            script += (
                f"printf %s {_q(text)} > /tmp/Sheet1.csv && HOME=/tmp ssconvert /tmp/Sheet1.csv {_q(path)} "
                ">/dev/null 2>&1 && rm -f /tmp/Sheet1.csv\n"
            )
        script += "chown -R 1000:1000 /home/user\n"
        code, out = desk.run_root(script, timeout=60)
        if code != 0:
            raise SandboxError(f"task setup failed: {out.decode(errors='replace')[-800:]}")
        desk.launch(list(task.launch), window_class=task.window_class)

    async def _screen_message(self, head: str, *, watch_app: bool = False, final: bool = True) -> Message:
        """Settle, then the screenshot (+ element list) as a user message; updates the state key, the
        verdict and ``_app_seen`` (the app's state, with ``watch_app``)."""
        assert self.desk is not None and self.current is not None
        task = self.current
        observe = functools.partial(
            self.desk.observe,
            settle_s=self.settle_s,
            app=(task.launch[0], task.window_class) if watch_app else None,
            a11y=self.a11y,
            clipboard=task.check["kind"] == "clipboard",
            stat=watched_paths(task.check),
        )
        seen = await run_blocking(observe)
        self._app_seen = seen.state
        image, nodes = seen.image, seen.nodes
        self._nodes = ob.element_list(nodes, self.screen) if self.a11y else []
        verdict = await run_blocking(self._check, seen, final or seen.state == "exited")
        self._verdict = verdict
        self._last_key = f"{ob.image_digest(image)}:{ob.tree_digest(nodes)}:{verdict.progress:.3f}"
        if image.size != self.screen_size:
            image = image.resize(self.screen_size)
        if self.marks:
            image = ob.draw_marks(image, self._nodes, self._scale)
        from turngym.sandboxes.desktop import png_bytes

        w, h = self.screen_size
        text = f"{head}Screenshot ({w}x{h} pixels)." if self.screenshot else f"{head}Screen ({w}x{h} pixels)."
        if self.a11y:
            text += "\nElements (id, role, name, bounds x,y,w,h):\n" + ob.elements_text(
                self._nodes, self._scale
            )
        return Message(role="user", content=text, images=[png_bytes(image)] if self.screenshot else [])

    def _check(self, seen: Observation, final: bool) -> Verdict:
        """The checker's verdict. Between turns, a state the helper saw unchanged (the checked paths'
        ``stat``, the clipboard text) reuses the last verdict; the clipboard is judged from the text the
        helper read. The last turn's verdict (and every one without the helper) is the full checker's."""
        assert self.desk is not None and self.current is not None
        spec = self.current.check
        fp = None if seen.stat is None and seen.clipboard is None else (seen.stat, seen.clipboard)
        if not final and fp is not None:
            if fp == self._check_fp and self._verdict is not None:
                return self._verdict
            if spec["kind"] == "clipboard" and seen.clipboard is not None:
                self._check_fp = fp
                return clipboard_verdict(seen.clipboard, spec)
        verdict = check(self.desk, spec, self._check_cache)
        self._check_fp = fp
        return verdict

    # ------------------------------------------------------------------ env hooks
    async def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> Task:
        await self._release()
        ids = [t.task_id for t in self._task_list]
        want = options.get("task")
        if want is not None:
            if want not in ids:
                raise ValueError(f"unknown gui-desktop task {want!r}")
            index = ids.index(want)
        else:
            index = int(rng.integers(len(ids)))
        task = self._task_list[index]
        self.current = task
        self._nodes, self._mouse, self._progress, self._verdict = [], (0, 0), 0.0, None
        self._check_cache, self.end_cause, self._plan_pos = {}, "", 0
        self._check_fp, self._app_seen = None, "running"
        self._log, self._turn_calls = [], []
        await self._start_desktop(task)
        first = await self._screen_message(f"Task: {task.instruction}\n\n", final=False)
        self._progress = self._progress0 = self._verdict.progress if self._verdict else 0.0
        self._keys = [self._last_key]
        intro = (
            self.system_intro
            if self.screenshot
            else self.system_intro.replace(
                "a screenshot; coordinates are pixels of that screenshot",
                "the screen's accessible elements with their boxes; coordinates are screen pixels",
            )
        )
        system = Message(role="system", content=(intro + "\n\n" + self.tool_instructions()).strip())
        reference = {"app": task.app, "checker": task.check, "template": task.template}
        return Task(
            messages=[system, first], task_id=task.task_id, reference=reference, info={"app": task.app}
        )

    async def _observe(self, results: list[ToolResult]) -> list[Message]:
        self._log.append(self._turn_calls)
        self._turn_calls = []
        if self.desk is None:
            return []
        try:
            task = self.current
            assert task is not None
            final = self._terminated or self.turn >= self.max_turns
            msg = await self._screen_message("", watch_app=True, final=final)
            if self._app_seen == "exited":
                self._end(f"the application {task.app} exited")
        except (DesktopDead, SandboxError) as e:
            self._end(f"the desktop died ({e})")
            self._keys.append("dead")
            return [Message(role="user", content=f"The episode ended: {self.end_cause}.")]
        self._keys.append(self._last_key)
        if self.end_cause:
            msg.content = f"The episode ended: {self.end_cause}.\n" + msg.content
        return [msg]

    def _end(self, cause: str) -> None:
        if not self.end_cause:
            self.end_cause = cause
        self.end_episode()

    def _turn_reward(self, results: list[ToolResult], done: bool) -> dict[str, float]:
        verdict = self._verdict
        progress = verdict.progress if verdict is not None else self._progress
        # partial credit relative to the start, so that a solved episode sums to exactly 1
        span = max(1.0 - self._progress0, 1e-9)
        out = {"progress": PROGRESS_WEIGHT * (progress - self._progress) / span}
        self._progress = progress
        if done:
            out["success"] = (1.0 - PROGRESS_WEIGHT) if verdict is not None and verdict.success else 0.0
        return out

    def _step_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"app": self.current.app if self.current else ""}
        if self._verdict is not None:
            info["check"] = {"success": self._verdict.success, "progress": self._verdict.progress,
                             "detail": self._verdict.detail}  # fmt: skip
        if self.end_cause:
            info["end_cause"] = self.end_cause
        if self._done and self.desk is not None:
            self._done_release()
        return info

    def _done_release(self) -> None:
        """The episode is over: the desktop goes back (a replayed fork starts its own)."""
        desk, self.desk = self.desk, None
        if desk is not None and desk.helper is not None:
            desk.helper.close()
        if desk is not None and self._pool is not None:
            self._pool.release_later(desk.sb)

    def _state_key(self) -> str:
        tid = self.current.task_id if self.current else ""
        return f"{tid}:{self._keys[-1] if self._keys else ''}"

    async def _close(self) -> None:
        await self._release()
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await run_blocking(pool.detach)

    # ------------------------------------------------------------------ expert
    def expert_action(self) -> str | Message | None:
        from turngym.envs.desktop.expert import next_call

        if self.current is None or self._done:
            return None
        call = next_call(self)
        return None if call is None else self.format_call(call.name, call.arguments)

    # ------------------------------------------------------------------ fork
    def _fork_copy(self) -> Env:
        live = {k: self.__dict__[k] for k in ("desk", "_pool")}
        self.__dict__.update(desk=None, _pool=None)
        try:
            child = super()._fork_copy()
        finally:
            self.__dict__.update(live)
        return child

    async def _fork(self) -> Env:
        from turngym.envs.desktop.fork import replay_into

        if self.current is None:
            raise ForkError("gui-desktop was never reset")
        child = self._fork_copy()
        assert isinstance(child, DesktopEnv)
        if self.desk is None:  # a finished episode: a finished fork, no desktop
            return child
        try:
            await replay_into(child, self)
        except BaseException:
            await child._close()
            raise
        return child


def _q(text: str) -> str:
    import shlex

    return shlex.quote(text)
