"""``gigpo``: episode advantages plus step advantages grouped by anchor state (GiGPO, arXiv 2505.10978)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from turngym.trainer.credit.base import GroupCredit, OutcomeReward, TurnRewards
from turngym.trainer.credit.grpo import grpo
from turngym.trainer.credit.normalize import discounted_returns, ragged_zscore
from turngym.trainer.credit.registry import CreditContext, MethodSettings, credit_method

Mode = Literal["mean_std_norm", "mean_norm"]


def gigpo(
    returns_by_turn: Sequence[Sequence[float]],
    state_keys: Sequence[Sequence[object | None]],
    outcomes: Sequence[float],
    gamma: float = 0.95,
    omega: float = 1.0,
    mode: Mode = "mean_std_norm",
    step_norm_by_std: bool = False,
) -> list[list[float]]:
    """``A_{i,t} = A^E_i + omega * A^S_{i,t}``.

    ``returns_by_turn[i][t]`` are the per-turn rewards r_{i,t}; the step return
    ``G_{i,t} = Σ_{k>=t} gamma^{k-t} r_{i,k}`` is computed from them. ``A^E_i = R_i - mean`` (divided by
    ``std + 1e-6`` in ``mean_std_norm`` mode). ``A^S_{i,t} = G_{i,t} - mean`` over all (j, k) of the
    group whose ``state_keys[j][k]`` equals it; a singleton anchor group or a ``None`` key gives 0.
    ``step_norm_by_std`` also divides A^S by its anchor group's std (verl-agent does; the spec does not).
    """
    if not (len(returns_by_turn) == len(state_keys) == len(outcomes)):
        raise ValueError("returns_by_turn, state_keys and outcomes must have one entry per trajectory")
    if mode not in ("mean_std_norm", "mean_norm"):
        raise ValueError(f"unknown mode {mode!r}")
    episode = grpo(outcomes, norm_by_std=mode == "mean_std_norm")
    returns = [discounted_returns(r, gamma) for r in returns_by_turn]
    anchors: dict[object, list[tuple[int, int, float]]] = defaultdict(list)
    for i, (rs, keys) in enumerate(zip(returns, state_keys, strict=True)):
        if len(rs) != len(keys):
            raise ValueError(f"trajectory {i}: {len(rs)} rewards but {len(keys)} state keys")
        for t, (g, key) in enumerate(zip(rs, keys, strict=True)):
            anchors[("key", key) if key is not None else ("none", i, t)].append((i, t, g))
    step = ragged_zscore(anchors, [len(r) for r in returns], by_std=step_norm_by_std)
    return [[episode[i] + omega * a for a in step[i]] for i in range(len(returns))]


@dataclass
class GiGPO:
    """GiGPO over env rewards; a turn's anchor state is the state it acted in (the previous turn's
    ``state_key``, or the trajectory's ``start_state_key`` for the first turn)."""

    gamma: float = 0.95
    omega: float = 1.0
    mode: Mode = "mean_std_norm"
    step_norm_by_std: bool = False
    outcome: OutcomeReward = field(default_factory=OutcomeReward)
    rewards: TurnRewards = field(default_factory=TurnRewards)
    name: str = "gigpo"

    def anchor_keys(self, group) -> list[list[str | None]]:
        """Per trajectory, the anchor key of each turn (None: no anchor group)."""
        return [acted_in_states(t) for t in group]

    def group_advantages(self, group) -> GroupCredit:
        keys = self.anchor_keys(group)
        adv = gigpo(
            [self.rewards(t) for t in group],
            keys,
            [self.outcome(t) for t in group],
            self.gamma,
            self.omega,
            self.mode,
            self.step_norm_by_std,
        )
        counts = Counter(k for ks in keys for k in ks if k is not None)
        shared = sum(1 for ks in keys for k in ks if k is not None and counts[k] > 1)
        total = sum(len(ks) for ks in keys)
        return GroupCredit(adv, {"gigpo/anchored_frac": shared / total if total else 0.0})


def acted_in_states(traj) -> list[str | None]:
    """The state key each turn acted in."""
    keys = [traj.start_state_key] + [t.state_key for t in traj.turns]
    return keys[: len(traj.turns)]


class GiGPOSettings(MethodSettings):
    """``credit.gigpo`` (were the flat ``credit.gigpo_gamma``, ``gigpo_omega``, ``gigpo_mode``,
    ``gigpo_step_norm_by_std``)."""

    gamma: float = 0.95
    omega: float = 1.0
    mode: Mode = "mean_std_norm"
    step_norm_by_std: bool = False


@credit_method(
    "gigpo",
    settings=GiGPOSettings,
    legacy_keys={
        "gigpo_gamma": "gamma",
        "gigpo_omega": "omega",
        "gigpo_mode": "mode",
        "gigpo_step_norm_by_std": "step_norm_by_std",
    },
)
def build(settings: GiGPOSettings, ctx: CreditContext) -> GiGPO:
    s = settings
    return GiGPO(s.gamma, s.omega, s.mode, s.step_norm_by_std, ctx.outcome)
