"""Part 3: faults injected into real rollouts. Every trajectory ends completed or masked with a reason,
the run finishes, and the counts reconcile (requested = completed + masked, per-reason sums match)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import httpx
import pytest

import turngym
from turngym.agents.openai_chat import OpenAIChatAgent
from turngym.agents.scripted import ScriptedAgent
from turngym.core.wrappers import AsyncWrapper
from turngym.rollout.engine import MASK_REASONS, RolloutConfig, RolloutEngine

pytestmark = pytest.mark.reliability

#: The fault each seed gets (seed % len): what it does and the outcome the engine must report.
FAULTS: dict[str, str | None] = {
    "none": None,
    "step_exception": "env_error",
    "reset_exception": "env_error",
    "hang": "turn_timeout",
    "slow": "turn_timeout",
    "creeping": "trajectory_timeout",
    "env_masks": "env_error",
    "close_hangs": None,  # completed; the close error is recorded, the run goes on
    "close_raises": None,
}
TURN_TIMEOUT = 3.0  # generous: the machine is heavily loaded


class FaultInjector(AsyncWrapper):
    """Wraps a real env and injects a fault into its reset/step/close: ``FAULTS``'s entry number
    ``seed % len(FAULTS)``, chosen at reset (the engine builds envs in worker threads, in no set order)."""

    def __init__(self, env):
        super().__init__(env)
        self.fault, self.seed = "none", None

    async def areset(self, *, seed=None, options=None):
        self.seed, self.fault = seed, list(FAULTS)[seed % len(FAULTS)]
        if self.fault == "reset_exception":
            raise ConnectionError("injected: the env's backing service refused the connection")
        return await self.env.areset(seed=seed, options=options)

    async def astep(self, action: Any):
        if self.fault == "step_exception":
            raise RuntimeError("injected: env step exploded")
        if self.fault == "hang":
            await asyncio.Event().wait()  # never set
        if self.fault == "slow":
            await asyncio.sleep(TURN_TIMEOUT * 3)
        if self.fault == "creeping":
            await asyncio.sleep(TURN_TIMEOUT * 0.8)
        obs, reward, terminated, truncated, info = await self.env.astep(action)
        if self.fault == "env_masks":
            info = {**info, "masked": True, "mask_reason": "injected: browser crashed"}
        return obs, reward, terminated, truncated, info

    async def aclose(self):
        await self.env.aclose()
        if self.fault == "close_hangs":
            await asyncio.Event().wait()
        if self.fault == "close_raises":
            raise OSError("injected: close failed")


def reconcile(engine: RolloutEngine, trajs: list, requested: int) -> None:
    s = engine.stats
    assert len(trajs) == requested == s.requested
    assert s.reconciles(), s.as_dict()
    assert s.completed == sum(not t.masked for t in trajs) and s.masked == sum(t.masked for t in trajs)
    assert Counter(t.mask_reason for t in trajs if t.masked) == s.mask_reasons
    for t in trajs:
        if t.masked:
            assert t.mask_reason in MASK_REASONS and t.metadata.get("error"), t.metadata


def test_injected_env_faults_on_search_qa():
    made: list[FaultInjector] = []

    def factory():
        env = FaultInjector(turngym.make("search-qa-v0"))
        made.append(env)
        return env

    seeds = list(range(2 * len(FAULTS)))
    cfg = RolloutConfig(
        max_concurrency=len(seeds),
        turn_timeout=TURN_TIMEOUT,
        trajectory_timeout=TURN_TIMEOUT * 2,
        close_timeout=1.0,
    )
    engine = RolloutEngine(factory, ScriptedAgent(), cfg, env_id="search-qa+faults")
    trajs = asyncio.run(engine.run(seeds))
    reconcile(engine, trajs, len(seeds))
    assert sorted(env.seed for env in made) == seeds
    by_fault = {env.fault: [] for env in made}
    for env in made:
        by_fault[env.fault].append(next(t for t in trajs if t.seed == env.seed))
    for fault, expected in FAULTS.items():
        for t in by_fault[fault]:
            if expected is None:
                assert not t.masked and t.terminated and t.turns, (fault, t.metadata)
            else:
                assert t.masked and t.mask_reason == expected, (fault, t.mask_reason, t.metadata)
    for t in by_fault["close_hangs"] + by_fault["close_raises"]:
        assert "close_error" in t.metadata
    # the env's own mask reason reaches the trajectory, and the turn that reported it is kept
    for t in by_fault["env_masks"]:
        assert "browser crashed" in t.metadata["error"] and len(t.turns) == 1
    # every env was closed (close faults included), none left open
    assert all(env.unwrapped._closed for env in made)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(port: int, delay: float) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.reliability.chat_server", "--port", str(port), "--delay", str(delay)],
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError("the chat server did not start")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


@pytest.mark.slow
def test_backend_server_killed_and_restarted():
    """A chat server is SIGKILLed while 12 trajectories are in flight, then restarted on the same port;
    trajectories caught by the outage are masked ``backend_error``, the rest (and a second run after the
    restart) complete; a server slower than the client timeout masks, never hangs."""
    port = _free_port()
    server = _start_server(port, delay=0.4)
    try:
        agent = OpenAIChatAgent(
            "fault", base_url=f"http://127.0.0.1:{port}/v1", api_key="x", timeout=5, max_retries=0
        )
        env_kwargs = {"tools_in_prompt": False, "parser": "openai"}
        engine = RolloutEngine(
            "search-qa-v0", agent, RolloutConfig(max_concurrency=4, turn_timeout=20), env_kwargs=env_kwargs
        )

        async def run_with_outage():
            async def killer():
                while engine.stats.completed < 2:
                    await asyncio.sleep(0.05)
                _stop(server)

            kill = asyncio.create_task(killer())
            out = await engine.run(12)
            await kill
            return out

        trajs = asyncio.run(run_with_outage())
        reconcile(engine, trajs, 12)
        assert engine.stats.completed >= 2 and engine.stats.mask_reasons["backend_error"] >= 1
        assert set(engine.stats.mask_reasons) <= {"backend_error"}

        server = _start_server(port, delay=0.0)  # restarted: the same agent works again
        engine2 = RolloutEngine(
            "search-qa-v0", agent, RolloutConfig(max_concurrency=4), env_kwargs=env_kwargs
        )
        trajs = asyncio.run(engine2.run(4))
        reconcile(engine2, trajs, 4)
        assert engine2.stats.completed == 4
        _stop(server)

        server = _start_server(port, delay=10.0)  # slower than the client's 5 s timeout
        slow = OpenAIChatAgent(
            "fault", base_url=f"http://127.0.0.1:{port}/v1", api_key="x", timeout=1, max_retries=0
        )
        engine3 = RolloutEngine("search-qa-v0", slow, RolloutConfig(max_concurrency=4), env_kwargs=env_kwargs)
        trajs = asyncio.run(engine3.run(3))
        reconcile(engine3, trajs, 3)
        assert engine3.stats.mask_reasons["backend_error"] == 3
    finally:
        _stop(server)
