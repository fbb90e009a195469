"""search-qa envs hosted in Ray actors (a local 2-CPU cluster), driven by the rollout engine."""

from __future__ import annotations

import time

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("bm25s")

from turngym.agents.scripted import ScriptedAgent  # noqa: E402
from turngym.rollout import RolloutConfig, RolloutEngine  # noqa: E402
from turngym.rollout.ray_envs import EnvActorLost, RayEnvPool  # noqa: E402

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def pool(cluster):
    p = RayEnvPool("search-qa", num_actors=2, num_cpus=0.5)
    p.wait_ready()
    yield p
    p.shutdown()


async def test_search_qa_in_actors_matches_local_envs(pool):
    cfg = RolloutConfig(group_size=2, max_concurrency=4)
    remote = await RolloutEngine(pool, ScriptedAgent(), cfg, env_id="search-qa").run(range(3))
    local = await RolloutEngine("search-qa", ScriptedAgent(), cfg).run(range(3))
    assert [t.masked for t in remote] == [False] * 6
    assert [(t.seed, t.sample, t.group) for t in remote] == [(t.seed, t.sample, t.group) for t in local]
    for r, loc in zip(remote, local, strict=True):
        assert r.prompt == loc.prompt and r.task_id == loc.task_id
        assert [(t.action, t.observation, t.reward) for t in r.turns] == [
            (t.action, t.observation, t.reward) for t in loc.turns
        ]
    assert all(t.total_reward == 1.0 for t in remote)  # the expert answers every task
    assert {a: ray.get(a.num_envs.remote()) for a in pool.actors} == dict.fromkeys(pool.actors, 0)


def _wait_until_dead(actor, timeout: float = 60.0) -> None:
    """``ray.kill`` returns before the actor is gone: a call sent right after it may still run. Wait
    until a call fails, so that the victim's next step is the first to see the dead actor."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ray.get(actor.pid.remote(), timeout=10)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.05)
    raise AssertionError("the killed actor still answers")


class _KillingAgent(ScriptedAgent):
    """The expert, except that on its second turn of seed ``victim`` it kills the env's actor."""

    def __init__(self, victim: int):
        self.victim = victim
        self.killed_pid: int | None = None

    def start(self, env, prompt, *, seed, route):
        session = super().start(env, prompt, seed=seed, route=route)
        if seed // 1000 == self.victim:
            act = session.act

            async def act_then_kill(turn=[0]):  # noqa: B006 - a counter local to this session
                step = await act()
                turn[0] += 1
                if turn[0] == 2:
                    self.killed_pid = ray.get(env.actor.pid.remote())
                    ray.kill(env.actor, no_restart=True)
                    _wait_until_dead(env.actor)
                return step

            session.act = act_then_kill
        return session


async def test_actor_killed_mid_episode_masks_and_the_run_continues(pool):
    agent = _KillingAgent(victim=1)
    cfg = RolloutConfig(group_size=1, max_concurrency=2, turn_timeout=60)
    engine = RolloutEngine(pool, agent, cfg, env_id="search-qa")
    before = pool.stats.replacements
    trajs = await engine.run(range(6))
    assert agent.killed_pid is not None
    victim = next(t for t in trajs if t.seed == 1)
    assert victim.masked and victim.mask_reason == "env_lost"
    assert "EnvActorLost" in victim.metadata["error"] and len(victim.turns) == 1  # lost on its 2nd step
    masked = [t for t in trajs if t.masked]
    assert {t.mask_reason for t in masked} == {"env_lost"}
    assert len(masked) <= 2  # at most the envs that lived on the killed actor (2 in flight)
    assert engine.stats.reconciles() and engine.stats.requested == 6
    assert engine.stats.completed == 6 - len(masked) and engine.stats.mask_reasons == {
        "env_lost": len(masked)
    }
    assert pool.stats.replacements == before + 1
    # the replacement actor is a new process and serves the next run
    pids = {ray.get(a.pid.remote()) for a in pool.actors}
    assert agent.killed_pid not in pids and len(pids) == 2
    again = await RolloutEngine(pool, ScriptedAgent(), cfg, env_id="search-qa").run(range(4))
    assert not any(t.masked for t in again)


async def test_calls_before_reset_and_after_close_are_clear_errors(pool):
    env = pool()
    with pytest.raises(RuntimeError, match="areset"):
        env.tool_instructions()
    with pytest.raises(RuntimeError, match="not open"):
        await env.astep("hi")
    obs, info = await env.areset(seed=0)
    assert obs and env.tools and "search" in {t.name for t in env.tools}
    await env.aclose()
    await env.aclose()  # idempotent
    with pytest.raises(RuntimeError):
        await env.astep("hi")
    assert issubclass(EnvActorLost, RuntimeError) and EnvActorLost.mask_reason == "env_lost"


async def test_max_turns_tightens_the_remote_env_limit(pool):
    capped = await RolloutEngine(pool, ScriptedAgent(), RolloutConfig(max_turns=1), env_id="search-qa").run(2)
    assert [(t.masked, t.truncated, t.terminated, t.num_turns) for t in capped] == [
        (False, True, False, 1)
    ] * 2
    # the env itself truncated, so it paid its missing-answer penalty
    assert all(t.turns[-1].reward_components.get("format", 0.0) < 0 for t in capped)
    env = pool()
    env.limit_turns(3)
    env.limit_turns(4)  # looser: no effect
    await env.areset(seed=0)
    assert env.max_turns == 3
    env.limit_turns(2)  # on an open env: applied at the next reset
    await env.areset(seed=1)
    assert env.max_turns == 2
    truncated = False
    for _ in range(2):
        *_, truncated, _ = await env.astep("no call")
    assert truncated
    await env.aclose()


def test_trainer_rolls_out_in_env_actors_from_the_cluster_section(cluster, tmp_path):
    from turngym.trainer.config import load_config
    from turngym.trainer.loop import Trainer
    from turngym.trainer.metrics import read_metrics

    cfg = load_config(
        None,
        [
            f"run_dir={tmp_path / 'run'}",
            "rollout.env=arith",
            "rollout.env_kwargs={depth: 1, max_turns: 2}",
            "rollout.tasks_per_step=2",
            "rollout.group_size=2",
            "rollout.max_tokens=8",
            "steps=1",
            "log.progress=false",
            "log.tensorboard=false",
            "cluster.env_actors=1",
            "cluster.env_actor_cpus=0.5",
        ],
    )
    trainer = Trainer(cfg)
    trainer.setup()
    trajs, stats = trainer.orchestrator.rollout([0, 1], 2, 1.0)
    pool = trainer.orchestrator.env_pool
    assert pool is not None and pool.stats.opened == 4 and len(pool.actors) == 1
    assert stats["requested"] == 4 and stats["masked"] == 0 and all(t.env_id == "arith" for t in trajs)
    trainer.train()
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1]
    assert trainer.orchestrator.env_pool is None  # the actors went with the run
