"""Part 4 (issue 4 of round three): checkpoints are never silently wrong.

One real run (tiny model, CPU, arith, 3 steps, a checkpoint after every step, all kept) is copied
per test and damaged for real: 64 flipped bytes in ``trainable.pt``, another step's ``trainable.pt``,
a torn ``state.json`` or ``manifest.json``, a forged ``optimizer.pt`` carrying a pickled call (with
a manifest that matches it), a torn ``metrics.jsonl`` line. A fresh Trainer then resumes from the
copy, through the real resume path. Two more scenarios run real training processes: the shipped
``grpo_arith_cpu.yaml`` (``checkpoint_every: 0``) SIGKILLed in step 3 and rerun, and a disk that
fills during a checkpoint write (a small tmpfs mounted in a private mount namespace).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from turngym.trainer.checkpoint import CheckpointError, trainable_state
from turngym.trainer.config import load_config
from turngym.trainer.judges import ProgrammaticJudge
from turngym.trainer.loop import Trainer
from turngym.trainer.manifest import verify_manifest, write_manifest
from turngym.trainer.metrics import read_metrics

pytestmark = pytest.mark.reliability

ROOT = Path(__file__).resolve().parents[2]
BASE = [
    "rollout.env=arith",
    "rollout.env_kwargs={depth: 1, max_turns: 2}",
    "rollout.tasks_per_step=2",
    "rollout.group_size=2",
    "rollout.max_tokens=12",
    "optim.lr=1e-3",
    "log.progress=false",
    "log.tensorboard=false",
    "checkpoint_every=1",
    "keep_checkpoints=0",
    "credit.method=arena",  # with the judge below, a random policy gets non-zero advantages: the
    "credit.arena.workers=1",  # weights change every step, so each step's trainable.pt is its own
]


def shorter_is_better(a, b):
    la, lb = sum(len(t.action.content) for t in a.turns), sum(len(t.action.content) for t in b.turns)
    return float(la < lb), float(lb < la)


JUDGE = ProgrammaticJudge(shorter_is_better)


def config(run: Path, steps: int = 3):
    return load_config(None, [f"run_dir={run}", f"steps={steps}", *BASE])


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("integrity") / "run"
    Trainer(config(run), judge=JUDGE).train()
    sums = {s: (ckpt(run, s) / "trainable.pt").read_bytes() for s in (1, 2, 3)}
    assert len(set(sums.values())) == 3  # the policy changed at every step
    assert [p.name for p in sorted((run / "checkpoints").iterdir())] == [
        "step-000001",
        "step-000002",
        "step-000003",
    ]
    return run


def copy_of(trained: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    return run


def resumed(run: Path) -> Trainer:
    """A fresh Trainer on ``run`` that has gone through the real resume path (no training)."""
    trainer = Trainer(config(run), judge=JUDGE)
    trainer.setup()
    trainer.resumed = trainer.run.resume()
    return trainer


def flip(path: Path, offset: int, n: int = 64) -> None:
    data = bytearray(path.read_bytes())
    for k in range(offset, offset + n):
        data[k] ^= 0xFF
    path.write_bytes(bytes(data))


def middle_of_largest_tensor(path: Path) -> int:
    """The file offset of the middle of the largest tensor's bytes in a torch zip archive: flipping
    there leaves every archive header intact (torch does not check the stored CRCs), so only the
    weights change."""
    with zipfile.ZipFile(path) as z:
        info = max(z.infolist(), key=lambda i: i.file_size)
    with open(path, "rb") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = struct.unpack("<HH", f.read(4))
    return info.header_offset + 30 + name_len + extra_len + info.file_size // 2


def ckpt(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"step-{step:06d}"


def assert_holds_step(trainer: Trainer, run: Path, step: int) -> None:
    """The trainer resumed at ``step`` with exactly that checkpoint's weights."""
    assert trainer.resumed and trainer.step == step
    want = torch.load(ckpt(run, step) / "trainable.pt", weights_only=True)
    got = trainable_state(trainer.policy.model)
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)


def test_flipped_bytes_in_trainable_fall_back_to_the_older_checkpoint(trained, tmp_path, caplog):
    run = copy_of(trained, tmp_path)
    target = ckpt(run, 3) / "trainable.pt"
    flip(target, middle_of_largest_tensor(target))
    with caplog.at_level(logging.WARNING, logger="turngym.trainer"):
        trainer = resumed(run)
    assert_holds_step(trainer, run, 2)
    (warning,) = [r.getMessage() for r in caplog.records if "checkpoint damaged" in r.getMessage()]
    assert "step-000003: trainable.pt: sha256 mismatch" in warning and "step-000002" in warning
    # the damaged one is set aside, kept, and never loaded again
    assert (
        not ckpt(run, 3).exists() and (run / "checkpoints" / "damaged-step-000003" / "trainable.pt").exists()
    )


def test_another_steps_trainable_is_refused(trained, tmp_path, caplog):
    run = copy_of(trained, tmp_path)
    shutil.copyfile(ckpt(run, 1) / "trainable.pt", ckpt(run, 3) / "trainable.pt")  # same size, other step
    with caplog.at_level(logging.WARNING, logger="turngym.trainer"):
        trainer = resumed(run)
    assert_holds_step(trainer, run, 2)
    assert "step-000003: trainable.pt: sha256 mismatch" in caplog.text


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        ("torn state.json", "state.json: size mismatch"),
        ("torn manifest.json", "manifest.json: not valid JSON"),
        ("no manifest.json", "manifest.json: missing"),
        ("another step's directory", "manifest.json: step mismatch"),
        ("a stray file", "stray.bin: not in the manifest"),
    ],
)
def test_torn_or_mismatched_checkpoints_fall_back_naming_file_and_check(
    trained, tmp_path, caplog, damage, named
):
    run = copy_of(trained, tmp_path)
    three = ckpt(run, 3)
    if damage == "torn state.json":
        (three / "state.json").write_bytes((three / "state.json").read_bytes()[:10])
    elif damage == "torn manifest.json":
        (three / "manifest.json").write_bytes((three / "manifest.json").read_bytes()[:100])
    elif damage == "no manifest.json":
        (three / "manifest.json").unlink()
    elif damage == "another step's directory":
        shutil.rmtree(three)
        shutil.copytree(ckpt(run, 1), three)
    else:
        (three / "stray.bin").write_bytes(b"\0" * 64)
    with caplog.at_level(logging.WARNING, logger="turngym.trainer"):
        trainer = resumed(run)
    assert_holds_step(trainer, run, 2)
    assert f"step-000003: {named}" in caplog.text


def test_no_intact_checkpoint_stops_naming_every_damage(trained, tmp_path):
    run = copy_of(trained, tmp_path)
    for step in (1, 2, 3):
        flip(ckpt(run, step) / "optimizer.pt", 4096)
    with pytest.raises(CheckpointError) as e:
        resumed(run)
    for step in (1, 2, 3):
        assert f"step-{step:06d}: optimizer.pt: sha256 mismatch" in str(e.value)
    assert "Move them out of" in str(e.value)
    assert [p.name for p in sorted((run / "checkpoints").iterdir())] == [f"step-{s:06d}" for s in (1, 2, 3)]


class _Touch:
    """Unpickles as ``Path(marker).touch()``: code run by ``torch.load(weights_only=False)``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_forged_optimizer_pickle_is_never_run(trained, tmp_path, caplog):
    """A consistent forgery (the manifest rewritten to match) still cannot run code at resume."""
    run = copy_of(trained, tmp_path)
    marker = tmp_path / "code-ran"
    three = ckpt(run, 3)
    rest = torch.load(three / "optimizer.pt", weights_only=False)  # our own file, to forge from
    rest["rng"]["python"] = _Touch(marker)
    with open(three / "optimizer.pt", "wb") as f:
        torch.save(rest, f)
    (three / "manifest.json").unlink(missing_ok=True)
    write_manifest(three, 3)
    assert verify_manifest(three, 3) is None
    with caplog.at_level(logging.WARNING, logger="turngym.trainer"):
        trainer = resumed(run)
    assert not marker.exists()
    assert_holds_step(trainer, run, 2)
    assert "step-000003: optimizer.pt: torch.load(weights_only=True) failed" in caplog.text


def test_torn_metrics_line_is_skipped_and_each_step_logged_once(trained, tmp_path, caplog):
    """Killed while writing step 3's row (so before step 3's checkpoint): the rerun names the torn
    line, drops it, redoes step 3 and logs it once."""
    run = copy_of(trained, tmp_path)
    shutil.rmtree(ckpt(run, 3))
    lines = (run / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    assert len(lines) == 3
    (run / "metrics.jsonl").write_bytes(b"".join(lines[:2]) + lines[2][:57])
    with caplog.at_level(logging.WARNING, logger="turngym.trainer"):
        assert [r["step"] for r in read_metrics(run)] == [1, 2]
    assert f"{run / 'metrics.jsonl'} line 3 skipped: not JSON" in caplog.text
    summary = Trainer(config(run), judge=JUDGE).train()
    assert summary["resumed"] and summary["step"] == 3
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 3  # the torn line is gone


def test_optimizer_state_round_trips_through_weights_only(trained):
    """What a checkpoint holds is tensors and plain containers: ``weights_only=True`` reads all of it."""
    for name in ("trainable.pt", "optimizer.pt"):
        obj = torch.load(ckpt(trained, 3) / name, weights_only=True)
        assert obj
    assert verify_manifest(ckpt(trained, 3), 3) is None
    manifest = json.loads((ckpt(trained, 3) / "manifest.json").read_text())
    assert manifest["step"] == 3 and manifest["version"] == 1
    assert set(manifest["files"]) == {"trainable.pt", "optimizer.pt", "state.json"}


# ------------------------------------------------------------------ real processes
def run_child(run_dir: Path, steps: int, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tests.reliability.trainer_child", str(run_dir), str(steps), *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"},
    )


@pytest.mark.slow
def test_shipped_cpu_config_killed_in_step_3_logs_each_step_once(tmp_path):
    """``grpo_arith_cpu.yaml`` has ``checkpoint_every: 0``: no checkpoint before the end. Killed in
    step 3 and rerun, it starts over after its warm start; it logged steps [0,1,2,1,2,3,4] before."""
    run = tmp_path / "run"
    shipped = str(ROOT / "examples" / "configs" / "grpo_arith_cpu.yaml")
    a = run_child(run, 4, "--config", shipped, "--kill-in-update", "3")
    assert a.returncode == -signal.SIGKILL, a.stderr[-3000:]
    assert [r["step"] for r in read_metrics(run)] == [0, 1, 2] and not (run / "checkpoints").exists()
    b = run_child(run, 4, "--config", shipped)
    assert b.returncode == 0, b.stderr[-3000:]
    assert json.loads(b.stdout.strip().splitlines()[-1])["step"] == 4
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert "sft/loss_last" in rows[0]  # the warm start's row, kept: the warm start was not redone


FULL_DISK = """
set -u
mount -t tmpfs -o size=24m tmpfs "$MNT" || exit 97
"$PY" -m tests.reliability.trainer_child "$MNT/run" 3 --fill-disk-after 1 --set log.tensorboard=false \
    > "$OUT/a.out" 2> "$OUT/a.err"
echo $? > "$OUT/a.rc"
cp -a "$MNT/run" "$OUT/after-a"
rm "$MNT/filler"
"$PY" -m tests.reliability.trainer_child "$MNT/run" 3 --set log.tensorboard=false > "$OUT/b.out" 2> "$OUT/b.err"
echo $? > "$OUT/b.rc"
cp -a "$MNT/run" "$OUT/after-b"
"""


@pytest.mark.slow
def test_a_full_disk_during_a_checkpoint_keeps_the_previous_one(tmp_path):
    """A real ENOSPC: the run directory is a 24 MiB tmpfs (a private mount namespace), filled after
    step 1's checkpoint so that step 2's ``trainable.pt`` fits and its ``optimizer.pt`` does not."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1): cannot mount a private tmpfs")
    mnt, out = tmp_path / "mnt", tmp_path / "out"
    mnt.mkdir()
    out.mkdir()
    env = {**os.environ, "MNT": str(mnt), "OUT": str(out), "PY": sys.executable}
    env.update(TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    done = subprocess.run(["unshare", "-rm", "sh", "-c", FULL_DISK], cwd=ROOT, env=env, timeout=600)
    if done.returncode == 97 or (done.returncode and not (out / "a.rc").exists()):
        pytest.skip("cannot mount a tmpfs in a private mount namespace here (unshare -rm)")
    a_rc, a_err = int((out / "a.rc").read_text()), (out / "a.err").read_text()
    assert a_rc == 1, a_err[-3000:]
    message = a_err.strip().splitlines()[-1]
    assert message.startswith(
        "turngym.trainer.checkpoint.CheckpointWriteError: could not write the checkpoint of step 2"
    )
    assert "No space left on device" in message and "untouched (step-000001)" in message
    after = out / "after-a" / "checkpoints"
    assert sorted(p.name for p in after.iterdir()) == ["step-000001"]  # no partial step 2 left
    assert verify_manifest(after / "step-000001", 1) is None
    # space freed, the same command resumes from step 1 and finishes
    b_rc = int((out / "b.rc").read_text())
    assert b_rc == 0, (out / "b.err").read_text()[-3000:]
    summary = json.loads((out / "b.out").read_text().strip().splitlines()[-1])
    assert summary["resumed"] and summary["step"] == 3
    assert [r["step"] for r in read_metrics(out / "after-b")] == [1, 2, 3]
