"""The rollout time ledger: each turn says where its seconds went, the engine and the trainer sum it."""

import asyncio

import pytest
from faulty_env import FaultyEnv
from hypothesis import given, settings
from hypothesis import strategies as st

from turngym.agents import LLMAgent, SamplingParams, ScriptedAgent
from turngym.agents.base import AgentStep
from turngym.core.types import Message, Trajectory, Turn
from turngym.rollout import RolloutConfig, RolloutEngine
from turngym.rollout.ledger import PHASES, ledger_metrics, ledger_totals


class SlowAgent(ScriptedAgent):
    """The expert, 50 ms per action, reporting a backend-side split of that wait."""

    def start(self, env, prompt, *, seed, route):
        inner = super().start(env, prompt, seed=seed, route=route)

        class Session:
            async def act(self):
                await asyncio.sleep(0.05)
                step = await inner.act()
                return AgentStep(step.action, step.finish_reason, timing={"queued": 0.01, "decode": 0.04})

            def observe(self, action, observation):
                return inner.observe(action, observation)

            def export(self, traj):
                inner.export(traj)

        return Session()


async def test_each_turn_records_where_its_time_went():
    FaultyEnv.reset_counters()
    eng = RolloutEngine(
        FaultyEnv, SlowAgent(), RolloutConfig(group_size=2), env_kwargs={"step_delay": 0.1}, env_id="faulty"
    )
    trajs = await eng.run([3])
    for t in trajs:
        assert t.num_turns == 3  # ping, ping, done
        pings, done = t.turns[:2], t.turns[2]
        for turn in t.turns:
            assert turn.timing["generate"] >= 0.05  # the agent's wait, as the engine saw it
            assert turn.timing["generate/queued"] == 0.01 and turn.timing["generate/decode"] == 0.04
        assert all(turn.timing["env_step"] >= 0.1 for turn in pings)  # the slow tool
        assert done.timing["env_step"] < 0.1
        assert all("observe" in turn.timing for turn in pings) and "observe" not in done.timing  # last: none
        for phase in ("env_start", "reset", "close"):
            assert t.metrics[f"time/{phase}"] >= 0.0
        summed = sum(ledger_totals([t]).get(p, 0.0) for p in PHASES)
        assert summed <= t.metrics["wall_s"] + 1e-6  # the phases never claim more than the episode took
        assert summed >= 0.8 * t.metrics["wall_s"]  # ... and account for nearly all of it
    totals = ledger_totals(trajs)
    stats = eng.stats.as_dict()["time_s"]
    for phase, seconds in totals.items():
        assert stats[phase] == pytest.approx(seconds, abs=2e-3)  # the engine's live sums agree
    # a roundtrip through JSON keeps the ledger
    again = Trajectory.model_validate_json(trajs[0].to_json())
    assert again.turns[0].timing == trajs[0].turns[0].timing


async def test_a_masked_trajectory_keeps_the_time_it_spent():
    FaultyEnv.reset_counters()
    eng = RolloutEngine(
        FaultyEnv, ScriptedAgent(), RolloutConfig(), env_kwargs={"fail_reset": True}, env_id="f"
    )
    (t,) = await eng.run([1])
    assert (
        t.masked and "time/reset" in t.metrics and "time/env_start" in t.metrics and "time/close" in t.metrics
    )


def traj_with(timings: list[dict[str, float]], **metrics: float) -> Trajectory:
    turns = [
        Turn(index=k, action=Message(role="assistant", content="x"), timing=tm)
        for k, tm in enumerate(timings)
    ]
    return Trajectory(turns=turns, metrics=dict(metrics))


@settings(max_examples=50)
@given(
    st.lists(
        st.lists(
            st.fixed_dictionaries(
                {"generate": st.floats(0, 10), "env_step": st.floats(0, 10)},
                optional={"observe": st.floats(0, 1), "generate/decode": st.floats(0, 10)},
            ),
            max_size=4,
        ),
        min_size=1,
        max_size=5,
    ),
    st.floats(0, 5),
)
def test_shares_of_the_top_level_phases_add_up_to_one(turn_lists, start):
    trajs = [traj_with(ts, **{"time/env_start": start, "time/reset": 0.5}) for ts in turn_lists]
    m = ledger_metrics(trajs, wall_s=10.0)
    shares = [m[f"rollout/time_share/{p}"] for p in PHASES]
    assert sum(shares) == pytest.approx(1.0)  # backend parts (generate/decode) are not counted twice
    assert m.get("rollout/time/generate", 0.0) == pytest.approx(
        sum(t.get("generate", 0) for ts in turn_lists for t in ts)
    )
    assert m["rollout/trajectories_per_hour"] == pytest.approx(len(trajs) * 360.0)


def test_an_empty_ledger_has_no_shares():
    assert ledger_metrics([Trajectory()]) == {
        "rollout/time/env_start": 0.0,
        "rollout/time/reset": 0.0,
        "rollout/time/close": 0.0,
    }


async def test_the_hf_backend_reports_queued_prefill_and_decode(tiny_dir, tokenizer):
    from turngym.agents.hf import HFBackend

    backend = HFBackend(tiny_dir, tokenizer)
    agent = LLMAgent(backend, tokenizer, SamplingParams(max_tokens=6, temperature=0.0))
    eng = RolloutEngine("arith", agent, RolloutConfig(group_size=2), env_id="arith")
    trajs = await eng.run([0])
    await backend.aclose()
    for t in trajs:
        for turn in t.turns:
            parts = [turn.timing[f"generate/{k}"] for k in ("queued", "prefill", "decode")]
            assert all(p >= 0.0 for p in parts) and turn.timing["generate/prefill"] > 0.0
            assert sum(parts) <= turn.timing["generate"] + 1e-3  # parts of the caller's wait
    m = ledger_metrics(trajs, wall_s=eng.stats.wall_s)
    assert m["rollout/time/generate/decode"] > 0.0 and m["rollout/trajectories_per_hour"] > 0.0
