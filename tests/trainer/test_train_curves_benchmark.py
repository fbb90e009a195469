"""``benchmarks/train_curves.py`` end to end on CPU with a tiny model: the plumbing of the GPU learning
runs (warm start with checkpoint evals, RL children per method and seed, summary with masked
fractions) must work before device time is spent on it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


#: a tiny model, a two-step warm start on eight expert episodes, one RL step of one task x 2
TINY = ["--hidden", "64", "--layers", "1", "--sft-tasks", "8", "--sft-steps", "2", "--sft-checkpoints", "1"]
TINY += ["--sft-batch", "2", "--workers", "1", "--seeds", "0", "--steps", "1", "--tasks", "1", "--group", "2"]
TINY += ["--eval-tasks", "2", "--eval-every", "1", "--max-tokens", "8", "--stagger-s", "0"]


def run_curves(out: Path, *args: str) -> dict:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "train_curves.py"), "--out", str(out), *TINY, *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return json.loads((out / "summary.json").read_text())


def test_train_curves_runs_end_to_end_on_cpu(tmp_path):
    out = tmp_path / "curves"
    summary = run_curves(
        out,
        *["--n-passages", "300", "--n-tasks", "80", "--hops", "1", "--grad-ckpt"],
        *["--methods", "grpo", "igpo:norm=separate,returns=depth_zscore", "--max-batch", "3"],
        *["--set", "optim.warmup_steps=2"],
    )
    igpo_spec, igpo_run = (
        "igpo:norm=separate,returns=depth_zscore",
        "igpo.norm_separate.returns_depth_zscore-s0",
    )
    assert [c["step"] for c in summary["checkpoints"]] == [1, 2]
    assert all(c["eval_masked_frac"] == 0.0 for c in summary["checkpoints"])
    for method, run in (("grpo", "grpo-s0"), (igpo_spec, igpo_run)):
        m = summary["methods"][method]
        assert len(m["final_eval_f1"]) == 1 and m["max_eval_masked_frac"] == [0.0]
        rows = [json.loads(x) for x in (out / run / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [0, 1] and "update/tokens" in rows[1]
        assert rows[0]["eval/by_hops/1/frac"] == 1.0  # the eval headline per hop count
        assert rows[0]["eval/by_hops/1/reward/outcome"] == rows[0]["eval/reward/outcome"]
    config = json.loads((out / igpo_run / "config.json").read_text())
    assert config["model"]["gradient_checkpointing"] is True and config["credit"]["method"] == "igpo"
    assert config["credit"]["igpo"]["norm"] == "separate"  # the variant's options reached the run
    assert config["credit"]["igpo"]["returns"] == "depth_zscore"
    assert config["optim"]["warmup_steps"] == 2 and config["rollout"]["backend"]["max_batch_size"] == 3
    # the report of a run directory: the JSON and plot docs/credit.md shows, a table per method and step
    dest = tmp_path / "report"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "curves_report.py"), str(out), "--card", "cpu"]
    res = subprocess.run(
        [*cmd, "--session", "test", "--out", str(dest)], capture_output=True, text=True, cwd=ROOT
    )
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(dest.with_suffix(".json").read_text())
    assert set(doc["runs"]) == {"grpo-s0", igpo_run}  # the warm start's eval runs are not RL runs
    assert [r[0] for r in doc["runs"]["grpo-s0"]["eval"]] == [0, 1] and dest.with_suffix(
        ".png"
    ).stat().st_size
    lines = [line for line in res.stdout.splitlines() if line.startswith("| grpo |")]
    assert [line.split("|")[2].strip() for line in lines] == ["0", "1"]


def test_train_curves_runs_another_env_with_method_options(tmp_path):
    """``--env``: the warm start, RL and eval on arith, G-RA with its gate always open (direct
    accumulation) beside GRPO; no per-hop breakdown there."""
    out = tmp_path / "curves"
    tree_spec = "tree:rollout.tree.k=2,rollout.tree.turns=[0,1],episode_weight=0.5"
    summary = run_curves(
        out,
        *["--env", "arith", "--env-kwargs", '{"depth": 1}', "--max-turns", "2", "--eval-breakdown", "none"],
        *["--methods", "grpo", "gated:delta=-1e9", tree_spec, "--max-context", "1024"],
    )
    assert set(summary["methods"]) == {"grpo", "gated:delta=-1e9", tree_spec}
    # a dotted option is that run's own config key: tree rollouts for the tree credit alone
    tree_run = out / "tree.rollout.tree.k_2.rollout.tree.turns_0.1.episode_weight_0.5-s0"
    tree_cfg = json.loads((tree_run / "config.json").read_text())
    assert tree_cfg["rollout"]["tree"]["k"] == 2 and tree_cfg["rollout"]["tree"]["turns"] == [0, 1]
    assert tree_cfg["credit"]["tree"]["episode_weight"] == 0.5
    tree_rows = [json.loads(x) for x in (tree_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in tree_rows] == [0, 1]
    config = json.loads((out / "gated.delta_-1e9-s0" / "config.json").read_text())
    assert config["rollout"]["env"] == "arith" and config["rollout"]["env_kwargs"] == {
        "depth": 1,
        "max_turns": 2,
    }
    assert config["rollout"]["eval_env_kwargs"] == {} and config["rollout"]["eval_breakdown"] is None
    assert config["rollout"]["max_context"] == 1024
    assert config["credit"]["method"] == "gated" and config["credit"]["gated"]["delta"] == -1e9
    assert config["rollout"]["tree"] is None  # the tree run's options stay its own
    rows = [json.loads(x) for x in (out / "gated.delta_-1e9-s0" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and "gated/gate_open_frac" in rows[1]
    assert rows[1]["gated/gate_open_frac"] == 1.0  # direct accumulation: the gate never closes
    assert "gated/low_mean" in rows[1]
    # the report of another env: its own eval metric and a training metric's panel
    dest = tmp_path / "report"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "curves_report.py"), str(out), "--card", "cpu"]
    cmd += ["--session", "t", "--out", str(dest), "--eval-metric", "eval/reward/success"]
    extra = ["--train-extra", "gated/outcome_mean", "--train-extra", "gated/low_mean"]
    res = subprocess.run([*cmd, *extra], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(dest.with_suffix(".json").read_text())
    assert doc["columns"]["eval"][1] == "eval/reward/success"
    assert doc["columns"]["train"][-2:] == ["gated/outcome_mean", "gated/low_mean"]
    assert [r[-2] for r in doc["runs"]["gated.delta_-1e9-s0"]["train"]] == [
        r["gated/outcome_mean"] for r in rows if "time/step" in r
    ]
    gated_run = doc["runs"]["gated.delta_-1e9-s0"]
    assert [r[1] for r in gated_run["eval"]] == [
        r["eval/reward/success"] for r in rows if "eval/reward/success" in r
    ]
    assert [r[-1] for r in gated_run["train"]] == [r["gated/low_mean"] for r in rows if "time/step" in r]
    assert doc["runs"]["grpo-s0"]["train"][0][-1] is None  # grpo logs no gated metrics
