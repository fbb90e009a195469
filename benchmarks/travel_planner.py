"""Benchmark of the travel family: database build, query generation, tool latency, evaluator
speed, and expert / greedy-cheap / random pass rates per level.

    python benchmarks/travel_planner.py [--queries 200] [--seed 0]

Baselines measured in the same run: the database build against loading the cached copy,
indexed tool lookups against TravelPlanner's own way (a pandas boolean filter over the whole
table per call). CPU times are printed beside wall times because the machine may be shared. Targets (issue 7): tool p50 <= 5 ms, plan evaluation <= 10 ms, build <= 30 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import turngym
    from turngym.envs.travel.baselines import planner_actions
    from turngym.envs.travel.database import build_database, get_database
    from turngym.envs.travel.evaluate import evaluate_plan
    from turngym.envs.travel.queries import LEVELS, sample_task

    cache = tempfile.mkdtemp(prefix="travel-bench-")
    t0, c0 = time.perf_counter(), time.process_time()
    path = build_database(seed=args.seed, cache_dir=cache)
    build_s, build_cpu = time.perf_counter() - t0, time.process_time() - c0
    size_mb = sum(f.stat().st_size for f in Path(path).iterdir()) / 1e6
    t0, c0 = time.perf_counter(), time.process_time()
    db = get_database(seed=args.seed, cache_dir=cache)  # what make() pays once per process
    db.flights("x", "y", "z"), db.road("x", "y", "taxi"), db.restaurants("x"), db.flight_by_number("F0")
    open_s, open_cpu = time.perf_counter() - t0, time.process_time() - c0
    rows = db.summary()
    print(f"database: {rows['cities']} cities, rows {json.dumps(rows)}")
    print(
        f"  build {build_s:.2f} s wall / {build_cpu:.2f} s CPU (target <= 30 s), {size_mb:.1f} MB parquet; "
        f"open from cache (parquet + indexes) {open_s:.2f} s wall / {open_cpu:.2f} s CPU "
        f"-> build/open CPU = {build_cpu / max(open_cpu, 1e-9):.1f}x"
    )

    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    tasks = [sample_task(db, rng, level=LEVELS[i % 3]) for i in range(args.queries)]
    gen_s = time.perf_counter() - t0
    print(
        f"query generation: {args.queries / gen_s:.0f} queries/s ({1000 * gen_s / args.queries:.1f} ms each, "
        "each verified by the evaluator)"
    )

    t0 = time.perf_counter()
    for t in tasks:
        assert evaluate_plan(t.query, t.plan, db).final_pass
    eval_ms = 1000 * (time.perf_counter() - t0) / len(tasks)
    print(f"evaluator: {eval_ms:.2f} ms per plan (target <= 10 ms)")

    # tool latency through env.step, and a TravelPlanner-style pandas filter as the baseline
    env = turngym.make("travel-planner", db_seed=args.seed, cache_dir=cache, max_turns=10_000)
    env.reset(seed=0)
    per_tool: dict[str, list[float]] = defaultdict(list)
    for t in tasks[:60]:
        for name, a in t.searches:
            action = "<tool_call>" + json.dumps({"name": name, "arguments": a}) + "</tool_call>"
            t0 = time.perf_counter()
            _, _, _, _, info = env.step(action)
            per_tool[name].append(1000 * (time.perf_counter() - t0))
            assert info["tool_results"][0].ok
    all_ms = [v for vs in per_tool.values() for v in vs]
    fl, rest = db.tables["flights"], db.tables["restaurants"]
    base = []
    for t in tasks[:60]:
        for name, a in t.searches:
            t0 = time.perf_counter()
            if name == "search_flights":
                r = fl[(fl["OriginCityName"] == a["origin"]) & (fl["DestCityName"] == a["destination"])]
                r[r["FlightDate"] == a["date"]].to_string(index=False)
            elif name == "search_restaurants":
                rest[rest["City"] == a["city"]].to_string()
            else:
                continue
            base.append(1000 * (time.perf_counter() - t0))
    p50 = pct(all_ms, 50)
    print(
        f"tool calls via env.step: p50 {p50:.2f} ms, p95 {pct(all_ms, 95):.2f} ms over {len(all_ms)} calls "
        f"(target p50 <= 5 ms)"
    )
    for name, vs in sorted(per_tool.items()):
        print(f"  {name:22s} p50 {pct(vs, 50):6.2f} ms  n={len(vs)}")
    print(
        f"  baseline pandas filter + to_string (TravelPlanner's tools): p50 {pct(base, 50):.2f} ms "
        f"-> env.step is {pct(base, 50) / p50:.1f}x faster"
    )
    env.close()

    # pass rates per level: the env's expert, greedy-cheap and random, all through the env
    env = turngym.make("travel-planner", db_seed=args.seed, cache_dir=cache, max_turns=60)
    results: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    prng = np.random.default_rng(args.seed + 1)
    t0 = time.perf_counter()
    for i in range(args.queries):
        level = LEVELS[i % 3]
        for policy in ("expert", "greedy", "random"):
            obs, info = env.reset(seed=10_000 + i, options={"level": level})
            if policy == "expert":
                actions = iter(lambda: env.expert_action(), None)
            else:
                q = env._query
                actions = iter(planner_actions(policy, q, env.db, prng) or ["no plan"])
            reward = 0.0
            for action in actions:
                _, reward, term, trunc, _ = env.step(action)
                if term or trunc:
                    break
            results[policy][level].append(reward)
    loop_s = time.perf_counter() - t0
    print(f"pass rates over {args.queries} generated queries ({loop_s:.1f} s):")
    for policy, by_level in results.items():
        levels = "  ".join(f"{lvl} {statistics.mean(v):.3f}" for lvl, v in sorted(by_level.items()))
        overall = statistics.mean([x for v in by_level.values() for x in v])
        print(f"  {policy:7s} overall {overall:.3f}   {levels}")
    env.close()


if __name__ == "__main__":
    main()
