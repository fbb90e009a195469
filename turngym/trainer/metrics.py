"""Metric sinks: JSONL (always), TensorBoard (tensorboardX or torch's writer, when installed), W&B (when asked)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


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
        if self._tb is not None:
            for k, v in clean.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(clean, step=step)

    def rewind(self, step: int) -> int:
        """Forget JSONL rows of steps after ``step`` (a resumed run recomputes them); returns how many.

        A step is logged before the checkpoint that commits it, so a run killed in between has rows
        for a step it will redo; without this the resumed run would log that step twice. The file is
        replaced atomically.
        """
        if not self.path.exists():
            return 0
        lines = [line for line in self.path.read_text().splitlines() if line.strip()]
        keep = [line for line in lines if json.loads(line).get("step", 0) <= step]
        if len(keep) != len(lines):
            tmp = self.path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(line + "\n" for line in keep))
            tmp.replace(self.path)
        return len(lines) - len(keep)

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
    path = Path(run_dir) / "metrics.jsonl"
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    )
