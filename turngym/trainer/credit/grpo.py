"""``grpo``: outcome advantages normalised inside the group, broadcast to every turn."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from turngym.trainer.credit.base import GroupCredit, OutcomeReward, broadcast
from turngym.trainer.credit.normalize import EPS
from turngym.trainer.credit.registry import CreditContext, MethodSettings, credit_method


def grpo(outcomes: Sequence[float], norm_by_std: bool = True, leave_one_out: bool = False) -> list[float]:
    """``A_i = (R_i - mean_j R_j) / (std_j R_j + 1e-6)``.

    ``leave_one_out``: the baseline of i is the mean of the *other* rewards (RLOO); the std (when
    ``norm_by_std``) is still the population std of the whole group. G=1 gives ``[0.0]``.
    """
    r = np.asarray(outcomes, dtype=np.float64)
    g = r.size
    if g <= 1:
        return [0.0] * g
    baseline = (r.sum() - r) / (g - 1) if leave_one_out else np.full(g, r.mean())
    adv = r - baseline
    if norm_by_std:
        adv = adv / (r.std() + EPS)
    return adv.tolist()


@dataclass
class GRPO:
    """Outcome-only baseline: one advantage per trajectory, broadcast to all its turns."""

    norm_by_std: bool = True
    leave_one_out: bool = False
    outcome: OutcomeReward = field(default_factory=OutcomeReward)
    name: str = "grpo"

    def group_advantages(self, group) -> GroupCredit:
        outcomes = [self.outcome(t) for t in group]
        adv = grpo(outcomes, self.norm_by_std, self.leave_one_out)
        return GroupCredit(broadcast(adv, [t.turns for t in group]))


class GRPOSettings(MethodSettings):
    """``credit.grpo``: none of its own; grpo reads the shared ``credit.norm_by_std``,
    ``credit.leave_one_out`` and ``credit.outcome_component``."""


@credit_method("grpo", settings=GRPOSettings)
def build(settings: GRPOSettings, ctx: CreditContext) -> GRPO:
    c = ctx.credit
    return GRPO(c.norm_by_std, c.leave_one_out, ctx.outcome)
