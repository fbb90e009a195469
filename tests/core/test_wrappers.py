import json

import pytest

import turngym
from turngym.core.types import Trajectory
from turngym.core.wrappers import RecordRewardComponents, RecordTrajectory, TurnLimit


def test_turn_limit_wrapper():
    env = TurnLimit(turngym.make("arith", max_turns=10), max_turns=2)
    env.reset(seed=0)
    assert env.step("x")[3] is False
    assert env.step("x")[3] is True


def test_turn_limit_tighter_than_the_env_tightens_the_env_itself():
    inner = turngym.make("arith", max_turns=10)
    env = TurnLimit(inner, max_turns=2)
    assert env.cap == 2 and env.max_turns == 2 and inner.max_turns == 2
    env.reset(seed=0)
    env.step("x")
    _, reward, term, trunc, info = env.step("x")
    # the env truncates, so it pays its own end-of-episode components and refuses a third step
    assert (term, trunc, info["turn"]) == (False, True, 2)
    assert info["reward_components"] == {"correct": 0.0, "format": -0.1} and reward == pytest.approx(-0.1)
    with pytest.raises(RuntimeError, match="reset"):
        env.step("x")


def test_turn_limit_looser_than_the_env_leaves_the_env_limit():
    env = TurnLimit(turngym.make("arith", max_turns=2), max_turns=5)
    assert env.cap == 5 and env.max_turns == 2
    env.reset(seed=0)
    assert env.step("x")[3] is False
    assert env.step("x")[3] is True


def test_turn_limit_is_reapplied_at_reset_and_forwarded_through_wrappers():
    inner = turngym.make("arith", max_turns=6)
    env = TurnLimit(RecordRewardComponents(inner), max_turns=3)
    env.reset(seed=0)
    inner.max_turns = 9  # something loosened the env between episodes
    env.reset(seed=1)
    assert inner.max_turns == 3 and env.env.max_turns == 3
    turns = 0
    trunc = False
    while not trunc:
        _, _, _, trunc, info = env.step("x")
        turns += 1
    assert turns == 3 and info["episode"]["l"] == 3


def test_turn_limit_needs_an_env_with_its_own_limit():
    import gymnasium

    with pytest.raises(TypeError, match="TimeLimit"):
        TurnLimit(gymnasium.make("CartPole-v1"), max_turns=2)
    with pytest.raises(ValueError):
        TurnLimit(turngym.make("arith"), max_turns=0)


def test_reward_components_and_trajectory_recording(tmp_path):
    path = tmp_path / "traj.jsonl"
    env = RecordTrajectory(
        RecordRewardComponents(turngym.make("arith", depth=2)), path=path, env_id="arith-v0"
    )
    for seed in (0, 1):
        env.reset(seed=seed)
        done = False
        while not done:
            _, _, term, trunc, info = env.step(env.unwrapped.expert_action())
            done = term or trunc
        assert info["episode"]["components"] == {"correct": 1.0} and info["episode"]["l"] == 3
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and len(env.finished) == 2
    t = Trajectory.from_json(lines[1])
    assert t.env_id == "arith-v0" and t.seed == 1 and t.total_reward == 1.0 and t.num_turns == 3
    assert t.reference["answer"] == json.loads(lines[1])["reference"]["answer"]


async def test_wrappers_forward_async_path():
    env = TurnLimit(RecordRewardComponents(turngym.make("arith")), max_turns=1)
    obs, info = await env.areset(seed=0)
    _, _, term, trunc, _ = await env.astep("nothing")
    assert trunc and not term
    assert [t.name for t in env.tools] == ["calculate", "answer"]
    await env.aclose()
