"""``rollout.eval_judge``: held-out win rate against the start policy, by the arena's judge."""

import math

import pytest

from turngym.trainer.config import load_config
from turngym.trainer.judges import ProgrammaticJudge, judge_win_rate
from turngym.trainer.loop import Trainer
from turngym.trainer.metrics import read_metrics

from .helpers import make_traj
from .test_trainer import BASE, shorter_is_better


def seeded(outcomes, masked=()):
    out = []
    for k, o in enumerate(outcomes):
        t = make_traj([float(o)], masked=k in masked)
        t.seed = 100 + k
        out.append(t)
    return out


def test_win_rate_counts_wins_ties_losses_by_seed():
    judge = ProgrammaticJudge.from_scorer(lambda t: t.outcome)
    now, start = seeded([1, 1, 0, 2]), seeded([0, 1, 1, 2])
    m = judge_win_rate(now, start, judge)
    assert m["eval/judge/win_rate"] == pytest.approx((1 + 0.5 + 0 + 0.5) / 4)
    assert (m["eval/judge/ties"], m["eval/judge/pairs"], m["eval/judge/errors"]) == (2, 4, 0)
    # matched by seed, not by position; a task the baseline lacks is left out
    m = judge_win_rate(list(reversed(now)) + seeded([5] * 6)[4:], start, judge)
    assert m["eval/judge/win_rate"] == pytest.approx(0.5) and m["eval/judge/pairs"] == 4


def test_masked_trajectories_lose_and_a_failing_judge_is_counted_not_scored():
    judge = ProgrammaticJudge.from_scorer(lambda t: t.outcome)
    m = judge_win_rate(seeded([5, 5, 0], masked={0, 1}), seeded([0, 0, 0], masked={1, 2}), judge)
    # seed 0: masked vs unmasked -> loss; seed 1: both masked -> tie; seed 2: unmasked vs masked -> win
    assert m["eval/judge/win_rate"] == pytest.approx(0.5) and m["eval/judge/pairs"] == 3

    def broken(a, b):
        if a.outcome > 1:
            raise RuntimeError("judge server down")
        return 1.0, 0.0

    m = judge_win_rate(seeded([0, 2, 3]), seeded([0, 0, 0]), broken)
    assert (m["eval/judge/win_rate"], m["eval/judge/pairs"], m["eval/judge/errors"]) == (1.0, 1, 2)
    assert math.isnan(judge_win_rate([], seeded([0]), broken)["eval/judge/win_rate"])


def test_the_trainer_reports_win_rate_against_its_start_and_keeps_the_baseline_on_resume(tmp_path):
    run = tmp_path / "run"
    cfg = lambda steps: load_config(  # noqa: E731
        None,
        [
            f"run_dir={run}",
            *BASE,
            f"steps={steps}",
            "checkpoint_every=1",
            "rollout.eval_tasks=4",
            "rollout.eval_every=1",
            "rollout.eval_judge=true",
            "credit.method=arena",
            "credit.arena.workers=1",
        ],
    )
    judge = ProgrammaticJudge(shorter_is_better)
    Trainer(cfg(2), judge=judge).train(max_steps=1)
    baseline = run / "eval_baseline.jsonl"
    kept = baseline.read_text()
    assert len(kept.splitlines()) == 4
    Trainer(cfg(2), judge=judge).train()  # resumed: judged against the same start
    assert baseline.read_text() == kept
    rows = [r for r in read_metrics(run) if "eval/judge/win_rate" in r]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[0]["eval/judge/win_rate"] == 0.5  # the start against itself
    for r in rows[1:]:
        assert 0.0 <= r["eval/judge/win_rate"] <= 1.0 and r["eval/judge/pairs"] == 4
        assert r["eval/judge/errors"] == 0
