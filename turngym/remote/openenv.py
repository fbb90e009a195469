"""OpenEnv's wire protocol for a served turngym env, under ``/openenv`` of ``turngym serve``.

OpenEnv (``openenv-core``) clients speak a WebSocket protocol at ``<base_url>/ws`` (``reset``,
``step``, ``state``, ``close`` frames answered by ``observation``/``state``/``error`` frames) and
HTTP ``/reset``, ``/step``, ``/state``, ``/schema``, ``/health``, ``/metadata``. Rather than copy that
protocol, this module serves it with openenv-core's own server (``HTTPEnvServer``) over an OpenEnv
``Environment`` that drives a session of the turngym server's :class:`SessionManager` (the same
``max_sessions``, idle timeout and statistics as the native protocol):

* action: :class:`TurngymAction` ``{"content": str, "tool_calls": [{"name", "arguments", "id"?}]}``
  (the assistant message; with Hermes/tags parsers the calls are written in ``content``);
* observation: :class:`TurngymObservation` ``{"messages": [...], "info": {...}, "terminated",
  "truncated"}`` plus OpenEnv's ``reward`` and ``done``;
* state: ``episode_id`` (the turngym session id), ``step_count``, ``env_id``, ``task_id``.

    from openenv.core import GenericEnvClient
    async with GenericEnvClient(base_url="http://host:8000/openenv") as env:
        result = await env.reset(seed=0)
        result = await env.step({"content": '<tool_call>{"name": ...}</tool_call>'})

Each OpenEnv websocket is one session (one env), closed when it closes. OpenEnv's stateless HTTP
``/reset`` and ``/step`` make a fresh env per request, as openenv-core does for every environment;
their errors are JSON (``{"detail": {"error", "kind"}}``) with the protocol's status. The routes sit
behind the server's guard; privileged info reaches only callers holding the trainer token.
"""

from __future__ import annotations

import asyncio
from typing import Any

from openenv.core.env_server import HTTPEnvServer
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, ConcurrencyConfig, EnvironmentMetadata, Observation, State
from pydantic import Field

from turngym.core.types import Message, ToolCall
from turngym.remote.protocol import CreateSession, ResetRequest, StepRequest
from turngym.remote.security import caller_is_trainer


class TurngymAction(Action):
    """One assistant turn: text, and structured tool calls for envs whose parser is ``openai``."""

    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)


class TurngymObservation(Observation):
    messages: list[dict[str, Any]] = Field(default_factory=list, description="turngym Messages (JSON)")
    info: dict[str, Any] = Field(default_factory=dict, description="the step's info (JSON)")
    terminated: bool = False
    truncated: bool = False


class TurngymState(State):
    env_id: str = ""
    task_id: str = ""


def _environment_class(manager: Any) -> type[Environment]:
    """An OpenEnv ``Environment`` bound to ``manager`` (openenv-core makes one per session)."""

    class TurngymOpenEnv(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self) -> None:
            super().__init__()
            self._loop: asyncio.AbstractEventLoop = manager.loop
            self.session_id: str | None = None
            self.env_id = manager.envs[0]
            self._state = TurngymState(env_id=self.env_id)
            if not self._on_loop():  # openenv-core's websocket path builds envs in a worker thread
                self._opened(
                    asyncio.run_coroutine_threadsafe(manager.create(CreateSession()), self._loop).result()
                )

        def _on_loop(self) -> bool:
            try:
                return asyncio.get_running_loop() is self._loop
            except RuntimeError:
                return False

        def _opened(self, info: Any) -> None:
            self.session_id, self.env_id = info.session_id, info.env_id
            self._state = TurngymState(episode_id=info.session_id, env_id=info.env_id)

        async def _session(self) -> str:
            if self.session_id is None:  # built on the loop (openenv-core's stateless HTTP routes)
                self._opened(await manager.create(CreateSession()))
            assert self.session_id is not None
            return self.session_id

        def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Observation:
            raise NotImplementedError("served through reset_async")

        def step(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Observation:
            raise NotImplementedError("served through step_async")

        async def reset_async(
            self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
        ) -> Observation:
            reply = await manager.reset(
                await self._session(),
                ResetRequest(seed=seed, options=kwargs.get("options")),
                trainer=caller_is_trainer(),
            )
            self._state = TurngymState(
                episode_id=self.session_id,
                step_count=0,
                env_id=self.env_id,
                task_id=str(reply.info.get("task_id", "")),
            )
            messages = [m.model_dump(mode="json") for m in reply.observation]
            return TurngymObservation(messages=messages, info=reply.info, done=False, reward=None)

        async def step_async(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Observation:
            turn: str | Message = action.content
            if action.tool_calls:
                turn = Message(role="assistant", content=action.content, tool_calls=action.tool_calls)
            reply = await manager.step(
                await self._session(), StepRequest(action=turn), trainer=caller_is_trainer()
            )
            self._state.step_count += 1
            info = {**reply.info, "tool_results": [r.model_dump(mode="json") for r in reply.tool_results]}
            return TurngymObservation(
                messages=[m.model_dump(mode="json") for m in reply.observation],
                info=info,
                terminated=reply.terminated,
                truncated=reply.truncated,
                done=reply.terminated or reply.truncated,
                reward=reply.reward,
            )

        @property
        def state(self) -> State:
            return self._state

        def get_metadata(self) -> EnvironmentMetadata:
            return EnvironmentMetadata(
                name=self.env_id,
                description=f"turngym env {self.env_id} served by turngym serve",
                version="1.0.0",
            )

        def close(self) -> None:  # openenv-core calls it in a worker thread, or on the loop (HTTP routes)
            if self.session_id is None:
                return
            closing = manager.close(self.session_id)
            self.session_id = None
            if self._on_loop():
                self._loop.create_task(closing)
            else:
                asyncio.run_coroutine_threadsafe(closing, self._loop).result()

    return TurngymOpenEnv


def openenv_app(manager: Any) -> Any:
    """A FastAPI app speaking OpenEnv's protocol over ``manager``'s sessions (mount it at ``/openenv``)."""
    from fastapi import FastAPI

    from turngym.remote.errors import add_error_handlers

    app = FastAPI(title="turngym env server: OpenEnv protocol")
    add_error_handlers(app)
    server = HTTPEnvServer(
        _environment_class(manager),
        TurngymAction,
        TurngymObservation,
        concurrency_config=ConcurrencyConfig(max_concurrent_envs=manager.max_sessions),
    )
    server.register_routes(app)
    return app
