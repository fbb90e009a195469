"""``turngym train`` with ``credit.method=vine``, end to end on CPU with the tiny model (arith): the
trainer runs vine rollouts, the forks' tokens count in the step's token metrics, and every turn
carries its vine advantage."""

import json

from turngym.trainer.config import load_config
from turngym.trainer.loop import Trainer
from turngym.trainer.metrics import read_metrics


def test_train_with_vine_credit_counts_the_forks_tokens(tmp_path):
    cfg = load_config(
        None,
        [
            f"run_dir={tmp_path / 'run'}",
            "rollout.env=arith",
            "rollout.env_kwargs={depth: 1, max_turns: 2}",
            "rollout.tasks_per_step=2",
            "rollout.group_size=2",
            "rollout.max_tokens=10",
            "credit.method=vine",
            "credit.vine.k=2",
            "optim.lr=1e-3",
            "log.progress=false",
            "steps=1",
        ],
    )
    assert Trainer(cfg).train()["step"] == 1
    (row,) = read_metrics(tmp_path / "run")
    lines = (tmp_path / "run" / "trajectories" / "step-000001.jsonl").read_text().splitlines()
    trajs = [json.loads(line) for line in lines]
    assert len(trajs) == 4  # the continuations are not trained on
    own = sum(
        t["turns"][k]["gen_span"][1] - t["turns"][k]["gen_span"][0]
        for t in trajs
        for k in range(len(t["turns"]))
    )
    forked = row["rollout/vine/forked_tokens"]
    assert forked > 0 and row["rollout/generated_tokens"] == own + forked  # equal-budget accounting
    assert row["rollout/vine/continuations"] == 2 * sum(len(t["turns"]) for t in trajs)
    assert "credit/zero_groups" in row and "vine/estimated_frac" in row
    for t in trajs:
        assert all("vine" in turn["info"]["advantages"] for turn in t["turns"])
        assert len(t["metadata"]["vine"]["samples"]) == len(t["turns"])
