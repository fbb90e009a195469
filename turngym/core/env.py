"""The env contract: what every env, wrapper, ``RayEnv`` and ``RemoteEnv`` offers the rollout engine.

:class:`EnvProtocol` is the typed surface (the async episode calls, the tools and their instructions,
the parser, the turn limit, forking, a scripted expert); ``turngym.testing``'s conformance suite checks
that an env satisfies it. :class:`TurnLimited` holds ``limit_turns``, the one way a caller caps an
episode: it tightens the env's own limit (``max_turns``) and never loosens it. Also here: the
:class:`Task` a reset returns, the fork errors, and the error kinds that make a turn invalid.

The chat-and-tools base class every family subclasses, :class:`turngym.Env`, builds on the tools
layer (it parses actions and dispatches tool calls) and lives in :mod:`turngym.tools.env`.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from turngym.core.types import Message, ToolSpec


class ForkError(RuntimeError):
    """``fork()`` cannot run now: the env is closed, was never reset, or is in the middle of a step."""


class NotForkable(ForkError):
    """``fork()`` of an env whose family cannot fork (``env.forkable`` is False); the message says why."""


#: ``error_kind`` values that make a turn an invalid action (the model's fault, not the tool's).
INVALID_KINDS = frozenset(
    {"unknown_tool", "bad_arguments", "tool_error", "parse_error", "no_call", "too_many_calls"}
)


@dataclass
class Task:
    """What ``_reset`` returns: the first messages and the task's identity and references."""

    messages: list[Message]
    task_id: str
    reference: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


def pick_task_index(options: dict[str, Any], index_of: dict[str, int], n: int, rng: Any) -> int:
    """The index of a reset's task among ``n`` dataset tasks: ``options["task_id"]`` (looked up in
    ``index_of``; an unknown id is a ``ValueError``), else ``options["task_index"]`` (mod ``n``), else
    one drawn from the episode's ``rng``."""
    if "task_id" in options:
        if options["task_id"] not in index_of:
            raise ValueError(f"unknown task_id {options['task_id']!r}")
        return index_of[options["task_id"]]
    if "task_index" in options:
        return int(options["task_index"]) % n
    return int(rng.integers(n))


def tightened(limit: int | None, max_turns: int) -> int:
    """``min(limit, max_turns)`` (``max_turns`` alone when there is no limit yet); ``max_turns`` < 1
    is a ``ValueError``."""
    cap = int(max_turns)
    if cap < 1:
        raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    return cap if limit is None else min(int(limit), cap)


class TurnLimited:
    """``limit_turns``, written once for every env kind.

    ``limit_turns(n)`` records the tightest cap asked for (``turn_cap``) and calls
    :meth:`_tighten_turns` with it: a local env lowers its ``max_turns`` at once; an env that lives
    elsewhere (``RemoteEnv``, ``RayEnv``) also sends the cap with its next reset (:meth:`pending_turn_cap`).
    """

    turn_cap: int | None = None
    _turn_cap_sent: int | None = None

    def limit_turns(self, max_turns: int) -> None:
        """Cap the episode at ``max_turns`` turns; a looser cap than one in force changes nothing."""
        self.turn_cap = tightened(self.turn_cap, max_turns)
        self._tighten_turns(self.turn_cap)

    def _tighten_turns(self, cap: int) -> None:
        self.max_turns = tightened(getattr(self, "max_turns", None), cap)

    def pending_turn_cap(self) -> int | None:
        """The cap not yet sent to where the env lives (None when none is pending); marks it sent."""
        if self.turn_cap is None or self.turn_cap == self._turn_cap_sent:
            return None
        self._turn_cap_sent = self.turn_cap
        return self.turn_cap


@runtime_checkable
class EnvProtocol(Protocol):
    """The surface the rollout engine, the server and the trainer use: every env, turngym wrapper,
    ``RayEnv`` and ``RemoteEnv`` has it. The sync ``reset``/``step``/``close`` are for local envs only."""

    forkable: bool

    @property
    def tools(self) -> list[ToolSpec]: ...

    @property
    def parser(self) -> Any: ...

    @property
    def max_turns(self) -> int | None: ...

    def tool_instructions(self) -> str: ...

    def limit_turns(self, max_turns: int) -> None: ...

    def expert_action(self) -> str | Message | None | Awaitable[str | Message | None]: ...

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]: ...

    async def astep(
        self, action: str | Message
    ) -> tuple[list[Message], float, bool, bool, dict[str, Any]]: ...

    async def aclose(self) -> None: ...

    def fork(self) -> Any: ...

    async def afork(self) -> Any: ...


#: the members of :class:`EnvProtocol`, for checks that name what is missing
ENV_SURFACE: tuple[str, ...] = (
    "forkable",
    "tools",
    "parser",
    "max_turns",
    "tool_instructions",
    "limit_turns",
    "expert_action",
    "areset",
    "astep",
    "aclose",
    "fork",
    "afork",
)


def missing_surface(obj: Any) -> list[str]:
    """The :data:`ENV_SURFACE` members that ``obj`` (an env, or an env class) lacks, and those of its
    episode calls that are not coroutine functions. Reads the class (its members and annotated
    instance attributes) and the instance's own attributes, so no property that needs an open env runs."""
    cls = obj if isinstance(obj, type) else type(obj)
    own = set(getattr(obj, "__dict__", {})) if not isinstance(obj, type) else set()
    declared = {n for klass in cls.__mro__ for n in vars(klass).get("__annotations__", {})}
    missing = [n for n in ENV_SURFACE if n not in own and n not in declared and not hasattr(cls, n)]
    for name in ("areset", "astep", "aclose", "afork"):
        fn = getattr(cls, name, None)
        if fn is not None and not inspect.iscoroutinefunction(fn):
            missing.append(f"{name} (not async)")
    return missing
