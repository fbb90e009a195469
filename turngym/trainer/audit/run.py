"""Run a credit audit: sample trajectories with forked value estimates, compute the ground-truth turn
advantages A*, run every credit method on the same trajectories and score each against A*.

    result = await run_audit(agent, AuditConfig(env="search-qa", n=32, k=8))
    result.report["methods"]["grpo"]["spearman"]     # {"value", "se", "lo", "hi"}

The rollout is a vine rollout (:mod:`turngym.rollout.vine`) of ``n`` trajectories in groups of
``group_size``: before each chosen turn the env and the agent session are forked and
``k + vine_k`` continuations are played to the end, all batched through the engine's backend. The
first ``vine_k`` outcomes of a state feed the ``vine`` method (what it would see in training); the
other ``k`` estimate V*(s_t), independently of it. ``A*_t = V*(s_{t+1}) - V*(s_t)`` with
V*(s_T) = the outcome, and its MC standard error ``sqrt(se_t^2 + se_{t+1}^2)``.

Methods are registry names, optionally with options: ``"igpo:ig_type=log_prob_diff,norm=separate"``;
``"all"`` is every registered method.
Tree methods see each group as a tree that branched at turn 0 (its trajectories' node ids are set
so): the audit's trajectories are independent samples, not a training tree. A method that cannot
run on the env (IGPO without a model, gated without its components, ...) is reported with its error.
"""

from __future__ import annotations

import math
import random
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from turngym.core.types import Trajectory
from turngym.rollout.vine import TokenBudget, VineConfig, is_tool_turn, mean_se
from turngym.trainer.audit.stats import bootstrap, mean_or_none, pearson, sign_agreement, spearman

DEFAULT_METHODS = (
    "grpo",
    "igpo",
    "igpo:ig_type=log_prob_diff,norm=separate",
    "igpo:gain_targets=hops",
    "gigpo",
    "turn",
    "tree",
    "tree_gigpo",
    "vine",
)
A_STAR = "A*"


@dataclass(frozen=True)
class AuditConfig:
    env: str = "arith"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    n: int = 32  # trajectories
    group_size: int = 4  # trajectories per task (the group every method normalises in)
    k: int = 8  # continuations per state for A*
    vine_k: int = 2  # further continuations per state, for the vine method only
    turns: str = "all"  # all | tool | sample (``sample_turns`` turn indices drawn at random)
    sample_turns: int = 2
    budget: int | None = None  # continuation tokens of the whole audit at most
    methods: tuple[str, ...] = DEFAULT_METHODS
    success_threshold: float = 0.5  # an episode succeeded when its outcome >= this
    bootstrap: int = 200
    seed: int = 0  # first task seed; also the sampling and bootstrap seed
    max_turns: int | None = None
    max_concurrency: int = 64

    def __post_init__(self) -> None:
        if self.n < 1 or self.group_size < 1 or self.k < 2 or self.vine_k < 0:
            raise ValueError("audit needs n >= 1, group_size >= 1, k >= 2 (a standard error) and vine_k >= 0")
        if self.turns not in ("all", "tool", "sample"):
            raise ValueError(f"audit turns must be all, tool or sample, got {self.turns!r}")
        if self.budget is not None and self.budget < 1:
            raise ValueError(f"audit budget must be >= 1 token (or None), got {self.budget}")

    def vine(self, budget: TokenBudget) -> VineConfig:
        turns: str | tuple[int, ...] = self.turns
        if self.turns == "sample":
            horizon = self.max_turns or 8
            rng = random.Random(self.seed)
            turns = tuple(sorted(rng.sample(range(horizon), min(self.sample_turns, horizon))))
        return VineConfig(k=self.k + self.vine_k, turns=turns, budget=budget)


@dataclass
class AuditResult:
    report: dict[str, Any]
    trajectories: list[Trajectory]


def parse_method(spec: str) -> tuple[str, dict[str, Any]]:
    """``"name:key=value,key=value"`` -> ``(name, {key: value})`` (values parsed as JSON when they can be)."""
    import json

    name, _, rest = spec.partition(":")
    options: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"method option {part!r} of {spec!r} is not key=value")
        try:
            options[key.strip()] = json.loads(value)
        except ValueError:
            options[key.strip()] = value
    return name.strip(), options


def split_estimates(traj: Trajectory, vine_k: int) -> None:
    """Split each state's continuation outcomes: the first ``vine_k`` stay in ``metadata["vine"]``
    (the vine method's), the rest become ``metadata["audit"]`` (V*, A* and their errors)."""
    meta = traj.metadata.get("vine") or {}
    samples = [list(s) for s in meta.get("samples", [])]
    samples += [[]] * (len(traj.turns) - len(samples))
    meta["samples"] = [s[:vine_k] for s in samples]
    traj.metadata["vine"] = meta
    values: list[float | None] = []
    errors: list[float | None] = []
    for s in samples:
        rest = s[vine_k:]
        v, se, _ = mean_se(rest) if rest else (None, None, 0)
        values.append(v)
        errors.append(se)
    values.append(traj.outcome)  # V*(s_T): the episode's own outcome, exactly
    errors.append(0.0)
    a_star: list[float | None] = []
    a_se: list[float | None] = []
    for t in range(len(traj.turns)):
        v0, v1 = values[t], values[t + 1]
        a_star.append(None if v0 is None or v1 is None else v1 - v0)
        e0, e1 = errors[t], errors[t + 1]
        a_se.append(None if a_star[-1] is None or e0 is None or e1 is None else math.hypot(e0, e1))
    traj.metadata["audit"] = {
        "v": values,
        "v_se": errors,
        "n": [len(s[vine_k:]) for s in samples],
        "a_star": a_star,
        "a_star_se": a_se,
    }
    for turn, a in zip(traj.turns, a_star, strict=True):
        if a is not None:
            turn.info.setdefault("advantages", {})[A_STAR] = a


def flat_tree_ids(group: list[Trajectory]) -> None:
    """Node ids of a group of independent samples: a tree that branched at turn 0 only."""
    for j, traj in enumerate(sorted(group, key=lambda t: t.sample)):
        parent = "root"
        for t, turn in enumerate(traj.turns):
            node = f"root.{j}" + ".0" * t
            turn.node_id, turn.parent_id = node, parent
            parent = node


def scored_turns(traj: Trajectory, cfg: AuditConfig, chosen: set[int] | None) -> list[int]:
    a_star = traj.metadata["audit"]["a_star"]
    out = []
    for t, turn in enumerate(traj.turns):
        if a_star[t] is None:
            continue
        if cfg.turns == "tool" and not is_tool_turn(turn):
            continue
        if chosen is not None and t not in chosen:
            continue
        out.append(t)
    return out


def expand_methods(methods: tuple[str, ...]) -> tuple[str, ...]:
    """``"all"`` -> every registered method (the default variants first); other specs as given."""
    from turngym.trainer.credit.registry import registered_credit_methods

    out: list[str] = []
    for spec in methods:
        names = [*DEFAULT_METHODS, *registered_credit_methods()] if spec == "all" else [spec]
        out.extend(n for n in names if n not in out)
    return tuple(out)


def run_methods(
    trajs: list[Trajectory], methods: tuple[str, ...], seed: int, **context: Any
) -> dict[str, dict[str, Any]]:
    """Each method's per-turn advantages on ``trajs`` (``{label: {"advantages": [...]}}`` or
    ``{label: {"error": ...}}``), written into the turns' ``info["advantages"][label]`` too."""
    from turngym.trainer.config import CreditSettings
    from turngym.trainer.credit.registry import build_credit_pipeline

    out: dict[str, dict[str, Any]] = {}
    for label in expand_methods(methods):
        try:
            name, options = parse_method(label)
            settings = CreditSettings.model_validate({"method": name, **({name: options} if options else {})})
            pipeline = build_credit_pipeline(settings, seed=seed, **context)
            pipeline.name = label
            credit = pipeline(trajs)
        except Exception as e:  # noqa: BLE001 - reported per method, the audit goes on
            out[label] = {"error": f"{type(e).__name__}: {e}"[:500]}
            continue
        out[label] = {"advantages": credit.turn_advantages, "metrics": credit.metrics}
    return out


def score_method(
    advantages: list[list[float]],
    trajs: list[Trajectory],
    scored: list[list[int]],
    cfg: AuditConfig,
) -> dict[str, Any]:
    """Spearman, Pearson and sign agreement against A* (cluster-bootstrapped over trajectories),
    the share of scored turns given no credit, and the mean advantage on failed vs succeeded
    episodes (every turn of every unmasked trajectory)."""
    clusters = []
    for k, traj in enumerate(trajs):
        if traj.masked or not scored[k]:
            continue
        a_star = traj.metadata["audit"]["a_star"]
        clusters.append(([advantages[k][t] for t in scored[k]], [a_star[t] for t in scored[k]]))
    pairs = sum(len(c[0]) for c in clusters)
    xs = [a for c in clusters for a in c[0]]
    failed = [
        a
        for k, t in enumerate(trajs)
        if not t.masked and t.outcome < cfg.success_threshold
        for a in advantages[k]
    ]
    succeeded = [
        a
        for k, t in enumerate(trajs)
        if not t.masked and t.outcome >= cfg.success_threshold
        for a in advantages[k]
    ]
    reps, seed = cfg.bootstrap, cfg.seed
    return {
        "pairs": pairs,
        "trajectories": len(clusters),
        "spearman": bootstrap(clusters, spearman, reps, seed),
        "pearson": bootstrap(clusters, pearson, reps, seed + 1),
        "sign_agreement": bootstrap(clusters, sign_agreement, reps, seed + 2),
        "zero_credit_frac": (sum(1 for a in xs if a == 0.0) / len(xs)) if xs else None,
        "mean_adv_failed": mean_or_none(failed),
        "mean_adv_succeeded": mean_or_none(succeeded),
    }


def code_commit() -> str | None:
    """The git commit of the turngym checkout that ran; ``$TURNGYM_COMMIT`` where the code was copied
    without its ``.git`` (a device run); None when neither says."""
    import os

    if os.environ.get("TURNGYM_COMMIT"):
        return os.environ["TURNGYM_COMMIT"]
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


async def run_audit(
    agent: Any,
    cfg: AuditConfig,
    *,
    model: Any = None,
    tokenizer: Any = None,
    parser: Any = None,
    env_id: str | None = None,
) -> AuditResult:
    """The audit of ``cfg`` with ``agent`` as the policy (``model``/``tokenizer``: the policy's
    weights, for methods that score with them, IGPO; ``parser``: the env's tool-call parser)."""
    from turngym.rollout.engine import RolloutConfig, RolloutEngine

    budget = TokenBudget(cfg.budget)
    vine = cfg.vine(budget)
    tasks = math.ceil(cfg.n / cfg.group_size)
    engine = RolloutEngine(
        cfg.env,
        agent,
        RolloutConfig(
            group_size=cfg.group_size,
            max_concurrency=cfg.max_concurrency,
            max_turns=cfg.max_turns,
            vine=vine,
            sampling_seed=cfg.seed,
        ),
        env_kwargs=cfg.env_kwargs,
        env_id=env_id,
    )
    trajs = await engine.run(range(cfg.seed, cfg.seed + tasks))
    chosen = None if isinstance(vine.turns, str) else set(vine.turns)
    for traj in trajs:
        split_estimates(traj, cfg.vine_k)
    groups: dict[str, list[Trajectory]] = {}
    for traj in trajs:
        groups.setdefault(traj.group, []).append(traj)
    for group in groups.values():
        flat_tree_ids(group)
    scored = [[] if t.masked else scored_turns(t, cfg, chosen) for t in trajs]
    context = {"model": model, "tokenizer": tokenizer, "parser": parser, "env": cfg.env}
    advantages = run_methods(trajs, cfg.methods, cfg.seed, **context)
    methods: dict[str, Any] = {}
    for label, got in advantages.items():
        if "error" in got:
            methods[label] = {"error": got["error"]}
        else:
            methods[label] = score_method(got["advantages"], trajs, scored, cfg)
            methods[label]["metrics"] = {k: float(v) for k, v in got["metrics"].items()}
    stats = engine.stats.as_dict()
    ses = [t.metadata["audit"]["a_star_se"][s] for k, t in enumerate(trajs) for s in scored[k]]
    ses = [s for s in ses if s is not None]
    live = [t for t in trajs if not t.masked]
    a_star = [t.metadata["audit"]["a_star"][s] for k, t in enumerate(trajs) for s in scored[k]]
    report = {
        "config": {**asdict(cfg), "methods": list(cfg.methods), "vine_turns": vine.turns},
        "commit": code_commit(),
        "env": cfg.env,
        "trajectories": len(trajs),
        "masked": len(trajs) - len(live),
        "success_rate": (sum(t.outcome >= cfg.success_threshold for t in live) / len(trajs))
        if trajs
        else 0.0,
        "zero_groups": (
            sum(1 for g in groups.values() if len({t.outcome for t in g if not t.masked}) <= 1) / len(groups)
            if groups
            else 0.0
        ),
        "scored_turns": sum(len(s) for s in scored),
        "turns": sum(t.num_turns for t in live),
        "a_star": {
            "mean": mean_or_none(a_star),
            "abs_mean": mean_or_none([abs(a) for a in a_star]),
            "nonzero_frac": (sum(1 for a in a_star if a != 0.0) / len(a_star)) if a_star else None,
            "se_mean": mean_or_none(ses),
            "se_max": max(ses) if ses else None,
            "se_le_0.05_frac": (sum(1 for s in ses if s <= 0.05) / len(ses)) if ses else None,
        },
        "tokens": {
            "generated": stats["generated_tokens"],
            "forked": stats.get("vine", {}).get("forked_tokens", 0),
            "budget": cfg.budget,
            "budget_exhausted": budget.exhausted,
            "forks_stopped_by_budget": budget.stopped,
        },
        "wall_s": stats["wall_s"],
        "rollout": stats,
        "methods": methods,
    }
    return AuditResult(report, trajs)
