"""``gui-desktop-grounding``: one-step grounding on real desktop screenshots (ScreenSpot-style).

Each episode starts one of the ``gui-desktop`` tasks' applications, picks an element of its
accessibility tree whose role and name identify it uniquely (``the push button "Save"``, ``the menu
"Edit"``), and asks ``Click on <description>.`` The reward is 1 when the episode's ``click`` lands inside
the element's box (``info["reference"]["box"]``, screenshot pixels), else 0. Applications without an
accessibility tree (the GTK 2 file manager, xterm) are skipped.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from turngym.core.env import Task
from turngym.core.types import Message, ToolResult
from turngym.envs.desktop.env import DesktopEnv
from turngym.sandboxes.docker import run_blocking

TARGET_ROLES = frozenset({"push button", "toggle button", "menu", "check box", "radio button", "page tab"})


def targets(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Nodes a description names uniquely: a target role, a name, a box, and no other node with both."""
    seen: dict[tuple[str, str], int] = {}
    for n in nodes:
        seen[(n["role"], n.get("name", ""))] = seen.get((n["role"], n.get("name", "")), 0) + 1
    return [
        n
        for n in nodes
        if n["role"] in TARGET_ROLES
        and n.get("name")
        and n["w"] > 2
        and n["h"] > 2
        and seen[(n["role"], n["name"])] == 1
    ]


class GroundingDesktopEnv(DesktopEnv):
    """One screenshot, one instruction, one answer: the first turn whose call runs ends the episode
    (arguments as :class:`DesktopEnv`)."""

    default_max_turns = 3  # answer attempts: a malformed one is an error observation, not the end
    forkable = False
    _not_forkable_reason = "a one-step grounding episode has nothing to branch"
    system_intro = (
        "You see a screenshot of a Linux desktop. Click on the element the user names; coordinates are "
        "pixels of the screenshot, (0, 0) at the top left."
    )

    def __init__(self, task: str | list[str] | None = None, **kwargs: Any):
        kwargs.setdefault("max_turns", self.default_max_turns)
        super().__init__(task, **kwargs)
        self.target: dict[str, Any] | None = None
        self.box: list[float] = []

    async def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> Task:
        for _ in range(12):
            task = await super()._reset(rng, options)
            assert self.desk is not None
            found = targets(await run_blocking(self.desk.a11y_nodes))
            if found:
                break
            if options.get("task"):
                raise ValueError(f"task {task.task_id!r} shows no element that can be named for grounding")
        else:
            raise RuntimeError("no gui-desktop task showed a nameable element")
        target = found[int(rng.integers(len(found)))]
        self.target = target
        s = self._scale
        self.box = [target["x"] / s, target["y"] / s, target["w"] / s, target["h"] / s]
        what = f'the {target["role"]} "{target["name"]}"'
        task.messages[-1].content = f"Click on {what}.\n\n" + task.messages[-1].content.split("\n\n", 1)[-1]
        task.reference = {**task.reference, "box": self.box, "target": what}
        return task

    async def _observe(self, results: list[ToolResult]) -> list[Message]:
        # the first turn whose call runs is the answer: the episode terminates with it; a malformed
        # turn gets an error observation and another try (up to max_turns)
        if any(r.ok for r in results):
            self._terminated = True
        return await super()._observe(results)

    def _turn_reward(self, results: list[ToolResult], done: bool) -> dict[str, float]:
        hit = 0.0
        calls = self._log[-1] if self._log else []
        clicks = [a for name, a in calls if name == "click"]
        if clicks and self.box:
            x, y = clicks[-1]["x"], clicks[-1]["y"]
            bx, by, bw, bh = self.box
            hit = float(bx <= x < bx + bw and by <= y < by + bh)
        return {"hit": hit}

    def expert_action(self) -> Any:
        if not self.box or self._done:
            return None
        bx, by, bw, bh = self.box
        return self.format_call("click", {"x": int(bx + bw / 2), "y": int(by + bh / 2)})
