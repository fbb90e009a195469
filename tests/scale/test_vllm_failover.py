"""Two real vLLM CPU servers behind ``VLLMBackend``; one is killed mid-run and no request is lost."""

from __future__ import annotations

import asyncio
import os
import signal
from concurrent.futures import ThreadPoolExecutor

import pytest

from turngym.agents import BackendError, LLMAgent, SamplingParams
from turngym.agents.vllm import VLLMBackend
from turngym.rollout import RolloutConfig, RolloutEngine


async def test_every_server_down_is_a_backend_error_quickly():
    backend = VLLMBackend(["http://127.0.0.1:9", "http://127.0.0.1:7"], model="x", backoff_s=0.01)
    try:
        with pytest.raises(BackendError, match="no live server"):
            await backend.generate([1, 2], SamplingParams(max_tokens=2), route="r")
        assert set(backend.dead) == set(backend.urls) and backend.stats["deaths"] == 2
        assert await backend.check_health() == dict.fromkeys(backend.urls, False)
    finally:
        await backend.aclose()


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(900)
async def test_a_server_killed_mid_rollout_loses_no_request(tiny_dir, tokenizer):
    from turngym.agents.vllm import VLLMServer

    servers = [
        VLLMServer(tiny_dir, max_model_len=1024, dtype="float32", enable_lora=False, served_model_name="tiny")
        for _ in range(2)
    ]
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(VLLMServer.start, servers))
    backend = VLLMBackend([s.url for s in servers], model="tiny", backoff_s=0.2)
    try:
        agent = LLMAgent(backend, tokenizer, SamplingParams(max_tokens=24), max_context=1024)
        cfg = RolloutConfig(group_size=4, max_concurrency=24)
        engine = RolloutEngine("arith", agent, cfg, env_kwargs={"max_turns": 3})
        victim = servers[1]

        async def kill_when_running():
            while engine.stats.turns < 6:
                await asyncio.sleep(0.05)
            os.killpg(victim.proc.pid, signal.SIGKILL)
            return engine.stats.turns

        killer = asyncio.create_task(kill_when_running())
        trajs = await engine.run(range(6))
        killed_at = await killer
        assert engine.stats.reconciles() and engine.stats.requested == 24
        assert engine.stats.masked == 0, [t.metadata.get("error") for t in trajs if t.masked]
        assert engine.stats.turns > killed_at  # the run went on after the kill
        for t in trajs:
            assert t.num_turns >= 1 and all(turn.gen_span is not None for turn in t.turns)
        assert list(backend.dead) == [victim.url] and backend.live_urls == [servers[0].url]
        assert backend.stats["failovers"] >= 1 and backend.stats["deaths"] == 1
        assert {backend.server_for(f"arith/{s}#{k}") for s in range(6) for k in range(4)} == {servers[0].url}
    finally:
        await backend.aclose()
        for s in servers:
            s.stop()
