"""The sessions of ``turngym serve``: one env per session, their limits, and the operations on them.

* Each session is one env (``make(env_id, **kwargs)``), driven through ``areset``/``astep``/``aclose``
  on the server's event loop; calls on one session are serialized, sessions run concurrently.
* The make() arguments are the operator's (``env_kwargs``, ``env_kwargs_for``) plus the ones a client
  may set (``client_args``): :mod:`turngym.remote.env_args` holds the rules.
* Sessions a websocket opens belong to it and are closed when it closes (a client that disconnects
  mid-episode leaks nothing); every session, HTTP or WebSocket, is closed after ``idle_timeout``
  seconds without a call. ``max_sessions`` bounds live envs: one more is refused with ``server_full``.
* ``fork`` (envs whose family can fork) makes a new session in the same state; over a websocket the
  fork is left unowned until a connection ``attach``-es it.
* Privileged info (:data:`~turngym.remote.protocol.PRIVILEGED_INFO_KEYS`, the gold ``reference``) and
  the scripted expert's action go only to callers the server's guard marks as trainers.
* Errors are typed (:data:`~turngym.remote.protocol.ERROR_STATUS`) and short.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from turngym.core.env import ForkError, NotForkable
from turngym.core.registry import UnknownEnvError, make, spec
from turngym.remote.env_args import ArgPolicy, ArgRefused
from turngym.remote.protocol import (
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
    excerpt,
    info_to_wire,
    jsonable,
    public_info,
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
    """Session counters of one server (its ``/health`` answer)."""

    opened: int = 0  # sessions created or forked
    closed: int = 0  # sessions closed, for any reason
    closed_idle: int = 0  # of those, by the idle reaper
    closed_disconnect: int = 0  # of those, because the websocket that owned them went away
    refused_full: int = 0  # creates and forks refused at ``max_sessions``
    close_errors: int = 0  # closes whose ``env.aclose()`` raised (counted and logged)


class SessionManager:
    """The live sessions of one server, with the limits and the idle reaper."""

    def __init__(
        self,
        envs: list[str],
        *,
        max_sessions: int = 64,
        idle_timeout: float | None = 600.0,
        env_kwargs: Mapping[str, Any] | None = None,
        env_kwargs_for: Mapping[str, Mapping[str, Any]] | None = None,
        client_args: Iterable[str] | Mapping[str, Iterable[str]] = (),
    ):
        """``env_kwargs``: the operator's make() arguments for every served env, ``env_kwargs_for``:
        for one (env id -> arguments; they win over ``env_kwargs``); ``client_args``: the argument
        names clients may set, for every env (a list) or per env id (a mapping; key ``"*"``: every env).
        A name that is never client-settable (:mod:`~turngym.remote.env_args`) is a ``ValueError``."""
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
        self.policies = self._policies(env_kwargs_for or {}, client_args)
        self.sessions: dict[str, Session] = {}
        self.stats = ServeStats()
        self._opening = 0  # slots reserved by sessions being built
        self._reaper: asyncio.Task | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def _policies(
        self, env_kwargs_for: Mapping[str, Mapping[str, Any]], client_args: Iterable[str] | Mapping[str, Any]
    ) -> dict[str, ArgPolicy]:
        per_env = {spec(k).id: dict(v) for k, v in env_kwargs_for.items()}
        allowed: dict[str, set[str]] = {e: set() for e in self.envs}
        if isinstance(client_args, Mapping):
            for key, names in client_args.items():
                for env in self.envs if key == "*" else [spec(key).id]:
                    if env not in allowed:
                        raise ValueError(f"--client-arg for {key!r}: that env is not served here")
                    allowed[env].update(names)
        else:
            for env in allowed:
                allowed[env].update(client_args)
        for env in per_env:
            if env not in allowed:
                raise ValueError(f"--env-arg for {env!r}: that env is not served here")
        policies = {}
        for env in self.envs:
            fixed = {**self.env_kwargs, **per_env.get(env, {})}
            if allowed[env]:
                policies[env] = ArgPolicy.build(env, spec(env).load(), fixed, allowed[env])
            else:  # nothing client-settable: no need to import the env to know its parameters
                policies[env] = ArgPolicy(env_id=env, fixed=fixed)
        return policies

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
        except ValueError as e:  # not an env id at all ("../", "os:system", "", NUL)
            raise ServeError("malformed", str(e)) from None
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
        try:
            kwargs = self.policies[env_id].merge(req.kwargs)
        except ArgRefused as e:
            raise ServeError(e.kind, str(e)) from None
        self._reserve()
        try:
            try:
                env = await asyncio.to_thread(make, env_id, **kwargs)
            except (TypeError, ValueError, KeyError) as e:
                names = ", ".join(sorted(req.kwargs)) or "no client arguments"
                raise ServeError("bad_request", f"cannot make {env_id!r} ({excerpt(names, 200)}): {e}") from e
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
            except (TypeError, ValueError, KeyError) as e:  # e.g. reset options of the wrong kind
                raise ServeError("bad_request", f"{type(e).__name__}: {e}") from e
            finally:
                session.last_used = time.monotonic()

    def _visible(self, s: Session, info: dict[str, Any], trainer: bool) -> dict[str, Any]:
        return info if trainer else public_info(info, set(getattr(s.base, "privileged_info", ())))

    async def reset(self, session_id: str | None, req: ResetRequest, *, trainer: bool = False) -> ResetReply:
        """Reset; privileged info only for a ``trainer`` caller."""

        async def run(s: Session) -> ResetReply:
            obs, info = await s.env.areset(seed=req.seed, options=req.options)
            return ResetReply(observation=obs, info=jsonable(self._visible(s, info, trainer)))

        return await self._call(session_id, run)  # type: ignore[return-value]

    async def step(self, session_id: str | None, req: StepRequest, *, trainer: bool = False) -> StepReply:
        """Step; privileged info only for a ``trainer`` caller."""

        async def run(s: Session) -> StepReply:
            obs, reward, terminated, truncated, info = await s.env.astep(req.action)
            wire_info, results = info_to_wire(self._visible(s, info, trainer))
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

    async def expert(self, session_id: str | None, *, trainer: bool = False) -> ExpertReply:
        """The scripted expert's action: the solution, so for trainers only."""
        if not trainer:
            self.get(session_id)
            raise ServeError(
                "trainer_only",
                "the expert's action is privileged: only trainers get it (the server's --trainer-token)",
            )

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
    async def dispatch(self, frame: str | bytes, owner: object, *, trainer: bool = False) -> WsReply:
        """Answer one websocket frame (a :class:`WsRequest`) of a ``trainer`` caller or not; never raises."""
        request_id: Any = None
        try:
            try:  # Python's JSON reader: a lone surrogate escape in an action reaches the env's parser,
                # which makes it an invalid turn (pydantic's strict reader would refuse the whole frame)
                req = WsRequest.model_validate(json.loads(frame))
            except ValueError as e:  # JSONDecodeError and ValidationError
                why = summary(e) if isinstance(e, ValidationError) else str(e)
                raise ServeError("malformed", f"malformed websocket message: {why}") from None
            request_id = req.id
            handler, body = OPS[req.op]
            try:
                payload = body.model_validate(req.data) if body is not None else None
            except ValidationError as e:
                raise ServeError("malformed", f"malformed {req.op!r} data: {summary(e)}") from None
            result = await handler(self, req.session_id, payload, Caller(owner, trainer))
            return WsReply(id=request_id, ok=True, data=result.model_dump(mode="json"))
        except ServeError as e:
            return WsReply(id=request_id, ok=False, error=e.body())
        except Exception as e:  # noqa: BLE001 - an env bug is reported to the client, not raised
            log.exception("websocket op failed")
            return WsReply(
                id=request_id,
                ok=False,
                error=ErrorBody(error=excerpt(f"{type(e).__name__}: {e}"), kind="internal"),
            )


def _state_key(base: Any) -> str | None:
    if getattr(base, "task", None) is None:
        return None
    key = base._state_key()
    return None if key is None else str(key)


def summary(e: ValidationError) -> str:
    """A pydantic error, short: each field's location and message (never the input)."""
    parts = [f"{'.'.join(str(p) for p in err['loc']) or '(message)'}: {err['msg']}" for err in e.errors()]
    return "; ".join(parts[:5]) + (f" (+{len(parts) - 5} more)" if len(parts) > 5 else "")


@dataclass(frozen=True)
class Caller:
    """Who makes a call: the websocket connection that owns what it opens (None: HTTP), and whether
    the guard marked it a trainer."""

    owner: object | None = None
    trainer: bool = False


async def _close(m: SessionManager, session_id: str | None, _: Any, c: Caller) -> Closed:
    m.get(session_id)
    return Closed(closed=await m.close(session_id))


#: a session op -> (handler(manager, session id, validated data, caller), data model or None); the
#: websocket's ops, and (through ``server._HTTP_OPS``) the HTTP routes ``/sessions/{session_id}...``
OPS: dict[str, tuple[Callable[..., Awaitable[BaseModel]], type[BaseModel] | None]] = {
    "create": (lambda m, s, d, c: m.create(d, owner=c.owner), CreateSession),
    "attach": (lambda m, s, d, c: _async(m.attach(d.session_id, c.owner)), AttachRequest),
    "reset": (lambda m, s, d, c: m.reset(s, d, trainer=c.trainer), ResetRequest),
    "step": (lambda m, s, d, c: m.step(s, d, trainer=c.trainer), StepRequest),
    "tools": (lambda m, s, d, c: m.tools(s), None),
    "expert": (lambda m, s, d, c: m.expert(s, trainer=c.trainer), None),
    "limit_turns": (lambda m, s, d, c: m.limit_turns(s, d), LimitTurns),
    "fork": (lambda m, s, d, c: m.fork(s, owner=None), None),  # unowned until attached
    "close": (_close, None),
}


async def _async(value: BaseModel) -> BaseModel:
    return value
