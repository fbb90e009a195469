"""The fast path of ``DockerSandbox.exec``: requests to the container's PID 1 command server
(``exec_server.py``) over Docker's attach stream, one length-prefixed JSON header (plus stdin bytes)
out and one JSON answer (exit code, output, timing) back, read from Docker's multiplexed frames.

A broken or stalled stream raises :class:`FastPathLost`; the sandbox then falls back to
``docker exec`` for good (and never runs a command twice when the request may have arrived).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any


class FastPathLost(Exception):
    """The attach stream to PID 1 broke or stalled; fall back to ``docker exec``.

    ``sent`` tells whether the request may have reached PID 1 (then it is not run a second time).
    """

    def __init__(self, message: str, sent: bool = False):
        super().__init__(message)
        self.sent = sent


class AttachChannel:
    """One container's attach stream to PID 1, opened on first use; requests are serialized."""

    def __init__(
        self, client: Any, container_id: str, alive: Callable[[], bool], kill_strays: Callable[[], None]
    ):
        self.client, self.id = client, container_id
        self._alive, self._kill_strays = alive, kill_strays
        self._attach: Any = None
        self._attach_buf = bytearray()
        self._attach_out = bytearray()
        self._attach_lock = threading.Lock()
        self._request_id = 0

    def request(
        self,
        command: str,
        timeout: float,
        workdir: str | None,
        environment: Mapping[str, str] | None,
        max_output_bytes: int,
        stdin: bytes | None,
    ) -> tuple[dict[str, Any], bytes]:
        """One request to PID 1: its JSON answer and the command's raw output bytes."""
        import base64
        import json
        import struct

        with self._attach_lock:
            raw = self._attached()
            self._request_id += 1
            rid = self._request_id
            header = json.dumps(
                {
                    "id": rid,
                    "cmd": command,
                    "timeout": timeout,
                    "cwd": workdir,
                    "env": dict(environment or {}),
                    "max_bytes": max_output_bytes,
                    "stdin_len": len(stdin or b""),
                }
            ).encode()
            try:
                raw.sendall(struct.pack(">I", len(header)) + header + (stdin or b""))
            except OSError as e:
                raise FastPathLost(str(e)) from e
            deadline = time.monotonic() + timeout + 15.0
            try:
                while True:
                    resp = self._next_response(raw, deadline)
                    if resp.get("id") == rid:
                        break
            except FastPathLost as e:
                e.sent = True
                raise
        return resp, base64.b64decode(resp.get("out", ""))

    def _attached(self) -> Any:
        import docker.errors

        if self._attach is None:
            if not self._alive():
                raise FastPathLost("the container is not running")
            try:
                sock = self.client.api.attach_socket(
                    self.id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
                )
            except docker.errors.APIError as e:
                raise FastPathLost(str(e)) from e
            self._attach = sock
            self._attach_buf = bytearray()
            self._attach_out = bytearray()
        return getattr(self._attach, "_sock", self._attach)

    def close(self) -> None:
        """Drop the stream (the next request opens a new one)."""
        sock, self._attach = self._attach, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    def _next_response(self, raw: Any, deadline: float) -> dict[str, Any]:
        """Read Docker's multiplexed frames until one whole response of PID 1 is buffered."""
        import json
        import struct

        while True:
            pending = self._attach_out
            if len(pending) >= 4:
                (n,) = struct.unpack(">I", pending[:4])
                if len(pending) >= 4 + n:
                    body = bytes(pending[4 : 4 + n])
                    del pending[: 4 + n]
                    return json.loads(body)
            frames = self._attach_buf
            if len(frames) >= 8:
                size = struct.unpack(">I", frames[4:8])[0]
                if len(frames) >= 8 + size:
                    if frames[0] == 1:  # stdout; stderr (2) carries nothing the host needs
                        pending += frames[8 : 8 + size]
                    del frames[: 8 + size]
                    continue
            left = deadline - time.monotonic()
            if left <= 0:
                self._kill_strays()
                raise FastPathLost("no answer from the sandbox's command server")
            raw.settimeout(min(left, 1.0))
            try:
                chunk = raw.recv(1 << 16)
            except TimeoutError:
                if not self._alive():  # killed from outside: the stream may never close by itself
                    raise FastPathLost("the container stopped") from None
                continue
            except OSError as e:
                raise FastPathLost(str(e)) from e
            if not chunk:
                raise FastPathLost("the attach stream closed")
            frames += chunk
