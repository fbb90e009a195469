"""The continuous engine's runner: one eager forward pass over the padded batch for a ``StepPlan``
(running rows feed their pending token, resumed rows their prompt after the reused prefix, joiners
their whole prompt, all right-aligned in one window), then one token sampled per live row.

On CUDA the passes run SDPA without cuDNN's attention kernel (``cudnn_attention=True`` allows it):
cuDNN builds an execution plan for every new (batch, query, key) shape, and a continuous batch meets
a new shape nearly every pass (measurements: docs/engines.md). ``default_fuse_tokens`` is how much
padding a fused prefill+decode pass may add.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from turngym.agents.hf.kv.padded import Batch, check_cache, growing_cache
from turngym.agents.hf.parts import Engine
from turngym.agents.hf.plan import StepPlan
from turngym.agents.hf.sampling import RowSampler


class EagerRunner:
    """Runs ``StepPlan``s for ``engine`` (its model, lock, weights version, stats and trace).
    ``new_cache(config)``: the cache a batch starts with (``growing_cache``; a benchmark may swap it)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.sampler = RowSampler(engine.device)
        self.new_cache: Callable[[Any], Any] = growing_cache

    def forward(self, batch: Batch, plan: StepPlan) -> None:
        """One forward pass (``plan``). Running rows feed their pending token, resumed rows (index -> request)
        their prompt after the reused prefix, joiners (new rows, empty cache) their whole prompt,
        all right-aligned in one window; parked rows feed nothing. Where a row fed nothing its new
        columns are masked (``PaddedKV.compact`` removes them). On an empty batch this is a prefill."""
        import torch

        eng, resumes, joiners = self.engine, plan.resumes, plan.joiners
        dev, rows = eng.device, len(batch.rows)
        for i, r in resumes.items():
            batch.rows[i] = r
        feeds = {i: (r.prompt_ids[r.reuse :], r.reuse) for i, r in resumes.items()}
        feeds.update({rows + j: (r.prompt_ids, 0) for j, r in enumerate(joiners)})
        n, width = rows + len(joiners), max([1, *(len(f) for f, _ in feeds.values())])
        running = [i for i, r in enumerate(batch.rows) if r.parked is None and i not in feeds]
        if len(running) == n:  # a plain decode step
            ids, fed, pos = batch.pending[:, None], torch.ones_like(batch.mask[:, :1]), batch.pos[:, None]
        else:
            ids = torch.full((n, width), eng.pad_id, dtype=torch.long)
            fed = torch.zeros((n, width), dtype=torch.long)
            pos = torch.zeros((n, width), dtype=torch.long)
            for i, (f, start) in feeds.items():
                ids[i, width - len(f) :] = torch.tensor(f, dtype=torch.long)
                fed[i, width - len(f) :] = 1
                pos[i, width - len(f) :] = torch.arange(start, start + len(f))
            ids, fed, pos = ids.to(dev), fed.to(dev), pos.to(dev)
            if running:
                idx = torch.tensor(running, device=dev)
                ids[idx, -1], fed[idx, -1], pos[idx, -1] = batch.pending[idx], 1, batch.pos[idx]
        if batch.cache is None:
            cache, old_mask, old_pos = self.new_cache(eng.model.config), fed[:, :0], pos[:, -1]
        else:
            cache, old_mask, old_pos = batch.cache, batch.mask, batch.pos
            if joiners:
                for layer in cache.layers:
                    for name in ("keys", "values"):
                        t = getattr(layer, name)
                        setattr(layer, name, torch.cat([t, t.new_zeros((len(joiners), *t.shape[1:]))]))
                old_mask = torch.cat([old_mask, old_mask.new_zeros((len(joiners), old_mask.shape[1]))])
                old_pos = torch.cat([old_pos, old_pos.new_zeros(len(joiners))])
        mask = torch.cat([old_mask, fed.to(old_mask.dtype)], dim=1)
        t0, c0 = time.perf_counter(), time.thread_time()
        with eng.lock, torch.inference_mode(), eng.kernels():
            out = last_logits_pass(eng.model, ids, mask, pos, cache)
            version = eng.weights_version
        t_fwd = time.perf_counter()
        if batch.cache is None:
            check_cache(out.past_key_values)
        batch.rows = batch.rows + joiners
        batch.cache, batch.mask = out.past_key_values, mask
        batch.pos = torch.where(fed[:, -1].bool(), pos[:, -1] + 1, old_pos)
        batch.pending = self.sampler.sample(batch.rows, out.logits[:, -1], version)
        eng.stats["prompt_tokens"] += sum(len(f) for f, _ in feeds.values())
        eng.stats["reused_tokens"] += sum(r.reuse for r in resumes.values())
        if rows:
            eng.stats["steps"] += 1
            eng.stats["fused"] += bool(feeds)
            eng.stats["widths"][batch.active] += 1
        else:
            eng.stats["prefills"] += 1
        kind = "fused" if rows and feeds else "decode" if rows else "prefill"
        for r in [*resumes.values(), *joiners]:
            r.admitted = t0
        if eng.trace is not None:  # the pass ended at the sync ``RowSampler.sample`` does to read the tokens
            shape = (len(batch.rows), len(resumes) + len(joiners), width, mask.shape[1])
            cpu = time.thread_time() - c0
            eng.trace.append(("pass", t0, time.perf_counter(), kind, *shape, cpu, t_fwd - t0))


def last_logits_pass(model: Any, ids: Any, mask: Any, pos: Any, cache: Any) -> Any:
    """One forward pass over a KV cache that keeps only the last position's logits."""
    return model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=pos,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )


def attention_kernels(device: Any, cudnn: bool) -> Callable[[], Any]:
    """A context for the passes: on CUDA, SDPA without cuDNN's kernel (unless ``cudnn``), whose
    per-shape plan building costs more host time than a small model's whole step."""
    import contextlib

    if device.type != "cuda" or cudnn:
        return contextlib.nullcontext
    return WithoutCudnnAttention


class WithoutCudnnAttention:
    """Turns torch's cuDNN SDPA flag off while any pass of any backend in the process runs, and
    restores the caller's setting when the last one ends. The flag is process-wide, not per thread,
    so a plain save-and-restore per pass would let two scheduler threads restore each other's
    "off" for good; the other SDPA kernels keep whatever the process set."""

    _lock = threading.Lock()
    _depth = 0
    _saved = True

    def __enter__(self) -> None:
        import torch

        cls = type(self)
        with cls._lock:
            if cls._depth == 0:
                cls._saved = torch.backends.cuda.cudnn_sdp_enabled()
                torch.backends.cuda.enable_cudnn_sdp(False)
            cls._depth += 1

    def __exit__(self, *exc: object) -> None:
        import torch

        cls = type(self)
        with cls._lock:
            cls._depth -= 1
            if cls._depth == 0:
                torch.backends.cuda.enable_cudnn_sdp(cls._saved)


def default_fuse_tokens(model: Any, device: Any) -> int:
    """Padding tokens a fused prefill+decode pass may add: on CUDA as many as cost about one extra
    pass's launch overhead in FLOPs (~10 ms at ~400 TFLOP/s: ~26k tokens for a 76M model, ~300 for a
    7B one); none on CPU, where a pass is compute-bound and padding is never free."""
    if device.type != "cuda":
        return 0
    params = sum(p.numel() for p in model.parameters())
    return int(4e12 / (2 * max(params, 1)))
