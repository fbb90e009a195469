"""The guard in front of every turngym server (``turngym serve``, the OpenAI-compatible proxy).

Framework-agnostic: :func:`guard_app` wraps any ASGI app (FastAPI, Starlette, an MCP or OpenEnv
mount) and refuses, before the app sees it, any HTTP request or WebSocket handshake that

* names a ``Host`` the server does not answer to (DNS rebinding), or comes from a cross-site
  ``Origin`` (a web page in a browser on the same machine): 403;
* lacks the token (``Authorization: Bearer <token>``, or HTTP Basic with the token as password for
  clients that only take a URL; compared in constant time): 401, with a short message saying how to
  authenticate (paths in ``open_paths``, e.g. ``/health``, need none);
* carries a body over ``max_body_bytes`` (by ``Content-Length`` or as it streams in): 413; a
  WebSocket frame over ``max_frame_bytes`` closes the socket (code 1009);
* repeats ``Host``/``Origin``/``Authorization``/``Content-Length``, or sends both ``Content-Length``
  and ``Transfer-Encoding`` (request smuggling): 400; has a head over 16 KiB: 431 (both close the
  connection).

Two tokens may be set: the client token, and an optional trainer token whose holders are also
*trainers* (:func:`caller_is_trainer`): servers send privileged data (the gold ``reference``) only to
them. :func:`resolve_token` picks the token (flag, environment variable, else a fresh random one);
:func:`uvicorn_limits` gives the uvicorn settings that bound connections, header time and frame sizes.
docs/interop.md ("Security") has the threat model.
"""

from __future__ import annotations

import base64
import contextvars
import hmac
import ipaddress
import json
import os
import secrets
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from turngym.remote.http_protocols import MAX_HEAD_BYTES, bounded_protocol

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: the scope key :func:`guard_app` sets: ``"trainer"`` or ``"client"``
ROLE_KEY = "turngym.role"
MIN_TOKEN_CHARS = 16
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_FRAME_BYTES = 4 * 1024 * 1024
_WILDCARD_BINDS = {"", "0.0.0.0", "::", "[::]", "*"}
_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
_ROLE: contextvars.ContextVar[str] = contextvars.ContextVar("turngym_serve_role", default="client")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 with or without brackets) is this machine only."""
    name = host.strip().strip("[]").lower()
    if name in ("localhost", "localhost."):
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return bool(address.is_loopback or (mapped is not None and mapped.is_loopback))


def resolve_token(
    token: str | None, *, env_var: str, insecure_no_token: bool, host: str
) -> tuple[str | None, bool]:
    """``(token, generated)``: ``token`` if given, else ``$env_var``, else a fresh random token
    (``generated``: print it). ``insecure_no_token`` gives ``(None, False)``, only on a loopback
    ``host`` (else ``ValueError``)."""
    if insecure_no_token:
        if token:
            raise ValueError("both a token and --insecure-no-token: choose one")
        if not is_loopback(host):
            raise ValueError(
                f"--insecure-no-token is allowed only with a loopback bind (127.0.0.1, ::1, localhost), "
                f"not {host!r}: anyone who reaches the port could run the served envs"
            )
        return None, False
    if token is None:
        token = os.environ.get(env_var) or None
    if token is None:
        return secrets.token_urlsafe(32), True
    check_token(token)
    return token, False


def check_token(token: str) -> None:
    """Refuse a token that is short or cannot travel in an HTTP header."""
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(f"the token must be at least {MIN_TOKEN_CHARS} characters, got {len(token)}")
    if not all(33 <= ord(c) <= 126 for c in token):
        raise ValueError("the token must be printable ASCII without spaces")


def _host_port(host: str, port: int) -> list[str]:
    """The ``Host`` header values a client may send for ``host:port``."""
    name = host.strip().lower()
    if ":" in name and not name.startswith("["):
        name = f"[{name}]"
    values = [f"{name}:{port}"]
    if port in (80, 443):
        values.append(name)
    return values


@dataclass(frozen=True)
class ServeGuard:
    """What :func:`guard_app` checks. ``allowed_hosts``: the ``Host`` values accepted (``"*"``: any);
    ``allowed_origins``: extra ``Origin`` values accepted (requests without an ``Origin`` header, and
    same-origin ones, always are); ``token``: None only for ``--insecure-no-token``;
    ``trainer_token``: its holders are trainers (privileged info); ``auth_hint``: how to authenticate,
    said in a 401."""

    token: str | None
    allowed_hosts: frozenset[str]
    allowed_origins: frozenset[str] = frozenset()
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    trainer_token: str | None = None
    auth_hint: str = "send the header 'Authorization: Bearer <token>' (the token the server printed at start)"

    def __post_init__(self) -> None:
        for t in (self.token, self.trainer_token):
            if t is not None:
                check_token(t)
        if self.trainer_token is not None and self.token is not None:
            if hmac.compare_digest(self.trainer_token.encode(), self.token.encode()):
                raise ValueError("the trainer token must differ from the client token")
        if self.max_body_bytes < 1 or self.max_frame_bytes < 1:
            raise ValueError("max_body_bytes and max_frame_bytes must be >= 1")

    @classmethod
    def for_bind(
        cls,
        host: str,
        port: int,
        token: str | None,
        *,
        trainer_token: str | None = None,
        extra_hosts: Iterable[str] = (),
        allowed_origins: Iterable[str] = (),
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        auth_hint: str | None = None,
    ) -> ServeGuard:
        """The guard of a server listening on ``host:port``: the loopback names with the port, the
        bind address (any ``Host`` for a wildcard bind such as 0.0.0.0: the token is then the only
        gate), and ``extra_hosts`` (``name`` or ``name:port``)."""
        if token is None and not is_loopback(host):
            raise ValueError(f"a server bound to {host!r} (not loopback) needs a token")
        hosts: set[str] = set()
        for name in _LOOPBACK_NAMES:
            hosts.update(_host_port(name, port))
        if host.strip() in _WILDCARD_BINDS:
            hosts.add("*")
        else:
            hosts.update(_host_port(host, port))
        for extra in extra_hosts:
            extra = extra.strip().lower()
            hosts.add(extra)
            if extra != "*" and not extra.endswith("]") and ":" not in extra.lstrip("["):
                hosts.update(_host_port(extra, port))
        origins = frozenset(o.strip().lower().rstrip("/") for o in allowed_origins)
        extra_kw = {"auth_hint": auth_hint} if auth_hint else {}
        return cls(
            token=token,
            allowed_hosts=frozenset(hosts),
            allowed_origins=origins,
            max_body_bytes=max_body_bytes,
            max_frame_bytes=max_frame_bytes,
            trainer_token=trainer_token,
            **extra_kw,
        )

    # ------------------------------------------------------------ checks
    def check(
        self, headers: dict[bytes, list[bytes]], *, needs_token: bool = True
    ) -> tuple[int, str, str] | str:
        """The caller's role (``"trainer"``/``"client"``), or ``(status, kind, message)`` refusing it.
        ``headers``: lower-case name -> values; ``needs_token``: False for open paths (``/health``)."""
        for name in (b"host", b"origin", b"authorization", b"content-length"):
            if len(headers.get(name, [])) > 1:
                return 400, "malformed", f"more than one {name.decode()} header"
        if b"transfer-encoding" in headers and b"content-length" in headers:
            return (
                400,
                "malformed",
                "both Content-Length and Transfer-Encoding: send one (request smuggling?)",
            )
        host = _first(headers, b"host").lower()
        if "*" not in self.allowed_hosts and host not in self.allowed_hosts:
            return (
                403,
                "forbidden_host",
                f"Host {_excerpt(host, 80)!r} is not served here (DNS rebinding?); an operator may allow "
                "it with --allow-host",
            )
        origin = _first(headers, b"origin").lower().rstrip("/")
        if b"origin" in headers and not self._origin_ok(origin, host):
            return (
                403,
                "forbidden_origin",
                f"cross-origin request from {_excerpt(origin, 80)!r} refused (a web page may not drive "
                "this server); an operator may allow it with --allow-origin",
            )
        given = _credential(_first(headers, b"authorization"))
        if self.trainer_token is not None and given and _same(given, self.trainer_token):
            return "trainer"
        if self.token is None or (given and _same(given, self.token)) or not needs_token:
            return "client"
        why = "no token given" if not given else "wrong token"
        return 401, "unauthorized", f"{why}: {self.auth_hint}"

    def _origin_ok(self, origin: str, host: str) -> bool:
        if origin in self.allowed_origins or "*" in self.allowed_origins:
            return True
        try:
            parts = urlsplit(origin)
            port = parts.port
        except ValueError:  # a port out of range, a broken IPv6 literal
            return False
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return False  # "null" (sandboxed frames, file:) and anything odd
        default = 443 if parts.scheme == "https" else 80
        netloc = parts.netloc if port is not None else f"{parts.netloc}:{default}"
        host_with_port = host if (":" in host.rsplit("]", 1)[-1]) else f"{host}:{default}"
        return netloc == host_with_port


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode())


def _credential(value: str) -> str:
    """The token in an ``Authorization`` header: ``Bearer <token>``, or ``Basic`` with the token as
    the password (what clients that only take a URL send for ``http://user:<token>@host``)."""
    scheme, _, credentials = value.strip().partition(" ")
    if scheme.lower() == "bearer":
        return credentials.strip()
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(credentials.strip(), validate=True).decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            return ""
        return decoded.partition(":")[2]
    return ""


def _first(headers: dict[bytes, list[bytes]], name: bytes) -> str:
    values = headers.get(name)
    return values[0].decode("latin-1") if values else ""


def _excerpt(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def caller_is_trainer(scope: Scope | None = None) -> bool:
    """Whether the caller of the request being served holds the trainer token: from ``scope`` when
    given (set by :func:`guard_app`), else from the context of the request's task."""
    if scope is not None:
        return scope.get(ROLE_KEY) == "trainer"
    return _ROLE.get() == "trainer"


# ---------------------------------------------------------------------------- the ASGI wrapper
def guard_app(app: ASGIApp, guard: ServeGuard, *, open_paths: Iterable[str] = ("/health",)) -> ASGIApp:
    """``app`` behind ``guard`` (see the module docstring); lifespan events pass through."""
    opened = frozenset(open_paths)

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await app(scope, receive, send)
            return
        headers: dict[bytes, list[bytes]] = {}
        size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
        for name, value in scope.get("headers") or []:
            headers.setdefault(bytes(name).lower(), []).append(bytes(value))
            size += len(name) + len(value) + 4
        verdict = guard.check(headers, needs_token=scope.get("path", "") not in opened)
        if size > MAX_HEAD_BYTES:  # the protocols bound what they buffer; this bounds what one head holds
            verdict = 431, "headers_too_large", f"request headers over {MAX_HEAD_BYTES} bytes"
        if not isinstance(verdict, str):
            await _refuse(scope, send, *verdict)
            return
        scope = dict(scope)
        scope[ROLE_KEY] = verdict
        reset = _ROLE.set(verdict)
        try:
            if kind == "http":
                await _http_limited(app, scope, receive, send, headers, guard.max_body_bytes)
            else:
                await _ws_limited(app, scope, receive, send, guard.max_frame_bytes)
        finally:
            _ROLE.reset(reset)

    return guarded


def error_body(kind: str, message: str) -> bytes:
    """The JSON body of a refusal: ``{"detail": {"error": message, "kind": kind}}``."""
    return json.dumps({"detail": {"error": message, "kind": kind}}).encode()


async def _refuse(scope: Scope, send: Send, status: int, kind: str, message: str) -> None:
    body = error_body(kind, message)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="turngym"'))
    if status in (400, 431):  # a malformed or oversized head: where its body ends is not to be trusted
        headers.append((b"connection", b"close"))
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
    elif "websocket.http.response" in (scope.get("extensions") or {}):
        await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
    else:  # the server answers the handshake with a plain 403
        await send({"type": "websocket.close", "code": 1008, "reason": kind})


async def _http_limited(
    app: ASGIApp, scope: Scope, receive: Receive, send: Send, headers: dict[bytes, list[bytes]], limit: int
) -> None:
    declared = _first(headers, b"content-length").strip()
    if declared:
        if not declared.isdigit():
            await _refuse(scope, send, 400, "malformed", "Content-Length is not a number")
            return
        if int(declared) > limit:
            await _refuse(scope, send, 413, "too_large", f"request body over {limit} bytes")
            return
    state = {"seen": 0, "started": False, "refused": False}

    async def counting_receive() -> Message:
        message = await receive()
        if message["type"] == "http.request" and not state["refused"]:
            state["seen"] += len(message.get("body", b""))
            if state["seen"] > limit:
                state["refused"] = True
                if not state["started"]:
                    await _refuse(scope, send, 413, "too_large", f"request body over {limit} bytes")
                return {"type": "http.disconnect"}
        return message

    async def tracking_send(message: Message) -> None:
        if state["refused"]:
            return  # the 413 went out; the app's own reply is dropped
        if message["type"] == "http.response.start":
            state["started"] = True
        await send(message)

    try:
        await app(scope, counting_receive, tracking_send)
    except Exception:
        if not state["refused"]:
            raise  # the app failing on the cut body is expected; anything else is the app's own


async def _ws_limited(app: ASGIApp, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
    state = {"closed": False}

    async def frame_receive() -> Message:
        message = await receive()
        if message["type"] == "websocket.receive" and not state["closed"]:
            text, data = message.get("text"), message.get("bytes")
            size = len(data) if data is not None else 0
            if text is not None:
                size = len(text) if len(text) * 4 <= limit else len(text.encode("utf-8", "replace"))
            if size > limit:
                state["closed"] = True
                await send({"type": "websocket.close", "code": 1009, "reason": f"frame over {limit} bytes"})
                return {"type": "websocket.disconnect", "code": 1009}
        return message

    async def guarded_send(message: Message) -> None:
        if not state["closed"]:
            await send(message)

    try:
        await app(scope, frame_receive, guarded_send)
    except Exception:
        if not state["closed"]:
            raise  # an app failing on the cut connection is expected; anything else is its own


# ---------------------------------------------------------------------------- uvicorn settings
DEFAULT_HEADER_TIMEOUT = 10.0


def default_max_connections() -> int:
    """Open connections a server keeps at most: below this process's file-descriptor limit (with room
    for its own files, containers and sockets), at most 1,000."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return 1000
    if soft == resource.RLIM_INFINITY:
        return 1000
    return max(8, min(1000, soft // 2))


def uvicorn_limits(
    *,
    max_connections: int | None = None,
    limit_concurrency: int | None = None,
    header_timeout: float = DEFAULT_HEADER_TIMEOUT,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    http: str | None = None,
) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.run``/``uvicorn.Config`` that bound what one peer can hold:
    connections past ``max_connections`` are closed at once (the server never runs out of file
    descriptors), a connection that has not sent a request's headers within ``header_timeout``
    seconds is closed (idle and slow-header sockets), requests past ``limit_concurrency`` get 503,
    headers over 16 KiB and WebSocket messages over ``max_frame_bytes`` are refused. ``http``: the
    HTTP/1.1 parser (``auto``: httptools where installed, else h11; default ``$TURNGYM_HTTP``); the
    protocol class names it in ``http_parser`` (see :mod:`turngym.remote.http_protocols`)."""
    connections = max_connections if max_connections is not None else default_max_connections()
    if connections < 1 or header_timeout <= 0:
        raise ValueError("max_connections must be >= 1 and header_timeout > 0")
    protocol = bounded_protocol(http, max_connections=connections, header_timeout=header_timeout)
    return {
        "http": protocol,
        "limit_concurrency": limit_concurrency if limit_concurrency is not None else connections,
        "timeout_keep_alive": 5,
        "h11_max_incomplete_event_size": MAX_HEAD_BYTES,
        "ws_max_size": max_frame_bytes,
        "ws_max_queue": 16,
        "ws_ping_interval": 20.0,
        "ws_ping_timeout": 20.0,
        "backlog": 128,
        "timeout_graceful_shutdown": 10,
    }
