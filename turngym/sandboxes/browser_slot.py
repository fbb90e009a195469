"""One browser of the pool (:class:`BrowserSlot`: launch, the next lease's spare page, discard, its
temp dir) and the private event-loop thread that all of the pool's playwright work runs on.

Everything here runs on the pool's loop thread except :class:`LoopThread`'s own methods.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from turngym.sandboxes import reaping
from turngym.sandboxes.chromium import (
    CHROMIUM_ARGS,
    LABEL_FLAG,
    BrowserUnavailable,
    find_chromium,
    labelled_browser_pids,
    remove_singleton_dir,
    singleton_dir,
)
from turngym.sandboxes.reaping import kill_tree, pid_running

if TYPE_CHECKING:
    from playwright.async_api import Browser, BrowserContext, Page, Playwright

T = TypeVar("T")


class LoopThread:
    """An event loop running forever on a daemon thread."""

    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Awaitable[T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]

    def in_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()


async def on_loop(lt: LoopThread, coro: Awaitable[T]) -> T:
    """Await ``coro`` on the pool's loop from any other loop (cancellation propagates)."""
    if lt.in_thread():
        return await coro
    return await asyncio.wrap_future(lt.submit(coro))


PageTriple = tuple["BrowserContext", "Page", "str | None"]


async def open_page(
    browser: Browser,
    viewport: tuple[int, int],
    dsf: float,
    warm_url: str | None,
    warm_timeout_s: float,
    bound: float,
) -> PageTriple:
    """A new context and page; with ``warm_url``, the page has loaded it (returned when it did).
    Every step is bounded (``bound`` seconds): a browser that stops answering raises TimeoutError."""
    w, h = viewport
    context = await asyncio.wait_for(
        browser.new_context(
            viewport={"width": w, "height": h}, device_scale_factor=dsf, reduced_motion="reduce"
        ),
        bound,
    )
    try:
        page = await asyncio.wait_for(context.new_page(), bound)
        loaded = None
        if warm_url:
            try:
                await page.goto(warm_url, timeout=warm_timeout_s * 1000)
                # the page's script context is ready for the first call
                await asyncio.wait_for(page.evaluate("0"), bound)
                loaded = warm_url
            except Exception:  # noqa: BLE001 - a warm-up that fails only costs the saving
                await page.goto("about:blank", timeout=10_000)
        return context, page, loaded
    except BaseException:  # failed or cancelled (a dropped spare): never leave the context open
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(context.close()), 10)
        raise


async def drop_spare(spare: asyncio.Future[Any] | None) -> None:
    """Cancel a spare page that is no longer wanted and close its context."""
    if spare is None:
        return
    spare.cancel()
    try:
        context, _, _ = await spare
        await asyncio.wait_for(context.close(), 10)
    except BaseException:  # noqa: BLE001 - cancelled (it closed its own context), failed or gone
        pass


@dataclass
class BrowserSlot:
    """One browser process and its bookkeeping (touched only on the pool thread)."""

    index: int
    browser: Browser | None = None
    label: str = ""
    leases: int = 0
    crashed: bool = False
    closing: bool = False
    launched_at: float = 0.0
    spare: asyncio.Future[Any] | None = None
    spare_key: Any = None
    pid: int | None = None
    #: the browser's singleton temp dir (see :func:`singleton_dir`), removed once the browser is gone
    tempdir: Path | None = None

    @property
    def live(self) -> bool:
        return self.browser is not None and not self.crashed and self.browser.is_connected()

    def gone(self) -> bool:
        """The browser died (whether or not playwright has noticed yet)."""
        return not self.live or (self.pid is not None and not pid_running(self.pid))

    async def launch(
        self,
        pw: Playwright,
        label: str,
        *,
        executable: str | None,
        headless: bool,
        extra_args: tuple[str, ...],
        timeout: float,
        on_crash: Callable[[], None],
    ) -> float:
        """Start this slot's browser, labelled ``label``; returns the seconds the launch took.
        ``on_crash`` is called when the browser disconnects without being closed by the pool."""
        exe = find_chromium(executable)
        self.label = label
        args = [a for a in CHROMIUM_ARGS if headless or a != "--headless"]
        args += [*extra_args, f"{LABEL_FLAG}={label}"]
        t0 = time.perf_counter()
        try:
            browser = await pw.chromium.launch(
                executable_path=exe,
                headless=headless,
                args=args,
                timeout=timeout * 1000,
                handle_sigint=False,
                handle_sigterm=False,
                handle_sighup=False,
            )
        except Exception as e:  # noqa: BLE001 - surfaced as a clear error
            raise BrowserUnavailable(f"could not launch Chromium ({exe}): {e}") from e
        took = time.perf_counter() - t0
        self.browser, self.crashed, self.closing, self.launched_at = browser, False, False, time.time()
        self.note_tempdir()

        def on_disconnect(_: Any, b: Any = browser) -> None:
            if self.browser is b and not self.closing:
                self.crashed = True
                on_crash()

        browser.on("disconnected", on_disconnect)
        return took

    def note_tempdir(self) -> None:
        """Remember the live browser's singleton dir (read from its user-data dir while it exists)."""
        if self.pid is None:
            self.pid = next(iter(labelled_browser_pids(self.label)), None)
            if self.pid is not None:
                reaping.own_process(self.pid)  # killed at exit if the pool never closes it
        if self.tempdir is None and self.pid is not None:
            self.tempdir = singleton_dir(self.pid)

    async def take_spare(self, key: Any) -> PageTriple | None:
        """The spare page opened for the next lease, if it was opened with the same ``key``."""
        spare, self.spare = self.spare, None
        if spare is None:
            return None
        if self.spare_key != key:
            await drop_spare(spare)
            return None
        try:
            return await spare
        except Exception:  # noqa: BLE001 - a failed spare just means opening a page now
            return None

    async def discard(self) -> None:
        """Close (or kill) the browser and remove what it leaves behind; the slot is free for a launch."""
        spare, self.spare = self.spare, None
        await drop_spare(spare)
        browser, self.browser = self.browser, None
        self.closing = True
        if browser is not None:
            try:
                await asyncio.wait_for(browser.close(), 10)
            except Exception:  # noqa: BLE001 - it may already be dead
                pass
            self.kill()
        self.remove_tempdir()

    def kill(self) -> None:
        """Kill this slot's browser process trees (found by label)."""
        for pid in labelled_browser_pids(self.label):
            kill_tree(pid)

    def remove_tempdir(self) -> None:
        """After the browser is gone: its singleton dir (a clean exit removed it, a killed browser did not)."""
        tempdir, self.tempdir, pid, self.pid = self.tempdir, None, self.pid, None
        if pid is not None:
            reaping.disown(pid)
        if tempdir is not None:
            remove_singleton_dir(tempdir)
