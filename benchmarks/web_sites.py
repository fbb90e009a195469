"""Benchmark of the multi-page web sites (web-shop, web-arena-lite): site start, reset, step latency,
concurrency, memory, and expert vs random-agent scores.

    python benchmarks/web_sites.py [--episodes 16] [--concurrency 1,2,4,8]

Baselines measured in the same run: a plain HTTP GET of the same pages (what the site itself
costs) and a bare playwright ``page.goto`` + DOM snapshot (what the browser costs) against an env
step (tool call + observation). CPU times are printed beside wall times because the machine may
be shared. Targets (issue 11): site reset well under a second; expert >= 0.9 mean reward on
web-shop and >= 90% success on the arena tasks.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def ms(x: float) -> str:
    return f"{x * 1000:.1f} ms"


def pss_bytes(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0


def random_action(env, rng: np.random.Generator) -> str:
    """A random agent over the same tools: click / fill a random element, go back, or stop."""
    from turngym.envs.web.expert import call

    nodes = [n for n in env.snap.nodes if n.id is not None]
    clickable = [n for n in nodes if n.role in ("link", "button", "radio", "checkbox")]
    boxes = [n for n in nodes if n.role == "textbox"]
    u = rng.random()
    if "stop" in env.toolbox.names and u < 0.08:
        words = env.instruction.split()
        return call("stop", answer=words[int(rng.integers(len(words)))])
    if boxes and u < 0.3:
        words = env.instruction.split()
        text = " ".join(words[int(i)] for i in rng.integers(0, len(words), size=3))
        return (
            call("fill", bid=boxes[int(rng.integers(len(boxes)))].id, value=text)
            + "\n"
            + call("press", bid=boxes[0].id, key_comb="Enter")
        )
    if u < 0.38:
        return call("go_back")
    if clickable:
        return call("click", bid=clickable[int(rng.integers(len(clickable)))].id)
    return call("go_back")


async def run_episode(env, policy: str, options: dict, rng: np.random.Generator, steps: list[float]) -> float:
    await env.areset(seed=0, options=options)
    total = 0.0
    while True:
        action = env.expert_action() if policy == "expert" else random_action(env, rng)
        if action is None:
            action = '<tool_call>{"name": "noop", "arguments": {"wait_ms": 0}}</tool_call>'
        t0 = time.perf_counter()
        _, r, term, trunc, _ = await env.astep(action)
        steps.append(time.perf_counter() - t0)
        total += r
        if term or trunc:
            return total


def bench_sites(n: int) -> None:
    import httpx

    from turngym.envs.browser.sites.server import LocalServer
    from turngym.envs.webarena.sites import SiteInstance
    from turngym.envs.webshop.app import ShopApp
    from turngym.envs.webshop.catalog import Catalog, build_catalog

    t0 = time.perf_counter()
    cat = Catalog(build_catalog())
    print(
        f"catalog: {len(cat)} products, open/build {time.perf_counter() - t0:.2f} s (cached after the first build)"
    )
    starts = {"shop": [], "forum": [], "tracker": []}
    resets = {"forum": [], "tracker": []}
    gets = []
    for _ in range(n):
        s = LocalServer(ShopApp(cat), name="shop").start()
        starts["shop"].append(s.start_s)
        with httpx.Client(base_url=s.url) as c:
            c.get("/")
            for q in ("long sleeve t-shirt navy", "organic green tea", "ergonomic office chair"):
                t0 = time.perf_counter()
                c.get("/search", params={"q": q})
                gets.append(time.perf_counter() - t0)
        s.stop()
    base = pss_bytes()
    instances = []
    for _ in range(n):
        for site in ("forum", "tracker"):
            inst = SiteInstance(site)
            starts[site].append(inst.start_s)
            instances.append(inst)
    mem_per_site = (pss_bytes() - base) / len(instances)
    for inst in instances:
        for _ in range(10):
            resets[inst.spec.name].append(inst.reset())
        with httpx.Client(base_url=inst.url) as c:
            t0 = time.perf_counter()
            c.get("/f/books" if inst.spec.name == "forum" else "/payments-api/-/issues")
            gets.append(time.perf_counter() - t0)
    for inst in instances:
        inst.close()
    for k, v in starts.items():
        print(
            f"site start {k:8s}: p50 {ms(pct(v, 50))}  max {ms(max(v))}  (n={len(v)}; server thread + db copy)"
        )
    for k, v in resets.items():
        print(f"site reset {k:8s}: p50 {ms(pct(v, 50))}  p99 {ms(pct(v, 99))}  (restore the SQLite file)")
    print(
        f"memory per site instance (forum/tracker, in-process server thread): {mem_per_site / 1e6:.2f} MB PSS"
    )
    print(f"baseline HTTP GET of a page: p50 {ms(pct(gets, 50))}  p99 {ms(pct(gets, 99))}")


async def bench_browser_baseline(urls: list[str]) -> list[float]:
    from turngym.envs.web import page as wp
    from turngym.sandboxes.browser import BrowserPool

    out = []
    async with BrowserPool(size=1) as pool:
        lease = await pool.lease((1280, 720))
        for _ in range(3):
            for u in urls:
                t0 = time.perf_counter()
                await lease.run(lambda p, u=u: p.goto(u, wait_until="domcontentloaded"))
                await lease.run(wp.snapshot)
                out.append(time.perf_counter() - t0)
        await lease.close()
    return out


async def bench_envs(episodes: int) -> None:
    import turngym

    results = {}
    for env_id, kwargs, opt_key, ids in (
        ("web-shop-v0", {"split": "test"}, "goal_index", list(range(episodes))),
        ("web-arena-lite-v0", {"per_template": 2}, "task_id", None),
    ):
        env = turngym.make(env_id, **kwargs)
        if ids is None:
            ids = [t["task_id"] for t in env.tasks][:: max(1, len(env.tasks) // episodes)][:episodes]
        for policy in ("expert", "random"):
            rng = np.random.default_rng(0)
            steps: list[float] = []
            rewards = []
            resets = []
            c0 = time.process_time()
            for i in ids:
                t0 = time.perf_counter()
                rewards.append(await run_episode(env, policy, {opt_key: i}, rng, steps))
                resets.append(time.perf_counter() - t0 - sum(steps[-1:]))
            cpu = time.process_time() - c0
            results[(env_id, policy)] = (rewards, steps)
            succ = sum(r >= 1.0 for r in rewards) / len(rewards)
            print(
                f"{env_id:18s} {policy:6s}: mean reward {statistics.mean(rewards):.3f}  success {succ:.0%}  "
                f"episodes {len(rewards)}  steps {len(steps)}  step p50 {ms(pct(steps, 50))}  p99 {ms(pct(steps, 99))}"
                f"  (python CPU {cpu:.1f} s)"
            )
        t_reset = []
        for i in ids[:5]:
            t0 = time.perf_counter()
            await env.areset(seed=0, options={opt_key: i})
            t_reset.append(time.perf_counter() - t0)
        print(
            f"{env_id:18s} env reset (site reset + new browser context + first page): p50 {ms(pct(t_reset, 50))}"
        )
        await env.aclose()
    return results


async def bench_concurrency(levels: list[int], per_worker: int) -> None:
    import turngym
    from turngym.sandboxes.browser import BrowserPool

    print(f"concurrency (web-arena-lite, expert, {per_worker} episodes per env, one shared browser):")
    base = None
    for k in levels:
        envs = [turngym.make("web-arena-lite-v0", per_template=2) for _ in range(k)]
        steps: list[float] = []
        t0 = time.perf_counter()
        tasks = [
            run_episode(
                env,
                "expert",
                {"task_id": (j * per_worker + e) % len(env.tasks)},
                np.random.default_rng(j),
                steps,
            )
            for j, env in enumerate(envs)
            for e in range(1)
        ]
        await asyncio.gather(*tasks)
        for e in range(1, per_worker):
            await asyncio.gather(
                *[
                    run_episode(
                        env,
                        "expert",
                        {"task_id": (j * per_worker + e) % len(env.tasks)},
                        np.random.default_rng(j),
                        steps,
                    )
                    for j, env in enumerate(envs)
                ]
            )
        wall = time.perf_counter() - t0
        pool = BrowserPool.shared()
        rate = len(steps) / wall
        base = base or rate
        print(
            f"  {k:2d} concurrent episodes: {rate:6.1f} steps/s ({rate / base:.2f}x of 1)  step p50 {ms(pct(steps, 50))}"
            f"  p99 {ms(pct(steps, 99))}  browser PSS {pool.memory_bytes() / 1e6:.0f} MB"
        )
        for env in envs:
            await env.aclose()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--per-worker", type=int, default=2)
    ap.add_argument("--site-repeats", type=int, default=5)
    args = ap.parse_args()
    print(
        f"machine: {os.cpu_count()} CPUs (shared); Chromium {os.environ.get('TURNGYM_CHROMIUM', '/usr/bin/chromium')}"
    )
    bench_sites(args.site_repeats)

    from turngym.envs.webarena.sites import SiteInstance

    forum = SiteInstance("forum")
    try:
        browser = asyncio.run(
            bench_browser_baseline([forum.url + "/f/books", forum.url + "/f/books/3", forum.url + "/"])
        )
    finally:
        forum.close()
    print(
        f"baseline bare playwright goto + DOM snapshot: p50 {ms(pct(browser, 50))}  p99 {ms(pct(browser, 99))}"
    )
    asyncio.run(bench_envs(args.episodes))
    asyncio.run(bench_concurrency([int(x) for x in args.concurrency.split(",")], args.per_worker))
    print(json.dumps({"done": True}))


if __name__ == "__main__":
    main()
