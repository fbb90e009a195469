"""What a sandbox is given and what a command gives back: the container's resource limits
(:class:`Limits`), one command's result (:class:`ExecResult`) and the capped output buffer that keeps
the head and tail of a long stream (:class:`CappedOutput`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Limits:
    """Resource limits of a sandbox.

    ``writable`` paths become tmpfs mounts (the rest of the root file system is read-only when
    ``read_only`` is set) of :attr:`tmpfs_mb` each: ``disk_mb``, cut so that all of them together
    stay below ``memory_mb`` minus a reserve for processes. tmpfs pages are charged to the container's
    memory, so full mounts summing to more than the limit would let the agent OOM-kill its own
    container.
    """

    cpus: float = 1.0
    memory_mb: int = 1024
    pids: int = 256
    disk_mb: int = 512
    writable: tuple[str, ...] = ("/tmp", "/root", "/testbed")
    read_only: bool = True
    network: str = "none"

    @property
    def tmpfs_mb(self) -> int:
        """Size of each writable tmpfs: ``disk_mb``, at most ``(memory_mb - reserve) / len(writable)``
        with a reserve of a quarter of ``memory_mb`` (at least 256 MB), never under 16 MB."""
        if not self.writable:
            return self.disk_mb
        reserve = max(256, self.memory_mb // 4)
        return max(16, min(self.disk_mb, (self.memory_mb - reserve) // len(self.writable)))


@dataclass
class ExecResult:
    """What a command did: exit code, combined stdout+stderr (capped), and how it ended."""

    exit_code: int
    output: str
    timed_out: bool = False
    truncated: bool = False
    output_bytes: int = 0
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass
class CappedOutput:
    """Keeps the first and last ``limit // 2`` bytes of a stream, counting the rest."""

    limit: int
    head: bytearray = field(default_factory=bytearray)
    tail: bytearray = field(default_factory=bytearray)
    total: int = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        half = max(self.limit // 2, 1)
        room = half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > half:
                del self.tail[: len(self.tail) - half]

    def text(self) -> tuple[str, bool]:
        head = self.head.decode("utf-8", errors="replace")
        if self.total <= len(self.head) + len(self.tail):
            return head + self.tail.decode("utf-8", errors="replace"), False
        dropped = self.total - len(self.head) - len(self.tail)
        marker = f"\n[... {dropped} bytes of output truncated ...]\n"
        return head + marker + self.tail.decode("utf-8", errors="replace"), True
