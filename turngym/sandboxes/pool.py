"""``SandboxPool``: pre-warmed, bounded, self-healing containers of one image.

* ``prepare`` runs on each new container before it counts as warm (e.g. staging files that every
  episode needs), so that work is off the hand-out path.
* At most ``max_active`` sandboxes are handed out at once (``acquire`` waits beyond that).
* ``warm`` containers are kept started in the background, so a hand-out costs a liveness check
  instead of a container start. A warm container that died is replaced, never handed out.
* Reset = a fresh container: ``release`` removes the used one and the pool warms another.

The pool is thread-based (its own workers start containers), so one pool can serve sync envs,
async envs on different event loops, and Ray actors' threads alike. :meth:`SandboxPool.shared`
gives the process-wide pool of an image and limits.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from turngym.sandboxes.docker import DockerSandbox, SandboxError, executor, run_blocking
from turngym.sandboxes.limits import Limits

_SHARED: dict[tuple[Any, ...], SandboxPool] = {}
_SHARED_LOCK = threading.Lock()


@dataclass
class PoolStats:
    """Counters of a pool's life (for benchmarks and logs)."""

    handed_out_warm: int = 0  # acquires served by a warm spare (checked alive)
    handed_out_cold: int = 0  # acquires that had to start a container (no spare idle)
    replaced_dead: int = 0  # warm spares found dead at hand-out and removed
    start_failures: int = 0  # spare starts that failed (retried by the next fill)
    released: int = 0  # containers given back (and removed)


class SandboxPool:
    """Hand out containers of ``image``; keep ``warm`` spares started; at most ``max_active`` out."""

    def __init__(
        self,
        image: str,
        *,
        warm: int = 1,
        max_active: int = 8,
        limits: Limits | None = None,
        run_id: str | None = None,
        workdir: str | None = None,
        environment: dict[str, str] | None = None,
        prepare: Callable[[DockerSandbox], Any] | None = None,
        prepare_key: str = "",
    ):
        if warm < 0 or max_active < 1:
            raise ValueError("warm must be >= 0 and max_active >= 1")
        self.image = image
        self.warm = warm
        self.max_active = max_active
        self.limits = limits or Limits()
        self.run_id = run_id
        self.workdir = workdir
        self.environment = dict(environment or {})
        self.prepare = prepare
        self.stats = PoolStats()
        self._idle: collections.deque[DockerSandbox] = collections.deque()
        self._slots = threading.BoundedSemaphore(max_active)
        self._lock = threading.Lock()
        self._starting = 0
        self._closed = False
        self._last_error: str = ""
        self._users = 0
        self._holding: set[str] = set()
        self._shared_key: tuple[Any, ...] | None = None
        self._fill()

    @classmethod
    def shared(cls, image: str, **kwargs: Any) -> SandboxPool:
        """The process-wide pool for ``image`` with these settings (created on first use).

        ``prepare`` is not part of the identity of a shared pool: give a ``prepare_key`` that names
        what it does.

        Each call counts one user; :meth:`detach` uncounts it and closes the pool after the last.
        """
        key = (image, tuple(sorted((k, repr(v)) for k, v in kwargs.items() if k != "prepare")))
        with _SHARED_LOCK:
            pool = _SHARED.get(key)
            if pool is None or pool.closed:
                pool = _SHARED[key] = cls(image, **kwargs)
                pool._shared_key = key
            pool._users += 1
            return pool

    def attach(self) -> SandboxPool:
        """Count one more user of this pool (a forked env that shares its parent's pools); the user
        calls :meth:`detach` when done, as :meth:`shared`'s users do."""
        with _SHARED_LOCK:
            if self._closed:
                raise SandboxError("the pool is closed")
            self._users += 1
        return self

    def detach(self) -> None:
        """One user of a shared pool is done; the last one closes it (a private pool just closes)."""
        with _SHARED_LOCK:
            self._users -= 1
            last = self._users <= 0
            if last and self._shared_key is not None and _SHARED.get(self._shared_key) is self:
                del _SHARED[self._shared_key]
        if last:
            self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def idle(self) -> int:
        with self._lock:
            return len(self._idle)

    # ------------------------------------------------------------ warming
    def _new(self) -> DockerSandbox:
        sb = DockerSandbox.create(
            self.image,
            limits=self.limits,
            run_id=self.run_id,
            workdir=self.workdir,
            environment=self.environment,
        )
        if self.prepare is not None:
            try:
                self.prepare(sb)
            except BaseException:
                sb.close()
                raise
        return sb

    def _fill(self) -> None:
        with self._lock:
            if self._closed:
                return
            need = self.warm - len(self._idle) - self._starting
            self._starting += max(need, 0)
        for _ in range(max(need, 0)):
            executor().submit(self._warm_one)

    def _warm_one(self) -> None:
        sb: DockerSandbox | None = None
        try:
            sb = self._new()
        except Exception as e:  # noqa: BLE001 - counted and retried by the next fill
            self.stats.start_failures += 1
            self._last_error = str(e)
        keep = False
        with self._lock:
            if sb is not None and not self._closed:
                self._idle.append(sb)
                keep = True
        if sb is not None and not keep:  # the pool closed while it started
            sb.close()
        with self._lock:
            self._starting -= 1

    def wait_warm(self, timeout: float = 60.0) -> bool:
        """Block until ``warm`` containers are idle (True) or ``timeout`` passes (False)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if len(self._idle) >= self.warm:
                    return True
            self._fill()  # re-tries starts that failed
            time.sleep(0.02)
        return False

    # ------------------------------------------------------------ hand-out
    def acquire(self, timeout: float | None = None, *, bounded: bool = True) -> DockerSandbox:
        """A live sandbox: a warm one if any (checked alive), else a freshly started one.

        ``bounded=False`` skips the ``max_active`` bound, for short-lived helpers of a sandbox that
        already holds a slot (grading a patch), which would otherwise deadlock a full pool.
        """
        if self._closed:
            raise SandboxError("the pool is closed")
        if bounded and not self._slots.acquire(timeout=timeout):
            raise SandboxError(f"no sandbox slot free within {timeout}s (max_active={self.max_active})")
        try:
            sb = self._take_warm()
            if sb is None:
                self._fill()
                sb = self._new()
                self.stats.handed_out_cold += 1
        except BaseException:
            if bounded:
                self._slots.release()
            raise
        if bounded:
            with self._lock:
                self._holding.add(sb.id)
        return sb

    def _take_warm(self) -> DockerSandbox | None:
        while True:
            with self._lock:
                sb = self._idle.popleft() if self._idle else None
            if sb is None:
                return None
            if sb.alive():
                self.stats.handed_out_warm += 1
                self._fill()
                return sb
            self.stats.replaced_dead += 1
            sb.close()

    def release(self, sb: DockerSandbox) -> None:
        """Give a sandbox back: it is removed (its state is gone) and its slot is free again."""
        try:
            sb.close()
        finally:
            self.stats.released += 1
            with self._lock:
                held = sb.id in self._holding
                self._holding.discard(sb.id)
            if held:
                self._slots.release()
            self._fill()

    @contextlib.contextmanager
    def sandbox(self, timeout: float | None = None) -> Iterator[DockerSandbox]:
        sb = self.acquire(timeout)
        try:
            yield sb
        finally:
            self.release(sb)

    async def aacquire(self, timeout: float | None = None, *, bounded: bool = True) -> DockerSandbox:
        return await run_blocking(self.acquire, timeout, bounded=bounded)

    async def arelease(self, sb: DockerSandbox) -> None:
        await run_blocking(self.release, sb)

    def release_later(self, sb: DockerSandbox) -> None:
        """Release in the background (container removal takes a while; nobody needs to wait for it)."""
        executor().submit(self.release, sb)

    # ------------------------------------------------------------ shutdown
    def close(self) -> None:
        """Remove the idle containers and wait for those still starting (they remove themselves);
        handed-out ones are closed by whoever holds them."""
        with self._lock:
            self._closed = True
            idle = list(self._idle)
            self._idle.clear()
        for sb in idle:
            sb.close()
        deadline = time.monotonic() + 120.0
        while self._starting > 0 and time.monotonic() < deadline:
            time.sleep(0.02)

    async def aclose(self) -> None:
        await run_blocking(self.close)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@atexit.register
def _close_shared_pools() -> None:
    with _SHARED_LOCK:
        pools = list(_SHARED.values())
    for pool in pools:
        with contextlib.suppress(Exception):
            pool.close()
