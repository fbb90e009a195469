"""``gui-miniwob-grounding``: single-step GUI grounding (ScreenSpot-style) on MiniWoB++ pages.

Each episode loads a task page, picks one visible element that a short description names
unambiguously (``the button "Submit"``, ``the text field "Username"``, ``the link "egestas"``),
and shows the screenshot with the instruction ``Click on <description>.``. The one action is
``click(x, y)``; the reward is 1 when the point falls inside the element's box, read from the
DOM (``info["reference"]["box"]`` holds it in screenshot pixels), else 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from turngym.core.env import Task
from turngym.core.types import Message, ToolResult
from turngym.envs.browser.dom import Node
from turngym.envs.browser.env import Calls, call
from turngym.envs.browser.pixels import PixelObservation
from turngym.envs.web import page as wp
from turngym.envs.web.base import MiniWoBEnvBase
from turngym.tools import tool

_ROLE_WORDS = {
    "button": "button", "link": "link", "textbox": "text field", "checkbox": "checkbox", "radio": "radio button",
    "combobox": "dropdown", "listbox": "list", "tab": "tab", "slider": "slider", "img": "image",
    "heading": "heading", "label": "label", "option": "option", "menuitem": "menu item", "treeitem": "tree item",
}  # fmt: skip

#: elements whose center the page really shows (not covered by another element)
_HIT_JS = """
(ids) => ids.filter((id) => {
  const el = document.querySelector(`[data-tg-id="${id}"]`);
  if (!el) return false;
  const r = el.getBoundingClientRect();
  const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
  return hit !== null && (hit === el || el.contains(hit));
})
"""


async def _visible_centres(page: Any, ids: list[int]) -> list[int]:
    return await page.evaluate(_HIT_JS, ids)


def describe(node: Node) -> str:
    """A short referring expression for an element."""
    kind = _ROLE_WORDS.get(node.role, "text")
    return f'the {kind} "{node.name}"'


class GroundingMiniWoBEnv(PixelObservation, MiniWoBEnvBase):
    crop_area = wp.TASK_AREA

    """One screenshot, one instruction, one click (arguments as :class:`~turngym.envs.gui.env.GuiMiniWoBEnv`)."""

    default_max_turns = 1
    system_intro = (
        "You see a screenshot of a small web page. Click on the element the user names; "
        "coordinates are pixels of the screenshot, (0, 0) at the top left."
    )

    def __init__(self, task: str | list[str] | None = None, *, crop_to_task: bool = True, **kwargs: Any):
        kwargs.setdefault("max_turns", 1)
        super().__init__(task, **kwargs)
        self._init_screen(crop_to_task)
        self.target: Node | None = None
        self.point: tuple[float, float] | None = None

    async def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> Task:
        self.target, self.point = None, None
        for _ in range(8):  # a page with no nameable element (a canvas) -> another task
            task = await super()._reset(rng, options)
            target = await self._pick_target(rng)
            if target is not None:
                break
            if options.get("task"):
                await self._release()
                raise ValueError(f"task {self.task_name!r} shows no element that can be named for grounding")
        else:
            await self._release()
            raise RuntimeError("no groundable element found in 8 task pages")
        self.target = target
        box = self.pixel_box(target)
        screenshot = task.messages[1].images
        await self._release()  # one screenshot is all the episode needs
        user = Message(role="user", content=f"Click on {describe(target)}.", images=screenshot)
        return Task(
            messages=[task.messages[0], user],
            task_id=f"{task.task_id}/{target.id}",
            reference={**task.reference, "target": describe(target), "box": box},
            info=task.info,
        )

    async def _pick_target(self, rng: np.random.Generator) -> Node | None:
        assert self.lease is not None
        w, h = self.screen_css
        counts: dict[tuple[str, str], int] = {}
        for n in self.snap.nodes:
            counts[(n.role, n.name)] = counts.get((n.role, n.name), 0) + 1
        cands = [
            n
            for n in self.snap.nodes
            if n.id is not None
            and n.name
            and len(n.name) <= 40
            and counts[(n.role, n.name)] == 1
            and n.box[2] >= 3
            and n.box[3] >= 3
            and n.box[0] >= 0
            and n.box[1] >= 0
            and n.box[0] + n.box[2] <= w
            and n.box[1] + n.box[3] <= h
            and n.box[2] * n.box[3] <= 0.5 * w * h
        ]
        visible = set(await self.lease.run(_visible_centres, [n.id for n in cands]))
        cands = [n for n in cands if n.id in visible]
        if not cands:
            return None
        return cands[int(rng.integers(len(cands)))]

    @tool(terminal=True)
    async def click(self, x: float, y: float) -> str:
        """Click on the named element.

        Args:
            x: horizontal pixel of the screenshot
            y: vertical pixel of the screenshot
        """
        self._css(x, y)  # validates the coordinates
        self.point = (x, y)
        return f"clicked at ({x:g}, {y:g})"

    async def _observe(self, results: list[ToolResult]) -> list[Message]:
        return []  # a single-step task: no new page

    def _turn_reward(self, results: list[ToolResult], done: bool) -> dict[str, float]:
        if not done:
            return {}
        if self.point is None or self.target is None:
            return {"hit": 0.0}
        bx, by, bw, bh = self.pixel_box(self.target)
        x, y = self.point
        return {"hit": float(bx <= x < bx + bw and by <= y < by + bh)}

    def _step_info(self) -> dict[str, Any]:
        return {"point": list(self.point) if self.point else None}

    def _state_key(self) -> str:
        return f"{self.task.task_id if self.task else ''}:{self.point is not None}"

    def _fork_refusal(self) -> str:
        # the page is released after the screenshot: the episode is its Python state (the target's box and
        # the click), so the fork is a state copy without a page
        return "" if self.lease is None and not self.fault else super()._fork_refusal()

    def _expert_calls(self) -> Calls | None:
        if self._done or self.target is None:
            return None
        x, y = self.pixel_center(self.target)
        return [call("click", x=x, y=y)]
