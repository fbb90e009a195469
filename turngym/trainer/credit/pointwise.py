"""``pointwise``: a judge scores each trajectory alone, and the scores are normalised inside the group
as GRPO normalises outcomes — the baseline ArenaRL's tournaments are measured against (``arena``
compares trajectories in pairs instead; arXiv 2601.06487 reports pointwise LLM-judge scores as too
noisy and uncalibrated across a group to rank it).

The score comes from ``credit.pointwise.scorer`` (``"module:function"`` of a trajectory, a float),
else from the pointwise scorer the env publishes (``EnvJudge.pointwise``: travel's rubric score,
0–10), else the trajectory's outcome reward (which makes the method GRPO). One call per trajectory:
``pointwise/calls`` is its judge cost a step, beside the arena's ``arena/matches`` per group.

Bad input: a scorer that raises or returns a non-number (NaN, inf, a string) for any trajectory of a
group gives that whole group zero advantages — never a silently wrong rank for its siblings — with
``pointwise/failed_groups`` counted and the first error logged.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from turngym.core.plugins import load_object
from turngym.core.types import Trajectory
from turngym.trainer.credit.base import GroupCredit, broadcast
from turngym.trainer.credit.grpo import grpo
from turngym.trainer.credit.registry import CreditContext, MethodSettings, credit_method

log = logging.getLogger(__name__)

Scorer = Callable[[Trajectory], float]


@dataclass
class Pointwise:
    """GRPO over a per-trajectory judge score."""

    score: Scorer
    norm_by_std: bool = True
    leave_one_out: bool = False
    name: str = "pointwise"
    _warned: bool = field(default=False, repr=False)

    def group_advantages(self, group) -> GroupCredit:
        turns = [t.turns for t in group]
        try:
            scores = [float(self.score(t)) for t in group]
            if not all(math.isfinite(s) for s in scores):
                raise ValueError(f"non-finite score in {scores}")
        except (TypeError, ValueError, ArithmeticError, KeyError, AttributeError) as e:
            if not self._warned:
                log.warning(
                    "pointwise judge failed on a group (%s: %s); its advantages are 0", type(e).__name__, e
                )
                self._warned = True
            zero = [0.0] * len(group)
            return GroupCredit(broadcast(zero, turns), {"pointwise/failed_groups": float(len(group) > 0)})
        adv = grpo(scores, self.norm_by_std, self.leave_one_out)
        return GroupCredit(
            broadcast(adv, turns),
            {
                "pointwise/calls": float(len(group)),
                "pointwise/score_mean": float(np.mean(scores)),
                "pointwise/score_std": float(np.std(scores)),
            },
        )


class PointwiseSettings(MethodSettings):
    """``credit.pointwise``; the group normalisation reads the shared ``credit.norm_by_std`` and
    ``credit.leave_one_out``."""

    # "module:function" of a trajectory -> float; default: the env's published pointwise scorer,
    # else the outcome reward
    scorer: str | None = None


def build_scorer(
    settings: PointwiseSettings, env: str | None = None, default: Scorer | None = None
) -> Scorer:
    """The scorer ``credit.pointwise`` describes (see the module doc for the order); ``default``:
    the last resort (the trainer passes its outcome reward, ``credit.outcome_component``)."""
    from turngym.core.judging import env_judge

    if settings.scorer:
        return load_object(settings.scorer, "credit.pointwise.scorer", must_call=True)
    published = env_judge(env) if env else None
    if published is not None and published.pointwise is not None:
        return published.pointwise
    return default or (lambda t: t.outcome)


@credit_method("pointwise", settings=PointwiseSettings)
def build(settings: PointwiseSettings, ctx: CreditContext) -> Pointwise:
    c = ctx.credit
    return Pointwise(build_scorer(settings, ctx.env, ctx.outcome), c.norm_by_std, c.leave_one_out)
