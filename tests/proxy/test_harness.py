"""The harness runner with real harness processes: G runs per task, the env's reward on the episode,
and every failure (crash, hang, no reward) a masked trajectory with its reason."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.proxy.helpers import env_return, run

ROOT = Path(__file__).resolve().parents[2]
LOOP = f"{sys.executable} {ROOT}/examples/harness/openai_tool_loop.py --model expert --task {{task}}"


@pytest.fixture(scope="module")
def running(expert_proxy):
    return expert_proxy


def test_the_openai_tool_loop_plays_the_env_and_its_reward_lands_on_the_episode(running):
    trajs = run(running, LOOP, ["1", "2"], group_size=2, mcp=True, concurrency=4)
    assert [(t.task_id, t.sample) for t in trajs] == [("1", 0), ("1", 1), ("2", 0), ("2", 1)]
    assert len({t.group for t in trajs}) == 2
    for t in trajs:
        ret, env_task, turns = env_return(int(t.task_id))
        assert not t.masked, t.mask_reason
        assert t.total_reward == ret == 1.0 and t.metadata["env_task"] == env_task
        assert len(t.turns) == turns and t.turns[-1].reward_components == {"correct": 1.0}
        assert t.metrics["segments"] == 1 and t.metrics["drift"] == 0
        assert t.metadata["harness"]["exit_code"] == 0


def test_a_crashing_harness_gives_a_masked_episode_with_the_exit_code(running):
    (t,) = run(
        running, f"{sys.executable} -c \"import sys; print('boom', file=sys.stderr); sys.exit(3)\"", ["1"]
    )
    assert t.masked and t.mask_reason == "harness_crashed: exit code 3: boom"


def test_a_hanging_harness_is_killed_and_masked(running):
    (t,) = run(running, f'{sys.executable} -c "import time; time.sleep(600)"', ["1"], timeout_s=1)
    assert (
        t.masked and t.mask_reason.startswith("harness_timeout") and t.metadata["harness"]["exit_code"] != 0
    )


def test_a_harness_that_never_reports_a_reward_is_masked(running):
    one_call = (
        f'{sys.executable} -c "import openai, os; openai.OpenAI(max_retries=0).chat.completions.create('
        "model='expert', messages=[{{'role': 'user', 'content': 'Evaluate: (1 + 2)'}}])\""
    )
    (t,) = run(running, one_call, ["1"], reward_timeout_s=0.5)
    assert len(t.turns) == 1 and t.turns[0].action.content  # the call was recorded
    assert t.masked and t.mask_reason.startswith("no_reward")


def test_a_template_with_an_unknown_field_is_refused_before_anything_runs(running):
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['model'\]"):
        run(running, "agent --model {model} --task {task}", ["1"])


def test_a_harness_that_quits_before_the_env_ends_has_the_envs_return_so_far_truncated(running):
    """The env was reset through the proxy's MCP door: its return so far is the episode's reward (as
    an env rollout cut at its turn limit), not a missing reward."""
    (t,) = run(running, LOOP + " --max-turns 1", ["1"], mcp=True, reward_timeout_s=2)
    assert not t.masked, t.mask_reason
    assert t.truncated and not t.terminated and t.total_reward == 0.0
    assert [c.name for turn in t.turns for c in turn.action.tool_calls] == ["calculate"]
