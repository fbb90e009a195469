"""Turn-level credit assignment: one module per method, each with a pure function on plain numbers
and a :class:`~turngym.trainer.credit.base.CreditMethod` over trajectories, plus the pipeline."""

from turngym.trainer.credit.arena import (
    Arena,
    Match,
    TournamentResult,
    anchor,
    double_elimination,
    rank_advantages,
    round_robin,
    run_tournament,
    single_elimination,
    swiss,
)
from turngym.trainer.credit.base import CreditMethod, GroupCredit, OutcomeReward, TurnRewards
from turngym.trainer.credit.dual_level import DualLevel, dual_level
from turngym.trainer.credit.gated import Gated, gated, gated_total
from turngym.trainer.credit.gigpo import GiGPO, gigpo
from turngym.trainer.credit.grpo import GRPO, grpo
from turngym.trainer.credit.igpo import IGPO, igpo
from turngym.trainer.credit.pipeline import CreditOutput, CreditPipeline, token_advantages

__all__ = [
    "GRPO",
    "IGPO",
    "Arena",
    "CreditMethod",
    "CreditOutput",
    "CreditPipeline",
    "DualLevel",
    "Gated",
    "GiGPO",
    "GroupCredit",
    "Match",
    "OutcomeReward",
    "TournamentResult",
    "TurnRewards",
    "anchor",
    "double_elimination",
    "dual_level",
    "gated",
    "gated_total",
    "gigpo",
    "grpo",
    "igpo",
    "rank_advantages",
    "round_robin",
    "run_tournament",
    "single_elimination",
    "swiss",
    "token_advantages",
]
