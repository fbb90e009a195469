"""Environments hosted in Ray actors, driven by the rollout engine like local ones.

    pool = RayEnvPool("search-qa", num_actors=4, num_cpus=1, resources={"docker": 1})
    engine = RolloutEngine(pool, agent, RolloutConfig(group_size=8), env_id="search-qa")
    trajectories = await engine.run(range(32))
    pool.shutdown()

* Each actor (an async Ray actor, placed by Ray's scheduler with the pool's resource request and
  scheduling strategy, ``SPREAD`` by default) hosts many envs of one registered id (or a picklable
  factory) concurrently on its event loop (``max_envs_per_actor`` calls in flight). Calling the pool returns a :class:`RayEnv` proxy bound to the
  least-loaded live actor; the proxy speaks the env interface the engine and the agents use
  (``areset``/``astep``/``aclose``, ``tools``, ``tool_instructions()``, ``tools_in_prompt``,
  ``parser``, ``expert_action()``, ``max_turns``, ``limit_turns()``), so the engine needs no special
  case. ``limit_turns(n)`` is recorded and applied to the remote env at the next ``areset``.
* Actor death (node loss, OOM kill, ``ray.kill``) surfaces as :class:`EnvActorLost`, whose
  ``mask_reason`` is ``"env_lost"``: the engine masks the trajectories that lived on that actor, and
  the pool starts a replacement actor in the dead one's slot for the trajectories that follow.
* ``pool.stats`` counts opened envs, actor deaths and replacements.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from turngym.core.env import NotForkable, TurnLimited, tightened


class EnvActorLost(RuntimeError):
    """The Ray actor hosting an env died; the episode cannot continue."""

    mask_reason = "env_lost"


@dataclass
class PoolStats:
    opened: int = 0
    actor_deaths: int = 0
    replacements: int = 0


class _EnvHost:
    """The actor body: a table of live envs keyed by the client's env key."""

    def __init__(self, env: str | Callable[..., Any], env_kwargs: dict[str, Any]):
        self.env, self.env_kwargs = env, env_kwargs
        self.envs: dict[int, Any] = {}

    async def open(self, key: int, kwargs: dict[str, Any], max_turns: int | None = None) -> dict[str, Any]:
        from turngym.core.registry import make

        merged = {**self.env_kwargs, **kwargs}
        env = make(self.env, **merged) if isinstance(self.env, str) else self.env(**merged)
        self.envs[key] = env
        if max_turns is not None:
            env.limit_turns(max_turns)
        base = getattr(env, "unwrapped", env)
        return {
            "tools": list(base.tools),
            "instructions": base.tool_instructions(),
            "tools_in_prompt": getattr(base, "tools_in_prompt", True),
            "parser": getattr(base, "parser", None),
            "max_turns": getattr(base, "max_turns", None),
        }

    async def call(self, key: int, method: str, args: tuple, kwargs: dict[str, Any]) -> Any:
        env = self.envs[key]
        target = getattr(env, "unwrapped", env) if method == "expert_action" else env
        out = getattr(target, method)(*args, **kwargs)
        if asyncio.iscoroutine(out):
            out = await out
        return out

    async def close(self, key: int) -> None:
        env = self.envs.pop(key, None)
        if env is not None:
            await env.aclose()

    def num_envs(self) -> int:
        return len(self.envs)

    def pid(self) -> int:
        import os

        return os.getpid()


class RayEnvPool:
    """A fixed number of env-hosting actors; calling it makes a :class:`RayEnv` (an engine env factory)."""

    def __init__(
        self,
        env: str | Callable[..., Any],
        num_actors: int = 1,
        *,
        env_kwargs: dict[str, Any] | None = None,
        num_cpus: float = 1.0,
        memory: int | None = None,
        resources: dict[str, float] | None = None,
        scheduling_strategy: Any = "SPREAD",
        address: str | None = None,
        runtime_env: dict[str, Any] | None = None,
        call_timeout: float | None = None,
        max_envs_per_actor: int = 1000,
    ):
        import ray

        if num_actors < 1:
            raise ValueError("num_actors must be >= 1")
        if not ray.is_initialized():
            ray.init(address=address, runtime_env=runtime_env, ignore_reinit_error=True)
        self.env, self.env_kwargs = env, dict(env_kwargs or {})
        self.__name__ = env if isinstance(env, str) else getattr(env, "__name__", type(env).__name__)
        self.call_timeout = call_timeout
        options: dict[str, Any] = {
            "num_cpus": num_cpus,
            "resources": dict(resources or {}),
            "scheduling_strategy": scheduling_strategy,
            "max_concurrency": max_envs_per_actor,
        }
        if memory is not None:
            options["memory"] = memory
        self._actor_cls = ray.remote(_EnvHost).options(**options)
        self.actors = [self._spawn() for _ in range(num_actors)]
        self._load = [0] * num_actors
        self._generation = [0] * num_actors  # bumped on replacement: stale proxies do not double-replace
        self._keys = itertools.count()
        self.stats = PoolStats()

    def _spawn(self) -> Any:
        return self._actor_cls.remote(self.env, self.env_kwargs)

    def __call__(self, **kwargs: Any) -> RayEnv:
        return RayEnv(self, kwargs)

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Block until every actor has started (actor start is otherwise paid by the first reset)."""
        import ray

        ray.get([a.num_envs.remote() for a in self.actors], timeout=timeout)

    # ------------------------------------------------------------- internals
    def _acquire(self) -> int:
        slot = min(range(len(self.actors)), key=lambda i: self._load[i])
        self._load[slot] += 1
        return slot

    def _release(self, slot: int) -> None:
        self._load[slot] = max(0, self._load[slot] - 1)

    def _lost(self, slot: int, generation: int) -> None:
        """An actor died: start its replacement once, whichever proxy noticed first."""
        import ray

        if self._generation[slot] != generation:
            return
        self.stats.actor_deaths += 1
        try:
            ray.kill(self.actors[slot], no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
        self.actors[slot] = self._spawn()
        self._generation[slot] += 1
        self.stats.replacements += 1

    def shutdown(self) -> None:
        import ray

        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        self.actors = []


class RayEnv(TurnLimited):
    """Client-side proxy of one env living in a pool actor (async interface only).

    Not forkable for now: ``forkable`` is False and ``fork()``/``afork()`` raise
    :class:`~turngym.core.env.NotForkable` (a fork would need its own slot in the pool and a copy of
    the remote env made inside the actor).
    """

    forkable = False

    def __init__(self, pool: RayEnvPool, kwargs: dict[str, Any]):
        self.pool, self.kwargs = pool, kwargs
        self.slot: int | None = None
        self.key = next(pool._keys)
        self._meta: dict[str, Any] | None = None
        self._generation = -1
        self._closed = False

    # ------------------------------------------------------- env interface
    @property
    def actor(self) -> Any:
        return self.pool.actors[self.slot] if self.slot is not None else None

    @property
    def tools(self) -> list[Any]:
        return self._require_meta()["tools"]

    @property
    def tools_in_prompt(self) -> bool:
        return self._require_meta()["tools_in_prompt"]

    @property
    def parser(self) -> Any:
        return self._require_meta()["parser"]

    @property
    def max_turns(self) -> int | None:
        return self._require_meta()["max_turns"]

    def _tighten_turns(self, cap: int) -> None:
        """``limit_turns`` (:class:`TurnLimited`): the actor's env gets the cap at the next ``areset``."""
        if self._meta is not None:
            self._meta["max_turns"] = tightened(self._meta["max_turns"], cap)

    def tool_instructions(self) -> str:
        return self._require_meta()["instructions"]

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        cap = self.pending_turn_cap()
        if self._meta is None:
            await self._open()  # the actor opens the env with ``turn_cap`` applied
        elif cap is not None:
            await self._call("limit_turns", cap)
        return await self._call("areset", seed=seed, options=options)

    async def astep(self, action: Any):
        return await self._call("astep", action)

    async def expert_action(self) -> Any:
        return await self._call("expert_action")

    def fork(self) -> Any:
        raise NotForkable(
            f"RayEnv ({self.pool.__name__!r} in a Ray actor) cannot fork: forking envs that live in Ray "
            "actors is not implemented yet; fork a local env instead"
        )

    async def afork(self) -> Any:
        self.fork()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.slot is None:
            return
        slot, self.slot = self.slot, None
        self.pool._release(slot)
        if self._generation == self.pool._generation[slot]:
            try:
                await self._await(self.pool.actors[slot].close.remote(self.key), slot)
            except EnvActorLost:
                pass  # the env went with its actor

    # ------------------------------------------------------------ internals
    def _require_meta(self) -> dict[str, Any]:
        if self._meta is None:
            raise RuntimeError("RayEnv: call areset() first (the env lives in an actor)")
        return self._meta

    async def _open(self) -> None:
        if self._closed:
            raise RuntimeError("RayEnv is closed")
        self.slot = self.pool._acquire()
        self._generation = self.pool._generation[self.slot]
        self.pool.stats.opened += 1
        self._meta = await self._await(
            self.actor.open.remote(self.key, self.kwargs, self.turn_cap), self.slot
        )

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if self.slot is None or self._closed:
            raise RuntimeError(f"RayEnv.{method} on an env that is not open")
        if self._generation != self.pool._generation[self.slot]:
            raise EnvActorLost(f"the actor hosting env {self.key} was replaced (it died)")
        return await self._await(self.actor.call.remote(self.key, method, args, kwargs), self.slot)

    async def _await(self, ref: Any, slot: int) -> Any:
        import ray

        try:
            return await asyncio.wait_for(ref, self.pool.call_timeout)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as e:
            self.pool._lost(slot, self._generation)
            raise EnvActorLost(f"env actor {slot} died: {type(e).__name__}: {str(e)[:300]}") from e
        except ray.exceptions.RayTaskError as e:
            raise e.as_instanceof_cause() from None
