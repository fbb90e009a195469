"""The statistics of a credit audit: rank and linear correlation, sign agreement and cluster-bootstrap
error bars (resampling whole trajectories, since the turns of one trajectory are not independent).

Spearman's rho is the Pearson correlation of average ranks (ties share the mean of their ranks);
both are None where either side is constant (no correlation is defined).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def rankdata(values: Sequence[float]) -> np.ndarray:
    """1-based ranks; tied values get the mean of the ranks they span."""
    x = np.asarray(values, dtype=np.float64)
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(x.size, dtype=np.float64)
    sorted_x = x[order]
    i = 0
    while i < x.size:
        j = i
        while j + 1 < x.size and sorted_x[j + 1] == sorted_x[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def pearson(x: Sequence[float], y: Sequence[float]) -> float | None:
    a = np.asarray(x, dtype=np.float64)
    b = np.asarray(y, dtype=np.float64)
    if a.size != b.size:
        raise ValueError(f"pearson: {a.size} values against {b.size}")
    if a.size < 2:
        return None
    a, b = a - a.mean(), b - b.mean()
    denom = float(np.sqrt((a * a).sum() * (b * b).sum()))
    if denom == 0.0 or not np.isfinite(denom):
        return None
    return float(np.clip((a * b).sum() / denom, -1.0, 1.0))


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    if len(x) != len(y):
        raise ValueError(f"spearman: {len(x)} values against {len(y)}")
    if len(x) < 2:
        return None
    return pearson(rankdata(x), rankdata(y))


def sign_agreement(x: Sequence[float], y: Sequence[float]) -> float | None:
    """The share of pairs with ``y != 0`` whose signs agree (``x == 0`` disagrees: no credit where
    the true advantage is not zero); None without such pairs."""
    pairs = [(a, b) for a, b in zip(x, y, strict=True) if b != 0.0]
    if not pairs:
        return None
    return float(np.mean([np.sign(a) == np.sign(b) for a, b in pairs]))


def bootstrap(
    clusters: Sequence[tuple[Sequence[float], Sequence[float]]],
    statistic: Callable[[list[float], list[float]], float | None],
    reps: int = 200,
    seed: int = 0,
) -> dict[str, float | None]:
    """The statistic on all pairs and its cluster-bootstrap standard error and 95% percentile
    interval: ``clusters`` are each trajectory's ``(x values, y values)``, resampled whole."""
    xs = [a for c in clusters for a in c[0]]
    ys = [b for c in clusters for b in c[1]]
    value = statistic(xs, ys)
    out: dict[str, float | None] = {"value": value, "se": None, "lo": None, "hi": None}
    if value is None or len(clusters) < 2 or reps < 2:
        return out
    rng = np.random.default_rng(seed)
    stats = []
    for _ in range(reps):
        pick = rng.integers(0, len(clusters), len(clusters))
        bx = [a for k in pick for a in clusters[k][0]]
        by = [b for k in pick for b in clusters[k][1]]
        s = statistic(bx, by)
        if s is not None:
            stats.append(s)
    if len(stats) >= 2:
        arr = np.asarray(stats)
        out.update(
            se=float(arr.std(ddof=1)), lo=float(np.quantile(arr, 0.025)), hi=float(np.quantile(arr, 0.975))
        )
    return out


def mean_or_none(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if len(values) else None
