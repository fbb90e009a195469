"""Nothing an env does may stall the rollout engine's event loop for the other trajectories.

* search-qa's filtered task list is computed once per process and shared: it used to be rebuilt for
  every env (one per trajectory), which was most of the driver's CPU time in the 32-trajectory load
  benchmark (benchmarks/reliability_load.py) — on the event loop then, and under the GIL still now that
  the engine builds envs in worker threads.
* A *sync* env hook that blocks forever (a deadlocked client, a hung C call) must still end as a masked
  trajectory while the other trajectories complete and the run finishes, when it runs on a worker
  thread (the engine's timeouts can abandon it): ``_reset`` and ``_close`` by default, per-step hooks
  (``_turn_reward``, ...) when the env lists them in ``Env.sync_hooks_in_thread``. A per-step sync hook
  left on the loop (the default: a thread hop per step costs more than a cheap hook) that never returns
  stalls the whole run — see docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

import turngym
from turngym.agents.scripted import ScriptedAgent
from turngym.envs.search.env import SearchQAEnv
from turngym.rollout.engine import RolloutConfig, RolloutEngine

pytestmark = pytest.mark.reliability


def test_search_envs_share_one_task_selection():
    a, b = turngym.make("search-qa-v0"), turngym.make("search-qa-v0")
    assert a.tasks is b.tasks and a._task_index is b._task_index
    with pytest.raises((TypeError, AttributeError)):
        a.tasks.append(a.tasks[0])  # shared, so read-only
    test = turngym.make("search-qa-v0", split="test", hops=[2])
    assert test.tasks is not a.tasks and test.tasks
    assert all(t.split == "test" and t.hops == 2 for t in test.tasks)
    assert test.tasks is turngym.make("search-qa-v0", split="test", hops=(2,)).tasks
    # a caller's own list is filtered afresh for each env: a change between envs is seen
    own = list(a.tasks[:5])
    first = SearchQAEnv(corpus=a.corpus, tasks=own)
    own.pop()
    second = SearchQAEnv(corpus=a.corpus, tasks=own)
    assert len(first.tasks) == 5 and len(second.tasks) == 4
    assert second._task_index == {t.id: i for i, t in enumerate(own)}


class BlockingHookEnv(SearchQAEnv):
    """search-qa whose sync ``hook`` blocks (until ``release`` is set) on the episodes of ``stuck``."""

    def __init__(self, hook: str, stuck: set[int], release: threading.Event, **kwargs):
        super().__init__(**kwargs)
        self.hook, self.stuck, self.release = hook, stuck, release
        chosen = self.sync_hooks_in_thread
        if chosen is not True and hook not in (chosen or ()):  # a per-step hook: the env opts in
            self.sync_hooks_in_thread = (*(chosen or ()), hook)

    def _block(self, hook: str) -> None:
        if hook == self.hook and self.np_random_seed in self.stuck:  # the seed areset was given
            self.release.wait()

    def _reset(self, rng, options):
        self._block("_reset")
        return super()._reset(rng, options)

    def _turn_reward(self, results, done):
        self._block("_turn_reward")
        return super()._turn_reward(results, done)


@pytest.mark.parametrize("hook", ["_reset", "_turn_reward"])
def test_a_sync_hook_blocking_forever_ends_masked(hook):
    """``_reset`` with the default hook choice; ``_turn_reward`` opted in to a worker thread."""
    release, finished = threading.Event(), threading.Event()
    seeds, stuck = list(range(6)), {2}

    def factory():
        return BlockingHookEnv(hook, stuck, release)

    turngym.make("search-qa-v0").close()  # data and index loaded (and cached) before the clock runs
    cfg = RolloutConfig(max_concurrency=len(seeds), turn_timeout=None, trajectory_timeout=10.0)
    engine = RolloutEngine(factory, ScriptedAgent(), cfg, env_id="search-qa+blocking-hook")
    box: dict = {}

    async def drive() -> None:
        box["trajs"] = await engine.run(seeds)
        finished.set()  # before asyncio.run's exit, which waits for the still-blocked worker thread

    runner = threading.Thread(target=asyncio.run, args=(drive(),), daemon=True)
    runner.start()
    # A liveness bound, not a timing assertion: with the loop blocked the run can never finish here.
    finished_while_blocked = finished.wait(120)
    release.set()  # unblock the hook whatever happened, so no thread is left behind
    runner.join(60)
    assert finished_while_blocked, (
        f"a sync {hook} that never returns stalled the whole run (event loop blocked)"
    )
    trajs = box["trajs"]
    assert engine.stats.reconciles() and len(trajs) == len(seeds)
    for t in trajs:
        if t.seed in stuck:
            assert t.masked and t.mask_reason == "trajectory_timeout", (t.mask_reason, t.metadata)
        else:
            assert not t.masked and t.terminated, (t.seed, t.mask_reason, t.metadata)
