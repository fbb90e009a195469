"""Packing token sequences into padded micro-batches and scoring them with a causal LM."""

from __future__ import annotations

from collections.abc import Sequence
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


def token_logprobs(model: Any, input_ids: Any, attention_mask: Any, with_entropy: bool = False):
    """``logp[:, t]`` = log π(input_ids[:, t] | input_ids[:, :t]) for t >= 1 (column 0 is 0).

    Returns ``(logp, entropy)`` with shapes ``[B, L]``; entropy is None unless asked for.
    """
    import torch

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
