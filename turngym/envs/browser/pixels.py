"""Pixel observations for browser envs: screenshots, and coordinates in screenshot pixels.

``gui-miniwob`` and the grounding env observe only screenshots; their tools take screenshot-pixel
coordinates (``scale`` pixels per CSS px), which :meth:`PixelObservation._css` checks and converts.
"""

from __future__ import annotations

from turngym.core.types import Message
from turngym.envs.browser.dom import Node
from turngym.tools import ToolError


class PixelObservation:
    """Mixin: screenshot observations and screenshot-pixel coordinates (put it before the env base).

    The host env is a :class:`~turngym.envs.browser.env.BrowserEnv` that defines ``_look(clip)``
    (read the page once: set ``self.snap`` to the pruned DOM, which stays private, and return an object
    whose ``png`` is the screenshot of ``clip``), and calls ``_init_screen`` in its ``__init__``.
    ``crop_area`` is the area (CSS px, from the top left) that a cropped screenshot shows.
    """

    crop_area: tuple[int, int] | None = None
    crop_to_task: bool
    scale: float
    viewport: tuple[int, int]
    screen_size: tuple[int, int]

    def _init_screen(self, crop_to_task: bool) -> None:
        if crop_to_task and self.crop_area is None:
            raise ValueError(f"{type(self).__name__} has no crop area; use crop_to_task=False")
        self.crop_to_task = crop_to_task
        w, h = self.screen_css
        self.screen_size = (round(w * self.scale), round(h * self.scale))

    @property
    def screen_css(self) -> tuple[int, int]:
        """The screenshot's area in CSS pixels."""
        return self.crop_area if self.crop_to_task and self.crop_area else self.viewport

    def _css(self, x: float, y: float) -> tuple[float, float]:
        """Screenshot pixels -> CSS pixels; off-screen points are a ``ToolError``."""
        w, h = self.screen_size
        if not (0 <= x < w and 0 <= y < h):
            raise ToolError(f"({x:g}, {y:g}) is off the screen; x must be in [0, {w}) and y in [0, {h})")
        return x / self.scale, y / self.scale

    def pixel_center(self, node: Node) -> tuple[int, int]:
        """Where to click ``node`` in screenshot pixels (its center, or an uncovered point)."""
        cx, cy = node.click_point
        return int(cx * self.scale), int(cy * self.scale)

    def pixel_box(self, node: Node) -> list[float]:
        x, y, w, h = node.box
        return [x * self.scale, y * self.scale, w * self.scale, h * self.scale]

    async def _page_message(self, initial: bool) -> Message:
        w, h = self.screen_css
        # the DOM is read privately: state key, expert and grounding targets
        png = (await self._look((0, 0, w, h))).png  # type: ignore[attr-defined]
        sw, sh = self.screen_size
        head = f"Task: {self.instruction}\n\n" if initial else ""  # type: ignore[attr-defined]
        return Message(role="user", content=f"{head}Screenshot ({sw}x{sh} pixels).", images=[png])
