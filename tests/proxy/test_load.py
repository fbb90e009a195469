"""1,024 calls from 64 concurrent episodes over loopback lose nothing (bounded, loopback only)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from turngym.proxy import make_proxy, serve_proxy
from turngym.proxy.scripted import InstantBackend

TOKEN = "load-test-token-0123456789"
EPISODES, CALLS = 64, 16


async def _episode(http: httpx.AsyncClient, key: str) -> list[int]:
    messages = [{"role": "user", "content": f"Episode {key}: count."}]
    statuses = []
    for _ in range(CALLS):
        r = await http.post(f"/v1/episodes/{key}/chat/completions", json={"model": "m", "messages": messages})
        statuses.append(r.status_code)
        messages += [r.json()["choices"][0]["message"], {"role": "user", "content": "more"}]
    r = await http.post(f"/v1/episodes/{key}/reward", json={"reward": 1.0})
    statuses.append(r.status_code)
    return statuses


@pytest.mark.slow
def test_64_concurrent_episodes_of_16_calls_lose_nothing(tokenizer, tmp_path):
    proxy = make_proxy(backend=InstantBackend(tokenizer, 8), tokenizer=tokenizer, name="m", out=tmp_path)

    async def drive(url: str) -> list[list[int]]:
        limits = httpx.Limits(max_connections=EPISODES)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=300) as http:
            return await asyncio.gather(*(_episode(http, f"load-{i}") for i in range(EPISODES)))

    with serve_proxy(proxy, token=TOKEN) as running:
        statuses = asyncio.run(drive(running.url))
    assert all(s == 200 for run in statuses for s in run)
    trajs = proxy.store.finished
    assert len(trajs) == EPISODES and not proxy.store.live
    for t in trajs.values():
        assert len(t.turns) == CALLS and t.metrics["segments"] == 1 and t.total_reward == 1.0
        assert sum(t.loss_mask) == CALLS * 8
    lines = (tmp_path / "trajectories.jsonl").read_text().splitlines()
    assert sorted(json.loads(x)["metadata"]["episode"] for x in lines) == sorted(trajs)
