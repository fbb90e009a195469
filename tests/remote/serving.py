"""Test helpers for ``turngym serve``: a real uvicorn server in a thread or the real CLI in a process,
both on loopback, behind the guard with this module's tokens; clients that send them."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from turngym.remote.security import ServeGuard, uvicorn_limits
from turngym.remote.server import SessionManager, create_app

ROOT = Path(__file__).resolve().parents[2]
#: the tokens of the servers these helpers start; RemoteEnv reads them from the environment
TOKEN = "client-token-for-tests-0123456789"
TRAINER = "trainer-token-for-tests-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TRAINER_AUTH = {"Authorization": f"Bearer {TRAINER}"}


class ServerThread:
    """A uvicorn server in a thread, on a free port of 127.0.0.1, behind the guard ``turngym serve``
    builds (client token :data:`TOKEN`, trainer token :data:`TRAINER`) and with its uvicorn limits."""

    def __init__(
        self,
        manager: SessionManager,
        *,
        limits: dict | None = None,
        guard: ServeGuard | None = None,
        token: str | None = TOKEN,
        **app_kwargs,
    ):
        import uvicorn

        self.manager = manager
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.guard = guard or ServeGuard.for_bind("127.0.0.1", self.port, token, trainer_token=TRAINER)
        app = create_app(manager, guard=self.guard, **app_kwargs)
        config = uvicorn.Config(app, log_level="warning", **(uvicorn_limits() if limits is None else limits))
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()
        self.sock.close()


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_cli_server(port: int, *args: str, env: dict | None = None, preexec_fn=None) -> subprocess.Popen:
    """``turngym serve ARGS --port PORT`` in a process of its own; returns once ``/health`` answers."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "turngym.cli", "serve", *args, "--port", str(port), "--log-level", "warning"],
        env={**(os.environ if env is None else env), "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=preexec_fn,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, proc.stdout.read().decode()
        assert time.monotonic() < deadline, "turngym serve did not come up"
        time.sleep(0.1)


def stop(proc: subprocess.Popen) -> str:
    """Kill the server's process group; its output."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=30)
    return out.decode(errors="replace") if out else ""


def with_token(url: str, token: str = TOKEN) -> str:
    """``http://user:<token>@host:port``: clients that take only a URL (openenv-core's) send it as
    HTTP Basic, which the guard accepts with the token as the password."""
    return url.replace("://", f"://turngym:{token}@", 1)


@contextlib.asynccontextmanager
async def mcp_client(url: str, headers: dict | None = None, **kwargs):
    """The MCP SDK's client on ``url/mcp`` over streamable HTTP, sending ``headers`` (the token)."""
    from mcp.client.client import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async with create_mcp_http_client(AUTH if headers is None else headers) as http:
        async with Client(streamable_http_client(url + "/mcp", http_client=http), **kwargs) as client:
            yield client
