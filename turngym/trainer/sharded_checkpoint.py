"""Sharded checkpoints (``cluster.strategy: fsdp``) with ``torch.distributed.checkpoint`` (DCP): every
rank writes its own shards of the trainable weights and optimizer state, and a run resumes on any
number of ranks (DCP reshards on load; one process reads them as plain tensors).

    path = save_sharded(run_dir, step, model, optimizer, scheduler, dist, {"config_hash": h}, keep=2)
    state = load_sharded(path, model, optimizer, scheduler)      # every rank, any world size

Layout, the same convention as :mod:`turngym.trainer.checkpoint`:
``run_dir/checkpoints/step-000005/{dcp/ (DCP's shard files and .metadata), extra.pt, state.json}``.
All ranks write into ``.tmp-step-000005``; after a barrier rank 0 writes ``extra.pt`` (scheduler and
its RNG states) and ``state.json`` (last: step, ``"format": "dcp"``, the world size that wrote it),
renames the directory into place and removes all but the newest ``keep``. Every file of a finished
checkpoint is a plain file under its directory (:func:`checkpoint_files`); ``save_sharded(seal=...)``
runs on the finished directory before the rename, where an integrity manifest over them goes.

Weights and optimizer state go through ``get_state_dict``/``set_state_dict``
(``torch.distributed.checkpoint.state_dict``): keys are parameter names, frozen parameters (a LoRA
run's base model) are left out.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from turngym.trainer.distributed import DistContext

FORMAT = "dcp"


def _options(**kw: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=True, **kw)


def is_sharded(path: Path) -> bool:
    """True for a checkpoint directory written by :func:`save_sharded` (it holds the DCP shards; a
    ``step-N`` directory exists only once it was finished and renamed). Reads no file, so a damaged
    ``state.json`` is the manifest's to report."""
    return (Path(path) / "dcp").is_dir()


def latest_sharded(run_dir: Path) -> Path | None:
    """The newest finished sharded checkpoint of a run (``state.json`` is written last)."""
    root = Path(run_dir) / "checkpoints"
    found = sorted(p for p in root.glob("step-*") if is_sharded(p))
    return found[-1] if found else None


def checkpoint_files(path: Path) -> list[str]:
    """Every file of a checkpoint directory, relative to it, sorted (what a manifest covers)."""
    path = Path(path)
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


def save_sharded(
    run_dir: Path,
    step: int,
    model: Any,
    optimizer: Any,
    scheduler: Any,
    dist: DistContext,
    state: dict,
    keep: int,
    seal: Callable[[Path], None] | None = None,
) -> Path:
    """Write this step's checkpoint (every rank calls it); returns its final directory. ``seal``
    (rank 0) runs on the finished temporary directory just before the rename: where an integrity
    manifest over :func:`checkpoint_files` is written."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from turngym.trainer.checkpoint import rng_state

    root = Path(run_dir) / "checkpoints"
    final, tmp = root / f"step-{step:06d}", root / f".tmp-step-{step:06d}"
    if dist.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer, options=_options())
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp / "dcp"))
    dist.barrier()  # every rank's shards are on disk
    if dist.is_main:
        torch.save({"scheduler": scheduler.state_dict(), "rng": rng_state()}, tmp / "extra.pt")
        info = {"step": step, "format": FORMAT, "world_size": dist.world_size, **state}
        (tmp / "state.json").write_text(json.dumps(info, indent=1))
        if seal is not None:
            seal(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
        done = sorted(p for p in root.glob("step-*") if p.is_dir())
        for old in done[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return final


def _check_quantized_world(path: Path, optimizer: Any) -> None:
    """torchao's quantized optimizer state is stored in blocks; DCP reshards by rows, which need not
    fall on block boundaries: such a checkpoint resumes only on the world size that wrote it."""
    import torch.distributed as tdist

    from turngym.trainer.optimizers import is_quantized

    if not is_quantized(optimizer):
        return
    saved = json.loads((path / "state.json").read_text()).get("world_size")
    world = tdist.get_world_size() if tdist.is_available() and tdist.is_initialized() else 1
    if saved is not None and saved != world:
        raise ValueError(
            f"{path} was written by {saved} ranks with a quantized optimizer state (optim.optimizer="
            f"adamw_8bit/4bit) and this job has {world}: that state is stored in blocks that resharding "
            f"would cut (torchao refuses shards off its block boundaries); resume on {saved} ranks"
        )


def load_sharded(path: Path, model: Any, optimizer: Any, scheduler: Any) -> dict:
    """Load a sharded checkpoint into ``model`` (sharded or not) and ``optimizer``, resharding to
    this job's world size; every rank calls it. Returns its ``state.json``."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from turngym.trainer.checkpoint import set_rng_state

    path = Path(path)
    if not is_sharded(path):
        raise ValueError(f"{path} is not a sharded (DCP) checkpoint: no state.json with format {FORMAT!r}")
    _check_quantized_world(path, optimizer)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=_options())
    want = set(model_sd)
    have = {
        k.split(".", 1)[1]
        for k in dcp.FileSystemReader(str(path / "dcp")).read_metadata().state_dict_metadata
        if k.startswith("model.")
    }
    if want - have:
        raise ValueError(
            f"checkpoint {path} lacks weights this model trains: {sorted(want - have)[:5]} "
            "(another model, or LoRA settings that differ)"
        )
    if have - want:
        raise ValueError(f"checkpoint {path} has weights the model lacks: {sorted(have - want)[:5]}")
    box = {"model": model_sd, "optim": optim_sd}
    dcp.load(box, checkpoint_id=str(path / "dcp"))
    set_state_dict(
        model,
        optimizer,
        model_state_dict=box["model"],
        optim_state_dict=box["optim"],
        options=_options(strict=False),
    )
    extra = torch.load(path / "extra.pt", map_location="cpu", weights_only=True)
    scheduler.load_state_dict(extra["scheduler"])
    set_rng_state(extra["rng"])
    return json.loads((path / "state.json").read_text())
