"""What a run logs: the metric functions over a rollout's trajectories (rewards, breakdowns, sampled
evals, a backend's counters) and the sinks (JSONL always, TensorBoard when installed, W&B when asked).

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

import numpy as np

from turngym.core.types import Trajectory
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


def breakdown_metrics(trajs: list[Trajectory], key: str, prefix: str = "") -> dict[str, float]:
    """The headline metrics per value of ``reference[key]`` (e.g. per hop count), as
    ``{prefix}by_{key}/{value}/reward/outcome`` with the share of trajectories (``.../frac``); a
    trajectory without the key counts under ``none``."""
    groups: dict[str, list[Trajectory]] = {}
    for t in trajs:
        groups.setdefault(str(t.reference.get(key, "none")), []).append(t)
    out = {}
    for value, group in sorted(groups.items()):
        head = f"{prefix}by_{key}/{value}/"
        m = reward_metrics(group)
        out[head + "frac"] = len(group) / len(trajs)
        for name in ("reward/outcome", "reward/masked_frac", "episode/turns"):
            if name in m:
                out[head + name] = m[name]
    return out


def reward_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """Outcome and total reward logged separately, success, turns, invalid actions, masking.

    Every headline number is a mean over ALL trajectories, a masked one counting as a failure:
    outcome, total reward and each reward component 0, not terminated, no success; its recorded
    turns count in ``episode/turns`` and ``episode/invalid_action_frac``. A run whose rollouts crash
    must not report the score of its few survivors. The ``..._unmasked`` twins (``reward/outcome``,
    ``reward/total``, ``reward/terminated``, ``episode/turns``) are the means over unmasked
    trajectories only, and ``reward/masked_frac`` always travels beside them.

    ``reward/component/<name>``: each reward component the env reported, summed over a trajectory's
    turns and averaged over all trajectories (0 where a trajectory never got it or was masked), so
    a run shows which constraint or critic moves (travel's ``hard.*`` / ``cs.*`` checks, a stepwise
    ``tool_ok``), not only the outcome.
    """
    live = [t for t in trajs if not t.masked]
    if not trajs:
        return {}
    n = len(trajs)
    every_turn = [x for t in trajs for x in t.turns]
    out = {
        "reward/masked_frac": (n - len(live)) / n,
        "reward/outcome": float(sum(t.outcome for t in live)) / n,
        "reward/success": float(sum(t.terminated and t.outcome >= 1.0 for t in live)) / n,
        "reward/total": float(sum(t.total_reward for t in live)) / n,
        "reward/terminated": float(sum(t.terminated for t in live)) / n,
        "episode/turns": float(np.mean([t.num_turns for t in trajs])),
        "episode/invalid_action_frac": float(np.mean([x.invalid_action for x in every_turn]))
        if every_turn
        else 0.0,
    }
    if live:
        out.update(
            {
                "reward/outcome_unmasked": float(np.mean([t.outcome for t in live])),
                "reward/total_unmasked": float(np.mean([t.total_reward for t in live])),
                "reward/terminated_unmasked": float(np.mean([t.terminated for t in live])),
                "episode/turns_unmasked": float(np.mean([t.num_turns for t in live])),
            }
        )
    sums: dict[str, float] = {}
    for t in live:
        for turn in t.turns:
            for name, value in turn.reward_components.items():
                sums[name] = sums.get(name, 0.0) + float(value)
    out.update({f"reward/component/{k}": v / n for k, v in sorted(sums.items())})
    return out


def sampled_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """:func:`reward_metrics` over every sampled episode (masked ones count as failures), with
    ``episodes`` (how many) and ``pass_at_k`` (the share of tasks, by group, with at least one
    successful unmasked episode)."""
    if not trajs:
        return {}
    groups: dict[str, bool] = {}
    for t in trajs:
        won = not t.masked and t.terminated and t.outcome >= 1.0
        groups[t.group] = groups.get(t.group, False) or won
    return {
        **reward_metrics(trajs),
        "episodes": float(len(trajs)),
        "pass_at_k": sum(groups.values()) / len(groups),
    }


def backend_counters(backend: Any) -> dict[str, float]:
    """The rollout backend's numeric counters (the HF engines' ``stats``: passes, prompt and reused
    tokens, graph captures and their seconds, decode blocks, ...; a backend is made per rollout, so
    they count this rollout); {} for a backend without them or one that cannot answer."""
    try:
        stats = getattr(backend, "stats", None)
    except Exception:  # noqa: BLE001 - a worker that died: the rollout's own errors say why
        return {}
    if not isinstance(stats, dict):
        return {}
    return {k: float(v) for k, v in stats.items() if isinstance(v, int | float) and not isinstance(v, bool)}
