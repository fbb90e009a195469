"""The credit pipeline over trajectories: grouping, masking, token broadcast, each method's adapter."""

import math
from types import SimpleNamespace

import numpy as np
import pytest

from turngym.trainer.credit import (
    GRPO,
    IGPO,
    Arena,
    CreditPipeline,
    DualLevel,
    Gated,
    GiGPO,
    OutcomeReward,
    grpo,
    igpo,
    token_advantages,
)
from turngym.trainer.credit.info_gain import InfoGains
from turngym.trainer.judges import outcome_judge

from .helpers import make_traj


def test_token_broadcast_follows_gen_spans_and_loss_mask():
    t = make_traj([0.0, 1.0], gen=3, obs=2, prompt=4)
    t.loss_mask[5] = 0  # a sampled token the engine masked out
    adv = token_advantages(t, [0.5, -1.0])
    assert adv.tolist() == [0, 0, 0, 0, 0.5, 0, 0.5, 0, 0, -1, -1, -1]


def test_grpo_pipeline_groups_by_task_and_skips_masked():
    trajs = [
        make_traj([0.0, 1.0], group="a"),
        make_traj([0.0], group="a"),
        make_traj([5.0], group="a", masked=True),
        make_traj([2.0], group="b"),
    ]
    out = CreditPipeline(GRPO())(trajs)
    a = grpo([1.0, 0.0])
    assert out.turn_advantages[0] == pytest.approx([a[0], a[0]])
    assert out.turn_advantages[1] == pytest.approx([a[1]])
    assert out.turn_advantages[2] == [0.0]  # masked: left out of the group, zero everywhere
    assert not out.token_advantages[2].any()
    assert out.turn_advantages[3] == [0.0]  # G=1
    assert out.metrics["credit/groups"] == 2 and out.metrics["credit/masked"] == 1
    # observation tokens of trajectory 0 stay at 0
    t0 = trajs[0]
    s, e = t0.turns[0].obs_span
    assert not out.token_advantages[0][s:e].any()


def test_empty_batch_and_turnless_trajectories():
    assert CreditPipeline(GRPO())([]).turn_advantages == []
    t = make_traj([])
    out = CreditPipeline(GRPO())([t])
    assert out.turn_advantages == [[]] and out.token_advantages[0].tolist() == [0.0] * 4


def gains_scorer(pairs):
    """A scorer that knows each trajectory's gains: ``pairs`` = [(trajectory, gains or None)]."""

    def score(trajs):
        known = {id(t): g for t, g in pairs}
        return InfoGains([known.get(id(t)) for t in trajs], {"ig/scored": float(len(trajs))})

    return SimpleNamespace(score=score)


def igpo_pipeline(pairs, **kw):
    method = IGPO(scorer=gains_scorer(pairs), **kw)
    return CreditPipeline(method, prepare=method.prepare)


def test_igpo_pipeline_reads_the_scorers_gains_and_falls_back():
    ref = {"answer": "Paris"}
    good = make_traj([0.0, 0.0, 1.0], reference=ref)
    bad = make_traj([0.0, 0.5], reference=ref)
    missing = make_traj([0.0, 0.0], reference=ref, terminated=False)  # no answer: outcome -2
    short = make_traj([0.0, 0.0, 1.0], reference=ref)  # one gain for two tool turns
    pairs = [(good, [0.2, 0.0]), (bad, [float("nan")]), (missing, None), (short, [0.4])]
    out = igpo_pipeline(pairs)([good, bad, missing, short])
    expect = igpo([[0.2, 0.0], [None], [None], [None, None]], [1.0, 0.5, -2.0, 1.0])
    assert out.turn_advantages == [pytest.approx(e) for e in expect]
    assert out.metrics["igpo/ig_fallback"] == 3.0 and out.metrics["ig/scored"] == 4.0
    assert out.metrics["igpo/flat_groups"] == 0.0 and out.metrics["igpo/flat_adv_mean"] == 0.0


def test_igpo_reads_no_gain_from_the_turns_info():
    """The old side channel (``turn.info["info_gain"]``) is not read: without a scorer every
    trajectory is paid its outcome only."""
    ref = {"answer": "Paris"}
    trajs = [
        make_traj([0.0, 1.0], reference=ref, infos=[{"info_gain": 0.9}, {}]),
        make_traj([0.0, 0.0], reference=ref, infos=[{"info_gain": 0.1}, {}]),
    ]
    method = IGPO()
    out = CreditPipeline(method, prepare=method.prepare)(trajs)
    assert out.metrics["igpo/ig_fallback"] == 2.0
    assert out.turn_advantages == [pytest.approx(e) for e in igpo([[None], [None]], [1.0, 0.0])]


def test_igpo_refuses_a_scorer_that_loses_trajectories():
    t = make_traj([0.0, 1.0], reference={"answer": "Paris"})
    method = IGPO(scorer=SimpleNamespace(score=lambda trajs: InfoGains([], {})))
    with pytest.raises(ValueError, match="0 gain lists for 1 trajectories"):
        CreditPipeline(method, prepare=method.prepare)([t])


def test_igpo_reports_groups_with_equal_outcomes_and_their_advantage_offset():
    ref = {"answer": "Paris"}

    def traj(group, igs):  # tool turns with these IGs, then a correct answer
        return make_traj([0.0] * len(igs) + [1.0], reference=ref, group=group), igs

    pairs = [traj("a", [0.01, 0.45]), traj("a", [0.01, 0.45, 0.0]), traj("b", [0.3]), traj("b", [0.3])]
    pairs.append((make_traj([0.0, 0.0], reference=ref, group="b"), [0.3]))
    trajs = [t for t, _ in pairs]
    raw = igpo_pipeline(pairs)(trajs).metrics
    assert raw["igpo/flat_groups"] == 0.5  # group a: both correct; group b: one wrong answer
    assert raw["igpo/flat_adv_mean"] > 0.25  # group a's common offset, averaged over the 2 groups
    centred = igpo_pipeline(pairs, returns="depth_center")(trajs).metrics
    assert centred["igpo/flat_groups"] == 0.5 and centred["igpo/flat_adv_mean"] == pytest.approx(
        0.0, abs=1e-9
    )


def test_igpo_without_reference_is_grpo():
    trajs = [make_traj([0.0, 1.0]), make_traj([0.0, 0.0])]
    out = CreditPipeline(IGPO())(trajs)
    g = grpo([1.0, 0.0])
    assert out.turn_advantages == [pytest.approx([g[0]] * 2), pytest.approx([g[1]] * 2)]
    assert out.metrics["igpo/no_reference"] == 1.0


def test_gated_pipeline_logs_outcome_and_total_separately():
    comps = [
        [{"valid": 0.5}, {"valid": 0.5, "outcome": 1.0}],
        [{"valid": 0.5}, {"valid": 0.5, "outcome": 0.0}],
    ]
    trajs = [make_traj([0.5, 1.5], components=comps[0]), make_traj([0.5, 0.5], components=comps[1])]
    method = Gated(delta=1.0, high_component="outcome", low_components=("valid",))
    out = CreditPipeline(method)(trajs)
    # totals: 1 + 0.5 + 0.5 = 2 (gate open), 0 (gate closed)
    assert out.metrics["gated/total_mean"] == pytest.approx(1.0)
    assert out.metrics["gated/outcome_mean"] == pytest.approx(0.5)
    assert out.metrics["gated/gate_open_frac"] == pytest.approx(0.5)
    assert out.metrics["gated/low_mean"] == pytest.approx(1.0)  # both earned 0.5 + 0.5, gate or not
    g = grpo([2.0, 0.0])
    assert out.turn_advantages == [pytest.approx([g[0]] * 2), pytest.approx([g[1]] * 2)]
    turn = CreditPipeline(
        Gated(delta=1.0, high_component="outcome", low_components=("valid",), advantage="turn")
    )(trajs)
    assert turn.turn_advantages[0][0] > turn.turn_advantages[1][0]


def test_gated_default_reads_last_turn_reward_as_outcome():
    trajs = [make_traj([0.3, 1.0]), make_traj([0.3, 0.0])]
    out = CreditPipeline(Gated(delta=1.0))(trajs)
    assert out.metrics["gated/total_mean"] == pytest.approx((1.3 + 0.0) / 2)


def test_gigpo_pipeline_uses_acted_in_states():
    trajs = [
        make_traj([0.0, 1.0], state_keys=["s1", "s2"]),
        make_traj([0.0, 0.0], state_keys=["s1", "s3"]),
    ]
    for t in trajs:
        t.start_state_key = "s0"
    out = CreditPipeline(GiGPO(gamma=1.0, mode="mean_norm"))(trajs)
    # turn 0 of both acted in s0 (returns 1 and 0), turn 1 of both acted in s1 (returns 1 and 0)
    assert out.turn_advantages == [pytest.approx([1.0, 1.0]), pytest.approx([-1.0, -1.0])]
    assert out.metrics["gigpo/anchored_frac"] == 1.0


def test_dual_level_and_arena_pipelines():
    trajs = [make_traj([0.0, 1.0]), make_traj([0.0, 0.0]), make_traj([0.5])]
    dual = CreditPipeline(DualLevel())(trajs)
    assert all(math.isfinite(a) for row in dual.turn_advantages for a in row)
    assert dual.turn_advantages[0][0] > dual.turn_advantages[1][0]
    arena = CreditPipeline(Arena(outcome_judge(), topology="round_robin"))(trajs)
    # outcome ranking 0 > 2 > 1
    assert arena.turn_advantages[0][0] > arena.turn_advantages[2][0] > arena.turn_advantages[1][0]
    assert arena.metrics["arena/matches"] == 3


def test_method_returning_wrong_shape_is_an_error():
    class Broken:
        name = "broken"

        def group_advantages(self, group):
            from turngym.trainer.credit import GroupCredit

            return GroupCredit([[0.0] * 5 for _ in group])

    with pytest.raises(ValueError, match="5 advantages for 2 turns"):
        CreditPipeline(Broken())([make_traj([0.0, 1.0])])


def test_nonfinite_advantages_are_zeroed_and_counted():
    class Nan:
        name = "nan"

        def group_advantages(self, group):
            from turngym.trainer.credit import GroupCredit

            return GroupCredit([[float("nan")] * len(t.turns) for t in group])

    out = CreditPipeline(Nan())([make_traj([1.0, 0.0])])
    assert out.turn_advantages == [[0.0, 0.0]] and out.metrics["credit/nonfinite"] == 2
    assert np.isfinite(out.token_advantages[0]).all()


def test_outcome_reward_provider():
    t = make_traj([0.0, 0.7], components=[{}, {"f1": 0.7, "em": 0.0}])
    assert OutcomeReward()(t) == 0.7
    assert OutcomeReward(component="em")(t) == 0.0
    assert OutcomeReward(missing=-2.0)(make_traj([0.0], terminated=False)) == -2.0
    bad = make_traj([0.0, 1.0])
    bad.turns[-1].invalid_action = True
    assert OutcomeReward(missing=-2.0)(bad) == -2.0
