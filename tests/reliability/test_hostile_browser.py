"""Part 1 (browser families): a small sample of hostile actions per family (Chromium is slow here).

The sample covers each category once or twice: the conformance list's first entries, wrong types,
missing/extra arguments, unknown tools, gigantic and control-character arguments, prompt injection,
thousands of calls in one turn. The MiniWoB families also get a small hypothesis-generated set (tool
calls with known and unknown names and arbitrary JSON arguments, and free text full of call debris) on
one browser page; afterwards the expert still solves the task in the same env. The fast families get
larger generated sets (test_hostile_actions.py); all share its checker.
"""

from __future__ import annotations

import pytest

import turngym

from .hostile import check_answer, fixed_cases, fuzz_calls, fuzz_text, schema_cases

pytestmark = [pytest.mark.reliability, pytest.mark.browser, pytest.mark.slow]

FAMILIES = {
    "web-miniwob-v0": {"task": "click-button"},
    "gui-miniwob-v0": {"task": "click-button"},
    "web-shop-v0": {},
    "web-arena-lite-v0": {},
}
GENERATED_CALLS = 60  # per family: a browser step costs ~0.1-1 s here
GENERATED_TEXTS = 20


def sample(tools, parser: str):
    cases = schema_cases(tools, parser)
    picked, seen = [], set()
    for case in cases:  # one of each category
        if case.category not in seen:
            seen.add(case.category)
            picked.append(case)
    return fixed_cases()[:5] + picked


@pytest.mark.parametrize("env_id", list(FAMILIES))
def test_hostile_sample(env_id):
    env = turngym.make(env_id, max_turns=1_000, **FAMILIES[env_id])
    try:
        env.reset(seed=0)
        for case in sample(env.tools, env.parser.name):
            info = check_answer(
                env,
                case.action,
                malformed=case.malformed,
                garbage=case.garbage,
                family=env_id,
                category=case.category,
            )
            assert not info.get("masked"), info.get("mask_reason")  # bad input is not a browser fault
    finally:
        env.close()


@pytest.mark.parametrize("env_id", ["web-miniwob-v0", "gui-miniwob-v0"])
def test_generated_actions(env_id):
    env = turngym.make(env_id, max_turns=1_000, **FAMILIES[env_id])
    try:
        env.reset(seed=0)
        tried, ran = fuzz_calls(env, env_id, GENERATED_CALLS)
        assert tried >= GENERATED_CALLS // 2 and ran > 0  # some calls reached the page, not only validation
        assert fuzz_text(env, env_id, GENERATED_TEXTS) >= GENERATED_TEXTS // 2
        env.reset(seed=1)  # the env is still sound: the expert solves a fresh episode
        reward, done = 0.0, False
        while not done and (action := env.expert_action()) is not None:
            _, reward, terminated, truncated, info = env.step(action)
            done = terminated or truncated
        assert done and reward > 0, info
    finally:
        env.close()


@pytest.mark.parametrize("env_id", ["web-shop-v0", "web-arena-lite-v0"])
def test_a_huge_url_gives_a_bounded_observation(env_id):
    """Regression (issue 3: a 500k-character URL gave a 516k-character observation): the site envs'
    ``URL:``, ``Title:`` and ``Tabs:`` lines are capped, whatever address the agent opens."""
    from turngym.envs.browser.sites.env import MAX_URL_CHARS

    env = turngym.make(env_id, max_turns=1_000, **FAMILIES[env_id])
    try:
        env.reset(seed=0)
        origin = next(iter(env.hosts))
        huge = f"{origin}/?q=" + "A" * 500_000
        for name, args in (("goto", {"url": huge}), ("new_tab", {"url": huge})):
            obs, reward, _, _, info = env.step(env.format_call(name, args))
            assert info["tool_results"][0].ok, info["error"]
            (page,) = [m for m in obs if m.role == "user" and "URL: " in m.content]
            lines = page.content.splitlines()
            (url_line,) = [line for line in lines if line.startswith("URL: ")]
            assert url_line.startswith(f"URL: {origin}/?q=AAA") and "more characters]" in url_line
            assert len(url_line) <= MAX_URL_CHARS + 40
            assert all(
                len(line) <= 3 * MAX_URL_CHARS for line in lines if line.startswith(("Tabs:", "Title:"))
            )
            assert sum(len(m.content) for m in obs) < 40_000 and reward <= 0.0
        _, _, _, _, info = env.step(
            env.format_call("goto", {"url": "http://elsewhere.example/" + "B" * 500_000})
        )
        assert info["invalid_action"] and len(info["error"]) < 2 * MAX_URL_CHARS  # the refusal is short too
    finally:
        env.close()
