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
#: the parquet columns copied from the trajectory's field of the same name -> their arrow type (the name
#: of a ``pyarrow`` type factory: this module imports pyarrow only to write or read parquet); the token
#: fields are list columns of their type
_FLAT_COLUMNS = {
    "env_id": "string", "task_id": "string", "seed": "int64", "group": "string", "sample": "int32",
    "num_turns": "int32", "total_reward": "float64", "outcome": "float64", "terminated": "bool_",
    "truncated": "bool_", "masked": "bool_", "mask_reason": "string",
}  # fmt: skip
_TOKEN_COLUMNS = {"token_ids": "int32", "loss_mask": "int8", "logprobs": "float64"}
_TOKEN_FIELDS = set(_TOKEN_COLUMNS)


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
        [(name, getattr(pa, kind)()) for name, kind in _FLAT_COLUMNS.items()]
        + [("n_tokens", pa.int32())]
        + [(name, pa.list_(getattr(pa, kind)())) for name, kind in _TOKEN_COLUMNS.items()]
        + [("json", pa.string())]
    )
    table = pa.Table.from_pylist(rows, schema=schema)
    path = Path(path)
    pq.write_table(table, path)
    return path


def load_parquet(path: str | Path) -> list[Trajectory]:
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=[*_TOKEN_COLUMNS, "json"])
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
        **{name: getattr(t, name) for name in _FLAT_COLUMNS},
        "n_tokens": len(t.token_ids),
        **{name: getattr(t, name) for name in _TOKEN_COLUMNS},
        "json": t.model_dump_json(exclude=_TOKEN_FIELDS),
    }
