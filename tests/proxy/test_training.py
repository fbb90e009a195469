"""``turngym train`` with ``rollout.source: harness``: the unmodified ``openai`` SDK tool loop
(examples/harness/openai_tool_loop.py) plays ``arith`` through the proxy over the trainer's own tiny
policy (the model) and the env's MCP door (the tools) for a few steps; the weights change and the
logged rewards are the env's returns of the very episodes that were played."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOOP = f"{sys.executable} {ROOT}/examples/harness/openai_tool_loop.py --model policy --task {{task}} --max-turns 2"


def overrides(run: Path, *extra: str) -> list[str]:
    return [
        f"run_dir={run}",
        "steps=2",
        "rollout.env=arith",
        "rollout.env_kwargs={depth: 1, tools_in_prompt: false}",
        "rollout.tasks_per_step=2",
        "rollout.group_size=2",
        "rollout.max_tokens=12",
        "rollout.source=harness",
        f"rollout.harness.command={LOOP}",
        "rollout.harness.concurrency=4",
        "rollout.harness.timeout_s=120",
        "rollout.harness.reward_timeout_s=5",
        # a random model's env return is 0: a length judge gives its episodes different advantages
        "credit.method=arena",
        "credit.arena.workers=1",
        "credit.arena.judge_fn=tests.trainer.test_trainer:shorter_is_better",
        "optim.lr=1e-3",
        "log.progress=false",
        "log.tensorboard=false",
        *extra,
    ]


def replayed_return(traj: dict) -> float:
    """The env's return of an episode, played again locally: reset with its task, step its tool calls."""
    import turngym
    from turngym.core.types import Message

    env = turngym.make("arith", depth=1, tools_in_prompt=False)
    _, info = env.reset(seed=int(traj["task_id"]))
    assert info["task_id"] == traj["metadata"]["env_task"]
    total = 0.0
    for turn in traj["turns"]:
        action = Message.model_validate(turn["action"])
        for call in action.tool_calls:
            msg = Message(role="assistant", content="", tool_calls=[call])
            _, r, term, trunc, _ = env.step(msg)
            total += r
            if term or trunc:
                return total
    return total


@pytest.mark.slow
def test_turngym_train_with_a_harness_source_updates_the_policy_and_logs_the_envs_returns(tmp_path):
    from safetensors.torch import load_file
    from typer.testing import CliRunner

    from turngym.agents.tiny import tiny_model_path
    from turngym.cli import app
    from turngym.trainer.metrics import read_metrics

    run = tmp_path / "run"
    res = CliRunner().invoke(app, ["train", *overrides(run)])
    assert res.exit_code == 0, res.output
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    before = load_file(tiny_model_path() / "model.safetensors")
    after = load_file(run / "final" / "model.safetensors")
    changed = [k for k in before if not (before[k] == after[k]).all()]
    assert changed, "no weight changed"
    for row in rows:
        step = row["step"]
        trajs = [
            json.loads(x) for x in (run / "trajectories" / f"step-{step:06d}.jsonl").read_text().splitlines()
        ]
        assert len(trajs) == 4 and {t["sample"] for t in trajs} == {0, 1}
        assert row["update/grad_norm"] > 0 and "update/skipped" not in row
        live = [t for t in trajs if not t["masked"]]
        assert live, [t["mask_reason"] for t in trajs]  # the harness ran the env: nothing lacks a reward
        returns = [replayed_return(t) for t in live]
        recorded = [sum(turn["reward"] for turn in t["turns"]) for t in live]
        assert recorded == returns
        assert row["reward/total"] == pytest.approx(sum(returns) / len(live))
        assert row["reward/outcome"] == pytest.approx(sum(returns) / len(trajs))  # masked count as failures
        # every call's tokens came from the policy: sampled ids carry the loss and the logprobs
        for t in live:
            assert t["turns"] and all(
                t["loss_mask"][s:e] == [1] * (e - s) for s, e in (x["gen_span"] for x in t["turns"])
            )
        # the per-call time ledger
        assert row["rollout/call/calls"] == sum(len(t["turns"]) for t in trajs)
        assert row["rollout/call/decode_p50"] > 0 and row["rollout/call/generate_p50"] > 0
        assert "rollout/call/harness_p50" in row and "rollout/call/prefill_p50" in row
        assert row["rollout/harness/segments_per_episode"] >= 1
