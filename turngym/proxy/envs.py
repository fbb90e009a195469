"""An env's tools over MCP on the proxy's own port, per episode, with the env's rewards landing on it.

``turngym proxy --env arith`` serves, beside the model, ``turngym serve --mcp``'s MCP door
(``turngym.remote.mcp``, the same sessions, tools and limits) at ``/v1/episodes/{e}/mcp``. A harness
given ``mcp_url=.../v1/episodes/{e}/mcp`` and ``base_url=.../v1/episodes/{e}`` plays the env with
its tools and the model with its calls under one episode key: every env step's reward and reward
components are added to the episode (``EpisodeStore.add_env_step``), each on the turn of the latest
model call before it, and the episode's reward is the env's return.

The episode key travels from the URL to the env sessions through a context variable set for the
request (the MCP session's handlers run in tasks started by its first request, which inherit it).
"""

from __future__ import annotations

import contextvars
from typing import Any

from starlette.routing import Route

from turngym.proxy.episodes import EpisodeStore, check_key
from turngym.remote.server import SessionManager

EPISODE: contextvars.ContextVar[str | None] = contextvars.ContextVar("turngym_proxy_episode", default=None)


class EpisodeSessions(SessionManager):
    """A ``SessionManager`` whose steps report their reward to the proxy's episode of the request."""

    def __init__(self, envs: list[str], store: EpisodeStore, **kwargs: Any):
        super().__init__(envs, **kwargs)
        self.store = store
        self.episode_of: dict[str, str] = {}  # env session id -> episode key

    async def reset(self, session_id: str | None, req: Any) -> Any:
        reply = await super().reset(session_id, req)
        key = EPISODE.get()
        if key is not None and session_id is not None:
            self.episode_of[session_id] = key
            ep = self.store.open(key)
            ep.metadata["env_task"] = reply.info.get("task_id", "")
            if reply.info.get("task_id") and not ep.task_id:
                ep.task_id = str(reply.info["task_id"])
        return reply

    async def step(self, session_id: str | None, req: Any) -> Any:
        reply = await super().step(session_id, req)
        key = self.episode_of.get(session_id or "") or EPISODE.get()
        if key is not None and key not in self.store.finished:
            comps = {k: float(v) for k, v in (reply.info.get("reward_components") or {}).items()}
            self.store.add_env_step(key, float(reply.reward), comps, bool(reply.terminated))
        return reply


class _EpisodeDoor:
    """The MCP endpoint with the episode key of its URL set for the request."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        key = check_key(scope.get("path_params", {}).get("episode", ""))
        token = EPISODE.set(key)
        try:
            await self.app(scope, receive, send)
        finally:
            EPISODE.reset(token)


def env_routes(manager: EpisodeSessions, *, host: str = "127.0.0.1") -> tuple[list[Route], Any]:
    """The per-episode MCP route and the lifespan of the MCP session manager."""
    from turngym.remote.mcp import mcp_routes

    (route,), lifespan = mcp_routes(manager, host=host)
    return [
        Route("/v1/episodes/{episode}/mcp", endpoint=_EpisodeDoor(route.endpoint), methods=None)
    ], lifespan
