"""JSONL and parquet round trips; crash-safety of the JSONL writer."""

import pyarrow.parquet as pq
import pytest

from turngym.core.types import Message, Trajectory, Turn
from turngym.rollout import (
    RolloutConfig,
    RolloutEngine,
    TrajectoryWriter,
    load_jsonl,
    load_parquet,
    load_trajectories,
    save_jsonl,
)


def sample(i: int, masked: bool = False) -> Trajectory:
    return Trajectory(
        env_id="arith",
        task_id=f"t{i}",
        seed=i,
        group=f"arith/{i}",
        sample=i % 2,
        prompt=[Message(role="user", content="Evaluate: 1 + 2 \u2603", images=[b"\x89PNG fake"])],
        turns=[
            Turn(
                index=0,
                action=Message(role="assistant", content="<tool_call>x</tool_call>"),
                reward=0.5,
                reward_components={"correct": 0.5},
                gen_span=(3, 5),
                obs_span=None,
                state_key="k",
                info={"a": [1]},
            )
        ],
        masked=masked,
        mask_reason="env_error" if masked else "",
        token_ids=[1, 2, 3, 4, 5],
        loss_mask=[0, 0, 0, 1, 1],
        logprobs=[0.0, 0.0, 0.0, -0.123456789012345, -2.5],
        prompt_len=3,
        metrics={"wall_s": 0.1},
        metadata={"error": "boom"} if masked else {},
    )


def test_jsonl_and_parquet_round_trip_exactly(tmp_path):
    trajs = [sample(i, masked=i == 2) for i in range(4)]
    save_jsonl(trajs, tmp_path / "a.jsonl")
    assert load_jsonl(tmp_path / "a.jsonl") == trajs
    with TrajectoryWriter(tmp_path / "run") as w:
        for t in trajs:
            w.write(t)
    assert load_trajectories(tmp_path / "run") == trajs  # parquet preferred
    assert load_parquet(tmp_path / "run" / "trajectories.parquet") == trajs
    table = pq.read_table(tmp_path / "run" / "trajectories.parquet")
    assert table.column("masked").to_pylist() == [False, False, True, False]
    assert table.column("total_reward").to_pylist() == [0.5] * 4
    assert table.column("n_tokens").to_pylist() == [5] * 4


def test_writer_flushes_each_trajectory_and_tolerates_a_torn_last_line(tmp_path):
    w = TrajectoryWriter(tmp_path, parquet=False)
    w.write(sample(0))
    assert load_jsonl(w.jsonl_path) == [sample(0)]  # visible before close
    w.close()
    with w.jsonl_path.open("a") as fh:
        fh.write(sample(1).to_json()[:50])  # a crash mid-write
    assert load_jsonl(w.jsonl_path) == [sample(0)]
    with pytest.raises(RuntimeError, match="closed"):
        w.write(sample(2))


def test_a_corrupt_line_in_the_middle_is_an_error(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text(sample(0).to_json() + "\n{broken\n" + sample(1).to_json() + "\n")
    with pytest.raises(ValueError, match="x.jsonl:2"):
        load_jsonl(p)
    with pytest.raises(FileNotFoundError):
        load_trajectories(tmp_path / "nowhere")


async def test_engine_output_reloads(tmp_path):
    from turngym.agents import ScriptedAgent

    with TrajectoryWriter(tmp_path) as w:
        eng = RolloutEngine("arith", ScriptedAgent(), RolloutConfig(group_size=2), on_trajectory=w.write)
        trajs = await eng.run(3)
    assert sorted(load_trajectories(tmp_path), key=lambda t: (t.seed, t.sample)) == trajs
