"""web-miniwob on a real Chromium: observations, tools, rewards, faults, async use."""

from __future__ import annotations

import asyncio
import io
import os
import signal

import pytest
from PIL import Image

import turngym
from turngym.core.types import Message
from turngym.envs.web.env import WebMiniWoBEnv
from turngym.sandboxes.browser import BrowserError, BrowserPool
from turngym.testing import check_env

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def call(name: str, **args) -> Message:
    from turngym.core.types import ToolCall

    return Message(role="assistant", tool_calls=[ToolCall(name=name, arguments=args)])


def bid_of(env: WebMiniWoBEnv, role: str, name: str | None = None) -> int:
    nodes = env.snap.find(role=role, name=name)
    assert nodes, f"no {role} {name!r} in\n{env.snap.text()}"
    return nodes[0].id


def test_conformance():
    check_env("web-miniwob-v0", task="click-button").raise_for_failures()


def test_first_observation_and_state_key():
    with turngym.make("web-miniwob-v0", task="enter-text") as env:
        obs, info = env.reset(seed=3)
        assert [m.role for m in obs] == ["system", "user"]
        assert "fill" in obs[0].content and "drag_and_drop" in obs[0].content
        assert obs[1].content.startswith(f"Task: {info['instruction']}")
        assert 'Enter "' in info["instruction"] and info["task_id"].startswith("miniwob/enter-text/")
        assert "[" in obs[1].content and "textbox" in obs[1].content and not obs[1].images
        box = bid_of(env, "textbox")
        obs, reward, terminated, truncated, info2 = env.step(call("fill", bid=box, value="hello"))
        assert not terminated and reward == 0.0 and info2["state_key"] != info["state_key"]
        assert 'value="hello"' in obs[-1].content
        again, info3 = env.reset(seed=3)
        assert again == env.reset(seed=3)[0] and info3["state_key"] == info["state_key"]


def test_bad_actions_are_error_observations():
    with WebMiniWoBEnv("click-button") as env:
        env.reset(seed=0)
        button = bid_of(env, "button")
        checks = [
            (call("click", bid=9999), "no element with id 9999"),
            (call("fill", bid=button, value="x"), "not a text field"),
            (call("select_option", bid=button, options="x"), "not a <select>"),
            (call("noop", wait_ms=10**6), "wait_ms must be between"),
            (call("click", bid="abc"), "invalid arguments"),
            (call("drag_and_drop", from_bid=button, to_bid=4242), "no element with id 4242"),
        ]
        for action, expected in checks:
            obs, reward, terminated, truncated, info = env.step(action)
            assert expected in info["error"], (expected, info["error"])
            assert not terminated and reward == 0.0
            assert any(expected in m.content for m in obs)


@pytest.mark.parametrize(("mode", "wrong", "right"), [("raw", -1.0, 1.0), ("binary", 0.0, 1.0)])
def test_task_reward_raw_and_binary(mode, wrong, right):
    with WebMiniWoBEnv("click-test-2", reward=mode) as env:
        _, info = env.reset(seed=1)
        target = info["instruction"].split("button ")[1].rstrip(".")
        other = "TWO" if target == "ONE" else "ONE"
        obs, reward, terminated, _, info = env.step(call("click", bid=bid_of(env, "button", other)))
        assert terminated and reward == wrong and info["reward_components"] == {"task": wrong}
        assert info["task_done"] and "task is over" in obs[-1].content
        env.reset(seed=1)
        _, reward, terminated, _, _ = env.step(call("click", bid=bid_of(env, "button", target)))
        assert terminated and reward == right


def test_truncated_episode_pays_zero():
    with WebMiniWoBEnv("click-test", max_turns=2) as env:
        env.reset(seed=0)
        env.step(call("noop", wait_ms=0))
        _, reward, terminated, truncated, info = env.step(call("hover", bid=bid_of(env, "button")))
        assert truncated and not terminated and info["reward_components"] == {"task": 0.0}


def test_page_timer_and_timed_reward():
    with WebMiniWoBEnv("click-test", time_limit_s=0.5, reward="timed") as env:
        env.reset(seed=0)
        _, reward, terminated, _, info = env.step(call("noop", wait_ms=900))
        assert terminated and reward == -1.0 and info["task_reason"] == "timed out"


def test_select_press_and_screenshot():
    with WebMiniWoBEnv("choose-list", screenshot=True, with_boxes=True) as env:
        obs, info = env.reset(seed=0)
        png = obs[1].images[0]
        assert Image.open(io.BytesIO(png)).size == (160, 210) and "box=(" in obs[1].content
        wanted = info["instruction"].split("Select ")[1].split(" from")[0]
        obs, *_ = env.step(call("select_option", bid=bid_of(env, "combobox"), options=wanted))
        assert f'value="{wanted}"' in obs[-1].content
        _, reward, terminated, *_ = env.step(
            call("press", bid=bid_of(env, "button", "Submit"), key_comb="Enter")
        )
        assert terminated and reward == 1.0


def test_javascript_errors_are_reported(hostile_html):
    with WebMiniWoBEnv("throws-on-click", html=hostile_html) as env:
        obs, info = env.reset(seed=0)
        assert info["instruction"] == "Click the button."
        obs, reward, terminated, _, info = env.step(call("click", bid=bid_of(env, "button", "Boom")))
        assert "kaboom from the task" in obs[-1].content and not terminated
        obs, *_, info = env.step(call("fill", bid=env.snap.find(name="not an input")[0].id, value="x"))
        assert "not a text field" in info["error"]


def test_page_that_never_loads_times_out(hostile_html):
    with WebMiniWoBEnv("never-loads", html=hostile_html, load_timeout_s=1.5) as env:
        with pytest.raises(BrowserError, match="did not start"):
            env.reset(seed=0)
    with WebMiniWoBEnv("not-a-task", html=hostile_html) as env:
        with pytest.raises(BrowserError, match="not a MiniWoB"):
            env.reset(seed=0)
    with pytest.raises(KeyError, match="unknown MiniWoB task"):
        WebMiniWoBEnv("no-such-task")


def test_browser_killed_mid_episode_masks_the_episode_and_relaunches():
    pool = BrowserPool(size=1)
    try:
        with WebMiniWoBEnv("click-button", pool=pool) as env:
            env.reset(seed=0)
            button = bid_of(env, "button")
            for pid in pool.browser_pids():
                os.kill(pid, signal.SIGKILL)
            obs, reward, terminated, truncated, info = env.step(call("click", bid=button))
            assert terminated and reward == 0.0
            assert info["masked"] is True and "browser" in info["mask_reason"]
            assert "will not be scored" in obs[-1].content
            obs, info = env.reset(seed=0)  # the pool relaunches the browser
            assert env.expert_action() is not None
            _, reward, terminated, _, info = env.step(env.expert_action())
            assert terminated and reward == 1.0 and "masked" not in info
        assert pool.stats.crashes == 1 and pool.stats.launches == 2
    finally:
        pool.close()


async def test_concurrent_async_episodes_share_one_pool():
    pool = BrowserPool(size=1, contexts_per_browser=4)

    async def episode(seed: int) -> float:
        env = WebMiniWoBEnv("expert", pool=pool, max_turns=6)
        try:
            await env.areset(seed=seed)
            total, done = 0.0, False
            while not done:
                _, r, term, trunc, _ = await env.astep(env.expert_action() or "noop")
                total, done = total + r, term or trunc
            return total
        finally:
            await env.aclose()

    try:
        rewards = await asyncio.gather(*(episode(s) for s in range(6)))
        assert all(r > 0 for r in rewards), rewards
        assert pool.stats.leases == 6 and pool.stats.active == 0 and pool.stats.launches == 1
    finally:
        await pool.aclose()


@pytest.mark.parametrize("direct", [True, False])
def test_blocked_controls_are_clear_errors_with_either_input_path(hostile_html, direct):
    with WebMiniWoBEnv("blocked-controls", html=hostile_html, direct_input=direct) as env:
        env.reset(seed=0)
        assert env._direct is direct  # direct input on a settled MiniWoB page unless turned off
        off, under = bid_of(env, "button", "Off"), bid_of(env, "button", "Under")
        for action, expected in [
            (call("click", bid=off), f"element {off} is disabled"),
            (call("click", bid=under), f"element {under} is hidden under another element"),
            (call("hover", bid=under), "cannot be hovered"),
        ]:
            _, reward, terminated, _, info = env.step(action)
            assert expected in info["error"] and not terminated and reward == 0.0
        count = bid_of(env, "button", "Count")
        obs, reward, terminated, *_ = env.step(call("click", bid=count))
        assert not terminated and '"1"' in obs[-1].content  # one click, one count
        _, reward, terminated, *_ = env.step(call("click", bid=count))
        assert terminated and reward == 1.0


def test_animations_turn_direct_input_off():
    with WebMiniWoBEnv("click-button", animations=True) as env:
        env.reset(seed=0)
        assert not env._direct
        _, reward, terminated, *_ = env.step(env.expert_action())
        assert terminated and reward == 1.0


async def test_next_episode_page_is_preloaded_in_a_fresh_context():
    pool, cold_pool = BrowserPool(size=1), BrowserPool(size=1, prewarm=False)
    env = WebMiniWoBEnv("click-checkboxes", pool=pool)
    cold = WebMiniWoBEnv("click-checkboxes", pool=cold_pool, preload=False)
    try:
        await env.areset(seed=0)
        first = env.lease
        assert first is not None and first.preloaded is None  # a cold pool has no page ready
        await first.run(lambda page: page.evaluate("localStorage.setItem('left-behind', '1')"))
        obs, info = await env.areset(seed=7)
        lease = env.lease
        assert lease is not first and lease.context is not first.context
        assert lease.preloaded == env.task_url("click-checkboxes")  # loaded in the background, not started
        assert await lease.run(lambda page: page.evaluate("localStorage.getItem('left-behind')")) is None
        # the same seed gives the same episode whether the page was preloaded or loaded at reset
        cold_obs, cold_info = await cold.areset(seed=7)
        assert cold.lease is not None and cold.lease.preloaded is None
        assert cold_obs[1].content == obs[1].content and cold_info["state_key"] == info["state_key"]
        total, done = 0.0, False
        while not done:
            _, r, term, trunc, _ = await env.astep(env.expert_action() or "noop")
            total, done = total + r, term or trunc
        assert total == 1.0
    finally:
        await env.aclose()
        await cold.aclose()
        await pool.aclose()
        await cold_pool.aclose()
