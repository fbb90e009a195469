"""Tree credit (turngym.trainer.credit.tree): hand-computed examples and properties of node values,
branch-gated advantages and GiGPO with exact anchor groups; the registered methods on trajectories."""

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turngym.trainer.config import load_config
from turngym.trainer.credit import gigpo, node_values, tree_advantages, tree_anchor_keys
from turngym.trainer.credit.pipeline import CreditPipeline
from turngym.trainer.credit.registry import build_credit_pipeline
from turngym.trainer.credit.tree import branched_parents

from .helpers import make_traj

approx = pytest.approx


def same(a, b, tol=1e-6):
    """Ragged lists of floats equal to ``tol``."""
    assert [len(r) for r in a] == [len(r) for r in b]
    assert [x for r in a for x in r] == approx([x for r in b for x in r], abs=tol)


# A tree with a branch at the root (2 children) and one below child 0 (2 children):
#   root ─ root.0 ─ root.0.0 (R=1)
#        │        └ root.0.1 (R=0)
#        └ root.1 ─ root.1.0 (R=0)      (root.1 did not branch again)
PATHS = [["root.0", "root.0.0"], ["root.0", "root.0.1"], ["root.1", "root.1.0"]]
PARENTS = [["root", "root.0"], ["root", "root.0"], ["root", "root.1"]]
RETURNS = [1.0, 0.0, 0.0]
TREE = ["rollout.tree={k: 2}"]


def test_node_values_hand_computed():
    v = node_values(PATHS, RETURNS)
    assert v == approx(
        {"root": 1 / 3, "root.0": 0.5, "root.1": 0.0, "root.0.0": 1.0, "root.0.1": 0.0, "root.1.0": 0.0}
    )


def test_branch_gated_advantages_hand_computed():
    assert branched_parents(PATHS, PARENTS) == {"root", "root.0"}
    adv = tree_advantages(PATHS, PARENTS, RETURNS, norm_by_std=False)
    # turn 0: V(child) - V(root); turn 1: V(leaf) - V(root.0) where root.0 branched, 0 below root.1
    same(adv, [[0.5 - 1 / 3, 0.5], [0.5 - 1 / 3, -0.5], [-1 / 3, 0.0]])
    std = math.sqrt(2 / 9)
    normed = tree_advantages(PATHS, PARENTS, RETURNS, norm_by_std=True)
    same(normed, [[a / (std + 1e-6) for a in row] for row in adv])
    # the episode term adds each leaf's GRPO advantage to every turn
    with_episode = tree_advantages(PATHS, PARENTS, RETURNS, norm_by_std=False, episode_weight=1.0)
    same(with_episode, [[a + e for a in row] for row, e in zip(adv, [2 / 3, -1 / 3, -1 / 3], strict=True)])


def test_tree_gigpo_groups_siblings_by_their_parent_node():
    keys = tree_anchor_keys(PATHS, PARENTS)
    assert keys == [["root", "root.0"], ["root", "root.0"], ["root", None]]
    rewards = [[0.0, r] for r in RETURNS]
    adv = gigpo(rewards, keys, RETURNS, gamma=1.0, omega=1.0, mode="mean_norm")
    # episode: R - 1/3; step: turn 0 anchored at root (G = R), turn 1 at root.0 for leaves 0, 1 only
    same(adv, [[2 / 3 + 2 / 3, 2 / 3 + 0.5], [-1 / 3 - 1 / 3, -1 / 3 - 0.5], [-1 / 3 - 1 / 3, -1 / 3]])


def test_no_branch_gives_no_turn_credit():
    paths, parents = [["root.0", "root.0.0"]], [["root", "root.0"]]
    assert tree_advantages(paths, parents, [5.0]) == [[0.0, 0.0]]
    assert tree_anchor_keys(paths, parents) == [[None, None]]
    assert tree_advantages([], [], []) == []


# ------------------------------------------------------------------ random trees
@st.composite
def trees(draw):
    """Random trees as the tree engine writes them: every leaf's path of node ids from the root."""
    rng = random.Random(draw(st.integers(0, 2**31)))
    depth = draw(st.integers(1, 4))
    leaves: list[list[str]] = [[]]
    for _ in range(depth):
        grown = []
        for path in leaves:
            parent = path[-1] if path else "root"
            k = rng.choice([1, 1, 2, 3])
            grown.extend([*path, f"{parent}.{j}"] for j in range(k))
        leaves = grown
        if len(leaves) > 24:
            break
    returns = draw(st.lists(st.floats(-5, 5, allow_nan=False), min_size=len(leaves), max_size=len(leaves)))
    parents = [["root", *path[:-1]] for path in leaves]
    return leaves, parents, returns


@settings(max_examples=80)
@given(trees())
def test_node_values_are_means_of_the_leaves_below(tree):
    paths, _, returns = tree
    v = node_values(paths, returns)
    assert v["root"] == approx(sum(returns) / len(returns))
    for node, value in v.items():
        below = [r for p, r in zip(paths, returns, strict=True) if node == "root" or node in p]
        assert value == approx(sum(below) / len(below))
        assert min(below) - 1e-9 <= value <= max(below) + 1e-9


@settings(max_examples=80)
@given(trees(), st.booleans())
def test_branch_advantages_gate_and_balance(tree, by_std):
    paths, parents, returns = tree
    adv = tree_advantages(paths, parents, returns, norm_by_std=by_std)
    branched = branched_parents(paths, parents)
    assert all(math.isfinite(a) for row in adv for a in row)
    for row, pars in zip(adv, parents, strict=True):
        for a, p in zip(row, pars, strict=True):
            if p not in branched:
                assert a == 0.0  # no branch => no turn credit
    # at each branch point the advantages of its leaves' turns there sum to zero
    for p in branched:
        total = sum(
            a
            for row, pars in zip(adv, parents, strict=True)
            for a, q in zip(row, pars, strict=True)
            if q == p
        )
        assert total == approx(0.0, abs=1e-6)


@settings(max_examples=60)
@given(trees(), st.randoms(use_true_random=False))
def test_tree_credit_is_invariant_to_leaf_order(tree, rnd):
    paths, parents, returns = tree
    order = list(range(len(paths)))
    rnd.shuffle(order)
    base = tree_advantages(paths, parents, returns, episode_weight=0.5)
    shuffled = tree_advantages(
        [paths[i] for i in order],
        [parents[i] for i in order],
        [returns[i] for i in order],
        episode_weight=0.5,
    )
    same(shuffled, [base[i] for i in order])
    keys = tree_anchor_keys(paths, parents)
    assert tree_anchor_keys([paths[i] for i in order], [parents[i] for i in order]) == [
        keys[i] for i in order
    ]


@settings(max_examples=60)
@given(trees(), st.floats(-3, 3, allow_nan=False))
def test_tree_credit_is_shift_invariant(tree, shift):
    paths, parents, returns = tree
    base = tree_advantages(paths, parents, returns)
    shifted = tree_advantages(paths, parents, [r + shift for r in returns])
    same(shifted, base, 1e-5)


# ------------------------------------------------------------------ registered methods, trajectories
def tree_group(returns=RETURNS, paths=PATHS, parents=PARENTS):
    group = []
    for k, (r, path, pars) in enumerate(zip(returns, paths, parents, strict=True)):
        t = make_traj([0.0] * (len(path) - 1) + [r], group="arith/0")
        t.sample = k
        for turn, node, parent in zip(t.turns, path, pars, strict=True):
            turn.node_id, turn.parent_id = node, parent
        group.append(t)
    return group


@pytest.mark.parametrize("method", ["tree", "tree_gigpo"])
def test_registered_tree_methods_broadcast_to_tokens(method):
    cfg = load_config(None, [f"credit.method={method}", "credit.norm_by_std=false", *TREE])
    pipeline = build_credit_pipeline(cfg.credit)
    assert isinstance(pipeline, CreditPipeline) and pipeline.method_name == method
    group = tree_group()
    out = pipeline(group)
    if method == "tree":
        same(out.turn_advantages, tree_advantages(PATHS, PARENTS, RETURNS, norm_by_std=False))
        assert out.metrics["tree/branch_points"] == 2
    else:
        assert out.metrics["gigpo/anchored_frac"] == approx(5 / 6)
    for traj, adv, tok in zip(group, out.turn_advantages, out.token_advantages, strict=True):
        for turn, a in zip(traj.turns, adv, strict=True):
            s, e = turn.gen_span
            assert list(tok[s:e]) == approx([a] * (e - s))
            assert turn.info["advantages"][method] == approx(a)


def test_masked_branch_changes_no_value():
    group = tree_group()
    extra = tree_group([9.0], [["root.2"]], [["root"]])[0]
    extra.masked, extra.mask_reason = True, "fork_error"
    pipeline = build_credit_pipeline(load_config(None, ["credit.method=tree", *TREE]).credit)
    same(pipeline(group + [extra]).turn_advantages[:3], pipeline(group).turn_advantages)


def test_flat_trajectories_are_refused_with_a_clear_error():
    pipeline = build_credit_pipeline(load_config(None, ["credit.method=tree", *TREE]).credit)
    with pytest.raises(ValueError, match="tree credit needs tree rollouts"):
        pipeline([make_traj([1.0]), make_traj([0.0])])


def test_tree_methods_need_tree_rollouts_in_the_config():
    with pytest.raises(ValueError, match="credit.method=tree_gigpo needs tree rollouts: set rollout.tree"):
        load_config(None, ["credit.method=tree_gigpo"])
    with pytest.raises(ValueError, match="k must be >= 2"):
        load_config(None, ["credit.method=tree", "rollout.tree={k: 1}"])
    cfg = load_config(None, ["credit.method=tree", "rollout.tree={k: 3, turns: [0, 2], branch: schedule}"])
    assert cfg.rollout.tree.config().k == 3 and cfg.rollout.tree.config().turns == (0, 2)
