"""Every registered env that needs no external service passes the conformance suite here.

Envs that need Docker or a browser are checked in their own family's tests (and by the
README's `turngym check`, which checks every registered env).
"""

import pytest

import turngym
from turngym.testing import check_env

#: families that need a service: docker, browsers, or (interop) external MCP servers and remote envs
#: served by `turngym serve` (tests/interop covers both, conformance included)
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
