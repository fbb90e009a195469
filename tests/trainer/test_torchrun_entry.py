"""The learner's entry point (what torchrun runs): ``-m turngym.trainer.torchrun_entry``, and the
older ``-m turngym.trainer.distributed``, which runs it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import turngym.trainer.distributed as distributed
from turngym.trainer.metrics import read_metrics
from turngym.trainer.torchrun_entry import main

TINY = [
    "rollout.env=arith",
    "rollout.env_kwargs={depth: 1, max_turns: 2}",
    "rollout.tasks_per_step=2",
    "rollout.group_size=2",
    "rollout.max_tokens=8",
    "steps=1",
    "log.progress=false",
    "log.tensorboard=false",
]


def test_main_trains_from_overrides(tmp_path, capsys):
    main([f"run_dir={tmp_path / 'run'}", *TINY])
    assert f"done at step 1: {tmp_path / 'run'}" in capsys.readouterr().out
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1]


def test_the_older_module_path_still_launches_the_entry_point(tmp_path):
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-m", "turngym.trainer.distributed", f"run_dir={tmp_path / 'run'}", *TINY],
        capture_output=True,
        text=True,
        env={**env, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"},
        timeout=540,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "done at step 1" in out.stdout
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1]


def test_distributed_main_moved_with_a_message():
    with pytest.raises(AttributeError, match=r"torchrun_entry\.main"):
        distributed.main  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        distributed.nope  # noqa: B018
