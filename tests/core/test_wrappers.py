import json

import turngym
from turngym.core.types import Trajectory
from turngym.core.wrappers import RecordRewardComponents, RecordTrajectory, TurnLimit


def test_turn_limit_wrapper():
    env = TurnLimit(turngym.make("arith", max_turns=10), max_turns=2)
    env.reset(seed=0)
    assert env.step("x")[3] is False
    assert env.step("x")[3] is True


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
