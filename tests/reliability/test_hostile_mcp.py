"""Part 3 (MCP): one episode's bad payload cannot take down a shared MCP server, and MCP tools validate
integers as strictly as Python tools.

Regression for issue 3: one episode's ``lookup(topic="\\ud800")`` reached the SDK's stdio writer, whose
encoding error ended the shared session; every other episode on that server then lost its server and was
masked (37 in the report). Now the call is refused alone (``bad_arguments``) before it is sent.

Real servers over stdio: the demo server (``turngym.make("mcp")``) and tests/envs/mcp/mcp_test_server.py.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import psutil
import pytest

import turngym
from turngym.core.types import Message, ToolCall
from turngym.envs.mcp.client import shared_pool_size
from turngym.tools import BadArguments

pytestmark = pytest.mark.reliability

TEST_SERVER = str(Path(__file__).parents[1] / "envs" / "mcp" / "mcp_test_server.py")
SURROGATE = "\ud800"
EPISODES = 8


def bad_payloads() -> list[str | Message]:
    """The same call in each form a client can send it: structured, Hermes text with the JSON escape,
    a lone low surrogate inside otherwise fine text, and the surrogate as an object key."""
    return [
        Message(
            role="assistant", tool_calls=[ToolCall(id="x", name="lookup", arguments={"topic": SURROGATE})]
        ),
        '<tool_call>{"name": "lookup", "arguments": {"topic": "\\ud800"}}</tool_call>',
        Message(role="assistant", tool_calls=[ToolCall(name="lookup", arguments={"topic": "py\udfffthon"})]),
        Message(role="assistant", tool_calls=[ToolCall(name="lookup", arguments={SURROGATE: "python"})]),
    ]


def demo_server_processes() -> set[int]:
    return {
        p.pid
        for p in psutil.Process().children(recursive=True)
        if p.status() != psutil.STATUS_ZOMBIE and any("demo_server" in a for a in p.cmdline())
    }


def solve(env) -> tuple[float, dict]:
    reward, info, done = 0.0, {}, False
    while not done and (action := env.expert_action()) is not None:
        _, reward, terminated, truncated, info = env.step(action)
        done = terminated or truncated
    return reward, info


def test_one_bad_payload_does_not_take_down_a_shared_mcp_server():
    envs = [turngym.make("mcp", max_turns=20) for _ in range(EPISODES)]
    try:
        for i, env in enumerate(envs):
            env.reset(seed=i)
        (server,) = demo_server_processes()  # one shared server for every env of the process
        attacker = envs[0]
        for action in bad_payloads():
            _, reward, terminated, _, info = attacker.step(action)
            assert info["invalid_action"] and "lone surrogate" in info["error"], info["error"]
            assert not terminated and reward <= 0.0 and not info.get("masked"), info
        # the attacker's own episode goes on, and every other episode is untouched
        for env in envs:
            reward, info = solve(env)
            assert reward == 1.0 and not info.get("masked"), info
        assert demo_server_processes() == {server}
    finally:
        for env in envs:
            env.close()
    assert shared_pool_size() == 0 and not demo_server_processes()


def test_the_connection_refuses_what_it_cannot_send():
    """The guard under the env: ``McpConnection.call`` itself refuses a payload the transport cannot
    encode (a lone surrogate, bytes, NaN, a set) without sending it, and the connection stays up."""
    env = turngym.make("mcp")
    try:
        env.reset(seed=0)
        conn = env._shared["demo"]
        for arguments in ({"topic": SURROGATE}, {"topic": b"\xff"}, {"topic": float("nan")}, {"topic": {1}}):
            with pytest.raises(BadArguments, match="not sent to MCP server 'demo'"):
                asyncio.run(conn.call("lookup", arguments, 10.0))
            assert conn.alive
        result = asyncio.run(conn.call("lookup", {"topic": "python"}, 10.0))
        assert not result.is_error and "1991" in result.content[0].text
    finally:
        env.close()


@pytest.mark.parametrize("value", [True, "2", 2.0])
def test_an_mcp_integer_argument_is_an_integer_literal(value):
    """JSON Schema calls 2.0 an integer and the server's own validation coerces "2"; turngym refuses all
    three before the call is sent, as it does for a Python tool's ``int``."""
    servers = [{"name": "t", "command": sys.executable, "args": [TEST_SERVER], "lifecycle": "per_episode"}]
    env = turngym.make("mcp", servers=servers, tasks=[{"prompt": "count", "answer": "1"}])
    try:
        env.reset(seed=0)
        call = {"name": "increment", "arguments": {"by": value}}
        _, _, _, _, info = env.step(f"<tool_call>{json.dumps(call)}</tool_call>")
        (result,) = info["tool_results"]
        assert result.error_kind == "bad_arguments" and "'by'" in result.error and info["invalid_action"]
        _, _, _, _, info = env.step(env.format_call("increment", {"by": 2}))
        assert info["tool_results"][0].content == "2"  # nothing was counted by the refused call
    finally:
        env.close()
