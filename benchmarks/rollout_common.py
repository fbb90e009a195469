"""What the rollout benchmarks share: request recording, load and spread, the simulated GPU and the
slow env, the HF backend they measure (``HFSettings``, built through the agent factory), GPU clocks,
host CPU shares and the wall-time breakdown of a run (``timeline``). See ``benchmarks/rollout.py``."""

from __future__ import annotations

import asyncio
import math
import os
import random
import statistics
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from turngym.agents import Generation  # noqa: E402
from turngym.core.wrappers import AsyncWrapper  # noqa: E402


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


def model_path(device: str, model: str | None = None):
    """``model`` (``--hf-model``) when given; else the tiny model on CPU, a 76M-parameter random Qwen2 (loaded in
    bf16) on CUDA."""
    from turngym.agents.models import resolve_model
    from turngym.agents.tiny import TinyConfig, tiny_model_path

    if model:
        return resolve_model(model)
    return tiny_model_path(TinyConfig(**BIG) if device.startswith("cuda") else TinyConfig())


@dataclass(frozen=True)
class HFSettings:
    """Which HF backend the overhead and async parts build (the command line's ``--hf-*`` options):
    the engine, its compile setting, the model (None: ``model_path``'s default), the engine in a
    worker process or not, prefix reuse, cuDNN attention, further engine constructor settings."""

    engine: str = "continuous"
    compile: str | None = None
    model: str | None = None
    process: bool = False
    reuse_prefix: bool = True
    cudnn_attention: bool = False
    options: dict = field(default_factory=dict)

    def describe(self) -> dict:
        """Which HF backend a result measured (the engine, its compile setting, the model)."""
        return {
            "hf_engine": self.engine,
            "hf_compile": self.compile,
            "hf_model": str(self.model or "default"),
            **({"hf_options": self.options} if self.options else {}),
        }


def make_backend(
    kind: str, device: str = "cpu", hf: HFSettings | None = None, fuse_tokens: int | None = None
):
    """(backend, tokenizer, server or None) for ``hf`` (as ``hf`` says, through the agent factory) or
    ``vllm`` (a local CPU server)."""
    from turngym.agents.factory import AgentSpec, make_token_backend
    from turngym.agents.models import load_tokenizer

    if kind == "hf":
        hf = hf or HFSettings()
        path = str(model_path(device, hf.model))
        tok = load_tokenizer(path)
        spec = AgentSpec(
            kind="hf_worker" if hf.process else "hf",
            model=path,
            hf_engine=hf.engine,
            hf_compile=hf.compile,
            max_context=4096,
            max_batch_size=64,
        )
        backend = make_token_backend(
            spec,
            tokenizer=tok,
            max_wait_ms=2,
            device=device,
            fuse_tokens=fuse_tokens,
            reuse_prefix=hf.reuse_prefix,
            cudnn_attention=hf.cudnn_attention,
            **hf.options,
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


NEVER = (-1,)  # a stop id no model samples: a replayed request generates exactly max_tokens
