"""The continuous engine's KV: one left-padded ``DynamicCache`` for the running rows, with a 2-D
attention mask, whose full-attention layers grow in place (buffers with spare columns) instead of
concatenating a copy of the whole cache every step.

``PaddedKV`` keeps rows (trimming the leading columns no row uses), merges a prefilled part into the
running batch (left-padding the shorter cache), copies a row for a fork (prefix sharing) and compacts
the cache (every row's tokens right-aligned) once more than half of it is padding.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from turngym.agents.backend import BackendError
from turngym.agents.hf.request import Request


@dataclass
class Batch:
    """Rows of one left-padded KV cache: its attention mask, each row's next position and next input.
    A parked row (finished, kept for its route's next turn) feeds nothing until it is resumed."""

    rows: list[Request] = field(default_factory=list)
    cache: Any = None
    mask: Any = None  # [B, T] long, 0 on padding and on columns a row did not feed
    pos: Any = None  # [B] position id of the row's next token
    pending: Any = None  # [B] last sampled token, not yet in the cache

    @property
    def active(self) -> int:
        return sum(r.parked is None for r in self.rows)


class PaddedKV:
    """Row operations on a ``Batch``'s cache, mask, positions and pending tokens (on ``device``)."""

    def __init__(self, device: Any):
        self.device = device

    def new_batch(self) -> Batch:
        return Batch()

    def keep(self, batch: Batch, keep: list[int]) -> None:
        """Keep only these rows, and trim the leading cache columns none of them uses."""
        if len(keep) == len(batch.rows):
            return
        if not keep:
            batch.__init__()  # type: ignore[misc]
            return
        import torch

        idx = torch.tensor(keep, device=self.device)
        batch.rows = [batch.rows[i] for i in keep]
        mask = batch.mask[idx]
        start = int(mask.any(dim=0).nonzero()[0, 0])
        for layer in batch.cache.layers:
            layer.keys = layer.keys[idx, :, start:]
            layer.values = layer.values[idx, :, start:]
        batch.mask, batch.pos, batch.pending = mask[:, start:], batch.pos[idx], batch.pending[idx]

    def merge(self, batch: Batch, part: Batch) -> None:
        """Join ``part``'s rows to the running batch, left-padding the shorter cache."""
        import torch
        from torch.nn.functional import pad

        if not part.rows:
            return
        if not batch.rows:
            batch.rows, batch.cache, batch.mask = part.rows, part.cache, part.mask
            batch.pos, batch.pending = part.pos, part.pending
            return
        t_old, t_new = batch.mask.shape[1], part.mask.shape[1]
        width = max(t_old, t_new)
        for old, new in zip(batch.cache.layers, part.cache.layers, strict=True):
            for name in ("keys", "values"):
                a, b = getattr(old, name), getattr(new, name)
                a = pad(a, (0, 0, width - t_old, 0))
                b = pad(b, (0, 0, width - t_new, 0))
                setattr(old, name, torch.cat([a, b], dim=0))
        batch.mask = torch.cat([pad(batch.mask, (width - t_old, 0)), pad(part.mask, (width - t_new, 0))])
        batch.pos = torch.cat([batch.pos, part.pos])
        batch.pending = torch.cat([batch.pending, part.pending])
        batch.rows = batch.rows + part.rows

    def copy_row(self, batch: Batch, i: int) -> None:
        """Append a copy of row ``i``'s cache, mask, position and pending token (a fork's start)."""
        import torch

        idx = torch.tensor([i], device=self.device)
        for layer in batch.cache.layers:
            layer.keys = torch.cat([layer.keys, layer.keys[idx]])
            layer.values = torch.cat([layer.values, layer.values[idx]])
        batch.mask = torch.cat([batch.mask, batch.mask[idx]])
        batch.pos = torch.cat([batch.pos, batch.pos[idx]])
        batch.pending = torch.cat([batch.pending, batch.pending[idx]])

    def mask_after(self, batch: Batch, i: int, n: int) -> None:
        """Mask out row ``i``'s columns after its first ``n`` tokens (a resumed prompt diverges)."""
        m = batch.mask[i]
        batch.mask[i] = m * (m.cumsum(0) <= n)

    def compact(self, batch: Batch) -> bool:
        """Once more than half the cache is padding, right-align every row's tokens and drop the
        columns no row uses (True: it did)."""
        import torch

        if not batch.rows or batch.mask.numel() <= 2 * int(batch.mask.sum()):
            return False
        order = torch.argsort(batch.mask, dim=1, stable=True)  # padding first, tokens in order last
        mask = torch.gather(batch.mask, 1, order)
        start = int(mask.any(dim=0).nonzero()[0, 0])
        order, batch.mask = order[:, start:], mask[:, start:]
        for layer in batch.cache.layers:
            for name in ("keys", "values"):
                t = getattr(layer, name)
                idx = order[:, None, :, None].expand(-1, t.shape[1], -1, t.shape[3])
                setattr(layer, name, torch.gather(t, 2, idx))
        return True


def growing_cache(config: Any) -> Any:
    """A ``DynamicCache`` whose full-attention layers grow in place (see ``growing_layer_class``)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=config)
    grow = growing_layer_class()
    cache.layers = [grow() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


@functools.cache
def growing_layer_class() -> type:
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        """A ``DynamicLayer`` whose keys and values are views of buffers with spare columns: a step
        writes its new columns in place, where ``DynamicLayer`` concatenates (a fresh allocation and
        a copy of the whole cache, per layer and step). When the scheduler replaces ``keys`` and
        ``values`` (rows joining or leaving, compaction), the next step moves them into new buffers
        with headroom (half the length again, at least 64 columns)."""

        _kbuf: Any = None
        _vbuf: Any = None

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            keys, n = self.keys, key_states.shape[-2]
            if keys.numel() == 0:
                keys = self.keys = key_states[..., :0, :]
                self.values = value_states[..., :0, :]
            t = keys.shape[-2]
            buf = self._kbuf
            if not (
                buf is not None
                and keys.data_ptr() == buf.data_ptr()
                and keys.shape[:2] == buf.shape[:2]
                and keys.stride() == buf.stride()
                and self.values.data_ptr() == self._vbuf.data_ptr()
                and t + n <= buf.shape[-2]
            ):
                cap = t + n + max(64, (t + n) // 2)
                shape = (*key_states.shape[:2], cap, key_states.shape[-1])
                self._kbuf, self._vbuf = keys.new_empty(shape), self.values.new_empty(shape)
                self._kbuf[..., :t, :] = keys
                self._vbuf[..., :t, :] = self.values
            self._kbuf[..., t : t + n, :] = key_states
            self._vbuf[..., t : t + n, :] = value_states
            self.keys, self.values = self._kbuf[..., : t + n, :], self._vbuf[..., : t + n, :]
            return self.keys, self.values

    return GrowingLayer


def check_cache(cache: Any) -> None:
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    full = (DynamicLayer, growing_layer_class())
    if not layers or any(type(layer) not in full for layer in layers):
        kinds = sorted({type(layer).__name__ for layer in layers or []}) or [type(cache).__name__]
        raise BackendError(
            f"continuous batching needs full-attention DynamicLayer caches; this model uses {kinds}"
        )
