"""``RemoteEnv``: a turngym env that lives in a ``turngym serve`` server on another machine.

    env = turngym.make("remote", url="http://gpu-box:8000", env_id="search-qa", n_tasks=200)
    engine = RolloutEngine("remote", agent, cfg, env_kwargs={"url": ..., "env_id": "search-qa"})

* Making one opens a session over HTTP (so ``tools``, ``tool_instructions()``, ``parser``,
  ``max_turns`` and ``forkable`` are known at once, and an unknown env id or a full server is an error
  at ``make``); the first async call opens a websocket on the caller's event loop and ``attach``-es the
  session to it, so the server closes the env if this client goes away mid-episode.
* ``areset``/``astep``/``aclose``, ``expert_action()`` (awaitable: the scripted expert runs server-side),
  ``limit_turns()`` (:class:`~turngym.core.env.TurnLimited`; sent with the next ``areset``), and ``afork()``/``fork()`` (the server forks the
  env; the child is a new ``RemoteEnv`` on a session of its own). The sync ``reset``/``step``/``close``
  of :class:`~turngym.tools.env.Env` run these on the env's own loop.
* Every request carries the server's token (``token=``, else ``$TURNGYM_SERVE_TRAINER_TOKEN``, else
  ``$TURNGYM_SERVE_TOKEN``) as ``Authorization: Bearer``; a trainer token also brings the privileged
  info (``info["reference"]``) and the expert's action. A refused token is a :class:`RemoteEnvError`
  of kind ``unauthorized`` saying so.
* A server that is unreachable, restarted or that dropped the session raises :class:`RemoteEnvLost`
  (``mask_reason = "env_lost"``): the rollout engine masks that trajectory and carries on. Any other
  refusal is a :class:`RemoteEnvError` naming the server's error kind.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import os
from typing import Any

import gymnasium
from pydantic import BaseModel

from turngym.core.env import ForkError, NotForkable, Task
from turngym.core.types import Message, ToolSpec
from turngym.remote.protocol import (
    CreateSession,
    ExpertReply,
    LimitTurnsReply,
    ResetReply,
    SessionInfo,
    StepReply,
    WsReply,
)
from turngym.tools.env import Env
from turngym.tools.parsers import get_parser


class RemoteEnvError(RuntimeError):
    """The env server refused a call; ``kind`` is the server's error kind (``ERROR_STATUS``)."""

    def __init__(self, message: str, kind: str = "internal"):
        super().__init__(message)
        self.kind = kind

    @property
    def mask_reason(self) -> str:
        """How the rollout engine masks the episode: a call past the client timeout as ``turn_timeout``,
        any other refusal as ``env_error``."""
        return "turn_timeout" if self.kind == "timeout" else "env_error"


class RemoteEnvLost(RemoteEnvError):
    """The server hosting the env is unreachable, restarted, or no longer has the session."""

    mask_reason = "env_lost"

    def __init__(self, message: str, kind: str = "lost"):
        super().__init__(message, kind)


#: where a client finds the token when none is given (the trainer token first)
TOKEN_ENV_VARS = ("TURNGYM_SERVE_TRAINER_TOKEN", "TURNGYM_SERVE_TOKEN")


def client_token(token: str | None = None) -> str | None:
    """``token``, else the first of :data:`TOKEN_ENV_VARS` that is set, else None."""
    if token:
        return token
    return next((os.environ[v] for v in TOKEN_ENV_VARS if os.environ.get(v)), None)


def _http_base(url: str) -> str:
    url = url.rstrip("/")
    if url.startswith("ws://") or url.startswith("wss://"):
        url = "http" + url[2:]
    if not url.startswith(("http://", "https://")):
        url = "http://" + url
    return url


def _ws_url(url: str) -> str:
    return "ws" + _http_base(url)[4:] + "/ws"


class RemoteEnv(Env):
    """A turngym env served by ``turngym serve`` (see the module docstring)."""

    def __init__(
        self,
        url: str,
        env_id: str | None = None,
        *,
        max_turns: int | None = None,
        timeout: float | None = 300.0,
        connect_timeout: float = 10.0,
        token: str | None = None,
        _session: SessionInfo | None = None,
        **env_kwargs: Any,
    ):
        """``url``: the server (``http://host:port``); ``env_id``: which of its envs (default: its first);
        ``env_kwargs``: passed to ``make`` on the server; ``max_turns``: tightens the remote env's limit;
        ``timeout``: seconds a call may take before it fails; ``token``: the server's (default: from the
        environment, :data:`TOKEN_ENV_VARS`)."""
        super().__init__(parser=None)
        self.url = _http_base(url)
        self._token = client_token(token)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._ws: Any = None
        self._ws_lock: asyncio.Lock | None = None
        self._ids = itertools.count()
        if _session is None:
            request = CreateSession(env_id=env_id, kwargs=env_kwargs, max_turns=max_turns)
            _session = SessionInfo.model_validate(self._http("POST", "/sessions", request))
        self._adopt(_session)

    # ------------------------------------------------------------ env interface
    def _adopt(self, info: SessionInfo) -> None:
        self.session = info
        self.remote_env_id = info.env_id
        self.parser = get_parser(info.parser)
        self.tools_in_prompt = info.tools_in_prompt
        self.max_turns = info.max_turns
        self.turn, self._done, self._remote_state_key = info.turn, info.done, info.state_key
        from turngym.core.spaces import ActionSpace

        self.action_space = ActionSpace(info.tools)

    @property
    def tools(self) -> list[ToolSpec]:
        return list(self.session.tools)

    @property
    def forkable(self) -> bool:  # type: ignore[override]
        return self.session.forkable

    def tool_instructions(self) -> str:
        return self.session.instructions if self.tools_in_prompt else ""

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        self._check_open()
        cap = self.pending_turn_cap()  # limit_turns (TurnLimited) tightened the local limit already
        if cap is not None:
            capped = LimitTurnsReply.model_validate(await self._op("limit_turns", {"max_turns": cap}))
            self.max_turns = capped.max_turns
        reply = ResetReply.model_validate(await self._op("reset", {"seed": seed, "options": options}))
        gymnasium.Env.reset(self, seed=seed)  # the local np_random follows the seed, as for any Env
        self.turn, self._done = 0, False
        self.task = Task(reply.observation, str(reply.info.get("task_id", "")))
        self._remote_state_key = reply.info.get("state_key")
        return reply.observation, reply.info

    async def astep(self, action: str | Message) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        self._check_open()
        data = {"action": action.model_dump(mode="json") if isinstance(action, Message) else str(action)}
        reply = StepReply.model_validate(await self._op("step", data))
        info = {**reply.info, "tool_results": reply.tool_results}
        self.turn = int(info.get("turn", self.turn + 1))
        self._done = reply.terminated or reply.truncated
        self._remote_state_key = info.get("state_key")
        return reply.observation, reply.reward, reply.terminated, reply.truncated, info

    def expert_action(self) -> Any:
        """The server-side env's scripted expert action: an awaitable when called from a running event
        loop (``ScriptedAgent`` awaits it), else the action itself (the sync API)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._run(self._expert())
        return self._expert()

    async def _expert(self) -> str | Message | None:
        self._check_open()
        return ExpertReply.model_validate(await self._op("expert")).action

    def _state_key(self) -> str | None:
        """The remote env's state key, as of the last reply."""
        return self._remote_state_key

    async def afork(self) -> RemoteEnv:
        """A new ``RemoteEnv`` on a server-side fork of this env (:meth:`Env.fork` semantics)."""
        if self._closed:
            raise ForkError(f"RemoteEnv ({self.remote_env_id} at {self.url}) is closed: cannot fork it")
        try:
            info = SessionInfo.model_validate(await self._op("fork"))
        except RemoteEnvError as e:
            if e.kind == "not_forkable":
                raise NotForkable(str(e)) from e
            if e.kind == "env_error":
                raise ForkError(str(e)) from e
            raise
        child = RemoteEnv(
            self.url,
            timeout=self.timeout,
            connect_timeout=self.connect_timeout,
            token=self._token,
            _session=info,
        )
        child.task = self.task
        child._np_random = copy.deepcopy(self._np_random)  # the local RNG forks too (Env.fork semantics)
        return child

    def fork(self) -> RemoteEnv:
        return self._run(self.afork())

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = self._done = True
        try:
            if self._ws is not None:
                await self._op("close")
            else:  # never attached: close the session over HTTP
                await asyncio.to_thread(self._http, "DELETE", f"/sessions/{self.session.session_id}")
        except RemoteEnvError:
            pass  # the server or the session is gone already: nothing left to close
        finally:
            ws, self._ws = self._ws, None
            if ws is not None:
                try:
                    await ws.close()
                except Exception:  # noqa: BLE001 - closing a dead connection
                    pass

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"RemoteEnv ({self.remote_env_id} at {self.url}) is closed")

    # ------------------------------------------------------------ transport
    def _http(self, method: str, path: str, body: BaseModel | None = None) -> dict[str, Any]:
        import httpx

        try:
            response = httpx.request(
                method,
                self.url + path,
                json=body.model_dump(mode="json") if body is not None else None,
                headers=self._headers(),
                timeout=httpx.Timeout(self.timeout, connect=self.connect_timeout),
            )
        except httpx.HTTPError as e:
            raise RemoteEnvLost(f"env server {self.url} unreachable: {type(e).__name__}: {e}") from e
        if response.status_code >= 400:
            raise _error_from(response.text, response.status_code, self.url)
        return response.json()

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    async def _connect(self) -> None:
        from websockets.asyncio.client import connect
        from websockets.exceptions import InvalidStatus

        try:
            self._ws = await connect(
                _ws_url(self.url),
                open_timeout=self.connect_timeout,
                max_size=None,
                additional_headers=self._headers(),
            )
        except InvalidStatus as e:  # the server answered, and refused the handshake (token, Host, Origin)
            body = bytes(e.response.body or b"").decode("utf-8", "replace")
            raise _error_from(body, e.response.status_code, self.url) from e
        except (OSError, TimeoutError, Exception) as e:  # noqa: BLE001 - any failure to connect is a lost env
            raise RemoteEnvLost(f"cannot reach env server {self.url}: {type(e).__name__}: {e}") from e
        await self._send("attach", {"session_id": self.session.session_id}, None)

    async def _op(self, op: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
        if self._ws_lock is None:
            self._ws_lock = asyncio.Lock()
        async with self._ws_lock:
            if self._ws is None:
                await self._connect()
            return await self._send(op, data or {}, self.session.session_id)

    async def _send(self, op: str, data: dict[str, Any], session_id: str | None) -> dict[str, Any]:
        from websockets.exceptions import ConnectionClosed

        request_id = next(self._ids)
        frame = json.dumps({"id": request_id, "op": op, "session_id": session_id, "data": data})
        try:
            await self._ws.send(frame)
            raw = await asyncio.wait_for(self._ws.recv(), self.timeout)
        except TimeoutError as e:  # before OSError, its base class
            # the late reply would answer the next request: drop the connection (the server then
            # closes the session, so a later call is a RemoteEnvLost)
            ws, self._ws = self._ws, None
            await ws.close()
            raise RemoteEnvError(
                f"env server {self.url}: {op!r} got no reply in {self.timeout}s", "timeout"
            ) from e
        except (ConnectionClosed, OSError) as e:
            self._ws = None
            raise RemoteEnvLost(
                f"env server {self.url} went away during {op!r} (session {self.session.session_id}): "
                f"{type(e).__name__}: {e}"
            ) from e
        reply = WsReply.model_validate_json(raw)
        if reply.id != request_id:
            raise RemoteEnvError(
                f"env server {self.url}: reply {reply.id} to request {request_id}", "protocol"
            )
        if not reply.ok:
            error = reply.error
            kind = error.kind if error is not None else "internal"
            message = f"env server {self.url}: {op!r} failed ({kind}): {error.error if error else '?'}"
            raise (RemoteEnvLost if kind == "unknown_session" else RemoteEnvError)(message, kind)
        return reply.data or {}


def _error_from(text: str, status: int, url: str) -> RemoteEnvError:
    try:
        detail = json.loads(text)["detail"]
        kind, message = detail["kind"], detail["error"]
    except (ValueError, KeyError, TypeError):
        kind, message = "internal", text[:500]
    full = f"env server {url} refused ({status} {kind}): {message}"
    return (RemoteEnvLost if kind == "unknown_session" else RemoteEnvError)(full, kind)
