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
