"""The report's held-out eval curve and before/after headline, from a training run's metrics.jsonl."""

import json

import turngym
from turngym.core.types import Message, Trajectory
from turngym.rollout.store import TrajectoryWriter
from turngym.viewer.report import build_report, eval_summary, write_report

METRICS = [
    {"step": 0, "sft/loss_first": 6.9, "sft/loss_last": 0.1},
    {"step": 0, "eval/reward/outcome": 0.125, "eval/reward/success": 0.125, "eval/reward/masked_frac": 0.0},
    {"step": 1, "reward/outcome": 0.2, "reward/success": 0.2},
    {
        "step": 2,
        "reward/outcome": 0.4,
        "reward/success": 0.4,
        "eval/reward/outcome": 0.5,
        "eval/reward/success": 0.4375,
        "eval/reward/masked_frac": 0.0625,
    },
]


def _run_dir(tmp_path, metrics):
    env = turngym.make("arith", depth=1, max_turns=3)
    obs, info = env.reset(seed=0)
    t = Trajectory.start(obs, info, env_id="arith-v0", seed=0, group="g0", sample=0)
    obs, r, term, trunc, info = env.step(env.expert_action())
    t.record_step(Message(role="assistant", content="x"), obs, r, term, trunc, info)
    steps = tmp_path / "trajectories"
    steps.mkdir()
    with TrajectoryWriter(tmp_path / "tmp") as w:
        w.write(t)
    (steps / "step-000001.jsonl").write_text((tmp_path / "tmp" / "trajectories.jsonl").read_text())
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(m) for m in metrics))
    return tmp_path


def test_eval_summary_first_and_last_eval():
    line = eval_summary(METRICS)
    assert line == (
        "held-out success 0.12 (step 0) -> 0.44 (step 2); outcome +0.125 -> +0.500; masked 0% -> 6%"
    )
    assert eval_summary(METRICS[:3]) is None  # one eval only: no before/after
    assert eval_summary([]) is None


def test_report_plots_eval_curve_and_heads_with_before_after(tmp_path):
    out = write_report(_run_dir(tmp_path, METRICS))
    html = out.read_text()
    head = html[: html.index('<section class="plots">')]
    assert "held-out success 0.12 (step 0) -&gt; 0.44 (step 2)" in head  # in the title, at the top
    assert 'title="held-out eval"' in html  # the eval curve beside the training one
    assert 'title="reward and success over steps"' in html
    assert html.index('title="held-out eval"') < html.index('title="reward and success over steps"')
    assert "eval/reward/success" in html and "eval/reward/outcome" in html  # legend of the eval plot


def test_report_without_eval_has_no_eval_plot(tmp_path):
    rows = [m for m in METRICS if not any(k.startswith("eval/") for k in m)]
    html = write_report(_run_dir(tmp_path, rows)).read_text()
    assert 'title="held-out eval"' not in html
    assert "held-out success" not in html


def test_build_report_eval_plot_from_metrics(tmp_path):
    env = turngym.make("arith", depth=1, max_turns=3)
    obs, info = env.reset(seed=0)
    t = Trajectory.start(obs, info, env_id="arith-v0", seed=0, group="g0", sample=0)
    html = build_report([t], metrics=METRICS)
    assert 'title="held-out eval"' in html


def test_eval_summary_starts_from_the_untrained_policy_when_it_was_evaluated():
    pre = {"step": 0, "eval_before_sft/reward/success": 0.0, "sft/loss_first": 6.9, "sft/loss_last": 0.1}
    line = eval_summary([pre, *METRICS[1:]])
    assert line.startswith("held-out success 0.00 (before training) -> 0.12 (step 0) -> 0.44 (step 2); ")
