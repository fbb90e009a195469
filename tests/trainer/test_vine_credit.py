"""Vine credit (turngym.trainer.credit.vine): a hand-computed example, properties (telescoping sum,
unestimated stretches, normalisation), the registered method on trajectories, its refusal of flat
rollouts, the trainer config's checks and ``credit/zero_groups``."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turngym.trainer.config import load_config
from turngym.trainer.credit.pipeline import CreditPipeline, outcome_spread
from turngym.trainer.credit.registry import build_credit_pipeline
from turngym.trainer.credit.vine import Vine, vine_advantages, vine_values

from .helpers import make_traj

approx = pytest.approx


def vine_traj(rewards, samples, group="g"):
    t = make_traj(rewards, group=group)
    t.metadata["vine"] = {"samples": samples}
    return t


def test_hand_computed_example():
    # 3 turns; V(s0) from 4 continuations: 1,0,0,1 -> 0.5; V(s1): 1,1,1,0 -> 0.75; V(s2) not
    # estimated (tool-only mode skipped it); R = 1.
    # filled values: V0 = 0.5, V1 = 0.75, V2 = V3 = R = 1
    # A = [0.75 - 0.5, 1 - 0.75, 1 - 1] = [0.25, 0.25, 0]
    assert vine_advantages([0.5, 0.75, None], 1.0, baseline=0.3) == approx([0.25, 0.25, 0.0])
    # V(s0) unknown -> the group baseline 0.3; V1 = 0.75 -> A0 = 0.45
    assert vine_advantages([None, 0.75, 0.5], 0.0, baseline=0.3) == approx([0.45, -0.25, -0.5])
    t = vine_traj([0.0, 0.0, 1.0], [[1, 0, 0, 1], [1, 1, 1, 0], []])
    assert vine_values(t) == [0.5, 0.75, None]
    other = vine_traj([0.0], [[0.0, 0.0]])  # a one-turn failure in the same group: V0 = 0, R = 0
    credit = Vine().group_advantages([t, other])
    assert credit.advantages == [approx([0.25, 0.25, 0.0]), approx([0.0])]
    assert credit.metrics["vine/estimated_frac"] == approx(3 / 4)


values_st = st.lists(st.one_of(st.none(), st.floats(-1, 1)), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(values_st, st.floats(-1, 1), st.floats(-1, 1))
def test_advantages_telescope_to_outcome_minus_first_value(values, outcome, baseline):
    adv = vine_advantages(values, outcome, baseline)
    v0 = values[0] if values[0] is not None else baseline
    assert len(adv) == len(values)
    assert sum(adv) == approx(outcome - v0, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(values_st, st.floats(-1, 1), st.floats(-1, 1))
def test_a_turn_acting_in_an_unestimated_state_gets_no_credit(values, outcome, baseline):
    """A_t = V_{t+1} - V_t = 0 when V_t (t > 0) was not estimated (it takes the next estimate):
    no credit is invented for a turn whose state nobody measured."""
    adv = vine_advantages(values, outcome, baseline)
    for t in range(1, len(values)):
        if values[t] is None:
            assert adv[t] == 0.0
    # every value estimated: exactly the differences of consecutive values
    if all(v is not None for v in values):
        full = [*values, outcome]
        assert adv == approx([full[t + 1] - full[t] for t in range(len(values))])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([0.0, 1.0]), min_size=2, max_size=6), st.floats(0.0, 1.0))
def test_norm_by_std_scales_every_advantage_by_the_group_std(outcomes, v0):
    group = [vine_traj([r], [[v0]]) for r in outcomes]
    plain = Vine().group_advantages(group).advantages
    normed = Vine(norm_by_std=True).group_advantages(group).advantages
    import numpy as np

    s = float(np.std(outcomes)) + 1e-6
    assert [a[0] for a in normed] == approx([a[0] / s for a in plain])


def test_registered_method_writes_turn_advantages_and_refuses_flat_rollouts():
    cfg = load_config(None, ["credit.method=vine", "credit.vine.k=2"])
    pipeline = build_credit_pipeline(cfg.credit)
    assert isinstance(pipeline, CreditPipeline) and pipeline.method_name == "vine"
    trajs = [vine_traj([0.0, 1.0], [[0.0, 1.0], [1.0, 1.0]]), vine_traj([0.0], [[0.5, 0.5]])]
    out = pipeline(trajs)
    assert out.turn_advantages == [approx([0.5, 0.0]), approx([-0.5])]
    assert trajs[0].turns[0].info["advantages"]["vine"] == approx(0.5)
    assert out.metrics["credit/zero_groups"] == 0.0
    with pytest.raises(ValueError, match="vine rollouts"):
        pipeline([make_traj([1.0])])


def test_config_wires_the_vine_rollout_and_refuses_trees():
    cfg = load_config(None, ["credit.method=vine", "credit.vine.k=3", "credit.vine.turns=tool"])
    vine = cfg.credit.options("vine").rollout_config()
    assert (vine.k, vine.turns) == (3, "tool")
    with pytest.raises(ValueError, match="unset rollout.tree"):
        load_config(None, ["credit.method=vine", "rollout.tree={k: 2}"])
    with pytest.raises(ValueError):
        load_config(None, ["credit.method=vine", "credit.vine.turns=some"])


def test_zero_groups_counts_groups_without_outcome_spread():
    trajs = [make_traj([r], group=g) for g, r in [("a", 0.0), ("a", 0.0), ("b", 1.0), ("b", 1.0), ("c", 0.0)]]
    trajs += [make_traj([1.0], group="c")]
    m = outcome_spread(trajs, [[0, 1], [2, 3], [4, 5]])
    assert m == {"credit/zero_groups": approx(2 / 3), "credit/all_zero_groups": approx(1 / 3)}
    out = build_credit_pipeline(load_config(None, []).credit)(trajs)  # grpo logs it as every method does
    assert out.metrics["credit/zero_groups"] == approx(2 / 3)
