"""Sharded checkpoints across world sizes: save after updates with one world size, load with another.

    torchrun --standalone --nproc-per-node 2 tests/scale/dcp_step.py save RUN OUT [overrides]
    python tests/scale/dcp_step.py load RUN OUT [overrides]

``save``: ``steps`` updates on the fixed batch of ``ddp_step.global_batch`` (sharded over the ranks),
a sharded checkpoint after each (``RunState.checkpoint``, keeping ``keep_checkpoints``; with
``checkpoint_async=true`` each is written while the next update runs, the last waited for). ``load``:
``RunState.resume`` from the newest. Both write ``OUT/state.pt`` from rank 0: the full trainable
weights, Adam's moments per parameter name, the step, the learning rate and the checkpoint names.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from ddp_step import _full, global_batch

from turngym.trainer.config import load_config
from turngym.trainer.distributed import shard
from turngym.trainer.loop import Trainer
from turngym.trainer.update import policy_update


def full_state(trainer: Trainer) -> dict:
    """Every trainable parameter, its Adam moments (full tensors; a collective under FSDP)."""
    p = trainer.policy
    weights, moments = {}, {}
    for name, param in p.model.named_parameters():
        if not param.requires_grad:
            continue
        weights[name] = _full(param).detach().float().cpu()
        st = p.optimizer.state.get(param, {})
        moments[name] = [_full(st[k]).detach().float().cpu() for k in ("exp_avg", "exp_avg_sq") if k in st]
    return {"weights": weights, "moments": moments}


def main() -> None:
    mode, run, out, overrides = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:]
    cfg = load_config(
        None,
        [
            f"run_dir={run}",
            "model.path=tiny",
            "model.dtype=float32",
            "optim.micro_batch_tokens=96",
            "optim.lr=1e-3",
            "log.tensorboard=false",
            "keep_checkpoints=2",
            *overrides,
        ],
    )
    trainer = Trainer(cfg)
    trainer.setup()
    ctx, run_state = trainer.dist, trainer.run
    pending = []  # checkpoint_async: whether each save went on in the background
    if mode == "save":
        trajs, advs = global_batch(trainer.policy.model)
        for _ in range(cfg.steps):
            policy_update(trainer.policy, cfg, shard(trajs, ctx), shard(advs, ctx))
            run_state.step += 1
            run_state.checkpoint()
            pending.append(run_state.pending is not None)
        run_state.wait_checkpoint()  # what Trainer.train does at the end of a run
    else:
        assert run_state.resume(), "no checkpoint was resumed"
    state = full_state(trainer)
    state["step"] = run_state.step
    state["lr"] = trainer.policy.scheduler.get_last_lr()[0]
    state["world"] = ctx.world_size
    state["sharded"] = trainer.policy.sharded
    state["pending"] = pending
    state["checkpoints"] = sorted(p.name for p in (run / "checkpoints").iterdir())
    if ctx.is_main:
        out.mkdir(parents=True, exist_ok=True)
        torch.save(state, out / "state.pt")
    if ctx.enabled:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
