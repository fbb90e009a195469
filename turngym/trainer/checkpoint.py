"""Checkpoints for exact resume: trainable weights, optimizer, scheduler, RNG states, data position.

Layout: ``run_dir/checkpoints/step-000005/{trainable.pt, optimizer.pt, state.json}``; the newest
complete one is found by name (a checkpoint is written to a temporary directory, then renamed).
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np


def rng_state() -> dict[str, Any]:
    import torch

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def trainable_state(model: Any) -> dict[str, Any]:
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items() if k in names}


def save_checkpoint(
    run_dir: Path, step: int, model: Any, optimizer: Any, scheduler: Any, state: dict, keep: int
) -> Path:
    import torch

    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(trainable_state(model), tmp / "trainable.pt")
    torch.save(
        {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng_state()},
        tmp / "optimizer.pt",
    )
    (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=1))
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    for old in sorted(p for p in root.glob("step-*") if p.is_dir())[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def export_policy(model: Any, tokenizer: Any, dest: Path, info: dict | None = None) -> Path:
    """The policy in Hugging Face format (the full weights, or a LoRA adapter) with its tokenizer, in
    ``dest``, replaced whole: written beside it first, then renamed, so a crash leaves the old export
    or the new one, never a mix. ``info`` goes to ``dest/<dest name>.json``."""
    dest = Path(dest)
    tmp = dest.parent / f".tmp-{dest.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if info is not None:
        (tmp / f"{dest.name}.json").write_text(json.dumps(info, indent=1))
    old = dest.parent / f".old-{dest.name}"
    shutil.rmtree(old, ignore_errors=True)
    if dest.exists():
        os.rename(dest, old)
    os.rename(tmp, dest)
    shutil.rmtree(old, ignore_errors=True)
    return dest


def latest_checkpoint(run_dir: Path) -> Path | None:
    root = Path(run_dir) / "checkpoints"
    found = sorted(p for p in root.glob("step-*") if (p / "state.json").exists())
    return found[-1] if found else None


def load_checkpoint(path: Path, model: Any, optimizer: Any, scheduler: Any) -> dict:
    import torch

    weights = torch.load(path / "trainable.pt", map_location="cpu")
    missing = set(weights) - set(model.state_dict())
    if missing:
        raise ValueError(f"checkpoint {path} has weights the model lacks: {sorted(missing)[:5]}")
    model.load_state_dict(weights, strict=False)
    rest = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=False)
    optimizer.load_state_dict(rest["optimizer"])
    scheduler.load_state_dict(rest["scheduler"])
    set_rng_state(rest["rng"])
    return json.loads((path / "state.json").read_text())
