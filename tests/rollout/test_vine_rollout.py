"""Vine rollouts (turngym.rollout.vine): forked continuations estimate each state's value; budgets,
tool-only estimates, faults, non-forkable envs, and the forks' tokens counted with the tiny model."""

import pytest
from faulty_env import FaultyEnv

from turngym.agents import LLMAgent, RandomAgent, SamplingParams, ScriptedAgent
from turngym.core.env import NotForkable
from turngym.envs.arith.env import ArithEnv
from turngym.rollout import RolloutConfig, RolloutEngine
from turngym.rollout.vine import TokenBudget, VineConfig, mean_se


def vine_engine(agent, env="arith", env_kwargs=None, group_size=1, **vine):
    cfg = RolloutConfig(group_size=group_size, vine=VineConfig(**vine), max_concurrency=8)
    return RolloutEngine(env, agent, cfg, env_kwargs=env_kwargs or {"max_turns": 4, "depth": 2})


async def test_the_expert_is_worth_its_outcome_in_every_state():
    """The scripted expert plays deterministically: every continuation ends like the episode, so
    every V(s_t) is the outcome with zero spread, and the true advantage of every turn is 0."""
    eng = vine_engine(ScriptedAgent(), k=3)
    trajs = await eng.run([0, 1])
    for t in trajs:
        meta = t.metadata["vine"]
        assert not t.masked and t.outcome == 1.0
        assert meta["n"] == [3] * t.num_turns + [1]
        assert meta["v"] == [1.0] * (t.num_turns + 1) and meta["se"][:-1] == [0.0] * t.num_turns
        assert meta["samples"] == [[1.0] * 3 for _ in range(t.num_turns)]
    assert eng.stats.vine["continuations"] == 3 * sum(t.num_turns for t in trajs)
    assert eng.stats.reconciles() and eng.stats.requested == 2  # continuations are not trajectories


async def test_random_agent_values_are_means_of_their_samples():
    eng = vine_engine(RandomAgent(0.3, seed=5), k=4, group_size=2)
    trajs = await eng.run([3, 4])
    assert len(trajs) == 4 and {t.sample for t in trajs} == {0, 1}
    spread = False
    for t in trajs:
        meta = t.metadata["vine"]
        for s, samples in enumerate(meta["samples"]):
            assert len(samples) == meta["n"][s] == 4
            assert meta["v"][s] == pytest.approx(sum(samples) / 4)
            spread |= len(set(samples)) > 1
        assert meta["v"][-1] == t.outcome
    assert spread  # the random policy's continuations disagree somewhere (the test can see values)


async def test_chosen_turns_estimate_the_states_before_and_after_them():
    eng = vine_engine(ScriptedAgent(), k=2, turns=(1,), env_kwargs={"max_turns": 4, "depth": 3})
    (t,) = await eng.run([2])
    assert t.num_turns >= 3
    n = t.metadata["vine"]["n"]
    assert n[1] == n[2] == 2 and n[0] == 0 and all(x == 0 for x in n[3:-1])


async def test_tool_mode_estimates_only_around_tool_calls():
    eng = vine_engine(ScriptedAgent(), k=2, turns="tool")
    (t,) = await eng.run([1])
    assert all(turn.tool_results for turn in t.turns)  # the expert calls a tool every turn
    assert t.metadata["vine"]["n"][:-1] == [2] * t.num_turns
    # an agent that never writes a valid call: no tool turn, so no estimate and no fork played
    eng = vine_engine(RandomAgent(1.0, seed=1), k=2, turns="tool")
    trajs = await eng.run([1])
    assert all(not r.name for turn in trajs[0].turns for r in turn.tool_results)
    assert trajs[0].metadata["vine"]["n"][:-1] == [0] * trajs[0].num_turns
    assert eng.stats.vine["continuations"] == 0


async def test_run_budget_stops_new_forks_and_is_reported():
    budget = TokenBudget(limit=0)  # spent before anything starts: no fork may start
    eng = vine_engine(ScriptedAgent(), k=2, budget=budget)
    (t,) = await eng.run([0])
    assert (
        t.metadata["vine"]["continuations"] == 0 and t.metadata["vine"]["budget_stopped"] == 2 * t.num_turns
    )
    assert budget.stopped == 2 * t.num_turns and not t.masked and t.outcome == 1.0


class FlakyForkArith(ArithEnv):
    forks = 0

    async def afork(self):
        FlakyForkArith.forks += 1
        if FlakyForkArith.forks % 2 == 0:
            raise RuntimeError("snapshot store full")
        return await super().afork()


async def test_a_failed_fork_is_a_missing_sample_not_a_failure():
    FlakyForkArith.forks = 0
    eng = vine_engine(ScriptedAgent(), env=FlakyForkArith, k=2)
    (t,) = await eng.run([0])
    meta = t.metadata["vine"]
    assert meta["fork_errors"] >= 1 and "snapshot store full" in meta["fork_error"]
    assert not t.masked and t.outcome == 1.0 and eng.stats.vine["fork_errors"] == meta["fork_errors"]
    assert all(v == 1.0 for v, n in zip(meta["v"], meta["n"], strict=True) if n)  # no failure scored
    assert sum(meta["n"][:-1]) == 2 * t.num_turns - meta["fork_errors"]


async def test_non_forkable_env_is_refused_before_any_episode():
    FaultyEnv.reset_counters()
    eng = RolloutEngine(FaultyEnv, ScriptedAgent(), RolloutConfig(vine=VineConfig(k=2)), env_id="faulty")
    with pytest.raises(NotForkable, match="vine value estimates need a forkable env: faulty"):
        await eng.run(2)
    assert FaultyEnv.made == 1 and FaultyEnv.closed == 1


def test_vine_config_is_validated():
    for bad in ({"k": 0}, {"turns": "some"}, {"turns": (-1,)}, {"max_tokens": 0}):
        with pytest.raises(ValueError):
            VineConfig(**bad)
    with pytest.raises(ValueError, match="not both"):
        from turngym.rollout.tree import TreeConfig

        RolloutConfig(tree=TreeConfig(k=2), vine=VineConfig())
    assert mean_se([1.0, 0.0]) == (0.5, pytest.approx(0.5), 2) and mean_se([1.0]) == (1.0, None, 1)


async def test_forked_tokens_count_in_the_rollouts_generated_tokens(hf_backend, tokenizer):
    agent = LLMAgent(hf_backend, tokenizer, SamplingParams(max_tokens=8), max_context=2048)
    eng = vine_engine(agent, k=2, max_tokens=1, env_kwargs={"max_turns": 3})
    (t,) = await eng.run([0])
    meta = t.metadata["vine"]
    own = sum(b - a for a, b in (x.gen_span for x in t.turns))
    assert meta["forked_tokens"] > 0 and eng.stats.vine["forked_tokens"] == meta["forked_tokens"]
    assert eng.stats.generated_tokens == own + meta["forked_tokens"]  # equal-budget accounting
    # a per-trajectory cap of 1 token: every planned fork either started or was stopped by the cap,
    # and the first state's forks start (nothing was sampled yet); which later ones ran depends on
    # how far the running forks got, so only the bookkeeping is asserted
    assert meta["continuations"] + meta["budget_stopped"] == 2 * t.num_turns
    assert meta["n"][0] + meta["masked"] + meta["fork_errors"] == 2


class PoolArith(ArithEnv):
    """An arith env whose pool holds at most 3 live envs (as a container or browser pool does)."""

    max_live = 3
    live = peak = 0

    def __init__(self, **kw):
        super().__init__(**kw)
        PoolArith.live += 1
        PoolArith.peak = max(PoolArith.peak, PoolArith.live)

    async def afork(self):
        child = await super().afork()
        PoolArith.live += 1
        PoolArith.peak = max(PoolArith.peak, PoolArith.live)
        return child

    async def aclose(self):
        PoolArith.live -= 1
        await super().aclose()


async def test_max_live_is_shared_by_episodes_and_forks_without_deadlock():
    PoolArith.live = PoolArith.peak = 0
    eng = RolloutEngine(
        PoolArith,
        ScriptedAgent(),
        RolloutConfig(group_size=4, vine=VineConfig(k=2), max_concurrency=8),
        env_kwargs={"max_turns": 4, "depth": 2},
        env_id="pool-arith",
    )
    trajs = await eng.run([0, 1])
    assert len(trajs) == 8 and not any(t.masked for t in trajs)
    assert PoolArith.peak <= 3 and PoolArith.live == 0  # never above the pool, every env closed
    for t in trajs:  # every fork waited for a place instead of failing
        assert t.metadata["vine"]["fork_errors"] == 0 and t.metadata["vine"]["n"][:-1] == [2] * t.num_turns
