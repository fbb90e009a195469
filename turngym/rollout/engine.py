"""The async rollout engine: one coroutine per trajectory, G samples per task, bounded concurrency.

    engine = RolloutEngine("arith", agent, RolloutConfig(group_size=8, max_concurrency=64))
    trajectories = await engine.run(seeds=range(32))        # 32 tasks x 8 samples
    # or, as they finish:
    async for traj in engine.stream(range(32)): ...

* Each trajectory gets its own env (``make(env_id, **env_kwargs)`` or a factory), built in a
  worker thread (a slow constructor does not stall the other trajectories) and driven only
  through ``areset``/``astep``/``aclose`` (a sync ``_reset``/``_close`` runs in a worker thread
  too, see ``Env.sync_hooks_in_thread``). Samples of one task share the seed (same task) and the
  group id ``"<env_id>/<seed>"``; ``sample`` is 0..G-1.
* ``max_turns`` caps episodes through the env's own limit: ``env.limit_turns(max_turns)`` before the
  reset (``Env.limit_turns``; wrappers and ``RayEnv`` forward it), so the env truncates at
  ``min(env.max_turns, max_turns)`` and pays its end-of-episode reward.
* ``max_concurrency`` bounds live trajectories (and so live envs); backends batch the
  concurrent generations.
* Timeouts: ``turn_timeout`` covers reset and each turn (generation + env step);
  ``trajectory_timeout`` covers the whole episode. Env closing has its own ``close_timeout``.
* Faults never hang or crash the run: the trajectory is returned with ``masked=True`` and
  ``mask_reason`` one of ``MASK_REASONS``; the error text is in ``metadata["error"]``. An env that
  reports a fault of its own with ``info["masked"]`` (e.g. a crashed browser) masks the trajectory
  as ``env_error``, with its ``info["mask_reason"]`` as the error text. An env
  exception may name its own reason in a ``mask_reason`` attribute (e.g. ``"env_lost"`` when the
  Ray actor hosting the env died, see ``turngym.rollout.ray_envs``). Running out
  of context truncates the trajectory (not masked; ``metrics["context_full"] = 1``).
* ``RolloutConfig(tree=TreeConfig(...))`` grows a tree per task instead of ``group_size`` samples:
  K children continue from ``env.afork()`` at chosen turns, every root-to-leaf path is a trajectory
  with ``node_id``/``parent_id`` per turn (``turngym.rollout.tree``).
* ``engine.stats`` is updated live (for progress bars) and reconciles at the end:
  ``requested == completed + masked``; ``stats.time_s`` sums the time ledger (env start, reset,
  generate and the backend's queued/prefill/decode, env step, observe, close), which each turn
  keeps in ``Turn.timing`` and each trajectory in ``metrics["time/<phase>"]``
  (``turngym.rollout.ledger``).
* The first run freezes the process's heap out of the cyclic garbage collector's full scans
  (``freeze_heap``, ``turngym.core.heap``): with a model loaded, one such scan stalled every
  trajectory for 0.2-0.3 s every few runs.
"""

from __future__ import annotations

import asyncio
import time
import traceback
import zlib
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from turngym.agents.backend import BackendError
from turngym.agents.base import Agent, AgentSession, AgentStep, ContextFull
from turngym.agents.chat import TokenMismatch
from turngym.core.heap import freeze_heap
from turngym.core.registry import make, spec
from turngym.core.types import Trajectory

if TYPE_CHECKING:
    from turngym.rollout.tree import TreeConfig

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
        if self.max_turns is not None and self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1 (or None: the env's own limit), got {self.max_turns}")


@dataclass
class RolloutStats:
    """Live counters of a run."""

    requested: int = 0
    completed: int = 0
    masked: int = 0
    live: int = 0
    turns: int = 0
    generated_tokens: int = 0
    mask_reasons: Counter = field(default_factory=Counter)
    time_s: Counter = field(default_factory=Counter)  # the time ledger, summed (turngym.rollout.ledger)
    # tree rollouts: nodes, forks, fork_errors, branch_points, reused_sampled_tokens, reused_prefix_tokens
    tree: Counter = field(default_factory=Counter)
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
        }


class _Fault(Exception):
    def __init__(self, reason: str, error: BaseException | str):
        super().__init__(reason)
        self.reason = reason
        self.error = error


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
        self.env_kwargs = dict(env_kwargs or {})
        self.env_id = env_id or (
            env if isinstance(env, str) else getattr(env, "__name__", type(env).__name__)
        )
        self.agent = agent
        self.config = config or RolloutConfig()
        self.on_trajectory = on_trajectory
        self.stats = RolloutStats()
        self._orphans: set[asyncio.Task] = set()  # closes of envs built after their trajectory ended
        self._in_thread: bool | None = None  # whether envs are built in a worker thread (_builds_in_thread)

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
            runner = self.config.tree.runner(self)  # a TreeRunner (turngym.rollout.tree imports the engine)
            flat = await runner.preflight()
            self.stats = RolloutStats()
            if flat is not None:
                self.config = flat
        if self.config.tree is not None:
            tasks = [asyncio.create_task(self._bounded_tree(sem, runner, s)) for s in _seeds(seeds)]
        else:
            jobs = [(s, k) for s in _seeds(seeds) for k in range(self.config.group_size)]
            self.stats = RolloutStats(requested=len(jobs))
            tasks = [asyncio.create_task(self._bounded(sem, s, k)) for s, k in jobs]
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
    async def _bounded(self, sem: asyncio.Semaphore, seed: int, sample: int) -> Trajectory:
        async with sem:
            self.stats.live += 1
            try:
                traj = await self._one(seed, sample)
            finally:
                self.stats.live -= 1
        self._count(traj)
        return traj

    async def _bounded_tree(self, sem: asyncio.Semaphore, runner: Any, seed: int) -> list[Trajectory]:
        """One task's tree (its paths count in ``stats`` as they finish, see ``TreeRunner``)."""
        async with sem:
            return await runner.grow(seed)

    def _count(self, traj: Trajectory) -> None:
        if traj.masked:
            self.stats.masked += 1
            self.stats.mask_reasons[traj.mask_reason] += 1
        else:
            self.stats.completed += 1

    def _make_env(self) -> Any:
        if isinstance(self.env, str):
            return make(self.env, **self.env_kwargs)
        return self.env(**self.env_kwargs)

    def _builds_in_thread(self) -> bool:
        """False where the env's class says its constructor is cheap (``Env.construct_in_thread``)."""
        if self._in_thread is None:
            try:
                cls = spec(self.env).load() if isinstance(self.env, str) else self.env
            except Exception:  # noqa: BLE001 - an unknown id or entry point fails in _make_env, clearly
                cls = None
            self._in_thread = getattr(cls, "construct_in_thread", True) is not False
        return self._in_thread

    async def _build_env(self) -> Any:
        """Construct the env in a worker thread (a slow constructor must not stall the event loop),
        or inline for a class that says its constructor is cheap (``Env.construct_in_thread``).

        If the trajectory is cancelled meanwhile, the env is closed as soon as it exists."""
        if not self._builds_in_thread():
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
        task = asyncio.ensure_future(self._close_env(building.result()))
        self._orphans.add(task)
        task.add_done_callback(self._orphans.discard)

    async def _one(self, seed: int, sample: int, turns: Callable[..., Any] | None = None) -> Trajectory:
        """One episode; ``turns(env, session, traj)`` plays it after the reset (default ``_turns``)."""
        cfg = self.config
        traj = Trajectory(env_id=self.env_id, seed=seed, group=f"{self.env_id}/{seed}", sample=sample)
        t0 = time.monotonic()
        env: Any = None
        sessions: list[AgentSession] = []  # filled by _episode, so a masked trajectory still exports tokens
        try:
            async with asyncio.timeout(cfg.trajectory_timeout):
                t_env = time.monotonic()
                try:
                    env = await self._build_env()
                except Exception as e:  # noqa: BLE001 - any construction failure is an env fault
                    raise _Fault(_reason(e, "env_error"), e) from e
                finally:
                    self._ledger(traj, "env_start", time.monotonic() - t_env)
                await self._episode(env, traj, seed, sample, sessions, turns or self._turns)
        except _Fault as f:
            _mask(traj, f.reason, f.error)
        except TimeoutError as e:
            _mask(traj, "trajectory_timeout", f"the episode exceeded {cfg.trajectory_timeout}s: {e}")
        finally:
            await self._finish(env, traj, sessions, t0)
        return traj

    async def _finish(self, env: Any, traj: Trajectory, sessions: list[AgentSession], t0: float) -> None:
        """Close the env, export the sessions' tokens into ``traj`` and end them."""
        if env is not None:
            t_close = time.monotonic()
            await self._close(env, traj)
            self._ledger(traj, "close", time.monotonic() - t_close)
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
        async with _turn_timeout(cfg.turn_timeout, "reset"):
            t_reset = time.monotonic()
            try:
                if cfg.max_turns is not None:  # the env truncates at the cap itself (one turn limit)
                    env.limit_turns(cfg.max_turns)
                obs, info = await env.areset(seed=seed)
            except Exception as e:  # noqa: BLE001
                raise _Fault(_reason(e, "env_error"), e) from e
            finally:
                self._ledger(traj, "reset", time.monotonic() - t_reset)
        start = Trajectory.start(obs, info)
        traj.prompt, traj.task_id, traj.reference = start.prompt, start.task_id, start.reference
        traj.start_state_key = start.start_state_key
        try:
            session = self.agent.start(env, list(obs), seed=cfg.agent_seed(seed, sample), route=route)
        except Exception as e:  # noqa: BLE001
            raise _Fault("agent_error", e) from e
        sessions.append(session)
        await turns(env, session, traj)

    async def _turns(self, env: Any, session: AgentSession, traj: Trajectory) -> None:
        """The turn loop of a flat episode."""
        cfg = self.config
        while True:
            async with _turn_timeout(cfg.turn_timeout, f"turn {len(traj.turns)}"):
                acted = await self._act(session, traj)
                if acted is None:
                    break
                done = await self._apply(env, session, traj, *acted)
            if done:
                break

    async def _act(self, session: AgentSession, traj: Trajectory) -> tuple[AgentStep, float] | None:
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
            raise _Fault("backend_error", e) from e
        except Exception as e:  # noqa: BLE001 - an env fault seen by the agent keeps its reason
            raise _Fault(_reason(e, "agent_error"), e) from e
        return step, t_act

    async def _apply(
        self, env: Any, session: AgentSession, traj: Trajectory, step: AgentStep, t_act: float
    ) -> bool:
        """Step the env with ``step``'s action, record the turn and observe; True when the episode ended."""
        t_step = time.monotonic()
        try:
            obs, reward, terminated, truncated, info = await env.astep(step.action)
        except Exception as e:  # noqa: BLE001
            raise _Fault(_reason(e, "env_error"), e) from e
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
            raise _Fault("env_error", str(info.get("mask_reason") or "the env masked this episode"))
        if terminated or truncated:
            return True
        t_obs = time.monotonic()
        try:
            turn.obs_span = session.observe(step.action, obs)
        except TokenMismatch as e:
            raise _Fault("token_mismatch", e) from e
        finally:
            turn.timing["observe"] = time.monotonic() - t_obs
            self.stats.time_s["observe"] += turn.timing["observe"]
        return False

    def _ledger(self, traj: Trajectory, phase: str, seconds: float) -> None:
        """A per-trajectory phase of the time ledger (``turngym.rollout.ledger``)."""
        traj.metrics[f"time/{phase}"] = seconds
        self.stats.time_s[phase] += seconds

    async def _close(self, env: Any, traj: Trajectory) -> None:
        error = await self._close_env(env)
        if error is not None:
            traj.metadata["close_error"] = error

    async def _close_env(self, env: Any) -> str | None:
        """Close an env within ``close_timeout``; the error text if that failed, never raised."""
        try:
            await asyncio.wait_for(env.aclose(), self.config.close_timeout)
        except Exception as e:  # noqa: BLE001 - recorded, never raised
            return f"{type(e).__name__}: {e}"
        return None


class _turn_timeout:
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
            raise _Fault("turn_timeout", f"{self.what} exceeded {self.seconds}s") from e
        return False


def _mask(traj: Trajectory, reason: str, error: BaseException | str) -> None:
    traj.masked = True
    traj.mask_reason = reason
    if isinstance(error, BaseException):
        tb = traceback.format_exception(type(error), error, error.__traceback__, limit=-3)
        traj.metadata["error"] = f"{type(error).__name__}: {error}"
        traj.metadata["traceback"] = "".join(tb)[-4000:]
    else:
        traj.metadata["error"] = str(error)


def _reason(error: BaseException, default: str) -> str:
    reason = getattr(error, "mask_reason", None)
    return reason if reason in MASK_REASONS else default


def _seeds(seeds: int | Iterable[int]) -> list[int]:
    return list(range(seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]
