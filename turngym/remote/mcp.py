"""A served env's tools as an MCP server (``turngym serve ENV --mcp``; streamable HTTP at ``/mcp``).

Built on the official ``mcp`` SDK's low-level ``Server``, so the tools keep the env's own JSON
schemas. Each MCP session owns one env episode (a session of the turngym server's
:class:`~turngym.remote.server.SessionManager`, under its ``max_sessions`` and idle timeout):

* ``reset(seed?)`` starts an episode and returns the first messages (text, images as image content;
  ``structured_content`` holds the messages and info);
* every env tool ``NAME(**arguments)`` is one turn: the call is written in the env's own convention
  (``env.format_call``) and stepped, so rewards, turn limits and terminal tools work as in any
  episode; the reply is the tool's observation, with ``structured_content`` = ``{reward,
  terminated, truncated, reward_components, turn, ...}``; a failed call is ``is_error``.

A call before ``reset`` or after the episode ended is an ``is_error`` result saying so. Sessionless
clients (protocol 2026-07-28) name their episode with ``episode_id``; passing it to ``reset`` starts
the next episode in the same env, and every finished sessionless episode is closed at the next
sessionless ``reset`` (so a client that never names its episode leaks nothing but one open episode,
closed after the idle timeout). The gold ``reference`` and other privileged info reach only MCP
clients holding the trainer token. ``/mcp`` sits behind the server's guard (token, Host, Origin).
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.transport_security import TransportSecuritySettings
from starlette.routing import Route

from turngym.core.types import Message
from turngym.remote.protocol import CreateSession, ResetRequest, ServeError, StepRequest
from turngym.remote.security import caller_is_trainer

if TYPE_CHECKING:
    from turngym.remote.sessions import SessionManager

EPISODE_ARG = {
    "type": "string",
    "description": "the episode (returned by reset); needed only by sessionless MCP clients (protocol "
    "2026-07-28), ignored within an MCP session",
}

RESET_TOOL = types.Tool(
    name="reset",
    description="Start a new episode (the first messages describe the task). Call it before any other tool; "
    "call it again to start over.",
    input_schema={
        "type": "object",
        "properties": {
            "seed": {"type": "integer", "description": "task seed (same seed, same task)"},
            "episode_id": EPISODE_ARG,
        },
    },
)


def _with_episode_arg(schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "properties": {**schema.get("properties", {}), "episode_id": EPISODE_ARG}}


def _content(messages: list[Message]) -> list[Any]:
    out: list[Any] = []
    for m in messages:
        head = m.role + (f" ({m.name})" if m.name else "")
        out.append(types.TextContent(text=f"[{head}] {m.content}"))
        out += [
            types.ImageContent(data=base64.b64encode(img).decode(), mime_type="image/png") for img in m.images
        ]
    return out


class McpFrontDoor:
    """The MCP handlers: MCP session (or episode id) -> turngym session, through the manager."""

    def __init__(self, manager: SessionManager):
        self.manager = manager
        self.episodes: dict[str, str] = {}  # MCP session id -> turngym session id
        self.sessionless: dict[str, None] = {}  # episodes of sessionless clients, oldest first
        self._tools: list[types.Tool] | None = None

    async def _session(self, ctx: Any, args: dict[str, Any], *, create: bool) -> Any:
        """The turngym session of this call: the MCP session's own episode (handshake-era clients), else
        the ``episode_id`` argument, else (``create``) a new one. Raises ``ServeError`` if none."""
        request = getattr(ctx, "request", None)
        mcp_session = request.headers.get("mcp-session-id") if request is not None else None
        episode = args.pop("episode_id", None)
        if mcp_session:
            sid = self.episodes.get(mcp_session)
            if sid is None or sid not in self.manager.sessions:  # first call, or reaped after idling
                sid = (await self.manager.create(CreateSession())).session_id
                self.episodes[mcp_session] = sid
            return self.manager.get(sid)
        if create:  # a sessionless reset: the finished episodes go; the named one is reused
            await self._close_finished(keep=str(episode) if episode is not None else None)
            if episode is not None and str(episode) in self.manager.sessions:
                return self.manager.get(str(episode))
            sid = (await self.manager.create(CreateSession())).session_id
            self.sessionless[sid] = None
            return self.manager.get(sid)
        if episode is not None:
            return self.manager.get(str(episode))
        raise ServeError(
            "unknown_session",
            "this MCP client has no session (protocol 2026-07-28 is sessionless): pass the episode_id "
            "that reset returned",
        )

    async def _close_finished(self, keep: str | None) -> None:
        """Close the sessionless episodes that are over (or gone), but ``keep``."""
        for sid in list(self.sessionless):
            session = self.manager.sessions.get(sid)
            if session is None:
                self.sessionless.pop(sid, None)
            elif sid != keep and session.base._done and not session.lock.locked():
                self.sessionless.pop(sid, None)
                await self.manager.close(sid)

    async def list_tools(self, ctx: Any, params: Any) -> types.ListToolsResult:
        if self._tools is None:  # every episode of the served env has the same tools
            info = await self.manager.create(CreateSession())
            await self.manager.close(info.session_id)
            self._tools = [
                types.Tool(
                    name=spec.name,
                    description=spec.description + (" (ends the episode)" if spec.terminal else ""),
                    input_schema=_with_episode_arg(spec.parameters),
                )
                for spec in info.tools
            ]
        return types.ListToolsResult(tools=[RESET_TOOL, *self._tools])

    async def call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        args = dict(params.arguments or {})
        request = getattr(ctx, "request", None)
        trainer = caller_is_trainer(request.scope) if request is not None else False
        try:
            session = await self._session(ctx, args, create=params.name == "reset")
            if params.name == "reset":
                seed = args.get("seed")
                if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
                    return _error(f"seed must be an integer, got {type(seed).__name__}")
                reply = await self.manager.reset(session.id, ResetRequest(seed=seed), trainer=trainer)
                return types.CallToolResult(
                    content=[
                        *_content(reply.observation),
                        types.TextContent(text=f"episode_id: {session.id}"),
                    ],
                    structured_content={
                        "episode_id": session.id,
                        "observation": [m.model_dump(mode="json") for m in reply.observation],
                        "info": reply.info,
                    },
                )
            if params.name not in {t.name for t in session.base.tools}:
                names = ["reset", *(t.name for t in session.base.tools)]
                return _error(f"unknown tool {params.name!r}; tools: {', '.join(names)}")
            if session.base.task is None or session.base._done:
                return _error(
                    "no episode is running: call reset first (an episode ends at a terminal tool or the turn limit)"
                )
            action = session.base.format_call(params.name, args)
            step = await self.manager.step(session.id, StepRequest(action=action), trainer=trainer)
        except ServeError as e:
            return _error(f"{e.kind}: {e}")
        failed = [r for r in step.tool_results if not r.ok]
        return types.CallToolResult(
            content=_content(step.observation),
            structured_content={
                "reward": step.reward,
                "terminated": step.terminated,
                "truncated": step.truncated,
                **{k: step.info.get(k) for k in ("reward_components", "turn", "error", "state_key")},
            },
            is_error=bool(failed),
        )


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


def mcp_routes(manager: SessionManager) -> tuple[list[Any], Any]:
    """The ``/mcp`` route and the lifespan that runs the MCP session manager. The route trusts the
    server's guard (:func:`~turngym.remote.security.guard_app`) for the Host and Origin checks: the
    SDK's own DNS-rebinding check is off, so one list of allowed hosts governs every route."""
    door = McpFrontDoor(manager)
    server = Server(
        f"turngym-{manager.envs[0]}",
        instructions=f"turngym env {manager.envs[0]}: call reset, then the env's tools, one per turn.",
        on_list_tools=door.list_tools,
        on_call_tool=door.call_tool,
    )
    security = TransportSecuritySettings(enable_dns_rebinding_protection=False)  # the guard checks them
    app = server.streamable_http_app(streamable_http_path="/mcp", transport_security=security)
    (route,) = [r for r in app.routes if getattr(r, "path", None) == "/mcp"]

    @contextlib.asynccontextmanager
    async def lifespan() -> AsyncIterator[None]:
        async with server.session_manager.run():
            yield

    return [Route("/mcp", endpoint=_CloseOnDelete(route.endpoint, door))], lifespan


class _CloseOnDelete:
    """The MCP endpoint, and: an MCP client ending its session (HTTP DELETE) closes its env at once."""

    def __init__(self, app: Any, door: McpFrontDoor):
        self.app, self.door = app, door

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)
        if scope["type"] == "http" and scope["method"] == "DELETE":
            headers = dict(scope.get("headers") or [])
            mcp_session = headers.get(b"mcp-session-id", b"").decode()
            sid = self.door.episodes.pop(mcp_session, None)
            if sid is not None:
                await self.door.manager.close(sid)
