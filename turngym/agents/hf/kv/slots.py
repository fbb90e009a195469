"""The slots engine's KV: one static buffer per layer and for keys and values,
``[slots, kv_heads, max_context + 1, head_dim]``; a request owns a slot and its tokens sit
left-aligned in it (column = position), so a decode step has the same shapes whenever the same slots
and context bucket are in use. The last column is scratch: padded queries write there and nothing
reads it.

``SlotKV`` allocates the buffers on first use (``buffers()``: keys and values of every layer are views
of one allocation, so one address says where they all are), gives them back (``free()``; ``release()``
drops only the keys and values, for an engine's sleep), and copies rows between slots on the device for
prefix sharing (``copy_rows``); ``SlotBatch`` is the scheduler's view of which request holds each slot
and how many columns it has written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from turngym.agents.hf.request import Request

Copy = tuple[int, int, int]  # (donor slot, new slot, columns)


@dataclass
class SlotBatch:
    """The scheduler's view of the slots: each slot's request (None: free) and how many cache
    columns it has written (= the position of its next token)."""

    slots: list[Request | None]
    lengths: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.lengths = [0] * len(self.slots)

    @property
    def rows(self) -> list[Request]:
        return [r for r in self.slots if r is not None]

    @property
    def active(self) -> int:
        return sum(r is not None and r.parked is None for r in self.slots)

    def live(self) -> list[int]:
        """Slots whose request is generating (not parked)."""
        return [s for s, r in enumerate(self.slots) if r is not None and r.parked is None]

    def free(self, s: int) -> None:
        self.slots[s], self.lengths[s] = None, 0


class SlotCache:
    """What transformers' attention layers see as ``past_key_values``: ``update`` writes a pass's
    new keys and values where the pass's plan says (``index``: flat row of each new key) and returns
    the columns the pass attends to: slots ``0..width-1`` as a view, or the slots in ``rows``."""

    def __init__(self, keys: list[Any], values: list[Any]):
        self.keys, self.values = keys, values
        self.index: Any = None
        self.rows: Any = None
        self.width = 0
        self.columns = 0

    def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any):
        k, v = self.keys[layer_idx], self.values[layer_idx]
        d = k.shape[-1]
        flat = self.index.reshape(-1)
        k.view(-1, d).index_copy_(0, flat, key_states.reshape(-1, d))
        v.view(-1, d).index_copy_(0, flat, value_states.reshape(-1, d))
        if self.rows is None:
            return k[: self.width, :, : self.columns], v[: self.width, :, : self.columns]
        return k[self.rows, :, : self.columns], v[self.rows, :, : self.columns]


class SlotKV:
    """The KV slots of ``model``: ``slots`` rows of ``max_context`` columns (and the scratch one) on
    ``device``. ``cache`` is None until ``buffers()`` makes them; ``row_base[s, h]`` is the flat row
    of (slot, head, column 0) in a layer's buffer viewed as ``[-1, head_dim]``; ``columns`` the
    column indices; ``arena`` the one tensor every layer's keys and values are views of."""

    def __init__(self, model: Any, slots: int, max_context: int, device: Any):
        self.model, self.slots, self.max_context, self.device = model, slots, max_context, device
        self.bytes = kv_cache_bytes(model, slots, max_context + 1)
        self.cache: SlotCache | None = None
        self.arena: Any = None
        self.row_base: Any = None
        self.columns: Any = None

    @property
    def address(self) -> int | None:
        """Where the keys and values are on the device (None: not allocated); what captured graphs read."""
        return None if self.arena is None else int(self.arena.data_ptr())

    def buffers(self) -> SlotCache:
        """The slots' key and value buffers, made on first use (the index tensors only if they are
        gone too: a graph captured before a ``release()`` reads them at their addresses)."""
        if self.cache is not None:
            return self.cache
        import torch

        config = self.model.config
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        dtype = next(self.model.parameters()).dtype
        slots, columns, dev = self.slots, self.max_context + 1, self.device
        shape = (2, config.num_hidden_layers, slots, kv_heads, columns, head_dim)
        self.arena = torch.zeros(shape, dtype=dtype, device=dev)
        if self.row_base is None:
            self.row_base = torch.arange(slots * kv_heads, device=dev).view(slots, kv_heads) * columns
            self.columns = torch.arange(columns, device=dev)
        layers = range(config.num_hidden_layers)  # one view a layer (select, not unbind: writable in place)
        self.cache = SlotCache([self.arena[0, i] for i in layers], [self.arena[1, i] for i in layers])
        return self.cache

    def release(self) -> int:
        """Drop the keys and values (their contents are lost; the index tensors stay where they are);
        the bytes given back (0 when none were allocated). The next ``buffers()`` makes them again."""
        freed = self.bytes if self.arena is not None else 0
        self.cache, self.arena = None, None
        return freed

    def free(self) -> None:
        """Drop the buffers and the index tensors (the next ``buffers()`` makes them again)."""
        self.release()
        self.row_base, self.columns = None, None

    def copy_rows(self, copies: list[Copy]) -> None:
        """Copy the first ``columns`` cache columns of each donor slot into its new slot, every layer,
        on the device and in place (the captured graphs keep reading the same storage). All donors
        are read before any slot is written."""
        import torch

        cache = self.buffers()
        n = max(c for _, _, c in copies)  # a shorter prefix copies a few extra columns, never read
        src = torch.tensor([a for a, _, _ in copies], device=self.device)
        dst = torch.tensor([b for _, b, _ in copies], device=self.device)
        with torch.inference_mode():
            for t in (*cache.keys, *cache.values):
                t[:, :, :n].index_copy_(0, dst, t[src, :, :n])


def kv_cache_bytes(model: Any, slots: int, columns: int) -> int:
    """Bytes of the slots' keys and values for ``model`` (every layer, its dtype)."""
    config = model.config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    size = next(model.parameters()).element_size()
    return 2 * config.num_hidden_layers * slots * kv_heads * columns * head_dim * size


def free_device_bytes(device: Any) -> int | None:
    """Free memory of a CUDA device (None elsewhere: no budget to check)."""
    if getattr(device, "type", str(device)) != "cuda":
        return None
    import torch

    return int(torch.cuda.mem_get_info(device)[0])
