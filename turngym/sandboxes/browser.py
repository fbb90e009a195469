"""A pool of headless Chromium browsers driven by playwright; one fresh context per episode.

The pool runs playwright on a private event-loop thread, so one pool serves any number of
callers on any event loop (the rollout engine's loop, or each sync env's own loop).
Callers lease a :class:`PageLease` (a new browser context and page) and run coroutines
against its page with :meth:`PageLease.run`; everything playwright does stays on the
pool's thread.

* bounded: at most ``size * contexts_per_browser`` leases at once (others wait);
* fast to lease: each browser keeps the next lease's context and page open, with a page of the
  caller's choice already loaded (``warm_url``, :attr:`PageLease.preloaded`); contexts close in
  the background;
* crash-aware: a browser that disconnects (killed, crashed) fails its leases with
  :class:`BrowserCrashed` and is relaunched on the next lease;
* always closed: leases close their context on exit (also on exceptions), the pool closes
  its browsers and playwright on :meth:`BrowserPool.close`; at interpreter exit the shared pool
  is closed and any browser a pool launched and did not close is killed; browsers left behind by
  a dead process can be reaped by label (:func:`reap_orphan_browsers`; the label names the owner
  by pid and start time, so a reused pid is not taken for the owner); a browser that was killed
  leaves no temp files (its singleton dir is removed, :func:`singleton_dir`).

One browser's launch, spare page and teardown are :mod:`turngym.sandboxes.browser_slot`'s; the
Chromium binary, flags, labels and reaping are :mod:`turngym.sandboxes.chromium`'s (re-exported here).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from turngym.sandboxes import reaping
from turngym.sandboxes.browser_slot import BrowserSlot, LoopThread, on_loop, open_page
from turngym.sandboxes.chromium import (
    CHROMIUM_ARGS,
    BrowserCrashed,
    BrowserError,
    BrowserUnavailable,
    chromium_available,
    find_chromium,
    labelled_browser_pids,
    reap_orphan_browsers,
    remove_singleton_dir,
    singleton_dir,
    tree_memory_bytes,
)
from turngym.sandboxes.reaping import Owner, process_tree

if TYPE_CHECKING:
    from playwright.async_api import BrowserContext, Page, Playwright

T = TypeVar("T")

#: JavaScript errors kept per page (a page that throws in a loop must not grow memory).
MAX_PAGE_ERRORS = 200


@dataclass
class PoolStats:
    """Counters of a browser pool's life."""

    launches: int = 0  # browsers started (replacements of crashed ones included)
    crashes: int = 0  # browsers that died under the pool
    leases: int = 0  # pages handed out
    active: int = 0  # pages out now
    launch_s: list[float] = field(default_factory=list)  # seconds each launch took


class BrowserPool:
    """``size`` Chromium processes; each lease gets a fresh context on the least-loaded one.

    Args:
        size: number of browser processes.
        contexts_per_browser: leases one browser serves at once; the pool admits
            ``size * contexts_per_browser`` leases and makes the rest wait.
        executable: Chromium binary (default: :func:`find_chromium`).
        headless: run without a window (default).
        extra_args: more Chromium flags.
        launch_timeout: seconds to wait for a browser to start.
        open_timeout: seconds to wait for a new context and page; a browser that does not answer
            in time (frozen, or killed before playwright noticed) is killed and relaunched.
        prewarm: keep one spare context open per browser, so a lease does not wait for one.
    """

    _ids = itertools.count()

    def __init__(
        self,
        size: int = 1,
        contexts_per_browser: int = 4,
        *,
        executable: str | None = None,
        headless: bool = True,
        extra_args: tuple[str, ...] = (),
        launch_timeout: float = 30.0,
        open_timeout: float = 30.0,
        prewarm: bool = True,
    ):
        if size < 1 or contexts_per_browser < 1:
            raise ValueError("size and contexts_per_browser must be >= 1")
        self.size = size
        self.contexts_per_browser = contexts_per_browser
        self.executable = executable
        self.headless = headless
        self.extra_args = tuple(extra_args)
        self.launch_timeout = launch_timeout
        self.open_timeout = open_timeout
        self.prewarm = prewarm
        self.id = f"{Owner.current().token()}:{uuid.uuid4().hex[:8]}"
        self.stats = PoolStats()
        self._slots = [BrowserSlot(i) for i in range(size)]
        self._lt: LoopThread | None = None
        self._pw: Playwright | None = None
        self._sem: asyncio.Semaphore | None = None
        self._launch_lock: asyncio.Lock | None = None
        self._starting: asyncio.Future[None] | None = None
        self._leases: set[PageLease] = set()
        self._closing: set[asyncio.Future[None]] = set()
        self._closed = False
        self._start_lock = threading.Lock()

    # ---- lifecycle ------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self.size * self.contexts_per_browser

    @property
    def closed(self) -> bool:
        return self._closed

    def _thread(self) -> LoopThread:
        if self._closed:
            raise BrowserError("the browser pool is closed")
        with self._start_lock:
            if self._lt is None:
                self._lt = LoopThread(f"turngym-browser-pool-{next(self._ids)}")
            return self._lt

    async def _ensure_started(self) -> None:
        # runs on the pool's loop only, so check-and-set of the start task is atomic
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start_playwright())
        await asyncio.shield(self._starting)

    async def _start_playwright(self) -> None:
        from playwright.async_api import async_playwright

        self._sem = asyncio.Semaphore(self.capacity)
        self._launch_lock = asyncio.Lock()
        self._pw = await async_playwright().start()

    async def _launch(self, slot: BrowserSlot) -> None:
        assert self._pw is not None

        def crashed() -> None:
            self.stats.crashes += 1

        took = await slot.launch(
            self._pw,
            f"{self.id}:{slot.index}:{self.stats.launches}",
            executable=self.executable,
            headless=self.headless,
            extra_args=self.extra_args,
            timeout=self.launch_timeout,
            on_crash=crashed,
        )
        self.stats.launch_s.append(took)
        self.stats.launches += 1

    async def _pick_slot(self) -> BrowserSlot:
        assert self._launch_lock is not None
        async with self._launch_lock:
            for slot in self._slots:  # relaunch dead browsers lazily; their leases see the crash
                if slot.browser is not None and not slot.live:
                    await slot.discard()
            live = [s for s in self._slots if s.live]
            free = [s for s in live if s.leases < self.contexts_per_browser]
            idle = [s for s in self._slots if s.browser is None]
            # launch another browser before doubling up, while the pool has room for one
            if idle and (not free or min(s.leases for s in free) > 0):
                await self._launch(idle[0])
                return idle[0]
            if free:
                best = min(free, key=lambda s: s.leases)
                best.note_tempdir()  # in case it was not there yet right after the launch
                return best
            raise BrowserError("no browser available (all crashed and still in use)")

    async def _lease(
        self,
        viewport: tuple[int, int],
        device_scale_factor: float,
        timeout_s: float,
        warm_url: str | None,
        warm_timeout_s: float,
        defer_spare: bool,
    ) -> PageLease:
        await self._ensure_started()
        assert self._sem is not None
        await self._sem.acquire()
        slot: BrowserSlot | None = None
        key = (viewport, device_scale_factor)
        try:
            for attempt in (0, 1):  # a browser found dead here (killed a moment ago) is relaunched once
                slot = await self._pick_slot()
                slot.leases += 1
                assert slot.browser is not None
                try:
                    context, page, loaded = await slot.take_spare(key) or await open_page(
                        slot.browser, viewport, device_scale_factor, None, 0, self.open_timeout
                    )
                    break
                except Exception as e:
                    # dead (not yet reported by playwright) or not answering: _pick_slot relaunches it
                    if attempt == 1 or not (slot.gone() or isinstance(e, TimeoutError)):
                        raise
                    slot.leases -= 1
                    slot.crashed = True
            context.set_default_timeout(timeout_s * 1000)
        except BaseException as e:
            if slot is not None:
                slot.leases -= 1
            self._sem.release()
            if isinstance(e, BrowserError) or not isinstance(e, Exception):
                raise
            if slot is not None and not slot.live:
                raise BrowserCrashed(f"the browser died while opening a page: {e}") from e
            raise BrowserError(f"could not open a browser page: {e}") from e
        lease = PageLease(self, slot, context, page, preloaded=loaded)
        if self.prewarm:  # the next lease's page opens (and loads warm_url) while this one runs
            lease._spare_request = (key, warm_url, warm_timeout_s)
            if not defer_spare:
                self._start_spare(lease)
        self._leases.add(lease)
        self.stats.leases += 1
        self.stats.active += 1
        return lease

    def _start_spare(self, lease: PageLease) -> None:
        """Open the next lease's page for ``lease``'s browser (once; only if it has none coming)."""
        request, lease._spare_request = lease._spare_request, None
        slot = lease.slot
        if request is None or self._closed or slot.spare is not None or not slot.live:
            return
        (viewport, dsf), warm_url, warm_timeout_s = request
        assert slot.browser is not None
        spare = asyncio.ensure_future(
            open_page(slot.browser, viewport, dsf, warm_url, warm_timeout_s, self.open_timeout)
        )
        spare.add_done_callback(
            lambda f: f.cancelled() or f.exception()
        )  # a dead browser's spare: no warning
        slot.spare, slot.spare_key = spare, (viewport, dsf)

    async def _release(self, lease: PageLease) -> None:
        self._start_spare(lease)  # deferred and never asked for: now, while the caller is between leases
        if lease in self._leases:
            self._leases.discard(lease)
            lease.slot.leases -= 1
            self.stats.active -= 1
            assert self._sem is not None
            self._sem.release()
        # the context closes in the background (the caller's next reset need not wait for it);
        # shutdown waits for every close still running
        closing = asyncio.ensure_future(self._close_context(lease.context))
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)

    @staticmethod
    async def _close_context(context: BrowserContext) -> None:
        try:
            await asyncio.wait_for(context.close(), 10)
        except Exception:  # noqa: BLE001 - a crashed browser's context is gone already
            pass

    async def lease(
        self,
        viewport: tuple[int, int] = (1280, 720),
        *,
        device_scale_factor: float = 1.0,
        timeout_s: float = 5.0,
        warm_url: str | None = None,
        warm_timeout_s: float = 10.0,
        defer_spare: bool = False,
    ) -> PageLease:
        """A fresh context and page (waits while the pool is full). Close it with ``await lease.close()``.

        ``timeout_s`` is the default timeout of every playwright operation on the page.

        With ``prewarm``, the pool opens the *next* lease's context and page in the background as soon
        as this one is handed out, and that page loads ``warm_url`` (the page the caller expects to open
        next, or any page of the same site, so the renderer process runs and the site's scripts are
        compiled; a load that takes over ``warm_timeout_s`` is given up). The next lease with the same
        viewport and scale gets it (waiting for it if it is still loading); its
        :attr:`PageLease.preloaded` says which URL the untouched page shows (None: a blank page).
        With ``defer_spare``, that background work waits for :meth:`PageLease.prepare_next` (or the
        lease's close), so it does not compete with the work of starting this lease's page.
        """
        lt = self._thread()
        return await on_loop(
            lt, self._lease(viewport, device_scale_factor, timeout_s, warm_url, warm_timeout_s, defer_spare)
        )

    async def aclose(self) -> None:
        """Close every lease, browser and the playwright driver (idempotent)."""
        if self._closed:
            return
        reaping.disown(self)
        lt = self._lt
        if lt is not None:
            try:
                await on_loop(lt, self._shutdown())
            finally:
                self._closed = True
                lt.stop()
        self._closed = True

    def close(self) -> None:
        """Synchronous :meth:`aclose` (safe from any thread that is not the pool's)."""
        if self._closed:
            return
        reaping.disown(self)
        lt = self._lt
        self._closed = True
        if lt is None:
            return
        try:
            lt.submit(self._shutdown()).result(timeout=60)
        except Exception:  # noqa: BLE001 - kill what is left below
            for slot in self._slots:
                slot.kill()
                slot.remove_tempdir()
        finally:
            lt.stop()

    async def _shutdown(self) -> None:
        for lease in self._leases:
            lease._spare_request = None  # no next page now
        for lease in list(self._leases):
            await self._release(lease)
            lease.closed = True
        await asyncio.gather(*self._closing, return_exceptions=True)
        for slot in self._slots:
            await slot.discard()
        if self._pw is not None:
            try:
                await asyncio.wait_for(self._pw.stop(), 10)
            except Exception:  # noqa: BLE001 - the driver may be gone
                pass
            self._pw = None

    # ---- introspection (tests, benchmarks) ------------------------------------------------
    def browser_pids(self) -> list[int]:
        """Main process ids of this pool's live browsers."""
        return [pid for s in self._slots if s.browser is not None for pid in labelled_browser_pids(s.label)]

    def memory_bytes(self) -> int:
        """PSS of all of this pool's browser process trees."""
        return sum(tree_memory_bytes(pid) for pid in self.browser_pids())

    async def __aenter__(self) -> BrowserPool:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    # ---- the process-wide shared pool -----------------------------------------------------
    _shared: BrowserPool | None = None
    _shared_lock = threading.Lock()

    @classmethod
    def shared(cls) -> BrowserPool:
        """The process-wide pool envs use by default (size and contexts from
        ``$TURNGYM_BROWSERS`` and ``$TURNGYM_CONTEXTS_PER_BROWSER``; closed at exit)."""
        with cls._shared_lock:
            if cls._shared is None or cls._shared.closed:
                cls._shared = cls(
                    size=int(os.environ.get("TURNGYM_BROWSERS", "1")),
                    contexts_per_browser=int(os.environ.get("TURNGYM_CONTEXTS_PER_BROWSER", "8")),
                )
                reaping.own(cls._shared)  # closed at interpreter exit
            return cls._shared


class PageLease:
    """One episode's browser context and page. All page work goes through :meth:`run`."""

    def __init__(
        self,
        pool: BrowserPool,
        slot: BrowserSlot,
        context: BrowserContext,
        page: Page,
        preloaded: str | None = None,
    ):
        self.pool = pool
        #: the URL this (never used) page had loaded when the lease began, or None for a blank page
        self.preloaded = preloaded
        self.slot = slot
        self.browser = slot.browser
        self.context = context
        self.page = page
        self.closed = False
        self._spare_request: tuple[Any, str | None, float] | None = None
        self.page_crashed = False
        self.page_errors: list[str] = []
        page.on("crash", lambda _: setattr(self, "page_crashed", True))
        page.on("pageerror", self._on_page_error)

    def _on_page_error(self, err: Any) -> None:
        if len(self.page_errors) < MAX_PAGE_ERRORS:
            self.page_errors.append(str(err)[:500])

    @property
    def crashed(self) -> bool:
        """The browser or this page's renderer died."""
        b = self.browser
        return self.page_crashed or b is None or b is not self.slot.browser or not self.slot.live

    async def run(
        self, fn: Callable[..., Awaitable[T]], *args: Any, timeout: float | None = None, **kwargs: Any
    ) -> T:
        """Run ``await fn(page, *args, **kwargs)`` on the pool's thread.

        Raises :class:`BrowserCrashed` when the browser or page died, ``TimeoutError`` when
        ``timeout`` (seconds) passed, and playwright's own errors otherwise.
        """
        if self.closed:
            raise BrowserError("the page lease is closed")
        if self.crashed:
            raise BrowserCrashed("the browser crashed")
        lt = self.pool._thread()
        return await on_loop(lt, self._guarded(fn, args, kwargs, timeout))

    async def _guarded(
        self,
        fn: Callable[..., Awaitable[T]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        timeout: float | None,
    ) -> T:
        from playwright.async_api import Error as PlaywrightError
        from playwright.async_api import TimeoutError as PlaywrightTimeout

        try:
            if timeout is None:
                return await fn(self.page, *args, **kwargs)
            return await asyncio.wait_for(fn(self.page, *args, **kwargs), timeout)
        except PlaywrightTimeout as e:
            if self.crashed:
                raise BrowserCrashed("the browser crashed") from e
            raise TimeoutError(str(e).splitlines()[0]) from e
        except PlaywrightError as e:
            if self.crashed or "has been closed" in str(e) or "Target crashed" in str(e):
                raise BrowserCrashed(f"the browser crashed: {str(e).splitlines()[0]}") from e
            raise

    def prepare_next(self) -> None:
        """Let the pool open the next lease's page now (see ``defer_spare``); returns at once."""
        if self._spare_request is not None and not self.pool.closed:
            lt = self.pool._thread()
            if lt.in_thread():
                self.pool._start_spare(self)
            else:
                lt.loop.call_soon_threadsafe(self.pool._start_spare, self)

    async def close(self) -> None:
        """Close the context (idempotent; safe after a crash)."""
        if self.closed:
            return
        self.closed = True
        if self.pool.closed:
            return
        await on_loop(self.pool._thread(), self.pool._release(self))

    async def __aenter__(self) -> PageLease:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


__all__ = [
    "CHROMIUM_ARGS",
    "BrowserCrashed",
    "BrowserError",
    "BrowserPool",
    "BrowserUnavailable",
    "PageLease",
    "chromium_available",
    "find_chromium",
    "labelled_browser_pids",
    "process_tree",
    "reap_orphan_browsers",
    "remove_singleton_dir",
    "singleton_dir",
    "tree_memory_bytes",
]
