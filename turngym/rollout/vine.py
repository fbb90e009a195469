"""Vine rollouts: Monte-Carlo value estimates of an episode's states from forked continuations.

    engine = RolloutEngine("arith", agent, RolloutConfig(group_size=4, vine=VineConfig(k=8)))
    trajs = await engine.run(seeds=range(8))
    trajs[0].metadata["vine"]["v"]     # [V(s_0), V(s_1), ..., V(s_T)]; None where not estimated

Each trajectory is played like a flat episode. Before turn t is sampled, where the config says so,
the env is forked K times (``await env.afork()``) and the agent session with it (``session.fork``);
each fork plays one continuation to the end, concurrently with every other path of the run (the
backend batches their generations; a session fork shares its prefix where the backend can). The
mean outcome of the K continuations estimates V(s_t); V(s_T) is the episode's own outcome. Then
``Q(s_t, a_t) = V(s_{t+1})`` for outcome-only rewards, and ``A*_t = V(s_{t+1}) - V(s_t)``.

``turns``: ``"all"`` estimates every state; ``"tool"`` only the states around tool-call turns (a
snapshot fork is taken before each turn and played only if the turn called a tool); a tuple of turn
indices estimates V before and after those turns. ``max_tokens`` caps the continuation tokens of one
trajectory and ``budget`` (a shared :class:`TokenBudget`) those of a whole run: no fork starts once
either is spent (checked when a fork would start, against the tokens sampled so far, those of
running forks included; forks already running finish, so a run may overshoot by what they sample).

The continuations are not returned; their tokens are counted in ``engine.stats.generated_tokens``
(equal-budget comparisons) and in ``stats.vine`` (``forked_tokens``, ``continuations``, ...). Each
trajectory's ``metadata["vine"]`` keeps ``v``, ``se`` (standard error of the mean; None from one
sample), ``n`` (finished, unmasked continuations), ``samples`` (their outcomes per state),
``forked_tokens``, ``budget_stopped``, ``fork_errors`` (with the first ``fork_error``) and
``no_live_slot``. A continuation that faults is left out of its estimate (counted as ``masked``),
never scored as a failure. An env with a ``max_live`` limit (a container or browser pool) shares it
between the run's episodes and their forks (:class:`LiveEnvs`): a fork waits for a free place
rather than failing.
"""

from __future__ import annotations

import asyncio
import math
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

from turngym.core.env import NotForkable
from turngym.core.types import Trajectory
from turngym.rollout.episode import EpisodeRunner, turn_timeout


@dataclass
class TokenBudget:
    """Continuation tokens a whole run may sample (None: no limit); shared by its trajectories."""

    limit: int | None = None
    spent: int = 0
    stopped: int = 0  # forks not started because the budget was spent

    @property
    def exhausted(self) -> bool:
        return self.limit is not None and self.spent >= self.limit


@dataclass(frozen=True)
class VineConfig:
    """K continuations per estimated state; which states (``turns``); token caps."""

    k: int = 8
    turns: str | tuple[int, ...] = "all"
    max_tokens: int | None = None  # continuation tokens per trajectory
    budget: TokenBudget | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"vine k must be >= 1 (continuations per state), got {self.k}")
        if isinstance(self.turns, str):
            if self.turns not in ("all", "tool"):
                raise ValueError(f"vine turns must be 'all', 'tool' or turn indices, got {self.turns!r}")
        else:
            if any(int(t) < 0 for t in self.turns):
                raise ValueError(f"vine turns must be >= 0, got {list(self.turns)}")
            object.__setattr__(self, "turns", tuple(sorted({int(t) for t in self.turns})))
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"vine max_tokens must be >= 1 (or None), got {self.max_tokens}")

    def before(self, t: int, traj: Trajectory) -> bool:
        """Estimate V(s_t) before sampling turn t (``tool``: decided after the turn, see the runner)."""
        if self.turns == "all":
            return True
        if self.turns == "tool":
            return bool(traj.turns) and is_tool_turn(traj.turns[-1])
        return t in self.turns or (t - 1) in self.turns


def is_tool_turn(turn: Any) -> bool:
    """A turn that called a named tool, the terminal answer tool included (not a turn whose text
    held no call or one that could not be parsed)."""
    return any(r.name for r in turn.tool_results) or bool(getattr(turn.action, "tool_calls", None))


@dataclass
class _Path:
    """One trajectory's estimates while it is played."""

    outcomes: dict[int, list[float]] = field(default_factory=dict)
    tasks: list[asyncio.Task] = field(default_factory=list)
    tokens: int = 0
    continuations: int = 0
    masked: int = 0  # continuations that faulted
    stopped: int = 0  # forks not started: a token cap was spent
    fork_errors: int = 0
    fork_error: str = ""
    no_slot: int = 0  # forks not started: the env's max_live was full


async def preflight(episodes: EpisodeRunner) -> int | None:
    """Build one env and check that it can fork, before any episode (``NotForkable`` otherwise);
    returns the env's ``max_live`` (live envs of its pool at once), if it has one."""
    support = await episodes.fork_support()
    if not support.forkable:
        raise NotForkable(
            f"vine value estimates need a forkable env: {episodes.env_id} cannot fork ({support.why_not})"
        )
    if support.max_live is not None and support.max_live < 2:
        raise NotForkable(
            f"{episodes.env_id} holds at most {support.max_live} live env (max_live): nothing left to fork"
        )
    return support.max_live


class LiveEnvs:
    """The env's ``max_live`` shared by a run's episodes and their forks, without deadlock: at most
    ``total - 1`` episodes run at once (so a slot is always left for a fork, and forks always finish);
    a fork waits for a slot only while its episode holds nothing else (``before`` forks), and takes
    one only if free otherwise (tool-mode snapshots and their siblings)."""

    def __init__(self, total: int):
        self.total = total
        self.free = total
        self.episodes = asyncio.Semaphore(max(1, total - 1))
        self._cond = asyncio.Condition()

    async def acquire(self) -> None:
        async with self._cond:
            await self._cond.wait_for(lambda: self.free > 0)
            self.free -= 1

    def try_acquire(self) -> bool:
        if self.free > 0:
            self.free -= 1
            return True
        return False

    async def release(self) -> None:
        async with self._cond:
            self.free += 1
            self._cond.notify_all()


class VineRunner:
    """Plays flat episodes with forked continuations over an engine's episode runner."""

    def __init__(
        self, episodes: EpisodeRunner, cfg: VineConfig, outcome: Any = None, live: LiveEnvs | None = None
    ):
        self.engine = episodes
        self.cfg = cfg
        self.outcome = outcome or (lambda traj: traj.outcome)
        self.live = live  # the env's max_live, shared by the run (None: no limit)

    async def run(self, seed: int, sample: int) -> Trajectory:
        if self.live is None:
            return await self._run(seed, sample)
        async with self.live.episodes:
            await self.live.acquire()
            try:
                return await self._run(seed, sample)
            finally:
                await self.live.release()

    async def _run(self, seed: int, sample: int) -> Trajectory:
        path = _Path()

        async def turns(env: Any, session: Any, traj: Trajectory) -> None:
            try:
                await self._turns(env, session, traj, path)
            finally:
                if path.tasks:
                    await asyncio.gather(*path.tasks, return_exceptions=True)

        traj = await self.engine.run_episode(seed, sample, turns)
        self._annotate(traj, path)
        return traj

    def _can_fork(self, path: _Path) -> bool:
        budget = self.cfg.budget
        return (self.cfg.max_tokens is None or path.tokens < self.cfg.max_tokens) and not (
            budget is not None and budget.exhausted
        )

    async def _turns(self, env: Any, session: Any, traj: Trajectory, path: _Path) -> None:
        eng, cfg = self.engine, self.engine.config
        tool_mode = self.cfg.turns == "tool"
        while True:
            t = len(traj.turns)
            if self.cfg.before(t, traj) and t not in path.outcomes:
                await self._spawn(env, session, traj, path, t, self.cfg.k)
            snapshot = None
            if tool_mode and t not in path.outcomes and self._can_fork(path):
                snapshot = await self._fork(env, session, traj, path, t, 0, wait=False)
            async with turn_timeout(cfg.turn_timeout, f"turn {t}"):
                acted = await eng.act(session, traj)
            if acted is None:
                await self._drop(snapshot)
                return
            async with turn_timeout(cfg.turn_timeout, f"turn {t}"):
                done = await eng.apply(env, session, traj, *acted)
            if snapshot is not None:
                if is_tool_turn(traj.turns[t]):  # V(s_t) of a tool-call turn: K-1 forks of it, then it
                    path.outcomes.setdefault(t, [])
                    if self.cfg.k > 1:  # forked before the snapshot itself starts playing
                        await self._spawn(*snapshot, path, t, self.cfg.k - 1, wait=False)
                    self._start(snapshot, path, t)
                else:
                    await self._drop(snapshot)
            if done:
                return

    async def _fork(
        self, env: Any, session: Any, traj: Trajectory, path: _Path, t: int, j: int, wait: bool = True
    ) -> Any:
        """``(env fork, session fork, trajectory copy)``, or None when no live slot was free (``wait``
        False) or the env fork failed (both counted)."""
        eng = self.engine
        if self.live is not None:
            if wait:
                await self.live.acquire()
            elif not self.live.try_acquire():
                path.no_slot += 1
                eng.stats.vine["no_live_slot"] += 1
                return None
        try:
            child = await asyncio.wait_for(env.afork(), eng.config.turn_timeout)
        except Exception as e:  # noqa: BLE001 - a failed fork is a missing sample, counted
            path.fork_errors += 1
            path.fork_error = path.fork_error or f"{type(e).__name__}: {e}"[:500]
            eng.stats.vine["fork_errors"] += 1
            if self.live is not None:
                await self.live.release()
            return None
        route = f"{traj.group}#{traj.sample}~v{t}.{j}"
        seed = zlib.crc32(f"{eng.config.sampling_seed}:{traj.seed}:{traj.sample}:{t}:{j}".encode()) % 2**31
        return child, session.fork(child, seed=seed, route=route), traj.model_copy(deep=True)

    async def _spawn(
        self, env: Any, session: Any, traj: Trajectory, path: _Path, t: int, k: int, wait: bool = True
    ) -> None:
        path.outcomes.setdefault(t, [])
        for j in range(1, k + 1):
            if not self._can_fork(path):
                path.stopped += 1
                if self.cfg.budget is not None:
                    self.cfg.budget.stopped += 1
                continue
            fork = await self._fork(env, session, traj, path, t, j, wait)
            if fork is not None:
                self._start(fork, path, t)

    def _start(self, fork: Any, path: _Path, t: int) -> None:
        path.continuations += 1
        path.tasks.append(asyncio.create_task(self._continue(*fork, path, t)))

    async def _drop(self, snapshot: Any) -> None:
        if snapshot is not None:
            await self.engine.finish(snapshot[0], Trajectory(), [snapshot[1]], time.monotonic())
            if self.live is not None:
                await self.live.release()

    async def _continue(self, env: Any, session: Any, traj: Trajectory, path: _Path, t: int) -> None:
        """Play one continuation from state t to its end; its outcome joins V(s_t)'s sample."""
        eng = self.engine
        t0 = time.monotonic()
        start = len(traj.turns)
        counted = start

        def count() -> None:  # live, turn by turn: a fork about to start sees the running ones' tokens
            nonlocal counted
            sampled = sum(b - a for a, b in (x.gen_span for x in traj.turns[counted:] if x.gen_span))
            counted = len(traj.turns)
            path.tokens += sampled
            if self.cfg.budget is not None:
                self.cfg.budget.spent += sampled
            eng.stats.vine["forked_tokens"] += sampled

        try:
            async with eng.guarded(traj, "continuation"):
                while True:
                    async with turn_timeout(eng.config.turn_timeout, f"continuation turn {len(traj.turns)}"):
                        acted = await eng.act(session, traj)
                        if acted is None:
                            break
                        done = await eng.apply(env, session, traj, *acted)
                        count()
                        if done:
                            break
        finally:
            count()
            await eng.finish(env, traj, [session], t0)
            if self.live is not None:
                await self.live.release()
            eng.stats.vine["continuations"] += 1
        if traj.masked:
            path.masked += 1
            eng.stats.vine["masked"] += 1
        else:
            path.outcomes[t].append(float(self.outcome(traj)))

    def _annotate(self, traj: Trajectory, path: _Path) -> None:
        n_states = len(traj.turns) + 1
        v: list[float | None] = [None] * n_states
        se: list[float | None] = [None] * n_states
        n = [0] * n_states
        for t, outs in path.outcomes.items():
            if t < n_states and outs:
                v[t], se[t], n[t] = mean_se(outs)
        if traj.turns and not traj.masked:  # the last state's value is the episode's own outcome
            v[-1], se[-1], n[-1] = float(self.outcome(traj)), 0.0, 1
        samples = [list(path.outcomes.get(t, [])) for t in range(n_states - 1)]
        traj.metadata["vine"] = {
            "k": self.cfg.k,
            "samples": samples,  # the continuations' outcomes from each state (V(s_T) is the outcome)
            "v": v,
            "se": se,
            "n": n,
            "forked_tokens": path.tokens,
            "continuations": path.continuations,
            "masked": path.masked,
            "fork_errors": path.fork_errors,
            **({"fork_error": path.fork_error} if path.fork_error else {}),
            "no_live_slot": path.no_slot,
            "budget_stopped": path.stopped,
        }
        self.engine.stats.vine["budget_stopped"] += path.stopped
        self.engine.stats.vine["estimates"] += sum(1 for x in n[:-1] if x)


def mean_se(values: list[float]) -> tuple[float, float | None, int]:
    """Mean, standard error of the mean (sample std / sqrt(n); None for one value: unknown) and n."""
    m = len(values)
    mean = sum(values) / m
    if m < 2:
        return mean, None, m
    var = sum((x - mean) ** 2 for x in values) / (m - 1)
    return mean, math.sqrt(var / m), m
