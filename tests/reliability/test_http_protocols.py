"""The bounded HTTP/1.1 protocols of ``turngym.remote.http_protocols`` (h11 and httptools), each test run
against both: a real uvicorn server on loopback behind the guard, serving a small ASGI app, driven over
raw sockets (the attacks need bytes no HTTP client sends). Checked: keep-alive and pipelined requests
answered in order; idle and slow-header (slowloris) sockets closed at the header deadline; connections
past the cap refused with 503; heads over 16 KiB refused (one line or dripped) while 12 KiB passes; an
HTTP/1.1 request without Host, a duplicated Content-Length and Content-Length with Transfer-Encoding
(request smuggling) refused with 400 and the connection closed, the smuggled request never reaching the
app; bodies over the guard's limit 413; WebSocket upgrades through either protocol, with the frame cap.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("httptools")
pytest.importorskip("websockets")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from websockets.asyncio.client import connect  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402

from turngym.remote.http_protocols import MAX_HEAD_BYTES, resolve_parser  # noqa: E402
from turngym.remote.security import ServeGuard, guard_app, uvicorn_limits  # noqa: E402

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(120)]

TOKEN = "http-protocol-token-0123456789"
HEADER_TIMEOUT = 1.5
MAX_BODY = 4096


class Echo:
    """The app behind the guard: an HTTP request gets ``{"path", "body"}`` (the body's length); a
    WebSocket echoes. ``paths``: every HTTP path that reached it."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] == "websocket":
            await receive()  # connect
            await send({"type": "websocket.accept"})
            while (message := await receive())["type"] == "websocket.receive":
                await send({"type": "websocket.send", "text": message.get("text") or ""})
            return
        self.paths.append(scope["path"])
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            size += len(message.get("body", b""))
            more = message.get("more_body", False)
        body = json.dumps({"path": scope["path"], "body": size}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


@contextlib.contextmanager
def serving(parser: str, *, max_connections: int = 64, header_timeout: float = HEADER_TIMEOUT):
    """uvicorn with ``parser``'s bounded protocol in a thread on 127.0.0.1: ``(port, app)``."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = Echo()
    guard = ServeGuard.for_bind("127.0.0.1", port, TOKEN, max_body_bytes=MAX_BODY, max_frame_bytes=MAX_BODY)
    limits = uvicorn_limits(
        max_connections=max_connections, header_timeout=header_timeout, max_frame_bytes=MAX_BODY, http=parser
    )
    assert limits["http"].http_parser == parser
    server = uvicorn.Server(uvicorn.Config(guard_app(app, guard), log_level="critical", **limits))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    for _ in range(600):  # bounded: up to 60 s
        if server.started:
            break
        time.sleep(0.1)
    assert server.started
    try:
        yield port, app
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@pytest.fixture(scope="module", params=["h11", "httptools"])
def served(request):
    with serving(request.param) as (port, app):
        yield request.param, port, app


def head(port: int, path: str = "/", extra: str = "", method: str = "GET") -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {TOKEN}\r\n{extra}\r\n"
    ).encode()


def read_responses(sock: socket.socket, n: int) -> list[tuple[int, bytes]]:
    """``n`` responses (status, body) read off ``sock`` (bodies by Content-Length)."""
    buf, out = b"", []
    while len(out) < n:
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            assert chunk, f"closed after {len(out)} of {n} responses: {buf[:200]!r}"
            buf += chunk
        top, buf = buf.split(b"\r\n\r\n", 1)
        lines = top.split(b"\r\n")
        length = next(
            (
                int(v)
                for k, _, v in (line.partition(b":") for line in lines[1:])
                if k.lower() == b"content-length"
            ),
            0,
        )
        while len(buf) < length:
            chunk = sock.recv(65536)
            assert chunk, "closed mid-body"
            buf += chunk
        out.append((int(lines[0].split()[1]), buf[:length]))
        buf = buf[length:]
    return out


def closed(sock: socket.socket, timeout: float = 30.0) -> bool:
    """Whether the server closes ``sock`` within ``timeout`` (what it sends first is read and dropped)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except OSError:
        pass
    return True


def connect_to(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=30)


# ------------------------------------------------------------------ the protocol picked
def test_auto_picks_httptools_where_installed_and_the_environment_overrides(monkeypatch):
    monkeypatch.delenv("TURNGYM_HTTP", raising=False)
    assert resolve_parser() == "httptools" and uvicorn_limits()["http"].http_parser == "httptools"
    monkeypatch.setenv("TURNGYM_HTTP", "h11")
    assert resolve_parser() == "h11" and uvicorn_limits()["http"].http_parser == "h11"
    assert uvicorn_limits(http="httptools")["http"].http_parser == "httptools"  # the argument wins
    monkeypatch.setenv("TURNGYM_HTTP", "picohttp")
    with pytest.raises(ValueError, match="choose one of auto, h11, httptools"):
        uvicorn_limits()


# ------------------------------------------------------------------ keep-alive, pipelining
def test_keep_alive_and_pipelined_requests_are_answered_in_order(served):
    _, port, app = served
    with connect_to(port) as s:
        for i in range(3):  # one after the other on one connection
            s.sendall(head(port, f"/seq{i}"))
            [(status, body)] = read_responses(s, 1)
            assert status == 200 and json.loads(body)["path"] == f"/seq{i}"
        body = b'{"x": 1}'
        pipelined = (
            head(port, "/p0")
            + head(port, "/p1", f"Content-Length: {len(body)}\r\n", method="POST")
            + body
            + head(port, "/p2")
        )
        s.sendall(pipelined)  # three requests in one write
        replies = read_responses(s, 3)
    assert [json.loads(b)["path"] for _, b in replies] == ["/p0", "/p1", "/p2"]
    assert [json.loads(b)["body"] for _, b in replies] == [0, len(body), 0]
    assert {"/seq0", "/seq1", "/seq2", "/p0", "/p1", "/p2"} <= set(app.paths)


# ------------------------------------------------------------------ the header deadline
def test_idle_and_slow_header_sockets_are_closed_at_the_deadline(served):
    """An idle socket, and a slowloris one (a header byte every 0.1 s, never the blank line), are
    closed; a request sent in pieces within the deadline, and a kept-alive socket between its
    requests, are served."""
    _, port, _ = served
    idle = connect_to(port)
    slow = connect_to(port)
    slow.sendall(head(port).rstrip(b"\r\n") + b"\r\n")
    dripped = 0
    try:
        for _ in range(400):  # bounded: at most 40 s of drip, the deadline is 1.5 s
            slow.sendall(b"X-Slow: a\r\n")
            dripped += 1
            time.sleep(0.1)
    except OSError:
        pass  # the server closed it
    assert dripped < 400, "the slow-header socket was never closed"
    assert closed(slow) and closed(idle)
    with connect_to(port) as s:
        request = head(port, "/pieces")
        for i in range(0, len(request), 16):  # in pieces, well within the deadline
            s.sendall(request[i : i + 16])
        [(status, _)] = read_responses(s, 1)
        assert status == 200
        s.sendall(head(port, "/again"))  # the same socket, kept alive
        [(status, body)] = read_responses(s, 1)
        assert status == 200 and json.loads(body)["path"] == "/again"
    idle.close()
    slow.close()


@pytest.mark.parametrize("parser", ["h11", "httptools"])
def test_connections_past_the_cap_get_503_and_a_freed_slot_serves_again(parser):
    with serving(parser, max_connections=4, header_timeout=60) as (port, _):
        held = [connect_to(port) for _ in range(4)]
        with connect_to(port) as extra:
            extra.settimeout(30)
            reply = extra.recv(4096)
            assert reply.startswith(b"HTTP/1.1 503") and b"too many connections" in reply, parser
            assert closed(extra)
        held.pop().close()  # two freed: limit_concurrency (the cap too) counts the new one
        held.pop().close()
        for _ in range(100):  # bounded: the server sees the close soon after
            with connect_to(port) as s:
                s.sendall(head(port, "/freed"))
                s.settimeout(30)
                if s.recv(4096).startswith(b"HTTP/1.1 200"):
                    break
            time.sleep(0.05)
        else:
            pytest.fail(f"{parser}: a freed slot never served")
        for s in held:
            s.close()


# ------------------------------------------------------------------ head size
def test_heads_over_16_kib_are_refused_and_the_connection_closed(served):
    parser, port, app = served
    before = len(app.paths)
    with connect_to(port) as s:  # 12 KiB of headers: served
        s.sendall(head(port, "/fits", f"X-Big: {'a' * 12 * 1024}\r\n"))
        [(status, _)] = read_responses(s, 1)
        assert status == 200
    with connect_to(port) as s:  # one 20 KiB header line
        s.sendall(head(port, "/line", f"X-Big: {'a' * 20 * 1024}\r\n"))
        s.settimeout(30)
        reply = s.recv(4096)
        assert reply.split(b" ")[1] in (b"400", b"431"), (parser, reply[:80])
        assert closed(s)
    with connect_to(port) as s:  # many small headers in 1 KiB writes: refused once past 16 KiB
        s.sendall(head(port, "/drip").rstrip(b"\r\n") + b"\r\n")
        for i in range(MAX_HEAD_BYTES // 1010 + 1):  # stops just past the cap: nothing left unread
            s.sendall(f"X-H{i:03d}: {'b' * 1000}\r\n".encode())
        s.settimeout(30)
        reply = s.recv(4096)  # an answer, not the header deadline's silent close
        assert reply.split(b" ")[1] in (b"400", b"431"), (parser, reply[:80])
        assert closed(s)
    assert set(app.paths[before:]) == {"/fits"}


# ------------------------------------------------------------------ framing attacks
@pytest.mark.parametrize(
    ("name", "extra", "rest"),
    [
        ("no_host", None, b""),
        ("two_lengths", "Content-Length: 5\r\nContent-Length: 40\r\n", b"hello"),
        ("length_and_chunked", "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n"),
        ("chunked_and_length", "Transfer-Encoding: chunked\r\nContent-Length: 40\r\n", b"0\r\n\r\n"),
    ],
)
def test_smuggling_and_missing_host_are_400_and_close_the_connection(served, name, extra, rest):
    """Each attempt hides a second request after the first one's body (by one parse of the framing);
    it is refused with 400, the connection closed, and the hidden request never reaches the app."""
    parser, port, app = served
    smuggled = f"/smuggled-{name}"
    if extra is None:
        first = f"POST /first HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 0\r\n\r\n".encode()
    else:
        first = head(port, "/first", extra, method="POST") + rest
    with connect_to(port) as s:
        s.sendall(first + head(port, smuggled))
        s.settimeout(30)
        reply = s.recv(4096)
        assert reply.startswith(b"HTTP/1.1 400"), (parser, reply[:120])
        assert closed(s)
    assert smuggled not in app.paths and "/first" not in app.paths


def test_bodies_over_the_limit_are_413_declared_or_streamed(served):
    parser, port, app = served
    with connect_to(port) as s:  # declared
        s.sendall(head(port, "/big", f"Content-Length: {MAX_BODY + 1}\r\n", method="POST") + b"x" * 100)
        [(status, body)] = read_responses(s, 1)
        assert status == 413 and json.loads(body)["detail"]["kind"] == "too_large"
    with connect_to(port) as s:  # chunked, without a length: cut once past the limit
        s.sendall(head(port, "/stream", "Transfer-Encoding: chunked\r\n", method="POST"))
        with contextlib.suppress(OSError):  # the server may stop reading once it has refused
            for _ in range(2 * MAX_BODY // 1024):
                s.sendall(b"400\r\n" + b"y" * 1024 + b"\r\n")
        [(status, body)] = read_responses(s, 1)
        assert status == 413 and json.loads(body)["detail"]["kind"] == "too_large", parser
    assert "/big" not in app.paths


# ------------------------------------------------------------------ WebSocket
async def test_websockets_upgrade_through_either_protocol_and_big_frames_close(served):
    _, port, _ = served
    url = f"ws://127.0.0.1:{port}/ws"
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with connect(url, additional_headers=headers, max_size=None) as ws:
        await ws.send("hello")
        assert await ws.recv() == "hello"
        await ws.send("x" * (MAX_BODY + 1))
        with pytest.raises(ConnectionClosed) as e:
            await ws.recv()
    assert e.value.rcvd is not None and e.value.rcvd.code == 1009


# ------------------------------------------------------------------ any head: an answer, never a 500
@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    name=st.binary(min_size=1, max_size=12),
    value=st.binary(max_size=40),
    method=st.sampled_from(["GET", "POST", "G ET", "\x00"]),
)
def test_any_header_bytes_get_a_4xx_or_the_app_never_a_500(served, name, value, method):
    parser, port, app = served
    raw = f"{method} /any HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {TOKEN}\r\n".encode()
    raw += name + b": " + value + b"\r\nContent-Length: 0\r\n\r\n"
    with connect_to(port) as s:
        s.sendall(raw)
        s.settimeout(30)
        reply = b""
        with contextlib.suppress(OSError):
            while b"\r\n" not in reply:
                chunk = s.recv(4096)
                if not chunk:
                    break
                reply += chunk
    assert reply, (parser, raw)
    status = int(reply.split(b" ")[1])
    assert status == 200 or 400 <= status < 500, (parser, raw, reply[:120])
