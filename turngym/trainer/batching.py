"""Packing token sequences into padded micro-batches and scoring them with a causal LM."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any


def micro_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Group sequence indices (sorted by length) so that ``len(group) * longest <= max_tokens``.

    A sequence longer than ``max_tokens`` gets a micro-batch of its own.
    """
    order = sorted(range(len(lengths)), key=lambda k: lengths[k])
    out: list[list[int]] = []
    for k in order:
        if out and lengths[k] * (len(out[-1]) + 1) <= max_tokens:
            out[-1].append(k)
        else:
            out.append([k])
    return out


def pad_right(rows: Sequence[Sequence[float]], value: float, dtype: Any, device: Any) -> Any:
    import torch

    width = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, r in enumerate(rows):
        if len(r):
            out[i, : len(r)] = torch.as_tensor(list(r), dtype=dtype)
    return out.to(device)


@contextmanager
def train_mode_without_dropout(model: Any) -> Iterator[None]:
    """``model.train()`` with every dropout off, restored after.

    transformers checkpoints gradients only in train mode, and the trainer wants no dropout (its
    log-probs must match the sampling ones): so train mode, with ``nn.Dropout`` modules in eval mode
    and attention-dropout rates (``attention_dropout`` attributes) at 0 while it lasts.
    """
    import torch

    was = model.training
    saved: list[tuple[Any, float]] = []
    model.train()
    for mod in model.modules():
        if isinstance(mod, torch.nn.modules.dropout._DropoutNd):
            mod.eval()
        rate = getattr(mod, "attention_dropout", None)
        if isinstance(rate, float) and rate > 0:
            saved.append((mod, rate))
            mod.attention_dropout = 0.0
    try:
        yield
    finally:
        for mod, rate in saved:
            mod.attention_dropout = rate
        model.train(was)


def mixed_precision(model: Any, dtype: str | None):
    """``torch.autocast`` on the model's device in ``dtype`` ("bfloat16"), or a no-op for None: matmuls
    run in bf16 while the weights, their gradients and the optimizer stay in the model's own dtype.
    Wrap forward passes only (the backward pass follows the forward's casts)."""
    import contextlib

    import torch

    if not dtype:
        return contextlib.nullcontext()
    if dtype != "bfloat16":
        raise ValueError(f"autocast supports 'bfloat16' (no loss scaling is done), got {dtype!r}")
    device_type = next(model.parameters()).device.type
    return torch.autocast(device_type=device_type, dtype=torch.bfloat16)


@contextmanager
def matmul_precision(precision: str | None) -> Iterator[None]:
    """``torch.set_float32_matmul_precision(precision)`` for the block, restored after ("highest":
    fp32 products; "high": TF32 tensor cores on CUDA; "medium": bf16). None changes nothing."""
    import torch

    if precision is None:
        yield
        return
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def token_logprobs(
    model: Any,
    input_ids: Any,
    attention_mask: Any,
    with_entropy: bool = False,
    chunk_tokens: int | None = None,
    kernel: str = "torch",
):
    """``logp[:, t]`` = log π(input_ids[:, t] | input_ids[:, :t]) for t >= 1 (column 0 is 0).

    Returns ``(logp, entropy)`` with shapes ``[B, L]``; entropy is None unless asked for.

    ``chunk_tokens``: apply the output head to at most this many positions at a time, each chunk
    recomputed in the backward pass, so the full ``[B, L, vocab]`` fp32 logits (and their
    log-softmax) never exist at once — for a 49k vocabulary and 16k tokens that is 3 GB a copy. The
    values equal the unchunked ones up to float rounding. Models wrapped in DDP, or without
    ``logits_to_keep``/hidden states, take the unchunked path. Under FSDP2 the head belongs to the
    root unit, which stays gathered from its forward to its backward, so the chunks make no
    collective of their own (ranks may run different numbers of them).

    ``kernel="liger"``: liger-kernel's fused linear + cross-entropy (Triton, CUDA only) gives the
    picked log-probs without the logits ever existing beyond its own chunk, forward or backward; on
    CPU, or when the entropy is asked for (the kernel does not return it), the torch path runs.
    """
    import torch

    # DDP hides the head (and calls it inside its own forward, where DDP's hooks see it)
    if (chunk_tokens or kernel != "torch") and not isinstance(
        model, torch.nn.parallel.DistributedDataParallel
    ):
        head = _output_head(model)
        if head is not None:
            fused = kernel == "liger" and not with_entropy and input_ids.device.type == "cuda"
            return _chunked_logprobs(
                model, head, input_ids, attention_mask, with_entropy, chunk_tokens or input_ids.numel(), fused
            )
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    logp_all = torch.log_softmax(logits, dim=-1)
    picked = logp_all.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    zero = torch.zeros_like(picked[:, :1])
    logp = torch.cat([zero, picked], dim=1)
    entropy = None
    if with_entropy:
        ent = -(logp_all.exp() * logp_all).sum(-1)
        entropy = torch.cat([zero, ent], dim=1)
    return logp, entropy


def _output_head(model: Any) -> Any:
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return head if head is not None and hasattr(head, "weight") else None


def _head_logprobs(head: Any, hidden: Any, targets: Any, with_entropy: bool):
    import torch

    logits = head(hidden).float()
    lse = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(-1, targets[:, None]).squeeze(-1) - lse
    if not with_entropy:
        return picked, torch.zeros_like(picked)
    p = torch.softmax(logits, dim=-1)
    return picked, lse - (p * logits).sum(-1)


def liger_linear_cross_entropy() -> Any:
    """liger-kernel's fused linear + cross-entropy function, or an ImportError that says what to install."""
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy
    except ImportError as e:
        raise ImportError(
            f"optim.logprob_kernel=liger needs liger-kernel (pip install 'turngym[train]'): {e}"
        ) from e
    return liger_fused_linear_cross_entropy


def _liger_logprobs(head: Any, hidden: Any, targets: Any) -> Any:
    """The picked log-probs through liger-kernel's fused linear + cross-entropy (per-token losses,
    ``reduction="none"``; its backward recomputes the logits chunk by chunk)."""
    weight = head.weight
    bias = getattr(head, "bias", None)
    if hidden.dtype != weight.dtype:  # autocast is not seen inside the Triton kernel: one dtype
        hidden = hidden.to(weight.dtype)
    loss = liger_linear_cross_entropy()(hidden, weight, targets, bias=bias, reduction="none")
    return -loss.float()


def _chunked_logprobs(model, head, input_ids, attention_mask, with_entropy: bool, chunk: int, fused=False):
    import torch
    from torch.utils.checkpoint import checkpoint

    out = model(
        input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, logits_to_keep=1
    )
    hidden = out.hidden_states[-1][:, :-1]
    b, n, d = hidden.shape
    flat, targets = hidden.reshape(b * n, d), input_ids[:, 1:].reshape(b * n)
    zero = hidden.new_zeros((b, 1), dtype=torch.float32)
    if fused:
        return torch.cat([zero, _liger_logprobs(head, flat, targets).reshape(b, n)], dim=1), None
    picked, ents = [], []
    grad = torch.is_grad_enabled() and flat.requires_grad
    for lo in range(0, b * n, chunk):
        args = (head, flat[lo : lo + chunk], targets[lo : lo + chunk], with_entropy)
        if grad:
            p, e = checkpoint(_head_logprobs, *args, use_reentrant=False)
        else:
            p, e = _head_logprobs(*args)
        picked.append(p)
        ents.append(e)
    logp = torch.cat([zero, torch.cat(picked).reshape(b, n)], dim=1)
    entropy = torch.cat([zero, torch.cat(ents).reshape(b, n)], dim=1) if with_entropy else None
    return logp, entropy
