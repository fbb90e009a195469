"""Part 1 (browser families): a small sample of hostile actions per family (Chromium is slow here).

The sample covers each category once or twice: the conformance list's first entries, wrong types,
missing/extra arguments, unknown tools, gigantic and control-character arguments, prompt injection,
thousands of calls in one turn. The fast families get the full and generated sets
(test_hostile_actions.py); the browser families share its checker.
"""

from __future__ import annotations

import pytest

import turngym

from .hostile import check_answer, fixed_cases, schema_cases

pytestmark = [pytest.mark.reliability, pytest.mark.browser, pytest.mark.slow]

FAMILIES = {
    "web-miniwob-v0": {"task": "click-button"},
    "gui-miniwob-v0": {"task": "click-button"},
    "web-shop-v0": {},
    "web-arena-lite-v0": {},
}


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
                env, case.action, malformed=case.malformed, family=env_id, category=case.category
            )
            assert not info.get("masked"), info.get("mask_reason")  # bad input is not a browser fault
    finally:
        env.close()
