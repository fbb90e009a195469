"""Prefill passes of the slots engine replayed as CUDA graphs (``PrefillGraphs``, a mixin of
``turngym.agents.hf_slots.HFSlotBackend``).

Why: an eager prefill pass of a small model is host-bound like an eager decode step. On the H200 of
benchmarks/gpu_results.md (session 12) the host took 12-20 ms to queue one pass of SmolLM2's fast
forward (some 600 kernels), while the GPU's work for a few rows of a turn's observation is well under
a millisecond; in an agentic rollout every turn starts with one. So a pass whose shape comes back is
captured and replayed:

* **Buckets.** Rows, the longest feed and the attended span are rounded up (rows and feed to powers
  of two, the span to ``64 * 2^i``), capped at the slots and ``max_context``; padded rows and
  queries write only the scratch column past ``max_context`` (which nothing reads) and attend to
  column 0, so the real rows' keys, values and logits are the eager pass's.
* **Second use.** A bucket's first pass runs eagerly; its second captures the graph (a warm-up on a
  side stream, then the capture, in the decode graphs' memory pool), later ones replay it. Shapes a
  workload meets once cost no capture.
* **Bounds.** Only buckets of at most ``prefill_graph_tokens`` (rows x feed, default 16384) are
  captured; larger passes stay eager. Only with the fast forward (``turngym.agents.hf_fast``):
  transformers' own mask handling is not capture-safe. A capture that fails (out of memory, an op
  that cannot be captured) turns prefill graphs off for the backend with a warning
  (``stats["prefill_graph_fallbacks"]``); decode graphs stay on.

``stats``: ``prefill_graph_captures``, ``prefill_graph_replays``, ``prefill_graph_fallbacks``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

log = logging.getLogger(__name__)

MIN_FEED = 16  # the smallest feed bucket


def bucket(n: int, smallest: int, cap: int) -> int:
    """The smallest ``smallest * 2^i`` at or above ``n``, at most ``cap``."""
    b = smallest
    while b < n:
        b *= 2
    return min(b, cap)


class PrefillGraphs:
    """Captured prefill passes by bucket (see the module doc). The backend provides ``cuda_graphs``,
    ``_fast``, ``max_batch_size``, ``max_context``, ``device``, ``stats``, ``_pool``, ``_pinned(host)`` and
    ``_prefill_logits(ids, cols, slots, span)``."""

    def _init_prefill_graphs(self, tokens: int) -> None:
        if tokens < 0:
            raise ValueError(f"prefill_graph_tokens must be >= 0 (0: off), got {tokens}")
        self.prefill_graph_tokens = tokens
        self._prefill_graphs: dict[tuple[int, int, int], tuple[Any, Any, Any, Any, Any]] = {}
        self._prefill_seen: Counter = Counter()
        self.stats.update(prefill_graph_captures=0, prefill_graph_replays=0, prefill_graph_fallbacks=0)

    def _prefill_bucket(self, rows: int, width: int, span: int, columns: int) -> tuple[int, int, int] | None:
        """The bucket a pass of ``rows`` x ``width`` feeds over ``span`` columns replays from, or None:
        run it eagerly (graphs off, too large, or the bucket's first pass). ``columns``: the smallest
        span bucket."""
        if not (self.cuda_graphs and self._fast is not None and self.prefill_graph_tokens):
            return None
        shape = (
            bucket(rows, 1, self.max_batch_size),
            bucket(width, MIN_FEED, self.max_context),
            bucket(span, columns, self.max_context),
        )
        if shape[0] * shape[1] > self.prefill_graph_tokens:
            return None
        self._prefill_seen[shape] += 1
        if shape not in self._prefill_graphs and self._prefill_seen[shape] < 2:
            return None
        return shape

    def _prefill_replay(self, shape: tuple[int, int, int], ids: Any, cols: Any, slots: Any) -> Any:
        """The bucket's logits ``[rows, vocab]`` for these (padded, host) inputs, from its graph
        (captured now if new); None when the capture failed (the caller runs the pass eagerly)."""
        entry = self._prefill_graphs.get(shape) or self._capture_prefill(shape)
        if entry is None:
            return None
        graph, ids_in, cols_in, slots_in, out = entry
        for dst, host in ((ids_in, ids), (cols_in, cols), (slots_in, slots)):
            dst.copy_(self._pinned(host), non_blocking=True)  # queued, not waited for
        graph.replay()
        self.stats["prefill_graph_replays"] += 1
        return out

    def _capture_prefill(self, shape: tuple[int, int, int]) -> tuple | None:
        import torch

        rows, width, span = shape
        dev = self.device
        t0 = time.perf_counter()
        try:
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            ids = torch.zeros((rows, width), dtype=torch.long, device=dev)
            cols = torch.full((rows, width), self.max_context, dtype=torch.long, device=dev)  # scratch only
            slots = torch.zeros(rows, dtype=torch.long, device=dev)
            side = torch.cuda.Stream(device=dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                self._prefill_logits(ids, cols, slots, span)  # warm-up: writes the scratch column only
            torch.cuda.current_stream(dev).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                out = self._prefill_logits(ids, cols, slots, span)
        except Exception as e:  # noqa: BLE001 - out of memory or an op that cannot be captured
            self.prefill_graph_tokens = 0
            self._prefill_graphs.clear()
            self.stats["prefill_graph_fallbacks"] += 1
            torch.cuda.synchronize(dev)
            log.warning(
                "CUDA graph capture of a prefill pass failed (%s: %s); prefilling eagerly from now on",
                type(e).__name__,
                e,
            )
            return None
        entry = (graph, ids, cols, slots, out)
        self._prefill_graphs[shape] = entry
        self.stats["prefill_graph_captures"] += 1
        self.stats["capture_s"] += time.perf_counter() - t0
        return entry
