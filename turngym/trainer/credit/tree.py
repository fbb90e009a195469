"""Tree credit: turn advantages from the branches of a tree rollout (``turngym.rollout.tree``).

A group is one task's tree: its leaves (root-to-leaf paths), each turn with a ``node_id`` and a
``parent_id`` (the node whose state it acted in; ``"root"`` for the first turn). A node's leaves are
the leaves whose path passes through it; R_i is leaf i's outcome.

* ``node_values``: ``V(n) = mean of R_i over the leaves below n`` (nonparametric, no critic);
  ``V(root)`` is the mean of every leaf.
* ``tree`` (TEMPO-style branch-gated credit): turn t of leaf i, at node c with parent p, gets
  ``A_{i,t} = (V(c) - V(p)) / s`` where p branched (>= 2 distinct children in the group) and 0 where
  it did not; ``s = std_i R_i + 1e-6`` with ``norm_by_std`` (1 otherwise). ``episode_weight`` adds
  that weight times the GRPO advantage of the leaf to every turn (default 0: pure branch credit).
  At every branch point the leaf-weighted advantages sum to zero: Σ_c |leaves(c)| (V(c) − V(p)) = 0.
* ``tree_gigpo``: GiGPO (``turngym.trainer.credit.gigpo``) whose anchor groups are exact: the turns
  that acted in the same node (siblings of one branch point share the state by construction) instead
  of turns whose hashed ``state_key`` happens to match. Turns whose parent did not branch form no
  anchor group (step advantage 0), so a shared prefix turn is not credited for futures it was never
  compared against.

Masked leaves are left out by the pipeline before grouping (a failed fork's branch changes no
value). Trajectories without node ids (flat rollouts) are refused with a clear error.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from turngym.core.tree import node_values
from turngym.trainer.credit.base import GroupCredit, OutcomeReward
from turngym.trainer.credit.gigpo import GiGPO, GiGPOSettings
from turngym.trainer.credit.grpo import grpo
from turngym.trainer.credit.normalize import EPS
from turngym.trainer.credit.registry import CreditContext, MethodSettings, credit_method


def branched_parents(paths: Sequence[Sequence[str]], parents: Sequence[Sequence[str]]) -> set[str]:
    """The nodes with at least two distinct children among the paths (the branch points)."""
    children: dict[str, set[str]] = defaultdict(set)
    for path, pars in zip(paths, parents, strict=True):
        if len(path) != len(pars):
            raise ValueError(f"a path of {len(path)} nodes has {len(pars)} parents")
        for node, parent in zip(path, pars, strict=True):
            children[parent].add(node)
    return {p for p, cs in children.items() if len(cs) >= 2}


def tree_advantages(
    paths: Sequence[Sequence[str]],
    parents: Sequence[Sequence[str]],
    returns: Sequence[float],
    norm_by_std: bool = True,
    episode_weight: float = 0.0,
) -> list[list[float]]:
    """Branch-gated turn advantages (see the module docstring): ``(V(c) - V(p)) / s`` at turns whose
    parent branched, 0 elsewhere, plus ``episode_weight`` times the leaf's GRPO advantage."""
    values = node_values(paths, returns)
    branched = branched_parents(paths, parents)
    r = np.asarray(returns, dtype=np.float64)
    scale = (float(r.std()) + EPS) if norm_by_std and r.size > 1 else 1.0
    episode = grpo(returns, norm_by_std=norm_by_std) if episode_weight else [0.0] * len(returns)
    out = []
    for i, (path, pars) in enumerate(zip(paths, parents, strict=True)):
        row = []
        for node, parent in zip(path, pars, strict=True):
            a = (values[node] - values[parent]) / scale if parent in branched else 0.0
            row.append(a + episode_weight * episode[i])
        out.append(row)
    return out


def tree_anchor_keys(
    paths: Sequence[Sequence[str]], parents: Sequence[Sequence[str]]
) -> list[list[str | None]]:
    """GiGPO anchor keys: the parent node of each turn where it branched, None elsewhere."""
    branched = branched_parents(paths, parents)
    return [[p if p in branched else None for p in pars] for pars in parents]


def tree_paths(group) -> tuple[list[list[str]], list[list[str]]]:
    """``(paths, parents)``: the node ids and parent ids of each trajectory's turns."""
    paths, parents = [], []
    for traj in group:
        if any(t.node_id is None or t.parent_id is None for t in traj.turns):
            raise ValueError(
                f"tree credit needs tree rollouts (turns with node ids): trajectory {traj.group}#{traj.sample} "
                "has none; set rollout.tree (or `turngym rollout --tree`)"
            )
        paths.append([t.node_id for t in traj.turns])
        parents.append([t.parent_id for t in traj.turns])
    return paths, parents


@dataclass
class TreeCredit:
    """``tree``: branch-gated node-value differences over a tree group."""

    norm_by_std: bool = True
    episode_weight: float = 0.0
    outcome: OutcomeReward = field(default_factory=OutcomeReward)
    name: str = "tree"

    def group_advantages(self, group) -> GroupCredit:
        paths, parents = tree_paths(group)
        returns = [self.outcome(t) for t in group]
        adv = tree_advantages(paths, parents, returns, self.norm_by_std, self.episode_weight)
        branched = branched_parents(paths, parents)
        turns = sum(len(p) for p in parents)
        gated = sum(1 for pars in parents for p in pars if p in branched)
        return GroupCredit(
            adv,
            {"tree/branch_points": float(len(branched)), "tree/branched_turn_frac": gated / max(turns, 1)},
        )


@dataclass
class TreeGiGPO(GiGPO):
    """``tree_gigpo``: GiGPO with anchor groups = the turns that acted in the same (branched) node."""

    name: str = "tree_gigpo"

    def anchor_keys(self, group) -> list[list[str | None]]:
        paths, parents = tree_paths(group)
        return tree_anchor_keys(paths, parents)


class TreeSettings(MethodSettings):
    """``credit.tree``: ``episode_weight`` (weight of the leaf's GRPO advantage added to every turn;
    0 = pure branch-gated credit). Reads the shared ``credit.norm_by_std``."""

    needs_tree_rollouts: ClassVar[bool] = True  # TrainConfig refuses it without rollout.tree

    episode_weight: float = 0.0


class TreeGiGPOSettings(GiGPOSettings):
    """``credit.tree_gigpo``: GiGPO's options (as ``credit.gigpo``), anchor groups from the tree."""

    needs_tree_rollouts: ClassVar[bool] = True


@credit_method("tree", settings=TreeSettings)
def build(settings: TreeSettings, ctx: CreditContext) -> TreeCredit:
    return TreeCredit(ctx.credit.norm_by_std, settings.episode_weight, ctx.outcome)


@credit_method("tree_gigpo", settings=TreeGiGPOSettings)
def build_gigpo(settings: TreeGiGPOSettings, ctx: CreditContext) -> TreeGiGPO:
    s = settings
    return TreeGiGPO(s.gamma, s.omega, s.mode, s.step_norm_by_std, ctx.outcome)
