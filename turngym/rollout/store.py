"""Trajectory storage: JSONL (appended as trajectories finish) and parquet (columnar), both reloadable.

* ``TrajectoryWriter(dir)``: ``write(traj)`` appends one JSON line and flushes, so a crash loses
  nothing already finished; ``close()`` also writes ``trajectories.parquet``.
* Parquet layout: one row per trajectory with flat columns for analysis (``env_id``, ``task_id``,
  ``seed``, ``group``, ``sample``, ``num_turns``, ``total_reward``, ``outcome``, ``terminated``,
  ``truncated``, ``masked``, ``mask_reason``, ``n_tokens``), the token arrays as list columns
  (``token_ids`` int32, ``loss_mask`` int8, ``logprobs`` float64) and ``json``: the rest of the
  trajectory, so ``load_parquet`` rebuilds every ``Trajectory`` exactly.
* ``load_trajectories(path)`` reads a ``.jsonl``, a ``.parquet`` or a run directory.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from turngym.core.types import Trajectory

JSONL_NAME = "trajectories.jsonl"
PARQUET_NAME = "trajectories.parquet"
_TOKEN_FIELDS = {"token_ids", "loss_mask", "logprobs"}


class TrajectoryWriter:
    """Append trajectories to ``<dir>/trajectories.jsonl``; write parquet on close."""

    def __init__(self, directory: str | Path, parquet: bool = True):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = self.dir / JSONL_NAME
        self.parquet_path = self.dir / PARQUET_NAME
        self.parquet = parquet
        self.count = 0
        self._fh: IO[str] | None = self.jsonl_path.open("a", encoding="utf-8")

    def write(self, traj: Trajectory) -> None:
        if self._fh is None:
            raise RuntimeError("the writer is closed")
        self._fh.write(traj.to_json() + "\n")
        self._fh.flush()
        self.count += 1

    def close(self) -> None:
        if self._fh is None:
            return
        self._fh.close()
        self._fh = None
        if self.parquet:
            save_parquet(load_jsonl(self.jsonl_path), self.parquet_path)

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def save_jsonl(trajectories: Iterable[Trajectory], path: str | Path) -> Path:
    path = Path(path)
    with path.open("w", encoding="utf-8") as fh:
        for t in trajectories:
            fh.write(t.to_json() + "\n")
    return path


def load_jsonl(path: str | Path) -> list[Trajectory]:
    """Read a JSONL file; a truncated last line (a crash mid-write) is skipped, other bad lines raise."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(Trajectory.from_json(line))
        except ValueError as e:
            if i == len(lines) - 1:
                break
            raise ValueError(f"{path}:{i + 1}: not a trajectory: {e}") from e
    return out


def save_parquet(trajectories: Iterable[Trajectory], path: str | Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [_row(t) for t in trajectories]
    schema = pa.schema(
        [
            ("env_id", pa.string()),
            ("task_id", pa.string()),
            ("seed", pa.int64()),
            ("group", pa.string()),
            ("sample", pa.int32()),
            ("num_turns", pa.int32()),
            ("total_reward", pa.float64()),
            ("outcome", pa.float64()),
            ("terminated", pa.bool_()),
            ("truncated", pa.bool_()),
            ("masked", pa.bool_()),
            ("mask_reason", pa.string()),
            ("n_tokens", pa.int32()),
            ("token_ids", pa.list_(pa.int32())),
            ("loss_mask", pa.list_(pa.int8())),
            ("logprobs", pa.list_(pa.float64())),
            ("json", pa.string()),
        ]
    )
    table = pa.Table.from_pylist(rows, schema=schema)
    path = Path(path)
    pq.write_table(table, path)
    return path


def load_parquet(path: str | Path) -> list[Trajectory]:
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=["token_ids", "loss_mask", "logprobs", "json"])
    out = []
    for row in table.to_pylist():
        data = json.loads(row["json"])
        data.update({k: row[k] or [] for k in _TOKEN_FIELDS})
        out.append(Trajectory.model_validate(data))
    return out


def load_trajectories(path: str | Path) -> list[Trajectory]:
    """Load from a ``.jsonl`` or ``.parquet`` file, or a run directory (parquet preferred)."""
    path = Path(path)
    if path.is_dir():
        if (path / PARQUET_NAME).exists():
            return load_parquet(path / PARQUET_NAME)
        if (path / JSONL_NAME).exists():
            return load_jsonl(path / JSONL_NAME)
        raise FileNotFoundError(f"no {JSONL_NAME} or {PARQUET_NAME} in {path}")
    if path.suffix == ".parquet":
        return load_parquet(path)
    return load_jsonl(path)


def _row(t: Trajectory) -> dict:
    return {
        "env_id": t.env_id,
        "task_id": t.task_id,
        "seed": t.seed,
        "group": t.group,
        "sample": t.sample,
        "num_turns": t.num_turns,
        "total_reward": t.total_reward,
        "outcome": t.outcome,
        "terminated": t.terminated,
        "truncated": t.truncated,
        "masked": t.masked,
        "mask_reason": t.mask_reason,
        "n_tokens": len(t.token_ids),
        "token_ids": t.token_ids,
        "loss_mask": t.loss_mask,
        "logprobs": t.logprobs,
        "json": t.model_dump_json(exclude=_TOKEN_FIELDS),
    }
