"""``turngym train``'s closing line: held-out success and outcome before and after, masked fraction."""

import json

from turngym.trainer.commands import heldout_summary


def _write(tmp_path, rows):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_summary_line_from_first_and_last_eval(tmp_path):
    run = _write(
        tmp_path,
        [
            {"step": 0, "sft/loss_last": 0.1},
            {
                "step": 0,
                "eval/reward/outcome": -0.1,
                "eval/reward/success": 0.0,
                "eval/reward/masked_frac": 0.25,
            },
            {"step": 5, "reward/outcome": 0.3, "eval/reward/outcome": 0.2, "eval/reward/success": 0.2},
            {"step": 10, "reward/outcome": 0.5, "eval/reward/outcome": 0.75, "eval/reward/success": 0.5},
        ],
    )
    assert heldout_summary(run) == (
        "held-out success 0.00 (step 0) -> 0.50 (step 10); outcome -0.100 -> +0.750; masked 25% -> 0%"
    )


def test_no_summary_without_two_evals(tmp_path):
    assert heldout_summary(tmp_path) is None  # no metrics.jsonl
    run = _write(tmp_path, [{"step": 1, "reward/outcome": 0.3}, {"step": 0, "eval/reward/success": 0.1}])
    assert heldout_summary(run) is None
