"""One ``Trainer.update`` on a fixed global batch of 8 sequences, under torchrun with 1 or N processes.

    python tests/scale/ddp_step.py OUT [overrides]                          # one process
    torchrun --standalone --nproc-per-node 2 tests/scale/ddp_step.py OUT    # two (gloo on CPU, NCCL on GPU)

Rank 0 writes ``OUT/world-N.json`` (loss, grad norm, backend, device, strategy) and ``OUT/world-N.pt``
(the clipped gradient vector, empty when the update freed it, the updated parameters and the rollouts' full copy of them after the
weight sync); each rank updates on its shard of the batch. ``cluster.strategy=fsdp`` shards the
model (FSDP2); ``optim.ppo_epochs=K`` makes K optimizer steps on the batch; ``--all-on-rank-0`` gives
the whole batch to rank 0 (the other ranks have nothing to train on but must join every collective).

    python tests/scale/ddp_step.py compare ONE_OUT TWO_OUT    # prints the differences as JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from turngym.core.types import Trajectory
from turngym.trainer.config import load_config
from turngym.trainer.distributed import shard
from turngym.trainer.loop import Trainer
from turngym.trainer.update import policy_update


def _full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a (possibly FSDP-sharded DTensor) parameter or gradient (a collective)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def global_batch(model: torch.nn.Module, n: int = 8) -> tuple[list[Trajectory], list]:
    """Random sequences whose sampling logprobs are the model's own plus noise (ratios near 1, some clipped)."""
    from turngym.trainer.batching import token_logprobs

    g = torch.Generator().manual_seed(0)
    dev = next(model.parameters()).device
    trajs, advs = [], []
    for k in range(n):
        length = 10 + 7 * k
        ids = torch.randint(1, 200, (length,), generator=g).tolist()
        mask = [0] * 5 + [1] * (length - 5)
        with torch.no_grad():
            own, _ = token_logprobs(model, torch.tensor([ids], device=dev), torch.ones(1, length, device=dev))
        noise = 0.2 * torch.randn(length, generator=g)
        logprobs = [(float(x) + float(e)) * m for x, e, m in zip(own[0].cpu(), noise, mask, strict=True)]
        adv = (torch.randn(length, generator=g) * torch.tensor(mask, dtype=torch.float32)).numpy()
        trajs.append(
            Trajectory(env_id="x", seed=k, group=f"x/{k}", token_ids=ids, loss_mask=mask, logprobs=logprobs)
        )
        advs.append(adv)
    return trajs, advs


def compare(one_dir: Path, two_dir: Path) -> dict:
    one, two = (json.loads(next(d.glob("world-*.json")).read_text()) for d in (one_dir, two_dir))
    a, b = (torch.load(next(d.glob("world-*.pt"))) for d in (one_dir, two_dir))
    keys = ("update/loss", "update/pg_loss", "update/grad_norm", "update/ratio_mean", "update/tokens")
    out: dict = {k: {"one": one[k], "two": two[k], "abs_diff": abs(one[k] - two[k])} for k in keys}
    out["grads_max_abs_diff"] = float((a["grads"] - b["grads"]).abs().max())
    out["grads_max_abs"] = float(a["grads"].abs().max())
    out["weights_max_abs_diff"] = float((a["weights"] - b["weights"]).abs().max())
    out["runs"] = [{k: r[k] for k in ("world", "backend", "device", "card")} for r in (one, two)]
    return out


def main() -> None:
    if sys.argv[1] == "compare":
        print(json.dumps(compare(Path(sys.argv[2]), Path(sys.argv[3])), indent=1))
        return
    out, overrides = Path(sys.argv[1]), sys.argv[2:]
    skewed = "--all-on-rank-0" in overrides  # the other ranks get no sequence: zero-work ranks
    overrides = [o for o in overrides if o != "--all-on-rank-0"]
    cfg = load_config(
        None,
        [
            f"run_dir={out / 'run'}",  # one config on every rank (ranks compare config hashes)
            "model.path=tiny",
            "model.dtype=float32",
            "optim.micro_batch_tokens=96",  # several micro-batches: gradient accumulation across them
            "optim.lr=1e-3",
            "log.tensorboard=false",
            *overrides,
        ],
    )
    trainer = Trainer(cfg)
    trainer.setup()
    ctx = trainer.dist
    trajs, advs = global_batch(trainer.policy.model)
    updates = int(trainer.cfg.optim.ppo_epochs)
    if skewed:
        mine = trajs if ctx.is_main else []
        metrics = policy_update(trainer.policy, trainer.cfg, mine, advs if ctx.is_main else [])
    else:
        metrics = policy_update(trainer.policy, trainer.cfg, shard(trajs, ctx), shard(advs, ctx))
    params = [p for p in trainer.policy.model.parameters() if p.requires_grad]
    freed = any(p.grad is None for p in params)  # cluster.fsdp.release_full_copy frees them after the step
    grads = (
        torch.empty(0)
        if freed
        else torch.cat([_full(p.grad).detach().float().flatten().cpu() for p in params])
    )
    weights = torch.cat([_full(p).detach().float().flatten().cpu() for p in params])
    trainer.policy.sync_weights(updates)  # under FSDP: the rollouts' full copy gathered from the shards
    copy = dict(trainer.policy.full_model.named_parameters())
    names = [n for n, p in trainer.policy.model.named_parameters() if p.requires_grad]
    full_copy = torch.cat([copy[n].detach().float().flatten().cpu() for n in names])
    if ctx.is_main:
        out.mkdir(parents=True, exist_ok=True)
        device = str(next(trainer.policy.model.parameters()).device)
        name = torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu"
        info = {"world": ctx.world_size, "backend": ctx.backend, "device": device, "card": name, **metrics}
        info["strategy"] = trainer.cfg.cluster.strategy
        info["sharded"] = trainer.policy.sharded
        (out / f"world-{ctx.world_size}.json").write_text(json.dumps(info, indent=1))
        torch.save(
            {"grads": grads, "weights": weights, "full_copy": full_copy}, out / f"world-{ctx.world_size}.pt"
        )
    if ctx.enabled:
        # every rank done (rank 0 writes the files) before gloo's connections close: a rank that tore
        # its group down while the other still wrote aborted in C++ ("terminate called without an
        # active exception") once under a loaded machine
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
