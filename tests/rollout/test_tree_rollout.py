"""Tree rollouts (turngym.rollout.tree): node ids, shared prefixes, budgets, branch policies, faults,
non-forkable envs, token bookkeeping with the tiny model, and the trajectory store."""

import asyncio

import pytest
from faulty_env import FaultyEnv

from turngym.agents import LLMAgent, RandomAgent, SamplingParams, ScriptedAgent
from turngym.core.env import NotForkable
from turngym.envs.arith.env import ArithEnv
from turngym.rollout import RolloutConfig, RolloutEngine
from turngym.rollout.store import TrajectoryWriter, load_trajectories
from turngym.rollout.tree import TreeConfig, TreeError, mean_nll


def tree_engine(agent=None, env="arith", env_kwargs=None, **tree):
    cfg = RolloutConfig(tree=TreeConfig(**tree), max_concurrency=8)
    return RolloutEngine(
        env, agent or RandomAgent(0.2, seed=3), cfg, env_kwargs=env_kwargs or {"max_turns": 4}
    )


def check_tree(leaves):
    """The structure every tree keeps: ids chain from the root, siblings share their prefix."""
    by_node = {}
    for leaf in leaves:
        parent = "root"
        for t, turn in enumerate(leaf.turns):
            assert turn.parent_id == parent and turn.node_id.startswith(parent + ".")
            assert turn.index == t
            # a node is the same turn in every leaf through it (the prefix is shared, not resampled)
            seen = by_node.setdefault(turn.node_id, turn.action.content)
            assert seen == turn.action.content
            parent = turn.node_id
        assert leaf.metadata["tree"]["leaf"] == (parent if leaf.turns else "root")
    assert [leaf.sample for leaf in leaves] == list(range(len(leaves)))
    assert len({leaf.group for leaf in leaves}) == 1


async def test_schedule_tree_structure_and_stats():
    eng = tree_engine(k=2, turns=(0, 1))
    trajs = await eng.run([0, 1, 2])
    assert {t.seed for t in trajs} == {0, 1, 2}
    for seed in (0, 1, 2):
        leaves = [t for t in trajs if t.seed == seed]
        check_tree(leaves)
        summary = leaves[0].metadata["tree"]
        assert summary["leaves"] == len(leaves)
        # nodes are counted once however many leaves share them
        assert summary["nodes"] == len({turn.node_id for leaf in leaves for turn in leaf.turns})
        # root branches into 2 at turn 0; every child that reaches turn 1 branches into 2 again
        assert {turn.node_id for leaf in leaves for turn in leaf.turns[:1]} == {"root.0", "root.1"}
        reach_1 = {leaf.turns[0].node_id for leaf in leaves if len(leaf.turns) > 1}
        assert summary["branch_points"] == 1 + len(reach_1)
        assert len(leaves) == 2 + len(reach_1)
    assert eng.stats.reconciles() and eng.stats.requested == len(trajs)
    assert eng.stats.tree["trees"] == 3 and eng.stats.as_dict()["tree"]["forks"] == len(trajs) - 3
    # the engine's tree counters are the sums of the trees' summaries (all but generated_tokens)
    summaries = [next(t for t in trajs if t.seed == seed).metadata["tree"] for seed in (0, 1, 2)]
    assert list(summaries[0]) == [
        "leaf",
        "nodes",
        "leaves",
        "branch_points",
        "forks",
        "fork_errors",
        "fork_s",
        "generated_tokens",
        "reused_sampled_tokens",
        "reused_prefix_tokens",
    ]
    for key in ("nodes", "branch_points", "forks", "fork_errors", "reused_prefix_tokens"):
        assert eng.stats.tree[key] == sum(s[key] for s in summaries), key
    assert isinstance(summaries[0]["fork_s"], float) and "generated_tokens" not in eng.stats.tree


async def test_node_budget_stops_branching_and_paths_still_finish():
    eng = tree_engine(k=3, turns=(0, 1, 2, 3), max_nodes=1)
    leaves = await eng.run([5])
    check_tree(leaves)
    # the root branches at turn 0 (0 nodes < 1); after that the tree has >= 1 node: no more branches
    assert len(leaves) == 3 and leaves[0].metadata["tree"]["branch_points"] == 1
    assert all(leaf.done for leaf in leaves)


async def test_tool_call_policy_branches_after_each_tool_result():
    eng = tree_engine(ScriptedAgent(), k=2, branch="tool_call", env_kwargs={"max_turns": 4, "depth": 2})
    leaves = await eng.run([1])
    check_tree(leaves)
    for leaf in leaves:
        for prev, turn in zip(leaf.turns, leaf.turns[1:], strict=False):
            assert prev.tool_results  # the expert calls a tool every turn
            assert turn.parent_id == prev.node_id
    # turn 0 never branches (no tool result yet); every later turn of every path does: a binary tree
    assert {leaf.turns[0].node_id for leaf in leaves} == {"root.0"}
    depth = max(len(leaf.turns) for leaf in leaves)
    assert depth == 3 and len(leaves) == 2 ** (depth - 1)
    assert leaves[0].metadata["tree"]["branch_points"] == len(leaves) - 1


class FlakyForkArith(ArithEnv):
    """Arith whose second fork fails and whose forks' forks crash on their first step."""

    forks = 0

    def _fork(self):
        FlakyForkArith.forks += 1
        if FlakyForkArith.forks == 2:
            raise RuntimeError("snapshot store full")
        child = super()._fork()
        child.generation = getattr(self, "generation", 0) + 1
        return child

    async def astep(self, action):
        if getattr(self, "generation", 0) >= 2:
            raise RuntimeError("branch sandbox died")
        return await super().astep(action)


async def test_failed_fork_and_crashed_branch_are_masked_and_the_parent_is_intact():
    FlakyForkArith.forks = 0
    eng = tree_engine(
        ScriptedAgent(), env=FlakyForkArith, k=3, turns=(0, 1), env_kwargs={"max_turns": 4, "depth": 2}
    )
    leaves = await eng.run([2])
    reasons = sorted(leaf.mask_reason for leaf in leaves if leaf.masked)
    assert "fork_error" in reasons and "env_error" in reasons
    failed = next(leaf for leaf in leaves if leaf.mask_reason == "fork_error")
    assert "snapshot store full" in failed.metadata["error"] and failed.metadata["tree_node"].count(".") == 1
    crashed = [leaf for leaf in leaves if leaf.mask_reason == "env_error"]
    assert all("branch sandbox died" in leaf.metadata["error"] for leaf in crashed)
    root = next(leaf for leaf in leaves if all(t.node_id.endswith(".0") for t in leaf.turns))
    assert not root.masked and root.terminated and root.outcome == 1.0  # the parent's episode is untouched
    assert eng.stats.reconciles() and eng.stats.mask_reasons["fork_error"] == 1


async def test_non_forkable_env_is_refused_before_any_episode():
    FaultyEnv.reset_counters()
    eng = RolloutEngine(FaultyEnv, ScriptedAgent(), RolloutConfig(tree=TreeConfig(k=2)), env_id="faulty")
    with pytest.raises(NotForkable, match="tree rollouts need a forkable env: faulty cannot fork"):
        await eng.run(4)
    assert FaultyEnv.made == 1 and FaultyEnv.closed == 1  # only the probe, closed


async def test_non_forkable_env_runs_flat_groups_when_asked():
    eng = RolloutEngine(
        FaultyEnv, ScriptedAgent(), RolloutConfig(tree=TreeConfig(k=3, fallback_flat=True)), env_id="faulty"
    )
    trajs = await eng.run(2)
    assert len(trajs) == 6 and [t.sample for t in trajs] == [0, 1, 2] * 2
    assert all(turn.node_id is None for t in trajs for turn in t.turns)


class LimitedArith(ArithEnv):
    """Arith that, like swe-docker's container pool, holds at most ``max_live`` live instances (reset or
    forked, not yet closed); it counts them and remembers the most at once."""

    max_live = 4
    live = peak = 0

    def _count_in(self):
        LimitedArith.live += 1
        LimitedArith.peak = max(LimitedArith.peak, LimitedArith.live)
        self.holding = True

    def _reset(self, rng, options):
        if not getattr(self, "holding", False):
            self._count_in()
        return super()._reset(rng, options)

    def _fork(self):
        child = super()._fork()
        child._count_in()
        return child

    async def astep(self, action):
        await asyncio.sleep(0.01)  # paths of different trees overlap
        return await super().astep(action)

    def _close(self):
        if getattr(self, "holding", False):
            LimitedArith.live -= 1
            self.holding = False


@pytest.mark.parametrize(
    ("tree", "cap"),
    [(dict(k=2, turns=(0, 1)), 4), (dict(k=2, turns=(0,)), 2), (dict(k=2, branch="tool_call"), 4)],
)
async def test_trees_reserve_their_paths_within_the_envs_max_live(tree, cap):
    """Six trees side by side never hold more live envs than the env's ``max_live``: no fork fails for
    want of room, and a tree whose policy has no path bound branches only while its paths fit."""
    LimitedArith.live = LimitedArith.peak = 0
    eng = RolloutEngine(
        LimitedArith,
        ScriptedAgent(),
        RolloutConfig(tree=TreeConfig(**tree), max_concurrency=6),
        env_kwargs={"max_turns": 4, "depth": 3},
        env_id="limited",
    )
    trajs = await eng.run(range(6))
    assert LimitedArith.peak <= LimitedArith.max_live and LimitedArith.live == 0
    assert not any(t.masked for t in trajs) and eng.stats.tree["fork_errors"] == 0
    for seed in range(6):
        leaves = [t for t in trajs if t.seed == seed]
        check_tree(leaves)
        assert len(leaves) <= cap
    if "branch" not in tree:  # a schedule tree's shape does not depend on the others
        assert len(trajs) == 6 * cap


async def test_k_above_the_envs_max_live_is_refused():
    eng = RolloutEngine(
        LimitedArith, ScriptedAgent(), RolloutConfig(tree=TreeConfig(k=5)), env_kwargs={"depth": 2}
    )
    with pytest.raises(TreeError, match="at most 4 live envs at once .* needs 5"):
        await eng.run(1)


async def test_the_fork_probe_reads_one_env_and_closes_it():
    """``EpisodeRunner.fork_support``, the preflight of trees and vines: whether the env forks, why not,
    and its ``max_live``, from one env that is closed again."""
    from turngym.rollout.episode import ForkSupport

    arith = await tree_engine().episodes.fork_support()
    assert isinstance(arith, ForkSupport) and arith.forkable and arith.max_live is None
    limited = RolloutEngine(LimitedArith, ScriptedAgent(), RolloutConfig(), env_kwargs={"depth": 2})
    assert (await limited.episodes.fork_support()).max_live == 4
    FaultyEnv.reset_counters()
    faulty = RolloutEngine(FaultyEnv, ScriptedAgent(), RolloutConfig(), env_id="faulty")
    support = await faulty.episodes.fork_support()
    assert not support.forkable and "does not implement fork()" in support.why_not
    assert FaultyEnv.made == 1 and FaultyEnv.closed == 1


def test_tree_config_is_validated():
    with pytest.raises(ValueError, match="k must be >= 2"):
        TreeConfig(k=1)
    with pytest.raises(
        ValueError, match="unknown branch policy 'sometimes'; known: entropy, schedule, tool_call"
    ):
        TreeConfig(branch="sometimes")
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        TreeConfig(max_tokens=0)
    assert TreeConfig(turns=(2, 0, 2)).turns == (0, 2)


async def test_entropy_policy_needs_token_logprobs():
    with pytest.raises(TreeError, match="needs token logprobs"):
        await tree_engine(ScriptedAgent(), branch="entropy").run(1)


def test_mean_nll():
    assert mean_nll([-1.0, -3.0]) == 2.0 and mean_nll([]) == 0.0


async def test_trajectory_store_keeps_node_ids(tmp_path):
    leaves = await tree_engine(k=2, turns=(0,)).run([0])
    with TrajectoryWriter(tmp_path) as writer:
        for leaf in leaves:
            writer.write(leaf)
    back = load_trajectories(tmp_path / "trajectories.parquet")
    assert [[(t.node_id, t.parent_id) for t in b.turns] for b in back] == [
        [(t.node_id, t.parent_id) for t in leaf.turns] for leaf in leaves
    ]
    assert back[0].metadata["tree"] == leaves[0].metadata["tree"]


# ------------------------------------------------------------------ token level, the tiny model
def llm(backend, tokenizer):
    return LLMAgent(backend, tokenizer, SamplingParams(max_tokens=8), max_context=2048)


async def test_siblings_share_the_token_prefix_and_count_reused_tokens(hf_backend, tokenizer):
    eng = tree_engine(llm(hf_backend, tokenizer), k=2, turns=(0, 1), env_kwargs={"max_turns": 3})
    leaves = await eng.run([0])
    generated = eng.stats.generated_tokens
    assert eng.stats.masked == 0
    for seed in (0,):
        tree = [leaf for leaf in leaves if leaf.seed == seed]
        check_tree(tree)
        s = tree[0].metadata["tree"]
        # every leaf's sampled tokens = what the tree sampled + the shared prefix tokens copied in
        assert sum(sum(leaf.loss_mask) for leaf in tree) == s["generated_tokens"] + s["reused_sampled_tokens"]
        assert s["reused_prefix_tokens"] > s["reused_sampled_tokens"] > 0
        for leaf in tree:  # tokens tile like a flat trajectory and match the turns' spans
            a, b = leaf.turns[-1].gen_span
            assert b == len(leaf.token_ids) == len(leaf.loss_mask) == len(leaf.logprobs)
        for x in tree:
            for y in tree:
                shared = [t for t, u in zip(x.turns, y.turns, strict=False) if t.node_id == u.node_id]
                if shared:  # the token ids of a shared prefix are identical
                    end = shared[-1].gen_span[1]
                    assert x.token_ids[:end] == y.token_ids[:end] and x.logprobs[:end] == y.logprobs[:end]
        # siblings sample their own continuation (distinct seeds)
        firsts = {leaf.turns[0].node_id: leaf.turns[0].action.content for leaf in tree}
        assert len(firsts) == 2
    assert generated == sum(leaf.metadata["tree"]["generated_tokens"] for leaf in leaves if leaf.sample == 0)
    # the HF backend started each sibling from a copy of its parent's KV row (share_prefix)
    assert hf_backend.stats["shared_rows"] >= 1


async def test_entropy_policy_branches_on_uncertain_turns_only(hf_backend, tokenizer):
    never = await tree_engine(
        llm(hf_backend, tokenizer), branch="entropy", entropy_threshold=1e9, env_kwargs={"max_turns": 2}
    ).run([3])
    assert len(never) == 1 and never[0].metadata["tree"]["branch_points"] == 0
    always = tree_engine(
        llm(hf_backend, tokenizer),
        branch="entropy",
        entropy_threshold=0.0,
        max_nodes=2,
        env_kwargs={"max_turns": 2},
    )
    leaves = await always.run([3])
    check_tree(leaves)
    assert leaves[0].metadata["tree"]["branch_points"] >= 1 and len(leaves) >= 2
    # the sampled turn stays child 0; its sibling sampled the same turn afresh from the same state
    zero = next(leaf for leaf in leaves if leaf.turns[0].node_id == "root.0")
    assert mean_nll(zero.logprobs[slice(*zero.turns[0].gen_span)]) >= 0.0


async def test_cancelling_a_tree_closes_every_branch_env():
    closed = []

    class Tracked(ArithEnv):
        def _close(self):
            closed.append(id(self))
            return super()._close()

    class Slow(ScriptedAgent):
        def start(self, env, prompt, *, seed, route):
            session = super().start(env, prompt, seed=seed, route=route)
            act = session.act

            async def slow():
                await asyncio.sleep(0.2)
                return await act()

            session.act = slow
            return session

    eng = tree_engine(Slow(), env=Tracked, k=3, turns=(0,), env_kwargs={"max_turns": 4, "depth": 3})
    stream = eng.stream([0])
    task = asyncio.ensure_future(stream.__anext__())
    await asyncio.sleep(0.3)  # the root has forked its branches
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await stream.aclose()
    assert len(closed) >= 4  # the probe, the root and its two forks
