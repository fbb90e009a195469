"""The async rollout engine: one coroutine per trajectory, G samples per task, bounded concurrency.

    engine = RolloutEngine("arith", agent, RolloutConfig(group_size=8, max_concurrency=64))
    trajectories = await engine.run(seeds=range(32))        # 32 tasks x 8 samples
    # or, as they finish:
    async for traj in engine.stream(range(32)): ...

* Each episode is played by the engine's :class:`~turngym.rollout.episode.EpisodeRunner` (its own
  env, built in a worker thread unless its class says its constructor is cheap; reset, act, step,
  observe, close; every fault a masked trajectory with a reason from ``MASK_REASONS``). Samples of
  one task share the seed (same task) and the group id ``"<env_id>/<seed>"``; ``sample`` is 0..G-1.
* ``max_turns`` caps episodes through the env's own limit (``env.limit_turns``), so the env
  truncates at ``min(env.max_turns, max_turns)`` and pays its end-of-episode reward.
* ``max_concurrency`` bounds live trajectories (and so live envs); backends batch the concurrent
  generations. ``turn_timeout`` covers reset and each turn, ``trajectory_timeout`` the episode,
  ``close_timeout`` the env's close.
* ``RolloutConfig(tree=TreeConfig(...))`` grows a tree per task instead of ``group_size`` samples
  (:mod:`turngym.rollout.tree`).
* ``RolloutConfig(vine=VineConfig(...))`` also estimates each state's value from K forked
  continuations (:mod:`turngym.rollout.vine`), kept in ``traj.metadata["vine"]``.
* ``engine.stats`` is updated live and reconciles at the end (``requested == completed + masked``);
  ``stats.time_s`` sums the time ledger (:mod:`turngym.rollout.ledger`) that each turn keeps in
  ``Turn.timing`` and each trajectory in ``metrics["time/<phase>"]``.
* The first run freezes the process's heap out of the cyclic collector's full scans
  (``freeze_heap``, :mod:`turngym.core.heap`).
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from turngym.agents.base import Agent
from turngym.core.heap import freeze_heap
from turngym.core.types import Trajectory
from turngym.rollout.episode import MASK_REASONS, EpisodeRunner, RolloutStats

if TYPE_CHECKING:
    from turngym.rollout.tree import TreeConfig
    from turngym.rollout.vine import VineConfig

__all__ = ["MASK_REASONS", "RolloutConfig", "RolloutEngine", "RolloutStats"]


@dataclass(frozen=True)
class RolloutConfig:
    group_size: int = 1
    max_concurrency: int = 64
    turn_timeout: float | None = 300.0
    trajectory_timeout: float | None = 3600.0
    close_timeout: float = 30.0
    max_turns: int | None = None  # tightens each env's own turn limit (``env.limit_turns``), never loosens it
    # grow a tree per task instead of ``group_size`` independent samples (turngym.rollout.tree)
    tree: TreeConfig | None = None
    # forked Monte-Carlo value estimates of each flat episode's states (turngym.rollout.vine)
    vine: VineConfig | None = None
    # mixed into every sampling seed the agent is given (trajectories and tree branches), so runs that
    # differ only in it sample differently from the same tasks (the trainer passes its ``seed``); 0 keeps
    # the plain per-trajectory seeds ``task seed * 1000 + sample``
    sampling_seed: int = 0
    # freeze the process's heap (libraries, a loaded model) out of the cyclic collector's full scans
    # at the first run (``turngym.core.heap``): a full collection of it stalled the event loop 0.2-0.3 s
    freeze_heap: bool = True

    def agent_seed(self, seed: int, sample: int) -> int:
        """The sampling seed of sample ``sample`` of task ``seed``."""
        plain = seed * 1000 + sample
        return plain if not self.sampling_seed else zlib.crc32(f"{self.sampling_seed}:{plain}".encode())

    def __post_init__(self) -> None:
        if self.group_size < 1 or self.max_concurrency < 1:
            raise ValueError("group_size and max_concurrency must be >= 1")
        if self.tree is not None and self.vine is not None:
            raise ValueError("a rollout grows trees (tree) or vines (vine), not both")
        if self.max_turns is not None and self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1 (or None: the env's own limit), got {self.max_turns}")


class RolloutEngine:
    def __init__(
        self,
        env: str | Callable[[], Any],
        agent: Agent,
        config: RolloutConfig | None = None,
        *,
        env_kwargs: dict[str, Any] | None = None,
        env_id: str | None = None,
        on_trajectory: Callable[[Trajectory], Any] | None = None,
    ):
        self.env = env
        self.env_id = env_id or (
            env if isinstance(env, str) else getattr(env, "__name__", type(env).__name__)
        )
        self.agent = agent
        self.on_trajectory = on_trajectory
        #: plays each episode (build, reset, act, apply, finish, fault -> mask) and counts into its stats
        self.episodes = EpisodeRunner(
            env, agent, config or RolloutConfig(), env_kwargs=env_kwargs, env_id=self.env_id
        )

    @property
    def config(self) -> RolloutConfig:
        return self.episodes.config  # type: ignore[return-value]

    @config.setter
    def config(self, value: RolloutConfig) -> None:
        self.episodes.config = value

    @property
    def stats(self) -> RolloutStats:
        """Live counters of the current run (replaced at each ``stream``)."""
        return self.episodes.stats

    @stats.setter
    def stats(self, value: RolloutStats) -> None:
        self.episodes.stats = value

    @property
    def env_kwargs(self) -> dict[str, Any]:
        return self.episodes.env_kwargs

    # ----------------------------------------------------------------- API
    async def run(self, seeds: int | Iterable[int]) -> list[Trajectory]:
        """All trajectories, ordered by seed then sample."""
        out = [t async for t in self.stream(seeds)]
        order = {s: i for i, s in enumerate(_seeds(seeds))}
        return sorted(out, key=lambda t: (order.get(t.seed, 0), t.sample))

    async def stream(self, seeds: int | Iterable[int]) -> AsyncIterator[Trajectory]:
        """Trajectories as they finish. Leaving the loop early cancels and closes the rest.

        With ``config.tree`` the leaves of each task's tree come out together once it is grown
        (``turngym.rollout.tree``); an env that cannot fork raises ``NotForkable`` here, before any
        episode starts (or runs flat groups of K if ``tree.fallback_flat``)."""
        sem = asyncio.Semaphore(self.config.max_concurrency)
        if self.config.freeze_heap:
            freeze_heap()
        if self.config.tree is not None:
            runner = self.config.tree.runner(self.episodes)  # a TreeRunner over the episode runner
            flat = await runner.preflight()
            self.stats = RolloutStats()
            if flat is not None:
                self.config = flat
        vine = None
        if self.config.vine is not None:
            from turngym.rollout.vine import LiveEnvs, VineRunner, preflight

            max_live = await preflight(self.episodes)
            live = LiveEnvs(max_live) if max_live is not None else None
            vine = VineRunner(self.episodes, self.config.vine, live=live)
        if self.config.tree is not None:
            tasks = [asyncio.create_task(self._bounded_tree(sem, runner, s)) for s in _seeds(seeds)]
        else:
            jobs = [(s, k) for s in _seeds(seeds) for k in range(self.config.group_size)]
            self.stats = RolloutStats(requested=len(jobs))
            tasks = [asyncio.create_task(self._bounded(sem, s, k, vine)) for s, k in jobs]
        try:
            for fut in asyncio.as_completed(tasks):
                done = await fut
                for traj in done if isinstance(done, list) else [done]:
                    if self.on_trajectory is not None:
                        self.on_trajectory(traj)
                    yield traj
        finally:
            pending = [t for t in tasks if not t.done()]
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
            self.stats.finished_at = time.monotonic()

    # ------------------------------------------------------------ internals
    async def _bounded(self, sem: asyncio.Semaphore, seed: int, sample: int, vine: Any = None) -> Trajectory:
        async with sem:
            self.stats.live += 1
            try:
                if vine is not None:  # a VineRunner: forked value estimates (turngym.rollout.vine)
                    traj = await vine.run(seed, sample)
                else:
                    traj = await self.episodes.run_episode(seed, sample)
            finally:
                self.stats.live -= 1
        self.episodes.count(traj)
        return traj

    async def _bounded_tree(self, sem: asyncio.Semaphore, runner: Any, seed: int) -> list[Trajectory]:
        """One task's tree (its paths count in ``stats`` as they finish, see ``TreeRunner``)."""
        async with sem:
            return await runner.grow(seed)


def _seeds(seeds: int | Iterable[int]) -> list[int]:
    return list(range(seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]
