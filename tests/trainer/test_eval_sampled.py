"""The held-out eval of the policy's own samples (``rollout.eval_samples``) beside the greedy one:
episode counts, metric names, masked episodes counted as failures, reproducibility under a seed, and
the before/after lines that ``turngym train`` and the report print for both."""

import json

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.trainer.helpers import make_traj
from turngym.trainer.commands import heldout_summary
from turngym.trainer.config import load_config
from turngym.trainer.loop import Trainer
from turngym.trainer.metrics import sampled_metrics
from turngym.viewer.report import eval_summaries, eval_summary, write_report

BASE = [
    "rollout.env=arith",
    "rollout.env_kwargs={depth: 1, max_turns: 2}",
    "rollout.max_tokens=8",
    "rollout.eval_tasks=3",
    "rollout.eval_samples=4",
    "log.progress=false",
]


def orchestrator(tmp_path, name, *extra):
    t = Trainer(load_config(None, [f"run_dir={tmp_path / name}", *BASE, *extra]))
    t.setup()
    return t.orchestrator


def test_sampled_eval_counts_names_and_determinism(tmp_path):
    a = orchestrator(tmp_path, "a", "seed=3")
    rng = torch.get_rng_state()
    first = a.evaluate()
    assert torch.equal(torch.get_rng_state(), rng)  # the training RNG is left as it was
    assert first["eval/episodes"] == 3.0  # one greedy episode per held-out task
    assert first["eval/sampled/episodes"] == 12.0  # eval_samples per task
    for name in ("reward/success", "reward/outcome", "reward/masked_frac", "pass_at_k"):
        assert f"eval/sampled/{name}" in first
        assert 0.0 <= first["eval/sampled/pass_at_k"] <= 1.0
    # the same eval every time it runs, and in another trainer with the same seed
    assert a.evaluate() == first
    assert orchestrator(tmp_path, "b", "seed=3").evaluate() == first
    # the samples really are sampled (T=1): the random tiny model's episodes differ from the greedy ones
    trajs, _ = a.rollout([1_000_000], 4, 1.0)
    assert len({tuple(t.token_ids) for t in trajs}) > 1


def test_no_sampled_eval_unless_asked(tmp_path):
    m = orchestrator(tmp_path, "off", "rollout.eval_samples=0").evaluate()
    assert "eval/reward/success" in m and not any(k.startswith("eval/sampled/") for k in m)


def test_masked_sampled_episodes_count_as_failures(tmp_path):
    # every episode times out at its reset (a real engine fault): all masked, none a success
    m = orchestrator(tmp_path, "masked", "rollout.turn_timeout=1e-9").evaluate()
    assert m["eval/sampled/episodes"] == 12.0
    assert m["eval/sampled/reward/masked_frac"] == 1.0
    assert m["eval/sampled/reward/success"] == 0.0 and m["eval/sampled/reward/outcome"] == 0.0
    assert m["eval/sampled/pass_at_k"] == 0.0
    assert "eval/sampled/reward/outcome_unmasked" not in m  # no survivors to average over


def test_sampled_metrics_masked_survivor_scores_do_not_count():
    won, lost = make_traj([1.0], group="a"), make_traj([-0.1], group="a")  # outcome: the last turn's reward
    masked = make_traj([1.0], group="b", masked=True)  # a masked episode's score is not believed
    m = sampled_metrics([won, lost, masked])
    assert m["episodes"] == 3.0
    assert m["reward/success"] == 1 / 3 and m["reward/masked_frac"] == 1 / 3
    assert m["pass_at_k"] == 0.5  # task a has a success, task b none
    assert sampled_metrics([]) == {}


@settings(max_examples=60)
@given(
    st.integers(1, 4).flatmap(
        lambda k: st.lists(
            st.lists(
                st.tuples(st.sampled_from([-0.1, 0.0, 0.5, 1.0]), st.booleans()), min_size=k, max_size=k
            ),
            min_size=1,
            max_size=5,
        )
    )
)
def test_sampled_metrics_properties(tasks):
    """k episodes per task (as the eval samples them): success and pass@k count unmasked wins only,
    and pass@k is never below the mean success."""
    trajs = [
        make_traj([o], group=f"task{i}", masked=masked) for i, eps in enumerate(tasks) for o, masked in eps
    ]
    m = sampled_metrics(trajs)
    wins = [[o >= 1.0 and not masked for o, masked in eps] for eps in tasks]
    assert m["episodes"] == len(trajs)
    assert m["reward/success"] == sum(map(sum, wins)) / len(trajs)
    assert m["pass_at_k"] == sum(map(any, wins)) / len(tasks)
    assert m["pass_at_k"] >= m["reward/success"] - 1e-12
    assert m["reward/masked_frac"] == sum(masked for eps in tasks for _, masked in eps) / len(trajs)


ROWS = [
    {"step": 0, "eval_before_sft/reward/success": 0.0, "eval_before_sft/sampled/reward/success": 0.0},
    {
        "step": 0,
        "eval/reward/success": 0.5,
        "eval/reward/outcome": 0.4,
        "eval/episodes": 64.0,
        "eval/sampled/reward/success": 0.25,
        "eval/sampled/reward/outcome": 0.1,
        "eval/sampled/pass_at_k": 0.5,
        "eval/sampled/episodes": 256.0,
        "eval/sampled/reward/masked_frac": 0.0,
    },
    {"step": 1, "reward/success": 0.3},
    {
        "step": 40,
        "eval/reward/success": 0.5,
        "eval/reward/outcome": 0.4,
        "eval/episodes": 64.0,
        "eval/sampled/reward/success": 0.375,
        "eval/sampled/reward/outcome": 0.25,
        "eval/sampled/pass_at_k": 0.625,
        "eval/sampled/episodes": 256.0,
        "eval/sampled/reward/masked_frac": 0.125,
    },
]


def test_summary_lines_for_both_evals(tmp_path):
    sampled = eval_summary(ROWS, "eval/sampled/")
    assert sampled == (
        "held-out sampled success 0.00 (before training) -> 0.25 (step 0) -> 0.38 (step 40); "
        "outcome +0.100 -> +0.250; pass@4 0.50 -> 0.62; masked 0% -> 12%"
    )
    assert eval_summaries(ROWS) == [eval_summary(ROWS), sampled]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    assert heldout_summary(tmp_path).splitlines() == eval_summaries(ROWS)  # turngym train's last lines
    # a run without the sampled eval: the greedy line alone
    greedy = [{k: v for k, v in r.items() if "sampled" not in k} for r in ROWS]
    assert eval_summaries(greedy) == [eval_summary(greedy)]


def test_report_plots_and_heads_with_both_evals(tmp_path):
    import turngym
    from turngym.core.types import Message, Trajectory
    from turngym.rollout.store import save_jsonl

    env = turngym.make("arith", depth=1, max_turns=3)
    obs, info = env.reset(seed=0)
    t = Trajectory.start(obs, info, env_id="arith-v0", seed=0, group="g0", sample=0)
    obs, r, term, trunc, info = env.step(env.expert_action())
    t.record_step(Message(role="assistant", content="x"), obs, r, term, trunc, info)
    (tmp_path / "trajectories").mkdir()
    save_jsonl([t], tmp_path / "trajectories" / "step-000001.jsonl")
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    html = write_report(tmp_path).read_text()
    head = html[: html.index('<section class="plots">')]
    assert "held-out success 0.00 (before training)" in head
    assert "held-out sampled success 0.00 (before training)" in head
    assert "eval/sampled/reward/success" in html and "eval/reward/success" in html  # both curves' legend
