"""``turngym serve``: registered envs over HTTP and WebSocket, many sessions per server.

    app = create_app(SessionManager(["arith"], max_sessions=64, idle_timeout=600))
    uvicorn.run(app, port=8000)

* Each session is one env (``make(env_id, **kwargs)``), driven through ``areset``/``astep``/``aclose``
  on the server's event loop; calls on one session are serialized, sessions run concurrently.
* Sessions a websocket opens belong to it and are closed when it closes (a client that disconnects
  mid-episode leaks nothing); every session, HTTP or WebSocket, is closed after ``idle_timeout``
  seconds without a call. ``max_sessions`` bounds live envs: one more is refused with ``server_full``.
* ``fork`` (envs whose family can fork) makes a new session in the same state; over a websocket the
  fork is left unowned until a connection ``attach``-es it (:class:`~turngym.remote.client.RemoteEnv`
  forks that way), so closing the parent's connection does not close the child.
* Errors are typed (:data:`~turngym.remote.protocol.ERROR_STATUS`): unknown session or env, env not
  served here, malformed request, server full, env not forkable, the env refusing a call.
* Optional front doors on the same port: ``/openenv`` speaks OpenEnv's wire protocol
  (:mod:`turngym.remote.openenv`; off by default: importing openenv-core imports gradio, ~10 s),
  ``/mcp`` serves the env's tools over MCP (:mod:`turngym.remote.mcp`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.websockets import WebSocketDisconnect

from turngym.core.env import ForkError, NotForkable
from turngym.core.registry import UnknownEnvError, make, spec
from turngym.remote.protocol import (
    ERROR_STATUS,
    AttachRequest,
    Closed,
    CreateSession,
    ErrorBody,
    ExpertReply,
    Health,
    LimitTurns,
    LimitTurnsReply,
    ResetReply,
    ResetRequest,
    ServeError,
    SessionInfo,
    StepReply,
    StepRequest,
    ToolsReply,
    WsReply,
    WsRequest,
    info_to_wire,
    jsonable,
)

log = logging.getLogger(__name__)


@dataclass
class Session:
    id: str
    env_id: str
    env: Any
    owner: object | None = None  # the websocket connection that owns it; None: HTTP or unattached fork
    last_used: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def base(self) -> Any:
        return getattr(self.env, "unwrapped", self.env)


@dataclass
class ServeStats:
    opened: int = 0
    closed: int = 0
    closed_idle: int = 0
    closed_disconnect: int = 0
    refused_full: int = 0
    close_errors: int = 0


class SessionManager:
    """The live sessions of one server, with the limits and the idle reaper."""

    def __init__(
        self,
        envs: list[str],
        *,
        max_sessions: int = 64,
        idle_timeout: float | None = 600.0,
        env_kwargs: dict[str, Any] | None = None,
    ):
        if not envs:
            raise ValueError("serve at least one env id")
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        if idle_timeout is not None and idle_timeout <= 0:
            raise ValueError(f"idle_timeout must be > 0 seconds (or None), got {idle_timeout}")
        self.envs = [spec(e).id for e in envs]  # UnknownEnvError names close matches
        self.max_sessions = max_sessions
        self.idle_timeout = idle_timeout
        self.env_kwargs = dict(env_kwargs or {})
        self.sessions: dict[str, Session] = {}
        self.stats = ServeStats()
        self._opening = 0  # slots reserved by sessions being built
        self._reaper: asyncio.Task | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the idle reaper on the running loop (the app's lifespan calls this)."""
        self.loop = asyncio.get_running_loop()
        if self.idle_timeout is not None and self._reaper is None:
            self._reaper = asyncio.create_task(self._reap_forever())

    async def shutdown(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None
        for sid in list(self.sessions):
            await self.close(sid)

    async def _reap_forever(self) -> None:
        assert self.idle_timeout is not None
        interval = min(max(self.idle_timeout / 4, 0.05), 5.0)
        while True:
            await asyncio.sleep(interval)
            try:
                await self.reap_idle()
            except Exception:  # noqa: BLE001 - the reaper must survive one bad close
                log.exception("idle-session reaper")

    async def reap_idle(self) -> int:
        """Close every session idle for longer than ``idle_timeout``; the number closed."""
        if self.idle_timeout is None:
            return 0
        now = time.monotonic()
        stale = [
            s.id
            for s in self.sessions.values()
            if not s.lock.locked() and now - s.last_used > self.idle_timeout
        ]
        for sid in stale:
            if await self.close(sid):
                self.stats.closed_idle += 1
        return len(stale)

    # ------------------------------------------------------------ sessions
    def health(self) -> Health:
        return Health(
            envs=self.envs,
            sessions=len(self.sessions),
            max_sessions=self.max_sessions,
            idle_timeout=self.idle_timeout,
            stats=dataclasses.asdict(self.stats),
        )

    def get(self, session_id: str | None) -> Session:
        session = self.sessions.get(session_id or "")
        if session is None:
            idle = f", idle for more than {self.idle_timeout:g}s" if self.idle_timeout else ""
            raise ServeError(
                "unknown_session",
                f"unknown session {session_id!r}: never opened here, already closed{idle}, "
                "or the server restarted since",
            )
        return session

    def _resolve(self, env_id: str | None) -> str:
        if env_id is None:
            return self.envs[0]
        try:
            full = spec(env_id).id
        except UnknownEnvError as e:
            raise ServeError("unknown_env", str(e)) from None
        if full not in self.envs:
            raise ServeError(
                "not_served", f"env {full!r} is registered but not served here; served: {self.envs}"
            )
        return full

    def _reserve(self) -> None:
        if len(self.sessions) + self._opening >= self.max_sessions:
            self.stats.refused_full += 1
            raise ServeError(
                "server_full",
                f"server full: {len(self.sessions) + self._opening} sessions open (max_sessions="
                f"{self.max_sessions}); close one or retry later",
            )
        self._opening += 1

    def _add(self, env_id: str, env: Any, owner: object | None) -> Session:
        session = Session(id=uuid.uuid4().hex, env_id=env_id, env=env, owner=owner)
        self.sessions[session.id] = session
        self.stats.opened += 1
        return session

    async def create(self, req: CreateSession, owner: object | None = None) -> SessionInfo:
        env_id = self._resolve(req.env_id)
        self._reserve()
        try:
            try:
                env = await asyncio.to_thread(make, env_id, **{**self.env_kwargs, **req.kwargs})
            except (TypeError, ValueError) as e:
                raise ServeError("bad_request", f"cannot make {env_id!r} with {req.kwargs}: {e}") from e
            if req.max_turns is not None:
                env.limit_turns(req.max_turns)
            return self.info(self._add(env_id, env, owner))
        finally:
            self._opening -= 1

    def info(self, session: Session) -> SessionInfo:
        base = session.base
        parser = getattr(base, "parser", None)
        return SessionInfo(
            session_id=session.id,
            env_id=session.env_id,
            tools=list(base.tools),
            instructions=base.tool_instructions(),
            tools_in_prompt=bool(getattr(base, "tools_in_prompt", True)),
            parser=getattr(parser, "name", "hermes"),
            max_turns=int(base.max_turns),
            forkable=bool(getattr(base, "forkable", False)),
            turn=int(getattr(base, "turn", 0)),
            done=bool(getattr(base, "_done", True)),
            state_key=_state_key(base),
        )

    async def _call(self, session_id: str | None, fn: Callable[[Session], Awaitable[BaseModel]]) -> BaseModel:
        session = self.get(session_id)
        async with session.lock:
            session.last_used = time.monotonic()
            if session.id not in self.sessions:  # closed while this call waited
                self.get(session.id)
            try:
                return await fn(session)
            except ServeError:
                raise
            except RuntimeError as e:  # the env refused: closed, over, never reset
                raise ServeError("env_error", f"{type(e).__name__}: {e}") from e
            finally:
                session.last_used = time.monotonic()

    async def reset(self, session_id: str | None, req: ResetRequest) -> ResetReply:
        async def run(s: Session) -> ResetReply:
            obs, info = await s.env.areset(seed=req.seed, options=req.options)
            return ResetReply(observation=obs, info=jsonable(info))

        return await self._call(session_id, run)  # type: ignore[return-value]

    async def step(self, session_id: str | None, req: StepRequest) -> StepReply:
        async def run(s: Session) -> StepReply:
            obs, reward, terminated, truncated, info = await s.env.astep(req.action)
            wire_info, results = info_to_wire(info)
            return StepReply(
                observation=obs,
                reward=float(reward),
                terminated=bool(terminated),
                truncated=bool(truncated),
                info=wire_info,
                tool_results=results,
            )

        return await self._call(session_id, run)  # type: ignore[return-value]

    async def tools(self, session_id: str | None) -> ToolsReply:
        async def run(s: Session) -> ToolsReply:
            return ToolsReply(tools=list(s.base.tools), instructions=s.base.tool_instructions())

        return await self._call(session_id, run)  # type: ignore[return-value]

    async def expert(self, session_id: str | None) -> ExpertReply:
        async def run(s: Session) -> ExpertReply:
            action = s.base.expert_action()
            if asyncio.iscoroutine(action):
                action = await action
            return ExpertReply(action=action)

        return await self._call(session_id, run)  # type: ignore[return-value]

    async def limit_turns(self, session_id: str | None, req: LimitTurns) -> LimitTurnsReply:
        async def run(s: Session) -> LimitTurnsReply:
            s.env.limit_turns(req.max_turns)
            return LimitTurnsReply(max_turns=int(s.base.max_turns))

        return await self._call(session_id, run)  # type: ignore[return-value]

    async def fork(self, session_id: str | None, owner: object | None = None) -> SessionInfo:
        async def run(s: Session) -> SessionInfo:
            self._reserve()
            try:
                try:
                    child = await s.env.afork()
                except NotForkable as e:
                    raise ServeError("not_forkable", str(e)) from e
                except ForkError as e:
                    raise ServeError("env_error", str(e)) from e
                return self.info(self._add(s.env_id, child, owner))
            finally:
                self._opening -= 1

        return await self._call(session_id, run)  # type: ignore[return-value]

    def attach(self, session_id: str, owner: object) -> SessionInfo:
        session = self.get(session_id)
        session.owner = owner
        session.last_used = time.monotonic()
        return self.info(session)

    async def close(self, session_id: str | None) -> bool:
        """Close a session's env; False if there was no such session (closing twice is no error)."""
        session = self.sessions.pop(session_id or "", None)
        if session is None:
            return False
        self.stats.closed += 1
        try:
            async with session.lock:
                await session.env.aclose()
        except Exception:  # noqa: BLE001 - a failing close is counted and logged, never raised
            self.stats.close_errors += 1
            log.exception("closing session %s (%s)", session.id, session.env_id)
        return True

    async def close_owned(self, owner: object) -> int:
        """Close the sessions a websocket owned (it closed); the number closed."""
        owned = [s.id for s in self.sessions.values() if s.owner is owner]
        for sid in owned:
            if await self.close(sid):
                self.stats.closed_disconnect += 1
        return len(owned)

    # ------------------------------------------------------------ websocket dispatch
    async def dispatch(self, frame: str | bytes, owner: object) -> WsReply:
        """Answer one websocket frame (a :class:`WsRequest`); never raises."""
        request_id: Any = None
        try:
            try:
                req = WsRequest.model_validate_json(frame)
            except ValidationError as e:
                raise ServeError("malformed", f"malformed websocket message: {_summary(e)}") from None
            request_id = req.id
            handler, body = _OPS[req.op]
            try:
                payload = body.model_validate(req.data) if body is not None else None
            except ValidationError as e:
                raise ServeError("malformed", f"malformed {req.op!r} data: {_summary(e)}") from None
            result = await handler(self, req.session_id, payload, owner)
            return WsReply(id=request_id, ok=True, data=result.model_dump(mode="json"))
        except ServeError as e:
            return WsReply(id=request_id, ok=False, error=e.body())
        except Exception as e:  # noqa: BLE001 - an env bug is reported to the client, not raised
            log.exception("websocket op failed")
            return WsReply(
                id=request_id, ok=False, error=ErrorBody(error=f"{type(e).__name__}: {e}", kind="internal")
            )


def _state_key(base: Any) -> str | None:
    if getattr(base, "task", None) is None:
        return None
    key = base._state_key()
    return None if key is None else str(key)


def _summary(e: ValidationError) -> str:
    parts = [f"{'.'.join(str(p) for p in err['loc']) or '(message)'}: {err['msg']}" for err in e.errors()]
    return "; ".join(parts[:5]) + (f" (+{len(parts) - 5} more)" if len(parts) > 5 else "")


async def _close(m: SessionManager, session_id: str | None, _: Any, owner: object) -> Closed:
    m.get(session_id)
    return Closed(closed=await m.close(session_id))


#: a session op -> (handler(manager, session id, validated data, owner), data model or None); the
#: websocket's ops, and (through :data:`_HTTP_OPS`) the HTTP routes ``/sessions/{session_id}...``
_OPS: dict[str, tuple[Callable[..., Awaitable[BaseModel]], type[BaseModel] | None]] = {
    "create": (lambda m, s, d, o: m.create(d, owner=o), CreateSession),
    "attach": (lambda m, s, d, o: _async(m.attach(d.session_id, o)), AttachRequest),
    "reset": (lambda m, s, d, o: m.reset(s, d), ResetRequest),
    "step": (lambda m, s, d, o: m.step(s, d), StepRequest),
    "tools": (lambda m, s, d, o: m.tools(s), None),
    "expert": (lambda m, s, d, o: m.expert(s), None),
    "limit_turns": (lambda m, s, d, o: m.limit_turns(s, d), LimitTurns),
    "fork": (lambda m, s, d, o: m.fork(s, owner=None), None),  # unowned until attached
    "close": (_close, None),
}

#: the ops that are also HTTP routes on a session: op -> (method, path under /sessions/{session_id}, reply)
_HTTP_OPS: dict[str, tuple[str, str, type[BaseModel]]] = {
    "reset": ("POST", "/reset", ResetReply),
    "step": ("POST", "/step", StepReply),
    "tools": ("GET", "/tools", ToolsReply),
    "expert": ("GET", "/expert", ExpertReply),
    "limit_turns": ("POST", "/limit_turns", LimitTurnsReply),
    "fork": ("POST", "/fork", SessionInfo),
    "close": ("DELETE", "", Closed),
}


def _session_route(manager: SessionManager, op: str) -> Callable[..., Awaitable[Response]]:
    """The HTTP endpoint of a session op: the path's ``session_id`` and (where the op takes data) the
    JSON body, validated by FastAPI against the op's model; a body whose every field has a default may
    be left out."""
    handler, body = _OPS[op]

    async def endpoint(session_id: str, req: BaseModel | None = None) -> Response:
        if body is not None and req is None:
            req = body()
        return _json(await handler(manager, session_id, req, None))

    params = [inspect.Parameter("session_id", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str)]
    if body is not None:
        optional = not any(f.is_required() for f in body.model_fields.values())
        params.append(
            inspect.Parameter(
                "req",
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                annotation=body | None if optional else body,
                default=None if optional else inspect.Parameter.empty,
            )
        )
    endpoint.__signature__ = inspect.Signature(params, return_annotation=Response)  # type: ignore[attr-defined]
    endpoint.__name__ = endpoint.__qualname__ = op
    return endpoint


async def _async(value: BaseModel) -> BaseModel:
    return value


# ---------------------------------------------------------------------------- the ASGI app
def create_app(
    manager: SessionManager, *, openenv: bool = False, mcp: bool = False, host: str = "127.0.0.1"
) -> Any:
    """The FastAPI app: the HTTP routes and ``/ws``, plus ``/openenv`` and ``/mcp`` when asked
    (``host``: where it will listen, for the MCP transport's DNS-rebinding protection)."""
    extras: list[Callable[[], contextlib.AbstractAsyncContextManager[Any]]] = []
    mounts: list[tuple[str, Any]] = []
    routes: list[Any] = []
    if openenv:
        from turngym.remote.openenv import openenv_app

        mounts.append(("/openenv", _quiet_disconnects(openenv_app(manager))))
    if mcp:
        from turngym.remote.mcp import mcp_routes

        more, lifespan_of_mcp = mcp_routes(manager, host=host)
        routes += more
        extras.append(lifespan_of_mcp)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        manager.start()
        async with contextlib.AsyncExitStack() as stack:
            for extra in extras:
                await stack.enter_async_context(extra())
            try:
                yield
            finally:
                await manager.shutdown()

    app = FastAPI(title="turngym env server", lifespan=lifespan)
    app.state.manager = manager

    @app.exception_handler(ServeError)
    async def _serve_error(request: Request, e: ServeError) -> JSONResponse:
        return JSONResponse(status_code=e.status, content={"detail": e.body().model_dump()})

    @app.exception_handler(RequestValidationError)
    async def _malformed(request: Request, e: RequestValidationError) -> JSONResponse:
        parts = [f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()]
        body = ErrorBody(error="malformed request: " + "; ".join(parts[:5]), kind="malformed")
        return JSONResponse(status_code=ERROR_STATUS["malformed"], content={"detail": body.model_dump()})

    @app.get("/health", response_model=Health)
    async def health() -> Response:
        return _json(manager.health())

    @app.post("/sessions", response_model=SessionInfo)
    async def create(req: CreateSession) -> Response:
        return _json(await manager.create(req))

    for op, (method, path, reply) in _HTTP_OPS.items():
        app.add_api_route(
            f"/sessions/{{session_id}}{path}",
            _session_route(manager, op),
            methods=[method],
            response_model=reply,
        )

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await websocket.accept()
        owner = object()
        try:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                frame = (
                    message.get("text") if message.get("text") is not None else message.get("bytes") or b""
                )
                reply = await manager.dispatch(frame, owner)
                await websocket.send_text(reply.model_dump_json())
        except WebSocketDisconnect:
            pass
        finally:
            await manager.close_owned(owner)

    app.router.routes.extend(routes)
    for path, sub in mounts:
        app.mount(path, sub)
    return app


def _json(model: BaseModel) -> Response:
    """A reply as the protocol writes it (non-finite floats as ``Infinity``/``NaN``, not ``null``)."""
    return Response(content=model.model_dump_json(), media_type="application/json")


def _quiet_disconnects(app: Any) -> Any:
    """openenv-core's websocket route closes a socket the client already closed, which Starlette 1.x
    reports as ``WebSocketDisconnect`` after the session is cleaned up: nothing is wrong, so drop it."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        try:
            await app(scope, receive, send)
        except WebSocketDisconnect:
            if scope["type"] != "websocket":
                raise

    return wrapped
