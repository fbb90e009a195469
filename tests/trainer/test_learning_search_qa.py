"""Learning evidence on CPU on search-qa (the issue's test): a tiny model warm-started by a short SFT
(the tool format half-learned: about a third of sampled test episodes end with an answer) gets a
higher mean reward on a fixed evaluation set (32 test-split questions, temperature 1, same sampling
RNG) after a few GRPO steps. What is learnt is the format (answering instead of the -0.1 no-answer
penalty), not search: the 2-layer model's answers are not correct. The direction is asserted with a
margin, never a time; the numbers measured with it are in docs/credit.md ("CPU learning evidence")."""

import pytest

from turngym.trainer.config import load_config
from turngym.trainer.loop import Trainer
from turngym.trainer.metrics import read_metrics

ENV = "{n_passages: 2000, n_tasks: 4000, mix: easy, hops: [1], reward: f1, max_turns: 3, split: train}"


@pytest.mark.slow
@pytest.mark.timeout(3000)
def test_grpo_raises_the_search_qa_reward_of_an_sft_warmed_tiny_model(tmp_path):
    steps = 8
    cfg = load_config(
        None,
        [
            f"run_dir={tmp_path / 'learn'}",
            "seed=0",
            f"steps={steps}",
            "rollout.env=search-qa",
            f"rollout.env_kwargs={ENV}",
            "rollout.eval_env_kwargs={split: test}",
            "rollout.tasks_per_step=8",
            "rollout.group_size=8",
            "rollout.max_tokens=48",
            "rollout.max_context=2048",
            "rollout.eval_tasks=32",
            f"rollout.eval_every={steps}",
            "rollout.eval_temperature=1.0",
            "credit.method=grpo",
            "optim.lr=1e-3",
            "sft.steps=150",
            "sft.tasks=128",
            "sft.batch_size=8",
            "sft.lr=3e-3",
            "log.progress=false",
            "log.save_trajectories=false",
            "log.tensorboard=false",
        ],
    )
    Trainer(cfg).train()
    rows = read_metrics(tmp_path / "learn")
    before = next(r for r in rows if r["step"] == 0 and "eval/reward/outcome" in r)
    after = next(r for r in rows if r["step"] == steps and "eval/reward/outcome" in r)
    print({k: (before.get(k), after.get(k)) for k in ("eval/reward/outcome", "eval/reward/terminated")})
    assert after["eval/reward/outcome"] > before["eval/reward/outcome"] + 0.02, (before, after)
    assert after["eval/reward/terminated"] > before["eval/reward/terminated"], (before, after)
