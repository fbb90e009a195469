"""The host side of the desktop helper (:mod:`turngym.sandboxes.desktop_helper`): one attached
``docker exec`` per desktop, started on first use as the desktop user, kept open for the desktop's life.

A request is one length-prefixed JSON message on the exec's stdin; the answer (JSON header, then the
screenshot bytes) is read back from Docker's multiplexed stdout frames. Requests are serialized. A
stream that breaks, stalls past the request's deadline or answers nonsense raises :class:`HelperLost`:
the helper is killed and the channel is not used again (the desktop then falls back to one ``docker
exec`` per command; a request that carried actions is never sent twice).
"""

from __future__ import annotations

import json
import select
import shlex
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

from turngym.sandboxes.docker import DockerSandbox, SandboxError

_HELPER_SRC = Path(__file__).with_name("desktop_helper.py").read_text()
_A11Y_SRC = Path(__file__).with_name("desktop_a11y_dump.py").read_text()
MAX_ANSWER = 80 << 20


class HelperLost(SandboxError):
    """The helper's stream broke, stalled or answered garbage; ``sent``: the request may have run."""

    def __init__(self, message: str, sent: bool = False):
        super().__init__(message)
        self.sent = sent


class HelperChannel:
    """The helper of one desktop container (``user_argv`` wraps a command to run as the desktop user)."""

    def __init__(self, sb: DockerSandbox, width: int, height: int, user_argv: Any):
        self.sb, self.width, self.height = sb, width, height
        self._user_argv = user_argv
        self._sock: Any = None
        self._frames = bytearray()
        self._stdout = bytearray()
        self._lock = threading.Lock()
        self._id = 0
        self.pid = 0
        self.broken = False

    # ------------------------------------------------------------ stream
    def _start(self) -> None:
        import docker.errors

        code = f"{_HELPER_SRC}\nmain({self.width}, {self.height}, {_A11Y_SRC!r})\n"
        argv = self._user_argv(f"exec python3 -c {shlex.quote(code)}")
        api = self.sb.client.api
        try:
            exec_id = api.exec_create(self.sb.id, argv, stdin=True, stdout=True, stderr=True, tty=False)["Id"]
            sock = api.exec_start(exec_id, socket=True)
        except docker.errors.APIError as e:
            raise HelperLost(f"could not start the desktop helper: {e}") from e
        self._sock = getattr(sock, "_sock", sock)
        self._keep = sock  # the SDK's wrapper owns the socket: keep it alive with ours
        hello, _ = self._answer(time.monotonic() + 30.0)
        if not hello.get("hello"):
            raise HelperLost(f"the desktop helper did not start: {hello}")
        self.pid = int(hello.get("pid", 0))

    def _fill(self, deadline: float) -> None:
        """Read one more chunk of frames into the stdout buffer."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise HelperLost("the desktop helper did not answer in time", sent=True)
        self._sock.settimeout(min(left, 1.0))
        try:
            chunk = self._sock.recv(1 << 20)
        except TimeoutError:
            if not self.sb.alive():
                raise HelperLost("the desktop's container stopped", sent=True) from None
            return
        except OSError as e:
            raise HelperLost(f"the desktop helper's stream broke: {e}", sent=True) from e
        if not chunk:
            raise HelperLost("the desktop helper exited", sent=True)
        self._frames += chunk
        while len(self._frames) >= 8:
            size = struct.unpack(">I", self._frames[4:8])[0]
            if len(self._frames) < 8 + size:
                break
            if self._frames[0] == 1:  # stdout; stderr is the helper's own noise
                self._stdout += self._frames[8 : 8 + size]
            del self._frames[: 8 + size]
        if len(self._stdout) > MAX_ANSWER:
            raise HelperLost("the desktop helper's answer is too large", sent=True)

    def _take(self, n: int, deadline: float) -> bytes:
        while len(self._stdout) < n:
            self._fill(deadline)
        out = bytes(self._stdout[:n])
        del self._stdout[:n]
        return out

    def _answer(self, deadline: float) -> tuple[dict[str, Any], bytes]:
        (n,) = struct.unpack(">I", self._take(4, deadline))
        if n > 1 << 24:
            raise HelperLost("the desktop helper's answer header is too large", sent=True)
        try:
            header = json.loads(self._take(n, deadline))
        except ValueError as e:
            raise HelperLost(f"the desktop helper answered garbage: {e}", sent=True) from e
        blob_len = int(header.get("blob", 0) or 0)
        if not 0 <= blob_len <= MAX_ANSWER:
            raise HelperLost("the desktop helper announced a bad blob", sent=True)
        return header, self._take(blob_len, deadline)

    # ------------------------------------------------------------ requests
    def request(self, req: dict[str, Any], timeout: float) -> tuple[dict[str, Any], bytes]:
        """One request, its answer and blob; :class:`HelperLost` (the channel is then dead for good)."""
        with self._lock:
            if self.broken:
                raise HelperLost("the desktop helper is gone")
            try:
                if self._sock is None:
                    self._start()
                if self._closed():
                    raise HelperLost("the desktop helper exited")  # before this request: not sent
                self._id += 1
                body = json.dumps({**req, "id": self._id}).encode()
                try:
                    self._sock.sendall(struct.pack(">I", len(body)) + body)
                except OSError as e:
                    raise HelperLost(f"the desktop helper's stream broke: {e}") from e
                deadline = time.monotonic() + timeout
                while True:
                    header, blob = self._answer(deadline)
                    if header.get("id") == self._id:
                        return header, blob
            except HelperLost:
                self._kill()
                raise

    def _closed(self) -> bool:
        """Whether the helper's stream has ended (checked without waiting, before a request)."""
        readable, _, _ = select.select([self._sock], [], [], 0)
        if not readable:
            return False
        try:
            self._sock.settimeout(1.0)
            self._fill(time.monotonic() + 1.0)  # frames that are there (stderr noise) are kept
        except HelperLost:
            return True
        return False

    def _kill(self) -> None:
        self.broken = True
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            except OSError:
                pass
        if self.pid and self.sb.alive():
            try:
                self.sb._exec_raw(["kill", "-9", str(self.pid)], 10.0)
            except SandboxError:
                pass

    def close(self) -> None:
        """End the helper (its stdin closes); the container stays."""
        with self._lock:
            sock, self._sock = self._sock, None
            self.broken = True
            if sock is not None:
                try:
                    sock.close()
                except OSError:
                    pass
