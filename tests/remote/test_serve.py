"""``turngym serve`` and ``RemoteEnv``: real uvicorn servers on free ports, driven by the rollout engine,
raw HTTP/WebSocket clients, openenv-core's client and the MCP SDK's client."""

from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")
pytest.importorskip("websockets")
pytest.importorskip("bm25s")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from websockets.asyncio.client import connect  # noqa: E402

import turngym  # noqa: E402
from turngym.agents.scripted import ScriptedAgent  # noqa: E402
from turngym.core.env import NotForkable, Task  # noqa: E402
from turngym.core.types import Message  # noqa: E402
from turngym.remote import RemoteEnv, RemoteEnvError, RemoteEnvLost  # noqa: E402
from turngym.remote.server import SessionManager  # noqa: E402
from turngym.rollout import RolloutConfig, RolloutEngine  # noqa: E402
from turngym.tools import tool  # noqa: E402
from turngym.tools.env import Env  # noqa: E402

from .serving import (  # noqa: E402
    AUTH,
    TOKEN,
    TRAINER,
    ServerThread,
    free_port,
    mcp_client,
    start_cli_server,
    stop,
    wait_for,
    with_token,
)

pytestmark = pytest.mark.timeout(300)

SEARCH = {"n_passages": 600, "n_tasks": 40}
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR-not-really-an-image\xff\x00"


class PictureEnv(Env):
    """Observations with images, bytes and numpy values in its info; not forkable."""

    default_max_turns = 3

    @tool
    def look(self, at: str) -> str:
        """Look at something.

        Args:
            at: what to look at
        """
        return f"you see {at}"

    @tool
    async def pause(self, seconds: float) -> str:
        """Wait a while.

        Args:
            seconds: how long
        """
        await asyncio.sleep(seconds)
        return "waited"

    def _reset(self, rng, options):
        return Task(
            [Message(role="user", content="look", images=[PNG])], task_id="pic", reference={"k": [1, 2]}
        )

    def _observe(self, results):
        return [Message(role="user", content="frame", images=[PNG, PNG[::-1]])]

    def _turn_reward(self, results, done):
        return {"seen": 0.5, "cost": -0.25}

    def _step_info(self):
        return {"raw": b"\x00\x01", "score": np.float32(1.5), "bound": float("inf")}

    def expert_action(self):
        return self.format_call("look", {"at": "the sky"})


@pytest.fixture(autouse=True)
def _tokens(monkeypatch):
    """RemoteEnv (and the rollout engine's) read the tokens from the environment."""
    monkeypatch.setenv("TURNGYM_SERVE_TOKEN", TOKEN)
    monkeypatch.setenv("TURNGYM_SERVE_TRAINER_TOKEN", TRAINER)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("serve-cache"))


@pytest.fixture(scope="module")
def served(cache_dir):
    turngym.register("serve-picture-v0", PictureEnv, family="test")
    try:
        manager = SessionManager(
            ["arith", "search-qa", "serve-picture"],
            max_sessions=16,
            idle_timeout=60,
            env_kwargs_for={"search-qa": {**SEARCH, "cache_dir": cache_dir}},  # the operator's --env-arg
        )
        with ServerThread(manager, mcp=True) as server:
            yield server
        assert manager.sessions == {} and manager.stats.close_errors == 0
    finally:
        turngym.registry.unregister("serve-picture-v0")


def _turns(traj):
    return [
        (
            t.action,
            t.observation,
            t.reward,
            t.reward_components,
            t.state_key,
            t.tool_results,
            t.terminated,
            t.truncated,
        )
        for t in traj.turns
    ]


@pytest.mark.parametrize("env_id", ["arith", "search-qa"])
async def test_engine_remote_trajectories_equal_local_ones(served, cache_dir, env_id):
    kwargs = {**SEARCH, "cache_dir": cache_dir} if env_id == "search-qa" else {}
    cfg = RolloutConfig(group_size=2, max_concurrency=4)
    before = served.manager.stats.opened
    remote = await RolloutEngine(
        "remote",
        ScriptedAgent(),
        cfg,
        env_kwargs={"url": served.url, "env_id": env_id},  # the server sets search-qa's arguments
        env_id=env_id,
    ).run(range(3))
    local = await RolloutEngine(env_id, ScriptedAgent(), cfg, env_kwargs=kwargs).run(range(3))
    assert [t.masked for t in remote] == [False] * 6, [t.metadata.get("error") for t in remote]
    assert [(t.seed, t.sample, t.group) for t in remote] == [(t.seed, t.sample, t.group) for t in local]
    for r, loc in zip(remote, local, strict=True):
        assert (r.prompt, r.task_id, r.reference, r.start_state_key) == (
            loc.prompt,
            loc.task_id,
            loc.reference,
            loc.start_state_key,
        )
        assert _turns(r) == _turns(loc)
        assert r.num_turns >= 2 and r.total_reward == loc.total_reward
    assert all(t.total_reward == 1.0 for t in remote)  # the expert solves every task
    assert served.manager.stats.opened == before + 6
    wait_for(lambda: served.manager.sessions == {})  # every env was closed with its trajectory


async def test_max_turns_tightens_the_remote_limit(served):
    cfg = RolloutConfig(max_turns=1)
    trajs = await RolloutEngine("remote", ScriptedAgent(), cfg, env_kwargs={"url": served.url}).run(2)
    assert [(t.masked, t.truncated, t.terminated, t.num_turns) for t in trajs] == [
        (False, True, False, 1)
    ] * 2


async def test_images_bytes_and_numpy_infos_cross_the_wire(served):
    local, remote = turngym.make("serve-picture"), RemoteEnv(served.url, env_id="serve-picture")
    try:
        assert remote.tools == local.tools and remote.tool_instructions() == local.tool_instructions()
        (lo, li), (ro, ri) = await local.areset(seed=0), await remote.areset(seed=0)
        assert ro == lo and ro[0].images == [PNG] and ri == li
        action = await remote.expert_action()
        assert action == local.expert_action()
        lstep, rstep = await local.astep(action), await remote.astep(action)
        assert rstep[:4] == lstep[:4] and rstep[0][-1].images == [PNG, PNG[::-1]]
        assert rstep[4]["reward_components"] == {"seen": 0.5, "cost": -0.25} and rstep[1] == 0.25
        assert rstep[4]["tool_results"] == lstep[4]["tool_results"]
        assert rstep[4]["reference"] == {"k": [1, 2]} and rstep[4]["state_key"] == lstep[4]["state_key"]
        assert rstep[4]["score"] == 1.5 and rstep[4]["raw"] == "AAE="  # JSON: numbers, bytes as base64
        assert rstep[4]["bound"] == float("inf")  # not null: non-finite floats cross as Infinity
        with pytest.raises(NotForkable, match="cannot fork"):
            await remote.afork()
    finally:
        await remote.aclose()
        await local.aclose()
    await remote.aclose()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        await remote.astep(action)


def test_fork_over_the_wire_matches_a_local_fork(served):
    local, remote = turngym.make("arith"), turngym.make("remote", url=served.url, env_id="arith")
    assert remote.forkable and remote.spec.id == "remote-v0"
    local.reset(seed=4)
    remote.reset(seed=4)
    first = local.expert_action()
    assert local.step(first)[:4] == remote.step(first)[:4]
    local_child, remote_child = local.fork(), remote.fork()
    assert (
        isinstance(remote_child, RemoteEnv) and remote_child.session.session_id != remote.session.session_id
    )
    try:
        # the children follow the expert to the end; the parents take a wrong answer: independent branches
        while True:
            action = local_child.expert_action()
            lstep, rstep = local_child.step(action), remote_child.step(action)
            assert rstep[:4] == lstep[:4] and rstep[4]["state_key"] == lstep[4]["state_key"]
            if lstep[2] or lstep[3]:
                break
        assert rstep[1] == 1.0
        wrong = local.format_call("answer", {"value": 123456})
        assert remote.step(wrong)[:4] == local.step(wrong)[:4]
    finally:
        for env in (local, remote, local_child, remote_child):
            env.close()
    wait_for(lambda: served.manager.sessions == {})


def test_http_protocol_answers_bad_input_with_clear_4xx(served):
    with httpx.Client(base_url=served.url, timeout=30, headers=AUTH) as http:
        assert http.get("/health").json()["envs"] == ["arith-v0", "search-qa-v0", "serve-picture-v0"]
        r = http.post("/sessions", json={"env_id": "arithh"})
        assert r.status_code == 404 and r.json()["detail"]["kind"] == "unknown_env"
        assert "Did you mean: arith" in r.json()["detail"]["error"]
        r = http.post("/sessions", json={"env_id": "search-r1"})
        assert r.status_code == 403 and "not served here" in r.json()["detail"]["error"]
        r = http.post("/sessions", json={"env_id": "arith", "kwargs": {"no_such_arg": 1}})
        assert r.status_code == 403 and "no_such_arg" in r.json()["detail"]["error"]  # not allow-listed
        r = http.post("/sessions", json={"env_id": "arith", "max_turns": 0})
        assert r.status_code == 422 and r.json()["detail"]["kind"] == "malformed"
        r = http.post("/sessions", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 422 and "malformed request" in r.json()["detail"]["error"]
        r = http.post("/sessions/nope/step", json={"action": "hi"})
        assert r.status_code == 404 and "unknown session 'nope'" in r.json()["detail"]["error"]
        sid = http.post("/sessions", json={"env_id": "arith", "max_turns": 2}).json()["session_id"]
        r = http.post(f"/sessions/{sid}/step", json={"action": "hi"})
        assert r.status_code == 400 and "reset" in r.json()["detail"]["error"]
        r = http.post(f"/sessions/{sid}/step", json={"action": {"role": "wizard"}})
        assert r.status_code == 422
        obs = http.post(f"/sessions/{sid}/reset", json={"seed": 1}).json()["observation"]
        assert obs == [m.model_dump(mode="json") for m in turngym.make("arith").reset(seed=1)[0]]
        step = http.post(f"/sessions/{sid}/step", json={"action": "no call"}).json()
        assert step["info"]["invalid_action"] is True and "no tool call" in step["info"]["error"]
        assert http.delete(f"/sessions/{sid}").json() == {"closed": True}
        assert http.delete(f"/sessions/{sid}").status_code == 404


def test_server_full_is_a_clear_error():
    manager = SessionManager(["arith"], max_sessions=2, idle_timeout=None)
    with ServerThread(manager) as server:
        envs = [RemoteEnv(server.url) for _ in range(2)]
        with pytest.raises(RemoteEnvError, match="server full: 2 sessions open") as e:
            RemoteEnv(server.url)
        assert e.value.kind == "server_full" and e.value.mask_reason == "env_error"
        assert manager.stats.refused_full == 1
        envs.pop().close()
        envs.append(RemoteEnv(server.url))  # a freed slot is usable again
        for env in envs:
            env.close()
        assert manager.sessions == {}


async def test_websocket_malformed_frames_get_error_replies_and_the_connection_lives_on(served):
    ws_url = served.url.replace("http", "ws") + "/ws"
    async with connect(ws_url, additional_headers=AUTH) as ws:
        for frame, kind, text in [
            ("not json", "malformed", "malformed websocket message"),
            (json.dumps({"id": 1, "op": "explode"}), "malformed", "op"),
            (
                json.dumps({"id": 2, "op": "step", "session_id": "zzz", "data": {"action": "x"}}),
                "unknown_session",
                "zzz",
            ),
            (json.dumps({"id": 3, "op": "create", "data": {"env_id": 7}}), "malformed", "env_id"),
            (
                json.dumps({"id": 4, "op": "reset", "session_id": "zzz", "data": {"seed": "x"}}),
                "malformed",
                "seed",
            ),
        ]:
            await ws.send(frame)
            reply = json.loads(await ws.recv())
            assert reply["ok"] is False and reply["error"]["kind"] == kind and text in reply["error"]["error"]
        await ws.send(b'{"id": 5, "op": "create", "data": {"env_id": "arith"}}')  # a binary frame works too
        reply = json.loads(await ws.recv())
        assert reply["ok"] and reply["id"] == 5
        await ws.send(json.dumps({"id": 6, "op": "close", "session_id": reply["data"]["session_id"]}))
        assert json.loads(await ws.recv())["data"] == {"closed": True}


async def test_client_disconnecting_mid_episode_closes_its_env(served):
    manager = served.manager
    ws_url = served.url.replace("http", "ws") + "/ws"
    before = manager.stats.closed_disconnect
    ws = await connect(ws_url, additional_headers=AUTH)
    await ws.send(json.dumps({"id": 0, "op": "create", "data": {"env_id": "arith"}}))
    sid = json.loads(await ws.recv())["data"]["session_id"]
    await ws.send(json.dumps({"id": 1, "op": "reset", "session_id": sid, "data": {"seed": 0}}))
    assert json.loads(await ws.recv())["ok"]
    env = manager.sessions[sid].env
    ws.transport.abort()  # the client vanishes: no close frame, no close op
    await asyncio.to_thread(wait_for, lambda: sid not in manager.sessions)
    assert env._closed and manager.stats.closed_disconnect == before + 1


async def test_idle_sessions_are_closed_and_their_clients_see_a_lost_env():
    manager = SessionManager(["arith"], max_sessions=4, idle_timeout=0.3)
    with ServerThread(manager) as server:
        remote = RemoteEnv(server.url)
        await remote.areset(seed=0)
        env = manager.sessions[remote.session.session_id].env
        await asyncio.to_thread(wait_for, lambda: manager.sessions == {})
        assert env._closed and manager.stats.closed_idle == 1
        with pytest.raises(RemoteEnvLost, match="unknown session .*idle for more than 0.3s") as e:
            await remote.astep("hi")
        assert e.value.mask_reason == "env_lost"
        await remote.aclose()


# ------------------------------------------------------------------ a served process, restarted
class _RestartingAgent(ScriptedAgent):
    """The expert, except that after its second turn of seed ``victim`` the server is killed and restarted."""

    def __init__(self, victim: int, restart):
        self.victim, self.restart, self.restarted = victim, restart, False

    def start(self, env, prompt, *, seed, route):
        session = super().start(env, prompt, seed=seed, route=route)
        if seed // 1000 == self.victim:
            act, turns = session.act, [0]

            async def act_then_restart():
                step = await act()
                turns[0] += 1
                if turns[0] == 2:
                    await asyncio.to_thread(self.restart)
                    self.restarted = True
                return step

            session.act = act_then_restart
        return session


async def test_server_restarted_under_a_rollout_masks_that_episode_and_the_run_continues():
    port = free_port()
    procs = [start_cli_server(port, "arith", "--token", TOKEN)]

    def restart() -> None:
        stop(procs[-1])
        procs.append(start_cli_server(port, "arith", "--token", TOKEN))

    try:
        agent = _RestartingAgent(victim=1, restart=restart)
        cfg = RolloutConfig(group_size=1, max_concurrency=1, turn_timeout=60)
        engine = RolloutEngine(
            "remote", agent, cfg, env_kwargs={"url": f"http://127.0.0.1:{port}"}, env_id="arith"
        )
        trajs = await engine.run(range(4))
        assert agent.restarted and len(procs) == 2
        victim = next(t for t in trajs if t.seed == 1)
        assert victim.masked and victim.mask_reason == "env_lost"
        assert "RemoteEnvLost" in victim.metadata["error"] and "went away" in victim.metadata["error"]
        assert len(victim.turns) == 1  # its second step hit the restarted server
        assert [t.seed for t in trajs if not t.masked] == [0, 2, 3]
        assert all(t.total_reward == 1.0 for t in trajs if not t.masked)
        assert engine.stats.reconciles() and engine.stats.mask_reasons == {"env_lost": 1}
        health = httpx.get(f"http://127.0.0.1:{port}/health").json()  # /health needs no token
        assert health["sessions"] == 0  # the new server closed the envs of seeds 2 and 3
        assert health["stats"]["opened"] == health["stats"]["closed"] == 2
    finally:
        for proc in procs:
            stop(proc)
    # no server left: a new RemoteEnv says the server is unreachable, as a lost env
    with pytest.raises(RemoteEnvLost, match="unreachable"):
        RemoteEnv(f"http://127.0.0.1:{port}")


# ------------------------------------------------------------------ OpenEnv and MCP front doors
@pytest.fixture(scope="module")
def served_openenv():
    manager = SessionManager(["arith"], max_sessions=4, idle_timeout=60)
    with ServerThread(manager, openenv=True) as server:  # openenv-core imports gradio: ~10 s
        yield server
    assert manager.sessions == {}


async def test_openenv_core_client_plays_an_episode(served_openenv):
    from openenv.core import GenericEnvClient

    served = served_openenv
    local = turngym.make("arith")
    obs, _ = local.reset(seed=2)
    before = served.manager.stats.opened
    async with GenericEnvClient(base_url=with_token(served.url) + "/openenv") as client:
        result = await client.reset(seed=2)
        assert result.done is False and result.reward is None
        assert result.observation["messages"] == [m.model_dump(mode="json") for m in obs]
        total, done = 0.0, False
        while not done:
            action = local.expert_action()
            expected = local.step(action)
            result = await client.step({"content": action})
            assert result.observation["messages"] == [m.model_dump(mode="json") for m in expected[0]]
            assert result.reward == expected[1] and result.done == (expected[2] or expected[3])
            total, done = total + result.reward, result.done
        assert total == 1.0 and result.observation["terminated"] is True
        state = await client.state()
        assert state["step_count"] == local.turn and state["env_id"] == "arith-v0"
        assert served.manager.stats.opened == before + 1  # one OpenEnv websocket, one session
    await asyncio.to_thread(wait_for, lambda: served.manager.sessions == {})
    # a malformed OpenEnv action is refused with the validation error, the connection stays usable
    async with GenericEnvClient(base_url=with_token(served.url) + "/openenv") as client:
        await client.reset(seed=0)
        with pytest.raises(RuntimeError, match="Invalid message|validation|extra"):
            await client.step({"content": "x", "bogus": 1})
        assert (await client.step({"content": "no call"})).observation["info"]["invalid_action"] is True


async def test_mcp_client_plays_an_episode_in_its_session(served):

    local = turngym.make("arith")
    local.reset(seed=3)
    async with mcp_client(served.url, mode="legacy") as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == {"reset", "calculate", "answer"}
        assert tools["calculate"].input_schema["properties"]["op"]["enum"] == ["+", "-", "*"]
        early = await client.call_tool("calculate", {"a": 1, "op": "+", "b": 1})
        assert early.is_error and "call reset first" in early.content[0].text
        first = await client.call_tool("reset", {"seed": 3})
        assert "Evaluate:" in first.content[1].text
        sid = first.structured_content["episode_id"]
        assert sid in served.manager.sessions
        while True:
            (call,) = local.parser.parse(local.expert_action()).valid_calls
            expected = local.step(local.format_call(call.name, call.arguments))
            result = await client.call_tool(call.name, call.arguments)
            assert not result.is_error and result.content[0].text.endswith(expected[0][0].content)
            assert result.structured_content["reward"] == expected[1]
            if result.structured_content["terminated"]:
                break
        assert result.structured_content["reward"] == 1.0
        bad = await client.call_tool("calculate", {"a": 1, "op": "/", "b": 1})
        assert bad.is_error and "reset first" in bad.content[0].text  # the episode is over
    # the client ended its MCP session: its env is closed
    await asyncio.to_thread(wait_for, lambda: sid not in served.manager.sessions)


async def test_sessionless_mcp_clients_name_their_episode(served):

    async with mcp_client(served.url) as client:  # protocol 2026-07-28: no MCP session
        reply = await client.call_tool("reset", {"seed": 0})
        episode = reply.structured_content["episode_id"]
        lost = await client.call_tool("calculate", {"a": 3, "op": "+", "b": 5})
        assert lost.is_error and "pass the episode_id" in lost.content[0].text
        step = await client.call_tool("calculate", {"a": 3, "op": "+", "b": 5, "episode_id": episode})
        assert not step.is_error and step.content[0].text.endswith("8")
        bad = await client.call_tool("calculate", {"a": 3, "op": "+", "b": "five", "episode_id": episode})
        assert bad.is_error and bad.structured_content["turn"] == 2
    async with httpx.AsyncClient(base_url=served.url, headers=AUTH) as http:
        assert (await http.delete(f"/sessions/{episode}")).json() == {"closed": True}


# ------------------------------------------------------------------ the protocol, property-tested
MESSAGES = st.builds(
    Message,
    role=st.sampled_from(["system", "user", "assistant", "tool"]),
    content=st.text(max_size=40),
    name=st.none() | st.text(max_size=8),
    images=st.lists(st.binary(max_size=64), max_size=3),
)


@given(
    st.lists(MESSAGES, max_size=4),
    st.dictionaries(st.text(max_size=8), st.floats(allow_nan=False), max_size=4),
)
def test_messages_and_reward_components_round_trip_through_a_step_reply(messages, components):
    from turngym.remote.protocol import StepReply, info_to_wire

    info, results = info_to_wire({"reward_components": components, "tool_results": [], "turn": 1})
    reply = StepReply(observation=messages, reward=0.5, terminated=False, truncated=True, info=info)
    frame = json.dumps(reply.model_dump(mode="json"))  # what crosses the wire
    again = StepReply.model_validate(json.loads(frame))
    assert again.observation == messages and again.info["reward_components"] == components and results == []


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    frame=st.one_of(
        st.text(max_size=200),
        st.binary(max_size=200),
        st.builds(
            json.dumps,
            st.dictionaries(
                st.sampled_from(["id", "op", "session_id", "data", "x"]),
                st.one_of(
                    st.none(),
                    st.integers(),
                    st.text(max_size=10).filter(lambda t: t not in {"create", "attach"}),
                    st.sampled_from(["reset", "step", "fork", "close"]),
                ),
            ),
        ),
    )
)
def test_any_websocket_frame_gets_a_reply_never_an_exception(frame):
    manager = SessionManager(["arith"], max_sessions=2, idle_timeout=None)
    reply = asyncio.run(manager.dispatch(frame, owner=object()))
    if not reply.ok:
        assert reply.error.kind in {"malformed", "unknown_session"} and reply.error.error
    assert manager.sessions == {}  # nothing was opened by junk


def test_non_finite_floats_survive_the_http_routes_too(served):
    with httpx.Client(base_url=served.url, timeout=30, headers=AUTH) as http:
        sid = http.post("/sessions", json={"env_id": "serve-picture"}).json()["session_id"]
        http.post(f"/sessions/{sid}/reset", json={"seed": 0})
        r = http.post(f"/sessions/{sid}/step", json={"action": "no call"})
        assert r.status_code == 200 and json.loads(r.text)["info"]["bound"] == float("inf")
        http.delete(f"/sessions/{sid}")


def test_remote_env_passes_the_conformance_suite(served):
    from turngym.testing import check_env

    report = check_env("remote", url=served.url, env_id="arith")
    report.raise_for_failures()  # sync API, determinism, hostile actions, turn limit, fork, gymnasium, close
    assert {r.name for r in report.results} >= {"surface", "fork", "gymnasium", "close", "determinism"}
    wait_for(lambda: served.manager.sessions == {})  # every env it opened (forks included) was closed


async def test_a_call_past_the_client_timeout_drops_the_connection_and_the_server_closes_the_env(served):
    remote = RemoteEnv(served.url, env_id="serve-picture", timeout=0.5)
    await remote.areset(seed=0)
    sid = remote.session.session_id
    with pytest.raises(RemoteEnvError, match="no reply in 0.5s") as e:
        await remote.astep(remote.format_call("pause", {"seconds": 3}))
    assert e.value.kind == "timeout" and e.value.mask_reason == "turn_timeout"
    await asyncio.to_thread(wait_for, lambda: sid not in served.manager.sessions)  # closed with its socket
    with pytest.raises(RemoteEnvLost, match="unknown session"):  # no desynchronised late reply
        await remote.astep("hi")
    await remote.aclose()
