"""The HF engines' microbenchmarks on one card (``benchmarks/rollout.py gpu --parts engines,throughput,kvcache``
runs them): decode throughput of the continuous and slots engines (and their variants) against
transformers' ``generate``, with the memory-bound floor of a step; the in-place KV cache against
concatenation. The one benchmark file that builds engines directly (to compare engine variants on one
loaded model); everything else builds them through the agent factory."""

from __future__ import annotations

import asyncio
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.rollout_common import NEVER, load, model_path, spread  # noqa: E402
from turngym.agents import SamplingParams  # noqa: E402


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
    turngym's own forward, ``hf.kernels.fast``, with its Triton kernels, ``hf.kernels.triton``, where they run), the
    same with torch ops in place of those kernels (``slots_torch``: kernels="torch", the engine of
    session 12), the slots engine on transformers' forward with one step a replay (``slots_hf``:
    fast=False, decode_block=1, the engine of session 11), with ``compile`` also the slots
    engine with its decode step compiled before capture (``slots_compile``, compile seconds per shape
    beside it), and plain transformers ``generate``; each shape warmed up first; sampled, no stop
    token. Beside each figure the memory-bound floor of a decode step; first, whether the slots
    engine's greedy and seeded ids with graphs equal its eager ids, and its greedy ids those of
    transformers' forward (slots_hf) and of the continuous engine."""
    import torch

    from turngym.agents.hf import HFBackend, HFSlotBackend
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
    fast = slots.runner.fast
    out["fast_kernels"] = fast.kernels if fast is not None else None
    out["kernels_problem"] = fast.kernels_problem if fast is not None else None
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

    from turngym.agents.hf import HFBackend
    from turngym.agents.hf.kv.padded import growing_cache

    backend = HFBackend(model_path(device), device=device, max_batch_size=batch)
    runner = backend.scheduler.runner  # builds each batch's cache with ``new_cache``
    rng = random.Random(0)
    vocab = backend.model.config.vocab_size
    prompts = [[rng.randrange(10, vocab - 10) for _ in range(prompt_len)] for _ in range(batch)]
    sampling = SamplingParams(max_tokens=new_tokens, temperature=0.0, stop_token_ids=NEVER)

    def plain(config):
        from transformers import DynamicCache

        return DynamicCache(config=config)

    cuda = device.startswith("cuda")
    out: dict = {"device": device, "batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens}
    runs: dict[str, list] = {"growing": [], "concat": []}
    mallocs: dict[str, list] = {"growing": [], "concat": []}
    try:
        for _ in range(repeats + 1):  # the first round warms up
            for name, fn in (("growing", growing_cache), ("concat", plain)):
                runner.new_cache = fn
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
        runner.new_cache = growing_cache
    out["tok_s"] = {k: [round(x, 1) for x in v[1:]] for k, v in runs.items()}
    if cuda:
        out["cuda_segment_allocations"] = {k: v[1:] for k, v in mallocs.items()}
    ratios = [a / b for a, b in zip(runs["growing"][1:], runs["concat"][1:], strict=True)]
    out["growing_over_concat"] = spread(ratios)
    out["load_before_after"] = load()
    return out
