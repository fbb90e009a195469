"""The rollout engine's CPU-side benchmarks (``benchmarks/rollout.py`` runs them): overhead against
the bare backend, async against lock-step, memory per live trajectory, event-loop CPU per turn."""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.rollout_common import (  # noqa: E402
    NEVER,
    GpuClock,
    Heartbeat,
    HFSettings,
    Recorder,
    SimulatedGPU,
    SleepyEnv,
    boost,
    cpu_ticks,
    fresh_cache,
    host_share,
    load,
    make_backend,
    spread,
    taken_trace,
    timeline,
)
from turngym import Env  # noqa: E402
from turngym.agents import Generation, LLMAgent, SamplingParams  # noqa: E402
from turngym.core.registry import make  # noqa: E402
from turngym.core.wrappers import AsyncWrapper  # noqa: E402
from turngym.rollout import RolloutConfig, RolloutEngine  # noqa: E402

# ----------------------------------------------------------------------------- overhead


async def bench_overhead(
    kind: str,
    n: int,
    g: int,
    turns: int,
    max_tokens: int,
    repeats: int,
    device: str = "cpu",
    lengths: tuple[int, int] | None = None,
    fuse_tokens: int | None = None,
    hf: HFSettings | None = None,
    profile: bool = False,
) -> dict:
    """``lengths=(lo, hi)``: each (trajectory, turn) generates a fixed number of tokens drawn from
    [lo, hi] instead of ``max_tokens``, so trajectories reach their turn boundaries at different times.
    ``hf``: the HF backend to build; ``profile``: one more engine run under cProfile after the pairs."""
    backend, tok, server = make_backend(kind, device, hf, fuse_tokens)
    load0 = load()
    try:
        rec = Recorder(backend, lengths)
        sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        agent = LLMAgent(rec, tok, sampling, max_context=1024)
        cfg = RolloutConfig(group_size=g, max_concurrency=n * g)
        # the slots engine captures a graph per decode bucket (width, context, block steps) and per
        # prefill bucket at its second pass, compiled steps compile per bucket: warm every bucket
        # the runs will use, twice (session 12: a one-turn warm-up left the first pair paying captures)
        warm = RolloutEngine("arith", LLMAgent(backend, tok, sampling), cfg, env_kwargs={"max_turns": turns})
        for _ in range(2):
            await warm.run(n)
        if hasattr(backend, "precapture"):  # every decode bucket this workload's context can reach
            try:
                print("precaptured decode graphs:", backend.precapture(context=1024), flush=True)
            except Exception as e:  # noqa: BLE001 - the pairs still run, capturing on demand
                print(f"precapture failed ({type(e).__name__}: {e}); capturing on demand", flush=True)

        def forwards() -> tuple[float, ...]:
            st = getattr(backend, "stats", None)  # HFBackend: passes, idle seconds, prompt tokens
            keys = ("prefills", "steps", "idle_s", "prompt_tokens", "reused_tokens")
            return tuple(st[k] for k in keys) if st else (0, 0, 0.0, 0, 0)

        def before() -> tuple:
            """Boost the clocks (CUDA); the CPU counters at the start."""
            boost(device)
            return cpu_ticks()

        def breakdown(
            name: str, t0: float, calls: list, beat: Heartbeat, clock: GpuClock, pre: tuple
        ) -> None:
            t1, trace = time.perf_counter(), taken_trace(backend)
            host = {"host_cpu": host_share(pre)}
            if trace is not None:
                host.update(timeline(trace, calls, t0, t1), loop_lag_ms=beat.summary())
            timelines[name].append(host)
            clocks[name].append(clock.summary().get("median"))

        async def engine_run() -> tuple[int, float]:
            fresh_cache(backend)
            rec.requests.clear()
            rec.calls.clear()
            engine = RolloutEngine("arith", agent, cfg, env_kwargs={"max_turns": turns})
            pre = before()
            f0, t0, c0 = forwards(), time.perf_counter(), time.thread_time()
            with Heartbeat() as beat, GpuClock() as clock:
                trajs = await engine.run(n)
            cpu["engine"].append(time.thread_time() - c0)
            passes["engine"].append([round(b - a, 3) for a, b in zip(f0, forwards(), strict=True)])
            dt = time.perf_counter() - t0
            breakdown("engine", t0, rec.calls, beat, clock, pre)
            return sum(sum(t.loss_mask) for t in trajs), dt

        async def bare_run(requests) -> tuple[int, float]:
            streams: dict[str, list] = {}
            for route, prompt, s in requests:
                streams.setdefault(route, []).append((prompt, s.replace(stop_token_ids=NEVER)))
            calls: list[tuple] = []
            fresh_cache(backend)

            async def replay(route, reqs):
                total = 0
                for p, s in reqs:
                    c = time.perf_counter()
                    total += len((await backend.generate(p, s, route=route)).token_ids)
                    calls.append((route, c, time.perf_counter()))
                return total

            pre = before()
            f0, t0, c0 = forwards(), time.perf_counter(), time.thread_time()
            with Heartbeat() as beat, GpuClock() as clock:
                total = sum(await asyncio.gather(*(replay(k, r) for k, r in streams.items())))
            cpu["bare"].append(time.thread_time() - c0)
            passes["bare"].append([round(b - a, 3) for a, b in zip(f0, forwards(), strict=True)])
            dt = time.perf_counter() - t0
            breakdown("bare", t0, calls, beat, clock, pre)
            return total, dt

        engine_tps, bare_tps = [], []
        cpu: dict[str, list[float]] = {"engine": [], "bare": []}  # event-loop thread CPU seconds
        # per run: [prefill passes, decode passes, seconds the backend sat idle waiting for requests,
        # prompt tokens fed, prompt tokens reused from parked rows]
        passes: dict[str, list] = {"engine": [], "bare": []}
        timelines: dict[str, list] = {"engine": [], "bare": []}  # HFBackend: where the wall time went
        clocks: dict[str, list] = {"engine": [], "bare": []}  # median SM MHz per run (CUDA)
        for _ in range(repeats):  # interleaved, so load drift hits both alike
            tokens, dt = await engine_run()
            engine_tps.append(tokens / dt)
            requests = list(rec.requests)
            bare_tokens, dt = await bare_run(requests)
            bare_tps.append(bare_tokens / dt)
            assert bare_tokens == tokens, f"replay generated {bare_tokens} tokens, the engine {tokens}"
        loop_profile = None
        if profile:  # not one of the pairs: its records are dropped
            loop_profile = await profile_loop(engine_run)
            loop_profile["turns"] = len(rec.requests)
            loop_profile["loop_cpu_s"] = round(cpu["engine"][-1], 4)  # the event-loop thread's CPU, profiled
            for d in (cpu, passes, timelines, clocks):
                d["engine"].pop()
    finally:
        await backend.aclose()
        if server is not None:
            server.stop()
    ratios = [e / b for e, b in zip(engine_tps, bare_tps, strict=True)]
    engine_cpu = statistics.median(cpu["engine"]) - statistics.median(cpu["bare"])
    return {
        "backend": kind,
        "device": device,
        "trajectories": n * g,
        "turns_per_trajectory": turns,
        "tokens_per_turn": list(lengths) if lengths else max_tokens,
        "fuse_tokens": getattr(backend, "fuse_tokens", None),
        "sync_hooks_in_thread": Env.sync_hooks_in_thread,
        "requests_per_run": len(requests),
        "tokens_per_run": tokens,
        "engine_tok_s": [round(x, 1) for x in engine_tps],
        "bare_tok_s": [round(x, 1) for x in bare_tps],
        "engine_over_bare": spread(ratios),
        "prefill_decode_idle_prompt_reused": passes,
        "timeline": timelines,
        "gpu_sm_mhz": clocks,
        # load-insensitive: CPU the event-loop thread spent (engine: envs, templates, bookkeeping)
        "loop_cpu_s_engine": round(statistics.median(cpu["engine"]), 3),
        "loop_cpu_s_bare": round(statistics.median(cpu["bare"]), 3),
        "engine_cpu_ms_per_turn": round(1000 * engine_cpu / len(requests), 2),
        "engine_bound_tok_s": round(tokens / max(engine_cpu, 1e-9)),
        "load_before_after": [load0, load()],
        **({"loop_profile": loop_profile} if loop_profile else {}),
    }


async def profile_loop(run, top: int = 30) -> dict:
    """One more ``run()`` with cProfile on the event-loop thread (wall clock: the loop's waits show as
    ``select``/``poll``): the functions with the most own time and the engine's parts (cumulative) --
    where the engine's host work goes on this host (the GPU machines' cores are slower than the CPU
    machine's)."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    try:
        await run()
    finally:
        prof.disable()
    st = pstats.Stats(prof)
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])  # (file, line, fn) -> (cc, nc, tt, ct, callers)

    def name(key) -> str:
        file, line, fn = key
        return f"{Path(file).name}:{line}({fn})" if file != "~" else fn

    parts = ("_apply", "_act", "_astep", "add_observation", "render", "encode", "record_step", "areset")
    return {
        "total_s": round(st.total_tt, 4),
        "tottime_ms": [[name(k), v[1], round(1000 * v[2], 2)] for k, v in rows[:top]],
        "cumtime_ms": {
            name(k): [v[1], round(1000 * v[3], 2)]
            for k, v in st.stats.items()
            if k[2] in parts and "turngym" in k[0]
        },
    }


# ----------------------------------------------------------------------------- async vs lock-step
async def bench_async(
    kind: str,
    n: int,
    g: int,
    turns: int,
    max_tokens: int,
    median_s: float,
    sigma: float,
    step_s: float,
    concurrency: int,
    repeats: int = 1,
    device: str = "cpu",
    hf: HFSettings | None = None,
) -> dict:
    hf = hf or HFSettings()
    if kind.startswith("sim"):
        from turngym.agents.models import load_tokenizer

        tok = load_tokenizer("tiny")
        backend = SimulatedGPU(tok, step_s, continuous=kind == "sim")
    else:
        backend, tok, _ = make_backend("hf", device, hf)
    load0 = load()
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    rec = Recorder(backend)
    agent = LLMAgent(rec, tok, sampling, max_context=2048)
    timelines: dict[str, list] = {"engine": [], "lockstep": []}
    clocks: dict[str, list] = {"engine": [], "lockstep": []}  # median SM MHz per run (CUDA)

    def breakdown(name: str, t0: float, clock: GpuClock, ticks: tuple) -> None:
        t1, trace = time.perf_counter(), taken_trace(backend)
        host = {"host_cpu": host_share(ticks)}
        if trace is not None:
            host.update(timeline(trace, rec.calls, t0, t1))
        timelines[name].append(host)
        clocks[name].append(clock.summary().get("median"))
        rec.calls.clear()
        rec.requests.clear()

    def env_factory():
        return SleepyEnv(make("arith", max_turns=turns), median_s, sigma)

    await RolloutEngine(env_factory, agent, RolloutConfig(group_size=1), env_id="arith").run(1)  # warm-up
    cfg = RolloutConfig(group_size=g, max_concurrency=concurrency)
    jobs = [(seed, k) for seed in range(n) for k in range(g)]
    if hf.compile and not kind.startswith("sim"):  # compile every bucket the timed runs will use
        await RolloutEngine(env_factory, agent, cfg, env_id="arith").run(n)
        for start in range(0, len(jobs), concurrency):
            await lockstep(env_factory, agent, jobs[start : start + concurrency])
        fresh_cache(backend)
        rec.calls.clear()
        rec.requests.clear()
    async_s, lock_s = [], []
    passes: dict[str, list] = {"engine": [], "lockstep": []}

    def counters() -> list[float]:
        st = getattr(backend, "stats", None)  # HFBackend: passes, idle seconds, prompt tokens
        keys = ("prefills", "fused", "steps", "idle_s", "prompt_tokens", "reused_tokens")
        return [st[k] for k in keys] if st else []

    for _ in range(repeats):  # interleaved pairs
        fresh_cache(backend)
        engine = RolloutEngine(env_factory, agent, cfg, env_id="arith")
        boost(device)
        c0, t0, ticks = counters(), time.perf_counter(), cpu_ticks()
        with GpuClock() as clock:
            trajs = await engine.run(n)
        async_s.append(time.perf_counter() - t0)
        passes["engine"].append([round(b - a, 2) for a, b in zip(c0, counters(), strict=True)])
        breakdown("engine", t0, clock, ticks)
        fresh_cache(backend)
        boost(device)
        c0, t0, ticks = counters(), time.perf_counter(), cpu_ticks()
        lock_turns = lock_tokens = 0
        with GpuClock() as clock:
            for start in range(0, len(jobs), concurrency):  # waves of the engine's concurrency bound
                wave = jobs[start : start + concurrency]
                turns_done, tokens = await lockstep(env_factory, agent, wave)
                lock_turns, lock_tokens = lock_turns + turns_done, lock_tokens + tokens
        lock_s.append(time.perf_counter() - t0)
        passes["lockstep"].append([round(b - a, 2) for a, b in zip(c0, counters(), strict=True)])
        breakdown("lockstep", t0, clock, ticks)
        print(f"  async pair: engine {async_s[-1]:.2f}s, lock-step {lock_s[-1]:.2f}s {passes}", flush=True)
    await backend.aclose()
    tokens = sum(sum(t.loss_mask) for t in trajs)
    if kind.startswith("sim"):
        what = "continuous" if kind == "sim" else "static"
        kind = f"simulated GPU, {step_s * 1000:.0f} ms per decode step, {what} batching"
    return {
        "backend": kind,
        "device": device if not kind.startswith("sim") else "none",
        "turns_per_trajectory": turns,
        "max_tokens": max_tokens,
        "trajectories": n * g,
        "max_concurrency": concurrency,
        "turns": engine.stats.turns,
        "lockstep_turns": lock_turns,
        "tokens": tokens,
        "lockstep_tokens": lock_tokens,
        "env_latency": f"lognormal median {median_s}s sigma {sigma}",
        "async_s": [round(x, 2) for x in async_s],
        "lockstep_s": [round(x, 2) for x in lock_s],
        "speedup": spread([lk / a for a, lk in zip(async_s, lock_s, strict=True)], 2),
        "prefill_fused_decode_idle_prompt_reused": passes,
        "timeline": timelines,
        "gpu_sm_mhz": clocks,
        "load_before_after": [load0, load()],
    }


async def lockstep(env_factory, agent, jobs: list[tuple[int, int]]) -> tuple[int, int]:
    """Baseline: every round, all live envs step together, then all live agents generate together."""
    envs = [env_factory() for _ in jobs]
    firsts = await asyncio.gather(*(e.areset(seed=seed) for e, (seed, _) in zip(envs, jobs, strict=True)))
    sessions = [
        agent.start(e, obs, seed=seed * 1000 + k, route=f"{seed}#{k}")
        for e, (obs, _), (seed, k) in zip(envs, firsts, jobs, strict=True)
    ]
    live = list(range(len(envs)))
    turns = tokens = 0
    while live:
        steps = await asyncio.gather(*(sessions[i].act() for i in live))
        results = await asyncio.gather(*(envs[i].astep(s.action) for i, s in zip(live, steps, strict=True)))
        nxt = []
        for i, s, (obs, _, term, trunc, _) in zip(live, steps, results, strict=True):
            turns += 1
            tokens += s.gen_span[1] - s.gen_span[0]
            if not (term or trunc):
                sessions[i].observe(s.action, obs)
                nxt.append(i)
        live = nxt
    for e in envs:
        await e.aclose()
    return turns, tokens


# ----------------------------------------------------------------------------- memory
class FixedBackend:
    """Answers every request with the same ``length`` ids instantly (isolates engine memory)."""

    def __init__(self, length: int):
        self.ids = [100 + i % 500 for i in range(length)]

    async def generate(self, prompt_ids, sampling, *, route=None, adapter=None):
        return Generation(list(self.ids), [-1.0] * len(self.ids), "length")

    async def aclose(self):
        pass


async def bench_memory(sizes: list[int], turns: int, gen_len: int) -> dict:
    from turngym.agents.models import load_tokenizer

    tok = load_tokenizer("tiny")
    agent = LLMAgent(FixedBackend(gen_len), tok, SamplingParams(max_tokens=gen_len), max_context=100_000)
    gate = asyncio.Event()

    class Blocking(AsyncWrapper):
        """Steps normally; the last step (turn ``turns``) blocks until the gate opens."""

        async def astep(self, action):
            out = await self.env.astep(action)
            if self.env.unwrapped.turn >= turns:
                await gate.wait()
            return out

        @property
        def unwrapped(self):
            return self.env.unwrapped

    rows = []
    for n in sizes:
        gate.clear()
        engine = RolloutEngine(
            lambda: Blocking(make("arith", max_turns=turns)),
            agent,
            RolloutConfig(max_concurrency=n, turn_timeout=None, trajectory_timeout=None),
            env_id="arith",
        )
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        run = asyncio.ensure_future(engine.run(n))
        while engine.stats.live < n or engine.stats.turns < n * (turns - 1):  # all blocked in the last step
            await asyncio.sleep(0.05)
        live_bytes = tracemalloc.get_traced_memory()[0] - base
        gate.set()
        await run
        tracemalloc.stop()
        rows.append((n, live_bytes))
    # least-squares slope and intercept
    xs, ys = [r[0] for r in rows], [r[1] for r in rows]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    icpt = my - slope * mx
    worst = max(abs(y - (icpt + slope * x)) / y for x, y in rows)
    return {
        "live_trajectories": xs,
        "bytes": ys,
        "turns_per_trajectory": turns,
        "gen_tokens_per_turn": gen_len,
        "bytes_per_live_trajectory": round(slope),
        "linear_fit_worst_rel_error": round(worst, 3),
    }


# ----------------------------------------------------------------------------- engine CPU
async def bench_engine_cpu(turn_counts: list[int], repeats: int, tokenizer: str = "tiny") -> dict:
    """Event-loop CPU per turn with an instant backend: the LLM agent (env step, chat template,
    token bookkeeping) and, as the baseline, a random agent (env step and engine only, no tokens);
    interleaved. CPU time, so load inflates it far less than wall time."""
    from turngym.agents import RandomAgent
    from turngym.agents.models import load_tokenizer

    tok = load_tokenizer("tiny")
    agents = {
        "llm_agent": LLMAgent(FixedBackend(32), tok, SamplingParams(max_tokens=32), max_context=8192),
        "no_tokens": RandomAgent(seed=0),
    }
    out: dict = {"load_before": load(), "gen_tokens_per_turn": 32, "trajectories": 64}

    async def one(agent, turns: int) -> float:
        cfg = RolloutConfig(group_size=4, max_concurrency=64)
        engine = RolloutEngine("arith", agent, cfg, env_kwargs={"max_turns": turns})
        c0 = time.thread_time()
        await engine.run(16)
        return 1000 * (time.thread_time() - c0) / engine.stats.turns

    await one(agents["llm_agent"], 2)  # warm-up
    for turns in turn_counts:
        ms: dict[str, list[float]] = {k: [] for k in agents}
        for _ in range(repeats):
            for name, agent in agents.items():
                ms[name].append(await one(agent, turns))
        out[f"{turns}_turns_ms_per_turn"] = {k: round(statistics.median(v), 3) for k, v in ms.items()}
    out["spread"] = await bench_spread(tokenizer, repeats)
    out["load_after"] = load()
    return out


class StampBackend:
    """Records when each request arrives; every generation takes ``gen_s`` (the same 32 ids), so the
    rows of a turn finish together, as in the GPU overhead benchmark's synchronised turns."""

    def __init__(self, gen_s: float = 0.01):
        self.ids, self.gen_s, self.arrivals = [100 + i for i in range(32)], gen_s, []

    async def generate(self, prompt_ids, sampling, *, route=None, adapter=None):
        self.arrivals.append(time.perf_counter())
        await asyncio.sleep(self.gen_s)
        return Generation(list(self.ids), [-1.0] * len(self.ids), "length")

    async def aclose(self):
        pass


async def bench_spread(tokenizer: str, repeats: int, n: int = 16, g: int = 4) -> dict:
    """How long the engine takes to get a turn's requests out (event-loop work, an instant backend):
    from the run's start to the first and to the last of the ``n * g`` first requests (env builds,
    resets, chat formatting, one after another on the loop), and from the first to the last of the
    second turn's (each after its env step and observation). On the GPU the backend waits for these
    arrivals while the bare replay sends a turn's requests at once (gpu_results.md, issue 19)."""
    from turngym.agents.models import load_tokenizer

    backend = StampBackend()
    agent = LLMAgent(backend, load_tokenizer(tokenizer), SamplingParams(max_tokens=32), max_context=8192)
    k = n * g

    async def one() -> tuple[float, float, float]:
        backend.arrivals.clear()
        engine = RolloutEngine(
            "arith", agent, RolloutConfig(group_size=g, max_concurrency=k), env_kwargs={"max_turns": 3}
        )
        t0 = time.perf_counter()
        await engine.run(n)
        t = sorted(backend.arrivals)
        return 1000 * (t[0] - t0), 1000 * (t[k - 1] - t0), 1000 * (t[2 * k - 1] - t[k])

    await one()  # warm-up
    runs = [await one() for _ in range(max(repeats, 3))]
    names = ("first_request_ms", "last_first_request_ms", "turn2_spread_ms")
    return {"tokenizer": tokenizer, "trajectories": k} | {
        name: round(statistics.median(r[i] for r in runs), 2) for i, name in enumerate(names)
    }
