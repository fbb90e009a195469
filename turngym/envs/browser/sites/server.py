"""Serve a local ASGI web app (Starlette) with uvicorn on a free loopback port, in a background thread.

Every site of the web families (the shop, the forum, the issue tracker) runs through
:class:`LocalServer`: ``start()`` binds ``127.0.0.1:0`` (the kernel picks a free port), runs
uvicorn on a daemon thread with its own event loop, and returns once the socket accepts
connections. ``stop()`` asks uvicorn to exit and joins the thread; both are idempotent, and
a server that died is noticed by :attr:`LocalServer.alive` and restarted by ``ensure()``.
"""

from __future__ import annotations

import atexit
import html
import socket
import threading
import time
import weakref
from typing import Any

_LIVE: weakref.WeakSet[LocalServer] = weakref.WeakSet()


class ServerError(RuntimeError):
    """A local site could not be started or stopped."""


class LocalServer:
    """One ASGI app on ``http://127.0.0.1:<port>``.

    Args:
        app: the ASGI application.
        name: shown in errors and the thread name.
        start_timeout_s: how long ``start`` waits for the socket to accept.
        port: a fixed port (default 0: a free one chosen by the kernel).
        host: the interface to bind (default loopback only).
        owns: objects that must live as long as the server (e.g. the working copy of its database).
    """

    def __init__(
        self,
        app: Any,
        *,
        name: str = "site",
        start_timeout_s: float = 30.0,
        port: int = 0,
        host: str = "127.0.0.1",
        owns: tuple[Any, ...] = (),
    ):
        self.app = app
        self.owns = owns
        self.name = name
        self.start_timeout_s = start_timeout_s
        self.host = host
        self.fixed_port = port
        self.port = 0
        self.start_s = 0.0
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        if not self.port:
            raise ServerError(f"{self.name}: the server is not started")
        return f"http://{self.host}:{self.port}"

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._server.should_exit

    def start(self) -> LocalServer:
        """Start serving (no-op when already alive); returns self."""
        import uvicorn

        if self.alive:
            return self
        t0 = time.perf_counter()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.fixed_port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app, log_level="warning", access_log=False, lifespan="off", timeout_keep_alive=30
        )
        self._server = uvicorn.Server(config)
        self._error = None

        def main() -> None:
            try:
                self._server.run(sockets=[sock])
            except BaseException as e:  # noqa: BLE001 - reported by start()/alive
                self._error = e
            finally:
                sock.close()

        self._thread = threading.Thread(target=main, name=f"turngym-site-{self.name}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise ServerError(f"{self.name}: the server did not start: {self._error!r}")
            time.sleep(0.002)
        self.start_s = time.perf_counter() - t0
        _LIVE.add(self)
        return self

    def ensure(self) -> LocalServer:
        """Restart the server if it died (same app, new port)."""
        return self if self.alive else self.start()

    def stop(self) -> None:
        """Stop serving and join the thread (idempotent)."""
        if self._server is not None:
            self._server.should_exit = True
        th, self._thread = self._thread, None
        if th is not None and th.is_alive() and th is not threading.current_thread():
            th.join(timeout=10)
        _LIVE.discard(self)

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


@atexit.register
def _stop_all() -> None:
    for server in list(_LIVE):
        server.stop()


# --------------------------------------------------------------------------- HTML helpers
def esc(value: Any) -> str:
    """HTML-escape any value."""
    return html.escape(str(value), quote=True)


def layout(title: str, body: str, *, header: str = "", style: str = "") -> str:
    """A whole HTML page: ``<title>``, an optional header bar and the body."""
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{esc(title)}</title><style>body{{font-family:sans-serif;margin:16px;max-width:1100px}}"
        f"nav a{{margin-right:12px}} .muted{{color:#666}} {style}</style></head><body>"
        f"{header}{body}</body></html>"
    )
