"""Load test (issue 10, part 6): many concurrent search-qa trajectories plus concurrent swe-docker
episodes, sustained for a while, through the real rollout engine.

Each family keeps its concurrency constant (a worker starts the next trajectory as soon as its last one
ends). Reports throughput, step latency (p50/p99 of ``env.astep``), event-loop lag (how late a 10 ms
sleep wakes: sync work on the loop stalls every trajectory), resident memory over time (a timeline and
the growth between the first and last quarter; latencies are kept in constant-memory histograms, so the
benchmark's own bookkeeping does not grow), errors (masked trajectories, by reason) and leftovers (this
process's containers and child processes). Baseline, measured in the same run: search-qa at
concurrency 1, so the ratios show what concurrency (and the swe-docker load) costs per step.

    python benchmarks/reliability_load.py                                      # 32 search-qa + 2 swe, 120 s
    python benchmarks/reliability_load.py --seconds 330 --baseline-seconds 20 --swe 8   # the issue's setting
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import math
import os
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import turngym
from turngym.agents.scripted import RandomAgent, ScriptedAgent
from turngym.core.wrappers import AsyncWrapper
from turngym.rollout.engine import RolloutConfig, RolloutEngine


class Timed(AsyncWrapper):
    """Records the wall time of every ``astep`` into a shared list."""

    def __init__(self, env: Any, sink: Histogram):
        super().__init__(env)
        self.sink = sink

    async def astep(self, action: Any):
        t0 = time.perf_counter()
        try:
            return await self.env.astep(action)
        finally:
            self.sink.append(time.perf_counter() - t0)


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Histogram:
    """Latencies in log-spaced buckets 2 % wide (1 µs up): constant memory, so the benchmark's own
    bookkeeping never shows up as memory growth; quantiles are accurate to the bucket width."""

    START, RATIO = 1e-6, 1.02

    def __init__(self) -> None:
        self.counts: Counter = Counter()
        self.n, self.max = 0, 0.0

    def append(self, seconds: float) -> None:
        self.counts[int(math.log(max(seconds, self.START) / self.START, self.RATIO))] += 1
        self.n += 1
        self.max = max(self.max, seconds)

    def quantile_ms(self, q: float) -> float:
        """The ``q`` quantile in milliseconds (the bucket's geometric middle); NaN when empty."""
        seen = 0
        for bucket in sorted(self.counts):
            seen += self.counts[bucket]
            if seen >= q * self.n:
                return self.START * self.RATIO ** (bucket + 0.5) * 1e3
        return float("nan")

    def summary(self) -> dict[str, float]:
        return {"p50": self.quantile_ms(0.5), "p99": self.quantile_ms(0.99), "max": self.max * 1e3}


async def sustain(name: str, make_engine, concurrency: int, seconds: float, result: dict) -> None:
    """Keep ``concurrency`` trajectories in flight for ``seconds``: each worker starts the next one as soon
    as its last ends (no waves, so the concurrency never sags); every run must reconcile."""
    t0 = time.monotonic()
    seeds = itertools.count()
    totals = {"trajectories": 0, "masked": 0, "turns": 0}
    reasons: Counter = Counter()

    async def worker() -> None:
        engine = make_engine()
        while time.monotonic() - t0 < seconds:
            trajs = await engine.run([next(seeds)])
            s = engine.stats
            assert s.reconciles() and len(trajs) == 1, s.as_dict()
            totals["trajectories"] += 1
            totals["masked"] += s.masked
            totals["turns"] += s.turns
            reasons.update(s.mask_reasons)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    result[name] = {**totals, "mask_reasons": dict(reasons), "wall_s": round(time.monotonic() - t0, 1)}


async def sample_loop_lag(stop: asyncio.Event, out: Histogram, period: float = 0.01) -> None:
    """How late a ``period``-second sleep wakes up: the time the event loop was busy with something else
    (sync work in a coroutine blocks every trajectory at once)."""
    while not stop.is_set():
        t0 = time.perf_counter()
        await asyncio.sleep(period)
        out.append(time.perf_counter() - t0 - period)


async def sample_memory(stop: asyncio.Event, out: list[tuple[float, float, int]]) -> None:
    """(seconds, resident MB, live objects tracked by the GC) every 2 s: a leak grows the object count,
    the allocator's high-water mark only the RSS."""
    t0 = time.monotonic()
    while not stop.is_set():
        out.append((time.monotonic() - t0, rss_mb(), len(gc.get_objects())))
        try:
            await asyncio.wait_for(stop.wait(), 2.0)
        except TimeoutError:
            pass


def search_engine(sink: Histogram):
    def factory():
        return Timed(turngym.make("search-qa-v0"), sink)

    agent = RandomAgent(p_malformed=0.2, seed=0)  # malformed actions included: errors must stay observations
    return lambda: RolloutEngine(
        factory, agent, RolloutConfig(max_concurrency=1, turn_timeout=60), env_id="search-qa-v0"
    )


def swe_engine(concurrency: int, sink: Histogram, task_ids: list[str]):
    def factory():
        return Timed(
            turngym.make("swe-docker-v0", task_ids=task_ids, max_active=concurrency, command_timeout=60), sink
        )

    return lambda: RolloutEngine(
        factory,
        ScriptedAgent(),
        RolloutConfig(max_concurrency=1, turn_timeout=600),
        env_id="swe-docker-v0",
    )


async def main_async(a: argparse.Namespace) -> dict:
    out: dict[str, Any] = {"args": vars(a), "cpus": os.cpu_count(), "load_before": os.getloadavg()}
    # baseline: search-qa at concurrency 1
    base_lat = Histogram()
    base_lag = Histogram()
    base: dict = {}
    stop = asyncio.Event()
    lag_probe = asyncio.create_task(sample_loop_lag(stop, base_lag))
    await sustain("search_qa", search_engine(base_lat), 1, a.baseline_seconds, base)
    stop.set()
    await lag_probe
    out["baseline_c1"] = {
        **base["search_qa"],
        "p50_step_ms": base_lat.quantile_ms(0.5),
        "p99_step_ms": base_lat.quantile_ms(0.99),
        "loop_lag_ms": base_lag.summary(),
    }
    # load
    lat_s = Histogram()
    lat_w = Histogram()
    mem: list[tuple[float, float, int]] = []
    lag = Histogram()
    stop = asyncio.Event()
    res: dict = {}
    jobs = [sustain("search_qa", search_engine(lat_s), a.search, a.seconds, res)]
    if a.swe:
        from turngym.envs.swe.tasks import load_instances

        seen: dict[str, str] = {}
        for t in load_instances():
            seen.setdefault(t.package, t.instance_id)
        jobs.append(
            sustain("swe_docker", swe_engine(a.swe, lat_w, list(seen.values())), a.swe, a.seconds, res)
        )
    samplers = [
        asyncio.create_task(sample_memory(stop, mem)),
        asyncio.create_task(sample_loop_lag(stop, lag)),
    ]
    await asyncio.gather(*jobs)
    stop.set()
    await asyncio.gather(*samplers)
    q = max(1, len(mem) // 4)
    first, last = statistics.median(m for _, m, _ in mem[:q]), statistics.median(m for _, m, _ in mem[-q:])
    sq = res["search_qa"]
    out["load"] = {
        "search_qa": {
            **sq,
            "traj_per_s": sq["trajectories"] / sq["wall_s"],
            "turns_per_s": sq["turns"] / sq["wall_s"],
            "p50_step_ms": lat_s.quantile_ms(0.5),
            "p99_step_ms": lat_s.quantile_ms(0.99),
        },
        "loop_lag_ms": lag.summary(),
        "memory_mb": {
            "first_quarter": first,
            "last_quarter": last,
            "growth": last - first,
            "peak": max(m for _, m, _ in mem),
            "objects_first_last_quarter": (
                statistics.median(n for _, _, n in mem[:q]),
                statistics.median(n for _, _, n in mem[-q:]),
            ),
            "timeline_s_mb_objects": [
                (round(t), round(m, 1), n) for t, m, n in mem[:: max(1, len(mem) // 12)]
            ],
        },
        "load_after": os.getloadavg(),
    }
    if a.swe:
        sw = res["swe_docker"]
        out["load"]["swe_docker"] = {
            **sw,
            "episodes_per_min": 60 * sw["trajectories"] / sw["wall_s"],
            "p50_step_ms": lat_w.quantile_ms(0.5),
            "p99_step_ms": lat_w.quantile_ms(0.99),
        }
    b = out["baseline_c1"]
    out["ratios_vs_c1"] = {
        "throughput": out["load"]["search_qa"]["traj_per_s"] / (b["trajectories"] / b["wall_s"]),
        "p99_step": out["load"]["search_qa"]["p99_step_ms"] / b["p99_step_ms"],
    }
    return out


def leftovers() -> dict[str, int]:
    from turngym.sandboxes.browser import process_tree
    from turngym.sandboxes.pool import _close_shared_pools

    _close_shared_pools()
    time.sleep(5)
    left = {"child_processes": len(process_tree(os.getpid())) - 1}
    try:
        import socket

        from turngym.sandboxes.docker import LABEL_PID, docker_client

        flt = {"label": [f"{LABEL_PID}={os.getpid()}", f"turngym.owner.host={socket.gethostname()}"]}
        left["containers"] = len(docker_client().containers.list(all=True, filters=flt))
    except Exception:  # noqa: BLE001 - no daemon
        pass
    return left


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--baseline-seconds", type=float, default=15.0)
    ap.add_argument("--search", type=int, default=32, help="concurrent search-qa trajectories")
    ap.add_argument("--swe", type=int, default=2, help="concurrent swe-docker episodes (0: none)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    a = ap.parse_args()
    out = asyncio.run(main_async(a))
    out["leftovers"] = leftovers()
    text = json.dumps(out, indent=1, default=lambda x: round(x, 3) if isinstance(x, float) else str(x))
    print(text)
    if a.json:
        a.json.write_text(text)


if __name__ == "__main__":
    main()
