"""The /retrieve server for real (uvicorn on a loopback port) and the httpx client standing in for BM25."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

import turngym
from turngym.envs.search.retriever import BM25Retriever, RetrieverError
from turngym.envs.search.server import RemoteRetriever, create_app

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(world):
    import uvicorn

    retriever = BM25Retriever(world.corpus, use_cache=False)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(retriever, corpus_size=len(world.corpus)),
            host="127.0.0.1",
            port=port,
            log_level="warning",
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", retriever
    server.should_exit = True
    thread.join(10)


def test_remote_matches_local(served, questions):
    url, local = served
    queries = [q for t in questions[:30] for q in t.gold_trace]
    with RemoteRetriever(url, batch_size=16) as remote:  # several batches
        got = remote.retrieve(queries, k=3)
    want = local.retrieve(queries, k=3)
    assert [[d.id for d in docs] for docs in got] == [[d.id for d in docs] for docs in want]
    assert got[0][0].title == want[0][0].title and got[0][0].contents == want[0][0].contents
    assert got[0][0].score == pytest.approx(want[0][0].score, rel=1e-5)


def test_wire_format_is_search_r1s(served):
    url, _ = served
    plain = httpx.post(f"{url}/retrieve", json={"queries": ["mayor", "zzzz"], "topk": 2}).json()
    assert set(plain) == {"result"} and len(plain["result"]) == 2 and plain["result"][1] == []
    assert set(plain["result"][0][0]) == {"id", "title", "contents"}
    scored = httpx.post(
        f"{url}/retrieve", json={"queries": ["mayor"], "topk": 1, "return_scores": True}
    ).json()
    assert set(scored["result"][0][0]) == {"document", "score"}
    assert httpx.get(f"{url}/health").json()["status"] == "ok"


@pytest.mark.parametrize(
    "body",
    [
        {"queries": ["x"], "topk": 0},
        {"queries": ["x"], "topk": 10_000},
        {"queries": []},
        {"queries": "x"},
        {"topk": 3},
    ],
)
def test_server_rejects_bad_requests(served, body):
    url, _ = served
    assert httpx.post(f"{url}/retrieve", json=body).status_code == 422


def test_client_errors_are_clear(served):
    url, _ = served
    with RemoteRetriever(url) as remote, pytest.raises(RetrieverError, match="HTTP 422"):
        remote.retrieve(["x"], k=0)
    with RemoteRetriever(f"http://127.0.0.1:{free_port()}", timeout=1) as dead:
        with pytest.raises(RetrieverError, match="unreachable"):
            dead.retrieve(["x"], k=1)


def test_env_over_remote_retriever(served, tmp_path, world, questions):
    url, _ = served
    from turngym.envs.search.tasks import write_tasks

    tasks = write_tasks(questions[:20], tmp_path / "tasks.jsonl")
    env = turngym.make("search-qa", tasks=str(tasks), retriever=url)
    for seed in range(5):
        obs, info = env.reset(seed=seed)
        done, total = False, 0.0
        while not done:
            obs, reward, terminated, truncated, info = env.step(env.expert_action())
            total += reward
            done = terminated or truncated
        assert total == 1.0
    env.close()

    dead = turngym.make("search-qa", tasks=str(tasks), retriever=f"http://127.0.0.1:{free_port()}")
    dead.reset(seed=0)
    action = f"<tool_call>{json.dumps({'name': 'search', 'arguments': {'query': 'x'}})}</tool_call>"
    obs, reward, terminated, truncated, info = dead.step(action)
    assert "search failed" in obs[0].content and "unreachable" in info["error"] and not terminated
    dead.close()


async def test_concurrent_envs_share_batched_server_calls(served, tmp_path, questions):
    """16 envs stepping at once over one server share one batching client (batching: test_search_batching)."""
    import asyncio

    from turngym.envs.search.server import shared_remote
    from turngym.envs.search.tasks import write_tasks

    url, _ = served
    tasks = write_tasks(questions[:16], tmp_path / "tasks.jsonl")
    envs = [turngym.make("search-qa", tasks=str(tasks), retriever=url) for _ in range(16)]
    for i, env in enumerate(envs):
        await env.areset(seed=i)
    steps = await asyncio.gather(*(env.astep(env.expert_action()) for env in envs))
    for env, (obs, *_rest) in zip(envs, steps, strict=True):  # each env got its own query's passages
        assert env.current.supporting_ids[0] in env._retrieved and obs[0].content.startswith("Doc 1 (Title: ")
    assert all(env.retriever is shared_remote(url) for env in envs)
    for env in envs:
        await env.aclose()
