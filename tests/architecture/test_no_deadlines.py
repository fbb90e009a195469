"""No test depends on wall-clock speed: hypothesis runs without deadlines (tests/conftest.py's profile)."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

TESTS = Path(__file__).resolve().parents[1]


def test_the_default_profile_has_no_deadline():
    """Regression (issue 5: ``test_random_values_satisfy_their_schema`` took 315 ms under load and failed
    hypothesis's default 200 ms deadline): every property test runs under a profile with no deadline."""
    assert settings.default.deadline is None
    assert settings.get_profile("turngym").deadline is None


@settings(max_examples=5)
@given(st.integers())
def test_a_test_with_its_own_settings_inherits_no_deadline(n):
    assert settings().deadline is None


def test_no_test_sets_a_deadline():
    """Tests choose examples and health checks, not a time limit per example."""
    timed = re.compile(r"\bdeadline=(?!None\b)")  # a keyword argument (an assignment has spaces)
    found = [
        f"{path.relative_to(TESTS)}:{i}"
        for path in sorted(TESTS.rglob("*.py"))
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if timed.search(line)
    ]
    assert not found, f"per-test hypothesis deadlines: {found}"
