"""OpenAI chat agent over a local OpenAI-compatible HTTP endpoint (httpx transport) with tool calls."""

import json

import httpx
from openai import AsyncOpenAI

from turngym.agents.openai_chat import OpenAIChatAgent, to_openai_messages
from turngym.core.types import Message
from turngym.rollout import RolloutEngine


def api(replies):
    """An OpenAI-compatible endpoint that answers with ``replies`` in turn and records requests."""
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        if not replies:
            return httpx.Response(500, json={"error": {"message": "overloaded"}})
        msg = replies.pop(0)
        return httpx.Response(
            200,
            json={
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {"index": 0, "message": {"role": "assistant", **msg}, "finish_reason": "tool_calls"}
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
            },
        )

    client = AsyncOpenAI(
        api_key="k",
        base_url="http://api.test/v1",
        max_retries=0,
        http_client=httpx.AsyncClient(transport=httpx.MockTransport(handler)),
    )
    return client, seen


def call(i, name, args):
    return {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": args}}


async def test_native_tool_calls_drive_the_env():
    import turngym

    env = turngym.make("arith", tools_in_prompt=False, depth=1)
    obs, info = await env.areset(seed=0)
    a, op, b = info["reference"]["expression"].strip("()").split()
    client, seen = api(
        [
            {
                "content": None,
                "tool_calls": [call(1, "calculate", json.dumps({"a": int(a), "op": op, "b": int(b)}))],
            },
            {
                "content": "",
                "tool_calls": [call(2, "answer", json.dumps({"value": info["reference"]["answer"]}))],
            },
        ]
    )
    eng = RolloutEngine(
        "arith", OpenAIChatAgent("m", client=client), env_kwargs={"tools_in_prompt": False, "depth": 1}
    )
    (t,) = await eng.run([0])
    assert not t.masked and t.outcome == 1.0 and t.num_turns == 2
    assert [tool["function"]["name"] for tool in seen[0]["tools"]] == ["calculate", "answer"]
    second = seen[1]["messages"]
    assert second[-2]["tool_calls"][0]["id"] == "c1"
    value = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
    assert second[-1] == {"role": "tool", "content": str(value), "tool_call_id": "c1"}
    assert "You may call" not in seen[0]["messages"][0]["content"]  # no tool text in the prompt


async def test_bad_arguments_and_api_failures():
    client, _ = api([{"content": "", "tool_calls": [call(1, "calculate", "{not json")]}])
    eng = RolloutEngine("arith", OpenAIChatAgent("m", client=client), env_kwargs={"tools_in_prompt": False})
    (t,) = await eng.run([0])
    first = t.turns[0]
    assert first.invalid_action and first.tool_results[0].error_kind == "bad_arguments"
    assert "{not json" in first.info["agent"]["bad_arguments"]["c1"]
    assert t.masked and t.mask_reason == "backend_error" and "overloaded" in t.metadata["error"]


async def test_env_with_tools_in_prompt_is_refused():
    client, _ = api([])
    (t,) = await RolloutEngine("arith", OpenAIChatAgent("m", client=client)).run([0])
    assert t.mask_reason == "agent_error" and "tools_in_prompt=False" in t.metadata["error"]


def test_error_observations_without_call_id_become_user_messages():
    msgs = to_openai_messages(
        [
            Message(role="tool", content="Error: x"),
            Message(role="tool", content="5", name="c", tool_call_id="1"),
        ]
    )
    assert msgs == [
        {"role": "user", "content": "Error: x"},
        {"role": "tool", "content": "5", "tool_call_id": "1"},
    ]


async def test_tool_choice_is_sent_and_checked():
    import pytest

    import turngym

    client, seen = api([{"content": None, "tool_calls": [call(1, "answer", '{"value": 1}')]}] * 2)
    for choice, sent in [
        ("required", "required"),
        ("answer", {"type": "function", "function": {"name": "answer"}}),
    ]:
        eng = RolloutEngine(
            "arith",
            OpenAIChatAgent("m", client=client, tool_choice=choice),
            env_kwargs={"tools_in_prompt": False, "depth": 1},
        )
        (t,) = await eng.run([0])
        assert not t.masked and t.terminated and seen[-1]["tool_choice"] == sent
    env = turngym.make("arith", tools_in_prompt=False)
    with pytest.raises(ValueError, match="not one of this env's tools"):
        OpenAIChatAgent("m", client=client, tool_choice="submit").start(env, [], seed=0, route="r")
