"""Success rate of the scripted MiniWoB++ experts, per task, over many seeds (DOM and pixels).

    python benchmarks/web_expert.py --seeds 20 --gui-seeds 20 --concurrency 4 [--only dom|gui] [--tasks a,b]

An episode counts as solved when its total reward is > 0 (the task's own JavaScript reward).
Prints a table and how many tasks reach >= 90% (issue 6: >= 25 tasks through the DOM, >= 10
through gui-miniwob only). The random-action baseline (noop-free random tool calls from the
action space, ``--random-seeds N``) can be measured in the same run on the same seeds.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from turngym.envs.gui.env import GUI_EXPERT_TASKS, GuiMiniWoBEnv
from turngym.envs.web.base import MiniWoBEnvBase
from turngym.envs.web.env import WebMiniWoBEnv
from turngym.envs.web.expert import EXPERT_TASKS
from turngym.sandboxes.browser import BrowserError, BrowserPool


async def episode(cls: type[MiniWoBEnvBase], pool: BrowserPool, task: str, seed: int, random: bool) -> float:
    env = cls(task, pool=pool, max_turns=12)
    try:
        try:
            await env.areset(seed=seed)
        except BrowserError as e:  # an overloaded machine: counted as a failure, reported
            print(f"  {task} seed {seed}: reset failed: {e}", flush=True)
            return 0.0
        env.action_space.seed(seed)
        total, done = 0.0, False
        while not done:
            action = env.action_space.sample() if random else (env.expert_action() or "noop")
            _, r, term, trunc, _ = await env.astep(action)
            total, done = total + r, term or trunc
        return total
    finally:
        await env.aclose()


async def rate(cls, pool, task, seeds, sem, random=False) -> float:
    async def one(seed: int) -> float:
        async with sem:
            return await episode(cls, pool, task, seed, random)

    rewards = await asyncio.gather(*(one(s) for s in range(seeds)))
    return sum(r > 0 for r in rewards) / seeds


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--only", choices=["dom", "gui"], default=None)
    ap.add_argument("--tasks", default="", help="comma-separated subset")
    ap.add_argument(
        "--gui-seeds", type=int, default=None, help="seeds for the pixel expert (default --seeds)"
    )
    ap.add_argument("--random-seeds", type=int, default=0, help="seeds for the random-action baseline (slow)")
    args = ap.parse_args()
    pool = BrowserPool(size=1, contexts_per_browser=args.concurrency)
    sem = asyncio.Semaphore(args.concurrency)
    subset = set(args.tasks.split(",")) if args.tasks else None
    t0 = time.perf_counter()
    try:
        for kind, cls, tasks, need, seeds in (
            ("dom", WebMiniWoBEnv, EXPERT_TASKS, 25, args.seeds),
            ("gui", GuiMiniWoBEnv, GUI_EXPERT_TASKS, 10, args.gui_seeds or args.seeds),
        ):
            if args.only and args.only != kind:
                continue
            good = 0
            print(f"\n{kind} expert ({cls.__name__}), {seeds} seeds a task")
            print(f"{'task':32s} {'expert':>7s} {'random':>7s}")
            for task in tasks:
                if subset and task not in subset:
                    continue
                r = await rate(cls, pool, task, seeds, sem)
                base = (
                    await rate(cls, pool, task, args.random_seeds, sem, random=True)
                    if args.random_seeds
                    else None
                )
                good += r >= 0.9
                print(f"{task:32s} {r:7.0%} {'-' if base is None else format(base, '.0%'):>7s}", flush=True)
            print(f"{kind}: {good} tasks solved on >= 90% of seeds (issue target >= {need})")
    finally:
        await pool.aclose()
    print(f"\nwall time {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    asyncio.run(main())
