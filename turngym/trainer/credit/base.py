"""What every credit method returns, and the providers of turn rewards read from trajectories."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from turngym.core.types import Trajectory


@dataclass
class GroupCredit:
    """Turn-level advantages of one task group: ``advantages[i][t]`` for trajectory i, turn t.

    ``total_rewards``/``outcomes`` are what the method optimised and the plain outcome, logged
    separately (a rising total with a falling outcome is reward hacking).
    """

    advantages: list[list[float]]
    metrics: dict[str, float] = field(default_factory=dict)


class CreditMethod(Protocol):
    """A credit method turns one group of trajectories of the same task into turn advantages."""

    name: str

    def group_advantages(self, group: list[Trajectory]) -> GroupCredit: ...


@dataclass(frozen=True)
class OutcomeReward:
    """Turn-reward provider: the outcome of a trajectory.

    ``component``: read this reward component of the last turn instead of the last turn's reward.
    ``missing``: if set, a trajectory that did not end through a terminal tool (no answer) or whose
    last action was malformed gets this value instead (IGPO uses -2).
    """

    component: str | None = None
    missing: float | None = None

    def __call__(self, traj: Trajectory) -> float:
        if not traj.turns:
            return self.missing if self.missing is not None else 0.0
        last = traj.turns[-1]
        if self.missing is not None and (not traj.terminated or last.invalid_action):
            return float(self.missing)
        if self.component is not None:
            return float(last.reward_components.get(self.component, 0.0))
        return float(last.reward)


@dataclass(frozen=True)
class TurnRewards:
    """Turn-reward provider: each turn's env reward, or the sum of the named reward components."""

    components: tuple[str, ...] | None = None

    def __call__(self, traj: Trajectory) -> list[float]:
        if self.components is None:
            return [float(t.reward) for t in traj.turns]
        return [float(sum(t.reward_components.get(c, 0.0) for c in self.components)) for t in traj.turns]


def broadcast(values: list[float], turns: list) -> list[list[float]]:
    """One value per trajectory -> the same value on every turn of it."""
    return [[float(v)] * len(ts) for v, ts in zip(values, turns, strict=True)]
