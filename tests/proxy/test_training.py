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
        "credit.arena.judge_fn=tests.proxy.test_training:shorter_is_better",
        "optim.lr=1e-3",
        "log.progress=false",
        "log.tensorboard=false",
        *extra,
    ]


def shorter_is_better(a, b):
    """A programmatic arena judge: the episode with the shorter replies wins."""
    la, lb = sum(len(t.action.content) for t in a.turns), sum(len(t.action.content) for t in b.turns)
    return float(la < lb), float(lb < la)


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


def first_call_length(traj) -> float:
    """A reward function over the episode record (``rollout.harness.reward_fn``)."""
    return float(len(traj.turns[0].action.content)), {"chars": float(len(traj.turns[0].action.content))}


ONE_CALL = (  # one model call and exit (no braces, no ": ", as a dotted override is read as YAML)
    f'{sys.executable} -c "import openai; openai.OpenAI(max_retries=0).chat.completions.create('
    "model='policy', messages=[dict(role='user', content='Evaluate (1 + 2)')])\""
)


@pytest.mark.slow
def test_a_reward_function_pays_the_episodes_and_a_crashing_harness_counts_as_a_failure(tmp_path):
    from turngym.trainer.config import load_config
    from turngym.trainer.loop import Trainer
    from turngym.trainer.metrics import read_metrics

    paid = load_config(None, overrides(tmp_path / "fn", "steps=1", "credit.method=grpo",
        f"rollout.harness.command={ONE_CALL}", "rollout.harness.reward=function",
        "rollout.harness.reward_fn=tests.proxy.test_training:first_call_length"))  # fmt: skip
    Trainer(paid).train()
    (row,) = read_metrics(tmp_path / "fn")
    trajs = [
        json.loads(x)
        for x in (tmp_path / "fn" / "trajectories" / "step-000001.jsonl").read_text().splitlines()
    ]
    lengths = [len(t["turns"][0]["action"]["content"]) for t in trajs]
    assert not any(t["masked"] for t in trajs) and [t["turns"][0]["reward"] for t in trajs] == lengths
    assert row["reward/total"] == pytest.approx(sum(lengths) / 4)
    assert row["reward/component/chars"] == pytest.approx(sum(lengths) / 4)

    crash = f"{sys.executable} -c \"import sys; sys.exit('harness fell over')\""
    Trainer(
        load_config(None, overrides(tmp_path / "crash", "steps=1", f"rollout.harness.command={crash}"))
    ).train()
    (row,) = read_metrics(tmp_path / "crash")
    assert row["reward/masked_frac"] == 1.0 and row["reward/outcome"] == 0.0
    assert row["rollout/masked/harness_crashed"] == 4.0 and row["update/skipped"] == 1.0


CMD = "rollout.harness.command=agent --task {task}"


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        (["rollout.source=harness"], "needs rollout.harness.command"),
        (
            ["rollout.source=harness", "rollout.harness.command=agent --model {model}"],
            r"unknown field\(s\) \['model'\]",
        ),
        (["rollout.source=harness", CMD, "rollout.harness.reward=function"], "reward_fn is set exactly when"),
        (["rollout.source=harness", CMD, "rollout.harness.reward_fn=a:b"], "reward_fn is set exactly when"),
        (["rollout.source=harness", CMD, "rollout.tree={k: 2}"], "not with rollout.source=harness"),
        (["rollout.source=harness", CMD, "credit.method=vine"], "an outside harness cannot"),
    ],
)
def test_a_harness_config_that_cannot_run_is_refused_up_front(tmp_path, extra, error):
    from turngym.trainer.config import load_config

    with pytest.raises(ValueError, match=error):
        load_config(None, [f"run_dir={tmp_path}", *extra])


def test_each_segment_is_its_own_training_sequence_with_its_slice_of_the_advantages():
    import numpy as np

    from tests.trainer.helpers import make_traj
    from turngym.trainer.update import segment_sequences

    one, two = make_traj([0.0, 1.0]), make_traj([1.0])
    n = len(one.token_ids)
    one.metadata["segments"] = [[0, 7], [7, n]]  # a harness that re-rendered its history after call 1
    adv = [np.arange(n, dtype=float), np.ones(len(two.token_ids))]
    seqs, advs = segment_sequences([one, two], adv)
    assert [s.token_ids for s in seqs] == [one.token_ids[:7], one.token_ids[7:], two.token_ids]
    assert [s.loss_mask for s in seqs] == [one.loss_mask[:7], one.loss_mask[7:], two.loss_mask]
    assert [a.tolist() for a in advs] == [list(range(7)), list(range(7, n)), [1.0] * len(two.token_ids)]
