"""Sharded (DCP) checkpoints in one process: layout, the seal hook a manifest hangs on, retention, exact
reload, and clear refusals (the multi-rank and resharding cases are in tests/scale/test_fsdp.py)."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from turngym.trainer.distributed import DistContext
from turngym.trainer.sharded_checkpoint import (
    checkpoint_files,
    is_sharded,
    latest_sharded,
    load_sharded,
    save_sharded,
)


def _setup(seed: int, width: int = 6):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.Linear(width, 2))
    model[0].bias.requires_grad_(False)  # frozen: left out of the checkpoint
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
    return model, opt, sched


def _train(model, opt, sched, steps: int) -> None:
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(3, 4)).square().sum().backward()
        opt.step()
        sched.step()


def test_save_seal_keep_and_exact_reload(tmp_path):
    model, opt, sched = _setup(0)
    sealed = {}

    def seal(path):  # what an integrity manifest does: hash every file before the rename
        assert path.name.startswith(".tmp-step-")
        sealed[path.name] = {
            f: hashlib.sha256((path / f).read_bytes()).hexdigest() for f in checkpoint_files(path)
        }

    for step in (1, 2, 3):
        _train(model, opt, sched, 1)
        last = save_sharded(
            tmp_path, step, model, opt, sched, DistContext(), {"config_hash": "x"}, keep=2, seal=seal
        )
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-000002", "step-000003"]
    assert latest_sharded(tmp_path) == last and is_sharded(last)
    files = checkpoint_files(last)
    assert {"extra.pt", "state.json", "dcp/.metadata"} <= set(files) and any(
        f.endswith(".distcp") for f in files
    )
    assert sealed[".tmp-step-000003"] == {
        f: hashlib.sha256((last / f).read_bytes()).hexdigest() for f in files
    }
    state = json.loads((last / "state.json").read_text())
    assert state == {"step": 3, "format": "dcp", "world_size": 1, "config_hash": "x"}

    other, other_opt, other_sched = _setup(1)
    frozen = other[0].bias.detach().clone()
    assert load_sharded(last, other, other_opt, other_sched)["step"] == 3
    for (name, a), b in zip(model.named_parameters(), other.parameters(), strict=True):
        if name == "0.bias":
            torch.testing.assert_close(b, frozen, rtol=0, atol=0)  # not in the checkpoint: untouched
        else:
            torch.testing.assert_close(b, a, rtol=0, atol=0)
            for key in ("exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(other_opt.state[b][key], opt.state[a][key], rtol=0, atol=0)
    assert other_sched.get_last_lr() == sched.get_last_lr()


def test_a_checkpoint_of_another_model_is_refused_with_the_names(tmp_path):
    model, opt, sched = _setup(0)
    _train(model, opt, sched, 1)
    path = save_sharded(tmp_path, 1, model, opt, sched, DistContext(), {}, keep=1)
    bigger = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 2), torch.nn.Linear(2, 2))
    opt2 = torch.optim.AdamW(bigger.parameters())
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda s: 1.0)
    with pytest.raises(
        ValueError, match=r"lacks weights this model trains: \['0.bias', '2.bias', '2.weight'\]"
    ):
        load_sharded(path, bigger, opt2, sched2)
    with pytest.raises(ValueError, match="not a sharded"):
        load_sharded(tmp_path, model, opt, sched)


def test_a_background_save_holds_the_state_of_its_step_not_of_when_it_finishes(tmp_path):
    from turngym.trainer.sharded_checkpoint import PendingCheckpoint

    model, opt, sched = _setup(0)
    _train(model, opt, sched, 2)
    at_save = {n: p.detach().clone() for n, p in model.named_parameters()}
    moments = {n: opt.state[p]["exp_avg"].clone() for n, p in model.named_parameters() if p.requires_grad}
    lr, draw = sched.get_last_lr(), torch.get_rng_state()
    pending = save_sharded(tmp_path, 2, model, opt, sched, DistContext(), {}, keep=1, background=True)
    assert isinstance(pending, PendingCheckpoint) and pending.path == tmp_path / "checkpoints" / "step-000002"
    _train(model, opt, sched, 3)  # the run goes on while the shards are written
    assert latest_sharded(tmp_path) is None  # not a checkpoint until it is finished
    assert pending.wait() == pending.path and latest_sharded(tmp_path) == pending.path
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-000002"]

    other, other_opt, other_sched = _setup(1)
    torch.manual_seed(123)  # the checkpoint's RNG state replaces this one
    assert load_sharded(pending.path, other, other_opt, other_sched)["step"] == 2
    for name, b in other.named_parameters():
        if name != "0.bias":
            torch.testing.assert_close(b, at_save[name], rtol=0, atol=0)
            torch.testing.assert_close(other_opt.state[b]["exp_avg"], moments[name], rtol=0, atol=0)
    assert other_sched.get_last_lr() == lr != sched.get_last_lr()
    assert torch.equal(torch.get_rng_state(), draw)
