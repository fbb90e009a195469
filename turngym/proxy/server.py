"""The proxy's HTTP front: OpenAI routes, episode routes, the guard, and a server to run it in.

Routes (``{e}``: an episode key, 1-128 characters of ``[A-Za-z0-9_.:@-]``):

* ``POST /v1/chat/completions``, ``POST /v1/completions`` (``turngym.proxy.calls``, ahead of the
  FastAPI app), ``GET /v1/models``, each also under ``/v1/episodes/{e}/`` (give the harness
  ``base_url=http://HOST:PORT/v1/episodes/{e}``);
* ``GET /v1/episodes`` (live and finished keys), ``GET /v1/episodes/{e}`` (the record so far, or the
  finished trajectory), ``POST /v1/episodes/{e}/reward`` (``{"reward": 1.0, "components": {...},
  "end": true}``), ``POST /v1/episodes/{e}`` (open it with ``task_id``/``group``/``sample``/``metadata``),
  ``POST /v1/episodes/{e}/end`` (``{"mask": "reason"}`` to mask it); ``GET /health`` (no token).

The episode of a call outside ``/v1/episodes/{e}/``: the ``X-Turngym-Episode`` header, else an API key
of the form ``TOKEN@EPISODE`` (the guard sees only ``TOKEN``), else, without a token
(``--insecure-no-token``), the API key itself; else the episode ``default``.

Security is ``turngym serve``'s (``turngym.remote.security``): loopback bind by default, the token as
the OpenAI API key (``Authorization: Bearer``), Host and Origin checks, body caps. ``ProxyServer``
runs uvicorn on uvloop where installed and keeps the heap it starts with out of the garbage
collector's passes while it serves (``_hold_heap``). Errors are OpenAI-style JSON (``{"error": {"message", "type", "param", "code"}}``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import socket
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from turngym.proxy.calls import EPISODE_SCOPE_KEY, call_routes
from turngym.proxy.episodes import Episode
from turngym.proxy.service import Proxy
from turngym.proxy.wire import ProxyError
from turngym.remote.security import ServeGuard, guard_app


async def _body(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ProxyError(400, f"the body is not JSON: {e}") from None


def _summary(ep: Episode) -> dict[str, Any]:
    return {
        "episode": ep.key,
        "status": "ended" if ep.ended_at is not None else "live",
        "calls": len(ep.calls),
        "segments": ep.segments,
        "drifts": [r.drift.to_dict() | {"call": r.index} for r in ep.calls if r.drift],
        "reward": ep.reward,
        "task_id": ep.task_id,
    }


def create_app(proxy: Proxy, *, envs: Any = None, sweep_every_s: float = 1.0) -> FastAPI:
    """The FastAPI app (unguarded: :func:`guarded_app` puts it behind a ``ServeGuard``); ``envs``: an
    ``EpisodeSessions`` whose env tools are served over MCP per episode (``turngym.proxy.envs``)."""
    env_lifespan = None
    routes: list[Any] = []
    if envs is not None:
        from turngym.proxy.envs import env_routes

        routes, env_lifespan = env_routes(envs)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        async def sweeper() -> None:
            while True:
                await asyncio.sleep(sweep_every_s)
                await proxy.store.sweep()

        task = asyncio.create_task(sweeper())
        async with contextlib.AsyncExitStack() as stack:
            if envs is not None:
                envs.start()
                stack.push_async_callback(envs.shutdown)
                await stack.enter_async_context(env_lifespan())
            try:
                yield
            finally:
                task.cancel()
                for key in list(proxy.store.live):
                    ep = proxy.store.live[key]
                    await proxy.store.finish(ep, "" if ep.reward is not None else "proxy_stopped: no reward")

    app = FastAPI(title="turngym proxy", lifespan=lifespan)
    app.state.proxy = proxy
    app.router.routes.extend(routes)

    @app.exception_handler(ProxyError)
    async def _error(request: Request, e: ProxyError) -> JSONResponse:
        return JSONResponse(status_code=e.status, content=e.body())

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"ok": True, "model": proxy.model.name, "live": len(proxy.store.live)}

    async def models() -> dict[str, Any]:
        from openai.types import Model

        data = [
            Model(id=name, created=0, object="model", owned_by="turngym")
            for name in sorted(proxy.model.names)
        ]
        return {"object": "list", "data": [m.model_dump() for m in data]}

    for prefix in ("/v1", "/v1/episodes/{episode}"):
        app.add_api_route(f"{prefix}/models", models, methods=["GET"])

    @app.get("/v1/episodes")
    async def episodes() -> dict[str, Any]:
        return {"live": sorted(proxy.store.live), "finished": sorted(proxy.store.finished)}

    @app.get("/v1/episodes/{episode}")
    async def episode(episode: str) -> Any:
        got = proxy.store.get(episode)
        if isinstance(got, Episode):
            return _summary(got)
        return {"episode": episode, "status": "finished", "trajectory": json.loads(got.to_json())}

    @app.post("/v1/episodes/{episode}/reward")
    async def reward(request: Request, episode: str) -> Any:
        body = await _body(request)
        if not isinstance(body, dict) or not isinstance(body.get("reward"), (int, float)):
            raise ProxyError(400, 'the body must be {"reward": <number>, ...}', param="reward")
        comps = body.get("components") or {}
        if not isinstance(comps, dict) or not all(isinstance(v, (int, float)) for v in comps.values()):
            raise ProxyError(400, "components must map names to numbers", param="components")
        end = body.get("end", True)
        if not isinstance(end, bool):
            raise ProxyError(400, "end must be a boolean", param="end")
        ep = await proxy.store.set_reward(episode, float(body["reward"]), comps, end=end)
        return _summary(ep) | {"status": "finished" if ep.finished else "live"}

    @app.post("/v1/episodes/{episode}")
    async def open_episode(request: Request, episode: str) -> Any:
        body = await _body(request) if await request.body() else {}
        fields = {k: body[k] for k in ("task_id", "group", "sample", "metadata") if k in body}
        kinds = {"task_id": str, "group": str, "sample": int, "metadata": dict}
        for k, v in fields.items():
            if not isinstance(v, kinds[k]):
                raise ProxyError(400, f"{k} must be a {kinds[k].__name__}", param=k)
        if episode in proxy.store.live:
            raise ProxyError(
                409, f"episode {episode!r} is already open", param="episode", code="episode_exists"
            )
        return _summary(proxy.store.open(episode, **fields))

    @app.post("/v1/episodes/{episode}/end")
    async def end(request: Request, episode: str) -> Any:
        body = await _body(request) if await request.body() else {}
        mask = body.get("mask", "") if isinstance(body, dict) else None
        if not isinstance(mask, str):
            raise ProxyError(400, "mask must be a string (the reason)", param="mask")
        ep = await proxy.store.end(episode, "harness", mask=mask)
        return _summary(ep) | {"status": "finished" if ep.finished else "ended"}

    return app


def episode_from_api_key(app: Any, *, token_required: bool) -> Any:
    """ASGI middleware (outside the guard): an API key ``TOKEN@EPISODE`` becomes the token for the
    guard and the episode for the routes; without a token, the whole API key is the episode."""

    async def wrapped(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = list(scope.get("headers") or [])
            for i, (name, value) in enumerate(headers):
                if bytes(name).lower() != b"authorization":
                    continue
                scheme, _, cred = bytes(value).decode("latin-1").strip().partition(" ")
                if scheme.lower() != "bearer":
                    break
                token, at, key = cred.strip().rpartition("@")
                if at and token and key:
                    scope = {**scope, EPISODE_SCOPE_KEY: key}
                    headers[i] = (b"authorization", f"Bearer {token}".encode("latin-1"))
                    scope["headers"] = headers
                elif not token_required and cred.strip():
                    scope = {**scope, EPISODE_SCOPE_KEY: cred.strip()}
                break
        await app(scope, receive, send)

    return wrapped


def guarded_app(proxy: Proxy, guard: ServeGuard, **kwargs: Any) -> Any:
    """The app behind ``guard`` (``/health`` open), with episode keys read from API keys; ``kwargs``
    go to :func:`create_app`."""
    inner = guard_app(call_routes(create_app(proxy, **kwargs), proxy), guard, open_paths=("/health",))
    return episode_from_api_key(inner, token_required=guard.token is not None)


class ProxyServer:
    """A uvicorn server in a background thread, its socket bound at construction (so ``port=0`` has its
    real port before the app, whose guard needs it, is built).

        with ProxyServer(port=0) as server:
            server.start(guarded_app(proxy, ServeGuard.for_bind(server.host, server.port, token)))
            client = OpenAI(base_url=server.url + "/v1", api_key=token)
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.host = host
        self.port = self.sock.getsockname()[1]
        self.server: Any = None
        self.http_parser: str | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self, app: Any, **uvicorn_kwargs: Any) -> ProxyServer:
        import uvicorn

        from turngym.remote.security import uvicorn_limits

        # uvloop where installed (its socket I/O is the larger part of a short call's CPU); no
        # X-Forwarded-For rewriting (a loopback server has no proxy in front); no access log
        options = {"loop": _loop(), "proxy_headers": False, "access_log": False, **uvicorn_limits()}
        config = uvicorn.Config(app, log_level="warning", **{**options, **uvicorn_kwargs})
        #: the HTTP/1.1 parser serving (``h11`` or ``httptools``; ``$TURNGYM_HTTP`` picks)
        self.http_parser = getattr(config.http, "http_parser", str(config.http))
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True, name="turngym-proxy"
        )
        _hold_heap()
        self._thread.start()
        for _ in range(600):  # up to 60 s
            if self.server.started:
                return self
            if not self._thread.is_alive():
                raise RuntimeError("the proxy server failed to start")
            time.sleep(0.1)
        raise RuntimeError("the proxy server did not start within 60 s")

    def stop(self) -> None:
        if self.server is not None and self._thread is not None:
            self.server.should_exit = True
            self._thread.join(timeout=30)
            self._thread = None
            _release_heap()
        self.sock.close()

    def __enter__(self) -> ProxyServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _loop() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


_held = [0, False]  # servers running in this process; whether their first froze the heap
_held_lock = threading.Lock()


def _hold_heap() -> None:
    """Leave the heap as it is when the first server starts (the model, the tokenizer, the
    libraries: ~460k objects with the tiny model) out of the garbage collector's passes while
    servers run. A full pass over it takes ~250 ms of one event loop's time, during which every
    episode waits; what the calls allocate is still collected. Garbage is collected first, and the
    heap is handed back (``gc.unfreeze``) when the last server stops, so a long-lived process (the
    trainer) collects it as before. A process that froze its heap itself is left as it is."""
    with _held_lock:
        _held[0] += 1
        if _held[0] == 1 and gc.get_freeze_count() == 0:
            gc.collect()
            gc.freeze()
            _held[1] = True


def _release_heap() -> None:
    with _held_lock:
        _held[0] -= 1
        if _held[0] == 0 and _held[1]:
            gc.unfreeze()
            _held[1] = False
