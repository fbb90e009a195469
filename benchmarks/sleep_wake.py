"""The slots engine's sleep and wake on one GPU (issue 37, "One GPU, two phases"): what the update
gains, what sleeping and waking cost, and whether greedy rollouts after a wake equal those before.

    python benchmarks/sleep_wake.py --shape 1.5b --out sleep_wake.json         # one GPU, ~1-2 minutes
    python benchmarks/sleep_wake.py --shape tiny --device cpu --out t.json      # CPU: the plumbing only

A random-init Qwen2 model of a real shape (``benchmarks/fsdp.py``'s ``SHAPES``, bf16 on CUDA; no
weights or tokenizer needed: prompts are random token ids, greedy, never stopping early) is served by
``HFSlotBackend`` with CUDA graphs on, ``--rows`` slots of ``--max-context`` columns (their KV is what
a sleep gives back). For each mode — ``awake`` (no sleep: ``rollout.keep_backend``),
``kv`` and ``kv+graphs`` (``sleep(level)``) — a fresh engine runs a warm-up rollout (captures its
graphs), then ``--cycles`` times: a rollout of ``--rows`` prompts (its tokens), ``aclose``, the sleep,
an update (forward, backward and an AdamW step at lr 0 on ``--update-seqs`` x ``--update-len``
tokens: the weights stay bit for bit, the optimizer state and gradients take their memory, the first
cycle creates the state while the engine sleeps), the wake, and the next cycle's rollout. Per cycle:

* ``free_gib``: the device's free memory (``torch.cuda.mem_get_info``, after ``empty_cache``) when
  the update starts: what it may use; ``update_peak_gib``: ``max_memory_allocated`` over the update;
* ``sleep_s``, ``wake_s``; ``graphs``: a ``kv`` wake's verdict (``kept``: the KV slots came back at
  the address the graphs read; ``dropped``: captured again on use);
* ``rollout_s`` and ``captures``: the rollout after the wake, and the graphs it captured (recaptures);
* ``equal``: its greedy tokens equal the first timed rollout's (same weights, same prompts), and
  ``rows_equal`` how many rows do.

``--out`` writes the rows as JSON with the card and settings; a table goes to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fsdp import SHAPES, build_model  # noqa: E402

MODES = ("awake", "kv", "kv+graphs")


class _Tokenizer:
    """What the engine asks of a tokenizer (pad and end ids, a decode for ``Generation.text``): the
    prompts are token ids, and a random-init model's text means nothing."""

    pad_token_id = 0
    eos_token_id = 0

    def decode(self, ids, skip_special_tokens=True):
        return ""


def _gib(n: float) -> float:
    return round(n / 2**30, 3)


def _free(device) -> int | None:
    import torch

    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    return int(torch.cuda.mem_get_info(device)[0])


async def _rollout(backend, prompts, sampling) -> list[list[int]]:
    gens = await asyncio.gather(*(backend.generate(p, sampling) for p in prompts))
    await backend.aclose()
    return [g.token_ids for g in gens]


def _update(model, optimizer, batch) -> None:
    """A forward, backward and optimizer step (lr 0: the weights do not move) over ``batch``."""
    import torch

    with torch.autocast(batch.device.type, dtype=torch.bfloat16, enabled=batch.device.type == "cuda"):
        loss = model(input_ids=batch).logits.float().logsumexp(-1).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def run_mode(args, mode: str, model, device) -> list[dict]:
    import torch

    from turngym.agents import SamplingParams
    from turngym.agents.hf import HFSlotBackend

    gen = torch.Generator().manual_seed(args.seed)
    vocab = model.config.vocab_size
    prompts = torch.randint(1, vocab, (args.rows, args.prompt_len), generator=gen).tolist()
    batch = torch.randint(1, vocab, (args.update_seqs, args.update_len), generator=gen).to(device)
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, stop_token_ids=(-1,))
    backend = HFSlotBackend(
        model,
        _Tokenizer(),
        max_batch_size=args.rows,
        max_context=max(args.max_context, args.prompt_len + args.max_tokens),
        max_wait_ms=50,
        cuda_graphs=device.type == "cuda",
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0)  # its state: made in the first update
    asyncio.run(_rollout(backend, prompts, sampling))  # warm-up: the graphs of this workload
    t0 = time.perf_counter()
    first = asyncio.run(_rollout(backend, prompts, sampling))
    last_rollout_s = time.perf_counter() - t0
    rows = []
    for cycle in range(args.cycles):
        stats0 = dict(backend.stats)
        t0 = time.perf_counter()
        if mode != "awake":
            backend.sleep(mode)
        sleep_s = time.perf_counter() - t0
        free = _free(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        try:
            _update(model, optimizer, batch)
            update = "ok"
        except torch.OutOfMemoryError:
            update = "oom"
            optimizer.zero_grad(set_to_none=True)
        update_s = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
        _free(device)
        t0 = time.perf_counter()
        backend.wake()
        wake_s = time.perf_counter() - t0
        captures0 = backend.stats["graph_captures"] + backend.stats["prefill_graph_captures"]
        t0 = time.perf_counter()
        tokens = asyncio.run(_rollout(backend, prompts, sampling))
        rollout_s = time.perf_counter() - t0
        captures = backend.stats["graph_captures"] + backend.stats["prefill_graph_captures"] - captures0
        kept = backend.stats["wake_graphs_kept"] - stats0["wake_graphs_kept"]
        dropped = backend.stats["wake_graphs_dropped"] - stats0["wake_graphs_dropped"]
        rows.append(
            {
                "mode": mode,
                "cycle": cycle,
                "free_gib": _gib(free) if free is not None else None,
                "update": update,
                "update_s": round(update_s, 3),
                "update_peak_gib": _gib(peak) if peak is not None else None,
                "sleep_s": round(sleep_s, 4),
                "wake_s": round(wake_s, 4),
                "graphs": "kept" if kept else "dropped" if dropped else "-",
                "rollout_s_before": round(last_rollout_s, 3),
                "rollout_s": round(rollout_s, 3),
                "captures": captures,
                "equal": tokens == first,
                "rows_equal": sum(a == b for a, b in zip(tokens, first, strict=True)),
                "kv_gib": _gib(backend.kv_bytes),
                "graph_fallbacks": backend.stats["graph_fallbacks"],
            }
        )
        last_rollout_s = rollout_s
    backend.free_buffers()
    del backend, optimizer
    gc.collect()  # the engine's parts refer to each other: its fused weights go only with a collection
    _free(device)
    return rows


def table(rows: list[dict]) -> str:
    cols = ["mode", "cycle", "free_gib", "update", "update_peak_gib", "sleep_s", "wake_s", "graphs"]
    cols += ["rollout_s_before", "rollout_s", "captures", "equal", "rows_equal"]
    lines = [" | ".join(cols), " | ".join("---" for _ in cols)]
    lines += [" | ".join(str(r[c]) for c in cols) for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="1.5b", choices=sorted(SHAPES))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--rows", type=int, default=128, help="prompts per rollout (= the engine's slots)")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-context", type=int, default=4096, help="the slots' columns: their KV bytes")
    ap.add_argument("--update-seqs", type=int, default=8)
    ap.add_argument("--update-len", type=int, default=1024)
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    modes = args.modes.split(",")
    if set(modes) - set(MODES):
        ap.error(f"--modes: one of {', '.join(MODES)}")
    device = torch.device(args.device)
    dtype = "bfloat16" if device.type == "cuda" else "float32"
    model = build_model(args.shape, args.device, dtype, args.seed)
    rows = [r for mode in modes for r in run_mode(args, mode, model, device)]
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    total = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    params = sum(p.numel() for p in model.parameters())
    result = {"card": card, "card_gib": _gib(total) if total else None, "params": params, **vars(args)}
    result.update(out=str(args.out) if args.out else None, rows=rows)
    kv = rows[0]["kv_gib"] if rows else None
    print(
        f"{card}, {args.shape} shape ({params / 1e9:.2f}B), {args.rows} rows x {args.prompt_len}+{args.max_tokens} "
        f"tokens, KV slots {kv} GiB ({args.rows} x {args.max_context} columns)"
    )
    print(table(rows))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
