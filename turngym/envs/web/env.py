"""``web-miniwob``: MiniWoB++ tasks through the DOM, with BrowserGym-style tools by element id.

Observation: the goal, then the pruned page (one element per line, ``[id] role "name" ...``),
optionally with a screenshot. Tools act on elements by the ids in the latest observation.
"""

from __future__ import annotations

from turngym.core.types import Message
from turngym.envs.browser.element_tools import ElementTools
from turngym.envs.browser.env import Calls
from turngym.envs.web import page as wp
from turngym.envs.web.base import MiniWoBEnvBase
from turngym.envs.web.expert import Step


class WebMiniWoBEnv(ElementTools, MiniWoBEnvBase):
    """MiniWoB++ through the DOM (see :class:`~turngym.envs.web.base.MiniWoBEnvBase` for the arguments).

    Extra args (:class:`~turngym.envs.browser.element_tools.ElementTools`):
        screenshot: also attach a PNG of the task area to each page observation.
        with_boxes: show each element's box ``(x, y, w, h)`` in the page text.
    """

    system_intro = (
        "You control a web browser to complete a task on a small web page. Each observation lists the "
        'page\'s elements, one per line as `[id] role "name" properties`; act on them by id with the '
        "tools. The episode ends when the page reports the task finished."
    )

    # ------------------------------------------------------------------ observation
    async def _page_message(self, initial: bool) -> Message:
        view = await self._look((0, 0, *wp.TASK_AREA) if self.screenshot else None)
        head = f"Task: {self.instruction}\n\n" if initial else ""
        text = f"{head}Page:\n{self.snap.text(with_boxes=self.with_boxes)}"
        return Message(role="user", content=text, images=[view.png] if view.png else [])

    def render_step(self, step: Step) -> Calls:
        return [step.to_dom_call()]
