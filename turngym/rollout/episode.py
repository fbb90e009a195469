"""The episode runner: one episode from env construction to close — build the env (in a worker thread
unless its constructor is cheap), limit its turns, reset, start the agent's session, act, step, record
each turn and its time ledger, observe, finish (close the env, export the session's tokens) — and the
fault policy: any failure masks the trajectory with a reason from ``MASK_REASONS`` instead of raising.

The flat engine (:class:`~turngym.rollout.engine.RolloutEngine`) runs one ``run_episode`` per sample;
the tree runner (:mod:`turngym.rollout.tree`) plays its own turn loop over ``act`` and ``apply`` and
finishes forked paths with ``finish``; trees and vines ask ``fork_support`` (one probe env) first.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import traceback
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from turngym.agents.backend import BackendError
from turngym.agents.base import Agent, AgentSession, AgentStep, ContextFull
from turngym.agents.chat import TokenMismatch
from turngym.core.registry import make, spec
from turngym.core.types import Trajectory

MASK_REASONS = (
    "env_error",
    "env_lost",
    "backend_error",
    "agent_error",
    "token_mismatch",
    "turn_timeout",
    "trajectory_timeout",
    "fork_error",
)


class EpisodeSettings(Protocol):
    """What an episode reads of its rollout's config (``RolloutConfig`` satisfies it)."""

    turn_timeout: float | None
    trajectory_timeout: float | None
    close_timeout: float
    max_turns: int | None
    sampling_seed: int

    def agent_seed(self, seed: int, sample: int) -> int: ...


@dataclass
class RolloutStats:
    """Live counters of a run."""

    requested: int = 0  # trajectories started (tree branches included)
    completed: int = 0  # finished unmasked
    masked: int = 0  # finished masked (``mask_reasons`` says why); requested = completed + masked
    live: int = 0  # episodes running now
    turns: int = 0  # turns recorded
    generated_tokens: int = 0  # sampled tokens (vine continuations included)
    mask_reasons: Counter = field(default_factory=Counter)
    time_s: Counter = field(default_factory=Counter)  # the time ledger, summed (turngym.rollout.ledger)
    # tree rollouts: nodes, forks, fork_errors, branch_points, reused_sampled_tokens, reused_prefix_tokens
    tree: Counter = field(default_factory=Counter)
    # vine rollouts: continuations, forked_tokens (also in generated_tokens), masked, budget_stopped, estimates
    vine: Counter = field(default_factory=Counter)
    started: float = field(default_factory=time.monotonic)
    finished_at: float | None = None

    @property
    def finished(self) -> int:
        return self.completed + self.masked

    @property
    def wall_s(self) -> float:
        return (self.finished_at or time.monotonic()) - self.started

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / max(self.wall_s, 1e-9)

    def reconciles(self) -> bool:
        return (
            self.requested == self.completed + self.masked and sum(self.mask_reasons.values()) == self.masked
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "requested": self.requested,
            "completed": self.completed,
            "masked": self.masked,
            "mask_reasons": dict(self.mask_reasons),
            "turns": self.turns,
            "generated_tokens": self.generated_tokens,
            "wall_s": round(self.wall_s, 3),
            "tokens_per_s": round(self.tokens_per_s, 1),
            "time_s": {k: round(v, 3) for k, v in sorted(self.time_s.items())},
            **({"tree": dict(self.tree)} if self.tree else {}),
            **({"vine": dict(self.vine)} if self.vine else {}),
        }


@dataclass(frozen=True)
class ForkSupport:
    """What one probe env says about forking: whether it can, why not, and its ``max_live`` (live envs
    of its pool at once; None: no such limit)."""

    forkable: bool
    why_not: str
    max_live: int | None


class EpisodeFault(Exception):
    """A fault that masks the trajectory with ``reason`` (one of ``MASK_REASONS``)."""

    def __init__(self, reason: str, error: BaseException | str):
        super().__init__(reason)
        self.reason = reason
        self.error = error


class EpisodeRunner:
    """Plays episodes of one env (an id or a factory) with one agent, counting into ``stats``."""

    def __init__(
        self,
        env: str | Callable[..., Any],
        agent: Agent,
        config: EpisodeSettings,
        *,
        env_kwargs: dict[str, Any] | None = None,
        env_id: str,
    ):
        self.env = env
        self.env_kwargs = dict(env_kwargs or {})
        self.env_id = env_id
        self.agent = agent
        self.config = config
        self.stats = RolloutStats()
        self._orphans: set[asyncio.Task] = set()  # closes of envs built after their trajectory ended
        self._in_thread: bool | None = None  # whether envs are built in a worker thread

    def count(self, traj: Trajectory) -> None:
        """Count a finished trajectory as completed or masked (with its reason)."""
        if traj.masked:
            self.stats.masked += 1
            self.stats.mask_reasons[traj.mask_reason] += 1
        else:
            self.stats.completed += 1

    def _make_env(self) -> Any:
        if isinstance(self.env, str):
            return make(self.env, **self.env_kwargs)
        return self.env(**self.env_kwargs)

    def builds_in_thread(self) -> bool:
        """False where the env's class says its constructor is cheap (``EnvSpec.builds_in_thread``)."""
        if self._in_thread is None:
            try:
                if isinstance(self.env, str):
                    self._in_thread = spec(self.env).builds_in_thread()
                else:
                    self._in_thread = getattr(self.env, "construct_in_thread", True) is not False
            except Exception:  # noqa: BLE001 - an unknown id or entry point fails in _make_env, clearly
                self._in_thread = True
        return self._in_thread

    async def build_env(self) -> Any:
        """Construct the env in a worker thread (a slow constructor must not stall the event loop),
        or inline for a class that says its constructor is cheap (``Env.construct_in_thread``).

        If the trajectory is cancelled meanwhile, the env is closed as soon as it exists."""
        if not self.builds_in_thread():
            return self._make_env()
        building = asyncio.ensure_future(asyncio.to_thread(self._make_env))
        try:
            return await asyncio.shield(building)
        except asyncio.CancelledError:
            building.add_done_callback(self._close_orphan)
            raise

    def _close_orphan(self, building: asyncio.Future) -> None:
        if building.cancelled() or building.exception() is not None:
            return
        task = asyncio.ensure_future(self.close_env(building.result()))
        self._orphans.add(task)
        task.add_done_callback(self._orphans.discard)

    async def run_episode(
        self, seed: int, sample: int, turns: Callable[..., Any] | None = None
    ) -> Trajectory:
        """One episode; ``turns(env, session, traj)`` plays it after the reset (default ``_turns``)."""
        traj = Trajectory(env_id=self.env_id, seed=seed, group=f"{self.env_id}/{seed}", sample=sample)
        t0 = time.monotonic()
        env: Any = None
        sessions: list[AgentSession] = []  # filled by _episode, so a masked trajectory still exports tokens
        try:
            async with self.guarded(traj, "episode"):
                t_env = time.monotonic()
                try:
                    env = await self.build_env()
                except Exception as e:  # noqa: BLE001 - any construction failure is an env fault
                    raise EpisodeFault(fault_reason(e, "env_error"), e) from e
                finally:
                    self.record_phase(traj, "env_start", time.monotonic() - t_env)
                await self._episode(env, traj, seed, sample, sessions, turns or self._turns)
        finally:
            await self.finish(env, traj, sessions, t0)
        return traj

    @contextlib.asynccontextmanager
    async def guarded(self, traj: Trajectory, what: str = "episode") -> AsyncIterator[None]:
        """The body runs under ``trajectory_timeout``; an :class:`EpisodeFault` or the timeout masks
        ``traj`` (with its reason and error) instead of raising. A path of a tree runs this way too."""
        limit = self.config.trajectory_timeout
        try:
            async with asyncio.timeout(limit):
                yield
        except EpisodeFault as f:
            mask_trajectory(traj, f.reason, f.error)
        except TimeoutError as e:
            mask_trajectory(traj, "trajectory_timeout", f"the {what} exceeded {limit}s: {e}")

    async def finish(self, env: Any, traj: Trajectory, sessions: list[AgentSession], t0: float) -> None:
        """Close the env, export the sessions' tokens into ``traj`` and end them."""
        if env is not None:
            t_close = time.monotonic()
            await self._close(env, traj)
            self.record_phase(traj, "close", time.monotonic() - t_close)
        for session in sessions:
            session.export(traj)
            end = getattr(session, "end", None)  # optional: lets a backend free the trajectory's cache
            if end is not None:
                end()
        traj.metrics["wall_s"] = time.monotonic() - t0

    async def _episode(
        self,
        env: Any,
        traj: Trajectory,
        seed: int,
        sample: int,
        sessions: list[AgentSession],
        turns: Callable[..., Any],
    ) -> None:
        cfg = self.config
        route = f"{traj.group}#{sample}"
        async with turn_timeout(cfg.turn_timeout, "reset"):
            t_reset = time.monotonic()
            try:
                if cfg.max_turns is not None:  # the env truncates at the cap itself (one turn limit)
                    env.limit_turns(cfg.max_turns)
                obs, info = await env.areset(seed=seed)
            except Exception as e:  # noqa: BLE001
                raise EpisodeFault(fault_reason(e, "env_error"), e) from e
            finally:
                self.record_phase(traj, "reset", time.monotonic() - t_reset)
        start = Trajectory.start(obs, info)
        traj.prompt, traj.task_id, traj.reference = start.prompt, start.task_id, start.reference
        traj.start_state_key = start.start_state_key
        try:
            session = self.agent.start(env, list(obs), seed=cfg.agent_seed(seed, sample), route=route)
        except Exception as e:  # noqa: BLE001
            raise EpisodeFault("agent_error", e) from e
        sessions.append(session)
        await turns(env, session, traj)

    async def _turns(self, env: Any, session: AgentSession, traj: Trajectory) -> None:
        """The turn loop of a flat episode."""
        cfg = self.config
        while True:
            async with turn_timeout(cfg.turn_timeout, f"turn {len(traj.turns)}"):
                acted = await self.act(session, traj)
                if acted is None:
                    break
                done = await self.apply(env, session, traj, *acted)
            if done:
                break

    async def act(self, session: AgentSession, traj: Trajectory) -> tuple[AgentStep, float] | None:
        """The agent's next action and when it was asked, or None when the context is full (the
        trajectory is then truncated)."""
        t_act = time.monotonic()
        try:
            step = await session.act()
        except ContextFull as e:
            traj.truncated = True
            traj.metrics["context_full"] = 1.0
            traj.metadata["truncation"] = str(e)
            return None
        except BackendError as e:
            raise EpisodeFault("backend_error", e) from e
        except Exception as e:  # noqa: BLE001 - an env fault seen by the agent keeps its reason
            raise EpisodeFault(fault_reason(e, "agent_error"), e) from e
        return step, t_act

    async def apply(
        self, env: Any, session: AgentSession, traj: Trajectory, step: AgentStep, t_act: float
    ) -> bool:
        """Step the env with ``step``'s action, record the turn and observe; True when the episode ended."""
        t_step = time.monotonic()
        try:
            obs, reward, terminated, truncated, info = await env.astep(step.action)
        except Exception as e:  # noqa: BLE001
            raise EpisodeFault(fault_reason(e, "env_error"), e) from e
        t_done = time.monotonic()
        turn = traj.record_step(step.action, obs, reward, terminated, truncated, info)
        turn.timing = {
            "generate": t_step - t_act,
            **{f"generate/{k}": v for k, v in step.timing.items()},
            "env_step": t_done - t_step,
        }
        self.stats.time_s.update(turn.timing)
        turn.gen_span = step.gen_span
        turn.finish_reason = step.finish_reason
        if step.info:
            turn.info["agent"] = step.info
        self.stats.turns += 1
        if step.gen_span is not None:
            self.stats.generated_tokens += step.gen_span[1] - step.gen_span[0]
        if info.get("masked"):  # the env reports an infrastructure fault (crashed browser, ...)
            raise EpisodeFault("env_error", str(info.get("mask_reason") or "the env masked this episode"))
        if terminated or truncated:
            return True
        t_obs = time.monotonic()
        try:
            turn.obs_span = session.observe(step.action, obs)
        except TokenMismatch as e:
            raise EpisodeFault("token_mismatch", e) from e
        finally:
            turn.timing["observe"] = time.monotonic() - t_obs
            self.stats.time_s["observe"] += turn.timing["observe"]
        return False

    def record_phase(self, traj: Trajectory, phase: str, seconds: float) -> None:
        """A per-trajectory phase of the time ledger (``turngym.rollout.ledger``)."""
        traj.metrics[f"time/{phase}"] = seconds
        self.stats.time_s[phase] += seconds

    async def _close(self, env: Any, traj: Trajectory) -> None:
        error = await self.close_env(env)
        if error is not None:
            traj.metadata["close_error"] = error

    async def fork_support(self) -> ForkSupport:
        """Build one env, read whether it can fork (and its ``max_live``), close it: the preflight of
        the runners that fork (trees, vines) before any episode."""
        env = await self.build_env()
        try:
            base = getattr(env, "unwrapped", env)
            max_live = getattr(base, "max_live", None)
            return ForkSupport(
                forkable=bool(getattr(env, "forkable", False)),
                why_not=getattr(base, "_not_forkable_reason", "it has no fork()"),
                max_live=None if max_live is None else int(max_live),
            )
        finally:
            await self.close_env(env)

    async def close_env(self, env: Any) -> str | None:
        """Close an env within ``close_timeout``; the error text if that failed, never raised."""
        try:
            await asyncio.wait_for(env.aclose(), self.config.close_timeout)
        except Exception as e:  # noqa: BLE001 - recorded, never raised
            return f"{type(e).__name__}: {e}"
        return None


class turn_timeout:  # noqa: N801 - used like asyncio.timeout
    """``asyncio.timeout`` that reports its own expiry as a ``turn_timeout`` fault."""

    def __init__(self, seconds: float | None, what: str):
        self.seconds, self.what = seconds, what
        self._cm = asyncio.timeout(seconds)

    async def __aenter__(self) -> None:
        await self._cm.__aenter__()

    async def __aexit__(self, et, ev, tb) -> bool:
        try:
            await self._cm.__aexit__(et, ev, tb)
        except TimeoutError as e:
            raise EpisodeFault("turn_timeout", f"{self.what} exceeded {self.seconds}s") from e
        return False


def mask_trajectory(traj: Trajectory, reason: str, error: BaseException | str) -> None:
    traj.masked = True
    traj.mask_reason = reason
    if isinstance(error, BaseException):
        tb = traceback.format_exception(type(error), error, error.__traceback__, limit=-3)
        traj.metadata["error"] = f"{type(error).__name__}: {error}"
        traj.metadata["traceback"] = "".join(tb)[-4000:]
    else:
        traj.metadata["error"] = str(error)


def fault_reason(error: BaseException, default: str) -> str:
    reason = getattr(error, "mask_reason", None)
    return reason if reason in MASK_REASONS else default
