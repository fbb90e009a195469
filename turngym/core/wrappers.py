"""Wrappers that keep the async path: turn limit (tightening ``Env.max_turns``), reward-component totals,
trajectory recording.

Every ``AsyncWrapper`` forwards ``fork``/``afork``: the fork of a wrapped env is the same wrapper stack
around the fork of the inner env, each wrapper's own state (counters, the trajectory so far) deep-copied.
:func:`fork_env` / :func:`afork_env` fork any stack (turngym wrappers, Gymnasium wrappers, a bare ``Env``).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import gymnasium

from turngym.core.env import NotForkable
from turngym.core.types import Message, Trajectory


class AsyncWrapper(gymnasium.Wrapper):
    """A Gymnasium wrapper that also forwards ``areset``/``astep``/``aclose``.

    Subclasses override ``_on_reset`` / ``_on_step`` once; both paths use them.
    """

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = await self.env.areset(seed=seed, options=options)
        return self._on_reset(obs, info)

    async def astep(self, action: Any):
        return self._on_step(action, *(await self.env.astep(action)))

    async def aclose(self) -> None:
        await self.env.aclose()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        return self._on_reset(obs, info)

    def step(self, action: Any):
        return self._on_step(action, *self.env.step(action))

    def _on_reset(self, obs: list[Message], info: dict[str, Any]):
        return obs, info

    def _on_step(self, action: Any, obs, reward, terminated, truncated, info):
        return obs, reward, terminated, truncated, info

    @property
    def tools(self):
        return self.env.get_wrapper_attr("tools")

    @property
    def parser(self) -> Any:
        return self.env.get_wrapper_attr("parser")

    def tool_instructions(self) -> str:
        return self.env.get_wrapper_attr("tool_instructions")()

    def expert_action(self) -> Any:
        return self.env.get_wrapper_attr("expert_action")()

    @property
    def max_turns(self) -> int:
        """The turn limit in force: the wrapped env's own (``Env.max_turns``)."""
        return _turngym_env(self).max_turns

    def limit_turns(self, max_turns: int) -> None:
        """Tighten the wrapped env's own turn limit (``Env.limit_turns``)."""
        _turngym_env(self).limit_turns(max_turns)

    @property
    def forkable(self) -> bool:
        """Whether the wrapped env can fork (``Env.forkable``)."""
        return bool(getattr(self.env, "forkable", False))

    def fork(self) -> AsyncWrapper:
        """This wrapper stack around a fork of the wrapped env (``Env.fork``); wrapper state is copied."""
        return _rewrap(self, fork_env(self.env))

    async def afork(self) -> AsyncWrapper:
        return _rewrap(self, await afork_env(self.env))


def fork_env(env: Any) -> Any:
    """Fork ``env``: an ``Env``, a turngym wrapper, or a Gymnasium wrapper around one of those.

    A Gymnasium wrapper without ``fork`` is copied around the fork of its inner env (its own state
    deep-copied); anything else raises :class:`NotForkable`.
    """
    if callable(getattr(type(env), "fork", None)):
        return env.fork()
    if isinstance(env, gymnasium.Wrapper):
        return _rewrap(env, fork_env(env.env))
    raise NotForkable(f"{type(env).__name__} cannot fork: it has no fork() and is not a wrapper")


async def afork_env(env: Any) -> Any:
    """The async form of :func:`fork_env`."""
    if callable(getattr(type(env), "afork", None)):
        return await env.afork()
    if callable(getattr(type(env), "fork", None)):
        return env.fork()
    if isinstance(env, gymnasium.Wrapper):
        return _rewrap(env, await afork_env(env.env))
    raise NotForkable(f"{type(env).__name__} cannot fork: it has no fork() and is not a wrapper")


def _rewrap(wrapper: gymnasium.Wrapper, inner: Any) -> Any:
    """A copy of ``wrapper`` around ``inner``: its own attributes deep-copied, references to the wrapped
    env (and to itself) pointing at the new ones."""
    cls = type(wrapper)
    child = cls.__new__(cls)
    memo: dict[int, Any] = {id(wrapper): child, id(wrapper.env): inner}
    for k, v in wrapper.__dict__.items():
        child.__dict__[k] = inner if k == "env" else copy.deepcopy(v, memo)
    return child


def _turngym_env(wrapper: gymnasium.Wrapper) -> Any:
    base = wrapper.env.unwrapped
    if not callable(getattr(base, "limit_turns", None)):
        raise TypeError(
            f"{type(base).__name__} has no turn limit of its own: turngym's turn limit is Env.max_turns "
            "(use gymnasium.wrappers.TimeLimit to cap another Gymnasium env)"
        )
    return base


class TurnLimit(AsyncWrapper):
    """Cap episodes at ``cap`` turns by tightening the env's own limit (``Env.limit_turns``).

    The env truncates at ``min(env.max_turns, cap)`` (a looser cap leaves the env's limit in force),
    so ``truncated``, the turn-limit rewards and ``max_turns`` all come from the env. The cap is set at
    construction and again at every reset.
    """

    def __init__(self, env: gymnasium.Env, max_turns: int):
        super().__init__(env)
        if max_turns < 1:
            raise ValueError("max_turns must be >= 1")
        self.cap = int(max_turns)
        self.limit_turns(self.cap)

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.limit_turns(self.cap)
        return await super().areset(seed=seed, options=options)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.limit_turns(self.cap)
        return super().reset(seed=seed, options=options)


class RecordRewardComponents(AsyncWrapper):
    """Sum ``info["reward_components"]`` over the episode; the totals land in ``info["episode"]`` at the end."""

    def __init__(self, env: gymnasium.Env):
        super().__init__(env)
        self.totals: dict[str, float] = {}
        self.episode_return = 0.0
        self.episode_turns = 0

    def _on_reset(self, obs, info):
        self.totals, self.episode_return, self.episode_turns = {}, 0.0, 0
        return obs, info

    def _on_step(self, action, obs, reward, terminated, truncated, info):
        for k, v in (info.get("reward_components") or {}).items():
            self.totals[k] = self.totals.get(k, 0.0) + float(v)
        self.episode_return += float(reward)
        self.episode_turns += 1
        if terminated or truncated:
            info = {
                **info,
                "episode": {
                    "r": self.episode_return,
                    "l": self.episode_turns,
                    "components": dict(self.totals),
                },
            }
        return obs, reward, terminated, truncated, info


class RecordTrajectory(AsyncWrapper):
    """Build a ``Trajectory`` per episode; optionally append each finished one to a JSONL file."""

    def __init__(self, env: gymnasium.Env, path: str | Path | None = None, env_id: str = ""):
        super().__init__(env)
        self.path = Path(path) if path is not None else None
        spec = env.unwrapped.spec  # the env's own (a wrapper's ``spec`` deep-copies it)
        self.env_id = env_id or (spec.id if spec is not None else type(env.unwrapped).__name__)
        self.trajectory: Trajectory | None = None
        self.finished: list[Trajectory] = []
        self._seed: int | None = None

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._seed = seed
        return await super().areset(seed=seed, options=options)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._seed = seed
        return super().reset(seed=seed, options=options)

    def _on_reset(self, obs, info):
        self.trajectory = Trajectory.start(obs, info, env_id=self.env_id, seed=self._seed)
        return obs, info

    def _on_step(self, action, obs, reward, terminated, truncated, info):
        if self.trajectory is not None:
            msg = action if isinstance(action, Message) else Message(role="assistant", content=str(action))
            self.trajectory.record_step(msg, obs, reward, terminated, truncated, info)
            if terminated or truncated:
                self.finished.append(self.trajectory)
                if self.path is not None:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    with self.path.open("a", encoding="utf-8") as f:
                        f.write(self.trajectory.to_json() + "\n")
        return obs, reward, terminated, truncated, info
