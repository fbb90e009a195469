"""Process ownership and reaping, shared by Docker sandboxes and browser pools.

Three parts, each written once here:

* **Who owns it.** :class:`Owner` names a process by host, pid and start time (``/proc/PID/stat``
  field 22), so a reused pid is not mistaken for the owner. Docker containers carry it as labels
  (``turngym.owner.*``), browsers as a token in their command line (``pid@start``);
  :meth:`Owner.alive` says whether the owner still runs, and resources of a dead owner are orphans
  (``reap_orphans`` for containers, ``reap_orphan_browsers`` for browsers).
* **What this process must clean up.** :func:`own` registers an object to close (a sandbox, the
  shared browser pool) and :func:`own_process` a child process (a pid or ``Popen``) whose tree is
  killed; :func:`disown` forgets either. :func:`cleanup` runs at interpreter exit (once
  registered, ``atexit``): it closes owned objects (newest first), then kills the owned processes
  still alive. Registering or disowning twice is harmless, and a failing ``close`` does not stop
  the rest.
* **Process helpers** over ``/proc``: :func:`process_tree`, :func:`kill_tree`, :func:`pid_exists`,
  :func:`pid_running` (not a zombie), :func:`cmdline`, :func:`all_pids`, and :func:`start_once`,
  which runs one background orphan pass per process.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


# ----------------------------------------------------------------------------- /proc helpers
def process_start_time(pid: int) -> str | None:
    """The start time of a process in clock ticks since boot (``/proc/PID/stat`` field 22); None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def cmdline(pid: int) -> list[str]:
    """The command line of ``pid`` (empty if it is gone or unreadable)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def parent_pid(pid: int) -> int:
    """The parent of ``pid``, or -1 if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    return int(stat.rsplit(")", 1)[1].split()[1])


def all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (parents before children)."""
    children: dict[int, list[int]] = {}
    for p in all_pids():
        children.setdefault(parent_pid(p), []).append(p)
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, []))
    return tree


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and its descendants, children first (gone processes are skipped)."""
    for p in reversed(process_tree(pid)):
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def pid_exists(pid: int) -> bool:
    """A process ``pid`` exists (possibly a zombie, possibly another user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pid_running(pid: int) -> bool:
    """``pid`` exists and is not a zombie (a killed child its parent has not reaped yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


# ----------------------------------------------------------------------------- ownership
@dataclass(frozen=True)
class Owner:
    """The process that owns a resource: host, pid and start time ("" when unknown)."""

    host: str
    pid: int
    start: str = ""

    @classmethod
    def current(cls) -> Owner:
        pid = os.getpid()
        return cls(socket.gethostname(), pid, process_start_time(pid) or "")

    def alive(self) -> bool:
        """The owner still runs. Another host's owner counts as alive (it cannot be checked); an
        unknown start time falls back to the pid alone."""
        if self.host != socket.gethostname():
            return True
        if self.pid <= 0:
            return False
        start = process_start_time(self.pid)
        if start is None:
            return False
        return not self.start or start == self.start

    def token(self) -> str:
        """``"pid@start"``: the owner on this host as one string (for a command-line label)."""
        return f"{self.pid}@{self.start}" if self.start else str(self.pid)

    @classmethod
    def from_token(cls, token: str) -> Owner:
        """The owner a :meth:`token` names (``"pid"`` alone is accepted; garbage gives pid -1)."""
        pid, _, start = token.partition("@")
        return cls(socket.gethostname(), int(pid) if pid.isdigit() else -1, start)


@dataclass(frozen=True)
class _Process:
    pid: int
    start: str | None  # None: already gone when registered (never killed)


_LOCK = threading.RLock()
_OBJECTS: dict[int, tuple[Any, Callable[[], Any]]] = {}  # id(obj) -> (obj, close); insertion order
_PROCESSES: dict[int, _Process] = {}
_ATEXIT = False


def _ensure_atexit() -> None:
    global _ATEXIT
    if not _ATEXIT:
        atexit.register(cleanup)
        _ATEXIT = True


def own(obj: Any, close: Callable[[], Any] | None = None) -> Any:
    """Close ``obj`` (``close()``, or ``obj.close()``) at :func:`cleanup` unless disowned first.
    Holds a strong reference. Owning an object again keeps one entry. Returns ``obj``."""
    with _LOCK:
        if id(obj) not in _OBJECTS:
            _OBJECTS[id(obj)] = (obj, close or obj.close)
        _ensure_atexit()
    return obj


def own_process(proc: Any) -> int:
    """Kill the process tree of ``proc`` (a pid or anything with ``.pid``) at :func:`cleanup` unless
    disowned first; a pid since reused by another process is left alone. Returns the pid."""
    pid = int(getattr(proc, "pid", proc))
    with _LOCK:
        _PROCESSES.setdefault(pid, _Process(pid, process_start_time(pid)))
        _ensure_atexit()
    return pid


def disown(obj: Any) -> None:
    """Forget an object given to :func:`own`, or a pid (or ``Popen``) given to :func:`own_process`;
    a no-op for anything not owned."""
    with _LOCK:
        entry = _OBJECTS.get(id(obj))
        if entry is not None and entry[0] is obj:
            del _OBJECTS[id(obj)]
            return
        pid = getattr(obj, "pid", obj)
        if isinstance(pid, int) and not isinstance(pid, bool):
            _PROCESSES.pop(pid, None)


def owned() -> tuple[list[Any], list[int]]:
    """The objects and pids registered now."""
    with _LOCK:
        return [o for o, _ in _OBJECTS.values()], list(_PROCESSES)


def cleanup() -> None:
    """Close every owned object (newest first), then kill every owned process tree still running
    (the same process by start time); each is forgotten once handled. Safe to call repeatedly."""
    with _LOCK:
        objects = list(_OBJECTS.values())[::-1]
        _OBJECTS.clear()
    for _, close in objects:
        try:
            close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: do what we can
            pass
    with _LOCK:
        processes = list(_PROCESSES.values())[::-1]
        _PROCESSES.clear()
    for proc in processes:
        start = process_start_time(proc.pid)
        if start is not None and start == proc.start:  # not a pid reused since
            kill_tree(proc.pid)


_STARTED: set[str] = set()


def start_once(name: str, fn: Callable[[], Any]) -> bool:
    """Run ``fn`` on a daemon thread the first time ``name`` is asked for in this process (an
    orphan-reaping pass); errors are swallowed. True if this call started it."""
    with _LOCK:
        if name in _STARTED:
            return False
        _STARTED.add(name)

    def run() -> None:
        try:
            fn()
        except Exception:  # noqa: BLE001 - best effort; the prune/reap commands report errors
            pass

    threading.Thread(target=run, name=f"turngym-{name}", daemon=True).start()
    return True
