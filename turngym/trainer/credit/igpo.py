"""``igpo``: information-gain turn rewards (IGPO, arXiv 2510.14967).

Tool turns are paid the change in the policy's belief in the gold answer (the gains that
:mod:`turngym.trainer.credit.info_gain`'s scorer returns for the step's batch); the answer turn
is paid the outcome. Rewards are normalised over all reward positions of the group, then
discounted turn by turn and broadcast.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from turngym.core.types import Trajectory
from turngym.trainer.credit.base import GroupCredit, OutcomeReward, broadcast
from turngym.trainer.credit.grpo import grpo
from turngym.trainer.credit.info_gain import (
    DEFAULT_PREFIX,
    DEFAULT_SUFFIX,
    InfoGains,
    InfoGainScorer,
    answer_frame,
    gold_answer,
)
from turngym.trainer.credit.normalize import center_by_depth, discounted_returns, ragged_zscore
from turngym.trainer.credit.pipeline import CreditPipeline
from turngym.trainer.credit.registry import CreditContext, MethodSettings, credit_method

Norm = Literal["joint", "separate"]
# what is done to the turn returns after discounting: "none" (the paper), "depth_center" (minus the
# group's mean return at the same turn depth), "depth_zscore" (that, then divided by the group's std)
ReturnNorm = Literal["none", "depth_center", "depth_zscore"]
RETURN_NORMS = ("none", "depth_center", "depth_zscore")


def igpo(
    ig_rewards: Sequence[Sequence[float | None]],
    outcomes: Sequence[float],
    gamma: float = 1.0,
    norm: Norm = "joint",
    returns: ReturnNorm = "none",
) -> list[list[float]]:
    """Turn advantages of a group: one per tool turn of ``ig_rewards[i]``, then one for the answer turn.

    ``None`` in ``ig_rewards[i]`` marks a turn that is not a reward position (reward 0, left out of
    the normalisation pool); a turn whose IG is exactly 0 is still a reward position.
    ``norm="joint"``: one mean/std over the outcome and IG positions of all trajectories;
    ``"separate"``: outcome positions and IG positions each with their own stats. Population std;
    a pool of <= 1 element uses std 1. Then ``A_t = r̂_t + gamma * A_{t+1}``.

    ``returns``: ``"none"`` keeps those returns (the paper). They are not centred: normalising the
    reward *positions* makes the positions zero-mean, but a turn's return sums every later position,
    so early turns and the turns of groups whose outcomes are all equal carry a common offset (on
    SmolLM2 search-qa the advantages averaged +0.36 where GRPO's average 0). ``"depth_center"``
    subtracts the group's mean return at the same turn depth (a baseline per depth, independent of
    the action); ``"depth_zscore"`` then divides by the std of the centred returns (GRPO's scale).
    """
    if len(ig_rewards) != len(outcomes):
        raise ValueError(f"{len(ig_rewards)} IG lists for {len(outcomes)} outcomes")
    if norm not in ("joint", "separate"):
        raise ValueError(f"norm must be 'joint' or 'separate', got {norm!r}")
    if returns not in RETURN_NORMS:
        raise ValueError(f"returns must be one of {RETURN_NORMS}, got {returns!r}")
    pools: dict[object, list[tuple[int, int, float]]] = {"outcome": [], "ig": []}
    shape = []
    for i, (igs, outcome) in enumerate(zip(ig_rewards, outcomes, strict=True)):
        for t, v in enumerate(igs):
            if v is not None:
                pools["ig" if norm == "separate" else "outcome"].append((i, t, float(v)))
        pools["outcome"].append((i, len(igs), float(outcome)))
        shape.append(len(igs) + 1)
    normed = ragged_zscore(pools, shape)
    out = [discounted_returns(r, gamma) for r in normed]
    return out if returns == "none" else center_by_depth(out, by_std=returns == "depth_zscore")


def valid_info_gain(values: Sequence[float] | None, tool_turns: int) -> bool:
    """IG is usable when there is one finite value per tool turn."""
    return (
        values is not None
        and len(values) == tool_turns
        and all(v is not None and math.isfinite(v) for v in values)
    )


class GainScorer(Protocol):
    """What IGPO asks for a step's information gains (:class:`~.info_gain.InfoGainScorer`)."""

    def score(self, trajectories: list[Trajectory]) -> InfoGains: ...


@dataclass
class IGPO:
    """IGPO over the information gains that ``scorer`` returns for a step's batch.

    :meth:`prepare` (the pipeline's batch-wide stage) asks the scorer for the gains of every
    trajectory of the step; :meth:`group_advantages` reads them. Without a scorer no trajectory has
    a gain (each is paid its outcome only). A group without a gold answer (``traj.reference`` has no ``answer_key``) falls back to ``grpo``;
    a trajectory with missing/non-finite IG or an IG count that does not match its tool turns uses
    its outcome only (metric ``igpo/ig_fallback``). Metrics, as means over the step's groups:
    ``igpo/flat_groups`` the share of groups whose outcomes are all equal, ``igpo/flat_adv_mean``
    their mean turn advantage (0 for the other groups).
    """

    gamma: float = 1.0
    norm: Norm = "joint"
    answer_key: str = "answer"
    outcome: OutcomeReward = field(default_factory=lambda: OutcomeReward(missing=-2.0))
    name: str = "igpo"
    returns: ReturnNorm = "none"
    scorer: GainScorer | None = None
    # the step's gains: id(trajectory) -> (that trajectory, its gains), set by ``prepare``
    _gains: dict[int, tuple[Trajectory, list[float] | None]] = field(default_factory=dict, repr=False)

    def prepare(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """Score the step's trajectories (the pipeline's batch-wide stage); returns the scorer's metrics."""
        self._gains = {}
        if self.scorer is None:
            return {}
        found = self.scorer.score(trajectories)
        if len(found.gains) != len(trajectories):
            raise ValueError(
                f"the scorer returned {len(found.gains)} gain lists for {len(trajectories)} trajectories"
            )
        self._gains = {id(t): (t, g) for t, g in zip(trajectories, found.gains, strict=True)}
        return found.metrics

    def gains(self, traj: Trajectory) -> list[float] | None:
        """The gains the last :meth:`prepare` found for ``traj`` (None: not scored)."""
        owner, values = self._gains.get(id(traj), (None, None))
        return values if owner is traj else None

    def group_advantages(self, group) -> GroupCredit:
        outcomes = [self.outcome(t) for t in group]
        turns = [t.turns for t in group]
        if not any(gold_answer(t, self.answer_key) is not None for t in group):
            return GroupCredit(broadcast(grpo(outcomes), turns), {"igpo/no_reference": 1.0})
        ig_rewards: list[list[float | None]] = []
        fallbacks = 0
        for traj in group:
            tool_turns = max(len(traj.turns) - 1, 0)
            values = self.gains(traj)
            if valid_info_gain(values, tool_turns):
                ig_rewards.append([float(v) for v in values])
            else:
                fallbacks += 1
                ig_rewards.append([None] * tool_turns)
        adv = igpo(ig_rewards, outcomes, self.gamma, self.norm, self.returns)
        # a trajectory with no turns at all has one (answer) slot in ``adv``; keep the shapes of ``turns``
        adv = [a[: len(ts)] for a, ts in zip(adv, turns, strict=True)]
        # groups whose outcomes are all equal: GRPO gives them no signal; what IGPO gives them comes
        # from the information gain alone (and, with raw returns, a common offset: flat_adv_mean)
        flat = len(set(outcomes)) <= 1
        values = [a for row in adv for a in row]
        flat_mean = sum(values) / len(values) if flat and values else 0.0
        metrics = {"igpo/ig_fallback": float(fallbacks), "igpo/flat_groups": float(flat)}
        return GroupCredit(adv, {**metrics, "igpo/flat_adv_mean": flat_mean})


class IGPOSettings(MethodSettings):
    """``credit.igpo``."""

    ig_type: Literal["prob_diff", "log_prob_diff"] = "prob_diff"
    norm: Literal["joint", "separate"] = "joint"
    gamma: float = 1.0
    # the turn returns after discounting: none (paper) | depth_center | depth_zscore (see ``igpo``)
    returns: ReturnNorm = "none"
    answer_key: str = "answer"
    # what the gain is measured on: "answer" (the paper) or "hops" (each hop's entity and the answer,
    # from the reference's hops_key list: credit for bridge searches; info_gain.hop_information_gain)
    gain_targets: Literal["answer", "hops"] = "answer"
    hops_key: str = "hop_answers"
    missing_answer_reward: float = -2.0
    # the text around the gold answer when it is scored; default: the env parser's way of calling
    # answer_tool(answer_arg=...) plus the chat template's end of turn (credit.info_gain.answer_frame)
    prefix: str | None = None
    suffix: str | None = None
    answer_tool: str = "answer"
    answer_arg: str = "text"
    batch_tokens: int = 32768
    share_prefix: bool = True  # a trajectory's contexts scored in one packed forward (prefix shared)


@credit_method("igpo", settings=IGPOSettings)
def build(settings: IGPOSettings, ctx: CreditContext) -> CreditPipeline:
    """IGPO, with the information-gain scorer on the training model as the batch-wide stage (without
    a model there is no scorer and every trajectory is paid its outcome only)."""
    s = settings
    outcome = OutcomeReward(ctx.outcome.component, s.missing_answer_reward)
    scorer = None
    if ctx.model is not None:
        frame = answer_frame(ctx.parser, ctx.tokenizer, s.answer_tool, s.answer_arg) if ctx.parser else None
        prefix, suffix = frame or (DEFAULT_PREFIX, DEFAULT_SUFFIX)
        scorer = InfoGainScorer(
            ctx.model,
            ctx.tokenizer,
            ig_type=s.ig_type,
            prefix=s.prefix if s.prefix is not None else prefix,
            suffix=s.suffix if s.suffix is not None else suffix,
            answer_key=s.answer_key,
            batch_tokens=s.batch_tokens,
            share_prefix=s.share_prefix,
            gain_targets=s.gain_targets,
            hops_key=s.hops_key,
        )
    method = IGPO(s.gamma, s.norm, s.answer_key, outcome, returns=s.returns, scorer=scorer)
    return CreditPipeline(method, prepare=method.prepare)
