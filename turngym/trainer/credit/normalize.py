"""Normaliser and discount stages shared by the credit methods (plain numbers, numpy)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

EPS = 1e-6


def zscore(values: Sequence[float], *, by_std: bool = True, eps: float = EPS) -> list[float]:
    """``(x - mean) / (std + eps)`` with the population std; a pool of <= 1 element uses std 1.

    An empty pool gives ``[]``; a pool of identical values gives zeros (never NaN).
    """
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return []
    centred = x - x.mean()
    if not by_std:
        return centred.tolist()
    std = float(x.std()) if x.size > 1 else 1.0
    return (centred / (std + eps)).tolist()


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """``G_t = r_t + gamma * G_{t+1}`` (reward-to-go), same length as ``rewards``."""
    out = [0.0] * len(rewards)
    acc = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        acc = float(rewards[t]) + gamma * acc
        out[t] = acc
    return out


def ragged_zscore(
    pools: dict[object, list[tuple[int, int, float]]], shape: Sequence[int], **kw
) -> list[list[float]]:
    """Z-score values pool by pool; each entry is ``(i, t, value)``; returns ``out[i][t]``."""
    out = [[0.0] * n for n in shape]
    for entries in pools.values():
        normed = zscore([v for _, _, v in entries], **kw)
        for (i, t, _), z in zip(entries, normed, strict=True):
            out[i][t] = z
    return out


def center_by_depth(
    rows: Sequence[Sequence[float]], *, by_std: bool = False, eps: float = EPS
) -> list[list[float]]:
    """Subtract from ``rows[i][t]`` the mean over the rows that have a position ``t`` (a baseline per
    turn depth); ``by_std``: then divide every value by the population std of all centred values.

    A depth that only one row reaches becomes 0 there; identical rows give zeros (never NaN).
    """
    width = max((len(r) for r in rows), default=0)
    means = []
    for t in range(width):
        col = [float(r[t]) for r in rows if len(r) > t]
        means.append(sum(col) / len(col))
    out = [[float(v) - means[t] for t, v in enumerate(r)] for r in rows]
    if by_std:
        flat = np.asarray([v for r in out for v in r], dtype=np.float64)
        std = float(flat.std()) if flat.size > 1 else 1.0
        out = [[v / (std + eps) for v in r] for r in out]
    return out
