"""Tree rollouts: per task, one episode that branches into K continuations at chosen turns.

    engine = RolloutEngine("arith", agent, RolloutConfig(tree=TreeConfig(k=2, turns=(0, 2))))
    leaves = await engine.run(seeds=range(8))       # every root-to-leaf path of every tree

The root path resets the env and plays turns like a flat episode. When the branch policy
(``@branch_policy``: ``schedule``, ``tool_call``, ``entropy``) says *branch* at turn t, the env is
forked K-1 times between steps (``await env.afork()``) and the agent session with it
(``session.fork``: same messages and tokens so far, its own seed and route); the original path goes
on as child 0 and each fork as child j, all sampling turn t from the same state, while the tree's
budget (``max_nodes``, ``max_tokens``) lasts. An env with a ``max_live`` limit gets a reservation per
tree so that trees side by side never fail each other's forks.

Each leaf turn has ``node_id``/``parent_id`` (``"root"``, ``"root.j"``, ...); every leaf of a tree
shares the group ``"<env_id>/<seed>"``, so group credit sees a tree as one group. Token counts
(``metadata["tree"]``, ``engine.stats.tree``) say what was sampled and what shared prefixes saved.
A fork that fails gives a masked ``fork_error`` leaf and leaves its parent untouched; a non-forkable
env is refused up front (``NotForkable``) or, with ``fallback_flat``, runs flat groups of K.

The runner plays its own turn loop over the engine's public episode runner
(:class:`~turngym.rollout.episode.EpisodeRunner`: ``act``, ``apply``, ``finish``). Details and the
measured costs: docs/api.md ("Tree rollouts").
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from turngym.core.env import NotForkable
from turngym.core.tree import TREE_ROOT as ROOT
from turngym.core.types import Trajectory
from turngym.rollout.episode import EpisodeRunner, mask_trajectory, turn_timeout

log = logging.getLogger("turngym.rollout.tree")


class TreeError(RuntimeError):
    """The tree cannot be grown as configured (a session that cannot fork, no logprobs for the
    entropy policy): a configuration error, raised, never masked."""


# ------------------------------------------------------------------ branch policies
class BranchPolicy(Protocol):
    """Where a path branches. ``after_sampling``: decide from the sampled turn (``after``) instead
    of before sampling it (``before``)."""

    after_sampling: bool

    def before(self, turn: int, traj: Trajectory) -> bool: ...

    def after(self, turn: int, traj: Trajectory, logprobs: list[float]) -> bool: ...


_POLICIES: dict[str, Callable[[TreeConfig], BranchPolicy]] = {}


def branch_policy(name: str) -> Callable[[Callable[[TreeConfig], BranchPolicy]], Callable]:
    """Register ``factory(tree_config) -> BranchPolicy`` as ``TreeConfig.branch = name``."""

    def register(factory: Callable[[TreeConfig], BranchPolicy]) -> Callable:
        _POLICIES[name] = factory
        return factory

    return register


def branch_policies() -> list[str]:
    return sorted(_POLICIES)


@dataclass(frozen=True)
class _Schedule:
    turns: frozenset[int]
    after_sampling: bool = False

    def before(self, turn: int, traj: Trajectory) -> bool:
        return turn in self.turns

    def max_paths(self, k: int) -> int:
        """The most paths (leaves) a tree can have: every path branches at every scheduled turn."""
        return k ** len(self.turns)

    def after(self, turn: int, traj: Trajectory, logprobs: list[float]) -> bool:
        return False


@dataclass(frozen=True)
class _AfterToolCall:
    after_sampling: bool = False

    def before(self, turn: int, traj: Trajectory) -> bool:
        return bool(traj.turns) and bool(traj.turns[-1].tool_results)

    def after(self, turn: int, traj: Trajectory, logprobs: list[float]) -> bool:
        return False


@dataclass(frozen=True)
class _Entropy:
    threshold: float
    after_sampling: bool = True

    def before(self, turn: int, traj: Trajectory) -> bool:
        return False

    def after(self, turn: int, traj: Trajectory, logprobs: list[float]) -> bool:
        return bool(logprobs) and mean_nll(logprobs) >= self.threshold


def mean_nll(logprobs: list[float]) -> float:
    """The entropy proxy: mean negative log-probability of a turn's sampled tokens (nats)."""
    return -sum(logprobs) / len(logprobs) if logprobs else 0.0


branch_policy("schedule")(lambda c: _Schedule(frozenset(c.turns)))
branch_policy("tool_call")(lambda c: _AfterToolCall())
branch_policy("entropy")(lambda c: _Entropy(c.entropy_threshold))


@dataclass(frozen=True)
class TreeConfig:
    """How trees grow: K children per branch point, where (``branch`` + its options), how far."""

    k: int = 2
    branch: str = "schedule"
    turns: tuple[int, ...] = (0,)  # the ``schedule`` policy's branching turns
    entropy_threshold: float = 1.0  # the ``entropy`` policy's mean sampled NLL (nats) to branch at
    max_nodes: int | None = 64  # branch only while the tree has fewer nodes (turns)
    max_tokens: int | None = None  # branch only while the tree has sampled fewer tokens
    fallback_flat: bool = False  # a non-forkable env runs flat groups of k instead of failing

    def __post_init__(self) -> None:
        if self.k < 2:
            raise ValueError(f"tree k must be >= 2 (children per branch point), got {self.k}")
        if self.branch not in _POLICIES:
            raise ValueError(f"unknown branch policy {self.branch!r}; known: {', '.join(branch_policies())}")
        if any(t < 0 for t in self.turns):
            raise ValueError(f"branching turns must be >= 0, got {list(self.turns)}")
        for name in ("max_nodes", "max_tokens"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"tree {name} must be >= 1 (or None: no limit), got {v}")
        object.__setattr__(self, "turns", tuple(sorted(set(self.turns))))

    def policy(self) -> BranchPolicy:
        return _POLICIES[self.branch](self)

    def runner(self, episodes: EpisodeRunner) -> TreeRunner:
        """What an engine grows its trees with, over its episode runner."""
        return TreeRunner(episodes, self)


# ------------------------------------------------------------------ growing
#: what a tree counts (``_Tree.counts``), in the order of its summary; all but ``generated_tokens``
#: (the engine counts those itself) are summed into ``engine.stats.tree``
TREE_COUNTS = (
    "nodes",
    "branch_points",
    "forks",
    "fork_errors",
    "fork_s",
    "generated_tokens",
    "reused_sampled_tokens",
    "reused_prefix_tokens",
)


@dataclass
class _Tree:
    seed: int
    cfg: TreeConfig
    counts: Counter = field(default_factory=lambda: Counter(fork_s=0.0))  # TREE_COUNTS
    cap: int | None = None  # paths reserved out of the env's ``max_live`` (None: no such limit)
    live: int = 0  # paths started whose env is not closed yet
    tasks: list[asyncio.Task] = field(default_factory=list)
    leaves: list[Trajectory] = field(default_factory=list)

    def can_branch(self) -> bool:
        c = self.cfg
        return (
            (c.max_nodes is None or self.counts["nodes"] < c.max_nodes)
            and (c.max_tokens is None or self.counts["generated_tokens"] < c.max_tokens)
            and (self.cap is None or self.live + c.k - 1 <= self.cap)
        )

    def summary(self) -> dict[str, float]:
        summary: dict[str, float] = {k: self.counts[k] for k in TREE_COUNTS}
        summary["fork_s"] = round(summary["fork_s"], 6)
        return {"nodes": summary.pop("nodes"), "leaves": len(self.leaves), **summary}


class TreeRunner:
    """Grows trees with an engine's episode runner: its env factory, agent, timeouts and stats."""

    def __init__(self, episodes: EpisodeRunner, cfg: TreeConfig):
        self.engine = episodes
        self.cfg = cfg
        self.policy = cfg.policy()
        self.slots: _Slots | None = None  # the env's ``max_live``, shared by the trees (preflight)

    async def preflight(self) -> Any:
        """Build one env and check that it can fork, before any episode. Returns None (grow trees),
        or the flat config to run instead (``fallback_flat``); raises ``NotForkable`` otherwise."""
        support = await self.engine.fork_support()
        max_live = support.max_live
        if support.forkable:
            if max_live is not None:
                if max_live < self.cfg.k:
                    raise TreeError(
                        f"{self.engine.env_id} holds at most {max_live} live envs at once (max_live), but a "
                        f"branch point needs {self.cfg.k} (tree k); raise the env's limit or lower k"
                    )
                self.slots = _Slots(max_live)
            return None
        msg = f"tree rollouts need a forkable env: {self.engine.env_id} cannot fork ({support.why_not})"
        if not self.cfg.fallback_flat:
            raise NotForkable(msg + "; pass fallback_flat (--tree-fallback-flat) to run flat groups of K")
        log.warning("%s; running flat groups of %d instead (fallback_flat)", msg, self.cfg.k)
        return replace(self.engine.config, tree=None, group_size=self.cfg.k)

    async def grow(self, seed: int) -> list[Trajectory]:
        """Every root-to-leaf path of the tree of task ``seed``, ranked by node id (``sample``)."""
        eng = self.engine
        tree = _Tree(seed, self.cfg)
        if self.slots is not None:
            bound = getattr(self.policy, "max_paths", None)
            paths = bound(self.cfg.k) if bound is not None else self.slots.total
            tree.cap = min(paths, self.slots.total)
            await self.slots.acquire(tree.cap)
        eng.stats.requested += 1
        tree.live = 1
        tree.tasks.append(asyncio.create_task(self._root(tree)))
        try:
            k = 0
            while k < len(tree.tasks):  # paths add their branches' tasks while they run
                await tree.tasks[k]
                k += 1
        finally:
            pending = [t for t in tree.tasks if not t.done()]
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
            if self.slots is not None and tree.cap is not None:
                await self.slots.release(tree.cap)  # every path's env is closed by now
        leaves = sorted(tree.leaves, key=_leaf_order)
        summary = tree.summary()
        for rank, traj in enumerate(leaves):
            traj.sample = rank
            traj.metadata["tree"] = {"leaf": _leaf_id(traj), **summary}
        for key in TREE_COUNTS:
            if key != "generated_tokens":
                eng.stats.tree[key] += tree.counts[key]
        eng.stats.tree["trees"] += 1
        return leaves

    # ---- paths
    async def _root(self, tree: _Tree) -> None:
        eng = self.engine

        async def turns(env: Any, session: Any, traj: Trajectory) -> None:
            await self._turns(env, session, traj, tree, ROOT, None)

        eng.stats.live += 1
        try:
            traj = await eng.run_episode(tree.seed, 0, turns)
        finally:
            eng.stats.live -= 1
        self._leaf(tree, traj)

    async def _branch_path(
        self, env: Any, session: Any, traj: Trajectory, tree: _Tree, parent: str, j: int
    ) -> None:
        """A branch: child ``j`` of ``parent``, on its own env fork and session fork."""
        eng = self.engine
        t0 = time.monotonic()
        eng.stats.live += 1
        try:
            async with eng.guarded(traj, "branch"):
                await self._turns(env, session, traj, tree, parent, j)
        finally:
            eng.stats.live -= 1
            await eng.finish(env, traj, [session], t0)
        self._leaf(tree, traj)

    def _leaf(self, tree: _Tree, traj: Trajectory) -> None:
        """A path ended (its env closed, or never forked)."""
        tree.live -= 1
        tree.leaves.append(traj)
        self.engine.count(traj)

    async def _turns(
        self, env: Any, session: Any, traj: Trajectory, tree: _Tree, parent: str, first: int | None
    ) -> None:
        """The turn loop of one path. ``first``: this path is child ``first`` of ``parent`` at its
        next turn (a branch already made); None: the root, which decides every turn."""
        eng, cfg = self.engine, self.engine.config
        while True:
            t = len(traj.turns)
            parent = traj.turns[-1].node_id if traj.turns else parent
            child = first if first is not None else 0
            deciding = first is None
            first = None
            if deciding and self.policy.before(t, traj) and tree.can_branch():
                await self._spawn(env, session, traj, tree, parent)
            snapshot = None
            if deciding and self.policy.after_sampling and tree.can_branch():
                route = getattr(session, "route", "snapshot")  # the snapshot never generates
                snapshot = _fork_session(
                    session, env, seed=_seed(tree.seed, f"{parent}~", cfg.sampling_seed), route=route
                )
            async with turn_timeout(cfg.turn_timeout, f"turn {t}"):
                acted = await eng.act(session, traj)
            if acted is None:
                return
            step, t_act = acted
            if snapshot is not None and tree.can_branch():
                if step.gen_span is None or not hasattr(session, "sampled_logprobs"):
                    raise TreeError(
                        f"the entropy branch policy needs token logprobs; agent "
                        f"{getattr(eng.agent, 'name', type(eng.agent).__name__)!r} acts in text only"
                    )
                if self.policy.after(t, traj, session.sampled_logprobs(step.gen_span)):
                    await self._spawn(env, snapshot, traj, tree, parent)
            try:
                async with turn_timeout(cfg.turn_timeout, f"turn {t}"):
                    done = await eng.apply(env, session, traj, step, t_act)
            finally:
                if len(traj.turns) > t:  # recorded (even when the step then faulted)
                    turn = traj.turns[t]
                    turn.node_id, turn.parent_id = f"{parent}.{child}", parent
                    tree.counts["nodes"] += 1
                    if turn.gen_span is not None:
                        tree.counts["generated_tokens"] += turn.gen_span[1] - turn.gen_span[0]
            if done:
                return

    async def _spawn(self, env: Any, session: Any, traj: Trajectory, tree: _Tree, parent: str) -> None:
        """Children 1..K-1 of ``parent`` (the caller's path is child 0): each on ``await env.afork()``
        and a fork of ``session``, run as tasks of the tree. A failed fork is a masked leaf."""
        eng = self.engine
        tree.counts["branch_points"] += 1
        prefix_tokens = len(getattr(getattr(session, "tokens", None), "token_ids", ()))
        prefix_sampled = sum(b - a for a, b in (t.gen_span for t in traj.turns if t.gen_span))
        for j in range(1, self.cfg.k):
            node = f"{parent}.{j}"
            branch = traj.model_copy(deep=True)
            eng.stats.requested += 1
            tree.live += 1
            t0 = time.monotonic()
            try:
                child_env = await asyncio.wait_for(env.afork(), eng.config.turn_timeout)
            except Exception as e:  # noqa: BLE001 - the branch is masked, the parent goes on
                tree.counts["fork_errors"] += 1
                msg = "the fork timed out" if isinstance(e, TimeoutError) else e
                mask_trajectory(branch, "fork_error", msg)
                branch.metadata["tree_node"] = node  # the node this branch would have started
                _fork_session(session, env, seed=None, route=getattr(session, "route", "")).export(branch)
                self._leaf(tree, branch)
                continue
            finally:
                tree.counts["fork_s"] += time.monotonic() - t0
            tree.counts["forks"] += 1
            route = f"{traj.group}#{node}"
            salt = self.engine.config.sampling_seed
            child_session = _fork_session(session, child_env, seed=_seed(tree.seed, node, salt), route=route)
            tree.counts["reused_sampled_tokens"] += prefix_sampled
            tree.counts["reused_prefix_tokens"] += prefix_tokens
            tree.tasks.append(
                asyncio.create_task(self._branch_path(child_env, child_session, branch, tree, parent, j))
            )


class _Slots:
    """A count of live envs shared by the trees of a run (the env's ``max_live``); a tree takes its
    reservation in one piece, so no tree waits holding part of one."""

    def __init__(self, total: int):
        self.total = total
        self.free = total
        self._cond = asyncio.Condition()

    async def acquire(self, n: int) -> None:
        async with self._cond:
            await self._cond.wait_for(lambda: self.free >= n)
            self.free -= n

    async def release(self, n: int) -> None:
        async with self._cond:
            self.free += n
            self._cond.notify_all()


def _fork_session(session: Any, env: Any, *, seed: int | None, route: str) -> Any:
    fork = getattr(session, "fork", None)
    if fork is None:
        raise TreeError(
            f"{type(session).__name__} cannot fork (no fork(env, seed=, route=)): tree rollouts need "
            "an agent whose sessions fork (LLMAgent, the scripted and random agents)"
        )
    return fork(env, seed=seed, route=route)


def _seed(seed: int, node: str, salt: int = 0) -> int:
    """A branch's sampling seed: stable across processes, distinct per node (and per run-level
    ``RolloutConfig.sampling_seed`` ``salt``, when not 0)."""
    key = f"{seed}:{node}" if not salt else f"{salt}:{seed}:{node}"
    return zlib.crc32(key.encode()) % (2**31)


def _leaf_id(traj: Trajectory) -> str:
    if "tree_node" in traj.metadata:  # a branch whose fork failed
        return str(traj.metadata["tree_node"])
    if traj.turns and traj.turns[-1].node_id:
        return traj.turns[-1].node_id
    return ROOT


def _leaf_order(traj: Trajectory) -> tuple:
    """Node-id order: ``root`` < ``root.0.1`` < ``root.0.2`` < ``root.1``."""
    return tuple(int(p) for p in _leaf_id(traj).split(".")[1:])
