"""Checkpoints for exact resume: trainable weights, optimizer, scheduler, RNG states, data position.

Layout: ``run_dir/checkpoints/step-000005/{trainable.pt, optimizer.pt, state.json, manifest.json}``.
A checkpoint is written to ``.tmp-step-000005``, fsynced, sealed by its manifest (sha256 of every
file, the step, the format version: :mod:`turngym.trainer.manifest`) and renamed into place; only
then are checkpoints beyond the newest ``keep`` removed. A write that fails (a full disk) removes its
temporary directory and raises :class:`CheckpointWriteError`; the previous checkpoints stay as they were.

Resume (:func:`restore_run`) verifies the newest checkpoint against its manifest and falls back to
the newest intact one, warning what was wrong with each one it passed over (which file, which check)
and setting it aside as ``damaged-step-...`` (kept, never loaded again). Every ``.pt`` file is read
with ``torch.load(weights_only=True)``: tensors and plain containers only, no pickled code.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from turngym.trainer.manifest import (
    Damage,
    atomic_write,
    fsync_dir,
    fsync_tree,
    verify_manifest,
    write_manifest,
)

log = logging.getLogger("turngym.trainer")

WARM_START = "sft_weights.pt"


class CheckpointError(RuntimeError):
    """No checkpoint can be resumed from, or one could not be written."""


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written (the earlier ones are untouched)."""


class CheckpointDamaged(CheckpointError):
    """A checkpoint that fails verification or safe loading; ``damage`` says which file and check."""

    def __init__(self, damage: Damage):
        super().__init__(str(damage))
        self.damage = damage


# ------------------------------------------------------------------ state
def rng_state() -> dict[str, Any]:
    """Every RNG the loop draws from, as tensors and plain values (loadable with ``weights_only``)."""
    import torch

    name, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": [
            name,
            torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            int(pos),
            int(has_gauss),
            float(gauss),
        ],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import torch

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def trainable_state(model: Any) -> dict[str, Any]:
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items() if k in names}


def _torch_save(obj: Any, path: Path) -> None:
    import torch

    with open(path, "wb") as f:  # a file object: a failed write surfaces as the OSError behind it
        torch.save(obj, f)


def _torch_load(path: Path) -> Any:
    import torch

    from turngym.trainer.optimizers import state_tensor_classes

    # torchao's quantized optimizer state (optim.optimizer: adamw_8bit/4bit) is a tensor subclass
    with torch.serialization.safe_globals(state_tensor_classes()):
        return torch.load(path, map_location="cpu", weights_only=True)


def save_weights(path: Path, weights: dict[str, Any]) -> None:
    """A state dict saved whole or not at all (the warm start's weights)."""
    import torch

    atomic_write(path, lambda f: torch.save(weights, f))


def load_weights(path: Path) -> dict[str, Any]:
    return _torch_load(path)


# ------------------------------------------------------------------ write
def _step_of(path: Path) -> int | None:
    head, _, digits = path.name.partition("-")
    return int(digits) if head == "step" and digits.isdigit() else None


def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """The ``step-N`` directories of a run, oldest first (complete or not)."""
    root = Path(run_dir) / "checkpoints"
    found = [(s, p) for p in root.glob("step-*") if p.is_dir() and (s := _step_of(p)) is not None]
    return [p for _, p in sorted(found)]


def _why_write_failed(error: BaseException, where: Path) -> str:
    e: BaseException | None = error
    while e is not None:  # torch reports a failed write as a RuntimeError over the OSError
        if isinstance(e, OSError) and e.strerror:
            return f"{e.strerror} (errno {e.errno})"
        e = e.__cause__ or e.__context__
    try:
        st = os.statvfs(where)
        free = f"; {st.f_bavail * st.f_frsize} bytes free there"
    except OSError:
        free = ""
    return f"{type(error).__name__}: {error}{free}"


def save_checkpoint(
    run_dir: Path, step: int, model: Any, optimizer: Any, scheduler: Any, state: dict, keep: int
) -> Path:
    """Write step ``step``'s checkpoint, then keep only the newest ``keep`` (``keep <= 0``: all).

    Raises :class:`CheckpointWriteError` (its message says why and which checkpoint is still there)
    when a file cannot be written: the partial directory is removed and nothing else is touched."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        _torch_save(trainable_state(model), tmp / "trainable.pt")
        _torch_save(
            {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng_state()},
            tmp / "optimizer.pt",
        )
        (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=1))
        fsync_tree(tmp)
        write_manifest(tmp, step)
    except (OSError, RuntimeError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        kept = [p.name for p in checkpoint_dirs(run_dir)]
        raise CheckpointWriteError(
            f"could not write the checkpoint of step {step} in {root}: {_why_write_failed(e, root)}. "
            f"The partial checkpoint was removed; the earlier checkpoints are untouched "
            f"({', '.join(kept) if kept else 'there are none'}). Free space there and rerun the same "
            f"command to resume from the newest one."
        ) from e
    old = root / f".old-step-{step:06d}"
    if final.exists():  # the same step again (a resumed run redid it): the new one replaces it
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(tmp, final)
    fsync_dir(root)
    shutil.rmtree(old, ignore_errors=True)
    for stale in checkpoint_dirs(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(stale, ignore_errors=True)
    return final


def export_policy(model: Any, tokenizer: Any, dest: Path, info: dict | None = None) -> Path:
    """The policy in Hugging Face format (the full weights, or a LoRA adapter) with its tokenizer, in
    ``dest``, replaced whole: written beside it first, fsynced, then renamed, so a crash leaves the
    old export or the new one, never a mix. ``info`` goes to ``dest/<dest name>.json``."""
    dest = Path(dest)
    tmp = dest.parent / f".tmp-{dest.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if info is not None:
        (tmp / f"{dest.name}.json").write_text(json.dumps(info, indent=1))
    fsync_tree(tmp)
    old = dest.parent / f".old-{dest.name}"
    shutil.rmtree(old, ignore_errors=True)
    if dest.exists():
        os.rename(dest, old)
    os.rename(tmp, dest)
    fsync_dir(dest.parent)
    shutil.rmtree(old, ignore_errors=True)
    return dest


# ------------------------------------------------------------------- read
def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint directory (sealed by its manifest; its bytes are not checked)."""
    found = [p for p in checkpoint_dirs(run_dir) if (p / "manifest.json").is_file()]
    return found[-1] if found else None


def load_checkpoint(path: Path, model: Any, optimizer: Any, scheduler: Any, verify: bool = True) -> dict:
    """Load a checkpoint into ``model``/``optimizer``/``scheduler`` and the RNGs; returns its state.

    Verified against its manifest first (``verify``); raises :class:`CheckpointDamaged` naming the
    file and the check when anything is wrong, before anything is loaded. A checkpoint with weights
    the model lacks is a different model: ``ValueError``."""
    path = Path(path)
    if verify and (damage := verify_manifest(path, _step_of(path))) is not None:
        raise CheckpointDamaged(damage)
    loaded = {}
    for name in ("trainable.pt", "optimizer.pt"):
        try:
            loaded[name] = _torch_load(path / name)
        except Exception as e:  # noqa: BLE001 - unpicklable or refused by weights_only: say which file
            raise CheckpointDamaged(
                Damage(path, name, "torch.load(weights_only=True) failed", str(e)[:300])
            ) from e
    try:
        state = json.loads((path / "state.json").read_text())
        step = int(state["step"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointDamaged(Damage(path, "state.json", "no JSON object with a step", str(e))) from e
    if _step_of(path) is not None and step != _step_of(path):
        raise CheckpointDamaged(
            Damage(path, "state.json", "step mismatch", f"says {step}, directory {path.name}")
        )
    weights, rest = loaded["trainable.pt"], loaded["optimizer.pt"]
    missing = set(weights) - set(model.state_dict())
    if missing:
        raise ValueError(f"checkpoint {path} has weights the model lacks: {sorted(missing)[:5]}")
    model.load_state_dict(weights, strict=False)
    optimizer.load_state_dict(rest["optimizer"])
    scheduler.load_state_dict(rest["scheduler"])
    set_rng_state(rest["rng"])
    return state


def set_aside(path: Path) -> Path:
    """Rename a damaged checkpoint to ``damaged-step-N`` (kept for a look, never loaded or pruned)."""
    dest = path.with_name(f"damaged-{path.name}")
    n = 1
    while dest.exists():
        n += 1
        dest = path.with_name(f"damaged-{path.name}.{n}")
    os.rename(path, dest)
    fsync_dir(path.parent)
    return dest


def restore_run(
    run_dir: Path, model: Any, optimizer: Any, scheduler: Any, set_damaged_aside: bool = True
) -> dict | None:
    """Resume a run: load its newest intact checkpoint and return its state, or, with none, load the
    finished warm start's weights (if any) and return ``None`` (the run starts over at step 0).

    A checkpoint that fails verification or loading is passed over with a warning naming the file
    and the check, and (``set_damaged_aside``: the process that owns the directory) renamed
    ``damaged-step-N``. Checkpoints that exist but none intact: :class:`CheckpointError` listing
    each one's damage, rather than silently starting over."""
    damaged: list[CheckpointDamaged] = []
    for path in reversed(checkpoint_dirs(run_dir)):
        try:
            state = load_checkpoint(path, model, optimizer, scheduler)
        except CheckpointDamaged as e:
            damaged.append(e)
            continue
        for e in damaged:
            where = e.damage.path
            if set_damaged_aside:
                where = set_aside(e.damage.path)
            log.warning(
                "checkpoint damaged: %s; resuming from the older intact %s instead (the damaged one is "
                "kept as %s)",
                e,
                path,
                where,
            )
        return state
    if damaged:
        lines = "\n".join(f"  {e}" for e in damaged)
        raise CheckpointError(
            f"no intact checkpoint to resume from in {Path(run_dir) / 'checkpoints'}:\n{lines}\n"
            f"Move them out of {Path(run_dir) / 'checkpoints'} to start the run over."
        )
    warm = Path(run_dir) / WARM_START
    if warm.exists():  # the warm start finished before any RL checkpoint
        model.load_state_dict(load_weights(warm), strict=False)
    return None
