"""Part 3: generated hostile actions against every registered env, counted: raised, hung, paid, leaked.

For each env id in the catalog, hypothesis draws actions from the env's own tool schemas and parser
(``hostile.action_strategy``): schema-shaped calls as text and as structured messages (values that fit,
values of any JSON type, lone surrogates, ``true``/``"7"``/``7.0`` for integers, NaN, huge numbers),
free text full of call debris, and tag calls for a tag protocol. Each action must be answered (an
invalid turn with an error observation when it is malformed), none may raise or hang, garbage must earn
nothing, and closing the env must leave nothing behind; afterwards the expert still solves a fresh
episode in the same env. The conftest prints the totals; docs/reliability.md records a full run.

The fast families alone give more than 10,000 generated actions; the browser and Docker families get
small samples (a step costs 0.1-1 s there) and carry their markers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

import turngym

from .hostile import counted_leaks, fuzz_actions, watchdog

pytestmark = pytest.mark.reliability


@dataclass(frozen=True)
class Plan:
    examples: int  # generated actions
    kwargs: dict[str, Any] = field(default_factory=dict)  # for turngym.make
    skip: frozenset[str] = frozenset()  # tools left out of generation (slow ones, covered elsewhere)
    marks: tuple[str, ...] = ()
    solvable: bool = True  # the expert earns a positive reward afterwards


_BROWSER = ("browser", "slow")
#: configuration label -> (env id, plan); two configurations of arith also run the structured form
PLANS: dict[str, tuple[str, Plan]] = {
    "arith": ("arith-v0", Plan(2_500)),
    "arith (openai)": ("arith-v0", Plan(1_000, {"parser": "openai"})),
    "search-qa": ("search-qa-v0", Plan(1_800)),
    "search-r1": ("search-r1-v0", Plan(1_500)),
    "travel-planner": ("travel-planner-v0", Plan(1_800)),
    "travel-open": ("travel-open-v0", Plan(800, solvable=False)),
    "mcp": ("mcp-v0", Plan(1_000)),
    "web-miniwob": ("web-miniwob-v0", Plan(60, {"task": "click-button"}, marks=_BROWSER)),
    "gui-miniwob": ("gui-miniwob-v0", Plan(60, {"task": "click-button"}, marks=_BROWSER)),
    "gui-miniwob-grounding": ("gui-miniwob-grounding-v0", Plan(40, marks=_BROWSER)),
    "web-shop": ("web-shop-v0", Plan(40, marks=_BROWSER)),
    "web-arena-lite": ("web-arena-lite-v0", Plan(40, marks=_BROWSER)),
    "web-forum": ("web-forum-v0", Plan(30, marks=_BROWSER)),
    "web-tracker": ("web-tracker-v0", Plan(30, marks=_BROWSER)),
    # bash and submit run real commands and test suites: tests/reliability/test_swe_escape.py fuzzes them
    "swe-docker": (
        "swe-docker-v0",
        Plan(40, {"command_timeout": 8.0}, skip=frozenset({"bash", "submit"}), marks=("docker", "slow")),
    ),
}
#: registered ids this suite does not make, and why
NOT_HERE = {
    "gui-desktop-v0": "real desktops under X (~0.15 s an action): the conformance suite's hostile actions "
    "run on it in tests/envs/desktop (test_turngym_check_passes_every_row), and its bad-input test "
    "(off-screen clicks, unknown keys, 1 MB of text, huge waits, bad element ids); a generated-action "
    "plan here is next",
    "gui-desktop-grounding-v0": "as gui-desktop-v0 (the same tools; conformance by `turngym check`)",
    "remote-v0": "a client of an env served elsewhere (every env it can serve is fuzzed here directly): "
    "tests/reliability/test_hostile_remote.py sends the surrogate and value=true attacks through a real "
    "server (a raw lone surrogate makes RemoteEnv raise: a strict xfail, turngym/remote's to fix), and "
    "tests/remote/test_serve.py runs the conformance suite's hostile actions over it",
}


def test_every_registered_env_is_fuzzed():
    """Adding an env to the catalog without a plan here fails: every registered env gets hostile input."""
    catalog = {
        env_id
        for env_id, spec in turngym.registry.items()
        if isinstance(spec.entry_point, str) and spec.entry_point.startswith("turngym.")
    }
    planned = {env_id for env_id, _ in PLANS.values()}
    assert catalog == planned | set(NOT_HERE), catalog ^ (planned | set(NOT_HERE))


def solve(env) -> tuple[bool, float]:
    """Run the expert on a fresh episode: (episode ended, last reward)."""
    env.reset(seed=1)
    reward, done = 0.0, False
    for _ in range(200):
        action = env.expert_action()
        if action is None:
            break
        _, reward, terminated, truncated, _ = env.step(action)
        done = terminated or truncated
        if done:
            break
    return done, reward


@pytest.mark.parametrize(
    "label",
    [
        pytest.param(label, marks=[getattr(pytest.mark, m) for m in plan.marks])
        for label, (_, plan) in PLANS.items()
    ],
)
def test_generated_hostile_actions(label):
    env_id, plan = PLANS[label]
    with counted_leaks(label):
        with watchdog(f"make({env_id})"):
            env = turngym.make(env_id, max_turns=1_000_000, **plan.kwargs)
        try:
            with watchdog(f"reset({env_id})"):
                env.reset(seed=0)
            seen = fuzz_actions(env, label, plan.examples, skip=plan.skip)
            tried = sum(n for k, n in seen.items() if k not in ("ran", "garbage"))
            assert tried >= plan.examples * 0.95, seen
            assert seen["ran"] > 0, f"no generated call reached a tool: {seen}"  # not only validation
            assert seen["garbage"] > 0, seen
            with watchdog(f"expert on {env_id}"):
                done, reward = solve(env)  # the env is still sound
            assert done and (reward > 0 or not plan.solvable), (done, reward)
        finally:
            with watchdog(f"close({env_id})"):
                env.close()
