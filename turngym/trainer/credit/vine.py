"""``vine``: turn advantages from forked Monte-Carlo value estimates (VinePPO's idea, on turns).

The rollout (``turngym.rollout.vine``) forks the env and the agent session before chosen turns and
plays K continuations to the end; the mean of their outcomes estimates V(s_t), the value of the
state turn t acted in, and V(s_T) is the episode's own outcome R. Turn t's advantage is

    A_t = V(s_{t+1}) - V(s_t)          (Q(s_t, a_t) = V(s_{t+1}) for outcome-only rewards)

States that were not estimated (``turns = "tool"``, a spent budget) take the value of the next
estimated state, so a turn that acted in an unestimated state gets 0 and the value change lands on
the last estimated turn before it; an unestimated V(s_0) is the group's mean outcome (the GRPO baseline). The
advantages of a trajectory therefore always sum to R - V(s_0). ``norm_by_std`` divides by the
group's outcome std (+1e-6), as GRPO does; VinePPO does not (default off).

Trajectories without vine estimates (a flat rollout) are refused with a clear error; the trainer
runs vine rollouts for this method (``needs_vine_rollouts``) and counts the forks' tokens in
``rollout/generated_tokens`` (equal-budget comparisons) and ``rollout/vine/forked_tokens``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import numpy as np

from turngym.trainer.credit.base import GroupCredit, OutcomeReward
from turngym.trainer.credit.normalize import EPS
from turngym.trainer.credit.registry import CreditContext, MethodSettings, credit_method


def vine_advantages(values: Sequence[float | None], outcome: float, baseline: float) -> list[float]:
    """``values[t]``: the estimate of V(s_t) for t = 0..T-1 (None: not estimated); ``outcome``: R =
    V(s_T); ``baseline``: V(s_0) when it was not estimated. Returns ``A_t = V_{t+1} - V_t`` with
    unestimated states filled from the next estimated one (see the module docstring)."""
    filled = [float(outcome)] * (len(values) + 1)
    for t in range(len(values) - 1, -1, -1):
        v = values[t]
        if v is not None:
            filled[t] = float(v)
        elif t == 0:
            filled[t] = float(baseline)
        else:
            filled[t] = filled[t + 1]
    return [filled[t + 1] - filled[t] for t in range(len(values))]


def vine_values(traj) -> list[float | None]:
    """V(s_0..s_{T-1}) of a vine rollout's trajectory: the mean of each state's continuation outcomes."""
    meta = traj.metadata.get("vine")
    if not isinstance(meta, dict) or "samples" not in meta:
        raise ValueError(
            f"vine credit needs vine rollouts (forked value estimates): trajectory "
            f"{traj.group}#{traj.sample} has none; the trainer runs them for credit.method=vine "
            "(turngym.rollout.vine)"
        )
    samples = list(meta["samples"])[: len(traj.turns)]
    samples += [[]] * (len(traj.turns) - len(samples))
    return [float(np.mean(s)) if s else None for s in samples]


@dataclass
class Vine:
    """``vine``: ``V(s_{t+1}) - V(s_t)`` from forked continuations, per turn."""

    norm_by_std: bool = False
    outcome: OutcomeReward = field(default_factory=OutcomeReward)
    name: str = "vine"

    def group_advantages(self, group) -> GroupCredit:
        outcomes = [self.outcome(t) for t in group]
        baseline = float(np.mean(outcomes)) if outcomes else 0.0
        scale = float(np.std(outcomes)) + EPS if self.norm_by_std and len(outcomes) > 1 else 1.0
        adv, estimated, turns = [], 0, 0
        for traj, r in zip(group, outcomes, strict=True):
            values = vine_values(traj)
            estimated += sum(v is not None for v in values)
            turns += len(values)
            adv.append([a / scale for a in vine_advantages(values, r, baseline)])
        return GroupCredit(adv, {"vine/estimated_frac": estimated / max(turns, 1)})


class VineSettings(MethodSettings):
    """``credit.vine``: ``k`` continuations per estimated state; ``turns``: ``all`` states or only
    those around ``tool``-call turns; ``max_tokens``: continuation tokens per trajectory at most
    (None: no cap); ``norm_by_std``: divide by the group's outcome std."""

    needs_vine_rollouts: ClassVar[bool] = True  # the trainer runs vine rollouts for this method

    k: int = 4
    turns: Literal["all", "tool"] = "all"
    max_tokens: int | None = None
    norm_by_std: bool = False

    def rollout_config(self):
        """The rollout's ``VineConfig`` for these settings."""
        from turngym.rollout.vine import VineConfig

        return VineConfig(k=self.k, turns=self.turns, max_tokens=self.max_tokens)


@credit_method("vine", settings=VineSettings)
def build(settings: VineSettings, ctx: CreditContext) -> Vine:
    return Vine(settings.norm_by_std, ctx.outcome)
