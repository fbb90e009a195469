"""Every registered env that needs no external service passes the conformance suite here.

Envs that need Docker or a browser are checked in their own family's tests (and by the
README's `turngym check`, which checks every registered env).
"""

import pytest

import turngym
from turngym.testing import check_env

#: families that need a service: docker, browsers, desktops under X in Docker (tests/envs/desktop runs
#: the suite on them), or (interop) external MCP servers and remote envs served by `turngym serve`
#: (tests/remote covers both, conformance included)
SERVICES = {"docker", "web", "desktop", "interop"}
LIGHT = [s.id for s in turngym.registry.latest() if not SERVICES & set(s.requires)]


@pytest.mark.parametrize("env_id", LIGHT)
def test_registered_env_conforms(env_id):
    report = check_env(env_id)
    report.raise_for_failures()
    fork = next(r for r in report.results if r.name == "fork")  # every light env forks independently
    assert "matched a fresh replay" in fork.detail


def test_suite_catches_a_broken_env():
    from turngym.core.env import Task
    from turngym.core.types import Message
    from turngym.tools import tool
    from turngym.tools.env import Env

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


def test_the_surface_check_names_what_an_env_lacks_and_a_loosening_limit():
    from turngym.core.env import Task
    from turngym.core.types import Message
    from turngym.tools import tool
    from turngym.tools.env import Env

    class Loose(Env):
        """An env whose limit_turns loosens the limit: the surface check refuses it."""

        @tool
        def noop(self) -> str:
            """Nothing."""
            return ""

        def _reset(self, rng, options):
            return Task([Message(role="user", content="hi")], task_id="t")

        def limit_turns(self, max_turns):
            self.max_turns = int(max_turns)

    class NoAsync(Loose):
        def astep(self, action):  # the rollout engine awaits this: a plain function breaks it
            return self.step(action)

    surface = next(r for r in check_env(Loose()).results if r.name == "surface")
    assert not surface.passed and "changed max_turns 10 to 11" in surface.detail
    surface = next(r for r in check_env(NoAsync()).results if r.name == "surface")
    assert not surface.passed and "astep (not async)" in surface.detail


def test_ray_and_remote_envs_and_wrappers_have_the_env_surface():
    """``RayEnv`` and ``RemoteEnv`` live elsewhere and cannot be opened here without a cluster or a
    server (tests/remote runs the whole suite on a served env); their classes carry the surface, and
    they inherit ``limit_turns`` from the one ``TurnLimited`` instead of writing their own."""
    from turngym.core.env import TurnLimited, missing_surface
    from turngym.core.wrappers import RecordRewardComponents, TurnLimit
    from turngym.remote.client import RemoteEnv
    from turngym.rollout.ray_envs import RayEnv
    from turngym.tools.env import Env

    for cls in (Env, RemoteEnv, RayEnv):
        assert missing_surface(cls) == [], cls
        assert issubclass(cls, TurnLimited) and cls.limit_turns is TurnLimited.limit_turns, cls
    assert missing_surface(object) and "areset" in missing_surface(object)
    env = turngym.make("arith")
    try:
        for wrapped in (TurnLimit(env, 3), RecordRewardComponents(env)):
            assert missing_surface(wrapped) == [] and isinstance(wrapped, turngym.EnvProtocol)
            assert wrapped.parser is env.parser and wrapped.tool_instructions() == env.tool_instructions()
    finally:
        env.close()


def test_turn_limited_tightens_once_and_reports_a_pending_cap_once():
    from turngym.core.env import TurnLimited

    class Far(TurnLimited):  # an env that lives elsewhere: its cap is sent with the next reset
        max_turns = 10

    far = Far()
    assert far.pending_turn_cap() is None
    far.limit_turns(6)
    far.limit_turns(8)  # looser: the 6 stays
    assert far.max_turns == 6 and far.pending_turn_cap() == 6 and far.pending_turn_cap() is None
    far.limit_turns(7)
    assert far.pending_turn_cap() is None  # nothing tighter than what was sent
    far.limit_turns(2)
    assert far.max_turns == 2 and far.pending_turn_cap() == 2
    with pytest.raises(ValueError, match="max_turns must be >= 1"):
        far.limit_turns(0)
    assert far.max_turns == 2
