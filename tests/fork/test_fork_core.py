"""``Env.fork``/``afork``: independence (property tests on arith), RNG streams, errors, wrappers."""

from __future__ import annotations

import asyncio
import copy
import itertools
import random
import types

import gymnasium
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import turngym
from turngym.core.env import ForkError, NotForkable, Task
from turngym.core.types import Message
from turngym.core.wrappers import (
    RecordRewardComponents,
    RecordTrajectory,
    TurnLimit,
    afork_env,
    fork_env,
)
from turngym.envs.arith.env import ArithEnv
from turngym.tools import tool
from turngym.tools.env import Env


def summary(step):
    obs, reward, terminated, truncated, info = step
    return obs, reward, terminated, truncated, info["state_key"], info["turn"], info["reward_components"]


# ------------------------------------------------------------------ property tests on arith
#: an abstract action: resolved against the env that takes it (the expert's next call depends on its state)
action_st = st.one_of(
    st.just(("expert",)),
    st.tuples(
        st.just("calc"),
        st.integers(-60, 60),
        st.sampled_from(["+", "-", "*"]),
        st.integers(-60, 60),
    ),
    st.tuples(st.just("answer"), st.integers(-500, 500)),
    st.just(("text",)),
)


def concrete(env: ArithEnv, action: tuple) -> str:
    kind = action[0]
    if kind == "expert":
        return env.expert_action() or "no call"
    if kind == "calc":
        return env.format_call("calculate", {"a": action[1], "op": action[2], "b": action[3]})
    if kind == "answer":
        return env.format_call("answer", {"value": action[1]})
    return "just text, no tool call"


def replay(seed: int, actions: list[str], depth: int) -> list[tuple]:
    env = ArithEnv(depth=depth)
    env.reset(seed=seed)
    out = [summary(env.step(a)) for a in actions]
    env.close()
    return out


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**16),
    depth=st.integers(1, 4),
    prefix=st.lists(action_st, max_size=4),
    parent_tail=st.lists(action_st, min_size=1, max_size=5),
    fork_tail=st.lists(action_st, min_size=1, max_size=5),
    order=st.lists(st.booleans(), min_size=10, max_size=10),
)
def test_arith_fork_matches_fresh_replays(seed, depth, prefix, parent_tail, fork_tail, order):
    """Fork at a random turn, continue both with random actions interleaved at random: each branch
    equals a replay of its own actions on a fresh env with the same seed."""
    env = ArithEnv(depth=depth)
    env.reset(seed=seed)
    taken: list[str] = []
    for a in prefix:
        if env._done:
            break
        taken.append(concrete(env, a))
        env.step(taken[-1])
    child = env.fork()
    assert child.turn == env.turn and child._state_key() == env._state_key()

    branches = {"parent": (env, list(parent_tail), [], []), "fork": (child, list(fork_tail), [], [])}
    for pick_parent in itertools.chain(order, itertools.repeat(True, 5), itertools.repeat(False, 5)):
        e, todo, actions, steps = branches["parent" if pick_parent else "fork"]
        if todo and not e._done:
            actions.append(concrete(e, todo.pop(0)))
            steps.append(summary(e.step(actions[-1])))
    for name, (_, _, actions, steps) in branches.items():
        assert steps == replay(seed, taken + actions, depth)[len(taken) :], name
    env.close()
    child.close()


def test_arith_fork_diverges_and_leaves_the_parent_alone():
    env = ArithEnv(depth=3)
    env.reset(seed=5)
    env.step(env.expert_action())
    child = env.fork()
    before = (env._state_key(), copy.deepcopy(env._work), set(env._computed), env.turn)
    wrong = child.format_call("answer", {"value": -12345})
    _, reward, terminated, _, _ = child.step(wrong)
    assert terminated and reward == 0.0
    assert (env._state_key(), env._work, env._computed, env.turn) == before
    assert not env._done
    # the parent goes on to the right answer on its own
    done = False
    while not done:
        *_, term, trunc, _ = env.step(env.expert_action())
        done = term or trunc
    assert env._answer == env._target and child._answer == -12345


def test_fork_of_a_fork_and_of_a_finished_episode():
    env = ArithEnv(depth=2)
    env.reset(seed=1)
    env.step(env.expert_action())
    grandchild = env.fork().fork()
    assert grandchild._state_key() == env._state_key()
    while not env._done:
        env.step(env.expert_action())
    finished = env.fork()
    assert finished._done and finished.terminated
    with pytest.raises(RuntimeError, match="reset"):
        finished.step("x")


def test_fork_rebinds_tools_and_shares_tool_definitions():
    env = ArithEnv()
    env.reset(seed=0)
    child = env.fork()
    for name in env.toolbox.names:
        assert child.toolbox.get(name).owner is child
        assert child.toolbox.get(name).definition is env.toolbox.get(name).definition
    assert child.toolbox is not env.toolbox and child.parser is env.parser
    assert child.action_space is not env.action_space


def test_fork_has_its_own_event_loop_and_closing_it_leaves_the_parent_open():
    env = ArithEnv()
    env.reset(seed=0)
    env.step("x")
    assert env._loop is not None
    child = env.fork()
    assert child._loop is None
    child.step("x")
    assert child._loop is not None and child._loop is not env._loop
    child.close()
    env.step(env.expert_action())  # the parent still works
    with pytest.raises(ForkError, match="closed"):
        child.fork()


# ----------------------------------------------------------------------------- RNG streams
class Dice(Env):
    """Draws from the env's numpy Generator and from its own ``random.Random`` in a tool."""

    forkable = True

    def __init__(self, **kw):
        super().__init__(**kw)
        self.py_rng = random.Random(0)

    @tool
    def roll(self) -> str:
        """Roll."""
        return f"{int(self.np_random.integers(1_000_000))} {self.py_rng.randrange(1_000_000)}"

    def _reset(self, rng, options):
        self.py_rng = random.Random(int(rng.integers(2**31)))
        return Task([Message(role="user", content="roll")], task_id="dice")


ROLL = '<tool_call>{"name": "roll", "arguments": {}}</tool_call>'


def test_rng_streams_are_copied_at_their_position_not_shared():
    env = Dice(max_turns=50)
    env.reset(seed=3)
    env.step(ROLL)
    child = env.fork()
    assert child.np_random is not env.np_random and child.py_rng is not env.py_rng
    fork_draws = [child.step(ROLL)[0][0].content for _ in range(5)]
    parent_draws = [env.step(ROLL)[0][0].content for _ in range(5)]
    # same stream position: the same draws, and the fork's draws did not advance the parent's stream
    assert fork_draws == parent_draws
    assert len(set(parent_draws)) == 5  # the stream really moves (so the equality means something)
    fresh = Dice(max_turns=50)
    fresh.reset(seed=3)
    fresh.step(ROLL)
    assert [fresh.step(ROLL)[0][0].content for _ in range(5)] == parent_draws


def test_rng_of_the_fork_is_independent_after_the_fork():
    env = Dice(max_turns=50)
    env.reset(seed=4)
    child = env.fork()
    child.np_random.integers(10, size=3)  # the fork draws extra numbers
    child.py_rng.random()
    a = env.step(ROLL)[0][0].content
    ref = Dice(max_turns=50)
    ref.reset(seed=4)
    assert a == ref.step(ROLL)[0][0].content
    assert child.step(ROLL)[0][0].content != a


# ------------------------------------------------------------------------------------- errors
class Plain(Env):
    @tool
    def noop(self) -> str:
        """Nothing."""
        return "ok"

    def _reset(self, rng, options):
        return Task([Message(role="user", content="hi")], task_id="plain")


def test_non_forkable_env_raises_not_forkable_naming_the_class_and_why():
    env = Plain()
    env.reset(seed=0)
    assert env.forkable is False
    with pytest.raises(NotForkable, match=r"Plain cannot fork: .*forkable is False"):
        env.fork()
    with pytest.raises(NotForkable):
        asyncio.run(env.afork())
    assert issubclass(NotForkable, ForkError) and issubclass(ForkError, RuntimeError)
    assert turngym.NotForkable is NotForkable and turngym.ForkError is ForkError


def test_not_forkable_message_names_the_registered_id():
    turngym.register("fork-plain-v0", Plain, override=True)
    try:
        env = turngym.make("fork-plain")
        with pytest.raises(NotForkable, match=r"fork-plain-v0 \(Plain\) cannot fork"):
            env.fork()
    finally:
        turngym.registry.unregister("fork-plain-v0")


def test_fork_of_a_closed_or_never_reset_env_raises():
    env = ArithEnv()
    with pytest.raises(ForkError, match="never reset"):
        env.fork()
    env.reset(seed=0)
    env.close()
    with pytest.raises(ForkError, match="closed"):
        env.fork()


class Slow(Env):
    """A tool (and a reset) that wait on an event, so a test can fork in the middle."""

    forkable = True
    _fork_shared = ("gate",)

    def __init__(self, **kw):
        super().__init__(**kw)
        self.gate = asyncio.Event()
        self.hold_reset = False

    @tool
    async def wait(self) -> str:
        """Wait for the gate."""
        await self.gate.wait()
        return "done"

    async def _reset(self, rng, options):
        if self.hold_reset:
            await self.gate.wait()
        return Task([Message(role="user", content="wait")], task_id="slow")


def test_fork_during_a_step_or_reset_raises_and_works_after():
    async def main():
        env = Slow(max_turns=5)
        await env.areset(seed=0)
        step = asyncio.create_task(env.astep('<tool_call>{"name": "wait", "arguments": {}}</tool_call>'))
        await asyncio.sleep(0.01)
        with pytest.raises(ForkError, match="middle of a step"):
            await env.afork()
        with pytest.raises(ForkError, match="middle of a step"):
            env.fork()
        env.gate.set()
        obs, *_ = await step
        assert obs[0].content == "done"
        child = await env.afork()
        assert child.turn == 1 and child.gate is env.gate

        env.gate.clear()
        env.hold_reset = True
        reset = asyncio.create_task(env.areset(seed=1))
        await asyncio.sleep(0.01)
        with pytest.raises(ForkError, match="middle of a reset"):
            await env.afork()
        env.gate.set()
        await reset
        assert (await env.afork()).turn == 0

    asyncio.run(main())


def test_a_failed_step_does_not_leave_the_env_busy():
    class Boom(ArithEnv):
        def _observe(self, results):
            raise ValueError("boom")

    env = Boom()
    env.reset(seed=0)
    with pytest.raises(ValueError):
        env.step("x")
    env.fork()  # not "in the middle of a step"


def test_fork_shared_must_name_existing_attributes():
    class Bad(ArithEnv):
        _fork_shared = ("no_such_member",)

    env = Bad()
    env.reset(seed=0)
    with pytest.raises(AttributeError, match="no_such_member"):
        env.fork()


def test_non_forkable_families_say_why():
    from turngym.envs.mcp.env import McpEnv

    # (the browser families fork by replay: tests/envs/web/test_fork_browser.py, tests/envs/sites/test_fork_sites.py)
    for cls, why in [
        (McpEnv, "MCP servers"),  # its tools' state lives in other processes
    ]:
        assert cls.forkable is False
        env = cls.__new__(cls)  # no container or browser needed: the check comes first
        with pytest.raises(NotForkable, match=why):
            env.fork()


def test_ray_env_proxy_is_not_forkable():
    from turngym.rollout.ray_envs import RayEnv

    pool = types.SimpleNamespace(_keys=itertools.count(), __name__="search-qa")
    env = RayEnv(pool, {})
    assert env.forkable is False
    with pytest.raises(NotForkable, match="Ray actor"):
        env.fork()
    with pytest.raises(NotForkable, match="Ray actor"):
        asyncio.run(env.afork())


# ------------------------------------------------------------------------------------ wrappers
def test_wrappers_fork_the_whole_stack_and_copy_their_state(tmp_path):
    inner = ArithEnv(depth=3, max_turns=10)
    env = TurnLimit(RecordRewardComponents(RecordTrajectory(inner, path=tmp_path / "t.jsonl")), max_turns=6)
    env.reset(seed=2)
    env.step("no call")
    env.step(inner.expert_action())
    assert env.forkable
    child = env.fork()

    layers, fork_layers = [], []
    e, f = env, child
    while isinstance(e, gymnasium.Wrapper):
        assert type(f) is type(e) and f is not e
        layers.append(e)
        fork_layers.append(f)
        e, f = e.env, f.env
    assert e is inner and isinstance(f, ArithEnv) and f is not inner
    assert child.cap == 6 and child.max_turns == 6
    counts, fork_counts = layers[1], fork_layers[1]
    assert fork_counts.episode_turns == 2 and fork_counts.totals == counts.totals
    assert fork_counts.totals is not counts.totals
    rec, fork_rec = layers[2], fork_layers[2]
    assert fork_rec.trajectory == rec.trajectory and fork_rec.trajectory is not rec.trajectory

    # the fork finishes its episode: its counters include the shared prefix; the parent's do not move
    while True:
        *_, term, trunc, info = child.step("no call")
        if term or trunc:
            break
    assert info["episode"]["l"] == 6
    assert counts.episode_turns == 2 and len(rec.trajectory.turns) == 2 and not rec.finished
    assert len(fork_rec.finished) == 1 and len(fork_rec.finished[0].turns) == 6
    # the parent's own episode goes on under its own limit
    *_, term, trunc, info = env.step(inner.expert_action())
    assert info["turn"] == 3 and counts.episode_turns == 3


def test_afork_env_and_fork_env_through_a_gymnasium_wrapper():
    class Counter(gymnasium.Wrapper):
        def __init__(self, env):
            super().__init__(env)
            self.steps = [0]

        def step(self, action):
            self.steps[0] += 1
            return self.env.step(action)

    env = Counter(RecordRewardComponents(ArithEnv()))
    env.reset(seed=0)
    env.step("x")
    child = fork_env(env)
    assert isinstance(child, Counter) and child.steps == [1] and child.steps is not env.steps
    assert child.env.env is not env.env.env
    child.step("x")
    assert env.steps == [1] and child.steps == [2]
    achild = asyncio.run(afork_env(RecordRewardComponents(env.env.env)))
    assert isinstance(achild, RecordRewardComponents) and achild.env.turn == 1
    with pytest.raises(NotForkable, match="no fork"):
        fork_env(object())


def test_wrapper_of_a_non_forkable_env_is_not_forkable():
    env = RecordRewardComponents(Plain())
    env.reset(seed=0)
    assert env.forkable is False
    with pytest.raises(NotForkable, match="Plain"):
        env.fork()


def test_numpy_state_in_a_family_is_copied():
    class Arr(ArithEnv):
        def _reset(self, rng, options):
            self.buf = np.zeros(3)
            return super()._reset(rng, options)

    env = Arr()
    env.reset(seed=0)
    child = env.fork()
    child.buf[0] = 7
    assert env.buf[0] == 0


def test_after_fork_opens_the_forks_own_resources_sync_and_async():
    opened: list[str] = []

    class WithHandle(ArithEnv):
        _fork_shared = ("registry",)

        def __init__(self, **kw):
            super().__init__(**kw)
            self.registry = opened
            self.handle = "parent-handle"

        def _after_fork(self):
            self.handle = f"handle-{len(self.registry)}"
            self.registry.append(self.handle)

    class AsyncHandle(WithHandle):
        async def _after_fork(self):
            await asyncio.sleep(0)
            super()._after_fork()

    env = WithHandle()
    env.reset(seed=0)
    child = env.fork()
    assert (env.handle, child.handle, opened) == ("parent-handle", "handle-0", ["handle-0"])
    aenv = AsyncHandle()
    aenv.reset(seed=0)
    assert aenv.fork().handle == "handle-1"  # sync fork runs an async hook too
    assert asyncio.run(aenv.afork()).handle == "handle-2"
    assert aenv.handle == "parent-handle" and opened == ["handle-0", "handle-1", "handle-2"]
