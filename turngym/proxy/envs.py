"""An env's tools over MCP on the proxy's own port, per episode, with the env's rewards landing on it.

``turngym proxy --env arith`` serves, beside the model, ``turngym serve --mcp``'s MCP door
(``turngym.remote.mcp``, the same sessions, tools and limits) at ``/v1/episodes/{e}/mcp``. A harness
given ``mcp_url=.../v1/episodes/{e}/mcp`` and ``base_url=.../v1/episodes/{e}`` plays the env with
its tools and the model with its calls under one episode key: every env step's reward and reward
components are added to the episode (``EpisodeStore.add_env_step``), each on the turn of the latest
model call before it, and the episode's reward is the env's return.

The episode key travels from the URL to the env sessions through a context variable set for the
request (the MCP session's handlers run in tasks started by its first request, which inherit it).
Sessionless MCP clients (protocol 2026-07-28, e.g. the ``mcp`` 2.x client inside the Agents SDK) do
not carry the ``episode_id`` that ``reset`` returned; since the URL names the episode, the door adds
it to their tool calls.
"""

from __future__ import annotations

import contextvars
import json
from typing import Any

from starlette.routing import Route

from turngym.proxy.episodes import EpisodeStore, check_key
from turngym.remote.sessions import SessionManager

EPISODE: contextvars.ContextVar[str | None] = contextvars.ContextVar("turngym_proxy_episode", default=None)


class EpisodeSessions(SessionManager):
    """A ``SessionManager`` whose steps report their reward to the proxy's episode of the request."""

    def __init__(self, envs: list[str], store: EpisodeStore, **kwargs: Any):
        super().__init__(envs, **kwargs)
        self.store = store
        self.episode_of: dict[str, str] = {}  # env session id -> episode key
        self.session_of: dict[str, str] = {}  # episode key -> its latest env session id

    async def reset(self, session_id: str | None, req: Any, **kwargs: Any) -> Any:
        reply = await super().reset(session_id, req, **kwargs)
        key = EPISODE.get()
        if key is not None and session_id is not None:
            self.episode_of[session_id] = key
            self.session_of[key] = session_id
            ep = self.store.open(key)
            ep.metadata["env_task"] = reply.info.get("task_id", "")
            if reply.info.get("task_id") and not ep.task_id:
                ep.task_id = str(reply.info["task_id"])
        return reply

    async def step(self, session_id: str | None, req: Any, **kwargs: Any) -> Any:
        reply = await super().step(session_id, req, **kwargs)
        key = self.episode_of.get(session_id or "") or EPISODE.get()
        if key is not None and key not in self.store.finished:
            comps = {k: float(v) for k, v in (reply.info.get("reward_components") or {}).items()}
            self.store.add_env_step(key, float(reply.reward), comps, bool(reply.terminated))
        return reply


class _EpisodeDoor:
    """The MCP endpoint with the episode key of its URL set for the request (and named in the tool
    calls of sessionless clients)."""

    def __init__(self, app: Any, manager: EpisodeSessions):
        self.app = app
        self.manager = manager

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        key = check_key(scope.get("path_params", {}).get("episode", ""))
        token = EPISODE.set(key)
        try:
            sid = self.manager.session_of.get(key)
            headers = dict(scope.get("headers") or [])
            if scope.get("method") == "POST" and sid is not None and b"mcp-session-id" not in headers:
                scope, receive = await _with_episode_id(scope, receive, sid)
            await self.app(scope, receive, send)
        finally:
            EPISODE.reset(token)


async def _with_episode_id(scope: Any, receive: Any, sid: str) -> tuple[Any, Any]:
    """The request again, its ``tools/call`` arguments given ``episode_id=sid`` where they lack one
    (the body is already capped by the guard)."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return scope, _replay([message], receive)
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    body = b"".join(chunks)
    try:
        rpc = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        rpc = None
    if isinstance(rpc, dict) and rpc.get("method") == "tools/call" and isinstance(rpc.get("params"), dict):
        args = rpc["params"].get("arguments")
        if isinstance(args, dict) and "episode_id" not in args:
            rpc["params"]["arguments"] = {**args, "episode_id": sid}
            body = json.dumps(rpc).encode()
            headers = [(k, v) for k, v in scope.get("headers") or [] if k.lower() != b"content-length"]
            scope = {**scope, "headers": [*headers, (b"content-length", str(len(body)).encode())]}
    return scope, _replay([{"type": "http.request", "body": body, "more_body": False}], receive)


def _replay(messages: list[dict[str, Any]], then: Any) -> Any:
    """A ``receive`` that gives ``messages`` first, then what ``then`` gives (the client's disconnect)."""
    pending = list(messages)

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop(0)
        return await then()

    return receive


def env_routes(manager: EpisodeSessions) -> tuple[list[Route], Any]:
    """The per-episode MCP route and the lifespan of the MCP session manager (behind the proxy's
    guard, which checks Host and Origin for every route)."""
    from turngym.remote.mcp import mcp_routes

    (route,), lifespan = mcp_routes(manager)
    return [
        Route("/v1/episodes/{episode}/mcp", endpoint=_EpisodeDoor(route.endpoint, manager), methods=None)
    ], lifespan
