"""Page functions every browser env shares: the pruned-DOM snapshot, screenshots, elements by id.

All functions take a playwright ``Page`` first: run them with
:meth:`~turngym.sandboxes.browser.PageLease.run` (through :meth:`BrowserEnv.call_page`).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

from turngym.envs.browser.dom import Snapshot

if TYPE_CHECKING:
    from playwright.async_api import Page

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
def snapshot_js() -> str:
    """A function ``(opts) => snapshot`` that numbers the page's elements and returns the pruned DOM."""
    body = (Path(__file__).with_name("snapshot.js")).read_text().strip().rstrip(";")
    return f"(opts) => ({body})(opts, {VISIBLE_POINT_JS.strip()})"


async def snapshot(page: Page, max_text: int = 100) -> Snapshot:
    return Snapshot.from_js(await page.evaluate(snapshot_js(), {"maxText": max_text}))


async def screenshot(page: Page, clip: tuple[float, float, float, float] | None = None) -> bytes:
    """PNG of the viewport (or ``clip`` = x, y, w, h in CSS px); caret hidden, animations frozen."""
    kwargs: dict[str, Any] = {"type": "png", "caret": "hide", "animations": "disabled"}
    if clip is not None:
        x, y, w, h = clip
        kwargs["clip"] = {"x": x, "y": y, "width": w, "height": h}
    return await page.screenshot(**kwargs)


def locator(page: Page, bid: int) -> Any:
    """The element numbered ``bid`` by the latest snapshot."""
    return page.locator(f'[data-tg-id="{int(bid)}"]')
