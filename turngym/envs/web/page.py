"""A MiniWoB++ task running in a leased browser page, driven through the task's own JavaScript.

An episode starts the way the benchmark starts one: load the task page, seed the page's
``Math.random`` with ``Math.seedrandom(seed)``, set ``core.EPISODE_MAX_TIME``, call
``core.startEpisodeReal()`` and wait for ``WOB_TASK_READY``. The goal comes from
``core.getUtterance()``; the reward and the end of the episode from the globals the task's
``core.endEpisode`` sets (``WOB_RAW_REWARD_GLOBAL``, ``WOB_REWARD_GLOBAL``,
``WOB_DONE_GLOBAL``, ``WOB_REWARD_REASON``).

All functions here take a playwright ``Page`` first: run them with ``PageLease.run``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from turngym.envs.web.dom import Snapshot

if TYPE_CHECKING:
    from playwright.async_api import Page

#: Longest episode time we give the page's timer: effectively no time limit (an LLM turn is slow).
NO_TIME_LIMIT_MS = 2_000_000_000
#: The task area MiniWoB++ draws in (the ``#wrap`` element), CSS pixels.
TASK_AREA = (160, 210)

_SETUP_JS = """
(args) => {
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


#: A point (viewport CSS px) where a hit test reaches ``el`` (or a descendant): its center if that is
#: not covered, else the first uncovered point of a 7x7 grid over its box; null if it is fully covered.
VISIBLE_POINT_JS = """
(el) => {
  const r = el.getBoundingClientRect();
  if (r.width <= 0 || r.height <= 0) return null;
  const hits = (x, y) => { const h = document.elementFromPoint(x, y); return h !== null && (h === el || el.contains(h)); };
  const cx = r.left + r.width / 2, cy = r.top + r.height / 2;
  if (hits(cx, cy)) return [cx, cy];
  for (let i = 1; i < 8; i++) for (let j = 1; j < 8; j++) {
    const x = r.left + r.width * i / 8, y = r.top + r.height * j / 8;
    if (hits(x, y)) return [x, y];
  }
  return null;
}
"""


@functools.cache
def _snapshot_js() -> str:
    body = (Path(__file__).with_name("snapshot.js")).read_text().strip().rstrip(";")
    return f"(opts) => ({body})(opts, {VISIBLE_POINT_JS.strip()})"


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
) -> Started:
    """Load the task page and start a seeded episode; returns the instruction."""
    await page.goto(url, wait_until="load", timeout=load_timeout_s * 1000)
    has_core = await page.evaluate(
        "() => typeof core !== 'undefined' && typeof core.startEpisodeReal === 'function'"
    )
    if not has_core:
        raise RuntimeError(f"{url} is not a MiniWoB++ task page (no core.startEpisodeReal)")
    args = {"seed": seed, "maxTimeMs": max_time_ms, "noAnimations": no_animations}
    started = await page.evaluate(_SETUP_JS, args)
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


async def read_status(page: Page) -> Status:
    s = await page.evaluate(_STATUS_JS)
    return Status(bool(s["done"]), float(s["reward"] or 0.0), float(s["raw"] or 0.0), s["reason"])


async def snapshot(page: Page, max_text: int = 100) -> Snapshot:
    return Snapshot.from_js(await page.evaluate(_snapshot_js(), {"maxText": max_text}))


async def screenshot(page: Page, clip: tuple[float, float, float, float] | None = None) -> bytes:
    """PNG of the viewport (or ``clip`` = x, y, w, h in CSS px); caret hidden, animations frozen."""
    kwargs: dict[str, Any] = {"type": "png", "caret": "hide", "animations": "disabled"}
    if clip is not None:
        x, y, w, h = clip
        kwargs["clip"] = {"x": x, "y": y, "width": w, "height": h}
    return await page.screenshot(**kwargs)


def locator(page: Page, bid: int) -> Any:
    return page.locator(f'[data-tg-id="{int(bid)}"]')
