"""Prefill passes of the slots engine replayed as CUDA graphs (``PrefillGraphs``, a mixin of
``turngym.agents.hf_slots.HFSlotBackend``).

Why: an eager prefill pass of a small model is host-bound like an eager decode step. On the H200 of
benchmarks/gpu_results.md (session 12) the host took 12-20 ms to queue one pass of SmolLM2's fast
forward (some 600 kernels), while the GPU's work for a few rows of a turn's observation is well under
a millisecond; in an agentic rollout every turn starts with one. So a pass whose shape comes back is
captured and replayed:

* **What a graph holds**: the whole pass on the device, from two uploaded input tensors (ids and
  columns with each row's slot, sampling settings and seed; temperatures, top-p and the first
  draws) to the rows' settings in their slots' buffers, the forward, the first token of each row
  sampled into the decode inputs and a ``[2, rows]`` output of tokens and logprobs. On a slow host
  the sampling and settings alone, launched op by op, took ~2.5 ms a pass (H200, session 15).
* **Buckets.** Rows, the longest feed and the attended span are rounded up (rows and feed to powers
  of two, the span to ``64 * 2^i``), capped at the slots and ``max_context``, and keyed by whether a
  row samples with top-k/top-p; padded rows and queries write only the scratch column past
  ``max_context`` (which nothing reads) and attend to column 0, and keep their settings and token in
  a spare slot past the last, so the real rows' keys, values, logits and tokens are the eager pass's.
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
        self._prefill_graphs: dict[tuple[int, int, int, bool], tuple[Any, Any, Any, Any]] = {}
        self._prefill_seen: Counter = Counter()
        self.stats.update(prefill_graph_captures=0, prefill_graph_replays=0, prefill_graph_fallbacks=0)

    def _prefill_bucket(
        self, rows: int, width: int, span: int, columns: int, filtered: bool
    ) -> tuple[int, int, int, bool] | None:
        """The bucket a pass of ``rows`` x ``width`` feeds over ``span`` columns replays from (rows,
        feed, span, and whether a row samples with top-k/top-p), or None: run it eagerly (graphs
        off, too large, or the bucket's first pass). ``columns``: the smallest span bucket."""
        if not (self.cuda_graphs and self._fast is not None and self.prefill_graph_tokens):
            return None
        key = (
            bucket(rows, 1, self.max_batch_size),
            bucket(width, MIN_FEED, self.max_context),
            bucket(span, columns, self.max_context),
            filtered,
        )
        if key[0] * key[1] > self.prefill_graph_tokens:
            return None
        self._prefill_seen[key] += 1
        if key not in self._prefill_graphs and self._prefill_seen[key] < 2:
            return None
        return key

    def _prefill_replay(self, key: tuple[int, int, int, bool], ints: Any, floats: Any) -> Any:
        """The bucket's ``[2, rows]`` first tokens and logprobs (its static output: read or copy it
        before the next replay) for these padded host inputs, from its graph (captured now if new);
        None when the capture failed (the caller runs the pass eagerly). The inputs' copies are
        queued, not waited for."""
        entry = self._prefill_graphs.get(key) or self._capture_prefill(key)
        if entry is None:
            return None
        graph, ints_in, floats_in, out = entry
        ints_in.copy_(self._pinned(ints), non_blocking=True)
        floats_in.copy_(self._pinned(floats), non_blocking=True)
        graph.replay()
        self.stats["prefill_graph_replays"] += 1
        return out

    def _capture_prefill(self, key: tuple[int, int, int, bool]) -> tuple | None:
        """Capture the bucket's pass. The static inputs start as padding rows only
        (``_prefill_padding``), so the warm-up writes nothing any row reads: the scratch column,
        the spare settings slot."""
        import torch

        rows, width, span, filtered = key
        dev = self.device
        t0 = time.perf_counter()
        try:
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            pad_ints, pad_floats = self._prefill_padding(width)
            ints_in = torch.tensor([pad_ints] * rows, dtype=torch.long, device=dev)
            floats_in = torch.tensor([pad_floats] * rows, dtype=torch.float32, device=dev)
            side = torch.cuda.Stream(device=dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                self._prefill_body(ints_in, floats_in, span, filtered)  # warm-up
            torch.cuda.current_stream(dev).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                out = self._prefill_body(ints_in, floats_in, span, filtered)
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
        entry = (graph, ints_in, floats_in, out)
        self._prefill_graphs[key] = entry
        self.stats["prefill_graph_captures"] += 1
        self.stats["capture_s"] += time.perf_counter() - t0
        return entry
