"""Flat groups vs tree rollouts at an equal sampled-token budget, with the tiny model on CPU.

    python benchmarks/tree_budget.py [--envs arith search-qa] [--tasks 4] [--group 4] [--k 2] [--turns 0,1]
        [--hf-engine continuous|slots] [--modes flat tree tree-noshare]

Per env, in the same run and with the same backend (the HF engine ``--hf-engine``, default the
continuous one; prefix reuse on):

1. flat: ``--group`` independent samples of each of ``--tasks`` tasks; its sampled tokens per task
   are the budget;
2. tree: one tree per task (``--k`` children at the ``--turns`` schedule) with ``max_tokens`` = that
   per-task budget (a tree stops branching once it has sampled it; live paths finish);
3. tree-noshare (when listed in ``--modes``): the same trees with the backend's ``share_prefix`` off,
   so every branch prefills its whole prefix (what sharing saves).

Printed per mode: trajectories (leaves), tree nodes, tokens the policy sampled, sampled tokens reused
through shared prefixes (flat: 0), prefix tokens a branch started with, the backend's prompt tokens
fed, those whose KV came from a parked row or a copy of the parent's (``reused_tokens``) and the
branches that started from such a copy (``shared_rows``; ``HFBackend.stats``), wall time, trajectories per
1k sampled tokens (what the budget bought). Runs are interleaved (flat, tree, flat, tree) over
``--repeats``; the load average is printed before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from turngym.agents import LLMAgent, SamplingParams  # noqa: E402
from turngym.agents.hf.registry import make_hf_backend  # noqa: E402
from turngym.agents.models import load_tokenizer  # noqa: E402
from turngym.agents.tiny import tiny_model_path  # noqa: E402
from turngym.rollout import RolloutConfig, RolloutEngine  # noqa: E402
from turngym.rollout.tree import TreeConfig  # noqa: E402


async def one(env_id: str, mode: str, args, backend, tokenizer, budget: int | None) -> dict[str, float]:
    agent = LLMAgent(backend, tokenizer, SamplingParams(max_tokens=args.max_tokens), max_context=2048)
    if mode == "flat":
        cfg = RolloutConfig(group_size=args.group, max_concurrency=64)
    else:
        turns = tuple(int(t) for t in args.turns.split(","))
        tree = TreeConfig(k=args.k, turns=turns, max_tokens=budget, max_nodes=None)
        cfg = RolloutConfig(tree=tree, max_concurrency=64)
    engine = RolloutEngine(env_id, agent, cfg, env_kwargs={"max_turns": args.max_turns})
    if mode == "tree-noshare":
        backend.share_prefix = None  # LLMSession.fork then leaves every branch to a full prefill
    before = dict(backend.stats)
    t0 = time.perf_counter()
    try:
        trajs = await engine.run(range(args.tasks))
    finally:
        vars(backend).pop("share_prefix", None)
    wall = time.perf_counter() - t0
    s = engine.stats
    generated = s.generated_tokens
    return {
        "trajectories": len(trajs),
        "masked": s.masked,
        "nodes": s.tree.get("nodes", s.turns),
        "generated": generated,
        "reused_sampled": s.tree.get("reused_sampled_tokens", 0),
        "reused_prefix": s.tree.get("reused_prefix_tokens", 0),
        "prefill_fed": backend.stats["prompt_tokens"] - before.get("prompt_tokens", 0),
        "kv_reused": backend.stats["reused_tokens"] - before.get("reused_tokens", 0),
        "kv_shared_rows": backend.stats["shared_rows"] - before.get("shared_rows", 0),
        "wall_s": wall,
        "traj_per_1k_tokens": 1000 * len(trajs) / max(generated, 1),
    }


async def bench(env_id: str, args, backend, tokenizer) -> None:
    modes = ["flat", *(m for m in args.modes if m != "flat")]  # flat sets the budget
    rows: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for _ in range(args.repeats):
        flat = await one(env_id, "flat", args, backend, tokenizer, None)
        rows["flat"].append(flat)
        budget = max(1, round(flat["generated"] / args.tasks))  # the flat run's sampled tokens per task
        for mode in modes[1:]:
            rows[mode].append(await one(env_id, mode, args, backend, tokenizer, budget))
    keys = list(rows["flat"][0])
    print(
        f"\n{env_id}: {args.tasks} tasks, flat groups of {args.group} vs trees k={args.k} turns={args.turns}"
    )
    print(f"{'mode':13}" + "".join(f"{k:>19}" for k in keys))
    for mode, rs in rows.items():
        mean = {k: sum(r[k] for r in rs) / len(rs) for k in keys}
        print(f"{mode:13}" + "".join(f"{mean[k]:>19.2f}" for k in keys))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--envs", nargs="*", default=["arith", "search-qa"])
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--turns", default="0,1")
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--hf-engine", choices=["continuous", "slots"], default="continuous")
    ap.add_argument("--modes", nargs="+", choices=["flat", "tree", "tree-noshare"], default=["flat", "tree"])
    args = ap.parse_args()
    path = tiny_model_path()
    tokenizer = load_tokenizer(path)
    backend = make_hf_backend(
        path, tokenizer, engine=args.hf_engine, max_context=2048, max_batch_size=64, max_wait_ms=20
    )
    print(f"engine: {type(backend).__name__}; load average before: {os.getloadavg()[0]:.2f}")

    async def run() -> None:
        try:
            for env_id in args.envs:
                await bench(env_id, args, backend, tokenizer)
        finally:
            await backend.aclose()

    asyncio.run(run())
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
