"""The browser pool on a real Chromium: leases, bounds, crashes, relaunch, cleanup, reaping."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest

from turngym.sandboxes.browser import (
    BrowserCrashed,
    BrowserPool,
    BrowserUnavailable,
    find_chromium,
    labelled_browser_pids,
    reap_orphan_browsers,
    remove_singleton_dir,
    singleton_dir,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]


async def _title(page, html: str) -> str:
    await page.set_content(html)
    return await page.evaluate("document.title")


async def test_lease_runs_on_a_fresh_context_and_pool_closes_everything():
    pool = BrowserPool(size=1, contexts_per_browser=2)
    async with await pool.lease((300, 200)) as a:
        assert await a.run(_title, "<title>one</title>") == "one"
        pids = pool.browser_pids()
        assert len(pids) == 1 and pool.memory_bytes() > 10 * 2**20
        async with await pool.lease((300, 200)) as b:  # same browser, separate context
            assert b.context is not a.context and b.slot is a.slot
            assert await b.run(lambda page: page.evaluate("window.innerWidth")) == 300
    assert pool.stats.active == 0 and pool.stats.launches == 1
    await pool.aclose()
    await pool.aclose()  # idempotent
    time.sleep(0.5)
    assert not any(os.path.exists(f"/proc/{p}") and _is_running(p) for p in pids)
    with pytest.raises(Exception, match="closed"):
        await pool.lease()


def _is_running(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def test_pool_bounds_concurrent_leases_and_releases_on_exception():
    pool = BrowserPool(size=1, contexts_per_browser=2)
    try:
        a = await pool.lease()
        b = await pool.lease()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(pool.lease(), 1.0)  # full: the third waits
        await a.close()
        c = await asyncio.wait_for(pool.lease(), 10)
        with pytest.raises(RuntimeError, match="boom"):
            async with c:
                raise RuntimeError("boom")
        assert c.closed and pool.stats.active == 1
        await b.close()
        assert pool.stats.active == 0
    finally:
        await pool.aclose()


async def test_killed_browser_is_detected_and_relaunched():
    pool = BrowserPool(size=1)
    try:
        lease = await pool.lease()
        assert await lease.run(lambda page: page.evaluate("2 + 2")) == 4
        (pid,) = pool.browser_pids()
        leftover = singleton_dir(pid)  # $TMPDIR/org.chromium.Chromium.*, which a SIGKILL leaves behind
        assert leftover is not None and (leftover / "SingletonSocket").exists()
        os.kill(pid, signal.SIGKILL)
        for _ in range(50):
            if lease.crashed:
                break
            await asyncio.sleep(0.1)
        assert lease.crashed
        with pytest.raises(BrowserCrashed):
            await lease.run(lambda page: page.evaluate("1"))
        await lease.close()  # safe after a crash
        fresh = await pool.lease()
        assert await fresh.run(lambda page: page.evaluate("3 + 3")) == 6
        assert pool.stats.crashes == 1 and pool.stats.launches == 2
        assert pool.browser_pids() and pid not in pool.browser_pids()
        assert not leftover.exists()  # removed with the dead browser; the new one has its own
        (new_pid,) = pool.browser_pids()
        assert singleton_dir(new_pid) not in (None, leftover) and singleton_dir(new_pid).exists()
        await fresh.close()
    finally:
        await pool.aclose()


async def test_timeouts_in_the_page_become_timeout_errors():
    pool = BrowserPool(size=1)
    try:
        async with await pool.lease(timeout_s=0.5) as lease:
            await lease.run(lambda page: page.set_content("<p>x</p>"))
            with pytest.raises(TimeoutError):
                await lease.run(lambda page: page.click("#missing"))
            with pytest.raises(TimeoutError):
                await lease.run(lambda page: page.wait_for_timeout(5000), timeout=0.3)
    finally:
        await pool.aclose()


def test_sync_close_from_outside_any_loop():
    pool = BrowserPool(size=1)

    async def use() -> None:
        lease = await pool.lease()
        await lease.run(lambda page: page.evaluate("1"))  # left open on purpose: close() must reap it

    asyncio.run(use())
    pids = pool.browser_pids()
    pool.close()
    pool.close()
    time.sleep(0.5)
    assert pids and not any(_is_running(p) for p in pids)


def test_missing_binary_is_a_clear_error(monkeypatch):
    with pytest.raises(BrowserUnavailable, match="does not exist"):
        find_chromium("/nonexistent/chromium")
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("TURNGYM_CHROMIUM", raising=False)
    with pytest.raises(BrowserUnavailable, match="apt-get install chromium"):
        find_chromium()


def test_reap_orphans_kills_labelled_processes_of_dead_owners():
    # a stand-in process carrying the label of an owner pid that does not exist
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "--turngym-browser=999999999:deadbeef:0:0"]
    )
    try:
        for _ in range(50):
            if proc.pid in labelled_browser_pids():
                break
            time.sleep(0.05)
        assert proc.pid in labelled_browser_pids()
        assert proc.pid in reap_orphan_browsers()
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        proc.kill()


def test_singleton_dir_removal_touches_only_chromium_entries(tmp_path):
    gone = tmp_path / "org.chromium.Chromium.abc123"
    gone.mkdir()
    for name in ("SingletonSocket", "SingletonCookie"):
        (gone / name).write_text("")
    assert remove_singleton_dir(gone) and not gone.exists()
    assert remove_singleton_dir(gone)  # already gone
    kept = tmp_path / "org.chromium.Chromium.def456"
    kept.mkdir()
    (kept / "SingletonSocket").write_text("")
    (kept / "someone-elses-file").write_text("data")
    assert not remove_singleton_dir(kept)
    assert (kept / "someone-elses-file").read_text() == "data"
    assert singleton_dir(999_999_999) is None  # no such process


async def test_spare_page_preloads_the_next_leases_url(tmp_path):
    page = tmp_path / "warm.html"
    page.write_text("<title>warm</title><p>ready</p>")
    pool = BrowserPool(size=1)
    try:
        first = await pool.lease((300, 200), warm_url=page.as_uri())
        assert first.preloaded is None
        await first.close()
        second = await pool.lease((300, 200))  # the spare was made for this viewport: it has the page
        assert second.preloaded == page.as_uri() and second.context is not first.context
        assert await second.run(lambda p: p.evaluate("document.title")) == "warm"
        other = await pool.lease((400, 300))  # another viewport: a blank page of its own
        assert other.preloaded is None and await other.run(lambda p: p.evaluate("innerWidth")) == 400
        await other.close()
        await second.close()
        missing = await pool.lease((300, 200), warm_url=(tmp_path / "missing.html").as_uri())
        await missing.close()
        after = await pool.lease((300, 200))  # a preload that failed leaves a blank page, not an error page
        assert (
            after.preloaded is None
            and await after.run(lambda p: p.evaluate("location.href")) == "about:blank"
        )
        await after.close()
        # deferred: the next page is opened only once the holder says its own page is up
        held = await pool.lease((300, 200), warm_url=page.as_uri(), defer_spare=True)
        await asyncio.sleep(0.5)
        assert held.slot.spare is None
        held.prepare_next()
        nxt = await pool.lease((300, 200))
        assert nxt.preloaded == page.as_uri()
        await nxt.close()
        await held.close()
    finally:
        await pool.aclose()
