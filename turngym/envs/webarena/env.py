"""``web-arena-lite``: WebArena-style tasks on local, stateful sites through the browser tools.

Each env owns one running instance of every site its tasks use (a forum, an issue tracker; see
:mod:`~turngym.envs.webarena.sites`) and resets a site by restoring its database file. An episode
opens the task's ``start_url`` in a fresh browser context; the agent browses with the web-miniwob
tools plus navigation/tab tools, and ends with ``stop(answer)``. At the end (stop or turn limit)
the task's evaluators (string / URL / program checks, :mod:`~turngym.envs.webarena.evaluators`)
score the episode; the reward is their product (1 = success).

Tasks: the generated set (:func:`~turngym.envs.webarena.taskgen.default_tasks`) by default, or a
WebArena-format file / list (``tasks=``). ``options={"task_id": n}`` picks one.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from turngym.core.types import ToolResult
from turngym.envs.browser.env import Calls
from turngym.envs.browser.sites.env import Episode, SiteBrowserEnv
from turngym.envs.webarena.evaluators import Judge, ProgramContext, evaluate
from turngym.envs.webarena.expert import ExpertContext, arena_expert_action
from turngym.envs.webarena.sites import SITES, SiteInstance
from turngym.envs.webarena.taskgen import default_tasks
from turngym.envs.webarena.tasks import check_task, fill_placeholders, load_tasks, site_for
from turngym.tools import ToolError, tool

if TYPE_CHECKING:
    from playwright.async_api import Page


async def _read_locator(page: Page, url: str | None, locator: str, timeout_s: float) -> str:
    """Open ``url`` in a scratch tab (or use ``page`` when None) and select content with ``locator``."""
    target = page
    if url is not None:
        target = await page.context.new_page()
        await target.goto(url, wait_until="domcontentloaded", timeout=timeout_s * 1000)
    try:
        if not locator.strip():
            return await target.content()
        try:
            value = await target.evaluate(f"() => {locator}")
        except Exception:  # noqa: BLE001 - WebArena scores a failing locator as empty content
            return ""
        return "" if value is None else str(value)
    finally:
        if target is not page:
            await target.close()


class WebArenaEnv(SiteBrowserEnv):
    """WebArena-style tasks on the local forum and issue tracker.

    Args:
        tasks: a path to WebArena-format tasks (JSON list, JSON lines or a folder), a list of task
            dicts, or None for the generated set.
        seed: data seed of the sites (and of the generated tasks).
        per_template: generated tasks per intent template (18 templates).
        sites: keep only tasks on these sites (``"forum"``, ``"tracker"``).
        template_ids: keep only tasks of these intent templates.
        judge: callable for ``fuzzy_match`` references (WebArena uses an LLM); none needed otherwise.
        **kwargs: :class:`~turngym.envs.browser.sites.env.SiteBrowserEnv` options.
    """

    default_max_turns = 15
    verdict_key = "evaluation"
    # a fork runs site instances of its own (working copies restored to the episode's start state, where
    # the original's were at reset) and replays the episode's writes into them
    _fork_shared = (*SiteBrowserEnv._fork_shared, "tasks", "by_id", "judge")
    _fork_fresh: dict[str, Any] = {**SiteBrowserEnv._fork_fresh, "instances": {}}
    system_intro = (
        "You are a web agent on a forum (http://forum.local) and an issue tracker (http://tracker.local); you "
        "are logged in. Complete the task with the browser tools. When done, call stop(answer): put the answer "
        "in it if the task asks a question, otherwise leave it empty. Each observation shows the URL and the "
        'page\'s elements as `[id] role "name"`; act on them by id.'
    )

    def __init__(
        self,
        tasks: str | Path | list[dict[str, Any]] | None = None,
        *,
        seed: int = 0,
        per_template: int = 10,
        sites: list[str] | None = None,
        template_ids: list[int] | None = None,
        judge: Judge | None = None,
        **kwargs: Any,
    ):
        if tasks is None:
            loaded = default_tasks(seed, per_template)
        elif isinstance(tasks, (str, Path)):
            loaded = load_tasks(tasks)
        else:
            loaded = [check_task(t) for t in tasks]
        if sites is not None:
            unknown = set(sites) - set(SITES)
            if unknown:
                raise ValueError(f"unknown sites {sorted(unknown)}; known: {sorted(SITES)}")
            loaded = [t for t in loaded if set(t["sites"]) <= set(sites)]
        if template_ids is not None:
            loaded = [t for t in loaded if t.get("intent_template_id") in set(template_ids)]
        if not loaded:
            raise ValueError("no tasks left after filtering")
        self.tasks = loaded
        self.by_id = {int(t["task_id"]): t for t in loaded}
        self.seed_data = seed
        self.judge = judge
        super().__init__(**kwargs)
        self.instances: dict[str, SiteInstance] = {}
        self.task_cfg: dict[str, Any] = {}
        self.answer = ""
        self.stopped = False
        self.evaluation: dict[str, Any] | None = None
        self.reset_s = 0.0
        self._expert = ExpertContext()

    def site(self, name: str) -> SiteInstance:
        """The running instance of a site (started on first use)."""
        if name not in self.instances:
            self.instances[name] = SiteInstance(name, self.seed_data)
        return self.instances[name]

    # ------------------------------------------------------------------ episode
    async def _start_episode(self, rng: np.random.Generator, options: dict[str, Any]) -> Episode:
        if "task_id" in options:
            tid = int(options["task_id"])
            if tid not in self.by_id:
                raise ValueError(f"no task {tid} in this env's task set")
            raw = self.by_id[tid]
        else:
            raw = self.tasks[int(rng.integers(len(self.tasks)))]
        self.reset_s = sum(self.site(s).reset() for s in raw["sites"])
        self.task_cfg = fill_placeholders(raw)
        self.answer, self.stopped, self.evaluation = "", False, None
        self._expert = ExpertContext()
        return Episode(
            instruction=self.task_cfg["intent"],
            start_url=self.task_cfg["start_url"],
            task_id=f"webarena/{raw['task_id']}",
            hosts={SITES[s].origin: self.site(s).url for s in raw["sites"]},
            reference={"eval": self.task_cfg["eval"], "task_id": raw["task_id"],
                       "intent_template_id": raw.get("intent_template_id")},
            info={"sites": list(raw["sites"]), "site_reset_s": self.reset_s},
        )  # fmt: skip

    async def _fork_sites(self) -> None:
        assert self.episode is not None
        sites = list(self.episode.info["sites"])
        self.episode.hosts = {SITES[s].origin: self.site(s).url for s in sites}

    @tool(terminal=True)
    async def stop(self, answer: str = "") -> str:
        """Finish the task. If the task asks for information, give the answer; otherwise leave it empty.

        Args:
            answer: the answer to the task's question ("" for tasks that ask to do something)
        """
        if len(answer) > 10_000:
            raise ToolError("the answer is too long (at most 10000 characters)")
        self.answer, self.stopped = answer, True
        return "stopped"

    # ------------------------------------------------------------------ evaluation
    def _query_db(self, url: str, sql: str) -> list[tuple[Any, ...]]:
        site = site_for(url)
        if site is None or site not in self.instances:
            raise ValueError(f"program check names no running site: {url!r}")
        return self.site(site).query(sql)

    async def _read_page(self, url: str, locator: str) -> str:
        real = None if url == "last" else self.real_url(url)
        return await self.call_page(_read_locator, real, locator, self.load_timeout_s)

    async def _evaluate(self) -> dict[str, Any]:
        url = self.display_url(self.view.url) if self.view else ""
        ctx = ProgramContext(read_page=self._read_page, query_db=self._query_db)
        score, parts = await evaluate(self.task_cfg, answer=self.answer, url=url, ctx=ctx, judge=self.judge)
        return {"score": score, "parts": parts, "answer": self.answer, "url": url, "stopped": self.stopped}

    async def _turn_reward(self, results: list[ToolResult], done: bool) -> dict[str, float]:
        if self.fault or self._paid or not done:
            return {}
        self._paid = True
        try:
            self.evaluation = await self._evaluate()
        except Exception as e:  # noqa: BLE001 - a broken page at the end scores 0, with the reason
            self.evaluation = {"score": 0.0, "parts": {}, "error": str(e)[:300], "answer": self.answer}
        await self._release()
        return {"success": float(self.evaluation["score"])}

    def _verdict(self) -> dict[str, Any] | None:
        return self.evaluation

    def _expert_calls(self) -> Calls | None:
        if self._done or self.lease is None or self.view is None:
            return None
        self._expert.tabs = [self.display_url(url) for url, _ in self.view.tabs]
        self._expert.active = self.active
        return arena_expert_action(self.task_cfg, self.display_url(self.view.url), self.snap, self._expert)

    async def _close(self) -> None:
        await super()._close()
        for inst in self.instances.values():
            inst.close()
        self.instances.clear()
