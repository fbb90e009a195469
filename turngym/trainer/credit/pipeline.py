"""The credit pipeline: trajectories -> task groups -> a credit method -> per-token advantages.

Stages: an optional batch-wide preparation (IGPO's information-gain scoring, one batched pass over
every trajectory of the step) -> group by task -> the method (turn-reward providers, gate, group
reward model, normaliser, turn discount; see the method modules) -> broadcast each turn's advantage
to its sampled tokens. Observation and prompt tokens always get advantage 0; masked trajectories
are left out of every group statistic and get 0 everywhere. Each turn's advantage is also written to
``turn.info["advantages"][name]`` (what ``turngym view`` shows).

Hooks a method may define (all optional): ``begin_step(step, seed)`` before a training step's credit
(e.g. the arena reseeds its tie-breaks from the step's seed), and ``metrics()`` -> extra metrics
of the step, merged into the output (e.g. the arena judge's counters).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from turngym.core.types import Trajectory
from turngym.trainer.credit.base import CreditMethod


@dataclass
class CreditOutput:
    """Per-trajectory turn advantages, per-token advantages (aligned with ``token_ids``) and metrics."""

    turn_advantages: list[list[float]]
    token_advantages: list[np.ndarray]
    metrics: dict[str, float] = field(default_factory=dict)


def group_key(traj: Trajectory) -> str:
    """Trajectories of the same task share a key: the rollout's ``group`` or env + task id."""
    return traj.group or f"{traj.env_id}/{traj.task_id}"


def token_advantages(traj: Trajectory, turn_adv: Sequence[float]) -> np.ndarray:
    """Copy each turn's advantage onto the sampled tokens of that turn (``gen_span`` × ``loss_mask``)."""
    adv = np.zeros(len(traj.token_ids), dtype=np.float32)
    if traj.masked:
        return adv
    mask = np.asarray(traj.loss_mask, dtype=np.float32) if traj.loss_mask else np.ones(len(adv), np.float32)
    for turn, a in zip(traj.turns, turn_adv, strict=False):
        if turn.gen_span is None:
            continue
        s, e = turn.gen_span
        adv[s:e] = a * mask[s:e]
    return adv


def outcome_spread(trajs: Sequence[Trajectory], groups: list[list[int]]) -> dict[str, float]:
    """``credit/zero_groups``: the share of groups whose outcomes are all equal (outcome-only credit
    such as GRPO gets no signal from them); ``credit/all_zero_groups``: those whose outcomes are all 0."""
    if not groups:
        return {"credit/zero_groups": 0.0, "credit/all_zero_groups": 0.0}
    flat = [[trajs[k].outcome for k in idx] for idx in groups]
    equal = sum(max(o) == min(o) for o in flat)
    zero = sum(all(x == 0.0 for x in o) for o in flat)
    return {"credit/zero_groups": equal / len(flat), "credit/all_zero_groups": zero / len(flat)}


@dataclass
class CreditPipeline:
    """Turns a step's trajectories into advantages with one :class:`CreditMethod`.

    ``name``: the key of the advantages written into ``turn.info["advantages"]`` (default: the
    method's ``name``; the registry sets the registered name).
    """

    method: CreditMethod
    prepare: Callable[[list[Trajectory]], dict[str, float]] | None = None
    name: str | None = None

    @property
    def method_name(self) -> str:
        return self.name or getattr(self.method, "name", type(self.method).__name__)

    def begin_step(self, step: int, seed: int) -> None:
        """Called by the trainer before each step's credit; ``seed`` is that step's seed (derived from
        the run seed and the step), so a resumed run reproduces an uninterrupted one."""
        for part in (self.method, self.prepare):
            hook = getattr(part, "begin_step", None)
            if callable(hook):
                hook(step, seed)

    def __call__(self, trajectories: Sequence[Trajectory]) -> CreditOutput:
        trajs = list(trajectories)
        metrics: dict[str, float] = defaultdict(float)
        live = [t for t in trajs if not t.masked and t.turns]
        if self.prepare is not None and live:
            metrics.update(self.prepare(live))
        groups: dict[str, list[int]] = defaultdict(list)
        for k, t in enumerate(trajs):
            if not t.masked and t.turns:
                groups[group_key(t)].append(k)
        turn_adv: list[list[float]] = [[0.0] * len(t.turns) for t in trajs]
        metrics.update(outcome_spread(trajs, list(groups.values())))
        for idx in groups.values():
            credit = self.method.group_advantages([trajs[k] for k in idx])
            for k, adv in zip(idx, credit.advantages, strict=True):
                if len(adv) != len(trajs[k].turns):
                    raise ValueError(
                        f"{self.method_name}: {len(adv)} advantages for {len(trajs[k].turns)} turns"
                    )
                bad = [a for a in adv if not math.isfinite(a)]
                metrics["credit/nonfinite"] += len(bad)
                turn_adv[k] = [a if math.isfinite(a) else 0.0 for a in adv]
            for name, v in credit.metrics.items():
                metrics[name] += v / len(groups)  # mean over groups
        tokens = [token_advantages(t, a) for t, a in zip(trajs, turn_adv, strict=True)]
        name = self.method_name
        for traj, advantages in zip(trajs, turn_adv, strict=True):  # kept for `turngym view`
            for turn, a in zip(traj.turns, advantages, strict=False):
                turn.info.setdefault("advantages", {})[name] = float(a)
        flat = [a for k, adv in enumerate(turn_adv) if not trajs[k].masked for a in adv]
        live_all = [t for t in trajs if not t.masked]
        metrics.update(
            {
                "credit/groups": float(len(groups)),
                "credit/masked": float(sum(t.masked for t in trajs)),
                "credit/adv_mean": float(np.mean(flat)) if flat else 0.0,
                "credit/adv_abs_mean": float(np.mean(np.abs(flat))) if flat else 0.0,
                "reward/outcome_mean": float(np.mean([t.outcome for t in live_all])) if live_all else 0.0,
                "reward/total_mean": float(np.mean([t.total_reward for t in live_all])) if live_all else 0.0,
            }
        )
        extra = getattr(self.method, "metrics", None)
        if callable(extra):
            metrics.update(extra())
        return CreditOutput(turn_adv, tokens, dict(metrics))
