"""The shape of a tree rollout (``turngym.rollout.tree``), shared by the tree credit and the viewer.

Each turn of a leaf trajectory has a ``node_id`` and a ``parent_id`` (``Turn``): the first turn's
parent is ``TREE_ROOT`` (the reset state), child j of node p is ``f"{p}.{j}"``. A node's leaves are
the trajectories whose path passes through it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

#: The ``parent_id`` of a tree rollout's first turn: the reset state.
TREE_ROOT = "root"


def node_values(paths: Sequence[Sequence[str]], returns: Sequence[float]) -> dict[str, float]:
    """``V(n)`` = the mean of ``returns[i]`` over the leaves i whose ``paths[i]`` (node ids from the
    first turn to the last) contains n; ``V(TREE_ROOT)`` = the mean of all returns (absent if none)."""
    if len(paths) != len(returns):
        raise ValueError(f"{len(paths)} paths but {len(returns)} returns")
    below: dict[str, list[float]] = defaultdict(list)
    for path, r in zip(paths, returns, strict=True):
        for node in dict.fromkeys(path):  # a node counts a leaf once
            below[node].append(float(r))
        below[TREE_ROOT].append(float(r))
    return {n: sum(rs) / len(rs) for n, rs in below.items()}
