"""Element-id tools (BrowserGym's action set): act on the elements of the latest pruned-DOM listing.

``ElementTools`` is a mixin for :class:`~turngym.envs.browser.env.BrowserEnv` subclasses whose
observation lists the page's elements as ``[id] role "name" ...`` (``web-miniwob`` and the local
sites). It adds the tools ``click``, ``dblclick``, ``hover``, ``fill``, ``select_option``, ``press``,
``scroll``, ``drag_and_drop`` and ``noop``, and two observation options (``screenshot``,
``with_boxes``) for the subclass's ``_page_message``.

Each action finds its element and checks it in one page round trip. With ``self._direct`` set (pages
known to be settled, e.g. MiniWoB with animations off) clicks and hovers are input events at a
hit-tested point; otherwise playwright's actionability checks wait for the element.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from turngym.envs.browser.page import VISIBLE_POINT_JS, locator
from turngym.tools import ToolError, tool

if TYPE_CHECKING:
    from playwright.async_api import Page

MAX_WAIT_MS = 10_000


#: Finds element ``bid`` and checks it for an action in one round trip: scrolls it into view (with
#: ``scroll``), then returns its box and (with ``point``) a hit-tested point, or ``{error}``.
_TARGET_JS = f"""
(a) => {{
  const el = document.querySelector(`[data-tg-id="${{a.bid}}"]`);
  if (el === null) return {{error: "missing"}};
  const kind = el.isContentEditable || el instanceof HTMLTextAreaElement ||
    (el instanceof HTMLInputElement && !['checkbox','radio','button','submit','reset','image','file','hidden',
                                         'range','color'].includes(el.type)) ? "text" : el.tagName.toLowerCase();
  if (a.need === "text" && kind !== "text") return {{error: "not text"}};
  if (a.need === "select" && kind !== "select") return {{error: "not select"}};
  if (a.enabled && (el.matches(":disabled") || el.closest("[aria-disabled=true]") !== null))
    return {{error: "disabled"}};
  if (a.scroll) {{
    if (el.scrollIntoViewIfNeeded) el.scrollIntoViewIfNeeded(true); else el.scrollIntoView({{block: "center"}});
  }}
  const r = el.getBoundingClientRect();
  const out = {{box: [r.left, r.top, r.width, r.height]}};
  if (kind === "select") out.labels = Array.from(el.options).map(o => o.label);
  if (a.point) {{
    out.point = ({VISIBLE_POINT_JS.strip()})(el);
    if (out.point === null) return {{error: "hidden"}};
  }}
  return out;
}}
"""
_TARGET_ERRORS = {
    "missing": "no element with id {bid} on the page; use an id from the latest observation",
    "not text": "element {bid} is not a text field; fill works on inputs, textareas and editable text",
    "not select": "element {bid} is not a <select>; click options of other menus instead",
    "disabled": "element {bid} is disabled",
    "hidden": "element {bid} is hidden under another element (or has no size); it cannot be {verb}",
}


async def _target(
    page: Page,
    bid: int,
    *,
    point: bool = False,
    enabled: bool = False,
    need: str = "",
    verb: str = "used",
    scroll: bool = True,
) -> dict[str, Any]:
    """Element ``bid``'s box (and hit-tested ``point`` and select ``labels``), or a ``ToolError``."""
    args = {"bid": int(bid), "point": point, "enabled": enabled, "need": need, "scroll": scroll}
    t = await page.evaluate(_TARGET_JS, args)
    if "error" in t:
        raise ToolError(_TARGET_ERRORS[t["error"]].format(bid=bid, verb=verb))
    return t


def _offset(t: dict[str, Any]) -> dict[str, float]:
    """The target's point relative to its box (playwright's ``position``)."""
    return {"x": t["point"][0] - t["box"][0], "y": t["point"][1] - t["box"][1]}


async def _click(page: Page, bid: int, button: str, clicks: int, direct: bool) -> None:
    # click where the element really receives the click (its center unless something covers it)
    t = await _target(page, bid, point=True, enabled=True, verb="clicked")
    if direct:
        await page.mouse.click(*t["point"], button=button, click_count=clicks)
    else:  # playwright's actionability checks: waits until the element is stable and receives events
        await locator(page, bid).first.click(button=button, click_count=clicks, position=_offset(t))


async def _hover(page: Page, bid: int, direct: bool) -> None:
    t = await _target(page, bid, point=True, verb="hovered")
    if direct:
        await page.mouse.move(*t["point"])
    else:
        await locator(page, bid).first.hover(position=_offset(t))


async def _fill(page: Page, bid: int, value: str) -> None:
    await _target(page, bid, need="text")
    await locator(page, bid).first.fill(value)


async def _select(page: Page, bid: int, options: list[str]) -> list[str]:
    t = await _target(page, bid, need="select")
    loc = locator(page, bid).first
    if all(o in t["labels"] for o in options):
        return await loc.select_option(label=options)
    return await loc.select_option(value=options)


async def _press(page: Page, bid: int, key: str) -> None:
    await _target(page, bid)
    await locator(page, bid).first.press(key)


async def _scroll(page: Page, dx: float, dy: float) -> None:
    await page.mouse.wheel(dx, dy)


async def _drag(page: Page, src: int, dst: int) -> None:
    a = await _target(page, src, point=True, verb="dragged")
    b = await _target(page, dst, scroll=False)  # where it is now that the source is in view
    if a["box"][2] <= 0 or b["box"][2] <= 0:
        raise ToolError("drag_and_drop: an element is not visible")
    await page.mouse.move(*a["point"])
    await page.mouse.down()
    x, y, w, h = b["box"]
    await page.mouse.move(x + w / 2, y + h / 2, steps=8)
    await page.mouse.up()


async def _wait(page: Page, ms: int) -> None:
    await page.wait_for_timeout(ms)


class ElementTools:
    """Mixin: BrowserGym-style tools by element id (put it before the ``BrowserEnv`` base).

    Args:
        screenshot: also attach a PNG to each page observation.
        with_boxes: show each element's box ``(x, y, w, h)`` in the page text.
    """

    #: act with direct input events at hit-tested points (set by the env once its page is settled)
    _direct = False
    call_page: Any  # provided by BrowserEnv

    def __init__(self, *args: Any, screenshot: bool = False, with_boxes: bool = False, **kwargs: Any):
        self.screenshot = screenshot
        self.with_boxes = with_boxes
        super().__init__(*args, **kwargs)

    # ------------------------------------------------------------------ tools
    @tool
    async def click(self, bid: int, button: Literal["left", "middle", "right"] = "left") -> str:
        """Click an element.

        Args:
            bid: the element's id from the page listing
            button: mouse button
        """
        await self.call_page(_click, bid, button, 1, self._direct)
        return f"clicked [{bid}]"

    @tool
    async def dblclick(self, bid: int) -> str:
        """Double-click an element.

        Args:
            bid: the element's id from the page listing
        """
        await self.call_page(_click, bid, "left", 2, self._direct)
        return f"double-clicked [{bid}]"

    @tool
    async def hover(self, bid: int) -> str:
        """Move the mouse over an element.

        Args:
            bid: the element's id from the page listing
        """
        await self.call_page(_hover, bid, self._direct)
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
