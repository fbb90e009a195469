"""Out-of-memory errors that say which knob to turn: the update's and the rollout's call sites wrap
their work in :func:`explain_oom` (and the rollout's masked rows go through
:func:`check_rollout_oom`), which turns a ``torch.OutOfMemoryError`` into a
:class:`TrainerOutOfMemory` (a subclass, so existing handlers still catch it) whose message names the
phase, the settings that size its memory with their values, and the allocator's numbers
(``torch.cuda.memory_stats`` and the device's free/total memory).

    with explain_oom("update", update_knobs(cfg, policy), device):
        loss.backward()
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

GIB = 2**30


class TrainerOutOfMemory(RuntimeError):
    """A phase of training ran out of device memory; ``phase``, ``knobs`` and ``memory`` say where,
    what to turn and what the allocator held. Raised as a ``torch.OutOfMemoryError`` subclass
    (:func:`explain_oom` builds the class on first use so this module imports without torch)."""


def memory_numbers(device: Any) -> dict[str, float]:
    """GiB the caching allocator holds on ``device`` (allocated, reserved, peak allocated) and the
    device's free and total memory; empty for a device that is not CUDA."""
    import torch

    dev = torch.device(device) if device is not None else None
    if dev is None or dev.type != "cuda" or not torch.cuda.is_available():
        return {}
    stats = torch.cuda.memory_stats(dev)
    free, total = torch.cuda.mem_get_info(dev)
    return {
        "allocated_gib": stats.get("allocated_bytes.all.current", 0) / GIB,
        "reserved_gib": stats.get("reserved_bytes.all.current", 0) / GIB,
        "peak_allocated_gib": stats.get("allocated_bytes.all.peak", 0) / GIB,
        "free_gib": free / GIB,
        "total_gib": total / GIB,
    }


def phase_peak_gib(device: Any) -> float | None:
    """Peak GiB allocated on a CUDA ``device`` since the last call, and a reset, so each phase of a
    step reports its own peak; None for a device that is not CUDA."""
    import torch

    dev = torch.device(device) if device is not None else None
    if dev is None or dev.type != "cuda" or not torch.cuda.is_available():
        return None
    peak = torch.cuda.max_memory_allocated(dev) / GIB
    torch.cuda.reset_peak_memory_stats(dev)
    return peak


def update_knobs(cfg: Any, sharded: bool, tokens: int | None = None) -> dict[str, str]:
    """The settings that size the update's memory, each with its value and which way to turn it."""
    o, m, f = cfg.optim, cfg.model, cfg.cluster.fsdp
    knobs = {
        "optim.micro_batch_tokens": f"{o.micro_batch_tokens} (lower it: activations and logits scale with it"
        + (f"; this micro-batch had {tokens} padded tokens)" if tokens is not None else ")"),
        "model.gradient_checkpointing": f"{m.gradient_checkpointing} (true: keep one layer's activations)",
        "optim.logprob_chunk_tokens": f"{o.logprob_chunk_tokens} (lower it: the head's logits exist for "
        "this many positions at a time)",
        "optim.logprob_kernel": f"{o.logprob_kernel} (liger on CUDA: no [tokens, vocab] logits)",
        "optim.optimizer": f"{o.optimizer} (adamw_8bit: ~2 bytes a parameter of state instead of 8)",
    }
    if sharded:
        knobs["cluster.fsdp.release_full_copy"] = f"{f.release_full_copy} (true: the rollout copy freed)"
        knobs["cluster.fsdp.reduce_every_micro_batch"] = (
            f"{f.reduce_every_micro_batch} (true: no whole-model gradient kept between micro-batches)"
        )
        knobs["cluster.nproc"] = f"{cfg.cluster.nproc} (more ranks: smaller shards)"
    else:
        knobs["cluster.strategy"] = f"{cfg.cluster.strategy} (fsdp: shard weights, gradients and state)"
    return knobs


def rollout_knobs(cfg: Any) -> dict[str, str]:
    """The settings that size the rollout engine's memory (its batch and its KV slots)."""
    spec = cfg.backend_spec()
    return {
        "rollout.backend.max_batch_size": f"{spec.max_batch_size} (lower it: rows generated together, "
        "each with its KV slot)",
        "rollout.max_context": f"{cfg.rollout.max_context} (lower it: KV tokens a slot holds; the slots "
        "take at most half the device's free memory, turngym.agents.hf.slots.KV_SHARE)",
        "model.gpu_memory_fraction": f"{cfg.model.gpu_memory_fraction} (this process's cap on the card)",
        "rollout.keep_backend": f"{cfg.rollout.keep_backend} (false: the engine's slots and graphs are "
        "given back before the update)",
    }


def describe(phase: str, knobs: dict[str, str], memory: dict[str, float], cause: str) -> str:
    lines = [f"out of device memory during the {phase}: {cause}"]
    if memory:
        lines.append(
            "  memory (GiB): " + ", ".join(f"{k.removesuffix('_gib')} {v:.2f}" for k, v in memory.items())
        )
    lines.append("  the settings that size it (turn one):")
    lines += [f"    {k} = {v}" for k, v in knobs.items()]
    return "\n".join(lines)


def check_rollout_oom(trajs: list[Any], knobs: Any, device: Any) -> None:
    """Raise :class:`TrainerOutOfMemory` if the rollout's engine ran out of memory. The engine masks
    the rows of a failed pass (``backend_error``) rather than raising; training on the rest would
    drop the longest trajectories (the ones whose KV ran out) without a word, so the run stops."""
    hit = [t for t in trajs if t.masked and "OutOfMemoryError" in str(t.metadata.get("error", ""))]
    if not hit:
        return
    knobs = knobs() if callable(knobs) else knobs
    memory = memory_numbers(device)
    cause = f"{len(hit)}/{len(trajs)} trajectories masked by it; first: {str(hit[0].metadata['error'])[:300]}"
    err = _oom_class()(describe("rollout", knobs, memory, cause))
    err.phase, err.knobs, err.memory = "rollout", knobs, memory
    raise err


_OOM_CLASS: type | None = None


def _oom_class() -> type:
    """``TrainerOutOfMemory`` mixed with ``torch.OutOfMemoryError``: caught by either name."""
    global _OOM_CLASS
    if _OOM_CLASS is None:
        import torch

        _OOM_CLASS = type("TrainerOutOfMemory", (TrainerOutOfMemory, torch.OutOfMemoryError), {})
    return _OOM_CLASS


@contextmanager
def explain_oom(phase: str, knobs: dict[str, str] | Any, device: Any) -> Iterator[None]:
    """Re-raise a ``torch.OutOfMemoryError`` from the block as a :class:`TrainerOutOfMemory` naming
    ``phase``, the ``knobs`` (a dict, or a callable that makes one) and the memory numbers."""
    import torch

    try:
        yield
    except TrainerOutOfMemory:
        raise
    except torch.OutOfMemoryError as e:
        memory = memory_numbers(device)
        knobs = knobs() if callable(knobs) else knobs
        cause = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
        err = _oom_class()(describe(phase, knobs, memory, cause))
        err.phase, err.knobs, err.memory = phase, knobs, memory
        raise err from e
