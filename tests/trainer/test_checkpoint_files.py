"""The checkpoint manifest, the metrics file's reader and rewind, and the order of durable writes.

Real files on disk throughout; the fsync order is read from the system calls of a real process
(strace), not from a patched ``os.fsync``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turngym.trainer.manifest import MANIFEST, verify_manifest, write_manifest
from turngym.trainer.metrics import MetricLogger, read_metric_rows

ROOT = Path(__file__).resolve().parents[2]


def sharded(root: Path) -> Path:
    """A checkpoint laid out like a torch.distributed.checkpoint one: shard files in a subdirectory."""
    (root / "model").mkdir(parents=True)
    (root / "state.json").write_text('{"step": 7}')
    for rank in range(2):
        (root / "model" / f"__{rank}_0.distcp").write_bytes(os.urandom(5000 + rank))
    (root / "model" / ".metadata").write_bytes(os.urandom(300))
    write_manifest(root, 7, {"world_size": 2})
    return root


def test_the_manifest_covers_a_directory_of_shard_files(tmp_path):
    root = sharded(tmp_path / "step-000007")
    manifest = json.loads((root / MANIFEST).read_text())
    assert set(manifest["files"]) == {
        "state.json",
        "model/__0_0.distcp",
        "model/__1_0.distcp",
        "model/.metadata",
    }
    assert manifest["world_size"] == 2 and manifest["step"] == 7 and manifest["version"] == 1
    assert verify_manifest(root, 7) is None
    assert str(verify_manifest(root, 8)).endswith(
        "manifest.json: step mismatch (manifest says 7, directory says 8)"
    )

    shard = root / "model" / "__1_0.distcp"
    data = shard.read_bytes()
    shard.write_bytes(data[:100] + bytes(b ^ 1 for b in data[100:164]) + data[164:])
    damage = verify_manifest(root, 7)
    assert (damage.file, damage.check) == ("model/__1_0.distcp", "sha256 mismatch")
    shard.write_bytes(data)
    (root / "model" / "__2_0.distcp").write_bytes(b"x")
    assert (verify_manifest(root).file, verify_manifest(root).check) == (
        "model/__2_0.distcp",
        "not in the manifest",
    )
    (root / "model" / "__2_0.distcp").unlink()
    (root / "model" / ".metadata").unlink()
    assert (verify_manifest(root).file, verify_manifest(root).check) == ("model/.metadata", "missing")


@pytest.mark.parametrize(
    ("edit", "check"),
    [
        (lambda m: {**m, "version": 2}, "unknown format version"),
        (lambda m: {**m, "format": "other"}, "not a turngym checkpoint manifest"),
        (lambda m: {**m, "files": {**m["files"], "../escape": m["files"]["state.json"]}}, "path outside"),
        (lambda m: {**m, "step": "7"}, "no integer step or no file list"),
    ],
)
def test_a_manifest_this_code_cannot_trust_is_refused(tmp_path, edit, check):
    root = sharded(tmp_path / "c")
    path = root / MANIFEST
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    assert check in str(verify_manifest(root))


NAMES = st.text("abcxyz_.0", min_size=1, max_size=6).filter(lambda s: s not in {".", ".."} and s != MANIFEST)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    files=st.dictionaries(
        st.lists(NAMES, min_size=1, max_size=3).map(tuple),
        st.binary(min_size=1, max_size=300),
        min_size=1,
        max_size=6,
    ),
    pick=st.integers(min_value=0),
    at=st.integers(min_value=0),
)
def test_any_changed_byte_is_named_by_file(files, pick, at):
    """Property: a directory verifies right after its manifest is written, and flipping any one byte
    of any one file is reported against that file (same size: by its sha256)."""
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        written = []
        for parts, data in files.items():
            path = root.joinpath(*parts)
            if (
                any(p.is_file() for p in [root.joinpath(*parts[:k]) for k in range(1, len(parts))])
                or path.is_dir()
            ):
                continue  # a name used both as a file and as a directory
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            written.append(path)
        written = [p for p in written if p.is_file()]
        write_manifest(root, 3)
        assert verify_manifest(root, 3) is None
        target = written[pick % len(written)]
        data = bytearray(target.read_bytes())
        data[at % len(data)] ^= 0x40
        target.write_bytes(bytes(data))
        damage = verify_manifest(root, 3)
        assert damage is not None
        assert (damage.file, damage.check) == (target.relative_to(root).as_posix(), "sha256 mismatch")


ROWS = st.lists(
    st.dictionaries(
        st.sampled_from(["reward/outcome", "update/loss", "eval/reward/success"]),
        st.floats(allow_nan=False, allow_infinity=False, width=32),
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=80, deadline=None)
@given(rows=ROWS, cut=st.integers(min_value=0))
def test_a_metrics_file_cut_anywhere_reads_back_its_whole_lines(rows, cut):
    """Property: metrics.jsonl cut at any byte (a process killed mid-write) reads back as the rows
    whose lines are whole, never an error; the next logger's first row starts a line of its own."""
    with tempfile.TemporaryDirectory() as d:
        run = Path(d)
        logger = MetricLogger(run, tensorboard=False)
        for step, row in enumerate(rows, start=1):
            logger.log(step, row)
        path = run / "metrics.jsonl"
        data = path.read_bytes()
        cut %= len(data) + 1
        path.write_bytes(data[:cut])
        whole = data[:cut].count(b"\n")
        tail_is_a_row = cut < len(data) and data[cut:].startswith(b"\n")  # only the newline was cut
        n = whole + tail_is_a_row
        logging.disable(logging.WARNING)
        try:
            assert [r["step"] for r in read_metric_rows(path)] == list(range(1, n + 1))
            MetricLogger(run, tensorboard=False).log(99, {"x": 1.0})
            assert [r["step"] for r in read_metric_rows(path)] == [*range(1, n + 1), 99]
        finally:
            logging.disable(logging.NOTSET)


def test_a_torn_line_is_skipped_with_a_warning_naming_file_and_line(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "a": 1.0}\n{"step": 2, "a": \n[1, 2]\n{"a": 3}\n{"step": 3}\n')
    with caplog.at_level(logging.WARNING, logger="turngym.trainer"):
        assert [r["step"] for r in read_metric_rows(path)] == [1, 3]
    assert f"{path} line 2 skipped: not JSON" in caplog.text
    assert f"{path} line 3 skipped: not a JSON object with a numeric step" in caplog.text
    assert f"{path} line 4 skipped" in caplog.text


def test_rewind_drops_what_a_resumed_run_logs_again(tmp_path):
    rows = [
        {"step": 0, "sft/loss_first": 6.9, "eval_before_sft/reward/outcome": 0.0},  # the warm start's row
        {"step": 0, "eval/reward/outcome": 0.1},  # the start policy's eval
        {"step": 1, "reward/outcome": 0.2},
        {"step": 2, "reward/outcome": 0.3},
    ]
    for step, kept in [(2, [0, 0, 1, 2]), (1, [0, 0, 1]), (0, [0])]:
        run = tmp_path / str(step)
        run.mkdir()
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 3, "rew')
        logger = MetricLogger(run, tensorboard=False)
        assert logger.rewind(step) == len(rows) + 1 - len(kept)
        got = read_metric_rows(run / "metrics.jsonl")
        assert [r["step"] for r in got] == kept
        if step == 0:
            assert "sft/loss_first" in got[0]  # a finished warm start is not redone: its row stays


FSYNC_CHILD = """
import sys, torch
from pathlib import Path
from turngym.trainer.checkpoint import save_checkpoint
model = torch.nn.Linear(4, 4)
opt = torch.optim.AdamW(model.parameters())
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
for step in (1, 2):
    save_checkpoint(Path(sys.argv[1]), step, model, opt, sched, {}, keep=1)
"""


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_checkpoint_files_are_fsynced_before_the_rename_and_pruned_after(tmp_path):
    """From a real process's system calls: every file of step 2 and its directory are fsynced before
    the directory is renamed into place, the parent is fsynced after, and step 1 (beyond
    ``keep=1``) is removed only once step 2 is in place."""
    trace, run = tmp_path / "trace", tmp_path / "run"
    subprocess.run(
        [
            "strace",
            "-f",
            "-y",
            "-qq",
            "-e",
            "trace=fsync,rename,renameat,renameat2,unlink,unlinkat,rmdir",
            "-o",
            str(trace),
        ]
        + [sys.executable, "-c", FSYNC_CHILD, str(run)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=300,
    )
    calls = [line.split(None, 1)[1] for line in trace.read_text().splitlines() if " " in line]
    root, tmp, final = (
        run / "checkpoints",
        run / "checkpoints" / ".tmp-step-000002",
        run / "checkpoints" / "step-000002",
    )

    def first(pattern: str) -> int:
        found = [k for k, c in enumerate(calls) if re.search(pattern, c)]
        assert found, pattern
        return found[0]

    renamed = first(rf'^rename\w*\(.*"{re.escape(str(tmp))}".*"{re.escape(str(final))}"')
    for name in ("trainable.pt", "optimizer.pt", "state.json", "manifest.json"):
        assert first(rf"^fsync\(\d+<{re.escape(str(tmp / name))}>") < renamed, name
    assert first(rf"^fsync\(\d+<{re.escape(str(tmp))}>") < renamed
    parent = [k for k, c in enumerate(calls) if re.match(rf"^fsync\(\d+<{re.escape(str(root))}>\)", c)]
    assert any(k > renamed for k in parent)
    pruned = first(rf"^(unlinkat|rmdir)\(.*{re.escape(str(root / 'step-000001'))}[>\"]")
    assert pruned > renamed  # step 1 is removed only once step 2 is in place
    assert sorted(p.name for p in root.iterdir()) == ["step-000002"]
