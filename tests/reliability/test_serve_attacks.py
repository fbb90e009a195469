"""Attacks on ``turngym serve``, each reproduced against a real server on loopback (uvicorn in a thread,
or the real CLI in a process) with real clients (httpx, a websockets client sending an evil
``Origin``, the MCP SDK's client), and each refused now:

* the RCE through ``mcp``'s ``servers`` kwarg, the host-file read through swe-docker's ``snapshot``,
  and their siblings (``cache_dir``, ``retriever``, ``image``, ``pool_warm``): 403, nothing runs,
  and allow-listing one is refused when the server starts;
* a cross-origin WebSocket (a web page on ``http://evil.example``) and DNS rebinding (a foreign
  ``Host``): 403 at the handshake, token or not;
* no token, a wrong one: 401 saying how to authenticate; ``turngym serve ENV`` with no flags prints a
  generated token and refuses an unauthenticated request;
* malformed env ids and kwargs: typed 4xx, never 500; big bodies and frames: 413 / close 1009; a
  big bad input is never echoed back whole; stateless OpenEnv ``/step`` errors are JSON;
* the gold ``reference`` and the expert's action reach trainers only (HTTP, WebSocket, MCP);
* a sessionless MCP client no longer leaks a session per episode;
* idle sockets past the file-descriptor limit no longer starve ``/health``.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import time

import httpx
import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")
pytest.importorskip("websockets")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from remote.serving import (  # noqa: E402
    AUTH,
    TOKEN,
    TRAINER,
    TRAINER_AUTH,
    ServerThread,
    free_port,
    mcp_client,
    start_cli_server,
    stop,
    with_token,
)
from websockets.asyncio.client import connect  # noqa: E402
from websockets.exceptions import ConnectionClosed, InvalidStatus  # noqa: E402

import turngym  # noqa: E402
from turngym.remote import RemoteEnv, RemoteEnvError  # noqa: E402
from turngym.remote.security import ServeGuard, uvicorn_limits  # noqa: E402
from turngym.remote.server import SessionManager  # noqa: E402

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(300)]

EVIL = "http://evil.example"
TASKS = [{"prompt": "q", "answers": ["a"]}]  # with servers=, mcp needs tasks= to start them
#: (env, kwarg, value): each made the server run, read, write or fetch on the host before the fix
HOSTILE_KWARGS = [
    ("mcp", "servers", [{"name": "x", "command": "sh", "args": ["-c", "id > {marker}"]}]),
    ("swe-docker", "snapshot", "/etc"),
    ("swe-docker", "image", "attacker/image:latest"),
    ("swe-docker", "pool_warm", 6),
    ("swe-docker", "packages", ["evil-package"]),
    ("search-qa", "cache_dir", "/tmp/written-by-a-client"),
    ("search-qa", "retriever", "http://169.254.169.254/latest/meta-data"),
    ("search-qa", "corpus", "/etc/passwd"),
    ("search-qa", "n_passages", 10**9),
    ("travel-planner", "db_path", "/etc/shadow"),
]


@pytest.fixture(scope="module")
def server():
    manager = SessionManager(
        ["arith", "mcp", "swe-docker", "search-qa", "travel-planner"],
        max_sessions=8,
        idle_timeout=60,
        client_args={"arith": ["depth"]},
    )
    with ServerThread(manager, mcp=True) as served:
        yield served
    assert manager.sessions == {}


def _kind(r: httpx.Response) -> str:
    return r.json()["detail"]["kind"]


# ------------------------------------------------------------------ client kwargs
@pytest.mark.parametrize(("env_id", "name", "value"), HOSTILE_KWARGS)
def test_hostile_make_arguments_are_refused_and_nothing_runs(server, tmp_path, env_id, name, value):
    marker = tmp_path / "pwned"
    if name == "servers":
        value = [{"name": "x", "command": "sh", "args": ["-c", f"id > {marker}"]}]
    body = {"env_id": env_id, "kwargs": {name: value, **({"tasks": TASKS} if name == "servers" else {})}}
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as http:
        r = http.post("/sessions", json=body)
        assert r.status_code == 403 and _kind(r) == "forbidden_arg", r.text
        assert name in r.json()["detail"]["error"]
        r = http.post("/sessions", json=body, headers=TRAINER_AUTH)  # a trainer may not either
        assert r.status_code == 403 and _kind(r) == "forbidden_arg"
    assert not marker.exists() and server.manager.sessions == {}


async def test_hostile_make_arguments_over_the_websocket_are_refused_too(server, tmp_path):
    marker = tmp_path / "pwned"
    frame = {"id": 1, "op": "create", "data": {"env_id": "mcp", "kwargs": HOSTILE_KWARGS[0][2]}}
    frame["data"]["kwargs"] = {
        "servers": [{"name": "x", "command": "sh", "args": ["-c", f"id > {marker}"]}],
        "tasks": TASKS,
    }
    async with connect(server.url.replace("http", "ws") + "/ws", additional_headers=AUTH) as ws:
        await ws.send(json.dumps(frame))
        reply = json.loads(await ws.recv())
    assert reply["ok"] is False and reply["error"]["kind"] == "forbidden_arg"
    assert not marker.exists()


@pytest.mark.parametrize(("env_id", "name", "_"), HOSTILE_KWARGS)
def test_allow_listing_a_never_settable_argument_is_refused_at_start(env_id, name, _):
    with pytest.raises(ValueError, match="never client-settable"):
        SessionManager([env_id], client_args={env_id: [name]})


def test_allow_listed_arguments_are_type_checked_and_the_operators_win(server):
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as http:
        r = http.post(
            "/sessions", json={"env_id": "arith", "kwargs": {"depth": {"a": 1}}}
        )  # a dict for an int
        assert r.status_code == 400 and _kind(r) == "bad_request" and "depth" in r.json()["detail"]["error"]
        r = http.post("/sessions", json={"env_id": "arith", "kwargs": {"depth": 2}})
        assert r.status_code == 200
        http.delete(f"/sessions/{r.json()['session_id']}")
        r = http.post("/sessions", json={"env_id": "arith", "kwargs": {"tool_reward": 5.0}})  # not listed
        assert r.status_code == 403 and "--client-arg tool_reward" in r.json()["detail"]["error"]
    manager = SessionManager(["arith"], env_kwargs={"depth": 1}, client_args=["depth"])
    with ServerThread(manager) as fixed, httpx.Client(base_url=fixed.url, headers=AUTH) as http:
        r = http.post("/sessions", json={"env_id": "arith", "kwargs": {"depth": 3}})
        assert r.status_code == 403 and "set by the server's operator" in r.json()["detail"]["error"]
        r = http.post("/sessions", json={"env_id": "arith", "kwargs": {"depth": 1}})  # the same value: fine
        assert r.status_code == 200
        http.delete(f"/sessions/{r.json()['session_id']}")


# ------------------------------------------------------------------ token, Host, Origin
def test_no_token_or_a_wrong_one_is_refused_saying_how_to_authenticate(server):
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.get("/health").status_code == 200  # the one open route
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {TOKEN[:-1]}"}):
            r = http.post("/sessions", json={"env_id": "arith"}, headers=headers)
            assert r.status_code == 401 and _kind(r) == "unauthorized"
            assert "Authorization: Bearer <token>" in r.json()["detail"]["error"]
            assert r.headers["www-authenticate"].startswith("Bearer")
        for path in ("/mcp", "/sessions/x/step"):
            assert http.post(path, json={}).status_code == 401
    with pytest.raises(RemoteEnvError, match="Authorization: Bearer") as e:
        RemoteEnv(server.url, token="not-the-token-0123456789")
    assert e.value.kind == "unauthorized"


async def test_cross_origin_websocket_and_dns_rebinding_are_refused_at_the_handshake(tmp_path):
    """A page on evil.example opens ws://127.0.0.1:PORT/ws (the browser sends its Origin, no token);
    with DNS rebinding it reaches the port under its own name (a foreign Host). Both are refused even
    on a server started with --insecure-no-token, and nothing runs."""
    marker = tmp_path / "pwned"
    frame = json.dumps(
        {
            "id": 1,
            "op": "create",
            "data": {
                "env_id": "mcp",
                "kwargs": {
                    "servers": [{"name": "x", "command": "sh", "args": ["-c", f"id > {marker}"]}],
                    "tasks": TASKS,
                },
            },
        }
    )
    manager = SessionManager(["arith", "mcp"], max_sessions=4, idle_timeout=60)
    with ServerThread(manager, token=None) as open_server:  # --insecure-no-token
        ws_url = open_server.url.replace("http", "ws") + "/ws"
        host = f"127.0.0.1:{open_server.port}"
        evil_url = f"ws://evil.example:{open_server.port}/ws"  # DNS rebinding: the page's own name
        attempts = [(ws_url, {"Origin": EVIL}), (ws_url, {"Origin": "null"}), (evil_url, {}), (evil_url, {})]
        attempts[2][1]["Origin"] = f"{EVIL}:{open_server.port}"
        for url, headers in attempts:
            with pytest.raises(InvalidStatus) as e:
                sock = socket.create_connection(("127.0.0.1", open_server.port), timeout=10)
                async with connect(url, additional_headers=headers, sock=sock) as ws:
                    await ws.send(frame)
            assert e.value.response.status_code == 403
            kind = json.loads(bytes(e.value.response.body))["detail"]["kind"]
            assert kind == ("forbidden_host" if url == evil_url else "forbidden_origin")
        async with connect(ws_url, additional_headers={"Origin": f"http://{host}"}) as ws:  # same origin
            await ws.send(json.dumps({"id": 2, "op": "create", "data": {"env_id": "arith"}}))
            assert json.loads(await ws.recv())["ok"] is True
        r = httpx.post(open_server.url + "/sessions", json={}, headers={"Origin": EVIL})
        assert r.status_code == 403 and _kind(r) == "forbidden_origin"
    assert not marker.exists()


def test_insecure_no_token_needs_a_loopback_bind():
    with pytest.raises(ValueError, match="loopback"):
        ServeGuard.for_bind("0.0.0.0", 8000, None)
    port = free_port()
    proc = None
    try:
        import subprocess
        import sys

        from remote.serving import ROOT

        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "turngym.cli",
                "serve",
                "arith",
                "--host",
                "0.0.0.0",
                "--insecure-no-token",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert out.returncode == 2 and "loopback" in out.stdout + out.stderr
        proc = start_cli_server(port, "arith", "--insecure-no-token")
        assert httpx.post(f"http://127.0.0.1:{port}/sessions", json={}).status_code == 200
        assert (
            httpx.post(f"http://127.0.0.1:{port}/sessions", json={}, headers={"Origin": EVIL}).status_code
            == 403
        )
    finally:
        output = stop(proc) if proc is not None else ""
    assert "WARNING" in output and "--insecure-no-token" in output


def test_serve_with_no_flags_prints_a_token_and_refuses_unauthenticated_requests():
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNGYM_SERVE_")}
    port = free_port()
    proc = start_cli_server(port, "arith", env=env)
    try:
        r = httpx.post(f"http://127.0.0.1:{port}/sessions", json={"env_id": "arith"})
        assert r.status_code == 401 and "Authorization: Bearer <token>" in r.json()["detail"]["error"]
        assert "TURNGYM_SERVE_TOKEN" in r.json()["detail"]["error"]
    finally:
        output = stop(proc)
    (line,) = [x for x in output.splitlines() if x.startswith("token (generated")]
    token = line.rsplit(" ", 1)[1]
    assert len(token) >= 32 and "Authorization: Bearer" in output


# ------------------------------------------------------------------ malformed input, sizes, excerpts
@pytest.mark.parametrize(
    "env_id", ["../", "os:system", "", "\x00", "arith\x00", "ARITH", "a/b/c", "x" * 5000]
)
def test_malformed_env_ids_are_a_typed_4xx(server, env_id):
    r = httpx.post(server.url + "/sessions", json={"env_id": env_id}, headers=AUTH, timeout=30)
    assert r.status_code in (404, 422) and _kind(r) in {"malformed", "unknown_env"}, r.text
    assert len(r.content) < 2_000  # the 5,000-character id is not echoed back whole


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    env_id=st.text(max_size=30),
    kwargs=st.dictionaries(st.text(max_size=12), st.integers() | st.text(max_size=8)),
)
def test_any_env_id_and_kwargs_get_a_4xx_or_a_session_never_a_500(server, env_id, kwargs):
    r = httpx.post(
        server.url + "/sessions", json={"env_id": env_id, "kwargs": kwargs}, headers=AUTH, timeout=30
    )
    assert r.status_code in (200, 400, 403, 404, 422), r.text
    if r.status_code == 200:
        httpx.delete(f"{server.url}/sessions/{r.json()['session_id']}", headers=AUTH)


def test_big_bodies_are_refused_and_big_bad_input_is_not_echoed(server):
    limit = server.guard.max_body_bytes
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:  # declared 50 MB
        s.sendall(
            f"POST /sessions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {50 * 2**20}\r\n\r\n".encode()
            + b"{" * 1000
        )
        head = s.recv(4096).decode()
    assert head.startswith("HTTP/1.1 413") and "too_large" in head
    r = httpx.post(  # streamed without a length: cut once past the limit
        server.url + "/sessions",
        content=(b" " * 65536 for _ in range(limit // 65536 + 8)),
        headers={**AUTH, "content-type": "application/json"},
        timeout=30,
    )
    assert r.status_code == 413 and _kind(r) == "too_large"
    big = "k" * (3 * 2**19)  # a 1.5 MB bad kwarg name and value: 3 MB, under the body limit
    r = httpx.post(server.url + "/sessions", json={"env_id": "arith", "kwargs": {big: big}}, headers=AUTH)
    assert r.status_code == 403 and len(r.content) < 2_000
    r = httpx.post(server.url + "/sessions", json={"env_id": "arith", "kwargs": {"depth": big}}, headers=AUTH)
    assert r.status_code == 400 and len(r.content) < 2_000


async def test_a_frame_over_the_limit_closes_the_websocket(server):
    async with connect(
        server.url.replace("http", "ws") + "/ws", additional_headers=AUTH, max_size=None
    ) as ws:
        await ws.send("x" * (server.guard.max_frame_bytes + 1))
        with pytest.raises(ConnectionClosed) as e:
            await ws.recv()
    assert e.value.rcvd is not None and e.value.rcvd.code == 1009


# ------------------------------------------------------------------ privileged info
def test_reference_and_expert_go_to_trainers_only(server):
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for headers, trainer in ((AUTH, False), (TRAINER_AUTH, True)):
            sid = http.post("/sessions", json={"env_id": "arith"}, headers=headers).json()["session_id"]
            info = http.post(f"/sessions/{sid}/reset", json={"seed": 0}, headers=headers).json()["info"]
            step = http.post(f"/sessions/{sid}/step", json={"action": "no call"}, headers=headers).json()
            expert = http.get(f"/sessions/{sid}/expert", headers=headers)
            assert ("reference" in info) is trainer and ("reference" in step["info"]) is trainer
            assert info.get("task_id") and "turn" in step["info"]  # the rest of the info is there
            assert expert.status_code == (200 if trainer else 403)
            if not trainer:
                assert _kind(expert) == "trainer_only"
            http.delete(f"/sessions/{sid}", headers=headers)


async def test_remote_env_with_the_client_token_gets_no_reference(server):
    remote = RemoteEnv(server.url, env_id="arith", token=TOKEN)
    trainer = RemoteEnv(server.url, env_id="arith", token=TRAINER)
    try:
        _, info = await remote.areset(seed=0)
        _, tinfo = await trainer.areset(seed=0)
        assert (
            "reference" not in info
            and tinfo["reference"]["answer"] == turngym.make("arith").reset(seed=0)[1]["reference"]["answer"]
        )
        with pytest.raises(RemoteEnvError, match="trainer") as e:
            await remote.expert_action()
        assert e.value.kind == "trainer_only"
    finally:
        await remote.aclose()
        await trainer.aclose()


# ------------------------------------------------------------------ MCP front door
async def test_mcp_reset_sends_no_reference_to_a_client_and_sessionless_episodes_do_not_leak():
    manager = SessionManager(["arith"], max_sessions=2, idle_timeout=60)
    with ServerThread(manager, mcp=True) as served:
        async with mcp_client(served.url) as client:  # sessionless (protocol 2026-07-28)
            episodes = []
            for seed in range(6):  # more episodes than max_sessions: each finished one is closed
                reply = await client.call_tool("reset", {"seed": seed})
                assert not reply.is_error, reply.content[0].text
                assert "reference" not in reply.structured_content["info"]
                episode = reply.structured_content["episode_id"]
                episodes.append(episode)
                done = await client.call_tool("answer", {"value": 0, "episode_id": episode})
                assert done.structured_content["terminated"] is True
                assert len(manager.sessions) <= 2
            again = await client.call_tool("reset", {"seed": 9, "episode_id": episodes[-1]})  # reuse it
            assert again.structured_content["episode_id"] == episodes[-1] and len(manager.sessions) == 1
        async with mcp_client(served.url, headers=TRAINER_AUTH, mode="legacy") as trainer:
            reply = await trainer.call_tool("reset", {"seed": 0})
            assert "answer" in reply.structured_content["info"]["reference"]
        before = manager.stats.opened
        with pytest.raises(Exception, match="error"):  # noqa: B017 - the SDK's own error for the 401
            async with mcp_client(served.url, headers={}) as nobody:
                await nobody.call_tool("reset", {})
        assert manager.stats.opened == before


# ------------------------------------------------------------------ OpenEnv front door
@pytest.mark.slow
def test_stateless_openenv_step_errors_are_json():
    manager = SessionManager(["arith"], max_sessions=4, idle_timeout=60)
    with (
        ServerThread(manager, openenv=True) as served,
        httpx.Client(base_url=served.url, headers=AUTH) as http,
    ):
        r = http.post("/openenv/step", json={"action": {"content": "hi"}})  # a fresh env: never reset
        assert 400 <= r.status_code < 500, r.text
        assert r.headers["content-type"].startswith("application/json") and r.json()["detail"]["kind"]
        assert httpx.post(served.url + "/openenv/step", json={"action": {"content": "hi"}}).status_code == 401
        r = httpx.get(with_token(served.url) + "/openenv/schema")  # URL-only clients: token as Basic password
        assert r.status_code == 200
    wait = time.monotonic() + 30
    while manager.sessions and time.monotonic() < wait:
        time.sleep(0.05)
    assert manager.sessions == {}


# ------------------------------------------------------------------ idle sockets
@pytest.mark.parametrize("parser", ["h11", "httptools"])
def test_idle_sockets_past_the_fd_limit_do_not_starve_health(parser):
    """Many idle sockets against a server whose file-descriptor limit is low (256 here, 1024 in the
    report): the connection cap closes the excess at once, the header deadline the rest, and
    ``/health`` answers, with either HTTP parser. Before: accept() failed with EMFILE and /health hung."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 600:
        pytest.skip(f"this test opens 300 sockets; the fd limit here is {soft}")

    def low_fd_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))

    port = free_port()
    proc = start_cli_server(
        port,
        "arith",
        "--token",
        TOKEN,
        "--header-timeout",
        "1",
        preexec_fn=low_fd_limit,
        env={**os.environ, "TURNGYM_HTTP": parser},
    )
    idle: list[socket.socket] = []
    try:
        for _ in range(300):  # bounded: 300 connections, each opened once, never written to
            try:
                idle.append(socket.create_connection(("127.0.0.1", port), timeout=10))
            except OSError:
                break
        answered = None
        for _ in range(60):  # bounded retries: the idle sockets are closed within about a second
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
                if r.status_code == 200:
                    answered = r.json()
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        assert answered is not None and answered["status"] == "ok"
        closed = 0
        for s in idle:  # the server closed every idle socket (a 503 first for those past the cap)
            s.settimeout(10)
            try:
                data = s.recv(1024)
                while data:
                    data = s.recv(1024)
                closed += 1
            except OSError:
                closed += 1
        assert closed == len(idle) >= 250
        limits = uvicorn_limits(http=parser)
        assert limits["limit_concurrency"] and limits["h11_max_incomplete_event_size"] == 16 * 1024
    finally:
        for s in idle:
            s.close()
        out = stop(proc)
    assert f"HTTP parser: {parser}" in out
