"""``gated``: Gated Reward Accumulation (G-RA, arXiv 2508.10548).

Lower-priority rewards count only while every higher priority meets its threshold, so a policy
cannot farm cheap per-turn critics while the long-term outcome fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from turngym.trainer.credit.base import GroupCredit, OutcomeReward, broadcast
from turngym.trainer.credit.grpo import grpo
from turngym.trainer.credit.normalize import discounted_returns, ragged_zscore
from turngym.trainer.credit.registry import CreditContext, MethodSettings, credit_method


def gated(
    high: Sequence[float], low: Sequence[Sequence[float]], delta: float, gamma: float = 1.0
) -> list[list[float]]:
    """Per-turn gated rewards ``r̃_{i,t} = γ^t r_low_{i,t} · 1[r_high_i >= delta]``, plus ``r_high_i``
    on the last turn; so ``sum_t r̃_{i,t} = r_high + 1[r_high >= δ] Σ_t γ^t r_low_t`` (the two-level form).

    A trajectory with no turns gets ``[]``.
    """
    if len(high) != len(low):
        raise ValueError(f"{len(high)} outcomes for {len(low)} turn-reward lists")
    out = []
    for h, lows in zip(high, low, strict=True):
        gate = 1.0 if h >= delta else 0.0
        r = [gate * gamma**t * float(x) for t, x in enumerate(lows)]
        if r:
            r[-1] += float(h)
        out.append(r)
    return out


def gated_total(
    levels: Sequence[float | Sequence[float]], deltas: Sequence[float], gamma: float = 1.0
) -> float:
    """Multi-level form ``R = Σ_k r_k · Π_{j<k} 1[r_j >= δ_j]`` (level 0 = highest priority).

    A level given per turn counts as ``Σ_t γ^t r_{k,t}``; ``deltas[j]`` is the threshold of level j
    (one per level except the lowest, which gates nothing).
    """
    if len(deltas) < len(levels) - 1:
        raise ValueError(f"{len(levels)} levels need {len(levels) - 1} thresholds, got {len(deltas)}")
    total, open_ = 0.0, True
    for k, level in enumerate(levels):
        value = (
            float(level)
            if isinstance(level, (int, float))
            else sum(gamma**t * float(x) for t, x in enumerate(level))
        )
        if open_:
            total += value
        if k < len(levels) - 1:
            open_ = open_ and value >= deltas[k]
    return total


@dataclass
class Gated:
    """G-RA over env rewards: ``high_component`` of the last turn is r_high; ``low_components`` of
    every turn are r_low (default: every component except ``high_component``).

    ``advantage="trajectory"``: z-score of the gated total in the group, broadcast (the paper's
    two-level return); ``"turn"``: discounted reward-to-go of the per-turn gated rewards, z-scored
    over all turns of the group.
    """

    delta: float = 1.0
    gamma: float = 1.0
    high_component: str | None = None
    low_components: tuple[str, ...] | None = None
    advantage: Literal["trajectory", "turn"] = "trajectory"
    name: str = "gated"

    def _low(self, traj) -> list[float]:
        if self.high_component is None and self.low_components is None:
            # the last turn's whole reward is r_high; earlier turns' rewards are r_low
            return [float(t.reward) for t in traj.turns[:-1]] + [0.0] * bool(traj.turns)
        out = []
        for turn in traj.turns:
            comps = turn.reward_components
            names = self.low_components or tuple(c for c in comps if c != self.high_component)
            out.append(float(sum(comps.get(c, 0.0) for c in names)))
        return out

    def group_advantages(self, group) -> GroupCredit:
        high = [OutcomeReward(component=self.high_component)(t) for t in group]
        low = [self._low(t) for t in group]
        turns = [t.turns for t in group]
        gate_open = sum(h >= self.delta for h in high) / max(len(group), 1)
        # the stepwise reward earned, gate or no gate: what direct accumulation can farm
        low_sums = [sum(self.gamma**t * x for t, x in enumerate(lows)) for lows in low]
        if self.advantage == "trajectory":
            per_turn = gated(high, low, self.delta, self.gamma)
            totals = [sum(r) for r in per_turn]
            adv = broadcast(grpo(totals), turns)
        else:
            per_turn = gated(high, low, self.delta, 1.0)
            totals = [sum(r) for r in per_turn]
            returns = [discounted_returns(r, self.gamma) for r in per_turn]
            pool = {0: [(i, t, v) for i, rs in enumerate(returns) for t, v in enumerate(rs)]}
            adv = ragged_zscore(pool, [len(r) for r in returns])
        return GroupCredit(
            adv,
            {
                "gated/total_mean": sum(totals) / max(len(totals), 1),
                "gated/outcome_mean": sum(high) / max(len(high), 1),
                "gated/gate_open_frac": gate_open,
                "gated/low_mean": sum(low_sums) / max(len(low_sums), 1),
            },
        )


class GatedSettings(MethodSettings):
    """``credit.gated``."""

    delta: float = 1.0
    gamma: float = 1.0
    high_component: str | None = None
    low_components: list[str] | None = None
    advantage: Literal["trajectory", "turn"] = "trajectory"


@credit_method("gated", settings=GatedSettings)
def build(settings: GatedSettings, ctx: CreditContext) -> Gated:
    g = settings
    low = tuple(g.low_components) if g.low_components is not None else None
    return Gated(g.delta, g.gamma, g.high_component, low, g.advantage)
