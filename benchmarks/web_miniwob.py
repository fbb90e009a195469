"""Browser envs on this machine: launch, reset, step and screenshot latency, pool throughput, memory.

    python benchmarks/web_miniwob.py --episodes 16 --steps 32 --concurrency 4

Every number comes with a baseline measured in the same run, interleaved with it (the machine is
shared, so only ratios are comparable), and the load average around it:
  * browser launch (Chromium process start) and the first lease (driver + launch + context);
  * reset latency of web-miniwob (fresh context, task page, seeded start, first observation), after
    0.5 s of agent time (the pool's next page is ready) and back to back, for one task and for six;
    baseline: ``preload=False`` (the pool's spare page only warms the renderer; the page loads at reset);
  * DOM step latency (hover, and a click on a checkbox): ``direct_input`` (input events at a hit-tested
    point) against ``direct_input=False`` (playwright's actionability waits); a noop step is the
    observation's own cost. Steps start after 1 s of agent time (an LLM turn is longer), so the pool's
    background work for the next episode is done, as in real use;
  * pixel step latency (move_to + screenshot observation) against the old step's page work (a
    four-event mouse move, then status, DOM and screenshot one after the other); the observation
    alone (status + DOM in one round trip, screenshot alongside) against those three calls;
  * a bare screenshot of the 160x210 task area against a full 1280x720 viewport;
  * expert episodes per second with 1 context and with N concurrent contexts (and N with the baseline),
    and the CPU time per episode of the whole process tree (python, playwright driver, Chromium),
    which the load of other processes does not inflate;
  * memory (PSS) per open context: browser tree with N task pages open minus the idle browser, over N.
Targets (issue 6): DOM step p50 <= 50 ms, pixel step p50 <= 150 ms, reset <= 300 ms, <= 150 MiB/context.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from typing import Any

from turngym.envs.gui.env import GuiMiniWoBEnv
from turngym.envs.web import page as wp
from turngym.envs.web.env import WebMiniWoBEnv
from turngym.sandboxes.browser import BrowserPool, process_tree

TASKS = ["click-button", "enter-text", "click-checkboxes", "login-user", "click-tab", "simple-arithmetic"]
NEW: dict[str, Any] = {}
BASELINE: dict[str, Any] = {"preload": False, "direct_input": False}
#: agent time between a reset and the first step in the step benchmarks
AGENT_S = 1.0


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def ms(xs: list[float]) -> str:
    return f"p50 {1000 * statistics.median(xs):7.1f} ms   p99 {1000 * pct(xs, 99):7.1f} ms   (n={len(xs)})"


def compare(label: str, new: list[float], base: list[float], target: str = "") -> None:
    ratio = statistics.median(base) / statistics.median(new)
    print(f"{label:40s} {ms(new)}   {target}")
    print(f"{'  baseline (same run, interleaved)':40s} {ms(base)}   new is {ratio:.2f}x faster")


def load() -> str:
    return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"


def tree_cpu_s(root: int | None = None) -> float:
    """CPU seconds used so far by a process (default: this one) and all its descendants (live ones,
    and dead ones their parents reaped): user + system, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in process_tree(root or os.getpid()):
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    return total / tick


async def timed(coro) -> float:
    t0 = time.perf_counter()
    await coro
    return time.perf_counter() - t0


def call(name: str, **args: Any) -> str:
    import json

    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


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
    print(f"{'browser launch (chromium start)':40s} {ms(launches)}")
    print(f"{'first lease (driver+launch+context)':40s} {ms(firsts)}")


async def bench_reset(episodes: int, tasks: str | list[str], gap_s: float) -> None:
    """New and baseline envs on two pools (each pool's spare page belongs to its own env), alternating."""
    pools = [BrowserPool(size=1), BrowserPool(size=1)]
    envs = [WebMiniWoBEnv(tasks, pool=pools[0], **NEW), WebMiniWoBEnv(tasks, pool=pools[1], **BASELINE)]
    times: list[list[float]] = [[], []]
    try:
        for env in envs:  # browsers launched, renderers warm
            await env.areset(seed=10_000)
        roots = [pool.browser_pids()[0] for pool in pools]
        cpu0 = [tree_cpu_s(r) for r in roots]
        for ep in range(episodes):
            for env, out in zip(envs, times, strict=True):
                await asyncio.sleep(gap_s)
                out.append(await timed(env.areset(seed=ep)))
        cpu = [1000 * (tree_cpu_s(r) - c) / episodes for r, c in zip(roots, cpu0, strict=True)]
    finally:
        for env in envs:
            await env.aclose()
        for pool in pools:
            await pool.aclose()
    what = tasks if isinstance(tasks, str) else f"{len(tasks)} tasks"
    when = f"after {gap_s:g} s agent time" if gap_s else "back to back"
    compare(f"reset, {what}, {when}", times[0], times[1], "target p50 <= 300 ms" if gap_s else "")
    print(
        f"{'  Chromium CPU per episode, new / baseline':40s} {cpu[0]:5.0f} ms / {cpu[1]:.0f} ms (background work included)"
    )


async def bench_dom_steps(pool: BrowserPool, episodes: int, steps: int) -> None:
    envs = [
        WebMiniWoBEnv("click-checkboxes", pool=pool, max_turns=3 * steps + 1, **kw) for kw in (NEW, BASELINE)
    ]
    hover: list[list[float]] = [[], []]
    click: list[list[float]] = [[], []]
    noop = []
    try:
        for ep in range(episodes):
            for env in envs:
                await env.areset(seed=ep)
            await asyncio.sleep(AGENT_S)
            for i in range(max(1, steps // episodes)):
                for k, env in enumerate(envs):
                    boxes = [n.id for n in env.snap.nodes if n.role == "checkbox"]
                    last = [n.id for n in env.snap.nodes if n.id is not None][-1]
                    hover[k].append(await timed(env.astep(call("hover", bid=last))))
                    click[k].append(await timed(env.astep(call("click", bid=boxes[i % len(boxes)]))))
                noop.append(await timed(envs[0].astep(call("noop", wait_ms=0))))
    finally:
        for env in envs:
            await env.aclose()
    print(f"{'step, DOM observation, noop action':40s} {ms(noop)}   (the observation's own cost)")
    compare("step, DOM observation, hover action", hover[0], hover[1], "target p50 <= 50 ms")
    compare("step, DOM observation, click action", click[0], click[1], "target p50 <= 50 ms")


async def _observe_3_calls(page: Any, clip: tuple[float, float, float, float]) -> None:
    """The observation as it was before: status, snapshot and screenshot, one after the other."""
    await wp.read_status(page)
    await wp.snapshot(page)
    await wp.screenshot(page, clip)


async def _old_move_step(page: Any, clip: tuple[float, float, float, float]) -> None:
    """A move_to step's page work as it was before: four mouse events, then the three calls."""
    await page.mouse.move(10, 10)
    await page.mouse.move(150, 200, steps=4)
    await _observe_3_calls(page, clip)


async def bench_pixel_steps(pool: BrowserPool, episodes: int, steps: int) -> None:
    gui = GuiMiniWoBEnv(TASKS, pool=pool, max_turns=steps + 1)
    step, old_step, new, base = [], [], [], []
    clip = (0, 0, *wp.TASK_AREA)
    try:
        for ep in range(episodes):
            await gui.areset(seed=ep)
            await asyncio.sleep(AGENT_S)
            for _ in range(max(1, steps // episodes)):
                assert gui.lease is not None
                await gui.lease.run(lambda page: page.mouse.move(10, 10))
                step.append(await timed(gui.astep(call("move_to", x=150, y=200))))
                old_step.append(await timed(gui.lease.run(_old_move_step, clip)))
                new.append(await timed(gui.lease.run(wp.observe, clip)))
                base.append(await timed(gui.lease.run(_observe_3_calls, clip)))
    finally:
        await gui.aclose()
    compare("step, screenshot observation (move_to)", step, old_step, "target p50 <= 150 ms")
    print("  (baseline: the old page work alone, without the env's own step overhead)")
    compare("screenshot observation alone", new, base)


async def bench_screenshots(pool: BrowserPool, n: int) -> None:
    async with await pool.lease((1280, 720)) as lease:
        await lease.run(wp.start_episode, WebMiniWoBEnv("click-button").task_url("click-button"), 0)
        task = [await timed(lease.run(wp.screenshot, (0, 0, *wp.TASK_AREA))) for _ in range(n)]
        full = [await timed(lease.run(wp.screenshot)) for _ in range(n)]
        snap = [await timed(lease.run(wp.snapshot)) for _ in range(n)]
    print(f"{'screenshot 160x210 task area':40s} {ms(task)}")
    ratio = statistics.median(full) / statistics.median(task)
    print(f"{'screenshot 1280x720 viewport':40s} {ms(full)}   (baseline; ratio {ratio:.1f}x)")
    print(f"{'DOM snapshot (one evaluate)':40s} {ms(snap)}")


async def expert_episode(pool: BrowserPool, seed: int, kwargs: dict[str, Any]) -> float:
    env = WebMiniWoBEnv(TASKS, pool=pool, max_turns=8, **kwargs)
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
    for label, conc, kwargs in (
        ("", 1, NEW),
        ("", concurrency, NEW),
        (" (baseline)", concurrency, BASELINE),
    ):
        pool = BrowserPool(size=1, contexts_per_browser=conc)
        await expert_episode(pool, 10_000, kwargs)  # warm: browser launched
        sem = asyncio.Semaphore(conc)

        async def one(seed: int, sem: asyncio.Semaphore = sem, pool: BrowserPool = pool, kw=kwargs) -> float:
            async with sem:
                return await expert_episode(pool, seed, kw)

        t0, cpu0 = time.perf_counter(), tree_cpu_s()
        rewards = await asyncio.gather(*(one(s) for s in range(episodes)))
        rates[(conc, label)] = episodes / (time.perf_counter() - t0)
        cpu_ms = 1000 * (tree_cpu_s() - cpu0) / episodes
        solved = sum(r > 0 for r in rewards)
        name = f"expert episodes/s, {conc} context(s){label}"
        print(
            f"{name:40s} {rates[(conc, label)]:6.2f} /s   CPU {cpu_ms:5.0f} ms/episode   "
            f"({solved}/{episodes} solved; {load()})"
        )
        await pool.aclose()
    new, one_ctx, base = rates[(concurrency, "")], rates[(1, "")], rates[(concurrency, " (baseline)")]
    print(f"{'  ratio vs 1 context / vs baseline':40s} {new / one_ctx:6.2f}x / {new / base:.2f}x")


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
    print(f"{'memory per context (PSS)':40s} {per:6.1f} MiB   target <= 150 MiB")
    print(
        "  (with prewarm, each browser also holds one preloaded page for the next episode: one context more)"
    )


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--launches", type=int, default=3)
    args = ap.parse_args()
    print(f"start: {load()}")
    await bench_launch(args.launches)
    print(f"[{load()}]")
    for tasks in ("click-checkboxes", TASKS):
        await bench_reset(args.episodes, tasks, 0.5)
        print(f"[{load()}]")
    await bench_reset(max(2, args.episodes // 2), "click-checkboxes", 0.0)
    print(f"[{load()}]")
    pool = BrowserPool(size=1)
    try:
        await bench_dom_steps(pool, args.episodes, args.steps)
        print(f"[{load()}]")
        await bench_pixel_steps(pool, args.episodes, args.steps)
        print(f"[{load()}]")
        await bench_screenshots(pool, 20)
    finally:
        await pool.aclose()
    print(f"[{load()}]")
    await bench_throughput(args.episodes, args.concurrency)
    await bench_memory(args.concurrency)
    print(f"end: {load()}")


if __name__ == "__main__":
    asyncio.run(main())
