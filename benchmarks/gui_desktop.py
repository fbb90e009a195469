"""gui-desktop on this machine: reset, step, fork, memory and expert success, with gui-miniwob beside it.

    python benchmarks/gui_desktop.py --resets 8 --steps 16 [--all-tasks] [--json out.json]

Measured in one run (the machine is shared: the load average is printed with the numbers):
  * reset from the warm pool (a started desktop handed out, task files written, the app launched and
    shown, first screenshot): p50 / p90 over ``--resets`` episodes, with 1 s of agent time before each;
  * an action + screenshot step (``move_to``, then the settle and the PNG screenshot observation):
    p50 / p95 over ``--steps`` steps, through the desktop's helper process (the default) and, in the
    same run, through one ``docker exec`` per command with the fixed ``settle_s`` wait (``helper=False``,
    the old path: ``exec_step_*``);
  * fork cost (replay of a 4-turn episode on a fresh desktop);
  * memory per live desktop (the container's memory use, Docker's stats, with the task's app open);
  * expert success and turns over the tasks (a sample, or every task with ``--all-tasks``);
  * gui-miniwob's reset and pixel step (move_to + screenshot) p50 from the same run.
Targets (issue 40): reset p50 <= 2 s, action + screenshot p50 <= 150 ms, expert success 100 %.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from turngym.envs.desktop.env import DesktopEnv
from turngym.envs.desktop.tasks import build_tasks

SAMPLE = ["editor-new-file-0", "editor-append-0", "sheet-sum-0", "files-rename-0", "files-move-0",
          "term-output-0", "term-files-0", "calc-0"]  # fmt: skip


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))] if xs else float("nan")


def step_numbers(env: DesktopEnv, steps: int, prefix: str) -> dict[str, float]:
    """p50 / p95 of a ``move_to`` step (the action, the settle, the screenshot observation, the check)."""
    step_s = []
    env.reset(seed=0, options={"task": "editor-append-1"})
    for i in range(steps):
        t0 = time.perf_counter()
        env.step(env.format_call("move_to", {"x": 100 + 10 * i, "y": 300}))
        step_s.append(time.perf_counter() - t0)
    return {f"{prefix}step_p50_s": pct(step_s, 50), f"{prefix}step_p95_s": pct(step_s, 95)}


def desktop_numbers(
    resets: int, steps: int, all_tasks: bool, tasks: list[str] | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    env = DesktopEnv(warm=1)
    try:
        env.reset(seed=0, options={"task": "term-output-0"})  # warms the pool and the image
        reset_s = []
        for i in range(resets):
            time.sleep(1.0)  # agent time: the pool warms the next desktop meanwhile
            t0 = time.perf_counter()
            env.reset(seed=i, options={"task": ["term-output-0", "editor-append-0", "calc-1"][i % 3]})
            reset_s.append(time.perf_counter() - t0)
        out["reset_p50_s"], out["reset_p95_s"] = pct(reset_s, 50), pct(reset_s, 95)
        out.update(step_numbers(env, steps, ""))
        old = DesktopEnv(warm=1, helper=False)
        try:
            out.update(step_numbers(old, steps, "exec_"))
        finally:
            old.close()
        env.reset(seed=0, options={"task": "editor-append-1"})
        stats = env.desk.sb.container.stats(stream=False)
        out["memory_per_desktop_mib"] = stats["memory_stats"].get("usage", 0) / 2**20
        env.reset(seed=0, options={"task": "editor-append-2"})
        for call in (("press", {"key": "ctrl+End"}), ("type", {"text": "fork me"}), ("press", {"key": "Return"}),
                     ("type", {"text": "again"})):  # fmt: skip
            env.step(env.format_call(*call))
        t0 = time.perf_counter()
        child = env.fork()
        out["fork_4_turns_s"] = time.perf_counter() - t0
        child.close()
        ids = [t.task_id for t in build_tasks()] if all_tasks else (tasks or SAMPLE)
        rows = []
        for tid in ids:
            env.reset(seed=0, options={"task": tid})
            total, turns, t0 = 0.0, 0, time.perf_counter()
            while True:
                _, r, term, trunc, info = env.step(env.expert_action())
                total, turns = total + r, turns + 1
                if term or trunc:
                    break
            rows.append({"task_id": tid, "app": info["app"], "success": bool(info["check"]["success"]),
                         "return": round(total, 4), "turns": turns, "seconds": round(time.perf_counter() - t0, 1)})  # fmt: skip
            print(rows[-1], flush=True)
        out["expert"] = rows
        out["expert_success"] = sum(r["success"] for r in rows) / len(rows)
    finally:
        env.close()
    return out


def miniwob_numbers(resets: int, steps: int) -> dict[str, Any]:
    from turngym.envs.gui.env import GuiMiniWoBEnv

    env = GuiMiniWoBEnv(["click-button", "enter-text"], max_turns=steps + 1)
    out: dict[str, Any] = {}
    try:
        env.reset(seed=0)
        reset_s, step_s = [], []
        for i in range(resets):
            time.sleep(0.5)
            t0 = time.perf_counter()
            env.reset(seed=i)
            reset_s.append(time.perf_counter() - t0)
        env.reset(seed=0)
        for i in range(steps):
            t0 = time.perf_counter()
            env.step(env.format_call("move_to", {"x": 20 + i, "y": 100}))
            step_s.append(time.perf_counter() - t0)
        out["reset_p50_s"], out["step_p50_s"] = pct(reset_s, 50), pct(step_s, 50)
    finally:
        env.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--resets", type=int, default=8)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--all-tasks", action="store_true")
    ap.add_argument("--tasks", nargs="*", default=None, help="expert tasks (default: a sample)")
    ap.add_argument("--no-miniwob", action="store_true")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    result = {"gui-desktop": desktop_numbers(args.resets, args.steps, args.all_tasks, args.tasks)}
    if not args.no_miniwob:
        result["gui-miniwob"] = miniwob_numbers(args.resets, args.steps)
    result["load_avg"] = [load0, os.getloadavg()[0]]
    short = {k: v for k, v in result["gui-desktop"].items() if k != "expert"}
    print(json.dumps({**result, "gui-desktop": short}, indent=1, default=float))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
