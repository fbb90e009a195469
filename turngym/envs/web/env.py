"""``web-miniwob``: MiniWoB++ tasks through the DOM, with BrowserGym-style tools by element id.

Observation: the goal, then the pruned page (one element per line, ``[id] role "name" ...``),
optionally with a screenshot. Tools act on elements by the ids in the latest observation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from turngym.core.types import Message
from turngym.envs.web import page as wp
from turngym.envs.web.base import MiniWoBEnvBase
from turngym.envs.web.expert import Step
from turngym.tools import ToolError, tool

if TYPE_CHECKING:
    from playwright.async_api import Page

MAX_WAIT_MS = 10_000


async def _require(page: Page, bid: int) -> Any:
    loc = wp.locator(page, bid)
    if await loc.count() == 0:
        raise ToolError(f"no element with id {bid} on the page; use an id from the latest observation")
    return loc.first


async def _click(page: Page, bid: int, button: str, clicks: int) -> None:
    loc = await _require(page, bid)
    await loc.scroll_into_view_if_needed()
    point = await loc.evaluate(f"(el) => ({wp.VISIBLE_POINT_JS})(el)")
    if point is None:
        raise ToolError(
            f"element {bid} is hidden under another element (or has no size); it cannot be clicked"
        )
    box = await loc.bounding_box()
    # click where the element really receives the click (its center unless something covers it)
    pos = {"x": point[0] - box["x"], "y": point[1] - box["y"]} if box else None
    await loc.click(button=button, click_count=clicks, position=pos)


async def _hover(page: Page, bid: int) -> None:
    await (await _require(page, bid)).hover()


async def _fill(page: Page, bid: int, value: str) -> None:
    loc = await _require(page, bid)
    editable = await loc.evaluate(
        "el => el.isContentEditable || el instanceof HTMLTextAreaElement || "
        "(el instanceof HTMLInputElement && !['checkbox','radio','button','submit','reset','image','file',"
        "'hidden','range','color'].includes(el.type))"
    )
    if not editable:
        raise ToolError(
            f"element {bid} is not a text field; fill works on inputs, textareas and editable text"
        )
    await loc.fill(value)


async def _select(page: Page, bid: int, options: list[str]) -> list[str]:
    loc = await _require(page, bid)
    if await loc.evaluate("el => el.tagName") != "SELECT":
        raise ToolError(f"element {bid} is not a <select>; click options of other menus instead")
    labels = await loc.evaluate("el => Array.from(el.options).map(o => o.label)")
    if all(o in labels for o in options):
        return await loc.select_option(label=options)
    return await loc.select_option(value=options)


async def _press(page: Page, bid: int, key: str) -> None:
    await (await _require(page, bid)).press(key)


async def _scroll(page: Page, dx: float, dy: float) -> None:
    await page.mouse.wheel(dx, dy)


async def _drag(page: Page, src: int, dst: int) -> None:
    a = await _require(page, src)
    b = await _require(page, dst)
    await a.scroll_into_view_if_needed()
    box_a, box_b = await a.bounding_box(), await b.bounding_box()
    if not box_a or not box_b:
        raise ToolError("drag_and_drop: an element is not visible")
    await page.mouse.move(box_a["x"] + box_a["width"] / 2, box_a["y"] + box_a["height"] / 2)
    await page.mouse.down()
    await page.mouse.move(box_b["x"] + box_b["width"] / 2, box_b["y"] + box_b["height"] / 2, steps=8)
    await page.mouse.up()


async def _wait(page: Page, ms: int) -> None:
    await page.wait_for_timeout(ms)


class WebMiniWoBEnv(MiniWoBEnvBase):
    """MiniWoB++ through the DOM (see :class:`~turngym.envs.web.base.MiniWoBEnvBase` for the arguments).

    Extra args:
        screenshot: also attach a PNG of the task area to each page observation.
        with_boxes: show each element's box ``(x, y, w, h)`` in the page text.
    """

    system_intro = (
        "You control a web browser to complete a task on a small web page. Each observation lists the "
        'page\'s elements, one per line as `[id] role "name" properties`; act on them by id with the '
        "tools. The episode ends when the page reports the task finished."
    )

    def __init__(
        self,
        task: str | list[str] | None = None,
        *,
        screenshot: bool = False,
        with_boxes: bool = False,
        **kwargs: Any,
    ):
        self.screenshot = screenshot
        self.with_boxes = with_boxes
        super().__init__(task, **kwargs)

    # ------------------------------------------------------------------ tools
    @tool
    async def click(self, bid: int, button: Literal["left", "middle", "right"] = "left") -> str:
        """Click an element.

        Args:
            bid: the element's id from the page listing
            button: mouse button
        """
        await self.call_page(_click, bid, button, 1)
        return f"clicked [{bid}]"

    @tool
    async def dblclick(self, bid: int) -> str:
        """Double-click an element.

        Args:
            bid: the element's id from the page listing
        """
        await self.call_page(_click, bid, "left", 2)
        return f"double-clicked [{bid}]"

    @tool
    async def hover(self, bid: int) -> str:
        """Move the mouse over an element.

        Args:
            bid: the element's id from the page listing
        """
        await self.call_page(_hover, bid)
        return f"hovering over [{bid}]"

    @tool
    async def fill(self, bid: int, value: str) -> str:
        """Replace the text of a text field with a value.

        Args:
            bid: the id of an input, textarea or editable element
            value: the text to enter
        """
        await self.call_page(_fill, bid, value)
        return f"filled [{bid}]"

    @tool
    async def select_option(self, bid: int, options: str | list[str]) -> str:
        """Select one or more options of a <select> element, by label or value.

        Args:
            bid: the id of the select element
            options: an option's label (or a list of labels for a multiple select)
        """
        chosen = await self.call_page(_select, bid, [options] if isinstance(options, str) else list(options))
        return f"selected {chosen} in [{bid}]"

    @tool
    async def press(self, bid: int, key_comb: str) -> str:
        """Focus an element and press a key combination, e.g. "Enter", "Control+a", "ArrowDown".

        Args:
            bid: the element's id
            key_comb: keys joined with "+", in Playwright key names
        """
        await self.call_page(_press, bid, key_comb)
        return f"pressed {key_comb} on [{bid}]"

    @tool
    async def scroll(self, dx: float, dy: float) -> str:
        """Scroll the page (or the element under the mouse) by a number of pixels.

        Args:
            dx: horizontal pixels (positive scrolls right)
            dy: vertical pixels (positive scrolls down)
        """
        await self.call_page(_scroll, dx, dy)
        return f"scrolled by ({dx:g}, {dy:g})"

    @tool
    async def drag_and_drop(self, from_bid: int, to_bid: int) -> str:
        """Drag one element and drop it onto another.

        Args:
            from_bid: id of the element to drag
            to_bid: id of the element to drop onto
        """
        await self.call_page(_drag, from_bid, to_bid)
        return f"dragged [{from_bid}] onto [{to_bid}]"

    @tool
    async def noop(self, wait_ms: int = 500) -> str:
        """Do nothing and wait a little (for pages that change over time).

        Args:
            wait_ms: milliseconds to wait (at most 10000)
        """
        if not 0 <= wait_ms <= MAX_WAIT_MS:
            raise ToolError(f"wait_ms must be between 0 and {MAX_WAIT_MS}")
        await self.call_page(_wait, wait_ms)
        return f"waited {wait_ms} ms"

    # ------------------------------------------------------------------ observation
    async def _page_message(self, initial: bool) -> Message:
        assert self.lease is not None
        self.snap = await self.lease.run(wp.snapshot)
        head = f"Task: {self.instruction}\n\n" if initial else ""
        text = f"{head}Page:\n{self.snap.text(with_boxes=self.with_boxes)}"
        images = []
        if self.screenshot:
            w, h = wp.TASK_AREA
            images.append(await self.lease.run(wp.screenshot, (0, 0, w, h)))
        return Message(role="user", content=text, images=images)

    def render_step(self, step: Step) -> list[str]:
        return [step.to_dom_call()]
