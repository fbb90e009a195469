"""Part 3 (remote-v0): the lone-surrogate attack through ``RemoteEnv``, against a real ``turngym serve``
app on loopback (tests/remote/serving.py).

The env it serves answers a lone surrogate with an invalid turn (the parsers refuse it), whether it
travels as a JSON escape inside the action's text, raw in the text, or inside a structured
``Message``'s arguments: the server reads websocket frames with Python's JSON reader, so the
surrogate reaches the env's parser instead of failing the whole frame (before: ``RemoteEnvError``
"reply None").
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("uvicorn")

from remote.serving import TOKEN, ServerThread  # noqa: E402

import turngym  # noqa: E402
from turngym.core.types import Message, ToolCall  # noqa: E402

pytestmark = pytest.mark.reliability


@pytest.fixture(scope="module")
def served(monkeypatch_module):
    from turngym.remote.server import SessionManager

    monkeypatch_module.setenv("TURNGYM_SERVE_TOKEN", TOKEN)
    manager = SessionManager(["arith"], max_sessions=4, idle_timeout=60)
    with ServerThread(manager) as server:
        yield server


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def step_remote(url: str, action) -> dict:
    env = turngym.make("remote", url=url, env_id="arith")
    try:
        env.reset(seed=0)
        _, reward, terminated, _, info = env.step(action)
        assert reward == 0.0 and not terminated
        return info
    finally:
        env.close()


def test_an_escaped_lone_surrogate_is_an_invalid_turn_through_remote_env(served):
    call = {"name": "calculate", "arguments": {"a": "\ud800", "op": "+", "b": 1}}  # dumps writes "\ud800"
    info = step_remote(served.url, f"<tool_call>{json.dumps(call)}</tool_call>")
    assert info["invalid_action"] and "lone surrogate" in info["error"]
    info = step_remote(served.url, '<tool_call>{"name": "answer", "arguments": {"value": true}}</tool_call>')
    assert info["invalid_action"] and "valid integer" in info["error"]


@pytest.mark.parametrize(
    "action",
    [
        Message(role="assistant", tool_calls=[ToolCall(name="calculate", arguments={"a": "\ud800"})]),
        "plain text with a lone \udfff surrogate",
    ],
    ids=["structured", "raw-text"],
)
def test_a_raw_lone_surrogate_is_an_invalid_turn_through_remote_env(served, action):
    info = step_remote(served.url, action)
    assert info["invalid_action"]
