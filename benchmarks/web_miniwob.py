"""Browser envs on this machine: launch, reset, step and screenshot latency, pool throughput, memory.

    python benchmarks/web_miniwob.py --episodes 20 --steps 30 --concurrency 4

Measures, on the Debian Chromium through playwright:
  * browser launch (Chromium process start) and the first lease (driver + launch + context);
  * reset latency (fresh context, task page load, seeded start, first observation) of web-miniwob,
    back to back and after 0.5 s of agent time (when the pool's spare context is ready);
  * step latency p50/p99 of web-miniwob (DOM observation; a noop step is the observation's own
    cost, a hover adds playwright's actionability checks) and gui-miniwob (screenshot observation);
  * a bare screenshot of the 160x210 task area against a full 1280x720 viewport;
  * expert episodes per second with 1 context (baseline, same run) and with N concurrent contexts;
  * memory (PSS) per open context: browser tree with N pages open minus the idle browser, over N.
Targets (issue 6): DOM step p50 <= 50 ms, pixel step p50 <= 150 ms, reset <= 300 ms, <= 150 MiB/context.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

from turngym.envs.gui.env import GuiMiniWoBEnv
from turngym.envs.web import page as wp
from turngym.envs.web.env import WebMiniWoBEnv
from turngym.sandboxes.browser import BrowserPool

TASKS = ["click-button", "enter-text", "click-checkboxes", "login-user", "click-tab", "simple-arithmetic"]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def ms(xs: list[float]) -> str:
    return f"p50 {1000 * statistics.median(xs):7.1f} ms   p99 {1000 * pct(xs, 99):7.1f} ms   (n={len(xs)})"


async def timed(coro) -> float:
    t0 = time.perf_counter()
    await coro
    return time.perf_counter() - t0


async def bench_launch(runs: int) -> None:
    firsts, launches = [], []
    for _ in range(runs):
        pool = BrowserPool(size=1, prewarm=False)
        t0 = time.perf_counter()
        lease = await pool.lease()
        firsts.append(time.perf_counter() - t0)
        launches += pool.stats.launch_s
        await lease.close()
        await pool.aclose()
    print(f"browser launch (chromium start)      {ms(launches)}")
    print(f"first lease (driver+launch+context)  {ms(firsts)}")


async def bench_reset_and_steps(pool: BrowserPool, episodes: int, steps: int) -> None:
    web = WebMiniWoBEnv(TASKS, pool=pool, max_turns=steps + 1)
    gui = GuiMiniWoBEnv(TASKS, pool=pool, max_turns=steps + 1)
    resets, dom_steps, pix_steps, noop_steps = [], [], [], []
    try:
        for ep in range(episodes):
            resets.append(await timed(web.areset(seed=ep)))
            await gui.areset(seed=ep)
            target = [n for n in web.snap.nodes if n.id is not None][-1]
            hover = f'<tool_call>{{"name": "hover", "arguments": {{"bid": {target.id}}}}}</tool_call>'
            move = '<tool_call>{"name": "move_to", "arguments": {"x": 150, "y": 200}}</tool_call>'
            noop = '<tool_call>{"name": "noop", "arguments": {"wait_ms": 0}}</tool_call>'
            for _ in range(max(1, steps // episodes)):
                noop_steps.append(await timed(web.astep(noop)))
                dom_steps.append(await timed(web.astep(hover)))
                pix_steps.append(await timed(gui.astep(move)))
    finally:
        await web.aclose()
        await gui.aclose()
    print(f"reset, back to back (web+gui)        {ms(resets)}")
    print(f"step, DOM observation, noop action   {ms(noop_steps)}")
    print(f"step, DOM observation, hover action  {ms(dom_steps)}   target p50 <= 50 ms")
    print(f"step, screenshot observation         {ms(pix_steps)}   target p50 <= 150 ms")


async def bench_reset_idle(pool: BrowserPool, episodes: int, gap_s: float) -> None:
    """Resets spaced by ``gap_s`` (an episode's worth of agent time), so the pool's spare context is ready."""
    env = WebMiniWoBEnv(TASKS, pool=pool)
    resets = []
    try:
        for ep in range(episodes):
            await asyncio.sleep(gap_s)
            resets.append(await timed(env.areset(seed=ep)))
    finally:
        await env.aclose()
    print(f"reset after {gap_s:g} s of agent time       {ms(resets)}   target p50 <= 300 ms")


async def bench_screenshots(pool: BrowserPool, n: int) -> None:
    async with await pool.lease((1280, 720)) as lease:
        await lease.run(
            wp.start_episode,
            WebMiniWoBEnv("click-button").html.joinpath("miniwob", "click-button.html").as_uri(),
            0,
        )
        task = [await timed(lease.run(wp.screenshot, (0, 0, *wp.TASK_AREA))) for _ in range(n)]
        full = [await timed(lease.run(wp.screenshot)) for _ in range(n)]
        snap = [await timed(lease.run(wp.snapshot)) for _ in range(n)]
    print(f"screenshot 160x210 task area         {ms(task)}")
    print(
        f"screenshot 1280x720 viewport         {ms(full)}   (baseline; ratio {statistics.median(full) / statistics.median(task):.1f}x)"
    )
    print(f"DOM snapshot (one evaluate)          {ms(snap)}")


async def expert_episode(pool: BrowserPool, seed: int) -> float:
    env = WebMiniWoBEnv(TASKS, pool=pool, max_turns=8)
    try:
        await env.areset(seed=seed)
        total, done = 0.0, False
        while not done:
            _, r, term, trunc, _ = await env.astep(env.expert_action() or "noop")
            total, done = total + r, term or trunc
        return total
    finally:
        await env.aclose()


async def bench_throughput(episodes: int, concurrency: int) -> None:
    rates = {}
    for conc in (1, concurrency):
        pool = BrowserPool(size=1, contexts_per_browser=conc)
        await expert_episode(pool, 10_000)  # warm: browser launched
        sem = asyncio.Semaphore(conc)

        async def one(seed: int, sem: asyncio.Semaphore = sem, pool: BrowserPool = pool) -> float:
            async with sem:
                return await expert_episode(pool, seed)

        t0 = time.perf_counter()
        rewards = await asyncio.gather(*(one(s) for s in range(episodes)))
        rates[conc] = episodes / (time.perf_counter() - t0)
        solved = sum(r > 0 for r in rewards)
        print(
            f"expert episodes/s, {conc} context(s)      {rates[conc]:6.2f} /s   ({solved}/{episodes} solved)"
        )
        await pool.aclose()
    print(
        f"throughput ratio {concurrency} contexts vs 1        {rates[concurrency] / rates[1]:6.2f}x  (on {os.cpu_count()} cores)"
    )


async def bench_memory(contexts: int) -> None:
    pool = BrowserPool(size=1, contexts_per_browser=contexts, prewarm=False)
    probe = await pool.lease()
    await probe.close()
    await asyncio.sleep(1.0)
    idle = pool.memory_bytes()
    envs = [WebMiniWoBEnv(TASKS, pool=pool) for _ in range(contexts)]
    for i, env in enumerate(envs):
        await env.areset(seed=i)
    await asyncio.sleep(1.0)
    loaded = pool.memory_bytes()
    for env in envs:
        await env.aclose()
    await pool.aclose()
    per = (loaded - idle) / contexts / 2**20
    print(f"memory: idle browser {idle / 2**20:.0f} MiB, with {contexts} task pages {loaded / 2**20:.0f} MiB")
    print(f"memory per context (PSS)             {per:6.1f} MiB   target <= 150 MiB")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=20)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--launches", type=int, default=3)
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    await bench_launch(args.launches)
    pool = BrowserPool(size=1)
    try:
        await bench_reset_and_steps(pool, args.episodes, args.steps)
        await bench_reset_idle(pool, args.episodes, 0.5)
        await bench_screenshots(pool, 20)
    finally:
        await pool.aclose()
    await bench_throughput(args.episodes, args.concurrency)
    await bench_memory(args.concurrency)
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    asyncio.run(main())
