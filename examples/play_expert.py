"""Play an environment family with its scripted expert, through the rollout engine.

    python examples/play_expert.py arith                 # 2 episodes, a summary per episode
    python examples/play_expert.py search-qa -n 4 -v     # -v: every turn (action, observation, reward)
    python examples/play_expert.py swe-docker            # needs Docker (see docs/envs/swe-docker.md)
    python examples/play_expert.py web-shop --group 2    # needs Chromium
    python examples/play_expert.py gui-desktop           # needs Docker (see docs/envs/gui-desktop.md)

FAMILY is one of the names below (small, fast settings of each family) or any registered env id.
The scripted expert reads privileged state (the gold trace, the injected bug, the page's DOM), so
it shows what a solved episode looks like and checks an installation end to end: every episode
should end through its terminal tool (or the page's own completion) with a positive reward —
except in ``travel-open``, whose outcome is always 0 (it is judged pairwise in training). The last
line is a JSON summary; the exit code is 1 if an episode was masked or ran out of turns.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import turngym
from turngym.agents.scripted import ScriptedAgent
from turngym.core.types import Trajectory
from turngym.rollout import RolloutConfig, RolloutEngine, save_jsonl

#: family -> (env id, constructor arguments): small settings that start in seconds
FAMILIES: dict[str, tuple[str, dict]] = {
    "arith": ("arith", {"depth": 3}),
    "search-qa": ("search-qa", {"n_passages": 2000, "n_tasks": 400, "hops": [2]}),
    "travel": ("travel-planner", {"level": "medium", "days": 3}),
    "travel-open": ("travel-open", {"days": 3}),
    "swe-docker": ("swe-docker", {"packages": ["inflection"]}),
    "web-miniwob": (
        "web-miniwob",
        {"task": ["click-button", "enter-text", "click-checkboxes", "login-user"]},
    ),
    "gui-miniwob": ("gui-miniwob", {"task": ["click-button", "enter-text", "click-link", "click-dialog"]}),
    "gui-grounding": ("gui-miniwob-grounding", {"task": ["click-button", "login-user"]}),
    "gui-desktop": ("gui-desktop", {"task": ["term-output-0", "editor-append-0", "calc-1"]}),
    "web-shop": ("web-shop", {"split": "test"}),
    "web-arena-lite": ("web-arena-lite", {"template_ids": [100, 203, 207]}),
}


def show(traj: Trajectory, verbose: bool) -> None:
    """One line per episode; with ``verbose`` every turn's action, observation and reward components."""
    status = f"  MASKED ({traj.mask_reason}: {traj.metadata.get('error', '')[:200]})" if traj.masked else ""
    print(f"{traj.task_id}  turns={traj.num_turns}  reward={traj.total_reward:+.3f}{status}")
    if not verbose:
        return
    for turn in traj.turns:
        print(f"  turn {turn.index}: {turn.action.content.strip()[:300]}")
        for msg in turn.observation:
            text = (msg.content or "").strip().replace("\n", "\n      ")
            print(f"    {msg.role}: {text[:400]}" + (f" [+{len(msg.images)} image(s)]" if msg.images else ""))
        print(
            f"    reward {turn.reward:+.3f} {turn.reward_components}"
            + (f" error: {turn.error}" if turn.error else "")
        )


async def play(env_id: str, env_kwargs: dict, seeds: list[int], group: int) -> tuple[list[Trajectory], dict]:
    engine = RolloutEngine(env_id, ScriptedAgent(), RolloutConfig(group_size=group), env_kwargs=env_kwargs)
    trajectories = await engine.run(seeds)
    return trajectories, engine.stats.as_dict()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("family", help=f"one of {', '.join(FAMILIES)}, or an env id")
    ap.add_argument("-n", "--episodes", type=int, default=2, help="tasks (seeds 0..n-1)")
    ap.add_argument("--group", type=int, default=1, help="episodes per task")
    ap.add_argument("--seed", type=int, default=0, help="first task seed")
    ap.add_argument("--out", help="also save the trajectories as JSONL here")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every turn")
    a = ap.parse_args(argv)
    env_id, env_kwargs = FAMILIES.get(a.family, (a.family, {}))
    try:
        turngym.spec(env_id)
    except turngym.UnknownEnvError as e:
        ap.error(f"{e.args[0]} (families: {', '.join(FAMILIES)})")
    trajs, stats = asyncio.run(play(env_id, env_kwargs, list(range(a.seed, a.seed + a.episodes)), a.group))
    for t in trajs:
        show(t, a.verbose)
    if a.out:
        save_jsonl(trajs, a.out)
    done = [t for t in trajs if not t.masked]
    summary = {
        "env": env_id,
        "episodes": len(trajs),
        "masked": stats["masked"],
        "terminated": sum(t.terminated for t in done),
        "solved": sum(t.total_reward > 0 for t in done),
        "mean_reward": round(sum(t.total_reward for t in done) / max(len(done), 1), 4),
        "mean_turns": round(sum(t.num_turns for t in done) / max(len(done), 1), 2),
    }
    print(json.dumps(summary))
    return 0 if done and summary["terminated"] == len(trajs) else 1


if __name__ == "__main__":
    sys.exit(main())
