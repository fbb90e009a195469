"""Chromium processes for the browser pool: the binary, the flags and the label every launched browser
carries, its memory, its singleton temp directory, and reaping the browsers of dead owners.

Ownership, the exit cleanup and the process helpers are :mod:`turngym.sandboxes.reaping`'s, shared
with the Docker sandboxes. The browser is the Debian ``chromium`` package (``/usr/bin/chromium``),
never a playwright-downloaded build.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from turngym.sandboxes.reaping import Owner, all_pids, cmdline, kill_tree, parent_pid, process_tree

#: Flags that work for headless Debian Chromium on these machines (no GPU, no sandbox, no network chatter).
CHROMIUM_ARGS: tuple[str, ...] = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--mute-audio",
)
#: Every browser we launch carries this flag (``=<owner pid>@<owner start>:<pool id>:<slot>:<launch>``,
#: the owner as :meth:`Owner.token`), so it can be found and reaped.
LABEL_FLAG = "--turngym-browser"
_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class BrowserError(RuntimeError):
    """A browser-side failure the caller should report (not a bug in the caller)."""


class BrowserCrashed(BrowserError):
    """The browser (or the page's renderer) died while a lease was using it."""


class BrowserUnavailable(BrowserError):
    """No browser could be launched (missing binary, launch failure)."""


def find_chromium(executable: str | None = None) -> str:
    """Path of the Chromium binary: the argument, ``$TURNGYM_CHROMIUM``, or the first one on ``$PATH``."""
    for cand in (executable, os.environ.get("TURNGYM_CHROMIUM")):
        if cand:
            if not Path(cand).is_file():
                raise BrowserUnavailable(f"Chromium binary {cand!r} does not exist")
            return cand
    for name in _CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    raise BrowserUnavailable(
        "no Chromium binary found: install the Debian package (`apt-get install chromium`) "
        "or set TURNGYM_CHROMIUM to a Chromium/Chrome executable"
    )


def chromium_available() -> bool:
    try:
        find_chromium()
        import playwright.async_api  # noqa: F401
    except (BrowserUnavailable, ImportError):
        return False
    return True


def labelled_browser_pids(label: str | None = None) -> dict[int, str]:
    """Main Chromium processes we launched (pid -> label value), optionally only one label."""
    out = {}
    for pid in all_pids():
        for arg in cmdline(pid):
            if arg.startswith(LABEL_FLAG + "="):
                value = arg.split("=", 1)[1]
                if label is None or value == label:
                    out[pid] = value
                break
    # keep the top of each tree: children may inherit the flag on some builds
    return {pid: v for pid, v in out.items() if parent_pid(pid) not in out}


def tree_memory_bytes(pid: int) -> int:
    """Proportional set size (PSS, shared pages split fairly) of a process tree, in bytes."""
    total = 0
    for p in process_tree(pid):
        try:
            text = Path(f"/proc/{p}/smaps_rollup").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("Pss:"):
                total += int(line.split()[1]) * 1024
                break
    return total


def singleton_dir(pid: int) -> Path | None:
    """The temp directory the running Chromium ``pid`` made for its process singleton, or None.

    Chromium creates ``$TMPDIR/org.chromium.Chromium.XXXXXX`` (``SingletonSocket``, ``SingletonCookie``)
    and links to it from its user-data dir; a clean exit removes it, a SIGKILL leaves it behind. The
    link attributes the directory to this browser alone, so it can be removed once the browser is dead.
    """
    for arg in cmdline(pid):
        if arg.startswith("--user-data-dir="):
            try:
                target = Path(os.readlink(Path(arg.split("=", 1)[1]) / "SingletonSocket"))
            except OSError:
                return None
            return target.parent if target.name == "SingletonSocket" and target.is_absolute() else None
    return None


def remove_singleton_dir(path: Path) -> bool:
    """Remove a dead browser's singleton directory: only Chromium's ``Singleton*`` entries, then the
    directory (anything else in it is left alone). True if it is gone."""
    try:
        for entry in path.iterdir():
            if entry.name.startswith("Singleton") and not entry.is_dir():
                entry.unlink(missing_ok=True)
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def reap_orphan_browsers() -> list[int]:
    """Kill labelled browsers whose owning Python process is gone (and remove their singleton temp
    directories); returns the killed pids."""
    killed = []
    for pid, value in labelled_browser_pids().items():
        owner = Owner.from_token(value.split(":", 1)[0])
        if owner.pid > 0 and not owner.alive():
            leftover = singleton_dir(pid)
            kill_tree(pid)
            if leftover is not None:
                remove_singleton_dir(leftover)
            killed.append(pid)
    return killed
