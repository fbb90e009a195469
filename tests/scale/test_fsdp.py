"""``cluster.strategy: fsdp`` (FSDP2) on 2 gloo processes with the tiny model: the update equals DDP's
and one process's, the rollouts' full copy equals the shards, sharded checkpoints resume on another
world size, and ranks with different configs or a stuck or dead peer stop instead of hanging."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.scale.runs import TINY_ARITH_RUN

HERE = Path(__file__).parent
ROOT = HERE.parents[1]

pytestmark = pytest.mark.timeout(600)


def _launch(script: str, args: list[str], nproc: int, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    cmd = [sys.executable]
    if nproc > 1:
        cmd += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    proc = subprocess.run(
        cmd + [str(HERE / script), *args], env=env, capture_output=True, text=True, timeout=300
    )
    if check:
        assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def _step(out: Path, nproc: int, *overrides: str) -> tuple[dict, dict]:
    _launch("ddp_step.py", [str(out), "optim.ppo_epochs=2", *overrides], nproc)
    return json.loads((out / f"world-{nproc}.json").read_text()), torch.load(out / f"world-{nproc}.pt")


def _assert_same_update(a: tuple[dict, dict], b: tuple[dict, dict]) -> None:
    (ma, ta), (mb, tb) = a, b
    assert ma["update/tokens"] == mb["update/tokens"] > 0
    for key in ("update/loss", "update/pg_loss", "update/grad_norm", "update/ratio_mean"):
        assert mb[key] == pytest.approx(ma[key], rel=1e-4, abs=1e-7), key
    assert ta["grads"].abs().sum() > 0
    torch.testing.assert_close(tb["grads"], ta["grads"], rtol=1e-4, atol=1e-5)  # |grads| up to ~0.04
    # Adam's steps are lr * m / (sqrt(v) + eps): where a gradient is ~eps, float noise moves them a little
    torch.testing.assert_close(tb["weights"], ta["weights"], rtol=0, atol=5e-5)  # lr is 1e-3, 2 steps


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> tuple[dict, dict]:
    """The one-process update with the default overrides, the baseline of several tests (read only)."""
    return _step(tmp_path_factory.mktemp("one"), 1)


def test_unknown_strategy_is_refused_with_the_known_ones():
    from turngym.trainer.config import load_config

    with pytest.raises(ValueError, match=r"unknown cluster.strategy 'zero3'; known: ddp, fsdp"):
        load_config(None, ["cluster.strategy=zero3"])
    cfg = load_config(
        None, ["cluster.strategy=fsdp", "cluster.fsdp.cpu_offload=true", "cluster.timeout_s=30"]
    )
    assert (cfg.cluster.strategy, cfg.cluster.fsdp.cpu_offload, cfg.cluster.timeout_s) == ("fsdp", True, 30.0)
    assert load_config(None, []).cluster.strategy == "ddp"
    with pytest.raises(ValueError, match="param_dtype"):
        load_config(None, ["cluster.fsdp.param_dtype=float8"])


def test_fsdp_shards_every_decoder_layer_then_the_root():
    """One process (world 1 on gloo): each decoder layer and the root become FSDP units; the full copy
    made before sharding equals the sharded weights after a refresh."""
    _launch("fsdp_units.py", [], 1)


@pytest.mark.slow
def test_fsdp_update_equals_ddp_and_one_process(tmp_path, one_process):
    """Two optimizer steps on one global batch of 8 sequences, several micro-batches per rank."""
    one = one_process
    ddp = _step(tmp_path / "ddp", 2)
    fsdp = _step(tmp_path / "fsdp", 2, "cluster.strategy=fsdp")
    assert (fsdp[0]["sharded"], ddp[0]["sharded"], fsdp[0]["backend"]) == (True, False, "gloo")
    assert fsdp[0]["update/micro_batches"] >= 2  # gradient accumulation across micro-batches
    _assert_same_update(one, fsdp)
    _assert_same_update(ddp, fsdp)
    # the rollouts' full copy, gathered from the shards after the update, is the updated weights
    torch.testing.assert_close(fsdp[1]["full_copy"], fsdp[1]["weights"], rtol=0, atol=0)


@pytest.mark.slow
def test_fsdp_with_chunked_head_logprobs_equals_one_process(tmp_path):
    """The output head applied in chunks of 16 positions outside the root's forward (the root unit
    stays gathered until its backward): the ranks run different numbers of chunks, and the update
    still equals one process's on the whole batch."""
    chunk = "optim.logprob_chunk_tokens=16"
    one = _step(tmp_path / "one", 1, chunk)
    fsdp = _step(tmp_path / "fsdp", 2, "cluster.strategy=fsdp", chunk)
    assert fsdp[0]["sharded"] and fsdp[0]["update/micro_batches"] >= 2
    _assert_same_update(one, fsdp)
    torch.testing.assert_close(fsdp[1]["full_copy"], fsdp[1]["weights"], rtol=0, atol=0)


@pytest.mark.slow
def test_fsdp_reducing_every_micro_batch_equals_one_process(tmp_path, one_process):
    """``cluster.fsdp.reduce_every_micro_batch``: gradients reduce-scattered after each of several
    micro-batches and accumulated in the shards give the same update as one process's."""
    one = one_process
    fsdp = _step(tmp_path / "fsdp", 2, "cluster.strategy=fsdp", "cluster.fsdp.reduce_every_micro_batch=true")
    assert fsdp[0]["sharded"] and fsdp[0]["update/micro_batches"] >= 2
    _assert_same_update(one, fsdp)


@pytest.mark.slow
def test_fsdp_with_the_full_copy_released_equals_one_process(tmp_path, one_process):
    """``cluster.fsdp.release_full_copy``: the copy freed for the update (and the gradients after the
    optimizer step) is rebuilt by the weight sync into exactly the updated weights."""
    one = one_process
    fsdp = _step(tmp_path / "fsdp", 2, "cluster.strategy=fsdp", "cluster.fsdp.release_full_copy=true")
    (m1, t1), (m2, t2) = one, fsdp
    assert m2["sharded"] and t2["grads"].numel() == 0 < t1["grads"].numel()  # freed for the refresh
    for key in ("update/loss", "update/pg_loss", "update/grad_norm", "update/ratio_mean"):
        assert m2[key] == pytest.approx(m1[key], rel=1e-4, abs=1e-7), key
    torch.testing.assert_close(t2["weights"], t1["weights"], rtol=0, atol=5e-5)
    torch.testing.assert_close(t2["full_copy"], t2["weights"], rtol=0, atol=0)


@pytest.mark.slow
def test_fsdp_with_a_zero_work_rank_equals_one_process(tmp_path, one_process):
    """Rank 1 has no sequence: it runs as many zero-weight passes as rank 0 has micro-batches."""
    one = one_process
    fsdp = _step(tmp_path / "fsdp", 2, "cluster.strategy=fsdp", "--all-on-rank-0")
    assert fsdp[0]["sharded"] and one[0]["update/micro_batches"] >= 2
    _assert_same_update(one, fsdp)


@pytest.mark.slow
def test_fsdp_with_cpu_offload_and_activation_checkpointing_equals_one_process(tmp_path, one_process):
    one = one_process
    extra = ["cluster.fsdp.cpu_offload=true", "model.gradient_checkpointing=true"]
    fsdp = _step(tmp_path / "fsdp", 2, "cluster.strategy=fsdp", *extra)
    assert fsdp[0]["sharded"]
    _assert_same_update(one, fsdp)
    torch.testing.assert_close(fsdp[1]["full_copy"], fsdp[1]["weights"], rtol=0, atol=0)


@pytest.mark.slow
def test_fsdp_lora_update_equals_one_process(tmp_path):
    lora = ["model.lora={r: 4, alpha: 8}"]
    one = _step(tmp_path / "one", 1, *lora)
    fsdp = _step(tmp_path / "fsdp", 2, "cluster.strategy=fsdp", *lora)
    assert fsdp[0]["sharded"]
    assert fsdp[1]["weights"].numel() < 200_000  # the adapter only
    _assert_same_update(one, fsdp)
    torch.testing.assert_close(fsdp[1]["full_copy"], fsdp[1]["weights"], rtol=0, atol=0)


def _roundtrip(tmp_path: Path, save_world: int, load_world: int, *save: str) -> tuple[dict, dict]:
    run = tmp_path / "run"
    common = ["cluster.strategy=fsdp", "optim.warmup_steps=5"]  # the schedule's state matters too
    args = ["save", str(run), str(tmp_path / "saved"), "steps=3", *common, *save]
    _launch("dcp_step.py", args, save_world)
    _launch("dcp_step.py", ["load", str(run), str(tmp_path / "loaded"), "steps=3", *common], load_world)
    return torch.load(tmp_path / "saved" / "state.pt"), torch.load(tmp_path / "loaded" / "state.pt")


def _assert_resumed(saved: dict, loaded: dict) -> None:
    assert saved["checkpoints"] == ["step-000002", "step-000003"]  # keep_checkpoints=2
    assert loaded["step"] == saved["step"] == 3
    assert loaded["lr"] == pytest.approx(saved["lr"]) == pytest.approx(4e-3 / 5)
    assert sorted(loaded["weights"]) == sorted(saved["weights"])
    for name, w in saved["weights"].items():
        torch.testing.assert_close(loaded["weights"][name], w, rtol=0, atol=0)
        assert len(saved["moments"][name]) == 2
        for a, b in zip(saved["moments"][name], loaded["moments"][name], strict=True):
            torch.testing.assert_close(b, a, rtol=0, atol=0)


@pytest.mark.slow
def test_sharded_checkpoint_written_in_the_background_by_two_ranks_resumes_on_one(tmp_path):
    """``checkpoint_async``: each save's shards are written (over the saver's own gloo group) while the
    next update runs; the resumed weights, moments and schedule are the saved step's, bit for bit."""
    saved, loaded = _roundtrip(tmp_path, 2, 1, "checkpoint_async=true")
    assert saved["pending"] == [True, True, True] and loaded["pending"] == []
    assert (saved["world"], saved["sharded"], loaded["world"], loaded["sharded"]) == (2, True, 1, False)
    state = json.loads((tmp_path / "run" / "checkpoints" / "step-000003" / "state.json").read_text())
    assert (state["format"], state["world_size"]) == ("dcp", 2)
    _assert_resumed(saved, loaded)


@pytest.mark.slow
def test_sharded_checkpoint_from_one_process_resumes_on_two_ranks(tmp_path):
    saved, loaded = _roundtrip(tmp_path, 1, 2)
    assert saved["pending"] == [False, False, False]  # written in the foreground
    assert (saved["world"], loaded["world"], loaded["sharded"]) == (1, 2, True)
    _assert_resumed(saved, loaded)


def test_ranks_with_different_configs_refuse_to_start(tmp_path):
    proc = _launch("dist_faults.py", ["mismatch", str(tmp_path)], 2, check=False)
    assert proc.returncode != 0
    for rank in (0, 1):
        said = (tmp_path / f"rank-{rank}.txt").read_text()
        assert said.startswith("ConfigMismatchError: ranks [1] were started with a different config"), said


@pytest.mark.slow
def test_a_stuck_rank_fails_the_others_at_the_configured_timeout(tmp_path):
    """cluster.timeout_s=2: rank 0's collective raises while rank 1 sleeps for 120 s."""
    proc = _launch("dist_faults.py", ["stuck", str(tmp_path)], 2, check=False)
    assert proc.returncode != 0
    said = (tmp_path / "rank-0.txt").read_text()
    assert said.startswith("RuntimeError") and "Timed out" in said, said


@pytest.mark.slow
def test_a_killed_rank_ends_the_job(tmp_path):
    proc = _launch("dist_faults.py", ["killed", str(tmp_path)], 2, check=False)
    assert proc.returncode != 0
    said = tmp_path / "rank-0.txt"
    assert not said.exists() or said.read_text() != "no error"


def test_benchmark_runs_the_tiny_shape_on_one_process(tmp_path):
    out = tmp_path / "bench.json"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "fsdp.py"),
        "--tiny",
        "--steps=1",
        "--warmup=0",
        "--variants=base,nochunk",
        f"--out={out}",
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "strategy" in proc.stdout and "MFU against a peak of 9.89e+14" in proc.stdout
    result = json.loads(out.read_text())
    assert result["card"] == "cpu" and result["peak_flops"] == 989e12
    order = [(r["strategy"], r["variant"]) for r in result["rows"]]
    assert order == [("fsdp", "base"), ("fsdp", "nochunk"), ("ddp", "base"), ("ddp", "nochunk")]
    for r in result["rows"]:  # ratios to the first variant of the same strategy, in the same run
        base = next(b for b in result["rows"] if b["strategy"] == r["strategy"] and b["variant"] == "base")
        assert r["update_s_ratio"] == pytest.approx(r["update_s"] / base["update_s"])
        assert r["chunk"] == (None if r["variant"] == "nochunk" else 4096)
    rows = {r["strategy"]: r for r in result["rows"] if r["variant"] == "base"}
    assert sorted(rows) == ["ddp", "fsdp"]
    for r in rows.values():
        assert r["world"] == 1 and r["shape"] == "tiny" and r["params"] > 0
        assert r["update_s"] > 0 and r["tokens"] == 4 * 32
        assert r["mfu"] == pytest.approx(6 * r["params"] * r["tokens"] / r["update_s"] / 989e12)
    assert rows["fsdp"]["grad_norm"] == pytest.approx(
        rows["ddp"]["grad_norm"], rel=1e-5
    )  # one process: same update


def test_train_builds_the_torchrun_rendezvous_of_several_nodes():
    import typer

    from turngym.trainer.commands import torchrun_command

    one = torchrun_command(2, None, ["steps=1"])
    assert one[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    assert one[-3:] == ["-m", "turngym.trainer.torchrun_entry", "steps=1"]
    two = torchrun_command(
        4, Path("c.yaml"), [], nnodes=2, node_rank=1, master_addr="10.0.0.1", master_port=29600
    )
    assert "--standalone" not in two
    for flag in (
        "--nproc-per-node=4",
        "--nnodes=2",
        "--node-rank=1",
        "--master-addr=10.0.0.1",
        "--master-port=29600",
    ):
        assert flag in two
    assert two[-1] == "c.yaml"
    with pytest.raises(typer.BadParameter, match="--master-addr"):
        torchrun_command(1, None, [], nnodes=2)
    with pytest.raises(typer.BadParameter, match="--node-rank"):
        torchrun_command(1, None, [], nnodes=2, node_rank=2, master_addr="127.0.0.1")


@pytest.mark.slow
def test_turngym_train_fsdp_on_two_nodes_over_loopback(tmp_path):
    """``turngym train --nnodes 2`` twice on one host (one gloo process per "node"), strategy fsdp:
    warm start, rollouts from the full copy, updates, sharded checkpoints, final export; then a
    resumed run goes on from the checkpoint."""
    import socket

    from turngym.trainer.metrics import read_metrics

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = tmp_path / "run"
    overrides = [
        f"run_dir={run}",
        "cluster.strategy=fsdp",
        *TINY_ARITH_RUN,
    ]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])

    def node(rank: int, extra: list[str]) -> subprocess.Popen:
        flags = ["--nnodes=2", f"--node-rank={rank}", "--master-addr=127.0.0.1", f"--master-port={port}"]
        cmd = [sys.executable, "-m", "turngym.cli", "train", *flags, *overrides, *extra]
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    procs = [node(0, []), node(1, [])]
    outs = [p.communicate(timeout=400)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    rows = read_metrics(run)
    steps = [r for r in rows if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["time/refresh"] >= 0 and "update/loss" in r for r in steps)
    assert (run / "sft_done.json").exists() and (run / "final" / "config.json").exists()
    state = json.loads((run / "checkpoints" / "step-000002" / "state.json").read_text())
    assert (state["format"], state["world_size"], state["step"]) == ("dcp", 2, 2)
    procs = [node(0, ["steps=3"]), node(1, ["steps=3"])]  # resumed from step 2 on the same two nodes
    outs = [p.communicate(timeout=400)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    assert [r["step"] for r in read_metrics(run) if r["step"] > 0] == [1, 2, 3]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000002", "step-000003"]
