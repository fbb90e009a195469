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

The parts live in ``rollout_runs.py`` (overhead, async, memory, engine CPU), ``engines.py`` (the HF
engines' microbenchmarks, the one file that builds engines directly) and ``rollout_common.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.engines import bench_engines, bench_kvcache, bench_throughput  # noqa: E402
from benchmarks.rollout_common import HFSettings  # noqa: E402
from benchmarks.rollout_runs import bench_async, bench_engine_cpu, bench_memory, bench_overhead  # noqa: E402


def async_from_args(args, kind: str, device: str, hf: HFSettings):
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
        hf=hf,
    )


def bench_gpu(args, hf: HFSettings, emit) -> None:
    """Everything on CUDA with the HF backend (``--parts`` picks): the engines' decode throughput;
    throughput at batch 1/16/64; the in-place KV cache vs concatenation; engine overhead
    (``--repeats`` pairs) with the model in a worker process and in-process (turns of
    ``--turn-tokens``, default 32), in-process with cuDNN attention allowed, and in a worker with
    16-96-token turns; async vs lock-step with the worker (``-n``, ``-g``, ``--turns``, ``--repeats``)."""
    import torch

    if not torch.cuda.is_available():
        emit("gpu", {"skipped": "no CUDA device"})
        return
    parts = set(args.parts.split(","))
    if "engines" in parts:
        emit("engines", asyncio.run(bench_engines(args.model, [16, 64, 256], 256, 128, hf.compile)))
    if "throughput" in parts:
        emit("throughput", asyncio.run(bench_throughput([16, 64], 256, 128, "cuda")))
    if "kvcache" in parts:
        emit("kvcache", bench_kvcache(64, 256, 256, 3, "cuda"))
    for process in (True, False):
        name = "overhead_process" if process else "overhead_in_process"
        if name.removeprefix("overhead_") in parts:
            where = replace(hf, process=process)
            res = bench_overhead("hf", 16, 4, 3, args.turn_tokens, args.repeats, device="cuda", hf=where)
            emit(name, {**where.describe(), **asyncio.run(res)})
    if "cudnn" in parts:  # in-process, SDPA allowed cuDNN's kernel (per-shape plans)
        where = replace(hf, process=False, cudnn_attention=True)
        res = bench_overhead("hf", 16, 4, 3, args.turn_tokens, args.repeats, device="cuda", hf=where)
        emit("overhead_in_process_cudnn", asyncio.run(res))
    worker = replace(hf, process=True)
    if "varied" in parts:
        varied = bench_overhead("hf", 16, 4, 3, 32, args.repeats, device="cuda", lengths=(16, 96), hf=worker)
        emit("overhead_varied_process", {**worker.describe(), **asyncio.run(varied)})
    if "async" in parts:
        emit(
            "async_process", {**worker.describe(), **asyncio.run(async_from_args(args, "hf", "cuda", worker))}
        )


def engine_option(text: str) -> tuple[str, object]:
    """``K=V`` as (K, V), V parsed as JSON where it is JSON (``false``, ``8``), else kept a string."""
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise SystemExit(f"--hf-option wants K=V, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


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
        help="HF backend engine for the overhead/async/process parts (turngym.agents.hf.registry)",
    )
    ap.add_argument(
        "--hf-compile",
        help="the slots engine's torch.compile setting (turngym.agents.hf.registry.COMPILE_SETTINGS): "
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
    hf = HFSettings(
        engine=args.hf_engine,
        compile=args.hf_compile,
        model=args.hf_model,
        process=args.hf_process,
        reuse_prefix=not args.no_reuse,
        cudnn_attention=args.cudnn_attention,
        options=dict(engine_option(o) for o in args.hf_option),
    )
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
        bench_gpu(args, hf, emit)
        return
    todo = ["overhead", "async", "memory"] if args.what == "all" else [args.what]
    for what in todo:
        if what == "overhead":
            lengths = tuple(int(x) for x in args.lengths.split(":")) if args.lengths else None
            res = asyncio.run(
                bench_overhead(
                    args.backend,
                    args.n or 8,
                    args.g,
                    3,
                    32,
                    args.repeats,
                    args.device,
                    lengths,
                    None,
                    hf,
                    args.profile_loop,
                )
            )
        elif what == "async":
            kind = args.backend if args.backend.startswith("sim") else "hf"
            res = asyncio.run(async_from_args(args, kind, args.device, hf))
        elif what == "enginecpu":
            res = asyncio.run(bench_engine_cpu([3, 8], args.repeats, args.hf_model or "tiny"))
        elif what == "kvcache":
            res = bench_kvcache(32, 128, 256, args.repeats, args.device)
        else:
            res = asyncio.run(bench_memory([32, 128, 512], turns=3, gen_len=64))
        emit(what, res)


if __name__ == "__main__":
    main()
