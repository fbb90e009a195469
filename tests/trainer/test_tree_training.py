"""``turngym train`` with tree rollouts and tree credit, end to end on CPU with the tiny model (arith)."""

import json

import pytest

from turngym.trainer.config import load_config
from turngym.trainer.loop import Trainer
from turngym.trainer.metrics import read_metrics


@pytest.mark.parametrize("method", ["tree", "tree_gigpo"])
def test_train_with_tree_rollouts_and_tree_credit(tmp_path, method):
    cfg = load_config(
        None,
        [
            f"run_dir={tmp_path / 'run'}",
            "rollout.env=arith",
            "rollout.env_kwargs={depth: 1, max_turns: 2}",
            "rollout.tasks_per_step=2",
            "rollout.max_tokens=10",
            "rollout.tree={k: 2, turns: [0, 1]}",
            f"credit.method={method}",
            "credit.norm_by_std=false",
            "optim.lr=1e-3",
            "log.progress=false",
            "steps=1",
        ],
    )
    summary = Trainer(cfg).train()
    assert summary["step"] == 1
    (row,) = read_metrics(tmp_path / "run")
    assert row["rollout/tree/trees"] == 2 and row["rollout/tree/forks"] >= 2
    assert abs(row["update/ratio_mean"] - 1.0) < 1e-3  # the leaves' tokens are the sampled ones
    lines = (tmp_path / "run" / "trajectories" / "step-000001.jsonl").read_text().splitlines()
    leaves = [json.loads(line) for line in lines]
    assert len(leaves) >= 4  # two trees of >= 2 leaves (each root branches at turn 0)
    for leaf in leaves:
        turns = leaf["turns"]
        assert turns[0]["parent_id"] == "root" and all(t["node_id"] for t in turns)
        assert all(method in t["info"]["advantages"] for t in turns)
    if method == "tree":  # branch-gated: value differences at branching turns, zero elsewhere
        for seed in {leaf["seed"] for leaf in leaves}:
            tree = [leaf for leaf in leaves if leaf["seed"] == seed and not leaf["masked"]]
            firsts = [leaf["turns"][0]["info"]["advantages"]["tree"] for leaf in tree]
            assert sum(firsts) == pytest.approx(0.0, abs=1e-6)  # the root's branch balances
