import asyncio
import warnings

import pytest

import turngym
from turngym.core.env import Task
from turngym.core.types import Message
from turngym.tools import tool
from turngym.tools.env import AsyncEnv, Env


def play_expert(env, seed=0):
    obs, info = env.reset(seed=seed)
    total, done, steps = 0.0, False, 0
    while not done:
        obs, r, term, trunc, info = env.step(env.expert_action())
        total += r
        done = term or trunc
        steps += 1
    return total, info, steps


def test_arith_expert_solves_and_info_keys():
    env = turngym.make("arith", depth=4)
    total, info, steps = play_expert(env, seed=3)
    assert total == 1.0 and steps == 5  # 4 operations + answer
    for key in ("reward_components", "invalid_action", "error", "state_key", "turn", "task_id", "reference"):
        assert key in info
    assert info["reward_components"] == {"correct": 1.0}
    assert info["reference"]["answer"] == int(info["reference"]["answer"])
    env.close()


def test_arith_expert_recheck_repeats_its_last_call_once_on_its_share_of_tasks():
    env = turngym.make("arith", depth=2, expert_recheck=1.0)
    env.reset(seed=4)
    actions = []
    while not env.unwrapped._done:
        actions.append(env.expert_action())
        *_, info = env.step(actions[-1])
    assert len(actions) == 4 and actions[2] == actions[1] and '"answer"' in actions[3]  # 2 ops, 1 repeat
    assert info["reward_components"] == {"correct": 1.0}
    env.close()
    env = turngym.make("arith", depth=1, expert_recheck=0.3)
    steps = [play_expert(env, seed=s)[2] for s in range(300)]
    assert set(steps) == {2, 3} and 0.2 < steps.count(3) / len(steps) < 0.4
    env.close()
    with pytest.raises(ValueError, match="expert_recheck"):
        turngym.make("arith", expert_recheck=-0.1)


def test_arith_tool_reward_pays_each_calculate_call_and_can_be_farmed():
    env = turngym.make("arith", depth=1, tool_reward=0.5, max_turns=4)
    env.reset(seed=0)
    call = env.expert_action()
    rewards = []
    for _ in range(4):  # farm: calculate every turn, never answer
        _, r, term, trunc, info = env.step(call)
        rewards.append((r, info["reward_components"]))
    assert trunc and not term
    assert [c for _, c in rewards[:3]] == [{"tool_ok": 0.5}] * 3
    assert rewards[-1][1] == {"tool_ok": 0.5, "correct": 0.0, "format": -0.1}
    assert sum(r for r, _ in rewards) == pytest.approx(1.9)
    # the honest episode: one call, then the answer
    env.reset(seed=0)
    _, r1, *_ = env.step(env.expert_action())
    _, r2, term, _, info = env.step(env.expert_action())
    assert term and (r1, r2) == (0.5, 1.0) and info["reward_components"] == {"tool_ok": 0.0, "correct": 1.0}
    bad = '<tool_call>{"name": "calculate", "arguments": {"a": 1, "op": "/", "b": 2}}</tool_call>'
    env.reset(seed=0)
    assert env.step(bad)[4]["reward_components"] == {"tool_ok": 0.0}  # only calls that ran pay
    env.close()


def test_reset_same_seed_same_task_and_observation():
    env = turngym.make("arith")
    a, ia = env.reset(seed=7)
    b, ib = env.reset(seed=7)
    c, ic = env.reset(seed=8)
    assert a == b and ia["task_id"] == ib["task_id"]
    assert ic["task_id"] != ia["task_id"]
    a[0].content = "mutated"
    d, _ = env.reset(seed=7)
    assert d[0].content != "mutated"  # returned data is never shared


def test_turn_limit_truncates_and_penalises_missing_answer():
    env = turngym.make("arith", max_turns=2)
    env.reset(seed=0)
    _, r, term, trunc, info = env.step("thinking...")
    assert (term, trunc, info["invalid_action"]) == (False, False, True)
    _, r, term, trunc, info = env.step("still thinking")
    assert (term, trunc) == (False, True)
    assert info["reward_components"] == {"correct": 0.0, "format": -0.1} and r == pytest.approx(-0.1)
    with pytest.raises(RuntimeError, match="reset"):
        env.step("more")


def test_limit_turns_tightens_the_one_turn_limit_and_never_loosens_it():
    env = turngym.make("arith", max_turns=5)
    assert env.spec.kwargs["max_turns"] == 5 and env.max_turns == 5  # from the spec's kwargs
    env.limit_turns(8)  # looser: the env's own limit stays
    assert env.max_turns == 5
    env.limit_turns(2)
    assert env.max_turns == 2
    env.reset(seed=0)
    assert env.step("x")[3] is False
    _, r, term, trunc, info = env.step("x")
    assert (term, trunc) == (False, True) and info["reward_components"]["format"] == -0.1
    with pytest.raises(ValueError, match=">= 1"):
        env.limit_turns(0)
    assert turngym.make("arith").max_turns == type(env).default_max_turns


def test_wrong_answer_and_several_calls_in_one_turn():
    env = turngym.make("arith", depth=1)
    _, info = env.reset(seed=1)
    target = info["reference"]["answer"]
    action = (
        '<tool_call>{"name": "calculate", "arguments": {"a": 1, "op": "+", "b": 1}}</tool_call>'
        f'<tool_call>{{"name": "answer", "arguments": {{"value": {target + 1}}}}}</tool_call>'
        '<tool_call>{"name": "calculate", "arguments": {"a": 2, "op": "+", "b": 2}}</tool_call>'
    )
    obs, r, term, trunc, info = env.step(action)
    assert term and r == 0.0
    assert [m.content for m in obs] == ["2", "answer recorded"]  # calls after the terminal one are not run
    assert [m.tool_call_id for m in obs] == ["call_1_0", "call_1_1"]


def test_too_many_calls_in_one_turn():
    env = turngym.make("arith", max_calls_per_turn=3)
    env.reset(seed=0)
    call = '<tool_call>{"name": "calculate", "arguments": {"a": 1, "op": "+", "b": 1}}</tool_call>'
    obs, _, term, _, info = env.step(call * 1000)
    assert not term and info["invalid_action"]
    assert "only the first 3" in info["error"]
    assert len([m for m in obs if m.content == "2"]) == 3


def test_structured_message_action():
    env = turngym.make("arith", depth=1)
    _, info = env.reset(seed=2)
    msg = Message(
        role="assistant",
        tool_calls=[
            turngym.ToolCall(id="x1", name="answer", arguments={"value": info["reference"]["answer"]})
        ],
    )
    obs, r, term, _, _ = env.step(msg)
    assert term and r == 1.0 and obs[0].tool_call_id == "x1"


def test_tag_parser_option():
    env = turngym.make("arith", parser="tags")
    env.reset(seed=0)
    obs, _, _, _, info = env.step("<search>x</search>")  # the default tags map to tools this env lacks
    assert info["invalid_action"] and "unknown tool 'search'" in obs[0].content


class EchoEnv(Env):
    """An env with an async hook and an async tool."""

    default_max_turns = 3

    @tool(terminal=True)
    async def say(self, text: str) -> str:
        """Say something; ends the episode."""
        await asyncio.sleep(0)
        self.said = text
        return text.upper()

    async def _reset(self, rng, options):
        await asyncio.sleep(0)
        return Task([Message(role="user", content="say hi")], task_id=f"echo-{int(rng.integers(100))}")

    async def _turn_reward(self, results, done):
        return {"said_hi": float(done and getattr(self, "said", "") == "hi")}


async def test_async_path_inside_running_loop():
    env = EchoEnv()
    obs, info = await env.areset(seed=1)
    obs, r, term, trunc, info = await env.astep(
        '<tool_call>{"name": "say", "arguments": {"text": "hi"}}</tool_call>'
    )
    assert obs[0].content == "HI" and r == 1.0 and term
    # sync methods work even while a loop runs in this thread (they use a helper thread)
    obs, info = env.reset(seed=1)
    assert obs[0].content == "say hi"
    await env.aclose()
    await env.aclose()


def test_async_env_is_a_deprecated_alias_of_env():
    with pytest.warns(DeprecationWarning, match="subclass Env"):

        class Legacy(AsyncEnv):
            default_max_turns = 2

            @tool(terminal=True)
            async def say(self, text: str) -> str:
                """Say something."""
                return text

            async def _reset(self, rng, options):
                return Task([Message(role="user", content="hi")], task_id="legacy")

    assert issubclass(Legacy, Env) and isinstance(Legacy(), AsyncEnv)
    env = Legacy()
    env.reset(seed=0)
    assert env.step('<tool_call>{"name": "say", "arguments": {"text": "x"}}</tool_call>')[2] is True
    with warnings.catch_warnings():
        warnings.simplefilter("error")

        class Grandchild(Legacy):  # only direct subclasses warn
            pass

        class Plain(Env):
            pass


def test_in_repo_envs_subclass_env_not_the_alias():
    from turngym.envs.swe.env import SweDockerEnv
    from turngym.envs.web.base import MiniWoBEnvBase

    for cls in (SweDockerEnv, MiniWoBEnvBase):
        assert not issubclass(cls, AsyncEnv) and issubclass(cls, Env)


def test_sync_wrappers_on_async_env_and_conformance():
    from turngym.testing import check_env

    env = EchoEnv()
    report = check_env(env)
    assert report.ok, report.failures
    env.close()


def test_reset_must_return_task():
    class Bad(turngym.Env):
        @tool
        def noop(self) -> str:
            """Nothing."""
            return ""

        def _reset(self, rng, options):
            return [Message(role="user", content="x")]

    with pytest.raises(TypeError, match="must return a Task"):
        Bad().reset(seed=0)


def test_render_ansi():
    env = turngym.make("arith", render_mode="ansi")
    env.reset(seed=0)
    assert "Evaluate" in env.render()
    env.step(env.expert_action())
    assert "[tool (calculate)]" in env.render()
