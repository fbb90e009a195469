"""Metric sinks: JSONL (always), TensorBoard (tensorboardX or torch's writer, when installed), W&B (when asked).

``metrics.jsonl`` holds one JSON object per line, each with its ``step``; every line is fsynced as it
is written. :func:`read_metric_rows` is its one reader: a torn line (a process killed mid-write, a
full disk) is skipped with a warning naming the file and the line, never an error.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

from turngym.trainer.manifest import atomic_write

log = logging.getLogger("turngym.trainer")

#: Keys of the warm start's row (step 0): a finished warm start is not redone by a run that starts over.
WARM_START_PREFIXES = ("sft/", "eval_before_sft/")


class MetricLogger:
    def __init__(
        self,
        run_dir: Path,
        tensorboard: bool = True,
        wandb: bool = False,
        project: str = "turngym",
        config: dict | None = None,
    ):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _end_torn_line(self.path)
        self._tb = _tensorboard(Path(run_dir) / "tb") if tensorboard else None
        self._wandb = None
        if wandb:
            try:
                import wandb as wb
            except ImportError as e:
                raise RuntimeError("log.wandb=true but wandb is not installed (pip install wandb)") from e
            self._wandb = wb.init(project=project, dir=str(run_dir), config=config or {})

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        clean = {
            k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(float(v))
        }
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **clean}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if self._tb is not None:
            for k, v in clean.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(clean, step=step)

    def rewind(self, step: int) -> int:
        """Forget the JSONL rows a run resumed at ``step`` logs again; returns how many were dropped.

        Every row after ``step``; and when the run starts over (``step`` 0: no checkpoint, e.g.
        ``checkpoint_every: 0`` killed mid-run) also the start policy's step-0 eval, which it redoes —
        the warm start's row (:data:`WARM_START_PREFIXES`) stays, as a finished warm start is not
        redone. A step is logged before the checkpoint that commits it, so without this a run killed
        in between would log that step twice. Torn lines are dropped too (with a warning). The file is
        replaced atomically.
        """
        if not self.path.exists():
            return 0
        rows, torn = _read_rows(self.path)
        keep = [r for r in rows if _kept(r, step)]
        if len(keep) != len(rows) or torn:
            atomic_write(self.path, "".join(json.dumps(r) + "\n" for r in keep).encode())
        return len(rows) - len(keep) + torn

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def _tensorboard(log_dir: Path):
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            return None
    return SummaryWriter(str(log_dir))


def read_metrics(run_dir: str | Path) -> list[dict[str, float]]:
    """The rows of ``run_dir/metrics.jsonl`` ([] without one); see :func:`read_metric_rows`."""
    return read_metric_rows(Path(run_dir) / "metrics.jsonl")


def read_metric_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a metrics JSONL file ([] when absent); a line that is not a JSON object with a
    numeric ``step`` is skipped with a warning that names the file and the line number."""
    path = Path(path)
    return _read_rows(path)[0] if path.exists() else []


def _read_rows(path: Path) -> tuple[list[dict[str, Any]], int]:
    rows, torn = [], 0
    with path.open("rb") as f:
        for n, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                row, why = None, f"not JSON ({e})"
            else:
                why = "not a JSON object with a numeric step"
            if not isinstance(row, dict) or not _numeric(row.get("step")):
                torn += 1
                log.warning("%s line %d skipped: %s (a torn write?)", path, n, why)
                continue
            rows.append(row)
    return rows, torn


def _numeric(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _kept(row: dict[str, Any], step: int) -> bool:
    if step > 0 or row["step"] > 0:
        return row["step"] <= step
    return all(k == "step" or k.startswith(WARM_START_PREFIXES) for k in row)


def _end_torn_line(path: Path) -> None:
    """A file whose last line was cut off gets its newline, so the next row starts a line of its own."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb+") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) != b"\n":
            f.write(b"\n")
