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
import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from turngym.core.types import Trajectory
from turngym.trainer.config import TrainConfig

log = logging.getLogger("turngym.trainer")

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
        self.pending: Any = None  # checkpoint_async: the sharded checkpoint still being written

    def resume(self) -> bool:
        """Continue from the newest intact checkpoint when ``cfg.resume``: a full one through
        :func:`~turngym.trainer.checkpoint.restore_run` (weights, optimizer, schedule, RNG, step;
        without one, a finished warm start's weights), a sharded one (strategy fsdp, or the newest
        being sharded) through :meth:`_restore_sharded`. Either way the metrics rows the run will log
        again are dropped. True when a checkpoint was loaded."""
        from turngym.trainer.checkpoint import checkpoint_dirs, restore_run
        from turngym.trainer.distributed import main_first
        from turngym.trainer.sharded_checkpoint import is_sharded

        if not self.cfg.resume:
            return False
        p = self.policy
        dirs = checkpoint_dirs(self.run_dir)
        if self.cfg.cluster.strategy == "fsdp" or (dirs and is_sharded(dirs[-1])):
            state = self._restore_sharded()
        else:
            with main_first(self.dist) as first:  # rank 0 sets damaged checkpoints aside; the others follow
                state = restore_run(self.run_dir, p.model, p.optimizer, p.scheduler, first)
        self.step = int(state["step"]) if state is not None else 0
        if self.dist.is_main:  # rows of steps after the resumed one are redone: no duplicates, no gaps
            self.logger.rewind(self.step)
        if self.step:
            p.sync_weights(self.step)
        return state is not None

    def warm_start(self, first: bool) -> dict[str, float]:
        """The SFT warm start (``cfg.sft``) on rank 0 (``first``), unless one already finished; the
        other ranks load the weights it wrote. Returns its ``sft/...`` metrics (rank 0)."""
        if not first:
            self._load_warm_start()
            return {}
        from turngym.trainer.checkpoint import WARM_START, save_weights, trainable_state
        from turngym.trainer.sft import sft_from_config

        marker = self.run_dir / "sft_done.json"
        if self.cfg.sft.steps <= 0 or marker.exists():
            return {}
        model = self.policy.full_model  # under FSDP the full copy, loaded into the shards after
        info = sft_from_config(self.cfg, model, self.policy.tokenizer)
        save_weights(self.run_dir / WARM_START, trainable_state(model))
        marker.write_text(json.dumps(info))
        if self.policy.sharded:
            self._load_warm_start()
        return info

    def _restore_sharded(self) -> dict | None:
        """The newest sharded checkpoint whose manifest verifies, resharded to this job's world size
        (every rank loads); damaged ones are passed over with a warning naming the file and the check.
        None (after loading a finished warm start) when there is none; a run with only full (DDP)
        checkpoints is refused with what to do."""
        from turngym.trainer.checkpoint import CheckpointError, checkpoint_dirs, latest_checkpoint
        from turngym.trainer.manifest import verify_manifest
        from turngym.trainer.sharded_checkpoint import is_sharded, load_sharded

        p, damaged = self.policy, []
        for path in reversed([d for d in checkpoint_dirs(self.run_dir) if is_sharded(d)]):
            damage = verify_manifest(path, int(path.name.split("-")[-1]))
            if damage is not None:
                damaged.append(f"{path}: {damage}")
                log.warning("checkpoint damaged: %s: %s; trying an older one", path, damage)
                continue
            return load_sharded(path, p.model, p.optimizer, p.scheduler)
        if damaged:
            raise CheckpointError("no intact sharded checkpoint to resume from:\n  " + "\n  ".join(damaged))
        full = latest_checkpoint(self.run_dir)
        if full is not None:
            raise ValueError(
                f"{full} is a full (strategy ddp) checkpoint; strategy fsdp resumes sharded ones only: "
                "resume it with cluster.strategy=ddp, or use a new run_dir"
            )
        self._load_warm_start()  # the warm start finished before any RL checkpoint
        return None

    def _load_warm_start(self) -> None:
        from turngym.trainer.checkpoint import WARM_START, load_weights

        sft = self.run_dir / WARM_START
        if sft.exists():
            self.policy.load_trainable(load_weights(sft))

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
        strategy fsdp a sharded one (every rank; :mod:`turngym.trainer.sharded_checkpoint`); with
        ``checkpoint_async`` its writes go on in the background until :meth:`wait_checkpoint`."""
        from turngym.trainer.checkpoint import save_checkpoint

        p = self.policy
        if self.cfg.cluster.strategy == "fsdp":
            from turngym.trainer.sharded_checkpoint import PendingCheckpoint, save_sharded

            self.wait_checkpoint()  # one background write at a time, finished in order
            state = {"config_hash": config_hash(self.cfg)}
            keep = self.cfg.keep_checkpoints
            saved = save_sharded(
                self.run_dir,
                self.step,
                p.model,
                p.optimizer,
                p.scheduler,
                self.dist,
                state,
                keep,
                _seal(self.step),
                background=self.cfg.checkpoint_async,
                timeout_s=self.cfg.cluster.timeout_s,
            )
            if isinstance(saved, PendingCheckpoint):
                self.pending = saved
                return saved.path
            return saved
        return save_checkpoint(
            self.run_dir,
            self.step,
            p.model,
            p.optimizer,
            p.scheduler,
            {"config_hash": config_hash(self.cfg)},
            self.cfg.keep_checkpoints,
        )

    def wait_checkpoint(self) -> Path | None:
        """``checkpoint_async``: wait for the checkpoint being written and finish it (every rank);
        its directory, or None when none is pending."""
        pending, self.pending = self.pending, None
        return pending.wait() if pending is not None else None

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


def _seal(step: int):
    """What seals a sharded checkpoint before its rename: every file fsynced, then the integrity
    manifest over all of them (:mod:`turngym.trainer.manifest`), written last."""

    def seal(tmp: Path) -> None:
        from turngym.trainer.manifest import fsync_tree, write_manifest

        fsync_tree(tmp)
        write_manifest(tmp, step, {"layout": "dcp"})

    return seal
