"""``Env``: the chat-and-tools environment every family subclasses (Gymnasium API, sync and async).

A subclass writes ``@tool`` methods (sync or async; ``@tool(terminal=True)`` ends the episode when it
succeeds), ``_reset(rng, options) -> Task`` and ``_turn_reward(results, done)`` (reward components,
summed unless ``_reward`` says otherwise), and optionally ``_observe``, ``_state_key``, ``_close``,
``_step_info``, ``_fork``/``_after_fork`` and ``expert_action``. Any hook may be ``async``; the sync
``_reset``/``_close`` run in a worker thread (``sync_hooks_in_thread`` picks the hooks), and the
rollout engine builds the env in a worker thread unless the class sets ``construct_in_thread = False``.

The base class parses each action with the env's parser, dispatches the calls through a ``ToolBox``
(every failure becomes an error observation), counts turns, truncates at ``max_turns`` (tightened by
``limit_turns``, :class:`turngym.core.env.TurnLimited`), fills the standard ``info`` keys, and forks
(``forkable = True``: a deep copy of the env less the read-only ``_fork_shared`` members).
docs/api.md describes every hook and ``info`` key.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import inspect
import json
import threading
import warnings
from collections.abc import Awaitable
from typing import Any, TypeVar

import gymnasium
import numpy as np

from turngym.core.env import INVALID_KINDS, ForkError, NotForkable, Task, TurnLimited
from turngym.core.spaces import ActionSpace, MessagesSpace
from turngym.core.types import Message, ToolCall, ToolResult, ToolSpec
from turngym.tools.parsers import ToolCallParser, get_parser
from turngym.tools.toolbox import ToolBox

T = TypeVar("T")


async def _maybe_await(value: T | Awaitable[T]) -> T:
    if inspect.isawaitable(value):
        return await value
    return value  # type: ignore[return-value]


class Env(TurnLimited, gymnasium.Env[list[Message], str]):
    """A chat-and-tools environment with the Gymnasium API (sync and async)."""

    metadata: dict[str, Any] = {"render_modes": ["ansi"]}
    default_max_turns: int = 10
    sync_hooks_in_thread: bool | tuple[str, ...] = ("_reset", "_close")
    #: Whether the rollout engine builds this env in a worker thread (see the module docstring).
    construct_in_thread: bool = True
    #: Whether ``fork()`` works. A family opts in after checking that a deep copy of its state (less
    #: ``_fork_shared``) is an independent env; see :meth:`fork`.
    forkable: bool = False
    #: Attributes shared by reference with a fork instead of deep-copied: large, read-only members (a
    #: search index, a task list, a database). Anything an episode mutates must not be named here.
    _fork_shared: tuple[str, ...] = ()
    #: Why this family cannot fork (the ``NotForkable`` message); families that cannot fork say why.
    _not_forkable_reason: str = "its family does not implement fork() (Env.forkable is False)"
    #: set by the constructor (the env surface, :class:`turngym.core.env.EnvProtocol`)
    parser: ToolCallParser
    max_turns: int
    tools_in_prompt: bool

    def __init__(
        self,
        *,
        max_turns: int | None = None,
        parser: str | ToolCallParser | None = None,
        tool_timeout: float | None = 30.0,
        max_output_chars: int = 16_000,
        max_calls_per_turn: int = 8,
        tools_in_prompt: bool = True,
        render_mode: str | None = None,
    ):
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode {render_mode!r} not in {self.metadata['render_modes']}")
        self.render_mode = render_mode
        self.max_turns = int(max_turns if max_turns is not None else self.default_max_turns)
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        self.parser = get_parser(parser)
        self.max_calls_per_turn = max_calls_per_turn
        self.tools_in_prompt = tools_in_prompt
        self.toolbox = ToolBox.from_object(self, timeout=tool_timeout, max_output_chars=max_output_chars)
        self.observation_space = MessagesSpace()
        self.action_space = ActionSpace(self.toolbox.specs)
        self.turn = 0
        self.task: Task | None = None
        self._done = True
        self._terminated = False
        self._closed = False
        self._last_render = ""
        self._call_history: list[str] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._busy: str | None = None  # "reset"/"step" while one runs: fork() refuses then

    # ------------------------------------------------------------------ hooks
    def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> Task | Awaitable[Task]:
        raise NotImplementedError

    def _turn_reward(
        self, results: list[ToolResult], done: bool
    ) -> dict[str, float] | Awaitable[dict[str, float]]:
        return {}

    def _observe(self, results: list[ToolResult]) -> list[Message] | Awaitable[list[Message]]:
        return []

    def _state_key(self) -> str | None:
        payload = json.dumps([self.task.task_id if self.task else "", self._call_history])
        return hashlib.sha1(payload.encode()).hexdigest()[:16]

    def _close(self) -> None | Awaitable[None]:
        return None

    def _fork(self) -> Env | Awaitable[Env]:
        """The new env of :meth:`fork` (already checked: forkable, open, reset, not mid-step).

        Default: :meth:`_fork_copy`. Override for state a deep copy cannot branch (a container, a
        browser); the override may be async. It runs on the caller's thread, never in a worker thread,
        so no step of this env interleaves with it.
        """
        return self._fork_copy()

    def _after_fork(self) -> None | Awaitable[None]:
        """Called on the new env after the copy: open resources of its own (clients, files). May be async."""
        return None

    def _reward(self, components: dict[str, float]) -> float:
        """The scalar reward of a turn from its components: their sum, unless an env documents otherwise
        (e.g. reporting EM and F1 but paying only one of them)."""
        return sum(components.values())

    def _step_info(self) -> dict[str, Any] | Awaitable[dict[str, Any]]:
        """Extra ``info`` keys for this step (e.g. ``masked``/``mask_reason`` after a sandbox fault);
        they never replace the standard keys."""
        return {}

    def expert_action(self) -> str | Message | None:
        """The next action of a scripted expert that may read privileged state; None if none.
        Write its calls with :meth:`format_call`, so they follow the env's parser."""
        return None

    def format_call(self, name: str, arguments: dict[str, Any]) -> str | Message:
        """``name(**arguments)`` as the policy should write it under this env's parser (Hermes text,
        Search-R1 tags, or an OpenAI message); a ``ValueError`` if the protocol cannot carry it."""
        return self.parser.format_call(ToolCall(name=name, arguments=arguments))

    # ------------------------------------------------------------ public API
    def fork(self) -> Env:
        """A new, independent env in exactly this env's current state.

        Same task and first messages, turn count, turn limit, tool state, call history and RNG stream
        position (the generators are copied, not shared); stepping or closing the fork never changes
        this env, and the reverse. The fork is open and owns its resources (close it like any env);
        ``_fork_shared`` members (large, read-only) are the only ones it shares with this env.

        Raises :class:`NotForkable` if the family cannot fork (``forkable`` is False), and
        :class:`ForkError` if this env is closed, was never reset, or is in the middle of a step or reset.
        A finished episode forks into a finished episode.
        """
        self._check_fork()
        child = self._fork()
        if inspect.isawaitable(child):
            child = self._run(child)
        after = child._after_fork()
        if inspect.isawaitable(after):
            child._run(after)
        return child

    async def afork(self) -> Env:
        """The async form of :meth:`fork` (for the rollout engine's event loop)."""
        self._check_fork()
        child = await _maybe_await(self._fork())
        await _maybe_await(child._after_fork())
        return child

    def _fork_copy(self) -> Env:
        """A deep copy of this env's ``__dict__`` into a new instance of its class.

        Shared, not copied: the ``_fork_shared`` members, the parser (stateless), the registry spec and
        the tool definitions (each tool is rebound to the new env). Fresh in the new env: its event
        loop (made on first use), and the closed/busy flags.
        """
        cls = type(self)
        child = cls.__new__(cls)
        memo: dict[int, Any] = {id(self): child}
        shared: list[Any] = [self.parser, self.spec]
        for name in self._fork_shared:
            if name not in self.__dict__:
                raise AttributeError(
                    f"{cls.__name__}._fork_shared names {name!r}, which the env does not have"
                )
            shared.append(self.__dict__[name])
        for bound in self.toolbox._tools.values():
            shared += [bound.definition, bound.definition.spec]
        for obj in shared:
            memo[id(obj)] = obj
        fresh = {"_loop": None, "_closed": False, "_busy": None}
        state = {k: (fresh[k] if k in fresh else copy.deepcopy(v, memo)) for k, v in self.__dict__.items()}
        child.__dict__.update(state)
        return child

    def _check_fork(self) -> None:
        name = f"{self.spec.id} ({type(self).__name__})" if self.spec is not None else type(self).__name__
        if not self.forkable:
            raise NotForkable(f"{name} cannot fork: {self._not_forkable_reason}")
        if self._closed:
            raise ForkError(f"{name} is closed: cannot fork it")
        if self._busy is not None:
            raise ForkError(f"{name} is in the middle of a {self._busy}: fork before or after it, not during")
        if self.task is None:
            raise ForkError(f"{name} was never reset: call reset() before fork()")

    @property
    def tools(self) -> list[ToolSpec]:
        return self.toolbox.specs

    @property
    def terminated(self) -> bool:
        return self._terminated

    def end_episode(self) -> None:
        """Called by a tool or hook: the episode ends (terminated) after this turn."""
        self._terminated = True

    def tool_instructions(self) -> str:
        """Text describing the tools in the parser's convention (for the system prompt)."""
        return self.parser.instructions(self.tools) if self.tools_in_prompt else ""

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        self._check_open()
        self._busy = "reset"
        try:
            return await self._areset(seed, options)
        finally:
            self._busy = None

    async def _areset(
        self, seed: int | None, options: dict[str, Any] | None
    ) -> tuple[list[Message], dict[str, Any]]:
        gymnasium.Env.reset(self, seed=seed)
        self.turn = 0
        self._terminated = False
        self._call_history = []
        task = await self._hook("_reset", self.np_random, dict(options or {}))
        if not isinstance(task, Task):
            raise TypeError(f"{type(self).__name__}._reset must return a Task, got {type(task).__name__}")
        self.task = task
        self._done = False
        obs = [m.model_copy(deep=True) for m in task.messages]
        self._last_render = _render_messages(obs)
        info = {
            "task_id": task.task_id,
            "reference": copy.deepcopy(task.reference),
            "state_key": self._state_key(),
            "turn": 0,
            **copy.deepcopy(task.info),
        }
        return obs, info

    async def astep(self, action: str | Message) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        self._check_open()
        if self._done or self.task is None:
            raise RuntimeError("the episode is over (or never started): call reset() first")
        self._busy = "step"
        try:
            return await self._astep(action)
        finally:
            self._busy = None

    async def _astep(self, action: str | Message) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        self.turn += 1
        parsed = self.parser.parse(action)
        obs: list[Message] = []
        results: list[ToolResult] = []
        errors: list[str] = []
        invalid = False

        for pc in parsed.calls:
            if not pc.ok:
                invalid = True
                errors.append(pc.error or pc.status)
                results.append(ToolResult(name="", ok=False, error=pc.error, error_kind="parse_error"))
                obs.append(self.parser.format_error(pc.error or pc.status))
        calls = parsed.valid_calls
        if not parsed.calls:
            invalid = True
            msg = "no tool call found in the action. " + self._call_hint()
            errors.append(msg)
            results.append(ToolResult(name="", ok=False, error=msg, error_kind="no_call"))
            obs.append(self.parser.format_error(msg))
        if len(calls) > self.max_calls_per_turn:
            invalid = True
            msg = f"{len(calls)} tool calls in one turn; only the first {self.max_calls_per_turn} were run"
            errors.append(msg)
            results.append(ToolResult(name="", ok=False, error=msg, error_kind="too_many_calls"))
            obs.append(self.parser.format_error(msg))
            calls = calls[: self.max_calls_per_turn]

        for i, call in enumerate(calls):
            if not call.id:  # deterministic ids, unique within the episode
                call = call.model_copy(update={"id": f"call_{self.turn}_{i}"})
            res = await self.toolbox.call(call)
            results.append(res)
            obs.append(self.parser.format_result(res))
            if res.ok:
                self._call_history.append(
                    f"{call.name}:{json.dumps(call.arguments, sort_keys=True, default=str)}"
                )
                if self.toolbox.is_terminal(call.name):
                    self._terminated = True
            else:
                errors.append(res.error or "tool failed")
                invalid = invalid or res.error_kind in INVALID_KINDS
            if self._terminated:
                break

        obs.extend(await self._hook("_observe", results))
        terminated = self._terminated
        truncated = not terminated and self.turn >= self.max_turns
        done = terminated or truncated
        components = {k: float(v) for k, v in (await self._hook("_turn_reward", results, done)).items()}
        reward = float(self._reward(components))
        self._done = done
        self._last_render = _render_messages([_as_message(action), *obs])
        info: dict[str, Any] = {
            "reward_components": components,
            "invalid_action": invalid,
            "error": "; ".join(errors),
            "state_key": self._state_key(),
            "turn": self.turn,
            "task_id": self.task.task_id,
            "reference": copy.deepcopy(self.task.reference),
            "tool_results": results,
        }
        for k, v in (await self._hook("_step_info")).items():
            info.setdefault(k, v)
        return obs, reward, terminated, truncated, info

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._done = True
        await self._hook("_close")

    # ------------------------------------------------------- sync wrappers
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        return self._run(self.areset(seed=seed, options=options))

    def step(self, action: str | Message) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        return self._run(self.astep(action))

    def close(self) -> None:
        if self._closed:
            return
        self._run(self.aclose())
        if self._loop is not None:
            self._loop.close()
            self._loop = None

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return self._last_render
        return None

    # ---------------------------------------------------------- internals
    async def _hook(self, name: str, *args: Any) -> Any:
        """Call hook ``name``: a sync override in a worker thread (see ``sync_hooks_in_thread``)."""
        fn = getattr(self, name)
        chosen = self.sync_hooks_in_thread
        threaded = chosen is True or (not isinstance(chosen, bool) and name in chosen)
        overridden = getattr(type(self), name) is not getattr(Env, name)
        if threaded and overridden and not inspect.iscoroutinefunction(fn):
            return await _maybe_await(await asyncio.to_thread(fn, *args))
        return await _maybe_await(fn(*args))

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")

    def _call_hint(self) -> str:
        """How to write a call, as this env's parser says it (an action with no call gets it back)."""
        hint = getattr(self.parser, "call_hint", None)  # a third-party parser may not have one
        return hint(self.tools) if hint is not None else self.parser.instructions(self.tools)

    def _run(self, coro: Awaitable[T]) -> T:
        """Run a coroutine to completion from sync code, on this env's own event loop.

        The loop persists across calls so that resources bound to it (async clients,
        subprocesses, browsers) stay valid. Called from inside a running loop, the work
        runs on a helper thread instead.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            if self._loop is None or self._loop.is_closed():
                self._loop = asyncio.new_event_loop()
            return self._loop.run_until_complete(coro)
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                if self._loop is None or self._loop.is_closed():
                    self._loop = asyncio.new_event_loop()
                box["value"] = self._loop.run_until_complete(coro)
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                box["error"] = e

        th = threading.Thread(target=target, daemon=True)
        th.start()
        th.join()
        if "error" in box:
            raise box["error"]
        return box["value"]

    def __del__(self) -> None:
        loop = getattr(self, "_loop", None)
        if loop is not None and not loop.is_closed() and not loop.is_running():
            loop.close()


class AsyncEnv(Env):
    """Deprecated alias of :class:`Env`, kept for compatibility; subclass ``Env`` instead.

    Every ``Env`` has the async path: its hooks and tools may be coroutines (I/O-bound families:
    Docker, browsers), the rollout engine calls ``areset``/``astep``/``aclose`` on the caller's event
    loop, and ``reset``/``step``/``close`` run them on the env's own loop. ``AsyncEnv`` adds nothing;
    a class that subclasses it directly gets a ``DeprecationWarning`` and otherwise behaves as an ``Env``.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if AsyncEnv in cls.__bases__:
            warnings.warn(
                f"{cls.__qualname__} subclasses turngym.AsyncEnv, a deprecated alias of turngym.Env "
                "(every Env has the async path): subclass Env",
                DeprecationWarning,
                stacklevel=2,
            )


def _as_message(action: str | Message) -> Message:
    return action if isinstance(action, Message) else Message(role="assistant", content=str(action))


def _render_messages(messages: list[Message]) -> str:
    lines = []
    for m in messages:
        head = m.role + (f" ({m.name})" if m.name else "")
        lines.append(f"[{head}] {m.content}" + (f" <{len(m.images)} image(s)>" if m.images else ""))
    return "\n".join(lines)
