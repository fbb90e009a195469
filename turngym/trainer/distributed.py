"""Data-parallel learning with ``torch.distributed``: one process per GPU (or CPU, gloo); DDP here,
FSDP2 sharding in :mod:`turngym.trainer.fsdp` (``cluster.strategy``).

Launch with torchrun (or ``turngym train --nproc N``, which runs torchrun for you):

    torchrun --standalone --nproc-per-node 2 -m turngym.trainer.torchrun_entry config.yaml key=value ...

(The entry point lives in ``turngym.trainer.torchrun_entry``, above the loop that imports this
module; ``-m turngym.trainer.distributed`` still runs it.)

How a step is split (see ``Trainer.train_step`` / ``Trainer.update``):

* every rank rolls out its share of the step's tasks (``shard``: task ``k`` goes to rank
  ``k % world``), so groups of one task never straddle ranks and group-relative credit is exact;
* the loss denominators (tokens, sequences) are summed over all ranks first, so each rank's loss
  is exactly its share of the global-batch loss; gradients are all-reduced once per optimizer step
  (DDP ``no_sync`` on all micro-batches but the last) and DDP's averaging is undone
  (``loss_scale = world``), so the update equals one process's on the whole batch;
* a rank with nothing to train on still joins the all-reduce with a zero-weight backward;
* rank 0 alone logs, saves checkpoints, runs the SFT warm start and pushes weights to the
  inference servers; the others wait at a barrier and load what it wrote;
* at setup the ranks compare their config hashes (:func:`check_same_config`), and every collective
  fails after ``cluster.timeout_s`` rather than waiting forever for a dead rank.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class DistContext:
    """Where this process stands in the job (world 1 when not launched distributed)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def loss_scale(self) -> float:
        """Multiplies a rank's share of the global loss before backward: DDP averages gradients."""
        return float(self.world_size)

    def device(self, requested: str | None) -> str | None:
        """This rank's device: its own GPU under NCCL, else what the config asks."""
        if self.backend == "nccl":
            return f"cuda:{self.local_rank}"
        return requested

    def barrier(self) -> None:
        if self.enabled:
            import torch.distributed as dist

            dist.barrier()

    def all_sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum over ranks (float64)."""
        if not self.enabled:
            return [float(v) for v in values]
        import torch
        import torch.distributed as dist

        t = torch.tensor(list(values), dtype=torch.float64, device=self._comm_device())
        dist.all_reduce(t)
        return t.tolist()

    def all_gather(self, obj: T) -> list[T]:
        if not self.enabled:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: T) -> T:
        """Rank 0's ``obj`` on every rank."""
        if not self.enabled:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def _comm_device(self) -> str:
        return f"cuda:{self.local_rank}" if self.backend == "nccl" else "cpu"


def init_distributed(backend: str = "auto", timeout_s: float | None = None) -> DistContext:
    """Join the process group described by torchrun's environment (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``MASTER_ADDR``/``PORT``); a single process without them. ``auto`` picks NCCL when
    CUDA is available, else gloo. ``timeout_s``: how long a collective waits for the other ranks
    before it fails (a dead or stuck rank stops the run rather than hanging it)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext()
    import torch
    import torch.distributed as dist

    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        import datetime

        timeout = datetime.timedelta(seconds=timeout_s) if timeout_s else None
        dist.init_process_group(backend=backend, timeout=timeout)
    return DistContext(rank=rank, world_size=world, local_rank=local_rank, backend=backend)


class ConfigMismatchError(RuntimeError):
    """The ranks of one job were started with different configs."""


def check_same_config(ctx: DistContext, digest: str) -> None:
    """Every rank's config hash must equal rank 0's: ranks started with different configs (another
    file, another override) would train different things under one gradient; they refuse to start."""
    hashes = ctx.all_gather(digest)
    odd = [r for r, h in enumerate(hashes) if h != hashes[0]]
    if odd:
        raise ConfigMismatchError(
            f"ranks {odd} were started with a different config than rank 0 (config hashes by rank: "
            f"{hashes}); start every rank with the same config file and overrides"
        )


def shard(items: Sequence[T], ctx: DistContext) -> list[T]:
    """This rank's items: item ``k`` goes to rank ``k % world`` (balanced within one)."""
    return list(items[ctx.rank :: ctx.world_size])


def wrap_ddp(model: Any, ctx: DistContext) -> Any:
    """``DistributedDataParallel`` around ``model`` (the model itself when not distributed)."""
    if not ctx.enabled:
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [ctx.local_rank] if ctx.backend == "nccl" else None
    return DistributedDataParallel(model, device_ids=ids)


def sync_context(ddp_model: Any, last: bool) -> contextlib.AbstractContextManager:
    """No gradient all-reduce on micro-batches before the last one of an optimizer step."""
    if last or not hasattr(ddp_model, "no_sync"):
        return contextlib.nullcontext()
    return ddp_model.no_sync()


def zero_backward(ddp_model: Any, device: Any) -> None:
    """A zero-weight forward and backward: a rank without sequences still joins the all-reduce."""
    import torch

    ids = torch.zeros((1, 2), dtype=torch.long, device=device)
    logits = ddp_model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    (logits.float().sum() * 0.0).backward()


class NullLogger:
    """The metric logger of ranks other than 0."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def close(self) -> None:
        pass


def merge_metrics(
    ctx: DistContext, metrics: dict[str, float], summed: Sequence[str] = (), maxed: Sequence[str] = ()
) -> dict[str, float]:
    """Metrics of every rank in one dict: keys starting with a prefix in ``summed`` are summed, those
    with a prefix in ``maxed`` take the largest rank's value, the rest are averaged over the ranks that
    report them (ranks may report different keys)."""
    if not ctx.enabled:
        return dict(metrics)
    merged: dict[str, list[float]] = {}
    for part in ctx.all_gather(metrics):
        for k, v in part.items():
            merged.setdefault(k, []).append(float(v))

    def merge(k: str, v: list[float]) -> float:
        if any(k.startswith(p) for p in summed):
            return sum(v)
        return max(v) if any(k.startswith(p) for p in maxed) else sum(v) / len(v)

    return {k: merge(k, v) for k, v in merged.items()}


@contextlib.contextmanager
def main_first(ctx: DistContext) -> Iterator[bool]:
    """Rank 0 runs the body (yielding True), the others wait for it (yielding False) and then run."""
    if ctx.is_main:
        yield True
        ctx.barrier()
    else:
        ctx.barrier()
        yield False


def __getattr__(name: str) -> Any:
    if name == "main":  # moved, so that this module imports nothing that imports it back
        raise AttributeError(
            "turngym.trainer.distributed.main moved to turngym.trainer.torchrun_entry.main "
            "(torchrun ... -m turngym.trainer.torchrun_entry)"
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":  # the launch path of earlier releases: run the entry point module
    import runpy

    runpy.run_module("turngym.trainer.torchrun_entry", run_name="__main__", alter_sys=True)
