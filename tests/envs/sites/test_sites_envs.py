"""web-shop and web-arena-lite in real headless Chromium: experts, navigation/tab tools, faults, conformance."""

from __future__ import annotations

import os
import signal

import pytest

import turngym
from turngym.testing import check_env

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def _run_expert(env, seed=0, options=None, max_steps=12):
    obs, info = env.reset(seed=seed, options=options)
    total, info = 0.0, {}
    for _ in range(max_steps):
        action = env.expert_action()
        assert action is not None, obs[-1].content[:2000]
        obs, r, term, trunc, info = env.step(action)
        assert not info["invalid_action"], info["error"]
        total += r
        if term or trunc:
            return total, term, info
    raise AssertionError("the expert did not finish")


@pytest.fixture(scope="module")
def shop():
    env = turngym.make("web-shop-v0", split="test")
    yield env
    env.close()


@pytest.fixture(scope="module")
def arena():
    env = turngym.make("web-arena-lite-v0", per_template=2)
    yield env
    env.close()


def _content(obs):
    return "\n".join(m.content for m in obs)


def test_shop_first_observation(shop):
    obs, info = shop.reset(seed=0)
    assert obs[0].role == "system" and "click" in obs[0].content and "goto" in obs[0].content
    first = obs[1].content
    goal = info["reference"]["goal"]
    assert first.startswith(f"Task: {goal['instruction_text']}")
    assert "URL: http://shop.local/" in first and 'textbox "Search"' in first and "127.0.0.1" not in first
    assert info["task_id"].startswith("webshop/") and 0 <= info["goal_index"] < 500
    assert {t.name for t in shop.tools} >= {"click", "fill", "press", "scroll", "goto", "go_back", "go_forward",
                                           "new_tab", "tab_focus", "tab_close"}  # fmt: skip
    again, _ = shop.reset(seed=0)
    assert again[1].content == first


def test_shop_expert_mean_reward(shop):
    rewards = []
    for i in range(8):
        total, terminated, info = _run_expert(shop, options={"goal_index": i})
        assert terminated and info["purchase"]["asin"]
        assert info["reward_components"] == {"purchase": total}
        rewards.append(total)
    assert sum(rewards) / len(rewards) >= 0.9, rewards


def test_expert_follows_the_env_parser_structured_calls_under_openai():
    """The browser experts write Hermes text; the env renders it with its own parser: under
    ``parser="openai"`` the expert's action is an assistant message with structured tool calls, and it
    still buys what the Hermes expert buys."""
    hermes = turngym.make("web-shop-v0", split="test")
    structured = turngym.make("web-shop-v0", split="test", parser="openai")
    try:
        for env in (hermes, structured):
            env.reset(seed=0, options={"goal_index": 3})
        first_text, first_msg = hermes.expert_action(), structured.expert_action()
        assert isinstance(first_text, str) and first_text.startswith("<tool_call>")
        assert first_msg.role == "assistant" and first_msg.tool_calls and not first_msg.content
        assert [c.name for c in first_msg.tool_calls] == [
            c.call.name for c in hermes.parser.parse(first_text).calls
        ]
        total, terminated, info = _run_expert(structured, options={"goal_index": 3})
        assert terminated and info["purchase"]["asin"]
        assert total == _run_expert(hermes, options={"goal_index": 3})[0]
    finally:
        hermes.close()
        structured.close()


def test_shop_unbought_episode_pays_zero_and_bad_ids_are_errors():
    env = turngym.make("web-shop-v0", split="test", max_turns=2)
    try:
        env.reset(seed=1)
        obs, r, term, trunc, info = env.step(
            '<tool_call>{"name": "click", "arguments": {"bid": 9999}}</tool_call>'
        )
        assert "no element with id 9999" in _content(obs) and info["invalid_action"] and not (term or trunc)
        obs, r, term, trunc, info = env.step(
            '<tool_call>{"name": "noop", "arguments": {"wait_ms": 0}}</tool_call>'
        )
        assert trunc and not term and r == 0.0 and info["reward_components"] == {"purchase": 0.0}
    finally:
        env.close()


def _call(env, name, **args):
    import json

    return env.step(f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>")


@pytest.fixture
def shop_long():
    env = turngym.make("web-shop-v0", split="test", max_turns=40)
    yield env
    env.close()


def test_navigation_and_tab_tools(shop_long):
    shop = shop_long
    shop.reset(seed=2)
    obs, _, _, _, info = _call(shop, "goto", url="/search?q=lamp")
    assert "URL: http://shop.local/search?q=lamp" in _content(obs) and not info["invalid_action"]
    obs, *_ = _call(shop, "go_back")
    assert "URL: http://shop.local/\n" in _content(obs)
    obs, *_ = _call(shop, "go_forward")
    assert "search?q=lamp" in _content(obs)
    obs, *_, info = _call(shop, "goto", url="https://example.com/")
    assert "only this task's sites" in _content(obs) and info["invalid_action"]
    obs, *_ = _call(shop, "new_tab", url="http://shop.local/search?q=coffee")
    text = _content(obs)
    assert "Tabs: [0]" in text and "[1] (active)" in text and "URL: http://shop.local/search?q=coffee" in text
    obs, *_ = _call(shop, "tab_focus", index=0)
    assert "[0] (active)" in _content(obs) and "URL: http://shop.local/search?q=lamp" in _content(obs)
    obs, *_, info = _call(shop, "tab_focus", index=7)
    assert "no tab 7" in _content(obs) and info["invalid_action"]
    for _ in range(3):
        _call(shop, "new_tab")
    obs, *_ = _call(shop, "new_tab")
    assert "at most 4 tabs" in _content(obs)
    for _ in range(3):
        obs, *_, info = _call(shop, "tab_close")
        assert not info["invalid_action"], info["error"]
    obs, *_ = _call(shop, "tab_close")
    assert "Tabs:" not in _content(obs).split("\n\n")[-1]
    obs, *_, info = _call(shop, "tab_close")
    assert "last tab cannot be closed" in _content(obs)
    obs, *_ = _call(shop, "go_back")
    obs, *_, info = _call(shop, "go_back")
    assert "no previous page" in _content(obs)


def test_pages_the_site_opens_become_tabs(shop_long):
    shop = shop_long
    shop.reset(seed=3)
    _call(shop, "goto", url="/search?q=lamp")
    link = next(n for n in shop.snap.nodes if n.role == "link" and "Lamp" in n.name)
    obs, *_ = _call(shop, "press", bid=link.id, key_comb="Control+Enter")  # opens it in a background tab
    text = _content(obs)
    for _ in range(5):  # the browser opens the tab asynchronously: it may show up a step later
        if "[1] " in text.split("URL:")[0]:
            break
        obs, *_ = _call(shop, "noop")
        text = _content(obs)
    assert "Tabs: [0] (active)" in text and "[1] " in text and "http://shop.local/item/" in text
    obs, *_ = _call(shop, "tab_focus", index=1)
    assert "URL: http://shop.local/item/" in _content(obs) and len(shop.tabs) == 2
    _call(shop, "new_tab")
    assert len(shop.tabs) == 3 and shop.active == 2


def test_arena_expert_success_on_every_template(arena):
    by_template = {}
    for t in arena.tasks:
        by_template.setdefault(t["intent_template_id"], t["task_id"])
    successes = []
    for tid in by_template.values():
        total, terminated, info = _run_expert(arena, options={"task_id": tid})
        assert terminated and info["evaluation"]["stopped"]
        successes.append(total == 1.0)
    assert len(successes) == 18 and sum(successes) / len(successes) >= 0.9, successes


def _task_of(env, template):
    return next(t["task_id"] for t in env.tasks if t["intent_template_id"] == template)


def test_arena_wrong_answers_and_truncation_score_zero(arena):
    arena.reset(seed=0, options={"task_id": _task_of(arena, 100)})
    obs, r, term, trunc, info = _call(arena, "stop", answer="definitely not a number")
    assert term and r == 0.0 and info["evaluation"]["parts"] == {"string_match": 0.0}
    env = turngym.make("web-arena-lite-v0", per_template=2, max_turns=1)
    try:
        env.reset(seed=0, options={"task_id": _task_of(env, 102)})
        obs, r, term, trunc, info = _call(env, "noop", wait_ms=0)
        assert trunc and r == 0.0 and info["evaluation"]["parts"] == {"url_match": 0.0}
    finally:
        env.close()


def test_arena_reset_restores_site_state(arena):
    tid = _task_of(arena, 103)  # upvote
    total, _, _ = _run_expert(arena, options={"task_id": tid})
    assert total == 1.0
    forum = arena.instances["forum"]
    assert forum.query("SELECT count(*) FROM votes")[0][0] == 1
    obs, info = arena.reset(seed=0, options={"task_id": tid})
    assert forum.query("SELECT count(*) FROM votes")[0][0] == 0 and info["site_reset_s"] >= 0
    obs, r, *_ = _call(arena, "stop")
    assert r == 0.0


def test_arena_observations_do_not_depend_on_the_instance(arena):
    other = turngym.make("web-arena-lite-v0", per_template=2)
    try:
        tid = _task_of(arena, 200)
        a, ia = arena.reset(seed=0, options={"task_id": tid})
        b, ib = other.reset(seed=0, options={"task_id": tid})
        assert arena.instances["tracker"].url != other.instances["tracker"].url
        assert a[1].content == b[1].content and ia["state_key"] == ib["state_key"]
    finally:
        other.close()


def test_arena_dead_site_and_crashed_browser(arena):
    tid = _task_of(arena, 106)
    arena.reset(seed=0, options={"task_id": tid})
    arena.instances["forum"].server.stop()
    obs, r, term, trunc, info = _call(arena, "goto", url="http://forum.local/f/books")
    assert "ERR_CONNECTION_REFUSED" in _content(obs) and info["invalid_action"] and not term
    total, _, _ = _run_expert(arena, options={"task_id": tid})  # reset restarts the site
    assert total == 1.0
    arena.reset(seed=0, options={"task_id": tid})
    for pid in arena.pool.browser_pids():
        os.kill(pid, signal.SIGKILL)
    obs, r, term, trunc, info = _call(arena, "noop", wait_ms=0)
    assert term and info.get("masked") and "crashed" in _content(obs)
    total, _, _ = _run_expert(arena, options={"task_id": tid})  # the pool relaunches the browser
    assert total == 1.0


@pytest.mark.parametrize("env_id, kwargs", [("web-shop-v0", {}), ("web-arena-lite-v0", {"per_template": 1})])
def test_conformance(env_id, kwargs):
    check_env(env_id, seeds=(0,), **kwargs).raise_for_failures()
