"""uvicorn's HTTP/1.1 protocols, bounded: what one peer can hold on a turngym server.

Both classes add to uvicorn's own protocol (h11: pure Python; httptools: llhttp, in C, cheaper a
call) the same guarantees, which uvicorn lacks:

* a cap on open connections: past it a connection gets ``503 too many connections`` and is closed
  at once (the server never runs out of file descriptors);
* a deadline for each request's headers: a connection that has not sent a request's headers within
  ``header_timeout`` seconds of opening (or of the request's first byte) is closed (idle and
  slowloris sockets); keep-alive connections between requests are uvicorn's ``timeout_keep_alive``;
* a cap on the bytes of a request's head (request line and headers) the parser buffers: h11
  through uvicorn's ``h11_max_incomplete_event_size``, httptools here (``431``, then closed); the
  guard (:func:`turngym.remote.security.guard_app`) refuses a complete head over it too;
* httptools also refuses an HTTP/1.1 request without ``Host`` (400), as h11 does.

:func:`bounded_protocol` picks one: ``"auto"`` is httptools where the package imports, else h11.
Each class names its parser in ``http_parser``; :func:`turngym.remote.security.uvicorn_limits` builds
the uvicorn settings around it; ``$TURNGYM_HTTP`` (``auto``, ``h11``, ``httptools``) is the default.
"""

from __future__ import annotations

import os
from typing import Any

HTTP_ENV = "TURNGYM_HTTP"
HTTP_CHOICES = ("auto", "h11", "httptools")
#: the most bytes of a request's head (request line and headers)
MAX_HEAD_BYTES = 16 * 1024
_TOO_MANY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\n"
    b"content-length: 21\r\nconnection: close\r\n\r\ntoo many connections\n"
)
_HEAD_TOO_LARGE_BODY = f"request headers over {MAX_HEAD_BYTES} bytes\n".encode()
_HEAD_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_HEAD_TOO_LARGE_BODY), _HEAD_TOO_LARGE_BODY)
)


def httptools_available() -> bool:
    try:
        import httptools  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_parser(http: str | None = None) -> str:
    """``"h11"`` or ``"httptools"``: ``http`` if given, else ``$TURNGYM_HTTP``, else ``"auto"``
    (httptools where it imports). ``ValueError`` for another name, or httptools asked for and missing."""
    choice = (http or os.environ.get(HTTP_ENV) or "auto").strip().lower()
    if choice not in HTTP_CHOICES:
        raise ValueError(f"HTTP parser {choice!r}: choose one of {', '.join(HTTP_CHOICES)}")
    if choice == "auto":
        return "httptools" if httptools_available() else "h11"
    if choice == "httptools" and not httptools_available():
        raise ValueError("HTTP parser 'httptools' asked for, but the httptools package is not installed")
    return choice


def parser_line(parser: str) -> str:
    """What ``turngym serve`` and ``turngym proxy`` print at start: the parser serving, and the choice."""
    return f"HTTP parser: {parser} (${HTTP_ENV}: {', '.join(HTTP_CHOICES)})"


def bounded_protocol(http: str | None, *, max_connections: int, header_timeout: float) -> type:
    """The bounded protocol class of the parser :func:`resolve_parser` picks from ``http``."""
    make = bounded_httptools_protocol if resolve_parser(http) == "httptools" else bounded_h11_protocol
    return make(max_connections=max_connections, header_timeout=header_timeout)


class _HeaderDeadline:
    """The connection cap and the header timer, shared by both protocols (a mixin ahead of uvicorn's
    class: ``connections``, ``loop`` and ``transport`` are uvicorn's)."""

    _header_timer: Any = None
    _max_connections: int
    _header_timeout: float

    def _admit(self) -> bool:
        if len(self.connections) > self._max_connections:  # type: ignore[attr-defined]
            self.transport.write(_TOO_MANY)  # type: ignore[attr-defined]
            self.transport.close()  # type: ignore[attr-defined]
            return False
        self._arm()
        return True

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self._header_timeout, self._headers_late)  # type: ignore[attr-defined]

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        raise NotImplementedError


def bounded_h11_protocol(*, max_connections: int, header_timeout: float) -> type:
    """uvicorn's h11 protocol with the cap on connections and the header deadline."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class BoundedH11Protocol(_HeaderDeadline, H11Protocol):
        http_parser = "h11"
        _max_connections = max_connections
        _header_timeout = header_timeout

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._admit()

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.transport.get_protocol() is not self or self.conn.their_state is not h11.IDLE:
                self._disarm()  # a request's headers are in (or the socket became a WebSocket)
            elif not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return BoundedH11Protocol


class _MissingHost(Exception):
    """Raised in a parser callback: httptools stops, uvicorn answers 400 and closes."""


def bounded_httptools_protocol(*, max_connections: int, header_timeout: float) -> type:
    """uvicorn's httptools protocol with the cap on connections, the header deadline, the cap on a
    request's head and the ``Host`` check (llhttp has no head limit and takes HTTP/1.1 without Host)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class BoundedHttpToolsProtocol(_HeaderDeadline, HttpToolsProtocol):
        http_parser = "httptools"
        _max_connections = max_connections
        _header_timeout = header_timeout
        _head_open = False  # a request's first byte is in, its headers are not
        _head_began = False  # a request's head began in the data being parsed
        _head_bytes = 0  # bytes of the open head (an upper bound)

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._admit()

        def on_message_begin(self) -> None:
            self._head_open = self._head_began = True
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            self._head_open = False
            self._head_bytes = 0
            self._disarm()
            if self.parser.get_http_version() == "1.1" and not any(n == b"host" for n, _ in self.headers):
                raise _MissingHost
            super().on_headers_complete()

        def data_received(self, data: bytes) -> None:
            self._head_began = False
            super().data_received(data)
            if self.transport.is_closing() or self.transport.get_protocol() is not self:
                self._disarm()  # refused, or the socket became a WebSocket
                return
            if self._head_open:
                if self._head_began:  # the head starts after the last end of a head in ``data``
                    end = data.rfind(b"\r\n\r\n")
                    self._head_bytes = len(data) - (end + 4 if end >= 0 else 0)
                else:
                    self._head_bytes += len(data)
                if self._head_bytes > MAX_HEAD_BYTES:
                    self._disarm()
                    self.transport.write(_HEAD_TOO_LARGE)
                    self.transport.close()
                    return
            if self._head_open or self.cycle is None or self.cycle.response_complete:
                self._arm()  # a request's headers are due (no-op while the timer runs)

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.transport.is_closing():
                return
            if self.cycle is not None and not self.cycle.response_complete and not self.cycle.disconnected:
                if self._head_open:  # a pipelined head waits behind a response: give it its time after
                    self._arm()
                return
            self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return BoundedHttpToolsProtocol
