"""Part 4: the trainer survives SIGKILL. Three real processes share one run directory:

A. killed while writing step 2's checkpoint (after its first file);
B. restarted: resumes from step 1 (the last *complete* checkpoint), killed inside step 3's update;
C. restarted: resumes from step 2 and finishes step 4.

Checked: partial checkpoints are never loaded, every restart resumes from the newest complete one,
the finished run has its final weights, and metrics.jsonl has each step exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from turngym.trainer.checkpoint import latest_checkpoint
from turngym.trainer.manifest import verify_manifest
from turngym.trainer.metrics import read_metrics

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def run_child(run_dir: Path, steps: int, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tests.reliability.trainer_child", str(run_dir), str(steps), *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"},
    )


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("durability") / "run"
    seen: dict[str, object] = {}
    a = run_child(run, 4, "--kill-in-checkpoint", "2")
    seen["a_rc"] = a.returncode
    seen["a_latest"] = latest_checkpoint(run)
    seen["a_partial"] = sorted(p.name for p in (run / "checkpoints").glob(".tmp-*"))
    seen["a_steps"] = [r["step"] for r in read_metrics(run)]
    b = run_child(run, 4, "--kill-in-update", "3")
    seen["b_rc"] = b.returncode
    seen["b_latest"] = latest_checkpoint(run)
    c = run_child(run, 4)
    assert c.returncode == 0, c.stderr[-3000:]
    seen["summary"] = json.loads(c.stdout.strip().splitlines()[-1])
    seen["rows"] = read_metrics(run)
    seen["run"] = run
    return seen


def test_sigkill_resumes_from_the_last_complete_checkpoint(killed_run):
    k = killed_run
    assert k["a_rc"] == -signal.SIGKILL and k["b_rc"] == -signal.SIGKILL
    # A died mid-write: step 2's files are only in the temporary directory; step 1 is the newest complete
    assert k["a_latest"].name == "step-000001" and k["a_partial"] == [".tmp-step-000002"]
    # B resumed from step 1, redid step 2 and committed it, then died in step 3
    assert k["b_latest"].name == "step-000002"
    summary = k["summary"]
    assert summary["resumed"] and summary["step"] == 4
    run = k["run"]
    assert latest_checkpoint(run).name == "step-000004" and (run / "final" / "config.json").exists()
    assert not list((run / "checkpoints").glob(".tmp-*"))  # the partial one was cleaned up
    for ckpt in (run / "checkpoints").glob("step-*"):
        assert {p.name for p in ckpt.iterdir()} == {
            "trainable.pt",
            "optimizer.pt",
            "state.json",
            "manifest.json",
        }
        assert verify_manifest(ckpt, int(ckpt.name.split("-")[1])) is None


def test_metrics_have_each_step_exactly_once(killed_run):
    steps = [r["step"] for r in killed_run["rows"] if r["step"] > 0]
    assert steps == [1, 2, 3, 4], steps
