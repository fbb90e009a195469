"""A MiniWoB++ task running in a leased browser page, driven through the task's own JavaScript.

An episode starts the way the benchmark starts one: load the task page, seed the page's
``Math.random`` with ``Math.seedrandom(seed)``, set ``core.EPISODE_MAX_TIME``, call
``core.startEpisodeReal()`` and wait for ``WOB_TASK_READY``. The goal comes from
``core.getUtterance()``; the reward and the end of the episode from the globals the task's
``core.endEpisode`` sets (``WOB_RAW_REWARD_GLOBAL``, ``WOB_REWARD_GLOBAL``,
``WOB_DONE_GLOBAL``, ``WOB_REWARD_REASON``).

All functions here take a playwright ``Page`` first: run them with ``PageLease.run``. What every
browser env shares (snapshot, screenshot, elements by id) is in :mod:`turngym.envs.browser.page`.
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from turngym.envs.browser.dom import Snapshot
from turngym.envs.browser.page import screenshot, snapshot_js

if TYPE_CHECKING:
    from playwright.async_api import Page

#: Longest episode time we give the page's timer: effectively no time limit (an LLM turn is slow).
NO_TIME_LIMIT_MS = 2_000_000_000
#: The task area MiniWoB++ draws in (the ``#wrap`` element), CSS pixels.
TASK_AREA = (160, 210)

_SETUP_JS = """
(args) => {
  if (typeof core === 'undefined' || typeof core.startEpisodeReal !== 'function') return {noCore: true};
  // hide the human-facing HUD (last reward, timer, click visualiser); the task keeps working
  const style = document.createElement('style');
  style.textContent = '#reward-display, #click-canvas { display: none !important; }';
  document.head.appendChild(style);
  if (args.noAnimations && window.jQuery) { window.jQuery.fx.off = true; }
  Math.seedrandom(args.seed);
  core.EPISODE_MAX_TIME = args.maxTimeMs;
  core.startEpisodeReal();
  return WOB_TASK_READY ? {ready: true, utterance: core.getUtterance()} : {ready: false};
}
"""

_STATUS_JS = """
() => ({done: WOB_DONE_GLOBAL, reward: WOB_REWARD_GLOBAL, raw: WOB_RAW_REWARD_GLOBAL,
        reason: WOB_REWARD_REASON === null ? null : String(WOB_REWARD_REASON), ready: WOB_TASK_READY})
"""


@functools.cache
def _observe_js() -> str:
    """The task's status and the pruned DOM in one round trip."""
    return f"(opts) => ({{status: ({_STATUS_JS.strip()})(), snap: ({snapshot_js()})(opts)}})"


@dataclass(frozen=True)
class Status:
    """The task's own episode state."""

    done: bool
    reward: float  # time-scaled (the benchmark's official reward)
    raw_reward: float  # without the time penalty
    reason: str | None


@dataclass(frozen=True)
class Started:
    instruction: str
    fields: dict[str, str]


async def start_episode(
    page: Page,
    url: str,
    seed: int,
    *,
    max_time_ms: int = NO_TIME_LIMIT_MS,
    no_animations: bool = True,
    load_timeout_s: float = 10.0,
    loaded: bool = False,
) -> Started:
    """Load the task page (unless ``loaded``: the page shows ``url``, loaded and never used, e.g. a
    pool's preloaded page) and start a seeded episode; returns the instruction."""
    if not loaded:
        await page.goto(url, wait_until="load", timeout=load_timeout_s * 1000)
    args = {"seed": seed, "maxTimeMs": max_time_ms, "noAnimations": no_animations}
    started = await page.evaluate(_SETUP_JS, args)
    if started.get("noCore"):
        raise RuntimeError(f"{url} is not a MiniWoB++ task page (no core.startEpisodeReal)")
    if started["ready"]:
        utt = started["utterance"]
    else:  # tasks that load something first set WOB_TASK_READY later
        await page.wait_for_function("() => WOB_TASK_READY", timeout=load_timeout_s * 1000, polling=20)
        utt = await page.evaluate("() => core.getUtterance()")
    if isinstance(utt, dict):  # some tasks return {utterance, fields}
        return Started(
            str(utt.get("utterance", "")), {str(k): str(v) for k, v in (utt.get("fields") or {}).items()}
        )
    return Started(str(utt), {})


@dataclass(frozen=True)
class View:
    """One observation of the page: the task's status, the pruned DOM and (if asked) a screenshot."""

    status: Status
    snapshot: Snapshot
    png: bytes | None = None


def _status(s: dict[str, Any]) -> Status:
    return Status(bool(s["done"]), float(s["reward"] or 0.0), float(s["raw"] or 0.0), s["reason"])


async def read_status(page: Page) -> Status:
    return _status(await page.evaluate(_STATUS_JS))


async def observe(
    page: Page, clip: tuple[float, float, float, float] | None = None, max_text: int = 100
) -> View:
    """Status and snapshot in one ``evaluate``; with ``clip``, a screenshot taken alongside it."""
    look = page.evaluate(_observe_js(), {"maxText": max_text})
    if clip is None:
        data, png = await look, None
    else:
        shot = asyncio.ensure_future(screenshot(page, clip))
        try:
            data = await look
        finally:
            png = await shot  # awaited even if the evaluate failed, so its error is never left unread
    return View(_status(data["status"]), Snapshot.from_js(data["snap"]), png)
