"""Browser envs' ``max_live`` with real Chromium: at most that many envs of a pool are live (reset or forked,
not yet closed); a fork past it is a ``ForkError``, a reset past it waits (or, with ``live_wait_s``, fails
clearly); close frees the place; tree rollouts refuse a k above it and stay within it."""

from __future__ import annotations

import asyncio
import gc

import pytest

from turngym.agents import ScriptedAgent
from turngym.core.env import ForkError
from turngym.envs.browser.env import MAX_LIVE_PER_BROWSER, live_places
from turngym.envs.gui.env import GuiMiniWoBEnv
from turngym.envs.web.env import WebMiniWoBEnv
from turngym.rollout import RolloutConfig, RolloutEngine
from turngym.rollout.tree import TreeConfig, TreeError
from turngym.sandboxes.browser import BrowserError, BrowserPool

pytestmark = [pytest.mark.browser]


@pytest.fixture
def pool():
    p = BrowserPool(size=1, contexts_per_browser=4)
    yield p
    assert live_places(p).count() == 0, "an env kept its live place after close"
    assert p.stats.active == 0, "a lease (browser context) leaked"
    p.close()


def test_max_live_defaults_to_the_measured_bound_within_the_pools_capacity(pool):
    assert WebMiniWoBEnv("click-test", pool=pool).max_live == min(MAX_LIVE_PER_BROWSER, pool.capacity) == 4
    assert WebMiniWoBEnv("click-test", pool=pool, max_live=2).max_live == 2
    assert WebMiniWoBEnv("click-test", pool=pool, max_live=99).max_live == 4, "above the pool's capacity"
    big = BrowserPool(size=2, contexts_per_browser=64)
    assert WebMiniWoBEnv("click-test", pool=big).max_live == 2 * MAX_LIVE_PER_BROWSER
    with pytest.raises(ValueError, match="max_live must be >= 1"):
        WebMiniWoBEnv("click-test", pool=pool, max_live=0)


def test_fork_and_reset_past_max_live_are_refused_and_close_frees_the_place(pool):
    places = live_places(pool)
    env = WebMiniWoBEnv("enter-text", pool=pool, max_live=2)
    other = GuiMiniWoBEnv("click-test", pool=pool, max_live=2, live_wait_s=0.3)
    assert places.count() == 0, "a made env is not live before its reset"
    env.reset(seed=1)
    env.reset(seed=2)  # a second episode of a live env keeps its one place
    assert places.count() == 1
    child = env.fork()
    assert places.count() == 2
    with pytest.raises(ForkError, match="2 envs of its browser pool are live .* max_live is 2"):
        env.fork()
    with pytest.raises(ForkError, match="max_live is 2"):
        child.fork()
    with pytest.raises(BrowserError, match="cannot reset: no live place within 0.3s.*max_live is 2"):
        other.reset(seed=0)
    assert places.count() == 2 and pool.stats.active == 2, "the refusals took nothing"
    # the refused env and the parent carry on; closing the fork frees its place for the other env
    env.step(env.expert_action())
    child.close()
    assert places.count() == 1
    other.reset(seed=0)
    assert places.count() == 2
    _, r_other, _, _, _ = other.step(other.expert_action())
    assert r_other == 1.0
    other.close()
    env.close()
    assert places.count() == 0
    # an env dropped without close gives its place back when collected
    lost = WebMiniWoBEnv("click-test", pool=pool, max_live=1)
    lost.reset(seed=0)
    lost._run(lost._release())  # its context, as close would; the place stays until it is collected
    assert places.count() == 1
    del lost
    gc.collect()
    assert places.count() == 0


async def test_a_reset_waits_for_a_place_until_an_env_closes(pool):
    places = live_places(pool)
    first = WebMiniWoBEnv("click-test", pool=pool, max_live=1)
    await first.areset(seed=0)
    second = WebMiniWoBEnv("click-test", pool=pool, max_live=1)
    waiting = asyncio.create_task(second.areset(seed=1))
    await asyncio.sleep(0.5)
    assert not waiting.done() and places.count() == 1
    await first.aclose()
    await asyncio.wait_for(waiting, 30)
    assert places.count() == 1 and second.lease is not None
    await second.aclose()


async def test_a_tree_with_k_above_max_live_is_refused_and_one_within_it_stays_within_it(pool):
    places = live_places(pool)
    kwargs = {"task": "enter-text", "pool": pool, "max_live": 2, "max_turns": 4}
    wide = RolloutEngine(
        WebMiniWoBEnv, ScriptedAgent(), RolloutConfig(tree=TreeConfig(k=3)), env_kwargs=kwargs
    )
    with pytest.raises(TreeError, match="at most 2 live envs at once .* needs 3"):
        await wide.run(1)
    assert places.count() == 0
    peak = 0

    async def watch():
        nonlocal peak
        while True:
            peak = max(peak, places.count())
            await asyncio.sleep(0.01)

    watcher = asyncio.create_task(watch())
    eng = RolloutEngine(
        WebMiniWoBEnv,
        ScriptedAgent(),
        RolloutConfig(tree=TreeConfig(k=2, turns=(0,)), max_concurrency=3),
        env_kwargs=kwargs,
        env_id="web-miniwob",
    )
    try:
        trajs = await eng.run(range(3))  # three trees side by side, two places: they take turns
    finally:
        watcher.cancel()
    assert len(trajs) == 6 and not any(t.masked for t in trajs), [t.mask_reason for t in trajs]
    assert eng.stats.tree["fork_errors"] == 0 and eng.stats.tree["forks"] == 3
    assert all(t.total_reward == 1.0 for t in trajs)
    assert 2 == peak and places.count() == 0


@pytest.mark.parametrize(
    ("env_id", "kwargs"),
    [
        ("web-shop-v0", dict(split="test", catalog_size=300, n_goals=600)),
        ("web-arena-lite-v0", dict(per_template=1)),
    ],
)
def test_the_site_envs_take_max_live_through_make(pool, env_id, kwargs):
    import turngym

    places = live_places(pool)
    with turngym.make(env_id, pool=pool, max_live=1, **kwargs) as env:
        assert env.unwrapped.max_live == 1
        env.reset(seed=1)
        with pytest.raises(ForkError, match="max_live is 1"):
            env.fork()
        assert places.count() == 1 and pool.stats.active == 1, "the refused fork took nothing"
        env.step(env.expert_action())  # the parent carries on
    assert places.count() == 0
