"""Forking the light families (arith, search-qa/search-r1, travel-planner/travel-open): nothing mutable
shared, the big read-only members shared, branches independent; the conformance ``fork`` check."""

from __future__ import annotations

import copy
import json
import os

import pytest

import turngym
from turngym.core.env import NotForkable
from turngym.envs.arith.env import ArithEnv
from turngym.testing import check_env
from turngym.tools.env import Env

#: families that need a service: docker, browsers, or (interop) external MCP servers and remote envs
#: served by `turngym serve` (tests/remote covers both, conformance included)
SERVICES = {"docker", "web", "interop"}
LIGHT = [s.id for s in turngym.registry.latest() if not SERVICES & set(s.requires)]
SEARCH = {"n_passages": 1500, "n_tasks": 150}
TRAVEL = {"db_seed": 3, "n_cities": 150, "n_days": 14}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("fork-cache")
    old = os.environ.get("TURNGYM_CACHE_DIR")
    os.environ["TURNGYM_CACHE_DIR"] = str(path)
    yield str(path)
    if old is None:
        os.environ.pop("TURNGYM_CACHE_DIR", None)
    else:
        os.environ["TURNGYM_CACHE_DIR"] = old


def make(env_id: str, cache_dir: str, **kw) -> Env:
    if env_id.startswith("search"):
        kw = {**SEARCH, "cache_dir": cache_dir, **kw}
    elif env_id.startswith("travel"):
        kw = {**TRAVEL, "cache_dir": cache_dir, **kw}
    return turngym.make(env_id, **kw)


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def is_atomic(value) -> bool:
    if isinstance(value, tuple):
        return all(is_atomic(v) for v in value)
    return type(value) in (int, float, str, bytes, bool, type(None), frozenset) or isinstance(value, type)


def test_the_light_families_are_forkable():
    assert {"arith-v0", "search-qa-v0", "search-r1-v0", "travel-planner-v0", "travel-open-v0"} <= set(LIGHT)
    for env_id in LIGHT:
        assert turngym.registry.spec(env_id).load().forkable, env_id


def test_the_browser_families_fork_by_replay():
    """web-miniwob, gui-miniwob(-grounding), web-shop, web-arena-lite fork through BrowserEnv's replay (the
    browser-marked tests in tests/envs/web/test_fork_browser.py and tests/envs/sites/test_fork_sites.py run them)."""
    from turngym.envs.browser.env import BrowserEnv

    browser = {s.id for s in turngym.registry.latest() if "web" in s.requires}
    assert {"web-miniwob-v0", "gui-miniwob-v0", "web-shop-v0", "web-arena-lite-v0"} <= browser
    for env_id in browser:
        cls = turngym.registry.spec(env_id).load()
        assert cls.forkable and issubclass(cls, BrowserEnv), env_id
        assert cls._fork is BrowserEnv._fork and "lease" in cls._fork_fresh, env_id


@pytest.mark.parametrize("env_id", LIGHT)
def test_fork_shares_only_the_declared_read_only_members(env_id, cache_dir):
    env = make(env_id, cache_dir)
    env.reset(seed=0)
    env.step(env.expert_action())
    child = env.fork()
    shared = set(type(env)._fork_shared) | {"parser", "spec"}
    for name, value in env.__dict__.items():
        other = child.__dict__[name]
        if name in shared:
            assert other is value, f"{name} should be shared with the fork"
        elif not is_atomic(value):
            assert other is not value, f"{env_id}: the fork shares mutable {name!r} ({type(value).__name__})"
    # one level further: no container inside a copied member is the parent's either
    for name, value in env.__dict__.items():
        if name in shared or is_atomic(value) or not hasattr(value, "__dict__"):
            continue
        for k, v in vars(value).items():
            if isinstance(v, (list, dict, set)) and v:
                assert vars(child.__dict__[name])[k] is not v, f"{env_id}: {name}.{k} is shared"
    env.close()
    child.close()


def test_search_fork_shares_the_index_and_branches_with_noise(cache_dir):
    env = make("search-qa", cache_dir, noise_prob=0.7)  # noisy searches draw from the env's RNG
    env.reset(seed=4)
    env.step(env.expert_action())
    child = env.fork()
    assert child.retriever is env.retriever and child.corpus is env.corpus and child.tasks is env.tasks
    assert child._retrieved == env._retrieved and child._retrieved is not env._retrieved
    queries = ["capital city river", "born year founder", "population mountain"]
    fork_obs = [child.step(call("search", query=q, k=3))[0][0].content for q in queries]
    parent_obs = [env.step(call("search", query=q, k=3))[0][0].content for q in reversed(queries)]
    # replays from a fresh env with the same seed reproduce each branch
    for actions, want in ((queries, fork_obs), (list(reversed(queries)), parent_obs)):
        fresh = make("search-qa", cache_dir, noise_prob=0.7)
        fresh.reset(seed=4)
        fresh.step(fresh.expert_action())
        assert [fresh.step(call("search", query=q, k=3))[0][0].content for q in actions] == want
        fresh.close()
    assert env._queries[1:] == list(reversed(queries)) and child._queries[1:] == queries


def test_search_r1_fork_keeps_the_tag_protocol(cache_dir):
    env = make("search-r1", cache_dir)
    env.reset(seed=1)
    env.step(env.expert_action())
    child = env.fork()
    assert child.parser is env.parser and child.parser.name == "tags"
    _, reward, terminated, _, _ = child.step("<answer> definitely wrong </answer>")
    assert terminated and reward == 0.0
    assert not env._done and env.last_answer is None


@pytest.mark.parametrize("env_id", ["travel-planner", "travel-open"])
def test_travel_fork_mid_script_leaves_the_parent_plan_intact(env_id, cache_dir):
    env = make(env_id, cache_dir)
    env.reset(seed=2)
    for _ in range(2):
        env.step(env.expert_action())
    child = env.fork()
    assert child.db is env.db
    assert child._ledger is not env._ledger and len(child._ledger) == len(env._ledger)
    ledger_before = copy.deepcopy(env._ledger.__dict__)
    notes_before = list(env._notes)
    # the fork writes notes, searches more and submits a bad plan
    child.step(call("notebook_write", text="fork note"))
    child.step(call("search_cities", state="Texas"))
    _, reward, terminated, _, info = child.step(call("submit_plan", plan=[{"days": 1}]))
    assert terminated and reward == 0.0 and child._plan is not None
    assert env._ledger.__dict__ == ledger_before and env._notes == notes_before
    assert env._plan is None and env._evaluation is None and not env._done
    # the parent follows its expert script to the end, exactly as an unforked env does
    rewards = []
    while not env._done:
        rewards.append(env.step(env.expert_action())[1])
    ref = make(env_id, cache_dir)
    ref.reset(seed=2)
    ref_rewards = []
    while not ref._done:
        r = ref.step(ref.expert_action())[1]
        ref_rewards.append(r)
    assert rewards == ref_rewards[2:]
    if env_id == "travel-planner":
        assert rewards[-1] == 1.0  # the parent's plan still passes
    assert child._notes == [*notes_before, "fork note"]


# ------------------------------------------------------------------------- conformance check
def test_conformance_reports_fork_for_light_envs():
    report = check_env("arith")
    fork = next(r for r in report.results if r.name == "fork")
    assert fork.passed and "matched a fresh replay" in fork.detail


class ShallowFork(ArithEnv):
    """Broken: its fork shares the expression being worked on and the computed values."""

    def _fork(self):
        child = copy.copy(self)
        child.__dict__.update(self._fork_copy().__dict__)
        child._work, child._computed = self._work, self._computed
        for bound in child.toolbox._tools.values():
            bound.owner = child
        return child


class SilentCopy(ArithEnv):
    """Broken: not forkable, but ``fork`` returns a copy instead of raising."""

    forkable = False

    def fork(self):
        return self._fork_copy()


class WrongError(ArithEnv):
    forkable = False

    def fork(self):
        raise ValueError("nope")


def test_conformance_fails_a_fork_that_shares_state():
    env = ShallowFork(depth=3)
    report = check_env(env, gymnasium_checker=False)
    failed = {r.name: r.detail for r in report.failures}
    assert "fork" in failed and "replay" in failed["fork"]
    assert "determinism" not in failed


def test_conformance_fails_a_non_forkable_env_that_copies_silently():
    failed = {r.name: r.detail for r in check_env(SilentCopy(), gymnasium_checker=False).failures}
    assert "fork" in failed and "returned a copy" in failed["fork"]
    failed = {r.name: r.detail for r in check_env(WrongError(), gymnasium_checker=False).failures}
    assert "fork" in failed and "not NotForkable" in failed["fork"]


def test_conformance_passes_a_non_forkable_env_that_raises():
    class Plain(ArithEnv):
        forkable = False

    report = check_env(Plain(), gymnasium_checker=False)
    fork = next(r for r in report.results if r.name == "fork")
    assert fork.passed and "NotForkable" in fork.detail
    with pytest.raises(NotForkable):
        Plain().fork()


def test_cli_check_prints_the_fork_row():
    from typer.testing import CliRunner

    from turngym.cli import app

    result = CliRunner().invoke(app, ["check", "arith", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.output)[0]["results"]}
    assert rows["fork"]["passed"] and "fork" in rows["fork"]["detail"]
