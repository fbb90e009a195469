"""Rollout engine benchmarks: overhead, async vs lock-step, memory per live trajectory, GPU throughput.

    python benchmarks/rollout.py overhead [--backend hf|vllm]   # engine tokens/s vs the bare backend
    python benchmarks/rollout.py async [--backend hf|sim]       # engine vs lock-step, heavy-tailed env latency
    python benchmarks/rollout.py memory                         # bytes per live trajectory
    python benchmarks/rollout.py enginecpu                      # event-loop CPU per turn
    python benchmarks/rollout.py kvcache                        # in-place KV growth vs concatenation
    python benchmarks/rollout.py gpu [--parts P,..] [--json F]  # on CUDA: HF tokens/s at batch 1/16/64,
                                                                # then overhead and async with the HF backend
                                                                # (recipe and results: gpu_results.md)
    python benchmarks/rollout.py all                            # the three CPU ones

Every number is printed next to its baseline measured in the same run, runs are interleaved
(engine, baseline, engine, baseline, ...) so load drift hits both alike, and each result carries the
load average before and after (``os.getloadavg``). Ratios are reported per pair and as their median.

* overhead: the engine runs the ``arith`` env with an LLM agent (greedy) and records every request
  it makes and how many tokens came back; the same requests are then replayed against the bare
  backend with the same concurrency (one stream per trajectory, requests in order), each asked for
  exactly the tokens the engine got (no stop token), so both do the same decode work even where
  batch-dependent numerics (bf16 on GPU) would change a greedy token. On a busy CPU wall-clock ratios
  are noisy, so the event-loop thread's CPU time is also reported: the engine's own cost per turn
  (env step, chat template, bookkeeping) and the tokens/s at which the engine alone would saturate
  one core. Target: engine >= 90% of the bare backend's tokens/s.
* async: every env step sleeps a heavy-tailed latency (lognormal, default median 0.2 s, sigma 1.5;
  the same draw for the same trajectory and turn in both modes). The engine (one coroutine per
  trajectory) is compared with a lock-step loop (all envs step, then all generate, as a batch) on
  the same trajectories, both bounded to ``--concurrency`` live trajectories (the lock-step loop
  runs waves of that size; the engine refills a slot as soon as a trajectory ends).
  ``--backend hf`` uses a real model through ``HFBackend`` (continuous batching; built by the agent
  factory, ``make_token_backend``, like the CLI's and the trainer's): the tiny model on CPU, a 76M-parameter random Qwen2 in bf16 on CUDA. ``--backend sim`` / ``sim-static`` is a latency
  model of a GPU server (20 ms per decode step whatever the batch width, continuous or static
  batching). Target >= 2x.
* memory: tracemalloc while N trajectories are live (all blocked in an env step), for several N;
  reports the slope in bytes per live trajectory and the linear fit's worst relative error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import sys
import time
import tracemalloc
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from turngym.agents import Generation, LLMAgent, SamplingParams  # noqa: E402
from turngym import Env  # noqa: E402
from turngym.core.registry import make  # noqa: E402
from turngym.core.wrappers import AsyncWrapper  # noqa: E402
from turngym.rollout import RolloutConfig, RolloutEngine  # noqa: E402


# ----------------------------------------------------------------------------- helpers
class Recorder:
    """Wraps a backend and records (route, prompt_ids, sampling) of every request."""

    def __init__(self, inner, lengths: tuple[int, int] | None = None):
        self.inner, self.requests, self.lengths = inner, [], lengths
        self.calls: list[tuple] = []  # (route, called, returned) perf_counter seconds

    async def generate(self, prompt_ids, sampling, *, route=None, adapter=None):
        if self.lengths is not None:  # a length per (trajectory, turn), the same in every run
            rng = random.Random(zlib.crc32(f"{route}/{len(prompt_ids)}".encode()))
            sampling = sampling.replace(max_tokens=rng.randint(*self.lengths))
        t0 = time.perf_counter()
        gen = await self.inner.generate(prompt_ids, sampling, route=route, adapter=adapter)
        self.calls.append((route, t0, time.perf_counter()))
        self.requests.append((route, list(prompt_ids), sampling.replace(max_tokens=len(gen.token_ids))))
        return gen

    def __getattr__(self, name: str):  # release, stats, ...: the inner backend's
        return getattr(self.inner, name)

    async def aclose(self):
        pass


def fresh_cache(backend) -> None:
    """Before each run: runs reuse the same routes, so none may start from the KV the previous run
    left parked; and the backend's timeline (HF backends) starts afresh."""
    for name in ("reset_prefix_cache", "start_trace"):
        if hasattr(backend, name):
            getattr(backend, name)()


def taken_trace(backend) -> list | None:
    """The backend's timeline since ``fresh_cache`` (HF backends), else None."""
    return backend.take_trace() if hasattr(backend, "take_trace") else None


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def spread(xs: list[float], digits: int = 3) -> dict:
    """Median, min and max of a list of numbers."""
    return {
        "median": round(statistics.median(xs), digits),
        "min": round(min(xs), digits),
        "max": round(max(xs), digits),
    }


class SimulatedGPU:
    """A latency model of a GPU server where a decode step costs ``step_s`` whatever the batch width
    (the host-bound regime measured for HF generate on H100/H200). ``continuous``: a request joins
    the running batch at the next step (vLLM's continuous batching); otherwise requests wait for the
    running batch to finish and go together in the next one (static batching, as ``HFBackend`` did
    before it batched continuously).
    Returns fixed text ids, so the env sees an (invalid) action."""

    def __init__(self, tokenizer, step_s: float, continuous: bool = True):
        self.step_s, self.continuous = step_s, continuous
        self.ids = tokenizer.encode(" thinking", add_special_tokens=False)
        self.pending: list = []
        self.batches = 0
        self._runner: asyncio.Task | None = None

    async def generate(self, prompt_ids, sampling, *, route=None, adapter=None):
        n = sampling.max_tokens
        if self.continuous:
            await asyncio.sleep(self.step_s * (n + 0.5))  # on average half a step until it joins
            return Generation((self.ids * n)[:n], [-1.0] * n, "length")
        fut = asyncio.get_running_loop().create_future()
        self.pending.append((sampling.max_tokens, fut))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.ensure_future(self._run())
        return await fut

    async def _run(self):
        while self.pending:
            await asyncio.sleep(0.002)
            batch, self.pending = self.pending, []
            steps = max(n for n, _ in batch)
            await asyncio.sleep(self.step_s * steps)
            self.batches += 1
            for n, fut in batch:
                ids = (self.ids * n)[:n]
                fut.set_result(Generation(ids, [-1.0] * n, "length"))

    async def aclose(self):
        pass


class SleepyEnv(AsyncWrapper):
    """Adds a heavy-tailed latency to every step, drawn from (seed, turn) so both modes see the same."""

    def __init__(self, env, median_s: float, sigma: float):
        super().__init__(env)
        self.median_s, self.sigma, self.seed, self.turn = median_s, sigma, 0, 0

    async def areset(self, *, seed=None, options=None):
        self.seed, self.turn = seed or 0, 0
        return await self.env.areset(seed=seed, options=options)

    async def astep(self, action):
        self.turn += 1
        rng = random.Random(self.seed * 7919 + self.turn)
        await asyncio.sleep(self.median_s * math.exp(self.sigma * rng.gauss(0, 1)))
        return await self.env.astep(action)

    @property
    def unwrapped(self):
        return self.env.unwrapped


BIG = dict(
    hidden_size=768,
    intermediate_size=2048,
    num_hidden_layers=12,
    num_attention_heads=12,
    num_key_value_heads=4,
)


def model_path(device: str):
    """``--hf-model`` when given; else the tiny model on CPU, a 76M-parameter random Qwen2 (loaded in
    bf16) on CUDA."""
    from turngym.agents.models import resolve_model
    from turngym.agents.tiny import TinyConfig, tiny_model_path

    if HF_MODEL:
        return resolve_model(HF_MODEL)
    return tiny_model_path(TinyConfig(**BIG) if device.startswith("cuda") else TinyConfig())


REUSE_PREFIX = True  # HFBackend prefix reuse (``--no-reuse`` turns it off, for comparison)
CUDNN_ATTENTION = False  # HFBackend may use cuDNN's attention kernel (``--cudnn-attention``)
HF_PROCESS = False  # the model in a worker process (HFProcessBackend), ``--hf-process``
HF_ENGINE = "continuous"  # the HF engine (``--hf-engine``: continuous, slots or auto)
HF_COMPILE: str | None = None  # the slots engine's torch.compile setting (``--hf-compile``)
HF_MODEL: str | None = None  # the overhead/async parts' model (``--hf-model``; default: model_path's)
HF_OPTIONS: dict = {}  # further HF engine settings (``--hf-option K=V``, e.g. overlap_prefill=false)
PROFILE_LOOP = False  # overhead: one more engine run under cProfile after the pairs (``--profile-loop``)


def make_backend(kind: str, device: str = "cpu", fuse_tokens: int | None = None):
    """(backend, tokenizer, server or None) for ``hf`` or ``vllm`` (vLLM: a local CPU server)."""
    from turngym.agents.factory import AgentSpec, make_token_backend
    from turngym.agents.models import load_tokenizer

    if kind == "hf":
        path = str(model_path(device))
        tok = load_tokenizer(path)
        spec = AgentSpec(
            kind="hf_worker" if HF_PROCESS else "hf",
            model=path,
            hf_engine=HF_ENGINE,
            hf_compile=HF_COMPILE,
            max_context=4096,
            max_batch_size=64,
        )
        backend = make_token_backend(
            spec,
            tokenizer=tok,
            max_wait_ms=2,
            device=device,
            fuse_tokens=fuse_tokens,
            reuse_prefix=REUSE_PREFIX,
            cudnn_attention=CUDNN_ATTENTION,
            **HF_OPTIONS,
        )
        return backend, tok, None
    from turngym.agents.vllm import VLLMServer

    server = VLLMServer("tiny", max_model_len=1024, dtype="float32", enable_lora=False).start()
    backend = make_token_backend(AgentSpec(kind="vllm", model="tiny", urls=[server.url]))
    return backend, load_tokenizer("tiny"), server


class GpuClock:
    """SM clock samples (MHz, from nvidia-smi) while a run is timed. On the lent GPUs an idle card
    sits at ~345 MHz and boosts to ~1980 MHz under load; a launch-bound small-model workload may not
    lift it, which changes a pass's time ~5x. Each CUDA run is preceded by ``boost`` and reports its
    clocks, so runs are compared at the clocks they ran at. No-op without nvidia-smi."""

    def __init__(self, period_s: float = 0.2):
        self.period_s, self.mhz, self._stop = period_s, [], None

    def _sample(self) -> None:
        import subprocess

        while not self._stop.wait(self.period_s):
            try:
                out = subprocess.run(
                    ["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits"],
                    capture_output=True,
                    text=True,
                    timeout=5,
                ).stdout
                self.mhz.append(int(out.split()[0]))
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                return

    def __enter__(self):
        import threading

        self.mhz, self._stop = [], threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self._stop.set()

    def summary(self) -> dict:
        return spread([float(x) for x in self.mhz], 0) if self.mhz else {}


def cpu_ticks() -> tuple[int, int, int]:
    """(busy, steal, total) jiffies of all CPUs from /proc/stat; zeros where it is missing."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0, 0
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    steal = v[7] if len(v) > 7 else 0
    return sum(v[:8]) - idle - steal, steal, sum(v[:8])


def host_share(t0: tuple[int, int, int]) -> dict:
    """Since ``t0 = cpu_ticks()``: the share of all CPUs' time that was busy and that the hypervisor
    stole (a throttled virtual machine shows as steal)."""
    t1 = cpu_ticks()
    total = max(1, t1[2] - t0[2])
    return {"busy": round((t1[0] - t0[0]) / total, 3), "steal": round((t1[1] - t0[1]) / total, 3)}


def boost(device: str, seconds: float = 1.0) -> None:
    """Raise the GPU's clocks before a timed run: dense bf16 matrix products for ``seconds``."""
    if not device.startswith("cuda"):
        return
    import torch

    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()


class Heartbeat:
    """Event-loop responsiveness: how late a 1 ms ``asyncio.sleep`` wakes up, while it runs."""

    def __init__(self, period_s: float = 0.001):
        self.period_s, self.lags, self._task = period_s, [], None

    async def _beat(self) -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(self.period_s)
            self.lags.append(time.perf_counter() - t0 - self.period_s)

    def __enter__(self):
        self.lags = []
        self._task = asyncio.ensure_future(self._beat())
        return self

    def __exit__(self, *exc):
        self._task.cancel()

    def summary(self) -> dict:
        return pctl_ms(self.lags)


def pctl_ms(xs: list[float]) -> dict:
    """Median, p90 and max of durations in seconds, as milliseconds."""
    if not xs:
        return {}
    xs = sorted(xs)
    return {
        "p50": round(1000 * statistics.median(xs), 2),
        "p90": round(1000 * xs[round(0.9 * (len(xs) - 1))], 2),
        "max": round(1000 * xs[-1], 2),
    }


def timeline(trace: list[tuple], calls: list[tuple], t0: float, t1: float) -> dict:
    """Where the wall time of one run went, from ``HFBackend.trace`` and the caller's (route, called,
    returned) stamps: the scheduler thread's time in forward passes (by kind), idle with nothing to
    run, and in between (gathering arrivals, retiring, compacting); per request, the wait from the
    call to the pass that admitted it, from the scheduler's delivery to the caller's resumption (the
    thread hand-off), and from one call's return to the same trajectory's next call (the engine's
    own turn: env step, observation tokens, prompt)."""
    passes = [e for e in trace if e[0] == "pass" and t0 <= e[1] <= t1]
    idle = sum(max(0.0, min(e[2], t1) - max(e[1], t0)) for e in trace if e[0] == "idle")
    # the wait the scheduler is in at t1 (every request done) is recorded only when it ends
    last = max([t0, *(e[2] for e in trace if e[0] in ("pass", "idle") and e[2] <= t1)])
    idle += t1 - last
    reqs = [e for e in trace if e[0] == "req" and t0 <= e[2] <= t1]
    wall = t1 - t0
    out: dict = {"wall_s": round(wall, 3)}
    for kind in ("prefill", "fused", "decode"):
        ds = [e[2] - e[1] for e in passes if e[3] == kind]
        if ds:
            out[f"{kind}_passes"] = len(ds)
            out[f"{kind}_ms"] = {**pctl_ms(ds), "sum_s": round(sum(ds), 3)}
            # the scheduler thread's CPU time in those passes (wall time above it: waiting)
            out[f"{kind}_cpu_ms"] = pctl_ms([e[8] for e in passes if e[3] == kind])
            # until the model call returned: on a GPU the host's time to queue the pass's kernels
            out[f"{kind}_fwd_ms"] = pctl_ms([e[9] for e in passes if e[3] == kind and len(e) > 9])
    busy = sum(e[2] - e[1] for e in passes)
    out["busy_idle_other_s"] = [round(busy, 3), round(idle, 3), round(wall - busy - idle, 3)]
    out["admit_wait_ms"] = pctl_ms([e[3] - e[2] for e in reqs if e[3] >= e[2]])
    delivered: dict = {}  # route -> delivery times in order
    for e in sorted(reqs, key=lambda e: e[4]):
        delivered.setdefault(e[1], []).append(e[4])
    handoff, gaps, by_route = [], [], {}
    for route, called, returned in calls:
        if t0 <= called <= t1:
            by_route.setdefault(route, []).append((called, returned))
    for route, cs in by_route.items():
        cs.sort()
        for (_, returned), done in zip(cs, delivered.get(route, []), strict=False):
            handoff.append(returned - done)
        gaps += [nxt[0] - prev[1] for prev, nxt in zip(cs, cs[1:], strict=False)]
    out["handoff_ms"] = pctl_ms(handoff)
    out["turn_gap_ms"] = pctl_ms(gaps)
    return out


# ----------------------------------------------------------------------------- overhead
NEVER = (-1,)  # a stop id no model samples: a replayed request generates exactly max_tokens


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
) -> dict:
    """``lengths=(lo, hi)``: each (trajectory, turn) generates a fixed number of tokens drawn from
    [lo, hi] instead of ``max_tokens``, so trajectories reach their turn boundaries at different times."""
    backend, tok, server = make_backend(kind, device, fuse_tokens)
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
        if PROFILE_LOOP:  # not one of the pairs: its records are dropped
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
) -> dict:
    if kind.startswith("sim"):
        from turngym.agents.models import load_tokenizer

        tok = load_tokenizer("tiny")
        backend = SimulatedGPU(tok, step_s, continuous=kind == "sim")
    else:
        backend, tok, _ = make_backend("hf", device)
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
    if HF_COMPILE and not kind.startswith("sim"):  # compile every bucket the timed runs will use
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
async def bench_engine_cpu(turn_counts: list[int], repeats: int) -> dict:
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
    out["spread"] = await bench_spread(HF_MODEL or "tiny", repeats)
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


# ----------------------------------------------------------------------------- GPU
async def bench_throughput(batches: list[int], prompt_len: int, new_tokens: int, device: str) -> dict:
    """HF backend tokens/s through concurrent ``generate`` calls, each shape warmed up first."""
    import torch

    from turngym.agents.factory import AgentSpec, make_token_backend

    spec = AgentSpec(
        kind="hf", model=str(model_path(device)), hf_engine="continuous", max_batch_size=max(batches)
    )
    backend = make_token_backend(spec, max_wait_ms=20, device=device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    n_params = sum(p.numel() for p in backend.model.parameters())
    rng = random.Random(0)
    vocab = backend.model.config.vocab_size
    sampling = SamplingParams(max_tokens=new_tokens, temperature=1.0, stop_token_ids=NEVER)
    name = torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu"
    out = {"device": name, "params_M": round(n_params / 1e6, 1), "dtype": str(backend.model.dtype)}
    out["prompt_len"], out["new_tokens"] = prompt_len, new_tokens
    for b in [1, *batches]:
        prompts = [[rng.randrange(10, vocab - 10) for _ in range(prompt_len)] for _ in range(b)]
        await asyncio.gather(*(backend.generate(p, sampling) for p in prompts))  # warm-up at this shape
        sync()
        t0 = time.perf_counter()
        gens = await asyncio.gather(*(backend.generate(p, sampling) for p in prompts))
        sync()
        dt = time.perf_counter() - t0
        out[f"batch_{b}_tok_s"] = round(sum(len(g.token_ids) for g in gens) / dt, 1)
    out["max_width"] = max(backend.stats["widths"])
    await backend.aclose()
    return out


HBM_BYTES_S = {"H100": 3.35e12, "H200": 4.8e12, "A100": 2.0e12}  # peak memory bandwidth by card


def memory_bound_step_ms(model, batch: int, context: int, card: str) -> float | None:
    """The decode step's floor on this card: the weights and every row's KV read once per step at
    peak memory bandwidth (None for an unknown card)."""
    bw = next((v for k, v in HBM_BYTES_S.items() if k in card), None)
    if bw is None:
        return None
    cfg = model.config
    size = next(model.parameters()).element_size()
    weights = sum(p.numel() for p in model.parameters()) * size
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    kv = batch * context * cfg.num_hidden_layers * 2 * kv_heads * head_dim * size
    return round(1000 * (weights + kv) / bw, 4)


async def bench_engines(
    model_name: str, batches: list[int], prompt_len: int, new_tokens: int, compile: str | None = None
) -> dict:
    """Decode throughput of the HF engines on one card, in one run: the continuous engine
    (``HFBackend``, eager passes), the slots engine (``HFSlotBackend``, CUDA-graph decode blocks of
    turngym's own forward, ``hf_fast``, with its Triton kernels, ``hf_triton``, where they run), the
    same with torch ops in place of those kernels (``slots_torch``: kernels="torch", the engine of
    session 12), the slots engine on transformers' forward with one step a replay (``slots_hf``:
    fast=False, decode_block=1, the engine of session 11), with ``compile`` also the slots
    engine with its decode step compiled before capture (``slots_compile``, compile seconds per shape
    beside it), and plain transformers ``generate``; each shape warmed up first; sampled, no stop
    token. Beside each figure the memory-bound floor of a decode step; first, whether the slots
    engine's greedy and seeded ids with graphs equal its eager ids, and its greedy ids those of
    transformers' forward (slots_hf) and of the continuous engine."""
    import torch

    from turngym.agents.hf import HFBackend
    from turngym.agents.hf_slots import HFSlotBackend
    from turngym.agents.models import load_model, load_tokenizer, resolve_model

    path = resolve_model(model_name)
    tok = load_tokenizer(path)
    model = load_model(path, device="cuda")  # bf16
    card = torch.cuda.get_device_name(0)
    n_params = sum(p.numel() for p in model.parameters())
    out: dict = {"device": card, "model": model_name, "params_M": round(n_params / 1e6, 1)}
    out.update(dtype=str(model.dtype), prompt_len=prompt_len, new_tokens=new_tokens)
    context = max(prompt_len + new_tokens, 512)  # the greedy checks' chat prompts fit too
    width = max(batches)
    slots = HFSlotBackend(model, tok, max_batch_size=width, max_context=context, max_wait_ms=20)
    out["fast_forward"] = slots.fast_problem or "on"
    slots_hf = HFSlotBackend(
        model, tok, max_batch_size=width, max_context=context, max_wait_ms=20, fast=False, decode_block=1
    )
    torch_ops = HFSlotBackend(
        model, tok, max_batch_size=width, max_context=context, max_wait_ms=20, kernels="torch"
    )
    cont = HFBackend(model, tok, max_batch_size=width, max_wait_ms=20)
    engines = [("continuous", cont), ("slots", slots), ("slots_torch", torch_ops), ("slots_hf", slots_hf)]
    fused = None
    if compile:
        fused = HFSlotBackend(
            model, tok, max_batch_size=width, max_context=context, max_wait_ms=20, compile=compile
        )
        engines.append(("slots_compile", fused))
    out["compile"] = compile
    eager = HFSlotBackend(model, tok, max_batch_size=8, max_context=context, cuda_graphs=False)
    rng = random.Random(0)
    vocab = model.config.vocab_size
    texts = ["What is the capital of France?", "Write a haiku about rain.", "Count to twenty.", "Hi!"]
    chats = [
        tok.encode(
            tok.apply_chat_template(
                [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False
            ),
            add_special_tokens=False,
        )
        for t in texts
    ]
    greedy = SamplingParams(max_tokens=48, temperature=0.0)
    ids = {}
    for name, b in (("eager", eager), *engines):
        gens = await asyncio.gather(*(b.generate(c, greedy) for c in chats))
        ids[name] = [g.token_ids for g in gens]
    out["greedy_graphs_eq_eager"] = ids["slots"] == ids["eager"]
    out["greedy_graphs_eq_hf_forward"] = ids["slots"] == ids["slots_hf"]
    out["greedy_graphs_eq_continuous"] = ids["slots"] == ids["continuous"]
    out["greedy_hf_forward_eq_continuous"] = ids["slots_hf"] == ids["continuous"]
    out["greedy_graphs_eq_torch_kernels"] = ids["slots"] == ids["slots_torch"]
    if fused is not None:
        out["greedy_compiled_eq_eager"] = ids["slots_compile"] == ids["eager"]
    out["greedy_first_differing_prompt"] = next(
        (i for i, (a, b) in enumerate(zip(ids["slots"], ids["continuous"], strict=True)) if a != b), None
    )
    sampled = SamplingParams(max_tokens=32, temperature=1.0, seed=11)
    s1 = [(await slots.generate(c, sampled)).token_ids for c in chats]
    s2 = [(await eager.generate(c, sampled)).token_ids for c in chats]
    out["seeded_graphs_eq_eager"] = s1 == s2
    if fused is not None:
        s3 = [(await fused.generate(c, sampled)).token_ids for c in chats]
        out["seeded_compiled_eq_eager"] = s3 == s2
        # whether the compiled engine really replays captured graphs (a failed capture leaves it
        # decoding eagerly through dynamo): printed now, so that a run cut off early still shows it
        graph_keys = ("compiles", "compile_fallbacks", "graph_captures", "graph_fallbacks", "eager_decodes")
        out["compiled_graph_stats"] = {k: fused.stats.get(k) for k in graph_keys}
    # after the checks' passes: a kernel that failed there has switched the pass to torch ops
    out["fast_kernels"] = slots._fast.kernels if slots._fast is not None else None
    out["kernels_problem"] = slots._fast.kernels_problem if slots._fast is not None else None
    checks = {
        k: v
        for k, v in out.items()
        if "_eq_" in k or k.endswith("_stats") or k in ("fast_forward", "fast_kernels", "kernels_problem")
    }
    print("engines checks", checks, flush=True)
    await eager.aclose()
    sampling = SamplingParams(max_tokens=new_tokens, temperature=1.0, stop_token_ids=NEVER)
    for b in [1, *batches]:
        prompts = [[rng.randrange(10, vocab - 10) for _ in range(prompt_len)] for _ in range(b)]
        row: dict = {}
        for name, backend in engines:
            compile_s = fused.stats["compile_s"] if backend is fused else 0.0
            for _ in range(2):  # the first run warms up this shape (compiles, captures its graphs)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                gens = await asyncio.gather(*(backend.generate(p, sampling) for p in prompts))
                torch.cuda.synchronize()
                dt = time.perf_counter() - t0
            row[f"{name}_tok_s"] = round(sum(len(g.token_ids) for g in gens) / dt, 1)
            row[f"{name}_step_ms"] = round(1000 * dt / new_tokens, 2)
            if backend is fused:
                row["slots_compile_compile_s"] = round(fused.stats["compile_s"] - compile_s, 1)
                row["slots_compile_eager_decodes"] = fused.stats.get("eager_decodes")
        x = torch.tensor(prompts, device="cuda")
        for _ in range(2):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.inference_mode():
                model.generate(
                    input_ids=x,
                    attention_mask=torch.ones_like(x),
                    max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens,
                    do_sample=True,
                    pad_token_id=tok.pad_token_id or tok.eos_token_id,
                )
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
        row["generate_tok_s"] = round(b * new_tokens / dt, 1)
        for base in ("continuous", "slots_torch", "slots_hf", "generate"):
            row[f"slots_over_{base}"] = round(row["slots_tok_s"] / row[f"{base}_tok_s"], 2)
        if fused is not None:
            row["slots_compile_over_slots"] = round(row["slots_compile_tok_s"] / row["slots_tok_s"], 2)
        row["memory_bound_step_ms"] = memory_bound_step_ms(model, b, prompt_len + new_tokens // 2, card)
        out[f"batch_{b}"] = row
        print("engines", b, row, flush=True)
    for name, backend in engines[1:]:
        out[f"{name}_stats"] = {k: v for k, v in backend.stats.items() if k != "widths"}
        await backend.aclose()
    await cont.aclose()
    return out


def bench_kvcache(batch: int, prompt_len: int, new_tokens: int, repeats: int, device: str) -> dict:
    """HF backend decode tokens/s with its in-place growing KV cache vs transformers' concatenating
    ``DynamicLayer`` (a new allocation and a copy of the whole cache per layer and step); same
    requests, interleaved runs. On CUDA also the allocator's segment allocations (cudaMalloc calls)."""
    import torch

    from turngym.agents import hf

    backend = hf.HFBackend(model_path(device), device=device, max_batch_size=batch)
    rng = random.Random(0)
    vocab = backend.model.config.vocab_size
    prompts = [[rng.randrange(10, vocab - 10) for _ in range(prompt_len)] for _ in range(batch)]
    sampling = SamplingParams(max_tokens=new_tokens, temperature=0.0, stop_token_ids=NEVER)
    growing = hf._growing_cache

    def plain(config):
        from transformers import DynamicCache

        return DynamicCache(config=config)

    cuda = device.startswith("cuda")
    out: dict = {"device": device, "batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens}
    runs: dict[str, list] = {"growing": [], "concat": []}
    mallocs: dict[str, list] = {"growing": [], "concat": []}
    try:
        for _ in range(repeats + 1):  # the first round warms up
            for name, fn in (("growing", growing), ("concat", plain)):
                hf._growing_cache = fn
                if cuda:
                    torch.cuda.synchronize()
                    seg0 = torch.cuda.memory_stats().get("segment.all.allocated", 0)
                t0 = time.perf_counter()
                gens = backend.generate_batch(prompts, [sampling] * batch)
                dt = time.perf_counter() - t0
                runs[name].append(sum(len(g.token_ids) for g in gens) / dt)
                if cuda:
                    mallocs[name].append(torch.cuda.memory_stats().get("segment.all.allocated", 0) - seg0)
    finally:
        hf._growing_cache = growing
    out["tok_s"] = {k: [round(x, 1) for x in v[1:]] for k, v in runs.items()}
    if cuda:
        out["cuda_segment_allocations"] = {k: v[1:] for k, v in mallocs.items()}
    ratios = [a / b for a, b in zip(runs["growing"][1:], runs["concat"][1:], strict=True)]
    out["growing_over_concat"] = spread(ratios)
    out["load_before_after"] = load()
    return out


def async_from_args(args, kind: str, device: str):
    """``bench_async`` with the command line's settings (simulated decode step: 20 ms)."""
    n = args.n if args.n is not None else 32
    if n * args.g <= args.concurrency:
        print(
            f"async: {n * args.g} trajectories fill --concurrency {args.concurrency} once: one wave, "
            "so the engine can gain only that wave's tail over lock-step (see -n)",
            flush=True,
        )
    return bench_async(
        kind,
        n,
        args.g,
        args.turns,
        args.max_tokens,
        args.median,
        args.sigma,
        step_s=0.02,
        concurrency=args.concurrency,
        repeats=args.repeats,
        device=device,
    )


def bench_gpu(args, emit) -> None:
    """Everything on CUDA with the HF backend (``--parts`` picks): throughput at batch 1/16/64; the
    in-place KV cache vs concatenation; engine overhead (``--repeats`` pairs) with the model in a
    worker process and in-process (turns of ``--turn-tokens``, default 32), in-process with cuDNN attention allowed,
    and in a worker with 16-96-token turns; async vs lock-step with the worker (``-n``, ``-g``,
    ``--turns``, ``--repeats``)."""
    import torch

    global HF_PROCESS, CUDNN_ATTENTION
    if not torch.cuda.is_available():
        emit("gpu", {"skipped": "no CUDA device"})
        return
    parts = set(args.parts.split(","))
    if "engines" in parts:
        emit("engines", asyncio.run(bench_engines(args.model, [16, 64, 256], 256, 128, HF_COMPILE)))
    if "throughput" in parts:
        emit("throughput", asyncio.run(bench_throughput([16, 64], 256, 128, "cuda")))
    if "kvcache" in parts:
        emit("kvcache", bench_kvcache(64, 256, 256, 3, "cuda"))
    for process in (True, False):
        HF_PROCESS = process
        name = "overhead_process" if process else "overhead_in_process"
        if name.removeprefix("overhead_") in parts:
            res = asyncio.run(bench_overhead("hf", 16, 4, 3, args.turn_tokens, args.repeats, device="cuda"))
            emit(name, {**engine_setting(), **res})
    if "cudnn" in parts:  # in-process, SDPA allowed cuDNN's kernel (per-shape plans)
        HF_PROCESS, CUDNN_ATTENTION = False, True
        res = asyncio.run(bench_overhead("hf", 16, 4, 3, args.turn_tokens, args.repeats, device="cuda"))
        emit("overhead_in_process_cudnn", res)
        CUDNN_ATTENTION = False
    HF_PROCESS = True
    if "varied" in parts:
        varied = bench_overhead("hf", 16, 4, 3, 32, args.repeats, device="cuda", lengths=(16, 96))
        emit("overhead_varied_process", {**engine_setting(), **asyncio.run(varied)})
    if "async" in parts:
        emit("async_process", {**engine_setting(), **asyncio.run(async_from_args(args, "hf", "cuda"))})


def engine_option(text: str) -> tuple[str, object]:
    """``K=V`` as (K, V), V parsed as JSON where it is JSON (``false``, ``8``), else kept a string."""
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise SystemExit(f"--hf-option wants K=V, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def engine_setting() -> dict:
    """Which HF backend a result measured (the engine, its compile setting, the model)."""
    return {
        "hf_engine": HF_ENGINE,
        "hf_compile": HF_COMPILE,
        "hf_model": str(HF_MODEL or "default"),
        **({"hf_options": HF_OPTIONS} if HF_OPTIONS else {}),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "what",
        choices=["overhead", "async", "memory", "enginecpu", "kvcache", "gpu", "all"],
        nargs="?",
        default="all",
    )
    ap.add_argument(
        "--backend",
        choices=["hf", "vllm", "sim", "sim-static"],
        default="hf",
        help="sim / sim-static: simulated GPU with continuous / static batching (async benchmark only)",
    )
    ap.add_argument("--turns", type=int, default=4, help="async: turns per trajectory")
    ap.add_argument(
        "--concurrency", type=int, default=32, help="async: live trajectories (lock-step wave size)"
    )
    ap.add_argument("--max-tokens", type=int, default=32, help="async: tokens per generation")
    ap.add_argument(
        "--turn-tokens",
        type=int,
        default=32,
        help="gpu process/in_process/cudnn parts: tokens each turn generates (the issue's table: 128)",
    )
    ap.add_argument("--median", type=float, default=0.2, help="async: median env step latency (s)")
    ap.add_argument("--sigma", type=float, default=1.5, help="async: lognormal sigma of env latency")
    ap.add_argument(
        "-n",
        type=int,
        help="tasks (each run -g times); default 8, and 32 for async: 128 trajectories through "
        "--concurrency 32 slots, as issue 19's target is stated. With one wave (n x g <= concurrency) "
        "async and lock-step differ only by that wave's slowest env: a simulated 4 ms decode step "
        "measured 1.36x with 32 trajectories, 2.93x with 128",
    )
    ap.add_argument("-g", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3, help="overhead/async: interleaved run pairs")
    ap.add_argument("--device", default="cpu", help="overhead/async with --backend hf: cpu or cuda")
    ap.add_argument("--json", help="also append each result as a JSON line to this file")
    ap.add_argument(
        "--parts",
        default="throughput,kvcache,process,in_process,cudnn,varied,async",
        help="gpu: which parts to run (overhead in the worker process / in-process / varied turns)",
    )
    ap.add_argument("--model", default="smollm2-135m", help="gpu engines: the model (a name, path or hub id)")
    ap.add_argument(
        "--hf-engine",
        default="continuous",
        choices=["auto", "continuous", "slots"],
        help="HF backend engine for the overhead/async/process parts (turngym.agents.hf_engines)",
    )
    ap.add_argument(
        "--hf-compile",
        help="the slots engine's torch.compile setting (turngym.agents.hf_engines.COMPILE_SETTINGS): "
        "for the overhead/async/process parts and the engines part's slots_compile column (default "
        "off: no such column)",
    )
    ap.add_argument(
        "--hf-model",
        help="the overhead/async/process parts' model (a name, path or hub id, e.g. smollm2-135m); "
        "default: the tiny model on CPU, a 76M random Qwen2 on CUDA",
    )
    ap.add_argument(
        "--hf-option",
        action="append",
        default=[],
        metavar="K=V",
        help="a further HF engine constructor setting (V parsed as JSON, else a string), e.g. "
        "overlap_prefill=false; repeatable",
    )
    ap.add_argument("--no-reuse", action="store_true", help="HF backend: no prefix reuse across turns")
    ap.add_argument(
        "--cudnn-attention", action="store_true", help="HF backend on CUDA: allow cuDNN's SDPA kernel"
    )
    ap.add_argument(
        "--hf-process", action="store_true", help="HF backend in a worker process (HFProcessBackend)"
    )
    ap.add_argument(
        "--switch-interval",
        type=float,
        help="sys.setswitchinterval seconds (how long a thread may hold the GIL while another waits)",
    )
    ap.add_argument(
        "--profile-loop",
        action="store_true",
        help="overhead: one more engine run under cProfile (the event loop's CPU by function)",
    )
    ap.add_argument("--lengths", help="overhead: LO:HI tokens per turn (varied per trajectory and turn)")
    ap.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads for CPU runs (on a shared, oversubscribed CPU more threads spin "
        "against other jobs: a tiny-model pass measured 38 ms with 2 threads, 1.2 ms with 1); 0 = torch's default",
    )
    args = ap.parse_args()
    global REUSE_PREFIX, HF_PROCESS, CUDNN_ATTENTION, HF_ENGINE, HF_COMPILE, HF_MODEL, PROFILE_LOOP
    PROFILE_LOOP = args.profile_loop
    REUSE_PREFIX, HF_PROCESS, HF_ENGINE = not args.no_reuse, args.hf_process, args.hf_engine
    HF_COMPILE, HF_MODEL = args.hf_compile, args.hf_model
    HF_OPTIONS.update(engine_option(o) for o in args.hf_option)
    CUDNN_ATTENTION = args.cudnn_attention
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    if args.torch_threads > 0 and args.what != "gpu":
        import torch

        torch.set_num_threads(args.torch_threads)

    def emit(what: str, res: dict) -> None:
        print(what, res, flush=True)
        labels = (
            ("speedup", "speedup"),
            ("engine_over_bare", "ratio_engine_vs_bare"),
            ("growing_over_concat", "ratio_growing_vs_concat_kv"),
        )
        for key, label in labels:
            if isinstance(res.get(key), dict):  # a one-line summary for the bench report
                print(f"{what}: {label}={res[key]['median']} (median of interleaved pairs)", flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps({"what": what, **res}) + "\n")

    if args.what == "gpu":
        bench_gpu(args, emit)
        return
    todo = ["overhead", "async", "memory"] if args.what == "all" else [args.what]
    for what in todo:
        if what == "overhead":
            lengths = tuple(int(x) for x in args.lengths.split(":")) if args.lengths else None
            res = asyncio.run(
                bench_overhead(args.backend, args.n or 8, args.g, 3, 32, args.repeats, args.device, lengths)
            )
        elif what == "async":
            kind = args.backend if args.backend.startswith("sim") else "hf"
            res = asyncio.run(async_from_args(args, kind, args.device))
        elif what == "enginecpu":
            res = asyncio.run(bench_engine_cpu([3, 8], args.repeats))
        elif what == "kvcache":
            res = bench_kvcache(32, 128, 256, args.repeats, args.device)
        else:
            res = asyncio.run(bench_memory([32, 128, 512], turns=3, gen_len=64))
        emit(what, res)


if __name__ == "__main__":
    main()
