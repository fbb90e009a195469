"""Prefill passes of the slots engine replayed as CUDA graphs (``PrefillGraphs``, a part of
``turngym.agents.hf.runner.slots.SlotRunner``). An eager prefill pass of a small model is host-bound
like an eager decode step, and every turn of an agentic rollout starts with one (measurements:
docs/engines.md), so a pass whose shape comes back is captured and replayed:

* **What a graph holds**: the whole pass on the device, from two uploaded input tensors (ids and
  columns with each row's slot, sampling settings and seed; temperatures, top-p and the first
  draws) to the rows' settings in their slots' buffers, the forward, the first token of each row
  sampled into the decode inputs and a ``[2, rows]`` output of tokens and logprobs.
* **Buckets.** Rows, the longest feed and the attended span are rounded up (rows and feed to powers
  of two, the span to ``64 * 2^i``), capped at the slots and ``max_context``, and keyed by whether a
  row samples with top-k/top-p; padded rows and queries write only the scratch column past
  ``max_context`` (which nothing reads) and attend to column 0, and keep their settings and token in
  a spare slot past the last, so the real rows' keys, values, logits and tokens are the eager pass's.
* **Second use.** A bucket's first pass runs eagerly; its second captures the graph (a warm-up on a
  side stream, then the capture, in the decode graphs' memory pool), later ones replay it.
* **Bounds.** Only buckets of at most ``prefill_graph_tokens`` (rows x feed, default 16384) are
  captured, and only with the fast forward (``turngym.agents.hf.kernels.fast``): transformers' own
  mask handling is not capture-safe. A capture that fails turns prefill graphs off for the engine
  with a warning (``stats["prefill_graph_fallbacks"]``); decode graphs stay on.

``stats``: ``prefill_graph_captures``, ``prefill_graph_replays``, ``prefill_graph_fallbacks``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

from turngym.agents.hf.plan import MIN_FEED, bucket

log = logging.getLogger(__name__)


class PrefillGraphs:
    """``runner``'s captured prefill passes by bucket (see the module doc); ``tokens``: the largest
    bucket (rows x feed) captured, 0: off."""

    def __init__(self, runner: Any, tokens: int):
        if tokens < 0:
            raise ValueError(f"prefill_graph_tokens must be >= 0 (0: off), got {tokens}")
        self.runner, self.tokens = runner, tokens
        self.graphs: dict[tuple[int, int, int, bool], tuple[Any, Any, Any, Any]] = {}
        self.seen: Counter = Counter()
        runner.engine.stats.update(
            prefill_graph_captures=0, prefill_graph_replays=0, prefill_graph_fallbacks=0
        )

    def clear(self) -> None:
        self.graphs.clear()

    def bucket(
        self, rows: int, width: int, span: int, columns: int, filtered: bool
    ) -> tuple[int, int, int, bool] | None:
        """The bucket a pass of ``rows`` x ``width`` feeds over ``span`` columns replays from (rows,
        feed, span, and whether a row samples with top-k/top-p), or None: run it eagerly (graphs
        off, too large, or the bucket's first pass). ``columns``: the smallest span bucket."""
        r = self.runner
        if not (r.graphs.enabled and r.fast is not None and self.tokens):
            return None
        key = (
            bucket(rows, 1, r.max_batch_size),
            bucket(width, MIN_FEED, r.max_context),
            bucket(span, columns, r.max_context),
            filtered,
        )
        if key[0] * key[1] > self.tokens:
            return None
        self.seen[key] += 1
        if key not in self.graphs and self.seen[key] < 2:
            return None
        return key

    def replay(self, key: tuple[int, int, int, bool], ints: Any, floats: Any) -> Any:
        """The bucket's ``[2, rows]`` first tokens and logprobs (its static output: read or copy it
        before the next replay) for these padded host inputs, from its graph (captured now if new);
        None when the capture failed (the caller runs the pass eagerly). The inputs' copies are
        queued, not waited for."""
        entry = self.graphs.get(key) or self.capture(key)
        if entry is None:
            return None
        graph, ints_in, floats_in, out = entry
        ints_in.copy_(self.runner.pinned(ints), non_blocking=True)
        floats_in.copy_(self.runner.pinned(floats), non_blocking=True)
        graph.replay()
        self.runner.engine.stats["prefill_graph_replays"] += 1
        return out

    def capture(self, key: tuple[int, int, int, bool]) -> tuple | None:
        """Capture the bucket's pass. The static inputs start as padding rows only
        (``prefill_padding``), so the warm-up writes nothing any row reads: the scratch column,
        the spare settings slot."""
        import torch

        rows, width, span, filtered = key
        r = self.runner
        dev = r.device
        t0 = time.perf_counter()
        try:
            pad_ints, pad_floats = r.prefill_padding(width)
            ints_in = torch.tensor([pad_ints] * rows, dtype=torch.long, device=dev)
            floats_in = torch.tensor([pad_floats] * rows, dtype=torch.float32, device=dev)
            side = torch.cuda.Stream(device=dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                r.prefill_body(ints_in, floats_in, span, filtered)  # warm-up
            torch.cuda.current_stream(dev).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=r.graphs.memory_pool(), capture_error_mode="thread_local"):
                out = r.prefill_body(ints_in, floats_in, span, filtered)
        except Exception as e:  # noqa: BLE001 - out of memory or an op that cannot be captured
            self.tokens = 0
            self.graphs.clear()
            self.runner.engine.stats["prefill_graph_fallbacks"] += 1
            torch.cuda.synchronize(dev)
            log.warning(
                "CUDA graph capture of a prefill pass failed (%s: %s); prefilling eagerly from now on",
                type(e).__name__,
                e,
            )
            return None
        entry = (graph, ints_in, floats_in, out)
        self.graphs[key] = entry
        self.runner.engine.stats["prefill_graph_captures"] += 1
        self.runner.engine.stats["capture_s"] += time.perf_counter() - t0
        return entry
