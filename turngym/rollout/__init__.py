"""The async rollout engine and the trajectory store (JSONL + parquet)."""

from turngym.rollout.engine import MASK_REASONS, RolloutConfig, RolloutEngine, RolloutStats
from turngym.rollout.store import (
    TrajectoryWriter,
    load_jsonl,
    load_parquet,
    load_trajectories,
    save_jsonl,
    save_parquet,
)

__all__ = [
    "MASK_REASONS",
    "RolloutConfig",
    "RolloutEngine",
    "RolloutStats",
    "TrajectoryWriter",
    "load_jsonl",
    "load_parquet",
    "load_trajectories",
    "save_jsonl",
    "save_parquet",
]
