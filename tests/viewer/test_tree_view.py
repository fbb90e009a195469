"""The viewer draws tree rollouts: nodes with values (mean leaf return), parent -> child edges, and
the turn each branch point branched at."""

import asyncio
import re

from turngym.agents import ScriptedAgent
from turngym.envs.arith.env import ArithEnv
from turngym.rollout import RolloutConfig, RolloutEngine
from turngym.rollout.store import TrajectoryWriter
from turngym.rollout.tree import TreeConfig
from turngym.viewer.report import build_report, tree_view, write_report


class FailSecondFork(ArithEnv):
    """Arith whose second fork fails (a masked branch in the tree)."""

    forks = 0

    def _fork(self):
        FailSecondFork.forks += 1
        if FailSecondFork.forks == 2:
            raise RuntimeError("no room for a snapshot")
        return super()._fork()


def grow(env=ArithEnv, **tree):
    eng = RolloutEngine(env, ScriptedAgent(), RolloutConfig(tree=TreeConfig(**tree)), env_kwargs={"depth": 2})
    return asyncio.run(eng.run([0]))


def test_tree_view_layout_values_and_edges():
    leaves = grow(k=2, turns=(0, 1))
    for k, leaf in enumerate(leaves):  # distinct returns, so the values say which leaves are below
        leaf.turns[-1].reward = float(k)
    view = tree_view(leaves)
    nodes = {n["id"]: n for n in view["nodes"]}
    assert view["leaves"] == len(leaves) == 4 and view["branch_points"] == 3
    assert nodes["root"]["value"] == sum(t.total_reward for t in leaves) / 4
    below_0 = [t.total_reward for t in leaves if t.turns[0].node_id == "root.0"]
    assert nodes["root.0"]["value"] == sum(below_0) / len(below_0)
    assert (
        nodes["root"]["branch"] == "branch @ turn 0 ×2" and nodes["root.0"]["branch"] == "branch @ turn 1 ×2"
    )
    assert len(view["edges"]) == len(nodes) - 1  # a tree: one edge into every node but the root
    # parents sit left of their children, at the mean height of their children
    for node, n in nodes.items():
        kids = [m for m in nodes.values() if m["id"].rsplit(".", 1)[0] == node and m["id"] != node]
        if kids:
            assert all(k["x"] > n["x"] for k in kids)
            assert n["y"] == sum(k["y"] for k in kids) / len(kids)
    assert tree_view([leaf.model_copy(update={"turns": []}) for leaf in leaves[:1]]) is None


def test_report_draws_the_tree_with_a_masked_branch(tmp_path):
    FailSecondFork.forks = 0
    leaves = grow(FailSecondFork, k=3, turns=(0,))
    assert sum(t.masked for t in leaves) == 1
    with TrajectoryWriter(tmp_path) as w:
        for t in leaves:
            w.write(t)
    html = write_report(tmp_path).read_text()
    assert html.count('<svg class="tree"') == 1
    assert "3 leaves · 1 branch points" in html
    assert "branch @ turn 0 ×3" in html
    assert 'data-node="root.1"' in html and 'data-node="root.2"' in html  # the masked branch is drawn
    assert re.search(r"root\.\d · value — · 1 leaves · not started: fork_error", html)
    assert html.count("<line ") == 1 + 1 + 1 + (max(t.num_turns for t in leaves) - 1) * 2
    # flat runs draw no tree
    flat = asyncio.run(RolloutEngine("arith", ScriptedAgent(), RolloutConfig(group_size=2)).run(1))
    assert 'class="tree"' not in build_report(flat)
