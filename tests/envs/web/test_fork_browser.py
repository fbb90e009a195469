"""``fork()`` of live MiniWoB episodes (web-miniwob, gui-miniwob): a new browser context brought to the
same page by replay and verified by state keys; branches independent; refusals are clear; no leases leak."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time

import pytest

from turngym.core.env import ForkError
from turngym.core.types import Message, ToolCall
from turngym.envs.gui.env import GuiMiniWoBEnv
from turngym.envs.web.env import WebMiniWoBEnv
from turngym.sandboxes.browser import BrowserPool

pytestmark = [pytest.mark.browser]


def call(name: str, **args) -> Message:
    return Message(role="assistant", tool_calls=[ToolCall(name=name, arguments=args)])


@pytest.fixture
def pool():
    p = BrowserPool(size=1)
    yield p
    assert p.stats.active == 0, "a lease (browser context) leaked"
    p.close()


def test_fork_mid_episode_is_an_independent_branch(pool):
    with WebMiniWoBEnv("enter-text", pool=pool, reward="raw") as env:
        env.reset(seed=3)
        box = env.snap.find(role="textbox")[0].id
        button = env.snap.find(role="button")[0].id
        env.step(call("fill", bid=box, value="wrong"))
        env.step(call("noop", wait_ms=0))  # turn 2
        child = env.fork()
        assert pool.stats.active == 2 and child.lease is not env.lease
        assert child.turn == env.turn == 2 and child._state_key() == env._state_key()
        assert child.snap.text() == env.snap.text() and 'value="wrong"' in env.snap.text()
        # the fork types the right answer and submits; the parent's page and reward are not touched
        before = env._state_key()
        _, r_child, done_child, _, _ = child.step(child.expert_action())
        assert done_child and r_child == 1.0
        assert env._state_key() == before and not env._done
        _, r_parent, done_parent, _, _ = env.step(call("click", bid=button))
        assert done_parent and r_parent == -1.0  # the parent submitted its own (wrong) text
        child.close()
    assert pool.stats.active == 0


def test_gui_fork_replays_pixel_clicks(pool):
    with GuiMiniWoBEnv("click-test", pool=pool) as env:
        env.reset(seed=1)
        env.step(call("move_to", x=10, y=10))
        with env.fork() as child:
            assert child._state_key() == env._state_key() and child._mouse == env._mouse
            _, reward, done, _, _ = child.step(env.expert_action())
            assert done and reward == 1.0
            assert not env._done
        _, reward, done, _, _ = env.step(env.expert_action())
        assert done and reward == 1.0
        finished = env.fork()  # a finished episode forks into a finished one, without a page
        assert finished._done and finished.lease is None
        finished.close()


def test_fork_refusals_are_clear(pool):
    env = WebMiniWoBEnv("click-test", pool=pool)
    with pytest.raises(ForkError, match="never reset"):
        env.fork()
    env.reset(seed=0)

    async def during_step() -> None:
        step = asyncio.ensure_future(env.astep(call("noop", wait_ms=300)))
        await asyncio.sleep(0.05)
        with pytest.raises(ForkError, match="middle of a step"):
            await env.afork()
        await step

    env._run(during_step())
    timed = WebMiniWoBEnv("click-test", pool=pool, time_limit_s=30)
    timed.reset(seed=0)
    with pytest.raises(ForkError, match="episode timer"):
        timed.fork()
    timed.close()
    env.close()
    with pytest.raises(ForkError, match="closed"):
        env.fork()


def test_fork_past_the_pools_capacity_is_refused():
    pool = BrowserPool(size=1, contexts_per_browser=1)
    try:
        with WebMiniWoBEnv("click-test", pool=pool) as env:
            env.reset(seed=0)
            with pytest.raises(ForkError, match=r"pool is full \(1 of 1"):
                env.fork()
            _, reward, done, _, _ = env.step(env.expert_action())  # the parent is untouched
            assert done and reward == 1.0
        assert pool.stats.active == 0
    finally:
        pool.close()


def test_fork_of_a_crashed_browser_is_refused(pool):
    with WebMiniWoBEnv("click-test", pool=pool) as env:
        env.reset(seed=0)
        for pid in pool.browser_pids():
            os.kill(pid, signal.SIGKILL)
        _, _, _, _, info = env.step(env.expert_action())
        assert info["masked"]
        with pytest.raises(ForkError, match="browser"):
            env.fork()


def test_a_page_that_replays_differently_is_refused(hostile_html, pool):
    with WebMiniWoBEnv("clock-on-click", html=hostile_html, pool=pool) as env:
        env.reset(seed=0)
        env.step(call("click", bid=env.snap.find(role="button")[0].id))
        key = env._state_key()
        with pytest.raises(ForkError, match="replay diverged at turn 1"):
            env.fork()
        assert env._state_key() == key and env.lease is not None and pool.stats.active == 1
        env.step(call("noop", wait_ms=0))  # the parent goes on
        assert not env.fault


def test_a_browser_dying_during_the_replay_leaves_the_parent_intact(hostile_html):
    pool = BrowserPool(size=2, contexts_per_browser=1)  # the fork gets a browser of its own to kill
    try:
        with WebMiniWoBEnv("slow-click", html=hostile_html, pool=pool, action_timeout_s=10) as env:
            env.reset(seed=0)
            button = env.snap.find(role="button")[0].id
            env.step(call("click", bid=button))  # the replay of this click keeps the fork's page busy 3 s
            mine = set(pool.browser_pids())
            done = threading.Event()

            def kill_the_forks_browsers() -> None:  # every browser the fork gets, until fork() returns
                while pool.stats.active < 2 and not done.is_set():
                    time.sleep(0.01)
                time.sleep(
                    1.0
                )  # usually: the fork's page is up and replaying the slow click (any phase fails)
                while not done.is_set():
                    for pid in set(pool.browser_pids()) - mine:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                    time.sleep(0.05)

            killer = threading.Thread(target=kill_the_forks_browsers)
            killer.start()
            try:
                with pytest.raises(ForkError, match="browser") as err:
                    env.fork()
            finally:
                done.set()
                killer.join()
            assert "original env is unchanged" in str(err.value) or "could not open" in str(err.value)
            assert pool.stats.active == 1 and not env.fault
            _, _, _, _, info = env.step(call("noop", wait_ms=0))
            assert "masked" not in info and env.lease is not None and not env.lease.crashed
        assert pool.stats.active == 0
    finally:
        pool.close()
