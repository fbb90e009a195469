"""A 2-process gloo DDP update equals the 1-process update on the same global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.scale.runs import TINY_ARITH_RUN

SCRIPT = Path(__file__).with_name("ddp_step.py")

pytestmark = pytest.mark.timeout(600)


def _run(out: Path, nproc: int) -> dict:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    # the script imports turngym from this checkout, not from wherever the package is installed
    env["PYTHONPATH"] = os.pathsep.join([str(SCRIPT.parents[2]), env.get("PYTHONPATH", "")])
    if nproc == 1:
        cmd = [sys.executable, str(SCRIPT), str(out)]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
        cmd += [str(SCRIPT), str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((out / f"world-{nproc}.json").read_text())


def test_two_process_gloo_update_equals_one_process(tmp_path):
    one, two = _run(tmp_path / "one", 1), _run(tmp_path / "two", 2)
    assert (one["world"], two["world"], two["backend"]) == (1, 2, "gloo")
    assert two["update/tokens"] == one["update/tokens"] > 0
    assert two["update/micro_batches"] >= one["update/micro_batches"] >= 2  # accumulation on both sides
    for key in ("update/loss", "update/pg_loss", "update/grad_norm", "update/ratio_mean"):
        assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), key
    a, b = torch.load(tmp_path / "one" / "world-1.pt"), torch.load(tmp_path / "two" / "world-2.pt")
    assert a["grads"].abs().sum() > 0
    torch.testing.assert_close(b["grads"], a["grads"], rtol=1e-4, atol=1e-7)
    # Adam's first step is lr * g / (|g| + eps): where g is ~eps, float noise in g moves the step a little
    torch.testing.assert_close(b["weights"], a["weights"], rtol=0, atol=2e-5)  # lr is 1e-3


def test_turngym_train_with_two_gloo_processes(tmp_path, monkeypatch):
    from turngym.trainer.commands import _torchrun
    from turngym.trainer.metrics import read_metrics

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    run = tmp_path / "run"
    overrides = [
        f"run_dir={run}",
        *TINY_ARITH_RUN,
    ]
    assert _torchrun(2, None, overrides) == 0
    rows = read_metrics(run)
    assert [r["step"] for r in rows if r["step"] > 0] == [1, 2]  # rank 0 alone logs
    assert all("update/loss" in r or "update/skipped" in r for r in rows if r["step"] > 0)
    assert rows[-1]["rollout/generated_tokens"] > 0
    for step in (1, 2):  # each rank rolled out its own task (one group of 2)
        for rank in (0, 1):
            lines = (run / "trajectories" / f"step-{step:06d}.rank-{rank}.jsonl").read_text().splitlines()
            assert len(lines) == 2 and json.loads(lines[0])["seed"] == 2 * (step - 1) + rank
    assert (run / "sft_done.json").exists() and (run / "final" / "config.json").exists()
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-000002"]
