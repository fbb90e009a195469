"""The run-state role of the trainer: what a run leaves on disk and picks up again — the step counter,
resume from the newest checkpoint, the SFT warm start (run once, loaded by the other ranks), keep-best
and final exports, checkpoints and the per-step trajectory files.

Rank 0 writes; the other ranks wait at a barrier and read what it wrote
(:func:`turngym.trainer.distributed.main_first`). Under ``cluster.strategy: fsdp`` checkpoints are
sharded (:mod:`turngym.trainer.sharded_checkpoint`, every rank writes its shards and any world size
resumes them); the warm start and the exports use the policy's full-weight copy.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from turngym.core.types import Trajectory
from turngym.trainer.config import TrainConfig

if TYPE_CHECKING:
    from turngym.trainer.policy import Policy


def config_hash(cfg: TrainConfig) -> str:
    """A short hash of the whole config, kept in each checkpoint's state."""
    return hashlib.sha1(cfg.model_dump_json().encode()).hexdigest()[:12]


class RunState:
    """The run directory of one training run and the step it has reached."""

    def __init__(self, cfg: TrainConfig, policy: Policy, logger: Any):
        self.cfg, self.policy, self.dist, self.logger = cfg, policy, policy.dist, logger
        self.run_dir = Path(cfg.run_dir)
        self.step = 0

    def resume(self) -> bool:
        """Load the newest checkpoint (weights, optimizer, schedule, RNG, step) when ``cfg.resume``;
        without one, a finished warm start's weights. True when a checkpoint was loaded."""
        from turngym.trainer.checkpoint import latest_checkpoint, load_checkpoint
        from turngym.trainer.sharded_checkpoint import is_sharded, latest_sharded, load_sharded

        if not self.cfg.resume:
            return False
        sharded = self.cfg.cluster.strategy == "fsdp"
        ckpt = latest_sharded(self.run_dir) if sharded else latest_checkpoint(self.run_dir)
        p = self.policy
        if ckpt is None and sharded and latest_checkpoint(self.run_dir) is not None:
            raise ValueError(
                f"{latest_checkpoint(self.run_dir)} is a full (strategy ddp) checkpoint; strategy fsdp "
                "resumes sharded ones only: resume it with cluster.strategy=ddp, or use a new run_dir"
            )
        if ckpt is None:
            self._load_warm_start()  # the warm start finished before any RL checkpoint
            return False
        if is_sharded(ckpt):  # any strategy reads a sharded checkpoint, on any world size
            state = load_sharded(ckpt, p.model, p.optimizer, p.scheduler)
        else:
            state = load_checkpoint(ckpt, p.model, p.optimizer, p.scheduler)
        self.step = int(state["step"])
        if self.dist.is_main:  # rows of steps after the checkpoint are redone: no duplicates, no gaps
            self.logger.rewind(self.step)
        if self.step:
            p.sync_weights(self.step)
        return True

    def warm_start(self, first: bool) -> dict[str, float]:
        """The SFT warm start (``cfg.sft``) on rank 0 (``first``), unless one already finished; the
        other ranks load the weights it wrote. Returns its ``sft/...`` metrics (rank 0)."""
        if not first:
            self._load_warm_start()
            return {}
        import torch

        from turngym.trainer.checkpoint import trainable_state
        from turngym.trainer.sft import sft_from_config

        marker = self.run_dir / "sft_done.json"
        if self.cfg.sft.steps <= 0 or marker.exists():
            return {}
        model = self.policy.full_model  # under FSDP the full copy, loaded into the shards after
        info = sft_from_config(self.cfg, model, self.policy.tokenizer)
        torch.save(trainable_state(model), self.run_dir / "sft_weights.pt")
        marker.write_text(json.dumps(info))
        if self.policy.sharded:
            self._load_warm_start()
        return info

    def _load_warm_start(self) -> None:
        import torch

        sft = self.run_dir / "sft_weights.pt"
        if sft.exists():
            self.policy.load_trainable(torch.load(sft, map_location="cpu", weights_only=True))

    def keep_best(self, step: int, scores: dict[str, float]) -> None:
        """``keep_best``: export the policy to ``run_dir/best`` when this eval beats every earlier one
        (strictly; ``best/best.json`` holds the record, so a resumed run goes on from it)."""
        best = self.cfg.keep_best
        if best is None or not scores:
            return
        if best.metric not in scores:
            known = ", ".join(sorted(k for k in scores if not k.startswith("eval/by_")))
            raise ValueError(
                f"keep_best.metric {best.metric!r} is not an eval metric of this run; it has: {known}"
            )
        value = float(scores[best.metric])
        record = self.run_dir / "best" / "best.json"
        if math.isnan(value):
            return
        if record.exists():
            held = json.loads(record.read_text())["value"]
            if not (value > held if best.mode == "max" else value < held):
                return
        if self.dist.is_main:
            from turngym.trainer.checkpoint import export_policy

            info = {"step": step, "metric": best.metric, "mode": best.mode, "value": value}
            masked = scores.get("eval/reward/masked_frac")
            if masked is not None:
                info["masked_frac"] = masked
            export_policy(self.policy.full_model, self.policy.tokenizer, self.run_dir / "best", info)
        self.dist.barrier()

    def checkpoint(self) -> None:
        """A checkpoint of the current step, from every rank: sharded ones are written by all ranks,
        full ones by rank 0 while the others wait."""
        from turngym.trainer.distributed import main_first

        if self.cfg.cluster.strategy == "fsdp":
            self.save()
            return
        with main_first(self.dist) as first:
            if first:
                self.save()

    def save(self) -> Path:
        """A checkpoint of the current step (rank 0; see :mod:`turngym.trainer.checkpoint`), or under
        strategy fsdp a sharded one (every rank; :mod:`turngym.trainer.sharded_checkpoint`)."""
        from turngym.trainer.checkpoint import save_checkpoint

        p = self.policy
        if self.cfg.cluster.strategy == "fsdp":
            from turngym.trainer.sharded_checkpoint import save_sharded

            state = {"config_hash": config_hash(self.cfg)}
            keep = self.cfg.keep_checkpoints
            return save_sharded(
                self.run_dir, self.step, p.model, p.optimizer, p.scheduler, self.dist, state, keep
            )
        return save_checkpoint(
            self.run_dir,
            self.step,
            p.model,
            p.optimizer,
            p.scheduler,
            {"config_hash": config_hash(self.cfg)},
            self.cfg.keep_checkpoints,
        )

    def export_final(self) -> None:
        """The finished policy in Hugging Face format under ``run_dir/final`` (rank 0)."""
        if self.dist.is_main:
            from turngym.trainer.checkpoint import export_policy

            export_policy(self.policy.full_model, self.policy.tokenizer, self.run_dir / "final")

    def save_trajectories(self, step: int, trajs: list[Trajectory]) -> Path:
        """``run_dir/trajectories/step-NNNNNN[.rank-R].jsonl`` (``log.save_trajectories``)."""
        from turngym.rollout.store import save_jsonl

        rank = f".rank-{self.dist.rank}" if self.dist.enabled else ""
        out = self.run_dir / "trajectories" / f"step-{step:06d}{rank}.jsonl"
        out.parent.mkdir(parents=True, exist_ok=True)
        return save_jsonl(trajs, out)
