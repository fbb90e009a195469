"""``SiteBrowserEnv``: multi-page local sites through the element-id tools, plus navigation and tabs.

A :class:`~turngym.envs.browser.env.BrowserEnv` with :class:`~turngym.envs.browser.element_tools.ElementTools`
(the pruned DOM with stable element ids, and BrowserGym's tools by element id: ``click``, ``fill``,
``select_option``, ``press``, ``scroll``, ...), plus WebArena's navigation and tab tools: ``goto``,
``go_back``, ``go_forward``, ``new_tab``, ``tab_focus``, ``tab_close``.

Sites run on loopback ports that change from run to run, so the agent sees (and may type) each
site under a stable virtual origin such as ``http://shop.local``; :meth:`SiteBrowserEnv.display_url`
and :meth:`SiteBrowserEnv.real_url` translate. Observations therefore do not depend on the port,
and identical pages give identical ``state_key`` values across env instances.

A subclass implements ``_start_episode(rng, options) -> Episode`` (the task, the start URL and the
sites it may visit), and optionally ``_episode_notes()`` (check the site after each turn; may end
the episode) and ``_turn_reward``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin

import numpy as np

from turngym.core.env import Task
from turngym.core.types import Message, ToolResult
from turngym.envs.browser import page as bp
from turngym.envs.browser.element_tools import ElementTools
from turngym.envs.browser.env import BrowserEnv, short_error
from turngym.sandboxes.browser import BrowserCrashed, BrowserError
from turngym.tools import ToolError, tool

if TYPE_CHECKING:
    from playwright.async_api import Page

#: longest URL and title shown in an observation (a 500k-character URL made a 516k-character observation)
MAX_URL_CHARS = 500
MAX_TITLE_CHARS = 200


def clip(text: str, limit: int) -> str:
    """``text`` on one line of at most about ``limit`` characters, saying how much was left out."""
    return text if len(text) <= limit else f"{text[:limit]}... [{len(text) - limit} more characters]"


@dataclass
class Episode:
    """What a subclass's ``_start_episode`` returns."""

    instruction: str
    start_url: str  # a display URL (virtual origin)
    task_id: str
    hosts: dict[str, str]  # virtual origin ("http://shop.local") -> real origin ("http://127.0.0.1:PORT")
    reference: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    cookies: list[dict[str, Any]] = field(default_factory=list)  # set in the context before the first load


@dataclass
class PageView:
    url: str
    title: str
    snapshot: Any
    tabs: list[tuple[str, str]]


async def _goto(page: Page, url: str, timeout_s: float) -> None:
    await page.goto(url, wait_until="domcontentloaded", timeout=timeout_s * 1000)


async def _history(page: Page, forward: bool, timeout_s: float) -> bool:
    fn = page.go_forward if forward else page.go_back
    return (await fn(wait_until="domcontentloaded", timeout=timeout_s * 1000)) is not None


async def _new_page(page: Page) -> Page:
    return await page.context.new_page()


async def _close_page(page: Page) -> None:
    await page.close()


async def _front(page: Page) -> None:
    await page.bring_to_front()


async def _add_cookies(page: Page, cookies: list[dict[str, Any]]) -> None:
    await page.context.add_cookies(cookies)


async def _watch_pages(page: Page, on_page: Any) -> None:
    page.context.on("page", on_page)


async def _read(page: Page, pages: list[Page], timeout_s: float) -> PageView:
    from playwright.async_api import Error as PlaywrightError

    snap = None
    for _ in range(4):  # a click may have started a navigation: wait for it, then read
        with contextlib.suppress(PlaywrightError):
            await page.wait_for_load_state("domcontentloaded", timeout=timeout_s * 1000)
        try:
            snap = await bp.snapshot(page, max_text=300)
            break
        except PlaywrightError as e:
            if "destroyed" not in str(e) and "navigat" not in str(e):
                raise
    if snap is None:
        raise BrowserError("the page kept navigating; could not read it")
    tabs = []
    for p in pages:
        title = ""
        with contextlib.suppress(PlaywrightError):
            title = await p.title()
        tabs.append((p.url, title))
    return PageView(page.url, await page.title(), snap, tabs)


class SiteBrowserEnv(ElementTools, BrowserEnv):
    """Base of the multi-page site envs (not registered itself).

    Args:
        viewport: browser viewport in CSS px (default 1280x720).
        max_tabs: most tabs open at once.
        max_page_chars: longest page text in an observation (the rest is cut with a marker).
        screenshot: attach a PNG of the viewport to each observation.
        with_boxes: show element boxes in the page text.
        action_timeout_s, load_timeout_s, pool, max_turns, parser, ...: as for every ``BrowserEnv``.
    """

    default_max_turns = 20
    #: the step-info key of :meth:`_verdict`
    verdict_key = "verdict"
    _fork_fresh: dict[str, Any] = {**BrowserEnv._fork_fresh, "tabs": []}
    system_intro = (
        "You control a web browser to complete a task on a website. Each observation shows the open tabs, "
        'the URL and the page\'s elements, one per line as `[id] role "name" properties`; act on them by id '
        "with the tools, or navigate with goto, go_back, go_forward and the tab tools."
    )

    def __init__(
        self,
        *,
        viewport: tuple[int, int] = (1280, 720),
        max_tabs: int = 4,
        max_page_chars: int = 12_000,
        action_timeout_s: float = 5.0,
        load_timeout_s: float = 15.0,
        **kwargs: Any,
    ):
        if max_tabs < 1:
            raise ValueError("max_tabs must be >= 1")
        self.max_tabs = max_tabs
        self.max_page_chars = max_page_chars
        super().__init__(
            viewport=viewport, action_timeout_s=action_timeout_s, load_timeout_s=load_timeout_s, **kwargs
        )
        self.tabs: list[Any] = []
        self.active = 0
        self.hosts: dict[str, str] = {}
        self.episode: Episode | None = None
        self.view: PageView | None = None

    # ------------------------------------------------------------------ subclass hooks
    async def _start_episode(self, rng: np.random.Generator, options: dict[str, Any]) -> Episode:
        raise NotImplementedError

    # ------------------------------------------------------------------ URLs
    def display_url(self, url: str) -> str:
        for virtual, real in self.hosts.items():
            if url == real or url.startswith((real + "/", real + "?")):  # not another port with this prefix
                return virtual + url[len(real) :]
        return url

    def real_url(self, url: str) -> str:
        """Resolve a URL the agent typed (virtual or relative) to a real one; ToolError if off-site."""
        url = url.strip()
        if not url:
            raise ToolError("the URL is empty")
        base = self.view.url if self.view else ""
        if "://" not in url and not url.startswith(("about:", "//")):
            if url.startswith("/") or base:
                url = urljoin(self.display_url(base) or next(iter(self.hosts), ""), url)
        for virtual, real in self.hosts.items():
            if url == virtual or url.startswith(virtual + "/") or url.startswith(virtual + "?"):
                return real + url[len(virtual) :]
        if url == "about:blank":
            return url
        sites = ", ".join(self.hosts) or "none"
        raise ToolError(
            f"cannot open {clip(url, MAX_URL_CHARS)!r}: only this task's sites can be visited ({sites})"
        )

    # ------------------------------------------------------------------ browser plumbing
    @property
    def page(self) -> Any:
        return self.tabs[self.active] if self.tabs else None

    def _focus(self, index: int) -> None:
        self.active = index
        if self.lease is not None:
            self.lease.page = self.tabs[index]  # the lease runs every tool against the active tab

    def _on_new_page(self, page: Any) -> None:
        """A page the site opened itself (``target=_blank``, ctrl+click): a new tab, listed, not focused."""
        if page not in self.tabs and len(self.tabs) < self.max_tabs:
            self.tabs.append(page)
            page.on(
                "pageerror", lambda err: self.lease.page_errors.append(str(err)[:500]) if self.lease else None
            )

    async def _release(self) -> None:
        self.tabs, self.active = [], 0
        await super()._release()

    async def _open(self, ep: Episode) -> None:
        url = self.real_url(ep.start_url)
        for attempt in (0, 1):  # one retry: a browser that crashed between episodes is relaunched
            await self._release()
            self.lease = await self.pool.lease(
                self.viewport, device_scale_factor=self.scale, timeout_s=self.action_timeout_s
            )
            try:
                if ep.cookies:
                    await self.lease.run(_add_cookies, ep.cookies)
                await self.lease.run(_watch_pages, self._on_new_page)
                await self.lease.run(_goto, url, self.load_timeout_s, timeout=self.load_timeout_s + 5)
                self.tabs = [self.lease.page]
                return
            except BrowserCrashed:
                if attempt == 1:
                    await self._release()
                    raise
            except Exception as e:
                await self._release()
                raise BrowserError(f"the site did not load ({ep.start_url}): {short_error(e)}") from e

    # ------------------------------------------------------------------ env hooks
    async def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> Task:
        ep = await self._start_episode(rng, options)
        self.episode, self.hosts, self.view = ep, dict(ep.hosts), None
        await self._open(ep)
        self._begin_episode(ep.instruction)
        first = await self._first_page()
        return Task(
            messages=[self._system_message(), first],
            task_id=ep.task_id,
            reference=ep.reference,
            info={"instruction": ep.instruction, **ep.info},
        )

    async def _page_message(self, initial: bool) -> Message:
        assert self.lease is not None
        self.view = await self.lease.run(
            _read, self.tabs, self.load_timeout_s, timeout=self.load_timeout_s + 5
        )
        self.snap = self.view.snapshot
        lines = [f"Task: {self.instruction}", ""] if initial else []
        if len(self.tabs) > 1:
            tabs = " | ".join(
                f"[{i}]{' (active)' if i == self.active else ''} {clip(title, MAX_TITLE_CHARS)!r} "
                f"{clip(self.display_url(url), MAX_URL_CHARS)}"
                for i, (url, title) in enumerate(self.view.tabs)
            )
            lines.append(f"Tabs: {tabs}")
        lines.append(f"URL: {clip(self.display_url(self.view.url), MAX_URL_CHARS)}")
        lines.append(f"Title: {clip(self.view.title, MAX_TITLE_CHARS)}")
        lines.append("Page:")
        lines.append(self.snap.text(with_boxes=self.with_boxes, max_chars=self.max_page_chars))
        images = [await self.lease.run(bp.screenshot)] if self.screenshot else []
        return Message(role="user", content="\n".join(lines), images=images)

    def _turn_reward(self, results: list[ToolResult], done: bool) -> dict[str, float]:
        return {}

    def _verdict(self) -> dict[str, Any] | None:
        """The site's verdict on the episode (what its reward was computed from), or None before there
        is one; shown in the step info under :attr:`verdict_key`."""
        return None

    def _step_info(self) -> dict[str, Any]:
        info = super()._step_info()
        verdict = self._verdict()
        if verdict is not None:
            info[self.verdict_key] = dict(verdict)
        return info

    # ------------------------------------------------------------------ forking
    async def _fork_sites(self) -> None:
        """On the fork, before its page opens: give it site state of its own (a session, a database) and
        update :attr:`episode` (``hosts``, ``cookies``) to point at it. Default: nothing (stateless sites)."""

    async def _fork_start(self) -> None:
        assert self.episode is not None
        before = dict(self.episode.hosts)
        await self._fork_sites()
        self.hosts = dict(self.episode.hosts)
        for cookie in self.episode.cookies:  # cookies set for the original's sites: for the fork's
            for virtual, real in before.items():
                url = cookie.get("url", "")
                if url == real or url.startswith(real + "/"):
                    cookie["url"] = self.hosts.get(virtual, real) + url[len(real) :]
        await self._open(self.episode)

    def _log_args(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        # URLs are logged under the sites' virtual origins: a fork (of a fork) replays them on its own sites
        return tuple(self.display_url(a) if isinstance(a, str) else a for a in args)

    def _replay_args(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(self._site_url(a) for a in args)

    def _site_url(self, value: Any) -> Any:
        """A logged URL on a virtual origin -> this env's real one (anything else unchanged)."""
        if isinstance(value, str):
            for virtual, real in self.hosts.items():
                if value == virtual or value.startswith((virtual + "/", virtual + "?")):
                    return real + value[len(virtual) :]
        return value

    def _fork_refusal(self) -> str:
        several = len(self.tabs) > 1 or any(
            op.fn is _new_page for turn in self._page_log.turns for op in turn
        )
        if several and self.lease is not None:
            return "the episode opened several tabs; forking replays single-tab episodes only"
        return super()._fork_refusal()

    def _page_info(self) -> dict[str, Any]:
        return {"url": self.display_url(self.view.url) if self.view else ""}

    def _state_key(self) -> str:
        url = self.display_url(self.view.url) if self.view else ""
        return f"{url}:{self.snap.key()}"

    # ------------------------------------------------------------------ navigation and tab tools
    @tool
    async def goto(self, url: str) -> str:
        """Open a URL in the current tab (a full URL of the task's sites, or a path like "/search?q=x").

        Args:
            url: the address to open
        """
        await self.call_page(_goto, self.real_url(url), self.load_timeout_s)
        return f"opened {clip(self.display_url(self.real_url(url)), MAX_URL_CHARS)}"

    @tool
    async def go_back(self) -> str:
        """Go back to the previous page of the current tab."""
        if not await self.call_page(_history, False, self.load_timeout_s):
            raise ToolError("there is no previous page in this tab")
        return "went back"

    @tool
    async def go_forward(self) -> str:
        """Go forward to the next page of the current tab (after go_back)."""
        if not await self.call_page(_history, True, self.load_timeout_s):
            raise ToolError("there is no next page in this tab")
        return "went forward"

    @tool
    async def new_tab(self, url: str = "") -> str:
        """Open a new tab (optionally at a URL) and switch to it.

        Args:
            url: the address to open in the new tab; empty for a blank tab
        """
        if len(self.tabs) >= self.max_tabs:
            raise ToolError(f"at most {self.max_tabs} tabs can be open; close one with tab_close")
        real = self.real_url(url) if url else ""
        page = await self.call_page(_new_page)
        self._on_new_page(page)  # (the context's page event may have listed it already)
        self._focus(self.tabs.index(page))
        if real:
            await self.call_page(_goto, real, self.load_timeout_s)
        return f"opened tab {self.active}"

    @tool
    async def tab_focus(self, index: int) -> str:
        """Switch to another open tab.

        Args:
            index: the tab's number in the "Tabs:" line (0-based)
        """
        if not 0 <= index < len(self.tabs):
            raise ToolError(f"no tab {index}; open tabs are 0..{len(self.tabs) - 1}")
        self._focus(index)
        await self.call_page(_front)
        return f"switched to tab {index}"

    @tool
    async def tab_close(self) -> str:
        """Close the current tab and switch to the one before it (the last tab cannot be closed)."""
        if len(self.tabs) <= 1:
            raise ToolError("the last tab cannot be closed")
        closing = self.active
        await self.call_page(_close_page)
        self.tabs.pop(closing)
        self._focus(max(0, closing - 1))
        await self.call_page(_front)
        return f"closed tab {closing}; now on tab {self.active}"
