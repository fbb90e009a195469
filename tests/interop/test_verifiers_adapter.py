"""verifiers adapter: a turngym env as a verifiers (v1) taskset + environment, run through verifiers'
own eval loop (``run_eval``: interception server, harness, scoring) against a local OpenAI-compatible
chat server.

The server is a real HTTP server (FastAPI + uvicorn, in a thread) whose policy is scripted: it reads the
arith expression from the conversation and, on its first turn, writes a malformed tool call, then the
right ``calculate`` call, then ``answer`` with the value the tool returned. So the rewards are known.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time

import pytest

pytest.importorskip("verifiers")
uvicorn = pytest.importorskip("uvicorn")
fastapi = pytest.importorskip("fastapi")

import turngym  # noqa: E402
from turngym.interop.verifiers import (  # noqa: E402
    TurngymTaskset,
    TurngymTasksetConfig,
    evaluate,
    load_environment,
    observation_text,
)

ENV_KWARGS = {"depth": 1, "max_turns": 4}


def _reply(messages: list[dict]) -> str:
    expr = next(m["content"] for m in messages if m["role"] == "user" and "Evaluate:" in m["content"])
    a, op, b = expr.split("Evaluate:")[1].strip().strip("()").split()
    responses = [m["content"] for m in messages if m["role"] == "user" and "<tool_response>" in m["content"]]
    if not responses:  # first turn: a tool call that is not JSON
        return '<tool_call>{"name": "calculate", "arguments": {"a": ' + a + ", </tool_call>"
    if len(responses) == 1:
        call = {"name": "calculate", "arguments": {"a": int(a), "op": op, "b": int(b)}}
    else:
        value = re.search(r"<tool_response>\n(-?\d+)\n", responses[-1]).group(1)
        call = {"name": "answer", "arguments": {"value": int(value)}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


def _native(body: dict, n: int) -> dict:
    """The same policy with structured ``tool_calls`` (OpenAI function calling) instead of Hermes text."""
    messages = body["messages"]
    expr = next(m["content"] for m in messages if m["role"] == "user" and "Evaluate:" in m["content"])
    a, op, b = expr.split("Evaluate:")[1].strip().strip("()").split()
    results = [m for m in messages if m["role"] == "tool"]
    if not results:
        name, args = "calculate", {"a": int(a), "op": op, "b": int(b)}
    else:
        name, args = "answer", {"value": int(results[-1]["content"])}
    call = {"id": f"call-{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
    return {
        "id": f"chatcmpl-{n}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body["model"],
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {"role": "assistant", "content": "", "tool_calls": [call]},
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
    }


@pytest.fixture(scope="module")
def policy_server():
    app = fastapi.FastAPI()
    seen: list[list[dict]] = []

    @app.post("/v1/chat/completions")
    async def chat(request: fastapi.Request) -> dict:
        body = await request.json()
        seen.append(body["messages"])
        if body.get("model") == "scripted-native":
            return _native(body, len(seen))
        text = _reply(body["messages"])
        return {
            "id": f"chatcmpl-{len(seen)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "scripted"),
            "choices": [
                {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
        }

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    assert server.started
    yield f"http://127.0.0.1:{port}/v1", seen
    server.should_exit = True
    thread.join(timeout=10)


def test_the_taskset_holds_the_env_tasks():
    tasks = list(
        TurngymTaskset(
            TurngymTasksetConfig(id="turngym_verifiers", env_id="arith", num_tasks=3, env_kwargs=ENV_KWARGS)
        )
    )
    assert [t.data.seed for t in tasks] == [0, 1, 2]
    first = turngym.make("arith", **ENV_KWARGS).reset(seed=0)
    assert tasks[0].data.turngym_task_id == first[1]["task_id"]
    assert tasks[0].data.system_prompt == first[0][0].content and "<tool_call>" in tasks[0].data.system_prompt
    assert tasks[0].data.prompt == first[0][1].content
    assert len({t.key for t in tasks}) == 3


def test_observations_become_one_user_turn():
    from turngym.core.types import Message

    text = observation_text([Message(role="tool", content="7"), Message(role="user", content="page")])
    assert text == "<tool_response>\n7\n</tool_response>\npage"


def test_unknown_env_ids_are_clear_errors():
    with pytest.raises(turngym.UnknownEnvError, match="Did you mean: arith"):
        load_environment(env_id="arithh")


def test_run_eval_plays_episodes_and_returns_turngym_rewards(policy_server, tmp_path):
    url, seen = policy_server
    episodes = asyncio.run(
        evaluate(
            "arith",
            model="scripted",
            base_url=url,
            num_tasks=3,
            env_kwargs=ENV_KWARGS,
            output_dir=str(tmp_path),
        )
    )
    assert len(episodes) == 3
    for episode in episodes:
        assert episode.ok, episode.errors
        (trace,) = episode.traces
        assert (trace.rewards["turngym_return"].score, trace.rewards["turngym_return"].weight) == (1.0, 1.0)
        assert (trace.rewards["turngym/correct"].score, trace.rewards["turngym/correct"].weight) == (1.0, 0.0)
        assert trace.info["turngym_steps"] == 3 and trace.info["turngym_done"] is True
        assert trace.info["turngym_invalid_actions"] == 1  # the malformed first call
    # the malformed call got turngym's error observation as the next user turn
    second_turns = [
        m for m in seen if sum("<tool_response>" in x["content"] for x in m if x["role"] == "user") == 1
    ]
    assert len(second_turns) == 3
    assert all("Error: the tool call is not valid JSON" in m[-1]["content"] for m in second_turns)
    # verifiers wrote its own results file with the same rewards
    traces = list(tmp_path.rglob("traces.jsonl"))
    assert traces and traces[0].read_text().count("turngym_return") >= 3


def test_an_env_that_raises_mid_episode_fails_that_episode_only(policy_server, tmp_path):
    from turngym.envs.arith.env import ArithEnv

    class Crash(ArithEnv):
        def _turn_reward(self, results, done):
            if self.turn >= 2:
                raise RuntimeError("reward service unreachable")
            return super()._turn_reward(results, done)

    turngym.register("arith-crashing-vf", Crash, override=True, description="test: raises on turn 2")
    url, _ = policy_server
    episodes = asyncio.run(
        evaluate(
            "arith-crashing-vf",
            model="scripted",
            base_url=url,
            num_tasks=2,
            env_kwargs=ENV_KWARGS,
            output_dir=str(tmp_path),
        )
    )
    assert len(episodes) == 2
    for episode in episodes:
        assert not episode.ok
        assert "reward service unreachable" in json.dumps(episode.model_dump(mode="json"), default=str)
        assert all(t.rewards.get("turngym_return") is None for t in episode.traces)


def test_structured_tool_calls_are_answered_with_tool_messages(policy_server, tmp_path):
    url, seen = policy_server
    before = len(seen)
    episodes = asyncio.run(
        evaluate(
            "arith",
            model="scripted-native",
            base_url=url,
            num_tasks=1,
            env_kwargs=ENV_KWARGS,
            output_dir=str(tmp_path),
        )
    )
    (episode,) = episodes
    assert episode.ok, episode.errors
    (trace,) = episode.traces
    assert trace.rewards["turngym_return"].score == 1.0 and trace.info["turngym_steps"] == 2
    second = seen[before + 1]
    calls = [m for m in second if m["role"] == "assistant" and m.get("tool_calls")]
    results = [m for m in second if m["role"] == "tool"]
    assert calls and results and results[-1]["tool_call_id"] == calls[-1]["tool_calls"][0]["id"]
