"""swe-docker benchmarks: image builds, container start, exec, reset (cold vs pool-warm), throughput.

Every number comes with a baseline measured in the same run:
  * exec: ``DockerSandbox.exec`` vs the ``docker exec`` CLI vs the SDK's ``exec_run``;
  * start: ``DockerSandbox.create`` (cold) and a pool hand-out (warm) vs ``docker run`` (CLI);
  * reset: ``env.reset`` with a cold container vs from a warm pool;
  * throughput: scripted-expert episodes with 8 concurrent envs vs 1.

Usage: python benchmarks/swe_docker.py [--n 30] [--episodes 16] [--rebuild-base]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import time

from turngym.envs.swe.tasks import load_instances
from turngym.sandboxes.docker import DockerSandbox, docker_client
from turngym.sandboxes.images import BaseRecipe, build_base_image, build_layer
from turngym.sandboxes.limits import Limits
from turngym.sandboxes.pool import SandboxPool


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(int(round(q * (len(xs) - 1))), len(xs) - 1)]


def timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def row(name: str, xs: list[float], base: list[float] | None = None) -> None:
    p50, p99 = pct(xs, 0.5) * 1e3, pct(xs, 0.99) * 1e3
    ratio = f"  ({statistics.median(base) / statistics.median(xs):.1f}x faster than baseline)" if base else ""
    print(f"  {name:<44} p50 {p50:8.1f} ms   p99 {p99:8.1f} ms{ratio}")


def bench_builds(rebuild_base: bool) -> str:
    print("image builds")
    t0 = time.perf_counter()
    rep = build_base_image(BaseRecipe(), force=rebuild_base)
    print(
        f"  base image {rep.tag}: {'cached lookup' if rep.cached else 'built'} in {time.perf_counter() - t0:.1f}s"
    )
    stamp = str(time.time())
    t0 = time.perf_counter()
    layer = build_layer(rep.tag, "turngym-bench", files={"/opt/stamp": stamp}, commands=["true"])
    print(f"  small layer (new content): {time.perf_counter() - t0:.2f}s")
    t0 = time.perf_counter()
    build_layer(rep.tag, "turngym-bench", files={"/opt/stamp": stamp}, commands=["true"])
    print(f"  same layer again (cache hit): {(time.perf_counter() - t0) * 1e3:.0f} ms")
    docker_client().images.remove(layer.tag, force=True)
    return rep.tag


def bench_exec(image: str, n: int) -> None:
    print(f"exec latency of `true` (n={n})")
    with DockerSandbox.create(image, run_id="bench") as sb:
        sb.exec("true")
        cli = timed(lambda: subprocess.run(["docker", "exec", sb.id, "true"], check=True), n)
        sdk = timed(lambda: sb.container.exec_run(["true"]), n)
        ours = timed(lambda: sb.exec("true"), n)
        row("docker exec CLI (baseline)", cli)
        row("docker SDK exec_run", sdk, cli)
        row("DockerSandbox.exec (PID-1 server, kills session)", ours, cli)


def bench_start(image: str, n: int) -> None:
    print(f"container start (n={n})")
    cli = timed(
        lambda: subprocess.run(
            ["docker", "run", "--rm", "--network", "none", image, "true"], check=True, capture_output=True
        ),
        max(n // 3, 3),
    )
    cold: list[float] = []
    for _ in range(n):
        t0 = time.perf_counter()
        sb = DockerSandbox.create(image, run_id="bench")
        cold.append(time.perf_counter() - t0)
        sb.close()
    row("docker run --rm (CLI, baseline)", cli)
    row("DockerSandbox.create (cold)", cold, cli)
    with SandboxPool(image, warm=2, max_active=4, run_id="bench", limits=Limits()) as pool:
        warm: list[float] = []
        for _ in range(n):
            pool.wait_warm(60)
            t0 = time.perf_counter()
            sb = pool.acquire()
            warm.append(time.perf_counter() - t0)
            pool.release(sb)
        row("pool hand-out (warm, liveness-checked)", warm, cli)


def bench_reset(n: int) -> None:
    from turngym.envs.swe.env import SweDockerEnv

    tasks = load_instances()
    print(f"env.reset (n={n}): container + repository upload + git commit")
    cold_env = SweDockerEnv(tasks, pool_warm=0, max_active=2)
    warm_env = SweDockerEnv(tasks, pool_warm=2, max_active=4)
    try:
        cold_env.reset(seed=0)
        warm_env.reset(seed=0)
        cold, warm = [], []
        for i in range(n):
            t0 = time.perf_counter()
            cold_env.reset(seed=i)
            cold.append(time.perf_counter() - t0)
            warm_env._pool.wait_warm(60)
            t0 = time.perf_counter()
            warm_env.reset(seed=i)
            warm.append(time.perf_counter() - t0)
        row("reset, cold container (baseline)", cold)
        row("reset, pool-warm container", warm, cold)
    finally:
        cold_env.close()
        warm_env.close()


async def _episodes(tasks: list, concurrency: int) -> float:
    from turngym.envs.swe.env import SweDockerEnv
    from turngym.envs.swe.validate import expert_episode

    queue = list(tasks)
    rewards: list[float] = []

    async def worker() -> None:
        env = SweDockerEnv(tasks, pool_warm=1, max_active=concurrency + 2)
        try:
            while queue:
                task = queue.pop()
                reward, _ = await expert_episode(env, task.instance_id)
                rewards.append(reward)
        finally:
            await env.aclose()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t0
    assert all(r == 1.0 for r in rewards), rewards
    return elapsed


def bench_throughput(episodes: int) -> None:
    tasks = load_instances()[:episodes]
    print(f"throughput: {len(tasks)} scripted-expert episodes (reset, edit, submit, grade)")
    one = asyncio.run(_episodes(tasks, 1))
    eight = asyncio.run(_episodes(tasks, 8))
    print(f"  1 env at a time (baseline): {len(tasks) / one * 60:6.1f} episodes/min ({one:.1f}s)")
    print(
        f"  8 concurrent envs:          {len(tasks) / eight * 60:6.1f} episodes/min ({eight:.1f}s)  ({one / eight:.2f}x)"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--rebuild-base", action="store_true", help="time a fresh debootstrap build of the base")
    ap.add_argument(
        "--skip", nargs="*", default=[], choices=["builds", "exec", "start", "reset", "throughput"]
    )
    args = ap.parse_args()
    image = bench_builds(args.rebuild_base) if "builds" not in args.skip else BaseRecipe().tag
    if "exec" not in args.skip:
        bench_exec(image, args.n)
    if "start" not in args.skip:
        bench_start(image, max(args.n // 2, 5))
    if "reset" not in args.skip:
        bench_reset(max(args.n // 3, 5))
    if "throughput" not in args.skip:
        bench_throughput(args.episodes)


if __name__ == "__main__":
    main()
