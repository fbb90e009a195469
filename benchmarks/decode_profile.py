"""Where a decode step of the slots engine spends its time on CUDA (issue 19).

    python benchmarks/decode_profile.py [--model smollm2-135m] [--batches 1 64 256] [--json F]

For each forward of the slots engine (``fast``: turngym's own, ``turngym.agents.hf.kernels.fast``, with its
Triton kernels where they run; ``fast-torch``: the same with torch ops; ``hf``: transformers') and
batch width, the engines benchmark's workload (prompt 256 random ids, 128 sampled tokens,
no stop token, the shape warmed up first), through ``HFSlotBackend`` with its trace on:

* ``engine``: the wall-clock per decode step as the scheduler runs it (median pass, median gap
  between passes, the host's CPU per pass, the time until ``replay()`` returned) and the whole
  generation's tokens/s (prefill included, as the engines benchmark counts it);
* ``graph``: the captured step replayed back to back, timed with CUDA events (the GPU's time for a
  step with no host in the way), and the model pass alone captured the same way, so the sampling's
  share is their difference;
* ``kernels``: one eager step under ``torch.profiler``: the kernels a step launches, their count and
  device time by name (the top ones), and their sum (the GPU's busy time, without launch gaps).

The step's floor (weights and the rows' KV read once at the card's peak bandwidth) is printed beside
each. No tokens are compared here: the engines benchmark checks correctness.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.engines import memory_bound_step_ms  # noqa: E402
from benchmarks.rollout_common import NEVER  # noqa: E402
from turngym.agents import SamplingParams  # noqa: E402


def _median(xs: list[float]) -> float:
    return round(statistics.median(xs), 3) if xs else float("nan")


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def engine_run(backend, prompts: list[list[int]], new_tokens: int) -> dict:
    """Generate twice (the first warms the shape up); the second's trace, per decode pass."""
    sampling = SamplingParams(max_tokens=new_tokens, temperature=1.0, stop_token_ids=NEVER)

    async def run() -> float:
        sync()
        t0 = time.perf_counter()
        await asyncio.gather(*(backend.generate(p, sampling) for p in prompts))
        sync()
        return time.perf_counter() - t0

    asyncio.run(run())
    backend.start_trace()
    dt = asyncio.run(run())
    trace = backend.take_trace()
    backend.trace = None
    passes = [e for e in trace if e[0] == "pass"]
    decode = [e for e in passes if e[3] == "decode"]
    prefill = [e for e in passes if e[3] == "prefill"]
    gaps = [b[1] - a[2] for a, b in zip(decode, decode[1:], strict=False)]
    steps = [e[10] if len(e) > 10 else 1 for e in decode]  # a pass is a block of this many steps
    return {
        "tok_s": round(len(prompts) * new_tokens / dt, 1),
        "ms_per_token_step": round(1000 * dt / new_tokens, 3),
        "decode_passes": len(decode),
        "steps_per_pass": _median(steps),
        "decode_pass_ms": _median([1000 * (e[2] - e[1]) for e in decode]),
        "decode_gap_ms": _median([1000 * g for g in gaps]),
        "decode_cpu_ms": _median([1000 * e[8] for e in decode]),
        "decode_launch_ms": _median([1000 * e[9] for e in decode]),
        "prefill_passes": len(prefill),
        "prefill_ms_total": round(sum(1000 * (e[2] - e[1]) for e in prefill), 2),
        "widths_k": sorted({(e[6], e[7]) for e in decode}),
    }


def replay_ms(fn, reps: int = 50) -> float:
    """GPU milliseconds per call of ``fn`` captured in a CUDA graph and replayed back to back."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return round(start.elapsed_time(end) / reps, 4)


def kernel_table(fn, steps: int = 3, top: int = 25) -> dict:
    """Device kernels of ``fn`` (run eagerly ``steps`` times) by name: count and microseconds per step."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    on_cuda = torch.cuda.is_available()
    fn()
    sync()
    with profile(activities=[ProfilerActivity.CUDA if on_cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            fn()
        sync()
    count: dict[str, int] = defaultdict(int)
    us: dict[str, float] = defaultdict(float)
    for e in prof.events():
        if on_cuda and "CUDA" not in str(getattr(e, "device_type", "")):
            continue
        name = e.name[:90]
        count[name] += 1
        us[name] += e.device_time_total if on_cuda else e.self_cpu_time_total
    rows = sorted(us, key=us.get, reverse=True)
    return {
        "kernels_per_step": round(sum(count.values()) / steps, 1),
        "busy_us_per_step": round(sum(us.values()) / steps, 1),
        "top": [(n, round(count[n] / steps, 1), round(us[n] / steps, 1)) for n in rows[:top]],
    }


def op_checks() -> dict:
    """Kernels a few candidate fused ops launch here (``F.rms_norm``: one fused kernel, or several)."""
    import torch
    import torch.nn.functional as F

    x = torch.randn(64, 576, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(576, device="cuda", dtype=torch.bfloat16)
    checks = {
        "rms_norm": lambda: F.rms_norm(x, (576,), w, 1e-5),
        "silu_mul": lambda: F.silu(x) * x,
        "addmm": lambda: torch.addmm(x, x, w.new_ones(576, 576)),
    }
    out = {}
    for name, fn in checks.items():
        t = kernel_table(fn, steps=2, top=4)
        out[name] = (t["kernels_per_step"], [n for n, _, _ in t["top"]])
    return out


def profile_batch(
    backend, model, b: int, prompt_len: int, new_tokens: int, card: str, resume: tuple[int, int] | None = None
) -> dict:
    import torch

    from turngym.agents.hf.runner.attention import slot_attention_on as _slot_attention

    rng = random.Random(b)
    vocab = model.config.vocab_size
    prompts = [[rng.randrange(10, vocab - 10) for _ in range(prompt_len)] for _ in range(b)]
    out: dict = {"batch": b, "engine": engine_run(backend, prompts, new_tokens)}
    w, k = out["engine"]["widths_k"][-1]
    out["floor_ms"] = memory_bound_step_ms(model, b, prompt_len + new_tokens // 2, card)

    def body() -> None:
        backend.runner.decode_body(w, k, False)  # one step

    def logits() -> None:
        backend.runner.decode_logits(w, k)

    with backend.lock, torch.inference_mode(), backend.kernels(), _slot_attention(model):
        backend.runner.step_in[0, :w] = prompt_len  # every row at the prompt's end: the KV is the run's
        if torch.cuda.is_available():
            out["graph_step_ms"] = replay_ms(body)
            out["graph_logits_ms"] = replay_ms(logits)
            out["graph_sampling_ms"] = round(out["graph_step_ms"] - out["graph_logits_ms"], 4)
        try:
            out["kernels"] = kernel_table(body)
        except Exception as e:  # noqa: BLE001 - no CUPTI (e.g. under gVisor): the rest still stands
            out["kernels"] = {"error": f"{type(e).__name__}: {e}"}
        rows = max(1, min(b, backend.prefill_tokens // prompt_len))
        out["prefill"] = prefill_profile(backend, rows, prompt_len, vocab)
        if resume is not None:  # parked rows' next turn: a few new tokens after the prompt's KV
            out["resume"] = prefill_profile(backend, min(b, resume[0]), resume[1], vocab, start=prompt_len)
    return out


def prefill_profile(backend, rows: int, feed: int, vocab: int, start: int = 0) -> dict:
    """One prefill pass of ``rows`` rows feeding ``feed`` ids each at columns ``start..`` (0: fresh
    prompts, as the engine runs this workload's; past the prompt: parked rows resuming, as a
    multi-turn rollout's joiners): eager and as a replayed graph (CUDA events), and its kernels."""
    import torch

    dev = backend.device
    ids = torch.randint(10, vocab - 10, (rows, feed), device=dev)
    cols = torch.arange(start, start + feed, device=dev).expand(rows, feed).contiguous()
    slots = torch.arange(rows, device=dev)

    def fn() -> None:
        backend.runner.prefill_logits(ids, cols, slots, start + feed)

    out: dict = {"rows": rows, "feed": feed, "start": start, "tokens": rows * feed}
    if torch.cuda.is_available():
        fn()
        sync()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            fn()
        end.record()
        sync()
        out["eager_ms"] = round(start.elapsed_time(end) / 5, 3)
        out["graph_ms"] = replay_ms(fn, reps=10)
    try:
        out["kernels"] = kernel_table(fn, steps=2)
    except Exception as e:  # noqa: BLE001
        out["kernels"] = {"error": f"{type(e).__name__}: {e}"}
    return out


def print_kernels(kt: dict, per: str, top: int) -> None:
    """A ``kernel_table``'s count, busy time and top kernels (or why there is none)."""
    if "top" not in kt:
        print("  kernels:", kt, flush=True)
        return
    print(f"  kernels/{per} {kt['kernels_per_step']}, busy {kt['busy_us_per_step']} us", flush=True)
    for name, n, us in kt["top"][:top]:
        print(f"    {us:9.1f} us {n:6.1f}x  {name}", flush=True)


def print_prefill(pf: dict) -> None:
    """A ``prefill_profile``'s pass times and kernels."""
    after = f" after {pf['start']}" if pf["start"] else ""
    print(
        f"  prefill pass of {pf['rows']} x {pf['feed']}{after}: eager {pf.get('eager_ms')} ms, "
        f"graph {pf.get('graph_ms')} ms",
        flush=True,
    )
    print_kernels(pf["kernels"], "pass", 12)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--decode-block", type=int, default=8, help="decode steps a graph replay")
    ap.add_argument(
        "--resume",
        type=int,
        nargs=2,
        metavar=("ROWS", "FEED"),
        help="also profile a prefill pass of ROWS parked rows feeding FEED new tokens each after the "
        "prompt (a multi-turn rollout's joiners: their pass costs the same however few rows)",
    )
    ap.add_argument(
        "--forwards",
        nargs="+",
        default=["fast", "fast-torch"],
        choices=["fast", "fast-torch", "fast-sdpa", "hf"],
        help="the slots engine's forward: turngym's own (hf.kernels.fast, with its Triton kernels where they run; "
        "fast-torch: torch ops instead; fast-sdpa: torch ops, the decode attention as one SDPA call) "
        "and/or transformers'",
    )
    args = ap.parse_args()
    import torch

    from turngym.agents.hf import HFSlotBackend
    from turngym.agents.models import load_model, load_tokenizer, resolve_model

    path = resolve_model(args.model)
    tok = load_tokenizer(path)
    on_cuda = torch.cuda.is_available()
    model = load_model(path, device="cuda" if on_cuda else "cpu")
    card = torch.cuda.get_device_name(0) if on_cuda else "cpu"
    context = max(args.prompt_len + args.new_tokens, 512)
    results = {"device": card, "model": args.model, "torch": torch.__version__, "batches": []}
    if on_cuda:
        try:
            results["op_checks"] = op_checks()
        except Exception as e:  # noqa: BLE001
            results["op_checks"] = f"{type(e).__name__}: {e}"
        print("op checks", results["op_checks"], flush=True)
    for forward, b in [(f, b) for f in args.forwards for b in args.batches]:
        backend = HFSlotBackend(
            model,
            tok,
            max_batch_size=max(args.batches),
            max_context=context,
            max_wait_ms=20,
            fast=None if forward.startswith("fast") else False,
            decode_block=args.decode_block,
            kernels="torch" if forward in ("fast-torch", "fast-sdpa") else None,
        )
        if forward == "fast-sdpa":
            backend.runner.fast.decode_attention = "sdpa"
        res = {
            "forward": forward,
            "fast_kernels": backend.runner.fast.kernels if backend.runner.fast else None,
        }
        res.update(
            profile_batch(
                backend, model, b, args.prompt_len, args.new_tokens, card, tuple(args.resume or ()) or None
            )
        )
        asyncio.run(backend.aclose())
        backend.free_buffers()
        results["batches"].append(res)
        e = res["engine"]
        print(
            f"{forward} ({res['fast_kernels']}) batch {b}: {e['tok_s']} tok/s, {e['ms_per_token_step']} ms/step overall | pass of "
            f"{e['steps_per_pass']} steps "
            f"{e['decode_pass_ms']} ms (launch {e['decode_launch_ms']}, cpu {e['decode_cpu_ms']}), gap "
            f"{e['decode_gap_ms']} ms, prefill {e['prefill_ms_total']} ms in {e['prefill_passes']} | graph "
            f"{res.get('graph_step_ms')} ms (model {res.get('graph_logits_ms')}, sampling "
            f"{res.get('graph_sampling_ms')}) "
            f"| floor {res['floor_ms']} ms",
            flush=True,
        )
        print_kernels(res["kernels"], "step", 15)
        for key in ("prefill", "resume"):  # the fresh prompts' pass; parked rows resuming (--resume)
            if key in res:
                print_prefill(res[key])
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
