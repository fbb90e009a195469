"""Every registered env that needs no external service passes the conformance suite here.

Envs that need Docker or a browser are checked in their own family's tests (and by the
README's `turngym check`, which checks every registered env).
"""

import pytest

import turngym
from turngym.testing import check_env

#: families that need a service: docker, browsers, or (interop) external MCP servers and remote envs
#: served by `turngym serve` (tests/remote covers both, conformance included)
SERVICES = {"docker", "web", "interop"}
LIGHT = [s.id for s in turngym.registry.latest() if not SERVICES & set(s.requires)]


@pytest.mark.parametrize("env_id", LIGHT)
def test_registered_env_conforms(env_id):
    report = check_env(env_id)
    report.raise_for_failures()
    fork = next(r for r in report.results if r.name == "fork")  # every light env forks independently
    assert "matched a fresh replay" in fork.detail


def test_suite_catches_a_broken_env():
    from turngym.core.env import Env, Task
    from turngym.core.types import Message
    from turngym.tools import tool

    class Nondeterministic(Env):
        count = 0

        @tool
        def noop(self) -> str:
            """Nothing."""
            return ""

        def _reset(self, rng, options):
            Nondeterministic.count += 1
            return Task([Message(role="user", content=str(self.count))], task_id=str(self.count))

    report = check_env(Nondeterministic())
    assert not report.ok
    assert "determinism" in {r.name for r in report.failures}


class _Flaky:
    """Builds a one-tool env whose ``look`` tool times out on the calls ``timeouts`` names (counted over
    all envs of the class, as a loaded machine would), and otherwise answers the same for the same seed."""

    @staticmethod
    def env(timeouts, *, name="look_timeout", drift=False):
        from turngym.sdk import ToolEnv
        from turngym.tools import ToolError, tool

        calls = {"n": 0}

        class Flaky(ToolEnv):
            tasks = [{"id": "a", "prompt": "look twice", "answer": "x"}]
            reward_components = ("correct",)
            default_max_turns = 4

            @tool
            def look(self, where: str) -> str:
                """Look somewhere."""
                calls["n"] += 1
                if timeouts(calls["n"]):
                    raise ToolError("the browser action timed out: Locator.click: Timeout 5000ms exceeded.")
                return f"seen {where}" + (f" #{calls['n']}" if drift else "")

            def reward(self, task, done):
                return {"correct": 0.0}

        Flaky.__name__ = name
        return Flaky()


def test_a_comparison_spoilt_by_a_timeout_is_tried_again_and_says_so():
    report = check_env(_Flaky.env(lambda n: n == 2))  # the second look of the determinism check times out
    report.raise_for_failures()
    det = next(r for r in report.results if r.name == "determinism")
    assert "passed on attempt 2" in det.detail and "timed out" in det.detail


def test_timeouts_on_every_attempt_fail_as_inconclusive_not_as_a_pass():
    report = check_env(_Flaky.env(lambda n: n % 2 == 0), attempts=3)  # every second call times out
    det = next(r for r in report.results if r.name == "determinism")
    assert not det.passed
    assert det.detail.startswith("inconclusive after 3 attempts, each spoilt by a timeout: seed 0:")


def test_a_real_difference_without_a_timeout_fails_at_once():
    report = check_env(_Flaky.env(lambda n: False, drift=True))  # a different observation every call
    det = next(r for r in report.results if r.name == "determinism")
    assert (
        not det.passed and "inconclusive" not in det.detail and "first-step observations differ" in det.detail
    )
