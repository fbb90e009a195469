"""The ``mcp`` env family against real MCP servers (``mcp_test_server.py``, written with the official SDK),
over stdio and streamable HTTP, driven by hand and through the rollout engine.

Covers: tool schemas -> ToolSpec (with a hypothesis property test), routing, shared vs per-episode
lifecycle (fresh state each episode, one process for shared), name collisions, and bad input (a crashing
server, a hanging tool, a flooding tool, an unexpressible schema, an unknown tool, wrong argument types,
servers that cannot start) — each an error observation or a masked trajectory with a reason, and no child
process left after close.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import turngym
from turngym.agents.scripted import ScriptedAgent
from turngym.core.types import Trajectory, Turn
from turngym.envs.mcp.client import McpConnectError, shared_pool_size
from turngym.envs.mcp.config import load_servers
from turngym.envs.mcp.env import McpEnv
from turngym.envs.mcp.judge import JUDGE
from turngym.envs.mcp.schema import UNSUPPORTED_KEYWORDS, UnsupportedSchema, check_schema, to_tool_spec
from turngym.envs.mcp.tasks import load_tasks
from turngym.rollout import RolloutConfig, RolloutEngine

SERVER = str(Path(__file__).with_name("mcp_test_server.py"))

TASKS = [
    {
        "id": "py",
        "prompt": "When was Python first released?",
        "answer": "1991",
        "solution": [{"name": "lookup", "arguments": {"topic": "python"}}, {"name": "pid"}],
    },
    {
        "id": "nile",
        "prompt": "Where does the Nile end?",
        "answers": ["Mediterranean Sea", "the Mediterranean"],
        "solution": [{"name": "lookup", "arguments": {"topic": "nile"}}, {"name": "pid"}],
    },
]


def stdio(name: str = "t", **kw) -> dict:
    return {"name": name, "command": sys.executable, "args": [SERVER], **kw}


def server_children() -> list[psutil.Process]:
    """Live (non-zombie) child processes of this test process running the test server."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and any("mcp_test_server" in a for a in p.cmdline()):
                out.append(p)
        except psutil.NoSuchProcess:
            continue
    return out


@pytest.fixture(autouse=True)
def no_leaks():
    before = {p.pid for p in server_children()}
    yield
    leaked = [p for p in server_children() if p.pid not in before]
    assert not leaked, f"leaked MCP server processes: {[p.pid for p in leaked]}"
    assert shared_pool_size() == 0


def gone(pid: int) -> bool:
    """The process has exited (reaped, or a zombie waiting to be)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def play(env: McpEnv, calls: list[tuple[str, dict]]) -> list[tuple]:
    out = []
    for name, args in calls:
        out.append(env.step(env.format_call(name, args)))
    return out


# ----------------------------------------------------------------------------- schema conversion
_leaf = st.fixed_dictionaries(
    {"type": st.sampled_from(["string", "integer", "number", "boolean"])},
    optional={"description": st.text(max_size=20), "title": st.text(max_size=10)},
)
_schema = st.recursive(
    _leaf,
    lambda sub: st.one_of(
        st.builds(lambda items: {"type": "array", "items": items}, sub),
        st.builds(
            lambda props: {"type": "object", "properties": props, "required": sorted(props)[:1]},
            st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True), sub, max_size=3),
        ),
        st.builds(lambda a, b: {"anyOf": [a, b]}, sub, sub),
        st.builds(lambda vals: {"enum": vals}, st.lists(st.integers(), min_size=1, max_size=3, unique=True)),
    ),
    max_leaves=8,
)
_roots = st.builds(
    lambda props: {"type": "object", "properties": props},
    st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True), _schema, max_size=4),
)


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(_roots)
def test_expressible_schemas_convert_unchanged(schema):
    spec = to_tool_spec("t", "d", schema)
    assert spec.parameters["type"] == "object"
    assert spec.parameters["properties"] == schema["properties"]
    assert spec.to_openai()["function"]["parameters"] == spec.parameters
    json.dumps(spec.parameters)  # travels as JSON


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(_roots, st.sampled_from(sorted(UNSUPPORTED_KEYWORDS)), st.data())
def test_an_unsupported_keyword_anywhere_is_refused_with_its_path(schema, keyword, data):
    # put the keyword into a random sub-schema (the root, a property, or deeper)
    spots: list[tuple[dict, str]] = [(schema, "#")]

    def walk(node, path):
        for key in ("properties",):
            for name, child in (node.get(key) or {}).items():
                spots.append((child, f"{path}/{key}/{name}"))
                walk(child, f"{path}/{key}/{name}")
        if isinstance(node.get("items"), dict):
            spots.append((node["items"], f"{path}/items"))
            walk(node["items"], f"{path}/items")

    walk(schema, "#")
    target, path = data.draw(st.sampled_from(spots))
    target[keyword] = {"type": "string"} if keyword not in ("minContains", "maxContains") else 1
    if keyword == "dependentRequired":
        target[keyword] = {"a": ["b"]}
    if keyword in ("prefixItems",):
        target[keyword] = [{"type": "string"}]
    if keyword in ("$dynamicRef", "$recursiveRef"):
        target[keyword] = "#"
    if keyword in ("$dynamicAnchor",):
        target[keyword] = "anchor"
    if keyword in ("$recursiveAnchor",):
        target[keyword] = True
    if keyword == "dependencies":
        target[keyword] = {"a": ["b"]}
    with pytest.raises(UnsupportedSchema) as info:
        to_tool_spec("tool_x", "d", schema, tool="srv/tool_x")
    assert "srv/tool_x" in str(info.value)
    assert info.value.path == f"{path}/{keyword}"


@settings(max_examples=60)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
        max_leaves=10,
    )
)
def test_any_json_converts_or_is_refused_clearly(value):
    try:
        out = check_schema("t", value)
    except UnsupportedSchema as e:
        assert str(e).startswith("tool 't': input schema at ")
    else:
        assert out["type"] == "object" and isinstance(out["properties"], dict)


@pytest.mark.parametrize(
    ("schema", "path"),
    [
        ({"type": "array", "items": {"type": "string"}}, "#/type"),
        ({"type": "object", "properties": {"x": {"type": "strnig"}}}, "#/properties/x/type"),
        (
            {"type": "object", "properties": {"x": {"$ref": "https://example.com/s.json"}}},
            "#/properties/x/$ref",
        ),
        ({"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}}, "#/properties/x/$ref"),
        ({"type": "object", "if": {"properties": {}}}, "#/if"),
        ("not a schema", "#"),
    ],
)
def test_unexpressible_schemas_name_the_part(schema, path):
    with pytest.raises(UnsupportedSchema) as info:
        check_schema("srv/x", schema)
    assert info.value.path == path and "srv/x" in str(info.value)


def test_local_refs_and_defs_are_kept():
    schema = {
        "type": "object",
        "properties": {"p": {"$ref": "#/$defs/P"}},
        "$defs": {"P": {"type": "object", "properties": {"x": {"type": "integer"}}}},
        "$schema": "https://json-schema.org/draft/2020-12/schema",
    }
    out = check_schema("t", schema)
    assert out["$defs"] == schema["$defs"] and "$schema" not in out


# ----------------------------------------------------------------------------- configs and tasks
def test_configs_and_tasks_reject_bad_input(tmp_path):
    with pytest.raises(ValueError, match="a stdio server needs a command"):
        load_servers([{"name": "a"}])
    with pytest.raises(ValueError, match="http"):
        load_servers([{"name": "a", "transport": "http", "url": "ftp://x"}])
    with pytest.raises(ValueError, match="unique"):
        load_servers([stdio("a"), stdio("a")])
    f = tmp_path / "mcp.json"
    f.write_text(
        json.dumps(
            {"mcpServers": {"kb": {"command": "python", "args": ["s.py"]}, "web": {"url": "http://h/mcp"}}}
        )
    )
    kb, web = load_servers(str(f))
    assert (kb.transport, kb.command, web.transport, web.url) == ("stdio", "python", "http", "http://h/mcp")

    bad = tmp_path / "tasks.jsonl"
    bad.write_text('{"prompt": "a", "answer": "b"}\n{"answer": "c"}\n')
    with pytest.raises(ValueError, match=r"tasks.jsonl: line 2: prompt"):
        load_tasks(str(bad))
    bad.write_text('{"prompt": "a"\n')
    with pytest.raises(ValueError, match="line 1: not valid JSON"):
        load_tasks(str(bad))
    good = tmp_path / "tasks.json"
    good.write_text(json.dumps([{"prompt": "q", "reference": {"answer": "x"}, "metadata": {"k": 1}}]))
    (task,) = load_tasks(str(good))
    assert (task.id, task.answers, task.metadata) == ("task-0", ["x"], {"k": 1})


# ----------------------------------------------------------------------------- stdio, shared, engine
def test_stdio_shared_server_through_the_engine():
    def factory():
        return McpEnv(servers=[stdio()], tasks=TASKS)

    engine = RolloutEngine(factory, ScriptedAgent(), RolloutConfig(group_size=2, max_concurrency=4))
    trajs = asyncio.run(engine.run([0, 1]))
    assert engine.stats.reconciles() and engine.stats.masked == 0
    assert [t.total_reward for t in trajs] == [1.0] * 4
    pids = {t.turns[1].observation[0].content for t in trajs}
    assert len(pids) == 1, "a shared server serves every env of the process"
    assert trajs[0].turns[0].observation[0].content in (
        "Python was first released in 1991.",
        "The Nile ends in the Mediterranean Sea.",
    )
    assert {t.turns[-1].reward_components["em"] for t in trajs} == {1.0}


def test_tools_specs_and_errors_as_observations():
    env = McpEnv(servers=[stdio(timeout=1.5)], tasks=TASKS, max_output_chars=1000, invalid_penalty=0.1)
    try:
        names = {s.name for s in env.tools}
        assert {"answer", "lookup", "increment", "crash", "hang", "flood", "fail"} <= names
        assert "weird" not in names and any("'not'" in d and "t/weird" in d for d in env.dropped_tools)
        spec = next(s for s in env.tools if s.name == "increment")
        assert spec.parameters["properties"]["by"]["type"] == "integer"
        obs, info = env.reset(options={"task_id": "py"})
        assert any("t/weird" in d for d in info["mcp_dropped_tools"])
        assert "increment" in obs[0].content  # the tools are in the prompt

        ((obs, r, term, trunc, info),) = play(env, [("nosuch", {})])
        assert info["tool_results"][0].error_kind == "unknown_tool" and info["invalid_action"]
        assert info["reward_components"]["invalid"] == pytest.approx(-0.1) and not term

        ((obs, r, term, trunc, info),) = play(env, [("increment", {"by": "two"})])
        res = info["tool_results"][0]
        assert res.error_kind == "bad_arguments" and "'by'" in res.error and info["invalid_action"]

        ((obs, r, term, trunc, info),) = play(env, [("fail", {})])
        res = info["tool_results"][0]
        assert res.error_kind == "tool_error" and "always fails" in res.error

        t0 = time.monotonic()
        ((obs, r, term, trunc, info),) = play(env, [("hang", {"seconds": 30})])
        res = info["tool_results"][0]
        assert res.error_kind == "timeout" and time.monotonic() - t0 < 10 and not term
        assert not info["invalid_action"]  # the tool's fault, not the model's

        ((obs, r, term, trunc, info),) = play(env, [("flood", {"chars": 200_000})])
        res = info["tool_results"][0]
        assert res.ok and res.truncated and len(res.content) <= 1000 and "characters truncated" in res.content

        ((obs, r, term, trunc, info),) = play(env, [("lookup", {"topic": "python"})])
        assert info["tool_results"][0].content == "Python was first released in 1991."  # still usable
        ((obs, r, term, trunc, info),) = play(env, [("answer", {"text": "1991"})])
        assert term and r == 1.0 and info["reward_components"]["em"] == 1.0
    finally:
        env.close()


def test_unexpressible_schema_can_be_refused_at_connect():
    with pytest.raises(UnsupportedSchema, match=r"tool 't/weird': input schema at #/properties/value/not"):
        McpEnv(servers=[stdio()], tasks=TASKS, on_unsupported_schema="error")


def test_name_collisions_get_prefixes():
    env = McpEnv(servers=[stdio("a"), stdio("b", include=["lookup", "pid"])], tasks=TASKS)
    try:
        names = {s.name for s in env.tools}
        assert {"a__lookup", "b__lookup", "a__pid", "b__pid", "increment", "answer"} <= names
        assert "lookup" not in names
        env.reset(options={"task_id": "py"})
        (_, _, _, _, ia), (_, _, _, _, ib) = play(env, [("a__pid", {}), ("b__pid", {})])
        assert ia["tool_results"][0].content != ib["tool_results"][0].content  # routed to two servers
    finally:
        env.close()


# ----------------------------------------------------------------------------- per-episode servers
def test_per_episode_server_state_is_fresh_each_episode():
    env = McpEnv(servers=[stdio(lifecycle="per_episode")], tasks=TASKS)
    pids = []
    try:
        for _ in range(2):
            env.reset(options={"task_id": "py"})
            steps = play(env, [("increment", {}), ("increment", {"by": 2}), ("pid", {})])
            assert [s[4]["tool_results"][0].content for s in steps[:2]] == ["1", "3"]
            pids.append(int(steps[2][4]["tool_results"][0].content))
        assert pids[0] != pids[1] and gone(pids[0])  # the first episode's server stopped at the reset
    finally:
        env.close()
    assert all(gone(p) for p in pids)


def test_crashing_server_masks_the_episode_and_leaves_nothing():
    env = McpEnv(servers=[stdio(lifecycle="per_episode")], tasks=TASKS)
    try:
        env.reset(options={"task_id": "py"})
        ((obs, r, term, trunc, info),) = play(env, [("crash", {})])
        res = info["tool_results"][0]
        assert res.error_kind == "server_lost" and "closed the connection" in res.error
        assert term and r == 0.0 and info["reward_components"] == {}
        assert info["masked"] and "mcp server lost" in info["mask_reason"]
        assert not info["invalid_action"]
        obs, info = env.reset(options={"task_id": "py"})  # a new server for the next episode
        ((obs, r, term, trunc, info),) = play(env, [("increment", {})])
        assert info["tool_results"][0].content == "1" and "masked" not in info
    finally:
        env.close()


def test_a_shared_server_that_died_between_episodes_is_replaced_at_reset():
    env = McpEnv(servers=[stdio()], tasks=TASKS)
    try:
        env.reset(options={"task_id": "py"})
        ((_, _, _, _, info),) = play(env, [("pid", {})])
        first = int(info["tool_results"][0].content)
        psutil.Process(first).kill()  # not reaped here: the SDK's transport owns the child
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not gone(first):
            time.sleep(0.05)
        assert gone(first)
        env.reset(options={"task_id": "py"})  # the ping fails: a new server, not a lost episode
        ((_, _, term, _, info),) = play(env, [("pid", {})])
        assert info["tool_results"][0].ok and int(info["tool_results"][0].content) != first
        assert "masked" not in info and not term
    finally:
        env.close()


def test_crash_through_the_engine_is_a_masked_trajectory():
    class CrashAgent:
        name = "crash"

        def start(self, env, prompt, *, seed, route):
            from turngym.agents.scripted import _ScriptedSession

            session = _ScriptedSession(env, prompt)
            session.env = type("E", (), {"expert_action": lambda self_: env.format_call("crash", {})})()
            return session

    engine = RolloutEngine(
        lambda: McpEnv(servers=[stdio()], tasks=TASKS), CrashAgent(), RolloutConfig(group_size=1)
    )
    (traj,) = asyncio.run(engine.run([0]))
    assert traj.masked and traj.mask_reason == "env_error"
    assert "mcp server lost" in traj.metadata["error"]
    assert traj.turns[-1].tool_results[0].error_kind == "server_lost"


def test_an_agent_failure_mid_episode_still_stops_the_servers():
    tasks = [{"id": "open", "prompt": "Say something."}]  # no answer: the scripted expert has no action
    engine = RolloutEngine(
        lambda: McpEnv(servers=[stdio(lifecycle="per_episode")], tasks=tasks), ScriptedAgent()
    )
    (traj,) = asyncio.run(engine.run([0]))
    assert traj.masked and traj.mask_reason == "agent_error"


def test_servers_that_cannot_start_give_clear_errors(tmp_path):
    with pytest.raises(
        McpConnectError, match=r"cannot connect to MCP server 'gone' \(stdio: /no/such/binary"
    ):
        McpEnv(servers=[{"name": "gone", "command": "/no/such/binary"}], tasks=TASKS)
    quits = tmp_path / "quits.py"
    quits.write_text("import sys; sys.exit(2)\n")
    with pytest.raises(McpConnectError, match="'quits'"):
        McpEnv(servers=[{"name": "quits", "command": sys.executable, "args": [str(quits)]}], tasks=TASKS)
    port = _free_port()
    with pytest.raises(McpConnectError, match="'down'"):
        McpEnv(
            servers=[
                {
                    "name": "down",
                    "transport": "http",
                    "url": f"http://127.0.0.1:{port}/mcp",
                    "connect_timeout": 5,
                }
            ],
            tasks=TASKS,
        )
    # a per-episode server that cannot start fails the reset; the engine masks it with the reason
    engine = RolloutEngine(
        lambda: McpEnv(
            servers=[{"name": "gone", "command": "/no/such/binary", "lifecycle": "per_episode"}], tasks=TASKS
        ),
        ScriptedAgent(),
    )
    (traj,) = asyncio.run(engine.run([0]))
    assert traj.masked and traj.mask_reason == "env_error" and "'gone'" in traj.metadata["error"]


def test_judge_scores_process_and_answer():
    good = Trajectory(reference={"answers": ["1991"]})
    good.turns.append(Turn(index=0, action={"role": "assistant"}, info={"answer": "1991"}))
    bad = Trajectory(reference={"answers": ["1991"]})
    bad.turns.append(Turn(index=0, action={"role": "assistant"}, info={"answer": "1066"}))
    a, b = JUDGE.pairwise(good, bad)
    assert a > b and a == pytest.approx(7.0) and b == 0.0


# ----------------------------------------------------------------------------- streamable HTTP
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def http_server():
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, SERVER, "--http", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.2)
        else:
            raise RuntimeError("the HTTP MCP server did not start")
        yield proc, f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(10)


def test_streamable_http_server_through_the_engine(http_server):
    proc, url = http_server
    servers = [{"name": "web", "transport": "http", "url": url, "timeout": 2}]
    engine = RolloutEngine(
        lambda: McpEnv(servers=servers, tasks=TASKS), ScriptedAgent(), RolloutConfig(group_size=2)
    )
    trajs = asyncio.run(engine.run([0, 1]))
    assert [t.total_reward for t in trajs] == [1.0] * 4 and engine.stats.masked == 0
    assert {t.turns[1].observation[0].content for t in trajs} == {str(proc.pid)}

    env = turngym.make("mcp", servers=servers, tasks=TASKS)
    try:
        env.reset(options={"task_id": "nile"})
        ((_, _, term, _, info),) = play(env, [("hang", {"seconds": 20})])
        assert info["tool_results"][0].error_kind == "timeout" and not term
        proc.kill()  # the server goes away mid-episode
        proc.wait(10)
        ((_, r, term, _, info),) = play(env, [("lookup", {"topic": "nile"})])
        res = info["tool_results"][0]
        assert not res.ok and term and r == 0.0 and info["masked"], res
    finally:
        env.close()


def test_default_env_is_the_demo_server():
    env = turngym.make("mcp")
    try:
        obs, info = env.reset(options={"task_index": 2})
        done, reward = False, 0.0
        while not done:
            _, reward, term, trunc, _ = env.step(env.expert_action())
            done = term or trunc
        assert reward == 1.0 and {"lookup", "subtract", "answer"} == {s.name for s in env.tools}
    finally:
        env.close()


@pytest.mark.slow
def test_conformance_suite_passes():
    from turngym.testing import check_env

    report = check_env("mcp-v0")
    report.raise_for_failures()
    assert "NotForkable" in next(r for r in report.results if r.name == "fork").detail
