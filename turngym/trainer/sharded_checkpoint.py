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

``save_sharded(background=True)`` (``checkpoint_async``) writes through DCP's ``async_save``: the
shards are staged to host memory before it returns, the files are written by a background thread
over a gloo group of its own (so it never races the training's collectives), and the call returns a
:class:`PendingCheckpoint`; its ``wait()`` (every rank, before the next save and at the end of the
run) finishes the checkpoint as above. Until then it is a ``.tmp-`` directory, which resume ignores.

Weights and optimizer state go through ``get_state_dict``/``set_state_dict``
(``torch.distributed.checkpoint.state_dict``): keys are parameter names, frozen parameters (a LoRA
run's base model) are left out.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from collections.abc import Callable
from functools import partial
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


class PendingCheckpoint:
    """A sharded checkpoint whose shards are being written in the background (``save_sharded`` with
    ``background=True``): ``wait()`` (every rank) waits for this rank's writes, then finishes it
    (barriers, ``extra.pt``, ``state.json``, the seal, the rename, retention); its final directory."""

    def __init__(self, path: Path, future: Any, finish: Callable[[], Path]):
        self.path, self._future, self._finish = path, future, finish

    def wait(self) -> Path:
        self._future.result()  # re-raises a failed write
        return self._finish()


_ASYNC_GROUP: list[Any] = []  # the gloo group background writes use, made at the first one


def _async_group(dist: DistContext, timeout_s: float | None) -> Any:
    """A gloo process group of all ranks for DCP's background writes (None in one process): a CPU
    backend, which ``async_save`` needs under NCCL, and none of the training's collectives."""
    if not dist.enabled:
        return None
    if not _ASYNC_GROUP:
        from datetime import timedelta

        import torch.distributed as tdist

        kwargs = {"timeout": timedelta(seconds=timeout_s)} if timeout_s else {}
        _ASYNC_GROUP.append(tdist.new_group(backend="gloo", **kwargs))
    return _ASYNC_GROUP[0]


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
    background: bool = False,
    timeout_s: float | None = None,
) -> Path | PendingCheckpoint:
    """Write this step's checkpoint (every rank calls it); returns its final directory, or with
    ``background`` a :class:`PendingCheckpoint` to ``wait()`` on (``timeout_s``: how long the
    background writes' collectives wait for the other ranks). ``seal`` (rank 0) runs on the
    finished temporary directory just before the rename: where an integrity manifest over
    :func:`checkpoint_files` is written."""
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
    # the schedule and RNG of this step, not of the step the background write ends in
    extra = {"scheduler": copy.deepcopy(scheduler.state_dict()), "rng": rng_state()}
    finish = partial(_finish, root, final, tmp, step, dist, extra, state, keep, seal)
    box, where = {"model": model_sd, "optim": optim_sd}, str(tmp / "dcp")
    if not background:
        dcp.save(box, checkpoint_id=where)
        return finish()
    saving = dcp.async_save(box, checkpoint_id=where, process_group=_async_group(dist, timeout_s))
    # a Future; an AsyncSaveResponse where staging itself is asynchronous (not the default stager's)
    return PendingCheckpoint(final, getattr(saving, "upload_completion", saving), finish)


def _finish(
    root: Path,
    final: Path,
    tmp: Path,
    step: int,
    dist: DistContext,
    extra: dict,
    state: dict,
    keep: int,
    seal: Callable[[Path], None] | None,
) -> Path:
    """After every rank's shards are written: rank 0 adds ``extra.pt`` and ``state.json`` (last),
    seals, renames into place and keeps the newest ``keep``."""
    import torch

    dist.barrier()  # every rank's shards are on disk
    if dist.is_main:
        torch.save(extra, tmp / "extra.pt")
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
