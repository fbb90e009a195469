"""Resource hygiene of the reliability suite (part 5 of issue 10).

A package-scoped autouse fixture gives the suite its own temp directory (``$TMPDIR`` and
``tempfile.tempdir``) and, after the suite's last test, closes the process-wide pools the way the
interpreter's ``atexit`` hooks would (they are recreated on demand) and then asserts that nothing this
suite started is left — resources that existed before the suite (e.g. another suite's session-scoped
vLLM server in a whole-tree run) are a baseline, not leftovers:

* no Docker container labelled as owned by this process (``turngym.owner.pid``);
* no child process (Chromium, vLLM or site servers, exec helpers, trainer children);
* no listening TCP socket owned by this process;
* nothing left in the suite's temp directory except pytest's folders and torch's compile cache.

Only this suite's resources are checked: other engineers share the machine and its Docker daemon.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

import pytest

#: Temp entries that are not leaks: pytest's own folders and torch's compile cache (kept on purpose).
KEPT_TEMP = ("pytest-of-", "torchinductor_")
#: What the end-of-session check found (empty when clean).
LEFT: dict[str, list] = {}
#: Seconds the end-of-session check waits for asynchronous teardown (containers removed in the background).
GRACE_S = 90.0


def _children(pid: int) -> list[int]:
    from turngym.sandboxes.browser import process_tree

    return [p for p in process_tree(pid) if p != pid and _is_running(p)]


def _is_running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _cmdline(pid: int) -> str:
    """The first words of a process's command line; "" once it is gone."""
    try:
        return b" ".join(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:3]).decode(errors="replace")
    except OSError:
        return ""


def _listening_inodes(pid: int) -> set[str]:
    """Socket inodes held by ``pid`` that are in LISTEN state (from /proc/net/tcp{,6})."""
    listening: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                if len(cols) > 9 and cols[3] == "0A":  # 0A = TCP_LISTEN
                    listening.add(cols[9])
    held: set[str] = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    held.add(target[8:-1])
    return held & listening


def _own_containers() -> list[str]:
    from turngym.sandboxes.docker import LABEL_HOST, LABEL_PID, docker_client

    try:
        client = docker_client()
    except Exception:  # noqa: BLE001 - no daemon: nothing can be left there
        return []
    flt = {"label": [f"{LABEL_PID}={os.getpid()}", f"{LABEL_HOST}={socket.gethostname()}"]}
    return [c.name for c in client.containers.list(all=True, filters=flt, ignore_removed=True)]


def _close_process_pools() -> None:
    """What the library's atexit hooks do, done now so the check below can see the result."""
    import sys

    if "turngym.sandboxes.pool" in sys.modules:
        from turngym.sandboxes.pool import _close_shared_pools

        _close_shared_pools()
    if (
        "turngym.envs.browser.sites.server" in sys.modules
    ):  # the web families' site servers (shop, forum, ...)
        from turngym.envs.browser.sites.server import _stop_all

        _stop_all()
    if "turngym.sandboxes.reaping" in sys.modules:  # the shared browser pool, open sandboxes, owned processes
        from turngym.sandboxes.reaping import cleanup

        cleanup()


def leftovers(tmp_root: Path, baseline: dict[str, list] | None = None) -> dict[str, list]:
    """What exists now and did not in ``baseline`` (a snapshot taken before the suite)."""
    me = os.getpid()
    now = {
        "containers": _own_containers(),
        "child processes": [(p, _cmdline(p)) for p in _children(me) if _cmdline(p)],
        "listening sockets": sorted(_listening_inodes(me)),
        "temp entries": sorted(p.name for p in tmp_root.iterdir() if not p.name.startswith(KEPT_TEMP)),
    }
    if baseline is None:
        return now
    return {k: [x for x in v if x not in baseline.get(k, [])] for k, v in now.items()}


@pytest.fixture(scope="package", autouse=True)
def resource_hygiene(tmp_path_factory: pytest.TempPathFactory):
    tmp_path_factory.getbasetemp()  # pytest's own folder is created before we move tempfile's default
    tmp_root = Path(tempfile.mkdtemp(prefix="turngym-reliability-"))
    baseline = leftovers(tmp_root)
    saved = (tempfile.tempdir, os.environ.get("TMPDIR"))
    tempfile.tempdir = str(tmp_root)
    os.environ["TMPDIR"] = str(tmp_root)
    try:
        yield tmp_root
        _close_process_pools()
        deadline = time.monotonic() + GRACE_S
        left = leftovers(tmp_root, baseline)
        while any(left.values()) and time.monotonic() < deadline:
            time.sleep(2)
            left = leftovers(tmp_root, baseline)
        if any(left.values()):
            LEFT.update(left)  # also failed in pytest_sessionfinish: an xfail test's teardown would hide it
        assert not any(left.values()), f"the reliability suite left resources behind: {left}"
    finally:
        tempfile.tempdir = saved[0]
        if saved[1] is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved[1]
        shutil.rmtree(tmp_root, ignore_errors=True)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """Inputs tried per family and category (the numbers behind docs/reliability.md)."""
    import sys

    hostile = sys.modules.get("tests.reliability.hostile") or sys.modules.get("reliability.hostile")
    tally = getattr(hostile, "TALLY", None)
    if not tally:
        return
    ran = hostile.RAN
    terminalreporter.section("reliability: hostile inputs tried (and how many a tool ran on)")
    for (family, category), n in sorted(tally.items()):
        terminalreporter.write_line(f"{family:28s} {category:28s} {n:6d} {ran[(family, category)]:6d}")
    terminalreporter.write_line(f"{'total':57s} {sum(tally.values()):6d} {sum(ran.values()):6d}")
    t = hostile.TOTALS
    terminalreporter.write_line(
        f"hostile-input totals: {t['actions']} actions ({t['generated']} generated) over "
        f"{len({family for family, _ in tally})} env configurations; raised {t['raised']}, hung {t['hung']}, "
        f"paid {t['paid']}, leaked {t['leaked']}"
    )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if LEFT:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        print(f"\nRESOURCE HYGIENE FAILED: the reliability suite left resources behind: {LEFT}")
