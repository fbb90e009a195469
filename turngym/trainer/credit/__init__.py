"""Turn-level credit assignment: one module per method, each with a pure function on plain numbers,
a :class:`~turngym.trainer.credit.base.CreditMethod` over trajectories, its settings model and its
registered builder (:mod:`turngym.trainer.credit.registry`), plus the pipeline."""

from turngym.trainer.credit.arena import (
    Arena,
    ArenaSettings,
    Match,
    TournamentResult,
    anchor,
    build_judge,
    double_elimination,
    rank_advantages,
    round_robin,
    run_tournament,
    single_elimination,
    swiss,
)
from turngym.trainer.credit.base import CreditMethod, GroupCredit, OutcomeReward, TurnRewards
from turngym.trainer.credit.dual_level import DualLevel, TurnSettings, dual_level
from turngym.trainer.credit.gated import Gated, GatedSettings, gated, gated_total
from turngym.trainer.credit.gigpo import GiGPO, GiGPOSettings, gigpo
from turngym.trainer.credit.grpo import GRPO, GRPOSettings, grpo
from turngym.trainer.credit.igpo import IGPO, IGPOSettings, igpo
from turngym.trainer.credit.pipeline import CreditOutput, CreditPipeline, token_advantages
from turngym.trainer.credit.pointwise import Pointwise, PointwiseSettings
from turngym.trainer.credit.registry import (
    CreditContext,
    MethodSettings,
    build_credit_pipeline,
    credit_method,
    registered_credit_methods,
)
from turngym.trainer.credit.tree import (
    TreeCredit,
    TreeGiGPO,
    TreeGiGPOSettings,
    TreeSettings,
    node_values,
    tree_advantages,
    tree_anchor_keys,
)

__all__ = [
    "GRPO",
    "IGPO",
    "Arena",
    "ArenaSettings",
    "CreditContext",
    "CreditMethod",
    "CreditOutput",
    "CreditPipeline",
    "Pointwise",
    "PointwiseSettings",
    "DualLevel",
    "GRPOSettings",
    "Gated",
    "GatedSettings",
    "GiGPO",
    "GiGPOSettings",
    "GroupCredit",
    "IGPOSettings",
    "Match",
    "MethodSettings",
    "OutcomeReward",
    "TournamentResult",
    "TreeCredit",
    "TreeGiGPO",
    "TreeGiGPOSettings",
    "TreeSettings",
    "TurnRewards",
    "TurnSettings",
    "anchor",
    "build_credit_pipeline",
    "build_judge",
    "credit_method",
    "double_elimination",
    "dual_level",
    "gated",
    "gated_total",
    "gigpo",
    "grpo",
    "igpo",
    "node_values",
    "rank_advantages",
    "registered_credit_methods",
    "round_robin",
    "run_tournament",
    "single_elimination",
    "swiss",
    "token_advantages",
    "tree_advantages",
    "tree_anchor_keys",
]
