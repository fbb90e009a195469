"""The slots engine's attention for transformers' own forward (when the fast forward cannot run a
model): registered with transformers as ``"turngym_slots"`` and switched on only during the engine's
passes. A decode step does grouped-query attention with two matmuls straight on the cache buffers
(no ``repeat_kv`` copy of the whole cache per layer and step); prefill uses SDPA."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

ATTENTION = "turngym_slots"  # the attention function's name in transformers' registry


@functools.cache
def register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, slot_attention)


@contextlib.contextmanager
def slot_attention_on(model: Any) -> Iterator[None]:
    """The model's attention is ``slot_attention`` for the pass (the caller holds the model lock)."""
    config = model.config
    saved = config._attn_implementation
    config._attn_implementation = ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = saved


def slot_attention(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Any, None]:
    """Attention over slot-cache columns with a boolean ``[rows, 1, queries, columns]`` mask.
    One query (a decode step): query heads grouped by their key/value head, two matmuls on the
    cache's own strides. Several (prefill): SDPA on repeated key/value heads."""
    import torch

    b, h, n, d = query.shape
    kv = key.shape[1]
    if scaling is None:
        scaling = d**-0.5
    if n > 1:
        from torch.nn.functional import scaled_dot_product_attention

        if h != kv:
            key, value = key.repeat_interleave(h // kv, dim=1), value.repeat_interleave(h // kv, dim=1)
        out = scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=scaling)
        return out.transpose(1, 2).contiguous(), None
    q = query.reshape(b, kv, h // kv, d)
    scores = torch.matmul(q, key.transpose(-1, -2)).float() * scaling
    scores = scores.masked_fill(~attention_mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    return torch.matmul(probs, value).reshape(b, 1, h, d), None
