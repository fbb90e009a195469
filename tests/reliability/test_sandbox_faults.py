"""Part 3 (real sandboxes): a browser or a container killed from outside while the rollout engine drives
the episode. The trajectory is masked with the reason (never a silent reward-0 "failure" the trainer
would learn from), the run finishes and the counts reconcile; then the same family works again."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

import turngym
from turngym.agents.scripted import RandomAgent, ScriptedAgent

from .hostile import check_answer, fixed_cases, schema_cases
from .test_rollout_faults import reconcile

pytestmark = [pytest.mark.reliability, pytest.mark.slow]


class KillOnTurn:
    """An agent wrapper that kills the sandbox of one trajectory right before its second action."""

    def __init__(self, inner, kill):
        self.inner, self.kill, self.name = inner, kill, "kill-on-turn"

    def start(self, env, prompt, *, seed, route):
        session = self.inner.start(env, prompt, seed=seed, route=route)
        kill, turns = self.kill, [0]

        class Session:
            async def act(self):
                turns[0] += 1
                if seed == 0 and turns[0] == 2:
                    await asyncio.to_thread(kill, env)
                return await session.act()

            def observe(self, action, obs):
                return session.observe(action, obs)

            def export(self, traj):
                session.export(traj)

        return Session()


@pytest.mark.browser
def test_browser_killed_during_a_rollout():
    from turngym.rollout.engine import RolloutConfig, RolloutEngine
    from turngym.sandboxes.browser import BrowserPool

    pool = BrowserPool(size=1)

    def kill(env):
        for pid in pool.browser_pids():
            os.kill(pid, signal.SIGKILL)

    try:
        agent = KillOnTurn(RandomAgent(p_malformed=0.0, seed=1), kill)
        engine = RolloutEngine(
            "web-miniwob-v0",
            agent,
            RolloutConfig(max_concurrency=2, turn_timeout=60, max_turns=3),
            env_kwargs={"task": "click-button", "pool": pool},
        )
        trajs = asyncio.run(engine.run(3))
        reconcile(engine, trajs, 3)
        first = next(t for t in trajs if t.seed == 0)
        assert first.masked and first.mask_reason == "env_error" and "browser" in first.metadata["error"]
        # the pool relaunched: a new episode works
        with turngym.make("web-miniwob-v0", task="click-button", pool=pool) as env:
            env.reset(seed=5)
            for case in fixed_cases()[:6] + [c for c in schema_cases(env.tools, "hermes") if c.malformed][:6]:
                check_answer(
                    env, case.action, malformed=case.malformed, family="web-miniwob", category=case.category
                )
    finally:
        pool.close()  # the killed browser's temp dir goes with it (the package's hygiene check asserts it)


def chromium_temp() -> set[str]:
    tmp = Path(tempfile.gettempdir())
    return {
        p.name for pattern in ("org.chromium.Chromium.*", "turngym-chromium-*") for p in tmp.glob(pattern)
    }


def remove_chromium_temp() -> None:
    for name in chromium_temp():
        shutil.rmtree(Path(tempfile.gettempdir()) / name, ignore_errors=True)


@pytest.mark.browser
def test_killed_browser_leaves_no_temp_files():
    from turngym.sandboxes.browser import BrowserPool

    before = chromium_temp()
    pool = BrowserPool(size=1)
    try:
        with turngym.make("web-miniwob-v0", task="click-button", pool=pool) as env:
            env.reset(seed=0)
            for pid in pool.browser_pids():
                os.kill(pid, signal.SIGKILL)
            env.reset(seed=1)  # relaunched
    finally:
        pool.close()
    try:
        assert chromium_temp() <= before, chromium_temp() - before
    finally:
        remove_chromium_temp()


@pytest.mark.browser
def test_a_frozen_browser_is_replaced_not_waited_for():
    """A browser that stops answering (SIGSTOP: alive, silent) must not hang the next reset: opening
    a page times out (``open_timeout``), the frozen browser is killed and a new one launched."""
    from turngym.sandboxes.browser import BrowserPool

    pool = BrowserPool(size=1, open_timeout=3, prewarm=False)
    frozen: list[int] = []
    try:
        with turngym.make("web-miniwob-v0", task="click-button", pool=pool) as env:
            env.reset(seed=0)
            frozen = pool.browser_pids()
            for pid in frozen:
                os.kill(pid, signal.SIGSTOP)
            obs, _ = env.reset(seed=1)  # relaunched
            assert obs and set(pool.browser_pids()).isdisjoint(frozen)
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        pool.close()


@pytest.mark.docker
def test_container_killed_during_a_rollout():
    from turngym.envs.swe.tasks import load_instances
    from turngym.rollout.engine import RolloutConfig, RolloutEngine
    from turngym.sandboxes.docker import docker_client

    def kill(env):
        docker_client().api.kill(env.unwrapped._sb.name)

    task = load_instances()[0].instance_id
    agent = KillOnTurn(ScriptedAgent(), kill)  # the expert's next action needs the dead container
    engine = RolloutEngine(
        "swe-docker-v0",
        agent,
        RolloutConfig(max_concurrency=2, turn_timeout=120, max_turns=3),
        env_kwargs={"task_ids": [task], "command_timeout": 5},
    )
    trajs = asyncio.run(engine.run(2))
    reconcile(engine, trajs, 2)
    first = next(t for t in trajs if t.seed == 0)
    assert first.turns and first.turns[-1].info.get("sandbox_error")  # the env saw the dead container
    assert first.masked and first.mask_reason == "env_error"
