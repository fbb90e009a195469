"""Rollout throughput with envs in 1, 2, 4 Ray actors, against envs in the engine's own process.

    python benchmarks/scale.py [--actors 1 2 4] [--tasks 16] [--group 4] [--cpu-ms 0 25] [--cpus N]

The scripted expert plays ``search-qa`` (no model: the env side is what is measured), through
the rollout engine with ``--concurrency`` live trajectories. ``--cpu-ms X`` adds X ms of pure-Python
CPU work to every env step (``reset`` and ``step``), standing in for CPU-bound envs (test suites,
page rendering): with X = 0 the numbers show the Ray round-trip overhead, with X > 0 whether
actors run env work in parallel. The baseline (``local``) runs the same envs in the engine's
event loop, where CPU work serialises. Each configuration runs after a warm-up run that starts
the actors and reports the best of ``--repeat`` runs; the Ray cluster gets ``--cpus`` CPUs (default: the machine's).
Ratios are throughput over the 1-actor run and over the local baseline, measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time


def busy_env(cpu_ms: float = 0.0, **kwargs):
    """search-qa whose reset and step also burn ``cpu_ms`` of CPU (picklable: runs in actors)."""
    import turngym

    env = turngym.make("search-qa", **kwargs)
    if cpu_ms <= 0:
        return env

    def burn() -> None:
        end = time.process_time() + cpu_ms / 1000
        while time.process_time() < end:
            pass

    areset, astep = env.areset, env.astep

    async def reset(**kw):
        burn()
        return await areset(**kw)

    async def step(action):
        burn()
        return await astep(action)

    env.areset, env.astep = reset, step
    return env


async def _run(env, args, kwargs) -> tuple[float, int, int, dict]:
    from turngym.agents.scripted import ScriptedAgent
    from turngym.rollout import RolloutConfig, RolloutEngine

    cfg = RolloutConfig(group_size=args.group, max_concurrency=args.concurrency)
    engine = RolloutEngine(env, ScriptedAgent(), cfg, env_kwargs=kwargs, env_id="search-qa")
    t0 = time.perf_counter()
    trajs = await engine.run(range(args.tasks))
    wall = time.perf_counter() - t0
    assert engine.stats.reconciles()
    return wall, len(trajs), sum(t.num_turns for t in trajs), engine.stats.as_dict()


def _best(env, args, kwargs) -> tuple[float, int, int, dict]:
    return min((asyncio.run(_run(env, args, kwargs)) for _ in range(args.repeat)), key=lambda r: r[0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--tasks", type=int, default=16)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--cpu-ms", type=float, nargs="+", default=[0.0, 25.0])
    p.add_argument("--cpus", type=int, default=os.cpu_count())
    p.add_argument("--repeat", type=int, default=2, help="best of N runs (the machine may be shared)")
    args = p.parse_args()

    import ray

    from turngym.rollout.ray_envs import RayEnvPool

    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    print(f"cpus={args.cpus} tasks={args.tasks} group={args.group} concurrency={args.concurrency}")
    print(f"{'cpu_ms':>6} {'envs':>9} {'traj/s':>8} {'steps/s':>8} {'vs local':>9} {'vs 1 actor':>10} masked")
    for cpu_ms in args.cpu_ms:
        kwargs = {"cpu_ms": cpu_ms}
        asyncio.run(_run(busy_env, args, kwargs))  # warm-up: imports, corpus, index
        wall, n, steps, stats = _best(busy_env, args, kwargs)
        local = n / wall
        print(
            f"{cpu_ms:>6.0f} {'local':>9} {local:>8.2f} {steps / wall:>8.1f} {1.0:>9.2f} {'':>10} {stats['masked']}"
        )
        one = None
        for k in args.actors:
            pool = RayEnvPool(busy_env, k, num_cpus=min(1.0, args.cpus / k))
            pool.wait_ready()
            asyncio.run(_run(pool, args, kwargs))  # warm-up inside the actors
            wall, n, steps, stats = _best(pool, args, kwargs)
            pool.shutdown()
            tput = n / wall
            one = one or tput
            print(
                f"{cpu_ms:>6.0f} {f'{k} actors':>9} {tput:>8.2f} {steps / wall:>8.1f} {tput / local:>9.2f} "
                f"{tput / one:>10.2f} {stats['masked']}"
            )
    ray.shutdown()


if __name__ == "__main__":
    main()
