"""Hand-computed examples and properties of the credit methods' pure functions."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turngym.trainer.credit import dual_level, gated, gated_total, gigpo, grpo, igpo
from turngym.trainer.credit.normalize import discounted_returns, zscore

approx = pytest.approx
rewards = st.floats(-10, 10, allow_nan=False, allow_infinity=False)
groups = st.lists(rewards, min_size=0, max_size=12)
ig_groups = st.lists(st.tuples(st.lists(rewards, max_size=5), rewards), max_size=8)


# ------------------------------------------------------------------ grpo
def test_grpo_hand_computed():
    assert grpo([1.0, 0.0]) == approx([0.5 / 0.500001, -0.5 / 0.500001])
    assert grpo([1.0, 0.0, 0.0], norm_by_std=False, leave_one_out=True) == approx([1.0, -0.5, -0.5])
    std = math.sqrt(2 / 9)
    assert grpo([1.0, 0.0, 0.0], leave_one_out=True) == approx([1 / std, -0.5 / std, -0.5 / std], rel=1e-5)
    assert grpo([3.0, 1.0], norm_by_std=False) == approx([1.0, -1.0])


def test_grpo_degenerate_groups():
    assert grpo([]) == []
    assert grpo([5.0]) == [0.0]
    assert grpo([2.0, 2.0, 2.0]) == [0.0, 0.0, 0.0]
    assert grpo([7.0], leave_one_out=True) == [0.0]


@given(groups, st.booleans(), st.booleans(), st.floats(-5, 5))
def test_grpo_properties(outcomes, by_std, loo, shift):
    adv = grpo(outcomes, by_std, loo)
    assert len(adv) == len(outcomes)
    assert all(math.isfinite(a) for a in adv)
    if len(outcomes) <= 1:
        assert adv == [0.0] * len(outcomes)
    if not loo and outcomes:
        assert sum(adv) == approx(0.0, abs=1e-6)
    shifted = grpo([r + shift for r in outcomes], by_std, loo)
    assert shifted == approx(adv, abs=1e-5)
    # order-preserving: a better outcome never gets a lower advantage
    for (ra, aa), (rb, ab) in zip(
        zip(outcomes, adv, strict=True), zip(outcomes[1:], adv[1:], strict=True), strict=False
    ):
        assert (ra - rb) * (aa - ab) >= -1e-9


# ------------------------------------------------------------------ igpo
def test_igpo_joint_hand_computed():
    mean, std = 0.4, math.sqrt((0.04 + 0.36 + 0.16) / 3)
    z = lambda x: (x - mean) / (std + 1e-6)  # noqa: E731
    adv = igpo([[0.2], []], [1.0, 0.0])
    assert adv[0] == approx([z(0.2) + z(1.0), z(1.0)])
    assert adv[1] == approx([z(0.0)])
    adv = igpo([[0.2], []], [1.0, 0.0], gamma=0.5)
    assert adv[0] == approx([z(0.2) + 0.5 * z(1.0), z(1.0)])


def test_igpo_separate_uses_own_pools():
    # IG pool [0.2] has one element: std 1, so its normalised value is 0; outcomes [1, 0] -> ±1
    adv = igpo([[0.2], []], [1.0, 0.0], norm="separate")
    assert adv[0] == approx([1.0, 1.0], rel=1e-5)
    assert adv[1] == approx([-1.0], rel=1e-5)
    # two IG values: their own mean/std, independent of the outcomes
    adv = igpo([[0.1, 0.3]], [5.0], norm="separate", gamma=0.0)
    assert adv[0] == approx([-1.0, 1.0, 0.0], rel=1e-5)


def test_igpo_zero_ig_counts_as_position_and_none_does_not():
    with_zero = igpo([[0.0], [0.0]], [1.0, 0.0], gamma=0.0)
    without = igpo([[None], [None]], [1.0, 0.0], gamma=0.0)
    # zeros join the pool (mean 0.25) and pull the outcome z-scores; None positions do not
    assert with_zero[0][1] != approx(without[0][1])
    assert without[0] == approx([0.0, 1.0], rel=1e-5)
    assert without[1] == approx([0.0, -1.0], rel=1e-5)


def test_igpo_degenerate():
    assert igpo([], []) == []
    assert igpo([[]], [1.0]) == [[0.0]]
    with pytest.raises(ValueError):
        igpo([[0.1]], [1.0, 2.0])
    with pytest.raises(ValueError):
        igpo([[0.1]], [1.0], norm="other")
    with pytest.raises(ValueError, match="returns must be one of"):
        igpo([[0.1]], [1.0], returns="other")


def test_igpo_raw_returns_carry_an_offset_that_depth_centring_removes():
    # every trajectory answers correctly; two of them make a third, useless search (IG 0)
    ig = [[0.01, 0.45], [0.01, 0.45], [0.01, 0.45, 0.0], [0.01, 0.45, 0.0]]
    raw = igpo(ig, [1.0] * 4)
    # the paper's returns reinforce every turn of this all-equal group, the useless search too
    assert raw[2][2] > 0 and np.mean([a for r in raw for a in r]) > 0.5
    centred = igpo(ig, [1.0] * 4, returns="depth_center")
    for t in range(4):  # a zero-mean baseline per turn depth
        assert sum(r[t] for r in centred if len(r) > t) == approx(0.0, abs=1e-9)
    assert centred[0] == approx([0.51] * 3, abs=0.01) and centred[2][:3] == approx([-0.51] * 3, abs=0.01)
    assert centred[2][3] == 0.0  # the answer turns at depth 3 are equal: their mean is the baseline
    scaled = igpo(ig, [1.0] * 4, returns="depth_zscore")
    assert np.std([a for r in scaled for a in r]) == approx(1.0, rel=1e-4)
    assert scaled[0][0] / centred[0][0] == approx(scaled[2][1] / centred[2][1])


@given(
    ig_groups,
    st.sampled_from(["joint", "separate"]),
    st.floats(0, 1),
    st.sampled_from(["depth_center", "depth_zscore"]),
)
def test_igpo_depth_normalised_returns_properties(group, norm, gamma, returns):
    ig = [g[0] for g in group]
    out = [g[1] for g in group]
    adv = igpo(ig, out, gamma, norm, returns)
    raw = igpo(ig, out, gamma, norm)
    assert [len(a) for a in adv] == [len(i) + 1 for i in ig]
    assert all(math.isfinite(a) for row in adv for a in row)
    for t in range(max((len(r) for r in adv), default=0)):
        col = [r[t] for r in adv if len(r) > t]
        assert sum(col) == approx(0.0, abs=1e-6 * max(1.0, *map(abs, col)))
        # the same order as the raw returns at that depth (a common shift and a positive scale)
        rc = [r[t] for r in raw if len(r) > t]
        for a, b in zip(range(len(col)), range(1, len(col)), strict=False):
            assert (rc[a] - rc[b]) * (col[a] - col[b]) >= -1e-6


@given(ig_groups, st.sampled_from(["joint", "separate"]), st.floats(0, 1), st.floats(-3, 3))
def test_igpo_properties(group, norm, gamma, shift):
    ig = [g[0] for g in group]
    out = [g[1] for g in group]
    adv = igpo(ig, out, gamma, norm)
    assert [len(a) for a in adv] == [len(i) + 1 for i in ig]
    assert all(math.isfinite(a) for row in adv for a in row)
    shifted = igpo([[v + shift for v in i] for i in ig], [o + shift for o in out], gamma, norm)
    if norm == "joint":  # one pool: a common shift of every reward changes nothing
        assert [a for r in shifted for a in r] == approx([a for r in adv for a in r], abs=1e-4)


# ------------------------------------------------------------------ gated
def test_gated_hand_computed():
    out = gated([1.0, 0.0], [[0.5, 0.5], [0.5, 0.5]], delta=1.0, gamma=0.5)
    assert out[0] == approx([0.5, 0.25 + 1.0])
    assert out[1] == [0.0, 0.0]
    # sum of the per-turn form = two-level total r_high + gate * Σ γ^t r_low
    assert sum(out[0]) == approx(1.0 + 0.5 + 0.25)
    assert gated([2.0], [[]], delta=1.0) == [[]]


def test_gated_total_multi_level():
    assert gated_total([1.0, 0.5, [0.1, 0.1]], [1.0, 1.0]) == approx(1.5)  # level 1 fails: level 2 gated
    assert gated_total([1.0, 1.0, [0.1, 0.1]], [1.0, 1.0]) == approx(2.2)
    assert gated_total([0.0, 1.0, 1.0], [1.0, 0.0]) == approx(0.0)  # top gate closed: nothing below counts
    assert gated_total([1.0, 2.0, [1.0, 1.0]], [0.5, 0.5], gamma=0.5) == approx(4.5)
    with pytest.raises(ValueError):
        gated_total([1.0, 2.0, 3.0], [0.5])


@given(st.lists(st.tuples(rewards, st.lists(rewards, min_size=1, max_size=5)), max_size=6), rewards)
def test_gated_gate_closed_means_outcome_only(group, delta):
    high = [g[0] for g in group]
    low = [g[1] for g in group]
    for h, lows, r in zip(high, low, gated(high, low, delta), strict=True):
        if h < delta:
            assert r[:-1] == [0.0] * (len(lows) - 1) and r[-1] == approx(h)
        else:
            assert sum(r) == approx(h + sum(lows), abs=1e-6)


# ------------------------------------------------------------------ gigpo
def test_gigpo_hand_computed():
    adv = gigpo([[0.0, 1.0], [0.0, 0.0]], [["s0", "a"], ["s0", "b"]], [1.0, 0.0], gamma=0.5, mode="mean_norm")
    assert adv == [approx([0.75, 0.5]), approx([-0.75, -0.5])]


def test_gigpo_singletons_and_none_keys_give_episode_advantage():
    adv = gigpo([[1.0, 2.0], [3.0]], [[None, "x"], ["y"]], [1.0, 0.0])
    ep = grpo([1.0, 0.0])
    assert adv == [approx([ep[0]] * 2), approx([ep[1]])]


@given(
    st.lists(st.lists(st.tuples(rewards, st.sampled_from(["a", "b", "c", None])), max_size=4), max_size=6),
    st.sampled_from(["mean_std_norm", "mean_norm"]),
    st.booleans(),
)
def test_gigpo_properties(group, mode, step_std):
    r = [[x for x, _ in traj] for traj in group]
    k = [[s for _, s in traj] for traj in group]
    out = [sum(x) for x in r]
    adv = gigpo(r, k, out, mode=mode, step_norm_by_std=step_std)
    assert [len(a) for a in adv] == [len(x) for x in r]
    assert all(math.isfinite(a) for row in adv for a in row)
    if step_std:
        return
    # the step advantages of one anchor group sum to zero
    ep = grpo(out, norm_by_std=mode == "mean_std_norm")
    sums: dict = {}
    for i, (row, keys) in enumerate(zip(adv, k, strict=True)):
        for a, key in zip(row, keys, strict=True):
            if key is not None:
                sums[key] = sums.get(key, 0.0) + a - ep[i]
    assert all(abs(v) < 1e-4 for v in sums.values())


# ------------------------------------------------------------------ dual level
def test_dual_level_hand_computed():
    adv = dual_level([[1.0, 0.0], [0.0, 0.0]], lam=0.5)
    one = 0.5 / 0.500001
    assert adv[0] == approx([0.5 * (one + one), 0.5 * one])
    assert adv[1] == approx([0.5 * (-one - one), -0.5 * one])


@given(st.lists(st.lists(rewards, max_size=5), max_size=6), st.floats(0, 1))
def test_dual_level_properties(turn_rewards, lam):
    adv = dual_level(turn_rewards, lam)
    assert [len(a) for a in adv] == [len(r) for r in turn_rewards]
    assert all(math.isfinite(a) for row in adv for a in row)
    if len(turn_rewards) == 1:
        assert adv == [[0.0] * len(turn_rewards[0])]


# ------------------------------------------------------------------ normaliser stages
@settings(max_examples=50)
@given(groups)
def test_zscore_population_std(values):
    z = zscore(values)
    if len(values) > 1 and np.std(values) > 1e-3:
        assert np.std(z) == approx(1.0, rel=1e-3)
    assert all(math.isfinite(v) for v in z)


def test_discounted_returns():
    assert discounted_returns([1.0, 2.0, 3.0], 0.5) == approx([1 + 1 + 0.75, 2 + 1.5, 3.0])
    assert discounted_returns([], 0.9) == []
