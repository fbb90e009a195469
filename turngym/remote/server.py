"""``turngym serve``: registered envs over HTTP and WebSocket, many sessions per server, behind a guard.

    manager = SessionManager(["arith"], max_sessions=64, idle_timeout=600)
    guard = ServeGuard.for_bind("127.0.0.1", 8000, token)
    uvicorn.run(create_app(manager, guard=guard), port=8000, **uvicorn_limits())

* The sessions, their limits and operations are :class:`~turngym.remote.sessions.SessionManager`'s;
  this module maps them to routes: ``POST /sessions``, ``/sessions/{id}/...``, the websocket ``/ws``,
  ``GET /health`` (the only route that needs no token).
* Every route, the front doors included, sits behind :func:`~turngym.remote.security.guard_app`:
  bearer token, ``Host`` and ``Origin`` checks, body and frame caps. The guard marks callers holding
  the trainer token; only they get privileged info and the expert's action.
* Errors are typed JSON (:data:`~turngym.remote.protocol.ERROR_STATUS`), their messages short: unknown
  session or env, malformed id or request, an argument the client may not set, server full, ...
* Optional front doors on the same port: ``/openenv`` speaks OpenEnv's wire protocol
  (:mod:`turngym.remote.openenv`; off by default: importing openenv-core imports gradio, ~10 s),
  ``/mcp`` serves the env's tools over MCP (:mod:`turngym.remote.mcp`).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.websockets import WebSocketDisconnect

from turngym.remote.errors import add_error_handlers
from turngym.remote.protocol import (
    Closed,
    CreateSession,
    ExpertReply,
    Health,
    LimitTurnsReply,
    ResetReply,
    SessionInfo,
    StepReply,
    ToolsReply,
)
from turngym.remote.security import ServeGuard, caller_is_trainer, guard_app
from turngym.remote.sessions import OPS, Caller, ServeStats, Session, SessionManager

__all__ = ["Session", "ServeStats", "SessionManager", "create_app"]
log = logging.getLogger(__name__)


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
    handler, body = OPS[op]

    async def endpoint(request: Request, session_id: str, req: BaseModel | None = None) -> Response:
        if body is not None and req is None:
            req = body()
        caller = Caller(None, caller_is_trainer(request.scope))
        return _json(await handler(manager, session_id, req, caller))

    params = [
        inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request),
        inspect.Parameter("session_id", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str),
    ]
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


# ---------------------------------------------------------------------------- the ASGI app
def create_app(
    manager: SessionManager, *, guard: ServeGuard, openenv: bool = False, mcp: bool = False
) -> Any:
    """The ASGI app: the HTTP routes and ``/ws``, plus ``/openenv`` and ``/mcp`` when asked, all behind
    ``guard`` (``/health`` needs no token)."""
    extras: list[Callable[[], contextlib.AbstractAsyncContextManager[Any]]] = []
    mounts: list[tuple[str, Any]] = []
    routes: list[Any] = []
    if openenv:
        from turngym.remote.openenv import openenv_app

        mounts.append(("/openenv", _quiet_disconnects(openenv_app(manager))))
    if mcp:
        from turngym.remote.mcp import mcp_routes

        more, lifespan_of_mcp = mcp_routes(manager)
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

    add_error_handlers(app)

    @app.get("/health", response_model=Health)
    async def health() -> Response:
        return _json(manager.health())

    @app.post("/sessions", response_model=SessionInfo)
    async def create(req: CreateSession) -> Response:
        return _json(await manager.create(req))  # nothing privileged in a SessionInfo

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
        owner, trainer = object(), caller_is_trainer(websocket.scope)
        try:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                frame = (
                    message.get("text") if message.get("text") is not None else message.get("bytes") or b""
                )
                reply = await manager.dispatch(frame, owner, trainer=trainer)
                await websocket.send_text(reply.model_dump_json())
        except WebSocketDisconnect:
            pass
        finally:
            await manager.close_owned(owner)

    app.router.routes.extend(routes)
    for path, sub in mounts:
        app.mount(path, sub)
    return guard_app(app, guard, open_paths=("/health",))


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
