"""The learner's update under DDP and FSDP2 on random-init Qwen2 models of real shapes: peak memory
per GPU, update time, MFU and the FSDP full-weight refresh time.

    torchrun --standalone --nproc-per-node 2 benchmarks/fsdp.py --shape 7b --out fsdp-7b-2gpu.json
    torchrun --standalone --nproc-per-node 4 benchmarks/fsdp.py --shape 1.5b --strategies ddp,fsdp --out f.json
    torchrun --standalone --nproc-per-node 2 benchmarks/fsdp.py --shape 7b --strategies fsdp \
        --gradient-checkpointing --variants base,8bit+release+liger --out knobs.json
    python benchmarks/fsdp.py --tiny --out tiny.json             # CPU, one process: the plumbing only

Each strategy in ``--strategies`` (default ``fsdp,ddp``) gets a fresh model built from the shape's
config (``SHAPES``: Qwen2.5-1.5B's and Qwen2.5-7B's dimensions, vocabulary 151936) and runs the
trainer's own update (``turngym.trainer.update.policy_update`` through ``turngym.trainer.policy.Policy``,
so sharding, mixed precision, gradient accumulation and clipping are the trainer's) on random token
sequences: ``--seqs`` sequences of ``--seq-len`` tokens per rank and step, ``--micro-batch-tokens``
per forward/backward. ``--warmup`` steps are not timed; the median of ``--steps`` timed steps is
reported. Master weights follow the trainer's defaults: DDP trains the model in ``--ddp-dtype``
(bf16 on CUDA, as ``model.dtype`` defaults to), FSDP keeps fp32 master shards and computes in bf16
(``cluster.fsdp.param_dtype``). A strategy that runs out of memory is reported as ``oom``.

``expected GiB`` is the update's static memory per rank computed from the settings
(``turngym.trainer.optimizers.static_bytes_per_param``: master weights, gradients, optimizer state,
the full copy; not activations or logits); ``--memory-table`` prints it for both shapes, 1-8 GPUs and
every setting (no GPU, no model weights: the parameters are counted on the meta device) and exits.

Memory knobs: ``--optimizer``, ``--release-full-copy``, ``--logprob-kernel`` and
``--logprob-chunk-tokens`` set the trainer's keys for every row; ``--variants`` (comma-separated, each
a ``+``-joined list of the names in ``KNOBS``) runs each strategy once per variant on top of those,
and every row reports its peak memory and update time as a ratio to the first variant of its
strategy (the baseline, measured in the same run). Each timed step is an update followed by the
full copy's refresh (FSDP), as in the trainer: ``--release-full-copy`` frees the copy for the update
and the refresh rebuilds it.

MFU = 6 · parameters · tokens (all ranks) ÷ update time ÷ (world size · ``--peak-flops``); the default
peak is 989e12, the dense bf16 rate of an H100/H200 SXM (recomputation under
``--gradient-checkpointing`` is not counted as useful work). On CPU the figure means nothing.
Peak memory is ``torch.cuda.max_memory_allocated`` over the timed steps (and the refresh), the
largest over the ranks; ``reserved`` is the allocator's peak reservation.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

SHAPES = {  # hidden, intermediate, layers, attention heads, KV heads, tied embeddings
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, tie_word_embeddings=True),
    "7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, tie_word_embeddings=False),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, tie_word_embeddings=True, vocab_size=512),
}  # fmt: skip
VOCAB = 151936
#: ``--variants`` names: the trainer overrides each one adds (``base``: none)
KNOBS = {
    "base": [],
    "nochunk": ["optim.logprob_chunk_tokens=null"],  # the whole [tokens, vocab] logits at once
    "8bit": ["optim.optimizer=adamw_8bit"],
    "4bit": ["optim.optimizer=adamw_4bit"],
    "release": ["cluster.fsdp.release_full_copy=true"],
    "chunk1024": ["optim.logprob_chunk_tokens=1024"],
    "liger": ["optim.logprob_kernel=liger"],
    "every": ["cluster.fsdp.reduce_every_micro_batch=true"],
}
H200_BF16_PEAK = 989e12


def count_params(shape: str) -> int:
    """The shape's parameter count, from a model made on the meta device (no memory)."""
    return sum(p.numel() for p in build_model(shape, "meta", "float32").parameters())


def expected_bytes(row: dict, micro_batches: int = 1) -> dict[str, float]:
    from turngym.trainer.optimizers import static_bytes_per_param

    sharded = row["strategy"] == "fsdp" and row["world"] > 1
    return static_bytes_per_param(
        world=row["world"],
        optimizer=row["optimizer"],
        master_dtype=row["master_dtype"],
        sharded=sharded,
        release_full_copy=row["release_full_copy"],
        accumulate_unsharded=sharded and micro_batches > 1 and not row.get("reduce_every", False),
    )


MEMORY_SETTINGS = [  # (label, optimizer, release_full_copy)
    ("adamw (fp32 state)", "adamw", False),
    ("adamw + release", "adamw", True),
    ("adamw_8bit", "adamw_8bit", False),
    ("adamw_8bit + release", "adamw_8bit", True),
    ("adamw_4bit + release", "adamw_4bit", True),
]


def memory_table() -> str:
    """Markdown: bytes per parameter and GiB per rank of the update's static memory under FSDP2."""
    from turngym.trainer.optimizers import static_bytes_per_param

    worlds = (2, 4, 8)
    lines = [
        "| shape (params) | setting | bytes/param/rank at " + " / ".join(map(str, worlds)) + " GPUs "
        "| GiB/rank at " + " / ".join(map(str, worlds)) + " GPUs |",
        "| --- | --- | --- | --- |",
    ]
    for shape in ("1.5b", "7b"):
        n = count_params(shape)
        for label, optimizer, release in MEMORY_SETTINGS:
            per = [static_bytes_per_param(w, optimizer, release_full_copy=release)["total"] for w in worlds]
            lines.append(
                f"| {shape} ({n / 1e9:.2f}B) | {label} | {' / '.join(f'{b:.2f}' for b in per)} "
                f"| {' / '.join(f'{b * n / 2**30:.1f}' for b in per)} |"
            )
    return "\n".join(lines)


def build_model(shape: str, device: str, dtype: str, seed: int = 0, vocab: int | None = None):
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    dims = {"vocab_size": VOCAB, "max_position_embeddings": 32768, **SHAPES[shape]}
    if vocab is not None:
        dims["vocab_size"] = vocab
    config = Qwen2Config(**dims)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    return model.eval()


def random_batch(n: int, seq_len: int, vocab: int, seed: int):
    import numpy as np

    from turngym.core.types import Trajectory

    rng = np.random.default_rng(seed)
    trajs, advs = [], []
    for k in range(n):
        ids = rng.integers(1, vocab, size=seq_len).tolist()
        mask = [0] * min(16, seq_len // 4) + [1] * (seq_len - min(16, seq_len // 4))
        trajs.append(
            Trajectory(
                env_id="bench",
                seed=k,
                group=f"b/{k}",
                token_ids=ids,
                loss_mask=mask,
                logprobs=[-1.0] * seq_len,
            )
        )
        advs.append(rng.standard_normal(seq_len).astype("float32") * np.asarray(mask, dtype="float32"))
    return trajs, advs


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def variant_overrides(variant: str) -> list[str]:
    """The trainer overrides of a ``--variants`` entry (``8bit+release``: both knobs' overrides)."""
    out = []
    for name in variant.split("+"):
        if name not in KNOBS:
            raise SystemExit(f"unknown knob {name!r} in --variants; known: {', '.join(KNOBS)}")
        out += KNOBS[name]
    return out


def run_strategy(args, strategy: str, dist, device: str, variant: str = "base") -> dict:
    import torch

    from turngym.trainer.config import load_config
    from turngym.trainer.policy import Policy
    from turngym.trainer.update import policy_update

    cuda = device.startswith("cuda")
    shape = "tiny" if args.tiny else args.shape
    overrides = [
        f"cluster.strategy={strategy}",
        f"optim.micro_batch_tokens={args.micro_batch_tokens}",
        f"model.gradient_checkpointing={str(args.gradient_checkpointing).lower()}",
        f"cluster.fsdp.cpu_offload={str(args.cpu_offload).lower()}",
        f"optim.optimizer={args.optimizer}",
        f"optim.logprob_kernel={args.logprob_kernel}",
        f"optim.logprob_chunk_tokens={args.logprob_chunk_tokens or 'null'}",
        "optim.lr=1e-6",
        "log.tensorboard=false",
    ]
    if args.release_full_copy:
        overrides.append("cluster.fsdp.release_full_copy=true")
    if args.reduce_every_micro_batch:
        overrides.append("cluster.fsdp.reduce_every_micro_batch=true")
    overrides += variant_overrides(variant)
    if strategy != "fsdp" or not dist.enabled:  # only a sharded policy has a full copy to release
        overrides = [o for o in overrides if not o.startswith("cluster.fsdp.release_full_copy")]
        overrides = [o for o in overrides if not o.startswith("cluster.fsdp.reduce_every")]
    cfg = load_config(None, overrides)
    master = args.ddp_dtype if strategy == "ddp" or not dist.enabled else "float32"
    if not cuda:
        master = "float32"
    row: dict = {"strategy": strategy, "variant": variant, "world": dist.world_size, "shape": shape}
    row.update(master_dtype=master, optimizer=cfg.optim.optimizer, logprob_kernel=cfg.optim.logprob_kernel)
    row.update(chunk=cfg.optim.logprob_chunk_tokens, release_full_copy=cfg.cluster.fsdp.release_full_copy)
    row["reduce_every"] = cfg.cluster.fsdp.reduce_every_micro_batch
    policy = None
    try:
        model = build_model(shape, device, master, seed=args.seed)
        row["params"] = sum(p.numel() for p in model.parameters())
        policy = Policy(cfg, dist, model=model)
        row["sharded"] = policy.sharded
        vocab = model.config.vocab_size
        times = []
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        refresh = []
        for step in range(args.warmup + args.steps):  # the trainer's order: update, then refresh
            trajs, advs = random_batch(args.seqs, args.seq_len, vocab, seed=1000 * dist.rank + step)
            _sync(device)
            t0 = time.perf_counter()
            metrics = policy_update(policy, cfg, trajs, advs)
            _sync(device)
            t1 = time.perf_counter()
            seconds = policy.refresh_full_weights()
            _sync(device)
            if step >= args.warmup:
                times.append(t1 - t0)
                if policy.sharded:
                    refresh.append(seconds)
        tokens = metrics["update/tokens"]  # loss tokens of the global batch
        seq_tokens = args.seqs * args.seq_len * dist.world_size  # every token is forwarded and backpropagated
        update_s = statistics.median(times)
        row.update(
            update_s=update_s,
            loss_tokens=tokens,
            tokens=seq_tokens,
            tokens_per_s=seq_tokens / update_s,
            mfu=6 * row["params"] * seq_tokens / update_s / (dist.world_size * args.peak_flops),
            refresh_s=statistics.median(refresh) if refresh else None,
            grad_norm=metrics["update/grad_norm"],
        )
        per_rank_batches = metrics["update/micro_batches"] / dist.world_size
        static = expected_bytes(row, micro_batches=round(per_rank_batches))
        row["expected_gib"] = static["total"] * row["params"] / 2**30
        if cuda:
            row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
            row["reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    except torch.cuda.OutOfMemoryError as e:  # the trainer's message: the phase, then the cause
        row["oom"] = " ".join(str(e).split())[:300]
    finally:
        del policy
        if cuda:
            torch.cuda.empty_cache()
    return row


def merge_ranks(rows: list[dict]) -> dict:
    """One row per strategy: rank 0's, with the largest peak memory and update time over the ranks."""
    out = dict(rows[0])
    for key in ("peak_gib", "reserved_gib", "update_s", "refresh_s"):
        values = [r[key] for r in rows if r.get(key) is not None]
        if values:
            out[key] = max(values)
    if any("oom" in r for r in rows):
        out["oom"] = next(r["oom"] for r in rows if "oom" in r)
    return out


def add_ratios(rows: list[dict]) -> None:
    """Each row's peak memory and update time as a ratio to its strategy's first (baseline) row."""
    base: dict[str, dict] = {}
    for r in rows:
        b = base.setdefault(r["strategy"], r)
        for key in ("peak_gib", "update_s"):
            if key in r and key in b and b[key]:
                r[f"{key}_ratio"] = r[key] / b[key]


def table(rows: list[dict]) -> str:
    head = (
        f"{'strategy':8} {'variant':22} {'world':>5} {'shape':>5} {'params':>8} {'peak GiB':>9} "
        f"{'peak GB':>8} {'x base':>6} {'expected GiB':>12} {'update s':>9} {'x base':>6} {'MFU':>6} "
        f"{'refresh s':>9}"
    )
    lines = [head]
    for r in rows:
        lead = f"{r['strategy']:8} {r['variant']:22} {r['world']:>5} {r['shape']:>5}"
        if "oom" in r:
            lines.append(f"{lead} out of memory: {r['oom'][:160]}")
            continue
        peak = f"{r['peak_gib']:.1f}" if "peak_gib" in r else "-"
        peak_gb = f"{r['peak_gib'] * 2**30 / 1e9:.1f}" if "peak_gib" in r else "-"
        peak_x = f"{r['peak_gib_ratio']:.2f}" if "peak_gib_ratio" in r else "-"
        refresh = f"{r['refresh_s']:.3f}" if r.get("refresh_s") is not None else "-"
        time_x = f"{r['update_s_ratio']:.2f}" if "update_s_ratio" in r else "-"
        lines.append(
            f"{lead} {r['params'] / 1e9:7.2f}B {peak:>9} {peak_gb:>8} {peak_x:>6} {r['expected_gib']:12.1f} "
            f"{r['update_s']:9.3f} {time_x:>6} {100 * r['mfu']:5.1f}% {refresh:>9}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=["1.5b", "7b"], default="1.5b")
    ap.add_argument("--tiny", action="store_true", help="a tiny shape (CPU test of the plumbing)")
    ap.add_argument("--strategies", default="fsdp,ddp")
    ap.add_argument("--seqs", type=int, default=8, help="sequences per rank and step")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--micro-batch-tokens", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--cpu-offload", action="store_true")
    ap.add_argument("--ddp-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--optimizer", default="adamw", choices=["adamw", "adamw_8bit", "adamw_4bit"])
    ap.add_argument("--release-full-copy", action="store_true", help="cluster.fsdp.release_full_copy")
    ap.add_argument("--logprob-kernel", default="torch", choices=["torch", "liger"])
    ap.add_argument("--logprob-chunk-tokens", type=int, default=4096, help="0: the whole logits at once")
    ap.add_argument(
        "--variants", default="base", help=f"comma-separated, each '+'-joined knobs of: {', '.join(KNOBS)}"
    )
    ap.add_argument("--peak-flops", type=float, default=H200_BF16_PEAK)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--reduce-every-micro-batch", action="store_true", help="cluster.fsdp.reduce_every_micro_batch"
    )
    ap.add_argument("--memory-table", action="store_true", help="print the computed static memory and exit")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if args.memory_table:
        print(memory_table())
        return
    if args.out is None:
        ap.error("--out is required")
    if args.tiny:
        args.seq_len, args.seqs, args.micro_batch_tokens = min(args.seq_len, 32), min(args.seqs, 4), 64

    import torch

    from turngym.trainer.distributed import init_distributed

    dist = init_distributed("auto")
    device = dist.device(None) or ("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        variant_overrides(v)  # an unknown knob fails before any model is built
    for strategy in args.strategies.split(","):
        for variant in variants:
            row = run_strategy(args, strategy.strip(), dist, device, variant)
            rows.append(merge_ranks(dist.all_gather(row)))
    add_ratios(rows)
    if dist.is_main:
        card = torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu"
        print(table(rows))
        print(f"MFU against a peak of {args.peak_flops:.4g} FLOP/s per device ({card})")
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        result = {"card": card, "peak_flops": args.peak_flops, "args": settings, "rows": rows}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    if dist.enabled:
        import torch.distributed

        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
