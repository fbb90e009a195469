"""``pointwise``: GRPO over per-trajectory judge scores (the baseline of ``arena``'s tournaments)."""

import asyncio
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turngym.trainer.config import load_config
from turngym.trainer.credit import Pointwise, grpo
from turngym.trainer.orchestrator import build_credit

from .helpers import make_traj


def trajs(outcomes, turns=2):
    return [make_traj([0.0] * (turns - 1) + [float(o)], group="g") for o in outcomes]


@settings(max_examples=100)
@given(st.lists(st.floats(-10, 10, allow_nan=False), min_size=1, max_size=8), st.booleans())
def test_advantages_are_grpo_over_the_scores(scores, norm):
    group = trajs([0.0] * len(scores))
    by_id = {id(t): s for t, s in zip(group, scores, strict=True)}
    credit = Pointwise(lambda t: by_id[id(t)], norm_by_std=norm).group_advantages(group)
    expected = grpo(scores, norm)
    for adv, e in zip(credit.advantages, expected, strict=True):
        assert adv == pytest.approx([e, e])  # broadcast to every turn
    assert credit.metrics["pointwise/calls"] == len(scores)
    assert credit.metrics["pointwise/score_mean"] == pytest.approx(np.mean(scores))


@pytest.mark.parametrize(
    "bad", [lambda t: math.nan, lambda t: math.inf, lambda t: "ten", lambda t: t.no_such]
)
def test_a_failing_scorer_zeroes_its_group_and_is_counted(bad):
    group = trajs([0.0, 1.0, 2.0])
    credit = Pointwise(bad).group_advantages(group)
    assert all(a == [0.0, 0.0] for a in credit.advantages)
    assert credit.metrics == {"pointwise/failed_groups": 1.0}


def test_one_bad_score_does_not_rank_its_siblings():
    group = trajs([0.0, 1.0, 2.0])
    scores = {id(group[0]): 1.0, id(group[1]): math.nan, id(group[2]): 3.0}
    credit = Pointwise(lambda t: scores[id(t)]).group_advantages(group)
    assert all(a == [0.0, 0.0] for a in credit.advantages)


def test_the_default_scorer_is_the_outcome_and_the_method_is_then_grpo():
    pipeline = build_credit(load_config(None, ["credit.method=pointwise"]))
    group = trajs([0.0, 1.0, 1.0, 3.0])
    out = pipeline(group)
    grpo_out = build_credit(load_config(None, ["credit.method=grpo"]))(trajs([0.0, 1.0, 1.0, 3.0]))
    assert np.allclose(out.turn_advantages, grpo_out.turn_advantages)
    assert out.metrics["pointwise/calls"] == 4


def test_the_scorer_comes_from_the_settings_then_the_env():
    from turngym.envs.travel.judge import score_trajectory

    travel = build_credit(load_config(None, ["credit.method=pointwise", "rollout.env=travel-open"]))
    assert travel.method.score is score_trajectory  # the env's published pointwise judge
    named = load_config(
        None,
        ["credit.method=pointwise", "credit.pointwise.scorer=turngym.envs.travel.judge:score_trajectory"],
    )
    assert build_credit(named).method.score is score_trajectory
    for bad in ("score_trajectory", "turngym.envs.travel.judge:RUBRIC", "turngym.envs.travel.judge:nope"):
        with pytest.raises(ValueError, match="credit.pointwise.scorer"):
            build_credit(load_config(None, ["credit.method=pointwise", f"credit.pointwise.scorer={bad}"]))


def test_real_travel_open_episodes_are_ranked_as_the_arena_judge_ranks_them():
    """Scripted travel-open episodes cut at 3, 6 and 11 turns: the env's rubric scores them alone
    (pointwise) in the order its pairwise judge (arena) puts them, and the advantages follow."""
    from turngym.agents.scripted import ScriptedAgent
    from turngym.rollout.engine import RolloutConfig, RolloutEngine
    from turngym.trainer.credit import build_judge
    from turngym.trainer.credit.arena import ArenaSettings

    group = []
    for max_turns in (3, 6, 11):
        engine = RolloutEngine(
            "travel-open", ScriptedAgent(), RolloutConfig(group_size=1), env_kwargs={"max_turns": max_turns}
        )
        (t,) = asyncio.run(engine.run([0]))
        t.group = "g"
        group.append(t)
    pipeline = build_credit(load_config(None, ["credit.method=pointwise", "rollout.env=travel-open"]))
    out = pipeline(group)
    first = [a[0] for a in out.turn_advantages]
    assert first[0] < first[1] < first[2]
    judge = build_judge(ArenaSettings(), "travel-open")
    for a, b in ((0, 1), (1, 2), (0, 2)):
        sa, sb = judge(group[a], group[b])
        assert sa < sb
    assert 0 < out.metrics["pointwise/score_mean"] <= 10


def test_open_ended_envs_give_warm_start_demonstrations():
    """travel-open has no outcome (always 0): its expert's finished episodes are the SFT data, so a
    pointwise/arena run can start from a warm start as the other families do; travel-planner keeps
    only passing plans."""
    from turngym.core.registry import spec
    from turngym.trainer.sft import expert_trajectories

    assert spec("travel-open").open_ended() and not spec("travel-planner").open_ended()
    demos = expert_trajectories("travel-open", range(2))
    assert len(demos) == 2 and all(t.terminated and t.outcome == 0 for t in demos)
    cut = expert_trajectories("travel-open", range(2), {"max_turns": 3})  # unfinished: not demonstrations
    assert cut == []
