"""``turn``: dual-level trajectory + turn advantages (MatchTIR, arXiv 2601.10712)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from turngym.trainer.credit.base import GroupCredit, TurnRewards
from turngym.trainer.credit.normalize import discounted_returns, ragged_zscore, zscore
from turngym.trainer.credit.registry import CreditContext, MethodSettings, credit_method


def dual_level(turn_rewards: Sequence[Sequence[float]], lam: float = 0.9) -> list[list[float]]:
    """``A_{i,t} = ½ (A^traj_i + A^turn_{i,t})``.

    ``A^traj`` = z-score of ``Σ_t r_{i,t}`` in the group; ``A^turn`` = the discounted future turn
    rewards ``Σ_{k>=t} lam^{k-t} r_{i,k}``, z-scored across the trajectories that reach turn index t.
    """
    traj = zscore([sum(r) for r in turn_rewards])
    future = [discounted_returns(r, lam) for r in turn_rewards]
    by_index: dict[object, list[tuple[int, int, float]]] = defaultdict(list)
    for i, fs in enumerate(future):
        for t, f in enumerate(fs):
            by_index[t].append((i, t, f))
    turn = ragged_zscore(by_index, [len(f) for f in future])
    return [[0.5 * (traj[i] + a) for a in turn[i]] for i in range(len(future))]


@dataclass
class DualLevel:
    """Dual-level advantages over any turn-reward provider (default: the env's per-turn rewards)."""

    lam: float = 0.9
    rewards: TurnRewards = field(default_factory=TurnRewards)
    name: str = "turn"

    def group_advantages(self, group) -> GroupCredit:
        return GroupCredit(dual_level([self.rewards(t) for t in group], self.lam))


class TurnSettings(MethodSettings):
    """``credit.turn``: ``lam`` discounts the future turn rewards (was ``credit.turn_lambda``)."""

    lam: float = 0.9


@credit_method("turn", settings=TurnSettings, legacy_keys={"turn_lambda": "lam"})
def build(settings: TurnSettings, ctx: CreditContext) -> DualLevel:
    return DualLevel(settings.lam)
